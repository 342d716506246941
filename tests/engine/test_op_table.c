/* test_op_table.c — the op table's shape rules: every op has one, and every
 * node a model of each layer kind builds (forward, backward, mixed
 * precision casts, recomputed values) holds the shape its op's rule gives. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"
#include "graph_internal.h"
#include "layer_kinds.h"

#define BATCH 4

static void every_op_has_a_name_and_a_shape_rule(void **state) {
  (void)state;
  for (int op = 0; op < KN_OP_COUNT; op++) {
    if (!kn_op_defs[op].name || !kn_op_defs[op].shape)
      fail_msg("op %d (%s) has no name or no shape rule", op, kn_op_name(op));
  }
}

/* Node i's rule applied again to a copy with its shape wiped. */
static void check_node(kn_graph *g, kn_node i, const char *what) {
  const kn_node_rec *n = &g->nodes[i];
  /* inputs, parameters, constants and masks carry their dims; a reshape
   * its target */
  const int given = kn_op_defs[n->op].shape == kn_shape_given;
  kn_node_rec again = *n;
  if (!given && n->op != KN_OP_RESHAPE) {
    again.ndim = 0;
    memset(again.dims, 0, sizeof again.dims);
  }
  if (!given) again.batched = -1;
  if (kn_op_defs[n->op].shape(g, &again) != 0) {
    char err[256];
    kn_graph_error(g, err, sizeof err);
    fail_msg("%s: node %s: its rule fails: %s", what, n->name, err);
  }
  int same = again.ndim == n->ndim && again.dtype == n->dtype && again.batched == n->batched;
  for (int d = 0; same && d < n->ndim; d++) same = again.dims[d] == n->dims[d];
  if (!same) {
    char sn[64], sa[64];
    kn_shape_str(n, sn, sizeof sn);
    kn_shape_str(&again, sa, sizeof sa);
    fail_msg("%s: node %s (%s) is %s batched %d, its rule gives %s batched %d", what, n->name,
             kn_op_name(n->op), sn, n->batched, sa, again.batched);
  }
}

static void every_node_holds_the_shape_its_rule_gives(void **state) {
  (void)state;
  static const kn_precision precisions[] = {KN_PRECISION_FLOAT32, KN_PRECISION_MIXED_BFLOAT16,
                                            KN_PRECISION_MIXED_FLOAT16};
  int ops_seen[KN_OP_COUNT] = {0};
  for (int p = 0; p < 3; p++) {
    for (int recompute = 0; recompute < 2; recompute++) {
      for (int k = 0; k < KN_TEST_MODELS; k++) {
        kn_model_config cfg = {.input_ndim = 3,
                               .input_shape = {8, 8, 3},
                               .n_layers = kn_test_models[k].n_layers,
                               .layers = kn_test_models[k].layers,
                               .batch_size = BATCH,
                               .seed = 11,
                               .precision = precisions[p],
                               .recompute = recompute};
        char err[256], what[96];
        snprintf(what, sizeof what, "%s, %s, recompute %d", kn_test_models[k].name,
                 kn_precision_name(cfg.precision), recompute);
        kn_model m;
        if (kn_model_build(&cfg, &m, err, sizeof err) != KN_OK)
          fail_msg("build (%s): %s", what, err);
        int casts = 0;
        for (kn_node i = 0; i < m.graph->n_nodes; i++) {
          check_node(m.graph, i, what);
          ops_seen[m.graph->nodes[i].op] = 1;
          casts += m.graph->nodes[i].op == KN_OP_CAST;
        }
        if (p > 0 && casts == 0) fail_msg("%s: no cast node", what);
        kn_model_free(&m);
      }
    }
  }
  /* the layers' own ops and their gradients were all checked */
  static const kn_op wanted[] = {
      KN_OP_IM2COL,    KN_OP_DWCONV,      KN_OP_DWCONV_DX,    KN_OP_DWCONV_DW,  KN_OP_POOL,
      KN_OP_POOL_GRAD, KN_OP_BN_STATS,    KN_OP_BN_GRAD_X,    KN_OP_CONCAT,     KN_OP_SLICE,
      KN_OP_REDUCE,    KN_OP_REDUCE_ROWS, KN_OP_DROPOUT_MASK, KN_OP_UNARY_GRAD, KN_OP_RESHAPE};
  for (size_t k = 0; k < sizeof wanted / sizeof wanted[0]; k++)
    if (!ops_seen[wanted[k]]) fail_msg("no %s node in any model", kn_op_name(wanted[k]));
}

/* The rule shapes what a builder pushes: a valid convolution of (B, 8, 8, 3)
 * by a 3x3 kernel of 5 filters is (B, 6, 6, 5), batched, and the column
 * gradient of a too-small window is refused naming the op and the shape. */
static void the_rule_shapes_pushed_nodes_and_names_bad_shapes(void **state) {
  (void)state;
  kn_graph *g = kn_graph_new();
  const int xd[4] = {BATCH, 8, 8, 3}, wd[4] = {3, 3, 3, 5};
  kn_node x = kn_input(g, "x", KN_F32, 4, xd);
  kn_node w = kn_param(g, "w", 4, wd, KN_INIT_GLOROT_UNIFORM);
  kn_window win = {.kh = 3,
                   .kw = 3,
                   .stride_h = 1,
                   .stride_w = 1,
                   .dilation_h = 1,
                   .dilation_w = 1,
                   .padding = KN_PAD_VALID};
  kn_node y = kn_conv2d(g, x, w, &win);
  assert_true(y >= 0);
  const kn_node_rec *Y = &g->nodes[y];
  assert_int_equal(Y->ndim, 4);
  assert_int_equal(Y->dims[0], BATCH);
  assert_int_equal(Y->dims[1], 6);
  assert_int_equal(Y->dims[2], 6);
  assert_int_equal(Y->dims[3], 5);
  assert_int_equal(Y->batched, 1);
  kn_node_rec bad = kn_node_proto(KN_OP_COL2IM, KN_F32);
  bad.attr.conv = (kn_conv_attrs){.kh = 3, .kw = 3, .oh = 6, .ow = 6, .h = 8, .w = 8};
  bad.n_inputs = 1;
  bad.inputs[0] = x;
  assert_int_equal(kn_graph_push(g, &bad), -1);
  char err[256];
  assert_int_equal(kn_graph_error(g, err, sizeof err), KN_EINVAL);
  assert_string_equal(err,
                      "col2im: needs columns (B*OH*OW, KH*KW*C) of its window, got (4, 8, 8, 3)");
  kn_graph_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_op_has_a_name_and_a_shape_rule),
      cmocka_unit_test(every_node_holds_the_shape_its_rule_gives),
      cmocka_unit_test(the_rule_shapes_pushed_nodes_and_names_bad_shapes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
