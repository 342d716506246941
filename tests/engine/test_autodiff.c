/* Gradients from autodiff against central finite differences of the loss,
 * for every op the engine differentiates, including partial batches. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"

static float run_loss(kn_graph *g, kn_node loss, int batch) {
  char err[256];
  assert_int_equal(kn_graph_run(g, KN_RUN_FORWARD, batch, err, sizeof err), KN_OK);
  return *(float *)kn_node_data(g, loss);
}

/* Fills inputs with seeded values and labels in [0, classes). */
static void fill_inputs(kn_graph *g, kn_node x, size_t nx, kn_node y, int rows, int classes) {
  kn_rng rng;
  kn_rng_seed(&rng, 7);
  float *xd = kn_node_data(g, x);
  for (size_t i = 0; i < nx; i++) xd[i] = 2.0f * kn_rng_uniform(&rng) - 1.0f;
  int32_t *yd = kn_node_data(g, y);
  for (int r = 0; r < rows; r++) yd[r] = (int32_t)kn_rng_below(&rng, (uint64_t)classes);
}

/* Every parameter's gradient against (L(p + h) - L(p - h)) / 2h. */
static void check_gradients(kn_graph *g, kn_node loss, int batch) {
  char err[256];
  assert_int_equal(kn_graph_run(g, KN_RUN_TRAIN, batch, err, sizeof err), KN_OK);
  size_t n = kn_param_count(g);
  float *p = kn_params(g);
  float analytic[4096];
  assert_true(n <= 4096);
  memcpy(analytic, kn_grads(g), n * sizeof(float));
  /* Central differences at h and h/2: where they disagree, a ReLU kink lies
   * within h of the point and finite differences say nothing; such points are
   * skipped, and must stay rare. */
  const float h = 2e-3f;
  int checked = 0, kinks = 0;
  for (size_t i = 0; i < n; i++) {
    float saved = p[i];
    double fd[2];
    for (int k = 0; k < 2; k++) {
      float step = k ? h / 2 : h;
      p[i] = saved + step;
      double up = run_loss(g, loss, batch);
      p[i] = saved - step;
      double down = run_loss(g, loss, batch);
      fd[k] = (up - down) / (2.0 * step);
    }
    p[i] = saved;
    double tol = 1e-3 + 1e-2 * fabs(fd[1]);
    if (fabs(fd[0] - fd[1]) > tol) {
      kinks++;
      continue;
    }
    if (fabs(fd[1] - analytic[i]) > tol) {
      fail_msg("param %zu: autodiff %.6f vs finite differences %.6f", i, analytic[i], fd[1]);
    }
    checked++;
  }
  assert_true(kinks * 10 <= (int)n);
  checked += kinks;
  assert_int_equal(checked, (int)n);
}

/* dense -> relu -> dense -> softmax xent: matmul, bias_add, relu, loss. */
static void mlp_gradients_match_finite_differences(void **state) {
  (void)state;
  kn_graph *g = kn_graph_new();
  int xd[2] = {4, 6}, w1d[2] = {6, 5}, b1d[1] = {5}, w2d[2] = {5, 3}, b2d[1] = {3};
  kn_node x = kn_input(g, "x", KN_F32, 2, xd);
  kn_node y = kn_input(g, "y", KN_I32, 1, xd);
  kn_node w1 = kn_param(g, "w1", 2, w1d, KN_INIT_GLOROT_UNIFORM);
  kn_node b1 = kn_param(g, "b1", 1, b1d, KN_INIT_GLOROT_UNIFORM);
  kn_node w2 = kn_param(g, "w2", 2, w2d, KN_INIT_GLOROT_UNIFORM);
  kn_node b2 = kn_param(g, "b2", 1, b2d, KN_INIT_GLOROT_UNIFORM);
  kn_node h = kn_relu(g, kn_bias_add(g, kn_matmul(g, x, w1, 0, 0), b1));
  kn_node logits = kn_bias_add(g, kn_matmul(g, h, w2, 0, 0), b2);
  kn_node loss = kn_softmax_xent(g, logits, y);
  char err[256];
  assert_int_equal(kn_autodiff(g, loss, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(g, 3, NULL, err, sizeof err), KN_OK);
  fill_inputs(g, x, 4 * 6, y, 4, 3);
  check_gradients(g, loss, 4);
  kn_graph_free(g);
}

/* Transposed operands, an add of two branches, an inner softmax, a reshape. */
static void transposes_add_softmax_reshape_gradients_match(void **state) {
  (void)state;
  kn_graph *g = kn_graph_new();
  int xd[3] = {3, 2, 4}, flat[2] = {3, 8}, wtd[2] = {5, 8}, vd[2] = {8, 5}, w2d[2] = {5, 4};
  kn_node x = kn_input(g, "x", KN_F32, 3, xd);
  kn_node y = kn_input(g, "y", KN_I32, 1, xd);
  kn_node wt = kn_param(g, "wt", 2, wtd, KN_INIT_GLOROT_UNIFORM); /* used as wt^T */
  kn_node v = kn_param(g, "v", 2, vd, KN_INIT_GLOROT_UNIFORM);
  kn_node w2 = kn_param(g, "w2", 2, w2d, KN_INIT_GLOROT_UNIFORM);
  kn_node xf = kn_reshape(g, x, 2, flat);
  kn_node a = kn_matmul(g, xf, wt, 0, 1);
  kn_node b = kn_matmul(g, xf, v, 0, 0);
  kn_node s = kn_softmax(g, kn_add(g, a, b));
  kn_node logits = kn_matmul(g, s, w2, 0, 0);
  kn_node loss = kn_softmax_xent(g, logits, y);
  char err[256];
  assert_int_equal(kn_autodiff(g, loss, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(g, 11, NULL, err, sizeof err), KN_OK);
  fill_inputs(g, x, 3 * 8, y, 3, 4);
  check_gradients(g, loss, 3);
  kn_graph_free(g);
}

/* A parameter used twice gets the sum of both paths' gradients. */
static void shared_parameter_gradients_accumulate(void **state) {
  (void)state;
  kn_graph *g = kn_graph_new();
  int xd[2] = {2, 3}, wd[2] = {3, 3};
  kn_node x = kn_input(g, "x", KN_F32, 2, xd);
  kn_node y = kn_input(g, "y", KN_I32, 1, xd);
  kn_node w = kn_param(g, "w", 2, wd, KN_INIT_GLOROT_UNIFORM);
  kn_node h = kn_relu(g, kn_matmul(g, x, w, 0, 0));
  kn_node logits = kn_matmul(g, h, w, 0, 1);
  kn_node loss = kn_softmax_xent(g, logits, y);
  char err[256];
  assert_int_equal(kn_autodiff(g, loss, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(g, 5, NULL, err, sizeof err), KN_OK);
  fill_inputs(g, x, 2 * 3, y, 2, 3);
  check_gradients(g, loss, 2);
  kn_graph_free(g);
}

/* A run on fewer rows than planned averages over the rows it has. */
static void partial_batch_gradients_match(void **state) {
  (void)state;
  kn_graph *g = kn_graph_new();
  int xd[2] = {8, 5}, wd[2] = {5, 4}, bd[1] = {4};
  kn_node x = kn_input(g, "x", KN_F32, 2, xd);
  kn_node y = kn_input(g, "y", KN_I32, 1, xd);
  kn_node w = kn_param(g, "w", 2, wd, KN_INIT_GLOROT_UNIFORM);
  kn_node b = kn_param(g, "b", 1, bd, KN_INIT_ZEROS);
  kn_node loss = kn_softmax_xent(g, kn_bias_add(g, kn_matmul(g, x, w, 0, 0), b), y);
  char err[256];
  assert_int_equal(kn_autodiff(g, loss, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(g, 9, NULL, err, sizeof err), KN_OK);
  fill_inputs(g, x, 8 * 5, y, 8, 4);
  check_gradients(g, loss, 3);
  /* Rows past the batch must not matter: poison them and compare. */
  float before = run_loss(g, loss, 3);
  float *xd_data = kn_node_data(g, x);
  for (int i = 3 * 5; i < 8 * 5; i++) xd_data[i] = 1e30f;
  assert_float_equal(run_loss(g, loss, 3), before, 0.0);
  assert_int_equal(kn_graph_run(g, KN_RUN_FORWARD, 9, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "batch must be 1..8"));
  kn_graph_free(g);
}

static void cross_entropy_value_matches_hand_computation(void **state) {
  (void)state;
  kn_graph *g = kn_graph_new();
  int ld[2] = {2, 3};
  kn_node logits = kn_input(g, "logits", KN_F32, 2, ld);
  kn_node y = kn_input(g, "y", KN_I32, 1, ld);
  kn_node loss = kn_softmax_xent(g, logits, y);
  kn_graph_keep(g, loss); /* an output: dead-node elimination keeps it */
  char err[256];
  assert_int_equal(kn_graph_compile(g, 0, NULL, err, sizeof err), KN_OK);
  float *l = kn_node_data(g, logits);
  const float v[6] = {1, 2, 3, 0, 0, 0};
  memcpy(l, v, sizeof v);
  int32_t *yd = kn_node_data(g, y);
  yd[0] = 2;
  yd[1] = 0;
  double row0 = log(exp(1) + exp(2) + exp(3)) - 3, row1 = log(3.0);
  assert_float_equal(run_loss(g, loss, 2), (row0 + row1) / 2, 1e-6);
  yd[1] = 3; /* out of range: an error, not a read past the row */
  assert_int_equal(kn_graph_run(g, KN_RUN_FORWARD, 2, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "outside [0, 3)"));
  kn_graph_free(g);
}

static void builder_errors_name_the_shapes(void **state) {
  (void)state;
  kn_graph *g = kn_graph_new();
  int ad[2] = {4, 3}, bd[2] = {5, 2};
  kn_node a = kn_input(g, "a", KN_F32, 2, ad);
  kn_node b = kn_param(g, "b", 2, bd, KN_INIT_ZEROS);
  assert_true(kn_matmul(g, a, b, 0, 0) < 0);
  char err[256];
  assert_int_equal(kn_graph_error(g, err, sizeof err), KN_EINVAL);
  assert_string_equal(err, "matmul: inner dimensions differ: (4, 3) x (5, 2)");
  /* The first error sticks; later calls fail fast. */
  assert_true(kn_relu(g, a) < 0);
  assert_int_equal(kn_autodiff(g, 0, err, sizeof err), KN_EINVAL);
  assert_string_equal(err, "matmul: inner dimensions differ: (4, 3) x (5, 2)");
  kn_graph_free(g);
}

/* Name scopes, as tf.name_scope: unnamed nodes take "<scope>/<op>" (then
 * _1, _2 within the scope), named ones keep their names, no scope gives
 * "n<index>", and each gradient's nodes are scoped by their forward node. */
static void scoped_nodes_and_their_gradients_are_named_by_scope(void **state) {
  (void)state;
  kn_graph *g = kn_graph_new();
  kn_node x = kn_input(g, "x", KN_F32, 2, (int[]){4, 3});
  kn_node y = kn_input(g, "y", KN_I32, 1, (int[]){4});
  kn_graph_set_scope(g, "dense_a");
  kn_node w = kn_param(g, "dense_a.kernel", 2, (int[]){3, 3}, KN_INIT_GLOROT_UNIFORM);
  kn_node h1 = kn_matmul(g, x, w, 0, 0);
  kn_node h2 = kn_matmul(g, h1, w, 0, 0);
  kn_node r = kn_relu(g, h2);
  kn_graph_set_scope(g, NULL);
  kn_node loss = kn_softmax_xent(g, r, y);
  assert_string_equal(kn_node_name(g, w), "dense_a.kernel");
  assert_string_equal(kn_node_name(g, h1), "dense_a/matmul");
  assert_string_equal(kn_node_name(g, h2), "dense_a/matmul_1");
  assert_string_equal(kn_node_name(g, r), "dense_a/relu");
  char unscoped[32];
  snprintf(unscoped, sizeof unscoped, "n%d", loss);
  assert_string_equal(kn_node_name(g, loss), unscoped);
  char err[256] = "";
  assert_int_equal(kn_autodiff(g, loss, err, sizeof err), KN_OK);
  assert_true(kn_graph_find(g, "grad/dense_a/relu/relu_grad") >= 0);
  assert_true(kn_graph_find(g, "grad/dense_a/matmul_1/matmul") >= 0);
  assert_true(kn_graph_find(g, "grad/dense_a.kernel") >= 0);
  kn_graph_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(mlp_gradients_match_finite_differences),
      cmocka_unit_test(transposes_add_softmax_reshape_gradients_match),
      cmocka_unit_test(shared_parameter_gradients_accumulate),
      cmocka_unit_test(partial_batch_gradients_match),
      cmocka_unit_test(cross_entropy_value_matches_hand_computation),
      cmocka_unit_test(builder_errors_name_the_shapes),
      cmocka_unit_test(scoped_nodes_and_their_gradients_are_named_by_scope),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
