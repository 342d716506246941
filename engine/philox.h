/* philox.h — private to engine/: Philox4x32-10 (Salmon, Moraes, Dror and
 * Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011), the
 * counter-based generator of Random123, cuRAND and JAX: four 32-bit words
 * of a counter scrambled under a 64-bit key by ten rounds of two 32 x 32
 * -> 64-bit products. The n-th number depends only on (key, stream, n),
 * so any thread can draw any element, and no state is kept. */
#ifndef KILN_ENGINE_PHILOX_H
#define KILN_ENGINE_PHILOX_H

#include <stdint.h>

/* Under nvcc the scalar generator is a host and device function: the CUDA
 * dropout kernel draws the CPU's words. */
#ifdef __CUDACC__
#define KN_PHILOX_FN static inline __host__ __device__
#else
#define KN_PHILOX_FN static inline
#endif

#define KN_PHILOX_M0 0xD2511F53u
#define KN_PHILOX_M1 0xCD9E8D57u
#define KN_PHILOX_W0 0x9E3779B9u /* the golden ratio's 32 bits */
#define KN_PHILOX_W1 0xBB67AE85u /* sqrt(3) - 1's */

/* The block of four words for counter c under key (k0, k1), in place. */
KN_PHILOX_FN void kn_philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; r++) {
    const uint64_t p0 = (uint64_t)KN_PHILOX_M0 * c[0], p1 = (uint64_t)KN_PHILOX_M1 * c[2];
    const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
    c[1] = (uint32_t)p1;
    c[3] = (uint32_t)p0;
    c[0] = n0;
    c[2] = n2;
    k0 += KN_PHILOX_W0;
    k1 += KN_PHILOX_W1;
  }
}

/* Word n of the stream (key, stream). Words come in groups of 64, each
 * sixteen consecutive blocks (counter = (block, stream), 64 bits each):
 * word 64q + 16j + l is word j of block 16q + l, so that a vector of
 * sixteen lanes holds one word of sixteen blocks and a group is four
 * vector stores (kn_philox_group). */
KN_PHILOX_FN uint32_t kn_philox_word(uint64_t key, uint64_t stream, uint64_t n) {
  const uint64_t block = ((n >> 6) << 4) | (n & 15);
  uint32_t c[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                   (uint32_t)(stream >> 32)};
  kn_philox4x32_10(c, (uint32_t)key, (uint32_t)(key >> 32));
  return c[(n >> 4) & 3];
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#include <immintrin.h>
#define KN_PHILOX_GROUP 1

/* 32 x 32 -> 64-bit products of m and each lane of c: the low halves
 * into *lo, the high into *hi. */
__attribute__((target("avx512f"))) static inline void kn_philox_mulhilo(__m512i c, __m512i m,
                                                                        __m512i *lo, __m512i *hi) {
  const __m512i even = _mm512_mul_epu32(c, m), odd = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), m);
  *lo = _mm512_mask_blend_epi32((__mmask16)0xAAAA, even, _mm512_slli_epi64(odd, 32));
  *hi = _mm512_mask_blend_epi32((__mmask16)0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

/* Words [64q, 64q + 64) of the stream into out: kn_philox_word's, sixteen
 * blocks at a time (AVX-512F). */
__attribute__((target("avx512f"))) static inline void
kn_philox_group(uint64_t key, uint64_t stream, uint64_t q, uint32_t out[64]) {
  const uint64_t block = q << 4; /* its low 4 bits free: + lane never carries */
  __m512i c0 =
      _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)block),
                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  __m512i c1 = _mm512_set1_epi32((int)(uint32_t)(block >> 32));
  __m512i c2 = _mm512_set1_epi32((int)(uint32_t)stream);
  __m512i c3 = _mm512_set1_epi32((int)(uint32_t)(stream >> 32));
  const __m512i m0 = _mm512_set1_epi64(KN_PHILOX_M0), m1 = _mm512_set1_epi64(KN_PHILOX_M1);
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  for (int r = 0; r < 10; r++) {
    __m512i lo0, hi0, lo1, hi1;
    kn_philox_mulhilo(c0, m0, &lo0, &hi0);
    kn_philox_mulhilo(c2, m1, &lo1, &hi1);
    c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32((int)k0));
    c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32((int)k1));
    c1 = lo1;
    c3 = lo0;
    k0 += KN_PHILOX_W0;
    k1 += KN_PHILOX_W1;
  }
  _mm512_storeu_si512(out, c0);
  _mm512_storeu_si512(out + 16, c1);
  _mm512_storeu_si512(out + 32, c2);
  _mm512_storeu_si512(out + 48, c3);
}
#endif

#endif
