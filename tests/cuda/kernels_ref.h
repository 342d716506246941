/* kernels_ref.h — plain loops for the CUDA backend's kernels beyond GEMMs
 * and elementwise ops: the windows' (im2col, col2im, pooling and its
 * gradient over NHWC images, written as the CPU kernels run them,
 * cpu_kernels_conv.inc: a scatter over the windows in row-major order),
 * the casts, reductions over an axis, and batch norm's (each channel's
 * sums in double, row by row), for the host stand-in of the CUDA module
 * (host_gpus.c) and the reference of test_cuda.c. The device kernels
 * gather instead, and sum batch norm's rows in blocks; test_cuda checks
 * they agree (bit for bit but for batch norm's sums). */
#ifndef KILN_TESTS_CUDA_KERNELS_REF_H
#define KILN_TESTS_CUDA_KERNELS_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "loss_rules.h"
#include "narrow.h"
#include "cuda/cuda.h"

static inline size_t ref_pixel(const kn_cuda_windows *w, int b, int ih, int iw) {
  return (((size_t)b * w->h + ih) * w->w + iw) * w->c;
}

static inline void ref_im2col(const kn_cuda_windows *w, const float *x, float *cols) {
  const size_t width = (size_t)w->kh * w->kw * w->c;
  for (int b = 0; b < w->batch; b++)
    for (int oh = 0; oh < w->oh; oh++)
      for (int ow = 0; ow < w->ow; ow++)
        for (int ki = 0; ki < w->kh; ki++)
          for (int kj = 0; kj < w->kw; kj++) {
            const int ih = oh * w->sh - w->pad_top + ki * w->dh;
            const int iw = ow * w->sw - w->pad_left + kj * w->dw;
            float *dst = cols + (((size_t)b * w->oh + oh) * w->ow + ow) * width +
                         ((size_t)ki * w->kw + kj) * w->c;
            const int inside = ih >= 0 && ih < w->h && iw >= 0 && iw < w->w;
            for (int ch = 0; ch < w->c; ch++)
              dst[ch] = inside ? x[ref_pixel(w, b, ih, iw) + ch] : 0;
          }
}

static inline void ref_col2im(const kn_cuda_windows *w, const float *cols, float *dx) {
  const size_t width = (size_t)w->kh * w->kw * w->c;
  memset(dx, 0, (size_t)w->batch * w->h * w->w * w->c * sizeof *dx);
  for (int b = 0; b < w->batch; b++)
    for (int oh = 0; oh < w->oh; oh++)
      for (int ow = 0; ow < w->ow; ow++)
        for (int ki = 0; ki < w->kh; ki++)
          for (int kj = 0; kj < w->kw; kj++) {
            const int ih = oh * w->sh - w->pad_top + ki * w->dh;
            const int iw = ow * w->sw - w->pad_left + kj * w->dw;
            if (ih < 0 || ih >= w->h || iw < 0 || iw >= w->w) continue;
            const float *src = cols + (((size_t)b * w->oh + oh) * w->ow + ow) * width +
                               ((size_t)ki * w->kw + kj) * w->c;
            for (int ch = 0; ch < w->c; ch++) dx[ref_pixel(w, b, ih, iw) + ch] += src[ch];
          }
}

/* A pooling window's cells inside the image. */
static inline void ref_window(const kn_cuda_windows *w, int oh, int ow, int *h0, int *h1, int *w0,
                              int *w1) {
  const int hs = oh * w->sh - w->pad_top, ws = ow * w->sw - w->pad_left;
  *h0 = hs < 0 ? 0 : hs;
  *h1 = hs + w->kh > w->h ? w->h : hs + w->kh;
  *w0 = ws < 0 ? 0 : ws;
  *w1 = ws + w->kw > w->w ? w->w : ws + w->kw;
}

/* Forward (dx NULL): y from x; the gradient: dx from dy, x and the
 * forward's y (read through y_fwd). NaN's rules are the CPU's: a NaN cell
 * is the max, and the first max cell takes dy. */
static inline void ref_pool(const kn_cuda_windows *w, const float *x, float *y, const float *y_fwd,
                            const float *dy, float *dx) {
  const int grad = dx != NULL;
  if (grad) memset(dx, 0, (size_t)w->batch * w->h * w->w * w->c * sizeof *dx);
  for (int b = 0; b < w->batch; b++)
    for (int oh = 0; oh < w->oh; oh++)
      for (int ow = 0; ow < w->ow; ow++) {
        int h0, h1, w0, w1;
        ref_window(w, oh, ow, &h0, &h1, &w0, &w1);
        const float inv = 1.0f / (float)((h1 - h0) * (w1 - w0));
        for (int ch = 0; ch < w->c; ch++) {
          const size_t o = (((size_t)b * w->oh + oh) * w->ow + ow) * w->c + ch;
          float acc = w->max ? x[ref_pixel(w, b, h0, w0) + ch] : 0.0f;
          int taken = 0;
          for (int ih = h0; ih < h1; ih++)
            for (int iw = w0; iw < w1; iw++) {
              const size_t at = ref_pixel(w, b, ih, iw) + ch;
              const float v = x[at];
              if (!grad) {
                acc = w->max ? ((v > acc || v != v) ? v : acc) : acc + v;
              } else if (w->max) {
                const int hit = !taken && (v == y_fwd[o] || v != v);
                dx[at] += hit ? dy[o] : 0.0f;
                taken |= hit;
              } else {
                dx[at] += dy[o] * inv;
              }
            }
          if (!grad) y[o] = w->max ? acc : acc * inv;
        }
      }
}

static inline void ref_cast(const void *x, void *y, size_t n, int mode) {
  for (size_t i = 0; i < n; i++) kn_narrow_cast_at(x, y, i, mode);
}

/* Depthwise convolution, mode 0 (y from x, k), 1 (dx from dy, k), 2 (dk
 * from dy, x), scattered over the windows in order, sums in double. */
static inline void ref_dwconv(const kn_cuda_windows *w, int M, int mode, const float *a,
                              const float *b, float *out) {
  const size_t CM = (size_t)w->c * M, ny = (size_t)w->batch * w->oh * w->ow * CM;
  const size_t nx = (size_t)w->batch * w->h * w->w * w->c, nk = (size_t)w->kh * w->kw * CM;
  const size_t nout = mode == 0 ? ny : mode == 1 ? nx : nk;
  double *acc = calloc(nout ? nout : 1, sizeof *acc);
  if (!acc) return;
  for (int bi = 0; bi < w->batch; bi++)
    for (int oh = 0; oh < w->oh; oh++)
      for (int ow = 0; ow < w->ow; ow++)
        for (int ki = 0; ki < w->kh; ki++)
          for (int kj = 0; kj < w->kw; kj++) {
            const int ih = oh * w->sh - w->pad_top + ki * w->dh;
            const int iw = ow * w->sw - w->pad_left + kj * w->dw;
            if (ih < 0 || ih >= w->h || iw < 0 || iw >= w->w) continue;
            for (size_t o = 0; o < CM; o++) {
              const size_t yi = (((size_t)bi * w->oh + oh) * w->ow + ow) * CM + o;
              const size_t xi = ref_pixel(w, bi, ih, iw) + o / (size_t)M;
              const size_t ki_at = ((size_t)ki * w->kw + kj) * CM + o;
              if (mode == 0)
                acc[yi] += (double)a[xi] * b[ki_at];
              else if (mode == 1)
                acc[xi] += (double)a[yi] * b[ki_at];
              else
                acc[ki_at] += (double)a[yi] * b[xi];
            }
          }
  for (size_t i = 0; i < nout; i++) out[i] = (float)acc[i];
  free(acc);
}

/* The losses' means (each row's or element's term in double, added in
 * order) and gradients: loss_rules.h's arithmetic, the CPU's. */
static inline float ref_softmax_xent(const float *x, const int32_t *labels, size_t rows,
                                     size_t cols) {
  double total = 0.0;
  for (size_t r = 0; r < rows; r++) total += kn_loss_xent_term(x + r * cols, labels[r], cols);
  return (float)(total / (double)rows);
}

static inline void ref_softmax_xent_grad(const float *x, const int32_t *labels, float dloss,
                                         float *dx, size_t rows, size_t cols) {
  for (size_t r = 0; r < rows; r++)
    kn_loss_xent_grad(x + r * cols, labels[r], dloss / (float)rows, dx + r * cols, cols);
}

static inline float ref_xent_dense(const float *x, const float *p, size_t rows, size_t cols) {
  double total = 0.0;
  for (size_t r = 0; r < rows; r++)
    total += kn_loss_xent_dense_term(x + r * cols, p + r * cols, cols);
  return (float)(total / (double)rows);
}

static inline void ref_xent_dense_grad(const float *x, const float *p, float dloss, float *dx,
                                       size_t rows, size_t cols) {
  for (size_t r = 0; r < rows; r++)
    kn_loss_xent_dense_grad(x + r * cols, p + r * cols, dloss / (float)rows, dx + r * cols, cols);
}

static inline float ref_bce_logits(const float *x, const float *t, size_t n) {
  double total = 0.0;
  for (size_t i = 0; i < n; i++) total += kn_loss_bce_term(x[i], t[i]);
  return (float)(total / (double)n);
}

static inline void ref_bce_logits_grad(const float *x, const float *t, float dloss, float *dx,
                                       size_t n) {
  for (size_t i = 0; i < n; i++) dx[i] = kn_loss_bce_grad(x[i], t[i], dloss / (float)n);
}

/* The activations (kn_unop 0 to 7) and their gradients, in double then
 * rounded: a reference within float rounding of any device's. */
static inline float ref_unary(int op, float xf, float alpha) {
  const double x = xf, a = alpha;
  switch (op) {
  case 0: return (float)(x > 0 ? x : a * x);
  case 1: return (float)(x > 0 ? x : a * (exp(x) - 1));
  case 2: return (float)(x * 0.5 * erfc(-x * 0.70710678118654752440));
  case 3: return (float)(1 / (1 + exp(-x)));
  case 4: return (float)tanh(x);
  case 5: return (float)(a * x);
  case 6: return (float)fabs(x);
  default: return (float)(x * x);
  }
}

static inline float ref_unary_grad(int op, float dyf, float xf, float yf, float alpha) {
  const double dy = dyf, x = xf, y = yf, a = alpha;
  switch (op) {
  case 0: return (float)(x > 0 ? dy : a * dy);
  case 1: return (float)(x > 0 ? dy : dy * (y + a));
  case 2:
    return (float)(dy * (0.5 * erfc(-x * 0.70710678118654752440) +
                         x * exp(-0.5 * x * x) * 0.39894228040143267794));
  case 3: return (float)(dy * y * (1 - y));
  case 4: return (float)(dy * (1 - y * y));
  case 5: return (float)(dy * a);
  case 6: return (float)(x > 0 ? dy : (x < 0 ? -dy : 0));
  default: return (float)(dy * 2 * x);
  }
}

/* y (outer, inner) = the sum, mean or max (kind 0 to 2) over the middle
 * axis of x (outer, len, inner), in order, in float. */
static inline void ref_reduce(const float *x, float *y, size_t outer, size_t len, size_t inner,
                              int kind) {
  for (size_t o = 0; o < outer; o++)
    for (size_t i = 0; i < inner; i++) {
      float acc = x[o * len * inner + i];
      for (size_t k = 1; k < len; k++) {
        const float v = x[(o * len + k) * inner + i];
        acc = kind == 2 ? ((v > acc || v != v) ? v : acc) : acc + v;
      }
      y[o * inner + i] = kind == 1 ? acc / (float)len : acc;
    }
}

static inline void ref_reduce_grad(const float *dy, const float *x, const float *y, float *dx,
                                   size_t outer, size_t len, size_t inner, int kind) {
  for (size_t o = 0; o < outer; o++)
    for (size_t i = 0; i < inner; i++) {
      const float d = dy[o * inner + i], m = y[o * inner + i];
      int taken = 0;
      for (size_t k = 0; k < len; k++) {
        const size_t at = (o * len + k) * inner + i;
        if (kind != 2) {
          dx[at] = kind == 1 ? d / (float)len : d;
          continue;
        }
        const int hit = !taken && (x[at] == m || x[at] != x[at]);
        dx[at] = hit ? d : 0.0f;
        taken |= hit;
      }
    }
}

static inline void ref_bn_stats(const float *x, float *mm, float *mv, float *stats, size_t rows,
                                size_t C, float momentum, float epsilon, int training) {
  for (size_t c = 0; c < C; c++) {
    if (!training) {
      stats[c] = mm[c];
      stats[C + c] = (float)(1.0 / sqrt((double)mv[c] + epsilon));
      continue;
    }
    const double shift = rows ? (double)x[c] : 0.0;
    double s = 0.0, s2 = 0.0;
    for (size_t r = 0; r < rows; r++) {
      const double d = (double)x[r * C + c] - shift;
      s += d;
      s2 += d * d;
    }
    const double R = (double)rows, sq0 = s2 - s * s / R, sq = sq0 > 0.0 ? sq0 : 0.0;
    const double mean = shift + s / R, var = sq / R, unbiased = R > 1 ? sq / (R - 1) : var;
    stats[c] = (float)mean;
    stats[C + c] = (float)(1.0 / sqrt(var + epsilon));
    mm[c] = (float)(momentum * (double)mm[c] + (1.0 - momentum) * mean);
    mv[c] = (float)(momentum * (double)mv[c] + (1.0 - momentum) * unbiased);
  }
}

static inline void ref_bn_apply(const float *x, const float *stats, const float *gamma,
                                const float *beta, float *y, size_t rows, size_t C) {
  for (size_t r = 0; r < rows; r++)
    for (size_t c = 0; c < C; c++)
      y[r * C + c] = (x[r * C + c] - stats[c]) * stats[C + c] * gamma[c] + beta[c];
}

static inline void ref_bn_grad(const float *dy, const float *x, const float *stats,
                               const float *gamma, float *dx, float *dgamma, float *dbeta,
                               size_t rows, size_t C) {
  for (size_t c = 0; c < C; c++) {
    double s1 = 0.0, s2 = 0.0;
    for (size_t r = 0; r < rows; r++) { /* (beta's gradient alone: no statistics, xhat 0) */
      const float xh = stats ? (x[r * C + c] - stats[c]) * stats[C + c] : 0.0f;
      s1 += (double)dy[r * C + c];
      s2 += (double)dy[r * C + c] * (double)xh;
    }
    if (dbeta) dbeta[c] = (float)s1;
    if (dgamma) dgamma[c] = (float)s2;
    if (!dx) continue;
    const double R = (double)rows, k = (double)stats[C + c] / R * gamma[c];
    for (size_t r = 0; r < rows; r++) {
      const float xh = (x[r * C + c] - stats[c]) * stats[C + c];
      dx[r * C + c] = (float)(k * (R * (double)dy[r * C + c] - s1 - (double)xh * s2));
    }
  }
}

#endif
