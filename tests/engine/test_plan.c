/* The memory plan: live values never overlap, kept values are never reused,
 * the arena beats one buffer per node, and running allocates nothing. */
#include <malloc.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"
#include "graph_internal.h"

static kn_model build_mlp(int batch, int hidden) {
  kn_layer_config layers[4] = {{.type = KN_LAYER_FLATTEN, .name = "flatten_0"},
                               {.type = KN_LAYER_DENSE,
                                .name = "dense_1",
                                .units = hidden,
                                .use_bias = 1,
                                .activation = KN_ACT_RELU},
                               {.type = KN_LAYER_DENSE,
                                .name = "dense_2",
                                .units = hidden / 2,
                                .use_bias = 1,
                                .activation = KN_ACT_RELU},
                               {.type = KN_LAYER_DENSE,
                                .name = "dense_3",
                                .units = 10,
                                .use_bias = 1,
                                .activation = KN_ACT_SOFTMAX}};
  kn_model_config cfg = {.input_ndim = 3,
                         .input_shape = {28, 28, 1},
                         .n_layers = 4,
                         .layers = layers,
                         .batch_size = batch};
  kn_model m;
  char err[256];
  assert_int_equal(kn_model_build(&cfg, &m, err, sizeof err), KN_OK);
  return m;
}

/* A CNN: convolutions (one padded), both pools, flatten, dense. */
static const kn_layer_config cnn[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "conv_1",
     .filters = 8,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_MAX_POOL2D, .name = "max_pool"},
    {.type = KN_LAYER_CONV2D,
     .name = "conv_2",
     .filters = 8,
     .kernel_size = {3, 3},
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_AVG_POOL2D, .name = "avg_pool"},
    {.type = KN_LAYER_FLATTEN, .name = "flatten"},
    {.type = KN_LAYER_DENSE,
     .name = "out",
     .units = 10,
     .use_bias = 1,
     .activation = KN_ACT_SOFTMAX},
};

/* A residual block: two branches from one stem, added. */
static const kn_layer_config residual[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "stem",
     .filters = 4,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "branch_a",
     .filters = 4,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "branch_b",
     .filters = 4,
     .kernel_size = {1, 1},
     .use_bias = 1,
     .n_inputs = 1,
     .inputs = {0}},
    {.type = KN_LAYER_ADD, .name = "add", .n_inputs = 2, .inputs = {1, 2}},
    {.type = KN_LAYER_MAX_POOL2D, .name = "max_pool"},
    {.type = KN_LAYER_FLATTEN, .name = "flatten"},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 10, .use_bias = 1},
};

/* A small CNN whose last layer is flatten: the logits are a view of the
 * head convolution's output. */
static const kn_layer_config flatten_last[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "conv",
     .filters = 8,
     .kernel_size = {3, 3},
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_MAX_POOL2D, .name = "max_pool"},
    {.type = KN_LAYER_AVG_POOL2D, .name = "avg_pool", .pool_size = {3, 3}},
    {.type = KN_LAYER_CONV2D, .name = "head", .filters = 5, .kernel_size = {1, 1}, .use_bias = 1},
    {.type = KN_LAYER_FLATTEN, .name = "flatten"},
};

#define N_LAYERS(layers) ((int)(sizeof layers / sizeof layers[0]))

static kn_model build_model(const kn_layer_config *layers, int n_layers, int side, int channels,
                            kn_precision precision, int recompute) {
  kn_model_config cfg = {.input_ndim = 3,
                         .input_shape = {side, side, channels},
                         .n_layers = n_layers,
                         .layers = layers,
                         .batch_size = 16,
                         .precision = precision,
                         .recompute = recompute};
  kn_model m;
  char err[256];
  if (kn_model_build(&cfg, &m, err, sizeof err) != KN_OK) fail_msg("build: %s", err);
  return m;
}

/* Compiles m and checks its plan. Without in-place reuse no two values
 * live at the same step share a byte; with it, a value may take over a
 * buffer only at the step that reads it last (its producer's input dies
 * there). A kept value, and the storage a kept view aliases, lives to the
 * end of the schedule, so nothing reuses it. Returns the values placed in
 * place. */
static int check_plan(kn_model *m, int inplace, int recompute, const char *what) {
  kn_graph_set_passes(m->graph, inplace ? KN_PASS_ALL : KN_PASS_ALL & ~KN_PASS_INPLACE);
  kn_plan_stats st;
  char err[256];
  assert_int_equal(kn_graph_compile(m->graph, 1, &st, err, sizeof err), KN_OK);
  if (!inplace) assert_int_equal(st.n_inplace, 0);
  if (recompute && st.n_recomputed == 0) fail_msg("%s: nothing is recomputed", what);
  const kn_graph *g = m->graph;
  int n = kn_graph_node_count(g);
  int checked_pairs = 0;
  for (int a = 0; a < n; a++) {
    size_t abytes, bbytes;
    int64_t aoff = kn_node_arena_offset(g, a, &abytes);
    if (aoff < 0) continue;
    int af, al;
    kn_node_lifetime(g, a, &af, &al);
    for (int b = a + 1; b < n; b++) {
      int64_t boff = kn_node_arena_offset(g, b, &bbytes);
      if (boff < 0) continue;
      int bf, bl;
      kn_node_lifetime(g, b, &bf, &bl);
      int live_together = inplace ? (af <= bl && bf < al) : (af <= bl && bf <= al);
      int overlap = aoff < boff + (int64_t)bbytes && boff < aoff + (int64_t)abytes;
      if (live_together && overlap) {
        fail_msg("%s: nodes %s and %s are live together and share arena bytes", what,
                 kn_node_name(g, a), kn_node_name(g, b));
      }
      checked_pairs++;
    }
  }
  assert_true(checked_pairs > 50);
  /* Inputs, logits and loss are outputs, kept; so are gradients. */
  const kn_node outputs[] = {m->x, m->y, m->logits, m->loss};
  for (size_t i = 0; i < sizeof outputs / sizeof outputs[0]; i++)
    assert_true(g->nodes[outputs[i]].keep);
  int kept = 0;
  for (int i = 0; i < n; i++) {
    if (!g->nodes[i].keep || g->nodes[i].dead) continue;
    const kn_node base = kn_storage_root(g, i);
    int first, last, base_first, base_last;
    kn_node_lifetime(g, i, &first, &last);
    kn_node_lifetime(g, base, &base_first, &base_last);
    if (last != n || base_last != n)
      fail_msg("%s: kept node %s lives to %d and its storage %s to %d, not to the end (%d)", what,
               kn_node_name(g, i), last, kn_node_name(g, base), base_last, n);
    kept++;
  }
  assert_true(kept >= 4);
  return st.n_inplace;
}

static void check_no_overlap(int inplace) {
  kn_model mlp = build_mlp(32, 128);
  int n_inplace = check_plan(&mlp, inplace, 0, inplace ? "mlp, in place on" : "mlp, in place off");
  if (inplace) assert_true(n_inplace > 0);
  kn_model_free(&mlp);
  const struct {
    const char *what;
    const kn_layer_config *layers;
    int n_layers, side, channels;
    kn_precision precision;
    int recompute;
  } cases[] = {
      {"cnn", cnn, N_LAYERS(cnn), 12, 1, KN_PRECISION_FLOAT32, 0},
      {"cnn, mixed_bfloat16", cnn, N_LAYERS(cnn), 12, 1, KN_PRECISION_MIXED_BFLOAT16, 0},
      {"cnn, recompute", cnn, N_LAYERS(cnn), 12, 1, KN_PRECISION_FLOAT32, 1},
      {"cnn, mixed_bfloat16, recompute", cnn, N_LAYERS(cnn), 12, 1, KN_PRECISION_MIXED_BFLOAT16, 1},
      {"residual", residual, N_LAYERS(residual), 8, 3, KN_PRECISION_FLOAT32, 0},
      {"residual, mixed_bfloat16, recompute", residual, N_LAYERS(residual), 8, 3,
       KN_PRECISION_MIXED_BFLOAT16, 1},
      {"flatten last", flatten_last, N_LAYERS(flatten_last), 8, 3, KN_PRECISION_FLOAT32, 0},
      {"flatten last, mixed_bfloat16, recompute", flatten_last, N_LAYERS(flatten_last), 8, 3,
       KN_PRECISION_MIXED_BFLOAT16, 1},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    char what[96];
    snprintf(what, sizeof what, "%s, in place %s", cases[c].what, inplace ? "on" : "off");
    kn_model m = build_model(cases[c].layers, cases[c].n_layers, cases[c].side, cases[c].channels,
                             cases[c].precision, cases[c].recompute);
    check_plan(&m, inplace, cases[c].recompute, what);
    kn_model_free(&m);
  }
}

static void live_values_never_overlap_and_kept_values_survive(void **state) {
  (void)state;
  check_no_overlap(0);
  check_no_overlap(1);
}

/* Training accuracy is counted from the logits a training step leaves:
 * they must be the forward pass's, not a buffer backward reused. */
static void logits_that_are_a_view_survive_a_training_step(void **state) {
  (void)state;
  const kn_precision precisions[] = {KN_PRECISION_FLOAT32, KN_PRECISION_MIXED_BFLOAT16};
  for (int p = 0; p < 2; p++) {
    for (int recompute = 0; recompute < 2; recompute++) {
      kn_model m =
          build_model(flatten_last, N_LAYERS(flatten_last), 8, 3, precisions[p], recompute);
      char err[256];
      assert_int_equal(kn_graph_compile(m.graph, 3, NULL, err, sizeof err), KN_OK);
      float *x = kn_node_data(m.graph, m.x);
      for (size_t k = 0; k < 16 * m.example_size; k++) x[k] = sinf(0.61f * (float)k);
      int32_t *y = kn_node_data(m.graph, m.y);
      for (int r = 0; r < 16; r++) y[r] = r % m.n_classes;
      const float *logits = kn_node_data(m.graph, m.logits);
      float trained[16 * 5], forward[16 * 5];
      assert_int_equal(m.n_outputs, 5);
      assert_int_equal(kn_graph_run(m.graph, KN_RUN_TRAIN, 16, err, sizeof err), KN_OK);
      memcpy(trained, logits, sizeof trained);
      assert_int_equal(kn_graph_run(m.graph, KN_RUN_FORWARD, 16, err, sizeof err), KN_OK);
      memcpy(forward, logits, sizeof forward);
      float worst = 0.0f, largest = 0.0f;
      for (int k = 0; k < 16 * 5; k++) {
        float d = fabsf(trained[k] - forward[k]);
        if (!(d <= worst)) worst = d;
        if (fabsf(forward[k]) > largest) largest = fabsf(forward[k]);
      }
      assert_true(largest > 1e-3f); /* the forward logits are not zeros themselves */
      if (worst != 0.0f)
        fail_msg("%s, recompute %d: the logits a training step leaves are %g from a forward run's",
                 kn_precision_name(precisions[p]), recompute, (double)worst);
      kn_model_free(&m);
    }
  }
}

static void planned_arena_beats_one_buffer_per_node(void **state) {
  (void)state;
  kn_model m = build_mlp(128, 512);
  kn_plan_stats st;
  char err[256];
  assert_int_equal(kn_graph_compile(m.graph, 1, &st, err, sizeof err), KN_OK);
  print_message("arena %zu bytes, one buffer per node %zu bytes (%.2fx)\n", st.arena_bytes,
                st.naive_bytes, (double)st.naive_bytes / (double)st.arena_bytes);
  assert_true(st.arena_bytes > 0);
  assert_true((double)st.naive_bytes / (double)st.arena_bytes >= 1.3);
  /* Parameters live in the flat buffer: 784*512+512 + 512*256+256 + 256*10+10. */
  assert_int_equal(kn_param_count(m.graph), 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10);
  assert_int_equal(st.param_bytes, kn_param_count(m.graph) * sizeof(float));
  kn_model_free(&m);
}

/* The plan alone: the same figures as a full compile, nothing allocated,
 * and a model too large for any machine measured all the same. */
static void plan_only_reports_the_plan_and_allocates_nothing(void **state) {
  (void)state;
  kn_model full = build_mlp(128, 512), planned = build_mlp(128, 512);
  kn_plan_stats a, b;
  char err[256];
  assert_int_equal(kn_graph_compile(full.graph, 1, &a, err, sizeof err), KN_OK);
  kn_graph_set_plan_only(planned.graph);
  struct mallinfo2 before = mallinfo2();
  assert_int_equal(kn_graph_compile(planned.graph, 1, &b, err, sizeof err), KN_OK);
  struct mallinfo2 after = mallinfo2();
  assert_int_equal(b.arena_bytes, a.arena_bytes);
  assert_int_equal(b.param_bytes, a.param_bytes);
  assert_int_equal(b.grad_bytes, a.grad_bytes);
  assert_null(kn_node_data(planned.graph, planned.x)); /* never runnable */
  /* Planning's own scratch is small: far less than the arena and buffers. */
  assert_true(after.hblkhd - before.hblkhd < a.arena_bytes);
  kn_model_free(&full);
  kn_model_free(&planned);
  kn_model huge = build_mlp(32, 65536);
  kn_graph_set_plan_only(huge.graph);
  assert_int_equal(kn_graph_compile(huge.graph, 1, &b, err, sizeof err), KN_OK);
  const size_t huge_params =
      (size_t)784 * 65536 + 65536 + (size_t)65536 * 32768 + 32768 + 32768 * 10 + 10;
  assert_int_equal(b.param_bytes, huge_params * sizeof(float));
  kn_model_free(&huge);
}

static void running_a_step_allocates_nothing(void **state) {
  (void)state;
  kn_model m = build_mlp(64, 64);
  char err[256];
  assert_int_equal(kn_graph_compile(m.graph, 1, NULL, err, sizeof err), KN_OK);
  memset(kn_node_data(m.graph, m.x), 0, 64 * 784 * sizeof(float));
  memset(kn_node_data(m.graph, m.y), 0, 64 * sizeof(int32_t));
  /* Warm up once (OpenBLAS sets up its threads' buffers on first use). */
  assert_int_equal(kn_graph_run(m.graph, KN_RUN_TRAIN, 64, err, sizeof err), KN_OK);
  struct mallinfo2 before = mallinfo2();
  for (int i = 0; i < 5; i++) {
    assert_int_equal(kn_graph_run(m.graph, KN_RUN_TRAIN, i % 2 ? 64 : 17, err, sizeof err), KN_OK);
  }
  struct mallinfo2 after = mallinfo2();
  assert_int_equal(after.uordblks, before.uordblks);
  assert_int_equal(after.hblkhd, before.hblkhd);
  kn_model_free(&m);
}

static void same_seed_gives_same_initial_weights(void **state) {
  (void)state;
  kn_model a = build_mlp(8, 32), b = build_mlp(8, 32), c = build_mlp(8, 32);
  char err[256];
  assert_int_equal(kn_graph_compile(a.graph, 42, NULL, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(b.graph, 42, NULL, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(c.graph, 43, NULL, err, sizeof err), KN_OK);
  size_t n = kn_param_count(a.graph);
  assert_memory_equal(kn_params(a.graph), kn_params(b.graph), n * sizeof(float));
  assert_memory_not_equal(kn_params(a.graph), kn_params(c.graph), n * sizeof(float));
  /* glorot_uniform bounds for the first kernel: sqrt(6 / (784 + 32)). */
  const float *w = kn_params(a.graph);
  float limit = 0.0857492926f;
  for (int i = 0; i < 784 * 32; i++) assert_true(w[i] >= -limit && w[i] <= limit);
  kn_model_free(&a);
  kn_model_free(&b);
  kn_model_free(&c);
}

static void model_build_refuses_dense_on_unflattened_input(void **state) {
  (void)state;
  kn_layer_config layers[1] = {
      {.type = KN_LAYER_DENSE, .name = "dense_0", .units = 10, .use_bias = 1}};
  kn_model_config cfg = {.input_ndim = 3,
                         .input_shape = {28, 28, 1},
                         .n_layers = 1,
                         .layers = layers,
                         .batch_size = 4};
  kn_model m;
  char err[256];
  assert_int_equal(kn_model_build(&cfg, &m, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "add a flatten layer"));
  assert_null(m.graph);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(live_values_never_overlap_and_kept_values_survive),
      cmocka_unit_test(logits_that_are_a_view_survive_a_training_step),
      cmocka_unit_test(planned_arena_beats_one_buffer_per_node),
      cmocka_unit_test(plan_only_reports_the_plan_and_allocates_nothing),
      cmocka_unit_test(running_a_step_allocates_nothing),
      cmocka_unit_test(same_seed_gives_same_initial_weights),
      cmocka_unit_test(model_build_refuses_dense_on_unflattened_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
