/* cache.c — a decoded dataset kept in a file (pipeline cache "file"), so
 * a folder of images is decoded once, not on every run: a small header,
 * then the examples and labels as they sit in memory. Written to a temp
 * file and renamed, so a reader never sees half a cache. The header is in
 * the machine's byte order: a cache is read where it was written. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../engine.h"

#define CACHE_MAGIC       "KILNDS01" /* examples as floats */
#define CACHE_MAGIC_BYTES "KILNDS02" /* examples as bytes, the header then their scale */

typedef struct cache_header {
  char magic[8];
  int64_t n;
  int32_t ndim, n_classes;
  int32_t shape[KN_MAX_DIMS];
  float value_range;
  uint32_t n_targets; /* regression targets per example, after the labels; 0 = none */
  uint64_t example_size;
} cache_header;

int kn_dataset_cache_write(const kn_dataset *ds, const char *path, char *err, size_t errlen) {
  /* One temp name per process: two jobs may fill the same cache at once. */
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    snprintf(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
    return KN_EIO;
  }
  cache_header h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, ds->x ? CACHE_MAGIC : CACHE_MAGIC_BYTES, 8);
  h.n = ds->n;
  h.ndim = ds->ndim;
  h.n_classes = ds->n_classes;
  for (int d = 0; d < KN_MAX_DIMS; d++) h.shape[d] = ds->shape[d];
  h.value_range = ds->value_range;
  h.example_size = ds->example_size;
  h.n_targets = ds->targets ? (uint32_t)ds->n_targets : 0u;
  size_t nx = (size_t)ds->n * ds->example_size, ny = (size_t)ds->n;
  size_t nt = (size_t)ds->n * h.n_targets;
  const size_t vb = kn_dataset_value_bytes(ds);
  int ok = fwrite(&h, sizeof h, 1, f) == 1 &&
           (ds->x || fwrite(&ds->x8_scale, sizeof ds->x8_scale, 1, f) == 1) &&
           fwrite(ds->x ? (const void *)ds->x : (const void *)ds->x8, vb, nx, f) == nx &&
           fwrite(ds->y, sizeof(int32_t), ny, f) == ny &&
           (nt == 0 || fwrite(ds->targets, sizeof(float), nt, f) == nt);
  ok &= fclose(f) == 0;
  if (!ok || rename(tmp, path) != 0) {
    snprintf(err, errlen, "%s: cannot write the cache: %s", path, strerror(errno));
    remove(tmp);
    return KN_EIO;
  }
  return KN_OK;
}

int kn_dataset_cache_read(const char *path, kn_dataset *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    return KN_EIO;
  }
  cache_header h;
  int rc = KN_EFORMAT;
  int bytes = 0;
  if (fread(&h, sizeof h, 1, f) != 1 ||
      (memcmp(h.magic, CACHE_MAGIC, 8) != 0 &&
       !(bytes = memcmp(h.magic, CACHE_MAGIC_BYTES, 8) == 0)) ||
      (bytes && fread(&out->x8_scale, sizeof out->x8_scale, 1, f) != 1) || h.n < 1 || h.ndim < 1 ||
      h.ndim > KN_MAX_DIMS || h.example_size < 1 || h.example_size > (1ULL << 24) ||
      h.n_targets > 65536) {
    snprintf(err, errlen, "%s: not a kiln dataset cache (bad header)", path);
    goto out;
  }
  size_t nx = (size_t)h.n * h.example_size, ny = (size_t)h.n, nt = (size_t)h.n * h.n_targets;
  const size_t vb = bytes ? sizeof(uint8_t) : sizeof(float);
  void *x = malloc(nx * vb);
  if (bytes) {
    out->x8 = x;
  } else {
    out->x = x;
  }
  out->y = malloc(ny * sizeof(int32_t));
  if (nt) out->targets = malloc(nt * sizeof(float));
  if (!x || !out->y || (nt && !out->targets)) {
    snprintf(err, errlen, "%s: out of memory for %lld examples", path, (long long)h.n);
    rc = KN_ENOMEM;
    goto out;
  }
  if (fread(x, vb, nx, f) != nx || fread(out->y, sizeof(int32_t), ny, f) != ny ||
      (nt && fread(out->targets, sizeof(float), nt, f) != nt)) {
    snprintf(err, errlen, "%s: truncated: the header promises %lld examples", path, (long long)h.n);
    goto out;
  }
  out->n = h.n;
  out->ndim = h.ndim;
  for (int d = 0; d < KN_MAX_DIMS; d++) out->shape[d] = h.shape[d];
  out->example_size = (size_t)h.example_size;
  out->n_classes = h.n_classes;
  out->value_range = h.value_range;
  out->n_targets = (int)h.n_targets;
  rc = KN_OK;
out:
  fclose(f);
  if (rc) kn_dataset_free(out);
  return rc;
}
