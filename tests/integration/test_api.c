/* test_api.c — the service API against a real kilnd on loopback, with a
 * stand-in trainer (a shell script speaking kiln-train's progress protocol)
 * so jobs end in milliseconds: tokens and tenants, request_id, pagination
 * over 250 jobs, cancel / delete / wait / explain, priority order, the SSE
 * metric stream with Last-Event-ID and openapi.json against the router
 * (the table of malformed requests: test_bad_requests.c). */
#include <curl/curl.h>
#include <jansson.h>
#include <setjmp.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static char data_dir[256];
static char base_url[64];
static pid_t kilnd_pid;
static char admin_token[128], acme_token[128], beta_token[128], pager_token[128];
static char *small_spec; /* the example with display_name "NAME" to fill in */

#define SHA_ZEROS "0000000000000000000000000000000000000000000000000000000000000000"

/* The stand-in trainer: "sleeper*" jobs run until signalled, "emitter*"
 * jobs report 30 loss points over about 1.5 s ("emitter-slow" 4.5 s, with a
 * checkpoint every 5 steps whose file holds its step, and one more at the
 * current step on SIGTERM, as kiln-train does; given --resume FILE it goes
 * on from the step after the one in FILE), every other job reports one
 * point and succeeds. */
static const char trainer_script[] =
    "#!/bin/sh\n"
    "spec=\"$2\"; resume=''; ckdir=''; prev=''\n"
    "for a in \"$@\"; do\n"
    "  [ \"$prev\" = --resume ] && resume=\"$a\"\n"
    "  [ \"$prev\" = --checkpoint-dir ] && ckdir=\"$a\"\n"
    "  prev=\"$a\"\n"
    "done\n"
    "if grep -q '\"display_name\":\"sleeper' \"$spec\"; then exec sleep 600; fi\n"
    "if grep -q '\"display_name\":\"emitter' \"$spec\"; then\n"
    "  stop=''; trap 'stop=1' TERM\n"
    "  i=1\n"
    "  if [ -n \"$resume\" ]; then i=$(( $(cat \"$resume\") + 1 )); fi\n"
    "  while [ $i -le 30 ]; do\n"
    "    if grep -q 'emitter-slow' \"$spec\"; then sleep 0.1; fi\n"
    "    echo \"{\\\"step\\\":$i,\\\"epoch\\\":1,\\\"metrics\\\":{\\\"loss\\\":$i}}\" >&3\n"
    "    halt=\"$stop\"\n"
    "    if grep -q 'emitter-slow' \"$spec\" && [ $((i % 5)) -eq 0 -o -n \"$halt\" ]; then\n"
    "      f=\"$ckdir/ckpt-$i.safetensors\"; echo $i > \"$f\"\n"
    "      echo \"{\\\"checkpoint\\\":{\\\"step\\\":$i,\\\"path\\\":\\\"$f\\\",\\\"bytes\\\":3,"
    "\\\"sha256\\\":\\\"" SHA_ZEROS "\\\"}}\" >&3\n"
    "    fi\n"
    "    if [ -n \"$halt\" ]; then exit 6; fi\n"
    "    i=$((i+1)); sleep 0.05\n"
    "  done\n"
    "  exit 0\n"
    "fi\n"
    "echo '{\"step\":1,\"epoch\":1,\"metrics\":{\"loss\":1}}' >&3\n";

/* ---- HTTP ---- */

/* One request with an optional raw Authorization value and extra header;
 * returns the status, the body text in *text (may be NULL) and JSON in *out. */
static long request(const char *method, const char *path, const char *body, size_t body_len,
                    const char *authorization, const char *extra_header, char **text,
                    json_t **out) {
  char *data = NULL;
  long status =
      it_request_as(base_url, authorization, extra_header, method, path, body, body_len, 60, &data);
  if (status == 0) fail_msg("%s %s: %s", method, path, data ? data : "no answer");
  if (out) *out = data ? json_loads(data, 0, NULL) : NULL;
  if (text) {
    *text = data ? data : strdup("");
  } else {
    free(data);
  }
  return status;
}

static long call(const char *token, const char *method, const char *path, const char *body,
                 json_t **out) {
  char auth[200];
  snprintf(auth, sizeof auth, "Bearer %s", token);
  return request(method, path, body, body ? strlen(body) : 0, auth, NULL, NULL, out);
}

static char *spec_named(const char *name, int priority) {
  json_t *spec = json_loads(small_spec, 0, NULL);
  json_object_set_new(spec, "display_name", json_string(name));
  json_object_set_new(spec, "priority", json_integer(priority));
  char *text = json_dumps(spec, JSON_COMPACT);
  json_decref(spec);
  return text;
}

/* Creates a job as token; returns its id in id (64 bytes). */
static void create(const char *token, const char *name, int priority, char *id) {
  char *body = spec_named(name, priority);
  json_t *doc;
  long status = call(token, "POST", "/v1/jobs", body, &doc);
  free(body);
  if (status != 200) fail_msg("create %s: HTTP %ld", name, status);
  snprintf(id, 64, "%s", json_string_value(json_object_get(doc, "id")));
  json_decref(doc);
}

static int is_terminal(const char *state) {
  return !strcmp(state, "SUCCEEDED") || !strcmp(state, "FAILED") || !strcmp(state, "CANCELLED");
}

/* :wait on a job; returns its final JSON (caller decrefs). */
static json_t *wait_job(const char *token, const char *id) {
  char path[160];
  snprintf(path, sizeof path, "/v1/jobs/%s:wait?timeout=30s", id);
  json_t *doc;
  assert_int_equal(call(token, "POST", path, NULL, &doc), 200);
  if (!is_terminal(json_string_value(json_object_get(doc, "state"))))
    fail_msg("job %s is still %s after :wait", id,
             json_string_value(json_object_get(doc, "state")));
  assert_true(json_is_true(json_object_get(doc, "done")));
  return doc;
}

static void wait_state(const char *token, const char *id, const char *state) {
  char path[160];
  snprintf(path, sizeof path, "/v1/jobs/%s", id);
  for (int i = 0; i < 200; i++) {
    json_t *doc;
    assert_int_equal(call(token, "GET", path, NULL, &doc), 200);
    int done = !strcmp(json_string_value(json_object_get(doc, "state")), state);
    json_decref(doc);
    if (done) return;
    usleep(50 * 1000);
  }
  fail_msg("job %s never reached %s", id, state);
}

static void assert_error(json_t *doc, long code, const char *status, const char *field) {
  assert_non_null(doc);
  json_t *e = json_object_get(doc, "error");
  assert_non_null(e);
  assert_int_equal(json_integer_value(json_object_get(e, "code")), code);
  assert_string_equal(json_string_value(json_object_get(e, "status")), status);
  assert_true(strlen(json_string_value(json_object_get(e, "message"))) > 0);
  if (field) {
    json_t *d = json_array_get(json_object_get(e, "details"), 0);
    if (!d || strcmp(json_string_value(json_object_get(d, "field")), field) != 0)
      fail_msg("expected detail field %s, got %s", field,
               d ? json_string_value(json_object_get(d, "field")) : "(none)");
  }
}

/* ---- kilnd ---- */

static void make_token(const char *tenant, char *out, size_t len) {
  assert_int_equal(it_make_token(KILND_PATH, data_dir, tenant, out, len), 0);
}

/* Starts kilnd on data_dir with the stand-in trainer; 0 once it serves. */
static int launch_kilnd(void) {
  char trainer[300], pools[300];
  snprintf(trainer, sizeof trainer, "%s/trainer.sh", data_dir);
  /* One device: jobs queue behind one another whatever the machine has. */
  snprintf(pools, sizeof pools, "%s/pools.json", data_dir);
  FILE *f = fopen(pools, "w");
  if (!f) return -1;
  fputs("{\"pools\": [{\"name\": \"default\", \"devices\": [0]}]}", f);
  fclose(f);
  return it_launch_kilnd(KILND_PATH, data_dir, trainer, "--pools", pools, &kilnd_pid, base_url,
                         sizeof base_url, admin_token, sizeof admin_token);
}

static int start_kilnd(void **state) {
  (void)state;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-api-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  char trainer[300];
  snprintf(trainer, sizeof trainer, "%s/trainer.sh", data_dir);
  if (it_write_file(trainer, trainer_script, 0700) != 0) return -1;
  small_spec = it_read_file(EXAMPLES_DIR "/fmnist-mlp.json");
  if (!small_spec) return -1;
  return launch_kilnd();
}

static int stop_kilnd(void **state) {
  (void)state;
  if (kilnd_pid > 0) {
    kill(kilnd_pid, SIGTERM);
    waitpid(kilnd_pid, NULL, 0);
  }
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", data_dir);
  int rc = system(cmd);
  free(small_spec);
  curl_global_cleanup();
  return rc;
}

/* ---- tests, in order ---- */

static void tokens_are_made_per_tenant_and_checked(void **state) {
  (void)state;
  make_token("acme", acme_token, sizeof acme_token);
  make_token("beta", beta_token, sizeof beta_token);
  make_token("pager", pager_token, sizeof pager_token);
  json_t *doc;
  assert_int_equal(call(acme_token, "GET", "/v1/jobs", NULL, &doc), 200);
  assert_int_equal(json_array_size(json_object_get(doc, "jobs")), 0);
  json_decref(doc);
  assert_int_equal(call("kiln_0000", "GET", "/v1/jobs", NULL, &doc), 401);
  assert_error(doc, 401, "UNAUTHENTICATED", "Authorization");
  json_decref(doc);
  /* The token file is the owner's alone. */
  char token_file[300];
  struct stat sb;
  snprintf(token_file, sizeof token_file, "%s/admin.token", data_dir);
  assert_int_equal(stat(token_file, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0600);
}

static void same_request_id_twice_makes_one_job(void **state) {
  (void)state;
  char *body = spec_named("quick-rid", 50);
  json_t *a, *b, *list;
  assert_int_equal(call(acme_token, "POST", "/v1/jobs?request_id=rid-7", body, &a), 200);
  assert_int_equal(call(acme_token, "POST", "/v1/jobs?request_id=rid-7", body, &b), 200);
  assert_string_equal(json_string_value(json_object_get(a, "id")),
                      json_string_value(json_object_get(b, "id")));
  /* Another tenant's same key is its own job. */
  json_t *c;
  assert_int_equal(call(beta_token, "POST", "/v1/jobs?request_id=rid-7", body, &c), 200);
  assert_string_not_equal(json_string_value(json_object_get(a, "id")),
                          json_string_value(json_object_get(c, "id")));
  free(body);
  assert_int_equal(call(acme_token, "GET", "/v1/jobs", NULL, &list), 200);
  assert_int_equal(json_array_size(json_object_get(list, "jobs")), 1);
  json_decref(list);
  json_decref(wait_job(acme_token, json_string_value(json_object_get(a, "id"))));
  json_decref(wait_job(beta_token, json_string_value(json_object_get(c, "id"))));
  json_decref(a);
  json_decref(b);
  json_decref(c);
}

static void a_tenant_cannot_see_another_tenants_job(void **state) {
  (void)state;
  char id[64], path[200];
  create(acme_token, "quick-private", 50, id);
  json_decref(wait_job(acme_token, id));
  const char *subs[] = {"", "/metrics", "/events", "/logs", "/checkpoints", ":explain"};
  for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
    json_t *doc;
    snprintf(path, sizeof path, "/v1/jobs/%s%s", id, subs[i]);
    assert_int_equal(call(beta_token, "GET", path, NULL, &doc), 404);
    assert_error(doc, 404, "NOT_FOUND", "job");
    json_decref(doc);
    assert_int_equal(call(acme_token, "GET", path, NULL, NULL), 200);
    assert_int_equal(call(admin_token, "GET", path, NULL, NULL), 200); /* admins see all */
  }
  json_t *doc;
  snprintf(path, sizeof path, "/v1/jobs/%s", id);
  assert_int_equal(call(beta_token, "DELETE", path, NULL, &doc), 404);
  json_decref(doc);
  snprintf(path, sizeof path, "/v1/jobs/%s:cancel", id);
  assert_int_equal(call(beta_token, "POST", path, NULL, &doc), 404);
  json_decref(doc);
  /* Nor in beta's list. */
  assert_int_equal(call(beta_token, "GET", "/v1/jobs?page_size=1000", NULL, &doc), 200);
  json_t *jobs = json_object_get(doc, "jobs");
  for (size_t i = 0; i < json_array_size(jobs); i++) {
    assert_string_not_equal(json_string_value(json_object_get(json_array_get(jobs, i), "id")), id);
    assert_string_equal(json_string_value(json_object_get(json_array_get(jobs, i), "tenant")),
                        "beta");
  }
  json_decref(doc);
}

/* Walks every page of /v1/jobs with the query; checks each of want ids comes exactly once. */
static void walk_pages(const char *query, char ids[][64], int n, int ascending) {
  int *seen = calloc((size_t)n, sizeof *seen);
  char token[128] = "";
  int total = 0, pages = 0;
  int64_t last_index = -1;
  do {
    char path[512];
    snprintf(path, sizeof path, "/v1/jobs?page_size=7&%s%s%s", query,
             token[0] ? "&page_token=" : "", token);
    json_t *doc;
    assert_int_equal(call(pager_token, "GET", path, NULL, &doc), 200);
    json_t *jobs = json_object_get(doc, "jobs");
    assert_true(json_array_size(jobs) <= 7);
    for (size_t i = 0; i < json_array_size(jobs); i++) {
      const char *id = json_string_value(json_object_get(json_array_get(jobs, i), "id"));
      int found = -1;
      for (int k = 0; k < n; k++) {
        if (!strcmp(ids[k], id)) found = k;
      }
      if (found < 0) fail_msg("page has job %s that pager did not make", id);
      seen[found]++;
      /* Creation order, newest first unless ascending. */
      if (last_index >= 0) assert_true(ascending ? found > last_index : found < last_index);
      last_index = found;
      total++;
    }
    snprintf(token, sizeof token, "%s", json_string_value(json_object_get(doc, "next_page_token")));
    json_decref(doc);
    pages++;
  } while (token[0]);
  for (int k = 0; k < n; k++) {
    if (seen[k] != 1) fail_msg("job %d (%s) seen %d times", k, ids[k], seen[k]);
  }
  assert_int_equal(total, n);
  assert_int_equal(pages, (n + 6) / 7);
  free(seen);
}

static void pagination_over_250_jobs_returns_each_exactly_once(void **state) {
  (void)state;
  enum { N = 250 };
  static char ids[N][64];
  for (int i = 0; i < N; i++) create(pager_token, "quick-page", 50, ids[i]);
  walk_pages("order_by=create_time%20desc", ids, N, 0);
  walk_pages("order_by=create_time", ids, N, 1);
  /* A token from one order is refused by the other. */
  json_t *doc;
  assert_int_equal(
      call(pager_token, "GET", "/v1/jobs?page_size=3&order_by=create_time", NULL, &doc), 200);
  char path[256];
  snprintf(path, sizeof path, "/v1/jobs?page_size=3&page_token=%s",
           json_string_value(json_object_get(doc, "next_page_token")));
  json_decref(doc);
  assert_int_equal(call(pager_token, "GET", path, NULL, &doc), 400);
  assert_error(doc, 400, "INVALID_ARGUMENT", "page_token");
  json_decref(doc);
  /* Let the queue drain before the next tests. */
  json_decref(wait_job(pager_token, ids[N - 1]));
  assert_int_equal(
      call(pager_token, "GET", "/v1/jobs?filter=state%3DSUCCEEDED&page_size=1000", NULL, &doc),
      200);
  assert_int_equal(json_array_size(json_object_get(doc, "jobs")), N);
  json_decref(doc);
}

static void cancel_explain_delete_and_priority_order(void **state) {
  (void)state;
  char sleeper[64], low[64], high[64], mid[64], path[200];
  /* A user's priority above 50 needs its tenant's ceiling raised by an admin. */
  assert_int_equal(
      call(admin_token, "PUT", "/v1/tenants/acme/quota", "{\"max_priority\":90}", NULL), 200);
  create(acme_token, "sleeper-1", 50, sleeper);
  wait_state(acme_token, sleeper, "RUNNING");
  create(acme_token, "quick-low", 10, low);
  create(acme_token, "quick-high", 90, high);
  create(acme_token, "quick-mid", 50, mid);
  /* Explain names the job in the way and the jobs ahead, once a pass has
   * seen them (with every device busy, the next poll's: within a second). */
  json_t *doc;
  char *text = NULL;
  snprintf(path, sizeof path, "/v1/jobs/%s:explain", low);
  for (int i = 0; i < 250; i++) {
    free(text);
    assert_int_equal(call(acme_token, "GET", path, NULL, &doc), 200);
    assert_string_equal(json_string_value(json_object_get(doc, "state")), "QUEUED");
    text = json_dumps(doc, 0);
    json_decref(doc);
    if (!strstr(text, "NOT_YET_PLACED")) break;
    usleep(20 * 1000);
  }
  assert_non_null(strstr(text, "JOBS_AHEAD"));
  assert_non_null(strstr(text, "2 queued job(s)"));
  assert_non_null(strstr(text, "BEHIND_HIGHER_PRIORITY"));
  assert_non_null(strstr(text, high)); /* first in line, holding the device's reservation */
  free(text);
  text = NULL;
  snprintf(path, sizeof path, "/v1/jobs/%s:explain", high);
  assert_int_equal(call(acme_token, "GET", path, NULL, &doc), 200);
  text = json_dumps(doc, 0);
  assert_non_null(strstr(text, "WAITING_FOR_DEVICES"));
  assert_non_null(strstr(text, "needs 1 cpu devices at once, 0 of 1 are free"));
  free(text);
  json_decref(doc);
  /* The inventory shows the slot the sleeper holds. */
  assert_int_equal(call(acme_token, "GET", "/v1/devices", NULL, &doc), 200);
  json_t *dev0 = json_array_get(json_object_get(doc, "devices"), 0);
  assert_true(json_is_true(json_object_get(dev0, "busy")));
  assert_string_equal(json_string_value(json_object_get(dev0, "job")), sleeper);
  json_decref(doc);
  assert_int_equal(call(acme_token, "GET", "/v1/pools", NULL, &doc), 200);
  json_t *pool = json_array_get(json_object_get(doc, "pools"), 0);
  assert_string_equal(json_string_value(json_object_get(pool, "id")), "default");
  assert_int_equal(json_integer_value(json_object_get(pool, "devices_busy")), 1);
  assert_true(json_integer_value(json_object_get(pool, "devices")) >= 1);
  json_decref(doc);
  /* A running job cannot be deleted; cancel stops it. */
  snprintf(path, sizeof path, "/v1/jobs/%s", sleeper);
  assert_int_equal(call(acme_token, "DELETE", path, NULL, &doc), 409);
  assert_error(doc, 409, "FAILED_PRECONDITION", "state");
  json_decref(doc);
  snprintf(path, sizeof path, "/v1/jobs/%s:cancel", sleeper);
  assert_int_equal(call(acme_token, "POST", path, NULL, &doc), 200);
  json_decref(doc);
  doc = wait_job(acme_token, sleeper);
  assert_string_equal(json_string_value(json_object_get(doc, "state")), "CANCELLED");
  json_decref(doc);
  /* Then the queue runs by priority: high, mid, low. */
  json_t *h = wait_job(acme_token, high), *m = wait_job(acme_token, mid),
         *l = wait_job(acme_token, low);
  const char *th = json_string_value(json_object_get(h, "start_time"));
  const char *tm = json_string_value(json_object_get(m, "start_time"));
  const char *tl = json_string_value(json_object_get(l, "start_time"));
  assert_true(strcmp(th, tm) <= 0 && strcmp(tm, tl) <= 0);
  json_decref(h);
  json_decref(m);
  json_decref(l);
  snprintf(path, sizeof path, "/v1/jobs/%s/events", high);
  assert_int_equal(call(acme_token, "GET", path, NULL, &doc), 200);
  json_decref(doc);
  /* A queued job is cancelled at once and never starts. */
  char blocker[64], queued[64];
  create(acme_token, "sleeper-2", 50, blocker);
  wait_state(acme_token, blocker, "RUNNING");
  create(acme_token, "quick-never", 50, queued);
  snprintf(path, sizeof path, "/v1/jobs/%s:cancel", queued);
  assert_int_equal(call(acme_token, "POST", path, NULL, &doc), 200);
  assert_string_equal(json_string_value(json_object_get(doc, "state")), "CANCELLED");
  assert_int_equal(json_integer_value(json_object_get(doc, "attempt")), 0);
  json_decref(doc);
  snprintf(path, sizeof path, "/v1/jobs/%s:cancel", blocker);
  assert_int_equal(call(acme_token, "POST", path, NULL, &doc), 200);
  json_decref(doc);
  json_decref(wait_job(acme_token, blocker));
  /* Delete a finished job: gone, with its events. */
  snprintf(path, sizeof path, "/v1/jobs/%s", queued);
  assert_int_equal(call(acme_token, "DELETE", path, NULL, &doc), 200);
  json_decref(doc);
  assert_int_equal(call(acme_token, "GET", path, NULL, &doc), 404);
  json_decref(doc);
}

/* Reads a whole SSE stream; fills ids (seq) and steps of metric events, returns the count. */
static int read_stream(const char *id, const char *last_event_id, int64_t *ids, int64_t *steps,
                       int max, char *end_state) {
  char path[200], header[80];
  snprintf(path, sizeof path, "/v1/jobs/%s/metrics:watch", id);
  snprintf(header, sizeof header, "Last-Event-ID: %s", last_event_id ? last_event_id : "");
  char auth[200];
  snprintf(auth, sizeof auth, "Bearer %s", acme_token);
  char *text = NULL;
  assert_int_equal(request("GET", path, NULL, 0, auth, last_event_id ? header : NULL, &text, NULL),
                   200);
  int n = 0;
  end_state[0] = '\0';
  for (char *ev = text; ev && *ev;) {
    char *next = strstr(ev, "\n\n");
    if (next) *next = '\0';
    long long seq = -1, step = -1;
    char *id_line = strstr(ev, "id: ");
    char *data = strstr(ev, "data: ");
    if (strstr(ev, "event: metric") && id_line && data) {
      seq = atoll(id_line + 4);
      json_t *d = json_loads(data + 6, 0, NULL);
      assert_non_null(d);
      step = json_integer_value(json_object_get(d, "step"));
      json_decref(d);
      assert_true(n < max);
      ids[n] = seq;
      steps[n] = step;
      n++;
    } else if (strstr(ev, "event: end") && data) {
      json_t *d = json_loads(data + 6, 0, NULL);
      snprintf(end_state, 16, "%s", json_string_value(json_object_get(d, "state")));
      json_decref(d);
    }
    ev = next ? next + 2 : NULL;
  }
  free(text);
  return n;
}

static void sse_resumed_with_last_event_id_misses_and_repeats_nothing(void **state) {
  (void)state;
  char id[64], end_state[16];
  create(acme_token, "emitter-1", 50, id);
  wait_state(acme_token, id, "RUNNING");
  /* Watch live from the start: the stream ends when the job does. */
  int64_t ids[64], steps[64];
  int n = read_stream(id, NULL, ids, steps, 64, end_state);
  assert_string_equal(end_state, "SUCCEEDED");
  assert_int_equal(n, 30);
  for (int i = 0; i < n; i++) {
    assert_int_equal(steps[i], i + 1);
    if (i) assert_true(ids[i] > ids[i - 1]);
  }
  /* Resume after the 12th event: exactly the 13th..30th, once each. */
  char last[32];
  snprintf(last, sizeof last, "%lld", (long long)ids[11]);
  int64_t ids2[64], steps2[64];
  int n2 = read_stream(id, last, ids2, steps2, 64, end_state);
  assert_int_equal(n2, 18);
  for (int i = 0; i < n2; i++) {
    assert_int_equal(ids2[i], ids[12 + i]);
    assert_int_equal(steps2[i], 13 + i);
  }
  /* The metrics list agrees, and max_points thins it evenly to first..last. */
  char path[200];
  snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=loss&max_points=4", id);
  json_t *doc;
  assert_int_equal(call(acme_token, "GET", path, NULL, &doc), 200);
  json_t *pts = json_object_get(doc, "metrics");
  assert_int_equal(json_array_size(pts), 4);
  int64_t want[] = {1, 10, 20, 30};
  for (int i = 0; i < 4; i++)
    assert_int_equal(json_integer_value(json_object_get(json_array_get(pts, (size_t)i), "step")),
                     want[i]);
  json_decref(doc);
  snprintf(path, sizeof path, "/v1/jobs/%s/metrics?start_step=5&end_step=7", id);
  assert_int_equal(call(acme_token, "GET", path, NULL, &doc), 200);
  assert_int_equal(json_array_size(json_object_get(doc, "metrics")), 3);
  json_decref(doc);
}

/* Every route of the router is in openapi.json and every documented route is served. */
static void openapi_and_router_agree(void **state) {
  (void)state;
  static const char *const expected[] = {
      "GET /healthz",
      "GET /readyz",
      "GET /metrics",
      "GET /v1/openapi.json",
      "POST /v1/jobs",
      "GET /v1/jobs",
      "GET /v1/jobs/{job}",
      "DELETE /v1/jobs/{job}",
      "POST /v1/jobs/{job}:cancel",
      "POST /v1/jobs/{job}:resume",
      "POST /v1/jobs/{job}:wait",
      "GET /v1/jobs/{job}:explain",
      "GET /v1/jobs/{job}/metrics",
      "GET /v1/jobs/{job}/metrics:watch",
      "GET /v1/jobs/{job}/events",
      "GET /v1/jobs/{job}/logs",
      "GET /v1/jobs/{job}/profile",
      "GET /v1/jobs/{job}/checkpoints",
      "GET /v1/jobs/{job}/checkpoints/{checkpoint}",
      "GET /v1/jobs/{job}/checkpoints/{checkpoint}:download",
      "GET /v1/jobs/{job}/checkpoints/{checkpoint}:export",
      "POST /v1/jobs/{job}/checkpoints/{checkpoint}:pin",
      "POST /v1/jobs/{job}/checkpoints/{checkpoint}:unpin",
      "POST /v1/experiments",
      "GET /v1/experiments",
      "GET /v1/experiments/{experiment}",
      "POST /v1/experiments/{experiment}:cancel",
      "GET /v1/experiments/{experiment}:best",
      "GET /v1/experiments/{experiment}/trials",
      "GET /v1/experiments/{experiment}/events",
      "POST /v1/datasets",
      "POST /v1/datasets:register",
      "GET /v1/datasets",
      "GET /v1/datasets/{dataset}",
      "DELETE /v1/datasets/{dataset}",
      "GET /v1/devices",
      "GET /v1/pools",
      "POST /v1/tokens",
      "GET /v1/tokens",
      "DELETE /v1/tokens/{token}",
      "GET /v1/tenants/{tenant}/quota",
      "PUT /v1/tenants/{tenant}/quota",
      "POST /v1/agents",
      "GET /v1/agents",
      "GET /v1/agents/{agent}",
      "GET /v1/agents/{agent}/commands",
      "POST /v1/agents/{agent}/commands/{seq}:done",
      "POST /v1/allocations/{alloc}/progress",
      "PUT /v1/allocations/{alloc}/checkpoints/{step}",
      "GET /v1/allocations/{alloc}/resume",
      "GET /v1/allocations/{alloc}/dataset",
      "HEAD /v1/allocations/{alloc}/dataset",
      "POST /v1/allocations/{alloc}/exit",
      "POST /v1/allocations/{alloc}/relay",
      "GET /v1/allocations/{alloc}/relay/{relay}:wait",
  };
  size_t n_expected = sizeof expected / sizeof expected[0];
  json_t *doc;
  assert_int_equal(request("GET", "/v1/openapi.json", NULL, 0, NULL, NULL, NULL, &doc), 200);
  assert_string_equal(json_string_value(json_object_get(doc, "openapi")), "3.0.3");
  json_t *paths = json_object_get(doc, "paths");
  size_t documented = 0;
  const char *path;
  json_t *item;
  json_object_foreach(paths, path, item) {
    const char *method;
    json_t *op;
    json_object_foreach(item, method, op) {
      char key[256], upper[16];
      size_t k = 0;
      for (; method[k] && k < sizeof upper - 1; k++) upper[k] = (char)(method[k] & ~0x20);
      upper[k] = '\0';
      snprintf(key, sizeof key, "%s %s", upper, path);
      int known = 0;
      for (size_t e = 0; e < n_expected; e++) known |= !strcmp(expected[e], key);
      if (!known) fail_msg("openapi.json documents %s, which this test does not know", key);
      documented++;
      /* Served: an unknown job answers 404 for the *job*, never "no route" or 405. */
      char concrete[256], *out = concrete;
      for (const char *p = path; *p;) {
        if (*p == '{') {
          const char *close = strchr(p, '}');
          out += sprintf(out, "%s", strncmp(p, "{job}", 5) == 0 ? "nosuchjob" : "1");
          p = close + 1;
        } else {
          *out++ = *p++;
        }
      }
      *out = '\0';
      char auth[200];
      snprintf(auth, sizeof auth, "Bearer %s", admin_token);
      json_t *answer = NULL;
      long status = request(upper, concrete, "{}", 2, auth, NULL, NULL, &answer);
      assert_true(status != 405);
      if (status == 404) {
        json_t *d = json_array_get(json_object_get(json_object_get(answer, "error"), "details"), 0);
        assert_string_not_equal(json_string_value(json_object_get(d, "field")), "path");
      }
      json_decref(answer);
    }
  }
  assert_int_equal(documented, n_expected);
  json_decref(doc);
}

static void metrics_and_readyz_report_the_service(void **state) {
  (void)state;
  char *text = NULL, auth[200];
  snprintf(auth, sizeof auth, "Bearer %s", admin_token);
  assert_int_equal(request("GET", "/metrics", NULL, 0, auth, NULL, &text, NULL), 200);
  assert_non_null(strstr(text, "kiln_jobs{state=\"SUCCEEDED\"} "));
  assert_non_null(strstr(text, "kiln_queue_depth 0\n"));
  assert_non_null(strstr(text, "kiln_http_requests_total{code=\"200\"} "));
  assert_non_null(strstr(text, "kiln_http_requests_total{code=\"401\"} "));
  assert_non_null(strstr(text, "kiln_http_request_duration_seconds_bucket{le=\"+Inf\"} "));
  /* 250 + a few quick jobs, one point each, plus the emitter's 30. */
  char *ingested = strstr(text, "\nkiln_metric_points_ingested_total ");
  assert_non_null(ingested);
  long long points = atoll(ingested + strlen("\nkiln_metric_points_ingested_total "));
  print_message("ingested %lld\n", points);
  assert_true(points >= 250 + 30);
  free(text);
  assert_int_equal(request("GET", "/readyz", NULL, 0, NULL, NULL, NULL, NULL), 200);
}

/* How many (job, attempt, step, name) keys appear more than once, and the
 * steps of one attempt of a job, from the database itself. */
static int64_t db_int(const char *sql, const char *bind) {
  char db_path[300];
  snprintf(db_path, sizeof db_path, "%s/kiln.db", data_dir);
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  sqlite3_stmt *st = NULL;
  assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
  if (bind) sqlite3_bind_text(st, 1, bind, -1, SQLITE_STATIC);
  assert_int_equal(sqlite3_step(st), SQLITE_ROW);
  int64_t v = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

/* :resume of a cancelled job: cancel checkpoints the step in flight, and
 * the resumed attempt continues from the step after it. */
static void cancelled_job_resumes_from_the_checkpoint_its_stop_wrote(void **state) {
  (void)state;
  char id[64], path[160];
  create(acme_token, "emitter-slow-resume", 50, id);
  wait_state(acme_token, id, "RUNNING");
  for (int i = 0; i < 200; i++) {
    if (db_int("SELECT count(*) FROM metrics WHERE job_id = ?1", id) >= 7) break;
    usleep(50 * 1000);
  }
  json_t *doc;
  snprintf(path, sizeof path, "/v1/jobs/%s:resume", id);
  assert_int_equal(call(acme_token, "POST", path, NULL, &doc), 409); /* still running */
  assert_error(doc, 409, "FAILED_PRECONDITION", "state");
  json_decref(doc);
  snprintf(path, sizeof path, "/v1/jobs/%s:cancel", id);
  assert_int_equal(call(acme_token, "POST", path, NULL, &doc), 200);
  json_decref(doc);
  doc = wait_job(acme_token, id);
  assert_string_equal(json_string_value(json_object_get(doc, "state")), "CANCELLED");
  json_decref(doc);
  int64_t last = db_int("SELECT max(step) FROM metrics WHERE job_id = ?1 AND attempt = 1", id);
  int64_t ckpt = db_int("SELECT max(step) FROM checkpoints WHERE job_id = ?1", id);
  assert_true(last >= 7 && last < 30);
  assert_int_equal(ckpt, last); /* the stop's own checkpoint: no step is lost */

  snprintf(path, sizeof path, "/v1/jobs/%s:resume", id);
  assert_int_equal(call(acme_token, "POST", path, NULL, &doc), 200);
  /* Queued again; the scheduler may have claimed it by the time we read it. */
  const char *now = json_string_value(json_object_get(doc, "state"));
  assert_true(!strcmp(now, "QUEUED") || !strcmp(now, "STARTING") || !strcmp(now, "RUNNING"));
  json_decref(doc);
  doc = wait_job(acme_token, id);
  assert_string_equal(json_string_value(json_object_get(doc, "state")), "SUCCEEDED");
  assert_int_equal(json_integer_value(json_object_get(doc, "attempt")), 2);
  json_decref(doc);
  snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
  assert_int_equal(call(acme_token, "GET", path, NULL, &doc), 200);
  char *text = json_dumps(doc, 0), want[96];
  assert_non_null(strstr(text, "RESUME_REQUESTED"));
  snprintf(want, sizeof want, "resuming from step %lld", (long long)ckpt);
  assert_non_null(strstr(text, want));
  free(text);
  json_decref(doc);
  assert_int_equal(db_int("SELECT min(step) FROM metrics WHERE job_id = ?1 AND attempt = 2", id),
                   ckpt + 1);
  assert_int_equal(db_int("SELECT count(DISTINCT step) FROM metrics WHERE job_id = ?1", id), 30);
  assert_int_equal(db_int("SELECT count(*) FROM (SELECT 1 FROM metrics WHERE job_id = ?1 GROUP BY"
                          " attempt, step, name HAVING count(*) > 1)",
                          id),
                   0);
}

static void sigkill_of_kilnd_requeues_the_running_job_and_it_resumes(void **state) {
  (void)state;
  char id[64];
  create(acme_token, "emitter-slow", 50, id);
  wait_state(acme_token, id, "RUNNING");
  /* Let a checkpoint and some points after it reach the store, then crash
   * the server under the job. */
  for (int i = 0; i < 200; i++) {
    if (db_int("SELECT count(*) FROM checkpoints WHERE job_id = ?1", id) >= 1 &&
        db_int("SELECT count(*) FROM metrics WHERE job_id = ?1", id) >= 7)
      break;
    usleep(50 * 1000);
  }
  kill(kilnd_pid, SIGKILL);
  waitpid(kilnd_pid, NULL, 0);
  kilnd_pid = 0;
  int64_t before = db_int("SELECT count(*) FROM metrics WHERE job_id = ?1 AND attempt = 1", id);
  int64_t ckpt = db_int("SELECT max(step) FROM checkpoints WHERE job_id = ?1", id);
  assert_true(before >= 5 && before < 30);
  assert_true(ckpt >= 5 && ckpt % 5 == 0 && ckpt <= before);
  assert_int_equal(launch_kilnd(), 0);
  json_t *doc = wait_job(acme_token, id);
  assert_string_equal(json_string_value(json_object_get(doc, "state")), "SUCCEEDED");
  assert_int_equal(json_integer_value(json_object_get(doc, "attempt")), 2);
  json_decref(doc);
  char path[160];
  snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
  assert_int_equal(call(acme_token, "GET", path, NULL, &doc), 200);
  char *text = json_dumps(doc, 0);
  assert_non_null(strstr(text, "SERVER_RESTARTED"));
  char resumed[64];
  snprintf(resumed, sizeof resumed, "attempt 2), resuming from step %lld", (long long)ckpt);
  assert_non_null(strstr(text, resumed));
  free(text);
  json_decref(doc);
  /* Nothing duplicated; attempt 1 kept every point it flushed (steps 1..k,
   * no gaps); attempt 2 starts right after the checkpoint and runs to 30,
   * so every step is in the store and none before the checkpoint twice. */
  assert_int_equal(db_int("SELECT count(*) FROM (SELECT 1 FROM metrics GROUP BY job_id, attempt,"
                          " step, name HAVING count(*) > 1)",
                          NULL),
                   0);
  assert_int_equal(db_int("SELECT count(*) FROM metrics WHERE job_id = ?1 AND attempt = 1", id),
                   before);
  assert_int_equal(
      db_int("SELECT max(step) - min(step) + 1 FROM metrics WHERE job_id = ?1 AND attempt = 1", id),
      before);
  assert_int_equal(db_int("SELECT min(step) FROM metrics WHERE job_id = ?1 AND attempt = 2", id),
                   ckpt + 1);
  assert_int_equal(
      db_int("SELECT count(DISTINCT step) FROM metrics WHERE job_id = ?1 AND attempt = 2", id),
      30 - ckpt);
  assert_int_equal(db_int("SELECT count(DISTINCT step) FROM metrics WHERE job_id = ?1", id), 30);
}

/* A checkpoint pinned while the job runs outlives keep_last: the job with
 * keep_last 1 ends with its pinned checkpoint and its final one. */
static void a_pinned_checkpoint_outlives_keep_last(void **state) {
  (void)state;
  json_t *spec = json_loads(small_spec, 0, NULL);
  json_object_set_new(spec, "display_name", json_string("emitter-slow-pin"));
  json_object_set_new(spec, "checkpoint", json_pack("{s:i}", "keep_last", 1));
  char *body = json_dumps(spec, JSON_COMPACT), id[64], path[200];
  json_decref(spec);
  json_t *doc;
  assert_int_equal(call(acme_token, "POST", "/v1/jobs", body, &doc), 200);
  free(body);
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(doc, "id")));
  json_decref(doc);

  /* Pin the newest checkpoint there is; retention may remove it between
   * the list and the pin (a 404), so try the next one then. */
  json_int_t pinned = 0, pinned_step = 0;
  for (int i = 0; i < 400 && !pinned; i++) {
    snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", id);
    assert_int_equal(call(acme_token, "GET", path, NULL, &doc), 200);
    json_t *list = json_object_get(doc, "checkpoints");
    json_t *newest = json_array_get(list, json_array_size(list) - 1);
    if (newest) {
      assert_true(json_is_false(json_object_get(newest, "pinned")));
      json_int_t cid = json_integer_value(json_object_get(newest, "id"));
      json_int_t step = json_integer_value(json_object_get(newest, "step"));
      json_t *answer;
      snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints/%lld:pin", id, (long long)cid);
      /* Another tenant cannot pin it: the job does not exist for beta. */
      assert_int_equal(call(beta_token, "POST", path, NULL, &answer), 404);
      assert_error(answer, 404, "NOT_FOUND", "job");
      json_decref(answer);
      long status = call(acme_token, "POST", path, NULL, &answer);
      if (status == 200) {
        assert_true(json_is_true(json_object_get(answer, "pinned")));
        assert_int_equal(json_integer_value(json_object_get(answer, "id")), cid);
        pinned = cid;
        pinned_step = step;
      } else {
        assert_int_equal(status, 404);
      }
      json_decref(answer);
    }
    json_decref(doc);
    if (!pinned) usleep(25 * 1000);
  }
  assert_true(pinned > 0);
  assert_true(pinned_step < 30); /* pinned while the job still ran */
  doc = wait_job(acme_token, id);
  assert_string_equal(json_string_value(json_object_get(doc, "state")), "SUCCEEDED");
  json_decref(doc);

  snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", id);
  assert_int_equal(call(acme_token, "GET", path, NULL, &doc), 200);
  json_t *list = json_object_get(doc, "checkpoints");
  assert_int_equal(json_array_size(list), 2);
  json_t *first = json_array_get(list, 0), *last = json_array_get(list, 1);
  assert_int_equal(json_integer_value(json_object_get(first, "id")), pinned);
  assert_true(json_is_true(json_object_get(first, "pinned")));
  assert_int_equal(json_integer_value(json_object_get(last, "step")), 30);
  assert_true(json_is_false(json_object_get(last, "pinned")));
  json_decref(doc);
  /* Its file is still there to download: it holds its step. */
  char *text = NULL, auth[200];
  snprintf(auth, sizeof auth, "Bearer %s", acme_token);
  snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints/%lld:download", id, (long long)pinned);
  assert_int_equal(request("GET", path, NULL, 0, auth, NULL, &text, NULL), 200);
  assert_int_equal(atoll(text), pinned_step);
  free(text);

  snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints/%lld:unpin", id, (long long)pinned);
  assert_int_equal(call(acme_token, "POST", path, NULL, &doc), 200);
  assert_true(json_is_false(json_object_get(doc, "pinned")));
  json_decref(doc);
  snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints/%lld", id, (long long)pinned);
  assert_int_equal(call(acme_token, "GET", path, NULL, &doc), 200);
  assert_true(json_is_false(json_object_get(doc, "pinned")));
  json_decref(doc);
  snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints/999999:pin", id);
  assert_int_equal(call(acme_token, "POST", path, NULL, &doc), 404);
  assert_error(doc, 404, "NOT_FOUND", "checkpoint");
  json_decref(doc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(tokens_are_made_per_tenant_and_checked),
      cmocka_unit_test(same_request_id_twice_makes_one_job),
      cmocka_unit_test(a_tenant_cannot_see_another_tenants_job),
      cmocka_unit_test(pagination_over_250_jobs_returns_each_exactly_once),
      cmocka_unit_test(cancel_explain_delete_and_priority_order),
      cmocka_unit_test(sse_resumed_with_last_event_id_misses_and_repeats_nothing),
      cmocka_unit_test(openapi_and_router_agree),
      cmocka_unit_test(metrics_and_readyz_report_the_service),
      cmocka_unit_test(cancelled_job_resumes_from_the_checkpoint_its_stop_wrote),
      cmocka_unit_test(sigkill_of_kilnd_requeues_the_running_job_and_it_resumes),
      cmocka_unit_test(a_pinned_checkpoint_outlives_keep_last),
  };
  return cmocka_run_group_tests(tests, start_kilnd, stop_kilnd);
}
