/* checkpoint.c — parameters as a safetensors file (an 8-byte little-endian
 * header length, a JSON header naming each tensor's dtype, shape and byte
 * range, then the raw little-endian data), which PyTorch and Hugging Face
 * load as they are. Written to a temp file, fsync'd, renamed, and the
 * directory fsync'd, so a crash leaves either the old file or the new one. */
#include <errno.h>
#include <fcntl.h>
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
  int fd = kn_durable_open(path, tmp, sizeof tmp, "checkpoint", err, errlen);
  if (fd < 0) {
    free(hdr.data);
    return KN_EIO;
  }
  kc_sha256 h;
  kc_sha256_init(&h);
  uint8_t len_le[8];
  for (int i = 0; i < 8; i++) len_le[i] = (uint8_t)((uint64_t)hdr.len >> (8 * i));
  int werr = kn_write_all(fd, len_le, 8, &h) || kn_write_all(fd, hdr.data, hdr.len, &h);
  /* Parameters are contiguous in creation order: one write. x86 and Arm
   * are little-endian, as safetensors requires. */
  size_t param_bytes = g->n_param_floats * sizeof(float);
  if (!werr) werr = kn_write_all(fd, kn_params(g), param_bytes, &h); /* a GPU's copied back */
  if (!werr) werr = kn_write_all(fd, g->state_buf, offset - param_bytes, &h);
  rc = kn_durable_finish(fd, werr, tmp, path, "checkpoint", err, errlen);
  if (!rc) {
    uint8_t digest[32];
    kc_sha256_final(&h, digest);
    if (info) {
      kc_sha256_hex(digest, info->sha256);
      info->bytes = (int64_t)(8 + hdr.len + offset);
    }
  }
  free(hdr.data);
  return rc;
}

/* ---- reading ---- */

const char *kn_checkpoint_meta_get(const kn_checkpoint_meta *meta, const char *key) {
  for (int i = 0; i < meta->n; i++)
    if (strcmp(meta->keys[i], key) == 0) return meta->values[i];
  return NULL;
}

/* The header is JSON of a fixed shape: an object of tensor entries
 * {"dtype": S, "shape": [ints], "data_offsets": [a, b]} and an optional
 * "__metadata__" object of strings. This small reader takes exactly that
 * and names the byte position of anything else. */
typedef struct hdr_reader {
  const char *text;
  size_t pos, len;
  const char *path;
  char *err;
  size_t errlen;
} hdr_reader;

static int hdr_fail(hdr_reader *r, const char *what) {
  snprintf(r->err, r->errlen, "checkpoint %s: header byte %zu: %s", r->path, r->pos, what);
  return KN_EFORMAT;
}

static void hdr_ws(hdr_reader *r) {
  while (r->pos < r->len && strchr(" \t\r\n", r->text[r->pos])) r->pos++;
}

static int hdr_expect(hdr_reader *r, char c) {
  hdr_ws(r);
  if (r->pos >= r->len || r->text[r->pos] != c) {
    char what[32];
    snprintf(what, sizeof what, "expected '%c'", c);
    return hdr_fail(r, what);
  }
  r->pos++;
  return KN_OK;
}

static int hdr_peek(hdr_reader *r, char c) {
  hdr_ws(r);
  return r->pos < r->len && r->text[r->pos] == c;
}

/* A string into out (truncation is an error: names and values are short). */
static int hdr_string(hdr_reader *r, char *out, size_t cap) {
  int rc = hdr_expect(r, '"');
  if (rc) return rc;
  size_t n = 0;
  while (r->pos < r->len && r->text[r->pos] != '"') {
    char c = r->text[r->pos++];
    if (c == '\\') {
      if (r->pos >= r->len) break;
      char e = r->text[r->pos++];
      if (e == 'u') {
        unsigned code = 0;
        if (r->pos + 4 > r->len || sscanf(r->text + r->pos, "%4x", &code) != 1 || code > 0x7f)
          return hdr_fail(r, "only ASCII \\u escapes are supported");
        r->pos += 4;
        c = (char)code;
      } else {
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
        const char *at = strchr(from, e);
        if (!at || !e) return hdr_fail(r, "bad escape in a string");
        c = to[at - from];
      }
    }
    if (n + 1 >= cap) return hdr_fail(r, "string too long");
    out[n++] = c;
  }
  if (r->pos >= r->len) return hdr_fail(r, "unterminated string");
  r->pos++;
  out[n] = '\0';
  return KN_OK;
}

static int hdr_int(hdr_reader *r, int64_t *out) {
  hdr_ws(r);
  const char *start = r->text + r->pos;
  char *end = NULL;
  errno = 0;
  long long v = strtoll(start, &end, 10);
  if (end == start || errno || v < 0) return hdr_fail(r, "expected a non-negative integer");
  r->pos += (size_t)(end - start);
  *out = v;
  return KN_OK;
}

/* [int, int, ...] of at most cap entries. */
static int hdr_int_array(hdr_reader *r, int64_t *out, int cap, int *n) {
  int rc = hdr_expect(r, '[');
  *n = 0;
  if (!rc && hdr_peek(r, ']')) return hdr_expect(r, ']');
  while (!rc) {
    if (*n >= cap) return hdr_fail(r, "too many dimensions");
    rc = hdr_int(r, &out[(*n)++]);
    if (!rc && hdr_peek(r, ',')) {
      r->pos++;
      continue;
    }
    if (!rc) rc = hdr_expect(r, ']');
    break;
  }
  return rc;
}

typedef struct tensor_entry {
  char name[128];
  kn_dtype dtype;
  int ndim;
  int64_t dims[KN_MAX_DIMS];
  int64_t begin, end;
} tensor_entry;

static int dtype_of(const char *name, kn_dtype *out) {
  static const struct {
    const char *name;
    kn_dtype dtype;
  } known[] = {{"F32", KN_F32}, {"F16", KN_F16}, {"BF16", KN_BF16}, {"F64", KN_F64}};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
    if (strcmp(known[i].name, name) == 0) {
      *out = known[i].dtype;
      return 1;
    }
  }
  return 0;
}

static int hdr_tensor(hdr_reader *r, tensor_entry *t) {
  int rc = hdr_expect(r, '{');
  int have = 0;
  while (!rc) {
    char key[32], dtype[16];
    int n;
    if ((rc = hdr_string(r, key, sizeof key)) || (rc = hdr_expect(r, ':'))) break;
    if (strcmp(key, "dtype") == 0) {
      if ((rc = hdr_string(r, dtype, sizeof dtype))) break;
      if (!dtype_of(dtype, &t->dtype)) {
        snprintf(r->err, r->errlen,
                 "checkpoint %s: tensor '%s' has dtype %s; kiln reads F32, F16, "
                 "BF16 and F64",
                 r->path, t->name, dtype);
        return KN_EFORMAT;
      }
      have |= 1;
    } else if (strcmp(key, "shape") == 0) {
      if ((rc = hdr_int_array(r, t->dims, KN_MAX_DIMS, &t->ndim))) break;
      have |= 2;
    } else if (strcmp(key, "data_offsets") == 0) {
      int64_t off[2];
      if ((rc = hdr_int_array(r, off, 2, &n))) break;
      if (n != 2 || off[1] < off[0]) return hdr_fail(r, "data_offsets must be [begin, end]");
      t->begin = off[0];
      t->end = off[1];
      have |= 4;
    } else {
      return hdr_fail(r, "unknown key in a tensor entry");
    }
    if (hdr_peek(r, ',')) {
      r->pos++;
      continue;
    }
    rc = hdr_expect(r, '}');
    break;
  }
  if (!rc && have != 7) {
    snprintf(r->err, r->errlen, "checkpoint %s: tensor '%s' lacks dtype, shape or data_offsets",
             r->path, t->name);
    return KN_EFORMAT;
  }
  return rc;
}

static int hdr_metadata(hdr_reader *r, kn_checkpoint_meta *meta) {
  int rc = hdr_expect(r, '{');
  if (!rc && hdr_peek(r, '}')) return hdr_expect(r, '}');
  while (!rc) {
    char key[64], value[256];
    if ((rc = hdr_string(r, key, sizeof key)) || (rc = hdr_expect(r, ':')) ||
        (rc = hdr_string(r, value, sizeof value)))
      break;
    if (meta->n < KN_CHECKPOINT_MAX_META) {
      memcpy(meta->keys[meta->n], key, sizeof key);
      memcpy(meta->values[meta->n], value, sizeof value);
      meta->n++;
    }
    if (hdr_peek(r, ',')) {
      r->pos++;
      continue;
    }
    rc = hdr_expect(r, '}');
    break;
  }
  return rc;
}

/* The flat slot (parameters, then states) of the graph's tensor named name. */
static int find_tensor(const kn_graph *g, const char *name, const kn_node_rec **node) {
  for (int p = 0; p < g->n_params + g->n_states; p++) {
    int is_param = p < g->n_params;
    kn_node id = is_param ? g->params[p] : g->states[p - g->n_params];
    const kn_node_rec *n = &g->nodes[id];
    if (strcmp(n->name, name) == 0) {
      *node = n;
      return p;
    }
  }
  return -1;
}

static int read_at(FILE *f, int64_t offset, void *buf, size_t len) {
  if (fseeko(f, (off_t)offset, SEEK_SET) != 0) return -1;
  return fread(buf, 1, len, f) == len ? 0 : -1;
}

int kn_checkpoint_read(kn_graph *g, const char *path, kn_checkpoint_meta *meta, char *err,
                       size_t errlen) {
  if (!g->compiled || g->f64) {
    snprintf(err, errlen, "checkpoint %s: load into a compiled f32 graph", path);
    return KN_ESTATE;
  }
  kn_checkpoint_meta scratch;
  if (!meta) meta = &scratch;
  meta->n = 0;
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "checkpoint %s: cannot open: %s", path, strerror(errno));
    return KN_EIO;
  }
  int rc = KN_OK;
  char *text = NULL;
  tensor_entry *entries = NULL;
  float *staged = NULL;
  uint8_t len_le[8];
  uint64_t hlen = 0;
  if (fseeko(f, 0, SEEK_END) != 0) {
    snprintf(err, errlen, "checkpoint %s: cannot seek: %s", path, strerror(errno));
    rc = KN_EIO;
    goto out;
  }
  const int64_t file_bytes = (int64_t)ftello(f);
  if (read_at(f, 0, len_le, 8) != 0) {
    snprintf(err, errlen, "checkpoint %s: shorter than the 8-byte header length", path);
    rc = KN_EFORMAT;
    goto out;
  }
  for (int i = 0; i < 8; i++) hlen |= (uint64_t)len_le[i] << (8 * i);
  if (hlen < 2 || hlen > (100u << 20) || (int64_t)hlen > file_bytes - 8) {
    snprintf(err, errlen, "checkpoint %s: header length %llu does not fit the file's %lld bytes",
             path, (unsigned long long)hlen, (long long)file_bytes);
    rc = KN_EFORMAT;
    goto out;
  }
  text = malloc(hlen + 1);
  entries = calloc((size_t)(g->n_params + g->n_states) + 1, sizeof *entries);
  /* Everything is staged and checked before the graph is touched. */
  staged = malloc((g->n_param_floats + g->n_state_floats + 1) * sizeof(float));
  if (!text || !entries || !staged) {
    snprintf(err, errlen, "checkpoint %s: out of memory for a %llu-byte header", path,
             (unsigned long long)hlen);
    rc = KN_ENOMEM;
    goto out;
  }
  if (read_at(f, 8, text, hlen) != 0) {
    snprintf(err, errlen, "checkpoint %s: cannot read the header: %s", path, strerror(errno));
    rc = KN_EIO;
    goto out;
  }
  text[hlen] = '\0';
  const int64_t data_start = 8 + (int64_t)hlen, data_bytes = file_bytes - data_start;
  hdr_reader r = {.text = text, .len = hlen, .path = path, .err = err, .errlen = errlen};
  int n_found = 0;
  rc = hdr_expect(&r, '{');
  while (!rc && !hdr_peek(&r, '}')) {
    tensor_entry t;
    memset(&t, 0, sizeof t);
    if ((rc = hdr_string(&r, t.name, sizeof t.name)) || (rc = hdr_expect(&r, ':'))) break;
    if (strcmp(t.name, "__metadata__") == 0) {
      rc = hdr_metadata(&r, meta);
    } else if (!(rc = hdr_tensor(&r, &t))) {
      const kn_node_rec *node;
      int slot = find_tensor(g, t.name, &node);
      if (slot < 0) {
        snprintf(err, errlen, "checkpoint %s: tensor '%s' is not in this model", path, t.name);
        rc = KN_EINVAL;
        break;
      }
      int same = t.ndim == node->ndim;
      for (int d = 0; same && d < t.ndim; d++) same = t.dims[d] == node->dims[d];
      if (!same) {
        char want[96] = "", got[96] = "";
        for (int d = 0; d < node->ndim; d++)
          snprintf(want + strlen(want), sizeof want - strlen(want), d ? ", %d" : "%d",
                   node->dims[d]);
        for (int d = 0; d < t.ndim; d++)
          snprintf(got + strlen(got), sizeof got - strlen(got), d ? ", %lld" : "%lld",
                   (long long)t.dims[d]);
        snprintf(err, errlen, "checkpoint %s: tensor '%s' has shape [%s], the model's is [%s]",
                 path, t.name, got, want);
        rc = KN_EINVAL;
        break;
      }
      size_t elems = kn_node_elems(node, 0);
      if (t.end - t.begin != (int64_t)(elems * kn_dtype_size(t.dtype)) || t.end > data_bytes) {
        snprintf(err, errlen,
                 "checkpoint %s: tensor '%s' data_offsets [%lld, %lld] do not hold %zu %s values "
                 "inside the file's %lld data bytes",
                 path, t.name, (long long)t.begin, (long long)t.end, elems, kn_dtype_name(t.dtype),
                 (long long)data_bytes);
        rc = KN_EFORMAT;
        break;
      }
      if (entries[slot].name[0]) {
        snprintf(err, errlen, "checkpoint %s: tensor '%s' appears twice", path, t.name);
        rc = KN_EFORMAT;
        break;
      }
      entries[slot] = t;
      n_found++;
    }
    if (!rc && hdr_peek(&r, ',')) r.pos++;
  }
  if (!rc) rc = hdr_expect(&r, '}');
  if (!rc && n_found < g->n_params + g->n_states) {
    for (int p = 0; p < g->n_params + g->n_states; p++) {
      if (entries[p].name[0]) continue;
      kn_node id = p < g->n_params ? g->params[p] : g->states[p - g->n_params];
      snprintf(err, errlen, "checkpoint %s: the model's tensor '%s' is missing", path,
               g->nodes[id].name);
      break;
    }
    rc = KN_EINVAL;
  }
  /* Stage every tensor in the flat order (parameters, then states). */
  size_t at = 0;
  for (int p = 0; !rc && p < g->n_params + g->n_states; p++) {
    const tensor_entry *t = &entries[p];
    size_t bytes = (size_t)(t->end - t->begin), elems = bytes / kn_dtype_size(t->dtype);
    void *raw = t->dtype == KN_F32 ? (void *)(staged + at) : malloc(bytes ? bytes : 1);
    if (!raw) {
      snprintf(err, errlen, "checkpoint %s: out of memory for tensor '%s'", path, t->name);
      rc = KN_ENOMEM;
      break;
    }
    if (read_at(f, data_start + t->begin, raw, bytes) != 0) {
      snprintf(err, errlen, "checkpoint %s: cannot read tensor '%s'", path, t->name);
      rc = KN_EIO;
    } else if (t->dtype != KN_F32) {
      kn_convert(t->dtype, raw, KN_F32, staged + at, elems);
    }
    if (t->dtype != KN_F32) free(raw);
    at += elems;
  }
  if (!rc) {
    memcpy(kn_params(g), staged, g->n_param_floats * sizeof(float)); /* the host's current */
    memcpy(g->state_buf, staged + g->n_param_floats, g->n_state_floats * sizeof(float));
  }
out:
  fclose(f);
  free(text);
  free(entries);
  free(staged);
  return rc;
}
