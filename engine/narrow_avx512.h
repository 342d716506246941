/* narrow_avx512.h — narrow.h's bf16 rounding and widening sixteen values at
 * a time, for the kernels built for AVX-512F (kiln's bf16 GEMM, the
 * Winograd products, the direct small convolutions): the same bits as kn_bf16_from_f32,
 * round to nearest even in integers, subnormals kept (the CPU's own bf16
 * conversion would flush them), NaN a quiet NaN. x86-64 with GCC only. */
#ifndef KILN_ENGINE_NARROW_AVX512_H
#define KILN_ENGINE_NARROW_AVX512_H

#include <immintrin.h>
#include <stdint.h>

/* The bf16 bits of v's lanes, each in the low half of a 32-bit lane. */
__attribute__((target("avx512f"), always_inline)) static inline __m512i
kn_bf16_round_avx512(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
}

/* ---- the CPU's own conversion, where it has one (AVX512-BF16) ----
 *
 * vcvtneps2bf16 rounds to nearest even as kn_bf16_round_avx512 does, NaN
 * to a quiet NaN alike, but flushes subnormals to zero (of their sign): a
 * vector holding one takes the integer rounding instead, so the bits are
 * kn_bf16_from_f32's everywhere. Two instructions against the integer
 * rounding's seven and a narrowing shuffle. Written as asm so that kernels
 * built for AVX-512F alone can hold it: only kernels that run where the CPU
 * has AVX512-BF16 (the bf16 GEMM's, Winograd's bf16 products) call these. */

/* The lanes of v that hold subnormals (exponent bits zero, mantissa not). */
__attribute__((target("avx512f"), always_inline)) static inline __mmask16
kn_subnormal_lanes_avx512(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  return _mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7F800000)), u,
                                     _mm512_set1_epi32(0x007FFFFF));
}

/* v's 16 lanes rounded to bf16, packed. */
__attribute__((target("avx512f"), always_inline)) static inline __m256i
kn_bf16_pack16_native(__m512 v) {
  if (__builtin_expect(kn_subnormal_lanes_avx512(v) != 0, 0))
    return _mm512_cvtepi32_epi16(kn_bf16_round_avx512(v));
  __m256i r;
  __asm__("vcvtneps2bf16 %1, %0" : "=v"(r) : "v"(v));
  return r;
}

/* a's lanes, then b's, rounded to bf16: 32 values. */
__attribute__((target("avx512f,avx512bw"), always_inline)) static inline __m512i
kn_bf16_pack32_native(__m512 a, __m512 b) {
  if (__builtin_expect((kn_subnormal_lanes_avx512(a) | kn_subnormal_lanes_avx512(b)) != 0, 0)) {
    /* each 128-bit lane of the pack: four of a, then four of b (the values
     * fit 16 bits unsigned: no saturation); the permute orders them */
    const __m512i packed = _mm512_packus_epi32(kn_bf16_round_avx512(a), kn_bf16_round_avx512(b));
    return _mm512_permutexvar_epi64(_mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0), packed);
  }
  __m512i r; /* the low half from the last source operand */
  __asm__("vcvtne2ps2bf16 %2, %1, %0" : "=v"(r) : "v"(b), "v"(a));
  return r;
}

/* v rounded through bf16, back in f32 (kn_bf16_round_f32's bits). */
__attribute__((target("avx512f"), always_inline)) static inline __m512
kn_bf16_round_f32_native(__m512 v) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(kn_bf16_pack16_native(v)), 16));
}

/* Sixteen bf16 values, widened to floats (exactly: the low halves zero). */
__attribute__((target("avx512f"), always_inline)) static inline __m512
kn_bf16_widen_avx512(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Sixteen values from p: floats, or (bf16) bf16 values widened. */
__attribute__((target("avx512f"), always_inline)) static inline __m512
kn_load16_avx512(const void *p, int bf16) {
  return bf16 ? kn_bf16_widen_avx512(_mm256_loadu_si256(p)) : _mm512_loadu_ps(p);
}

/* The elementwise kernels' end of a value under mixed_bfloat16: a relu
 * (KN_RELU's: below zero to zero, NaN and -0 kept), a rounding through
 * bf16 (round), then v stored as floats at y and its bf16 bits at nc,
 * each where not NULL (the rounded value's bits are its high half). */
__attribute__((target("avx512f"), always_inline)) static inline void
kn_relu_round_store_avx512(__m512 v, int relu, int round, float *y, uint16_t *nc) {
  if (relu)
    v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ),
                           _mm512_setzero_ps());
  if (round || nc) {
    const __m512i r = kn_bf16_round_avx512(v);
    if (round) v = _mm512_castsi512_ps(_mm512_slli_epi32(r, 16));
    if (nc) _mm256_storeu_si256((void *)nc, _mm512_cvtepi32_epi16(r));
  }
  if (y) _mm512_storeu_ps(y, v);
}

/* r[i] (16 rows of 16 32-bit words) transposed in place: r[i] lane l
 * holds what r[l] lane i held. */
__attribute__((target("avx512f"), always_inline)) static inline void
kn_transpose16_avx512(__m512i *r) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) { /* u[i + m]: rows i .. i + 3 of column 4 lane + m */
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int m = 0; m < 4; m++) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x88),
                  v1 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xDD),
                  w0 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x88),
                  w1 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xDD);
    r[m] = _mm512_shuffle_i32x4(v0, w0, 0x88);
    r[4 + m] = _mm512_shuffle_i32x4(v1, w1, 0x88);
    r[8 + m] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
    r[12 + m] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
  }
}

/* The mask of a vector's first n lanes (all 16 from n = 16 on). */
static inline __mmask16 kn_lanes_avx512(int n) {
  return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

#endif
