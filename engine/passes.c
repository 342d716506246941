/* passes.c — graph optimizations run by compile, each switchable
 * (kn_graph_set_passes): common-subexpression elimination, fusion of
 * matmul (or a convolution's GEMM) + bias + relu into one kernel, of
 * elementwise chains ending in relu and of a max pool's gradient with the
 * gradient of the relu it reads, constant folding (constant subgraphs
 * computed once at compile, not every step) and dead-node elimination;
 * and the order they run in with the lowering onto the CPU backend's own
 * kernels (lower_cpu.c). Purity and the relu epilogue are asked of the op
 * table; in-place reuse is decided by the planner (plan.c) for the ops
 * the table allows it. Passes never change values: tests run every graph
 * with each pass on and off and compare. */
#include <stdio.h>
#include <string.h>

#include "graph_internal.h"

void kn_graph_set_passes(kn_graph *g, unsigned passes) {
  g->passes = passes & KN_PASS_ALL;
  g->passes_set = 1;
}

void kn_graph_set_unoptimized(kn_graph *g, int unoptimized) {
  g->unoptimized = unoptimized != 0;
}

unsigned kn_graph_passes(const kn_graph *g) {
  if (g->unoptimized) return 0;
  return g->passes_set ? g->passes : KN_PASS_ALL;
}

/* Consumers of each node among live nodes. */
static void count_consumers(kn_graph *g, int *uses) {
  memset(uses, 0, (size_t)g->n_nodes * sizeof *uses);
  for (int i = 0; i < g->n_nodes; i++) {
    const kn_node_rec *n = &g->nodes[i];
    if (n->dead) continue;
    for (int k = 0; k < n->n_inputs; k++) uses[n->inputs[k]]++;
  }
}

/* Whether a and b have the same dimensions. */
static int same_dims(const kn_node_rec *a, const kn_node_rec *b) {
  if (a->ndim != b->ndim || a->batched != b->batched) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->dims[d] != b->dims[d]) return 0;
  return 1;
}

/* Ops whose value depends on only their inputs and attrs and that write
 * nowhere else: merged, folded and removed as duplicates. */
static int pure(kn_op op) {
  return !kn_op_has(op, KN_OPF_IMPURE);
}

static int same_node(const kn_node_rec *a, const kn_node_rec *b) {
  if (a->op != b->op || a->dtype != b->dtype || a->ndim != b->ndim || a->batched != b->batched ||
      a->n_inputs != b->n_inputs || a->storage != b->storage || a->device.kind != b->device.kind ||
      a->device.index != b->device.index)
    return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->dims[d] != b->dims[d]) return 0;
  for (int k = 0; k < a->n_inputs; k++)
    if (a->inputs[k] != b->inputs[k]) return 0;
  return memcmp(&a->attr, &b->attr, sizeof a->attr) == 0 && a->fused_relu == b->fused_relu &&
         a->gemm_pair == b->gemm_pair && a->argmax == b->argmax && a->argmax_at == b->argmax_at &&
         a->written_by == b->written_by && a->narrow_copy == b->narrow_copy;
}

/* A later node equal to an earlier one (same op, attrs and inputs) is
 * replaced by it in every consumer; DCE then drops it. */
static int cse(kn_graph *g) {
  int merged = 0;
  for (int j = 0; j < g->n_nodes; j++) {
    kn_node_rec *b = &g->nodes[j];
    if (b->dead || b->keep || !pure(b->op) ||
        (b->storage != KN_STORE_ARENA && b->storage != KN_STORE_VIEW))
      continue;
    for (int i = 0; i < j; i++) {
      kn_node_rec *a = &g->nodes[i];
      if (a->dead || !same_node(a, b)) continue;
      /* Forward values stay in the forward part, so a forward-only run still
       * computes every value it reads; and a backward re-creation of a
       * forward value (recompute, widened copy) is there so that value can
       * die in forward. */
      if (i >= g->n_forward && j < g->n_forward) continue;
      if (b->remat_of && i < g->n_forward) continue;
      for (int c = j + 1; c < g->n_nodes; c++) {
        kn_node_rec *n = &g->nodes[c];
        for (int k = 0; k < n->n_inputs; k++)
          if (n->inputs[k] == j) n->inputs[k] = i;
      }
      b->dead = 1;
      merged++;
      break;
    }
  }
  return merged;
}

static int read_by_relu(const kn_graph *g, kn_node x) {
  for (int c = x + 1; c < g->n_nodes; c++) {
    const kn_node_rec *n = &g->nodes[c];
    if (!n->dead && n->op == KN_OP_RELU && n->inputs[0] == x) return 1;
  }
  return 0;
}

/* relu(bias_add(matmul(a, w), b)), with the matmul possibly under a reshape
 * (a convolution's GEMM), becomes one matmul with a bias + relu epilogue
 * written straight into the relu's storage; bias_add(matmul) alone fuses
 * the same way. The inner values must have no other reader: backward needs
 * only the relu's output (relu_grad) and the matmul's inputs. */
static int fuse(kn_graph *g, int *uses) {
  int fused = 0;
  count_consumers(g, uses);
  for (int i = 0; i < g->n_nodes; i++) {
    kn_node_rec *top = &g->nodes[i];
    if (top->dead || top->storage != KN_STORE_ARENA) continue;
    int act = top->op == KN_OP_RELU;
    kn_node bias_node = act ? top->inputs[0] : i;
    kn_node_rec *bn = &g->nodes[bias_node];
    if (bn->op != KN_OP_BIAS_ADD || bn->dead) continue;
    /* A bias_add whose one reader is a relu fuses with it, there. */
    if (!act && uses[i] == 1 && read_by_relu(g, i)) continue;
    if (act && (uses[bias_node] != 1 || bn->keep || bn->storage != KN_STORE_ARENA)) continue;
    kn_node mm = bn->inputs[0], view = -1;
    if (g->nodes[mm].op == KN_OP_RESHAPE) {
      view = mm;
      mm = g->nodes[view].inputs[0];
      if (uses[view] != 1 || g->nodes[view].keep) continue;
    }
    kn_node_rec *m = &g->nodes[mm];
    if (m->op != KN_OP_MATMUL || m->dead || m->keep || uses[mm] != 1 ||
        m->storage != KN_STORE_ARENA)
      continue;
    /* The bias runs along the matmul's columns. */
    if (m->dims[1] != bn->dims[bn->ndim - 1]) continue;
    kn_node a = m->inputs[0], w = m->inputs[1], bias = bn->inputs[1];
    const int ta = m->attr.matmul.trans_a, tb = m->attr.matmul.trans_b;
    top->op = KN_OP_MATMUL_BIAS_ACT;
    top->n_inputs = 3;
    top->inputs[0] = a;
    top->inputs[1] = w;
    top->inputs[2] = bias;
    memset(&top->attr, 0, sizeof top->attr);
    top->attr.matmul.trans_a = ta;
    top->attr.matmul.trans_b = tb;
    top->attr.matmul.relu = act;
    top->fused_relu = top->gemm_pair = top->argmax = top->argmax_at = 0;
    m->dead = 1;
    if (view >= 0) g->nodes[view].dead = 1;
    if (act) bn->dead = 1;
    fused++;
    count_consumers(g, uses);
  }
  return fused;
}

/* The relu node top takes its producer's op, inputs and attrs (its shape
 * is the producer's) with the relu in its loop, so relu_grad keeps reading
 * the same value; it keeps its own name, storage and bf16 copy, and the
 * producer goes. */
static void relu_takes_producer(kn_node_rec *top, kn_node_rec *pr) {
  kn_node_rec fused_node = *pr;
  fused_node.fused_relu = 1;
  fused_node.narrow_copy = top->narrow_copy;
  fused_node.storage = top->storage;
  fused_node.keep = top->keep;
  fused_node.requires_grad = top->requires_grad;
  memcpy(fused_node.name, top->name, sizeof fused_node.name);
  *top = fused_node;
  pr->dead = 1;
}

/* Elementwise chains: relu(bias_add | add | binary | bn_apply) becomes the
 * producer with a relu in its loop, one pass over memory instead of two,
 * when the producer's value has no other reader. The gradients of these
 * producers read their inputs (and relu_grad the relu's output), never the
 * producer's own value, so training graphs fuse too.
 *
 * rounded: under mixed_bfloat16 the relu after a batch norm's apply or an
 * add reads that value rounded through bf16 (the layer boundary's
 * rounding), so the first run, before the narrowing, sees a cast between
 * the two. Once the narrow_copies pass has taken the rounding into the
 * producer (its round_bf16), a second run fuses those, the f32 relu
 * keeping its bf16 copy: round(relu(v)), the value relu(round(v)) had
 * (both round the positive values alike and zero the others), but for the
 * sign of a zero from a negative value under bf16's smallest. */
static int fuse_chains(kn_graph *g, int *uses, int rounded) {
  int fused = 0;
  count_consumers(g, uses);
  for (int i = 0; i < g->n_nodes; i++) {
    kn_node_rec *top = &g->nodes[i];
    if (top->dead || top->op != KN_OP_RELU || top->storage != KN_STORE_ARENA) continue;
    kn_node p = top->inputs[0];
    kn_node_rec *pr = &g->nodes[p];
    const int chain = rounded
                          ? (pr->op == KN_OP_BN_APPLY || pr->op == KN_OP_ADD) && pr->round_bf16 &&
                                !pr->narrow_copy && pr->dtype == KN_F32 && top->dtype == KN_F32
                          : kn_op_has(pr->op, KN_OPF_RELU_EPILOGUE);
    if (!chain || pr->dead || pr->keep || uses[p] != 1 || pr->storage != KN_STORE_ARENA ||
        pr->fused_relu)
      continue;
    relu_takes_producer(top, pr);
    fused++;
    count_consumers(g, uses);
  }
  return fused;
}

/* relu_grad(pool_grad(dy, x, y), x), where a tiled max pool reads the
 * relu's output x, becomes the pool gradient with relu set: the gradient
 * reaches only the cell holding each window's maximum, and relu's mask
 * there is that maximum (y) above 0. One pass over the layer's largest
 * gradient instead of two. Runs after the bf16 narrowing, which may have
 * made both nodes bf16; the fused node keeps relu_grad's type and storage. */
static int fuse_pool_relu_grads(kn_graph *g, int *uses) {
  int fused = 0;
  count_consumers(g, uses);
  for (int i = 0; i < g->n_nodes; i++) {
    kn_node_rec *r = &g->nodes[i];
    if (r->dead || r->op != KN_OP_RELU_GRAD) continue;
    kn_node p = r->inputs[0];
    kn_node_rec *pg = &g->nodes[p];
    if (pg->dead || pg->op != KN_OP_POOL_GRAD || !kn_pool_tiles(&pg->attr.conv) || pg->keep ||
        uses[p] != 1 || pg->storage != KN_STORE_ARENA || pg->inputs[1] != r->inputs[1] ||
        pg->fused_relu)
      continue;
    r->op = KN_OP_POOL_GRAD;
    r->n_inputs = 3;
    memcpy(r->inputs, pg->inputs, sizeof r->inputs);
    r->attr = pg->attr;
    r->gemm_pair = pg->gemm_pair;
    r->argmax = pg->argmax;
    r->argmax_at = pg->argmax_at;
    r->fused_relu = 1;
    pg->dead = 1;
    fused++;
    count_consumers(g, uses);
  }
  return fused;
}

/* add(a, t), t's value read by nothing but the add, where t's kernel can
 * add a term as it stores each value: the add becomes t with a as one
 * input more, so t's value is never written and read back. The same bits
 * (an add's terms commute). float32 values of one shape in arena storage.
 * The ops that take an add in, each run where its pass leaves it:
 *   - bn_apply (a residual block's end, after bn_fold): the shortcut added
 *     before the add's relu; the norm has no relu of its own and comes
 *     after the term. Where bn_fold folded it, the fold now names the
 *     add, whose kernel adds the term and applies the relu after the
 *     matmul's write;
 *   - col2im_gemm summed directly (conv_dx.c; after col2im_chunks): a
 *     downsampling block's strided and projection input gradients; of two
 *     such terms the one of fewer taps takes the other in, and over the
 *     other's storage (plan.c) a 1x1 stride-2 projection writes only the
 *     quarter of dx its taps reach;
 *   - conv_input_grad by Winograd in float32 (after the winograd pass): an
 *     identity block's branch gradient meeting the shortcut's, added in
 *     the output transform. */
static int takes_in_add(const kn_graph *g, const int *uses, kn_op op, kn_node t, kn_node term) {
  const kn_node_rec *T = &g->nodes[t], *O = &g->nodes[term];
  if (T->dead || T->op != op || uses[t] != 1 || T->keep || T->written_by ||
      T->storage != KN_STORE_ARENA || T->dtype != KN_F32 || T->round_bf16 || T->narrow_copy ||
      T->folded || O->dtype != KN_F32 || O->storage == KN_STORE_PART || !same_dims(O, T))
    return 0;
  switch (op) {
  case KN_OP_BN_APPLY: return T->n_inputs == 4 && !T->fused_relu && term < t;
  case KN_OP_COL2IM_GEMM: return T->n_inputs == 2 && kn_conv_dx_direct(g, T);
  case KN_OP_CONV_INPUT_GRAD: /* Winograd's in float32, or directly on AMX tiles */
    return T->n_inputs == 2 && (T->winograd == 1 || T->winograd == 4);
  default: return 0;
  }
}

static int fuse_adds_into(kn_graph *g, int *uses, kn_op op) {
  int fused = 0;
  count_consumers(g, uses);
  for (int i = 0; i < g->n_nodes; i++) {
    kn_node_rec *A = &g->nodes[i];
    if (A->dead || A->op != KN_OP_ADD || A->n_inputs != 2 || A->keep || A->written_by ||
        A->eval_written_by || A->storage != KN_STORE_ARENA || A->dtype != KN_F32 ||
        A->narrow_copy || A->folded)
      continue;
    /* a rounded sum: an input gradient's products round after the add
     * (kn_wino_io.round_y), the same value */
    if (A->round_bf16 && op != KN_OP_CONV_INPUT_GRAD) continue;
    if (A->fused_relu && op != KN_OP_BN_APPLY) continue; /* only the norm applies a relu after */
    int best = -1, best_taps = 0;
    for (int k = 0; k < 2; k++) {
      const kn_node t = A->inputs[k];
      if (!takes_in_add(g, uses, op, t, A->inputs[1 - k]) || !same_dims(&g->nodes[t], A)) continue;
      const int taps = g->nodes[t].attr.conv.kh * g->nodes[t].attr.conv.kw; /* col2im_gemm's */
      if (best < 0 || (op == KN_OP_COL2IM_GEMM && taps < best_taps)) {
        best = k;
        best_taps = taps;
      }
    }
    if (best < 0) continue;
    kn_node_rec *T = &g->nodes[A->inputs[best]];
    const kn_node term = A->inputs[1 - best];
    A->op = T->op;
    memcpy(A->inputs, T->inputs, (size_t)T->n_inputs * sizeof A->inputs[0]);
    A->inputs[T->n_inputs] = term;
    A->n_inputs = T->n_inputs + 1;
    A->attr = T->attr;
    A->batched = T->batched;
    A->winograd = T->winograd;
    if (T->eval_written_by) {
      A->eval_written_by = T->eval_written_by;
      g->nodes[T->eval_written_by - 1].bn_fold = i + 1;
    }
    T->dead = 1;
    fused++;
    count_consumers(g, uses);
  }
  return fused;
}

/* relu_grad(add(a, b), y), the add read by nothing else (a residual
 * block's gradient, where the shortcut's meets the branch's, then the
 * relu before them): one pass, a + b where y passes, instead of the sum
 * written and read back. The fused node reads a, y and b (inputs 0, 1
 * and 2) and adds as the add did, so the bits are the same. float32
 * values of one shape in arena storage, neither node rounded through
 * bf16 or copied; run after the passes that read relu_grad's two inputs
 * (bn_grads, the narrowing, concat_views). */
static int fuse_add_relu_grads(kn_graph *g, int *uses) {
  int fused = 0;
  count_consumers(g, uses);
  for (int i = 0; i < g->n_nodes; i++) {
    kn_node_rec *r = &g->nodes[i];
    if (r->dead || r->op != KN_OP_RELU_GRAD || r->n_inputs != 2 || r->dtype != KN_F32 ||
        r->storage != KN_STORE_ARENA || r->round_bf16 || r->narrow_copy || r->fused_relu)
      continue;
    const kn_node p = r->inputs[0];
    kn_node_rec *A = &g->nodes[p];
    if (A->dead || A->op != KN_OP_ADD || A->n_inputs != 2 || A->keep || A->written_by ||
        uses[p] != 1 || A->storage != KN_STORE_ARENA || A->dtype != KN_F32 || A->round_bf16 ||
        A->narrow_copy || A->fused_relu || !same_dims(A, r) ||
        !same_dims(&g->nodes[r->inputs[1]], r) || g->nodes[r->inputs[1]].dtype != KN_F32)
      continue;
    int plain = 1;
    for (int k = 0; k < 2; k++) {
      const kn_node_rec *in = &g->nodes[A->inputs[k]];
      plain &= in->dtype == KN_F32 && in->storage != KN_STORE_PART && same_dims(in, r);
    }
    if (!plain) continue;
    r->n_inputs = 3;
    r->inputs[2] = A->inputs[1];
    r->inputs[0] = A->inputs[0];
    A->dead = 1;
    fused++;
    count_consumers(g, uses);
  }
  return fused;
}

/* Constant subgraphs (fills and pure ops of constants, unbatched) are
 * computed once at compile and never again. */
static int fold_constants(kn_graph *g) {
  int folded = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    kn_node_rec *n = &g->nodes[i];
    if (n->dead || n->batched || !pure(n->op) || n->storage == KN_STORE_GRAD) continue;
    int constant = n->op == KN_OP_FILL;
    if (n->op != KN_OP_FILL && n->n_inputs > 0) {
      constant = 1;
      for (int k = 0; k < n->n_inputs; k++) constant &= g->nodes[n->inputs[k]].folded;
    }
    if (!constant) continue;
    n->folded = 1;
    n->keep = 1; /* its storage holds the value for every run */
    folded++;
  }
  return folded;
}

/* Nodes no kept value, gradient or side effect depends on are dropped. */
static int eliminate_dead(kn_graph *g, int *live) {
  memset(live, 0, (size_t)g->n_nodes * sizeof *live);
  for (int i = g->n_nodes - 1; i >= 0; i--) {
    const kn_node_rec *n = &g->nodes[i];
    if (n->dead) continue;
    if (n->keep || n->storage == KN_STORE_GRAD || kn_op_has(n->op, KN_OPF_FED | KN_OPF_FLAT))
      live[i] = 1;
    if (!live[i]) continue;
    for (int k = 0; k < n->n_inputs; k++) live[n->inputs[k]] = 1;
  }
  int removed = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    if (!live[i] && !g->nodes[i].dead) {
      g->nodes[i].dead = 1;
      removed++;
    }
  }
  return removed;
}

int kn_run_passes(kn_graph *g, int *scratch, kn_pass_stats *st) {
  unsigned passes = kn_graph_passes(g);
  const int max_nodes = 2 * g->n_nodes; /* what scratch holds */
  memset(st, 0, sizeof *st);
  /* A graph with nodes on a GPU keeps every node as placed (a fused or
   * rewritten op has no CUDA kernel): only the passes that drop nodes,
   * fold constants (on the CPU, at compile) and share buffers run. */
  if (kn_graph_places_on_gpu(g))
    passes &= KN_PASS_DCE | KN_PASS_CSE | KN_PASS_CONST_FOLD | KN_PASS_INPLACE;
  /* Unread values first (mixed precision's unused narrow copies), so they
   * do not count as readers that block fusion. */
  if (passes & KN_PASS_DCE) st->dead = eliminate_dead(g, scratch);
  if (passes & KN_PASS_CSE) st->cse = cse(g);
  if (passes & KN_PASS_FUSION) {
    st->fused = fuse(g, scratch);
    st->fused += fuse_chains(g, scratch, 0);
  }
  /* (not on GPU graphs: the CUDA GEMMs read f32 operands, and round them
   * to bf16 themselves under mixed_bfloat16) */
  if (!kn_graph_places_on_gpu(g)) kn_lower_narrow_gemm_operands(g);
  if (passes & KN_PASS_FUSION) {
    st->fused += fuse_pool_relu_grads(g, scratch);
  }
  if (passes & KN_PASS_POOL_ARGMAX) st->pool_argmax = kn_lower_pool_argmax(g, max_nodes);
  if (passes & KN_PASS_BN_GRADS) st->bn_grads = kn_lower_bn_grads(g, &st->bn_relu_grads);
  if (passes & KN_PASS_CONST_FOLD) st->folded = fold_constants(g);
  if (passes & KN_PASS_DCE) st->dead += eliminate_dead(g, scratch);
  /* Last: the values the narrowing left unread are gone, so they do not
   * count as readers of an im2col. */
  if (passes & KN_PASS_IMPLICIT_COLUMNS) st->implicit = kn_lower_implicit_columns(g);
  if (passes & KN_PASS_IMPLICIT_INPUT_GRAD)
    st->implicit_input_grads = kn_lower_implicit_input_grads(g);
  if (passes & KN_PASS_COL2IM_CHUNKS) st->col2im_chunks = kn_lower_col2im_chunks(g);
  if ((passes & KN_PASS_COL2IM_CHUNKS) && (passes & KN_PASS_FUSION))
    st->fused += fuse_adds_into(g, scratch, KN_OP_COL2IM_GEMM);
  if (passes & KN_PASS_BIAS_GRAD_IN_GEMM) st->bias_grads_in_gemm = kn_lower_bias_grads_in_gemm(g);
  if (passes & KN_PASS_POOL_GRAD_IN_GEMM) st->pool_grads_in_gemm = kn_lower_pool_grads_in_gemm(g);
  if (passes & KN_PASS_NARROW_COPIES) {
    st->narrow_copies = kn_lower_rounds_in_producers(g);
    /* the bf16 copies only the casts taken in read are read by nothing now */
    if (passes & KN_PASS_DCE) st->dead += eliminate_dead(g, scratch);
    st->narrow_copies += kn_lower_narrow_copies(g);
    if (passes & KN_PASS_FUSION) st->fused += fuse_chains(g, scratch, 1);
    st->narrow_copies += kn_lower_bf16_values(g);
  }
  /* After fusion (a relu taken into the batch norm goes with it). */
  if (passes & KN_PASS_BN_FOLD) st->bn_folds = kn_lower_bn_fold(g);
  if (passes & KN_PASS_FUSION) st->fused += fuse_adds_into(g, scratch, KN_OP_BN_APPLY);
  /* After every pass that may add a reader or drop one. */
  if (passes & KN_PASS_CONCAT_VIEWS) st->concat_views = kn_lower_concat_views(g);
  if (passes & KN_PASS_FUSION) st->fused += fuse_add_relu_grads(g, scratch);
  /* Last: it takes over GEMMs as the passes above left them (their padded
   * inputs, pairs, pool gradients and storage). */
  if (passes & KN_PASS_WINOGRAD) st->winograd = kn_lower_winograd(g);
  if ((passes & KN_PASS_WINOGRAD) && (passes & KN_PASS_FUSION))
    st->fused += fuse_adds_into(g, scratch, KN_OP_CONV_INPUT_GRAD);
  return 0;
}
