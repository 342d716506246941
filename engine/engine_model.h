/* engine_model.h — optimizers, Keras-style models built from layer configs,
 * and safetensors checkpoints of a model's weights. Part of engine.h. */
#ifndef KILN_ENGINE_PUBLIC_MODEL_H
#define KILN_ENGINE_PUBLIC_MODEL_H

#include "common.h" /* kc_sha256 for checkpoint digests */
#include "engine_graph.h"

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
/* The floats of state kn_optimizer_new would allocate for n_params. */
size_t kn_optimizer_state_floats(const kn_optimizer_config *cfg, size_t n_params);
/* One fused update over the flat buffers; _on: split over g's threads
 * (the same bits on any count). */
void kn_optimizer_step(kn_optimizer *opt, float *params, const float *grads);
void kn_optimizer_step_on(kn_optimizer *opt, kn_graph *g, float *params, const float *grads);
/* One step of g's parameters with its gradients, where they are: on the
 * GPU that computed every gradient (the parameters and the optimizer's
 * state then stay there: kn_params and kn_optimizer_moments bring them
 * back when asked), else on the host. KN_OK, or an error code with a
 * sentence in err. */
int kn_optimizer_step_graph(kn_optimizer *opt, kn_graph *g, char *err, size_t errlen);
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
  /* Model parallelism, as under tf.device: with `placed` set, the layer's
   * nodes are placed on `device` (and autodiff puts their gradients there
   * too): on cuda:N, what the CUDA backend has kernels for runs on GPU N
   * and the rest on the host; cpu keeps the whole layer on the host. 0:
   * the model's device. */
  int placed;
  kn_device device;
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
  int allow_tf32; /* float32 GEMMs on a GPU on TF32 tensor cores (kn_graph_set_allow_tf32) */
  /* cpu (zero), or cuda:N: the ops the CUDA backend has kernels for run on
   * GPU N and the rest on the host (soft placement); float32 only. A
   * layer may name a device of its own (kn_layer_config.placed). */
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
  /* (n_layers): each layer's output node, by layer index */
  kn_node *layer_outputs;
  /* The last layer's activation that the loss applies itself, so logits
   * lack it: softmax (cross-entropy), sigmoid (binary cross-entropy) or
   * linear. kn_model_predict applies it. */
  kn_activation output_activation;
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
/* "dense", "conv2d", ...: a layer kind as the spec names it. */
const char *kn_layer_kind(kn_layer_type t);

/* The model's inference on n examples x (n, example_size) into out
 * (n, n_outputs): forward runs in batches of the planned size (batch norm
 * on its moving statistics, no dropout), and the activation the loss
 * folded away (output_activation) applied to the logits, so out holds
 * what the model declares: probabilities after a softmax. */
int kn_model_predict(kn_model *m, const float *x, int64_t n, float *out, char *err, size_t errlen);

/* ------------------------------------------------------------------ onnx -- */

/* The model as an ONNX model (opset 17, IR version 8): its inference graph
 * (batch norm in inference mode on the moving statistics, dropout removed,
 * the last layer's softmax or sigmoid kept as the output), every weight an
 * initializer in float32 whatever the training precision, a dynamic batch
 * dimension. The input is named "input" and takes kiln's layout (B, ...),
 * images NHWC as kiln's data; inside, convolutions and pools run NCHW
 * behind Transpose nodes. Each layer's output is a tensor named after the
 * layer and the graph's output is the last layer's. m was built from cfg
 * and compiled, its weights trained or loaded. A layer the exporter cannot
 * translate is an error naming it. graph_name may be NULL ("kiln"). */
int kn_onnx_encode(kn_model *m, const kn_model_config *cfg, const char *graph_name, uint8_t **out,
                   size_t *len, char *err, size_t errlen);
/* kn_onnx_encode into a file: a temp file, fsync'd and renamed to path. */
int kn_onnx_export(kn_model *m, const kn_model_config *cfg, const char *graph_name,
                   const char *path, char *err, size_t errlen);

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

#endif
