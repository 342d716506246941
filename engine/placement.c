/* placement.c — where each node's kernel runs. Every node carries a device
 * (cpu or cuda:N, kn_node_set_device); compile checks that each placement
 * can run here, asking the backend of its device (backend.h), and the
 * executor hands the node to that backend. A CUDA kernel's value stays on
 * its device (residency.c) and is copied across where a reader elsewhere
 * needs it. */

#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "cuda/cuda.h"

int kn_graph_places_on_gpu(const kn_graph *g) {
  for (int i = 0; i < g->n_nodes; i++)
    if (!g->nodes[i].dead && g->nodes[i].device.kind != KN_DEVICE_CPU) return 1;
  return 0;
}

/* The host buffers a GPU kernel copies its operands from and its result
 * to, pinned: CUDA then copies them by DMA, where pageable memory goes
 * through a staging buffer at a fraction of the speed. */
void kn_pin_for_gpu(kn_graph *g, size_t arena_bytes, size_t param_bytes) {
  if (!kn_graph_places_on_gpu(g)) return;
  void *const bufs[3] = {g->arena, g->param_buf, g->grad_buf};
  const size_t bytes[3] = {arena_bytes, param_bytes, param_bytes};
  for (int b = 0; b < 3; b++) {
    char err[256];
    if (bufs[b] && bytes[b] && kn_cuda_host_register(bufs[b], bytes[b], err, sizeof err) == 0)
      g->pinned |= 1u << b;
  }
}

void kn_unpin_for_gpu(kn_graph *g) {
  void *const bufs[3] = {g->arena, g->param_buf, g->grad_buf};
  for (int b = 0; b < 3; b++)
    if (g->pinned & (1u << b)) kn_cuda_host_unregister(bufs[b]);
  g->pinned = 0;
}

/* Whether g's numerics run on a GPU: float32 or mixed precision (bf16 or
 * f16 GEMMs and casts), with the optimized plan, not the float64
 * reference. */
static int gpu_numerics(const kn_graph *g) {
  return !g->f64 && !g->unoptimized;
}

int kn_graph_place_soft(kn_graph *g, kn_device d) {
  int moved = 0;
  if (!gpu_numerics(g)) return 0;
  for (int i = 0; i < g->n_nodes; i++) {
    kn_node_rec *n = &g->nodes[i];
    if (n->dead || !kn_backend_of(d)->kernel(g, n)) continue;
    if (kn_node_set_device(g, i, d) != KN_OK) return moved;
    moved++;
  }
  return moved;
}

int kn_graph_place_fallback(kn_graph *g) {
  const kn_device host = {KN_DEVICE_CPU, 0};
  const int gpu_ok = gpu_numerics(g);
  int stay = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    kn_node_rec *n = &g->nodes[i];
    if (n->dead || n->device.kind == KN_DEVICE_CPU) continue;
    if (gpu_ok && kn_backend_of(n->device)->kernel(g, n)) {
      stay++;
    } else if (kn_node_set_device(g, i, host) != KN_OK) {
      return stay;
    }
  }
  return stay;
}

int kn_graph_gpu_last(const kn_graph *g) {
  int gpu = -1;
  for (int i = 0; i < g->n_nodes; i++) {
    const kn_node_rec *n = &g->nodes[i];
    if (!n->dead && n->device.kind == KN_DEVICE_CUDA && n->device.index > gpu)
      gpu = n->device.index;
  }
  return gpu;
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

/* A node with a kernel that runs on the host. */
static int on_host(const kn_node_rec *n) {
  return !n->dead && !kn_op_has(n->op, KN_OPF_NO_KERNEL) && n->device.kind == KN_DEVICE_CPU;
}

void kn_graph_placement_summary(const kn_graph *g, int *on_gpu, int *with_kernel, char *host_ops,
                                size_t len) {
  *on_gpu = *with_kernel = 0;
  if (len) host_ops[0] = '\0';
  size_t used = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const kn_node_rec *n = &g->nodes[i];
    if (n->dead || kn_op_has(n->op, KN_OPF_NO_KERNEL)) continue;
    ++*with_kernel;
    if (!on_host(n)) {
      ++*on_gpu;
      continue;
    }
    int listed = 0;
    for (int j = 0; j < i && !listed; j++)
      listed = on_host(&g->nodes[j]) && g->nodes[j].op == n->op;
    if (!listed && used < len) {
      const int w =
          snprintf(host_ops + used, len - used, "%s%s", used ? ", " : "", kn_op_name(n->op));
      used += w > 0 ? (size_t)w : 0;
    }
  }
}

int kn_check_placement(kn_graph *g) {
  if (!kn_graph_places_on_gpu(g)) return KN_OK;
  char where[32];
  int devices = 0;
  char cerr[256] = "";
  const kn_backend *counted_for = NULL;
  int counted = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const kn_node_rec *n = &g->nodes[i];
    if (n->dead || n->device.kind == KN_DEVICE_CPU) continue;
    const kn_backend *be = kn_backend_of(n->device);
    kn_device_format(n->device, where, sizeof where);
    if (!gpu_numerics(g)) {
      kn_graph_fail(g, KN_EINVAL,
                    "compile: node '%s' is placed on %s; a graph with nodes on a GPU runs "
                    "with the optimized plan (not %s)",
                    n->name, where, g->f64 ? "the float64 reference mode" : "the unoptimized plan");
      return KN_EINVAL;
    }
    if (!be->supports(g, n)) {
      kn_graph_fail(g, KN_EINVAL,
                    "compile: node '%s' (%s) is placed on %s, but kiln's CUDA backend has no "
                    "kernel for it (as placed: its types, its inputs' shapes, a pass's "
                    "rewrite); place it on cpu",
                    n->name, kn_op_name(n->op), where);
      return KN_EINVAL;
    }
    if (counted_for != be) { /* asked once per backend */
      counted_for = be;
      devices = 0;
      cerr[0] = '\0';
      counted = be->device_count(&devices, cerr, sizeof cerr) == 0;
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
