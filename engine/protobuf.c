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
