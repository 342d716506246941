/* no_cuda.c — the CUDA backend of a build without CUDA (KILN_CUDA=OFF):
 * it reports no devices, and any attempt to compute says how to get the real
 * backend. Keeps callers free of #ifdef KILN_CUDA. */
#include "cuda.h"

#include <stdio.h>

#define KN_CUDA_MISSING "kiln was built without CUDA (configure with -DKILN_CUDA=ON)"

static int missing(char *err, size_t errlen) {
  if (err && errlen > 0) snprintf(err, errlen, "%s", KN_CUDA_MISSING);
  return -1;
}

int kn_cuda_device_count(int *count, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  if (count) *count = 0;
  return 0;
}

int kn_cuda_device_name(int device, char *name, size_t len, char *err, size_t errlen) {
  (void)device;
  if (name && len > 0) name[0] = '\0';
  return missing(err, errlen);
}

int kn_cuda_matmul(const float *a, const float *b, float *c, int m, int n, int k, int trans_a,
                   int trans_b, char *err, size_t errlen) {
  (void)a;
  (void)b;
  (void)c;
  (void)m;
  (void)n;
  (void)k;
  (void)trans_a;
  (void)trans_b;
  return missing(err, errlen);
}

int kn_cuda_relu(const float *x, float *y, size_t n, char *err, size_t errlen) {
  (void)x;
  (void)y;
  (void)n;
  return missing(err, errlen);
}

int kn_cuda_relu_grad(const float *dy, const float *y, float *dx, size_t n, char *err,
                      size_t errlen) {
  (void)dy;
  (void)y;
  (void)dx;
  (void)n;
  return missing(err, errlen);
}

int kn_cuda_set_device(int device, char *err, size_t errlen) {
  (void)device;
  return missing(err, errlen);
}

int kn_nccl_unique_id(unsigned char id[KN_NCCL_ID_BYTES], char *err, size_t errlen) {
  (void)id;
  return missing(err, errlen);
}

int kn_nccl_open(const unsigned char id[KN_NCCL_ID_BYTES], int nranks, int rank, int device,
                 size_t capacity, double timeout_s, kn_nccl **out, char *err, size_t errlen) {
  (void)id;
  (void)nranks;
  (void)rank;
  (void)device;
  (void)capacity;
  (void)timeout_s;
  *out = NULL;
  return missing(err, errlen);
}

int kn_nccl_start(kn_nccl *c, float *host, size_t at, size_t n, char *err, size_t errlen) {
  (void)c;
  (void)host;
  (void)at;
  (void)n;
  return missing(err, errlen);
}

int kn_nccl_wait(kn_nccl *c, char *err, size_t errlen) {
  (void)c;
  return missing(err, errlen);
}

void kn_nccl_close(kn_nccl *c) {
  (void)c; /* never opened here */
}
