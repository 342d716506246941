/* fma_peak.c — this machine's single-core fused multiply-add peak: 256-bit
 * (AVX2 + FMA) and, where the CPU has it, 512-bit (AVX-512F) FMA chains,
 * independent enough to fill the pipelines. Prints one JSON line in
 * GFLOP/s (2 FLOPs per lane per FMA). The paths are chosen at run time, so
 * the binary runs on any x86-64. */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define ITERS 200000000L

/* Ten (twelve) named accumulators: independent chains that stay in
 * registers, enough to cover FMA latency times the number of FMA ports. */
#define CHAIN10(op, a, b)                                                                          \
  c0 = op(c0, a, b), c1 = op(c1, a, b), c2 = op(c2, a, b), c3 = op(c3, a, b), c4 = op(c4, a, b),   \
  c5 = op(c5, a, b), c6 = op(c6, a, b), c7 = op(c7, a, b), c8 = op(c8, a, b), c9 = op(c9, a, b)

__attribute__((target("avx2,fma"))) static double peak256(void) {
  __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  __m256 c0 = _mm256_set1_ps(0.f), c1 = _mm256_set1_ps(1.f), c2 = _mm256_set1_ps(2.f),
         c3 = _mm256_set1_ps(3.f), c4 = _mm256_set1_ps(4.f), c5 = _mm256_set1_ps(5.f),
         c6 = _mm256_set1_ps(6.f), c7 = _mm256_set1_ps(7.f), c8 = _mm256_set1_ps(8.f),
         c9 = _mm256_set1_ps(9.f);
  double t0 = now();
  for (long it = 0; it < ITERS / 10; it++) CHAIN10(_mm256_fmadd_ps, a, b);
  double secs = now() - t0;
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                           _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)));
  s = _mm256_add_ps(s, _mm256_add_ps(c8, c9));
  float sink[8];
  _mm256_storeu_ps(sink, s);
  if (sink[0] == 12345.0f) printf("#");
  return (double)ITERS * 8 * 2 / secs / 1e9;
}

__attribute__((target("avx512f"))) static double peak512(void) {
  __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  __m512 c0 = _mm512_set1_ps(0.f), c1 = _mm512_set1_ps(1.f), c2 = _mm512_set1_ps(2.f),
         c3 = _mm512_set1_ps(3.f), c4 = _mm512_set1_ps(4.f), c5 = _mm512_set1_ps(5.f),
         c6 = _mm512_set1_ps(6.f), c7 = _mm512_set1_ps(7.f), c8 = _mm512_set1_ps(8.f),
         c9 = _mm512_set1_ps(9.f);
  double t0 = now();
  for (long it = 0; it < ITERS / 10; it++) CHAIN10(_mm512_fmadd_ps, a, b);
  double secs = now() - t0;
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                           _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
  s = _mm512_add_ps(s, _mm512_add_ps(c8, c9));
  if (_mm512_reduce_add_ps(s) == 12345.0f) printf("#");
  return (double)ITERS * 16 * 2 / secs / 1e9;
}

int main(void) {
  __builtin_cpu_init();
  double p256 = 0, p512 = 0;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) p256 = peak256();
  if (__builtin_cpu_supports("avx512f")) p512 = peak512();
  printf("{\"fma256_gflops_per_core\":%.1f,\"fma512_gflops_per_core\":%.1f}\n", p256, p512);
  return 0;
}
