/* test_winograd.c — winograd.c's F(4x4, 3x3) and F(2x2, 5x5) products
 * against the direct convolution summed in double: the forward product (bias and relu), the
 * input gradient (the kernel turned around) and the weight gradient (and
 * the bias gradient beside it), with float32 operands and with bf16 ones
 * (mixed_bfloat16: widened as read, the bf16 copy of an output written as
 * a cast would, or the output in bf16 alone), over shapes that leave partial tiles at
 * the bottom and right, channel counts that are not whole vectors, inputs
 * stored padded and read as if padded, and batches that end in a partial
 * block; each the same bits on 1, 2 and 3 threads. Skips where the CPU has
 * no AVX-512F (the pass then never marks a node). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "amx.h"
#include "amx_conv.h"
#include "graph_internal.h"

typedef struct shape {
  int batch, h, w, cin, cout;
  int pt, pl; /* padding above and left ("same": 1 for 3x3, 2 for 5x5; "valid": 0) */
  int oh, ow;
  int r; /* the kernel's side; 0: 3 */
  int d; /* its dilation; 0: 1 */
  int s; /* its stride; 0: 1 (2: a weight gradient directly on AMX tiles only) */
} shape;

static int side(const shape *s) {
  return s->r ? s->r : 3;
}

static int dil(const shape *s) {
  return s->d ? s->d : 1;
}

static int stride(const shape *s) {
  return s->s ? s->s : 1;
}

static float uniform(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((*s >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f;
}

static float *randoms(size_t n, uint64_t seed) {
  float *v = malloc(n * sizeof *v);
  assert_non_null(v);
  for (size_t i = 0; i < n; i++) v[i] = uniform(&seed);
  return v;
}

/* x[b][y][x][c] with the padding read as zeros. */
static double at(const shape *s, const float *x, int b, int y, int xx, int c) {
  if (y < 0 || y >= s->h || xx < 0 || xx >= s->w) return 0.0;
  return x[(((size_t)b * s->h + y) * s->w + xx) * s->cin + c];
}

static kn_wino_io io_of(const shape *s, const void *x, int x_bf16) {
  return (kn_wino_io){.x = x,
                      .x_bf16 = x_bf16,
                      .r = side(s),
                      .d = dil(s),
                      .s = stride(s),
                      .batch = s->batch,
                      .hp = s->h,
                      .wp = s->w,
                      .cin = s->cin,
                      .pt = s->pt,
                      .pl = s->pl,
                      .oh = s->oh,
                      .ow = s->ow,
                      .cout = s->cout};
}

/* v rounded to bf16 in place; its bits into h. */
static void to_bf16(float *v, uint16_t *h, size_t n) {
  for (size_t i = 0; i < n; i++) {
    h[i] = kn_bf16_from_f32(v[i]);
    v[i] = kn_bf16_to_f32(h[i]);
  }
}

/* A graph of `threads` threads with a Winograd buffer for s's products,
 * and kiln's GEMM's packing space (the chunks of wide products run it). */
static kn_graph *graph_for(const shape *s, int threads) {
  kn_graph *g = calloc(1, sizeof *g);
  assert_non_null(g);
  g->threads = threads;
  g->pool = kn_pool_new(threads);
  size_t f = 0;
  for (int wgrad = 0; wgrad <= 1; wgrad++) {
    const size_t need = kn_winograd_floats(threads, side(s), dil(s), s->batch, s->h, s->w, s->cin,
                                           s->oh, s->ow, s->cout, wgrad, kn_amx_available());
    f = need > f ? need : f;
  }
  const kn_wino_io direct = io_of(s, NULL, 1);
  if (kn_amx_available() && kn_amx_conv_direct_fits(&direct)) {
    const size_t need = kn_amx_conv_direct_floats(threads, &direct);
    f = need > f ? need : f;
  }
  if (kn_amx_available() && kn_amx_conv_wgrad_fits(&direct)) {
    const size_t need = kn_amx_conv_wgrad_floats(threads, &direct);
    f = need > f ? need : f;
  }
  g->conv_buf = aligned_alloc(64, (f * sizeof(float) + 63) / 64 * 64);
  assert_non_null(g->conv_buf);
  const size_t packing = (size_t)threads * kn_gemm_workspace_floats() * sizeof(float);
  g->gemm_workspace = aligned_alloc(64, (packing + 63) / 64 * 64);
  assert_non_null(g->gemm_workspace);
  return g;
}

static void graph_free(kn_graph *g) {
  kn_pool_free(g->pool);
  free(g->conv_buf);
  free(g->gemm_workspace);
  free(g);
}

/* The largest |a - ref| over the largest |ref|, printed. */
static double rel_error(const float *a, const double *ref, size_t n, const char *what) {
  double top = 0.0, diff = 0.0;
  for (size_t i = 0; i < n; i++) {
    top = fmax(top, fabs(ref[i]));
    diff = fmax(diff, fabs((double)a[i] - ref[i]));
    if (isnan(a[i])) return INFINITY;
  }
  print_message("  %s: %.3g of the largest value (%.3g)\n", what, diff / top, top);
  return diff / top;
}

/* Float32 sums of r^2 x C products through the transforms: within 2^-16
 * of the largest output (2^-19 is seen for 3x3 kernels, 2^-18 for 5x5); a
 * lost tap or a misplaced tile is off by far more. */
#define TOLERANCE 0x1p-16

/* ---- bf16 products: F(4x4, 3x3) as winograd.c rounds it ----
 *
 * With bf16 products (kn_wino_io.bf16_products) the transformed input and
 * kernel are rounded to bf16: 8 significant bits, where the transforms
 * grow a value up to 100 times (B^T's rows sum to 10) and the output
 * transform cancels them back, so an output errs by a few percent of the
 * largest against the direct sums (2^-6 to 2^-4 over these shapes). The
 * check instead follows the rounding: the transforms in float32 in
 * winograd.c's order (this file is built without contraction, like it),
 * V and U rounded to bf16 as it rounds them, their products summed in
 * double and transformed back; the kernel sums the same exact products
 * in float32, so it stays within float32's rounding of that: 2^-14 of the
 * largest output (2^-18 is seen), where a lost tap, a misplaced tile or a
 * wrong pair of channels is off by a whole term. */
#define TOLERANCE_BF16_PRODUCTS 0x1p-14

static float fma_(float a, float x, float b) {
  return fmaf(a, x, b);
}

/* B^T d over 6 values a stride apart, in place, as winograd.c's bt6. */
static void bt6_f32(float *d, int s) {
  const float d0 = d[0], d1 = d[s], d2 = d[2 * s], d3 = d[3 * s], d4 = d[4 * s], d5 = d[5 * s];
  const float s12 = d1 + d2, s34 = d3 + d4, m12 = d1 - d2, m43 = d4 - d3, m31 = d3 - d1,
              m42 = d4 - d2;
  d[0] = fma_(4.0f, d0, fma_(-5.0f, d2, d4));
  d[s] = fma_(-4.0f, s12, s34);
  d[2 * s] = fma_(4.0f, m12, m43);
  d[3 * s] = fma_(2.0f, m31, m42);
  d[4 * s] = fma_(-2.0f, m31, m42);
  d[5 * s] = fma_(4.0f, d1, fma_(-5.0f, d3, d5));
}

/* G g: 3 values a stride apart to 6, as g3. */
static void g3_f32(const float *g, int s, float *u, int us) {
  const float g0 = g[0], g1 = g[s], g2 = g[2 * s], p = g0 + g2;
  u[0] = 0.25f * g0;
  u[us] = (p + g1) * (-1.0f / 6);
  u[2 * us] = (p - g1) * (-1.0f / 6);
  u[3 * us] = g0 * (1.0f / 24) + g1 * (1.0f / 12) + g2 * (1.0f / 6);
  u[4 * us] = g0 * (1.0f / 24) - g1 * (1.0f / 12) + g2 * (1.0f / 6);
  u[5 * us] = g2;
}

/* A y: 4 values a stride apart to 6, as a4. */
static void a4_f32(const float *y, int s, float *z, int zs) {
  const float y0 = y[0], y1 = y[s], y2 = y[2 * s], y3 = y[3 * s], p02 = y0 + y2, p13 = y1 + y3;
  z[0] = y0;
  z[zs] = p02 + p13;
  z[2 * zs] = p02 - p13;
  z[3 * zs] = fma_(4.0f, fma_(2.0f, y3, y2), fma_(2.0f, y1, y0));
  z[4 * zs] = fma_(4.0f, fma_(-2.0f, y3, y2), fma_(-2.0f, y1, y0));
  z[5 * zs] = y3;
}

static double bf16_of(float v) {
  return kn_bf16_to_f32(kn_bf16_from_f32(v));
}

static const double AT[4][6] = {
    {1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}};
static const double GM[6][3] = {{0.25, 0, 0},
                                {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                {0, 0, 1}};

/* Tile (ty, tx) of phase (py, px): its input patch's channel c into the
 * transformed domain, rounded: v[36]. */
static void patch_v(const shape *s, const float *x, int b, int py, int px, int ty, int tx, int c,
                    double *v) {
  const int d = dil(s);
  float t[36];
  for (int i = 0; i < 6; i++)
    for (int k = 0; k < 6; k++)
      t[i * 6 + k] =
          (float)at(s, x, b, py + d * (4 * ty + i) - s->pt, px + d * (4 * tx + k) - s->pl, c);
  for (int k = 0; k < 6; k++) bt6_f32(t + k, 6);     /* columns */
  for (int i = 0; i < 6; i++) bt6_f32(t + 6 * i, 1); /* rows */
  for (int p = 0; p < 36; p++) v[p] = bf16_of(t[p]);
}

/* The kernel's (c, f) (kern: the value at tap (ki, kj)) transformed and
 * rounded: u[36]. */
static void kernel_u(const float kern[9], double *u) {
  float t[18], o[36];
  for (int c = 0; c < 3; c++) g3_f32(kern + c, 3, t + c, 3); /* columns: t is 6 x 3 */
  for (int i = 0; i < 6; i++) g3_f32(t + 3 * i, 1, o + 6 * i, 1);
  for (int p = 0; p < 36; p++) u[p] = bf16_of(o[p]);
}

/* A tile of phase (py, px) of image b, the phase's outputs ph x pw, and
 * its transformed input patch v (C x 36, rounded). */
typedef struct emu_tile {
  int b, py, px, ty, tx, ph, pw;
  const double *v;
} emu_tile;

/* Where the tile's output (i, k) lies (times the channels), or -1 past the
 * phase's outputs. */
static ptrdiff_t tile_out(const shape *s, const emu_tile *t, int i, int k) {
  const int d = dil(s), oy = 4 * t->ty + i, ox = 4 * t->tx + k;
  if (oy >= t->ph || ox >= t->pw) return -1;
  return ((ptrdiff_t)t->b * s->oh + t->py + d * oy) * s->ow + t->px + d * ox;
}

/* fn on every tile of every phase of every image, in order. */
static void for_each_tile(const shape *s, const float *x,
                          void (*fn)(const shape *, const emu_tile *, void *), void *ctx) {
  const int d = dil(s);
  double *v = malloc((size_t)s->cin * 36 * sizeof *v);
  emu_tile t = {.v = v};
  for (t.b = 0; t.b < s->batch; t.b++)
    for (t.py = 0; t.py < d; t.py++)
      for (t.px = 0; t.px < d; t.px++) {
        t.ph = (s->oh - t.py + d - 1) / d, t.pw = (s->ow - t.px + d - 1) / d;
        for (t.ty = 0; t.ty < (t.ph + 3) / 4; t.ty++)
          for (t.tx = 0; t.tx < (t.pw + 3) / 4; t.tx++) {
            for (int c = 0; c < s->cin; c++)
              patch_v(s, x, t.b, t.py, t.px, t.ty, t.tx, c, v + (size_t)c * 36);
            fn(s, &t, ctx);
          }
      }
  free(v);
}

typedef struct emu_forward {
  const double *u; /* C x F x 36, rounded */
  const float *bias;
  int relu;
  double *ref;
} emu_forward;

static void forward_tile(const shape *s, const emu_tile *t, void *ctx) {
  const emu_forward *e = ctx;
  const int C = s->cin, F = s->cout;
  for (int f = 0; f < F; f++) {
    double m[36] = {0}, a[4][6];
    for (int c = 0; c < C; c++)
      for (int p = 0; p < 36; p++) m[p] += t->v[c * 36 + p] * e->u[((size_t)c * F + f) * 36 + p];
    for (int i = 0; i < 4; i++)
      for (int k = 0; k < 6; k++) {
        a[i][k] = 0;
        for (int q = 0; q < 6; q++) a[i][k] += AT[i][q] * m[q * 6 + k];
      }
    for (int i = 0; i < 4; i++)
      for (int k = 0; k < 4; k++) {
        const ptrdiff_t o = tile_out(s, t, i, k);
        if (o < 0) continue;
        double y = e->bias[f];
        for (int q = 0; q < 6; q++) y += a[i][q] * AT[k][q];
        e->ref[o * F + f] = e->relu && y < 0 ? 0 : y;
      }
  }
}

/* An undilated or dilated 3x3 product on bf16 products: ref as
 * check_forward's direct sums would be (bias, relu). */
static void emulate_forward(const shape *s, const float *x, const float *w, const float *bias,
                            int relu, int flip, double *ref) {
  const int C = s->cin, F = s->cout;
  double *u = malloc((size_t)C * F * 36 * sizeof *u);
  for (int c = 0; c < C; c++)
    for (int f = 0; f < F; f++) {
      float kern[9];
      for (int ki = 0; ki < 3; ki++)
        for (int kj = 0; kj < 3; kj++)
          kern[ki * 3 + kj] = flip ? w[(((size_t)(2 - ki) * 3 + (2 - kj)) * F + f) * C + c]
                                   : w[(((size_t)ki * 3 + kj) * C + c) * F + f];
      kernel_u(kern, u + ((size_t)c * F + f) * 36);
    }
  emu_forward e = {u, bias, relu, ref};
  for_each_tile(s, x, forward_tile, &e);
  free(u);
}

typedef struct emu_wgrad {
  const float *dy;
  double *du, *dd; /* C x F x 36 sums; F x 36, a tile's transformed dy (rounded) */
} emu_wgrad;

static void wgrad_tile(const shape *s, const emu_tile *t, void *ctx) {
  const emu_wgrad *e = ctx;
  const int C = s->cin, F = s->cout;
  for (int f = 0; f < F; f++) {
    float y[16], a[24], z[36];
    for (int i = 0; i < 4; i++)
      for (int k = 0; k < 4; k++) {
        const ptrdiff_t o = tile_out(s, t, i, k);
        y[i * 4 + k] = o < 0 ? 0.0f : e->dy[o * F + f];
      }
    for (int k = 0; k < 4; k++) a4_f32(y + k, 4, a + k, 4); /* columns: a is 6 x 4 */
    for (int i = 0; i < 6; i++) a4_f32(a + 4 * i, 1, z + 6 * i, 1);
    for (int p = 0; p < 36; p++) e->dd[(size_t)f * 36 + p] = bf16_of(z[p]);
  }
  for (int c = 0; c < C; c++)
    for (int f = 0; f < F; f++)
      for (int p = 0; p < 36; p++)
        e->du[((size_t)c * F + f) * 36 + p] += t->v[c * 36 + p] * e->dd[(size_t)f * 36 + p];
}

/* The weight gradient on bf16 products: ref (3, 3, cin, cout). */
static void emulate_weight_grad(const shape *s, const float *x, const float *dy, double *ref) {
  const int C = s->cin, F = s->cout;
  emu_wgrad e = {dy, calloc((size_t)C * F * 36, sizeof(double)),
                 malloc((size_t)F * 36 * sizeof(double))};
  for_each_tile(s, x, wgrad_tile, &e);
  for (int c = 0; c < C; c++)
    for (int f = 0; f < F; f++) {
      const double *m = e.du + ((size_t)c * F + f) * 36;
      for (int ki = 0; ki < 3; ki++)
        for (int kj = 0; kj < 3; kj++) {
          double g = 0;
          for (int i = 0; i < 6; i++)
            for (int k = 0; k < 6; k++) g += GM[i][ki] * m[i * 6 + k] * GM[k][kj];
          ref[(((size_t)ki * 3 + kj) * C + c) * F + f] = g;
        }
    }
  free(e.du);
  free(e.dd);
}

/* flip: the input gradient's form, w (r, r, cout, cin) turned around;
 * bf16: x and w in bf16 (mixed_bfloat16), and y's bf16 copy written; with
 * bf16 2, on bf16 products too (their outputs differ from 1's). */
/* bf16: x and w in bf16; 2: on bf16 products too; 3: directly on AMX
 * tiles (amx_conv.h), exact products summed in f32: held to the f32
 * products' tolerance. */
static void check_forward(const shape *s, int relu, int flip, int bf16) {
  const int r = side(s), d = dil(s);
  const size_t nx = (size_t)s->batch * s->h * s->w * s->cin, nw = (size_t)r * r * s->cin * s->cout;
  const size_t ny = (size_t)s->batch * s->oh * s->ow * s->cout;
  float *x = randoms(nx, 1), *w = randoms(nw, 2), *bias = randoms(s->cout, 3);
  uint16_t *xh = malloc(nx * 2), *wh = malloc(nw * 2), *copy = malloc(ny * 2);
  if (bf16) {
    to_bf16(x, xh, nx);
    to_bf16(w, wh, nw);
  }
  double *ref = malloc(ny * sizeof *ref);
  if (bf16 == 2) emulate_forward(s, x, w, bias, relu, flip, ref);
  for (int b = 0; bf16 != 2 && b < s->batch; b++)
    for (int y = 0; y < s->oh; y++)
      for (int xx = 0; xx < s->ow; xx++)
        for (int f = 0; f < s->cout; f++) {
          double sum = bias[f];
          for (int ki = 0; ki < r; ki++)
            for (int kj = 0; kj < r; kj++)
              for (int c = 0; c < s->cin; c++) {
                const double k =
                    flip ? w[(((size_t)(r - 1 - ki) * r + (r - 1 - kj)) * s->cout + f) * s->cin + c]
                         : w[(((size_t)ki * r + kj) * s->cin + c) * s->cout + f];
                sum += k * at(s, x, b, y + d * ki - s->pt, xx + d * kj - s->pl, c);
              }
          ref[(((size_t)b * s->oh + y) * s->ow + xx) * s->cout + f] = relu && sum < 0 ? 0 : sum;
        }
  float *first = NULL;
  for (int threads = 1; threads <= 3; threads++) {
    kn_graph *g = graph_for(s, threads);
    float *y = malloc(ny * sizeof *y);
    memset(y, 0xff, ny * sizeof *y); /* NaN: every output must be written */
    kn_wino_io io = io_of(s, bf16 ? (const void *)xh : x, bf16 != 0);
    io.bf16_products = bf16 >= 2;
    io.amx = kn_amx_available(); /* the tiles, where the CPU has them */
    io.direct = bf16 == 3;
    kn_winograd_conv(g, &io, bf16 ? (const void *)wh : w, bf16 != 0, flip, bias, relu, y,
                     bf16 ? copy : NULL);
    if (bf16) { /* the output in bf16 alone (y NULL): the same bits as the copy */
      uint16_t *only = malloc(ny * 2);
      memset(only, 0xff, ny * 2);
      kn_winograd_conv(g, &io, wh, 1, flip, bias, relu, NULL, only);
      assert_memory_equal(only, copy, ny * 2);
      free(only);
    }
    if (!first) {
      char what[128];
      snprintf(what, sizeof what, "%s %dx%d dilation %d, %dx%dx%d -> %dx%dx%d, batch %d%s%s",
               flip ? "input gradient" : "forward", r, r, d, s->h, s->w, s->cin, s->oh, s->ow,
               s->cout, s->batch, relu ? ", relu" : "",
               bf16 == 3   ? ", directly on AMX tiles"
               : bf16 == 2 ? ", bf16 products"
               : bf16      ? ", bf16 operands"
                           : "");
      assert_true(rel_error(y, ref, ny, what) <= (bf16 == 2 ? TOLERANCE_BF16_PRODUCTS : TOLERANCE));
      if (bf16 == 2) { /* the bf16 products ran: not the f32 products' bits */
        float *f32 = malloc(ny * sizeof *f32);
        io.bf16_products = 0;
        kn_winograd_conv(g, &io, wh, 1, flip, bias, relu, f32, NULL);
        assert_memory_not_equal(f32, y, ny * sizeof *y);
        free(f32);
      }
      for (size_t i = 0; bf16 && i < ny; i++) assert_int_equal(copy[i], kn_bf16_from_f32(y[i]));
      first = y;
    } else {
      assert_memory_equal(first, y, ny * sizeof *y); /* the same bits on every thread count */
      free(y);
    }
    graph_free(g);
  }
  free(first);
  free(ref);
  free(x);
  free(w);
  free(bias);
  free(xh);
  free(wh);
  free(copy);
}

/* bf16: x and dy in bf16; 2: on bf16 products too; 3: directly on AMX
 * tiles (their sums in f32 over the exact products, as the definition's
 * over the bf16 values). */
static void check_weight_grad(const shape *s, int bf16) {
  const int r = side(s), d = dil(s);
  const size_t nx = (size_t)s->batch * s->h * s->w * s->cin, nw = (size_t)r * r * s->cin * s->cout;
  const size_t ny = (size_t)s->batch * s->oh * s->ow * s->cout;
  float *x = randoms(nx, 4), *dy = randoms(ny, 5);
  uint16_t *xh = malloc(nx * 2), *dyh = malloc(ny * 2);
  if (bf16) {
    to_bf16(x, xh, nx);
    to_bf16(dy, dyh, ny);
  }
  double *ref = calloc(nw + s->cout, sizeof *ref), *bref = ref + nw;
  if (bf16 == 2) emulate_weight_grad(s, x, dy, ref);
  for (int b = 0; b < s->batch; b++)
    for (int y = 0; y < s->oh; y++)
      for (int xx = 0; xx < s->ow; xx++)
        for (int f = 0; f < s->cout; f++) {
          const double dv = dy[(((size_t)b * s->oh + y) * s->ow + xx) * s->cout + f];
          bref[f] += dv;
          for (int ki = 0; ki < r; ki++)
            for (int kj = 0; kj < r; kj++)
              for (int c = 0; c < s->cin; c++)
                if (bf16 != 2)
                  ref[(((size_t)ki * r + kj) * s->cin + c) * s->cout + f] +=
                      dv * at(s, x, b, stride(s) * y + d * ki - s->pt,
                              stride(s) * xx + d * kj - s->pl, c);
        }
  float *first = NULL;
  for (int threads = 1; threads <= 3; threads++) {
    kn_graph *g = graph_for(s, threads);
    float *dw = malloc((nw + s->cout) * sizeof *dw), *bsum = dw + nw;
    memset(dw, 0xff, (nw + s->cout) * sizeof *dw);
    kn_wino_io io = io_of(s, bf16 ? (const void *)xh : x, bf16 != 0);
    io.bf16_products = bf16 >= 2;
    io.amx = kn_amx_available();
    io.direct = bf16 == 3;
    kn_winograd_wgrad(g, &io, bf16 ? (const void *)dyh : dy, bf16 != 0, dw, bsum);
    if (!first) {
      char what[128];
      snprintf(what, sizeof what,
               "weight gradient %dx%d dilation %d stride %d, %dx%dx%d -> %dx%dx%d, batch %d%s", r,
               r, d, stride(s), s->h, s->w, s->cin, s->oh, s->ow, s->cout, s->batch,
               bf16 == 3   ? ", directly on AMX tiles"
               : bf16 == 2 ? ", bf16 products"
               : bf16      ? ", bf16 operands"
                           : "");
      /* sums over every pixel of the batch: 2^-14 of the largest (bf16
       * products: of the emulation's) */
      assert_true(rel_error(dw, ref, nw, what) <= (bf16 == 2 ? TOLERANCE_BF16_PRODUCTS : 0x1p-14));
      if (bf16 == 2) {
        float *f32 = malloc((nw + s->cout) * sizeof *f32);
        io.bf16_products = 0;
        kn_winograd_wgrad(g, &io, dyh, 1, f32, f32 + nw);
        assert_memory_not_equal(f32, dw, nw * sizeof *dw);
        assert_memory_equal(f32 + nw, bsum, s->cout * sizeof *bsum); /* the sums of dy as read */
        free(f32);
      }
      assert_true(rel_error(bsum, bref, s->cout, "  its bias gradient") <= 0x1p-16);
      first = dw;
    } else {
      assert_memory_equal(first, dw, (nw + s->cout) * sizeof *dw);
      free(dw);
    }
    graph_free(g);
  }
  free(first);
  free(ref);
  free(x);
  free(dy);
  free(xh);
  free(dyh);
}

static int have_bf16_products(void) {
  if (kn_winograd_available() && kn_winograd_bf16_products()) return 1;
  print_message("SKIPPED: no AVX512-BF16 on this CPU (or KILN_WINOGRAD=off or f32): "
                "mixed_bfloat16's products stay in f32\n");
  return 0;
}

static int have_avx512(void) {
  if (kn_winograd_available()) return 1;
  print_message("SKIPPED: no AVX-512F on this CPU (or KILN_WINOGRAD=off): convolutions stay on "
                "the GEMM and winograd.c never runs\n");
  return 0;
}

/* "same" 3x3 convolutions (padding 1 all round, the input read as if
 * padded) and "valid" ones (none; the output 2 smaller), with the sizes
 * and channels of real layers and with awkward ones. */
static const shape shapes[] = {
    {.batch = 3, .h = 28, .w = 28, .cin = 16, .cout = 16, .pt = 1, .pl = 1, .oh = 28, .ow = 28},
    {.batch = 2, .h = 14, .w = 14, .cin = 32, .cout = 48, .pt = 1, .pl = 1, .oh = 14, .ow = 14},
    {.batch = 5, .h = 7, .w = 7, .cin = 64, .cout = 64, .pt = 1, .pl = 1, .oh = 7, .ow = 7},
    {.batch = 2, .h = 13, .w = 9, .cin = 9, .cout = 21, .pt = 1, .pl = 1, .oh = 13, .ow = 9},
    {.batch = 1, .h = 11, .w = 6, .cin = 33, .cout = 8, .pt = 0, .pl = 0, .oh = 9, .ow = 4},
    {.batch = 4, .h = 5, .w = 17, .cin = 8, .cout = 70, .pt = 1, .pl = 1, .oh = 5, .ow = 17},
    /* many tiles: several blocks and slices, the last ones partial */
    {.batch = 37, .h = 10, .w = 10, .cin = 12, .cout = 16, .pt = 1, .pl = 1, .oh = 10, .ow = 10},
    /* 5x5 kernels, F(2x2, 5x5): "same" (padding 2), odd sizes that leave
     * a row and a column of partial tiles, "valid" (the output 4 smaller),
     * and many tiles */
    {.batch = 3,
     .h = 14,
     .w = 14,
     .cin = 32,
     .cout = 32,
     .pt = 2,
     .pl = 2,
     .oh = 14,
     .ow = 14,
     .r = 5},
    {.batch = 2,
     .h = 11,
     .w = 7,
     .cin = 9,
     .cout = 21,
     .pt = 2,
     .pl = 2,
     .oh = 11,
     .ow = 7,
     .r = 5},
    {.batch = 1, .h = 12, .w = 9, .cin = 33, .cout = 8, .pt = 0, .pl = 0, .oh = 8, .ow = 5, .r = 5},
    {.batch = 29,
     .h = 9,
     .w = 8,
     .cin = 16,
     .cout = 40,
     .pt = 2,
     .pl = 2,
     .oh = 9,
     .ow = 8,
     .r = 5},
    /* dilated, by phases: "same" (padding d), sizes that leave phases of
     * unequal sizes, "valid" (the output 2d smaller), a dilated 5x5, and
     * many tiles */
    {.batch = 3,
     .h = 14,
     .w = 14,
     .cin = 16,
     .cout = 24,
     .pt = 2,
     .pl = 2,
     .oh = 14,
     .ow = 14,
     .d = 2},
    {.batch = 2,
     .h = 13,
     .w = 11,
     .cin = 9,
     .cout = 21,
     .pt = 3,
     .pl = 3,
     .oh = 13,
     .ow = 11,
     .d = 3},
    {.batch = 1,
     .h = 15,
     .w = 12,
     .cin = 17,
     .cout = 8,
     .pt = 0,
     .pl = 0,
     .oh = 11,
     .ow = 8,
     .d = 2},
    {.batch = 2,
     .h = 16,
     .w = 13,
     .cin = 16,
     .cout = 16,
     .pt = 4,
     .pl = 4,
     .oh = 16,
     .ow = 13,
     .r = 5,
     .d = 2},
    {.batch = 23,
     .h = 10,
     .w = 10,
     .cin = 12,
     .cout = 16,
     .pt = 2,
     .pl = 2,
     .oh = 10,
     .ow = 10,
     .d = 2},
};

static void forward_products_match_the_direct_convolution(void **state) {
  (void)state;
  if (!have_avx512()) skip();
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    check_forward(&shapes[i], 0, 0, 0);
    check_forward(&shapes[i], 1, 0, 0);
    check_forward(&shapes[i], 0, 0, 1);
  }
}

static void input_gradients_match_the_turned_kernel(void **state) {
  (void)state;
  if (!have_avx512()) skip();
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    /* dx of a "same" convolution: dy padded as x was, the kernel turned;
     * of a "valid" one: dy padded by d (r - 1) */
    shape s = shapes[i];
    if (s.pt == 0) {
      s = (shape){.batch = s.batch,
                  .h = s.oh,
                  .w = s.ow,
                  .cin = s.cout,
                  .cout = s.cin,
                  .pt = dil(&s) * (side(&s) - 1),
                  .pl = dil(&s) * (side(&s) - 1),
                  .oh = s.h,
                  .ow = s.w,
                  .r = s.r,
                  .d = s.d};
    } else {
      const int c = s.cin;
      s.cin = s.cout;
      s.cout = c;
    }
    check_forward(&s, 0, 1, 0);
    check_forward(&s, 0, 1, 1);
  }
}

static void weight_gradients_match_the_direct_sums(void **state) {
  (void)state;
  if (!have_avx512()) skip();
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    check_weight_grad(&shapes[i], 0);
    check_weight_grad(&shapes[i], 1);
  }
}

/* A forward product or input gradient the winograd pass runs directly on
 * AMX tiles (winograd 4: no transforms, the input padded a band of rows
 * at a time): every 3x3 undilated shape of an even channel count from 8
 * (a "valid" one's input gradient reading a padding of 2), against the
 * definition over the bf16 values, with bias and relu, its bf16 output
 * alone the copy's bits, the same bits on 1 to 3 threads. */
static void direct_products_on_amx_tiles_match_the_definition(void **state) {
  (void)state;
  if (!have_bf16_products() || !kn_amx_available()) {
    print_message("SKIPPED: no AMX-BF16 on this CPU (or KILN_AMX=off): no direct products\n");
    skip();
  }
  int ran = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    if (side(&shapes[i]) != 3 || dil(&shapes[i]) != 1) continue;
    shape t = shapes[i]; /* the input gradient's form, as a "same" one reads it */
    t.cin = shapes[i].cout;
    t.cout = shapes[i].cin;
    if (t.pt == 0) {
      t.h = shapes[i].oh, t.w = shapes[i].ow, t.oh = shapes[i].h, t.ow = shapes[i].w;
      t.pt = t.pl = side(&t) - 1;
    }
    const kn_wino_io forward = io_of(&shapes[i], NULL, 1), turned = io_of(&t, NULL, 1);
    if (kn_amx_conv_direct_fits(&forward)) {
      check_forward(&shapes[i], 1, 0, 3);
      ran++;
    }
    if (kn_amx_conv_direct_fits(&turned)) {
      check_forward(&t, 0, 1, 3);
      ran++;
    }
  }
  print_message("%d products directly on the tiles\n", ran);
  assert_true(ran >= 8);
}

/* Weight gradients directly on AMX tiles (amx_conv.c: the images of a
 * slice laid out one after another at the padded size, a GEMM a tap over
 * the slice, x transposed and dy in pair rows): every 3x3 undilated shape
 * over multiples of 16 channels, and "valid" and "same" ones of odd sizes
 * and batches of several slices with a partial last one, stride 1 and 2
 * (by the input's four phases), against the
 * definition over the bf16 values (2^-14 of the largest), the bias sums
 * too, the same bits on 1 to 3 threads. */
static void weight_gradients_on_amx_tiles_match_the_definition(void **state) {
  (void)state;
  if (!have_bf16_products() || !kn_amx_available()) {
    print_message("SKIPPED: no AMX-BF16 on this CPU (or KILN_AMX=off): no direct products\n");
    skip();
  }
  const shape more[] = {
      {.batch = 19, .h = 9, .w = 11, .cin = 16, .cout = 32, .pt = 0, .pl = 0, .oh = 7, .ow = 9},
      {.batch = 10, .h = 6, .w = 5, .cin = 48, .cout = 16, .pt = 1, .pl = 1, .oh = 6, .ow = 5},
      {.batch = 1, .h = 3, .w = 3, .cin = 16, .cout = 16, .pt = 0, .pl = 0, .oh = 1, .ow = 1},
      /* stride 2, by phases: "same" as TensorFlow pads it (none above an
       * even side), odd sides with a pad on each side, "valid" */
      {.batch = 3,
       .h = 28,
       .w = 28,
       .cin = 16,
       .cout = 32,
       .pt = 0,
       .pl = 0,
       .oh = 14,
       .ow = 14,
       .s = 2},
      {.batch = 11,
       .h = 13,
       .w = 9,
       .cin = 32,
       .cout = 16,
       .pt = 1,
       .pl = 1,
       .oh = 7,
       .ow = 5,
       .s = 2},
      {.batch = 2,
       .h = 11,
       .w = 8,
       .cin = 16,
       .cout = 48,
       .pt = 0,
       .pl = 0,
       .oh = 5,
       .ow = 3,
       .s = 2}};
  int ran = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0] + sizeof more / sizeof more[0]; i++) {
    const size_t n = sizeof shapes / sizeof shapes[0];
    const shape *s = i < n ? &shapes[i] : &more[i - n];
    if (side(s) != 3 || dil(s) != 1) continue;
    const kn_wino_io io = io_of(s, NULL, 1);
    if (!kn_amx_conv_wgrad_fits(&io)) continue;
    check_weight_grad(s, 3);
    ran++;
  }
  print_message("%d weight gradients directly on the tiles\n", ran);
  assert_true(ran >= 9);
}

/* Forward products, input gradients and weight gradients on bf16
 * products, over every 3x3 shape (dilated ones by phases): within
 * TOLERANCE_BF16_PRODUCTS of their emulation, and the same bits on 1 to 3
 * threads. 5x5 products stay in f32 (their transforms' constants reach
 * 16/24: a 5x5 weight gradient on bf16 products errs by up to 12% of its
 * largest value): asked for bf16 products, they give the f32 ones' bits. */
static void bf16_products_stay_within_their_rounding(void **state) {
  (void)state;
  if (!have_bf16_products()) skip();
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    if (side(&shapes[i]) != 3) continue;
    check_forward(&shapes[i], 1, 0, 2);
    shape t = shapes[i]; /* the input gradient's form, as a "same" one reads it */
    t.cin = shapes[i].cout;
    t.cout = shapes[i].cin;
    if (t.pt == 0) {
      t.h = shapes[i].oh, t.w = shapes[i].ow, t.oh = shapes[i].h, t.ow = shapes[i].w;
      t.pt = t.pl = dil(&t) * (side(&t) - 1);
    }
    check_forward(&t, 0, 1, 2);
    check_weight_grad(&shapes[i], 2);
  }
  const shape five = {.batch = 2,
                      .h = 9,
                      .w = 8,
                      .cin = 16,
                      .cout = 24,
                      .pt = 2,
                      .pl = 2,
                      .oh = 9,
                      .ow = 8,
                      .r = 5};
  const size_t nx = 2u * 9 * 8 * 16, nw = 25u * 16 * 24, ny = 2u * 9 * 8 * 24;
  float *x = randoms(nx, 13), *w = randoms(nw, 14), *y1 = malloc(ny * 4), *y2 = malloc(ny * 4);
  uint16_t *xh = malloc(nx * 2), *wh = malloc(nw * 2);
  to_bf16(x, xh, nx);
  to_bf16(w, wh, nw);
  kn_graph *g = graph_for(&five, 2);
  kn_wino_io io = io_of(&five, xh, 1);
  kn_winograd_conv(g, &io, wh, 1, 0, NULL, 0, y1, NULL);
  io.bf16_products = 1;
  kn_winograd_conv(g, &io, wh, 1, 0, NULL, 0, y2, NULL);
  assert_memory_equal(y1, y2, ny * 4);
  graph_free(g);
  free(x), free(w), free(y1), free(y2), free(xh), free(wh);
}

/* Wide products go by chunks of tiles, each position's GEMM over a chunk
 * on kiln's GEMM: with the limits lowered, small shapes take that path
 * (the kernel's 36 x 32 x 32 floats past 64 KiB; chunks of 28 or 24
 * tiles, the last partial), forward, input gradient and weight gradient,
 * f32 and bf16, against the direct sums and the same bits on 1 to 3
 * threads. */
static void wide_products_by_chunks_match_the_direct_sums(void **state) {
  (void)state;
  if (!have_avx512()) skip();
  kn_winograd_set_limits(64 << 10, 64 << 10, 256 << 10);
  const shape wide[] = {
      {.batch = 5, .h = 12, .w = 12, .cin = 24, .cout = 20, .pt = 1, .pl = 1, .oh = 12, .ow = 12},
      {.batch = 3, .h = 11, .w = 9, .cin = 40, .cout = 17, .pt = 0, .pl = 0, .oh = 9, .ow = 7},
      {.batch = 4,
       .h = 9,
       .w = 10,
       .cin = 24,
       .cout = 20,
       .pt = 2,
       .pl = 2,
       .oh = 9,
       .ow = 10,
       .r = 5},
      {.batch = 3,
       .h = 11,
       .w = 10,
       .cin = 24,
       .cout = 20,
       .pt = 2,
       .pl = 2,
       .oh = 11,
       .ow = 10,
       .d = 2},
  };
  for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++) {
    const shape *s = &wide[i];
    check_forward(s, 1, 0, 0);
    check_forward(s, 0, 0, 1);
    shape t = *s; /* the input gradient's form: channels swapped */
    t.cin = s->cout;
    t.cout = s->cin;
    check_forward(&t, 0, 1, 0);
    check_weight_grad(s, 0);
    check_weight_grad(s, 1);
  }
  kn_winograd_set_limits(0, 0, 0);
}

/* The input stored already padded (a materialized padded input, read with
 * no padding) gives the bits of the unpadded one read as if padded. */
static void a_padded_input_and_an_unpadded_one_give_the_same_bits(void **state) {
  (void)state;
  if (!have_avx512()) skip();
  const shape s = {
      .batch = 3, .h = 9, .w = 10, .cin = 17, .cout = 20, .pt = 1, .pl = 1, .oh = 9, .ow = 10};
  const shape p = {.batch = 3, .h = 11, .w = 12, .cin = 17, .cout = 20, .oh = 9, .ow = 10};
  float *x = randoms((size_t)s.batch * s.h * s.w * s.cin, 7), *w = randoms(9u * 17 * 20, 8);
  float *xp = calloc((size_t)p.batch * p.h * p.w * p.cin, sizeof *xp);
  for (int b = 0; b < s.batch; b++)
    for (int y = 0; y < s.h; y++)
      memcpy(xp + (((size_t)b * p.h + y + 1) * p.w + 1) * p.cin,
             x + (((size_t)b * s.h + y) * s.w) * s.cin, (size_t)s.w * s.cin * sizeof *x);
  const size_t ny = (size_t)s.batch * s.oh * s.ow * s.cout;
  float *y1 = malloc(ny * sizeof *y1), *y2 = malloc(ny * sizeof *y2);
  float *d1 = malloc(9u * 17 * 20 * sizeof *d1), *d2 = malloc(9u * 17 * 20 * sizeof *d2);
  kn_graph *g = graph_for(&p, 2);
  const kn_wino_io unpadded = io_of(&s, x, 0), padded = io_of(&p, xp, 0);
  kn_winograd_conv(g, &unpadded, w, 0, 0, NULL, 0, y1, NULL);
  kn_winograd_conv(g, &padded, w, 0, 0, NULL, 0, y2, NULL);
  assert_memory_equal(y1, y2, ny * sizeof *y1);
  kn_winograd_wgrad(g, &unpadded, y1, 0, d1, NULL);
  kn_winograd_wgrad(g, &padded, y1, 0, d2, NULL);
  assert_memory_equal(d1, d2, 9u * 17 * 20 * sizeof *d1);
  graph_free(g);
  free(x), free(w), free(xp), free(y1), free(y2), free(d1), free(d2);
}

/* The bf16 copy of an output is rounded as a cast rounds it
 * (kn_bf16_from_f32), NaN outputs and subnormal ones (a kernel scaled to
 * 1e-38) included: the CPU's own bf16 conversion would flush those; and
 * so are f32 outputs rounded as stored (kn_wino_io.round_y). */
static void the_bf16_copy_rounds_as_a_cast_does(void **state) {
  (void)state;
  if (!have_avx512()) skip();
  const shape s = {
      .batch = 2, .h = 8, .w = 8, .cin = 8, .cout = 24, .pt = 1, .pl = 1, .oh = 8, .ow = 8};
  const size_t nx = 2u * 8 * 8 * 8, nw = 9u * 8 * 24, ny = 2u * 8 * 8 * 24;
  float *x = randoms(nx, 9), *w = randoms(nw, 10), *y = malloc(ny * sizeof *y);
  uint16_t *copy = malloc(ny * sizeof *copy);
  x[3 * 8 + 2] = NAN; /* one pixel's channel: every output reading it */
  for (size_t i = 0; i < nw; i++) w[i] *= 1e-38f;
  kn_graph *g = graph_for(&s, 2);
  const kn_wino_io io = io_of(&s, x, 0);
  kn_winograd_conv(g, &io, w, 0, 0, NULL, 0, y, copy);
  int nans = 0, subnormals = 0;
  for (size_t i = 0; i < ny; i++) {
    assert_int_equal(copy[i], kn_bf16_from_f32(y[i]));
    nans += isnan(y[i]);
    subnormals += fpclassify(y[i]) == FP_SUBNORMAL;
  }
  print_message("  %d NaN and %d subnormal outputs of %zu\n", nans, subnormals, ny);
  assert_true(nans > 0 && subnormals > 0);
  /* round_y (an input gradient in place of a rounding cast after it): the
   * f32 outputs are the copy's values, widened */
  kn_wino_io rounded = io;
  rounded.round_y = 1;
  float *yr = malloc(ny * sizeof *yr);
  kn_winograd_conv(g, &rounded, w, 0, 0, NULL, 0, yr, NULL);
  for (size_t i = 0; i < ny; i++) {
    const uint32_t want = (uint32_t)copy[i] << 16;
    uint32_t got;
    memcpy(&got, &yr[i], sizeof got);
    if (got != want) fail_msg("output %zu: %08x, want %08x", i, got, want);
  }
  graph_free(g);
  free(x), free(w), free(y), free(yr), free(copy);
}

/* An f32 input read as if rounded to bf16 (x_bf16 2: mixed_bfloat16's bf16
 * padding of an f32 gradient, read in place) gives the bits of the same
 * input rounded beforehand and read as bf16, NaN and ties to even
 * included; 3x3 and 5x5, forward and the turned kernel, tails of channels. */
static void an_f32_input_rounded_as_read_matches_its_bf16_copy(void **state) {
  (void)state;
  if (!have_avx512()) skip();
  const shape cases[] = {
      {.batch = 2, .h = 9, .w = 10, .cin = 19, .cout = 20, .pt = 1, .pl = 1, .oh = 9, .ow = 10},
      {.batch = 2,
       .h = 8,
       .w = 7,
       .cin = 17,
       .cout = 9,
       .pt = 2,
       .pl = 2,
       .oh = 8,
       .ow = 7,
       .r = 5}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const shape *s = &cases[k];
    const int r = side(s);
    const size_t nx = (size_t)s->batch * s->h * s->w * s->cin,
                 nw = (size_t)r * r * s->cin * s->cout;
    const size_t ny = (size_t)s->batch * s->oh * s->ow * s->cout;
    float *x = randoms(nx, 11), *w = randoms(nw, 12), *rounded = malloc(nx * sizeof *x);
    x[5] = NAN;
    x[7] = 1.0f + 0x1p-8f; /* a tie: to even, 1.0 */
    x[9] = 1.0f + 0x3p-8f; /* a tie: to even, 1 + 2^-6 */
    memcpy(rounded, x, nx * sizeof *x);
    uint16_t *xh = malloc(nx * 2), *wh = malloc(nw * 2);
    to_bf16(rounded, xh, nx);
    to_bf16(w, wh, nw);
    float *y1 = malloc(ny * sizeof *y1), *y2 = malloc(ny * sizeof *y2);
    for (int flip = 0; flip <= 1; flip++) {
      /* (the turned kernel is (r, r, cout, cin): as many values) */
      kn_graph *g = graph_for(s, 2);
      const kn_wino_io as_read = io_of(s, x, 2), beforehand = io_of(s, xh, 1);
      kn_winograd_conv(g, &as_read, wh, 1, flip, NULL, 0, y1, NULL);
      kn_winograd_conv(g, &beforehand, wh, 1, flip, NULL, 0, y2, NULL);
      assert_memory_equal(y1, y2, ny * sizeof *y1);
      graph_free(g);
    }
    free(x), free(w), free(rounded), free(xh), free(wh), free(y1), free(y2);
  }
}

/* Which products are worth it: 3x3 or 5x5 kernels, 8 or more channels
 * each way, and outputs whose tiles (4x4 for 3x3 kernels, 2x2 for 5x5)
 * save at least half the multiplies. */
static void it_pays_where_it_saves_half_the_multiplies(void **state) {
  (void)state;
  assert_true(kn_winograd_pays(3, 1, 28, 28, 16, 16));
  assert_true(kn_winograd_pays(3, 1, 7, 7, 64, 64)); /* 4 tiles for 49 outputs: 144 vs 441 */
  assert_true(kn_winograd_pays(3, 1, 4, 4, 8, 8));
  assert_false(kn_winograd_pays(3, 1, 28, 28, 1, 16)); /* a first layer over one channel */
  assert_false(kn_winograd_pays(3, 1, 28, 28, 16, 4));
  assert_false(kn_winograd_pays(3, 1, 2, 2, 64, 64));  /* 36 products for 4 outputs: 36 direct */
  assert_false(kn_winograd_pays(3, 1, 5, 5, 64, 64));  /* 144 for 25 outputs: 225 direct */
  assert_true(kn_winograd_pays(5, 1, 28, 28, 32, 32)); /* 196 tiles: 7,056 vs 19,600 */
  assert_true(kn_winograd_pays(5, 1, 2, 2, 16, 16));   /* one tile: 36 vs 100 */
  assert_false(kn_winograd_pays(5, 1, 3, 3, 16, 16));  /* 4 tiles for 9 outputs: 144 vs 225 */
  assert_false(kn_winograd_pays(5, 1, 28, 28, 1, 32));
  assert_false(kn_winograd_pays(7, 1, 28, 28, 32, 32)); /* no 7x7 transforms */
  assert_false(kn_winograd_pays(1, 1, 28, 28, 32, 32));
  /* dilated: the phases' tiles (a 14x14 output of dilation 2: four 7x7
   * phases of 4 tiles, 64 against 196 outputs) */
  assert_true(kn_winograd_pays(3, 2, 14, 14, 16, 16));
  assert_true(kn_winograd_pays(3, 4, 28, 28, 32, 32));
  assert_false(kn_winograd_pays(3, 4, 8, 8, 32, 32)); /* 16 phases of 2x2: 16 tiles for 64 */
  assert_false(kn_winograd_pays(3, 0, 28, 28, 32, 32));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(forward_products_match_the_direct_convolution),
      cmocka_unit_test(input_gradients_match_the_turned_kernel),
      cmocka_unit_test(weight_gradients_match_the_direct_sums),
      cmocka_unit_test(bf16_products_stay_within_their_rounding),
      cmocka_unit_test(direct_products_on_amx_tiles_match_the_definition),
      cmocka_unit_test(weight_gradients_on_amx_tiles_match_the_definition),
      cmocka_unit_test(wide_products_by_chunks_match_the_direct_sums),
      cmocka_unit_test(a_padded_input_and_an_unpadded_one_give_the_same_bits),
      cmocka_unit_test(the_bf16_copy_rounds_as_a_cast_does),
      cmocka_unit_test(an_f32_input_rounded_as_read_matches_its_bf16_copy),
      cmocka_unit_test(it_pays_where_it_saves_half_the_multiplies),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
