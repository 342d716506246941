/* agents.c — the /v1/agents routes: a kiln-agent registers (by name: the
 * same agent when it comes back), long-polls for its numbered commands and
 * reports each done; an admin (and the dashboard) lists agents with their
 * devices. Only an agent token may register and poll, and only as the
 * agent that token registered; every poll and registration is a heartbeat
 * (the loss check itself runs in the scheduler's pass, store_agents_mark_lost). */
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "routes.h"

/* A poll waits at most this long for a command (?wait=). */
#define POLL_WAIT_MAX_S 300
/* A parked poll is a heartbeat: it records one at least this often while it
 * waits, and no more often, so parked polls do not wake each other (each
 * record is a store write, and a write wakes every parked request). */
#define PARKED_HEARTBEAT_MS 5000
/* Commands one poll delivers at most; the agent asks again past the last. */
#define POLL_MAX_COMMANDS 100
#define MAX_GPUS          64
#define MAX_RUNNING       1024
#define MAX_CPUS          65536

static void bad_field(http_response *res, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void bad_field(http_response *res, const char *field, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  http_reply_status(res, 400, "INVALID_ARGUMENT", field, "%s", msg);
}

/* 1 for a host name (RFC 1123 labels: letters, digits, '-', dots between)
 * of 1..max characters. */
static int valid_hostname(const char *s, size_t max) {
  size_t len = strlen(s), label = 0;
  if (len == 0 || len > max || s[0] == '.' || s[len - 1] == '.') return 0;
  for (const char *c = s; *c; c++) {
    if (*c == '.') {
      if (label == 0) return 0;
      label = 0;
      continue;
    }
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
          *c == '-') ||
        ++label > 63)
      return 0;
  }
  return 1;
}

/* An address job traffic reaches the host at: a numeric IPv4 or IPv6
 * address, or a host name. */
static int valid_address(const char *s) {
  unsigned char buf[16];
  return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1 ||
         valid_hostname(s, 253);
}

/* 1 for printable ASCII text of at most max characters. */
static int printable(const char *s, size_t max) {
  if (strlen(s) > max) return 0;
  for (; *s; s++)
    if (*s < 0x20 || *s > 0x7e) return 0;
  return 1;
}

/* gpus: [{"index": N, "name": "...", "memory_bytes": N}], indexes distinct.
 * 0, or -1 having answered 400 naming the element's field. */
static int check_gpus(json_t *gpus, http_response *res) {
  if (!json_is_array(gpus) || json_array_size(gpus) > MAX_GPUS) {
    bad_field(res, "gpus",
              "gpus must be an array of at most %d objects {index, name, "
              "memory_bytes}",
              MAX_GPUS);
    return -1;
  }
  size_t i;
  json_t *g;
  json_array_foreach(gpus, i, g) {
    char field[64];
    snprintf(field, sizeof field, "gpus[%zu]", i);
    if (!json_is_object(g)) {
      bad_field(res, field, "%s must be an object {index, name, memory_bytes}", field);
      return -1;
    }
    const char *key;
    json_t *v;
    json_object_foreach(g, key, v) {
      snprintf(field, sizeof field, "gpus[%zu].%.20s", i, key);
      if (strcmp(key, "index") == 0 || strcmp(key, "memory_bytes") == 0) {
        if (!json_is_integer(v) || json_integer_value(v) < 0) {
          bad_field(res, field, "%s must be an integer >= 0", field);
          return -1;
        }
      } else if (strcmp(key, "name") == 0) {
        if (!json_is_string(v) || !printable(json_string_value(v), 127)) {
          bad_field(res, field, "%s must be printable text of at most 127 characters", field);
          return -1;
        }
      } else {
        bad_field(res, field, "unknown field %s: a GPU has index, name and memory_bytes", field);
        return -1;
      }
    }
    json_t *index = json_object_get(g, "index");
    if (!index) {
      snprintf(field, sizeof field, "gpus[%zu].index", i);
      bad_field(res, field, "%s is required", field);
      return -1;
    }
    for (size_t j = 0; j < i; j++) {
      if (json_integer_value(json_object_get(json_array_get(gpus, j), "index")) ==
          json_integer_value(index)) {
        snprintf(field, sizeof field, "gpus[%zu].index", i);
        bad_field(res, field, "%s: GPU index %lld is listed twice", field,
                  (long long)json_integer_value(index));
        return -1;
      }
    }
  }
  return 0;
}

/* A required or optional string field: NULL when absent (and not
 * required), else its text; -1 in *bad having answered 400. */
static const char *string_field(json_t *body, const char *key, int required, int *bad,
                                http_response *res) {
  json_t *v = json_object_get(body, key);
  if (!v && !required) return NULL;
  if (!v || !json_is_string(v)) {
    bad_field(res, key, "%s is required and must be a string", key);
    *bad = 1;
    return NULL;
  }
  return json_string_value(v);
}

/* Reads a registration body into a (gpus_json malloc'd) and *running.
 * 0, or -1 having answered 400 naming the field. */
static int parse_registration(json_t *body, store_agent *a, json_t **running, http_response *res) {
  static const char *const known[] = {"name", "hostname", "pool",    "address",
                                      "cpus", "gpus",     "version", "running"};
  const char *key;
  json_t *v;
  json_object_foreach(body, key, v) {
    int found = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) found |= strcmp(key, known[i]) == 0;
    if (!found) {
      bad_field(res, key,
                "unknown field '%.60s': an agent registers with name, hostname, pool, address, "
                "cpus, gpus, version and running",
                key);
      return -1;
    }
  }
  int bad = 0;
  const char *name = string_field(body, "name", 1, &bad, res);
  if (bad) return -1;
  if (!http_valid_name(name, sizeof a->name - 1)) {
    bad_field(res, "name", "name must be 1-%zu characters of A-Z a-z 0-9 - _ ., got '%.80s'",
              sizeof a->name - 1, name);
    return -1;
  }
  const char *hostname = string_field(body, "hostname", 0, &bad, res);
  if (bad) return -1;
  if (hostname && !valid_hostname(hostname, 253)) {
    bad_field(res, "hostname",
              "hostname must be a host name (letters, digits, '-', labels of at most 63 joined "
              "by dots, at most 253 characters), got '%.80s'",
              hostname);
    return -1;
  }
  const char *pool = string_field(body, "pool", 1, &bad, res);
  if (bad) return -1;
  if (!http_valid_name(pool, sizeof a->pool - 1)) {
    bad_field(res, "pool", "pool must be 1-%zu characters of A-Z a-z 0-9 - _ ., got '%.80s'",
              sizeof a->pool - 1, pool);
    return -1;
  }
  const char *address = string_field(body, "address", 1, &bad, res);
  if (bad) return -1;
  if (!valid_address(address)) {
    bad_field(res, "address",
              "address must be a numeric IPv4 or IPv6 address or a host name that job traffic "
              "reaches this host at, got '%.80s'",
              address);
    return -1;
  }
  json_t *cpus = json_object_get(body, "cpus");
  if (!json_is_integer(cpus) || json_integer_value(cpus) < 1 ||
      json_integer_value(cpus) > MAX_CPUS) {
    bad_field(res, "cpus", "cpus is required: the host's CPU cores, an integer 1-%d", MAX_CPUS);
    return -1;
  }
  json_t *gpus = json_object_get(body, "gpus");
  if (gpus && check_gpus(gpus, res) != 0) return -1;
  const char *version = string_field(body, "version", 0, &bad, res);
  if (bad) return -1;
  if (version && !printable(version, sizeof a->version - 1)) {
    bad_field(res, "version", "version must be printable text of at most %zu characters",
              sizeof a->version - 1);
    return -1;
  }
  json_t *run = json_object_get(body, "running");
  if (run) {
    size_t i;
    json_t *id;
    if (!json_is_array(run) || json_array_size(run) > MAX_RUNNING) {
      bad_field(res, "running",
                "running must be an array of at most %d allocation ids the agent runs",
                MAX_RUNNING);
      return -1;
    }
    json_array_foreach(run, i, id) {
      if (!json_is_string(id) || !http_valid_name(json_string_value(id), 63)) {
        char field[32];
        snprintf(field, sizeof field, "running[%zu]", i);
        bad_field(res, field, "%s must be an allocation id (1-63 characters of A-Z a-z 0-9 - _ .)",
                  field);
        return -1;
      }
    }
  }
  memset(a, 0, sizeof *a);
  snprintf(a->name, sizeof a->name, "%s", name);
  snprintf(a->hostname, sizeof a->hostname, "%s", hostname ? hostname : name);
  snprintf(a->pool, sizeof a->pool, "%s", pool);
  snprintf(a->address, sizeof a->address, "%s", address);
  snprintf(a->version, sizeof a->version, "%s", version ? version : "");
  a->cpus = (int)json_integer_value(cpus);
  json_t *none = gpus ? NULL : json_array();
  a->gpus_json = json_dumps(gpus ? gpus : none, JSON_COMPACT);
  json_decref(none);
  if (!a->gpus_json) {
    http_reply_status(res, 500, "INTERNAL", NULL, "out of memory");
    return -1;
  }
  *running = run ? json_incref(run) : json_array();
  return 0;
}

json_t *http_agent_json(const store_agent *a) {
  json_t *o = json_object();
  json_object_set_new(o, "id", json_string(a->id));
  json_object_set_new(o, "name", json_string(a->name));
  json_object_set_new(o, "hostname", json_string(a->hostname));
  json_object_set_new(o, "pool", json_string(a->pool));
  json_object_set_new(o, "address", json_string(a->address));
  json_object_set_new(o, "cpus", json_integer(a->cpus));
  json_t *gpus = a->gpus_json ? json_loads(a->gpus_json, 0, NULL) : NULL;
  json_object_set_new(o, "gpus", gpus ? gpus : json_array());
  json_object_set_new(o, "version", json_string(a->version));
  json_object_set_new(o, "state", json_string(a->state));
  json_object_set_new(o, "last_seen_time", http_rfc3339(a->last_seen_ms));
  json_object_set_new(o, "create_time", http_rfc3339(a->create_ms));
  return o;
}

/* The agent routes' gate: an agent token (403 naming role otherwise). */
static int need_agent_token(const http_request *req, http_response *res) {
  if (req->who.agent) return 0;
  http_reply_status(res, 403, "PERMISSION_DENIED", "role",
                    "only a kiln-agent's token (kilnd token create --role agent) may %s %s",
                    req->method, req->path);
  return -1;
}

/* Loads the agent of path parameter 0 (its id or name): 404 when none;
 * with own, 403 unless the caller's token registered it. 0, or -1 having
 * answered. */
static int load_agent(const http_config *cfg, const http_request *req, int own, store_agent *a,
                      http_response *res) {
  const char *key = req->params[0];
  int rc = http_valid_name(key, 63) ? store_agent_get(cfg->st, key, a) : STORE_NOT_FOUND;
  if (rc == STORE_NOT_FOUND) {
    http_reply_status(res, 404, "NOT_FOUND", "agent", "agent '%.63s' does not exist", key);
    return -1;
  }
  if (rc != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return -1;
  }
  if (own && strcmp(a->token_id, req->who.token_id) != 0) {
    http_reply_status(res, 403, "PERMISSION_DENIED", "agent",
                      "agent %s was registered with another token: a token polls only as the "
                      "agent it registered",
                      a->name);
    store_agent_clear(a);
    return -1;
  }
  return 0;
}

/* The grace window of the agents pool named pool: its grace_s, or
 * HTTP_AGENT_GRACE_S for a pool the scheduler does not run as agents. */
static int pool_grace_s(const http_config *cfg, const char *pool) {
  sched_pool_info pools[SCHED_MAX_POOLS];
  int n = sched_pools_info(cfg->scheduler, pools, SCHED_MAX_POOLS);
  for (int i = 0; i < n; i++)
    if (pools[i].agents && strcmp(pools[i].name, pool) == 0) return pools[i].grace_s;
  return HTTP_AGENT_GRACE_S;
}

void http_register_agent(const http_config *cfg, http_request *req, http_response *res) {
  if (need_agent_token(req, res) != 0) return;
  json_error_t jerr;
  json_t *body = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr);
  if (!json_is_object(body)) {
    bad_field(res, "body",
              "the body must be a JSON object {name, pool, address, cpus, ...}%s%.200s",
              body ? "" : ": ", body ? "" : jerr.text);
    json_decref(body);
    return;
  }
  store_agent a, got;
  json_t *running = NULL;
  int rc = parse_registration(body, &a, &running, res);
  json_decref(body);
  if (rc != 0) return;
  snprintf(a.token_id, sizeof a.token_id, "%s", req->who.token_id);
  int created = 0;
  rc = store_agent_register(cfg->st, &a, 0, &got, &created);
  store_agent_clear(&a);
  if (rc == STORE_CONFLICT) {
    json_decref(running);
    http_reply_status(res, 409, "FAILED_PRECONDITION", "name",
                      "agent %s is ONLINE, registered with another token: it moves to this token "
                      "only once it is LOST (silent for %d s)",
                      a.name, pool_grace_s(cfg, a.pool));
    return;
  }
  /* What the agent runs that kilnd no longer places on it: dropped. */
  if (rc == STORE_OK && running && http_agent_drop_stale(cfg->st, got.id, running) != 0)
    rc = STORE_ERROR;
  json_decref(running);
  if (rc != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return;
  }
  /* The first command it should ask for: its oldest one not yet done, or
   * the next to be queued. */
  store_command *pending = NULL;
  int n = 0;
  if (store_command_list(cfg->st, got.id, 0, 1, 1, &pending, &n) != STORE_OK) {
    store_agent_clear(&got);
    http_reply_store_failure(res, cfg->st);
    return;
  }
  json_t *doc = http_agent_json(&got);
  http_agent_add_allocations(cfg->st, got.id, doc);
  json_object_set_new(doc, "next_seq", json_integer(n ? pending[0].seq : got.last_command_seq + 1));
  /* A poll at least three times in each grace window. */
  const int grace_s = pool_grace_s(cfg, got.pool);
  int heartbeat_s = grace_s / 3 < HTTP_AGENT_HEARTBEAT_S ? grace_s / 3 : HTTP_AGENT_HEARTBEAT_S;
  if (heartbeat_s < 1) heartbeat_s = 1;
  json_object_set_new(doc, "heartbeat_s", json_integer(heartbeat_s));
  json_object_set_new(doc, "grace_s", json_integer(grace_s));
  store_command_list_free(pending, n);
  store_agent_clear(&got);
  http_reply_json(res, created ? 201 : 200, doc);
}

void http_list_agents(const http_config *cfg, http_request *req, http_response *res) {
  if (!req->who.admin) {
    http_reply_status(res, 403, "PERMISSION_DENIED", "role",
                      "the agents list is an admin's: it names every worker host");
    return;
  }
  const char *size_arg = http_query(req, "page_size");
  const char *token = http_query(req, "page_token");
  const char *pool = http_query(req, "pool");
  int page_size;
  if (http_parse_page_size(size_arg, &page_size) != 0) {
    bad_field(res, "page_size", "page_size must be a non-negative integer, got '%.40s'", size_arg);
    return;
  }
  if (pool && !http_valid_name(pool, 31)) {
    bad_field(res, "pool", "pool must be 1-31 characters of A-Z a-z 0-9 - _ ., got '%.40s'", pool);
    return;
  }
  char query[64];
  snprintf(query, sizeof query, "agents\n%s", pool ? pool : "");
  store_agent_query q = {.pool = pool, .limit = page_size + 1};
  if (token && *token && api_page_token_decode(token, query, &q.after_seq) != 0) {
    bad_field(res, "page_token", "page_token is not one this server issued for this query");
    return;
  }
  store_agent *list = NULL;
  int n = 0;
  if (store_agent_list(cfg->st, &q, &list, &n) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return;
  }
  json_t *arr = json_array();
  for (int i = 0; i < n && i < page_size; i++) {
    json_t *one = http_agent_json(&list[i]);
    http_agent_add_allocations(cfg->st, list[i].id, one);
    json_array_append_new(arr, one);
  }
  char next[API_PAGE_TOKEN_LEN] = "";
  if (n > page_size) api_page_token_encode(list[page_size - 1].seq, query, next);
  store_agent_list_free(list, n);
  json_t *doc = json_object();
  json_object_set_new(doc, "agents", arr);
  json_object_set_new(doc, "next_page_token", json_string(next));
  http_reply_json(res, 200, doc);
}

void http_get_agent(const http_config *cfg, http_request *req, http_response *res) {
  if (!req->who.admin && !req->who.agent) {
    http_reply_status(res, 403, "PERMISSION_DENIED", "role",
                      "an agent is an admin's to read (or its own kiln-agent's)");
    return;
  }
  store_agent a;
  if (load_agent(cfg, req, !req->who.admin, &a, res) != 0) return;
  json_t *doc = http_agent_json(&a);
  http_agent_add_allocations(cfg->st, a.id, doc);
  http_reply_json(res, 200, doc);
  store_agent_clear(&a);
}

/* One command as the agent gets it: seq and kind, then its payload's fields. */
static json_t *command_json(const store_command *c) {
  json_t *o = json_object();
  json_object_set_new(o, "seq", json_integer(c->seq));
  json_object_set_new(o, "kind", json_string(c->kind));
  json_t *payload = json_loads(c->payload_json, 0, NULL);
  const char *key;
  json_t *v;
  json_object_foreach(payload, key, v) {
    if (strcmp(key, "seq") != 0 && strcmp(key, "kind") != 0) json_object_set(o, key, v);
  }
  json_decref(payload);
  return o;
}

static void reply_commands(http_response *res, json_t *commands, const char *state) {
  json_t *doc = json_object();
  json_object_set_new(doc, "commands", commands);
  json_object_set_new(doc, "state", json_string(state));
  http_reply_json(res, 200, doc);
}

/* Answers at once with the agent's commands past ?after= that are not done
 * yet; with none, parks (no thread held) until one is queued or ?wait=
 * passes, then answers an empty list. Each run is a heartbeat: at arrival,
 * and every PARKED_HEARTBEAT_MS while parked. A LOST agent gets state
 * LOST at once: it must register again. */
void http_poll_agent_commands(const http_config *cfg, http_request *req, http_response *res) {
  if (need_agent_token(req, res) != 0) return;
  const char *after_arg = http_query(req, "after");
  const char *wait_arg = http_query(req, "wait");
  int64_t after = 0;
  if (after_arg) {
    char *end = NULL;
    long long v = strtoll(after_arg, &end, 10);
    if (!*after_arg || *end || v < 0) {
      bad_field(res, "after", "after must be a command seq, an integer >= 0, got '%.40s'",
                after_arg);
      return;
    }
    after = v;
  }
  double wait_s = 0;
  if (wait_arg) {
    wait_s = http_parse_duration(wait_arg);
    if (wait_s < 0 || wait_s > POLL_WAIT_MAX_S) {
      bad_field(res, "wait",
                "wait must be a duration like 30s, 1m or 500ms, at most %ds, got '%.40s'",
                POLL_WAIT_MAX_S, wait_arg);
      return;
    }
  }
  store_agent a;
  if (load_agent(cfg, req, 1, &a, res) != 0) return;
  const int64_t now_mono = http_monotonic_ms(), now = store_now_ms();
  const int64_t arrived = now - (now_mono - req->arrived_ms);
  int rc = STORE_OK;
  if (strcmp(a.state, STORE_AGENT_LOST) != 0 &&
      (a.last_seen_ms < arrived || now - a.last_seen_ms >= PARKED_HEARTBEAT_MS))
    rc = store_agent_touch(cfg->st, a.id, now);
  if (rc == STORE_CONFLICT || (rc == STORE_OK && strcmp(a.state, STORE_AGENT_LOST) == 0)) {
    reply_commands(res, json_array(), STORE_AGENT_LOST);
    store_agent_clear(&a);
    return;
  }
  if (rc != STORE_OK) {
    store_agent_clear(&a);
    http_reply_store_failure(res, cfg->st);
    return;
  }
  store_command *list = NULL;
  int n = 0;
  rc = store_command_list(cfg->st, a.id, after, 1, POLL_MAX_COMMANDS, &list, &n);
  store_agent_clear(&a);
  if (rc != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return;
  }
  const int64_t deadline = req->arrived_ms + (int64_t)(wait_s * 1000);
  if (n == 0 && now_mono < deadline) {
    if (http_stopping(cfg)) {
      http_reply_status(res, 503, "UNAVAILABLE", NULL,
                        "kilnd is shutting down; poll again when it is back");
      return;
    }
    const int64_t beat = now_mono + PARKED_HEARTBEAT_MS;
    res->park = 1;
    res->park_until_ms = beat < deadline ? beat : deadline;
    return;
  }
  json_t *commands = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(commands, command_json(&list[i]));
  store_command_list_free(list, n);
  reply_commands(res, commands, STORE_AGENT_ONLINE);
}

void http_agent_command_done(const http_config *cfg, http_request *req, http_response *res) {
  if (need_agent_token(req, res) != 0) return;
  const char *seq_arg = req->params[1];
  char *end = NULL;
  long long seq = strtoll(seq_arg, &end, 10);
  if (!*seq_arg || *end || seq < 1) {
    bad_field(res, "seq", "seq must be a command's number, an integer >= 1, got '%.40s'", seq_arg);
    return;
  }
  json_error_t jerr;
  json_t *body = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr);
  if (!json_is_object(body)) {
    bad_field(res, "body",
              "the body must be a JSON object {\"ok\": true} or {\"ok\": false, \"error\": "
              "TEXT}%s%.200s",
              body ? "" : ": ", body ? "" : jerr.text);
    json_decref(body);
    return;
  }
  const char *key;
  json_t *v;
  json_object_foreach(body, key, v) {
    int ok = 1;
    if (strcmp(key, "ok") == 0)
      ok = json_is_boolean(v);
    else if (strcmp(key, "error") == 0)
      ok = json_is_string(v) && strlen(json_string_value(v)) <= 4096;
    else if (strcmp(key, "exit_code") == 0)
      ok = json_is_integer(v) && json_integer_value(v) >= -255 && json_integer_value(v) <= 255;
    else {
      bad_field(res, key, "unknown field '%.60s': a report has ok, error and exit_code", key);
      json_decref(body);
      return;
    }
    if (!ok) {
      bad_field(res, key, "%s must be %s", key,
                strcmp(key, "ok") == 0      ? "true or false"
                : strcmp(key, "error") == 0 ? "text of at most 4096 bytes"
                                            : "an integer -255..255");
      json_decref(body);
      return;
    }
  }
  json_t *okv = json_object_get(body, "ok");
  if (!okv) {
    bad_field(res, "ok", "ok is required: true when the command was carried out");
    json_decref(body);
    return;
  }
  store_agent a;
  if (load_agent(cfg, req, 1, &a, res) != 0) {
    json_decref(body);
    return;
  }
  char *result = json_dumps(body, JSON_COMPACT);
  const int ok = json_is_true(okv);
  json_decref(body);
  int newly = 0;
  int rc = result ? store_command_done(cfg->st, a.id, seq, ok, result, 0, &newly) : STORE_ERROR;
  free(result);
  if (rc == STORE_OK) store_agent_touch(cfg->st, a.id, 0); /* a LOST one stays LOST */
  if (rc == STORE_NOT_FOUND) {
    http_reply_status(res, 404, "NOT_FOUND", "seq", "agent %s has no command %lld", a.name, seq);
  } else if (rc != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
  } else {
    store_command c;
    if (store_command_get(cfg->st, a.id, seq, &c) != STORE_OK) {
      http_reply_store_failure(res, cfg->st);
    } else {
      json_t *doc = json_object();
      json_object_set_new(doc, "seq", json_integer(c.seq));
      json_object_set_new(doc, "kind", json_string(c.kind));
      json_object_set_new(doc, "ok", json_boolean(c.ok));
      json_object_set_new(doc, "done_time", http_rfc3339(c.done_ms));
      /* A repeated report is answered the same, saying it changed nothing. */
      json_object_set_new(doc, "repeated", json_boolean(!newly));
      store_command_clear(&c);
      http_reply_json(res, 200, doc);
    }
  }
  store_agent_clear(&a);
}
