/* cuda.h — private to the engine: the CUDA backend's entry points, callable
 * from C. cuda.cu implements them in the module kiln_cuda (built with
 * KILN_CUDA=ON), which cuda_loader.c opens on first use; without it there
 * are no devices and every kernel says why, so callers need no #ifdef.
 *
 * Every function returns 0 on success or -1 with a sentence in err (naming
 * file:line and CUDA's own error string for a failed CUDA or cuBLAS call).
 * The kernels work on the calling thread's current device; a
 * communicator on its own. */
#ifndef KILN_ENGINE_CUDA_H
#define KILN_ENGINE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "../optim_rules.h" /* kn_step_consts */

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices. No device, no driver, or a build without
 * CUDA is not an error: *count = 0 and 0 is returned. */
int kn_cuda_device_count(int *count, char *err, size_t errlen);

/* The marketing name of device ("NVIDIA H100 80GB HBM3"), cut to len. */
int kn_cuda_device_name(int device, char *name, size_t len, char *err, size_t errlen);

/* c = op(a) op(b) on host buffers, row-major, like
 * cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1, a, lda, b, ldb, 0, c, n)
 * with tight leading dimensions:
 *   a: (m, k), or (k, m) when trans_a    b: (k, n), or (n, k) when trans_b
 *   c: (m, n), overwritten
 * Copies to the device, runs cuBLAS sgemm, copies back. */
int kn_cuda_matmul(const float *a, const float *b, float *c, int m, int n, int k, int trans_a,
                   int trans_b, char *err, size_t errlen);

/* y[i] = max(x[i], 0) for n host floats; NaN stays NaN (as in PyTorch).
 * x == y is allowed. */
int kn_cuda_relu(const float *x, float *y, size_t n, char *err, size_t errlen);

/* dx[i] = y[i] <= 0 ? 0 : dy[i] for n host floats: relu's gradient from its
 * output y, as the CPU kernel (a NaN y passes dy). dx may be dy. */
int kn_cuda_relu_grad(const float *dy, const float *y, float *dx, size_t n, char *err,
                      size_t errlen);

/* How a GEMM on the device multiplies its float32 operands: in float32
 * (CUDA cores), or on tensor cores with the operands rounded to TF32
 * (10-bit mantissa: a spec's allow_tf32), to bfloat16 (mixed_bfloat16)
 * or to IEEE half (mixed_float16), the products summed in float32 either
 * way. */
typedef enum kn_cuda_math {
  KN_CUDA_MATH_F32 = 0,
  KN_CUDA_MATH_TF32 = 1,
  KN_CUDA_MATH_BF16 = 2,
  KN_CUDA_MATH_F16 = 3,
} kn_cuda_math;

/* The same three on device buffers of the current device (kn_cuda_alloc),
 * queued on its default stream without copies: the graph's kernels, over
 * values kept on the device (residency.c). A fault in the queued work
 * surfaces at the next kn_cuda_copy_out, which waits for it. The matmul
 * multiplies as math says. */
int kn_cuda_dev_matmul(const float *a, const float *b, float *c, int m, int n, int k, int trans_a,
                       int trans_b, kn_cuda_math math, char *err, size_t errlen);
int kn_cuda_dev_relu(const float *x, float *y, size_t n, char *err, size_t errlen);
int kn_cuda_dev_relu_grad(const float *dy, const float *y, float *dx, size_t n, char *err,
                          size_t errlen);

/* On device buffers too: y = x + b for rows x cols x and cols b (relu
 * after, with relu), and out[c] = the sum over the rows of x[r][c]. */
int kn_cuda_dev_bias_add(const float *x, const float *b, float *y, size_t rows, size_t cols,
                         int relu, char *err, size_t errlen);
int kn_cuda_dev_reduce_rows(const float *x, float *out, size_t rows, size_t cols, char *err,
                            size_t errlen);

/* One optimizer step over n parameters on device buffers: p updated from
 * g under c's rule, with its state in m and v (NULL where the rule keeps
 * none), each element as optim_rules.h says. */
int kn_cuda_dev_optimizer_step(const kn_step_consts *c, float *p, const float *g, float *m,
                               float *v, size_t n, char *err, size_t errlen);

/* The windows of a convolution or a pooling over NHWC images: batch
 * images of h x w x c in, oh x ow windows of kh x kw cells out, strides
 * sh, sw, dilations dh, dw (1 for pooling), pad_top and pad_left zero
 * cells before the image (TF's same padding); max pooling or average
 * (over the cells inside the image) where it is a pooling. */
typedef struct kn_cuda_windows {
  int batch, h, w, c;
  int oh, ow, kh, kw, sh, sw, dh, dw, pad_top, pad_left;
  int max;
} kn_cuda_windows;

/* On device buffers, as the CPU kernels (cpu_kernels_conv.inc), float32:
 * - im2col: cols (batch*oh*ow, kh*kw*c), a row per window, its cells'
 *   channels in (ki, kj, c) order, zeros outside the image;
 * - col2im: dx (batch, h, w, c), the sum of every column entry that
 *   im2col read from that cell, added in the CPU's order (windows in
 *   row-major order), so the result is bit-identical;
 * - pool: y (batch, oh, ow, c), each window's max (NaN wins, as on the
 *   CPU) or mean;
 * - pool_grad: dx (batch, h, w, c) from dy (batch, oh, ow, c), the
 *   forward's x and y: a max window's dy goes to its first cell equal to
 *   its max (torch's choice), a mean's spreads evenly; sums in the CPU's
 *   order, bit-identical. */
int kn_cuda_dev_im2col(const kn_cuda_windows *w, const float *x, float *cols, char *err,
                       size_t errlen);
int kn_cuda_dev_col2im(const kn_cuda_windows *w, const float *cols, float *dx, char *err,
                       size_t errlen);
int kn_cuda_dev_pool(const kn_cuda_windows *w, const float *x, float *y, char *err, size_t errlen);
int kn_cuda_dev_pool_grad(const kn_cuda_windows *w, const float *dy, const float *x, const float *y,
                          float *dx, char *err, size_t errlen);

/* Depthwise convolution over the windows w (input x (batch, h, w, c),
 * weights (kh, kw, c, M), output (batch, oh, ow, c * M), output channel o
 * reading input channel o / M): mode 0, out = y from (a = x, b =
 * weights); mode 1, out = dx from (a = dy, b = weights); mode 2, out = the
 * weights' gradient from (a = dy, b = x), summed in double over the batch
 * in parts added in order. */
int kn_cuda_dev_dwconv(const kn_cuda_windows *w, int M, int mode, const float *a, const float *b,
                       float *out, char *err, size_t errlen);

/* Mixed precision's casts over n elements on device buffers: float32 to
 * bfloat16 or f16 (round to nearest even, NaN kept quiet, f16 saturating
 * to infinity), back to float32, and float32 rounded through the narrow
 * type in place of its own value, each as the CPU's (narrow.h). */
typedef enum kn_cuda_cast {
  KN_CUDA_CAST_TO_BF16 = 0,
  KN_CUDA_CAST_FROM_BF16 = 1,
  KN_CUDA_CAST_ROUND_BF16 = 2,
  KN_CUDA_CAST_TO_F16 = 3,
  KN_CUDA_CAST_FROM_F16 = 4,
  KN_CUDA_CAST_ROUND_F16 = 5,
} kn_cuda_cast;
int kn_cuda_dev_cast(const void *x, void *y, size_t n, kn_cuda_cast mode, char *err, size_t errlen);

/* y = a op b over n elements of device buffers (operands of y's shape),
 * op as graph_internal.h's kn_binop: 0 add, 1 subtract, 2 multiply, 3
 * divide (IEEE, as the CPU's). */
int kn_cuda_dev_binary(const float *a, const float *b, float *y, size_t n, int op, char *err,
                       size_t errlen);

/* A dropout mask over n elements of a device buffer: m[i] = keep where
 * Philox word first + i of stream `step` under `seed`, shifted right by 8,
 * is at least threshold, else 0 (the CPU's draw, philox.h: the same mask
 * on every device); threshold 0 and keep 1 give the evaluation's ones. */
int kn_cuda_dev_dropout_mask(float *m, size_t n, uint64_t seed, uint64_t step, uint64_t first,
                             uint32_t threshold, float keep, char *err, size_t errlen);

/* The activations of graph_internal.h's kn_unop (op 0 to 7: leaky relu,
 * elu, gelu (exact, with the normal CDF), sigmoid, tanh, alpha * x, abs,
 * square) over n elements of device buffers, y = f(x), and their
 * gradients dx from (dy, x, y), each as the CPU's formula (within the
 * rounding of CUDA's expf, tanhf and normcdff against kiln's). */
int kn_cuda_dev_unary(const float *x, float *y, size_t n, int op, float alpha, char *err,
                      size_t errlen);
int kn_cuda_dev_unary_grad(const float *dy, const float *x, const float *y, float *dx, size_t n,
                           int op, float alpha, char *err, size_t errlen);

/* A reduction over the middle axis of x as (outer, len, inner): y (outer,
 * inner) its sum, mean or max (kind 0, 1, 2: graph_internal.h's
 * kn_reduce_kind), summed in order in float as the CPU's (a max: NaN
 * wins); and the gradient dx (outer, len, inner) from dy (outer, inner),
 * x and y: spread evenly (a mean's divided by len), a max's to its first
 * maximum. */
int kn_cuda_dev_reduce(const float *x, float *y, size_t outer, size_t len, size_t inner, int kind,
                       char *err, size_t errlen);
int kn_cuda_dev_reduce_grad(const float *dy, const float *x, const float *y, float *dx,
                            size_t outer, size_t len, size_t inner, int kind, char *err,
                            size_t errlen);

/* Batch norm over the last axis of (rows, C) values, as the CPU's
 * (cpu_kernels_bn.inc), each channel's sums in double:
 * - bn_stats: in training, stats (2, C) = each channel's batch mean and
 *   1 / sqrt(var + epsilon) (var from the squared deviations over rows,
 *   summed shifted by the channel's first value), and the moving mean and
 *   variance (unbiased) moved towards them by momentum, in place; else
 *   the stats from the moving ones;
 * - bn_apply: y = (x - mean) * inv * gamma + beta;
 * - bn_grad: from dy, x, stats and gamma, the sums over rows of dy (beta's
 *   gradient, into dbeta) and of dy * xhat (gamma's, into dgamma), and
 *   dx = inv gamma / rows * (rows dy - sum(dy) - xhat sum(dy xhat)); any of
 *   dx, dgamma and dbeta may be NULL, and stats and gamma too where only
 *   dbeta is asked for (x is then not read). */
int kn_cuda_dev_bn_stats(const float *x, float *moving_mean, float *moving_var, float *stats,
                         size_t rows, size_t C, float momentum, float epsilon, int training,
                         char *err, size_t errlen);
int kn_cuda_dev_bn_apply(const float *x, const float *stats, const float *gamma, const float *beta,
                         float *y, size_t rows, size_t C, char *err, size_t errlen);
int kn_cuda_dev_bn_grad(const float *dy, const float *x, const float *stats, const float *gamma,
                        float *dx, float *dgamma, float *dbeta, size_t rows, size_t C, char *err,
                        size_t errlen);

/* rows x len floats from src to dst on the current device, rows
 * src_pitch and dst_pitch floats apart (concatenation and slicing along an
 * axis), queued. */
int kn_cuda_dev_copy_rows(float *dst, size_t dst_pitch, const float *src, size_t src_pitch,
                          size_t rows, size_t len, char *err, size_t errlen);

/* y[i] = value for n floats (the loss's seed). */
int kn_cuda_dev_fill(float *y, size_t n, float value, char *err, size_t errlen);

/* Sparse softmax cross-entropy of (rows, cols) logits against labels in
 * [0, cols) (the caller checks them: a kernel cannot say which is wrong):
 * loss[0] = the mean over rows of logsumexp(row) - row[label], each row's
 * term in double as the CPU's; and its gradient dx = (softmax(row) -
 * onehot(label)) * dloss[0] / rows. */
int kn_cuda_dev_softmax_xent(const float *logits, const int32_t *labels, float *loss, size_t rows,
                             size_t cols, char *err, size_t errlen);
int kn_cuda_dev_softmax_xent_grad(const float *logits, const int32_t *labels, const float *dloss,
                                  float *dx, size_t rows, size_t cols, char *err, size_t errlen);

/* The other losses, as the CPU's: categorical cross-entropy of (rows,
 * cols) logits against (rows, cols) target probabilities (each row's term
 * p . (logsumexp - x) in double), and binary cross-entropy of n logits
 * against n targets (max(x, 0) - x t + log1p(exp(-|x|)) in double), each
 * a mean into loss[0]; and their gradients from dloss[0]. */
int kn_cuda_dev_xent_dense(const float *logits, const float *probs, float *loss, size_t rows,
                           size_t cols, char *err, size_t errlen);
int kn_cuda_dev_xent_dense_grad(const float *logits, const float *probs, const float *dloss,
                                float *dx, size_t rows, size_t cols, char *err, size_t errlen);
int kn_cuda_dev_bce_logits(const float *x, const float *t, float *loss, size_t n, char *err,
                           size_t errlen);
int kn_cuda_dev_bce_logits_grad(const float *x, const float *t, const float *dloss, float *dx,
                                size_t n, char *err, size_t errlen);

/* bytes from src to dst, both on the current device, queued. */
int kn_cuda_dev_copy(void *dst, const void *src, size_t bytes, char *err, size_t errlen);

/* Makes device the calling thread's current one (cudaSetDevice), after
 * checking it exists. */
int kn_cuda_set_device(int device, char *err, size_t errlen);

/* bytes of memory on device (cudaMalloc there) into *out; kn_cuda_free
 * gives it back (NULL is a no-op). */
int kn_cuda_alloc(int device, size_t bytes, void **out, char *err, size_t errlen);
void kn_cuda_free(int device, void *p);
/* bytes from host memory to device memory on device (copy_in) or back
 * (copy_out), synchronously. */
int kn_cuda_copy_in(int device, void *dst, const void *host, size_t bytes, char *err,
                    size_t errlen);
int kn_cuda_copy_out(int device, void *host, const void *src, size_t bytes, char *err,
                     size_t errlen);

/* Pins `bytes` of host memory at p (cudaHostRegister), so copies between
 * it and a device run at DMA speed instead of through CUDA's pageable
 * staging; kn_cuda_host_unregister(p) undoes it before p is freed. A
 * failure leaves the memory as it was: usable, unpinned. */
int kn_cuda_host_register(void *p, size_t bytes, char *err, size_t errlen);
void kn_cuda_host_unregister(void *p); /* NULL, or memory never pinned: a no-op */

/* ------------------------------------------------------------- NCCL -- */

/* Sums across GPUs with NCCL: ranks in one process (a thread per device)
 * or in many (the id sent over MPI). Values stay in host memory, as every
 * kernel's do: an all-reduce copies its floats into a pinned staging
 * buffer and to the device, sums them over the ranks on the device, and
 * copies the sum back. */
#define KN_NCCL_ID_BYTES 128
typedef struct kn_nccl kn_nccl; /* one rank of a communicator */

/* A new communicator's id (ncclGetUniqueId): made by one rank, handed to
 * every other before they open it. */
int kn_nccl_unique_id(unsigned char id[KN_NCCL_ID_BYTES], char *err, size_t errlen);

/* Joins communicator id as rank of nranks on CUDA device `device`, with
 * staging room for `capacity` floats. Every rank must call it, each from
 * its own thread or process; it waits for all of them at most timeout_s
 * (0: 300 s), and fails then (one died or hangs). */
int kn_nccl_open(const unsigned char id[KN_NCCL_ID_BYTES], int nranks, int rank, int device,
                 size_t capacity, double timeout_s, kn_nccl **out, char *err, size_t errlen);

/* Starts summing host[0, n) over the ranks, staged at floats [at, at + n)
 * of the communicator's room: the host floats are read now and written by
 * kn_nccl_wait. Every rank starts the same sizes in the same order. */
int kn_nccl_start(kn_nccl *c, float *host, size_t at, size_t n, char *err, size_t errlen);

/* Waits for every started sum, at most timeout_s, and writes them to their
 * host floats. A failure or the timeout aborts the communicator (a peer
 * died or hangs): every later call fails, and nothing waits on the peers. */
int kn_nccl_wait(kn_nccl *c, char *err, size_t errlen);

void kn_nccl_close(kn_nccl *c); /* NULL is a no-op */

#ifdef __cplusplus
}
#endif

#endif
