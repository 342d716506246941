/* lower_cpu.c — the passes that lower a graph onto the CPU backend's own
 * kernels, as kn_run_passes (passes.c) orders them: a tiled max pool that
 * records its argmax for its gradient, im2col columns and a convolution's
 * input gradient read in place by kiln's GEMM (implicit GEMM), bias and
 * pool gradients computed inside a weight gradient's GEMM, and under
 * mixed_bfloat16 the matmuls' operands narrowed for the bf16 GEMM. They
 * name the ops they rewrite: that is lowering, not a property of an op.
 * Like every pass they never change values (tests compare each on and
 * off). */
#include <stdio.h>
#include <string.h>

#include "amx.h"
#include "amx_conv.h"
#include "graph_internal.h"

/* A tiled max pool's gradient reads the pool's input x (as large as four
 * outputs) and output to find each window's maximum again. Instead the
 * pool records it as it computes the maximum, a byte per output element
 * in a node of its own (KN_OP_POOL_ARGMAX, appended), and the gradient
 * reads that: x, and the pool's output once the next layer has read it,
 * then die in the forward pass, and the gradient reads a quarter of the
 * bytes. The byte says the cell the rule
 * would pick, or none when the fused relu gradient masks the window, so
 * the values do not change. f32, and mixed_bfloat16's bf16 windows (where
 * the pool's output, a max of bf16 values, equals its narrow copy, or is
 * stored in bf16 itself); runs
 * after the relu fusion, before the dead narrow copies are dropped. */
int kn_lower_pool_argmax(kn_graph *g, int max_nodes) {
  if (g->f64) return 0;
  int recorded = 0;
  for (int i = 0; i < g->n_nodes && g->n_nodes < max_nodes; i++) {
    kn_node_rec *G = &g->nodes[i];
    if (G->dead || G->op != KN_OP_POOL_GRAD || !kn_pool_tiles(&G->attr.conv) || G->argmax ||
        G->n_inputs != 3)
      continue;
    /* y: the pool, or (mixed_bfloat16) its narrow copy, the same values */
    kn_node p = G->inputs[2];
    if (g->nodes[p].op == KN_OP_CAST && g->nodes[p].dtype == KN_BF16) p = g->nodes[p].inputs[0];
    /* With recompute, the pool re-run in backward from its kept input: the
     * forward pool records the argmax instead, and the re-run (and keeping
     * its input) goes. */
    int rerun = 0;
    if (g->nodes[p].op == KN_OP_POOL && g->nodes[p].remat_of) {
      p = g->nodes[p].remat_of - 1;
      rerun = 1;
    }
    kn_node_rec *P = &g->nodes[p];
    const kn_dtype x = g->nodes[P->inputs[0]].dtype, dy = g->nodes[G->inputs[0]].dtype;
    /* the kernels' types: f32 throughout, or mixed_bfloat16's bf16 x and dx */
    const int f32 = G->dtype == KN_F32 && x == KN_F32 && dy == KN_F32;
    const int bf16 = G->dtype == KN_BF16 && x == KN_BF16 && (dy == KN_F32 || dy == KN_BF16);
    if (P->dead || P->op != KN_OP_POOL || !kn_pool_tiles(&P->attr.conv) || P->argmax ||
        (P->dtype != KN_F32 && !(bf16 && P->dtype == KN_BF16)) || P->storage != KN_STORE_ARENA ||
        (!rerun && P->inputs[0] != G->inputs[1]) || !(f32 || bf16))
      continue;
    /* the bytes: a node of their own, so the pool's output need not live
     * until backward for them (pushing may move g->nodes) */
    kn_node_rec bytes = kn_node_proto(KN_OP_POOL_ARGMAX, KN_U8);
    bytes.attr.argmax_of = 1 + p;
    bytes.device = P->device;
    for (int k = 0; k < KN_MAX_INPUTS; k++) bytes.inputs[k] = -1;
    snprintf(bytes.name, sizeof bytes.name, "argmax/%.100s", P->name);
    const kn_node am = kn_graph_push(g, &bytes);
    if (am < 0) return recorded;
    G = &g->nodes[i];
    P = &g->nodes[p];
    P->argmax = 1 + (G->fused_relu != 0);
    P->argmax_at = 1 + am;
    G->argmax = 1;
    G->n_inputs = 2;
    G->inputs[1] = am;
    G->inputs[2] = -1;
    recorded++;
  }
  return recorded;
}

/* Whether node x's only live readers are `a` and `b` (either may be -1). */
static int read_only_by(const kn_graph *g, kn_node x, kn_node a, kn_node b) {
  return kn_read_only_by(g, x, a, b, g->n_nodes);
}

/* The one live node that reads x (however many of its inputs do), or -1
 * when none or several do. */
static kn_node sole_reader(const kn_graph *g, kn_node x) {
  for (int c = x + 1; c < g->n_nodes; c++) {
    const kn_node_rec *r = &g->nodes[c];
    for (int k = 0; k < r->n_inputs && !r->dead; k++)
      if (r->inputs[k] == x) return read_only_by(g, x, c, -1) ? c : -1;
  }
  return -1;
}

/* Whether kiln's own f32 GEMM runs this graph's products: the passes that
 * hand it columns, bias sums or a pool's gradient to read in place need it. */
static int kiln_gemm_runs(const kn_graph *g) {
  return !g->f64 && kn_gemm_wants_workspace() && kn_cpu_gemm() == KN_GEMM_KILN;
}

/* Node n becomes x zero-padded (KN_OP_CONV_PAD, stored as dtype: an f32 x
 * padded into bf16 is rounded), with the convolution attrs its GEMMs read
 * the columns by; its op's rule shapes it. */
static void become_conv_pad(kn_graph *g, kn_node_rec *n, kn_node x, kn_dtype dtype,
                            const kn_conv_attrs *attrs) {
  n->op = KN_OP_CONV_PAD;
  n->n_inputs = 1;
  n->inputs[0] = x;
  for (int k = 1; k < KN_MAX_INPUTS; k++) n->inputs[k] = -1;
  n->dtype = dtype;
  const kn_conv_attrs conv = *attrs;
  memset(&n->attr, 0, sizeof n->attr);
  n->attr.conv = conv;
  n->fused_relu = n->gemm_pair = n->argmax = n->argmax_at = 0;
  kn_shape_conv_pad(g, n); /* x is NHWC: an im2col's input or a 4-d dy */
  /* No padding on any side (a "valid" convolution, a 1x1 one with stride
   * 2 on an even size): nothing to copy; the GEMMs read x where it lies. */
  const kn_node_rec *X = &g->nodes[x], *root = &g->nodes[kn_storage_root(g, x)];
  if (conv.pad_top == 0 && conv.pad_left == 0 && n->dims[1] <= X->dims[1] &&
      n->dims[2] <= X->dims[2] && dtype == X->dtype && root->storage == KN_STORE_ARENA &&
      !kn_op_has(root->op, KN_OPF_FED))
    n->storage = KN_STORE_VIEW;
}

/* An im2col read only as the A of GEMMs (a convolution's forward product,
 * and its weight gradient through the transpose) becomes the zero-padded
 * input those GEMMs read the columns from in place: the columns, KH x KW
 * times the input's size, are never written. kiln's f32 GEMM gathers them
 * as it reads, its bf16 GEMM as it packs (an im2col narrowed to bf16 pads
 * in bf16); the same sums in the same order, so the values do not change.
 * Only where kiln's f32 GEMM is the one in use. */
int kn_lower_implicit_columns(kn_graph *g) {
  if (!kiln_gemm_runs(g)) return 0;
  int replaced = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    kn_node_rec *n = &g->nodes[i];
    if (n->dead || n->op != KN_OP_IM2COL || n->keep || n->storage != KN_STORE_ARENA) continue;
    int readers = 0, ok = 1;
    for (int c = i + 1; c < g->n_nodes && ok; c++) {
      const kn_node_rec *r = &g->nodes[c];
      if (r->dead) continue;
      for (int k = 0; k < r->n_inputs; k++) {
        if (r->inputs[k] != i) continue;
        readers++;
        ok &= (r->op == KN_OP_MATMUL || r->op == KN_OP_MATMUL_BIAS_ACT) && k == 0;
      }
    }
    if (!ok || readers == 0) continue;
    const kn_conv_attrs *a = &n->attr.conv;
    become_conv_pad(g, n, n->inputs[0], n->dtype, a);
    replaced++;
  }
  return replaced;
}

static int round_in_gemm(kn_graph *g, kn_node cast); /* mixed_bfloat16, below */

/* The input gradient of a stride-1 convolution, a GEMM of dy by the
 * kernel into columns (KH x KW times the input's size) that col2im then
 * sums, becomes one GEMM of dx's pixels by the kernel turned 180 degrees,
 * its columns read in place from dy zero-padded by DH(KH-1)-PT,
 * DW(KW-1)-PL, with the convolution's dilation (the column GEMM's node
 * becomes that padded dy). The columns are never
 * written; the sums run over taps and filters in one order instead of two
 * passes, so values move in the last bits. Only where kiln's f32 GEMM is
 * the one in use; f32 and bf16 operands. */
int kn_lower_implicit_input_grads(kn_graph *g) {
  if (!kiln_gemm_runs(g)) return 0;
  int replaced = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    kn_node_rec *c = &g->nodes[i];
    if (c->dead || c->op != KN_OP_COL2IM || c->dtype != KN_F32) continue;
    const kn_node mi = c->inputs[0];
    kn_node_rec *mm = &g->nodes[mi];
    if (mm->dead || mm->op != KN_OP_MATMUL || mm->keep || mm->storage != KN_STORE_ARENA ||
        mm->attr.matmul.trans_a != 0 || mm->attr.matmul.trans_b != 1)
      continue;
    const kn_node_rec *dyv = &g->nodes[mm->inputs[0]], *wv = &g->nodes[mm->inputs[1]];
    if (sole_reader(g, mi) != i || dyv->op != KN_OP_RESHAPE || wv->op != KN_OP_RESHAPE) continue;
    const kn_node dy = dyv->inputs[0], w = wv->inputs[0];
    const kn_node_rec *DY = &g->nodes[dy], *Wk = &g->nodes[w];
    const kn_conv_attrs *a = &c->attr.conv;
    const int KH = a->kh, KW = a->kw, H = c->dims[1], W = c->dims[2];
    if (DY->ndim != 4 || Wk->ndim != 4 || a->sh != 1 || a->sw != 1 || a->dh < 1 || a->dw < 1 ||
        Wk->dims[0] != KH || Wk->dims[1] != KW || Wk->dims[2] != c->dims[3] ||
        Wk->dims[3] != DY->dims[3])
      continue;
    const int pt = a->dh * (KH - 1) - a->pad_top, pl = a->dw * (KW - 1) - a->pad_left;
    const int hp = H + a->dh * (KH - 1), wp = W + a->dw * (KW - 1);
    if (pt < 0 || pl < 0 || hp - pt < DY->dims[1] || wp - pl < DY->dims[2]) continue;
    if ((DY->dtype != KN_F32 && DY->dtype != KN_BF16) ||
        (Wk->dtype != KN_F32 && Wk->dtype != KN_BF16))
      continue;
    /* the column GEMM's node: dy zero-padded */
    const kn_conv_attrs pa = {.kh = KH,
                              .kw = KW,
                              .sh = 1,
                              .sw = 1,
                              .dh = a->dh,
                              .dw = a->dw,
                              .pad_top = pt,
                              .pad_left = pl,
                              .oh = H,
                              .ow = W,
                              .h = DY->dims[1],
                              .w = DY->dims[2]};
    /* mixed_bfloat16: a GEMM over a bf16 kernel rounds dy to bf16 as it
     * packs it; padded in bf16, dy is rounded once, where it is copied
     * anyway (the same values), and is packed as it lies */
    const kn_dtype pad_type =
        g->precision == KN_PRECISION_MIXED_BFLOAT16 && Wk->dtype == KN_BF16 && DY->dtype == KN_F32
            ? KN_BF16
            : DY->dtype;
    become_conv_pad(g, mm, dy, pad_type, &pa);
    /* col2im: the transposed convolution */
    c->op = KN_OP_CONV_INPUT_GRAD;
    c->n_inputs = 2;
    c->inputs[1] = w;
    /* mixed_bfloat16: rounded on the way into a pool gradient, in bf16 */
    for (int r = i + 1; r < g->n_nodes; r++)
      if (!g->nodes[r].dead && g->nodes[r].op == KN_OP_CAST && g->nodes[r].inputs[0] == i &&
          round_in_gemm(g, r))
        break;
    replaced++;
  }
  return replaced;
}

/* The col2im_chunks pass (KN_PASS_COL2IM_CHUNKS): the input gradient of a
 * convolution implicit_input_grad left (strided or dilated), a GEMM of dy
 * by the kernel into columns that col2im then sums, becomes one
 * col2im_gemm node of dy and the kernel that runs the two by chunks of
 * images (cpu_kernels_conv.inc): the same products and sums in the same
 * order, the columns never whole. float32 operands, kiln's GEMM; or,
 * under mixed_bfloat16, the bf16 kernel (dy f32 or bf16) on the bf16 GEMM
 * into bf16 columns, as the matmul ran. */
int kn_lower_col2im_chunks(kn_graph *g) {
  if (!kiln_gemm_runs(g)) return 0;
  int replaced = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    kn_node_rec *c = &g->nodes[i];
    const kn_conv_attrs *a = &c->attr.conv;
    if (c->dead || c->op != KN_OP_COL2IM || c->dtype != KN_F32 || c->device.kind != KN_DEVICE_CPU ||
        (a->sh == 1 && a->sw == 1 && a->dh == 1 && a->dw == 1))
      continue; /* stride 1: implicit_input_grad's */
    const kn_node mi = c->inputs[0];
    kn_node_rec *mm = &g->nodes[mi];
    if (mm->dead || mm->op != KN_OP_MATMUL || mm->keep || mm->storage != KN_STORE_ARENA ||
        (mm->dtype != KN_F32 && mm->dtype != KN_BF16) || mm->attr.matmul.trans_a != 0 ||
        mm->attr.matmul.trans_b != 1 || mm->argmax || mm->winograd || sole_reader(g, mi) != i)
      continue;
    const kn_node dyv = mm->inputs[0], wv = mm->inputs[1];
    if (g->nodes[dyv].op != KN_OP_RESHAPE || g->nodes[wv].op != KN_OP_RESHAPE) continue;
    const kn_node dy = g->nodes[dyv].inputs[0], w = g->nodes[wv].inputs[0];
    const kn_node_rec *DY = &g->nodes[dy], *Wk = &g->nodes[w];
    /* float32 throughout, or the bf16 GEMM's: a bf16 kernel into bf16
     * columns */
    const int f32 = mm->dtype == KN_F32 && DY->dtype == KN_F32 && Wk->dtype == KN_F32;
    const int bf16 = mm->dtype == KN_BF16 && Wk->dtype == KN_BF16 &&
                     (DY->dtype == KN_F32 || DY->dtype == KN_BF16) &&
                     g->nodes[dyv].dtype == DY->dtype && g->nodes[wv].dtype == KN_BF16;
    if (DY->ndim != 4 || Wk->ndim != 4 || !(f32 || bf16) || DY->storage == KN_STORE_PART ||
        DY->dims[1] != a->oh || DY->dims[2] != a->ow || Wk->dims[0] != a->kh ||
        Wk->dims[1] != a->kw || Wk->dims[2] != c->dims[3] || Wk->dims[3] != DY->dims[3])
      continue;
    c->op = KN_OP_COL2IM_GEMM;
    c->n_inputs = 2;
    c->inputs[0] = dy;
    c->inputs[1] = w;
    mm->dead = 1;
    replaced++;
  }
  return replaced;
}

/* A layer's bias gradient, reduce_rows(dy), and its weight gradient,
 * op(A)^T dy, both read all of dy, a convolution's largest gradient. The
 * weight gradient's GEMM packs every row of dy anyway, so it sums them on
 * the way and dy is read once. The reduce_rows comes first in the schedule
 * (autodiff emits it first), so it runs the pair: the matmul's GEMM with
 * the bias gradient as its row sums; the matmul then runs nothing, and the
 * planner keeps its value live from the reduce_rows on. Each column sums
 * in row order, as reduce_rows does, unless the GEMM splits a deep product
 * into slices. f32 or bf16 operands (mixed_bfloat16: a Winograd product
 * and the bf16 GEMM's small weight gradient sum dy as they read it; other
 * bf16 products leave the sums to the reduce_rows, run after them), and
 * only where kiln's GEMM is the one in use; A must exist when the
 * reduce_rows runs (not a recompute emitted after it). */
int kn_lower_bias_grads_in_gemm(kn_graph *g) {
  if (!kiln_gemm_runs(g)) return 0;
  int paired = 0;
  for (int r = 0; r < g->n_nodes; r++) {
    kn_node_rec *R = &g->nodes[r];
    if (R->dead || R->op != KN_OP_REDUCE_ROWS || R->dtype != KN_F32 || R->gemm_pair) continue;
    const kn_node dy = kn_storage_root(g, R->inputs[0]);
    const kn_node_rec *D = &g->nodes[dy];
    if ((D->dtype != KN_F32 && D->dtype != KN_BF16) || R->ndim != 1 ||
        R->dims[0] != D->dims[D->ndim - 1])
      continue;
    for (int m = r + 1; m < g->n_nodes; m++) {
      kn_node_rec *M = &g->nodes[m];
      if (M->dead || M->op != KN_OP_MATMUL || M->attr.matmul.trans_a != 1 ||
          M->attr.matmul.trans_b != 0 || M->dtype != KN_F32 || M->gemm_pair ||
          kn_storage_root(g, M->inputs[1]) != dy)
        continue;
      const kn_node_rec *A = &g->nodes[M->inputs[0]], *B = &g->nodes[M->inputs[1]];
      if ((A->dtype != KN_F32 && A->dtype != KN_BF16) || kn_storage_root(g, M->inputs[0]) > r ||
          B->ndim != 2 || B->dims[1] != R->dims[0])
        continue;
      R->gemm_pair = 1 + m;
      M->gemm_pair = 1 + r;
      paired++;
      break;
    }
  }
  return paired;
}

/* A first convolution's max pool gradient (it has no input gradient to
 * feed) is read only by the layer's weight gradient, op(A)^T dx, and its
 * bias gradient paired with it: it is as large as the layer's output and
 * is written once and read once. With the pool's argmax recorded, the
 * weight gradient's GEMM computes each row of dx as it packs it (the dy of
 * its window where the argmax names the pixel, else 0) and dx is never
 * written. The same values, summed in the same order: the same bits. f32,
 * where kiln's GEMM is in use; runs after pool_argmax and the bias pairing.
 * The matmul then reads (A, dy, the pool). Under mixed_bfloat16 (the
 * gradient and its dy bf16) where the bf16 GEMM's small weight gradient
 * takes the product (bf16_pool_wgrad_fits): it reads each pixel's dy there
 * the same way. */

/* Whether the bf16 GEMM's small weight gradient (cpu_gemm.c) takes matmul
 * M, the weight gradient of a 3x3 convolution on one channel (9 taps, up
 * to 32 filters): it alone reads a pool's gradient in bf16 as B. */
static int bf16_pool_wgrad_fits(const kn_graph *g, const kn_node_rec *M, const kn_node_rec *G) {
  const kn_node_rec *A = &g->nodes[M->inputs[0]];
  return kn_gemm_bf16_kernel() == KN_GEMM_BF16_AVX512 && A->op == KN_OP_CONV_PAD &&
         (A->dtype == KN_BF16 || A->dtype == KN_F32) && kn_pad_cols_width(A) == 9 &&
         G->dims[3] >= 1 && G->dims[3] <= 32;
}

int kn_lower_pool_grads_in_gemm(kn_graph *g) {
  if (!kiln_gemm_runs(g)) return 0;
  int moved = 0;
  for (int m = 0; m < g->n_nodes; m++) {
    kn_node_rec *M = &g->nodes[m];
    if (M->dead || M->op != KN_OP_MATMUL || M->attr.matmul.trans_a != 1 ||
        M->attr.matmul.trans_b != 0 || M->dtype != KN_F32 || M->argmax || M->n_inputs != 2)
      continue;
    const kn_node v = M->inputs[1];
    const kn_node dx = kn_storage_root(g, v);
    kn_node_rec *G = &g->nodes[dx];
    if (G->op != KN_OP_POOL_GRAD || G->argmax != 1 || (G->dtype != KN_F32 && G->dtype != KN_BF16) ||
        G->keep || G->storage != KN_STORE_ARENA || G->ndim != 4 ||
        (v != dx && (g->nodes[v].op != KN_OP_RESHAPE || g->nodes[v].inputs[0] != dx)))
      continue;
    const kn_node r = M->gemm_pair - 1; /* -1: not paired */
    if (!read_only_by(g, dx, v, r) || (v != dx && !read_only_by(g, v, m, -1)) ||
        (r >= 0 && kn_storage_root(g, g->nodes[r].inputs[0]) != dx))
      continue;
    const kn_node dy = G->inputs[0], pool = G->inputs[1];
    if (g->nodes[dy].dtype != G->dtype || (G->dtype == KN_BF16 && !bf16_pool_wgrad_fits(g, M, G)))
      continue;
    M->n_inputs = 3;
    M->inputs[1] = dy;
    M->inputs[2] = pool;
    M->argmax = 1;
    M->attr.matmul.pool_h = G->dims[1];
    M->attr.matmul.pool_w = G->dims[2];
    if (r >= 0) g->nodes[r].inputs[0] = dy; /* it runs M's GEMM; dx is gone */
    G->dead = 1;
    if (v != dx) g->nodes[v].dead = 1;
    moved++;
  }
  return moved;
}

/* ---- batch norm's backward ---- */

/* The first live node after `after` with op `op` whose first `k` inputs
 * are those of `like`; -1 for none. */
static kn_node find_reader_like(const kn_graph *g, kn_node after, kn_op op, int k,
                                const kn_node_rec *like) {
  for (kn_node c = after + 1; c < g->n_nodes; c++) {
    const kn_node_rec *r = &g->nodes[c];
    if (r->dead || r->op != op || r->written_by || r->n_inputs != k) continue;
    int same = 1;
    for (int q = 0; q < k; q++) same &= r->inputs[q] == like->inputs[q];
    if (same) return c;
  }
  return -1;
}

/* Whether x is an f32 value rounded through bf16 (a cast via bf16): its
 * values are bf16 values. */
static int rounds_through_bf16(const kn_graph *g, kn_node x) {
  const kn_node_rec *n = &g->nodes[x];
  return !n->dead && n->op == KN_OP_CAST && n->dtype == KN_F32 && kn_cast_via(n) == KN_BF16 &&
         g->nodes[n->inputs[0]].dtype == KN_F32;
}

/* A batch norm's backward reads its dy three times: bn_grad_x sums dy and
 * dy xhat over the rows, then applies them; bn_grad_gamma sums dy xhat
 * again, bn_grad_beta dy again. Those first sums are the gamma and beta
 * gradients (bn_grad_x scales them by gamma itself), taken the same way,
 * so bn_grad_x writes them (the two run nothing and are live from it on).
 * Then, when that dy is a relu's gradient (the relu fused into bn_apply,
 * or, under mixed_bfloat16, a relu after it whose output is kept in bf16)
 * read by nothing else, bn_grad_x masks dy by the relu's output itself in
 * both of its passes and the relu gradient is never written. Under
 * mixed_bfloat16 that relu gradient is rounded through bf16: where the
 * gradient it masks is rounded already, the rounding changes nothing and
 * goes with it. float32 (double in the reference mode; x may be the bf16
 * layer output mixed_bfloat16 keeps), not synchronized: a synchronized
 * batch norm's sums cover every replica, its gamma and beta gradients only
 * its own. Returns the batch norms paired; *relu_grads, the relus taken
 * in. */
int kn_lower_bn_grads(kn_graph *g, int *relu_grads) {
  int paired = 0;
  *relu_grads = 0;
  for (kn_node x = 0; x < g->n_nodes; x++) {
    kn_node_rec *X = &g->nodes[x];
    if (X->dead || X->op != KN_OP_BN_GRAD_X || X->n_inputs != 4 || X->attr.bn.synchronized ||
        X->dtype != KN_F32 || X->attr.bn.writes_gamma || X->attr.bn.writes_beta)
      continue;
    int f32 = 1;
    for (int k = 0; k < 4; k++)
      f32 &= g->nodes[X->inputs[k]].dtype == KN_F32 ||
             (k == 1 && g->nodes[X->inputs[k]].dtype == KN_BF16);
    if (!f32) continue;
    const kn_node gm = find_reader_like(g, x, KN_OP_BN_GRAD_GAMMA, 3, X);
    const kn_node bt = find_reader_like(g, x, KN_OP_BN_GRAD_BETA, 1, X);
    if (gm < 0 && bt < 0) continue;
    if (gm >= 0) {
      X->attr.bn.writes_gamma = 1 + gm;
      g->nodes[gm].written_by = 1 + x;
    }
    if (bt >= 0) {
      X->attr.bn.writes_beta = 1 + bt;
      g->nodes[bt].written_by = 1 + x;
    }
    paired++;
    /* dy = relu_grad(dy_out, y), read by these three alone (or, under
     * mixed_bfloat16, dy = that rounded through bf16, with dy_out rounded
     * already, and y the relu's bf16 output) */
    kn_node dy = X->inputs[0], rounding = -1;
    if (rounds_through_bf16(g, dy) && sole_reader(g, g->nodes[dy].inputs[0]) == dy &&
        g->nodes[g->nodes[dy].inputs[0]].op == KN_OP_RELU_GRAD &&
        rounds_through_bf16(g, g->nodes[g->nodes[dy].inputs[0]].inputs[0])) {
      rounding = dy;
      dy = g->nodes[dy].inputs[0];
    }
    const kn_node_rec *D = &g->nodes[dy];
    if (gm < 0 || bt < 0 || D->dead || D->op != KN_OP_RELU_GRAD || D->keep || D->fused_relu ||
        D->storage != KN_STORE_ARENA || D->dtype != KN_F32 ||
        g->nodes[D->inputs[0]].dtype != KN_F32 || (rounding >= 0 && g->nodes[rounding].keep))
      continue;
    const kn_dtype y_dtype = g->nodes[D->inputs[1]].dtype;
    if (!(y_dtype == KN_F32 || (rounding >= 0 && y_dtype == KN_BF16))) continue;
    const kn_node read = rounding >= 0 ? rounding : dy;
    int others = 0;
    for (kn_node c = read + 1; c < g->n_nodes; c++) {
      const kn_node_rec *r = &g->nodes[c];
      if (r->dead || c == x || c == gm || c == bt) continue;
      for (int k = 0; k < r->n_inputs; k++) others |= r->inputs[k] == read;
    }
    if (others) continue;
    const kn_node dy_out = D->inputs[0], y = D->inputs[1];
    X->n_inputs = 5;
    X->inputs[0] = dy_out;
    X->inputs[4] = y;
    /* Where y is this layer's own output (after a relu or not), its sign
     * is recomputed from x, the statistics, gamma and beta: one stream of
     * activations fewer for both passes. */
    const kn_node_rec *A = &g->nodes[y];
    if (A->op == KN_OP_RELU && !A->dead) A = &g->nodes[A->inputs[0]];
    if (A->op == KN_OP_BN_APPLY && !A->dead && A->inputs[0] == X->inputs[1] &&
        A->inputs[1] == X->inputs[2] && A->inputs[2] == X->inputs[3] &&
        g->nodes[A->inputs[3]].dtype == KN_F32) {
      X->inputs[4] = A->inputs[3];
      X->attr.bn.relu_from_beta = 1;
    }
    g->nodes[gm].inputs[0] = dy_out; /* they read nothing, but stay after it */
    g->nodes[bt].inputs[0] = dy_out;
    g->nodes[dy].dead = 1;
    if (rounding >= 0) g->nodes[rounding].dead = 1;
    (*relu_grads)++;
  }
  return paired;
}

/* ---- mixed_bfloat16: matmuls on bf16 operands ---- */

static int is_gemm(kn_op op) {
  return op == KN_OP_MATMUL || op == KN_OP_MATMUL_BIAS_ACT;
}

/* Whether op reads its input k as bf16 as well as f32: GEMM operands,
 * pooling's input, and the forward values relu and pooling gradients
 * compare. */
static int reads_bf16(kn_op op, int k) {
  return (is_gemm(op) && k < 2) || (op == KN_OP_RELU_GRAD && k == 1) ||
         (op == KN_OP_POOL_GRAD && k >= 1) || op == KN_OP_POOL;
}

/* The bf16 value an up-cast (bf16 -> f32) widens, or -1. */
static kn_node widened_bf16(const kn_graph *g, kn_node x) {
  const kn_node_rec *n = &g->nodes[x];
  if (n->op != KN_OP_CAST || n->dtype != KN_F32 || n->dead) return -1;
  return g->nodes[n->inputs[0]].dtype == KN_BF16 ? n->inputs[0] : -1;
}

enum {
  READ_AS_GEMM_OPERAND = 1,
  READ_BY_NARROW_COPY = 2,
  READ_BY_COL2IM = 4,
  READ_BY_ROUNDING = 8
};

/* Whether x has live readers and every one reads it in one of the `ways`:
 * as a GEMM operand, as x's own down-cast to bf16 (mixed precision's
 * narrow copy), as col2im's columns, as a cast rounding it in f32. */
static int read_only(const kn_graph *g, kn_node x, int ways) {
  int readers = 0;
  for (int c = x + 1; c < g->n_nodes; c++) {
    const kn_node_rec *n = &g->nodes[c];
    if (n->dead) continue;
    for (int k = 0; k < n->n_inputs; k++) {
      if (n->inputs[k] != x) continue;
      readers++;
      if ((ways & READ_AS_GEMM_OPERAND) && is_gemm(n->op) && k < 2) continue;
      if ((ways & READ_BY_NARROW_COPY) && n->op == KN_OP_CAST && n->dtype == KN_BF16) continue;
      if ((ways & READ_BY_COL2IM) && n->op == KN_OP_COL2IM) continue;
      if ((ways & READ_BY_ROUNDING) && n->op == KN_OP_CAST && n->dtype == KN_F32) continue;
      return 0;
    }
  }
  return readers > 0;
}

/* Whether every live reader of x takes a bf16 value: a GEMM operand, a
 * bias gradient's row sum, relu's gradient as its dy, or a view that only
 * GEMMs read. */
static int gradient_read_as_bf16(const kn_graph *g, kn_node x) {
  for (int c = x + 1; c < g->n_nodes; c++) {
    const kn_node_rec *n = &g->nodes[c];
    if (n->dead) continue;
    for (int k = 0; k < n->n_inputs; k++) {
      if (n->inputs[k] != x) continue;
      if ((is_gemm(n->op) && k < 2) || n->op == KN_OP_REDUCE_ROWS ||
          (n->op == KN_OP_RELU_GRAD && k == 0))
        continue;
      if (n->storage == KN_STORE_VIEW && read_only(g, c, READ_AS_GEMM_OPERAND)) continue;
      return 0;
    }
  }
  return 1;
}

static void replace_reads(kn_graph *g, kn_node from, kn_node to) {
  for (int c = from + 1; c < g->n_nodes; c++) {
    kn_node_rec *n = &g->nodes[c];
    for (int k = 0; k < n->n_inputs; k++)
      if (n->inputs[k] == from) n->inputs[k] = to;
  }
}

/* x, now bf16 itself, is read wherever its narrow copies were; they go. */
static void take_place_of_narrow_copies(kn_graph *g, kn_node x) {
  for (int c = x + 1; c < g->n_nodes; c++) {
    kn_node_rec *copy = &g->nodes[c];
    if (!copy->dead && copy->op == KN_OP_CAST && copy->dtype == KN_BF16 && copy->inputs[0] == x) {
      replace_reads(g, c, x);
      copy->dead = 1;
    }
  }
}

/* A gradient rounded to bf16 (a CAST to f32 through bf16) and read only
 * by tiled max-pool gradients as their dy, where its producer is a GEMM (a
 * matmul, possibly under a view, or a convolution's input gradient) that
 * nothing else reads: the GEMM writes it rounded, in bf16, the pool
 * gradients read that, and the cast goes. The same values: the GEMM
 * rounds its complete sums as the cast did. Returns whether it did. */
static int round_in_gemm(kn_graph *g, kn_node cast) {
  kn_node_rec *n = &g->nodes[cast];
  if (n->dead || n->op != KN_OP_CAST || n->dtype != KN_F32 || n->attr.cast_via != KN_BF16 ||
      n->keep || g->precision != KN_PRECISION_MIXED_BFLOAT16 ||
      g->nodes[n->inputs[0]].dtype != KN_F32)
    return 0;
  int readers = 0;
  for (int c = cast + 1; c < g->n_nodes; c++) {
    const kn_node_rec *r = &g->nodes[c];
    if (r->dead) continue;
    for (int k = 0; k < r->n_inputs; k++) {
      if (r->inputs[k] != cast) continue;
      if (r->op != KN_OP_POOL_GRAD || k != 0 || !kn_pool_tiles(&r->attr.conv)) return 0;
      readers++;
    }
  }
  kn_node src = n->inputs[0], view = -1;
  if (g->nodes[src].op == KN_OP_RESHAPE && g->nodes[src].storage == KN_STORE_VIEW) {
    view = src;
    src = g->nodes[view].inputs[0];
  }
  kn_node_rec *p = &g->nodes[src];
  if (readers == 0 || p->dead || p->keep || p->storage != KN_STORE_ARENA || p->dtype != KN_F32 ||
      (p->op != KN_OP_MATMUL && p->op != KN_OP_CONV_INPUT_GRAD) ||
      sole_reader(g, src) != (view >= 0 ? view : cast) ||
      (view >= 0 && sole_reader(g, view) != cast))
    return 0;
  if (view >= 0) g->nodes[view].dtype = KN_BF16;
  p->dtype = KN_BF16;
  replace_reads(g, cast, view >= 0 ? view : src);
  n->dead = 1;
  return 1;
}

/* Whether x has live readers and `ok` takes every read of it (reader r,
 * its input k). */
static int every_read(const kn_graph *g, kn_node x,
                      int (*ok)(const kn_graph *g, const kn_node_rec *r, int k)) {
  int readers = 0;
  for (kn_node c = x + 1; c < g->n_nodes; c++) {
    const kn_node_rec *r = &g->nodes[c];
    if (r->dead) continue;
    for (int k = 0; k < r->n_inputs; k++) {
      if (r->inputs[k] != x) continue;
      if (!ok(g, r, k)) return 0;
      readers++;
    }
  }
  return readers > 0;
}

/* A batch norm gradient reading its x. */
static int as_bn_grad_x(const kn_graph *g, const kn_node_rec *r, int k) {
  (void)g;
  return k == 1 && (r->op == KN_OP_BN_GRAD_X || r->op == KN_OP_BN_GRAD_GAMMA);
}

/* A batch norm gradient's x (input 1) that widens a bf16 value — the layer
 * output mixed_bfloat16 keeps for backward — directly or under a reshape
 * read by such inputs alone: the gradient reads that bf16 value, widening
 * it as it reads (the same values), and the widened copy is never made. */
static void bn_grad_reads_bf16_x(kn_graph *g, kn_node_rec *n) {
  const kn_node x = n->inputs[1];
  kn_node_rec *V = &g->nodes[x];
  if (widened_bf16(g, x) >= 0) {
    n->inputs[1] = widened_bf16(g, x);
  } else if (V->op == KN_OP_RESHAPE && V->storage == KN_STORE_VIEW && V->dtype == KN_F32 &&
             !V->keep && widened_bf16(g, V->inputs[0]) >= 0 && every_read(g, x, as_bn_grad_x)) {
    V->inputs[0] = widened_bf16(g, V->inputs[0]);
    V->dtype = KN_BF16;
  }
}

/* The live bf16 copy of x (mixed precision's narrow copy), or -1. */
static kn_node narrow_copy_of(const kn_graph *g, kn_node x) {
  for (kn_node c = x + 1; c < g->n_nodes; c++) {
    const kn_node_rec *n = &g->nodes[c];
    if (!n->dead && n->op == KN_OP_CAST && n->dtype == KN_BF16 && n->inputs[0] == x) return c;
  }
  return -1;
}

/* Whether r is a batch norm's statistics or apply, not synchronized (those
 * sum over every replica). */
static int local_bn(const kn_graph *g, const kn_node_rec *r) {
  const kn_node_rec *stats = r->op == KN_OP_BN_APPLY ? &g->nodes[r->inputs[1]] : r;
  return (r->op == KN_OP_BN_STATS || r->op == KN_OP_BN_APPLY) && stats->op == KN_OP_BN_STATS &&
         !stats->attr.bn.synchronized;
}

/* Such a batch norm reading its x. */
static int as_local_bn_x(const kn_graph *g, const kn_node_rec *r, int k) {
  return k == 0 && local_bn(g, r);
}

/* A batch norm over a layer output whose bf16 copy mixed_bfloat16 keeps
 * for backward normalizes that copy: the layer's output in the policy's
 * compute type, as a Keras layer under mixed_bfloat16 hands the next its
 * bf16 output (and as backward already reads it, so the two passes see
 * the same x). The output's view (a convolution's NHWC) then views the
 * copy; the f32 output, read by its copy alone, is written in bf16 only
 * (the loop below). */
static void bn_reads_bf16_input(kn_graph *g, kn_node v) {
  kn_node_rec *V = &g->nodes[v];
  if (V->dead || V->dtype != KN_F32 || V->keep) return;
  if (V->op == KN_OP_RESHAPE && V->storage == KN_STORE_VIEW) {
    const kn_node copy = narrow_copy_of(g, V->inputs[0]);
    if (copy < 0 || copy > v || !every_read(g, v, as_local_bn_x)) return;
    V->inputs[0] = copy;
    V->dtype = KN_BF16;
    return;
  }
  /* (other readers keep the f32 value) */
  const kn_node copy = narrow_copy_of(g, v);
  for (kn_node c = copy + 1; copy >= 0 && c < g->n_nodes; c++) {
    kn_node_rec *r = &g->nodes[c];
    if (!r->dead && r->n_inputs > 0 && r->inputs[0] == v && local_bn(g, r)) r->inputs[0] = copy;
  }
}

/* Under mixed_bfloat16 the matmuls of dense and conv layers, forward and
 * backward, read bf16 operands and run the bf16 GEMM; the f32 values they
 * read before are then left unread and DCE drops them, so activations are
 * planned in bf16:
 * - a GEMM operand that widens a bf16 value (a weight copy, a layer input's
 *   narrow copy, or a view of one) is replaced by that value, and so are
 *   pooling's widened input and the widened forward values relu and
 *   pooling gradients read;
 * - an im2col read only by GEMMs (and its own narrow copy) is built in bf16
 *   straight from its input's narrow copy (rounding an f32 input), and
 *   takes the place of that copy;
 * - a convolution's input gradient in columns is stored in bf16, and so
 *   are the gradients from a tiled max pool down through relu to the
 *   layer's GEMMs (values the policy rounds to bf16 anyway);
 * - a tiled max pool over bf16 values read only through its narrow copy
 *   is stored in bf16 (its maxima are those values);
 * - a batch norm normalizes the bf16 copy of the layer output it reads
 *   (bn_reads_bf16_input), and its gradient reads that copy too.
 * Other gradients stay f32; the GEMM rounds them to bf16 as it packs. Not a
 * switchable pass: it is what the policy computes. */
void kn_lower_narrow_gemm_operands(kn_graph *g) {
  if (g->precision != KN_PRECISION_MIXED_BFLOAT16 || g->f64) return;
  for (kn_node i = 0; i < g->n_nodes; i++)
    if (!g->nodes[i].dead && (g->nodes[i].op == KN_OP_BN_STATS || g->nodes[i].op == KN_OP_BN_APPLY))
      bn_reads_bf16_input(g, g->nodes[i].inputs[0]);
  for (int i = 0; i < g->n_nodes; i++) {
    kn_node_rec *n = &g->nodes[i];
    if (n->dead) continue;
    if (n->op == KN_OP_IM2COL && n->dtype == KN_F32 &&
        read_only(g, i, READ_AS_GEMM_OPERAND | READ_BY_NARROW_COPY)) {
      kn_node src = widened_bf16(g, n->inputs[0]);
      if (src >= 0 || g->nodes[n->inputs[0]].dtype == KN_F32) {
        if (src >= 0) n->inputs[0] = src;
        n->dtype = KN_BF16;
        take_place_of_narrow_copies(g, i);
      }
    } else if (n->storage == KN_STORE_VIEW && n->dtype == KN_F32 &&
               widened_bf16(g, n->inputs[0]) >= 0 && read_only(g, i, READ_AS_GEMM_OPERAND)) {
      n->inputs[0] = widened_bf16(g, n->inputs[0]);
      n->dtype = KN_BF16;
    } else if (n->op == KN_OP_CAST && n->dtype == KN_F32 &&
               g->nodes[n->inputs[0]].dtype == KN_F32) {
      /* The gradient of a layer input's up-cast, rounded to bf16: a tiled
       * max pool's gradient read by it alone writes it rounded, in bf16,
       * where the rounding's readers take bf16 (not a concatenation's
       * gradient slices, which copy f32). */
      kn_node_rec *p = &g->nodes[n->inputs[0]];
      if (p->op == KN_OP_POOL_GRAD && kn_pool_tiles(&p->attr.conv) && !p->keep &&
          read_only(g, n->inputs[0], READ_BY_ROUNDING) && gradient_read_as_bf16(g, i)) {
        p->dtype = KN_BF16;
        replace_reads(g, i, n->inputs[0]);
        n->dead = 1;
      } else {
        round_in_gemm(g, i); /* a dense layer's input gradient into a pool */
      }
    } else {
      for (int k = 0; k < n->n_inputs; k++) {
        kn_node src = widened_bf16(g, n->inputs[k]);
        if (src >= 0 && reads_bf16(n->op, k)) n->inputs[k] = src;
      }
      if ((n->op == KN_OP_BN_GRAD_X || n->op == KN_OP_BN_GRAD_GAMMA) && n->n_inputs >= 2 &&
          !n->attr.bn.synchronized)
        bn_grad_reads_bf16_x(g, n);
      /* A tiled max pool over bf16 values read only through its narrow
       * copy: each maximum is one of those values, stored as it is. */
      if (n->op == KN_OP_POOL && n->attr.conv.pool_kind == 0 && kn_pool_tiles(&n->attr.conv) &&
          n->dtype == KN_F32 && g->nodes[n->inputs[0]].dtype == KN_BF16 && !n->keep &&
          n->storage == KN_STORE_ARENA && read_only(g, i, READ_BY_NARROW_COPY)) {
        n->dtype = KN_BF16;
        take_place_of_narrow_copies(g, i);
      }
      /* relu's gradient masks a bf16 gradient: bf16 out, for readers that
       * take bf16 (the layer's GEMMs and its bias gradient). */
      if (n->op == KN_OP_RELU_GRAD && g->nodes[n->inputs[0]].dtype == KN_BF16 && !n->keep &&
          gradient_read_as_bf16(g, i)) {
        n->dtype = KN_BF16;
        for (int c = i + 1; c < g->n_nodes; c++)
          if (!g->nodes[c].dead && g->nodes[c].storage == KN_STORE_VIEW &&
              g->nodes[c].inputs[0] == i)
            g->nodes[c].dtype = KN_BF16;
      }
    }
    if (is_gemm(n->op) && !n->keep && n->storage == KN_STORE_ARENA) {
      /* A convolution's input gradient in columns, summed by col2im into
       * an f32 gradient, and a layer output only its narrow copy reads:
       * rounded to bf16 once the sums (and bias, relu) are complete. */
      if (n->op == KN_OP_MATMUL && read_only(g, i, READ_BY_COL2IM)) n->dtype = KN_BF16;
      if (read_only(g, i, READ_BY_NARROW_COPY)) {
        n->dtype = KN_BF16;
        take_place_of_narrow_copies(g, i);
      }
    }
  }
}

/* ---- mixed_bfloat16: narrow copies written by their producers ---- */

/* Whether every live reader of x is `except`, a copy of x in bf16, or a
 * reshape of x read that way. */
static int read_by_narrow_copies_and(const kn_graph *g, kn_node x, kn_node except) {
  for (int c = x + 1; c < g->n_nodes; c++) {
    const kn_node_rec *n = &g->nodes[c];
    if (n->dead || c == except) continue;
    for (int k = 0; k < n->n_inputs; k++) {
      if (n->inputs[k] != x || (n->op == KN_OP_CAST && n->dtype == KN_BF16)) continue;
      if (n->op == KN_OP_RESHAPE && n->storage == KN_STORE_VIEW &&
          read_by_narrow_copies_and(g, c, except))
        continue;
      return 0;
    }
  }
  return 1;
}

/* Under mixed_bfloat16 a layer output backward reads is kept as a bf16
 * copy: a cast right after it reads the whole f32 output again to round
 * it. Where the output comes from a kernel that stores it element by
 * element — relu, add, batch norm's apply (a fused relu included), a
 * plain matmul on the bf16 GEMM — that kernel writes the copy too, each
 * element rounded as it is stored (kn_bf16_from_f32, the cast's own
 * rounding); the cast then runs nothing, and the planner keeps its value
 * live from the producer on. And a value rounded through bf16 in f32 (a
 * layer's output in the policy's compute type, or the gradient through
 * such a rounding) whose f32 original nothing else reads but its bf16
 * copies is rounded by the relu, add, batch norm apply or relu gradient
 * that computes it; the cast goes and its readers read that node. This
 * half takes in the roundings; kn_lower_narrow_copies, after dead-node
 * elimination, the copies. Each returns the casts it took in. */
int kn_lower_rounds_in_producers(kn_graph *g) {
  if (g->precision != KN_PRECISION_MIXED_BFLOAT16 || g->f64) return 0;
  int moved = 0;
  for (kn_node c = 0; c < g->n_nodes; c++) {
    kn_node_rec *C = &g->nodes[c];
    if (C->dead || C->op != KN_OP_CAST || C->dtype != KN_F32 || C->keep ||
        kn_cast_via(C) != KN_BF16 || C->n_inputs != 1)
      continue;
    /* The f32 value C rounds: its input, or, where C widens a bf16 copy
     * of a value (mixed precision's narrow copy), that value. */
    kn_node v = C->inputs[0];
    const kn_node_rec *N = &g->nodes[v];
    const int widens = N->op == KN_OP_CAST && N->dtype == KN_BF16 && N->n_inputs == 1;
    if (widens)
      v = N->inputs[0];
    else if (N->dtype != KN_F32)
      continue;
    /* through reshapes: the same elements in the same order */
    kn_node p = v;
    while (g->nodes[p].op == KN_OP_RESHAPE && g->nodes[p].storage == KN_STORE_VIEW &&
           !g->nodes[p].keep)
      p = g->nodes[p].inputs[0];
    kn_node_rec *P = &g->nodes[p];
    /* (a constant's kernel runs once, at compile) */
    if (P->dead || P->folded || P->dtype != KN_F32 || P->storage != KN_STORE_ARENA ||
        P->device.kind != KN_DEVICE_CPU)
      continue;
    /* already rounded by its kernel: rounding again changes nothing */
    const int rounded = P->round_bf16;
    if (!rounded && (P->keep ||
                     !(P->op == KN_OP_RELU || P->op == KN_OP_ADD || P->op == KN_OP_BN_APPLY ||
                       P->op == KN_OP_RELU_GRAD) ||
                     !read_by_narrow_copies_and(g, p, c)))
      continue;
    P->round_bf16 = 1;
    replace_reads(g, c, v); /* P's values, in C's shape */
    C->dead = 1;
    moved++;
  }
  return moved;
}

/* The second half of the pass, after dead-node elimination has dropped the
 * bf16 copies only the casts taken in above read: each remaining copy of a
 * value computed element by element is written by that value's kernel. */
int kn_lower_narrow_copies(kn_graph *g) {
  if (g->precision != KN_PRECISION_MIXED_BFLOAT16 || g->f64) return 0;
  int moved = 0;
  for (kn_node c = 0; c < g->n_nodes; c++) {
    kn_node_rec *C = &g->nodes[c];
    if (C->dead || C->op != KN_OP_CAST || C->dtype != KN_BF16 || C->written_by ||
        C->storage != KN_STORE_ARENA || C->n_inputs != 1)
      continue;
    kn_node p = C->inputs[0];
    /* through a reshape: the same elements in the same order */
    while (g->nodes[p].op == KN_OP_RESHAPE && g->nodes[p].storage == KN_STORE_VIEW)
      p = g->nodes[p].inputs[0];
    kn_node_rec *P = &g->nodes[p];
    const int elementwise = P->op == KN_OP_RELU || P->op == KN_OP_ADD || P->op == KN_OP_BN_APPLY;
    /* a matmul without epilogue whose GEMM is the bf16 one (a bf16 operand) */
    const int gemm =
        P->op == KN_OP_MATMUL && !P->gemm_pair && !P->argmax &&
        (g->nodes[P->inputs[0]].dtype == KN_BF16 || g->nodes[P->inputs[1]].dtype == KN_BF16);
    if (P->dead || P->folded || P->dtype != KN_F32 || P->storage != KN_STORE_ARENA ||
        P->narrow_copy || P->device.kind != KN_DEVICE_CPU || !(elementwise || gemm))
      continue;
    P->narrow_copy = 1 + c;
    C->written_by = 1 + p;
    moved++;
  }
  return moved;
}

/* An add rounded through bf16, on the CPU. */
static int as_rounded_add(const kn_graph *g, const kn_node_rec *r, int k) {
  (void)g;
  (void)k;
  return r->op == KN_OP_ADD && r->round_bf16 && r->device.kind == KN_DEVICE_CPU;
}

/* The last step of the narrow_copies pass, after fusion, for values
 * rounded through bf16 by their kernels (round_bf16), whose bf16 copies
 * hold the same values. An add rounded so reads such an input's bf16
 * copy, where it has one. Then such a value from a batch norm's apply or
 * an add that nothing reads but its bf16 copy, or adds rounded so alone,
 * is stored in bf16 alone, and its readers read it. Returns the nodes
 * that became bf16. */
int kn_lower_bf16_values(kn_graph *g) {
  if (g->precision != KN_PRECISION_MIXED_BFLOAT16 || g->f64) return 0;
  for (kn_node a = 0; a < g->n_nodes; a++) {
    kn_node_rec *A = &g->nodes[a];
    if (A->dead || A->op != KN_OP_ADD || !A->round_bf16 || A->device.kind != KN_DEVICE_CPU)
      continue;
    for (int k = 0; k < 2; k++) {
      const kn_node_rec *P = &g->nodes[A->inputs[k]];
      if (P->round_bf16 && P->narrow_copy && P->dtype == KN_F32 && !P->dead)
        A->inputs[k] = P->narrow_copy - 1;
    }
  }
  int narrowed = 0;
  for (kn_node p = 0; p < g->n_nodes; p++) {
    kn_node_rec *P = &g->nodes[p];
    if (P->dead || (P->op != KN_OP_BN_APPLY && P->op != KN_OP_ADD) || P->dtype != KN_F32 ||
        !P->round_bf16 || P->keep || P->storage != KN_STORE_ARENA ||
        P->device.kind != KN_DEVICE_CPU || P->eval_written_by)
      continue;
    if (P->narrow_copy) {
      const kn_node c = P->narrow_copy - 1;
      if (g->nodes[c].keep || !read_only_by(g, p, c, -1)) continue;
      replace_reads(g, c, p);
      g->nodes[c].dead = 1;
      g->nodes[c].written_by = 0;
      P->narrow_copy = 0;
    } else if (!every_read(g, p, as_rounded_add)) {
      continue;
    }
    P->dtype = KN_BF16;
    narrowed++;
  }
  return narrowed;
}

/* A marked node's padded input and product shape (graph_internal.h). */
void kn_wino_args_of(const kn_graph *g, const kn_node_rec *n, kn_wino_args *a) {
  const kn_node_rec *P = &g->nodes[n->inputs[0]];
  /* a padding that needed no copy is a view: its rows are its input's */
  const kn_node_rec *S = P->storage == KN_STORE_VIEW ? &g->nodes[P->inputs[0]] : P;
  const int input_grad = n->op == KN_OP_CONV_INPUT_GRAD;
  /* a bf16 padding of f32 values, read in place: rounded as read */
  const int x_bf16 = P->dtype != KN_BF16 ? 0 : S->dtype == KN_F32 ? 2 : 1;
  *a = (kn_wino_args){.io = {.x = P->data,
                             .x_bf16 = x_bf16,
                             .r = P->attr.conv.kh,
                             .d = P->attr.conv.dh,
                             .s = P->attr.conv.sh,
                             .batch = kn_node_rows(g, P),
                             .hp = S->dims[1],
                             .wp = S->dims[2],
                             .cin = P->dims[3],
                             .pt = S != P ? P->attr.conv.pad_top : 0,
                             .pl = S != P ? P->attr.conv.pad_left : 0,
                             .oh = P->attr.conv.oh,
                             .ow = P->attr.conv.ow,
                             .cout = n->dims[n->ndim - 1],
                             .bf16_products = n->winograd >= 2,
                             .amx = n->winograd >= 3,
                             .direct = n->winograd == 4,
                             .round_y = n->round_bf16,
                             .add = input_grad && n->n_inputs > 2
                                        ? (const float *)g->nodes[n->inputs[2]].data
                                        : NULL},
                      .weight_grad = !input_grad && n->attr.matmul.trans_a,
                      .flip = input_grad};
}

/* The winograd pass (KN_PASS_WINOGRAD): marks the forward matmul (with
 * its bias and relu), the weight-gradient matmul (with the bias gradient
 * paired to it) and the input gradient of each 3x3 or 5x5, stride-1
 * convolution, undilated or dilated the same down and across (float32,
 * or bf16 operands under mixed_bfloat16; the output float32, or bf16 for
 * a forward product or input gradient whose readers take it rounded:
 * the sums in float32 all the same, rounded as they are stored), whose
 * products read a padded input in place and where kn_winograd_pays;
 * their kernels then run winograd.c. A matmul reading a max pool's
 * gradient as B, or a value that is a part of another's storage, keeps
 * its GEMM. */
/* the channels up to which the direct product beats Winograd on tiles */
#define AMX_CONV_CHANNELS 64

int kn_lower_winograd(kn_graph *g) {
  /* float32 and mixed_bfloat16 (bf16 operands widened as they are read:
   * the products' sums in float32, as the bf16 GEMM's) */
  if (!kiln_gemm_runs(g) || !kn_winograd_available() ||
      (g->precision != KN_PRECISION_FLOAT32 && g->precision != KN_PRECISION_MIXED_BFLOAT16))
    return 0;
  int marked = 0;
  /* under mixed_bfloat16, decided once for the graph. Where vdpbf16ps
   * runs at half the f32 FMA's rate, f32 sums are faster, unless AMX tiles
   * take the products (amx.h). */
  const int amx = kn_amx_available();
  const int bf16_products = g->precision == KN_PRECISION_MIXED_BFLOAT16 &&
                            kn_winograd_bf16_products() &&
                            (!kn_cpu_features_get()->bf16_dot_half_rate || amx);
  for (int i = 0; i < g->n_nodes; i++) {
    kn_node_rec *n = &g->nodes[i];
    const int mm = n->op == KN_OP_MATMUL || n->op == KN_OP_MATMUL_BIAS_ACT;
    if (n->dead || n->folded || (n->dtype != KN_F32 && n->dtype != KN_BF16) ||
        n->device.kind != KN_DEVICE_CPU || !(mm || n->op == KN_OP_CONV_INPUT_GRAD) ||
        n->storage == KN_STORE_PART || n->storage == KN_STORE_VIEW || n->round_bf16)
      continue;
    if (mm && (n->argmax || n->attr.matmul.trans_b)) continue;
    const kn_node_rec *P = &g->nodes[n->inputs[0]], *B = &g->nodes[n->inputs[1]];
    const kn_conv_attrs *c = &P->attr.conv;
    /* stride 2: only a 3x3 weight gradient, directly on AMX tiles */
    const int strided = c->sh == 2 && c->sw == 2;
    if (P->op != KN_OP_CONV_PAD || (P->dtype != KN_F32 && P->dtype != KN_BF16) ||
        (B->dtype != KN_F32 && B->dtype != KN_BF16) || B->storage == KN_STORE_PART ||
        (c->kh != 3 && c->kh != 5) || c->kw != c->kh || ((c->sh != 1 || c->sw != 1) && !strided) ||
        c->dh < 1 || c->dw != c->dh)
      continue;
    kn_wino_args a;
    kn_wino_args_of(g, n, &a);
    const int r = a.io.r, taps = r * r, reach = a.io.d * (r - 1);
    /* B as the product reads it: the kernel (r^2 C_in, C_out) or, for the
     * weight gradient, dy (batch x oh x ow, C_out) */
    if (mm && (B->ndim != 2 || B->dims[1] != a.io.cout)) continue;
    if (mm && !a.weight_grad && B->dims[0] != taps * a.io.cin) continue;
    if (mm && a.weight_grad && (n->dims[0] != taps * a.io.cin || n->dtype != KN_F32)) continue;
    /* On AMX tiles a forward product or input gradient of up to 64
     * channels read runs faster directly, its columns read in place
     * (amx_conv.h): the transforms and the tiles' stores of 36 positions'
     * sums cost more than the 2.25x products they save; so does a weight
     * gradient over multiples of 16 channels, stride 2 by phases. Marked
     * 4, it still reads its input where it lies. */
    const int direct = bf16_products && amx &&
                       (a.weight_grad ? kn_amx_conv_wgrad_fits(&a.io)
                                      : !strided && a.io.cin <= AMX_CONV_CHANNELS &&
                                            kn_amx_conv_direct_fits(&a.io));
    if (strided) { /* a weight gradient directly on the tiles, or nothing */
      if (direct) {
        n->winograd = 4;
        marked++;
      }
      continue;
    }
    if ((a.io.pt == 0 && a.io.pl == 0 &&
         (a.io.hp < a.io.oh + reach || a.io.wp < a.io.ow + reach)) ||
        !kn_winograd_pays(r, a.io.d, a.io.oh, a.io.ow, a.io.cin, a.io.cout))
      continue;
    if (n->op == KN_OP_MATMUL_BIAS_ACT && g->nodes[n->inputs[2]].dtype != KN_F32) continue;
    /* 2: bf16 products; 3: on AMX tiles (3x3 only: 5x5 sums stay f32) */
    n->winograd = !bf16_products ? 1 : direct ? 4 : amx && r == 3 ? 3 : 2;
    marked++;
  }
  /* An input gradient rounded through bf16 by a cast after it (the
   * gradient through the policy's cast before the convolution), nothing
   * else reading it: the product rounds its f32 outputs as it stores them
   * (the cast's values, bit for bit) and the cast goes, as
   * kn_lower_rounds_in_producers does for element-wise producers. */
  for (kn_node c = 0; marked && c < g->n_nodes; c++) {
    kn_node_rec *C = &g->nodes[c];
    if (C->dead || C->op != KN_OP_CAST || C->dtype != KN_F32 || C->keep || C->n_inputs != 1 ||
        kn_cast_via(C) != KN_BF16)
      continue;
    const kn_node p = C->inputs[0];
    kn_node_rec *P = &g->nodes[p];
    if (!P->winograd || P->op != KN_OP_CONV_INPUT_GRAD || P->dtype != KN_F32 || P->keep ||
        P->round_bf16 || P->storage != KN_STORE_ARENA || !read_by_narrow_copies_and(g, p, c))
      continue;
    P->round_bf16 = 1;
    replace_reads(g, c, p);
    C->dead = 1;
  }
  /* A padded input read only by marked nodes is never written: they read
   * the value it pads where it lies, adding the zeros as they read (and
   * rounding an f32 value to the bf16 padding's values). */
  for (int i = 0; marked && i < g->n_nodes; i++) {
    kn_node_rec *P = &g->nodes[i];
    /* a recompute re-creates its padded input in backward so that the
     * value it pads need not live until then: it stays */
    if (P->dead || P->op != KN_OP_CONV_PAD || P->storage != KN_STORE_ARENA || P->keep ||
        P->remat_of)
      continue;
    const kn_node_rec *X = &g->nodes[P->inputs[0]],
                      *root = &g->nodes[kn_storage_root(g, P->inputs[0])];
    /* (an f32 value padded into bf16, mixed_bfloat16's rounding: the
     * products round each value as they read it) */
    if ((X->dtype != P->dtype && !(X->dtype == KN_F32 && P->dtype == KN_BF16)) || X->ndim != 4 ||
        root->storage != KN_STORE_ARENA || kn_op_has(root->op, KN_OPF_FED))
      continue;
    int only_marked = 1;
    for (int c = i + 1; c < g->n_nodes && only_marked; c++) {
      const kn_node_rec *r = &g->nodes[c];
      if (r->dead) continue;
      for (int k = 0; k < r->n_inputs; k++)
        if (r->inputs[k] == i && !(r->winograd && k == 0)) only_marked = 0;
    }
    if (only_marked) P->storage = KN_STORE_VIEW;
  }
  return marked;
}
