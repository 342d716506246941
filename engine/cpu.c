/* cpu.c — the CPU backend: one kernel per op (cpu_kernels.inc), GEMM through
 * OpenBLAS, the rest as plain loops the compiler vectorizes. The kernels are
 * instantiated for float (training) and double (the gradient-check
 * reference). Kernels read the run's batch from the graph and never
 * allocate. */
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "graph_internal.h"

static int rows_of(const kn_graph *g, const kn_node_rec *n) {
  return (n->batched && g->batch > 0) ? g->batch * n->batched : n->dims[0];
}

/* A node's dims at the current batch. */
static void run_dims(const kn_graph *g, const kn_node_rec *n, int *dims) {
  for (int d = 0; d < n->ndim; d++) dims[d] = n->dims[d];
  dims[0] = rows_of(g, n);
}

/* Rows x last-dim view of a node at the current batch. */
static void as_matrix(const kn_graph *g, const kn_node_rec *n, int *rows, int *cols) {
  *cols = n->dims[n->ndim - 1];
  *rows = (int)(kn_node_elems(n, g->batch) / (size_t)*cols);
}

/* x as (outer, len, inner) around the reduced axis (-1: all of it). */
static void reduce_split(kn_graph *g, const kn_node_rec *x, int axis, size_t *outer, size_t *len,
                         size_t *inner) {
  int dims[KN_MAX_DIMS];
  run_dims(g, x, dims);
  *outer = *inner = 1;
  if (axis < 0) {
    *len = kn_node_elems(x, g->batch);
    return;
  }
  *len = (size_t)dims[axis];
  for (int d = 0; d < axis; d++) *outer *= (size_t)dims[d];
  for (int d = axis + 1; d < x->ndim; d++) *inner *= (size_t)dims[d];
}

/* Rows before `axis` and elements per row from `axis` on. */
static void axis_split(kn_graph *g, const kn_node_rec *x, int axis, size_t *outer, size_t *row) {
  int dims[KN_MAX_DIMS];
  run_dims(g, x, dims);
  *outer = 1;
  *row = 1;
  for (int d = 0; d < axis; d++) *outer *= (size_t)dims[d];
  for (int d = axis; d < x->ndim; d++) *row *= (size_t)dims[d];
}

/* Labels outside [0, C) are a data error, reported rather than read past. */
static int check_labels(const char *op, const int32_t *labels, int rows, int cols, char *err,
                        size_t errlen) {
  for (int r = 0; r < rows; r++) {
    if (labels[r] < 0 || labels[r] >= cols) {
      snprintf(err, errlen, "%s: label %d of row %d is outside [0, %d)", op, labels[r], r, cols);
      return KN_EINVAL;
    }
  }
  return KN_OK;
}

/* A uniform [0, 1) draw for element i of a dropout mask: a stateless hash
 * (splitmix64) of (seed, step, i), so a mask is the same whatever the thread
 * count or precision, and no state needs saving for a resume. */
static double dropout_uniform(uint64_t base, size_t i) {
  uint64_t z = base + (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

#define T       float
#define F(name) name##_f32
#define GEMM    cblas_sgemm
#define EXP     expf
#define LOG     logf
#define LOG1P   log1pf
#define SQRT    sqrtf
#define ERF     erff
#define TANH    tanhf
#define FABS    fabsf
#include "cpu_kernels.inc"
#undef T
#undef F
#undef GEMM
#undef EXP
#undef LOG
#undef LOG1P
#undef SQRT
#undef ERF
#undef TANH
#undef FABS

#define T       double
#define F(name) name##_f64
#define GEMM    cblas_dgemm
#define EXP     exp
#define LOG     log
#define LOG1P   log1p
#define SQRT    sqrt
#define ERF     erf
#define TANH    tanh
#define FABS    fabs
#include "cpu_kernels.inc"

int kn_cpu_run_node(kn_graph *g, int i, char *err, size_t errlen) {
  return kn_cpu_run_f32(g, i, err, errlen);
}

int kn_cpu_run_node_f64(kn_graph *g, int i, char *err, size_t errlen) {
  return kn_cpu_run_f64(g, i, err, errlen);
}
