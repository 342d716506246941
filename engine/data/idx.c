/* idx.c — the IDX format of the MNIST family (raw or gzip'd, read through
 * zlib, which passes uncompressed files through): images as floats, labels
 * as int32, every header field and size checked before it is trusted. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "../engine.h"

/* The largest file we accept: guards against a corrupt header asking for
 * terabytes. 4 GiB of pixels is far beyond any IDX set in use. */
#define IDX_MAX_BYTES (4ULL << 30)

typedef struct idx_file {
  int ndim;
  uint32_t dims[4];
  uint64_t count; /* elements */
  uint8_t *data;
} idx_file;

/* Reads len bytes; base and total place them in the whole (for messages). */
static int read_full(gzFile f, void *buf, uint64_t len, uint64_t base, uint64_t total,
                     const char *path, const char *what, char *err, size_t errlen) {
  uint8_t *p = buf;
  uint64_t done = 0;
  while (done < len) {
    unsigned chunk = (unsigned)((len - done) > (1u << 30) ? (1u << 30) : (len - done));
    int got = gzread(f, p + done, chunk);
    if (got <= 0) {
      int zerr = 0;
      const char *msg = gzerror(f, &zerr);
      if (got < 0 || zerr != Z_OK) {
        snprintf(err, errlen, "%s: cannot read %s at byte %llu: %s", path, what,
                 (unsigned long long)(base + done), msg);
      } else {
        snprintf(err, errlen, "%s: truncated: %s ends after %llu of %llu bytes", path, what,
                 (unsigned long long)(base + done), (unsigned long long)total);
      }
      return KN_EFORMAT;
    }
    done += (uint64_t)got;
  }
  return KN_OK;
}

/* The data, into a buffer that grows (doubling from 1 MiB) as the bytes
 * arrive, so a header that claims gigabytes over a short file costs no
 * more memory than the file holds. */
#define IDX_FIRST_CHUNK (1ULL << 20)
static int read_data(gzFile f, idx_file *out, const char *path, char *err, size_t errlen) {
  uint64_t have = 0, cap = out->count < IDX_FIRST_CHUNK ? out->count : IDX_FIRST_CHUNK;
  out->data = malloc(cap);
  for (;;) {
    if (!out->data) {
      snprintf(err, errlen, "%s: out of memory for %llu bytes", path, (unsigned long long)cap);
      return KN_ENOMEM;
    }
    int rc =
        read_full(f, out->data + have, cap - have, have, out->count, path, "the data", err, errlen);
    if (rc) return rc;
    have = cap;
    if (have == out->count) return KN_OK;
    cap = cap * 2 < out->count ? cap * 2 : out->count;
    uint8_t *grown = realloc(out->data, cap);
    if (!grown) free(out->data);
    out->data = grown;
  }
}

static int idx_read(const char *path, int want_ndim, idx_file *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  gzFile f = gzopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno ? errno : ENOENT));
    return KN_EIO;
  }
  gzbuffer(f, 1 << 17);
  int rc = KN_OK;
  uint8_t magic[4];
  if ((rc = read_full(f, magic, 4, 0, 4, path, "the IDX magic number", err, errlen))) goto out;
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08) {
    snprintf(err, errlen,
             "%s: not an unsigned-byte IDX file (magic %02x %02x %02x %02x, want 00 00 08 %02x)",
             path, magic[0], magic[1], magic[2], magic[3], want_ndim);
    rc = KN_EFORMAT;
    goto out;
  }
  if (magic[3] != want_ndim) {
    snprintf(err, errlen, "%s: IDX file has %d dimensions, want %d", path, magic[3], want_ndim);
    rc = KN_EFORMAT;
    goto out;
  }
  out->ndim = want_ndim;
  uint8_t be[16];
  if ((rc = read_full(f, be, (uint64_t)4 * want_ndim, 0, (uint64_t)4 * want_ndim, path,
                      "the IDX dimensions", err, errlen))) {
    goto out;
  }
  out->count = 1;
  for (int d = 0; d < want_ndim; d++) {
    out->dims[d] = (uint32_t)be[4 * d] << 24 | (uint32_t)be[4 * d + 1] << 16 |
                   (uint32_t)be[4 * d + 2] << 8 | be[4 * d + 3];
    if (out->dims[d] == 0) {
      snprintf(err, errlen, "%s: dimension %d is 0", path, d);
      rc = KN_EFORMAT;
      goto out;
    }
    out->count *= out->dims[d];
    if (out->count > IDX_MAX_BYTES) {
      snprintf(err, errlen, "%s: header claims more than %llu bytes", path, IDX_MAX_BYTES);
      rc = KN_EFORMAT;
      goto out;
    }
  }
  if ((rc = read_data(f, out, path, err, errlen))) goto out;
  uint8_t extra;
  int extra_got = gzread(f, &extra, 1), zerr = Z_OK;
  const char *zmsg = gzerror(f, &zerr);
  if (extra_got > 0) {
    snprintf(err, errlen, "%s: trailing bytes after the %llu the header declares", path,
             (unsigned long long)out->count);
    rc = KN_EFORMAT;
    goto out;
  }
  if (extra_got < 0 || zerr != Z_OK) {
    /* All the data came, but the gzip stream's end (its checksum) did not. */
    snprintf(err, errlen, "%s: the gzip stream is truncated or corrupt after data byte %llu: %s",
             path, (unsigned long long)out->count, zmsg);
    rc = KN_EFORMAT;
    goto out;
  }
out:
  gzclose(f);
  if (rc) {
    free(out->data);
    out->data = NULL;
  }
  return rc;
}

int kn_dataset_load_idx(const char *images_path, const char *labels_path, unsigned flags,
                        kn_dataset *out, char *err, size_t errlen) {
  const int normalize = (flags & KN_IDX_NORMALIZE) != 0;
  memset(out, 0, sizeof *out);
  idx_file images = {0}, labels = {0};
  int rc = idx_read(images_path, 3, &images, err, errlen);
  if (!rc) rc = idx_read(labels_path, 1, &labels, err, errlen);
  if (rc) goto out;
  if (images.dims[0] != labels.dims[0]) {
    snprintf(err, errlen, "%s holds %u images but %s holds %u labels", images_path, images.dims[0],
             labels_path, labels.dims[0]);
    rc = KN_EFORMAT;
    goto out;
  }
  out->n = images.dims[0];
  out->ndim = 3;
  out->shape[0] = (int)images.dims[1];
  out->shape[1] = (int)images.dims[2];
  out->shape[2] = 1; /* channels last, as Keras reads MNIST */
  out->example_size = (size_t)images.dims[1] * images.dims[2];
  const float scale = normalize ? 1.0f / 255.0f : 1.0f;
  if (flags & KN_IDX_BYTES) { /* the file's bytes are the examples */
    out->x8 = images.data;
    out->x8_scale = scale;
    images.data = NULL;
  } else {
    out->x = malloc(images.count * sizeof(float));
  }
  out->y = malloc(labels.count * sizeof(int32_t));
  if ((!out->x && !out->x8) || !out->y) {
    snprintf(err, errlen, "dataset: out of memory for %lld examples", (long long)out->n);
    rc = KN_ENOMEM;
    goto out;
  }
  if (out->x)
    for (uint64_t i = 0; i < images.count; i++) out->x[i] = (float)images.data[i] * scale;
  int max_label = 0;
  for (uint64_t i = 0; i < labels.count; i++) {
    out->y[i] = labels.data[i];
    if (out->y[i] > max_label) max_label = out->y[i];
  }
  out->n_classes = max_label + 1;
  out->value_range = normalize ? 1.0f : 255.0f;
out:
  free(images.data);
  free(labels.data);
  if (rc) kn_dataset_free(out);
  return rc;
}
