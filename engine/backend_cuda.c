/* backend_cuda.c — the CUDA backend (backend.h) over the CUDA module
 * (cuda/cuda.h): its kernels, as the op table names them (op_table.c),
 * each running one node on its device over the buffers the graph keeps
 * there (residency.c: the executor has copied in any input that was
 * elsewhere). Values fed, held or viewed need no kernel, and a copy
 * between host buffers runs on the host. */
#include <math.h>
#include <stdio.h>

#include "backend.h"
#include "cuda/cuda.h"

/* Node v's buffer on the device n runs on. */
static void *on(kn_graph *g, const kn_node_rec *n, int v) {
  return kn_device_data(g, v, n->device.index);
}

/* mixed_bfloat16's GEMMs on bf16 tensor cores (the operands rounded to
 * bf16 as the CPU's bf16 GEMM reads them, products summed in f32),
 * mixed_float16's on f16 ones; a float32 graph's on TF32 ones where its
 * spec allows, else in f32. */
static kn_cuda_math gemm_math(const kn_graph *g) {
  if (g->precision == KN_PRECISION_MIXED_BFLOAT16) return KN_CUDA_MATH_BF16;
  if (g->precision == KN_PRECISION_MIXED_FLOAT16) return KN_CUDA_MATH_F16;
  return g->allow_tf32 ? KN_CUDA_MATH_TF32 : KN_CUDA_MATH_F32;
}

int kn_cuda_kernel_matmul(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  int m, cols, k;
  kn_matmul_dims(g, n, &m, &cols, &k);
  return kn_cuda_dev_matmul(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                            on(g, n, (int)(n - g->nodes)), m, cols, k, n->attr.matmul.trans_a,
                            n->attr.matmul.trans_b, gemm_math(g), err, errlen)
             ? KN_EIO
             : KN_OK;
}

/* The windows of a convolution or pooling node n over the images of node
 * `images` (its input, or for a gradient its output). */
static kn_cuda_windows windows_of(const kn_graph *g, const kn_node_rec *n,
                                  const kn_node_rec *images) {
  const kn_conv_attrs *a = &n->attr.conv;
  return (kn_cuda_windows){.batch = kn_node_rows(g, images),
                           .h = images->dims[1],
                           .w = images->dims[2],
                           .c = images->dims[3],
                           .oh = a->oh,
                           .ow = a->ow,
                           .kh = a->kh,
                           .kw = a->kw,
                           .sh = a->sh,
                           .sw = a->sw,
                           .dh = a->dh > 0 ? a->dh : 1,
                           .dw = a->dw > 0 ? a->dw : 1,
                           .pad_top = a->pad_top,
                           .pad_left = a->pad_left,
                           .max = a->pool_kind == 0};
}

int kn_cuda_kernel_im2col(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  const kn_cuda_windows w = windows_of(g, n, &g->nodes[n->inputs[0]]);
  return kn_cuda_dev_im2col(&w, on(g, n, n->inputs[0]), on(g, n, (int)(n - g->nodes)), err, errlen)
             ? KN_EIO
             : KN_OK;
}

int kn_cuda_kernel_col2im(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  const kn_cuda_windows w = windows_of(g, n, n);
  return kn_cuda_dev_col2im(&w, on(g, n, n->inputs[0]), on(g, n, (int)(n - g->nodes)), err, errlen)
             ? KN_EIO
             : KN_OK;
}

int kn_cuda_kernel_pool(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  const kn_cuda_windows w = windows_of(g, n, &g->nodes[n->inputs[0]]);
  return kn_cuda_dev_pool(&w, on(g, n, n->inputs[0]), on(g, n, (int)(n - g->nodes)), err, errlen)
             ? KN_EIO
             : KN_OK;
}

/* dx (n) from dy, x and y (inputs 0 to 2). */
int kn_cuda_kernel_pool_grad(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  const kn_cuda_windows w = windows_of(g, n, &g->nodes[n->inputs[1]]);
  return kn_cuda_dev_pool_grad(&w, on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                               on(g, n, n->inputs[2]), on(g, n, (int)(n - g->nodes)), err, errlen)
             ? KN_EIO
             : KN_OK;
}

/* y = a op b, where both have y's shape (a broadcast runs on the host). */
int kn_cuda_kernel_binary(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return kn_cuda_dev_binary(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                            on(g, n, (int)(n - g->nodes)), kn_node_elems(n, g->batch),
                            (int)n->attr.binary.op, err, errlen)
             ? KN_EIO
             : KN_OK;
}

/* A residual add: y = x0 + x1, of one shape. */
int kn_cuda_kernel_add(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return kn_cuda_dev_binary(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                            on(g, n, (int)(n - g->nodes)), kn_node_elems(n, g->batch), KN_BIN_ADD,
                            err, errlen)
             ? KN_EIO
             : KN_OK;
}

/* The CPU's mask (cpu_kernels.inc's dropout_range): each element draws by
 * its place in the step's global batch; ones outside training. */
int kn_cuda_kernel_dropout_mask(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  const double rate = n->attr.dropout.rate;
  const uint64_t first = n->batched ? (uint64_t)g->row_offset * kn_node_elems(n, 1) : 0;
  const uint32_t threshold = g->training ? (uint32_t)ceil(rate * 16777216.0) : 0;
  const float keep = g->training ? (float)(1.0 / (1.0 - rate)) : 1.0f;
  return kn_cuda_dev_dropout_mask(on(g, n, (int)(n - g->nodes)), kn_node_elems(n, g->batch),
                                  n->attr.dropout.seed, g->train_runs, first, threshold, keep, err,
                                  errlen)
             ? KN_EIO
             : KN_OK;
}

/* An activation (kn_unop) and its gradient from (dy, x, y). */
int kn_cuda_kernel_unary(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return kn_cuda_dev_unary(on(g, n, n->inputs[0]), on(g, n, (int)(n - g->nodes)),
                           kn_node_elems(n, g->batch), (int)n->attr.unary.op, n->attr.unary.alpha,
                           err, errlen)
             ? KN_EIO
             : KN_OK;
}

int kn_cuda_kernel_unary_grad(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return kn_cuda_dev_unary_grad(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                                on(g, n, n->inputs[2]), on(g, n, (int)(n - g->nodes)),
                                kn_node_elems(n, g->batch), (int)n->attr.unary.op,
                                n->attr.unary.alpha, err, errlen)
             ? KN_EIO
             : KN_OK;
}

/* A reduction over an axis (sum, mean or max) and its gradient (dy, x, y). */
int kn_cuda_kernel_reduce(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  size_t outer, len, inner;
  kn_reduce_split(g, &g->nodes[n->inputs[0]], n->attr.reduce.axis, &outer, &len, &inner);
  return kn_cuda_dev_reduce(on(g, n, n->inputs[0]), on(g, n, (int)(n - g->nodes)), outer, len,
                            inner, (int)n->attr.reduce.kind, err, errlen)
             ? KN_EIO
             : KN_OK;
}

int kn_cuda_kernel_reduce_grad(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  size_t outer, len, inner;
  kn_reduce_split(g, &g->nodes[n->inputs[1]], n->attr.reduce.axis, &outer, &len, &inner);
  return kn_cuda_dev_reduce_grad(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                                 on(g, n, n->inputs[2]), on(g, n, (int)(n - g->nodes)), outer, len,
                                 inner, (int)n->attr.reduce.kind, err, errlen)
             ? KN_EIO
             : KN_OK;
}

/* The statistics (inputs x, moving mean, moving variance), the moving ones
 * updated in place in training. */
int kn_cuda_kernel_bn_stats(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  int rows, C;
  kn_node_matrix(g, &g->nodes[n->inputs[0]], &rows, &C);
  return kn_cuda_dev_bn_stats(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                              on(g, n, n->inputs[2]), on(g, n, (int)(n - g->nodes)), rows, C,
                              n->attr.bn.momentum, n->attr.bn.epsilon, g->training, err, errlen)
             ? KN_EIO
             : KN_OK;
}

/* y from (x, stats, gamma, beta). */
int kn_cuda_kernel_bn_apply(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  int rows, C;
  kn_node_matrix(g, n, &rows, &C);
  return kn_cuda_dev_bn_apply(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                              on(g, n, n->inputs[2]), on(g, n, n->inputs[3]),
                              on(g, n, (int)(n - g->nodes)), rows, C, err, errlen)
             ? KN_EIO
             : KN_OK;
}

/* dx from (dy, x, stats, gamma). */
int kn_cuda_kernel_bn_grad_x(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  int rows, C;
  kn_node_matrix(g, n, &rows, &C);
  return kn_cuda_dev_bn_grad(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]), on(g, n, n->inputs[2]),
                             on(g, n, n->inputs[3]), on(g, n, (int)(n - g->nodes)), NULL, NULL,
                             rows, C, err, errlen)
             ? KN_EIO
             : KN_OK;
}

/* gamma's gradient from (dy, x, stats); beta's from dy. */
int kn_cuda_kernel_bn_grad_gamma(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  int rows, C;
  kn_node_matrix(g, &g->nodes[n->inputs[1]], &rows, &C);
  return kn_cuda_dev_bn_grad(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]), on(g, n, n->inputs[2]),
                             NULL, NULL, on(g, n, (int)(n - g->nodes)), NULL, rows, C, err, errlen)
             ? KN_EIO
             : KN_OK;
}

int kn_cuda_kernel_bn_grad_beta(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  int rows, C;
  kn_node_matrix(g, &g->nodes[n->inputs[0]], &rows, &C);
  /* x and stats are not read for beta's sum alone: dy stands in for x */
  return kn_cuda_dev_bn_grad(on(g, n, n->inputs[0]), on(g, n, n->inputs[0]), NULL, NULL, NULL, NULL,
                             on(g, n, (int)(n - g->nodes)), rows, C, err, errlen)
             ? KN_EIO
             : KN_OK;
}

/* Whether a and b have one shape, batched alike. */
static int same_shape(const kn_node_rec *a, const kn_node_rec *b) {
  if (a->ndim != b->ndim || a->batched != b->batched) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->dims[d] != b->dims[d]) return 0;
  return 1;
}

/* Depthwise convolution: y from (x, weights), dx from (dy, weights), the
 * weights' gradient from (dy, x). */
static int dwconv(kn_graph *g, kn_node_rec *n, int mode, char *err, size_t errlen) {
  const kn_node_rec *in0 = &g->nodes[n->inputs[0]], *in1 = &g->nodes[n->inputs[1]];
  const kn_node_rec *images = mode == 0 ? in0 : mode == 1 ? n : in1;
  const kn_node_rec *weights = mode == 2 ? n : in1;
  const kn_cuda_windows w = windows_of(g, n, images);
  return kn_cuda_dev_dwconv(&w, weights->dims[3], mode, on(g, n, n->inputs[0]),
                            on(g, n, n->inputs[1]), on(g, n, (int)(n - g->nodes)), err, errlen)
             ? KN_EIO
             : KN_OK;
}

int kn_cuda_kernel_dwconv(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return dwconv(g, n, 0, err, errlen);
}

int kn_cuda_kernel_dwconv_dx(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return dwconv(g, n, 1, err, errlen);
}

int kn_cuda_kernel_dwconv_dw(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return dwconv(g, n, 2, err, errlen);
}

/* Two inputs side by side along the axis: each a block of each row. */
int kn_cuda_kernel_concat(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  const int axis = n->attr.slice.axis;
  size_t outer, ry, off = 0;
  kn_axis_split(g, n, axis, &outer, &ry);
  float *y = on(g, n, (int)(n - g->nodes));
  for (int k = 0; k < 2; k++) {
    size_t rx;
    kn_axis_split(g, &g->nodes[n->inputs[k]], axis, &outer, &rx);
    if (kn_cuda_dev_copy_rows(y + off, ry, on(g, n, n->inputs[k]), rx, outer, rx, err, errlen))
      return KN_EIO;
    off += rx;
  }
  return KN_OK;
}

/* [start, start + len) along the axis of each of its input's rows. */
int kn_cuda_kernel_slice(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  const kn_node_rec *X = &g->nodes[n->inputs[0]];
  const int axis = n->attr.slice.axis;
  size_t outer, rx, ry;
  kn_axis_split(g, X, axis, &outer, &rx);
  kn_axis_split(g, n, axis, &outer, &ry);
  const size_t start = rx / (size_t)X->dims[axis] * (size_t)n->attr.slice.start;
  const float *x = on(g, n, n->inputs[0]);
  return kn_cuda_dev_copy_rows(on(g, n, (int)(n - g->nodes)), ry, x + start, rx, outer, ry, err,
                               errlen)
             ? KN_EIO
             : KN_OK;
}

/* The loss's seed (its value may change: loss scaling). */
int kn_cuda_kernel_fill(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return kn_cuda_dev_fill(on(g, n, (int)(n - g->nodes)), kn_node_elems(n, g->batch),
                          n->attr.fill.value, err, errlen)
             ? KN_EIO
             : KN_OK;
}

/* The labels, checked where they were fed (the host's copy is current:
 * the batch is fed there), then the loss from (logits, labels) or its
 * gradient from (logits, labels, dloss) on the device. */
static int xent(kn_graph *g, kn_node_rec *n, int grad, char *err, size_t errlen) {
  int rows, cols;
  kn_node_matrix(g, &g->nodes[n->inputs[0]], &rows, &cols);
  const int rc = kn_check_labels(grad ? "softmax_xent_grad" : "softmax_xent",
                                 g->nodes[n->inputs[1]].data, rows, cols, err, errlen);
  if (rc) return rc;
  if (grad)
    return kn_cuda_dev_softmax_xent_grad(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                                         on(g, n, n->inputs[2]), on(g, n, (int)(n - g->nodes)),
                                         rows, cols, err, errlen)
               ? KN_EIO
               : KN_OK;
  return kn_cuda_dev_softmax_xent(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                                  on(g, n, (int)(n - g->nodes)), rows, cols, err, errlen)
             ? KN_EIO
             : KN_OK;
}

/* Categorical cross-entropy against dense targets (logits, probs[,
 * dloss]) and binary cross-entropy on logits (x, targets[, dloss]). */
int kn_cuda_kernel_xent_dense(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  int rows, cols;
  kn_node_matrix(g, &g->nodes[n->inputs[0]], &rows, &cols);
  return kn_cuda_dev_xent_dense(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                                on(g, n, (int)(n - g->nodes)), rows, cols, err, errlen)
             ? KN_EIO
             : KN_OK;
}

int kn_cuda_kernel_xent_dense_grad(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  int rows, cols;
  kn_node_matrix(g, &g->nodes[n->inputs[0]], &rows, &cols);
  return kn_cuda_dev_xent_dense_grad(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                                     on(g, n, n->inputs[2]), on(g, n, (int)(n - g->nodes)), rows,
                                     cols, err, errlen)
             ? KN_EIO
             : KN_OK;
}

int kn_cuda_kernel_bce_logits(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return kn_cuda_dev_bce_logits(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                                on(g, n, (int)(n - g->nodes)),
                                kn_node_elems(&g->nodes[n->inputs[0]], g->batch), err, errlen)
             ? KN_EIO
             : KN_OK;
}

int kn_cuda_kernel_bce_logits_grad(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return kn_cuda_dev_bce_logits_grad(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                                     on(g, n, n->inputs[2]), on(g, n, (int)(n - g->nodes)),
                                     kn_node_elems(n, g->batch), err, errlen)
             ? KN_EIO
             : KN_OK;
}

int kn_cuda_kernel_softmax_xent(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return xent(g, n, 0, err, errlen);
}

int kn_cuda_kernel_softmax_xent_grad(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return xent(g, n, 1, err, errlen);
}

/* Which of mixed precision's casts n is, or -1: f32 to bf16 or f16, back,
 * or f32 rounded through either. */
static int cast_mode(const kn_graph *g, const kn_node_rec *n) {
  const kn_dtype from = g->nodes[n->inputs[0]].dtype, to = n->dtype;
  if (from == KN_F32 && to == KN_BF16) return KN_CUDA_CAST_TO_BF16;
  if (from == KN_BF16 && to == KN_F32) return KN_CUDA_CAST_FROM_BF16;
  if (from == KN_F32 && to == KN_F32 && kn_cast_via(n) == KN_BF16) return KN_CUDA_CAST_ROUND_BF16;
  if (from == KN_F32 && to == KN_F16) return KN_CUDA_CAST_TO_F16;
  if (from == KN_F16 && to == KN_F32) return KN_CUDA_CAST_FROM_F16;
  if (from == KN_F32 && to == KN_F32 && kn_cast_via(n) == KN_F16) return KN_CUDA_CAST_ROUND_F16;
  return -1;
}

int kn_cuda_kernel_cast(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return kn_cuda_dev_cast(on(g, n, n->inputs[0]), on(g, n, (int)(n - g->nodes)),
                          kn_node_elems(n, g->batch), (kn_cuda_cast)cast_mode(g, n), err, errlen)
             ? KN_EIO
             : KN_OK;
}

int kn_cuda_kernel_relu(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return kn_cuda_dev_relu(on(g, n, n->inputs[0]), on(g, n, (int)(n - g->nodes)),
                          kn_node_elems(n, g->batch), err, errlen)
             ? KN_EIO
             : KN_OK;
}

int kn_cuda_kernel_relu_grad(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return kn_cuda_dev_relu_grad(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                               on(g, n, (int)(n - g->nodes)), kn_node_elems(n, g->batch), err,
                               errlen)
             ? KN_EIO
             : KN_OK;
}

/* y = x + b over rows of b's length (a dense layer's bias), then relu
 * where a pass fused it. */
int kn_cuda_kernel_bias_add(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  const size_t cols = kn_node_elems(&g->nodes[n->inputs[1]], 0);
  return kn_cuda_dev_bias_add(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                              on(g, n, (int)(n - g->nodes)), kn_node_elems(n, g->batch) / cols,
                              cols, n->fused_relu != 0, err, errlen)
             ? KN_EIO
             : KN_OK;
}

/* out[c] = the sum of column c of x's rows (a bias's gradient). */
int kn_cuda_kernel_reduce_rows(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  const size_t cols = kn_node_elems(n, 0);
  return kn_cuda_dev_reduce_rows(on(g, n, n->inputs[0]), on(g, n, (int)(n - g->nodes)),
                                 kn_node_elems(&g->nodes[n->inputs[0]], g->batch) / cols, cols, err,
                                 errlen)
             ? KN_EIO
             : KN_OK;
}

/* The value of its input, within the device. */
int kn_cuda_kernel_copy(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return kn_cuda_dev_copy(on(g, n, (int)(n - g->nodes)), on(g, n, n->inputs[0]),
                          kn_node_elems(n, g->batch) * sizeof(float), err, errlen)
             ? KN_EIO
             : KN_OK;
}

/* Ops whose value needs no kernel: data fed or held in the flat buffers,
 * and views. They live in host memory on any device. */
static int storage_only(kn_op op) {
  return kn_op_has(op, KN_OPF_FED | KN_OPF_FLAT | KN_OPF_VIEW);
}

/* The op's CUDA kernel where n and its inputs are float32 (a cast: one
 * of mixed_bfloat16's). */
static kn_kernel_fn cuda_kernel(const kn_graph *g, const kn_node_rec *n) {
  if (n->op == KN_OP_CAST) return cast_mode(g, n) >= 0 ? kn_op_def_of(n->op)->cuda : NULL;
  /* f32, and as built: a pass's pairing of a bias gradient with its GEMM
   * or a pool's argmax mark (which passes leave alone on GPU graphs) is
   * the CPU's */
  if (n->dtype != KN_F32 || n->gemm_pair || n->argmax || n->argmax_at) return NULL;
  if (n->fused_relu && n->op != KN_OP_BIAS_ADD) return NULL;
  if (n->op == KN_OP_POOL_GRAD && n->n_inputs != 3) return NULL; /* (dy, x, y) */
  if ((n->op == KN_OP_BINARY || n->op == KN_OP_ADD) &&
      !(same_shape(n, &g->nodes[n->inputs[0]]) && same_shape(n, &g->nodes[n->inputs[1]])))
    return NULL; /* broadcasts: the host's */
  /* batch norm as built: synchronized (its sums over the replicas), and
   * what the CPU's passes pair or fold, are the host's */
  if (n->round_bf16 || n->eval_written_by || n->written_by) return NULL;
  /* parts of another node's storage (the CPU's concat views) */
  if (n->storage == KN_STORE_PART) return NULL;
  for (int k = 0; k < n->n_inputs; k++)
    if (g->nodes[n->inputs[k]].storage == KN_STORE_PART) return NULL;
  if ((n->op == KN_OP_BN_STATS || n->op == KN_OP_BN_GRAD_X) && n->attr.bn.synchronized) return NULL;
  if (n->op == KN_OP_BN_GRAD_X &&
      (n->n_inputs != 4 || n->attr.bn.writes_gamma || n->attr.bn.writes_beta))
    return NULL;
  for (int k = 0; k < n->n_inputs; k++) {
    /* the loss's labels (int32, input 1) */
    const int labels = k == 1 && (n->op == KN_OP_SOFTMAX_XENT || n->op == KN_OP_SOFTMAX_XENT_GRAD);
    if (g->nodes[n->inputs[k]].dtype != (labels ? KN_I32 : KN_F32)) return NULL;
  }
  return kn_op_def_of(n->op)->cuda;
}

/* A kernel there, or no kernel needed (storage). */
static int cuda_supports(const kn_graph *g, const kn_node_rec *n) {
  return storage_only(n->op) || cuda_kernel(g, n);
}

static void *cuda_alloc(int device, size_t bytes, char *err, size_t errlen) {
  void *p = NULL;
  return kn_cuda_alloc(device, bytes, &p, err, errlen) == 0 ? p : NULL;
}

static int cuda_run(kn_graph *g, int i, char *err, size_t errlen) {
  kn_node_rec *n = &g->nodes[i];
  if (storage_only(n->op)) return KN_OK;
  const kn_kernel_fn kernel = kn_op_def_of(n->op)->cuda;
  if (!kernel) {
    snprintf(err, errlen, "run: node '%s' (%s) has no CUDA kernel", n->name, kn_op_name(n->op));
    return KN_EINVAL;
  }
  if (kn_cuda_set_device(n->device.index, err, errlen) != 0) return KN_EIO;
  return kernel(g, n, err, errlen);
}

const kn_backend kn_backend_cuda = {
    .name = "cuda",
    .device_count = kn_cuda_device_count,
    .kernel = cuda_kernel,
    .supports = cuda_supports,
    .alloc = cuda_alloc,
    .free = kn_cuda_free,
    .copy_in = kn_cuda_copy_in,
    .copy_out = kn_cuda_copy_out,
    .run = cuda_run,
};
