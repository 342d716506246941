/* cuda.cu — the CUDA backend: device discovery and selection, sgemm on
 * host row-major buffers through cuBLAS, and relu and its gradient with own
 * kernels; the graph runs nodes placed on cuda:N through them (placement.c).
 * Built only with KILN_CUDA=ON; C callers see the extern "C" face in cuda.h.
 * Each call copies in, computes and copies out: values stay in the graph's
 * host arena, so a node on a GPU and one on the CPU read each other's
 * outputs as they are. */
#include "cuda_module.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

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

enum { RELU_THREADS = 256, RELU_BLOCKS_PER_SM = 32 };

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

static __global__ void relu_grad_kernel(const float *dy, const float *y, float *dx, size_t n) {
  size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

/* Enough blocks of RELU_THREADS to fill every SM of the current device, no
 * more (the kernels' grid-stride loops do the rest). */
static int grid_for(size_t n, unsigned *blocks, char *err, size_t errlen) {
  int rc = -1, device = 0, sm_count = 0;
  size_t b = (n + RELU_THREADS - 1) / RELU_THREADS;
  KN_CUDA_CHECK(cudaGetDevice(&device));
  KN_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  if (b > (size_t)sm_count * RELU_BLOCKS_PER_SM) b = (size_t)sm_count * RELU_BLOCKS_PER_SM;
  *blocks = b > 0 ? (unsigned)b : 1u;
  rc = 0;
cleanup:
  return rc;
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

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_matmul(const float *a, const float *b, float *c,
                                                      int m, int n, int k, int trans_a, int trans_b,
                                                      char *err, size_t errlen) {
  int rc = -1;
  float *d_a = nullptr; // (m, k) or (k, m), as on the host
  float *d_b = nullptr; // (k, n) or (n, k)
  float *d_c = nullptr; // (m, n)
  cublasHandle_t handle = nullptr;
  const float alpha = 1.0f, beta = 0.0f;
  size_t a_bytes = 0, b_bytes = 0, c_bytes = 0;
  int lda = 0, ldb = 0;
  cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;

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

  KN_CUDA_CHECK(cudaMalloc((void **)&d_a, a_bytes));
  KN_CUDA_CHECK(cudaMalloc((void **)&d_b, b_bytes));
  KN_CUDA_CHECK(cudaMalloc((void **)&d_c, c_bytes));
  KN_CUDA_CHECK(cudaMemcpy(d_a, a, a_bytes, cudaMemcpyHostToDevice));
  KN_CUDA_CHECK(cudaMemcpy(d_b, b, b_bytes, cudaMemcpyHostToDevice));
  KN_CUBLAS_CHECK(cublasCreate(&handle));

  /* cuBLAS is column-major, and a row-major (r, s) buffer read column-major
   * is its transpose. So the row-major C (m, n) is a column-major C^T (n, m)
   * and we ask cuBLAS for C^T = op(B)^T op(A)^T: b goes first, each operand
   * keeps its own transpose flag, m and n swap. Leading dimensions are the
   * row lengths of the buffers as stored on the host. */
  op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  lda = trans_a ? m : k;
  ldb = trans_b ? k : n;
  KN_CUBLAS_CHECK(
      cublasSgemm(handle, op_b, op_a, n, m, k, &alpha, d_b, ldb, d_a, lda, &beta, d_c, n));
  /* A blocking copy on the default stream, which cuBLAS also uses: it waits
   * for the sgemm and reports any error the kernel raised. */
  KN_CUDA_CHECK(cudaMemcpy(c, d_c, c_bytes, cudaMemcpyDeviceToHost));
  rc = 0;

cleanup:
  if (handle) cublasDestroy(handle);
  cudaFree(d_c); /* cudaFree(nullptr) is a no-op */
  cudaFree(d_b);
  cudaFree(d_a);
  return rc;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_relu(const float *x, float *y, size_t n, char *err,
                                                    size_t errlen) {
  int rc = -1;
  float *d_buf = nullptr; // (n): x in, y out, computed in place
  size_t bytes = n * sizeof(float);
  unsigned blocks = 0;

  if (n == 0) return 0;
  if (!x || !y) {
    set_err(err, errlen, "kn_cuda_relu: x and y must not be NULL (n=%zu)", n);
    return -1;
  }
  if (grid_for(n, &blocks, err, errlen) != 0) return -1;
  KN_CUDA_CHECK(cudaMalloc((void **)&d_buf, bytes));
  KN_CUDA_CHECK(cudaMemcpy(d_buf, x, bytes, cudaMemcpyHostToDevice));
  relu_kernel<<<blocks, RELU_THREADS>>>(d_buf, d_buf, n);
  KN_CUDA_CHECK(cudaGetLastError()); /* launch errors: bad configuration */
  KN_CUDA_CHECK(cudaMemcpy(y, d_buf, bytes, cudaMemcpyDeviceToHost)); /* waits, reports faults */
  rc = 0;

cleanup:
  cudaFree(d_buf);
  return rc;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_relu_grad(const float *dy, const float *y, float *dx,
                                                         size_t n, char *err, size_t errlen) {
  int rc = -1;
  float *d_dy = nullptr, *d_y = nullptr; // (n) each; dx computed into d_dy
  size_t bytes = n * sizeof(float);
  unsigned blocks = 0;

  if (n == 0) return 0;
  if (!dy || !y || !dx) {
    set_err(err, errlen, "kn_cuda_relu_grad: dy, y and dx must not be NULL (n=%zu)", n);
    return -1;
  }
  if (grid_for(n, &blocks, err, errlen) != 0) return -1;
  KN_CUDA_CHECK(cudaMalloc((void **)&d_dy, bytes));
  KN_CUDA_CHECK(cudaMalloc((void **)&d_y, bytes));
  KN_CUDA_CHECK(cudaMemcpy(d_dy, dy, bytes, cudaMemcpyHostToDevice));
  KN_CUDA_CHECK(cudaMemcpy(d_y, y, bytes, cudaMemcpyHostToDevice));
  relu_grad_kernel<<<blocks, RELU_THREADS>>>(d_dy, d_y, d_dy, n);
  KN_CUDA_CHECK(cudaGetLastError());
  KN_CUDA_CHECK(cudaMemcpy(dx, d_dy, bytes, cudaMemcpyDeviceToHost));
  rc = 0;

cleanup:
  cudaFree(d_y);
  cudaFree(d_dy);
  return rc;
}

extern "C" KN_CUDA_EXPORT int kiln_cuda_module_set_device(int device, char *err, size_t errlen) {
  int rc = -1, count = 0;
  if (kiln_cuda_module_device_count(&count, err, errlen) != 0) return -1;
  if (device < 0 || device >= count) {
    set_err(err, errlen, "CUDA device %d does not exist: this machine has %d CUDA device%s", device,
            count, count == 1 ? "" : "s");
    return -1;
  }
  KN_CUDA_CHECK(cudaSetDevice(device));
  rc = 0;
cleanup:
  return rc;
}
