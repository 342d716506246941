/* Runs that go numerically wrong: mixed_float16's dynamic loss scaling has
 * a floor, counts its skipped steps and fails a run whose steps keep being
 * skipped, instead of reporting a loss of 0 and succeeding; and NaN passes
 * through every relu (alone, fused into a GEMM's epilogue or an
 * elementwise op, as a gradient mask, before a max pool) on every CPU path
 * and GEMM, as in PyTorch, so a float32 run that produces one fails at
 * that step instead of training on zeros. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine.h"
#include "train_state.h"

#define CLASSES  3
#define FEATURES 8

/* Three blobs, class c centred at +2 on feature c, every value times
 * scale (x 1e6 the gradients overflow float16, whose largest value is
 * 65504; x inf the loss is not finite either). */
static kn_dataset make_blobs(int64_t n, uint64_t seed, float scale) {
  kn_dataset ds = {
      .n = n, .ndim = 1, .shape = {FEATURES}, .example_size = FEATURES, .n_classes = CLASSES};
  ds.x = malloc((size_t)n * FEATURES * sizeof(float));
  ds.y = malloc((size_t)n * sizeof(int32_t));
  kn_rng rng;
  kn_rng_seed(&rng, seed);
  for (int64_t i = 0; i < n; i++) {
    int c = (int)kn_rng_below(&rng, CLASSES);
    ds.y[i] = c;
    for (int f = 0; f < FEATURES; f++) {
      float noise = kn_rng_uniform(&rng) + kn_rng_uniform(&rng) - 1.0f;
      ds.x[i * FEATURES + f] = isinf(scale) ? scale : scale * (noise + (f == c ? 2.0f : 0.0f));
    }
  }
  return ds;
}

/* A softmax regression (one dense layer, no activation) in precision. */
static kn_model make_linear(kn_precision precision, int batch) {
  static const kn_layer_config layers[1] = {
      {.type = KN_LAYER_DENSE, .name = "out", .units = CLASSES, .use_bias = 1}};
  kn_model_config cfg = {.input_ndim = 1,
                         .input_shape = {FEATURES},
                         .n_layers = 1,
                         .layers = layers,
                         .batch_size = batch,
                         .precision = precision};
  kn_model m;
  char err[256];
  assert_int_equal(kn_model_build(&cfg, &m, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(m.graph, 17, NULL, err, sizeof err), KN_OK);
  return m;
}

static kn_train_config config(int epochs) {
  kn_train_config tc = {
      .epochs = epochs, .batch_size = 32, .shuffle = 1, .seed = 5, .log_every_steps = 1};
  tc.optimizer = (kn_optimizer_config){.type = KN_OPT_SGD, .learning_rate = 0.1f};
  return tc;
}

static double metric(const kn_train_event *ev, const char *name) {
  for (int i = 0; i < ev->n_metrics; i++)
    if (strcmp(ev->names[i], name) == 0) return ev->values[i];
  return NAN;
}

/* What a run reported. */
typedef struct seen {
  int steps, epochs;
  int64_t last_step;
  double min_scale;
  double last_skipped;     /* skipped_steps in the last step event */
  int skipped_decreased;   /* skipped_steps went down between two events */
  int steps_without_count; /* step events without skipped_steps */
  int zero_losses;         /* loss or epoch_loss reported as 0 */
  int non_finite;          /* a metric that is not a finite number */
  int epochs_with_loss;
} seen;

static int watch(const kn_train_event *ev, void *user) {
  seen *s = user;
  if (ev->kind != KN_EVENT_STEP && ev->kind != KN_EVENT_EPOCH) return 0;
  for (int i = 0; i < ev->n_metrics; i++) s->non_finite += !isfinite(ev->values[i]);
  const double loss = metric(ev, ev->kind == KN_EVENT_STEP ? "loss" : "epoch_loss");
  s->zero_losses += loss == 0.0;
  const double skipped = metric(ev, "skipped_steps");
  if (ev->kind == KN_EVENT_EPOCH) {
    s->epochs++;
    s->epochs_with_loss += !isnan(loss);
    return 0;
  }
  s->steps++;
  s->last_step = ev->step;
  const double scale = metric(ev, "loss_scale");
  if (s->steps == 1 || scale < s->min_scale) s->min_scale = scale;
  if (isnan(skipped)) {
    s->steps_without_count++;
  } else {
    if (skipped < s->last_skipped) s->skipped_decreased = 1;
    s->last_skipped = skipped;
  }
  return 0;
}

/* Halving on every overflow stops at 1, as Keras's LossScaleOptimizer
 * does: below 1 the scale shrinks gradients instead of protecting them. */
static void loss_scale_never_falls_below_one(void **state) {
  (void)state;
  kn_loss_scaler s;
  kn_loss_scaler_init(&s, 0, 0);
  assert_true(s.scale == 32768.0);
  for (int i = 0; i < 40; i++) kn_loss_scaler_update(&s, 0);
  assert_true(s.scale == 1.0);
  assert_int_equal(s.skipped, 40);
  /* It grows again from there after the interval. */
  for (int i = 0; i < 2000; i++) kn_loss_scaler_update(&s, 1);
  assert_true(s.scale == 2.0);
}

/* 25 epochs of 8 steps of mixed_float16 on blobs times scale, every step
 * logged. */
static int train_diverging(float scale, seen *s, char *err, size_t errlen) {
  kn_dataset train = make_blobs(256, 3, scale);
  kn_model m = make_linear(KN_PRECISION_MIXED_FLOAT16, 32);
  kn_train_config tc = config(25); /* 200 steps, far more than any bound on skips */
  const int rc = kn_train(&m, &train, NULL, &tc, watch, s, err, errlen);
  print_message("inputs x %g: rc %d: %s\n", (double)scale, rc, err);
  print_message("%d step events (last step %lld), %d epochs (%d with a loss), loss_scale down "
                "to %g, skipped_steps %g\n",
                s->steps, (long long)s->last_step, s->epochs, s->epochs_with_loss, s->min_scale,
                s->last_skipped);
  kn_model_free(&m);
  kn_dataset_free(&train);
  return rc;
}

/* Gradients that overflow float16 on every step, however far the scale
 * falls: the run must fail with a numeric error that names the step and
 * the skips in a row, having counted them as it went, with the scale held
 * at its floor. */
static void a_mixed_float16_run_whose_gradients_keep_overflowing_fails(void **state) {
  (void)state;
  seen s = {0};
  char err[512] = "";
  assert_int_equal(train_diverging(1e6f, &s, err, sizeof err), KN_ENUMERIC);
  assert_non_null(strstr(err, "skipped"));
  assert_non_null(strstr(err, "in a row"));
  char at[64];
  snprintf(at, sizeof at, "step %lld", (long long)s.last_step + 1);
  assert_non_null(strstr(err, at)); /* the step that failed: the one after the last reported */
  assert_true(s.steps > 0 && s.steps < 200);
  assert_int_equal(s.steps_without_count, 0);
  assert_false(s.skipped_decreased);
  assert_true(s.last_skipped == (double)s.last_step); /* every step so far */
  assert_true(s.min_scale >= 1.0);
  assert_int_equal(s.non_finite, 0);
}

/* A loss that is never finite: no step is tallied, so no step or epoch
 * may report a loss (or accuracy) of 0 as if it had been one; and the run
 * fails as above. */
static void epochs_whose_every_loss_was_non_finite_report_no_loss(void **state) {
  (void)state;
  seen s = {0};
  char err[512] = "";
  const int rc = train_diverging(INFINITY, &s, err, sizeof err);
  assert_true(s.epochs > 0);
  assert_int_equal(s.zero_losses, 0);
  assert_int_equal(s.epochs_with_loss, 0); /* no step had a loss to average */
  assert_int_equal(s.non_finite, 0);       /* progress lines carry finite numbers only */
  assert_int_equal(rc, KN_ENUMERIC);
  assert_non_null(strstr(err, "in a row"));
  assert_true(s.last_skipped == (double)s.last_step);
}

/* The same data trains in float32, where nothing overflows, and a healthy
 * mixed_float16 run reports skipped_steps beside loss_scale. */
static void a_healthy_mixed_float16_run_reports_its_skipped_steps(void **state) {
  (void)state;
  kn_dataset train = make_blobs(256, 3, 1.0f);
  kn_model m = make_linear(KN_PRECISION_MIXED_FLOAT16, 32);
  kn_train_config tc = config(2);
  tc.initial_loss_scale = 0x1p24; /* overflows at first: a few steps are skipped */
  seen s = {0};
  char err[512] = "";
  assert_int_equal(kn_train(&m, &train, NULL, &tc, watch, &s, err, sizeof err), KN_OK);
  assert_int_equal(s.steps, 16);
  assert_int_equal(s.steps_without_count, 0);
  assert_true(s.last_skipped > 0 && s.last_skipped < 16);
  assert_int_equal(s.epochs_with_loss, 2);
  assert_int_equal(s.zero_losses, 0);
  kn_model_free(&m);
  kn_dataset_free(&train);
}

/* The bound is the job's to set: 3 skips in a row end the run at step 3. */
static void the_bound_on_skipped_steps_is_configurable(void **state) {
  (void)state;
  kn_dataset train = make_blobs(256, 3, 1e6f);
  kn_model m = make_linear(KN_PRECISION_MIXED_FLOAT16, 32);
  kn_train_config tc = config(2);
  tc.loss_scale_max_skipped_steps = 3;
  seen s = {0};
  char err[512] = "";
  assert_int_equal(kn_train(&m, &train, NULL, &tc, watch, &s, err, sizeof err), KN_ENUMERIC);
  assert_non_null(strstr(err, "3 steps in a row were skipped"));
  assert_non_null(strstr(err, "up to step 3 (epoch 1)"));
  assert_int_equal(s.steps, 2);
  tc.loss_scale_max_skipped_steps = -1;
  assert_int_equal(kn_train(&m, &train, NULL, &tc, NULL, NULL, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "loss_scale_max_skipped_steps"));
  kn_model_free(&m);
  kn_dataset_free(&train);
}

/* A checkpoint keeps the skipped steps, in all and in a row, so a resumed
 * run reports the same count and fails at the same step. */
static void the_training_state_keeps_the_skipped_steps(void **state) {
  (void)state;
  char dir[] = "/tmp/kiln-test-numerics-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[600];
  snprintf(path, sizeof path, "%s/ckpt-00000007.state", dir);
  kn_optimizer_config oc = {.type = KN_OPT_SGD, .learning_rate = 0.1f};
  kn_optimizer *opt = NULL;
  char err[512] = "";
  assert_int_equal(kn_optimizer_new(&oc, 4, &opt, err, sizeof err), KN_OK);
  kn_train_state st = {.step = 7,
                       .loss_scale = 2.0,
                       .loss_scale_good_steps = 1,
                       .loss_scale_skipped = 5,
                       .loss_scale_skipped_in_a_row = 2};
  assert_int_equal(kn_train_state_write(path, &st, opt, err, sizeof err), KN_OK);
  kn_train_state back = {0};
  assert_int_equal(kn_train_state_read(path, &back, opt, err, sizeof err), KN_OK);
  assert_int_equal(back.step, 7);
  assert_true(back.loss_scale == 2.0);
  assert_int_equal(back.loss_scale_good_steps, 1);
  assert_int_equal(back.loss_scale_skipped, 5);
  assert_int_equal(back.loss_scale_skipped_in_a_row, 2);
  kn_optimizer_free(opt);
  assert_int_equal(unlink(path), 0);
  assert_int_equal(rmdir(dir), 0);
}

/* ---- NaN through relu ---- */

/* Images of 4x4 pixels and 19 channels (vector bodies and tails of the
 * 16- and 8-lane paths); the NaN sits in image 0 at row 1, column 1,
 * channel 5: the last cell of its 2x2 pool window. */
enum { NB = 2, NH = 4, NW = 4, NC = 19, NF = 19, NAN_CHANNEL = 5 };
#define NAN_AT ((size_t)((0 * NH + 1) * NW + 1) * NC + NAN_CHANNEL)
#define PIXELS ((size_t)NB * NH * NW * NC)

typedef struct nan_graph {
  kn_graph *g;
  kn_node x, x2, loss;
  /* relu outputs kept for reading: a dense layer's fused GEMM epilogue, a
   * convolution's, relu fused into add, bias_add, a broadcast multiply and
   * batch norm's apply, relu alone, and a max pool reading that relu */
  kn_node dense, conv, add, bias, mul, bn, relu, pool;
  kn_node p, q; /* (1, 2, 2, NC) parameters whose relu and pooled relu train */
  kn_plan_stats st;
} nan_graph;

static uint64_t nan_lcg = 99;
static float uniform_pm1(void) {
  nan_lcg = nan_lcg * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)((nan_lcg >> 40) / (double)(1u << 24)) * 2.0f - 1.0f;
}

static kn_node kept(kn_graph *g, kn_node n) {
  kn_graph_keep(g, n);
  return n;
}

/* Builds and compiles the cases under passes, with every parameter
 * uniform in [-1, 1) and the NaN placed in x, p and q. */
static nan_graph build_nan_graph(unsigned passes) {
  nan_graph c = {.g = kn_graph_new()};
  kn_graph *g = c.g;
  kn_graph_set_passes(g, passes);
  int xd[4] = {NB, NH, NW, NC}, flat[2] = {NB, NH * NW * NC}, wd[2] = {NH * NW * NC, NF};
  int fd[1] = {NF}, cd[1] = {NC}, kd[4] = {3, 3, NC, NF}, pd[4] = {1, 2, 2, NC};
  c.x = kn_input(g, "x", KN_F32, 4, xd);
  c.x2 = kn_input(g, "x2", KN_F32, 4, xd);
  kn_node w = kn_param(g, "w", 2, wd, KN_INIT_ZEROS), b = kn_param(g, "b", 1, fd, KN_INIT_ZEROS);
  c.dense =
      kept(g, kn_relu(g, kn_bias_add(g, kn_matmul(g, kn_reshape(g, c.x, 2, flat), w, 0, 0), b)));
  kn_window same = {3, 3, 1, 1, 1, 1, KN_PAD_SAME};
  kn_node k = kn_param(g, "k", 4, kd, KN_INIT_ZEROS), kb = kn_param(g, "kb", 1, fd, KN_INIT_ZEROS);
  c.conv = kept(g, kn_relu(g, kn_bias_add(g, kn_conv2d(g, c.x, k, &same), kb)));
  c.add = kept(g, kn_relu(g, kn_add(g, c.x, c.x2)));
  c.bias = kept(g, kn_relu(g, kn_bias_add(g, c.x, kn_param(g, "bc", 1, cd, KN_INIT_ZEROS))));
  c.mul = kept(g, kn_relu(g, kn_mul(g, c.x, kn_param(g, "s", 1, cd, KN_INIT_ZEROS))));
  kn_node mm = kn_state(g, "mm", 1, cd, KN_INIT_ZEROS), mv = kn_state(g, "mv", 1, cd, KN_INIT_ONES);
  c.bn = kept(g, kn_relu(g, kn_batch_norm(g, c.x, kn_param(g, "gamma", 1, cd, KN_INIT_ZEROS),
                                          kn_param(g, "beta", 1, cd, KN_INIT_ZEROS), mm, mv, 0.99f,
                                          1e-3f)));
  kn_window pool = {2, 2, 2, 2, 1, 1, KN_PAD_VALID};
  c.relu = kept(g, kn_relu(g, c.x));
  c.pool = kept(g, kn_max_pool2d(g, c.relu, &pool));
  /* Trained: relu(p) and the pool of relu(q), weighted so each gradient
   * is known: 0.75 through relu, 0.5 through the pool. */
  c.p = kn_param(g, "p", 4, pd, KN_INIT_ZEROS);
  c.q = kn_param(g, "q", 4, pd, KN_INIT_ZEROS);
  int one[4] = {1, 1, 1, NC};
  kn_node through_relu = kn_sum(g, kn_mul(g, kn_relu(g, c.p), kn_constant(g, 4, pd, 0.75f)), -1, 0);
  kn_node through_pool = kn_sum(
      g, kn_mul(g, kn_max_pool2d(g, kn_relu(g, c.q), &pool), kn_constant(g, 4, one, 0.5f)), -1, 0);
  c.loss = kept(g, kn_add(g, through_relu, through_pool));
  char err[512] = "";
  if (kn_graph_error(g, err, sizeof err)) fail_msg("build: %s", err);
  if (kn_autodiff(g, c.loss, err, sizeof err)) fail_msg("autodiff: %s", err);
  if (kn_graph_compile(g, 1, &c.st, err, sizeof err)) fail_msg("compile: %s", err);
  nan_lcg = 99;
  float *params = kn_params(g);
  for (size_t i = 0; i < kn_param_count(g); i++) params[i] = uniform_pm1();
  params[kn_param_offset(g, c.p) + 3 * NC + NAN_CHANNEL] = NAN;
  params[kn_param_offset(g, c.q) + 3 * NC + NAN_CHANNEL] = NAN;
  float *x = kn_node_data(g, c.x), *x2 = kn_node_data(g, c.x2);
  for (size_t i = 0; i < PIXELS; i++) {
    x[i] = uniform_pm1();
    x2[i] = uniform_pm1();
  }
  x[NAN_AT] = NAN;
  return c;
}

/* Elements of out (count) that are NaN, and whether element `at` is. */
static size_t count_nan(const float *out, size_t count) {
  size_t n = 0;
  for (size_t i = 0; i < count; i++) n += isnan(out[i]) != 0;
  return n;
}

static void check_elementwise(nan_graph *c, kn_node n, const char *what) {
  const float *y = kn_node_data(c->g, n);
  if (!isnan(y[NAN_AT]))
    fail_msg("%s: relu(NaN) gave %g at the NaN's element, want NaN", what, (double)y[NAN_AT]);
  if (count_nan(y, PIXELS) != 1)
    fail_msg("%s: %zu NaN elements, want only the one", what, count_nan(y, PIXELS));
}

/* One training run of the cases on the current ISA path and GEMM, with
 * the passes on (every fusion) or off (relu and its gradient alone). */
static void check_nan_cases(unsigned passes) {
  nan_graph c = build_nan_graph(passes);
  char err[512] = "";
  if (kn_graph_run(c.g, KN_RUN_TRAIN, NB, err, sizeof err)) fail_msg("run: %s", err);
  const char *how = passes ? "passes on" : "passes off";
  print_message("%s: %d GEMM epilogues and elementwise chains fused, %d pools with an argmax\n",
                how, c.st.n_fused, c.st.n_pool_argmax);
  if (passes) {
    assert_true(c.st.n_fused >= 2);       /* the dense and conv epilogues */
    assert_true(c.st.n_pool_argmax >= 1); /* the trained pool's relu mask is in its argmax */
  }
  /* The dense layer: row 0 reads the NaN in every column, row 1 never. */
  const float *dense = kn_node_data(c.g, c.dense);
  for (int j = 0; j < NF; j++) {
    if (!isnan(dense[j]))
      fail_msg("dense %s: column %d of row 0 is %g, want NaN", how, j, (double)dense[j]);
  }
  assert_int_equal(count_nan(dense + NF, NF), 0);
  /* The convolution: every filter at the NaN's pixel (its 3x3 neighbours
   * too), nothing in image 1. */
  const float *conv = kn_node_data(c.g, c.conv);
  const size_t pixel = (size_t)(1 * NW + 1) * NF, image = (size_t)NH * NW * NF;
  for (int f = 0; f < NF; f++)
    if (!isnan(conv[pixel + f]))
      fail_msg("conv %s: filter %d at the NaN's pixel is %g, want NaN", how, f,
               (double)conv[pixel + f]);
  assert_int_equal(count_nan(conv + image, image), 0);
  check_elementwise(&c, c.add, passes ? "add + relu" : "add, relu");
  check_elementwise(&c, c.bias, passes ? "bias_add + relu" : "bias_add, relu");
  check_elementwise(&c, c.mul, passes ? "mul + relu" : "mul, relu");
  check_elementwise(&c, c.relu, "relu");
  /* Batch norm's batch statistics of the NaN's channel are NaN: that
   * channel throughout, no other. */
  const float *bn = kn_node_data(c.g, c.bn);
  for (size_t i = 0; i < PIXELS; i++)
    if ((i % NC == NAN_CHANNEL) != (isnan(bn[i]) != 0))
      fail_msg("batch norm + relu %s: element %zu (channel %zu) is %g", how, i, i % NC,
               (double)bn[i]);
  /* The max pool: the window whose last cell is NaN, and only it. */
  const float *pool = kn_node_data(c.g, c.pool);
  if (!isnan(pool[NAN_CHANNEL]))
    fail_msg("max pool %s: the window holding a NaN gave %g, want NaN", how,
             (double)pool[NAN_CHANNEL]);
  assert_int_equal(count_nan(pool, (size_t)NB * 2 * 2 * NC), 1);
  assert_true(isnan(*(const float *)kn_node_data(c.g, c.loss)));
  /* Gradients: relu's at a NaN input passes dy (PyTorch's threshold_backward:
   * masked only where y <= 0), and the pool's goes to the NaN cell, which
   * holds its maximum, unmasked by the relu folded into it. */
  const float *grads = kn_grads(c.g);
  const float *dp = grads + kn_param_offset(c.g, c.p), *dq = grads + kn_param_offset(c.g, c.q);
  if (!(dp[3 * NC + NAN_CHANNEL] == 0.75f))
    fail_msg("relu gradient %s at a NaN input: %g, want dy = 0.75", how,
             (double)dp[3 * NC + NAN_CHANNEL]);
  for (int cell = 0; cell < 4; cell++) {
    const float want = cell == 3 ? 0.5f : 0.0f, got = dq[cell * NC + NAN_CHANNEL];
    if (!(got == want))
      fail_msg("pool + relu gradient %s, cell %d of the NaN's window: %g, want %g", how, cell,
               (double)got, (double)want);
  }
  kn_graph_free(c.g);
}

/* After each test of a path: the best path and GEMM again, whether the
 * test passed or not. */
static int reset_paths(void **state) {
  (void)state;
  char err[256];
  return kn_cpu_set_isa(KN_ISA_AUTO, err, sizeof err) ||
         kn_cpu_set_gemm(KN_GEMM_AUTO, err, sizeof err);
}

/* The cases on one ISA path with one f32 GEMM, or a visible skip where
 * this CPU (or build) lacks either. */
static void check_nan_path(kn_isa isa, kn_gemm_kind gemm) {
  char err[256] = "";
  if (kn_cpu_set_isa(isa, err, sizeof err) != KN_OK ||
      kn_cpu_set_gemm(gemm, err, sizeof err) != KN_OK) {
    print_message("%s path with the %s GEMM: not on this machine (%s), skipped\n", kn_isa_name(isa),
                  gemm == KN_GEMM_KILN ? "kiln" : "OpenBLAS", err);
    skip();
  }
  print_message("%s path, %s GEMM\n", kn_isa_name(kn_cpu_isa()), kn_gemm_name(kn_cpu_gemm()));
  check_nan_cases(KN_PASS_ALL);
  check_nan_cases(0);
}

static void nan_passes_relu_on_the_baseline_path_with_openblas(void **state) {
  (void)state;
  check_nan_path(KN_ISA_BASELINE, KN_GEMM_OPENBLAS);
}
static void nan_passes_relu_on_the_baseline_path_with_kilns_gemm(void **state) {
  (void)state;
  check_nan_path(KN_ISA_BASELINE, KN_GEMM_KILN);
}
static void nan_passes_relu_on_the_avx2_path_with_openblas(void **state) {
  (void)state;
  check_nan_path(KN_ISA_AVX2, KN_GEMM_OPENBLAS);
}
static void nan_passes_relu_on_the_avx2_path_with_kilns_gemm(void **state) {
  (void)state;
  check_nan_path(KN_ISA_AVX2, KN_GEMM_KILN);
}
static void nan_passes_relu_on_the_avx512_path_with_openblas(void **state) {
  (void)state;
  check_nan_path(KN_ISA_AVX512, KN_GEMM_OPENBLAS);
}
static void nan_passes_relu_on_the_avx512_path_with_kilns_gemm(void **state) {
  (void)state;
  check_nan_path(KN_ISA_AVX512, KN_GEMM_KILN);
}

/* A CNN in mixed_bfloat16 on one example holding a NaN: the bf16 GEMM's
 * epilogue (conv and dense relu), the bf16 pool window and its argmax must
 * carry it to the loss. On the portable bf16 kernel (any ISA path but
 * AVX-512) or the AVX512-BF16 one, skipped where the CPU lacks it. */
static void check_bf16_cnn_of(kn_gemm_kernel kernel, int filters) {
  char err[512] = "";
  assert_int_equal(kn_cpu_set_isa(KN_ISA_AUTO, err, sizeof err), KN_OK);
  if (kernel == KN_GEMM_BF16_PORTABLE && kn_gemm_bf16_kernel() != kernel &&
      kn_cpu_set_isa(KN_ISA_AVX2, err, sizeof err) != KN_OK)
    assert_int_equal(kn_cpu_set_isa(KN_ISA_BASELINE, err, sizeof err), KN_OK);
  if (kn_gemm_bf16_kernel() != kernel) {
    print_message("%s: not on this CPU, skipped\n", kn_gemm_kernel_name(kernel));
    skip();
  }
  const kn_layer_config layers[5] = {
      {.type = KN_LAYER_CONV2D,
       .name = "conv",
       .filters = filters,
       .kernel_size = {3, 3},
       .padding = KN_PAD_SAME,
       .use_bias = 1,
       .activation = KN_ACT_RELU},
      {.type = KN_LAYER_MAX_POOL2D, .name = "pool"},
      {.type = KN_LAYER_FLATTEN, .name = "flatten"},
      {.type = KN_LAYER_DENSE,
       .name = "hidden",
       .units = 16,
       .use_bias = 1,
       .activation = KN_ACT_RELU},
      {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .use_bias = 1}};
  kn_model_config mc = {.input_ndim = 3,
                        .input_shape = {6, 6, 1},
                        .n_layers = 5,
                        .layers = layers,
                        .batch_size = 4,
                        .seed = 1,
                        .precision = KN_PRECISION_MIXED_BFLOAT16};
  kn_model m;
  assert_int_equal(kn_model_build(&mc, &m, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(m.graph, 5, NULL, err, sizeof err), KN_OK);
  float *x = kn_node_data(m.graph, m.x);
  int32_t *y = kn_node_data(m.graph, m.y);
  nan_lcg = 7;
  for (int i = 0; i < 4 * 36; i++) x[i] = uniform_pm1();
  for (int i = 0; i < 4; i++) y[i] = i % 3;
  for (int pass = 0; pass < 2; pass++) {
    if (pass) x[36 + 7] = NAN; /* example 1, row 1, column 1 */
    assert_int_equal(kn_graph_run(m.graph, KN_RUN_TRAIN, 4, err, sizeof err), KN_OK);
    const float loss = *(const float *)kn_node_data(m.graph, m.loss);
    print_message("%s, %d filters, %s: loss %g\n", kn_gemm_kernel_name(kernel), filters,
                  pass ? "a NaN in example 1" : "finite inputs", (double)loss);
    if (pass)
      assert_true(isnan(loss));
    else
      assert_true(isfinite(loss));
  }
  assert_true(kn_graph_gemm_calls(m.graph, kernel) > 0);
  kn_model_free(&m);
}

/* 8 filters: the pool's window one channel at a time; 24: 16 a vector,
 * the last block overlapping the first. */
static void check_bf16_cnn(kn_gemm_kernel kernel) {
  check_bf16_cnn_of(kernel, 8);
  check_bf16_cnn_of(kernel, 24);
}

static void nan_reaches_the_loss_through_the_portable_bf16_gemm(void **state) {
  (void)state;
  check_bf16_cnn(KN_GEMM_BF16_PORTABLE);
}
static void nan_reaches_the_loss_through_the_avx512bf16_gemm(void **state) {
  (void)state;
  check_bf16_cnn(KN_GEMM_BF16_AVX512);
}

/* A float32 model whose only hidden layer is a relu, on data with one NaN
 * feature: the first step's loss is NaN, and the run fails there with the
 * step named, instead of zeroing the NaN, turning the first layer's
 * weights to NaN through its gradient and training on with a finite loss. */
/* A reduce-max over a row that holds a NaN is NaN, as torch.amax, and its
 * gradient goes to the NaN cell, as torch.max(dim): the NaN is not lost
 * behind a larger number that comes after it. */
static void nan_passes_reduce_max_and_its_gradient(void **state) {
  (void)state;
  kn_graph *g = kn_graph_new();
  int xd[2] = {2, 4};
  kn_node x = kn_param(g, "x", 2, xd, KN_INIT_ZEROS);
  kn_node y = kept(g, kn_max(g, x, 1, 0));
  kn_node loss = kn_sum(g, y, -1, 0);
  char err[512] = "";
  assert_int_equal(kn_autodiff(g, loss, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(g, 5, NULL, err, sizeof err), KN_OK);
  const float values[8] = {1, NAN, 3, 2, 5, 1, 2, 0};
  memcpy(kn_params(g), values, sizeof values);
  assert_int_equal(kn_graph_run(g, KN_RUN_TRAIN, 2, err, sizeof err), KN_OK);
  const float *out = kn_node_data(g, y), *dx = kn_grads(g);
  print_message("max %g %g; gradient %g %g %g %g | %g %g %g %g\n", out[0], out[1], dx[0], dx[1],
                dx[2], dx[3], dx[4], dx[5], dx[6], dx[7]);
  assert_true(isnan(out[0]));
  assert_true(out[1] == 5.0f);
  const float want[8] = {0, 1, 0, 0, 1, 0, 0, 0};
  assert_memory_equal(dx, want, sizeof want);
  kn_graph_free(g);
}

static void a_nan_behind_a_relu_fails_a_float32_run_at_its_step(void **state) {
  (void)state;
  static const kn_layer_config layers[2] = {
      {.type = KN_LAYER_DENSE,
       .name = "hidden",
       .units = 16,
       .use_bias = 1,
       .activation = KN_ACT_RELU},
      {.type = KN_LAYER_DENSE, .name = "out", .units = CLASSES, .use_bias = 1}};
  kn_model_config mc = {.input_ndim = 1,
                        .input_shape = {FEATURES},
                        .n_layers = 2,
                        .layers = layers,
                        .batch_size = 32};
  kn_model m;
  char err[512] = "";
  assert_int_equal(kn_model_build(&mc, &m, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(m.graph, 17, NULL, err, sizeof err), KN_OK);
  kn_dataset train = make_blobs(256, 3, 1.0f);
  for (int64_t i = 0; i < train.n; i++) train.x[i * FEATURES + 2] = NAN; /* every batch */
  kn_train_config tc = config(2);
  seen s = {0};
  const int rc = kn_train(&m, &train, NULL, &tc, watch, &s, err, sizeof err);
  print_message("rc %d: %s (%d step events)\n", rc, err, s.steps);
  assert_int_equal(rc, KN_ENUMERIC);
  assert_non_null(strstr(err, "loss became nan at step 1 (epoch 1)"));
  assert_int_equal(s.steps, 0);
  kn_model_free(&m);
  kn_dataset_free(&train);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(loss_scale_never_falls_below_one),
      cmocka_unit_test(a_mixed_float16_run_whose_gradients_keep_overflowing_fails),
      cmocka_unit_test(epochs_whose_every_loss_was_non_finite_report_no_loss),
      cmocka_unit_test(a_healthy_mixed_float16_run_reports_its_skipped_steps),
      cmocka_unit_test(the_bound_on_skipped_steps_is_configurable),
      cmocka_unit_test(the_training_state_keeps_the_skipped_steps),
      cmocka_unit_test_teardown(nan_passes_relu_on_the_baseline_path_with_openblas, reset_paths),
      cmocka_unit_test_teardown(nan_passes_relu_on_the_baseline_path_with_kilns_gemm, reset_paths),
      cmocka_unit_test_teardown(nan_passes_relu_on_the_avx2_path_with_openblas, reset_paths),
      cmocka_unit_test_teardown(nan_passes_relu_on_the_avx2_path_with_kilns_gemm, reset_paths),
      cmocka_unit_test_teardown(nan_passes_relu_on_the_avx512_path_with_openblas, reset_paths),
      cmocka_unit_test_teardown(nan_passes_relu_on_the_avx512_path_with_kilns_gemm, reset_paths),
      cmocka_unit_test_teardown(nan_reaches_the_loss_through_the_portable_bf16_gemm, reset_paths),
      cmocka_unit_test_teardown(nan_reaches_the_loss_through_the_avx512bf16_gemm, reset_paths),
      cmocka_unit_test(nan_passes_reduce_max_and_its_gradient),
      cmocka_unit_test(a_nan_behind_a_relu_fails_a_float32_run_at_its_step),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
