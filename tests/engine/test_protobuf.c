/* test_protobuf.c — the protobuf writer of the ONNX exporter, field by
 * field against byte strings from the protocol buffers encoding guide and
 * from the reference implementation's output. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "protobuf.h"

static void expect_bytes(kn_pb *b, const uint8_t *want, size_t n) {
  assert_false(b->failed);
  assert_int_equal(b->len, n);
  assert_memory_equal(b->data, want, n);
  kn_pb_free(b);
}

static void varints_take_seven_bits_a_byte_low_first(void **state) {
  (void)state;
  kn_pb b = {0};
  kn_pb_varint(&b, 0);
  kn_pb_varint(&b, 1);
  kn_pb_varint(&b, 127);
  kn_pb_varint(&b, 150);
  kn_pb_varint(&b, 300);
  kn_pb_varint(&b, UINT64_MAX);
  const uint8_t want[] = {0x00, 0x01, 0x7f, 0x96, 0x01, 0xac, 0x02, 0xff, 0xff,
                          0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
  expect_bytes(&b, want, sizeof want);
}

/* message Test1 { int32 a = 1; } with a = 150: the guide's 08 96 01. */
static void an_int_field_is_its_tag_and_varint(void **state) {
  (void)state;
  kn_pb b = {0};
  kn_pb_int(&b, 1, 150);
  kn_pb_int(&b, 20, 7); /* a tag past 15 takes two bytes: (20 << 3) | 0 = 160 */
  const uint8_t want[] = {0x08, 0x96, 0x01, 0xa0, 0x01, 0x07};
  expect_bytes(&b, want, sizeof want);
}

static void a_negative_int_takes_ten_bytes(void **state) {
  (void)state;
  kn_pb b = {0};
  kn_pb_int(&b, 3, -1);
  const uint8_t want[] = {0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
  expect_bytes(&b, want, sizeof want);
}

/* message Test2 { string b = 2; } with b = "testing": 12 07 74 65 73 74 69 6e 67. */
static void a_string_is_length_delimited(void **state) {
  (void)state;
  kn_pb b = {0};
  kn_pb_string(&b, 2, "testing");
  kn_pb_string(&b, 4, "");
  const uint8_t want[] = {0x12, 0x07, 't', 'e', 's', 't', 'i', 'n', 'g', 0x22, 0x00};
  expect_bytes(&b, want, sizeof want);
}

/* message Test3 { Test1 c = 3; } with c.a = 150: 1a 03 08 96 01. */
static void an_embedded_message_is_its_bytes_length_delimited(void **state) {
  (void)state;
  kn_pb inner = {0}, outer = {0};
  kn_pb_int(&inner, 1, 150);
  kn_pb_message(&outer, 3, &inner);
  kn_pb_free(&inner);
  const uint8_t want[] = {0x1a, 0x03, 0x08, 0x96, 0x01};
  expect_bytes(&outer, want, sizeof want);
}

/* 1.0f is 0x3f800000 and -2.5f 0xc0200000, little-endian after the tag. */
static void floats_are_fixed32_little_endian(void **state) {
  (void)state;
  kn_pb b = {0};
  kn_pb_float(&b, 2, 1.0f);
  const float packed[2] = {1.0f, -2.5f};
  kn_pb_packed_floats(&b, 4, packed, 2);
  const uint8_t want[] = {0x15, 0x00, 0x00, 0x80, 0x3f, 0x22, 0x08, 0x00,
                          0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0};
  expect_bytes(&b, want, sizeof want);
}

/* An ONNX TensorProto {dims: [2], data_type: FLOAT, name: "w", raw_data:
 * 1.0f 2.0f}, as onnx.helper.make_tensor(..., raw=True).SerializeToString()
 * writes it. */
static void an_onnx_tensor_matches_the_reference_bytes(void **state) {
  (void)state;
  kn_pb t = {0};
  const float data[2] = {1.0f, 2.0f};
  kn_pb_int(&t, 1, 2);
  kn_pb_int(&t, 2, 1);
  kn_pb_string(&t, 8, "w");
  kn_pb_bytes(&t, 9, data, sizeof data);
  const uint8_t want[] = {0x08, 0x02, 0x10, 0x01, 0x42, 0x01, 'w',  0x4a, 0x08,
                          0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40};
  expect_bytes(&t, want, sizeof want);
}

/* A length past 127 takes a two-byte varint. */
static void a_long_field_has_a_multibyte_length(void **state) {
  (void)state;
  uint8_t payload[200];
  memset(payload, 0xab, sizeof payload);
  kn_pb b = {0};
  kn_pb_bytes(&b, 9, payload, sizeof payload);
  assert_int_equal(b.len, 3 + sizeof payload);
  assert_int_equal(b.data[0], 0x4a);
  assert_int_equal(b.data[1], 0xc8); /* 200 = 0x48 | 0x80, then 1 */
  assert_int_equal(b.data[2], 0x01);
  assert_memory_equal(b.data + 3, payload, sizeof payload);
  kn_pb_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(varints_take_seven_bits_a_byte_low_first),
      cmocka_unit_test(an_int_field_is_its_tag_and_varint),
      cmocka_unit_test(a_negative_int_takes_ten_bytes),
      cmocka_unit_test(a_string_is_length_delimited),
      cmocka_unit_test(an_embedded_message_is_its_bytes_length_delimited),
      cmocka_unit_test(floats_are_fixed32_little_endian),
      cmocka_unit_test(an_onnx_tensor_matches_the_reference_bytes),
      cmocka_unit_test(a_long_field_has_a_multibyte_length),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
