/* kiln's own single-precision GEMM (engine/gemm.c) and OpenBLAS's, for
 * every transpose and for shapes with tails in each dimension, blocks
 * split in k and in n, depth slices, and one row or one column: exact on
 * small integers (every product and partial sum is an integer below 2^24,
 * so float32 holds it exactly in any order: one lost or doubled product
 * shows), and within a tight probabilistic bound of a double reference on
 * uniform values; then the same bits for every thread count; and C +=
 * op(A) op(B) (a product added to what C holds). On a CPU
 * without AVX-512F kiln's GEMM is refused by name and its tests skip. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"
#include "graph_internal.h" /* kn_sgemm_run: C += op(A) op(B) */

typedef struct shape {
  int m, n, k;
} shape;

/* 1 x 1 x 1; tails in m, n and k; k over one block (512); n over one
 * block (128); a single row; a single column; the CNN's shapes, smaller;
 * deep products summed in depth slices (a first convolution's weight
 * gradient, 9 x 32 over 9000 pixels; and an uneven one); C at most 16
 * wide, cut into tiles 16 wide (a 16-filter convolution, a row tail past
 * 24, a narrow one summed in slices, a first convolution's 9 taps). */
static const shape shapes[] = {{1, 1, 1},     {17, 33, 65},    {12, 32, 1},    {13, 31, 1100},
                               {25, 300, 40}, {1, 70, 300},    {90, 1, 77},    {300, 64, 72},
                               {36, 32, 900}, {9, 32, 9000},   {40, 70, 5001}, {200, 16, 144},
                               {50, 9, 600},  {144, 16, 9000}, {9, 16, 3000}};

typedef struct mm {
  kn_graph *g;
  kn_node c;
  int ta, tb;
  shape s;
} mm;

/* What A and B hold: integers in [-4, 4], or uniform values in [-1, 1). */
typedef enum fill { SMALL_INTEGERS, UNIFORM } fill;

/* C = op(A) op(B) as a graph of its own, A and B filled from a seed. */
static mm build(shape s, int ta, int tb, int threads, fill values) {
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
  for (size_t i = 0; i < kn_param_count(x.g); i++)
    p[i] = values == SMALL_INTEGERS ? (float)((int)kn_rng_below(&rng, 9) - 4)
                                    : 2.0f * kn_rng_uniform(&rng) - 1.0f;
  return x;
}

static const float *run(mm *x) {
  char err[256] = "";
  if (kn_graph_run(x->g, KN_RUN_FORWARD, 1, err, sizeof err) != KN_OK) fail_msg("run: %s", err);
  return kn_node_data(x->g, x->c);
}

/* Element (i, j) of op(A) op(B) in double, and sum |a||b| of its terms. */
static double reference(const mm *x, int i, int j, double *mag) {
  const float *a = kn_params(x->g), *b = a + (size_t)x->s.m * x->s.k;
  const int m = x->s.m, n = x->s.n, k = x->s.k;
  double sum = 0.0;
  *mag = 0.0;
  for (int t = 0; t < k; t++) {
    double av = x->ta ? a[(size_t)t * m + i] : a[(size_t)i * k + t];
    double bv = x->tb ? b[(size_t)j * k + t] : b[(size_t)t * n + j];
    sum += av * bv;
    *mag += fabs(av * bv);
  }
  return sum;
}

/* Small integers: |a b| <= 16 and k <= 9000 keep every partial sum, in
 * any order, an integer below 2^24, which float32 holds exactly: C must be
 * the double sum itself. */
static void check_exact(const mm *x, const float *c, const char *what) {
  for (int i = 0; i < x->s.m; i++) {
    for (int j = 0; j < x->s.n; j++) {
      double mag;
      const double want = reference(x, i, j, &mag);
      assert_true(mag < 0x1p24);
      const float got = c[(size_t)i * x->s.n + j];
      if (got != (float)want)
        fail_msg("%s %dx%dx%d ta=%d tb=%d, small integers: c[%d][%d] = %.9g, exactly %.9g", what,
                 x->s.m, x->s.n, x->s.k, x->ta, x->tb, i, j, got, want);
    }
  }
}

/* Uniform values: the rounding errors of a sum of k products (k roundings
 * of the products and k - 1 of the partial sums, in any order or blocking)
 * behave as independent and zero-mean, so the error stays below
 * lambda sqrt(k + 1) 2^-24 sum |a||b| but with probability
 * 2 exp(-lambda^2 / 2) (Higham and Mary, "A new approach to probabilistic
 * rounding error analysis", 2019); lambda = 6: 3e-8. The worst-case bound,
 * k 2^-24 sum |a||b|, is sqrt(k) times looser: at k = 9000, 0.4 to 1.2,
 * larger than a whole lost product. Returns the worst error in units of
 * sqrt(k + 1) 2^-24 sum |a||b|. */
static double check_close(const mm *x, const float *c, const char *what) {
  const double unit = sqrt((double)x->s.k + 1.0) * 0x1p-24;
  double worst = 0.0;
  for (int i = 0; i < x->s.m; i++) {
    for (int j = 0; j < x->s.n; j++) {
      double mag;
      const double want = reference(x, i, j, &mag);
      const double got = c[(size_t)i * x->s.n + j], bound = 6.0 * unit * mag + 1e-30;
      if (fabs(got - want) > bound)
        fail_msg("%s %dx%dx%d ta=%d tb=%d: c[%d][%d] = %.9g, double %.9g (bound %.3g)", what,
                 x->s.m, x->s.n, x->s.k, x->ta, x->tb, i, j, got, want, bound);
      if (mag > 0 && fabs(got - want) / (unit * mag) > worst)
        worst = fabs(got - want) / (unit * mag);
    }
  }
  return worst;
}

/* Every shape and transpose with the GEMM `kind`, both fills. */
static void check_every_shape(kn_gemm_kind kind) {
  char err[256] = "";
  double worst = 0.0;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    for (int t = 0; t < 4; t++) {
      for (int f = 0; f < 2; f++) {
        mm x = build(shapes[s], t & 1, t >> 1, 2, f ? UNIFORM : SMALL_INTEGERS);
        assert_int_equal(kn_cpu_set_gemm(kind, err, sizeof err), KN_OK);
        if (f) {
          const double w = check_close(&x, run(&x), kn_gemm_name(kind));
          if (w > worst) worst = w;
        } else {
          check_exact(&x, run(&x), kn_gemm_name(kind));
        }
        kn_graph_free(x.g);
      }
    }
  }
  print_message("%s: exact on small integers; worst error on uniform values %.3g sqrt(k+1) "
                "2^-24 sum|ab| (bound 6)\n",
                kn_gemm_name(kind), worst);
  assert_int_equal(kn_cpu_set_gemm(KN_GEMM_AUTO, err, sizeof err), KN_OK);
}

/* kiln's GEMM where it runs; elsewhere refused by name, and skipped. */
static void require_own_gemm(void) {
  char err[256] = "";
  if (kn_cpu_set_gemm(KN_GEMM_KILN, err, sizeof err) != KN_OK) {
    assert_non_null(strstr(err, "AVX-512F"));
    print_message("SKIPPED: kiln's GEMM: %s\n", err);
    skip();
  }
  assert_int_equal(kn_cpu_set_gemm(KN_GEMM_AUTO, err, sizeof err), KN_OK);
}

static void openblas_is_exact_on_integers_and_close_to_double_for_every_transpose(void **state) {
  (void)state;
  check_every_shape(KN_GEMM_OPENBLAS);
}

static void own_gemm_is_exact_on_integers_and_close_to_double_for_every_transpose(void **state) {
  (void)state;
  require_own_gemm();
  check_every_shape(KN_GEMM_KILN);
}

/* Each element of C is summed by one thread in one order; a deep product
 * in depth slices fixed by its shape (9 here, over 2 to 5 threads), added
 * in slice order. */
static void own_gemm_gives_the_same_bits_for_every_thread_count(void **state) {
  (void)state;
  require_own_gemm();
  char err[256] = "";
  assert_int_equal(kn_cpu_set_gemm(KN_GEMM_KILN, err, sizeof err), KN_OK);
  const shape shapes_split[] = {{301, 70, 600}, {30, 40, 20000}, {301, 16, 600}, {30, 12, 20000}};
  for (int sh = 0; sh < 4; sh++) {
    const shape s = shapes_split[sh];
    for (int t = 0; t < 4; t++) {
      mm one = build(s, t & 1, t >> 1, 1, UNIFORM);
      const float *c1 = run(&one);
      for (int threads = 2; threads <= 5; threads++) {
        mm x = build(s, t & 1, t >> 1, threads, UNIFORM);
        assert_memory_equal(c1, run(&x), (size_t)s.m * s.n * sizeof(float));
        kn_graph_free(x.g);
      }
      kn_graph_free(one.g);
    }
  }
  assert_int_equal(kn_cpu_set_gemm(KN_GEMM_AUTO, err, sizeof err), KN_OK);
}

/* kn_sgemm_args.accumulate adds the product to what C holds: exact on
 * small integers for every shape and transpose (kiln's tiles, its narrow
 * transposed tiles, depth slices; OpenBLAS's beta of 1), at the compiled
 * graph's threads and GEMM buffers. */
static void check_accumulate(kn_gemm_kind kind) {
  char err[256] = "";
  for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
    for (int t = 0; t < 4; t++) {
      mm x = build(shapes[sh], t & 1, t >> 1, 2, SMALL_INTEGERS);
      assert_int_equal(kn_cpu_set_gemm(kind, err, sizeof err), KN_OK);
      const int m = x.s.m, n = x.s.n, k = x.s.k;
      const float *a = kn_params(x.g), *b = a + (size_t)m * k;
      float *c = malloc((size_t)m * n * sizeof *c);
      assert_non_null(c);
      for (size_t i = 0; i < (size_t)m * n; i++) c[i] = (float)((int)(i % 7) - 3);
      const kn_sgemm_args args = {.ta = x.ta,
                                  .tb = x.tb,
                                  .m = m,
                                  .n = n,
                                  .k = k,
                                  .a = a,
                                  .lda = x.ta ? m : k,
                                  .b = b,
                                  .ldb = x.tb ? k : n,
                                  .c = c,
                                  .ldc = n,
                                  .accumulate = 1};
      kn_sgemm_run(x.g, &args);
      for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
          double mag;
          const size_t at = (size_t)i * n + j;
          const double want = reference(&x, i, j, &mag) + (double)((int)(at % 7) - 3);
          if (c[at] != (float)want)
            fail_msg("%s %dx%dx%d ta=%d tb=%d, accumulating: c[%d][%d] = %.9g, exactly %.9g",
                     kn_gemm_name(kind), m, n, k, x.ta, x.tb, i, j, c[at], want);
        }
      free(c);
      kn_graph_free(x.g);
    }
  }
  assert_int_equal(kn_cpu_set_gemm(KN_GEMM_AUTO, err, sizeof err), KN_OK);
}

static void a_product_accumulates_into_c_with_either_gemm(void **state) {
  (void)state;
  check_accumulate(KN_GEMM_OPENBLAS);
  require_own_gemm();
  check_accumulate(KN_GEMM_KILN);
}

static void unknown_gemm_is_refused_and_auto_takes_kilns_where_it_runs(void **state) {
  (void)state;
  char err[256] = "";
  assert_int_equal(kn_cpu_set_gemm((kn_gemm_kind)9, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "unknown GEMM"));
  assert_string_equal(kn_gemm_name(KN_GEMM_OPENBLAS), "openblas");
  const int own = kn_cpu_set_gemm(KN_GEMM_KILN, err, sizeof err) == KN_OK;
  assert_int_equal(kn_cpu_set_gemm(KN_GEMM_AUTO, err, sizeof err), KN_OK);
  const char *env = getenv("KILN_GEMM");
  const int blas = env && strcmp(env, "openblas") == 0;
  assert_int_equal(kn_cpu_gemm(), own && !blas ? KN_GEMM_KILN : KN_GEMM_OPENBLAS);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(openblas_is_exact_on_integers_and_close_to_double_for_every_transpose),
      cmocka_unit_test(own_gemm_is_exact_on_integers_and_close_to_double_for_every_transpose),
      cmocka_unit_test(own_gemm_gives_the_same_bits_for_every_thread_count),
      cmocka_unit_test(a_product_accumulates_into_c_with_either_gemm),
      cmocka_unit_test(unknown_gemm_is_refused_and_auto_takes_kilns_where_it_runs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
