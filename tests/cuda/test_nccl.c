/* test_nccl.c — GPU replicas: soft placement puts every op the CUDA
 * backend has a kernel for on the model's GPU and leaves the rest on the
 * host; NCCL communicators sum host floats over their ranks and never
 * hang on a rank that does not come; mirrored replicas on two GPUs end
 * 20 steps with the weights one GPU reaches at twice the batch, and so
 * does weighted_mean on an uneven last batch that leaves a replica no
 * rows; a replica that never joins fails the job in time.
 * Tests that need a GPU (or two) skip with a message where there are
 * fewer; the placement and refusal tests run everywhere. ctest runs it
 * twice: on this machine's CUDA module (test_nccl), and on the host
 * stand-in module (test_nccl_host_gpus, host_gpus.c), whose two devices
 * let the GPU paths of the engine run where there is no GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda.h"
#include "engine.h"
#include "graph_internal.h"
#include "teacher.h"

#define INPUTS  TEACHER_INPUTS
#define OUTPUTS TEACHER_OUTPUTS

static int device_count; /* set once in main() */
static int host_standin; /* the devices are host_gpus.c's */

static void require_devices(int n) {
  if (device_count < n) {
    print_message("SKIPPED: needs %d CUDA device%s, this machine has %d\n", n, n == 1 ? "" : "s",
                  device_count);
    skip();
  }
}

static const kn_layer_config layers[] = {
    {.type = KN_LAYER_DENSE, .units = 32, .use_bias = 1, .activation = KN_ACT_RELU},
    {.type = KN_LAYER_DENSE, .units = OUTPUTS, .use_bias = 1}};

static int build(kn_model *m, int batch, kn_device device, kn_precision precision, char *err,
                 size_t errlen) {
  kn_model_config mc = {.input_ndim = 1,
                        .input_shape = {INPUTS},
                        .n_layers = 2,
                        .layers = layers,
                        .batch_size = batch,
                        .precision = precision,
                        .device = device};
  return kn_model_build(&mc, m, err, errlen);
}

static void soft_placement_puts_the_gpu_kernels_on_the_gpu(void **state) {
  (void)state;
  const kn_device gpu1 = {KN_DEVICE_CUDA, 1};
  kn_model m;
  char err[512] = "";
  assert_int_equal(build(&m, 16, gpu1, KN_PRECISION_FLOAT32, err, sizeof err), KN_OK);
  const kn_graph *g = m.graph;
  int on_gpu = 0, kinds = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const kn_node_rec *n = &g->nodes[i];
    const int kernel = kn_op_def_of(n->op)->cuda != NULL;
    const kn_device d = kn_node_device(g, i);
    if (kernel) {
      if (d.kind != KN_DEVICE_CUDA || d.index != 1) fail_msg("%s stayed on the host", n->name);
      on_gpu++;
      kinds |= n->op == KN_OP_MATMUL              ? 1
               : n->op == KN_OP_RELU              ? 2
               : n->op == KN_OP_RELU_GRAD         ? 4
               : n->op == KN_OP_BIAS_ADD          ? 8
               : n->op == KN_OP_REDUCE_ROWS       ? 16
               : n->op == KN_OP_SOFTMAX_XENT      ? 32
               : n->op == KN_OP_SOFTMAX_XENT_GRAD ? 64
                                                  : 0;
    } else if (d.kind != KN_DEVICE_CPU) {
      fail_msg("%s (%s) has no CUDA kernel, and was placed on a GPU", n->name, kn_op_name(n->op));
    }
  }
  /* two forward matmuls, their input and weight gradients (the first
   * layer's input gradient is not needed), the relu and its gradient, the
   * two bias adds and the biases' gradients, the loss and its gradient
   * (every op of the model has a CUDA kernel) */
  print_message("%d nodes on cuda:1\n", on_gpu);
  assert_int_equal(kinds, 127);
  assert_true(on_gpu >= 13);
  assert_int_equal(kn_graph_gpu(g), 1);
  /* Compile checks the device is here. */
  if (device_count < 2) {
    assert_int_not_equal(kn_graph_compile(m.graph, 1, NULL, err, sizeof err), KN_OK);
    print_message("refused here: %s\n", err);
    assert_non_null(strstr(err, "is placed on cuda:1"));
  }
  kn_model_free(&m);
  /* A host model has no GPU. */
  assert_int_equal(
      build(&m, 16, (kn_device){KN_DEVICE_CPU, 0}, KN_PRECISION_FLOAT32, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_gpu(m.graph), -1);
  kn_model_free(&m);
}

static void a_gpu_model_in_mixed_float16_is_built(void **state) {
  (void)state;
  kn_model m;
  char err[512] = "";
  assert_int_equal(
      build(&m, 16, (kn_device){KN_DEVICE_CUDA, 0}, KN_PRECISION_MIXED_FLOAT16, err, sizeof err),
      KN_OK);
  assert_int_equal(kn_graph_gpu(m.graph), 0); /* its casts and GEMMs have CUDA kernels */
  kn_model_free(&m);
}

static void a_communicator_needs_its_device(void **state) {
  (void)state;
  unsigned char id[KN_NCCL_ID_BYTES] = {0};
  kn_nccl *c = (kn_nccl *)1;
  char err[512] = "";
  assert_int_equal(kn_nccl_open(id, 1, 0, device_count, 16, 5.0, &c, err, sizeof err), -1);
  assert_null(c);
  print_message("refused: %s\n", err);
  assert_true(strstr(err, "this machine has") != NULL || strstr(err, "without CUDA") != NULL ||
              strstr(err, "could not be loaded") != NULL);
  kn_nccl_close(NULL); /* a no-op */
}

static void one_rank_sums_to_itself(void **state) {
  (void)state;
  require_devices(1);
  unsigned char id[KN_NCCL_ID_BYTES];
  char err[512] = "";
  kn_nccl *c = NULL;
  if (kn_nccl_unique_id(id, err, sizeof err) ||
      kn_nccl_open(id, 1, 0, 0, 1000, 30.0, &c, err, sizeof err))
    fail_msg("%s", err);
  float a[300], b[700], want_a[300], want_b[700];
  for (int i = 0; i < 300; i++) want_a[i] = a[i] = (float)i * 0.5f - 7.0f;
  for (int i = 0; i < 700; i++) want_b[i] = b[i] = (float)(i % 13) - 6.0f;
  /* Two ranges in flight at once, staged side by side. */
  if (kn_nccl_start(c, a, 0, 300, err, sizeof err) ||
      kn_nccl_start(c, b, 300, 700, err, sizeof err))
    fail_msg("%s", err);
  memset(a, 0, sizeof a); /* read at start: the sum is written by wait */
  if (kn_nccl_wait(c, err, sizeof err)) fail_msg("%s", err);
  assert_memory_equal(a, want_a, sizeof a);
  assert_memory_equal(b, want_b, sizeof b);
  /* A range past the staging room is refused, by its floats. */
  assert_int_equal(kn_nccl_start(c, a, 900, 300, err, sizeof err), -1);
  assert_non_null(strstr(err, "[900, 1200) are past the 1000 staged"));
  kn_nccl_close(c);
}

static double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Rank 1 of 2 never joins: rank 0 gives up after its timeout, with the
 * reason, instead of hanging (as a rank that died would leave it). */
static void a_rank_that_never_comes_fails_the_others_in_time(void **state) {
  (void)state;
  require_devices(1);
  unsigned char id[KN_NCCL_ID_BYTES];
  char err[512] = "";
  kn_nccl *c = NULL;
  if (kn_nccl_unique_id(id, err, sizeof err)) fail_msg("%s", err);
  const double start = seconds_now();
  assert_int_equal(kn_nccl_open(id, 2, 0, 0, 100, 3.0, &c, err, sizeof err), -1);
  const double took = seconds_now() - start;
  print_message("gave up after %.1f s: %s\n", took, err);
  assert_null(c);
  assert_non_null(strstr(err, "died or hangs"));
  assert_true(took >= 2.5 && took < 30.0);
}

/* ------------------------------------------------- replicas on GPUs -- */

typedef struct run_config {
  int replicas, batch;
  const int *gpus; /* replica i on cuda:gpus[i] */
  kn_aggregation aggregation;
  int64_t examples;
  kn_optimizer_type optimizer;
  float learning_rate;
} run_config;

/* 20 Adam steps: 640 examples, 5 steps an epoch at a global batch of 128. */
static run_config adam_run(int replicas, int batch, const int *gpus) {
  return (run_config){replicas, batch, gpus, KN_AGGREGATE_MEAN, 640, KN_OPT_ADAM, 0.01f};
}

/* Trains run.replicas models at run.batch for 4 epochs; the weights (or
 * NULL with the error in err). */
static float *train(run_config run, size_t *n_params, char *err, size_t errlen) {
  const int replicas = run.replicas, batch = run.batch;
  const int *gpus = run.gpus;
  kn_model models[4];
  kn_model *others[4];
  int rc = KN_OK, built = 0;
  for (int i = 0; i < replicas && !rc; i++) {
    rc = build(&models[i], batch, (kn_device){KN_DEVICE_CUDA, gpus[i]}, KN_PRECISION_FLOAT32, err,
               errlen);
    if (!rc) built++;
    if (!rc) rc = kn_graph_compile(models[i].graph, 7, NULL, err, errlen);
    others[i] = &models[i + 1];
  }
  float *weights = NULL;
  kn_dataset ds = teacher_data(run.examples);
  kn_train_config tc = {.epochs = 4,
                        .batch_size = batch,
                        .shuffle = 1,
                        .seed = 11,
                        .log_every_steps = 5,
                        .optimizer = {.type = run.optimizer,
                                      .learning_rate = run.learning_rate,
                                      .beta1 = 0.9f,
                                      .beta2 = 0.999f,
                                      .epsilon = 1e-7f}};
  tc.dist = (kn_distribution){.n_replicas = replicas,
                              .replicas = others,
                              .aggregation = run.aggregation,
                              .timeout_s = host_standin ? 5.0 : 60.0};
  if (!rc) rc = kn_train(&models[0], &ds, NULL, &tc, NULL, NULL, err, errlen);
  if (!rc) {
    *n_params = kn_param_count(models[0].graph);
    weights = malloc(*n_params * sizeof(float));
    assert_non_null(weights);
    memcpy(weights, kn_params(models[0].graph), *n_params * sizeof(float));
    for (int i = 1; i < replicas; i++) /* every replica ends where replica 0 does */
      assert_memory_equal(kn_params(models[i].graph), weights, *n_params * sizeof(float));
  }
  for (int i = 0; i < built; i++) kn_model_free(&models[i]);
  kn_dataset_free(&ds);
  return weights;
}

/* The largest difference relative to the weight's size (floored at 1e-2,
 * so weights near zero are compared absolutely). */
static double worst_relative(const float *a, const float *b, size_t n) {
  double worst = 0.0;
  for (size_t i = 0; i < n; i++) {
    const double scale = fabs(b[i]) > 1e-2 ? fabs(b[i]) : 1e-2;
    const double d = fabs((double)a[i] - b[i]) / scale;
    if (d > worst) worst = d;
  }
  return worst;
}

/* Two replicas (run) against one at twice their batch on cuda:0, within
 * 1e-5; a different run (one at their batch) is far away. */
static void two_gpus_match_one(run_config run, const char *what) {
  char err[512] = "";
  size_t n = 0, n2 = 0;
  run_config one = run;
  one.replicas = 1;
  one.batch = 2 * run.batch;
  float *single = train(one, &n, err, sizeof err);
  if (!single) fail_msg("one GPU: %s", err);
  float *mirrored = train(run, &n2, err, sizeof err);
  if (!mirrored) fail_msg("two GPUs: %s", err);
  assert_int_equal(n, n2);
  const double worst = worst_relative(mirrored, single, n);
  one.batch = run.batch;
  float *other = train(one, &n2, err, sizeof err);
  if (!other) fail_msg("one GPU at %d: %s", run.batch, err);
  const double moved = worst_relative(other, single, n);
  print_message("%s on cuda:0-1 at %d vs cuda:0 at %d: worst relative %.3g (a different run: "
                "%.3g)\n",
                what, run.batch, 2 * run.batch, worst, moved);
  assert_true(worst <= 1e-5);
  assert_true(moved > 1e-2); /* the comparison can fail */
  free(single);
  free(mirrored);
  free(other);
}

static void mirrored_on_two_gpus_matches_one_gpu_at_twice_the_batch(void **state) {
  (void)state;
  require_devices(2);
  two_gpus_match_one(adam_run(2, 64, (int[]){0, 1}), "mirrored, 20 adam steps,");
}

/* 560 examples at a global batch of 128: the last batch has 48 rows, all
 * replica 0's; replica 1 runs nothing and sends zeros, weighted by 0. */
static void weighted_mean_on_an_uneven_last_batch_matches_one_gpu(void **state) {
  (void)state;
  require_devices(2);
  run_config run = {2, 64, (int[]){0, 1}, KN_AGGREGATE_WEIGHTED_MEAN, 560, KN_OPT_SGD, 0.5f};
  two_gpus_match_one(run, "weighted_mean, 20 sgd steps,");
}

/* A replica whose rank never joins (the stand-in's fault injection): the
 * other gives up after the collective timeout and the job fails, naming
 * why, instead of hanging. */
static void a_replica_that_never_joins_fails_the_job_in_time(void **state) {
  (void)state;
  require_devices(2);
  if (!host_standin) {
    print_message("SKIPPED: a rank that never joins is injected by the host stand-in only\n");
    skip();
  }
  setenv("KILN_HOST_GPUS_ABSENT_RANK", "1", 1);
  char err[512] = "";
  size_t n = 0;
  const double start = seconds_now();
  float *w = train(adam_run(2, 64, (int[]){0, 1}), &n, err, sizeof err);
  const double took = seconds_now() - start;
  unsetenv("KILN_HOST_GPUS_ABSENT_RANK");
  print_message("failed after %.1f s: %s\n", took, err);
  assert_null(w);
  assert_non_null(strstr(err, "replica 0: NCCL rank 0 of 2 on cuda:0: joining the communicator "
                              "waited more than 5 s"));
  assert_true(took >= 4.5 && took < 60.0);
}

/* NCCL takes a device per rank: two replicas on one GPU are refused by
 * name before any communicator is made. */
static void two_replicas_on_one_gpu_are_refused(void **state) {
  (void)state;
  require_devices(1);
  char err[512] = "";
  size_t n = 0;
  float *w = train(adam_run(2, 64, (int[]){0, 0}), &n, err, sizeof err);
  assert_null(w);
  print_message("refused: %s\n", err);
  assert_non_null(strstr(err, "replicas 0 and 1 are both on cuda:0"));
}

int main(void) {
  char err[512] = "";
  if (kn_cuda_device_count(&device_count, err, sizeof err) != 0) {
    printf("kn_cuda_device_count failed: %s\n", err);
    device_count = 0;
  }
  char name[64] = "";
  if (device_count > 0 && kn_cuda_device_name(0, name, sizeof name, err, sizeof err) == 0)
    host_standin = strstr(name, "host stand-in") != NULL;
  printf("%d CUDA device%s%s\n", device_count, device_count == 1 ? "" : "s",
         host_standin ? " (the host stand-in)" : "");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(soft_placement_puts_the_gpu_kernels_on_the_gpu),
      cmocka_unit_test(a_gpu_model_in_mixed_float16_is_built),
      cmocka_unit_test(a_communicator_needs_its_device),
      cmocka_unit_test(one_rank_sums_to_itself),
      cmocka_unit_test(a_rank_that_never_comes_fails_the_others_in_time),
      cmocka_unit_test(mirrored_on_two_gpus_matches_one_gpu_at_twice_the_batch),
      cmocka_unit_test(weighted_mean_on_an_uneven_last_batch_matches_one_gpu),
      cmocka_unit_test(a_replica_that_never_joins_fails_the_job_in_time),
      cmocka_unit_test(two_replicas_on_one_gpu_are_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
