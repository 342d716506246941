/* backend_cuda.c — the CUDA backend (backend.h) over the CUDA module
 * (cuda/cuda.h): its kernels, as the op table names them (op_table.c),
 * each running one node on its device over the buffers the graph keeps
 * there (residency.c: the executor has copied in any input that was
 * elsewhere). Values fed, held or viewed need no kernel, and a copy
 * between host buffers runs on the host. */
#include <stdio.h>

#include "backend.h"
#include "cuda/cuda.h"

/* Node v's buffer on the device n runs on. */
static void *on(kn_graph *g, const kn_node_rec *n, int v) {
  return kn_device_data(g, v, n->device.index);
}

int kn_cuda_kernel_matmul(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  int m, cols, k;
  kn_matmul_dims(g, n, &m, &cols, &k);
  return kn_cuda_dev_matmul(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                            on(g, n, (int)(n - g->nodes)), m, cols, k, n->attr.matmul.trans_a,
                            n->attr.matmul.trans_b, err, errlen)
             ? KN_EIO
             : KN_OK;
}

int kn_cuda_kernel_relu(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return kn_cuda_dev_relu(on(g, n, n->inputs[0]), on(g, n, (int)(n - g->nodes)),
                          kn_node_elems(n, g->batch), err, errlen)
             ? KN_EIO
             : KN_OK;
}

int kn_cuda_kernel_relu_grad(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return kn_cuda_dev_relu_grad(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                               on(g, n, (int)(n - g->nodes)), kn_node_elems(n, g->batch), err,
                               errlen)
             ? KN_EIO
             : KN_OK;
}

/* y = x + b over rows of b's length (a dense layer's bias), then relu
 * where a pass fused it. */
int kn_cuda_kernel_bias_add(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  const size_t cols = kn_node_elems(&g->nodes[n->inputs[1]], 0);
  return kn_cuda_dev_bias_add(on(g, n, n->inputs[0]), on(g, n, n->inputs[1]),
                              on(g, n, (int)(n - g->nodes)), kn_node_elems(n, g->batch) / cols,
                              cols, n->fused_relu != 0, err, errlen)
             ? KN_EIO
             : KN_OK;
}

/* out[c] = the sum of column c of x's rows (a bias's gradient). */
int kn_cuda_kernel_reduce_rows(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  const size_t cols = kn_node_elems(n, 0);
  return kn_cuda_dev_reduce_rows(on(g, n, n->inputs[0]), on(g, n, (int)(n - g->nodes)),
                                 kn_node_elems(&g->nodes[n->inputs[0]], g->batch) / cols, cols, err,
                                 errlen)
             ? KN_EIO
             : KN_OK;
}

/* The value of its input, within the device. */
int kn_cuda_kernel_copy(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  return kn_cuda_dev_copy(on(g, n, (int)(n - g->nodes)), on(g, n, n->inputs[0]),
                          kn_node_elems(n, g->batch) * sizeof(float), err, errlen)
             ? KN_EIO
             : KN_OK;
}

/* Ops whose value needs no kernel: data fed or held in the flat buffers,
 * and views. They live in host memory on any device. */
static int storage_only(kn_op op) {
  return kn_op_has(op, KN_OPF_FED | KN_OPF_FLAT | KN_OPF_VIEW);
}

/* The op's CUDA kernel where n and its inputs are float32. */
static kn_kernel_fn cuda_kernel(const kn_graph *g, const kn_node_rec *n) {
  /* f32, and as built: a pass's pairing of a bias gradient with its GEMM
   * (which passes leave alone on GPU graphs) is the CPU's */
  if (n->dtype != KN_F32 || n->gemm_pair) return NULL;
  for (int k = 0; k < n->n_inputs; k++)
    if (g->nodes[n->inputs[k]].dtype != KN_F32) return NULL;
  return kn_op_def_of(n->op)->cuda;
}

/* A kernel there, or no kernel needed (storage), or a copy the host makes
 * (a gradient into its parameter's slot: no value lives on a device). */
static int cuda_supports(const kn_graph *g, const kn_node_rec *n) {
  return storage_only(n->op) || (n->dtype == KN_F32 && kn_op_has(n->op, KN_OPF_HOST_COPY)) ||
         cuda_kernel(g, n);
}

static void *cuda_alloc(int device, size_t bytes, char *err, size_t errlen) {
  void *p = NULL;
  return kn_cuda_alloc(device, bytes, &p, err, errlen) == 0 ? p : NULL;
}

static int cuda_run(kn_graph *g, int i, char *err, size_t errlen) {
  kn_node_rec *n = &g->nodes[i];
  if (storage_only(n->op)) return KN_OK;
  /* a copy into a gradient's slot: within the device, where both are */
  const kn_kernel_fn kernel =
      kn_op_has(n->op, KN_OPF_HOST_COPY) ? kn_cuda_kernel_copy : kn_op_def_of(n->op)->cuda;
  if (!kernel) {
    snprintf(err, errlen, "run: node '%s' (%s) has no CUDA kernel", n->name, kn_op_name(n->op));
    return KN_EINVAL;
  }
  if (kn_cuda_set_device(n->device.index, err, errlen) != 0) return KN_EIO;
  return kernel(g, n, err, errlen);
}

const kn_backend kn_backend_cuda = {
    .name = "cuda",
    .device_count = kn_cuda_device_count,
    .kernel = cuda_kernel,
    .supports = cuda_supports,
    .alloc = cuda_alloc,
    .free = kn_cuda_free,
    .copy_in = kn_cuda_copy_in,
    .copy_out = kn_cuda_copy_out,
    .run = cuda_run,
};
