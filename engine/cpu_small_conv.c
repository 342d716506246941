/* cpu_small_conv.c — a first layer's convolution of small depth and its
 * weight gradient under mixed_bfloat16, summed directly (kn_gemm_run hands
 * them over where the bf16 GEMM would spend its time packing a few
 * columns): see graph_internal.h. x86-64 with GCC only; elsewhere the GEMM
 * runs them. */
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>

#include "narrow_avx512.h"
#define KN_HAVE_AVX512BF16 1
#endif

#ifdef KN_HAVE_AVX512BF16
/* ---- a convolution of small depth, directly ----
 *
 * A forward convolution whose columns are few (K = taps x channels <= 32,
 * a first layer on a one- or three-channel image) spends the GEMM's time
 * packing its columns, not multiplying them. Each output pixel instead
 * reads its K inputs in place, widened to f32 (bf16 values are exact in
 * f32), and sums their products with the kernel (widened once) in f32,
 * K in order by FMAs: the bf16 GEMM's products and sums (the order of its
 * pairs aside), 8 pixels (4 past 32 filters) a block for the FMAs to
 * overlap. Each output is summed by one thread: the same bits for any
 * thread count. */
#define SMALL_K   32
#define SMALL_N   64
#define SMALL_PIX 256 /* pixels a task */

typedef struct small_conv {
  const kn_conv_cols *cols;
  int a_f32;
  int m, n, k, nv; /* nv: n in vectors of 16 */
  ptrdiff_t koff[SMALL_K];
  const float *w; /* k x (16 nv), widened, zero past n */
  void *c;
  int c_bf16;
  size_t ldc;
  const float *bias;
  int relu;
  uint16_t *narrow;
} small_conv;

/* A block's inputs (np <= P adjacent pixels of one output row), widened
 * to f32: xs[8 t + i], tap t of pixel i. A one-channel input at stride 1
 * (a first layer on a gray image) has each tap's np values side by side,
 * loaded at once. Broadcast from xs, a value costs a load; broadcast from
 * a register, it would take the shuffle port the FMAs share. */
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline void
small_conv_inputs(const kn_conv_cols *cols, int a_f32, int k, const ptrdiff_t *koff, const int P,
                  int np, ptrdiff_t at0, float *xs) {
  const ptrdiff_t step = (ptrdiff_t)cols->sw * cols->c;
  if (step != 1) {
    for (int t = 0; t < k; t++)
      for (int i = 0; i < P; i++)
        xs[8 * t + i] = kn_cols_value(cols, a_f32, at0 + (i < np ? i : 0) * step + koff[t]);
    return;
  }
  const __mmask8 m = (__mmask8)((1u << np) - 1);
  for (int t = 0; t < k; t++) {
    const ptrdiff_t o = at0 + koff[t];
    const __m256 v =
        a_f32 ? _mm256_maskz_loadu_ps(m, (const float *)cols->x + o)
              : _mm256_castsi256_ps(_mm256_slli_epi32(
                    _mm256_cvtepu16_epi32(_mm_maskz_loadu_epi16(m, (const uint16_t *)cols->x + o)),
                    16));
    if (P == 8)
      _mm256_storeu_ps(xs + 8 * t, v);
    else
      _mm_storeu_ps(xs + 8 * t, _mm256_castps256_ps128(v));
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline void
small_conv_block(const small_conv *s, const int V, const int P, int64_t p0, int np, ptrdiff_t at0) {
  float xs[SMALL_K * 8];
  small_conv_inputs(s->cols, s->a_f32, s->k, s->koff, P, np, at0, xs);
  __asm__ volatile("" ::: "memory"); /* the FMAs broadcast xs from memory */
  __m512 acc[8][4];
#pragma GCC unroll 8
  for (int i = 0; i < P; i++)
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) acc[i][v] = _mm512_setzero_ps();
  const int k = s->k;
  const size_t wstride = (size_t)16 * s->nv;
  const float *w = s->w;
  for (int t = 0; t < k; t++) {
    __m512 wv[4];
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) wv[v] = _mm512_loadu_ps(w + (size_t)t * wstride + 16 * v);
#pragma GCC unroll 8
    for (int i = 0; i < P; i++) {
      const __m512 xb = _mm512_set1_ps(xs[8 * t + i]);
#pragma GCC unroll 4
      for (int v = 0; v < V; v++) acc[i][v] = _mm512_fmadd_ps(xb, wv[v], acc[i][v]);
    }
  }
  /* the outputs: s's fields in locals, which the stores cannot change */
  const float *bias = s->bias;
  const int relu = s->relu;
  uint16_t *to16 = s->c_bf16 ? (uint16_t *)s->c : s->narrow;
  float *to32 = s->c_bf16 ? NULL : (float *)s->c;
  const size_t ldc = s->ldc;
  __mmask16 m[4];
#pragma GCC unroll 4
  for (int v = 0; v < V; v++) m[v] = kn_lanes_avx512(s->n - 16 * v);
#pragma GCC unroll 8
  for (int i = 0; i < P; i++) {
    if (i >= np) break;
    const size_t row = (size_t)(p0 + i) * ldc;
    __m512 y[4];
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) {
      y[v] = acc[i][v];
      if (bias) y[v] = _mm512_add_ps(y[v], _mm512_maskz_loadu_ps(m[v], bias + 16 * v));
      /* max(0, v) returns its second operand, v, when either is NaN */
      if (relu) y[v] = _mm512_max_ps(_mm512_setzero_ps(), y[v]);
      if (to32) _mm512_mask_storeu_ps(to32 + row + 16 * v, m[v], y[v]);
    }
    if (!to16) continue;
#pragma GCC unroll 4
    for (int v = 0; v < V; v += 2) {
      if (v + 1 < V)
        _mm512_mask_storeu_epi16(to16 + row + 16 * v, (__mmask32)m[v] | (__mmask32)m[v + 1] << 16,
                                 kn_bf16_pack32_native(y[v], y[v + 1]));
      else
        _mm256_mask_storeu_epi16(to16 + row + 16 * v, m[v], kn_bf16_pack16_native(y[v]));
    }
  }
}

/* Blocks of P pixels, cut at the ends of output rows. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
small_conv_range(void *ctx, int64_t t0, int64_t t1) {
  const small_conv *s = ctx;
  const int P = s->nv <= 2 ? 8 : 4;
  for (int64_t t = t0; t < t1; t++) {
    const int64_t p_end = (t + 1) * SMALL_PIX < s->m ? (t + 1) * SMALL_PIX : s->m;
    int64_t p = t * SMALL_PIX;
    kn_pixel_cursor q = kn_pixel_at(s->cols, p);
    while (p < p_end) {
      int np = s->cols->ow - q.x < P ? s->cols->ow - q.x : P;
      if (p_end - p < np) np = (int)(p_end - p);
      const ptrdiff_t at0 = kn_pixel_row(s->cols, &q);
      switch (s->nv) {
      case 1: small_conv_block(s, 1, 8, p, np, at0); break;
      case 2: small_conv_block(s, 2, 8, p, np, at0); break;
      case 3: small_conv_block(s, 3, 4, p, np, at0); break;
      default: small_conv_block(s, 4, 4, p, np, at0); break;
      }
      p += np;
      q.x += np - 1;
      kn_pixel_next(s->cols, &q);
    }
  }
}

/* Whether a product runs as a small convolution: a forward one (columns
 * not transposed, a plain kernel, C written, not added to) of small depth
 * and width. */
int kn_small_conv_fits(int n, int k, const kn_gemm_operand *a, const kn_gemm_operand *b,
                       int accumulate) {
  return a->cols && !a->trans && !b->flip && !b->trans && b->data && !accumulate && k > 0 &&
         k <= SMALL_K && n <= SMALL_N;
}

void kn_small_conv_run(kn_pool *pool, int m, int n, int k, const kn_gemm_operand *a,
                       const kn_gemm_operand *b, void *c, kn_dtype c_type, int ldc,
                       const float *bias, int relu, uint16_t *narrow) {
  small_conv s = {.cols = a->cols,
                  .a_f32 = a->dtype == KN_F32,
                  .m = m,
                  .n = n,
                  .k = k,
                  .nv = (n + 15) / 16,
                  .c = c,
                  .c_bf16 = c_type == KN_BF16,
                  .ldc = (size_t)ldc,
                  .bias = bias,
                  .relu = relu,
                  .narrow = c_type == KN_F32 ? narrow : NULL};
  float w[SMALL_K * SMALL_N];
  for (int t = 0; t < k; t++) {
    s.koff[t] = kn_cols_col(a->cols, t);
    for (int f = 0; f < 16 * s.nv; f++)
      w[(size_t)t * 16 * s.nv + f] =
          f >= n               ? 0.0f
          : b->dtype == KN_F32 ? ((const float *)b->data)[(size_t)t * b->ld + f]
                               : kn_bf16_to_f32(((const uint16_t *)b->data)[(size_t)t * b->ld + f]);
  }
  s.w = w;
  const int64_t tasks = ((int64_t)m + SMALL_PIX - 1) / SMALL_PIX;
  kn_pool_for(tasks > 1 ? pool : NULL, tasks, small_conv_range, &s);
}

/* Its weight gradient, dW = cols^T dy (taps x filters over every pixel):
 * each slice of pixels (their number fixed by the shape) sums its pixels'
 * products in pixel order by FMAs, all taps x filters in registers (9
 * taps, up to 32 filters: a 3x3 kernel on one channel; other shapes run
 * the GEMM), into its partial sums; the slices are then added in slice
 * order: the same bits for any thread count. With sums (the layer's bias
 * gradient paired with it), dy's columns are summed on the way, a tenth
 * row of sums. */
#define WGRAD_PIX    4096 /* pixels a slice, at least */
#define WGRAD_SLICES 32
#define WGRAD_TAPS   9 /* the taps held in registers: a 3x3 kernel on one channel */

typedef struct small_wgrad {
  const kn_conv_cols *cols;
  int a_f32, dy_f32;
  const void *dy;
  size_t lddy;
  int taps, n, nv;
  int64_t pixels;
  int slices;
  ptrdiff_t koff[WGRAD_TAPS];
  int sums;                   /* dy's columns summed too */
  const kn_pool_grad_b *pool; /* or NULL: dy is a pool's gradient, read as kn_pool_grad_b says */
  float *partials;            /* slices x (taps + 1) x 16 nv */
} small_wgrad;

/* Vector v of pixel q's row of a pool's gradient read as dy (pool_grad_b_row
 * in gemm.c): 16 channels of dy where the argmax byte names the pixel's
 * cell of its 2x2 window, else 0. */
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline __m512
pool_grad_vec(const kn_pool_grad_b *v, const kn_pixel_cursor *q, int c0, __mmask16 m) {
  int cell;
  const ptrdiff_t at = kn_pool_grad_at(v, q->b, q->y, q->x, &cell);
  if (at < 0) return _mm512_setzero_ps();
  const size_t o = (size_t)at + c0;
  const __m512i cells = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, v->argmax + o));
  const __mmask16 hit = _mm512_mask_cmpeq_epi32_mask(m, cells, _mm512_set1_epi32(cell));
  return v->dy16 ? kn_bf16_widen_avx512(_mm256_maskz_loadu_epi16(hit, v->dy16 + o))
                 : _mm512_maskz_loadu_ps(hit, v->dy + o);
}

__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline void
small_wgrad_slice(const small_wgrad *s, const int T, const int V, int slice) {
  __m512 acc[WGRAD_TAPS + 1][2];
#pragma GCC unroll 10
  for (int t = 0; t <= T; t++)
#pragma GCC unroll 2
    for (int v = 0; v < V; v++) acc[t][v] = _mm512_setzero_ps();
  const int64_t p0 = s->pixels * slice / s->slices, p1 = s->pixels * (slice + 1) / s->slices;
  kn_pixel_cursor q = kn_pixel_at(s->cols, p0);
  float xs[WGRAD_TAPS * 8];
  /* blocks of up to 8 pixels, cut at the ends of output rows, their taps
   * widened into xs (small_conv_inputs); the sums still run pixel by pixel */
  for (int64_t p = p0; p < p1;) {
    int np = s->cols->ow - q.x < 8 ? s->cols->ow - q.x : 8;
    if (p1 - p < np) np = (int)(p1 - p);
    small_conv_inputs(s->cols, s->a_f32, T, s->koff, 8, np, kn_pixel_row(s->cols, &q), xs);
    __asm__ volatile("" ::: "memory"); /* the FMAs broadcast xs from memory */
    for (int i = 0; i < np; i++, p++, kn_pixel_next(s->cols, &q)) {
      __m512 g[2];
#pragma GCC unroll 2
      for (int v = 0; v < V; v++) {
        const __mmask16 m = kn_lanes_avx512(s->n - 16 * v);
        const size_t at_dy = (size_t)p * s->lddy + 16 * (size_t)v;
        if (s->pool)
          g[v] = pool_grad_vec(s->pool, &q, 16 * v, m);
        else
          g[v] = s->dy_f32 ? _mm512_maskz_loadu_ps(m, (const float *)s->dy + at_dy)
                           : kn_bf16_widen_avx512(
                                 _mm256_maskz_loadu_epi16(m, (const uint16_t *)s->dy + at_dy));
      }
#pragma GCC unroll 9
      for (int t = 0; t < T; t++) {
        const __m512 xb = _mm512_set1_ps(xs[8 * t + i]);
#pragma GCC unroll 2
        for (int v = 0; v < V; v++) acc[t][v] = _mm512_fmadd_ps(xb, g[v], acc[t][v]);
      }
      if (s->sums)
#pragma GCC unroll 2
        for (int v = 0; v < V; v++) acc[T][v] = _mm512_add_ps(acc[T][v], g[v]);
    }
  }
  float *out = s->partials + (size_t)slice * (T + 1) * 16 * s->nv;
#pragma GCC unroll 10
  for (int t = 0; t <= T; t++)
#pragma GCC unroll 2
    for (int v = 0; v < V; v++) _mm512_storeu_ps(out + ((size_t)t * s->nv + v) * 16, acc[t][v]);
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
small_wgrad_range(void *ctx, int64_t t0, int64_t t1) {
  const small_wgrad *s = ctx;
  for (int64_t t = t0; t < t1; t++) {
    if (s->nv == 1)
      small_wgrad_slice(s, WGRAD_TAPS, 1, (int)t);
    else
      small_wgrad_slice(s, WGRAD_TAPS, 2, (int)t);
  }
}

/* Whether a product is such a weight gradient: columns transposed (taps
 * as rows), dy plain, C written, taps x filters in registers. */
int kn_small_wgrad_fits(int m, int n, int k, const kn_gemm_operand *a, const kn_gemm_operand *b,
                        int accumulate, kn_dtype c_type) {
  return a->cols && a->trans && !b->flip && !b->trans && (b->data || b->pool) && !accumulate &&
         c_type == KN_F32 && m == WGRAD_TAPS && n > 0 && n <= 32 && (k >= WGRAD_PIX || b->pool);
}

int kn_gemm_sums_b(int m, int n, int k, const kn_gemm_operand *a, const kn_gemm_operand *b) {
  return b->pool || (kn_gemm_bf16_kernel() == KN_GEMM_BF16_AVX512 &&
                     kn_small_wgrad_fits(m, n, k, a, b, 0, KN_F32));
}

void kn_small_wgrad_run(kn_pool *pool, void *scratch, int m, int n, int k, const kn_gemm_operand *a,
                        const kn_gemm_operand *b, float *c, int ldc) {
  small_wgrad s = {.cols = a->cols,
                   .sums = b->sums != NULL,
                   .pool = b->pool,
                   .a_f32 = a->dtype == KN_F32,
                   .dy_f32 = b->dtype == KN_F32,
                   .dy = b->data,
                   .lddy = (size_t)b->ld,
                   .taps = m,
                   .n = n,
                   .nv = (n + 15) / 16,
                   .pixels = k,
                   .partials = scratch};
  s.slices = k / WGRAD_PIX < WGRAD_SLICES ? k / WGRAD_PIX : WGRAD_SLICES;
  if (s.slices < 1) s.slices = 1; /* a pool's gradient, few pixels */
  for (int t = 0; t < m; t++) s.koff[t] = kn_cols_col(a->cols, t);
  kn_pool_for(s.slices > 1 ? pool : NULL, s.slices, small_wgrad_range, &s);
  const size_t per = (size_t)(m + 1) * 16 * s.nv;
  for (int t = 0; t <= m; t++) {
    if (t == m && !b->sums) break;
    float *to = t < m ? c + (size_t)t * ldc : b->sums;
    for (int f = 0; f < n; f++) {
      float sum = s.partials[(size_t)t * 16 * s.nv + f];
      for (int q = 1; q < s.slices; q++) sum += s.partials[q * per + (size_t)t * 16 * s.nv + f];
      to[f] = sum;
    }
  }
}
#else
int kn_gemm_sums_b(int m, int n, int k, const kn_gemm_operand *a, const kn_gemm_operand *b) {
  (void)m, (void)n, (void)k, (void)a;
  return b->pool != NULL;
}

int kn_small_conv_fits(int n, int k, const kn_gemm_operand *a, const kn_gemm_operand *b,
                       int accumulate) {
  (void)n, (void)k, (void)a, (void)b, (void)accumulate;
  return 0;
}

int kn_small_wgrad_fits(int m, int n, int k, const kn_gemm_operand *a, const kn_gemm_operand *b,
                        int accumulate, kn_dtype c_type) {
  (void)m, (void)n, (void)k, (void)a, (void)b, (void)accumulate, (void)c_type;
  return 0;
}

void kn_small_conv_run(kn_pool *pool, int m, int n, int k, const kn_gemm_operand *a,
                       const kn_gemm_operand *b, void *c, kn_dtype c_type, int ldc,
                       const float *bias, int relu, uint16_t *narrow) {
  (void)pool, (void)m, (void)n, (void)k, (void)a, (void)b, (void)c, (void)c_type, (void)ldc,
      (void)bias, (void)relu, (void)narrow;
  abort(); /* kn_small_conv_fits says no here */
}

void kn_small_wgrad_run(kn_pool *pool, void *scratch, int m, int n, int k, const kn_gemm_operand *a,
                        const kn_gemm_operand *b, float *c, int ldc) {
  (void)pool, (void)scratch, (void)m, (void)n, (void)k, (void)a, (void)b, (void)c, (void)ldc;
  abort(); /* kn_small_wgrad_fits says no here */
}
#endif
