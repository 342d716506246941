/* test_cli.c — the kiln CLI against a real kilnd and the real kiln-train on
 * small CSV regressions: every exit code comes from a real scenario (0 a job
 * that met its bar, 1 a job that failed, 2 usage, 3 a cancelled job, 4 a
 * --timeout, 5 a job below its --require), `watch` and `logs -f` end when
 * the job ends, a checkpoint pinned while the job runs outlives keep_last,
 * and a download is checked against its sha256; `kiln agents` lists the
 * worker hosts registered over HTTP. */
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
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static char data_dir[256], work[300];
static char base_url[64], admin_token[128];
static pid_t kilnd_pid;
static char prices_id[64], kinds_id[64]; /* uploaded data sets */
static char done_job[64];                /* a job that SUCCEEDED */

static int cli(char *out, size_t outlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int cli_as(const char *token, char *out, size_t outlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Runs `kiln --server URL --token T ARGS` (stderr merged); its exit status. */
static int cli(char *out, size_t outlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int status = it_vkiln(KILN_CLI_PATH, work, base_url, admin_token, out, outlen, fmt, ap);
  va_end(ap);
  return status;
}

/* The same with another token. */
static int cli_as(const char *token, char *out, size_t outlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int status = it_vkiln(KILN_CLI_PATH, work, base_url, token, out, outlen, fmt, ap);
  va_end(ap);
  return status;
}

/* The same in the background, its output in work/NAME.out. */
static pid_t cli_background(const char *name, const char *args) {
  char cmd[3072], out[400];
  snprintf(cmd, sizeof cmd, "'%s' --server %s --token %s %s", KILN_CLI_PATH, base_url, admin_token,
           args);
  snprintf(out, sizeof out, "%s/%s.out", work, name);
  pid_t pid = it_spawn(cmd, out);
  assert_true(pid > 0);
  return pid;
}

static char *read_file(const char *name) {
  char path[400];
  snprintf(path, sizeof path, "%s/%s", work, name);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  char *text = calloc(1, 1 << 20);
  size_t n = fread(text, 1, (1 << 20) - 1, f);
  text[n] = '\0';
  fclose(f);
  return text;
}

/* rows rows of a, b, c in [0, 1) and y = 2a - b + c/2 + 0.3 plus noise of
 * +-0.05, so no model gets its mean absolute error near zero. */
static void write_prices(const char *name, int rows) {
  char path[400];
  snprintf(path, sizeof path, "%s/%s", work, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("a,b,c,y\n", f);
  unsigned state = 12345;
  for (int i = 0; i < rows; i++) {
    double v[4];
    for (int k = 0; k < 4; k++) {
      state = state * 1103515245u + 12345u;
      v[k] = (double)(state >> 8 & 0xffff) / 65536.0;
    }
    fprintf(f, "%.4f,%.4f,%.4f,%.4f\n", v[0], v[1], v[2],
            2 * v[0] - v[1] + 0.5 * v[2] + 0.3 + 0.1 * (v[3] - 0.5));
  }
  fclose(f);
}

/* A regression spec on data set ds: epochs, and a checkpoint policy when
 * every_steps > 0. */
static void write_spec(const char *name, const char *display_name, const char *ds, int epochs,
                       int batch, int every_steps) {
  char path[400];
  snprintf(path, sizeof path, "%s/%s", work, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f,
          "{\"display_name\":\"%s\",\"model\":{\"input_shape\":[3],\"layers\":["
          "{\"type\":\"dense\",\"units\":16,\"activation\":\"relu\"},{\"type\":\"dense\","
          "\"units\":1}]},\"loss\":\"mse\",\"metrics\":[\"mae\"],"
          "\"dataset\":{\"name\":\"%s\",\"validation_split\":0.2},"
          "\"pipeline\":{\"batch_size\":%d},\"optimizer\":{\"type\":\"adam\","
          "\"learning_rate\":0.01},\"epochs\":%d,\"seed\":3",
          display_name, ds, batch, epochs);
  if (every_steps > 0)
    fprintf(f, ",\"checkpoint\":{\"every_steps\":%d,\"keep_last\":1}", every_steps);
  fputs("}\n", f);
  fclose(f);
}

/* The job id from a "job ID STATE" line. */
static void job_id_from(const char *out, char *id) {
  const char *line = strstr(out, "job ");
  assert_non_null(line);
  assert_int_equal(sscanf(line, "job %63s", id), 1);
}

static int start_kilnd(void **state) {
  (void)state;
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-cli-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  snprintf(work, sizeof work, "%s/work", data_dir);
  if (mkdir(work, 0700) != 0) return -1;
  char data_sub[300];
  snprintf(data_sub, sizeof data_sub, "%s/data", data_dir);
  return it_launch_kilnd(KILND_PATH, data_sub, KILN_TRAIN_PATH, NULL, NULL, &kilnd_pid, base_url,
                         sizeof base_url, admin_token, sizeof admin_token);
}

static int stop_kilnd(void **state) {
  (void)state;
  if (kilnd_pid > 0) {
    kill(kilnd_pid, SIGTERM);
    waitpid(kilnd_pid, NULL, 0);
  }
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", data_dir);
  return system(cmd) == 0 ? 0 : -1;
}

static void help_documents_every_exit_code(void **state) {
  (void)state;
  char out[16384];
  assert_int_equal(cli(out, sizeof out, "--help"), 0);
  const char *codes[] = {"0  success",          "1  the job FAILED",
                         "2  usage error",      "3  the job was CANCELLED",
                         "4  --timeout passed", "5  the job SUCCEEDED but a --require was not met"};
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
    assert_non_null(strstr(out, codes[i]));
}

static void bad_command_lines_exit_2(void **state) {
  (void)state;
  char out[4096];
  write_spec("any.json", "any", "fashion-mnist", 1, 32, 0);
  const char *cases[][2] = {
      {"submit any.json --wait --timeout 5x", "--timeout must be a duration"},
      {"submit any.json --wait --timeout 0s", "--timeout must be a duration"},
      {"submit any.json --wait --require 'val_mae~1'", "must be one of >= > <= < =="},
      {"submit any.json --wait --require 'val_mae<=x'", "'x' is not a number"},
      {"submit any.json --wait --require '>=1'", "expected NAME OP VALUE"},
      {"submit any.json --require 'val_mae<=1'", "--require applies to"},
      {"submit any.json --timeout 1m", "--timeout applies to"},
      {"ls --wait", "--wait applies to 'kiln submit' and 'kiln exp create' only"},
      {"frobnicate", "unknown command 'frobnicate'"},
      {"watch", "watch takes one job id"},
      {"ckpt ls", "ckpt takes"},
      {"ckpt pin JOB abc", "a checkpoint is named by its step"},
      {"ckpt pin --id JOB 0", "a checkpoint id is a whole number"},
      {"datasets upload nothing-here.csv --label-column y", "cannot read 'nothing-here.csv'"},
      {"datasets upload any.json", "--format is needed"},
      {"submit missing.json", "cannot read spec file 'missing.json'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int status = cli(out, sizeof out, "%s", cases[i][0]);
    if (status != 2 || !strstr(out, cases[i][1]))
      fail_msg("'kiln %s' exited %d, want 2 with '%s'; said: %s", cases[i][0], status, cases[i][1],
               out);
  }
}

static void datasets_upload_and_ls(void **state) {
  (void)state;
  char out[8192];
  write_prices("prices.csv", 2000);
  assert_int_equal(cli(out, sizeof out,
                       "datasets upload prices.csv --label-column y "
                       "--display-name prices"),
                   0);
  assert_int_equal(sscanf(out, "dataset %63s", prices_id), 1);
  assert_non_null(strstr(out, "2000 examples"));
  /* Class names where a regression needs numbers: a job on it fails. */
  char path[400];
  snprintf(path, sizeof path, "%s/kinds.csv", work);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("a,b,c,kind\n", f);
  for (int i = 0; i < 40; i++) fprintf(f, "%d,%d,%d,%s\n", i, i % 7, i % 3, i % 2 ? "ash" : "oak");
  fclose(f);
  assert_int_equal(cli(out, sizeof out, "datasets upload kinds.csv --label-column kind -o json"),
                   0);
  json_t *doc = json_loads(out, 0, NULL);
  assert_non_null(doc);
  snprintf(kinds_id, sizeof kinds_id, "%s", json_string_value(json_object_get(doc, "id")));
  json_decref(doc);
  assert_int_equal(cli(out, sizeof out, "datasets ls"), 0);
  assert_non_null(strstr(out, prices_id));
  assert_non_null(strstr(out, kinds_id));
  assert_non_null(strstr(out, "fashion-mnist"));
  /* The server's refusal is a request failure: exit 1 with its message. */
  f = fopen(path, "w");
  assert_non_null(f);
  fputs("a,b,c,y\n1,2,x,4\n", f);
  fclose(f);
  assert_int_equal(cli(out, sizeof out, "datasets upload kinds.csv --label-column y"), 1);
  assert_non_null(strstr(out, "INVALID_ARGUMENT"));
}

/* Registers a kiln-agent over HTTP with an agent token an admin made. */
static void register_agent(const char *body) {
  char *answer = NULL;
  const char *role = "{\"role\":\"agent\"}";
  long status =
      it_request(base_url, admin_token, "POST", "/v1/tokens", role, strlen(role), &answer);
  json_t *doc = answer ? json_loads(answer, 0, NULL) : NULL;
  free(answer);
  assert_int_equal(status, 200);
  char secret[128];
  snprintf(secret, sizeof secret, "%s", json_string_value(json_object_get(doc, "secret")));
  json_decref(doc);
  status = it_request(base_url, secret, "POST", "/v1/agents", body, strlen(body), &answer);
  if (status != 201) fail_msg("register %s: HTTP %ld: %s", body, status, answer ? answer : "");
  free(answer);
}

/* kiln agents: none yet, then two worker hosts with their devices, one by
 * name, as JSON; a user token is refused (exit 1), a wrong verb is usage. */
static void agents_ls_and_get(void **state) {
  (void)state;
  char out[8192];
  assert_int_equal(cli(out, sizeof out, "agents"), 0);
  assert_non_null(strstr(out, "no kiln-agent has registered"));
  register_agent("{\"name\":\"host-a\",\"hostname\":\"host-a.lab\",\"pool\":\"hosts\","
                 "\"address\":\"10.77.0.2\",\"cpus\":2,\"version\":\"0.9\"}");
  register_agent("{\"name\":\"host-b\",\"pool\":\"hosts\",\"address\":\"10.77.0.3\","
                 "\"cpus\":8,\"gpus\":[{\"index\":0,\"name\":\"NVIDIA H200\",\"memory_bytes\":"
                 "150000000000},{\"index\":1,\"memory_bytes\":1}]}");
  assert_int_equal(cli(out, sizeof out, "agents ls"), 0);
  const char *heads[] = {"NAME", "HOST", "POOL", "ADDRESS", "CORES", "GPUS", "STATE", "LAST SEEN"};
  for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++)
    assert_non_null(strstr(out, heads[i]));
  /* host-a's row, then host-b's, in registration order. */
  const char *a = strstr(out, "\nhost-a "), *b = strstr(out, "\nhost-b ");
  assert_non_null(a);
  assert_non_null(b);
  assert_true(a < b);
  char name[64], host[64], pool[64], address[64], state_word[16];
  int cores = 0;
  assert_int_equal(
      sscanf(a + 1, "%63s %63s %63s %63s %d - %15s", name, host, pool, address, &cores, state_word),
      6);
  assert_string_equal(host, "host-a.lab");
  assert_string_equal(pool, "hosts");
  assert_string_equal(address, "10.77.0.2");
  assert_int_equal(cores, 2);
  assert_string_equal(state_word, "ONLINE");
  char line[512];
  snprintf(line, sizeof line, "%.*s", (int)strcspn(b + 1, "\n"), b + 1);
  assert_non_null(strstr(line, " 8 "));
  assert_non_null(strstr(line, "NVIDIA H200, GPU 1"));
  assert_non_null(strstr(line, "s ago"));

  assert_int_equal(cli(out, sizeof out, "agents get host-b"), 0);
  assert_non_null(strstr(out, "gpu 0: NVIDIA H200, 150000000000 bytes"));
  assert_non_null(strstr(out, "id: agt-"));
  assert_int_equal(cli(out, sizeof out, "agents -o json"), 0);
  json_t *doc = json_loads(out, 0, NULL);
  assert_non_null(doc);
  json_t *agents = json_object_get(doc, "agents");
  assert_int_equal(json_array_size(agents), 2);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(agents, 1), "cpus")), 8);
  json_decref(doc);

  assert_int_equal(cli(out, sizeof out, "agents get host-zz"), 1);
  assert_non_null(strstr(out, "NOT_FOUND"));
  assert_int_equal(cli(out, sizeof out, "agents frob"), 2);
  assert_non_null(strstr(out, "agents takes 'ls' (or nothing) or 'get NAME'"));
  char user[128], data_sub[300];
  snprintf(data_sub, sizeof data_sub, "%s/data", data_dir);
  assert_int_equal(it_make_token(KILND_PATH, data_sub, "acme", user, sizeof user), 0);
  assert_int_equal(cli_as(user, out, sizeof out, "agents"), 1);
  assert_non_null(strstr(out, "PERMISSION_DENIED"));
}

/* Exit 0: the job succeeded and met every bar; the bar reached 100%. */
static void a_job_that_meets_its_requirements_exits_0(void **state) {
  (void)state;
  char out[65536];
  write_spec("quick.json", "quick", prices_id, 20, 32, 0);
  int status = cli(out, sizeof out,
                   "submit quick.json --wait --timeout 10m --require 'val_mae<=0.5' "
                   "--require 'loss<1'");
  if (status != 0) fail_msg("exit %d: %s", status, out);
  job_id_from(out, done_job);
  assert_non_null(strstr(out, "SUCCEEDED"));
  assert_non_null(strstr(out, "require val_mae<=0.5: met"));
  assert_non_null(strstr(out, "require loss<1: met"));
  assert_non_null(strstr(out, "100%  epoch 20/20  step 1000/1000"));
  /* watch on a job that has ended: the history, then its end at once. */
  assert_int_equal(cli(out, sizeof out, "watch %s --timeout 1h30m", done_job), 0);
  assert_non_null(strstr(out, "SUCCEEDED"));
  /* watch -o json: one JSON object a line, the points, then the job. */
  assert_int_equal(cli(out, sizeof out, "watch %s -o json > points.jsonl", done_job), 0);
  char *lines = read_file("points.jsonl");
  int points = 0;
  json_t *last = NULL;
  for (char *line = strtok(lines, "\n"); line; line = strtok(NULL, "\n")) {
    json_decref(last);
    last = json_loads(line, 0, NULL);
    assert_non_null(last);
    points += json_object_get(last, "step") != NULL;
  }
  free(lines);
  assert_true(points >= 20 * 4); /* each epoch's loss, mae and validation at least */
  assert_string_equal(json_string_value(json_object_get(last, "state")), "SUCCEEDED");
  json_decref(last);
  assert_int_equal(cli(out, sizeof out, "get %s -o json", done_job), 0);
  json_t *job = json_loads(out, 0, NULL);
  assert_non_null(job);
  assert_string_equal(json_string_value(json_object_get(job, "state")), "SUCCEEDED");
  json_decref(job);
}

/* Exit 5: a real job that does not reach the bar, and a metric it never
 * reports. */
static void a_job_below_its_bar_exits_5(void **state) {
  (void)state;
  char out[65536];
  /* -o json: standard output is the finished job alone; the verdict on stderr. */
  int status = cli(out, sizeof out,
                   "submit quick.json --wait -o json --require 'val_mae<=0.001' > below.json");
  if (status != 5) fail_msg("exit %d: %s", status, out);
  assert_non_null(strstr(out, "require val_mae<=0.001: NOT MET (val_mae = "));
  assert_non_null(strstr(out, "1 of 1 requirement(s) not met"));
  char *text = read_file("below.json");
  json_t *job = json_loads(text, 0, NULL);
  free(text);
  assert_non_null(job);
  assert_string_equal(json_string_value(json_object_get(job, "state")), "SUCCEEDED");
  double val_mae =
      json_real_value(json_object_get(json_object_get(job, "latest_metrics"), "val_mae"));
  assert_true(val_mae > 0.001 && val_mae < 0.5);
  json_decref(job);
  status = cli(out, sizeof out, "watch %s --require 'val_accuracy>=0.88' --require 'val_mae<1'",
               done_job);
  assert_int_equal(status, 5);
  assert_non_null(strstr(out, "require val_accuracy>=0.88: NOT MET: the job reported no metric "
                              "'val_accuracy'"));
  assert_non_null(strstr(out, "require val_mae<1: met"));
}

/* Exit 1: the job failed (a regression on class names). */
static void a_failed_job_exits_1(void **state) {
  (void)state;
  char out[65536];
  write_spec("fails.json", "fails", kinds_id, 2, 32, 0);
  int status = cli(out, sizeof out, "submit fails.json --wait --require 'val_mae<1'");
  if (status != 1) fail_msg("exit %d: %s", status, out);
  assert_non_null(strstr(out, "FAILED (DATA_ERROR)"));
  assert_non_null(strstr(out, "requirements not checked: the job ended FAILED"));
  char id[64];
  job_id_from(out, id);
  assert_int_equal(cli(out, sizeof out, "logs %s", id), 0);
  assert_non_null(strstr(out, "DATA_ERROR"));
}

/* Polls `ckpt ls JOB -o json` until pick() finds a checkpoint; its id. */
static long long newest_checkpoint(const char *job, long long newer_than) {
  char out[65536];
  for (int i = 0; i < 1200; i++) {
    assert_int_equal(cli(out, sizeof out, "ckpt ls %s -o json", job), 0);
    json_t *doc = json_loads(out, 0, NULL);
    json_t *list = json_object_get(doc, "checkpoints");
    long long id = 0;
    if (json_array_size(list) > 0)
      id = json_integer_value(
          json_object_get(json_array_get(list, json_array_size(list) - 1), "id"));
    json_decref(doc);
    if (id > newer_than) return id;
    usleep(100 * 1000);
  }
  fail_msg("job %s wrote no checkpoint newer than %lld", job, newer_than);
  return -1;
}

/* Exit 4 on --timeout; a pinned checkpoint survives keep_last 1; cancel
 * ends `watch` and `logs -f` with exit 3; resume, download. */
static void timeout_pin_cancel_and_resume(void **state) {
  (void)state;
  char out[65536], job[64];
  /* 1600 training rows one at a time: 1600 steps an epoch, 16 million in
   * all, far more than the test's life (it cancels the job): it is still
   * running whenever the test acts, on any machine (at batch 32 a fast one
   * finished all 500,000 steps in 43 s). A checkpoint every 10000 steps:
   * with one every 2000, a slow machine spent the job's whole life pinning
   * checkpoints that keep_last had already removed. */
  write_spec("long.json", "long", prices_id, 10000, 1, 10000);
  int status = cli(out, sizeof out, "submit long.json --wait --timeout 2s");
  if (status != 4) fail_msg("exit %d: %s", status, out);
  job_id_from(out, job);
  assert_non_null(strstr(out, "timed out after 2s"));
  assert_non_null(strstr(out, "goes on"));
  assert_int_equal(cli(out, sizeof out, "explain %s", job), 0);
  assert_non_null(strstr(out, "RUNNING"));

  char args[256];
  snprintf(args, sizeof args, "watch %s", job);
  pid_t watcher = cli_background("watch", args);
  snprintf(args, sizeof args, "logs -f %s", job);
  pid_t follower = cli_background("logs", args);

  /* Pin the newest checkpoint; keep_last may remove it first (exit 1,
   * NOT_FOUND), then pin the next one. */
  long long pinned = 0;
  for (int i = 0; i < 100 && !pinned; i++) {
    long long id = newest_checkpoint(job, 0);
    status = cli(out, sizeof out, "ckpt pin --id %s %lld", job, id);
    if (status == 0) {
      assert_non_null(strstr(out, "pinned"));
      pinned = id;
    } else {
      assert_int_equal(status, 1);
      assert_non_null(strstr(out, "NOT_FOUND"));
    }
  }
  assert_true(pinned > 0);
  /* Two checkpoints later the pinned one is still there, beside the newest. */
  newest_checkpoint(job, newest_checkpoint(job, pinned));
  assert_int_equal(cli(out, sizeof out, "ckpt ls %s -o json", job), 0);
  json_t *doc = json_loads(out, 0, NULL);
  json_t *first = json_array_get(json_object_get(doc, "checkpoints"), 0);
  assert_int_equal(json_integer_value(json_object_get(first, "id")), pinned);
  assert_true(json_is_true(json_object_get(first, "pinned")));
  json_decref(doc);

  /* The watcher is still at it; cancel ends it, with exit 3. */
  assert_int_equal(waitpid(watcher, NULL, WNOHANG), 0);
  assert_int_equal(cli(out, sizeof out, "cancel %s", job), 0);
  assert_int_equal(it_wait_exit(watcher, 120), 3);
  assert_int_equal(it_wait_exit(follower, 120), 3);
  char *watched = read_file("watch.out");
  assert_non_null(strstr(watched, "watching job"));
  assert_non_null(strstr(watched, "epoch "));
  assert_non_null(strstr(watched, "CANCELLED"));
  free(watched);
  char *logged = read_file("logs.out");
  assert_non_null(strstr(logged, "STOPPED"));
  free(logged);

  /* The pinned checkpoint downloads, checked against its sha256. */
  assert_int_equal(
      cli(out, sizeof out, "ckpt download --id %s %lld -O pinned.safetensors", job, pinned), 0);
  assert_non_null(strstr(out, "ok"));
  char path[400];
  struct stat sb;
  snprintf(path, sizeof path, "%s/pinned.safetensors", work);
  assert_int_equal(stat(path, &sb), 0);
  assert_true(sb.st_size > 8);
  assert_int_equal(cli(out, sizeof out, "ckpt unpin --id %s %lld", job, pinned), 0);
  assert_non_null(strstr(out, "unpinned"));

  /* Resumed, it runs again: a watch with a short --timeout exits 4, and a
   * cancel ends the next watch with 3. */
  assert_int_equal(cli(out, sizeof out, "resume %s", job), 0);
  assert_int_equal(cli(out, sizeof out, "watch %s --timeout 1s", job), 4);
  assert_int_equal(cli(out, sizeof out, "cancel %s", job), 0);
  assert_int_equal(cli(out, sizeof out, "watch %s", job), 3);
  assert_non_null(strstr(out, "CANCELLED"));
  assert_int_equal(cli(out, sizeof out, "resume no-such-job"), 1);
  assert_non_null(strstr(out, "NOT_FOUND"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(help_documents_every_exit_code),
      cmocka_unit_test(bad_command_lines_exit_2),
      cmocka_unit_test(datasets_upload_and_ls),
      cmocka_unit_test(agents_ls_and_get),
      cmocka_unit_test(a_job_that_meets_its_requirements_exits_0),
      cmocka_unit_test(a_job_below_its_bar_exits_5),
      cmocka_unit_test(a_failed_job_exits_1),
      cmocka_unit_test(timeout_pin_cancel_and_resume),
  };
  return cmocka_run_group_tests(tests, start_kilnd, stop_kilnd);
}
