/* test_slurm_parse.c — the Slurm pool's parsers on outputs captured from
 * sbatch --parsable, squeue and sacct (with accounting and sacct -c on the
 * completion log), its state table against kiln's states, the batch
 * script's quoting, and the command runner's output, status and timeout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "slurm.h"

static void sbatch_id_alone_or_with_its_cluster(void **state) {
  (void)state;
  char id[32], err[256];
  assert_int_equal(sched_slurm_parse_sbatch("4242\n", id, sizeof id, err, sizeof err), 0);
  assert_string_equal(id, "4242");
  assert_int_equal(sched_slurm_parse_sbatch("17;kilntest\n", id, sizeof id, err, sizeof err), 0);
  assert_string_equal(id, "17");
  /* something said before the id, as a site's job_submit plugin may */
  assert_int_equal(sched_slurm_parse_sbatch("note: defaulting to partition debug\n 99 \n", id,
                                            sizeof id, err, sizeof err),
                   0);
  assert_string_equal(id, "99");
}

static void sbatch_output_without_an_id_is_refused(void **state) {
  (void)state;
  char id[32] = "", err[256] = "";
  assert_int_equal(
      sched_slurm_parse_sbatch("Submitted batch job 12\n", id, sizeof id, err, sizeof err), -1);
  assert_non_null(strstr(err, "no job id"));
  assert_non_null(strstr(err, "Submitted batch job 12"));
  assert_int_equal(sched_slurm_parse_sbatch("", id, sizeof id, err, sizeof err), -1);
  char tiny[3];
  assert_int_equal(sched_slurm_parse_sbatch("12345\n", tiny, sizeof tiny, err, sizeof err), -1);
}

static void squeue_line_of_the_job_gives_state_and_reason(void **state) {
  (void)state;
  sched_slurm_status st;
  char err[256];
  const char *out = "41|RUNNING|None\n42|PENDING|Resources\n";
  assert_int_equal(sched_slurm_parse_squeue(out, "42", &st, err, sizeof err), 1);
  assert_string_equal(st.job_id, "42");
  assert_string_equal(st.state, "PENDING");
  assert_string_equal(st.reason, "Resources");
  assert_non_null(st.info);
  assert_int_equal(st.info->outcome, SCHED_SLURM_WAITING);
  assert_string_equal(st.info->kiln_state, "STARTING");
  assert_int_equal(sched_slurm_parse_squeue(out, "41", &st, err, sizeof err), 1);
  assert_string_equal(st.state, "RUNNING");
  assert_int_equal(st.info->outcome, SCHED_SLURM_ACTIVE);
}

static void squeue_without_the_job_is_not_found(void **state) {
  (void)state;
  sched_slurm_status st;
  char err[256];
  assert_int_equal(sched_slurm_parse_squeue("", "7", &st, err, sizeof err), 0);
  assert_int_equal(sched_slurm_parse_squeue("\n\n", "7", &st, err, sizeof err), 0);
  /* 70 is not 7 */
  assert_int_equal(sched_slurm_parse_squeue("70|RUNNING|None\n", "7", &st, err, sizeof err), 0);
}

static void squeue_in_another_format_is_an_error(void **state) {
  (void)state;
  sched_slurm_status st;
  char err[256] = "";
  const char *header = "             JOBID PARTITION     NAME     USER ST       TIME  NODES\n";
  assert_int_equal(sched_slurm_parse_squeue(header, "7", &st, err, sizeof err), -1);
  assert_non_null(strstr(err, "JOBID|STATE|REASON"));
  assert_int_equal(sched_slurm_parse_squeue("7||None\n", "7", &st, err, sizeof err), -1);
}

static void sacct_reads_the_allocation_line_and_its_exit_code(void **state) {
  (void)state;
  sched_slurm_status st;
  char err[256];
  /* with accounting, without -X: the job, then its steps */
  const char *out = "1234.batch|FAILED|3:0\n1234.extern|COMPLETED|0:0\n1234|FAILED|3:0\n";
  assert_int_equal(sched_slurm_parse_sacct(out, "1234", &st, err, sizeof err), 1);
  assert_string_equal(st.state, "FAILED");
  assert_int_equal(st.exit_code, 3);
  assert_int_equal(st.signal, 0);
  assert_string_equal(st.info->kiln_state, "FAILED");
  assert_string_equal(st.info->reason, "TRAINER_EXITED");
  /* sacct -c on jobcomp/filetxt, as the fixture's cluster prints it */
  assert_int_equal(sched_slurm_parse_sacct("2|NODE_FAIL|0:0\n", "2", &st, err, sizeof err), 1);
  assert_string_equal(st.info->kiln_state, "QUEUED");
  assert_string_equal(st.info->reason, "NODE_FAIL");
  /* sacct -p's trailing bar */
  assert_int_equal(sched_slurm_parse_sacct("5|COMPLETED|0:0|\n", "5", &st, err, sizeof err), 1);
  assert_int_equal(st.info->outcome, SCHED_SLURM_SUCCEEDED);
  assert_int_equal(sched_slurm_parse_sacct("", "5", &st, err, sizeof err), 0);
}

static void sacct_cancelled_by_a_uid_is_cancelled(void **state) {
  (void)state;
  sched_slurm_status st;
  char err[256];
  assert_int_equal(sched_slurm_parse_sacct("3|CANCELLED by 1000|0:15\n", "3", &st, err, sizeof err),
                   1);
  assert_string_equal(st.state, "CANCELLED");
  assert_int_equal(st.signal, 15);
  assert_int_equal(st.info->outcome, SCHED_SLURM_CANCELLED);
  assert_string_equal(st.info->kiln_state, "CANCELLED");
}

static void sacct_bad_exit_code_is_an_error(void **state) {
  (void)state;
  sched_slurm_status st;
  char err[256] = "";
  assert_int_equal(sched_slurm_parse_sacct("3|FAILED|x\n", "3", &st, err, sizeof err), -1);
  assert_non_null(strstr(err, "ExitCode \"x\""));
  assert_int_equal(sched_slurm_parse_sacct("3|FAILED|1:y\n", "3", &st, err, sizeof err), -1);
  assert_int_equal(sched_slurm_parse_sacct("3|FAILED\n", "3", &st, err, sizeof err), -1);
}

/* The contract's mapping, state by state. */
static void slurm_states_map_to_kiln_states(void **state) {
  (void)state;
  static const struct {
    const char *slurm, *kiln, *reason;
    sched_slurm_outcome outcome;
  } want[] = {
      {"PENDING", "STARTING", "SLURM_PENDING", SCHED_SLURM_WAITING},
      {"CONFIGURING", "STARTING", "SLURM_CONFIGURING", SCHED_SLURM_WAITING},
      {"RUNNING", "RUNNING", "STARTED", SCHED_SLURM_ACTIVE},
      {"COMPLETING", "RUNNING", "STARTED", SCHED_SLURM_ACTIVE},
      {"COMPLETED", "SUCCEEDED", "COMPLETED", SCHED_SLURM_SUCCEEDED},
      {"FAILED", "FAILED", "TRAINER_EXITED", SCHED_SLURM_FAILED},
      {"CANCELLED", "CANCELLED", "CANCELLED", SCHED_SLURM_CANCELLED},
      {"TIMEOUT", "FAILED", "DEADLINE_EXCEEDED", SCHED_SLURM_FAILED},
      {"NODE_FAIL", "QUEUED", "NODE_FAIL", SCHED_SLURM_REQUEUE},
      {"BOOT_FAIL", "QUEUED", "NODE_FAIL", SCHED_SLURM_REQUEUE},
      {"OUT_OF_MEMORY", "FAILED", "RESOURCE_EXHAUSTED", SCHED_SLURM_FAILED},
      {"PREEMPTED", "QUEUED", "PREEMPTED", SCHED_SLURM_REQUEUE},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    const sched_slurm_state_info *info = sched_slurm_state_lookup(want[i].slurm);
    assert_non_null(info);
    assert_string_equal(info->name, want[i].slurm);
    assert_string_equal(info->kiln_state, want[i].kiln);
    assert_string_equal(info->reason, want[i].reason);
    assert_int_equal(info->outcome, want[i].outcome);
    assert_true(strlen(info->says) > 10);
  }
  assert_null(sched_slurm_state_lookup("WAITING"));
  assert_null(sched_slurm_state_lookup("RUN"));
  assert_null(sched_slurm_state_lookup(""));
  assert_null(sched_slurm_state_lookup(NULL));
}

static void script_quotes_every_word(void **state) {
  (void)state;
  char *train[] = {
      "/opt/kiln/bin/kiln-train", "--spec", "/jobs/it's/spec.json", "--progress-fd", "3", NULL};
  sched_slurm_script_req req = {.agent_path = "/opt/kiln/bin/kiln-agent",
                                .server_url = "http://10.0.0.1:8080",
                                .alloc_id = "alloc-00ff",
                                .token_file = "/jobs/j1/alloc.token",
                                .processes = 1,
                                .trainer_argv = train};
  char out[2048];
  assert_int_equal(sched_slurm_script(&req, out, sizeof out), 0);
  assert_int_equal(strncmp(out, "#!/bin/sh\n", 10), 0);
  assert_non_null(strstr(out, "\nexec '/opt/kiln/bin/kiln-agent' 'job' '--server' "
                              "'http://10.0.0.1:8080' '--alloc' 'alloc-00ff' '--token-file' "
                              "'/jobs/j1/alloc.token' '--' '/opt/kiln/bin/kiln-train' '--spec' "
                              "'/jobs/it'\\''s/spec.json' '--progress-fd' '3'\n"));
  assert_null(strstr(out, "mpirun"));
  char *ranks[] = {"kiln-train", "--spec", "s.json", "--json", NULL};
  req.processes = 4;
  req.allow_run_as_root = 1;
  req.trainer_argv = ranks;
  assert_int_equal(sched_slurm_script(&req, out, sizeof out), 0);
  assert_non_null(strstr(out, "'--' 'mpirun' '--allow-run-as-root' '-np' '4' 'kiln-train' "
                              "'--spec' 's.json' '--json'\n"));
  assert_int_equal(sched_slurm_script(&req, out, 120), -1);
}

/* argv joined by spaces */
static void joined(char *const *argv, char *out, size_t len) {
  size_t used = 0;
  out[0] = '\0';
  for (int i = 0; argv[i] && used < len; i++)
    used += (size_t)snprintf(out + used, len - used, "%s%s", i ? " " : "", argv[i]);
}

static void sbatch_command_line_asks_for_the_jobs_resources(void **state) {
  (void)state;
  sched_slurm_submit_req req = {.partition = "debug",
                                .nodes = 2,
                                .ntasks = 4,
                                .cpus_per_task = 3,
                                .job_name = "20261203-00ff",
                                .work_dir = "/data/jobs/20261203-00ff",
                                .output = "/data/jobs/20261203-00ff/train.log",
                                .script_name = "slurm-attempt-2.sh"};
  sched_slurm_sbatch cmd;
  char line[2048];
  assert_int_equal(sched_slurm_sbatch_argv(&req, &cmd), 0);
  joined(cmd.argv, line, sizeof line);
  assert_string_equal(line, "sbatch --parsable --no-requeue --open-mode=append --partition=debug "
                            "--nodes=2 --ntasks=4 --cpus-per-task=3 --job-name=20261203-00ff "
                            "--chdir=/data/jobs/20261203-00ff "
                            "--output=/data/jobs/20261203-00ff/train.log "
                            "/data/jobs/20261203-00ff/slurm-attempt-2.sh");
  /* a GPU pool's job: its GPUs from Slurm; Slurm's own output file without one */
  req.gpus = 4;
  req.cpus_per_task = 1;
  req.output = NULL;
  assert_int_equal(sched_slurm_sbatch_argv(&req, &cmd), 0);
  joined(cmd.argv, line, sizeof line);
  assert_non_null(strstr(line, " --cpus-per-task=1 --gpus=4 --job-name="));
  assert_non_null(strstr(line, " --output=/data/jobs/20261203-00ff/slurm-%j.out "));
  char long_dir[5000];
  memset(long_dir, 'a', sizeof long_dir - 1);
  long_dir[0] = '/';
  long_dir[sizeof long_dir - 1] = '\0';
  req.work_dir = long_dir;
  assert_int_equal(sched_slurm_sbatch_argv(&req, &cmd), -1);
}

static void command_returns_output_errors_and_status(void **state) {
  (void)state;
  char out[64], err[64];
  char *argv[] = {"sh", "-c", "echo to-out; echo to-err >&2; exit 3", NULL};
  assert_int_equal(sched_slurm_command(argv, 5000, out, sizeof out, err, sizeof err), 3);
  assert_string_equal(out, "to-out\n");
  assert_string_equal(err, "to-err");
  /* more than the buffer: cut, and the command still ends */
  char *big[] = {"sh", "-c", "yes | head -c 100000; exit 0", NULL};
  assert_int_equal(sched_slurm_command(big, 5000, out, sizeof out, err, sizeof err), 0);
  assert_int_equal(strlen(out), sizeof out - 1);
  char *missing[] = {"kiln-no-such-slurm-command", NULL};
  assert_int_equal(sched_slurm_command(missing, 5000, out, sizeof out, err, sizeof err), -1);
  assert_non_null(strstr(err, "cannot start kiln-no-such-slurm-command"));
}

static void command_past_its_timeout_is_killed(void **state) {
  (void)state;
  char err[128];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  /* the sleep is a child of sh: the whole group goes */
  char *argv[] = {"sh", "-c", "sleep 30; echo late", NULL};
  assert_int_equal(sched_slurm_command(argv, 300, NULL, 0, err, sizeof err), -1);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  assert_true(took < 5.0);
  assert_non_null(strstr(err, "sh did not answer within 300 ms"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sbatch_id_alone_or_with_its_cluster),
      cmocka_unit_test(sbatch_output_without_an_id_is_refused),
      cmocka_unit_test(squeue_line_of_the_job_gives_state_and_reason),
      cmocka_unit_test(squeue_without_the_job_is_not_found),
      cmocka_unit_test(squeue_in_another_format_is_an_error),
      cmocka_unit_test(sacct_reads_the_allocation_line_and_its_exit_code),
      cmocka_unit_test(sacct_cancelled_by_a_uid_is_cancelled),
      cmocka_unit_test(sacct_bad_exit_code_is_an_error),
      cmocka_unit_test(slurm_states_map_to_kiln_states),
      cmocka_unit_test(script_quotes_every_word),
      cmocka_unit_test(sbatch_command_line_asks_for_the_jobs_resources),
      cmocka_unit_test(command_returns_output_errors_and_status),
      cmocka_unit_test(command_past_its_timeout_is_killed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
