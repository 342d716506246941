/* test_job_fields.c — the fields a job and its checkpoints derive from what
 * kilnd stores, against a real kilnd with a stand-in trainer: run_seconds
 * over every attempt of a job whose trainer was killed mid-run,
 * queue_seconds of a job that waits, progress counted in steps, the best
 * checkpoint by the spec's metric or val_loss or loss, and the completion
 * message's counts (every attempt's points, the checkpoints kept). */
#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
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
#include "stand_in_trainer.h"

static char data_dir[256];
static char base_url[64];
static pid_t kilnd_pid;
static char token[128];
static char *example_spec;

/* ---- HTTP ---- */

static long call(const char *method, const char *path, json_t **out) {
  char *data = NULL;
  long status = it_request(base_url, token, method, path, NULL, 0, &data);
  if (status == 0) fail_msg("%s %s: %s", method, path, data ? data : "no answer");
  if (out) *out = data ? json_loads(data, 0, NULL) : NULL;
  free(data);
  return status;
}

static json_t *get_job(const char *id) {
  char path[160];
  snprintf(path, sizeof path, "/v1/jobs/%s", id);
  json_t *job;
  assert_int_equal(call("GET", path, &job), 200);
  return job;
}

/* Creates a job from the example with these fields set over it (a JSON
 * object's text); its id into id (64 bytes). */
static void create(const char *name, const char *overrides, char *id) {
  json_t *spec = json_loads(example_spec, 0, NULL);
  json_t *more = json_loads(overrides ? overrides : "{}", 0, NULL);
  assert_non_null(more);
  json_object_update(spec, more);
  json_decref(more);
  json_object_set_new(spec, "display_name", json_string(name));
  char *body = json_dumps(spec, JSON_COMPACT);
  json_decref(spec);
  char *data = NULL;
  long status = it_request(base_url, token, "POST", "/v1/jobs", body, strlen(body), &data);
  free(body);
  json_t *doc = data ? json_loads(data, 0, NULL) : NULL;
  if (status != 200) fail_msg("create %s: HTTP %ld: %s", name, status, data ? data : "");
  free(data);
  snprintf(id, 64, "%s", json_string_value(json_object_get(doc, "id")));
  json_decref(doc);
}

static const char *text_at(const json_t *obj, const char *key) {
  return json_string_value(json_object_get(obj, key));
}

static const char *state_of(const json_t *job) {
  return text_at(job, "state");
}

/* Polls the job until it is in state (up to 30 s); the job then. */
static json_t *wait_state(const char *id, const char *state) {
  for (int i = 0; i < 600; i++) {
    json_t *job = get_job(id);
    if (strcmp(state_of(job), state) == 0) return job;
    json_decref(job);
    usleep(50 * 1000);
  }
  fail_msg("job %s never reached %s", id, state);
  return NULL;
}

static double number_at(const json_t *obj, const char *key) {
  const json_t *v = json_object_get(obj, key);
  if (!json_is_number(v)) fail_msg("'%s' is not a number", key);
  return json_number_value(v);
}

/* Seconds since the epoch of an RFC 3339 time with milliseconds, as kilnd writes them. */
static double seconds_of(const char *text) {
  struct tm tm;
  memset(&tm, 0, sizeof tm);
  int ms = 0;
  assert_non_null(text);
  assert_int_equal(sscanf(text, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                          &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms),
                   7);
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return (double)timegm(&tm) + ms / 1000.0;
}

/* ---- setup ---- */

static int start_kilnd(void **state) {
  (void)state;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-fields-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  char trainer[300], pools[300];
  snprintf(trainer, sizeof trainer, "%s/trainer.sh", data_dir);
  FILE *f = fopen(trainer, "w");
  if (!f) return -1;
  fputs(it_stand_in_trainer, f);
  fclose(f);
  chmod(trainer, 0755);
  /* One device: a second job waits behind the first whatever the machine has. */
  snprintf(pools, sizeof pools, "%s/pools.json", data_dir);
  f = fopen(pools, "w");
  if (!f) return -1;
  fputs("{\"pools\": [{\"name\": \"default\", \"devices\": [0]}]}", f);
  fclose(f);
  FILE *ex = fopen(EXAMPLES_DIR "/fmnist-mlp.json", "rb");
  if (!ex) return -1;
  char buf[8192];
  size_t n = fread(buf, 1, sizeof buf - 1, ex);
  fclose(ex);
  buf[n] = '\0';
  example_spec = strdup(buf);
  return it_launch_kilnd(KILND_PATH, data_dir, trainer, "--pools", pools, &kilnd_pid, base_url,
                         sizeof base_url, token, sizeof token);
}

static int stop_kilnd(void **state) {
  (void)state;
  int rc = it_stop_kilnd(kilnd_pid, data_dir);
  free(example_spec);
  curl_global_cleanup();
  return rc;
}

/* ---- tests ---- */

/* The loss points a job has reported so far, over every attempt. */
static size_t loss_points(const char *id) {
  char path[200];
  snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=loss", id);
  json_t *doc;
  assert_int_equal(call("GET", path, &doc), 200);
  size_t n = json_array_size(json_object_get(doc, "metrics"));
  json_decref(doc);
  return n;
}

/* Defect: the dashboard counted epochs, so a 1-epoch job sat at 0% until it
 * ended. progress counts steps against the trainer's plan (2 x 10). */
static void progress_counts_steps_against_the_plan(void **state) {
  (void)state;
  char id[64];
  create("steps-slow-progress", NULL, id);
  int seen = 0;
  for (int i = 0; i < 600; i++) {
    json_t *job = get_job(id);
    const json_t *progress = json_object_get(job, "progress");
    if (!json_is_object(progress)) fail_msg("job has no progress object");
    json_int_t step = json_integer_value(json_object_get(progress, "step"));
    int done = strcmp(state_of(job), "SUCCEEDED") == 0;
    if (!done && step > 0 && step < 20) {
      assert_int_equal(json_integer_value(json_object_get(progress, "total_steps")), 20);
      assert_int_equal(json_integer_value(json_object_get(progress, "epochs")), 2);
      assert_int_equal(json_integer_value(json_object_get(progress, "epoch")), (step - 1) / 10 + 1);
      assert_float_equal(number_at(progress, "fraction"), (double)step / 20.0, 1e-9);
      seen++;
    }
    json_decref(job);
    if (done) break;
    usleep(50 * 1000);
  }
  assert_true(seen >= 5);
  json_t *job = get_job(id);
  assert_string_equal(state_of(job), "SUCCEEDED");
  const json_t *progress = json_object_get(job, "progress");
  assert_int_equal(json_integer_value(json_object_get(progress, "step")), 20);
  assert_int_equal(json_integer_value(json_object_get(progress, "epoch")), 2);
  assert_int_equal(json_integer_value(json_object_get(progress, "total_steps")), 20);
  assert_float_equal(number_at(progress, "fraction"), 1.0, 0);
  json_decref(job);
}

/* Defect: a resumed job's duration counted only its last attempt. The
 * trainer is killed after 10 steps of 0.1 s; the retry resumes from a
 * checkpoint; run_seconds holds both attempts, queue_seconds the backoff. */
static void run_seconds_sums_every_attempt_of_a_resumed_job(void **state) {
  (void)state;
  char id[64], pid_path[400];
  create("steps-slow-killed", "{\"max_restarts\":1}", id);
  snprintf(pid_path, sizeof pid_path, "%s/jobs/%s/checkpoints/pid", data_dir, id);
  for (int i = 0; i < 600 && loss_points(id) < 10; i++) usleep(20 * 1000);
  assert_true(loss_points(id) >= 10);
  FILE *f = fopen(pid_path, "r");
  assert_non_null(f);
  int pid = 0;
  assert_int_equal(fscanf(f, "%d", &pid), 1);
  fclose(f);
  assert_int_equal(kill(pid, SIGKILL), 0);

  json_t *job = wait_state(id, "SUCCEEDED");
  assert_int_equal(json_integer_value(json_object_get(job, "attempt")), 2);
  double end = seconds_of(text_at(job, "end_time"));
  double last_attempt = end - seconds_of(text_at(job, "start_time"));
  double lifetime = end - seconds_of(text_at(job, "create_time"));
  double run = number_at(job, "run_seconds"), queued = number_at(job, "queue_seconds");
  print_message("run_seconds %.3f, queue_seconds %.3f, last attempt %.3f, lifetime %.3f\n", run,
                queued, last_attempt, lifetime);
  /* The first attempt trained 10 steps of 0.1 s before it was killed. */
  assert_true(run >= last_attempt + 1.0);
  /* The retry waited out a 1 s backoff in the queue. */
  assert_true(queued >= 1.0);
  assert_true(run + queued <= lifetime + 0.002);
  /* Finished: the times no longer move. */
  usleep(300 * 1000);
  json_t *again = get_job(id);
  assert_float_equal(number_at(again, "run_seconds"), run, 0);
  assert_float_equal(number_at(again, "queue_seconds"), queued, 0);
  json_decref(again);
  json_decref(job);
}

/* Defect: the completion message counted only the last attempt's points. */
static void the_completion_message_counts_every_attempts_points(void **state) {
  (void)state;
  json_t *list;
  assert_int_equal(call("GET", "/v1/jobs?filter=state%3DSUCCEEDED", &list), 200);
  json_t *job = json_array_get(json_object_get(list, "jobs"), 0); /* the newest: the killed one */
  assert_non_null(job);
  assert_int_equal(json_integer_value(json_object_get(job, "attempt")), 2);
  char path[200];
  snprintf(path, sizeof path, "/v1/jobs/%s/metrics", text_at(job, "id"));
  json_t *metrics;
  assert_int_equal(call("GET", path, &metrics), 200);
  size_t points = json_array_size(json_object_get(metrics, "metrics"));
  int first_attempt = 0;
  size_t i;
  json_t *p;
  json_array_foreach(json_object_get(metrics, "metrics"), i, p) {
    first_attempt += json_integer_value(json_object_get(p, "attempt")) == 1;
  }
  assert_true(first_attempt >= 10);
  char want[128];
  snprintf(want, sizeof want, "trained: %zu metric points, 10 checkpoint(s)", points);
  assert_string_equal(text_at(job, "message"), want);
  json_decref(metrics);
  json_decref(list);
}

/* Defect: a job that waits showed its wait as its duration; queue_seconds
 * says what it is, and grows while it waits. */
static void queue_seconds_of_a_waiting_job_grows_and_run_seconds_stays_zero(void **state) {
  (void)state;
  char sleeper[64], waiter[64];
  create("sleeper-1", NULL, sleeper);
  json_decref(wait_state(sleeper, "RUNNING"));
  create("steps-waiting", NULL, waiter);
  usleep(1200 * 1000);
  json_t *job = get_job(waiter);
  assert_string_equal(state_of(job), "QUEUED");
  double first = number_at(job, "queue_seconds");
  assert_true(first >= 1.1);
  assert_float_equal(number_at(job, "run_seconds"), 0, 0);
  const json_t *progress = json_object_get(job, "progress");
  assert_int_equal(json_integer_value(json_object_get(progress, "step")), 0);
  assert_int_equal(json_integer_value(json_object_get(progress, "epochs")), 2);
  assert_null(json_object_get(progress, "total_steps")); /* no plan yet */
  assert_null(json_object_get(progress, "fraction"));
  json_decref(job);
  /* No write in between: the answer is not kept past its time. */
  usleep(400 * 1000);
  job = get_job(waiter);
  assert_true(number_at(job, "queue_seconds") >= first + 0.3);
  json_decref(job);
  /* The running sleeper's run_seconds grows too. */
  job = get_job(sleeper);
  assert_true(number_at(job, "run_seconds") >= 1.5);
  json_decref(job);

  char path[160];
  snprintf(path, sizeof path, "/v1/jobs/%s:cancel", sleeper);
  assert_int_equal(call("POST", path, &job), 200);
  json_decref(job);
  job = wait_state(waiter, "SUCCEEDED");
  assert_true(number_at(job, "queue_seconds") >= first + 0.3);
  assert_true(number_at(job, "run_seconds") > 0);
  json_decref(job);
}

/* The checkpoints of a job, with best checked to be on at most one. */
static json_t *checkpoints_of(const char *id, int *best_step) {
  char path[200];
  snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", id);
  json_t *doc;
  assert_int_equal(call("GET", path, &doc), 200);
  *best_step = -1;
  size_t i;
  json_t *c;
  json_array_foreach(json_object_get(doc, "checkpoints"), i, c) {
    const json_t *best = json_object_get(c, "best");
    if (!json_is_boolean(best)) fail_msg("checkpoint %zu has no boolean 'best'", i);
    if (json_is_true(best)) {
      assert_int_equal(*best_step, -1);
      *best_step = (int)json_integer_value(json_object_get(c, "step"));
    }
  }
  return doc;
}

static void the_best_checkpoint_is_ranked_by_val_loss_or_the_specs_metric(void **state) {
  (void)state;
  char by_val[64], by_spec[64], by_none[64];
  create("steps-by-val-loss", NULL, by_val);
  create("steps-by-spec",
         "{\"checkpoint\":{\"keep_last\":1,\"keep_best\":1,\"monitor\":\"loss\",\"mode\":\"max\"}}",
         by_spec);
  create("steps-by-nothing",
         "{\"checkpoint\":{\"keep_last\":3,\"keep_best\":1,\"monitor\":\"val_accuracy\"}}",
         by_none);
  json_decref(wait_state(by_none, "SUCCEEDED"));

  /* No policy: val_loss, lower better; lowest at step 8 of 10 checkpoints. */
  int best = 0;
  json_t *doc = checkpoints_of(by_val, &best);
  assert_int_equal(json_array_size(json_object_get(doc, "checkpoints")), 10);
  assert_int_equal(best, 8);
  assert_string_equal(text_at(doc, "best_metric"), "val_loss");
  assert_string_equal(text_at(doc, "best_mode"), "min");
  /* One checkpoint alone says the same. */
  char path[200];
  json_t *one;
  size_t i;
  json_t *c;
  json_array_foreach(json_object_get(doc, "checkpoints"), i, c) {
    snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints/%lld", by_val,
             (long long)json_integer_value(json_object_get(c, "id")));
    assert_int_equal(call("GET", path, &one), 200);
    assert_int_equal(json_is_true(json_object_get(one, "best")),
                     json_integer_value(json_object_get(c, "step")) == 8);
    json_decref(one);
  }
  json_decref(doc);

  /* keep_best's metric and mode: the highest loss, at step 2, kept beside the newest. */
  doc = checkpoints_of(by_spec, &best);
  assert_int_equal(json_array_size(json_object_get(doc, "checkpoints")), 2);
  assert_int_equal(best, 2);
  assert_string_equal(text_at(doc, "best_metric"), "loss");
  assert_string_equal(text_at(doc, "best_mode"), "max");
  json_t *kept = json_array_get(json_object_get(doc, "checkpoints"), 0);
  snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints/%lld", by_spec,
           (long long)json_integer_value(json_object_get(kept, "id")));
  assert_int_equal(call("GET", path, &one), 200);
  assert_true(json_is_true(json_object_get(one, "best")));
  json_decref(one);
  json_decref(doc);

  /* A metric no checkpoint carries: none is best. */
  doc = checkpoints_of(by_none, &best);
  assert_int_equal(best, -1);
  assert_int_equal(json_array_size(json_object_get(doc, "checkpoints")), 3);
  assert_null(json_object_get(doc, "best_metric"));
  json_decref(doc);
}

/* Defect: the message counted the 10 checkpoints written where keep_last kept 3. */
static void the_completion_message_counts_the_checkpoints_kept(void **state) {
  (void)state;
  char id[64];
  create("steps-keep-3", "{\"checkpoint\":{\"keep_last\":3}}", id);
  json_t *job = wait_state(id, "SUCCEEDED");
  assert_string_equal(text_at(job, "message"), "trained: 30 metric points, 3 checkpoint(s)");
  json_decref(job);
  int best = 0;
  json_t *doc = checkpoints_of(id, &best);
  assert_int_equal(json_array_size(json_object_get(doc, "checkpoints")), 3);
  json_decref(doc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(progress_counts_steps_against_the_plan),
      cmocka_unit_test(run_seconds_sums_every_attempt_of_a_resumed_job),
      cmocka_unit_test(the_completion_message_counts_every_attempts_points),
      cmocka_unit_test(the_completion_message_counts_the_checkpoints_kept),
      cmocka_unit_test(the_best_checkpoint_is_ranked_by_val_loss_or_the_specs_metric),
      /* last: its sleeper holds the one device until it is cancelled */
      cmocka_unit_test(queue_seconds_of_a_waiting_job_grows_and_run_seconds_stays_zero),
  };
  return cmocka_run_group_tests(tests, start_kilnd, stop_kilnd);
}
