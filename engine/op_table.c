/* op_table.c — one record per op (op_table.h): everything the engine knows
 * about an op apart from its builder and its kernels' code. Passes, the
 * planner, placement and the profiler ask this table; none keeps its own
 * list of ops. */
#include "graph_internal.h"

/* The inputs an in-place op may overwrite: any of them with the output's
 * size and type (the planner checks both). */
#define ANY_INPUT 0xfu

const kn_op_def kn_op_defs[KN_OP_COUNT] = {
    [KN_OP_INPUT] = {"input", 0, 0, KN_OPF_IMPURE | KN_OPF_FED | KN_OPF_NO_KERNEL, 0, kn_grad_none},
    [KN_OP_PARAM] = {"param", 0, 0, KN_OPF_IMPURE | KN_OPF_FLAT | KN_OPF_NO_KERNEL, 0,
                     kn_grad_none},
    [KN_OP_STATE] = {"state", 0, 0, KN_OPF_IMPURE | KN_OPF_FLAT | KN_OPF_NO_KERNEL, 0,
                     kn_grad_none},
    [KN_OP_FILL] = {"fill", 0, 0, 0, 0, kn_grad_none},
    [KN_OP_RESHAPE] = {"reshape", 1, 1, KN_OPF_VIEW | KN_OPF_NO_KERNEL, 0, kn_grad_reshape},
    [KN_OP_COPY] = {"copy", 1, 1, KN_OPF_IMPURE | KN_OPF_HOST_COPY, 0, NULL},
    /* in place: only an f32 -> f32 rounding has its input's size */
    [KN_OP_CAST] = {"cast", 1, 1, 0, ANY_INPUT, kn_grad_cast},
    /* products: a pool's gradient read as B makes a third input */
    [KN_OP_MATMUL] = {"matmul", 2, 3, KN_OPF_GEMM, 0, kn_grad_matmul},
    [KN_OP_MATMUL_BIAS_ACT] = {"matmul_bias_act", 3, 3, KN_OPF_GEMM, 0, NULL},
    [KN_OP_CONV_INPUT_GRAD] = {"conv_input_grad", 2, 2, KN_OPF_GEMM, 0, NULL},
    /* elementwise */
    [KN_OP_BIAS_ADD] = {"bias_add", 2, 2, KN_OPF_RELU_EPILOGUE, ANY_INPUT, kn_grad_bias_add},
    [KN_OP_ADD] = {"add", 2, 2, KN_OPF_RELU_EPILOGUE, ANY_INPUT, kn_grad_add},
    [KN_OP_BINARY] = {"binary", 2, 2, KN_OPF_RELU_EPILOGUE, ANY_INPUT, kn_grad_binary},
    [KN_OP_RELU] = {"relu", 1, 1, 0, ANY_INPUT, kn_grad_relu},
    [KN_OP_RELU_GRAD] = {"relu_grad", 2, 2, 0, ANY_INPUT, NULL},
    [KN_OP_UNARY] = {"unary", 1, 1, 0, ANY_INPUT, kn_grad_unary},
    [KN_OP_UNARY_GRAD] = {"unary_grad", 3, 3, 0, ANY_INPUT, NULL},
    [KN_OP_SUM_TO] = {"sum_to", 2, 2, 0, 0, kn_grad_sum_to},
    [KN_OP_DROPOUT_MASK] = {"dropout_mask", 0, 0, KN_OPF_IMPURE, 0,
                            kn_grad_none}, /* changes every step */
    /* softmax and losses */
    [KN_OP_SOFTMAX] = {"softmax", 1, 1, 0, 0, kn_grad_softmax},
    [KN_OP_SOFTMAX_GRAD] = {"softmax_grad", 2, 2, 0, 0, NULL},
    [KN_OP_LOG_SOFTMAX] = {"log_softmax", 1, 1, 0, 0, kn_grad_log_softmax},
    [KN_OP_LOG_SOFTMAX_GRAD] = {"log_softmax_grad", 2, 2, 0, 0, NULL},
    [KN_OP_SOFTMAX_XENT] = {"softmax_xent", 2, 2, 0, 0, kn_grad_softmax_xent},
    [KN_OP_SOFTMAX_XENT_GRAD] = {"softmax_xent_grad", 3, 3, 0, 0, NULL},
    [KN_OP_XENT_DENSE] = {"xent_dense", 2, 2, 0, 0, kn_grad_xent_dense},
    [KN_OP_XENT_DENSE_GRAD] = {"xent_dense_grad", 3, 3, 0, 0, NULL},
    [KN_OP_BCE_LOGITS] = {"bce_logits", 2, 2, 0, 0, kn_grad_bce_logits},
    [KN_OP_BCE_LOGITS_GRAD] = {"bce_logits_grad", 3, 3, 0, 0, NULL},
    [KN_OP_TOPK_ACCURACY] = {"top_k_accuracy", 2, 2, 0, 0, kn_grad_none},
    /* reductions and layout */
    [KN_OP_REDUCE_ROWS] = {"reduce_rows", 1, 1, 0, 0, NULL},
    [KN_OP_REDUCE] = {"reduce", 1, 1, 0, 0, kn_grad_reduce},
    [KN_OP_REDUCE_GRAD] = {"reduce_grad", 3, 3, 0, 0, NULL},
    [KN_OP_TRANSPOSE] = {"transpose", 1, 1, 0, 0, kn_grad_transpose},
    [KN_OP_CONCAT] = {"concat", 2, 2, 0, 0, kn_grad_concat},
    [KN_OP_SLICE] = {"slice", 1, 1, 0, 0, kn_grad_slice},
    /* convolution and pooling */
    [KN_OP_IM2COL] = {"im2col", 1, 1, KN_OPF_RECOMPUTE, 0, kn_grad_im2col},
    [KN_OP_COL2IM] = {"col2im", 1, 1, 0, 0, NULL},
    [KN_OP_CONV_PAD] = {"conv_pad", 1, 1, 0, 0, NULL},
    [KN_OP_DWCONV] = {"depthwise_conv2d", 2, 2, 0, 0, kn_grad_dwconv},
    [KN_OP_DWCONV_DX] = {"depthwise_conv2d_dx", 2, 2, 0, 0, NULL},
    [KN_OP_DWCONV_DW] = {"depthwise_conv2d_dw", 2, 2, 0, 0, NULL},
    [KN_OP_POOL] = {"pool", 1, 1, KN_OPF_RECOMPUTE, 0, kn_grad_pool},
    /* (dy, x, y), or (dy, the argmax bytes) once the pool records them */
    [KN_OP_POOL_GRAD] = {"pool_grad", 2, 3, 0, 0, NULL},
    [KN_OP_POOL_ARGMAX] = {"pool_argmax", 0, 0, KN_OPF_NO_KERNEL, 0, NULL}, /* its pool writes it */
    /* batch norm */
    [KN_OP_BN_STATS] = {"bn_stats", 3, 3, KN_OPF_IMPURE, 0,
                        kn_grad_none}, /* moves the moving statistics */
    [KN_OP_BN_APPLY] = {"bn_apply", 4, 4, KN_OPF_RELU_EPILOGUE, ANY_INPUT, kn_grad_bn_apply},
    [KN_OP_BN_GRAD_X] = {"bn_grad_x", 4, 4, 0, 0, NULL},
    [KN_OP_BN_GRAD_GAMMA] = {"bn_grad_gamma", 3, 3, 0, 0, NULL},
};

const char *kn_op_name(int op) {
  return op >= 0 && op < KN_OP_COUNT && kn_op_defs[op].name ? kn_op_defs[op].name : "op";
}
