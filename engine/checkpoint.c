/* checkpoint.c — parameters as a safetensors file (an 8-byte little-endian
 * header length, a JSON header naming each tensor's dtype, shape and byte
 * range, then the raw little-endian data), which PyTorch and Hugging Face
 * load as they are. Written to a temp file, fsync'd, renamed, and the
 * directory fsync'd, so a crash leaves either the old file or the new one. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph_internal.h"

typedef struct strbuf {
  char *data;
  size_t len, cap;
  int failed;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) {
  if (b->failed) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *data = realloc(b->data, cap);
    if (!data) {
      b->failed = 1;
      return;
    }
    b->data = data;
    b->cap = cap;
  }
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
}

static void sb_str(strbuf *b, const char *s) {
  sb_put(b, s, strlen(s));
}

/* A JSON string literal: quotes, backslashes and control bytes escaped. */
static void sb_json_string(strbuf *b, const char *s) {
  sb_put(b, "\"", 1);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      char esc[2] = {'\\', (char)c};
      sb_put(b, esc, 2);
    } else if (c < 0x20) {
      char esc[8];
      snprintf(esc, sizeof esc, "\\u%04x", c);
      sb_str(b, esc);
    } else {
      sb_put(b, (const char *)&c, 1);
    }
  }
  sb_put(b, "\"", 1);
}

static int write_all(int fd, const void *buf, size_t len, kn_sha256 *h) {
  const char *p = buf;
  kn_sha256_update(h, buf, len);
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

int kn_checkpoint_write(kn_graph *g, const char *path, int n_meta, const char *const *keys,
                        const char *const *values, kn_checkpoint_info *info, char *err,
                        size_t errlen) {
  if (!g->compiled) {
    snprintf(err, errlen, "checkpoint: compile the graph first");
    return KN_ESTATE;
  }
  strbuf hdr = {0};
  sb_str(&hdr, "{");
  if (n_meta > 0) {
    sb_str(&hdr, "\"__metadata__\":{");
    for (int i = 0; i < n_meta; i++) {
      if (i) sb_str(&hdr, ",");
      sb_json_string(&hdr, keys[i]);
      sb_str(&hdr, ":");
      sb_json_string(&hdr, values[i]);
    }
    sb_str(&hdr, "}");
  }
  if (g->f64) {
    free(hdr.data);
    snprintf(err, errlen, "checkpoint: a graph in the f64 reference mode is not checkpointed");
    return KN_ESTATE;
  }
  size_t offset = 0;
  /* Parameters, then state (batch norm moving statistics), each in creation
   * order: the same order as the two flat buffers. */
  for (int p = 0; p < g->n_params + g->n_states; p++) {
    const kn_node_rec *n = &g->nodes[p < g->n_params ? g->params[p] : g->states[p - g->n_params]];
    size_t bytes = kn_node_elems(n, 0) * sizeof(float);
    char num[64];
    if (p || n_meta > 0) sb_str(&hdr, ",");
    sb_json_string(&hdr, n->name);
    sb_str(&hdr, ":{\"dtype\":\"F32\",\"shape\":[");
    for (int d = 0; d < n->ndim; d++) {
      snprintf(num, sizeof num, d ? ",%d" : "%d", n->dims[d]);
      sb_str(&hdr, num);
    }
    snprintf(num, sizeof num, "],\"data_offsets\":[%zu,%zu]}", offset, offset + bytes);
    sb_str(&hdr, num);
    offset += bytes;
  }
  sb_str(&hdr, "}");
  while (!hdr.failed && hdr.len % 8) sb_str(&hdr, " "); /* data starts 8-aligned */
  if (hdr.failed) {
    free(hdr.data);
    snprintf(err, errlen, "checkpoint: out of memory for the header");
    return KN_ENOMEM;
  }

  int rc = KN_OK;
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    snprintf(err, errlen, "checkpoint: cannot create %s: %s", tmp, strerror(errno));
    free(hdr.data);
    return KN_EIO;
  }
  kn_sha256 h;
  kn_sha256_init(&h);
  uint8_t len_le[8];
  for (int i = 0; i < 8; i++) len_le[i] = (uint8_t)((uint64_t)hdr.len >> (8 * i));
  int werr = write_all(fd, len_le, 8, &h) || write_all(fd, hdr.data, hdr.len, &h);
  /* Parameters are contiguous in creation order: one write. x86 and Arm
   * are little-endian, as safetensors requires. */
  size_t param_bytes = g->n_param_floats * sizeof(float);
  if (!werr) werr = write_all(fd, g->param_buf, param_bytes, &h);
  if (!werr) werr = write_all(fd, g->state_buf, offset - param_bytes, &h);
  if (werr || fsync(fd) != 0) {
    snprintf(err, errlen, "checkpoint: cannot write %s: %s", tmp, strerror(errno));
    rc = KN_EIO;
  }
  if (close(fd) != 0 && !rc) {
    snprintf(err, errlen, "checkpoint: cannot close %s: %s", tmp, strerror(errno));
    rc = KN_EIO;
  }
  if (!rc && rename(tmp, path) != 0) {
    snprintf(err, errlen, "checkpoint: cannot rename %s to %s: %s", tmp, path, strerror(errno));
    rc = KN_EIO;
  }
  if (rc) {
    unlink(tmp);
  } else {
    /* Make the rename itself durable. */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      fsync(dfd);
      close(dfd);
    }
    uint8_t digest[32];
    kn_sha256_final(&h, digest);
    if (info) {
      kn_sha256_hex(digest, info->sha256);
      info->bytes = (int64_t)(8 + hdr.len + offset);
    }
  }
  free(hdr.data);
  return rc;
}
