/* routes.h — private to server/: the route table's handlers and the helpers
 * they share (replies in the error model, job resources, loading a job the
 * caller may see). */
#ifndef KILN_SERVER_ROUTES_H
#define KILN_SERVER_ROUTES_H

#include <jansson.h>

#include "api.h"
#include "server.h"

typedef void (*http_handler)(const http_config *cfg, http_request *req, http_response *res);

typedef struct http_route {
  const char *method;
  const char *pattern; /* "/v1/jobs/{job}:cancel": {name} is one path segment */
  http_handler handler;
  int public_route; /* HTTP_ROUTE_*: 1 answered without a token */
  const char *summary;
} http_route;

/* Who may call a route: a user or admin token, anyone, or the worker side
 * of one allocation with that allocation's token. */
#define HTTP_ROUTE_TOKEN      0
#define HTTP_ROUTE_PUBLIC     1
#define HTTP_ROUTE_ALLOCATION 2

/* The router's table, in matching order; openapi.json is made from it. */
const http_route *http_routes(int *n);
/* 1 for a route whose requests may wait, parked (:wait, metrics:watch):
 * each counts against its tenant's --max-blocked-per-tenant. */
int http_route_blocks(const http_route *r);
/* 1 for the /v1/agents routes: the only ones an agent token may call. */
int http_route_for_agents(const http_route *r);
/* Whose count of blocking requests a request is in: its tenant's, or for
 * a kiln-agent's poll its agent's own (every agent token is one tenant's,
 * and each agent keeps a poll open). */
void http_block_key(const http_request *req, char key[64]);
/* Finds the request's route and checks its token (and, for a blocking
 * route, the tenant's cap) as soon as its headers are in, before any body
 * is read: the handler to run once the body is complete, or NULL having
 * answered in res (401, 404, 405, 429). */
http_handler http_route_request(const http_config *cfg, http_request *req, http_response *res);
/* The route for method and path, with its path parameters in params; NULL
 * when none, with allowed ("GET, DELETE", cut to allowed_len) naming the
 * methods the path has, empty when no route has the path (404, not 405). */
const http_route *http_route_find(const char *method, const char *path,
                                  char params[HTTP_MAX_PARAMS][128], char *allowed,
                                  size_t allowed_len);

/* ---- query and header arguments ---- */
/* An integer in lo..hi, the whole text; 0, or -1 when malformed. */
int http_parse_int_arg(const char *text, int lo, int hi, int *out);
/* A list filter: "state=RUNNING", for admins also "tenant=acme", joined by
 * " AND "; 0, or -1 with a sentence in why. */
int http_parse_filter(const char *filter, const http_request *req, const char **state, char *tenant,
                      size_t tenant_len, char *why, size_t why_len);
/* :wait's timeout: "90s", "1.5s", "2m", "500ms" or a bare number of
 * seconds; -1 when malformed. */
double http_parse_duration(const char *text);
/* Last-Event-ID (NULL or empty: 0, from the start); 0, or -1 unless it is
 * an integer >= 0. */
int http_parse_last_event_id(const char *text, int64_t *after);

/* ---- replies ---- */
void http_reply_json(http_response *res, int status, json_t *doc); /* steals doc */
void http_reply_error(http_response *res, const api_error *e);
void http_reply_status(http_response *res, int http, const char *status, const char *field,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void http_reply_store_failure(http_response *res, store *st);
json_t *http_rfc3339(int64_t ms);

/* ---- jobs ---- */
json_t *http_job_json(store *st, const store_job *job, int with_metrics);
/* Answers 200 with the job's resource, its stored spec spliced in as text. */
void http_reply_job(http_response *res, store *st, const store_job *job, int with_metrics);
/* best: 1 for the checkpoint that ranks best (http_checkpoint_rank). */
json_t *http_checkpoint_json(const char *job_id, const store_checkpoint *c, int best);
/* A list's page_size (AIP-158): none or 0 gives the default (50), more than
 * 1000, however many digits, gives 1000; 0, or -1 for text that is not a
 * whole number >= 0. */
int http_parse_page_size(const char *text, int *out);
/* 1 when s is 1..max characters of A-Z a-z 0-9 - _ . (ids, request ids). */
int http_valid_name(const char *s, size_t max);
/* Loads the job of path parameter 0 if the caller may see it; else answers
 * 404 (another tenant's job is as absent as a missing one) and returns -1. */
int http_load_job(const http_config *cfg, const http_request *req, store_job *job,
                  http_response *res);

/* The checkpoint of path parameter 1 in job (and whether it ranks best,
 * when best is not NULL); 0, or -1 having answered 404. */
int http_load_checkpoint(const http_config *cfg, const http_request *req, const store_job *job,
                         store_checkpoint *out, int *best, http_response *res);
/* Answers 200 with the file at path; -1 (nothing answered) when it cannot
 * be opened. */
int http_reply_file(http_response *res, const char *path, const char *content_type);
/* job_fields.c */
/* Adds run_seconds and queue_seconds (over every attempt, from the job's
 * events; a span still going counts up to now) and progress (steps) to a
 * job resource. */
void http_job_add_derived(store *st, const store_job *job, json_t *o);
typedef struct http_checkpoint_ranking {
  char metric[48];      /* what the checkpoints rank by */
  int higher_is_better; /* the metric's mode: 1 max, 0 min */
  int best;             /* index into the list; -1 when none carries the metric */
} http_checkpoint_ranking;
/* Ranks a job's checkpoints by the spec's checkpoint.keep_best monitor and
 * mode, else by val_loss if any checkpoint carries it, else by loss, lower
 * better; a checkpoint without the metric is never best. Returns out->best. */
int http_checkpoint_rank(const store_job *job, const store_checkpoint *list, int n,
                         http_checkpoint_ranking *out);

/* handlers.c */
void http_create_job(const http_config *cfg, http_request *req, http_response *res);
void http_list_jobs(const http_config *cfg, http_request *req, http_response *res);
void http_get_job(const http_config *cfg, http_request *req, http_response *res);
void http_get_metrics(const http_config *cfg, http_request *req, http_response *res);
void http_get_checkpoints(const http_config *cfg, http_request *req, http_response *res);
void http_get_events(const http_config *cfg, http_request *req, http_response *res);
void http_list_datasets(const http_config *cfg, http_request *req, http_response *res);
void http_get_dataset(const http_config *cfg, http_request *req, http_response *res);
void http_delete_dataset(const http_config *cfg, http_request *req, http_response *res);
void http_create_dataset(const http_config *cfg, http_request *req, http_response *res);
void http_register_dataset(const http_config *cfg, http_request *req, http_response *res);
/* A new data set id ("ds-" and 16 random hex digits): 0, or -1. */
int http_new_dataset_id(char out[API_DATASET_ID_LEN + 1]);
/* Checks the data set staged in tmp_dir (kiln-train --check-dataset on
 * its manifest m, written there), then moves it into place and adds its
 * row: answers 200 with the resource, or the error (400 naming the file
 * and record of bad data). upload_bytes: an upload's size. */
void http_dataset_admit(const http_config *cfg, const char *tmp_dir, const api_dataset_manifest *m,
                        const char *display_name, const char *tenant, int64_t upload_bytes,
                        http_response *res);
void http_healthz(const http_config *cfg, http_request *req, http_response *res);
/* job_actions.c */
void http_delete_job(const http_config *cfg, http_request *req, http_response *res);
void http_cancel_job(const http_config *cfg, http_request *req, http_response *res);
/* Cancels an unfinished job: a queued one at once (queued_message), a
 * running one STOPPING and its trainer asked to stop (running_message). A
 * STORE_* code. */
int http_cancel_job_id(const http_config *cfg, const char *id, const char *queued_message,
                       const char *running_message);
void http_wait_job(const http_config *cfg, http_request *req, http_response *res);
void http_explain_job(const http_config *cfg, http_request *req, http_response *res);
void http_get_logs(const http_config *cfg, http_request *req, http_response *res);
void http_get_profile(const http_config *cfg, http_request *req, http_response *res);
void http_get_checkpoint(const http_config *cfg, http_request *req, http_response *res);
void http_download_checkpoint(const http_config *cfg, http_request *req, http_response *res);
void http_pin_checkpoint(const http_config *cfg, http_request *req, http_response *res);
void http_unpin_checkpoint(const http_config *cfg, http_request *req, http_response *res);
/* export.c */
void http_export_checkpoint(const http_config *cfg, http_request *req, http_response *res);
/* static.c: answers the dashboard's paths (1) or leaves the request to the
 * route table (0). */
int http_serve_static(http_request *req, http_response *res);
/* 1 for a path of the dashboard (http_serve_static answers it). */
int http_static_path(const char *path);
/* job_resume.c */
void http_resume_job(const http_config *cfg, http_request *req, http_response *res);
/* sse.c */
void http_watch_metrics(const http_config *cfg, http_request *req, http_response *res);
/* observe.c */
void http_readyz(const http_config *cfg, http_request *req, http_response *res);
void http_prometheus(const http_config *cfg, http_request *req, http_response *res);
void http_list_devices(const http_config *cfg, http_request *req, http_response *res);
void http_list_pools(const http_config *cfg, http_request *req, http_response *res);
/* tokens.c */
void http_create_token(const http_config *cfg, http_request *req, http_response *res);
void http_list_tokens(const http_config *cfg, http_request *req, http_response *res);
void http_revoke_token(const http_config *cfg, http_request *req, http_response *res);
/* tenants.c */
void http_get_quota(const http_config *cfg, http_request *req, http_response *res);
void http_put_quota(const http_config *cfg, http_request *req, http_response *res);
/* At create: a user's priority ceiling (403), the tenant's devices and
 * waiting jobs (429). 0, or -1 having answered. */
int http_check_job_quota(const http_config *cfg, const http_principal *who,
                         const api_job_spec *spec, http_response *res);
/* At upload: incoming more bytes within the tenant's max_storage_bytes
 * (429 otherwise). 0, or -1 having answered. */
int http_check_storage_quota(const http_config *cfg, const http_principal *who, int64_t incoming,
                             http_response *res);
/* plan.c: the spec's planned memory in *planned (0 without a planner); -1
 * having answered 409 when it exceeds cfg->memory_budget_bytes. */
int http_plan_memory(const http_config *cfg, const char *spec_json, int64_t *planned,
                     http_response *res);
/* experiments.c */
void http_create_experiment(const http_config *cfg, http_request *req, http_response *res);
void http_list_experiments(const http_config *cfg, http_request *req, http_response *res);
void http_get_experiment(const http_config *cfg, http_request *req, http_response *res);
void http_cancel_experiment(const http_config *cfg, http_request *req, http_response *res);
void http_list_trials(const http_config *cfg, http_request *req, http_response *res);
void http_best_trial(const http_config *cfg, http_request *req, http_response *res);
void http_experiment_events(const http_config *cfg, http_request *req, http_response *res);
/* The Experiment resource (its trial counts and best trial read from st)
 * and one Trial of the trials list. */
json_t *http_experiment_json(store *st, const store_experiment *e);
json_t *http_trial_json(const store_trial *t);
/* A trial's job: "experiment" and "trial" {"index", "values"} added to its
 * resource (nothing for other jobs). */
void http_job_add_trial(store *st, const store_job *job, json_t *o);
/* agents.c */
/* What a registration answers: poll at least this often (less in a pool
 * with a short grace window), and the window past which a silent agent is
 * LOST for a pool that is not an agents pool of the scheduler's. */
#define HTTP_AGENT_HEARTBEAT_S 10
#define HTTP_AGENT_GRACE_S     25
void http_register_agent(const http_config *cfg, http_request *req, http_response *res);
void http_list_agents(const http_config *cfg, http_request *req, http_response *res);
void http_get_agent(const http_config *cfg, http_request *req, http_response *res);
void http_poll_agent_commands(const http_config *cfg, http_request *req, http_response *res);
void http_agent_command_done(const http_config *cfg, http_request *req, http_response *res);
/* The Agent resource (its devices parsed from the stored JSON). */
json_t *http_agent_json(const store_agent *a);
/* allocations.c: the worker side of an allocation (its token only) */
void http_post_allocation_progress(const http_config *cfg, http_request *req, http_response *res);
void http_put_allocation_checkpoint(const http_config *cfg, http_request *req, http_response *res);
void http_get_allocation_resume(const http_config *cfg, http_request *req, http_response *res);
/* An agent resource's "allocations": the unended allocations with a host
 * on it, each {id, job, attempt, cores, rank_first, ranks}. */
void http_agent_add_allocations(store *st, const char *agent_id, json_t *o);
/* At registration: a `drop` for each allocation id in running (a JSON
 * array) that kilnd does not place on the agent now. 0, or -1 on a store
 * failure. */
int http_agent_drop_stale(store *st, const char *agent_id, json_t *running);
/* alloc_dataset.c: GET and HEAD */
void http_get_allocation_dataset(const http_config *cfg, http_request *req, http_response *res);
void http_post_allocation_exit(const http_config *cfg, http_request *req, http_response *res);
void http_post_allocation_relay(const http_config *cfg, http_request *req, http_response *res);
void http_wait_allocation_relay(const http_config *cfg, http_request *req, http_response *res);
/* openapi.c */
void http_openapi(const http_config *cfg, http_request *req, http_response *res);

#endif
