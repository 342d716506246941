/* residency.c — values on GPUs. A node whose kernel runs on cuda:d writes
 * its value on that device and reads its inputs there; nothing is copied
 * between two kernels on one device, and a view is where its input is. A
 * value crosses only where a reader needs it elsewhere: to the host for a
 * CPU kernel, for the flat gradient buffer where the optimizer or
 * gradient hooks read it on the host (at once where hooks read it, else
 * when kn_grads asks), or for a caller's kn_node_data; to a device from
 * the host (the batch; the parameters once a run, unless the optimizer
 * stepped on that device and they stayed there) or, through the host,
 * from another device (no peer copies yet).
 *
 * Each device holds the host's layout: the planned activations arena
 * (the same offsets, so the planner's reuse holds there too: values live
 * at once never share memory) and the flat parameter, gradient and state
 * buffers, each allocated at compile on a device whose kernels read or
 * write a value in it. A node's copy on cuda:d lies at its host offset in
 * that device's buffer. Per node, where[i] says which copies hold its
 * current value: bit 0 the host's, bit 1 + d device d's. Each run starts
 * with every value on the host: the caller fed the batch there, and the
 * optimizer updated the parameters there. */
#include <stdio.h>
#include <stdlib.h>

#include "backend.h"
#include "cuda/cuda.h"

#define HOST         1u
#define ON_DEVICE(d) (2u << (d))

/* The host buffers a value lies in (views and parts lie in their
 * storage's), and their sizes in bytes. */
static void host_buffers(const kn_graph *g, unsigned char *base[KN_DEVICE_BUFFERS],
                         size_t bytes[KN_DEVICE_BUFFERS]) {
  const size_t esize = kn_graph_elem_size(g, KN_F32);
  base[0] = g->arena;
  base[1] = (unsigned char *)g->param_buf;
  base[2] = (unsigned char *)g->grad_buf;
  base[3] = (unsigned char *)g->state_buf;
  bytes[0] = g->arena_bytes;
  bytes[1] = bytes[2] = g->n_param_floats * esize;
  bytes[3] = g->n_state_floats * esize;
}

/* Which host buffer holds node v's value, and where in it; -1 for none. */
static int buffer_of(const kn_graph *g, int v, size_t *offset) {
  unsigned char *base[KN_DEVICE_BUFFERS];
  size_t bytes[KN_DEVICE_BUFFERS];
  host_buffers(g, base, bytes);
  const unsigned char *at = g->nodes[v].data;
  for (int b = 0; b < KN_DEVICE_BUFFERS; b++)
    if (base[b] && at >= base[b] && at < base[b] + bytes[b]) {
      *offset = (size_t)(at - base[b]);
      return b;
    }
  return -1;
}

/* The device whose kernel runs node i, or -1 where it runs on the host. */
static int kernel_device(const kn_graph *g, int i) {
  const kn_node_rec *n = &g->nodes[i];
  return n->device.kind == KN_DEVICE_CUDA && kn_runs_device_kernel(n) ? n->device.index : -1;
}

static size_t value_bytes(const kn_graph *g, const kn_node_rec *n, int batch) {
  return kn_node_elems(n, batch) * kn_graph_elem_size(g, n->dtype);
}

/* Whether device d needs a copy of node v, and of which buffer: refuses a
 * value that does not lie in one block (a part of a concatenation). */
static int need(kn_graph *g, int v, int d, const kn_node_rec *reader,
                unsigned char want[KN_RESIDENT_DEVICES][KN_DEVICE_BUFFERS]) {
  const kn_node_rec *x = &g->nodes[v];
  size_t offset;
  const int b = buffer_of(g, v, &offset);
  if (x->storage == KN_STORE_PART || b < 0) {
    kn_graph_fail(g, KN_EINVAL,
                  "compile: node '%s' on cuda:%d reads '%s', which lies inside a "
                  "concatenation's storage; place it on cpu",
                  reader->name, d, x->name);
    return KN_EINVAL;
  }
  want[d][b] = 1;
  return KN_OK;
}

int kn_residency_alloc(kn_graph *g) {
  unsigned char want[KN_RESIDENT_DEVICES][KN_DEVICE_BUFFERS] = {{0}};
  int any = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const int d = g->nodes[i].dead ? -1 : kernel_device(g, i);
    if (d < 0) continue;
    const kn_node_rec *n = &g->nodes[i];
    if (d >= KN_RESIDENT_DEVICES) {
      kn_graph_fail(g, KN_EINVAL,
                    "compile: node '%s' is placed on cuda:%d; a graph keeps values on cuda:0 to "
                    "cuda:%d",
                    n->name, d, KN_RESIDENT_DEVICES - 1);
      return KN_EINVAL;
    }
    for (int k = -1; k < n->n_inputs; k++)
      if (need(g, k < 0 ? i : n->inputs[k], d, n, want)) return KN_EINVAL;
    any = 1;
  }
  if (!any) return KN_OK;
  /* Every gradient computed on one device: the optimizer can step there,
   * over that device's parameter and gradient buffers. */
  int step = -2;
  for (int i = 0; i < g->n_nodes && step != -1; i++) {
    if (g->nodes[i].dead || g->nodes[i].storage != KN_STORE_GRAD) continue;
    const int d = kernel_device(g, i);
    step = d < 0 || (step >= 0 && step != d) ? -1 : d;
  }
  if (step >= 0 && g->n_param_floats > 0) {
    g->step_device = step + 1;
    want[step][1] = want[step][2] = 1;
  }
  g->where = malloc((size_t)g->n_nodes * sizeof *g->where);
  if (!g->where) {
    kn_graph_fail(g, KN_ENOMEM, "compile: out of memory for the GPU values' table");
    return KN_ENOMEM;
  }
  for (int i = 0; i < g->n_nodes; i++) g->where[i] = HOST;
  /* Each device gets the host's layout: the same planned arena (offsets
   * and reuse as planned for the host, so values live at once never share
   * memory), and the flat buffers. */
  static const char *const what[KN_DEVICE_BUFFERS] = {"activations arena", "parameters",
                                                      "gradients", "state"};
  unsigned char *base[KN_DEVICE_BUFFERS];
  size_t bytes[KN_DEVICE_BUFFERS];
  host_buffers(g, base, bytes);
  for (int d = 0; d < KN_RESIDENT_DEVICES; d++)
    for (int b = 0; b < KN_DEVICE_BUFFERS; b++) {
      if (!want[d][b]) continue;
      char err[256];
      if (kn_cuda_alloc(d, bytes[b], &g->device_buf[d][b], err, sizeof err) != 0) {
        kn_graph_fail(g, KN_ENOMEM, "compile: %zu bytes on cuda:%d for the %s: %s", bytes[b], d,
                      what[b], err);
        return KN_ENOMEM;
      }
      g->device_bytes += bytes[b];
    }
  /* The gradients no node computes stay zero, as on the host. */
  if (g->step_device) {
    const int d = g->step_device - 1;
    char err[256];
    if (kn_cuda_copy_in(d, g->device_buf[d][2], g->grad_buf, bytes[2], err, sizeof err) != 0) {
      kn_graph_fail(g, KN_EIO, "compile: zeroing the gradients on cuda:%d: %s", d, err);
      return KN_EIO;
    }
  }
  return KN_OK;
}

void kn_residency_free(kn_graph *g) {
  for (int d = 0; d < KN_RESIDENT_DEVICES; d++)
    for (int b = 0; b < KN_DEVICE_BUFFERS; b++) {
      kn_cuda_free(d, g->device_buf[d][b]);
      g->device_buf[d][b] = NULL;
    }
  free(g->where);
  g->where = NULL;
}

void *kn_device_data(kn_graph *g, int v, int d) {
  size_t offset = 0;
  const int b = buffer_of(g, v, &offset);
  return b < 0 || !g->device_buf[d][b] ? NULL : (unsigned char *)g->device_buf[d][b] + offset;
}

void kn_residency_start(kn_graph *g) {
  if (!g->where) return;
  const uint32_t params = g->params_on_device ? ON_DEVICE(g->step_device - 1) : HOST;
  for (int i = 0; i < g->n_nodes; i++)
    g->where[i] = g->nodes[i].storage == KN_STORE_PARAM ? params : HOST;
}

/* Node v's value on the host, copied from a device that holds it. */
static int to_host(kn_graph *g, int v, char *err, size_t errlen);
static int to_device(kn_graph *g, int v, int d, char *err, size_t errlen);

/* A view moves with the value it views: its storage root is copied (once,
 * for every view of it), and the view is then where the root is. */
static int view_to(kn_graph *g, int v, int d, char *err, size_t errlen) {
  const int root = kn_storage_root(g, v);
  const int rc = d >= 0 ? to_device(g, root, d, err, errlen) : to_host(g, root, err, errlen);
  if (!rc) g->where[v] = g->where[root];
  return rc;
}

static int to_host(kn_graph *g, int v, char *err, size_t errlen) {
  if (g->where[v] & HOST) return KN_OK;
  if (kn_op_has(g->nodes[v].op, KN_OPF_VIEW)) return view_to(g, v, -1, err, errlen);
  kn_node_rec *x = &g->nodes[v];
  for (int d = 0; d < KN_RESIDENT_DEVICES; d++) {
    if (!(g->where[v] & ON_DEVICE(d))) continue;
    const size_t bytes = value_bytes(g, x, g->batch);
    char why[256];
    if (kn_cuda_copy_out(d, x->data, kn_device_data(g, v, d), bytes, why, sizeof why) != 0) {
      snprintf(err, errlen, "run: copying '%s' from cuda:%d: %s", x->name, d, why);
      return KN_EIO;
    }
    g->copied_out += bytes;
    g->where[v] |= HOST;
    return KN_OK;
  }
  snprintf(err, errlen, "run: '%s' is read before it is computed", x->name);
  return KN_ESTATE;
}

/* Node v's value on device d, from the host (copied there first if
 * another device holds it). */
static int to_device(kn_graph *g, int v, int d, char *err, size_t errlen) {
  if (g->where[v] & ON_DEVICE(d)) return KN_OK;
  if (kn_op_has(g->nodes[v].op, KN_OPF_VIEW)) return view_to(g, v, d, err, errlen);
  int rc = to_host(g, v, err, errlen);
  if (rc) return rc;
  const kn_node_rec *x = &g->nodes[v];
  const size_t bytes = value_bytes(g, x, g->batch);
  char why[256];
  if (kn_cuda_copy_in(d, kn_device_data(g, v, d), x->data, bytes, why, sizeof why) != 0) {
    snprintf(err, errlen, "run: copying '%s' to cuda:%d: %s", x->name, d, why);
    return KN_EIO;
  }
  g->copied_in += bytes;
  g->where[v] |= ON_DEVICE(d);
  return KN_OK;
}

int kn_residency_before(kn_graph *g, int i, char *err, size_t errlen) {
  if (!g->where) return KN_OK;
  const kn_node_rec *n = &g->nodes[i];
  if (kn_op_has(n->op, KN_OPF_VIEW)) return KN_OK; /* its input's value, wherever that is */
  const int d = kernel_device(g, i);
  for (int k = 0; k < n->n_inputs; k++) {
    const int rc =
        d >= 0 ? to_device(g, n->inputs[k], d, err, errlen) : to_host(g, n->inputs[k], err, errlen);
    if (rc) return rc;
  }
  return KN_OK;
}

int kn_residency_after(kn_graph *g, int i, char *err, size_t errlen) {
  /* a value fed or held: where it was (the parameters maybe on a device) */
  if (!g->where || kn_op_has(g->nodes[i].op, KN_OPF_FED | KN_OPF_FLAT)) return KN_OK;
  /* a view: where its input is (each copy of it lies where the input's
   * does, at the same offset) */
  if (kn_op_has(g->nodes[i].op, KN_OPF_VIEW)) {
    g->where[i] = g->where[g->nodes[i].inputs[0]];
    return KN_OK;
  }
  const int d = kernel_device(g, i);
  g->where[i] = d >= 0 ? ON_DEVICE(d) : HOST;
  /* Batch norm's statistics move the moving ones (state, inputs 1 and 2)
   * in place: the device's copies are the current ones, and the host's
   * (checkpoints and replicas read it there) is brought up to date. */
  if (d >= 0 && g->nodes[i].op == KN_OP_BN_STATS) {
    for (int k = 1; k <= 2; k++) {
      g->where[g->nodes[i].inputs[k]] = ON_DEVICE(d);
      const int rc = to_host(g, g->nodes[i].inputs[k], err, errlen);
      if (rc) return rc;
    }
  }
  /* A value in the flat buffers is read there on the host: at once where
   * gradient hooks read each bucket as backward finishes it, or no device
   * optimizer step can take the gradients; else when asked (kn_grads). */
  const kn_storage s = g->nodes[i].storage;
  const int keep = s == KN_STORE_GRAD && g->step_device && !g->node_done;
  if (d >= 0 && !keep && (s == KN_STORE_PARAM || s == KN_STORE_GRAD || s == KN_STORE_STATE))
    return to_host(g, i, err, errlen);
  return KN_OK;
}

int kn_residency_flat_to_host(kn_graph *g, kn_storage which) {
  if (!g->where) return KN_OK;
  char err[512];
  if (which == KN_STORE_PARAM && g->params_on_device) {
    const int d = g->step_device - 1;
    const size_t bytes = g->n_param_floats * sizeof(float);
    if (kn_cuda_copy_out(d, g->param_buf, g->device_buf[d][1], bytes, err, sizeof err) != 0) {
      kn_graph_fail(g, KN_EIO, "copying the parameters from cuda:%d: %s", d, err);
      return KN_EIO;
    }
    g->copied_out += bytes;
    g->params_on_device = 0;
  }
  for (int i = 0; i < g->n_nodes; i++) {
    if (g->nodes[i].dead || g->nodes[i].storage != which) continue;
    if (which != KN_STORE_PARAM && to_host(g, i, err, sizeof err) == KN_EIO) {
      kn_graph_fail(g, KN_EIO, "%s", err);
      return KN_EIO;
    }
    g->where[i] = HOST; /* the caller may write the host's copy */
  }
  return KN_OK;
}

int kn_residency_step_begin(kn_graph *g, int *device, float **params, float **grads, char *err,
                            size_t errlen) {
  if (!g->where || !g->step_device || g->node_done) return 0;
  const int d = g->step_device - 1;
  /* Each parameter and gradient the device lacks goes over: the
   * parameters the run's kernels read are there already, as are the
   * gradients they computed (unless the host was handed them). */
  for (int i = 0; i < g->n_nodes; i++) {
    const kn_storage s = g->nodes[i].storage;
    if (s != KN_STORE_PARAM && (s != KN_STORE_GRAD || g->nodes[i].dead)) continue;
    if (to_device(g, i, d, err, errlen)) return -1;
  }
  *device = d;
  *params = g->device_buf[d][1];
  *grads = g->device_buf[d][2];
  return 1;
}

void kn_residency_step_end(kn_graph *g) {
  g->params_on_device = 1;
  const uint32_t on = ON_DEVICE(g->step_device - 1);
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].storage == KN_STORE_PARAM) g->where[i] = on;
}

int kn_residency_sync(kn_graph *g, int i, char *err, size_t errlen) {
  return g->where ? to_host(g, i, err, errlen) : KN_OK;
}

void kn_graph_device_copies(const kn_graph *g, uint64_t *to_devices, uint64_t *to_host,
                            size_t *held) {
  if (to_devices) *to_devices = g->copied_in;
  if (to_host) *to_host = g->copied_out;
  if (held) *held = g->device_bytes;
}
