/* TFRecord files and tf.train.Example records: CRC32C against published
 * values, Examples against hand-encoded bytes, every feature type read
 * back from raw and gzip'd files, and a corrupt or truncated file refused
 * naming the file, record and byte offset. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "engine.h"

static char dir[256];

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/kiln-test-records-XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd);
}

/* RFC 3720 (iSCSI) B.4 and the usual check value of "123456789". */
static void crc32c_matches_published_values(void **state) {
  (void)state;
  uint8_t zeros[32] = {0}, ones[32], ramp[32];
  for (int i = 0; i < 32; i++) ones[i] = 0xff, ramp[i] = (uint8_t)i;
  assert_int_equal(kn_crc32c(0, "123456789", 9), 0xE3069283u);
  assert_int_equal(kn_crc32c(0, zeros, 32), 0x8A9136AAu);
  assert_int_equal(kn_crc32c(0, ones, 32), 0x62A8AB43u);
  assert_int_equal(kn_crc32c(0, ramp, 32), 0x46DD794Eu);
  assert_int_equal(kn_crc32c(kn_crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
  assert_int_equal(kn_crc32c_mask(0xE3069283u), 0xc78ab0e5u);
  assert_int_equal(kn_crc32c_mask(0), 0xa282ead8u);
}

static void a_record_frame_is_length_crc_data_crc(void **state) {
  (void)state;
  uint8_t head[12], tail[4];
  kn_tfrecord_frame("hello", 5, head, tail);
  const uint8_t len[8] = {5, 0, 0, 0, 0, 0, 0, 0};
  assert_memory_equal(head, len, 8);
  /* masked CRC32C of the 8 length bytes, little-endian */
  const uint8_t len_crc[4] = {0xea, 0xb2, 0x04, 0x3e};
  assert_memory_equal(head + 8, len_crc, 4);
  uint32_t want = kn_crc32c_mask(kn_crc32c(0, "hello", 5));
  assert_int_equal(tail[0] | tail[1] << 8 | tail[2] << 16 | (uint32_t)tail[3] << 24, want);
}

/* Example { features { feature { key: "a" value { int64_list { value: 1 } } } } } */
static void an_example_encodes_as_protobuf_does(void **state) {
  (void)state;
  const int64_t one = 1;
  kn_feature_value v = {.name = "a", .kind = KN_FEATURE_INT64, .ints = &one, .count = 1};
  uint8_t *bytes;
  size_t len;
  assert_int_equal(kn_example_encode(&v, 1, &bytes, &len), KN_OK);
  const uint8_t want[] = {0x0a, 0x0c, 0x0a, 0x0a, 0x0a, 0x01, 0x61,
                          0x12, 0x05, 0x1a, 0x03, 0x0a, 0x01, 0x01};
  assert_int_equal(len, sizeof want);
  assert_memory_equal(bytes, want, len);
  free(bytes);
}

/* Older writers put repeated numbers unpacked: one tagged value each. */
static void unpacked_lists_read_as_packed_ones(void **state) {
  (void)state;
  /* feature "f": float_list { value: 1.5 value: -2 } (fixed32, unpacked);
   * feature "i": int64_list { value: 300 value: -1 } (varints, unpacked). */
  const uint8_t ex[] = {
      0x0a, 0x2a,                                                        /* features */
      0x0a, 0x11, 0x0a, 0x01, 'f',  0x12, 0x0c, 0x12, 0x0a,              /* entry f, float_list */
      0x0d, 0x00, 0x00, 0xc0, 0x3f, 0x0d, 0x00, 0x00, 0x00, 0xc0,        /* 1.5, -2 */
      0x0a, 0x15, 0x0a, 0x01, 'i',  0x12, 0x10, 0x1a, 0x0e,              /* entry i, int64_list */
      0x08, 0xac, 0x02,                                                  /* 300 */
      0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}; /* -1 */
  kn_feature f;
  assert_int_equal(kn_example_feature(ex, sizeof ex, "f", &f), 1);
  assert_int_equal(f.kind, KN_FEATURE_FLOAT);
  float fl[2];
  assert_int_equal(kn_feature_floats(&f, fl, 2), 2);
  assert_true(fl[0] == 1.5f && fl[1] == -2.0f);
  assert_int_equal(kn_example_feature(ex, sizeof ex, "i", &f), 1);
  assert_int_equal(f.kind, KN_FEATURE_INT64);
  int64_t iv[2];
  assert_int_equal(kn_feature_int64s(&f, iv, 2), 2);
  assert_true(iv[0] == 300 && iv[1] == -1);
  assert_int_equal(kn_example_feature(ex, sizeof ex, "g", &f), 0);
  /* Cut short inside a value: not an Example. */
  assert_int_equal(kn_example_feature(ex, sizeof ex - 3, "i", &f), -1);
}

/* A float that no int64 holds (1e30, NaN) read as an int64 (a float label)
 * is refused, not converted (undefined in C): the fuzz target found it. */
static void a_float_beyond_int64_is_no_int64(void **state) {
  (void)state;
  const float values[3] = {3.0f, 1e30f, NAN};
  for (int bad = 0; bad < 3; bad++) {
    const float one[2] = {values[0], values[bad]};
    kn_feature_value fv = {.name = "label", .kind = KN_FEATURE_FLOAT, .floats = one, .count = 2};
    uint8_t *enc = NULL;
    size_t len = 0;
    assert_int_equal(kn_example_encode(&fv, 1, &enc, &len), 0);
    kn_feature f;
    assert_int_equal(kn_example_feature(enc, len, "label", &f), 1);
    float floats[2];
    assert_int_equal(kn_feature_floats(&f, floats, 2), 2);
    assert_true(floats[0] == 3.0f);
    int64_t ints[2];
    assert_int_equal(kn_feature_int64s(&f, ints, 2), bad ? -1 : 2);
    if (!bad) assert_true(ints[0] == 3 && ints[1] == 3);
    free(enc);
  }
}

/* The features of an Example listed in order, with their kinds and counts
 * (what an upload's check shows so a spec can name them). */
static void an_examples_features_are_listed_with_kinds(void **state) {
  (void)state;
  const uint8_t px[3] = {1, 2, 3};
  const float fl[2] = {1, 2};
  const int64_t label = 7;
  kn_feature_value v[] = {
      {.name = "image/encoded", .kind = KN_FEATURE_BYTES, .bytes = px, .count = 3},
      {.name = "weights", .kind = KN_FEATURE_FLOAT, .floats = fl, .count = 2},
      {.name = "label", .kind = KN_FEATURE_INT64, .ints = &label, .count = 1},
  };
  uint8_t *bytes;
  size_t len;
  assert_int_equal(kn_example_encode(v, 3, &bytes, &len), KN_OK);
  kn_example_entry e[4];
  assert_int_equal(kn_example_features(bytes, len, e, 4), 3);
  const char *names[] = {"image/encoded", "weights", "label"};
  const int kinds[] = {KN_FEATURE_BYTES, KN_FEATURE_FLOAT, KN_FEATURE_INT64};
  const int64_t counts[] = {1, 2, 1};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(e[i].name_len, strlen(names[i]));
    assert_memory_equal(e[i].name, names[i], e[i].name_len);
    assert_int_equal(e[i].feature.kind, kinds[i]);
    assert_int_equal(kn_feature_count(&e[i].feature), counts[i]);
  }
  assert_int_equal(kn_example_features(bytes, len, e, 1), 3); /* counted past cap */
  assert_int_equal(kn_example_features(bytes, len - 2, e, 4), -1);
  free(bytes);
}

static void write_records(const char *path, int gz, int n, int64_t corrupt_record) {
  FILE *f = gz ? NULL : fopen(path, "wb");
  gzFile g = gz ? gzopen(path, "wb") : NULL;
  assert_true(f || g);
  for (int i = 0; i < n; i++) {
    uint8_t pixels[6];
    for (int k = 0; k < 6; k++) pixels[k] = (uint8_t)(i * 10 + k);
    const float floats[3] = {(float)i, 0.5f, -1e30f};
    const int64_t ints[2] = {i, -(int64_t)i * 1000000000000LL};
    kn_feature_value v[] = {
        {.name = "image/encoded", .kind = KN_FEATURE_BYTES, .bytes = pixels, .count = 6},
        {.name = "x", .kind = KN_FEATURE_FLOAT, .floats = floats, .count = 3},
        {.name = "image/class/label", .kind = KN_FEATURE_INT64, .ints = ints, .count = 2},
    };
    uint8_t *rec, head[12], tail[4];
    size_t len;
    assert_int_equal(kn_example_encode(v, 3, &rec, &len), KN_OK);
    kn_tfrecord_frame(rec, len, head, tail);
    if (i == corrupt_record) rec[len / 2] ^= 0x20;
    if (f) {
      fwrite(head, 1, 12, f), fwrite(rec, 1, len, f), fwrite(tail, 1, 4, f);
    } else {
      gzwrite(g, head, 12), gzwrite(g, rec, (unsigned)len), gzwrite(g, tail, 4);
    }
    free(rec);
  }
  if (f) fclose(f);
  if (g) gzclose(g);
}

static void every_feature_type_reads_back_raw_and_gzipped(void **state) {
  (void)state;
  for (int gz = 0; gz <= 1; gz++) {
    char path[300], err[256];
    snprintf(path, sizeof path, "%s/ex%d.tfrecord%s", dir, gz, gz ? ".gz" : "");
    write_records(path, gz, 5, -1);
    kn_tfrecord *r;
    assert_int_equal(kn_tfrecord_open(path, &r, err, sizeof err), KN_OK);
    const uint8_t *rec;
    size_t len;
    int i = 0, rc;
    while ((rc = kn_tfrecord_next(r, &rec, &len, err, sizeof err)) == 1) {
      kn_feature f;
      assert_int_equal(kn_example_feature(rec, len, "image/encoded", &f), 1);
      assert_int_equal(f.kind, KN_FEATURE_BYTES);
      assert_int_equal(kn_feature_count(&f), 1);
      const uint8_t *px;
      size_t n;
      assert_int_equal(kn_feature_bytes(&f, 0, &px, &n), 0);
      assert_int_equal(n, 6);
      for (int k = 0; k < 6; k++) assert_int_equal(px[k], i * 10 + k);
      assert_int_equal(kn_feature_bytes(&f, 1, &px, &n), -1);
      float x[3];
      assert_int_equal(kn_example_feature(rec, len, "x", &f), 1);
      assert_int_equal(kn_feature_floats(&f, x, 3), 3);
      assert_true(x[0] == (float)i && x[1] == 0.5f && x[2] == -1e30f);
      int64_t y[2];
      assert_int_equal(kn_example_feature(rec, len, "image/class/label", &f), 1);
      assert_int_equal(kn_feature_int64s(&f, y, 2), 2);
      assert_true(y[0] == i && y[1] == -(int64_t)i * 1000000000000LL);
      assert_int_equal(kn_feature_floats(&f, x, 1), 2); /* ints read as floats too */
      assert_true(x[0] == (float)i);
      assert_int_equal(kn_example_feature(rec, len, "image/label", &f), 0);
      i++;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(i, 5);
    kn_tfrecord_close(r);
  }
}

static void a_corrupt_record_is_named_with_its_offset(void **state) {
  (void)state;
  char path[300], err[512];
  snprintf(path, sizeof path, "%s/bad.tfrecord", dir);
  write_records(path, 0, 4, 2);
  kn_tfrecord *r;
  assert_int_equal(kn_tfrecord_open(path, &r, err, sizeof err), KN_OK);
  const uint8_t *rec;
  size_t len, offset = 0;
  assert_int_equal(kn_tfrecord_next(r, &rec, &len, err, sizeof err), 1);
  offset += 12 + len + 4;
  assert_int_equal(kn_tfrecord_next(r, &rec, &len, err, sizeof err), 1);
  offset += 12 + len + 4;
  assert_int_equal(kn_tfrecord_next(r, &rec, &len, err, sizeof err), KN_EFORMAT);
  char want[400];
  snprintf(want, sizeof want, "%s: record 2 at byte %zu: the data's CRC does not match", path,
           offset);
  assert_non_null(strstr(err, want));
  kn_tfrecord_close(r);
}

static void a_truncated_file_is_named(void **state) {
  (void)state;
  char path[300], err[512];
  snprintf(path, sizeof path, "%s/cut.tfrecord", dir);
  write_records(path, 0, 3, -1);
  FILE *f = fopen(path, "rb");
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fclose(f);
  assert_int_equal(truncate(path, size - 7), 0);
  kn_tfrecord *r;
  assert_int_equal(kn_tfrecord_open(path, &r, err, sizeof err), KN_OK);
  const uint8_t *rec;
  size_t len;
  assert_int_equal(kn_tfrecord_next(r, &rec, &len, err, sizeof err), 1);
  assert_int_equal(kn_tfrecord_next(r, &rec, &len, err, sizeof err), 1);
  assert_int_equal(kn_tfrecord_next(r, &rec, &len, err, sizeof err), KN_EFORMAT);
  assert_non_null(strstr(err, "cut.tfrecord: record 2 at byte "));
  assert_non_null(strstr(err, "the file ends inside the record"));
  kn_tfrecord_close(r);
  assert_int_equal(kn_tfrecord_open("/nonexistent/x.tfrecord", &r, err, sizeof err), KN_EIO);
  assert_non_null(strstr(err, "/nonexistent/x.tfrecord: cannot open"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(crc32c_matches_published_values),
      cmocka_unit_test(a_record_frame_is_length_crc_data_crc),
      cmocka_unit_test(an_example_encodes_as_protobuf_does),
      cmocka_unit_test(unpacked_lists_read_as_packed_ones),
      cmocka_unit_test(a_float_beyond_int64_is_no_int64),
      cmocka_unit_test(an_examples_features_are_listed_with_kinds),
      cmocka_unit_test(every_feature_type_reads_back_raw_and_gzipped),
      cmocka_unit_test(a_corrupt_record_is_named_with_its_offset),
      cmocka_unit_test(a_truncated_file_is_named),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
