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
  const float *add; /* an input gradient's other term (kn_wino_io.add), or NULL */
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
      if (j->add) /* (where y is add's storage, each output is read once, then written) */
        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, j->add + at + l));
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
  direct_job j = {.io = io,
                  .bias = bias,
                  .add = io->add,
                  .relu = relu,
                  .round = io->round_y,
                  .y = y,
                  .y_copy = y_copy};
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

/* ---- weight gradients directly on the tiles ----
 *
 * dw[ki, kj, c, f] = sum over output pixels of x[y + ki, x + kj, c]
 * dy[y, x, f], x padded to hq = oh + 2 rows of wq = ow + 2 columns. Lay a
 * slice's images one after another at that padded size, pixel u = (i hq
 * + yp) wq + xp, and take v over the same places for dy (zero where no
 * output is: the columns x >= ow and the last two rows of each image):
 * then tap (ki, kj) reads x at u = v + ki wq + kj, inside v's own image,
 * and the tap's part of dw is one GEMM of depth v over the whole slice.
 * A's row c is x's channel c along u from the tap's offset on (xt: x
 * transposed, a row of every padded pixel per channel; the taps' rows
 * overlap, no columns), B's pair row k is dy at v = 2k and 2k + 1 (dyp),
 * so the tiles hold each tap's sums over the slice and store them once.
 * Slices are fixed by the batch and the shape; each one is summed by one
 * task into its own partial sums, and the partials are added in slice
 * order: the same bits for any thread count.
 *
 * With stride 2, output (y, x) reads the padded input at (2y + ki,
 * 2x + kj): tap (ki, kj) reads phase (ki % 2, kj % 2) of the input (its
 * pixels (2 yy + ki % 2, 2 xx + kj % 2)) at (y + ki / 2, x + kj / 2),
 * stride 1 within the phase. So xt holds the four phases, each laid out
 * as above at hq = oh + 1 rows of wq = ow + 1, and each tap reads its
 * phase from offset (ki / 2) wq + kj / 2. */

#define WGRAD_SLICES      8
#define WGRAD_DEPTH       256        /* pairs a block of depth (a multiple of 16) */
#define WGRAD_SLICE_BYTES (4u << 20) /* a slice's two copies, on one thread */

typedef struct wgrad_shape {
  int s, phases;           /* the stride (1 or 2), its phases (s^2) */
  int wq, hq, slices, per; /* a phase's padded sides, slices, images a slice (at most) */
  int nvp, ldx;            /* a slice's pixels summed (32s), xt's row */
  size_t xt_values, dyp_words, slice_floats, scratch_floats;
} wgrad_shape;

static wgrad_shape wgrad_shape_of(const struct kn_wino_io *io) {
  wgrad_shape w;
  w.s = io->s > 1 ? io->s : 1;
  w.phases = w.s * w.s;
  w.wq = io->ow + 2 / w.s;
  w.hq = io->oh + 2 / w.s;
  const int batch = io->batch < 1 ? 1 : io->batch;
  const size_t image =
      (size_t)w.hq * w.wq * ((size_t)io->cin * 2 * w.phases + (size_t)io->cout * 2);
  w.slices = batch < WGRAD_SLICES ? batch : WGRAD_SLICES;
  while (w.slices < batch &&
         (size_t)((batch + w.slices - 1) / w.slices) * image > WGRAD_SLICE_BYTES)
    w.slices++;
  w.per = (batch + w.slices - 1) / w.slices;
  w.nvp = (w.per * w.hq * w.wq + 31) / 32 * 32;
  w.ldx = (w.nvp + 2 / w.s * (w.wq + 1) + 31) / 32 * 32;
  w.xt_values = (size_t)w.phases * io->cin * w.ldx;
  w.dyp_words = (size_t)w.nvp / 2 * io->cout;
  w.slice_floats = (size_t)9 * io->cin * io->cout + (size_t)io->cout;
  w.scratch_floats = (w.xt_values + 1) / 2 + w.dyp_words + 16;
  return w;
}

int kn_amx_conv_wgrad_fits(const struct kn_wino_io *io) {
  if (io->r != 3 || (io->d != 0 && io->d != 1) || io->s > 2 || io->cin % 16 || io->cout % 16)
    return 0;
  const wgrad_shape w = wgrad_shape_of(io);
  return w.scratch_floats * sizeof(float) <= 2 * (size_t)WGRAD_SLICE_BYTES;
}

/* The most any batch up to io's takes (a smaller batch may take fewer
 * slices of more images). */
size_t kn_amx_conv_wgrad_floats(int threads, const struct kn_wino_io *io) {
  struct kn_wino_io at = *io;
  size_t most = 0;
  for (at.batch = 1; at.batch <= (io->batch < 1 ? 1 : io->batch); at.batch++) {
    const wgrad_shape w = wgrad_shape_of(&at);
    const size_t need = (size_t)w.slices * w.slice_floats +
                        (size_t)(threads < 1 ? 1 : threads) * w.scratch_floats + 16;
    if (need > most) most = need;
  }
  return most;
}

typedef struct wgrad_job {
  const struct kn_wino_io *io;
  wgrad_shape w;
  const void *dy;
  int dy_bf16;
  float *partials, *scratch;
  float *dw, *b_sums;
} wgrad_job;

/* Image b's padded pixels [u0, u0 + m) (m <= 16; u = yp wq + xp) of
 * phase (py, px) of x's channels [c0, c0 + 16) (the padded input's pixel
 * (s yp + py, s xp + px)), zeros where the padding is, into xt's 16 rows
 * from column at: transposed in registers as 32-bit lanes. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
transpose_pixels(const struct kn_wino_io *io, int64_t b, int s, int py, int px, int wq, int u0,
                 int m, int c0, uint16_t *xt, size_t ldx, size_t at) {
  __m512i f[16]; /* a pixel's 16 values, one to a 32-bit lane */
  int yp = u0 / wq, xp = u0 % wq;
  for (int i = 0; i < 16; i++) {
    const int y = s * yp + py - io->pt, x = s * xp + px - io->pl;
    if (i >= m || y < 0 || y >= io->hp || x < 0 || x >= io->wp) {
      f[i] = _mm512_setzero_si512();
    } else {
      const size_t e = (((size_t)b * io->hp + (size_t)y) * io->wp + (size_t)x) * io->cin + c0;
      const __m256i h = io->x_bf16 == 1
                            ? _mm256_loadu_si256((const void *)((const uint16_t *)io->x + e))
                            : kn_bf16_pack16_native(_mm512_loadu_ps((const float *)io->x + e));
      f[i] = _mm512_cvtepu16_epi32(h);
    }
    if (++xp == wq) xp = 0, yp++;
  }
  kn_transpose16_avx512(f);
  const __mmask16 mk = kn_lanes_avx512(m);
  for (int c = 0; c < 16; c++)
    _mm256_mask_storeu_epi16(xt + (size_t)c * ldx + at, mk, _mm512_cvtepi32_epi16(f[c]));
}

/* Images [b0, b1) of x as xt, each phase's rows (cin of them) one after
 * another: the images one after another at the padded size, then zeros
 * to ldx. */
static void fill_xt(const wgrad_job *j, int64_t b0, int64_t b1, uint16_t *xt) {
  const struct kn_wino_io *io = j->io;
  const int s = j->w.s, wq = j->w.wq, per = j->w.hq * wq;
  const size_t used = (size_t)(b1 - b0) * per;
  for (int ph = 0; ph < j->w.phases; ph++) {
    uint16_t *xp = xt + (size_t)ph * io->cin * j->w.ldx;
    for (int64_t b = b0; b < b1; b++) {
      const size_t base = (size_t)(b - b0) * per;
      for (int u0 = 0; u0 < per; u0 += 16) {
        const int m = per - u0 < 16 ? per - u0 : 16;
        for (int c0 = 0; c0 < io->cin; c0 += 16)
          transpose_pixels(io, b, s, ph / s, ph % s, wq, u0, m, c0, xp + (size_t)c0 * j->w.ldx,
                           (size_t)j->w.ldx, base + (size_t)u0);
      }
    }
    for (int c = 0; c < io->cin; c++)
      memset(xp + (size_t)c * j->w.ldx + used, 0, (j->w.ldx - used) * sizeof *xp);
  }
}

/* Images [b0, b1) of dy as pair rows over the same places: word (k, f)
 * holds dy at v = 2k (low half) and 2k + 1, rounded to bf16, zeros where
 * no output is; each value as read added to bsum[f]. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
fill_dyp(const wgrad_job *j, int64_t b0, int64_t b1, uint32_t *dyp, float *bsum) {
  const struct kn_wino_io *io = j->io;
  const int cout = io->cout, wq = j->w.wq, hq = j->w.hq;
  const __m512i lo_hi = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const int64_t images = b1 - b0, nv = j->w.nvp;
  /* the place v's image, row and column, stepped along */
  int64_t b = b0;
  int y = 0, x = 0;
  for (int64_t k = 0; k < nv / 2; k++) {
    int64_t src[2];
    for (int h = 0; h < 2; h++) {
      src[h] = b - b0 < images && y < io->oh && x < io->ow
                   ? (int64_t)(((size_t)b * io->oh + (size_t)y) * io->ow + (size_t)x) * cout
                   : -1;
      if (++x == wq) {
        x = 0;
        if (++y == hq) y = 0, b++;
      }
    }
    for (int f = 0; f < cout; f += 16) {
      __m256i half[2];
      __m512 sum = _mm512_loadu_ps(bsum + f);
      for (int h = 0; h < 2; h++) {
        if (src[h] < 0) {
          half[h] = _mm256_setzero_si256();
          continue;
        }
        __m512 v;
        if (j->dy_bf16) {
          half[h] = _mm256_loadu_si256((const void *)((const uint16_t *)j->dy + src[h] + f));
          v = kn_bf16_widen_avx512(half[h]);
        } else {
          v = _mm512_loadu_ps((const float *)j->dy + src[h] + f);
          half[h] = kn_bf16_pack16_native(v);
        }
        sum = _mm512_add_ps(sum, v);
      }
      _mm512_storeu_ps(bsum + f, sum);
      /* the two rows' lanes interleaved: v = 2k's value low */
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(half[0]), half[1], 1);
      _mm512_storeu_si512(dyp + (size_t)k * cout + f, _mm512_permutexvar_epi16(lo_hi, both));
    }
  }
}

/* Slices [s0, s1): each one's images into its partial sums. */
static void wgrad_slices(void *ctx, int slot, int64_t s0, int64_t s1) {
  const wgrad_job *j = ctx;
  const struct kn_wino_io *io = j->io;
  const int cin = io->cin, cout = io->cout, wq = j->w.wq;
  float *scratch = j->scratch + (size_t)slot * j->w.scratch_floats;
  uint32_t *dyp = (uint32_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
  uint16_t *xt = (uint16_t *)(void *)(dyp + j->w.dyp_words);
  kn_amx_configure(16, 16);
  for (int64_t s = s0; s < s1; s++) {
    float *part = j->partials + (size_t)s * j->w.slice_floats, *bsum = part + 9 * cin * cout;
    memset(bsum, 0, (size_t)cout * sizeof *bsum);
    const int64_t b0 = s * j->w.per, b1 = b0 + j->w.per < io->batch ? b0 + j->w.per : io->batch;
    if (b0 >= b1) {
      memset(part, 0, (size_t)9 * cin * cout * sizeof *part);
      continue;
    }
    fill_xt(j, b0, b1, xt);
    fill_dyp(j, b0, b1, dyp, bsum);
    /* the slice's pixels up to the last image's last row (32s) */
    const int64_t kp = (((b1 - b0) * j->w.hq * wq + 31) / 32 * 32) / 2;
    /* by blocks of depth that stay in cache while the nine taps read them
     * (their A rows overlap but for a row or two): dy's pairs, x's pixels
     * a little past them */
    for (int64_t k0 = 0; k0 < kp; k0 += WGRAD_DEPTH) {
      const int kn = (int)(kp - k0 < WGRAD_DEPTH ? kp - k0 : WGRAD_DEPTH);
      for (int t = 0; t < 9; t++) {
        const int ki = t / 3, kj = t % 3, st = j->w.s;
        const uint16_t *phase = xt + (size_t)((ki % st) * st + kj % st) * cin * j->w.ldx;
        const ptrdiff_t off = (ptrdiff_t)(ki / st) * wq + kj / st + 2 * k0;
        kn_amx_gemm(cin, cout, kn, 16, 16, phase + off, j->w.ldx, dyp + (size_t)k0 * cout, cout,
                    part + (size_t)t * cin * cout, cout, k0 > 0);
      }
    }
  }
  kn_amx_release();
}

/* Rows [r0, r1) of dw (row 9 cin: the bias sums, where wanted): the
 * slices' partials added in slice order. */
static void wgrad_sum(void *ctx, int64_t r0, int64_t r1) {
  const wgrad_job *j = ctx;
  const int cout = j->io->cout;
  for (int64_t r = r0; r < r1; r++) {
    float *to = r < 9 * j->io->cin ? j->dw + (size_t)r * cout : j->b_sums;
    if (!to) continue;
    for (int f = 0; f < cout; f++) {
      float v = j->partials[(size_t)r * cout + f];
      for (int s = 1; s < j->w.slices; s++)
        v += j->partials[(size_t)s * j->w.slice_floats + (size_t)r * cout + f];
      to[f] = v;
    }
  }
}

void kn_amx_conv_wgrad(struct kn_graph *g, const struct kn_wino_io *io, const void *dy, int dy_bf16,
                       float *dw, float *b_sums) {
  wgrad_job j = {
      .io = io, .w = wgrad_shape_of(io), .dy = dy, .dy_bf16 = dy_bf16, .dw = dw, .b_sums = b_sums};
  j.partials = g->conv_buf;
  j.scratch = j.partials + (size_t)j.w.slices * j.w.slice_floats;
  kn_pool_share(g->pool, j.w.slices, 1, wgrad_slices, &j);
  kn_pool_for(g->pool, (int64_t)9 * io->cin + 1, wgrad_sum, &j);
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

int kn_amx_conv_wgrad_fits(const struct kn_wino_io *io) {
  (void)io;
  return 0;
}

size_t kn_amx_conv_wgrad_floats(int threads, const struct kn_wino_io *io) {
  (void)threads, (void)io;
  return 0;
}

void kn_amx_conv_wgrad(struct kn_graph *g, const struct kn_wino_io *io, const void *dy, int dy_bf16,
                       float *dw, float *b_sums) {
  (void)g, (void)io, (void)dy, (void)dy_bf16, (void)dw, (void)b_sums;
  abort(); /* the winograd pass marks no direct product where this does not build */
}
#endif
