/* ops.c — the engine's full op set beyond the first cut (graph.c): the
 * builders (their argument checks; shapes come from the op table's rules,
 * shapes.c) for broadcasting arithmetic, activations,
 * reductions, layout ops, convolution, pooling, batch norm, dropout, losses
 * and metrics, and the gradient rule of each, which their op table records
 * (op_table.c) name and autodiff calls. Kernels are in cpu_kernels.inc. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"

static int valid(kn_graph *g, kn_node n, const char *op) {
  if (g->error_code) return 0;
  if (n < 0 || n >= g->n_nodes) {
    kn_graph_fail(g, KN_EINVAL, "%s: input node %d does not exist", op, n);
    return 0;
  }
  return 1;
}

static kn_node_rec proto(kn_op op, kn_dtype dtype, int ndim, const int *dims, int batched) {
  kn_node_rec p;
  memset(&p, 0, sizeof p);
  p.op = op;
  p.dtype = dtype;
  p.ndim = ndim;
  for (int d = 0; d < ndim; d++) p.dims[d] = dims[d];
  p.batched = batched;
  return p;
}

static kn_node push_inputs(kn_graph *g, kn_node_rec *p, int n_inputs, kn_node in0, kn_node in1,
                           kn_node in2, kn_node in3) {
  p->n_inputs = n_inputs;
  p->inputs[0] = in0;
  p->inputs[1] = in1;
  p->inputs[2] = in2;
  p->inputs[3] = in3;
  p->inputs[4] = -1;
  return kn_graph_push(g, p);
}

kn_node kn_push_op(kn_graph *g, kn_op op, const kn_node_attrs *attrs, int n_inputs, kn_node in0,
                   kn_node in1, kn_node in2) {
  if (g->error_code) return -1;
  kn_node_rec p = kn_node_proto(op, KN_F32);
  if (attrs) p.attr = *attrs;
  return push_inputs(g, &p, n_inputs, in0, in1, in2, -1);
}

static int need_f32(kn_graph *g, kn_node x, const char *what) {
  if (!valid(g, x, what)) return 0;
  if (g->nodes[x].dtype != KN_F32) {
    kn_graph_fail(g, KN_EINVAL, "%s: needs an f32 input, got %s", what,
                  kn_dtype_name(g->nodes[x].dtype));
    return 0;
  }
  return 1;
}

void kn_graph_use_f64(kn_graph *g) {
  if (g->compiled) {
    kn_graph_fail(g, KN_ESTATE, "use_f64: the graph is already compiled");
    return;
  }
  g->f64 = 1;
}

kn_node kn_constant(kn_graph *g, int ndim, const int *dims, float value) {
  if (g->error_code) return -1;
  if (ndim < 1 || ndim > KN_MAX_DIMS) {
    return kn_graph_fail(g, KN_EINVAL, "constant: rank must be 1..%d, got %d", KN_MAX_DIMS, ndim);
  }
  for (int d = 0; d < ndim; d++) {
    if (dims[d] < 1) {
      return kn_graph_fail(g, KN_EINVAL, "constant: dimension %d must be >= 1, got %d", d, dims[d]);
    }
  }
  kn_node_rec p = proto(KN_OP_FILL, KN_F32, ndim, dims, 0);
  p.attr.fill.value = value;
  return push_inputs(g, &p, 0, -1, -1, -1, -1);
}

kn_node kn_state(kn_graph *g, const char *name, int ndim, const int *dims, kn_init init) {
  if (g->error_code) return -1;
  if (ndim < 1 || ndim > KN_MAX_DIMS) {
    return kn_graph_fail(g, KN_EINVAL, "state: rank must be 1..%d, got %d", KN_MAX_DIMS, ndim);
  }
  kn_node_rec p = proto(KN_OP_STATE, KN_F32, ndim, dims, 0);
  p.storage = KN_STORE_STATE;
  p.init = init;
  p.keep = 1;
  snprintf(p.name, sizeof p.name, "%s", name ? name : "");
  return kn_graph_push_flat(g, &p, &g->states, &g->n_states, &g->cap_states, &g->n_state_floats,
                            "state");
}

int kn_state_node_count(const kn_graph *g) {
  return g->n_states;
}

kn_node kn_state_node(const kn_graph *g, int i) {
  return (i >= 0 && i < g->n_states) ? g->states[i] : -1;
}

void *kn_state_data(kn_graph *g) {
  return g->state_buf;
}

/* ---- broadcasting arithmetic ---- */

static kn_node binary(kn_graph *g, kn_binop op, kn_node a, kn_node b, const char *what) {
  if (!need_f32(g, a, what) || !need_f32(g, b, what)) return -1;
  kn_node_rec p = kn_node_proto(KN_OP_BINARY, KN_F32);
  p.attr.binary.op = op;
  return push_inputs(g, &p, 2, a, b, -1, -1);
}

kn_node kn_add_bcast(kn_graph *g, kn_node a, kn_node b) {
  return binary(g, KN_BIN_ADD, a, b, "add");
}
kn_node kn_sub(kn_graph *g, kn_node a, kn_node b) {
  return binary(g, KN_BIN_SUB, a, b, "sub");
}
kn_node kn_mul(kn_graph *g, kn_node a, kn_node b) {
  return binary(g, KN_BIN_MUL, a, b, "mul");
}
kn_node kn_div(kn_graph *g, kn_node a, kn_node b) {
  return binary(g, KN_BIN_DIV, a, b, "div");
}

static int same_shape(const kn_node_rec *a, const kn_node_rec *b) {
  if (a->ndim != b->ndim || a->batched != b->batched) return 0;
  for (int d = 0; d < a->ndim; d++) {
    if (a->dims[d] != b->dims[d]) return 0;
  }
  return 1;
}

/* dy reduced to the shape of `like` (a no-op when they already agree). */
static kn_node sum_to(kn_graph *g, kn_node dy, kn_node like) {
  if (dy < 0) return -1;
  if (same_shape(&g->nodes[dy], &g->nodes[like])) return dy;
  return kn_push_op(g, KN_OP_SUM_TO, NULL, 2, dy, like, -1);
}

/* ---- unary ---- */

static kn_node unary(kn_graph *g, kn_unop op, kn_node x, float alpha, const char *what) {
  if (!need_f32(g, x, what)) return -1;
  kn_node_rec p = kn_node_proto(KN_OP_UNARY, KN_F32);
  p.attr.unary.op = op;
  p.attr.unary.alpha = alpha;
  return push_inputs(g, &p, 1, x, -1, -1, -1);
}

kn_node kn_leaky_relu(kn_graph *g, kn_node x, float alpha) {
  return unary(g, KN_UN_LEAKY_RELU, x, alpha, "leaky_relu");
}
kn_node kn_elu(kn_graph *g, kn_node x, float alpha) {
  return unary(g, KN_UN_ELU, x, alpha, "elu");
}
kn_node kn_gelu(kn_graph *g, kn_node x) {
  return unary(g, KN_UN_GELU, x, 0.0f, "gelu");
}
kn_node kn_sigmoid(kn_graph *g, kn_node x) {
  return unary(g, KN_UN_SIGMOID, x, 0.0f, "sigmoid");
}
kn_node kn_tanh(kn_graph *g, kn_node x) {
  return unary(g, KN_UN_TANH, x, 0.0f, "tanh");
}
kn_node kn_scale(kn_graph *g, kn_node x, float alpha) {
  return unary(g, KN_UN_SCALE, x, alpha, "scale");
}
kn_node kn_abs(kn_graph *g, kn_node x) {
  return unary(g, KN_UN_ABS, x, 0.0f, "abs");
}
kn_node kn_square(kn_graph *g, kn_node x) {
  return unary(g, KN_UN_SQUARE, x, 0.0f, "square");
}

kn_node kn_log_softmax(kn_graph *g, kn_node x) {
  if (!need_f32(g, x, "log_softmax")) return -1;
  return kn_push_op(g, KN_OP_LOG_SOFTMAX, NULL, 1, x, -1, -1);
}

/* ---- reductions and layout ---- */

static kn_node reduce(kn_graph *g, kn_reduce_kind kind, kn_node x, int axis, int keepdims,
                      const char *what) {
  if (!need_f32(g, x, what)) return -1;
  const kn_node_rec *X = &g->nodes[x];
  if (axis < -1 || axis >= X->ndim) {
    return kn_graph_fail(g, KN_EINVAL, "%s: axis must be -1 (all) or 0..%d, got %d", what,
                         X->ndim - 1, axis);
  }
  kn_node_rec p = kn_node_proto(KN_OP_REDUCE, KN_F32);
  p.attr.reduce.kind = kind;
  p.attr.reduce.axis = axis;
  p.attr.reduce.keepdims = axis >= 0 && keepdims;
  return push_inputs(g, &p, 1, x, -1, -1, -1);
}

kn_node kn_sum(kn_graph *g, kn_node x, int axis, int keepdims) {
  return reduce(g, KN_RED_SUM, x, axis, keepdims, "sum");
}
kn_node kn_mean(kn_graph *g, kn_node x, int axis, int keepdims) {
  return reduce(g, KN_RED_MEAN, x, axis, keepdims, "mean");
}
kn_node kn_max(kn_graph *g, kn_node x, int axis, int keepdims) {
  return reduce(g, KN_RED_MAX, x, axis, keepdims, "max");
}

kn_node kn_transpose(kn_graph *g, kn_node x, const int *perm) {
  if (!need_f32(g, x, "transpose")) return -1;
  kn_node_rec p = kn_node_proto(KN_OP_TRANSPOSE, KN_F32);
  for (int d = 0; d < g->nodes[x].ndim; d++) p.attr.transpose.perm[d] = perm[d];
  return push_inputs(g, &p, 1, x, -1, -1, -1);
}

kn_node kn_flatten(kn_graph *g, kn_node x) {
  if (!valid(g, x, "flatten")) return -1;
  const kn_node_rec *X = &g->nodes[x];
  if (X->ndim == 2) return x;
  int flat[2] = {X->dims[0], 1};
  for (int d = 1; d < X->ndim; d++) flat[1] *= X->dims[d];
  return kn_reshape(g, x, 2, flat);
}

kn_node kn_concat(kn_graph *g, kn_node a, kn_node b, int axis) {
  if (!need_f32(g, a, "concat") || !need_f32(g, b, "concat")) return -1;
  kn_node_rec p = kn_node_proto(KN_OP_CONCAT, KN_F32);
  p.attr.slice.axis = axis < 0 ? axis + g->nodes[a].ndim : axis;
  return push_inputs(g, &p, 2, a, b, -1, -1);
}

kn_node kn_slice(kn_graph *g, kn_node x, int axis, int start, int len) {
  if (!need_f32(g, x, "slice")) return -1;
  kn_node_rec p = kn_node_proto(KN_OP_SLICE, KN_F32);
  p.attr.slice.axis = axis;
  p.attr.slice.start = start;
  p.attr.slice.len = len;
  return push_inputs(g, &p, 1, x, -1, -1, -1);
}

/* ---- convolution and pooling ---- */

/* Output size and padding of a window over x (B, H, W, C), TF's rules: same
 * gives ceil(H / stride) with the odd padding cell at the bottom/right. */
static int window_attrs(kn_graph *g, const kn_node_rec *X, const kn_window *w, kn_conv_attrs *attrs,
                        const char *what) {
  if (X->ndim != 4) {
    char sx[64];
    kn_shape_str(X, sx, sizeof sx);
    kn_graph_fail(g, KN_EINVAL, "%s: needs an NHWC input (B, H, W, C), got %s", what, sx);
    return 0;
  }
  if (w->kh < 1 || w->kw < 1 || w->stride_h < 1 || w->stride_w < 1 || w->dilation_h < 1 ||
      w->dilation_w < 1) {
    kn_graph_fail(g, KN_EINVAL,
                  "%s: kernel %dx%d, strides %dx%d and dilation %dx%d must all be >= 1", what,
                  w->kh, w->kw, w->stride_h, w->stride_w, w->dilation_h, w->dilation_w);
    return 0;
  }
  int in[2] = {X->dims[1], X->dims[2]}, k[2] = {w->kh, w->kw};
  int s[2] = {w->stride_h, w->stride_w}, dl[2] = {w->dilation_h, w->dilation_w};
  for (int i = 0; i < 2; i++) {
    int out, pad;
    if (!kn_window_axis(in[i], k[i], s[i], dl[i], w->padding, &out, &pad)) {
      kn_graph_fail(g, KN_EINVAL,
                    "%s: a window of %d (kernel %d, dilation %d) does not fit an input of %d "
                    "with valid padding",
                    what, dl[i] * (k[i] - 1) + 1, k[i], dl[i], in[i]);
      return 0;
    }
    *(i ? &attrs->ow : &attrs->oh) = out;
    *(i ? &attrs->pad_left : &attrs->pad_top) = pad;
  }
  attrs->h = X->dims[1];
  attrs->w = X->dims[2];
  attrs->kh = w->kh;
  attrs->kw = w->kw;
  attrs->sh = w->stride_h;
  attrs->sw = w->stride_w;
  attrs->dh = w->dilation_h;
  attrs->dw = w->dilation_w;
  return 1;
}

kn_node kn_conv2d(kn_graph *g, kn_node x, kn_node w, const kn_window *win) {
  if (!need_f32(g, x, "conv2d") || !need_f32(g, w, "conv2d")) return -1;
  const kn_node_rec *X = &g->nodes[x], *Wn = &g->nodes[w];
  kn_conv_attrs attrs = {0};
  if (!window_attrs(g, X, win, &attrs, "conv2d")) return -1;
  if (Wn->ndim != 4 || Wn->dims[0] != win->kh || Wn->dims[1] != win->kw ||
      Wn->dims[2] != X->dims[3]) {
    char sw[64];
    kn_shape_str(Wn, sw, sizeof sw);
    return kn_graph_fail(g, KN_EINVAL, "conv2d: kernel must be (%d, %d, %d, filters), got %s",
                         win->kh, win->kw, X->dims[3], sw);
  }
  /* read before pushing, which may move X and Wn */
  const int B = X->dims[0], Fo = Wn->dims[3];
  int wdims[2] = {win->kh * win->kw * Wn->dims[2], Fo};
  /* (B*OH*OW, KH*KW*C) x (KH*KW*C, F) = (B*OH*OW, F), which is NHWC. */
  kn_node_rec p = kn_node_proto(KN_OP_IM2COL, KN_F32);
  p.attr.conv = attrs;
  kn_node cols = push_inputs(g, &p, 1, x, -1, -1, -1);
  kn_node w2 = kn_reshape(g, w, 2, wdims);
  kn_node y = kn_matmul(g, cols, w2, 0, 0);
  int ydims[4] = {B, attrs.oh, attrs.ow, Fo};
  return kn_reshape(g, y, 4, ydims);
}

kn_node kn_depthwise_conv2d(kn_graph *g, kn_node x, kn_node w, const kn_window *win) {
  if (!need_f32(g, x, "depthwise_conv2d") || !need_f32(g, w, "depthwise_conv2d")) return -1;
  const kn_node_rec *X = &g->nodes[x], *Wn = &g->nodes[w];
  kn_conv_attrs attrs = {0};
  if (!window_attrs(g, X, win, &attrs, "depthwise_conv2d")) return -1;
  if (Wn->ndim != 4 || Wn->dims[0] != win->kh || Wn->dims[1] != win->kw ||
      Wn->dims[2] != X->dims[3]) {
    char sw[64];
    kn_shape_str(Wn, sw, sizeof sw);
    return kn_graph_fail(g, KN_EINVAL,
                         "depthwise_conv2d: kernel must be (%d, %d, %d, depth_multiplier), got %s",
                         win->kh, win->kw, X->dims[3], sw);
  }
  kn_node_rec p = kn_node_proto(KN_OP_DWCONV, KN_F32);
  p.attr.conv = attrs;
  return push_inputs(g, &p, 2, x, w, -1, -1);
}

static kn_node pool(kn_graph *g, kn_node x, const kn_window *win, int kind, const char *what) {
  if (!need_f32(g, x, what)) return -1;
  kn_window w = *win;
  w.dilation_h = w.dilation_w = 1;
  const kn_node_rec *X = &g->nodes[x];
  kn_conv_attrs attrs = {0};
  if (!window_attrs(g, X, &w, &attrs, what)) return -1;
  attrs.pool_kind = kind;
  kn_node_rec p = kn_node_proto(KN_OP_POOL, KN_F32);
  p.attr.conv = attrs;
  return push_inputs(g, &p, 1, x, -1, -1, -1);
}

kn_node kn_max_pool2d(kn_graph *g, kn_node x, const kn_window *win) {
  return pool(g, x, win, 0, "max_pool2d");
}
kn_node kn_avg_pool2d(kn_graph *g, kn_node x, const kn_window *win) {
  return pool(g, x, win, 1, "avg_pool2d");
}

kn_node kn_global_avg_pool2d(kn_graph *g, kn_node x) {
  if (!need_f32(g, x, "global_avg_pool2d")) return -1;
  const kn_node_rec *X = &g->nodes[x];
  if (X->ndim != 4) {
    char sx[64];
    kn_shape_str(X, sx, sizeof sx);
    return kn_graph_fail(g, KN_EINVAL, "global_avg_pool2d: needs (B, H, W, C), got %s", sx);
  }
  int dims[3] = {X->dims[0], X->dims[1] * X->dims[2], X->dims[3]};
  return kn_mean(g, kn_reshape(g, x, 3, dims), 1, 0);
}

/* ---- batch norm and dropout ---- */

static kn_node batch_norm(kn_graph *g, kn_node x, kn_node gamma, kn_node beta, kn_node moving_mean,
                          kn_node moving_var, float momentum, float epsilon, int synchronized) {
  if (!need_f32(g, x, "batch_norm") || !valid(g, gamma, "batch_norm") ||
      !valid(g, beta, "batch_norm") || !valid(g, moving_mean, "batch_norm") ||
      !valid(g, moving_var, "batch_norm"))
    return -1;
  const kn_node_rec *X = &g->nodes[x];
  int C = X->dims[X->ndim - 1];
  kn_node vecs[4] = {gamma, beta, moving_mean, moving_var};
  for (int i = 0; i < 4; i++) {
    const kn_node_rec *v = &g->nodes[vecs[i]];
    if (v->ndim != 1 || v->dims[0] != C || v->batched) {
      return kn_graph_fail(g, KN_EINVAL,
                           "batch_norm: gamma, beta and moving statistics must be (%d), "
                           "the last dim of the input",
                           C);
    }
  }
  if (!(momentum >= 0.0f && momentum < 1.0f) || !(epsilon > 0.0f)) {
    return kn_graph_fail(g, KN_EINVAL,
                         "batch_norm: momentum must be in [0, 1) and epsilon > 0, got %g and %g",
                         momentum, epsilon);
  }
  kn_node_rec p = kn_node_proto(KN_OP_BN_STATS, KN_F32);
  p.attr.bn.momentum = momentum;
  p.attr.bn.epsilon = epsilon;
  p.attr.bn.synchronized = synchronized;
  kn_node_rec a = kn_node_proto(KN_OP_BN_APPLY, KN_F32);
  kn_node stats = push_inputs(g, &p, 3, x, moving_mean, moving_var, -1);
  if (stats < 0) return -1;
  return push_inputs(g, &a, 4, x, stats, gamma, beta);
}

kn_node kn_batch_norm(kn_graph *g, kn_node x, kn_node gamma, kn_node beta, kn_node moving_mean,
                      kn_node moving_var, float momentum, float epsilon) {
  return batch_norm(g, x, gamma, beta, moving_mean, moving_var, momentum, epsilon, 0);
}

kn_node kn_batch_norm_synchronized(kn_graph *g, kn_node x, kn_node gamma, kn_node beta,
                                   kn_node moving_mean, kn_node moving_var, float momentum,
                                   float epsilon) {
  return batch_norm(g, x, gamma, beta, moving_mean, moving_var, momentum, epsilon, 1);
}

kn_node kn_dropout(kn_graph *g, kn_node x, float rate, uint64_t seed) {
  if (!need_f32(g, x, "dropout")) return -1;
  if (!(rate >= 0.0f && rate < 1.0f)) {
    return kn_graph_fail(g, KN_EINVAL, "dropout: rate must be in [0, 1), got %g", rate);
  }
  const kn_node_rec *X = &g->nodes[x];
  kn_node_rec p = proto(KN_OP_DROPOUT_MASK, KN_F32, X->ndim, X->dims, X->batched);
  p.attr.dropout.rate = rate;
  p.attr.dropout.seed = seed;
  kn_node mask = push_inputs(g, &p, 0, -1, -1, -1, -1);
  return kn_mul(g, x, mask);
}

/* ---- losses and metrics ---- */

static kn_node scalar_of(kn_graph *g, kn_op op, kn_node a, kn_node b, int n_inputs) {
  kn_node_rec p = kn_node_proto(op, KN_F32);
  return push_inputs(g, &p, n_inputs, a, b, -1, -1);
}

static int same_f32_pair(kn_graph *g, kn_node a, kn_node b, const char *what) {
  if (!need_f32(g, a, what) || !need_f32(g, b, what)) return 0;
  if (!same_shape(&g->nodes[a], &g->nodes[b])) {
    char sa[64], sb[64];
    kn_shape_str(&g->nodes[a], sa, sizeof sa);
    kn_shape_str(&g->nodes[b], sb, sizeof sb);
    kn_graph_fail(g, KN_EINVAL, "%s: predictions %s and targets %s must have one shape", what, sa,
                  sb);
    return 0;
  }
  return 1;
}

kn_node kn_softmax_xent_dense(kn_graph *g, kn_node logits, kn_node probs) {
  if (!same_f32_pair(g, logits, probs, "categorical_crossentropy")) return -1;
  if (g->nodes[logits].ndim != 2) {
    return kn_graph_fail(g, KN_EINVAL, "categorical_crossentropy: needs (B, C) logits");
  }
  return scalar_of(g, KN_OP_XENT_DENSE, logits, probs, 2);
}

kn_node kn_bce_logits(kn_graph *g, kn_node logits, kn_node targets) {
  if (!same_f32_pair(g, logits, targets, "binary_crossentropy")) return -1;
  return scalar_of(g, KN_OP_BCE_LOGITS, logits, targets, 2);
}

kn_node kn_mse(kn_graph *g, kn_node pred, kn_node target) {
  if (!same_f32_pair(g, pred, target, "mean_squared_error")) return -1;
  return kn_mean(g, kn_square(g, kn_sub(g, pred, target)), -1, 0);
}

kn_node kn_mae(kn_graph *g, kn_node pred, kn_node target) {
  if (!same_f32_pair(g, pred, target, "mean_absolute_error")) return -1;
  return kn_mean(g, kn_abs(g, kn_sub(g, pred, target)), -1, 0);
}

kn_node kn_top_k_accuracy(kn_graph *g, kn_node logits, kn_node labels, int k) {
  if (!need_f32(g, logits, "top_k_accuracy") || !valid(g, labels, "top_k_accuracy")) return -1;
  const kn_node_rec *L = &g->nodes[logits], *Y = &g->nodes[labels];
  if (L->ndim != 2 || Y->ndim != 1 || Y->dtype != KN_I32 || Y->dims[0] != L->dims[0]) {
    return kn_graph_fail(g, KN_EINVAL, "top_k_accuracy: needs logits (B, C) and i32 labels (B)");
  }
  if (k < 1 || k > L->dims[1]) {
    return kn_graph_fail(g, KN_EINVAL, "top_k_accuracy: k must be 1..%d, got %d", L->dims[1], k);
  }
  kn_node id = scalar_of(g, KN_OP_TOPK_ACCURACY, logits, labels, 2);
  if (id >= 0) {
    g->nodes[id].attr.top_k = k;
    g->nodes[id].requires_grad = 0; /* a metric: nothing flows back */
  }
  return id;
}

/* ---- gradient rules ---- */

/* Whether input k of n exists and depends on a parameter. */
static int needs(const kn_graph *g, const kn_node_rec *n, int k) {
  return n->n_inputs > k && g->nodes[n->inputs[k]].requires_grad;
}

/* Each rule reads a copy of its node: pushing nodes may move g->nodes. */

int kn_grad_binary(KN_GRAD_ARGS) {
  const kn_node_rec n = g->nodes[i];
  const kn_node a = n.inputs[0], b = n.inputs[1];
  const int need_a = needs(g, &n, 0), need_b = needs(g, &n, 1);
  kn_node da = -1, db = -1;
  switch (n.attr.binary.op) {
  case KN_BIN_ADD:
    da = dy;
    db = dy;
    break;
  case KN_BIN_SUB:
    da = dy;
    if (need_b) db = kn_scale(g, dy, -1.0f);
    break;
  case KN_BIN_MUL:
    if (need_a) da = kn_mul(g, dy, b);
    if (need_b) db = kn_mul(g, dy, a);
    break;
  case KN_BIN_DIV:
    if (need_a) da = kn_div(g, dy, b);
    /* d(a/b)/db = -y / b */
    if (need_b) db = kn_scale(g, kn_div(g, kn_mul(g, dy, i), b), -1.0f);
    break;
  }
  if (need_a && kn_grad_accumulate(g, grads, a, sum_to(g, da, a))) return -1;
  if (need_b && kn_grad_accumulate(g, grads, b, sum_to(g, db, b))) return -1;
  return 0;
}

int kn_grad_sum_to(KN_GRAD_ARGS) {
  (void)i, (void)dy, (void)grads;
  return kn_graph_fail(g, KN_EINVAL, "autodiff: sum_to is a gradient op; it has no gradient");
}

int kn_grad_unary(KN_GRAD_ARGS) {
  const kn_node_rec n = g->nodes[i];
  if (!needs(g, &n, 0)) return 0;
  const kn_node a = n.inputs[0];
  return kn_grad_accumulate(g, grads, a, kn_push_op(g, KN_OP_UNARY_GRAD, &n.attr, 3, dy, a, i));
}

int kn_grad_log_softmax(KN_GRAD_ARGS) {
  const kn_node_rec n = g->nodes[i];
  if (!needs(g, &n, 0)) return 0;
  return kn_grad_accumulate(g, grads, n.inputs[0],
                            kn_push_op(g, KN_OP_LOG_SOFTMAX_GRAD, NULL, 2, dy, i, -1));
}

int kn_grad_reduce(KN_GRAD_ARGS) {
  const kn_node_rec n = g->nodes[i];
  if (!needs(g, &n, 0)) return 0;
  const kn_node a = n.inputs[0];
  return kn_grad_accumulate(g, grads, a, kn_push_op(g, KN_OP_REDUCE_GRAD, &n.attr, 3, dy, a, i));
}

int kn_grad_transpose(KN_GRAD_ARGS) {
  const kn_node_rec n = g->nodes[i];
  if (!needs(g, &n, 0)) return 0;
  int inv[KN_MAX_DIMS];
  for (int d = 0; d < n.ndim; d++) inv[n.attr.transpose.perm[d]] = d;
  return kn_grad_accumulate(g, grads, n.inputs[0], kn_transpose(g, dy, inv));
}

int kn_grad_concat(KN_GRAD_ARGS) {
  const kn_node_rec n = g->nodes[i];
  const kn_node a = n.inputs[0], b = n.inputs[1];
  const int axis = n.attr.slice.axis, la = g->nodes[a].dims[axis], lb = g->nodes[b].dims[axis];
  if (needs(g, &n, 0) && kn_grad_accumulate(g, grads, a, kn_slice(g, dy, axis, 0, la))) return -1;
  if (needs(g, &n, 1) && kn_grad_accumulate(g, grads, b, kn_slice(g, dy, axis, la, lb))) return -1;
  return 0;
}

int kn_grad_slice(KN_GRAD_ARGS) {
  (void)dy, (void)grads;
  return kn_graph_fail(g, KN_EINVAL,
                       "autodiff: slice '%s' is a gradient op; differentiate through concat",
                       g->nodes[i].name);
}

int kn_grad_im2col(KN_GRAD_ARGS) {
  const kn_node_rec n = g->nodes[i];
  if (!needs(g, &n, 0)) return 0;
  const kn_node a = n.inputs[0];
  return kn_grad_accumulate(g, grads, a, kn_push_op(g, KN_OP_COL2IM, &n.attr, 1, dy, -1, -1));
}

int kn_grad_dwconv(KN_GRAD_ARGS) {
  const kn_node_rec n = g->nodes[i];
  const kn_node a = n.inputs[0], b = n.inputs[1];
  if (needs(g, &n, 0)) {
    kn_node dx = kn_push_op(g, KN_OP_DWCONV_DX, &n.attr, 2, dy, b, -1);
    if (kn_grad_accumulate(g, grads, a, dx)) return -1;
  }
  if (needs(g, &n, 1)) {
    kn_node dw = kn_push_op(g, KN_OP_DWCONV_DW, &n.attr, 2, dy, a, -1);
    if (kn_grad_accumulate(g, grads, b, dw)) return -1;
  }
  return 0;
}

int kn_grad_pool(KN_GRAD_ARGS) {
  const kn_node_rec n = g->nodes[i];
  if (!needs(g, &n, 0)) return 0;
  const kn_node a = n.inputs[0];
  /* The window rides on the grad node: its y input may be a re-created
   * copy of the pool's output (recompute, mixed precision). */
  return kn_grad_accumulate(g, grads, a, kn_push_op(g, KN_OP_POOL_GRAD, &n.attr, 3, dy, a, i));
}

/* bn_stats has none of its own: this rule covers the path through the
 * statistics. */
int kn_grad_bn_apply(KN_GRAD_ARGS) {
  const kn_node_rec n = g->nodes[i];
  const kn_node a = n.inputs[0], stats = n.inputs[1], gamma = n.inputs[2], beta = n.inputs[3];
  if (needs(g, &n, 0)) {
    kn_node_rec p = kn_node_proto(KN_OP_BN_GRAD_X, KN_F32);
    p.attr.bn.synchronized = g->nodes[stats].attr.bn.synchronized;
    kn_node dx = push_inputs(g, &p, 4, dy, a, stats, gamma);
    if (kn_grad_accumulate(g, grads, a, dx)) return -1;
  }
  if (g->nodes[gamma].requires_grad &&
      kn_grad_accumulate(g, grads, gamma,
                         kn_push_op(g, KN_OP_BN_GRAD_GAMMA, NULL, 3, dy, a, stats)))
    return -1;
  if (g->nodes[beta].requires_grad &&
      kn_grad_accumulate(g, grads, beta, kn_push_op(g, KN_OP_BN_GRAD_BETA, NULL, 1, dy, -1, -1)))
    return -1;
  return 0;
}

/* A loss of (predictions, targets): only the predictions are
 * differentiated, by grad_op (logits, targets, dloss). */
static int grad_of_loss(kn_graph *g, kn_node i, kn_node dy, kn_node *grads, kn_op grad_op) {
  const kn_node_rec n = g->nodes[i];
  const kn_node a = n.inputs[0], b = n.inputs[1];
  if (needs(g, &n, 1)) {
    return kn_graph_fail(g, KN_EINVAL,
                         "autodiff: the targets of '%s' depend on a parameter; only the "
                         "predictions are differentiated",
                         n.name);
  }
  if (!needs(g, &n, 0)) return 0;
  return kn_grad_accumulate(g, grads, a, kn_push_op(g, grad_op, NULL, 3, a, b, dy));
}

int kn_grad_xent_dense(KN_GRAD_ARGS) {
  return grad_of_loss(g, i, dy, grads, KN_OP_XENT_DENSE_GRAD);
}

int kn_grad_bce_logits(KN_GRAD_ARGS) {
  return grad_of_loss(g, i, dy, grads, KN_OP_BCE_LOGITS_GRAD);
}
