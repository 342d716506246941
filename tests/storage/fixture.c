/* fixture.c — see fixture.h. */
#include "fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int fixture_setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  if (!f) return -1;
  snprintf(f->dir, sizeof f->dir, "/tmp/kiln-storage-XXXXXX");
  if (!mkdtemp(f->dir)) {
    free(f);
    return -1;
  }
  snprintf(f->path, sizeof f->path, "%s/kiln.db", f->dir);
  char err[512];
  if (store_open(f->path, &f->s, err, sizeof err) != STORE_OK) {
    fprintf(stderr, "setup: %s\n", err);
    free(f);
    return -1;
  }
  *state = f;
  return 0;
}

int fixture_teardown(void **state) {
  fixture *f = *state;
  store_close(f->s);
  const char *suffixes[] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    char file[400];
    snprintf(file, sizeof file, "%s%s", f->path, suffixes[i]);
    unlink(file);
  }
  rmdir(f->dir);
  free(f);
  return 0;
}
