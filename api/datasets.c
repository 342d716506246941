/* datasets.c — the data sets built into kiln: their names and the files
 * each split is read from, relative to the datasets directory. */
#include <string.h>

#include "api.h"

static const api_builtin_dataset builtins[] = {
    {.name = "fashion-mnist",
     .dir = "fashion-mnist",
     .train_images = "train-images-idx3-ubyte.gz",
     .train_labels = "train-labels-idx1-ubyte.gz",
     .test_images = "t10k-images-idx3-ubyte.gz",
     .test_labels = "t10k-labels-idx1-ubyte.gz",
     .train_examples = 60000,
     .test_examples = 10000,
     .input_shape = {28, 28, 1},
     .input_ndim = 3,
     .n_classes = 10},
};

int api_builtin_dataset_count(void) {
  return (int)(sizeof builtins / sizeof builtins[0]);
}

const api_builtin_dataset *api_builtin_dataset_at(int i) {
  return (i >= 0 && i < api_builtin_dataset_count()) ? &builtins[i] : NULL;
}

const api_builtin_dataset *api_builtin_dataset_find(const char *name) {
  for (int i = 0; i < api_builtin_dataset_count(); i++) {
    if (strcmp(builtins[i].name, name) == 0) return &builtins[i];
  }
  return NULL;
}
