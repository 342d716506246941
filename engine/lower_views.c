/* lower_views.c — the concat_views pass: concatenations and their
 * gradients' slices without copies, where only they read the values.
 *
 * A concatenation along axis a lays out each block of its output (the
 * elements from axis a on, for one index of the axes before it) as the
 * blocks of its inputs one after the other. Each input's blocks therefore
 * lie at a fixed offset in the output's, one output block apart: the input
 * can be a part of the output's storage (KN_STORE_PART) if the kernel that
 * computes it writes its blocks that far apart, and every kernel that reads
 * it reads them so. The CPU's concat and slice kernels do both, so:
 *
 *   - a concatenation or slice read by nothing but one concatenation along
 *     the same axis is written straight into its place in that one's
 *     output. The model builder makes a concatenate of three inputs as two
 *     binary ones; the inner one is then written into the outer's output,
 *     and each input is copied once instead of the first two twice;
 *   - a slice read by nothing but slices and concatenations along its axis
 *     is read where it lies in its input: the gradient of a concatenation
 *     of three is a slice of dy and slices of that slice, and only the
 *     last ones copy.
 *
 * Concatenations and slices are never along a batched axis (the shapes
 * refuse it), so the offsets do not move with the run's batch. The same
 * copies of the same values: the same bits. The values stay where the
 * planner put their storage: the part's liveness is its storage's (plan.c). */
#include "graph_internal.h"

/* Elements of n from axis on: one block. */
static size_t block_elems(const kn_node_rec *n, int axis) {
  size_t r = 1;
  for (int d = axis; d < n->ndim; d++) r *= (size_t)n->dims[d];
  return r;
}

/* Whether n is a concat or slice along axis. */
static int moves_along(const kn_node_rec *n, int axis) {
  return (n->op == KN_OP_CONCAT || n->op == KN_OP_SLICE) && n->attr.slice.axis == axis;
}

/* A concat or slice the pass may place inside another node's storage: an
 * arena value of its own, computed every run on the CPU, that the run's
 * caller never reads and no other pass writes elsewhere. */
static int placeable(const kn_node_rec *n, int axis) {
  return !n->dead && moves_along(n, axis) && n->storage == KN_STORE_ARENA && !n->folded &&
         !n->keep && !n->narrow_copy && !n->written_by && !n->round_bf16 && !n->remat_of &&
         n->device.kind == KN_DEVICE_CPU;
}

/* Whether every live node that reads x is a concat or slice along axis
 * (when `only` >= 0: is node `only`, reading x once). */
static int read_only_along(const kn_graph *g, kn_node x, int axis, kn_node only) {
  for (int c = x + 1; c < g->n_nodes; c++) {
    const kn_node_rec *r = &g->nodes[c];
    if (r->dead) continue;
    int reads = 0;
    for (int k = 0; k < r->n_inputs; k++) reads += r->inputs[k] == x;
    if (!reads) continue;
    if (only >= 0 ? c != only || reads > 1 : !moves_along(r, axis)) return 0;
  }
  return 1;
}

/* Node x becomes a part of node of's storage, off elements in, its blocks
 * along axis as far apart as of's blocks lie (of's own, or those of the
 * storage of is a part of). */
static void make_part(kn_graph *g, kn_node x, kn_node of, int axis, size_t off) {
  const kn_node_rec *O = &g->nodes[of];
  kn_node_rec *X = &g->nodes[x];
  X->storage = KN_STORE_PART;
  X->part_of = of + 1;
  X->part_axis = axis;
  X->part_off = off;
  X->pitch = kn_block_pitch(O, block_elems(O, axis));
}

int kn_lower_concat_views(kn_graph *g) {
  int parts = 0;
  /* Outer concatenations first, so that an inner one placed in an outer
   * one's storage is settled before its own inputs are placed in it. */
  for (kn_node c = g->n_nodes - 1; c >= 0; c--) {
    const kn_node_rec *C = &g->nodes[c];
    if (C->dead || C->op != KN_OP_CONCAT || C->folded || C->device.kind != KN_DEVICE_CPU ||
        (C->storage != KN_STORE_ARENA && C->storage != KN_STORE_PART) ||
        C->inputs[0] == C->inputs[1])
      continue;
    const int axis = C->attr.slice.axis;
    /* input k's blocks start this far into the output's */
    size_t off = 0;
    for (int k = 0; k < 2; k++) {
      const kn_node x = C->inputs[k];
      const kn_node_rec *X = &g->nodes[x];
      const size_t inner = block_elems(X, axis + 1);
      if (placeable(X, axis) && X->dtype == C->dtype && read_only_along(g, x, axis, c)) {
        make_part(g, x, c, axis, off);
        parts++;
      }
      off += (size_t)X->dims[axis] * inner;
      C = &g->nodes[c];
    }
  }
  /* Slices read where they lie, in schedule order: a slice of a slice
   * placed in its input reads through it. */
  for (kn_node s = 0; s < g->n_nodes; s++) {
    const kn_node_rec *S = &g->nodes[s];
    if (S->op != KN_OP_SLICE || !placeable(S, S->attr.slice.axis)) continue;
    const int axis = S->attr.slice.axis;
    const kn_node x = S->inputs[0];
    const kn_node_rec *X = &g->nodes[x];
    const int dense =
        X->storage == KN_STORE_ARENA ||
        (X->storage == KN_STORE_VIEW && g->nodes[kn_storage_root(g, x)].storage == KN_STORE_ARENA);
    if (X->dtype != S->dtype || X->device.kind != KN_DEVICE_CPU ||
        !(dense || (X->storage == KN_STORE_PART && X->part_axis == axis)) ||
        kn_op_has(g->nodes[kn_storage_root(g, x)].op, KN_OPF_FED) ||
        !read_only_along(g, s, axis, -1))
      continue;
    make_part(g, s, x, axis, (size_t)S->attr.slice.start * block_elems(X, axis + 1));
    parts++;
  }
  return parts;
}
