/* test_limits.c — a real kilnd's limits, with a stand-in trainer: a user's
 * priority ceiling and a tenant's quotas (set by an admin), a spec whose
 * planned memory exceeds the budget refused at create, a deleted job's
 * folder removed, stale upload folders swept at start, a hung trainer
 * failed by the heartbeat, and a trainer over its memory limit (RLIMIT_AS,
 * or a cgroup where one can be made) ending RESOURCE_EXHAUSTED while kilnd
 * serves on. */
#include <curl/curl.h>
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

static char data_dir[256], base_url[64], admin_token[128], acme_token[128], beta_token[128];
static pid_t kilnd_pid;
static char *small_spec;

/* "sleeper*" jobs run until signalled; "hang*" jobs report a step, then
 * stop themselves (SIGSTOP) and never report again; "hog*" jobs report the
 * address-space limit they were given, then grow a string until memory
 * runs out and, as kiln-train does, report RESOURCE_EXHAUSTED and exit 7
 * ("hog-exec" replaces the shell with the growing process, so a cgroup's
 * OOM killer kills the trainer itself); "ckpt*" jobs write a 5000-byte
 * checkpoint; every other job reports one point and succeeds. */
static const char trainer_script[] =
    "#!/bin/sh\n"
    "spec=\"$2\"; ckdir=''; prev=''\n"
    "for a in \"$@\"; do\n"
    "  [ \"$prev\" = --checkpoint-dir ] && ckdir=\"$a\"\n"
    "  prev=\"$a\"\n"
    "done\n"
    "if grep -q '\"display_name\":\"sleeper' \"$spec\"; then exec sleep 600; fi\n"
    "if grep -q '\"display_name\":\"hang' \"$spec\"; then\n"
    "  echo '{\"step\":1,\"epoch\":1,\"metrics\":{\"loss\":1}}' >&3\n"
    "  kill -STOP $$\n"
    "fi\n"
    "if grep -q '\"display_name\":\"hog' \"$spec\"; then\n"
    "  echo \"{\\\"status\\\":{\\\"phase\\\":\\\"limits\\\",\\\"message\\\":\\\"ulimit -v "
    "$(ulimit -v)\\\"}}\" >&3\n"
    "  grow='BEGIN { s = \"x\"; while (1) s = s s }'\n"
    "  if grep -q '\"display_name\":\"hog-exec' \"$spec\"; then exec awk \"$grow\"; fi\n"
    "  awk \"$grow\" 2>/dev/null\n"
    "  echo '{\"error\":{\"reason\":\"RESOURCE_EXHAUSTED\",\"message\":\"out of memory\"}}' >&3\n"
    "  exit 7\n"
    "fi\n"
    "if grep -q '\"display_name\":\"ckpt' \"$spec\"; then\n"
    "  f=\"$ckdir/ckpt-1.safetensors\"; head -c 5000 /dev/zero > \"$f\"\n"
    "  h=$(sha256sum \"$f\" | cut -d' ' -f1)\n"
    "  echo \"{\\\"checkpoint\\\":{\\\"step\\\":1,\\\"path\\\":\\\"$f\\\",\\\"bytes\\\":5000,"
    "\\\"sha256\\\":\\\"$h\\\"}}\" >&3\n"
    "fi\n"
    "echo '{\"step\":1,\"epoch\":1,\"metrics\":{\"loss\":1}}' >&3\n";

static long call(const char *token, const char *method, const char *path, const char *body,
                 json_t **out) {
  char *text = NULL;
  long status = it_request(base_url, token, method, path, body, body ? strlen(body) : 0, &text);
  if (status == 0) fail_msg("%s %s: %s", method, path, text ? text : "no answer");
  if (out) *out = text ? json_loads(text, 0, NULL) : NULL;
  free(text);
  return status;
}

static char *spec_named(const char *name, int priority) {
  json_t *spec = json_loads(small_spec, 0, NULL);
  json_object_set_new(spec, "display_name", json_string(name));
  json_object_set_new(spec, "priority", json_integer(priority));
  char *text = json_dumps(spec, JSON_COMPACT);
  json_decref(spec);
  return text;
}

/* Creates a job as token; its status, and its id in id (64 bytes) on 200,
 * else the error document in *err (may be NULL). */
static long create(const char *token, const char *name, int priority, char *id, json_t **err) {
  char *body = spec_named(name, priority);
  json_t *doc;
  long status = call(token, "POST", "/v1/jobs", body, &doc);
  free(body);
  if (status == 200) snprintf(id, 64, "%s", json_string_value(json_object_get(doc, "id")));
  if (err && status != 200)
    *err = doc;
  else
    json_decref(doc);
  return status;
}

static void assert_error(json_t *doc, long code, const char *status, const char *field,
                         const char *in_message) {
  json_t *e = json_object_get(doc, "error");
  assert_non_null(e);
  assert_int_equal(json_integer_value(json_object_get(e, "code")), code);
  assert_string_equal(json_string_value(json_object_get(e, "status")), status);
  const char *message = json_string_value(json_object_get(e, "message"));
  json_t *d = json_array_get(json_object_get(e, "details"), 0);
  const char *got = d ? json_string_value(json_object_get(d, "field")) : "(none)";
  if (strcmp(got, field) != 0) fail_msg("expected field %s, got %s: %s", field, got, message);
  if (!strstr(message, in_message)) fail_msg("'%s' not in '%s'", in_message, message);
}

static json_t *job_now(const char *token, const char *id) {
  char path[160];
  snprintf(path, sizeof path, "/v1/jobs/%s", id);
  json_t *doc;
  assert_int_equal(call(token, "GET", path, NULL, &doc), 200);
  return doc;
}

/* Polls the job until state (up to limit_s); returns it. */
static json_t *wait_state(const char *token, const char *id, const char *state, int limit_s) {
  for (int i = 0; i < limit_s * 20; i++) {
    json_t *doc = job_now(token, id);
    const char *now = json_string_value(json_object_get(doc, "state"));
    if (!strcmp(now, state)) return doc;
    if (i == limit_s * 20 - 1)
      fail_msg("job %s is %s, not %s, after %d s", id, now, state, limit_s);
    json_decref(doc);
    usleep(50 * 1000);
  }
  return NULL;
}

static void cancel(const char *token, const char *id) {
  char path[160];
  snprintf(path, sizeof path, "/v1/jobs/%s:cancel", id);
  assert_int_equal(call(token, "POST", path, NULL, NULL), 200);
  json_decref(wait_state(token, id, "CANCELLED", 20));
}

/* 1 when one of the job's events has reason and message containing text. */
static int has_event(const char *token, const char *id, const char *reason, const char *text,
                     char *message, size_t len) {
  char path[160];
  snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
  json_t *doc;
  assert_int_equal(call(token, "GET", path, NULL, &doc), 200);
  json_t *events = json_object_get(doc, "events"), *e;
  size_t i;
  int found = 0;
  json_array_foreach(events, i, e) {
    const char *m = json_string_value(json_object_get(e, "message"));
    if (!strcmp(json_string_value(json_object_get(e, "reason")), reason) && strstr(m, text)) {
      if (message) snprintf(message, len, "%s", m);
      found = 1;
    }
  }
  json_decref(doc);
  return found;
}

static int launch(const char *const *extra) {
  char trainer[300], pools[300];
  snprintf(trainer, sizeof trainer, "%s/trainer.sh", data_dir);
  snprintf(pools, sizeof pools, "%s/pools.json", data_dir);
  const char *args[20] = {"--pools", pools};
  int n = 2;
  for (int i = 0; extra && extra[i] && n < 19; i++) args[n++] = extra[i];
  args[n] = NULL;
  return it_launch_kilnd_args(KILND_PATH, data_dir, trainer, args, &kilnd_pid, base_url,
                              sizeof base_url, admin_token, sizeof admin_token);
}

static void relaunch(const char *const *extra) {
  kill(kilnd_pid, SIGTERM);
  waitpid(kilnd_pid, NULL, 0);
  kilnd_pid = -1;
  assert_int_equal(launch(extra), 0);
}

static int start_kilnd(void **state) {
  (void)state;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-limits-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  char path[400];
  snprintf(path, sizeof path, "%s/trainer.sh", data_dir);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fputs(trainer_script, f);
  fclose(f);
  chmod(path, 0755);
  /* One device: jobs queue behind one another whatever the machine has. */
  snprintf(path, sizeof path, "%s/pools.json", data_dir);
  f = fopen(path, "w");
  if (!f) return -1;
  fputs("{\"pools\": [{\"name\": \"default\", \"devices\": [0]}]}", f);
  fclose(f);
  /* An upload a killed kilnd left behind. */
  snprintf(path, sizeof path, "%s/datasets/.upload-stale", data_dir);
  char cmd[1400];
  snprintf(cmd, sizeof cmd,
           "mkdir -p '%s' && head -c 1000 /dev/zero > '%s/upload.bin' && touch -d '2 hours ago' "
           "'%s'",
           path, path, path);
  if (system(cmd) != 0) return -1;
  FILE *ex = fopen(EXAMPLES_DIR "/fmnist-mlp.json", "rb");
  if (!ex) return -1;
  char buf[8192];
  size_t n = fread(buf, 1, sizeof buf - 1, ex);
  fclose(ex);
  buf[n] = '\0';
  small_spec = strdup(buf);
  if (launch(NULL) != 0) return -1;
  if (it_make_token(KILND_PATH, data_dir, "acme", acme_token, sizeof acme_token) != 0 ||
      it_make_token(KILND_PATH, data_dir, "beta", beta_token, sizeof beta_token) != 0)
    return -1;
  return 0;
}

static int stop_kilnd(void **state) {
  (void)state;
  int rc = it_stop_kilnd(kilnd_pid, data_dir);
  free(small_spec);
  curl_global_cleanup();
  return rc;
}

/* ---- tests, in order ---- */

static void stale_upload_folders_are_swept_at_start(void **state) {
  (void)state;
  char path[400];
  struct stat sb;
  snprintf(path, sizeof path, "%s/datasets/.upload-stale", data_dir);
  if (stat(path, &sb) == 0) fail_msg("%s is still there after kilnd started", path);
}

static void user_priority_above_its_ceiling_needs_an_admin(void **state) {
  (void)state;
  char id[64];
  json_t *err = NULL;
  assert_int_equal(create(acme_token, "quick-high", 100, id, &err), 403);
  assert_error(err, 403, "PERMISSION_DENIED", "priority", "max_priority 50");
  json_decref(err);
  /* A user cannot raise its own ceiling. */
  json_t *doc;
  assert_int_equal(
      call(acme_token, "PUT", "/v1/tenants/acme/quota", "{\"max_priority\":100}", &doc), 403);
  assert_error(doc, 403, "PERMISSION_DENIED", "role", "admin");
  json_decref(doc);
  /* An admin can. */
  assert_int_equal(
      call(admin_token, "PUT", "/v1/tenants/acme/quota", "{\"max_priority\":100}", &doc), 200);
  assert_string_equal(json_string_value(json_object_get(doc, "name")), "tenants/acme/quota");
  assert_int_equal(json_integer_value(json_object_get(doc, "max_priority")), 100);
  json_decref(doc);
  assert_int_equal(create(acme_token, "quick-high", 100, id, NULL), 200);
  json_decref(wait_state(acme_token, id, "SUCCEEDED", 20));
  /* Beta's ceiling is still the default. */
  assert_int_equal(create(beta_token, "quick-high", 51, id, &err), 403);
  json_decref(err);
  assert_int_equal(create(beta_token, "quick-mid", 50, id, NULL), 200);
  json_decref(wait_state(beta_token, id, "SUCCEEDED", 20));
  /* A quota is the admin's, or the tenant's own, to read. */
  assert_int_equal(call(beta_token, "GET", "/v1/tenants/acme/quota", NULL, &doc), 403);
  json_decref(doc);
  assert_int_equal(call(beta_token, "GET", "/v1/tenants/beta/quota", NULL, &doc), 200);
  assert_int_equal(json_integer_value(json_object_get(doc, "max_priority")), 50);
  json_decref(doc);
  /* Bad quotas name their field. */
  assert_int_equal(
      call(admin_token, "PUT", "/v1/tenants/acme/quota", "{\"max_priority\":101}", &doc), 400);
  assert_error(doc, 400, "INVALID_ARGUMENT", "max_priority", "0..100");
  json_decref(doc);
  assert_int_equal(call(admin_token, "PUT", "/v1/tenants/acme/quota", "{\"max_gpus\":1}", &doc),
                   400);
  assert_error(doc, 400, "INVALID_ARGUMENT", "max_gpus", "max_storage_bytes");
  json_decref(doc);
}

static void queued_jobs_and_devices_quotas_are_enforced_at_create(void **state) {
  (void)state;
  json_t *doc, *err = NULL;
  assert_int_equal(call(admin_token, "PUT", "/v1/tenants/beta/quota",
                        "{\"max_queued_jobs\":1,\"max_devices\":2}", &doc),
                   200);
  json_decref(doc);
  char sleeper[64], queued[64], id[64];
  assert_int_equal(create(beta_token, "sleeper-b", 50, sleeper, NULL), 200);
  json_decref(wait_state(beta_token, sleeper, "RUNNING", 20));
  char *first = spec_named("quick-b1", 50);
  assert_int_equal(call(beta_token, "POST", "/v1/jobs?request_id=b1", first, &doc), 200);
  free(first);
  snprintf(queued, sizeof queued, "%s", json_string_value(json_object_get(doc, "id")));
  json_decref(doc);
  /* Two unfinished jobs of one device each hold the tenant's two devices... */
  assert_int_equal(create(beta_token, "quick-b2", 50, id, &err), 429);
  assert_error(err, 429, "RESOURCE_EXHAUSTED", "resources.devices", "max_devices 2");
  json_decref(err);
  assert_int_equal(
      call(admin_token, "PUT", "/v1/tenants/beta/quota", "{\"max_devices\":null}", &doc), 200);
  assert_int_equal(json_integer_value(json_object_get(doc, "max_devices")), 0);
  json_t *usage = json_object_get(doc, "usage");
  assert_int_equal(json_integer_value(json_object_get(usage, "queued_jobs")), 1);
  assert_int_equal(json_integer_value(json_object_get(usage, "devices")), 2);
  json_decref(doc);
  /* ...and one queued job is all it may have waiting. A retry of the
   * create that queued it still answers that job. */
  char *body = spec_named("quick-b1", 50);
  assert_int_equal(call(beta_token, "POST", "/v1/jobs?request_id=b1", body, &doc), 200);
  free(body);
  assert_string_equal(json_string_value(json_object_get(doc, "id")), queued);
  json_decref(doc);
  assert_int_equal(create(beta_token, "quick-b2", 50, id, &err), 429);
  assert_error(err, 429, "RESOURCE_EXHAUSTED", "max_queued_jobs", "max_queued_jobs 1");
  json_decref(err);
  /* Another tenant is not held back by beta's quota. */
  assert_int_equal(create(acme_token, "quick-a", 50, id, NULL), 200);
  cancel(beta_token, sleeper);
  json_decref(wait_state(beta_token, queued, "SUCCEEDED", 20));
  json_decref(wait_state(acme_token, id, "SUCCEEDED", 20));
  assert_int_equal(create(beta_token, "quick-b3", 50, id, NULL), 200);
  json_decref(wait_state(beta_token, id, "SUCCEEDED", 20));
}

static void planned_memory_over_the_budget_is_refused_at_create(void **state) {
  (void)state;
  /* 40 dense layers of 65,536 units: about 170 G parameters. */
  json_t *spec = json_loads(small_spec, 0, NULL);
  json_t *layers = json_array();
  json_array_append_new(layers, json_pack("{s:s}", "type", "flatten"));
  for (int i = 0; i < 40; i++)
    json_array_append_new(
        layers, json_pack("{s:s,s:i,s:s}", "type", "dense", "units", 65536, "activation", "relu"));
  json_array_append_new(layers, json_pack("{s:s,s:i}", "type", "dense", "units", 10));
  json_object_set_new(json_object_get(spec, "model"), "layers", layers);
  char *body = json_dumps(spec, JSON_COMPACT);
  json_decref(spec);
  json_t *doc;
  assert_int_equal(call(admin_token, "POST", "/v1/jobs?validate_only=true", body, &doc), 409);
  assert_error(doc, 409, "FAILED_PRECONDITION", "model", "planned memory");
  json_decref(doc);
  assert_int_equal(call(admin_token, "POST", "/v1/jobs", body, &doc), 409);
  json_decref(doc);
  free(body);
  /* The small model fits, and its plan is on the job. */
  char id[64];
  assert_int_equal(create(acme_token, "quick-planned", 50, id, NULL), 200);
  json_t *job = wait_state(acme_token, id, "SUCCEEDED", 20);
  json_int_t planned = json_integer_value(json_object_get(job, "planned_memory_bytes"));
  json_decref(job);
  if (planned < 1000000 || planned > 100000000)
    fail_msg("planned_memory_bytes %lld is not the MLP's few MB", (long long)planned);
}

static void delete_removes_the_job_folder_and_storage_is_counted(void **state) {
  (void)state;
  char id[64], path[400], route[160];
  struct stat sb;
  /* A deleted job leaves nothing on disk. */
  assert_int_equal(create(acme_token, "quick-deleted", 50, id, NULL), 200);
  json_decref(wait_state(acme_token, id, "SUCCEEDED", 20));
  snprintf(path, sizeof path, "%s/jobs/%s", data_dir, id);
  assert_int_equal(stat(path, &sb), 0);
  snprintf(route, sizeof route, "/v1/jobs/%s", id);
  assert_int_equal(call(acme_token, "DELETE", route, NULL, NULL), 200);
  if (stat(path, &sb) == 0) fail_msg("%s is still there after DELETE", path);
  /* A checkpoint counts against the tenant's storage until its job is deleted. */
  json_t *doc;
  assert_int_equal(call(acme_token, "GET", "/v1/tenants/acme/quota", NULL, &doc), 200);
  json_int_t before =
      json_integer_value(json_object_get(json_object_get(doc, "usage"), "storage_bytes"));
  json_decref(doc);
  assert_int_equal(create(acme_token, "ckpt-1", 50, id, NULL), 200);
  json_decref(wait_state(acme_token, id, "SUCCEEDED", 20));
  assert_int_equal(call(acme_token, "GET", "/v1/tenants/acme/quota", NULL, &doc), 200);
  json_int_t stored =
      json_integer_value(json_object_get(json_object_get(doc, "usage"), "storage_bytes"));
  json_decref(doc);
  assert_int_equal(stored, before + 5000);
  /* Over the storage quota, an upload is refused before it is read. */
  assert_int_equal(
      call(admin_token, "PUT", "/v1/tenants/acme/quota", "{\"max_storage_bytes\":6000}", &doc),
      200);
  json_decref(doc);
  char csv[4096] = "a,b,label\n";
  for (int i = 0; i < 300; i++) strcat(csv, "1,2,x\n");
  assert_int_equal(
      call(acme_token, "POST", "/v1/datasets?format=csv&label_column=label", csv, &doc), 429);
  assert_error(doc, 429, "RESOURCE_EXHAUSTED", "max_storage_bytes", "max_storage_bytes 6000");
  json_decref(doc);
  snprintf(route, sizeof route, "/v1/jobs/%s", id);
  assert_int_equal(call(acme_token, "DELETE", route, NULL, NULL), 200);
  assert_int_equal(call(acme_token, "GET", "/v1/tenants/acme/quota", NULL, &doc), 200);
  assert_int_equal(
      json_integer_value(json_object_get(json_object_get(doc, "usage"), "storage_bytes")), before);
  json_decref(doc);
}

/* A planner that ends without a plan and without saying why (killed) runs
 * once more before the create fails; one that prints its plan and then
 * hangs is killed and its plan counts; one that fails twice gets a 500
 * naming its runs, its exit status and the end of what it said. */
static void a_planner_ending_without_a_plan_runs_again_then_says_why(void **state) {
  (void)state;
  char real[400], flaky[400], broken[400], runs[400], script[2000];
  snprintf(real, sizeof real, "%s", KILND_PATH);
  *strrchr(real, '/') = '\0'; /* .../server */
  *strrchr(real, '/') = '\0'; /* the build folder */
  strncat(real, "/worker/kiln-train", sizeof real - strlen(real) - 1);
  snprintf(runs, sizeof runs, "%s/planner.runs", data_dir);
  snprintf(flaky, sizeof flaky, "%s/flaky-planner.sh", data_dir);
  snprintf(script, sizeof script,
           "#!/bin/sh\necho run >> '%s'\n[ \"$(wc -l < '%s')\" -gt 1 ] && exec '%s' \"$@\"\n"
           "kill -KILL $$\n",
           runs, runs, real);
  assert_int_equal(it_write_file(flaky, script, 0755), 0);
  snprintf(broken, sizeof broken, "%s/broken-planner.sh", data_dir);
  assert_int_equal(
      it_write_file(broken, "#!/bin/sh\necho 'no memory for a plan' >&2\nexit 7\n", 0755), 0);
  const char *with_flaky[] = {"--planner", flaky, NULL};
  relaunch(with_flaky);
  char id[64];
  assert_int_equal(create(acme_token, "planned-twice", 50, id, NULL), 200);
  FILE *f = fopen(runs, "r");
  assert_non_null(f);
  char line[64];
  int n = 0;
  while (fgets(line, sizeof line, f)) n++;
  fclose(f);
  assert_int_equal(n, 2);
  json_decref(wait_state(acme_token, id, "SUCCEEDED", 20));
  /* One that prints its plan and then hangs: the plan counts, and the
   * planner is killed a few seconds later. */
  char hanging[400];
  snprintf(hanging, sizeof hanging, "%s/hanging-planner.sh", data_dir);
  snprintf(script, sizeof script, "#!/bin/sh\n'%s' \"$@\"\nexec sleep 600\n", real);
  assert_int_equal(it_write_file(hanging, script, 0755), 0);
  const char *with_hanging[] = {"--planner", hanging, NULL};
  relaunch(with_hanging);
  const int64_t t0 = it_now_ms();
  assert_int_equal(create(acme_token, "planned-then-hung", 50, id, NULL), 200);
  const int64_t took = it_now_ms() - t0;
  if (took > 15000) fail_msg("the create took %lld ms", (long long)took);
  json_decref(wait_state(acme_token, id, "SUCCEEDED", 20));
  const char *with_broken[] = {"--planner", broken, NULL};
  relaunch(with_broken);
  char *body = spec_named("never-planned", 50);
  json_t *doc;
  assert_int_equal(call(acme_token, "POST", "/v1/jobs", body, &doc), 500);
  free(body);
  assert_error(doc, 500, "INTERNAL", "(none)", "2 runs, exit status 7");
  assert_error(doc, 500, "INTERNAL", "(none)", "it said: no memory for a plan");
  json_decref(doc);
  relaunch(NULL);
}

static void hung_trainer_is_failed_by_the_heartbeat(void **state) {
  (void)state;
  const char *extra[] = {"--trainer-heartbeat", "2", NULL};
  relaunch(extra);
  char id[64];
  assert_int_equal(create(acme_token, "hang-1", 50, id, NULL), 200);
  json_t *job = wait_state(acme_token, id, "FAILED", 20);
  assert_string_equal(json_string_value(json_object_get(job, "reason")), "TRAINER_UNRESPONSIVE");
  if (!strstr(json_string_value(json_object_get(job, "message")), "no progress for 2 s"))
    fail_msg("message: %s", json_string_value(json_object_get(job, "message")));
  json_decref(job);
}

static void trainer_over_its_address_space_limit_ends_resource_exhausted(void **state) {
  (void)state;
  const char *extra[] = {"--trainer-limits", "rlimit", "--trainer-memory-max", "268435456", NULL};
  relaunch(extra);
  char id[64], message[512];
  assert_int_equal(create(acme_token, "hog-1", 50, id, NULL), 200);
  json_t *job = wait_state(acme_token, id, "FAILED", 30);
  assert_string_equal(json_string_value(json_object_get(job, "reason")), "RESOURCE_EXHAUSTED");
  json_decref(job);
  /* The limit was the one asked for (ulimit -v counts KiB), and the job's
   * events say which kind applied. */
  if (!has_event(acme_token, id, "STARTED", "RLIMIT_AS", message, sizeof message))
    fail_msg("no STARTED event naming RLIMIT_AS");
  assert_non_null(strstr(message, "268435456"));
  assert_int_equal(call(acme_token, "GET", "/healthz", NULL, NULL), 200);
}

/* A cgroup of its own where kilnd can make one (v2, or v1's memory
 * controller), or skip saying why. */
static void trainer_over_its_cgroup_memory_limit_is_oom_killed(void **state) {
  (void)state;
  kill(kilnd_pid, SIGTERM);
  waitpid(kilnd_pid, NULL, 0);
  kilnd_pid = -1;
  const char *extra[] = {"--trainer-limits", "cgroup", "--trainer-memory-max", "67108864", NULL};
  if (launch(extra) != 0) {
    char why[600] = "", cmd[600];
    snprintf(cmd, sizeof cmd, "grep -o -- '--trainer-limits cgroup: .*' '%s/kilnd.log' | tail -1",
             data_dir);
    it_run(why, sizeof why, cmd);
    assert_int_equal(launch(NULL), 0);
    printf("skipped: no cgroup can be made for trainers here: %s\n",
           why[0] ? why : "(see kilnd.log)");
    skip();
  }
  char id[64], message[1024];
  assert_int_equal(create(acme_token, "hog-exec", 50, id, NULL), 200);
  json_t *job = wait_state(acme_token, id, "FAILED", 30);
  assert_string_equal(json_string_value(json_object_get(job, "reason")), "RESOURCE_EXHAUSTED");
  const char *text = json_string_value(json_object_get(job, "message"));
  if (!strstr(text, "OOM killer") || !strstr(text, "67108864")) fail_msg("message: %s", text);
  json_decref(job);
  if (!has_event(acme_token, id, "STARTED", "as cgroup", message, sizeof message))
    fail_msg("no STARTED event naming the cgroup");
  assert_non_null(strstr(message, "67108864"));
  assert_int_equal(call(acme_token, "GET", "/healthz", NULL, NULL), 200);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(stale_upload_folders_are_swept_at_start),
      cmocka_unit_test(user_priority_above_its_ceiling_needs_an_admin),
      cmocka_unit_test(queued_jobs_and_devices_quotas_are_enforced_at_create),
      cmocka_unit_test(planned_memory_over_the_budget_is_refused_at_create),
      cmocka_unit_test(delete_removes_the_job_folder_and_storage_is_counted),
      cmocka_unit_test(hung_trainer_is_failed_by_the_heartbeat),
      cmocka_unit_test(trainer_over_its_address_space_limit_ends_resource_exhausted),
      cmocka_unit_test(trainer_over_its_cgroup_memory_limit_is_oom_killed),
      cmocka_unit_test(a_planner_ending_without_a_plan_runs_again_then_says_why),
  };
  return cmocka_run_group_tests(tests, start_kilnd, stop_kilnd);
}
