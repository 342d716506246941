/* graph.c — building a static graph: node storage, the first cut's
 * builders (their shapes come from the op table's rules), sticky builder
 * errors and the accessors the rest of the engine uses. */
#include <assert.h>
#include <stdarg.h>
#include <stdatomic.h>
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

int kn_node_rows(const kn_graph *g, const kn_node_rec *n) {
  return (n->batched && g->batch > 0) ? g->batch * n->batched : n->dims[0];
}

int kn_check_labels(const char *op, const int32_t *labels, int rows, int cols, char *err,
                    size_t errlen) {
  for (int r = 0; r < rows; r++) {
    if (labels[r] < 0 || labels[r] >= cols) {
      snprintf(err, errlen, "%s: label %d of row %d is outside [0, %d)", op, labels[r], r, cols);
      return KN_EINVAL;
    }
  }
  return KN_OK;
}

void kn_node_matrix(const kn_graph *g, const kn_node_rec *n, int *rows, int *cols) {
  *cols = n->dims[n->ndim - 1];
  *rows = (int)(kn_node_elems(n, g->batch) / (size_t)*cols);
}

void kn_axis_split(const kn_graph *g, const kn_node_rec *x, int axis, size_t *outer, size_t *row) {
  size_t len, inner;
  kn_reduce_split(g, x, axis, outer, &len, &inner);
  *row = len * inner;
}

void kn_reduce_split(const kn_graph *g, const kn_node_rec *x, int axis, size_t *outer, size_t *len,
                     size_t *inner) {
  *outer = *inner = 1;
  if (axis < 0) {
    *len = kn_node_elems(x, g->batch);
    return;
  }
  *len = (size_t)(axis == 0 ? kn_node_rows(g, x) : x->dims[axis]);
  for (int d = 0; d < axis; d++) *outer *= (size_t)(d == 0 ? kn_node_rows(g, x) : x->dims[d]);
  for (int d = axis + 1; d < x->ndim; d++) *inner *= (size_t)x->dims[d];
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

/* The node growth of graphs made from now on (kn_graph_set_node_growth). */
static _Atomic int node_growth;

void kn_graph_set_node_growth(int nodes) {
  atomic_store(&node_growth, nodes > 0 ? nodes : 0);
}

kn_graph *kn_graph_new(void) {
  kn_graph *g = calloc(1, sizeof(kn_graph));
  if (g) g->node_growth = atomic_load(&node_growth);
  return g;
}

void kn_graph_free(kn_graph *g) {
  if (!g) return;
  kn_unpin_for_gpu(g);
  kn_residency_free(g);
  free(g->nodes);
  free(g->params);
  free(g->param_buf);
  free(g->grad_buf);
  free(g->state_buf);
  kn_pool_free(g->pool);
  free(g->gemm_workspace);
  free(g->gemm_scratch);
  free(g->bn_fold_buf);
  free(g->conv_buf);
  free(g->states);
  free(g->arena);
  free(g);
}

void kn_graph_set_device(kn_graph *g, kn_device d) {
  g->device = d;
}

void kn_graph_set_scope(kn_graph *g, const char *scope) {
  snprintf(g->scope, sizeof g->scope, "%s", scope ? scope : "");
}

/* Whether a node before `before` is named name. */
static int name_taken(const kn_graph *g, int before, const char *name) {
  for (int i = 0; i < before; i++)
    if (strcmp(g->nodes[i].name, name) == 0) return 1;
  return 0;
}

/* "<scope>/<op>", or with _1, _2 ... where that is taken. */
static void name_in_scope(kn_graph *g, kn_node id) {
  kn_node_rec *n = &g->nodes[id];
  snprintf(n->name, sizeof n->name, "%.95s/%s", g->scope, kn_op_name(n->op));
  for (int k = 1; name_taken(g, id, n->name); k++)
    snprintf(n->name, sizeof n->name, "%.95s/%s_%d", g->scope, kn_op_name(n->op), k);
}

int kn_node_set_device(kn_graph *g, kn_node n, kn_device d) {
  if (n < 0 || n >= g->n_nodes) {
    kn_graph_fail(g, KN_EINVAL, "device: no node %d", n);
    return KN_EINVAL;
  }
  if (g->compiled) {
    char name[32];
    kn_device_format(d, name, sizeof name);
    kn_graph_fail(g, KN_ESTATE, "device: node '%s' can't move to %s: the graph is compiled",
                  g->nodes[n].name, name);
    return KN_ESTATE;
  }
  g->nodes[n].device = d;
  return KN_OK;
}

kn_device kn_node_device(const kn_graph *g, kn_node n) {
  return n >= 0 && n < g->n_nodes ? g->nodes[n].device : (kn_device){KN_DEVICE_CPU, 0};
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

/* Appends *proto, shaped by its op's rule. */
static kn_node push_raw(kn_graph *g, const kn_node_rec *proto) {
  if (g->compiled) return kn_graph_fail(g, KN_ESTATE, "graph is compiled; it can't grow");
  const kn_op_def *def = kn_op_def_of(proto->op);
  assert(proto->n_inputs >= def->min_inputs && proto->n_inputs <= def->max_inputs);
  for (int k = 0; k < proto->n_inputs; k++) {
    if (proto->inputs[k] < 0 || proto->inputs[k] >= g->n_nodes) {
      return kn_graph_fail(g, KN_EINVAL, "%s: input %d is node %d, which does not exist", def->name,
                           k, proto->inputs[k]);
    }
  }
  kn_node_rec shaped = *proto;
  if (def->shape(g, &shaped)) return -1;
  if (g->n_nodes == g->cap_nodes) {
    int cap = g->node_growth ? g->cap_nodes + g->node_growth : g->cap_nodes ? g->cap_nodes * 2 : 64;
    kn_node_rec *nodes = realloc(g->nodes, (size_t)cap * sizeof *nodes);
    if (!nodes) return kn_graph_fail(g, KN_ENOMEM, "graph: out of memory for %d nodes", cap);
    g->nodes = nodes;
    g->cap_nodes = cap;
  }
  kn_node id = g->n_nodes++;
  g->nodes[id] = shaped;
  kn_node_rec *n = &g->nodes[id];
  n->device = g->device;
  n->requires_grad = n->op == KN_OP_PARAM;
  for (int i = 0; i < n->n_inputs; i++) n->requires_grad |= g->nodes[n->inputs[i]].requires_grad;
  if (!g->has_backward) g->n_forward = g->n_nodes;
  if (n->name[0] == '\0' && g->scope[0])
    name_in_scope(g, id);
  else if (n->name[0] == '\0')
    snprintf(n->name, sizeof n->name, "n%d", id);
  return id;
}

kn_node_rec kn_node_proto(kn_op op, kn_dtype dtype) {
  kn_node_rec p;
  memset(&p, 0, sizeof p);
  p.op = op;
  p.dtype = dtype;
  return p;
}

kn_node kn_push_cast(kn_graph *g, kn_node x, kn_dtype to, kn_dtype via, int remat_of) {
  kn_node_rec p = kn_node_proto(KN_OP_CAST, to);
  p.n_inputs = 1;
  p.inputs[0] = x;
  p.attr.cast_via = via;
  p.remat_of = remat_of;
  return push_raw(g, &p);
}

static kn_dtype narrow_type(const kn_graph *g) {
  return g->precision == KN_PRECISION_MIXED_FLOAT16 ? KN_F16 : KN_BF16;
}

/* A batched f32 value computed by the forward pass whose storage is its
 * own (or a view of such): the activations mixed precision narrows and
 * recompute may re-run. Inputs and kept values live all run anyway. */
static int is_activation(const kn_graph *g, kn_node x) {
  const kn_node_rec *n = &g->nodes[x];
  if (n->dtype != KN_F32 || !n->batched || n->keep || n->folded || kn_op_has(n->op, KN_OPF_FED))
    return 0;
  n = &g->nodes[kn_storage_root(g, x)];
  return n->storage == KN_STORE_ARENA && !n->keep && !kn_op_has(n->op, KN_OPF_FED);
}

/* What a backward node reads in place of forward value x: a re-run of a
 * cheap op (recompute), or x's narrow copy widened again (mixed precision),
 * each emitted right before the reader so x itself dies in forward. */
static kn_node backward_source(kn_graph *g, kn_node x) {
  if (x < 0 || x >= g->n_forward || !is_activation(g, x)) return x;
  const kn_node_rec n = g->nodes[x]; /* a copy: pushing nodes may move g->nodes */
  /* Recompute's whole scope: the ops the op table marks KN_OPF_RECOMPUTE,
   * im2col and pooling, which move data and do no arithmetic to speak of,
   * and whose inputs are values backward keeps anyway (the layer's input
   * for the conv GEMM's dW, the relu output for relu_grad); a second level
   * lets im2col re-read a recomputed pooling. Every other forward value
   * backward reads is kept. */
  if (g->recompute && g->remat_depth < 2 && kn_op_has(n.op, KN_OPF_RECOMPUTE)) {
    kn_node_rec r = n;
    r.remat_of = x + 1;
    r.shadow = 0;
    snprintf(r.name, sizeof r.name, "recompute/%.100s", n.name);
    g->remat_depth++;
    kn_node id = kn_graph_push(g, &r);
    g->remat_depth--;
    return id;
  }
  if (n.storage == KN_STORE_VIEW) {
    /* A view (reshape) of the re-created value it views. */
    kn_node src = backward_source(g, n.inputs[0]);
    if (src < 0) return -1;
    if (src == n.inputs[0]) return x; /* nothing re-created: the view itself */
    kn_node_rec v = n;
    v.inputs[0] = src;
    v.remat_of = x + 1;
    v.shadow = 0;
    return push_raw(g, &v);
  }
  if (n.shadow) return kn_push_cast(g, n.shadow - 1, KN_F32, narrow_type(g), x + 1);
  if (n.op == KN_OP_CAST && g->nodes[n.inputs[0]].dtype != KN_F32)
    return kn_push_cast(g, n.inputs[0], KN_F32, kn_cast_via(&n), x + 1);
  return x;
}

kn_node kn_graph_push(kn_graph *g, const kn_node_rec *proto) {
  const int mixed = g->precision != KN_PRECISION_FLOAT32;
  if (!mixed && !g->recompute) return push_raw(g, proto);
  kn_node_rec rec = *proto;
  for (int k = 0; k < rec.n_inputs && !g->error_code; k++) {
    kn_node in = rec.inputs[k];
    if (in < 0 || in >= g->n_nodes) continue;
    if (g->has_backward) {
      rec.inputs[k] = backward_source(g, in);
    } else if (mixed && g->nodes[in].op == KN_OP_PARAM) {
      /* The forward reads a narrow copy of each weight; its gradient flows
       * back (rounded) into the f32 master weight. */
      if (!g->nodes[in].shadow) {
        kn_node down = kn_push_cast(g, in, narrow_type(g), narrow_type(g), 0);
        if (down < 0) return -1;
        g->nodes[in].shadow = down + 1;
      }
      rec.inputs[k] = kn_push_cast(g, g->nodes[in].shadow - 1, KN_F32, narrow_type(g), 0);
    }
    if (rec.inputs[k] < 0) return -1;
  }
  if (g->error_code) return -1;
  kn_node id = push_raw(g, &rec);
  if (id < 0 || !mixed || g->has_backward || !is_activation(g, id) || rec.op == KN_OP_CAST ||
      rec.storage == KN_STORE_VIEW)
    return id;
  /* Its narrow copy, right after it: dead-code elimination drops the ones
   * nothing reads. */
  kn_node down = kn_push_cast(g, id, narrow_type(g), narrow_type(g), 0);
  if (down < 0) return -1;
  g->nodes[id].shadow = down + 1;
  return id;
}

kn_node kn_narrow_boundary(kn_graph *g, kn_node x) {
  if (x < 0 || g->error_code || !g->nodes[x].shadow) return x;
  return kn_push_cast(g, g->nodes[x].shadow - 1, KN_F32, narrow_type(g), 0);
}

kn_node kn_cast(kn_graph *g, kn_node x, kn_dtype to) {
  if (g->error_code) return -1;
  if (x < 0 || x >= g->n_nodes)
    return kn_graph_fail(g, KN_EINVAL, "cast: input node %d does not exist", x);
  kn_dtype from = g->nodes[x].dtype;
  int narrow_to = to == KN_BF16 || to == KN_F16, narrow_from = from == KN_BF16 || from == KN_F16;
  if (from == KN_F32 && narrow_to) return kn_push_cast(g, x, to, to, 0);
  if (narrow_from && to == KN_F32) return kn_push_cast(g, x, to, from, 0);
  return kn_graph_fail(g, KN_EINVAL, "cast: converts f32 to bf16 or f16 and back, not %s to %s",
                       kn_dtype_name(from), kn_dtype_name(to));
}

int kn_graph_set_precision(kn_graph *g, kn_precision precision, char *err, size_t errlen) {
  if ((int)precision < 0 || precision > KN_PRECISION_MIXED_FLOAT16) {
    snprintf(err, errlen, "precision: unknown policy %d", (int)precision);
    return KN_EINVAL;
  }
  if (g->n_nodes > 0) {
    snprintf(err, errlen, "precision: set it before building the graph (it has %d nodes)",
             g->n_nodes);
    return KN_ESTATE;
  }
  g->precision = precision;
  return KN_OK;
}

kn_precision kn_graph_precision(const kn_graph *g) {
  return g->precision;
}

const char *kn_precision_name(kn_precision precision) {
  switch (precision) {
  case KN_PRECISION_FLOAT32: return "float32";
  case KN_PRECISION_MIXED_BFLOAT16: return "mixed_bfloat16";
  case KN_PRECISION_MIXED_FLOAT16: return "mixed_float16";
  }
  return "?";
}

const char *kn_mixed_matmul_path(kn_precision precision) {
  switch (precision) {
  case KN_PRECISION_FLOAT32: return kn_gemm_kernel_name(KN_GEMM_SGEMM);
  case KN_PRECISION_MIXED_BFLOAT16:
    /* Debian's OpenBLAS exports no cblas_sbgemm: the bf16 GEMM is kiln's. */
    return kn_gemm_kernel_name(kn_gemm_bf16_kernel());
  case KN_PRECISION_MIXED_FLOAT16:
    return "OpenBLAS sgemm (f32) on f16-rounded operands (no f16 GEMM on CPUs)";
  }
  return "?";
}

void kn_graph_set_recompute(kn_graph *g, int on) {
  g->recompute = on != 0;
}

void kn_graph_set_allow_tf32(kn_graph *g, int on) {
  g->allow_tf32 = on != 0;
}

void kn_graph_set_loss_scale(kn_graph *g, float scale) {
  if (g->loss_seed <= 0 || g->loss_seed >= g->n_nodes) return;
  kn_node_rec *seed = &g->nodes[g->loss_seed];
  seed->attr.fill.value = scale;
  /* A folded seed was computed once at compile: write the value there too. */
  if (seed->data && seed->folded) {
    if (g->f64)
      *(double *)seed->data = scale;
    else
      *(float *)seed->data = scale;
  }
}

static int valid(kn_graph *g, kn_node n, const char *op) {
  if (g->error_code) return 0;
  if (n < 0 || n >= g->n_nodes) {
    kn_graph_fail(g, KN_EINVAL, "%s: input node %d does not exist", op, n);
    return 0;
  }
  return 1;
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
  kn_node_rec p = kn_node_proto(KN_OP_MATMUL, KN_F32);
  p.n_inputs = 2;
  p.inputs[0] = a;
  p.inputs[1] = b;
  p.attr.matmul.trans_a = trans_a != 0;
  p.attr.matmul.trans_b = trans_b != 0;
  return kn_graph_push(g, &p);
}

kn_node kn_bias_add(kn_graph *g, kn_node x, kn_node bias) {
  if (!valid(g, x, "bias_add") || !valid(g, bias, "bias_add")) return -1;
  kn_node_rec p = kn_node_proto(KN_OP_BIAS_ADD, KN_F32);
  p.n_inputs = 2;
  p.inputs[0] = x;
  p.inputs[1] = bias;
  return kn_graph_push(g, &p);
}

static kn_node unary(kn_graph *g, kn_op op, kn_node x, const char *what) {
  if (!valid(g, x, what)) return -1;
  const kn_node_rec *X = &g->nodes[x];
  if (X->dtype != KN_F32) return kn_graph_fail(g, KN_EINVAL, "%s: needs an f32 input", what);
  kn_node_rec p = kn_node_proto(op, KN_F32);
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
  kn_node_rec p = kn_node_proto(KN_OP_ADD, KN_F32); /* the rule takes a's dtype */
  p.n_inputs = 2;
  p.inputs[0] = a;
  p.inputs[1] = b;
  return kn_graph_push(g, &p);
}

kn_node kn_reshape(kn_graph *g, kn_node x, int ndim, const int *dims) {
  if (!valid(g, x, "reshape") || !check_dims(g, "reshape", ndim, dims)) return -1;
  kn_node_rec p = proto_of(KN_OP_RESHAPE, KN_F32, ndim, dims); /* the target; the rule checks it */
  p.storage = KN_STORE_VIEW;
  p.n_inputs = 1;
  p.inputs[0] = x;
  return kn_graph_push(g, &p);
}

kn_node kn_softmax_xent(kn_graph *g, kn_node logits, kn_node labels) {
  if (!valid(g, logits, "softmax_xent") || !valid(g, labels, "softmax_xent")) return -1;
  kn_node_rec p = kn_node_proto(KN_OP_SOFTMAX_XENT, KN_F32);
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

kn_node kn_graph_find(const kn_graph *g, const char *name) {
  for (int i = 0; i < g->n_nodes; i++)
    if (strcmp(g->nodes[i].name, name) == 0) return i;
  return -1;
}

void kn_graph_keep(kn_graph *g, kn_node n) {
  if (n >= 0 && n < g->n_nodes) g->nodes[n].keep = 1;
}

size_t kn_param_count(const kn_graph *g) {
  return g->n_param_floats;
}

float *kn_params(kn_graph *g) {
  kn_residency_flat_to_host(g, KN_STORE_PARAM);
  return g->param_buf;
}

float *kn_grads(kn_graph *g) {
  kn_residency_flat_to_host(g, KN_STORE_GRAD);
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
