/* train.c — the training loop: seeded shuffling, batches gathered into the
 * graph's input, one forward+backward run and one optimizer step per batch,
 * interval and epoch metrics, validation, and the final checkpoint. All
 * buffers are allocated before the first step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "graph_internal.h"

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Copies examples idx[0..rows) into the model's inputs. */
static void gather(kn_model *m, const kn_dataset *ds, const int64_t *idx, int rows) {
  float *x = kn_node_data(m->graph, m->x);
  int32_t *y = kn_node_data(m->graph, m->y);
  const size_t ex = ds->example_size;
  for (int r = 0; r < rows; r++) {
    int64_t i = idx ? idx[r] : r;
    memcpy(x + (size_t)r * ex, ds->x + (size_t)i * ex, ex * sizeof(float));
    y[r] = ds->y[i];
  }
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

static void shuffle(int64_t *idx, int64_t n, kn_rng *rng) {
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)kn_rng_below(rng, (uint64_t)i + 1);
    int64_t t = idx[i];
    idx[i] = idx[j];
    idx[j] = t;
  }
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
  int64_t steps_per_epoch = cfg->drop_remainder ? train->n / batch : (train->n + batch - 1) / batch;
  if (steps_per_epoch < 1) {
    snprintf(err, errlen, "train: %lld examples make no full batch of %d with drop_remainder",
             (long long)train->n, batch);
    return KN_EINVAL;
  }
  kn_optimizer *opt = NULL;
  rc = kn_optimizer_new(&cfg->optimizer, kn_param_count(m->graph), &opt, err, errlen);
  if (rc) return rc;
  int64_t *idx = malloc((size_t)train->n * sizeof *idx);
  if (!idx) {
    kn_optimizer_free(opt);
    snprintf(err, errlen, "train: out of memory for %lld indices", (long long)train->n);
    return KN_ENOMEM;
  }
  for (int64_t i = 0; i < train->n; i++) idx[i] = i;
  kn_rng rng;
  kn_rng_seed(&rng, cfg->seed ^ 0x5eedda7aULL); /* data order apart from the init stream */
  const double t0 = now_seconds();
  int64_t step = 0;
  int log_every = cfg->log_every_steps > 0 ? cfg->log_every_steps : 50;
  int stop = 0;
  for (int epoch = 1; epoch <= cfg->epochs && !rc && !stop; epoch++) {
    if (cfg->shuffle) shuffle(idx, train->n, &rng);
    double epoch_loss = 0.0, interval_loss = 0.0;
    int64_t epoch_rows = 0, epoch_correct = 0, interval_rows = 0, interval_correct = 0;
    for (int64_t s = 0; s < steps_per_epoch && !rc && !stop; s++) {
      int64_t start = s * batch;
      int rows = (int)((train->n - start) < batch ? train->n - start : batch);
      gather(m, train, idx + start, rows);
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
    }
    if (rc || stop) break;
    kn_train_event ev = {.kind = KN_EVENT_EPOCH, .epoch = epoch, .step = step};
    ev.names[ev.n_metrics] = "epoch_loss";
    ev.values[ev.n_metrics++] = epoch_loss / (double)epoch_rows;
    ev.names[ev.n_metrics] = "epoch_accuracy";
    ev.values[ev.n_metrics++] = (double)epoch_correct / (double)epoch_rows;
    if (val) {
      double vloss, vacc;
      rc = kn_evaluate(m, val, &vloss, &vacc, err, errlen);
      if (rc) break;
      ev.names[ev.n_metrics] = "val_loss";
      ev.values[ev.n_metrics++] = vloss;
      ev.names[ev.n_metrics] = "val_accuracy";
      ev.values[ev.n_metrics++] = vacc;
    }
    ev.seconds = now_seconds() - t0;
    if (cb) stop = cb(&ev, user);
  }
  if (!rc && cfg->checkpoint_dir) {
    char path[4096], step_str[32];
    snprintf(path, sizeof path, "%s/%s-%08lld.safetensors", cfg->checkpoint_dir,
             cfg->checkpoint_prefix ? cfg->checkpoint_prefix : "ckpt", (long long)step);
    snprintf(step_str, sizeof step_str, "%lld", (long long)step);
    const char *keys[] = {"format", "step"};
    const char *values[] = {"pt", step_str};
    kn_checkpoint_info info;
    rc = kn_checkpoint_write(m->graph, path, 2, keys, values, &info, err, errlen);
    if (!rc && cb) {
      kn_train_event ev = {.kind = KN_EVENT_CHECKPOINT, .step = step, .path = path};
      ev.checkpoint = &info;
      ev.seconds = now_seconds() - t0;
      cb(&ev, user);
    }
  }
  free(idx);
  kn_optimizer_free(opt);
  return rc;
}
