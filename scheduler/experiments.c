/* experiments.c — drives running experiments from the scheduler thread:
 * a trial whose job ended is recorded (its metric at the rung it finished;
 * ASHA pauses it there, on its checkpoint, its devices free), then the
 * searcher (api_search_next) decides what starts, what ASHA promotes (the
 * job's epoch budget raised and the job queued again, so the runner
 * resumes it from that checkpoint) and what stops, up to
 * max_concurrent_trials, and when the experiment ends. Everything it
 * decides from is read from the store each time, so a kilnd restarted
 * mid-experiment goes on where it was. Runs on the scheduler thread only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_search.h"
#include "common.h"
#include "sched_internal.h"

static int is_terminal_job(const char *state) {
  return !strcmp(state, "SUCCEEDED") || !strcmp(state, "FAILED") || !strcmp(state, "CANCELLED");
}

/* The newest value of metric among the job's points; 0 when it has none. */
static int job_metric(sched *s, const char *job_id, const char *metric, double *value) {
  store_metric *points = NULL;
  int n = 0, found = 0;
  if (store_metrics_latest(s->st, job_id, &points, &n) == STORE_OK) {
    for (int i = 0; i < n && !found; i++) {
      if (strcmp(points[i].name, metric) != 0) continue;
      *value = points[i].value;
      found = 1;
    }
  }
  free(points);
  return found;
}

/* The epoch its newest point belongs to: how far a job trained. */
static int job_epochs(sched *s, const char *job_id) {
  store_metric newest;
  int n = 0;
  if (store_metrics_newest(s->st, job_id, &newest, &n) != STORE_OK || n == 0) return 0;
  return newest.epoch;
}

static void log_store_failure(sched *s, const char *what, const char *experiment) {
  sched_slog(s, SCHED_LOG_WARN, "msg=\"%s\" experiment=%s error=\"%s\"", what, experiment,
             store_errmsg(s->st));
}

/* A trial whose job ended: paused, done or failed, with its rung result. */
static void record_end(sched *s, const char *experiment, const api_search *search,
                       const store_trial *t) {
  char msg[512];
  const int last = api_search_rung_count(search) - 1;
  const int asha = api_search_searcher(search) == API_SEARCHER_ASHA;
  const char *metric = api_search_metric(search);
  double value = NAN;
  int rc;
  if (strcmp(t->job_state, "SUCCEEDED") == 0 && job_metric(s, t->job_id, metric, &value)) {
    int epochs = asha ? api_search_rung_epochs(search, t->rung) : job_epochs(s, t->job_id);
    const int pause = asha && t->rung < last;
    if (pause)
      snprintf(msg, sizeof msg,
               "finished rung %d at %d epoch(s) with %s %.6g; paused on its checkpoint", t->rung,
               epochs, metric, value);
    else
      snprintf(msg, sizeof msg, "trained its full %d epoch(s) with %s %.6g", epochs, metric, value);
    rc = store_trial_update(s->st, experiment, t->index, t->state, pause ? "PAUSED" : "DONE",
                            epochs, &value, pause ? "TRIAL_PAUSED" : "TRIAL_DONE", msg);
  } else {
    if (strcmp(t->job_state, "SUCCEEDED") == 0)
      snprintf(msg, sizeof msg,
               "its job ended without reporting %s: the search's metric must be one a job "
               "reports at an epoch's end",
               metric);
    else
      snprintf(msg, sizeof msg, "its job ended %s (see GET /v1/jobs/%s)", t->job_state, t->job_id);
    rc = store_trial_update(s->st, experiment, t->index, t->state, "FAILED",
                            job_epochs(s, t->job_id), NULL, "TRIAL_FAILED", msg);
  }
  if (rc != STORE_OK && rc != STORE_CONFLICT)
    log_store_failure(s, "trial not recorded", experiment);
}

static void view_of(const store_trial *t, api_trial_view *v) {
  memset(v, 0, sizeof *v);
  int state = api_trial_state_parse(t->state);
  v->state = state < 0 ? API_TRIAL_FAILED : (api_trial_state)state;
  v->rung = t->rung;
  v->n_results = t->n_results < API_SEARCH_MAX_RUNGS ? t->n_results : API_SEARCH_MAX_RUNGS;
  for (int i = 0; i < v->n_results; i++) v->results[i] = t->results[i];
}

/* 1 when tenant's quota leaves room for one more waiting job of devices
 * devices (as a submitted job's create checks), else 0 with why set; a
 * store failure counts as no room (the trial waits for the next pass). */
static int quota_has_room(sched *s, const char *tenant, int devices, char *why, size_t whylen) {
  store_quota q;
  store_usage u;
  if (store_quota_effective(s->st, tenant, &s->cfg.quota_defaults, &q) != STORE_OK ||
      store_usage_get(s->st, tenant, &u) != STORE_OK) {
    snprintf(why, whylen, "the quota of tenant %s cannot be read", tenant);
    return 0;
  }
  if (q.max_devices > 0 && u.devices + devices > q.max_devices) {
    snprintf(why, whylen,
             "tenant %s's unfinished jobs ask for %lld devices of its max_devices %lld", tenant,
             (long long)u.devices, (long long)q.max_devices);
    return 0;
  }
  if (q.max_queued_jobs > 0 && u.queued_jobs + 1 > q.max_queued_jobs) {
    snprintf(why, whylen, "tenant %s has %lld jobs waiting of its max_queued_jobs %lld", tenant,
             (long long)u.queued_jobs, (long long)q.max_queued_jobs);
    return 0;
  }
  return 1;
}

/* Says once (until the experiment moves again) why its trials wait. */
static void note_quota_wait(sched *s, const char *experiment, const char *why) {
  if (!strcmp(s->experiments_quota_noted, experiment)) return;
  snprintf(s->experiments_quota_noted, sizeof s->experiments_quota_noted, "%s", experiment);
  sched_slog(s, SCHED_LOG_INFO, "experiment=%s msg=\"trials wait for the quota: %s\"", experiment,
             why);
}

/* Starts trial t: its job, made from the base spec with its values and
 * rung 0's epochs. 0, 1 (its tenant's quota has no room: it waits), or -1
 * (the trial is marked FAILED when its spec cannot be made). */
static int start_trial(sched *s, const store_experiment *e, const api_search *search,
                       const store_trial *t) {
  char *spec_json = NULL;
  api_error err;
  api_job_spec *spec = malloc(sizeof *spec);
  int rc = -1;
  if (!spec) return -1;
  if (api_search_trial_spec(search, e->spec_json, t->values_json, api_search_rung_epochs(search, 0),
                            &spec_json, &err) != 0 ||
      api_spec_parse(spec_json, strlen(spec_json), spec, &err) != 0) {
    store_trial_update(s->st, e->id, t->index, "WAITING", "FAILED", 0, NULL, "TRIAL_FAILED",
                       err.message);
    goto done;
  }
  char why[256];
  if (!quota_has_room(s, e->tenant, spec->devices, why, sizeof why)) {
    note_quota_wait(s, e->id, why);
    rc = 1;
    goto done;
  }
  store_job job;
  memset(&job, 0, sizeof job);
  if (kc_new_id(job.id) != 0) goto done;
  snprintf(job.display_name, sizeof job.display_name, "%.90s trial %d",
           e->display_name[0] ? e->display_name : e->id, t->index);
  snprintf(job.tenant, sizeof job.tenant, "%s", e->tenant);
  snprintf(job.pool, sizeof job.pool, "%s", spec->pool);
  job.priority = spec->priority;
  job.devices = spec->devices;
  job.max_runtime_s = spec->max_runtime_s;
  job.planned_memory_bytes = t->planned_memory_bytes;
  job.spec_json = spec_json;
  char msg[600];
  snprintf(msg, sizeof msg, "trial %d with %.500s", t->index, t->values_json);
  job.message = msg;
  int stored = store_trial_start(s->st, e->id, t->index, &job, msg);
  if (stored != STORE_OK) {
    if (stored != STORE_CONFLICT) log_store_failure(s, "trial not started", e->id);
    goto done;
  }
  sched_slog(s, SCHED_LOG_INFO, "experiment=%s trial=%d job=%s msg=\"trial started\"", e->id,
             t->index, job.id);
  rc = 0;
done:
  free(spec_json);
  free(spec);
  return rc;
}

static int promote_trial(sched *s, const store_experiment *e, const api_search *search,
                         const store_trial *t, const api_trial_view *v) {
  const int next = t->rung + 1;
  char *spec_json = NULL;
  api_error err;
  if (api_search_trial_spec(search, e->spec_json, t->values_json,
                            api_search_rung_epochs(search, next), &spec_json, &err) != 0)
    return -1;
  /* Back in the queue, its job asks for devices again: the quota decides. */
  api_job_spec *spec = malloc(sizeof *spec);
  if (!spec || api_spec_parse(spec_json, strlen(spec_json), spec, &err) != 0) {
    free(spec);
    free(spec_json);
    return -1;
  }
  char why[256];
  const int room = quota_has_room(s, e->tenant, spec->devices, why, sizeof why);
  free(spec);
  if (!room) {
    free(spec_json);
    note_quota_wait(s, e->id, why);
    return 1;
  }
  char msg[512];
  snprintf(msg, sizeof msg,
           "promoted to rung %d (%d epochs) with %s %.6g at rung %d; resumes from its checkpoint "
           "at epoch %d",
           next, api_search_rung_epochs(search, next), api_search_metric(search),
           v->results[t->rung], t->rung, api_search_rung_epochs(search, t->rung));
  int rc = store_trial_promote(s->st, e->id, t->index, spec_json, next, msg);
  free(spec_json);
  if (rc != STORE_OK) {
    if (rc != STORE_CONFLICT) log_store_failure(s, "trial not promoted", e->id);
    return -1;
  }
  sched_slog(s, SCHED_LOG_INFO, "experiment=%s trial=%d job=%s rung=%d msg=\"trial promoted\"",
             e->id, t->index, t->job_id, next);
  return 0;
}

static void finish(sched *s, const store_experiment *e, const api_search *search,
                   const api_trial_view *views, int n) {
  int best = -1, done = 0;
  for (int i = 0; i < n; i++) {
    if (views[i].n_results == 0) continue;
    done++;
    double m = views[i].results[views[i].n_results - 1];
    if (best < 0 || api_search_better(search, m, views[best].results[views[best].n_results - 1]))
      best = i;
  }
  char msg[256];
  if (best >= 0)
    snprintf(msg, sizeof msg, "%d of %d trial(s) reported %s; the best is trial %d with %.6g", done,
             n, api_search_metric(search), best, views[best].results[views[best].n_results - 1]);
  else
    snprintf(msg, sizeof msg, "no trial reported %s", api_search_metric(search));
  int rc = store_experiment_finish(s->st, e->id, best >= 0 ? "SUCCEEDED" : "FAILED",
                                   best >= 0 ? "EXPERIMENT_DONE" : "EXPERIMENT_FAILED", msg);
  if (rc != STORE_OK && rc != STORE_CONFLICT) log_store_failure(s, "end not recorded", e->id);
  sched_slog(s, SCHED_LOG_INFO, "experiment=%s state=%s msg=\"%s\"", e->id,
             best >= 0 ? "SUCCEEDED" : "FAILED", msg);
}

/* One experiment: its ended trials recorded, then the searcher's actions
 * applied until it waits. */
static void drive_one(sched *s, const char *id) {
  store_experiment e;
  if (store_experiment_get(s->st, id, &e) != STORE_OK) return;
  api_search *search = NULL;
  api_error err;
  store_trial *trials = NULL;
  api_trial_view *views = NULL;
  int n = 0;
  if (api_search_parse(e.search_json, strlen(e.search_json), &search, &err) != 0) {
    store_experiment_finish(s->st, e.id, "FAILED", "EXPERIMENT_FAILED", err.message);
    goto done;
  }
  if (store_trial_list(s->st, e.id, 0, 0, &trials, &n) != STORE_OK) goto done;
  int ended = 0;
  for (int i = 0; i < n; i++) {
    const store_trial *t = &trials[i];
    if ((!strcmp(t->state, "RUNNING") || !strcmp(t->state, "PROMOTED")) &&
        is_terminal_job(t->job_state)) {
      record_end(s, e.id, search, t);
      ended = 1;
    }
  }
  if (ended) {
    store_trial_list_free(trials, n);
    trials = NULL;
    if (store_trial_list(s->st, e.id, 0, 0, &trials, &n) != STORE_OK) goto done;
  }
  views = calloc((size_t)(n ? n : 1), sizeof *views);
  if (!views) goto done;
  for (int i = 0; i < n; i++) view_of(&trials[i], &views[i]);
  for (int guard = 0; guard < 4 * n + 4; guard++) {
    api_search_action a = api_search_next(search, views, n);
    if (a.kind == API_ACTION_NONE) break;
    if (a.kind == API_ACTION_FINISH) {
      finish(s, &e, search, views, n);
      break;
    }
    store_trial *t = &trials[a.trial];
    api_trial_view *v = &views[a.trial];
    if (a.kind == API_ACTION_START) {
      if (start_trial(s, &e, search, t) != 0) break;
      s->experiments_quota_noted[0] = '\0';
      v->state = API_TRIAL_RUNNING;
    } else if (a.kind == API_ACTION_PROMOTE) {
      if (promote_trial(s, &e, search, t, v) != 0) break;
      s->experiments_quota_noted[0] = '\0';
      v->state = API_TRIAL_PROMOTED;
      v->rung++;
    } else if (a.kind == API_ACTION_STOP) {
      char msg[256];
      snprintf(msg, sizeof msg,
               "not promoted past rung %d: enough trials beat its %s there that it can no "
               "longer rank in the top 1/reduction_factor",
               t->rung, api_search_metric(search));
      int rc = store_trial_update(s->st, e.id, t->index, "PAUSED", "STOPPED", -1, NULL,
                                  "TRIAL_STOPPED", msg);
      if (rc != STORE_OK) break;
      v->state = API_TRIAL_STOPPED;
    }
  }
done:
  free(views);
  store_trial_list_free(trials, n);
  api_search_free(search);
  store_experiment_clear(&e);
}

void sched_experiments_drive(sched *s) {
  /* Nothing was written since the last look: nothing ended or was created. */
  uint64_t generation = store_generation(s->st);
  if (s->experiments_seen && generation == s->experiments_generation) return;
  s->experiments_seen = 1;
  s->experiments_generation = generation;
  char(*ids)[40] = NULL;
  int n = 0;
  if (store_experiment_running(s->st, &ids, &n) != STORE_OK) {
    sched_slog(s, SCHED_LOG_WARN, "msg=\"cannot list running experiments\" error=\"%s\"",
               store_errmsg(s->st));
    return;
  }
  for (int i = 0; i < n; i++) drive_one(s, ids[i]);
  free(ids);
}
