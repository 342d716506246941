/* router.c — the route table, matching a request path against it (the
 * bearer-token check: auth.c), the cap on a tenant's blocking requests, and
 * 404 / 405 answers. openapi.json is made from the same table, so a route
 * cannot exist without being documented. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common.h"
#include "routes.h"

static const http_route routes[] = {
    {"GET", "/healthz", http_healthz, 1, "Liveness: the process answers."},
    {"GET", "/readyz", http_readyz, 1, "Readiness: the store and the scheduler work."},
    {"GET", "/metrics", http_prometheus, 1,
     "Prometheus metrics in text format; an admin token unless kilnd runs with --metrics-auth "
     "public."},
    {"GET", "/v1/openapi.json", http_openapi, 1, "This API described as OpenAPI 3.0."},
    {"POST", "/v1/jobs", http_create_job, 0,
     "Create a job from a job spec (request_id, validate_only)."},
    {"GET", "/v1/jobs", http_list_jobs, 0, "List jobs (page_size, page_token, filter, order_by)."},
    {"GET", "/v1/jobs/{job}", http_get_job, 0, "Get a job with its latest metrics."},
    {"DELETE", "/v1/jobs/{job}", http_delete_job, 0, "Delete a finished job and its records."},
    {"POST", "/v1/jobs/{job}:cancel", http_cancel_job, 0, "Cancel a queued or running job."},
    {"POST", "/v1/jobs/{job}:resume", http_resume_job, 0,
     "Queue a cancelled or failed job again; it continues from its newest checkpoint."},
    {"POST", "/v1/jobs/{job}:wait", http_wait_job, 0,
     "Block until the job ends or timeout (e.g. 60s) passes."},
    {"GET", "/v1/jobs/{job}:explain", http_explain_job, 0, "Why a job waits, or where it is."},
    {"GET", "/v1/jobs/{job}/metrics", http_get_metrics, 0,
     "Metric points (name, start_step, end_step, max_points)."},
    {"GET", "/v1/jobs/{job}/metrics:watch", http_watch_metrics, 0,
     "Metric points as server-sent events; resumes after Last-Event-ID."},
    {"GET", "/v1/jobs/{job}/events", http_get_events, 0, "State changes with reason codes."},
    {"GET", "/v1/jobs/{job}/logs", http_get_logs, 0, "The trainer's output, kept after it ends."},
    {"GET", "/v1/jobs/{job}/profile", http_get_profile, 0,
     "The step profile: Chrome trace-event JSON, or ?format=table."},
    {"GET", "/v1/jobs/{job}/checkpoints", http_get_checkpoints, 0, "A job's checkpoints."},
    {"GET", "/v1/jobs/{job}/checkpoints/{checkpoint}", http_get_checkpoint, 0, "One checkpoint."},
    {"GET", "/v1/jobs/{job}/checkpoints/{checkpoint}:download", http_download_checkpoint, 0,
     "The checkpoint file (safetensors)."},
    {"GET", "/v1/jobs/{job}/checkpoints/{checkpoint}:export", http_export_checkpoint, 0,
     "The checkpoint's model for serving (format=onnx: an ONNX file, opset 17)."},
    {"POST", "/v1/jobs/{job}/checkpoints/{checkpoint}:pin", http_pin_checkpoint, 0,
     "Pin a checkpoint: retention (checkpoint.keep_last) never removes it."},
    {"POST", "/v1/jobs/{job}/checkpoints/{checkpoint}:unpin", http_unpin_checkpoint, 0,
     "Unpin a checkpoint: retention may remove it again."},
    {"POST", "/v1/experiments", http_create_experiment, 0,
     "Create an experiment: a base job spec and a search (grid, random, asha) over spec paths; "
     "each trial is a job (request_id, validate_only)."},
    {"GET", "/v1/experiments", http_list_experiments, 0,
     "List experiments (page_size, page_token, filter)."},
    {"GET", "/v1/experiments/{experiment}", http_get_experiment, 0,
     "Get an experiment with its trial counts, epochs trained and best trial."},
    {"POST", "/v1/experiments/{experiment}:cancel", http_cancel_experiment, 0,
     "Cancel an experiment: its running trials are cancelled, paused ones stop."},
    {"GET", "/v1/experiments/{experiment}:best", http_best_trial, 0,
     "The best trial so far by the search's metric (404 while none reported it)."},
    {"GET", "/v1/experiments/{experiment}/trials", http_list_trials, 0,
     "An experiment's trials with their values, states, rungs and metrics (page_size, "
     "page_token)."},
    {"GET", "/v1/experiments/{experiment}/events", http_experiment_events, 0,
     "An experiment's events: trials created, paused, promoted, stopped; its end."},
    {"POST", "/v1/datasets", http_create_dataset, 0,
     "Upload a data set (format=csv|idx|images|tfrecord|tar, label_column, image_feature, "
     "label_feature, display_name); streamed."},
    {"POST", "/v1/datasets:register", http_register_dataset, 0,
     "Register a folder of shards under the server's datasets directory as a data set (admin "
     "only); checked as an upload is."},
    {"GET", "/v1/datasets", http_list_datasets, 0,
     "Built-in and uploaded data sets (page_size, page_token)."},
    {"GET", "/v1/datasets/{dataset}", http_get_dataset, 0, "One data set."},
    {"DELETE", "/v1/datasets/{dataset}", http_delete_dataset, 0,
     "Delete an uploaded data set no unfinished job uses."},
    {"GET", "/v1/devices", http_list_devices, 0, "The device slots the scheduler hands out."},
    {"GET", "/v1/pools", http_list_pools, 0, "Worker pools and their devices."},
    {"POST", "/v1/tokens", http_create_token, 0,
     "Make a bearer token for a tenant (admins only); its secret is shown this once."},
    {"GET", "/v1/tokens", http_list_tokens, 0,
     "Bearer tokens: an admin sees every tenant's, a user its own tenant's; never a secret."},
    {"DELETE", "/v1/tokens/{token}", http_revoke_token, 0,
     "Revoke a token (an admin any, a user its tenant's user tokens): refused from the next "
     "request."},
    {"GET", "/v1/tenants/{tenant}/quota", http_get_quota, 0,
     "A tenant's quota and what it uses (an admin: any tenant; a user: its own)."},
    {"PUT", "/v1/tenants/{tenant}/quota", http_put_quota, 0,
     "Set a tenant's quota (admin only): the fields named; null resets one to kilnd's default."},
    {"POST", "/v1/agents", http_register_agent, 0,
     "Register a kiln-agent, or register it again by its name (an agent token): the same agent, "
     "ONLINE, with the seq of the first command to ask for."},
    {"GET", "/v1/agents", http_list_agents, 0,
     "Worker hosts' agents with their devices, state and last heartbeat (admin only; pool, "
     "page_size, page_token)."},
    {"GET", "/v1/agents/{agent}", http_get_agent, 0,
     "One agent, by id or name (an admin, or the agent itself)."},
    {"GET", "/v1/agents/{agent}/commands", http_poll_agent_commands, 0,
     "An agent's commands not yet done past a seq (after, wait): a long poll that is also its "
     "heartbeat."},
    {"POST", "/v1/agents/{agent}/commands/{seq}:done", http_agent_command_done, 0,
     "Report a command carried out (ok, error, exit_code); a repeated report changes nothing."},
    {"POST", "/v1/allocations/{alloc}/progress", http_post_allocation_progress,
     HTTP_ROUTE_ALLOCATION,
     "Progress lines of an allocation's trainer (its token only), fed to its runner in order."},
    {"PUT", "/v1/allocations/{alloc}/checkpoints/{step}", http_put_allocation_checkpoint,
     HTTP_ROUTE_ALLOCATION,
     "Upload a checkpoint file (sha256=HEX, checked); recorded when its progress line arrives."},
    {"GET", "/v1/allocations/{alloc}/resume", http_get_allocation_resume, HTTP_ROUTE_ALLOCATION,
     "The checkpoint the allocation resumes from (X-Kiln-Sha256, X-Kiln-Step); 404 when none."},
    {"GET", "/v1/allocations/{alloc}/dataset", http_get_allocation_dataset, HTTP_ROUTE_ALLOCATION,
     "The job's data set as a tar stream to unpack where kiln-train reads it "
     "(X-Kiln-Content-Sha256: the stream's SHA-256)."},
    {"HEAD", "/v1/allocations/{alloc}/dataset", http_get_allocation_dataset, HTTP_ROUTE_ALLOCATION,
     "The data set's X-Kiln-Content-Sha256 alone, to look in a cache."},
    {"POST", "/v1/allocations/{alloc}/exit", http_post_allocation_exit, HTTP_ROUTE_ALLOCATION,
     "How the allocation's trainer ended (exit_code or signal): ends the attempt."},
    {"POST", "/v1/allocations/{alloc}/relay", http_post_allocation_relay, HTTP_ROUTE_ALLOCATION,
     "Have a host of a multi-host allocation run Open MPI's daemon (orted, prted) for it."},
    {"GET", "/v1/allocations/{alloc}/relay/{relay}:wait", http_wait_allocation_relay,
     HTTP_ROUTE_ALLOCATION, "Block until a relayed daemon has ended or timeout (e.g. 30s) passes."},
};

const http_route *http_routes(int *n) {
  *n = (int)(sizeof routes / sizeof routes[0]);
  return routes;
}

/* Matches path against pattern; a {name} takes one non-empty segment up to
 * the next '/' or ':' (a custom method's colon). Fills params in order. */
static int match(const char *pattern, const char *path, char params[][128]) {
  int n_params = 0;
  while (*pattern) {
    if (*pattern == '{') {
      const char *close = strchr(pattern, '}');
      size_t len = strcspn(path, "/:");
      if (!close || len == 0 || len >= 128 || n_params == HTTP_MAX_PARAMS) return 0;
      memcpy(params[n_params], path, len);
      params[n_params][len] = '\0';
      n_params++;
      path += len;
      pattern = close + 1;
      continue;
    }
    if (*pattern != *path) return 0;
    pattern++;
    path++;
  }
  return *path == '\0';
}

int http_route_blocks(const http_route *r) {
  return r->handler == http_wait_job || r->handler == http_watch_metrics ||
         r->handler == http_poll_agent_commands;
}

int http_route_for_agents(const http_route *r) {
  return strcmp(r->pattern, "/v1/agents") == 0 || strncmp(r->pattern, "/v1/agents/", 11) == 0;
}

void http_block_key(const http_request *req, char key[64]) {
  if (req->who.agent)
    snprintf(key, 64, "agent/%.57s", req->params[0]);
  else
    snprintf(key, 64, "%s", req->who.tenant);
}

static void serve_dashboard(const http_config *cfg, http_request *req, http_response *res) {
  (void)cfg;
  http_serve_static(req, res);
}

const http_route *http_route_find(const char *method, const char *path,
                                  char params[HTTP_MAX_PARAMS][128], char *allowed,
                                  size_t allowed_len) {
  if (allowed_len) allowed[0] = '\0';
  for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
    const http_route *r = &routes[i];
    char found[HTTP_MAX_PARAMS][128];
    if (!match(r->pattern, path, found)) continue;
    if (strcmp(r->method, method) != 0) {
      size_t used = strlen(allowed);
      if (used + 1 < allowed_len)
        snprintf(allowed + used, allowed_len - used, "%s%s", used ? ", " : "", r->method);
      continue;
    }
    memcpy(params, found, sizeof found);
    return r;
  }
  return NULL;
}

http_handler http_route_request(const http_config *cfg, http_request *req, http_response *res) {
  if (http_static_path(req->path)) return serve_dashboard;
  char allowed[64];
  const http_route *r =
      http_route_find(req->method, req->path, req->params, allowed, sizeof allowed);
  if (r) {
    if (r->public_route == HTTP_ROUTE_ALLOCATION) {
      if (http_authenticate_allocation(cfg, req, res) != 0) return NULL;
      return r->handler;
    }
    if (!r->public_route && http_authenticate(cfg, req, res) != 0) return NULL;
    if (!r->public_route && req->who.agent && !http_route_for_agents(r)) {
      http_reply_status(res, 403, "PERMISSION_DENIED", "role",
                        "an agent token may call only the /v1/agents routes, not %s %.200s",
                        req->method, req->path);
      return NULL;
    }
    if (http_route_blocks(r)) {
      char key[64];
      http_block_key(req, key);
      if (http_waker_admit(cfg->waker, key, res) != 0) return NULL;
      req->admitted = 1;
    }
    return r->handler;
  }
  if (allowed[0]) {
    http_reply_status(res, 405, "UNIMPLEMENTED", "method", "%s is not supported on %s; use %s",
                      req->method, req->path, allowed);
  } else {
    http_reply_status(res, 404, "NOT_FOUND", "path", "no route %s %.200s", req->method, req->path);
  }
  return NULL;
}
