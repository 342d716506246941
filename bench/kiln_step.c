/* kiln_step.c — the engine's training-step speed on the bench models, with
 * random data: ms per step, samples per second and achieved GFLOP/s over
 * STEPS steps after a warm-up, printed as one JSON line. bench/engine.py runs
 * it beside the same loop in PyTorch.
 *
 *   kiln-bench-step mlp|cnn THREADS STEPS [unoptimized|mixed_bfloat16]
 * (unoptimized: the same compiled graph with no passes and no buffer reuse) */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "engine.h"

enum { BATCH = 128 };

static const kn_layer_config mlp[] = {
    {.type = KN_LAYER_FLATTEN, .name = "flatten"},
    {.type = KN_LAYER_DENSE, .name = "d1", .units = 512, .use_bias = 1, .activation = KN_ACT_RELU},
    {.type = KN_LAYER_DENSE, .name = "d2", .units = 256, .use_bias = 1, .activation = KN_ACT_RELU},
    {.type = KN_LAYER_DENSE, .name = "d3", .units = 10, .use_bias = 1},
};

/* conv3x3 1->32 pad 1, relu, maxpool 2, conv3x3 32->64 pad 1, relu, maxpool 2,
 * dense 3136->128 relu, dense 10 */
static const kn_layer_config cnn[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "c1",
     .filters = 32,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_MAX_POOL2D, .name = "p1"},
    {.type = KN_LAYER_CONV2D,
     .name = "c2",
     .filters = 64,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_MAX_POOL2D, .name = "p2"},
    {.type = KN_LAYER_FLATTEN, .name = "f"},
    {.type = KN_LAYER_DENSE, .name = "d1", .units = 128, .use_bias = 1, .activation = KN_ACT_RELU},
    {.type = KN_LAYER_DENSE, .name = "d2", .units = 10, .use_bias = 1},
};

/* Multiply-adds of one training step, as 2 FLOPs each, the same count for
 * both frameworks: every layer's forward GEMM and its weight gradient, and
 * the input gradient of every layer but the first (nothing reads the input
 * image's gradient, so neither framework computes it). */
static double step_flops(int is_cnn) {
  double fwd, first;
  if (is_cnn) {
    first = 28.0 * 28 * 32 * 9 * 1;
    fwd = first + 14.0 * 14 * 64 * 9 * 32 + 3136.0 * 128 + 128.0 * 10;
  } else {
    first = 784.0 * 512;
    fwd = first + 512.0 * 256 + 256.0 * 10;
  }
  return 2.0 * (3.0 * fwd - first) * BATCH;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: kiln-bench-step mlp|cnn THREADS STEPS [unoptimized|mixed_bfloat16]\n");
    return 2;
  }
  int is_cnn = strcmp(argv[1], "cnn") == 0, threads = atoi(argv[2]), steps = atoi(argv[3]);
  int unoptimized = argc > 4 && strcmp(argv[4], "unoptimized") == 0;
  int bf16 = argc > 4 && strcmp(argv[4], "mixed_bfloat16") == 0;
  openblas_set_num_threads(threads);
  kn_model_config cfg = {.input_ndim = 3,
                         .input_shape = {28, 28, 1},
                         .n_layers = is_cnn ? 7 : 4,
                         .layers = is_cnn ? cnn : mlp,
                         .batch_size = BATCH,
                         .precision = bf16 ? KN_PRECISION_MIXED_BFLOAT16 : KN_PRECISION_FLOAT32};
  kn_model m;
  char err[512];
  kn_plan_stats st;
  if (kn_model_build(&cfg, &m, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  if (unoptimized) kn_graph_set_unoptimized(m.graph, 1);
  kn_graph_set_threads(m.graph, threads);
  kn_optimizer_config oc = {.type = KN_OPT_ADAM,
                            .learning_rate = 1e-3f,
                            .beta1 = 0.9f,
                            .beta2 = 0.999f,
                            .epsilon = 1e-7f};
  kn_optimizer *opt = NULL;
  if (kn_graph_compile(m.graph, 1, &st, err, sizeof err) ||
      kn_optimizer_new(&oc, kn_param_count(m.graph), &opt, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  kn_rng rng;
  kn_rng_seed(&rng, 1);
  float *x = kn_node_data(m.graph, m.x);
  int32_t *y = kn_node_data(m.graph, m.y);
  for (int i = 0; i < BATCH * 784; i++) x[i] = kn_rng_uniform(&rng);
  for (int i = 0; i < BATCH; i++) y[i] = (int32_t)kn_rng_below(&rng, 10);
  double t0 = 0;
  for (int s = -5; s < steps; s++) { /* 5 warm-up steps */
    if (s == 0) t0 = now();
    if (kn_graph_run(m.graph, KN_RUN_TRAIN, BATCH, err, sizeof err)) {
      fprintf(stderr, "%s\n", err);
      return 1;
    }
    kn_optimizer_step(opt, kn_params(m.graph), kn_grads(m.graph));
  }
  double secs = now() - t0;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("{\"framework\":\"kiln%s\",\"model\":\"%s\",\"threads\":%d,\"ms_per_step\":%.3f,"
         "\"samples_per_s\":%.1f,\"gflops\":%.2f,\"peak_rss_mib\":%.1f,\"arena_mib\":%.2f,"
         "\"one_buffer_per_node_mib\":%.2f}\n",
         unoptimized ? "-unoptimized"
         : bf16      ? "-mixed_bfloat16"
                     : "",
         argv[1], threads, secs / steps * 1e3, steps * BATCH / secs,
         step_flops(is_cnn) * steps / secs / 1e9, ru.ru_maxrss / 1024.0, st.arena_bytes / 1048576.0,
         st.naive_bytes / 1048576.0);
  kn_optimizer_free(opt);
  kn_model_free(&m);
  return 0;
}
