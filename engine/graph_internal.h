/* graph_internal.h — the engine's private view of a graph: node layout, op
 * codes and the helpers shared by the builder, autodiff, planner and
 * kernels. Not for other modules. */
#ifndef KILN_ENGINE_GRAPH_INTERNAL_H
#define KILN_ENGINE_GRAPH_INTERNAL_H

#include "engine.h"

typedef enum kn_op {
  KN_OP_INPUT = 0,
  KN_OP_PARAM,
  KN_OP_FILL,   /* constant fill with attr_f[0] */
  KN_OP_MATMUL, /* attr_i[0] = trans_a, attr_i[1] = trans_b */
  KN_OP_BIAS_ADD,
  KN_OP_ADD,
  KN_OP_RELU,
  KN_OP_SOFTMAX,
  KN_OP_RESHAPE, /* a view of its input */
  KN_OP_SOFTMAX_XENT,
  /* gradient ops, emitted by autodiff */
  KN_OP_RELU_GRAD,         /* (dy, y) -> dy * (y > 0) */
  KN_OP_SOFTMAX_GRAD,      /* (dy, y) -> y * (dy - sum(dy * y)) */
  KN_OP_REDUCE_ROWS,       /* (dy) -> sum over all but the last dim */
  KN_OP_SOFTMAX_XENT_GRAD, /* (logits, labels, dloss) -> dloss * (softmax - onehot) / B */
  KN_OP_COPY,
  KN_OP_COUNT
} kn_op;

typedef enum kn_storage {
  KN_STORE_ARENA = 0, /* planned in the activation arena */
  KN_STORE_PARAM,     /* a slot of the flat parameter buffer */
  KN_STORE_GRAD,      /* a slot of the flat gradient buffer */
  KN_STORE_VIEW,      /* shares the storage of inputs[0] */
} kn_storage;

#define KN_MAX_INPUTS 3

typedef struct kn_node_rec {
  kn_op op;
  kn_dtype dtype;
  int ndim;
  int dims[KN_MAX_DIMS]; /* dims[0] is the planned batch when batched */
  int batched;           /* the leading dim follows the run's batch */
  int n_inputs;
  kn_node inputs[KN_MAX_INPUTS];
  int attr_i[2];
  float attr_f[1];
  kn_init init;
  char name[128];    /* parameters: "<layer>.kernel"; gradients: "grad/<param>" */
  int requires_grad; /* depends on a parameter */
  int keep;          /* readable after a run: never reused */
  kn_storage storage;
  size_t flat_offset;      /* floats, for PARAM and GRAD storage */
  size_t arena_offset;     /* bytes, for ARENA storage */
  int first_use, last_use; /* liveness over the schedule (filled by the planner) */
  void *data;
} kn_node_rec;

struct kn_graph {
  kn_node_rec *nodes;
  int n_nodes, cap_nodes;
  int n_forward; /* nodes [0, n_forward) form the forward pass */
  int has_backward;
  kn_node *params; /* parameter nodes in creation order */
  int n_params, cap_params;
  size_t n_param_floats;
  float *param_buf, *grad_buf;
  unsigned char *arena;
  size_t arena_bytes, naive_bytes;
  int compiled;
  int batch;         /* rows of the current run */
  int planned_batch; /* rows memory was planned for (0: no batched input) */
  char error[256];
  int error_code;
};

size_t kn_dtype_size(kn_dtype dtype);
/* Elements of a node at its planned size, or for `batch` rows when batched. */
size_t kn_node_elems(const kn_node_rec *n, int batch);
size_t kn_node_planned_bytes(const kn_node_rec *n);
/* Records the first builder error; returns -1 for `return kn_graph_fail(...)`. */
int kn_graph_fail(kn_graph *g, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Appends a node (copying *proto), returning its index or -1. */
kn_node kn_graph_push(kn_graph *g, const kn_node_rec *proto);
/* Runs node i on the CPU for the graph's current batch. */
int kn_cpu_run_node(kn_graph *g, int i, char *err, size_t errlen);
/* Fills a buffer with an initializer's values. */
void kn_init_fill(kn_init init, float *data, size_t count, int fan_in, int fan_out, kn_rng *rng);

#endif
