/* job_fields.c — what the job and checkpoint resources derive from what is
 * stored rather than keep: the time a job spent training and waiting in
 * the queue over every attempt (from its state events), its progress in
 * steps (one definition for the dashboard and the CLI), and which of its
 * checkpoints ranks best. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "routes.h"

/* The plan kiln-train reports when it starts training, kept as the job's
 * TRAINING event: "training NAME on DATA: N examples, E epochs of S steps".
 * 1 with both numbers, 0 when the message does not end that way. */
static int read_plan(const char *message, int64_t *epochs, int64_t *steps_per_epoch) {
  static const char marker[] = " epochs of ";
  const char *at = NULL;
  for (const char *p = strstr(message, marker); p; p = strstr(p + 1, marker)) at = p;
  if (!at) return 0;
  const char *start = at;
  while (start > message && start[-1] >= '0' && start[-1] <= '9') start--;
  long long e = 0, s = 0;
  char tail[8] = "";
  if (start == at || sscanf(start, "%lld epochs of %lld %7s", &e, &s, tail) != 3 || e < 1 ||
      s < 1 || strcmp(tail, "steps") != 0)
    return 0;
  *epochs = e;
  *steps_per_epoch = s;
  return 1;
}

static int is_terminal(const char *name) {
  const int state = api_job_state_parse(name);
  return state >= 0 && api_job_state_is_terminal((api_job_state)state);
}

/* The epochs the spec asks for; 0 when it cannot be read. */
static int64_t spec_epochs(const store_job *job) {
  json_t *spec = job->spec_json ? json_loads(job->spec_json, 0, NULL) : NULL;
  int64_t epochs = json_integer_value(json_object_get(spec, "epochs"));
  json_decref(spec);
  return epochs;
}

void http_job_add_derived(store *st, const store_job *job, json_t *o) {
  int64_t run_ms = 0, queue_ms = 0, plan_epochs = 0, steps_per_epoch = 0;
  store_event *events = NULL;
  int n = 0;
  if (job->id[0] && store_event_list(st, job->id, &events, &n) == STORE_OK) {
    const int64_t now = store_now_ms();
    /* Each event starts a span in its to_state, up to the next event; the
     * last span lasts until now unless the job has ended. A note (from =
     * to) only splits a span. RUNNING and STOPPING train; STARTING,
     * PREEMPTED and the end states count as neither. */
    for (int i = 0; i < n; i++) {
      const char *state = events[i].to_state;
      int64_t until =
          i + 1 < n ? events[i + 1].time_ms : (is_terminal(state) ? events[i].time_ms : now);
      int64_t span = until > events[i].time_ms ? until - events[i].time_ms : 0;
      if (strcmp(state, "RUNNING") == 0 || strcmp(state, "STOPPING") == 0)
        run_ms += span;
      else if (strcmp(state, "QUEUED") == 0)
        queue_ms += span;
      if (strcmp(events[i].reason, "TRAINING") == 0 && events[i].message)
        read_plan(events[i].message, &plan_epochs, &steps_per_epoch); /* the newest wins */
    }
  }
  store_event_list_free(events, n);
  json_object_set_new(o, "run_seconds", json_real((double)run_ms / 1000.0));
  json_object_set_new(o, "queue_seconds", json_real((double)queue_ms / 1000.0));

  store_metric newest;
  memset(&newest, 0, sizeof newest);
  int have = 0;
  if (job->id[0] && store_metrics_newest(st, job->id, &newest, &have) != STORE_OK) have = 0;
  const int64_t epochs = plan_epochs > 0 ? plan_epochs : spec_epochs(job);
  json_t *progress = json_object();
  json_object_set_new(progress, "step", json_integer(have ? newest.step : 0));
  json_object_set_new(progress, "epoch", json_integer(have ? newest.epoch : 0));
  json_object_set_new(progress, "epochs", json_integer(epochs));
  const int64_t total = steps_per_epoch > 0 ? steps_per_epoch * epochs : 0;
  if (total > 0) json_object_set_new(progress, "total_steps", json_integer(total));
  /* A job that succeeded is done, even one that stopped early. */
  if (strcmp(job->state, "SUCCEEDED") == 0) {
    json_object_set_new(progress, "fraction", json_real(1.0));
  } else if (total > 0) {
    double fraction = have ? (double)newest.step / (double)total : 0.0;
    json_object_set_new(progress, "fraction", json_real(fraction > 1.0 ? 1.0 : fraction));
  }
  json_object_set_new(o, "progress", progress);
}

/* The value of metric in a checkpoint's metrics; 0 when it has none. */
static int checkpoint_value(const store_checkpoint *c, const char *metric, double *value) {
  json_t *metrics = c->metrics_json ? json_loads(c->metrics_json, 0, NULL) : NULL;
  const json_t *v = json_object_get(metrics, metric);
  int found = json_is_number(v) && isfinite(json_number_value(v));
  if (found) *value = json_number_value(v);
  json_decref(metrics);
  return found;
}

static int any_carries(const store_checkpoint *list, int n, const char *metric) {
  double ignored;
  for (int i = 0; i < n; i++)
    if (checkpoint_value(&list[i], metric, &ignored)) return 1;
  return 0;
}

int http_checkpoint_rank(const store_job *job, const store_checkpoint *list, int n,
                         http_checkpoint_ranking *out) {
  memset(out, 0, sizeof *out);
  out->best = -1;
  /* The spec's keep_best metric and mode; else val_loss, else loss, lower better. */
  json_t *spec = job->spec_json ? json_loads(job->spec_json, 0, NULL) : NULL;
  const json_t *policy = json_object_get(spec, "checkpoint");
  const char *monitor = json_string_value(json_object_get(policy, "monitor"));
  const char *mode = json_string_value(json_object_get(policy, "mode"));
  if (json_object_get(policy, "keep_best") && monitor) {
    snprintf(out->metric, sizeof out->metric, "%s", monitor);
    out->higher_is_better = mode && strcmp(mode, "max") == 0;
  } else {
    snprintf(out->metric, sizeof out->metric, "%s",
             any_carries(list, n, "val_loss") ? "val_loss" : "loss");
  }
  json_decref(spec);
  double best_value = 0;
  for (int i = 0; i < n; i++) {
    double v;
    if (!checkpoint_value(&list[i], out->metric, &v)) continue;
    /* Strictly better: of equals, the earliest stays best. */
    if (out->best < 0 || (out->higher_is_better ? v > best_value : v < best_value)) {
      out->best = i;
      best_value = v;
    }
  }
  return out->best;
}
