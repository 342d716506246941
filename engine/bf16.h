/* bf16.h — float32 to bfloat16 and back, bit for bit the same on every
 * device: the CPU kernels (through graph_internal.h), the CUDA kernels
 * (cuda/cuda.cu) and the tests' GPU stand-in. Plain C; under nvcc host and
 * device functions. */
#ifndef KILN_ENGINE_BF16_H
#define KILN_ENGINE_BF16_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define KN_BF16_FN static inline __host__ __device__
#else
#define KN_BF16_FN static inline
#endif

/* f32 to bf16 bits, round to nearest even (NaN stays a quiet NaN). */
KN_BF16_FN uint16_t kn_bf16_from_f32(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  const uint32_t nearest_even = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  /* a select, not a branch: loops over it vectorize */
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : nearest_even);
}

KN_BF16_FN float kn_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

#endif
