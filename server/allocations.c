/* allocations.c — the worker side of an allocation (an attempt of a job on
 * remote hosts): its token as the only credential, for that allocation
 * alone and only until it ends; progress lines into its runner; checkpoint
 * uploads streamed to disk and checked by sha256; the checkpoint to resume
 * from; the trainer's exit; and the relay that has a host's agent run
 * Open MPI's daemon for a multi-host allocation. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common.h"
#include "routes.h"

#define RELAY_WAIT_MAX_S 300

int http_authenticate_allocation(const http_config *cfg, http_request *req, http_response *res) {
  const char *auth = http_header(req, "Authorization");
  if (!auth || strncasecmp(auth, "Bearer ", 7) != 0 || !auth[7]) {
    http_reply_status(res, 401, "UNAUTHENTICATED", "Authorization",
                      "this route needs 'Authorization: Bearer TOKEN' with the allocation's token");
    return -1;
  }
  char hash[65];
  kc_sha256_hex_of(auth + 7, strlen(auth + 7), hash);
  store_allocation a;
  int rc = store_allocation_by_token(cfg->st, hash, &a);
  if (rc == STORE_NOT_FOUND) {
    http_reply_status(res, 401, "UNAUTHENTICATED", "Authorization",
                      "the bearer token is not an allocation's token");
    return -1;
  }
  if (rc != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return -1;
  }
  int ok = -1;
  if (strcmp(a.id, req->params[0]) != 0) {
    http_reply_status(res, 403, "PERMISSION_DENIED", "alloc",
                      "the token is another allocation's, not %.60s's", req->params[0]);
  } else if (strcmp(a.state, STORE_ALLOC_ENDED) == 0) {
    http_reply_status(res, 403, "PERMISSION_DENIED", "alloc",
                      "allocation %s has ended (%s); its token is no longer valid", a.id, a.reason);
  } else {
    snprintf(req->who.tenant, sizeof req->who.tenant, "allocations");
    req->who.admin = 0;
    snprintf(req->alloc_job, sizeof req->alloc_job, "%s", a.job_id);
    req->alloc_attempt = a.attempt;
    ok = 0;
  }
  store_allocation_clear(&a);
  return ok;
}

void http_post_allocation_progress(const http_config *cfg, http_request *req, http_response *res) {
  if (sched_remote_progress(cfg->scheduler, req->params[0], req->body, req->body_len) != 0) {
    http_reply_status(res, 409, "FAILED_PRECONDITION", "alloc",
                      "no runner of this kilnd waits on allocation %s (it is ending)",
                      req->params[0]);
    return;
  }
  res->status = 204;
}

void http_post_allocation_exit(const http_config *cfg, http_request *req, http_response *res) {
  json_error_t jerr;
  json_t *body = json_loads(req->body, 0, &jerr);
  if (!json_is_object(body)) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "body", "the body must be a JSON object: %s",
                      body ? "got another JSON value" : jerr.text);
    json_decref(body);
    return;
  }
  json_t *code = json_object_get(body, "exit_code"), *sig = json_object_get(body, "signal");
  json_t *host = json_object_get(body, "host"), *message = json_object_get(body, "message");
  const char *field = NULL, *why = NULL;
  if (!!code == !!sig) {
    field = "exit_code";
    why = "give exit_code or signal, exactly one of the two";
  } else if (code && (!json_is_integer(code) || json_integer_value(code) < 0 ||
                      json_integer_value(code) > 255)) {
    field = "exit_code";
    why = "exit_code must be a whole number from 0 to 255";
  } else if (sig && (!json_is_integer(sig) || json_integer_value(sig) < 1 ||
                     json_integer_value(sig) > 64)) {
    field = "signal";
    why = "signal must be a whole number from 1 to 64";
  } else if (host && (!json_is_string(host) || json_string_length(host) > 63)) {
    field = "host";
    why = "host must be an agent name of at most 63 characters";
  } else if (message && (!json_is_string(message) || json_string_length(message) > 1000)) {
    field = "message";
    why = "message must be a string of at most 1000 characters";
  }
  if (field) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", field, "%s", why);
    json_decref(body);
    return;
  }
  int exit_code = code ? (int)json_integer_value(code) : 0;
  int signal_no = sig ? (int)json_integer_value(sig) : 0;
  json_decref(body);
  if (sched_remote_exit(cfg->scheduler, req->params[0], exit_code, signal_no) != 0) {
    http_reply_status(res, 409, "FAILED_PRECONDITION", "alloc",
                      "no runner of this kilnd waits on allocation %s (its exit came already)",
                      req->params[0]);
    return;
  }
  http_reply_json(res, 200, json_object());
}

/* ---- checkpoints ---- */

struct http_ckpt_upload {
  char tmp_path[4200], final_path[4200];
  char want[65];
  int fd;
  uint64_t bytes;
  int failed, too_large;
  kc_sha256 hash;
};

static void lower_hex(char *s) {
  for (; *s; s++)
    if (*s >= 'A' && *s <= 'F') *s = (char)(*s + 32);
}

int http_ckpt_upload_begin(const http_config *cfg, const http_request *req, http_ckpt_upload **out,
                           http_response *res) {
  *out = NULL;
  char *end = NULL;
  errno = 0;
  long long step = strtoll(req->params[1], &end, 10);
  if (!*req->params[1] || *end || errno || step < 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "step",
                      "step must be a whole number >= 0, got '%.40s'", req->params[1]);
    return -1;
  }
  const char *sha = http_query(req, "sha256");
  if (!sha || strlen(sha) != 64 || strspn(sha, "0123456789abcdefABCDEF") != 64) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "sha256",
                      "sha256 must be the file's SHA-256 as 64 hex digits");
    return -1;
  }
  /* A checkpoint is two files: the weights, and the training state kiln-train
   * resumes with beside them (the same name, .state). */
  const char *part = http_query(req, "part");
  if (part && strcmp(part, "weights") != 0 && strcmp(part, "state") != 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "part",
                      "part must be weights (the default) or state, got '%.40s'", part);
    return -1;
  }
  const int state = part && strcmp(part, "state") == 0;
  http_ckpt_upload *u = calloc(1, sizeof *u);
  if (!u) {
    http_reply_status(res, 500, "INTERNAL", NULL, "out of memory");
    return -1;
  }
  u->fd = -1;
  snprintf(u->want, sizeof u->want, "%s", sha);
  lower_hex(u->want);
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/%s/checkpoints", cfg->jobs_dir, req->alloc_job);
  snprintf(u->final_path, sizeof u->final_path, "%s/remote-a%d-step-%lld.%s", dir,
           req->alloc_attempt, step, state ? "state" : "safetensors");
  snprintf(u->tmp_path, sizeof u->tmp_path, "%s/.upload-XXXXXX", dir);
  u->fd = mkostemp(u->tmp_path, O_CLOEXEC);
  if (u->fd < 0) {
    http_reply_status(res, 500, "INTERNAL", NULL, "cannot create the checkpoint file: %s",
                      strerror(errno));
    u->tmp_path[0] = '\0';
    http_ckpt_upload_free(u);
    return -1;
  }
  kc_sha256_init(&u->hash);
  *out = u;
  return 0;
}

int http_ckpt_upload_write(const http_config *cfg, http_ckpt_upload *u, const char *data,
                           size_t len) {
  if (u->too_large) return -1;
  if (u->bytes + len > cfg->max_upload_bytes) {
    u->too_large = 1;
    return -1;
  }
  kc_sha256_update(&u->hash, data, len);
  for (size_t done = 0; !u->failed && done < len;) {
    ssize_t n = write(u->fd, data + done, len - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      u->failed = errno ? errno : EIO;
    else
      done += (size_t)n;
  }
  u->bytes += len;
  return 0;
}

/* A refused upload's file goes before the answer does: a client that reads
 * the answer never finds it. */
static void discard(http_ckpt_upload *u) {
  if (u->fd >= 0) close(u->fd);
  u->fd = -1;
  if (u->tmp_path[0]) unlink(u->tmp_path);
  u->tmp_path[0] = '\0';
}

static void finish(const http_config *cfg, http_ckpt_upload *u, http_response *res);

void http_ckpt_upload_finish(const http_config *cfg, http_ckpt_upload *u, http_response *res) {
  finish(cfg, u, res);
  if (res->status != 200) discard(u);
}

static void finish(const http_config *cfg, http_ckpt_upload *u, http_response *res) {
  if (u->too_large) {
    http_reply_status(res, 413, "RESOURCE_EXHAUSTED", "body",
                      "the checkpoint is larger than the %zu-byte limit (--max-upload-bytes)",
                      cfg->max_upload_bytes);
    return;
  }
  uint8_t digest[32];
  char got[65];
  kc_sha256_final(&u->hash, digest);
  kc_sha256_hex(digest, got);
  if (!u->failed && fsync(u->fd) != 0) u->failed = errno;
  if (u->failed) {
    http_reply_status(res, 500, "INTERNAL", NULL, "cannot write the checkpoint: %s",
                      strerror(u->failed));
    return;
  }
  if (strcmp(got, u->want) != 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "sha256",
                      "the body's SHA-256 is %s, not the %s given: the checkpoint is not kept", got,
                      u->want);
    return;
  }
  if (rename(u->tmp_path, u->final_path) != 0) {
    http_reply_status(res, 500, "INTERNAL", NULL, "cannot keep the checkpoint: %s",
                      strerror(errno));
    return;
  }
  u->tmp_path[0] = '\0'; /* kept */
  /* The rename is durable once its folder is. */
  char dir[4200];
  snprintf(dir, sizeof dir, "%s", u->final_path);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = '\0';
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  http_reply_json(res, 200,
                  json_pack("{s:s, s:I, s:s}", "path", u->final_path, "bytes", (json_int_t)u->bytes,
                            "sha256", got));
}

void http_ckpt_upload_free(http_ckpt_upload *u) {
  if (!u) return;
  discard(u);
  free(u);
}

/* The handler the router names; the body was taken by the upload above. */
void http_put_allocation_checkpoint(const http_config *cfg, http_request *req, http_response *res) {
  (void)cfg;
  (void)req;
  http_reply_status(res, 500, "INTERNAL", NULL, "the checkpoint upload was not streamed");
}

void http_get_allocation_resume(const http_config *cfg, http_request *req, http_response *res) {
  store_checkpoint *list = NULL;
  int n = 0;
  if (store_checkpoint_list(cfg->st, req->alloc_job, &list, &n) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return;
  }
  const char *part = http_query(req, "part");
  if (part && strcmp(part, "weights") != 0 && strcmp(part, "state") != 0) {
    store_checkpoint_list_free(list, n);
    http_reply_status(res, 400, "INVALID_ARGUMENT", "part",
                      "part must be weights (the default) or state, got '%.40s'", part);
    return;
  }
  const int state = part && strcmp(part, "state") == 0;
  int found = 0;
  for (int i = n - 1; i >= 0 && !found; i--) { /* the newest whose file is still there */
    char path[sizeof list[i].path + 16];
    snprintf(path, sizeof path, "%s", list[i].path);
    size_t len = strlen(path);
    static const char ext[] = ".safetensors";
    if (state && len >= sizeof ext - 1 && strcmp(path + len - (sizeof ext - 1), ext) == 0)
      snprintf(path + len - (sizeof ext - 1), sizeof path - (len - (sizeof ext - 1)), ".state");
    else if (state)
      snprintf(path + len, sizeof path - len, ".state");
    if (access(list[i].path, R_OK) != 0 ||
        http_reply_file(res, path, "application/octet-stream") != 0)
      continue;
    res->header_names[0] = "X-Kiln-Sha256"; /* the weights' (the state file checks itself) */
    snprintf(res->header_values[0], sizeof res->header_values[0], "%s", list[i].sha256);
    res->header_names[1] = "X-Kiln-Step";
    snprintf(res->header_values[1], sizeof res->header_values[1], "%lld", (long long)list[i].step);
    found = 1;
  }
  store_checkpoint_list_free(list, n);
  if (!found)
    http_reply_status(res, 404, "NOT_FOUND", "checkpoint",
                      "job %s has no checkpoint to resume from", req->alloc_job);
}

/* ---- the relay ---- */

static int random_hex(char *out, size_t bytes) {
  unsigned char raw[16];
  if (bytes > sizeof raw) return -1;
  FILE *f = fopen("/dev/urandom", "rb");
  size_t got = f ? fread(raw, 1, bytes, f) : 0;
  if (f) fclose(f);
  if (got != bytes) return -1;
  for (size_t i = 0; i < bytes; i++) snprintf(out + 2 * i, 3, "%02x", raw[i]);
  return 0;
}

/* Open MPI's daemon: orted (4.x) or prted (5.x), by argv[0]'s basename. */
static int mpi_daemon(const char *argv0) {
  const char *base = strrchr(argv0, '/');
  base = base ? base + 1 : argv0;
  return strcmp(base, "orted") == 0 || strcmp(base, "prted") == 0;
}

void http_post_allocation_relay(const http_config *cfg, http_request *req, http_response *res) {
  json_error_t jerr;
  json_t *body = json_loads(req->body, 0, &jerr);
  store_allocation a;
  memset(&a, 0, sizeof a);
  if (!json_is_object(body)) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "body", "the body must be a JSON object: %s",
                      body ? "got another JSON value" : jerr.text);
    goto done;
  }
  const char *host = json_string_value(json_object_get(body, "host"));
  json_t *argv = json_object_get(body, "argv");
  if (!host || !host[0]) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "host", "host must name an agent");
    goto done;
  }
  if (!json_is_array(argv) || json_array_size(argv) == 0 || json_array_size(argv) > 256) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "argv",
                      "argv must be an array of 1 to 256 strings");
    goto done;
  }
  size_t i;
  json_t *arg;
  json_array_foreach(argv, i, arg) {
    if (!json_is_string(arg) || json_string_length(arg) > 4096) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", "argv",
                        "argv[%zu] must be a string of at most 4096 characters", i);
      goto done;
    }
  }
  if (!mpi_daemon(json_string_value(json_array_get(argv, 0)))) {
    http_reply_status(res, 403, "PERMISSION_DENIED", "argv",
                      "the relay runs only Open MPI's daemon (orted, prted), not '%.80s'",
                      json_string_value(json_array_get(argv, 0)));
    goto done;
  }
  if (store_allocation_get(cfg->st, req->params[0], &a) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    goto done;
  }
  if (a.n_hosts < 2) {
    http_reply_status(res, 403, "PERMISSION_DENIED", "alloc",
                      "allocation %s has one host: it has no daemons to relay", a.id);
    goto done;
  }
  const store_alloc_host *target = NULL;
  for (int h = 0; h < a.n_hosts && !target; h++)
    if (strcmp(a.hosts[h].name, host) == 0) target = &a.hosts[h];
  if (!target) {
    http_reply_status(res, 403, "PERMISSION_DENIED", "host",
                      "host '%.63s' is not one of allocation %s's hosts", host, a.id);
    goto done;
  }
  char relay[40] = "relay-";
  if (random_hex(relay + 6, 8) != 0) {
    http_reply_status(res, 500, "INTERNAL", NULL, "cannot read random bytes for a relay id");
    goto done;
  }
  json_t *cmd = json_pack("{s:s, s:s, s:O}", "alloc", a.id, "relay", relay, "argv", argv);
  char *payload = json_dumps(cmd, JSON_COMPACT);
  json_decref(cmd);
  int64_t seq = 0;
  int rc = payload ? store_command_enqueue(cfg->st, target->agent_id, "exec", payload, &seq)
                   : STORE_ERROR;
  free(payload);
  if (rc != STORE_OK || store_relay_add(cfg->st, relay, a.id, target->agent_id, seq) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    goto done;
  }
  http_reply_json(res, 200, json_pack("{s:s}", "relay", relay));
done:
  store_allocation_clear(&a);
  json_decref(body);
}

void http_wait_allocation_relay(const http_config *cfg, http_request *req, http_response *res) {
  const char *timeout_arg = http_query(req, "timeout");
  double timeout_s = 30;
  if (timeout_arg) {
    timeout_s = http_parse_duration(timeout_arg);
    if (timeout_s < 0 || timeout_s > RELAY_WAIT_MAX_S) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", "timeout",
                        "timeout must be a duration like 30s, at most %ds, got '%.40s'",
                        RELAY_WAIT_MAX_S, timeout_arg);
      return;
    }
  }
  char agent[32];
  int64_t seq = 0;
  int rc = store_relay_get(cfg->st, req->params[0], req->params[1], agent, &seq);
  if (rc == STORE_NOT_FOUND) {
    http_reply_status(res, 404, "NOT_FOUND", "relay", "allocation %s has no relay '%.60s'",
                      req->params[0], req->params[1]);
    return;
  }
  store_command c;
  if (rc != STORE_OK || store_command_get(cfg->st, agent, seq, &c) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return;
  }
  const int done = c.done_ms > 0;
  json_t *result = done && c.result_json ? json_loads(c.result_json, 0, NULL) : NULL;
  json_t *code = json_object_get(result, "exit_code");
  store_command_clear(&c);
  const int64_t deadline = req->arrived_ms + (int64_t)(timeout_s * 1000);
  if (!done && !http_stopping(cfg) && http_monotonic_ms() < deadline) {
    res->park = 1;
    res->park_until_ms = deadline;
  } else if (done) {
    http_reply_json(
        res, 200,
        json_pack("{s:b, s:I}", "done", 1, "exit_code",
                  (json_int_t)(json_is_integer(code) ? json_integer_value(code) : (c.ok ? 0 : 1))));
  } else {
    http_reply_json(res, 200, json_pack("{s:b}", "done", 0));
  }
  json_decref(result);
}

/* ---- what the agents' routes show and answer of allocations ---- */

void http_agent_add_allocations(store *st, const char *agent_id, json_t *o) {
  store_allocation *list = NULL;
  int n = 0;
  json_t *arr = json_array();
  if (store_allocations_unended(st, agent_id, &list, &n) == STORE_OK) {
    for (int i = 0; i < n; i++) {
      for (int h = 0; h < list[i].n_hosts; h++) {
        const store_alloc_host *host = &list[i].hosts[h];
        if (strcmp(host->agent_id, agent_id) != 0) continue;
        json_t *cores = json_array();
        for (const char *c = host->cores; *c; c += strcspn(c, ","), c += *c == ',')
          json_array_append_new(cores, json_integer(strtol(c, NULL, 10)));
        json_array_append_new(arr,
                              json_pack("{s:s, s:s, s:i, s:o, s:i, s:i}", "id", list[i].id, "job",
                                        list[i].job_id, "attempt", list[i].attempt, "cores", cores,
                                        "rank_first", host->rank_first, "ranks", host->ranks));
      }
    }
  }
  store_allocation_list_free(list, n);
  json_object_set_new(o, "allocations", arr);
}

int http_agent_drop_stale(store *st, const char *agent_id, json_t *running) {
  size_t i;
  json_t *id;
  json_array_foreach(running, i, id) {
    const char *alloc = json_string_value(id);
    if (!alloc) continue;
    store_allocation a;
    int rc = store_allocation_get(st, alloc, &a);
    if (rc != STORE_OK && rc != STORE_NOT_FOUND) return -1;
    int placed = 0;
    for (int h = 0; rc == STORE_OK && h < a.n_hosts; h++)
      placed |= strcmp(a.hosts[h].agent_id, agent_id) == 0;
    if (rc == STORE_OK && strcmp(a.state, STORE_ALLOC_ENDED) == 0) placed = 0;
    store_allocation_clear(&a);
    if (placed) continue;
    /* Not (or no longer) kilnd's on this agent: it must stop it. */
    json_t *cmd = json_pack("{s:s}", "alloc", alloc);
    char *payload = json_dumps(cmd, JSON_COMPACT);
    json_decref(cmd);
    rc = payload ? store_command_enqueue(st, agent_id, "drop", payload, NULL) : STORE_ERROR;
    free(payload);
    if (rc != STORE_OK) return -1;
  }
  return 0;
}
