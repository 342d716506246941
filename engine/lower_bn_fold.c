/* lower_bn_fold.c — the bn_fold pass: a batch norm folded into the
 * convolution or dense layer before it, for forward-only runs.
 *
 * In evaluation and prediction a batch norm normalizes by its moving
 * statistics, so it is an affine map per channel, and on the output of a
 * matmul (a convolution's GEMM, a dense layer; with its bias, without a
 * relu) it can be taken into that matmul: its kernel's columns scaled, its
 * bias shifted, the norm's relu as the epilogue (TensorFlow folds batch
 * norms so for inference). The matmul then writes the norm's output
 * directly in those runs, and the norm's kernel runs nothing: one pass
 * over the layer's output less. Training runs, which need the matmul's
 * own output for the batch statistics and for backward, are untouched;
 * the planner keeps the norm's value live from the matmul on (plan.c).
 *
 * Only where nothing else in forward reads the matmul's output, all in
 * float32 on the CPU. */
#include "graph_internal.h"

/* Whether node x is read, in forward, by nothing but a and b. */
static int forward_read_only_by(const kn_graph *g, kn_node x, kn_node a, kn_node b) {
  return kn_read_only_by(g, x, a, b, g->n_forward);
}

/* The matmul batch norm n may be folded into, or -1. */
static kn_node foldable_matmul(const kn_graph *g, kn_node bn) {
  const kn_node_rec *N = &g->nodes[bn];
  const kn_node x = N->inputs[0], stats = N->inputs[1];
  if (N->dtype != KN_F32 || N->folded || N->narrow_copy || N->round_bf16 ||
      N->device.kind != KN_DEVICE_CPU || g->nodes[stats].op != KN_OP_BN_STATS ||
      !forward_read_only_by(g, x, stats, bn))
    return -1;
  /* back through reshapes (a convolution's output is its GEMM's, viewed
   * as NHWC), each read in forward only by the next */
  kn_node m = x;
  while (g->nodes[m].storage == KN_STORE_VIEW && g->nodes[m].op == KN_OP_RESHAPE) {
    const kn_node from = g->nodes[m].inputs[0];
    if (!forward_read_only_by(g, from, m, -1)) return -1;
    m = from;
  }
  const kn_node_rec *M = &g->nodes[m];
  const kn_node_rec *A = &g->nodes[M->inputs[0]], *B = &g->nodes[M->inputs[1]];
  const int plain =
      M->op == KN_OP_MATMUL || (M->op == KN_OP_MATMUL_BIAS_ACT && !M->attr.matmul.relu);
  if (!plain || M->dead || M->folded || M->keep || M->gemm_pair || M->argmax || M->bn_fold ||
      M->narrow_copy || M->round_bf16 || M->storage != KN_STORE_ARENA ||
      M->device.kind != KN_DEVICE_CPU || M->dtype != KN_F32 || A->dtype != KN_F32 ||
      B->dtype != KN_F32 || B->ndim != 2 || M->attr.matmul.trans_a || M->attr.matmul.trans_b ||
      B->dims[1] != N->dims[N->ndim - 1])
    return -1;
  return m;
}

int kn_lower_bn_fold(kn_graph *g) {
  if (g->f64) return 0;
  int folds = 0;
  for (kn_node i = 0; i < g->n_forward; i++) {
    kn_node_rec *N = &g->nodes[i];
    if (N->dead || N->op != KN_OP_BN_APPLY || N->eval_written_by) continue;
    const kn_node m = foldable_matmul(g, i);
    if (m < 0) continue;
    g->nodes[m].bn_fold = i + 1;
    N->eval_written_by = m + 1;
    folds++;
  }
  return folds;
}
