/* protobuf.h — private to the engine: the protocol buffers wire format,
 * written (varints, fixed 32-bit floats, length-delimited bytes and
 * embedded messages, packed repeated fields) for the ONNX exporter, and
 * read field by field for tf.train.Example records. */
#ifndef KILN_ENGINE_PROTOBUF_H
#define KILN_ENGINE_PROTOBUF_H

#include <stddef.h>
#include <stdint.h>

/* Wire types. */
enum { KN_PB_VARINT = 0, KN_PB_FIXED64 = 1, KN_PB_LEN = 2, KN_PB_FIXED32 = 5 };

/* A message being written: bytes that grow as fields are appended. Once an
 * allocation fails, failed is set and further appends do nothing, so a
 * writer checks once at the end. A zeroed kn_pb is an empty message. */
typedef struct kn_pb {
  uint8_t *data;
  size_t len, cap;
  int failed;
} kn_pb;

void kn_pb_free(kn_pb *b); /* frees the bytes; the struct is the caller's */
/* An unsigned varint (7 bits a byte, low first), no tag. */
void kn_pb_varint(kn_pb *b, uint64_t v);
/* The key of a field: (field << 3) | wire type, as a varint. */
void kn_pb_tag(kn_pb *b, int field, int wire);
/* int32 / int64 / enum fields: a negative value takes 10 bytes (its 64-bit
 * two's complement), as protobuf encodes it. */
void kn_pb_int(kn_pb *b, int field, int64_t v);
void kn_pb_float(kn_pb *b, int field, float v); /* fixed32, little-endian */
void kn_pb_bytes(kn_pb *b, int field, const void *data, size_t len);
void kn_pb_string(kn_pb *b, int field, const char *s);
/* An embedded message: sub's bytes as a length-delimited field. */
void kn_pb_message(kn_pb *b, int field, const kn_pb *sub);
/* A packed repeated float field: one length, then n little-endian floats. */
void kn_pb_packed_floats(kn_pb *b, int field, const float *v, size_t n);

/* A message being read: one field at a time from [p, end). */
typedef struct kn_pbr {
  const uint8_t *p, *end;
} kn_pbr;

/* A field read by kn_pbr_next: its number and wire type, and its value:
 * u for varint, fixed32 (bits) and fixed64 (bits), data/len for
 * length-delimited fields (bytes, strings, messages, packed lists). */
typedef struct kn_pbr_field {
  int number, wire;
  uint64_t u;
  const uint8_t *data;
  size_t len;
} kn_pbr_field;

/* An unsigned varint: 0, or -1 when it runs past the end or past 10 bytes. */
int kn_pbr_varint(kn_pbr *r, uint64_t *v);
/* The next field: 1, 0 at the end of the message, -1 when the bytes are
 * not a message (a truncated value, an unknown wire type, field 0). */
int kn_pbr_next(kn_pbr *r, kn_pbr_field *f);
#endif
