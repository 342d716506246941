/* fuzz.h — what the fuzz targets share: libFuzzer's entry points, and
 * inputs handed to file readers as files that live in memory (memfd), so
 * millions of runs never touch the disk. Include it first. */
#ifndef KILN_FUZZ_H
#define KILN_FUZZ_H

#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A file in memory whose path other code can open. */
typedef struct fuzz_file {
  int fd;
  char path[64];
} fuzz_file;

/* Replaces the file's bytes with data; the path opens them from the start. */
static inline void fuzz_file_set(fuzz_file *f, const char *name, const void *data, size_t size) {
  if (f->fd <= 0) {
    f->fd = memfd_create(name, MFD_CLOEXEC);
    if (f->fd < 0) {
      perror("memfd_create");
      abort(); /* the harness itself cannot run: not a finding */
    }
    snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
  }
  if (ftruncate(f->fd, 0) != 0 || (size && pwrite(f->fd, data, size, 0) != (ssize_t)size)) {
    perror("fuzz_file_set");
    abort();
  }
}

/* A NUL-terminated copy of data (malloc'd; abort when out of memory). */
static inline char *fuzz_cstr(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (!s) abort();
  for (size_t i = 0; i < size; i++) s[i] = (char)data[i];
  s[size] = '\0';
  return s;
}

/* A finding that is not a crash (a broken round trip): say what, then
 * abort so libFuzzer keeps the input. */
#define FUZZ_CHECK(cond, ...)                                                                      \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "fuzz check failed (%s:%d): ", __FILE__, __LINE__);                          \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fputc('\n', stderr);                                                                         \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

#endif
