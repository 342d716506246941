/* test_service.c — the scheduler's service rules with stand-in trainers:
 * a crashed run is retried after a backoff up to max_restarts, with each
 * attempt's metrics kept apart; max_runtime stops a run; a cancel stops the
 * running job and ends it CANCELLED; checkpoints record the metrics and
 * keep_best keeps the best; jobs run side by side, each pinned to its own
 * cores, and a gang waits for all its devices at once. */
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

static void add_job(harness *h, const char *id, int devices, const char *spec_json) {
  store_job job;
  memset(&job, 0, sizeof job);
  snprintf(job.id, sizeof job.id, "%s", id);
  job.spec_json = (char *)spec_json;
  job.priority = 50;
  job.devices = devices;
  assert_int_equal(store_job_create(h->st, &job, NULL), STORE_OK);
}

/* Writes the stand-in trainer, opens the store, queues job-TAG (when
 * spec_json is given) and starts the scheduler on pools (NULL = default). */
static void start_on(harness *h, const char *tag, const char *script, const char *spec_json,
                     const char *pools) {
  char *trainer = h->trainer, err[256];
  snprintf(h->trainer, sizeof h->trainer, "%s/trainer-%s.sh", dir, tag);
  FILE *f = fopen(trainer, "w");
  assert_non_null(f);
  fprintf(f, "#!/bin/sh\n%s\n", script);
  fclose(f);
  chmod(trainer, 0755);
  assert_int_equal(store_open(db_path, &h->st, err, sizeof err), STORE_OK);
  char id[64];
  snprintf(id, sizeof id, "job-%s", tag);
  if (spec_json) add_job(h, id, 1, spec_json);
  sched_config cfg = {.db_path = db_path,
                      .jobs_dir = jobs_dir,
                      .trainer_path = trainer,
                      .datasets_dir = "/nonexistent",
                      .flush_interval_ms = 50,
                      .poll_interval_ms = 50,
                      .pools_path = pools};
  assert_int_equal(sched_start(&cfg, &h->s, err, sizeof err), 0);
  sched_wake(h->s);
}

static void start(harness *h, const char *tag, const char *script, const char *spec_json) {
  start_on(h, tag, script, spec_json, NULL);
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

/* A job whose kilnd stopped under it was restarted by the infrastructure,
 * not by a failure of its own: max_restarts counts only the failures. */
static void server_restart_does_not_count_against_max_restarts(void **state) {
  (void)state;
  harness h;
  char err[256];
  char *spec = spec_with("max_restarts", "1");
  assert_int_equal(store_open(db_path, &h.st, err, sizeof err), STORE_OK);
  add_job(&h, "job-restarted", 1, spec);
  free(spec);
  /* It ran (attempt 1) when the previous kilnd went away. */
  store_job job;
  assert_int_equal(store_job_claim(h.st, "job-restarted", &job), STORE_OK);
  store_job_clear(&job);
  assert_int_equal(
      store_job_transition(h.st, "job-restarted", "STARTING", "RUNNING", "STARTED", "pid 1"),
      STORE_OK);
  store_close(h.st);
  start(&h, "restarted", "kill -KILL $$", NULL);
  job = wait_for(&h, "job-restarted", "FAILED", 20);
  if (strcmp(job.reason, "TRAINER_KILLED") != 0) fail_msg("%s: %s", job.reason, job.message);
  /* attempt 2 crashed and was retried (restart 1 of 1); attempt 3 crashed and failed. */
  assert_int_equal(job.attempt, 3);
  assert_int_equal(job.restarts, 1);
  assert_int_equal(job.infra_restarts, 1);
  store_job_clear(&job);
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
  for (int i = 0; i < 100; i++) { /* its devices come back once its runner is joined */
    sched_get_stats(h.s, &stats);
    if (stats.running_jobs == 0) break;
    usleep(50 * 1000);
  }
  assert_int_equal(stats.running_jobs, 0);
  assert_int_equal(stats.jobs_started, 1);
  stop(&h);
}

/* The stand-in reports val_loss 0.5, 0.2, 0.9 with a checkpoint after each. */
static const char checkpointing_trainer[] =
    "ck=''; prev=''\n"
    "for a in \"$@\"; do [ \"$prev\" = --checkpoint-dir ] && ck=\"$a\"; prev=\"$a\"; done\n"
    "i=1\n"
    "for v in 0.5 0.2 0.9; do\n"
    "  echo "
    "\"{\\\"step\\\":$i,\\\"epoch\\\":$i,\\\"metrics\\\":{\\\"loss\\\":1,\\\"val_loss\\\":$v}}\" "
    ">&3\n"
    "  f=\"$ck/ckpt-$i.safetensors\"; echo $i > \"$f\"\n"
    "  echo \"{\\\"checkpoint\\\":{\\\"step\\\":$i,\\\"path\\\":\\\"$f\\\",\\\"bytes\\\":2,"
    "\\\"sha256\\\":\\\"0000000000000000000000000000000000000000000000000000000000000000\\\"}}\" "
    ">&3\n"
    "  i=$((i+1))\n"
    "done\n";

static void checkpoints_record_metrics_and_keep_best_keeps_the_best(void **state) {
  (void)state;
  harness h;
  char *spec =
      spec_with("checkpoint", "{\"every_steps\":1,\"keep_best\":1,\"monitor\":\"val_loss\"}");
  start(&h, "best", checkpointing_trainer, spec);
  free(spec);
  store_job job = wait_for(&h, "job-best", "SUCCEEDED", 20);
  store_job_clear(&job);
  store_checkpoint *ck;
  int n;
  assert_int_equal(store_checkpoint_list(h.st, "job-best", &ck, &n), STORE_OK);
  /* The best (step 2, val_loss 0.2) and the newest (step 3) stay. */
  assert_int_equal(n, 2);
  assert_int_equal(ck[0].step, 2);
  assert_int_equal(ck[1].step, 3);
  assert_non_null(strstr(ck[0].metrics_json, "\"val_loss\":0.2"));
  assert_non_null(strstr(ck[1].metrics_json, "\"val_loss\":0.9"));
  char gone[600];
  snprintf(gone, sizeof gone, "%s/job-best/checkpoints/ckpt-1.safetensors", jobs_dir);
  assert_int_not_equal(access(gone, F_OK), 0); /* its file went with its row */
  assert_int_equal(access(ck[0].path, F_OK), 0);
  store_checkpoint_list_free(ck, n);
  stop(&h);
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  static char text[256];
  size_t got = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[got] = '\0';
  text[strcspn(text, "\n")] = '\0';
  return text;
}

/* Each stand-in writes the devices it was given and the cores it may run
 * on, then waits for a go file so the test sees them run together. */
static void jobs_run_side_by_side_on_their_own_cores_and_a_gang_waits_for_all(void **state) {
  (void)state;
  sched_inventory inv;
  sched_inventory_detect(&inv);
  if (inv.cpus < 2) {
    print_message("SKIPPED: needs two cores to share out, this machine has %d\n", inv.cpus);
    skip();
  }
  char pools[400], go[400], path[600];
  snprintf(pools, sizeof pools, "%s/pools.json", dir);
  FILE *f = fopen(pools, "w");
  assert_non_null(f);
  fputs("{\"pools\": [{\"name\": \"default\", \"devices\": [0, 1]}]}", f);
  fclose(f);
  snprintf(go, sizeof go, "%s/go", dir);
  char script[1024];
  snprintf(script, sizeof script,
           "d=$(dirname \"$2\")\n"
           "echo \"$KILN_DEVICES $(grep Cpus_allowed_list /proc/self/status | cut -f2)\" > "
           "\"$d/devices.txt\"\n"
           "while [ ! -e '%s' ]; do sleep 0.05; done\n",
           go);
  harness h;
  start_on(&h, "side", script, NULL, pools);
  char *spec = spec_with("seed", "1");
  add_job(&h, "one", 1, spec);
  add_job(&h, "two", 1, spec);
  add_job(&h, "gang", 2, spec);
  free(spec);
  sched_wake(h.s);
  store_job job = wait_for(&h, "one", "RUNNING", 10);
  store_job_clear(&job);
  job = wait_for(&h, "two", "RUNNING", 10);
  store_job_clear(&job);
  /* Both run at once; the gang of two waits with nothing taken. */
  char reason[40], why[1024];
  int seen = -1;
  for (int i = 0; i < 100 && seen != 0; i++) {
    seen = sched_explain(h.s, "gang", NULL, reason, sizeof reason, why, sizeof why);
    if (seen != 0) usleep(20 * 1000);
  }
  assert_int_equal(seen, 0);
  assert_string_equal(reason, "WAITING_FOR_DEVICES");
  assert_non_null(strstr(why, "needs 2 cpu devices at once, 0 of 2 are free"));
  job = wait_for(&h, "gang", "QUEUED", 1);
  store_job_clear(&job);
  sched_device_info devices[8];
  assert_int_equal(sched_devices_info(h.s, devices, 8), 2);
  assert_string_not_equal(devices[0].job, devices[1].job);
  char seen_one[64], seen_two[64];
  for (int i = 0; i < 100; i++) {
    snprintf(path, sizeof path, "%s/one/devices.txt", jobs_dir);
    char *text = read_text(path);
    snprintf(path, sizeof path, "%s/two/devices.txt", jobs_dir);
    char *other = text ? (snprintf(seen_one, sizeof seen_one, "%s", text), read_text(path)) : NULL;
    if (other && other[0]) {
      snprintf(seen_two, sizeof seen_two, "%s", other);
      break;
    }
    usleep(50 * 1000);
  }
  /* Each got one core of its own, and may run on that core only. */
  assert_true((!strcmp(seen_one, "cpu:0 0") && !strcmp(seen_two, "cpu:1 1")) ||
              (!strcmp(seen_one, "cpu:1 1") && !strcmp(seen_two, "cpu:0 0")));
  f = fopen(go, "w");
  assert_non_null(f);
  fclose(f);
  job = wait_for(&h, "gang", "SUCCEEDED", 10);
  store_job_clear(&job);
  snprintf(path, sizeof path, "%s/gang/devices.txt", jobs_dir);
  assert_string_equal(read_text(path), "cpu:0,1 0-1");
  stop(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(crash_is_retried_after_backoff_up_to_max_restarts, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(server_restart_does_not_count_against_max_restarts, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(max_runtime_stops_a_run_that_takes_too_long, setup, teardown),
      cmocka_unit_test_setup_teardown(cancel_stops_the_running_job, setup, teardown),
      cmocka_unit_test_setup_teardown(checkpoints_record_metrics_and_keep_best_keeps_the_best,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(
          jobs_run_side_by_side_on_their_own_cores_and_a_gang_waits_for_all, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
