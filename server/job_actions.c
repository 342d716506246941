/* job_actions.c — what a client does to one job beyond reading it: delete,
 * :cancel, :wait (a CI gate in one request), :explain (why it waits), its
 * trainer log, and one checkpoint, its file, :pin and :unpin. */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "routes.h"

#define WAIT_MAX_S    3600
#define LOG_MAX_BYTES (1 << 20)

static int is_terminal(const char *state) {
  int st = api_job_state_parse(state);
  return st >= 0 && api_job_state_is_terminal((api_job_state)st);
}

void http_delete_job(const http_config *cfg, http_request *req, http_response *res) {
  store_job job;
  if (http_load_job(cfg, req, &job, res) != 0) return;
  /* A running experiment decides from its trials' jobs (a paused trial
   * resumes from its job's checkpoint): they stay until it ends. */
  store_experiment e;
  if (job.experiment[0] && store_experiment_get(cfg->st, job.experiment, &e) == STORE_OK) {
    int running = strcmp(e.state, "RUNNING") == 0;
    store_experiment_clear(&e);
    if (running) {
      http_reply_status(res, 409, "FAILED_PRECONDITION", "experiment",
                        "job %s is a trial of experiment %s, which is running; cancel the "
                        "experiment or wait for it to end before deleting its jobs",
                        job.id, job.experiment);
      store_job_clear(&job);
      return;
    }
  }
  int rc = store_job_delete(cfg->st, job.id);
  if (rc == STORE_CONFLICT) {
    http_reply_status(res, 409, "FAILED_PRECONDITION", "state",
                      "job %s is %s; cancel it first: only a SUCCEEDED, FAILED or CANCELLED job "
                      "can be deleted",
                      job.id, job.state);
  } else if (rc == STORE_NOT_FOUND) {
    http_reply_status(res, 404, "NOT_FOUND", "job", "job '%s' does not exist", job.id);
  } else if (rc != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
  } else {
    /* Its spec, log and checkpoints go with it; the row went first, so a
     * half-removed folder is never read as the job's. */
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/%s", cfg->jobs_dir, job.id);
    http_remove_tree(dir);
    http_reply_json(res, 200, json_object()); /* AIP-135: an empty body */
  }
  store_job_clear(&job);
}

int http_cancel_job_id(const http_config *cfg, const char *id, const char *queued_message,
                       const char *running_message) {
  /* A queued job is cancelled here; if the scheduler claims it first, the
   * transition conflicts and the scheduler is asked to stop it instead. A
   * running one is STOPPING from this moment. */
  int rc = store_job_transition(cfg->st, id, "QUEUED", "CANCELLED", "CANCELLED", queued_message);
  if (rc == STORE_CONFLICT) {
    rc = store_job_transition(cfg->st, id, "RUNNING", "STOPPING", "CANCEL_REQUESTED",
                              running_message);
    if (rc == STORE_CONFLICT) rc = STORE_OK; /* starting, or stopping already */
    sched_cancel(cfg->scheduler, id);
  }
  return rc;
}

void http_cancel_job(const http_config *cfg, http_request *req, http_response *res) {
  store_job job;
  if (http_load_job(cfg, req, &job, res) != 0) return;
  if (is_terminal(job.state)) {
    http_reply_status(res, 409, "FAILED_PRECONDITION", "state", "job %s already ended %s", job.id,
                      job.state);
    store_job_clear(&job);
    return;
  }
  int rc = http_cancel_job_id(cfg, job.id, "cancelled by a client while queued",
                              "a client asked to cancel the job; stopping kiln-train");
  if (rc != STORE_OK) {
    store_job_clear(&job);
    http_reply_store_failure(res, cfg->st);
    return;
  }
  char id[sizeof job.id];
  snprintf(id, sizeof id, "%s", job.id);
  store_job_clear(&job);
  if (store_job_get(cfg->st, id, &job) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return;
  }
  http_reply_json(res, 200, http_job_json(cfg->st, &job, 0));
  store_job_clear(&job);
}

double http_parse_duration(const char *text) {
  char *end = NULL;
  double v = strtod(text, &end);
  if (end == text || v < 0 || v != v) return -1;
  if (strcmp(end, "") == 0 || strcmp(end, "s") == 0) return v;
  if (strcmp(end, "m") == 0) return v * 60;
  if (strcmp(end, "ms") == 0) return v / 1000;
  return -1;
}

/* Answers at once when the job has ended or the timeout has passed; else
 * parks the request (no thread held) until the store changes or the
 * timeout, and runs again then. At shutdown: 503. */
void http_wait_job(const http_config *cfg, http_request *req, http_response *res) {
  const char *timeout_arg = http_query(req, "timeout");
  double timeout_s = 60;
  if (timeout_arg) {
    timeout_s = http_parse_duration(timeout_arg);
    if (timeout_s < 0 || timeout_s > WAIT_MAX_S) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", "timeout",
                        "timeout must be a duration like 60s, 2m or 500ms, at most %ds, got "
                        "'%.40s'",
                        WAIT_MAX_S, timeout_arg);
      return;
    }
  }
  const int64_t deadline = req->arrived_ms + (int64_t)(timeout_s * 1000);
  store_job job;
  if (http_load_job(cfg, req, &job, res) != 0) return;
  const int done = is_terminal(job.state);
  if (!done && http_stopping(cfg)) {
    http_reply_status(res, 503, "UNAVAILABLE", NULL,
                      "kilnd is shutting down while job %s is %s; the job goes on when kilnd "
                      "is back: send the :wait again then",
                      job.id, job.state);
  } else if (!done && http_monotonic_ms() < deadline) {
    res->park = 1;
    res->park_until_ms = deadline;
  } else {
    json_t *doc = http_job_json(cfg->st, &job, 1);
    json_object_set_new(doc, "done", json_boolean(done));
    http_reply_json(res, 200, doc);
  }
  store_job_clear(&job);
}

static void add_reason(json_t *arr, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add_reason(json_t *arr, const char *code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  json_t *o = json_object();
  json_object_set_new(o, "code", json_string(code));
  json_object_set_new(o, "message", json_string(msg));
  json_array_append_new(arr, o);
}

void http_explain_job(const http_config *cfg, http_request *req, http_response *res) {
  store_job job;
  if (http_load_job(cfg, req, &job, res) != 0) return;
  json_t *reasons = json_array();
  if (strcmp(job.state, "QUEUED") == 0) {
    int64_t ahead = 0;
    if (store_job_queue_ahead(cfg->st, job.id, &ahead) != STORE_OK) {
      json_decref(reasons);
      store_job_clear(&job);
      http_reply_store_failure(res, cfg->st);
      return;
    }
    if (ahead > 0) {
      add_reason(reasons, "JOBS_AHEAD",
                 "%lld queued job(s) of higher priority, or of the same priority and older, are "
                 "ahead (this job has priority %d; fair share between tenants may move it up "
                 "among those of its priority)",
                 (long long)ahead, job.priority);
    }
    if (job.experiment[0]) {
      store_trial t;
      int index = store_trial_of_job(cfg->st, job.id, &t) == STORE_OK ? t.index : -1;
      if (index >= 0) free(t.values_json);
      add_reason(reasons, "EXPERIMENT_TRIAL",
                 "trial %d of experiment %s: its experiment runs at most "
                 "max_concurrent_trials at once, and it waits for devices like any job "
                 "(GET /v1/experiments/%s)",
                 index, job.experiment, job.experiment);
    }
    char code[40], why[1024];
    if (sched_explain(cfg->scheduler, job.id, req->who.admin ? NULL : req->who.tenant, code,
                      sizeof code, why, sizeof why) == 0)
      add_reason(reasons, code, "%s", why);
    else
      add_reason(reasons, "NOT_YET_PLACED",
                 "queued since the scheduler's last pass; the next one (within a second) "
                 "places it or says why it waits");
  } else if (is_terminal(job.state)) {
    add_reason(reasons, "ENDED", "the job ended %s (%s): %s", job.state, job.reason,
               job.message ? job.message : "");
  } else {
    add_reason(reasons, "ACTIVE", "the job is %s (attempt %d)", job.state, job.attempt);
  }
  json_t *doc = json_object();
  char name[64];
  snprintf(name, sizeof name, "jobs/%s", job.id);
  json_object_set_new(doc, "name", json_string(name));
  json_object_set_new(doc, "state", json_string(job.state));
  if (job.experiment[0]) json_object_set_new(doc, "experiment", json_string(job.experiment));
  json_object_set_new(doc, "reasons", reasons);
  store_job_clear(&job);
  http_reply_json(res, 200, doc);
}

void http_get_logs(const http_config *cfg, http_request *req, http_response *res) {
  store_job job;
  if (http_load_job(cfg, req, &job, res) != 0) return;
  char path[4200];
  snprintf(path, sizeof path, "%s/%s/train.log", cfg->jobs_dir ? cfg->jobs_dir : ".", job.id);
  store_job_clear(&job);
  FILE *f = fopen(path, "rb");
  res->status = 200;
  res->content_type = "text/plain; charset=utf-8";
  if (!f) { /* not started yet: no output so far */
    res->body = strdup("");
    return;
  }
  /* The last LOG_MAX_BYTES: the end of a log says why a job failed. */
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  long from = size > LOG_MAX_BYTES ? size - LOG_MAX_BYTES : 0;
  fseek(f, from, SEEK_SET);
  res->body = malloc((size_t)(size - from) + 1);
  if (!res->body) {
    fclose(f);
    http_reply_status(res, 500, "INTERNAL", NULL, "out of memory reading the log");
    return;
  }
  size_t got = fread(res->body, 1, (size_t)(size - from), f);
  res->body[got] = '\0';
  fclose(f);
}

int http_reply_file(http_response *res, const char *path, const char *content_type) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat sb;
  if (fd < 0 || fstat(fd, &sb) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  res->status = 200;
  res->content_type = content_type;
  res->fd = fd;
  res->fd_size = (uint64_t)sb.st_size;
  return 0;
}

int http_load_checkpoint(const http_config *cfg, const http_request *req, const store_job *job,
                         store_checkpoint *out, int *best, http_response *res) {
  char *end = NULL;
  long long id = strtoll(req->params[1], &end, 10);
  store_checkpoint *list = NULL;
  int n = 0;
  if (*end || id < 1) {
    http_reply_status(res, 404, "NOT_FOUND", "checkpoint", "checkpoint '%.40s' does not exist",
                      req->params[1]);
    return -1;
  }
  if (store_checkpoint_list(cfg->st, job->id, &list, &n) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return -1;
  }
  int found = -1;
  for (int i = 0; i < n; i++) {
    if (list[i].id == id) found = i;
  }
  if (found < 0) {
    store_checkpoint_list_free(list, n);
    http_reply_status(res, 404, "NOT_FOUND", "checkpoint", "job %s has no checkpoint %lld", job->id,
                      id);
    return -1;
  }
  http_checkpoint_ranking rank;
  if (best) *best = http_checkpoint_rank(job, list, n, &rank) == found;
  *out = list[found];
  out->metrics_json = NULL; /* freed with the list */
  store_checkpoint_list_free(list, n);
  return 0;
}

void http_get_checkpoint(const http_config *cfg, http_request *req, http_response *res) {
  store_job job;
  if (http_load_job(cfg, req, &job, res) != 0) return;
  store_checkpoint c;
  int best = 0;
  if (http_load_checkpoint(cfg, req, &job, &c, &best, res) == 0)
    http_reply_json(res, 200, http_checkpoint_json(job.id, &c, best));
  store_job_clear(&job);
}

void http_download_checkpoint(const http_config *cfg, http_request *req, http_response *res) {
  store_job job;
  if (http_load_job(cfg, req, &job, res) != 0) return;
  store_checkpoint c;
  int best = 0;
  if (http_load_checkpoint(cfg, req, &job, &c, &best, res) != 0) {
    store_job_clear(&job);
    return;
  }
  store_job_clear(&job);
  if (http_reply_file(res, c.path, "application/octet-stream") != 0)
    http_reply_status(res, 404, "NOT_FOUND", "checkpoint",
                      "checkpoint %lld is recorded but its file is gone", (long long)c.id);
}

/* The job's step profile: Chrome trace-event JSON, or with format=table
 * the costliest nodes as text. */
void http_get_profile(const http_config *cfg, http_request *req, http_response *res) {
  const char *format = http_query(req, "format");
  if (format && strcmp(format, "trace") != 0 && strcmp(format, "table") != 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "format",
                      "format must be 'trace' (the default) or 'table', got '%.40s'", format);
    return;
  }
  store_job job;
  if (http_load_job(cfg, req, &job, res) != 0) return;
  const int table = format && strcmp(format, "table") == 0;
  char path[4200];
  snprintf(path, sizeof path, "%s/%s/checkpoints/%s", cfg->jobs_dir ? cfg->jobs_dir : ".", job.id,
           table ? "profile.txt" : "profile.json");
  if (http_reply_file(res, path, table ? "text/plain; charset=utf-8" : "application/json") != 0)
    http_reply_status(res, 404, "NOT_FOUND", "profile",
                      "job %s has no profile yet: the spec's profile.steps names the steps to "
                      "record, and the profile appears once the last of them is done",
                      job.id);
  store_job_clear(&job);
}

/* :pin and :unpin: a pinned checkpoint outlives checkpoint.keep_last. */
static void set_pinned(const http_config *cfg, http_request *req, http_response *res, int pinned) {
  store_job job;
  if (http_load_job(cfg, req, &job, res) != 0) return;
  store_checkpoint c;
  int best = 0;
  if (http_load_checkpoint(cfg, req, &job, &c, &best, res) != 0) {
    store_job_clear(&job);
    return;
  }
  int rc = store_checkpoint_set_pinned(cfg->st, job.id, c.id, pinned);
  if (rc == STORE_NOT_FOUND) { /* retention removed it since it was read */
    http_reply_status(res, 404, "NOT_FOUND", "checkpoint", "job %s has no checkpoint %lld", job.id,
                      (long long)c.id);
  } else if (rc != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
  } else {
    c.pinned = pinned;
    http_reply_json(res, 200, http_checkpoint_json(job.id, &c, best));
  }
  store_job_clear(&job);
}

void http_pin_checkpoint(const http_config *cfg, http_request *req, http_response *res) {
  set_pinned(cfg, req, res, 1);
}

void http_unpin_checkpoint(const http_config *cfg, http_request *req, http_response *res) {
  set_pinned(cfg, req, res, 0);
}
