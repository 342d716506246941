/* test_onnx.c — ONNX export of models of every layer kind: each is trained
 * a few steps, exported, checked by onnx.checker (Debian's python3-onnx)
 * and run by ONNX Runtime (onnxruntime-web under node, tests/onnx/run.js)
 * on 64 test images, whose outputs must be allclose (1e-5) to kiln's own
 * inference (kn_model_predict). Skips, saying why, where node, the npm
 * package or python3-onnx is missing (scripts/install-deps.sh installs
 * them). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine.h"
#include "layer_kinds.h"

#define N_TEST  64
#define N_TRAIN 96

/* A rank-3 input (B, 6, 5): batch norm over the last axis of a 3-D and a
 * 2-D value, dropout, a sigmoid output under binary cross-entropy. */
static const kn_layer_config sequence_layers[] = {
    {.type = KN_LAYER_BATCH_NORM, .name = "bn_seq", .momentum = 0.5f, .epsilon = 0.01f},
    {.type = KN_LAYER_ACTIVATION, .name = "act", .activation = KN_ACT_LEAKY_RELU, .alpha = 0.1f},
    {.type = KN_LAYER_FLATTEN, .name = "flat"},
    {.type = KN_LAYER_DENSE, .name = "hidden", .units = 8, .use_bias = 1},
    {.type = KN_LAYER_BATCH_NORM, .name = "bn_flat", .momentum = 0.5f},
    {.type = KN_LAYER_DROPOUT, .name = "drop", .rate = 0.5f},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .activation = KN_ACT_SIGMOID},
};

/* Strides, dilation and same padding whose odd cell falls at the end;
 * pools with padding cells (left out of the average); a concatenation
 * along the height; a convolution without bias. */
static const kn_layer_config windows_layers[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "strided",
     .filters = 3,
     .kernel_size = {3, 2},
     .strides = {2, 1},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_TANH},
    {.type = KN_LAYER_CONV2D,
     .name = "dilated",
     .filters = 3,
     .kernel_size = {2, 2},
     .dilation_rate = {2, 2},
     .padding = KN_PAD_SAME},
    {.type = KN_LAYER_CONCATENATE, .name = "stack", .n_inputs = 2, .inputs = {0, 1}, .axis = 1},
    {.type = KN_LAYER_MAX_POOL2D,
     .name = "max3",
     .pool_size = {3, 3},
     .strides = {2, 2},
     .padding = KN_PAD_SAME},
    {.type = KN_LAYER_AVG_POOL2D,
     .name = "avg3",
     .pool_size = {3, 3},
     .strides = {2, 2},
     .padding = KN_PAD_SAME},
    {.type = KN_LAYER_SEPARABLE_CONV2D,
     .name = "sep",
     .filters = 2,
     .kernel_size = {2, 2},
     .depth_multiplier = 2,
     .padding = KN_PAD_SAME,
     .activation = KN_ACT_SOFTMAX},
    {.type = KN_LAYER_FLATTEN, .name = "flat"},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 2, .use_bias = 1},
};

typedef struct case_model {
  const char *name;
  const kn_layer_config *layers;
  int n_layers;
  int input_ndim;
  int input_shape[3];
  kn_loss loss;
} case_model;

static char onnx_dir[] = "/tmp/kiln-test-onnx-XXXXXX";

/* The reason the tools are missing, or NULL when all are there. */
static const char *missing_tools(void) {
  static char why[512];
  char module[1024];
  snprintf(module, sizeof module, "%s/node_modules/onnxruntime-web/package.json", ONNX_RUNNER_DIR);
  if (system("node --version > /dev/null 2>&1") != 0)
    return "node is not installed (scripts/install-deps.sh installs nodejs)";
  if (access(module, R_OK) != 0) {
    snprintf(why, sizeof why,
             "onnxruntime-web is not installed in %s (scripts/install-deps.sh runs npm ci there)",
             ONNX_RUNNER_DIR);
    return why;
  }
  if (system("/usr/bin/python3 -c 'import onnx' > /dev/null 2>&1") != 0)
    return "Debian's python3-onnx is not installed (scripts/install-deps.sh installs it)";
  return NULL;
}

static void write_floats(const char *path, const float *v, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(v, sizeof *v, n, f), n);
  assert_int_equal(fclose(f), 0);
}

/* Trains m a few steps on random data, so every weight and the batch norm
 * statistics move away from their initial values. */
static void train_a_few_steps(kn_model *m, const case_model *c, size_t example) {
  kn_dataset ds = {.n = N_TRAIN, .ndim = c->input_ndim, .example_size = example};
  memcpy(ds.shape, c->input_shape, sizeof c->input_shape);
  float *x = malloc(N_TRAIN * example * sizeof *x);
  int32_t *y = malloc(N_TRAIN * sizeof *y);
  assert_true(x && y);
  kn_rng rng;
  kn_rng_seed(&rng, 7);
  for (size_t i = 0; i < N_TRAIN * example; i++) x[i] = 2.0f * kn_rng_uniform(&rng) - 0.5f;
  for (int i = 0; i < N_TRAIN; i++) y[i] = (int32_t)kn_rng_below(&rng, (uint64_t)m->n_outputs);
  ds.x = x;
  ds.y = y;
  ds.n_classes = m->n_outputs;
  kn_train_config tc = {.epochs = 2,
                        .batch_size = 16,
                        .seed = 3,
                        .log_every_steps = 100,
                        .optimizer = {.type = KN_OPT_ADAM,
                                      .learning_rate = 0.01f,
                                      .beta1 = 0.9f,
                                      .beta2 = 0.999f,
                                      .epsilon = 1e-7f}};
  char err[512] = "";
  int rc = kn_train(m, &ds, NULL, &tc, NULL, NULL, err, sizeof err);
  if (rc) fail_msg("%s: training failed: %s", c->name, err);
  free(x);
  free(y);
}

static void exports_and_matches(const case_model *c) {
  const char *why = missing_tools();
  if (why) {
    printf("SKIPPED %s: %s\n", c->name, why);
    skip();
  }
  /* Batch norm's statistics move fast, so a few steps take them far from
   * (0, 1) and the export must carry them. */
  kn_layer_config layers[32];
  memcpy(layers, c->layers, (size_t)c->n_layers * sizeof *layers);
  for (int i = 0; i < c->n_layers; i++)
    if (layers[i].type == KN_LAYER_BATCH_NORM && layers[i].momentum == 0.0f)
      layers[i].momentum = 0.5f;
  kn_model_config cfg = {.input_ndim = c->input_ndim,
                         .n_layers = c->n_layers,
                         .layers = layers,
                         .batch_size = 16,
                         .seed = 11,
                         .loss = c->loss};
  memcpy(cfg.input_shape, c->input_shape, sizeof c->input_shape);
  kn_model m;
  char err[512] = "";
  assert_int_equal(kn_model_build(&cfg, &m, err, sizeof err), KN_OK);
  assert_int_equal(kn_model_compile(&m, &cfg, 5, NULL, err, sizeof err), KN_OK);
  train_a_few_steps(&m, c, m.example_size);

  float *x = malloc(N_TEST * m.example_size * sizeof *x);
  float *want = malloc(N_TEST * (size_t)m.n_outputs * sizeof *want);
  float *got = calloc(N_TEST * (size_t)m.n_outputs, sizeof *got);
  assert_true(x && want && got);
  kn_rng rng;
  kn_rng_seed(&rng, 99);
  for (size_t i = 0; i < N_TEST * m.example_size; i++) x[i] = 3.0f * kn_rng_uniform(&rng) - 1.0f;
  assert_int_equal(kn_model_predict(&m, x, N_TEST, want, err, sizeof err), KN_OK);

  char model_path[256], in_path[256], out_path[256], cmd[2048], dims[64];
  snprintf(model_path, sizeof model_path, "%s/%s.onnx", onnx_dir, c->name);
  snprintf(in_path, sizeof in_path, "%s/%s.in.f32", onnx_dir, c->name);
  snprintf(out_path, sizeof out_path, "%s/%s.out.f32", onnx_dir, c->name);
  int rc = kn_onnx_export(&m, &cfg, c->name, model_path, err, sizeof err);
  if (rc) fail_msg("%s: export failed: %s", c->name, err);
  write_floats(in_path, x, N_TEST * m.example_size);

  snprintf(cmd, sizeof cmd,
           "/usr/bin/python3 -c 'import onnx, sys; "
           "onnx.checker.check_model(onnx.load(sys.argv[1]), full_check=True)' %s",
           model_path);
  assert_int_equal(system(cmd), 0);

  int used = snprintf(dims, sizeof dims, "%d", N_TEST);
  for (int d = 0; d < c->input_ndim; d++)
    used += snprintf(dims + used, sizeof dims - (size_t)used, ",%d", c->input_shape[d]);
  snprintf(cmd, sizeof cmd, "node %s/run.js %s %s %s %s", ONNX_RUNNER_DIR, model_path, in_path,
           dims, out_path);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char line[512] = "";
  char *read = fgets(line, sizeof line, p);
  assert_int_equal(pclose(p), 0);
  assert_non_null(read);
  /* The input is "input" and the output the last layer's tensor. */
  char expect[256];
  snprintf(expect, sizeof expect, "{\"input\":\"input\",\"output\":\"%s\",\"dims\":[%d,%d]}",
           layers[c->n_layers - 1].name, N_TEST, m.n_outputs);
  line[strcspn(line, "\n")] = '\0';
  assert_string_equal(line, expect);
  FILE *f = fopen(out_path, "rb");
  assert_non_null(f);
  assert_int_equal(fread(got, sizeof *got, N_TEST * (size_t)m.n_outputs, f),
                   N_TEST * (size_t)m.n_outputs);
  fclose(f);
  double worst = 0.0;
  int bad = 0;
  for (size_t i = 0; i < N_TEST * (size_t)m.n_outputs; i++) {
    double diff = got[i] > want[i] ? got[i] - want[i] : want[i] - got[i];
    double bound = 1e-5 + 1e-5 * (want[i] < 0 ? -want[i] : want[i]); /* numpy's allclose */
    if (diff > worst) worst = diff;
    if (!(diff <= bound)) {
      if (bad++ < 3) printf("%s: output %zu: onnx %.9g, kiln %.9g\n", c->name, i, got[i], want[i]);
    }
  }
  printf("%s: %d outputs, largest difference %.3g\n", c->name, N_TEST * m.n_outputs, worst);
  assert_int_equal(bad, 0);
  if (m.output_activation == KN_ACT_SOFTMAX) { /* the softmax is kept: rows sum to 1 */
    for (int r = 0; r < N_TEST; r++) {
      double sum = 0.0;
      for (int k = 0; k < m.n_outputs; k++) sum += got[r * m.n_outputs + k];
      assert_true(sum > 1.0 - 1e-5 && sum < 1.0 + 1e-5);
    }
  }
  free(x);
  free(want);
  free(got);
  kn_model_free(&m);
}

static void branches_model_exports(void **state) {
  (void)state;
  case_model c = {
      kn_test_models[0].name, kn_test_models[0].layers, kn_test_models[0].n_layers, 3, {8, 8, 3},
      KN_LOSS_SPARSE_XENT};
  exports_and_matches(&c);
}

static void pooled_model_exports(void **state) {
  (void)state;
  case_model c = {kn_test_models[1].name,
                  kn_test_models[1].layers,
                  kn_test_models[1].n_layers,
                  3,
                  {8, 8, 3},
                  KN_LOSS_XENT};
  exports_and_matches(&c);
}

static void flatten_last_model_exports(void **state) {
  (void)state;
  case_model c = {
      kn_test_models[2].name, kn_test_models[2].layers, kn_test_models[2].n_layers, 3, {8, 8, 3},
      KN_LOSS_SPARSE_XENT};
  exports_and_matches(&c);
}

static void sequence_model_exports(void **state) {
  (void)state;
  case_model c = {
      "sequence", sequence_layers, (int)(sizeof sequence_layers / sizeof *sequence_layers),
      2,          {6, 5},          KN_LOSS_BCE};
  exports_and_matches(&c);
}

static void strided_windows_export(void **state) {
  (void)state;
  case_model c = {"windows", windows_layers, (int)(sizeof windows_layers / sizeof *windows_layers),
                  3,         {9, 7, 2},      KN_LOSS_SPARSE_XENT};
  exports_and_matches(&c);
}

/* The sequence model at batch 4. */
static kn_model_config sequence_config(uint64_t seed) {
  return (kn_model_config){.input_ndim = 2,
                           .input_shape = {6, 5},
                           .n_layers = (int)(sizeof sequence_layers / sizeof *sequence_layers),
                           .layers = sequence_layers,
                           .batch_size = 4,
                           .seed = seed,
                           .loss = KN_LOSS_BCE};
}

/* A model must be compiled before export; an error says so. */
static void an_uncompiled_model_is_refused(void **state) {
  (void)state;
  kn_model_config cfg = sequence_config(0);
  kn_model m;
  char err[256] = "";
  assert_int_equal(kn_model_build(&cfg, &m, err, sizeof err), KN_OK);
  uint8_t *bytes = NULL;
  size_t len = 0;
  assert_int_equal(kn_onnx_encode(&m, &cfg, NULL, &bytes, &len, err, sizeof err), KN_ESTATE);
  assert_null(bytes);
  assert_non_null(strstr(err, "compile"));
  kn_model_free(&m);
}

/* A model exported to a pipe (kiln-train --export-onnx /dev/stdout | ...)
 * or through a link is written into it, byte for byte what a file gets:
 * neither is replaced by a file renamed over it (as root, /dev/stdout
 * itself would be). */
static void an_export_to_a_pipe_streams_into_it(void **state) {
  (void)state;
  kn_model_config cfg = sequence_config(3);
  kn_model m;
  char err[512] = "";
  assert_int_equal(kn_model_build(&cfg, &m, err, sizeof err), KN_OK);
  assert_int_equal(kn_model_compile(&m, &cfg, 1, NULL, err, sizeof err), KN_OK);
  char file[256], fifo[256], got[256];
  snprintf(file, sizeof file, "%s/model.onnx", onnx_dir);
  snprintf(fifo, sizeof fifo, "%s/pipe.onnx", onnx_dir);
  snprintf(got, sizeof got, "%s/from-pipe.onnx", onnx_dir);
  assert_int_equal(kn_onnx_export(&m, &cfg, "piped", file, err, sizeof err), KN_OK);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  /* The reader: everything the pipe carries, into a file. */
  pid_t reader = fork();
  assert_true(reader >= 0);
  if (reader == 0) {
    FILE *in = fopen(fifo, "rb"), *out = fopen(got, "wb");
    char buf[4096];
    size_t n;
    while (in && out && (n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
    _exit(in && out && fclose(out) == 0 ? 0 : 1);
  }
  const int rc = kn_onnx_export(&m, &cfg, "piped", fifo, err, sizeof err);
  struct stat st;
  const int still_a_pipe = stat(fifo, &st) == 0 && S_ISFIFO(st.st_mode);
  if (rc != KN_OK || !still_a_pipe) {
    kill(reader, SIGKILL); /* its open of the pipe waits for a writer that never came */
    waitpid(reader, NULL, 0);
    fail_msg("export to a pipe: rc %d (%s), still a pipe: %d", rc, err, still_a_pipe);
  }
  int status = 0;
  assert_int_equal(waitpid(reader, &status, 0), reader);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  char cmp[600];
  snprintf(cmp, sizeof cmp, "cmp -s %s %s", file, got);
  assert_int_equal(system(cmp), 0);
  /* A link (as /dev/stdout is, to a file the shell opened) stays a link,
   * and what it points to gets the model, whatever it held before. */
  char target[256], link[256];
  snprintf(target, sizeof target, "%s/target.onnx", onnx_dir);
  snprintf(link, sizeof link, "%s/link.onnx", onnx_dir);
  FILE *t = fopen(target, "w");
  assert_non_null(t);
  for (int i = 0; i < 100000; i++) fputc('x', t); /* longer than the model */
  fclose(t);
  assert_int_equal(symlink(target, link), 0);
  assert_int_equal(kn_onnx_export(&m, &cfg, "piped", link, err, sizeof err), KN_OK);
  assert_int_equal(lstat(link, &st), 0);
  assert_true(S_ISLNK(st.st_mode));
  snprintf(cmp, sizeof cmp, "cmp -s %s %s", file, target);
  assert_int_equal(system(cmp), 0);
  kn_model_free(&m);
}

static int make_dir(void **state) {
  (void)state;
  return mkdtemp(onnx_dir) ? 0 : -1;
}

static int remove_dir(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", onnx_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(branches_model_exports),
      cmocka_unit_test(pooled_model_exports),
      cmocka_unit_test(flatten_last_model_exports),
      cmocka_unit_test(sequence_model_exports),
      cmocka_unit_test(strided_windows_export),
      cmocka_unit_test(an_uncompiled_model_is_refused),
      cmocka_unit_test(an_export_to_a_pipe_streams_into_it),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
