/* train.c — the training loop: batches from the input pipeline copied into
 * the graph's input, one forward+backward run and one optimizer step per
 * batch, interval and epoch metrics, validation, and the final checkpoint.
 * All buffers are allocated before the first step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/dist.h"
#include "dist/ps.h"
#include "graph_internal.h"
#include "train_state.h"

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

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

static void feed(kn_model *m, const kn_batch *b) {
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

/* Running sums for one reporting window (an interval, an epoch, a
 * validation pass). */
typedef kn_metric_sums tally;

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

static void tally_batch(kn_model *m, tally *t, const kn_batch *b, float loss, unsigned metrics,
                        int top_k) {
  t->loss += (double)loss * b->rows;
  t->rows += b->rows;
  if (metrics & KN_METRIC_ACCURACY) t->correct += count_correct(m, b->y, b->rows);
  if (metrics & KN_METRIC_TOP_K) t->top_k += count_top_k(m, b->y, b->rows, top_k);
  if (metrics & (KN_METRIC_MSE | KN_METRIC_MAE))
    add_errors(m, b->targets, b->rows, &t->sq, &t->abs);
}

enum { N_NAMES = 5 };
static const char *const step_names[N_NAMES] = {"loss", "accuracy", "mse", "mae", "top_k_accuracy"};
static const char *const epoch_names[N_NAMES] = {"epoch_loss", "epoch_accuracy", "epoch_mse",
                                                 "epoch_mae", "epoch_top_k_accuracy"};
static const char *const val_names[N_NAMES] = {"val_loss", "val_accuracy", "val_mse", "val_mae",
                                               "val_top_k_accuracy"};
static const unsigned name_bits[N_NAMES] = {0, KN_METRIC_ACCURACY, KN_METRIC_MSE, KN_METRIC_MAE,
                                            KN_METRIC_TOP_K};

/* Appends prefix+loss and prefix+each metric to the event; nothing for a
 * window without rows (every step's loss was non-finite), whose means are
 * not 0 but undefined. */
static void put_metrics(kn_model *m, kn_train_event *ev, const tally *t, unsigned metrics,
                        const char *const names[N_NAMES]) {
  if (t->rows <= 0) return;
  const double rows = (double)t->rows;
  const double values = rows * (double)m->n_outputs;
  const double value[N_NAMES] = {t->loss / rows, (double)t->correct / rows, t->sq / values,
                                 t->abs / values, (double)t->top_k / rows};
  for (int i = 0; i < N_NAMES && ev->n_metrics < KN_EVENT_MAX_METRICS; i++) {
    if (i > 0 && !(metrics & name_bits[i])) continue;
    ev->names[ev->n_metrics] = names[i];
    ev->values[ev->n_metrics++] = value[i];
  }
}

/* Appends one value to the event, while there is room. */
static void put_metric(kn_train_event *ev, const char *name, double value) {
  if (ev->n_metrics >= KN_EVENT_MAX_METRICS) return;
  ev->names[ev->n_metrics] = name;
  ev->values[ev->n_metrics++] = value;
}

/* Whether an epoch event carries name (a callback's monitor). */
static int epoch_reports(unsigned metrics, int has_val, const char *name) {
  for (int i = 0; i < N_NAMES; i++) {
    if (i > 0 && !(metrics & name_bits[i])) continue;
    if (strcmp(name, epoch_names[i]) == 0 || (has_val && strcmp(name, val_names[i]) == 0)) return 1;
  }
  return 0;
}

/* The metrics a run reports: the asked ones, checked against the loss. */
static int resolve_metrics(const kn_model *m, unsigned asked, unsigned *out, char *err,
                           size_t errlen) {
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

static int check_fit(kn_model *m, const kn_dataset *ds, const char *what, char *err,
                     size_t errlen) {
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

static int planned_batch(kn_model *m) {
  int ndim, dims[KN_MAX_DIMS];
  kn_node_shape(m->graph, m->x, &ndim, dims);
  return dims[0];
}

int kn_evaluate(kn_model *m, const kn_dataset *ds, double *loss, double *accuracy, char *err,
                size_t errlen) {
  int rc = check_fit(m, ds, "evaluate", err, errlen);
  if (rc) return rc;
  if (kn_loss_is_regression(m->loss_kind)) {
    snprintf(err, errlen,
             "evaluate: a regression model has no accuracy; train with a validation "
             "set to get val_loss and val_mae");
    return KN_EINVAL;
  }
  int batch = planned_batch(m);
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t start = 0; start < ds->n; start += batch) {
    int rows = (int)((ds->n - start) < batch ? ds->n - start : batch);
    feed_rows(m, rows, ds->x + (size_t)start * ds->example_size, ds->y + start, NULL, NULL);
    rc = kn_graph_run(m->graph, KN_RUN_FORWARD, rows, err, errlen);
    if (rc) return rc;
    loss_sum += (double)*(float *)kn_node_data(m->graph, m->loss) * rows;
    correct += count_correct(m, ds->y + start, rows);
  }
  *loss = ds->n ? loss_sum / (double)ds->n : 0.0;
  *accuracy = ds->n ? (double)correct / (double)ds->n : 0.0;
  return KN_OK;
}

/* Loss and metrics over one pass of an evaluation pipeline. */
static int evaluate_pipeline(kn_model *m, kn_pipeline *pipe, unsigned metrics, int top_k, tally *t,
                             char *err, size_t errlen) {
  kn_pipeline_state start = {0, 0, 0};
  int rc = kn_pipeline_restore(pipe, &start, err, errlen);
  if (rc) return rc;
  memset(t, 0, sizeof *t);
  kn_batch b;
  while (kn_pipeline_next(pipe, &b) == 1) {
    feed(m, &b);
    rc = kn_graph_run(m->graph, KN_RUN_FORWARD, b.rows, err, errlen);
    if (rc) return rc;
    tally_batch(m, t, &b, *(float *)kn_node_data(m->graph, m->loss), metrics, top_k);
  }
  return KN_OK;
}

void kn_loss_scaler_init(kn_loss_scaler *s, double initial_scale, int64_t growth_interval) {
  s->scale = initial_scale > 0 ? initial_scale : 32768.0;
  s->growth_interval = growth_interval > 0 ? growth_interval : 2000;
  s->good_steps = 0;
  s->skipped = 0;
  s->skipped_in_a_row = 0;
}

int kn_loss_scaler_unscale(const kn_loss_scaler *s, float *grads, size_t n) {
  const float inv = (float)(1.0 / s->scale);
  int finite = 1;
  for (size_t i = 0; i < n; i++) {
    grads[i] *= inv;
    finite &= isfinite(grads[i]) != 0;
  }
  return finite;
}

void kn_loss_scaler_update(kn_loss_scaler *s, int finite) {
  if (!finite) {
    s->scale = s->scale * 0.5 > KN_LOSS_SCALE_MIN ? s->scale * 0.5 : KN_LOSS_SCALE_MIN;
    s->good_steps = 0;
    s->skipped++;
    s->skipped_in_a_row++;
    return;
  }
  s->skipped_in_a_row = 0;
  if (++s->good_steps >= s->growth_interval) {
    s->scale *= 2.0;
    s->good_steps = 0;
  }
}

/* Skipped steps in a row that fail a run when the config leaves it 0: the
 * 15 halvings from 2^15 to the floor and 35 more where halving no longer
 * changes anything. */
enum { DEFAULT_MAX_SKIPPED = 50 };

/* One run of kn_train: what the steps share. */
typedef struct run {
  kn_model *m;
  const kn_train_config *cfg;
  kn_train_callback cb;
  void *user;
  kn_pipeline *pipe, *val_pipe;
  kn_optimizer *opt;
  unsigned metrics;
  int top_k;
  int accum;  /* batches per optimizer step */
  float *acc; /* (n_params) row-weighted gradient sums of the window; NULL when accum is 1 */
  int64_t window_rows;
  int window_batches;
  int64_t step; /* optimizer steps done */
  int report_lr;
  int scaling;           /* dynamic loss scaling (mixed_float16) */
  kn_loss_scaler scaler; /* when scaling */
  int64_t max_skipped;   /* skipped steps in a row that fail the run */
  int window_finite;     /* every gradient of the window was finite */
  double t0;
  tally epoch_t, interval_t;
  kn_callback_state callbacks;
  int64_t last_checkpoint;
  char last_checkpoint_name[256]; /* for a numerics error: where to resume from */
  kn_profile *profile;            /* while profiling steps */
  int profile_written;
  double step_start;
  kn_dist *dist;     /* replicas and processes; NULL for one replica */
  kn_ps *ps;         /* parameter_server: the servers apply the updates; else NULL */
  int stop_anywhere; /* with dist: a stop was requested on some process */
  char *err;
  size_t errlen;
} run;

static double elapsed(const run *r) {
  return now_seconds() - r->t0;
}

/* Sums a tally over every process, in place. */
static int global_tally(run *r, tally *t) {
  double v[6] = {t->loss, (double)t->rows, (double)t->correct, (double)t->top_k, t->sq, t->abs};
  int rc = kn_dist_sum(r->dist, v, 6, r->err, r->errlen);
  *t = (tally){.loss = v[0],
               .rows = (int64_t)v[1],
               .correct = (int64_t)v[2],
               .top_k = (int64_t)v[3],
               .sq = v[4],
               .abs = v[5]};
  return rc;
}

/* Rows start .. start + count - 1 of b, as a batch of their own. */
static kn_batch sub_batch(const kn_model *m, const kn_batch *b, int start, int count) {
  kn_batch part = *b;
  const size_t width = (size_t)m->n_outputs;
  part.rows = count;
  part.x = b->x + (size_t)start * m->example_size;
  part.y = b->y ? b->y + start : NULL;
  part.y_onehot = b->y_onehot ? b->y_onehot + (size_t)start * width : NULL;
  part.targets = b->targets ? b->targets + (size_t)start * width : NULL;
  return part;
}

/* Runs each replica on its slice of b (this process's part of the global
 * batch) and adds the slices to t1 and t2 (may be NULL). A training run
 * then makes the replicas' gradients one in the model's flat buffer;
 * sums[] are the rows, loss x rows and stop requests over every replica
 * and process. */
static int replicas_run(run *r, kn_run_mode mode, const kn_batch *b, tally *t1, tally *t2,
                        double sums[KN_DIST_SUMS]) {
  const int n = kn_dist_local(r->dist);
  int rows[KN_DIST_MAX_LOCAL];
  kn_batch parts[KN_DIST_MAX_LOCAL];
  for (int i = 0; i < n; i++) {
    int start;
    kn_dist_slice(r->dist, i, b->rows, &start, &rows[i]);
    parts[i] = sub_batch(r->m, b, start, rows[i]);
    if (rows[i] > 0) feed(kn_dist_model(r->dist, i), &parts[i]);
  }
  int rc = kn_dist_run(r->dist, mode, rows, r->err, r->errlen);
  if (rc) return rc;
  sums[0] = sums[1] = 0.0;
  for (int i = 0; i < n; i++) {
    if (rows[i] == 0) continue;
    kn_model *replica = kn_dist_model(r->dist, i);
    const float loss = *(float *)kn_node_data(replica->graph, replica->loss);
    sums[0] += rows[i];
    sums[1] += (double)loss * rows[i];
    tally_batch(replica, t1, &parts[i], loss, r->metrics, r->top_k);
    if (t2) tally_batch(replica, t2, &parts[i], loss, r->metrics, r->top_k);
  }
  sums[2] = r->cfg->stop_request && *r->cfg->stop_request;
  if (mode != KN_RUN_TRAIN) return KN_OK;
  rc = kn_dist_reduce(r->dist, rows, sums, r->err, r->errlen);
  r->stop_anywhere = sums[2] > 0;
  return rc;
}

/* One training batch over the replicas: the global batch's rows and mean
 * loss, the aggregated gradient in the model's flat buffer. */
static int replicas_train(run *r, const kn_batch *b, int *rows, float *loss) {
  double sums[KN_DIST_SUMS];
  int rc = replicas_run(r, KN_RUN_TRAIN, b, &r->epoch_t, &r->interval_t, sums);
  *rows = (int)sums[0];
  *loss = sums[0] > 0 ? (float)(sums[1] / sums[0]) : 0.0f;
  return rc;
}

/* Loss and metrics over the validation data: the model alone, or each
 * replica on its slice of every batch, summed over every process. */
static int evaluate_run(run *r, tally *t) {
  if (!r->dist)
    return evaluate_pipeline(r->m, r->val_pipe, r->metrics, r->top_k, t, r->err, r->errlen);
  kn_pipeline_state start = {0, 0, 0};
  int rc = kn_pipeline_restore(r->val_pipe, &start, r->err, r->errlen);
  memset(t, 0, sizeof *t);
  kn_batch b;
  double sums[KN_DIST_SUMS];
  while (!rc && kn_pipeline_next(r->val_pipe, &b) == 1)
    rc = replicas_run(r, KN_RUN_FORWARD, &b, t, NULL, sums);
  return rc ? rc : global_tally(r, t);
}

/* Whether to stop after this step: asked here, or on any process. */
static int stop_wanted(const run *r) {
  if (r->dist) return r->stop_anywhere;
  return r->cfg->stop_request && *r->cfg->stop_request;
}

/* A tally to report: t itself, or its sum over every process. */
static int report_tally(run *r, const tally *t, tally *out) {
  *out = *t;
  return r->dist ? global_tally(r, out) : KN_OK;
}

/* Writes the training state, then the weights beside it, and reports the
 * checkpoint: the weights file appears last, so a checkpoint that can be
 * seen can be resumed. A mid-epoch checkpoint carries the partial epoch's
 * and interval's sums. */
static int save_checkpoint(run *r, int mid_epoch) {
  const kn_train_config *cfg = r->cfg;
  char path[4096], state_path[4200], step_str[32], state_str[96];
  snprintf(path, sizeof path, "%s/%s-%08lld.safetensors", cfg->checkpoint_dir,
           cfg->checkpoint_prefix ? cfg->checkpoint_prefix : "ckpt", (long long)r->step);
  kn_train_state st = {.step = r->step, .callbacks = r->callbacks};
  tally epoch_t, interval_t; /* over every process */
  int rc = report_tally(r, &r->epoch_t, &epoch_t);
  if (!rc) rc = report_tally(r, &r->interval_t, &interval_t);
  if (rc) return rc;
  if (r->dist && kn_dist_rank(r->dist) != 0) { /* rank 0 writes */
    r->last_checkpoint = r->step;
    return KN_OK;
  }
  /* The servers hold the parameters and the optimizer state. */
  if (r->ps && (rc = kn_ps_gather(r->ps, kn_params(r->m->graph), r->opt, r->err, r->errlen)) != 0)
    return rc;
  if (mid_epoch) {
    st.epoch = epoch_t;
    st.interval = interval_t;
  }
  /* Where the data stream stands, so a resume sees the batches that follow. */
  kn_pipeline_save(r->pipe, &st.pipeline);
  st.train_runs = r->m->graph->train_runs;
  if (r->scaling) {
    st.loss_scale = r->scaler.scale;
    st.loss_scale_good_steps = r->scaler.good_steps;
    st.loss_scale_skipped = r->scaler.skipped;
    st.loss_scale_skipped_in_a_row = r->scaler.skipped_in_a_row;
  }
  kn_train_state_path(path, state_path, sizeof state_path);
  rc = kn_train_state_write(state_path, &st, r->opt, r->err, r->errlen);
  if (rc) return rc;
  snprintf(step_str, sizeof step_str, "%lld", (long long)st.step);
  kn_pipeline_state_format(&st.pipeline, state_str, sizeof state_str);
  const char *slash = strrchr(state_path, '/');
  const char *keys[] = {"format", "step", "pipeline_state", "train_state"};
  const char *values[] = {"pt", step_str, state_str, slash ? slash + 1 : state_path};
  kn_checkpoint_info info;
  rc = kn_checkpoint_write(r->m->graph, path, 4, keys, values, &info, r->err, r->errlen);
  if (rc) return rc;
  r->last_checkpoint = r->step;
  slash = strrchr(path, '/');
  snprintf(r->last_checkpoint_name, sizeof r->last_checkpoint_name, "%.200s",
           slash ? slash + 1 : path);
  if (r->cb) {
    kn_train_event ev = {.kind = KN_EVENT_CHECKPOINT, .step = st.step, .path = path};
    ev.checkpoint = &info;
    ev.seconds = elapsed(r);
    r->cb(&ev, r->user);
  }
  return KN_OK;
}

/* Loads a checkpoint's weights and its training state (into st and opt). */
static int load_checkpoint(kn_model *m, const char *path, kn_optimizer *opt, kn_train_state *st,
                           char *err, size_t errlen) {
  char state_path[4200];
  kn_train_state_path(path, state_path, sizeof state_path);
  kn_checkpoint_meta meta;
  int rc = kn_train_state_read(state_path, st, opt, err, errlen);
  if (!rc) rc = kn_checkpoint_read(m->graph, path, &meta, err, errlen);
  if (rc) return rc;
  const char *step = kn_checkpoint_meta_get(&meta, "step");
  if (!step || strtoll(step, NULL, 10) != st->step) {
    snprintf(err, errlen, "resume: %s is at step %s but its training state %s at step %lld", path,
             step ? step : "(none)", state_path, (long long)st->step);
    return KN_EFORMAT;
  }
  m->graph->train_runs = st->train_runs;
  return KN_OK;
}

/* Checks the loop options against the model and data. */
static int check_loop_options(const kn_train_config *cfg, unsigned metrics, int has_val, char *err,
                              size_t errlen) {
  if (cfg->accumulation_steps < 0 || !(cfg->clip_global_norm >= 0) || cfg->eval_every_steps < 0 ||
      cfg->top_k < 0) {
    snprintf(err, errlen,
             "train: accumulation_steps, clip_global_norm, eval_every_steps and top_k must be "
             ">= 0");
    return KN_EINVAL;
  }
  const kn_early_stopping *e = &cfg->early_stopping;
  const kn_reduce_on_plateau *p = &cfg->plateau;
  if (e->enabled && !epoch_reports(metrics, has_val, e->monitor)) {
    snprintf(err, errlen, "train: early stopping monitors '%s', which this run does not report",
             e->monitor);
    return KN_EINVAL;
  }
  if (p->enabled && !epoch_reports(metrics, has_val, p->monitor)) {
    snprintf(err, errlen, "train: reduce-on-plateau monitors '%s', which this run does not report",
             p->monitor);
    return KN_EINVAL;
  }
  if (p->enabled && (cfg->schedule.type != KN_SCHEDULE_CONSTANT || cfg->schedule.warmup_steps)) {
    snprintf(err, errlen, "train: reduce-on-plateau cannot be combined with a schedule");
    return KN_EINVAL;
  }
  return KN_OK;
}

/* The rate for the next update: the schedule's at this step, or what
 * reduce-on-plateau has set. */
static float current_lr(const run *r) {
  if (r->cfg->plateau.enabled) return (float)r->callbacks.lr;
  return (float)kn_lr_at(&r->cfg->schedule, r->cfg->optimizer.learning_rate, r->step);
}

/* Scales g in place to the global L2 norm max_norm when it is above it. */
static void clip_global_norm(float *g, size_t n, double max_norm) {
  double sum = 0.0;
  for (size_t i = 0; i < n; i++) sum += (double)g[i] * g[i];
  const double norm = sqrt(sum);
  if (!(norm > max_norm)) return; /* NaN norms pass through to the optimizer unchanged */
  const float scale = (float)(max_norm / norm);
  for (size_t i = 0; i < n; i++) g[i] *= scale;
}

/* Adds the batch just run to the window's gradient sums. */
static void accumulate(run *r, int rows) {
  const float *g = kn_grads(r->m->graph);
  const size_t n = kn_param_count(r->m->graph);
  const float w = (float)rows;
  if (r->window_batches == 0) {
    for (size_t i = 0; i < n; i++) r->acc[i] = g[i] * w;
  } else {
    for (size_t i = 0; i < n; i++) r->acc[i] += g[i] * w;
  }
  r->window_rows += rows;
  r->window_batches++;
}

/* One optimizer step from the window's gradients: here, or on the
 * parameter servers. */
static int update(run *r) {
  kn_graph *g = r->m->graph;
  float *grads = kn_grads(g);
  const size_t n = kn_param_count(g);
  if (r->acc) { /* the row-weighted mean over the window, as one big batch's */
    const float inv = 1.0f / (float)r->window_rows;
    for (size_t i = 0; i < n; i++) grads[i] = r->acc[i] * inv;
  }
  /* A step whose scaled gradients overflowed is skipped (and the scale
   * halved); it still counts as a step of the epoch. */
  const int apply = !r->scaling || r->window_finite;
  if (r->scaling) {
    kn_loss_scaler_update(&r->scaler, r->window_finite);
    kn_graph_set_loss_scale(g, (float)r->scaler.scale);
    r->window_finite = 1;
  }
  if (apply && r->cfg->clip_global_norm > 0) clip_global_norm(grads, n, r->cfg->clip_global_norm);
  kn_optimizer_set_learning_rate(r->opt, current_lr(r));
  int rc = KN_OK;
  if (apply && r->ps) {
    int stop = 0;
    const int flags = (r->window_rows > 0 ? KN_PS_EXAMPLES : 0) |
                      (r->cfg->stop_request && *r->cfg->stop_request ? KN_PS_STOP_REQUEST : 0);
    rc = kn_ps_step(r->ps, kn_params(g), grads, kn_optimizer_learning_rate(r->opt), r->step + 1,
                    flags, &stop, r->err, r->errlen);
    if (r->cfg->dist.ps_async) r->stop_anywhere = stop; /* agreed through the servers */
  } else if (apply) {
    kn_optimizer_step(r->opt, kn_params(g), grads);
  }
  r->step++;
  r->window_rows = 0;
  r->window_batches = 0;
  return rc;
}

static void notice(run *r, int epoch, const char *code, const char *message) {
  if (!r->cb) return;
  kn_train_event ev = {
      .kind = KN_EVENT_NOTICE, .epoch = epoch, .step = r->step, .code = code, .message = message};
  ev.seconds = elapsed(r);
  r->cb(&ev, r->user);
}

static double event_value(const kn_train_event *ev, const char *name) {
  for (int i = 0; i < ev->n_metrics; i++)
    if (strcmp(ev->names[i], name) == 0) return ev->values[i];
  return NAN;
}

/* The callbacks at an epoch's end; returns 1 when early stopping ends the
 * run. */
static int end_of_epoch_callbacks(run *r, const kn_train_event *ev) {
  const kn_train_config *cfg = r->cfg;
  char msg[256];
  if (kn_plateau_update(&cfg->plateau, &r->callbacks, event_value(ev, cfg->plateau.monitor))) {
    snprintf(msg, sizeof msg,
             "reduce-on-plateau: %s has not improved for %d epochs; learning rate now %g",
             cfg->plateau.monitor, cfg->plateau.patience, r->callbacks.lr);
    notice(r, ev->epoch, "LR_REDUCED", msg);
  }
  if (kn_early_stopping_update(&cfg->early_stopping, &r->callbacks,
                               event_value(ev, cfg->early_stopping.monitor))) {
    snprintf(msg, sizeof msg,
             "early stopping at epoch %d: %s has not improved by more than %g for %d epochs "
             "(best %g)",
             ev->epoch, cfg->early_stopping.monitor, cfg->early_stopping.min_delta,
             cfg->early_stopping.patience, r->callbacks.stop_best);
    notice(r, ev->epoch, "EARLY_STOPPED", msg);
    return 1;
  }
  return 0;
}

/* Writes the profile's trace and table and says where. */
static int write_profile(run *r, int epoch) {
  const kn_train_config *cfg = r->cfg;
  r->profile_written = 1;
  kn_profile_record(r->profile, r->step, 0);
  int rc = kn_profile_write_trace(r->profile, r->m->graph, cfg->profile_path, r->err, r->errlen);
  if (!rc && cfg->profile_table_path)
    rc = kn_profile_write_table(r->profile, r->m->graph, cfg->profile_table_path, 30, r->err,
                                r->errlen);
  if (rc) return rc;
  char msg[512];
  snprintf(msg, sizeof msg, "profile of steps %lld to %lld written to %.200s",
           (long long)cfg->profile_first,
           (long long)(r->step < cfg->profile_last ? r->step : cfg->profile_last),
           cfg->profile_path);
  notice(r, epoch, "PROFILE_WRITTEN", msg);
  return KN_OK;
}

/* Events a profile will hold (nodes and phases of every run of every
 * profiled step), capped: past the cap recording grows as it goes. */
static size_t profile_events(const kn_train_config *cfg, const kn_graph *g, int accum) {
  const double want =
      (double)(cfg->profile_last - cfg->profile_first + 1) * accum * (g->n_nodes + 8);
  return want < (double)(1 << 20) ? (size_t)want : (size_t)1 << 20;
}

/* Recording follows the step about to be made: on inside the profiled
 * range, off outside it. */
static void profile_step_begins(run *r) {
  if (!r->profile || r->window_batches > 0) return;
  const int64_t next = r->step + 1;
  kn_profile_record(r->profile, next,
                    next >= r->cfg->profile_first && next <= r->cfg->profile_last);
  r->step_start = kn_profile_now();
}

static void free_run(run *r) {
  if (r->profile) kn_graph_set_profile(r->m->graph, NULL);
  kn_profile_free(r->profile);
  kn_pipeline_free(r->pipe);
  kn_pipeline_free(r->val_pipe);
  kn_optimizer_free(r->opt);
  free(r->acc);
  if (r->dist && r->cfg->dist.comm_seconds)
    *r->cfg->dist.comm_seconds = kn_dist_comm_seconds(r->dist) + kn_ps_comm_seconds(r->ps);
  kn_ps_free(r->ps);
  kn_dist_free(r->dist);
}

/* Where a run that failed numerically can resume from. */
static void last_good_checkpoint(const run *r, char *where, size_t len) {
  if (r->last_checkpoint >= 0)
    snprintf(where, len, "the last good checkpoint is %s (step %lld)", r->last_checkpoint_name,
             (long long)r->last_checkpoint);
  else
    snprintf(where, len, "no checkpoint was written before it");
}

static int numeric_error(run *r, float loss, int epoch) {
  char where[320];
  last_good_checkpoint(r, where, sizeof where);
  snprintf(r->err, r->errlen, "loss became %f at step %lld (epoch %d); %s", loss,
           (long long)r->step + 1, epoch, where);
  return KN_ENUMERIC;
}

/* Under loss scaling: the step just made was one more skipped in a row,
 * and the bound is reached. */
static int skipped_steps_error(run *r, int epoch) {
  char where[320];
  last_good_checkpoint(r, where, sizeof where);
  snprintf(r->err, r->errlen,
           "mixed_float16: %lld steps in a row were skipped for a non-finite loss or gradients, "
           "up to step %lld (epoch %d), with the loss scale at %g; the run diverged; %s",
           (long long)r->scaler.skipped_in_a_row, (long long)r->step, epoch, r->scaler.scale,
           where);
  return KN_ENUMERIC;
}

int kn_train(kn_model *m, const kn_dataset *train, const kn_dataset *val,
             const kn_train_config *cfg, kn_train_callback cb, void *user, char *err,
             size_t errlen) {
  int rc = check_fit(m, train, "train", err, errlen);
  if (!rc && val) rc = check_fit(m, val, "validation", err, errlen);
  if (rc) return rc;
  int batch = planned_batch(m);
  if (cfg->batch_size != batch) {
    snprintf(err, errlen, "train: batch_size %d differs from the model's planned %d",
             cfg->batch_size, batch);
    return KN_EINVAL;
  }
  if (cfg->epochs < 1 || train->n < 1) {
    snprintf(err, errlen, "train: need epochs >= 1 and a non-empty dataset");
    return KN_EINVAL;
  }
  run r = {.m = m, .cfg = cfg, .cb = cb, .user = user, .err = err, .errlen = errlen};
  r.last_checkpoint = -1;
  r.top_k = cfg->top_k > 0 ? cfg->top_k : 5;
  r.accum = cfg->accumulation_steps > 1 ? cfg->accumulation_steps : 1;
  r.report_lr = cfg->plateau.enabled || cfg->schedule.type != KN_SCHEDULE_CONSTANT ||
                cfg->schedule.warmup_steps > 0;
  r.scaling = kn_graph_precision(m->graph) == KN_PRECISION_MIXED_FLOAT16;
  r.window_finite = 1;
  if (cfg->initial_loss_scale < 0 || cfg->loss_scale_growth_interval < 0 ||
      cfg->loss_scale_max_skipped_steps < 0) {
    snprintf(err, errlen,
             "train: initial_loss_scale, loss_scale_growth_interval and "
             "loss_scale_max_skipped_steps must be >= 0");
    return KN_EINVAL;
  }
  kn_loss_scaler_init(&r.scaler, cfg->initial_loss_scale, cfg->loss_scale_growth_interval);
  r.max_skipped = cfg->loss_scale_max_skipped_steps > 0 ? cfg->loss_scale_max_skipped_steps
                                                        : DEFAULT_MAX_SKIPPED;
  rc = resolve_metrics(m, cfg->metrics, &r.metrics, err, errlen);
  if (!rc) rc = check_loop_options(cfg, r.metrics, val != NULL, err, errlen);
  const int replicated =
      cfg->dist.n_replicas > 1 || cfg->dist.world_size > 1 || cfg->dist.ps_servers > 0;
  if (!rc && replicated && r.scaling) {
    snprintf(err, errlen,
             "train: mixed_float16's loss scaling trains one replica for now; use "
             "mixed_bfloat16 with replicas");
    rc = KN_EINVAL;
  }
  if (!rc && cfg->dist.ps_servers > 0) rc = kn_ps_check(cfg, kn_param_count(m->graph), err, errlen);
  if (!rc && kn_ps_is_server(&cfg->dist)) /* a parameter server trains nothing itself */
    return kn_ps_serve(cfg, kn_param_count(m->graph), err, errlen);
  if (!rc && replicated) rc = kn_dist_new(m, batch, &cfg->dist, &r.dist, err, errlen);
  if (rc) return rc;
  kn_pipeline_config pc;
  if (cfg->pipeline) {
    pc = *cfg->pipeline;
  } else {
    kn_pipeline_config_default(&pc);
    pc.shuffle_buffer = cfg->shuffle ? train->n : 0;
    pc.drop_remainder = cfg->drop_remainder;
    pc.num_parallel_calls = 0;
  }
  pc.batch_size = batch * (r.dist ? kn_dist_total(r.dist) : 1); /* the global batch */
  if (r.dist) { /* each process reads only its own part of every global batch */
    pc.part_count = kn_dist_total(r.dist) / kn_dist_local(r.dist);
    pc.part_index = kn_dist_rank(r.dist);
  }
  pc.repeat = cfg->epochs;
  /* Several sigmoid or softmax outputs read one-hot rows of their width. */
  if ((m->loss_kind == KN_LOSS_XENT || m->loss_kind == KN_LOSS_BCE) && m->n_outputs > 1) {
    pc.one_hot = 1;
    pc.one_hot_depth = m->n_outputs;
  } else if (pc.one_hot && pc.one_hot_depth == 0) {
    pc.one_hot_depth = m->n_outputs > 1 ? m->n_outputs : 0;
  }
  pc.seed = cfg->seed ^ 0x5eedda7aULL; /* data order apart from the init stream */
  if (!rc) rc = kn_pipeline_new(train, &pc, &r.pipe, err, errlen);
  if (!rc && val) rc = kn_pipeline_new_eval(r.pipe, val, &r.val_pipe, err, errlen);
  if (!rc) rc = kn_optimizer_new(&cfg->optimizer, kn_param_count(m->graph), &r.opt, err, errlen);
  /* One profile per job: rank 0's (the others would write the same path). */
  const int profiled = cfg->profile_first > 0 && (!r.dist || kn_dist_rank(r.dist) == 0);
  if (!rc && profiled) {
    if (!cfg->profile_path || cfg->profile_last < cfg->profile_first) {
      snprintf(err, errlen, "train: a profile needs a path and profile_last >= profile_first");
      rc = KN_EINVAL;
    } else if (!(r.profile = kn_profile_new()) ||
               kn_profile_reserve(r.profile, profile_events(cfg, m->graph, r.accum)) != 0) {
      snprintf(err, errlen, "train: out of memory for the profile");
      rc = KN_ENOMEM;
    } else {
      kn_graph_set_profile(m->graph, r.profile);
    }
  }
  if (!rc && r.accum > 1) {
    r.acc = malloc(kn_param_count(m->graph) * sizeof(float));
    if (!r.acc) {
      snprintf(err, errlen, "train: out of memory for the accumulated gradients");
      rc = KN_ENOMEM;
    }
  }
  if (rc) {
    free_run(&r);
    return rc;
  }
  /* Batches per epoch, and optimizer steps: an epoch's last window may be
   * shorter than accum. */
  const int64_t batches = kn_pipeline_batches_per_epoch(r.pipe);
  const int64_t steps_per_epoch = (batches + r.accum - 1) / r.accum;
  int first_epoch = 1, tuning_reported = 0;
  int64_t first_batch = 0;
  kn_train_state saved = {0};
  kn_callbacks_init(cfg, &saved.callbacks);
  kn_pipeline_state resume_at;
  const kn_pipeline_state *resume = cfg->resume;
  if (cfg->resume_from) {
    rc = load_checkpoint(m, cfg->resume_from, r.opt, &saved, err, errlen);
    if (!rc && r.dist) rc = kn_dist_sync(r.dist, err, errlen);
    if (r.dist && kn_dist_rank(r.dist) != 0) { /* rank 0 holds the partial sums */
      kn_callback_state callbacks = saved.callbacks;
      const kn_pipeline_state at = saved.pipeline;
      const int64_t step = saved.step;
      const uint64_t runs = saved.train_runs;
      saved = (kn_train_state){.step = step, .train_runs = runs, .callbacks = callbacks};
      saved.pipeline = at;
    }
    resume_at = saved.pipeline;
    resume = &resume_at;
  }
  if (!rc && resume) rc = kn_pipeline_restore(r.pipe, resume, err, errlen);
  if (rc) {
    free_run(&r);
    return rc;
  }
  r.callbacks = saved.callbacks;
  if (cfg->resume_from && saved.loss_scale > 0) {
    r.scaler.scale = saved.loss_scale;
    r.scaler.good_steps = saved.loss_scale_good_steps;
    r.scaler.skipped = saved.loss_scale_skipped;
    r.scaler.skipped_in_a_row = saved.loss_scale_skipped_in_a_row;
  }
  kn_graph_set_loss_scale(m->graph, r.scaling ? (float)r.scaler.scale : 1.0f);
  if (resume) {
    first_epoch = (int)resume->epoch + 1;
    first_batch = resume->batch;
    r.step = cfg->resume_from
                 ? saved.step
                 : resume->epoch * steps_per_epoch + (first_batch + r.accum - 1) / r.accum;
  }
  if (cfg->dist.ps_servers > 0 &&
      (rc = kn_ps_new(cfg, kn_params(m->graph), kn_param_count(m->graph), r.opt, r.step, &r.ps, err,
                      errlen)) != 0) {
    free_run(&r);
    return rc;
  }
  r.t0 = now_seconds();
  const int log_every = cfg->log_every_steps > 0 ? cfg->log_every_steps : 50;
  const int every = cfg->checkpoint_dir ? cfg->checkpoint_every_steps : 0;
  int stop = 0, stop_requested = 0;
  for (int epoch = first_epoch; epoch <= cfg->epochs && !rc && !stop; epoch++) {
    memset(&r.epoch_t, 0, sizeof r.epoch_t);
    memset(&r.interval_t, 0, sizeof r.interval_t);
    if (cfg->resume_from && epoch == first_epoch && first_batch > 0) {
      r.epoch_t = saved.epoch;
      r.interval_t = saved.interval;
    }
    for (int64_t s = epoch == first_epoch ? first_batch : 0; s < batches && !rc && !stop; s++) {
      kn_batch b;
      profile_step_begins(&r);
      double t = kn_profile_now();
      if (kn_pipeline_next(r.pipe, &b) != 1) {
        snprintf(err, errlen, "train: the pipeline ended early, at epoch %d batch %lld", epoch,
                 (long long)s + 1);
        rc = KN_ESTATE;
        break;
      }
      kn_profile_phase(r.profile, "data", t, kn_profile_now());
      int rows = b.rows;
      t = kn_profile_now();
      if (!r.dist) feed(m, &b);
      kn_profile_phase(r.profile, "feed", t, kn_profile_now());
      if (cfg->on_tuned && !tuning_reported) {
        kn_pipeline_stats ps;
        kn_pipeline_stats_get(r.pipe, &ps);
        if (ps.tuned) {
          cfg->on_tuned(&ps, user);
          tuning_reported = 1;
        }
      }
      float loss = 0.0f;
      rc = r.dist ? replicas_train(&r, &b, &rows, &loss)
                  : kn_graph_run(m->graph, KN_RUN_TRAIN, rows, err, errlen);
      if (rc) break;
      if (!r.dist) loss = *(float *)kn_node_data(m->graph, m->loss);
      if (!isfinite(loss) && !r.scaling) {
        rc = numeric_error(&r, loss, epoch);
        break;
      }
      t = kn_profile_now();
      if (r.scaling) {
        /* Inside loss scaling an overflow is a skipped step, not an error. */
        const int finite =
            kn_loss_scaler_unscale(&r.scaler, kn_grads(m->graph), kn_param_count(m->graph));
        r.window_finite &= finite && isfinite(loss);
      }
      if (isfinite(loss) && !r.dist) { /* replicas tally their own slices */
        tally_batch(m, &r.epoch_t, &b, loss, r.metrics, r.top_k);
        tally_batch(m, &r.interval_t, &b, loss, r.metrics, r.top_k);
      }
      kn_profile_phase(r.profile, "metrics", t, kn_profile_now());
      const int last_batch = s + 1 == batches;
      t = kn_profile_now();
      if (r.acc)
        accumulate(&r, rows);
      else
        r.window_rows = rows; /* the step's examples, for a parameter server */
      if (r.acc && r.window_batches < r.accum && !last_batch) {
        kn_profile_phase(r.profile, "optimizer", t, kn_profile_now());
        continue;
      }
      if ((rc = update(&r)) != 0) break;
      if (r.scaling && r.scaler.skipped_in_a_row >= r.max_skipped) {
        rc = skipped_steps_error(&r, epoch);
        break;
      }
      if (r.dist && (rc = kn_dist_sync(r.dist, err, errlen)) != 0) break;
      if (kn_profile_recording(r.profile)) {
        const double end = kn_profile_now();
        kn_profile_phase(r.profile, "optimizer", t, end);
        kn_profile_phase(r.profile, "step", r.step_start, end);
        kn_profile_record(r.profile, r.step, 0); /* validation after a step is not the step's */
        if (r.step == cfg->profile_last && (rc = write_profile(&r, epoch)) != 0) break;
      }
      if (cb && r.step % log_every == 0) {
        kn_train_event ev = {.kind = KN_EVENT_STEP, .epoch = epoch, .step = r.step};
        tally interval_t;
        if ((rc = report_tally(&r, &r.interval_t, &interval_t)) != 0) break;
        put_metrics(m, &ev, &interval_t, r.metrics, step_names);
        if (r.report_lr) put_metric(&ev, "learning_rate", kn_optimizer_learning_rate(r.opt));
        if (r.scaling) {
          put_metric(&ev, "loss_scale", r.scaler.scale);
          put_metric(&ev, "skipped_steps", (double)r.scaler.skipped);
        }
        ev.seconds = elapsed(&r);
        stop = cb(&ev, user);
        memset(&r.interval_t, 0, sizeof r.interval_t);
      }
      /* A pass at an epoch's last step is the epoch's own validation. */
      if (val && cfg->eval_every_steps > 0 && r.step % cfg->eval_every_steps == 0 && !last_batch) {
        tally val_t;
        rc = evaluate_run(&r, &val_t);
        if (rc) break;
        kn_train_event ev = {.kind = KN_EVENT_EVAL, .epoch = epoch, .step = r.step};
        put_metrics(m, &ev, &val_t, r.metrics, val_names);
        ev.seconds = elapsed(&r);
        if (cb && cb(&ev, user)) stop = 1;
      }
      if (stop_wanted(&r)) stop_requested = 1;
      /* A checkpoint on an epoch's last step waits for the epoch's end. */
      if ((stop_requested || (every > 0 && r.step % every == 0)) && !last_batch &&
          cfg->checkpoint_dir)
        rc = save_checkpoint(&r, 1);
      if (stop_requested && !last_batch) stop = 1;
    }
    if (rc || stop) break;
    kn_train_event ev = {.kind = KN_EVENT_EPOCH, .epoch = epoch, .step = r.step};
    tally epoch_t;
    if ((rc = report_tally(&r, &r.epoch_t, &epoch_t)) != 0) break;
    put_metrics(m, &ev, &epoch_t, r.metrics, epoch_names);
    if (val) {
      tally val_t;
      rc = evaluate_run(&r, &val_t);
      if (rc) break;
      put_metrics(m, &ev, &val_t, r.metrics, val_names);
    }
    if (r.scaling) put_metric(&ev, "skipped_steps", (double)r.scaler.skipped);
    ev.seconds = elapsed(&r);
    if (cb) stop = cb(&ev, user);
    if (end_of_epoch_callbacks(&r, &ev)) stop = 1;
    if (stop_wanted(&r)) stop_requested = stop = 1;
    if ((stop_requested || (every > 0 && r.step % every == 0)) && epoch < cfg->epochs &&
        cfg->checkpoint_dir)
      rc = save_checkpoint(&r, 0);
  }
  /* A request that came after the last step stops nothing: the run is done. */
  if (!rc && stop_requested && r.step < (int64_t)cfg->epochs * steps_per_epoch) {
    snprintf(err, errlen, "train: stopped on request at step %lld%s", (long long)r.step,
             r.last_checkpoint == r.step ? ", checkpoint written" : "");
    rc = KN_ESTOPPED;
  }
  if (!rc && cfg->checkpoint_dir && r.last_checkpoint != r.step) rc = save_checkpoint(&r, 0);
  /* A run that ended inside the profiled range still leaves its profile. */
  if (!rc && r.profile && !r.profile_written && r.step >= cfg->profile_first)
    rc = write_profile(&r, cfg->epochs);
  free_run(&r);
  return rc;
}
