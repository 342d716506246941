/* cuda.h — private to the engine: the CUDA backend's entry points, callable
 * from C. cuda.cu implements them when kiln is built with KILN_CUDA=ON;
 * no_cuda.c stands in otherwise, so callers need no #ifdef.
 *
 * Every function returns 0 on success or -1 with a sentence in err (naming
 * file:line and CUDA's own error string for a failed CUDA or cuBLAS call).
 * The functions work on the calling thread's current device. */
#ifndef KILN_ENGINE_CUDA_H
#define KILN_ENGINE_CUDA_H

#include <stddef.h>

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

/* dx[i] = y[i] > 0 ? dy[i] : 0 for n host floats: relu's gradient from its
 * output y, as the CPU kernel. dx may be dy. */
int kn_cuda_relu_grad(const float *dy, const float *y, float *dx, size_t n, char *err,
                      size_t errlen);

/* Makes device the calling thread's current one (cudaSetDevice), after
 * checking it exists. */
int kn_cuda_set_device(int device, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
