/* windows_ref.h — plain loops for the CUDA backend's window kernels
 * (im2col, col2im, pooling and its gradient over NHWC images) and its
 * casts, written as the CPU kernels run them (cpu_kernels_conv.inc: a
 * scatter over the windows in row-major order), for the host stand-in of
 * the CUDA module (host_gpus.c) and the reference of test_cuda.c. The
 * device kernels gather instead; test_cuda checks they agree bit for bit. */
#ifndef KILN_TESTS_CUDA_WINDOWS_REF_H
#define KILN_TESTS_CUDA_WINDOWS_REF_H

#include <stdint.h>
#include <string.h>

#include "bf16.h"
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
  for (size_t i = 0; i < n; i++) {
    if (mode == KN_CUDA_CAST_TO_BF16)
      ((uint16_t *)y)[i] = kn_bf16_from_f32(((const float *)x)[i]);
    else if (mode == KN_CUDA_CAST_FROM_BF16)
      ((float *)y)[i] = kn_bf16_to_f32(((const uint16_t *)x)[i]);
    else
      ((float *)y)[i] = kn_bf16_to_f32(kn_bf16_from_f32(((const float *)x)[i]));
  }
}

#endif
