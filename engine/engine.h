/* engine.h — kiln's training engine: a static computation graph with
 * reverse-mode autodiff into the same graph, a liveness-based memory plan in
 * one arena, flat parameter / gradient buffers, CPU kernels (a GEMM of its
 * own on AVX-512, OpenBLAS elsewhere), optimizers, Keras-style model
 * building, IDX datasets, safetensors checkpoints and the training loop. Knows nothing of HTTP,
 * JSON or SQLite. Prefix kn_. Every call that can fail returns 0 or a negative KN_E* code and fills
 * a caller's error buffer with a sentence. */
#ifndef KILN_ENGINE_H
#define KILN_ENGINE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h" /* kc_sha256 for checkpoint digests */

enum {
  KN_OK = 0,
  KN_EINVAL = -1,   /* bad argument or shape */
  KN_ENOMEM = -2,   /* allocation failed */
  KN_EIO = -3,      /* file could not be read or written */
  KN_EFORMAT = -4,  /* file content is not what it claims to be */
  KN_ESTATE = -5,   /* call out of order (e.g. run before compile) */
  KN_ENUMERIC = -6, /* a loss or gradient became NaN or infinite */
  KN_ESTOPPED = -7  /* training stopped on request (kn_train_config.stop_request) */
};
const char *kn_strerror(int code);

#define KN_MAX_DIMS 6

/* Element types. Kernels compute in f32 (and f64 in the reference mode used
 * by gradient checks); f16, bf16 and u8 are storage types for data and
 * checkpoints, converted with kn_convert. */
typedef enum kn_dtype { KN_F32 = 0, KN_I32, KN_F16, KN_BF16, KN_U8, KN_F64 } kn_dtype;
const char *kn_dtype_name(kn_dtype dtype); /* "f32", "bf16", ... */
/* Converts count elements between any two dtypes (round to nearest even
 * for f16 / bf16, saturating for u8 and i32). */
void kn_convert(kn_dtype from, const void *src, kn_dtype to, void *dst, size_t count);

/* Where a graph runs: "cpu" or "cuda:N". */
typedef enum kn_device_kind { KN_DEVICE_CPU = 0, KN_DEVICE_CUDA } kn_device_kind;
typedef struct kn_device {
  kn_device_kind kind;
  int index; /* cuda device number; 0 for cpu */
} kn_device;
/* Parses "cpu", "cuda" (= cuda:0) or "cuda:N". */
int kn_device_parse(const char *text, kn_device *out, char *err, size_t errlen);
void kn_device_format(kn_device d, char *buf, size_t len);

/* ---------------------------------------------------------------- graph -- */

typedef struct kn_graph kn_graph;
typedef int kn_node; /* a node's index in its graph; negative = invalid */

typedef enum kn_init {
  KN_INIT_ZEROS = 0,
  KN_INIT_ONES,
  KN_INIT_GLOROT_UNIFORM, /* U(-l, l), l = sqrt(6 / (fan_in + fan_out)) */
  KN_INIT_GLOROT_NORMAL,  /* truncated N(0, 2 / (fan_in + fan_out)), as Keras */
  KN_INIT_HE_UNIFORM,     /* U(-l, l), l = sqrt(6 / fan_in) */
  KN_INIT_HE_NORMAL,      /* truncated N(0, 2 / fan_in) */
} kn_init;

kn_graph *kn_graph_new(void);
void kn_graph_free(kn_graph *g); /* NULL is a no-op */

/* Builders. A builder given an invalid node or mismatched shapes returns -1
 * and records the first such error in the graph (kn_graph_error), so a
 * model can be built with straight-line code and checked once. */
/* An input fed each step. Its leading dimension is the batch: memory is
 * planned for dims[0] rows and each run may use fewer (kn_graph_run). */
kn_node kn_input(kn_graph *g, const char *name, kn_dtype dtype, int ndim, const int *dims);
/* A trainable parameter, stored in the flat parameter buffer. */
kn_node kn_param(kn_graph *g, const char *name, int ndim, const int *dims, kn_init init);
kn_node kn_matmul(kn_graph *g, kn_node a, kn_node b, int trans_a, int trans_b); /* 2-D */
kn_node kn_bias_add(kn_graph *g, kn_node x, kn_node bias); /* bias along the last dim */
kn_node kn_add(kn_graph *g, kn_node a, kn_node b);         /* same shapes */
kn_node kn_relu(kn_graph *g, kn_node x);
kn_node kn_softmax(kn_graph *g, kn_node x);                            /* over the last dim */
kn_node kn_reshape(kn_graph *g, kn_node x, int ndim, const int *dims); /* a view, no copy */
/* Mean over the batch of -log softmax(logits)[label]; logits (B, C) f32,
 * labels (B) i32. A scalar. */
kn_node kn_softmax_xent(kn_graph *g, kn_node logits, kn_node labels);

/* ---- the full op set (ops.c). Shapes: B is the batch, NHWC images. ---- */
/* Non-trainable state (batch norm moving statistics): kept in a flat state
 * buffer, written by the forward pass in training, checkpointed. */
kn_node kn_state(kn_graph *g, const char *name, int ndim, const int *dims, kn_init init);
/* Broadcasting elementwise ops (numpy rules, shapes aligned at the right). */
kn_node kn_sub(kn_graph *g, kn_node a, kn_node b);
kn_node kn_mul(kn_graph *g, kn_node a, kn_node b);
kn_node kn_div(kn_graph *g, kn_node a, kn_node b);
kn_node kn_add_bcast(kn_graph *g, kn_node a, kn_node b);
kn_node kn_leaky_relu(kn_graph *g, kn_node x, float alpha); /* Keras default alpha 0.3 */
kn_node kn_elu(kn_graph *g, kn_node x, float alpha);        /* Keras default 1.0 */
kn_node kn_gelu(kn_graph *g, kn_node x);
kn_node kn_sigmoid(kn_graph *g, kn_node x);
kn_node kn_tanh(kn_graph *g, kn_node x);
kn_node kn_scale(kn_graph *g, kn_node x, float alpha);
kn_node kn_abs(kn_graph *g, kn_node x);
kn_node kn_square(kn_graph *g, kn_node x);
kn_node kn_log_softmax(kn_graph *g, kn_node x); /* over the last dim */
/* Reductions over one axis (or all with axis -1, giving shape (1)). */
kn_node kn_sum(kn_graph *g, kn_node x, int axis, int keepdims);
kn_node kn_mean(kn_graph *g, kn_node x, int axis, int keepdims);
kn_node kn_max(kn_graph *g, kn_node x, int axis, int keepdims);
kn_node kn_transpose(kn_graph *g, kn_node x, const int *perm); /* perm[0] must be 0 if batched */
kn_node kn_flatten(kn_graph *g, kn_node x);                    /* (B, ...) -> (B, prod) */
kn_node kn_concat(kn_graph *g, kn_node a, kn_node b, int axis);
kn_node kn_slice(kn_graph *g, kn_node x, int axis, int start, int len);
typedef enum kn_padding { KN_PAD_VALID = 0, KN_PAD_SAME } kn_padding;
typedef struct kn_window {
  int kh, kw;                 /* kernel / pool size */
  int stride_h, stride_w;     /* >= 1 */
  int dilation_h, dilation_w; /* >= 1 (convolutions only) */
  kn_padding padding;
} kn_window;
/* x (B, H, W, C), w (KH, KW, C, F) -> (B, OH, OW, F), by im2col + GEMM. */
kn_node kn_conv2d(kn_graph *g, kn_node x, kn_node w, const kn_window *win);
/* x (B, H, W, C), w (KH, KW, C, M) -> (B, OH, OW, C*M). */
kn_node kn_depthwise_conv2d(kn_graph *g, kn_node x, kn_node w, const kn_window *win);
kn_node kn_max_pool2d(kn_graph *g, kn_node x, const kn_window *win);
kn_node kn_avg_pool2d(kn_graph *g, kn_node x, const kn_window *win); /* padding cells not counted */
kn_node kn_global_avg_pool2d(kn_graph *g, kn_node x);                /* (B, H, W, C) -> (B, C) */
/* Batch norm over the last axis. Training runs use batch statistics and
 * move moving_mean / moving_var (torch's rule: unbiased variance, new =
 * (1 - m) * old + m * batch with m = 1 - momentum); other runs use them. */
kn_node kn_batch_norm(kn_graph *g, kn_node x, kn_node gamma, kn_node beta, kn_node moving_mean,
                      kn_node moving_var, float momentum, float epsilon);
/* Batch norm as Keras's synchronized=True: in a data-parallel step its
 * batch statistics, and the two sums over the batch its input gradient
 * takes, cover every replica of every process (summed as the strategy sums
 * gradients: between threads, then over MPI), so the replicas normalize
 * and differentiate as one replica at the global batch would. A graph
 * trained alone runs it as kn_batch_norm. */
kn_node kn_batch_norm_synchronized(kn_graph *g, kn_node x, kn_node gamma, kn_node beta,
                                   kn_node moving_mean, kn_node moving_var, float momentum,
                                   float epsilon);
/* Inverted dropout with a per-step mask from (seed, step, the row's place
 * in the step's global batch: data-parallel replicas mask their slices as
 * one replica at the global batch would); identity outside training runs. */
kn_node kn_dropout(kn_graph *g, kn_node x, float rate, uint64_t seed);
/* Losses, scalar means: softmax cross-entropy against probabilities (B, C);
 * binary cross-entropy with logits; mean squared / absolute error. */
kn_node kn_softmax_xent_dense(kn_graph *g, kn_node logits, kn_node probs);
kn_node kn_bce_logits(kn_graph *g, kn_node logits, kn_node targets);
kn_node kn_mse(kn_graph *g, kn_node pred, kn_node target);
kn_node kn_mae(kn_graph *g, kn_node pred, kn_node target);
/* Fraction of rows whose label is among the k largest logits (k = 1:
 * accuracy). Not differentiable. */
kn_node kn_top_k_accuracy(kn_graph *g, kn_node logits, kn_node labels, int k);

/* Mixed precision (Keras's policies). In a mixed graph every batched f32
 * activation gets a narrow copy right after it is computed, and backward
 * reads that copy (widened again) instead of the f32 value, so activations
 * kept for backward are planned at 2 bytes an element; the forward reads
 * parameters through bf16 / f16 copies and layer outputs through their
 * narrow copies, and gradients flowing back through a cast are rounded to
 * the narrow type; parameters, gradients and optimizer state stay f32, and
 * softmax and the loss are computed in f32. In mixed_bfloat16, matmuls
 * (dense, and conv through a bf16 im2col) run the bf16 GEMM on the bf16
 * copies themselves, forward and backward, and the f32 widened copies and
 * layer outputs that only feed a narrow copy are not planned at all
 * (kn_gemm_kernel). Set before building any node. */
typedef enum kn_precision {
  KN_PRECISION_FLOAT32 = 0,
  KN_PRECISION_MIXED_BFLOAT16,
  KN_PRECISION_MIXED_FLOAT16,
} kn_precision;
int kn_graph_set_precision(kn_graph *g, kn_precision precision, char *err, size_t errlen);
kn_precision kn_graph_precision(const kn_graph *g);
const char *kn_precision_name(kn_precision precision); /* "float32", "mixed_bfloat16", ... */
/* How a policy's matmuls run on this machine, in words. */
const char *kn_mixed_matmul_path(kn_precision precision);
/* Recomputation, of im2col and pooling nodes only: where backward reads
 * the output of an im2col or a pool (or a reshape of one), it re-runs that
 * node from its input (a value backward keeps anyway) instead of keeping
 * the forward output alive; an im2col may re-read a recomputed pool. Every
 * other node's output backward reads (matmuls, convolutions' GEMMs,
 * activations, batch norm, dropout, ...) is kept from forward as without
 * recompute. kn_plan_stats reports the arena with and without. Set before
 * autodiff. */
void kn_graph_set_recompute(kn_graph *g, int on);
/* x (f32) to bf16 / f16, or x (bf16 / f16) to f32; round to nearest even,
 * f16 saturating to inf past 65504 and rounding below its subnormals to 0.
 * The gradient of a widening cast is dy rounded through the narrow type. */
kn_node kn_cast(kn_graph *g, kn_node x, kn_dtype to);
/* Seeds backward with d(loss)/d(loss) = scale instead of 1 (loss scaling). */
void kn_graph_set_loss_scale(kn_graph *g, float scale);

/* Computes every f32 node in double instead: the reference mode in which
 * gradient checks compare autodiff with finite differences. Call before
 * compile; the flat buffers and node data then hold doubles. */
void kn_graph_use_f64(kn_graph *g);
int kn_state_node_count(const kn_graph *g);
kn_node kn_state_node(const kn_graph *g, int i);
void *kn_state_data(kn_graph *g); /* the flat state buffer */

int kn_graph_error(const kn_graph *g, char *err, size_t errlen); /* 0 or the first error */
int kn_graph_node_count(const kn_graph *g);
void kn_node_shape(const kn_graph *g, kn_node n, int *ndim, int *dims);
const char *kn_node_name(const kn_graph *g, kn_node n);
/* The first node named name ("d1.kernel", "grad/d1.kernel"), or -1. */
kn_node kn_graph_find(const kn_graph *g, const char *name);
/* Keep a node's value readable after a run (the planner never reuses it). */
void kn_graph_keep(kn_graph *g, kn_node n);

/* Reverse-mode autodiff: appends to the graph the nodes that compute
 * d(loss)/d(param) for every parameter, binding each final gradient to its
 * slot in the flat gradient buffer. Only nodes that depend on a parameter get
 * gradients. loss must be a scalar. */
int kn_autodiff(kn_graph *g, kn_node loss, char *err, size_t errlen);

typedef struct kn_plan_stats {
  size_t arena_bytes; /* peak of the planned arena */
  size_t naive_bytes; /* one buffer per node, for comparison */
  size_t param_bytes; /* flat parameter buffer */
  size_t grad_bytes;  /* flat gradient buffer */
  int n_nodes;
  int n_forward; /* nodes run by a forward-only pass */
  /* what the passes did */
  int n_cse;                  /* duplicate nodes merged */
  int n_fused;                /* matmul/conv + bias (+ relu) groups fused into one kernel */
  int n_folded;               /* constant nodes computed once at compile */
  int n_dead;                 /* nodes removed */
  int n_inplace;              /* nodes writing over an input that dies with them */
  int n_implicit;             /* im2cols whose GEMMs read the columns in place (kiln's GEMM only) */
  int n_implicit_input_grads; /* col2ims replaced by a transposed convolution (the same) */
  int n_bias_grads_in_gemm;   /* bias gradients summed by a weight gradient's GEMM */
  int n_pool_argmax;          /* max pools whose gradient reads their recorded argmax */
  int n_pool_grads_in_gemm;   /* max pool gradients computed inside a weight gradient's GEMM */
  /* Arena values computed in forward and still live when backward starts:
   * the activations kept for backward (and the kept inputs and outputs). */
  size_t saved_bytes;
  /* With recompute: the arena peak planned for the same graph with each
   * recompute replaced by the forward value it stands for, kept alive
   * instead (close to, not always equal to, the graph built without
   * recompute); arena_bytes when nothing is recomputed. */
  size_t arena_bytes_without_recompute;
  int n_recomputed; /* backward nodes that re-run a forward op */
  /* kn_model_compile: recompute was asked for, and its plan's arena (this
   * many bytes) was larger than the plan without it, so the model was
   * compiled without; 0 otherwise */
  size_t recompute_declined_bytes;
} kn_plan_stats;

/* Graph passes, each switchable before compile (all on by default). */
enum {
  KN_PASS_DCE = 1,        /* dead-node elimination */
  KN_PASS_CONST_FOLD = 2, /* constant subgraphs computed once at compile */
  KN_PASS_CSE = 4,        /* common-subexpression elimination */
  KN_PASS_FUSION = 8,     /* matmul / conv GEMM + bias + relu in one kernel */
  KN_PASS_INPLACE = 16,   /* elementwise ops reuse a dying input's buffer */
  /* a convolution's GEMMs read its im2col columns in place from the padded
   * input (kiln's own GEMM only) */
  KN_PASS_IMPLICIT_COLUMNS = 32,
  /* a stride-1 convolution's input gradient as one GEMM over dy's padded
   * columns read in place, instead of a GEMM into columns and col2im; it
   * sums in another order, so its values differ in the last bits */
  KN_PASS_IMPLICIT_INPUT_GRAD = 64,
  /* a bias gradient (dy summed over rows) is taken by the GEMM of its
   * layer's weight gradient as it packs the same dy, which is then read
   * once instead of twice (kiln's own GEMM only); the same bits unless that
   * GEMM sums a deep product in slices, where each slice's sums add up */
  KN_PASS_BIAS_GRAD_IN_GEMM = 128,
  /* a 2x2 max pool records which cell held each window's maximum (a byte
   * per output element) and its gradient reads that instead of the pool's
   * input and output, so the input need not live until backward; float32
   * and mixed_bfloat16 */
  KN_PASS_POOL_ARGMAX = 256,
  /* a max pool's input gradient read only by its layer's weight gradient
   * (and bias gradient) is never written: that GEMM computes each row from
   * the pool's argmax and dy as it packs it (kiln's own GEMM only; the
   * same bits) */
  KN_PASS_POOL_GRAD_IN_GEMM = 512,
  KN_PASS_ALL = 1023
};
void kn_graph_set_passes(kn_graph *g, unsigned passes);
/* The unoptimized plan, for debugging and comparison: the same compiled
 * graph with every pass off and no buffer reuse (one arena buffer per
 * node), run node by node as graph mode is. It is not an op-by-op (eager)
 * executor: nodes are still built first and compiled. */
void kn_graph_set_unoptimized(kn_graph *g, int unoptimized);
/* Placement, as under tf.device: nodes built from now on run on d (cpu by
 * default); autodiff puts each gradient node on its forward node's device.
 * kn_node_set_device moves one node before compile (KN_ESTATE after).
 * Compile checks every placement: a node on cuda:N needs a CUDA kernel for
 * its op (kiln's CUDA backend runs matmul, relu and relu's gradient; other
 * ops are refused by name) and device N on this machine; such a graph is
 * float32 and its rewriting passes (fusion and the rest) leave it as
 * placed. Values live in host memory either way: a CUDA kernel copies its
 * operands to the device and its result back. */
void kn_graph_set_device(kn_graph *g, kn_device d);
/* Name scope, as tf.name_scope: a node built from now on without a name of
 * its own is named "<scope>/<op>" ("dense_1/matmul", then
 * "dense_1/matmul_1"), which errors, profiles and traces show; NULL or ""
 * = none ("n<index>"). kn_model_build scopes each layer's nodes by the
 * layer's name, and autodiff each gradient's by "grad/<forward node>". */
void kn_graph_set_scope(kn_graph *g, const char *scope);
/* Soft placement (TensorFlow's allow_soft_placement): every node built so
 * far that d has a kernel for moves to d, and the rest stay where they
 * are. Returns how many moved. A graph in another precision than float32
 * has none that a GPU runs. */
int kn_graph_place_soft(kn_graph *g, kn_device d);
/* The CUDA device a graph's nodes are placed on, or -1 if all run on the
 * host (with several, the lowest). */
int kn_graph_gpu(const kn_graph *g);
int kn_node_set_device(kn_graph *g, kn_node n, kn_device d);
kn_device kn_node_device(const kn_graph *g, kn_node n);
/* Threads for the engine's own kernels (im2col, pooling, elementwise, the
 * GEMMs), started at compile and kept for every run; results are the same
 * for every thread count. OpenBLAS, where it runs the f32 GEMM, has
 * threads of its own (openblas_set_num_threads). */
void kn_graph_set_threads(kn_graph *g, int threads);
/* The CPU kernels' instruction-set path: baseline x86-64 (SSE2), AVX2 or
 * AVX-512, all from one source and giving the same bits. AUTO (the
 * default) takes the best the CPU has; forcing one it lacks is an error.
 * Process-wide: set it before graphs run. */
typedef enum kn_isa { KN_ISA_AUTO = 0, KN_ISA_BASELINE, KN_ISA_AVX2, KN_ISA_AVX512 } kn_isa;
int kn_cpu_set_isa(kn_isa isa, char *err, size_t errlen);
kn_isa kn_cpu_isa(void); /* the path in use */
const char *kn_isa_name(kn_isa isa);
/* The single-precision GEMM: kiln's own (AVX-512F, blocked for the tall
 * and narrow shapes of a training step, the same bits for every thread
 * count) or OpenBLAS's. AUTO (the default) takes kiln's where the CPU has
 * AVX-512F; asking for it on a CPU without is an error. The ISA paths
 * above all use the GEMM chosen here. Process-wide: set it before graphs
 * run. The double reference mode always uses OpenBLAS. */
typedef enum kn_gemm_kind { KN_GEMM_AUTO = 0, KN_GEMM_OPENBLAS, KN_GEMM_KILN } kn_gemm_kind;
int kn_cpu_set_gemm(kn_gemm_kind kind, char *err, size_t errlen);
kn_gemm_kind kn_cpu_gemm(void);              /* the GEMM in use */
const char *kn_gemm_name(kn_gemm_kind kind); /* "openblas", "kiln-avx512" */
/* The GEMMs a graph's matmuls run. In mixed_bfloat16 a matmul with a bf16
 * operand (a weight copy, a layer input's narrow copy, a bf16 im2col) runs
 * kiln's bf16 GEMM: operands rounded to bf16, sums in f32. */
typedef enum kn_gemm_kernel {
  KN_GEMM_SGEMM = 0,     /* the f32 GEMM on f32 operands (kiln's own or OpenBLAS's, above) */
  KN_GEMM_BF16_AVX512,   /* kiln's bf16 GEMM, AVX512-BF16 micro-kernel (vdpbf16ps) */
  KN_GEMM_BF16_PORTABLE, /* the same packed bf16 panels through a plain C micro-kernel */
  KN_GEMM_KERNELS
} kn_gemm_kernel;
const char *kn_gemm_kernel_name(kn_gemm_kernel kernel);
/* The bf16 GEMM's kernel now: AVX512 where the CPU has AVX512-BF16 and the
 * AVX-512 path is in use (kn_cpu_set_isa), portable elsewhere. */
kn_gemm_kernel kn_gemm_bf16_kernel(void);
/* Matmul kernel runs of the graph so far, per GEMM. */
uint64_t kn_graph_gemm_calls(const kn_graph *g, kn_gemm_kernel kernel);
/* The bf16 GEMM on its own (benchmarks, tests): a context holds its
 * threads and packing buffers. C (m, n) = op(A) (m, k) x op(B) (k, n), plus
 * C's old value when accumulate; row-major with leading dimensions; A and B
 * are each f32 (rounded to bf16 on the way in) or bf16. */
typedef struct kn_gemm kn_gemm;
kn_gemm *kn_gemm_new(int threads); /* NULL when out of memory or threads */
void kn_gemm_free(kn_gemm *ctx);
int kn_gemm_bf16(kn_gemm *ctx, int m, int n, int k, const void *a, kn_dtype a_type, int lda,
                 int trans_a, const void *b, kn_dtype b_type, int ldb, int trans_b, float *c,
                 int ldc, int accumulate, char *err, size_t errlen);
/* A constant tensor filled with value (unbatched). */
kn_node kn_constant(kn_graph *g, int ndim, const int *dims, float value);

/* Plans memory (liveness over the schedule, offsets in one arena placed
 * largest first),
 * allocates and first-touches the arena and the flat buffers, and
 * initialises parameters from seed. After this, running allocates nothing. */
int kn_graph_compile(kn_graph *g, uint64_t seed, kn_plan_stats *stats, char *err, size_t errlen);

/* The node's storage (valid after compile). Inputs are written here before
 * a run; kept nodes are read here after it. */
void *kn_node_data(kn_graph *g, kn_node n);
/* Byte offset and size of a node in the arena (for plan checks); -1 when the
 * node is not arena-planned (parameters, gradients, views). */
int64_t kn_node_arena_offset(const kn_graph *g, kn_node n, size_t *nbytes);
/* First and last schedule position at which the node's storage is live. */
void kn_node_lifetime(const kn_graph *g, kn_node n, int *first, int *last);

typedef enum kn_run_mode {
  KN_RUN_FORWARD = 0, /* forward nodes only (evaluation) */
  KN_RUN_TRAIN = 1,   /* forward and backward: fills the gradient buffer */
  /* Forward nodes only, with training behaviour (batch statistics, the
   * last training run's dropout mask): the loss a TRAIN run differentiates. */
  KN_RUN_FORWARD_TRAIN = 2,
} kn_run_mode;

/* Runs the compiled graph for a batch of `batch` rows (1..planned batch). */
int kn_graph_run(kn_graph *g, kn_run_mode mode, int batch, char *err, size_t errlen);

/* Flat buffers: every parameter (and its gradient) at the same offset. */
size_t kn_param_count(const kn_graph *g); /* in floats */
float *kn_params(kn_graph *g);
float *kn_grads(kn_graph *g);
int kn_param_node_count(const kn_graph *g);
kn_node kn_param_node(const kn_graph *g, int i);          /* i-th parameter, creation order */
size_t kn_param_offset(const kn_graph *g, kn_node param); /* in floats */

/* ------------------------------------------------------------ optimizers -- */

typedef enum kn_optimizer_type {
  KN_OPT_SGD = 0,
  KN_OPT_ADAM,
  KN_OPT_ADAMW,
  KN_OPT_RMSPROP,
  KN_OPT_ADAGRAD
} kn_optimizer_type;

/* Update rules are torch.optim's, so parity runs compare iterate by
 * iterate. weight_decay is L2 added to the gradient (torch's weight_decay)
 * for every type but adamw, where it is decoupled (p *= 1 - lr * wd). */
typedef struct kn_optimizer_config {
  kn_optimizer_type type;
  float learning_rate;
  float momentum;              /* sgd, rmsprop */
  int nesterov;                /* sgd */
  float beta1, beta2, epsilon; /* adam, adamw; epsilon also rmsprop, adagrad */
  float weight_decay;
  float rho;                       /* rmsprop: moving average of squared gradients */
  float initial_accumulator_value; /* adagrad */
} kn_optimizer_config;

typedef struct kn_optimizer kn_optimizer;
/* State (momentum, moments) is one flat array per kind, sized n_params. */
int kn_optimizer_new(const kn_optimizer_config *cfg, size_t n_params, kn_optimizer **out, char *err,
                     size_t errlen);
void kn_optimizer_free(kn_optimizer *opt);
/* One fused update over the flat buffers. */
void kn_optimizer_step(kn_optimizer *opt, float *params, const float *grads);
int64_t kn_optimizer_iterations(const kn_optimizer *opt);
/* The learning rate the next steps use (schedules and callbacks set it). */
void kn_optimizer_set_learning_rate(kn_optimizer *opt, float lr);
float kn_optimizer_learning_rate(const kn_optimizer *opt);
/* The optimizer's state for saving and restoring a run: its type, the
 * length n of the flat moment arrays m and v (each (n), NULL where this
 * optimizer keeps none) and the step count, all writable in place. */
void kn_optimizer_moments(kn_optimizer *opt, kn_optimizer_type *type, size_t *n, float **m,
                          float **v, int64_t **iterations);

/* --------------------------------------------------------------- models -- */

typedef enum kn_layer_type {
  KN_LAYER_DENSE = 0,
  KN_LAYER_FLATTEN,
  KN_LAYER_ACTIVATION,
  KN_LAYER_CONV2D,
  KN_LAYER_DEPTHWISE_CONV2D,
  KN_LAYER_SEPARABLE_CONV2D,
  KN_LAYER_BATCH_NORM,
  KN_LAYER_DROPOUT,
  KN_LAYER_MAX_POOL2D,
  KN_LAYER_AVG_POOL2D,
  KN_LAYER_GLOBAL_AVG_POOL2D,
  KN_LAYER_ADD,
  KN_LAYER_CONCATENATE,
} kn_layer_type;

typedef enum kn_activation {
  KN_ACT_LINEAR = 0,
  KN_ACT_RELU,
  KN_ACT_SOFTMAX,
  KN_ACT_LEAKY_RELU, /* alpha 0.3 (Keras) unless the layer's alpha is set */
  KN_ACT_ELU,
  KN_ACT_GELU,
  KN_ACT_SIGMOID,
  KN_ACT_TANH,
} kn_activation;

#define KN_LAYER_MAX_INPUTS 8

/* One Keras layer. Zero fields take Keras's defaults (noted), so a config
 * needs only what a Keras call would spell out. */
typedef struct kn_layer_config {
  kn_layer_type type;
  char name[64];
  int units; /* dense */
  int use_bias;
  kn_activation activation;
  float alpha;             /* leaky_relu slope (0: 0.3), elu alpha (0: 1.0) */
  int filters;             /* conv2d, separable_conv2d */
  int kernel_size[2];      /* conv layers */
  int strides[2];          /* conv (0: 1), pools (0: pool_size) */
  int dilation_rate[2];    /* conv (0: 1) */
  kn_padding padding;      /* conv "valid", pools "valid" */
  int depth_multiplier;    /* depthwise / separable (0: 1) */
  int pool_size[2];        /* pools (0: 2) */
  float rate;              /* dropout */
  float momentum, epsilon; /* batch_norm (0: 0.99, 0.001) */
  /* batch_norm, as Keras's synchronized=True: in data-parallel training the
   * batch statistics (and the two sums of its input gradient) are taken
   * over every replica of every process, so R replicas at batch b train as
   * one at R x b. 0 (the default): each replica normalizes by its own
   * slice's statistics, and the moving statistics follow replica 0 of
   * rank 0. Nothing changes for a model trained alone. */
  int synchronized;
  int axis;                        /* concatenate (0: -1, the channels) */
  kn_init kernel_initializer;      /* used when kernel_initializer_set, else glorot_uniform */
  int kernel_initializer_set;      /* (a zeroed config means the Keras default) */
  kn_init bias_initializer;        /* zeros */
  int n_inputs;                    /* 0: the previous layer (or the model input) */
  int inputs[KN_LAYER_MAX_INPUTS]; /* layer indices; -1 = the model input */
} kn_layer_config;

/* What a model's loss compares its last layer with (Keras's losses). */
typedef enum kn_loss {
  KN_LOSS_SPARSE_XENT = 0, /* softmax cross-entropy; y (B) i32 class ids */
  KN_LOSS_XENT,            /* softmax cross-entropy; y (B, C) f32 one-hot rows */
  KN_LOSS_BCE,             /* sigmoid cross-entropy from logits; y (B, C) f32 in [0, 1] */
  KN_LOSS_MSE,             /* regression, mean squared error; y (B, outputs) f32 */
  KN_LOSS_MAE,             /* regression, mean absolute error; y (B, outputs) f32 */
} kn_loss;
/* 1 for mean squared / absolute error: the model predicts numbers, not classes. */
int kn_loss_is_regression(kn_loss loss);

typedef struct kn_model_config {
  int input_ndim;
  int input_shape[KN_MAX_DIMS]; /* per example */
  int n_layers;
  const kn_layer_config *layers;
  int batch_size; /* planned rows */
  uint64_t seed;  /* dropout masks */
  kn_loss loss;   /* zero: sparse categorical cross-entropy */
  kn_precision precision;
  int recompute;
  /* cpu (zero), or cuda:N: the ops the CUDA backend has kernels for run on
   * GPU N and the rest on the host (kn_graph_place_soft); float32 only */
  kn_device device;
} kn_model_config;

/* A model built from Keras-style layers: input x (B, ...) f32, the loss's
 * target y (shape and type by kn_loss), the last layer's output `logits`
 * (B, outputs) kept, and a scalar loss. A softmax on the last layer is
 * folded into a softmax cross-entropy, and a sigmoid into binary
 * cross-entropy (as Keras does with from_logits=False), so the loss is
 * computed stably from the logits. Classification losses need >= 2
 * outputs (binary cross-entropy >= 1); regression any number >= 1.
 * Layers are a DAG: each reads the previous layer or names its inputs, so
 * residual networks (add) and branches (concatenate) are configs too. */
typedef struct kn_model {
  kn_graph *graph;
  kn_node x, y, logits, loss;
  kn_loss loss_kind;
  int n_outputs;       /* the last layer's units */
  int n_classes;       /* n_outputs for classification losses, 0 for regression */
  size_t example_size; /* floats per example */
} kn_model;

int kn_model_build(const kn_model_config *cfg, kn_model *out, char *err, size_t errlen);
/* Compiles m, built from cfg (kn_graph_compile; threads and passes as set
 * on m's graph). With cfg->recompute it also builds and compiles the model
 * without recompute, and keeps whichever plans the smaller arena: re-running
 * forward ops pays only where their values are large, and where little is
 * left to re-create (columns read in place, pools keeping their argmax)
 * the re-run ops' own buffers can raise the peak instead. m is then the
 * model kept (stats->recompute_declined_bytes says which). */
int kn_model_compile(kn_model *m, const kn_model_config *cfg, uint64_t seed, kn_plan_stats *stats,
                     char *err, size_t errlen);
void kn_model_free(kn_model *m); /* frees the graph; the struct is the caller's */

/* --------------------------------------------------------------- datasets -- */

typedef struct kn_dataset {
  int64_t n; /* examples */
  int ndim;  /* per-example rank */
  int shape[KN_MAX_DIMS];
  size_t example_size; /* floats per example */
  float *x;            /* (n, example_size) */
  int32_t *y;          /* (n) */
  int n_classes;       /* max label + 1 */
  float *targets;      /* (n, n_targets) regression targets, or NULL (CSV numeric labels) */
  int n_targets;
  float value_range; /* pixels: 255 (normalize divides by it); 0 = unknown (min-max) */
} kn_dataset;

/* Reads an IDX images file and an IDX labels file (raw or gzip'd), checking
 * magic numbers, dimensions, sizes and that the counts agree. Pixels become
 * floats, divided by 255 when normalize is set. */
int kn_dataset_load_idx(const char *images_path, const char *labels_path, int normalize,
                        kn_dataset *out, char *err, size_t errlen);
void kn_dataset_free(kn_dataset *ds); /* frees the arrays; NULL is a no-op */

/* A CSV file with a header row: label_column names the class column
 * (integers >= 0, or names mapped to classes in sorted order), every other
 * column is a numeric feature; examples are flat (shape {features}). A cell
 * that is not a number is refused naming the file, row and column. When
 * every label is a number (3.7 too), it is also kept as a regression
 * target (targets, n_targets 1). */
int kn_dataset_load_csv(const char *path, const char *label_column, kn_dataset *out, char *err,
                        size_t errlen);

/* A directory with one sub-folder per class (classes in sorted name order)
 * holding PNG or JPEG images, each decoded and resized (bilinear) to
 * height x width x channels (1 = gray, 3 = RGB). Pixels stay in 0..255
 * (value_range 255). A file that does not decode is refused by name. */
int kn_dataset_load_images(const char *dir, int height, int width, int channels, kn_dataset *out,
                           char *err, size_t errlen);

/* A decoded dataset in a file (pipeline cache "file"): written to a
 * per-process temp file and renamed into place; read back as it was. */
int kn_dataset_cache_write(const kn_dataset *ds, const char *path, char *err, size_t errlen);
int kn_dataset_cache_read(const char *path, kn_dataset *out, char *err, size_t errlen);

/* src reordered as tf.data's interleave reads its parts (files, class
 * folders): part i is examples [part_start[i], part_start[i + 1]), and
 * part_start[n_parts] == src->n. cycle_length parts are open at once and
 * block_length examples are taken from each in turn; a part that runs out
 * is replaced by the next unopened one. */
int kn_dataset_interleave(const kn_dataset *src, int n_parts, const int64_t *part_start,
                          int cycle_length, int block_length, kn_dataset *out, char *err,
                          size_t errlen);

/* Examples [start, start + count) of src as a new dataset (copied). */
int kn_dataset_slice(const kn_dataset *src, int64_t start, int64_t count, kn_dataset *out,
                     char *err, size_t errlen);

/* ------------------------------------------------------------- pipeline -- */

/* A tf.data-style input pipeline over an in-memory dataset: skip/take,
 * shard, shuffle (buffer, reshuffled each epoch), map (cast, normalize,
 * standardize, one-hot), augment, batch, repeat, with background producer
 * threads filling a bounded ring of batches. Every example's randomness is
 * drawn from (seed, epoch, position), so the batches are byte-identical
 * whatever the thread count, and a saved position restores exactly. */

#define KN_AUTO (-1)

enum {
  KN_AUG_FLIP_LEFT_RIGHT = 1 << 0,
  KN_AUG_FLIP_UP_DOWN = 1 << 1,
  KN_AUG_RANDOM_CROP = 1 << 2,       /* pad with zeros, crop back at a random offset */
  KN_AUG_RANDOM_BRIGHTNESS = 1 << 3, /* add U(-max_delta, max_delta) to the whole example */
};

typedef struct kn_pipeline_config {
  int batch_size;
  int drop_remainder;
  int64_t shuffle_buffer; /* 0 = keep order; >= examples = a full uniform shuffle */
  uint64_t seed;
  int normalize;   /* x / value_range, or per-feature min-max when value_range is 0 */
  int standardize; /* per channel (last dim): (x - mean) / std, after normalize */
  int n_channels_given;
  const float *mean, *std; /* given (n_channels_given values each); NULL = computed */
  int one_hot;             /* also fill kn_batch.y_onehot */
  int one_hot_depth;       /* its width; 0 = the dataset's classes */
  /* Storage type of the examples the pipeline reads: KN_F32 (0, as given),
   * or KN_F16 / KN_BF16: read from a copy at that precision, converted
   * back to f32 for the maps and the model. */
  kn_dtype cast;
  unsigned augment;             /* KN_AUG_* */
  int crop_padding;             /* random_crop: zeros on each side */
  float brightness_delta;       /* random_brightness */
  int64_t skip, take;           /* on the source, first: take < 0 = all */
  int shard_index, shard_count; /* worker i of n sees positions p with p % n == i */
  int repeat;                   /* epochs; < 0 = forever */
  int num_parallel_calls;       /* producer threads; 0 = in the consumer; KN_AUTO */
  int prefetch;                 /* batches in the ring; KN_AUTO */
  /* A worker's part of each (global) batch: with part_count n > 1 (n must
   * divide batch_size) this pipeline makes only rows [i x batch_size / n,
   * (i + 1) x batch_size / n) of every batch, after the shuffle, so the n
   * parts of a batch are exactly the batch one pipeline makes, augmentation
   * included; maps and augmentation run on the part's rows only. A short
   * last batch leaves the later parts short or empty (rows 0). 0 or 1 =
   * the whole batch. */
  int part_index, part_count;
} kn_pipeline_config;

/* Keras defaults: batch 32, no shuffle, one epoch, 1 thread, prefetch 2. */
void kn_pipeline_config_default(kn_pipeline_config *cfg);

typedef struct kn_batch {
  int rows;
  int epoch;             /* 0-based */
  int64_t index;         /* batch within its epoch */
  const float *x;        /* (rows, example_size) */
  const int32_t *y;      /* (rows) */
  const float *y_onehot; /* (rows, one_hot_depth), only with one_hot */
  const float *targets;  /* (rows, n_targets), when the dataset has regression targets */
} kn_batch;

typedef struct kn_pipeline kn_pipeline;

/* The dataset must outlive the pipeline. Statistics (min-max, mean/std)
 * are computed here over the examples this pipeline reads. */
int kn_pipeline_new(const kn_dataset *ds, const kn_pipeline_config *cfg, kn_pipeline **out,
                    char *err, size_t errlen);
/* An evaluation pipeline over ds with train's maps and statistics: no
 * augmentation, shuffle, skip/take or shard, one epoch, remainder kept;
 * train's part of each batch (a worker evaluates its own part). */
int kn_pipeline_new_eval(const kn_pipeline *train, const kn_dataset *ds, kn_pipeline **out,
                         char *err, size_t errlen);
void kn_pipeline_free(kn_pipeline *p); /* stops the threads; NULL is a no-op */
/* 1 and the next batch (valid until the next call), or 0 at the end. */
int kn_pipeline_next(kn_pipeline *p, kn_batch *out);
int64_t kn_pipeline_batches_per_epoch(const kn_pipeline *p);
int64_t kn_pipeline_examples_per_epoch(const kn_pipeline *p);
int kn_pipeline_example_size(const kn_pipeline *p);

/* The position of the next batch; restoring it (into a pipeline made with
 * the same dataset and config) yields exactly the batches that would have
 * followed. The text form is "epoch:batch:seed". */
typedef struct kn_pipeline_state {
  int64_t epoch, batch;
  uint64_t seed;
} kn_pipeline_state;
void kn_pipeline_save(const kn_pipeline *p, kn_pipeline_state *st);
int kn_pipeline_restore(kn_pipeline *p, const kn_pipeline_state *st, char *err, size_t errlen);
int kn_pipeline_state_format(const kn_pipeline_state *st, char *buf, size_t len);
int kn_pipeline_state_parse(const char *text, kn_pipeline_state *st, char *err, size_t errlen);

/* What the pipeline runs with and what it measured. With KN_AUTO, after a
 * warm-up of batches it sizes threads and prefetch from the producer's time
 * per batch and the consumer's time between batches; tuned says it did. */
typedef struct kn_pipeline_stats {
  int threads, prefetch, tuned;
  double produce_ms; /* one producer's time per batch */
  double consume_ms; /* the consumer's own time between two batches */
  double wait_s;     /* the consumer's total time waiting for a batch */
  int64_t batches;   /* handed out so far */
} kn_pipeline_stats;
void kn_pipeline_stats_get(const kn_pipeline *p, kn_pipeline_stats *out);

/* ------------------------------------------------------------ checkpoints -- */

typedef struct kn_checkpoint_info {
  int64_t bytes;
  char sha256[65];
} kn_checkpoint_info;

/* Writes every parameter as a safetensors file (F32, named by the graph's
 * parameter names), with string metadata pairs (keys[i], values[i]):
 * to path.tmp, fsync, rename to path, fsync the directory. */
int kn_checkpoint_write(kn_graph *g, const char *path, int n_meta, const char *const *keys,
                        const char *const *values, kn_checkpoint_info *info, char *err,
                        size_t errlen);

/* A checkpoint's string metadata, as kn_checkpoint_read found it. */
#define KN_CHECKPOINT_MAX_META 16
typedef struct kn_checkpoint_meta {
  int n;
  char keys[KN_CHECKPOINT_MAX_META][64];
  char values[KN_CHECKPOINT_MAX_META][256];
} kn_checkpoint_meta;
/* The value of key, or NULL. */
const char *kn_checkpoint_meta_get(const kn_checkpoint_meta *meta, const char *key);

/* Loads a safetensors file into a compiled graph: every parameter and state
 * tensor (batch norm moving statistics) by name, its shape checked against
 * the graph's; F32, F16, BF16 and F64 data are converted to f32. A tensor
 * missing from the file, one the graph lacks, a shape or dtype mismatch or
 * a byte range outside the file is an error naming the file and tensor, and
 * leaves the graph's values as they were. meta (may be NULL) gets the
 * file's __metadata__. */
int kn_checkpoint_read(kn_graph *g, const char *path, kn_checkpoint_meta *meta, char *err,
                       size_t errlen);

/* ------------------------------------------------------------------ rng -- */

/* xoshiro256** seeded through splitmix64: the same seed gives the same
 * stream on every machine. */
typedef struct kn_rng {
  uint64_t s[4];
} kn_rng;
void kn_rng_seed(kn_rng *r, uint64_t seed);
uint64_t kn_rng_next(kn_rng *r);
float kn_rng_uniform(kn_rng *r);              /* [0, 1) */
uint64_t kn_rng_below(kn_rng *r, uint64_t n); /* [0, n), unbiased */
/* Fills a buffer with an initializer's values (Keras's definitions). */
void kn_init_fill(kn_init init, float *data, size_t count, int fan_in, int fan_out, kn_rng *rng);

/* --------------------------------------------------------------- profiler -- */

/* Per-node time and output bytes of the graph runs made while recording,
 * plus the phases of each training step the loop marks. */
typedef struct kn_profile kn_profile;
kn_profile *kn_profile_new(void); /* NULL when out of memory */
void kn_profile_free(kn_profile *p);
/* Room for this many events up front, so recording never allocates. */
int kn_profile_reserve(kn_profile *p, size_t events);
/* Runs of a graph with this profile attached are timed while recording
 * (NULL detaches). */
void kn_graph_set_profile(kn_graph *g, kn_profile *p);
/* Starts (on = 1) or stops recording; events are tagged with step. */
void kn_profile_record(kn_profile *p, int64_t step, int on);
int kn_profile_recording(const kn_profile *p);
/* Marks a phase of the step being recorded ("step", "data", "feed",
 * "metrics", "optimizer"), times from kn_profile_now's clock. */
void kn_profile_phase(kn_profile *p, const char *phase, double start, double end);
/* Chrome trace-event JSON: the steps on one track, their phases and nodes
 * (forward, backward) on another, each with its step, op and bytes. */
int kn_profile_write_trace(const kn_profile *p, const kn_graph *g, const char *path, char *err,
                           size_t errlen);
/* The top_n costliest nodes and phases: calls, total and mean time, share
 * of the step, output bytes. */
int kn_profile_write_table(const kn_profile *p, const kn_graph *g, const char *path, int top_n,
                           char *err, size_t errlen);
const char *kn_op_name(int op);

/* ------------------------------------------------------------- strategies -- */

/* How replicas' gradients become the one the optimizer applies. */
typedef enum kn_aggregation {
  KN_AGGREGATE_MEAN = 0,      /* the mean of the replicas' (batch-mean) gradients */
  KN_AGGREGATE_SUM,           /* their sum */
  KN_AGGREGATE_WEIGHTED_MEAN, /* weighted by the rows each replica saw: one big batch's */
} kn_aggregation;

/* Data-parallel training: every replica holds the whole model and takes
 * its slice of each global batch of batch_size x (local replicas x
 * processes) rows: global replica k = rank x n_replicas + i takes rows
 * k x batch_size .. (k + 1) x batch_size - 1, so R replicas at batch b see
 * exactly the examples one replica at batch R x b would. Each process's
 * input pipeline reads, maps and augments only its own part of every
 * global batch (kn_pipeline_config.part_index). Replicas in a process run
 * in threads; processes (kiln-train under mpirun) all-reduce the gradients
 * over MPI in buckets, last layers first; with one replica per process a
 * bucket's all-reduce starts as soon as backward has written its last
 * gradient, while the rest of backward runs. */
typedef struct kn_distribution {
  int n_replicas; /* replicas in this process; 0 or 1 = the trained model alone */
  /* replicas[0..n_replicas - 2]: models built and compiled like the
   * trained one (same layers and planned batch); their parameters are
   * overwritten with its own before the first step */
  kn_model *const *replicas;
  int world_size, rank; /* processes and this one's index; world_size 0 or 1 = one process */
  kn_aggregation aggregation;
  size_t bucket_bytes; /* all-reduce bucket cap; 0 = 1 MiB */
  /* If set, receives at the end the seconds spent making the replicas'
   * gradients one: summing in shared memory, and all-reducing across
   * processes (which includes waiting for the slowest). */
  double *comm_seconds;
  /* The longest a collective of a step waits for the other processes
   * before the run fails with KN_EIO (one died or hangs); 0 = 300 s. The
   * first, while processes load their data, waits at least 600 s. */
  double timeout_s;
  /* parameter_server: ps_servers more processes (ranks world_size ..
   * world_size + ps_servers - 1, after the world_size workers) hold the
   * parameters in shards with their optimizer state and apply the updates;
   * workers push their share of each step's gradient and pull the new
   * parameters. 0 = none: the workers all-reduce. A server's kn_train
   * serves until every worker is done. */
  int ps_servers;
  /* 0 (sync): a server updates once every worker has pushed the step, so
   * W workers at batch b train as one at batch W x b. 1 (async): each
   * push is applied as it comes, as one worker's step; a worker more than
   * ps_max_staleness steps ahead of the slowest waits (< 0: no bound). */
  int ps_async;
  int ps_max_staleness;
} kn_distribution;

/* Whether this build can all-reduce across processes (built with MPI). */
int kn_dist_have_mpi(void);

/* --------------------------------------------------------------- training -- */

typedef enum kn_event_kind {
  KN_EVENT_STEP = 0,   /* every log_every_steps steps: loss over the interval */
  KN_EVENT_EPOCH,      /* end of an epoch: epoch means and validation */
  KN_EVENT_CHECKPOINT, /* a checkpoint file is in place */
  KN_EVENT_EVAL,       /* a validation pass every eval_every_steps, inside an epoch */
  KN_EVENT_NOTICE,     /* a callback acted: message says what (lr reduced, early stop) */
} kn_event_kind;

#define KN_EVENT_MAX_METRICS 8

/* A step or epoch event's loss and metrics are means over the window's
 * examples whose loss was finite; a window with none (under mixed_float16,
 * every step skipped for a non-finite loss) reports none of them rather
 * than a 0. Under loss scaling step events add loss_scale, and step and
 * epoch events skipped_steps: the steps skipped so far in the run. */
typedef struct kn_train_event {
  kn_event_kind kind;
  int epoch;    /* 1-based */
  int64_t step; /* optimizer steps done so far */
  int n_metrics;
  const char *names[KN_EVENT_MAX_METRICS];
  double values[KN_EVENT_MAX_METRICS];
  const char *path; /* checkpoint */
  const kn_checkpoint_info *checkpoint;
  const char *code;    /* notice: EARLY_STOPPED, LR_REDUCED or PROFILE_WRITTEN */
  const char *message; /* notice */
  double seconds;      /* since training started */
} kn_train_event;

/* Returns 0 to go on, non-zero to stop training early (not an error). */
typedef int (*kn_train_callback)(const kn_train_event *ev, void *user);

/* Learning rate over optimizer steps t = 0, 1, ...: an optional linear
 * warmup (lr x (t+1) / warmup_steps for t < warmup_steps), then a decay
 * counted from the warmup's end, d = t - warmup_steps:
 *   constant     lr
 *   step         lr x gamma^floor(d / step_size)              (torch StepLR)
 *   exponential  lr x decay_rate^(d / decay_steps), the exponent floored
 *                with staircase                   (Keras ExponentialDecay)
 *   cosine       lr x (alpha + (1 - alpha) x (1 + cos(pi x min(d, decay_steps)
 *                / decay_steps)) / 2)                  (Keras CosineDecay) */
typedef enum kn_schedule_type {
  KN_SCHEDULE_CONSTANT = 0,
  KN_SCHEDULE_STEP,
  KN_SCHEDULE_EXPONENTIAL,
  KN_SCHEDULE_COSINE,
} kn_schedule_type;

typedef struct kn_lr_schedule {
  kn_schedule_type type;
  int64_t warmup_steps;
  int64_t step_size;   /* step */
  double gamma;        /* step */
  int64_t decay_steps; /* exponential, cosine */
  double decay_rate;   /* exponential */
  int staircase;       /* exponential */
  double alpha;        /* cosine: the final lr as a fraction of lr */
} kn_lr_schedule;

/* The learning rate the schedule gives at optimizer step t (0-based). */
double kn_lr_at(const kn_lr_schedule *s, double lr, int64_t t);

typedef enum kn_monitor_mode { KN_MODE_MIN = 0, KN_MODE_MAX } kn_monitor_mode;

/* Callbacks on a metric of each epoch's end (an epoch event's name:
 * "val_loss", "val_accuracy", "epoch_loss", ...), as Keras's: a value
 * improves when it beats the best so far by more than min_delta. */
typedef struct kn_early_stopping {
  int enabled;
  char monitor[32];
  kn_monitor_mode mode;
  double min_delta;
  int patience; /* epochs without improvement before training stops */
} kn_early_stopping;

typedef struct kn_reduce_on_plateau {
  int enabled;
  char monitor[32];
  kn_monitor_mode mode;
  double min_delta;
  int patience; /* epochs without improvement before lr x= factor */
  double factor;
  int cooldown; /* epochs after a reduction before counting again */
  double min_lr;
} kn_reduce_on_plateau;

typedef struct kn_train_config {
  int epochs;
  int batch_size;
  int shuffle;
  int drop_remainder;
  uint64_t seed;
  int log_every_steps;
  const char *checkpoint_dir;    /* NULL = no checkpoint */
  const char *checkpoint_prefix; /* file name prefix, e.g. "ckpt" */
  kn_optimizer_config optimizer;
  /* The input pipeline; NULL = batch_size, shuffle (a full shuffle) and
   * drop_remainder above, no maps, batches made in the training thread. */
  const kn_pipeline_config *pipeline;
  /* Where a resumed run's data picks up: the pipeline_state a checkpoint
   * recorded (kn_pipeline_state_parse); NULL = from the start. Training
   * goes on from that epoch and batch with exactly the batches the first
   * run would have seen next. */
  const kn_pipeline_state *resume;
  /* A checkpoint written by a run of the same spec (weights, and the
   * training-state file beside it: optimizer moments, step, epoch, dropout
   * stream, pipeline position, the partial epoch's sums); NULL = start
   * afresh. Training then goes on exactly as the first run would have:
   * the same batches, losses and weights. Wins over resume. */
  const char *resume_from;
  /* A checkpoint every N optimizer steps (0 = only the final one). One
   * that falls on the last step of an epoch is written after the epoch's
   * validation, so a resume never repeats or loses an epoch's metrics. */
  int checkpoint_every_steps;
  /* Polled between steps (may be NULL): when it becomes non-zero, training
   * writes a checkpoint (if checkpoint_dir is set) and returns KN_ESTOPPED.
   * A signal handler may set it. */
  const volatile sig_atomic_t *stop_request;
  /* Called once when an auto-tuned pipeline has chosen (may be NULL). */
  void (*on_tuned)(const kn_pipeline_stats *stats, void *user);
  /* KN_METRIC_* reported beside the loss; 0 = accuracy for classification
   * losses, nothing more for regression. */
  unsigned metrics;
  int top_k; /* KN_METRIC_TOP_K's k; 0 = 5 */
  /* Gradient accumulation: this many batches (micro-batches of batch_size)
   * per optimizer step, their gradients averaged weighted by rows, so the
   * update equals one over the k x batch_size examples (batch norm's batch
   * statistics aside). An epoch's last window may be shorter. 0 or 1 =
   * one step per batch. Steps, logging and checkpoints count optimizer
   * steps. */
  int accumulation_steps;
  /* Scale the gradients down to this global L2 norm when above it (Keras's
   * global_clipnorm); 0 = no clipping. */
  double clip_global_norm;
  kn_lr_schedule schedule;
  kn_reduce_on_plateau plateau; /* not with a schedule other than constant */
  kn_early_stopping early_stopping;
  /* Profile optimizer steps profile_first..profile_last (1-based; 0 = no
   * profile): written when the last is done, as profile_path (trace JSON)
   * and profile_table_path (the top nodes), and announced by a notice.
   * With several processes only rank 0 profiles and writes them. */
  int64_t profile_first, profile_last;
  const char *profile_path, *profile_table_path;
  /* A validation pass every N optimizer steps as well as at each epoch's
   * end (KN_EVENT_EVAL, val_* names); 0 = at epoch ends only. */
  int eval_every_steps;
  /* Dynamic loss scaling, on for a mixed_float16 model (Keras's
   * LossScaleOptimizer): the first scale (0 = 2^15) and the finite steps in
   * a row after which it doubles (0 = 2000). A run fails with KN_ENUMERIC
   * when loss_scale_max_skipped_steps steps in a row have been skipped
   * (0 = 50): halving from 2^15 reaches the floor of 1 in 15 of them, and
   * a step that still overflows there has diverged, not underflowed. */
  double initial_loss_scale;
  int64_t loss_scale_growth_interval;
  int64_t loss_scale_max_skipped_steps;
  /* Replicas and processes training together (zeroed: one replica). Only
   * rank 0 writes checkpoints; every rank reports the same metrics,
   * summed over all replicas. */
  kn_distribution dist;
} kn_train_config;

/* Dynamic loss scaling: backward is seeded with scale; the gradients are
 * unscaled and checked; a step with an inf or NaN is skipped and halves the
 * scale, though never below KN_LOSS_SCALE_MIN (as Keras's
 * LossScaleOptimizer), and growth_interval finite steps in a row double
 * it. */
#define KN_LOSS_SCALE_MIN 1.0
typedef struct kn_loss_scaler {
  double scale;
  int64_t good_steps; /* finite steps since the scale last changed */
  int64_t growth_interval;
  int64_t skipped;          /* steps skipped so far (the metric skipped_steps) */
  int64_t skipped_in_a_row; /* skipped since the last finite step */
} kn_loss_scaler;
void kn_loss_scaler_init(kn_loss_scaler *s, double initial_scale, int64_t growth_interval);
/* Divides n gradients by the scale in place; 1 when all are finite. */
int kn_loss_scaler_unscale(const kn_loss_scaler *s, float *grads, size_t n);
/* After a step: finite (the step was applied) or not (skipped). */
void kn_loss_scaler_update(kn_loss_scaler *s, int finite);

enum {
  KN_METRIC_ACCURACY = 1, /* classification: argmax (or logit > 0 for one output) hits */
  KN_METRIC_MSE = 2,      /* regression: mean squared error over every output */
  KN_METRIC_MAE = 4,      /* regression: mean absolute error */
  KN_METRIC_TOP_K = 8,    /* classification: the label among the k highest scores */
};

/* Trains model on train for cfg->epochs, evaluating on val (may be NULL)
 * after each epoch. With checkpoint_dir set it writes
 * "<prefix>-<step 8 digits>.safetensors" (weights) after
 * "<prefix>-<step>.state" (training state) every checkpoint_every_steps
 * steps, on a stop request and at the end. KN_ESTOPPED after a stop
 * request, with the checkpoint written. */
int kn_train(kn_model *model, const kn_dataset *train, const kn_dataset *val,
             const kn_train_config *cfg, kn_train_callback cb, void *user, char *err,
             size_t errlen);

/* Loss and accuracy of a classification model on a whole dataset, in
 * batches (a regression model is refused: it has no accuracy). */
int kn_evaluate(kn_model *model, const kn_dataset *ds, double *loss, double *accuracy, char *err,
                size_t errlen);

#endif
