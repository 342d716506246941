/* onnx_export.c — a trained model as an ONNX ModelProto: one translation
 * per layer kind from the model's layer configs into ONNX nodes (opset 17),
 * the weights as initializers, written with protobuf.c. kiln's images are
 * NHWC and ONNX's convolutions and pools NCHW: a 4-D value is transposed
 * where a node needs the other layout, once, and reused from then on. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph_internal.h"
#include "protobuf.h"

enum { ONNX_IR_VERSION = 8, ONNX_OPSET = 17, ONNX_FLOAT = 1 };

/* Field numbers of onnx.proto's messages. */
enum { MODEL_IR_VERSION = 1, MODEL_PRODUCER = 2, MODEL_GRAPH = 7, MODEL_OPSET = 8 };
enum { OPSET_DOMAIN = 1, OPSET_VERSION = 2 };
enum { GRAPH_NODE = 1, GRAPH_NAME = 2, GRAPH_INITIALIZER = 5, GRAPH_INPUT = 11, GRAPH_OUTPUT = 12 };
enum { NODE_INPUT = 1, NODE_OUTPUT = 2, NODE_NAME = 3, NODE_OP_TYPE = 4, NODE_ATTRIBUTE = 5 };
enum { ATTR_NAME = 1, ATTR_F = 2, ATTR_I = 3, ATTR_INTS = 8, ATTR_TYPE = 20 };
enum { ATTR_TYPE_FLOAT = 1, ATTR_TYPE_INT = 2, ATTR_TYPE_INTS = 7 };
enum {
  TENSOR_DIMS = 1,
  TENSOR_DATA_TYPE = 2,
  TENSOR_FLOAT_DATA = 4,
  TENSOR_NAME = 8,
  TENSOR_RAW = 9
};
enum { VALUE_NAME = 1, VALUE_TYPE = 2, TYPE_TENSOR = 1, TENSOR_ELEM = 1, TENSOR_SHAPE = 2 };
enum { SHAPE_DIM = 1, DIM_VALUE = 1, DIM_PARAM = 2 };

#define NAME_LEN 160

/* A layer's output (or the model input). A 4-D value exists in kiln's
 * NHWC layout, in NCHW, or both: each name is "" until a node makes it. */
typedef struct value {
  int ndim;
  int dims[KN_MAX_DIMS]; /* kiln's shape: (B, H, W, C) for images */
  char nhwc[NAME_LEN];   /* kiln's layout (every rank) */
  char nchw[NAME_LEN];   /* 4-D only */
} value;

typedef struct attr {
  const char *name;
  int type; /* ATTR_TYPE_* */
  int64_t i;
  float f;
  int n;
  const int64_t *ints;
} attr;

typedef struct exporter {
  kn_graph *g;
  kn_pb graph; /* GraphProto's fields: nodes (in order) and initializers as they come */
  int have_gelu_constants;
  int layer; /* the layer being translated, for errors */
  const char *layer_name;
  char *err;
  size_t errlen;
  int rc;
} exporter;

static int fail(exporter *ex, int rc, const char *what) {
  if (!ex->rc) {
    snprintf(ex->err, ex->errlen, "onnx export: layer %d (%s): %s", ex->layer, ex->layer_name,
             what);
    ex->rc = rc;
  }
  return ex->rc;
}

static void put_attr(kn_pb *node, const attr *a) {
  kn_pb m = {0};
  kn_pb_string(&m, ATTR_NAME, a->name);
  kn_pb_int(&m, ATTR_TYPE, a->type);
  if (a->type == ATTR_TYPE_FLOAT) kn_pb_float(&m, ATTR_F, a->f);
  if (a->type == ATTR_TYPE_INT) kn_pb_int(&m, ATTR_I, a->i);
  for (int k = 0; a->type == ATTR_TYPE_INTS && k < a->n; k++) kn_pb_int(&m, ATTR_INTS, a->ints[k]);
  kn_pb_message(node, NODE_ATTRIBUTE, &m);
  kn_pb_free(&m);
}

/* Appends a node; it is named after its output (ONNX asks nothing more). */
static void node(exporter *ex, const char *op, const char *const *ins, int n_ins, const char *out,
                 const attr *attrs, int n_attrs) {
  kn_pb m = {0};
  for (int k = 0; k < n_ins; k++) kn_pb_string(&m, NODE_INPUT, ins[k]);
  kn_pb_string(&m, NODE_OUTPUT, out);
  kn_pb_string(&m, NODE_NAME, out);
  kn_pb_string(&m, NODE_OP_TYPE, op);
  for (int k = 0; k < n_attrs; k++) put_attr(&m, &attrs[k]);
  kn_pb_message(&ex->graph, GRAPH_NODE, &m);
  kn_pb_free(&m);
}

static void node1(exporter *ex, const char *op, const char *in, const char *out) {
  node(ex, op, &in, 1, out, NULL, 0);
}

static void initializer(exporter *ex, const char *name, int ndim, const int64_t *dims,
                        const float *data, size_t count) {
  kn_pb t = {0};
  for (int d = 0; d < ndim; d++) kn_pb_int(&t, TENSOR_DIMS, dims[d]);
  kn_pb_int(&t, TENSOR_DATA_TYPE, ONNX_FLOAT);
  kn_pb_string(&t, TENSOR_NAME, name);
  kn_pb_bytes(&t, TENSOR_RAW, data, count * sizeof(float)); /* little-endian, as ONNX's raw_data */
  kn_pb_message(&ex->graph, GRAPH_INITIALIZER, &t);
  kn_pb_free(&t);
}

/* A scalar constant, as float_data. */
static void scalar(exporter *ex, const char *name, float v) {
  kn_pb t = {0};
  kn_pb_int(&t, TENSOR_DATA_TYPE, ONNX_FLOAT);
  kn_pb_packed_floats(&t, TENSOR_FLOAT_DATA, &v, 1);
  kn_pb_string(&t, TENSOR_NAME, name);
  kn_pb_message(&ex->graph, GRAPH_INITIALIZER, &t);
  kn_pb_free(&t);
}

/* A parameter or state tensor of the layer ("conv.kernel"): its values and
 * shape, or NULL having failed. */
static const float *weights(exporter *ex, const char *layer, const char *what, int ndim,
                            int *dims) {
  char name[NAME_LEN];
  snprintf(name, sizeof name, "%s.%s", layer, what);
  kn_node n = kn_graph_find(ex->g, name);
  int got = 0;
  if (n >= 0) kn_node_shape(ex->g, n, &got, dims);
  const float *data = n >= 0 ? kn_node_data(ex->g, n) : NULL;
  if (!data || got != ndim) {
    char why[NAME_LEN + 64];
    snprintf(why, sizeof why, "the model has no %d-D tensor %s", ndim, name);
    fail(ex, KN_EINVAL, why);
    return NULL;
  }
  return data;
}

/* The weight as it is (dense kernels, biases, batch norm's vectors). */
static int plain_weight(exporter *ex, const char *layer, const char *what, int ndim) {
  int dims[KN_MAX_DIMS];
  const float *w = weights(ex, layer, what, ndim, dims);
  if (!w) return ex->rc;
  int64_t d64[KN_MAX_DIMS];
  size_t count = 1;
  for (int d = 0; d < ndim; d++) {
    d64[d] = dims[d];
    count *= (size_t)dims[d];
  }
  char name[NAME_LEN];
  snprintf(name, sizeof name, "%s.%s", layer, what);
  initializer(ex, name, ndim, d64, w, count);
  return 0;
}

/* A convolution kernel, kiln's (KH, KW, C, F), as ONNX's (F, C, KH, KW);
 * grouped (a depthwise kernel (KH, KW, C, M)): (C x M, 1, KH, KW) with
 * output channel c x M + m, as kiln's depthwise convolution orders them. */
static int conv_weight(exporter *ex, const char *layer, const char *what, int grouped) {
  int dims[4];
  const float *w = weights(ex, layer, what, 4, dims);
  if (!w) return ex->rc;
  const int KH = dims[0], KW = dims[1], C = dims[2], F = dims[3];
  const size_t count = (size_t)KH * KW * C * F;
  float *t = malloc(count * sizeof *t);
  if (!t) return fail(ex, KN_ENOMEM, "out of memory for a kernel");
  for (int kh = 0; kh < KH; kh++)
    for (int kw = 0; kw < KW; kw++)
      for (int c = 0; c < C; c++)
        for (int f = 0; f < F; f++) {
          size_t to = grouped ? (((size_t)c * F + f) * KH + kh) * KW + kw
                              : (((size_t)f * C + c) * KH + kh) * KW + kw;
          t[to] = w[(((size_t)kh * KW + kw) * C + c) * F + f];
        }
  int64_t onnx_dims[4] = {grouped ? (int64_t)C * F : F, grouped ? 1 : C, KH, KW};
  char name[NAME_LEN];
  snprintf(name, sizeof name, "%s.%s", layer, what);
  initializer(ex, name, 4, onnx_dims, t, count);
  free(t);
  return 0;
}

static const int64_t to_nchw[4] = {0, 3, 1, 2}, to_nhwc[4] = {0, 2, 3, 1};

/* v's tensor in the layout asked for (NCHW only for 4-D values), made by a
 * Transpose the first time it is needed. */
static const char *layout(exporter *ex, value *v, int nchw) {
  if (v->ndim != 4) return v->nhwc;
  char *want = nchw ? v->nchw : v->nhwc, *have = nchw ? v->nhwc : v->nchw;
  if (!want[0]) {
    snprintf(want, NAME_LEN, "%.140s/%s", have, nchw ? "nchw" : "nhwc");
    attr perm = {"perm", ATTR_TYPE_INTS, .n = 4, .ints = nchw ? to_nchw : to_nhwc};
    node(ex, "Transpose", (const char *const *)&have, 1, want, &perm, 1);
  }
  return want;
}

/* The layout a layout-blind node (activation, add) works in: the one v
 * has, NCHW where it has both. */
static int prefers_nchw(const value *v) {
  return v->ndim == 4 && v->nchw[0];
}

/* Sets out (shape from the engine's node) to be named name, in a layout. */
static void produce(exporter *ex, value *out, kn_node n, const char *name, int nchw) {
  memset(out, 0, sizeof *out);
  kn_node_shape(ex->g, n, &out->ndim, out->dims);
  snprintf(nchw && out->ndim == 4 ? out->nchw : out->nhwc, NAME_LEN, "%s", name);
}

/* The activation of a layer, from tensor in to out (same layout). */
static void activation(exporter *ex, kn_activation act, float alpha, const char *in,
                       const char *out, int ndim, int nchw) {
  switch (act) {
  case KN_ACT_LINEAR: node1(ex, "Identity", in, out); return;
  case KN_ACT_RELU: node1(ex, "Relu", in, out); return;
  case KN_ACT_SIGMOID: node1(ex, "Sigmoid", in, out); return;
  case KN_ACT_TANH: node1(ex, "Tanh", in, out); return;
  case KN_ACT_SOFTMAX: { /* over kiln's last axis: the channels */
    attr axis = {"axis", ATTR_TYPE_INT, .i = ndim == 4 && nchw ? 1 : -1};
    node(ex, "Softmax", &in, 1, out, &axis, 1);
    return;
  }
  case KN_ACT_LEAKY_RELU: {
    attr a = {"alpha", ATTR_TYPE_FLOAT, .f = alpha > 0.0f ? alpha : 0.3f};
    node(ex, "LeakyRelu", &in, 1, out, &a, 1);
    return;
  }
  case KN_ACT_ELU: {
    attr a = {"alpha", ATTR_TYPE_FLOAT, .f = alpha > 0.0f ? alpha : 1.0f};
    node(ex, "Elu", &in, 1, out, &a, 1);
    return;
  }
  case KN_ACT_GELU: { /* exact: 0.5 x (1 + erf(x / sqrt 2)), as kiln's kernel */
    if (!ex->have_gelu_constants) {
      scalar(ex, "gelu.rsqrt2", 0.70710678118654752440f);
      scalar(ex, "gelu.one", 1.0f);
      scalar(ex, "gelu.half", 0.5f);
      ex->have_gelu_constants = 1;
    }
    char t[4][NAME_LEN];
    for (int k = 0; k < 4; k++) snprintf(t[k], NAME_LEN, "%.140s/gelu_%d", out, k);
    node(ex, "Mul", (const char *[]){in, "gelu.rsqrt2"}, 2, t[0], NULL, 0);
    node1(ex, "Erf", t[0], t[1]);
    node(ex, "Add", (const char *[]){t[1], "gelu.one"}, 2, t[2], NULL, 0);
    node(ex, "Mul", (const char *[]){in, "gelu.half"}, 2, t[3], NULL, 0);
    node(ex, "Mul", (const char *[]){t[3], t[2]}, 2, out, NULL, 0);
    return;
  }
  }
  fail(ex, KN_EINVAL, "unknown activation");
}

/* A layer's main node writes `pre`, then its activation the layer's
 * tensor; with no activation the main node writes the layer's tensor. */
static const char *pre_activation(const kn_layer_config *L, const char *name, char *buf) {
  if (L->activation == KN_ACT_LINEAR) return name;
  snprintf(buf, NAME_LEN, "%.140s/pre", name);
  return buf;
}

/* ONNX's pads (top, left, bottom, right) for a window over in (B, H, W, C),
 * with kiln's (TF's) rule for the cells before and the rest after. */
static int window_attrs(exporter *ex, const kn_window *w, const value *in, int64_t *kernel,
                        int64_t *strides, int64_t *dilations, int64_t *pads) {
  const int k[2] = {w->kh, w->kw}, s[2] = {w->stride_h, w->stride_w};
  const int dl[2] = {w->dilation_h, w->dilation_w};
  for (int i = 0; i < 2; i++) {
    int out, before;
    if (!kn_window_axis(in->dims[1 + i], k[i], s[i], dl[i], w->padding, &out, &before))
      return fail(ex, KN_EINVAL, "its window does not fit its input");
    int after = (out - 1) * s[i] + dl[i] * (k[i] - 1) + 1 - in->dims[1 + i] - before;
    kernel[i] = k[i];
    strides[i] = s[i];
    dilations[i] = dl[i];
    pads[i] = before;
    pads[2 + i] = after > 0 ? after : 0;
  }
  return 0;
}

static void conv_node(exporter *ex, const kn_window *w, value *in, const char *weight,
                      const char *bias, int group, const char *out) {
  int64_t kernel[2], strides[2], dilations[2], pads[4];
  if (window_attrs(ex, w, in, kernel, strides, dilations, pads)) return;
  attr attrs[5] = {{"kernel_shape", ATTR_TYPE_INTS, .n = 2, .ints = kernel},
                   {"strides", ATTR_TYPE_INTS, .n = 2, .ints = strides},
                   {"dilations", ATTR_TYPE_INTS, .n = 2, .ints = dilations},
                   {"pads", ATTR_TYPE_INTS, .n = 4, .ints = pads},
                   {"group", ATTR_TYPE_INT, .i = group}};
  const char *ins[3] = {layout(ex, in, 1), weight, bias};
  node(ex, "Conv", ins, bias ? 3 : 2, out, attrs, 5);
}

/* conv2d, depthwise_conv2d, separable_conv2d: NCHW convolutions, the bias
 * inside the last Conv. */
static void convolution(exporter *ex, const kn_layer_config *L, value *in, const char *out) {
  const kn_window w = kn_layer_conv_window(L);
  char name[NAME_LEN], bias[NAME_LEN], dw_out[NAME_LEN];
  snprintf(bias, sizeof bias, "%s.bias", L->name);
  if (L->use_bias && plain_weight(ex, L->name, "bias", 1)) return;
  const char *b = L->use_bias ? bias : NULL;
  if (L->type == KN_LAYER_CONV2D) {
    snprintf(name, sizeof name, "%s.kernel", L->name);
    if (!conv_weight(ex, L->name, "kernel", 0)) conv_node(ex, &w, in, name, b, 1, out);
    return;
  }
  snprintf(name, sizeof name, "%s.depthwise_kernel", L->name);
  if (conv_weight(ex, L->name, "depthwise_kernel", 1)) return;
  const int separable = L->type == KN_LAYER_SEPARABLE_CONV2D;
  snprintf(dw_out, sizeof dw_out, "%.140s/depthwise", out);
  conv_node(ex, &w, in, name, separable ? NULL : b, in->dims[3], separable ? dw_out : out);
  if (!separable) return;
  /* The pointwise 1x1 convolution over the depthwise output. */
  snprintf(name, sizeof name, "%s.pointwise_kernel", L->name);
  if (conv_weight(ex, L->name, "pointwise_kernel", 0)) return;
  const kn_window one = {1, 1, 1, 1, 1, 1, KN_PAD_VALID};
  value mid = *in;
  snprintf(mid.nchw, NAME_LEN, "%s", dw_out);
  mid.nhwc[0] = '\0';
  conv_node(ex, &one, &mid, name, b, 1, out);
}

static void pool(exporter *ex, const kn_layer_config *L, value *in, const char *out) {
  const kn_window w = kn_layer_pool_window(L);
  int64_t kernel[2], strides[2], dilations[2], pads[4];
  if (window_attrs(ex, &w, in, kernel, strides, dilations, pads)) return;
  attr attrs[4] = {{"kernel_shape", ATTR_TYPE_INTS, .n = 2, .ints = kernel},
                   {"strides", ATTR_TYPE_INTS, .n = 2, .ints = strides},
                   {"pads", ATTR_TYPE_INTS, .n = 4, .ints = pads},
                   /* kiln's average leaves padding cells out of the count */
                   {"count_include_pad", ATTR_TYPE_INT, .i = 0}};
  const char *x = layout(ex, in, 1);
  const int avg = L->type == KN_LAYER_AVG_POOL2D;
  node(ex, avg ? "AveragePool" : "MaxPool", &x, 1, out, attrs, avg ? 4 : 3);
}

/* Batch norm on the moving statistics over kiln's last axis: ONNX's
 * BatchNormalization normalizes axis 1, so a value of another rank than 2
 * or 4 (NCHW) is transposed there and back. */
static void batch_norm(exporter *ex, const kn_layer_config *L, value *in, const char *out,
                       int *out_nchw) {
  static const char *const what[4] = {"gamma", "beta", "moving_mean", "moving_variance"};
  char names[4][NAME_LEN];
  for (int k = 0; k < 4; k++) {
    if (plain_weight(ex, L->name, what[k], 1)) return;
    snprintf(names[k], NAME_LEN, "%s.%s", L->name, what[k]);
  }
  attr eps = {"epsilon", ATTR_TYPE_FLOAT, .f = L->epsilon > 0.0f ? L->epsilon : 1e-3f};
  const int r = in->ndim;
  *out_nchw = r == 4;
  const char *ins[5] = {r == 4 ? layout(ex, in, 1) : in->nhwc, names[0], names[1], names[2],
                        names[3]};
  if (r == 2 || r == 4) {
    node(ex, "BatchNormalization", ins, 5, out, &eps, 1);
    return;
  }
  int64_t fwd[KN_MAX_DIMS], back[KN_MAX_DIMS];
  fwd[0] = back[0] = 0;
  fwd[1] = r - 1;
  for (int d = 2; d < r; d++) fwd[d] = d - 1;
  for (int d = 1; d < r - 1; d++) back[d] = d + 1;
  back[r - 1] = 1;
  char moved[NAME_LEN], normed[NAME_LEN];
  snprintf(moved, sizeof moved, "%.140s/channels_first", out);
  snprintf(normed, sizeof normed, "%.140s/normalized", out);
  attr p = {"perm", ATTR_TYPE_INTS, .n = r, .ints = fwd};
  node(ex, "Transpose", ins, 1, moved, &p, 1);
  ins[0] = moved;
  node(ex, "BatchNormalization", ins, 5, normed, &eps, 1);
  p.ints = back;
  const char *from = normed;
  node(ex, "Transpose", &from, 1, out, &p, 1);
}

/* The tensor name of layer i: its name, or its kind and index as
 * kn_model_build scopes an unnamed layer. */
static void layer_name(const kn_layer_config *L, int i, char *out) {
  if (L->name[0])
    snprintf(out, NAME_LEN, "%s", L->name);
  else
    snprintf(out, NAME_LEN, "%s_%d", kn_layer_kind(L->type), i);
}

/* Layer i of cfg into ONNX nodes. vals[j + 1] is layer j's output and
 * vals[0] the model input; alias[j] the value a layer that computes
 * nothing (dropout, a linear activation) passes on. */
static void translate(exporter *ex, const kn_model *m, const kn_model_config *cfg, int i,
                      value *vals, int *alias) {
  const kn_layer_config *L = &cfg->layers[i];
  char name[NAME_LEN], pre_buf[NAME_LEN], tmp[NAME_LEN];
  layer_name(L, i, name);
  ex->layer = i;
  ex->layer_name = name;
  value *ins[KN_LAYER_MAX_INPUTS];
  const int n_ins = L->n_inputs > 0 ? L->n_inputs : 1;
  for (int k = 0; k < n_ins; k++)
    ins[k] = &vals[alias[(L->n_inputs > 0 ? L->inputs[k] : i - 1) + 1]];
  value *in = ins[0], *out = &vals[i + 1];
  const kn_node n = m->layer_outputs[i];
  const char *pre = pre_activation(L, name, pre_buf);
  int nchw = 0;
  switch (L->type) {
  case KN_LAYER_DENSE: {
    if (plain_weight(ex, L->name, "kernel", 2)) return;
    if (L->use_bias && plain_weight(ex, L->name, "bias", 1)) return;
    char kernel[NAME_LEN], bias[NAME_LEN];
    snprintf(kernel, sizeof kernel, "%s.kernel", L->name);
    snprintf(bias, sizeof bias, "%s.bias", L->name);
    node(ex, "Gemm", (const char *[]){in->nhwc, kernel, bias}, L->use_bias ? 3 : 2, pre, NULL, 0);
    break;
  }
  case KN_LAYER_ACTIVATION:
    if (L->activation == KN_ACT_LINEAR) {
      alias[i + 1] = alias[(in - vals)];
      return;
    }
    nchw = prefers_nchw(in);
    pre = layout(ex, in, nchw);
    break;
  case KN_LAYER_CONV2D:
  case KN_LAYER_DEPTHWISE_CONV2D:
  case KN_LAYER_SEPARABLE_CONV2D:
    convolution(ex, L, in, pre);
    nchw = 1;
    break;
  case KN_LAYER_BATCH_NORM: batch_norm(ex, L, in, name, &nchw); break;
  case KN_LAYER_DROPOUT: alias[i + 1] = alias[(in - vals)]; return; /* inference: identity */
  case KN_LAYER_MAX_POOL2D:
  case KN_LAYER_AVG_POOL2D:
    pool(ex, L, in, name);
    nchw = 1;
    break;
  case KN_LAYER_GLOBAL_AVG_POOL2D: {
    const char *x = layout(ex, in, 1);
    snprintf(tmp, sizeof tmp, "%.140s/pool", name);
    node1(ex, "GlobalAveragePool", x, tmp); /* (B, C, 1, 1) */
    attr axis = {"axis", ATTR_TYPE_INT, .i = 1};
    const char *t = tmp;
    node(ex, "Flatten", &t, 1, name, &axis, 1);
    break;
  }
  case KN_LAYER_FLATTEN: { /* kiln flattens (H, W, C) in that order */
    const char *x = layout(ex, in, 0);
    attr axis = {"axis", ATTR_TYPE_INT, .i = 1};
    node(ex, "Flatten", &x, 1, name, &axis, 1);
    break;
  }
  case KN_LAYER_ADD: {
    nchw = prefers_nchw(in);
    const char *acc = layout(ex, in, nchw);
    char sums[2][NAME_LEN];
    for (int k = 1; k < n_ins; k++) { /* ((a + b) + c) ..., as kiln adds */
      char *to = k == n_ins - 1 ? name : sums[k % 2];
      if (k < n_ins - 1) snprintf(to, NAME_LEN, "%.140s/sum_%d", name, k);
      node(ex, "Add", (const char *[]){acc, layout(ex, ins[k], nchw)}, 2, to, NULL, 0);
      acc = to;
    }
    break;
  }
  case KN_LAYER_CONCATENATE: {
    nchw = prefers_nchw(in);
    int axis = L->axis ? L->axis : -1;
    if (axis < 0) axis += in->ndim;
    static const int nhwc_to_nchw_axis[4] = {0, 2, 3, 1};
    if (nchw) axis = nhwc_to_nchw_axis[axis];
    const char *names[KN_LAYER_MAX_INPUTS];
    for (int k = 0; k < n_ins; k++) names[k] = layout(ex, ins[k], nchw);
    attr a = {"axis", ATTR_TYPE_INT, .i = axis};
    node(ex, "Concat", names, n_ins, name, &a, 1);
    break;
  }
  default: {
    char why[96];
    snprintf(why, sizeof why, "a %s layer has no ONNX translation", kn_layer_kind(L->type));
    fail(ex, KN_EINVAL, why);
    return;
  }
  }
  const int activates = L->type == KN_LAYER_DENSE || L->type == KN_LAYER_ACTIVATION ||
                        L->type == KN_LAYER_CONV2D || L->type == KN_LAYER_DEPTHWISE_CONV2D ||
                        L->type == KN_LAYER_SEPARABLE_CONV2D;
  if (activates && L->activation != KN_ACT_LINEAR) {
    int ndim, dims[KN_MAX_DIMS];
    kn_node_shape(ex->g, n, &ndim, dims);
    activation(ex, L->activation, L->alpha, pre, name, ndim, nchw);
  }
  produce(ex, out, n, name, nchw);
}

/* A ValueInfoProto: a float tensor (batch, dims...), the batch dynamic. */
static void value_info(kn_pb *graph, int field, const char *name, int ndim, const int *dims) {
  kn_pb shape = {0}, tensor = {0}, type = {0}, info = {0};
  for (int d = 0; d < ndim; d++) {
    kn_pb dim = {0};
    if (d == 0)
      kn_pb_string(&dim, DIM_PARAM, "batch");
    else
      kn_pb_int(&dim, DIM_VALUE, dims[d]);
    kn_pb_message(&shape, SHAPE_DIM, &dim);
    kn_pb_free(&dim);
  }
  kn_pb_int(&tensor, TENSOR_ELEM, ONNX_FLOAT);
  kn_pb_message(&tensor, TENSOR_SHAPE, &shape);
  kn_pb_message(&type, TYPE_TENSOR, &tensor);
  kn_pb_string(&info, VALUE_NAME, name);
  kn_pb_message(&info, VALUE_TYPE, &type);
  kn_pb_message(graph, field, &info);
  kn_pb_free(&shape);
  kn_pb_free(&tensor);
  kn_pb_free(&type);
  kn_pb_free(&info);
}

int kn_onnx_encode(kn_model *m, const kn_model_config *cfg, const char *graph_name, uint8_t **out,
                   size_t *len, char *err, size_t errlen) {
  *out = NULL;
  *len = 0;
  if (!m->graph || !m->graph->compiled || !m->layer_outputs) {
    snprintf(err, errlen, "onnx export: build and compile the model first");
    return KN_ESTATE;
  }
  if (m->graph->f64) {
    snprintf(err, errlen, "onnx export: a graph in the f64 reference mode is not exported");
    return KN_ESTATE;
  }
  exporter ex = {.g = m->graph, .err = err, .errlen = errlen};
  value *vals = calloc((size_t)cfg->n_layers + 1, sizeof *vals);
  int *alias = calloc((size_t)cfg->n_layers + 1, sizeof *alias);
  if (!vals || !alias) {
    free(vals);
    free(alias);
    snprintf(err, errlen, "onnx export: out of memory");
    return KN_ENOMEM;
  }
  kn_node_shape(m->graph, m->x, &vals[0].ndim, vals[0].dims);
  snprintf(vals[0].nhwc, NAME_LEN, "input");
  for (int i = 0; i <= cfg->n_layers; i++) alias[i] = i;
  for (int i = 0; i < cfg->n_layers && !ex.rc; i++) translate(&ex, m, cfg, i, vals, alias);
  char output[NAME_LEN];
  layer_name(&cfg->layers[cfg->n_layers - 1], cfg->n_layers - 1, output);
  const value *last = &vals[alias[cfg->n_layers]];
  if (!ex.rc && strcmp(last->nhwc, output) != 0) node1(&ex, "Identity", last->nhwc, output);
  kn_pb_string(&ex.graph, GRAPH_NAME, graph_name && *graph_name ? graph_name : "kiln");
  value_info(&ex.graph, GRAPH_INPUT, "input", vals[0].ndim, vals[0].dims);
  value_info(&ex.graph, GRAPH_OUTPUT, output, last->ndim, last->dims);
  kn_pb model = {0}, opset = {0};
  kn_pb_int(&model, MODEL_IR_VERSION, ONNX_IR_VERSION);
  kn_pb_string(&model, MODEL_PRODUCER, "kiln");
  kn_pb_message(&model, MODEL_GRAPH, &ex.graph);
  kn_pb_string(&opset, OPSET_DOMAIN, "");
  kn_pb_int(&opset, OPSET_VERSION, ONNX_OPSET);
  kn_pb_message(&model, MODEL_OPSET, &opset);
  kn_pb_free(&opset);
  kn_pb_free(&ex.graph);
  free(vals);
  free(alias);
  if (!ex.rc && model.failed) {
    snprintf(err, errlen, "onnx export: out of memory");
    ex.rc = KN_ENOMEM;
  }
  if (ex.rc) {
    kn_pb_free(&model);
    return ex.rc;
  }
  *out = model.data;
  *len = model.len;
  return KN_OK;
}

int kn_onnx_export(kn_model *m, const kn_model_config *cfg, const char *graph_name,
                   const char *path, char *err, size_t errlen) {
  uint8_t *bytes;
  size_t len;
  int rc = kn_onnx_encode(m, cfg, graph_name, &bytes, &len, err, errlen);
  if (rc) return rc;
  char tmp[4096];
  int fd = kn_durable_open(path, tmp, sizeof tmp, "onnx export", err, errlen);
  if (fd < 0) {
    free(bytes);
    return KN_EIO;
  }
  int werr = kn_write_all(fd, bytes, len, NULL);
  free(bytes);
  return kn_durable_finish(fd, werr, tmp, path, "onnx export", err, errlen);
}
