/* amx.h — bf16 products on Intel AMX tiles (AMX-BF16), for the bf16
 * GEMM (cpu_gemm.c) and Winograd's bf16 products (winograd.c).
 *
 * A tile holds up to 16 rows of 64 bytes. One TDPBF16PS adds to a C tile
 * (16 x 16 f32) the product of an A tile (16 rows, each up to 16 pairs
 * of bf16 values along the sums) and a B tile (one row per pair, 16
 * lanes of pairs, low depth first): the layout kiln's packed B panels
 * and Winograd's transformed kernels already have. Where a CPU has AMX,
 * one core does about ten times the multiply-adds per cycle that
 * AVX512-BF16's vdpbf16ps does (which runs at half the f32 FMA's rate on
 * the same CPUs), so mixed_bfloat16's products take the tiles.
 *
 * Bits: each bf16 x bf16 product is exact, and the sums are in f32, but
 * the tile unit adds a pair's two products in its own way, not as
 * vdpbf16ps does: a product summed on tiles can differ from the same
 * product summed by vdpbf16ps in its last bits. Each element's order is
 * fixed by the shape, so results are the same bits for any thread count
 * on a CPU with AMX. KILN_AMX=off (or kn_amx_set(0) before a graph
 * compiles) keeps the vdpbf16ps kernels.
 *
 * Threads: a thread loads a tile configuration before it uses the tiles
 * (kn_amx_configure) and releases them after (kn_amx_release), within one
 * task; nothing else in kiln uses the tiles in between. */
#ifndef KILN_ENGINE_AMX_H
#define KILN_ENGINE_AMX_H

#include <stddef.h>
#include <stdint.h>

/* Whether bf16 products take AMX tiles: the CPU has AMX-BF16, the kernel
 * granted this process the tile state, and neither KILN_AMX=off nor
 * kn_amx_set(0) turned them off. */
int kn_amx_available(void);
/* Tests: turns the tiles off (0) or back on (1) for products that run
 * after it (a graph decides at compile). */
void kn_amx_set(int on);

/* Loads the thread's tile configuration for products kt pairs deep per
 * tile step (1 .. 16) on row blocks of 16 + r2 rows (r2 1 .. 16). */
void kn_amx_configure(int kt, int r2);
void kn_amx_release(void);

/* The tile depth for kp pairs: the largest divisor of kp up to 16, or 16
 * where that is small (the last kp % 16 pairs then go through a
 * zero-padded copy, which is slow: a tile load that reads fresh stores
 * waits for them). */
static inline int kn_amx_depth(int kp) {
  if (kp <= 16) return kp;
  for (int kt = 16; kt >= 8; kt--)
    if (kp % kt == 0) return kt;
  return 16;
}

/* c (rows x cols, f32, ldc floats a row) = (accumulate ? c : 0) + a b,
 * summed over kp pairs: a's row r, pair k is the 32-bit word at
 * a + r * lda + 2 k (bf16 values, lda in bf16 values); b's pair row k,
 * lane j is the word b[k * ldb + j] (ldb in words). rows is a multiple
 * of 16 + r2 (with r2 16, of 16) and cols of 16; under
 * kn_amx_configure(kt, r2). */
void kn_amx_gemm(int rows, int cols, int kp, int kt, int r2, const uint16_t *a, ptrdiff_t lda,
                 const uint32_t *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc, int accumulate);

/* A convolution's block read in place (an implicit GEMM, cpu_gemm.c):
 * c (32 rows x 16 nc2 columns, f32, 32 floats a row) = the sums over nk
 * depth chunks of kt pairs: chunk q's A rows are 32 rows of 2 kt bf16
 * values at a + at[q] + r * stride (stride in bf16 values: the rows may
 * overlap, as a convolution's pixels' columns do), its B the kt pair rows
 * b + q * kt * ldb (ldb words a row, 16 nc2 lanes). Under
 * kn_amx_configure(kt, 16). */
void kn_amx_conv_block(int nc2, const uint16_t *a, ptrdiff_t stride, const ptrdiff_t *at, int nk,
                       int kt, const uint32_t *b, ptrdiff_t ldb, float *c);

#endif
