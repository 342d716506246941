/* observe.c — what operators and tools read: /readyz, /metrics (Prometheus
 * text: jobs by state, queue depth, devices busy, metric points ingested,
 * HTTP requests and latency), the device inventory and pools, and
 * /v1/openapi.json, made from the route table so every route is described. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "routes.h"

void http_readyz(const http_config *cfg, http_request *req, http_response *res) {
  (void)req;
  int64_t counts[8];
  if (store_job_count_by_state(cfg->st, counts) != STORE_OK) {
    http_reply_status(res, 503, "UNAVAILABLE", NULL, "the store does not answer: %s",
                      store_errmsg(cfg->st));
    return;
  }
  if (!cfg->scheduler) {
    http_reply_status(res, 503, "UNAVAILABLE", NULL, "the scheduler is not running");
    return;
  }
  json_t *doc = json_object();
  json_object_set_new(doc, "status", json_string("ready"));
  http_reply_json(res, 200, doc);
}

void http_prometheus(const http_config *cfg, http_request *req, http_response *res) {
  (void)req;
  int64_t counts[8];
  if (store_job_count_by_state(cfg->st, counts) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return;
  }
  sched_stats stats;
  sched_get_stats(cfg->scheduler, &stats);
  char *http_part = http_counters_prometheus(cfg->counters);
  size_t cap = 4096 + (http_part ? strlen(http_part) : 0);
  char *out = malloc(cap);
  if (!out) {
    free(http_part);
    http_reply_status(res, 500, "INTERNAL", NULL, "out of memory");
    return;
  }
  size_t used = 0;
#define EMIT(...)                                                                                  \
  do {                                                                                             \
    int n_ = snprintf(out + used, cap - used, __VA_ARGS__);                                        \
    if (n_ > 0 && (size_t)n_ < cap - used) used += (size_t)n_;                                     \
  } while (0)
  EMIT("# HELP kiln_jobs Jobs by state.\n# TYPE kiln_jobs gauge\n");
  for (int i = 0; i < API_JOB_STATE_COUNT; i++)
    EMIT("kiln_jobs{state=\"%s\"} %lld\n", api_job_state_name((api_job_state)i),
         (long long)counts[i]);
  EMIT("# HELP kiln_queue_depth Jobs waiting to start.\n# TYPE kiln_queue_depth gauge\n"
       "kiln_queue_depth %lld\n",
       (long long)counts[API_JOB_QUEUED]);
  EMIT("# HELP kiln_devices_busy Devices held by running jobs.\n# TYPE kiln_devices_busy gauge\n"
       "kiln_devices_busy %d\n",
       stats.devices_busy);
  EMIT("# HELP kiln_devices Devices the scheduler hands out.\n# TYPE kiln_devices gauge\n"
       "kiln_devices %d\n",
       stats.devices_total);
  EMIT("# HELP kiln_metric_points_ingested_total Metric points stored since start.\n"
       "# TYPE kiln_metric_points_ingested_total counter\n"
       "kiln_metric_points_ingested_total %llu\n",
       (unsigned long long)stats.points_ingested);
  EMIT("# HELP kiln_jobs_started_total Trainer processes started since start.\n"
       "# TYPE kiln_jobs_started_total counter\nkiln_jobs_started_total %llu\n",
       (unsigned long long)stats.jobs_started);
  if (http_part) EMIT("%s", http_part);
#undef EMIT
  free(http_part);
  res->status = 200;
  res->content_type = "text/plain; version=0.0.4";
  res->body = out;
}

static json_t *error_response(const char *description) {
  json_t *r = json_object();
  json_object_set_new(r, "description", json_string(description));
  json_t *content = json_object(), *media = json_object(), *schema = json_object();
  json_object_set_new(schema, "$ref", json_string("#/components/schemas/Error"));
  json_object_set_new(media, "schema", schema);
  json_object_set_new(content, "application/json", media);
  json_object_set_new(r, "content", content);
  return r;
}

void http_openapi(const http_config *cfg, http_request *req, http_response *res) {
  (void)cfg;
  (void)req;
  int n = 0;
  const http_route *routes = http_routes(&n);
  json_t *doc = json_object(), *paths = json_object();
  json_object_set_new(doc, "openapi", json_string("3.0.3"));
  json_t *info = json_object();
  json_object_set_new(info, "title", json_string("kiln"));
  json_object_set_new(info, "version", json_string("v1"));
  json_object_set_new(info, "description",
                      json_string("Training as a service. Errors follow Google's AIP-193 model."));
  json_object_set_new(doc, "info", info);
  for (int i = 0; i < n; i++) {
    json_t *item = json_object_get(paths, routes[i].pattern);
    if (!item) {
      item = json_object();
      json_object_set_new(paths, routes[i].pattern, item);
    }
    json_t *op = json_object();
    char method[16], op_id[160];
    size_t m = 0;
    for (; routes[i].method[m] && m < sizeof method - 1; m++)
      method[m] = (char)(routes[i].method[m] | 0x20); /* lower case */
    method[m] = '\0';
    /* operationId: method plus the path's words, e.g. get_v1_jobs_job_metrics. */
    size_t o = (size_t)snprintf(op_id, sizeof op_id, "%s", method);
    for (const char *p = routes[i].pattern; *p && o < sizeof op_id - 2; p++) {
      char c = *p;
      if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
        op_id[o++] = c;
      } else if (c == '/' || c == ':' || c == '.') {
        op_id[o++] = '_';
      }
    }
    op_id[o] = '\0';
    json_object_set_new(op, "operationId", json_string(op_id));
    json_object_set_new(op, "summary", json_string(routes[i].summary));
    json_t *params = json_array();
    for (const char *p = strchr(routes[i].pattern, '{'); p; p = strchr(p + 1, '{')) {
      const char *close = strchr(p, '}');
      json_t *param = json_object(), *schema = json_object();
      json_object_set_new(param, "name", json_stringn(p + 1, (size_t)(close - p - 1)));
      json_object_set_new(param, "in", json_string("path"));
      json_object_set_new(param, "required", json_true());
      json_object_set_new(schema, "type", json_string("string"));
      json_object_set_new(param, "schema", schema);
      json_array_append_new(params, param);
    }
    json_object_set_new(op, "parameters", params);
    if (!routes[i].public_route) {
      json_t *sec = json_array(), *req_sec = json_object();
      json_object_set_new(req_sec, "bearer", json_array());
      json_array_append_new(sec, req_sec);
      json_object_set_new(op, "security", sec);
    }
    json_t *responses = json_object();
    json_t *ok = json_object();
    json_object_set_new(ok, "description", json_string("success"));
    json_object_set_new(responses, "200", ok);
    json_object_set_new(responses, "default", error_response("an error in the AIP-193 model"));
    json_object_set_new(op, "responses", responses);
    json_object_set_new(item, method, op);
  }
  json_object_set_new(doc, "paths", paths);
  json_t *components = json_object(), *schemas = json_object(), *schemes = json_object();
  json_t *err = json_loads(
      "{\"type\":\"object\",\"properties\":{\"error\":{\"type\":\"object\",\"properties\":{"
      "\"code\":{\"type\":\"integer\"},\"status\":{\"type\":\"string\"},"
      "\"message\":{\"type\":\"string\"},\"details\":{\"type\":\"array\",\"items\":{"
      "\"type\":\"object\",\"properties\":{\"field\":{\"type\":\"string\"},"
      "\"description\":{\"type\":\"string\"}}}}}}}}",
      0, NULL);
  json_object_set_new(schemas, "Error", err ? err : json_object());
  json_t *bearer = json_object();
  json_object_set_new(bearer, "type", json_string("http"));
  json_object_set_new(bearer, "scheme", json_string("bearer"));
  json_object_set_new(schemes, "bearer", bearer);
  json_object_set_new(components, "schemas", schemas);
  json_object_set_new(components, "securitySchemes", schemes);
  json_object_set_new(doc, "components", components);
  http_reply_json(res, 200, doc);
}

/* 1 when the caller may see job id (an admin, or its own tenant's job). */
static int job_visible(const http_config *cfg, const http_request *req, const char *id) {
  if (req->who.admin) return 1;
  store_job job;
  if (store_job_get(cfg->st, id, &job) != STORE_OK) return 0;
  int mine = strcmp(job.tenant, req->who.tenant) == 0;
  store_job_clear(&job);
  return mine;
}

/* Every device of every pool, and the job on it. */
void http_list_devices(const http_config *cfg, http_request *req, http_response *res) {
  enum { MAX_LISTED = SCHED_MAX_POOLS * SCHED_MAX_DEVICES };
  sched_device_info *devices = malloc(MAX_LISTED * sizeof *devices);
  if (!devices) {
    http_reply_status(res, 500, "INTERNAL", NULL, "out of memory");
    return;
  }
  int n = sched_devices_info(cfg->scheduler, devices, MAX_LISTED);
  json_t *arr = json_array();
  for (int i = 0; i < n; i++) {
    const sched_device_info *d = &devices[i];
    json_t *obj = json_object();
    char name[64];
    snprintf(name, sizeof name, "devices/%s-%d", d->device_type, d->index);
    json_object_set_new(obj, "name", json_string(name));
    json_object_set_new(obj, "type", json_string(d->device_type));
    json_object_set_new(obj, "index", json_integer(d->index));
    if (d->model[0]) json_object_set_new(obj, "model", json_string(d->model));
    json_object_set_new(obj, "pool", json_string(d->pool));
    json_object_set_new(obj, "busy", json_boolean(d->job[0] != '\0'));
    /* Another tenant's job id is not shown: only that the device is taken. */
    if (d->job[0] && job_visible(cfg, req, d->job))
      json_object_set_new(obj, "job", json_string(d->job));
    json_array_append_new(arr, obj);
  }
  free(devices);
  json_t *doc = json_object();
  json_object_set_new(doc, "devices", arr);
  http_reply_json(res, 200, doc);
}

void http_list_pools(const http_config *cfg, http_request *req, http_response *res) {
  (void)req;
  sched_pool_info pools[SCHED_MAX_POOLS];
  int n = sched_pools_info(cfg->scheduler, pools, SCHED_MAX_POOLS);
  json_t *arr = json_array();
  for (int k = 0; k < n; k++) {
    json_t *pool = json_object();
    char name[64];
    snprintf(name, sizeof name, "pools/%.31s", pools[k].name);
    json_object_set_new(pool, "name", json_string(name));
    json_object_set_new(pool, "id", json_string(pools[k].name));
    json_object_set_new(pool, "device_type", json_string(pools[k].device_type));
    json_object_set_new(pool, "devices", json_integer(pools[k].devices));
    json_object_set_new(pool, "devices_busy", json_integer(pools[k].devices_busy));
    json_object_set_new(pool, "running_jobs", json_integer(pools[k].running_jobs));
    json_object_set_new(pool, "queued_jobs", json_integer(pools[k].queued_jobs));
    json_array_append_new(arr, pool);
  }
  json_t *doc = json_object();
  json_object_set_new(doc, "pools", arr);
  http_reply_json(res, 200, doc);
}
