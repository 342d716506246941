/* graph_internal.h — the engine's private view of a graph: node layout, op
 * codes and the helpers shared by the builder, autodiff, planner and
 * kernels. Not for other modules. */
#ifndef KILN_ENGINE_GRAPH_INTERNAL_H
#define KILN_ENGINE_GRAPH_INTERNAL_H

#include <string.h>

#include "narrow.h"
#include "engine.h"
#include "op_table.h"

typedef struct kn_pool kn_pool; /* pool.c */

/* GPUs a graph keeps values on (cuda:0 up), and the buffers each holds:
 * the arena, the parameters, the gradients, the state (residency.c). */
#define KN_RESIDENT_DEVICES 16
#define KN_DEVICE_BUFFERS   4

typedef enum kn_storage {
  KN_STORE_ARENA = 0, /* planned in the activation arena */
  KN_STORE_PARAM,     /* a slot of the flat parameter buffer */
  KN_STORE_GRAD,      /* a slot of the flat gradient buffer */
  KN_STORE_VIEW,      /* shares the storage of inputs[0] */
  KN_STORE_STATE,     /* a slot of the flat state buffer (not trained, checkpointed) */
  /* a part of another node's storage (the concat_views pass): part_off
   * elements into node part_of - 1's, its blocks along part_axis (the
   * elements from that axis on, for each index before it) pitch elements
   * apart: a concatenation's input written into its place in the output, or
   * a slice read where it lies in its input */
  KN_STORE_PART,
} kn_storage;

typedef enum kn_binop { KN_BIN_ADD = 0, KN_BIN_SUB, KN_BIN_MUL, KN_BIN_DIV } kn_binop;
typedef enum kn_unop {
  KN_UN_LEAKY_RELU = 0, /* alpha = negative slope */
  KN_UN_ELU,            /* alpha */
  KN_UN_GELU,           /* exact, with erf (Keras and torch defaults) */
  KN_UN_SIGMOID,
  KN_UN_TANH,
  KN_UN_SCALE, /* alpha * x */
  KN_UN_ABS,
  KN_UN_SQUARE,
} kn_unop;
typedef enum kn_reduce_kind { KN_RED_SUM = 0, KN_RED_MEAN, KN_RED_MAX } kn_reduce_kind;

/* A window over an NHWC input: convolution (im2col, col2im, the padded
 * input and input gradient the implicit-GEMM passes make of them),
 * depthwise convolution and pooling. */
typedef struct kn_conv_attrs {
  int kh, kw;            /* kernel */
  int sh, sw;            /* strides */
  int dh, dw;            /* dilation */
  int pad_top, pad_left; /* zero cells before the image (TF's same padding) */
  int oh, ow;            /* output size */
  int h, w;              /* input size (the gradients' output) */
  int pool_kind;         /* pooling: 0 max, 1 average */
} kn_conv_attrs;
/* A 2x2, stride 2, unpadded max pool: its windows tile the input, so its
 * gradient writes each input cell once. */
static inline int kn_pool_tiles(const kn_conv_attrs *a) {
  return a->pool_kind == 0 && a->kh == 2 && a->kw == 2 && a->sh == 2 && a->sw == 2 &&
         a->pad_top == 0 && a->pad_left == 0;
}

/* A node's attributes, by its op (the member named after it). */
typedef union kn_node_attrs {
  struct {
    float value;
    int loss_seed; /* the seed of d(loss)/d(loss): never merged with other fills */
  } fill;
  /* matmul and matmul_bias_act (relu: its epilogue's). pool_h, pool_w: on
   * a weight-gradient matmul the pool_grad_in_gemm pass made read a max
   * pool's gradient as its B (argmax mark set, inputs (A, dy, the pool)),
   * that gradient's height and width. */
  struct {
    int trans_a, trans_b, relu, pool_h, pool_w;
  } matmul;
  struct {
    kn_binop op;
  } binary;
  struct { /* unary and its gradient */
    kn_unop op;
    float alpha;
  } unary;
  struct { /* reduce and its gradient */
    kn_reduce_kind kind;
    int axis;     /* -1: all */
    int keepdims; /* the reduced axis stays, as size 1 */
  } reduce;
  struct {
    int perm[KN_MAX_DIMS];
  } transpose;
  struct { /* slice; concat: axis */
    int axis, start, len;
  } slice;
  kn_conv_attrs conv;
  struct { /* bn_stats; bn_grad_x: synchronized */
    float momentum, epsilon;
    /* synchronized batch norm: the sums over the batch cover every replica
     * of the step (kn_replica_sums) */
    int synchronized;
    /* bn_grad_x, set by the bn_grads pass: 1 + its layer's bn_grad_gamma
     * and bn_grad_beta nodes, whose values it writes from the sums it
     * takes anyway (0: none) */
    kn_node writes_gamma, writes_beta;
    /* bn_grad_x, set by the bn_grads pass where a relu follows the layer:
     * inputs[4] is the layer's beta, and dy passes where the layer's
     * output, recomputed as ((x - mean) * inv) * gamma + beta as bn_apply
     * computes it, is not <= 0 (0: inputs[4], if any, is the relu's value) */
    int relu_from_beta;
  } bn;
  struct {
    float rate;
    uint64_t seed;
  } dropout;
  int top_k;         /* top_k_accuracy's k */
  kn_dtype cast_via; /* cast: the narrow type it rounds through */
  kn_node argmax_of; /* pool_argmax: 1 + the pool that writes it */
} kn_node_attrs;

#define KN_MAX_INPUTS 5

typedef struct kn_node_rec {
  kn_op op;
  kn_dtype dtype;
  int ndim;
  int dims[KN_MAX_DIMS]; /* dims[0] is the planned batch when batched */
  int batched;           /* 0: fixed; k > 0: dims[0] is k x the planned batch and follows the run's
                          * batch (k > 1 for rows per example, e.g. im2col's OH*OW) */
  int n_inputs;
  kn_node inputs[KN_MAX_INPUTS];
  kn_node_attrs attr; /* the op's: attr.<op> */
  /* Marks the passes set, apart from the op's attributes:
   * - fused_relu: the fusion pass folded the relu reading this elementwise
   *   node (an op with KN_OPF_RELU_EPILOGUE) or max pool gradient into it:
   *   relu runs in its loop.
   * - gemm_pair: the bias_grad_in_gemm pass paired a reduce_rows and a
   *   weight-gradient matmul: on the reduce_rows, 1 + the matmul whose GEMM
   *   it runs, summing the same dy as it packs it; on that matmul, 1 + the
   *   reduce_rows that runs it (the matmul then runs nothing; its value is
   *   live from the reduce_rows on).
   * - argmax: set by the pool_argmax pass. On a tiled max pool: 1 + relu —
   *   the pool also records, in its KN_OP_POOL_ARGMAX node (argmax_at), one
   *   byte per output element naming the window's cell that held the
   *   maximum (00, 01, 10, 11 in that order of preference, as the gradient
   *   rule), or 4 for none when relu is set and the maximum is not above 0
   *   (the fused relu gradient's mask). On its gradient: 1 — inputs are
   *   (dy, those bytes). On a matmul reading that gradient as B
   *   (pool_grad_in_gemm): 1.
   * - argmax_at: on the pool, 1 + its KN_OP_POOL_ARGMAX node. */
  int fused_relu, gemm_pair, argmax;
  kn_node argmax_at;
  /* 1 + an earlier node whose kernel writes this node's value (the
   * bn_grads pass: a batch norm's gamma and beta gradients, written by its
   * bn_grad_x); this node's own kernel then runs nothing, and the planner
   * keeps its value live from that node on. 0: none. */
  kn_node written_by;
  /* 1 + the bf16 copy of this node's value (a cast) that this node's
   * kernel writes as it stores the value (the narrow_copies pass); that
   * cast's written_by names this node. 0: none. */
  kn_node narrow_copy;
  /* 1: the node's kernel rounds each value through bf16 as it stores it,
   * in place of a cast that rounded it after (the narrow_copies pass) */
  int round_bf16;
  /* The bn_fold pass: on a matmul, 1 + the bn_apply whose value it
   * computes in forward-only runs (its batch norm folded into it); on that
   * bn_apply, 1 + the matmul (in those runs its own kernel runs nothing,
   * and the planner keeps its value live from that matmul on). 0: none. */
  kn_node bn_fold, eval_written_by;
  /* The winograd pass: 1 on a 3x3 or 5x5, stride-1 convolution's forward
   * matmul, weight-gradient matmul or input gradient whose kernel computes
   * it by Winograd's F(4x4, 3x3) or F(2x2, 5x5) (winograd.c; dilated, by
   * phases) instead of a GEMM; 2 where it does so on bf16 products
   * (mixed_bfloat16 where kn_winograd_bf16_products, at compile); 3 where
   * those run on AMX tiles (kn_amx_available, at compile); 4 where a 3x3
   * forward product or input gradient of up to 64 channels, or a weight
   * gradient over multiples of 16 channels, runs instead directly on the
   * tiles, no transforms (amx_conv.h; winograd.c hands it over). */
  int winograd;
  /* 1 on a col2im_gemm summed directly (conv_dx.c), decided at compile */
  int direct_dx;
  /* KN_STORE_PART: 1 + the node whose storage holds this one, where in it,
   * and how its blocks along part_axis lie (see kn_storage) */
  kn_node part_of;
  int part_axis;
  size_t part_off, pitch;
  kn_init init;
  char name[128];    /* parameters: "<layer>.kernel"; gradients: "grad/<param>" */
  int requires_grad; /* depends on a parameter */
  int keep;          /* readable after a run: never reused */
  int dead;          /* removed by a pass: not planned, not run */
  int folded;        /* a constant: computed once at compile, not every run */
  kn_storage storage;
  size_t flat_offset;      /* floats, for PARAM and GRAD storage */
  size_t arena_offset;     /* bytes, for ARENA storage */
  int first_use, last_use; /* liveness over the schedule (filled by the planner) */
  /* Mixed precision: 1 + the index of this forward activation's narrow copy
   * (a down-cast emitted right after it); 0 = none. */
  int shadow;
  /* A backward node that re-creates forward node remat_of - 1 instead of
   * keeping it alive: a recompute (same op, same inputs) or, for a cast, a
   * widened narrow copy. 0 = an ordinary node. */
  int remat_of;
  kn_device device; /* where its kernel runs (kn_node_set_device); cpu by default */
  void *data;
} kn_node_rec;

struct kn_graph {
  kn_node_rec *nodes;
  int n_nodes, cap_nodes;
  /* 0: the node array starts at 64 and doubles; n: it grows n at a time */
  int node_growth;
  int n_forward; /* nodes [0, n_forward) form the forward pass */
  int has_backward;
  kn_node *params; /* parameter nodes in creation order */
  int n_params, cap_params;
  size_t n_param_floats;
  kn_node *states; /* state nodes (moving statistics) in creation order */
  int n_states, cap_states;
  size_t n_state_floats;
  /* Element size of f32 nodes' storage: 4, or 8 in the double reference
   * mode (kn_graph_use_f64), where every f32 node is computed in double. */
  int f64;
  float *param_buf, *grad_buf, *state_buf; /* double * in f64 mode */
  int training;                            /* the current run uses batch statistics and dropout */
  unsigned passes;                         /* KN_PASS_* flags (when passes_set; else all) */
  int passes_set;
  int unoptimized;       /* no passes, one buffer per node */
  int plan_only;         /* compile plans and reports, allocates nothing (never runs) */
  kn_device device;      /* where nodes built from now on are placed (kn_graph_set_device) */
  char scope[96];        /* names nodes built from now on (kn_graph_set_scope); "" = none */
  int threads;           /* compute threads for own kernels (0/1: the calling thread) */
  kn_pool *pool;         /* started at compile when threads > 1 */
  float *gemm_workspace; /* packing space for kiln's GEMM, per thread (gemm.c) */
  float *gemm_partials;  /* its depth slices' partial sums (in the same allocation) */
  size_t gemm_partial_floats;
  uint64_t train_runs; /* KN_RUN_TRAIN runs so far: dropout masks differ per step */
  /* The first of this graph's rows in the step's global batch (the
   * data-parallel strategy sets it for each replica, dist.c): dropout masks
   * are drawn by global row. 0 for a graph trained alone. */
  int64_t row_offset;
  /* Synchronized batch norm (dist.c sets these on each replica):
   * replica_sum adds n doubles in place over every replica of the step,
   * in the running thread; every replica calls it at the same nodes in the
   * same order. values lie in replica_sums, room for the widest node's
   * sums. replica_weight is this replica's gradient's weight in the
   * strategy's aggregate, up to a factor every replica shares. NULL: the
   * graph's own rows are the whole batch. */
  int (*replica_sum)(void *ctx, double *values, int n, char *err, size_t errlen);
  void *replica_sum_ctx;
  double *replica_sums;
  double replica_weight;
  unsigned char *arena;
  size_t arena_bytes, naive_bytes;
  /* A graph with nodes on a GPU pins the host buffers its GPU kernels copy
   * from and to (kn_pin_for_gpu): bit 0 the arena, 1 the parameters, 2 the
   * gradients, when pinned. */
  unsigned pinned;
  /* Values on GPUs (residency.c): device_buf[d] holds cuda:d's copies of
   * the arena and of the flat parameter, gradient and state buffers, in
   * the host's layout (NULL: not needed there); where[i] says which copies
   * hold node i's value in the current run (bit 0 the host's, bit 1 + d
   * device d's), NULL where no kernel runs on a GPU. Bytes copied each
   * way over the graph's life, and bytes held on the devices. */
  void *device_buf[KN_RESIDENT_DEVICES][KN_DEVICE_BUFFERS];
  uint32_t *where;
  /* 1 + the device every gradient is computed on (0: none, or more than
   * one, or some on the host): the optimizer may step there. 1 while the
   * parameters' current values are that device's (the last step ran
   * there); kn_params brings them back. */
  int step_device, params_on_device;
  uint64_t copied_in, copied_out;
  uint64_t profiled_in, profiled_out; /* the same, in the profiled runs */
  size_t device_bytes;
  int compiled;
  int batch;              /* rows of the current run */
  int planned_batch;      /* rows memory was planned for (0: no batched input) */
  kn_profile *profile;    /* while recording, each node run is timed (profile.c) */
  kn_precision precision; /* mixed modes: narrow activation copies and weight copies */
  int recompute;          /* backward re-runs cheap ops instead of keeping their values */
  int allow_tf32;         /* float32 GEMMs on a GPU on TF32 tensor cores */
  int remat_depth;        /* recomputes being emitted inside one another (bounded) */
  kn_node loss_seed;      /* the fill seeding d(loss)/d(loss); the loss scale lives there */
  size_t saved_bytes, arena_bytes_without_recompute;
  /* Called (when set) in the running thread after each node a training run
   * runs: the data-parallel strategy starts a gradient bucket's all-reduce
   * once its last writer is done (dist.c). */
  void (*node_done)(void *ctx, int node);
  void *node_done_ctx;
  void *gemm_scratch; /* the bf16 GEMM's packing buffers, one per thread */
  float *bn_fold_buf; /* a folded matmul's scaled B, scale and shift (bn_fold pass) */
  /* the convolutions' scratch, the largest any node needs: the winograd
   * pass's (a transformed kernel, each thread's block and a weight
   * gradient's slice sums: kn_winograd_floats) and a col2im_gemm's chunk
   * of columns (kn_col2im_chunk_images) */
  float *conv_buf;
  uint64_t gemm_calls[KN_GEMM_KERNELS]; /* matmul kernel runs per GEMM */
  char error[256];
  int error_code;
};

size_t kn_dtype_size(kn_dtype dtype);
/* Bytes of one element of a node of the graph (f32 nodes are 8 in f64 mode). */
size_t kn_graph_elem_size(const kn_graph *g, kn_dtype dtype);
/* The planned batch of a batched node: dims[0] / batched. */
static inline int kn_node_planned_rows_per_batch(const struct kn_node_rec *n) {
  return n->batched ? n->dims[0] / n->batched : n->dims[0];
}
/* Elements of a node at its planned size, or for `batch` rows when batched. */
size_t kn_node_elems(const kn_node_rec *n, int batch);
/* Its first dimension at the graph's current batch (images, rows). */
int kn_node_rows(const kn_graph *g, const kn_node_rec *n);
/* KN_EINVAL, naming the first label outside [0, cols) and its row in err,
 * or KN_OK: a data error, reported rather than read past. */
int kn_check_labels(const char *op, const int32_t *labels, int rows, int cols, char *err,
                    size_t errlen);
/* A node as (rows, its last dimension) at the current batch. */
void kn_node_matrix(const kn_graph *g, const kn_node_rec *n, int *rows, int *cols);
/* x as (outer, row) around `axis` (>= 0): the blocks before it, and the
 * elements of each from it on. */
void kn_axis_split(const kn_graph *g, const kn_node_rec *x, int axis, size_t *outer, size_t *row);
/* x as (outer, len, inner) around a reduced axis at the current batch
 * (-1: all of it, as one row). */
void kn_reduce_split(const kn_graph *g, const kn_node_rec *x, int axis, size_t *outer, size_t *len,
                     size_t *inner);
size_t kn_node_planned_bytes(const kn_graph *g, const kn_node_rec *n);
/* NaN's rules for every backend, so a diverging run shows NaN instead of
 * training on zeros (as PyTorch): relu(v) is v < 0 ? 0 : v, and NaN passes
 * (the CUDA kernel's rule, and a SIMD max(0, v) with v second, which
 * returns v when either is NaN); relu's gradient masks dy only where
 * y <= 0 (PyTorch's threshold_backward), so a NaN y passes dy; a max keeps
 * a NaN it meets (PyTorch's max pooling), and its gradient goes to the
 * first cell equal to it, or NaN when it is, so relu's gradient there
 * passes it too, fused or not. Bitwise |, not ||, keeps the pooling loops
 * free of branches, so they still vectorize. Macros: the kernels apply
 * them to float and double alike. */
#define KN_RELU(v)           ((v) < 0 ? 0 : (v))
#define KN_RELU_PASSES(y)    (!((y) <= 0))
#define KN_MAX_NAN(m, v)     ((((v) > (m)) | ((v) != (v))) ? (v) : (m))
#define KN_IS_MAX_CELL(x, m) (((x) == (m)) | ((x) != (x)))
/* Converts n floats to `via` (bf16 or f16) and back, round to nearest even. */
void kn_round_f32(kn_dtype via, const float *src, float *dst, size_t n);
/* The dtype a cast node rounds through. */
static inline kn_dtype kn_cast_via(const struct kn_node_rec *n) {
  return n->attr.cast_via;
}
/* Pushes cast(x) to dtype `to` through `via`, without the mixed precision
 * hooks; remat_of as in kn_node_rec. */
kn_node kn_push_cast(kn_graph *g, kn_node x, kn_dtype to, kn_dtype via, int remat_of);
/* In a mixed precision graph, a forward activation read through its narrow
 * copy (up(down(x))), as the next layer sees it; x itself otherwise. */
kn_node kn_narrow_boundary(kn_graph *g, kn_node x);
/* "(d0, d1, ...)" for error sentences. */
void kn_shape_str(const kn_node_rec *n, char *buf, size_t len);
/* Records the first builder error; returns -1 for `return kn_graph_fail(...)`. */
int kn_graph_fail(kn_graph *g, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Appends a node (copying *proto, which must not point into g->nodes),
 * returning its index or -1. Its op's shape rule sets its ndim, dims and
 * batching (op_table.h): a builder fills in op, inputs, attrs and dtype. Pushing may move g->nodes:
 * every call that can push a node (a builder, an op's gradient rule, a pass that appends) leaves
 * any kn_node_rec * taken before it dangling, so graph building holds node indices, or a copy of a
 * record, across such calls. */
kn_node kn_graph_push(kn_graph *g, const kn_node_rec *proto);
/* A test hook, process-wide: graphs made from now on start their node
 * array at `nodes` records and grow it by as many at a time, so with 1
 * every push moves the array; 0 restores the default (64, doubling). */
void kn_graph_set_node_growth(int nodes);
/* A fresh node record of op and dtype, everything else zero, to fill in
 * and push. */
kn_node_rec kn_node_proto(kn_op op, kn_dtype dtype);
/* Appends a node that lives in a flat buffer (parameters, non-trainable
 * state): recorded in *list in creation order, its offset taken from and
 * added to *floats. Returns its index or -1. */
kn_node kn_graph_push_flat(kn_graph *g, const kn_node_rec *proto, kn_node **list, int *n, int *cap,
                           size_t *floats, const char *what);
/* Whether n is a synchronized batch norm's BN_STATS or BN_GRAD_X. */
static inline int kn_node_replica_synced(const kn_node_rec *n) {
  return (n->op == KN_OP_BN_STATS || n->op == KN_OP_BN_GRAD_X) && n->attr.bn.synchronized;
}
/* The sums over every replica a node kn_node_replica_synced takes in a
 * training run, in order, as places in the graph's replica_sums: BN_STATS
 * the rows and each channel's sum of x, then each channel's squared
 * deviations from the mean; BN_GRAD_X the rows and each channel's two
 * sums of its input gradient (weighed by replica_weight). Returns their
 * count (at has room for 2), 0 when the node takes none (or the graph has
 * no replica_sum). */
typedef struct kn_replica_sum_at {
  int offset, len; /* doubles */
} kn_replica_sum_at;
static inline int kn_replica_sums(const kn_graph *g, const kn_node_rec *n, kn_replica_sum_at *at) {
  if (!g->replica_sum || !kn_node_replica_synced(n)) return 0;
  const int channels = n->dims[n->ndim - 1];
  if (n->op == KN_OP_BN_STATS) {
    at[0] = (kn_replica_sum_at){0, channels + 1};
    at[1] = (kn_replica_sum_at){channels + 1, channels};
    return 2;
  }
  if (n->op == KN_OP_BN_GRAD_X) {
    at[0] = (kn_replica_sum_at){0, 2 * channels + 1};
    return 1;
  }
  return 0;
}
/* What this CPU has, read once per process whichever thread asks first
 * (cpu.c); the paths a build compiled decide what is used of it. */
typedef struct kn_cpu_features {
  int avx2, avx512f, avx512bf16;
  /* AVX512-BF16's vdpbf16ps runs at half the rate of f32 FMAs per
   * multiply-add (Intel's cores; AMD's run it at the full rate) */
  int bf16_dot_half_rate;
} kn_cpu_features;
const kn_cpu_features *kn_cpu_features_get(void);
/* Runs node i on the CPU for the graph's current batch. */
int kn_cpu_run_node(kn_graph *g, int i, char *err, size_t errlen);
int kn_cpu_run_node_f64(kn_graph *g, int i, char *err, size_t errlen);
/* The node whose storage n shares, through reshapes and other views. */
static inline kn_node kn_storage_root(const kn_graph *g, kn_node n) {
  while (g->nodes[n].storage == KN_STORE_VIEW) n = g->nodes[n].inputs[0];
  return n;
}
/* Whether node x's only live readers among nodes [x + 1, end) are `a` and
 * `b` (either may be -1). */
static inline int kn_read_only_by(const kn_graph *g, kn_node x, kn_node a, kn_node b, int end) {
  for (int c = x + 1; c < end; c++) {
    const kn_node_rec *r = &g->nodes[c];
    if (r->dead || c == a || c == b) continue;
    for (int k = 0; k < r->n_inputs; k++)
      if (r->inputs[k] == x) return 0;
  }
  return 1;
}
/* The elements from one block of x along axis to the next, where a block
 * is `row` elements (the dims from axis on): row, unless x is a part of
 * another node's storage (KN_STORE_PART, along that axis). */
static inline size_t kn_block_pitch(const kn_node_rec *x, size_t row) {
  return x->storage == KN_STORE_PART ? x->pitch : row;
}
/* Whether x is written in place as a part of node n's storage. */
static inline int kn_part_of(const kn_node_rec *x, kn_node n) {
  return x->storage == KN_STORE_PART && x->part_of == n + 1;
}
/* The argmax bytes a pool with its argmax mark writes. */
static inline unsigned char *kn_pool_argmax(const kn_graph *g, const kn_node_rec *pool) {
  return g->nodes[pool->argmax_at - 1].data;
}
/* gemm.c: C (m x n, row stride ldc) = op(A) op(B) in single precision,
 * by the GEMM kn_cpu_gemm names, on g's threads. */
void kn_sgemm(kn_graph *g, int ta, int tb, int m, int n, int k, const float *a, int lda,
              const float *b, int ldb, float *c, int ldc);
/* A convolution's im2col columns, (B*OH*OW, KH*KW*C), read in place from
 * its zero-padded input (KN_OP_CONV_PAD, f32 or bf16): column t =
 * (ki*KW + kj)*C + c of row p = (b*OH + oh)*OW + ow is element
 * kn_cols_row(p) + kn_cols_col(t) of x, x[b][oh*SH + ki*DH][ow*SW + kj*DW][c]. */
typedef struct kn_conv_cols {
  const void *x;
  int hp, wp, c, kw, sh, sw, dh, dw, oh, ow;
} kn_conv_cols;
static inline ptrdiff_t kn_cols_row(const kn_conv_cols *v, int64_t p) {
  const int64_t per = (int64_t)v->oh * v->ow, b = p / per, r = p % per;
  const int64_t y = r / v->ow, x = r % v->ow;
  return (ptrdiff_t)(((b * v->hp + y * v->sh) * v->wp + x * v->sw) * v->c);
}
static inline ptrdiff_t kn_cols_col(const kn_conv_cols *v, int t) {
  const int q = t / v->c, ch = t % v->c, ki = q / v->kw, kj = q % v->kw;
  return (ptrdiff_t)(((ptrdiff_t)ki * v->dh * v->wp + (ptrdiff_t)kj * v->dw) * v->c + ch);
}
/* Element i of a convolution's padded input, f32 or bf16 (widened). */
static inline float kn_cols_value(const kn_conv_cols *v, int f32, ptrdiff_t i) {
  return f32 ? ((const float *)v->x)[i] : kn_bf16_to_f32(((const uint16_t *)v->x)[i]);
}
/* Output pixel p of a convolution's columns, walked in order: its place is
 * divided out once (kn_pixel_at) and the next ones stepped to
 * (kn_pixel_next), since where the depth is small a block's divisions
 * cost as much as its products; kn_pixel_row is kn_cols_row of the
 * pixel. */
typedef struct kn_pixel_cursor {
  int64_t b;
  int y, x;
} kn_pixel_cursor;
static inline kn_pixel_cursor kn_pixel_at(const kn_conv_cols *v, int64_t p) {
  const int64_t per = (int64_t)v->oh * v->ow;
  return (kn_pixel_cursor){p / per, (int)(p % per / v->ow), (int)(p % per % v->ow)};
}
static inline void kn_pixel_next(const kn_conv_cols *v, kn_pixel_cursor *q) {
  if (++q->x == v->ow) {
    q->x = 0;
    if (++q->y == v->oh) {
      q->y = 0;
      q->b++;
    }
  }
}
static inline ptrdiff_t kn_pixel_row(const kn_conv_cols *v, const kn_pixel_cursor *q) {
  return (ptrdiff_t)(((q->b * v->hp + (int64_t)q->y * v->sh) * v->wp + (int64_t)q->x * v->sw) *
                     v->c);
}
/* The im2col a padded input (KN_OP_CONV_PAD) stands for: columns per row
 * (KH*KW*C) and rows per image (OH*OW). */
static inline int kn_pad_cols_width(const kn_node_rec *pad) {
  return pad->attr.conv.kh * pad->attr.conv.kw * pad->dims[3];
}
static inline int kn_pad_rows_per_image(const kn_node_rec *pad) {
  return pad->attr.conv.oh * pad->attr.conv.ow;
}
/* A convolution kernel (KH, KW, C, F), f32 or bf16, read as the B of a
 * transposed convolution: element (k, c), k = (ki*KW + kj)*F + f, is
 * kernel[KH-1-ki][KW-1-kj][c][f]. */
typedef struct kn_conv_flip {
  const void *w;
  int kh, kw, c, f;
} kn_conv_flip;
static inline ptrdiff_t kn_flip_at(const kn_conv_flip *v, int k, int c) {
  const int q = k / v->f, f = k % v->f, ki = q / v->kw, kj = q % v->kw;
  return (((ptrdiff_t)(v->kh - 1 - ki) * v->kw + (v->kw - 1 - kj)) * v->c + c) * v->f + f;
}
/* The input gradient of a tiled 2x2 max pool that records its argmax
 * (its argmax mark), read as a GEMM's B without being written: element
 * (p, c), p = (b*H + h)*W + w a pixel of dx (B, H, W, C), is dy[b][h/2][w/2][c]
 * where the pool's argmax names cell (h%2, w%2) there, else 0 (0 too
 * outside the windows, at an odd edge). */
typedef struct kn_pool_grad_b {
  const unsigned char *argmax;
  const float *dy;
  int h, w, oh, ow, c;
  const uint16_t *dy16; /* or NULL: dy in bf16 (mixed_bfloat16; dy unused) */
} kn_pool_grad_b;
/* Where pixel (b, y, x) of dx takes its value: the offset of its window's
 * first channel in dy and the argmax bytes, its cell (0 to 3) in *cell;
 * -1 outside the windows (an odd edge), where dx is 0. */
static inline ptrdiff_t kn_pool_grad_at(const kn_pool_grad_b *v, int64_t b, int y, int x,
                                        int *cell) {
  if (y >= 2 * v->oh || x >= 2 * v->ow) return -1;
  *cell = (y & 1) * 2 + (x & 1);
  return (((ptrdiff_t)b * v->oh + y / 2) * v->ow + x / 2) * v->c;
}
/* One f32 product for kiln's GEMM: C (m x n, row stride ldc) = op(A) op(B).
 * A is a (lda) or, when cols is set, a convolution's columns read in place
 * from its padded input (op(cols) = cols, ta = 0: m rows of columns, k =
 * KH*KW*C; or its transpose, ta = 1: m = KH*KW*C, k rows). B is b (ldb) or,
 * when pool is set, a max pool's input gradient (tb = 0). Then + bias per
 * column (when set) and relu, and b_sums (n floats, when set) gets op(B)'s
 * rows summed: a bias gradient, taken as a weight gradient's GEMM packs
 * its dy, each column summed in row order (reduce_rows' bits) unless the
 * GEMM splits the depth (kn_gemm_partial_floats), where the slices' sums
 * are added in order. */
typedef struct kn_sgemm_args {
  int ta, tb, m, n, k;
  const float *a;
  int lda;
  const kn_conv_cols *cols;
  const float *b;
  int ldb;
  const kn_pool_grad_b *pool;
  float *c;
  int ldc;
  const float *bias;
  int relu;
  float *b_sums;
  int accumulate; /* C += op(A) op(B) (b_sums are still written, not added to) */
} kn_sgemm_args;
/* Runs it with the GEMM kn_cpu_gemm names, on g's threads; returns
 * whether bias and relu were applied: 0 only where OpenBLAS ran a plain
 * product (the caller then applies them). A product with columns read in
 * place or a pool's gradient as B runs with kiln's GEMM, as the passes
 * that make them do; if the GEMM was switched after compile, plainly.
 * b_sums are always filled. */
int kn_sgemm_run(kn_graph *g, const kn_sgemm_args *x);
/* kn_sgemm on the calling thread, kiln's GEMM packing into workspace
 * (its kn_gemm_workspace_floats) where it is in use, its depth never in
 * slices; else OpenBLAS's. For a kernel that runs GEMMs on each of its
 * threads. */
void kn_sgemm_serial(float *workspace, int ta, int tb, int m, int n, int k, const float *a, int lda,
                     const float *b, int ldb, float *c, int ldc);
/* C (m x C) = cols (m x k) times a flipped kernel (k x C), all f32, with
 * kiln's GEMM where it is in use (else plainly): a transposed convolution. */
void kn_sgemm_cols_flip(kn_graph *g, int m, int n, int k, const kn_conv_cols *cols,
                        const kn_conv_flip *b, float *c, int ldc);
/* Floats of packing space one thread of kiln's GEMM needs, and whether
 * this CPU can run it (so compile allocates the space). */
size_t kn_gemm_workspace_floats(void);
int kn_gemm_wants_workspace(void);
/* Floats of partial sums kiln's GEMM needs for an m x n product summed
 * over k rows: a deep product (a weight gradient) is summed in depth
 * slices fixed by its shape, on as many threads as there are, and the
 * slices then added in order. 0 when it is not split. */
size_t kn_gemm_partial_floats(int m, int n, int k);

/* cpu.c: a matmul node's GEMM, C (m x cols) summed over k, at the current
 * batch (the planned one before any run): columns a padded input stands
 * for and a pool's gradient read as B included. */
void kn_matmul_dims(const kn_graph *g, const kn_node_rec *n, int *m, int *cols, int *k);

/* placement.c: whether any live node is placed off the CPU, and
 * compile's check that every placement can run here (a failure recorded
 * in g). */
int kn_graph_places_on_gpu(const kn_graph *g);
/* placement.c: pin (at compile) and unpin (before they are freed) the host
 * buffers of a graph with nodes on a GPU; pinning that fails leaves them
 * pageable, as they were. */
void kn_pin_for_gpu(kn_graph *g, size_t arena_bytes, size_t param_bytes);
void kn_unpin_for_gpu(kn_graph *g);
int kn_check_placement(kn_graph *g);

/* residency.c: the buffers on GPUs for the values their kernels write and
 * read (compile: a failure recorded in g), freed with the graph; each
 * run starts with every value on the host (start); before node i runs,
 * its inputs are copied to where its kernel runs unless they are there
 * (before), and after it, its value is where its kernel ran, and on the
 * host too if it lies in the flat buffers (after).
 * kn_device_data is node v's buffer on cuda:d; sync copies node i's value
 * to the host where only a device holds it (kn_node_data does). Every
 * call but alloc is a no-op for a graph without kernels on a GPU. */
int kn_residency_alloc(kn_graph *g);
void kn_residency_free(kn_graph *g);
void kn_residency_start(kn_graph *g);
int kn_residency_before(kn_graph *g, int i, char *err, size_t errlen);
int kn_residency_after(kn_graph *g, int i, char *err, size_t errlen);
void *kn_device_data(kn_graph *g, int v, int d);
int kn_residency_sync(kn_graph *g, int i, char *err, size_t errlen);
/* The flat buffers on the host (kn_params, kn_grads; a failure recorded
 * in g): values only a device held copied back, and the host's copy then
 * the current one, as the caller may write it. */
int kn_residency_flat_to_host(kn_graph *g, kn_storage which);
/* An optimizer step on the device every gradient was computed on: begin
 * gives that device and its parameter and gradient buffers, each holding
 * the current values (1), or 0 where the step runs on the host; end
 * records that the device now holds the parameters. */
int kn_residency_step_begin(kn_graph *g, int *device, float **params, float **grads, char *err,
                            size_t errlen);
void kn_residency_step_end(kn_graph *g);

/* The persistent thread pool (pool.c). */
#define KN_POOL_MAX_THREADS 256
typedef void (*kn_range_fn)(void *ctx, int64_t begin, int64_t end);
kn_pool *kn_pool_new(int threads); /* NULL for threads < 2 (or on failure): run inline */
void kn_pool_free(kn_pool *p);
int kn_pool_threads(const kn_pool *p);
/* Runs fn over [0, n) on the pool's threads; returns when all are done.
 * Where n is at most the threads, each index is a call of its own; else
 * each thread runs its contiguous share of [0, n) and then takes over the
 * tail of a slower one's (pool.c), so fn may be called several times a
 * thread, on any ranges that together cover [0, n) once. */
void kn_pool_for(kn_pool *p, int64_t n, kn_range_fn fn, void *ctx);
/* The same over units [0, n) for a task that keeps scratch of its own:
 * fn gets the slot (0 .. threads - 1) of the thread running it, whose
 * scratch no other range uses meanwhile; ranges at least grain units
 * where that many are left. */
typedef void (*kn_share_fn)(void *ctx, int slot, int64_t begin, int64_t end);
void kn_pool_share(kn_pool *p, int64_t n, int64_t grain, kn_share_fn fn, void *ctx);

/* cpu_gemm.c: the bf16 GEMM (kn_gemm_bf16) on a pool and a scratch buffer
 * of kn_gemm_scratch_bytes(threads, depth), depth the largest k of the
 * calls with a bf16 C (rounded once its sums are complete); bias (per
 * column, or NULL) and relu apply to the complete sums. Returns the kernel
 * it ran. */
typedef struct kn_gemm_operand {
  const void *data;
  kn_dtype dtype; /* KN_F32 or KN_BF16 */
  int ld, trans;
  const kn_conv_cols *cols;   /* A only: a convolution's columns, read from cols->x (data unused) */
  const kn_conv_flip *flip;   /* B only: a kernel turned 180 degrees (data unused) */
  float *sums;                /* B only, untransposed: its rows summed (a bias gradient), where
                               * kn_gemm_sums_b says the call sums them; else NULL */
  const kn_pool_grad_b *pool; /* B only: a tiled 2x2 max pool's input gradient read as B (data
                               * unused), in a first layer's weight gradient (small_wgrad) */
} kn_gemm_operand;
/* Whether kn_gemm_run sums B's rows into b.sums on the way for such a
 * call (a first layer's weight gradient, small_wgrad, and every call
 * reading a pool's gradient as B); elsewhere the caller sums them. */
int kn_gemm_sums_b(int m, int n, int k, const kn_gemm_operand *a, const kn_gemm_operand *b);
size_t kn_gemm_scratch_bytes(int threads, int bf16_out_depth);
/* The scratch a kn_gemm_run on no pool (one thread) takes as task `task`
 * of a scratch sized for more threads than task, its bf16 C of depth k
 * within the depth the scratch was sized for: tasks that run such calls
 * at once each take their own thread's buffers (col2im_gemm). */
void *kn_gemm_task_scratch(void *scratch, int task, int k);
/* cpu_small_conv.c: a forward convolution of small depth and width
 * (taps x channels <= 32, a first layer; columns not transposed, a plain
 * kernel, C written), and its weight gradient (taps x filters in
 * registers: a 3x3 kernel on one channel, up to 32 filters, an f32 C),
 * summed directly with AVX512-BF16's CPUs' kernels: kn_gemm_run's. */
int kn_small_conv_fits(int n, int k, const kn_gemm_operand *a, const kn_gemm_operand *b,
                       int accumulate);
void kn_small_conv_run(kn_pool *pool, int m, int n, int k, const kn_gemm_operand *a,
                       const kn_gemm_operand *b, void *c, kn_dtype c_type, int ldc,
                       const float *bias, int relu, uint16_t *narrow);
int kn_small_wgrad_fits(int m, int n, int k, const kn_gemm_operand *a, const kn_gemm_operand *b,
                        int accumulate, kn_dtype c_type);
void kn_small_wgrad_run(kn_pool *pool, void *scratch, int m, int n, int k, const kn_gemm_operand *a,
                        const kn_gemm_operand *b, float *c, int ldc);
/* Whether kn_gemm_run takes a product on AMX tiles as a stride-1
 * convolution, its columns read in place (cpu_gemm.c). */
int kn_gemm_conv_in_place(int m, int n, int k, const kn_gemm_operand *a, const kn_gemm_operand *b,
                          kn_dtype c_type);
/* narrow: with an f32 C, also C rounded to bf16 (ldc apart), written as
 * each tile's sums are complete; NULL: none. */
kn_gemm_kernel kn_gemm_run(kn_pool *pool, void *scratch, int m, int n, int k, kn_gemm_operand a,
                           kn_gemm_operand b, void *c, kn_dtype c_type, int ldc, int accumulate,
                           const float *bias, int relu, uint16_t *narrow);

/* durable.c: write every byte (adding them to h when not NULL); 0 or -1. */
int kn_write_all(int fd, const void *buf, size_t len, kc_sha256 *h);
/* Opens where path's bytes go: tmp (path + ".tmp", written into tmp, at
 * most tmplen) for kn_durable_finish to rename into place; or, where path
 * exists and is not a plain regular file (a pipe, a terminal, a device, a
 * link such as /dev/stdout), path itself, truncated, with tmp "" (renaming
 * over it would replace the link or device). The fd, or -1 with err
 * naming `what`. */
int kn_durable_open(const char *path, char *tmp, size_t tmplen, const char *what, char *err,
                    size_t errlen);
/* After writing on fd from kn_durable_open (write_failed: a write went
 * wrong): fsync, close, rename tmp over path, fsync the directory (only
 * close where tmp is ""); tmp is removed on any failure, which err names
 * with `what` ("checkpoint"). KN_OK or KN_EIO. */
int kn_durable_finish(int fd, int write_failed, const char *tmp, const char *path, const char *what,
                      char *err, size_t errlen);

/* One axis of a window (convolution or pool) over `in` cells, TF's rules:
 * same padding gives ceil(in / stride) cells with the odd padding cell at
 * the end; valid needs the window (dilation x (k - 1) + 1 cells) to fit,
 * else it returns 0. Fills the output size and the padding cells before
 * the first. */
static inline int kn_window_axis(int in, int k, int stride, int dilation, kn_padding padding,
                                 int *out, int *pad_before) {
  int span = dilation * (k - 1) + 1;
  *pad_before = 0;
  if (padding == KN_PAD_SAME) {
    *out = (in + stride - 1) / stride;
    int total = (*out - 1) * stride + span - in;
    *pad_before = total > 0 ? total / 2 : 0;
    return 1;
  }
  if (span > in) return 0;
  *out = (in - span) / stride + 1;
  return 1;
}

/* model.c: a layer's window, Keras's defaults filled in. */
kn_window kn_layer_conv_window(const kn_layer_config *L);
kn_window kn_layer_pool_window(const kn_layer_config *L);

/* The profiler's hooks (profile.c). */
double kn_profile_now(void);
void kn_profile_node(kn_profile *p, const kn_graph *g, int node, double start, double end);

typedef struct kn_pass_stats {
  int cse, fused, folded, dead, implicit, implicit_input_grads, bias_grads_in_gemm, pool_argmax,
      pool_grads_in_gemm, bn_grads, bn_relu_grads, narrow_copies, concat_views, bn_folds, winograd,
      col2im_chunks;
} kn_pass_stats;
/* Runs the enabled passes; scratch holds 2 x n_nodes ints (n_nodes as the
 * passes begin): the passes append at most n_nodes nodes. */
int kn_run_passes(kn_graph *g, int *scratch, kn_pass_stats *st);
unsigned kn_graph_passes(const kn_graph *g);
/* lower_cpu.c: the lowering onto the CPU backend's own kernels, each pass
 * returning how many it rewrote (kn_run_passes runs them in order). */
int kn_lower_pool_argmax(kn_graph *g, int max_nodes);
int kn_lower_implicit_columns(kn_graph *g);
int kn_lower_implicit_input_grads(kn_graph *g);
int kn_lower_col2im_chunks(kn_graph *g);
/* cpu.c: the images of a col2im_gemm chunk (its columns about 1 MiB, at
 * least an image a thread, at most the batch's rows). */
int64_t kn_col2im_chunk_images(const kn_graph *g, const kn_node_rec *n);
/* The bytes of a chunk's columns for graphs compiled from now on; 0: the
 * default (512 KiB). Tests make chunks of an image. */
void kn_col2im_set_chunk_bytes(size_t bytes);
/* conv_dx.c: a col2im_gemm's float32 input gradient summed directly, on
 * CPUs with AVX-512F, where its input's channels are a multiple of 16 and
 * it is undilated: whether node n can run so (compile sets its direct_dx
 * from this), the convolution buffer floats it needs where direct_dx is
 * set (0 otherwise), and the kernel. Tests switch it off (0) to compare
 * with the columns' path, for graphs compiled from now on. */
int kn_conv_dx_direct(const kn_graph *g, const kn_node_rec *n);
size_t kn_conv_dx_floats(const kn_graph *g, const kn_node_rec *n, int threads);
void kn_conv_dx_run(kn_graph *g, kn_node_rec *n);
void kn_conv_dx_set_direct(int on);
/* cpu.c: whether an overlapping max pool's gradient on bf16 values widens
 * its windows to run on vectors (1, the default) or runs a channel at a
 * time (0), for graphs run from now on. Tests compare the two. */
void kn_pool_set_widening(int on);
int kn_lower_bias_grads_in_gemm(kn_graph *g);
int kn_lower_pool_grads_in_gemm(kn_graph *g);
int kn_lower_bn_grads(kn_graph *g, int *relu_grads);
int kn_lower_rounds_in_producers(kn_graph *g); /* the narrow_copies pass, then DCE, then: */
int kn_lower_narrow_copies(kn_graph *g);
int kn_lower_bf16_values(kn_graph *g);           /* after fusion: values kept in bf16 alone */
void kn_lower_narrow_gemm_operands(kn_graph *g); /* mixed_bfloat16 (not switchable) */
/* winograd.c: 3x3 and 5x5, stride-1 convolutions by Winograd's F(4x4, 3x3)
 * and F(2x2, 5x5), on CPUs with AVX-512F (kn_winograd_available); dilated
 * ones as d x d undilated products over the phases of their outputs. A
 * product of an r x r kernel reads its input x (batch, hp, wp, cin) as
 * stored, f32 or bf16, as if padded with zeros: pt rows above, pl columns
 * left, and as many below and right as its output (batch, oh, ow, cout)
 * reads. */
typedef struct kn_wino_io {
  const void *x;
  int x_bf16; /* 0: f32; 1: bf16; 2: f32, each value rounded to bf16 as it is read */
  int r;      /* the kernel's side: 3 or 5 */
  int d;      /* its dilation (the same down and across); 0 or 1: none */
  int s;      /* its stride (the same down and across): 0 or 1, or 2 for a
               * weight gradient directly on AMX tiles (kn_amx_conv_wgrad) */
  int batch, hp, wp, cin, pt, pl, oh, ow, cout;
  /* 3x3 products (forward, input and weight gradients) on bf16 values: the
   * transformed input and kernel (or dy) rounded to bf16, the 36 GEMMs on
   * AVX512-BF16 dot products, their sums in f32 (a node marked winograd 2) */
  int bf16_products;
  /* bf16 products on AMX tiles (amx.h; a node marked winograd 3): a
   * weight gradient then sums larger blocks of tiles (kn_winograd_floats
   * sizes its buffer by the same flag) */
  int amx;
  /* a forward product or input gradient run directly on AMX tiles, its
   * input padded a band of rows at a time (amx_conv.h; a node marked
   * winograd 4): no transforms */
  int direct;
  /* f32 outputs rounded through bf16 as they are stored (an input
   * gradient in place of a widening cast after it: the winograd pass) */
  int round_y;
  /* an input gradient's other term, laid out as its output, added to
   * each value as it is stored (an add the fusion pass took in), or NULL */
  const float *add;
} kn_wino_io;
int kn_winograd_available(void);
/* Whether this CPU has AVX512-BF16 and bf16 products are on: the default;
 * KILN_WINOGRAD=f32 in the environment, or kn_winograd_set_bf16(0) (tests,
 * to compare), keeps mixed_bfloat16's products in f32, for graphs compiled
 * from then on. */
int kn_winograd_bf16_products(void);
void kn_winograd_set_bf16(int on);
/* Whether a product of an r x r kernel (3 or 5) of dilation d, that
 * output size and channels saves at least half of the direct product's
 * multiplies. */
int kn_winograd_pays(int r, int d, int oh, int ow, int cin, int cout);
/* The sizes past which products go by chunks (a forward product's
 * transformed kernel, a weight gradient's sums) and a chunk's bytes, for
 * graphs compiled from now on; 0: the defaults. Tests lower them. */
void kn_winograd_set_limits(size_t wide_forward, size_t wide_wgrad, size_t chunk);
/* Floats of the graph's Winograd buffer one such product needs. */
size_t kn_winograd_floats(int threads, int r, int d, int batch, int hp, int wp, int cin, int oh,
                          int ow, int cout, int weight_grad, int amx);
/* y = x correlated with the kernel w (r, r, cin, cout), or with flip set,
 * with w (r, r, cout, cin) turned 180 degrees (an input gradient); w f32
 * or bf16; bias (or NULL) and relu applied as it stores, and y's bf16
 * copy into y_copy (or NULL) as a cast would round it. y NULL: the output
 * in bf16 only (mixed_bfloat16's rounded output), into y_copy. */
void kn_winograd_conv(kn_graph *g, const kn_wino_io *io, const void *w, int w_bf16, int flip,
                      const float *bias, int relu, float *y, uint16_t *y_copy);
/* dw (r, r, cin, cout) from x and dy (batch, oh, ow, cout), f32 or bf16,
 * and dy's column sums into b_sums (or NULL). The same bits for any
 * thread count, as every product here. */
void kn_winograd_wgrad(kn_graph *g, const kn_wino_io *io, const void *dy, int dy_bf16, float *dw,
                       float *b_sums);
/* lower_cpu.c: the winograd pass; a marked node's product: its input as
 * stored (its CONV_PAD, or where that is a view, the value it views, with
 * the padding the product adds as it reads), at the graph's current batch,
 * and what the node does with it. */
int kn_lower_winograd(kn_graph *g);
typedef struct kn_wino_args {
  kn_wino_io io;
  int weight_grad, flip;
} kn_wino_args;
void kn_wino_args_of(const kn_graph *g, const kn_node_rec *n, kn_wino_args *a);

/* lower_views.c: the concat_views pass. */
int kn_lower_concat_views(kn_graph *g);
/* lower_bn_fold.c: the bn_fold pass. */
int kn_lower_bn_fold(kn_graph *g);
/* Pushes an f32 node of op with attrs (NULL: none) and inputs, shaped by
 * its op's rule. */
kn_node kn_push_op(kn_graph *g, kn_op op, const kn_node_attrs *attrs, int n_inputs, kn_node in0,
                   kn_node in1, kn_node in2);

#endif
