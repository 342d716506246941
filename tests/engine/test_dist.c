/* Data-parallel replicas in one process (the mirrored strategy): R
 * replicas at per-replica batch b end 20 steps with the weights one
 * replica reaches at batch R x b, weighted_mean keeps that true for an
 * uneven last batch (where mean does not), and sum is R x mean; dropout
 * masks are drawn by row of the global batch. And the
 * all-reduce buckets' plan that lets multi_worker overlap them with
 * backward. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dist/dist.h"
#include "engine.h"
#include "graph_internal.h"
#include "teacher.h"

#define INPUTS  TEACHER_INPUTS
#define OUTPUTS TEACHER_OUTPUTS

/* The replicas' model: its layers (every replica alike). */
typedef struct net {
  const kn_layer_config *layers;
  int n_layers;
} net;

static const kn_layer_config MLP[] = {
    {.type = KN_LAYER_DENSE, .units = 32, .use_bias = 1, .activation = KN_ACT_RELU},
    {.type = KN_LAYER_DENSE, .units = OUTPUTS, .use_bias = 1}};
static const net PLAIN = {MLP, 2};

static void build_net(kn_model *m, int batch, const net *arch) {
  kn_model_config mc = {.input_ndim = 1,
                        .input_shape = {INPUTS},
                        .n_layers = arch->n_layers,
                        .layers = arch->layers,
                        .batch_size = batch};
  char err[256];
  if (kn_model_build(&mc, m, err, sizeof err) ||
      kn_graph_compile(m->graph, 7, NULL, err, sizeof err))
    fail_msg("%s", err);
}

static void build(kn_model *m, int batch) {
  build_net(m, batch, &PLAIN);
}

typedef struct outcome {
  float *weights; /* (params) */
  size_t n;
  int64_t steps;
  double last_epoch_loss;
} outcome;

static int record_epoch(const kn_train_event *ev, void *user) {
  outcome *o = user;
  o->steps = ev->step;
  if (ev->kind == KN_EVENT_EPOCH) o->last_epoch_loss = ev->values[0];
  return 0;
}

/* Trains replicas x batch of the model arch on examples for epochs with
 * the optimizer given; the weights at the end. */
static outcome train_net(const net *arch, int replicas, int batch, kn_aggregation aggregation,
                         kn_optimizer_type opt, float lr, int64_t examples, int epochs) {
  kn_model models[8];
  kn_model *others[8];
  assert_true(replicas <= 8);
  for (int i = 0; i < replicas; i++) {
    build_net(&models[i], batch, arch);
    others[i] = &models[i + 1];
  }
  kn_dataset ds = teacher_data(examples);
  kn_train_config tc = {
      .epochs = epochs,
      .batch_size = batch,
      .shuffle = 1,
      .seed = 11,
      .log_every_steps = 1,
      .optimizer = {
          .type = opt, .learning_rate = lr, .beta1 = 0.9f, .beta2 = 0.999f, .epsilon = 1e-7f}};
  tc.dist =
      (kn_distribution){.n_replicas = replicas, .replicas = others, .aggregation = aggregation};
  outcome o = {0};
  char err[512];
  if (kn_train(&models[0], &ds, NULL, &tc, record_epoch, &o, err, sizeof err) != KN_OK)
    fail_msg("train: %s", err);
  o.n = kn_param_count(models[0].graph);
  o.weights = malloc(o.n * sizeof(float));
  assert_non_null(o.weights);
  memcpy(o.weights, kn_params(models[0].graph), o.n * sizeof(float));
  /* Every replica ends with the same weights as replica 0. */
  for (int i = 1; i < replicas; i++)
    assert_memory_equal(kn_params(models[i].graph), o.weights, o.n * sizeof(float));
  for (int i = 0; i < replicas; i++) kn_model_free(&models[i]);
  kn_dataset_free(&ds);
  return o;
}

static outcome train(int replicas, int batch, kn_aggregation aggregation, kn_optimizer_type opt,
                     float lr, int64_t examples, int epochs) {
  return train_net(&PLAIN, replicas, batch, aggregation, opt, lr, examples, epochs);
}

/* The largest difference relative to the weight's size (floored at 1e-2,
 * so weights near zero are compared absolutely). */
static double worst_relative(const outcome *a, const outcome *b) {
  assert_int_equal(a->n, b->n);
  double worst = 0.0;
  for (size_t i = 0; i < a->n; i++) {
    double scale = fabs(b->weights[i]) > 1e-2 ? fabs(b->weights[i]) : 1e-2;
    double d = fabs((double)a->weights[i] - b->weights[i]) / scale;
    if (d > worst) worst = d;
  }
  return worst;
}

static void mirrored_two_at_64_matches_single_at_128(void **state) {
  (void)state;
  /* 640 examples: 5 steps an epoch, 20 steps in 4 epochs. */
  outcome single = train(1, 128, KN_AGGREGATE_MEAN, KN_OPT_ADAM, 0.01f, 640, 4);
  outcome mirrored = train(2, 64, KN_AGGREGATE_MEAN, KN_OPT_ADAM, 0.01f, 640, 4);
  assert_int_equal(single.steps, 20);
  assert_int_equal(mirrored.steps, 20);
  double worst = worst_relative(&mirrored, &single);
  printf("mirrored R=2 b=64 vs single b=128 after 20 adam steps: worst relative %.3g\n", worst);
  assert_true(worst <= 1e-5);
  /* The loss reported is the global batch's, as the single run's. */
  assert_true(fabs(mirrored.last_epoch_loss - single.last_epoch_loss) <=
              1e-5 * fabs(single.last_epoch_loss));
  /* And the training moved the weights: a different run is far away. */
  outcome other = train(1, 64, KN_AGGREGATE_MEAN, KN_OPT_ADAM, 0.01f, 640, 2);
  assert_true(worst_relative(&other, &single) > 1e-2);
  free(single.weights);
  free(mirrored.weights);
  free(other.weights);
}

static void weighted_mean_matches_single_on_an_uneven_last_batch(void **state) {
  (void)state;
  /* 560 examples at a global batch of 128: the last batch has 48 rows,
   * so with four replicas of 32 rows replica 1 gets 16 and 2 and 3 none. */
  outcome single = train(1, 128, KN_AGGREGATE_MEAN, KN_OPT_SGD, 0.5f, 560, 4);
  outcome weighted = train(4, 32, KN_AGGREGATE_WEIGHTED_MEAN, KN_OPT_SGD, 0.5f, 560, 4);
  outcome mean = train(4, 32, KN_AGGREGATE_MEAN, KN_OPT_SGD, 0.5f, 560, 4);
  assert_int_equal(single.steps, 20);
  double w = worst_relative(&weighted, &single), m = worst_relative(&mean, &single);
  printf("uneven last batch, 20 sgd steps: weighted_mean %.3g, mean %.3g\n", w, m);
  assert_true(w <= 1e-5);
  assert_true(m > 1e-3); /* mean weights the 16-row replica like a full one */
  free(single.weights);
  free(weighted.weights);
  free(mean.weights);
}

static void sum_is_replicas_times_mean(void **state) {
  (void)state;
  outcome mean = train(2, 64, KN_AGGREGATE_MEAN, KN_OPT_SGD, 0.4f, 640, 4);
  outcome sum = train(2, 64, KN_AGGREGATE_SUM, KN_OPT_SGD, 0.2f, 640, 4);
  double worst = worst_relative(&sum, &mean);
  printf("sum at lr 0.2 vs mean at lr 0.4: worst relative %.3g\n", worst);
  assert_true(worst <= 1e-5);
  free(mean.weights);
  free(sum.weights);
}

/* Dropout draws each row's mask by its row in the global batch, so the
 * replicas' slices are masked as one replica's rows at R x b would be,
 * not all alike. */
static void dropout_masks_follow_the_global_batch(void **state) {
  (void)state;
  static const kn_layer_config layers[] = {
      {.type = KN_LAYER_DENSE, .units = 32, .use_bias = 1, .activation = KN_ACT_RELU},
      {.type = KN_LAYER_DROPOUT, .rate = 0.3f},
      {.type = KN_LAYER_DENSE, .units = OUTPUTS, .use_bias = 1}};
  const net dropout = {layers, 3};
  outcome single = train_net(&dropout, 1, 128, KN_AGGREGATE_MEAN, KN_OPT_ADAM, 0.01f, 640, 4);
  outcome mirrored = train_net(&dropout, 2, 64, KN_AGGREGATE_MEAN, KN_OPT_ADAM, 0.01f, 640, 4);
  double worst = worst_relative(&mirrored, &single);
  printf("dropout 0.3, mirrored R=2 b=64 vs single b=128 after 20 adam steps: worst relative "
         "%.3g\n",
         worst);
  assert_true(worst <= 1e-5);
  assert_true(fabs(mirrored.last_epoch_loss - single.last_epoch_loss) <=
              1e-5 * fabs(single.last_epoch_loss));
  /* Four replicas of 32 on an uneven last batch (replicas 2 and 3 idle in
   * its step): rows 96..127 of each batch are replica 3's. */
  outcome single_uneven = train_net(&dropout, 1, 128, KN_AGGREGATE_MEAN, KN_OPT_SGD, 0.5f, 560, 4);
  outcome four = train_net(&dropout, 4, 32, KN_AGGREGATE_WEIGHTED_MEAN, KN_OPT_SGD, 0.5f, 560, 4);
  double uneven = worst_relative(&four, &single_uneven);
  printf("dropout 0.3, 4 x 32 weighted_mean vs single b=128 on an uneven last batch: worst "
         "relative %.3g\n",
         uneven);
  assert_true(uneven <= 1e-5);
  /* The masks matter: without dropout the same run ends far away. */
  outcome plain = train(1, 128, KN_AGGREGATE_MEAN, KN_OPT_ADAM, 0.01f, 640, 4);
  assert_true(worst_relative(&plain, &single) > 1e-2);
  free(single.weights);
  free(mirrored.weights);
  free(single_uneven.weights);
  free(four.weights);
  free(plain.weights);
}

static void mismatched_replica_is_refused(void **state) {
  (void)state;
  kn_model primary, small;
  build(&primary, 64);
  build(&small, 32);
  kn_model *others[1] = {&small};
  kn_dataset ds = teacher_data(256);
  kn_train_config tc = {.epochs = 1,
                        .batch_size = 64,
                        .optimizer = {.type = KN_OPT_SGD, .learning_rate = 0.1f},
                        .dist = {.n_replicas = 2, .replicas = others}};
  char err[512] = "";
  assert_int_equal(kn_train(&primary, &ds, NULL, &tc, NULL, NULL, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "replica 1 differs"));
  tc.dist = (kn_distribution){.world_size = 2, .rank = 5};
  assert_int_equal(kn_train(&primary, &ds, NULL, &tc, NULL, NULL, err, sizeof err), KN_EINVAL);
  kn_model_free(&primary);
  kn_model_free(&small);
  kn_dataset_free(&ds);
}

typedef struct snapshot {
  kn_dist *d;
  kn_graph *g;
  int n_buckets;
  float *copy;    /* (params) each bucket's gradients as its ready node left them */
  int *taken;     /* (n_buckets) */
  int last_ready; /* the highest ready node seen so far in the run */
  int out_of_order;
} snapshot;

/* A node-done hook like the strategy's: takes each bucket once its ready
 * node has run, in bucket order. */
static void take_ready(void *ctx, int node) {
  snapshot *s = ctx;
  for (int b = 0; b < s->n_buckets; b++) {
    size_t start, len;
    int ready;
    kn_dist_bucket(s->d, b, &start, &len, &ready);
    if (s->taken[b] || ready > node) continue;
    for (int k = 0; k < b; k++) s->out_of_order |= !s->taken[k];
    memcpy(s->copy + start, kn_grads(s->g) + start, len * sizeof(float));
    s->taken[b] = 1;
  }
}

static void feed_random(kn_model *m, int rows, kn_rng *rng) {
  float *x = kn_node_data(m->graph, m->x);
  int32_t *y = kn_node_data(m->graph, m->y);
  for (int i = 0; i < rows * INPUTS; i++) x[i] = 2.0f * kn_rng_uniform(rng) - 1.0f;
  for (int i = 0; i < rows; i++) y[i] = (int32_t)kn_rng_below(rng, OUTPUTS);
}

static void buckets_hold_final_gradients_once_their_ready_node_has_run(void **state) {
  (void)state;
  static const kn_layer_config layers[] = {
      {.type = KN_LAYER_DENSE, .units = 48, .use_bias = 1, .activation = KN_ACT_RELU},
      {.type = KN_LAYER_DENSE, .units = 32, .use_bias = 1, .activation = KN_ACT_RELU},
      {.type = KN_LAYER_DENSE, .units = OUTPUTS, .use_bias = 1}};
  kn_model_config mc = {
      .input_ndim = 1, .input_shape = {INPUTS}, .n_layers = 3, .layers = layers, .batch_size = 16};
  kn_model m;
  char err[256];
  if (kn_model_build(&mc, &m, err, sizeof err) ||
      kn_graph_compile(m.graph, 3, NULL, err, sizeof err))
    fail_msg("%s", err);
  /* 1 KiB buckets: each kernel alone, the small tensors grouped. */
  kn_distribution cfg = {.bucket_bytes = 1024};
  kn_dist *d = NULL;
  if (kn_dist_new(&m, 16, &cfg, &d, err, sizeof err)) fail_msg("%s", err);
  size_t start, len;
  int ready;
  const int n = kn_dist_bucket(d, -1, &start, &len, &ready);
  assert_true(n >= 4);
  /* The buckets cover the flat buffer once, in the order they get ready. */
  unsigned char *covered = calloc(kn_param_count(m.graph), 1);
  int previous = -1;
  for (int b = 0; b < n; b++) {
    kn_dist_bucket(d, b, &start, &len, &ready);
    assert_true(ready >= previous);
    previous = ready;
    for (size_t j = start; j < start + len; j++) covered[j]++;
  }
  for (size_t j = 0; j < kn_param_count(m.graph); j++) assert_int_equal(covered[j], 1);
  /* The last layers' bucket is ready while backward still has the first
   * layer's nodes to run. */
  int first_ready, last_ready;
  kn_dist_bucket(d, 0, &start, &len, &first_ready);
  kn_dist_bucket(d, n - 1, &start, &len, &last_ready);
  assert_true(first_ready >= 0);
  assert_true(last_ready - first_ready >= 4);

  snapshot s = {.d = d, .g = m.graph, .n_buckets = n};
  s.copy = calloc(kn_param_count(m.graph), sizeof(float));
  s.taken = calloc((size_t)n, sizeof(int));
  assert_non_null(s.copy);
  assert_non_null(s.taken);
  kn_rng rng;
  kn_rng_seed(&rng, 99);
  feed_random(&m, 16, &rng);
  if (kn_graph_run(m.graph, KN_RUN_TRAIN, 16, err, sizeof err)) fail_msg("%s", err);
  /* A second batch: a bucket taken too early would still hold the first's. */
  feed_random(&m, 12, &rng);
  m.graph->node_done = take_ready;
  m.graph->node_done_ctx = &s;
  if (kn_graph_run(m.graph, KN_RUN_TRAIN, 12, err, sizeof err)) fail_msg("%s", err);
  m.graph->node_done = NULL;
  for (int b = 0; b < n; b++) assert_true(s.taken[b]);
  assert_false(s.out_of_order);
  assert_memory_equal(s.copy, kn_grads(m.graph), kn_param_count(m.graph) * sizeof(float));
  free(covered);
  free(s.copy);
  free(s.taken);
  kn_dist_free(d);
  kn_model_free(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(mirrored_two_at_64_matches_single_at_128),
      cmocka_unit_test(weighted_mean_matches_single_on_an_uneven_last_batch),
      cmocka_unit_test(sum_is_replicas_times_mean),
      cmocka_unit_test(dropout_masks_follow_the_global_batch),
      cmocka_unit_test(mismatched_replica_is_refused),
      cmocka_unit_test(buckets_hold_final_gradients_once_their_ready_node_has_run),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
