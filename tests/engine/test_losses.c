/* Losses beyond sparse cross-entropy in the training loop: a regression
 * learns a linear target and reports mse / mae (partial batches weighed
 * right), categorical cross-entropy on one-hot rows gives the sparse loss's
 * numbers, a single sigmoid output learns two classes, and mismatches of
 * loss, labels and metrics are refused with a sentence. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"

#define FEATURES 4

/* y = 2 x0 - x1 + 0.5 x2 + 0.3 + noise in [-0.1, 0.1), x uniform in
 * [-1, 1]; class = (y > 0.3). The noise keeps the best mse above 0, so the
 * loss-equals-metric checks compare numbers that are not all zero. */
static kn_dataset make_linear(int64_t n, uint64_t seed) {
  kn_dataset ds = {.n = n,
                   .ndim = 1,
                   .shape = {FEATURES},
                   .example_size = FEATURES,
                   .n_classes = 2,
                   .n_targets = 1};
  ds.x = malloc((size_t)n * FEATURES * sizeof(float));
  ds.y = malloc((size_t)n * sizeof(int32_t));
  ds.targets = malloc((size_t)n * sizeof(float));
  kn_rng rng;
  kn_rng_seed(&rng, seed);
  for (int64_t i = 0; i < n; i++) {
    float *x = ds.x + i * FEATURES;
    for (int f = 0; f < FEATURES; f++) x[f] = 2.0f * kn_rng_uniform(&rng) - 1.0f;
    ds.targets[i] = 2.0f * x[0] - x[1] + 0.5f * x[2] + 0.3f + 0.2f * (kn_rng_uniform(&rng) - 0.5f);
    ds.y[i] = ds.targets[i] > 0.3f;
  }
  return ds;
}

/* Three blobs: class c centred at +2 on feature c. */
static kn_dataset make_blobs(int64_t n, uint64_t seed) {
  kn_dataset ds = {
      .n = n, .ndim = 1, .shape = {FEATURES}, .example_size = FEATURES, .n_classes = 3};
  ds.x = malloc((size_t)n * FEATURES * sizeof(float));
  ds.y = malloc((size_t)n * sizeof(int32_t));
  kn_rng rng;
  kn_rng_seed(&rng, seed);
  for (int64_t i = 0; i < n; i++) {
    int c = (int)kn_rng_below(&rng, 3);
    ds.y[i] = c;
    for (int f = 0; f < FEATURES; f++)
      ds.x[i * FEATURES + f] =
          kn_rng_uniform(&rng) + kn_rng_uniform(&rng) - 1.0f + (f == c ? 2.0f : 0.0f);
  }
  return ds;
}

static int build(kn_loss loss, int units, kn_activation last_act, int hidden, kn_model *m,
                 char *err, size_t errlen) {
  kn_layer_config layers[2] = {{.type = KN_LAYER_DENSE,
                                .name = "hidden",
                                .units = 16,
                                .use_bias = 1,
                                .activation = KN_ACT_RELU},
                               {.type = KN_LAYER_DENSE,
                                .name = "out",
                                .units = units,
                                .use_bias = 1,
                                .activation = last_act}};
  kn_model_config cfg = {.input_ndim = 1,
                         .input_shape = {FEATURES},
                         .n_layers = hidden ? 2 : 1,
                         .layers = hidden ? layers : layers + 1,
                         .batch_size = 32,
                         .loss = loss};
  int rc = kn_model_build(&cfg, m, err, errlen);
  if (!rc) rc = kn_graph_compile(m->graph, 11, NULL, err, errlen);
  return rc;
}

static kn_train_config config(int epochs, float lr, unsigned metrics) {
  kn_train_config tc = {.epochs = epochs,
                        .batch_size = 32,
                        .shuffle = 1,
                        .seed = 3,
                        .log_every_steps = 4,
                        .metrics = metrics};
  tc.optimizer = (kn_optimizer_config){
      .type = KN_OPT_ADAM, .learning_rate = lr, .beta1 = 0.9f, .beta2 = 0.999f, .epsilon = 1e-7f};
  return tc;
}

typedef struct record {
  char epoch_names[8][32];
  double epoch_values[8];
  int n_epoch_metrics;
  char step_names[8][32];
  int n_step_metrics;
  double step_losses[512];
  int n_steps;
} record;

static int on_event(const kn_train_event *ev, void *user) {
  record *r = user;
  if (ev->kind == KN_EVENT_STEP) {
    r->n_step_metrics = ev->n_metrics;
    for (int i = 0; i < ev->n_metrics; i++)
      snprintf(r->step_names[i], sizeof r->step_names[i], "%s", ev->names[i]);
    if (r->n_steps < 512) r->step_losses[r->n_steps++] = ev->values[0];
  } else if (ev->kind == KN_EVENT_EPOCH) {
    r->n_epoch_metrics = ev->n_metrics;
    for (int i = 0; i < ev->n_metrics; i++) {
      snprintf(r->epoch_names[i], sizeof r->epoch_names[i], "%s", ev->names[i]);
      r->epoch_values[i] = ev->values[i];
    }
  }
  return 0;
}

static void regression_learns_a_linear_target_and_reports_mse_and_mae(void **state) {
  (void)state;
  /* 500 and 100 examples: both end in a partial batch of 20 and 4 rows. */
  kn_dataset train = make_linear(500, 1), val = make_linear(100, 2);
  kn_model m;
  char err[256] = "";
  assert_int_equal(build(KN_LOSS_MSE, 1, KN_ACT_LINEAR, 0, &m, err, sizeof err), KN_OK);
  assert_int_equal(m.n_outputs, 1);
  assert_int_equal(m.n_classes, 0);
  kn_train_config tc = config(30, 0.05f, KN_METRIC_MSE | KN_METRIC_MAE);
  record r = {0};
  if (kn_train(&m, &train, &val, &tc, on_event, &r, err, sizeof err)) fail_msg("%s", err);
  static const char *const want[] = {"epoch_loss", "epoch_mse", "epoch_mae",
                                     "val_loss",   "val_mse",   "val_mae"};
  assert_int_equal(r.n_epoch_metrics, 6);
  for (int i = 0; i < 6; i++) assert_string_equal(r.epoch_names[i], want[i]);
  assert_int_equal(r.n_step_metrics, 3);
  assert_string_equal(r.step_names[0], "loss");
  assert_string_equal(r.step_names[1], "mse");
  assert_string_equal(r.step_names[2], "mae");
  print_message("epoch_loss %.6f val_loss %.6f val_mae %.6f\n", r.epoch_values[0],
                r.epoch_values[3], r.epoch_values[5]);
  /* With one output the mse loss is the mse metric, partial batches too:
   * the graph's mean runs over the rows fed, not the planned 32. */
  assert_float_equal(r.epoch_values[0], r.epoch_values[1], 1e-5 + 1e-4 * r.epoch_values[1]);
  assert_float_equal(r.epoch_values[3], r.epoch_values[4], 1e-6 + 1e-4 * r.epoch_values[4]);
  /* A linear layer fits a linear target: what is left is the noise,
   * mean |noise| 0.05, mse 0.0033. */
  assert_true(r.epoch_values[3] > 0.001);
  assert_true(r.epoch_values[5] < 0.07);
  assert_true(r.epoch_values[4] <= r.epoch_values[5]); /* mse <= mae when errors < 1 */
  /* The prediction for one example, checked by hand against the target. */
  float *x = kn_node_data(m.graph, m.x);
  memcpy(x, val.x, FEATURES * sizeof(float));
  assert_int_equal(kn_graph_run(m.graph, KN_RUN_FORWARD, 1, err, sizeof err), KN_OK);
  float pred = *(float *)kn_node_data(m.graph, m.logits);
  assert_float_equal(pred, val.targets[0], 0.15);
  double loss, acc;
  assert_int_equal(kn_evaluate(&m, &val, &loss, &acc, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "a regression model has no accuracy"));
  kn_model_free(&m);
  kn_dataset_free(&train);
  kn_dataset_free(&val);
}

static void mae_loss_trains_and_equals_its_metric(void **state) {
  (void)state;
  kn_dataset train = make_linear(256, 4), val = make_linear(64, 5);
  kn_model m;
  char err[256] = "";
  assert_int_equal(build(KN_LOSS_MAE, 1, KN_ACT_LINEAR, 1, &m, err, sizeof err), KN_OK);
  kn_train_config tc = config(20, 0.01f, KN_METRIC_MAE);
  record r = {0};
  if (kn_train(&m, &train, &val, &tc, on_event, &r, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(r.n_epoch_metrics, 4);
  assert_string_equal(r.epoch_names[1], "epoch_mae");
  assert_string_equal(r.epoch_names[3], "val_mae");
  assert_float_equal(r.epoch_values[0], r.epoch_values[1], 1e-5);
  assert_float_equal(r.epoch_values[2], r.epoch_values[3], 1e-5);
  /* The mean of |y| is about 0.9: the model must do far better. */
  assert_true(r.epoch_values[3] < 0.15);
  kn_model_free(&m);
  kn_dataset_free(&train);
  kn_dataset_free(&val);
}

static void categorical_crossentropy_on_one_hot_rows_matches_the_sparse_loss(void **state) {
  (void)state;
  kn_dataset train = make_blobs(400, 7), val = make_blobs(100, 8);
  kn_model sparse, dense;
  char err[256] = "";
  assert_int_equal(build(KN_LOSS_SPARSE_XENT, 3, KN_ACT_SOFTMAX, 1, &sparse, err, sizeof err),
                   KN_OK);
  assert_int_equal(build(KN_LOSS_XENT, 3, KN_ACT_SOFTMAX, 1, &dense, err, sizeof err), KN_OK);
  kn_pipeline_config pc;
  kn_pipeline_config_default(&pc);
  pc.shuffle_buffer = INT64_MAX;
  pc.one_hot = 1; /* the spec's pipeline.one_hot */
  pc.num_parallel_calls = 2;
  kn_train_config tc = config(3, 0.01f, 0);
  tc.pipeline = &pc;
  record a = {0}, b = {0};
  if (kn_train(&sparse, &train, &val, &tc, on_event, &a, err, sizeof err)) fail_msg("%s", err);
  if (kn_train(&dense, &train, &val, &tc, on_event, &b, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(a.n_steps, b.n_steps);
  assert_true(a.n_steps > 5);
  for (int i = 0; i < a.n_steps; i++)
    assert_float_equal(a.step_losses[i], b.step_losses[i], 1e-5 * (1 + a.step_losses[i]));
  /* Accuracy is reported for both, from the labels. */
  assert_string_equal(b.epoch_names[1], "epoch_accuracy");
  assert_string_equal(b.epoch_names[3], "val_accuracy");
  assert_float_equal(a.epoch_values[3], b.epoch_values[3], 1e-12);
  assert_true(b.epoch_values[3] > 0.9);
  kn_model_free(&sparse);
  kn_model_free(&dense);
  kn_dataset_free(&train);
  kn_dataset_free(&val);
}

static void binary_crossentropy_with_one_sigmoid_output_learns_two_classes(void **state) {
  (void)state;
  kn_dataset train = make_linear(600, 9), val = make_linear(200, 10);
  kn_model m;
  char err[256] = "";
  /* The sigmoid is folded into the loss: the kept output is the logit. */
  assert_int_equal(build(KN_LOSS_BCE, 1, KN_ACT_SIGMOID, 1, &m, err, sizeof err), KN_OK);
  kn_train_config tc = config(15, 0.02f, KN_METRIC_ACCURACY);
  record r = {0};
  if (kn_train(&m, &train, &val, &tc, on_event, &r, err, sizeof err)) fail_msg("%s", err);
  assert_string_equal(r.epoch_names[3], "val_accuracy");
  print_message("val_loss %.4f val_accuracy %.4f\n", r.epoch_values[2], r.epoch_values[3]);
  assert_true(r.epoch_values[3] > 0.93);
  assert_true(r.epoch_values[2] < 0.3);
  /* kn_evaluate agrees with the last epoch's validation pass. */
  double loss, acc;
  assert_int_equal(kn_evaluate(&m, &val, &loss, &acc, err, sizeof err), KN_OK);
  assert_float_equal(acc, r.epoch_values[3], 1e-12);
  assert_float_equal(loss, r.epoch_values[2], 1e-5);
  kn_model_free(&m);
  kn_dataset_free(&train);
  kn_dataset_free(&val);
}

static void mismatched_loss_labels_and_metrics_are_refused(void **state) {
  (void)state;
  kn_dataset blobs = make_blobs(64, 1);
  kn_model m;
  char err[256] = "";
  /* Regression on class labels only. */
  assert_int_equal(build(KN_LOSS_MSE, 1, KN_ACT_LINEAR, 1, &m, err, sizeof err), KN_OK);
  kn_train_config tc = config(1, 0.01f, 0);
  assert_int_equal(kn_train(&m, &blobs, NULL, &tc, NULL, NULL, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "a regression loss needs numeric targets"));
  tc.metrics = KN_METRIC_ACCURACY;
  kn_dataset lin = make_linear(64, 2);
  assert_int_equal(kn_train(&m, &lin, NULL, &tc, NULL, NULL, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "accuracy needs a classification loss"));
  kn_model_free(&m);
  /* Regression metrics on a classifier. */
  assert_int_equal(build(KN_LOSS_SPARSE_XENT, 3, KN_ACT_LINEAR, 1, &m, err, sizeof err), KN_OK);
  tc.metrics = KN_METRIC_MAE;
  assert_int_equal(kn_train(&m, &blobs, NULL, &tc, NULL, NULL, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "mse and mae need a regression loss"));
  kn_model_free(&m);
  /* A single sigmoid output scores two classes, not three. */
  assert_int_equal(build(KN_LOSS_BCE, 1, KN_ACT_LINEAR, 1, &m, err, sizeof err), KN_OK);
  tc.metrics = 0;
  assert_int_equal(kn_train(&m, &blobs, NULL, &tc, NULL, NULL, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "labels up to 2, the model only 2 classes"));
  kn_model_free(&m);
  /* Softmax cross-entropies need two scores. */
  assert_int_equal(build(KN_LOSS_XENT, 1, KN_ACT_LINEAR, 1, &m, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "(batch, classes >= 2) scores"));
  kn_dataset_free(&blobs);
  kn_dataset_free(&lin);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(regression_learns_a_linear_target_and_reports_mse_and_mae),
      cmocka_unit_test(mae_loss_trains_and_equals_its_metric),
      cmocka_unit_test(categorical_crossentropy_on_one_hot_rows_matches_the_sparse_loss),
      cmocka_unit_test(binary_crossentropy_with_one_sigmoid_output_learns_two_classes),
      cmocka_unit_test(mismatched_loss_labels_and_metrics_are_refused),
  };
  return cmocka_run_group_tests_name("losses", tests, NULL, NULL);
}
