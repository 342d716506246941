/* tenants.c — a tenant's quota: GET and PUT /v1/tenants/{tenant}/quota
 * (an admin sets it; a tenant reads its own), and the checks that enforce
 * it: a user's priority ceiling, devices and waiting jobs at create, bytes
 * stored at upload. A limit an admin has not set is kilnd's default
 * (cfg->quota_defaults); 0 means no limit. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "routes.h"

/* The limits in force for tenant: its own where set, else the defaults. */
static int effective_quota(const http_config *cfg, const char *tenant, store_quota *q) {
  return store_quota_effective(cfg->st, tenant, &cfg->quota_defaults, q) == STORE_OK ? 0 : -1;
}

int http_check_job_quota(const http_config *cfg, const http_principal *who,
                         const api_job_spec *spec, http_response *res) {
  store_quota q;
  if (effective_quota(cfg, who->tenant, &q) != 0) {
    http_reply_store_failure(res, cfg->st);
    return -1;
  }
  /* Only an admin may place a job above the tenant's ceiling: a user's
   * priority preempts other tenants' work. */
  if (!who->admin && spec->priority > q.max_priority) {
    http_reply_status(res, 403, "PERMISSION_DENIED", "priority",
                      "priority %d is above tenant %s's ceiling max_priority %lld; an admin can "
                      "raise it with PUT /v1/tenants/%s/quota",
                      spec->priority, who->tenant, (long long)q.max_priority, who->tenant);
    return -1;
  }
  if (q.max_devices <= 0 && q.max_queued_jobs <= 0) return 0;
  store_usage u;
  if (store_usage_get(cfg->st, who->tenant, &u) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return -1;
  }
  if (q.max_devices > 0 && u.devices + spec->devices > q.max_devices) {
    http_reply_status(res, 429, "RESOURCE_EXHAUSTED", "resources.devices",
                      "tenant %s's unfinished jobs ask for %lld devices; %d more would pass its "
                      "quota max_devices %lld",
                      who->tenant, (long long)u.devices, spec->devices, (long long)q.max_devices);
    return -1;
  }
  if (q.max_queued_jobs > 0 && u.queued_jobs + 1 > q.max_queued_jobs) {
    http_reply_status(res, 429, "RESOURCE_EXHAUSTED", "max_queued_jobs",
                      "tenant %s has %lld jobs waiting, its quota max_queued_jobs %lld; wait for "
                      "one to start or cancel one",
                      who->tenant, (long long)u.queued_jobs, (long long)q.max_queued_jobs);
    return -1;
  }
  return 0;
}

int http_check_storage_quota(const http_config *cfg, const http_principal *who, int64_t incoming,
                             http_response *res) {
  store_quota q;
  if (effective_quota(cfg, who->tenant, &q) != 0) {
    http_reply_store_failure(res, cfg->st);
    return -1;
  }
  if (q.max_storage_bytes <= 0) return 0;
  store_usage u;
  if (store_usage_get(cfg->st, who->tenant, &u) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return -1;
  }
  if (u.storage_bytes + incoming <= q.max_storage_bytes) return 0;
  http_reply_status(res, 429, "RESOURCE_EXHAUSTED", "max_storage_bytes",
                    "tenant %s stores %lld bytes (uploads and checkpoints); %lld more would pass "
                    "its quota max_storage_bytes %lld; delete data sets or jobs",
                    who->tenant, (long long)u.storage_bytes, (long long)incoming,
                    (long long)q.max_storage_bytes);
  return -1;
}

/* {tenant} of the path, if the caller may see that quota: an admin any, a
 * user its own tenant's. 0, or -1 having answered. */
static int quota_tenant(const http_request *req, http_response *res) {
  const char *tenant = req->params[0];
  if (!http_valid_name(tenant, 63)) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "tenant",
                      "tenant must be 1-63 characters of A-Z a-z 0-9 - _ .");
    return -1;
  }
  if (!req->who.admin && strcmp(tenant, req->who.tenant) != 0) {
    http_reply_status(res, 403, "PERMISSION_DENIED", "tenant",
                      "a user token reads only its own tenant's quota (%s)", req->who.tenant);
    return -1;
  }
  return 0;
}

static void reply_quota(const http_config *cfg, const char *tenant, http_response *res) {
  store_quota q;
  store_usage u;
  if (effective_quota(cfg, tenant, &q) != 0 || store_usage_get(cfg->st, tenant, &u) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return;
  }
  char name[96];
  snprintf(name, sizeof name, "tenants/%s/quota", tenant);
  json_t *doc = json_pack(
      "{s:s,s:s,s:I,s:I,s:I,s:I,s:{s:I,s:I,s:I}}", "name", name, "tenant", tenant, "max_priority",
      (json_int_t)q.max_priority, "max_devices", (json_int_t)q.max_devices, "max_queued_jobs",
      (json_int_t)q.max_queued_jobs, "max_storage_bytes", (json_int_t)q.max_storage_bytes, "usage",
      "queued_jobs", (json_int_t)u.queued_jobs, "devices", (json_int_t)u.devices, "storage_bytes",
      (json_int_t)u.storage_bytes);
  http_reply_json(res, 200, doc);
}

void http_get_quota(const http_config *cfg, http_request *req, http_response *res) {
  if (quota_tenant(req, res) != 0) return;
  reply_quota(cfg, req->params[0], res);
}

static const struct {
  const char *key;
  size_t offset;
  int64_t max;
} quota_fields[] = {
    {"max_priority", offsetof(store_quota, max_priority), 100},
    {"max_devices", offsetof(store_quota, max_devices), 1 << 20},
    {"max_queued_jobs", offsetof(store_quota, max_queued_jobs), 1 << 30},
    {"max_storage_bytes", offsetof(store_quota, max_storage_bytes), (int64_t)1 << 60},
};

void http_put_quota(const http_config *cfg, http_request *req, http_response *res) {
  if (!req->who.admin) {
    http_reply_status(
        res, 403, "PERMISSION_DENIED", "role",
        "only an admin token sets a tenant's quota; this one is tenant %s's user token",
        req->who.tenant);
    return;
  }
  if (quota_tenant(req, res) != 0) return;
  json_error_t jerr;
  json_t *body = json_loadb(req->body, req->body_len, 0, &jerr);
  if (!json_is_object(body)) {
    json_decref(body);
    http_reply_status(res, 400, "INVALID_ARGUMENT", "body",
                      "the body must be a JSON object of quota fields");
    return;
  }
  store_quota q;
  if (store_quota_get(cfg->st, req->params[0], &q) != STORE_OK) {
    json_decref(body);
    http_reply_store_failure(res, cfg->st);
    return;
  }
  /* The fields named are set (null: back to kilnd's default); the others keep their value. */
  const char *key;
  json_t *value;
  json_object_foreach(body, key, value) {
    size_t i = 0, n = sizeof quota_fields / sizeof quota_fields[0];
    while (i < n && strcmp(quota_fields[i].key, key) != 0) i++;
    if (i == n) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", key,
                        "unknown quota field '%.40s'; the fields are max_priority, max_devices, "
                        "max_queued_jobs, max_storage_bytes",
                        key);
      json_decref(body);
      return;
    }
    int64_t *slot = (int64_t *)((char *)&q + quota_fields[i].offset);
    if (json_is_null(value)) {
      *slot = STORE_QUOTA_DEFAULT;
      continue;
    }
    if (!json_is_integer(value) || json_integer_value(value) < 0 ||
        json_integer_value(value) > quota_fields[i].max) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", key,
                        "%s must be an integer in 0..%lld (%snull: kilnd's default)", key,
                        (long long)quota_fields[i].max, i == 0 ? "" : "0: no limit; ");
      json_decref(body);
      return;
    }
    *slot = json_integer_value(value);
  }
  json_decref(body);
  if (store_quota_put(cfg->st, req->params[0], &q) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return;
  }
  reply_quota(cfg, req->params[0], res);
}
