/* winograd.c — 3x3 and 5x5, stride-1 convolutions by Winograd's minimal
 * filtering algorithms F(4x4, 3x3) and F(2x2, 5x5) (Lavin and Gray, "Fast
 * Algorithms for Convolutional Neural Networks", 2016), on CPUs with
 * AVX-512F.
 *
 * A convolution's output is cut into m x m tiles (m = 4 for a 3x3 kernel,
 * 2 for a 5x5 one); each reads a 6x6 patch of the zero-padded input. With
 * the input patch d, the kernel g (r x r) and the constant matrices B
 * (6x6), G (6 x r) and A (6 x m),
 *
 *     y = A^T [ (G g G^T) . (B^T d B) ] A          (. : elementwise)
 *
 * so a tile's m x m outputs take 36 products per input channel and filter
 * instead of m^2 r^2 (144 for 3x3 kernels, 100 for 5x5): summed over the
 * input channels, each of the 36 positions is a GEMM of (tiles x C_in) by
 * (C_in x C_out). Both evaluate at the points 0, 1, -1, 2, -2 and
 * infinity, so B is the same matrix for both and only G and A differ. The
 * transforms are adds and a few small multiplies, linear in the channels,
 * so a layer of 16 or more channels does about a quarter (3x3) or 36% (5x5)
 * of the direct product's multiplies, and the transforms' adds beside
 * them. The input is read as stored, the padding added as zeros where a
 * patch leaves it.
 *
 * The three products of a training step take the same form:
 *   - forward: y from the padded input and the kernel (bias and relu
 *     applied as each output is stored);
 *   - input gradient: the padded dy correlated with the kernel turned 180
 *     degrees, its input and output channels swapped (the same routine);
 *   - weight gradient: for each position, dU = sum over tiles of
 *     (B^T d B) (A dy A^T)^T, then dg = G^T dU G; the bias gradient (dy's
 *     column sums) comes on the way when a pass paired one with it.
 *
 * Work is cut into blocks of tiles sized so that a block's transformed
 * input and products stay in the L2 cache: transform a block, run its 36
 * GEMMs, transform back, next block. Forward products give each block to
 * one thread, so every output is summed by one thread in one order. The
 * weight gradient sums its tiles in slices fixed by the shape, each
 * summed by one thread, then added in slice order. Wide products (a
 * transformed kernel or a gradient's sums of many MiB) go by large chunks
 * of tiles instead, each position's GEMM over a chunk on kiln's GEMM,
 * whose sums' order is fixed by the shape. Results are the same
 * bits for any thread count. Nothing is allocated here: the transformed
 * kernel, each thread's block and the slices' sums lie in the graph's
 * Winograd buffer, sized at compile (kn_winograd_floats). */
#include <immintrin.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "amx_conv.h"
#include "graph_internal.h"
#include "narrow_avx512.h"

#define T_IN   6  /* inputs per tile side: m + r - 1 */
#define M_MAX  4  /* outputs per tile side, at most (a 3x3 kernel's) */
#define R_MAX  5  /* a kernel's side, at most */
#define NPOS   36 /* T_IN x T_IN */
#define VL     16 /* floats per vector */
#define ROWS_Q 24 /* a block's rows are a multiple of every row group below */
/* a block's transformed input and products: about half of a 1 MiB L2 */
#define BLOCK_BYTES (512 * 1024)
/* the weight gradient's slices of tiles: at most SLICES_MAX, at least
 * SLICE_TILES tiles each, their sums at most PARTIAL_MAX floats */
#define SLICES_MAX  16
#define SLICE_TILES 96
#define PARTIAL_MAX (2 << 20)
/* A wide product goes by chunks of tiles whose transformed input and
 * products take up to CHUNK_BYTES, each position's GEMM over the whole
 * chunk on kiln's GEMM (blocked for the caches, on all threads). A
 * forward product is wide when its transformed kernel passes
 * WIDE_FORWARD_BYTES: by blocks of tiles, the kernel would be read from
 * memory for every block (a 512-channel one is 36 MiB). A weight
 * gradient is wide past WIDE_WGRAD_BYTES of sums: by blocks, its slices'
 * sums (as large) would leave too few slices for the threads. The
 * chunk's transforms are shared by the threads in PARTS parts fixed by
 * the shape. */
/* A weight gradient's blocks on AMX tiles: about half of a 2 MiB L2
 * (Intel's with AMX), in bf16 pairs; a multiple of 96 tiles (whole tile
 * steps of 32 tiles, and of ROWS_Q) */
#define AMX_WGRAD_BYTES    (1 << 20)
#define AMX_WGRAD_Q        96
#define WIDE_FORWARD_BYTES (16 << 20)
#define WIDE_WGRAD_BYTES   (4 << 20)
#define CHUNK_BYTES        (16 << 20)
/* kn_winograd_set_limits's (tests reach the chunks with small shapes), or
 * 0: the defaults above */
static _Atomic size_t limits[3];
#define PARTS 64

typedef float v16 __attribute__((vector_size(64)));

static int round_up(int v, int q) {
  return (v + q - 1) / q * q;
}

/* The shape of one Winograd product. */
typedef struct wino_shape {
  int r, m;               /* the kernel's side (3 or 5), a tile's outputs a side (4 or 2) */
  int batch, hp, wp, cin; /* the input as stored, (batch, hp, wp, cin) */
  int pt, pl;             /* zero rows above it and columns left of it */
  int x_bf16;             /* the input: 0 f32, 1 bf16 (mixed_bfloat16), 2 f32 rounded to bf16
                           * as it is read (a bf16 padded copy the product reads in place) */
  int yh, yw;             /* the output's rows and columns, (batch, yh, yw, cout) */
  /* A dilated product (d > 1) runs as d x d undilated ones, one a phase:
   * the outputs (py + d i, px + d j), which read the inputs d apart. */
  int d, py, px;
  int oh, ow, cout; /* the phase's outputs: (batch, oh, ow, cout); undilated, all */
  int th, tw;       /* tiles down and across an image */
  int64_t tiles;    /* batch x th x tw */
  int cp, fp;       /* cin and cout rounded up to whole vectors */
  int tb;           /* tiles in a block (a multiple of ROWS_Q), or a wide chunk */
  int slices;       /* weight gradient: slices of tiles */
  int wide;         /* by chunks (WIDE_FORWARD_BYTES, WIDE_WGRAD_BYTES) */
  int bf16;         /* the 36 GEMMs on bf16 operands (kn_wino_io.bf16_products; by blocks) */
} wino_shape;

/* A tile's outputs a side for an r x r kernel: 6 - r + 1. */
static int tile_side(int r) {
  return T_IN - r + 1;
}

/* Outputs of phase p (< d) of n: p, p + d, ... */
static int phase_size(int n, int d, int p) {
  return n > p ? (n - p + d - 1) / d : 0;
}

/* The shape of phase (py, px) of a product of dilation d whose output is
 * (batch, oh, ow, cout); phase (0, 0), the largest, sizes the buffers. */
static wino_shape shape_of(int r, int d, int py, int px, int batch, int hp, int wp, int cin, int oh,
                           int ow, int cout, int weight_grad, int amx) {
  if (d < 1) d = 1;
  wino_shape s = {.r = r,
                  .m = tile_side(r),
                  .batch = batch,
                  .hp = hp,
                  .wp = wp,
                  .cin = cin,
                  .yh = oh,
                  .yw = ow,
                  .d = d,
                  .py = py,
                  .px = px,
                  .oh = phase_size(oh, d, py),
                  .ow = phase_size(ow, d, px),
                  .cout = cout};
  s.pt = s.pl = 0;
  s.th = (s.oh + s.m - 1) / s.m;
  s.tw = (s.ow + s.m - 1) / s.m;
  s.tiles = (int64_t)batch * s.th * s.tw;
  s.cp = round_up(cin, VL);
  s.fp = round_up(cout, VL);
  /* A forward product's block stays near the L1 cache (its GEMMs are as
   * shallow as the input channels); a weight gradient's GEMMs are as deep
   * as the block's tiles, so it takes blocks up to the L2 budget. */
  int tb = BLOCK_BYTES / (NPOS * (int)sizeof(float) * (s.cp + s.fp)) / ROWS_Q * ROWS_Q;
  s.tb = !weight_grad || tb < ROWS_Q ? ROWS_Q : tb > 4 * ROWS_Q ? 4 * ROWS_Q : tb;
  if (weight_grad && amx) {
    /* On AMX tiles a block's GEMMs take little time beside reading and
     * writing each position's sums (cp x fp) once a block: blocks of
     * AMX_WGRAD_BYTES of bf16 values, whole steps of the tiles' 16 pairs. */
    tb = AMX_WGRAD_BYTES / (NPOS * 2 * (s.cp + s.fp)) / AMX_WGRAD_Q * AMX_WGRAD_Q;
    s.tb = tb < AMX_WGRAD_Q ? AMX_WGRAD_Q : tb > 4 * AMX_WGRAD_Q ? 4 * AMX_WGRAD_Q : tb;
  }
  const size_t per = (size_t)NPOS * s.cp * s.fp + (size_t)s.fp;
  int64_t sl = s.tiles / SLICE_TILES;
  if (sl > SLICES_MAX) sl = SLICES_MAX;
  if (sl > (int64_t)(PARTIAL_MAX / per)) sl = (int64_t)(PARTIAL_MAX / per);
  s.slices = sl < 1 ? 1 : (int)sl;
  const size_t forward = atomic_load(&limits[0]), wgrad = atomic_load(&limits[1]),
               chunk = atomic_load(&limits[2]);
  s.wide =
      (size_t)NPOS * s.cp * s.fp * sizeof(float) >
      (weight_grad ? (wgrad ? wgrad : WIDE_WGRAD_BYTES) : (forward ? forward : WIDE_FORWARD_BYTES));
  if (s.wide) {
    int64_t tc = (int64_t)(chunk ? chunk : CHUNK_BYTES) /
                 ((int64_t)NPOS * (int64_t)sizeof(float) * (s.cp + s.fp));
    if (tc < ROWS_Q) tc = ROWS_Q;
    s.tb = (int)(tc < s.tiles ? tc : s.tiles);
    s.slices = 1;
  }
  return s;
}

void kn_winograd_set_limits(size_t wide_forward, size_t wide_wgrad, size_t chunk) {
  atomic_store(&limits[0], wide_forward);
  atomic_store(&limits[1], wide_wgrad);
  atomic_store(&limits[2], chunk);
}

static size_t kernel_floats(const wino_shape *s) {
  return (size_t)NPOS * s->cp * s->fp;
}
static size_t thread_floats(const wino_shape *s) {
  return (size_t)NPOS * s->tb * (s->cp + s->fp);
}
/* A weight gradient's slice sums (and a wide one's parts' bias sums). */
static size_t partial_floats(const wino_shape *s) {
  return (size_t)s->slices * ((size_t)NPOS * s->cp * s->fp + (size_t)s->fp) +
         (s->wide ? (size_t)PARTS * s->fp : 0);
}
/* Each thread's block lies SLOT_GAP floats (1 MiB) past the end of the
 * one before it. Side by side, the threads ran at different speeds on the
 * same work: the block after the first thread's ran its input transform
 * 2.5x slower (the zoo ResNet's 16-channel layers, timed a thread and a
 * phase at a time; the slowness followed the block, not the thread), as
 * one core's prefetchers, running on past the end of its block, took the
 * next core's freshly written lines away from it; 32 KiB apart cured the
 * 16-channel layers, 1 MiB all of them. The gap is address space, never
 * touched, so it costs no memory. */
#define SLOT_GAP ((size_t)1 << 18)
static size_t slot_floats(const wino_shape *s) {
  return thread_floats(s) + SLOT_GAP;
}
/* The threads' blocks: one each, or a wide product's one chunk. */
static size_t blocks_floats(const wino_shape *s, int threads) {
  return s->wide || threads < 2 ? thread_floats(s) : (size_t)threads * slot_floats(s);
}

int kn_winograd_pays(int r, int d, int h, int w, int cin, int cout) {
  if ((r != 3 && r != 5) || d < 1) return 0;
  /* 36 products a tile against r^2 an output; at least half of them
   * saved (a dilated product's tiles: its phases') */
  const int m = tile_side(r);
  int64_t down = 0, across = 0;
  for (int p = 0; p < d; p++) {
    down += (phase_size(h, d, p) + m - 1) / m;
    across += (phase_size(w, d, p) + m - 1) / m;
  }
  return cin >= 8 && cout >= 8 && 2 * NPOS * down * across <= (int64_t)r * r * h * w;
}

size_t kn_winograd_floats(int threads, int r, int d, int batch, int hp, int wp, int cin, int oh,
                          int ow, int cout, int weight_grad, int amx) {
  const wino_shape s = shape_of(r, d, 0, 0, batch, hp, wp, cin, oh, ow, cout, weight_grad, amx);
  return (weight_grad ? partial_floats(&s) : kernel_floats(&s)) + blocks_floats(&s, threads);
}

#ifdef KN_HAVE_ISA_PATHS
#define AVX512     __attribute__((target("avx512f")))
#define AVX512BF16 __attribute__((target("avx512f,avx512bf16")))
#define INLINE     __attribute__((always_inline)) inline

static inline __mmask16 lanes_mask(int n) {
  return kn_lanes_avx512(n);
}

/* n (<= VL) values from element i of p, f32 or bf16 (widened: exact), the
 * rest zero. */
AVX512 static inline v16 load_n(const void *p, int bf16, size_t i, int n) {
  if (!bf16) return (v16)_mm512_maskz_loadu_ps(lanes_mask(n), (const float *)p + i);
  const uint16_t *h = (const uint16_t *)p + i;
  if (n == VL)
    return (v16)kn_bf16_widen_avx512(_mm256_loadu_si256((const __m256i *)(const void *)h));
  float t[VL] = {0};
  for (int l = 0; l < n; l++) t[l] = kn_bf16_to_f32(h[l]);
  v16 v;
  memcpy(&v, t, sizeof v);
  return v;
}

/* n (<= VL) lanes of v rounded to bf16 at p, as kn_bf16_from_f32 rounds;
 * with native, by the CPU's own conversion (where it has AVX512-BF16). */
AVX512 static inline void store_bf16(uint16_t *p, __m512 v, int n, int native) {
  if (native && n == VL)
    _mm256_storeu_si256((__m256i *)(void *)p, kn_bf16_pack16_native(v));
  else if (native)
    _mm512_mask_cvtepi32_storeu_epi16(p, lanes_mask(n),
                                      _mm512_cvtepu16_epi32(kn_bf16_pack16_native(v)));
  else
    _mm512_mask_cvtepi32_storeu_epi16(p, lanes_mask(n), kn_bf16_round_avx512(v));
}

/* v's lanes rounded to bf16 into half of the 32-bit words at p: the low
 * halves (the high zeroed), or with odd the high ones (the low kept). */
AVX512 static inline void store_pair_half(uint32_t *p, __m512 v, int odd) {
  const __m512i r = _mm512_cvtepu16_epi32(kn_bf16_pack16_native(v)); /* AMX: AVX512-BF16 too */
  if (!odd)
    _mm512_storeu_si512(p, r);
  else
    _mm512_storeu_si512(p, _mm512_or_si512(_mm512_loadu_si512(p), _mm512_slli_epi32(r, 16)));
}

/* ---- the transforms (one vector of channels at a time) ---- */

/* a x + b, and b - a x, with one rounding (explicit: this file is built
 * without contraction, so every multiply-add is one written here) */
#define FMA(a, x, b)  ((v16)_mm512_fmadd_ps(_mm512_set1_ps(a), (__m512)(x), (__m512)(b)))
#define FNMA(a, x, b) ((v16)_mm512_fnmadd_ps(_mm512_set1_ps(a), (__m512)(x), (__m512)(b)))

/* B^T d over 6 values a stride apart, in place. */
AVX512 static inline void bt6(v16 *d, int s) {
  const v16 d0 = d[0], d1 = d[s], d2 = d[2 * s], d3 = d[3 * s], d4 = d[4 * s], d5 = d[5 * s];
  const v16 s12 = d1 + d2, s34 = d3 + d4, m12 = d1 - d2, m43 = d4 - d3, m31 = d3 - d1,
            m42 = d4 - d2;
  d[0] = FMA(4.0f, d0, FNMA(5.0f, d2, d4));     /* 4 d0 - 5 d2 + d4 */
  d[s] = FNMA(4.0f, s12, s34);                  /* -4 d1 - 4 d2 + d3 + d4 */
  d[2 * s] = FMA(4.0f, m12, m43);               /* 4 d1 - 4 d2 - d3 + d4 */
  d[3 * s] = FMA(2.0f, m31, m42);               /* -2 d1 - d2 + 2 d3 + d4 */
  d[4 * s] = FNMA(2.0f, m31, m42);              /* 2 d1 - d2 - 2 d3 + d4 */
  d[5 * s] = FMA(4.0f, d1, FNMA(5.0f, d3, d5)); /* 4 d1 - 5 d3 + d5 */
}

/* A^T m: 6 values a stride apart to 4. */
AVX512 static inline void at6(const v16 *m, int s, v16 *o, int os) {
  const v16 m0 = m[0], m1 = m[s], m2 = m[2 * s], m3 = m[3 * s], m4 = m[4 * s], m5 = m[5 * s];
  const v16 p12 = m1 + m2, d12 = m1 - m2, p34 = m3 + m4, d34 = m3 - m4;
  o[0] = m0 + p12 + p34;
  o[os] = FMA(2.0f, d34, d12);
  o[2 * os] = FMA(4.0f, p34, p12);
  o[3 * os] = FMA(8.0f, d34, d12 + m5);
}

/* A y: 4 values a stride apart to 6 (dy into the transformed domain). */
AVX512 static inline void a4(const v16 *y, int s, v16 *z, int zs) {
  const v16 y0 = y[0], y1 = y[s], y2 = y[2 * s], y3 = y[3 * s];
  const v16 p02 = y0 + y2, p13 = y1 + y3;
  z[0] = y0;
  z[zs] = p02 + p13;
  z[2 * zs] = p02 - p13;
  z[3 * zs] = FMA(4.0f, FMA(2.0f, y3, y2), FMA(2.0f, y1, y0));   /* y0 + 2 y1 + 4 y2 + 8 y3 */
  z[4 * zs] = FMA(4.0f, FNMA(2.0f, y3, y2), FNMA(2.0f, y1, y0)); /* y0 - 2 y1 + 4 y2 - 8 y3 */
  z[5 * zs] = y3;
}

/* A^T m for F(2x2, 5x5): 6 values a stride apart to 2. */
AVX512 static inline void at6_2(const v16 *m, int s, v16 *o, int os) {
  const v16 m0 = m[0], m1 = m[s], m2 = m[2 * s], m3 = m[3 * s], m4 = m[4 * s], m5 = m[5 * s];
  o[0] = m0 + (m1 + m2) + (m3 + m4);
  o[os] = FMA(2.0f, m3 - m4, (m1 - m2) + m5);
}

/* A y for F(2x2, 5x5): 2 values a stride apart to 6. */
AVX512 static inline void a2(const v16 *y, int s, v16 *z, int zs) {
  const v16 y0 = y[0], y1 = y[s];
  z[0] = y0;
  z[zs] = y0 + y1;
  z[2 * zs] = y0 - y1;
  z[3 * zs] = FMA(2.0f, y1, y0);
  z[4 * zs] = FNMA(2.0f, y1, y0);
  z[5 * zs] = y1;
}

/* G g: 3 values a stride apart to 6 (the kernel into the transformed
 * domain). */
AVX512 static inline void g3(const v16 *g, int s, v16 *u, int us) {
  const v16 g0 = g[0], g1 = g[s], g2 = g[2 * s];
  const v16 p = g0 + g2;
  u[0] = 0.25f * g0;
  u[us] = (p + g1) * (-1.0f / 6);
  u[2 * us] = (p - g1) * (-1.0f / 6);
  u[3 * us] = g0 * (1.0f / 24) + g1 * (1.0f / 12) + g2 * (1.0f / 6);
  u[4 * us] = g0 * (1.0f / 24) - g1 * (1.0f / 12) + g2 * (1.0f / 6);
  u[5 * us] = g2;
}

/* G g for F(2x2, 5x5): 5 values a stride apart to 6. */
AVX512 static inline void g5(const v16 *g, int s, v16 *u, int us) {
  const v16 g0 = g[0], g1 = g[s], g2 = g[2 * s], g3 = g[3 * s], g4 = g[4 * s];
  const v16 e = g0 + g2 + g4, o = g1 + g3; /* the even and odd powers at 1 */
  const v16 e2 = g0 + 4.0f * g2 + 16.0f * g4, o2 = 2.0f * g1 + 8.0f * g3; /* at 2 */
  u[0] = 0.25f * g0;
  u[us] = (e + o) * (-1.0f / 6);
  u[2 * us] = (e - o) * (-1.0f / 6);
  u[3 * us] = (e2 + o2) * (1.0f / 24);
  u[4 * us] = (e2 - o2) * (1.0f / 24);
  u[5 * us] = g4;
}

/* G^T u for F(2x2, 5x5): 6 values a stride apart to 5. */
AVX512 static inline void gt6_5(const v16 *u, int s, v16 *g, int gs) {
  const v16 u0 = u[0], u1 = u[s], u2 = u[2 * s], u3 = u[3 * s], u4 = u[4 * s], u5 = u[5 * s];
  const v16 p12 = u1 + u2, p34 = u3 + u4, d21 = u2 - u1, d34 = u3 - u4;
  g[0] = 0.25f * u0 - p12 * (1.0f / 6) + p34 * (1.0f / 24);
  g[gs] = d21 * (1.0f / 6) + d34 * (1.0f / 12);
  g[2 * gs] = (p34 - p12) * (1.0f / 6);
  g[3 * gs] = d21 * (1.0f / 6) + d34 * (1.0f / 3);
  g[4 * gs] = p34 * (2.0f / 3) - p12 * (1.0f / 6) + u5;
}

/* G^T u: 6 values a stride apart to 3 (a kernel gradient back). */
AVX512 static inline void gt6(const v16 *u, int s, v16 *g, int gs) {
  const v16 u0 = u[0], u1 = u[s], u2 = u[2 * s], u3 = u[3 * s], u4 = u[4 * s], u5 = u[5 * s];
  const v16 p12 = u1 + u2, p34 = u3 + u4;
  g[0] = 0.25f * u0 - p12 * (1.0f / 6) + p34 * (1.0f / 24);
  g[gs] = (u2 - u1) * (1.0f / 6) + (u3 - u4) * (1.0f / 12);
  g[2 * gs] = (p34 - p12) * (1.0f / 6) + u5;
}

/* ---- the 36 GEMMs of a block ---- */

/* c (R x NV vectors, row stride ldc) = (accumulate ? c : 0) + sum over k
 * of a(r, k) b(k, :): in f32, a(r, k) = a[r * ars + k * aks] and b's rows
 * ldb apart (MICRO); on bf16 operands (AVX512-BF16, MICRO_BF16), in pairs
 * along the sums, a's pair (r, k) the two bf16 values at a + r * ars + k *
 * aks dotted with b's pair row k (ldb 32-bit words apart, each lane's two
 * values low first): each product of two bf16 values is exact, and
 * vdpbf16ps adds the pair's two to the f32 sum (round to nearest even,
 * denormals flushed). */
#define MICRO_KERNEL(NAME, ATTR, AT, BT, BV, LOAD_B, BROADCAST_A, MADD, NV, R)                     \
  ATTR static void NAME##_##NV##_##R(int K, const AT *a, ptrdiff_t ars, ptrdiff_t aks,             \
                                     const BT *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc,          \
                                     int accumulate) {                                             \
    __m512 acc[R][NV];                                                                             \
    _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                           \
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) acc[r][j] =                           \
            accumulate ? _mm512_loadu_ps(c + r * ldc + VL * j) : _mm512_setzero_ps();              \
    for (int k = 0; k < K; k++) {                                                                  \
      BV bv[NV];                                                                                   \
      _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) bv[j] = LOAD_B(b + k * ldb + VL * j);   \
      _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                       \
        const BV av = BROADCAST_A(a + r * ars + k * aks);                                          \
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) acc[r][j] =                           \
            MADD(acc[r][j], av, bv[j]);                                                            \
      }                                                                                            \
    }                                                                                              \
    _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                           \
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)                                       \
            _mm512_storeu_ps(c + r * ldc + VL * j, acc[r][j]);                                     \
  }

AVX512 static INLINE __m512 broadcast_f32(const float *a) {
  return _mm512_set1_ps(*a);
}
AVX512 static INLINE __m512 madd_f32(__m512 acc, __m512 a, __m512 b) {
  return _mm512_fmadd_ps(a, b, acc);
}
AVX512BF16 static INLINE __m512bh load_pairs(const uint32_t *b) {
  return (__m512bh)_mm512_loadu_si512(b);
}
AVX512BF16 static INLINE __m512bh broadcast_pair(const uint16_t *a) {
  uint32_t w;
  memcpy(&w, a, sizeof w);
  return (__m512bh)_mm512_set1_epi32((int)w);
}
AVX512BF16 static INLINE __m512 madd_pairs(__m512 acc, __m512bh a, __m512bh b) {
  return _mm512_dpbf16_ps(acc, a, b);
}

#define MICRO(NV, R)                                                                               \
  MICRO_KERNEL(micro, AVX512, float, float, __m512, _mm512_loadu_ps, broadcast_f32, madd_f32, NV, R)
#define MICRO_BF16(NV, R)                                                                          \
  MICRO_KERNEL(microb, AVX512BF16, uint16_t, uint32_t, __m512bh, load_pairs, broadcast_pair,       \
               madd_pairs, NV, R)
MICRO(1, 12)
MICRO(2, 8)
MICRO(3, 6)
MICRO(4, 6)
MICRO(4, 4)
MICRO(1, 16)
MICRO(3, 8)
MICRO_BF16(1, 12)
MICRO_BF16(2, 8)
MICRO_BF16(3, 6)
MICRO_BF16(4, 6)
MICRO_BF16(4, 4)
MICRO_BF16(1, 16)
MICRO_BF16(3, 8)

/* A micro-tile's rows for NV vectors of columns: by 16 (the weight
 * gradient's channels) or, wide, by 24 (the forward products' tiles). */
static const int micro_rows[2][5] = {{0, 16, 8, 8, 4}, {0, 12, 8, 6, 6}};

/* c (rows x cols, cols a multiple of VL) = (accumulate ? c : 0) + a b, a
 * and b as the micro-tiles take them; rows a multiple of 24 (wide) or of
 * 16. block_gemm in f32, block_gemm_bf16 over K pairs of bf16 values. */
#define BLOCK_GEMM(NAME, MICRO_NAME, ATTR, AT, BT)                                                 \
  ATTR static void NAME(int rows, int cols, int K, const AT *a, ptrdiff_t ars, ptrdiff_t aks,      \
                        const BT *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc, int accumulate,       \
                        int wide) {                                                                \
    typedef void (*fn)(int, const AT *, ptrdiff_t, ptrdiff_t, const BT *, ptrdiff_t, float *,      \
                       ptrdiff_t, int);                                                            \
    static const fn fs[2][5] = {                                                                   \
        {NULL, MICRO_NAME##_1_16, MICRO_NAME##_2_8, MICRO_NAME##_3_8, MICRO_NAME##_4_4},           \
        {NULL, MICRO_NAME##_1_12, MICRO_NAME##_2_8, MICRO_NAME##_3_6, MICRO_NAME##_4_6}};          \
    for (int j0 = 0; j0 < cols; j0 += 4 * VL) {                                                    \
      const int nv = (cols - j0) / VL >= 4 ? 4 : (cols - j0) / VL, R = micro_rows[wide][nv];       \
      for (int r = 0; r < rows; r += R)                                                            \
        fs[wide][nv](K, a + r * ars, ars, aks, b + j0, ldb, c + (ptrdiff_t)r * ldc + j0, ldc,      \
                     accumulate);                                                                  \
    }                                                                                              \
  }
BLOCK_GEMM(block_gemm, micro, AVX512, float, float)
BLOCK_GEMM(block_gemm_bf16, microb, AVX512BF16, uint16_t, uint32_t)

/* ---- forward products (and input gradients) ---- */

typedef struct conv_job {
  wino_shape s;
  const void *x; /* the input */
  const void *w; /* the kernel (r, r, C, F), f32 or (w_bf16) bf16 */
  int w_bf16;
  int flip;          /* w turned 180 degrees, C and F swapped: an input gradient */
  const float *bias; /* or NULL */
  int relu;
  float *y;         /* or NULL: the output in bf16 only, in y_copy */
  uint16_t *y_copy; /* or NULL: y's bf16 copy, written as y is stored */
  float *u;         /* the transformed kernel, NPOS x cp x fp */
  float *scratch;   /* slot_floats a thread */
  int64_t blocks;
  int amx;          /* bf16 products on AMX tiles (amx.h) */
  int round;        /* y's values rounded through bf16 (kn_wino_io.round_y) */
  const float *add; /* added to each output as it is stored (kn_wino_io.add), or NULL */
} conv_job;

/* G g (r values a stride apart) to 6. */
AVX512 static INLINE void g_of(const int r, const v16 *g, int s, v16 *u, int us) {
  if (r == 3)
    g3(g, s, u, us);
  else
    g5(g, s, u, us);
}

/* Input channel ci of the kernel, filters [f0, f0 + VL) (n of them, the
 * rest zero), into the transformed domain: u[p], p < 36. Forward: g =
 * w[kh][kw][ci][co]; flipped: w[r-1-kh][r-1-kw][co][ci]. */
AVX512 static INLINE void kernel_vec(const conv_job *j, int ci, int f0, int n, v16 *u,
                                     const int r) {
  const wino_shape *s = &j->s;
  const int taps = r * r;
  v16 g[R_MAX * R_MAX], t[T_IN * R_MAX];
  for (int k = 0; k < taps; k++) {
    if (!j->flip) {
      g[k] = load_n(j->w, j->w_bf16, ((size_t)k * s->cin + ci) * s->cout + f0, n);
    } else { /* w (r, r, cout, cin): lane l is w[taps-1-k][f0 + l][ci] */
      float tmp[VL] = {0};
      for (int l = 0; l < n; l++) {
        const size_t at = ((size_t)(taps - 1 - k) * s->cout + f0 + l) * s->cin + ci;
        tmp[l] =
            j->w_bf16 ? kn_bf16_to_f32(((const uint16_t *)j->w)[at]) : ((const float *)j->w)[at];
      }
      memcpy(&g[k], tmp, sizeof tmp);
    }
  }
  for (int c = 0; c < r; c++) g_of(r, g + c, r, t + c, r);               /* columns: t is 6 x r */
  for (int i = 0; i < T_IN; i++) g_of(r, t + r * i, 1, u + T_IN * i, 1); /* rows */
}

/* The kernel into the transformed domain for input channels [c0, c1),
 * co padded with zeros to fp: U[p][ci][co] in f32, or for bf16 products
 * (c0 and c1 even, or c1 the last channel) U[p][ci / 2][co] a pair of bf16
 * values, ci's rounded in the low half, ci + 1's (zero past the last) in
 * the high. Inlined for each kernel side r. */
AVX512 static INLINE void transform_kernel_r(const conv_job *j, int c0, int c1, const int r) {
  const wino_shape *s = &j->s;
  for (int ci = c0; ci < c1; ci += s->bf16 ? 2 : 1) {
    for (int f0 = 0; f0 < s->fp; f0 += VL) {
      const int n = s->cout - f0 < VL ? s->cout - f0 : VL;
      v16 u[NPOS], u1[NPOS];
      kernel_vec(j, ci, f0, n, u, r);
      if (!s->bf16) {
        for (int p = 0; p < NPOS; p++)
          _mm512_storeu_ps(j->u + ((size_t)p * s->cp + ci) * s->fp + f0, (__m512)u[p]);
        continue;
      }
      if (ci + 1 < s->cin)
        kernel_vec(j, ci + 1, f0, n, u1, r);
      else
        for (int p = 0; p < NPOS; p++) u1[p] = (v16){0};
      uint32_t *ub = (uint32_t *)(void *)j->u;
      for (int p = 0; p < NPOS; p++) {
        const __m512i pair =
            _mm512_or_si512(kn_bf16_round_avx512((__m512)u[p]),
                            _mm512_slli_epi32(kn_bf16_round_avx512((__m512)u1[p]), 16));
        _mm512_storeu_si512(ub + ((size_t)p * (s->cp / 2) + ci / 2) * s->fp + f0, pair);
      }
    }
  }
}

AVX512 static void transform_kernel(const conv_job *j, int c0, int c1) {
  if (j->s.r == 3)
    transform_kernel_r(j, c0, c1, 3);
  else
    transform_kernel_r(j, c0, c1, 5);
}

/* Input channels [u0, u1) of the kernel (bf16: pairs of them). */
static void kernel_range(void *ctx, int64_t u0, int64_t u1) {
  const conv_job *j = ctx;
  if (j->s.bf16) { /* by pairs of channels */
    const int c1 = 2 * (int)u1;
    transform_kernel(j, 2 * (int)u0, c1 < j->s.cin ? c1 : j->s.cin);
    return;
  }
  transform_kernel(j, (int)u0, (int)u1);
}

/* Tile t's image and top-left output. */
static inline void tile_at(const wino_shape *s, int64_t t, int *b, int *oy, int *ox) {
  const int64_t per = (int64_t)s->th * s->tw;
  *b = (int)(t / per);
  const int r = (int)(t % per);
  *oy = r / s->tw * s->m;
  *ox = r % s->tw * s->m;
}

/* Where output (oy, ox) of image b's phase lies in the whole output
 * (batch, yh, yw, cout), in elements: the phase's rows and columns are d
 * apart from (py, px) (the output itself where undilated). */
static inline size_t phase_out_at(const wino_shape *s, int b, int oy, int ox) {
  return (((size_t)b * s->yh + s->py + (size_t)s->d * oy) * s->yw + s->px + (size_t)s->d * ox) *
         s->cout;
}

/* A tile's index, image and top-left output (in the phase), stepped tile
 * by tile without dividing. */
typedef struct tile_pos {
  int64_t t;
  int b, oy, ox;
} tile_pos;

static inline tile_pos tile_pos_at(const wino_shape *s, int64_t t) {
  tile_pos p = {.t = t};
  tile_at(s, t, &p.b, &p.oy, &p.ox);
  return p;
}

static inline void tile_pos_next(const wino_shape *s, tile_pos *p) {
  p->t++;
  p->ox += s->m;
  if (p->ox < s->tw * s->m) return;
  p->ox = 0;
  p->oy += s->m;
  if (p->oy < s->th * s->m) return;
  p->oy = 0;
  p->b++;
}

/* The rows and columns of a tile's m x m outputs inside the output (fewer
 * at the bottom and right edges). */
static inline void tile_extent(const wino_shape *s, const tile_pos *p, int *rows, int *cols) {
  *rows = s->oh - p->oy < s->m ? s->oh - p->oy : s->m;
  *cols = s->ow - p->ox < s->m ? s->ow - p->ox : s->m;
}

/* A transform's walk over its tiles: the tile it works on, and the two
 * it asks the cache for (AHEAD_NEAR on, and a row of tiles further),
 * stepped together. */
typedef struct tile_walk {
  tile_pos t, near, far;
} tile_walk;

#define AHEAD_NEAR 2

static inline tile_walk tile_walk_at(const wino_shape *s, int64_t t0) {
  return (tile_walk){tile_pos_at(s, t0), tile_pos_at(s, t0 + AHEAD_NEAR),
                     tile_pos_at(s, t0 + AHEAD_NEAR + s->tw)};
}

static inline void tile_walk_next(const wino_shape *s, tile_walk *w) {
  tile_pos_next(s, &w->t);
  tile_pos_next(s, &w->near);
  tile_pos_next(s, &w->far);
}

/* How a patch is asked for: for reading soon (into the L1 cache), for
 * reading later (the L2), for writing later (the L2, owned). */
enum { AHEAD_L1, AHEAD_L2, AHEAD_WRITE };

/* The tiles AHEAD_NEAR on from the one being transformed are asked for
 * the L1 cache, and a row of tiles further the L2. Each tile reads lines
 * of six rows, jumping from row to row where the hardware's prefetchers
 * lose the streams, and at 16 or 32 channels a tile's arithmetic is too
 * short to hide a read from memory: the tiles one row down, asked for a
 * whole row of tiles early, arrive in time. */

/* Asks the cache for the rows x rows patch of tile t (its top left at
 * the tile's output less pt, pl; a dilated product's phase: its rows d
 * apart, each row's span whole) of an (hp, wp, c) image of es-byte
 * elements, as how says (AHEAD_*). With fresh, only what the tiles before
 * it have not read: a tile's patch shares its first rows - m rows with
 * the tile above it and its first rows - m columns with the tile left of
 * it (where there are such tiles). */
AVX512 static inline void prefetch_patch(const void *x, int es, const wino_shape *s,
                                         const tile_pos *t, int rows, int pt, int pl, int hp,
                                         int wp, int c, int how, int fresh) {
  const int b = t->b;
  int y = t->oy, xx = t->ox;
  const int skip_rows = fresh && y > 0 ? rows - s->m : 0,
            skip_cols = fresh && xx > 0 ? s->d * (rows - s->m) : 0;
  /* the phase's rows and columns, d apart, in the stored image */
  y = s->py - pt + s->d * y;
  xx = s->px - pl + s->d * xx + skip_cols;
  const int span = s->d * (rows - 1) + 1 - skip_cols;
  const int x0 = xx < 0 ? 0 : xx, cols = (wp < xx + span ? wp : xx + span) - x0;
  if (cols <= 0) return;
  const size_t row = (size_t)wp * c, bytes = (size_t)cols * c * es;
  const char *image = (const char *)x + (size_t)b * hp * row * es;
  for (int i = skip_rows; i < rows; i++) {
    const int yy = y + s->d * i;
    if (yy < 0 || yy >= hp) continue;
    const char *at = image + ((size_t)yy * row + (size_t)x0 * c) * es;
    for (size_t o = 0; o < bytes; o += 64) {
      if (how == AHEAD_WRITE)
        _mm_prefetch(at + o, _MM_HINT_ET1);
      else if (how == AHEAD_L2)
        _mm_prefetch(at + o, _MM_HINT_T1);
      else
        _mm_prefetch(at + o, _MM_HINT_T0);
    }
  }
}

/* Where a tile's input patch lies: element (i, k) at x + at + row[i] +
 * col[k] (in elements), read where rm[i] & cm[k] (lanes) is not zero,
 * zero elsewhere (the padding, and channels past the last). */
typedef struct patch_map {
  size_t at, row[T_IN], col[T_IN];
  __mmask16 rm[T_IN], cm[T_IN];
} patch_map;

/* One vector of channels of one tile's patch into the transformed domain,
 * position p at out[p * cp]: B^T d B in two passes through out (in the
 * L1 cache), each value read and written once a pass: the columns (B^T
 * d), then the rows (those times B). A column wholly in the padding is
 * zeros and reads nothing. Inlined for f32, for bf16 (n channels:
 * widened) and for f32 rounded to bf16 as it is read (bf16 2), and for
 * out in f32 (ob 0) or in bf16, rounded as stored (the columns' pass then
 * goes through a block of the stack): ob 1, position p at out[p * cp] as
 * for f32; ob 2, in the 32-bit words out[p * cp], the low halves for an
 * even tile (whose store zeroes the high halves), the high for an odd one,
 * the next (a weight gradient's pairs of tiles). */
AVX512 static INLINE void transform_patch(const patch_map *pm, const void *x, int bf16, int n,
                                          int cp, void *out, const int ob, int odd) {
  float block[NPOS * VL];
  float *mid = ob ? block : (float *)out;
  const size_t ms = ob ? VL : (size_t)cp;
#pragma GCC unroll 6
  for (int k = 0; k < T_IN; k++) {
    v16 d[T_IN];
    if (pm->cm[k]) {
#pragma GCC unroll 6
      for (int i = 0; i < T_IN; i++) {
        const __mmask16 in = pm->rm[i] & pm->cm[k];
        const size_t e = pm->at + pm->row[i] + pm->col[k];
        if (bf16 == 1) {
          d[i] = in ? load_n(x, 1, e, n) : (v16){0};
        } else {
          d[i] = (v16)_mm512_maskz_loadu_ps(in, (const float *)x + e);
          if (bf16 == 2) /* as kn_bf16_from_f32, back to f32 */
            d[i] =
                (v16)_mm512_castsi512_ps(_mm512_slli_epi32(kn_bf16_round_avx512((__m512)d[i]), 16));
        }
      }
      bt6(d, 1); /* column k */
    } else {
#pragma GCC unroll 6
      for (int i = 0; i < T_IN; i++) d[i] = (v16){0};
    }
#pragma GCC unroll 6
    for (int i = 0; i < T_IN; i++)
      _mm512_storeu_ps(mid + (size_t)(i * T_IN + k) * ms, (__m512)d[i]);
  }
#pragma GCC unroll 6
  for (int i = 0; i < T_IN; i++) {
    v16 c[T_IN];
#pragma GCC unroll 6
    for (int k = 0; k < T_IN; k++) c[k] = (v16)_mm512_loadu_ps(mid + (size_t)(i * T_IN + k) * ms);
    bt6(c, 1); /* row i */
#pragma GCC unroll 6
    for (int k = 0; k < T_IN; k++) {
      const size_t q = (size_t)(i * T_IN + k) * cp;
      if (ob == 1)
        _mm256_storeu_si256((__m256i *)(void *)((uint16_t *)out + q),
                            kn_bf16_pack16_native((__m512)c[k])); /* bf16 products: AVX512-BF16 */
      else if (ob == 2)
        store_pair_half((uint32_t *)out + q, (__m512)c[k], odd);
      else
        _mm512_storeu_ps(mid + (size_t)(i * T_IN + k) * ms, (__m512)c[k]);
    }
  }
}

/* Input patches of tiles [t0, t0 + nt) into the transformed domain: tile
 * r's position p at v[(r * NPOS + p) * cp], so each tile's values are
 * written in one run; f32 (ob 0) or bf16 (ob 1); or (ob 2) pairs of
 * tiles, tiles r and r + 1 (r even) at the 32-bit words v[(r / 2 * NPOS +
 * p) * cp]. */
AVX512 static INLINE void transform_input_o(const wino_shape *s, const void *x, int64_t t0, int nt,
                                            void *v, const int ob) {
  const size_t row = (size_t)s->wp * s->cin;
  tile_walk w = tile_walk_at(s, t0);
  for (int r = 0; r < nt; r++, tile_walk_next(s, &w)) {
    const int b = w.t.b, oy = w.t.oy, ox = w.t.ox;
    /* the patch's rows and columns in the stored input (d apart, from the
     * phase's); those outside it read nothing (at offset 0, inside) */
    const int iy = s->py - s->pt + s->d * oy, ix = s->px - s->pl + s->d * ox;
    patch_map pm;
    for (int i = 0; i < T_IN; i++) {
      const int y = iy + s->d * i, in = y >= 0 && y < s->hp;
      pm.row[i] = in ? (size_t)y * row : 0;
      pm.rm[i] = in ? 0xFFFF : 0;
    }
    for (int k = 0; k < T_IN; k++) {
      const int xx = ix + s->d * k, in = xx >= 0 && xx < s->wp;
      pm.col[k] = in ? (size_t)xx * s->cin : 0;
      pm.cm[k] = in ? 0xFFFF : 0;
    }
    const int es = s->x_bf16 == 1 ? 2 : 4;
    if (w.near.t < s->tiles)
      prefetch_patch(x, es, s, &w.near, T_IN, s->pt, s->pl, s->hp, s->wp, s->cin, AHEAD_L1, 1);
    if (w.far.t < s->tiles)
      prefetch_patch(x, es, s, &w.far, T_IN, s->pt, s->pl, s->hp, s->wp, s->cin, AHEAD_L2, 1);
    for (int c0 = 0; c0 < s->cp; c0 += VL) {
      const int n = s->cin - c0 < VL ? s->cin - c0 : VL;
      const __mmask16 m = lanes_mask(n);
      for (int i = 0; i < T_IN; i++) pm.rm[i] = pm.rm[i] ? m : 0;
      pm.at = (size_t)b * s->hp * row + c0;
      const size_t o = (size_t)(ob == 2 ? r / 2 : r) * NPOS * s->cp + c0;
      void *out = ob == 1   ? (void *)((uint16_t *)v + o)
                  : ob == 2 ? (void *)((uint32_t *)v + o)
                            : (void *)((float *)v + o);
      if (s->x_bf16 == 1) /* each its own inlined copy */
        transform_patch(&pm, x, 1, n, s->cp, out, ob, r & 1);
      else if (s->x_bf16 == 2)
        transform_patch(&pm, x, 2, n, s->cp, out, ob, r & 1);
      else
        transform_patch(&pm, x, 0, n, s->cp, out, ob, r & 1);
    }
  }
}

AVX512 static void transform_input(const wino_shape *s, const void *x, int64_t t0, int nt,
                                   float *v) {
  transform_input_o(s, x, t0, nt, v, 0);
}

AVX512 static void transform_input_bf16(const wino_shape *s, const void *x, int64_t t0, int nt,
                                        uint16_t *v) {
  transform_input_o(s, x, t0, nt, v, 1);
}

AVX512 static void transform_input_pairs(const wino_shape *s, const void *x, int64_t t0, int nt,
                                         uint32_t *v) {
  transform_input_o(s, x, t0, nt, v, 2);
}

/* A^T m: 6 values a stride apart to M (4 or 2). */
AVX512 static INLINE void at_of(const int M, const v16 *m, int s, v16 *o, int os) {
  if (M == 4)
    at6(m, s, o, os);
  else
    at6_2(m, s, o, os);
}

/* Products of tiles [t0, t0 + nt) back to outputs, bias and relu on the
 * way: tile r's position p at mo[(r * NPOS + p) * fp]. A^T m A, the
 * columns first, in halves of two output rows (as transform_patch).
 * Inlined for each tile side M. */
AVX512 static INLINE void transform_output_m(const conv_job *j, int64_t t0, int nt, const float *mo,
                                             const int M) {
  const wino_shape *s = &j->s;
  tile_walk w = tile_walk_at(s, t0);
  for (int r = 0; r < nt; r++, tile_walk_next(s, &w)) {
    const int b = w.t.b, oy = w.t.oy, ox = w.t.ox;
    int rows, cols;
    tile_extent(s, &w.t, &rows, &cols);
    if (w.far.t < s->tiles) /* its outputs' lines, owned */
      prefetch_patch(j->y ? (const void *)j->y : (const void *)j->y_copy, j->y ? 4 : 2, s, &w.far,
                     M, 0, 0, s->yh, s->yw, s->cout, AHEAD_WRITE, 0);
    for (int f0 = 0; f0 < s->fp; f0 += VL) {
      const __mmask16 m = lanes_mask(s->cout - f0);
      const float *in = mo + (size_t)r * NPOS * s->fp + f0;
      const v16 bias = j->bias ? (v16)_mm512_maskz_loadu_ps(m, j->bias + f0) : (v16){0};
#pragma GCC unroll 2
      for (int h = 0; h < M; h += 2) {
        v16 t[2][T_IN];
#pragma GCC unroll 6
        for (int k = 0; k < T_IN; k++) {
          v16 mv[T_IN], o[M_MAX];
#pragma GCC unroll 6
          for (int i = 0; i < T_IN; i++)
            mv[i] = (v16)_mm512_loadu_ps(in + (size_t)(i * T_IN + k) * s->fp);
          at_of(M, mv, 1, o, 1); /* column k */
          t[0][k] = o[h];
          t[1][k] = o[h + 1];
        }
#pragma GCC unroll 2
        for (int q = 0; q < 2; q++) {
          v16 o[M_MAX];
          at_of(M, t[q], 1, o, 1); /* output row h + q */
          if (h + q >= rows) break;
          const size_t at = phase_out_at(s, b, oy + h + q, ox) + f0;
          const size_t step = (size_t)s->d * s->cout; /* one output right in the phase */
#pragma GCC unroll 4
          for (int k = 0; k < M; k++) {
            if (k >= cols) break;
            __m512 val = (__m512)(o[k] + bias);
            if (j->add) /* (where y is add's storage, each output is read once, then written) */
              val = _mm512_add_ps(val, _mm512_maskz_loadu_ps(m, j->add + at + (size_t)k * step));
            if (j->relu) val = _mm512_max_ps(_mm512_setzero_ps(), val); /* NaN passes */
            if (j->round) /* as kn_bf16_from_f32, widened back */
              val = s->bf16 ? kn_bf16_round_f32_native(val)
                            : _mm512_castsi512_ps(_mm512_slli_epi32(kn_bf16_round_avx512(val), 16));
            if (j->y) _mm512_mask_storeu_ps(j->y + at + (size_t)k * step, m, val);
            if (j->y_copy)
              store_bf16(j->y_copy + at + (size_t)k * step, val, s->cout - f0, s->bf16);
          }
        }
      }
    }
  }
}

AVX512 static void transform_output(const conv_job *j, int64_t t0, int nt, const float *mo) {
  if (j->s.m == 4)
    transform_output_m(j, t0, nt, mo, 4);
  else
    transform_output_m(j, t0, nt, mo, 2);
}

/* Blocks [b0, b1) of tiles, in slot's block of the buffer (the pool
 * hands them out: kn_pool_share). */
static void conv_range(void *ctx, int slot, int64_t b0, int64_t b1) {
  const conv_job *j = ctx;
  const wino_shape *s = &j->s;
  const int pairs = (s->cin + 1) / 2, kt = kn_amx_depth(pairs);
  if (j->amx) kn_amx_configure(kt, ROWS_Q - 16);
  float *v = j->scratch + (size_t)slot * slot_floats(s);
  float *mo = v + (size_t)NPOS * s->tb * s->cp;
  for (int64_t blk = b0; blk < b1; blk++) {
    const int64_t first = blk * s->tb;
    const int nt = s->tiles - first < s->tb ? (int)(s->tiles - first) : s->tb;
    const int rows = round_up(nt, ROWS_Q);
    /* the last block's spare rows: products of zeros, unread */
    const size_t spare = (size_t)(rows - nt) * NPOS * s->cp;
    if (s->bf16) { /* v holds bf16 values, u bf16 pairs */
      uint16_t *vb = (uint16_t *)(void *)v;
      transform_input_bf16(s, j->x, first, nt, vb);
      if (spare) memset(vb + (size_t)nt * NPOS * s->cp, 0, spare * sizeof(uint16_t));
      const uint32_t *ub = (const uint32_t *)(const void *)j->u;
      for (int p = 0; p < NPOS && j->amx; p++)
        kn_amx_gemm(rows, s->fp, pairs, kt, ROWS_Q - 16, vb + (size_t)p * s->cp,
                    (ptrdiff_t)NPOS * s->cp, ub + (size_t)p * (s->cp / 2) * s->fp, s->fp,
                    mo + (size_t)p * s->fp, (ptrdiff_t)NPOS * s->fp, 0);
      for (int p = 0; p < NPOS && !j->amx; p++)
        block_gemm_bf16(rows, s->fp, (s->cin + 1) / 2, vb + (size_t)p * s->cp,
                        (ptrdiff_t)NPOS * s->cp, 2, ub + (size_t)p * (s->cp / 2) * s->fp, s->fp,
                        mo + (size_t)p * s->fp, (ptrdiff_t)NPOS * s->fp, 0, 1);
    } else {
      transform_input(s, j->x, first, nt, v);
      if (spare) memset(v + (size_t)nt * NPOS * s->cp, 0, spare * sizeof(float));
      for (int p = 0; p < NPOS; p++)
        block_gemm(rows, s->fp, s->cin, v + (size_t)p * s->cp, (ptrdiff_t)NPOS * s->cp, 1,
                   j->u + (size_t)p * s->cp * s->fp, s->fp, mo + (size_t)p * s->fp,
                   (ptrdiff_t)NPOS * s->fp, 0, 1);
    }
    transform_output(j, first, nt, mo);
  }
  if (j->amx) kn_amx_release();
}

/* ---- wide products: by chunks ---- */

typedef struct chunk_job {
  const wino_shape *s;
  const void *x;         /* the input */
  const conv_job *conv;  /* a forward product's, or NULL */
  const void *wgrad;     /* a weight gradient's wgrad_job, or NULL */
  int64_t first;         /* the chunk's first tile */
  int nt, parts;         /* its tiles, and the parts they are cut in */
  float *v, *mo, *bsums; /* transformed input, products (or dy), parts' bias sums */
} chunk_job;

/* Part p's tiles of the chunk, [*a, *b) from its first. */
static void part_tiles(const chunk_job *c, int64_t p, int *a, int *b) {
  *a = (int)(c->nt * p / c->parts);
  *b = (int)(c->nt * (p + 1) / c->parts);
}

static void input_parts(void *ctx, int64_t p0, int64_t p1) {
  const chunk_job *c = ctx;
  for (int64_t p = p0; p < p1; p++) {
    int a, b;
    part_tiles(c, p, &a, &b);
    if (b > a) transform_input(c->s, c->x, c->first + a, b - a, c->v + (size_t)a * NPOS * c->s->cp);
  }
}

static void output_parts(void *ctx, int64_t p0, int64_t p1) {
  const chunk_job *c = ctx;
  for (int64_t p = p0; p < p1; p++) {
    int a, b;
    part_tiles(c, p, &a, &b);
    if (b > a) transform_output(c->conv, c->first + a, b - a, c->mo + (size_t)a * NPOS * c->s->fp);
  }
}

/* A wide forward product (or input gradient): chunk by chunk, the input
 * transformed in parts, each position's GEMM over the chunk (kiln's GEMM:
 * its sums' order fixed by the shape), the products transformed back. */
static void conv_wide(kn_graph *g, const conv_job *j) {
  const wino_shape *s = &j->s;
  chunk_job c = {.s = s, .x = j->x, .conv = j, .v = j->scratch};
  c.mo = c.v + (size_t)NPOS * s->tb * s->cp;
  for (c.first = 0; c.first < s->tiles; c.first += s->tb) {
    c.nt = s->tiles - c.first < s->tb ? (int)(s->tiles - c.first) : s->tb;
    c.parts = c.nt < PARTS ? c.nt : PARTS;
    kn_pool_for(g->pool, c.parts, input_parts, &c);
    for (int p = 0; p < NPOS; p++)
      kn_sgemm(g, 0, 0, c.nt, s->fp, s->cin, c.v + (size_t)p * s->cp, NPOS * s->cp,
               j->u + (size_t)p * s->cp * s->fp, s->fp, c.mo + (size_t)p * s->fp, NPOS * s->fp);
    kn_pool_for(g->pool, c.parts, output_parts, &c);
  }
}

/* The shape of phase (py, px) of io's product (phase (0, 0): the whole
 * product where it is undilated). */
static wino_shape io_shape(const kn_wino_io *io, int py, int px, int weight_grad) {
  wino_shape s = shape_of(io->r, io->d, py, px, io->batch, io->hp, io->wp, io->cin, io->oh, io->ow,
                          io->cout, weight_grad, io->amx);
  s.pt = io->pt;
  s.pl = io->pl;
  s.x_bf16 = io->x_bf16;
  s.bf16 = io->bf16_products && s.r == 3 && !s.wide; /* 5x5: f32 (see kn_wino_io) */
  return s;
}

void kn_winograd_conv(kn_graph *g, const kn_wino_io *io, const void *w, int w_bf16, int flip,
                      const float *bias, int relu, float *y, uint16_t *y_copy) {
  if (io->direct) { /* no transforms: directly on AMX tiles */
    kn_amx_conv_direct(g, io, w, w_bf16, flip, bias, relu, y, y_copy);
    return;
  }
  conv_job j = {.s = io_shape(io, 0, 0, 0),
                .x = io->x,
                .w = w,
                .w_bf16 = w_bf16,
                .flip = flip,
                .bias = bias,
                .relu = relu,
                .y = y,
                .y_copy = y_copy,
                .u = g->conv_buf,
                .round = io->round_y,
                .add = io->add};
  j.scratch = j.u + kernel_floats(&j.s);
  kn_pool_for(g->pool, j.s.bf16 ? (io->cin + 1) / 2 : io->cin, kernel_range, &j);
  /* each phase its own product of the one transformed kernel (one phase
   * where undilated); each output is written by one phase */
  for (int py = 0; py < j.s.d; py++) {
    for (int px = 0; px < j.s.d; px++) {
      j.s = io_shape(io, py, px, 0);
      if (j.s.tiles == 0) continue;
      if (j.s.wide) {
        conv_wide(g, &j);
        continue;
      }
      j.blocks = (j.s.tiles + j.s.tb - 1) / j.s.tb;
      j.amx = j.s.bf16 && io->amx;
      kn_pool_share(g->pool, j.blocks, 1, conv_range, &j);
    }
  }
}

/* ---- weight gradients ---- */

typedef struct wgrad_job {
  wino_shape s;
  const void *x;  /* the input */
  const void *dy; /* (batch, oh, ow, cout), f32 or (dy_bf16) bf16 */
  int dy_bf16;
  float *dw;       /* (r, r, cin, cout) */
  float *b_sums;   /* or NULL: dy's column sums */
  float *partials; /* slices x (NPOS x cp x fp + fp) */
  float *scratch;
  int again; /* a dilated product's phase after the first: its sums add to the slices' */
  int amx;   /* bf16 products on AMX tiles (amx.h) */
} wgrad_job;

/* A y: M (4 or 2) values a stride apart to 6. */
AVX512 static INLINE void a_of(const int M, const v16 *y, int s, v16 *z, int zs) {
  if (M == 4)
    a4(y, s, z, zs);
  else
    a2(y, s, z, zs);
}

/* One vector of channels (n of them) of one tile's dy, whose first output
 * is at dy + at, into the transformed domain, position p at out[p * fp]
 * (A y A^T: the columns, then the rows), zero past the output's rows and
 * cols; the tile's values added to *sum, row by row. Each value is read
 * once and the M x M of them and the 6 x M columns stay in registers.
 * Inlined for each tile side M, for f32 and bf16 dy, and for out in f32
 * or (pairs) half of each 32-bit word, as transform_patch's ob 2. */
AVX512 static INLINE void transform_dy_vec(const wino_shape *s, const void *dy, size_t at, int rows,
                                           int cols, int n, void *out, v16 *sum, const int M,
                                           const int bf16, const int pairs, int odd) {
  const size_t rs = (size_t)s->yw * s->d * s->cout, cs = (size_t)s->d * s->cout;
  const __mmask16 lanes = lanes_mask(n);
  v16 y[M_MAX][M_MAX], t[T_IN][M_MAX];
#pragma GCC unroll 4
  for (int i = 0; i < M; i++)
#pragma GCC unroll 4
    for (int k = 0; k < M; k++) {
      const size_t e = at + (size_t)i * rs + (size_t)k * cs;
      if (i >= rows || k >= cols)
        y[i][k] = (v16){0};
      else if (bf16)
        y[i][k] = load_n(dy, 1, e, n);
      else
        y[i][k] = (v16)_mm512_maskz_loadu_ps(lanes, (const float *)dy + e);
      *sum += y[i][k];
    }
#pragma GCC unroll 4
  for (int k = 0; k < M; k++) {
    v16 c[M_MAX], z[T_IN];
#pragma GCC unroll 4
    for (int i = 0; i < M; i++) c[i] = y[i][k];
    a_of(M, c, 1, z, 1); /* column k */
#pragma GCC unroll 6
    for (int i = 0; i < T_IN; i++) t[i][k] = z[i];
  }
#pragma GCC unroll 6
  for (int i = 0; i < T_IN; i++) {
    v16 z[T_IN];
    a_of(M, t[i], 1, z, 1); /* row i */
#pragma GCC unroll 6
    for (int k = 0; k < T_IN; k++) {
      const size_t q = (size_t)(i * T_IN + k) * s->fp;
      if (pairs)
        store_pair_half((uint32_t *)out + q, (__m512)z[k], odd);
      else
        _mm512_storeu_ps((float *)out + q, (__m512)z[k]);
    }
  }
}

/* dy of tiles [t0, t0 + nt) into the transformed domain (tile r's
 * position p at md[(r * NPOS + p) * fp]; with pairs, tiles r and r + 1, r
 * even, in the 32-bit words md[(r / 2 * NPOS + p) * fp]), zero past the
 * output's edge; their column sums added to bsum. Inlined for each tile
 * side M, for f32 and bf16 dy, and for each layout. */
AVX512 static INLINE void transform_dy_m(const wgrad_job *j, int64_t t0, int nt, void *md,
                                         float *bsum, const int M, const int bf16,
                                         const int pairs) {
  const wino_shape *s = &j->s;
  tile_walk w = tile_walk_at(s, t0);
  for (int r = 0; r < nt; r++, tile_walk_next(s, &w)) {
    int rows, cols;
    tile_extent(s, &w.t, &rows, &cols);
    if (w.near.t < s->tiles)
      prefetch_patch(j->dy, bf16 ? 2 : 4, s, &w.near, M, 0, 0, s->yh, s->yw, s->cout, AHEAD_L1, 0);
    if (w.far.t < s->tiles)
      prefetch_patch(j->dy, bf16 ? 2 : 4, s, &w.far, M, 0, 0, s->yh, s->yw, s->cout, AHEAD_L2, 0);
    const size_t at0 = phase_out_at(s, w.t.b, w.t.oy, w.t.ox);
    for (int f0 = 0; f0 < s->fp; f0 += VL) {
      const int n = s->cout - f0 < VL ? s->cout - f0 : VL;
      v16 sum = (v16)_mm512_loadu_ps(bsum + f0);
      void *out = pairs ? (void *)((uint32_t *)md + (size_t)(r / 2) * NPOS * s->fp + f0)
                        : (void *)((float *)md + (size_t)r * NPOS * s->fp + f0);
      transform_dy_vec(s, j->dy, at0 + f0, rows, cols, n, out, &sum, M, bf16, pairs, r & 1);
      _mm512_storeu_ps(bsum + f0, (__m512)sum);
    }
  }
}

/* transform_dy_m for the product's tile side and dy's type, md in f32 or
 * (pairs) in pairs of tiles. */
AVX512 static void transform_dy(const wgrad_job *j, int64_t t0, int nt, void *md, float *bsum,
                                int pairs) {
  switch ((j->s.m == 4) * 4 + (j->dy_bf16 != 0) * 2 + (pairs != 0)) {
  case 0: transform_dy_m(j, t0, nt, md, bsum, 2, 0, 0); break;
  case 1: transform_dy_m(j, t0, nt, md, bsum, 2, 0, 1); break;
  case 2: transform_dy_m(j, t0, nt, md, bsum, 2, 1, 0); break;
  case 3: transform_dy_m(j, t0, nt, md, bsum, 2, 1, 1); break;
  case 4: transform_dy_m(j, t0, nt, md, bsum, 4, 0, 0); break;
  case 5: transform_dy_m(j, t0, nt, md, bsum, 4, 0, 1); break;
  case 6: transform_dy_m(j, t0, nt, md, bsum, 4, 1, 0); break;
  default: transform_dy_m(j, t0, nt, md, bsum, 4, 1, 1); break;
  }
}

/* One position's pairs of tiles [0, nk) (pair k's cp channels at
 * vp + k * ks) channel by channel for the AMX tiles' A: channel ci's
 * pairs at xt[ci * kp], zeros from nk to kp (a multiple of 16). */
AVX512 static void pairs_by_channel(const uint32_t *vp, size_t ks, int nk, int cp, int kp,
                                    uint32_t *xt) {
  for (int c0 = 0; c0 < cp; c0 += VL) {
    for (int k0 = 0; k0 < kp; k0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; i++)
        r[i] = k0 + i < nk ? _mm512_loadu_si512(vp + (size_t)(k0 + i) * ks + c0)
                           : _mm512_setzero_si512();
      kn_transpose16_avx512(r);
      for (int i = 0; i < 16; i++) _mm512_storeu_si512(xt + (size_t)(c0 + i) * kp + k0, r[i]);
    }
  }
}

/* Slices [s0, s1) of the tiles, each into its own sums, in slot's block
 * of the buffer. */
static void wgrad_range(void *ctx, int slot, int64_t s0, int64_t s1) {
  const wgrad_job *j = ctx;
  const wino_shape *s = &j->s;
  const size_t per = (size_t)NPOS * s->cp * s->fp + (size_t)s->fp;
  if (j->amx) kn_amx_configure(16, 16);
  float *v = j->scratch + (size_t)slot * slot_floats(s);
  float *md = v + (size_t)NPOS * s->tb * s->cp;
  for (int64_t sl = s0; sl < s1; sl++) {
    float *du = j->partials + (size_t)sl * per, *bsum = du + (size_t)NPOS * s->cp * s->fp;
    if (!j->again) memset(du, 0, per * sizeof(float));
    const int64_t lo = s->tiles * sl / s->slices, hi = s->tiles * (sl + 1) / s->slices;
    for (int64_t first = lo; first < hi; first += s->tb) {
      const int nt = hi - first < s->tb ? (int)(hi - first) : s->tb;
      if (s->bf16) { /* pairs of tiles (the last, where nt is odd, with zeros) */
        uint32_t *vp = (uint32_t *)(void *)v, *dp = (uint32_t *)(void *)md;
        transform_input_pairs(s, j->x, first, nt, vp);
        transform_dy(j, first, nt, dp, bsum, 1);
        if (j->amx) { /* dU (cp x fp) += x^T dy: x's pairs channel by channel */
          const int nk = (nt + 1) / 2, kp = round_up(nk, 16);
          uint32_t *xt = vp + (size_t)NPOS * s->cp * ((s->tb + 1) / 2); /* past the pairs */
          if (kp > nk) /* dy's rows past the block, zeros for the tiles */
            memset(dp + (size_t)nk * NPOS * s->fp, 0,
                   (size_t)(kp - nk) * NPOS * s->fp * sizeof *dp);
          for (int p = 0; p < NPOS; p++) {
            pairs_by_channel(vp + (size_t)p * s->cp, (size_t)NPOS * s->cp, nk, s->cp, kp, xt);
            kn_amx_gemm(s->cp, s->fp, kp, 16, 16, (const uint16_t *)(const void *)xt,
                        (ptrdiff_t)2 * kp, dp + (size_t)p * s->fp, (ptrdiff_t)NPOS * s->fp,
                        du + (size_t)p * s->cp * s->fp, s->fp, 1);
          }
          continue;
        }
        for (int p = 0; p < NPOS; p++)
          block_gemm_bf16(s->cp, s->fp, (nt + 1) / 2, (const uint16_t *)(vp + (size_t)p * s->cp), 2,
                          (ptrdiff_t)2 * NPOS * s->cp, dp + (size_t)p * s->fp,
                          (ptrdiff_t)NPOS * s->fp, du + (size_t)p * s->cp * s->fp, s->fp, 1, 0);
        continue;
      }
      transform_input(s, j->x, first, nt, v);
      transform_dy(j, first, nt, md, bsum, 0);
      for (int p = 0; p < NPOS; p++)
        block_gemm(s->cp, s->fp, nt, v + (size_t)p * s->cp, 1, (ptrdiff_t)NPOS * s->cp,
                   md + (size_t)p * s->fp, (ptrdiff_t)NPOS * s->fp, du + (size_t)p * s->cp * s->fp,
                   s->fp, 1, 0);
    }
  }
  if (j->amx) kn_amx_release();
}

/* G^T u: 6 values a stride apart to r. */
AVX512 static INLINE void gt_of(const int r, const v16 *u, int s, v16 *g, int gs) {
  if (r == 3)
    gt6(u, s, g, gs);
  else
    gt6_5(u, s, g, gs);
}

/* The slices added in order, then each channel's 6x6 sums back to its
 * r x r gradient: input channels [c0, c1) (and, with c0 == 0, the bias
 * sums). */
AVX512 static void wgrad_finish(const wgrad_job *j, int c0, int c1) {
  const wino_shape *s = &j->s;
  const int r = s->r;
  const size_t per = (size_t)NPOS * s->cp * s->fp + (size_t)s->fp;
  for (int ci = c0; ci < c1; ci++) {
    for (int f0 = 0; f0 < s->fp; f0 += VL) {
      const __mmask16 m = lanes_mask(s->cout - f0);
      v16 u[NPOS], t[R_MAX * T_IN], g[R_MAX * R_MAX];
      for (int p = 0; p < NPOS; p++) {
        const size_t at = ((size_t)p * s->cp + ci) * s->fp + f0;
        v16 sum = (v16)_mm512_loadu_ps(j->partials + at);
        for (int sl = 1; sl < s->slices; sl++)
          sum += (v16)_mm512_loadu_ps(j->partials + sl * per + at);
        u[p] = sum;
      }
      for (int k = 0; k < T_IN; k++) gt_of(r, u + k, T_IN, t + k, T_IN); /* columns: r x 6 */
      for (int i = 0; i < r; i++) gt_of(r, t + i * T_IN, 1, g + i * r, 1);
      for (int k = 0; k < r * r; k++)
        _mm512_mask_storeu_ps(j->dw + ((size_t)k * s->cin + ci) * s->cout + f0, m, (__m512)g[k]);
    }
  }
  if (c0 == 0 && j->b_sums) {
    for (int f0 = 0; f0 < s->fp; f0 += VL) {
      const size_t at = (size_t)NPOS * s->cp * s->fp + f0;
      v16 sum = (v16)_mm512_loadu_ps(j->partials + at);
      for (int sl = 1; sl < s->slices; sl++)
        sum += (v16)_mm512_loadu_ps(j->partials + sl * per + at);
      _mm512_mask_storeu_ps(j->b_sums + f0, lanes_mask(s->cout - f0), (__m512)sum);
    }
  }
}

static void dy_parts(void *ctx, int64_t p0, int64_t p1) {
  const chunk_job *c = ctx;
  for (int64_t p = p0; p < p1; p++) {
    int a, b;
    part_tiles(c, p, &a, &b);
    if (b > a)
      transform_dy(c->wgrad, c->first + a, b - a, c->mo + (size_t)a * NPOS * c->s->fp,
                   c->bsums + (size_t)p * c->s->fp, 0);
  }
}

/* A wide weight gradient: chunk by chunk, x and dy transformed in parts
 * (each part's bias sums its own, added in part order), each position's
 * sums dU += V^T (A dy A^T) over the chunk on kiln's GEMM, into the one
 * slice wgrad_finish reads. */
static void wgrad_wide(kn_graph *g, const wgrad_job *j) {
  const wino_shape *s = &j->s;
  float *du = j->partials, *bsum = du + (size_t)NPOS * s->cp * s->fp;
  chunk_job c = {.s = s, .x = j->x, .wgrad = j, .v = j->scratch, .bsums = bsum + s->fp};
  c.mo = c.v + (size_t)NPOS * s->tb * s->cp;
  if (!j->again) memset(bsum, 0, (size_t)s->fp * sizeof(float));
  for (c.first = 0; c.first < s->tiles; c.first += s->tb) {
    c.nt = s->tiles - c.first < s->tb ? (int)(s->tiles - c.first) : s->tb;
    c.parts = c.nt < PARTS ? c.nt : PARTS;
    memset(c.bsums, 0, (size_t)c.parts * s->fp * sizeof(float));
    kn_pool_for(g->pool, c.parts, input_parts, &c);
    kn_pool_for(g->pool, c.parts, dy_parts, &c);
    for (int p = 0; p < c.parts; p++)
      for (int f = 0; f < s->fp; f++) bsum[f] += c.bsums[(size_t)p * s->fp + f];
    for (int p = 0; p < NPOS; p++) {
      const kn_sgemm_args x = {.ta = 1,
                               .m = s->cin,
                               .n = s->fp,
                               .k = c.nt,
                               .a = c.v + (size_t)p * s->cp,
                               .lda = NPOS * s->cp,
                               .b = c.mo + (size_t)p * s->fp,
                               .ldb = NPOS * s->fp,
                               .c = du + (size_t)p * s->cp * s->fp,
                               .ldc = s->fp,
                               .accumulate = c.first > 0 || j->again};
      kn_sgemm_run(g, &x);
    }
  }
}

/* Input channels [c0, c1) of the gradient. */
static void finish_range(void *ctx, int64_t c0, int64_t c1) {
  wgrad_finish(ctx, (int)c0, (int)c1);
}

void kn_winograd_wgrad(kn_graph *g, const kn_wino_io *io, const void *dy, int dy_bf16, float *dw,
                       float *b_sums) {
  if (io->direct) { /* no transforms: directly on AMX tiles */
    kn_amx_conv_wgrad(g, io, dy, dy_bf16, dw, b_sums);
    return;
  }
  wgrad_job j = {.s = io_shape(io, 0, 0, 1),
                 .x = io->x,
                 .dy = dy,
                 .dy_bf16 = dy_bf16,
                 .dw = dw,
                 .b_sums = b_sums};
  /* the buffer: the slices' sums, then each thread's block (or the chunk) */
  j.partials = g->conv_buf;
  j.scratch = j.partials + partial_floats(&j.s);
  /* A dilated product's phases add to the same slices, in phase order,
   * their number fixed by the first (the largest) phase: the same sums in
   * the same order for any thread count. */
  const int slices = j.s.slices;
  for (int py = 0; py < j.s.d; py++) {
    for (int px = 0; px < j.s.d; px++) {
      const int again = py + px > 0;
      j.s = io_shape(io, py, px, 1);
      j.s.slices = slices;
      j.again = again;
      if (j.s.tiles == 0) continue;
      if (j.s.wide) {
        wgrad_wide(g, &j);
      } else {
        j.amx = j.s.bf16 && io->amx;
        kn_pool_share(g->pool, j.s.slices, 1, wgrad_range, &j);
      }
    }
  }
  kn_pool_for(g->pool, io->cin, finish_range, &j);
}

/* KILN_WINOGRAD=off keeps every convolution on the GEMM (to compare). */
int kn_winograd_available(void) {
  const char *env = getenv("KILN_WINOGRAD");
  return kn_cpu_features_get()->avx512f && !(env && strcmp(env, "off") == 0);
}

static atomic_int bf16_off;

void kn_winograd_set_bf16(int on) {
  atomic_store(&bf16_off, !on);
}

int kn_winograd_bf16_products(void) {
  const char *env = getenv("KILN_WINOGRAD");
  return kn_cpu_features_get()->avx512f && kn_cpu_features_get()->avx512bf16 &&
         !atomic_load(&bf16_off) && !(env && strcmp(env, "f32") == 0);
}

#else /* no AVX-512 paths in this build: the pass marks no node */

int kn_winograd_available(void) {
  return 0;
}

int kn_winograd_bf16_products(void) {
  return 0;
}

void kn_winograd_set_bf16(int on) {
  (void)on;
}
#endif
