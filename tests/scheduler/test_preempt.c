/* test_preempt.c — preemption with stand-in trainers: a queued job of higher
 * priority stops the running one, which checkpoints on SIGTERM (as
 * kiln-train does), goes PREEMPTED then QUEUED, and after the other job
 * resumes from the step after its checkpoint; without --preempt nothing is
 * stopped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "scheduler.h"
#include "storage.h"

static char dir[256], db_path[300], jobs_dir[300], trainer[400], pools[300];

/* "quick" jobs report one point; others report 40 steps 50 ms apart with a
 * checkpoint (a file holding the step) every 10, one more at the current
 * step on SIGTERM and exit 6, and go on after the step in --resume FILE. */
static const char script[] =
    "#!/bin/sh\n"
    "spec=\"$2\"; resume=''; ckdir=''; prev=''\n"
    "for a in \"$@\"; do\n"
    "  [ \"$prev\" = --resume ] && resume=\"$a\"\n"
    "  [ \"$prev\" = --checkpoint-dir ] && ckdir=\"$a\"\n"
    "  prev=\"$a\"\n"
    "done\n"
    "if grep -q quick \"$spec\"; then echo '{\"step\":1,\"metrics\":{\"loss\":1}}' >&3; exit 0; "
    "fi\n"
    "stop=''; trap 'stop=1' TERM\n"
    "i=1\n"
    "if [ -n \"$resume\" ]; then i=$(( $(cat \"$resume\") + 1 )); fi\n"
    "while [ $i -le 40 ]; do\n"
    "  sleep 0.05\n"
    "  echo \"{\\\"step\\\":$i,\\\"metrics\\\":{\\\"loss\\\":$i}}\" >&3\n"
    "  halt=\"$stop\"\n"
    "  if [ $((i % 10)) -eq 0 -o -n \"$halt\" ]; then\n"
    "    f=\"$ckdir/ckpt-$i.safetensors\"; echo $i > \"$f\"\n"
    "    echo \"{\\\"checkpoint\\\":{\\\"step\\\":$i,\\\"path\\\":\\\"$f\\\",\\\"bytes\\\":3,"
    "\\\"sha256\\\":\\\"0000000000000000000000000000000000000000000000000000000000000000\\\"}}\" "
    ">&3\n"
    "  fi\n"
    "  if [ -n \"$halt\" ]; then exit 6; fi\n"
    "  i=$((i+1))\n"
    "done\n";

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/kiln-preempt-XXXXXX");
  if (!mkdtemp(dir)) return -1;
  snprintf(db_path, sizeof db_path, "%s/kiln.db", dir);
  snprintf(jobs_dir, sizeof jobs_dir, "%s/jobs", dir);
  snprintf(trainer, sizeof trainer, "%s/trainer.sh", dir);
  /* One device: the high job can only run where the low one is. */
  snprintf(pools, sizeof pools, "%s/pools.json", dir);
  FILE *f = fopen(pools, "w");
  if (!f) return -1;
  fputs("{\"pools\": [{\"name\": \"default\", \"devices\": [0]}]}", f);
  fclose(f);
  f = fopen(trainer, "w");
  if (!f) return -1;
  fputs(script, f);
  fclose(f);
  return chmod(trainer, 0755);
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd);
}

static void create(store *st, const char *id, int priority) {
  store_job job;
  memset(&job, 0, sizeof job);
  snprintf(job.id, sizeof job.id, "%s", id);
  char spec[64];
  snprintf(spec, sizeof spec, "{\"display_name\":\"%s\"}", id);
  job.spec_json = spec;
  job.priority = priority;
  assert_int_equal(store_job_create(st, &job, NULL), STORE_OK);
}

static int64_t count_points(store *st, const char *id, int attempt, int64_t *min_step) {
  store_metric *points;
  int n;
  assert_int_equal(store_metrics_list(st, id, NULL, &points, &n), STORE_OK);
  int64_t count = 0;
  *min_step = INT64_MAX;
  for (int i = 0; i < n; i++) {
    if (points[i].attempt != attempt) continue;
    count++;
    if (points[i].step < *min_step) *min_step = points[i].step;
  }
  free(points);
  return count;
}

static store_job wait_for(store *st, const char *id, const char *state) {
  store_job job;
  memset(&job, 0, sizeof job);
  for (int i = 0; i < 400; i++) {
    store_job_clear(&job);
    assert_int_equal(store_job_get(st, id, &job), STORE_OK);
    if (!strcmp(job.state, state)) return job;
    usleep(50 * 1000);
  }
  fail_msg("job %s is %s, not %s", id, job.state, state);
  return job;
}

static void run_with(int preempt, store **st, sched **s) {
  char err[256];
  assert_int_equal(store_open(db_path, st, err, sizeof err), STORE_OK);
  sched_config cfg = {.db_path = db_path,
                      .jobs_dir = jobs_dir,
                      .trainer_path = trainer,
                      .datasets_dir = "/nonexistent",
                      .flush_interval_ms = 50,
                      .poll_interval_ms = 50,
                      .preempt = preempt,
                      .pools_path = pools};
  assert_int_equal(sched_start(&cfg, s, err, sizeof err), 0);
}

static void higher_priority_job_preempts_and_the_preempted_one_resumes(void **state) {
  (void)state;
  store *st;
  sched *s;
  run_with(1, &st, &s);
  create(st, "low", 10);
  sched_wake(s);
  store_job job = wait_for(st, "low", "RUNNING");
  store_job_clear(&job);
  int64_t min_step;
  for (int i = 0; i < 200 && count_points(st, "low", 1, &min_step) < 12; i++) usleep(50 * 1000);
  create(st, "quick-high", 90);
  sched_wake(s);
  job = wait_for(st, "quick-high", "SUCCEEDED");
  store_job_clear(&job);
  job = wait_for(st, "low", "SUCCEEDED");
  assert_int_equal(job.attempt, 2);
  store_job_clear(&job);

  /* The stop wrote a checkpoint at the last step it reported. */
  store_checkpoint *ck;
  int n;
  assert_int_equal(store_checkpoint_list(st, "low", &ck, &n), STORE_OK);
  int64_t stopped_at = -1;
  for (int i = 0; i < n; i++)
    if (ck[i].attempt == 1) stopped_at = ck[i].step;
  store_checkpoint_list_free(ck, n);
  int64_t first = count_points(st, "low", 1, &min_step);
  assert_true(first >= 12 && first < 40);
  assert_int_equal(stopped_at, first);
  int64_t second = count_points(st, "low", 2, &min_step);
  assert_int_equal(min_step, stopped_at + 1);
  assert_int_equal(first + second, 40);

  /* RUNNING -> PREEMPTED -> QUEUED, then started again from the checkpoint;
   * the high job started while low waited. */
  store_event *events;
  assert_int_equal(store_event_list(st, "low", &events, &n), STORE_OK);
  int preempted = -1, requeued = -1, resumed = -1;
  char want[64];
  snprintf(want, sizeof want, "resuming from step %lld", (long long)stopped_at);
  for (int i = 0; i < n; i++) {
    if (!strcmp(events[i].reason, "PREEMPTED")) {
      preempted = i;
      assert_string_equal(events[i].to_state, "PREEMPTED");
      assert_non_null(strstr(events[i].message, "priority 90 outranks this one (10)"));
    }
    if (!strcmp(events[i].reason, "REQUEUED")) {
      requeued = i;
      assert_string_equal(events[i].to_state, "QUEUED");
    }
    if (strstr(events[i].message, want)) resumed = i;
  }
  store_event_list_free(events, n);
  assert_true(preempted >= 0 && requeued == preempted + 1 && resumed > requeued);
  sched_stop(s);
  store_close(st);
}

static void without_preempt_a_higher_priority_job_waits(void **state) {
  (void)state;
  store *st;
  sched *s;
  run_with(0, &st, &s);
  create(st, "low", 10);
  sched_wake(s);
  store_job job = wait_for(st, "low", "RUNNING");
  store_job_clear(&job);
  create(st, "quick-high", 90);
  sched_wake(s);
  job = wait_for(st, "low", "SUCCEEDED");
  assert_int_equal(job.attempt, 1);
  store_job_clear(&job);
  job = wait_for(st, "quick-high", "SUCCEEDED");
  store_job_clear(&job);
  int64_t min_step;
  assert_int_equal(count_points(st, "low", 1, &min_step), 40);
  sched_stop(s);
  store_close(st);
}

/* A kilnd that dies right after recording PREEMPTED must not leave the job
 * there: nothing moves a PREEMPTED job on later. A trigger makes every step
 * out of PREEMPTED fail, as a crash between two transactions would. */
static void preempted_job_goes_back_to_the_queue_in_one_transaction(void **state) {
  (void)state;
  store *st;
  sched *s;
  run_with(1, &st, &s);
  sqlite3 *db;
  assert_int_equal(sqlite3_open(db_path, &db), SQLITE_OK);
  assert_int_equal(
      sqlite3_exec(db,
                   "CREATE TRIGGER crash_after_preempted BEFORE UPDATE OF state ON jobs"
                   " WHEN OLD.state = 'PREEMPTED'"
                   " BEGIN SELECT RAISE(ABORT, 'kilnd crashed here'); END;",
                   NULL, NULL, NULL),
      SQLITE_OK);
  sqlite3_close(db);
  create(st, "low", 10);
  sched_wake(s);
  store_job job = wait_for(st, "low", "RUNNING");
  store_job_clear(&job);
  create(st, "quick-high", 90);
  sched_wake(s);
  job = wait_for(st, "quick-high", "SUCCEEDED");
  store_job_clear(&job);
  job = wait_for(st, "low", "SUCCEEDED");
  assert_int_equal(job.attempt, 2);
  assert_int_equal(job.infra_restarts, 1); /* a preemption is not a failure */
  assert_int_equal(job.restarts, 0);
  store_job_clear(&job);
  sched_stop(s);
  store_close(st);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(higher_priority_job_preempts_and_the_preempted_one_resumes,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(without_preempt_a_higher_priority_job_waits, setup, teardown),
      cmocka_unit_test_setup_teardown(preempted_job_goes_back_to_the_queue_in_one_transaction,
                                      setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
