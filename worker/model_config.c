/* model_config.c — a job spec's model in the engine's terms: the layers
 * (every default already filled in by the api) and the model config that
 * kiln-train trains and exports. */
#include <stdio.h>
#include <string.h>

#include "worker.h"

static kn_init to_engine_init(api_initializer init) {
  switch (init) {
  case API_INIT_GLOROT_UNIFORM: return KN_INIT_GLOROT_UNIFORM;
  case API_INIT_GLOROT_NORMAL: return KN_INIT_GLOROT_NORMAL;
  case API_INIT_HE_UNIFORM: return KN_INIT_HE_UNIFORM;
  case API_INIT_HE_NORMAL: return KN_INIT_HE_NORMAL;
  case API_INIT_ZEROS: return KN_INIT_ZEROS;
  case API_INIT_ONES: return KN_INIT_ONES;
  }
  return KN_INIT_GLOROT_UNIFORM;
}

/* The spec's layers (every default already filled in by the api) as the
 * engine's; the enums line up name for name. */
static void to_engine_layers(const api_job_spec *spec, kn_layer_config *layers) {
  static const kn_activation acts[] = {
      [API_ACT_LINEAR] = KN_ACT_LINEAR,   [API_ACT_RELU] = KN_ACT_RELU,
      [API_ACT_SOFTMAX] = KN_ACT_SOFTMAX, [API_ACT_LEAKY_RELU] = KN_ACT_LEAKY_RELU,
      [API_ACT_ELU] = KN_ACT_ELU,         [API_ACT_GELU] = KN_ACT_GELU,
      [API_ACT_SIGMOID] = KN_ACT_SIGMOID, [API_ACT_TANH] = KN_ACT_TANH};
  static const kn_layer_type types[] = {[API_LAYER_DENSE] = KN_LAYER_DENSE,
                                        [API_LAYER_FLATTEN] = KN_LAYER_FLATTEN,
                                        [API_LAYER_ACTIVATION] = KN_LAYER_ACTIVATION,
                                        [API_LAYER_RELU] = KN_LAYER_ACTIVATION,
                                        [API_LAYER_CONV2D] = KN_LAYER_CONV2D,
                                        [API_LAYER_DEPTHWISE_CONV2D] = KN_LAYER_DEPTHWISE_CONV2D,
                                        [API_LAYER_SEPARABLE_CONV2D] = KN_LAYER_SEPARABLE_CONV2D,
                                        [API_LAYER_BATCH_NORM] = KN_LAYER_BATCH_NORM,
                                        [API_LAYER_DROPOUT] = KN_LAYER_DROPOUT,
                                        [API_LAYER_MAX_POOL2D] = KN_LAYER_MAX_POOL2D,
                                        [API_LAYER_AVG_POOL2D] = KN_LAYER_AVG_POOL2D,
                                        [API_LAYER_GLOBAL_AVG_POOL2D] = KN_LAYER_GLOBAL_AVG_POOL2D,
                                        [API_LAYER_ADD] = KN_LAYER_ADD,
                                        [API_LAYER_CONCATENATE] = KN_LAYER_CONCATENATE};
  for (int i = 0; i < spec->n_layers; i++) {
    const api_layer *a = &spec->layers[i];
    kn_layer_config *k = &layers[i];
    memset(k, 0, sizeof *k);
    snprintf(k->name, sizeof k->name, "%s", a->name);
    k->type = types[a->type];
    k->units = a->units;
    k->use_bias = a->use_bias;
    k->activation = a->type == API_LAYER_RELU ? KN_ACT_RELU : acts[a->activation];
    k->alpha = (float)a->alpha;
    k->filters = a->filters;
    k->depth_multiplier = a->depth_multiplier;
    k->padding = a->padding_same ? KN_PAD_SAME : KN_PAD_VALID;
    for (int d = 0; d < 2; d++) {
      k->kernel_size[d] = a->kernel_size[d];
      k->strides[d] = a->strides[d];
      k->dilation_rate[d] = a->dilation_rate[d];
      k->pool_size[d] = a->pool_size[d];
    }
    k->rate = (float)a->rate;
    k->momentum = (float)a->momentum;
    k->epsilon = (float)a->epsilon;
    k->synchronized = a->synchronized;
    k->axis = a->axis;
    k->kernel_initializer = to_engine_init(a->kernel_initializer);
    k->kernel_initializer_set = 1;
    k->bias_initializer = to_engine_init(a->bias_initializer);
    k->n_inputs = a->n_inputs;
    for (int j = 0; j < a->n_inputs && j < KN_LAYER_MAX_INPUTS; j++) k->inputs[j] = a->inputs[j];
    /* model parallelism: the job's GPU k (kiln-train offsets it to the
     * process's first), or the host */
    k->placed = a->device != 0;
    if (a->device > 0) k->device = (kn_device){KN_DEVICE_CUDA, a->device - 1};
  }
}

void worker_model_config(const api_job_spec *spec, kn_layer_config *layers, kn_model_config *mc) {
  to_engine_layers(spec, layers);
  static const kn_loss losses[] = {[API_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY] = KN_LOSS_SPARSE_XENT,
                                   [API_LOSS_CATEGORICAL_CROSSENTROPY] = KN_LOSS_XENT,
                                   [API_LOSS_BINARY_CROSSENTROPY] = KN_LOSS_BCE,
                                   [API_LOSS_MEAN_SQUARED_ERROR] = KN_LOSS_MSE,
                                   [API_LOSS_MEAN_ABSOLUTE_ERROR] = KN_LOSS_MAE};
  *mc = (kn_model_config){
      .input_ndim = spec->input_ndim,
      .n_layers = spec->n_layers,
      .layers = layers,
      .batch_size = spec->batch_size,
      .seed = spec->seed,
      .loss = losses[spec->loss_type],
      .precision = strcmp(spec->precision, "mixed_bfloat16") == 0  ? KN_PRECISION_MIXED_BFLOAT16
                   : strcmp(spec->precision, "mixed_float16") == 0 ? KN_PRECISION_MIXED_FLOAT16
                                                                   : KN_PRECISION_FLOAT32,
      .recompute = spec->recompute,
      .allow_tf32 = spec->allow_tf32};
  memcpy(mc->input_shape, spec->input_shape, sizeof mc->input_shape);
}
