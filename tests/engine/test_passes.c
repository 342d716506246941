/* Graph passes: each on alone, all on, all but it, none, and the unoptimized plan
 * give bit-for-bit the same losses, logits, gradients and moving
 * statistics on an MLP, a CNN with every layer type and a hand-made graph
 * (implicit_input_grad, which sums in another order, the same values to
 * rounding); each pass the test toggles fires on its graph (counts in the
 * plan stats, and for implicit_input_grad the node it makes); in-place
 * reuse shrinks the arena; the unoptimized plan has one buffer per node; and a
 * training step of the CNN allocates nothing. */
#include <malloc.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "amx.h"
#include "engine.h"
#include "graph_internal.h"

enum { BATCH = 6 };

/* The precision train_threaded's models train in. */
static kn_precision run_precision = KN_PRECISION_FLOAT32;

static const kn_layer_config cnn_layers[] = {
    /* 16 filters, and 16 channels into sep and conv2: kiln's GEMM cuts
     * products 16 wide into narrow tiles, whose rows may be neighbours */
    {.type = KN_LAYER_CONV2D,
     .name = "conv",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_MAX_POOL2D, .name = "mp1"},
    {.type = KN_LAYER_BATCH_NORM, .name = "bn"},
    {.type = KN_LAYER_ACTIVATION, .name = "bn_relu", .activation = KN_ACT_RELU},
    {.type = KN_LAYER_SEPARABLE_CONV2D,
     .name = "sep",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_ADD, .name = "res", .n_inputs = 2, .inputs = {3, 4}},
    {.type = KN_LAYER_ACTIVATION, .name = "res_relu", .activation = KN_ACT_RELU},
    /* a stride-1 convolution whose input needs a gradient: implicit_input_grad */
    {.type = KN_LAYER_CONV2D,
     .name = "conv2",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_DEPTHWISE_CONV2D,
     .name = "dw",
     .kernel_size = {3, 3},
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_MAX_POOL2D, .name = "mp"},
    {.type = KN_LAYER_DROPOUT, .name = "drop", .rate = 0.2f},
    {.type = KN_LAYER_FLATTEN, .name = "flat"},
    {.type = KN_LAYER_DENSE, .name = "d1", .units = 8, .use_bias = 1, .activation = KN_ACT_RELU},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .use_bias = 1},
};

enum { CNN_LAYERS = sizeof cnn_layers / sizeof cnn_layers[0] };

/* A padded convolution, then two that need no padding: a "valid" 3x3 one
 * and a 1x1 one with stride 2 on an even size, whose GEMMs read their
 * inputs in place (the first layer's input is fed, and always padded). */
static const kn_layer_config unpadded_layers[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "same",
     .filters = 4,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "valid",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_VALID,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "proj",
     .filters = 8,
     .kernel_size = {1, 1},
     .strides = {2, 2},
     .padding = KN_PAD_SAME,
     .use_bias = 0},
    {.type = KN_LAYER_FLATTEN, .name = "flat"},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .use_bias = 1},
};

enum { UNPADDED = 2, UNPADDED_LAYERS = sizeof unpadded_layers / sizeof unpadded_layers[0] };

/* Branches concatenated (concat_views): three into one (two binary
 * concats, the inner one placed in the outer's output), that again with
 * the stem (a third level), and that with itself along the height (read
 * twice by one concat: copied, as are its gradient's slices, which an add
 * sums). */
static const kn_layer_config branched_layers[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "stem",
     .filters = 8,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "b1",
     .filters = 4,
     .kernel_size = {1, 1},
     .use_bias = 1,
     .activation = KN_ACT_RELU,
     .n_inputs = 1,
     .inputs = {0}},
    {.type = KN_LAYER_CONV2D,
     .name = "b3",
     .filters = 6,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .n_inputs = 1,
     .inputs = {0}},
    {.type = KN_LAYER_AVG_POOL2D,
     .name = "bpool",
     .pool_size = {3, 3},
     .strides = {1, 1},
     .padding = KN_PAD_SAME,
     .n_inputs = 1,
     .inputs = {0}},
    {.type = KN_LAYER_ACTIVATION, .name = "bpool_act", .activation = KN_ACT_TANH},
    {.type = KN_LAYER_CONCATENATE, .name = "cat", .n_inputs = 3, .inputs = {1, 2, 4}},
    {.type = KN_LAYER_CONCATENATE, .name = "cat_stem", .n_inputs = 2, .inputs = {5, 0}},
    {.type = KN_LAYER_CONCATENATE, .name = "cat_h", .n_inputs = 2, .inputs = {6, 6}, .axis = 1},
    {.type = KN_LAYER_MAX_POOL2D, .name = "mp"},
    {.type = KN_LAYER_FLATTEN, .name = "flat"},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .use_bias = 1},
};

enum { BRANCHED = 3, BRANCHED_LAYERS = sizeof branched_layers / sizeof branched_layers[0] };

/* Batch norms after a convolution without bias (then a relu), after one
 * with a bias, and after a dense layer, each foldable (bn_fold); and one
 * after a convolution whose relu comes first, which is not. */
static const kn_layer_config folded_layers[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "c1",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME},
    {.type = KN_LAYER_BATCH_NORM, .name = "bn1"},
    {.type = KN_LAYER_ACTIVATION, .name = "bn1_relu", .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "c2",
     .filters = 8,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1},
    {.type = KN_LAYER_BATCH_NORM, .name = "bn2"},
    {.type = KN_LAYER_CONV2D,
     .name = "c3",
     .filters = 8,
     .kernel_size = {1, 1},
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_BATCH_NORM, .name = "bn3"},
    {.type = KN_LAYER_FLATTEN, .name = "flat"},
    {.type = KN_LAYER_DENSE, .name = "d", .units = 12, .use_bias = 1},
    {.type = KN_LAYER_BATCH_NORM, .name = "bn4"},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .use_bias = 1},
};

enum { FOLDED = 4, FOLDED_LAYERS = sizeof folded_layers / sizeof folded_layers[0] };

/* Strided and dilated convolutions whose inputs need gradients
 * (col2im_chunks): 3x3 stride 2 "same" (padded below and right only), a
 * dilated 3x3 "same", and a 3x3 stride 2 "valid" one (a 1x1 stride-2
 * projection is the unpadded graph's). */
static const kn_layer_config strided_layers[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "stem",
     .filters = 8,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "down",
     .filters = 16,
     .kernel_size = {3, 3},
     .strides = {2, 2},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "dilated",
     .filters = 12,
     .kernel_size = {3, 3},
     .dilation_rate = {2, 2},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "down2",
     .filters = 8,
     .kernel_size = {3, 3},
     .strides = {2, 2},
     .padding = KN_PAD_VALID,
     .use_bias = 0},
    {.type = KN_LAYER_FLATTEN, .name = "flat"},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .use_bias = 1},
};

enum { STRIDED = 5, STRIDED_LAYERS = sizeof strided_layers / sizeof strided_layers[0] };

/* Strided convolutions over 16, 32 and 48 channels (their input gradients
 * summed directly where the CPU has AVX-512F, conv_dx.c), on a 10 x 10
 * input: 3x3 stride 2 "same" padded below and right only (10 -> 5), then
 * on both sides (5 -> 3), and a 1x1 stride-2 projection. */
static const kn_layer_config strided16_layers[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "stem",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "down",
     .filters = 32,
     .kernel_size = {3, 3},
     .strides = {2, 2},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "down2",
     .filters = 48,
     .kernel_size = {3, 3},
     .strides = {2, 2},
     .padding = KN_PAD_SAME,
     .use_bias = 0,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "proj",
     .filters = 8,
     .kernel_size = {1, 1},
     .strides = {2, 2},
     .padding = KN_PAD_VALID,
     .use_bias = 0},
    {.type = KN_LAYER_FLATTEN, .name = "flat"},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .use_bias = 1},
};

/* The same layers on a 52 x 52 input: rows of 26 and 13 columns of one
 * remainder, more than the direct sums' widest blocks (24 columns of 16
 * channels, 12 of 32). */
/* A residual block: the branch's batch norm read only by the add
 * (fuse_adds_into); the shortcut's gradient meets the branch's in an
 * add read only by the stem's relu gradient (fuse_add_relu_grads). */
static const kn_layer_config residual_layers[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "stem",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "branch",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 0},
    {.type = KN_LAYER_BATCH_NORM, .name = "branch_bn"},
    {.type = KN_LAYER_ADD, .name = "res", .n_inputs = 2, .inputs = {0, 2}},
    {.type = KN_LAYER_ACTIVATION, .name = "res_relu", .activation = KN_ACT_RELU},
    {.type = KN_LAYER_FLATTEN, .name = "flat"},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .use_bias = 1},
};

enum { RESIDUAL = 8, RESIDUAL_LAYERS = sizeof residual_layers / sizeof residual_layers[0] };

/* A downsampling residual block over 16 channels: a 3x3 stride-2
 * convolution and a 1x1 stride-2 projection of the stem, added; their
 * input gradients meet in an add (fuse_adds_into). */
static const kn_layer_config down_layers[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "stem",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "down",
     .filters = 32,
     .kernel_size = {3, 3},
     .strides = {2, 2},
     .padding = KN_PAD_SAME,
     .use_bias = 0},
    {.type = KN_LAYER_CONV2D,
     .name = "proj",
     .filters = 32,
     .kernel_size = {1, 1},
     .strides = {2, 2},
     .padding = KN_PAD_SAME,
     .use_bias = 0,
     .n_inputs = 1,
     .inputs = {0}},
    {.type = KN_LAYER_ADD, .name = "res", .n_inputs = 2, .inputs = {1, 2}},
    {.type = KN_LAYER_ACTIVATION, .name = "res_relu", .activation = KN_ACT_RELU},
    {.type = KN_LAYER_FLATTEN, .name = "flat"},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .use_bias = 1},
};

enum { DOWN = 9, DOWN_LAYERS = sizeof down_layers / sizeof down_layers[0] };

/* An identity residual block behind a batch-normed stem, as the zoo
 * ResNet's first: the stem's relu gradient goes into its norm's
 * (bn_grads), so the add where the branch's input gradient (Winograd's)
 * meets the shortcut's is read by the norm's gradient alone
 * (fuse_adds_into). */
static const kn_layer_config resbn_layers[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "stem",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 0},
    {.type = KN_LAYER_BATCH_NORM, .name = "stem_bn"},
    {.type = KN_LAYER_ACTIVATION, .name = "stem_relu", .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "branch",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 0},
    {.type = KN_LAYER_BATCH_NORM, .name = "branch_bn"},
    {.type = KN_LAYER_ADD, .name = "res", .n_inputs = 2, .inputs = {2, 4}},
    {.type = KN_LAYER_ACTIVATION, .name = "res_relu", .activation = KN_ACT_RELU},
    {.type = KN_LAYER_FLATTEN, .name = "flat"},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .use_bias = 1},
};

enum { RESBN = 10, RESBN_LAYERS = sizeof resbn_layers / sizeof resbn_layers[0] };

enum {
  STRIDED16 = 6,
  WIDE16 = 7,
  STRIDED16_LAYERS = sizeof strided16_layers / sizeof strided16_layers[0]
};

static const kn_layer_config mlp_layers[] = {
    {.type = KN_LAYER_FLATTEN, .name = "flat"},
    {.type = KN_LAYER_DENSE, .name = "d1", .units = 16, .use_bias = 1, .activation = KN_ACT_RELU},
    {.type = KN_LAYER_DENSE, .name = "d2", .units = 12, .use_bias = 1, .activation = KN_ACT_RELU},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .use_bias = 1},
};

typedef struct result {
  float loss, eval_loss;
  float logits[BATCH * 3];
  float *grads, *states;
  size_t n_grads, n_states;
  kn_plan_stats st;
  int conv_input_grads;         /* KN_OP_CONV_INPUT_GRAD nodes after compile */
  int col2im_gemms;             /* KN_OP_COL2IM_GEMM nodes */
  int conv_pad_views;           /* KN_OP_CONV_PAD nodes that are views of their input */
  int relus_from_beta;          /* bn_grad_x nodes that recompute their relu's mask */
  int direct_dx;                /* col2im_gemm nodes summed directly (conv_dx.c) */
  int add_relu_grads;           /* relu_grad nodes that took in their add */
  int bn_adds;                  /* bn_apply nodes that took in the add after them */
  int col2im_adds;              /* col2im_gemm nodes that took in the add after them */
  int col2im_adds_in_place;     /* those writing over the other term's storage */
  int input_grad_adds;          /* conv_input_grad nodes that took in the add after them */
  int input_grad_adds_in_place; /* those writing over the other term's storage */
} result;

/* Live nodes of op in a compiled graph. */
static int count_op(const kn_graph *g, kn_op op) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) n += !g->nodes[i].dead && g->nodes[i].op == op;
  return n;
}

/* unoptimized: 0 = passes as given; 1 = the unoptimized plan (no passes,
 * no buffer reuse). */
static result train_threaded(int cnn, unsigned passes, int unoptimized, int threads) {
  const int side = cnn == STRIDED16 ? 10 : cnn == WIDE16 ? 52 : 8;
  kn_model_config cfg = {.input_ndim = 3,
                         .input_shape = {side, side, 2},
                         .n_layers = cnn == RESBN                        ? RESBN_LAYERS
                                     : cnn == DOWN                       ? DOWN_LAYERS
                                     : cnn == RESIDUAL                   ? RESIDUAL_LAYERS
                                     : cnn == STRIDED16 || cnn == WIDE16 ? STRIDED16_LAYERS
                                     : cnn == FOLDED                     ? FOLDED_LAYERS
                                     : cnn == BRANCHED                   ? BRANCHED_LAYERS
                                     : cnn == UNPADDED                   ? UNPADDED_LAYERS
                                     : cnn == STRIDED                    ? STRIDED_LAYERS
                                     : cnn                               ? CNN_LAYERS
                                                                         : 4,
                         .layers = cnn == RESBN                        ? resbn_layers
                                   : cnn == DOWN                       ? down_layers
                                   : cnn == RESIDUAL                   ? residual_layers
                                   : cnn == STRIDED16 || cnn == WIDE16 ? strided16_layers
                                   : cnn == FOLDED                     ? folded_layers
                                   : cnn == BRANCHED                   ? branched_layers
                                   : cnn == UNPADDED                   ? unpadded_layers
                                   : cnn == STRIDED                    ? strided_layers
                                   : cnn                               ? cnn_layers
                                                                       : mlp_layers,
                         .batch_size = BATCH,
                         .seed = 3,
                         .precision = run_precision};
  kn_model m;
  char err[512] = "";
  if (kn_model_build(&cfg, &m, err, sizeof err)) fail_msg("build: %s", err);
  if (unoptimized) {
    kn_graph_set_unoptimized(m.graph, 1);
  } else {
    kn_graph_set_passes(m.graph, passes);
  }
  kn_graph_set_threads(m.graph, threads);
  result r;
  memset(&r, 0, sizeof r);
  if (kn_graph_compile(m.graph, 17, &r.st, err, sizeof err)) fail_msg("compile: %s", err);
  r.conv_input_grads = count_op(m.graph, KN_OP_CONV_INPUT_GRAD);
  r.col2im_gemms = count_op(m.graph, KN_OP_COL2IM_GEMM);
  for (int i = 0; i < m.graph->n_nodes; i++) {
    const kn_node_rec *n = &m.graph->nodes[i];
    r.conv_pad_views += !n->dead && n->op == KN_OP_CONV_PAD && n->storage == KN_STORE_VIEW;
    r.relus_from_beta += !n->dead && n->op == KN_OP_BN_GRAD_X && n->attr.bn.relu_from_beta;
    r.direct_dx += !n->dead && n->op == KN_OP_COL2IM_GEMM && n->direct_dx;
    r.add_relu_grads += !n->dead && n->op == KN_OP_RELU_GRAD && n->n_inputs == 3;
    r.bn_adds += !n->dead && n->op == KN_OP_BN_APPLY && n->n_inputs == 5;
    r.col2im_adds += !n->dead && n->op == KN_OP_COL2IM_GEMM && n->n_inputs == 3;
    r.input_grad_adds += !n->dead && n->op == KN_OP_CONV_INPUT_GRAD && n->n_inputs == 3;
    r.input_grad_adds_in_place += !n->dead && n->op == KN_OP_CONV_INPUT_GRAD && n->n_inputs == 3 &&
                                  n->arena_offset == m.graph->nodes[n->inputs[2]].arena_offset;
    r.col2im_adds_in_place += !n->dead && n->op == KN_OP_COL2IM_GEMM && n->n_inputs == 3 &&
                              n->arena_offset == m.graph->nodes[n->inputs[2]].arena_offset;
  }
  kn_rng rng;
  kn_rng_seed(&rng, 5);
  float *x = kn_node_data(m.graph, m.x);
  for (size_t i = 0; i < BATCH * m.example_size; i++) x[i] = 2 * kn_rng_uniform(&rng) - 1;
  int32_t *y = kn_node_data(m.graph, m.y);
  for (int i = 0; i < BATCH; i++) y[i] = i % 3;
  /* Two training steps (the second sees moved statistics), then evaluation. */
  for (int s = 0; s < 2; s++) {
    if (kn_graph_run(m.graph, KN_RUN_TRAIN, BATCH - s, err, sizeof err)) fail_msg("%s", err);
  }
  r.loss = *(float *)kn_node_data(m.graph, m.loss);
  r.n_grads = kn_param_count(m.graph);
  r.grads = malloc(r.n_grads * sizeof(float));
  memcpy(r.grads, kn_grads(m.graph), r.n_grads * sizeof(float));
  r.n_states = 0;
  for (int i = 0; i < kn_state_node_count(m.graph); i++) {
    int nd, dims[KN_MAX_DIMS];
    kn_node_shape(m.graph, kn_state_node(m.graph, i), &nd, dims);
    r.n_states += (size_t)dims[0];
  }
  r.states = malloc((r.n_states + 1) * sizeof(float));
  memcpy(r.states, kn_state_data(m.graph), r.n_states * sizeof(float));
  if (cnn == FOLDED) { /* a step of SGD, so that gamma and beta are not 1 and 0 */
    float *p = kn_params(m.graph);
    for (size_t i = 0; i < r.n_grads; i++) p[i] -= 0.5f * r.grads[i];
  }
  if (kn_graph_run(m.graph, KN_RUN_FORWARD, BATCH, err, sizeof err)) fail_msg("%s", err);
  r.eval_loss = *(float *)kn_node_data(m.graph, m.loss);
  memcpy(r.logits, kn_node_data(m.graph, m.logits), sizeof r.logits);
  kn_model_free(&m);
  return r;
}

static result train_once(int cnn, unsigned passes, int unoptimized) {
  return train_threaded(cnn, passes, unoptimized, 1);
}

static void assert_same(const result *a, const result *b, const char *what) {
  if (memcmp(&a->loss, &b->loss, sizeof a->loss) != 0 ||
      memcmp(&a->eval_loss, &b->eval_loss, sizeof a->eval_loss) != 0) {
    fail_msg("%s: losses %.9g / %.9g vs %.9g / %.9g", what, a->loss, a->eval_loss, b->loss,
             b->eval_loss);
  }
  if (memcmp(a->logits, b->logits, sizeof a->logits) != 0) fail_msg("%s: logits differ", what);
  assert_int_equal(a->n_grads, b->n_grads);
  for (size_t i = 0; i < a->n_grads; i++) {
    if (memcmp(&a->grads[i], &b->grads[i], sizeof(float)) != 0) {
      fail_msg("%s: gradient %zu: %.9g vs %.9g", what, i, a->grads[i], b->grads[i]);
    }
  }
  assert_int_equal(a->n_states, b->n_states);
  assert_memory_equal(a->states, b->states, a->n_states * sizeof(float));
}

static void release(result *r) {
  free(r->grads);
  free(r->states);
}

/* A hand-made graph: a duplicate, a constant subgraph and a dead branch,
 * the work of cse, const_fold and dce (model graphs have none of it);
 * loss = sum((x w + x w) * (2 * 0.5)). */
static result train_hand_made(unsigned passes) {
  kn_graph *g = kn_graph_new();
  kn_node x = kn_input(g, "x", KN_F32, 2, (int[]){4, 3});
  kn_node w = kn_param(g, "w", 2, (int[]){3, 3}, KN_INIT_GLOROT_UNIFORM);
  kn_node a1 = kn_matmul(g, x, w, 0, 0), a2 = kn_matmul(g, x, w, 0, 0); /* duplicates */
  kn_node c = kn_scale(g, kn_constant(g, 1, (int[]){3}, 2.0f), 0.5f);   /* constant 1.0 */
  kn_node out = kn_mul(g, kn_add(g, a1, a2), c);
  kn_relu(g, x); /* read by nothing and not kept: dead */
  kn_node loss = kn_sum(g, out, -1, 0);
  char err[256];
  assert_int_equal(kn_autodiff(g, loss, err, sizeof err), KN_OK);
  kn_graph_set_passes(g, passes);
  result r;
  memset(&r, 0, sizeof r);
  assert_int_equal(kn_graph_compile(g, 1, &r.st, err, sizeof err), KN_OK);
  float *xd = kn_node_data(g, x);
  for (int i = 0; i < 12; i++) xd[i] = (float)i;
  assert_int_equal(kn_graph_run(g, KN_RUN_TRAIN, 4, err, sizeof err), KN_OK);
  r.loss = r.eval_loss = *(float *)kn_node_data(g, loss);
  r.n_grads = kn_param_count(g);
  r.grads = malloc(r.n_grads * sizeof(float));
  memcpy(r.grads, kn_grads(g), r.n_grads * sizeof(float));
  r.states = malloc(sizeof(float));
  /* loss = sum(2 x w): d loss / d w[k][j] = 2 sum_r x[r][k] = 2 (18 + 4 k) */
  for (int k = 0; k < 3; k++)
    for (int j = 0; j < 3; j++) assert_float_equal(r.grads[k * 3 + j], 2 * (18 + 4 * k), 1e-4);
  kn_graph_free(g);
  return r;
}

enum { MLP = 1, CNN = 2, HAND_MADE = 4, BRANCHES = 8 };

static result train_graph(int graph, unsigned passes) {
  if (graph == HAND_MADE) return train_hand_made(passes);
  return train_once(graph == BRANCHES ? BRANCHED : graph == CNN, passes, 0);
}

/* How many times pass applied, as the plan reports it. */
static int fired(const kn_plan_stats *st, unsigned pass) {
  switch (pass) {
  case KN_PASS_DCE: return st->n_dead;
  case KN_PASS_CONST_FOLD: return st->n_folded;
  case KN_PASS_CSE: return st->n_cse;
  case KN_PASS_FUSION: return st->n_fused;
  case KN_PASS_INPLACE: return st->n_inplace;
  case KN_PASS_IMPLICIT_COLUMNS: return st->n_implicit;
  case KN_PASS_IMPLICIT_INPUT_GRAD: return st->n_implicit_input_grads;
  case KN_PASS_BIAS_GRAD_IN_GEMM: return st->n_bias_grads_in_gemm;
  case KN_PASS_POOL_ARGMAX: return st->n_pool_argmax;
  case KN_PASS_POOL_GRAD_IN_GEMM: return st->n_pool_grads_in_gemm;
  case KN_PASS_BN_GRADS: return st->n_bn_grads;
  case KN_PASS_CONCAT_VIEWS: return st->n_concat_views;
  case KN_PASS_WINOGRAD: return st->n_winograd;
  case KN_PASS_COL2IM_CHUNKS: return st->n_col2im_chunks;
  }
  fail_msg("unknown pass %u", pass);
  return 0;
}

/* Gradients of a pass that sums in another order (implicit_input_grad):
 * within 2^-18 of their norm. Its sums run over at most 36 taps and
 * filters, and any order of 36 float32 terms is within 36 x 2^-24, about
 * 2^-19, of the sum of their sizes; 2^-18 leaves a factor of two for what
 * batch norm's and the residual's backward carry on (1.2 x 2^-24 is
 * seen), and a gradient that lost one tap moves by far more. */
static void assert_close_gradients(const result *a, const result *b, const char *what) {
  assert_int_equal(a->n_grads, b->n_grads);
  double norm = 0.0, diff = 0.0;
  for (size_t i = 0; i < a->n_grads; i++) {
    norm += (double)a->grads[i] * a->grads[i];
    diff += ((double)a->grads[i] - b->grads[i]) * ((double)a->grads[i] - b->grads[i]);
  }
  print_message("%s: gradients differ by %.3g of their norm\n", what, sqrt(diff / norm));
  if (!(norm > 0) || sqrt(diff / norm) > 0x1p-18)
    fail_msg("%s: gradients differ by %g of their norm", what, sqrt(diff / norm));
}

typedef struct pass_case {
  unsigned pass;
  const char *name;
  int graphs;    /* where it must fire (MLP, CNN, HAND_MADE, BRANCHES) */
  int needs_all; /* it acts on what other passes leave, so fires only with them */
  /* 1: the same values; 0: gradients to rounding only; FORWARD_TOO: the
   * forward values as well */
  int same_values;
} pass_case;

enum { FORWARD_TOO = -1 };

/* |a - b| within rel of the largest |b| over n values. */
static void assert_close_values(const float *a, const float *b, size_t n, double rel,
                                const char *what, const char *which) {
  double top = 0.0, diff = 0.0;
  for (size_t i = 0; i < n; i++) {
    top = fmax(top, fabs((double)b[i]));
    diff = fmax(diff, fabs((double)a[i] - b[i]));
  }
  print_message("%s: %s differ by %.3g of their largest\n", what, which,
                top > 0 ? diff / top : diff);
  if (diff > rel * top) fail_msg("%s: %s differ by %g (largest %g)", what, which, diff, top);
}

/* a against b: the same bits, or (values to rounding only) gradients
 * close and everything else the same bits, or (FORWARD_TOO) the losses,
 * logits and moving statistics within float rounding of each other as
 * well: a pass that computes a forward product another way (winograd). */
static void compare(result *a, result *b, int same_values, const char *what) {
  if (same_values == FORWARD_TOO) {
    assert_close_gradients(a, b, what);
    /* a 3x3 product's sums run in another order, through transforms whose
     * constants reach 8 and 1/24: 2^-16 of the largest value */
    const float la[2] = {a->loss, a->eval_loss}, lb[2] = {b->loss, b->eval_loss};
    assert_close_values(la, lb, 2, 0x1p-16, what, "losses");
    assert_close_values(a->logits, b->logits, BATCH * 3, 0x1p-16, what, "logits");
    assert_int_equal(a->n_states, b->n_states);
    assert_close_values(a->states, b->states, a->n_states, 0x1p-16, what, "moving statistics");
    return;
  }
  if (!same_values) {
    assert_close_gradients(a, b, what);
    free(a->grads);
    free(b->grads);
    a->grads = b->grads = NULL;
    a->n_grads = b->n_grads = 0;
  }
  assert_same(a, b, what);
}

#define ALL_EXACT (KN_PASS_ALL & ~KN_PASS_WINOGRAD)

/* The pass alone against none, and all passes against all but it, on each
 * graph: the same results; and it fires on the graphs it is for (alone,
 * unless it needs the others; with all on), never with it off. */
static void check_pass(const pass_case *c) {
  for (int graph = MLP; graph <= BRANCHES; graph <<= 1) {
    const char *gname = graph == MLP         ? "mlp"
                        : graph == CNN       ? "cnn"
                        : graph == HAND_MADE ? "hand-made"
                                             : "branched";
    /* winograd changes values to rounding and takes over the products the
     * others prepare: off where another pass's bits are compared */
    const unsigned every = c->pass == KN_PASS_WINOGRAD ? KN_PASS_ALL : ALL_EXACT;
    result none = train_graph(graph, 0), alone = train_graph(graph, c->pass);
    result all = train_graph(graph, every), but = train_graph(graph, every & ~c->pass);
    char what[96];
    snprintf(what, sizeof what, "%s, %s alone vs none", gname, c->name);
    compare(&none, &alone, c->same_values, what);
    snprintf(what, sizeof what, "%s, all vs all but %s", gname, c->name);
    compare(&but, &all, c->same_values, what);
    assert_int_equal(fired(&none.st, c->pass), 0);
    assert_int_equal(fired(&but.st, c->pass), 0);
    if (graph & c->graphs) {
      print_message("%s: %s fires %d times alone, %d with every pass\n", gname, c->name,
                    fired(&alone.st, c->pass), fired(&all.st, c->pass));
      if (!c->needs_all && fired(&alone.st, c->pass) == 0)
        fail_msg("%s: %s alone never fires", gname, c->name);
      if (fired(&all.st, c->pass) == 0)
        fail_msg("%s: %s never fires with every pass", gname, c->name);
    }
    release(&none);
    release(&alone);
    release(&all);
    release(&but);
  }
}

static void each_pass_on_or_off_gives_identical_results(void **state) {
  (void)state;
  static const pass_case cases[] = {
      {KN_PASS_DCE, "dce", HAND_MADE, 0, 1},
      {KN_PASS_CONST_FOLD, "const_fold", MLP | CNN | HAND_MADE, 0, 1},
      {KN_PASS_CSE, "cse", HAND_MADE, 0, 1},
      {KN_PASS_FUSION, "fusion", MLP | CNN, 0, 1},
      {KN_PASS_INPLACE, "inplace", MLP | CNN, 0, 1},
      {KN_PASS_POOL_ARGMAX, "pool_argmax", CNN, 0, 1},
      {KN_PASS_BN_GRADS, "bn_grads", CNN, 0, 1},
      {KN_PASS_CONCAT_VIEWS, "concat_views", BRANCHES, 0, 1},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) check_pass(&cases[c]);
  for (int cnn = 0; cnn <= 1; cnn++) {
    result none = train_once(cnn, 0, 0);
    assert_true(none.loss > 0.5f); /* 3 classes from random weights: about log 3 */
    result unoptimized = train_once(cnn, 0, 1);
    assert_same(&none, &unoptimized, cnn ? "cnn unoptimized" : "mlp unoptimized");
    release(&unoptimized);
    release(&none);
  }
}

/* The passes that hand kiln's GEMM work apply only where it runs:
 * elsewhere the test skips, saying why, rather than passes. */
static void require_kiln_gemm(const char *what) {
  if (kn_cpu_gemm() != KN_GEMM_KILN) {
    print_message("SKIPPED: kiln's GEMM does not run here (no AVX-512F, or KILN_GEMM=openblas), "
                  "so %s never apply\n",
                  what);
    skip();
  }
}

static void each_kiln_gemm_pass_on_or_off_gives_identical_results(void **state) {
  (void)state;
  require_kiln_gemm("its passes");
  static const pass_case cases[] = {
      {KN_PASS_IMPLICIT_COLUMNS, "implicit_columns", CNN, 0, 1},
      {KN_PASS_IMPLICIT_INPUT_GRAD, "implicit_input_grad", CNN, 0, 0},
      {KN_PASS_BIAS_GRAD_IN_GEMM, "bias_grad_in_gemm", MLP | CNN, 0, 1},
      /* the first pool's gradient in conv's weight gradient: it reads the
       * argmax pool_argmax records, through the relu gradient fusion joins */
      {KN_PASS_POOL_GRAD_IN_GEMM, "pool_grad_in_gemm", CNN, 1, 1},
      /* conv2's forward (its bias and relu), weight and bias gradients
       * and input gradient by F(4x4, 3x3), reading the padded inputs
       * implicit_columns and implicit_input_grad make */
      {KN_PASS_WINOGRAD, "winograd", CNN, 1, FORWARD_TOO},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) check_pass(&cases[c]);
  /* implicit_input_grad turns conv2's input gradient (a GEMM into columns
   * and col2im) into one transposed convolution node. */
  result on = train_once(1, KN_PASS_IMPLICIT_INPUT_GRAD, 0), off = train_once(1, 0, 0);
  assert_int_equal(on.conv_input_grads, 1);
  assert_int_equal(off.conv_input_grads, 0);
  release(&on);
  release(&off);
  /* and the dilated one's (stride 1, dilation 2: dy padded by 2 (3 - 1) -
   * 2 = 2 and read with the dilation), to rounding; the strided ones stay */
  result dil = train_once(STRIDED, KN_PASS_IMPLICIT_INPUT_GRAD, 0),
         cols = train_once(STRIDED, 0, 0);
  assert_int_equal(dil.conv_input_grads, 1);
  assert_int_equal(cols.conv_input_grads, 0);
  compare(&cols, &dil, 0, "strided graph, implicit_input_grad on the dilated convolution");
  release(&dil);
  release(&cols);
  /* Convolutions without padding read their input where it lies (their
   * padded input is a view): the same bits as materialized columns. */
  result views = train_once(UNPADDED, KN_PASS_IMPLICIT_COLUMNS, 0),
         columns = train_once(UNPADDED, 0, 0);
  assert_int_equal(views.conv_pad_views, 2);
  assert_int_equal(columns.conv_pad_views, 0);
  assert_same(&views, &columns, "unpadded convolutions, implicit columns on and off");
  result all = train_once(UNPADDED, KN_PASS_ALL, 0);
  assert_int_equal(all.conv_pad_views, 2);
  release(&views);
  release(&columns);
  release(&all);
}

/* col2im_chunks: the input gradients of the strided graph's three strided
 * or dilated 3x3 convolutions (two with every other exact pass: the
 * dilated one is implicit_input_grad's then) and of the unpadded graph's
 * 1x1 stride-2 projection run as col2im_gemm nodes (their columns never
 * whole): the same bits as the column GEMM and col2im, alone and with
 * every other exact pass, on 1 and 3 threads, in one chunk of the whole
 * batch and in chunks of one image (shared by 3 threads: 2 each, then 1
 * and 2 for the second step's batch of 5); and no more arena. */
static void col2im_chunks_give_the_same_bits(void **state) {
  (void)state;
  require_kiln_gemm("col2im_chunks and the passes it builds on");
  const int graphs[2] = {STRIDED, UNPADDED}, want[2] = {3, 1}, want_all[2] = {2, 1};
  for (int k = 0; k < 4; k++) {
    kn_col2im_set_chunk_bytes(k < 2 ? 0 : 1);
    for (int threads = 1; threads <= 3; threads += 2) {
      result alone = train_threaded(graphs[k % 2], KN_PASS_COL2IM_CHUNKS, 0, threads),
             none = train_threaded(graphs[k % 2], 0, 0, threads),
             all = train_threaded(graphs[k % 2], ALL_EXACT, 0, threads),
             but = train_threaded(graphs[k % 2], ALL_EXACT & ~KN_PASS_COL2IM_CHUNKS, 0, threads);
      assert_int_equal(alone.col2im_gemms, want[k % 2]);
      assert_int_equal(alone.st.n_col2im_chunks, want[k % 2]);
      assert_int_equal(all.col2im_gemms, want_all[k % 2]);
      assert_int_equal(none.col2im_gemms, 0);
      assert_int_equal(but.col2im_gemms, 0);
      char what[96];
      snprintf(what, sizeof what, "%s, %d threads: col2im_chunks alone vs none",
               k % 2 ? "unpadded" : "strided", threads);
      assert_same(&alone, &none, what);
      snprintf(what, sizeof what, "%s, %d threads: all vs all but col2im_chunks",
               k % 2 ? "unpadded" : "strided", threads);
      assert_same(&all, &but, what);
      assert_true(all.st.arena_bytes <= but.st.arena_bytes);
      if (threads == 1)
        print_message("%s: arena %zu bytes with col2im_chunks, %zu without\n",
                      k % 2 ? "unpadded" : "strided", all.st.arena_bytes, but.st.arena_bytes);
      release(&alone);
      release(&none);
      release(&all);
      release(&but);
    }
  }
  kn_col2im_set_chunk_bytes(0);
}

/* conv_dx: the strided graphs' three input gradients over 16, 32 and 48
 * channels summed directly, against col2im_gemm's columns: the gradients
 * to rounding (their sums run in another order), everything else the
 * same bits; and directly, the same bits on 1 and 3 threads. */
static void strided_input_gradients_summed_directly_match_the_columns(void **state) {
  (void)state;
  require_kiln_gemm("col2im_gemm, which the direct sums run for,");
  const int graphs[2] = {STRIDED16, WIDE16};
  for (int k = 0; k < 2; k++) {
    result direct[2];
    for (int i = 0; i < 2; i++) {
      const int threads = 1 + 2 * i;
      kn_conv_dx_set_direct(0);
      result cols = train_threaded(graphs[k], ALL_EXACT, 0, threads);
      kn_conv_dx_set_direct(1);
      direct[i] = train_threaded(graphs[k], ALL_EXACT, 0, threads);
      assert_int_equal(cols.col2im_gemms, 3);
      assert_int_equal(cols.direct_dx, 0);
      assert_int_equal(direct[i].direct_dx, 3);
      char what[96];
      snprintf(what, sizeof what, "%s, %d threads: direct vs columns", k ? "52 x 52" : "10 x 10",
               threads);
      compare(&direct[i], &cols, 0, what);
      release(&cols);
    }
    assert_same(&direct[0], &direct[1], "direct, 1 vs 3 threads");
    release(&direct[0]);
    release(&direct[1]);
  }
}

/* fusion at a residual block: the add after the branch's batch norm
 * taken into the norm, and in backward the add the stem's relu gradient
 * alone reads taken into it; the same bits as without fusion (and as with
 * every other pass and it, or without it: bn_fold folds the norm for
 * evaluation either way), on 1 and 3 threads. */
static void a_residual_blocks_adds_are_taken_into_its_norm_and_relu_gradient(void **state) {
  (void)state;
  for (int threads = 1; threads <= 3; threads += 2) {
    result fused = train_threaded(RESIDUAL, KN_PASS_FUSION, 0, threads),
           none = train_threaded(RESIDUAL, 0, 0, threads),
           all = train_threaded(RESIDUAL, KN_PASS_ALL, 0, threads),
           but = train_threaded(RESIDUAL, KN_PASS_ALL & ~KN_PASS_FUSION, 0, threads);
    assert_int_equal(fused.add_relu_grads, 1);
    assert_int_equal(all.add_relu_grads, 1);
    assert_int_equal(none.add_relu_grads, 0);
    assert_int_equal(but.add_relu_grads, 0);
    assert_int_equal(fused.bn_adds, 1);
    assert_int_equal(all.bn_adds, 1);
    assert_int_equal(none.bn_adds, 0);
    assert_int_equal(but.bn_adds, 0);
    assert_true(all.st.n_bn_folds >= 1);
    assert_same(&fused, &none, "fusion alone vs none");
    assert_same(&all, &but, "all vs all but fusion");
    release(&fused);
    release(&none);
    release(&all);
    release(&but);
  }
}

/* fusion with col2im_chunks: a downsampling block's two input gradients,
 * summed directly, meet in an add that the projection's (fewer taps)
 * takes in, adding the other as it stores dx: the same bits as without
 * fusion, on 1 and 3 threads; not where the columns' path runs. */
static void a_projections_input_gradient_takes_in_the_add(void **state) {
  (void)state;
  require_kiln_gemm("col2im_gemm, whose adds it takes in,");
  for (int threads = 1; threads <= 3; threads += 2) {
    result all = train_threaded(DOWN, KN_PASS_ALL, 0, threads),
           but = train_threaded(DOWN, KN_PASS_ALL & ~KN_PASS_FUSION, 0, threads);
    kn_conv_dx_set_direct(0);
    result cols = train_threaded(DOWN, KN_PASS_ALL, 0, threads);
    kn_conv_dx_set_direct(1);
    assert_int_equal(all.col2im_adds, 1);
    assert_int_equal(all.col2im_adds_in_place, 1);
    assert_int_equal(all.direct_dx, 2);
    assert_int_equal(but.col2im_adds, 0);
    assert_int_equal(cols.col2im_adds, 0);
    assert_int_equal(cols.add_relu_grads, 1); /* there the relu gradient takes the add */
    assert_same(&all, &but, "all vs all but fusion");
    release(&all);
    release(&but);
    release(&cols);
  }
}

/* fusion with winograd: the add where an identity block's branch input
 * gradient (Winograd's) meets the shortcut's, read by the stem's batch
 * norm gradient alone, taken into the input gradient, which adds the
 * shortcut's term as it stores each output, over that term's storage:
 * the same bits as without fusion, on 1 and 3 threads. */
static void identity_block_takes_in_the_add(kn_precision precision, const char *what) {
  for (int threads = 1; threads <= 3; threads += 2) {
    run_precision = precision;
    result all = train_threaded(RESBN, KN_PASS_ALL, 0, threads),
           but = train_threaded(RESBN, KN_PASS_ALL & ~KN_PASS_FUSION, 0, threads);
    run_precision = KN_PRECISION_FLOAT32; /* (before a failure leaves the test) */
    assert_int_equal(all.input_grad_adds, 1);
    assert_int_equal(all.input_grad_adds_in_place, 1);
    assert_int_equal(but.input_grad_adds, 0);
    assert_same(&all, &but, what);
    release(&all);
    release(&but);
  }
}

static void an_identity_blocks_input_gradient_takes_in_the_add(void **state) {
  (void)state;
  require_kiln_gemm("Winograd's products, which it takes the add into,");
  identity_block_takes_in_the_add(KN_PRECISION_FLOAT32, "all vs all but fusion");
}

/* The same under mixed_bfloat16 where the input gradient runs directly on
 * AMX tiles (amx_conv.c, winograd 4): it adds the shortcut's term as it
 * stores each output, over that term's storage, then rounds the sum
 * through bf16 as the add did; the same bits as without fusion, on 1 and
 * 3 threads. */
static void an_identity_blocks_input_gradient_on_amx_tiles_takes_in_the_add(void **state) {
  (void)state;
  require_kiln_gemm("products on AMX tiles, which it takes the add into,");
  if (!kn_amx_available() || !kn_winograd_bf16_products()) {
    print_message("SKIPPED: no AMX-BF16 on this CPU (or KILN_AMX=off): no products on tiles\n");
    skip();
  }
  identity_block_takes_in_the_add(KN_PRECISION_MIXED_BFLOAT16,
                                  "mixed_bfloat16: all vs all but fusion");
}

/* concat_views on the branched graph: the two inner concatenations are
 * written into their readers' outputs, and two of the gradient's slices
 * (each read only by slices) are read where they lie; the concatenation
 * read twice by one concat, the slices an add or a relu gradient reads and
 * the concatenation along the height read by a pool are copied as before.
 * The same bits on 1 and 2 threads (the copies split over blocks), and no
 * more arena than with the copies. */
static void concat_views_write_concatenations_in_place(void **state) {
  (void)state;
  result on = train_threaded(BRANCHED, KN_PASS_ALL, 0, 1);
  result off = train_threaded(BRANCHED, KN_PASS_ALL & ~KN_PASS_CONCAT_VIEWS, 0, 1);
  result two = train_threaded(BRANCHED, KN_PASS_ALL, 0, 2);
  assert_int_equal(on.st.n_concat_views, 4);
  assert_int_equal(off.st.n_concat_views, 0);
  assert_same(&on, &off, "branched, concat_views on and off");
  assert_same(&on, &two, "branched, concat_views on 1 and 2 threads");
  assert_true(on.st.arena_bytes <= off.st.arena_bytes);
  print_message("branched: arena %zu bytes with concat_views, %zu without\n", on.st.arena_bytes,
                off.st.arena_bytes);
  release(&on);
  release(&off);
  release(&two);
}

/* bn_fold: three of the four batch norms are folded into their matmul
 * for forward-only runs. Training is the same bits with the pass on or
 * off (and the moving statistics it evaluates with); evaluation the same
 * values to rounding, on 1 and 2 threads. */
static void bn_fold_folds_batch_norms_for_evaluation(void **state) {
  (void)state;
  for (int threads = 1; threads <= 2; threads++) {
    result on = train_threaded(FOLDED, KN_PASS_ALL, 0, threads);
    result off = train_threaded(FOLDED, KN_PASS_ALL & ~KN_PASS_BN_FOLD, 0, threads);
    assert_int_equal(on.st.n_bn_folds, 3);
    assert_int_equal(off.st.n_bn_folds, 0);
    assert_memory_equal(&on.loss, &off.loss, sizeof on.loss);
    assert_int_equal(on.n_grads, off.n_grads);
    assert_memory_equal(on.grads, off.grads, on.n_grads * sizeof(float));
    assert_memory_equal(on.states, off.states, on.n_states * sizeof(float));
    /* the loss relative to itself, the logits to their largest */
    double worst = fabs((double)on.eval_loss - off.eval_loss) / fabs((double)off.eval_loss);
    double largest = 0.0, diff = 0.0;
    for (int i = 0; i < BATCH * 3; i++) {
      largest = fmax(largest, fabs((double)off.logits[i]));
      diff = fmax(diff, fabs((double)on.logits[i] - off.logits[i]));
    }
    print_message("loss %.9g / %.9g, logits up to %.6g differ by up to %.3g\n", on.eval_loss,
                  off.eval_loss, largest, diff);
    worst = fmax(worst, diff / largest);
    print_message("bn_fold, %d thread(s): evaluation within %.3g of the unfolded one\n", threads,
                  worst);
    if (!(worst <= 1e-5)) fail_msg("folded evaluation differs by %g", worst);
    /* ... and is not the unfolded one bit for bit: the fold ran */
    assert_true(memcmp(on.logits, off.logits, sizeof on.logits) != 0);
    release(&on);
    release(&off);
  }
}

static void passes_do_their_work_and_inplace_shrinks_the_arena(void **state) {
  (void)state;
  result all = train_once(0, KN_PASS_ALL, 0);
  /* Three dense layers: two matmul + bias + relu and one matmul + bias. */
  assert_int_equal(all.st.n_fused, 3);
  /* Each dense layer's bias gradient summed by its weight gradient's GEMM
   * (kiln's GEMM only). */
  assert_int_equal(all.st.n_bias_grads_in_gemm, kn_cpu_gemm() == KN_GEMM_KILN ? 3 : 0);
  assert_true(all.st.n_inplace > 0);
  assert_true(all.st.n_folded >= 1); /* the loss gradient's seed */
  result no_inplace = train_once(0, KN_PASS_ALL & ~KN_PASS_INPLACE, 0);
  assert_int_equal(no_inplace.st.n_inplace, 0);
  assert_true(all.st.arena_bytes < no_inplace.st.arena_bytes);
  result cnn = train_once(1, KN_PASS_ALL, 0);
  /* The batch norm's backward writes its gamma and beta gradients and
   * takes the gradient of the relu after it. */
  assert_int_equal(cnn.st.n_bn_grads, 1);
  assert_int_equal(cnn.st.n_bn_relu_grads, 1);
  /* and recomputes where the relu passes from x, the statistics, gamma and
   * beta, instead of reading the relu's output */
  assert_int_equal(cnn.relus_from_beta, 1);
  /* the two 3x3 convolutions' GEMM + bias + relu, the separable pointwise
   * GEMM + bias + relu and the two dense layers; then the chains batch norm
   * + relu, add + relu (residual) and bias_add + relu (depthwise); then the
   * two max pools' gradients with the gradients of the relus they read. */
  assert_int_equal(cnn.st.n_fused, 10);
  /* The 3x3 convolutions' GEMMs read their columns in place where kiln's
   * GEMM runs (AVX-512F); elsewhere the columns stay materialized. */
  assert_int_equal(cnn.st.n_implicit, kn_cpu_gemm() == KN_GEMM_KILN ? 2 : 0);
  /* The bias gradients of the 3x3 convolutions, the pointwise convolution
   * and the two dense layers, in their weight gradients' GEMMs. */
  assert_int_equal(cnn.st.n_bias_grads_in_gemm, kn_cpu_gemm() == KN_GEMM_KILN ? 5 : 0);
  /* Both max pools record their argmax for their gradients (test_precision
   * shows the plan shrinking on the test CNN, where the pool's input sets
   * the peak). */
  assert_int_equal(cnn.st.n_pool_argmax, 2);
  result unoptimized = train_once(1, 0, 1);
  assert_int_equal(unoptimized.st.n_fused + unoptimized.st.n_inplace + unoptimized.st.n_dead +
                       unoptimized.st.n_implicit,
                   0);
  assert_int_equal(unoptimized.st.arena_bytes, unoptimized.st.naive_bytes);
  printf("cnn arena %zu bytes planned, %zu unoptimized (one buffer per node)\n", cnn.st.arena_bytes,
         unoptimized.st.arena_bytes);
  assert_true(cnn.st.arena_bytes * 3 < unoptimized.st.arena_bytes * 2); /* 5.4x seen */
  release(&all);
  release(&no_inplace);
  release(&cnn);
  release(&unoptimized);

  /* The hand-made graph: cse, const_fold and dce do their work there. */
  result hand = train_hand_made(KN_PASS_ALL);
  assert_true(hand.st.n_cse >= 1);
  assert_true(hand.st.n_folded >= 2);
  assert_true(hand.st.n_dead >= 1);
  release(&hand);
}

/* The pool cuts loops by index and no output element is summed across
 * ranges, so every thread count gives the same bits. */
static void thread_counts_give_identical_results(void **state) {
  (void)state;
  for (int cnn = 0; cnn <= 1; cnn++) {
    result one = train_threaded(cnn, KN_PASS_ALL, 0, 1);
    for (int threads = 2; threads <= 3; threads++) {
      result r = train_threaded(cnn, KN_PASS_ALL, 0, threads);
      assert_same(&one, &r, cnn ? "cnn threads" : "mlp threads");
      release(&r);
    }
    release(&one);
  }
}

/* Baseline, AVX2 and AVX-512 kernels come from one source and must give the
 * same bits; paths this CPU lacks are refused by name and skipped. */
static void isa_paths_give_identical_results(void **state) {
  (void)state;
  char err[128];
  assert_int_equal(kn_cpu_set_isa(KN_ISA_BASELINE, err, sizeof err), KN_OK);
  assert_int_equal(kn_cpu_isa(), KN_ISA_BASELINE);
  result base[2] = {train_threaded(0, KN_PASS_ALL, 0, 2), train_threaded(1, KN_PASS_ALL, 0, 2)};
  int tested = 0;
  for (kn_isa isa = KN_ISA_AVX2; isa <= KN_ISA_AVX512; isa++) {
    if (kn_cpu_set_isa(isa, err, sizeof err) != KN_OK) {
      assert_non_null(strstr(err, kn_isa_name(isa)));
      printf("isa path %s: not on this CPU, skipped (%s)\n", kn_isa_name(isa), err);
      continue;
    }
    for (int cnn = 0; cnn <= 1; cnn++) {
      result r = train_threaded(cnn, KN_PASS_ALL, 0, 2);
      assert_same(&base[cnn], &r, kn_isa_name(isa));
      release(&r);
    }
    tested++;
  }
  printf("isa paths checked against the baseline: %d\n", tested);
  release(&base[0]);
  release(&base[1]);
  assert_int_equal(kn_cpu_set_isa(KN_ISA_AUTO, err, sizeof err), KN_OK);
  assert_int_not_equal(kn_cpu_isa(), KN_ISA_AUTO);
  if (tested == 0) {
    print_message("SKIPPED: this CPU has only the baseline path, nothing to compare it with\n");
    skip();
  }
}

static void a_cnn_training_step_allocates_nothing(void **state) {
  (void)state;
  kn_model_config cfg = {.input_ndim = 3,
                         .input_shape = {8, 8, 2},
                         .n_layers = CNN_LAYERS,
                         .layers = cnn_layers,
                         .batch_size = BATCH};
  kn_model m;
  char err[512];
  assert_int_equal(kn_model_build(&cfg, &m, err, sizeof err), KN_OK);
  kn_graph_set_threads(m.graph, 2); /* the pool's loops allocate nothing either */
  assert_int_equal(kn_graph_compile(m.graph, 1, NULL, err, sizeof err), KN_OK);
  memset(kn_node_data(m.graph, m.x), 0, BATCH * m.example_size * sizeof(float));
  memset(kn_node_data(m.graph, m.y), 0, BATCH * sizeof(int32_t));
  assert_int_equal(kn_graph_run(m.graph, KN_RUN_TRAIN, BATCH, err, sizeof err), KN_OK);
  struct mallinfo2 before = mallinfo2();
  for (int i = 0; i < 4; i++) {
    assert_int_equal(
        kn_graph_run(m.graph, i % 2 ? KN_RUN_TRAIN : KN_RUN_FORWARD, BATCH - i, err, sizeof err),
        KN_OK);
  }
  struct mallinfo2 after = mallinfo2();
  assert_int_equal(after.uordblks, before.uordblks);
  assert_int_equal(after.hblkhd, before.hblkhd);
  kn_model_free(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(each_pass_on_or_off_gives_identical_results),
      cmocka_unit_test(each_kiln_gemm_pass_on_or_off_gives_identical_results),
      cmocka_unit_test(passes_do_their_work_and_inplace_shrinks_the_arena),
      cmocka_unit_test(col2im_chunks_give_the_same_bits),
      cmocka_unit_test(strided_input_gradients_summed_directly_match_the_columns),
      cmocka_unit_test(a_residual_blocks_adds_are_taken_into_its_norm_and_relu_gradient),
      cmocka_unit_test(a_projections_input_gradient_takes_in_the_add),
      cmocka_unit_test(an_identity_blocks_input_gradient_takes_in_the_add),
      cmocka_unit_test(an_identity_blocks_input_gradient_on_amx_tiles_takes_in_the_add),
      cmocka_unit_test(concat_views_write_concatenations_in_place),
      cmocka_unit_test(bn_fold_folds_batch_norms_for_evaluation),
      cmocka_unit_test(thread_counts_give_identical_results),
      cmocka_unit_test(isa_paths_give_identical_results),
      cmocka_unit_test(a_cnn_training_step_allocates_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
