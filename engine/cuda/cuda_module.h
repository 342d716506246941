/* cuda_module.h — the CUDA module's exports (cuda.cu, built as the shared
 * module kiln_cuda): the functions of cuda.h under module names, looked up
 * by cuda_loader.c when the engine first needs a GPU. The module links
 * cudart and cuBLAS; a process that never asks for a GPU never maps them
 * (cuBLAS alone is hundreds of MB of library). */
#ifndef KILN_ENGINE_CUDA_MODULE_H
#define KILN_ENGINE_CUDA_MODULE_H

#include <stddef.h>

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
KN_CUDA_EXPORT int kiln_cuda_module_set_device(int device, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
