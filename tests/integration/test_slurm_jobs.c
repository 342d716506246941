/* test_slurm_jobs.c — jobs on a Slurm pool through a real kilnd, on the
 * one-node cluster tests/integration/slurm_fixture.sh starts (munged,
 * slurmctld, slurmd): kilnd submits each attempt as a batch job running
 * the real kiln-agent job around the real kiln-train, whose progress and
 * checkpoints come back over HTTP with the allocation's token. Shown: a job
 * trains a small model and SUCCEEDS with its metrics and checkpoints in
 * kilnd; a cancel ends the batch job in Slurm too (squeue no longer lists
 * it); the node taken down mid-job requeues it as an infrastructure
 * restart, and it resumes from its checkpoint and succeeds. */
#define _GNU_SOURCE
#include <jansson.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static char data_dir[256], base_url[64], admin_token[128], pools_path[400], listen_at[64];
static pid_t kilnd_pid;
static const char *datasets_dir;
static int have_cluster;

/* A small run of Fashion-MNIST: 20 steps an epoch, a checkpoint every 10. */
static char *spec_text(const char *name, int epochs, const char *extra) {
  char *text = malloc(4096);
  snprintf(text, 4096,
           "{\"display_name\":\"%s\",\"model\":{\"input_shape\":[28,28,1],\"layers\":["
           "{\"type\":\"flatten\"},{\"type\":\"dense\",\"units\":32,\"activation\":\"relu\"},"
           "{\"type\":\"dense\",\"units\":10,\"activation\":\"softmax\"}]},"
           "\"loss\":\"sparse_categorical_crossentropy\",\"metrics\":[\"accuracy\"],"
           "\"dataset\":{\"name\":\"fashion-mnist\"},"
           "\"pipeline\":{\"batch_size\":64,\"take\":1280,\"num_parallel_calls\":0},"
           "\"optimizer\":{\"type\":\"adam\",\"learning_rate\":0.002},\"epochs\":%d,\"seed\":7,"
           "\"checkpoint\":{\"every_steps\":10},"
           "\"resources\":{\"device_type\":\"cpu\",\"devices\":1,\"pool\":\"cluster\"}%s}",
           name, epochs, extra ? extra : "");
  return text;
}

static json_t *call(const char *method, const char *path, const char *body, long *status) {
  char *out = NULL;
  *status = it_request(base_url, admin_token, method, path, body, body ? strlen(body) : 0, &out);
  json_t *doc = out ? json_loads(out, 0, NULL) : NULL;
  if (*status >= 400) fprintf(stderr, "%s %s -> %ld %s\n", method, path, *status, out);
  free(out);
  return doc;
}

static char *create_job(const char *spec) {
  long status;
  json_t *doc = call("POST", "/v1/jobs", spec, &status);
  if (status != 200) fail_msg("create: %ld", status);
  char *id = strdup(json_string_value(json_object_get(doc, "id")));
  json_decref(doc);
  return id;
}

static json_t *get_job(const char *id) {
  char path[128];
  long status;
  snprintf(path, sizeof path, "/v1/jobs/%s", id);
  json_t *doc = call("GET", path, NULL, &status);
  assert_int_equal(status, 200);
  return doc;
}

/* The job's events as one text, for looking up reasons and messages. */
static char *events_text(const char *id) {
  char path[128];
  long status;
  snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
  json_t *doc = call("GET", path, NULL, &status);
  assert_int_equal(status, 200);
  char *text = json_dumps(doc, JSON_INDENT(1));
  json_decref(doc);
  return text;
}

/* Waits for the job to reach state: limit_s seconds, three times that
 * under the sanitizers (KILN_TEST_SANITIZED=1, scripts/test.sh), whose
 * training runs several times slower beside another suite. */
static json_t *wait_state(const char *id, const char *state, int limit_s) {
  const char *sanitized = getenv("KILN_TEST_SANITIZED");
  if (sanitized && strcmp(sanitized, "1") == 0) limit_s *= 3;
  long long until = it_now_ms() + limit_s * 1000LL;
  for (;;) {
    json_t *doc = get_job(id);
    const char *now = json_string_value(json_object_get(doc, "state"));
    if (strcmp(now, state) == 0) return doc;
    if (it_now_ms() > until) {
      char *events = events_text(id), path[128], *logs = NULL;
      printf("events of %s:\n%s\n", id, events);
      free(events);
      snprintf(path, sizeof path, "/v1/jobs/%s/logs", id);
      it_request(base_url, admin_token, "GET", path, NULL, 0, &logs);
      size_t n = logs ? strlen(logs) : 0;
      printf("end of its log:\n%s\n", logs ? logs + (n > 3000 ? n - 3000 : 0) : "(none)");
      free(logs);
      fail_msg("job %s is %s, not %s, after %d s", id, now, state, limit_s);
    }
    json_decref(doc);
    usleep(200 * 1000);
  }
}

/* The Slurm job id of the job's nth SLURM_SUBMITTED event ("Slurm batch
 * job N in partition ..."). */
static void slurm_job_of(const char *id, int nth, char *out, size_t len) {
  char *events = events_text(id);
  out[0] = '\0';
  int seen = 0;
  for (const char *at = strstr(events, "Slurm batch job "); at && !out[0];
       at = strstr(at + 1, "Slurm batch job ")) {
    size_t digits = strspn(at + 16, "0123456789");
    if (digits == 0 || strncmp(at + 16 + digits, " in partition", 13) != 0) continue;
    if (++seen == nth) snprintf(out, len, "%.*s", (int)digits, at + 16);
  }
  free(events);
  if (!out[0]) fail_msg("job %s has no SLURM_SUBMITTED event number %d", id, nth);
}

static int squeue_lists(const char *slurm_id) {
  char out[4096], cmd[128];
  snprintf(cmd, sizeof cmd, "squeue -h -o %%i");
  assert_int_equal(it_run(out, sizeof out, cmd), 0);
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"))
    if (strcmp(line, slurm_id) == 0) return 1;
  return 0;
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

/* kilnd on data_dir, on the port the pools file gives Slurm's nodes. */
static int launch_kilnd(void) {
  const char *extra[] = {"--pools",        pools_path,   "--listen", listen_at,
                         "--datasets-dir", datasets_dir, NULL};
  return it_launch_kilnd_args(KILND_PATH, data_dir, KILN_TRAIN_PATH, extra, &kilnd_pid, base_url,
                              sizeof base_url, admin_token, sizeof admin_token);
}

static int setup(void **state) {
  (void)state;
  have_cluster = getenv("SLURM_CONF") && getenv("KILN_SLURM_PARTITION");
  datasets_dir = getenv("KILN_DATASETS_DIR");
  if (!datasets_dir || !*datasets_dir) datasets_dir = KILN_DEFAULT_DATASETS_DIR;
  if (!have_cluster) return 0;
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-slurm-jobs-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  int port = free_port();
  if (port <= 0) return -1;
  char text[1024];
  snprintf(pools_path, sizeof pools_path, "%s/pools.json", data_dir);
  snprintf(listen_at, sizeof listen_at, "127.0.0.1:%d", port);
  snprintf(text, sizeof text,
           "{\"pools\":[{\"name\":\"default\",\"devices\":1},{\"name\":\"cluster\",\"kind\":"
           "\"slurm\",\"partition\":\"%s\",\"nodes\":1,\"cpus_per_node\":%ld,\"kilnd_url\":"
           "\"http://%s\"}]}",
           getenv("KILN_SLURM_PARTITION"), sysconf(_SC_NPROCESSORS_ONLN), listen_at);
  if (it_write_file(pools_path, text, 0600) != 0) return -1;
  /* kilnd's batch jobs run this kiln-agent (its environment is theirs). */
  setenv("KILN_AGENT", KILN_AGENT_PATH, 1);
  /* Slurm asked every 3 s: a small job runs whole between two polls. */
  setenv("KILN_SLURM_POLL_MS", "3000", 1);
  return launch_kilnd();
}

static int teardown(void **state) {
  (void)state;
  if (have_cluster) it_stop_kilnd(kilnd_pid, data_dir);
  return 0;
}

static void need_cluster_and_data(void) {
  if (!have_cluster) {
    printf("SKIP: no Slurm cluster: run under tests/integration/slurm_fixture.sh\n");
    skip();
  }
  if (access(datasets_dir, R_OK) != 0) {
    printf("SKIP: the built-in data sets are not at %s (KILN_DATASETS_DIR)\n", datasets_dir);
    skip();
  }
}

static void job_on_a_slurm_pool_trains_and_succeeds(void **state) {
  (void)state;
  need_cluster_and_data();
  char *spec = spec_text("slurm-ok", 1, NULL);
  char *job = create_job(spec);
  free(spec);
  json_t *doc = wait_state(job, "SUCCEEDED", 90);
  assert_int_equal(json_integer_value(json_object_get(doc, "infra_restarts")), 0);
  json_decref(doc);
  char slurm_id[32];
  slurm_job_of(job, 1, slurm_id, sizeof slurm_id);
  printf("  job %s ran as Slurm batch job %s\n", job, slurm_id);
  char *events = events_text(job);
  assert_non_null(strstr(events, "SLURM_SUBMITTED"));
  assert_non_null(strstr(events, "started (allocation alloc-"));
  free(events);
  /* its progress came back through kiln-agent: the points and checkpoints */
  char path[256];
  long status;
  snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", job);
  doc = call("GET", path, NULL, &status);
  assert_int_equal(status, 200);
  size_t checkpoints = json_array_size(json_object_get(doc, "checkpoints"));
  printf("  %zu checkpoints\n", checkpoints);
  assert_true(checkpoints >= 2);
  json_decref(doc);
  snprintf(path, sizeof path, "/v1/jobs/%s/metrics", job);
  doc = call("GET", path, NULL, &status);
  assert_int_equal(status, 200);
  char *text = json_dumps(doc, JSON_COMPACT);
  assert_non_null(strstr(text, "\"name\":\"epoch_loss\""));
  assert_non_null(strstr(text, "\"step\":20,\"epoch\":1")); /* 1280 / 64 steps */
  free(text);
  json_decref(doc);
  free(job);
}

static void cancel_ends_the_batch_job_in_slurm(void **state) {
  (void)state;
  need_cluster_and_data();
  char *spec = spec_text("slurm-cancel", 200, NULL);
  char *job = create_job(spec);
  free(spec);
  json_decref(wait_state(job, "RUNNING", 60));
  char slurm_id[32], path[128];
  slurm_job_of(job, 1, slurm_id, sizeof slurm_id);
  assert_true(squeue_lists(slurm_id));
  long status;
  snprintf(path, sizeof path, "/v1/jobs/%s:cancel", job);
  json_decref(call("POST", path, "{}", &status));
  assert_int_equal(status, 200);
  long long cancelled = it_now_ms();
  json_decref(wait_state(job, "CANCELLED", 30));
  while (squeue_lists(slurm_id) && it_now_ms() - cancelled < 20000) usleep(250 * 1000);
  printf("  Slurm batch job %s gone from squeue %lld ms after the cancel\n", slurm_id,
         it_now_ms() - cancelled);
  assert_false(squeue_lists(slurm_id));
  free(job);
}

/* A job Slurm starts and ends between two of kilnd's polls (3 s apart
 * here): its progress, checkpoints and RUNNING are there all the same. */
static void job_ending_between_two_polls_keeps_its_progress(void **state) {
  (void)state;
  need_cluster_and_data();
  char *spec = spec_text("slurm-quick", 1, NULL);
  char *job = create_job(spec);
  free(spec);
  json_decref(wait_state(job, "SUCCEEDED", 60));
  char *events = events_text(job);
  const char *running = strstr(events, "\"to_state\": \"RUNNING\"");
  const char *done = strstr(events, "\"to_state\": \"SUCCEEDED\"");
  assert_non_null(running);
  assert_non_null(done);
  assert_true(running < done);
  assert_null(strstr(events, "trained: 0 metric points"));
  free(events);
  char path[256];
  long status;
  snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", job);
  json_t *doc = call("GET", path, NULL, &status);
  assert_int_equal(status, 200);
  assert_int_equal(json_array_size(json_object_get(doc, "checkpoints")), 2);
  json_decref(doc);
  snprintf(path, sizeof path, "/v1/jobs/%s/metrics", job);
  doc = call("GET", path, NULL, &status);
  assert_int_equal(status, 200);
  char *text = json_dumps(doc, JSON_COMPACT);
  assert_non_null(strstr(text, "\"step\":20,\"epoch\":1,\"name\":\"epoch_loss\""));
  free(text);
  json_decref(doc);
  free(job);
}

/* A multi_worker job of 2 workers: mpirun -np 2 inside the batch job's
 * allocation (2 tasks), rank 0's progress back through kiln-agent. */
static void multi_worker_job_runs_under_mpirun_in_the_allocation(void **state) {
  (void)state;
  need_cluster_and_data();
#ifndef KILN_TEST_MPI
  printf("SKIP: this kiln is built without MPI: multi_worker needs mpirun\n");
  skip();
#endif
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
    printf("SKIP: the one node has 1 CPU; 2 workers need 2 Slurm tasks\n");
    skip();
  }
  char *spec = spec_text("slurm-mpi", 1, ",\"strategy\":{\"type\":\"multi_worker\",\"workers\":2}");
  /* 2 devices: a core per worker */
  char *at = strstr(spec, "\"devices\":1");
  assert_non_null(at);
  at[10] = '2';
  char *job = create_job(spec);
  free(spec);
  json_decref(wait_state(job, "SUCCEEDED", 120));
  char *events = events_text(job);
  assert_non_null(strstr(events, "attempt 1), under mpirun"));
  free(events);
  char slurm_id[32], cmd[160], out[512];
  slurm_job_of(job, 1, slurm_id, sizeof slurm_id);
  /* Slurm gave the batch job 2 tasks (completion log: ProcCnt) */
  snprintf(cmd, sizeof cmd, "sacct -c -n -P -j %s -o AllocCPUS,State", slurm_id);
  assert_int_equal(it_run(out, sizeof out, cmd), 0);
  printf("  job %s: batch job %s (AllocCPUS|State) %s", job, slurm_id, out);
  assert_string_equal(out, "2|COMPLETED\n");
  free(job);
}

/* A job whose batch job Slurm keeps PENDING (the node is full) stays
 * STARTING, and its cancel reaches Slurm there too. */
static void pending_batch_job_keeps_the_job_starting_until_cancelled(void **state) {
  (void)state;
  need_cluster_and_data();
  char cmd[256], out[1024], filler[32];
  snprintf(cmd, sizeof cmd, "sbatch --parsable -o /dev/null -n %ld --wrap 'sleep 120'",
           sysconf(_SC_NPROCESSORS_ONLN));
  assert_int_equal(it_run(out, sizeof out, cmd), 0);
  snprintf(filler, sizeof filler, "%.*s", (int)strspn(out, "0123456789"), out);
  char *spec = spec_text("slurm-pending", 1, NULL);
  char *job = create_job(spec);
  free(spec);
  char slurm_id[32] = "";
  long long until = it_now_ms() + 30000;
  while (!slurm_id[0] && it_now_ms() < until) {
    char *events = events_text(job);
    int submitted = strstr(events, "SLURM_SUBMITTED") != NULL;
    free(events);
    if (submitted)
      slurm_job_of(job, 1, slurm_id, sizeof slurm_id);
    else
      usleep(200 * 1000);
  }
  assert_true(slurm_id[0] != '\0');
  sleep(3); /* a few of kilnd's polls: Slurm still has it pending */
  json_t *doc = get_job(job);
  assert_string_equal(json_string_value(json_object_get(doc, "state")), "STARTING");
  json_decref(doc);
  snprintf(cmd, sizeof cmd, "squeue -h -j %s -o %%T", slurm_id);
  assert_int_equal(it_run(out, sizeof out, cmd), 0);
  assert_string_equal(out, "PENDING\n");
  char path[128];
  long status;
  snprintf(path, sizeof path, "/v1/jobs/%s:cancel", job);
  json_decref(call("POST", path, "{}", &status));
  assert_int_equal(status, 200);
  json_decref(wait_state(job, "CANCELLED", 30));
  until = it_now_ms() + 20000;
  while (squeue_lists(slurm_id) && it_now_ms() < until) usleep(250 * 1000);
  assert_false(squeue_lists(slurm_id));
  snprintf(cmd, sizeof cmd, "scancel %s", filler);
  it_run(out, sizeof out, cmd);
  until = it_now_ms() + 20000;
  while (squeue_lists(filler) && it_now_ms() < until) usleep(250 * 1000);
  free(job);
}

static void node_down_mid_job_requeues_it_and_it_resumes(void **state) {
  (void)state;
  need_cluster_and_data();
  /* long enough to be seen running with a checkpoint before it could end
   * (kilnd polls Slurm every few seconds; 30 epochs once ended in under 3) */
  char *spec = spec_text("slurm-node-down", 150, ",\"max_restarts\":0");
  char *job = create_job(spec);
  free(spec);
  json_decref(wait_state(job, "RUNNING", 60));
  /* a checkpoint first, so the next attempt resumes from it */
  char path[128];
  long status;
  snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", job);
  long long until = it_now_ms() + 60000;
  for (;;) {
    json_t *doc = call("GET", path, NULL, &status);
    size_t n = json_array_size(json_object_get(doc, "checkpoints"));
    json_decref(doc);
    if (n > 0) break;
    if (it_now_ms() > until) fail_msg("job %s wrote no checkpoint in 60 s", job);
    usleep(100 * 1000);
  }
  char cmd[256], out[1024];
  snprintf(cmd, sizeof cmd, "scontrol update nodename=%s state=down reason=kiln-test",
           getenv("KILN_SLURM_NODE"));
  assert_int_equal(it_run(out, sizeof out, cmd), 0);
  /* Slurm ends the batch job NODE_FAIL; kilnd requeues it (not against
   * max_restarts 0). The node comes back (ReturnToService=2, or resume). */
  until = it_now_ms() + 30000;
  char *events = NULL;
  for (;;) {
    events = events_text(job);
    if (strstr(events, "NODE_FAIL")) break;
    if (it_now_ms() > until) {
      printf("%s\n", events);
      fail_msg("no NODE_FAIL requeue of %s within 30 s", job);
    }
    free(events);
    usleep(200 * 1000);
  }
  free(events);
  snprintf(cmd, sizeof cmd, "scontrol update nodename=%s state=resume 2>&1; true",
           getenv("KILN_SLURM_NODE"));
  it_run(out, sizeof out, cmd);
  json_t *doc = wait_state(job, "SUCCEEDED", 120);
  assert_int_equal(json_integer_value(json_object_get(doc, "infra_restarts")), 1);
  assert_int_equal(json_integer_value(json_object_get(doc, "restarts")), 0);
  json_decref(doc);
  char first[32], second[32];
  slurm_job_of(job, 1, first, sizeof first);
  slurm_job_of(job, 2, second, sizeof second);
  assert_string_not_equal(first, second);
  events = events_text(job);
  assert_non_null(strstr(events, "resuming from step"));
  free(events);
  printf("  job %s: Slurm batch job %s ended NODE_FAIL, requeued, resumed as batch job %s, "
         "SUCCEEDED\n",
         job, first, second);
  free(job);
}

/* kilnd killed mid-job: the kilnd that starts on its data cancels the
 * batch job it left (by name, the job's id) and runs the job again. */
static void kilnd_killed_mid_job_cancels_the_batch_job_when_it_restarts(void **state) {
  (void)state;
  need_cluster_and_data();
  char *spec = spec_text("slurm-kilnd-killed", 150, NULL); /* still running when kilnd dies */
  char *job = create_job(spec);
  free(spec);
  json_decref(wait_state(job, "RUNNING", 60));
  char first[32], second[32];
  slurm_job_of(job, 1, first, sizeof first);
  assert_true(squeue_lists(first));
  assert_int_equal(kill(kilnd_pid, SIGKILL), 0);
  waitpid(kilnd_pid, NULL, 0);
  assert_int_equal(launch_kilnd(), 0);
  long long restarted = it_now_ms();
  while (squeue_lists(first) && it_now_ms() - restarted < 20000) usleep(250 * 1000);
  assert_false(squeue_lists(first));
  /* cancelled, not run to its end (the completion log says which) */
  char cmd[128], out[256];
  snprintf(cmd, sizeof cmd, "sacct -c -n -P -j %s -o State", first);
  assert_int_equal(it_run(out, sizeof out, cmd), 0);
  printf("  batch job %s ended %s", first, out);
  assert_int_equal(strncmp(out, "CANCELLED", 9), 0);
  json_t *doc = wait_state(job, "SUCCEEDED", 120);
  json_decref(doc);
  slurm_job_of(job, 2, second, sizeof second);
  assert_string_not_equal(first, second);
  char *events = events_text(job);
  assert_non_null(strstr(events, "SERVER_RESTARTED"));
  free(events);
  printf("  job %s: batch job %s cancelled by the restarted kilnd, ran again as %s\n", job, first,
         second);
  free(job);
}

/* --only PATTERN or --skip PATTERN (cmocka's: * and ?) picks tests by
 * name: ctest runs the suite in two halves, each under a minute. */
int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--only") == 0) cmocka_set_test_filter(argv[2]);
  if (argc == 3 && strcmp(argv[1], "--skip") == 0) cmocka_set_skip_filter(argv[2]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(job_on_a_slurm_pool_trains_and_succeeds),
      cmocka_unit_test(job_ending_between_two_polls_keeps_its_progress),
      cmocka_unit_test(cancel_ends_the_batch_job_in_slurm),
      cmocka_unit_test(multi_worker_job_runs_under_mpirun_in_the_allocation),
      cmocka_unit_test(pending_batch_job_keeps_the_job_starting_until_cancelled),
      cmocka_unit_test(node_down_mid_job_requeues_it_and_it_resumes),
      cmocka_unit_test(kilnd_killed_mid_job_cancels_the_batch_job_when_it_restarts),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
