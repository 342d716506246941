/* Building graphs while the node array moves: grown one record at a time,
 * the array is reallocated by every push, so a builder that holds a node
 * record's address across a push reads freed memory (the sanitizer build
 * reports it). Every layer kind the model builder takes, in each precision,
 * with and without recompute, is built, compiled and run for a training
 * step, and must give the graph, loss and gradients of a default build. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"
#include "graph_internal.h"
#include "layer_kinds.h"

#define BATCH 4

typedef struct step_result {
  int n_nodes;
  float loss;
  size_t n_grads;
  float *grads; /* (n_grads) */
} step_result;

/* Builds and compiles cfg with the node array grown `growth` records at a
 * time (0: the default), runs one training step on fixed data, and records
 * the graph's size, the loss and the gradients. */
static step_result train_step(const kn_model_config *cfg, int growth) {
  char err[256], what[96];
  snprintf(what, sizeof what, "%s, recompute %d, growth %d", kn_precision_name(cfg->precision),
           cfg->recompute, growth);
  kn_graph_set_node_growth(growth);
  kn_model m;
  int rc = kn_model_build(cfg, &m, err, sizeof err);
  if (rc != KN_OK) fail_msg("build (%s): %s", what, err);
  rc = kn_model_compile(&m, cfg, 7, NULL, err, sizeof err);
  kn_graph_set_node_growth(0);
  if (rc != KN_OK) fail_msg("compile (%s): %s", what, err);
  float *x = kn_node_data(m.graph, m.x);
  for (size_t k = 0; k < BATCH * m.example_size; k++) x[k] = sinf(0.37f * (float)k);
  int32_t *y = kn_node_data(m.graph, m.y);
  for (int r = 0; r < BATCH; r++) y[r] = (r * 3 + 1) % m.n_classes;
  rc = kn_graph_run(m.graph, KN_RUN_TRAIN, BATCH, err, sizeof err);
  if (rc != KN_OK) fail_msg("train step (%s): %s", what, err);
  step_result out = {.n_nodes = kn_graph_node_count(m.graph),
                     .loss = *(const float *)kn_node_data(m.graph, m.loss),
                     .n_grads = kn_param_count(m.graph)};
  out.grads = malloc(out.n_grads * sizeof *out.grads);
  assert_non_null(out.grads);
  memcpy(out.grads, kn_grads(m.graph), out.n_grads * sizeof *out.grads);
  kn_model_free(&m);
  return out;
}

static void check_model(const kn_test_model *model) {
  const kn_layer_config *layers = model->layers;
  const int n_layers = model->n_layers;
  static const kn_precision precisions[] = {KN_PRECISION_FLOAT32, KN_PRECISION_MIXED_BFLOAT16,
                                            KN_PRECISION_MIXED_FLOAT16};
  for (int p = 0; p < 3; p++) {
    for (int recompute = 0; recompute < 2; recompute++) {
      kn_model_config cfg = {.input_ndim = 3,
                             .input_shape = {8, 8, 3},
                             .n_layers = n_layers,
                             .layers = layers,
                             .batch_size = BATCH,
                             .seed = 11,
                             .precision = precisions[p],
                             .recompute = recompute};
      step_result moved = train_step(&cfg, 1), plain = train_step(&cfg, 0);
      print_message("%-15s recompute %d: %d nodes, loss %.6f\n", kn_precision_name(cfg.precision),
                    recompute, moved.n_nodes, (double)moved.loss);
      assert_int_equal(moved.n_nodes, plain.n_nodes);
      assert_true(isfinite(moved.loss) && moved.loss > 0.0f);
      assert_memory_equal(&moved.loss, &plain.loss, sizeof moved.loss);
      assert_int_equal(moved.n_grads, plain.n_grads);
      assert_memory_equal(moved.grads, plain.grads, moved.n_grads * sizeof *moved.grads);
      size_t nonzero = 0;
      for (size_t k = 0; k < moved.n_grads; k++) nonzero += moved.grads[k] != 0.0f;
      assert_true(nonzero > moved.n_grads / 4);
      free(moved.grads);
      free(plain.grads);
    }
  }
}

static void every_layer_kind_builds_and_trains_while_each_push_moves_the_nodes(void **state) {
  (void)state;
  check_model(&kn_test_models[0]);
}

static void pool_flatten_dense_builds_and_trains_while_each_push_moves_the_nodes(void **state) {
  (void)state;
  check_model(&kn_test_models[1]);
}

static void flatten_last_builds_and_trains_while_each_push_moves_the_nodes(void **state) {
  (void)state;
  check_model(&kn_test_models[2]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_layer_kind_builds_and_trains_while_each_push_moves_the_nodes),
      cmocka_unit_test(pool_flatten_dense_builds_and_trains_while_each_push_moves_the_nodes),
      cmocka_unit_test(flatten_last_builds_and_trains_while_each_push_moves_the_nodes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
