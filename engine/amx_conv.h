/* amx_conv.h — stride-1 convolutions on AMX tiles, their columns read in
 * place (amx_conv.c): the bf16 GEMM's products over a padded input
 * (cpu_gemm.c) and the products the winograd pass hands them (winograd.c,
 * which pads the input a band of rows at a time).
 *
 * Rows taken at the padded width: output pixel v = y wp + x of a band of
 * rows (x < wp, the pixels x >= ow computed and dropped) reads, for
 * kernel row ki, kw c values side by side at (v + ki dh wp) c, and pixels
 * v, v + 1 are c values apart, so a tile load of 16 such rows at a stride
 * of c values reads them in place (the rows overlap). The depth goes in
 * chunks of up to 16 pairs that never leave a kernel row, in the GEMM's
 * depth order (tap, channel). Each output is summed over the whole depth
 * in chunk order by one call: the same bits for any thread count. */
#ifndef KILN_ENGINE_AMX_CONV_H
#define KILN_ENGINE_AMX_CONV_H

#include <stddef.h>
#include <stdint.h>

#define KN_AMX_CONV_CHUNKS 64

/* The rows' sums reach `store`: `rows` output pixels from `pixel` (in the
 * output's order, (b oh + y) ow + x), their sums 32 floats a row from
 * sums (lanes [c0, c0 + lanes) of C). */
typedef void (*kn_amx_conv_store)(void *ctx, const float *sums, int rows, int64_t pixel, int c0,
                                  int lanes);

typedef struct kn_amx_conv {
  int c, kh, kw, dh, wp, ow,
      n;      /* channels, kernel, row dilation, padded width, outputs, C columns */
  int kt, nk; /* pairs a depth chunk, chunks */
  ptrdiff_t at[KN_AMX_CONV_CHUNKS]; /* chunk q's place from a pixel's first value */
  int width, groups;                /* B's panels: groups of width (16 or 32) lanes */
  const uint32_t *b;                /* groups panels of kh kw c / 2 pair rows x width lanes */
} kn_amx_conv;

/* Whether a product of c channels (even), a kh x kw kernel and n columns
 * takes the tiles this way: a depth chunk of at least 8 pairs in at most
 * KN_AMX_CONV_CHUNKS chunks. */
int kn_amx_conv_shape_fits(int c, int kh, int kw, int n);
/* The shape's chunks and places (b set by the caller: kn_amx_conv_panel_words
 * words, B packed as pair rows of width lanes, group after group). */
void kn_amx_conv_setup(kn_amx_conv *cv, int c, int kh, int kw, int dh, int wp, int ow, int n);
size_t kn_amx_conv_panel_words(const kn_amx_conv *cv);
/* Values a block of 32 pixels reads from its first pixel's first value. */
ptrdiff_t kn_amx_conv_reach(const kn_amx_conv *cv);
/* The `out_rows` output rows of one image read from x (padded rows of wp
 * pixels, kh - 1 more than the outputs at dilation dh), its first output
 * pixel `pixel0`; x's first `readable` values may be read: a block whose
 * dropped rows would read past them reads a zero-padded copy in `spare`
 * (kn_amx_conv_reach values). Under kn_amx_configure(cv->kt, 16). */
void kn_amx_conv_rows(const kn_amx_conv *cv, const uint16_t *x, int out_rows, int64_t pixel0,
                      size_t readable, uint16_t *spare, kn_amx_conv_store store, void *ctx);

/* ---- the winograd pass's direct products (a node marked winograd 4) ----
 * A forward product or input gradient (flip: the kernel turned 180
 * degrees, its channels swapped) of a 3x3 kernel, undilated, on bf16
 * operands, reading its unpadded input where it lies (kn_wino_io: the
 * padding added as zeros): each task pads a band of output rows' input
 * rows into its thread's part of the buffer, then runs them as above;
 * bias, relu, the rounding of round_y, and the f32 and bf16 outputs as
 * kn_winograd_conv's. */
struct kn_wino_io;
struct kn_graph;
int kn_amx_conv_direct_fits(const struct kn_wino_io *io);
size_t kn_amx_conv_direct_floats(int threads, const struct kn_wino_io *io);
void kn_amx_conv_direct(struct kn_graph *g, const struct kn_wino_io *io, const void *w, int w_bf16,
                        int flip, const float *bias, int relu, float *y, uint16_t *y_copy);

/* A weight gradient of a 3x3 kernel, undilated, over multiples of 16
 * input and output channels, directly on the tiles (a node marked
 * winograd 4, amx_conv.c): dw (3, 3, cin, cout) and, where b_sums is not
 * NULL, the bias gradient (dy summed over the pixels); dy f32 (rounded to
 * bf16 as it is read) or bf16. kn_amx_conv_wgrad_fits: the shape, and one
 * image's two copies within a thread's megabyte. */
int kn_amx_conv_wgrad_fits(const struct kn_wino_io *io);
size_t kn_amx_conv_wgrad_floats(int threads, const struct kn_wino_io *io);
void kn_amx_conv_wgrad(struct kn_graph *g, const struct kn_wino_io *io, const void *dy, int dy_bf16,
                       float *dw, float *b_sums);

#endif
