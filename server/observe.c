/* observe.c — what operators and tools read: /readyz, /metrics (Prometheus
 * text: jobs by state, queue depth, devices busy, metric points ingested,
 * HTTP requests and latency), and the device inventory and pools. */
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
  /* Its counts span every tenant: an admin's to read, unless the operator
   * made them public (--metrics-auth public), where no series names a tenant. */
  if (!cfg->metrics_public) {
    if (http_authenticate(cfg, req, res) != 0) return;
    if (!req->who.admin) {
      http_reply_status(res, 403, "PERMISSION_DENIED", "role",
                        "/metrics counts every tenant's jobs: it needs an admin token (or kilnd "
                        "--metrics-auth public)");
      return;
    }
  }
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
