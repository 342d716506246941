/* protobuf.c — the protocol buffers wire format, written only: enough for
 * the ONNX exporter's messages (see protobuf.h). Little-endian hosts, as
 * the rest of kiln's file formats assume. */
#include "protobuf.h"

#include <stdlib.h>
#include <string.h>

void kn_pb_free(kn_pb *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

static void put(kn_pb *b, const void *p, size_t n) {
  if (b->failed || n == 0) return;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + n) cap *= 2;
    uint8_t *data = realloc(b->data, cap);
    if (!data) {
      b->failed = 1;
      return;
    }
    b->data = data;
    b->cap = cap;
  }
  memcpy(b->data + b->len, p, n);
  b->len += n;
}

void kn_pb_varint(kn_pb *b, uint64_t v) {
  uint8_t out[10];
  size_t n = 0;
  do {
    out[n] = (uint8_t)(v & 0x7f);
    v >>= 7;
    if (v) out[n] |= 0x80;
    n++;
  } while (v);
  put(b, out, n);
}

void kn_pb_tag(kn_pb *b, int field, int wire) {
  kn_pb_varint(b, ((uint64_t)field << 3) | (uint64_t)wire);
}

void kn_pb_int(kn_pb *b, int field, int64_t v) {
  kn_pb_tag(b, field, KN_PB_VARINT);
  kn_pb_varint(b, (uint64_t)v);
}

static void put_float(kn_pb *b, float v) {
  uint32_t bits;
  memcpy(&bits, &v, sizeof bits);
  uint8_t le[4] = {(uint8_t)bits, (uint8_t)(bits >> 8), (uint8_t)(bits >> 16),
                   (uint8_t)(bits >> 24)};
  put(b, le, 4);
}

void kn_pb_float(kn_pb *b, int field, float v) {
  kn_pb_tag(b, field, KN_PB_FIXED32);
  put_float(b, v);
}

void kn_pb_bytes(kn_pb *b, int field, const void *data, size_t len) {
  kn_pb_tag(b, field, KN_PB_LEN);
  kn_pb_varint(b, len);
  put(b, data, len);
}

void kn_pb_string(kn_pb *b, int field, const char *s) {
  kn_pb_bytes(b, field, s, strlen(s));
}

void kn_pb_message(kn_pb *b, int field, const kn_pb *sub) {
  if (sub->failed) b->failed = 1;
  kn_pb_bytes(b, field, sub->data, sub->len);
}

void kn_pb_packed_floats(kn_pb *b, int field, const float *v, size_t n) {
  kn_pb_tag(b, field, KN_PB_LEN);
  kn_pb_varint(b, n * 4);
  for (size_t i = 0; i < n; i++) put_float(b, v[i]);
}

int kn_pbr_varint(kn_pbr *r, uint64_t *v) {
  uint64_t x = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (r->p >= r->end) return -1;
    const uint8_t byte = *r->p++;
    x |= (uint64_t)(byte & 0x7f) << shift;
    if (!(byte & 0x80)) {
      *v = x;
      return 0;
    }
  }
  return -1;
}

int kn_pbr_next(kn_pbr *r, kn_pbr_field *f) {
  if (r->p >= r->end) return 0;
  uint64_t key;
  if (kn_pbr_varint(r, &key) || key >> 3 == 0 || key >> 3 > 0x1fffffff) return -1;
  memset(f, 0, sizeof *f);
  f->number = (int)(key >> 3);
  f->wire = (int)(key & 7);
  switch (f->wire) {
  case KN_PB_VARINT: return kn_pbr_varint(r, &f->u) ? -1 : 1;
  case KN_PB_FIXED32:
  case KN_PB_FIXED64: {
    const size_t n = f->wire == KN_PB_FIXED32 ? 4 : 8;
    if ((size_t)(r->end - r->p) < n) return -1;
    for (size_t i = 0; i < n; i++) f->u |= (uint64_t)r->p[i] << (8 * i);
    r->p += n;
    return 1;
  }
  case KN_PB_LEN: {
    uint64_t len;
    if (kn_pbr_varint(r, &len) || len > (uint64_t)(r->end - r->p)) return -1;
    f->data = r->p;
    f->len = (size_t)len;
    r->p += len;
    return 1;
  }
  default: return -1; /* groups (3, 4) and 6, 7 are not in proto3 messages */
  }
}
