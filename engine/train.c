/* train.c — the training loop: batches from the input pipeline copied into
 * the graph's input, one forward+backward run and one optimizer step per
 * batch, interval and epoch metrics, validation, and the final checkpoint.
 * All buffers are allocated before the first step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
typedef struct tally {
  double loss;  /* loss x rows */
  int64_t rows; /* examples */
  int64_t correct;
  double sq, abs; /* regression errors, over rows x outputs values */
} tally;

static void tally_batch(kn_model *m, tally *t, const kn_batch *b, float loss, unsigned metrics) {
  t->loss += (double)loss * b->rows;
  t->rows += b->rows;
  if (metrics & KN_METRIC_ACCURACY) t->correct += count_correct(m, b->y, b->rows);
  if (metrics & (KN_METRIC_MSE | KN_METRIC_MAE))
    add_errors(m, b->targets, b->rows, &t->sq, &t->abs);
}

/* Appends prefix+loss and prefix+each metric to the event. */
static void put_metrics(kn_model *m, kn_train_event *ev, const tally *t, unsigned metrics,
                        const char *const names[4]) {
  const double rows = t->rows > 0 ? (double)t->rows : 1.0;
  const double values = rows * (double)m->n_outputs;
  ev->names[ev->n_metrics] = names[0];
  ev->values[ev->n_metrics++] = t->loss / rows;
  if (metrics & KN_METRIC_ACCURACY) {
    ev->names[ev->n_metrics] = names[1];
    ev->values[ev->n_metrics++] = (double)t->correct / rows;
  }
  if (metrics & KN_METRIC_MSE) {
    ev->names[ev->n_metrics] = names[2];
    ev->values[ev->n_metrics++] = t->sq / values;
  }
  if (metrics & KN_METRIC_MAE) {
    ev->names[ev->n_metrics] = names[3];
    ev->values[ev->n_metrics++] = t->abs / values;
  }
}

static const char *const step_names[4] = {"loss", "accuracy", "mse", "mae"};
static const char *const epoch_names[4] = {"epoch_loss", "epoch_accuracy", "epoch_mse",
                                           "epoch_mae"};
static const char *const val_names[4] = {"val_loss", "val_accuracy", "val_mse", "val_mae"};

/* The metrics a run reports: the asked ones, checked against the loss. */
static int resolve_metrics(const kn_model *m, unsigned asked, unsigned *out, char *err,
                           size_t errlen) {
  const int regression = kn_loss_is_regression(m->loss_kind);
  if (asked == 0) asked = regression ? 0u : KN_METRIC_ACCURACY;
  if (asked & ~(unsigned)(KN_METRIC_ACCURACY | KN_METRIC_MSE | KN_METRIC_MAE)) {
    snprintf(err, errlen, "train: unknown metrics 0x%x", asked);
    return KN_EINVAL;
  }
  if (regression && (asked & KN_METRIC_ACCURACY)) {
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
static int evaluate_pipeline(kn_model *m, kn_pipeline *pipe, unsigned metrics, tally *t, char *err,
                             size_t errlen) {
  kn_pipeline_state start = {0, 0, 0};
  int rc = kn_pipeline_restore(pipe, &start, err, errlen);
  if (rc) return rc;
  memset(t, 0, sizeof *t);
  kn_batch b;
  while (kn_pipeline_next(pipe, &b) == 1) {
    feed(m, &b);
    rc = kn_graph_run(m->graph, KN_RUN_FORWARD, b.rows, err, errlen);
    if (rc) return rc;
    tally_batch(m, t, &b, *(float *)kn_node_data(m->graph, m->loss), metrics);
  }
  return KN_OK;
}

/* Writes the training state, then the weights beside it, and reports the
 * checkpoint: the weights file appears last, so a checkpoint that can be
 * seen can be resumed. */
static int save_checkpoint(kn_model *m, const kn_train_config *cfg, kn_pipeline *pipe,
                           kn_optimizer *opt, const kn_train_state *st_in, kn_train_callback cb,
                           void *user, double t0, char *err, size_t errlen) {
  char path[4096], state_path[4200], step_str[32], state_str[96];
  snprintf(path, sizeof path, "%s/%s-%08lld.safetensors", cfg->checkpoint_dir,
           cfg->checkpoint_prefix ? cfg->checkpoint_prefix : "ckpt", (long long)st_in->step);
  kn_train_state st = *st_in;
  /* Where the data stream stands, so a resume sees the batches that follow. */
  kn_pipeline_save(pipe, &st.pipeline);
  st.train_runs = m->graph->train_runs;
  kn_train_state_path(path, state_path, sizeof state_path);
  int rc = kn_train_state_write(state_path, &st, opt, err, errlen);
  if (rc) return rc;
  snprintf(step_str, sizeof step_str, "%lld", (long long)st.step);
  kn_pipeline_state_format(&st.pipeline, state_str, sizeof state_str);
  const char *slash = strrchr(state_path, '/');
  const char *keys[] = {"format", "step", "pipeline_state", "train_state"};
  const char *values[] = {"pt", step_str, state_str, slash ? slash + 1 : state_path};
  kn_checkpoint_info info;
  rc = kn_checkpoint_write(m->graph, path, 4, keys, values, &info, err, errlen);
  if (!rc && cb) {
    kn_train_event ev = {.kind = KN_EVENT_CHECKPOINT, .step = st.step, .path = path};
    ev.checkpoint = &info;
    ev.seconds = now_seconds() - t0;
    cb(&ev, user);
  }
  return rc;
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
  unsigned metrics = 0;
  rc = resolve_metrics(m, cfg->metrics, &metrics, err, errlen);
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
  pc.batch_size = batch;
  pc.repeat = cfg->epochs;
  /* Several sigmoid or softmax outputs read one-hot rows of their width. */
  if ((m->loss_kind == KN_LOSS_XENT || m->loss_kind == KN_LOSS_BCE) && m->n_outputs > 1) {
    pc.one_hot = 1;
    pc.one_hot_depth = m->n_outputs;
  } else if (pc.one_hot && pc.one_hot_depth == 0) {
    pc.one_hot_depth = m->n_outputs > 1 ? m->n_outputs : 0;
  }
  pc.seed = cfg->seed ^ 0x5eedda7aULL; /* data order apart from the init stream */
  kn_pipeline *pipe = NULL, *val_pipe = NULL;
  kn_optimizer *opt = NULL;
  rc = kn_pipeline_new(train, &pc, &pipe, err, errlen);
  if (!rc && val) rc = kn_pipeline_new_eval(pipe, val, &val_pipe, err, errlen);
  if (!rc) rc = kn_optimizer_new(&cfg->optimizer, kn_param_count(m->graph), &opt, err, errlen);
  if (rc) {
    kn_pipeline_free(pipe);
    kn_pipeline_free(val_pipe);
    return rc;
  }
  const int64_t steps_per_epoch = kn_pipeline_batches_per_epoch(pipe);
  int tuning_reported = 0, first_epoch = 1;
  int64_t first_batch = 0, step = 0;
  kn_train_state saved = {0};
  kn_pipeline_state resume_at;
  const kn_pipeline_state *resume = cfg->resume;
  if (cfg->resume_from) {
    rc = load_checkpoint(m, cfg->resume_from, opt, &saved, err, errlen);
    resume_at = saved.pipeline;
    resume = &resume_at;
  }
  if (!rc && resume) {
    rc = kn_pipeline_restore(pipe, resume, err, errlen);
    if (rc) {
      kn_pipeline_free(pipe);
      kn_pipeline_free(val_pipe);
      kn_optimizer_free(opt);
      return rc;
    }
    first_epoch = (int)resume->epoch + 1;
    first_batch = resume->batch;
    step = resume->epoch * steps_per_epoch + first_batch;
  } else if (rc) {
    kn_pipeline_free(pipe);
    kn_pipeline_free(val_pipe);
    kn_optimizer_free(opt);
    return rc;
  }
  const double t0 = now_seconds();
  int log_every = cfg->log_every_steps > 0 ? cfg->log_every_steps : 50;
  int stop = 0, stop_requested = 0;
  int64_t last_checkpoint = -1;
  const int every = cfg->checkpoint_dir ? cfg->checkpoint_every_steps : 0;
  for (int epoch = first_epoch; epoch <= cfg->epochs && !rc && !stop; epoch++) {
    tally epoch_t = {0}, interval_t = {0};
    if (cfg->resume_from && epoch == first_epoch && first_batch > 0) {
      epoch_t = (tally){.loss = saved.epoch_loss,
                        .rows = saved.epoch_rows,
                        .correct = saved.epoch_correct,
                        .sq = saved.epoch_sq,
                        .abs = saved.epoch_abs};
      interval_t = (tally){.loss = saved.interval_loss,
                           .rows = saved.interval_rows,
                           .correct = saved.interval_correct,
                           .sq = saved.interval_sq,
                           .abs = saved.interval_abs};
    }
    for (int64_t s = epoch == first_epoch ? first_batch : 0; s < steps_per_epoch && !rc && !stop;
         s++) {
      kn_batch b;
      if (kn_pipeline_next(pipe, &b) != 1) {
        snprintf(err, errlen, "train: the pipeline ended early, at epoch %d step %lld", epoch,
                 (long long)s + 1);
        rc = KN_ESTATE;
        break;
      }
      const int rows = b.rows;
      feed(m, &b);
      if (cfg->on_tuned && !tuning_reported) {
        kn_pipeline_stats ps;
        kn_pipeline_stats_get(pipe, &ps);
        if (ps.tuned) {
          cfg->on_tuned(&ps, user);
          tuning_reported = 1;
        }
      }
      rc = kn_graph_run(m->graph, KN_RUN_TRAIN, rows, err, errlen);
      if (rc) break;
      float loss = *(float *)kn_node_data(m->graph, m->loss);
      if (!isfinite(loss)) {
        snprintf(err, errlen, "loss became %f at step %lld (epoch %d)", loss, (long long)step + 1,
                 epoch);
        rc = KN_ENUMERIC;
        break;
      }
      kn_optimizer_step(opt, kn_params(m->graph), kn_grads(m->graph));
      step++;
      tally_batch(m, &epoch_t, &b, loss, metrics);
      tally_batch(m, &interval_t, &b, loss, metrics);
      if (cb && step % log_every == 0) {
        kn_train_event ev = {.kind = KN_EVENT_STEP, .epoch = epoch, .step = step};
        put_metrics(m, &ev, &interval_t, metrics, step_names);
        ev.seconds = now_seconds() - t0;
        stop = cb(&ev, user);
        memset(&interval_t, 0, sizeof interval_t);
      }
      if (cfg->stop_request && *cfg->stop_request) stop_requested = 1;
      /* A checkpoint on an epoch's last step waits for the epoch's end. */
      if ((stop_requested || (every > 0 && step % every == 0)) && s + 1 < steps_per_epoch &&
          cfg->checkpoint_dir) {
        kn_train_state st = {.step = step,
                             .epoch_loss = epoch_t.loss,
                             .interval_loss = interval_t.loss,
                             .epoch_rows = epoch_t.rows,
                             .epoch_correct = epoch_t.correct,
                             .interval_rows = interval_t.rows,
                             .interval_correct = interval_t.correct,
                             .epoch_sq = epoch_t.sq,
                             .epoch_abs = epoch_t.abs,
                             .interval_sq = interval_t.sq,
                             .interval_abs = interval_t.abs};
        rc = save_checkpoint(m, cfg, pipe, opt, &st, cb, user, t0, err, errlen);
        last_checkpoint = step;
      }
      if (stop_requested && s + 1 < steps_per_epoch) stop = 1;
    }
    if (rc || stop) break;
    kn_train_event ev = {.kind = KN_EVENT_EPOCH, .epoch = epoch, .step = step};
    put_metrics(m, &ev, &epoch_t, metrics, epoch_names);
    if (val) {
      tally val_t;
      rc = evaluate_pipeline(m, val_pipe, metrics, &val_t, err, errlen);
      if (rc) break;
      put_metrics(m, &ev, &val_t, metrics, val_names);
    }
    ev.seconds = now_seconds() - t0;
    if (cb) stop = cb(&ev, user);
    if (cfg->stop_request && *cfg->stop_request) stop_requested = stop = 1;
    if ((stop_requested || (every > 0 && step % every == 0)) && epoch < cfg->epochs &&
        cfg->checkpoint_dir) {
      kn_train_state st = {.step = step};
      rc = save_checkpoint(m, cfg, pipe, opt, &st, cb, user, t0, err, errlen);
      last_checkpoint = step;
    }
  }
  /* A request that came after the last step stops nothing: the run is done. */
  if (!rc && stop_requested && step < (int64_t)cfg->epochs * steps_per_epoch) {
    snprintf(err, errlen, "train: stopped on request at step %lld%s", (long long)step,
             last_checkpoint == step ? ", checkpoint written" : "");
    rc = KN_ESTOPPED;
  }
  if (!rc && cfg->checkpoint_dir && last_checkpoint != step) {
    kn_train_state st = {.step = step};
    rc = save_checkpoint(m, cfg, pipe, opt, &st, cb, user, t0, err, errlen);
  }
  kn_pipeline_free(pipe);
  kn_pipeline_free(val_pipe);
  kn_optimizer_free(opt);
  return rc;
}
