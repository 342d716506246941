/* gemm.c — kiln's own single-precision GEMM for CPUs with AVX-512F:
 * C = op(A) op(B), row-major, on the graph's thread pool.
 *
 * The shapes a training step multiplies are tall and narrow: a convolution
 * is (batch x H x W, kernel area x C_in) times (.., C_out) with C_out 32 to
 * 256, and its weight gradient sums over tens of thousands of rows. A
 * general BLAS tuned for square matrices leaves much of the FMA units idle
 * there, so kiln blocks for them itself:
 *
 *   - B is packed, kc rows x nc columns at a time, into panels NR = 32
 *     columns wide (two 512-bit registers), zero-padded at the edge;
 *   - A is read in place, 12 rows at a time: the micro-kernel broadcasts
 *     each element straight from memory into an FMA (packing A cost more
 *     than it saved when only a few B panels share it, as here);
 *   - the micro-kernel keeps a 12 x 32 tile of C in 24 registers for the
 *     whole kc loop, and writes it once, masked at the right edge; a C at
 *     most 16 wide (16 filters, or 16 input channels) gets tiles 16 wide
 *     and 12 to 24 tall instead (NR_NARROW).
 *
 * Each thread takes whole 12-row blocks of C (or, for a C no taller than
 * it is wide, whole 32-column panels) and packs its own B, so every
 * element of C is summed by one thread in one order. A deep product with a
 * small C (a weight gradient: 9 x 32 summed over 100,352 pixels) has too
 * few blocks to share, so its depth is cut into slices fixed by the shape,
 * each summed whole by one thread and then added in slice order. Either
 * way the result is the same bits for any thread count, and nothing is
 * allocated here (the workspace is the graph's, sized at compile).
 *
 * The packing of B can sum B's rows on the way: a layer's bias gradient
 * is the row sum of the dy its weight gradient's GEMM packs. */
#include <cblas.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"

#define MR     12
#define NR     32
#define KC_MAX 512
#define NC     128 /* a multiple of NR */

/* A C at most 16 columns wide (a convolution with 16 filters, or over 16
 * channels: its forward, input and weight gradients) would fill only half
 * of each 32-column tile; it is cut into tiles 16 wide instead (one
 * 512-bit B vector a row of the panel), 12 rows tall where each row of A
 * needs a pointer of its own, 24 (or 16, see narrow_rows) where the rows
 * lie at fixed distances. Every element of C is still summed over the
 * same depth blocks in the same order, so the bits are those of the 12 x
 * 32 tiles. */
#define NR_NARROW 16
#define MR_MAX    24

/* Depth split: a product summed over many more rows than C has elements (a
 * convolution's weight gradient sums over every pixel of the batch), at
 * least SPLIT_MIN deep, is cut into up to SLICES_MAX slices of the depth,
 * at least SLICE_MIN deep, summed apiece and then added in slice order
 * (many slices, so that any thread count shares them evenly). The slices
 * depend on the shape alone, so the bits do not depend on the thread
 * count; the partial sums of slices 1 .. SLICES-1 are capped at
 * PARTIAL_MAX floats. */
#define SPLIT_MIN   4096
#define SLICE_MIN   512
#define SLICES_MAX  16
#define PARTIAL_MAX (1 << 20)

/* The fewest row blocks the pool hands a thread at a time (own_run):
 * each range packs B again. */
#define GRAIN_BLOCKS 8

size_t kn_gemm_workspace_floats(void) {
  return (size_t)KC_MAX * NC;
}

/* The slices a product of this shape is summed in (1: not split); an
 * epilogue (bias, relu) keeps it whole. */
static int gemm_slices(int m, int n, int k) {
  if (k < SPLIT_MIN) return 1;
  int s = k / SLICE_MIN;
  if (s > SLICES_MAX) s = SLICES_MAX;
  const size_t per = (size_t)m * n + (size_t)n; /* C's and B's row sums */
  if (s > 1 && (size_t)(s - 1) * per > PARTIAL_MAX) s = (int)(PARTIAL_MAX / per) + 1;
  return s > 1 ? s : 1;
}

size_t kn_gemm_partial_floats(int m, int n, int k) {
  const int s = gemm_slices(m, n, k);
  return s > 1 ? (size_t)(s - 1) * ((size_t)m * n + (size_t)n) : 0;
}

/* Columns c0 .. c0 + n - 1 of row p of a pool's gradient read as B
 * (kn_pool_grad_b) into row: the definition pack_pool_rows steps through. */
static void pool_grad_b_row(const kn_pool_grad_b *v, int64_t p, int c0, int n, float *row) {
  const int64_t per = (int64_t)v->h * v->w, b = p / per, r = p % per;
  int cell;
  const ptrdiff_t at = kn_pool_grad_at(v, b, (int)(r / v->w), (int)(r % v->w), &cell);
  if (at < 0) {
    for (int c = 0; c < n; c++) row[c] = 0.0f;
    return;
  }
  const size_t o = (size_t)at + c0;
  for (int c = 0; c < n; c++) row[c] = v->argmax[o + c] == cell ? v->dy[o + c] : 0.0f;
}
static ptrdiff_t cols_at(const kn_conv_cols *v, int64_t p, int t) {
  return kn_cols_row(v, p) + kn_cols_col(v, t);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

static int own_available(void) {
  return kn_cpu_features_get()->avx512f;
}

typedef struct gemm_job {
  kn_sgemm_args x;          /* the product: operands, C, epilogue, row sums of B */
  float *workspace;         /* kn_gemm_workspace_floats() per thread */
  int by_columns;           /* split C's columns among them, not its rows */
  const kn_conv_flip *flip; /* B is a convolution kernel turned 180 degrees */
  int slices;               /* depth slices (gemm_slices): slice 0 into C and b_sums, */
  float *partials;          /* slice s > 0 into partials + (s - 1) * (m * n + n) */
  int mr, nr;               /* its tile: MR x NR, or narrow_rows x NR_NARROW */
} gemm_job;

/* Rows p0 .. p0 + kc - 1 (pixels), columns c0 .. c0 + w - 1 of a max
 * pool's input gradient (pool_grad_b_row's values) into rows nr apart:
 * the pixel's position is stepped, not divided out, and 16 channels at a
 * time take dy where the argmax byte names the pixel's cell, else 0. */
__attribute__((target("avx512f"))) static void
pack_pool_rows(const kn_pool_grad_b *v, int64_t p0, int kc, int c0, int w, int nr, float *dst) {
  const int64_t per = (int64_t)v->h * v->w;
  int64_t b = p0 / per;
  int y = (int)(p0 % per / v->w), x = (int)(p0 % per % v->w);
  for (int kk = 0; kk < kc; kk++) {
    float *restrict row = dst + (size_t)kk * nr;
    int cell;
    const ptrdiff_t at = kn_pool_grad_at(v, b, y, x, &cell);
    if (at < 0) {
      for (int c = 0; c < w; c++) row[c] = 0.0f;
    } else {
      const size_t o = (size_t)at + c0;
      const unsigned char *restrict am = v->argmax + o;
      const float *restrict dy = v->dy + o;
      int c = 0;
      for (; c + 16 <= w; c += 16) {
        const __m512i cells = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(am + c)));
        const __mmask16 hit = _mm512_cmpeq_epi32_mask(cells, _mm512_set1_epi32(cell));
        _mm512_storeu_ps(row + c, _mm512_maskz_loadu_ps(hit, dy + c));
      }
      for (; c < w; c++) row[c] = am[c] == cell ? dy[c] : 0.0f;
    }
    if (++x == v->w) {
      x = 0;
      if (++y == v->h) {
        y = 0;
        b++;
      }
    }
  }
}

/* A whole panel of B, nr (16 or 32) columns wide, from b (B's element
 * (kk, c) at b[kk * ldb + c], or transposed with tb at b[c * ldb + kk]: a
 * layer's weights in its input gradient): each row in one or two 512-bit
 * loads (gathers, 16 columns at a time, with tb), its sums added as
 * vectors (each column in row order still, so the sums are those of the
 * scalar loop). */
__attribute__((target("avx512f"))) static void
pack_full_panel(const float *b, int ldb, int tb, int kc, int nr, float *panel, float *sums) {
  const __m512i at =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(ldb));
  const float *b1 = tb ? b + (size_t)16 * ldb : b + 16; /* columns 16 .. 31 */
  __m512 s0 = sums ? _mm512_loadu_ps(sums) : _mm512_setzero_ps();
  __m512 s1 = sums && nr == 32 ? _mm512_loadu_ps(sums + 16) : _mm512_setzero_ps();
  for (int kk = 0; kk < kc; kk++) {
    float *row = panel + (size_t)kk * nr;
    const __m512 v0 =
        tb ? _mm512_i32gather_ps(at, b + kk, 4) : _mm512_loadu_ps(b + (size_t)kk * ldb);
    _mm512_store_ps(row, v0);
    s0 = _mm512_add_ps(s0, v0);
    if (nr == 32) {
      const __m512 v1 =
          tb ? _mm512_i32gather_ps(at, b1 + kk, 4) : _mm512_loadu_ps(b1 + (size_t)kk * ldb);
      _mm512_store_ps(row + 16, v1);
      s1 = _mm512_add_ps(s1, v1);
    }
  }
  if (sums) {
    _mm512_storeu_ps(sums, s0);
    if (nr == 32) _mm512_storeu_ps(sums + 16, s1);
  }
}

/* B's rows k0 .. k0 + kc - 1, columns n0 .. n0 + nc - 1 as panels of nr
 * columns: panel p holds [kk][nr] at dst + p * kc * nr. With sums set,
 * each row is added to sums[n0 ..] on the way, in row order. */
static void pack_b(const gemm_job *j, int k0, int kc, int n0, int nc, float *dst, float *sums) {
  const int nr = j->nr;
  for (int p = 0; p * nr < nc; p++) {
    const int c0 = n0 + p * nr, w = nc - p * nr < nr ? nc - p * nr : nr;
    float *panel = dst + (size_t)p * kc * nr;
    if (!j->flip && !j->x.pool && w == nr && (!j->x.tb || (int64_t)j->x.ldb * 32 < INT32_MAX)) {
      const size_t at = j->x.tb ? (size_t)c0 * j->x.ldb + k0 : (size_t)k0 * j->x.ldb + c0;
      pack_full_panel(j->x.b + at, j->x.ldb, j->x.tb, kc, nr, panel,
                      sums ? sums + (c0 - n0) : NULL);
      continue;
    }
    if (j->x.pool) pack_pool_rows(j->x.pool, k0, kc, c0, w, nr, panel);
    for (int kk = 0; kk < kc; kk++) {
      float *row = panel + (size_t)kk * nr;
      if (j->flip) {
        const float *wf = j->flip->w;
        const ptrdiff_t at = kn_flip_at(j->flip, k0 + kk, c0); /* columns are F apart */
        for (int c = 0; c < w; c++) row[c] = wf[at + (ptrdiff_t)c * j->flip->f];
      } else if (j->x.pool) {
        /* packed above */
      } else if (!j->x.tb) {
        memcpy(row, j->x.b + (size_t)(k0 + kk) * j->x.ldb + c0, (size_t)w * sizeof *row);
      } else {
        for (int c = 0; c < w; c++) row[c] = j->x.b[(size_t)(c0 + c) * j->x.ldb + k0 + kk];
      }
      for (int c = w; c < nr; c++) row[c] = 0.0f;
      if (sums)
        for (int c = 0; c < w; c++) sums[c0 - n0 + c] += row[c];
    }
  }
}

/* Where a tile of C goes and what happens on the way: C = sums (or C +
 * sums); then, on the last depth block of a fused matmul, + bias per
 * column and relu (KN_RELU: NaN passes) — the operations, in the order, of
 * the epilogue that otherwise runs over C after the GEMM. */
typedef struct tile_dst {
  float *c;
  int ldc, mr, nr, accumulate;
  const float *bias; /* this tile's first column's, or NULL */
  int relu;
} tile_dst;

/* C[mr x nr] from op(A)'s rows 0 .. mr - 1, columns 0 .. kc - 1, times one
 * packed B panel, the tile (rows x 16 * vecs: 12 x 32 or 24 x 16) kept in
 * 24 registers for the whole loop. op(A)'s
 * element (i, kk) is read in place and broadcast straight into the FMAs,
 * at row[i][kk] (mode 0), row[i][kk * lda] (mode 1: A transposed) or
 * row[i][koff[kk]] (mode 2: a convolution's columns gathered from its
 * padded input, the same products in the same order as on materialized
 * columns), or rows[0][koff[kk] + i] (mode 3: mode 2 where the block's
 * rows are neighbours, as a tap's channels are, so one pointer serves
 * them all) or rows[0][kk * lda + i] (mode 4: mode 1 for a whole tile,
 * one pointer likewise); rows past mr repeat row 0 and are not stored. */
__attribute__((target("avx512f"), always_inline)) static inline void
tile(const int rows_n, const int vecs, int mode, int kc, const float *const *rows, int lda,
     const ptrdiff_t *restrict koff, const float *restrict bp, const tile_dst *d) {
  __m512 c0[MR_MAX], c1[MR_MAX];
  const float *row[MR_MAX];
  const size_t stride = (size_t)vecs * 16;
#pragma GCC unroll 24
  for (int i = 0; i < rows_n; i++) {
    c0[i] = c1[i] = _mm512_setzero_ps();
    row[i] = mode >= 3 ? rows[0] + i : rows[i < d->mr ? i : 0];
  }
  for (int kk = 0; kk < kc; kk++) {
    const __m512 b0 = _mm512_load_ps(bp + (size_t)kk * stride);
    const __m512 b1 = vecs == 2 ? _mm512_load_ps(bp + (size_t)kk * stride + 16) : b0;
    const ptrdiff_t o = mode == 0 ? kk : mode == 1 || mode == 4 ? (ptrdiff_t)kk * lda : koff[kk];
#pragma GCC unroll 24
    for (int i = 0; i < rows_n; i++) {
      const __m512 ai = _mm512_set1_ps(row[i][o]);
      c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
      if (vecs == 2) c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
    }
  }
  const int nr = d->nr;
  const __mmask16 m0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1);
  const __mmask16 m1 = nr >= 32  ? (__mmask16)0xffff
                       : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1)
                                 : (__mmask16)0;
  const __m512 bias0 = d->bias ? _mm512_maskz_loadu_ps(m0, d->bias) : _mm512_setzero_ps();
  const __m512 bias1 = d->bias ? _mm512_maskz_loadu_ps(m1, d->bias + 16) : _mm512_setzero_ps();
#pragma GCC unroll 24
  for (int i = 0; i < rows_n; i++) {
    if (i >= d->mr) break;
    float *out = d->c + (size_t)i * d->ldc;
    __m512 v0 = c0[i];
    if (d->accumulate) v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, out));
    if (d->bias) v0 = _mm512_add_ps(v0, bias0);
    /* max(0, v) returns its second operand, v, when either is NaN */
    if (d->relu) v0 = _mm512_max_ps(_mm512_setzero_ps(), v0);
    _mm512_mask_storeu_ps(out, m0, v0);
    if (vecs == 2) {
      __m512 v1 = c1[i];
      if (d->accumulate) v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, out + 16));
      if (d->bias) v1 = _mm512_add_ps(v1, bias1);
      if (d->relu) v1 = _mm512_max_ps(_mm512_setzero_ps(), v1);
      _mm512_mask_storeu_ps(out + 16, m1, v1);
    }
  }
}

/* The tile over op(A) in place (transposed with ta): 12 x 32, or 12 x 16
 * (24 x 16 transposed, where row i is i floats on from row 0, when
 * narrow_rows says so). */
__attribute__((target("avx512f"))) static void tile_a(int rows_n, int nr, int ta, int kc,
                                                      const float *a, int lda, const float *bp,
                                                      const tile_dst *d) {
  const float *rows[MR_MAX];
  for (int i = 0; i < MR_MAX; i++) {
    const size_t r = (size_t)(i < d->mr ? i : 0);
    rows[i] = a + (ta ? r : r * (size_t)lda);
  }
  /* a whole tile of transposed A: its rows are neighbours (mode 4) */
  const int whole = ta && d->mr == (nr == NR ? MR : rows_n);
  if (nr == NR && whole)
    tile(MR, 2, 4, kc, rows, lda, NULL, bp, d);
  else if (nr == NR && ta)
    tile(MR, 2, 1, kc, rows, lda, NULL, bp, d);
  else if (nr == NR)
    tile(MR, 2, 0, kc, rows, lda, NULL, bp, d);
  else if (ta && rows_n == 24 && whole)
    tile(24, 1, 4, kc, rows, lda, NULL, bp, d);
  else if (ta && rows_n == 24)
    tile(24, 1, 1, kc, rows, lda, NULL, bp, d);
  else if (whole)
    tile(12, 1, 4, kc, rows, lda, NULL, bp, d);
  else if (ta)
    tile(12, 1, 1, kc, rows, lda, NULL, bp, d);
  else
    tile(12, 1, 0, kc, rows, lda, NULL, bp, d);
}

/* The tile over a convolution's columns: rows_n x nr, by one pointer when
 * the block's rows are neighbours. */
__attribute__((target("avx512f"))) static void tile_gather(int rows_n, int nr, int neighbours,
                                                           int kc, const float *const *rows,
                                                           const ptrdiff_t *koff, const float *bp,
                                                           const tile_dst *d) {
  if (nr == NR && neighbours)
    tile(MR, 2, 3, kc, rows, 0, koff, bp, d);
  else if (nr == NR)
    tile(MR, 2, 2, kc, rows, 0, koff, bp, d);
  else if (rows_n == 24 && neighbours)
    tile(24, 1, 3, kc, rows, 0, koff, bp, d);
  else if (rows_n == 24)
    tile(24, 1, 2, kc, rows, 0, koff, bp, d);
  else if (rows_n == 16 && neighbours)
    tile(16, 1, 3, kc, rows, 0, koff, bp, d);
  else if (rows_n == 16)
    tile(16, 1, 2, kc, rows, 0, koff, bp, d);
  else if (neighbours)
    tile(12, 1, 3, kc, rows, 0, koff, bp, d);
  else
    tile(12, 1, 2, kc, rows, 0, koff, bp, d);
}

/* Where one task's share of the product goes: C itself, or a depth
 * slice's partial sums (C's shape, row stride n), with the column sums of
 * op(B) over the same rows. */
typedef struct gemm_part {
  float *c;
  int ldc;
  int k_lo, k_hi; /* the depth it sums over */
  float *b_sums;  /* or NULL */
  int accumulate; /* its first depth block adds to c */
} gemm_part;

/* The destination of the tile at C's row i0, column c0, depth block k0. */
static tile_dst tile_at(const gemm_job *j, const gemm_part *pt, int i0, int c0, int k0, int kc) {
  const int last = k0 + kc >= j->x.k;
  tile_dst d = {pt->c + (size_t)i0 * pt->ldc + c0,
                pt->ldc,
                j->x.m - i0 < j->mr ? j->x.m - i0 : j->mr,
                j->x.n - c0 < j->nr ? j->x.n - c0 : j->nr,
                k0 > pt->k_lo || pt->accumulate,
                last && j->x.bias ? j->x.bias + c0 : NULL,
                last && j->x.relu};
  return d;
}

/* One row block x column chunk x k block of a GEMM whose A is a
 * convolution's columns: op(A)'s row i starts at rows[i], its column kk
 * lies koff[kk] further (a row of the columns is a pixel, a column a
 * tap and channel; transposed, the roles swap). */
static void cols_block(const gemm_job *j, const gemm_part *pt, int i0, int k0, int kc,
                       const ptrdiff_t *koff, int n0, int nc, const float *bpack) {
  const float *rows[MR_MAX];
  const kn_conv_cols *v = j->x.cols;
  const float *x = v->x;
  const int mr = j->x.m - i0 < j->mr ? j->x.m - i0 : j->mr;
  if (j->x.ta) {
    for (int i = 0; i < j->mr; i++) rows[i] = x + kn_cols_col(v, i0 + (i < mr ? i : 0));
  } else {
    /* Pixels i0 .. i0 + mr - 1. */
    kn_pixel_cursor q = kn_pixel_at(v, i0);
    for (int i = 0; i < mr; i++, kn_pixel_next(v, &q)) rows[i] = x + kn_pixel_row(v, &q);
    for (int i = mr; i < j->mr; i++) rows[i] = rows[0];
  }
  int neighbours = mr == j->mr;
  for (int i = 1; i < mr && neighbours; i++) neighbours = rows[i] == rows[0] + i;
  for (int p = 0; p * j->nr < nc; p++) {
    const tile_dst d = tile_at(j, pt, i0, n0 + p * j->nr, k0, kc);
    tile_gather(j->mr, j->nr, neighbours, kc, rows, koff, bpack + (size_t)p * kc * j->nr, &d);
  }
}

/* C's row blocks [b0, b1) and columns [n_lo, n_hi), summed over the part's
 * depth into its destination; B is packed into bpack, its row sums taken
 * on the way into the part's b_sums when sums is set. */
static void gemm_block_range(const gemm_job *j, const gemm_part *pt, int b0, int b1, int n_lo,
                             int n_hi, int sums, float *bpack) {
  /* the depth in near-equal blocks of at most KC_MAX */
  const int depth = pt->k_hi - pt->k_lo, k_blocks = (depth + KC_MAX - 1) / KC_MAX;
  const int kc_step = (depth + k_blocks - 1) / k_blocks;
  for (int n0 = n_lo; n0 < n_hi; n0 += NC) {
    const int nc = n_hi - n0 < NC ? n_hi - n0 : NC;
    float *b_sums = sums && pt->b_sums ? pt->b_sums + n0 : NULL;
    if (b_sums) memset(b_sums, 0, (size_t)nc * sizeof *b_sums);
    for (int k0 = pt->k_lo; k0 < pt->k_hi; k0 += kc_step) {
      const int kc = pt->k_hi - k0 < kc_step ? pt->k_hi - k0 : kc_step;
      pack_b(j, k0, kc, n0, nc, bpack, b_sums);
      if (j->x.cols) {
        ptrdiff_t koff[KC_MAX];
        if (j->x.ta) { /* the depth is pixels */
          kn_pixel_cursor q = kn_pixel_at(j->x.cols, k0);
          for (int kk = 0; kk < kc; kk++, kn_pixel_next(j->x.cols, &q))
            koff[kk] = kn_pixel_row(j->x.cols, &q);
        } else {
          for (int kk = 0; kk < kc; kk++) koff[kk] = kn_cols_col(j->x.cols, k0 + kk);
        }
        for (int blk = b0; blk < b1; blk++)
          cols_block(j, pt, blk * j->mr, k0, kc, koff, n0, nc, bpack);
        continue;
      }
      for (int blk = b0; blk < b1; blk++) {
        const int i0 = blk * j->mr;
        /* op(A)'s block at row i0, column k0 */
        const float *ablk =
            j->x.ta ? j->x.a + (size_t)k0 * j->x.lda + i0 : j->x.a + (size_t)i0 * j->x.lda + k0;
        for (int p = 0; p * j->nr < nc; p++) {
          const tile_dst d = tile_at(j, pt, i0, n0 + p * j->nr, k0, kc);
          tile_a(j->mr, j->nr, j->x.ta, kc, ablk, j->x.lda, bpack + (size_t)p * kc * j->nr, &d);
        }
      }
    }
  }
}

/* Depth slice s of a split product: slice 0 into C and b_sums, the others
 * into their partial sums. */
static gemm_part slice_part(const gemm_job *j, int s) {
  const int lo = (int)((int64_t)j->x.k * s / j->slices),
            hi = (int)((int64_t)j->x.k * (s + 1) / j->slices);
  if (s == 0) return (gemm_part){j->x.c, j->x.ldc, lo, hi, j->x.b_sums, j->x.accumulate};
  float *p = j->partials + (size_t)(s - 1) * ((size_t)j->x.m * j->x.n + (size_t)j->x.n);
  return (gemm_part){p, j->x.n, lo, hi, j->x.b_sums ? p + (size_t)j->x.m * j->x.n : NULL, 0};
}

/* A product's units: its depth slices where it is split in depth, else
 * C's column panels where C is no taller than it is wide (a dense layer's
 * GEMMs at batch 128: there each thread would otherwise pack all of B,
 * and B is most of the work), else C's row blocks. The pool hands them out
 * (kn_pool_share), each range packing B into its slot's buffer. Each
 * element of C (and of a slice) is summed in the same order by one
 * thread, whichever, so the bits do not depend on the split. Where every
 * range packs all of B, the one with the first row block sums its rows. */
static int gemm_units(const gemm_job *j) {
  if (j->slices > 1) return j->slices;
  return j->by_columns ? (j->x.n + j->nr - 1) / j->nr : (j->x.m + j->mr - 1) / j->mr;
}

static void gemm_range(void *ctx, int slot, int64_t u0, int64_t u1) {
  const gemm_job *j = ctx;
  float *bpack = j->workspace + (size_t)slot * kn_gemm_workspace_floats();
  const int blocks = (j->x.m + j->mr - 1) / j->mr;
  if (j->slices > 1) {
    for (int64_t s = u0; s < u1; s++) {
      const gemm_part pt = slice_part(j, (int)s);
      gemm_block_range(j, &pt, 0, blocks, 0, j->x.n, 1, bpack);
    }
    return;
  }
  int b0 = 0, b1 = blocks, n_lo = 0, n_hi = j->x.n;
  if (j->by_columns) {
    n_lo = (int)u0 * j->nr;
    n_hi = (int)u1 * j->nr;
    if (n_hi > j->x.n) n_hi = j->x.n;
  } else {
    b0 = (int)u0;
    b1 = (int)u1;
  }
  const gemm_part whole = {j->x.c, j->x.ldc, 0, j->x.k, j->x.b_sums, j->x.accumulate};
  gemm_block_range(j, &whole, b0, b1, n_lo, n_hi, j->by_columns || b0 == 0, bpack);
}

/* C's rows [r0, r1) (and, with the first, the column sums): the partial
 * sums of slices 1 .. S-1 added to slice 0's, in slice order. */
static void add_slices(void *ctx, int64_t r0, int64_t r1) {
  const gemm_job *j = ctx;
  const size_t per = (size_t)j->x.m * j->x.n + (size_t)j->x.n;
  for (int64_t r = r0; r < r1; r++) {
    const int sums_row = r == j->x.m; /* one past C's rows: the column sums */
    if (sums_row && !j->x.b_sums) continue;
    float *dst = sums_row ? j->x.b_sums : j->x.c + (size_t)r * j->x.ldc;
    for (int s = 1; s < j->slices; s++) {
      const float *src = j->partials + (size_t)(s - 1) * per + (size_t)r * j->x.n;
      for (int c = 0; c < j->x.n; c++) dst[c] += src[c];
    }
  }
}

/* ---- Narrow weight gradients, computed transposed ----
 *
 * A product with A transposed and C at most 16 wide (a weight gradient:
 * C (taps x channels, filters) = columns^T dy summed over every pixel, or
 * a dense layer's (inputs, units) = x^T dy over the batch) would use the
 * 16-wide tile, which loads one element of A for every FMA. Computed as
 * C^T = dy^T op(A)^T instead, the roles turn: the few columns of C are
 * rows, broadcast from dy's row (8 of them a tile), and op(A)'s rows are
 * read as vectors straight from x (or the padded input, a tap's channels
 * at a time), three per step, each used by 8 FMAs: 24 FMAs for 11 loads
 * in place of 16 for 17. Nothing is packed. Each tile sums its whole depth
 * (the product's, or its depth slice's, as gemm_slices cuts it) in
 * registers and is written transposed into C (or the slice's partial
 * sums) once; dy's row sums (the bias gradient) are taken on the way by
 * the tile at C's first rows. Every element of C is thus summed by one
 * thread in one order, fixed by the shape. */
#define TR_ROWS 8  /* columns of C a tile: rows of C^T */
#define TR_COLS 48 /* rows of C a tile: three 512-bit vectors */

/* Whether C = op(A) B runs transposed: A transposed, B plain, C at most 16
 * wide and at least 16 tall, no epilogue, and op(A)'s rows readable as
 * vectors (a convolution's columns over a multiple of 16 channels). */
static int narrow_transposed(const kn_sgemm_args *x, const kn_conv_flip *flip) {
  return x->ta && !x->tb && !flip && !x->pool && !x->bias && !x->relu && x->n <= NR_NARROW &&
         x->m >= 16 && (!x->cols || x->cols->c % 16 == 0);
}

/* Rows [i0, i0 + 16 * vecs) of C (masked past m) by columns [c0, c0 +
 * cols) (cols <= 8), summed over depth [k0, k1) into dst (row stride
 * ldd), with B's row sums over the same depth into sums when set. Row kk
 * of op(A)^T is at x + roff(kk), its vector v at + off[v]. */
__attribute__((target("avx512f"), always_inline)) static inline void
tile_tr(const int vecs, const kn_sgemm_args *x, int i0, int c0, int cols, int k0, int k1,
        float *dst, int ldd, float *sums, int add) {
  __m512 acc[TR_ROWS][3];
  for (int r = 0; r < TR_ROWS; r++)
    for (int v = 0; v < 3; v++) acc[r][v] = _mm512_setzero_ps();
  const int rows_left = x->m - i0;
  __mmask16 mask[3];
  ptrdiff_t off[3];
  for (int v = 0; v < 3; v++) {
    const int left = rows_left - 16 * v;
    mask[v] = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
    off[v] = x->cols ? kn_cols_col(x->cols, i0 + 16 * v < x->m ? i0 + 16 * v : i0) : i0 + 16 * v;
  }
  const __mmask16 nmask = (__mmask16)((1u << x->n) - 1);
  __m512 bsum = _mm512_setzero_ps();
  const float *base = x->cols ? (const float *)x->cols->x : x->a;
  const kn_conv_cols *cv = x->cols;
  kn_pixel_cursor q = cv ? kn_pixel_at(cv, k0) : (kn_pixel_cursor){0, 0, 0};
  for (int kk = k0; kk < k1; kk++) {
    const float *row;
    if (cv) {
      row = base + kn_pixel_row(cv, &q);
      kn_pixel_next(cv, &q);
    } else {
      row = base + (size_t)kk * x->lda;
    }
    const __m512 b0 = _mm512_maskz_loadu_ps(mask[0], row + off[0]);
    const __m512 b1 = vecs >= 2 ? _mm512_maskz_loadu_ps(mask[1], row + off[1]) : b0;
    const __m512 b2 = vecs >= 3 ? _mm512_maskz_loadu_ps(mask[2], row + off[2]) : b0;
    const float *dy = x->b + (size_t)kk * x->ldb + c0;
    if (sums) bsum = _mm512_add_ps(bsum, _mm512_maskz_loadu_ps(nmask, x->b + (size_t)kk * x->ldb));
#pragma GCC unroll 8
    for (int r = 0; r < TR_ROWS; r++) {
      const __m512 a = _mm512_set1_ps(dy[r < cols ? r : 0]);
      acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
      if (vecs >= 2) acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
      if (vecs >= 3) acc[r][2] = _mm512_fmadd_ps(a, b2, acc[r][2]);
    }
  }
  if (sums) _mm512_mask_storeu_ps(sums, nmask, bsum);
  /* C^T's tile through the stack into C, transposed. */
  float t[TR_ROWS][TR_COLS];
  for (int r = 0; r < TR_ROWS; r++)
    for (int v = 0; v < vecs; v++) _mm512_storeu_ps(&t[r][16 * v], acc[r][v]);
  const int rows = rows_left < 16 * vecs ? rows_left : 16 * vecs;
  for (int i = 0; i < rows; i++) {
    float *out = dst + (size_t)(i0 + i) * ldd + c0;
    for (int r = 0; r < cols; r++) out[r] = add ? out[r] + t[r][i] : t[r][i];
  }
}

/* Rows [i0, ..) of C, one tile of TR_COLS rows, every column. */
__attribute__((target("avx512f"))) static void
tr_rows(const kn_sgemm_args *x, int i0, int k0, int k1, float *dst, int ldd, float *sums, int add) {
  const int left = x->m - i0, vecs = left > 32 ? 3 : left > 16 ? 2 : 1;
  for (int c0 = 0; c0 < x->n; c0 += TR_ROWS) {
    const int cols = x->n - c0 < TR_ROWS ? x->n - c0 : TR_ROWS;
    float *s = c0 == 0 && i0 == 0 ? sums : NULL;
    if (vecs == 3)
      tile_tr(3, x, i0, c0, cols, k0, k1, dst, ldd, s, add);
    else if (vecs == 2)
      tile_tr(2, x, i0, c0, cols, k0, k1, dst, ldd, s, add);
    else
      tile_tr(1, x, i0, c0, cols, k0, k1, dst, ldd, s, add);
  }
}

/* Units [u0, u1) of a product computed transposed: whole depth slices
 * (slice_part's, as gemm_range takes them), or, in one slice, tiles of
 * C's rows. */
static void tr_range(void *ctx, int64_t u0, int64_t u1) {
  const gemm_job *j = ctx;
  const kn_sgemm_args *x = &j->x;
  const int tiles = (x->m + TR_COLS - 1) / TR_COLS;
  for (int64_t u = u0; u < u1; u++) {
    if (j->slices > 1) {
      const gemm_part pt = slice_part(j, (int)u);
      for (int i = 0; i < tiles; i++)
        tr_rows(x, i * TR_COLS, pt.k_lo, pt.k_hi, pt.c, pt.ldc, pt.b_sums, pt.accumulate);
      continue;
    }
    tr_rows(x, (int)u * TR_COLS, 0, x->k, x->c, x->ldc, x->b_sums, x->accumulate);
  }
}

/* The rows of a tile 16 wide: 24 where A is transposed (its rows are
 * neighbours in memory), 16 where A is the transposed columns of a
 * convolution over a multiple of 16 channels (each block one tap's
 * channels, neighbours), else 12 (a row's own pointer each; and where C
 * has at most 12 rows, as a first convolution's 9 taps, the fewest rows
 * computed and dropped). */
static int narrow_rows(const kn_sgemm_args *x) {
  if (!x->ta || x->m <= 12) return 12;
  if (!x->cols) return 24;
  return x->cols->c % 16 == 0 ? 16 : 12;
}

/* The product on pool's threads (NULL: the calling thread), packing in
 * workspace (kn_gemm_workspace_floats a thread), a deep one's slices in
 * partials (partial_floats of them: where too few, one slice). */
static void own_run(kn_pool *pool, float *workspace, float *partials, size_t partial_floats,
                    const kn_sgemm_args *x, const kn_conv_flip *flip) {
  const int m = x->m, n = x->n, k = x->k;
  const int transposed = narrow_transposed(x, flip);
  const int narrow = n <= NR_NARROW;
  const int mr = narrow ? narrow_rows(x) : MR, nr = narrow ? NR_NARROW : NR;
  const int by_columns = !transposed && m <= n && (n + nr - 1) / nr >= 2;
  int slices = x->bias || x->relu || flip ? 1 : gemm_slices(m, n, k);
  if (slices > 1 && kn_gemm_partial_floats(m, n, k) > partial_floats)
    slices = 1; /* a shape compile did not plan for */
  gemm_job j = {.x = *x,
                .workspace = workspace,
                .by_columns = by_columns,
                .flip = flip,
                .slices = slices,
                .partials = partials,
                .mr = mr,
                .nr = nr};
  if (transposed) {
    kn_pool_for(pool, slices > 1 ? slices : (m + TR_COLS - 1) / TR_COLS, tr_range, &j);
  } else {
    kn_pool_share(pool, gemm_units(&j), slices > 1 || by_columns ? 1 : GRAIN_BLOCKS, gemm_range,
                  &j);
  }
  if (slices > 1) kn_pool_for(pool, m + 1, add_slices, &j); /* C's rows, the column sums */
}

static void gemm_own(const kn_graph *g, const kn_sgemm_args *x, const kn_conv_flip *flip) {
  own_run(g->pool, g->gemm_workspace, g->gemm_partials, g->gemm_partial_floats, x, flip);
}
#define KN_HAVE_OWN_GEMM 1
#else
static int own_available(void) {
  return 0;
}
#endif

/* The GEMM in use: set by kn_cpu_set_gemm (before graphs run), or picked
 * on first use, when threads running graphs at once may all find it
 * unset; an atomic, as cpu.c's ISA path. */
static _Atomic int active_gemm = KN_GEMM_AUTO;

const char *kn_gemm_name(kn_gemm_kind kind) {
  switch (kind) {
  case KN_GEMM_AUTO: return "auto";
  case KN_GEMM_OPENBLAS: return "openblas";
  case KN_GEMM_KILN: return "kiln-avx512";
  }
  return "?";
}

/* KILN_GEMM=openblas asks for OpenBLAS's everywhere (to compare with a
 * framework that uses it); kiln's own otherwise, where it runs. */
static kn_gemm_kind auto_gemm(void) {
  const char *env = getenv("KILN_GEMM");
  const int blas = env && strcmp(env, "openblas") == 0;
  return own_available() && !blas ? KN_GEMM_KILN : KN_GEMM_OPENBLAS;
}

int kn_cpu_set_gemm(kn_gemm_kind kind, char *err, size_t errlen) {
  if (kind == KN_GEMM_AUTO) {
    atomic_store(&active_gemm, (int)auto_gemm());
    return KN_OK;
  }
  if (kind == KN_GEMM_KILN && !own_available()) {
    snprintf(err, errlen, "cpu: this CPU (or build) has no AVX-512F for kiln's own GEMM");
    return KN_EINVAL;
  }
  if (kind != KN_GEMM_KILN && kind != KN_GEMM_OPENBLAS) {
    snprintf(err, errlen, "cpu: unknown GEMM %d", (int)kind);
    return KN_EINVAL;
  }
  atomic_store(&active_gemm, (int)kind);
  return KN_OK;
}

kn_gemm_kind kn_cpu_gemm(void) {
  int kind = atomic_load(&active_gemm);
  if (kind != KN_GEMM_AUTO) return (kn_gemm_kind)kind;
  /* First use: the automatic choice, unless another thread set one
   * meanwhile (then kind holds that one). */
  const int pick = (int)auto_gemm();
  return atomic_compare_exchange_strong(&active_gemm, &kind, pick) ? (kn_gemm_kind)pick
                                                                   : (kn_gemm_kind)kind;
}

int kn_gemm_wants_workspace(void) {
  return own_available();
}

/* Whether kiln's GEMM runs g's products now: it is the one in use and
 * compile planned its workspace. */
static int own_gemm_ready(const kn_graph *g) {
#ifdef KN_HAVE_OWN_GEMM
  return g->gemm_workspace != NULL && kn_cpu_gemm() == KN_GEMM_KILN;
#else
  (void)g;
  return 0;
#endif
}

/* Element (kk, col) of op(B). */
static float b_at(const kn_sgemm_args *x, int kk, int col) {
  if (x->pool) {
    float v;
    pool_grad_b_row(x->pool, kk, col, 1, &v);
    return v;
  }
  return x->tb ? x->b[(size_t)col * x->ldb + kk] : x->b[(size_t)kk * x->ldb + col];
}

/* op(B)'s rows summed into b_sums, in row order: what kiln's GEMM gives
 * on the way, for a product it did not run. */
static void sum_b_rows(const kn_sgemm_args *x) {
  for (int c = 0; c < x->n; c++) x->b_sums[c] = 0.0f;
  for (int kk = 0; kk < x->k; kk++)
    for (int c = 0; c < x->n; c++) x->b_sums[c] += b_at(x, kk, c);
}

int kn_sgemm_run(kn_graph *g, const kn_sgemm_args *x) {
  if (x->m <= 0 || x->n <= 0) return 1;
#ifdef KN_HAVE_OWN_GEMM
  if (x->k > 0 && own_gemm_ready(g)) {
    gemm_own(g, x, NULL);
    return 1;
  }
#endif
  if (x->b_sums) sum_b_rows(x);
  if (!x->cols && !x->pool) {
    cblas_sgemm(CblasRowMajor, x->ta ? CblasTrans : CblasNoTrans, x->tb ? CblasTrans : CblasNoTrans,
                x->m, x->n, x->k, 1.0f, x->a, x->lda, x->b, x->ldb, x->accumulate ? 1.0f : 0.0f,
                x->c, x->ldc);
    return 0;
  }
  /* The passes that read columns in place or a pool's gradient as B run
   * only with kiln's GEMM; if the GEMM was switched after compile, the
   * same product, plainly. */
  for (int i = 0; i < x->m; i++) {
    for (int col = 0; col < x->n; col++) {
      float sum = 0.0f;
      for (int kk = 0; kk < x->k; kk++) {
        const float av =
            x->cols ? ((const float *)
                           x->cols->x)[x->ta ? cols_at(x->cols, kk, i) : cols_at(x->cols, i, kk)]
            : x->ta ? x->a[(size_t)kk * x->lda + i]
                    : x->a[(size_t)i * x->lda + kk];
        sum += av * b_at(x, kk, col);
      }
      if (x->accumulate) sum += x->c[(size_t)i * x->ldc + col];
      if (x->bias) sum += x->bias[col];
      if (x->relu) sum = KN_RELU(sum);
      x->c[(size_t)i * x->ldc + col] = sum;
    }
  }
  return 1;
}

/* A plain product's arguments. */
static kn_sgemm_args plain(int ta, int tb, int m, int n, int k, const float *a, int lda,
                           const float *b, int ldb, float *c, int ldc) {
  return (kn_sgemm_args){.ta = ta,
                         .tb = tb,
                         .m = m,
                         .n = n,
                         .k = k,
                         .a = a,
                         .lda = lda,
                         .b = b,
                         .ldb = ldb,
                         .c = c,
                         .ldc = ldc};
}

void kn_sgemm(kn_graph *g, int ta, int tb, int m, int n, int k, const float *a, int lda,
              const float *b, int ldb, float *c, int ldc) {
  const kn_sgemm_args x = plain(ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
  kn_sgemm_run(g, &x);
}

void kn_sgemm_serial(float *workspace, int ta, int tb, int m, int n, int k, const float *a, int lda,
                     const float *b, int ldb, float *c, int ldc) {
  if (m <= 0 || n <= 0) return;
#ifdef KN_HAVE_OWN_GEMM
  if (k > 0 && workspace && kn_cpu_gemm() == KN_GEMM_KILN) {
    const kn_sgemm_args x = plain(ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
    own_run(NULL, workspace, NULL, 0, &x, NULL);
    return;
  }
#endif
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}

void kn_sgemm_cols_flip(kn_graph *g, int m, int n, int k, const kn_conv_cols *cols,
                        const kn_conv_flip *b, float *c, int ldc) {
  if (m <= 0 || n <= 0) return;
#ifdef KN_HAVE_OWN_GEMM
  if (k > 0 && own_gemm_ready(g)) {
    const kn_sgemm_args x = {.m = m, .n = n, .k = k, .cols = cols, .c = c, .ldc = ldc};
    gemm_own(g, &x, b);
    return;
  }
#endif
  const float *w = b->w;
  for (int i = 0; i < m; i++) {
    for (int col = 0; col < n; col++) {
      float sum = 0.0f;
      for (int kk = 0; kk < k; kk++)
        sum += ((const float *)cols->x)[cols_at(cols, i, kk)] * w[kn_flip_at(b, kk, col)];
      c[(size_t)i * ldc + col] = sum;
    }
  }
}
