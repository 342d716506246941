/* The scheduler against stand-in trainers (small shell scripts that write
 * progress lines and exit as told): metrics and checkpoints reach the store,
 * and every way a trainer can end sets the right state and reason. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "scheduler.h"
#include "storage.h"

static char dir[256], db_path[300], jobs_dir[300];

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/kiln-sched-XXXXXX");
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

/* Writes an executable stand-in trainer whose body is `script`. */
static void write_trainer(const char *path, const char *script) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "#!/bin/sh\n%s\n", script);
  fclose(f);
  chmod(path, 0755);
}

/* Writes trainer-TAG.sh with `script` into trainer (400 bytes), opens
 * the store and queues job-TAG in it; the scheduler's config for them. */
static store *queue_one(const char *tag, const char *script, char *trainer, store_job *job,
                        sched_config *cfg) {
  snprintf(trainer, 400, "%s/trainer-%s.sh", dir, tag);
  write_trainer(trainer, script);
  store *st;
  char err[256];
  assert_int_equal(store_open(db_path, &st, err, sizeof err), STORE_OK);
  memset(job, 0, sizeof *job);
  snprintf(job->id, sizeof job->id, "job-%s", tag);
  snprintf(job->display_name, sizeof job->display_name, "%s", tag);
  job->spec_json = "{\"display_name\":\"x\"}";
  job->priority = 50;
  assert_int_equal(store_job_create(st, job, NULL), STORE_OK);
  *cfg = (sched_config){.db_path = db_path,
                        .jobs_dir = jobs_dir,
                        .trainer_path = trainer,
                        .datasets_dir = "/nonexistent",
                        .flush_interval_ms = 50,
                        .poll_interval_ms = 50};
  return st;
}

/* Creates one job, runs the scheduler with `script` until the job ends,
 * and returns the job as stored. */
static store_job run_one(const char *tag, const char *script) {
  char trainer[400], err[256];
  store_job job;
  sched_config cfg;
  store *st = queue_one(tag, script, trainer, &job, &cfg);
  sched *s;
  assert_int_equal(sched_start(&cfg, &s, err, sizeof err), 0);
  sched_wake(s);
  store_job out;
  memset(&out, 0, sizeof out);
  for (int i = 0; i < 200; i++) { /* up to 10 s */
    store_job_clear(&out);
    assert_int_equal(store_job_get(st, job.id, &out), STORE_OK);
    if (!strcmp(out.state, "SUCCEEDED") || !strcmp(out.state, "FAILED")) break;
    usleep(50 * 1000);
  }
  sched_stop(s);
  store_close(st);
  return out;
}

static void progress_lines_become_metrics_and_checkpoints(void **state) {
  (void)state;
  store_job job = run_one(
      "ok", "echo '{\"status\":{\"phase\":\"training\",\"message\":\"go\"}}' >&3\n"
            "echo '{\"step\":10,\"epoch\":1,\"metrics\":{\"loss\":0.5,\"accuracy\":0.75}}' >&3\n"
            "echo 'this is not json' >&3\n"
            "echo '{\"step\":20,\"epoch\":1,\"metrics\":{\"val_accuracy\":0.875}}' >&3\n"
            "echo '{\"checkpoint\":{\"step\":20,\"path\":\"/x/ckpt.safetensors\",\"bytes\":123,"
            "\"sha256\":\""
            "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
            "\"}}' >&3\n"
            "echo 'some log text' >&2\n"
            "exit 0");
  assert_string_equal(job.state, "SUCCEEDED");
  assert_string_equal(job.reason, "COMPLETED");
  assert_int_equal(job.attempt, 1);
  assert_string_equal(job.message, "trained: 3 metric points, 1 checkpoint(s)");
  store *st;
  char err[256];
  assert_int_equal(store_open(db_path, &st, err, sizeof err), STORE_OK);
  store_metric *points;
  int n;
  assert_int_equal(store_metrics_list(st, job.id, NULL, &points, &n), STORE_OK);
  assert_int_equal(n, 3);
  assert_string_equal(points[0].name, "accuracy");
  assert_float_equal(points[0].value, 0.75, 0);
  assert_int_equal(points[0].step, 10);
  assert_int_equal(points[0].epoch, 1);
  assert_int_equal(points[0].attempt, 1);
  assert_string_equal(points[2].name, "val_accuracy");
  free(points);
  store_checkpoint *ck;
  assert_int_equal(store_checkpoint_list(st, job.id, &ck, &n), STORE_OK);
  assert_int_equal(n, 1);
  assert_string_equal(ck[0].path, "/x/ckpt.safetensors");
  assert_int_equal(ck[0].bytes, 123);
  assert_int_equal(ck[0].step, 20);
  store_checkpoint_list_free(ck, n);
  store_close(st);
  /* The trainer's stderr is kept with the job, and its spec was written. */
  char path[600];
  snprintf(path, sizeof path, "%s/%s/train.log", jobs_dir, job.id);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[128] = "";
  assert_non_null(fgets(line, sizeof line, f));
  fclose(f);
  assert_string_equal(line, "some log text\n");
  snprintf(path, sizeof path, "%s/%s/spec.json", jobs_dir, job.id);
  assert_int_equal(access(path, R_OK), 0);
  store_job_clear(&job);
}

static void trainer_error_line_sets_failed_with_its_reason(void **state) {
  (void)state;
  store_job job =
      run_one("dataerr",
              "echo '{\"error\":{\"reason\":\"DATA_ERROR\",\"message\":\"x.gz: truncated\"}}' >&3\n"
              "exit 4");
  assert_string_equal(job.state, "FAILED");
  assert_string_equal(job.reason, "DATA_ERROR");
  assert_string_equal(job.message, "x.gz: truncated");
  store_job_clear(&job);
}

static void trainer_killed_by_a_signal_is_named(void **state) {
  (void)state;
  store_job job = run_one("killed", "kill -KILL $$");
  assert_string_equal(job.state, "FAILED");
  assert_string_equal(job.reason, "TRAINER_KILLED");
  assert_non_null(strstr(job.message, "signal 9"));
  store_job_clear(&job);
}

static void trainer_exit_without_a_reason_points_to_its_log(void **state) {
  (void)state;
  store_job job = run_one("exit3", "exit 3");
  assert_string_equal(job.state, "FAILED");
  assert_string_equal(job.reason, "TRAINER_EXITED");
  assert_non_null(strstr(job.message, "status 3"));
  assert_non_null(strstr(job.message, "/logs")); /* its log by API route, not a server path */
  store_job_clear(&job);
}

/* kiln-train exits 5 for a numeric failure (a NaN loss, a diverged
 * mixed_float16 run): even when its reason line was lost, the job fails
 * with NUMERIC_ERROR and is not retried, since a retry diverges again. */
static void trainer_exit_5_without_a_line_is_a_numeric_error(void **state) {
  (void)state;
  store_job job = run_one("numeric", "exit 5");
  assert_string_equal(job.state, "FAILED");
  assert_string_equal(job.reason, "NUMERIC_ERROR");
  assert_non_null(strstr(job.message, "status 5"));
  assert_non_null(strstr(job.message, "/logs")); /* its log by API route, not a server path */
  store_job_clear(&job);
}

static void missing_trainer_is_refused_at_start(void **state) {
  (void)state;
  sched_config cfg = {.db_path = db_path,
                      .jobs_dir = jobs_dir,
                      .trainer_path = "/nonexistent/kiln-train",
                      .datasets_dir = "/"};
  sched *s = NULL;
  char err[256];
  assert_int_equal(sched_start(&cfg, &s, err, sizeof err), -1);
  assert_null(s);
  assert_non_null(strstr(err, "/nonexistent/kiln-train"));
}

/* Holds the scheduler thread at its shutdown log line, after it reaped and
 * before it waits for the runners left: the runner ends in that time. */
static atomic_int held_at_stop;

static void hold_at_stop(sched_log_level level, const char *line, void *user) {
  (void)level;
  (void)user;
  if (strstr(line, "waiting for trainers to stop") && !atomic_exchange(&held_at_stop, 1))
    usleep(1000 * 1000);
}

typedef struct stopper {
  sched *s;
  atomic_int returned;
} stopper;

static void *stop_scheduler(void *arg) {
  stopper *p = arg;
  sched_stop(p->s);
  atomic_store(&p->returned, 1);
  return NULL;
}

/* A runner that ends between the scheduler's last look at its runs and its
 * wait for them has signalled already: the wait must not need that signal. */
static void stopping_returns_when_a_runner_ends_before_the_wait(void **state) {
  (void)state;
  /* It takes 0.4 s to stop, more than the scheduler's longest pause, so the
   * scheduler reaches its wait first; its shutdown line holds it longer. */
  char trainer[400], err[256];
  store_job job;
  sched_config cfg;
  store *st = queue_one("stop",
                        "echo '{\"status\":{\"phase\":\"training\",\"message\":\"go\"}}' >&3\n"
                        "trap 'sleep 0.4; exit 0' TERM\n"
                        "while :; do sleep 0.05; done",
                        trainer, &job, &cfg);
  cfg.log = hold_at_stop;
  stopper p = {0};
  assert_int_equal(sched_start(&cfg, &p.s, err, sizeof err), 0);
  sched_wake(p.s);
  store_job out;
  memset(&out, 0, sizeof out);
  for (int i = 0; i < 200 && strcmp(out.state, "RUNNING") != 0; i++) { /* up to 10 s */
    store_job_clear(&out);
    assert_int_equal(store_job_get(st, job.id, &out), STORE_OK);
    usleep(50 * 1000);
  }
  assert_string_equal(out.state, "RUNNING");
  store_job_clear(&out);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, stop_scheduler, &p), 0);
  for (int i = 0; i < 150 && !atomic_load(&p.returned); i++) /* up to 15 s */
    usleep(100 * 1000);
  if (!atomic_load(&p.returned))
    fail_msg("sched_stop has not returned in 15 s: the runner ended before the scheduler's "
             "wait, and the wait needed its signal");
  pthread_join(t, NULL);
  assert_int_equal(atomic_load(&held_at_stop), 1);
  assert_int_equal(store_job_get(st, job.id, &out), STORE_OK);
  assert_string_equal(out.state, "QUEUED");
  assert_string_equal(out.reason, "SERVER_SHUTDOWN");
  store_job_clear(&out);
  store_close(st);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(progress_lines_become_metrics_and_checkpoints),
      cmocka_unit_test(trainer_error_line_sets_failed_with_its_reason),
      cmocka_unit_test(trainer_killed_by_a_signal_is_named),
      cmocka_unit_test(trainer_exit_without_a_reason_points_to_its_log),
      cmocka_unit_test(trainer_exit_5_without_a_line_is_a_numeric_error),
      cmocka_unit_test(missing_trainer_is_refused_at_start),
      /* last: where it fails, the scheduler thread it stopped is left waiting */
      cmocka_unit_test(stopping_returns_when_a_runner_ends_before_the_wait),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
