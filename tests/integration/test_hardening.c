/* test_hardening.c — issue #19's findings on the API's surface, against a
 * real kilnd with a stand-in trainer and two tenants: the token API (list,
 * revoke at once, create), `kilnd token create` on a fresh folder, list
 * details (page_size clamped, page tokens bound to their filter), the
 * validate_only and :cancel answers, no server path in any answer, log
 * lines a display_name cannot forge, owner-only files, /metrics behind a
 * token (or public), and --insecure-no-auth refusing cross-site and
 * rebound requests. */
/* nftw() is an X/Open function. */
#define _XOPEN_SOURCE 700
#include <curl/curl.h>
#include <ftw.h>
#include <jansson.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static char work[256];     /* the test's own files: trainer, pools */
static char data_dir[300]; /* kilnd's */
static char base_url[64];
static pid_t kilnd_pid;
static char admin_token[128], acme_token[128], beta_token[128];
static char *small_spec;

#define SHA_ZEROS "0000000000000000000000000000000000000000000000000000000000000000"

/* "sleeper*" runs until signalled, "crasher*" exits 3, "echo*" reports a
 * status line carrying its display_name (as kiln-train's "training NAME on
 * DATA" does) and writes one checkpoint; every other job reports a point. */
static const char trainer_script[] =
    "#!/bin/sh\n"
    "spec=\"$2\"; ckdir=''; prev=''\n"
    "for a in \"$@\"; do\n"
    "  [ \"$prev\" = --checkpoint-dir ] && ckdir=\"$a\"\n"
    "  prev=\"$a\"\n"
    "done\n"
    "if grep -q '\"display_name\":\"sleeper' \"$spec\"; then exec sleep 600; fi\n"
    "if grep -q '\"display_name\":\"crasher' \"$spec\"; then echo boom >&2; exit 3; fi\n"
    "if grep -q '\"display_name\":\"echo' \"$spec\"; then\n"
    "  name=$(sed -n 's/.*\"display_name\":\"\\([^\"]*\\)\".*/\\1/p' \"$spec\")\n"
    "  printf '%s\\n' \"{\\\"status\\\":{\\\"phase\\\":\\\"training\\\",\\\"message\\\":"
    "\\\"training $name\\\"}}\" >&3\n"
    "  f=\"$ckdir/ckpt-1.safetensors\"; echo 1 > \"$f\"\n"
    "  echo \"{\\\"checkpoint\\\":{\\\"step\\\":1,\\\"path\\\":\\\"$f\\\",\\\"bytes\\\":2,"
    "\\\"sha256\\\":\\\"" SHA_ZEROS "\\\"}}\" >&3\n"
    "fi\n"
    "echo '{\"step\":1,\"epoch\":1,\"metrics\":{\"loss\":1}}' >&3\n";

/* ---- HTTP ---- */

static long call_as(const char *authorization, const char *extra_header, const char *method,
                    const char *path, const char *body, char **text, json_t **out) {
  char *data = NULL;
  long status = it_request_as(base_url, authorization, extra_header, method, path, body,
                              body ? strlen(body) : 0, 60, &data);
  if (status == 0) fail_msg("%s %s: %s", method, path, data ? data : "no answer");
  if (out) *out = data ? json_loads(data, 0, NULL) : NULL;
  if (text)
    *text = data ? data : strdup("");
  else
    free(data);
  return status;
}

static long call(const char *token, const char *method, const char *path, const char *body,
                 json_t **out) {
  char auth[200] = "";
  if (token) snprintf(auth, sizeof auth, "Bearer %s", token);
  return call_as(token ? auth : NULL, NULL, method, path, body, NULL, out);
}

/* The answer's text, for checks on what it must not contain. */
static long call_text(const char *token, const char *method, const char *path, char **text) {
  char auth[200];
  snprintf(auth, sizeof auth, "Bearer %s", token);
  return call_as(auth, NULL, method, path, NULL, text, NULL);
}

static void assert_error(json_t *doc, long code, const char *status, const char *field) {
  assert_non_null(doc);
  json_t *e = json_object_get(doc, "error");
  assert_non_null(e);
  assert_int_equal(json_integer_value(json_object_get(e, "code")), code);
  assert_string_equal(json_string_value(json_object_get(e, "status")), status);
  json_t *d = json_array_get(json_object_get(e, "details"), 0);
  if (field && (!d || strcmp(json_string_value(json_object_get(d, "field")), field) != 0))
    fail_msg("expected detail field %s, got %s", field,
             d ? json_string_value(json_object_get(d, "field")) : "(none)");
}

static char *spec_named(const char *name) {
  json_t *spec = json_loads(small_spec, 0, NULL);
  json_object_set_new(spec, "display_name", json_string(name));
  char *text = json_dumps(spec, JSON_COMPACT);
  json_decref(spec);
  return text;
}

static void create(const char *token, const char *name, char *id) {
  char *body = spec_named(name);
  json_t *doc;
  long status = call(token, "POST", "/v1/jobs", body, &doc);
  free(body);
  if (status != 200) fail_msg("create %s: HTTP %ld", name, status);
  snprintf(id, 64, "%s", json_string_value(json_object_get(doc, "id")));
  json_decref(doc);
}

static json_t *wait_state(const char *token, const char *id, const char *state) {
  char path[160];
  snprintf(path, sizeof path, "/v1/jobs/%s", id);
  for (int i = 0; i < 400; i++) {
    json_t *doc;
    assert_int_equal(call(token, "GET", path, NULL, &doc), 200);
    if (!strcmp(json_string_value(json_object_get(doc, "state")), state)) return doc;
    json_decref(doc);
    usleep(50 * 1000);
  }
  fail_msg("job %s never reached %s", id, state);
  return NULL;
}

/* ---- kilnd ---- */

static int launch(void) {
  char trainer[300], pools[300];
  snprintf(trainer, sizeof trainer, "%s/trainer.sh", work);
  snprintf(pools, sizeof pools, "%s/pools.json", work);
  return it_launch_kilnd(KILND_PATH, data_dir, trainer, "--pools", pools, &kilnd_pid, base_url,
                         sizeof base_url, admin_token, sizeof admin_token);
}

static int start(void **state) {
  (void)state;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  snprintf(work, sizeof work, "/tmp/kiln-hardening-XXXXXX");
  if (!mkdtemp(work)) return -1;
  snprintf(data_dir, sizeof data_dir, "%s/data", work);
  if (mkdir(data_dir, 0700) != 0) return -1;
  char path[400];
  snprintf(path, sizeof path, "%s/trainer.sh", work);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fputs(trainer_script, f);
  fclose(f);
  chmod(path, 0755);
  snprintf(path, sizeof path, "%s/pools.json", work);
  f = fopen(path, "w");
  if (!f) return -1;
  fputs("{\"pools\": [{\"name\": \"default\", \"devices\": [0, 1]}]}", f);
  fclose(f);
  FILE *ex = fopen(EXAMPLES_DIR "/fmnist-mlp.json", "rb");
  if (!ex) return -1;
  char buf[8192];
  size_t n = fread(buf, 1, sizeof buf - 1, ex);
  fclose(ex);
  buf[n] = '\0';
  small_spec = strdup(buf);
  if (launch() != 0) return -1;
  if (it_make_token(KILND_PATH, data_dir, "acme", acme_token, sizeof acme_token) != 0) return -1;
  return it_make_token(KILND_PATH, data_dir, "beta", beta_token, sizeof beta_token);
}

static int stop(void **state) {
  (void)state;
  int rc = it_stop_kilnd(kilnd_pid, work);
  free(small_spec);
  curl_global_cleanup();
  return rc;
}

/* ---- tokens ---- */

static void token_create_on_a_fresh_data_dir_makes_it(void **state) {
  (void)state;
  char out[512], cmd[1024], fresh[400];
  snprintf(fresh, sizeof fresh, "%s/fresh/nested", work);
  snprintf(cmd, sizeof cmd, "'%s' token create --tenant ops --data-dir '%s'", KILND_PATH, fresh);
  int rc = it_run(out, sizeof out, cmd);
  print_message("%s", out);
  assert_int_equal(rc, 0);
  assert_memory_equal(out, "kiln_", 5);
  struct stat sb;
  assert_int_equal(stat(fresh, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0700);
  char db[500];
  snprintf(db, sizeof db, "%s/kiln.db", fresh);
  assert_int_equal(stat(db, &sb), 0);
  assert_int_equal(sb.st_mode & 0077, 0);
}

static void make_token(const char *tenant, const char *role, char *secret, char *id) {
  char body[200];
  snprintf(body, sizeof body, "{\"tenant\":\"%s\",\"role\":\"%s\"}", tenant, role);
  json_t *doc;
  assert_int_equal(call(admin_token, "POST", "/v1/tokens", body, &doc), 200);
  const char *s = json_string_value(json_object_get(doc, "secret"));
  assert_non_null(s);
  assert_memory_equal(s, "kiln_", 5);
  snprintf(secret, 128, "%s", s);
  assert_string_equal(json_string_value(json_object_get(doc, "tenant")), tenant);
  assert_string_equal(json_string_value(json_object_get(doc, "role")), role);
  snprintf(id, 64, "%s", json_string_value(json_object_get(doc, "id")));
  assert_memory_equal(id, "tok-", 4);
  json_decref(doc);
}

/* The token in list whose id is id, or NULL. */
static json_t *find_token(json_t *list, const char *id) {
  size_t i;
  json_t *t;
  json_array_foreach(json_object_get(list, "tokens"), i, t) {
    if (!strcmp(json_string_value(json_object_get(t, "id")), id)) return t;
  }
  return NULL;
}

static void tokens_are_created_listed_and_revoked_at_once(void **state) {
  (void)state;
  char gamma[128], gamma_id[64];
  make_token("gamma", "user", gamma, gamma_id);
  json_t *doc;
  /* Only an admin makes tokens. */
  assert_int_equal(call(acme_token, "POST", "/v1/tokens", "{\"tenant\":\"acme\"}", &doc), 403);
  assert_error(doc, 403, "PERMISSION_DENIED", "role");
  json_decref(doc);
  assert_int_equal(call(admin_token, "POST", "/v1/tokens", "{\"tenant\":\"Bad Name\"}", &doc), 400);
  assert_error(doc, 400, "INVALID_ARGUMENT", "tenant");
  json_decref(doc);
  assert_int_equal(
      call(admin_token, "POST", "/v1/tokens", "{\"tenant\":\"acme\",\"role\":\"root\"}", &doc),
      400);
  assert_error(doc, 400, "INVALID_ARGUMENT", "role");
  json_decref(doc);
  assert_int_equal(
      call(admin_token, "POST", "/v1/tokens", "{\"tenant\":\"acme\",\"colour\":\"red\"}", &doc),
      400);
  assert_error(doc, 400, "INVALID_ARGUMENT", "colour");
  json_decref(doc);
  /* The admin sees every token, never a secret. */
  assert_int_equal(call(gamma, "GET", "/v1/jobs", NULL, NULL), 200);
  char *text = NULL;
  assert_int_equal(call_text(admin_token, "GET", "/v1/tokens", &text), 200);
  assert_null(strstr(text, "kiln_"));
  assert_null(strstr(text, "sha256"));
  doc = json_loads(text, 0, NULL);
  free(text);
  assert_true(json_array_size(json_object_get(doc, "tokens")) >= 4);
  json_t *t = find_token(doc, gamma_id);
  assert_non_null(t);
  assert_string_equal(json_string_value(json_object_get(t, "tenant")), "gamma");
  assert_string_equal(json_string_value(json_object_get(t, "role")), "user");
  assert_non_null(json_string_value(json_object_get(t, "create_time")));
  assert_non_null(json_string_value(json_object_get(t, "last_use_time")));
  char name[96];
  snprintf(name, sizeof name, "tokens/%s", gamma_id);
  assert_string_equal(json_string_value(json_object_get(t, "name")), name);
  json_decref(doc);
  /* A user sees its own tenant's tokens only. */
  assert_int_equal(call(acme_token, "GET", "/v1/tokens", NULL, &doc), 200);
  size_t i;
  json_array_foreach(json_object_get(doc, "tokens"), i, t) {
    assert_string_equal(json_string_value(json_object_get(t, "tenant")), "acme");
  }
  assert_true(i >= 1);
  json_decref(doc);
  /* Another tenant's token is as absent as a missing one. */
  char path[128];
  snprintf(path, sizeof path, "/v1/tokens/%s", gamma_id);
  assert_int_equal(call(acme_token, "DELETE", path, NULL, &doc), 404);
  assert_error(doc, 404, "NOT_FOUND", "token");
  json_decref(doc);
  assert_int_equal(call(acme_token, "DELETE", "/v1/tokens/tok-000000000000", NULL, &doc), 404);
  assert_error(doc, 404, "NOT_FOUND", "token");
  json_decref(doc);
  /* A user may not revoke its tenant's admin token. */
  char acme_admin[128], acme_admin_id[64];
  make_token("acme", "admin", acme_admin, acme_admin_id);
  snprintf(path, sizeof path, "/v1/tokens/%s", acme_admin_id);
  assert_int_equal(call(acme_token, "DELETE", path, NULL, &doc), 403);
  assert_error(doc, 403, "PERMISSION_DENIED", "role");
  json_decref(doc);
  assert_int_equal(call(acme_admin, "GET", "/v1/tokens", NULL, NULL), 200);
  assert_int_equal(call(admin_token, "DELETE", path, NULL, NULL), 200);
  /* Revoked: refused on the very next request, though it was just verified. */
  char spare[128], spare_id[64];
  make_token("acme", "user", spare, spare_id);
  assert_int_equal(call(spare, "GET", "/v1/jobs", NULL, NULL), 200);
  snprintf(path, sizeof path, "/v1/tokens/%s", spare_id);
  assert_int_equal(call(spare, "DELETE", path, NULL, &doc), 200);
  json_decref(doc);
  assert_int_equal(call(spare, "GET", "/v1/jobs", NULL, &doc), 401);
  assert_error(doc, 401, "UNAUTHENTICATED", "Authorization");
  json_decref(doc);
  assert_int_equal(call(admin_token, "GET", "/v1/tokens", NULL, &doc), 200);
  assert_null(find_token(doc, spare_id));
  assert_non_null(find_token(doc, gamma_id));
  json_decref(doc);
  /* The admin revokes any tenant's. */
  snprintf(path, sizeof path, "/v1/tokens/%s", gamma_id);
  assert_int_equal(call(admin_token, "DELETE", path, NULL, &doc), 200);
  json_decref(doc);
  assert_int_equal(call(gamma, "GET", "/v1/jobs", NULL, NULL), 401);
}

/* ---- list and job answers ---- */

static void list_details_follow_the_aips(void **state) {
  (void)state;
  char id[64];
  for (int i = 0; i < 3; i++) {
    create(acme_token, "quick", id);
    json_decref(wait_state(acme_token, id, "SUCCEEDED"));
  }
  json_t *doc;
  /* AIP-158: a page_size over the maximum is coerced, however large. */
  assert_int_equal(call(acme_token, "GET", "/v1/jobs?page_size=99999999999", NULL, &doc), 200);
  assert_int_equal(json_array_size(json_object_get(doc, "jobs")), 3);
  json_decref(doc);
  /* A page token holds only with the filter it was issued for. */
  assert_int_equal(
      call(acme_token, "GET", "/v1/jobs?page_size=1&filter=state%3DSUCCEEDED", NULL, &doc), 200);
  char next[256];
  snprintf(next, sizeof next, "%s", json_string_value(json_object_get(doc, "next_page_token")));
  json_decref(doc);
  assert_true(strlen(next) > 0);
  char path[512];
  snprintf(path, sizeof path, "/v1/jobs?page_size=1&filter=state%%3DSUCCEEDED&page_token=%s", next);
  assert_int_equal(call(acme_token, "GET", path, NULL, &doc), 200);
  assert_int_equal(json_array_size(json_object_get(doc, "jobs")), 1);
  json_decref(doc);
  snprintf(path, sizeof path, "/v1/jobs?page_size=1&filter=state%%3DQUEUED&page_token=%s", next);
  assert_int_equal(call(acme_token, "GET", path, NULL, &doc), 400);
  assert_error(doc, 400, "INVALID_ARGUMENT", "page_token");
  json_decref(doc);
  snprintf(path, sizeof path, "/v1/jobs?page_size=1&page_token=%s", next);
  assert_int_equal(call(acme_token, "GET", path, NULL, &doc), 400);
  assert_error(doc, 400, "INVALID_ARGUMENT", "page_token");
  json_decref(doc);
  /* Nor with another tenant. */
  snprintf(path, sizeof path, "/v1/jobs?page_size=1&filter=state%%3DSUCCEEDED&page_token=%s", next);
  assert_int_equal(call(beta_token, "GET", path, NULL, &doc), 400);
  assert_error(doc, 400, "INVALID_ARGUMENT", "page_token");
  json_decref(doc);
  /* validate_only names no job that does not exist. */
  char *body = spec_named("checked");
  char *text = NULL;
  char auth[200];
  snprintf(auth, sizeof auth, "Bearer %s", acme_token);
  assert_int_equal(call_as(auth, NULL, "POST", "/v1/jobs?validate_only=true", body, &text, NULL),
                   200);
  free(body);
  print_message("%.300s\n", text);
  assert_null(strstr(text, "\"jobs/\""));
  assert_null(strstr(text, "\"id\":\"\""));
  doc = json_loads(text, 0, NULL);
  free(text);
  assert_null(json_object_get(doc, "name"));
  assert_null(json_object_get(doc, "id"));
  assert_string_equal(json_string_value(json_object_get(doc, "display_name")), "checked");
  json_decref(doc);
}

static void cancel_of_a_running_job_answers_stopping(void **state) {
  (void)state;
  char id[64], path[128];
  create(acme_token, "sleeper", id);
  json_decref(wait_state(acme_token, id, "RUNNING"));
  snprintf(path, sizeof path, "/v1/jobs/%s:cancel", id);
  json_t *doc;
  assert_int_equal(call(acme_token, "POST", path, NULL, &doc), 200);
  assert_string_equal(json_string_value(json_object_get(doc, "state")), "STOPPING");
  json_decref(doc);
  json_decref(wait_state(acme_token, id, "CANCELLED"));
}

/* ---- what reaches a tenant ---- */

static void no_server_path_reaches_a_tenant(void **state) {
  (void)state;
  char id[64], path[160], *text = NULL;
  create(acme_token, "echo-paths", id);
  json_decref(wait_state(acme_token, id, "SUCCEEDED"));
  snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", id);
  assert_int_equal(call_text(acme_token, "GET", path, &text), 200);
  print_message("%.400s\n", text);
  json_t *doc = json_loads(text, 0, NULL);
  json_t *c = json_array_get(json_object_get(doc, "checkpoints"), 0);
  assert_non_null(c);
  assert_null(json_object_get(c, "path"));
  assert_null(strstr(text, data_dir));
  free(text);
  snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints/%lld", id,
           (long long)json_integer_value(json_object_get(c, "id")));
  json_decref(doc);
  assert_int_equal(call_text(acme_token, "GET", path, &text), 200);
  assert_null(strstr(text, data_dir));
  assert_null(strstr(text, "\"path\""));
  free(text);
  /* A failed job points at its log by the route that serves it. */
  create(acme_token, "crasher", id);
  json_decref(wait_state(acme_token, id, "FAILED"));
  snprintf(path, sizeof path, "/v1/jobs/%s", id);
  assert_int_equal(call_text(acme_token, "GET", path, &text), 200);
  print_message("%.600s\n", strstr(text, "\"message\""));
  assert_null(strstr(text, data_dir));
  char route[128];
  snprintf(route, sizeof route, "/v1/jobs/%s/logs", id);
  assert_non_null(strstr(text, route));
  free(text);
  snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
  assert_int_equal(call_text(acme_token, "GET", path, &text), 200);
  assert_null(strstr(text, data_dir));
  free(text);
  snprintf(path, sizeof path, "/v1/jobs/%s:explain", id);
  assert_int_equal(call_text(acme_token, "GET", path, &text), 200);
  assert_null(strstr(text, data_dir));
  free(text);
}

static int every_line_starts_with_time(const char *log_path, char *bad, size_t bad_len) {
  FILE *f = fopen(log_path, "r");
  if (!f) return -1;
  char line[4096];
  int ok = 1;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "time=", 5) != 0) {
      snprintf(bad, bad_len, "%s", line);
      ok = 0;
    }
  }
  fclose(f);
  return ok;
}

static void a_display_name_cannot_forge_a_log_line(void **state) {
  (void)state;
  char id[64];
  create(acme_token, "echo\nlevel=error msg=forged\r\x1b[2J", id);
  json_decref(wait_state(acme_token, id, "SUCCEEDED"));
  char log_path[400], bad[4096] = "";
  snprintf(log_path, sizeof log_path, "%s/kilnd.log", data_dir);
  int ok = every_line_starts_with_time(log_path, bad, sizeof bad);
  if (ok != 1) fail_msg("a line of kilnd's log was forged: %s", bad);
  /* The name is in the log, escaped. */
  char out[2048], cmd[600];
  snprintf(cmd, sizeof cmd, "grep -F 'training echo\\nlevel=error' '%s'", log_path);
  assert_int_equal(it_run(out, sizeof out, cmd), 0);
  print_message("%s", out);
  assert_non_null(strstr(out, "\\r\\x1b[2J"));
}

/* ---- files ---- */

static char loose[400]; /* the first path others may read or enter */

static int check_mode(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)flag;
  (void)ftw;
  /* kilnd.log is the harness's redirection of kilnd's stderr, not kilnd's file. */
  const char *base = strrchr(path, '/');
  if (base && strcmp(base, "/kilnd.log") == 0) return 0;
  if ((sb->st_mode & 0077) != 0 && !S_ISLNK(sb->st_mode) && !loose[0])
    snprintf(loose, sizeof loose, "%s (mode %o)", path, (unsigned)(sb->st_mode & 0777));
  return 0;
}

static void data_directory_is_owner_only(void **state) {
  (void)state;
  /* Jobs, checkpoints and uploads have been made by now. */
  loose[0] = '\0';
  assert_int_equal(nftw(data_dir, check_mode, 16, FTW_PHYS), 0);
  if (loose[0]) fail_msg("readable by others: %s", loose);
  struct stat sb;
  assert_int_equal(stat(data_dir, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0700);
  /* An older install's loose modes are tightened at start. */
  kill(kilnd_pid, SIGTERM);
  waitpid(kilnd_pid, NULL, 0);
  char path[500];
  chmod(data_dir, 0755);
  snprintf(path, sizeof path, "%s/kiln.db", data_dir);
  chmod(path, 0644);
  snprintf(path, sizeof path, "%s/jobs", data_dir);
  chmod(path, 0755);
  assert_int_equal(launch(), 0);
  loose[0] = '\0';
  assert_int_equal(nftw(data_dir, check_mode, 16, FTW_PHYS), 0);
  if (loose[0]) fail_msg("still readable by others after a restart: %s", loose);
}

/* ---- /metrics ---- */

static void metrics_need_an_admin_token_by_default(void **state) {
  (void)state;
  json_t *doc;
  assert_int_equal(call(NULL, "GET", "/metrics", NULL, &doc), 401);
  assert_error(doc, 401, "UNAUTHENTICATED", "Authorization");
  json_decref(doc);
  assert_int_equal(call(acme_token, "GET", "/metrics", NULL, &doc), 403);
  assert_error(doc, 403, "PERMISSION_DENIED", "role");
  json_decref(doc);
  char *text = NULL;
  assert_int_equal(call_text(admin_token, "GET", "/metrics", &text), 200);
  assert_non_null(strstr(text, "kiln_jobs{state=\"SUCCEEDED\"} "));
  free(text);
}

/* ---- --insecure-no-auth ---- */

/* A request with exactly these headers (NULL-terminated), no others that
 * curl would add by itself for a body. */
static long raw_request(const char *url_base, const char *method, const char *path,
                        const char *body, const char *const *headers, char **out) {
  CURL *c = curl_easy_init();
  char url[600];
  snprintf(url, sizeof url, "%s%s", url_base, path);
  it_buffer b = {0};
  struct curl_slist *list = curl_slist_append(NULL, "Expect:");
  list = curl_slist_append(list, "Content-Type:"); /* none unless headers give one */
  for (int i = 0; headers[i]; i++) list = curl_slist_append(list, headers[i]);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, it_on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
  if (body) curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
  long status = 0;
  if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(list);
  curl_easy_cleanup(c);
  *out = b.data ? b.data : strdup("");
  return status;
}

static int count_jobs_of(const char *url_base) {
  char *text = NULL;
  const char *none[] = {NULL};
  assert_int_equal(raw_request(url_base, "GET", "/v1/jobs", NULL, none, &text), 200);
  json_t *doc = json_loads(text, 0, NULL);
  free(text);
  int n = (int)json_array_size(json_object_get(doc, "jobs"));
  json_decref(doc);
  return n;
}

static void insecure_mode_refuses_cross_site_and_rebound_requests(void **state) {
  (void)state;
  char dir[400], port_file[500], cmd[2048], trainer[400], log[500];
  snprintf(dir, sizeof dir, "%s/insecure", work);
  snprintf(port_file, sizeof port_file, "%s/port", work);
  snprintf(trainer, sizeof trainer, "%s/trainer.sh", work);
  snprintf(log, sizeof log, "%s/insecure.log", work);
  snprintf(cmd, sizeof cmd,
           "exec '%s' --listen 127.0.0.1:0 --data-dir '%s' --port-file '%s' --trainer '%s' "
           "--insecure-no-auth --metrics-auth public",
           KILND_PATH, dir, port_file, trainer);
  pid_t pid = it_spawn(cmd, log);
  int port = 0;
  for (int i = 0; i < 200 && port == 0; i++) {
    FILE *f = fopen(port_file, "r");
    if (f) {
      if (fscanf(f, "%d", &port) != 1) port = 0;
      fclose(f);
    }
    if (port == 0) usleep(100 * 1000);
  }
  if (port == 0) {
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    char out[4096], show[600];
    snprintf(show, sizeof show, "cat '%s'", log);
    it_run(out, sizeof out, show);
    fail_msg("kilnd --insecure-no-auth did not start: %s", out);
  }
  char url[64], host[64], same_origin[96];
  snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
  snprintf(host, sizeof host, "Host: 127.0.0.1:%d", port);
  snprintf(same_origin, sizeof same_origin, "Origin: http://127.0.0.1:%d", port);
  char *spec = spec_named("quick");
  char *text = NULL;
  json_t *doc;
  /* The review's attack: a form-like text/plain POST from another site. */
  const char *cross_site[] = {"Content-Type: text/plain", "Origin: http://evil.example", NULL};
  assert_int_equal(raw_request(url, "POST", "/v1/jobs", spec, cross_site, &text), 403);
  doc = json_loads(text, 0, NULL);
  free(text);
  assert_error(doc, 403, "PERMISSION_DENIED", "Origin");
  json_decref(doc);
  /* text/plain without an Origin: not JSON, refused all the same. */
  const char *plain[] = {"Content-Type: text/plain", NULL};
  assert_int_equal(raw_request(url, "POST", "/v1/jobs", spec, plain, &text), 415);
  doc = json_loads(text, 0, NULL);
  free(text);
  assert_error(doc, 415, "INVALID_ARGUMENT", "Content-Type");
  json_decref(doc);
  /* A body with no Content-Type at all. */
  const char *untyped[] = {NULL};
  assert_int_equal(raw_request(url, "POST", "/v1/jobs", spec, untyped, &text), 415);
  free(text);
  /* DNS rebinding: a name that resolves to loopback, but is not loopback's. */
  const char *rebound[] = {"Host: evil.example", "Content-Type: application/json", NULL};
  assert_int_equal(raw_request(url, "POST", "/v1/jobs", spec, rebound, &text), 403);
  doc = json_loads(text, 0, NULL);
  free(text);
  assert_error(doc, 403, "PERMISSION_DENIED", "Host");
  json_decref(doc);
  const char *rebound_read[] = {"Host: evil.example:8080", NULL};
  assert_int_equal(raw_request(url, "GET", "/v1/jobs", NULL, rebound_read, &text), 403);
  free(text);
  const char *null_origin[] = {"Origin: null", "Content-Type: application/json", NULL};
  assert_int_equal(raw_request(url, "POST", "/v1/jobs", spec, null_origin, &text), 403);
  free(text);
  assert_int_equal(count_jobs_of(url), 0);
  /* What the CLI and the dashboard send still works. */
  const char *cli[] = {host, "Content-Type: application/json", NULL};
  assert_int_equal(raw_request(url, "POST", "/v1/jobs", spec, cli, &text), 200);
  free(text);
  const char *dashboard[] = {same_origin, "Content-Type: application/json", NULL};
  assert_int_equal(raw_request(url, "POST", "/v1/jobs", spec, dashboard, &text), 200);
  free(text);
  const char *localhost[] = {"Host: localhost", "Content-Type: application/json", NULL};
  assert_int_equal(raw_request(url, "POST", "/v1/jobs", spec, localhost, &text), 200);
  free(text);
  assert_int_equal(count_jobs_of(url), 3);
  free(spec);
  /* --metrics-auth public: /metrics without a token, every tenant summed. */
  const char *none[] = {NULL};
  assert_int_equal(raw_request(url, "GET", "/metrics", NULL, none, &text), 200);
  assert_non_null(strstr(text, "kiln_jobs{state=\"QUEUED\"} "));
  assert_null(strstr(text, "tenant"));
  free(text);
  kill(pid, SIGTERM);
  waitpid(pid, NULL, 0);
}

/* ---- flags ---- */

static void bad_metrics_auth_stops_kilnd(void **state) {
  (void)state;
  char out[1024], cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s' --data-dir '%s/unused' --metrics-auth maybe", KILND_PATH, work);
  assert_int_equal(it_run(out, sizeof out, cmd), 2);
  assert_non_null(strstr(out, "--metrics-auth must be token or public, got 'maybe'"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(token_create_on_a_fresh_data_dir_makes_it),
      cmocka_unit_test(tokens_are_created_listed_and_revoked_at_once),
      cmocka_unit_test(list_details_follow_the_aips),
      cmocka_unit_test(cancel_of_a_running_job_answers_stopping),
      cmocka_unit_test(no_server_path_reaches_a_tenant),
      cmocka_unit_test(a_display_name_cannot_forge_a_log_line),
      cmocka_unit_test(metrics_need_an_admin_token_by_default),
      cmocka_unit_test(data_directory_is_owner_only),
      cmocka_unit_test(insecure_mode_refuses_cross_site_and_rebound_requests),
      cmocka_unit_test(bad_metrics_auth_stops_kilnd),
  };
  return cmocka_run_group_tests(tests, start, stop);
}
