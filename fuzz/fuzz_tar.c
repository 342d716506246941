/* fuzz_tar.c — kiln-train's tar reader for uploads (worker_untar): any
 * bytes unpack or are refused with a reason, and nothing lands outside the
 * target folder (the folder beside it stays empty). */
#define _XOPEN_SOURCE 700
#include "fuzz.h"

#include <dirent.h>
#include <ftw.h>
#include <string.h>
#include <sys/stat.h>

#include "worker.h"

static fuzz_file archive;
static char root[64], dest[96], beside[96];

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void cleanup(void) {
  nftw(root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  struct stat sb;
  const char *tmp = stat("/dev/shm", &sb) == 0 ? "/dev/shm" : getenv("TMPDIR");
  snprintf(root, sizeof root, "%.40s/kiln-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(root)) {
    perror("mkdtemp");
    abort();
  }
  snprintf(dest, sizeof dest, "%s/in", root);
  snprintf(beside, sizeof beside, "%s/beside", root);
  mkdir(beside, 0700);
  atexit(cleanup);
  return 0;
}

static int count_entries(const char *dir) {
  int n = 0;
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
  if (d) closedir(d);
  return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_file_set(&archive, "tar", data, size);
  mkdir(dest, 0700);
  char err[1024] = "";
  if (worker_untar(archive.path, dest, err, sizeof err) != 0)
    FUZZ_CHECK(err[0], "a refused archive says why");
  FUZZ_CHECK(count_entries(beside) == 0 && count_entries(root) == 2,
             "an entry landed outside the target folder");
  nftw(dest, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  return 0;
}
