/* plan.c — memory planning and execution. Liveness over the schedule gives
 * each arena value a [first, last] interval; placing the largest first at
 * the lowest offset free over its interval packs them into one arena,
 * allocated and touched once at compile time, so running a step allocates
 * nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amx_conv.h"
#include "backend.h"

#define KN_ALIGN 64

static size_t align_up(size_t v) {
  return (v + KN_ALIGN - 1) & ~(size_t)(KN_ALIGN - 1);
}

/* A backward node that re-runs a forward op (not a widened narrow copy,
 * nor a view of one). */
static int is_recompute(const kn_node_rec *n) {
  return n->remat_of && n->op != KN_OP_CAST && n->storage != KN_STORE_VIEW;
}

/* The planning view of a graph: what counts as a view of what, and which
 * nodes are planned. With `without_recompute`, each recompute stands for
 * the forward value it re-creates (as if that value were kept), and nodes
 * only recomputes read are not there: the graph as it would be with
 * recompute off. */
typedef struct plan_view {
  int without_recompute;
  const unsigned char *skip; /* n_nodes: not planned (dead, or absent in this view) */
} plan_view;

static kn_node plan_root(const kn_graph *g, const plan_view *v, kn_node n) {
  for (;;) {
    const kn_node_rec *r = &g->nodes[n];
    if (r->storage == KN_STORE_VIEW)
      n = r->inputs[0];
    else if (r->storage == KN_STORE_PART)
      n = r->part_of - 1;
    else if (v->without_recompute && is_recompute(r))
      n = r->remat_of - 1;
    else
      return n;
  }
}

static int plan_is_view(const kn_graph *g, const plan_view *v, kn_node n) {
  return g->nodes[n].storage == KN_STORE_VIEW || g->nodes[n].storage == KN_STORE_PART ||
         (v->without_recompute && is_recompute(&g->nodes[n]));
}

static void compute_liveness(kn_graph *g, const plan_view *v) {
  for (int i = 0; i < g->n_nodes; i++) {
    /* a pool's argmax bytes are written when the pool runs */
    const int at = g->nodes[i].op == KN_OP_POOL_ARGMAX ? g->nodes[i].attr.argmax_of - 1 : i;
    g->nodes[i].first_use = at;
    g->nodes[i].last_use = at;
  }
  for (int i = 0; i < g->n_nodes; i++) {
    const kn_node_rec *n = &g->nodes[i];
    if (v->skip[i]) continue;
    /* A recompute standing for its forward value reads nothing. */
    for (int k = 0; k < n->n_inputs && !(v->without_recompute && is_recompute(n)); k++) {
      kn_node root = plan_root(g, v, n->inputs[k]);
      if (g->nodes[root].last_use < i) g->nodes[root].last_use = i;
    }
    /* A view is live as long as whatever reads it; extend its root too.
     * A part of a later node's storage (a concatenation's input written in
     * place) makes that storage live from where the part is written. */
    if (plan_is_view(g, v, i)) {
      kn_node root = plan_root(g, v, i);
      if (g->nodes[root].last_use < i) g->nodes[root].last_use = i;
      if (g->nodes[root].first_use > i) g->nodes[root].first_use = i;
    }
  }
  for (int i = 0; i < g->n_nodes; i++) {
    kn_node_rec *n = &g->nodes[i];
    if (n->keep || kn_op_has(n->op, KN_OPF_FED)) {
      /* Never reused, nor is the storage a kept view aliases (logits that
       * are a flatten of the last layer are read after the run). */
      n->last_use = g->n_nodes;
      g->nodes[plan_root(g, v, i)].last_use = g->n_nodes;
    }
    if (n->folded) n->first_use = 0; /* computed at compile */
    /* a matmul whose GEMM an earlier reduce_rows runs is written there */
    if (n->op == KN_OP_MATMUL && n->gemm_pair && n->gemm_pair - 1 < n->first_use)
      n->first_use = n->gemm_pair - 1;
    /* a value an earlier node writes is live from there */
    if (n->written_by && n->written_by - 1 < n->first_use) n->first_use = n->written_by - 1;
    if (n->eval_written_by && n->eval_written_by - 1 < n->first_use)
      n->first_use = n->eval_written_by - 1;
  }
}

/* Whether node i gets arena bytes of its own in this view. */
static int planned(const kn_graph *g, const plan_view *v, kn_node i) {
  return g->nodes[i].storage == KN_STORE_ARENA && !v->skip[i] && !plan_is_view(g, v, i);
}

/* Values that share one buffer: a node and the in-place chain it starts. */
typedef struct group {
  int first, last; /* schedule positions the buffer is live over */
  size_t size, offset;
} group;

static int by_size_desc(const void *pa, const void *pb) {
  const group *a = *(const group *const *)pa, *b = *(const group *const *)pb;
  if (a->size != b->size) return a->size < b->size ? 1 : -1;
  return (a->first > b->first) - (a->first < b->first);
}

static int by_offset(const void *pa, const void *pb) {
  const group *a = *(const group *const *)pa, *b = *(const group *const *)pb;
  return (a->offset > b->offset) - (a->offset < b->offset);
}

/* Liveness and offsets for the graph as the view sees it; offsets land in
 * the nodes, the peak in *peak. Buffers are placed largest first, each at
 * the lowest offset free over its whole lifetime (greedy by size, as
 * TFLite's arena planner): unlike handing out offsets in schedule order, a
 * small long-lived value (a narrow copy kept for backward) cannot end up
 * above a big short-lived one and pin the arena's top. */
static int plan_arena(kn_graph *g, const plan_view *v, size_t *peak, int *n_inplace_out) {
  const int n_nodes = g->n_nodes;
  int *owner = malloc((size_t)n_nodes * sizeof *owner);
  group *groups = malloc((size_t)n_nodes * sizeof *groups);
  group **sorted = malloc((size_t)n_nodes * sizeof *sorted);
  group **placed = malloc((size_t)n_nodes * sizeof *placed);
  int rc = -1, n_groups = 0, n_inplace = 0;
  if (!owner || !groups || !sorted || !placed) {
    kn_graph_fail(g, KN_ENOMEM, "compile: out of memory");
    goto out;
  }
  const int inplace = (kn_graph_passes(g) & KN_PASS_INPLACE) != 0;
  compute_liveness(g, v);
  g->naive_bytes = 0;
  for (int i = 0; i < n_nodes; i++) {
    owner[i] = -1;
    kn_node_rec *n = &g->nodes[i];
    if (!planned(g, v, i)) continue;
    size_t bytes = align_up(kn_node_planned_bytes(g, n));
    g->naive_bytes += bytes;
    if (g->unoptimized) { /* one buffer per node */
      n->arena_offset = g->naive_bytes - bytes;
      continue;
    }
    /* In place: an elementwise op takes over the buffer of an input whose
     * last reader it is (same size and type, not kept); the buffer then
     * lives until this node dies. */
    kn_node donor = -1;
    const unsigned may_overwrite = kn_op_def_of(n->op)->inplace_inputs;
    for (int k = 0; !n->folded && inplace && k < n->n_inputs && donor < 0; k++) {
      if (!(may_overwrite & (1u << k))) continue;
      /* a folded norm's matmul writes its buffer before it reads the
       * add it took in (fuse_adds_into) */
      if (n->op == KN_OP_BN_APPLY && k == 4 && n->eval_written_by) continue;
      /* col2im_gemm adds the term it took in where it stores each dx
       * element only when summed directly (the columns' col2im writes dx
       * first) */
      if (n->op == KN_OP_COL2IM_GEMM && !kn_conv_dx_direct(g, n)) continue;
      kn_node r = plan_root(g, v, n->inputs[k]);
      const kn_node_rec *in = &g->nodes[r];
      if (planned(g, v, r) && owner[r] >= 0 && !in->keep && !in->folded &&
          !kn_op_has(in->op, KN_OPF_FED) && in->dtype == n->dtype && in->last_use == i &&
          align_up(kn_node_planned_bytes(g, in)) == bytes)
        donor = r;
    }
    if (donor >= 0) {
      owner[i] = owner[donor];
      group *gr = &groups[owner[i]];
      if (n->last_use > gr->last) gr->last = n->last_use;
      n_inplace++;
      continue;
    }
    owner[i] = n_groups;
    /* Constants hold their value from compile through every run. */
    groups[n_groups++] = (group){n->folded ? 0 : n->first_use, n->last_use, bytes, 0};
  }
  size_t top = 0;
  if (!g->unoptimized) {
    for (int k = 0; k < n_groups; k++) sorted[k] = &groups[k];
    qsort(sorted, (size_t)n_groups, sizeof *sorted, by_size_desc);
    for (int k = 0; k < n_groups; k++) {
      group *gr = sorted[k];
      int n_placed = 0;
      for (int j = 0; j < k; j++) {
        const group *o = sorted[j];
        if (o->first <= gr->last && gr->first <= o->last) placed[n_placed++] = sorted[j];
      }
      qsort(placed, (size_t)n_placed, sizeof *placed, by_offset);
      size_t offset = 0;
      for (int j = 0; j < n_placed; j++) {
        if (placed[j]->offset >= offset + gr->size) break;
        size_t end = placed[j]->offset + placed[j]->size;
        if (end > offset) offset = end;
      }
      gr->offset = offset;
      if (offset + gr->size > top) top = offset + gr->size;
    }
    for (int i = 0; i < n_nodes; i++)
      if (owner[i] >= 0) g->nodes[i].arena_offset = groups[owner[i]].offset;
  }
  *peak = g->unoptimized ? g->naive_bytes : top;
  *n_inplace_out = n_inplace;
  rc = 0;
out:
  free(owner);
  free(groups);
  free(sorted);
  free(placed);
  return rc;
}

/* The data of node i once every node with storage of its own has its: a
 * view's is its input's, a part's lies part_off elements into the storage
 * it is a part of (which may itself be a view or a part). */
static void *resolve_data(kn_graph *g, kn_node i) {
  kn_node_rec *n = &g->nodes[i];
  if (n->storage == KN_STORE_VIEW) {
    n->data = resolve_data(g, n->inputs[0]);
  } else if (n->storage == KN_STORE_PART) {
    unsigned char *whole = resolve_data(g, n->part_of - 1);
    n->data = whole + n->part_off * kn_graph_elem_size(g, n->dtype);
  }
  return n->data;
}

/* What compile reports, from the plan (and the passes' counts). */
static void fill_stats(const kn_graph *g, kn_plan_stats *stats, const kn_pass_stats *pass_stats,
                       int n_inplace, int n_recomputed, size_t pbytes) {
  if (!stats) return;
  stats->recompute_declined_bytes = 0; /* kn_model_compile's to say */
  stats->n_cse = pass_stats->cse;
  stats->n_fused = pass_stats->fused;
  stats->n_implicit = pass_stats->implicit;
  stats->n_implicit_input_grads = pass_stats->implicit_input_grads;
  stats->n_col2im_chunks = pass_stats->col2im_chunks;
  stats->n_bias_grads_in_gemm = pass_stats->bias_grads_in_gemm;
  stats->n_pool_argmax = pass_stats->pool_argmax;
  stats->n_pool_grads_in_gemm = pass_stats->pool_grads_in_gemm;
  stats->n_bn_grads = pass_stats->bn_grads;
  stats->n_bn_relu_grads = pass_stats->bn_relu_grads;
  stats->n_narrow_copies = pass_stats->narrow_copies;
  stats->n_concat_views = pass_stats->concat_views;
  stats->n_bn_folds = pass_stats->bn_folds;
  stats->n_winograd = pass_stats->winograd;
  stats->n_folded = pass_stats->folded;
  stats->n_dead = pass_stats->dead;
  stats->n_inplace = n_inplace;
  stats->arena_bytes = g->arena_bytes;
  stats->naive_bytes = g->naive_bytes;
  stats->param_bytes = pbytes;
  stats->grad_bytes = g->has_backward ? pbytes : 0;
  stats->n_nodes = g->n_nodes;
  stats->n_forward = g->n_forward;
  stats->saved_bytes = g->saved_bytes;
  stats->arena_bytes_without_recompute = g->arena_bytes_without_recompute;
  stats->n_recomputed = n_recomputed;
}

void kn_graph_set_plan_only(kn_graph *g) {
  g->plan_only = 1;
}

int kn_graph_compile(kn_graph *g, uint64_t seed, kn_plan_stats *stats, char *err, size_t errlen) {
  int rc = KN_OK;
  unsigned char *skip = NULL;
  if (g->error_code) goto out;
  if (g->compiled) {
    kn_graph_fail(g, KN_ESTATE, "compile: the graph is already compiled");
    goto out;
  }
  if (g->n_nodes <= 0) {
    kn_graph_fail(g, KN_EINVAL, "compile: the graph is empty");
    goto out;
  }
  if (kn_check_placement(g)) goto out;
  kn_pass_stats pass_stats;
  {
    int *scratch = malloc((size_t)2 * g->n_nodes * sizeof *scratch); /* kn_run_passes */
    if (!scratch) {
      kn_graph_fail(g, KN_ENOMEM, "compile: out of memory");
      goto out;
    }
    kn_run_passes(g, scratch, &pass_stats);
    free(scratch);
  }
  skip = calloc((size_t)g->n_nodes, 1);
  if (!skip) {
    kn_graph_fail(g, KN_ENOMEM, "compile: out of memory");
    goto out;
  }
  int n_inplace = 0, n_recomputed = 0;
  for (int i = 0; i < g->n_nodes; i++)
    n_recomputed += !g->nodes[i].dead && is_recompute(&g->nodes[i]);
  g->arena_bytes_without_recompute = 0;
  if (n_recomputed > 0 && !g->unoptimized) {
    /* Nodes only recomputes read are absent without recompute; a recompute
     * keeps its forward value alive instead. */
    for (int i = 0; i < g->n_nodes; i++) skip[i] = 1;
    for (int i = g->n_nodes - 1; i >= 0; i--) {
      const kn_node_rec *n = &g->nodes[i];
      if (n->dead) continue;
      if (n->keep || n->storage == KN_STORE_GRAD || kn_op_has(n->op, KN_OPF_FED | KN_OPF_FLAT))
        skip[i] = 0;
      if (skip[i]) continue;
      if (is_recompute(n)) {
        skip[i] = 1;
        skip[n->remat_of - 1] = 0;
      } else {
        for (int k = 0; k < n->n_inputs; k++) skip[n->inputs[k]] = 0;
      }
    }
    plan_view without = {1, skip};
    int unused;
    if (plan_arena(g, &without, &g->arena_bytes_without_recompute, &unused)) goto out;
  }
  for (int i = 0; i < g->n_nodes; i++) skip[i] = (unsigned char)g->nodes[i].dead;
  plan_view as_is = {0, skip};
  if (plan_arena(g, &as_is, &g->arena_bytes, &n_inplace)) goto out;
  if (!n_recomputed) g->arena_bytes_without_recompute = g->arena_bytes;
  /* Forward values still live when backward starts: what forward keeps
   * for backward. */
  g->saved_bytes = 0;
  for (int i = 0; g->has_backward && i < g->n_forward; i++) {
    const kn_node_rec *n = &g->nodes[i];
    if (n->storage == KN_STORE_ARENA && !n->dead && !n->folded && n->last_use >= g->n_forward)
      g->saved_bytes += align_up(kn_node_planned_bytes(g, n));
  }

  if (g->plan_only) {
    const size_t pbytes = g->n_param_floats * (g->f64 ? sizeof(double) : sizeof(float));
    fill_stats(g, stats, &pass_stats, n_inplace, n_recomputed, pbytes);
    goto out;
  }
  /* One allocation each, touched now so no step pays for first touch. In
   * the f64 reference mode the flat buffers hold doubles. */
  if (g->f64) {
    for (int i = 0; i < g->n_nodes; i++) {
      if (g->nodes[i].dtype == KN_F32) g->nodes[i].dtype = KN_F64;
    }
  }
  const size_t esize = g->f64 ? sizeof(double) : sizeof(float);
  size_t pbytes = g->n_param_floats * esize;
  size_t sbytes = g->n_state_floats * esize;
  g->arena = aligned_alloc(KN_ALIGN, align_up(g->arena_bytes ? g->arena_bytes : KN_ALIGN));
  g->param_buf = aligned_alloc(KN_ALIGN, align_up(pbytes ? pbytes : KN_ALIGN));
  g->grad_buf = aligned_alloc(KN_ALIGN, align_up(pbytes ? pbytes : KN_ALIGN));
  g->state_buf = aligned_alloc(KN_ALIGN, align_up(sbytes ? sbytes : KN_ALIGN));
  if (!g->arena || !g->param_buf || !g->grad_buf || !g->state_buf) {
    kn_graph_fail(g, KN_ENOMEM, "compile: cannot allocate %zu arena + 2 x %zu parameter bytes",
                  g->arena_bytes, pbytes);
    goto out;
  }
  memset(g->arena, 0, g->arena_bytes);
  memset(g->grad_buf, 0, pbytes);
  kn_pin_for_gpu(g, g->arena_bytes, pbytes);

  kn_rng rng;
  kn_rng_seed(&rng, seed);
  for (int i = 0; i < g->n_nodes; i++) {
    kn_node_rec *n = &g->nodes[i];
    switch (n->storage) {
    case KN_STORE_ARENA: n->data = g->arena + n->arena_offset; break;
    case KN_STORE_PARAM: n->data = (unsigned char *)g->param_buf + n->flat_offset * esize; break;
    case KN_STORE_GRAD: n->data = (unsigned char *)g->grad_buf + n->flat_offset * esize; break;
    case KN_STORE_STATE: n->data = (unsigned char *)g->state_buf + n->flat_offset * esize; break;
    case KN_STORE_VIEW:
    case KN_STORE_PART: break;
    }
  }
  for (int i = 0; i < g->n_nodes; i++) resolve_data(g, i);
  if (kn_residency_alloc(g)) goto out;
  /* Parameters in creation order so a seed means the same weights everywhere
   * (and the same in f64 mode: drawn as floats, then widened). */
  for (int p = 0; p < g->n_params + g->n_states; p++) {
    kn_node_rec *n = &g->nodes[p < g->n_params ? g->params[p] : g->states[p - g->n_params]];
    int fan_in = n->ndim >= 2 ? n->dims[n->ndim - 2] : n->dims[0];
    int fan_out = n->dims[n->ndim - 1];
    for (int d = 0; d + 2 < n->ndim; d++) {
      fan_in *= n->dims[d];
      fan_out *= n->dims[d];
    }
    size_t count = kn_node_elems(n, 0);
    if (!g->f64) {
      kn_init_fill(n->init, n->data, count, fan_in, fan_out, &rng);
      continue;
    }
    float *tmp = malloc(count * sizeof *tmp);
    if (!tmp) {
      kn_graph_fail(g, KN_ENOMEM, "compile: out of memory");
      goto out;
    }
    kn_init_fill(n->init, tmp, count, fan_in, fan_out, &rng);
    for (size_t k = 0; k < count; k++) ((double *)n->data)[k] = tmp[k];
    free(tmp);
  }
  g->planned_batch = 0;
  for (int i = 0; i < g->n_nodes && !g->planned_batch; i++) {
    if (kn_op_has(g->nodes[i].op, KN_OPF_FED) && g->nodes[i].batched)
      g->planned_batch = kn_node_planned_rows_per_batch(&g->nodes[i]);
  }
  if (g->threads > 1 && !g->pool) {
    g->pool = kn_pool_new(g->threads);
    if (!g->pool) {
      kn_graph_fail(g, KN_ENOMEM, "compile: cannot start %d compute threads", g->threads);
      goto out;
    }
  }
  g->batch = 0; /* the matmuls' shapes below are the planned batch's */
  if (!g->f64 && !g->gemm_workspace && kn_gemm_wants_workspace()) {
    /* Packing space per thread, then the partial sums of the deepest
     * products' slices (the largest any f32 matmul needs at the planned
     * batch; a smaller batch needs no more). */
    int matmuls = 0;
    size_t partials = 0;
    for (int i = 0; i < g->n_nodes; i++) {
      const kn_node_rec *n = &g->nodes[i];
      if (n->dead || !kn_op_has(n->op, KN_OPF_GEMM)) continue;
      matmuls++;
      const kn_node_rec *A = &g->nodes[n->inputs[0]], *B = &g->nodes[n->inputs[1]];
      /* (col2im_gemm's GEMMs run whole, one on each thread) */
      if (n->op == KN_OP_CONV_INPUT_GRAD || n->op == KN_OP_COL2IM_GEMM || A->dtype != KN_F32 ||
          B->dtype != KN_F32 || n->dtype != KN_F32)
        continue;
      int m, cols, k;
      kn_matmul_dims(g, n, &m, &cols, &k);
      const size_t need = kn_gemm_partial_floats(m, cols, k);
      if (need > partials) partials = need;
    }
    const size_t packing = (size_t)kn_pool_threads(g->pool) * kn_gemm_workspace_floats();
    const size_t bytes = (packing + partials) * sizeof(float);
    if (matmuls && !(g->gemm_workspace = aligned_alloc(KN_ALIGN, align_up(bytes)))) {
      kn_graph_fail(g, KN_ENOMEM, "compile: cannot allocate %zu GEMM workspace bytes", bytes);
      goto out;
    }
    g->gemm_partials = g->gemm_workspace ? g->gemm_workspace + packing : NULL;
    g->gemm_partial_floats = g->gemm_workspace ? partials : 0;
  }
  /* Packing buffers for the matmuls that run the bf16 GEMM, one per thread,
   * deep enough for the longest sum rounded into a bf16 output. */
  int bf16_gemms = 0, bf16_out_depth = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const kn_node_rec *n = &g->nodes[i], *A = &g->nodes[n->inputs[0]];
    if (n->dead || !kn_op_has(n->op, KN_OPF_GEMM)) continue;
    if (A->dtype != KN_BF16 && g->nodes[n->inputs[1]].dtype != KN_BF16 && n->dtype != KN_BF16)
      continue;
    bf16_gemms++;
    int m, cols, depth;
    if (n->op == KN_OP_CONV_INPUT_GRAD) /* its sums run over dy's taps and filters */
      depth = kn_pad_cols_width(A);
    else if (n->op == KN_OP_COL2IM_GEMM) /* over dy's filters, into bf16 columns */
      depth = A->dims[3];
    else
      kn_matmul_dims(g, n, &m, &cols, &depth);
    if ((n->dtype == KN_BF16 || n->op == KN_OP_COL2IM_GEMM) && depth > bf16_out_depth)
      bf16_out_depth = depth;
  }
  if (bf16_gemms) {
    size_t bytes = kn_gemm_scratch_bytes(kn_pool_threads(g->pool), bf16_out_depth);
    g->gemm_scratch = aligned_alloc(KN_ALIGN, bytes);
    if (!g->gemm_scratch) {
      kn_graph_fail(g, KN_ENOMEM, "compile: cannot allocate %zu bytes of GEMM buffers", bytes);
      goto out;
    }
    memset(g->gemm_scratch, 0, bytes);
  }
  /* The folded matmuls' scaled B, scale and shift (bn_fold pass). */
  size_t fold_floats = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const kn_node_rec *n = &g->nodes[i];
    if (n->dead || !n->bn_fold) continue;
    int m, cols, k;
    kn_matmul_dims(g, n, &m, &cols, &k);
    const size_t need = (size_t)(k + 2) * (size_t)cols;
    if (need > fold_floats) fold_floats = need;
  }
  if (fold_floats && !(g->bn_fold_buf = malloc(fold_floats * sizeof(float)))) {
    kn_graph_fail(g, KN_ENOMEM, "compile: out of memory");
    goto out;
  }
  /* The convolutions' scratch: the largest any Winograd node,
   * col2im_gemm or depthwise node of depth multiplier > 1 (x's channels
   * repeated, or the input gradient's C * M sums) needs. */
  size_t conv_floats = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    kn_node_rec *n = &g->nodes[i];
    size_t need = 0;
    if (n->dead) continue;
    n->direct_dx = kn_conv_dx_direct(g, n);
    if (n->winograd) {
      kn_wino_args a;
      kn_wino_args_of(g, n, &a);
      need = a.io.direct && a.weight_grad
                 ? kn_amx_conv_wgrad_floats(kn_pool_threads(g->pool), &a.io)
             : a.io.direct ? kn_amx_conv_direct_floats(kn_pool_threads(g->pool), &a.io)
                           : kn_winograd_floats(kn_pool_threads(g->pool), a.io.r, a.io.d,
                                                a.io.batch, a.io.hp, a.io.wp, a.io.cin, a.io.oh,
                                                a.io.ow, a.io.cout, a.weight_grad, a.io.amx);
    } else if (n->op == KN_OP_COL2IM_GEMM) {
      const kn_conv_attrs *a = &n->attr.conv;
      need = (size_t)kn_pool_threads(g->pool) * kn_col2im_chunk_images(g, n) * a->oh * a->ow *
             a->kh * a->kw * n->dims[3]; /* a chunk a thread */
      const size_t direct = kn_conv_dx_floats(g, n, kn_pool_threads(g->pool));
      if (direct > need) need = direct;
    } else if (n->op == KN_OP_DWCONV || n->op == KN_OP_DWCONV_DX || n->op == KN_OP_DWCONV_DW) {
      const kn_node_rec *X = n->op == KN_OP_DWCONV      ? &g->nodes[n->inputs[0]]
                             : n->op == KN_OP_DWCONV_DX ? n
                                                        : &g->nodes[n->inputs[1]];
      const int M = n->op == KN_OP_DWCONV_DW ? n->dims[3] : g->nodes[n->inputs[1]].dims[3];
      if (M > 1)
        need = (size_t)kn_node_rows(g, X) * X->dims[1] * X->dims[2] * X->dims[3] * (size_t)M;
    }
    if (need > conv_floats) conv_floats = need;
  }
  if (conv_floats) {
    const size_t bytes = align_up(conv_floats * kn_graph_elem_size(g, KN_F32));
    if (!(g->conv_buf = aligned_alloc(KN_ALIGN, bytes))) {
      kn_graph_fail(g, KN_ENOMEM, "compile: cannot allocate %zu convolution buffer bytes", bytes);
      goto out;
    }
  }
  g->compiled = 1;
  g->batch = 0;
  /* Constants, once: no run computes them again. */
  for (int i = 0; i < g->n_nodes; i++) {
    if (!g->nodes[i].folded || g->nodes[i].dead) continue;
    char ferr[256];
    int frc = g->f64 ? kn_cpu_run_node_f64(g, i, ferr, sizeof ferr)
                     : kn_cpu_run_node(g, i, ferr, sizeof ferr);
    if (frc) {
      g->compiled = 0;
      kn_graph_fail(g, frc, "compile: folding constant '%s': %s", g->nodes[i].name, ferr);
      goto out;
    }
  }
  fill_stats(g, stats, &pass_stats, n_inplace, n_recomputed, pbytes);

out:
  free(skip);
  rc = g->error_code;
  if (rc && err && errlen) snprintf(err, errlen, "%s", g->error);
  return rc;
}

void *kn_node_data(kn_graph *g, kn_node n) {
  if (!g->compiled || n < 0 || n >= g->n_nodes) return NULL;
  char err[512];
  if (kn_residency_sync(g, n, err, sizeof err)) { /* only a device held it, and the copy failed */
    kn_graph_fail(g, KN_EIO, "%s", err);
    return NULL;
  }
  return g->nodes[n].data;
}

int64_t kn_node_arena_offset(const kn_graph *g, kn_node n, size_t *nbytes) {
  const kn_node_rec *r = &g->nodes[n];
  if (nbytes) *nbytes = kn_node_planned_bytes(g, r);
  return (r->storage == KN_STORE_ARENA && !r->dead) ? (int64_t)r->arena_offset : -1;
}

void kn_node_lifetime(const kn_graph *g, kn_node n, int *first, int *last) {
  *first = g->nodes[n].first_use;
  *last = g->nodes[n].last_use;
}

int kn_graph_run(kn_graph *g, kn_run_mode mode, int batch, char *err, size_t errlen) {
  if (!g->compiled) {
    snprintf(err, errlen, "run: compile the graph first");
    return KN_ESTATE;
  }
  if (mode == KN_RUN_TRAIN && !g->has_backward) {
    snprintf(err, errlen, "run: the graph has no backward pass (call kn_autodiff)");
    return KN_ESTATE;
  }
  if (g->planned_batch && (batch < 1 || batch > g->planned_batch)) {
    snprintf(err, errlen, "run: batch must be 1..%d (the planned batch), got %d", g->planned_batch,
             batch);
    return KN_EINVAL;
  }
  g->batch = batch;
  g->training = mode != KN_RUN_FORWARD;
  if (mode == KN_RUN_TRAIN) g->train_runs++;
  /* Parameters that no gradient reaches keep the zero slot set at compile. */
  int end = mode == KN_RUN_TRAIN ? g->n_nodes : g->n_forward;
  const int profiling = kn_profile_recording(g->profile);
  const uint64_t in0 = g->copied_in, out0 = g->copied_out;
  kn_residency_start(g);
  for (int i = 0; i < end; i++) {
    if (g->nodes[i].dead || g->nodes[i].folded) continue;
    const double start = profiling ? kn_profile_now() : 0.0;
    /* its inputs where its kernel runs, then its device's backend; the
     * f64 reference mode runs on the CPU only */
    int rc = kn_residency_before(g, i, err, errlen);
    if (!rc) rc = kn_backend_of(g->nodes[i].device)->run(g, i, err, errlen);
    if (!rc) rc = kn_residency_after(g, i, err, errlen);
    if (rc) return rc;
    if (profiling) kn_profile_node(g->profile, g, i, start, kn_profile_now());
    if (g->node_done && mode == KN_RUN_TRAIN) g->node_done(g->node_done_ctx, i);
  }
  if (profiling) {
    g->profiled_in += g->copied_in - in0;
    g->profiled_out += g->copied_out - out0;
  }
  return KN_OK;
}
