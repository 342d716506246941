/* experiments.c — the /v1/experiments routes: create (every trial's spec
 * made and validated before anything starts), get, list, :cancel, trials,
 * :best and events, each scoped to the caller's tenant like jobs. The
 * scheduler drives the trials (scheduler/experiments.c). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_search.h"
#include "common.h"
#include "routes.h"

/* ---- resources ---- */

static json_t *number_or_null(double v) {
  return isfinite(v) ? json_real(v) : json_null();
}

static json_t *values_of(const store_trial *t) {
  json_t *v = t->values_json ? json_loads(t->values_json, 0, NULL) : NULL;
  return v ? v : json_object();
}

/* A trial's metric: its result at the last rung it finished. */
static int trial_metric(const store_trial *t, double *metric) {
  if (t->n_results == 0) return 0;
  *metric = t->results[t->n_results - 1];
  return 1;
}

json_t *http_trial_json(const store_trial *t) {
  json_t *o = json_object();
  json_object_set_new(o, "job", json_string(t->job_id));
  json_object_set_new(o, "index", json_integer(t->index));
  json_object_set_new(o, "values", values_of(t));
  json_object_set_new(o, "state", json_string(t->job_state));
  json_object_set_new(o, "trial_state", json_string(t->state));
  json_object_set_new(o, "rung", json_integer(t->rung));
  json_object_set_new(o, "epochs_trained", json_integer(t->epochs));
  double m;
  json_object_set_new(o, "metric", trial_metric(t, &m) ? number_or_null(m) : json_null());
  json_t *results = json_array();
  for (int i = 0; i < t->n_results; i++)
    json_array_append_new(results, number_or_null(t->results[i]));
  json_object_set_new(o, "rung_metrics", results);
  return o;
}

/* The best trial by its metric (-1 when none has one). */
static int best_trial(const api_search *search, const store_trial *trials, int n) {
  int best = -1;
  double best_metric = NAN;
  for (int i = 0; i < n; i++) {
    double m;
    if (!trial_metric(&trials[i], &m) || !isfinite(m)) continue;
    if (best < 0 || api_search_better(search, m, best_metric)) {
      best = i;
      best_metric = m;
    }
  }
  return best;
}

static json_t *best_json(const store_trial *t) {
  json_t *o = json_object();
  double m = NAN;
  trial_metric(t, &m);
  json_object_set_new(o, "job", json_string(t->job_id));
  json_object_set_new(o, "index", json_integer(t->index));
  json_object_set_new(o, "values", values_of(t));
  json_object_set_new(o, "metric", number_or_null(m));
  json_object_set_new(o, "epochs", json_integer(t->epochs));
  return o;
}

static json_t *loads_or_object(const char *text) {
  json_t *v = text ? json_loads(text, 0, NULL) : NULL;
  return v ? v : json_object();
}

json_t *http_experiment_json(store *st, const store_experiment *e) {
  json_t *o = json_object();
  if (e->id[0]) {
    char name[64];
    snprintf(name, sizeof name, "experiments/%s", e->id);
    json_object_set_new(o, "name", json_string(name));
    json_object_set_new(o, "id", json_string(e->id));
  }
  json_object_set_new(o, "display_name", json_string(e->display_name));
  json_object_set_new(o, "tenant", json_string(e->tenant));
  if (e->request_id[0]) json_object_set_new(o, "request_id", json_string(e->request_id));
  json_object_set_new(o, "state", json_string(e->state));
  json_object_set_new(o, "message", json_string(e->message ? e->message : ""));
  json_object_set_new(o, "spec", loads_or_object(e->spec_json));
  json_object_set_new(o, "search", loads_or_object(e->search_json));
  if (e->create_ms > 0) json_object_set_new(o, "create_time", http_rfc3339(e->create_ms));
  if (e->end_ms > 0) json_object_set_new(o, "end_time", http_rfc3339(e->end_ms));
  store_trial *trials = NULL;
  int n = 0;
  api_search *search = NULL;
  api_error err;
  const char *search_text = e->search_json ? e->search_json : "";
  if (api_search_parse(search_text, strlen(search_text), &search, &err) != 0) search = NULL;
  if (e->id[0] && store_trial_list(st, e->id, 0, 0, &trials, &n) != STORE_OK) n = 0;
  int counts[API_TRIAL_STATE_COUNT] = {0};
  long long epochs = 0;
  for (int i = 0; i < n; i++) {
    int k = api_trial_state_parse(trials[i].state);
    if (k >= 0) counts[k]++;
    epochs += trials[i].epochs;
  }
  json_object_set_new(o, "trial_count",
                      json_integer(n        ? n
                                   : search ? api_search_trial_count(search)
                                            : 0));
  json_object_set_new(o, "trials_waiting", json_integer(counts[API_TRIAL_WAITING]));
  json_object_set_new(o, "trials_running",
                      json_integer(counts[API_TRIAL_RUNNING] + counts[API_TRIAL_PROMOTED]));
  json_object_set_new(o, "trials_paused", json_integer(counts[API_TRIAL_PAUSED]));
  json_object_set_new(o, "trials_stopped", json_integer(counts[API_TRIAL_STOPPED]));
  json_object_set_new(o, "trials_done", json_integer(counts[API_TRIAL_DONE]));
  json_object_set_new(o, "trials_failed", json_integer(counts[API_TRIAL_FAILED]));
  json_object_set_new(o, "epochs_trained", json_integer(epochs));
  int best = search ? best_trial(search, trials, n) : -1;
  json_object_set_new(o, "best_trial", best >= 0 ? best_json(&trials[best]) : json_null());
  store_trial_list_free(trials, n);
  api_search_free(search);
  return o;
}

void http_job_add_trial(store *st, const store_job *job, json_t *o) {
  if (!job->experiment[0]) return;
  json_object_set_new(o, "experiment", json_string(job->experiment));
  store_trial t;
  if (store_trial_of_job(st, job->id, &t) != STORE_OK) return;
  json_t *trial = json_object();
  json_object_set_new(trial, "index", json_integer(t.index));
  json_object_set_new(trial, "values", values_of(&t));
  json_object_set_new(trial, "trial_state", json_string(t.state));
  json_object_set_new(o, "trial", trial);
  free(t.values_json);
}

/* Loads the experiment of path parameter 0 if the caller may see it; else
 * answers 404 and returns -1. */
static int load_experiment(const http_config *cfg, const http_request *req, store_experiment *e,
                           http_response *res) {
  const char *id = req->params[0];
  memset(e, 0, sizeof *e);
  int rc = http_valid_name(id, 39) ? store_experiment_get(cfg->st, id, e) : STORE_NOT_FOUND;
  if (rc == STORE_OK && !req->who.admin && strcmp(e->tenant, req->who.tenant) != 0) {
    store_experiment_clear(e); /* another tenant's: as absent as a missing one */
    rc = STORE_NOT_FOUND;
  }
  if (rc == STORE_NOT_FOUND) {
    http_reply_status(res, 404, "NOT_FOUND", "experiment", "experiment '%.60s' does not exist", id);
    return -1;
  }
  if (rc != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return -1;
  }
  return 0;
}

/* ---- create ---- */

/* Prefixes each detail's field with "spec." (the base spec sits there in
 * the experiment's body). */
static void prefix_spec_fields(api_error *e) {
  for (int i = 0; i < e->n_details; i++) {
    char field[sizeof e->details[i].field];
    /* A field's path is far shorter than the detail's room; cut to fit. */
    snprintf(field, sizeof field, "spec%s%.*s", e->details[i].field[0] ? "." : "",
             (int)sizeof field - 6, e->details[i].field);
    memcpy(e->details[i].field, field, sizeof field);
  }
}

/* The body's spec and search as text, checked for the fields an
 * experiment has; -1 having answered. */
static int read_body(http_request *req, char **spec_text, char **search_text, char *display_name,
                     size_t name_len, http_response *res) {
  json_error_t jerr;
  json_t *root = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr);
  if (!json_is_object(root)) {
    json_decref(root);
    http_reply_status(res, 400, "INVALID_ARGUMENT", NULL, "the body must be a JSON object: %s",
                      jerr.text);
    return -1;
  }
  const char *key;
  json_t *value;
  json_object_foreach(root, key, value) {
    if (strcmp(key, "display_name") && strcmp(key, "spec") && strcmp(key, "search")) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", key,
                        "unknown field '%.60s': an experiment has display_name, spec and search",
                        key);
      json_decref(root);
      return -1;
    }
  }
  json_t *name = json_object_get(root, "display_name");
  if (name && (!json_is_string(name) || strlen(json_string_value(name)) >= name_len)) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "display_name",
                      "display_name must be a string of at most %zu bytes", name_len - 1);
    json_decref(root);
    return -1;
  }
  snprintf(display_name, name_len, "%s", name ? json_string_value(name) : "");
  json_t *spec = json_object_get(root, "spec"), *search = json_object_get(root, "search");
  if (!json_is_object(spec) || !json_is_object(search)) {
    const char *field = !json_is_object(spec) ? "spec" : "search";
    http_reply_status(res, 400, "INVALID_ARGUMENT", field,
                      "%s must be an object: the base job spec (as POST /v1/jobs takes) and the "
                      "search over it",
                      field);
    json_decref(root);
    return -1;
  }
  *spec_text = json_dumps(spec, JSON_COMPACT | JSON_REAL_PRECISION(17));
  *search_text = json_dumps(search, JSON_COMPACT | JSON_REAL_PRECISION(17));
  json_decref(root);
  if (!*spec_text || !*search_text) {
    free(*spec_text);
    free(*search_text);
    http_reply_status(res, 500, "INTERNAL", NULL, "out of memory");
    return -1;
  }
  return 0;
}

/* The spec with the fields that never change a plan's memory left out (the
 * optimizer's scalars, the seed): trials that differ only there share one
 * plan, so a search over learning rates plans once. malloc'd. */
static char *plan_key(const char *spec) {
  static const char *const optimizer_scalars[] = {
      "learning_rate", "weight_decay", "beta_1",          "beta_2",
      "epsilon",       "rho",          "global_clipnorm", "initial_accumulator_value"};
  json_t *o = json_loads(spec, 0, NULL);
  if (!o) return NULL;
  json_t *opt = json_object_get(o, "optimizer");
  for (size_t i = 0; i < sizeof optimizer_scalars / sizeof optimizer_scalars[0]; i++)
    json_object_del(opt, optimizer_scalars[i]);
  json_object_del(o, "seed");
  json_object_del(o, "display_name");
  char *key = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(o);
  return key;
}

/* Makes every trial's values and spec, validated, and plans its memory;
 * -1 having answered. */
static int make_trials(const http_config *cfg, const api_search *search, const char *base,
                       store_trial *trials, int n, http_response *res) {
  char **keys = calloc((size_t)n, sizeof *keys);
  int rc = keys ? 0 : -1;
  if (!keys) http_reply_status(res, 500, "INTERNAL", NULL, "out of memory");
  for (int i = 0; i < n && rc == 0; i++) {
    trials[i].index = i;
    trials[i].values_json = api_search_trial_values(search, i);
    if (!trials[i].values_json) {
      http_reply_status(res, 500, "INTERNAL", NULL, "out of memory");
      rc = -1;
      break;
    }
    char *spec = NULL;
    api_error e;
    if (api_search_trial_spec(search, base, trials[i].values_json,
                              api_search_rung_epochs(search, api_search_rung_count(search) - 1),
                              &spec, &e) != 0) {
      http_reply_error(res, &e);
      rc = -1;
      break;
    }
    keys[i] = plan_key(spec);
    int planned = -1;
    for (int k = 0; k < i && planned < 0 && keys[i]; k++)
      if (keys[k] && strcmp(keys[k], keys[i]) == 0) planned = k;
    if (planned >= 0)
      trials[i].planned_memory_bytes = trials[planned].planned_memory_bytes;
    else
      rc = http_plan_memory(cfg, spec, &trials[i].planned_memory_bytes, res);
    free(spec);
  }
  for (int i = 0; keys && i < n; i++) free(keys[i]);
  free(keys);
  return rc;
}

void http_create_experiment(const http_config *cfg, http_request *req, http_response *res) {
  const char *request_id = http_query(req, "request_id");
  const char *validate_only = http_query(req, "validate_only");
  if (request_id && !http_valid_name(request_id, 79)) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "request_id",
                      "request_id must be 1-79 characters of A-Z a-z 0-9 - _ .");
    return;
  }
  if (validate_only && strcmp(validate_only, "true") && strcmp(validate_only, "false")) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "validate_only",
                      "validate_only must be true or false, got '%.40s'", validate_only);
    return;
  }
  const int dry_run = validate_only && strcmp(validate_only, "true") == 0;
  char earlier[40];
  if (request_id && !dry_run &&
      store_experiment_find_request(cfg->st, req->who.tenant, request_id, earlier) == STORE_OK) {
    store_experiment e;
    if (store_experiment_get(cfg->st, earlier, &e) == STORE_OK) {
      http_reply_json(res, 200, http_experiment_json(cfg->st, &e));
      store_experiment_clear(&e);
      return;
    }
  }
  store_experiment exp;
  memset(&exp, 0, sizeof exp);
  char *spec_text = NULL, *search_text = NULL;
  if (read_body(req, &spec_text, &search_text, exp.display_name, sizeof exp.display_name, res) != 0)
    return;
  api_job_spec *spec = malloc(sizeof *spec);
  api_search *search = NULL;
  store_trial *trials = NULL;
  int n = 0;
  api_error e;
  if (!spec) {
    http_reply_status(res, 500, "INTERNAL", NULL, "out of memory");
    goto done;
  }
  if (api_spec_parse(spec_text, strlen(spec_text), spec, &e) != 0) {
    prefix_spec_fields(&e);
    http_reply_error(res, &e);
    goto done;
  }
  if (api_search_parse(search_text, strlen(search_text), &search, &e) != 0) {
    http_reply_error(res, &e);
    goto done;
  }
  if (http_datasets_check_spec(cfg, &req->who, spec, res) != 0) goto done;
  char field[40], why[300];
  if (sched_check_fits(cfg->scheduler, spec->pool, spec->device_type, spec->devices, field,
                       sizeof field, why, sizeof why) != 0) {
    char spec_field[64];
    snprintf(spec_field, sizeof spec_field, "spec.%s", field);
    http_reply_status(res, 409, "FAILED_PRECONDITION", spec_field, "%s", why);
    goto done;
  }
  if (http_check_job_quota(cfg, &req->who, spec, res) != 0) goto done;
  exp.spec_json = api_spec_to_json(spec);
  exp.search_json = api_search_to_json(search);
  n = api_search_trial_count(search);
  trials = calloc((size_t)n, sizeof *trials);
  if (!exp.spec_json || !exp.search_json || !trials) {
    http_reply_status(res, 500, "INTERNAL", NULL, "out of memory");
    goto done;
  }
  if (make_trials(cfg, search, exp.spec_json, trials, n, res) != 0) goto done;
  snprintf(exp.tenant, sizeof exp.tenant, "%s", req->who.tenant);
  snprintf(exp.state, sizeof exp.state, "RUNNING");
  if (request_id) snprintf(exp.request_id, sizeof exp.request_id, "%s", request_id);
  exp.message = "";
  if (dry_run) {
    http_reply_json(res, 200, http_experiment_json(cfg->st, &exp));
    exp.message = NULL;
    goto done;
  }
  if (kc_new_id(exp.id) != 0) {
    exp.message = NULL;
    http_reply_status(res, 500, "INTERNAL", NULL, "cannot draw a random experiment id");
    goto done;
  }
  exp.create_ms = store_now_ms();
  store_experiment existing;
  memset(&existing, 0, sizeof existing);
  int rc = store_experiment_create(cfg->st, &exp, trials, n, &existing);
  exp.message = NULL;
  if (rc == STORE_EXISTS) {
    http_reply_json(res, 200, http_experiment_json(cfg->st, &existing));
    store_experiment_clear(&existing);
    goto done;
  }
  if (rc != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    goto done;
  }
  sched_wake(cfg->scheduler); /* its first trials start on the scheduler's next pass */
  store_experiment created;
  if (store_experiment_get(cfg->st, exp.id, &created) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    goto done;
  }
  http_reply_json(res, 200, http_experiment_json(cfg->st, &created));
  store_experiment_clear(&created);
done:
  free(spec_text);
  free(search_text);
  free(spec);
  api_search_free(search);
  store_experiment_clear(&exp);
  if (trials)
    for (int i = 0; i < n; i++) free(trials[i].values_json);
  free(trials);
}

/* ---- read ---- */

void http_get_experiment(const http_config *cfg, http_request *req, http_response *res) {
  store_experiment e;
  if (load_experiment(cfg, req, &e, res) != 0) return;
  http_reply_json(res, 200, http_experiment_json(cfg->st, &e));
  store_experiment_clear(&e);
}

void http_list_experiments(const http_config *cfg, http_request *req, http_response *res) {
  const char *size_arg = http_query(req, "page_size");
  const char *token = http_query(req, "page_token");
  const char *filter = http_query(req, "filter");
  int page_size;
  if (http_parse_page_size(size_arg, &page_size) != 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "page_size",
                      "page_size must be a non-negative integer, got '%.40s'", size_arg);
    return;
  }
  char query[512];
  snprintf(query, sizeof query, "experiments\n%s\n%s", req->who.tenant, filter ? filter : "");
  int64_t position = 0;
  if (token && *token && (api_page_token_decode(token, query, &position) != 0 || position < 1)) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "page_token",
                      "page_token is not one this server issued for this filter");
    return;
  }
  const char *state = NULL;
  char tenant[64] = "";
  if (filter && *filter) {
    char why[256];
    if (http_parse_filter(filter, req, &state, tenant, sizeof tenant, why, sizeof why) != 0) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", "filter", "%s", why);
      return;
    }
    if (state && strcmp(state, "RUNNING") && strcmp(state, "SUCCEEDED") &&
        strcmp(state, "FAILED") && strcmp(state, "CANCELLED")) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", "filter",
                        "an experiment's state is RUNNING, SUCCEEDED, FAILED or CANCELLED, got "
                        "'%.40s'",
                        state);
      return;
    }
  }
  const char *scope = tenant[0] ? tenant : req->who.admin ? NULL : req->who.tenant;
  store_experiment *list = NULL;
  int n = 0;
  if (store_experiment_list(cfg->st, scope, state, position, page_size + 1, &list, &n) !=
      STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return;
  }
  json_t *doc = json_object(), *arr = json_array();
  for (int i = 0; i < n && i < page_size; i++)
    json_array_append_new(arr, http_experiment_json(cfg->st, &list[i]));
  json_object_set_new(doc, "experiments", arr);
  char next[API_PAGE_TOKEN_LEN] = "";
  if (n > page_size) api_page_token_encode(list[page_size - 1].seq, query, next);
  json_object_set_new(doc, "next_page_token", json_string(next));
  store_experiment_list_free(list, n);
  http_reply_json(res, 200, doc);
}

void http_list_trials(const http_config *cfg, http_request *req, http_response *res) {
  store_experiment e;
  if (load_experiment(cfg, req, &e, res) != 0) return;
  const char *size_arg = http_query(req, "page_size");
  const char *token = http_query(req, "page_token");
  int page_size;
  char query[128];
  snprintf(query, sizeof query, "trials\n%s", e.id);
  int64_t position = 0;
  if (http_parse_page_size(size_arg, &page_size) != 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "page_size",
                      "page_size must be a non-negative integer, got '%.40s'", size_arg);
  } else if (token && *token &&
             (api_page_token_decode(token, query, &position) != 0 || position < 1)) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "page_token",
                      "page_token is not one this server issued for this experiment's trials");
  } else {
    store_trial *trials = NULL;
    int n = 0;
    /* Positions are index + 1: a token is never 0. */
    if (store_trial_list(cfg->st, e.id, (int)position, page_size + 1, &trials, &n) != STORE_OK) {
      http_reply_store_failure(res, cfg->st);
    } else {
      json_t *doc = json_object(), *arr = json_array();
      for (int i = 0; i < n && i < page_size; i++)
        json_array_append_new(arr, http_trial_json(&trials[i]));
      json_object_set_new(doc, "trials", arr);
      char next[API_PAGE_TOKEN_LEN] = "";
      if (n > page_size) api_page_token_encode(trials[page_size - 1].index + 1, query, next);
      json_object_set_new(doc, "next_page_token", json_string(next));
      http_reply_json(res, 200, doc);
    }
    store_trial_list_free(trials, n);
  }
  store_experiment_clear(&e);
}

void http_best_trial(const http_config *cfg, http_request *req, http_response *res) {
  store_experiment e;
  if (load_experiment(cfg, req, &e, res) != 0) return;
  api_search *search = NULL;
  api_error err;
  store_trial *trials = NULL;
  int n = 0;
  if (api_search_parse(e.search_json, strlen(e.search_json), &search, &err) != 0 ||
      store_trial_list(cfg->st, e.id, 0, 0, &trials, &n) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
  } else {
    int best = best_trial(search, trials, n);
    if (best < 0)
      http_reply_status(res, 404, "NOT_FOUND", "best_trial",
                        "no trial of experiment %s has reported %s yet", e.id,
                        api_search_metric(search));
    else
      http_reply_json(res, 200, best_json(&trials[best]));
  }
  store_trial_list_free(trials, n);
  api_search_free(search);
  store_experiment_clear(&e);
}

void http_experiment_events(const http_config *cfg, http_request *req, http_response *res) {
  store_experiment e;
  if (load_experiment(cfg, req, &e, res) != 0) return;
  store_experiment_event *events = NULL;
  int n = 0;
  if (store_experiment_events(cfg->st, e.id, &events, &n) != STORE_OK) {
    store_experiment_clear(&e);
    http_reply_store_failure(res, cfg->st);
    return;
  }
  json_t *doc = json_object(), *arr = json_array();
  for (int i = 0; i < n; i++) {
    json_t *o = json_object();
    json_object_set_new(o, "time", http_rfc3339(events[i].time_ms));
    json_object_set_new(o, "reason", json_string(events[i].reason));
    json_object_set_new(o, "job", json_string(events[i].job_id));
    json_object_set_new(o, "message", json_string(events[i].message));
    json_array_append_new(arr, o);
  }
  json_object_set_new(doc, "events", arr);
  store_experiment_events_free(events, n);
  store_experiment_clear(&e);
  http_reply_json(res, 200, doc);
}

/* ---- cancel ---- */

void http_cancel_experiment(const http_config *cfg, http_request *req, http_response *res) {
  store_experiment e;
  if (load_experiment(cfg, req, &e, res) != 0) return;
  int rc = store_experiment_finish(cfg->st, e.id, "CANCELLED", "EXPERIMENT_CANCELLED",
                                   "cancelled by a client");
  if (rc == STORE_CONFLICT) {
    http_reply_status(res, 409, "FAILED_PRECONDITION", "state", "experiment %s already ended %s",
                      e.id, e.state);
    store_experiment_clear(&e);
    return;
  }
  store_trial *trials = NULL;
  int n = 0;
  if (rc != STORE_OK || store_trial_list(cfg->st, e.id, 0, 0, &trials, &n) != STORE_OK) {
    store_experiment_clear(&e);
    http_reply_store_failure(res, cfg->st);
    return;
  }
  /* Its trials stop: running ones are cancelled, paused ones end there. */
  for (int i = 0; i < n; i++) {
    const store_trial *t = &trials[i];
    const int active = !strcmp(t->state, "RUNNING") || !strcmp(t->state, "PROMOTED");
    if (active && t->job_id[0])
      http_cancel_job_id(cfg, t->job_id, "its experiment was cancelled while it was queued",
                         "its experiment was cancelled; stopping kiln-train");
    if (active || !strcmp(t->state, "PAUSED"))
      store_trial_update(cfg->st, e.id, t->index, t->state, "STOPPED", -1, NULL, "TRIAL_STOPPED",
                         "the experiment was cancelled");
  }
  store_trial_list_free(trials, n);
  char id[sizeof e.id];
  snprintf(id, sizeof id, "%s", e.id);
  store_experiment_clear(&e);
  if (store_experiment_get(cfg->st, id, &e) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return;
  }
  http_reply_json(res, 200, http_experiment_json(cfg->st, &e));
  store_experiment_clear(&e);
}
