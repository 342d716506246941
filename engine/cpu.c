/* cpu.c — the CPU backend: one kernel per op (cpu_kernels.inc), GEMM
 * through kiln's own (gemm.c) or OpenBLAS, the rest as plain loops the
 * compiler vectorizes. The kernels are instantiated for float (training)
 * and double (the gradient-check reference). Kernels read the run's batch
 * from the graph and never allocate. The op table (op_table.c) names each
 * op's kernel per path; kn_cpu_run_node looks it up. */
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "col2im_axis.h"
#include "graph_internal.h"
#include "philox.h"
#include "vmath.h"

/* The avx512f paths' own loops (bf16 sixteen at a time, floats to doubles)
 * are built where the intrinsics are: x86-64 with GCC. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include "narrow_avx512.h"
#define KN_CPU_INTRINSICS 1
#endif

/* A node's dims at the current batch. */
static void run_dims(const kn_graph *g, const kn_node_rec *n, int *dims) {
  for (int d = 0; d < n->ndim; d++) dims[d] = n->dims[d];
  dims[0] = kn_node_rows(g, n);
}

/* Whether element i of a dropout mask is kept: a 24-bit uniform draw from
 * Philox4x32-10 under the layer's seed, on the stream of the training step
 * (philox.h), at least threshold = ceil(rate x 2^24). Stateless: a mask is
 * the same whatever the thread count or precision, no state needs saving
 * for a resume, and the loop over a mask vectorizes. */
static inline int dropout_kept(uint64_t seed, uint64_t step, uint64_t i, uint32_t threshold) {
  return (kn_philox_word(seed, step, i) >> 8) >= threshold;
}

/* A cast: narrowing, widening, or an f32 (f64 in the reference mode)
 * value rounded through the narrow type in place of its own. */
static void k_cast(kn_graph *g, kn_node_rec *n) {
  const kn_node_rec *x = &g->nodes[n->inputs[0]];
  const size_t count = kn_node_elems(n, g->batch);
  const kn_dtype via = kn_cast_via(n);
  if (n->dtype != x->dtype) {
    kn_convert(x->dtype, x->data, n->dtype, n->data, count);
  } else if (n->dtype == KN_F32) {
    kn_round_f32(via, x->data, n->data, count);
  } else {
    const double *src = x->data;
    double *dst = n->data;
    for (size_t i = 0; i < count; i++) {
      float v = (float)src[i];
      kn_round_f32(via, &v, &v, 1);
      dst[i] = v;
    }
  }
}

/* A matmul node's GEMM at the current batch. */
typedef struct matmul_shape {
  int m, n, k, lda, ldb, trans_a, trans_b;
} matmul_shape;

static matmul_shape matmul_shape_of(const kn_graph *g, const kn_node_rec *n) {
  const kn_node_rec *A = &g->nodes[n->inputs[0]], *B = &g->nodes[n->inputs[1]];
  matmul_shape s = {.trans_a = n->attr.matmul.trans_a, .trans_b = n->attr.matmul.trans_b};
  int a_rows = kn_node_rows(g, A), b_rows = kn_node_rows(g, B);
  s.lda = A->dims[1];
  if (A->op == KN_OP_CONV_PAD) { /* the im2col columns it stands for */
    a_rows *= kn_pad_rows_per_image(A);
    s.lda = kn_pad_cols_width(A);
  }
  s.ldb = B->dims[1];
  if (n->op == KN_OP_MATMUL && n->argmax) { /* a max pool's dx: (B*H*W, C) */
    b_rows *= n->attr.matmul.pool_h * n->attr.matmul.pool_w;
    s.ldb = B->dims[3];
  }
  s.m = s.trans_a ? s.lda : a_rows;
  s.k = s.trans_a ? a_rows : s.lda;
  s.n = s.trans_b ? b_rows : s.ldb;
  return s;
}

void kn_matmul_dims(const kn_graph *g, const kn_node_rec *n, int *m, int *cols, int *k) {
  const matmul_shape s = matmul_shape_of(g, n);
  *m = s.m;
  *cols = s.n;
  *k = s.k;
}

/* The columns a convolution's padded input (KN_OP_CONV_PAD) stands for;
 * one that needs no padding is a view of its input, whose rows and
 * columns the columns then step over. */
static void conv_cols_of(const kn_graph *g, const kn_node_rec *A, kn_conv_cols *cols) {
  const kn_conv_attrs *a = &A->attr.conv;
  const kn_node_rec *S = A->storage == KN_STORE_VIEW ? &g->nodes[A->inputs[0]] : A;
  *cols = (kn_conv_cols){A->data, S->dims[1], S->dims[2], A->dims[3], a->kw, a->sh,
                         a->sw,   a->dh,      a->dw,      a->oh,      a->ow};
}

/* A matmul marked argmax (pool_grad_in_gemm) reads (A, dy, the pool's
 * argmax bytes): its B, the pool's input gradient, as kn_pool_grad_b reads
 * it from dy (f32 or bf16) without writing it. */
static const kn_pool_grad_b *pool_grad_b_of(const kn_graph *g, const kn_node_rec *n,
                                            kn_pool_grad_b *pool) {
  const kn_node_rec *dy = &g->nodes[n->inputs[1]], *P = &g->nodes[n->inputs[2]];
  const int narrow = dy->dtype == KN_BF16;
  *pool = (kn_pool_grad_b){P->data,
                           narrow ? NULL : dy->data,
                           n->attr.matmul.pool_h,
                           n->attr.matmul.pool_w,
                           P->dims[1],
                           P->dims[2],
                           P->dims[3],
                           narrow ? dy->data : NULL};
  return pool;
}

/* The operands of a matmul on the bf16 GEMM; cols holds a padded input's
 * columns. */
static void bf16_operands(kn_graph *g, const kn_node_rec *n, const matmul_shape *s,
                          kn_conv_cols *cols, kn_gemm_operand *a, kn_gemm_operand *b) {
  const kn_node_rec *A = &g->nodes[n->inputs[0]], *B = &g->nodes[n->inputs[1]];
  const int implicit = A->op == KN_OP_CONV_PAD;
  if (implicit) conv_cols_of(g, A, cols);
  *a = (kn_gemm_operand){A->data, A->dtype, s->lda, s->trans_a, implicit ? cols : NULL,
                         NULL,    NULL,     NULL};
  *b = (kn_gemm_operand){B->data, B->dtype, s->ldb, s->trans_b, NULL, NULL, NULL, NULL};
}

/* A matmul with a bf16 operand or output: kiln's bf16 GEMM on the graph's
 * threads and packing buffers (planned at compile). A bf16 output of the
 * fused matmul + bias (+ relu) takes its epilogue before rounding; an f32
 * one gets it from the caller, as after sgemm. Returns whether the
 * epilogue ran. b_sums (or NULL): op(B)'s rows summed on the way, where
 * kn_gemm_sums_b says the call does (gemm_sums_b); a matmul marked argmax
 * reads its B as the pool's input gradient (pool_grad_b_of). */
static int matmul_bf16(kn_graph *g, kn_node_rec *n, const matmul_shape *s, float *b_sums) {
  const int epilogue = n->op == KN_OP_MATMUL_BIAS_ACT && n->dtype == KN_BF16;
  kn_conv_cols cols;
  kn_gemm_operand a, b;
  bf16_operands(g, n, s, &cols, &a, &b);
  b.sums = b_sums;
  kn_pool_grad_b pool;
  if (n->op == KN_OP_MATMUL && n->argmax) b.pool = pool_grad_b_of(g, n, &pool);
  kn_gemm_kernel used =
      kn_gemm_run(g->pool, g->gemm_scratch, s->m, s->n, s->k, a, b, n->data, n->dtype, s->n, 0,
                  epilogue ? g->nodes[n->inputs[2]].data : NULL, epilogue && n->attr.matmul.relu,
                  n->narrow_copy ? g->nodes[n->narrow_copy - 1].data : NULL);
  g->gemm_calls[used]++;
  return epilogue;
}

/* Whether a weight gradient's matmul, paired with its bias gradient, sums
 * dy's rows as it runs: f32 operands (kiln's f32 GEMM), a Winograd
 * product, one reading a pool's gradient as B (whose dy is never written),
 * or the bf16 GEMM's small weight gradient; elsewhere (other bf16
 * products) the bias gradient runs as if unpaired, after it. */
static int gemm_sums_b(kn_graph *g, const kn_node_rec *n) {
  const kn_node_rec *A = &g->nodes[n->inputs[0]], *B = &g->nodes[n->inputs[1]];
  if (n->winograd || (n->op == KN_OP_MATMUL && n->argmax) ||
      (A->dtype != KN_BF16 && B->dtype != KN_BF16 && n->dtype != KN_BF16))
    return 1;
  const matmul_shape s = matmul_shape_of(g, n);
  kn_conv_cols cols;
  kn_gemm_operand a, b;
  bf16_operands(g, n, &s, &cols, &a, &b);
  return kn_gemm_sums_b(s.m, s.n, s.k, &a, &b);
}

/* The arguments of an f32 matmul's GEMM (f32_gemm); cols and pool hold
 * what they point to. */
static kn_sgemm_args f32_gemm_args(kn_graph *g, const kn_node_rec *n, const matmul_shape *s,
                                   float *b_sums, kn_conv_cols *cols, kn_pool_grad_b *pool) {
  const kn_node_rec *A = &g->nodes[n->inputs[0]], *B = &g->nodes[n->inputs[1]];
  const int fused = n->op == KN_OP_MATMUL_BIAS_ACT;
  if (A->op == KN_OP_CONV_PAD) conv_cols_of(g, A, cols);
  if (n->argmax) pool_grad_b_of(g, n, pool);
  const kn_sgemm_args x = {.ta = s->trans_a,
                           .tb = s->trans_b,
                           .m = s->m,
                           .n = s->n,
                           .k = s->k,
                           .a = A->data,
                           .lda = s->lda,
                           .cols = A->op == KN_OP_CONV_PAD ? cols : NULL,
                           .b = B->data,
                           .ldb = s->ldb,
                           .pool = n->argmax ? pool : NULL,
                           .c = n->data,
                           .ldc = s->n,
                           .bias = fused ? g->nodes[n->inputs[2]].data : NULL,
                           .relu = fused && n->attr.matmul.relu,
                           .b_sums = b_sums};
  return x;
}

/* An f32 matmul through kn_sgemm_run: A read in place as a convolution's
 * columns when it is a padded input (KN_OP_CONV_PAD), B as a max pool's
 * gradient when the matmul reads one (its argmax mark: inputs (A, dy, the
 * pool)), a fused one's bias and relu applied on the way, and op(B)'s row
 * sums into b_sums when set. Returns whether the epilogue ran. */
static int f32_gemm(kn_graph *g, const kn_node_rec *n, const matmul_shape *s, float *b_sums) {
  kn_conv_cols cols;
  kn_pool_grad_b pool;
  const kn_sgemm_args x = f32_gemm_args(g, n, s, b_sums, &cols, &pool);
  return kn_sgemm_run(g, &x);
}

/* The matmul a batch norm was folded into (the bn_fold pass), in a
 * forward-only run. With its moving statistics the norm is y = (x - mean)
 * s + beta, s = gamma / sqrt(var + eps), so y = A (B s) + ((bias - mean) s
 * + beta): B's columns scaled into the graph's fold buffer, that sum as
 * the bias, and the norm's relu as the epilogue, written where the batch
 * norm's output lives (whose kernel then runs nothing). The same values to
 * rounding; training runs are untouched. */
static void bn_folded_gemm(kn_graph *g, const kn_node_rec *n) {
  const kn_node_rec *N = &g->nodes[n->bn_fold - 1], *S = &g->nodes[N->inputs[1]];
  const float *mm = g->nodes[S->inputs[1]].data, *mv = g->nodes[S->inputs[2]].data;
  const float *gamma = g->nodes[N->inputs[2]].data, *beta = g->nodes[N->inputs[3]].data;
  const float *bias = n->op == KN_OP_MATMUL_BIAS_ACT ? g->nodes[n->inputs[2]].data : NULL;
  const float *w = g->nodes[n->inputs[1]].data;
  const matmul_shape s = matmul_shape_of(g, n);
  float *wf = g->bn_fold_buf, *scale = wf + (size_t)s.k * s.n, *shift = scale + s.n;
  const double eps = S->attr.bn.epsilon;
  /* (a norm that took in the add after it applies its relu after adding) */
  const int relu = N->fused_relu && N->n_inputs == 4;
  for (int c = 0; c < s.n; c++) {
    /* as bn_stats and bn_apply take them from the moving statistics */
    scale[c] = (float)(1.0 / sqrt((double)mv[c] + eps)) * gamma[c];
    shift[c] = ((bias ? bias[c] : 0.0f) - mm[c]) * scale[c] + beta[c];
  }
  for (int k = 0; k < s.k; k++)
    for (int c = 0; c < s.n; c++) wf[(size_t)k * s.n + c] = w[(size_t)k * s.ldb + c] * scale[c];
#ifdef KN_HAVE_ISA_PATHS
  if (n->winograd) { /* the scaled kernel by Winograd (its input may be unpadded) */
    kn_wino_args a;
    kn_wino_args_of(g, n, &a);
    kn_winograd_conv(g, &a.io, wf, 0, 0, shift, relu, N->data, NULL);
    return;
  }
#endif
  kn_conv_cols cols;
  kn_pool_grad_b pool;
  kn_sgemm_args x = f32_gemm_args(g, n, &s, NULL, &cols, &pool);
  x.b = wf;
  x.ldb = s.n;
  x.c = N->data;
  x.ldc = s.n;
  x.bias = shift;
  x.relu = relu;
  g->gemm_calls[KN_GEMM_SGEMM]++;
  if (kn_sgemm_run(g, &x)) return;
  float *y = N->data; /* OpenBLAS's product: the epilogue after it */
  for (int r = 0; r < s.m; r++) {
    for (int c = 0; c < s.n; c++) {
      const float v = y[(size_t)r * s.n + c] + shift[c];
      y[(size_t)r * s.n + c] = x.relu ? KN_RELU(v) : v;
    }
  }
}

#ifdef KN_HAVE_ISA_PATHS
/* A marked product's outputs: f32 (or none where the node is bf16), and a
 * bf16 one (the node itself, or its narrow copy, or none). */
static float *winograd_f32_out(const kn_node_rec *n) {
  return n->dtype == KN_BF16 ? NULL : n->data;
}

static uint16_t *winograd_bf16_out(const kn_graph *g, const kn_node_rec *n) {
  if (n->dtype == KN_BF16) return n->data;
  return n->narrow_copy ? g->nodes[n->narrow_copy - 1].data : NULL;
}

/* A matmul the winograd pass marked: a convolution's forward product
 * (bias and relu on the way; returns 1) or its weight gradient (and the
 * paired bias gradient into b_sums; returns 0). */
static int winograd_matmul(kn_graph *g, const kn_node_rec *n, float *b_sums) {
  kn_wino_args a;
  kn_wino_args_of(g, n, &a);
  const kn_node_rec *B = &g->nodes[n->inputs[1]];
  if (a.weight_grad) {
    kn_winograd_wgrad(g, &a.io, B->data, B->dtype == KN_BF16, n->data, b_sums);
    return 0;
  }
  const int fused = n->op == KN_OP_MATMUL_BIAS_ACT;
  kn_winograd_conv(g, &a.io, B->data, B->dtype == KN_BF16, 0,
                   fused ? g->nodes[n->inputs[2]].data : NULL, fused && n->attr.matmul.relu,
                   winograd_f32_out(n), winograd_bf16_out(g, n));
  return 1;
}
#endif

/* A stride-1 convolution's input gradient (KN_OP_CONV_INPUT_GRAD): dx's
 * pixels times the kernel turned 180 degrees, the columns read in place
 * from the padded dy; kiln's bf16 GEMM when either operand is bf16. */
static void conv_input_grad(kn_graph *g, kn_node_rec *n) {
  const kn_node_rec *P = &g->nodes[n->inputs[0]], *K = &g->nodes[n->inputs[1]];
#ifdef KN_HAVE_ISA_PATHS
  if (n->winograd) { /* the padded dy correlated with the kernel turned around */
    kn_wino_args a;
    kn_wino_args_of(g, n, &a);
    kn_winograd_conv(g, &a.io, K->data, K->dtype == KN_BF16, 1, NULL, 0, winograd_f32_out(n),
                     winograd_bf16_out(g, n));
    return;
  }
#endif
  const kn_conv_attrs *a = &n->attr.conv;
  const int H = n->dims[1], W = n->dims[2], C = n->dims[3], F = P->dims[3];
  const int m = kn_node_rows(g, P) * H * W, k = kn_pad_cols_width(P);
  const kn_conv_cols cols = {P->data, P->dims[1], P->dims[2], F, a->kw, 1, 1, a->dh, a->dw, H, W};
  const kn_conv_flip flip = {K->data, a->kh, a->kw, C, F};
  if (P->dtype == KN_BF16 || K->dtype == KN_BF16 || n->dtype == KN_BF16) {
    kn_gemm_kernel used =
        kn_gemm_run(g->pool, g->gemm_scratch, m, C, k,
                    (kn_gemm_operand){NULL, P->dtype, k, 0, &cols, NULL, NULL, NULL},
                    (kn_gemm_operand){NULL, K->dtype, C, 0, NULL, &flip, NULL, NULL}, n->data,
                    n->dtype, C, 0, NULL, 0, NULL);
    g->gemm_calls[used]++;
  } else {
    kn_sgemm_cols_flip(g, m, C, k, &cols, &flip, n->data, C);
    g->gemm_calls[KN_GEMM_SGEMM]++;
  }
}

/* A thread's chunk of col2im_gemm: columns of about COL2IM_CHUNK_BYTES,
 * which its L2 cache holds between the GEMM that writes them and col2im;
 * or kn_col2im_set_chunk_bytes's (tests: chunks of an image). */
#define COL2IM_CHUNK_BYTES (512 << 10)
static _Atomic size_t col2im_chunk_bytes;

void kn_col2im_set_chunk_bytes(size_t bytes) {
  atomic_store(&col2im_chunk_bytes, bytes);
}

int64_t kn_col2im_chunk_images(const kn_graph *g, const kn_node_rec *n) {
  const kn_conv_attrs *a = &n->attr.conv;
  const size_t image = (size_t)a->oh * a->ow * a->kh * a->kw * n->dims[3] * sizeof(float);
  const size_t bytes = atomic_load(&col2im_chunk_bytes);
  int64_t chunk = image ? (int64_t)((bytes ? bytes : COL2IM_CHUNK_BYTES) / image) : 1;
  const int64_t rows = kn_node_rows(g, n);
  if (chunk > rows) chunk = rows;
  return chunk < 1 ? 1 : chunk;
}

/* An overlapping max pool's gradient on bf16 values widens a window's
 * cells to run 16 channels a vector; off, it runs a channel at a time
 * (tests: the same bits either way). */
static _Atomic int pool_widening_off;

void kn_pool_set_widening(int on) {
  atomic_store(&pool_widening_off, !on);
}

uint64_t kn_graph_gemm_calls(const kn_graph *g, kn_gemm_kernel kernel) {
  return (kernel >= 0 && kernel < KN_GEMM_KERNELS) ? g->gemm_calls[kernel] : 0;
}

/* Images [b0, b1) of a convolution's zero-padded input (KN_OP_CONV_PAD):
 * elements of any width; an f32 input padded into bf16 (mixed_bfloat16's
 * first convolution) is rounded on the way, as im2col would. */
static void conv_pad_images(const kn_graph *g, const kn_node_rec *n, int64_t b0, int64_t b1) {
  const kn_node_rec *X = &g->nodes[n->inputs[0]];
  const size_t in_size = kn_graph_elem_size(g, X->dtype), es = kn_graph_elem_size(g, n->dtype);
  const int round = X->dtype == KN_F32 && n->dtype == KN_BF16;
  const unsigned char *x = X->data;
  unsigned char *y = n->data;
  const int H = X->dims[1], W = X->dims[2], C = X->dims[3], HP = n->dims[1], WP = n->dims[2];
  const int PT = n->attr.conv.pad_top, PL = n->attr.conv.pad_left;
  /* columns left of the image, the image's row, columns right of it */
  const int lo = PL < WP ? PL : WP, w = W < WP - lo ? W : WP - lo;
  const size_t pix = (size_t)C * es;
  for (int64_t b = b0; b < b1; b++) {
    for (int yp = 0; yp < HP; yp++) {
      unsigned char *out = y + ((size_t)b * HP + yp) * WP * pix;
      const int ih = yp - PT;
      if (ih < 0 || ih >= H) {
        memset(out, 0, (size_t)WP * pix); /* +0 in every float type */
        continue;
      }
      memset(out, 0, (size_t)lo * pix);
      const size_t src = ((size_t)b * H + ih) * W * C;
      if (round) {
        const float *s = (const float *)(const void *)x + src;
        uint16_t *d = (uint16_t *)(void *)(out + (size_t)lo * pix);
        for (size_t i = 0; i < (size_t)w * C; i++) d[i] = kn_bf16_from_f32(s[i]);
      } else {
        memcpy(out + (size_t)lo * pix, x + src * in_size, (size_t)w * pix);
      }
      memset(out + (size_t)(lo + w) * pix, 0, (size_t)(WP - lo - w) * pix);
    }
  }
}

/* Rows [begin, end) of (b, oh) of im2col: one row per (b, oh, ow), columns
 * (ki, kj, c). Copies elements of any width; an f32 input into a bf16
 * im2col (mixed_bfloat16's first convolution) is rounded on the way. */
static void im2col_rows(const kn_graph *g, const kn_node_rec *n, int64_t begin, int64_t end) {
  const kn_node_rec *X = &g->nodes[n->inputs[0]];
  const size_t in_size = kn_graph_elem_size(g, X->dtype),
               out_size = kn_graph_elem_size(g, n->dtype);
  const int round = X->dtype == KN_F32 && n->dtype == KN_BF16;
  const unsigned char *x = X->data;
  unsigned char *cols = n->data;
  const kn_conv_attrs *a = &n->attr.conv;
  /* In locals: the stores below are bytes, which may alias anything. */
  const int H = X->dims[1], W = X->dims[2], C = X->dims[3];
  const int KH = a->kh, KW = a->kw, OH = a->oh, OW = a->ow;
  const int SH = a->sh, SW = a->sw, DH = a->dh, DW = a->dw;
  const int PT = a->pad_top, PL = a->pad_left;
  const size_t pixel = (size_t)C * out_size;
  /* Few channels of f32 (a first convolution): whole words, no calls. */
  const int words = in_size == 4 && out_size == 4 && pixel <= 32;
  for (int64_t r = begin; r < end; r++) {
    const int b = (int)(r / OH), oh = (int)(r % OH);
    for (int ow = 0; ow < OW; ow++) {
      size_t row = (((size_t)b * OH + oh) * OW + ow) * (size_t)(KH * KW * C);
      for (int ki = 0; ki < KH; ki++) {
        const int ih = oh * SH - PT + ki * DH;
        for (int kj = 0; kj < KW; kj++) {
          const int iw = ow * SW - PL + kj * DW;
          unsigned char *dst = cols + (row + ((size_t)ki * KW + kj) * C) * out_size;
          const size_t src = (((size_t)b * H + ih) * W + iw) * C;
          const int inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
          if (words) {
            uint32_t *d = (uint32_t *)(void *)dst;
            if (inside) {
              const uint32_t *s = (const uint32_t *)(const void *)x + src;
              for (int ch = 0; ch < C; ch++) d[ch] = s[ch];
            } else {
              for (int ch = 0; ch < C; ch++) d[ch] = 0u;
            }
          } else if (!inside) {
            memset(dst, 0, pixel); /* +0 in every float type */
          } else if (round) {
            const float *s = (const float *)(const void *)x + src;
            for (int ch = 0; ch < C; ch++) ((uint16_t *)(void *)dst)[ch] = kn_bf16_from_f32(s[ch]);
          } else if (pixel <= 32) { /* a call per pixel costs more than the copy */
            for (size_t i = 0; i < pixel; i++) dst[i] = x[src * in_size + i];
          } else {
            memcpy(dst, x + src * in_size, pixel);
          }
        }
      }
    }
  }
}

/* The float kernels' functions, the same for every ISA path below. */
#define GEMM       kn_sgemm
#define GEMM_ON    kn_sgemm_serial
#define EXP        kn_vexpf
#define EXP_NEG    kn_vexpf_neg
#define LOG        logf
#define LOG1P      log1pf
#define SQRT       sqrtf
#define NORMCDF    kn_vnormcdff
#define GELU_SLOPE kn_vgelu_slopef
#define TANH       kn_vtanhf
#define FABS       fabsf
#define T          float
#define F(name)    name##_f32
#include "cpu_kernels.inc"
#undef T
#undef F

/* The same float kernels again for AVX2 and AVX-512, chosen at run time
 * (kn_cpu_set_isa, or the best the CPU has). cpu.c is built with
 * -ffp-contract=off and GCC never reorders float sums without
 * -ffast-math, so every path gives the same bits: the paths differ in speed
 * only, and a test holds them to it. */
#ifdef KN_HAVE_ISA_PATHS /* op_table.h */
#pragma GCC push_options
#pragma GCC target("avx2")
#define T       float
#define F(name) name##_f32_avx2
#include "cpu_kernels.inc"
#undef T
#undef F
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f")
#define T       float
#define F(name) name##_f32_avx512
#include "cpu_kernels.inc"
#pragma GCC pop_options
#undef T
#undef F
#endif
#undef GEMM
#undef GEMM_ON
#undef EXP
#undef EXP_NEG
#undef LOG
#undef LOG1P
#undef SQRT
#undef NORMCDF
#undef GELU_SLOPE
#undef TANH
#undef FABS

#define T       double
#define F(name) name##_f64
/* The reference mode's GEMM: OpenBLAS in double. */
#define GEMM(g, ta, tb, m, n, k, a, lda, b, ldb, c, ldc)                                           \
  cblas_dgemm(CblasRowMajor, (ta) ? CblasTrans : CblasNoTrans, (tb) ? CblasTrans : CblasNoTrans,   \
              m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc)
#define GEMM_ON(workspace, ta, tb, m, n, k, a, lda, b, ldb, c, ldc)                                \
  ((void)(workspace), GEMM(NULL, ta, tb, m, n, k, a, lda, b, ldb, c, ldc))
#define EXP           exp
#define EXP_NEG       exp
#define LOG           log
#define LOG1P         log1p
#define SQRT          sqrt
#define NORMCDF(x)    (0.5 * (1 + erf((x)*0.70710678118654752440)))
#define GELU_SLOPE(x) (NORMCDF(x) + (x)*exp(-0.5 * (x) * (x)) * 0.39894228040143267794)
#define TANH          tanh
#define FABS          fabs
#include "cpu_kernels.inc"

/* Threads: the CPU's features are read once, by whichever thread asks
 * first (pthread_once: __builtin_cpu_init writes libgcc's table); the path
 * in use is an atomic, set by kn_cpu_set_isa (before graphs run) or on
 * first use, when threads running graphs at once (the mirrored strategy's
 * replicas) may all find it unset. */
static pthread_once_t features_once = PTHREAD_ONCE_INIT;
static kn_cpu_features features;
static _Atomic int active_isa = KN_ISA_AUTO;

static void read_features(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  features.avx2 = __builtin_cpu_supports("avx2");
  features.avx512f = __builtin_cpu_supports("avx512f");
#if !defined(__clang__)
  features.avx512bf16 = __builtin_cpu_supports("avx512bf16");
  features.bf16_dot_half_rate = features.avx512bf16 && __builtin_cpu_is("intel");
#endif
#endif
}

const kn_cpu_features *kn_cpu_features_get(void) {
  pthread_once(&features_once, read_features);
  return &features;
}

static int cpu_has(kn_isa isa) {
#ifdef KN_HAVE_ISA_PATHS
  if (isa == KN_ISA_AVX2) return kn_cpu_features_get()->avx2;
  if (isa == KN_ISA_AVX512) return kn_cpu_features_get()->avx512f;
#endif
  return isa == KN_ISA_BASELINE;
}

static kn_isa best_isa(void) {
  return cpu_has(KN_ISA_AVX512) ? KN_ISA_AVX512
         : cpu_has(KN_ISA_AVX2) ? KN_ISA_AVX2
                                : KN_ISA_BASELINE;
}

const char *kn_isa_name(kn_isa isa) {
  switch (isa) {
  case KN_ISA_AUTO: return "auto";
  case KN_ISA_BASELINE: return "baseline";
  case KN_ISA_AVX2: return "avx2";
  case KN_ISA_AVX512: return "avx512";
  }
  return "?";
}

int kn_cpu_set_isa(kn_isa isa, char *err, size_t errlen) {
  if (isa == KN_ISA_AUTO) {
    atomic_store(&active_isa, (int)best_isa());
    return KN_OK;
  }
  if ((int)isa < 0 || isa > KN_ISA_AVX512 || !cpu_has(isa)) {
    snprintf(err, errlen, "cpu: this CPU (or build) has no %s path", kn_isa_name(isa));
    return KN_EINVAL;
  }
  atomic_store(&active_isa, (int)isa);
  return KN_OK;
}

kn_isa kn_cpu_isa(void) {
  int isa = atomic_load(&active_isa);
  if (isa != KN_ISA_AUTO) return (kn_isa)isa;
  /* First use: the best path, unless another thread set one meanwhile
   * (then isa holds that one). */
  const int best = (int)best_isa();
  return atomic_compare_exchange_strong(&active_isa, &isa, best) ? (kn_isa)best : (kn_isa)isa;
}

/* The f32 kernels' path: the instruction set in use. */
static int f32_path(void) {
#ifdef KN_HAVE_ISA_PATHS
  switch (kn_cpu_isa()) {
  case KN_ISA_AVX512: return KN_CPU_F32_AVX512;
  case KN_ISA_AVX2: return KN_CPU_F32_AVX2;
  default: break;
  }
#endif
  return KN_CPU_F32;
}

/* The path a graph's nodes run on: f64 in the reference mode. */
static int cpu_path(const kn_graph *g) {
  return g->f64 ? KN_CPU_F64 : f32_path();
}

/* Runs node i with its op's CPU kernel on instruction set path `path`. */
static int run_on(kn_graph *g, int i, int path, char *err, size_t errlen) {
  kn_node_rec *n = &g->nodes[i];
  const kn_kernel_fn kernel = kn_op_defs[n->op].cpu[path];
  if (kernel) return kernel(g, n, err, errlen);
  if (kn_op_has(n->op, KN_OPF_NO_KERNEL)) return KN_OK; /* fed, held, a view, or written */
  snprintf(err, errlen, "run: node '%s' (%s) has no CPU kernel", n->name, kn_op_name(n->op));
  return KN_EINVAL;
}

int kn_cpu_run_node(kn_graph *g, int i, char *err, size_t errlen) {
  return run_on(g, i, f32_path(), err, errlen);
}

int kn_cpu_run_node_f64(kn_graph *g, int i, char *err, size_t errlen) {
  return run_on(g, i, KN_CPU_F64, err, errlen);
}

/* ---- the CPU backend (backend.h): host memory, every op's kernel ---- */

static int cpu_device_count(int *count, char *err, size_t errlen) {
  (void)err, (void)errlen;
  *count = 1;
  return 0;
}

static kn_kernel_fn cpu_kernel(const kn_graph *g, const kn_node_rec *n) {
  return kn_op_defs[n->op].cpu[cpu_path(g)];
}

static int cpu_supports(const kn_graph *g, const kn_node_rec *n) {
  return cpu_kernel(g, n) || kn_op_has(n->op, KN_OPF_NO_KERNEL);
}

static void *cpu_alloc(int device, size_t bytes, char *err, size_t errlen) {
  (void)device;
  const size_t align = 64, rounded = (bytes + align - 1) / align * align;
  void *p = aligned_alloc(align, rounded ? rounded : align);
  if (!p) snprintf(err, errlen, "cpu: cannot allocate %zu bytes", bytes);
  return p;
}

static void cpu_free(int device, void *p) {
  (void)device;
  free(p);
}

static int cpu_copy(int device, void *dst, const void *src, size_t bytes, char *err,
                    size_t errlen) {
  (void)device, (void)err, (void)errlen;
  if (bytes) memcpy(dst, src, bytes);
  return 0;
}

static int cpu_run(kn_graph *g, int i, char *err, size_t errlen) {
  return run_on(g, i, cpu_path(g), err, errlen);
}

const kn_backend kn_backend_cpu = {
    .name = "cpu",
    .device_count = cpu_device_count,
    .kernel = cpu_kernel,
    .supports = cpu_supports,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_in = cpu_copy,
    .copy_out = cpu_copy,
    .run = cpu_run,
};
