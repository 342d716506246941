/* cuda.cu — the CUDA backend: device discovery and selection, device
 * memory and copies, GEMMs through cuBLAS (float32, or on tensor cores
 * with the operands rounded to TF32 or bfloat16), and own kernels for relu
 * and its gradient, a bias added to rows, the sum of rows (a bias's
 * gradient), im2col and col2im, max and average pooling and their
 * gradients, mixed_bfloat16's casts and the optimizers' steps
 * (optim_rules.h, shared with the CPU). Built only with KILN_CUDA=ON; C
 * callers see the extern "C" face in cuda.h. The dev_ kernels work on
 * device buffers and only queue work on the default stream: the graph
 * keeps the values of nodes placed on cuda:N on that device between nodes
 * (residency.c), and a copy out waits for them. The others take host
 * buffers and copy in, compute and copy out (tests, probes). The cuBLAS
 * handle and staging memory they use are the calling thread's, kept
 * between calls. */
#include "cuda_module.h"

#include "../loss_rules.h"
#include "../narrow.h"
#include "../philox.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace {

void set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

void set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* ".../engine/cuda/cuda.cu" -> "cuda.cu": build systems pass absolute paths. */
const char *base_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

} // namespace

/* Check macros for functions that own resources: on failure they fill the
 * function's err/errlen with file:line, the call and CUDA's own words, then
 * jump to its cleanup label. cudaGetLastError() clears the failed call's
 * error so it does not resurface at a later, unrelated check. */
#define KN_CUDA_CHECK(call)                                                                        \
  do {                                                                                             \
    cudaError_t kn_status_ = (call);                                                               \
    if (kn_status_ != cudaSuccess) {                                                               \
      set_err(err, errlen, "%s:%d: %s failed: %s (%s)", base_name(__FILE__), __LINE__, #call,      \
              cudaGetErrorString(kn_status_), cudaGetErrorName(kn_status_));                       \
      (void)cudaGetLastError();                                                                    \
      goto cleanup;                                                                                \
    }                                                                                              \
  } while (0)

#define KN_CUBLAS_CHECK(call)                                                                      \
  do {                                                                                             \
    cublasStatus_t kn_status_ = (call);                                                            \
    if (kn_status_ != CUBLAS_STATUS_SUCCESS) {                                                     \
      set_err(err, errlen, "%s:%d: %s failed: %s (%s)", base_name(__FILE__), __LINE__, #call,      \
              cublasGetStatusString(kn_status_), cublasGetStatusName(kn_status_));                 \
      (void)cudaGetLastError();                                                                    \
      goto cleanup;                                                                                \
    }                                                                                              \
  } while (0)

enum { RELU_THREADS = 256, RELU_BLOCKS_PER_SM = 32, MAX_DEVICES = 64 };

/* What a thread keeps on each device between kernels: a cuBLAS handle
 * (creating one costs milliseconds) and device memory for operands, grown
 * to the largest call so far. A graph's nodes run on the thread that runs
 * the graph, so replicas in threads never share one; thread exit frees
 * them. */
struct workspace {
  int made;
  cublasHandle_t handle;
  float *buf;
  size_t floats;
};

struct thread_workspaces {
  workspace on[MAX_DEVICES];
  ~thread_workspaces() {
    for (int d = 0; d < MAX_DEVICES; d++) {
      if (!on[d].made) continue;
      cudaSetDevice(d);
      if (on[d].handle) cublasDestroy(on[d].handle);
      if (on[d].buf) cudaFreeAsync(on[d].buf, 0);
    }
  }
};

static thread_local thread_workspaces workspaces;

/* The current device's workspace with room for `floats` floats, and a
 * cuBLAS handle if `blas`. */
static workspace *workspace_for(size_t floats, int blas, char *err, size_t errlen) {
  workspace *w = nullptr, *out = nullptr;
  int device = 0;
  KN_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= MAX_DEVICES) {
    set_err(err, errlen, "CUDA device %d: kiln keeps workspaces for devices 0 to %d", device,
            MAX_DEVICES - 1);
    return nullptr;
  }
  w = &workspaces.on[device];
  w->made = 1;
  if (blas && !w->handle) KN_CUBLAS_CHECK(cublasCreate(&w->handle));
  if (floats > w->floats) {
    /* Stream-ordered on the default stream: cudaFree would wait for the
     * whole device, NCCL all-reduces of other replicas in flight included
     * (and for ever, if a peer died). */
    if (w->buf) KN_CUDA_CHECK(cudaFreeAsync(w->buf, 0));
    w->buf = nullptr;
    w->floats = 0;
    KN_CUDA_CHECK(cudaMallocAsync((void **)&w->buf, floats * sizeof(float), 0));
    w->floats = floats;
  }
  out = w;
cleanup:
  return out;
}

/* y = relu(x) over n elements, grid-stride so any grid covers any n.
 * `v < 0 ? 0 : v` rather than fmaxf: NaN passes through, as in PyTorch,
 * so a diverging run shows NaN instead of hiding it behind zeros. */
static __global__ void relu_kernel(const float *x, float *y, size_t n) {
  size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float v = x[i];
    y[i] = v < 0.0f ? 0.0f : v;
  }
}

/* dy masked where y <= 0 only, as PyTorch's threshold_backward and the
 * CPU kernels (KN_RELU_PASSES): a NaN y passes dy. */
static __global__ void relu_grad_kernel(const float *dy, const float *y, float *dx, size_t n) {
  size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    dx[i] = y[i] <= 0.0f ? 0.0f : dy[i];
}

/* y = x + b[column], relu after where asked; grid-stride. */
static __global__ void bias_add_kernel(const float *x, const float *b, float *y, size_t rows,
                                       size_t cols, int relu) {
  const size_t n = rows * cols, stride = (size_t)blockDim.x * gridDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = x[i] + b[i % cols];
    y[i] = relu && v < 0.0f ? 0.0f : v;
  }
}

/* out[c] = sum of x[r][c] over the rows, one thread a column (neighbouring
 * threads read neighbouring floats of each row), rows in order. */
static __global__ void reduce_rows_kernel(const float *x, float *out, size_t rows, size_t cols) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += stride) {
    float sum = 0.0f;
    for (size_t r = 0; r < rows; r++) sum += x[r * cols + c];
    out[c] = sum;
  }
}

/* One optimizer step, element i under c's rule (optim_rules.h, the CPU's
 * rule); grid-stride. */
static __global__ void optimizer_step_kernel(kn_step_consts c, float *p, const float *g, float *m,
                                             float *v, size_t n) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    kn_rule_apply(&c, p, g, m, v, i);
}

/* ---- convolution and pooling windows (NHWC), as cpu_kernels_conv.inc ---- */

/* im2col: element i of cols, row (b, oh, ow), column (ki, kj, ch). */
static __global__ void im2col_kernel(kn_cuda_windows w, const float *x, float *cols, size_t n) {
  const size_t stride = (size_t)blockDim.x * gridDim.x, width = (size_t)w.kh * w.kw * w.c;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const size_t row = i / width, col = i % width;
    const int ch = (int)(col % w.c), cell = (int)(col / w.c), ki = cell / w.kw, kj = cell % w.kw;
    const int ow = (int)(row % w.ow), oh = (int)(row / w.ow % w.oh), b = (int)(row / w.ow / w.oh);
    const int ih = oh * w.sh - w.pad_top + ki * w.dh, iw = ow * w.sw - w.pad_left + kj * w.dw;
    cols[i] = ih >= 0 && ih < w.h && iw >= 0 && iw < w.w
                  ? x[(((size_t)b * w.h + ih) * w.w + iw) * w.c + ch]
                  : 0.0f;
  }
}

/* The windows along one axis that read cell `at` (o in [lo, hi]) and the
 * kernel tap each reads it with: o * s - pad + k * d == at. */
static __device__ void covering(int at, int pad, int s, int d, int taps, int outs, int *lo,
                                int *hi) {
  const int far = at + pad - (taps - 1) * d; /* o * s >= far */
  *lo = far <= 0 ? 0 : (far + s - 1) / s;
  *hi = (at + pad) / s;
  if (*hi > outs - 1) *hi = outs - 1;
}

/* Calls f(oh, ow, ki, kj) for each window (oh, ow) and tap (ki, kj) that
 * reads input cell (ih, iw), windows in row-major order: the order in which
 * the CPU's scatters add into that cell. */
template <typename F>
static __device__ void each_reader(const kn_cuda_windows &w, int ih, int iw, F f) {
  int oh0, oh1, ow0, ow1;
  covering(ih, w.pad_top, w.sh, w.dh, w.kh, w.oh, &oh0, &oh1);
  covering(iw, w.pad_left, w.sw, w.dw, w.kw, w.ow, &ow0, &ow1);
  for (int oh = oh0; oh <= oh1; oh++) {
    const int th = ih + w.pad_top - oh * w.sh;
    if (th < 0 || th % w.dh || th / w.dh >= w.kh) continue;
    for (int ow = ow0; ow <= ow1; ow++) {
      const int tw = iw + w.pad_left - ow * w.sw;
      if (tw < 0 || tw % w.dw || tw / w.dw >= w.kw) continue;
      f(oh, ow, th / w.dh, tw / w.dw);
    }
  }
}

/* col2im: element i of dx, (b, ih, iw, ch), gathered from the windows
 * that read it, in the order the CPU's scatter adds them (oh, then ow). */
static __global__ void col2im_kernel(kn_cuda_windows w, const float *cols, float *dx, size_t n) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int ch = (int)(i % w.c), iw = (int)(i / w.c % w.w), ih = (int)(i / w.c / w.w % w.h);
    const size_t b = i / w.c / w.w / w.h;
    float sum = 0.0f;
    each_reader(w, ih, iw, [&](int oh, int ow, int ki, int kj) {
      const size_t row = ((b * w.oh + oh) * w.ow + ow) * (size_t)(w.kh * w.kw * w.c);
      sum += cols[row + ((size_t)ki * w.kw + kj) * w.c + ch];
    });
    dx[i] = sum;
  }
}

/* One pooling window's cells inside the image: rows [*h0, *h1), columns
 * [*w0, *w1). */
static __device__ void window_cells(const kn_cuda_windows &w, int oh, int ow, int *h0, int *h1,
                                    int *w0, int *w1) {
  const int hs = oh * w.sh - w.pad_top, ws = ow * w.sw - w.pad_left;
  *h0 = hs < 0 ? 0 : hs;
  *h1 = hs + w.kh > w.h ? w.h : hs + w.kh;
  *w0 = ws < 0 ? 0 : ws;
  *w1 = ws + w.kw > w.w ? w.w : ws + w.kw;
}

/* NaN's rules of the CPU (graph_internal.h's KN_MAX_NAN, KN_IS_MAX_CELL). */
static __device__ float max_nan(float m, float v) {
  return (v > m || v != v) ? v : m;
}
static __device__ bool is_max_cell(float x, float m) {
  return x == m || x != x;
}

/* pool: element i of y, (b, oh, ow, ch). */
static __global__ void pool_kernel(kn_cuda_windows w, const float *x, float *y, size_t n) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int ch = (int)(i % w.c), ow = (int)(i / w.c % w.ow), oh = (int)(i / w.c / w.ow % w.oh);
    const size_t b = i / w.c / w.ow / w.oh;
    int h0, h1, w0, w1;
    window_cells(w, oh, ow, &h0, &h1, &w0, &w1);
    const float *img = x + b * w.h * w.w * w.c + ch;
    float acc = w.max ? img[((size_t)h0 * w.w + w0) * w.c] : 0.0f;
    for (int ih = h0; ih < h1; ih++)
      for (int iw = w0; iw < w1; iw++) {
        const float v = img[((size_t)ih * w.w + iw) * w.c];
        acc = w.max ? max_nan(acc, v) : acc + v;
      }
    y[i] = w.max ? acc : acc * (1.0f / (float)((h1 - h0) * (w1 - w0)));
  }
}

/* pool_grad: element i of dx, (b, ih, iw, ch), gathered from the windows
 * that hold it in the CPU's order (oh, then ow): a max window's dy if this
 * is its first cell equal to its max, a mean window's dy over its size. */
static __global__ void pool_grad_kernel(kn_cuda_windows w, const float *dy, const float *x,
                                        const float *y, float *dx, size_t n) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int ch = (int)(i % w.c), iw = (int)(i / w.c % w.w), ih = (int)(i / w.c / w.w % w.h);
    const size_t b = i / w.c / w.w / w.h;
    int oh0, oh1, ow0, ow1;
    covering(ih, w.pad_top, w.sh, 1, w.kh, w.oh, &oh0, &oh1);
    covering(iw, w.pad_left, w.sw, 1, w.kw, w.ow, &ow0, &ow1);
    const float *img = x + b * w.h * w.w * w.c + ch;
    float sum = 0.0f;
    for (int oh = oh0; oh <= oh1; oh++)
      for (int ow = ow0; ow <= ow1; ow++) {
        const size_t o = ((b * w.oh + oh) * w.ow + ow) * w.c + ch;
        int h0, h1, w0, w1;
        window_cells(w, oh, ow, &h0, &h1, &w0, &w1);
        if (w.max) {
          const float m = y[o];
          bool first = is_max_cell(img[((size_t)ih * w.w + iw) * w.c], m);
          /* no earlier cell of the window (row-major) is a max */
          for (int rh = h0; first && rh <= ih; rh++)
            for (int rw = w0; first && rw < (rh == ih ? iw : w1); rw++)
              first = !is_max_cell(img[((size_t)rh * w.w + rw) * w.c], m);
          sum += first ? dy[o] : 0.0f;
        } else {
          sum += dy[o] * (1.0f / (float)((h1 - h0) * (w1 - w0)));
        }
      }
    dx[i] = sum;
  }
}

/* ---- mixed precision's casts, bit for bit as the CPU's (narrow.h) ---- */
static __global__ void cast_kernel(const void *x, void *y, size_t n, int mode) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    kn_narrow_cast_at(x, y, i, mode);
}

/* y = a op b, one element each, IEEE as the CPU's loops. */
static __global__ void binary_kernel(const float *a, const float *b, float *y, size_t n, int op) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = a[i], z = b[i];
    y[i] = op == 0 ? x + z : op == 1 ? x - z : op == 2 ? x * z : x / z;
  }
}

/* The dropout mask: the CPU's Philox draw for each element (philox.h). */
static __global__ void dropout_mask_kernel(float *m, size_t n, uint64_t seed, uint64_t step,
                                           uint64_t first, uint32_t threshold, float keep) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    m[i] = (kn_philox_word(seed, step, first + i) >> 8) >= threshold ? keep : 0.0f;
}

/* ---- depthwise convolution (NHWC; weights (kh, kw, c, M)) ---- */

/* y (b, oh, ow, o): the taps inside the image, in (ki, kj) order. */
static __global__ void dw_forward_kernel(kn_cuda_windows w, int M, const float *x, const float *k,
                                         float *y, size_t n) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  const int CM = w.c * M;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int o = (int)(i % CM), ow = (int)(i / CM % w.ow), oh = (int)(i / CM / w.ow % w.oh);
    const size_t b = i / CM / w.ow / w.oh;
    const int c = o / M;
    float sum = 0.0f;
    for (int ki = 0; ki < w.kh; ki++) {
      const int ih = oh * w.sh - w.pad_top + ki * w.dh;
      if (ih < 0 || ih >= w.h) continue;
      for (int kj = 0; kj < w.kw; kj++) {
        const int iw = ow * w.sw - w.pad_left + kj * w.dw;
        if (iw < 0 || iw >= w.w) continue;
        sum += x[((b * w.h + ih) * w.w + iw) * w.c + c] * k[((size_t)ki * w.kw + kj) * CM + o];
      }
    }
    y[i] = sum;
  }
}

/* dx (b, ih, iw, c): each window and tap that read it, each multiplier. */
static __global__ void dw_dx_kernel(kn_cuda_windows w, int M, const float *dy, const float *k,
                                    float *dx, size_t n) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  const int CM = w.c * M;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int c = (int)(i % w.c), iw = (int)(i / w.c % w.w), ih = (int)(i / w.c / w.w % w.h);
    const size_t b = i / w.c / w.w / w.h;
    float sum = 0.0f;
    each_reader(w, ih, iw, [&](int oh, int ow, int ki, int kj) {
      const float *d = dy + ((b * w.oh + oh) * w.ow + ow) * CM + (size_t)c * M;
      const float *kk = k + ((size_t)ki * w.kw + kj) * CM + (size_t)c * M;
      for (int m = 0; m < M; m++) sum += d[m] * kk[m];
    });
    dx[i] = sum;
  }
}

/* The weights' gradient, part p of the batch's images: each weight (ki,
 * kj, o) summed in double over the part's windows into part[p][...]. */
static __global__ void dw_dw_parts(kn_cuda_windows w, int M, const float *dy, const float *x,
                                   int images_per_part, double *part, size_t weights) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  const int CM = w.c * M;
  const int b0 = (int)blockIdx.y * images_per_part;
  const int b1 = b0 + images_per_part < w.batch ? b0 + images_per_part : w.batch;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < weights; i += stride) {
    const int o = (int)(i % CM), kj = (int)(i / CM % w.kw), ki = (int)(i / CM / w.kw);
    const int c = o / M;
    double sum = 0.0;
    for (int b = b0; b < b1; b++)
      for (int oh = 0; oh < w.oh; oh++) {
        const int ih = oh * w.sh - w.pad_top + ki * w.dh;
        if (ih < 0 || ih >= w.h) continue;
        for (int ow = 0; ow < w.ow; ow++) {
          const int iw = ow * w.sw - w.pad_left + kj * w.dw;
          if (iw < 0 || iw >= w.w) continue;
          sum += (double)dy[(((size_t)b * w.oh + oh) * w.ow + ow) * CM + o] *
                 (double)x[(((size_t)b * w.h + ih) * w.w + iw) * w.c + c];
        }
      }
    part[(size_t)blockIdx.y * weights + i] = sum;
  }
}

static __global__ void dw_dw_finish(const double *part, int parts, float *dw, size_t weights) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < weights; i += stride) {
    double sum = 0.0;
    for (int p = 0; p < parts; p++) sum += part[(size_t)p * weights + i];
    dw[i] = (float)sum;
  }
}

/* ---- the loss: sparse softmax cross-entropy, as cpu_kernels.inc's ---- */

static __global__ void fill_kernel(float *y, size_t n, float value) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = value;
}

/* term[r] = logsumexp(row r) - row[label], in double. */
static __global__ void xent_rows(const float *x, const int32_t *labels, size_t cols, double *term,
                                 size_t rows) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += stride)
    term[r] = kn_loss_xent_term(x + r * cols, labels[r], cols);
}

/* loss = the mean of the terms, added in row order (one thread). */
static __global__ void xent_mean(const double *term, float *loss, size_t rows) {
  double total = 0.0;
  for (size_t r = 0; r < rows; r++) total += term[r];
  loss[0] = (float)(total / (double)rows);
}

/* dx's row r: its softmax, less 1 at its label, times dloss / rows. */
static __global__ void xent_grad_rows(const float *x, const int32_t *labels, const float *dloss,
                                      float *dx, size_t rows, size_t cols) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  const float scale = dloss[0] / (float)rows;
  for (size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += stride)
    kn_loss_xent_grad(x + r * cols, labels[r], scale, dx + r * cols, cols);
}

/* term[r] = p_r . (logsumexp(row r) - row r), in double. */
static __global__ void xent_dense_rows(const float *x, const float *p, size_t cols, double *term,
                                       size_t rows) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += stride)
    term[r] = kn_loss_xent_dense_term(x + r * cols, p + r * cols, cols);
}

/* dx's row r: (softmax(row) * sum(p_r) - p_r) * dloss / rows. */
static __global__ void xent_dense_grad_rows(const float *x, const float *p, const float *dloss,
                                            float *dx, size_t rows, size_t cols) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  const float scale = dloss[0] / (float)rows;
  for (size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += stride)
    kn_loss_xent_dense_grad(x + r * cols, p + r * cols, scale, dx + r * cols, cols);
}

/* term[i] = max(x, 0) - x t + log1p(exp(-|x|)), in double. */
static __global__ void bce_terms(const float *x, const float *t, double *term, size_t n) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    term[i] = kn_loss_bce_term(x[i], t[i]);
}

/* dx = (sigmoid(x) - t) * dloss / n (sigmoid as the activation's). */
static __global__ void bce_grad_kernel(const float *x, const float *t, const float *dloss,
                                       float *dx, size_t n) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  const float scale = dloss[0] / (float)n;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    dx[i] = kn_loss_bce_grad(x[i], t[i], scale);
}

/* ---- activations, as cpu_kernels.inc's unop and unop_grad ---- */
static __device__ float unop(int op, float x, float alpha) {
  switch (op) {
  case 0: return x > 0 ? x : alpha * x;
  case 1: return x > 0 ? x : alpha * (expf(x) - 1);
  case 2: return x * normcdff(x);
  case 3: { /* e^-|x| either way: never overflows */
    const float e = expf(-fabsf(x));
    return x >= 0 ? 1 / (1 + e) : e / (1 + e);
  }
  case 4: return tanhf(x);
  case 5: return alpha * x;
  case 6: return fabsf(x);
  default: return x * x;
  }
}

static __device__ float unop_grad(int op, float dy, float x, float y, float alpha) {
  switch (op) {
  case 0: return x > 0 ? dy : alpha * dy;
  case 1: return x > 0 ? dy : dy * (y + alpha);
  case 2: return dy * (normcdff(x) + x * (expf(-0.5f * x * x) * 0.39894228040143267794f));
  case 3: return dy * y * (1 - y);
  case 4: return dy * (1 - y * y);
  case 5: return dy * alpha;
  case 6: return x > 0 ? dy : (x < 0 ? -dy : 0);
  default: return dy * 2 * x;
  }
}

static __global__ void unary_kernel(const float *x, float *y, size_t n, int op, float alpha) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = unop(op, x[i], alpha);
}

static __global__ void unary_grad_kernel(const float *dy, const float *x, const float *y, float *dx,
                                         size_t n, int op, float alpha) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    dx[i] = unop_grad(op, dy[i], x[i], y[i], alpha);
}

/* ---- reductions over an axis, x as (outer, len, inner) ---- */

/* y[o, i]: the CPU's loop, in order, in float (a max: NaN wins). */
static __global__ void reduce_kernel(const float *x, float *y, size_t outer, size_t len,
                                     size_t inner, int kind) {
  const size_t stride = (size_t)blockDim.x * gridDim.x, n = outer * inner;
  for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride) {
    const size_t o = j / inner, i = j % inner;
    const float *p = x + o * len * inner + i;
    float acc = p[0];
    for (size_t k = 1; k < len; k++)
      acc = kind == 2 ? max_nan(acc, p[k * inner]) : acc + p[k * inner];
    y[j] = kind == 1 ? acc / (float)len : acc;
  }
}

/* dx[o, :, i] from dy[o, i]: spread (a mean's over len), or a max's to
 * its first maximum. */
static __global__ void reduce_grad_kernel(const float *dy, const float *x, const float *y,
                                          float *dx, size_t outer, size_t len, size_t inner,
                                          int kind) {
  const size_t stride = (size_t)blockDim.x * gridDim.x, n = outer * inner;
  for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride) {
    const size_t o = j / inner, i = j % inner, at = o * len * inner + i;
    const float d = dy[j], v = kind == 1 ? d / (float)len : d;
    bool taken = false;
    for (size_t k = 0; k < len; k++) {
      if (kind != 2) {
        dx[at + k * inner] = v;
        continue;
      }
      const bool hit = !taken && is_max_cell(x[at + k * inner], y[j]);
      dx[at + k * inner] = hit ? d : 0.0f;
      taken |= hit;
    }
  }
}

/* ---- batch norm over the last axis, x as (rows, C) ---- */

/* Each channel's two sums over rows, in double, in two stages with a fixed
 * order for the shape (the same bits on every run): blocks of BN_LANES
 * channels x BN_ROW_LANES row lanes, grid.y blocks of rows; each block
 * writes its part (the row lanes added in lane order) to part[y][2][C],
 * and bn_finish adds the parts in order. The terms: what 0, x - shift and
 * its square (shift: the channel's first value); what 1, dy and dy * xhat
 * (xhat = (x - mean) * inv in float, as the CPU forms it). */
enum { BN_LANES = 32, BN_ROW_LANES = 8, BN_MAX_PARTS = 64, BN_PART_ROWS = 2048 };

static __global__ void bn_partial_sums(int what, const float *x, const float *dy,
                                       const float *stats, size_t rows, size_t C,
                                       size_t rows_per_part, double *part) {
  __shared__ double s0[BN_ROW_LANES][BN_LANES], s1[BN_ROW_LANES][BN_LANES];
  const int lane = threadIdx.x % BN_LANES, row_lane = threadIdx.x / BN_LANES;
  const size_t c = (size_t)blockIdx.x * BN_LANES + lane;
  const size_t r0 = (size_t)blockIdx.y * rows_per_part;
  const size_t r1 = r0 + rows_per_part < rows ? r0 + rows_per_part : rows;
  double a0 = 0.0, a1 = 0.0;
  if (c < C) {
    const double shift = what == 0 ? (double)x[c] : 0.0;
    /* (beta's gradient alone reads no statistics: xhat 0) */
    const float mean = what == 1 && stats ? stats[c] : 0.0f;
    const float inv = what == 1 && stats ? stats[C + c] : 0.0f;
    for (size_t r = r0 + row_lane; r < r1; r += BN_ROW_LANES) {
      if (what == 0) {
        const double d = (double)x[r * C + c] - shift;
        a0 += d;
        a1 += d * d;
      } else {
        const float xh = stats ? (x[r * C + c] - mean) * inv : 0.0f;
        const double d = (double)dy[r * C + c];
        a0 += d;
        a1 += d * (double)xh;
      }
    }
  }
  s0[row_lane][lane] = a0;
  s1[row_lane][lane] = a1;
  __syncthreads();
  if (row_lane == 0 && c < C) {
    double t0 = 0.0, t1 = 0.0;
    for (int k = 0; k < BN_ROW_LANES; k++) {
      t0 += s0[k][lane];
      t1 += s1[k][lane];
    }
    part[((size_t)blockIdx.y * 2) * C + c] = t0;
    part[((size_t)blockIdx.y * 2 + 1) * C + c] = t1;
  }
}

/* Channel c's sums from the parts, then: (what 0) its batch statistics and
 * the moving ones moved towards them (momentum, unbiased variance), as
 * the CPU's bn_batch_stats; (what 1) beta's and gamma's gradients, and the
 * sums kept in sums[2][C] for bn_grad_x_kernel. */
static __global__ void bn_finish(int what, const float *x, size_t rows, size_t C, int parts,
                                 const double *part, float *stats, float *mm, float *mv,
                                 double momentum, double eps, float *dgamma, float *dbeta,
                                 double *sums) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x; c < C; c += stride) {
    double s = 0.0, s2 = 0.0;
    for (int p = 0; p < parts; p++) {
      s += part[((size_t)p * 2) * C + c];
      s2 += part[((size_t)p * 2 + 1) * C + c];
    }
    if (what == 1) {
      if (dbeta) dbeta[c] = (float)s;
      if (dgamma) dgamma[c] = (float)s2;
      if (sums) sums[c] = s, sums[C + c] = s2;
      continue;
    }
    const double R = (double)rows, shift = rows ? (double)x[c] : 0.0;
    const double sq0 = s2 - s * s / R, sq = sq0 > 0.0 ? sq0 : 0.0;
    const double mean = shift + s / R, var = sq / R, unbiased = R > 1 ? sq / (R - 1) : var;
    stats[c] = (float)mean;
    stats[C + c] = (float)(1.0 / sqrt(var + eps));
    mm[c] = (float)(momentum * (double)mm[c] + (1.0 - momentum) * mean);
    mv[c] = (float)(momentum * (double)mv[c] + (1.0 - momentum) * unbiased);
  }
}

/* Evaluation's statistics: the moving ones. */
static __global__ void bn_eval_stats(const float *mm, const float *mv, float *stats, size_t C,
                                     double eps) {
  const size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x; c < C; c += stride) {
    stats[c] = mm[c];
    stats[C + c] = (float)(1.0 / sqrt((double)mv[c] + eps));
  }
}

static __global__ void bn_apply_kernel(const float *x, const float *stats, const float *gamma,
                                       const float *beta, float *y, size_t rows, size_t C) {
  const size_t stride = (size_t)blockDim.x * gridDim.x, n = rows * C;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const size_t c = i % C;
    y[i] = (x[i] - stats[c]) * stats[C + c] * gamma[c] + beta[c];
  }
}

static __global__ void bn_grad_x_kernel(const float *dy, const float *x, const float *stats,
                                        const float *gamma, const double *sums, float *dx,
                                        size_t rows, size_t C) {
  const size_t stride = (size_t)blockDim.x * gridDim.x, n = rows * C;
  const double R = (double)rows;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const size_t c = i % C;
    const float xh = (x[i] - stats[c]) * stats[C + c];
    const double k = (double)stats[C + c] / R * gamma[c];
    dx[i] = (float)(k * (R * (double)dy[i] - sums[c] - (double)xh * sums[C + c]));
  }
}

/* Enough blocks of RELU_THREADS to fill every SM of the current device, no
 * more (the kernels' grid-stride loops do the rest). */
static int grid_for(size_t n, unsigned *blocks, char *err, size_t errlen) {
  /* each device's SM count, asked once: a launch is on every node's path */
  static std::atomic<int> sm_counts[MAX_DEVICES];
  int rc = -1, device = 0, sm_count = 0;
  size_t b = (n + RELU_THREADS - 1) / RELU_THREADS;
  KN_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= MAX_DEVICES) {
    set_err(err, errlen, "CUDA device %d: kiln launches on devices 0 to %d", device,
            MAX_DEVICES - 1);
    return -1;
  }
  if ((sm_count = sm_counts[device].load(std::memory_order_relaxed)) == 0) {
    KN_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
    sm_counts[device].store(sm_count, std::memory_order_relaxed);
  }
  if (b > (size_t)sm_count * RELU_BLOCKS_PER_SM) b = (size_t)sm_count * RELU_BLOCKS_PER_SM;
  *blocks = b > 0 ? (unsigned)b : 1u;
  rc = 0;
cleanup:
  return rc;
}

/* Queues kernel on enough blocks of RELU_THREADS for n elements (nothing
 * for none: its grid-stride loop does the rest) and reports a launch
 * error; faults in the queued work surface at the next copy out. */
template <typename... Params, typename... Args>
static int launch(void (*kernel)(Params...), size_t n, char *err, size_t errlen, Args... args) {
  unsigned blocks = 0;
  if (n == 0) return 0;
  if (grid_for(n, &blocks, err, errlen) != 0) return -1;
  kernel<<<blocks, RELU_THREADS>>>(args...);
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return 0;
  set_err(err, errlen, "%s: a kernel's launch failed: %s (%s)", base_name(__FILE__),
          cudaGetErrorString(status), cudaGetErrorName(status));
  return -1;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_device_count(int *count, char *err, size_t errlen) {
  if (!count) {
    set_err(err, errlen, "kn_cuda_device_count: count must not be NULL");
    return -1;
  }
  *count = 0;
  cudaError_t status = cudaGetDeviceCount(count);
  if (status == cudaSuccess) return 0;
  (void)cudaGetLastError();
  /* A machine without a GPU or without the driver simply has no devices. */
  if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver) {
    *count = 0;
    return 0;
  }
  *count = 0;
  set_err(err, errlen, "%s:%d: cudaGetDeviceCount failed: %s (%s)", base_name(__FILE__), __LINE__,
          cudaGetErrorString(status), cudaGetErrorName(status));
  return -1;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_device_name(int device, char *name, size_t len,
                                                           char *err, size_t errlen) {
  int rc = -1;
  int count = 0;
  cudaDeviceProp prop;
  if (!name || len == 0) {
    set_err(err, errlen, "kn_cuda_device_name: name must be a buffer of at least 1 byte");
    return -1;
  }
  name[0] = '\0';
  if (kiln_cuda_module_device_count(&count, err, errlen) != 0) return -1;
  if (device < 0 || device >= count) {
    set_err(err, errlen, "CUDA device %d does not exist: this machine has %d CUDA device%s", device,
            count, count == 1 ? "" : "s");
    return -1;
  }
  KN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  snprintf(name, len, "%s", prop.name);
  rc = 0;
cleanup:
  return rc;
}

/* c = op(a) op(b) on device buffers, row-major with tight leading
 * dimensions, queued on the default stream.
 *
 * cuBLAS is column-major, and a row-major (r, s) buffer read column-major
 * is its transpose. So the row-major C (m, n) is a column-major C^T (n, m)
 * and we ask cuBLAS for C^T = op(B)^T op(A)^T: b goes first, each operand
 * keeps its own transpose flag, m and n swap. Leading dimensions are the
 * row lengths of the buffers as stored. */
static int sgemm(cublasHandle_t handle, const float *d_a, const float *d_b, float *d_c, int m,
                 int n, int k, int trans_a, int trans_b, int math, char *err, size_t errlen) {
  int rc = -1;
  const float alpha = 1.0f, beta = 0.0f;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int lda = trans_a ? m : k, ldb = trans_b ? k : n;
  /* float32 in and out; the compute type says whether tensor cores may
   * round the operands (to TF32 or bfloat16) on the way in */
  const cublasComputeType_t compute = math == KN_CUDA_MATH_BF16   ? CUBLAS_COMPUTE_32F_FAST_16BF
                                      : math == KN_CUDA_MATH_F16  ? CUBLAS_COMPUTE_32F_FAST_16F
                                      : math == KN_CUDA_MATH_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                  : CUBLAS_COMPUTE_32F;
  if (math == KN_CUDA_MATH_F32) {
    KN_CUBLAS_CHECK(
        cublasSgemm(handle, op_b, op_a, n, m, k, &alpha, d_b, ldb, d_a, lda, &beta, d_c, n));
  } else {
    KN_CUBLAS_CHECK(cublasGemmEx(handle, op_b, op_a, n, m, k, &alpha, d_b, CUDA_R_32F, ldb, d_a,
                                 CUDA_R_32F, lda, &beta, d_c, CUDA_R_32F, n, compute,
                                 CUBLAS_GEMM_DEFAULT));
  }
  rc = 0;
cleanup:
  return rc;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_matmul(const float *a, const float *b, float *c,
                                                      int m, int n, int k, int trans_a, int trans_b,
                                                      char *err, size_t errlen) {
  int rc = -1;
  workspace *w = nullptr;
  float *d_a = nullptr; // (m, k) or (k, m), as on the host
  float *d_b = nullptr; // (k, n) or (n, k)
  float *d_c = nullptr; // (m, n)
  size_t a_bytes = 0, b_bytes = 0, c_bytes = 0;

  if (m < 0 || n < 0 || k < 0) {
    set_err(err, errlen, "kn_cuda_matmul: sizes must be >= 0, got m=%d n=%d k=%d", m, n, k);
    return -1;
  }
  if (m == 0 || n == 0) return 0; /* an empty c: nothing to write */
  if (!c) {
    set_err(err, errlen, "kn_cuda_matmul: c must not be NULL for a (%d, %d) result", m, n);
    return -1;
  }
  c_bytes = (size_t)m * (size_t)n * sizeof(float);
  if (k == 0) { /* a sum over nothing, as cblas_sgemm with beta = 0 */
    memset(c, 0, c_bytes);
    return 0;
  }
  if (!a || !b) {
    set_err(err, errlen, "kn_cuda_matmul: a and b must not be NULL (m=%d n=%d k=%d)", m, n, k);
    return -1;
  }
  a_bytes = (size_t)m * (size_t)k * sizeof(float);
  b_bytes = (size_t)k * (size_t)n * sizeof(float);

  w = workspace_for((a_bytes + b_bytes + c_bytes) / sizeof(float), 1, err, errlen);
  if (!w) return -1;
  d_a = w->buf;
  d_b = d_a + a_bytes / sizeof(float);
  d_c = d_b + b_bytes / sizeof(float);
  KN_CUDA_CHECK(cudaMemcpy(d_a, a, a_bytes, cudaMemcpyHostToDevice));
  KN_CUDA_CHECK(cudaMemcpy(d_b, b, b_bytes, cudaMemcpyHostToDevice));
  if (sgemm(w->handle, d_a, d_b, d_c, m, n, k, trans_a, trans_b, KN_CUDA_MATH_F32, err, errlen) !=
      0)
    return -1;
  /* A blocking copy on the default stream, which cuBLAS also uses: it waits
   * for the sgemm and reports any error the kernel raised. */
  KN_CUDA_CHECK(cudaMemcpy(c, d_c, c_bytes, cudaMemcpyDeviceToHost));
  rc = 0;

cleanup:
  return rc;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_matmul(const float *a, const float *b, float *c,
                                                          int m, int n, int k, int trans_a,
                                                          int trans_b, int math, char *err,
                                                          size_t errlen) {
  int rc = -1;
  workspace *w = nullptr;
  if (math < KN_CUDA_MATH_F32 || math > KN_CUDA_MATH_F16) {
    set_err(err, errlen, "kn_cuda_dev_matmul: math must be f32, tf32, bf16 or f16 (0 to 3), got %d",
            math);
    return -1;
  }
  if (m < 0 || n < 0 || k < 0) {
    set_err(err, errlen, "kn_cuda_dev_matmul: sizes must be >= 0, got m=%d n=%d k=%d", m, n, k);
    return -1;
  }
  if (m == 0 || n == 0) return 0;
  if (!a || !b || !c) {
    set_err(err, errlen, "kn_cuda_dev_matmul: a, b and c must not be NULL (m=%d n=%d k=%d)", m, n,
            k);
    return -1;
  }
  if (k == 0) { /* a sum over nothing, as cblas_sgemm with beta = 0 */
    KN_CUDA_CHECK(cudaMemsetAsync(c, 0, (size_t)m * (size_t)n * sizeof(float), 0));
    return 0;
  }
  w = workspace_for(0, 1, err, errlen);
  if (w) rc = sgemm(w->handle, a, b, c, m, n, k, trans_a, trans_b, math, err, errlen);
cleanup:
  return rc;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_relu(const float *x, float *y, size_t n, char *err,
                                                    size_t errlen) {
  int rc = -1;
  workspace *w = nullptr;
  float *d_buf = nullptr; // (n): x in, y out, computed in place
  size_t bytes = n * sizeof(float);
  unsigned blocks = 0;

  if (n == 0) return 0;
  if (!x || !y) {
    set_err(err, errlen, "kn_cuda_relu: x and y must not be NULL (n=%zu)", n);
    return -1;
  }
  if (grid_for(n, &blocks, err, errlen) != 0) return -1;
  w = workspace_for(n, 0, err, errlen);
  if (!w) return -1;
  d_buf = w->buf;
  KN_CUDA_CHECK(cudaMemcpy(d_buf, x, bytes, cudaMemcpyHostToDevice));
  relu_kernel<<<blocks, RELU_THREADS>>>(d_buf, d_buf, n);
  KN_CUDA_CHECK(cudaGetLastError()); /* launch errors: bad configuration */
  KN_CUDA_CHECK(cudaMemcpy(y, d_buf, bytes, cudaMemcpyDeviceToHost)); /* waits, reports faults */
  rc = 0;

cleanup:
  return rc;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_relu_grad(const float *dy, const float *y, float *dx,
                                                         size_t n, char *err, size_t errlen) {
  int rc = -1;
  workspace *w = nullptr;
  float *d_dy = nullptr, *d_y = nullptr; // (n) each; dx computed into d_dy
  size_t bytes = n * sizeof(float);
  unsigned blocks = 0;

  if (n == 0) return 0;
  if (!dy || !y || !dx) {
    set_err(err, errlen, "kn_cuda_relu_grad: dy, y and dx must not be NULL (n=%zu)", n);
    return -1;
  }
  if (grid_for(n, &blocks, err, errlen) != 0) return -1;
  w = workspace_for(2 * n, 0, err, errlen);
  if (!w) return -1;
  d_dy = w->buf;
  d_y = d_dy + n;
  KN_CUDA_CHECK(cudaMemcpy(d_dy, dy, bytes, cudaMemcpyHostToDevice));
  KN_CUDA_CHECK(cudaMemcpy(d_y, y, bytes, cudaMemcpyHostToDevice));
  relu_grad_kernel<<<blocks, RELU_THREADS>>>(d_dy, d_y, d_dy, n);
  KN_CUDA_CHECK(cudaGetLastError());
  KN_CUDA_CHECK(cudaMemcpy(dx, d_dy, bytes, cudaMemcpyDeviceToHost));
  rc = 0;

cleanup:
  return rc;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_relu(const float *x, float *y, size_t n,
                                                        char *err, size_t errlen) {
  if (n == 0) return 0;
  if (!x || !y) {
    set_err(err, errlen, "kn_cuda_dev_relu: x and y must not be NULL (n=%zu)", n);
    return -1;
  }
  return launch(relu_kernel, n, err, errlen, x, y, n);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_relu_grad(const float *dy, const float *y,
                                                             float *dx, size_t n, char *err,
                                                             size_t errlen) {
  if (n == 0) return 0;
  if (!dy || !y || !dx) {
    set_err(err, errlen, "kn_cuda_dev_relu_grad: dy, y and dx must not be NULL (n=%zu)", n);
    return -1;
  }
  return launch(relu_grad_kernel, n, err, errlen, dy, y, dx, n);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_bias_add(const float *x, const float *b,
                                                            float *y, size_t rows, size_t cols,
                                                            int relu, char *err, size_t errlen) {
  if (rows == 0 || cols == 0) return 0;
  if (!x || !b || !y) {
    set_err(err, errlen, "kn_cuda_dev_bias_add: x, b and y must not be NULL");
    return -1;
  }
  return launch(bias_add_kernel, rows * cols, err, errlen, x, b, y, rows, cols, relu);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_reduce_rows(const float *x, float *out,
                                                               size_t rows, size_t cols, char *err,
                                                               size_t errlen) {
  if (cols == 0) return 0;
  if (!x || !out) {
    set_err(err, errlen, "kn_cuda_dev_reduce_rows: x and out must not be NULL");
    return -1;
  }
  return launch(reduce_rows_kernel, cols, err, errlen, x, out, rows, cols);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_optimizer_step(const kn_step_consts *c, float *p,
                                                                  const float *g, float *m,
                                                                  float *v, size_t n, char *err,
                                                                  size_t errlen) {
  if (n == 0) return 0;
  if (!c || !p || !g) {
    set_err(err, errlen, "kn_cuda_dev_optimizer_step: c, p and g must not be NULL");
    return -1;
  }
  return launch(optimizer_step_kernel, n, err, errlen, *c, p, g, m, v, n);
}

/* The windows' sizes, checked: positive, and a window count that fits. */
static int windows_ok(const kn_cuda_windows *w, const char *what, char *err, size_t errlen) {
  if (!w || w->batch < 0 || w->h <= 0 || w->w <= 0 || w->c <= 0 || w->oh <= 0 || w->ow <= 0 ||
      w->kh <= 0 || w->kw <= 0 || w->sh <= 0 || w->sw <= 0 || w->dh <= 0 || w->dw <= 0) {
    set_err(err, errlen,
            "%s: windows need positive sizes, strides and dilations (batch >= 0), got batch=%d "
            "h=%d w=%d c=%d oh=%d ow=%d kernel %dx%d stride %dx%d dilation %dx%d",
            what, w ? w->batch : -1, w ? w->h : 0, w ? w->w : 0, w ? w->c : 0, w ? w->oh : 0,
            w ? w->ow : 0, w ? w->kh : 0, w ? w->kw : 0, w ? w->sh : 0, w ? w->sw : 0,
            w ? w->dh : 0, w ? w->dw : 0);
    return 0;
  }
  return 1;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_im2col(const kn_cuda_windows *w, const float *x,
                                                          float *cols, char *err, size_t errlen) {
  if (!windows_ok(w, "kn_cuda_dev_im2col", err, errlen)) return -1;
  const size_t n = (size_t)w->batch * w->oh * w->ow * w->kh * w->kw * w->c;
  return launch(im2col_kernel, n, err, errlen, *w, x, cols, n);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_col2im(const kn_cuda_windows *w,
                                                          const float *cols, float *dx, char *err,
                                                          size_t errlen) {
  if (!windows_ok(w, "kn_cuda_dev_col2im", err, errlen)) return -1;
  const size_t n = (size_t)w->batch * w->h * w->w * w->c;
  return launch(col2im_kernel, n, err, errlen, *w, cols, dx, n);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_pool(const kn_cuda_windows *w, const float *x,
                                                        float *y, char *err, size_t errlen) {
  if (!windows_ok(w, "kn_cuda_dev_pool", err, errlen)) return -1;
  const size_t n = (size_t)w->batch * w->oh * w->ow * w->c;
  return launch(pool_kernel, n, err, errlen, *w, x, y, n);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_pool_grad(const kn_cuda_windows *w,
                                                             const float *dy, const float *x,
                                                             const float *y, float *dx, char *err,
                                                             size_t errlen) {
  if (!windows_ok(w, "kn_cuda_dev_pool_grad", err, errlen)) return -1;
  const size_t n = (size_t)w->batch * w->h * w->w * w->c;
  return launch(pool_grad_kernel, n, err, errlen, *w, dy, x, y, dx, n);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_binary(const float *a, const float *b, float *y,
                                                          size_t n, int op, char *err,
                                                          size_t errlen) {
  if (op < 0 || op > 3) {
    set_err(err, errlen, "kn_cuda_dev_binary: op must be 0 to 3 (add, sub, mul, div), got %d", op);
    return -1;
  }
  if (n == 0) return 0;
  return launch(binary_kernel, n, err, errlen, a, b, y, n, op);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_unary(const float *x, float *y, size_t n, int op,
                                                         float alpha, char *err, size_t errlen) {
  if (op < 0 || op > 7) {
    set_err(err, errlen, "kn_cuda_dev_unary: op must be 0 to 7, got %d", op);
    return -1;
  }
  if (n == 0) return 0;
  return launch(unary_kernel, n, err, errlen, x, y, n, op, alpha);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_unary_grad(const float *dy, const float *x,
                                                              const float *y, float *dx, size_t n,
                                                              int op, float alpha, char *err,
                                                              size_t errlen) {
  if (op < 0 || op > 7) {
    set_err(err, errlen, "kn_cuda_dev_unary_grad: op must be 0 to 7, got %d", op);
    return -1;
  }
  if (n == 0) return 0;
  return launch(unary_grad_kernel, n, err, errlen, dy, x, y, dx, n, op, alpha);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_reduce(const float *x, float *y, size_t outer,
                                                          size_t len, size_t inner, int kind,
                                                          char *err, size_t errlen) {
  if (kind < 0 || kind > 2 || len == 0) {
    set_err(err, errlen, "kn_cuda_dev_reduce: kind must be 0 to 2 and len > 0, got %d, %zu", kind,
            len);
    return -1;
  }
  if (outer * inner == 0) return 0;
  return launch(reduce_kernel, outer * inner, err, errlen, x, y, outer, len, inner, kind);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_reduce_grad(const float *dy, const float *x,
                                                               const float *y, float *dx,
                                                               size_t outer, size_t len,
                                                               size_t inner, int kind, char *err,
                                                               size_t errlen) {
  if (kind < 0 || kind > 2 || len == 0) {
    set_err(err, errlen, "kn_cuda_dev_reduce_grad: kind must be 0 to 2 and len > 0, got %d, %zu",
            kind, len);
    return -1;
  }
  if (outer * inner == 0) return 0;
  return launch(reduce_grad_kernel, outer * inner, err, errlen, dy, x, y, dx, outer, len, inner,
                kind);
}

/* Each channel's two sums (bn_partial_sums, then bn_finish) in the
 * calling thread's workspace: the parts, then (what 1) the sums. */
static int bn_sums(int what, const float *x, const float *dy, const float *stats, size_t rows,
                   size_t C, float *mm, float *mv, float *out_stats, double momentum, double eps,
                   float *dgamma, float *dbeta, double **sums_out, char *err, size_t errlen) {
  int rc = -1;
  size_t parts = (rows + BN_PART_ROWS - 1) / BN_PART_ROWS;
  if (parts < 1) parts = 1;
  if (parts > BN_MAX_PARTS) parts = BN_MAX_PARTS;
  const size_t per_part = (rows + parts - 1) / parts;
  /* doubles: parts x 2 x C, then 2 x C sums; the workspace counts floats */
  workspace *w = workspace_for((parts * 2 * C + 2 * C) * 2, 0, err, errlen);
  if (!w) return -1;
  double *part = (double *)(void *)w->buf, *sums = part + parts * 2 * C;
  const dim3 grid((unsigned)((C + BN_LANES - 1) / BN_LANES), (unsigned)parts);
  bn_partial_sums<<<grid, BN_LANES * BN_ROW_LANES>>>(what, x, dy, stats, rows, C,
                                                     per_part ? per_part : 1, part);
  KN_CUDA_CHECK(cudaGetLastError());
  if (sums_out) *sums_out = sums;
  rc = launch(bn_finish, C, err, errlen, what, x, rows, C, (int)parts, (const double *)part,
              out_stats, mm, mv, momentum, eps, dgamma, dbeta, sums);
cleanup:
  return rc;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_bn_stats(const float *x, float *moving_mean,
                                                            float *moving_var, float *stats,
                                                            size_t rows, size_t C, float momentum,
                                                            float epsilon, int training, char *err,
                                                            size_t errlen) {
  if (C == 0) return 0;
  if (!training || rows == 0)
    return launch(bn_eval_stats, C, err, errlen, (const float *)moving_mean,
                  (const float *)moving_var, stats, C, (double)epsilon);
  return bn_sums(0, x, nullptr, nullptr, rows, C, moving_mean, moving_var, stats, (double)momentum,
                 (double)epsilon, nullptr, nullptr, nullptr, err, errlen);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_bn_apply(const float *x, const float *stats,
                                                            const float *gamma, const float *beta,
                                                            float *y, size_t rows, size_t C,
                                                            char *err, size_t errlen) {
  if (rows * C == 0) return 0;
  return launch(bn_apply_kernel, rows * C, err, errlen, x, stats, gamma, beta, y, rows, C);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_bn_grad(const float *dy, const float *x,
                                                           const float *stats, const float *gamma,
                                                           float *dx, float *dgamma, float *dbeta,
                                                           size_t rows, size_t C, char *err,
                                                           size_t errlen) {
  double *sums = nullptr;
  if (C == 0) return 0;
  if (bn_sums(1, x, dy, stats, rows, C, nullptr, nullptr, nullptr, 0.0, 0.0, dgamma, dbeta, &sums,
              err, errlen) != 0)
    return -1;
  if (!dx || rows == 0) return 0;
  return launch(bn_grad_x_kernel, rows * C, err, errlen, dy, x, stats, gamma, sums, dx, rows, C);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_dropout_mask(float *m, size_t n, uint64_t seed,
                                                                uint64_t step, uint64_t first,
                                                                uint32_t threshold, float keep,
                                                                char *err, size_t errlen) {
  if (n == 0) return 0;
  return launch(dropout_mask_kernel, n, err, errlen, m, n, seed, step, first, threshold, keep);
}

enum { DW_MAX_PARTS = 64 };

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_dwconv(const kn_cuda_windows *w, int M, int mode,
                                                          const float *a, const float *b,
                                                          float *out, char *err, size_t errlen) {
  int rc = -1;
  unsigned blocks = 0;
  if (!windows_ok(w, "kn_cuda_dev_dwconv", err, errlen)) return -1;
  if (M <= 0 || mode < 0 || mode > 2) {
    set_err(err, errlen, "kn_cuda_dev_dwconv: multiplier > 0 and mode 0 to 2, got %d and %d", M,
            mode);
    return -1;
  }
  const size_t CM = (size_t)w->c * M;
  if (mode == 0)
    return launch(dw_forward_kernel, (size_t)w->batch * w->oh * w->ow * CM, err, errlen, *w, M, a,
                  b, out, (size_t)w->batch * w->oh * w->ow * CM);
  if (mode == 1)
    return launch(dw_dx_kernel, (size_t)w->batch * w->h * w->w * w->c, err, errlen, *w, M, a, b,
                  out, (size_t)w->batch * w->h * w->w * w->c);
  const size_t weights = (size_t)w->kh * w->kw * CM;
  const int parts = w->batch < 1 ? 1 : w->batch < DW_MAX_PARTS ? w->batch : DW_MAX_PARTS;
  const int per_part = w->batch < 1 ? 1 : (w->batch + parts - 1) / parts;
  workspace *ws = workspace_for((size_t)parts * weights * 2, 0, err, errlen);
  if (!ws) return -1;
  double *part = (double *)(void *)ws->buf;
  if (grid_for(weights, &blocks, err, errlen) != 0) return -1;
  dw_dw_parts<<<dim3(blocks, (unsigned)parts), RELU_THREADS>>>(*w, M, a, b, per_part, part,
                                                               weights);
  KN_CUDA_CHECK(cudaGetLastError());
  rc = launch(dw_dw_finish, weights, err, errlen, (const double *)part, parts, out, weights);
cleanup:
  return rc;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_copy_rows(float *dst, size_t dst_pitch,
                                                             const float *src, size_t src_pitch,
                                                             size_t rows, size_t len, char *err,
                                                             size_t errlen) {
  int rc = -1;
  if (len > dst_pitch || len > src_pitch) {
    set_err(err, errlen, "kn_cuda_dev_copy_rows: rows of %zu floats in pitches of %zu and %zu", len,
            dst_pitch, src_pitch);
    return -1;
  }
  if (rows == 0 || len == 0) return 0;
  KN_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch * sizeof(float), src, src_pitch * sizeof(float),
                                  len * sizeof(float), rows, cudaMemcpyDeviceToDevice, 0));
  rc = 0;
cleanup:
  return rc;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_fill(float *y, size_t n, float value, char *err,
                                                        size_t errlen) {
  if (n == 0) return 0;
  return launch(fill_kernel, n, err, errlen, y, n, value);
}

/* loss[0] = the mean of `count` double terms the kernel writes into the
 * workspace (its arguments after the terms' count and buffer). */
template <typename... Params, typename... Args>
static int mean_of_terms(void (*terms)(Params...), size_t count, float *loss, char *err,
                         size_t errlen, Args... args) {
  int rc = -1;
  workspace *w = workspace_for(count * 2, 0, err, errlen);
  if (!w) return -1;
  double *term = (double *)(void *)w->buf;
  if (launch(terms, count, err, errlen, args..., term, count)) return -1;
  xent_mean<<<1, 1>>>((const double *)term, loss, count);
  KN_CUDA_CHECK(cudaGetLastError());
  rc = 0;
cleanup:
  return rc;
}

/* A loss over rows of classes needs both. */
static int loss_shape_ok(const char *what, size_t rows, size_t cols, char *err, size_t errlen) {
  if (rows && cols) return 1;
  set_err(err, errlen, "%s: needs rows and classes, got %zu x %zu", what, rows, cols);
  return 0;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_softmax_xent(const float *logits,
                                                                const int32_t *labels, float *loss,
                                                                size_t rows, size_t cols, char *err,
                                                                size_t errlen) {
  if (!loss_shape_ok("kn_cuda_dev_softmax_xent", rows, cols, err, errlen)) return -1;
  return mean_of_terms(xent_rows, rows, loss, err, errlen, logits, labels, cols);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_softmax_xent_grad(const float *logits,
                                                                     const int32_t *labels,
                                                                     const float *dloss, float *dx,
                                                                     size_t rows, size_t cols,
                                                                     char *err, size_t errlen) {
  if (!loss_shape_ok("kn_cuda_dev_softmax_xent_grad", rows, cols, err, errlen)) return -1;
  return launch(xent_grad_rows, rows, err, errlen, logits, labels, dloss, dx, rows, cols);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_xent_dense(const float *logits,
                                                              const float *probs, float *loss,
                                                              size_t rows, size_t cols, char *err,
                                                              size_t errlen) {
  if (!loss_shape_ok("kn_cuda_dev_xent_dense", rows, cols, err, errlen)) return -1;
  return mean_of_terms(xent_dense_rows, rows, loss, err, errlen, logits, probs, cols);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_xent_dense_grad(const float *logits,
                                                                   const float *probs,
                                                                   const float *dloss, float *dx,
                                                                   size_t rows, size_t cols,
                                                                   char *err, size_t errlen) {
  if (!loss_shape_ok("kn_cuda_dev_xent_dense_grad", rows, cols, err, errlen)) return -1;
  return launch(xent_dense_grad_rows, rows, err, errlen, logits, probs, dloss, dx, rows, cols);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_bce_logits(const float *x, const float *t,
                                                              float *loss, size_t n, char *err,
                                                              size_t errlen) {
  if (n == 0) {
    set_err(err, errlen, "kn_cuda_dev_bce_logits: needs values, got none");
    return -1;
  }
  return mean_of_terms(bce_terms, n, loss, err, errlen, x, t);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_bce_logits_grad(const float *x, const float *t,
                                                                   const float *dloss, float *dx,
                                                                   size_t n, char *err,
                                                                   size_t errlen) {
  if (n == 0) {
    set_err(err, errlen, "kn_cuda_dev_bce_logits_grad: needs values, got none");
    return -1;
  }
  return launch(bce_grad_kernel, n, err, errlen, x, t, dloss, dx, n);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_cast(const void *x, void *y, size_t n, int mode,
                                                        char *err, size_t errlen) {
  if (mode < KN_CUDA_CAST_TO_BF16 || mode > KN_CUDA_CAST_ROUND_F16) {
    set_err(err, errlen, "kn_cuda_dev_cast: mode must be 0 to 5, got %d", mode);
    return -1;
  }
  if (n == 0) return 0;
  return launch(cast_kernel, n, err, errlen, x, y, n, mode);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_dev_copy(void *dst, const void *src, size_t bytes,
                                                        char *err, size_t errlen) {
  int rc = -1;
  if (bytes == 0 || dst == src) return 0;
  KN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
  rc = 0;
cleanup:
  return rc;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_set_device(int device, char *err, size_t errlen) {
  int count = 0;
  /* every node's kernel sets its device: the device count only on failure */
  const cudaError_t status = device >= 0 ? cudaSetDevice(device) : cudaErrorInvalidDevice;
  if (status == cudaSuccess) return 0;
  (void)cudaGetLastError();
  if (kiln_cuda_module_device_count(&count, err, errlen) != 0) return -1;
  if (device < 0 || device >= count) {
    set_err(err, errlen, "CUDA device %d does not exist: this machine has %d CUDA device%s", device,
            count, count == 1 ? "" : "s");
    return -1;
  }
  set_err(err, errlen, "%s: cudaSetDevice(%d) failed: %s (%s)", base_name(__FILE__), device,
          cudaGetErrorString(status), cudaGetErrorName(status));
  return -1;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_alloc(int device, size_t bytes, void **out,
                                                     char *err, size_t errlen) {
  int rc = -1;
  *out = NULL;
  if (kiln_cuda_module_set_device(device, err, errlen) != 0) return -1;
  KN_CUDA_CHECK(cudaMalloc(out, bytes ? bytes : 1));
  rc = 0;
cleanup:
  return rc;
}

extern "C" KN_CUDA_EXPORT void kiln_cuda_module_free(int device, void *p) {
  if (!p || cudaSetDevice(device) != cudaSuccess) return;
  (void)cudaFree(p);
  (void)cudaGetLastError();
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_host_register(void *p, size_t bytes, char *err,
                                                             size_t errlen) {
  int rc = -1;
  if (!p || bytes == 0) return 0;
  KN_CUDA_CHECK(cudaHostRegister(p, bytes, cudaHostRegisterDefault));
  rc = 0;
cleanup:
  return rc;
}

extern "C" KN_CUDA_EXPORT void kiln_cuda_module_host_unregister(void *p) {
  if (!p) return;
  (void)cudaHostUnregister(p);
  (void)cudaGetLastError(); /* memory never pinned: nothing to undo */
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_copy_in(int device, void *dst, const void *host,
                                                       size_t bytes, char *err, size_t errlen) {
  int rc = -1;
  if (kiln_cuda_module_set_device(device, err, errlen) != 0) return -1;
  KN_CUDA_CHECK(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice));
  rc = 0;
cleanup:
  return rc;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_copy_out(int device, void *host, const void *src,
                                                        size_t bytes, char *err, size_t errlen) {
  int rc = -1;
  if (kiln_cuda_module_set_device(device, err, errlen) != 0) return -1;
  KN_CUDA_CHECK(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost));
  rc = 0;
cleanup:
  return rc;
}

/* ------------------------------------------------------------------ NCCL -- */

#include <nccl.h>

#include <cstdlib>
#include <ctime>
#include <sched.h>

static_assert(sizeof(ncclUniqueId) == KN_NCCL_ID_BYTES, "ncclUniqueId is KN_NCCL_ID_BYTES bytes");

/* One rank of a communicator: its device, a stream, and the device and
 * pinned host buffers the all-reduces stage through (capacity floats
 * each). started[] are the host ranges in flight, copied back by wait. */
struct kn_nccl {
  ncclComm_t comm;
  int device, rank, nranks;
  double timeout_s;
  cudaStream_t stream;
  float *dev, *pinned;
  size_t capacity;
  struct range {
    float *host;
    size_t at, n;
  } * started;
  size_t n_started, max_started;
  int ready;  /* joined: the communicator may be destroyed cleanly */
  int broken; /* aborted: every later call fails */
};

#define KN_NCCL_CHECK(call)                                                                        \
  do {                                                                                             \
    ncclResult_t kn_status_ = (call);                                                              \
    if (kn_status_ != ncclSuccess && kn_status_ != ncclInProgress) {                               \
      set_err(err, errlen, "%s:%d: %s failed: %s", base_name(__FILE__), __LINE__, #call,           \
              ncclGetErrorString(kn_status_));                                                     \
      goto cleanup;                                                                                \
    }                                                                                              \
  } while (0)

static double seconds_now() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Aborts the communicator (a peer died or hangs): ncclCommAbort, unlike
 * ncclCommDestroy, never waits for the peers. */
static void abort_comm(kn_nccl *c) {
  if (c->comm && !c->broken) ncclCommAbort(c->comm);
  c->broken = 1;
}

/* Waits until the non-blocking communicator has finished its last call
 * (init or enqueue), at most until deadline; a failure or the deadline
 * aborts it. */
static int settle(kn_nccl *c, double deadline, const char *what, char *err, size_t errlen) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(c->comm, &state);
    if (rc != ncclSuccess) state = rc;
    if (state == ncclSuccess) return 0;
    if (state != ncclInProgress) {
      set_err(err, errlen, "NCCL rank %d of %d on cuda:%d: %s failed: %s (%s)", c->rank, c->nranks,
              c->device, what, ncclGetErrorString(state), ncclGetLastError(c->comm));
      abort_comm(c);
      return -1;
    }
    if (seconds_now() > deadline) {
      set_err(err, errlen,
              "NCCL rank %d of %d on cuda:%d: %s waited more than %g s for the other ranks; one "
              "of them died or hangs",
              c->rank, c->nranks, c->device, what, c->timeout_s);
      abort_comm(c);
      return -1;
    }
    sched_yield();
  }
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_nccl_unique_id(unsigned char *id, char *err,
                                                              size_t errlen) {
  int rc = -1;
  ncclUniqueId uid;
  KN_NCCL_CHECK(ncclGetUniqueId(&uid));
  memcpy(id, &uid, sizeof uid);
  rc = 0;
cleanup:
  return rc;
}

extern "C" KN_CUDA_EXPORT void kiln_cuda_module_nccl_close(kn_nccl *c) {
  if (!c) return;
  cudaSetDevice(c->device);
  if (c->comm && !c->broken) { /* aborted already: the handle is gone */
    /* A clean leave flushes and waits for the peers (finalize), at most the
     * timeout; not joined, work in flight that no one will wait for, or a
     * peer that does not leave: abort, which never waits for them. The
     * destroy after a finalize waits for nothing. */
    ncclResult_t left = ncclInternalError;
    if (c->ready && c->n_started == 0) left = ncclCommFinalize(c->comm);
    if ((left == ncclSuccess || left == ncclInProgress) &&
        settle(c, seconds_now() + c->timeout_s, "leaving the communicator", nullptr, 0) == 0)
      ncclCommDestroy(c->comm);
    else if (!c->broken)
      ncclCommAbort(c->comm);
  }
  if (c->stream) cudaStreamDestroy(c->stream);
  cudaFree(c->dev);
  cudaFreeHost(c->pinned);
  free(c->started);
  free(c);
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_nccl_open(const unsigned char *id, int nranks,
                                                         int rank, int device, size_t capacity,
                                                         double timeout_s, kn_nccl **out, char *err,
                                                         size_t errlen) {
  int rc = -1, count = 0;
  kn_nccl *c = nullptr;
  ncclUniqueId uid;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  *out = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks || capacity == 0) {
    set_err(err, errlen, "kn_nccl_open: rank %d of %d ranks, %zu floats: out of range", rank,
            nranks, capacity);
    return -1;
  }
  if (kiln_cuda_module_device_count(&count, err, errlen) != 0) return -1;
  if (device < 0 || device >= count) {
    set_err(err, errlen,
            "NCCL rank %d of %d needs CUDA device %d, and this machine has %d CUDA device%s", rank,
            nranks, device, count, count == 1 ? "" : "s");
    return -1;
  }
  c = static_cast<kn_nccl *>(calloc(1, sizeof *c));
  if (!c) {
    set_err(err, errlen, "kn_nccl_open: out of memory");
    return -1;
  }
  c->device = device;
  c->rank = rank;
  c->nranks = nranks;
  c->timeout_s = timeout_s > 0 ? timeout_s : 300.0;
  c->capacity = capacity;
  KN_CUDA_CHECK(cudaSetDevice(device));
  KN_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  KN_CUDA_CHECK(cudaMalloc((void **)&c->dev, capacity * sizeof(float)));
  KN_CUDA_CHECK(cudaMallocHost((void **)&c->pinned, capacity * sizeof(float)));
  memcpy(&uid, id, sizeof uid);
  /* Non-blocking: init and enqueues return at once, and settle() polls,
   * so a rank that never comes cannot hold this one past its timeout. */
  config.blocking = 0;
  KN_NCCL_CHECK(ncclCommInitRankConfig(&c->comm, nranks, uid, rank, &config));
  if (settle(c, seconds_now() + c->timeout_s, "joining the communicator", err, errlen) != 0)
    goto cleanup;
  c->ready = 1;
  *out = c;
  c = nullptr;
  rc = 0;
cleanup:
  kiln_cuda_module_nccl_close(c);
  return rc;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_nccl_start(kn_nccl *c, float *host, size_t at,
                                                          size_t n, char *err, size_t errlen) {
  int rc = -1;
  if (c->broken) {
    set_err(err, errlen, "NCCL rank %d of %d on cuda:%d: the communicator was aborted", c->rank,
            c->nranks, c->device);
    return -1;
  }
  /* Every failure aborts: the peers would wait on a sum this rank skips. */
  if (at > c->capacity || n > c->capacity - at) {
    set_err(err, errlen, "kn_nccl_start: floats [%zu, %zu) are past the %zu staged", at, at + n,
            c->capacity);
    abort_comm(c);
    return -1;
  }
  if (n == 0) return 0;
  if (c->n_started == c->max_started) {
    size_t max = c->max_started ? 2 * c->max_started : 16;
    void *grown = realloc(c->started, max * sizeof *c->started);
    if (!grown) {
      set_err(err, errlen, "kn_nccl_start: out of memory");
      abort_comm(c);
      return -1;
    }
    c->started = static_cast<kn_nccl::range *>(grown);
    c->max_started = max;
  }
  KN_CUDA_CHECK(cudaSetDevice(c->device));
  memcpy(c->pinned + at, host, n * sizeof(float));
  KN_CUDA_CHECK(cudaMemcpyAsync(c->dev + at, c->pinned + at, n * sizeof(float),
                                cudaMemcpyHostToDevice, c->stream));
  KN_NCCL_CHECK(ncclAllReduce(c->dev + at, c->dev + at, n, ncclFloat, ncclSum, c->comm, c->stream));
  if (settle(c, seconds_now() + c->timeout_s, "starting an all-reduce", err, errlen) != 0)
    return -1;
  KN_CUDA_CHECK(cudaMemcpyAsync(c->pinned + at, c->dev + at, n * sizeof(float),
                                cudaMemcpyDeviceToHost, c->stream));
  c->started[c->n_started++] = {host, at, n};
  rc = 0;
cleanup:
  if (rc) abort_comm(c); /* a half-enqueued collective: the peers would wait on it */
  return rc;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_nccl_wait(kn_nccl *c, char *err, size_t errlen) {
  int rc = -1;
  const double deadline = seconds_now() + c->timeout_s;
  if (c->broken) {
    set_err(err, errlen, "NCCL rank %d of %d on cuda:%d: the communicator was aborted", c->rank,
            c->nranks, c->device);
    return -1;
  }
  KN_CUDA_CHECK(cudaSetDevice(c->device));
  for (;;) {
    cudaError_t done = cudaStreamQuery(c->stream);
    if (done == cudaSuccess) break;
    if (done != cudaErrorNotReady) KN_CUDA_CHECK(done);
    /* In flight: a peer's failure shows as the communicator's error. */
    if (settle(c, deadline, "an all-reduce", err, errlen) != 0) return -1;
    if (seconds_now() > deadline) {
      set_err(err, errlen,
              "NCCL rank %d of %d on cuda:%d: an all-reduce waited more than %g s for the other "
              "ranks; one of them died or hangs",
              c->rank, c->nranks, c->device, c->timeout_s);
      abort_comm(c);
      return -1;
    }
    sched_yield();
  }
  for (size_t i = 0; i < c->n_started; i++)
    memcpy(c->started[i].host, c->pinned + c->started[i].at, c->started[i].n * sizeof(float));
  c->n_started = 0;
  rc = 0;
cleanup:
  if (rc) abort_comm(c);
  return rc;
}
