/* cpu.c — the CPU backend: one kernel per op, GEMM through OpenBLAS, the
 * rest as plain loops the compiler vectorizes. Kernels read the run's batch
 * from the graph and never allocate. */
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "graph_internal.h"

static int rows_of(const kn_graph *g, const kn_node_rec *n) {
  return (n->batched && g->batch > 0) ? g->batch : n->dims[0];
}

/* Rows x last-dim view of a node at the current batch. */
static void as_matrix(const kn_graph *g, const kn_node_rec *n, int *rows, int *cols) {
  *cols = n->dims[n->ndim - 1];
  *rows = (int)(kn_node_elems(n, g->batch) / (size_t)*cols);
}

static void k_matmul(kn_graph *g, kn_node_rec *n) {
  const kn_node_rec *A = &g->nodes[n->inputs[0]], *B = &g->nodes[n->inputs[1]];
  int ta = n->attr_i[0], tb = n->attr_i[1];
  int a_rows = rows_of(g, A), a_cols = A->dims[1];
  int b_rows = rows_of(g, B), b_cols = B->dims[1];
  int m = ta ? a_cols : a_rows, k = ta ? a_rows : a_cols, cols = tb ? b_rows : b_cols;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
              cols, k, 1.0f, A->data, a_cols, B->data, b_cols, 0.0f, n->data, cols);
}

static void k_bias_add(kn_graph *g, kn_node_rec *n) {
  const kn_node_rec *X = &g->nodes[n->inputs[0]];
  const float *bias = g->nodes[n->inputs[1]].data;
  const float *x = X->data;
  float *y = n->data;
  int rows, cols;
  as_matrix(g, n, &rows, &cols);
  for (int r = 0; r < rows; r++) {
    const float *xr = x + (size_t)r * cols;
    float *yr = y + (size_t)r * cols;
    for (int c = 0; c < cols; c++) yr[c] = xr[c] + bias[c];
  }
}

static void k_add(kn_graph *g, kn_node_rec *n) {
  const float *a = g->nodes[n->inputs[0]].data, *b = g->nodes[n->inputs[1]].data;
  float *y = n->data;
  size_t count = kn_node_elems(n, g->batch);
  for (size_t i = 0; i < count; i++) y[i] = a[i] + b[i];
}

static void k_relu(kn_graph *g, kn_node_rec *n) {
  const float *x = g->nodes[n->inputs[0]].data;
  float *y = n->data;
  size_t count = kn_node_elems(n, g->batch);
  for (size_t i = 0; i < count; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

static void k_relu_grad(kn_graph *g, kn_node_rec *n) {
  const float *dy = g->nodes[n->inputs[0]].data, *y = g->nodes[n->inputs[1]].data;
  float *dx = n->data;
  size_t count = kn_node_elems(n, g->batch);
  for (size_t i = 0; i < count; i++) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

static void softmax_row(const float *x, float *y, int cols) {
  float max = -FLT_MAX;
  for (int c = 0; c < cols; c++) max = x[c] > max ? x[c] : max;
  float sum = 0.0f;
  for (int c = 0; c < cols; c++) {
    y[c] = expf(x[c] - max);
    sum += y[c];
  }
  float inv = 1.0f / sum;
  for (int c = 0; c < cols; c++) y[c] *= inv;
}

static void k_softmax(kn_graph *g, kn_node_rec *n) {
  const float *x = g->nodes[n->inputs[0]].data;
  float *y = n->data;
  int rows, cols;
  as_matrix(g, n, &rows, &cols);
  for (int r = 0; r < rows; r++) softmax_row(x + (size_t)r * cols, y + (size_t)r * cols, cols);
}

static void k_softmax_grad(kn_graph *g, kn_node_rec *n) {
  const float *dy = g->nodes[n->inputs[0]].data, *y = g->nodes[n->inputs[1]].data;
  float *dx = n->data;
  int rows, cols;
  as_matrix(g, n, &rows, &cols);
  for (int r = 0; r < rows; r++) {
    const float *dyr = dy + (size_t)r * cols, *yr = y + (size_t)r * cols;
    float *dxr = dx + (size_t)r * cols;
    float dot = 0.0f;
    for (int c = 0; c < cols; c++) dot += dyr[c] * yr[c];
    for (int c = 0; c < cols; c++) dxr[c] = yr[c] * (dyr[c] - dot);
  }
}

static void k_reduce_rows(kn_graph *g, kn_node_rec *n) {
  const kn_node_rec *D = &g->nodes[n->inputs[0]];
  const float *dy = D->data;
  float *out = n->data;
  int rows, cols;
  as_matrix(g, D, &rows, &cols);
  memset(out, 0, (size_t)cols * sizeof(float));
  for (int r = 0; r < rows; r++) {
    const float *dyr = dy + (size_t)r * cols;
    for (int c = 0; c < cols; c++) out[c] += dyr[c];
  }
}

/* Labels outside [0, C) are a data error, reported rather than read past. */
static int check_labels(const int32_t *labels, int rows, int cols, char *err, size_t errlen) {
  for (int r = 0; r < rows; r++) {
    if (labels[r] < 0 || labels[r] >= cols) {
      snprintf(err, errlen, "softmax_xent: label %d of row %d is outside [0, %d)", labels[r], r,
               cols);
      return KN_EINVAL;
    }
  }
  return KN_OK;
}

static int k_softmax_xent(kn_graph *g, kn_node_rec *n, char *err, size_t errlen) {
  const kn_node_rec *L = &g->nodes[n->inputs[0]];
  const float *logits = L->data;
  const int32_t *labels = g->nodes[n->inputs[1]].data;
  int rows, cols;
  as_matrix(g, L, &rows, &cols);
  int rc = check_labels(labels, rows, cols, err, errlen);
  if (rc) return rc;
  double total = 0.0;
  for (int r = 0; r < rows; r++) {
    const float *x = logits + (size_t)r * cols;
    float max = -FLT_MAX;
    for (int c = 0; c < cols; c++) max = x[c] > max ? x[c] : max;
    double sum = 0.0;
    for (int c = 0; c < cols; c++) sum += exp((double)(x[c] - max));
    total += log(sum) + max - x[labels[r]];
  }
  *(float *)n->data = (float)(total / rows);
  return KN_OK;
}

static void k_softmax_xent_grad(kn_graph *g, kn_node_rec *n) {
  const kn_node_rec *L = &g->nodes[n->inputs[0]];
  const float *logits = L->data;
  const int32_t *labels = g->nodes[n->inputs[1]].data;
  float dloss = *(const float *)g->nodes[n->inputs[2]].data;
  float *dx = n->data;
  int rows, cols;
  as_matrix(g, L, &rows, &cols);
  float scale = dloss / (float)rows;
  for (int r = 0; r < rows; r++) {
    float *d = dx + (size_t)r * cols;
    softmax_row(logits + (size_t)r * cols, d, cols);
    d[labels[r]] -= 1.0f;
    for (int c = 0; c < cols; c++) d[c] *= scale;
  }
}

int kn_cpu_run_node(kn_graph *g, int i, char *err, size_t errlen) {
  kn_node_rec *n = &g->nodes[i];
  switch (n->op) {
  case KN_OP_INPUT:
  case KN_OP_PARAM:
  case KN_OP_RESHAPE: return KN_OK;
  case KN_OP_FILL: {
    float *y = n->data;
    size_t count = kn_node_elems(n, g->batch);
    for (size_t k = 0; k < count; k++) y[k] = n->attr_f[0];
    return KN_OK;
  }
  case KN_OP_MATMUL: k_matmul(g, n); return KN_OK;
  case KN_OP_BIAS_ADD: k_bias_add(g, n); return KN_OK;
  case KN_OP_ADD: k_add(g, n); return KN_OK;
  case KN_OP_RELU: k_relu(g, n); return KN_OK;
  case KN_OP_SOFTMAX: k_softmax(g, n); return KN_OK;
  case KN_OP_SOFTMAX_XENT: return k_softmax_xent(g, n, err, errlen);
  case KN_OP_RELU_GRAD: k_relu_grad(g, n); return KN_OK;
  case KN_OP_SOFTMAX_GRAD: k_softmax_grad(g, n); return KN_OK;
  case KN_OP_REDUCE_ROWS: k_reduce_rows(g, n); return KN_OK;
  case KN_OP_SOFTMAX_XENT_GRAD: k_softmax_xent_grad(g, n); return KN_OK;
  case KN_OP_COPY:
    memcpy(n->data, g->nodes[n->inputs[0]].data, kn_node_elems(n, g->batch) * sizeof(float));
    return KN_OK;
  case KN_OP_COUNT: break;
  }
  snprintf(err, errlen, "run: node '%s' has an op the CPU backend does not know (%d)", n->name,
           n->op);
  return KN_EINVAL;
}
