/* kiln_parity.c — the kiln side of the PyTorch parity test: builds the
 * reference MLP, the every-layer CNN or the zoo's blocks, writes its
 * initial weights as safetensors, generates seeded batches (written out so
 * torch trains on the same ones), trains STEPS steps with one optimizer,
 * writes the losses and the final weights, then evaluates one more batch
 * (forward only: batch norm by its moving statistics, with the evaluation
 * passes) and writes its logits.
 *
 *   kiln-parity mlp|cnn|branches|resblock sgd|sgd_nesterov|adam|adamw|rmsprop|adagrad STEPS OUTDIR
 *
 * OUTDIR gets init.safetensors, final.safetensors, x.bin (f32, STEPS + 1
 * batches), y.bin (i32), losses.txt (one per line) and eval.bin (the last
 * batch's logits, f32). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

enum { MLP_BATCH = 32, CNN_BATCH = 16 };

/* The MLP 784-512-256-10 relu. */
static const kn_layer_config mlp_layers[] = {
    {.type = KN_LAYER_FLATTEN, .name = "flatten"},
    {.type = KN_LAYER_DENSE, .name = "d1", .units = 512, .use_bias = 1, .activation = KN_ACT_RELU},
    {.type = KN_LAYER_DENSE, .name = "d2", .units = 256, .use_bias = 1, .activation = KN_ACT_RELU},
    {.type = KN_LAYER_DENSE, .name = "d3", .units = 10, .use_bias = 1},
};

/* Every layer type of the parity CNN on (10, 10, 3) inputs:
 * conv -> batch norm -> relu -> separable conv -> residual add -> depthwise conv ->
 * max pool -> avg pool -> global average pool -> flatten -> dense. Stride-1
 * "same" convolutions pad symmetrically, as torch's padding=1 does. */
static const kn_layer_config cnn_layers[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "conv",
     .filters = 8,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_BATCH_NORM, .name = "bn", .momentum = 0.9f, .epsilon = 1e-3f},
    {.type = KN_LAYER_ACTIVATION, .name = "bn_relu", .activation = KN_ACT_RELU},
    {.type = KN_LAYER_SEPARABLE_CONV2D,
     .name = "sep",
     .filters = 8,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .depth_multiplier = 2,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_ADD, .name = "res", .n_inputs = 2, .inputs = {2, 3}},
    {.type = KN_LAYER_DEPTHWISE_CONV2D, .name = "dw", .kernel_size = {3, 3}, .use_bias = 1},
    {.type = KN_LAYER_MAX_POOL2D, .name = "mp", .pool_size = {2, 2}},
    {.type = KN_LAYER_AVG_POOL2D, .name = "ap", .pool_size = {2, 2}, .strides = {1, 1}},
    {.type = KN_LAYER_GLOBAL_AVG_POOL2D, .name = "gap"},
    {.type = KN_LAYER_FLATTEN, .name = "flat"},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 5, .use_bias = 1},
};

/* The zoo's blocks on (12, 12, 3) inputs, for the kernels and passes the
 * CNN above does not reach: a stride-2 "same" convolution (Keras pads the
 * odd cell at the bottom and right) into batch norm and relu (a norm the
 * evaluation pass folds into the convolution); three branches, depthwise
 * 3x3 over 16 channels (the kernels' register path), the same dilated by 2,
 * and a 1x1 convolution with tanh, concatenated (two concatenations the
 * concat_views pass writes in place); a stride-2 depthwise convolution over
 * the 40 channels (two blocks of 16 and a tail of 8) into batch norm; global
 * average pooling and dense layers with gelu and leaky relu. The layers
 * before a batch norm have no bias, as in Keras models: the norm takes out
 * its gradient exactly, so what is left is rounding, which Adam's and
 * RMSProp's normalization would blow up to a learning-rate-sized step that
 * compares rounding luck, not implementations. */
static const kn_layer_config branches_layers[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "stem",
     .filters = 16,
     .kernel_size = {3, 3},
     .strides = {2, 2},
     .padding = KN_PAD_SAME},
    {.type = KN_LAYER_BATCH_NORM, .name = "stem_bn", .momentum = 0.9f, .epsilon = 1e-3f},
    {.type = KN_LAYER_ACTIVATION, .name = "stem_relu", .activation = KN_ACT_RELU},
    {.type = KN_LAYER_DEPTHWISE_CONV2D,
     .name = "dw_a",
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_DEPTHWISE_CONV2D,
     .name = "dw_b",
     .kernel_size = {3, 3},
     .dilation_rate = {2, 2},
     .padding = KN_PAD_SAME,
     .n_inputs = 1,
     .inputs = {2}},
    {.type = KN_LAYER_CONV2D,
     .name = "pw",
     .filters = 8,
     .kernel_size = {1, 1},
     .use_bias = 1,
     .activation = KN_ACT_TANH,
     .n_inputs = 1,
     .inputs = {2}},
    {.type = KN_LAYER_CONCATENATE, .name = "cat", .n_inputs = 3, .inputs = {3, 4, 5}},
    {.type = KN_LAYER_DEPTHWISE_CONV2D,
     .name = "dw_c",
     .kernel_size = {3, 3},
     .strides = {2, 2},
     .padding = KN_PAD_SAME},
    {.type = KN_LAYER_BATCH_NORM, .name = "dw_c_bn", .momentum = 0.9f, .epsilon = 1e-3f},
    {.type = KN_LAYER_GLOBAL_AVG_POOL2D, .name = "gap"},
    {.type = KN_LAYER_DENSE, .name = "d1", .units = 16, .use_bias = 1, .activation = KN_ACT_GELU},
    {.type = KN_LAYER_DENSE,
     .name = "d2",
     .units = 12,
     .use_bias = 1,
     .activation = KN_ACT_LEAKY_RELU},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 5, .use_bias = 1},
};

/* A ResNet basic block on (10, 10, 3) inputs, for the winograd pass:
 * a stem convolution over 3 channels (too few: it stays on the GEMM) into
 * batch norm and relu; a 3x3 "same" convolution over 16 channels without
 * bias into batch norm, added to the stem, relu (its forward, input and
 * weight gradients by F(4x4, 3x3), reading the unpadded input); a 5x5
 * "same" convolution over 16 channels with bias and tanh (by F(2x2, 5x5),
 * the bias applied by the Winograd product, the bias gradient summed
 * beside its weight gradient); a "valid" 3x3 convolution over 16 channels
 * with bias and tanh; global average pooling and a dense layer. (A relu
 * after either would put outputs within rounding of zero, where which way
 * it goes is luck: see optimizers_match_torch.py.) */
static const kn_layer_config resblock_layers[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "stem",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_TANH},
    {.type = KN_LAYER_CONV2D,
     .name = "c1",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME},
    {.type = KN_LAYER_BATCH_NORM, .name = "c1_bn", .momentum = 0.9f, .epsilon = 1e-3f},
    {.type = KN_LAYER_ADD, .name = "res", .n_inputs = 2, .inputs = {0, 2}},
    {.type = KN_LAYER_ACTIVATION, .name = "res_relu", .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "c5",
     .filters = 16,
     .kernel_size = {5, 5},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_TANH},
    {.type = KN_LAYER_CONV2D,
     .name = "c2",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_VALID,
     .use_bias = 1,
     .activation = KN_ACT_TANH},
    {.type = KN_LAYER_GLOBAL_AVG_POOL2D, .name = "gap"},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 5, .use_bias = 1},
};

/* A ResNet's downsampling, on (10, 10, 3) inputs: a stem convolution into
 * batch norm and tanh; an identity block over 16 channels (3x3 "same"
 * into batch norm, added to the stem, tanh), whose input gradient by
 * Winograd takes in the add where it meets the shortcut's; then a 3x3
 * stride-2 "same" convolution over those 16 channels with bias and a 1x1
 * stride-2 projection of them, added, tanh: their input gradients summed
 * directly (conv_dx.c, where kiln's GEMM runs), the projection's taking
 * in the add; global average pooling and a dense layer. Smooth
 * activations only (relus here put outputs within rounding of zero). */
static const kn_layer_config downblock_layers[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "stem",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME},
    {.type = KN_LAYER_BATCH_NORM, .name = "stem_bn", .momentum = 0.9f, .epsilon = 1e-3f},
    {.type = KN_LAYER_ACTIVATION, .name = "stem_tanh", .activation = KN_ACT_TANH},
    {.type = KN_LAYER_CONV2D,
     .name = "c1",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME},
    {.type = KN_LAYER_BATCH_NORM, .name = "c1_bn", .momentum = 0.9f, .epsilon = 1e-3f},
    {.type = KN_LAYER_ADD, .name = "res", .n_inputs = 2, .inputs = {2, 4}},
    {.type = KN_LAYER_ACTIVATION, .name = "res_tanh", .activation = KN_ACT_TANH},
    {.type = KN_LAYER_CONV2D,
     .name = "down",
     .filters = 32,
     .kernel_size = {3, 3},
     .strides = {2, 2},
     .padding = KN_PAD_SAME,
     .use_bias = 1},
    {.type = KN_LAYER_CONV2D,
     .name = "proj",
     .filters = 32,
     .kernel_size = {1, 1},
     .strides = {2, 2},
     .padding = KN_PAD_SAME,
     .n_inputs = 1,
     .inputs = {6}},
    {.type = KN_LAYER_ADD, .name = "down_res", .n_inputs = 2, .inputs = {7, 8}},
    {.type = KN_LAYER_ACTIVATION, .name = "down_tanh", .activation = KN_ACT_TANH},
    {.type = KN_LAYER_GLOBAL_AVG_POOL2D, .name = "gap"},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 5, .use_bias = 1},
};

/* Dilated convolutions on (12, 12, 3) inputs, for the winograd pass's
 * phases: a stem over 3 channels (on the GEMM) with tanh; a 3x3 "same"
 * convolution of dilation 2 over 16 channels with bias and tanh, and a
 * "valid" one (the output 8x8), each by Winograd over its four phases
 * (forward, input and weight gradients); global average pooling and a
 * dense layer. Smooth activations only, so no decision sits within
 * rounding of its threshold. */
static const kn_layer_config dilated_layers[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "stem",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_TANH},
    {.type = KN_LAYER_CONV2D,
     .name = "d1",
     .filters = 16,
     .kernel_size = {3, 3},
     .dilation_rate = {2, 2},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_TANH},
    {.type = KN_LAYER_CONV2D,
     .name = "d2",
     .filters = 16,
     .kernel_size = {3, 3},
     .dilation_rate = {2, 2},
     .padding = KN_PAD_VALID,
     .use_bias = 1,
     .activation = KN_ACT_TANH},
    {.type = KN_LAYER_GLOBAL_AVG_POOL2D, .name = "gap"},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 5, .use_bias = 1},
};

/* Hyperparameters the torch side mirrors by name. */
static int optimizer_by_name(const char *name, kn_optimizer_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  if (strcmp(name, "sgd") == 0) {
    *cfg = (kn_optimizer_config){.type = KN_OPT_SGD, .learning_rate = 0.02f};
  } else if (strcmp(name, "sgd_nesterov") == 0) {
    *cfg = (kn_optimizer_config){.type = KN_OPT_SGD,
                                 .learning_rate = 0.02f,
                                 .momentum = 0.9f,
                                 .nesterov = 1,
                                 .weight_decay = 1e-4f};
  } else if (strcmp(name, "adam") == 0) {
    *cfg = (kn_optimizer_config){.type = KN_OPT_ADAM,
                                 .learning_rate = 1e-3f,
                                 .beta1 = 0.9f,
                                 .beta2 = 0.999f,
                                 .epsilon = 1e-5f};
  } else if (strcmp(name, "adamw") == 0) {
    *cfg = (kn_optimizer_config){.type = KN_OPT_ADAMW,
                                 .learning_rate = 1e-3f,
                                 .beta1 = 0.9f,
                                 .beta2 = 0.999f,
                                 .epsilon = 1e-7f,
                                 .weight_decay = 0.01f};
  } else if (strcmp(name, "rmsprop") == 0) {
    *cfg = (kn_optimizer_config){.type = KN_OPT_RMSPROP,
                                 .learning_rate = 3e-4f,
                                 .rho = 0.9f,
                                 .momentum = 0.5f,
                                 .epsilon = 1e-5f};
  } else if (strcmp(name, "adagrad") == 0) {
    *cfg = (kn_optimizer_config){.type = KN_OPT_ADAGRAD,
                                 .learning_rate = 0.01f,
                                 .epsilon = 1e-7f,
                                 .initial_accumulator_value = 0.1f};
  } else {
    return -1;
  }
  return 0;
}

static int write_file(const char *dir, const char *name, const void *data, size_t bytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t wrote = fwrite(data, 1, bytes, f);
  return (fclose(f) == 0 && wrote == bytes) ? 0 : -1;
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(
        stderr,
        "usage: kiln-parity mlp|cnn|branches|resblock|dilated|downblock OPTIMIZER STEPS OUTDIR\n");
    return 2;
  }
  const char *which = argv[1], *dir = argv[4];
  int steps = atoi(argv[3]);
  const int branches = strcmp(which, "branches") == 0, resblock = strcmp(which, "resblock") == 0;
  const int dilated = strcmp(which, "dilated") == 0;
  const int downblock = strcmp(which, "downblock") == 0;
  const int cnn = strcmp(which, "cnn") == 0 || branches || resblock || dilated || downblock;
  kn_optimizer_config oc;
  if ((!cnn && strcmp(which, "mlp") != 0) || optimizer_by_name(argv[2], &oc) || steps < 1) {
    fprintf(stderr, "kiln-parity: bad model '%s', optimizer '%s' or steps '%s'\n", which, argv[2],
            argv[3]);
    return 2;
  }
  kn_model_config mc = {.input_ndim = 3, .batch_size = cnn ? CNN_BATCH : MLP_BATCH};
  if (branches) {
    mc.input_shape[0] = 12;
    mc.input_shape[1] = 12;
    mc.input_shape[2] = 3;
    mc.layers = branches_layers;
    mc.n_layers = (int)(sizeof branches_layers / sizeof branches_layers[0]);
  } else if (dilated) {
    mc.input_shape[0] = 12;
    mc.input_shape[1] = 12;
    mc.input_shape[2] = 3;
    mc.layers = dilated_layers;
    mc.n_layers = (int)(sizeof dilated_layers / sizeof dilated_layers[0]);
  } else if (downblock) {
    mc.input_shape[0] = 10;
    mc.input_shape[1] = 10;
    mc.input_shape[2] = 3;
    mc.layers = downblock_layers;
    mc.n_layers = (int)(sizeof downblock_layers / sizeof downblock_layers[0]);
  } else if (resblock) {
    mc.input_shape[0] = 10;
    mc.input_shape[1] = 10;
    mc.input_shape[2] = 3;
    mc.layers = resblock_layers;
    mc.n_layers = (int)(sizeof resblock_layers / sizeof resblock_layers[0]);
  } else if (cnn) {
    mc.input_shape[0] = 10;
    mc.input_shape[1] = 10;
    mc.input_shape[2] = 3;
    mc.layers = cnn_layers;
    mc.n_layers = (int)(sizeof cnn_layers / sizeof cnn_layers[0]);
  } else {
    mc.input_shape[0] = 28;
    mc.input_shape[1] = 28;
    mc.input_shape[2] = 1;
    mc.layers = mlp_layers;
    mc.n_layers = (int)(sizeof mlp_layers / sizeof mlp_layers[0]);
  }
  char err[1024];
  kn_model m;
  int rc = kn_model_build(&mc, &m, err, sizeof err);
  kn_plan_stats st;
  if (!rc) rc = kn_graph_compile(m.graph, 1234, &st, err, sizeof err);
  if (!rc && st.n_winograd) fprintf(stderr, "%s: %d products by Winograd\n", which, st.n_winograd);
  kn_optimizer *opt = NULL;
  if (!rc) rc = kn_optimizer_new(&oc, kn_param_count(m.graph), &opt, err, sizeof err);
  char path[4096];
  snprintf(path, sizeof path, "%s/init.safetensors", dir);
  if (!rc) rc = kn_checkpoint_write(m.graph, path, 0, NULL, NULL, NULL, err, sizeof err);
  if (rc) {
    fprintf(stderr, "kiln-parity: %s\n", err);
    return 1;
  }
  const int batch = mc.batch_size, classes = cnn ? 5 : 10;
  const size_t ex = m.example_size;
  const size_t batches = (size_t)steps + 1; /* the last one evaluated */
  float *xs = malloc(batches * batch * ex * sizeof *xs);
  int32_t *ys = malloc(batches * batch * sizeof *ys);
  double *losses = malloc((size_t)steps * sizeof *losses);
  float *logits = malloc((size_t)batch * classes * sizeof *logits);
  kn_rng rng;
  kn_rng_seed(&rng, 99);
  /* the training batches' images, their labels, then the evaluated batch's */
  for (size_t i = 0; i < (size_t)steps * batch * ex; i++) xs[i] = kn_rng_uniform(&rng);
  for (size_t i = 0; i < (size_t)steps * batch; i++) ys[i] = (int32_t)kn_rng_below(&rng, classes);
  for (size_t i = (size_t)steps * batch * ex; i < batches * batch * ex; i++)
    xs[i] = kn_rng_uniform(&rng);
  for (size_t i = (size_t)steps * batch; i < batches * batch; i++)
    ys[i] = (int32_t)kn_rng_below(&rng, classes);
  for (int s = 0; s < steps && !rc; s++) {
    memcpy(kn_node_data(m.graph, m.x), xs + (size_t)s * batch * ex, batch * ex * sizeof *xs);
    memcpy(kn_node_data(m.graph, m.y), ys + (size_t)s * batch, batch * sizeof *ys);
    rc = kn_graph_run(m.graph, KN_RUN_TRAIN, batch, err, sizeof err);
    if (rc) break;
    losses[s] = *(float *)kn_node_data(m.graph, m.loss);
    kn_optimizer_step(opt, kn_params(m.graph), kn_grads(m.graph));
  }
  snprintf(path, sizeof path, "%s/final.safetensors", dir);
  if (!rc) rc = kn_checkpoint_write(m.graph, path, 0, NULL, NULL, NULL, err, sizeof err);
  if (!rc) {
    memcpy(kn_node_data(m.graph, m.x), xs + (size_t)steps * batch * ex, batch * ex * sizeof *xs);
    rc = kn_graph_run(m.graph, KN_RUN_FORWARD, batch, err, sizeof err);
    if (!rc)
      memcpy(logits, kn_node_data(m.graph, m.logits), (size_t)batch * classes * sizeof *logits);
  }
  if (!rc && (write_file(dir, "x.bin", xs, batches * batch * ex * sizeof *xs) ||
              write_file(dir, "y.bin", ys, batches * batch * sizeof *ys) ||
              write_file(dir, "eval.bin", logits, (size_t)batch * classes * sizeof *logits))) {
    snprintf(err, sizeof err, "cannot write the batches to %s", dir);
    rc = 1;
  }
  if (!rc) {
    snprintf(path, sizeof path, "%s/losses.txt", dir);
    FILE *f = fopen(path, "w");
    for (int s = 0; f && s < steps; s++) fprintf(f, "%.9g\n", losses[s]);
    if (!f || fclose(f) != 0) {
      snprintf(err, sizeof err, "cannot write losses.txt in %s", dir);
      rc = 1;
    }
  }
  if (rc) fprintf(stderr, "kiln-parity: %s\n", err);
  free(xs);
  free(ys);
  free(losses);
  free(logits);
  kn_optimizer_free(opt);
  kn_model_free(&m);
  return rc ? 1 : 0;
}
