/* test_service.c — the scheduler's service rules with stand-in trainers:
 * a crashed run is retried after a backoff up to max_restarts, with each
 * attempt's metrics kept apart; max_runtime stops a run; a cancel stops the
 * running job and ends it CANCELLED. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "scheduler.h"
#include "storage.h"

static char dir[256], db_path[300], jobs_dir[300];

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/kiln-sched-svc-XXXXXX");
  if (!mkdtemp(dir)) return -1;
  snprintf(db_path, sizeof db_path, "%s/kiln.db", dir);
  snprintf(jobs_dir, sizeof jobs_dir, "%s/jobs", dir);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd);
}

/* The example spec with key set to a JSON value. */
static char *spec_with(const char *key, const char *value) {
  json_t *spec = json_load_file(EXAMPLES_DIR "/fmnist-mlp.json", 0, NULL);
  assert_non_null(spec);
  json_object_set_new(spec, key, json_loads(value, JSON_DECODE_ANY, NULL));
  char *text = json_dumps(spec, JSON_COMPACT);
  json_decref(spec);
  return text;
}

typedef struct harness {
  store *st;
  sched *s;
  char trainer[400]; /* the scheduler keeps pointing at it */
} harness;

static void start(harness *h, const char *tag, const char *script, const char *spec_json) {
  char *trainer = h->trainer, err[256];
  snprintf(h->trainer, sizeof h->trainer, "%s/trainer-%s.sh", dir, tag);
  FILE *f = fopen(trainer, "w");
  assert_non_null(f);
  fprintf(f, "#!/bin/sh\n%s\n", script);
  fclose(f);
  chmod(trainer, 0755);
  assert_int_equal(store_open(db_path, &h->st, err, sizeof err), STORE_OK);
  store_job job;
  memset(&job, 0, sizeof job);
  snprintf(job.id, sizeof job.id, "job-%s", tag);
  job.spec_json = (char *)spec_json;
  job.priority = 50;
  assert_int_equal(store_job_create(h->st, &job, NULL), STORE_OK);
  sched_config cfg = {.db_path = db_path,
                      .jobs_dir = jobs_dir,
                      .trainer_path = trainer,
                      .datasets_dir = "/nonexistent",
                      .flush_interval_ms = 50,
                      .poll_interval_ms = 50};
  assert_int_equal(sched_start(&cfg, &h->s, err, sizeof err), 0);
  sched_wake(h->s);
}

/* Polls until the job is in state (up to timeout_s); returns it. */
static store_job wait_for(harness *h, const char *id, const char *state, int timeout_s) {
  store_job job;
  memset(&job, 0, sizeof job);
  for (int i = 0; i < timeout_s * 20; i++) {
    store_job_clear(&job);
    assert_int_equal(store_job_get(h->st, id, &job), STORE_OK);
    if (!strcmp(job.state, state)) return job;
    usleep(50 * 1000);
  }
  fail_msg("job %s is %s, not %s, after %d s", id, job.state, state, timeout_s);
  return job;
}

static void stop(harness *h) {
  sched_stop(h->s);
  store_close(h->st);
}

static void crash_is_retried_after_backoff_up_to_max_restarts(void **state) {
  (void)state;
  harness h;
  char *spec = spec_with("max_restarts", "1");
  start(&h, "crashy", "echo '{\"step\":1,\"epoch\":1,\"metrics\":{\"loss\":2}}' >&3\nkill -KILL $$",
        spec);
  free(spec);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  store_job job = wait_for(&h, "job-crashy", "FAILED", 20);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (strcmp(job.reason, "TRAINER_KILLED") != 0) fail_msg("%s: %s", job.reason, job.message);
  assert_int_equal(job.attempt, 2);
  store_job_clear(&job);
  /* The second start waited out the 1 s backoff. */
  assert_true((double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9 >= 1.0);
  store_event *events;
  int n, retries = 0;
  assert_int_equal(store_event_list(h.st, "job-crashy", &events, &n), STORE_OK);
  for (int i = 0; i < n; i++) {
    if (!strcmp(events[i].reason, "RETRYING")) {
      retries++;
      assert_string_equal(events[i].to_state, "QUEUED");
      assert_non_null(strstr(events[i].message, "restart 1 of 1"));
    }
  }
  store_event_list_free(events, n);
  assert_int_equal(retries, 1);
  /* Each attempt's point is kept under its own attempt: none lost, none doubled. */
  store_metric *points;
  assert_int_equal(store_metrics_list(h.st, "job-crashy", NULL, &points, &n), STORE_OK);
  assert_int_equal(n, 2);
  assert_int_equal(points[0].attempt, 1);
  assert_int_equal(points[1].attempt, 2);
  assert_int_equal(points[0].step, 1);
  assert_int_equal(points[1].step, 1);
  free(points);
  stop(&h);
}

static void max_runtime_stops_a_run_that_takes_too_long(void **state) {
  (void)state;
  harness h;
  char *spec = spec_with("max_runtime", "1");
  start(&h, "slow", "exec sleep 30", spec);
  free(spec);
  store_job job = wait_for(&h, "job-slow", "FAILED", 10);
  assert_string_equal(job.reason, "DEADLINE_EXCEEDED");
  assert_non_null(strstr(job.message, "max_runtime 1 s"));
  assert_int_equal(job.attempt, 1); /* a deadline is not a crash: no retry */
  store_job_clear(&job);
  stop(&h);
}

static void cancel_stops_the_running_job(void **state) {
  (void)state;
  harness h;
  char *spec = spec_with("max_restarts", "3");
  start(&h, "long", "exec sleep 30", spec);
  free(spec);
  store_job job = wait_for(&h, "job-long", "RUNNING", 10);
  store_job_clear(&job);
  sched_cancel(h.s, "job-long");
  job = wait_for(&h, "job-long", "CANCELLED", 10);
  assert_string_equal(job.reason, "CANCELLED");
  assert_int_equal(job.attempt, 1); /* cancelled, not retried */
  store_job_clear(&job);
  store_event *events;
  int n, stopping = 0;
  assert_int_equal(store_event_list(h.st, "job-long", &events, &n), STORE_OK);
  for (int i = 0; i < n; i++) stopping += !strcmp(events[i].to_state, "STOPPING");
  store_event_list_free(events, n);
  assert_int_equal(stopping, 1);
  sched_stats stats;
  sched_get_stats(h.s, &stats);
  assert_int_equal(stats.running_jobs, 0);
  assert_int_equal(stats.jobs_started, 1);
  stop(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(crash_is_retried_after_backoff_up_to_max_restarts, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(max_runtime_stops_a_run_that_takes_too_long, setup, teardown),
      cmocka_unit_test_setup_teardown(cancel_stops_the_running_job, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
