/* The bf16 GEMM: every shape tail, transpose, operand type and thread count
 * against a double-precision reference over the same bf16-rounded
 * operands, the AVX512-BF16 kernel against the portable one, its
 * argument checks, and a convolution of small depth run directly.
 * test_precision.c shows graphs running it. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "amx.h"
#include "engine.h"
#include "graph_internal.h"
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include "narrow_avx512.h"
#define HAVE_NATIVE_BF16_HELPERS 1
#endif

static float bf16_round(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t bf16_bits(float f) {
  uint32_t u;
  f = bf16_round(f);
  memcpy(&u, &f, sizeof u);
  return (uint16_t)(u >> 16);
}

static uint64_t lcg = 12345;
static float uniform_pm1(void) {
  lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)((lcg >> 40) / (double)(1u << 24)) * 2.0f - 1.0f;
}

/* A (rows, cols) matrix stored as f32 and as its bf16 bits. */
typedef struct matrix {
  int rows, cols;
  float *f32;
  uint16_t *bf16;
} matrix;

/* Uniform in [-1, 1), or (small) integers in [-4, 4]: bf16 holds those
 * exactly, and every partial sum of up to 2^19 of their products is an
 * integer below 2^24, so a GEMM of them must be exact in f32. */
static matrix random_matrix(int rows, int cols, int small) {
  matrix m = {rows, cols, malloc((size_t)rows * cols * sizeof(float)),
              malloc((size_t)rows * cols * sizeof(uint16_t))};
  for (int i = 0; i < rows * cols; i++) {
    m.f32[i] = small ? (float)(int)(uniform_pm1() * 4.5f) : uniform_pm1();
    m.bf16[i] = bf16_bits(m.f32[i]);
  }
  return m;
}

static void matrix_free(matrix *m) {
  free(m->f32);
  free(m->bf16);
}

/* op(X)[r][c] rounded to bf16, in double. */
static double op_at(const matrix *x, int trans, int r, int c) {
  return bf16_round(trans ? x->f32[(size_t)c * x->cols + r] : x->f32[(size_t)r * x->cols + c]);
}

/* One GEMM against the reference. On small integers it must be exact (a
 * dropped or doubled product shows). Otherwise f32 accumulation of k
 * products, each exact, errs by at most about k * 2^-24 * sum |a b| (a
 * first-order bound on recursive summation); 2x that, plus the old C's
 * rounding when accumulating. */
static void check_shape(kn_gemm *ctx, int m, int n, int k, int ta, int tb, kn_dtype at, kn_dtype bt,
                        int accumulate, int small) {
  matrix A = random_matrix(ta ? k : m, ta ? m : k, small),
         B = random_matrix(tb ? n : k, tb ? k : n, small);
  float *c = malloc((size_t)m * n * sizeof(float)), *c0 = malloc((size_t)m * n * sizeof(float));
  for (int i = 0; i < m * n; i++)
    c[i] = c0[i] = small ? (float)(int)(uniform_pm1() * 4.5f) : uniform_pm1();
  char err[256];
  int rc = kn_gemm_bf16(ctx, m, n, k, at == KN_F32 ? (const void *)A.f32 : A.bf16, at, A.cols, ta,
                        bt == KN_F32 ? (const void *)B.f32 : B.bf16, bt, B.cols, tb, c, n,
                        accumulate, err, sizeof err);
  if (rc) fail_msg("gemm %dx%dx%d: %s", m, n, k, err);
  for (int i = 0; i < m; i++) {
    for (int j = 0; j < n; j++) {
      double ref = accumulate ? c0[(size_t)i * n + j] : 0.0, mag = fabs(ref);
      for (int p = 0; p < k; p++) {
        double prod = op_at(&A, ta, i, p) * op_at(&B, tb, p, j);
        ref += prod;
        mag += fabs(prod);
      }
      double tol = small ? 0.0 : 2.0 * (k + 2) * 0x1p-24 * mag + 1e-30;
      double got = c[(size_t)i * n + j];
      if (!(fabs(got - ref) <= tol))
        fail_msg("gemm m=%d n=%d k=%d ta=%d tb=%d a=%s b=%s acc=%d%s: C[%d][%d] = %.9g, want "
                 "%.9g (tolerance %.3g)",
                 m, n, k, ta, tb, kn_dtype_name(at), kn_dtype_name(bt), accumulate,
                 small ? " small integers" : "", i, j, got, ref, tol);
    }
  }
  free(c);
  free(c0);
  matrix_free(&A);
  matrix_free(&B);
}

static void check_all_shapes(int threads) {
  kn_gemm *ctx = kn_gemm_new(threads);
  assert_non_null(ctx);
  /* Tails of the 12-row and 32-column micro-tile, the 96-row block, the
   * 256-deep block and the 512-column block, odd depths, and 1x1x1; C at
   * most 16 wide (the 24 x 16 tiles): whole, with a row tail, past a
   * 96-row block. */
  static const int shapes[][3] = {
      {1, 1, 1},    {17, 33, 65}, {12, 32, 2},    {13, 31, 3},   {11, 64, 256}, {25, 1, 257},
      {97, 45, 9},  {1, 513, 40}, {130, 7, 600},  {40, 96, 1},   {3, 600, 255}, {200, 70, 513},
      {24, 16, 64}, {49, 16, 30}, {200, 13, 144}, {97, 16, 258}, {9, 16, 5001}, {40, 70, 9000}};
  for (int small = 0; small < 2; small++) {
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      for (int t = 0; t < 4; t++) {
        const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        check_shape(ctx, m, n, k, t & 1, t >> 1, KN_BF16, KN_BF16, 0, small);
        check_shape(ctx, m, n, k, t & 1, t >> 1, (t & 1) ? KN_F32 : KN_BF16,
                    (t & 1) ? KN_BF16 : KN_F32, s % 2, small);
      }
    }
    check_shape(ctx, 29, 35, 70, 0, 0, KN_F32, KN_F32, 1, small);
  }
  kn_gemm_free(ctx);
}

static void bf16_gemm_matches_the_reference_on_every_tail_and_transpose(void **state) {
  (void)state;
  printf("bf16 GEMM kernel: %s\n", kn_gemm_kernel_name(kn_gemm_bf16_kernel()));
  check_all_shapes(1);
  check_all_shapes(3);
}

static void portable_kernel_matches_the_reference_too(void **state) {
  (void)state;
  char err[128];
  /* AVX2 (or the baseline) never takes the AVX512-BF16 kernel. */
  if (kn_cpu_set_isa(KN_ISA_AVX2, err, sizeof err) != KN_OK)
    assert_int_equal(kn_cpu_set_isa(KN_ISA_BASELINE, err, sizeof err), KN_OK);
  assert_int_equal(kn_gemm_bf16_kernel(), KN_GEMM_BF16_PORTABLE);
  check_all_shapes(2);
  assert_int_equal(kn_cpu_set_isa(KN_ISA_AUTO, err, sizeof err), KN_OK);
}

/* The two kernels sum the same exact products in the same order: equal
 * bits on normal values. */
/* A product deep enough to be summed in depth slices (a weight gradient
 * over a batch's pixels): the same bits on 1, 2 and 3 threads, an odd
 * depth included, and added to C's values with accumulate. */
static void deep_products_give_the_same_bits_on_any_thread_count(void **state) {
  (void)state;
  static const int shapes[][3] = {{9, 16, 5001}, {40, 70, 9000}, {144, 16, 20000}};
  char err[128];
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
    matrix A = random_matrix(k, m, 0), B = random_matrix(k, n, 0); /* A^T B, as a dW */
    float *c[3];
    for (int t = 0; t < 3; t++) {
      kn_gemm *ctx = kn_gemm_new(t + 1);
      assert_non_null(ctx);
      c[t] = malloc((size_t)m * n * sizeof(float));
      for (int i = 0; i < m * n; i++) c[t][i] = (float)(i % 7) - 3.0f;
      assert_int_equal(kn_gemm_bf16(ctx, m, n, k, A.bf16, KN_BF16, m, 1, B.bf16, KN_BF16, n, 0,
                                    c[t], n, 1, err, sizeof err),
                       KN_OK);
      kn_gemm_free(ctx);
    }
    assert_memory_equal(c[0], c[1], (size_t)m * n * sizeof(float));
    assert_memory_equal(c[0], c[2], (size_t)m * n * sizeof(float));
    for (int t = 0; t < 3; t++) free(c[t]);
    matrix_free(&A);
    matrix_free(&B);
  }
}

static void avx512bf16_and_portable_kernels_give_the_same_bits(void **state) {
  (void)state;
  char err[128];
  assert_int_equal(kn_cpu_set_isa(KN_ISA_AUTO, err, sizeof err), KN_OK);
  if (kn_gemm_bf16_kernel() != KN_GEMM_BF16_AVX512) {
    printf("this CPU has no AVX512-BF16: only the portable kernel runs, skipped\n");
    skip();
  }
  const int m = 70, n = 45, k = 300;
  matrix A = random_matrix(m, k, 0), B = random_matrix(k, n, 0);
  float *c[2];
  kn_amx_set(0); /* vdpbf16ps: AMX tiles add a pair's products in their own way (amx.h) */
  for (int pass = 0; pass < 2; pass++) {
    assert_int_equal(kn_cpu_set_isa(pass ? KN_ISA_AVX2 : KN_ISA_AUTO, err, sizeof err), KN_OK);
    assert_int_equal(kn_gemm_bf16_kernel(), pass ? KN_GEMM_BF16_PORTABLE : KN_GEMM_BF16_AVX512);
    kn_gemm *ctx = kn_gemm_new(2);
    c[pass] = malloc((size_t)m * n * sizeof(float));
    assert_int_equal(kn_gemm_bf16(ctx, m, n, k, A.bf16, KN_BF16, k, 0, B.f32, KN_F32, n, 0, c[pass],
                                  n, 0, err, sizeof err),
                     KN_OK);
    kn_gemm_free(ctx);
  }
  kn_amx_set(1);
  assert_memory_equal(c[0], c[1], (size_t)m * n * sizeof(float));
  assert_int_equal(kn_cpu_set_isa(KN_ISA_AUTO, err, sizeof err), KN_OK);
  free(c[0]);
  free(c[1]);
  matrix_free(&A);
  matrix_free(&B);
}

/* kn_amx_gemm on the shapes its callers give it: row blocks of 32 and of
 * 24 (16 + 8, Winograd's), one or two 16-column groups, depths one tile
 * step, several (kn_amx_depth's divisor) or with a padded last step, set
 * or added to C. Small integers: every sum must be exact. */
static void amx_tiles_sum_exactly_on_every_block_shape(void **state) {
  (void)state;
  if (!kn_amx_available()) {
    print_message("SKIPPED: this CPU (or kernel) gives no AMX-BF16 tiles\n");
    skip();
  }
  static const int shapes[][4] = {/* rows, r2, cols, pairs */
                                  {24, 8, 16, 8},   {24, 8, 48, 24},  {32, 16, 32, 16},
                                  {64, 16, 16, 17}, {96, 16, 32, 80}, {48, 8, 64, 1}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const int rows = shapes[s][0], r2 = shapes[s][1], cols = shapes[s][2], kp = shapes[s][3];
    const int lda = 2 * kp + 6, ldb = cols + 3, ldc = cols + 5, kt = kn_amx_depth(kp);
    matrix A = random_matrix(rows, lda, 1), B = random_matrix(kp, 2 * ldb, 1);
    float *c = malloc((size_t)rows * ldc * sizeof(float));
    for (int acc = 0; acc < 2; acc++) {
      for (int i = 0; i < rows * ldc; i++) c[i] = (float)(i % 7) - 3.0f;
      kn_amx_configure(kt, r2);
      kn_amx_gemm(rows, cols, kp, kt, r2, A.bf16, lda, (const uint32_t *)(const void *)B.bf16, ldb,
                  c, ldc, acc);
      kn_amx_release();
      for (int i = 0; i < rows; i++) {
        for (int j = 0; j < cols; j++) {
          double ref = acc ? (double)((i * ldc + j) % 7) - 3.0 : 0.0;
          for (int k = 0; k < kp; k++)
            for (int h = 0; h < 2; h++)
              ref += (double)A.f32[(size_t)i * lda + 2 * k + h] *
                     B.f32[(size_t)k * 2 * ldb + 2 * j + h];
          if (c[(size_t)i * ldc + j] != (float)ref)
            fail_msg("amx %dx%dx%d (r2 %d, acc %d): C[%d][%d] = %g, want %g", rows, cols, kp, r2,
                     acc, i, j, c[(size_t)i * ldc + j], ref);
        }
      }
    }
    free(c);
    matrix_free(&A);
    matrix_free(&B);
  }
}

/* The bf16 kernels round with the CPU's own conversion (vcvtneps2bf16,
 * vcvtne2ps2bf16), which flushes subnormals; a vector holding one takes
 * the integer rounding. Bit patterns of every kind (subnormals one lane
 * among normal ones, zeros, infinities, NaNs, ties) against
 * kn_bf16_from_f32 and kn_bf16_round_f32, one value at a time. */
#ifdef HAVE_NATIVE_BF16_HELPERS
__attribute__((target("avx512f,avx512bw"))) static void check_native_rounding(void) {
  const uint32_t special[] = {0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u,
                              0x3f80ffffu, 0x00000001u, 0x807fffffu, 0x7f7fffffu,
                              0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                              0x7f800001u, 0xffffffffu, 0x3effff80u, 0x00400000u};
  uint64_t state = 0x9e3779b97f4a7c15u;
  for (int it = 0; it < 200000; it++) {
    uint32_t u[32];
    for (int l = 0; l < 32; l++) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      u[l] = (uint32_t)state;
      const unsigned kind = (unsigned)(state >> 40) % 64;
      if (it < 16 && l < 16)
        u[l] = special[(it + l) % 16];
      else if (kind == 0)
        u[l] &= 0x807fffffu; /* subnormal (or zero) */
      else if (kind == 1)
        u[l] |= 0x7f800000u; /* infinity or NaN */
      else if (kind == 2)
        u[l] = (u[l] & 0xffff0000u) | 0x8000u; /* a tie */
    }
    __m512 a, b;
    memcpy(&a, u, sizeof a);
    memcpy(&b, u + 16, sizeof b);
    uint16_t got[32], one[16];
    float back[16];
    _mm512_storeu_si512(got, kn_bf16_pack32_native(a, b));
    _mm256_storeu_si256((void *)one, kn_bf16_pack16_native(b));
    _mm512_storeu_ps(back, kn_bf16_round_f32_native(a));
    for (int l = 0; l < 32; l++) {
      float f;
      memcpy(&f, &u[l], sizeof f);
      const uint16_t want = kn_bf16_from_f32(f);
      if (got[l] != want || (l >= 16 && one[l - 16] != want))
        fail_msg("0x%08x: pack32 0x%04x, pack16 0x%04x, want 0x%04x", u[l], got[l],
                 l >= 16 ? one[l - 16] : want, want);
      if (l < 16) {
        const float r = kn_bf16_round_f32(f);
        if (memcmp(&back[l], &r, sizeof r) != 0)
          fail_msg("0x%08x: rounded in f32 to %a, want %a", u[l], (double)back[l], (double)r);
      }
    }
  }
}
#endif

static void the_cpus_own_bf16_conversion_rounds_as_the_definition(void **state) {
  (void)state;
#ifdef HAVE_NATIVE_BF16_HELPERS
  if (!kn_cpu_features_get()->avx512bf16) {
    print_message("this CPU has no AVX512-BF16: no kernel uses its conversion, skipped\n");
    skip();
    return;
  }
  check_native_rounding();
#else
  print_message("not an x86-64 GCC build: no kernel uses the CPU's conversion, skipped\n");
  skip();
#endif
}

static void bad_gemm_arguments_are_refused_by_name(void **state) {
  (void)state;
  kn_gemm *ctx = kn_gemm_new(1);
  float a[4] = {0}, c[4];
  char err[256];
  assert_int_equal(
      kn_gemm_bf16(ctx, 0, 2, 2, a, KN_F32, 2, 0, a, KN_F32, 2, 0, c, 2, 0, err, sizeof err),
      KN_EINVAL);
  assert_non_null(strstr(err, "m, n and k"));
  assert_int_equal(
      kn_gemm_bf16(ctx, 2, 2, 2, a, KN_F16, 2, 0, a, KN_F32, 2, 0, c, 2, 0, err, sizeof err),
      KN_EINVAL);
  assert_non_null(strstr(err, "f16"));
  assert_int_equal(
      kn_gemm_bf16(ctx, 2, 2, 2, a, KN_F32, 1, 0, a, KN_F32, 2, 0, c, 2, 0, err, sizeof err),
      KN_EINVAL);
  assert_non_null(strstr(err, "leading"));
  kn_gemm_free(ctx);
  kn_gemm_free(NULL);
}

/* The first thread count's output (f32 y or, out_bf16, y16) is kept in
 * *first, the other buffer freed; a later one's must have its bits. */
static void keep_or_compare(void **first, float *y, uint16_t *y16, int out_bf16, size_t n) {
  void *got = out_bf16 ? (void *)y16 : (void *)y;
  if (!*first) {
    *first = got;
    if (out_bf16)
      free(y);
    else
      free(y16);
    return;
  }
  assert_memory_equal(*first, got, n * (out_bf16 ? 2 : 4));
  free(y);
  free(y16);
}

/* A forward convolution of small depth (taps x channels <= 32, a first
 * layer) reads its columns in place from the padded input and sums its
 * products directly (with the AVX512-BF16 kernel; the portable GEMM, run
 * after it, is held to the same): against the definition
 * in double over the same bf16 values (32 or fewer products in f32), with
 * bias and relu, f32 out (with its bf16 copy) or bf16 out, f32 or bf16
 * input, 1 and 3 channels, strides 1 and 2, filters around the 16-wide
 * vectors; the same bits on 1 and 3 threads. */
static void check_small_convolutions(void) {
  print_message("%s\n", kn_gemm_bf16_kernel() == KN_GEMM_BF16_AVX512
                            ? "AVX512-BF16: the direct small convolution runs these"
                            : "the portable bf16 GEMM runs these");
  const int chans[] = {1, 3}, filters[] = {10, 16, 32, 40, 64}, strides[] = {1, 2};
  const int B = 3, HP = 11, WP = 13, KH = 3, KW = 3; /* rows of 11 or 6: blocks cut at row ends */
  for (size_t ci = 0; ci < 2; ci++)
    for (size_t fi = 0; fi < 5; fi++)
      for (size_t si = 0; si < 2; si++)
        for (int mode = 0; mode < 4; mode++) { /* bit 0: bf16 input; bit 1: bf16 output */
          const int C = chans[ci], F = filters[fi], S = strides[si], K = KH * KW * C;
          const int OH = (HP - KH) / S + 1, OW = (WP - KW) / S + 1, M = B * OH * OW;
          const int in_bf16 = mode & 1, out_bf16 = mode & 2;
          const size_t nx = (size_t)B * HP * WP * C;
          float *x = malloc(nx * sizeof *x), *w = malloc((size_t)K * F * sizeof *w);
          uint16_t *x16 = malloc(nx * 2), *w16 = malloc((size_t)K * F * 2);
          float bias[64];
          for (size_t i = 0; i < nx; i++) x[i] = kn_bf16_to_f32(x16[i] = bf16_bits(uniform_pm1()));
          for (int i = 0; i < K * F; i++) w[i] = kn_bf16_to_f32(w16[i] = bf16_bits(uniform_pm1()));
          for (int f = 0; f < F; f++) bias[f] = uniform_pm1();
          const kn_conv_cols cols = {
              in_bf16 ? (const void *)x16 : x, HP, WP, C, KW, S, S, 1, 1, OH, OW};
          void *first = NULL;
          for (int threads = 1; threads <= 3; threads += 2) {
            kn_pool *pool = kn_pool_new(threads);
            void *scratch = aligned_alloc(64, kn_gemm_scratch_bytes(threads, K));
            float *y = malloc((size_t)M * F * sizeof *y);
            uint16_t *y16 = malloc((size_t)M * F * 2), *copy = malloc((size_t)M * F * 2);
            memset(y, 0xff, (size_t)M * F * sizeof *y);
            kn_gemm_run(
                pool, scratch, M, F, K,
                (kn_gemm_operand){NULL, in_bf16 ? KN_BF16 : KN_F32, K, 0, &cols, NULL, NULL, NULL},
                (kn_gemm_operand){w16, KN_BF16, F, 0, NULL, NULL, NULL, NULL},
                out_bf16 ? (void *)y16 : (void *)y, out_bf16 ? KN_BF16 : KN_F32, F, 0, bias, 1,
                out_bf16 ? NULL : copy);
            for (int p = 0; p < M; p++) {
              const int b = p / (OH * OW), oy = p / OW % OH, ox = p % OW;
              for (int f = 0; f < F; f++) {
                double sum = 0.0;
                for (int ki = 0; ki < KH; ki++)
                  for (int kj = 0; kj < KW; kj++)
                    for (int c = 0; c < C; c++)
                      sum +=
                          (double)x[(((size_t)b * HP + oy * S + ki) * WP + ox * S + kj) * C + c] *
                          w[((ki * KW + kj) * C + c) * F + f];
                sum += bias[f];
                sum = sum < 0 ? 0 : sum;
                const size_t o = (size_t)p * F + f;
                const float got = out_bf16 ? kn_bf16_to_f32(y16[o]) : y[o];
                if (!out_bf16) assert_int_equal(copy[o], bf16_bits(got));
                const double tol = out_bf16 ? 0x1p-8 * fabs(sum) + 1e-6 : 1e-5 * (1 + fabs(sum));
                if (fabs(got - sum) > tol)
                  fail_msg("C %d, F %d, stride %d, mode %d: y[%d][%d] %g, want %g", C, F, S, mode,
                           p, f, (double)got, sum);
              }
            }
            keep_or_compare(&first, y, y16, out_bf16, (size_t)M * F);
            free(copy);
            free(scratch);
            kn_pool_free(pool);
          }
          free(first);
          free(x), free(w), free(x16), free(w16);
        }
}

static void small_depth_convolutions_match_the_definition(void **state) {
  (void)state;
  char err[128];
  check_small_convolutions();
  /* and on the portable kernel (AVX2 or the baseline never take the
   * AVX512-BF16 one, nor the direct path) */
  if (kn_cpu_set_isa(KN_ISA_AVX2, err, sizeof err) != KN_OK)
    assert_int_equal(kn_cpu_set_isa(KN_ISA_BASELINE, err, sizeof err), KN_OK);
  check_small_convolutions();
  assert_int_equal(kn_cpu_set_isa(KN_ISA_AUTO, err, sizeof err), KN_OK);
}

/* A stride-1 convolution on AMX tiles reads its columns in place (rows of
 * pixels at the padded width, the padding columns' rows dropped): against
 * the definition in double over the same bf16 values, forward (a plain
 * kernel) and as an input gradient (the kernel turned 180 degrees, its
 * channels swapped), 8 to 64 channels (depth chunks of 24 and 32 values),
 * 10 to 64 filters (one or two tile columns, lanes short of 16), images
 * narrower than a tile row and wider, a kernel row dilation of 2, bias and
 * relu, f32 out (with its bf16 copy, added to C's values) or bf16 out; the
 * same bits on 1 and 3 threads. The input is allocated to its last value:
 * the last block reads a zero-padded copy (the sanitizers would see a
 * read past it). */
static void check_tile_convolutions(void) {
  const int chans[] = {8, 16, 24, 64}, filters[] = {10, 16, 40, 64};
  const int sizes[][2] = {{5, 7}, {9, 20}};
  int ran = 0;
  for (size_t ci = 0; ci < 4; ci++)
    for (size_t fi = 0; fi < 4; fi++)
      for (size_t zi = 0; zi < 2; zi++)
        for (int mode = 0; mode < 4; mode++) { /* bit 0: flipped kernel; bit 1: bf16 out */
          const int C = chans[ci], F = filters[fi], B = 3, KH = 3, KW = 3;
          const int DH = zi ? 2 : 1, OH = sizes[zi][0], OW = sizes[zi][1];
          const int HP = OH + (KH - 1) * DH, WP = OW + KW - 1, K = KH * KW * C, M = B * OH * OW;
          const int flip = mode & 1, out_bf16 = mode & 2;
          const size_t nx = (size_t)B * HP * WP * C;
          uint16_t *x16 = malloc(nx * 2), *w16 = malloc((size_t)K * F * 2);
          float bias[64];
          for (size_t i = 0; i < nx; i++) x16[i] = bf16_bits(uniform_pm1());
          for (int i = 0; i < K * F; i++) w16[i] = bf16_bits(uniform_pm1());
          for (int f = 0; f < F; f++) bias[f] = uniform_pm1();
          const kn_conv_cols cols = {x16, HP, WP, C, KW, 1, 1, DH, 1, OH, OW};
          /* flipped: the kernel stored (KH, KW, F, C), read turned around */
          const kn_conv_flip turned = {w16, KH, KW, F, C};
          const kn_gemm_operand a = {NULL, KN_BF16, K, 0, &cols, NULL, NULL, NULL};
          const kn_gemm_operand b =
              flip ? (kn_gemm_operand){NULL, KN_BF16, F, 0, NULL, &turned, NULL, NULL}
                   : (kn_gemm_operand){w16, KN_BF16, F, 0, NULL, NULL, NULL, NULL};
          const kn_dtype ct = out_bf16 ? KN_BF16 : KN_F32;
          if (!kn_gemm_conv_in_place(M, F, K, &a, &b, ct))
            fail_msg("C %d F %d: not in place", C, F);
          ran++;
          void *first = NULL;
          for (int threads = 1; threads <= 3; threads += 2) {
            kn_pool *pool = kn_pool_new(threads);
            void *scratch = aligned_alloc(64, kn_gemm_scratch_bytes(threads, K));
            float *y = malloc((size_t)M * F * sizeof *y);
            uint16_t *y16 = malloc((size_t)M * F * 2), *copy = malloc((size_t)M * F * 2);
            for (size_t i = 0; i < (size_t)M * F; i++) y[i] = 0.5f; /* added to (accumulate) */
            kn_gemm_run(pool, scratch, M, F, K, a, b, out_bf16 ? (void *)y16 : (void *)y, ct, F,
                        !out_bf16, bias, 1, out_bf16 ? NULL : copy);
            for (int p = 0; p < M; p++) {
              const int bi = p / (OH * OW), oy = p / OW % OH, ox = p % OW;
              for (int f = 0; f < F; f++) {
                double sum = out_bf16 ? 0.0 : 0.5, mag = 1.0;
                for (int ki = 0; ki < KH; ki++)
                  for (int kj = 0; kj < KW; kj++)
                    for (int c = 0; c < C; c++) {
                      const double xv = kn_bf16_to_f32(
                          x16[(((size_t)bi * HP + oy + ki * DH) * WP + ox + kj) * C + c]);
                      const size_t wi =
                          flip ? (((size_t)(KH - 1 - ki) * KW + (KW - 1 - kj)) * F + f) * C + c
                               : (((size_t)ki * KW + kj) * C + c) * F + f;
                      const double t = xv * kn_bf16_to_f32(w16[wi]);
                      sum += t;
                      mag += fabs(t);
                    }
                sum += bias[f];
                sum = sum < 0 ? 0 : sum;
                const size_t o = (size_t)p * F + f;
                const float got = out_bf16 ? kn_bf16_to_f32(y16[o]) : y[o];
                if (!out_bf16) assert_int_equal(copy[o], bf16_bits(got));
                const double tol = out_bf16 ? 0x1p-8 * fabs(sum) + 1e-5 * mag : 1e-5 * mag;
                if (fabs(got - sum) > tol)
                  fail_msg("C %d F %d %dx%d dh %d mode %d: y[%d][%d] %g, want %g", C, F, OH, OW, DH,
                           mode, p, f, (double)got, sum);
              }
            }
            keep_or_compare(&first, y, y16, out_bf16, (size_t)M * F);
            free(copy);
            free(scratch);
            kn_pool_free(pool);
          }
          free(first);
          free(x16), free(w16);
        }
  print_message("%d products on the tiles, columns in place\n", ran);
}

static void stride1_convolutions_on_amx_tiles_read_their_columns_in_place(void **state) {
  (void)state;
  if (kn_gemm_bf16_kernel() != KN_GEMM_BF16_AVX512 || !kn_amx_available()) {
    print_message("this CPU has no AMX-BF16 (or KILN_AMX=off): the packed GEMM runs these, "
                  "skipped\n");
    skip();
    return;
  }
  check_tile_convolutions();
}

/* Its weight gradient, cols^T dy over every pixel (taps x filters): slices
 * of pixels summed in order and added in slice order, against the
 * definition in double (within 1e-4 of the products' magnitudes); the
 * same bits on 1 and 3 threads. 27 taps over 16 filters leave the
 * registers: the GEMM's, checked the same way. */
static void small_depth_weight_gradients_match_the_definition(void **state) {
  (void)state;
  const int chans[] = {1, 3}, filters[] = {8, 16, 20, 32};
  const int B = 24, HP = 30, WP = 30, KH = 3, KW = 3, OH = 28, OW = 28, M = B * OH * OW;
  for (size_t ci = 0; ci < 2; ci++)
    for (size_t fi = 0; fi < 4; fi++)
      for (int mode = 0; mode < 4; mode++) { /* bit 0: bf16 input; bit 1: bf16 dy */
        const int C = chans[ci], F = filters[fi], K = KH * KW * C;
        const int in_bf16 = mode & 1, dy_bf16 = mode & 2;
        const size_t nx = (size_t)B * HP * WP * C, ndy = (size_t)M * F;
        float *x = malloc(nx * sizeof *x), *dy = malloc(ndy * sizeof *dy);
        uint16_t *x16 = malloc(nx * 2), *dy16 = malloc(ndy * 2);
        for (size_t i = 0; i < nx; i++) x[i] = kn_bf16_to_f32(x16[i] = bf16_bits(uniform_pm1()));
        for (size_t i = 0; i < ndy; i++) dy[i] = kn_bf16_to_f32(dy16[i] = bf16_bits(uniform_pm1()));
        const kn_conv_cols cols = {
            in_bf16 ? (const void *)x16 : x, HP, WP, C, KW, 1, 1, 1, 1, OH, OW};
        float *first = NULL;
        for (int threads = 1; threads <= 3; threads += 2) {
          kn_pool *pool = kn_pool_new(threads);
          void *scratch = aligned_alloc(64, kn_gemm_scratch_bytes(threads, M));
          float *dw = malloc((size_t)K * F * sizeof *dw);
          memset(dw, 0xff, (size_t)K * F * sizeof *dw);
          kn_gemm_run(
              pool, scratch, K, F, M,
              (kn_gemm_operand){NULL, in_bf16 ? KN_BF16 : KN_F32, K, 1, &cols, NULL, NULL, NULL},
              (kn_gemm_operand){dy_bf16 ? (const void *)dy16 : dy, dy_bf16 ? KN_BF16 : KN_F32, F, 0,
                                NULL, NULL, NULL, NULL},
              dw, KN_F32, F, 0, NULL, 0, NULL);
          if (!first) {
            for (int t = 0; t < K; t++) {
              const int ki = t / (KW * C), kj = t / C % KW, c = t % C;
              for (int f = 0; f < F; f++) {
                double sum = 0.0, mag = 0.0;
                for (int p = 0; p < M; p++) {
                  const int b = p / (OH * OW), oy = p / OW % OH, ox = p % OW;
                  const double v = (double)x[(((size_t)b * HP + oy + ki) * WP + ox + kj) * C + c] *
                                   dy[(size_t)p * F + f];
                  sum += v;
                  mag += fabs(v);
                }
                if (fabs(dw[t * F + f] - sum) > 1e-4 * mag)
                  fail_msg("C %d, F %d, mode %d: dw[%d][%d] %g, want %g", C, F, mode, t, f,
                           (double)dw[t * F + f], sum);
              }
            }
            first = dw;
          } else {
            assert_memory_equal(first, dw, (size_t)K * F * sizeof *dw);
            free(dw);
          }
          free(scratch);
          kn_pool_free(pool);
        }
        free(first);
        free(x), free(dy), free(x16), free(dy16);
      }
}

/* A first layer's weight gradient reading its max pool's gradient as dy
 * (kn_gemm_operand.pool: a tiled 2x2 pool's argmax bytes and bf16 dy, the
 * gradient never written): the same bits, weights and bias sums, as the
 * same product over that gradient written out (an odd image side leaves a
 * row and a column outside the windows; argmax 4, a window whose maximum
 * the fused relu stopped, passes nothing); the same bits on 1 and 3
 * threads. On the portable kernel (no small weight gradient there) it runs
 * by the definition: within 1e-4 of the products' magnitudes. */
static void pool_gradients_read_as_dy_match_the_written_gradient(void **state) {
  (void)state;
  char err[128];
  const int B = 8, HP = 29, WP = 29, OH = 27, OW = 27, PH = 13, PW = 13, K = 9, M = B * OH * OW;
  const int filters[] = {16, 20, 32};
  for (int isa = 0; isa < 2; isa++) {
    if (isa == 1 && kn_cpu_set_isa(KN_ISA_AVX2, err, sizeof err) != KN_OK)
      assert_int_equal(kn_cpu_set_isa(KN_ISA_BASELINE, err, sizeof err), KN_OK);
    const int direct = kn_gemm_bf16_kernel() == KN_GEMM_BF16_AVX512;
    for (size_t fi = 0; fi < 3; fi++) {
      const int F = filters[fi];
      const size_t nx = (size_t)B * HP * WP, npool = (size_t)B * PH * PW * F, ndx = (size_t)M * F;
      uint16_t *x16 = malloc(nx * 2), *dy16 = malloc(npool * 2), *dx16 = calloc(ndx, 2);
      unsigned char *am = malloc(npool);
      for (size_t i = 0; i < nx; i++) x16[i] = bf16_bits(uniform_pm1());
      for (size_t i = 0; i < npool; i++) {
        dy16[i] = bf16_bits(uniform_pm1());
        am[i] = (unsigned char)((uniform_pm1() + 1.0f) * 2.49f); /* 0 .. 4 */
      }
      for (int p = 0; p < M; p++) { /* the gradient written out */
        const int b = p / (OH * OW), y = p / OW % OH, x = p % OW;
        if (y >= 2 * PH || x >= 2 * PW) continue;
        const size_t o = (((size_t)b * PH + y / 2) * PW + x / 2) * F;
        for (int f = 0; f < F; f++)
          if (am[o + f] == (y & 1) * 2 + (x & 1)) dx16[(size_t)p * F + f] = dy16[o + f];
      }
      const kn_conv_cols cols = {x16, HP, WP, 1, 3, 1, 1, 1, 1, OH, OW};
      const kn_pool_grad_b pg = {am, NULL, OH, OW, PH, PW, F, dy16};
      float *written = malloc((size_t)(K + 1) * F * sizeof *written), *first = NULL;
      for (int threads = 1; threads <= 3; threads += 2) {
        kn_pool *pool = kn_pool_new(threads);
        void *scratch = aligned_alloc(64, kn_gemm_scratch_bytes(threads, M));
        float *dw = malloc((size_t)(K + 1) * F * sizeof *dw);
        memset(dw, 0xff, (size_t)(K + 1) * F * sizeof *dw);
        kn_gemm_operand a = {NULL, KN_BF16, K, 1, &cols, NULL, NULL, NULL};
        kn_gemm_operand b = {NULL, KN_BF16, F, 0, NULL, NULL, dw + (size_t)K * F, &pg};
        assert_true(kn_gemm_sums_b(K, F, M, &a, &b));
        kn_gemm_run(pool, scratch, K, F, M, a, b, dw, KN_F32, F, 0, NULL, 0, NULL);
        if (!first) {
          b = (kn_gemm_operand){dx16, KN_BF16, F, 0, NULL, NULL, NULL, NULL};
          kn_gemm_run(pool, scratch, K, F, M, a, b, written, KN_F32, F, 0, NULL, 0, NULL);
          for (int f = 0; f < F; f++) { /* and its column sums */
            float sum = 0.0f;
            for (int p = 0; p < M; p++) sum += kn_bf16_to_f32(dx16[(size_t)p * F + f]);
            written[(size_t)K * F + f] = sum;
          }
          for (int i = 0; i < (K + 1) * F; i++) {
            double mag = 0.0;
            for (int p = 0; p < M; p++) {
              const int t = i / F, b0 = p / (OH * OW), y = p / OW % OH, x = p % OW;
              const double v = kn_bf16_to_f32(dx16[(size_t)p * F + i % F]);
              mag += t == K ? fabs(v)
                            : fabs(v * kn_bf16_to_f32(
                                           x16[((size_t)b0 * HP + y + t / 3) * WP + x + t % 3]));
            }
            if (direct) /* the small weight gradient over both (one slice): the same sums */
              assert_memory_equal(&dw[i], &written[i], sizeof dw[i]);
            else if (fabs(dw[i] - written[i]) > 1e-4 * mag + 1e-30)
              fail_msg("F %d, isa %d: value %d is %g, want %g", F, isa, i, (double)dw[i],
                       (double)written[i]);
          }
          first = dw;
        } else {
          assert_memory_equal(first, dw, (size_t)(K + 1) * F * sizeof *dw);
          free(dw);
        }
        free(scratch);
        kn_pool_free(pool);
      }
      print_message("%d filters, %s: as the written gradient\n", F,
                    direct ? "small weight gradient" : "by the definition");
      free(first), free(written), free(x16), free(dy16), free(dx16), free(am);
    }
  }
  assert_int_equal(kn_cpu_set_isa(KN_ISA_AUTO, err, sizeof err), KN_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(bf16_gemm_matches_the_reference_on_every_tail_and_transpose),
      cmocka_unit_test(portable_kernel_matches_the_reference_too),
      cmocka_unit_test(deep_products_give_the_same_bits_on_any_thread_count),
      cmocka_unit_test(avx512bf16_and_portable_kernels_give_the_same_bits),
      cmocka_unit_test(amx_tiles_sum_exactly_on_every_block_shape),
      cmocka_unit_test(the_cpus_own_bf16_conversion_rounds_as_the_definition),
      cmocka_unit_test(bad_gemm_arguments_are_refused_by_name),
      cmocka_unit_test(small_depth_convolutions_match_the_definition),
      cmocka_unit_test(stride1_convolutions_on_amx_tiles_read_their_columns_in_place),
      cmocka_unit_test(small_depth_weight_gradients_match_the_definition),
      cmocka_unit_test(pool_gradients_read_as_dy_match_the_written_gradient),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
