/* Data-parallel replicas in one process (the mirrored strategy): R
 * replicas at per-replica batch b end 20 steps with the weights one
 * replica reaches at batch R x b, weighted_mean keeps that true for an
 * uneven last batch (where mean does not), and sum is R x mean; dropout
 * masks are drawn by row of the global batch; synchronized batch norm
 * takes its statistics over the global batch, unsynchronized each
 * replica over its own slice. And the
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

static void feed_random(kn_model *m, int rows, kn_rng *rng) {
  float *x = kn_node_data(m->graph, m->x);
  int32_t *y = kn_node_data(m->graph, m->y);
  for (int i = 0; i < rows * INPUTS; i++) x[i] = 2.0f * kn_rng_uniform(rng) - 1.0f;
  for (int i = 0; i < rows; i++) y[i] = (int32_t)kn_rng_below(rng, OUTPUTS);
}

typedef struct outcome {
  float *weights; /* (params) */
  size_t n;
  float *state; /* (state floats) batch norm's moving statistics */
  size_t n_state;
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
 * the optimizer given; the weights and state at the end. */
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
  o.n_state = models[0].graph->n_state_floats;
  o.state = malloc((o.n_state ? o.n_state : 1) * sizeof(float));
  assert_non_null(o.state);
  if (o.n_state) memcpy(o.state, kn_state_data(models[0].graph), o.n_state * sizeof(float));
  /* Every replica ends with the same weights and state as replica 0. */
  for (int i = 1; i < replicas; i++) {
    assert_memory_equal(kn_params(models[i].graph), o.weights, o.n * sizeof(float));
    if (o.n_state)
      assert_memory_equal(kn_state_data(models[i].graph), o.state, o.n_state * sizeof(float));
  }
  for (int i = 0; i < replicas; i++) kn_model_free(&models[i]);
  kn_dataset_free(&ds);
  return o;
}

static outcome train(int replicas, int batch, kn_aggregation aggregation, kn_optimizer_type opt,
                     float lr, int64_t examples, int epochs) {
  return train_net(&PLAIN, replicas, batch, aggregation, opt, lr, examples, epochs);
}

/* The largest difference of a from b relative to b's value (floored at
 * 1e-2, so values near zero are compared absolutely). */
static double worst_relative_of(const float *a, const float *b, size_t n) {
  double worst = 0.0;
  for (size_t i = 0; i < n; i++) {
    double scale = fabs(b[i]) > 1e-2 ? fabs(b[i]) : 1e-2;
    double d = fabs((double)a[i] - b[i]) / scale;
    if (d > worst) worst = d;
  }
  return worst;
}

static double worst_relative(const outcome *a, const outcome *b) {
  assert_int_equal(a->n, b->n);
  return worst_relative_of(a->weights, b->weights, a->n);
}

static void outcome_free(outcome *o) {
  free(o->weights);
  free(o->state);
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
  outcome_free(&single);
  outcome_free(&mirrored);
  outcome_free(&other);
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
  outcome_free(&single);
  outcome_free(&weighted);
  outcome_free(&mean);
}

static void sum_is_replicas_times_mean(void **state) {
  (void)state;
  outcome mean = train(2, 64, KN_AGGREGATE_MEAN, KN_OPT_SGD, 0.4f, 640, 4);
  outcome sum = train(2, 64, KN_AGGREGATE_SUM, KN_OPT_SGD, 0.2f, 640, 4);
  double worst = worst_relative(&sum, &mean);
  printf("sum at lr 0.2 vs mean at lr 0.4: worst relative %.3g\n", worst);
  assert_true(worst <= 1e-5);
  outcome_free(&mean);
  outcome_free(&sum);
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
  outcome_free(&single);
  outcome_free(&mirrored);
  outcome_free(&single_uneven);
  outcome_free(&four);
  outcome_free(&plain);
}

/* Synchronized batch norm: the replicas' statistics and the sums of its
 * input gradient are taken over the global batch, so R replicas at b train
 * as one at R x b, moving statistics included; unsynchronized, each
 * replica normalizes by its own slice and they do not. */
static void synchronized_batch_norm_matches_one_replica_at_the_global_batch(void **state) {
  (void)state;
  /* No bias before batch norm: its gradient is rounding noise alone, which
   * Adam would turn into full steps. */
  kn_layer_config layers[] = {
      {.type = KN_LAYER_DENSE, .name = "d1", .units = 32},
      {.type = KN_LAYER_BATCH_NORM, .name = "bn", .synchronized = 1},
      {.type = KN_LAYER_ACTIVATION, .name = "act", .activation = KN_ACT_RELU},
      {.type = KN_LAYER_DENSE, .name = "d2", .units = OUTPUTS, .use_bias = 1}};
  const net bn = {layers, 4};
  outcome single = train_net(&bn, 1, 128, KN_AGGREGATE_MEAN, KN_OPT_ADAM, 0.01f, 640, 4);
  outcome mirrored = train_net(&bn, 2, 64, KN_AGGREGATE_MEAN, KN_OPT_ADAM, 0.01f, 640, 4);
  assert_int_equal(mirrored.steps, 20);
  assert_int_equal(mirrored.n_state, 64); /* moving mean and variance, 32 each */
  double weights = worst_relative(&mirrored, &single);
  double moving = worst_relative_of(mirrored.state, single.state, single.n_state);
  printf("synchronized batch norm, mirrored R=2 b=64 vs single b=128 after 20 adam steps: "
         "weights %.3g, moving statistics %.3g, epoch loss %.9g against %.9g\n",
         weights, moving, mirrored.last_epoch_loss, single.last_epoch_loss);
  assert_true(weights <= 1e-5);
  assert_true(moving <= 1e-5);
  assert_true(fabs(mirrored.last_epoch_loss - single.last_epoch_loss) <=
              1e-5 * fabs(single.last_epoch_loss));
  /* Four replicas of 32, weighted_mean, on an uneven last batch: replicas
   * 2 and 3 have no rows in its step and still take part in the sums. */
  outcome single_uneven = train_net(&bn, 1, 128, KN_AGGREGATE_MEAN, KN_OPT_SGD, 0.1f, 560, 4);
  outcome four = train_net(&bn, 4, 32, KN_AGGREGATE_WEIGHTED_MEAN, KN_OPT_SGD, 0.1f, 560, 4);
  double uneven = worst_relative(&four, &single_uneven);
  double uneven_moving = worst_relative_of(four.state, single_uneven.state, four.n_state);
  printf("synchronized batch norm, 4 x 32 weighted_mean vs single b=128 on an uneven last "
         "batch: weights %.3g, moving statistics %.3g\n",
         uneven, uneven_moving);
  assert_true(uneven <= 1e-5);
  assert_true(uneven_moving <= 1e-5);
  /* Unsynchronized (the default), each replica's statistics are its own
   * slice's: the run ends elsewhere. */
  layers[1].synchronized = 0;
  outcome own = train_net(&bn, 2, 64, KN_AGGREGATE_MEAN, KN_OPT_ADAM, 0.01f, 640, 4);
  double apart = worst_relative(&own, &single);
  printf("unsynchronized batch norm, mirrored R=2 b=64 vs single b=128: weights %.3g\n", apart);
  assert_true(apart > 1e-3);
  outcome_free(&single);
  outcome_free(&mirrored);
  outcome_free(&single_uneven);
  outcome_free(&four);
  outcome_free(&own);
}

/* Batch norm straight on the input, so its batch statistics are the
 * input's: two replicas of 16 rows, replica 1's data shifted by +1, one
 * training step from moving mean 0 and variance 1 (momentum 0.99). */
typedef struct bn_step {
  kn_model m[2];
  kn_dist *d;
  float *x[2]; /* (16, INPUTS) each replica's rows */
} bn_step;

static void bn_step_run(bn_step *s, int synchronized) {
  const kn_layer_config layers[] = {
      {.type = KN_LAYER_BATCH_NORM, .name = "bn", .synchronized = synchronized},
      {.type = KN_LAYER_DENSE, .name = "out", .units = OUTPUTS, .use_bias = 1}};
  const net arch = {layers, 2};
  char err[512];
  for (int i = 0; i < 2; i++) build_net(&s->m[i], 16, &arch);
  kn_model *others[1] = {&s->m[1]};
  kn_distribution cfg = {.n_replicas = 2, .replicas = others};
  if (kn_dist_new(&s->m[0], 16, &cfg, &s->d, err, sizeof err)) fail_msg("%s", err);
  kn_rng rng;
  kn_rng_seed(&rng, 5);
  for (int i = 0; i < 2; i++) {
    feed_random(&s->m[i], 16, &rng);
    s->x[i] = kn_node_data(s->m[i].graph, s->m[i].x);
    if (i == 1)
      for (int k = 0; k < 16 * INPUTS; k++) s->x[i][k] += 1.0f;
  }
  const int rows[2] = {16, 16};
  if (kn_dist_run(s->d, KN_RUN_TRAIN, rows, err, sizeof err)) fail_msg("%s", err);
}

static const float *moving(bn_step *s, int replica, const char *which) {
  kn_graph *g = s->m[replica].graph;
  char name[64];
  snprintf(name, sizeof name, "bn.%s", which);
  const kn_node n = kn_graph_find(g, name);
  assert_true(n >= 0);
  return kn_node_data(g, n);
}

/* The mean of column c over the rows of the replicas [first, last]. */
static double column_mean(const bn_step *s, int first, int last, int c) {
  double sum = 0.0;
  for (int i = first; i <= last; i++)
    for (int r = 0; r < 16; r++) sum += s->x[i][r * INPUTS + c];
  return sum / (16.0 * (last - first + 1));
}

static void bn_step_free(bn_step *s) {
  kn_dist_free(s->d);
  kn_model_free(&s->m[0]);
  kn_model_free(&s->m[1]);
}

static void batch_norm_statistics_are_per_replica_unless_synchronized(void **state) {
  (void)state;
  char err[512];
  /* Unsynchronized: replica i moves its moving mean by its own rows' mean
   * (x 0.01); after the step every replica takes replica 0's. */
  bn_step own = {0};
  bn_step_run(&own, 0);
  for (int c = 0; c < INPUTS; c++) {
    assert_float_equal(moving(&own, 0, "moving_mean")[c], 0.01 * column_mean(&own, 0, 0, c), 1e-6);
    assert_float_equal(moving(&own, 1, "moving_mean")[c], 0.01 * column_mean(&own, 1, 1, c), 1e-6);
  }
  double sums[KN_DIST_SUMS] = {32, 0, 0};
  const int rows[2] = {16, 16};
  if (kn_dist_reduce(own.d, rows, sums, err, sizeof err) || kn_dist_sync(own.d, err, sizeof err))
    fail_msg("%s", err);
  assert_memory_equal(kn_state_data(own.m[1].graph), kn_state_data(own.m[0].graph),
                      own.m[0].graph->n_state_floats * sizeof(float));
  /* Synchronized: both move by the mean and (unbiased) variance of all 32
   * rows. */
  bn_step sync = {0};
  bn_step_run(&sync, 1);
  for (int c = 0; c < INPUTS; c++) {
    const double mean = column_mean(&sync, 0, 1, c);
    double sq = 0.0;
    for (int i = 0; i < 2; i++)
      for (int r = 0; r < 16; r++) sq += pow(sync.x[i][r * INPUTS + c] - mean, 2);
    const double var = 0.99 + 0.01 * sq / 31.0;
    for (int i = 0; i < 2; i++) {
      assert_float_equal(moving(&sync, i, "moving_mean")[c], 0.01 * mean, 1e-6);
      assert_float_equal(moving(&sync, i, "moving_variance")[c], var, 1e-6);
    }
  }
  bn_step_free(&own);
  bn_step_free(&sync);
}

/* A replica whose run fails after the forward's sums (a label out of
 * range) leaves replica 0 waiting in backward's; it is let go, and the
 * error reported is the failing replica's. */
static void a_replica_failing_mid_step_releases_the_others(void **state) {
  (void)state;
  const kn_layer_config layers[] = {
      {.type = KN_LAYER_DENSE, .name = "d1", .units = 8},
      {.type = KN_LAYER_BATCH_NORM, .name = "bn", .synchronized = 1},
      {.type = KN_LAYER_DENSE, .name = "out", .units = OUTPUTS, .use_bias = 1}};
  const net arch = {layers, 3};
  kn_model m[2];
  for (int i = 0; i < 2; i++) build_net(&m[i], 16, &arch);
  kn_model *others[1] = {&m[1]};
  kn_distribution cfg = {.n_replicas = 2, .replicas = others};
  kn_dist *d = NULL;
  char err[512] = "";
  if (kn_dist_new(&m[0], 16, &cfg, &d, err, sizeof err)) fail_msg("%s", err);
  kn_rng rng;
  kn_rng_seed(&rng, 8);
  for (int i = 0; i < 2; i++) feed_random(&m[i], 16, &rng);
  ((int32_t *)kn_node_data(m[1].graph, m[1].y))[3] = 99;
  const int rows[2] = {16, 16};
  assert_int_equal(kn_dist_run(d, KN_RUN_TRAIN, rows, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "replica 1: "));
  assert_non_null(strstr(err, "label 99 of row 3"));
  /* The next step runs: nothing is left waiting. */
  ((int32_t *)kn_node_data(m[1].graph, m[1].y))[3] = 0;
  if (kn_dist_run(d, KN_RUN_TRAIN, rows, err, sizeof err)) fail_msg("%s", err);
  kn_dist_free(d);
  /* parameter_server async workers never step together: refused. */
  kn_distribution async = {.world_size = 2, .ps_servers = 1, .ps_async = 1};
  assert_int_equal(kn_dist_new(&m[0], 16, &async, &d, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "parameter_server async"));
  kn_model_free(&m[0]);
  kn_model_free(&m[1]);
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
      cmocka_unit_test(synchronized_batch_norm_matches_one_replica_at_the_global_batch),
      cmocka_unit_test(batch_norm_statistics_are_per_replica_unless_synchronized),
      cmocka_unit_test(a_replica_failing_mid_step_releases_the_others),
      cmocka_unit_test(mismatched_replica_is_refused),
      cmocka_unit_test(buckets_hold_final_gradients_once_their_ready_node_has_run),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
