/* example_tool — kiln's tf.train.Example and TFRecord code, driven from the
 * command line for the cross-check against Python's protobuf runtime
 * (example_matches_protobuf.py):
 *   example_tool encode OUT  writes 3 records of known features;
 *   example_tool decode IN   prints each record's features as JSON lines:
 *     {"name": {"kind": "bytes"|"float"|"int64"|"none", "values": [...]}}
 *     (bytes values as hex strings, floats with 9 significant digits). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

static int encode(const char *path) {
  FILE *f = fopen(path, "wb");
  if (!f) return 1;
  for (int i = 0; i < 3; i++) {
    uint8_t image[5];
    for (int k = 0; k < 5; k++) image[k] = (uint8_t)(i * 40 + k * 50);
    const float floats[3] = {(float)i + 0.5f, -1.25f, 3e10f};
    const int64_t ints[3] = {i, -7, (int64_t)1 << 40}, label = i;
    kn_feature_value v[] = {
        {.name = "image/encoded", .kind = KN_FEATURE_BYTES, .bytes = image, .count = 5},
        {.name = "floats", .kind = KN_FEATURE_FLOAT, .floats = floats, .count = 3},
        {.name = "ints", .kind = KN_FEATURE_INT64, .ints = ints, .count = 3},
        {.name = "label", .kind = KN_FEATURE_INT64, .ints = &label, .count = 1},
    };
    uint8_t *rec, head[12], tail[4];
    size_t len;
    if (kn_example_encode(v, 4, &rec, &len) != KN_OK) return 1;
    kn_tfrecord_frame(rec, len, head, tail);
    int ok =
        fwrite(head, 1, 12, f) == 12 && fwrite(rec, 1, len, f) == len && fwrite(tail, 1, 4, f) == 4;
    free(rec);
    if (!ok) return 1;
  }
  return fclose(f) != 0;
}

static void print_feature(const kn_example_entry *e) {
  static const char *const kinds[] = {"none", "bytes", "float", "int64"};
  printf("\"%.*s\": {\"kind\": \"%s\", \"values\": [", (int)e->name_len, (const char *)e->name,
         kinds[e->feature.kind]);
  const int64_t n = e->feature.kind ? kn_feature_count(&e->feature) : 0;
  for (int64_t i = 0; i < n; i++) {
    if (i) printf(", ");
    if (e->feature.kind == KN_FEATURE_BYTES) {
      const uint8_t *data;
      size_t len;
      kn_feature_bytes(&e->feature, (size_t)i, &data, &len);
      printf("\"");
      for (size_t k = 0; k < len; k++) printf("%02x", data[k]);
      printf("\"");
    } else if (e->feature.kind == KN_FEATURE_FLOAT) {
      float *v = malloc((size_t)n * sizeof *v);
      kn_feature_floats(&e->feature, v, (size_t)n);
      printf("%.9g", (double)v[i]);
      free(v);
    } else {
      int64_t *v = malloc((size_t)n * sizeof *v);
      kn_feature_int64s(&e->feature, v, (size_t)n);
      printf("%" PRId64, v[i]);
      free(v);
    }
  }
  printf("]}");
}

static int decode(const char *path) {
  kn_tfrecord *r;
  char err[512];
  if (kn_tfrecord_open(path, &r, err, sizeof err) != KN_OK) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  const uint8_t *data;
  size_t len;
  int rc;
  while ((rc = kn_tfrecord_next(r, &data, &len, err, sizeof err)) == 1) {
    kn_example_entry e[64];
    int n = kn_example_features(data, len, e, 64);
    if (n < 0 || n > 64) {
      fprintf(stderr, "%s: record %" PRId64 " is not an Example\n", path, kn_tfrecord_index(r));
      rc = -1;
      break;
    }
    printf("{");
    for (int i = 0; i < n; i++) {
      if (i) printf(", ");
      print_feature(&e[i]);
    }
    printf("}\n");
  }
  if (rc < 0) fprintf(stderr, "%s\n", err);
  kn_tfrecord_close(r);
  return rc < 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "encode") == 0) return encode(argv[2]);
  if (argc == 3 && strcmp(argv[1], "decode") == 0) return decode(argv[2]);
  fprintf(stderr, "usage: example_tool encode OUT | decode IN\n");
  return 2;
}
