/* tar.c — WebDataset-style tar shards: ustar members grouped into samples
 * by key (a member's path up to the first dot of its file name; the rest
 * is its extension), e.g. 000017.png and 000017.cls make sample 000017.
 * Read through zlib, so .tar.gz shards read as plain ones do. A sample is
 * handed out as one buffer of parts: (u16 extension length, extension,
 * u64 data length, data), repeated. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "../engine.h"

#define MAX_MEMBER (256u << 20)

struct kn_tar {
  gzFile f;
  char *path;
  int64_t index;   /* samples handed out */
  uint64_t offset; /* bytes read */
  uint8_t *sample; /* the sample being built */
  size_t len, cap;
  char key[256];
  /* A member read ahead (the first of the next sample): its header. */
  int pending;
  char pending_key[256], pending_ext[64];
  uint64_t pending_size;
  int done;
};

int kn_tar_open(const char *path, kn_tar **out, char *err, size_t errlen) {
  *out = NULL;
  kn_tar *t = calloc(1, sizeof *t);
  if (!t || !(t->path = strdup(path))) {
    free(t);
    snprintf(err, errlen, "%s: out of memory", path);
    return KN_ENOMEM;
  }
  t->f = gzopen(path, "rb");
  if (!t->f) {
    snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno ? errno : ENOENT));
    kn_tar_close(t);
    return KN_EIO;
  }
  gzbuffer(t->f, 64u << 10);
  *out = t;
  return KN_OK;
}

void kn_tar_close(kn_tar *t) {
  if (!t) return;
  if (t->f) gzclose(t->f);
  free(t->path);
  free(t->sample);
  free(t);
}

int64_t kn_tar_index(const kn_tar *t) {
  return t->index;
}

static int64_t read_full(kn_tar *t, void *dst, size_t n) {
  size_t got = 0;
  while (got < n) {
    int k =
        gzread(t->f, (uint8_t *)dst + got, (unsigned)(n - got > (1u << 30) ? 1u << 30 : n - got));
    if (k < 0) return -1;
    if (k == 0) break;
    got += (size_t)k;
  }
  t->offset += got;
  return (int64_t)got;
}

static int bad(kn_tar *t, const char *what, char *err, size_t errlen) {
  snprintf(err, errlen, "%s: sample %lld near byte %llu: %s", t->path, (long long)t->index,
           (unsigned long long)t->offset, what);
  return KN_EFORMAT;
}

static int parse_octal(const char *p, size_t n, uint64_t *v) {
  uint64_t x = 0;
  size_t i = 0;
  while (i < n && p[i] == ' ') i++;
  if (i == n || p[i] < '0' || p[i] > '7') return -1;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; i++) x = x * 8 + (uint64_t)(p[i] - '0');
  *v = x;
  return 0;
}

/* The next regular member's header: 1, 0 at the end of the archive, < 0. */
static int next_header(kn_tar *t, char *key, char *ext, uint64_t *size, char *err, size_t errlen) {
  for (;;) {
    char h[512];
    int64_t got = read_full(t, h, sizeof h);
    if (got < 0) return bad(t, "the compressed stream is damaged", err, errlen);
    if (got == 0) return 0; /* no end blocks: tolerated, as tar does */
    if (got < 512) return bad(t, "the file ends inside a member's header", err, errlen);
    int zero = 1;
    for (int i = 0; i < 512 && zero; i++) zero = h[i] == 0;
    if (zero) return 0; /* the end-of-archive blocks */
    uint64_t sum, want = 0;
    for (int i = 0; i < 512; i++) want += i >= 148 && i < 156 ? ' ' : (uint8_t)h[i];
    if (parse_octal(h + 148, 8, &sum) || sum != want)
      return bad(t, "a member's header checksum does not match (not a tar file, or corrupt)", err,
                 errlen);
    if (parse_octal(h + 124, 12, size) || *size > MAX_MEMBER)
      return bad(t, "a member's size is not a size up to 256 MiB", err, errlen);
    const char type = h[156];
    if (type != '0' && type != '\0') { /* directories, links, pax headers: skipped */
      uint64_t skip = (*size + 511) / 512 * 512;
      char block[512];
      for (uint64_t k = 0; k < skip; k += 512)
        if (read_full(t, block, 512) < 512)
          return bad(t, "the file ends inside a member", err, errlen);
      continue;
    }
    char name[256 + 2];
    const int has_prefix = memcmp(h + 257, "ustar", 5) == 0 && h[345];
    snprintf(name, sizeof name, "%.155s%s%.100s", has_prefix ? h + 345 : "", has_prefix ? "/" : "",
             h);
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    const char *dot = strchr(base, '.');
    if (!dot || !dot[1] || strlen(dot + 1) >= 64) {
      char what[400];
      snprintf(what, sizeof what, "member '%s' has no extension (want key.ext)", name);
      return bad(t, what, err, errlen);
    }
    snprintf(key, 256, "%.*s", (int)(dot - name), name);
    snprintf(ext, 64, "%s", dot + 1);
    return 1;
  }
}

static int append(kn_tar *t, const void *p, size_t n) {
  if (t->len + n > t->cap) {
    size_t cap = t->cap ? t->cap : 4096;
    while (cap < t->len + n) cap *= 2;
    uint8_t *b = realloc(t->sample, cap);
    if (!b) return KN_ENOMEM;
    t->sample = b;
    t->cap = cap;
  }
  if (p) memcpy(t->sample + t->len, p, n);
  t->len += n;
  return KN_OK;
}

int kn_tar_next(kn_tar *t, const uint8_t **data, size_t *len, char *err, size_t errlen) {
  t->len = 0;
  if (!t->pending) {
    if (t->done) return 0;
    int rc = next_header(t, t->pending_key, t->pending_ext, &t->pending_size, err, errlen);
    if (rc <= 0) {
      t->done = 1;
      return rc;
    }
    t->pending = 1;
  }
  snprintf(t->key, sizeof t->key, "%s", t->pending_key);
  while (t->pending && strcmp(t->pending_key, t->key) == 0) {
    const uint16_t ext_len = (uint16_t)strlen(t->pending_ext);
    const uint64_t size = t->pending_size;
    if (append(t, &ext_len, 2) || append(t, t->pending_ext, ext_len) || append(t, &size, 8) ||
        append(t, NULL, (size_t)size)) {
      snprintf(err, errlen, "%s: out of memory for a member of %llu bytes", t->path,
               (unsigned long long)size);
      return KN_ENOMEM;
    }
    if (read_full(t, t->sample + t->len - size, (size_t)size) < (int64_t)size)
      return bad(t, "the file ends inside a member", err, errlen);
    char pad[512];
    const size_t padding = (size_t)((512 - size % 512) % 512);
    if (padding && read_full(t, pad, padding) < (int64_t)padding)
      return bad(t, "the file ends inside a member's padding", err, errlen);
    int rc = next_header(t, t->pending_key, t->pending_ext, &t->pending_size, err, errlen);
    if (rc < 0) return rc;
    if (rc == 0) t->pending = 0, t->done = 1;
  }
  t->index++;
  *data = t->sample;
  *len = t->len;
  return 1;
}

int kn_tar_sample_part_at(const uint8_t *sample, size_t len, int i, const uint8_t **ext,
                          size_t *ext_len, const uint8_t **data, size_t *part_len) {
  size_t at = 0;
  for (int k = 0; at + 2 <= len; k++) {
    uint16_t elen;
    uint64_t size;
    memcpy(&elen, sample + at, 2);
    if (at + 2 + elen + 8 > len) return -1;
    memcpy(&size, sample + at + 2 + elen, 8);
    const size_t body = at + 2 + elen + 8;
    if (size > len - body) return -1;
    if (k == i) {
      *ext = sample + at + 2;
      *ext_len = elen;
      *data = sample + body;
      *part_len = (size_t)size;
      return 1;
    }
    at = body + (size_t)size;
  }
  return 0;
}

int kn_tar_sample_part(const uint8_t *sample, size_t len, const char *ext, const uint8_t **data,
                       size_t *part_len) {
  const size_t want = strlen(ext);
  const uint8_t *e;
  size_t elen;
  int rc;
  for (int i = 0; (rc = kn_tar_sample_part_at(sample, len, i, &e, &elen, data, part_len)) == 1; i++)
    if (elen == want && memcmp(e, ext, want) == 0) return 0;
  return -1;
}
