/* example.c — tf.train.Example records: a feature found by name (or each
 * one listed), its
 * values read from bytes, float and int64 lists (packed or not), and an
 * Example encoded from named features (for converters and tests).
 *
 * message Example { Features features = 1; }
 * message Features { map<string, Feature> feature = 1; }
 * message Feature { oneof kind { BytesList bytes_list = 1;
 *                   FloatList float_list = 2; Int64List int64_list = 3; } }
 * message BytesList { repeated bytes value = 1; }  (FloatList, Int64List alike) */
#include <stdlib.h>
#include <string.h>

#include "../engine.h"
#include "../protobuf.h"

/* Calls fn(ctx, key, key_len, value, has_value) for each map entry of
 * Features, in order: 0, or -1 when the bytes are not an Example. */
typedef void (*entry_fn)(void *ctx, const uint8_t *key, size_t key_len, const kn_pbr_field *value,
                         int has_value);

static int each_entry(const uint8_t *data, size_t len, entry_fn fn, void *ctx) {
  kn_pbr ex = {data, data + len};
  kn_pbr_field f;
  int rc;
  while ((rc = kn_pbr_next(&ex, &f)) == 1) {
    if (f.number != 1 || f.wire != KN_PB_LEN) continue; /* Example.features */
    kn_pbr feats = {f.data, f.data + f.len};
    kn_pbr_field entry;
    while ((rc = kn_pbr_next(&feats, &entry)) == 1) {
      if (entry.number != 1 || entry.wire != KN_PB_LEN) continue; /* Features.feature */
      kn_pbr e = {entry.data, entry.data + entry.len};
      kn_pbr_field kv, v = {0};
      const uint8_t *key = NULL;
      size_t key_len = 0;
      int has_value = 0;
      while ((rc = kn_pbr_next(&e, &kv)) == 1) {
        if (kv.number == 1 && kv.wire == KN_PB_LEN)
          key = kv.data, key_len = kv.len;
        else if (kv.number == 2 && kv.wire == KN_PB_LEN)
          v = kv, has_value = 1;
      }
      if (rc < 0) return -1;
      fn(ctx, key ? key : (const uint8_t *)"", key_len, &v, has_value);
    }
    if (rc < 0) return -1;
  }
  return rc < 0 ? -1 : 0;
}

typedef struct find_ctx {
  const char *name;
  size_t name_len;
  int found;
  kn_pbr_field value;
} find_ctx;

static void find_fn(void *ctx, const uint8_t *key, size_t key_len, const kn_pbr_field *value,
                    int has_value) {
  find_ctx *c = ctx;
  if (key_len != c->name_len || memcmp(key, c->name, key_len) != 0) return;
  /* A later entry with the same key replaces an earlier one (map semantics). */
  c->found = 1;
  if (has_value)
    c->value = *value;
  else
    memset(&c->value, 0, sizeof c->value);
}

/* The value of a map entry whose key is name, as a Feature's bytes. */
static int find_entry(const uint8_t *data, size_t len, const char *name, kn_pbr_field *value) {
  find_ctx c = {.name = name, .name_len = strlen(name)};
  if (each_entry(data, len, find_fn, &c) != 0) return -1;
  if (c.found) *value = c.value;
  return c.found;
}

/* A Feature's bytes as its kind and list: the last kind set wins, as a
 * oneof does. 0, or -1 when malformed. */
static int read_feature(const kn_pbr_field *value, kn_feature *out) {
  memset(out, 0, sizeof *out);
  if (!value->data) return 0; /* an entry with no Feature: no list set */
  kn_pbr feat = {value->data, value->data + value->len};
  kn_pbr_field f;
  int rc;
  while ((rc = kn_pbr_next(&feat, &f)) == 1) {
    if (f.wire != KN_PB_LEN || f.number < 1 || f.number > 3) continue;
    out->kind = f.number; /* KN_FEATURE_BYTES / FLOAT / INT64 */
    out->list = f.data;
    out->list_len = f.len;
  }
  return rc < 0 ? -1 : 0;
}

int kn_example_feature(const uint8_t *data, size_t len, const char *name, kn_feature *out) {
  memset(out, 0, sizeof *out);
  kn_pbr_field value;
  int rc = find_entry(data, len, name, &value);
  if (rc <= 0) return rc;
  return read_feature(&value, out) < 0 ? -1 : 1;
}

typedef struct list_ctx {
  kn_example_entry *out;
  int cap, n, bad;
} list_ctx;

static void list_fn(void *ctx, const uint8_t *key, size_t key_len, const kn_pbr_field *value,
                    int has_value) {
  list_ctx *c = ctx;
  kn_feature f = {0};
  if (has_value && read_feature(value, &f) < 0) c->bad = 1;
  if (c->n < c->cap) c->out[c->n] = (kn_example_entry){key, key_len, f};
  c->n++;
}

int kn_example_features(const uint8_t *data, size_t len, kn_example_entry *out, int cap) {
  list_ctx c = {.out = out, .cap = cap};
  if (each_entry(data, len, list_fn, &c) != 0 || c.bad) return -1;
  return c.n;
}

/* Calls fn for each value of the list; -1 when the list is malformed or of
 * the wrong wire types for its kind. */
typedef void (*value_fn)(void *ctx, size_t i, uint64_t bits, const uint8_t *data, size_t len);

static int64_t each_value(const kn_feature *feat, value_fn fn, void *ctx) {
  kn_pbr r = {feat->list, feat->list + feat->list_len};
  kn_pbr_field f;
  int rc;
  int64_t n = 0;
  while ((rc = kn_pbr_next(&r, &f)) == 1) {
    if (f.number != 1) continue;
    if (feat->kind == KN_FEATURE_BYTES) {
      if (f.wire != KN_PB_LEN) return -1;
      if (fn) fn(ctx, (size_t)n, 0, f.data, f.len);
      n++;
    } else if (feat->kind == KN_FEATURE_FLOAT && f.wire == KN_PB_FIXED32) {
      if (fn) fn(ctx, (size_t)n, f.u, NULL, 0);
      n++;
    } else if (feat->kind == KN_FEATURE_INT64 && f.wire == KN_PB_VARINT) {
      if (fn) fn(ctx, (size_t)n, f.u, NULL, 0);
      n++;
    } else if (f.wire == KN_PB_LEN && feat->kind == KN_FEATURE_FLOAT) { /* packed */
      if (f.len % 4) return -1;
      for (size_t k = 0; k < f.len; k += 4) {
        uint64_t bits = (uint64_t)f.data[k] | (uint64_t)f.data[k + 1] << 8 |
                        (uint64_t)f.data[k + 2] << 16 | (uint64_t)f.data[k + 3] << 24;
        if (fn) fn(ctx, (size_t)n, bits, NULL, 0);
        n++;
      }
    } else if (f.wire == KN_PB_LEN && feat->kind == KN_FEATURE_INT64) { /* packed */
      kn_pbr p = {f.data, f.data + f.len};
      uint64_t v;
      while (p.p < p.end) {
        if (kn_pbr_varint(&p, &v)) return -1;
        if (fn) fn(ctx, (size_t)n, v, NULL, 0);
        n++;
      }
    } else {
      return -1;
    }
  }
  return rc < 0 ? -1 : n;
}

int64_t kn_feature_count(const kn_feature *f) {
  return f->kind ? each_value(f, NULL, NULL) : 0;
}

typedef struct num_ctx {
  int kind;
  float *floats;
  int64_t *ints;
  size_t cap;
  int beyond; /* a float no int64 holds was asked for as an int64 */
} num_ctx;

static void put_number(void *ctx, size_t i, uint64_t bits, const uint8_t *data, size_t len) {
  (void)data, (void)len;
  num_ctx *c = ctx;
  if (i >= c->cap) return;
  if (c->kind == KN_FEATURE_FLOAT) {
    uint32_t b32 = (uint32_t)bits;
    float fv;
    memcpy(&fv, &b32, sizeof fv);
    if (c->floats) c->floats[i] = fv;
    if (c->ints) {
      /* [-2^63, 2^63): converting anything else (NaN too) is undefined. */
      if (fv >= -9223372036854775808.0f && fv < 9223372036854775808.0f)
        c->ints[i] = (int64_t)fv;
      else
        c->beyond = 1;
    }
  } else {
    if (c->floats) c->floats[i] = (float)(int64_t)bits;
    if (c->ints) c->ints[i] = (int64_t)bits;
  }
}

int64_t kn_feature_floats(const kn_feature *f, float *dst, size_t cap) {
  if (f->kind != KN_FEATURE_FLOAT && f->kind != KN_FEATURE_INT64) return -1;
  num_ctx c = {f->kind, dst, NULL, cap, 0};
  return each_value(f, put_number, &c);
}

int64_t kn_feature_int64s(const kn_feature *f, int64_t *dst, size_t cap) {
  if (f->kind != KN_FEATURE_FLOAT && f->kind != KN_FEATURE_INT64) return -1;
  num_ctx c = {f->kind, NULL, dst, cap, 0};
  int64_t n = each_value(f, put_number, &c);
  return c.beyond ? -1 : n;
}

typedef struct bytes_ctx {
  size_t want;
  const uint8_t *data;
  size_t len;
} bytes_ctx;

static void pick_bytes(void *ctx, size_t i, uint64_t bits, const uint8_t *data, size_t len) {
  (void)bits;
  bytes_ctx *c = ctx;
  if (i == c->want) c->data = data, c->len = len;
}

int kn_feature_bytes(const kn_feature *f, size_t i, const uint8_t **data, size_t *len) {
  if (f->kind != KN_FEATURE_BYTES) return -1;
  bytes_ctx c = {i, NULL, 0};
  int64_t n = each_value(f, pick_bytes, &c);
  if (n < 0 || (uint64_t)n <= i) return -1;
  *data = c.data;
  *len = c.len;
  return 0;
}

int kn_example_encode(const kn_feature_value *features, int n, uint8_t **out, size_t *len) {
  kn_pb feats = {0};
  for (int i = 0; i < n; i++) {
    const kn_feature_value *v = &features[i];
    kn_pb list = {0}, feat = {0}, entry = {0};
    if (v->kind == KN_FEATURE_BYTES) {
      kn_pb_bytes(&list, 1, v->bytes, v->count);
    } else if (v->kind == KN_FEATURE_FLOAT) {
      kn_pb_packed_floats(&list, 1, v->floats, v->count);
    } else {
      kn_pb packed = {0};
      for (size_t k = 0; k < v->count; k++) kn_pb_varint(&packed, (uint64_t)v->ints[k]);
      kn_pb_bytes(&list, 1, packed.data, packed.len);
      list.failed |= packed.failed;
      kn_pb_free(&packed);
    }
    kn_pb_message(&feat, v->kind, &list);
    kn_pb_string(&entry, 1, v->name);
    kn_pb_message(&entry, 2, &feat);
    kn_pb_message(&feats, 1, &entry);
    feats.failed |= list.failed | feat.failed | entry.failed;
    kn_pb_free(&list);
    kn_pb_free(&feat);
    kn_pb_free(&entry);
  }
  kn_pb ex = {0};
  kn_pb_message(&ex, 1, &feats);
  ex.failed |= feats.failed;
  kn_pb_free(&feats);
  if (ex.failed) {
    kn_pb_free(&ex);
    return KN_ENOMEM;
  }
  *out = ex.data;
  *len = ex.len;
  return KN_OK;
}
