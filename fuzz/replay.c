/* replay.c — runs a fuzz target's LLVMFuzzerTestOneInput over files and
 * folders of inputs (its corpus and the crash inputs kept as regressions),
 * without libFuzzer: the target as a plain program for ctest, under the
 * ASan + UBSan build like every other test. */
#include "fuzz.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Memory as libFuzzer's -malloc_limit_mb bounds it: an input of a few
 * bytes that makes a reader ask for gigabytes gets NULL (the readers
 * answer out of memory, which the targets count as a finding) instead of
 * passing on a machine that overcommits. */
#define REPLAY_MEMORY_MB 1024
#if defined(__SANITIZE_ADDRESS__)
#define REPLAY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define REPLAY_ASAN 1
#endif
#endif
#ifdef REPLAY_ASAN
/* ASan reserves terabytes of shadow up front, so no rlimit: its own cap. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
  return "allocator_may_return_null=1:max_allocation_size_mb=1024";
}
static void limit_memory(void) {}
#else
static void limit_memory(void) {
  struct rlimit rl = {(rlim_t)REPLAY_MEMORY_MB << 20, (rlim_t)REPLAY_MEMORY_MB << 20};
  if (setrlimit(RLIMIT_DATA, &rl) != 0) perror("replay: setrlimit");
}
#endif

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    return -1;
  }
  size_t cap = 4096, n = 0;
  uint8_t *buf = malloc(cap);
  for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
    n += got;
    if (n == cap) {
      uint8_t *grown = realloc(buf, cap * 2);
      if (!grown) free(buf);
      buf = grown;
      cap *= 2;
    }
  }
  fclose(f);
  if (!buf) {
    fprintf(stderr, "replay: out of memory reading %s\n", path);
    return -1;
  }
  /* An exact-size copy, so ASan sees a read past the input's end. */
  uint8_t *exact = malloc(n ? n : 1);
  if (!exact) abort();
  memcpy(exact, buf, n);
  free(buf);
  LLVMFuzzerTestOneInput(exact, n);
  free(exact);
  return 0;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file in dir, in name order; the count, or -1. */
static int replay_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "replay: cannot open folder %s\n", dir);
    return -1;
  }
  char **names = NULL;
  int n = 0, rc = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char **grown = realloc(names, (size_t)(n + 1) * sizeof *names);
    if (!grown) abort();
    names = grown;
    names[n] = malloc(strlen(dir) + strlen(e->d_name) + 2);
    if (!names[n]) abort();
    sprintf(names[n], "%s/%s", dir, e->d_name);
    n++;
  }
  closedir(d);
  qsort(names, (size_t)n, sizeof *names, cmp_names);
  int done = 0;
  for (int i = 0; i < n; i++) {
    struct stat sb;
    if (stat(names[i], &sb) == 0 && S_ISREG(sb.st_mode)) {
      if (replay_file(names[i]) != 0) rc = -1;
      done++;
    }
    free(names[i]);
  }
  free(names);
  return rc ? -1 : done;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE|FOLDER...  (runs the fuzz target over each input)\n", argv[0]);
    return 2;
  }
  limit_memory();
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  int total = 0;
  for (int i = 1; i < argc; i++) {
    struct stat sb;
    if (stat(argv[i], &sb) != 0) continue; /* an empty regressions folder is not kept by git */
    int n = S_ISDIR(sb.st_mode) ? replay_dir(argv[i]) : (replay_file(argv[i]) == 0 ? 1 : -1);
    if (n < 0) return 1;
    total += n;
  }
  if (total == 0) {
    fprintf(stderr, "replay: no inputs found\n");
    return 1;
  }
  printf("replay: %d inputs ran without a finding\n", total);
  return 0;
}
