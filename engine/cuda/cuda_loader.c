/* cuda_loader.c — cuda.h: the backend is the shared module kiln_cuda
 * (cuda.cu, built with KILN_CUDA=ON and linked with cudart, cuBLAS and
 * NCCL), opened with dlopen the first time the engine needs it, so a
 * process that never touches a GPU never maps those libraries (they would
 * add about 150 MiB to every process's resident memory). The module is
 * the one KILN_CUDA_MODULE in the environment names (a module built
 * elsewhere, or the tests' host-memory stand-in), else the one the build
 * made (KILN_CUDA_MODULE_PATH), else libkiln_cuda.so on the loader's
 * search path. A module that can't be opened reads as "no CUDA device",
 * and any computation reports why (in a build without CUDA: that it was
 * built without). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda.h"
#include "cuda_module.h"

static struct {
  pthread_once_t once;
  int ok;
  char why[512];
  int (*device_count)(int *, char *, size_t);
  int (*device_name)(int, char *, size_t, char *, size_t);
  int (*matmul)(const float *, const float *, float *, int, int, int, int, int, char *, size_t);
  int (*relu)(const float *, float *, size_t, char *, size_t);
  int (*relu_grad)(const float *, const float *, float *, size_t, char *, size_t);
  int (*dev_matmul)(const float *, const float *, float *, int, int, int, int, int, int, char *,
                    size_t);
  int (*dev_im2col)(const kn_cuda_windows *, const float *, float *, char *, size_t);
  int (*dev_col2im)(const kn_cuda_windows *, const float *, float *, char *, size_t);
  int (*dev_pool)(const kn_cuda_windows *, const float *, float *, char *, size_t);
  int (*dev_pool_grad)(const kn_cuda_windows *, const float *, const float *, const float *,
                       float *, char *, size_t);
  int (*dev_cast)(const void *, void *, size_t, int, char *, size_t);
  int (*dev_fill)(float *, size_t, float, char *, size_t);
  int (*dev_xent_dense)(const float *, const float *, float *, size_t, size_t, char *, size_t);
  int (*dev_xent_dense_grad)(const float *, const float *, const float *, float *, size_t, size_t,
                             char *, size_t);
  int (*dev_bce_logits)(const float *, const float *, float *, size_t, char *, size_t);
  int (*dev_bce_logits_grad)(const float *, const float *, const float *, float *, size_t, char *,
                             size_t);
  int (*dev_softmax_xent)(const float *, const int32_t *, float *, size_t, size_t, char *, size_t);
  int (*dev_softmax_xent_grad)(const float *, const int32_t *, const float *, float *, size_t,
                               size_t, char *, size_t);
  int (*dev_copy_rows)(float *, size_t, const float *, size_t, size_t, size_t, char *, size_t);
  int (*dev_dwconv)(const kn_cuda_windows *, int, int, const float *, const float *, float *,
                    char *, size_t);
  int (*dev_binary)(const float *, const float *, float *, size_t, int, char *, size_t);
  int (*dev_unary)(const float *, float *, size_t, int, float, char *, size_t);
  int (*dev_unary_grad)(const float *, const float *, const float *, float *, size_t, int, float,
                        char *, size_t);
  int (*dev_reduce)(const float *, float *, size_t, size_t, size_t, int, char *, size_t);
  int (*dev_reduce_grad)(const float *, const float *, const float *, float *, size_t, size_t,
                         size_t, int, char *, size_t);
  int (*dev_bn_stats)(const float *, float *, float *, float *, size_t, size_t, float, float, int,
                      char *, size_t);
  int (*dev_bn_apply)(const float *, const float *, const float *, const float *, float *, size_t,
                      size_t, char *, size_t);
  int (*dev_bn_grad)(const float *, const float *, const float *, const float *, float *, float *,
                     float *, size_t, size_t, char *, size_t);
  int (*dev_dropout_mask)(float *, size_t, uint64_t, uint64_t, uint64_t, uint32_t, float, char *,
                          size_t);
  int (*dev_relu)(const float *, float *, size_t, char *, size_t);
  int (*dev_relu_grad)(const float *, const float *, float *, size_t, char *, size_t);
  int (*dev_bias_add)(const float *, const float *, float *, size_t, size_t, int, char *, size_t);
  int (*dev_reduce_rows)(const float *, float *, size_t, size_t, char *, size_t);
  int (*dev_copy)(void *, const void *, size_t, char *, size_t);
  int (*dev_optimizer_step)(const kn_step_consts *, float *, const float *, float *, float *,
                            size_t, char *, size_t);
  int (*set_device)(int, char *, size_t);
  int (*alloc)(int, size_t, void **, char *, size_t);
  void (*free)(int, void *);
  int (*copy_in)(int, void *, const void *, size_t, char *, size_t);
  int (*copy_out)(int, void *, const void *, size_t, char *, size_t);
  int (*host_register)(void *, size_t, char *, size_t); /* NULL: the module has none */
  void (*host_unregister)(void *);
  int (*nccl_unique_id)(unsigned char *, char *, size_t);
  int (*nccl_open)(const unsigned char *, int, int, int, size_t, double, kn_nccl **, char *,
                   size_t);
  int (*nccl_start)(kn_nccl *, float *, size_t, size_t, char *, size_t);
  int (*nccl_wait)(kn_nccl *, char *, size_t);
  void (*nccl_close)(kn_nccl *);
} mod = {.once = PTHREAD_ONCE_INIT};

/* dlsym's void * to a function pointer, as POSIX allows. */
#define FIND(field, name)                                                                          \
  do {                                                                                             \
    *(void **)(&mod.field) = dlsym(h, name);                                                       \
    if (!mod.field) {                                                                              \
      snprintf(mod.why, sizeof mod.why, "the CUDA module lacks %s", name);                         \
      return;                                                                                      \
    }                                                                                              \
  } while (0)

static void open_module(void) {
  const char *path = getenv("KILN_CUDA_MODULE");
  void *h = NULL;
  if (path && *path) {
    if (!(h = dlopen(path, RTLD_NOW | RTLD_LOCAL))) {
      snprintf(mod.why, sizeof mod.why,
               "the CUDA module KILN_CUDA_MODULE names could not be "
               "loaded: %s",
               dlerror());
      return;
    }
  }
#ifdef KILN_CUDA_MODULE_PATH
  if (!h) h = dlopen(KILN_CUDA_MODULE_PATH, RTLD_NOW | RTLD_LOCAL);
  if (!h) h = dlopen("libkiln_cuda.so", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(mod.why, sizeof mod.why, "the CUDA module could not be loaded: %s", dlerror());
    return;
  }
#else
  if (!h) {
    snprintf(mod.why, sizeof mod.why,
             "kiln was built without CUDA (configure with -DKILN_CUDA=ON)");
    return;
  }
#endif
  FIND(device_count, "kiln_cuda_module_device_count");
  FIND(device_name, "kiln_cuda_module_device_name");
  FIND(matmul, "kiln_cuda_module_matmul");
  FIND(relu, "kiln_cuda_module_relu");
  FIND(relu_grad, "kiln_cuda_module_relu_grad");
  FIND(dev_matmul, "kiln_cuda_module_dev_matmul");
  FIND(dev_im2col, "kiln_cuda_module_dev_im2col");
  FIND(dev_col2im, "kiln_cuda_module_dev_col2im");
  FIND(dev_pool, "kiln_cuda_module_dev_pool");
  FIND(dev_pool_grad, "kiln_cuda_module_dev_pool_grad");
  FIND(dev_cast, "kiln_cuda_module_dev_cast");
  FIND(dev_fill, "kiln_cuda_module_dev_fill");
  FIND(dev_xent_dense, "kiln_cuda_module_dev_xent_dense");
  FIND(dev_xent_dense_grad, "kiln_cuda_module_dev_xent_dense_grad");
  FIND(dev_bce_logits, "kiln_cuda_module_dev_bce_logits");
  FIND(dev_bce_logits_grad, "kiln_cuda_module_dev_bce_logits_grad");
  FIND(dev_softmax_xent, "kiln_cuda_module_dev_softmax_xent");
  FIND(dev_softmax_xent_grad, "kiln_cuda_module_dev_softmax_xent_grad");
  FIND(dev_copy_rows, "kiln_cuda_module_dev_copy_rows");
  FIND(dev_dwconv, "kiln_cuda_module_dev_dwconv");
  FIND(dev_binary, "kiln_cuda_module_dev_binary");
  FIND(dev_unary, "kiln_cuda_module_dev_unary");
  FIND(dev_unary_grad, "kiln_cuda_module_dev_unary_grad");
  FIND(dev_reduce, "kiln_cuda_module_dev_reduce");
  FIND(dev_reduce_grad, "kiln_cuda_module_dev_reduce_grad");
  FIND(dev_bn_stats, "kiln_cuda_module_dev_bn_stats");
  FIND(dev_bn_apply, "kiln_cuda_module_dev_bn_apply");
  FIND(dev_bn_grad, "kiln_cuda_module_dev_bn_grad");
  FIND(dev_dropout_mask, "kiln_cuda_module_dev_dropout_mask");
  FIND(dev_relu, "kiln_cuda_module_dev_relu");
  FIND(dev_relu_grad, "kiln_cuda_module_dev_relu_grad");
  FIND(dev_bias_add, "kiln_cuda_module_dev_bias_add");
  FIND(dev_reduce_rows, "kiln_cuda_module_dev_reduce_rows");
  FIND(dev_optimizer_step, "kiln_cuda_module_dev_optimizer_step");
  FIND(dev_copy, "kiln_cuda_module_dev_copy");
  FIND(set_device, "kiln_cuda_module_set_device");
  FIND(alloc, "kiln_cuda_module_alloc");
  FIND(free, "kiln_cuda_module_free");
  FIND(copy_in, "kiln_cuda_module_copy_in");
  FIND(copy_out, "kiln_cuda_module_copy_out");
  FIND(nccl_unique_id, "kiln_cuda_module_nccl_unique_id");
  FIND(nccl_open, "kiln_cuda_module_nccl_open");
  FIND(nccl_start, "kiln_cuda_module_nccl_start");
  FIND(nccl_wait, "kiln_cuda_module_nccl_wait");
  FIND(nccl_close, "kiln_cuda_module_nccl_close");
  /* optional: a module without them (an older one, a stand-in) copies
   * from pageable memory */
  *(void **)(&mod.host_register) = dlsym(h, "kiln_cuda_module_host_register");
  *(void **)(&mod.host_unregister) = dlsym(h, "kiln_cuda_module_host_unregister");
  if (!mod.host_register || !mod.host_unregister) mod.host_register = NULL;
  mod.ok = 1;
}

/* Whether the module is open; if not, the reason in err. */
static int loaded(char *err, size_t errlen) {
  pthread_once(&mod.once, open_module);
  if (!mod.ok && err && errlen > 0) snprintf(err, errlen, "%s", mod.why);
  return mod.ok;
}

int kn_cuda_device_count(int *count, char *err, size_t errlen) {
  if (!loaded(NULL, 0)) {
    if (count) *count = 0; /* as a machine without a GPU */
    return 0;
  }
  return mod.device_count(count, err, errlen);
}

int kn_cuda_device_name(int device, char *name, size_t len, char *err, size_t errlen) {
  if (name && len > 0) name[0] = '\0';
  return loaded(err, errlen) ? mod.device_name(device, name, len, err, errlen) : -1;
}

int kn_cuda_matmul(const float *a, const float *b, float *c, int m, int n, int k, int trans_a,
                   int trans_b, char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.matmul(a, b, c, m, n, k, trans_a, trans_b, err, errlen) : -1;
}

int kn_cuda_relu(const float *x, float *y, size_t n, char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.relu(x, y, n, err, errlen) : -1;
}

int kn_cuda_relu_grad(const float *dy, const float *y, float *dx, size_t n, char *err,
                      size_t errlen) {
  return loaded(err, errlen) ? mod.relu_grad(dy, y, dx, n, err, errlen) : -1;
}

int kn_cuda_dev_matmul(const float *a, const float *b, float *c, int m, int n, int k, int trans_a,
                       int trans_b, kn_cuda_math math, char *err, size_t errlen) {
  return loaded(err, errlen)
             ? mod.dev_matmul(a, b, c, m, n, k, trans_a, trans_b, (int)math, err, errlen)
             : -1;
}
int kn_cuda_dev_im2col(const kn_cuda_windows *w, const float *x, float *cols, char *err,
                       size_t errlen) {
  return loaded(err, errlen) ? mod.dev_im2col(w, x, cols, err, errlen) : -1;
}
int kn_cuda_dev_col2im(const kn_cuda_windows *w, const float *cols, float *dx, char *err,
                       size_t errlen) {
  return loaded(err, errlen) ? mod.dev_col2im(w, cols, dx, err, errlen) : -1;
}
int kn_cuda_dev_pool(const kn_cuda_windows *w, const float *x, float *y, char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.dev_pool(w, x, y, err, errlen) : -1;
}
int kn_cuda_dev_pool_grad(const kn_cuda_windows *w, const float *dy, const float *x, const float *y,
                          float *dx, char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.dev_pool_grad(w, dy, x, y, dx, err, errlen) : -1;
}
int kn_cuda_dev_binary(const float *a, const float *b, float *y, size_t n, int op, char *err,
                       size_t errlen) {
  return loaded(err, errlen) ? mod.dev_binary(a, b, y, n, op, err, errlen) : -1;
}
int kn_cuda_dev_unary(const float *x, float *y, size_t n, int op, float alpha, char *err,
                      size_t errlen) {
  return loaded(err, errlen) ? mod.dev_unary(x, y, n, op, alpha, err, errlen) : -1;
}
int kn_cuda_dev_unary_grad(const float *dy, const float *x, const float *y, float *dx, size_t n,
                           int op, float alpha, char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.dev_unary_grad(dy, x, y, dx, n, op, alpha, err, errlen) : -1;
}
int kn_cuda_dev_reduce(const float *x, float *y, size_t outer, size_t len, size_t inner, int kind,
                       char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.dev_reduce(x, y, outer, len, inner, kind, err, errlen) : -1;
}
int kn_cuda_dev_reduce_grad(const float *dy, const float *x, const float *y, float *dx,
                            size_t outer, size_t len, size_t inner, int kind, char *err,
                            size_t errlen) {
  return loaded(err, errlen)
             ? mod.dev_reduce_grad(dy, x, y, dx, outer, len, inner, kind, err, errlen)
             : -1;
}
int kn_cuda_dev_bn_stats(const float *x, float *moving_mean, float *moving_var, float *stats,
                         size_t rows, size_t C, float momentum, float epsilon, int training,
                         char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.dev_bn_stats(x, moving_mean, moving_var, stats, rows, C,
                                                momentum, epsilon, training, err, errlen)
                             : -1;
}
int kn_cuda_dev_bn_apply(const float *x, const float *stats, const float *gamma, const float *beta,
                         float *y, size_t rows, size_t C, char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.dev_bn_apply(x, stats, gamma, beta, y, rows, C, err, errlen)
                             : -1;
}
int kn_cuda_dev_bn_grad(const float *dy, const float *x, const float *stats, const float *gamma,
                        float *dx, float *dgamma, float *dbeta, size_t rows, size_t C, char *err,
                        size_t errlen) {
  return loaded(err, errlen)
             ? mod.dev_bn_grad(dy, x, stats, gamma, dx, dgamma, dbeta, rows, C, err, errlen)
             : -1;
}
int kn_cuda_dev_dropout_mask(float *m, size_t n, uint64_t seed, uint64_t step, uint64_t first,
                             uint32_t threshold, float keep, char *err, size_t errlen) {
  return loaded(err, errlen)
             ? mod.dev_dropout_mask(m, n, seed, step, first, threshold, keep, err, errlen)
             : -1;
}
int kn_cuda_dev_dwconv(const kn_cuda_windows *w, int M, int mode, const float *a, const float *b,
                       float *out, char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.dev_dwconv(w, M, mode, a, b, out, err, errlen) : -1;
}
int kn_cuda_dev_copy_rows(float *dst, size_t dst_pitch, const float *src, size_t src_pitch,
                          size_t rows, size_t len, char *err, size_t errlen) {
  return loaded(err, errlen)
             ? mod.dev_copy_rows(dst, dst_pitch, src, src_pitch, rows, len, err, errlen)
             : -1;
}
int kn_cuda_dev_xent_dense(const float *logits, const float *probs, float *loss, size_t rows,
                           size_t cols, char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.dev_xent_dense(logits, probs, loss, rows, cols, err, errlen)
                             : -1;
}
int kn_cuda_dev_xent_dense_grad(const float *logits, const float *probs, const float *dloss,
                                float *dx, size_t rows, size_t cols, char *err, size_t errlen) {
  return loaded(err, errlen)
             ? mod.dev_xent_dense_grad(logits, probs, dloss, dx, rows, cols, err, errlen)
             : -1;
}
int kn_cuda_dev_bce_logits(const float *x, const float *t, float *loss, size_t n, char *err,
                           size_t errlen) {
  return loaded(err, errlen) ? mod.dev_bce_logits(x, t, loss, n, err, errlen) : -1;
}
int kn_cuda_dev_bce_logits_grad(const float *x, const float *t, const float *dloss, float *dx,
                                size_t n, char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.dev_bce_logits_grad(x, t, dloss, dx, n, err, errlen) : -1;
}
int kn_cuda_dev_fill(float *y, size_t n, float value, char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.dev_fill(y, n, value, err, errlen) : -1;
}
int kn_cuda_dev_softmax_xent(const float *logits, const int32_t *labels, float *loss, size_t rows,
                             size_t cols, char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.dev_softmax_xent(logits, labels, loss, rows, cols, err, errlen)
                             : -1;
}
int kn_cuda_dev_softmax_xent_grad(const float *logits, const int32_t *labels, const float *dloss,
                                  float *dx, size_t rows, size_t cols, char *err, size_t errlen) {
  return loaded(err, errlen)
             ? mod.dev_softmax_xent_grad(logits, labels, dloss, dx, rows, cols, err, errlen)
             : -1;
}
int kn_cuda_dev_cast(const void *x, void *y, size_t n, kn_cuda_cast mode, char *err,
                     size_t errlen) {
  return loaded(err, errlen) ? mod.dev_cast(x, y, n, (int)mode, err, errlen) : -1;
}

int kn_cuda_dev_relu(const float *x, float *y, size_t n, char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.dev_relu(x, y, n, err, errlen) : -1;
}

int kn_cuda_dev_relu_grad(const float *dy, const float *y, float *dx, size_t n, char *err,
                          size_t errlen) {
  return loaded(err, errlen) ? mod.dev_relu_grad(dy, y, dx, n, err, errlen) : -1;
}

int kn_cuda_dev_bias_add(const float *x, const float *b, float *y, size_t rows, size_t cols,
                         int relu, char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.dev_bias_add(x, b, y, rows, cols, relu, err, errlen) : -1;
}

int kn_cuda_dev_reduce_rows(const float *x, float *out, size_t rows, size_t cols, char *err,
                            size_t errlen) {
  return loaded(err, errlen) ? mod.dev_reduce_rows(x, out, rows, cols, err, errlen) : -1;
}

int kn_cuda_dev_optimizer_step(const kn_step_consts *c, float *p, const float *g, float *m,
                               float *v, size_t n, char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.dev_optimizer_step(c, p, g, m, v, n, err, errlen) : -1;
}

int kn_cuda_dev_copy(void *dst, const void *src, size_t bytes, char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.dev_copy(dst, src, bytes, err, errlen) : -1;
}

int kn_cuda_set_device(int device, char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.set_device(device, err, errlen) : -1;
}

int kn_cuda_alloc(int device, size_t bytes, void **out, char *err, size_t errlen) {
  *out = NULL;
  return loaded(err, errlen) ? mod.alloc(device, bytes, out, err, errlen) : -1;
}

void kn_cuda_free(int device, void *p) {
  if (p && loaded(NULL, 0)) mod.free(device, p);
}

int kn_cuda_copy_in(int device, void *dst, const void *host, size_t bytes, char *err,
                    size_t errlen) {
  return loaded(err, errlen) ? mod.copy_in(device, dst, host, bytes, err, errlen) : -1;
}

int kn_cuda_copy_out(int device, void *host, const void *src, size_t bytes, char *err,
                     size_t errlen) {
  return loaded(err, errlen) ? mod.copy_out(device, host, src, bytes, err, errlen) : -1;
}

int kn_cuda_host_register(void *p, size_t bytes, char *err, size_t errlen) {
  if (!loaded(err, errlen)) return -1;
  if (!mod.host_register) {
    snprintf(err, errlen,
             "the CUDA module cannot pin host memory (no kiln_cuda_module_host_register)");
    return -1;
  }
  return mod.host_register(p, bytes, err, errlen);
}

void kn_cuda_host_unregister(void *p) {
  if (p && loaded(NULL, 0) && mod.host_register) mod.host_unregister(p);
}

int kn_nccl_unique_id(unsigned char id[KN_NCCL_ID_BYTES], char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.nccl_unique_id(id, err, errlen) : -1;
}

int kn_nccl_open(const unsigned char id[KN_NCCL_ID_BYTES], int nranks, int rank, int device,
                 size_t capacity, double timeout_s, kn_nccl **out, char *err, size_t errlen) {
  *out = NULL;
  return loaded(err, errlen)
             ? mod.nccl_open(id, nranks, rank, device, capacity, timeout_s, out, err, errlen)
             : -1;
}

int kn_nccl_start(kn_nccl *c, float *host, size_t at, size_t n, char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.nccl_start(c, host, at, n, err, errlen) : -1;
}

int kn_nccl_wait(kn_nccl *c, char *err, size_t errlen) {
  return loaded(err, errlen) ? mod.nccl_wait(c, err, errlen) : -1;
}

void kn_nccl_close(kn_nccl *c) {
  if (c && loaded(NULL, 0)) mod.nccl_close(c);
}
