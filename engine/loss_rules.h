/* loss_rules.h — the losses' per-row and per-element arithmetic as the
 * CUDA kernels (cuda/cuda.cu) and the tests' GPU stand-in and reference
 * (tests/cuda/kernels_ref.h) run it, in the CPU kernels' order and
 * precision (cpu_kernels.inc: each row's or element's term in double, the
 * softmax in float): one text for every device, as optim_rules.h is for
 * the optimizers. Plain C; under nvcc host and device functions. */
#ifndef KILN_ENGINE_LOSS_RULES_H
#define KILN_ENGINE_LOSS_RULES_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define KN_LOSS_FN static inline __host__ __device__
#else
#define KN_LOSS_FN static inline
#endif

/* log(sum(exp(row))) of cols floats, shifted by their max, in double. */
KN_LOSS_FN double kn_loss_lse(const float *row, size_t cols) {
  float max = row[0];
  for (size_t c = 1; c < cols; c++) max = row[c] > max ? row[c] : max;
  double sum = 0.0;
  for (size_t c = 0; c < cols; c++) sum += exp((double)(row[c] - max));
  return log(sum) + (double)max;
}

/* d = softmax(row) in float, shifted by the row's max. */
KN_LOSS_FN void kn_loss_softmax(const float *row, float *d, size_t cols) {
  float max = row[0], sum = 0.0f;
  for (size_t c = 1; c < cols; c++) max = row[c] > max ? row[c] : max;
  for (size_t c = 0; c < cols; c++) {
    d[c] = expf(row[c] - max);
    sum += d[c];
  }
  const float inv = 1.0f / sum;
  for (size_t c = 0; c < cols; c++) d[c] *= inv;
}

/* Sparse softmax cross-entropy: a row's term, and its gradient row
 * (softmax less 1 at the label, times scale = dloss / rows). */
KN_LOSS_FN double kn_loss_xent_term(const float *row, int32_t label, size_t cols) {
  return kn_loss_lse(row, cols) - (double)row[label];
}

KN_LOSS_FN void kn_loss_xent_grad(const float *row, int32_t label, float scale, float *d,
                                  size_t cols) {
  kn_loss_softmax(row, d, cols);
  d[label] -= 1.0f;
  for (size_t c = 0; c < cols; c++) d[c] *= scale;
}

/* Categorical cross-entropy against target probabilities p: a row's term
 * p . (lse - row), and its gradient row (softmax * sum(p) - p) * scale. */
KN_LOSS_FN double kn_loss_xent_dense_term(const float *row, const float *p, size_t cols) {
  const double lse = kn_loss_lse(row, cols);
  double total = 0.0;
  for (size_t c = 0; c < cols; c++) total += (double)p[c] * (lse - (double)row[c]);
  return total;
}

KN_LOSS_FN void kn_loss_xent_dense_grad(const float *row, const float *p, float scale, float *d,
                                        size_t cols) {
  float psum = 0.0f;
  for (size_t c = 0; c < cols; c++) psum += p[c];
  kn_loss_softmax(row, d, cols);
  for (size_t c = 0; c < cols; c++) d[c] = (d[c] * psum - p[c]) * scale;
}

/* Binary cross-entropy on a logit x against target t: the term, stable
 * for any x, and its gradient (sigmoid(x) - t) * scale (the sigmoid as
 * the activation's: e^-|x| either way). */
KN_LOSS_FN double kn_loss_bce_term(float x, float t) {
  const double v = (double)x;
  return (v > 0 ? v : 0) - v * (double)t + log1p(exp(-fabs(v)));
}

KN_LOSS_FN float kn_loss_bce_grad(float x, float t, float scale) {
  const float e = expf(-fabsf(x));
  return ((x >= 0 ? 1 / (1 + e) : e / (1 + e)) - t) * scale;
}

#endif
