/* teacher.c — see teacher.h. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "teacher.h"

kn_dataset teacher_data(int64_t n) {
  kn_dataset ds = {.n = n, .ndim = 1, .shape = {TEACHER_INPUTS}, .example_size = TEACHER_INPUTS};
  ds.n_classes = TEACHER_OUTPUTS;
  ds.x = malloc((size_t)n * TEACHER_INPUTS * sizeof(float));
  ds.y = malloc((size_t)n * sizeof(int32_t));
  assert_non_null(ds.x);
  assert_non_null(ds.y);
  kn_rng rng;
  kn_rng_seed(&rng, 2024);
  float teacher[TEACHER_OUTPUTS][TEACHER_INPUTS];
  for (int o = 0; o < TEACHER_OUTPUTS; o++)
    for (int i = 0; i < TEACHER_INPUTS; i++) teacher[o][i] = 2.0f * kn_rng_uniform(&rng) - 1.0f;
  for (int64_t e = 0; e < n; e++) {
    float *x = ds.x + e * TEACHER_INPUTS;
    for (int i = 0; i < TEACHER_INPUTS; i++) x[i] = 2.0f * kn_rng_uniform(&rng) - 1.0f;
    int best = 0;
    float best_score = -INFINITY;
    for (int o = 0; o < TEACHER_OUTPUTS; o++) {
      float score = 0.0f;
      for (int i = 0; i < TEACHER_INPUTS; i++) score += teacher[o][i] * x[i];
      if (score > best_score) {
        best_score = score;
        best = o;
      }
    }
    ds.y[e] = best;
  }
  return ds;
}
