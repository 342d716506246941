/* gemm.c — kiln's bf16 GEMM against OpenBLAS sgemm at the Fashion-MNIST
 * CNN's GEMM shapes (batch 128), forward and backward: GFLOP/s of each and
 * their ratio, one JSON line per shape. The bf16 GEMM reads bf16 operands
 * (as mixed_bfloat16 graphs give it) and sgemm f32 ones; both write f32.
 *
 *   kiln-bench-gemm THREADS [REPEATS] [portable]
 *
 * portable: the kernel CPUs without AVX512-BF16 run (the AVX2 path). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

typedef struct shape {
  const char *name;
  int m, n, k, trans_a, trans_b;
} shape;

/* conv1 (1 -> 32, 28x28), conv2 (32 -> 64, 14x14) as im2col GEMMs, dense
 * 3136 -> 128; dW = cols^T dY, dX = dY W^T. */
static const shape shapes[] = {
    {"conv1 forward", 128 * 784, 32, 9, 0, 0}, {"conv2 forward", 128 * 196, 64, 288, 0, 0},
    {"conv2 dW", 288, 64, 128 * 196, 1, 0},    {"conv2 dX (columns)", 128 * 196, 288, 64, 0, 1},
    {"dense1 forward", 128, 128, 3136, 0, 0},  {"dense1 dW", 3136, 128, 128, 1, 0},
    {"square 1024", 1024, 1024, 1024, 0, 0},
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: kiln-bench-gemm THREADS [REPEATS] [portable]\n");
    return 2;
  }
  const int threads = atoi(argv[1]), repeats = argc > 2 ? atoi(argv[2]) : 5;
  if (threads < 1 || repeats < 1) {
    fprintf(stderr, "kiln-bench-gemm: THREADS and REPEATS must be >= 1\n");
    return 2;
  }
  char err[256];
  if (argc > 3 && strcmp(argv[3], "portable") == 0 &&
      kn_cpu_set_isa(KN_ISA_AVX2, err, sizeof err) != KN_OK) {
    fprintf(stderr, "kiln-bench-gemm: %s\n", err);
    return 1;
  }
  openblas_set_num_threads(threads);
  kn_gemm *ctx = kn_gemm_new(threads);
  if (!ctx) {
    fprintf(stderr, "kiln-bench-gemm: cannot start %d threads\n", threads);
    return 1;
  }
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const shape *sh = &shapes[s];
    size_t na = (size_t)sh->m * sh->k, nb = (size_t)sh->k * sh->n, nc = (size_t)sh->m * sh->n;
    float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b), *c = malloc(nc * sizeof *c);
    uint16_t *a16 = malloc(na * sizeof *a16), *b16 = malloc(nb * sizeof *b16);
    for (size_t i = 0; i < na; i++) a16[i] = to_bf16(a[i] = (float)(i % 13) * 0.1f - 0.6f);
    for (size_t i = 0; i < nb; i++) b16[i] = to_bf16(b[i] = (float)(i % 7) * 0.2f - 0.5f);
    const int lda = sh->trans_a ? sh->m : sh->k, ldb = sh->trans_b ? sh->k : sh->n;
    double best[2] = {1e30, 1e30};
    for (int r = -1; r < repeats; r++) { /* one warm-up */
      double t0 = now();
      if (kn_gemm_bf16(ctx, sh->m, sh->n, sh->k, a16, KN_BF16, lda, sh->trans_a, b16, KN_BF16, ldb,
                       sh->trans_b, c, sh->n, 0, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
      }
      double t1 = now();
      cblas_sgemm(CblasRowMajor, sh->trans_a ? CblasTrans : CblasNoTrans,
                  sh->trans_b ? CblasTrans : CblasNoTrans, sh->m, sh->n, sh->k, 1.0f, a, lda, b,
                  ldb, 0.0f, c, sh->n);
      double t2 = now();
      if (r >= 0) {
        best[0] = t1 - t0 < best[0] ? t1 - t0 : best[0];
        best[1] = t2 - t1 < best[1] ? t2 - t1 : best[1];
      }
    }
    const double flops = 2.0 * sh->m * sh->n * sh->k;
    printf("{\"shape\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,\"threads\":%d,\"kernel\":\"%s\","
           "\"bf16_gflops\":%.1f,\"sgemm_gflops\":%.1f,\"ratio\":%.2f}\n",
           sh->name, sh->m, sh->n, sh->k, threads, kn_gemm_kernel_name(kn_gemm_bf16_kernel()),
           flops / best[0] / 1e9, flops / best[1] / 1e9, best[1] / best[0]);
    free(a);
    free(b);
    free(c);
    free(a16);
    free(b16);
  }
  kn_gemm_free(ctx);
  return 0;
}
