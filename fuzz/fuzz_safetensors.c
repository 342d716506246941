/* fuzz_safetensors.c — the checkpoint loader (kn_checkpoint_read) into a
 * small compiled model (dense, batch norm, dense): any file loads or is
 * refused with a reason, and a refused file leaves the parameters as
 * they were. With KILN_FUZZ_WRITE_SEED=FILE set, first writes a valid
 * checkpoint of that model there (a seed for the corpus). */
#include "fuzz.h"

#include <string.h>

#include "engine.h"

static kn_model model;
static float *before;
static size_t n_floats;
static fuzz_file file;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const kn_layer_config layers[3] = {
      {.type = KN_LAYER_DENSE, .name = "hidden", .units = 3, .use_bias = 1},
      {.type = KN_LAYER_BATCH_NORM, .name = "bn", .momentum = 0.9f, .epsilon = 1e-3f},
      {.type = KN_LAYER_DENSE, .name = "out", .units = 2, .use_bias = 1}};
  kn_model_config cfg = {.input_ndim = 1,
                         .input_shape = {4},
                         .n_layers = 3,
                         .layers = layers,
                         .batch_size = 2,
                         .seed = 1};
  char err[256];
  if (kn_model_build(&cfg, &model, err, sizeof err) != KN_OK ||
      kn_graph_compile(model.graph, 7, NULL, err, sizeof err) != KN_OK) {
    fprintf(stderr, "fuzz_safetensors: %s\n", err);
    abort();
  }
  const char *seed = getenv("KILN_FUZZ_WRITE_SEED");
  if (seed) {
    const char *keys[] = {"step"}, *values[] = {"3"};
    kn_checkpoint_info info;
    if (kn_checkpoint_write(model.graph, seed, 1, keys, values, &info, err, sizeof err) != KN_OK) {
      fprintf(stderr, "fuzz_safetensors: %s\n", err);
      abort();
    }
  }
  n_floats = kn_param_count(model.graph);
  before = malloc(n_floats * sizeof *before);
  if (!before) abort();
  return 0;
}

static void snapshot(float *out) {
  memcpy(out, kn_params(model.graph), n_floats * sizeof *out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_file_set(&file, "ckpt", data, size);
  snapshot(before);
  kn_checkpoint_meta meta;
  char err[512] = "";
  const int rc = kn_checkpoint_read(model.graph, file.path, &meta, err, sizeof err);
  FUZZ_CHECK(rc != KN_ENOMEM, "%zu input bytes ran the loader out of memory: %s", size, err);
  if (rc != KN_OK) {
    FUZZ_CHECK(err[0], "a refused checkpoint says why");
    float *after = malloc(n_floats * sizeof *after);
    if (!after) abort();
    snapshot(after);
    FUZZ_CHECK(memcmp(before, after, n_floats * sizeof *after) == 0,
               "a refused checkpoint changed the weights: %s", err);
    free(after);
  } else {
    FUZZ_CHECK(meta.n >= 0 && meta.n <= KN_CHECKPOINT_MAX_META, "%d metadata pairs", meta.n);
  }
  return 0;
}
