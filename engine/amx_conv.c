/* amx_conv.c — stride-1 convolutions on AMX tiles, their columns read in
 * place (see amx_conv.h). */
#include "amx_conv.h"

#include <string.h>

#include "amx.h"

/* The depth chunk for kernel rows of seg values: its largest even divisor
 * up to 32 (a tile row's 16 pairs), so no chunk leaves its row. */
static int chunk_of(int seg) {
  for (int q = 32; q > 2; q -= 2)
    if (seg % q == 0) return q;
  return 2;
}

int kn_amx_conv_shape_fits(int c, int kh, int kw, int n) {
  if (c < 2 || c % 2 || kh < 1 || kw < 1 || n < 1) return 0;
  const int chunk = chunk_of(kw * c);
  return chunk >= 16 && kh * kw * c / chunk <= KN_AMX_CONV_CHUNKS;
}

void kn_amx_conv_setup(kn_amx_conv *cv, int c, int kh, int kw, int dh, int wp, int ow, int n) {
  const int seg = kw * c, chunk = chunk_of(seg);
  *cv = (kn_amx_conv){.c = c,
                      .kh = kh,
                      .kw = kw,
                      .dh = dh,
                      .wp = wp,
                      .ow = ow,
                      .n = n,
                      .kt = chunk / 2,
                      .nk = kh * seg / chunk,
                      .width = n > 16 ? 32 : 16};
  cv->groups = (n + cv->width - 1) / cv->width;
  for (int q = 0; q < cv->nk; q++)
    cv->at[q] = (ptrdiff_t)(q * chunk / seg) * dh * wp * c + q * chunk % seg;
}

size_t kn_amx_conv_panel_words(const kn_amx_conv *cv) {
  return (size_t)cv->groups * cv->nk * cv->kt * cv->width;
}

ptrdiff_t kn_amx_conv_reach(const kn_amx_conv *cv) {
  return 31 * (ptrdiff_t)cv->c + (ptrdiff_t)(cv->kh - 1) * cv->dh * cv->wp * cv->c +
         (ptrdiff_t)cv->kw * cv->c;
}

void kn_amx_conv_rows(const kn_amx_conv *cv, const uint16_t *x, int out_rows, int64_t pixel0,
                      size_t readable, uint16_t *spare, kn_amx_conv_store store, void *ctx) {
  float sums[32][32] __attribute__((aligned(64)));
  const int64_t nv =
      (int64_t)(out_rows - 1) * cv->wp + cv->ow; /* pixels v up to the last real one */
  const ptrdiff_t reach = kn_amx_conv_reach(cv);
  for (int64_t v0 = 0; v0 < nv; v0 += 32) {
    const size_t first = (size_t)v0 * cv->c;
    const uint16_t *a = x + first;
    if (first + (size_t)reach > readable) { /* dropped rows past the input: a padded copy */
      memset(spare, 0, (size_t)reach * sizeof *spare);
      memcpy(spare, a, (readable - first) * sizeof *spare);
      a = spare;
    }
    for (int g = 0; g < cv->groups; g++) {
      const int c0 = g * cv->width, lanes = cv->n - c0 < cv->width ? cv->n - c0 : cv->width;
      kn_amx_conv_block(lanes > 16 ? 2 : 1, a, cv->c, cv->at, cv->nk, cv->kt,
                        cv->b + (size_t)g * cv->nk * cv->kt * cv->width, cv->width, &sums[0][0]);
      /* the real pixels' rows, a run within one output row at a time */
      for (int r = 0; r < 32 && v0 + r < nv;) {
        const int64_t v = v0 + r, y = v / cv->wp, xx = v % cv->wp;
        if (xx >= cv->ow) {
          r++;
          continue;
        }
        int run = cv->ow - (int)xx;
        if (run > 32 - r) run = 32 - r;
        if (v + run > nv) run = (int)(nv - v);
        store(ctx, &sums[r][0], run, pixel0 + y * cv->ow + xx, c0, lanes);
        r += run;
      }
    }
  }
}

/* ---- the winograd pass's direct products ---- */

#include "graph_internal.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>

#include "narrow_avx512.h"

/* A task's band: its input rows padded, then zeros a block may read past
 * them, at most BAND_VALUES bf16 values (512 KiB) a thread. */
#define BAND_VALUES (256 * 1024)

/* The padded width and a band's output rows for io (0: too wide). */
static int band_rows(const struct kn_wino_io *io, int *wpp, ptrdiff_t *reach) {
  kn_amx_conv cv;
  *wpp = io->ow + io->r - 1;
  kn_amx_conv_setup(&cv, io->cin, io->r, io->r, 1, *wpp, io->ow, io->cout);
  *reach = kn_amx_conv_reach(&cv);
  const ptrdiff_t row = (ptrdiff_t)*wpp * io->cin;
  const ptrdiff_t rows = (BAND_VALUES - *reach) / row - (io->r - 1);
  if (rows < 1) return 0;
  return rows < io->oh ? (int)rows : io->oh;
}

int kn_amx_conv_direct_fits(const struct kn_wino_io *io) {
  int wpp;
  ptrdiff_t reach;
  return io->r == 3 && (io->d == 0 || io->d == 1) && io->cin >= 8 && io->cin % 2 == 0 &&
         kn_amx_conv_shape_fits(io->cin, io->r, io->r, io->cout) && band_rows(io, &wpp, &reach) > 0;
}

size_t kn_amx_conv_direct_floats(int threads, const struct kn_wino_io *io) {
  kn_amx_conv cv;
  kn_amx_conv_setup(&cv, io->cin, io->r, io->r, 1, io->ow + io->r - 1, io->ow, io->cout);
  return kn_amx_conv_panel_words(&cv) + (size_t)(threads < 1 ? 1 : threads) * (BAND_VALUES / 2) +
         16; /* a band's start aligned to 64 bytes */
}

typedef struct direct_job {
  kn_amx_conv cv;
  const struct kn_wino_io *io;
  int band, wpp;
  int64_t bands;
  ptrdiff_t reach;
  uint16_t *bands_buf; /* BAND_VALUES a thread */
  const float *bias;
  int relu, round;
  float *y;
  uint16_t *y_copy;
} direct_job;

/* n f32 values rounded to bf16 (the CPU's conversion: AMX's CPUs have
 * AVX512-BF16). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
round_row(uint16_t *to, const float *from, size_t n) {
  size_t e = 0;
  for (; e + 16 <= n; e += 16)
    _mm256_storeu_si256((__m256i *)(void *)(to + e),
                        kn_bf16_pack16_native(_mm512_loadu_ps(from + e)));
  if (e < n) {
    const __mmask16 m = kn_lanes_avx512((int)(n - e));
    _mm256_mask_storeu_epi16(to + e, m, kn_bf16_pack16_native(_mm512_maskz_loadu_ps(m, from + e)));
  }
}

/* Input rows [y0 - pt, y0 - pt + rows) of image b, padded to wpp columns
 * (pl zeros on the left), as bf16 values at dst; rows outside the input
 * are zeros. */
static void fill_band(const direct_job *j, int64_t b, int y0, int rows, uint16_t *dst) {
  const struct kn_wino_io *io = j->io;
  const size_t row = (size_t)j->wpp * io->cin;
  for (int i = 0; i < rows; i++) {
    uint16_t *to = dst + (size_t)i * row;
    const int y = y0 + i - io->pt;
    if (y < 0 || y >= io->hp) {
      memset(to, 0, row * sizeof *to);
      continue;
    }
    int cols = io->wp < j->wpp - io->pl ? io->wp : j->wpp - io->pl;
    const size_t left = (size_t)io->pl * io->cin, n = (size_t)cols * io->cin;
    memset(to, 0, left * sizeof *to);
    const size_t from = ((size_t)b * io->hp + (size_t)y) * io->wp * io->cin;
    if (io->x_bf16 == 1) {
      memcpy(to + left, (const uint16_t *)io->x + from, n * sizeof *to);
    } else { /* f32 values, rounded as the bf16 operands they are */
      round_row(to + left, (const float *)io->x + from, n);
    }
    memset(to + left + n, 0, (row - left - n) * sizeof *to);
  }
}

/* A run of outputs: bias, relu, round_y's rounding, then y and y_copy. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
direct_store(void *ctx, const float *sums, int rows, int64_t pixel, int c0, int lanes) {
  const direct_job *j = ctx;
  const int cout = j->io->cout;
  for (int r = 0; r < rows; r++) {
    const size_t at = (size_t)(pixel + r) * cout + c0;
    for (int l = 0; l < lanes; l += 16) {
      const __mmask16 m = kn_lanes_avx512(lanes - l);
      __m512 v = _mm512_maskz_loadu_ps(m, sums + (size_t)r * 32 + l);
      if (j->bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, j->bias + c0 + l));
      if (j->relu) v = _mm512_max_ps(_mm512_setzero_ps(), v); /* NaN passes */
      if (j->round) v = kn_bf16_round_f32_native(v);
      if (j->y) _mm512_mask_storeu_ps(j->y + at + l, m, v);
      if (j->y_copy) _mm256_mask_storeu_epi16(j->y_copy + at + l, m, kn_bf16_pack16_native(v));
    }
  }
}

/* (image, band) tasks [t0, t1) in slot's own part of the band buffer. */
static void direct_range(void *ctx, int slot, int64_t t0, int64_t t1) {
  const direct_job *j = ctx;
  const struct kn_wino_io *io = j->io;
  kn_amx_configure(j->cv.kt, 16);
  uint16_t *band = j->bands_buf + (size_t)slot * BAND_VALUES;
  for (int64_t t = t0; t < t1; t++) {
    const int64_t b = t / j->bands;
    const int y0 = (int)(t % j->bands) * j->band;
    const int rows = io->oh - y0 < j->band ? io->oh - y0 : j->band;
    const int in_rows = rows + io->r - 1;
    const size_t values = (size_t)in_rows * j->wpp * io->cin;
    fill_band(j, b, y0, in_rows, band);
    memset(band + values, 0, (size_t)j->reach * sizeof *band);
    /* every read lies within the band and its zeros: no spare copy */
    kn_amx_conv_rows(&j->cv, band, rows, (b * io->oh + y0) * io->ow, values + (size_t)j->reach,
                     band, direct_store, (void *)j);
  }
  kn_amx_release();
}

void kn_amx_conv_direct(struct kn_graph *g, const struct kn_wino_io *io, const void *w, int w_bf16,
                        int flip, const float *bias, int relu, float *y, uint16_t *y_copy) {
  direct_job j = {
      .io = io, .bias = bias, .relu = relu, .round = io->round_y, .y = y, .y_copy = y_copy};
  j.band = band_rows(io, &j.wpp, &j.reach);
  kn_amx_conv_setup(&j.cv, io->cin, io->r, io->r, 1, j.wpp, io->ow, io->cout);
  j.bands = (io->oh + j.band - 1) / j.band;
  /* B: pair p of depths (tap, channel) 2p, 2p + 1, lane f, group by
   * group; a depth's row of the kernel at a time (a turned kernel's
   * lanes cin apart) */
  uint32_t *panels = (uint32_t *)g->conv_buf;
  const int r = io->r, cin = io->cin, cout = io->cout, pairs = r * r * cin / 2;
  memset(panels, 0, kn_amx_conv_panel_words(&j.cv) * sizeof *panels);
  uint16_t *halves = (uint16_t *)(void *)panels; /* pair p's low half first */
  for (int t = 0; t < 2 * pairs; t++) {
    const int ch = t % cin, q = t / cin, ki = q / r, kj = q % r;
    const size_t at =
        flip ? ((size_t)(r - 1 - ki) * r + (r - 1 - kj)) * cout * cin + ch : (size_t)t * cout;
    const size_t step = flip ? (size_t)cin : 1;
    for (int f = 0; f < cout; f++) {
      const size_t e = at + (size_t)f * step;
      const int grp = f / j.cv.width, l = f % j.cv.width;
      halves[2 * (((size_t)grp * pairs + t / 2) * j.cv.width + l) + (t & 1)] =
          w_bf16 ? ((const uint16_t *)w)[e] : kn_bf16_from_f32(((const float *)w)[e]);
    }
  }
  j.cv.b = panels;
  uintptr_t band0 = (uintptr_t)(panels + kn_amx_conv_panel_words(&j.cv));
  j.bands_buf = (uint16_t *)((band0 + 63) & ~(uintptr_t)63);
  kn_pool_share(g->pool, (int64_t)io->batch * j.bands, 1, direct_range, &j);
}
#else
int kn_amx_conv_direct_fits(const struct kn_wino_io *io) {
  (void)io;
  return 0;
}

size_t kn_amx_conv_direct_floats(int threads, const struct kn_wino_io *io) {
  (void)threads, (void)io;
  return 0;
}

void kn_amx_conv_direct(struct kn_graph *g, const struct kn_wino_io *io, const void *w, int w_bf16,
                        int flip, const float *bias, int relu, float *y, uint16_t *y_copy) {
  (void)g, (void)io, (void)w, (void)w_bf16, (void)flip, (void)bias, (void)relu, (void)y,
      (void)y_copy;
  abort(); /* the winograd pass marks no direct product where this does not build */
}
#endif
