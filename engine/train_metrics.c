/* train_metrics.c — a batch fed into the model's inputs, and what a run
 * reports of it: correct and top-k counts, error sums, the metrics' names,
 * the checks of a dataset and metrics against the model, evaluation, and the
 * model's predictions (inference). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_internal.h"

/* Copies a batch into the model's inputs: the examples, and the loss's
 * target made from the labels (class ids, one-hot rows, 0/1 for one
 * sigmoid output) or the regression targets. onehot may be NULL: the rows
 * are then made here. */
static void feed_rows(kn_model *m, int rows, const float *x, const int32_t *labels,
                      const float *onehot, const float *targets) {
  memcpy(kn_node_data(m->graph, m->x), x, (size_t)rows * m->example_size * sizeof(float));
  void *y = kn_node_data(m->graph, m->y);
  const size_t width = (size_t)m->n_outputs;
  switch (m->loss_kind) {
  case KN_LOSS_SPARSE_XENT: memcpy(y, labels, (size_t)rows * sizeof(int32_t)); break;
  case KN_LOSS_MSE:
  case KN_LOSS_MAE: memcpy(y, targets, (size_t)rows * width * sizeof(float)); break;
  case KN_LOSS_XENT:
  case KN_LOSS_BCE: {
    float *t = y; /* (rows, outputs) */
    if (width == 1) {
      for (int r = 0; r < rows; r++) t[r] = (float)labels[r];
    } else if (onehot) {
      memcpy(t, onehot, (size_t)rows * width * sizeof(float));
    } else {
      memset(t, 0, (size_t)rows * width * sizeof(float));
      for (int r = 0; r < rows; r++)
        if (labels[r] >= 0 && (size_t)labels[r] < width) t[(size_t)r * width + labels[r]] = 1.0f;
    }
    break;
  }
  }
}

void kn_feed_batch(kn_model *m, const kn_batch *b) {
  feed_rows(m, b->rows, b->x, b->y, b->y_onehot, b->targets);
}

/* Correct predictions in the current logits: the argmax against the
 * labels, or for a single output (binary cross-entropy) logit > 0. */
static int count_correct(kn_model *m, const int32_t *labels, int rows) {
  const float *logits = kn_node_data(m->graph, m->logits);
  const int width = m->n_outputs;
  int correct = 0;
  for (int r = 0; r < rows; r++) {
    const float *row = logits + (size_t)r * width;
    int best = 0;
    if (width == 1) {
      best = row[0] > 0.0f;
    } else {
      for (int c = 1; c < width; c++) best = row[c] > row[best] ? c : best;
    }
    correct += best == labels[r];
  }
  return correct;
}

/* Sums of squared and absolute errors of the current predictions against
 * the regression targets, over rows x outputs values. */
static void add_errors(kn_model *m, const float *targets, int rows, double *sq, double *abs_sum) {
  const float *pred = kn_node_data(m->graph, m->logits);
  const size_t count = (size_t)rows * (size_t)m->n_outputs;
  for (size_t i = 0; i < count; i++) {
    double d = (double)pred[i] - (double)targets[i];
    *sq += d * d;
    *abs_sum += fabs(d);
  }
}

/* Rows whose label is among the k highest scores: fewer than k scores
 * beat the label's (ties count for the label, as tf.math.in_top_k). */
static int count_top_k(kn_model *m, const int32_t *labels, int rows, int k) {
  const float *logits = kn_node_data(m->graph, m->logits);
  const int width = m->n_outputs;
  int hits = 0;
  for (int r = 0; r < rows; r++) {
    const float *row = logits + (size_t)r * width;
    if (labels[r] < 0 || labels[r] >= width) continue;
    const float mine = row[labels[r]];
    int above = 0;
    for (int c = 0; c < width; c++) above += row[c] > mine;
    hits += above < k;
  }
  return hits;
}

void kn_tally_batch(kn_model *m, kn_metric_sums *t, const kn_batch *b, float loss, unsigned metrics,
                    int top_k) {
  t->loss += (double)loss * b->rows;
  t->rows += b->rows;
  if (metrics & KN_METRIC_ACCURACY) t->correct += count_correct(m, b->y, b->rows);
  if (metrics & KN_METRIC_TOP_K) t->top_k += count_top_k(m, b->y, b->rows, top_k);
  if (metrics & (KN_METRIC_MSE | KN_METRIC_MAE))
    add_errors(m, b->targets, b->rows, &t->sq, &t->abs);
}

enum { N_NAMES = 5 };
static const char *const metric_names[3][N_NAMES] = {
    [KN_NAMES_STEP] = {"loss", "accuracy", "mse", "mae", "top_k_accuracy"},
    [KN_NAMES_EPOCH] = {"epoch_loss", "epoch_accuracy", "epoch_mse", "epoch_mae",
                        "epoch_top_k_accuracy"},
    [KN_NAMES_VAL] = {"val_loss", "val_accuracy", "val_mse", "val_mae", "val_top_k_accuracy"}};
static const unsigned name_bits[N_NAMES] = {0, KN_METRIC_ACCURACY, KN_METRIC_MSE, KN_METRIC_MAE,
                                            KN_METRIC_TOP_K};

/* Appends prefix+loss and prefix+each metric to the event; nothing for a
 * window without rows (every step's loss was non-finite), whose means are
 * not 0 but undefined. */
void kn_put_metrics(kn_model *m, kn_train_event *ev, const kn_metric_sums *t, unsigned metrics,
                    kn_metric_names names) {
  if (t->rows <= 0) return;
  const double rows = (double)t->rows;
  const double values = rows * (double)m->n_outputs;
  const double value[N_NAMES] = {t->loss / rows, (double)t->correct / rows, t->sq / values,
                                 t->abs / values, (double)t->top_k / rows};
  for (int i = 0; i < N_NAMES && ev->n_metrics < KN_EVENT_MAX_METRICS; i++) {
    if (i > 0 && !(metrics & name_bits[i])) continue;
    ev->names[ev->n_metrics] = metric_names[names][i];
    ev->values[ev->n_metrics++] = value[i];
  }
}

/* Appends one value to the event, while there is room. */
void kn_put_metric(kn_train_event *ev, const char *name, double value) {
  if (ev->n_metrics >= KN_EVENT_MAX_METRICS) return;
  ev->names[ev->n_metrics] = name;
  ev->values[ev->n_metrics++] = value;
}

/* Whether an epoch event carries name (a callback's monitor). */
int kn_epoch_reports(unsigned metrics, int has_val, const char *name) {
  for (int i = 0; i < N_NAMES; i++) {
    if (i > 0 && !(metrics & name_bits[i])) continue;
    if (strcmp(name, metric_names[KN_NAMES_EPOCH][i]) == 0 ||
        (has_val && strcmp(name, metric_names[KN_NAMES_VAL][i]) == 0))
      return 1;
  }
  return 0;
}

/* The metrics a run reports: the asked ones, checked against the loss. */
int kn_resolve_metrics(const kn_model *m, unsigned asked, unsigned *out, char *err, size_t errlen) {
  const int regression = kn_loss_is_regression(m->loss_kind);
  if (asked == 0) asked = regression ? 0u : KN_METRIC_ACCURACY;
  if (asked & ~(unsigned)(KN_METRIC_ACCURACY | KN_METRIC_MSE | KN_METRIC_MAE | KN_METRIC_TOP_K)) {
    snprintf(err, errlen, "train: unknown metrics 0x%x", asked);
    return KN_EINVAL;
  }
  if (regression && (asked & (KN_METRIC_ACCURACY | KN_METRIC_TOP_K))) {
    snprintf(err, errlen, "train: accuracy needs a classification loss; this model regresses");
    return KN_EINVAL;
  }
  if (!regression && (asked & (KN_METRIC_MSE | KN_METRIC_MAE))) {
    snprintf(err, errlen, "train: mse and mae need a regression loss; this model classifies");
    return KN_EINVAL;
  }
  *out = asked;
  return KN_OK;
}

int kn_check_fit(kn_model *m, const kn_dataset *ds, const char *what, char *err, size_t errlen) {
  if (!m->graph || !m->graph->compiled) {
    snprintf(err, errlen, "%s: compile the model first", what);
    return KN_ESTATE;
  }
  if (ds->example_size != m->example_size) {
    snprintf(err, errlen, "%s: dataset examples hold %zu values, the model's input %zu", what,
             ds->example_size, m->example_size);
    return KN_EINVAL;
  }
  if (kn_loss_is_regression(m->loss_kind)) {
    if (!ds->targets) {
      snprintf(err, errlen,
               "%s: a regression loss needs numeric targets, and this dataset's labels are "
               "classes",
               what);
      return KN_EINVAL;
    }
    if (ds->n_targets != m->n_outputs) {
      snprintf(err, errlen, "%s: dataset has %d regression targets, the model %d outputs", what,
               ds->n_targets, m->n_outputs);
      return KN_EINVAL;
    }
    return KN_OK;
  }
  /* One sigmoid output scores classes 0 and 1. */
  const int classes = m->n_outputs == 1 ? 2 : m->n_classes;
  if (ds->n_classes > classes) {
    snprintf(err, errlen, "%s: dataset has labels up to %d, the model only %d classes", what,
             ds->n_classes - 1, classes);
    return KN_EINVAL;
  }
  return KN_OK;
}

int kn_planned_batch(kn_model *m) {
  int ndim, dims[KN_MAX_DIMS];
  kn_node_shape(m->graph, m->x, &ndim, dims);
  return dims[0];
}

int kn_evaluate(kn_model *m, const kn_dataset *ds, double *loss, double *accuracy, char *err,
                size_t errlen) {
  int rc = kn_check_fit(m, ds, "evaluate", err, errlen);
  if (rc) return rc;
  if (ds->stream) {
    snprintf(err, errlen,
             "evaluate: a streamed data set is evaluated through a pipeline (a validation set)");
    return KN_EINVAL;
  }
  if (kn_loss_is_regression(m->loss_kind)) {
    snprintf(err, errlen,
             "evaluate: a regression model has no accuracy; train with a validation "
             "set to get val_loss and val_mae");
    return KN_EINVAL;
  }
  int batch = kn_planned_batch(m);
  double loss_sum = 0.0;
  int64_t correct = 0;
  /* A byte data set's batch as floats. */
  float *rows_buf = ds->x ? NULL : malloc((size_t)batch * ds->example_size * sizeof *rows_buf);
  if (!ds->x && !rows_buf) {
    snprintf(err, errlen, "evaluate: out of memory for a batch of %d examples", batch);
    return KN_ENOMEM;
  }
  for (int64_t start = 0; start < ds->n; start += batch) {
    int rows = (int)((ds->n - start) < batch ? ds->n - start : batch);
    const float *x = ds->x ? ds->x + (size_t)start * ds->example_size : rows_buf;
    for (int r = 0; !ds->x && r < rows; r++)
      kn_dataset_row(ds, start + r, rows_buf + (size_t)r * ds->example_size);
    feed_rows(m, rows, x, ds->y + start, NULL, NULL);
    rc = kn_graph_run(m->graph, KN_RUN_FORWARD, rows, err, errlen);
    if (rc) {
      free(rows_buf);
      return rc;
    }
    loss_sum += (double)*(float *)kn_node_data(m->graph, m->loss) * rows;
    correct += count_correct(m, ds->y + start, rows);
  }
  free(rows_buf);
  *loss = ds->n ? loss_sum / (double)ds->n : 0.0;
  *accuracy = ds->n ? (double)correct / (double)ds->n : 0.0;
  return KN_OK;
}

/* Loss and metrics over one pass of an evaluation pipeline. */
int kn_evaluate_pipeline(kn_model *m, kn_pipeline *pipe, unsigned metrics, int top_k,
                         kn_metric_sums *t, char *err, size_t errlen) {
  kn_pipeline_state start = {0, 0, 0};
  int rc = kn_pipeline_restore(pipe, &start, err, errlen);
  if (rc) return rc;
  memset(t, 0, sizeof *t);
  kn_batch b;
  int got;
  while ((got = kn_pipeline_next(pipe, &b)) == 1) {
    kn_feed_batch(m, &b);
    rc = kn_graph_run(m->graph, KN_RUN_FORWARD, b.rows, err, errlen);
    if (rc) return rc;
    kn_tally_batch(m, t, &b, *(float *)kn_node_data(m->graph, m->loss), metrics, top_k);
  }
  if (got < 0) {
    snprintf(err, errlen, "evaluate: %s", kn_pipeline_error(pipe));
    return got;
  }
  return KN_OK;
}

/* Sums a tally over every process, in place. */
int kn_global_tally(kn_run *r, kn_metric_sums *t) {
  double v[6] = {t->loss, (double)t->rows, (double)t->correct, (double)t->top_k, t->sq, t->abs};
  int rc = kn_dist_sum(r->dist, v, 6, r->err, r->errlen);
  *t = (kn_metric_sums){.loss = v[0],
                        .rows = (int64_t)v[1],
                        .correct = (int64_t)v[2],
                        .top_k = (int64_t)v[3],
                        .sq = v[4],
                        .abs = v[5]};
  return rc;
}

/* A tally to report: t itself, or its sum over every process. */
int kn_report_tally(kn_run *r, const kn_metric_sums *t, kn_metric_sums *out) {
  *out = *t;
  return r->dist ? kn_global_tally(r, out) : KN_OK;
}

int kn_model_predict(kn_model *m, const float *x, int64_t n, float *out, char *err, size_t errlen) {
  if (!m->graph || !m->graph->compiled) {
    snprintf(err, errlen, "predict: compile the model first");
    return KN_ESTATE;
  }
  const int batch = kn_planned_batch(m), width = m->n_outputs;
  int ydims, yshape[KN_MAX_DIMS];
  kn_node_shape(m->graph, m->y, &ydims, yshape);
  size_t y_elems = 1; /* i32 class ids or f32 targets: 4 bytes each */
  for (int d = 0; d < ydims; d++) y_elems *= (size_t)yshape[d];
  for (int64_t start = 0; start < n; start += batch) {
    int rows = (int)((n - start) < batch ? n - start : batch);
    memcpy(kn_node_data(m->graph, m->x), x + (size_t)start * m->example_size,
           (size_t)rows * m->example_size * sizeof(float));
    memset(kn_node_data(m->graph, m->y), 0, y_elems * 4); /* the loss runs too, on no labels */
    int rc = kn_graph_run(m->graph, KN_RUN_FORWARD, rows, err, errlen);
    if (rc) return rc;
    const float *logits = kn_node_data(m->graph, m->logits);
    for (int r = 0; r < rows; r++) {
      const float *in = logits + (size_t)r * width;
      float *o = out + (size_t)(start + r) * width;
      if (m->output_activation == KN_ACT_SOFTMAX) {
        double top = in[0], sum = 0.0;
        for (int c = 1; c < width; c++) top = in[c] > top ? in[c] : top;
        for (int c = 0; c < width; c++) sum += exp((double)in[c] - top);
        for (int c = 0; c < width; c++) o[c] = (float)(exp((double)in[c] - top) / sum);
      } else if (m->output_activation == KN_ACT_SIGMOID) {
        for (int c = 0; c < width; c++) o[c] = (float)(1.0 / (1.0 + exp(-(double)in[c])));
      } else {
        memcpy(o, in, (size_t)width * sizeof(float));
      }
    }
  }
  return KN_OK;
}
