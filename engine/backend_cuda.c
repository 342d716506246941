/* backend_cuda.c — the CUDA backend's kernels, as the op table names them
 * (op_table.c): each runs one node through the CUDA module (cuda/cuda.h)
 * on the current device, copying its host operands there and its result
 * back. */
#include "cuda/cuda.h"
#include "graph_internal.h"

int kn_cuda_kernel_matmul(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  int m, cols, k;
  kn_matmul_dims(g, n, &m, &cols, &k);
  return kn_cuda_matmul(g->nodes[n->inputs[0]].data, g->nodes[n->inputs[1]].data, n->data, m, cols,
                        k, n->attr.matmul.trans_a, n->attr.matmul.trans_b, err, errlen)
             ? KN_EIO
             : KN_OK;
}

int kn_cuda_kernel_relu(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return kn_cuda_relu(g->nodes[n->inputs[0]].data, n->data, kn_node_elems(n, g->batch), err, errlen)
             ? KN_EIO
             : KN_OK;
}

int kn_cuda_kernel_relu_grad(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return kn_cuda_relu_grad(g->nodes[n->inputs[0]].data, g->nodes[n->inputs[1]].data, n->data,
                           kn_node_elems(n, g->batch), err, errlen)
             ? KN_EIO
             : KN_OK;
}
