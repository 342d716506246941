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

/* The same three on device buffers of the current device (kn_cuda_alloc),
 * queued on its default stream without copies: the graph's kernels, over
 * values kept on the device (residency.c). A fault in the queued work
 * surfaces at the next kn_cuda_copy_out, which waits for it. */
int kn_cuda_dev_matmul(const float *a, const float *b, float *c, int m, int n, int k, int trans_a,
                       int trans_b, char *err, size_t errlen);
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
