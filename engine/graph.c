/* graph.c — building a static graph: node storage, shape inference for each
 * op, sticky builder errors and the accessors the rest of the engine uses. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"

const char *kn_strerror(int code) {
  switch (code) {
  case KN_OK: return "ok";
  case KN_EINVAL: return "invalid argument";
  case KN_ENOMEM: return "out of memory";
  case KN_EIO: return "i/o error";
  case KN_EFORMAT: return "bad file format";
  case KN_ESTATE: return "call out of order";
  case KN_ENUMERIC: return "non-finite value";
  case KN_ESTOPPED: return "stopped on request";
  default: return "unknown error";
  }
}

size_t kn_dtype_size(kn_dtype dtype) {
  switch (dtype) {
  case KN_F32:
  case KN_I32: return 4;
  case KN_F16:
  case KN_BF16: return 2;
  case KN_U8: return 1;
  case KN_F64: return 8;
  }
  return 4;
}

size_t kn_graph_elem_size(const kn_graph *g, kn_dtype dtype) {
  return (dtype == KN_F32 && g->f64) ? 8 : kn_dtype_size(dtype);
}

size_t kn_node_elems(const kn_node_rec *n, int batch) {
  size_t count = 1;
  for (int d = 0; d < n->ndim; d++) {
    count *= (size_t)((d == 0 && n->batched && batch > 0) ? batch * n->batched : n->dims[d]);
  }
  return count;
}

size_t kn_node_planned_bytes(const kn_graph *g, const kn_node_rec *n) {
  return kn_node_elems(n, 0) * kn_graph_elem_size(g, n->dtype);
}

int kn_graph_fail(kn_graph *g, int code, const char *fmt, ...) {
  if (g->error_code == 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->error, sizeof g->error, fmt, ap);
    va_end(ap);
    g->error_code = code;
  }
  return -1;
}

kn_graph *kn_graph_new(void) {
  return calloc(1, sizeof(kn_graph));
}

void kn_graph_free(kn_graph *g) {
  if (!g) return;
  free(g->nodes);
  free(g->params);
  free(g->param_buf);
  free(g->grad_buf);
  free(g->state_buf);
  kn_pool_free(g->pool);
  free(g->states);
  free(g->arena);
  free(g);
}

void kn_graph_set_profile(kn_graph *g, kn_profile *p) {
  g->profile = p;
}

void kn_graph_set_threads(kn_graph *g, int threads) {
  g->threads = threads < 1 ? 1 : threads > KN_POOL_MAX_THREADS ? KN_POOL_MAX_THREADS : threads;
}

int kn_graph_error(const kn_graph *g, char *err, size_t errlen) {
  if (g->error_code && err && errlen) snprintf(err, errlen, "%s", g->error);
  return g->error_code;
}

int kn_graph_node_count(const kn_graph *g) {
  return g->n_nodes;
}

kn_node kn_graph_push(kn_graph *g, const kn_node_rec *proto) {
  if (g->compiled) return kn_graph_fail(g, KN_ESTATE, "graph is compiled; it can't grow");
  if (g->n_nodes == g->cap_nodes) {
    int cap = g->cap_nodes ? g->cap_nodes * 2 : 64;
    kn_node_rec *nodes = realloc(g->nodes, (size_t)cap * sizeof *nodes);
    if (!nodes) return kn_graph_fail(g, KN_ENOMEM, "graph: out of memory for %d nodes", cap);
    g->nodes = nodes;
    g->cap_nodes = cap;
  }
  kn_node id = g->n_nodes++;
  g->nodes[id] = *proto;
  kn_node_rec *n = &g->nodes[id];
  n->requires_grad = n->op == KN_OP_PARAM;
  for (int i = 0; i < n->n_inputs; i++) n->requires_grad |= g->nodes[n->inputs[i]].requires_grad;
  if (!g->has_backward) g->n_forward = g->n_nodes;
  if (n->name[0] == '\0') snprintf(n->name, sizeof n->name, "n%d", id);
  return id;
}

static int valid(kn_graph *g, kn_node n, const char *op) {
  if (g->error_code) return 0;
  if (n < 0 || n >= g->n_nodes) {
    kn_graph_fail(g, KN_EINVAL, "%s: input node %d does not exist", op, n);
    return 0;
  }
  return 1;
}

static void shape_str(const kn_node_rec *n, char *buf, size_t len) {
  size_t used = (size_t)snprintf(buf, len, "(");
  for (int d = 0; d < n->ndim && used < len; d++) {
    used += (size_t)snprintf(buf + used, len - used, d ? ", %d" : "%d", n->dims[d]);
  }
  if (used < len) snprintf(buf + used, len - used, ")");
}

static kn_node_rec proto_of(kn_op op, kn_dtype dtype, int ndim, const int *dims) {
  kn_node_rec p;
  memset(&p, 0, sizeof p);
  p.op = op;
  p.dtype = dtype;
  p.ndim = ndim;
  for (int d = 0; d < ndim; d++) p.dims[d] = dims[d];
  return p;
}

static int check_dims(kn_graph *g, const char *what, int ndim, const int *dims) {
  if (ndim < 1 || ndim > KN_MAX_DIMS) {
    kn_graph_fail(g, KN_EINVAL, "%s: rank must be 1..%d, got %d", what, KN_MAX_DIMS, ndim);
    return 0;
  }
  for (int d = 0; d < ndim; d++) {
    if (dims[d] < 1) {
      kn_graph_fail(g, KN_EINVAL, "%s: dimension %d must be >= 1, got %d", what, d, dims[d]);
      return 0;
    }
  }
  return 1;
}

kn_node kn_input(kn_graph *g, const char *name, kn_dtype dtype, int ndim, const int *dims) {
  if (g->error_code || !check_dims(g, "input", ndim, dims)) return -1;
  kn_node_rec p = proto_of(KN_OP_INPUT, dtype, ndim, dims);
  p.batched = 1;
  p.keep = 1; /* written by the caller before each run */
  snprintf(p.name, sizeof p.name, "%s", name ? name : "");
  return kn_graph_push(g, &p);
}

kn_node kn_graph_push_flat(kn_graph *g, const kn_node_rec *proto, kn_node **list, int *n, int *cap,
                           size_t *floats, const char *what) {
  if (*n == *cap) {
    int bigger = *cap ? *cap * 2 : 16;
    kn_node *grown = realloc(*list, (size_t)bigger * sizeof *grown);
    if (!grown) return kn_graph_fail(g, KN_ENOMEM, "%s: out of memory", what);
    *list = grown;
    *cap = bigger;
  }
  kn_node id = kn_graph_push(g, proto);
  if (id < 0) return -1;
  g->nodes[id].flat_offset = *floats;
  *floats += kn_node_elems(&g->nodes[id], 0);
  (*list)[(*n)++] = id;
  return id;
}

kn_node kn_param(kn_graph *g, const char *name, int ndim, const int *dims, kn_init init) {
  if (g->error_code || !check_dims(g, "param", ndim, dims)) return -1;
  kn_node_rec p = proto_of(KN_OP_PARAM, KN_F32, ndim, dims);
  p.storage = KN_STORE_PARAM;
  p.init = init;
  p.keep = 1;
  snprintf(p.name, sizeof p.name, "%s", name ? name : "");
  return kn_graph_push_flat(g, &p, &g->params, &g->n_params, &g->cap_params, &g->n_param_floats,
                            "param");
}

kn_node kn_matmul(kn_graph *g, kn_node a, kn_node b, int trans_a, int trans_b) {
  if (!valid(g, a, "matmul") || !valid(g, b, "matmul")) return -1;
  const kn_node_rec *A = &g->nodes[a], *B = &g->nodes[b];
  char sa[64], sb[64];
  shape_str(A, sa, sizeof sa);
  shape_str(B, sb, sizeof sb);
  if (A->ndim != 2 || B->ndim != 2 || A->dtype != KN_F32 || B->dtype != KN_F32) {
    return kn_graph_fail(g, KN_EINVAL, "matmul: needs two rank-2 f32 tensors, got %s and %s", sa,
                         sb);
  }
  int m = trans_a ? A->dims[1] : A->dims[0], ka = trans_a ? A->dims[0] : A->dims[1];
  int kb = trans_b ? B->dims[1] : B->dims[0], n = trans_b ? B->dims[0] : B->dims[1];
  if (ka != kb) {
    return kn_graph_fail(g, KN_EINVAL, "matmul: inner dimensions differ: %s%s x %s%s", sa,
                         trans_a ? "^T" : "", sb, trans_b ? "^T" : "");
  }
  if (trans_b && B->batched) {
    return kn_graph_fail(g, KN_EINVAL, "matmul: a batched right operand can't be transposed");
  }
  if (A->batched != B->batched && trans_a && !trans_b) {
    return kn_graph_fail(g, KN_EINVAL, "matmul: contraction over the batch needs both batched");
  }
  int dims[2] = {m, n};
  kn_node_rec p = proto_of(KN_OP_MATMUL, KN_F32, 2, dims);
  p.batched = trans_a ? 0 : A->batched;
  p.n_inputs = 2;
  p.inputs[0] = a;
  p.inputs[1] = b;
  p.attr_i[0] = trans_a != 0;
  p.attr_i[1] = trans_b != 0;
  return kn_graph_push(g, &p);
}

kn_node kn_bias_add(kn_graph *g, kn_node x, kn_node bias) {
  if (!valid(g, x, "bias_add") || !valid(g, bias, "bias_add")) return -1;
  const kn_node_rec *X = &g->nodes[x], *Bn = &g->nodes[bias];
  if (Bn->ndim != 1 || Bn->dims[0] != X->dims[X->ndim - 1] || Bn->batched) {
    char sx[64], sb[64];
    shape_str(X, sx, sizeof sx);
    shape_str(Bn, sb, sizeof sb);
    return kn_graph_fail(g, KN_EINVAL, "bias_add: bias %s must match the last dim of %s", sb, sx);
  }
  kn_node_rec p = proto_of(KN_OP_BIAS_ADD, KN_F32, X->ndim, X->dims);
  p.batched = X->batched;
  p.n_inputs = 2;
  p.inputs[0] = x;
  p.inputs[1] = bias;
  return kn_graph_push(g, &p);
}

static kn_node unary(kn_graph *g, kn_op op, kn_node x, const char *what) {
  if (!valid(g, x, what)) return -1;
  const kn_node_rec *X = &g->nodes[x];
  if (X->dtype != KN_F32) return kn_graph_fail(g, KN_EINVAL, "%s: needs an f32 input", what);
  kn_node_rec p = proto_of(op, KN_F32, X->ndim, X->dims);
  p.batched = X->batched;
  p.n_inputs = 1;
  p.inputs[0] = x;
  return kn_graph_push(g, &p);
}

kn_node kn_relu(kn_graph *g, kn_node x) {
  return unary(g, KN_OP_RELU, x, "relu");
}

kn_node kn_softmax(kn_graph *g, kn_node x) {
  return unary(g, KN_OP_SOFTMAX, x, "softmax");
}

kn_node kn_add(kn_graph *g, kn_node a, kn_node b) {
  if (!valid(g, a, "add") || !valid(g, b, "add")) return -1;
  const kn_node_rec *A = &g->nodes[a], *B = &g->nodes[b];
  int same = A->ndim == B->ndim && A->batched == B->batched && A->dtype == B->dtype;
  for (int d = 0; same && d < A->ndim; d++) same = A->dims[d] == B->dims[d];
  if (!same) {
    char sa[64], sb[64];
    shape_str(A, sa, sizeof sa);
    shape_str(B, sb, sizeof sb);
    return kn_graph_fail(g, KN_EINVAL, "add: shapes differ: %s and %s", sa, sb);
  }
  kn_node_rec p = proto_of(KN_OP_ADD, A->dtype, A->ndim, A->dims);
  p.batched = A->batched;
  p.n_inputs = 2;
  p.inputs[0] = a;
  p.inputs[1] = b;
  return kn_graph_push(g, &p);
}

kn_node kn_reshape(kn_graph *g, kn_node x, int ndim, const int *dims) {
  if (!valid(g, x, "reshape") || !check_dims(g, "reshape", ndim, dims)) return -1;
  const kn_node_rec *X = &g->nodes[x];
  kn_node_rec p = proto_of(KN_OP_RESHAPE, X->dtype, ndim, dims);
  p.batched = X->batched;
  if (X->batched) {
    /* The leading dim may fold rows per example in or out (im2col rows
     * (B*OH*OW, K) <-> (B, OH, OW, K)) but must stay a multiple of B. */
    int planned = kn_node_planned_rows_per_batch(X);
    if (dims[0] % planned != 0) {
      return kn_graph_fail(g, KN_EINVAL,
                           "reshape: the leading dim must be a multiple of the batch %d, got %d",
                           planned, dims[0]);
    }
    p.batched = dims[0] / planned;
  }
  if (kn_node_elems(&p, 0) != kn_node_elems(X, 0)) {
    char sx[64], sp[64];
    shape_str(X, sx, sizeof sx);
    shape_str(&p, sp, sizeof sp);
    return kn_graph_fail(g, KN_EINVAL, "reshape: %s and %s hold different element counts", sx, sp);
  }
  p.storage = KN_STORE_VIEW;
  p.n_inputs = 1;
  p.inputs[0] = x;
  return kn_graph_push(g, &p);
}

kn_node kn_softmax_xent(kn_graph *g, kn_node logits, kn_node labels) {
  if (!valid(g, logits, "softmax_xent") || !valid(g, labels, "softmax_xent")) return -1;
  const kn_node_rec *L = &g->nodes[logits], *Y = &g->nodes[labels];
  if (L->ndim != 2 || L->dtype != KN_F32 || Y->ndim != 1 || Y->dtype != KN_I32 ||
      Y->dims[0] != L->dims[0] || L->batched != Y->batched) {
    char sl[64], sy[64];
    shape_str(L, sl, sizeof sl);
    shape_str(Y, sy, sizeof sy);
    return kn_graph_fail(g, KN_EINVAL,
                         "softmax_xent: needs f32 logits (B, C) and i32 labels (B), got %s and %s",
                         sl, sy);
  }
  int one = 1;
  kn_node_rec p = proto_of(KN_OP_SOFTMAX_XENT, KN_F32, 1, &one);
  p.n_inputs = 2;
  p.inputs[0] = logits;
  p.inputs[1] = labels;
  return kn_graph_push(g, &p);
}

void kn_node_shape(const kn_graph *g, kn_node n, int *ndim, int *dims) {
  const kn_node_rec *r = &g->nodes[n];
  *ndim = r->ndim;
  for (int d = 0; d < r->ndim; d++) dims[d] = r->dims[d];
}

const char *kn_node_name(const kn_graph *g, kn_node n) {
  return g->nodes[n].name;
}

void kn_graph_keep(kn_graph *g, kn_node n) {
  if (n >= 0 && n < g->n_nodes) g->nodes[n].keep = 1;
}

size_t kn_param_count(const kn_graph *g) {
  return g->n_param_floats;
}

float *kn_params(kn_graph *g) {
  return g->param_buf;
}

float *kn_grads(kn_graph *g) {
  return g->grad_buf;
}

int kn_param_node_count(const kn_graph *g) {
  return g->n_params;
}

kn_node kn_param_node(const kn_graph *g, int i) {
  return (i >= 0 && i < g->n_params) ? g->params[i] : -1;
}

size_t kn_param_offset(const kn_graph *g, kn_node param) {
  return g->nodes[param].flat_offset;
}
