/* records.c — TFRecord files: CRC32C (Castagnoli) with TFRecord's mask,
 * a reader that checks every length and data CRC and names the file,
 * record and byte offset of whatever is wrong, and a writer. Files are
 * read through zlib, so gzip'd TFRecords read as the raw ones do. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "../engine.h"

/* A record larger than this is taken for a corrupt length. */
#define MAX_RECORD (256u << 20)

static uint32_t crc_table[256];
static int crc_ready;

static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    crc_table[i] = c;
  }
  crc_ready = 1;
}

uint32_t kn_crc32c(uint32_t crc, const void *data, size_t len) {
  if (!crc_ready) crc_init(); /* idempotent: racing threads write the same table */
  const uint8_t *p = data;
  crc = ~crc;
  for (size_t i = 0; i < len; i++) crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t kn_crc32c_mask(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

struct kn_tfrecord {
  gzFile f;
  char *path;
  int64_t index;   /* records read */
  uint64_t offset; /* bytes read (of the uncompressed stream) */
  uint8_t *buf;
  size_t cap;
};

int kn_tfrecord_open(const char *path, kn_tfrecord **out, char *err, size_t errlen) {
  *out = NULL;
  kn_tfrecord *r = calloc(1, sizeof *r);
  if (!r || !(r->path = strdup(path))) {
    free(r);
    snprintf(err, errlen, "%s: out of memory", path);
    return KN_ENOMEM;
  }
  r->f = gzopen(path, "rb");
  if (!r->f) {
    snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno ? errno : ENOENT));
    kn_tfrecord_close(r);
    return KN_EIO;
  }
  gzbuffer(r->f, 64u << 10);
  *out = r;
  return KN_OK;
}

void kn_tfrecord_close(kn_tfrecord *r) {
  if (!r) return;
  if (r->f) gzclose(r->f);
  free(r->path);
  free(r->buf);
  free(r);
}

static uint32_t get_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Reads exactly n bytes: n, or fewer at the end of the stream, or -1 when
 * zlib reports an error (a damaged gzip stream). */
static int64_t read_full(kn_tfrecord *r, void *dst, size_t n) {
  size_t got = 0;
  while (got < n) {
    int k = gzread(r->f, (uint8_t *)dst + got, (unsigned)(n - got));
    if (k < 0) return -1;
    if (k == 0) break;
    got += (size_t)k;
  }
  return (int64_t)got;
}

static int damaged(kn_tfrecord *r, const char *what, char *err, size_t errlen) {
  int zerr = 0;
  const char *msg = gzerror(r->f, &zerr);
  snprintf(err, errlen, "%s: record %lld at byte %llu: %s%s%s", r->path, (long long)r->index,
           (unsigned long long)r->offset, what, zerr < 0 ? ": " : "", zerr < 0 ? msg : "");
  return KN_EFORMAT;
}

int kn_tfrecord_next(kn_tfrecord *r, const uint8_t **data, size_t *len, char *err, size_t errlen) {
  uint8_t head[12];
  int64_t got = read_full(r, head, sizeof head);
  if (got == 0) return 0;
  if (got < 0) return damaged(r, "the compressed stream is damaged", err, errlen);
  if (got < (int64_t)sizeof head) return damaged(r, "the file ends inside a length", err, errlen);
  const uint64_t n = (uint64_t)get_le32(head) | (uint64_t)get_le32(head + 4) << 32;
  if (kn_crc32c_mask(kn_crc32c(0, head, 8)) != get_le32(head + 8))
    return damaged(r, "the length's CRC does not match (corrupt record)", err, errlen);
  if (n > MAX_RECORD) {
    snprintf(err, errlen, "%s: record %lld at byte %llu: %llu bytes, more than the %u allowed",
             r->path, (long long)r->index, (unsigned long long)r->offset, (unsigned long long)n,
             MAX_RECORD);
    return KN_EFORMAT;
  }
  if (n + 4 > r->cap) {
    uint8_t *b = realloc(r->buf, (size_t)n + 4);
    if (!b) {
      snprintf(err, errlen, "%s: out of memory for a record of %llu bytes", r->path,
               (unsigned long long)n);
      return KN_ENOMEM;
    }
    r->buf = b;
    r->cap = (size_t)n + 4;
  }
  got = read_full(r, r->buf, (size_t)n + 4);
  if (got < 0) return damaged(r, "the compressed stream is damaged", err, errlen);
  if ((uint64_t)got < n + 4) {
    char what[96];
    snprintf(what, sizeof what, "the file ends inside the record (%lld of %llu bytes)",
             (long long)got, (unsigned long long)n + 4);
    return damaged(r, what, err, errlen);
  }
  if (kn_crc32c_mask(kn_crc32c(0, r->buf, (size_t)n)) != get_le32(r->buf + n))
    return damaged(r, "the data's CRC does not match (corrupt record)", err, errlen);
  r->index++;
  r->offset += 12 + n + 4;
  *data = r->buf;
  *len = (size_t)n;
  return 1;
}

int64_t kn_tfrecord_index(const kn_tfrecord *r) {
  return r->index;
}

void kn_tfrecord_frame(const void *data, size_t len, uint8_t head[12], uint8_t tail[4]) {
  put_le32(head, (uint32_t)len);
  put_le32(head + 4, (uint32_t)((uint64_t)len >> 32));
  put_le32(head + 8, kn_crc32c_mask(kn_crc32c(0, head, 8)));
  put_le32(tail, kn_crc32c_mask(kn_crc32c(0, data, len)));
}
