/* shapes.c — every op's shape rule (op_table.h): a node's output ndim,
 * dims and batching from its inputs and attrs. kn_graph_push applies the
 * rule of each node it appends, so builders, gradient rules and passes
 * never compute an output's shape themselves. */
#include <stdio.h>
#include <string.h>

#include "graph_internal.h"

void kn_shape_str(const kn_node_rec *n, char *buf, size_t len) {
  size_t used = (size_t)snprintf(buf, len, "(");
  for (int d = 0; d < n->ndim && used < len; d++) {
    used += (size_t)snprintf(buf + used, len - used, d ? ", %d" : "%d", n->dims[d]);
  }
  if (used < len) snprintf(buf + used, len - used, ")");
}

static const kn_node_rec *in(const kn_graph *g, const kn_node_rec *n, int k) {
  return &g->nodes[n->inputs[k]];
}

static void set_dims(kn_node_rec *n, int ndim, const int *dims, int batched) {
  n->ndim = ndim;
  memset(n->dims, 0, sizeof n->dims);
  for (int d = 0; d < ndim; d++) n->dims[d] = dims[d];
  n->batched = batched;
}

static int like(kn_node_rec *n, const kn_node_rec *x) {
  set_dims(n, x->ndim, x->dims, x->batched);
  return 0;
}

/* Fails naming the op and the shape of input k (of n, or of x itself). */
static int fail_on(kn_graph *g, const kn_node_rec *n, const kn_node_rec *x, const char *need) {
  char sx[64];
  kn_shape_str(x, sx, sizeof sx);
  return kn_graph_fail(g, KN_EINVAL, "%s: needs %s, got %s", kn_op_name(n->op), need, sx);
}

int kn_shape_given(KN_SHAPE_ARGS) {
  if (n->ndim < 1 || n->ndim > KN_MAX_DIMS) {
    return kn_graph_fail(g, KN_EINVAL, "%s: rank must be 1..%d, got %d", kn_op_name(n->op),
                         KN_MAX_DIMS, n->ndim);
  }
  for (int d = 0; d < n->ndim; d++) {
    if (n->dims[d] < 1) {
      return kn_graph_fail(g, KN_EINVAL, "%s: dimension %d must be >= 1, got %d", kn_op_name(n->op),
                           d, n->dims[d]);
    }
  }
  return 0;
}

int kn_shape_like_input0(KN_SHAPE_ARGS) {
  return like(n, in(g, n, 0));
}

int kn_shape_like_input1(KN_SHAPE_ARGS) {
  return like(n, in(g, n, 1));
}

int kn_shape_scalar(KN_SHAPE_ARGS) {
  (void)g;
  const int one = 1;
  set_dims(n, 1, &one, 0);
  return 0;
}

int kn_shape_channels(KN_SHAPE_ARGS) {
  const kn_node_rec *X = in(g, n, 0);
  set_dims(n, 1, &X->dims[X->ndim - 1], 0);
  return 0;
}

/* The target dims are the reshape's argument; its batching follows the
 * input's: the leading dim may fold rows per example in or out (im2col
 * rows (B*OH*OW, K) <-> (B, OH, OW, K)) but must stay a multiple of B. */
int kn_shape_reshape(KN_SHAPE_ARGS) {
  if (kn_shape_given(g, n)) return -1;
  const kn_node_rec *X = in(g, n, 0);
  n->dtype = X->dtype;
  n->batched = 0;
  if (X->batched) {
    int planned = kn_node_planned_rows_per_batch(X);
    if (n->dims[0] % planned != 0) {
      return kn_graph_fail(g, KN_EINVAL,
                           "reshape: the leading dim must be a multiple of the batch %d, got %d",
                           planned, n->dims[0]);
    }
    n->batched = n->dims[0] / planned;
  }
  if (kn_node_elems(n, 0) != kn_node_elems(X, 0)) {
    char sx[64], sp[64];
    kn_shape_str(X, sx, sizeof sx);
    kn_shape_str(n, sp, sizeof sp);
    return kn_graph_fail(g, KN_EINVAL, "reshape: %s and %s hold different element counts", sx, sp);
  }
  return 0;
}

/* The node's dtype is the cast's target: only the shape follows x. */
int kn_shape_cast(KN_SHAPE_ARGS) {
  return like(n, in(g, n, 0));
}

int kn_shape_add(KN_SHAPE_ARGS) {
  const kn_node_rec *A = in(g, n, 0), *B = in(g, n, 1);
  int same = A->ndim == B->ndim && A->batched == B->batched && A->dtype == B->dtype;
  for (int d = 0; same && d < A->ndim; d++) same = A->dims[d] == B->dims[d];
  if (!same) {
    char sa[64], sb[64];
    kn_shape_str(A, sa, sizeof sa);
    kn_shape_str(B, sb, sizeof sb);
    return kn_graph_fail(g, KN_EINVAL, "add: shapes differ: %s and %s", sa, sb);
  }
  n->dtype = A->dtype;
  return like(n, A);
}

int kn_shape_bias_add(KN_SHAPE_ARGS) {
  const kn_node_rec *X = in(g, n, 0), *Bn = in(g, n, 1);
  if (Bn->ndim != 1 || Bn->dims[0] != X->dims[X->ndim - 1] || Bn->batched) {
    char sx[64], sb[64];
    kn_shape_str(X, sx, sizeof sx);
    kn_shape_str(Bn, sb, sizeof sb);
    return kn_graph_fail(g, KN_EINVAL, "bias_add: bias %s must match the last dim of %s", sb, sx);
  }
  return like(n, X);
}

/* op(A) (m, k) x op(B) (k, n) = (m, n), batched like A's rows; a
 * contraction over the batch (A^T) is not batched. */
int kn_shape_matmul(KN_SHAPE_ARGS) {
  const kn_node_rec *A = in(g, n, 0), *B = in(g, n, 1);
  const int trans_a = n->attr.matmul.trans_a, trans_b = n->attr.matmul.trans_b;
  char sa[64], sb[64];
  kn_shape_str(A, sa, sizeof sa);
  kn_shape_str(B, sb, sizeof sb);
  if (A->ndim != 2 || B->ndim != 2 || A->dtype != KN_F32 || B->dtype != KN_F32) {
    return kn_graph_fail(g, KN_EINVAL, "%s: needs two rank-2 f32 tensors, got %s and %s",
                         kn_op_name(n->op), sa, sb);
  }
  int m = trans_a ? A->dims[1] : A->dims[0], ka = trans_a ? A->dims[0] : A->dims[1];
  int kb = trans_b ? B->dims[1] : B->dims[0], cols = trans_b ? B->dims[0] : B->dims[1];
  if (ka != kb) {
    return kn_graph_fail(g, KN_EINVAL, "%s: inner dimensions differ: %s%s x %s%s",
                         kn_op_name(n->op), sa, trans_a ? "^T" : "", sb, trans_b ? "^T" : "");
  }
  if (trans_b && B->batched) {
    return kn_graph_fail(g, KN_EINVAL, "%s: a batched right operand can't be transposed",
                         kn_op_name(n->op));
  }
  if (A->batched != B->batched && trans_a && !trans_b) {
    return kn_graph_fail(g, KN_EINVAL, "%s: contraction over the batch needs both batched",
                         kn_op_name(n->op));
  }
  const int dims[2] = {m, cols};
  set_dims(n, 2, dims, trans_a ? 0 : A->batched);
  return 0;
}

int kn_shape_softmax_xent(KN_SHAPE_ARGS) {
  const kn_node_rec *L = in(g, n, 0), *Y = in(g, n, 1);
  if (L->ndim != 2 || L->dtype != KN_F32 || Y->ndim != 1 || Y->dtype != KN_I32 ||
      Y->dims[0] != L->dims[0] || L->batched != Y->batched) {
    char sl[64], sy[64];
    kn_shape_str(L, sl, sizeof sl);
    kn_shape_str(Y, sy, sizeof sy);
    return kn_graph_fail(g, KN_EINVAL,
                         "softmax_xent: needs f32 logits (B, C) and i32 labels (B), got %s and %s",
                         sl, sy);
  }
  return kn_shape_scalar(g, n);
}

/* Numpy broadcasting. A batched operand must span the full rank, so its
 * batch dim is the output's first; the other must be batched alike there
 * or have size 1. */
int kn_shape_binary(KN_SHAPE_ARGS) {
  static const char *names[] = {"add", "sub", "mul", "div"};
  const kn_binop op = n->attr.binary.op;
  const char *what = op >= KN_BIN_ADD && op <= KN_BIN_DIV ? names[op] : kn_op_name(n->op);
  const kn_node_rec *A = in(g, n, 0), *B = in(g, n, 1);
  int ndim = A->ndim > B->ndim ? A->ndim : B->ndim;
  int dims[KN_MAX_DIMS];
  char sa[64], sb[64];
  kn_shape_str(A, sa, sizeof sa);
  kn_shape_str(B, sb, sizeof sb);
  for (int d = 0; d < ndim; d++) {
    int ia = d - (ndim - A->ndim), ib = d - (ndim - B->ndim);
    int da = ia >= 0 ? A->dims[ia] : 1, db = ib >= 0 ? B->dims[ib] : 1;
    if (da != db && da != 1 && db != 1) {
      return kn_graph_fail(g, KN_EINVAL, "%s: shapes %s and %s don't broadcast (dim %d: %d vs %d)",
                           what, sa, sb, d, da, db);
    }
    dims[d] = da > db ? da : db;
  }
  int batched = 0;
  for (int k = 0; k < 2; k++) {
    const kn_node_rec *X = k ? B : A, *O = k ? A : B;
    if (!X->batched) continue;
    int clash = X->ndim != ndim || (O->batched && O->batched != X->batched) ||
                (!O->batched && O->ndim == ndim && O->dims[0] != 1);
    if (clash) {
      return kn_graph_fail(g, KN_EINVAL,
                           "%s: %s and %s: the batch dim broadcasts only against size 1 or an "
                           "equally batched dim",
                           what, sa, sb);
    }
    batched = X->batched;
  }
  set_dims(n, ndim, dims, batched);
  return 0;
}

/* Over attr.reduce.axis (-1: all, to (1)), kept as size 1 with keepdims;
 * batched while the batch dim survives. */
int kn_shape_reduce(KN_SHAPE_ARGS) {
  const kn_node_rec *X = in(g, n, 0);
  const int axis = n->attr.reduce.axis;
  if (axis < -1 || axis >= X->ndim) {
    return kn_graph_fail(g, KN_EINVAL, "reduce: axis must be -1 (all) or 0..%d, got %d",
                         X->ndim - 1, axis);
  }
  int dims[KN_MAX_DIMS], ndim = 0;
  if (axis >= 0) {
    for (int d = 0; d < X->ndim; d++) {
      if (d != axis) {
        dims[ndim++] = X->dims[d];
      } else if (n->attr.reduce.keepdims) {
        dims[ndim++] = 1;
      }
    }
  }
  if (ndim == 0) dims[ndim++] = 1;
  set_dims(n, ndim, dims, (axis > 0 && X->batched) ? X->batched : 0);
  return 0;
}

int kn_shape_transpose(KN_SHAPE_ARGS) {
  const kn_node_rec *X = in(g, n, 0);
  const int *perm = n->attr.transpose.perm;
  int seen[KN_MAX_DIMS] = {0}, dims[KN_MAX_DIMS];
  for (int d = 0; d < X->ndim; d++) {
    if (perm[d] < 0 || perm[d] >= X->ndim || seen[perm[d]]++) {
      return kn_graph_fail(g, KN_EINVAL, "transpose: perm[%d] = %d makes no permutation of %d dims",
                           d, perm[d], X->ndim);
    }
    dims[d] = X->dims[perm[d]];
  }
  if (X->batched && perm[0] != 0) {
    return kn_graph_fail(g, KN_EINVAL, "transpose: the batch dim must stay first (perm[0] = 0)");
  }
  set_dims(n, X->ndim, dims, X->batched);
  return 0;
}

int kn_shape_concat(KN_SHAPE_ARGS) {
  const kn_node_rec *A = in(g, n, 0), *B = in(g, n, 1);
  const int axis = n->attr.slice.axis;
  int ok = A->ndim == B->ndim && A->batched == B->batched && axis >= 0 && axis < A->ndim &&
           !(axis == 0 && A->batched);
  for (int d = 0; ok && d < A->ndim; d++) ok = d == axis || A->dims[d] == B->dims[d];
  if (!ok) {
    char sa[64], sb[64];
    kn_shape_str(A, sa, sizeof sa);
    kn_shape_str(B, sb, sizeof sb);
    return kn_graph_fail(g, KN_EINVAL,
                         "concat: %s and %s must agree on every dim but the (non-batch) axis %d",
                         sa, sb, axis);
  }
  like(n, A);
  n->dims[axis] += B->dims[axis];
  return 0;
}

int kn_shape_slice(KN_SHAPE_ARGS) {
  const kn_node_rec *X = in(g, n, 0);
  const int axis = n->attr.slice.axis, start = n->attr.slice.start, len = n->attr.slice.len;
  if (axis < 0 || axis >= X->ndim || (axis == 0 && X->batched) || start < 0 || len < 1 ||
      start + len > X->dims[axis]) {
    return kn_graph_fail(g, KN_EINVAL,
                         "slice: [%d, %d) along axis %d is outside the tensor or on its batch dim",
                         start, start + len, axis);
  }
  like(n, X);
  n->dims[axis] = len;
  return 0;
}

/* ---- windows over NHWC (attr.conv: kernel, strides, dilation, padding,
 * the output's OH x OW and the input's H x W) ---- */

static int need_nhwc(kn_graph *g, const kn_node_rec *n, const kn_node_rec *x) {
  return x->ndim == 4 ? 0 : fail_on(g, n, x, "an NHWC tensor (B, H, W, C)");
}

/* x (B, H, W, C) -> columns (B*OH*OW, KH*KW*C), OH*OW rows per example. */
int kn_shape_im2col(KN_SHAPE_ARGS) {
  const kn_node_rec *X = in(g, n, 0);
  const kn_conv_attrs *a = &n->attr.conv;
  if (need_nhwc(g, n, X)) return -1;
  const int per = a->oh * a->ow, dims[2] = {X->dims[0] * per, a->kh * a->kw * X->dims[3]};
  set_dims(n, 2, dims, X->batched ? X->batched * per : 0);
  return 0;
}

/* dcols (B*OH*OW, KH*KW*C) -> dx (B, H, W, C). */
int kn_shape_col2im(KN_SHAPE_ARGS) {
  const kn_node_rec *D = in(g, n, 0);
  const kn_conv_attrs *a = &n->attr.conv;
  const int per = a->oh * a->ow, taps = a->kh * a->kw;
  if (D->ndim != 2 || per < 1 || taps < 1 || D->dims[0] % per || D->dims[1] % taps ||
      D->batched % per)
    return fail_on(g, n, D, "columns (B*OH*OW, KH*KW*C) of its window");
  const int dims[4] = {D->dims[0] / per, a->h, a->w, D->dims[1] / taps};
  set_dims(n, 4, dims, D->batched / per);
  return 0;
}

/* x (B, H, W, C) zero-padded to (B, HP, WP, C), HP = (OH-1)*SH + (KH-1)*DH + 1. */
int kn_shape_conv_pad(KN_SHAPE_ARGS) {
  const kn_node_rec *X = in(g, n, 0);
  const kn_conv_attrs *a = &n->attr.conv;
  if (need_nhwc(g, n, X)) return -1;
  const int dims[4] = {X->dims[0], (a->oh - 1) * a->sh + (a->kh - 1) * a->dh + 1,
                       (a->ow - 1) * a->sw + (a->kw - 1) * a->dw + 1, X->dims[3]};
  set_dims(n, 4, dims, X->batched);
  return 0;
}

/* (padded dy, kernel (KH, KW, C, F)) -> dx (B, H, W, C): the padded dy's
 * window is the transposed convolution's, whose output is dx. */
int kn_shape_conv_input_grad(KN_SHAPE_ARGS) {
  const kn_node_rec *P = in(g, n, 0), *K = in(g, n, 1);
  if (need_nhwc(g, n, P) || need_nhwc(g, n, K)) return -1;
  const int dims[4] = {P->dims[0], P->attr.conv.oh, P->attr.conv.ow, K->dims[2]};
  set_dims(n, 4, dims, P->batched);
  return 0;
}

/* (dy (B, OH, OW, F), kernel (KH, KW, C, F)) -> dx (B, H, W, C), the
 * window's input size. */
int kn_shape_col2im_gemm(KN_SHAPE_ARGS) {
  const kn_node_rec *D = in(g, n, 0), *K = in(g, n, 1);
  if (need_nhwc(g, n, D) || need_nhwc(g, n, K)) return -1;
  const kn_conv_attrs *a = &n->attr.conv;
  if (D->dims[1] != a->oh || D->dims[2] != a->ow || K->dims[0] != a->kh || K->dims[1] != a->kw ||
      K->dims[3] != D->dims[3])
    return fail_on(g, n, D, "dy (B, OH, OW, F) of its window and kernel (KH, KW, C, F)");
  const int dims[4] = {D->dims[0], a->h, a->w, K->dims[2]};
  set_dims(n, 4, dims, D->batched);
  return 0;
}

/* (x (B, H, W, C), w (KH, KW, C, M)) -> (B, OH, OW, C*M). */
int kn_shape_dwconv(KN_SHAPE_ARGS) {
  const kn_node_rec *X = in(g, n, 0), *W = in(g, n, 1);
  if (need_nhwc(g, n, X) || need_nhwc(g, n, W)) return -1;
  const int dims[4] = {X->dims[0], n->attr.conv.oh, n->attr.conv.ow, X->dims[3] * W->dims[3]};
  set_dims(n, 4, dims, X->batched);
  return 0;
}

/* (dy, w (KH, KW, C, M)) -> dx (B, H, W, C). */
int kn_shape_dwconv_dx(KN_SHAPE_ARGS) {
  const kn_node_rec *D = in(g, n, 0), *W = in(g, n, 1);
  if (need_nhwc(g, n, D) || need_nhwc(g, n, W)) return -1;
  const int dims[4] = {D->dims[0], n->attr.conv.h, n->attr.conv.w, W->dims[2]};
  set_dims(n, 4, dims, D->batched);
  return 0;
}

/* (dy (B, OH, OW, C*M), x (B, H, W, C)) -> dw (KH, KW, C, M). */
int kn_shape_dwconv_dw(KN_SHAPE_ARGS) {
  const kn_node_rec *D = in(g, n, 0), *X = in(g, n, 1);
  if (need_nhwc(g, n, D) || need_nhwc(g, n, X)) return -1;
  if (D->dims[3] % X->dims[3]) return fail_on(g, n, D, "channels a multiple of the input's");
  const int dims[4] = {n->attr.conv.kh, n->attr.conv.kw, X->dims[3], D->dims[3] / X->dims[3]};
  set_dims(n, 4, dims, 0);
  return 0;
}

/* x (B, H, W, C) -> (B, OH, OW, C). */
int kn_shape_pool(KN_SHAPE_ARGS) {
  const kn_node_rec *X = in(g, n, 0);
  if (need_nhwc(g, n, X)) return -1;
  const int dims[4] = {X->dims[0], n->attr.conv.oh, n->attr.conv.ow, X->dims[3]};
  set_dims(n, 4, dims, X->batched);
  return 0;
}

/* (dy (B, OH, OW, C), x, y) or (dy, argmax bytes) -> dx (B, H, W, C). */
int kn_shape_pool_grad(KN_SHAPE_ARGS) {
  const kn_node_rec *D = in(g, n, 0);
  if (need_nhwc(g, n, D)) return -1;
  const int dims[4] = {D->dims[0], n->attr.conv.h, n->attr.conv.w, D->dims[3]};
  set_dims(n, 4, dims, D->batched);
  return 0;
}

/* One byte per element of the pool that writes it. */
int kn_shape_pool_argmax(KN_SHAPE_ARGS) {
  const kn_node pool = n->attr.argmax_of - 1;
  if (pool < 0 || pool >= g->n_nodes || g->nodes[pool].op != KN_OP_POOL) {
    return kn_graph_fail(g, KN_EINVAL, "pool_argmax: node %d is no pool", pool);
  }
  n->dtype = KN_U8;
  return like(n, &g->nodes[pool]);
}

/* (x (..., C), moving mean, moving var) -> (2, C): mean and 1/sqrt(var+eps). */
int kn_shape_bn_stats(KN_SHAPE_ARGS) {
  const kn_node_rec *X = in(g, n, 0);
  const int dims[2] = {2, X->dims[X->ndim - 1]};
  set_dims(n, 2, dims, 0);
  return 0;
}
