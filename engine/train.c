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

/* Copies a pipeline batch into the model's inputs. */
static void feed(kn_model *m, const kn_batch *b) {
  memcpy(kn_node_data(m->graph, m->x), b->x, (size_t)b->rows * m->example_size * sizeof(float));
  memcpy(kn_node_data(m->graph, m->y), b->y, (size_t)b->rows * sizeof(int32_t));
}

/* Correct predictions in the current logits: argmax against the labels. */
static int count_correct(kn_model *m, int rows) {
  const float *logits = kn_node_data(m->graph, m->logits);
  const int32_t *y = kn_node_data(m->graph, m->y);
  int correct = 0;
  for (int r = 0; r < rows; r++) {
    const float *row = logits + (size_t)r * m->n_classes;
    int best = 0;
    for (int c = 1; c < m->n_classes; c++) best = row[c] > row[best] ? c : best;
    correct += best == y[r];
  }
  return correct;
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
  if (ds->n_classes > m->n_classes) {
    snprintf(err, errlen, "%s: dataset has labels up to %d, the model only %d classes", what,
             ds->n_classes - 1, m->n_classes);
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
  int batch = planned_batch(m);
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t start = 0; start < ds->n; start += batch) {
    int rows = (int)((ds->n - start) < batch ? ds->n - start : batch);
    float *x = kn_node_data(m->graph, m->x);
    int32_t *y = kn_node_data(m->graph, m->y);
    memcpy(x, ds->x + (size_t)start * ds->example_size,
           (size_t)rows * ds->example_size * sizeof(float));
    memcpy(y, ds->y + start, (size_t)rows * sizeof(int32_t));
    rc = kn_graph_run(m->graph, KN_RUN_FORWARD, rows, err, errlen);
    if (rc) return rc;
    loss_sum += (double)*(float *)kn_node_data(m->graph, m->loss) * rows;
    correct += count_correct(m, rows);
  }
  *loss = ds->n ? loss_sum / (double)ds->n : 0.0;
  *accuracy = ds->n ? (double)correct / (double)ds->n : 0.0;
  return KN_OK;
}

/* Loss and accuracy over one pass of an evaluation pipeline. */
static int evaluate_pipeline(kn_model *m, kn_pipeline *pipe, double *loss, double *accuracy,
                             char *err, size_t errlen) {
  kn_pipeline_state start = {0, 0, 0};
  int rc = kn_pipeline_restore(pipe, &start, err, errlen);
  if (rc) return rc;
  double loss_sum = 0.0;
  int64_t correct = 0, rows = 0;
  kn_batch b;
  while (kn_pipeline_next(pipe, &b) == 1) {
    feed(m, &b);
    rc = kn_graph_run(m->graph, KN_RUN_FORWARD, b.rows, err, errlen);
    if (rc) return rc;
    loss_sum += (double)*(float *)kn_node_data(m->graph, m->loss) * b.rows;
    correct += count_correct(m, b.rows);
    rows += b.rows;
  }
  *loss = rows ? loss_sum / (double)rows : 0.0;
  *accuracy = rows ? (double)correct / (double)rows : 0.0;
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
    double epoch_loss = 0.0, interval_loss = 0.0;
    int64_t epoch_rows = 0, epoch_correct = 0, interval_rows = 0, interval_correct = 0;
    if (cfg->resume_from && epoch == first_epoch && first_batch > 0) {
      epoch_loss = saved.epoch_loss;
      interval_loss = saved.interval_loss;
      epoch_rows = saved.epoch_rows;
      epoch_correct = saved.epoch_correct;
      interval_rows = saved.interval_rows;
      interval_correct = saved.interval_correct;
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
      int correct = count_correct(m, rows);
      epoch_loss += (double)loss * rows;
      interval_loss += (double)loss * rows;
      epoch_rows += rows;
      interval_rows += rows;
      epoch_correct += correct;
      interval_correct += correct;
      if (cb && step % log_every == 0) {
        kn_train_event ev = {.kind = KN_EVENT_STEP, .epoch = epoch, .step = step, .n_metrics = 2};
        ev.names[0] = "loss";
        ev.values[0] = interval_loss / (double)interval_rows;
        ev.names[1] = "accuracy";
        ev.values[1] = (double)interval_correct / (double)interval_rows;
        ev.seconds = now_seconds() - t0;
        stop = cb(&ev, user);
        interval_loss = 0.0;
        interval_rows = interval_correct = 0;
      }
      if (cfg->stop_request && *cfg->stop_request) stop_requested = 1;
      /* A checkpoint on an epoch's last step waits for the epoch's end. */
      if ((stop_requested || (every > 0 && step % every == 0)) && s + 1 < steps_per_epoch &&
          cfg->checkpoint_dir) {
        kn_train_state st = {.step = step,
                             .epoch_loss = epoch_loss,
                             .interval_loss = interval_loss,
                             .epoch_rows = epoch_rows,
                             .epoch_correct = epoch_correct,
                             .interval_rows = interval_rows,
                             .interval_correct = interval_correct};
        rc = save_checkpoint(m, cfg, pipe, opt, &st, cb, user, t0, err, errlen);
        last_checkpoint = step;
      }
      if (stop_requested && s + 1 < steps_per_epoch) stop = 1;
    }
    if (rc || stop) break;
    kn_train_event ev = {.kind = KN_EVENT_EPOCH, .epoch = epoch, .step = step};
    ev.names[ev.n_metrics] = "epoch_loss";
    ev.values[ev.n_metrics++] = epoch_loss / (double)epoch_rows;
    ev.names[ev.n_metrics] = "epoch_accuracy";
    ev.values[ev.n_metrics++] = (double)epoch_correct / (double)epoch_rows;
    if (val) {
      double vloss, vacc;
      rc = evaluate_pipeline(m, val_pipe, &vloss, &vacc, err, errlen);
      if (rc) break;
      ev.names[ev.n_metrics] = "val_loss";
      ev.values[ev.n_metrics++] = vloss;
      ev.names[ev.n_metrics] = "val_accuracy";
      ev.values[ev.n_metrics++] = vacc;
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
