/* layer_kinds.c — three small models that between them use every layer
 * kind the model builder accepts, on (8, 8, 3) inputs: shared by the tests
 * that must cover every layer (graph building, the op table's shape
 * rules). */
#include "layer_kinds.h"

/* Convolutions (plain, depthwise, separable), batch norm, a residual add,
 * a concatenation, both pools, activations, dropout, flatten and dense. */
const kn_layer_config kn_test_branches[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "conv",
     .filters = 4,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_BATCH_NORM, .name = "bn"},
    {.type = KN_LAYER_DEPTHWISE_CONV2D,
     .name = "dw",
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .depth_multiplier = 2,
     .use_bias = 1,
     .activation = KN_ACT_ELU},
    {.type = KN_LAYER_SEPARABLE_CONV2D,
     .name = "sep",
     .filters = 4,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_GELU},
    {.type = KN_LAYER_ADD, .name = "residual", .n_inputs = 2, .inputs = {1, 3}},
    {.type = KN_LAYER_CONCATENATE, .name = "concat", .n_inputs = 2, .inputs = {4, 0}},
    {.type = KN_LAYER_MAX_POOL2D, .name = "max_pool"},
    {.type = KN_LAYER_ACTIVATION, .name = "tanh", .activation = KN_ACT_TANH},
    {.type = KN_LAYER_AVG_POOL2D, .name = "avg_pool"},
    {.type = KN_LAYER_DROPOUT, .name = "dropout", .rate = 0.25f},
    {.type = KN_LAYER_FLATTEN, .name = "flatten"},
    {.type = KN_LAYER_DENSE,
     .name = "hidden",
     .units = 16,
     .use_bias = 1,
     .activation = KN_ACT_SIGMOID},
    {.type = KN_LAYER_DENSE,
     .name = "out",
     .units = 10,
     .use_bias = 1,
     .activation = KN_ACT_SOFTMAX},
};

/* pool -> flatten -> dense, beside a global average pool of the same
 * convolution, summed. */
const kn_layer_config kn_test_pooled[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "conv",
     .filters = 6,
     .kernel_size = {3, 3},
     .use_bias = 1,
     .activation = KN_ACT_LEAKY_RELU},
    {.type = KN_LAYER_MAX_POOL2D, .name = "pool"},
    {.type = KN_LAYER_FLATTEN, .name = "flatten"},
    {.type = KN_LAYER_DENSE, .name = "dense", .units = 6, .use_bias = 1, .activation = KN_ACT_RELU},
    {.type = KN_LAYER_GLOBAL_AVG_POOL2D, .name = "gap", .n_inputs = 1, .inputs = {0}},
    {.type = KN_LAYER_ADD, .name = "sum", .n_inputs = 2, .inputs = {3, 4}},
    {.type = KN_LAYER_ACTIVATION, .name = "softmax", .activation = KN_ACT_SOFTMAX},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 4, .use_bias = 1},
};

/* The logits are a view: the last layer is flatten. */
const kn_layer_config kn_test_flatten_last[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "conv",
     .filters = 4,
     .kernel_size = {3, 3},
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_MAX_POOL2D, .name = "max_pool"},
    {.type = KN_LAYER_AVG_POOL2D, .name = "avg_pool", .pool_size = {3, 3}},
    {.type = KN_LAYER_CONV2D, .name = "head", .filters = 5, .kernel_size = {1, 1}, .use_bias = 1},
    {.type = KN_LAYER_FLATTEN, .name = "flatten"},
};

const kn_test_model kn_test_models[KN_TEST_MODELS] = {
    {"branches", kn_test_branches, (int)(sizeof kn_test_branches / sizeof kn_test_branches[0])},
    {"pooled", kn_test_pooled, (int)(sizeof kn_test_pooled / sizeof kn_test_pooled[0])},
    {"flatten_last", kn_test_flatten_last,
     (int)(sizeof kn_test_flatten_last / sizeof kn_test_flatten_last[0])},
};
