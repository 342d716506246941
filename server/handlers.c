/* handlers.c — the REST routes of kilnd: jobs (create, get, list), a job's
 * metrics, checkpoints and events, and health (data sets: datasets.c). Every
 * failure answers with the API error model; every job read is scoped to the
 * caller's tenant. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "api.h"
#include "common.h"
#include "routes.h"
#include "server.h"

#define LIST_DEFAULT_PAGE 50
#define LIST_MAX_PAGE     1000
/* How long a cached answer on a job that has not ended may be served: its
 * times are whole at this grain. */
#define UNFINISHED_JOB_MAX_AGE_MS 100

/* ---- responses ---- */

void http_reply_json(http_response *res, int status, json_t *doc) {
  res->status = status;
  res->body = json_dumps(doc, JSON_COMPACT);
  json_decref(doc);
  if (!res->body) res->status = 500;
}

void http_reply_error(http_response *res, const api_error *e) {
  res->status = e->http;
  res->body = api_error_to_json(e);
}

void http_reply_status(http_response *res, int http, const char *status, const char *field,
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
  http_reply_error(res, &e);
}

void http_reply_store_failure(http_response *res, store *st) {
  http_reply_status(res, 500, "INTERNAL", NULL, "storage failure: %s", store_errmsg(st));
}

json_t *http_rfc3339(int64_t ms) {
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
  if (ms > 0) json_object_set_new(obj, key, http_rfc3339(ms));
}

/* The last value of each metric name. */
static json_t *latest_metrics(store *st, const char *job_id) {
  store_metric *points = NULL;
  int n = 0;
  json_t *latest = json_object();
  if (store_metrics_latest(st, job_id, &points, &n) == STORE_OK) {
    for (int i = 0; i < n; i++)
      json_object_set_new(latest, points[i].name, json_real(points[i].value));
  }
  free(points);
  return latest;
}

/* Every field of a job's resource but its spec. */
static json_t *job_json_without_spec(store *st, const store_job *job, int with_metrics) {
  json_t *o = json_object();
  /* A validate_only answer has no id: it names no job. */
  if (job->id[0]) {
    char name[64];
    snprintf(name, sizeof name, "jobs/%s", job->id);
    json_object_set_new(o, "name", json_string(name));
    json_object_set_new(o, "id", json_string(job->id));
  }
  json_object_set_new(o, "display_name", json_string(job->display_name));
  json_object_set_new(o, "state", json_string(job->state));
  json_object_set_new(o, "reason", json_string(job->reason));
  json_object_set_new(o, "message", json_string(job->message ? job->message : ""));
  json_object_set_new(o, "priority", json_integer(job->priority));
  json_object_set_new(o, "attempt", json_integer(job->attempt));
  json_object_set_new(o, "restarts", json_integer(job->restarts));
  json_object_set_new(o, "infra_restarts", json_integer(job->infra_restarts));
  json_object_set_new(o, "planned_memory_bytes", json_integer(job->planned_memory_bytes));
  if (job->request_id[0]) json_object_set_new(o, "request_id", json_string(job->request_id));
  if (job->tenant[0]) json_object_set_new(o, "tenant", json_string(job->tenant));
  set_time(o, "create_time", job->create_ms);
  set_time(o, "start_time", job->start_ms);
  set_time(o, "end_time", job->end_ms);
  http_job_add_derived(st, job, o);
  http_job_add_trial(st, job, o);
  if (with_metrics && job->id[0])
    json_object_set_new(o, "latest_metrics", latest_metrics(st, job->id));
  return o;
}

json_t *http_job_json(store *st, const store_job *job, int with_metrics) {
  json_t *o = job_json_without_spec(st, job, with_metrics);
  json_t *spec = job->spec_json ? json_loads(job->spec_json, 0, NULL) : NULL;
  json_object_set_new(o, "spec", spec ? spec : json_object());
  return o;
}

void http_reply_job(http_response *res, store *st, const store_job *job, int with_metrics) {
  /* The stored spec is already canonical compact JSON (api_spec_to_json):
   * spliced in as text, not parsed and printed again on every answer. */
  const char *spec = job->spec_json;
  size_t spec_len = spec ? strlen(spec) : 0;
  if (spec_len < 2 || spec[0] != '{' || spec[spec_len - 1] != '}') {
    http_reply_json(res, 200, http_job_json(st, job, with_metrics));
    return;
  }
  json_t *o = job_json_without_spec(st, job, with_metrics);
  char *head = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  size_t head_len = head ? strlen(head) : 0;
  char *body = head_len >= 2 ? malloc(head_len + spec_len + 16) : NULL;
  if (!body) {
    free(head);
    http_reply_status(res, 500, "INTERNAL", NULL, "out of memory");
    return;
  }
  /* {"name":...,"end_time":...} -> {"name":...,"end_time":...,"spec":SPEC} */
  memcpy(body, head, head_len - 1);
  size_t used = head_len - 1;
  used += (size_t)sprintf(body + used, "%s\"spec\":", head_len > 2 ? "," : "");
  memcpy(body + used, spec, spec_len);
  used += spec_len;
  body[used++] = '}';
  body[used] = '\0';
  free(head);
  res->status = 200;
  res->body = body;
}

/* ---- ids ---- */

int http_valid_name(const char *s, size_t max) {
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

void http_create_job(const http_config *cfg, http_request *req, http_response *res) {
  const char *request_id = http_query(req, "request_id");
  const char *validate_only = http_query(req, "validate_only");
  if (request_id && !http_valid_name(request_id, 79)) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "request_id",
                      "request_id must be 1-79 characters of A-Z a-z 0-9 - _ .");
    return;
  }
  int dry_run = 0;
  if (validate_only) {
    if (strcmp(validate_only, "true") == 0) {
      dry_run = 1;
    } else if (strcmp(validate_only, "false") != 0) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", "validate_only",
                        "validate_only must be true or false, got '%s'", validate_only);
      return;
    }
  }
  api_job_spec *spec = malloc(sizeof *spec);
  if (!spec) {
    http_reply_status(res, 500, "INTERNAL", NULL, "out of memory");
    return;
  }
  api_error e;
  memset(&e, 0, sizeof e);
  if (api_spec_parse(req->body, req->body_len, spec, &e) != 0) {
    free(spec);
    http_reply_error(res, &e);
    return;
  }
  if (http_datasets_check_spec(cfg, &req->who, spec, res) != 0) {
    free(spec);
    return;
  }
  char field[40], why[300];
  if (sched_check_fits(cfg->scheduler, spec->pool, spec->device_type, spec->devices, field,
                       sizeof field, why, sizeof why) != 0) {
    free(spec);
    http_reply_status(res, 409, "FAILED_PRECONDITION", field, "%s", why);
    return;
  }
  /* A retry of a create that succeeded answers its job, whatever the
   * quotas say now. */
  char earlier[40];
  store_job existing;
  if (request_id && !dry_run &&
      store_job_find_request(cfg->st, req->who.tenant, request_id, earlier) == STORE_OK &&
      store_job_get(cfg->st, earlier, &existing) == STORE_OK) {
    free(spec);
    http_reply_job(res, cfg->st, &existing, 1);
    store_job_clear(&existing);
    return;
  }
  if (http_check_job_quota(cfg, &req->who, spec, res) != 0) {
    free(spec);
    return;
  }
  store_job job;
  memset(&job, 0, sizeof job);
  snprintf(job.display_name, sizeof job.display_name, "%s", spec->display_name);
  snprintf(job.tenant, sizeof job.tenant, "%s", req->who.tenant);
  if (request_id) snprintf(job.request_id, sizeof job.request_id, "%s", request_id);
  job.priority = spec->priority;
  snprintf(job.pool, sizeof job.pool, "%s", spec->pool);
  job.devices = spec->devices;
  job.max_runtime_s = spec->max_runtime_s;
  job.spec_json = api_spec_to_json(spec);
  free(spec);
  if (!job.spec_json) {
    http_reply_status(res, 500, "INTERNAL", NULL, "out of memory");
    return;
  }
  if (http_plan_memory(cfg, job.spec_json, &job.planned_memory_bytes, res) != 0) {
    free(job.spec_json);
    return;
  }
  snprintf(job.state, sizeof job.state, "QUEUED");
  if (dry_run) {
    job.message = "";
    http_reply_job(res, cfg->st, &job, 0);
    free(job.spec_json);
    return;
  }
  if (kc_new_id(job.id) != 0) {
    free(job.spec_json);
    http_reply_status(res, 500, "INTERNAL", NULL, "cannot draw a random job id");
    return;
  }
  job.create_ms = store_now_ms();
  memset(&existing, 0, sizeof existing);
  int rc = store_job_create(cfg->st, &job, &existing);
  if (rc == STORE_EXISTS) {
    /* The same request again: the job it made, not a second one. */
    free(job.spec_json);
    http_reply_job(res, cfg->st, &existing, 1);
    store_job_clear(&existing);
    return;
  }
  if (rc != STORE_OK) {
    free(job.spec_json);
    http_reply_store_failure(res, cfg->st);
    return;
  }
  sched_wake(cfg->scheduler);
  /* The job as committed (QUEUED, CREATED), without reading it back. */
  snprintf(job.reason, sizeof job.reason, "CREATED");
  job.message = "";
  http_reply_job(res, cfg->st, &job, 0);
  free(job.spec_json);
}

/* AIP-158: a page_size over the maximum, however large, is coerced to it;
 * 0 or none is the default. 0, or -1 for text that is not a whole number
 * >= 0. */
int http_parse_page_size(const char *text, int *out) {
  *out = LIST_DEFAULT_PAGE;
  if (!text) return 0;
  size_t digits = strspn(text, "0123456789");
  if (digits == 0 || text[digits] != '\0') return -1;
  while (*text == '0' && text[1]) text++;
  if (strlen(text) > 9) { /* more than any page holds, whatever the digits */
    *out = LIST_MAX_PAGE;
    return 0;
  }
  long v = strtol(text, NULL, 10);
  *out = v == 0 ? LIST_DEFAULT_PAGE : v > LIST_MAX_PAGE ? LIST_MAX_PAGE : (int)v;
  return 0;
}

int http_parse_int_arg(const char *text, int lo, int hi, int *out) {
  char *end = NULL;
  long v = strtol(text, &end, 10);
  if (!*text || *end || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}

int http_parse_filter(const char *filter, const http_request *req, const char **state, char *tenant,
                      size_t tenant_len, char *why, size_t why_len) {
  char copy[256];
  if (strlen(filter) >= sizeof copy) {
    snprintf(why, why_len, "filter is longer than %zu characters", sizeof copy - 1);
    return -1;
  }
  snprintf(copy, sizeof copy, "%s", filter);
  char *rest = copy;
  while (rest && *rest) {
    char *and = strstr(rest, " AND ");
    if (and) *and = '\0';
    char *eq = strchr(rest, '=');
    if (!eq) {
      snprintf(why, why_len, "filter term '%.60s' is not KEY=VALUE", rest);
      return -1;
    }
    *eq = '\0';
    const char *value = eq + 1;
    if (strcmp(rest, "state") == 0) {
      int st = api_job_state_parse(value);
      if (st < 0) {
        snprintf(why, why_len,
                 "filter state must be one of QUEUED STARTING RUNNING STOPPING SUCCEEDED FAILED "
                 "CANCELLED PREEMPTED, got '%.40s'",
                 value);
        return -1;
      }
      *state = api_job_state_name((api_job_state)st);
    } else if (strcmp(rest, "tenant") == 0 && req->who.admin) {
      if (!*value || strlen(value) >= tenant_len) {
        snprintf(why, why_len, "filter tenant must be 1-%zu characters", tenant_len - 1);
        return -1;
      }
      snprintf(tenant, tenant_len, "%s", value);
    } else {
      snprintf(why, why_len, "filter key '%.40s' is not one of: state%s", rest,
               req->who.admin ? ", tenant" : "");
      return -1;
    }
    rest = and? and+5 : NULL;
  }
  return 0;
}

/* Page tokens carry the last seq and the direction, so a token is only
 * accepted with the order_by it was issued for, and are bound to the
 * caller's tenant and the filter's text: a token of one query is refused
 * by any other (AIP-158). */
#define TOKEN_POSITION(seq, asc) ((seq)*2 + (asc))

void http_list_jobs(const http_config *cfg, http_request *req, http_response *res) {
  const char *size_arg = http_query(req, "page_size");
  const char *token = http_query(req, "page_token");
  const char *filter = http_query(req, "filter");
  const char *order_by = http_query(req, "order_by");
  int page_size;
  if (http_parse_page_size(size_arg, &page_size) != 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "page_size",
                      "page_size must be a non-negative integer, got '%.40s'", size_arg);
    return;
  }
  int ascending = 0;
  if (order_by && *order_by) {
    if (strcmp(order_by, "create_time") == 0 || strcmp(order_by, "create_time asc") == 0) {
      ascending = 1;
    } else if (strcmp(order_by, "create_time desc") != 0) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", "order_by",
                        "order_by must be 'create_time', 'create_time asc' or 'create_time "
                        "desc', got '%.60s'",
                        order_by);
      return;
    }
  }
  char query[512];
  snprintf(query, sizeof query, "jobs\n%s\n%s", req->who.tenant, filter ? filter : "");
  int64_t position = 0;
  if (token && *token) {
    if (api_page_token_decode(token, query, &position) != 0 || position < 2 ||
        position % 2 != ascending) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", "page_token",
                        "page_token is not one this server issued for this filter and order_by");
      return;
    }
  }
  const char *state = NULL;
  char tenant[64];
  snprintf(tenant, sizeof tenant, "%s", req->who.tenant);
  int all_tenants = req->who.admin;
  if (filter && *filter) {
    char why[256];
    tenant[0] = '\0';
    if (http_parse_filter(filter, req, &state, tenant, sizeof tenant, why, sizeof why) != 0) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", "filter", "%s", why);
      return;
    }
    if (tenant[0]) all_tenants = 0;
    if (!tenant[0]) snprintf(tenant, sizeof tenant, "%s", req->who.tenant);
  }
  store_job_query q = {.tenant = all_tenants ? NULL : tenant,
                       .state = state,
                       .after_seq = position / 2,
                       .ascending = ascending,
                       .limit = page_size + 1}; /* one more tells whether a next page exists */
  store_job *jobs = NULL;
  int n = 0;
  if (store_job_query_list(cfg->st, &q, &jobs, &n) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return;
  }
  json_t *doc = json_object(), *arr = json_array();
  for (int i = 0; i < n && i < page_size; i++)
    json_array_append_new(arr, http_job_json(cfg->st, &jobs[i], 0));
  json_object_set_new(doc, "jobs", arr);
  char next[API_PAGE_TOKEN_LEN] = "";
  if (n > page_size)
    api_page_token_encode(TOKEN_POSITION(jobs[page_size - 1].seq, ascending), query, next);
  json_object_set_new(doc, "next_page_token", json_string(next));
  store_job_list_free(jobs, n);
  http_reply_json(res, 200, doc);
}

int http_load_job(const http_config *cfg, const http_request *req, store_job *job,
                  http_response *res) {
  const char *id = req->params[0];
  memset(job, 0, sizeof *job);
  if (!http_valid_name(id, 39)) {
    http_reply_status(res, 404, "NOT_FOUND", "job", "job '%.60s' does not exist", id);
    return -1;
  }
  int rc = store_job_get(cfg->st, id, job);
  if (rc == STORE_OK && !req->who.admin && strcmp(job->tenant, req->who.tenant) != 0) {
    store_job_clear(job); /* another tenant's: as absent as a missing one */
    rc = STORE_NOT_FOUND;
  }
  if (rc == STORE_NOT_FOUND) {
    http_reply_status(res, 404, "NOT_FOUND", "job", "job '%s' does not exist", id);
    return -1;
  }
  if (rc != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return -1;
  }
  return 0;
}

void http_get_job(const http_config *cfg, http_request *req, http_response *res) {
  /* Read before the job: a write in between leaves the kept answer stale
   * by one generation, never passing for fresh. */
  const uint64_t generation = store_generation(cfg->st);
  if (http_cache_job_get(cfg->cache, req->params[0], &req->who, generation, res)) return;
  store_job job;
  if (http_load_job(cfg, req, &job, res) != 0) return;
  http_reply_job(res, cfg->st, &job, 1);
  /* An unfinished job's run_seconds or queue_seconds grows without a write. */
  const int state = api_job_state_parse(job.state);
  const int ended = state >= 0 && api_job_state_is_terminal((api_job_state)state);
  if (res->status == 200)
    http_cache_job_put(cfg->cache, job.id, job.tenant, generation,
                       ended ? 0 : UNFINISHED_JOB_MAX_AGE_MS, res->body);
  store_job_clear(&job);
}

static int parse_int64_arg(const char *text, int64_t lo, int64_t hi, int64_t *out) {
  char *end = NULL;
  long long v = strtoll(text, &end, 10);
  if (!*text || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

void http_get_metrics(const http_config *cfg, http_request *req, http_response *res) {
  const char *name = http_query(req, "name");
  const char *start_arg = http_query(req, "start_step");
  const char *end_arg = http_query(req, "end_step");
  const char *max_arg = http_query(req, "max_points");
  int64_t start_step = 0, end_step = INT64_MAX;
  int max_points = 0;
  if (start_arg && parse_int64_arg(start_arg, 0, INT64_MAX, &start_step) != 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "start_step",
                      "start_step must be an integer >= 0, got '%.40s'", start_arg);
    return;
  }
  if (end_arg && parse_int64_arg(end_arg, 0, INT64_MAX, &end_step) != 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "end_step",
                      "end_step must be an integer >= 0, got '%.40s'", end_arg);
    return;
  }
  if (start_step > end_step) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "start_step",
                      "start_step %lld is after end_step %lld", (long long)start_step,
                      (long long)end_step);
    return;
  }
  if (max_arg && http_parse_int_arg(max_arg, 1, 100000, &max_points) != 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "max_points",
                      "max_points must be an integer in 1..100000, got '%.40s'", max_arg);
    return;
  }
  store_job job;
  if (http_load_job(cfg, req, &job, res) != 0) return;
  store_metric *points = NULL;
  int n = 0;
  int rc =
      store_metrics_thinned(cfg->st, job.id, name, start_step, end_step, max_points, &points, &n);
  store_job_clear(&job);
  if (rc != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return;
  }
  json_t *arr = json_array();
  for (int i = 0; i < n; i++) {
    json_t *p = json_object();
    json_object_set_new(p, "seq", json_integer(points[i].seq)); /* the watch's event id */
    json_object_set_new(p, "attempt", json_integer(points[i].attempt));
    json_object_set_new(p, "step", json_integer(points[i].step));
    json_object_set_new(p, "epoch", json_integer(points[i].epoch));
    json_object_set_new(p, "name", json_string(points[i].name));
    json_object_set_new(p, "value", json_real(points[i].value));
    json_object_set_new(p, "time", http_rfc3339(points[i].time_ms));
    json_array_append_new(arr, p);
  }
  free(points);
  json_t *doc = json_object();
  json_object_set_new(doc, "metrics", arr);
  http_reply_json(res, 200, doc);
}

json_t *http_checkpoint_json(const char *job_id, const store_checkpoint *c, int best) {
  json_t *o = json_object();
  char name[96];
  snprintf(name, sizeof name, "jobs/%s/checkpoints/%lld", job_id, (long long)c->id);
  json_object_set_new(o, "name", json_string(name));
  json_object_set_new(o, "id", json_integer(c->id));
  json_object_set_new(o, "attempt", json_integer(c->attempt));
  json_object_set_new(o, "step", json_integer(c->step));
  json_object_set_new(o, "bytes", json_integer(c->bytes));
  json_object_set_new(o, "sha256", json_string(c->sha256));
  json_object_set_new(o, "format", json_string("safetensors"));
  json_object_set_new(o, "pinned", json_boolean(c->pinned));
  json_object_set_new(o, "best", json_boolean(best));
  json_object_set_new(o, "create_time", http_rfc3339(c->create_ms));
  /* The newest value of each metric when it was written (keep_best ranks by these). */
  json_t *metrics = c->metrics_json ? json_loads(c->metrics_json, 0, NULL) : NULL;
  json_object_set_new(o, "metrics", json_is_object(metrics) ? metrics : json_object());
  if (metrics && !json_is_object(metrics)) json_decref(metrics);
  return o;
}

void http_get_checkpoints(const http_config *cfg, http_request *req, http_response *res) {
  store_job job;
  if (http_load_job(cfg, req, &job, res) != 0) return;
  store_checkpoint *list = NULL;
  int n = 0;
  int rc = store_checkpoint_list(cfg->st, job.id, &list, &n);
  if (rc != STORE_OK) {
    store_job_clear(&job);
    http_reply_store_failure(res, cfg->st);
    return;
  }
  http_checkpoint_ranking rank;
  http_checkpoint_rank(&job, list, n, &rank);
  json_t *arr = json_array();
  for (int i = 0; i < n; i++)
    json_array_append_new(arr, http_checkpoint_json(job.id, &list[i], i == rank.best));
  store_checkpoint_list_free(list, n);
  store_job_clear(&job);
  json_t *doc = json_object();
  json_object_set_new(doc, "checkpoints", arr);
  /* What `best` was decided by; absent when no checkpoint carries it. */
  if (rank.best >= 0) {
    json_object_set_new(doc, "best_metric", json_string(rank.metric));
    json_object_set_new(doc, "best_mode", json_string(rank.higher_is_better ? "max" : "min"));
  }
  http_reply_json(res, 200, doc);
}

void http_get_events(const http_config *cfg, http_request *req, http_response *res) {
  store_job job;
  if (http_load_job(cfg, req, &job, res) != 0) return;
  store_event *events = NULL;
  int n = 0;
  int rc = store_event_list(cfg->st, job.id, &events, &n);
  store_job_clear(&job);
  if (rc != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return;
  }
  json_t *arr = json_array();
  for (int i = 0; i < n; i++) {
    json_t *e = json_object();
    json_object_set_new(e, "time", http_rfc3339(events[i].time_ms));
    json_object_set_new(e, "from_state", json_string(events[i].from_state));
    json_object_set_new(e, "to_state", json_string(events[i].to_state));
    json_object_set_new(e, "reason", json_string(events[i].reason));
    json_object_set_new(e, "message", json_string(events[i].message ? events[i].message : ""));
    json_array_append_new(arr, e);
  }
  store_event_list_free(events, n);
  json_t *doc = json_object();
  json_object_set_new(doc, "events", arr);
  http_reply_json(res, 200, doc);
}

void http_healthz(const http_config *cfg, http_request *req, http_response *res) {
  (void)cfg;
  (void)req;
  json_t *doc = json_object();
  json_object_set_new(doc, "status", json_string("ok"));
  http_reply_json(res, 200, doc);
}
