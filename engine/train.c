/* train.c — a training run from its checks to its end, and its loop: one
 * forward+backward run per batch and one optimizer step per window, with the
 * step's and epoch's reports. Every buffer is allocated before the first step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train_internal.h"

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

double kn_run_elapsed(const kn_run *r) {
  return now_seconds() - r->t0;
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
static int replicas_run(kn_run *r, kn_run_mode mode, const kn_batch *b, kn_metric_sums *t1,
                        kn_metric_sums *t2, double sums[KN_DIST_SUMS]) {
  const int n = kn_dist_local(r->dist);
  int rows[KN_DIST_MAX_LOCAL];
  kn_batch parts[KN_DIST_MAX_LOCAL];
  for (int i = 0; i < n; i++) {
    int start;
    kn_dist_slice(r->dist, i, b->rows, &start, &rows[i]);
    parts[i] = sub_batch(r->m, b, start, rows[i]);
    if (rows[i] > 0) kn_feed_batch(kn_dist_model(r->dist, i), &parts[i]);
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
    kn_tally_batch(replica, t1, &parts[i], loss, r->metrics, r->top_k);
    if (t2) kn_tally_batch(replica, t2, &parts[i], loss, r->metrics, r->top_k);
  }
  sums[2] = r->cfg->stop_request && *r->cfg->stop_request;
  if (mode != KN_RUN_TRAIN) return KN_OK;
  rc = kn_dist_reduce(r->dist, rows, sums, r->err, r->errlen);
  r->stop_anywhere = sums[2] > 0;
  return rc;
}

/* One training batch over the replicas: the global batch's rows and mean
 * loss, the aggregated gradient in the model's flat buffer. */
static int replicas_train(kn_run *r, const kn_batch *b, int *rows, float *loss) {
  double sums[KN_DIST_SUMS];
  int rc = replicas_run(r, KN_RUN_TRAIN, b, &r->epoch_t, &r->interval_t, sums);
  *rows = (int)sums[0];
  *loss = sums[0] > 0 ? (float)(sums[1] / sums[0]) : 0.0f;
  return rc;
}

/* Loss and metrics over the validation data: the model alone, or each
 * replica on its slice of every batch, summed over every process. */
static int evaluate_run(kn_run *r, kn_metric_sums *t) {
  if (!r->dist)
    return kn_evaluate_pipeline(r->m, r->val_pipe, r->metrics, r->top_k, t, r->err, r->errlen);
  kn_pipeline_state start = {0, 0, 0};
  int rc = kn_pipeline_restore(r->val_pipe, &start, r->err, r->errlen);
  memset(t, 0, sizeof *t);
  kn_batch b;
  double sums[KN_DIST_SUMS];
  int got = 0;
  while (!rc && (got = kn_pipeline_next(r->val_pipe, &b)) == 1)
    rc = replicas_run(r, KN_RUN_FORWARD, &b, t, NULL, sums);
  if (!rc && got < 0) {
    snprintf(r->err, r->errlen, "evaluate: %s", kn_pipeline_error(r->val_pipe));
    rc = got;
  }
  return rc ? rc : kn_global_tally(r, t);
}

/* Whether to stop after this step: asked here, or on any process. */
static int stop_wanted(const kn_run *r) {
  if (r->dist) return r->stop_anywhere;
  return r->cfg->stop_request && *r->cfg->stop_request;
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
  if (e->enabled && !kn_epoch_reports(metrics, has_val, e->monitor)) {
    snprintf(err, errlen, "train: early stopping monitors '%s', which this run does not report",
             e->monitor);
    return KN_EINVAL;
  }
  if (p->enabled && !kn_epoch_reports(metrics, has_val, p->monitor)) {
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
static float current_lr(const kn_run *r) {
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
static void accumulate(kn_run *r, int rows) {
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
static int update(kn_run *r) {
  kn_graph *g = r->m->graph;
  const size_t n = kn_param_count(g);
  if (r->acc) { /* the row-weighted mean over the window, as one big batch's */
    float *grads = kn_grads(g);
    const float inv = 1.0f / (float)r->window_rows;
    for (size_t i = 0; i < n; i++) grads[i] = r->acc[i] * inv;
  }
  const int apply = kn_run_scale_window(r);
  if (apply && r->cfg->clip_global_norm > 0)
    clip_global_norm(kn_grads(g), n, r->cfg->clip_global_norm);
  kn_optimizer_set_learning_rate(r->opt, current_lr(r));
  int rc = KN_OK;
  if (apply && r->ps) {
    int stop = 0;
    const int flags = (r->window_rows > 0 ? KN_PS_EXAMPLES : 0) |
                      (r->cfg->stop_request && *r->cfg->stop_request ? KN_PS_STOP_REQUEST : 0);
    rc = kn_ps_step(r->ps, kn_params(g), kn_grads(g), kn_optimizer_learning_rate(r->opt),
                    r->step + 1, flags, &stop, r->err, r->errlen);
    if (r->cfg->dist.ps_async) r->stop_anywhere = stop; /* agreed through the servers */
  } else if (apply) {
    /* where the gradients are: on their GPU, the parameters stay there */
    rc = kn_optimizer_step_graph(r->opt, g, r->err, r->errlen);
  }
  r->step++;
  r->window_rows = 0;
  r->window_batches = 0;
  return rc;
}

static void notice(kn_run *r, int epoch, const char *code, const char *message) {
  if (!r->cb) return;
  kn_train_event ev = {
      .kind = KN_EVENT_NOTICE, .epoch = epoch, .step = r->step, .code = code, .message = message};
  ev.seconds = kn_run_elapsed(r);
  r->cb(&ev, r->user);
}

static double event_value(const kn_train_event *ev, const char *name) {
  for (int i = 0; i < ev->n_metrics; i++)
    if (strcmp(ev->names[i], name) == 0) return ev->values[i];
  return NAN;
}

/* The callbacks at an epoch's end; returns 1 when early stopping ends the
 * run. */
static int end_of_epoch_callbacks(kn_run *r, const kn_train_event *ev) {
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
static int write_profile(kn_run *r, int epoch) {
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
static void profile_step_begins(kn_run *r) {
  if (!r->profile || r->window_batches > 0) return;
  const int64_t next = r->step + 1;
  kn_profile_record(r->profile, next,
                    next >= r->cfg->profile_first && next <= r->cfg->profile_last);
  r->step_start = kn_profile_now();
}

static void free_run(kn_run *r) {
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

/* Whether replicas, other processes or parameter servers share the run. */
static int replicated(const kn_train_config *cfg) {
  return cfg->dist.n_replicas > 1 || cfg->dist.world_size > 1 || cfg->dist.ps_servers > 0;
}

/* Checks the model, data and options, and sets the run's settings from
 * them; allocates nothing. */
static int run_check(kn_run *r, const kn_dataset *train, const kn_dataset *val) {
  kn_model *m = r->m;
  const kn_train_config *cfg = r->cfg;
  char *err = r->err;
  const size_t errlen = r->errlen;
  int rc = kn_check_fit(m, train, "train", err, errlen);
  if (!rc && val) rc = kn_check_fit(m, val, "validation", err, errlen);
  if (rc) return rc;
  r->batch = kn_planned_batch(m);
  if (cfg->batch_size != r->batch) {
    snprintf(err, errlen, "train: batch_size %d differs from the model's planned %d",
             cfg->batch_size, r->batch);
    return KN_EINVAL;
  }
  if (cfg->epochs < 1 || train->n < 1) {
    snprintf(err, errlen, "train: need epochs >= 1 and a non-empty dataset");
    return KN_EINVAL;
  }
  r->top_k = cfg->top_k > 0 ? cfg->top_k : 5;
  r->accum = cfg->accumulation_steps > 1 ? cfg->accumulation_steps : 1;
  r->report_lr = cfg->plateau.enabled || cfg->schedule.type != KN_SCHEDULE_CONSTANT ||
                 cfg->schedule.warmup_steps > 0;
  if ((rc = kn_run_scaling_init(r)) != 0) return rc;
  rc = kn_resolve_metrics(m, cfg->metrics, &r->metrics, err, errlen);
  if (!rc) rc = check_loop_options(cfg, r->metrics, val != NULL, err, errlen);
  if (!rc && replicated(cfg) && r->scaling) {
    snprintf(err, errlen,
             "train: mixed_float16's loss scaling trains one replica for now; use "
             "mixed_bfloat16 with replicas");
    rc = KN_EINVAL;
  }
  if (!rc && cfg->dist.ps_servers > 0) rc = kn_ps_check(cfg, kn_param_count(m->graph), err, errlen);
  return rc;
}

/* The input pipeline's settings: the config's own or the loop options',
 * made to hand out the global batch, this process's part of it, and the
 * targets the loss reads. */
static void pipeline_config(const kn_run *r, const kn_dataset *train, kn_pipeline_config *pc) {
  const kn_train_config *cfg = r->cfg;
  const kn_model *m = r->m;
  if (cfg->pipeline) {
    *pc = *cfg->pipeline;
  } else {
    kn_pipeline_config_default(pc);
    pc->shuffle_buffer = cfg->shuffle ? train->n : 0;
    pc->drop_remainder = cfg->drop_remainder;
    pc->num_parallel_calls = 0;
  }
  pc->batch_size = r->batch * (r->dist ? kn_dist_total(r->dist) : 1); /* the global batch */
  if (r->dist && train->per_process) { /* its own examples: whole batches of its replicas */
    pc->batch_size = r->batch * kn_dist_local(r->dist);
  } else if (r->dist) { /* each process reads only its own part of every global batch */
    pc->part_count = kn_dist_total(r->dist) / kn_dist_local(r->dist);
    pc->part_index = kn_dist_rank(r->dist);
  }
  pc->repeat = cfg->epochs;
  /* Several sigmoid or softmax outputs read one-hot rows of their width. */
  if ((m->loss_kind == KN_LOSS_XENT || m->loss_kind == KN_LOSS_BCE) && m->n_outputs > 1) {
    pc->one_hot = 1;
    pc->one_hot_depth = m->n_outputs;
  } else if (pc->one_hot && pc->one_hot_depth == 0) {
    pc->one_hot_depth = m->n_outputs > 1 ? m->n_outputs : 0;
  }
  pc->seed = cfg->seed ^ 0x5eedda7aULL; /* data order apart from the init stream */
}

/* Everything the steps use, allocated before the first: the replicas, the
 * pipelines, the optimizer, the profile and the accumulation buffer. */
static int run_open(kn_run *r, const kn_dataset *train, const kn_dataset *val) {
  kn_model *m = r->m;
  const kn_train_config *cfg = r->cfg;
  char *err = r->err;
  const size_t errlen = r->errlen;
  int rc = KN_OK;
  if (replicated(cfg) && (rc = kn_dist_new(m, r->batch, &cfg->dist, &r->dist, err, errlen)) != 0)
    return rc;
  kn_pipeline_config pc;
  pipeline_config(r, train, &pc);
  rc = kn_pipeline_new(train, &pc, &r->pipe, err, errlen);
  if (!rc && val) rc = kn_pipeline_new_eval(r->pipe, val, &r->val_pipe, err, errlen);
  if (!rc) rc = kn_optimizer_new(&cfg->optimizer, kn_param_count(m->graph), &r->opt, err, errlen);
  /* One profile per job: rank 0's (the others would write the same path). */
  const int profiled = cfg->profile_first > 0 && (!r->dist || kn_dist_rank(r->dist) == 0);
  if (!rc && profiled) {
    if (!cfg->profile_path || cfg->profile_last < cfg->profile_first) {
      snprintf(err, errlen, "train: a profile needs a path and profile_last >= profile_first");
      rc = KN_EINVAL;
    } else if (!(r->profile = kn_profile_new()) ||
               kn_profile_reserve(r->profile, profile_events(cfg, m->graph, r->accum)) != 0) {
      snprintf(err, errlen, "train: out of memory for the profile");
      rc = KN_ENOMEM;
    } else {
      kn_graph_set_profile(m->graph, r->profile);
    }
  }
  if (!rc && r->accum > 1) {
    r->acc = malloc(kn_param_count(m->graph) * sizeof(float));
    if (!r->acc) {
      snprintf(err, errlen, "train: out of memory for the accumulated gradients");
      rc = KN_ENOMEM;
    }
  }
  if (rc) return rc;
  r->batches = kn_pipeline_batches_per_epoch(r->pipe);
  r->steps_per_epoch = (r->batches + r->accum - 1) / r->accum;
  return KN_OK;
}

/* parameter_server: the connection to the servers, from the step the run
 * starts at. */
static int open_servers(kn_run *r) {
  const kn_train_config *cfg = r->cfg;
  if (cfg->dist.ps_servers <= 0) return KN_OK;
  return kn_ps_new(cfg, kn_params(r->m->graph), kn_param_count(r->m->graph), r->opt, r->step,
                   &r->ps, r->err, r->errlen);
}

/* Whether checkpoint_every_steps asks for a checkpoint at this step. */
static int checkpoint_due(const kn_run *r) {
  const int every = r->cfg->checkpoint_dir ? r->cfg->checkpoint_every_steps : 0;
  return every > 0 && r->step % every == 0;
}

/* Hands cfg->on_tuned the pipeline's settings once its tuning is done. */
static void report_tuning(kn_run *r) {
  if (!r->cfg->on_tuned || r->tuning_reported) return;
  kn_pipeline_stats ps;
  kn_pipeline_stats_get(r->pipe, &ps);
  if (ps.tuned) {
    r->cfg->on_tuned(&ps, r->user);
    r->tuning_reported = 1;
  }
}

/* The reports after an optimizer step: the interval's metrics every
 * log_every_steps, a validation pass every eval_every_steps, and a
 * checkpoint when one is due or a stop was requested. */
static int step_reports(kn_run *r, int epoch, int last_batch) {
  kn_model *m = r->m;
  const kn_train_config *cfg = r->cfg;
  const int log_every = cfg->log_every_steps > 0 ? cfg->log_every_steps : 50;
  int rc = KN_OK;
  if (r->cb && r->step % log_every == 0) {
    kn_train_event ev = {.kind = KN_EVENT_STEP, .epoch = epoch, .step = r->step};
    kn_metric_sums interval_t;
    if ((rc = kn_report_tally(r, &r->interval_t, &interval_t)) != 0) return rc;
    kn_put_metrics(m, &ev, &interval_t, r->metrics, KN_NAMES_STEP);
    if (r->report_lr) kn_put_metric(&ev, "learning_rate", kn_optimizer_learning_rate(r->opt));
    if (r->scaling) {
      kn_put_metric(&ev, "loss_scale", r->scaler.scale);
      kn_put_metric(&ev, "skipped_steps", (double)r->scaler.skipped);
    }
    ev.seconds = kn_run_elapsed(r);
    r->stop = r->cb(&ev, r->user);
    memset(&r->interval_t, 0, sizeof r->interval_t);
  }
  /* A pass at an epoch's last step is the epoch's own validation. */
  if (r->val_pipe && cfg->eval_every_steps > 0 && r->step % cfg->eval_every_steps == 0 &&
      !last_batch) {
    kn_metric_sums val_t;
    if ((rc = evaluate_run(r, &val_t)) != 0) return rc;
    kn_train_event ev = {.kind = KN_EVENT_EVAL, .epoch = epoch, .step = r->step};
    kn_put_metrics(m, &ev, &val_t, r->metrics, KN_NAMES_VAL);
    ev.seconds = kn_run_elapsed(r);
    if (r->cb && r->cb(&ev, r->user)) r->stop = 1;
  }
  if (stop_wanted(r)) r->stop_requested = 1;
  /* A checkpoint on an epoch's last step waits for the epoch's end. */
  if ((r->stop_requested || checkpoint_due(r)) && !last_batch && cfg->checkpoint_dir)
    rc = kn_save_checkpoint(r, 1);
  if (r->stop_requested && !last_batch) r->stop = 1;
  return rc;
}

/* Batch s of the epoch: fed and run (forward and backward), its gradients
 * unscaled, its metrics tallied and its gradients added to the window; at
 * the window's end one optimizer step and its reports. */
static int train_step(kn_run *r, int epoch, int64_t s) {
  kn_model *m = r->m;
  kn_batch b;
  profile_step_begins(r);
  double t = kn_profile_now();
  const int got = kn_pipeline_next(r->pipe, &b);
  if (got < 0) {
    snprintf(r->err, r->errlen, "train: %s", kn_pipeline_error(r->pipe));
    return got;
  }
  if (got != 1) {
    snprintf(r->err, r->errlen, "train: the pipeline ended early, at epoch %d batch %lld", epoch,
             (long long)s + 1);
    return KN_ESTATE;
  }
  kn_profile_phase(r->profile, "data", t, kn_profile_now());
  int rows = b.rows;
  t = kn_profile_now();
  if (!r->dist) kn_feed_batch(m, &b);
  kn_profile_phase(r->profile, "feed", t, kn_profile_now());
  report_tuning(r);
  float loss = 0.0f;
  int rc = r->dist ? replicas_train(r, &b, &rows, &loss)
                   : kn_graph_run(m->graph, KN_RUN_TRAIN, rows, r->err, r->errlen);
  if (rc) return rc;
  if (!r->dist) loss = *(float *)kn_node_data(m->graph, m->loss);
  if (!isfinite(loss) && !r->scaling) return kn_numeric_error(r, loss, epoch);
  t = kn_profile_now();
  if (r->scaling) kn_run_unscale(r, loss);
  if (isfinite(loss) && !r->dist) { /* replicas tally their own slices */
    kn_tally_batch(m, &r->epoch_t, &b, loss, r->metrics, r->top_k);
    kn_tally_batch(m, &r->interval_t, &b, loss, r->metrics, r->top_k);
  }
  kn_profile_phase(r->profile, "metrics", t, kn_profile_now());
  const int last_batch = s + 1 == r->batches;
  t = kn_profile_now();
  if (r->acc)
    accumulate(r, rows);
  else
    r->window_rows = rows; /* the step's examples, for a parameter server */
  if (r->acc && r->window_batches < r->accum && !last_batch) {
    kn_profile_phase(r->profile, "optimizer", t, kn_profile_now());
    return KN_OK;
  }
  if ((rc = update(r)) != 0) return rc;
  if ((rc = kn_check_skipped_steps(r, epoch)) != 0) return rc;
  if (r->dist && (rc = kn_dist_sync(r->dist, r->err, r->errlen)) != 0) return rc;
  if (kn_profile_recording(r->profile)) {
    const double end = kn_profile_now();
    kn_profile_phase(r->profile, "optimizer", t, end);
    kn_profile_phase(r->profile, "step", r->step_start, end);
    kn_profile_record(r->profile, r->step, 0); /* validation after a step is not the step's */
    if (r->step == r->cfg->profile_last && (rc = write_profile(r, epoch)) != 0) return rc;
  }
  return step_reports(r, epoch, last_batch);
}

/* After an epoch's last step: the epoch event with its metrics and
 * validation, the callbacks, and a checkpoint when one is due or a stop was
 * requested. */
static int end_epoch(kn_run *r, int epoch) {
  kn_model *m = r->m;
  const kn_train_config *cfg = r->cfg;
  kn_train_event ev = {.kind = KN_EVENT_EPOCH, .epoch = epoch, .step = r->step};
  kn_metric_sums epoch_t;
  int rc = kn_report_tally(r, &r->epoch_t, &epoch_t);
  if (rc) return rc;
  kn_put_metrics(m, &ev, &epoch_t, r->metrics, KN_NAMES_EPOCH);
  if (r->val_pipe) {
    kn_metric_sums val_t;
    if ((rc = evaluate_run(r, &val_t)) != 0) return rc;
    kn_put_metrics(m, &ev, &val_t, r->metrics, KN_NAMES_VAL);
  }
  if (r->scaling) kn_put_metric(&ev, "skipped_steps", (double)r->scaler.skipped);
  ev.seconds = kn_run_elapsed(r);
  if (r->cb) r->stop = r->cb(&ev, r->user);
  if (end_of_epoch_callbacks(r, &ev)) r->stop = 1;
  if (stop_wanted(r)) r->stop_requested = r->stop = 1;
  if ((r->stop_requested || checkpoint_due(r)) && epoch < cfg->epochs && cfg->checkpoint_dir)
    rc = kn_save_checkpoint(r, 0);
  return rc;
}

/* One epoch: its sums started (or resumed), its steps, and its end. */
static int train_epoch(kn_run *r, int epoch) {
  const int resumed = epoch == r->first_epoch;
  r->epoch_t = resumed ? r->resumed_epoch : (kn_metric_sums){0};
  r->interval_t = resumed ? r->resumed_interval : (kn_metric_sums){0};
  int rc = KN_OK;
  for (int64_t s = resumed ? r->first_batch : 0; s < r->batches && !rc && !r->stop; s++)
    rc = train_step(r, epoch, s);
  if (rc || r->stop) return rc;
  return end_epoch(r, epoch);
}

/* After the last epoch (or a stop): the stop reported, the final checkpoint
 * and the profile of a run that ended inside the profiled range. */
static int run_finish(kn_run *r) {
  const kn_train_config *cfg = r->cfg;
  /* A request that came after the last step stops nothing: the run is done. */
  if (r->stop_requested && r->step < (int64_t)cfg->epochs * r->steps_per_epoch) {
    snprintf(r->err, r->errlen, "train: stopped on request at step %lld%s", (long long)r->step,
             r->last_checkpoint == r->step ? ", checkpoint written" : "");
    return KN_ESTOPPED;
  }
  int rc = KN_OK;
  if (cfg->checkpoint_dir && r->last_checkpoint != r->step) rc = kn_save_checkpoint(r, 0);
  if (!rc && r->profile && !r->profile_written && r->step >= cfg->profile_first)
    rc = write_profile(r, cfg->epochs);
  return rc;
}

int kn_train(kn_model *m, const kn_dataset *train, const kn_dataset *val,
             const kn_train_config *cfg, kn_train_callback cb, void *user, char *err,
             size_t errlen) {
  kn_run r = {.m = m, .cfg = cfg, .cb = cb, .user = user, .err = err, .errlen = errlen};
  r.last_checkpoint = -1;
  int rc = run_check(&r, train, val);
  if (rc) return rc;
  if (kn_ps_is_server(&cfg->dist)) /* a parameter server trains nothing itself */
    return kn_ps_serve(cfg, kn_param_count(m->graph), err, errlen);
  rc = run_open(&r, train, val);
  if (!rc) rc = kn_run_resume(&r);
  if (!rc) rc = open_servers(&r);
  r.t0 = now_seconds();
  for (int epoch = r.first_epoch; epoch <= cfg->epochs && !rc && !r.stop; epoch++)
    rc = train_epoch(&r, epoch);
  if (!rc) rc = run_finish(&r);
  free_run(&r);
  return rc;
}
