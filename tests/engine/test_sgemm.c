/* kiln's own single-precision GEMM (engine/gemm.c) against a double
 * reference, for every transpose and for shapes with tails in each
 * dimension, blocks split in k and in n, and one row or one column; then
 * the same bits for every thread count. OpenBLAS is held to the same
 * bound, so the test also says the two agree. On a CPU without AVX-512F
 * kiln's GEMM is refused by name and those checks are skipped. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"

typedef struct shape {
  int m, n, k;
} shape;

/* 1 x 1 x 1; tails in m, n and k; k over one block (512); n over one
 * block (128); a single row; a single column; the CNN's shapes, smaller;
 * deep products summed in depth slices (a first convolution's weight
 * gradient, 9 x 32 over 9000 pixels; and an uneven one). */
static const shape shapes[] = {{1, 1, 1},     {17, 33, 65},  {12, 32, 1},   {13, 31, 1100},
                               {25, 300, 40}, {1, 70, 300},  {90, 1, 77},   {300, 64, 72},
                               {36, 32, 900}, {9, 32, 9000}, {40, 70, 5001}};

typedef struct mm {
  kn_graph *g;
  kn_node c;
  int ta, tb;
  shape s;
} mm;

/* C = op(A) op(B) as a graph of its own, A and B filled from a seed. */
static mm build(shape s, int ta, int tb, int threads) {
  mm x = {kn_graph_new(), -1, ta, tb, s};
  kn_graph_set_threads(x.g, threads);
  int ad[2] = {ta ? s.k : s.m, ta ? s.m : s.k}, bd[2] = {tb ? s.n : s.k, tb ? s.k : s.n};
  kn_node a = kn_param(x.g, "a", 2, ad, KN_INIT_ZEROS);
  kn_node b = kn_param(x.g, "b", 2, bd, KN_INIT_ZEROS);
  x.c = kn_matmul(x.g, a, b, ta, tb);
  kn_graph_keep(x.g, x.c);
  char err[256] = "";
  assert_int_equal(kn_graph_compile(x.g, 1, NULL, err, sizeof err), KN_OK);
  kn_rng rng;
  kn_rng_seed(&rng, (uint64_t)(s.m * 131 + s.n * 17 + s.k + ta * 2 + tb));
  float *p = kn_params(x.g);
  for (size_t i = 0; i < kn_param_count(x.g); i++) p[i] = 2.0f * kn_rng_uniform(&rng) - 1.0f;
  return x;
}

static const float *run(mm *x) {
  char err[256] = "";
  if (kn_graph_run(x->g, KN_RUN_FORWARD, 1, err, sizeof err) != KN_OK) fail_msg("run: %s", err);
  return kn_node_data(x->g, x->c);
}

/* Every element within f32 rounding of the double sum: k roundings of
 * terms no larger than sum |a||b|. */
static void check_against_double(const mm *x, const float *c, const char *what) {
  const float *a = kn_params(x->g), *b = a + (size_t)x->s.m * x->s.k;
  const int m = x->s.m, n = x->s.n, k = x->s.k;
  for (int i = 0; i < m; i++) {
    for (int j = 0; j < n; j++) {
      double sum = 0.0, mag = 0.0;
      for (int t = 0; t < k; t++) {
        double av = x->ta ? a[(size_t)t * m + i] : a[(size_t)i * k + t];
        double bv = x->tb ? b[(size_t)j * k + t] : b[(size_t)t * n + j];
        sum += av * bv;
        mag += fabs(av * bv);
      }
      double got = c[(size_t)i * n + j], bound = (k + 2) * 0x1p-24 * mag + 1e-30;
      if (fabs(got - sum) > bound)
        fail_msg("%s %dx%dx%d ta=%d tb=%d: c[%d][%d] = %.9g, double %.9g (bound %.3g)", what, m, n,
                 k, x->ta, x->tb, i, j, got, sum, bound);
    }
  }
}

static void own_and_openblas_match_double_for_every_transpose(void **state) {
  (void)state;
  char err[256] = "";
  const int own = kn_cpu_set_gemm(KN_GEMM_KILN, err, sizeof err) == KN_OK;
  if (!own) {
    assert_non_null(strstr(err, "AVX-512F"));
    printf("kiln's GEMM: %s; checking OpenBLAS alone\n", err);
  }
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    for (int t = 0; t < 4; t++) {
      mm x = build(shapes[s], t & 1, t >> 1, 2);
      if (own) {
        assert_int_equal(kn_cpu_set_gemm(KN_GEMM_KILN, err, sizeof err), KN_OK);
        check_against_double(&x, run(&x), "kiln");
      }
      assert_int_equal(kn_cpu_set_gemm(KN_GEMM_OPENBLAS, err, sizeof err), KN_OK);
      check_against_double(&x, run(&x), "openblas");
      kn_graph_free(x.g);
    }
  }
  assert_int_equal(kn_cpu_set_gemm(KN_GEMM_AUTO, err, sizeof err), KN_OK);
  assert_int_equal(kn_cpu_gemm(), own ? KN_GEMM_KILN : KN_GEMM_OPENBLAS);
}

/* Each element of C is summed by one thread in one order; a deep product
 * in depth slices fixed by its shape (9 here, over 2 to 5 threads), added
 * in slice order. */
static void own_gemm_gives_the_same_bits_for_every_thread_count(void **state) {
  (void)state;
  char err[256] = "";
  if (kn_cpu_set_gemm(KN_GEMM_KILN, err, sizeof err) != KN_OK) {
    printf("kiln's GEMM: %s; skipped\n", err);
    return;
  }
  const shape shapes_split[] = {{301, 70, 600}, {30, 40, 20000}};
  for (int sh = 0; sh < 2; sh++) {
    const shape s = shapes_split[sh];
    for (int t = 0; t < 4; t++) {
      mm one = build(s, t & 1, t >> 1, 1);
      const float *c1 = run(&one);
      for (int threads = 2; threads <= 5; threads++) {
        mm x = build(s, t & 1, t >> 1, threads);
        assert_memory_equal(c1, run(&x), (size_t)s.m * s.n * sizeof(float));
        kn_graph_free(x.g);
      }
      kn_graph_free(one.g);
    }
  }
  assert_int_equal(kn_cpu_set_gemm(KN_GEMM_AUTO, err, sizeof err), KN_OK);
}

static void unknown_gemm_is_refused(void **state) {
  (void)state;
  char err[256] = "";
  assert_int_equal(kn_cpu_set_gemm((kn_gemm_kind)9, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "unknown GEMM"));
  assert_string_equal(kn_gemm_name(KN_GEMM_OPENBLAS), "openblas");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(own_and_openblas_match_double_for_every_transpose),
      cmocka_unit_test(own_gemm_gives_the_same_bits_for_every_thread_count),
      cmocka_unit_test(unknown_gemm_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
