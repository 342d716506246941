/* narrow.h — float32 to bfloat16 and to IEEE half (f16) and back, round to
 * nearest even, bit for bit the same on every device: the CPU kernels and
 * tensor.c's conversions (through graph_internal.h), the CUDA kernels
 * (cuda/cuda.cu) and the tests' GPU stand-in. Plain C; under nvcc host and
 * device functions. */
#ifndef KILN_ENGINE_NARROW_H
#define KILN_ENGINE_NARROW_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define KN_NARROW_FN static inline __host__ __device__
#else
#define KN_NARROW_FN static inline
#endif

/* f32 to bf16 bits, round to nearest even (NaN stays a quiet NaN). */
KN_NARROW_FN uint16_t kn_bf16_from_f32(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  const uint32_t nearest_even = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  /* a select, not a branch: loops over it vectorize */
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : nearest_even);
}

/* f rounded through bf16: kn_bf16_to_f32(kn_bf16_from_f32(f))'s bits,
 * kept in the high half of the word (no trip through 16-bit lanes, so
 * loops over it vectorize on whole words). */
KN_NARROW_FN float kn_bf16_round_f32(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  const uint32_t nearest_even = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const uint32_t quiet_nan = (u & 0xffff0000u) | 0x00400000u;
  const uint32_t r = (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : nearest_even;
  float o;
  memcpy(&o, &r, sizeof o);
  return o;
}

/* The bf16 bits of an f32 value that is a bf16 value already (rounded
 * through bf16): its high half, as kn_bf16_from_f32 would round it. */
KN_NARROW_FN uint16_t kn_bf16_high(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)(u >> 16);
}

KN_NARROW_FN float kn_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* f32 to f16 bits, round to nearest even: NaN stays a (quiet) NaN, past
 * 65504 rounds to infinity, below f16's smallest subnormal to (signed) 0. */
KN_NARROW_FN uint16_t kn_f16_from_f32(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  /* NaN */
  if (abs >= 0x477ff000u) return sign | 0x7c00u; /* rounds to inf */
  if (abs < 0x38800000u) {                       /* subnormal or zero in f16 */
    /* Scale into the subnormal range, letting the FPU round to nearest even. */
    float a;
    memcpy(&a, &abs, sizeof a);
    return sign | (uint16_t)lrintf(a * 16777216.0f); /* 2^24 */
  }
  const uint32_t mant = abs & 0x7fffffu;
  const int32_t exp = (int32_t)(abs >> 23) - 127 + 15;
  uint32_t h = ((uint32_t)exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* carries into the exponent fine */
  return sign | (uint16_t)h;
}

KN_NARROW_FN float kn_f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t u;
  float f;
  if (exp == 0) {
    f = (float)mant / 16777216.0f; /* mant * 2^-24 */
    return sign ? -f : f;
  }
  u = exp == 31 ? sign | 0x7f800000u | (mant << 13)
                : sign | ((exp - 15 + 127) << 23) | (mant << 13);
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Element i of a cast by mode: 0 f32 to bf16, 1 bf16 to f32, 2 f32
 * rounded through bf16, 3 to 5 the same with f16 (the CUDA module's
 * kn_cuda_cast), x and y as their types say. */
KN_NARROW_FN void kn_narrow_cast_at(const void *x, void *y, size_t i, int mode) {
  const float *xf = (const float *)x;
  const uint16_t *xh = (const uint16_t *)x;
  switch (mode) {
  case 0: ((uint16_t *)y)[i] = kn_bf16_from_f32(xf[i]); break;
  case 1: ((float *)y)[i] = kn_bf16_to_f32(xh[i]); break;
  case 2: ((float *)y)[i] = kn_bf16_round_f32(xf[i]); break;
  case 3: ((uint16_t *)y)[i] = kn_f16_from_f32(xf[i]); break;
  case 4: ((float *)y)[i] = kn_f16_to_f32(xh[i]); break;
  default: ((float *)y)[i] = kn_f16_to_f32(kn_f16_from_f32(xf[i]));
  }
}

#endif
