/* Runs that go numerically wrong: mixed_float16's dynamic loss scaling has
 * a floor, counts its skipped steps and fails a run whose steps keep being
 * skipped, instead of reporting a loss of 0 and succeeding. */
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(loss_scale_never_falls_below_one),
      cmocka_unit_test(a_mixed_float16_run_whose_gradients_keep_overflowing_fails),
      cmocka_unit_test(epochs_whose_every_loss_was_non_finite_report_no_loss),
      cmocka_unit_test(a_healthy_mixed_float16_run_reports_its_skipped_steps),
      cmocka_unit_test(the_bound_on_skipped_steps_is_configurable),
      cmocka_unit_test(the_training_state_keeps_the_skipped_steps),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
