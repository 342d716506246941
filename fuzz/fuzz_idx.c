/* fuzz_idx.c — the IDX reader (kn_dataset_load_idx), raw or gzip'd: the
 * input is an images file and a labels file, split where its first two
 * bytes say. A load that succeeds has as many labels as examples and
 * every label below n_classes. */
#include "fuzz.h"

#include "engine.h"

static fuzz_file images, labels;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  size_t split = ((size_t)data[0] << 8 | data[1]) % (size - 1);
  data += 2;
  size -= 2;
  fuzz_file_set(&images, "images", data, split);
  fuzz_file_set(&labels, "labels", data + split, size - split);
  kn_dataset ds;
  char err[512];
  const unsigned flags = split % 2 ? KN_IDX_BYTES : KN_IDX_NORMALIZE;
  const int rc = kn_dataset_load_idx(images.path, labels.path, flags, &ds, err, sizeof err);
  FUZZ_CHECK(rc != KN_ENOMEM, "%zu input bytes ran the reader out of memory: %s", size, err);
  if (rc == KN_OK) {
    FUZZ_CHECK(ds.n >= 1 && ds.example_size >= 1, "%lld examples of %zu values", (long long)ds.n,
               ds.example_size);
    for (int64_t i = 0; i < ds.n; i++)
      FUZZ_CHECK(ds.y[i] >= 0 && ds.y[i] < ds.n_classes, "label %d of %d classes", ds.y[i],
                 ds.n_classes);
    kn_dataset_free(&ds);
  } else {
    FUZZ_CHECK(err[0], "a refused file says why");
  }
  return 0;
}
