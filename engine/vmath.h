/* vmath.h — private to engine/: exp and tanh for the float kernels, in
 * plain arithmetic with no branches and no library call, so a loop over
 * them vectorizes on every ISA path and gives the same bits on each (the
 * kernels are built without FMA contraction). Within 2 ulp of the exact
 * values; NaN passes through; results below the smallest subnormal are 0,
 * above FLT_MAX infinity. */
#ifndef KILN_ENGINE_VMATH_H
#define KILN_ENGINE_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* 2^k for integral k in [-126, 127], from the exponent bits. */
static inline float kn_pow2i(float k) {
  const int32_t bits = ((int32_t)k + 127) * (1 << 23);
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* e^r for |r| <= ln(2) / 2 as 1 + r + r^2 Q(r), Q of degree 4 fitted to
 * a relative error of 3.1e-9 (in exact arithmetic): two terms fewer than
 * the Taylor series for the same accuracy. */
static inline float kn_vexp_reduced(float r) {
  float q = 0.00138145f;
  q = q * r + 0.00836871f;
  q = q * r + 0.04166839f;
  q = q * r + 0.16666521f;
  q = q * r + 0.49999993f;
  return 1.0f + (r + (r * r) * q);
}

/* n = round(x / ln 2) as a float and r = x - n ln 2 from a two-part
 * ln 2 (the first part's product with n is exact). */
static inline float kn_vexp_split(float x, float *r) {
  const float round = 12582912.0f; /* 1.5 x 2^23: adding it rounds to an integer */
  const float n = (x * 1.44269504f + round) - round;
  *r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  return n;
}

/* e^x for x in [-87.3, 88], where 2^n is one normal float: the exp the
 * activations use once they have put x in that range themselves (no
 * clamps or selects of its own; outside the range the result is
 * undefined). */
static inline float kn_vexpf_normal(float x) {
  float r;
  const float n = kn_vexp_split(x, &r);
  return kn_vexp_reduced(r) * kn_pow2i(n);
}

/* e^x for any x <= 0, with results that would be subnormal (x < -87.3)
 * flushed to 0; NaN gives an unspecified value (the callers pass NaN on
 * themselves). */
static inline float kn_vexpf_neg(float x) {
  const float lo = -87.3f;
  const float e = kn_vexpf_normal(x > lo ? x : lo);
  return x < lo ? 0.0f : e;
}

/* e^x = 2^n e^r with n = round(x / ln 2) and |r| <= ln(2) / 2 (above),
 * 2^n as two factors so that subnormal results and e^88.7 come out
 * right. */
static inline float kn_vexpf(float x) {
  const float hi = 88.7228394f, lo = -103.972084f; /* ln(FLT_MAX), ln(2^-150) */
  float xc = x < hi ? x : hi;                      /* a NaN takes hi here */
  xc = xc > lo ? xc : lo;
  float r;
  const float n = kn_vexp_split(xc, &r);
  const float round = 12582912.0f;
  const float n1 = (n * 0.5f + round) - round; /* n = n1 + n2, each in [-75, 64] */
  float e = kn_vexp_reduced(r) * kn_pow2i(n1) * kn_pow2i(n - n1);
  e = x > lo ? e : 0.0f;
  e = x < hi ? e : INFINITY;
  return x == x ? e : x;
}

/* tanh: an odd polynomial (x + x^3 P(x^2), fitted to a relative error of
 * 5e-9) below 0.625, 1 - 2 / (e^2|x| + 1) with x's sign above, |x| taken
 * no further than 10 (tanh is 1 in float from 9.011 on), so that e^2|x| is
 * one normal float. */
static inline float kn_vtanhf(float x) {
  const float a = x < 0 ? -x : x, u = x * x;
  const float s = a < 10.0f ? a : 10.0f; /* a NaN takes 10 here */
  float p = -0.00571740093f;
  p = p * u + 0.0206508972f;
  p = p * u + -0.0537435897f;
  p = p * u + 0.133314922f;
  p = p * u + -0.333332837f;
  const float small = x + x * u * p;
  const float big = 1.0f - 2.0f / (kn_vexpf_normal(2.0f * s) + 1.0f);
  const float t = s < 0.625f ? small : (x < 0 ? -big : big);
  return x == x ? t : x;
}

/* The standard normal distribution's tail P(N(0, 1) > |x|) =
 * erfc(z) / 2 with z = |x| / sqrt 2, as t Q(t) e^(-z^2) / 2 with
 * t = 1 / (1 + z / 2) (Numerical Recipes' erfcc variable, which takes
 * z in [0, inf) to (0, 1]) and Q of degree 8 fitted to erfc(z) e^(z^2) / t
 * for z up to 9.4 (a relative error of 8e-8 with float coefficients;
 * beyond, the tail is below FLT_MIN and flushed to 0): the tail below 0
 * keeps its relative accuracy, no library call stops the loop from
 * vectorizing, and e^(-z^2) = e^(-x^2 / 2) is left in *gauss for the
 * density GELU's gradient needs, so that it takes one exp, not two. */
static inline float kn_vnormtailf(float x, float *gauss) {
  const float z = (x < 0 ? -x : x) * 0.707106781f;
  const float t = 1.0f / (1.0f + 0.5f * z);
  float q = -0.0588479117f;
  q = q * t + 0.283491522f;
  q = q * t + -0.48494485f;
  q = q * t + 0.275471896f;
  q = q * t + -0.0248255692f;
  q = q * t + 0.201919168f;
  q = q * t + 0.243299589f;
  q = q * t + 0.282348096f;
  q = q * t + 0.282087982f;
  *gauss = kn_vexpf_neg(-(z * z));
  return (0.5f * t) * q * *gauss;
}

/* The standard normal CDF, P(N(0, 1) <= x), which GELU needs: within
 * 2e-7 of the exact value everywhere and to a relative 1e-4 in the tail
 * below 0 (tested); NaN passes through. */
static inline float kn_vnormcdff(float x) {
  float gauss;
  const float tail = kn_vnormtailf(x, &gauss);
  const float r = x < 0 ? tail : 1.0f - tail;
  return x == x ? r : x;
}

/* GELU's derivative, d/dx x P(N(0, 1) <= x) = P(N(0, 1) <= x) + x phi(x)
 * with phi the standard normal density, from one exp; NaN passes
 * through. */
static inline float kn_vgelu_slopef(float x) {
  float gauss;
  const float tail = kn_vnormtailf(x, &gauss);
  const float cdf = x < 0 ? tail : 1.0f - tail;
  const float r = cdf + x * (gauss * 0.398942280f);
  return x == x ? r : x;
}

#endif
