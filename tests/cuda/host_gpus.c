/* host_gpus.c — a stand-in for the CUDA module (engine/cuda/cuda.cu) on
 * machines without a GPU, for tests only: KILN_HOST_GPUS devices (default
 * 2) whose memory is the host's, kernels computed with OpenBLAS and plain
 * loops, and NCCL communicators between the threads of one process whose
 * all-reduce sums the ranks' floats in rank order. Opened through
 * KILN_CUDA_MODULE, it lets the engine's GPU paths (placement, GPU
 * replicas with their buckets, weights and hooks, a rank that never
 * joins) run in CI; the real kernels and NCCL are tested by test_cuda and
 * test_nccl on a machine with GPUs. KILN_HOST_GPUS_ABSENT_RANK=r makes
 * rank r of every communicator fail to join, as a rank that died would. */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda/cuda_module.h"
#include "philox.h"
#include "kernels_ref.h"

#define MAX_RANKS 64

static int devices(void) {
  const char *e = getenv("KILN_HOST_GPUS");
  return e && *e ? atoi(e) : 2;
}

static int check_device(int device, char *err, size_t errlen) {
  const int n = devices();
  if (device >= 0 && device < n) return 0;
  snprintf(err, errlen, "CUDA device %d does not exist: this machine has %d CUDA device%s", device,
           n, n == 1 ? "" : "s");
  return -1;
}

int kiln_cuda_module_device_count(int *count, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  *count = devices();
  return 0;
}

int kiln_cuda_module_device_name(int device, char *name, size_t len, char *err, size_t errlen) {
  if (check_device(device, err, errlen)) return -1;
  snprintf(name, len, "host stand-in %d", device);
  return 0;
}

int kiln_cuda_module_set_device(int device, char *err, size_t errlen) {
  return check_device(device, err, errlen);
}

int kiln_cuda_module_matmul(const float *a, const float *b, float *c, int m, int n, int k,
                            int trans_a, int trans_b, char *err, size_t errlen) {
  if (m < 0 || n < 0 || k < 0) { /* as the module's check */
    snprintf(err, errlen, "kn_cuda_matmul: sizes must be >= 0, got m=%d n=%d k=%d", m, n, k);
    return -1;
  }
  if (m == 0 || n == 0) return 0;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, trans_a ? m : k, b,
              trans_b ? k : n, 0.0f, c, n);
  return 0;
}

int kiln_cuda_module_relu(const float *x, float *y, size_t n, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  for (size_t i = 0; i < n; i++) y[i] = x[i] < 0.0f ? 0.0f : x[i]; /* NaN passes, as on a GPU */
  return 0;
}

int kiln_cuda_module_relu_grad(const float *dy, const float *y, float *dx, size_t n, char *err,
                               size_t errlen) {
  (void)err;
  (void)errlen;
  for (size_t i = 0; i < n; i++) dx[i] = y[i] <= 0.0f ? 0.0f : dy[i]; /* NaN y passes dy */
  return 0;
}

/* v with its mantissa rounded to TF32's 10 bits, to nearest even (NaN and
 * infinities kept), as tensor cores read a float32 operand. */
static float round_tf32(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
  memcpy(&v, &u, sizeof v);
  return v;
}

/* A copy of n floats rounded as `math` says (NULL: out of memory). */
static float *rounded(const float *x, size_t n, int math) {
  float *r = malloc((n ? n : 1) * sizeof *r);
  if (!r) return NULL;
  for (size_t i = 0; i < n; i++)
    r[i] = math == KN_CUDA_MATH_TF32  ? round_tf32(x[i])
           : math == KN_CUDA_MATH_F16 ? kn_f16_to_f32(kn_f16_from_f32(x[i]))
                                      : kn_bf16_to_f32(kn_bf16_from_f32(x[i]));
  return r;
}

/* Device memory is host memory, so the kernels on device buffers are the
 * ones above; a GEMM on "tensor cores" rounds its operands first, as the
 * device does, then sums in float32. */
int kiln_cuda_module_dev_matmul(const float *a, const float *b, float *c, int m, int n, int k,
                                int trans_a, int trans_b, int math, char *err, size_t errlen) {
  if (math < KN_CUDA_MATH_F32 || math > KN_CUDA_MATH_F16) {
    snprintf(err, errlen,
             "kn_cuda_dev_matmul: math must be f32, tf32, bf16 or f16 (0 to 3), got %d", math);
    return -1;
  }
  if (math == KN_CUDA_MATH_F32 || m <= 0 || n <= 0 || k <= 0)
    return kiln_cuda_module_matmul(a, b, c, m, n, k, trans_a, trans_b, err, errlen);
  float *ra = rounded(a, (size_t)m * k, math), *rb = rounded(b, (size_t)k * n, math);
  int rc = -1;
  if (ra && rb)
    rc = kiln_cuda_module_matmul(ra, rb, c, m, n, k, trans_a, trans_b, err, errlen);
  else
    snprintf(err, errlen, "host stand-in: out of memory for a rounded GEMM operand");
  free(ra);
  free(rb);
  return rc;
}

/* The windows' kernels, the casts, reductions and batch norm: kernels_ref.h's
 * loops, the CPU's. */
static int windows_ok(const kn_cuda_windows *w, const char *what, char *err, size_t errlen) {
  if (w && w->batch >= 0 && w->h > 0 && w->w > 0 && w->c > 0 && w->oh > 0 && w->ow > 0 &&
      w->kh > 0 && w->kw > 0 && w->sh > 0 && w->sw > 0 && w->dh > 0 && w->dw > 0)
    return 1;
  snprintf(err, errlen, "%s: windows need positive sizes, strides and dilations (batch >= 0)",
           what);
  return 0;
}

int kiln_cuda_module_dev_im2col(const kn_cuda_windows *w, const float *x, float *cols, char *err,
                                size_t errlen) {
  if (!windows_ok(w, "kn_cuda_dev_im2col", err, errlen)) return -1;
  ref_im2col(w, x, cols);
  return 0;
}

int kiln_cuda_module_dev_col2im(const kn_cuda_windows *w, const float *cols, float *dx, char *err,
                                size_t errlen) {
  if (!windows_ok(w, "kn_cuda_dev_col2im", err, errlen)) return -1;
  ref_col2im(w, cols, dx);
  return 0;
}

int kiln_cuda_module_dev_pool(const kn_cuda_windows *w, const float *x, float *y, char *err,
                              size_t errlen) {
  if (!windows_ok(w, "kn_cuda_dev_pool", err, errlen)) return -1;
  ref_pool(w, x, y, NULL, NULL, NULL);
  return 0;
}

int kiln_cuda_module_dev_pool_grad(const kn_cuda_windows *w, const float *dy, const float *x,
                                   const float *y, float *dx, char *err, size_t errlen) {
  if (!windows_ok(w, "kn_cuda_dev_pool_grad", err, errlen)) return -1;
  ref_pool(w, x, NULL, y, dy, dx);
  return 0;
}

int kiln_cuda_module_dev_binary(const float *a, const float *b, float *y, size_t n, int op,
                                char *err, size_t errlen) {
  if (op < 0 || op > 3) {
    snprintf(err, errlen, "kn_cuda_dev_binary: op must be 0 to 3 (add, sub, mul, div), got %d", op);
    return -1;
  }
  for (size_t i = 0; i < n; i++)
    y[i] = op == 0 ? a[i] + b[i] : op == 1 ? a[i] - b[i] : op == 2 ? a[i] * b[i] : a[i] / b[i];
  return 0;
}

int kiln_cuda_module_dev_unary(const float *x, float *y, size_t n, int op, float alpha, char *err,
                               size_t errlen) {
  if (op < 0 || op > 7) {
    snprintf(err, errlen, "kn_cuda_dev_unary: op must be 0 to 7, got %d", op);
    return -1;
  }
  for (size_t i = 0; i < n; i++) y[i] = ref_unary(op, x[i], alpha);
  return 0;
}

int kiln_cuda_module_dev_unary_grad(const float *dy, const float *x, const float *y, float *dx,
                                    size_t n, int op, float alpha, char *err, size_t errlen) {
  if (op < 0 || op > 7) {
    snprintf(err, errlen, "kn_cuda_dev_unary_grad: op must be 0 to 7, got %d", op);
    return -1;
  }
  for (size_t i = 0; i < n; i++) dx[i] = ref_unary_grad(op, dy[i], x[i], y[i], alpha);
  return 0;
}

int kiln_cuda_module_dev_reduce(const float *x, float *y, size_t outer, size_t len, size_t inner,
                                int kind, char *err, size_t errlen) {
  if (kind < 0 || kind > 2 || len == 0) {
    snprintf(err, errlen, "kn_cuda_dev_reduce: kind must be 0 to 2 and len > 0, got %d, %zu", kind,
             len);
    return -1;
  }
  ref_reduce(x, y, outer, len, inner, kind);
  return 0;
}

int kiln_cuda_module_dev_reduce_grad(const float *dy, const float *x, const float *y, float *dx,
                                     size_t outer, size_t len, size_t inner, int kind, char *err,
                                     size_t errlen) {
  if (kind < 0 || kind > 2 || len == 0) {
    snprintf(err, errlen, "kn_cuda_dev_reduce_grad: kind must be 0 to 2 and len > 0, got %d, %zu",
             kind, len);
    return -1;
  }
  ref_reduce_grad(dy, x, y, dx, outer, len, inner, kind);
  return 0;
}

int kiln_cuda_module_dev_bn_stats(const float *x, float *moving_mean, float *moving_var,
                                  float *stats, size_t rows, size_t C, float momentum,
                                  float epsilon, int training, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  ref_bn_stats(x, moving_mean, moving_var, stats, rows, C, momentum, epsilon, training);
  return 0;
}

int kiln_cuda_module_dev_bn_apply(const float *x, const float *stats, const float *gamma,
                                  const float *beta, float *y, size_t rows, size_t C, char *err,
                                  size_t errlen) {
  (void)err;
  (void)errlen;
  ref_bn_apply(x, stats, gamma, beta, y, rows, C);
  return 0;
}

int kiln_cuda_module_dev_bn_grad(const float *dy, const float *x, const float *stats,
                                 const float *gamma, float *dx, float *dgamma, float *dbeta,
                                 size_t rows, size_t C, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  ref_bn_grad(dy, x, stats, gamma, dx, dgamma, dbeta, rows, C);
  return 0;
}

int kiln_cuda_module_dev_dropout_mask(float *m, size_t n, uint64_t seed, uint64_t step,
                                      uint64_t first, uint32_t threshold, float keep, char *err,
                                      size_t errlen) {
  (void)err;
  (void)errlen;
  for (size_t i = 0; i < n; i++)
    m[i] = (kn_philox_word(seed, step, first + i) >> 8) >= threshold ? keep : 0.0f;
  return 0;
}

int kiln_cuda_module_dev_dwconv(const kn_cuda_windows *w, int M, int mode, const float *a,
                                const float *b, float *out, char *err, size_t errlen) {
  if (!windows_ok(w, "kn_cuda_dev_dwconv", err, errlen)) return -1;
  if (M <= 0 || mode < 0 || mode > 2) {
    snprintf(err, errlen, "kn_cuda_dev_dwconv: multiplier > 0 and mode 0 to 2, got %d and %d", M,
             mode);
    return -1;
  }
  ref_dwconv(w, M, mode, a, b, out);
  return 0;
}

int kiln_cuda_module_dev_copy_rows(float *dst, size_t dst_pitch, const float *src, size_t src_pitch,
                                   size_t rows, size_t len, char *err, size_t errlen) {
  if (len > dst_pitch || len > src_pitch) {
    snprintf(err, errlen, "kn_cuda_dev_copy_rows: rows of %zu floats in pitches of %zu and %zu",
             len, dst_pitch, src_pitch);
    return -1;
  }
  for (size_t r = 0; r < rows; r++) memmove(dst + r * dst_pitch, src + r * src_pitch, len * 4);
  return 0;
}

int kiln_cuda_module_dev_fill(float *y, size_t n, float value, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  for (size_t i = 0; i < n; i++) y[i] = value;
  return 0;
}

int kiln_cuda_module_dev_softmax_xent(const float *logits, const int32_t *labels, float *loss,
                                      size_t rows, size_t cols, char *err, size_t errlen) {
  if (rows == 0 || cols == 0) {
    snprintf(err, errlen, "kn_cuda_dev_softmax_xent: needs rows and classes, got %zu x %zu", rows,
             cols);
    return -1;
  }
  loss[0] = ref_softmax_xent(logits, labels, rows, cols);
  return 0;
}

int kiln_cuda_module_dev_softmax_xent_grad(const float *logits, const int32_t *labels,
                                           const float *dloss, float *dx, size_t rows, size_t cols,
                                           char *err, size_t errlen) {
  if (rows == 0 || cols == 0) {
    snprintf(err, errlen, "kn_cuda_dev_softmax_xent_grad: needs rows and classes, got %zu x %zu",
             rows, cols);
    return -1;
  }
  ref_softmax_xent_grad(logits, labels, dloss[0], dx, rows, cols);
  return 0;
}

/* The losses' checks, as the module's. */
static int loss_shape_ok(const char *what, size_t rows, size_t cols, char *err, size_t errlen) {
  if (rows && cols) return 1;
  snprintf(err, errlen, "%s: needs rows and classes, got %zu x %zu", what, rows, cols);
  return 0;
}

int kiln_cuda_module_dev_xent_dense(const float *logits, const float *probs, float *loss,
                                    size_t rows, size_t cols, char *err, size_t errlen) {
  if (!loss_shape_ok("kn_cuda_dev_xent_dense", rows, cols, err, errlen)) return -1;
  loss[0] = ref_xent_dense(logits, probs, rows, cols);
  return 0;
}

int kiln_cuda_module_dev_xent_dense_grad(const float *logits, const float *probs,
                                         const float *dloss, float *dx, size_t rows, size_t cols,
                                         char *err, size_t errlen) {
  if (!loss_shape_ok("kn_cuda_dev_xent_dense_grad", rows, cols, err, errlen)) return -1;
  ref_xent_dense_grad(logits, probs, dloss[0], dx, rows, cols);
  return 0;
}

int kiln_cuda_module_dev_bce_logits(const float *x, const float *t, float *loss, size_t n,
                                    char *err, size_t errlen) {
  if (n == 0) {
    snprintf(err, errlen, "kn_cuda_dev_bce_logits: needs values, got none");
    return -1;
  }
  loss[0] = ref_bce_logits(x, t, n);
  return 0;
}

int kiln_cuda_module_dev_bce_logits_grad(const float *x, const float *t, const float *dloss,
                                         float *dx, size_t n, char *err, size_t errlen) {
  if (n == 0) {
    snprintf(err, errlen, "kn_cuda_dev_bce_logits_grad: needs values, got none");
    return -1;
  }
  ref_bce_logits_grad(x, t, dloss[0], dx, n);
  return 0;
}

int kiln_cuda_module_dev_cast(const void *x, void *y, size_t n, int mode, char *err,
                              size_t errlen) {
  if (mode < KN_CUDA_CAST_TO_BF16 || mode > KN_CUDA_CAST_ROUND_F16) {
    snprintf(err, errlen, "kn_cuda_dev_cast: mode must be 0 to 5, got %d", mode);
    return -1;
  }
  ref_cast(x, y, n, mode);
  return 0;
}

int kiln_cuda_module_dev_relu(const float *x, float *y, size_t n, char *err, size_t errlen) {
  return kiln_cuda_module_relu(x, y, n, err, errlen);
}

int kiln_cuda_module_dev_relu_grad(const float *dy, const float *y, float *dx, size_t n, char *err,
                                   size_t errlen) {
  return kiln_cuda_module_relu_grad(dy, y, dx, n, err, errlen);
}

int kiln_cuda_module_dev_bias_add(const float *x, const float *b, float *y, size_t rows,
                                  size_t cols, int relu, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  for (size_t r = 0; r < rows; r++)
    for (size_t c = 0; c < cols; c++) {
      const float v = x[r * cols + c] + b[c];
      y[r * cols + c] = relu && v < 0.0f ? 0.0f : v;
    }
  return 0;
}

int kiln_cuda_module_dev_reduce_rows(const float *x, float *out, size_t rows, size_t cols,
                                     char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  for (size_t c = 0; c < cols; c++) out[c] = 0.0f;
  for (size_t r = 0; r < rows; r++)
    for (size_t c = 0; c < cols; c++) out[c] += x[r * cols + c];
  return 0;
}

int kiln_cuda_module_dev_optimizer_step(const kn_step_consts *c, float *p, const float *g, float *m,
                                        float *v, size_t n, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  for (size_t i = 0; i < n; i++) kn_rule_apply(c, p, g, m, v, i);
  return 0;
}

int kiln_cuda_module_dev_copy(void *dst, const void *src, size_t bytes, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  if (bytes && dst != src) memmove(dst, src, bytes);
  return 0;
}

/* Bytes copied in and out since the module was opened (the tests read
 * them: values kept on a device are not copied between its kernels). */
static _Atomic size_t copied_in, copied_out;

size_t kiln_host_gpus_copied_in(void) {
  return copied_in;
}

size_t kiln_host_gpus_copied_out(void) {
  return copied_out;
}

int kiln_cuda_module_alloc(int device, size_t bytes, void **out, char *err, size_t errlen) {
  *out = NULL;
  if (check_device(device, err, errlen)) return -1;
  if (!(*out = malloc(bytes ? bytes : 1))) {
    snprintf(err, errlen, "host stand-in %d: out of memory for %zu bytes", device, bytes);
    return -1;
  }
  return 0;
}

void kiln_cuda_module_free(int device, void *p) {
  (void)device;
  free(p);
}

int kiln_cuda_module_copy_in(int device, void *dst, const void *host, size_t bytes, char *err,
                             size_t errlen) {
  if (check_device(device, err, errlen)) return -1;
  if (bytes) memcpy(dst, host, bytes);
  copied_in += bytes;
  return 0;
}

int kiln_cuda_module_copy_out(int device, void *host, const void *src, size_t bytes, char *err,
                              size_t errlen) {
  if (check_device(device, err, errlen)) return -1;
  if (bytes) memcpy(host, src, bytes);
  copied_out += bytes;
  return 0;
}

/* Host memory "pinned" for copies: nothing to do on the host, but what is
 * pinned is counted, so a test can see a graph pin its buffers and unpin
 * them before it frees them (kiln_host_gpus_pinned_bytes). */
enum { MAX_PINNED = 64 };
static struct {
  void *p;
  size_t bytes;
} pinned[MAX_PINNED];
static pthread_mutex_t pinned_lock = PTHREAD_MUTEX_INITIALIZER;

int kiln_cuda_module_host_register(void *p, size_t bytes, char *err, size_t errlen) {
  if (!p || bytes == 0) return 0;
  pthread_mutex_lock(&pinned_lock);
  int slot = -1;
  for (int i = 0; i < MAX_PINNED; i++) {
    if (pinned[i].p == p) { /* as cudaHostRegister: a range is pinned once */
      pthread_mutex_unlock(&pinned_lock);
      snprintf(err, errlen, "host stand-in: %p is pinned already", p);
      return -1;
    }
    if (!pinned[i].p && slot < 0) slot = i;
  }
  if (slot >= 0) pinned[slot].p = p, pinned[slot].bytes = bytes;
  pthread_mutex_unlock(&pinned_lock);
  if (slot < 0) snprintf(err, errlen, "host stand-in: more than %d pinned ranges", MAX_PINNED);
  return slot < 0 ? -1 : 0;
}

void kiln_cuda_module_host_unregister(void *p) {
  pthread_mutex_lock(&pinned_lock);
  for (int i = 0; i < MAX_PINNED; i++)
    if (p && pinned[i].p == p) pinned[i].p = NULL, pinned[i].bytes = 0;
  pthread_mutex_unlock(&pinned_lock);
}

/* What is pinned now, in bytes (the tests read it). */
size_t kiln_host_gpus_pinned_bytes(void) {
  size_t total = 0;
  pthread_mutex_lock(&pinned_lock);
  for (int i = 0; i < MAX_PINNED; i++) total += pinned[i].bytes;
  pthread_mutex_unlock(&pinned_lock);
  return total;
}

/* ------------------------------------------------------------- NCCL -- */

/* The ranks that opened one id: they meet at barriers, and read each
 * other's staging buffers between two of them. */
typedef struct group {
  unsigned char id[KN_NCCL_ID_BYTES];
  int nranks, joined, users;
  int waiting;         /* ranks at the current barrier */
  uint64_t generation; /* barriers passed */
  const float *staging[MAX_RANKS];
  struct group *next;
} group;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static group *groups;

struct kn_nccl {
  group *g;
  int rank, device;
  double timeout_s;
  float *staging;
  size_t capacity;
  struct range {
    float *host;
    size_t at, n;
  } started[256];
  int n_started;
};

static struct timespec deadline_after(double seconds) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  const double t = (double)ts.tv_nsec * 1e-9 + seconds;
  ts.tv_sec += (time_t)t;
  ts.tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
  return ts;
}

static int gave_up(const kn_nccl *c, const char *what, char *err, size_t errlen) {
  snprintf(err, errlen,
           "NCCL rank %d of %d on cuda:%d: %s waited more than %g s for the other ranks; one of "
           "them died or hangs",
           c->rank, c->g->nranks, c->device, what, c->timeout_s);
  return -1;
}

/* Every rank of c's group here, or the timeout; with lock held. */
static int barrier(kn_nccl *c, const char *what, char *err, size_t errlen) {
  group *g = c->g;
  const uint64_t gen = g->generation;
  if (++g->waiting == g->nranks) {
    g->waiting = 0;
    g->generation++;
    pthread_cond_broadcast(&changed);
    return 0;
  }
  const struct timespec until = deadline_after(c->timeout_s);
  while (g->generation == gen) {
    if (pthread_cond_timedwait(&changed, &lock, &until) == ETIMEDOUT && g->generation == gen) {
      g->waiting--;
      return gave_up(c, what, err, errlen);
    }
  }
  return 0;
}

int kiln_cuda_module_nccl_unique_id(unsigned char *id, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  static uint64_t made;
  pthread_mutex_lock(&lock);
  const uint64_t n = ++made;
  pthread_mutex_unlock(&lock);
  memset(id, 0, KN_NCCL_ID_BYTES);
  const uint64_t pid = (uint64_t)getpid();
  memcpy(id, &pid, sizeof pid);
  memcpy(id + sizeof pid, &n, sizeof n);
  return 0;
}

void kiln_cuda_module_nccl_close(kn_nccl *c) {
  if (!c) return;
  pthread_mutex_lock(&lock);
  if (--c->g->users == 0) {
    for (group **p = &groups; *p; p = &(*p)->next) {
      if (*p == c->g) {
        *p = c->g->next;
        break;
      }
    }
    free(c->g);
  }
  pthread_mutex_unlock(&lock);
  free(c->staging);
  free(c);
}

int kiln_cuda_module_nccl_open(const unsigned char *id, int nranks, int rank, int device,
                               size_t capacity, double timeout_s, kn_nccl **out, char *err,
                               size_t errlen) {
  *out = NULL;
  if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks || capacity == 0) {
    snprintf(err, errlen, "kn_nccl_open: rank %d of %d ranks, %zu floats: out of range", rank,
             nranks, capacity);
    return -1;
  }
  if (check_device(device, err, errlen)) return -1;
  const char *absent = getenv("KILN_HOST_GPUS_ABSENT_RANK");
  if (absent && *absent && atoi(absent) == rank) {
    snprintf(err, errlen, "host stand-in: rank %d does not join (KILN_HOST_GPUS_ABSENT_RANK)",
             rank);
    return -1;
  }
  kn_nccl *c = calloc(1, sizeof *c);
  float *staging = malloc(capacity * sizeof(float));
  if (!c || !staging) {
    free(c);
    free(staging);
    snprintf(err, errlen, "kn_nccl_open: out of memory");
    return -1;
  }
  *c = (kn_nccl){.rank = rank,
                 .device = device,
                 .timeout_s = timeout_s > 0 ? timeout_s : 300.0,
                 .staging = staging,
                 .capacity = capacity};
  pthread_mutex_lock(&lock);
  group *g = groups;
  while (g && memcmp(g->id, id, KN_NCCL_ID_BYTES) != 0) g = g->next;
  if (!g && (g = calloc(1, sizeof *g)) != NULL) {
    memcpy(g->id, id, KN_NCCL_ID_BYTES);
    g->nranks = nranks;
    g->next = groups;
    groups = g;
  }
  if (!g || g->nranks != nranks) {
    pthread_mutex_unlock(&lock);
    snprintf(err, errlen, "host stand-in: communicator of %d ranks opened as one of %d",
             g ? g->nranks : 0, nranks);
    free(staging);
    free(c);
    return -1;
  }
  c->g = g;
  g->users++;
  g->joined++;
  pthread_cond_broadcast(&changed);
  const struct timespec until = deadline_after(c->timeout_s);
  int rc = 0;
  while (g->joined < nranks && rc == 0)
    if (pthread_cond_timedwait(&changed, &lock, &until) == ETIMEDOUT && g->joined < nranks)
      rc = gave_up(c, "joining the communicator", err, errlen);
  pthread_mutex_unlock(&lock);
  if (rc) {
    kiln_cuda_module_nccl_close(c);
    return -1;
  }
  *out = c;
  return 0;
}

int kiln_cuda_module_nccl_start(kn_nccl *c, float *host, size_t at, size_t n, char *err,
                                size_t errlen) {
  if (at > c->capacity || n > c->capacity - at) {
    snprintf(err, errlen, "kn_nccl_start: floats [%zu, %zu) are past the %zu staged", at, at + n,
             c->capacity);
    return -1;
  }
  if (n == 0) return 0;
  if (c->n_started == (int)(sizeof c->started / sizeof c->started[0])) {
    snprintf(err, errlen, "host stand-in: more than %d all-reduces in flight", c->n_started);
    return -1;
  }
  memcpy(c->staging + at, host, n * sizeof(float));
  c->started[c->n_started++] = (struct range){host, at, n};
  return 0;
}

int kiln_cuda_module_nccl_wait(kn_nccl *c, char *err, size_t errlen) {
  group *g = c->g;
  pthread_mutex_lock(&lock);
  g->staging[c->rank] = c->staging;
  int rc = barrier(c, "an all-reduce", err, errlen); /* every rank's floats staged */
  pthread_mutex_unlock(&lock);
  for (int k = 0; rc == 0 && k < c->n_started; k++) {
    const struct range *r = &c->started[k];
    for (size_t j = 0; j < r->n; j++) {
      float sum = 0.0f;
      for (int q = 0; q < g->nranks; q++) sum += g->staging[q][r->at + j];
      r->host[j] = sum;
    }
  }
  pthread_mutex_lock(&lock);
  if (rc == 0) rc = barrier(c, "an all-reduce", err, errlen); /* all read before any restage */
  pthread_mutex_unlock(&lock);
  c->n_started = 0;
  return rc;
}
