/* End to end against a real kilnd on a free loopback port with a temp data
 * dir: the Fashion-MNIST MLP example is submitted, trained by kiln-train and
 * checked (state, metrics, accuracy, safetensors checkpoint); bad requests
 * get the error model and change nothing while the job trains; the kiln CLI
 * talks to the same server; SIGTERM stops kilnd cleanly. */
#include <curl/curl.h>
#include <glob.h>
#include <jansson.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#include "engine.h"

#define TRAIN_TIMEOUT_S 600

static char data_dir[256];
static char base_url[64];
static pid_t kilnd_pid;
static char job_id[64];
static char admin_token[128]; /* made by kilnd on first start */

/* ---- a small HTTP client ---- */

/* Sends a request; returns the HTTP status and the parsed JSON body (or NULL). */
static long http(const char *method, const char *path, const char *body, size_t body_len,
                 json_t **out) {
  char *text = NULL;
  long status = it_request(base_url, admin_token, method, path, body, body_len, &text);
  if (status == 0) fail_msg("%s %s: %s", method, path, text ? text : "no answer");
  if (out) *out = text ? json_loads(text, 0, NULL) : NULL;
  free(text);
  return status;
}

/* GET path as raw bytes (200 expected), NUL-terminated; *len without the NUL. */
static unsigned char *http_bytes(const char *path, size_t *len) {
  CURL *c = curl_easy_init();
  assert_non_null(c);
  char url[1024], auth[200];
  snprintf(url, sizeof url, "%s%s", base_url, path);
  snprintf(auth, sizeof auth, "Authorization: Bearer %s", admin_token);
  struct curl_slist *headers = curl_slist_append(NULL, auth);
  it_buffer b = {0};
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, it_on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
  assert_int_equal(curl_easy_perform(c), CURLE_OK);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(c);
  assert_int_equal(status, 200);
  if (!b.data) b.data = calloc(1, 1);
  *len = b.len;
  return (unsigned char *)b.data;
}

static char *read_text(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)size + 1);
  assert_int_equal(fread(text, 1, (size_t)size, f), (size_t)size);
  text[size] = '\0';
  fclose(f);
  if (len) *len = (size_t)size;
  return text;
}

static int count_jobs(void) {
  json_t *doc;
  assert_int_equal(http("GET", "/v1/jobs?page_size=1000", NULL, 0, &doc), 200);
  int n = (int)json_array_size(json_object_get(doc, "jobs"));
  json_decref(doc);
  return n;
}

/* Asserts the error model: code, status, and (if given) the first detail's field. */
static void assert_error(json_t *doc, long http_status, const char *status, const char *field) {
  assert_non_null(doc);
  json_t *e = json_object_get(doc, "error");
  assert_non_null(e);
  assert_int_equal(json_integer_value(json_object_get(e, "code")), http_status);
  assert_string_equal(json_string_value(json_object_get(e, "status")), status);
  assert_true(strlen(json_string_value(json_object_get(e, "message"))) > 0);
  json_t *details = json_object_get(e, "details");
  assert_true(json_is_array(details));
  if (field) {
    assert_true(json_array_size(details) >= 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(details, 0), "field")),
                        field);
  }
}

/* ---- kilnd lifecycle ---- */

/* Starts kilnd on data_dir and waits until it serves; 0 when it does. */
static int launch_kilnd(void) {
  return it_launch_kilnd(KILND_PATH, data_dir, KILN_TRAIN_PATH, NULL, NULL, &kilnd_pid, base_url,
                         sizeof base_url, admin_token, sizeof admin_token);
}

static int start_kilnd(void **state) {
  (void)state;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-it-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  return launch_kilnd();
}

static int stop_kilnd(void **state) {
  (void)state;
  if (kilnd_pid > 0) {
    kill(kilnd_pid, SIGKILL);
    waitpid(kilnd_pid, NULL, 0);
  }
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", data_dir);
  int rc = system(cmd);
  curl_global_cleanup();
  return rc;
}

/* ---- tests, in order ---- */

static void healthz_answers_ok(void **state) {
  (void)state;
  json_t *doc;
  /* Without the token the API is closed; health stays open for probes. */
  char saved[sizeof admin_token];
  memcpy(saved, admin_token, sizeof saved);
  admin_token[0] = '\0';
  assert_int_equal(http("GET", "/v1/jobs", NULL, 0, &doc), 401);
  assert_error(doc, 401, "UNAUTHENTICATED", "Authorization");
  json_decref(doc);
  memcpy(admin_token, saved, sizeof saved);
  assert_int_equal(http("GET", "/healthz", NULL, 0, &doc), 200);
  assert_string_equal(json_string_value(json_object_get(doc, "status")), "ok");
  json_decref(doc);
  assert_int_equal(http("GET", "/v1/datasets", NULL, 0, &doc), 200);
  json_t *fm = json_array_get(json_object_get(doc, "datasets"), 0);
  assert_string_equal(json_string_value(json_object_get(fm, "id")), "fashion-mnist");
  assert_int_equal(json_integer_value(json_object_get(fm, "train_examples")), 60000);
  json_decref(doc);
}

static void example_job_is_accepted_and_queued(void **state) {
  (void)state;
  size_t len;
  char *spec = read_text(EXAMPLES_DIR "/fmnist-mlp.json", &len);
  json_t *doc;
  assert_int_equal(http("POST", "/v1/jobs", spec, len, &doc), 200);
  free(spec);
  const char *id = json_string_value(json_object_get(doc, "id"));
  assert_non_null(id);
  snprintf(job_id, sizeof job_id, "%s", id);
  char name[96];
  snprintf(name, sizeof name, "jobs/%s", job_id);
  assert_string_equal(json_string_value(json_object_get(doc, "name")), name);
  assert_string_equal(json_string_value(json_object_get(doc, "display_name")), "fmnist-mlp");
  const char *st = json_string_value(json_object_get(doc, "state"));
  assert_true(strcmp(st, "QUEUED") == 0 || strcmp(st, "STARTING") == 0 ||
              strcmp(st, "RUNNING") == 0);
  /* The stored spec is the canonical one, defaults filled in. */
  json_t *spec_doc = json_object_get(doc, "spec");
  assert_int_equal(
      json_integer_value(json_object_get(json_object_get(spec_doc, "pipeline"), "batch_size")),
      128);
  json_decref(doc);
  assert_int_equal(count_jobs(), 1);
}

static void malformed_json_is_400_and_creates_nothing(void **state) {
  (void)state;
  const char *bad = "{\"model\": {\"layers\": [}";
  json_t *doc;
  assert_int_equal(http("POST", "/v1/jobs", bad, strlen(bad), &doc), 400);
  assert_error(doc, 400, "INVALID_ARGUMENT", NULL);
  json_decref(doc);
  assert_int_equal(http("GET", "/healthz", NULL, 0, NULL), 200);
  assert_int_equal(count_jobs(), 1);
}

static void unknown_layer_type_names_the_field(void **state) {
  (void)state;
  size_t len;
  char *text = read_text(EXAMPLES_DIR "/fmnist-mlp.json", &len);
  json_t *spec = json_loads(text, 0, NULL);
  free(text);
  json_t *layer = json_array_get(json_object_get(json_object_get(spec, "model"), "layers"), 1);
  json_object_set_new(layer, "type", json_string("conv3d"));
  char *body = json_dumps(spec, 0);
  json_decref(spec);
  json_t *doc;
  assert_int_equal(http("POST", "/v1/jobs", body, strlen(body), &doc), 400);
  free(body);
  assert_error(doc, 400, "INVALID_ARGUMENT", "model.layers[1].type");
  const char *desc = json_string_value(json_object_get(
      json_array_get(json_object_get(json_object_get(doc, "error"), "details"), 0), "description"));
  assert_non_null(strstr(desc, "conv3d"));
  json_decref(doc);
  assert_int_equal(http("GET", "/healthz", NULL, 0, NULL), 200);
  assert_int_equal(count_jobs(), 1);
}

static void body_over_the_limit_is_413(void **state) {
  (void)state;
  size_t len = 2u << 20; /* twice the default 1 MiB cap */
  char *body = malloc(len);
  memset(body, ' ', len);
  body[0] = '{';
  body[len - 1] = '}';
  json_t *doc;
  assert_int_equal(http("POST", "/v1/jobs", body, len, &doc), 413);
  free(body);
  assert_error(doc, 413, "RESOURCE_EXHAUSTED", "body");
  json_decref(doc);
  assert_int_equal(http("GET", "/healthz", NULL, 0, NULL), 200);
  assert_int_equal(count_jobs(), 1);
}

static void unknown_job_is_404(void **state) {
  (void)state;
  json_t *doc;
  assert_int_equal(http("GET", "/v1/jobs/20260101-0123456789abcdef", NULL, 0, &doc), 404);
  assert_error(doc, 404, "NOT_FOUND", NULL);
  json_decref(doc);
  assert_int_equal(http("GET", "/v1/jobs/..%2F..%2Fetc/metrics", NULL, 0, &doc), 404);
  assert_error(doc, 404, "NOT_FOUND", NULL);
  json_decref(doc);
  assert_int_equal(http("GET", "/v1/jobs?page_token=garbage", NULL, 0, &doc), 400);
  assert_error(doc, 400, "INVALID_ARGUMENT", "page_token");
  json_decref(doc);
  assert_int_equal(http("GET", "/healthz", NULL, 0, NULL), 200);
  assert_int_equal(count_jobs(), 1);
}

static void validate_only_checks_and_creates_nothing(void **state) {
  (void)state;
  size_t len;
  char *spec = read_text(EXAMPLES_DIR "/fmnist-mlp.json", &len);
  json_t *doc;
  assert_int_equal(http("POST", "/v1/jobs?validate_only=true", spec, len, &doc), 200);
  assert_string_equal(json_string_value(json_object_get(doc, "display_name")), "fmnist-mlp");
  json_decref(doc);
  assert_int_equal(http("POST", "/v1/jobs?validate_only=maybe", spec, len, &doc), 400);
  assert_error(doc, 400, "INVALID_ARGUMENT", "validate_only");
  json_decref(doc);
  free(spec);
  assert_int_equal(count_jobs(), 1);
}

static json_t *wait_for_terminal(void) {
  time_t deadline = time(NULL) + TRAIN_TIMEOUT_S;
  char path[128];
  snprintf(path, sizeof path, "/v1/jobs/%s", job_id);
  for (;;) {
    json_t *doc;
    assert_int_equal(http("GET", path, NULL, 0, &doc), 200);
    const char *st = json_string_value(json_object_get(doc, "state"));
    if (!strcmp(st, "SUCCEEDED") || !strcmp(st, "FAILED") || !strcmp(st, "CANCELLED")) return doc;
    json_decref(doc);
    if (time(NULL) > deadline) fail_msg("job %s did not finish in %d s", job_id, TRAIN_TIMEOUT_S);
    usleep(250 * 1000);
  }
}

static void example_job_trains_to_085_with_metrics_and_checkpoint(void **state) {
  (void)state;
  json_t *job = wait_for_terminal();
  const char *st = json_string_value(json_object_get(job, "state"));
  if (strcmp(st, "SUCCEEDED") != 0) {
    fail_msg("job ended %s: %s: %s", st, json_string_value(json_object_get(job, "reason")),
             json_string_value(json_object_get(job, "message")));
  }
  assert_string_equal(json_string_value(json_object_get(job, "reason")), "COMPLETED");
  assert_non_null(json_object_get(job, "start_time"));
  assert_non_null(json_object_get(job, "end_time"));
  json_decref(job);

  /* At least one metric row per epoch, and the final test accuracy. */
  char path[160];
  snprintf(path, sizeof path, "/v1/jobs/%s/metrics", job_id);
  json_t *doc;
  assert_int_equal(http("GET", path, NULL, 0, &doc), 200);
  json_t *points = json_object_get(doc, "metrics");
  int per_epoch[3] = {0}, step_points = 0;
  double val_accuracy = -1;
  int64_t val_step = -1;
  for (size_t i = 0; i < json_array_size(points); i++) {
    json_t *p = json_array_get(points, i);
    const char *name = json_string_value(json_object_get(p, "name"));
    int epoch = (int)json_integer_value(json_object_get(p, "epoch"));
    int64_t step = json_integer_value(json_object_get(p, "step"));
    if (!strcmp(name, "epoch_loss") && epoch >= 1 && epoch <= 2) per_epoch[epoch]++;
    if (!strcmp(name, "loss")) step_points++;
    if (!strcmp(name, "val_accuracy") && step > val_step) {
      val_step = step;
      val_accuracy = json_real_value(json_object_get(p, "value"));
    }
  }
  json_decref(doc);
  print_message("final val_accuracy %.4f at step %lld, %d step-loss points\n", val_accuracy,
                (long long)val_step, step_points);
  assert_int_equal(per_epoch[1], 1);
  assert_int_equal(per_epoch[2], 1);
  assert_true(step_points >= 2 * 469 / 50);
  assert_int_equal(val_step, 2 * 469); /* 60000 / 128 rounded up, twice */
  assert_true(val_accuracy >= 0.85);

  /* The checkpoint: recorded, on disk, safetensors with every weight. */
  snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", job_id);
  assert_int_equal(http("GET", path, NULL, 0, &doc), 200);
  json_t *list = json_object_get(doc, "checkpoints");
  assert_int_equal(json_array_size(list), 1);
  json_t *ck = json_array_get(list, 0);
  /* No server path in the API: the file is found in the job's folder. */
  assert_null(json_object_get(ck, "path"));
  char pattern[400];
  snprintf(pattern, sizeof pattern, "%s/jobs/%s/checkpoints/ckpt-*.safetensors", data_dir, job_id);
  glob_t found;
  assert_int_equal(glob(pattern, 0, NULL, &found), 0);
  assert_int_equal(found.gl_pathc, 1);
  char file[400];
  snprintf(file, sizeof file, "%s", found.gl_pathv[0]);
  globfree(&found);
  int64_t bytes = json_integer_value(json_object_get(ck, "bytes"));
  const char *sha = json_string_value(json_object_get(ck, "sha256"));
  assert_int_equal(json_integer_value(json_object_get(ck, "step")), 2 * 469);
  size_t len;
  unsigned char *raw = (unsigned char *)read_text(file, &len);
  assert_int_equal((int64_t)len, bytes);
  kc_sha256 h;
  uint8_t digest[32];
  char hex[65];
  kc_sha256_init(&h);
  kc_sha256_update(&h, raw, len);
  kc_sha256_final(&h, digest);
  kc_sha256_hex(digest, hex);
  assert_string_equal(hex, sha);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | raw[i];
  json_t *header = json_loadb((const char *)raw + 8, hlen, 0, NULL);
  assert_non_null(header);
  struct {
    const char *name;
    int ndim;
    int dims[2];
  } want[] = {{"dense_1.kernel", 2, {784, 256}},
              {"dense_1.bias", 1, {256}},
              {"dense_2.kernel", 2, {256, 10}},
              {"dense_2.bias", 1, {10}}};
  uint64_t data_bytes = 0;
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    json_t *t = json_object_get(header, want[i].name);
    if (!t) fail_msg("checkpoint header lacks %s", want[i].name);
    assert_string_equal(json_string_value(json_object_get(t, "dtype")), "F32");
    json_t *shape = json_object_get(t, "shape");
    assert_int_equal(json_array_size(shape), (size_t)want[i].ndim);
    uint64_t elems = 1;
    for (int d = 0; d < want[i].ndim; d++) {
      assert_int_equal(json_integer_value(json_array_get(shape, (size_t)d)), want[i].dims[d]);
      elems *= (uint64_t)want[i].dims[d];
    }
    json_t *offsets = json_object_get(t, "data_offsets");
    assert_int_equal(json_integer_value(json_array_get(offsets, 1)) -
                         json_integer_value(json_array_get(offsets, 0)),
                     elems * 4);
    data_bytes += elems * 4;
  }
  assert_int_equal(json_object_size(header), 4 + 1); /* the weights and __metadata__ */
  assert_int_equal(8 + hlen + data_bytes, len);
  json_decref(header);

  /* The same checkpoint through the API: its resource, then its bytes. */
  char ck_path[200];
  snprintf(ck_path, sizeof ck_path, "/v1/jobs/%s/checkpoints/%lld", job_id,
           (long long)json_integer_value(json_object_get(ck, "id")));
  json_t *one;
  assert_int_equal(http("GET", ck_path, NULL, 0, &one), 200);
  assert_string_equal(json_string_value(json_object_get(one, "sha256")), sha);
  json_decref(one);
  strcat(ck_path, ":download");
  size_t got_len = 0;
  unsigned char *got = http_bytes(ck_path, &got_len);
  assert_int_equal(got_len, len);
  assert_memory_equal(got, raw, len);
  free(got);
  free(raw);
  json_decref(doc);

  /* The trainer's output (its stderr) is served as kept in the job's folder. */
  snprintf(path, sizeof path, "/v1/jobs/%s/logs", job_id);
  size_t log_len = 0;
  char *log = (char *)http_bytes(path, &log_len);
  char log_file[400];
  snprintf(log_file, sizeof log_file, "%s/jobs/%s/train.log", data_dir, job_id);
  size_t file_len = 0;
  char *on_disk = read_text(log_file, &file_len);
  assert_int_equal(log_len, file_len);
  assert_memory_equal(log, on_disk, file_len);
  free(on_disk);
  free(log);

  /* The job's events tell its way through the states. */
  snprintf(path, sizeof path, "/v1/jobs/%s/events", job_id);
  assert_int_equal(http("GET", path, NULL, 0, &doc), 200);
  const char *seen[8];
  size_t n = json_array_size(json_object_get(doc, "events"));
  assert_true(n >= 4 && n <= 8);
  for (size_t i = 0; i < n; i++) {
    seen[i] = json_string_value(
        json_object_get(json_array_get(json_object_get(doc, "events"), i), "to_state"));
  }
  assert_string_equal(seen[0], "QUEUED");
  assert_string_equal(seen[1], "STARTING");
  assert_string_equal(seen[2], "RUNNING");
  assert_string_equal(seen[n - 1], "SUCCEEDED");
  json_decref(doc);
}

/* Runs the kiln CLI against the server; returns its exit status and output. */
static int run_cli(char *out, size_t outlen, const char *args) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s --server %s --token %s %s", KILN_CLI_PATH, base_url, admin_token,
           args);
  return it_run(out, outlen, cmd);
}

static void cli_submits_gets_and_lists(void **state) {
  (void)state;
  char out[8192], args[1024], new_id[64];
  snprintf(args, sizeof args, "submit %s/fmnist-mlp.json --request-id cli-1", EXAMPLES_DIR);
  assert_int_equal(run_cli(out, sizeof out, args), 0);
  assert_int_equal(sscanf(out, "job %63s", new_id), 1);
  /* Retrying with the same request id gives the same job. */
  char again[8192];
  assert_int_equal(run_cli(again, sizeof again, args), 0);
  assert_non_null(strstr(again, new_id));
  assert_int_equal(count_jobs(), 2);
  snprintf(args, sizeof args, "get %s", new_id);
  assert_int_equal(run_cli(out, sizeof out, args), 0);
  assert_non_null(strstr(out, new_id));
  assert_non_null(strstr(out, "fmnist-mlp"));
  assert_int_equal(run_cli(out, sizeof out, "ls"), 0);
  assert_non_null(strstr(out, new_id));
  assert_non_null(strstr(out, job_id));
  assert_non_null(strstr(out, "SUCCEEDED"));
  assert_int_equal(run_cli(out, sizeof out, "get no-such-job"), 1);
  assert_non_null(strstr(out, "NOT_FOUND"));
  assert_int_equal(run_cli(out, sizeof out, "frobnicate"), 2);
}

/* A pools file with a mistake stops kilnd at start with the field named,
 * before it serves anything. */
static void bad_pools_file_stops_kilnd_naming_the_field(void **state) {
  (void)state;
  char pools[400], dir[400], cmd[2000], out[2048] = "";
  snprintf(pools, sizeof pools, "%s/bad-pools.json", data_dir);
  snprintf(dir, sizeof dir, "%s/bad-pools-data", data_dir);
  FILE *f = fopen(pools, "w");
  assert_non_null(f);
  fputs("{\"pools\": [{\"name\": \"a\", \"devices\": [0]}, {\"name\": \"b\", \"devices\": [0]}]}",
        f);
  fclose(f);
  snprintf(cmd, sizeof cmd,
           "%s --listen 127.0.0.1:0 --data-dir %s --trainer %s --pools %s 2>&1; echo \"exit=$?\"",
           KILND_PATH, dir, KILN_TRAIN_PATH, pools);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t used = fread(out, 1, sizeof out - 1, p);
  out[used] = '\0';
  pclose(p);
  if (!strstr(out, "pools[1].devices[0]: cpu 0 is already in another pool") ||
      !strstr(out, "exit=1"))
    fail_msg("kilnd said: %s", out);
}

static void sigterm_stops_kilnd_and_requeues_the_running_job(void **state) {
  (void)state;
  /* The CLI's job is now starting or running; stop the server under it. */
  json_t *doc;
  char running[64] = "";
  for (int i = 0; i < 100 && !running[0]; i++) {
    assert_int_equal(http("GET", "/v1/jobs?filter=state%3DRUNNING", NULL, 0, &doc), 200);
    json_t *first = json_array_get(json_object_get(doc, "jobs"), 0);
    if (first)
      snprintf(running, sizeof running, "%s", json_string_value(json_object_get(first, "id")));
    json_decref(doc);
    if (!running[0]) usleep(100 * 1000);
  }
  assert_true(running[0] != '\0');
  kill(kilnd_pid, SIGTERM);
  int status = 0;
  for (int i = 0; i < 200; i++) {
    if (waitpid(kilnd_pid, &status, WNOHANG) == kilnd_pid) break;
    usleep(100 * 1000);
  }
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  kilnd_pid = 0;
  /* Restart on the same data: the job is back in the queue and runs again. */
  assert_int_equal(launch_kilnd(), 0);
  char path[128];
  snprintf(path, sizeof path, "/v1/jobs/%s/events", running);
  assert_int_equal(http("GET", path, NULL, 0, &doc), 200);
  json_t *events = json_object_get(doc, "events");
  int requeued = 0;
  for (size_t i = 0; i < json_array_size(events); i++) {
    json_t *e = json_array_get(events, i);
    if (!strcmp(json_string_value(json_object_get(e, "to_state")), "QUEUED") &&
        !strcmp(json_string_value(json_object_get(e, "reason")), "SERVER_SHUTDOWN")) {
      requeued = 1;
    }
  }
  json_decref(doc);
  assert_true(requeued);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(healthz_answers_ok),
      cmocka_unit_test(example_job_is_accepted_and_queued),
      cmocka_unit_test(malformed_json_is_400_and_creates_nothing),
      cmocka_unit_test(unknown_layer_type_names_the_field),
      cmocka_unit_test(body_over_the_limit_is_413),
      cmocka_unit_test(unknown_job_is_404),
      cmocka_unit_test(validate_only_checks_and_creates_nothing),
      cmocka_unit_test(example_job_trains_to_085_with_metrics_and_checkpoint),
      cmocka_unit_test(cli_submits_gets_and_lists),
      cmocka_unit_test(bad_pools_file_stops_kilnd_naming_the_field),
      cmocka_unit_test(sigterm_stops_kilnd_and_requeues_the_running_job),
  };
  return cmocka_run_group_tests(tests, start_kilnd, stop_kilnd);
}
