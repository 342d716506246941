/* backend.h — private to the engine: what a device kind offers the engine,
 * as a small table of functions (kn_backend). The CPU backend (cpu.c) and
 * the CUDA backend (backend_cuda.c, over the CUDA module cuda/cuda.h)
 * implement it; placement asks a node's backend whether it can run the
 * node, and the executor hands it the node. Values live in the graph's
 * host arena, and the values of nodes whose kernels run on a GPU in
 * buffers there too (residency.c), copied across only where a reader
 * elsewhere needs them. */
#ifndef KILN_ENGINE_BACKEND_H
#define KILN_ENGINE_BACKEND_H

#include "graph_internal.h"

typedef struct kn_backend {
  const char *name; /* "cpu", "cuda" */
  /* Devices of this kind here: the CPU is one; 0 (and 0 returned) where
   * there are none. -1 with a sentence in err on a failure. */
  int (*device_count)(int *count, char *err, size_t errlen);
  /* Its kernel for node n of g, by n's op and the types it reads and
   * writes; NULL when it has none. */
  kn_kernel_fn (*kernel)(const kn_graph *g, const kn_node_rec *n);
  /* Whether it can run n as placed: a kernel of its own, or none needed
   * (a value fed, held or viewed; a copy the host makes). */
  int (*supports)(const kn_graph *g, const kn_node_rec *n);
  /* bytes of device memory on `device`, or NULL with a sentence in err;
   * free(device, NULL) is a no-op. */
  void *(*alloc)(int device, size_t bytes, char *err, size_t errlen);
  void (*free)(int device, void *p);
  /* bytes from host memory into the device's (copy_in) or back (copy_out);
   * 0, or -1 with a sentence in err. */
  int (*copy_in)(int device, void *dst, const void *host, size_t bytes, char *err, size_t errlen);
  int (*copy_out)(int device, void *host, const void *src, size_t bytes, char *err, size_t errlen);
  /* Runs node i of g for the graph's current batch: KN_OK or an error
   * code with a sentence in err. */
  int (*run)(kn_graph *g, int i, char *err, size_t errlen);
} kn_backend;

extern const kn_backend kn_backend_cpu;  /* cpu.c */
extern const kn_backend kn_backend_cuda; /* backend_cuda.c */

/* Whether node n runs a kernel of its device's backend: not a value fed,
 * held in the flat buffers or viewed. (A copy into a gradient's slot runs
 * where it is placed: on a GPU, from its buffer there.) */
static inline int kn_runs_device_kernel(const kn_node_rec *n) {
  return !kn_op_has(n->op, KN_OPF_FED | KN_OPF_FLAT | KN_OPF_VIEW);
}

/* The backend of a device kind. */
static inline const kn_backend *kn_backend_of(kn_device d) {
  return d.kind == KN_DEVICE_CUDA ? &kn_backend_cuda : &kn_backend_cpu;
}

#endif
