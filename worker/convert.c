/* convert.c — kiln-train --to-tfrecord: an IDX images + labels pair (e.g.
 * Fashion-MNIST) written as TFRecord shards of tf.train.Example records
 * ("image/encoded": the raw pixel bytes, "image/class/label": an int64),
 * in the IDX order, consecutive examples per shard. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "worker.h"

int worker_idx_to_tfrecord(const char *images, const char *labels, const char *out_prefix,
                           int n_shards, int gzip, char *err, size_t errlen) {
  if (n_shards < 1 || n_shards > 100000) {
    snprintf(err, errlen, "shards must be 1..100000, got %d", n_shards);
    return -1;
  }
  kn_dataset ds;
  if (kn_dataset_load_idx(images, labels, KN_IDX_BYTES, &ds, err, errlen) != 0) return -1;
  int rc = 0;
  for (int s = 0; s < n_shards && !rc; s++) {
    char path[4096];
    snprintf(path, sizeof path, "%s-%05d-of-%05d.tfrecord%s", out_prefix, s, n_shards,
             gzip ? ".gz" : "");
    gzFile f = gzopen(path, gzip ? "wb6" : "wbT"); /* T: written as is */
    if (!f) {
      snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
      rc = -1;
      break;
    }
    const int64_t first = ds.n * s / n_shards, end = ds.n * (s + 1) / n_shards;
    for (int64_t i = first; i < end && !rc; i++) {
      const int64_t label = ds.y[i];
      kn_feature_value v[] = {
          {.name = "image/encoded",
           .kind = KN_FEATURE_BYTES,
           .bytes = ds.x8 + (size_t)i * ds.example_size,
           .count = ds.example_size},
          {.name = "image/class/label", .kind = KN_FEATURE_INT64, .ints = &label, .count = 1},
      };
      uint8_t *rec, head[12], tail[4];
      size_t len;
      if (kn_example_encode(v, 2, &rec, &len) != KN_OK) {
        snprintf(err, errlen, "out of memory encoding example %lld", (long long)i);
        rc = -1;
        break;
      }
      kn_tfrecord_frame(rec, len, head, tail);
      if (gzwrite(f, head, 12) != 12 || gzwrite(f, rec, (unsigned)len) != (int)len ||
          gzwrite(f, tail, 4) != 4) {
        snprintf(err, errlen, "cannot write %s", path);
        rc = -1;
      }
      free(rec);
    }
    if (gzclose(f) != Z_OK && !rc) {
      snprintf(err, errlen, "cannot write %s", path);
      rc = -1;
    }
  }
  kn_dataset_free(&ds);
  return rc;
}
