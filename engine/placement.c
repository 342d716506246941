/* placement.c — where each node's kernel runs. Every node carries a device
 * (cpu or cuda:N, kn_node_set_device); compile checks that each placement
 * can run here, and the executor hands a node placed on a GPU to the CUDA
 * backend (engine/cuda). Values stay in the graph's host arena: a CUDA
 * kernel copies its operands to its device and its result back, so nodes
 * on different devices read each other's outputs as they are. */
#include <stdio.h>
#include <string.h>

#include "cuda/cuda.h"
#include "graph_internal.h"

int kn_graph_places_on_gpu(const kn_graph *g) {
  for (int i = 0; i < g->n_nodes; i++)
    if (!g->nodes[i].dead && g->nodes[i].device.kind != KN_DEVICE_CPU) return 1;
  return 0;
}

/* Ops whose value needs no kernel: data fed or held in the flat buffers,
 * and views. They live in host memory on any device. */
static int storage_only(kn_op op) {
  return kn_op_has(op, KN_OPF_FED | KN_OPF_FLAT | KN_OPF_VIEW);
}

/* A copy between host buffers (a gradient into its parameter's slot) runs
 * on the host wherever it is placed: no value lives on a device. */
static int host_copy(kn_op op) {
  return kn_op_has(op, KN_OPF_HOST_COPY);
}

/* Whether the CUDA backend has a kernel of its own for node n (its op
 * table record names one; float32 only). */
static int cuda_kernel(const kn_graph *g, const kn_node_rec *n) {
  if (n->dtype != KN_F32) return 0;
  for (int k = 0; k < n->n_inputs; k++)
    if (g->nodes[n->inputs[k]].dtype != KN_F32) return 0;
  return kn_op_def_of(n->op)->cuda != NULL;
}

/* Whether node n can be placed on a GPU as it stands: a kernel there, or
 * no kernel needed (storage), or a copy the host makes. */
static int cuda_runs(const kn_graph *g, const kn_node_rec *n) {
  return storage_only(n->op) || (n->dtype == KN_F32 && host_copy(n->op)) || cuda_kernel(g, n);
}

int kn_graph_place_soft(kn_graph *g, kn_device d) {
  int moved = 0;
  if (g->f64 || g->precision != KN_PRECISION_FLOAT32 || g->unoptimized) return 0;
  for (int i = 0; i < g->n_nodes; i++) {
    kn_node_rec *n = &g->nodes[i];
    if (n->dead || !cuda_kernel(g, n)) continue;
    if (kn_node_set_device(g, i, d) != KN_OK) return moved;
    moved++;
  }
  return moved;
}

int kn_graph_gpu(const kn_graph *g) {
  int gpu = -1;
  for (int i = 0; i < g->n_nodes; i++) {
    const kn_node_rec *n = &g->nodes[i];
    if (!n->dead && n->device.kind == KN_DEVICE_CUDA && (gpu < 0 || n->device.index < gpu))
      gpu = n->device.index;
  }
  return gpu;
}

int kn_check_placement(kn_graph *g) {
  if (!kn_graph_places_on_gpu(g)) return KN_OK;
  char where[32];
  int devices = 0;
  char cerr[256] = "";
  const int counted = kn_cuda_device_count(&devices, cerr, sizeof cerr) == 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const kn_node_rec *n = &g->nodes[i];
    if (n->dead || n->device.kind == KN_DEVICE_CPU) continue;
    kn_device_format(n->device, where, sizeof where);
    if (g->f64 || g->precision != KN_PRECISION_FLOAT32 || g->unoptimized) {
      kn_graph_fail(g, KN_EINVAL,
                    "compile: node '%s' is placed on %s; a graph with nodes on a GPU runs in "
                    "float32, with the optimized plan (not %s)",
                    n->name, where,
                    g->f64           ? "the float64 reference mode"
                    : g->unoptimized ? "the unoptimized plan"
                                     : kn_precision_name(g->precision));
      return KN_EINVAL;
    }
    if (!cuda_runs(g, n)) {
      kn_graph_fail(g, KN_EINVAL,
                    "compile: node '%s' (%s) is placed on %s, but kiln's CUDA backend has no "
                    "kernel for it (it runs float32 matmul, relu and relu's gradient; copies run "
                    "on the host); place it on cpu",
                    n->name, kn_op_name(n->op), where);
      return KN_EINVAL;
    }
    if (!counted) {
      kn_graph_fail(g, KN_EINVAL, "compile: node '%s' is placed on %s: %s", n->name, where, cerr);
      return KN_EINVAL;
    }
    if (n->device.index >= devices) {
      kn_graph_fail(g, KN_EINVAL,
                    "compile: node '%s' is placed on %s, but this machine has %d CUDA device%s",
                    n->name, where, devices, devices == 1 ? "" : "s");
      return KN_EINVAL;
    }
  }
  return KN_OK;
}

int kn_cuda_run_node(kn_graph *g, int i, char *err, size_t errlen) {
  kn_node_rec *n = &g->nodes[i];
  if (storage_only(n->op)) return KN_OK;
  if (host_copy(n->op)) return kn_cpu_run_node(g, i, err, errlen);
  const kn_kernel_fn kernel = kn_op_def_of(n->op)->cuda;
  if (!kernel) {
    snprintf(err, errlen, "run: node '%s' (%s) has no CUDA kernel", n->name, kn_op_name(n->op));
    return KN_EINVAL;
  }
  if (kn_cuda_set_device(n->device.index, err, errlen) != 0) return KN_EIO;
  return kernel(g, n, err, errlen);
}
