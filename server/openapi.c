/* openapi.c — GET /v1/openapi.json: the OpenAPI 3.0.3 document of the route
 * table. Each route's documentation (operation id, tag, parameters, request
 * and response bodies, the errors it answers) is an entry below, found by
 * method and pattern; only routes in the table are described, and a route
 * without an entry makes the document fail (test_server_openapi). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "openapi.h"
#include "routes.h"

/* The repository has no license file yet: this names the one kiln is
 * meant to carry, in the one place openapi.json takes it from. */
#define LICENSE_NAME "Apache-2.0"
#define LICENSE_URL  "https://www.apache.org/licenses/LICENSE-2.0"

typedef struct op_doc {
  const char *method, *pattern;
  const char *operation_id;
  const char *tag;
  const char *params;  /* query and header parameters (param_docs), space-separated */
  const char *request; /* the body: a schema (application/json), a media type, or NULL */
  const char *ok;      /* the 200 answer: schemas (application/json) and media types */
  const char *errors;  /* statuses beyond 401 (routes with a token), 413 and 500 */
} op_doc;

static const op_doc op_docs[] = {
    {"GET", "/healthz", "getHealth", "operations", "", NULL, "Health", ""},
    {"GET", "/readyz", "getReadiness", "operations", "", NULL, "Health", "503"},
    {"GET", "/metrics", "getPrometheusMetrics", "operations", "", NULL, "text/plain", "401 403"},
    {"GET", "/v1/openapi.json", "getOpenApiDocument", "operations", "", NULL, "OpenApiDocument",
     ""},
    {"POST", "/v1/jobs", "createJob", "jobs", "request_id validate_only", "JobSpec", "Job",
     "400 403 409 429"},
    {"GET", "/v1/jobs", "listJobs", "jobs", "page_size page_token filter order_by", NULL, "JobList",
     "400"},
    {"GET", "/v1/jobs/{job}", "getJob", "jobs", "", NULL, "Job", "404"},
    {"DELETE", "/v1/jobs/{job}", "deleteJob", "jobs", "", NULL, "Empty", "404 409"},
    {"POST", "/v1/jobs/{job}:cancel", "cancelJob", "jobs", "", NULL, "Job", "404 409"},
    {"POST", "/v1/jobs/{job}:resume", "resumeJob", "jobs", "", NULL, "Job", "404 409"},
    {"POST", "/v1/jobs/{job}:wait", "waitJob", "jobs", "timeout", NULL, "JobWaitResult",
     "400 404 503"},
    {"GET", "/v1/jobs/{job}:explain", "explainJob", "jobs", "", NULL, "JobExplanation", "404"},
    {"GET", "/v1/jobs/{job}/metrics", "listMetrics", "metrics",
     "metric_name start_step end_step max_points", NULL, "MetricList", "400 404"},
    {"GET", "/v1/jobs/{job}/metrics:watch", "watchMetrics", "metrics", "last_event_id", NULL,
     "text/event-stream", "400 404"},
    {"GET", "/v1/jobs/{job}/events", "listEvents", "jobs", "", NULL, "EventList", "404"},
    {"GET", "/v1/jobs/{job}/logs", "getLogs", "jobs", "", NULL, "text/plain", "404"},
    {"GET", "/v1/jobs/{job}/profile", "getProfile", "jobs", "profile_format", NULL,
     "ProfileTrace text/plain", "400 404"},
    {"GET", "/v1/jobs/{job}/checkpoints", "listCheckpoints", "checkpoints", "", NULL,
     "CheckpointList", "404"},
    {"GET", "/v1/jobs/{job}/checkpoints/{checkpoint}", "getCheckpoint", "checkpoints", "", NULL,
     "Checkpoint", "404"},
    {"GET", "/v1/jobs/{job}/checkpoints/{checkpoint}:download", "downloadCheckpoint", "checkpoints",
     "", NULL, "application/octet-stream", "404"},
    {"GET", "/v1/jobs/{job}/checkpoints/{checkpoint}:export", "exportCheckpoint", "checkpoints",
     "export_format", NULL, "application/octet-stream", "400 404 409"},
    {"POST", "/v1/jobs/{job}/checkpoints/{checkpoint}:pin", "pinCheckpoint", "checkpoints", "",
     NULL, "Checkpoint", "404"},
    {"POST", "/v1/jobs/{job}/checkpoints/{checkpoint}:unpin", "unpinCheckpoint", "checkpoints", "",
     NULL, "Checkpoint", "404"},
    {"POST", "/v1/experiments", "createExperiment", "experiments", "request_id validate_only",
     "ExperimentRequest", "Experiment", "400 403 409 429"},
    {"GET", "/v1/experiments", "listExperiments", "experiments", "page_size page_token filter",
     NULL, "ExperimentList", "400"},
    {"GET", "/v1/experiments/{experiment}", "getExperiment", "experiments", "", NULL, "Experiment",
     "404"},
    {"POST", "/v1/experiments/{experiment}:cancel", "cancelExperiment", "experiments", "", NULL,
     "Experiment", "404 409"},
    {"GET", "/v1/experiments/{experiment}:best", "getBestTrial", "experiments", "", NULL,
     "BestTrial", "404"},
    {"GET", "/v1/experiments/{experiment}/trials", "listTrials", "experiments",
     "page_size page_token", NULL, "TrialList", "400 404"},
    {"GET", "/v1/experiments/{experiment}/events", "listExperimentEvents", "experiments", "", NULL,
     "ExperimentEventList", "404"},
    {"POST", "/v1/datasets", "createDataset", "datasets",
     "upload_format label_column image_feature label_feature upload_display_name",
     "application/octet-stream", "Dataset", "400 429"},
    {"POST", "/v1/datasets:register", "registerDataset", "datasets", "", "DatasetRegistration",
     "Dataset", "400 403"},
    {"GET", "/v1/datasets", "listDatasets", "datasets", "page_size page_token", NULL, "DatasetList",
     "400"},
    {"GET", "/v1/datasets/{dataset}", "getDataset", "datasets", "", NULL, "Dataset", "404"},
    {"DELETE", "/v1/datasets/{dataset}", "deleteDataset", "datasets", "", NULL, "Empty", "404 409"},
    {"GET", "/v1/devices", "listDevices", "devices", "", NULL, "DeviceList", ""},
    {"GET", "/v1/pools", "listPools", "devices", "", NULL, "PoolList", ""},
    {"POST", "/v1/tokens", "createToken", "tokens", "", "TokenRequest", "NewToken", "400 403"},
    {"GET", "/v1/tokens", "listTokens", "tokens", "", NULL, "TokenList", ""},
    {"DELETE", "/v1/tokens/{token}", "revokeToken", "tokens", "", NULL, "Empty", "403 404"},
    {"GET", "/v1/tenants/{tenant}/quota", "getQuota", "tenants", "", NULL, "Quota", "400 403"},
    {"PUT", "/v1/tenants/{tenant}/quota", "setQuota", "tenants", "", "QuotaUpdate", "Quota",
     "400 403"},
    {"POST", "/v1/agents", "registerAgent", "agents", "", "AgentRegistration", "AgentRegistered",
     "400 403 409"},
    {"GET", "/v1/agents", "listAgents", "agents", "agent_pool page_size page_token", NULL,
     "AgentList", "400 403"},
    {"GET", "/v1/agents/{agent}", "getAgent", "agents", "", NULL, "Agent", "403 404"},
    {"GET", "/v1/agents/{agent}/commands", "pollAgentCommands", "agents", "after wait", NULL,
     "AgentCommands", "400 403 404 503"},
    {"POST", "/v1/agents/{agent}/commands/{seq}:done", "reportAgentCommand", "agents", "",
     "AgentCommandReport", "AgentCommandDone", "400 403 404"},
    {"POST", "/v1/allocations/{alloc}/progress", "postAllocationProgress", "allocations", "",
     "text/plain", "Empty", "403 409"},
    {"PUT", "/v1/allocations/{alloc}/checkpoints/{step}", "putAllocationCheckpoint", "allocations",
     "sha256 part", "application/octet-stream", "CheckpointUpload", "400 403"},
    {"GET", "/v1/allocations/{alloc}/resume", "getAllocationResume", "allocations", "part", NULL,
     "application/octet-stream", "403 404"},
    {"GET", "/v1/allocations/{alloc}/dataset", "getAllocationDataset", "allocations", "", NULL,
     "application/x-tar", "403 404"},
    {"HEAD", "/v1/allocations/{alloc}/dataset", "headAllocationDataset", "allocations", "", NULL,
     "application/x-tar", "403 404"},
    {"POST", "/v1/allocations/{alloc}/exit", "postAllocationExit", "allocations", "",
     "AllocationExit", "Empty", "400 403 409"},
    {"POST", "/v1/allocations/{alloc}/relay", "postAllocationRelay", "allocations", "",
     "RelayRequest", "Relay", "400 403"},
    {"GET", "/v1/allocations/{alloc}/relay/{relay}:wait", "waitAllocationRelay", "allocations",
     "timeout", NULL, "RelayWaitResult", "400 403 404"},
};

typedef struct param_doc {
  const char *key;  /* what op_doc.params names */
  const char *name; /* on the wire */
  const char *in;   /* "query" or "header" */
  int required;
  const char *schema; /* JSON with single quotes */
  const char *description;
} param_doc;

static const param_doc param_docs[] = {
    {"page_size", "page_size", "query", 0, "{'type':'integer','minimum':0,'default':50}",
     "Items per page: 0 or none gives 50, more than 1000 gives 1000."},
    {"page_token", "page_token", "query", 0, "{'type':'string'}",
     "The next_page_token of the previous page (with the same order_by)."},
    {"filter", "filter", "query", 0, "{'type':'string','example':'state=RUNNING'}",
     "KEY=VALUE terms joined by ' AND ': state=QUEUED|STARTING|RUNNING|STOPPING|SUCCEEDED|"
     "FAILED|CANCELLED|PREEMPTED; admins also tenant=NAME."},
    {"order_by", "order_by", "query", 0,
     "{'type':'string','enum':['create_time','create_time asc','create_time desc'],"
     "'default':'create_time desc'}",
     "Creation order; newest first by default."},
    {"request_id", "request_id", "query", 0, "{'type':'string','pattern':'^[A-Za-z0-9._-]{1,79}$'}",
     "A retry with the same request_id answers the job the first request made, never a second."},
    {"validate_only", "validate_only", "query", 0, "{'type':'boolean','default':false}",
     "true: check the spec (and that it fits a pool) and create nothing."},
    {"timeout", "timeout", "query", 0,
     "{'type':'string','pattern':'^[0-9]+([.][0-9]+)?(ms|s|m)?$','default':'60s',"
     "'example':'300s'}",
     "How long to wait: 500ms, 60s, 2m or bare seconds, at most 3600s."},
    {"metric_name", "name", "query", 0, "{'type':'string','example':'loss'}",
     "Only points of this metric."},
    {"start_step", "start_step", "query", 0, "{'type':'integer','format':'int64','minimum':0}",
     "The first step included."},
    {"end_step", "end_step", "query", 0, "{'type':'integer','format':'int64','minimum':0}",
     "The last step included."},
    {"max_points", "max_points", "query", 0, "{'type':'integer','minimum':1,'maximum':100000}",
     "Thin the points of each metric to at most this many, evenly over the steps."},
    {"last_event_id", "Last-Event-ID", "header", 0, "{'type':'integer','minimum':0}",
     "Resume after this event id (a point seq): every later point is sent once."},
    {"profile_format", "format", "query", 0,
     "{'type':'string','enum':['trace','table'],'default':'trace'}",
     "trace: Chrome trace-event JSON; table: the costliest nodes as text."},
    {"export_format", "format", "query", 1, "{'type':'string','enum':['onnx']}",
     "The format to export the checkpoint's model to: onnx (opset 17, the inference graph)."},
    {"upload_format", "format", "query", 1,
     "{'type':'string','enum':['csv','idx','images','tfrecord','tar']}",
     "csv: a CSV file with a header; idx: a tar of IDX files; images: a tar of class folders; "
     "tfrecord, tar: a tar of train/ (and optionally test/) folders of shard files (raw or "
     "gzip'd), or for tfrecord one TFRecord file; every record is read and checked."},
    {"image_feature", "image_feature", "query", 0,
     "{'type':'string','minLength':1,'maxLength':127}",
     "tfrecord, tar: the image feature (a tar sample's extension) the check requires; without "
     "it the default (image/encoded, png) is looked for and the features are listed back."},
    {"label_feature", "label_feature", "query", 0,
     "{'type':'string','minLength':1,'maxLength':127}",
     "tfrecord, tar: the label feature (an int64; a tar sample's extension) the check requires; "
     "default image/class/label, cls."},
    {"label_column", "label_column", "query", 0, "{'type':'string','minLength':1,'maxLength':63}",
     "csv: the header name of the class column (required for csv)."},
    {"upload_display_name", "display_name", "query", 0, "{'type':'string','maxLength':127}",
     "A name for people."},
    {"agent_pool", "pool", "query", 0, "{'type':'string','pattern':'^[A-Za-z0-9._-]{1,31}$'}",
     "Only the agents of this pool."},
    {"after", "after", "query", 0, "{'type':'integer','format':'int64','minimum':0,'default':0}",
     "Only commands with a larger seq (the highest the agent has carried out)."},
    {"wait", "wait", "query", 0,
     "{'type':'string','pattern':'^[0-9]+([.][0-9]+)?(ms|s|m)?$','default':'0s',"
     "'example':'30s'}",
     "With no command to deliver, wait this long for one (at most 300s); the poll is a "
     "heartbeat while it waits."},
    {"sha256", "sha256", "query", 1, "{'type':'string','pattern':'^[0-9a-f]{64}$'}",
     "The hex SHA-256 of the body: a file that does not match is not kept (400)."},
    {"part", "part", "query", 0, "{'type':'string','enum':['weights','state'],'default':'weights'}",
     "Which file of a checkpoint: its weights (safetensors) or the training state kiln-train "
     "resumes with beside them."},
};

typedef struct error_doc {
  int status;
  const char *name; /* components.responses */
  const char *description;
} error_doc;

static const error_doc error_docs[] = {
    {400, "BadRequest",
     "INVALID_ARGUMENT: a parameter or the body broke a rule; details name each field."},
    {401, "Unauthenticated",
     "UNAUTHENTICATED: no 'Authorization: Bearer TOKEN' header, or the token is unknown or "
     "revoked."},
    {403, "PermissionDenied",
     "PERMISSION_DENIED: the token's role may not do this (details name role; a user's priority "
     "above its tenant's max_priority names priority; an agent token outside /v1/agents names "
     "role, as another agent names agent), or, under --insecure-no-auth, a request with another "
     "site's Origin or a Host that is not loopback."},
    {404, "NotFound",
     "NOT_FOUND: no such resource, or it belongs to another tenant; details name the parameter."},
    {409, "Conflict",
     "FAILED_PRECONDITION: the resource is not in a state that allows this (details name the "
     "field)."},
    {413, "PayloadTooLarge",
     "RESOURCE_EXHAUSTED: the request body is larger than kilnd's --max-body-bytes (data set "
     "uploads: --max-upload-bytes)."},
    {429, "ResourceExhausted",
     "RESOURCE_EXHAUSTED: the tenant (for a command poll: the agent) already has kilnd's "
     "--max-blocked-per-tenant blocking requests (:wait, metrics:watch, polls) open, retry when "
     "one ends; or its quota (max_devices, "
     "max_queued_jobs, max_storage_bytes) would be passed: details name the field and the "
     "message the limit."},
    {500, "Internal", "INTERNAL: kilnd failed (storage, memory); the message says where."},
    {503, "Unavailable",
     "UNAVAILABLE: the store or the scheduler does not answer, or kilnd is shutting down."},
};

static const struct {
  const char *name, *description;
} tags[] = {
    {"jobs", "Training jobs: create, list, wait, cancel, resume, their events, logs and profile."},
    {"metrics", "A job's metric points, read or streamed."},
    {"checkpoints", "A job's checkpoints: read, download, export, pin."},
    {"datasets", "Built-in and uploaded data sets."},
    {"devices", "The devices and pools the scheduler hands out."},
    {"tokens", "Bearer tokens: made by admins, listed and revoked; a secret is shown once."},
    {"experiments", "Hyperparameter searches (grid, random, ASHA) whose trials are jobs."},
    {"tenants", "Tenants' quotas: priority ceilings, devices, waiting jobs, storage."},
    {"agents",
     "kiln-agents on worker hosts: registration, the command long poll and its reports (an "
     "agent token), and the list of agents with their devices (admins)."},
    {"allocations",
     "The worker side of one attempt on remote hosts, with that allocation's token only: "
     "progress, checkpoints, resume, exit and the Open MPI relay."},
    {"operations",
     "Health, readiness, Prometheus metrics (an admin token unless --metrics-auth public) and "
     "this document."},
};

json_t *http_openapi_json(const char *text) {
  size_t len = strlen(text);
  char *copy = malloc(len + 1);
  if (!copy) return NULL;
  for (size_t i = 0; i <= len; i++) copy[i] = text[i] == '\'' ? '"' : text[i];
  json_t *value = json_loads(copy, 0, NULL);
  free(copy);
  return value;
}

static const op_doc *find_op_doc(const http_route *r) {
  for (size_t i = 0; i < sizeof op_docs / sizeof op_docs[0]; i++)
    if (strcmp(op_docs[i].method, r->method) == 0 && strcmp(op_docs[i].pattern, r->pattern) == 0)
      return &op_docs[i];
  return NULL;
}

static json_t *ref(const char *section, const char *name) {
  char text[160];
  snprintf(text, sizeof text, "#/components/%s/%s", section, name);
  return json_pack("{s:s}", "$ref", text);
}

/* {MEDIA: {schema}} for each word of list: a schema name is
 * application/json, a word with a '/' is that media type as text or bytes. */
static json_t *content_of(const char *list) {
  json_t *content = json_object();
  char word[64];
  for (const char *p = list; *p;) {
    size_t len = strcspn(p, " ");
    snprintf(word, sizeof word, "%.*s", (int)len, p);
    p += len + (p[len] == ' ');
    json_t *schema;
    const char *media = "application/json";
    if (!strchr(word, '/')) {
      schema = ref("schemas", word);
    } else if (strcmp(word, "application/octet-stream") == 0) {
      media = word;
      schema = json_pack("{s:s, s:s}", "type", "string", "format", "binary");
    } else if (strcmp(word, "text/event-stream") == 0) {
      media = word;
      schema = json_pack("{s:s, s:s}", "type", "string", "description",
                         "Server-sent events: 'metric' (id: the point seq; data: {attempt, step, "
                         "epoch, name, value}) and, once the job ended and every point is sent, "
                         "'end' (data: {state}).");
    } else {
      media = word;
      schema = json_pack("{s:s}", "type", "string");
    }
    json_object_set_new(content, media, json_pack("{s:o}", "schema", schema));
  }
  return content;
}

static const param_doc *find_param(const char *key, size_t len) {
  for (size_t i = 0; i < sizeof param_docs / sizeof param_docs[0]; i++)
    if (strlen(param_docs[i].key) == len && strncmp(param_docs[i].key, key, len) == 0)
      return &param_docs[i];
  return NULL;
}

/* The path parameters of pattern, then the op's own; -1 on an unknown key. */
static int add_parameters(json_t *params, const char *pattern, const op_doc *d, char *err,
                          size_t errlen) {
  for (const char *p = strchr(pattern, '{'); p; p = strchr(p + 1, '{')) {
    size_t len = (size_t)(strchr(p, '}') - p - 1);
    int number = (len == 10 && strncmp(p + 1, "checkpoint", 10) == 0) ||
                 (len == 3 && strncmp(p + 1, "seq", 3) == 0);
    json_t *schema =
        number ? json_pack("{s:s, s:s, s:i}", "type", "integer", "format", "int64", "minimum", 1)
               : json_pack("{s:s}", "type", "string");
    char description[64];
    snprintf(description, sizeof description, "The %.*s's id.", (int)len, p + 1);
    json_array_append_new(params,
                          json_pack("{s:s%, s:s, s:b, s:s, s:o}", "name", p + 1, len, "in", "path",
                                    "required", 1, "description", description, "schema", schema));
  }
  for (const char *p = d->params; *p;) {
    size_t len = strcspn(p, " ");
    const param_doc *pd = find_param(p, len);
    json_t *schema = pd ? http_openapi_json(pd->schema) : NULL;
    if (!schema) {
      snprintf(err, errlen, "openapi.c: parameter '%.*s' of %s is unknown or not JSON", (int)len, p,
               d->operation_id);
      return -1;
    }
    json_array_append_new(params, json_pack("{s:s, s:s, s:b, s:s, s:o}", "name", pd->name, "in",
                                            pd->in, "required", pd->required, "description",
                                            pd->description, "schema", schema));
    p += len + (p[len] == ' ');
  }
  return 0;
}

static const error_doc *find_error(int status) {
  for (size_t i = 0; i < sizeof error_docs / sizeof error_docs[0]; i++)
    if (error_docs[i].status == status) return &error_docs[i];
  return NULL;
}

static int add_error(json_t *responses, int status) {
  const error_doc *e = find_error(status);
  if (!e) return -1;
  char code[8];
  snprintf(code, sizeof code, "%d", status);
  json_object_set_new(responses, code, ref("responses", e->name));
  return 0;
}

static json_t *operation(const http_route *r, const op_doc *d, char *err, size_t errlen) {
  json_t *op = json_pack("{s:s, s:s, s:[s]}", "operationId", d->operation_id, "summary", r->summary,
                         "tags", d->tag);
  json_t *params = json_array();
  if (add_parameters(params, r->pattern, d, err, errlen) != 0) {
    json_decref(params);
    json_decref(op);
    return NULL;
  }
  if (json_array_size(params)) json_object_set(op, "parameters", params);
  json_decref(params);
  if (d->request)
    json_object_set_new(op, "requestBody",
                        json_pack("{s:b, s:o}", "required", 1, "content", content_of(d->request)));
  json_t *responses = json_object();
  json_object_set_new(responses, "200",
                      json_pack("{s:s, s:o}", "description", "OK", "content", content_of(d->ok)));
  int rc = 0;
  if (r->public_route != HTTP_ROUTE_PUBLIC) rc |= add_error(responses, 401);
  for (const char *p = d->errors; *p; p += strcspn(p, " "), p += *p == ' ')
    rc |= add_error(responses, atoi(p));
  if (http_route_blocks(r)) rc |= add_error(responses, 429);
  rc |= add_error(responses, 413);
  rc |= add_error(responses, 500);
  json_object_set_new(op, "responses", responses);
  /* /metrics takes an admin token unless kilnd runs --metrics-auth public:
   * bearerAuth, or nothing. */
  if (r->public_route == HTTP_ROUTE_ALLOCATION)
    json_object_set_new(op, "security", json_pack("[{s:[]}]", "allocationToken"));
  else if (r->public_route && strcmp(r->pattern, "/metrics") == 0)
    json_object_set_new(op, "security", json_pack("[{s:[]}, {}]", "bearerAuth"));
  else if (r->public_route)
    json_object_set_new(op, "security", json_array());
  if (rc != 0) {
    snprintf(err, errlen, "openapi.c: %s names a status with no error response", d->operation_id);
    json_decref(op);
    return NULL;
  }
  return op;
}

static json_t *components(char *err, size_t errlen) {
  json_t *schemas = json_object(), *responses = json_object();
  int n = 0;
  const http_openapi_text *texts = http_openapi_schemas(&n);
  for (int i = 0; i < n; i++) {
    json_t *schema = http_openapi_json(texts[i].json);
    if (!schema) {
      snprintf(err, errlen, "openapi_schemas.c: schema %s is not JSON", texts[i].name);
      json_decref(schemas);
      json_decref(responses);
      return NULL;
    }
    json_object_set_new(schemas, texts[i].name, schema);
  }
  json_t *states = json_array();
  for (int s = 0; s < API_JOB_STATE_COUNT; s++)
    json_array_append_new(states, json_string(api_job_state_name((api_job_state)s)));
  json_object_set_new(schemas, "JobState",
                      json_pack("{s:s, s:o, s:s}", "type", "string", "enum", states, "description",
                                "QUEUED -> STARTING -> RUNNING -> STOPPING -> SUCCEEDED | FAILED "
                                "| CANCELLED; PREEMPTED goes back to QUEUED."));
  for (size_t i = 0; i < sizeof error_docs / sizeof error_docs[0]; i++)
    json_object_set_new(responses, error_docs[i].name,
                        json_pack("{s:s, s:o}", "description", error_docs[i].description, "content",
                                  content_of("Error")));
  json_t *bearer = json_pack("{s:s, s:s, s:s}", "type", "http", "scheme", "bearer", "description",
                             "A token from 'kilnd token create'; each token is bound to a tenant.");
  json_t *alloc = json_pack("{s:s, s:s, s:s}", "type", "http", "scheme", "bearer", "description",
                            "An allocation's token (kiln_a_...), handed to its hosts' agents in "
                            "the start command: it authorizes that allocation only, until it "
                            "ends.");
  return json_pack("{s:o, s:o, s:{s:o, s:o}}", "schemas", schemas, "responses", responses,
                   "securitySchemes", "bearerAuth", bearer, "allocationToken", alloc);
}

json_t *http_openapi_document(char *err, size_t errlen) {
  int n = 0;
  const http_route *routes = http_routes(&n);
  json_t *paths = json_object();
  for (int i = 0; i < n; i++) {
    const op_doc *d = find_op_doc(&routes[i]);
    if (!d) {
      snprintf(err, errlen, "route %s %s has no documentation entry in server/openapi.c",
               routes[i].method, routes[i].pattern);
      json_decref(paths);
      return NULL;
    }
    json_t *op = operation(&routes[i], d, err, errlen);
    if (!op) {
      json_decref(paths);
      return NULL;
    }
    json_t *item = json_object_get(paths, routes[i].pattern);
    if (!item) {
      item = json_object();
      json_object_set_new(paths, routes[i].pattern, item);
    }
    char method[8];
    size_t m = 0;
    for (; routes[i].method[m] && m < sizeof method - 1; m++)
      method[m] = (char)(routes[i].method[m] | 0x20); /* lower case */
    method[m] = '\0';
    json_object_set_new(item, method, op);
  }
  json_t *comps = components(err, errlen);
  if (!comps) {
    json_decref(paths);
    return NULL;
  }
  json_t *tag_list = json_array();
  for (size_t i = 0; i < sizeof tags / sizeof tags[0]; i++)
    json_array_append_new(tag_list, json_pack("{s:s, s:s}", "name", tags[i].name, "description",
                                              tags[i].description));
  return json_pack(
      "{s:s, s:{s:s, s:s, s:s, s:{s:s, s:s}}, s:[{s:s, s:s}], s:[{s:[]}], s:o, s:o, s:o}",
      "openapi", "3.0.3", "info", "title", "kiln", "version", "v1", "description",
      "Training as a service. Every error is {error: {code, status, message, details}} after "
      "Google's AIP-193; custom methods follow AIP-136 (POST /v1/jobs/{job}:cancel).",
      "license", "name", LICENSE_NAME, "url", LICENSE_URL, "servers", "url",
      "http://127.0.0.1:8080", "description",
      "kilnd at its default --listen address; a client sets its own base URL", "security",
      "bearerAuth", "tags", tag_list, "paths", paths, "components", comps);
}

void http_openapi(const http_config *cfg, http_request *req, http_response *res) {
  (void)cfg;
  (void)req;
  char err[256] = "";
  json_t *doc = http_openapi_document(err, sizeof err);
  if (!doc) {
    http_reply_status(res, 500, "INTERNAL", NULL, "%s", err);
    return;
  }
  http_reply_json(res, 200, doc);
}
