/* fuzz_csv.c — the CSV reader (kn_dataset_load_csv) with label column
 * "label": a table or a refusal naming the problem; a table has labels
 * below n_classes and finite features. */
#include "fuzz.h"

#include <math.h>

#include "engine.h"

static fuzz_file csv;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_file_set(&csv, "csv", data, size);
  kn_dataset ds;
  char err[512];
  const int rc = kn_dataset_load_csv(csv.path, "label", &ds, err, sizeof err);
  FUZZ_CHECK(rc != KN_ENOMEM, "%zu input bytes ran the reader out of memory: %s", size, err);
  if (rc == KN_OK) {
    for (int64_t i = 0; i < ds.n; i++)
      FUZZ_CHECK(ds.y[i] >= 0 && ds.y[i] < ds.n_classes, "label %d of %d classes", ds.y[i],
                 ds.n_classes);
    kn_dataset_free(&ds);
  } else {
    FUZZ_CHECK(err[0], "a refused file says why");
  }
  return 0;
}
