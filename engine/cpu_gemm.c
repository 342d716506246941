/* cpu_gemm.c — kiln's bf16 GEMM: C = op(A) x op(B) (+ C), each operand f32
 * or bf16, every product taken on bf16 values (f32 operands are rounded to
 * bf16, nearest even, while they are packed) and summed in f32; C is f32,
 * or bf16 rounded once its sums (and an optional bias and relu) are
 * complete. Packed panels and a register-blocked micro-kernel after
 * GotoBLAS: depth pairs interleaved so one AVX512-BF16 vdpbf16ps does 32
 * multiply-adds; CPUs without it run the same panels through a C
 * micro-kernel that sums the same products in the same order.
 *
 * With AVX512-BF16, a C at most 16 wide gets 24 x 16 tiles (one vector of
 * B a row) instead of 12 x 32, and a convolution's bf16 columns over an
 * even number of channels are not packed: each row's depth pair is one
 * 32-bit word of the padded input, broadcast from where it lies. Either
 * way the products and their order are those of the packed 12 x 32 tile.
 *
 * Threads: a call cuts C's rows (or columns, when wider than tall) into one
 * contiguous range per pool thread; each thread packs into its own slice of
 * the scratch buffer and writes only its own part of C. Every element of C
 * sums the same products in the same order whatever the thread count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "amx_conv.h"
#include "graph_internal.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>

#include "narrow_avx512.h"
#define KN_HAVE_AVX512BF16 1
#endif

/* Micro-tile MR x NR, depth block KC (even: pairs), and the A and B blocks
 * one thread packs at a time: MC x KC of A (L2), KC x NC of B. With
 * AVX512-BF16, a C at most 16 wide (16 filters, or 16 input channels) gets
 * tiles MR_NARROW x NR_NARROW instead, one vector of B a row, so no half
 * of each tile is zeros. */
enum { MR = 12, NR = 32, KC = 256, MC = 96, NC = 512, MR_NARROW = 24, NR_NARROW = 16 };

/* A convolution's bf16 columns over an even number of channels are read
 * in place, each depth pair one 32-bit word of the padded input, up to
 * this depth (the pair offsets' table lives on the stack). */
enum { GATHER_DEPTH = 4608 };

/* Depth split: a product summed over many more rows than C has elements
 * (a convolution's weight gradient sums over every pixel of the batch),
 * at least SPLIT_MIN deep, with an f32 C and no epilogue, is cut into up
 * to SLICES_MAX slices of the depth (even, at least SLICE_MIN deep),
 * summed apiece and then added in slice order, so that the threads share
 * it whatever C's shape, and each packs only its slices' B. The slices
 * depend on the shape alone: the same bits on any thread count. Slices 1
 * and up sum into PARTIAL_FLOATS floats at the scratch buffer's start. */
enum { SPLIT_MIN = 4096, SLICE_MIN = 512, SLICES_MAX = 16, PARTIAL_FLOATS = 1 << 18 };

/* Depth packed at once: KC, or all of k for a bf16 C (its sums must be
 * complete before they are rounded). */
static int depth_block(int k, kn_dtype c_type) {
  return c_type == KN_BF16 && k > KC ? (k + 1) / 2 * 2 : KC;
}

/* AMX tiles (amx.h): rows of A and columns of B by AMX_MR, a micro-tile's
 * pairs rounded up to whole tile steps of AMX_KT (the rest zeros). */
enum { AMX_MR = 32, AMX_KT = 16 };

/* Pairs a packed panel holds for depth d: d's pairs rounded up to AMX_KT. */
static int panel_pairs(int d) {
  return ((d + 1) / 2 + AMX_KT - 1) / AMX_KT * AMX_KT;
}

/* One thread's A block (MC x depth) and B block (depth x NC) in bf16,
 * pairs rounded up for the tiles. */
static size_t per_thread_bytes(int depth) {
  return (size_t)(MC + NC) * (size_t)panel_pairs(depth) * 4;
}

void *kn_gemm_task_scratch(void *scratch, int task, int k) {
  return (unsigned char *)scratch + (size_t)task * per_thread_bytes(depth_block(k, KN_BF16));
}

size_t kn_gemm_scratch_bytes(int threads, int bf16_out_depth) {
  return PARTIAL_FLOATS * sizeof(float) +
         (size_t)(threads < 1 ? 1 : threads) *
             per_thread_bytes(depth_block(bf16_out_depth, KN_BF16));
}

const char *kn_gemm_kernel_name(kn_gemm_kernel kernel) {
  switch (kernel) {
  case KN_GEMM_SGEMM:
    return kn_cpu_gemm() == KN_GEMM_KILN ? "kiln f32 GEMM, AVX-512F" : "OpenBLAS sgemm (f32)";
  case KN_GEMM_BF16_AVX512:
    return kn_amx_available() ? "kiln bf16 GEMM, AMX-BF16 tiles (AVX512-BF16 beside them)"
                              : "kiln bf16 GEMM, AVX512-BF16 (vdpbf16ps)";
  case KN_GEMM_BF16_PORTABLE: return "kiln bf16 GEMM, portable C (no AVX512-BF16)";
  case KN_GEMM_KERNELS: break;
  }
  return "?";
}

kn_gemm_kernel kn_gemm_bf16_kernel(void) {
#ifdef KN_HAVE_AVX512BF16
  if (kn_cpu_isa() == KN_ISA_AVX512 && kn_cpu_features_get()->avx512bf16)
    return KN_GEMM_BF16_AVX512;
#endif
  return KN_GEMM_BF16_PORTABLE;
}

static inline uint16_t bf16_at(const void *base, int is_f32, size_t off) {
  return is_f32 ? kn_bf16_from_f32(((const float *)base)[off]) : ((const uint16_t *)base)[off];
}

/* Where a packed panel keeps lane l's pair p: pair rows of `width` lanes
 * (kp 0: the micro-kernels' panels), or with kp > 0 lane by lane, kp pairs
 * a lane (the AMX tiles' A, amx.h). */
static inline size_t panel_at(int kp, int width, int p, int l) {
  return kp ? (size_t)l * kp + p : (size_t)p * width + l;
}

/* Zeros where a panel of `width` lanes (kc2 pairs each, or kp in lanes)
 * holds nothing: lanes from `lanes`, and pairs from kc2 to kp. */
static void panel_zeros(uint32_t *dst, int width, int lanes, int kc2, int kp) {
  if (!kp) {
    for (int p = 0; p < kc2 && lanes < width; p++)
      memset(dst + (size_t)p * width + lanes, 0, (size_t)(width - lanes) * sizeof *dst);
    return;
  }
  for (int l = 0; l < lanes && kc2 < kp; l++)
    memset(dst + (size_t)l * kp + kc2, 0, (size_t)(kp - kc2) * sizeof *dst);
  if (lanes < width)
    memset(dst + (size_t)lanes * kp, 0, (size_t)(width - lanes) * kp * sizeof *dst);
}

/* Packs `lanes` lanes (rows of op(A) or columns of op(B)) of depth kc into
 * dst[kc2][width] 32-bit words (or, kp > 0, dst[width][kp]: panel_at),
 * each the bf16 pair (depth 2p, 2p + 1), low half first; missing lanes
 * and the odd depth's partner are zeros. Element (lane l, depth d) is at
 * base[l * ls + d * ks]. Inlined per source type and layout, and walking
 * memory contiguously whichever stride is 1. */
static inline __attribute__((always_inline)) void pack_panel(uint32_t *dst, int width,
                                                             const void *base, int is_f32,
                                                             size_t ls, size_t ks, int lanes,
                                                             int kc, const int kp) {
  const int kc2 = (kc + 1) / 2, pairs = kc / 2;
  if (ks == 1) {
    for (int l = 0; l < lanes; l++) {
      size_t at = (size_t)l * ls;
      for (int p = 0; p < pairs; p++, at += 2)
        dst[panel_at(kp, width, p, l)] =
            bf16_at(base, is_f32, at) | (uint32_t)bf16_at(base, is_f32, at + 1) << 16;
      if (kc & 1) dst[panel_at(kp, width, pairs, l)] = bf16_at(base, is_f32, at);
    }
  } else {
    for (int p = 0; p < kc2; p++) {
      size_t d0 = (size_t)(2 * p) * ks;
      if (2 * p + 1 < kc) {
        for (int l = 0; l < lanes; l++)
          dst[panel_at(kp, width, p, l)] = bf16_at(base, is_f32, d0 + (size_t)l * ls) |
                                           (uint32_t)bf16_at(base, is_f32, d0 + ks + (size_t)l * ls)
                                               << 16;
      } else {
        for (int l = 0; l < lanes; l++)
          dst[panel_at(kp, width, p, l)] = bf16_at(base, is_f32, d0 + (size_t)l * ls);
      }
    }
  }
  panel_zeros(dst, width, lanes, kc2, kp);
}

/* Element (lane, depth) of an operand: lane is a row of op(A) or a column
 * of op(B). */
typedef struct operand_view {
  const void *data;
  int is_f32;
  size_t ls, ks;
  const kn_conv_cols *cols; /* A as a convolution's columns, gathered from cols->x */
  int lane_is_pixel;        /* cols: lanes are its rows (A not transposed) */
  const kn_conv_flip *flip; /* B as a kernel turned 180 degrees: lanes are its columns */
} operand_view;

/* Whether two adjacent bf16 values read as one 32-bit word put the first
 * in the low half, as the panels want. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define LITTLE_ENDIAN_PAIRS 1
#else
#define LITTLE_ENDIAN_PAIRS 0
#endif

/* Offsets of depths d .. d + count - 1 of a convolution's columns from the
 * lane's start: taps and channels when the lanes are pixels, pixels when
 * they are taps; stepped without dividing. */
static void cols_depth_offsets(const operand_view *v, int d, int count, ptrdiff_t *off) {
  const kn_conv_cols *cv = v->cols;
  if (v->lane_is_pixel) {
    const ptrdiff_t base = kn_cols_col(cv, d) - d % cv->c; /* the tap's channel 0 */
    int ch = d % cv->c, q = d / cv->c, kj = q % cv->kw;
    ptrdiff_t tap = base;
    for (int i = 0; i < count; i++) {
      off[i] = tap + ch;
      if (++ch == cv->c) {
        ch = 0;
        if (++kj == cv->kw) {
          kj = 0;
          tap += (ptrdiff_t)cv->dh * cv->wp * cv->c - (ptrdiff_t)(cv->kw - 1) * cv->dw * cv->c;
        } else {
          tap += (ptrdiff_t)cv->dw * cv->c;
        }
      }
    }
  } else {
    const int64_t per = (int64_t)cv->oh * cv->ow;
    int x = (int)(d % per % cv->ow), y = (int)(d % per / cv->ow);
    ptrdiff_t at = kn_cols_row(cv, d);
    for (int i = 0; i < count; i++) {
      off[i] = at;
      if (++x < cv->ow) {
        at += (ptrdiff_t)cv->sw * cv->c;
      } else {
        x = 0;
        if (++y == cv->oh) y = 0;
        at = kn_cols_row(cv, d + i + 1);
      }
    }
  }
}

#ifdef KN_HAVE_AVX512BF16
/* pack_cols lane by lane (kp pairs a lane) for 16 lanes whose bf16 values
 * lie side by side (a tap's channels, when the lanes are taps and the
 * depths pixels): depths c0 + i (i < cn) at x + off[i], each pair of
 * pixels one interleave of two 16-lane loads, turned lane by lane 16
 * pairs at a time. Pairs past cn are zeros up to the next 16. */
__attribute__((target("avx512f"))) static void taps16_rows(uint32_t *dst, int kp, const uint16_t *x,
                                                           const ptrdiff_t *off, int c0, int cn) {
  const int np = (cn + 1) / 2, p0 = c0 / 2;
  for (int g = 0; g < np; g += 16) {
    __m512i r[16];
    for (int q = 0; q < 16; q++) {
      const int i = 2 * (g + q);
      r[q] = _mm512_setzero_si512();
      if (i >= cn) continue;
      const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(x + off[i])));
      const __m512i hi =
          i + 1 < cn ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(x + off[i + 1])))
                     : _mm512_setzero_si512();
      r[q] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)); /* the pair, low depth first */
    }
    kn_transpose16_avx512(r);
    for (int l = 0; l < 16; l++) _mm512_storeu_si512(dst + (size_t)l * kp + p0 + g, r[l]);
  }
}
#endif

/* pack() for a convolution's columns: element (lane, depth) gathered from
 * the padded input, into the same panel layout (kp: panel_at). */
static inline __attribute__((always_inline)) void pack_cols_in(uint32_t *dst, int width,
                                                               const operand_view *v, int lane0,
                                                               int lanes, int d0, int kc,
                                                               const int kp) {
  enum { CHUNK = 512 }; /* even, so pairs never straddle chunks */
  const kn_conv_cols *cv = v->cols;
  const int kc2 = (kc + 1) / 2;
  ptrdiff_t lo[NR], off[CHUNK];
  if (v->lane_is_pixel) {
    kn_pixel_cursor q = kn_pixel_at(cv, lane0);
    for (int l = 0; l < lanes; l++, kn_pixel_next(cv, &q)) lo[l] = kn_pixel_row(cv, &q);
  } else {
    for (int l = 0; l < lanes; l++) lo[l] = kn_cols_col(cv, lane0 + l);
  }
  /* bf16 lanes next to each other in memory (a tap's channels, when the
   * lanes are taps): a pair of depths is two runs of lanes, interleaved. */
  int run = !v->is_f32;
  for (int l = 1; l < lanes && run; l++) run = lo[l] == lo[0] + l;
  const uint16_t *x16 = cv->x;
  /* lane by lane, lanes of taps in runs of 16 go by taps16_rows */
  int runs16 = 0;
#ifdef KN_HAVE_AVX512BF16
  if (kp && !v->lane_is_pixel && !v->is_f32 && LITTLE_ENDIAN_PAIRS)
    for (int l0 = 0; l0 + 16 <= lanes; l0 += 16) {
      int side = 1;
      for (int l = 1; l < 16 && side; l++) side = lo[l0 + l] == lo[l0] + l;
      if (!side) break;
      runs16 = l0 + 16;
    }
#endif
  for (int c0 = 0; c0 < kc; c0 += CHUNK) {
    const int cn = kc - c0 < CHUNK ? kc - c0 : CHUNK;
    cols_depth_offsets(v, d0 + c0, cn, off);
#ifdef KN_HAVE_AVX512BF16
    for (int l0 = 0; l0 < runs16; l0 += 16)
      taps16_rows(dst + (size_t)l0 * kp, kp, x16 + lo[l0], off, c0, cn);
    if (runs16 == lanes) continue;
#endif
    if (run) {
      for (int i = 0; i < cn; i += 2) {
        const uint16_t *restrict a = x16 + lo[0] + off[i];
        const int p = (c0 + i) / 2;
        if (i + 1 < cn) {
          const uint16_t *restrict b = x16 + lo[0] + off[i + 1];
          for (int l = runs16; l < lanes; l++)
            dst[panel_at(kp, width, p, l)] = (uint32_t)a[l] | (uint32_t)b[l] << 16;
        } else {
          for (int l = runs16; l < lanes; l++) dst[panel_at(kp, width, p, l)] = a[l];
        }
      }
      continue;
    }
    /* Runs of depths adjacent in memory (a tap's channels): each pair in
     * them is one 32-bit load. pairs[q] is how many such pairs start at
     * depth 2q. */
    int pairs[CHUNK / 2];
    for (int i = cn - 2 - (cn & 1), run_len = 0; i >= 0; i -= 2) {
      run_len = LITTLE_ENDIAN_PAIRS && !v->is_f32 && off[i + 1] == off[i] + 1 &&
                        (i + 2 >= cn || off[i + 2] == off[i] + 2)
                    ? run_len + 1
                    : (LITTLE_ENDIAN_PAIRS && !v->is_f32 && off[i + 1] == off[i] + 1);
      pairs[i / 2] = run_len;
    }
    for (int l = runs16; l < lanes; l++) {
      for (int i = 0; i < cn;) {
        const int p = (c0 + i) / 2;
        if (i + 1 < cn && pairs[i / 2] > 0) {
          const int r = pairs[i / 2];
          const uint16_t *src = x16 + lo[l] + off[i];
          if (kp) { /* the lane's pairs in a run */
            memcpy(dst + panel_at(kp, width, p, l), src, (size_t)r * sizeof(uint32_t));
          } else {
            for (int q = 0; q < r; q++) {
              uint32_t w;
              memcpy(&w, src + 2 * q, sizeof w); /* an adjacent pair: low half first */
              dst[panel_at(kp, width, p + q, l)] = w;
            }
          }
          i += 2 * r;
          continue;
        }
        uint32_t w = bf16_at(cv->x, v->is_f32, (size_t)(lo[l] + off[i]));
        if (i + 1 < cn)
          w |= (uint32_t)bf16_at(cv->x, v->is_f32, (size_t)(lo[l] + off[i + 1])) << 16;
        dst[panel_at(kp, width, p, l)] = w;
        i += 2;
      }
    }
  }
  panel_zeros(dst, width, lanes, kc2, kp);
}

static void pack_cols(uint32_t *dst, int width, const operand_view *v, int lane0, int lanes, int d0,
                      int kc) {
  pack_cols_in(dst, width, v, lane0, lanes, d0, kc, 0);
}

static void pack_cols_rows(uint32_t *dst, int width, const operand_view *v, int lane0, int lanes,
                           int d0, int kc, int kp) {
  pack_cols_in(dst, width, v, lane0, lanes, d0, kc, kp);
}

/* pack() for a kernel turned 180 degrees (kn_flip_at): depth k, lane c. */
static void pack_flip(uint32_t *dst, int width, const operand_view *v, int lane0, int lanes, int d0,
                      int kc) {
  const int kc2 = (kc + 1) / 2;
  for (int p = 0; p < kc2; p++) {
    const int d = d0 + 2 * p;
    uint32_t *row = dst + (size_t)p * width;
    for (int l = 0; l < lanes; l++) {
      uint32_t w = bf16_at(v->flip->w, v->is_f32, (size_t)kn_flip_at(v->flip, d, lane0 + l));
      if (2 * p + 1 < kc)
        w |= (uint32_t)bf16_at(v->flip->w, v->is_f32, (size_t)kn_flip_at(v->flip, d + 1, lane0 + l))
             << 16;
      row[l] = w;
    }
    if (lanes < width) memset(row + lanes, 0, (size_t)(width - lanes) * sizeof *row);
  }
}

/* The panel of lanes [lane0, lane0 + lanes), depths [d0, d0 + kc): pair
 * rows (kp 0), or lane by lane, kp pairs a lane (an A panel for the AMX
 * tiles). */
static void pack(uint32_t *dst, int width, const operand_view *v, int lane0, int lanes, int d0,
                 int kc, int kp) {
  if (v->cols) {
    if (kp)
      pack_cols_rows(dst, width, v, lane0, lanes, d0, kc, kp);
    else
      pack_cols(dst, width, v, lane0, lanes, d0, kc);
    return;
  }
  if (v->flip) { /* B only: pair rows */
    pack_flip(dst, width, v, lane0, lanes, d0, kc);
    return;
  }
  const size_t start = (size_t)lane0 * v->ls + (size_t)d0 * v->ks;
  const void *base = v->is_f32 ? (const void *)((const float *)v->data + start)
                               : (const void *)((const uint16_t *)v->data + start);
  if (kp && v->is_f32)
    pack_panel(dst, width, base, 1, v->ls, v->ks, lanes, kc, kp);
  else if (kp)
    pack_panel(dst, width, base, 0, v->ls, v->ks, lanes, kc, kp);
  else if (v->is_f32)
    pack_panel(dst, width, base, 1, v->ls, v->ks, lanes, kc, 0);
  else
    pack_panel(dst, width, base, 0, v->ls, v->ks, lanes, kc, 0);
}

static inline float bf16_lo(uint32_t w) {
  uint32_t u = w << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline float bf16_hi(uint32_t w) {
  uint32_t u = w & 0xffff0000u;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Where a micro-kernel writes its tile, and what it does on the way: C is
 * f32 (set, or added to) or bf16 (rounded); on the last depth block the
 * sums may take a bias per column and a relu first. */
typedef struct tile_out {
  void *c; /* the tile's first element */
  size_t ldc;
  int c_bf16, accumulate, relu;
  const float *bias; /* the tile's first column's, or NULL */
  uint16_t *narrow;  /* an f32 C's bf16 copy (the tile's first element), or NULL */
} tile_out;

static void store_tile(float (*acc)[NR], const tile_out *o, int mr, int nr) {
  for (int i = 0; i < mr; i++) {
    float *v = acc[i];
    if (o->accumulate) {
      const float *ci = (const float *)o->c + (size_t)i * o->ldc;
      for (int j = 0; j < nr; j++) v[j] = ci[j] + v[j];
    }
    if (o->bias)
      for (int j = 0; j < nr; j++) v[j] += o->bias[j];
    if (o->relu)
      for (int j = 0; j < nr; j++) v[j] = KN_RELU(v[j]);
    if (o->c_bf16) {
      uint16_t *ci = (uint16_t *)o->c + (size_t)i * o->ldc;
      for (int j = 0; j < nr; j++) ci[j] = kn_bf16_from_f32(v[j]);
    } else {
      memcpy((float *)o->c + (size_t)i * o->ldc, v, (size_t)nr * sizeof(float));
      if (o->narrow)
        for (int j = 0; j < nr; j++) o->narrow[(size_t)i * o->ldc + j] = kn_bf16_from_f32(v[j]);
    }
  }
}

/* C tile (mr x nr of MR x NR) = or += the packed panels' product, over kc2
 * depth pairs. The odd depth of each pair is added first, as vdpbf16ps
 * does; each bf16 x bf16 product is exact in f32. */
#ifdef KN_HAVE_AVX512BF16
/* The same C for the wider vectors the CPU has, chosen at load time. */
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void
micro_portable(int kc2, const uint32_t *a, const uint32_t *b, const tile_out *o, int mr, int nr) {
  float acc[MR][NR];
  memset(acc, 0, sizeof acc);
  for (int p = 0; p < kc2; p++) {
    const uint32_t *ap = a + (size_t)p * MR, *bp = b + (size_t)p * NR;
    float b_lo[NR], b_hi[NR];
    for (int j = 0; j < NR; j++) {
      b_lo[j] = bf16_lo(bp[j]);
      b_hi[j] = bf16_hi(bp[j]);
    }
    for (int i = 0; i < MR; i++) {
      const float a_lo = bf16_lo(ap[i]), a_hi = bf16_hi(ap[i]);
      for (int j = 0; j < NR; j++) {
        acc[i][j] += a_hi * b_hi[j];
        acc[i][j] += a_lo * b_lo[j];
      }
    }
  }
  store_tile(acc, o, mr, nr);
}

#ifdef KN_HAVE_AVX512BF16
/* Rows [0, mr) of a tile's sums (two vectors a row; the second unused
 * where vecs is 1) to C's first nr columns, as tile_out asks. */
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline void
store_rows_avx512(__m512 (*acc)[2], const int vecs, const tile_out *o, int mr, int nr) {
  const __mmask16 m0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1);
  const __mmask16 m1 = vecs == 1  ? (__mmask16)0
                       : nr >= 32 ? (__mmask16)0xffff
                       : nr <= 16 ? (__mmask16)0
                                  : (__mmask16)((1u << (nr - 16)) - 1);
  const __m512 bias0 = o->bias ? _mm512_maskz_loadu_ps(m0, o->bias) : _mm512_setzero_ps();
  const __m512 bias1 = o->bias ? _mm512_maskz_loadu_ps(m1, o->bias + 16) : _mm512_setzero_ps();
  for (int i = 0; i < mr; i++) {
    __m512 v[2] = {acc[i][0], acc[i][1]};
    const __mmask16 mask[2] = {m0, m1};
    if (o->accumulate) {
      const float *ci = (const float *)o->c + (size_t)i * o->ldc;
      v[0] = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, ci), v[0]);
      v[1] = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, ci + 16), v[1]);
    }
    if (o->bias) {
      v[0] = _mm512_add_ps(v[0], bias0);
      v[1] = _mm512_add_ps(v[1], bias1);
    }
    for (int h = 0; h < vecs; h++) {
      /* relu as KN_RELU, as the portable kernel: max(0, v) returns its
       * second operand, v, when either is NaN */
      if (o->relu) v[h] = _mm512_max_ps(_mm512_setzero_ps(), v[h]);
      if (!o->c_bf16)
        _mm512_mask_storeu_ps((float *)o->c + (size_t)i * o->ldc + 16 * h, mask[h], v[h]);
    }
    if (o->c_bf16 || o->narrow) { /* rounded as kn_bf16_from_f32 rounds */
      uint16_t *to = (o->c_bf16 ? (uint16_t *)o->c : o->narrow) + (size_t)i * o->ldc;
      if (vecs == 2)
        _mm512_mask_storeu_epi16(to, (__mmask32)m0 | (__mmask32)m1 << 16,
                                 kn_bf16_pack32_native(v[0], v[1]));
      else
        _mm256_mask_storeu_epi16(to, m0, kn_bf16_pack16_native(v[0]));
    }
  }
}

/* The tile rows_n x 16 * vecs (12 x 32, or 24 x 16) in 24 zmm
 * accumulators: per depth pair, vecs loads of B and one broadcast of each
 * row's pair, from the packed panel (a: rows_n words a pair) or, with
 * gather, in place at rows[i] + poff[p] (a convolution's bf16 columns);
 * rows past mr repeat row 0 and are not stored. The products and their
 * order are the packed 12 x 32 tile's, so the bits are too. */
__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl"), always_inline)) static inline void
bf16_tile(const int rows_n, const int vecs, const int gather, int kc2, const uint32_t *a,
          const uint16_t *const *rows, const ptrdiff_t *poff, const uint32_t *b, const tile_out *o,
          int mr, int nr) {
  __m512 acc[MR_NARROW][2];
  const uint16_t *row[MR_NARROW];
#pragma GCC unroll 24
  for (int i = 0; i < rows_n; i++) {
    acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    row[i] = gather ? rows[i < mr ? i : 0] : NULL;
  }
  for (int p = 0; p < kc2; p++) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + (size_t)p * 16 * vecs);
    const __m512bh b1 = vecs == 2 ? (__m512bh)_mm512_loadu_si512(b + (size_t)p * 32 + 16) : b0;
    const uint32_t *ap = a + (size_t)p * rows_n;
#pragma GCC unroll 24
    for (int i = 0; i < rows_n; i++) {
      uint32_t w;
      if (gather)
        memcpy(&w, row[i] + poff[p], sizeof w); /* the pair, low depth first */
      else
        w = ap[i];
      const __m512bh ai = (__m512bh)_mm512_set1_epi32((int)w);
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
      if (vecs == 2) acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
    }
  }
  store_rows_avx512(acc, vecs, o, mr, nr);
}

__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl"))) static void
micro_avx512bf16(int kc2, const uint32_t *a, const uint32_t *b, const tile_out *o, int mr, int nr) {
  bf16_tile(MR, 2, 0, kc2, a, NULL, NULL, b, o, mr, nr);
}

__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl"))) static void
micro_avx512bf16_narrow(int kc2, const uint32_t *a, const uint32_t *b, const tile_out *o, int mr,
                        int nr) {
  bf16_tile(MR_NARROW, 1, 0, kc2, a, NULL, NULL, b, o, mr, nr);
}

/* An AMX tile block's sums (AMX_MR rows of NR floats, as kn_amx_gemm
 * stored them) to C, mr x nr of them. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
amx_store(__m512 (*sums)[2], const tile_out *o, int mr, int nr) {
  if (nr > 16)
    store_rows_avx512(sums, 2, o, mr, nr);
  else
    store_rows_avx512(sums, 1, o, mr, nr);
}

/* The in-place tiles: 12 x 32, or 24 x 16 for a narrow C. */
__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl"))) static void
gather_avx512bf16(int narrow, int kc2, const uint16_t *const *rows, const ptrdiff_t *poff,
                  const uint32_t *b, const tile_out *o, int mr, int nr) {
  if (narrow)
    bf16_tile(MR_NARROW, 1, 1, kc2, NULL, rows, poff, b, o, mr, nr);
  else
    bf16_tile(MR, 2, 1, kc2, NULL, rows, poff, b, o, mr, nr);
}
#endif

typedef void (*micro_fn)(int kc2, const uint32_t *a, const uint32_t *b, const tile_out *o, int mr,
                         int nr);

typedef struct gemm_job {
  int m, n, k, threads, split_rows, accumulate, depth, c_bf16, relu;
  int mr, nr; /* the tile: MR x NR, or MR_NARROW x NR_NARROW */
  int gather; /* A is a convolution's bf16 columns read in place (gather_avx512bf16) */
  int amx;    /* the products on AMX tiles (amx.h) */
  const float *bias;
  operand_view a, b; /* a: lanes are rows of op(A); b: lanes are columns of op(B) */
  void *c;
  uint16_t *narrow; /* f32 C's bf16 copy, or NULL */
  size_t ldc;
  unsigned char *scratch; /* the partial sums, then each thread's packing buffers */
  micro_fn micro;
  int slices; /* the depth split (1: none) */
} gemm_job;

/* What one call of gemm_block sums: depths [k_lo, k_hi) into c (ldc
 * apart), added to c's values with accumulate. */
typedef struct gemm_part {
  void *c;
  size_t ldc;
  int k_lo, k_hi, accumulate;
} gemm_part;

/* C[r0, r1) x [c0, c1) of the part on one thread's packing buffers. */
static void gemm_block(const gemm_job *j, const gemm_part *pt, int r0, int r1, int c0, int c1,
                       uint32_t *pa, uint32_t *pb) {
  const int MRJ = j->mr, NRJ = j->nr;
  ptrdiff_t off[GATHER_DEPTH], poff[GATHER_DEPTH / 2];
  for (int jc = c0; jc < c1; jc += NC) {
    const int nc = c1 - jc < NC ? c1 - jc : NC;
    for (int pc = pt->k_lo; pc < pt->k_hi; pc += j->depth) {
      const int kc = pt->k_hi - pc < j->depth ? pt->k_hi - pc : j->depth, kc2 = (kc + 1) / 2;
      const int acc = pt->accumulate || pc > pt->k_lo, last = pc + kc >= pt->k_hi;
      /* a panel's pair rows: kc2, or for the tiles whole tile steps */
      const int kp = j->amx ? panel_pairs(kc) : kc2;
      for (int jr = 0; jr < nc; jr += NRJ) {
        uint32_t *panel = pb + (size_t)(jr / NRJ) * kp * NRJ;
        pack(panel, NRJ, &j->b, jc + jr, nc - jr < NRJ ? nc - jr : NRJ, pc, kc, 0);
        memset(panel + (size_t)kc2 * NRJ, 0, (size_t)(kp - kc2) * NRJ * sizeof *panel);
      }
      if (j->gather) { /* each pair's place from its pixel's first element */
        cols_depth_offsets(&j->a, pc, kc, off);
        for (int p = 0; p < kc2; p++) poff[p] = off[2 * p];
      }
      for (int ic = r0; ic < r1; ic += MC) {
        const int mc = r1 - ic < MC ? r1 - ic : MC;
        const uint16_t *rows[MC];
        if (j->gather) {
          const uint16_t *x16 = j->a.cols->x;
          kn_pixel_cursor q = kn_pixel_at(j->a.cols, ic);
          for (int i = 0; i < mc; i++, kn_pixel_next(j->a.cols, &q))
            rows[i] = x16 + kn_pixel_row(j->a.cols, &q);
        } else {
          for (int ir = 0; ir < mc; ir += MRJ) /* for the tiles, at kp pairs a lane */
            pack(pa + (size_t)(ir / MRJ) * (j->amx ? kp : kc2) * MRJ, MRJ, &j->a, ic + ir,
                 mc - ir < MRJ ? mc - ir : MRJ, pc, kc, j->amx ? kp : 0);
        }
        for (int jr = 0; jr < nc; jr += NRJ) {
          const int nr = nc - jr < NRJ ? nc - jr : NRJ;
          for (int ir = 0; ir < mc; ir += MRJ) {
            const size_t at = (size_t)(ic + ir) * pt->ldc + jc + jr;
            const tile_out o = {.c = j->c_bf16 ? (void *)((uint16_t *)pt->c + at)
                                               : (void *)((float *)pt->c + at),
                                .ldc = pt->ldc,
                                .c_bf16 = j->c_bf16,
                                .accumulate = acc,
                                .relu = last && j->relu,
                                .bias = last && j->bias ? j->bias + jc + jr : NULL,
                                .narrow = last && j->narrow ? j->narrow + at : NULL};
            const uint32_t *bt = pb + (size_t)(jr / NRJ) * kp * NRJ;
            const int mr = mc - ir < MRJ ? mc - ir : MRJ;
#ifdef KN_HAVE_AVX512BF16
            if (j->amx) {
              __m512 sums[AMX_MR][2];
              const uint32_t *rows_a = pa + (size_t)(ir / MRJ) * MRJ * kp;
              kn_amx_gemm(AMX_MR, NRJ, kp, AMX_KT, 16, (const uint16_t *)(const void *)rows_a,
                          (ptrdiff_t)2 * kp, bt, NRJ, (float *)(void *)sums, NR, 0);
              amx_store(sums, &o, mr, nr);
              continue;
            }
            if (j->gather) {
              gather_avx512bf16(NRJ == NR_NARROW, kc2, rows + ir, poff, bt, &o, mr, nr);
              continue;
            }
#endif
            j->micro(kc2, pa + (size_t)(ir / MRJ) * kc2 * MRJ, bt, &o, mr, nr);
          }
        }
      }
    }
  }
}

/* The slices a product of this shape is summed in (1: not split). */
static int gemm_slices(int m, int n, int k, int f32_c, int epilogue) {
  if (!f32_c || epilogue || k < SPLIT_MIN || (int64_t)k < (int64_t)m * n) return 1;
  int64_t s = k / SLICE_MIN, room = PARTIAL_FLOATS / ((int64_t)m * n) + 1;
  if (s > SLICES_MAX) s = SLICES_MAX;
  if (s > room) s = room;
  return s < 2 ? 1 : (int)s;
}

/* Depth slice s: slice 0 into C (added to it with accumulate), the
 * others into their partial sums; bounds even, so no pair is cut. */
static gemm_part slice_part(const gemm_job *j, int s) {
  const int lo = (int)((int64_t)j->k * s / j->slices) & ~1;
  const int hi = s + 1 == j->slices ? j->k : (int)((int64_t)j->k * (s + 1) / j->slices) & ~1;
  if (s == 0) return (gemm_part){j->c, j->ldc, lo, hi, j->accumulate};
  float *partial = (float *)(void *)j->scratch + (size_t)(s - 1) * j->m * j->n;
  return (gemm_part){partial, (size_t)j->n, lo, hi, 0};
}

/* Thread t's packing buffers. */
static uint32_t *thread_buffers(const gemm_job *j, int64_t t) {
  return (uint32_t *)(j->scratch + PARTIAL_FLOATS * sizeof(float) +
                      (size_t)t * per_thread_bytes(j->depth));
}

/* The fewest row tiles the pool hands a thread at a time (kn_gemm_run):
 * each range packs B again. */
#define GRAIN_TILES 8

/* The units the pool hands out (kn_pool_share): depth slices of a split
 * product, else micro-tiles of the split dimension. */
static int64_t gemm_units(const gemm_job *j) {
  if (j->slices > 1) return j->slices;
  const int tile = j->split_rows ? j->mr : j->nr, extent = j->split_rows ? j->m : j->n;
  return (extent + tile - 1) / tile;
}

/* Units [u0, u1) on slot's packing buffers. */
static void gemm_range(void *ctx, int slot, int64_t u0, int64_t u1) {
  const gemm_job *j = ctx;
  if (j->amx) kn_amx_configure(AMX_KT, 16);
  uint32_t *pa = thread_buffers(j, slot), *pb = pa + (size_t)MC * panel_pairs(j->depth);
  if (j->slices > 1) {
    for (int64_t s = u0; s < u1; s++) {
      const gemm_part pt = slice_part(j, (int)s);
      gemm_block(j, &pt, 0, j->m, 0, j->n, pa, pb);
    }
  } else {
    const gemm_part whole = {j->c, j->ldc, 0, j->k, j->accumulate};
    const int tile = j->split_rows ? j->mr : j->nr, extent = j->split_rows ? j->m : j->n;
    const int lo = (int)u0 * tile, hi = (int)u1 * tile < extent ? (int)u1 * tile : extent;
    if (j->split_rows)
      gemm_block(j, &whole, lo, hi, 0, j->n, pa, pb);
    else
      gemm_block(j, &whole, 0, j->m, lo, hi, pa, pb);
  }
  if (j->amx) kn_amx_release();
}

/* C's rows [r0, r1) plus each slice's partial sums, in slice order. */
static void add_slices(void *ctx, int64_t r0, int64_t r1) {
  const gemm_job *j = ctx;
  for (int64_t r = r0; r < r1; r++) {
    float *c = (float *)j->c + (size_t)r * j->ldc;
    for (int s = 1; s < j->slices; s++) {
      const float *p = (const float *)(void *)j->scratch + ((size_t)(s - 1) * j->m + r) * j->n;
      for (int q = 0; q < j->n; q++) c[q] += p[q];
    }
  }
}

#ifdef KN_HAVE_AVX512BF16
/* ---- a stride-1 convolution on the tiles, its columns read in place ----
 *
 * With AMX, a product whose A is a stride-1 convolution's columns over a
 * padded bf16 input needs no im2col and no packing of A (amx_conv.h): B is
 * packed once, and bands of output rows run on the threads. */
typedef struct amx_conv_job {
  kn_amx_conv cv;
  const kn_conv_cols *v;
  int band; /* output rows a task */
  int64_t bands;
  size_t extent;          /* the input's values */
  tile_out o;             /* C's place and epilogue at row 0, column 0 */
  unsigned char *scratch; /* the last task's spare copy */
} amx_conv_job;

static int amx_conv_fits(int m, int n, int k, const kn_gemm_operand *a, const kn_gemm_operand *b,
                         kn_dtype c_type) {
  const kn_conv_cols *v = a->cols;
  if (!v || a->trans || a->dtype != KN_BF16 || b->pool || v->sh != 1 || v->sw != 1 || v->dw != 1 ||
      v->c < 8 || k % (v->kw * v->c) || m % (v->oh * v->ow) ||
      !kn_amx_conv_shape_fits(v->c, k / (v->kw * v->c), v->kw, n))
    return 0;
  kn_amx_conv cv;
  kn_amx_conv_setup(&cv, v->c, k / (v->kw * v->c), v->kw, v->dh, v->wp, v->ow, n);
  /* B's panels in the partial sums' space (unused here), a task's spare
   * copy in its thread's packing buffers */
  return kn_amx_conv_panel_words(&cv) <= PARTIAL_FLOATS &&
         (size_t)kn_amx_conv_reach(&cv) * sizeof(uint16_t) <=
             per_thread_bytes(depth_block(k, c_type)) &&
         kn_amx_available();
}

int kn_gemm_conv_in_place(int m, int n, int k, const kn_gemm_operand *a, const kn_gemm_operand *b,
                          kn_dtype c_type) {
  return kn_gemm_bf16_kernel() == KN_GEMM_BF16_AVX512 && amx_conv_fits(m, n, k, a, b, c_type);
}

/* A run of output pixels' sums to C, with the product's epilogue. */
static void amx_conv_store(void *ctx, const float *sums, int rows, int64_t pixel, int c0,
                           int lanes) {
  const amx_conv_job *j = ctx;
  tile_out o = j->o;
  const size_t at = (size_t)pixel * o.ldc + c0;
  o.c = o.c_bf16 ? (void *)((uint16_t *)o.c + at) : (void *)((float *)o.c + at);
  if (o.bias) o.bias += c0;
  if (o.narrow) o.narrow += at;
  amx_store((__m512(*)[2])(void *)sums, &o, rows, lanes);
}

static void amx_conv_range(void *ctx, int64_t t0, int64_t t1) {
  const amx_conv_job *j = ctx;
  const kn_conv_cols *v = j->v;
  kn_amx_configure(j->cv.kt, 16);
  for (int64_t t = t0; t < t1; t++) {
    const int64_t img = t / j->bands, y0 = t % j->bands * j->band;
    const int rows = v->oh - y0 < j->band ? (int)(v->oh - y0) : j->band;
    const size_t first = ((size_t)img * v->hp + (size_t)y0) * v->wp * v->c;
    uint16_t *spare = (uint16_t *)(void *)j->scratch; /* only the last task reads it */
    kn_amx_conv_rows(&j->cv, (const uint16_t *)v->x + first, rows, (img * v->oh + y0) * v->ow,
                     j->extent - first, spare, amx_conv_store, (void *)j);
  }
  kn_amx_release();
}

static void amx_conv_run(kn_pool *pool, void *scratch, int m, int n, int k,
                         const kn_gemm_operand *a, const kn_gemm_operand *b, void *c,
                         kn_dtype c_type, int ldc, int accumulate, const float *bias, int relu,
                         uint16_t *narrow) {
  const kn_conv_cols *v = a->cols;
  amx_conv_job j = {.v = v,
                    .o = {.c = c,
                          .ldc = (size_t)ldc,
                          .c_bf16 = c_type == KN_BF16,
                          .accumulate = accumulate && c_type == KN_F32,
                          .relu = relu,
                          .bias = bias,
                          .narrow = c_type == KN_F32 ? narrow : NULL}};
  kn_amx_conv_setup(&j.cv, v->c, k / (v->kw * v->c), v->kw, v->dh, v->wp, v->ow, n);
  const int64_t images = m / ((int64_t)v->oh * v->ow);
  j.band = v->wp >= 256 ? 1 : 256 / v->wp; /* about 256 pixels a task */
  j.bands = (v->oh + j.band - 1) / j.band;
  j.extent = (size_t)images * v->hp * v->wp * v->c;
  uint32_t *panels = scratch;
  const operand_view bv = {b->data,
                           b->dtype == KN_F32,
                           b->trans ? (size_t)b->ld : 1,
                           b->trans ? 1 : (size_t)b->ld,
                           NULL,
                           0,
                           b->flip};
  for (int g = 0; g < j.cv.groups; g++) {
    const int c0 = g * j.cv.width, lanes = n - c0 < j.cv.width ? n - c0 : j.cv.width;
    pack(panels + (size_t)g * (k / 2) * j.cv.width, j.cv.width, &bv, c0, lanes, 0, k, 0);
  }
  j.cv.b = panels;
  j.scratch = (unsigned char *)scratch + PARTIAL_FLOATS * sizeof(float);
  kn_pool_for(pool, images * j.bands, amx_conv_range, &j);
}

#else
int kn_gemm_conv_in_place(int m, int n, int k, const kn_gemm_operand *a, const kn_gemm_operand *b,
                          kn_dtype c_type) {
  (void)m, (void)n, (void)k, (void)a, (void)b, (void)c_type;
  return 0;
}
#endif

/* A weight gradient reading a pool's gradient as B where small_wgrad does
 * not run (another CPU than the one the graph was compiled for): C = A^T B
 * and B's column sums by the definition, a pixel at a time in pixel order.
 * The passes hand such products to small_wgrad; this keeps them correct
 * anywhere. */
static void pool_wgrad_by_definition(int m, int n, int k, const kn_gemm_operand *a,
                                     const kn_gemm_operand *b, float *c, int ldc) {
  const kn_pool_grad_b *v = b->pool;
  for (int t = 0; t < m; t++)
    for (int f = 0; f < n; f++) c[(size_t)t * ldc + f] = 0.0f;
  if (b->sums)
    for (int f = 0; f < n; f++) b->sums[f] = 0.0f;
  kn_pixel_cursor q = kn_pixel_at(a->cols, 0);
  for (int64_t p = 0; p < k; p++, kn_pixel_next(a->cols, &q)) {
    int cell;
    const ptrdiff_t o = kn_pool_grad_at(v, q.b, q.y, q.x, &cell);
    if (o < 0) continue;
    const ptrdiff_t at = kn_pixel_row(a->cols, &q);
    for (int f = 0; f < n; f++) {
      if (v->argmax[o + f] != cell) continue;
      const float g = v->dy16 ? kn_bf16_to_f32(v->dy16[o + f]) : v->dy[o + f];
      if (b->sums) b->sums[f] += g;
      for (int t = 0; t < m; t++) {
        const float x = kn_cols_value(a->cols, a->dtype == KN_F32, at + kn_cols_col(a->cols, t));
        c[(size_t)t * ldc + f] += x * g;
      }
    }
  }
}

kn_gemm_kernel kn_gemm_run(kn_pool *pool, void *scratch, int m, int n, int k, kn_gemm_operand a,
                           kn_gemm_operand b, void *c, kn_dtype c_type, int ldc, int accumulate,
                           const float *bias, int relu, uint16_t *narrow) {
  const kn_gemm_kernel kernel = kn_gemm_bf16_kernel();
#ifdef KN_HAVE_AVX512BF16
  if (kernel == KN_GEMM_BF16_AVX512 && m > 0 && kn_small_conv_fits(n, k, &a, &b, accumulate)) {
    kn_small_conv_run(pool, m, n, k, &a, &b, c, c_type, ldc, bias, relu, narrow);
    return kernel;
  }
  if (kernel == KN_GEMM_BF16_AVX512 && amx_conv_fits(m, n, k, &a, &b, c_type)) {
    amx_conv_run(pool, scratch, m, n, k, &a, &b, c, c_type, ldc, accumulate, bias, relu, narrow);
    return kernel;
  }
  if (kernel == KN_GEMM_BF16_AVX512 && !bias && !relu && !narrow &&
      kn_small_wgrad_fits(m, n, k, &a, &b, accumulate, c_type)) {
    kn_small_wgrad_run(pool, scratch, m, n, k, &a, &b, c, ldc);
    return kernel;
  }
#endif
  if (b.pool) {
    pool_wgrad_by_definition(m, n, k, &a, &b, (float *)c, ldc);
    return KN_GEMM_BF16_PORTABLE;
  }
  gemm_job j = {.m = m,
                .n = n,
                .k = k,
                .threads = kn_pool_threads(pool),
                .split_rows = m >= n,
                .accumulate = accumulate && c_type == KN_F32,
                .depth = depth_block(k, c_type),
                .c_bf16 = c_type == KN_BF16,
                .relu = relu,
                .bias = bias,
                .a = {a.data, a.dtype == KN_F32, a.trans ? 1 : (size_t)a.ld,
                      a.trans ? (size_t)a.ld : 1, a.cols, !a.trans, NULL},
                .b = {b.data, b.dtype == KN_F32, b.trans ? (size_t)b.ld : 1,
                      b.trans ? 1 : (size_t)b.ld, NULL, 0, b.flip},
                .c = c,
                .narrow = c_type == KN_F32 ? narrow : NULL,
                .ldc = (size_t)ldc,
                .scratch = scratch,
                .micro = micro_portable,
                .mr = MR,
                .nr = NR};
#ifdef KN_HAVE_AVX512BF16
  if (kernel == KN_GEMM_BF16_AVX512) {
    j.micro = micro_avx512bf16;
    if (n <= NR_NARROW) {
      j.micro = micro_avx512bf16_narrow;
      j.mr = MR_NARROW;
      j.nr = NR_NARROW;
    }
    /* pairs of depths that lie side by side: an even channel count, so a
     * pair never leaves its tap, and an even depth in every block */
    j.gather = a.cols && !a.trans && a.dtype == KN_BF16 && a.cols->c % 2 == 0 && k % 2 == 0 &&
               j.depth <= GATHER_DEPTH;
    if (kn_amx_available()) { /* packed panels on the tiles */
      j.amx = 1;
      j.gather = 0;
      j.mr = AMX_MR;
      j.nr = n <= 16 ? 16 : NR;
    }
  }
#endif
  /* Below a few micro-tiles of work a second thread costs more than it
   * saves. */
  if ((int64_t)m * n * k < (int64_t)64 * 64 * 64) j.threads = 1;
  j.slices = gemm_slices(m, n, k, c_type == KN_F32, bias || relu || j.narrow);
  kn_pool_share(j.threads > 1 ? pool : NULL, gemm_units(&j),
                j.slices == 1 && j.split_rows ? GRAIN_TILES : 1, gemm_range, &j);
  if (j.slices > 1) kn_pool_for(j.threads > 1 ? pool : NULL, m, add_slices, &j);
  return kernel;
}

struct kn_gemm {
  kn_pool *pool;
  void *scratch;
};

kn_gemm *kn_gemm_new(int threads) {
  kn_gemm *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return NULL;
  ctx->pool = kn_pool_new(threads);
  size_t bytes = kn_gemm_scratch_bytes(kn_pool_threads(ctx->pool), 0);
  ctx->scratch = aligned_alloc(64, bytes);
  if (!ctx->scratch || (threads > 1 && !ctx->pool)) {
    kn_gemm_free(ctx);
    return NULL;
  }
  memset(ctx->scratch, 0, bytes);
  return ctx;
}

void kn_gemm_free(kn_gemm *ctx) {
  if (!ctx) return;
  kn_pool_free(ctx->pool);
  free(ctx->scratch);
  free(ctx);
}

int kn_gemm_bf16(kn_gemm *ctx, int m, int n, int k, const void *a, kn_dtype a_type, int lda,
                 int trans_a, const void *b, kn_dtype b_type, int ldb, int trans_b, float *c,
                 int ldc, int accumulate, char *err, size_t errlen) {
  if (m < 1 || n < 1 || k < 1) {
    snprintf(err, errlen, "gemm_bf16: m, n and k must be >= 1, got %d, %d and %d", m, n, k);
    return KN_EINVAL;
  }
  if ((a_type != KN_F32 && a_type != KN_BF16) || (b_type != KN_F32 && b_type != KN_BF16)) {
    snprintf(err, errlen, "gemm_bf16: operands must be f32 or bf16, got %s and %s",
             kn_dtype_name(a_type), kn_dtype_name(b_type));
    return KN_EINVAL;
  }
  if (lda < (trans_a ? m : k) || ldb < (trans_b ? k : n) || ldc < n) {
    snprintf(err, errlen,
             "gemm_bf16: leading dimensions %d, %d, %d are shorter than the rows they hold", lda,
             ldb, ldc);
    return KN_EINVAL;
  }
  kn_gemm_run(ctx->pool, ctx->scratch, m, n, k,
              (kn_gemm_operand){a, a_type, lda, trans_a != 0, NULL, NULL, NULL, NULL},
              (kn_gemm_operand){b, b_type, ldb, trans_b != 0, NULL, NULL, NULL, NULL}, c, KN_F32,
              ldc, accumulate, NULL, 0, NULL);
  return KN_OK;
}
