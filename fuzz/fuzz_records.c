/* fuzz_records.c — the TFRecord reader and the tf.train.Example decoder
 * that streamed and uploaded shards go through: any bytes are records or
 * a data error that says why, every feature read stays inside its record,
 * and an Example encoded from the input's own bytes decodes back to the
 * same values. */
#include "fuzz.h"

#include <string.h>

#include "engine_data.h"

static fuzz_file shard;

/* Reads every value of the feature name of a record, as each kind allows. */
static void read_feature(const uint8_t *rec, size_t len, const char *name) {
  kn_feature f;
  int found = kn_example_feature(rec, len, name, &f);
  if (found != 1) return;
  FUZZ_CHECK(f.list_len == 0 || (f.list >= rec && f.list + f.list_len <= rec + len),
             "feature '%s' points outside its record", name);
  int64_t n = kn_feature_count(&f);
  if (n < 0) return;
  float floats[64];
  int64_t ints[64];
  int64_t nf = kn_feature_floats(&f, floats, 64);
  int64_t ni = kn_feature_int64s(&f, ints, 64);
  if (f.kind == KN_FEATURE_FLOAT)
    FUZZ_CHECK(nf == n, "floats: %lld of %lld", (long long)nf, (long long)n);
  if (f.kind == KN_FEATURE_INT64)
    FUZZ_CHECK(ni == n, "ints: %lld of %lld", (long long)ni, (long long)n);
  for (int64_t i = 0; f.kind == KN_FEATURE_BYTES && i < n && i < 8; i++) {
    const uint8_t *b;
    size_t blen;
    if (kn_feature_bytes(&f, (size_t)i, &b, &blen) == 0)
      FUZZ_CHECK(blen == 0 || (b >= rec && b + blen <= rec + len), "bytes value %lld outside",
                 (long long)i);
  }
}

/* Encodes the input's first bytes as each kind of feature and decodes them. */
static void round_trip(const uint8_t *data, size_t size) {
  size_t n = size < 256 ? size : 256;
  float floats[64];
  int64_t ints[32];
  size_t nf = n / sizeof(float) < 64 ? n / sizeof(float) : 64;
  size_t ni = n / sizeof(int64_t) < 32 ? n / sizeof(int64_t) : 32;
  memcpy(floats, data, nf * sizeof(float));
  memcpy(ints, data, ni * sizeof(int64_t));
  kn_feature_value values[3] = {
      {.name = "image", .kind = KN_FEATURE_BYTES, .bytes = data, .count = n},
      {.name = "x", .kind = KN_FEATURE_FLOAT, .floats = floats, .count = nf},
      {.name = "label", .kind = KN_FEATURE_INT64, .ints = ints, .count = ni},
  };
  uint8_t *enc = NULL;
  size_t enc_len = 0;
  FUZZ_CHECK(kn_example_encode(values, 3, &enc, &enc_len) == 0, "encode failed");
  kn_feature f;
  const uint8_t *b;
  size_t blen;
  FUZZ_CHECK(kn_example_feature(enc, enc_len, "image", &f) == 1 &&
                 kn_feature_bytes(&f, 0, &b, &blen) == 0 && blen == n && memcmp(b, data, n) == 0,
             "bytes feature did not round-trip");
  float back_f[64];
  FUZZ_CHECK(kn_example_feature(enc, enc_len, "x", &f) == 1 &&
                 kn_feature_floats(&f, back_f, 64) == (int64_t)nf &&
                 memcmp(back_f, floats, nf * sizeof(float)) == 0,
             "float feature did not round-trip");
  int64_t back_i[32];
  FUZZ_CHECK(kn_example_feature(enc, enc_len, "label", &f) == 1 &&
                 kn_feature_int64s(&f, back_i, 32) == (int64_t)ni &&
                 memcmp(back_i, ints, ni * sizeof(int64_t)) == 0,
             "int64 feature did not round-trip");
  FUZZ_CHECK(kn_example_feature(enc, enc_len, "absent", &f) == 0,
             "a feature never written was found");
  free(enc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_file_set(&shard, "tfrecord", data, size);
  char err[1024] = "";
  kn_tfrecord *r = NULL;
  if (kn_tfrecord_open(shard.path, &r, err, sizeof err) != 0) {
    FUZZ_CHECK(err[0], "a refused file says why");
  } else {
    const uint8_t *rec;
    size_t len;
    int rc;
    int64_t records = 0;
    while ((rc = kn_tfrecord_next(r, &rec, &len, err, sizeof err)) == 1) {
      records++;
      read_feature(rec, len, "image");
      read_feature(rec, len, "label");
    }
    FUZZ_CHECK(rc == 0 || err[0], "a damaged file says why");
    FUZZ_CHECK(kn_tfrecord_index(r) >= records, "records counted %lld, read %lld",
               (long long)kn_tfrecord_index(r), (long long)records);
    kn_tfrecord_close(r);
  }
  /* The bytes themselves as an Example (what an upload's check reads). */
  read_feature(data, size, "image");
  read_feature(data, size, "label");
  round_trip(data, size);
  return 0;
}
