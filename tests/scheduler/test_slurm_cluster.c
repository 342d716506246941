/* test_slurm_cluster.c — the Slurm pool's commands against a real
 * slurmctld, slurmd and munged (tests/integration/slurm_fixture.sh starts
 * them and sets SLURM_CONF): a batch job submitted with the pool's sbatch
 * options, followed through squeue and then the completion log to
 * SUCCEEDED or FAILED, one pending behind a full node, one cancelled (its
 * processes gone, squeue no longer listing it), and one whose node goes
 * down mapped to a requeue. */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
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

#include "slurm.h"

#define CMD_MS 10000

static char work_dir[256];
static const char *node, *partition;
static int node_cpus;

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int setup(void **state) {
  (void)state;
  if (!getenv("SLURM_CONF") || !getenv("KILN_SLURM_NODE")) return 0;
  snprintf(work_dir, sizeof work_dir, "%s/jobs", getenv("KILN_SLURM_DIR"));
  mkdir(work_dir, 0700);
  node = getenv("KILN_SLURM_NODE");
  partition = getenv("KILN_SLURM_PARTITION");
  node_cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
  return 0;
}

/* Every test needs the fixture's cluster; run alone, it says so. */
static void need_cluster(void) {
  if (!getenv("SLURM_CONF") || !getenv("KILN_SLURM_NODE")) {
    printf("SKIP: no Slurm cluster: run under tests/integration/slurm_fixture.sh\n");
    skip();
  }
}

static void submit(const char *name, int ntasks, const char *body, char *id, size_t id_len) {
  char script[2048], file[64], err[512] = "";
  snprintf(script, sizeof script, "#!/bin/sh\n%s\n", body);
  snprintf(file, sizeof file, "%s.sh", name);
  sched_slurm_submit_req req = {.partition = partition,
                                .nodes = 1,
                                .ntasks = ntasks,
                                .cpus_per_task = 1,
                                .job_name = name,
                                .work_dir = work_dir,
                                .script_name = file,
                                .script = script,
                                .timeout_ms = CMD_MS};
  int rc = sched_slurm_submit(&req, id, id_len, err, sizeof err);
  if (rc != 0) printf("sbatch: %s\n", err);
  assert_int_equal(rc, 0);
  printf("%s: Slurm job %s\n", name, id);
}

/* Polls job id until its outcome is `want` (or it ends otherwise), for at
 * most limit_s; prints every change. The last status in *st. */
static void follow(const char *id, sched_slurm_outcome want, int limit_s, sched_slurm_status *st) {
  char err[512], last[80] = "";
  long long end = now_ms() + limit_s * 1000LL;
  for (;;) {
    int rc = sched_slurm_poll(id, CMD_MS, st, err, sizeof err);
    if (rc < 0) printf("poll %s: %s\n", id, err);
    assert_true(rc >= 0);
    char now[80];
    snprintf(now, sizeof now, "%s (%s)", rc ? st->state : "unknown", rc ? st->source : "-");
    if (strcmp(now, last) != 0) {
      printf("  job %s: %s%s%s\n", id, now, st->reason[0] ? " reason " : "", st->reason);
      snprintf(last, sizeof last, "%s", now);
    }
    if (rc == 1) {
      assert_non_null(st->info);
      if (st->info->outcome == want) return;
      if (st->info->outcome != SCHED_SLURM_WAITING && st->info->outcome != SCHED_SLURM_ACTIVE) {
        printf("job %s ended %s, not the outcome the test waits for\n", id, st->state);
        fail();
      }
    }
    if (now_ms() > end) {
      printf("job %s: still %s after %d s\n", id, now, limit_s);
      fail();
    }
    usleep(200 * 1000);
  }
}

/* `scontrol show job ID` as one line of Key=Value words. */
static void show_job(const char *id, char *out, size_t len) {
  char *argv[] = {"scontrol", "-o", "show", "job", (char *)id, NULL};
  char err[256];
  assert_int_equal(sched_slurm_command(argv, CMD_MS, out, len, err, sizeof err), 0);
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = calloc(1, 65536);
  size_t got = buf ? fread(buf, 1, 65535, f) : 0;
  (void)got;
  fclose(f);
  return buf;
}

static void batch_job_runs_with_the_pools_options_and_succeeds(void **state) {
  (void)state;
  need_cluster();
  char id[32], show[4096];
  submit("kiln-job-ok", 1, "echo \"hello from $SLURM_JOB_ID\"; sleep 2", id, sizeof id);
  sched_slurm_status st;
  follow(id, SCHED_SLURM_ACTIVE, 30, &st);
  assert_string_equal(st.info->kiln_state, "RUNNING");
  show_job(id, show, sizeof show);
  assert_non_null(strstr(show, "JobName=kiln-job-ok "));
  assert_non_null(strstr(show, "Requeue=0 "));
  char want[512];
  snprintf(want, sizeof want, "Partition=%s ", partition);
  assert_non_null(strstr(show, want));
  snprintf(want, sizeof want, "WorkDir=%s ", work_dir);
  assert_non_null(strstr(show, want));
  follow(id, SCHED_SLURM_SUCCEEDED, 30, &st);
  assert_string_equal(st.info->kiln_state, "SUCCEEDED");
  assert_string_equal(st.info->reason, "COMPLETED");
  char path[512];
  snprintf(path, sizeof path, "%s/slurm-%s.out", work_dir, id);
  char *out = read_file(path);
  assert_non_null(out);
  snprintf(want, sizeof want, "hello from %s\n", id);
  assert_string_equal(out, want);
  free(out);
}

static void failed_script_is_failed_with_its_status_from_the_completion_log(void **state) {
  (void)state;
  need_cluster();
  char id[32];
  submit("kiln-job-fails", 1, "exit 3", id, sizeof id);
  sched_slurm_status st;
  follow(id, SCHED_SLURM_FAILED, 30, &st);
  assert_string_equal(st.state, "FAILED");
  assert_string_equal(st.info->kiln_state, "FAILED");
  /* squeue's line has no status; wait until the controller forgets the job
   * (MinJobAge=2) and the completion log answers */
  long long end = now_ms() + 30000;
  char err[256];
  while (strcmp(st.source, "squeue") == 0 && now_ms() < end) {
    usleep(250 * 1000);
    assert_int_equal(sched_slurm_poll(id, CMD_MS, &st, err, sizeof err), 1);
  }
  printf("  job %s: %s from %s, exit code %d\n", id, st.state, st.source, st.exit_code);
  assert_string_equal(st.source, "sacct -c");
  assert_string_equal(st.state, "FAILED");
  assert_int_equal(st.exit_code, 3);
  assert_int_equal(st.signal, 0);
}

static void job_behind_a_full_node_pends_as_starting(void **state) {
  (void)state;
  need_cluster();
  char big[32], next[32], err[256];
  submit("kiln-job-fills", node_cpus, "sleep 60", big, sizeof big);
  sched_slurm_status st;
  follow(big, SCHED_SLURM_ACTIVE, 30, &st);
  submit("kiln-job-waits", 1, "sleep 1", next, sizeof next);
  assert_int_equal(sched_slurm_poll(next, CMD_MS, &st, err, sizeof err), 1);
  assert_string_equal(st.state, "PENDING");
  assert_int_equal(st.info->outcome, SCHED_SLURM_WAITING);
  assert_string_equal(st.info->kiln_state, "STARTING");
  assert_true(strlen(st.reason) > 0); /* Resources, or Priority / None before a pass */
  printf("  job %s pends: reason %s\n", next, st.reason);
  assert_int_equal(sched_slurm_cancel(next, CMD_MS, err, sizeof err), 0);
  assert_int_equal(sched_slurm_cancel(big, CMD_MS, err, sizeof err), 0);
  follow(next, SCHED_SLURM_CANCELLED, 30, &st);
  follow(big, SCHED_SLURM_CANCELLED, 30, &st);
}

/* The pid the script wrote to path, once it is there. */
static pid_t script_pid(const char *path) {
  long long end = now_ms() + 20000;
  while (now_ms() < end) {
    char *text = read_file(path);
    long pid = text ? strtol(text, NULL, 10) : 0;
    free(text);
    if (pid > 0) return (pid_t)pid;
    usleep(100 * 1000);
  }
  fail_msg("the batch script never wrote %s", path);
  return 0;
}

static int gone_within(pid_t pid, int limit_s) {
  long long end = now_ms() + limit_s * 1000LL;
  while (now_ms() < end) {
    if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
    usleep(100 * 1000);
  }
  return 0;
}

static void cancel_ends_the_job_in_slurm(void **state) {
  (void)state;
  need_cluster();
  char id[32], err[256], body[512], pidfile[300];
  snprintf(pidfile, sizeof pidfile, "%s/cancel.pid", work_dir);
  snprintf(body, sizeof body, "sleep 120 & echo $! > %s; wait", pidfile);
  submit("kiln-job-cancel", 1, body, id, sizeof id);
  sched_slurm_status st;
  follow(id, SCHED_SLURM_ACTIVE, 30, &st);
  pid_t sleeper = script_pid(pidfile);
  assert_int_equal(sched_slurm_cancel(id, CMD_MS, err, sizeof err), 0);
  follow(id, SCHED_SLURM_CANCELLED, 30, &st);
  assert_string_equal(st.info->kiln_state, "CANCELLED");
  assert_true(gone_within(sleeper, 10));
  /* squeue lists it no more (MinJobAge=2); the completion log keeps it */
  char *argv[] = {"squeue", "-h", "-o", "%i", NULL};
  char out[1024];
  long long end = now_ms() + 20000;
  int listed = 1;
  while (listed && now_ms() < end) {
    assert_int_equal(sched_slurm_command(argv, CMD_MS, out, sizeof out, err, sizeof err), 0);
    char needle[40];
    snprintf(needle, sizeof needle, "%s\n", id);
    listed = strncmp(out, needle, strlen(needle)) == 0 || strstr(out, needle) != NULL;
    if (listed) usleep(250 * 1000);
  }
  assert_false(listed);
  assert_int_equal(sched_slurm_poll(id, CMD_MS, &st, err, sizeof err), 1);
  assert_string_equal(st.state, "CANCELLED");
  assert_string_equal(st.source, "sacct -c");
  /* a job Slurm no longer knows: nothing to cancel, and it says so */
  assert_int_equal(sched_slurm_cancel("999999", CMD_MS, err, sizeof err), 1);
}

static void node_down_while_running_is_a_requeue(void **state) {
  (void)state;
  need_cluster();
  char id[32], err[256], body[512], pidfile[300];
  snprintf(pidfile, sizeof pidfile, "%s/down.pid", work_dir);
  snprintf(body, sizeof body, "sleep 120 & echo $! > %s; wait", pidfile);
  submit("kiln-job-node-fails", 1, body, id, sizeof id);
  sched_slurm_status st;
  follow(id, SCHED_SLURM_ACTIVE, 30, &st);
  pid_t sleeper = script_pid(pidfile);
  char nodename[128];
  snprintf(nodename, sizeof nodename, "nodename=%s", node);
  char *down[] = {"scontrol", "update", nodename, "state=down", "reason=kiln-test", NULL};
  assert_int_equal(sched_slurm_command(down, CMD_MS, NULL, 0, err, sizeof err), 0);
  follow(id, SCHED_SLURM_REQUEUE, 30, &st);
  assert_string_equal(st.state, "NODE_FAIL");
  assert_string_equal(st.info->kiln_state, "QUEUED");
  assert_string_equal(st.info->reason, "NODE_FAIL");
  assert_true(gone_within(sleeper, 10));
  /* the node comes back (ReturnToService=2 may have done it already) */
  char *resume[] = {"scontrol", "update", nodename, "state=resume", NULL};
  sched_slurm_command(resume, CMD_MS, NULL, 0, err, sizeof err);
  char *sinfo[] = {"sinfo", "-h", "-n", (char *)node, "-o", "%T", NULL};
  char out[128] = "";
  long long end = now_ms() + 30000;
  while (now_ms() < end) {
    sched_slurm_command(sinfo, CMD_MS, out, sizeof out, err, sizeof err);
    if (strcmp(out, "idle\n") == 0) break;
    usleep(250 * 1000);
  }
  assert_string_equal(out, "idle\n");
}

static void bad_partition_is_refused_with_sbatchs_reason(void **state) {
  (void)state;
  need_cluster();
  char id[32], err[512] = "";
  sched_slurm_submit_req req = {.partition = "no-such-partition",
                                .nodes = 1,
                                .ntasks = 1,
                                .cpus_per_task = 1,
                                .job_name = "kiln-job-nowhere",
                                .work_dir = work_dir,
                                .script_name = "nowhere.sh",
                                .script = "#!/bin/sh\ntrue\n",
                                .timeout_ms = CMD_MS};
  assert_int_equal(sched_slurm_submit(&req, id, sizeof id, err, sizeof err), -1);
  printf("  %s\n", err);
  assert_non_null(strstr(err, "sbatch refused the batch job"));
  assert_non_null(strstr(err, "artition")); /* "invalid partition specified" */
  sched_slurm_status st;
  assert_int_equal(sched_slurm_poll("987654", CMD_MS, &st, err, sizeof err), 0);
  assert_string_equal(st.state, "");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(batch_job_runs_with_the_pools_options_and_succeeds),
      cmocka_unit_test(failed_script_is_failed_with_its_status_from_the_completion_log),
      cmocka_unit_test(job_behind_a_full_node_pends_as_starting),
      cmocka_unit_test(cancel_ends_the_job_in_slurm),
      cmocka_unit_test(bad_partition_is_refused_with_sbatchs_reason),
      cmocka_unit_test(node_down_while_running_is_a_requeue),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
