/* cuda_module.h — the CUDA module's exports (cuda.cu, built as the shared
 * module kiln_cuda): the functions of cuda.h under module names, looked up
 * by cuda_loader.c when the engine first needs a GPU. The module links
 * cudart and cuBLAS; a process that never asks for a GPU never maps them
 * (cuBLAS alone is hundreds of MB of library). */
#ifndef KILN_ENGINE_CUDA_MODULE_H
#define KILN_ENGINE_CUDA_MODULE_H

#include <stddef.h>
#include <stdint.h>

#include "cuda.h" /* kn_nccl, KN_NCCL_ID_BYTES, kn_cuda_windows */

#define KN_CUDA_EXPORT __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

KN_CUDA_EXPORT int kiln_cuda_module_device_count(int *count, char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_device_name(int device, char *name, size_t len, char *err,
                                                size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_matmul(const float *a, const float *b, float *c, int m, int n,
                                           int k, int trans_a, int trans_b, char *err,
                                           size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_relu(const float *x, float *y, size_t n, char *err,
                                         size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_relu_grad(const float *dy, const float *y, float *dx, size_t n,
                                              char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_matmul(const float *a, const float *b, float *c, int m,
                                               int n, int k, int trans_a, int trans_b, int math,
                                               char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_im2col(const kn_cuda_windows *w, const float *x,
                                               float *cols, char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_col2im(const kn_cuda_windows *w, const float *cols,
                                               float *dx, char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_pool(const kn_cuda_windows *w, const float *x, float *y,
                                             char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_pool_grad(const kn_cuda_windows *w, const float *dy,
                                                  const float *x, const float *y, float *dx,
                                                  char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_binary(const float *a, const float *b, float *y, size_t n,
                                               int op, char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_dropout_mask(float *m, size_t n, uint64_t seed,
                                                     uint64_t step, uint64_t first,
                                                     uint32_t threshold, float keep, char *err,
                                                     size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_unary(const float *x, float *y, size_t n, int op,
                                              float alpha, char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_unary_grad(const float *dy, const float *x, const float *y,
                                                   float *dx, size_t n, int op, float alpha,
                                                   char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_reduce(const float *x, float *y, size_t outer, size_t len,
                                               size_t inner, int kind, char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_reduce_grad(const float *dy, const float *x, const float *y,
                                                    float *dx, size_t outer, size_t len,
                                                    size_t inner, int kind, char *err,
                                                    size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_bn_stats(const float *x, float *moving_mean,
                                                 float *moving_var, float *stats, size_t rows,
                                                 size_t C, float momentum, float epsilon,
                                                 int training, char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_bn_apply(const float *x, const float *stats,
                                                 const float *gamma, const float *beta, float *y,
                                                 size_t rows, size_t C, char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_bn_grad(const float *dy, const float *x, const float *stats,
                                                const float *gamma, float *dx, float *dgamma,
                                                float *dbeta, size_t rows, size_t C, char *err,
                                                size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_dwconv(const kn_cuda_windows *w, int M, int mode,
                                               const float *a, const float *b, float *out,
                                               char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_copy_rows(float *dst, size_t dst_pitch, const float *src,
                                                  size_t src_pitch, size_t rows, size_t len,
                                                  char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_fill(float *y, size_t n, float value, char *err,
                                             size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_softmax_xent(const float *logits, const int32_t *labels,
                                                     float *loss, size_t rows, size_t cols,
                                                     char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_softmax_xent_grad(const float *logits,
                                                          const int32_t *labels, const float *dloss,
                                                          float *dx, size_t rows, size_t cols,
                                                          char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_xent_dense(const float *logits, const float *probs,
                                                   float *loss, size_t rows, size_t cols, char *err,
                                                   size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_xent_dense_grad(const float *logits, const float *probs,
                                                        const float *dloss, float *dx, size_t rows,
                                                        size_t cols, char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_bce_logits(const float *x, const float *t, float *loss,
                                                   size_t n, char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_bce_logits_grad(const float *x, const float *t,
                                                        const float *dloss, float *dx, size_t n,
                                                        char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_cast(const void *x, void *y, size_t n, int mode, char *err,
                                             size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_relu(const float *x, float *y, size_t n, char *err,
                                             size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_relu_grad(const float *dy, const float *y, float *dx,
                                                  size_t n, char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_bias_add(const float *x, const float *b, float *y,
                                                 size_t rows, size_t cols, int relu, char *err,
                                                 size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_reduce_rows(const float *x, float *out, size_t rows,
                                                    size_t cols, char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_optimizer_step(const kn_step_consts *c, float *p,
                                                       const float *g, float *m, float *v, size_t n,
                                                       char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_dev_copy(void *dst, const void *src, size_t bytes, char *err,
                                             size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_set_device(int device, char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_alloc(int device, size_t bytes, void **out, char *err,
                                          size_t errlen);
KN_CUDA_EXPORT void kiln_cuda_module_free(int device, void *p);
KN_CUDA_EXPORT int kiln_cuda_module_copy_in(int device, void *dst, const void *host, size_t bytes,
                                            char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_copy_out(int device, void *host, const void *src, size_t bytes,
                                             char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_host_register(void *p, size_t bytes, char *err, size_t errlen);
KN_CUDA_EXPORT void kiln_cuda_module_host_unregister(void *p);
KN_CUDA_EXPORT int kiln_cuda_module_nccl_unique_id(unsigned char *id, char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_nccl_open(const unsigned char *id, int nranks, int rank,
                                              int device, size_t capacity, double timeout_s,
                                              kn_nccl **out, char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_nccl_start(kn_nccl *c, float *host, size_t at, size_t n,
                                               char *err, size_t errlen);
KN_CUDA_EXPORT int kiln_cuda_module_nccl_wait(kn_nccl *c, char *err, size_t errlen);
KN_CUDA_EXPORT void kiln_cuda_module_nccl_close(kn_nccl *c);

#ifdef __cplusplus
}
#endif

#endif
