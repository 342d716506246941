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

/* e^x = 2^n e^r with n = round(x / ln 2) and |r| <= ln(2) / 2: r from a
 * two-part ln 2 (the first part's product with n is exact), e^r by its
 * Taylor series to r^7 (error below 2^-27 on that range), 2^n as two
 * factors so that subnormal results and e^88.7 come out right. */
static inline float kn_vexpf(float x) {
  const float hi = 88.7228394f, lo = -103.972084f; /* ln(FLT_MAX), ln(2^-150) */
  float xc = x < hi ? x : hi;                      /* a NaN takes hi here */
  xc = xc > lo ? xc : lo;
  const float round = 12582912.0f; /* 1.5 x 2^23: adding it rounds to an integer */
  const float n = (xc * 1.44269504f + round) - round;
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float n1 = (n * 0.5f + round) - round; /* n = n1 + n2, each in [-75, 64] */
  float e = p * kn_pow2i(n1) * kn_pow2i(n - n1);
  e = x > lo ? e : 0.0f;
  e = x < hi ? e : INFINITY;
  return x == x ? e : x;
}

/* tanh: an odd polynomial (x + x^3 P(x^2), fitted to a relative error of
 * 5e-9) below 0.625, 1 - 2 / (e^2|x| + 1) with x's sign above. */
static inline float kn_vtanhf(float x) {
  const float s = x < 0 ? -x : x, u = x * x;
  float p = -0.00571740093f;
  p = p * u + 0.0206508972f;
  p = p * u + -0.0537435897f;
  p = p * u + 0.133314922f;
  p = p * u + -0.333332837f;
  const float small = x + x * u * p;
  const float big = 1.0f - 2.0f / (kn_vexpf(2.0f * s) + 1.0f);
  const float t = s < 0.625f ? small : (x < 0 ? -big : big);
  return x == x ? t : x;
}

/* The standard normal CDF, P(N(0, 1) <= x) = erfc(-x / sqrt 2) / 2, which
 * GELU needs (x times it, and its derivative): erfc(z) for z >= 0 as
 * t e^(-z^2 + P(t)), t = 1 / (1 + z / 2), P of degree 9 (Numerical
 * Recipes' erfcc: relative error below 1.2e-7 in exact arithmetic), so
 * the tail below 0 keeps its relative accuracy and no library call stops
 * the loop from vectorizing. Within 1e-6 of the exact value everywhere
 * (tested); NaN passes through. */
static inline float kn_vnormcdff(float x) {
  const float z = (x < 0 ? -x : x) * 0.707106781f;
  const float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t + -0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t + -1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t + -0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t + -1.26551223f;
  const float tail = 0.5f * t * kn_vexpf(p - z * z); /* P(N(0, 1) > |x|) */
  const float r = x < 0 ? tail : 1.0f - tail;
  return x == x ? r : x;
}

#endif
