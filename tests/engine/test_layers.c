/* Keras layers end to end: a CNN using every layer type (with a residual
 * add and a concatenate branch) checked against finite differences in the
 * double reference mode; Keras parameter names and shapes; batch norm's
 * moving statistics and inference mode; dropout; conv2d against a direct
 * loop; initializers; dtype conversions and device tags. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"

/* input (6, 6, 2) -> conv 3x3 same relu (4) -> batch_norm -> separable 3x3 same (4) ->
 * add(bn, separable) -> depthwise 3x3 valid x2 -> concatenate(dw, avg_pool of dw) ->
 * max_pool 2 -> dropout -> global_avg_pool -> dense 3 softmax. */
static int every_layer(kn_layer_config *L) {
  memset(L, 0, 11 * sizeof *L);
  int n = 0;
  L[n] = (kn_layer_config){.type = KN_LAYER_CONV2D,
                           .name = "conv",
                           .filters = 4,
                           .kernel_size = {3, 3},
                           .padding = KN_PAD_SAME,
                           .use_bias = 1,
                           .activation = KN_ACT_ELU};
  n++;
  L[n] = (kn_layer_config){.type = KN_LAYER_BATCH_NORM, .name = "bn"};
  n++;
  L[n] = (kn_layer_config){.type = KN_LAYER_SEPARABLE_CONV2D,
                           .name = "sep",
                           .filters = 4,
                           .kernel_size = {3, 3},
                           .padding = KN_PAD_SAME,
                           .use_bias = 1,
                           .activation = KN_ACT_TANH};
  n++;
  L[n] = (kn_layer_config){.type = KN_LAYER_ADD, .name = "res", .n_inputs = 2, .inputs = {1, 2}};
  n++;
  L[n] = (kn_layer_config){.type = KN_LAYER_DEPTHWISE_CONV2D,
                           .name = "dw",
                           .kernel_size = {3, 3},
                           .depth_multiplier = 2,
                           .use_bias = 1,
                           .activation = KN_ACT_GELU};
  n++;
  L[n] = (kn_layer_config){.type = KN_LAYER_AVG_POOL2D,
                           .name = "avg",
                           .pool_size = {3, 3},
                           .strides = {1, 1},
                           .padding = KN_PAD_SAME};
  n++;
  L[n] = (kn_layer_config){
      .type = KN_LAYER_CONCATENATE, .name = "cat", .n_inputs = 2, .inputs = {4, 5}};
  n++;
  L[n] = (kn_layer_config){.type = KN_LAYER_MAX_POOL2D, .name = "pool"};
  n++;
  L[n] = (kn_layer_config){.type = KN_LAYER_DROPOUT, .name = "drop", .rate = 0.25f};
  n++;
  L[n] = (kn_layer_config){.type = KN_LAYER_GLOBAL_AVG_POOL2D, .name = "gap"};
  n++;
  L[n] = (kn_layer_config){.type = KN_LAYER_DENSE,
                           .name = "out",
                           .units = 3,
                           .use_bias = 1,
                           .activation = KN_ACT_SOFTMAX};
  n++;
  return n;
}

static kn_model build(const kn_layer_config *layers, int n, int batch, int f64) {
  kn_model_config cfg = {.input_ndim = 3,
                         .input_shape = {6, 6, 2},
                         .n_layers = n,
                         .layers = layers,
                         .batch_size = batch,
                         .seed = 5};
  kn_model m;
  char err[512] = "";
  if (kn_model_build(&cfg, &m, err, sizeof err)) fail_msg("build: %s", err);
  if (f64) kn_graph_use_f64(m.graph);
  if (kn_graph_compile(m.graph, 3, NULL, err, sizeof err)) fail_msg("compile: %s", err);
  return m;
}

static void fill_batch(kn_model *m, int rows, int f64) {
  kn_rng rng;
  kn_rng_seed(&rng, 21);
  for (size_t i = 0; i < (size_t)rows * m->example_size; i++) {
    double v = 2.0 * kn_rng_uniform(&rng) - 1.0;
    if (f64) {
      ((double *)kn_node_data(m->graph, m->x))[i] = v;
    } else {
      ((float *)kn_node_data(m->graph, m->x))[i] = (float)v;
    }
  }
  int32_t *y = kn_node_data(m->graph, m->y);
  for (int r = 0; r < rows; r++) y[r] = (int32_t)kn_rng_below(&rng, 3);
}

static double loss_of(kn_model *m, kn_run_mode mode, int rows) {
  char err[512];
  if (kn_graph_run(m->graph, mode, rows, err, sizeof err)) fail_msg("run: %s", err);
  return *(double *)kn_node_data(m->graph, m->loss);
}

/* The model's gradients against central finite differences, in the
 * double reference mode, with the given passes; on a partial batch (3 of 4
 * planned rows). Every parameter takes part: almost none is exactly 0. */
static void matches_finite_differences(const kn_layer_config *layers, int n, unsigned passes) {
  kn_model_config cfg = {.input_ndim = 3,
                         .input_shape = {6, 6, 2},
                         .n_layers = n,
                         .layers = layers,
                         .batch_size = 4,
                         .seed = 5};
  kn_model m;
  char err[512] = "";
  if (kn_model_build(&cfg, &m, err, sizeof err)) fail_msg("build: %s", err);
  kn_graph_use_f64(m.graph);
  kn_graph_set_passes(m.graph, passes);
  if (kn_graph_compile(m.graph, 3, NULL, err, sizeof err)) fail_msg("compile: %s", err);
  fill_batch(&m, 3, 1);
  loss_of(&m, KN_RUN_TRAIN, 3);
  size_t np = kn_param_count(m.graph);
  double *p = (double *)(void *)kn_params(m.graph);
  double *analytic = malloc(np * sizeof *analytic);
  memcpy(analytic, kn_grads(m.graph), np * sizeof *analytic);
  int nonzero = 0;
  for (size_t i = 0; i < np; i++) {
    double saved = p[i], h = 1e-6;
    p[i] = saved + h;
    double up = loss_of(&m, KN_RUN_FORWARD_TRAIN, 3);
    p[i] = saved - h;
    double down = loss_of(&m, KN_RUN_FORWARD_TRAIN, 3);
    p[i] = saved;
    double fd = (up - down) / (2 * h);
    if (fabs(fd - analytic[i]) > 1e-6 + 1e-4 * fabs(fd)) {
      fail_msg("param %zu: autodiff %.10f vs finite differences %.10f", i, analytic[i], fd);
    }
    nonzero += fabs(analytic[i]) > 1e-9;
  }
  assert_true(nonzero * 10 >= (int)np * 9);
  free(analytic);
  kn_model_free(&m);
}

static void cnn_with_every_layer_type_matches_finite_differences(void **state) {
  (void)state;
  kn_layer_config layers[11];
  int n = every_layer(layers);
  matches_finite_differences(layers, n, KN_PASS_ALL);
}

/* conv -> batch norm -> relu twice: the batch norms' backward with and
 * without the bn_grads pass (which writes gamma's and beta's gradients from
 * the input gradient's sums and takes the relu's gradient inside). */
static void batch_norm_relu_backward_matches_finite_differences(void **state) {
  (void)state;
  kn_layer_config layers[8] = {
      {.type = KN_LAYER_CONV2D,
       .name = "c1",
       .filters = 3,
       .kernel_size = {3, 3},
       .padding = KN_PAD_SAME,
       .use_bias = 1},
      {.type = KN_LAYER_BATCH_NORM, .name = "bn1"},
      {.type = KN_LAYER_ACTIVATION, .name = "r1", .activation = KN_ACT_RELU},
      {.type = KN_LAYER_CONV2D, .name = "c2", .filters = 4, .kernel_size = {3, 3}},
      {.type = KN_LAYER_BATCH_NORM, .name = "bn2"},
      {.type = KN_LAYER_ACTIVATION, .name = "r2", .activation = KN_ACT_RELU},
      {.type = KN_LAYER_GLOBAL_AVG_POOL2D, .name = "gap"},
      {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .use_bias = 1}};
  matches_finite_differences(layers, 8, KN_PASS_ALL);
  matches_finite_differences(layers, 8, KN_PASS_ALL & ~KN_PASS_BN_GRADS);
}

static void layers_use_keras_parameter_names_and_shapes(void **state) {
  (void)state;
  kn_layer_config layers[11];
  int n = every_layer(layers);
  kn_model m = build(layers, n, 2, 0);
  const char *expect[] = {"conv.kernel",
                          "conv.bias",
                          "bn.gamma",
                          "bn.beta",
                          "sep.depthwise_kernel",
                          "sep.pointwise_kernel",
                          "sep.bias",
                          "dw.depthwise_kernel",
                          "dw.bias",
                          "out.kernel",
                          "out.bias"};
  assert_int_equal(kn_param_node_count(m.graph), 11);
  for (int i = 0; i < 11; i++) {
    assert_string_equal(kn_node_name(m.graph, kn_param_node(m.graph, i)), expect[i]);
  }
  int nd, dims[KN_MAX_DIMS];
  kn_node_shape(m.graph, kn_param_node(m.graph, 0), &nd, dims);
  assert_int_equal(nd, 4);
  assert_int_equal(dims[0] * 1000 + dims[1] * 100 + dims[2] * 10 + dims[3], 3324);
  kn_node_shape(m.graph, kn_param_node(m.graph, 7), &nd, dims); /* (3, 3, 4, 2) */
  assert_int_equal(dims[2] * 10 + dims[3], 42);
  kn_node_shape(m.graph, kn_param_node(m.graph, 9), &nd, dims); /* concat: 8 + 8 channels */
  assert_int_equal(dims[0], 16);
  assert_int_equal(kn_state_node_count(m.graph), 2);
  assert_string_equal(kn_node_name(m.graph, kn_state_node(m.graph, 0)), "bn.moving_mean");
  assert_string_equal(kn_node_name(m.graph, kn_state_node(m.graph, 1)), "bn.moving_variance");
  kn_model_free(&m);
}

/* Moving statistics move toward the batch's by (1 - momentum) per training
 * step; a forward (inference) run normalizes with them, not the batch's. */
static void batch_norm_moves_statistics_and_infers_with_them(void **state) {
  (void)state;
  kn_layer_config layers[3] = {
      {.type = KN_LAYER_FLATTEN, .name = "f"},
      {.type = KN_LAYER_BATCH_NORM, .name = "bn", .momentum = 0.9f, .epsilon = 1e-3f},
      {.type = KN_LAYER_ACTIVATION, .name = "a"}};
  kn_model_config cfg = {
      .input_ndim = 1, .input_shape = {2}, .n_layers = 3, .layers = layers, .batch_size = 4};
  kn_model m;
  char err[512];
  assert_int_equal(kn_model_build(&cfg, &m, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(m.graph, 1, NULL, err, sizeof err), KN_OK);
  float *x = kn_node_data(m.graph, m.x);
  const float xs[8] = {1, 10, 2, 20, 3, 30, 6, 40}; /* column means 3 and 25 */
  memcpy(x, xs, sizeof xs);
  int32_t *y = kn_node_data(m.graph, m.y);
  for (int r = 0; r < 4; r++) y[r] = r % 2;
  assert_int_equal(kn_graph_run(m.graph, KN_RUN_TRAIN, 4, err, sizeof err), KN_OK);
  const float *st = kn_state_data(m.graph);
  assert_float_equal(st[0], 0.1 * 3.0, 1e-6);
  assert_float_equal(st[1], 0.1 * 25.0, 1e-5);
  /* unbiased variance of {1,2,3,6} = 14/3 */
  assert_float_equal(st[2], 0.9 + 0.1 * 14.0 / 3.0, 1e-5);
  const float *logits = kn_node_data(m.graph, m.logits);
  /* Training output: batch-normalized, so each column has mean 0. */
  assert_float_equal(logits[0] + logits[2] + logits[4] + logits[6], 0.0, 1e-5);
  assert_int_equal(kn_graph_run(m.graph, KN_RUN_FORWARD, 4, err, sizeof err), KN_OK);
  double expect = (1.0 - st[0]) / sqrt(st[2] + 1e-3);
  assert_float_equal(logits[0], expect, 1e-5);
  kn_model_free(&m);
}

/* The batch statistics are summed in one pass, shifted by each channel's
 * first value: data a million from zero, spread by less than one, still
 * give its variance (unshifted, the squares' sum in double would lose it). */
static void batch_norm_statistics_keep_their_precision_far_from_zero(void **state) {
  (void)state;
  enum { R = 512 };
  kn_layer_config layers[3] = {
      {.type = KN_LAYER_FLATTEN, .name = "f"},
      {.type = KN_LAYER_BATCH_NORM, .name = "bn", .momentum = 0.5f, .epsilon = 1e-3f},
      {.type = KN_LAYER_ACTIVATION, .name = "a"}};
  kn_model_config cfg = {
      .input_ndim = 1, .input_shape = {2}, .n_layers = 3, .layers = layers, .batch_size = R};
  kn_model m;
  char err[512];
  assert_int_equal(kn_model_build(&cfg, &m, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(m.graph, 1, NULL, err, sizeof err), KN_OK);
  float *x = kn_node_data(m.graph, m.x);
  for (int r = 0; r < R; r++) { /* exactly representable in float */
    x[2 * r] = 1e6f + (float)(r % 17 - 8) * 0.125f;
    x[2 * r + 1] = -3e6f + (float)(r * 7 % 13 - 6) * 0.25f;
  }
  int32_t *y = kn_node_data(m.graph, m.y);
  for (int r = 0; r < R; r++) y[r] = r % 2;
  double mean[2] = {0, 0}, var[2] = {0, 0};
  for (int c = 0; c < 2; c++) {
    for (int r = 0; r < R; r++) mean[c] += x[2 * r + c];
    mean[c] /= R;
    for (int r = 0; r < R; r++) var[c] += (x[2 * r + c] - mean[c]) * (x[2 * r + c] - mean[c]);
    var[c] /= R - 1; /* the moving variance is unbiased */
  }
  assert_int_equal(kn_graph_run(m.graph, KN_RUN_TRAIN, R, err, sizeof err), KN_OK);
  const float *st = kn_state_data(m.graph);
  for (int c = 0; c < 2; c++) {
    assert_float_equal(st[c], 0.5 * mean[c], 0.5);
    const double want = 0.5 + 0.5 * var[c];
    if (fabs(st[2 + c] - want) > 1e-6 * want)
      fail_msg("channel %d: moving variance %.9g, want %.9g (variance %.9g about %.9g)", c,
               (double)st[2 + c], want, var[c], mean[c]);
  }
  kn_model_free(&m);
}

/* Trains cfg two steps on `threads` threads (float or the double
 * reference) and returns its gradients, its state and its loss as bytes. */
static unsigned char *two_steps(const kn_model_config *cfg, int f64, int threads, size_t *bytes) {
  const size_t esz = f64 ? sizeof(double) : sizeof(float);
  kn_model m;
  char err[512];
  assert_int_equal(kn_model_build(cfg, &m, err, sizeof err), KN_OK);
  if (f64) kn_graph_use_f64(m.graph);
  kn_graph_set_threads(m.graph, threads);
  assert_int_equal(kn_graph_compile(m.graph, 1, NULL, err, sizeof err), KN_OK);
  fill_batch(&m, cfg->batch_size, f64);
  assert_int_equal(kn_graph_run(m.graph, KN_RUN_TRAIN, cfg->batch_size, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_run(m.graph, KN_RUN_TRAIN, cfg->batch_size, err, sizeof err), KN_OK);
  const size_t grad_bytes = kn_param_count(m.graph) * esz;
  size_t state_bytes = 0;
  for (int i = 0; i < kn_state_node_count(m.graph); i++) {
    int nd, dims[KN_MAX_DIMS];
    kn_node_shape(m.graph, kn_state_node(m.graph, i), &nd, dims);
    size_t count = 1;
    for (int d = 0; d < nd; d++) count *= (size_t)dims[d];
    state_bytes += count * esz;
  }
  *bytes = grad_bytes + state_bytes + esz;
  unsigned char *r = malloc(*bytes);
  assert_non_null(r);
  memcpy(r, kn_grads(m.graph), grad_bytes);
  memcpy(r + grad_bytes, kn_state_data(m.graph), state_bytes);
  memcpy(r + grad_bytes + state_bytes, kn_node_data(m.graph, m.loss), esz);
  kn_model_free(&m);
  return r;
}

/* cfg's two steps give the same bits on 1, 2 and 3 threads, in float and
 * in the double reference (where a sum in another order shows in the last
 * bits). */
static void same_bits_on_any_thread_count(const kn_model_config *cfg) {
  for (int f64 = 0; f64 <= 1; f64++) {
    size_t bytes = 0, n = 0;
    unsigned char *first = two_steps(cfg, f64, 1, &bytes);
    for (int threads = 2; threads <= 3; threads++) {
      unsigned char *r = two_steps(cfg, f64, threads, &n);
      assert_int_equal(n, bytes);
      if (memcmp(first, r, n))
        fail_msg("%s, %d threads: different bits", f64 ? "f64" : "f32", threads);
      free(r);
    }
    free(first);
  }
}

/* Batch norm sums its channels over the rows by blocks of rows whose count
 * depends on the rows alone: 2048 rows (several blocks, on the pool) of 80
 * channels (more than one chunk of channels) train to the same bits on 1, 2
 * and 3 threads, and the moving mean holds each channel's batch mean. */
static void batch_norm_gives_the_same_bits_on_any_thread_count(void **state) {
  (void)state;
  enum { ROWS = 2048, CH = 80 };
  kn_layer_config layers[2] = {
      {.type = KN_LAYER_BATCH_NORM, .name = "bn", .momentum = 0.5f, .epsilon = 1e-3f},
      {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .use_bias = 1}};
  kn_model_config cfg = {.input_ndim = 1,
                         .input_shape = {CH},
                         .n_layers = 2,
                         .layers = layers,
                         .batch_size = ROWS,
                         .seed = 7};
  for (int f64 = 0; f64 <= 1; f64++) {
    kn_model m;
    char err[512];
    assert_int_equal(kn_model_build(&cfg, &m, err, sizeof err), KN_OK);
    if (f64) kn_graph_use_f64(m.graph);
    assert_int_equal(kn_graph_compile(m.graph, 1, NULL, err, sizeof err), KN_OK);
    fill_batch(&m, ROWS, f64);
    const void *x = kn_node_data(m.graph, m.x);
    double sum = 0.0; /* channel 70, in the second chunk */
    for (int r = 0; r < ROWS; r++) {
      const size_t i = (size_t)r * CH + 70;
      sum += f64 ? ((const double *)x)[i] : ((const float *)x)[i];
    }
    assert_int_equal(kn_graph_run(m.graph, KN_RUN_TRAIN, ROWS, err, sizeof err), KN_OK);
    const void *st = kn_state_data(m.graph);
    assert_float_equal(f64 ? ((const double *)st)[70] : ((const float *)st)[70], 0.5 * sum / ROWS,
                       f64 ? 1e-15 : 1e-7);
    kn_model_free(&m);
  }
  same_bits_on_any_thread_count(&cfg);
}

/* Batch norm's float sums go 8 channels a vector, past the last whole
 * block by one more ending at the last channel (overlapping the block
 * before it); under 8 channels, one by one. With a relu after it (its
 * gradient fused into the norm's), 12, 20, 8 and 5 channels train two
 * steps within float rounding of the double reference: gradients, moving
 * statistics and loss. */
static void batch_norm_over_any_channel_count_matches_the_double_reference(void **state) {
  (void)state;
  const int channels[] = {12, 20, 8, 5};
  for (size_t k = 0; k < sizeof channels / sizeof channels[0]; k++) {
    kn_layer_config layers[4] = {
        {.type = KN_LAYER_BATCH_NORM, .name = "bn", .momentum = 0.5f, .epsilon = 1e-3f},
        {.type = KN_LAYER_ACTIVATION, .name = "r", .activation = KN_ACT_RELU},
        {.type = KN_LAYER_GLOBAL_AVG_POOL2D, .name = "gap"},
        {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .use_bias = 1}};
    kn_model_config cfg = {.input_ndim = 3,
                           .input_shape = {6, 5, channels[k]},
                           .n_layers = 4,
                           .layers = layers,
                           .batch_size = 40,
                           .seed = 3};
    size_t nf = 0, nd = 0;
    unsigned char *f = two_steps(&cfg, 0, 2, &nf), *d = two_steps(&cfg, 1, 2, &nd);
    assert_int_equal(nf / sizeof(float), nd / sizeof(double));
    for (size_t i = 0; i < nf / sizeof(float); i++) {
      float a;
      double b;
      memcpy(&a, f + i * sizeof a, sizeof a);
      memcpy(&b, d + i * sizeof b, sizeof b);
      if (fabs(a - b) > 1e-5 * (1.0 + fabs(b)))
        fail_msg("%d channels: value %zu is %.9g in float, %.9g in double", channels[k], i,
                 (double)a, b);
    }
    free(f);
    free(d);
  }
}

/* The depthwise weight gradient sums over image blocks whose count depends
 * on the batch alone, added in block order, by chunks of channels; its
 * forward and input gradient go by rows on the pool. 40 images (5 blocks)
 * of 12 x 12 x 24 through a 3x3 depthwise, a strided 5x5 one with depth
 * multiplier 2 (taps x channels past one chunk) and a dilated one train to
 * the same bits on any thread count. */
static void depthwise_gives_the_same_bits_on_any_thread_count(void **state) {
  (void)state;
  kn_layer_config layers[5] = {{.type = KN_LAYER_DEPTHWISE_CONV2D,
                                .name = "dw1",
                                .kernel_size = {3, 3},
                                .padding = KN_PAD_SAME,
                                .use_bias = 1,
                                .activation = KN_ACT_RELU},
                               {.type = KN_LAYER_DEPTHWISE_CONV2D,
                                .name = "dw2",
                                .kernel_size = {5, 5},
                                .strides = {2, 2},
                                .depth_multiplier = 2,
                                .padding = KN_PAD_SAME},
                               {.type = KN_LAYER_DEPTHWISE_CONV2D,
                                .name = "dw3",
                                .kernel_size = {3, 3},
                                .dilation_rate = {2, 2},
                                .padding = KN_PAD_SAME},
                               {.type = KN_LAYER_GLOBAL_AVG_POOL2D, .name = "gap"},
                               {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .use_bias = 1}};
  kn_model_config cfg = {.input_ndim = 3,
                         .input_shape = {12, 12, 24},
                         .n_layers = 5,
                         .layers = layers,
                         .batch_size = 40,
                         .seed = 9};
  same_bits_on_any_thread_count(&cfg);
}

static void dropout_drops_at_its_rate_only_in_training(void **state) {
  (void)state;
  kn_graph *g = kn_graph_new();
  int d[2] = {100, 100};
  kn_node x = kn_input(g, "x", KN_F32, 2, d);
  kn_node y = kn_dropout(g, x, 0.3f, 7);
  kn_graph_keep(g, y);
  char err[256];
  assert_int_equal(kn_graph_compile(g, 1, NULL, err, sizeof err), KN_OK);
  float *xd = kn_node_data(g, x);
  for (int i = 0; i < 10000; i++) xd[i] = 1.0f;
  assert_int_equal(kn_graph_run(g, KN_RUN_FORWARD_TRAIN, 100, err, sizeof err), KN_OK);
  const float *yd = kn_node_data(g, y);
  int zeros = 0;
  double sum = 0.0;
  for (int i = 0; i < 10000; i++) {
    zeros += yd[i] == 0.0f;
    sum += yd[i];
    if (yd[i] != 0.0f) assert_float_equal(yd[i], 1.0 / 0.7, 1e-6);
  }
  assert_in_range(zeros, 2800, 3200); /* 3000 expected, 4.6 sigma either side */
  assert_float_equal(sum / 10000.0, 1.0, 0.05);
  assert_int_equal(kn_graph_run(g, KN_RUN_FORWARD, 100, err, sizeof err), KN_OK);
  for (int i = 0; i < 10000; i++) assert_float_equal(yd[i], 1.0, 0.0);
  kn_graph_free(g);
}

/* Depth multipliers 2 and 3 (output channel c * M + m reads input channel
 * c) against the definition in double: y, dx and dw, with loss = sum(r *
 * y). Channel counts put a 16-wide block and a tail in C * M; a 3x3 "same"
 * window, a strided 5x5 and a dilated 3x3; 1 and 2 threads. */
static void depthwise_multipliers_match_a_direct_loop(void **state) {
  (void)state;
  const struct {
    int h, w, c, m, k, s, d;
  } cases[] = {{6, 7, 7, 3, 3, 1, 1}, {9, 8, 12, 2, 5, 2, 1}, {7, 7, 5, 2, 3, 1, 2}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    for (int threads = 1; threads <= 2; threads++) {
      const int B = 3, H = cases[k].h, W = cases[k].w, C = cases[k].c, M = cases[k].m;
      const int K = cases[k].k, S = cases[k].s, D = cases[k].d, CM = C * M;
      kn_graph *g = kn_graph_new();
      int xd[4] = {B, H, W, C}, wd[4] = {K, K, C, M};
      kn_node x = kn_param(g, "x", 4, xd, KN_INIT_ZEROS);
      kn_node w = kn_param(g, "w", 4, wd, KN_INIT_ZEROS);
      kn_window win = {K, K, S, S, D, D, KN_PAD_SAME};
      kn_node y = kn_depthwise_conv2d(g, x, w, &win);
      int nd, yd[KN_MAX_DIMS];
      kn_node_shape(g, y, &nd, yd);
      kn_node r = kn_param(g, "r", 4, yd, KN_INIT_ZEROS);
      kn_graph_keep(g, y);
      char err[256];
      if (kn_autodiff(g, kn_sum(g, kn_mul(g, y, r), -1, 0), err, sizeof err))
        fail_msg("autodiff: %s", err);
      kn_graph_set_threads(g, threads);
      if (kn_graph_compile(g, 1, NULL, err, sizeof err)) fail_msg("compile: %s", err);
      const int OH = yd[1], OW = yd[2], ek = (K - 1) * D + 1;
      const size_t nx = (size_t)B * H * W * C, nw = (size_t)K * K * CM,
                   ny = (size_t)B * OH * OW * CM;
      float *p = kn_params(g), *xv = p + kn_param_offset(g, x), *wv = p + kn_param_offset(g, w);
      float *rv = p + kn_param_offset(g, r);
      kn_rng rng;
      kn_rng_seed(&rng, 11 + (uint64_t)k);
      for (size_t i = 0; i < nx; i++) xv[i] = kn_rng_uniform(&rng) - 0.5f;
      for (size_t i = 0; i < nw; i++) wv[i] = kn_rng_uniform(&rng) - 0.5f;
      for (size_t i = 0; i < ny; i++) rv[i] = kn_rng_uniform(&rng) - 0.5f;
      if (kn_graph_run(g, KN_RUN_TRAIN, B, err, sizeof err)) fail_msg("run: %s", err);
      const int pt = ((OH - 1) * S + ek - H) > 0 ? ((OH - 1) * S + ek - H) / 2 : 0;
      const int pl = ((OW - 1) * S + ek - W) > 0 ? ((OW - 1) * S + ek - W) / 2 : 0;
      double *want_dx = calloc(nx, sizeof *want_dx), *want_dw = calloc(nw, sizeof *want_dw);
      const float *got_y = kn_node_data(g, y), *gr = kn_grads(g);
      for (int b = 0; b < B; b++)
        for (int oh = 0; oh < OH; oh++)
          for (int ow = 0; ow < OW; ow++)
            for (int o = 0; o < CM; o++) {
              const size_t yo = (((size_t)b * OH + oh) * OW + ow) * CM + o;
              double acc = 0.0;
              for (int ki = 0; ki < K; ki++)
                for (int kj = 0; kj < K; kj++) {
                  const int ih = oh * S - pt + ki * D, iw = ow * S - pl + kj * D;
                  if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                  const size_t xi = (((size_t)b * H + ih) * W + iw) * C + o / M;
                  const size_t wi = (size_t)(ki * K + kj) * CM + o;
                  acc += (double)xv[xi] * wv[wi];
                  want_dx[xi] += (double)rv[yo] * wv[wi];
                  want_dw[wi] += (double)rv[yo] * xv[xi];
                }
              if (fabs(got_y[yo] - acc) > 1e-5)
                fail_msg("case %zu, %d thread(s): y[%zu] = %.9g, want %.9g", k, threads, yo,
                         got_y[yo], acc);
            }
      const float *gx = gr + kn_param_offset(g, x), *gw = gr + kn_param_offset(g, w);
      for (size_t i = 0; i < nx; i++)
        if (fabs(gx[i] - want_dx[i]) > 1e-5)
          fail_msg("case %zu, %d thread(s): dx[%zu] = %.9g, want %.9g", k, threads, i, gx[i],
                   want_dx[i]);
      for (size_t i = 0; i < nw; i++)
        if (fabs(gw[i] - want_dw[i]) > 1e-4)
          fail_msg("case %zu, %d thread(s): dw[%zu] = %.9g, want %.9g", k, threads, i, gw[i],
                   want_dw[i]);
      free(want_dx);
      free(want_dw);
      kn_graph_free(g);
    }
  }
}

/* conv2d (stride 2, same, dilation 1) against the definition, in float. */
static void conv2d_matches_a_direct_loop(void **state) {
  (void)state;
  enum { B = 2, H = 7, W = 6, C = 3, K = 3, Fo = 4, S = 2 };
  kn_graph *g = kn_graph_new();
  int xd[4] = {B, H, W, C}, wd[4] = {K, K, C, Fo};
  kn_node x = kn_input(g, "x", KN_F32, 4, xd);
  kn_node w = kn_param(g, "w", 4, wd, KN_INIT_GLOROT_UNIFORM);
  kn_window win = {K, K, S, S, 1, 1, KN_PAD_SAME};
  kn_node y = kn_conv2d(g, x, w, &win);
  kn_graph_keep(g, y);
  char err[256];
  assert_int_equal(kn_graph_compile(g, 4, NULL, err, sizeof err), KN_OK);
  int nd, yd[KN_MAX_DIMS];
  kn_node_shape(g, y, &nd, yd);
  const int OH = 4, OW = 3; /* ceil(7/2), ceil(6/2) */
  assert_int_equal(yd[1], OH);
  assert_int_equal(yd[2], OW);
  float *xv = kn_node_data(g, x);
  kn_rng rng;
  kn_rng_seed(&rng, 2);
  for (int i = 0; i < B * H * W * C; i++) xv[i] = kn_rng_uniform(&rng) - 0.5f;
  assert_int_equal(kn_graph_run(g, KN_RUN_FORWARD, B, err, sizeof err), KN_OK);
  const float *wv = kn_node_data(g, w), *out = kn_node_data(g, y);
  /* TF same padding: total (OH-1)*S + K - H = 2, top 1; width: 2*2+3-6 = 1, left 0. */
  const int pt = 1, pl = 0;
  for (int b = 0; b < B; b++)
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++)
        for (int f = 0; f < Fo; f++) {
          double acc = 0.0;
          for (int ki = 0; ki < K; ki++)
            for (int kj = 0; kj < K; kj++)
              for (int c = 0; c < C; c++) {
                int ih = oh * S - pt + ki, iw = ow * S - pl + kj;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += (double)xv[((b * H + ih) * W + iw) * C + c] *
                       wv[((ki * K + kj) * C + c) * Fo + f];
              }
          assert_float_equal(out[((b * OH + oh) * OW + ow) * Fo + f], acc, 1e-5);
        }
  kn_graph_free(g);
}

static void pools_and_top_k_give_known_values(void **state) {
  (void)state;
  kn_graph *g = kn_graph_new();
  int xd[4] = {2, 2, 4, 1}, ld[2] = {2, 3}; /* one batch of 2 for every input */
  kn_node x = kn_input(g, "x", KN_F32, 4, xd);
  kn_window w = {2, 2, 2, 2, 1, 1, KN_PAD_VALID};
  kn_node mx = kn_max_pool2d(g, x, &w), av = kn_avg_pool2d(g, x, &w);
  kn_node logits = kn_input(g, "l", KN_F32, 2, ld);
  kn_node labels = kn_input(g, "y", KN_I32, 1, ld);
  kn_node top1 = kn_top_k_accuracy(g, logits, labels, 1);
  kn_node top2 = kn_top_k_accuracy(g, logits, labels, 2);
  kn_node keep[] = {mx, av, top1, top2};
  for (int i = 0; i < 4; i++) kn_graph_keep(g, keep[i]);
  char err[256];
  assert_int_equal(kn_graph_compile(g, 1, NULL, err, sizeof err), KN_OK);
  const float xs[16] = {1, 5, 2, 0, 3, -1, 8, 4, 0, 0, 0, 0, 0, 0, 0, 0};
  memcpy(kn_node_data(g, x), xs, sizeof xs);
  const float ls[6] = {0.1f, 0.7f, 0.2f, 0.5f, 0.1f, 0.4f};
  memcpy(kn_node_data(g, logits), ls, sizeof ls);
  int32_t ys[2] = {2, 1}; /* row 0: label ranked 2nd; row 1: ranked 3rd */
  memcpy(kn_node_data(g, labels), ys, sizeof ys);
  assert_int_equal(kn_graph_run(g, KN_RUN_FORWARD, 2, err, sizeof err), KN_OK);
  const float *m = kn_node_data(g, mx), *a = kn_node_data(g, av);
  assert_float_equal(m[0], 5, 0);
  assert_float_equal(m[1], 8, 0);
  assert_float_equal(a[0], 2, 1e-6);
  assert_float_equal(a[1], 3.5, 1e-6);
  assert_float_equal(*(float *)kn_node_data(g, top1), 0.0, 0);
  assert_float_equal(*(float *)kn_node_data(g, top2), 0.5, 0);
  kn_graph_free(g);
}

/* An average pool and its gradient against their definitions, bit for
 * bit: y sums the window's cells (rows, then columns) from +0 and scales
 * by 1 / (cells counted); dx adds dy * that factor from +0, window after
 * window in output order. Windows with padding, strides, a last window
 * that runs past the edge, and channel counts around the 16-wide
 * vectors, on 1 and 2 threads. */
static void average_pools_match_their_definition_exactly(void **state) {
  (void)state;
  const struct {
    int h, w, c, kh, kw, sh, sw;
    kn_padding pad;
  } cases[] = {{7, 7, 32, 3, 3, 1, 1, KN_PAD_SAME},  {9, 6, 19, 3, 3, 2, 2, KN_PAD_SAME},
               {8, 8, 16, 2, 2, 2, 2, KN_PAD_VALID}, {5, 7, 35, 3, 2, 2, 1, KN_PAD_SAME},
               {6, 5, 3, 2, 3, 1, 2, KN_PAD_VALID},  {4, 4, 1, 3, 3, 3, 3, KN_PAD_SAME},
               {7, 6, 12, 3, 3, 2, 2, KN_PAD_SAME},  {6, 6, 6, 3, 3, 1, 1, KN_PAD_SAME},
               {5, 6, 8, 2, 2, 2, 2, KN_PAD_VALID}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    for (int threads = 1; threads <= 2; threads++) {
      const int B = 3, H = cases[k].h, W = cases[k].w, C = cases[k].c;
      kn_graph *g = kn_graph_new();
      int xd[4] = {B, H, W, C};
      kn_node x = kn_param(g, "x", 4, xd, KN_INIT_ZEROS);
      kn_window win = {cases[k].kh, cases[k].kw, cases[k].sh, cases[k].sw, 1, 1, cases[k].pad};
      kn_node y = kn_avg_pool2d(g, x, &win);
      int nd, yd[KN_MAX_DIMS];
      kn_node_shape(g, y, &nd, yd);
      kn_node r = kn_param(g, "r", 4, yd, KN_INIT_ZEROS);
      kn_node loss = kn_sum(g, kn_mul(g, y, r), -1, 0);
      kn_graph_keep(g, y);
      char err[256];
      if (kn_autodiff(g, loss, err, sizeof err)) fail_msg("autodiff: %s", err);
      kn_graph_set_threads(g, threads);
      if (kn_graph_compile(g, 1, NULL, err, sizeof err)) fail_msg("compile: %s", err);
      const int OH = yd[1], OW = yd[2];
      const size_t nx = (size_t)B * H * W * C, ny = (size_t)B * OH * OW * C;
      float *xv = kn_node_data(g, x), *rv = kn_node_data(g, r);
      kn_rng rng;
      kn_rng_seed(&rng, 5 + (uint64_t)k);
      for (size_t i = 0; i < nx; i++) xv[i] = (float)(2.0 * kn_rng_uniform(&rng) - 1.0);
      for (size_t i = 0; i < ny; i++) rv[i] = (float)(2.0 * kn_rng_uniform(&rng) - 1.0);
      if (kn_graph_run(g, KN_RUN_TRAIN, B, err, sizeof err)) fail_msg("run: %s", err);
      /* the padding before the first row and column, as "same" places it */
      const int pt = cases[k].pad == KN_PAD_SAME
                         ? ((OH - 1) * cases[k].sh + cases[k].kh - H > 0
                                ? ((OH - 1) * cases[k].sh + cases[k].kh - H) / 2
                                : 0)
                         : 0;
      const int pl = cases[k].pad == KN_PAD_SAME
                         ? ((OW - 1) * cases[k].sw + cases[k].kw - W > 0
                                ? ((OW - 1) * cases[k].sw + cases[k].kw - W) / 2
                                : 0)
                         : 0;
      float *want_dx = calloc(nx, sizeof *want_dx);
      const float *got_y = kn_node_data(g, y);
      for (int b = 0; b < B; b++)
        for (int oh = 0; oh < OH; oh++)
          for (int ow = 0; ow < OW; ow++) {
            const int h0 = oh * cases[k].sh - pt, w0 = ow * cases[k].sw - pl;
            const int hlo = h0 < 0 ? 0 : h0, hhi = h0 + cases[k].kh > H ? H : h0 + cases[k].kh;
            const int wlo = w0 < 0 ? 0 : w0, whi = w0 + cases[k].kw > W ? W : w0 + cases[k].kw;
            const float inv = 1.0f / (float)((hhi - hlo) * (whi - wlo));
            for (int c = 0; c < C; c++) {
              const size_t o = (((size_t)b * OH + oh) * OW + ow) * C + c;
              float sum = 0.0f;
              for (int ih = hlo; ih < hhi; ih++)
                for (int iw = wlo; iw < whi; iw++) {
                  const size_t at = (((size_t)b * H + ih) * W + iw) * C + c;
                  sum += xv[at];
                  want_dx[at] += rv[o] * inv;
                }
              if (memcmp(&got_y[o], &(float){sum * inv}, sizeof(float)) != 0)
                fail_msg("case %zu, %d thread(s): y[%zu] = %.9g, want %.9g", k, threads, o,
                         got_y[o], sum * inv);
            }
          }
      assert_int_equal(kn_param_node(g, 0), x); /* x's gradient comes first */
      const float *got_dx = kn_grads(g);
      for (size_t i = 0; i < nx; i++)
        if (memcmp(&got_dx[i], &want_dx[i], sizeof(float)) != 0)
          fail_msg("case %zu, %d thread(s): dx[%zu] = %.9g, want %.9g", k, threads, i, got_dx[i],
                   want_dx[i]);
      free(want_dx);
      kn_graph_free(g);
    }
  }
}

/* The cast kernels mixed_bfloat16 runs (f32 -> bf16 -> f32, on the pool
 * and vectorized) against kn_convert's element-by-element rounding, bit
 * for bit: ties to even, subnormals kept, infinities, NaN quieted, values
 * that round up to infinity, on 1 and 2 threads. */
static void bf16_casts_round_as_the_definition(void **state) {
  (void)state;
  enum { N = 70001 }; /* past the size the pool takes, and not a vector multiple */
  const uint32_t special[] = {0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u, 0x3f80ffffu,
                              0x00000001u, 0x807fffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u,
                              0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x3effff80u};
  float *x = malloc(N * sizeof *x), *want = malloc(N * sizeof *want);
  uint16_t *narrow = malloc(N * sizeof *narrow);
  kn_rng rng;
  kn_rng_seed(&rng, 3);
  for (int i = 0; i < N; i++) {
    uint32_t u = i < (int)(sizeof special / sizeof special[0])
                     ? special[i]
                     : (uint32_t)(kn_rng_uniform(&rng) * 4294967296.0);
    memcpy(&x[i], &u, sizeof u);
  }
  /* the specials' bf16, worked by hand */
  const uint16_t special_bf16[] = {0x0000, 0x8000, 0x3f80, 0x3f82, 0x3f81, 0x0000, 0x8080, 0x7f80,
                                   0xff80, 0x7f80, 0xff80, 0x7fc0, 0x7fc0, 0xffff, 0x3f00};
  kn_convert(KN_F32, x, KN_BF16, narrow, N);
  kn_convert(KN_BF16, narrow, KN_F32, want, N);
  for (size_t i = 0; i < sizeof special_bf16 / sizeof special_bf16[0]; i++)
    if (narrow[i] != special_bf16[i])
      fail_msg("bf16 of 0x%08x is 0x%04x, want 0x%04x", special[i], narrow[i], special_bf16[i]);
  for (int threads = 1; threads <= 2; threads++) {
    kn_graph *g = kn_graph_new();
    int d[2] = {N, 1};
    kn_node in = kn_input(g, "x", KN_F32, 2, d);
    kn_node h = kn_cast(g, in, KN_BF16), back = kn_cast(g, h, KN_F32);
    kn_graph_keep(g, h);
    kn_graph_keep(g, back);
    kn_graph_set_threads(g, threads);
    char err[256];
    if (kn_graph_compile(g, 1, NULL, err, sizeof err)) fail_msg("compile: %s", err);
    memcpy(kn_node_data(g, in), x, N * sizeof *x);
    if (kn_graph_run(g, KN_RUN_FORWARD, N, err, sizeof err)) fail_msg("run: %s", err);
    const uint16_t *got_h = kn_node_data(g, h);
    const float *got = kn_node_data(g, back);
    for (int i = 0; i < N; i++) {
      if (got_h[i] != narrow[i])
        fail_msg("%d thread(s): bf16 of 0x%08x is 0x%04x, want 0x%04x", threads,
                 *(const uint32_t *)(const void *)&x[i], got_h[i], narrow[i]);
      if (memcmp(&got[i], &want[i], sizeof got[i]) != 0)
        fail_msg("%d thread(s): element %d widened differently", threads, i);
    }
    kn_graph_free(g);
  }
  free(x);
  free(want);
  free(narrow);
}

static void initializers_have_keras_scales(void **state) {
  (void)state;
  enum { N = 200000 };
  float *v = malloc(N * sizeof *v);
  kn_rng rng;
  kn_rng_seed(&rng, 9);
  const struct {
    kn_init init;
    double var;
  } cases[] = {{KN_INIT_GLOROT_UNIFORM, 2.0 / 300},
               {KN_INIT_GLOROT_NORMAL, 2.0 / 300},
               {KN_INIT_HE_UNIFORM, 2.0 / 100},
               {KN_INIT_HE_NORMAL, 2.0 / 100}};
  for (int c = 0; c < 4; c++) {
    kn_init_fill(cases[c].init, v, N, 100, 200, &rng);
    double sum = 0, sq = 0, maxabs = 0;
    for (int i = 0; i < N; i++) {
      sum += v[i];
      sq += (double)v[i] * v[i];
      maxabs = fabs(v[i]) > maxabs ? fabs(v[i]) : maxabs;
    }
    double var = sq / N - (sum / N) * (sum / N);
    assert_float_equal(var / cases[c].var, 1.0, 0.02);
    /* uniform: |v| <= sqrt(3 var); truncated normal: |v| <= 2 stddev / 0.8796 */
    double bound = (c % 2 == 0) ? sqrt(3 * cases[c].var) : 2 * sqrt(cases[c].var) / 0.8796;
    assert_true(maxabs <= bound * 1.0001);
  }
  kn_init_fill(KN_INIT_ONES, v, 4, 1, 1, &rng);
  assert_float_equal(v[3], 1.0, 0);
  free(v);
}

static void dtypes_convert_with_rounding_and_devices_parse(void **state) {
  (void)state;
  const float src[6] = {1.0f, -2.5f, 65504.0f, 1e-8f, 3.14159265f, 70000.0f};
  uint16_t h[6];
  float back[6];
  kn_convert(KN_F32, src, KN_F16, h, 6);
  kn_convert(KN_F16, h, KN_F32, back, 6);
  assert_int_equal(h[0], 0x3c00);
  assert_int_equal(h[1], 0xc100);
  assert_int_equal(h[2], 0x7bff);           /* f16 max */
  assert_float_equal(back[3], 0.0, 6e-8);   /* below the smallest subnormal / 2 */
  assert_float_equal(back[4], 3.140625, 0); /* nearest f16 */
  assert_int_equal(h[5], 0x7c00);           /* overflow -> inf */
  kn_convert(KN_F32, src, KN_BF16, h, 6);
  kn_convert(KN_BF16, h, KN_F32, back, 6);
  assert_int_equal(h[0], 0x3f80);
  assert_float_equal(back[4], 3.140625, 0);
  uint8_t u[3];
  const float s8[3] = {-4.0f, 127.6f, 300.0f};
  kn_convert(KN_F32, s8, KN_U8, u, 3);
  assert_int_equal(u[0], 0);
  assert_int_equal(u[1], 128);
  assert_int_equal(u[2], 255);
  assert_string_equal(kn_dtype_name(KN_BF16), "bf16");

  kn_device dev;
  char err[128], buf[32];
  assert_int_equal(kn_device_parse("cuda:3", &dev, err, sizeof err), KN_OK);
  assert_int_equal(dev.kind, KN_DEVICE_CUDA);
  assert_int_equal(dev.index, 3);
  kn_device_format(dev, buf, sizeof buf);
  assert_string_equal(buf, "cuda:3");
  assert_int_equal(kn_device_parse("cpu", &dev, err, sizeof err), KN_OK);
  assert_int_equal(dev.kind, KN_DEVICE_CPU);
  assert_int_equal(kn_device_parse("gpu0", &dev, err, sizeof err), KN_EINVAL);
  assert_string_equal(err, "device: expected \"cpu\", \"cuda\" or \"cuda:N\", got \"gpu0\"");
}

static void bad_layer_graphs_are_refused_with_the_layer(void **state) {
  (void)state;
  kn_layer_config layers[2] = {
      {.type = KN_LAYER_FLATTEN, .name = "f"},
      {.type = KN_LAYER_ADD, .name = "res", .n_inputs = 2, .inputs = {0, 1}}};
  kn_model_config cfg = {
      .input_ndim = 1, .input_shape = {4}, .n_layers = 2, .layers = layers, .batch_size = 2};
  kn_model m;
  char err[512];
  assert_int_equal(kn_model_build(&cfg, &m, err, sizeof err), KN_EINVAL);
  assert_string_equal(err, "layer 1 (res): input 1 must be an earlier layer (or -1, the model "
                           "input), got 1");
  kn_layer_config conv[1] = {
      {.type = KN_LAYER_CONV2D, .name = "c", .filters = 2, .kernel_size = {3, 3}}};
  cfg.layers = conv;
  cfg.n_layers = 1;
  assert_int_equal(kn_model_build(&cfg, &m, err, sizeof err), KN_EINVAL);
  assert_string_equal(err, "layer 0 (c): conv2d needs an image input (height, width, channels), "
                           "got (4)");
  kn_layer_config big[2] = {
      {.type = KN_LAYER_CONV2D, .name = "c", .filters = 2, .kernel_size = {5, 5}},
      {.type = KN_LAYER_FLATTEN, .name = "f"}};
  cfg.layers = big;
  cfg.n_layers = 2;
  cfg.input_ndim = 3;
  cfg.input_shape[0] = 3;
  cfg.input_shape[1] = 3;
  cfg.input_shape[2] = 1;
  assert_int_equal(kn_model_build(&cfg, &m, err, sizeof err), KN_EINVAL);
  assert_string_equal(err, "conv2d: a window of 5 (kernel 5, dilation 1) does not fit an input of "
                           "3 with valid padding");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(cnn_with_every_layer_type_matches_finite_differences),
      cmocka_unit_test(batch_norm_relu_backward_matches_finite_differences),
      cmocka_unit_test(layers_use_keras_parameter_names_and_shapes),
      cmocka_unit_test(batch_norm_moves_statistics_and_infers_with_them),
      cmocka_unit_test(batch_norm_statistics_keep_their_precision_far_from_zero),
      cmocka_unit_test(batch_norm_gives_the_same_bits_on_any_thread_count),
      cmocka_unit_test(batch_norm_over_any_channel_count_matches_the_double_reference),
      cmocka_unit_test(depthwise_gives_the_same_bits_on_any_thread_count),
      cmocka_unit_test(dropout_drops_at_its_rate_only_in_training),
      cmocka_unit_test(conv2d_matches_a_direct_loop),
      cmocka_unit_test(depthwise_multipliers_match_a_direct_loop),
      cmocka_unit_test(pools_and_top_k_give_known_values),
      cmocka_unit_test(average_pools_match_their_definition_exactly),
      cmocka_unit_test(bf16_casts_round_as_the_definition),
      cmocka_unit_test(initializers_have_keras_scales),
      cmocka_unit_test(dtypes_convert_with_rounding_and_devices_parse),
      cmocka_unit_test(bad_layer_graphs_are_refused_with_the_layer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
