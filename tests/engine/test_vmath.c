/* The float kernels' own exp and tanh (vmath.h): within 2 ulp of the exact
 * values over their whole range, NaN and infinities as libm has them (the
 * bounded exps the activations use within 2 ulp on their range); the
 * normal CDF GELU uses within 2e-7 of exact and its tail below 0 to a
 * relative 1e-4, GELU's slope within 3e-7; and
 * the unary ops built on them (tanh, sigmoid, elu, gelu and their
 * gradients) giving the same bits on every CPU path. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"
#include "vmath.h"

/* |got - want| in units of the last place of want as a float (subnormal
 * results: in units of the smallest subnormal). */
static double ulps(float got, double want) {
  const float w = (float)want;
  if (isinf(w)) return got == w ? 0.0 : INFINITY;
  double unit = fabs(w) < FLT_MIN ? FLT_TRUE_MIN : nextafterf(fabsf(w), INFINITY) - fabsf(w);
  return fabs((double)got - want) / unit;
}

static void exp_is_within_2_ulp_everywhere(void **state) {
  (void)state;
  double worst = 0.0;
  float at = 0.0f;
  /* Every 2^-12 from the first nonzero result to overflow, and every float
   * of [-1, 1] with a step of 2^-20 where the reduction is finest. */
  for (double v = -103.97; v < 88.72; v += 1.0 / 4096) {
    const double e = ulps(kn_vexpf((float)v), exp((double)(float)v));
    if (e > worst) worst = e, at = (float)v;
  }
  for (double v = -1.0; v <= 1.0; v += 1.0 / 1048576) {
    const double e = ulps(kn_vexpf((float)v), exp((double)(float)v));
    if (e > worst) worst = e, at = (float)v;
  }
  printf("exp: worst %.3f ulp at %.9g\n", worst, at);
  assert_true(worst <= 2.0);
  assert_true(isnan(kn_vexpf(NAN)));
  assert_true(kn_vexpf(INFINITY) == INFINITY);
  assert_true(kn_vexpf(89.0f) == INFINITY);
  assert_true(kn_vexpf(88.72f) == (float)exp(88.72f) || ulps(kn_vexpf(88.72f), exp(88.72f)) <= 2);
  assert_true(kn_vexpf(-INFINITY) == 0.0f);
  assert_true(kn_vexpf(-105.0f) == 0.0f);
  assert_true(kn_vexpf(-100.0f) > 0.0f); /* subnormal, as libm's */
  assert_true(kn_vexpf(0.0f) == 1.0f);
}

/* The exps the activations use where they bound x themselves: e^x within
 * 2 ulp on [-87.3, 88] (one normal power of two), and for x <= 0 the
 * results that would be subnormal flushed to 0. */
static void bounded_exps_are_within_2_ulp_and_flush_below_normal(void **state) {
  (void)state;
  double worst = 0.0, worst_neg = 0.0;
  for (double v = -87.3; v <= 88.0; v += 1.0 / 4096) {
    const double want = exp((double)(float)v);
    const double e = ulps(kn_vexpf_normal((float)v), want);
    if (e > worst) worst = e;
    if (v <= 0) {
      const double en = ulps(kn_vexpf_neg((float)v), want);
      if (en > worst_neg) worst_neg = en;
    }
  }
  for (double v = -1.0; v <= 0.0; v += 1.0 / 1048576) {
    const double e = ulps(kn_vexpf_neg((float)v), exp((double)(float)v));
    if (e > worst_neg) worst_neg = e;
  }
  printf("exp on [-87.3, 88]: worst %.3f ulp; for x <= 0: %.3f ulp\n", worst, worst_neg);
  assert_true(worst <= 2.0);
  assert_true(worst_neg <= 2.0);
  assert_true(kn_vexpf_neg(0.0f) == 1.0f);
  assert_true(kn_vexpf_neg(-87.4f) == 0.0f);
  assert_true(kn_vexpf_neg(-1000.0f) == 0.0f);
  assert_true(kn_vexpf_neg(-INFINITY) == 0.0f);
  assert_true(kn_vexpf_neg(-87.2f) >= FLT_MIN);
}

static void tanh_is_within_2_ulp_and_odd(void **state) {
  (void)state;
  double worst = 0.0;
  float at = 0.0f;
  for (double v = -12.0; v <= 12.0; v += 1.0 / 65536) {
    const float x = (float)v;
    const double e = ulps(kn_vtanhf(x), tanh((double)x));
    if (e > worst) worst = e, at = x;
    assert_true(kn_vtanhf(-x) == -kn_vtanhf(x));
  }
  for (float x = 1e-30f; x < 1e-3f; x *= 1.01f) {
    const double e = ulps(kn_vtanhf(x), tanh((double)x));
    if (e > worst) worst = e, at = x;
  }
  printf("tanh: worst %.3f ulp at %.9g\n", worst, at);
  assert_true(worst <= 2.0);
  assert_true(isnan(kn_vtanhf(NAN)));
  assert_true(kn_vtanhf(INFINITY) == 1.0f);
  assert_true(kn_vtanhf(-INFINITY) == -1.0f);
  assert_true(kn_vtanhf(100.0f) == 1.0f);
}

/* out = sum of tanh, sigmoid, elu and gelu of x, trained one step so the
 * gradients run too; the outputs and gradients on each path. */
static float *unary_run(kn_isa isa, size_t *n_out) {
  char err[256];
  if (kn_cpu_set_isa(isa, err, sizeof err) != KN_OK) return NULL;
  enum { N = 4096 };
  kn_graph *g = kn_graph_new();
  int d[1] = {N};
  kn_node x = kn_param(g, "x", 1, d, KN_INIT_ZEROS);
  kn_node y = kn_add(g, kn_add(g, kn_tanh(g, x), kn_sigmoid(g, x)),
                     kn_add(g, kn_elu(g, x, 1.0f), kn_gelu(g, x)));
  kn_graph_keep(g, y);
  kn_node loss = kn_sum(g, kn_mul(g, y, y), -1, 0);
  assert_int_equal(kn_autodiff(g, loss, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(g, 1, NULL, err, sizeof err), KN_OK);
  float *p = kn_params(g);
  for (int i = 0; i < N; i++) p[i] = (float)(i - N / 2) / 180.0f; /* -11.4 .. 11.4 */
  p[7] = NAN;
  assert_int_equal(kn_graph_run(g, KN_RUN_TRAIN, 1, err, sizeof err), KN_OK);
  float *out = malloc(2 * N * sizeof *out);
  assert_non_null(out);
  memcpy(out, kn_node_data(g, y), N * sizeof *out);
  memcpy(out + N, kn_grads(g), N * sizeof *out);
  const float *yv = out;
  assert_true(isnan(yv[7]));
  for (int i = 0; i < N; i++) {
    if (i == 7) continue;
    const double v = p[i];
    const double want =
        tanh(v) + 1 / (1 + exp(-v)) + (v > 0 ? v : exp(v) - 1) + 0.5 * v * (1 + erf(v / sqrt(2)));
    assert_float_equal(yv[i], want, 1e-5 * (1 + fabs(want)));
  }
  kn_graph_free(g);
  *n_out = 2 * N;
  return out;
}

static void normal_cdf_is_within_2e_7_and_keeps_its_tail(void **state) {
  (void)state;
  double worst_abs = 0.0, worst_rel = 0.0;
  for (double x = -13.0; x <= 13.0; x += 1.0 / 1024) {
    const float xf = (float)x;
    const double want = 0.5 * erfc(-(double)xf / sqrt(2.0)), got = kn_vnormcdff(xf);
    const double abs_err = fabs(got - want);
    if (abs_err > worst_abs) worst_abs = abs_err;
    if (xf < 0 && want > 1e-30 && abs_err / want > worst_rel) worst_rel = abs_err / want;
  }
  printf("normal CDF: worst absolute error %.3g, worst relative error below 0 %.3g\n", worst_abs,
         worst_rel);
  assert_true(worst_abs < 2e-7);
  assert_true(worst_rel < 1e-4);
  assert_true(isnan(kn_vnormcdff(NAN)));
  assert_float_equal(kn_vnormcdff(INFINITY), 1.0, 0.0);
  assert_float_equal(kn_vnormcdff(-INFINITY), 0.0, 0.0);
  assert_float_equal(kn_vnormcdff(0.0f), 0.5, 1e-7);
}

/* GELU's slope, Phi(x) + x phi(x), from the one exp the tail and the
 * density share: within 3e-7 of exact everywhere; NaN passes through. */
static void gelu_slope_is_within_3e_7(void **state) {
  (void)state;
  double worst = 0.0;
  float at = 0.0f;
  for (double x = -14.0; x <= 14.0; x += 1.0 / 4096) {
    const float xf = (float)x;
    const double xd = xf;
    const double want = 0.5 * erfc(-xd / sqrt(2.0)) + xd * exp(-0.5 * xd * xd) / sqrt(2.0 * M_PI);
    const double err = fabs(kn_vgelu_slopef(xf) - want);
    if (err > worst) worst = err, at = xf;
  }
  printf("GELU slope: worst absolute error %.3g at %.9g\n", worst, at);
  assert_true(worst < 3e-7);
  assert_true(isnan(kn_vgelu_slopef(NAN)));
  assert_float_equal(kn_vgelu_slopef(INFINITY), 1.0, 0.0);
  assert_float_equal(kn_vgelu_slopef(-INFINITY), 0.0, 0.0);
  assert_float_equal(kn_vgelu_slopef(0.0f), 0.5, 1e-7);
}

static void unary_ops_give_the_same_bits_on_every_cpu_path(void **state) {
  (void)state;
  size_t n = 0, m = 0;
  float *base = unary_run(KN_ISA_BASELINE, &n);
  assert_non_null(base);
  int tested = 0;
  for (kn_isa isa = KN_ISA_AVX2; isa <= KN_ISA_AVX512; isa++) {
    float *r = unary_run(isa, &m);
    if (!r) {
      printf("isa path %s: not on this CPU\n", kn_isa_name(isa));
      continue;
    }
    assert_int_equal(m, n);
    if (memcmp(base, r, n * sizeof *r)) fail_msg("%s differs from the baseline", kn_isa_name(isa));
    free(r);
    tested++;
  }
  char err[128];
  assert_int_equal(kn_cpu_set_isa(KN_ISA_AUTO, err, sizeof err), KN_OK);
  free(base);
  if (!tested) {
    print_message("SKIPPED: this CPU has only the baseline path, nothing to compare it with\n");
    skip();
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(exp_is_within_2_ulp_everywhere),
      cmocka_unit_test(bounded_exps_are_within_2_ulp_and_flush_below_normal),
      cmocka_unit_test(tanh_is_within_2_ulp_and_odd),
      cmocka_unit_test(normal_cdf_is_within_2e_7_and_keeps_its_tail),
      cmocka_unit_test(gelu_slope_is_within_3e_7),
      cmocka_unit_test(unary_ops_give_the_same_bits_on_every_cpu_path),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
