/* handlers.c — the REST routes of kilnd: jobs (create, get, list), a job's
 * metrics, checkpoints and events, and health (data sets: datasets.c). Every
 * failure answers with the API error model. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "api.h"
#include "server.h"

#define LIST_DEFAULT_PAGE 50
#define LIST_MAX_PAGE     1000

/* ---- responses ---- */

static void reply_json(http_response *res, int status, json_t *doc) {
  res->status = status;
  res->body = json_dumps(doc, JSON_COMPACT);
  json_decref(doc);
  if (!res->body) res->status = 500;
}

static void reply_error(http_response *res, const api_error *e) {
  res->status = e->http;
  res->body = api_error_to_json(e);
}

static void reply_status(http_response *res, int http, const char *status, const char *field,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void reply_status(http_response *res, int http, const char *status, const char *field,
                         const char *fmt, ...) {
  api_error e;
  memset(&e, 0, sizeof e);
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  api_error_set(&e, http, status, "%s", msg);
  if (field) api_error_add_detail(&e, field, "%s", msg);
  reply_error(res, &e);
}

static void reply_store_failure(http_response *res, store *st) {
  reply_status(res, 500, "INTERNAL", NULL, "storage failure: %s", store_errmsg(st));
}

static json_t *rfc3339(int64_t ms) {
  if (ms <= 0) return json_null();
  time_t secs = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&secs, &tm);
  char buf[80];
  snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
           tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ms % 1000));
  return json_string(buf);
}

static void set_time(json_t *obj, const char *key, int64_t ms) {
  if (ms > 0) json_object_set_new(obj, key, rfc3339(ms));
}

/* The last value of each metric name (points come ordered by attempt, step). */
static json_t *latest_metrics(store *st, const char *job_id) {
  store_metric *points = NULL;
  int n = 0;
  json_t *latest = json_object();
  if (store_metrics_list(st, job_id, NULL, &points, &n) == STORE_OK) {
    for (int i = 0; i < n; i++)
      json_object_set_new(latest, points[i].name, json_real(points[i].value));
  }
  free(points);
  return latest;
}

static json_t *job_json(store *st, const store_job *job, int with_metrics) {
  json_t *o = json_object();
  char name[64];
  snprintf(name, sizeof name, "jobs/%s", job->id);
  json_object_set_new(o, "name", json_string(name));
  json_object_set_new(o, "id", json_string(job->id));
  json_object_set_new(o, "display_name", json_string(job->display_name));
  json_object_set_new(o, "state", json_string(job->state));
  json_object_set_new(o, "reason", json_string(job->reason));
  json_object_set_new(o, "message", json_string(job->message ? job->message : ""));
  json_object_set_new(o, "priority", json_integer(job->priority));
  json_object_set_new(o, "attempt", json_integer(job->attempt));
  if (job->request_id[0]) json_object_set_new(o, "request_id", json_string(job->request_id));
  set_time(o, "create_time", job->create_ms);
  set_time(o, "start_time", job->start_ms);
  set_time(o, "end_time", job->end_ms);
  json_t *spec = job->spec_json ? json_loads(job->spec_json, 0, NULL) : NULL;
  json_object_set_new(o, "spec", spec ? spec : json_object());
  if (with_metrics && job->id[0])
    json_object_set_new(o, "latest_metrics", latest_metrics(st, job->id));
  return o;
}

/* ---- ids ---- */

static int new_job_id(char out[40]) {
  unsigned char raw[8];
  FILE *f = fopen("/dev/urandom", "rb");
  if (!f) return -1;
  size_t got = fread(raw, 1, sizeof raw, f);
  fclose(f);
  if (got != sizeof raw) return -1;
  /* Time-ordered prefix so ids sort roughly by creation, then randomness. */
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  int n = snprintf(out, 40, "%04d%02d%02d-", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday);
  for (size_t i = 0; i < sizeof raw; i++) n += snprintf(out + n, (size_t)(40 - n), "%02x", raw[i]);
  return 0;
}

static int valid_token_chars(const char *s, size_t max) {
  size_t len = strlen(s);
  if (len == 0 || len > max) return 0;
  for (; *s; s++) {
    char c = *s;
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
          c == '_' || c == '.')) {
      return 0;
    }
  }
  return 1;
}

/* ---- /v1/jobs ---- */

static void create_job(const http_config *cfg, const http_request *req, http_response *res) {
  const char *request_id = http_query(req, "request_id");
  const char *validate_only = http_query(req, "validate_only");
  if (request_id && !valid_token_chars(request_id, 79)) {
    reply_status(res, 400, "INVALID_ARGUMENT", "request_id",
                 "request_id must be 1-79 characters of A-Z a-z 0-9 - _ .");
    return;
  }
  int dry_run = 0;
  if (validate_only) {
    if (strcmp(validate_only, "true") == 0) {
      dry_run = 1;
    } else if (strcmp(validate_only, "false") != 0) {
      reply_status(res, 400, "INVALID_ARGUMENT", "validate_only",
                   "validate_only must be true or false, got '%s'", validate_only);
      return;
    }
  }
  api_job_spec *spec = malloc(sizeof *spec);
  if (!spec) {
    reply_status(res, 500, "INTERNAL", NULL, "out of memory");
    return;
  }
  api_error e;
  memset(&e, 0, sizeof e);
  if (api_spec_parse(req->body, req->body_len, spec, &e) != 0) {
    free(spec);
    reply_error(res, &e);
    return;
  }
  if (http_datasets_check_spec(cfg, spec, res) != 0) {
    free(spec);
    return;
  }
  store_job job;
  memset(&job, 0, sizeof job);
  snprintf(job.display_name, sizeof job.display_name, "%s", spec->display_name);
  if (request_id) snprintf(job.request_id, sizeof job.request_id, "%s", request_id);
  job.priority = spec->priority;
  job.spec_json = api_spec_to_json(spec);
  free(spec);
  if (!job.spec_json) {
    reply_status(res, 500, "INTERNAL", NULL, "out of memory");
    return;
  }
  snprintf(job.state, sizeof job.state, "QUEUED");
  if (dry_run) {
    job.message = "";
    reply_json(res, 200, job_json(cfg->st, &job, 0));
    free(job.spec_json);
    return;
  }
  if (new_job_id(job.id) != 0) {
    free(job.spec_json);
    reply_status(res, 500, "INTERNAL", NULL, "cannot draw a random job id");
    return;
  }
  job.create_ms = store_now_ms();
  store_job existing;
  memset(&existing, 0, sizeof existing);
  int rc = store_job_create(cfg->st, &job, &existing);
  free(job.spec_json);
  if (rc == STORE_EXISTS) {
    /* The same request again: the job it made, not a second one. */
    reply_json(res, 200, job_json(cfg->st, &existing, 1));
    store_job_clear(&existing);
    return;
  }
  if (rc != STORE_OK) {
    reply_store_failure(res, cfg->st);
    return;
  }
  sched_wake(cfg->scheduler);
  store_job created;
  memset(&created, 0, sizeof created);
  if (store_job_get(cfg->st, job.id, &created) != STORE_OK) {
    reply_store_failure(res, cfg->st);
    return;
  }
  reply_json(res, 200, job_json(cfg->st, &created, 0));
  store_job_clear(&created);
}

static int parse_int_arg(const char *text, int lo, int hi, int *out) {
  char *end = NULL;
  long v = strtol(text, &end, 10);
  if (!*text || *end || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}

static void list_jobs(const http_config *cfg, const http_request *req, http_response *res) {
  const char *size_arg = http_query(req, "page_size");
  const char *token = http_query(req, "page_token");
  const char *filter = http_query(req, "filter");
  int page_size = LIST_DEFAULT_PAGE;
  if (size_arg && parse_int_arg(size_arg, 0, 1 << 30, &page_size) != 0) {
    reply_status(res, 400, "INVALID_ARGUMENT", "page_size",
                 "page_size must be a non-negative integer, got '%s'", size_arg);
    return;
  }
  if (page_size == 0) page_size = LIST_DEFAULT_PAGE;
  if (page_size > LIST_MAX_PAGE) page_size = LIST_MAX_PAGE; /* AIP-158: coerce down */
  int64_t before = 0;
  if (token && *token && api_page_token_decode(token, &before) != 0) {
    reply_status(res, 400, "INVALID_ARGUMENT", "page_token",
                 "page_token is not one this server issued");
    return;
  }
  const char *state = NULL;
  if (filter && *filter) {
    if (strncmp(filter, "state=", 6) != 0 || api_job_state_parse(filter + 6) < 0) {
      reply_status(res, 400, "INVALID_ARGUMENT", "filter",
                   "filter must be state=<QUEUED|STARTING|RUNNING|STOPPING|SUCCEEDED|FAILED|"
                   "CANCELLED|PREEMPTED>, got '%s'",
                   filter);
      return;
    }
    state = filter + 6;
  }
  store_job *jobs = NULL;
  int n = 0;
  /* One more than asked tells whether another page exists. */
  if (store_job_list(cfg->st, state, before, page_size + 1, &jobs, &n) != STORE_OK) {
    reply_store_failure(res, cfg->st);
    return;
  }
  json_t *doc = json_object(), *arr = json_array();
  for (int i = 0; i < n && i < page_size; i++)
    json_array_append_new(arr, job_json(cfg->st, &jobs[i], 0));
  json_object_set_new(doc, "jobs", arr);
  char next[API_PAGE_TOKEN_LEN] = "";
  if (n > page_size) api_page_token_encode(jobs[page_size - 1].seq, next);
  json_object_set_new(doc, "next_page_token", json_string(next));
  store_job_list_free(jobs, n);
  reply_json(res, 200, doc);
}

/* Loads the job named in the path or answers 404; returns 0 when found. */
static int load_job(const http_config *cfg, const char *id, store_job *job, http_response *res) {
  memset(job, 0, sizeof *job);
  if (!valid_token_chars(id, 39)) {
    reply_status(res, 404, "NOT_FOUND", "job", "job '%.60s' does not exist", id);
    return -1;
  }
  int rc = store_job_get(cfg->st, id, job);
  if (rc == STORE_NOT_FOUND) {
    reply_status(res, 404, "NOT_FOUND", "job", "job '%s' does not exist", id);
    return -1;
  }
  if (rc != STORE_OK) {
    reply_store_failure(res, cfg->st);
    return -1;
  }
  return 0;
}

static void get_metrics(const http_config *cfg, const store_job *job, const http_request *req,
                        http_response *res) {
  const char *name = http_query(req, "name");
  store_metric *points = NULL;
  int n = 0;
  if (store_metrics_list(cfg->st, job->id, name, &points, &n) != STORE_OK) {
    reply_store_failure(res, cfg->st);
    return;
  }
  json_t *arr = json_array();
  for (int i = 0; i < n; i++) {
    json_t *p = json_object();
    json_object_set_new(p, "attempt", json_integer(points[i].attempt));
    json_object_set_new(p, "step", json_integer(points[i].step));
    json_object_set_new(p, "epoch", json_integer(points[i].epoch));
    json_object_set_new(p, "name", json_string(points[i].name));
    json_object_set_new(p, "value", json_real(points[i].value));
    json_object_set_new(p, "time", rfc3339(points[i].time_ms));
    json_array_append_new(arr, p);
  }
  free(points);
  json_t *doc = json_object();
  json_object_set_new(doc, "metrics", arr);
  reply_json(res, 200, doc);
}

static void get_checkpoints(const http_config *cfg, const store_job *job, http_response *res) {
  store_checkpoint *list = NULL;
  int n = 0;
  if (store_checkpoint_list(cfg->st, job->id, &list, &n) != STORE_OK) {
    reply_store_failure(res, cfg->st);
    return;
  }
  json_t *arr = json_array();
  for (int i = 0; i < n; i++) {
    json_t *c = json_object();
    char name[96];
    snprintf(name, sizeof name, "jobs/%s/checkpoints/%lld", job->id, (long long)list[i].id);
    json_object_set_new(c, "name", json_string(name));
    json_object_set_new(c, "attempt", json_integer(list[i].attempt));
    json_object_set_new(c, "step", json_integer(list[i].step));
    json_object_set_new(c, "path", json_string(list[i].path));
    json_object_set_new(c, "bytes", json_integer(list[i].bytes));
    json_object_set_new(c, "sha256", json_string(list[i].sha256));
    json_object_set_new(c, "format", json_string("safetensors"));
    json_object_set_new(c, "create_time", rfc3339(list[i].create_ms));
    json_array_append_new(arr, c);
  }
  store_checkpoint_list_free(list, n);
  json_t *doc = json_object();
  json_object_set_new(doc, "checkpoints", arr);
  reply_json(res, 200, doc);
}

static void get_events(const http_config *cfg, const store_job *job, http_response *res) {
  store_event *events = NULL;
  int n = 0;
  if (store_event_list(cfg->st, job->id, &events, &n) != STORE_OK) {
    reply_store_failure(res, cfg->st);
    return;
  }
  json_t *arr = json_array();
  for (int i = 0; i < n; i++) {
    json_t *e = json_object();
    json_object_set_new(e, "time", rfc3339(events[i].time_ms));
    json_object_set_new(e, "from_state", json_string(events[i].from_state));
    json_object_set_new(e, "to_state", json_string(events[i].to_state));
    json_object_set_new(e, "reason", json_string(events[i].reason));
    json_object_set_new(e, "message", json_string(events[i].message ? events[i].message : ""));
    json_array_append_new(arr, e);
  }
  store_event_list_free(events, n);
  json_t *doc = json_object();
  json_object_set_new(doc, "events", arr);
  reply_json(res, 200, doc);
}

/* ---- routing ---- */

static int is(const http_request *req, const char *method) {
  return strcmp(req->method, method) == 0;
}

static void method_not_allowed(const http_request *req, http_response *res) {
  reply_status(res, 405, "UNIMPLEMENTED", NULL, "%s is not supported on %s", req->method,
               req->path);
}

/* /v1/jobs/{id} and its sub-resources. */
static void job_route(const http_config *cfg, const http_request *req, http_response *res,
                      const char *rest) {
  const char *slash = strchr(rest, '/');
  size_t id_len = slash ? (size_t)(slash - rest) : strlen(rest);
  const char *sub = slash ? slash + 1 : "";
  char id[128];
  if (id_len == 0 || id_len >= sizeof id) {
    reply_status(res, 404, "NOT_FOUND", "job", "job '%.*s' does not exist",
                 (int)(id_len < 60 ? id_len : 60), rest);
    return;
  }
  memcpy(id, rest, id_len);
  id[id_len] = '\0';
  if (strcmp(sub, "") != 0 && strcmp(sub, "metrics") != 0 && strcmp(sub, "checkpoints") != 0 &&
      strcmp(sub, "events") != 0) {
    reply_status(res, 404, "NOT_FOUND", NULL, "no route %s %s", req->method, req->path);
    return;
  }
  if (!is(req, "GET")) {
    method_not_allowed(req, res);
    return;
  }
  store_job job;
  if (load_job(cfg, id, &job, res) != 0) return;
  if (strcmp(sub, "") == 0) {
    reply_json(res, 200, job_json(cfg->st, &job, 1));
  } else if (strcmp(sub, "metrics") == 0) {
    get_metrics(cfg, &job, req, res);
  } else if (strcmp(sub, "checkpoints") == 0) {
    get_checkpoints(cfg, &job, res);
  } else {
    get_events(cfg, &job, res);
  }
  store_job_clear(&job);
}

void http_dispatch(const http_config *cfg, const http_request *req, http_response *res) {
  const char *path = req->path;
  if (strcmp(path, "/healthz") == 0) {
    if (!is(req, "GET")) {
      method_not_allowed(req, res);
    } else {
      json_t *doc = json_object();
      json_object_set_new(doc, "status", json_string("ok"));
      reply_json(res, 200, doc);
    }
  } else if (strcmp(path, "/v1/jobs") == 0) {
    if (is(req, "POST")) {
      create_job(cfg, req, res);
    } else if (is(req, "GET")) {
      list_jobs(cfg, req, res);
    } else {
      method_not_allowed(req, res);
    }
  } else if (strcmp(path, "/v1/datasets") == 0 || strncmp(path, "/v1/datasets/", 13) == 0) {
    http_datasets_route(cfg, req, res);
  } else if (strncmp(path, "/v1/jobs/", 9) == 0) {
    job_route(cfg, req, res, path + 9);
  } else {
    reply_status(res, 404, "NOT_FOUND", NULL, "no route %s %s", req->method, path);
  }
}
