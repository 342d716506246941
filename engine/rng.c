/* rng.c — seeded random numbers (xoshiro256** fed by splitmix64) and the
 * parameter initializers built on them. */
#include <math.h>

#include "graph_internal.h"

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void kn_rng_seed(kn_rng *r, uint64_t seed) {
  uint64_t x = seed;
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

uint64_t kn_rng_next(kn_rng *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

float kn_rng_uniform(kn_rng *r) {
  return (float)(kn_rng_next(r) >> 40) * (1.0f / 16777216.0f); /* 24 random bits */
}

uint64_t kn_rng_below(kn_rng *r, uint64_t n) {
  if (n == 0) return 0;
  /* Reject the top sliver so every value is equally likely. */
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t v;
  do v = kn_rng_next(r);
  while (v >= limit);
  return v % n;
}

void kn_init_fill(kn_init init, float *data, size_t count, int fan_in, int fan_out, kn_rng *rng) {
  switch (init) {
  case KN_INIT_ZEROS:
    for (size_t i = 0; i < count; i++) data[i] = 0.0f;
    return;
  case KN_INIT_ONES:
    for (size_t i = 0; i < count; i++) data[i] = 1.0f;
    return;
  case KN_INIT_GLOROT_UNIFORM:
  case KN_INIT_HE_UNIFORM: {
    float denom = (float)(init == KN_INIT_HE_UNIFORM ? fan_in : fan_in + fan_out) / 2.0f;
    float limit = sqrtf(3.0f / denom);
    for (size_t i = 0; i < count; i++) data[i] = (2.0f * kn_rng_uniform(rng) - 1.0f) * limit;
    return;
  }
  case KN_INIT_GLOROT_NORMAL:
  case KN_INIT_HE_NORMAL: {
    /* Keras: a normal truncated at 2 standard deviations, its stddev
     * corrected (/ 0.8796...) so the truncated draw has variance 2/fan. */
    double denom = (init == KN_INIT_HE_NORMAL ? fan_in : fan_in + fan_out) / 2.0;
    double stddev = sqrt(1.0 / denom) / 0.87962566103423978;
    for (size_t i = 0; i < count; i++) {
      double z;
      do {
        /* Box-Muller from two 24-bit uniforms; u1 in (0, 1]. */
        double u1 = 1.0 - kn_rng_uniform(rng), u2 = kn_rng_uniform(rng);
        z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
      } while (z < -2.0 || z > 2.0);
      data[i] = (float)(z * stddev);
    }
    return;
  }
  }
}
