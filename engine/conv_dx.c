/* conv_dx.c — a strided convolution's input gradient computed directly,
 * on CPUs with AVX-512F (a col2im_gemm node's work, in float32 and in
 * mixed_bfloat16).
 *
 * col2im_gemm multiplies dy by the kernel into columns (a pixel's taps x
 * channels) and sums each dx element from the columns that hold it. With
 * stride s, an input row (or column) is reached by about K / s taps, so
 * most of the columns' width is written only to be read once and added:
 * the GEMM's outputs outnumber dx's by K^2 / s^2 ... K^2, and its depth is
 * only the filters. Here each dx element is summed in registers instead,
 * over the taps that reach it and each tap's filters:
 *
 *     dx[b, y, x, c] = sum over (ky, kx) reaching (y, x), over f, of
 *                      dy[b, oy, ox, f] k[ky, kx, c, f]
 *
 * Along a row, the columns x of one remainder (x + pad) % s have the same
 * taps, and one tap's ox steps by one from a column to the next; so a
 * run of P such columns, 16 or 32 channels wide, is a P x 16 (or x 32)
 * block of accumulators, and each of its products broadcasts one dy
 * value into one FMA per 16 channels. dy is read from a copy of the
 * image laid out (oy, f, ox), so that a tap's P values for one filter
 * lie side by side, at fixed offsets from one pointer; the kernel from a
 * copy laid out (ky, kx, f, c), a filter's channels side by side.
 * Columns at the image's edges, which fewer taps reach, run one at a
 * time.
 *
 * Under mixed_bfloat16 the operands are the bf16 GEMM's: the kernel in
 * bf16, dy in bf16 or rounded to it (as the GEMM rounds a float32
 * operand); both copies hold them widened, so every product is exact and
 * the sums are float32's, as in the bf16 GEMM, and dx is summed without
 * the bf16 rounding of each tap's sum that the columns' path stores.
 *
 * Each dx element is summed by one thread, over its taps in col2im's
 * order (outputs ascending) and each tap's filters in order: the same
 * bits for any thread count. Nothing is allocated: the kernel's copy and
 * each thread's copy of dy lie in the graph's convolution buffer, sized
 * at compile (kn_conv_dx_floats). */
#include <stdatomic.h>
#include <string.h>

#include "col2im_axis.h"
#include "graph_internal.h"

static _Atomic int direct_off;

void kn_conv_dx_set_direct(int on) {
  atomic_store(&direct_off, !on);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "narrow_avx512.h"

/* Most taps of one block (KH x KW), and the widest blocks: P columns x
 * 16 channels (a register each) or x 32 (two). */
#define TAPS_MAX 64
#define P16      24
#define P32      12

int kn_conv_dx_direct(const kn_graph *g, const kn_node_rec *n) {
  if (n->op != KN_OP_COL2IM_GEMM || g->f64 || atomic_load(&direct_off) ||
      !kn_cpu_features_get()->avx512f)
    return 0;
  const kn_conv_attrs *a = &n->attr.conv;
  const kn_node_rec *D = &g->nodes[n->inputs[0]], *K = &g->nodes[n->inputs[1]];
  /* float32, or mixed_bfloat16's bf16 kernel with dy in either */
  const int operands = K->dtype == KN_F32
                           ? D->dtype == KN_F32
                           : K->dtype == KN_BF16 && (D->dtype == KN_F32 || D->dtype == KN_BF16);
  return operands && n->dtype == KN_F32 && !n->round_bf16 && !n->narrow_copy && a->dh == 1 &&
         a->dw == 1 && n->dims[3] % 16 == 0 && a->kh * a->kw <= TAPS_MAX;
}

size_t kn_conv_dx_floats(const kn_graph *g, const kn_node_rec *n, int threads) {
  if (!n->direct_dx) return 0;
  const kn_conv_attrs *a = &n->attr.conv;
  const size_t F = (size_t)g->nodes[n->inputs[0]].dims[3];
  return (size_t)a->kh * a->kw * F * n->dims[3] + (size_t)threads * a->oh * a->ow * F;
}

typedef struct dx_job {
  const kn_conv_attrs *a;
  int H, W, C, F;
  const void *dy, *k;
  kn_dtype dy_type; /* KN_BF16, or KN_F32 (rounded to bf16 where the kernel is bf16) */
  int narrow;       /* the kernel in bf16 (mixed_bfloat16) */
  float *dx;
  float *kt;  /* the kernel as (KH, KW, F, C) */
  float *dyt; /* each thread's image of dy as (OH, F, OW) */
  int64_t images;
  const float *add; /* dx's other term (an add taken in), or NULL; may be dx */
} dx_job;

/* One block: P columns (dx at out, out + step, ...) x V 16-channel
 * vectors, summed over taps [0, n): tap t's dy values for filter f at
 * src[t] + f * ow + p, its kernel's at ker[t] + f * c; then the other
 * term at add (laid out as out, or NULL) added to each sum. */
__attribute__((target("avx512f"), always_inline)) static inline void
block(const int P, const int V, int n, const float *const *src, const float *const *ker, int F,
      int ow, int c, float *out, const float *add, size_t step) {
  __m512 acc[P16][2];
#pragma GCC unroll 24
  for (int p = 0; p < P; p++) acc[p][0] = acc[p][1] = _mm512_setzero_ps();
  for (int t = 0; t < n; t++) {
    const float *s = src[t], *w = ker[t];
    for (int f = 0; f < F; f++, s += ow, w += c) {
      const __m512 w0 = _mm512_loadu_ps(w), w1 = V == 2 ? _mm512_loadu_ps(w + 16) : w0;
#pragma GCC unroll 24
      for (int p = 0; p < P; p++) {
        const __m512 v = _mm512_set1_ps(s[p]);
        acc[p][0] = _mm512_fmadd_ps(v, w0, acc[p][0]);
        if (V == 2) acc[p][1] = _mm512_fmadd_ps(v, w1, acc[p][1]);
      }
    }
  }
  if (add) {
#pragma GCC unroll 24
    for (int p = 0; p < P; p++) {
      acc[p][0] = _mm512_add_ps(acc[p][0], _mm512_loadu_ps(add + p * step));
      if (V == 2) acc[p][1] = _mm512_add_ps(acc[p][1], _mm512_loadu_ps(add + p * step + 16));
    }
  }
#pragma GCC unroll 24
  for (int p = 0; p < P; p++) {
    _mm512_storeu_ps(out + p * step, acc[p][0]);
    if (V == 2) _mm512_storeu_ps(out + p * step + 16, acc[p][1]);
  }
}

/* block() for P columns, P a constant in each case (so the accumulators
 * stay in registers) */
// clang-format off
#define B16(P) case P: block(P, 1, n, src, ker, F, ow, c, out, add, step); break;
#define B32(P) case P: block(P, 2, n, src, ker, F, ow, c, out, add, step); break;

__attribute__((target("avx512f"))) static void block16(int P, int n, const float *const *src,
                                                       const float *const *ker, int F, int ow,
                                                       int c, float *out, const float *add,
                                                       size_t step) {
  switch (P) {
    B16(1) B16(2) B16(3) B16(4) B16(5) B16(6) B16(7) B16(8) B16(9) B16(10) B16(11) B16(12)
    B16(13) B16(14) B16(15) B16(16) B16(17) B16(18) B16(19) B16(20) B16(21) B16(22) B16(23)
    default: block(P16, 1, n, src, ker, F, ow, c, out, add, step); break;
  }
}

__attribute__((target("avx512f"))) static void block32(int P, int n, const float *const *src,
                                                       const float *const *ker, int F, int ow,
                                                       int c, float *out, const float *add,
                                                       size_t step) {
  switch (P) {
    B32(1) B32(2) B32(3) B32(4) B32(5) B32(6) B32(7) B32(8) B32(9) B32(10) B32(11)
    default: block(P32, 2, n, src, ker, F, ow, c, out, add, step); break;
  }
}
// clang-format on

/* P columns of one remainder's run in a row, from column j0 (src[t]: tap
 * t's dy for column j0, filter 0), at out: every channel, 32 then 16 at
 * a time, in blocks of at most P32 or P16 columns. */
static void run_columns(const dx_job *j, int P, int n, const float *const *src,
                        const float *const *ker, float *out) {
  const int C = j->C;
  const size_t step = (size_t)j->a->sw * C;
  const float *s[TAPS_MAX], *kr[TAPS_MAX];
  const float *add = j->add ? j->add + (out - j->dx) : NULL;
  for (int c0 = 0; c0 < C;) {
    const int wide = C - c0 >= 32, most = wide ? P32 : P16;
    for (int t = 0; t < n; t++) kr[t] = ker[t] + c0;
    for (int p = 0; p < P; p += most) {
      for (int t = 0; t < n; t++) s[t] = src[t] + p;
      const int q = P - p < most ? P - p : most;
      const size_t at = (size_t)p * step + c0;
      if (wide)
        block32(q, n, s, kr, j->F, j->a->ow, C, out + at, add ? add + at : NULL, step);
      else
        block16(q, n, s, kr, j->F, j->a->ow, C, out + at, add ? add + at : NULL, step);
    }
    c0 += wide ? 32 : 16;
  }
}

/* P columns of C channels (a multiple of 16), step floats apart, that no
 * tap reaches: zeros, or the other term where there is one (nothing to do
 * where dx is its storage). */
__attribute__((target("avx512f"))) static void no_taps(const dx_job *j, float *out, int P,
                                                       size_t step) {
  const float *add = j->add ? j->add + (out - j->dx) : NULL;
  if (add == out) return;
  for (int p = 0; p < P; p++, out += step, add = add ? add + step : NULL)
    for (int c = 0; c < j->C; c += 16)
      _mm512_storeu_ps(out + c, add ? _mm512_loadu_ps(add + c) : _mm512_setzero_ps());
}

/* dy's element i as the products take it: a float, a bf16 value widened
 * (bf16), or a float rounded to bf16 (round). */
static inline float dy_at(const void *dy, size_t i, int bf16, int round) {
  if (bf16) return kn_bf16_to_f32(((const uint16_t *)dy)[i]);
  const float v = ((const float *)dy)[i];
  return round ? kn_bf16_round_f32(v) : v;
}

/* Sixteen of dy's elements from i on, as dy_at takes them. */
__attribute__((target("avx512f"), always_inline)) static inline __m512
dy_load16(const void *dy, size_t i, int bf16, int round) {
  if (bf16)
    return kn_bf16_widen_avx512(_mm256_loadu_si256((const void *)((const uint16_t *)dy + i)));
  const __m512 v = _mm512_loadu_ps((const float *)dy + i);
  return round ? _mm512_castsi512_ps(_mm512_slli_epi32(kn_bf16_round_avx512(v), 16)) : v;
}

/* An image of dy (OH, OW, F) copied as (OH, F, OW): 16 pixels x 16
 * filters at a time, transposed in registers (the filters past the last
 * 16 one by one); image is its first element's index. */
__attribute__((target("avx512f"))) static void
copy_dy(const void *dy, size_t image, int bf16, int round, float *dyt, int OH, int OW, int F) {
  for (int oy = 0; oy < OH; oy++) {
    for (int x0 = 0; x0 < OW; x0 += 16) {
      const int n = OW - x0 < 16 ? OW - x0 : 16;
      const __mmask16 m = (__mmask16)((1u << n) - 1);
      const size_t src = image + ((size_t)oy * OW + x0) * F;
      float *dst = dyt + (size_t)oy * F * OW + x0;
      int f = 0;
      for (; f + 16 <= F; f += 16) {
        __m512 r[16];
        for (int i = 0; i < 16; i++)
          r[i] = i < n ? dy_load16(dy, src + (size_t)i * F + f, bf16, round) : _mm512_setzero_ps();
        kn_transpose16_avx512((__m512i *)(void *)r); /* (the lanes as words) */
        for (int c = 0; c < 16; c++) _mm512_mask_storeu_ps(dst + (size_t)(f + c) * OW, m, r[c]);
      }
      for (; f < F; f++)
        for (int i = 0; i < n; i++)
          dst[(size_t)f * OW + i] = dy_at(dy, src + (size_t)i * F + f, bf16, round);
    }
  }
}

/* Image b into dx, with this thread's copy of dy at dyt. */
static void image(const dx_job *j, int64_t b, float *dyt) {
  const kn_conv_attrs *a = j->a;
  const int H = j->H, W = j->W, C = j->C, F = j->F, OH = a->oh, OW = a->ow;
  const int KH = a->kh, KW = a->kw, sh = a->sh, sw = a->sw;
  copy_dy(j->dy, (size_t)b * OH * OW * F, j->dy_type == KN_BF16, j->narrow && j->dy_type == KN_F32,
          dyt, OH, OW, F);
  int hn[sh], hk[sh * KH], hb[sh * KH], wn[sw], wk[sw * KW], wb[sw * KW];
  col2im_axis rows, cols;
  col2im_axis_init(&rows, sh, a->pad_top, 1, KH, OH, hn, hk, hb);
  col2im_axis_init(&cols, sw, a->pad_left, 1, KW, OW, wn, wk, wb);
  int ohs[KH], kis[KH];
  const float *src[TAPS_MAX], *ker[TAPS_MAX];
  float *dxb = j->dx + (size_t)b * H * W * C;
  for (int y = 0; y < H; y++) {
    const int th = y + a->pad_top;
    const int nh = col2im_axis_taps(&rows, y, th / sh, th % sh, ohs, kis);
    if (nh == 0) { /* a row no tap reaches */
      float *row = dxb + (size_t)y * W * C;
      const float *add = j->add ? j->add + (row - j->dx) : NULL;
      if (!add)
        memset(row, 0, (size_t)W * C * sizeof(float));
      else if (add != row)
        memcpy(row, add, (size_t)W * C * sizeof(float));
      continue;
    }
    for (int r = 0; r < sw; r++) {
      /* the columns x = x0, x0 + sw, ... with (x + pad) % sw == r */
      const int x0 = ((r - a->pad_left) % sw + sw) % sw;
      if (x0 >= W) continue;
      const int nr = (W - 1 - x0) / sw + 1, q0 = (x0 + a->pad_left) / sw;
      float *out = dxb + ((size_t)y * W + x0) * C;
      const size_t step = (size_t)sw * C;
      /* the columns every tap of this remainder reaches: [lo, hi) */
      int lo = 0, hi = nr;
      for (int t = 0; t < wn[r]; t++) {
        const int back = wb[r * KW + t];
        if (back - q0 > lo) lo = back - q0;
        if (OW + back - q0 < hi) hi = OW + back - q0;
      }
      if (hi < lo) hi = lo;
      for (int jj = 0; jj < nr;) {
        /* a run where every tap reaches (jj in [lo, hi)), or one column */
        const int run = jj >= lo && jj < hi ? hi - jj : 1;
        int n = 0;
        for (int u = 0; u < nh; u++) {
          for (int t = 0; t < wn[r]; t++) {
            const int ox = q0 + jj - wb[r * KW + t];
            if (ox < 0 || ox >= OW) continue;
            src[n] = dyt + (size_t)ohs[u] * F * OW + ox;
            ker[n++] = j->kt + ((size_t)kis[u] * KW + wk[r * KW + t]) * F * C;
          }
        }
        if (n == 0) {
          no_taps(j, out + (size_t)jj * step, run, step);
        } else {
          run_columns(j, run, n, src, ker, out + (size_t)jj * step);
        }
        jj += run;
      }
    }
  }
}

static void images(void *ctx, int slot, int64_t b0, int64_t b1) {
  const dx_job *j = ctx;
  float *dyt = j->dyt + (size_t)slot * j->a->oh * j->a->ow * j->F;
  for (int64_t b = b0; b < b1; b++) image(j, b, dyt);
}

/* Rows [r0, r1) of the kernel's copy: row (tap, f) holds k[tap, :, f]. */
static void kernel_rows(void *ctx, int64_t r0, int64_t r1) {
  const dx_job *j = ctx;
  const int C = j->C, F = j->F;
  for (int64_t r = r0; r < r1; r++) {
    const int64_t tap = r / F, f = r % F;
    const size_t src = (size_t)tap * C * F + f;
    float *dst = j->kt + (size_t)r * C;
    if (j->narrow) {
      const uint16_t *k = j->k;
      for (int c = 0; c < C; c++) dst[c] = kn_bf16_to_f32(k[src + (size_t)c * F]);
    } else {
      const float *k = j->k;
      for (int c = 0; c < C; c++) dst[c] = k[src + (size_t)c * F];
    }
  }
}

void kn_conv_dx_run(kn_graph *g, kn_node_rec *n) {
  const kn_node_rec *D = &g->nodes[n->inputs[0]], *K = &g->nodes[n->inputs[1]];
  const kn_conv_attrs *a = &n->attr.conv;
  dx_job j = {.a = a,
              .H = n->dims[1],
              .W = n->dims[2],
              .C = n->dims[3],
              .F = D->dims[3],
              .dy = D->data,
              .k = K->data,
              .dy_type = D->dtype,
              .narrow = K->dtype == KN_BF16,
              .dx = n->data,
              .kt = g->conv_buf,
              .images = kn_node_rows(g, n),
              .add = n->n_inputs > 2 ? g->nodes[n->inputs[2]].data : NULL};
  j.dyt = j.kt + (size_t)a->kh * a->kw * j.F * j.C;
  kn_pool_for(g->pool, (int64_t)a->kh * a->kw * j.F, kernel_rows, &j);
  kn_pool_share(g->pool, j.images, 1, images, &j);
}

#else

int kn_conv_dx_direct(const kn_graph *g, const kn_node_rec *n) {
  (void)g;
  (void)n;
  return 0;
}

size_t kn_conv_dx_floats(const kn_graph *g, const kn_node_rec *n, int threads) {
  (void)g;
  (void)n;
  (void)threads;
  return 0;
}

void kn_conv_dx_run(kn_graph *g, kn_node_rec *n) {
  (void)g;
  (void)n;
}

#endif
