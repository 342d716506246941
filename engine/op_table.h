/* op_table.h — private to the engine: the op codes and one descriptor per
 * op (op_table.c): its name, arity, shape rule, the properties passes, the
 * planner and placement ask about (purity, in-place, views, ...), its
 * gradient rule and its kernels per backend. Adding an op: its code here,
 * its record in op_table.c, its shape rule in shapes.c, its builder and
 * gradient rule beside its family's (graph.c, ops.c, autodiff.c), its CPU
 * kernel in cpu_kernels.inc. docs/engine.md walks through it. */
#ifndef KILN_ENGINE_OP_TABLE_H
#define KILN_ENGINE_OP_TABLE_H

#include <stddef.h>

#include "engine.h"

typedef enum kn_op {
  KN_OP_INPUT = 0,
  KN_OP_PARAM,
  KN_OP_FILL,   /* constant fill with attr.fill.value */
  KN_OP_MATMUL, /* attr.matmul: trans_a, trans_b */
  KN_OP_BIAS_ADD,
  KN_OP_ADD,
  KN_OP_RELU,
  KN_OP_SOFTMAX,
  KN_OP_RESHAPE, /* a view of its input */
  KN_OP_SOFTMAX_XENT,
  /* gradient ops, emitted by autodiff */
  KN_OP_RELU_GRAD,         /* (dy, y) -> dy * (y > 0) */
  KN_OP_SOFTMAX_GRAD,      /* (dy, y) -> y * (dy - sum(dy * y)) */
  KN_OP_REDUCE_ROWS,       /* (dy) -> sum over all but the last dim */
  KN_OP_SOFTMAX_XENT_GRAD, /* (logits, labels, dloss) -> dloss * (softmax - onehot) / B */
  KN_OP_COPY,
  /* added with the full op set (ops.c) */
  KN_OP_STATE,            /* non-trainable state in the flat state buffer (moving stats) */
  KN_OP_BINARY,           /* broadcast a (op) b; attr.binary.op */
  KN_OP_SUM_TO,           /* (dy, like) -> dy summed over the dims `like` broadcast along */
  KN_OP_UNARY,            /* attr.unary: op, alpha */
  KN_OP_UNARY_GRAD,       /* (dy, x, y) -> dx for the same attrs */
  KN_OP_LOG_SOFTMAX,      /* over the last dim */
  KN_OP_LOG_SOFTMAX_GRAD, /* (dy, y) -> dy - exp(y) * sum(dy) */
  KN_OP_REDUCE,           /* attr.reduce: kind, axis (-1: all) */
  KN_OP_REDUCE_GRAD,      /* (dy, x, y) -> dx */
  KN_OP_TRANSPOSE,        /* attr.transpose.perm[0..ndim) */
  KN_OP_CONCAT,           /* (a, b) along attr.slice.axis */
  KN_OP_SLICE,            /* (x) along attr.slice: axis, start, len */
  KN_OP_IM2COL,           /* (x NHWC) -> (B*OH*OW, KH*KW*C); attr.conv */
  KN_OP_COL2IM,           /* (dcols, like x) -> dx */
  KN_OP_DWCONV,           /* (x, w (KH, KW, C, M)) -> (B, OH, OW, C*M) */
  KN_OP_DWCONV_DX,        /* (dy, w, like x) */
  KN_OP_DWCONV_DW,        /* (dy, x, like w) */
  KN_OP_POOL,             /* (x); attr.conv.pool_kind 0 max / 1 avg */
  KN_OP_POOL_GRAD,        /* (dy, x, y) -> dx */
  KN_OP_BN_STATS,         /* (x, moving_mean, moving_var) -> (2, C): mean, 1/sqrt(var+eps) */
  KN_OP_BN_APPLY,         /* (x, stats, gamma, beta) -> (x - mean) * invstd * gamma + beta */
  KN_OP_BN_GRAD_X,        /* (dy, x, stats, gamma[, y]) -> dx through the batch statistics;
                           * y: the relu fused into bn_apply, whose gradient masks dy */
  KN_OP_BN_GRAD_GAMMA,    /* (dy, x, stats) -> (C): sum of dy xhat */
  KN_OP_BN_GRAD_BETA,     /* (dy) -> (C): sum of dy, as bn_grad_x sums it */
  KN_OP_DROPOUT_MASK,     /* (like x) -> 0 or 1/(1-rate); all ones outside training */
  KN_OP_XENT_DENSE,       /* (logits (B, C), probs (B, C)) -> mean -sum(p log softmax) */
  KN_OP_XENT_DENSE_GRAD,  /* (logits, probs, dloss) */
  KN_OP_BCE_LOGITS,       /* (logits, targets) -> mean over all elements */
  KN_OP_BCE_LOGITS_GRAD,  /* (logits, targets, dloss) */
  KN_OP_TOPK_ACCURACY,    /* (logits (B, C), labels (B)) -> fraction with label in top attr.top_k */
  KN_OP_MATMUL_BIAS_ACT,  /* fused (a, w, bias): attr.matmul: trans_a, trans_b, relu */
  /* (x) -> x converted to the node's dtype through attr.cast_via (bf16 or
   * f16, round to nearest even): f32 -> narrow ("down"), narrow -> f32
   * ("up"), or f32 -> f32 rounded ("round", the gradient of an up-cast). */
  KN_OP_CAST,
  /* (x NHWC) -> x zero-padded to (B, HP, WP, C), HP = (OH-1)*SH + (KH-1)*DH + 1
   * (WP alike), im2col's attrs: an im2col the implicit-GEMM pass replaced;
   * the GEMMs that read it take the columns straight from it. */
  KN_OP_CONV_PAD,
  /* (dy zero-padded by KH-1-PT, KW-1-PL (a KN_OP_CONV_PAD), kernel (KH, KW,
   * C, F)) -> dx (B, H, W, C), col2im's attrs: the input gradient of a
   * stride-1, undilated convolution as one GEMM, dx's pixels times the
   * kernel turned 180 degrees, its columns read in place from the padded
   * dy; it replaces the column-gradient GEMM and col2im. */
  KN_OP_CONV_INPUT_GRAD,
  /* The argmax bytes of a tiled max pool (attr.argmax_of = 1 + the pool),
   * one per output element, (B, OH, OW, C) u8: written by the pool as it
   * runs (its argmax mark), read by its gradient; no kernel of its own.
   * Appended by the pool_argmax pass; live from the pool to its last
   * reader. */
  KN_OP_POOL_ARGMAX,
  /* (dy (B, OH, OW, F), kernel (KH, KW, C, F)) -> dx (B, H, W, C), col2im's
   * attrs: the column-gradient GEMM and col2im of a strided or dilated
   * convolution in one node, by chunks of images (the col2im_chunks
   * pass); the columns lie in the graph's convolution buffer, a chunk at a
   * time. */
  KN_OP_COL2IM_GEMM,
  KN_OP_COUNT
} kn_op;

typedef struct kn_graph kn_graph;
typedef struct kn_node_rec kn_node_rec;

/* What the passes, the planner and placement may assume of an op. */
enum kn_op_flag {
  /* Its value depends on more than its inputs and attrs, or it writes
   * somewhere else: never merged (CSE) or folded into a constant. */
  KN_OPF_IMPURE = 1u << 0,
  /* Written by the caller before each run (an input): always live, never
   * reused. */
  KN_OPF_FED = 1u << 1,
  /* Held in a flat buffer (parameters, state): always live. */
  KN_OPF_FLAT = 1u << 2,
  /* Shares its input's storage (a reshape): no kernel, no bytes. */
  KN_OPF_VIEW = 1u << 3,
  /* Runs no kernel: its value is fed, held, viewed or written by another
   * node's kernel (a pool's argmax bytes). */
  KN_OPF_NO_KERNEL = 1u << 4,
  /* 1u << 5: free */
  /* Moves data with no arithmetic to speak of: backward may re-run it
   * instead of keeping its value (recompute). */
  KN_OPF_RECOMPUTE = 1u << 6,
  /* Runs a GEMM: compile plans packing space and partial sums for it. */
  KN_OPF_GEMM = 1u << 7,
  /* Elementwise, with an optional relu in its loop (the node's fused_relu
   * mark): the fusion pass folds a relu that alone reads it into it. */
  KN_OPF_RELU_EPILOGUE = 1u << 8,
};

/* Adds contribution d to the running gradient grads[target] (autodiff.c);
 * -1 when d is not a node. */
int kn_grad_accumulate(kn_graph *g, kn_node *grads, kn_node target, kn_node d);
/* An op's gradient rule: emits the gradients of node i's inputs given dy,
 * the gradient of its output, through kn_grad_accumulate. 0 or -1 (the
 * error recorded in g). */
typedef int (*kn_grad_fn)(kn_graph *g, kn_node i, kn_node dy, kn_node *grads);
/* A kernel: runs node n of g for the graph's current batch. KN_OK or an
 * error code with a sentence in err. */
typedef int (*kn_kernel_fn)(kn_graph *g, kn_node_rec *n, char *err, size_t errlen);
/* An op's shape rule (shapes.c): given a record with its op, inputs (all
 * existing nodes), attrs and, where the op says so, dtype filled in, sets
 * its ndim, dims and batched (and dtype where the op decides it) from its
 * inputs and attrs. Ops whose shape is their own argument (inputs,
 * parameters, constants, a reshape's target) check the dims they carry.
 * 0, or -1 with a sentence naming the op and the offending shapes recorded
 * in g. kn_graph_push applies it to every node. */
typedef int (*kn_shape_fn)(kn_graph *g, kn_node_rec *n);

/* The CPU kernel instantiations (cpu_kernels.inc): f32 at each instruction
 * set path, and f64 (the gradient-check reference). The f32 kernels also
 * take mixed_bfloat16's bf16 operands where the op has them. */
enum { KN_CPU_F32, KN_CPU_F32_AVX2, KN_CPU_F32_AVX512, KN_CPU_F64, KN_CPU_PATHS };

typedef struct kn_op_def {
  const char *name;               /* profiles, traces, node names in scopes */
  int min_inputs, max_inputs;     /* arity (passes may widen it: max covers them) */
  unsigned flags;                 /* enum kn_op_flag */
  unsigned inplace_inputs;        /* bit k: may write its output over input k when it dies here */
  kn_shape_fn shape;              /* its output's ndim, dims, batched (never NULL) */
  kn_grad_fn grad;                /* NULL: not differentiated (gradient ops, fused ops) */
  kn_kernel_fn cpu[KN_CPU_PATHS]; /* NULL for KN_OPF_NO_KERNEL ops */
  kn_kernel_fn cuda;              /* the CUDA backend's kernel (f32); NULL: none */
} kn_op_def;

extern const kn_op_def kn_op_defs[KN_OP_COUNT];

static inline const kn_op_def *kn_op_def_of(kn_op op) {
  return &kn_op_defs[op];
}
static inline int kn_op_has(kn_op op, unsigned flags) {
  return (kn_op_defs[op].flags & flags) != 0;
}

/* Gradient rules, beside their op family's builders. */
#define KN_GRAD_ARGS kn_graph *g, kn_node i, kn_node dy, kn_node *grads
int kn_grad_none(KN_GRAD_ARGS); /* nothing flows back (inputs, constants, metrics) */
/* autodiff.c: the first cut's ops (graph.c's builders) */
int kn_grad_matmul(KN_GRAD_ARGS);
int kn_grad_bias_add(KN_GRAD_ARGS);
int kn_grad_add(KN_GRAD_ARGS);
int kn_grad_relu(KN_GRAD_ARGS);
int kn_grad_softmax(KN_GRAD_ARGS);
int kn_grad_reshape(KN_GRAD_ARGS);
int kn_grad_softmax_xent(KN_GRAD_ARGS);
int kn_grad_cast(KN_GRAD_ARGS);
/* ops.c */
int kn_grad_binary(KN_GRAD_ARGS);
int kn_grad_sum_to(KN_GRAD_ARGS);
int kn_grad_unary(KN_GRAD_ARGS);
int kn_grad_log_softmax(KN_GRAD_ARGS);
int kn_grad_reduce(KN_GRAD_ARGS);
int kn_grad_transpose(KN_GRAD_ARGS);
int kn_grad_concat(KN_GRAD_ARGS);
int kn_grad_slice(KN_GRAD_ARGS);
int kn_grad_im2col(KN_GRAD_ARGS);
int kn_grad_dwconv(KN_GRAD_ARGS);
int kn_grad_pool(KN_GRAD_ARGS);
int kn_grad_bn_apply(KN_GRAD_ARGS);
int kn_grad_xent_dense(KN_GRAD_ARGS);
int kn_grad_bce_logits(KN_GRAD_ARGS);

/* Shape rules (shapes.c); several ops share one. */
#define KN_SHAPE_ARGS kn_graph *g, kn_node_rec *n
int kn_shape_given(KN_SHAPE_ARGS);       /* dims are the op's argument: checked, kept */
int kn_shape_like_input0(KN_SHAPE_ARGS); /* input 0's dims and batching */
int kn_shape_like_input1(KN_SHAPE_ARGS);
int kn_shape_scalar(KN_SHAPE_ARGS);   /* (1), not batched: losses and metrics */
int kn_shape_channels(KN_SHAPE_ARGS); /* (C), C input 0's last dim, not batched */
int kn_shape_reshape(KN_SHAPE_ARGS);
int kn_shape_cast(KN_SHAPE_ARGS);
int kn_shape_add(KN_SHAPE_ARGS);
int kn_shape_bias_add(KN_SHAPE_ARGS);
int kn_shape_matmul(KN_SHAPE_ARGS); /* matmul and matmul_bias_act */
int kn_shape_softmax_xent(KN_SHAPE_ARGS);
int kn_shape_binary(KN_SHAPE_ARGS);
int kn_shape_reduce(KN_SHAPE_ARGS);
int kn_shape_transpose(KN_SHAPE_ARGS);
int kn_shape_concat(KN_SHAPE_ARGS);
int kn_shape_slice(KN_SHAPE_ARGS);
int kn_shape_im2col(KN_SHAPE_ARGS);
int kn_shape_col2im(KN_SHAPE_ARGS);
int kn_shape_conv_pad(KN_SHAPE_ARGS);
int kn_shape_conv_input_grad(KN_SHAPE_ARGS);
int kn_shape_col2im_gemm(KN_SHAPE_ARGS);
int kn_shape_dwconv(KN_SHAPE_ARGS);
int kn_shape_dwconv_dx(KN_SHAPE_ARGS);
int kn_shape_dwconv_dw(KN_SHAPE_ARGS);
int kn_shape_pool(KN_SHAPE_ARGS);
int kn_shape_pool_grad(KN_SHAPE_ARGS);
int kn_shape_pool_argmax(KN_SHAPE_ARGS);
int kn_shape_bn_stats(KN_SHAPE_ARGS);

/* CPU kernels: kn_cpu_<kernel>_f32 (and _avx2, _avx512), _f64. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KN_HAVE_ISA_PATHS 1
#endif
#define KN_KERNEL_ARGS kn_graph *g, kn_node_rec *n, char *err, size_t errlen
#define KN_CPU_KERNEL_DECL(k)                                                                      \
  int kn_cpu_##k##_f32(KN_KERNEL_ARGS);                                                            \
  int kn_cpu_##k##_f32_avx2(KN_KERNEL_ARGS);                                                       \
  int kn_cpu_##k##_f32_avx512(KN_KERNEL_ARGS);                                                     \
  int kn_cpu_##k##_f64(KN_KERNEL_ARGS);
#ifdef KN_HAVE_ISA_PATHS
#define KN_CPU(k)                                                                                  \
  { kn_cpu_##k##_f32, kn_cpu_##k##_f32_avx2, kn_cpu_##k##_f32_avx512, kn_cpu_##k##_f64 }
#else
#define KN_CPU(k)                                                                                  \
  { kn_cpu_##k##_f32, kn_cpu_##k##_f32, kn_cpu_##k##_f32, kn_cpu_##k##_f64 }
#endif
KN_CPU_KERNEL_DECL(fill)
KN_CPU_KERNEL_DECL(matmul)
KN_CPU_KERNEL_DECL(matmul_bias_act)
KN_CPU_KERNEL_DECL(bias_add)
KN_CPU_KERNEL_DECL(add)
KN_CPU_KERNEL_DECL(relu)
KN_CPU_KERNEL_DECL(relu_grad)
KN_CPU_KERNEL_DECL(unary)
KN_CPU_KERNEL_DECL(unary_grad)
KN_CPU_KERNEL_DECL(softmax)
KN_CPU_KERNEL_DECL(softmax_grad)
KN_CPU_KERNEL_DECL(softmax_xent)
KN_CPU_KERNEL_DECL(softmax_xent_grad)
KN_CPU_KERNEL_DECL(reduce_rows)
KN_CPU_KERNEL_DECL(copy)
KN_CPU_KERNEL_DECL(binary)
KN_CPU_KERNEL_DECL(sum_to)
KN_CPU_KERNEL_DECL(log_softmax)
KN_CPU_KERNEL_DECL(log_softmax_grad)
KN_CPU_KERNEL_DECL(reduce)
KN_CPU_KERNEL_DECL(reduce_grad)
KN_CPU_KERNEL_DECL(transpose)
KN_CPU_KERNEL_DECL(concat)
KN_CPU_KERNEL_DECL(slice)
KN_CPU_KERNEL_DECL(im2col)
KN_CPU_KERNEL_DECL(conv_pad)
KN_CPU_KERNEL_DECL(conv_input_grad)
KN_CPU_KERNEL_DECL(col2im_gemm)
KN_CPU_KERNEL_DECL(col2im)
KN_CPU_KERNEL_DECL(dwconv)
KN_CPU_KERNEL_DECL(dwconv_dx)
KN_CPU_KERNEL_DECL(dwconv_dw)
KN_CPU_KERNEL_DECL(pool)
KN_CPU_KERNEL_DECL(pool_grad)
KN_CPU_KERNEL_DECL(bn_stats)
KN_CPU_KERNEL_DECL(bn_apply)
KN_CPU_KERNEL_DECL(bn_grad_x)
KN_CPU_KERNEL_DECL(bn_grad_gamma)
KN_CPU_KERNEL_DECL(bn_grad_beta)
KN_CPU_KERNEL_DECL(dropout_mask)
KN_CPU_KERNEL_DECL(xent_dense)
KN_CPU_KERNEL_DECL(xent_dense_grad)
KN_CPU_KERNEL_DECL(bce_logits)
KN_CPU_KERNEL_DECL(bce_logits_grad)
KN_CPU_KERNEL_DECL(top_k)
KN_CPU_KERNEL_DECL(cast)

/* CUDA kernels (backend_cuda.c): float32 matmul, relu and its gradient, a
 * bias added to rows and a bias's gradient. */
int kn_cuda_kernel_matmul(KN_KERNEL_ARGS);
int kn_cuda_kernel_relu(KN_KERNEL_ARGS);
int kn_cuda_kernel_relu_grad(KN_KERNEL_ARGS);
int kn_cuda_kernel_bias_add(KN_KERNEL_ARGS);
int kn_cuda_kernel_reduce_rows(KN_KERNEL_ARGS);
int kn_cuda_kernel_im2col(KN_KERNEL_ARGS);
int kn_cuda_kernel_col2im(KN_KERNEL_ARGS);
int kn_cuda_kernel_pool(KN_KERNEL_ARGS);
int kn_cuda_kernel_pool_grad(KN_KERNEL_ARGS);
int kn_cuda_kernel_cast(KN_KERNEL_ARGS);   /* mixed_bfloat16's casts */
int kn_cuda_kernel_binary(KN_KERNEL_ARGS); /* operands of the output's shape */
int kn_cuda_kernel_dropout_mask(KN_KERNEL_ARGS);
int kn_cuda_kernel_add(KN_KERNEL_ARGS);
int kn_cuda_kernel_fill(KN_KERNEL_ARGS);
int kn_cuda_kernel_softmax_xent(KN_KERNEL_ARGS); /* labels checked on the host */
int kn_cuda_kernel_softmax_xent_grad(KN_KERNEL_ARGS);
int kn_cuda_kernel_xent_dense(KN_KERNEL_ARGS);
int kn_cuda_kernel_xent_dense_grad(KN_KERNEL_ARGS);
int kn_cuda_kernel_bce_logits(KN_KERNEL_ARGS);
int kn_cuda_kernel_bce_logits_grad(KN_KERNEL_ARGS);
int kn_cuda_kernel_concat(KN_KERNEL_ARGS);
int kn_cuda_kernel_slice(KN_KERNEL_ARGS);
int kn_cuda_kernel_dwconv(KN_KERNEL_ARGS);
int kn_cuda_kernel_dwconv_dx(KN_KERNEL_ARGS);
int kn_cuda_kernel_dwconv_dw(KN_KERNEL_ARGS);
int kn_cuda_kernel_unary(KN_KERNEL_ARGS);
int kn_cuda_kernel_unary_grad(KN_KERNEL_ARGS);
int kn_cuda_kernel_reduce(KN_KERNEL_ARGS);
int kn_cuda_kernel_reduce_grad(KN_KERNEL_ARGS);
int kn_cuda_kernel_bn_stats(KN_KERNEL_ARGS);
int kn_cuda_kernel_bn_apply(KN_KERNEL_ARGS);
int kn_cuda_kernel_bn_grad_x(KN_KERNEL_ARGS);
int kn_cuda_kernel_bn_grad_gamma(KN_KERNEL_ARGS);
int kn_cuda_kernel_bn_grad_beta(KN_KERNEL_ARGS);
int kn_cuda_kernel_copy(KN_KERNEL_ARGS); /* a gradient's copy into its slot, within a GPU */

#endif
