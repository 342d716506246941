/* col2im_axis.h — one axis of a strided convolution's input gradient:
 * which outputs and taps read each input row (or column). Shared by
 * col2im (cpu_kernels_conv.inc) and the direct input gradient
 * (conv_dx.c). */
#ifndef KILN_COL2IM_AXIS_H
#define KILN_COL2IM_AXIS_H

/* One axis of col2im: the taps that read input row (or column) i, the
 * output o and tap k with o * s - pad + k * d == i, o in [0, O), taps in
 * descending order (so outputs ascending). Undilated, they depend on
 * i's remainder r = (i + pad) % s alone: r, r + s, ... below K, tap k
 * reaching (k - r) / s outputs back from q = (i + pad) / s. Those lists
 * are made once a call, one per remainder (in n, k and back: s, s K and
 * s K ints of the caller's), so that no pixel divides. */
typedef struct col2im_axis {
  int s, pad, d, K, O;
  int *n, *k, *back;
} col2im_axis;

static inline void col2im_axis_init(col2im_axis *x, int s, int pad, int d, int K, int O, int *n,
                                    int *k, int *back) {
  *x = (col2im_axis){s, pad, d, K, O, n, k, back};
  for (int r = 0; r < s; r++) {
    n[r] = 0;
    for (int kk = r + (K - 1 - r) / s * s; r < K && kk >= 0; kk -= s) {
      k[r * K + n[r]] = kk;
      back[r * K + n[r]++] = (kk - r) / s;
    }
  }
}

/* Input row (or column) i's taps into o and k, at most K of them; q and r
 * are (i + pad) / s and its remainder. */
static inline int col2im_axis_taps(const col2im_axis *x, int i, int q, int r, int *o, int *k) {
  int n = 0;
  if (x->d == 1) {
    for (int t = 0; t < x->n[r]; t++) {
      const int oo = q - x->back[r * x->K + t];
      if (oo < 0 || oo >= x->O) continue;
      o[n] = oo;
      k[n++] = x->k[r * x->K + t];
    }
    return n;
  }
  for (int kk = x->K - 1; kk >= 0; kk--) {
    const int t = i + x->pad - kk * x->d;
    if (t < 0 || t % x->s || t / x->s >= x->O) continue;
    o[n] = t / x->s;
    k[n++] = kk;
  }
  return n;
}

#endif
