/* train_checkpoint.c — the checkpoints a run writes (weights, then the
 * training state beside them), and a run resumed from one: its weights,
 * optimizer, data position, callbacks and loss scale restored. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_internal.h"

/* Writes the training state, then the weights beside it, and reports the
 * checkpoint: the weights file appears last, so a checkpoint that can be
 * seen can be resumed. A mid-epoch checkpoint carries the partial epoch's
 * and interval's sums. */
int kn_save_checkpoint(kn_run *r, int mid_epoch) {
  const kn_train_config *cfg = r->cfg;
  char path[4096], state_path[4200], step_str[32], state_str[96];
  snprintf(path, sizeof path, "%s/%s-%08lld.safetensors", cfg->checkpoint_dir,
           cfg->checkpoint_prefix ? cfg->checkpoint_prefix : "ckpt", (long long)r->step);
  kn_train_state st = {.step = r->step, .callbacks = r->callbacks};
  kn_metric_sums epoch_t, interval_t; /* over every process */
  int rc = kn_report_tally(r, &r->epoch_t, &epoch_t);
  if (!rc) rc = kn_report_tally(r, &r->interval_t, &interval_t);
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
    ev.seconds = kn_run_elapsed(r);
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

/* Where a run that failed numerically can resume from. */
void kn_last_good_checkpoint(const kn_run *r, char *where, size_t len) {
  if (r->last_checkpoint >= 0)
    snprintf(where, len, "the last good checkpoint is %s (step %lld)", r->last_checkpoint_name,
             (long long)r->last_checkpoint);
  else
    snprintf(where, len, "no checkpoint was written before it");
}

/* Where the run starts: from cfg->resume_from's checkpoint (its weights,
 * training state and optimizer), or at cfg->resume's data position, or at
 * the beginning; the callbacks' and loss scaler's state restored. */
int kn_run_resume(kn_run *r) {
  const kn_train_config *cfg = r->cfg;
  int rc = KN_OK;
  kn_train_state saved = {0};
  kn_callbacks_init(cfg, &saved.callbacks);
  kn_pipeline_state resume_at;
  const kn_pipeline_state *resume = cfg->resume;
  if (cfg->resume_from) {
    rc = load_checkpoint(r->m, cfg->resume_from, r->opt, &saved, r->err, r->errlen);
    if (!rc && r->dist) rc = kn_dist_sync(r->dist, r->err, r->errlen);
    if (r->dist && kn_dist_rank(r->dist) != 0) { /* rank 0 holds the partial sums */
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
  if (!rc && resume) rc = kn_pipeline_restore(r->pipe, resume, r->err, r->errlen);
  if (rc) return rc;
  r->callbacks = saved.callbacks;
  if (cfg->resume_from && saved.loss_scale > 0) {
    r->scaler.scale = saved.loss_scale;
    r->scaler.good_steps = saved.loss_scale_good_steps;
    r->scaler.skipped = saved.loss_scale_skipped;
    r->scaler.skipped_in_a_row = saved.loss_scale_skipped_in_a_row;
  }
  kn_graph_set_loss_scale(r->m->graph, r->scaling ? (float)r->scaler.scale : 1.0f);
  r->first_epoch = 1;
  r->first_batch = 0;
  if (resume) {
    r->first_epoch = (int)resume->epoch + 1;
    r->first_batch = resume->batch;
    r->step = cfg->resume_from
                  ? saved.step
                  : resume->epoch * r->steps_per_epoch + (r->first_batch + r->accum - 1) / r->accum;
  }
  /* A resumed epoch's metrics cover its steps from before the stop too. */
  if (cfg->resume_from && r->first_batch > 0) {
    r->resumed_epoch = saved.epoch;
    r->resumed_interval = saved.interval;
  }
  return KN_OK;
}
