/* engine_graph.h — the engine's core: error codes, element types, devices,
 * the static graph and its ops, compile (passes, memory plan) and run, the
 * flat parameter buffers, the rng and the profiler. Part of engine.h. */
#ifndef KILN_ENGINE_PUBLIC_GRAPH_H
#define KILN_ENGINE_PUBLIC_GRAPH_H

#include <stddef.h>
#include <stdint.h>

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
/* Whether float32 GEMMs on a GPU may run on TF32 tensor cores, their
 * operands rounded to a 10-bit mantissa and the products summed in
 * float32 (PyTorch's torch.backends.cuda.matmul.allow_tf32); off by
 * default. The CPU has no TF32: its GEMMs stay float32. */
void kn_graph_set_allow_tf32(kn_graph *g, int on);
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
  int n_col2im_chunks;        /* column GEMMs and col2ims run by chunks of images */
  int n_bias_grads_in_gemm;   /* bias gradients summed by a weight gradient's GEMM */
  int n_pool_argmax;          /* max pools whose gradient reads their recorded argmax */
  int n_pool_grads_in_gemm;   /* max pool gradients computed inside a weight gradient's GEMM */
  int n_bn_grads;             /* batch norm backwards that write their gamma and beta gradients */
  int n_bn_relu_grads;        /* relu gradients taken inside a batch norm's backward */
  int n_narrow_copies;        /* bf16 copies written by their value's own kernel */
  int n_concat_views;         /* concatenations and slices that are parts of another's storage */
  int n_bn_folds;             /* batch norms folded into their matmul for forward-only runs */
  int n_winograd;             /* convolution products computed by Winograd (3x3 and 5x5) */
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
  /* a batch norm's backward in two passes over the data: its input
   * gradient's sums (of dy and dy xhat) are its gamma and beta gradients,
   * written then instead of summed again; and the gradient of a relu fused
   * into the batch norm is taken in those two passes (the mask read from
   * the relu's output) instead of being written out. The same bits;
   * float32, batch norm not synchronized */
  KN_PASS_BN_GRADS = 1024,
  /* mixed_bfloat16: the bf16 copy a layer output is kept in for backward
   * is written by the kernel that computes the output (relu, add, batch
   * norm's apply, a matmul on the bf16 GEMM), as it stores each element,
   * instead of by a cast that reads the whole output again. The same bits */
  KN_PASS_NARROW_COPIES = 2048,
  /* concatenate and its gradient's slices without copies where only they
   * read the values: a concatenation whose only reader is another one
   * along the same axis is written into its place in that one's output,
   * and a slice read only by slices and concatenations is read where it
   * lies in its input (the CPU's concat and slice kernels read and write
   * such parts). The same bits */
  KN_PASS_CONCAT_VIEWS = 4096,
  /* batch norm folded into the convolution or dense layer before it for
   * forward-only runs (evaluation, prediction), as TensorFlow folds batch
   * norms for inference: that matmul multiplies by its kernel scaled by
   * gamma / sqrt(moving variance + epsilon) and adds the shifted bias (and
   * the norm's relu), writing the norm's output; training runs are
   * untouched. The same values to rounding; float32 */
  KN_PASS_BN_FOLD = 8192,
  /* 3x3 and 5x5, stride-1 convolutions of 8 or more input and output
   * channels (and outputs large enough that their tiles save at least half
   * the multiplies) compute their forward product, input gradient and
   * weight gradient by Winograd's F(4x4, 3x3) (36 products per 16 outputs
   * instead of 144) or F(2x2, 5x5) (36 per 4 instead of 100), dilated ones
   * over the d x d phases of their outputs, with adds around them, summed in float32 (bf16
   * operands under mixed_bfloat16 widened as read). The values change to
   * rounding (the transforms' constants reach 8 and 1/24). On CPUs with
   * AVX-512F, where kiln's own GEMM runs */
  KN_PASS_WINOGRAD = 16384,
  /* The input gradient of a convolution the implicit_input_grad pass does
   * not take (strided or dilated), a GEMM of dy by the kernel into
   * columns (KH x KW times the input's size) that col2im then sums, runs
   * as one node (col2im_gemm) by chunks of images: each chunk's columns
   * into a buffer the caches hold, then summed into its images' dx. The
   * columns never go to memory as a whole, nor take the arena. The same
   * values (the same sums in the same order); float32, where kiln's own
   * GEMM runs */
  KN_PASS_COL2IM_CHUNKS = 32768,
  KN_PASS_ALL = 65535
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
 * are. Returns how many moved. A graph in the float64 reference mode or
 * with the unoptimized plan has none that a GPU runs. */
int kn_graph_place_soft(kn_graph *g, kn_device d);
/* Soft placement of what is placed: every node on a GPU whose backend has
 * no kernel for it (or in a graph in the float64 reference mode or with
 * the unoptimized plan) moves to the host. Returns how many stay on GPUs. */
int kn_graph_place_fallback(kn_graph *g);
/* The CUDA device a graph's nodes are placed on, or -1 if all run on the
 * host (with several, the lowest; kn_graph_gpu_last: the highest). */
int kn_graph_gpu(const kn_graph *g);
int kn_graph_gpu_last(const kn_graph *g);
/* Of the nodes that run a kernel, how many run on a GPU (*on_gpu) out of
 * *with_kernel, and the distinct ops of those on the host, comma
 * separated in graph order, into host_ops (cut to len). */
void kn_graph_placement_summary(const kn_graph *g, int *on_gpu, int *with_kernel, char *host_ops,
                                size_t len);
int kn_node_set_device(kn_graph *g, kn_node n, kn_device d);
kn_device kn_node_device(const kn_graph *g, kn_node n);
/* Bytes a compiled graph has copied to its GPUs and back over its life,
 * and the bytes it holds there. A value stays on the GPU its kernel ran on
 * and crosses only where a reader elsewhere needs it: the batch and the
 * parameters in once a run, a value a CPU kernel reads (or a gradient,
 * for the optimizer on the host) out once. */
void kn_graph_device_copies(const kn_graph *g, uint64_t *to_devices, uint64_t *to_host,
                            size_t *held);
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
/* Makes kn_graph_compile stop once the plan is made: it fills the stats
 * (arena, parameter and gradient bytes) and allocates, touches and
 * initialises nothing, so a model far too large for the machine is
 * measured in milliseconds. The graph can then never run. Set before
 * compile. */
void kn_graph_set_plan_only(kn_graph *g);

/* The node's storage (valid after compile). Inputs are written here before
 * a run; kept nodes are read here after it. A value the last run computed
 * on a GPU is copied here first: NULL if that copy fails (the graph keeps
 * the reason, kn_graph_error). */
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

/* Flat buffers: every parameter (and its gradient) at the same offset. A
 * graph whose kernels run on a GPU copies back what only the device holds
 * (the parameters after an optimizer step there, gradients computed
 * there) before it returns them, and takes the host's copy as the current
 * one from then on (the caller may write it). A failed copy is recorded
 * in the graph (kn_graph_error). */
size_t kn_param_count(const kn_graph *g); /* in floats */
float *kn_params(kn_graph *g);
float *kn_grads(kn_graph *g);
int kn_param_node_count(const kn_graph *g);
kn_node kn_param_node(const kn_graph *g, int i);          /* i-th parameter, creation order */
size_t kn_param_offset(const kn_graph *g, kn_node param); /* in floats */

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

#endif
