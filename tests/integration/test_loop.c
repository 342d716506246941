/* The training loop's options through a real kilnd and kiln-train:
 * gradient accumulation, a warmup + cosine schedule, top-k accuracy,
 * validation every N steps, early stopping that ends the job (said in its
 * events) and a profile served at /v1/jobs/{id}/profile; and a multi_worker
 * job and a parameter_server job under mpirun that each lose a rank to
 * SIGKILL, leave RUNNING at once and resume from their checkpoint to
 * succeed. */
#include <dirent.h>
#include <jansson.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static char data_dir[256], base_url[64], token[128];
static pid_t kilnd_pid;

static long get(const char *path, char **body) {
  long status = it_request(base_url, token, "GET", path, NULL, 0, body);
  if (status == 0) fail_msg("GET %s: %s", path, body && *body ? *body : "no answer");
  return status;
}

static json_t *get_json(const char *path, long want) {
  char *text = NULL;
  long status = get(path, &text);
  if (status != want) fail_msg("GET %s: %ld, wanted %ld: %s", path, status, want, text);
  json_t *doc = json_loads(text, 0, NULL);
  if (!doc) fail_msg("GET %s: not JSON: %.200s", path, text);
  free(text);
  return doc;
}

/* A job's points of one metric, as JSON text (the caller frees it). */
static char *metric_text(const char *id, const char *name) {
  char path[256];
  snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=%s", id, name);
  json_t *m = get_json(path, 200);
  char *text = json_dumps(m, 0);
  json_decref(m);
  return text;
}

static int start(void **state) {
  (void)state;
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-it-loop-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  return it_launch_kilnd(KILND_PATH, data_dir, KILN_TRAIN_PATH, NULL, NULL, &kilnd_pid, base_url,
                         sizeof base_url, token, sizeof token);
}

static int stop(void **state) {
  (void)state;
  return it_stop_kilnd(kilnd_pid, data_dir) == 0 ? 0 : -1;
}

static const char spec[] =
    "{\"display_name\":\"loop-options\","
    "\"model\":{\"input_shape\":[28,28,1],\"layers\":[{\"type\":\"flatten\"},"
    "{\"type\":\"dense\",\"units\":32,\"activation\":\"relu\"},{\"type\":\"dense\",\"units\":10}]},"
    "\"loss\":\"sparse_categorical_crossentropy\","
    "\"metrics\":[\"accuracy\",{\"type\":\"top_k_accuracy\",\"k\":3}],"
    "\"dataset\":{\"name\":\"fashion-mnist\",\"validation\":\"test\"},"
    "\"pipeline\":{\"batch_size\":32,\"take\":2048},"
    "\"optimizer\":{\"type\":\"adam\",\"learning_rate\":0.002,\"global_clipnorm\":5,"
    "\"schedule\":{\"type\":\"cosine\",\"decay_steps\":64,\"warmup_steps\":4}},"
    "\"gradient_accumulation_steps\":4,\"validation_every_steps\":10,\"log_every_steps\":4,"
    "\"callbacks\":{\"early_stopping\":{\"monitor\":\"val_loss\",\"mode\":\"max\","
    "\"patience\":1}},"
    "\"profile\":{\"steps\":[2,4]},\"epochs\":6,\"seed\":3}";

/* Creates a job from spec text, waits for it to end and checks it
 * SUCCEEDED; its id in id, the job resource returned. */
static json_t *create_and_finish(const char *spec_text, char *id, size_t id_len) {
  char *text = NULL, path[256];
  long status =
      it_request(base_url, token, "POST", "/v1/jobs", spec_text, strlen(spec_text), &text);
  if (status != 200) fail_msg("create: %ld %s", status, text);
  json_t *job = json_loads(text, 0, NULL);
  free(text);
  snprintf(id, id_len, "%s", json_string_value(json_object_get(job, "id")));
  json_decref(job);
  snprintf(path, sizeof path, "/v1/jobs/%s:wait?timeout=240s", id);
  status = it_request(base_url, token, "POST", path, "", 0, &text);
  free(text);
  snprintf(path, sizeof path, "/v1/jobs/%s", id);
  job = get_json(path, 200);
  assert_string_equal(json_string_value(json_object_get(job, "state")), "SUCCEEDED");
  return job;
}

static void loop_options_run_end_to_end(void **state) {
  (void)state;
  char *text = NULL, id[64], path[256];
  /* 2048 examples, batches of 32 four to a step: 16 steps an epoch.
   * Under mode max a falling val_loss never improves: epoch 2 ends it. */
  json_decref(create_and_finish(spec, id, sizeof id));

  snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
  char *events = NULL;
  assert_int_equal(get(path, &events), 200);
  if (!strstr(events, "early stopping at epoch 2: val_loss"))
    fail_msg("no early-stopping event: %.2000s", events);
  assert_non_null(strstr(events, "profile of steps 2 to 4 written"));
  free(events);

  /* The job's log has the trainer's progress in words. */
  snprintf(path, sizeof path, "/v1/jobs/%s/logs", id);
  char *log = NULL;
  assert_int_equal(get(path, &log), 200);
  if (!strstr(log, "epoch 2/6  done at step 32") || !strstr(log, "early stopping at epoch 2"))
    fail_msg("the log lacks the progress lines: %.2000s", log);
  free(log);

  /* Steps count updates; the rate follows warmup then cosine; top-3 and
   * the mid-epoch validation are recorded. */
  text = metric_text(id, "learning_rate");
  assert_non_null(strstr(text, "\"step\": 4"));
  assert_non_null(strstr(text, "\"step\": 32"));
  assert_null(strstr(text, "\"step\": 36"));
  free(text);
  text = metric_text(id, "val_top_k_accuracy");
  assert_non_null(strstr(text, "\"step\": 10")); /* every 10 steps */
  assert_non_null(strstr(text, "\"step\": 16")); /* and each epoch's end */
  free(text);

  /* The profile, as a trace and as a table; a bad format is a 400. */
  snprintf(path, sizeof path, "/v1/jobs/%s/profile", id);
  json_t *trace = get_json(path, 200);
  json_t *list = json_object_get(trace, "traceEvents");
  assert_true(json_is_array(list) && json_array_size(list) > 10);
  json_decref(trace);
  snprintf(path, sizeof path, "/v1/jobs/%s/profile?format=table", id);
  assert_int_equal(get(path, &text), 200);
  assert_non_null(strstr(text, "3 profiled steps"));
  free(text);
  snprintf(path, sizeof path, "/v1/jobs/%s/profile?format=svg", id);
  json_t *bad = get_json(path, 400);
  assert_string_equal(json_string_value(json_object_get(json_object_get(bad, "error"), "status")),
                      "INVALID_ARGUMENT");
  json_decref(bad);
  json_t *missing = get_json("/v1/jobs/no-such-job/profile", 404);
  json_decref(missing);
}

static const char mixed_spec[] =
    "{\"display_name\":\"mixed-precision\","
    "\"model\":{\"input_shape\":[28,28,1],\"layers\":["
    "{\"type\":\"conv2d\",\"filters\":4,\"kernel_size\":3,\"activation\":\"relu\"},"
    "{\"type\":\"max_pool2d\"},{\"type\":\"flatten\"},{\"type\":\"dense\",\"units\":10}]},"
    "\"loss\":\"sparse_categorical_crossentropy\","
    "\"dataset\":{\"name\":\"fashion-mnist\",\"validation\":\"none\"},"
    "\"pipeline\":{\"batch_size\":32,\"take\":512},"
    "\"optimizer\":{\"type\":\"adam\",\"learning_rate\":0.002},"
    "\"precision\":\"mixed_float16\",\"recompute\":true,\"log_every_steps\":4,\"seed\":5}";

static void mixed_precision_job_reports_its_plan_and_loss_scale(void **state) {
  (void)state;
  char id[64];
  json_t *job = create_and_finish(mixed_spec, id, sizeof id);
  char *text = json_dumps(job, JSON_COMPACT);
  assert_non_null(strstr(text, "\"precision\":\"mixed_float16\",\"recompute\":true"));
  free(text);
  json_decref(job);

  /* 512 examples in batches of 32: 16 steps, the scale logged every 4. */
  text = metric_text(id, "loss_scale");
  assert_non_null(strstr(text, "\"step\": 4"));
  assert_non_null(strstr(text, "\"step\": 16"));
  free(text);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *job_state(const char *id, char *out, size_t len) {
  char path[128];
  snprintf(path, sizeof path, "/v1/jobs/%s", id);
  json_t *job = get_json(path, 200);
  snprintf(out, len, "%s", json_string_value(json_object_get(job, "state")));
  json_decref(job);
  return out;
}

/* A child of parent whose command is kiln-train, or 0. */
static pid_t trainer_child(pid_t parent) {
  DIR *proc = opendir("/proc");
  pid_t found = 0;
  struct dirent *e;
  while (proc && !found && (e = readdir(proc)) != NULL) {
    char path[300], comm[64] = "";
    int ppid = 0;
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    if (fscanf(f, "%*d (%63[^)]) %*c %d", comm, &ppid) == 2 && ppid == parent &&
        strcmp(comm, "kiln-train") == 0)
      found = (pid_t)atoi(e->d_name);
    fclose(f);
  }
  if (proc) closedir(proc);
  return found;
}

/* An MLP job on 12,800 Fashion-MNIST examples that checkpoints every 50
 * steps and may restart once, under a strategy. */
#define RANK_LOSS_SPEC(name, strategy, epochs)                                                     \
  "{\"display_name\":\"" name "\","                                                                \
  "\"model\":{\"input_shape\":[28,28,1],\"layers\":[{\"type\":\"flatten\"},"                       \
  "{\"type\":\"dense\",\"units\":128,\"activation\":\"relu\"},{\"type\":\"dense\",\"units\":10}]}" \
  ","                                                                                              \
  "\"loss\":\"sparse_categorical_crossentropy\","                                                  \
  "\"dataset\":{\"name\":\"fashion-mnist\",\"validation\":\"none\"},"                              \
  "\"pipeline\":{\"batch_size\":32,\"take\":12800},"                                               \
  "\"optimizer\":{\"type\":\"sgd\",\"learning_rate\":0.05},"                                       \
  "\"strategy\":" strategy ","                                                                     \
  "\"checkpoint\":{\"every_steps\":50},\"max_restarts\":1,"                                        \
  "\"epochs\":" epochs ",\"log_every_steps\":50,\"seed\":5}"

static const char multi_worker_spec[] =
    RANK_LOSS_SPEC("rank-loss", "{\"type\":\"multi_worker\",\"workers\":2}", "6");

/* One worker and one server (two processes, so two cores do): pushes and
 * pulls every step. */
static const char parameter_server_spec[] =
    RANK_LOSS_SPEC("server-loss", "{\"type\":\"parameter_server\",\"ps\":1,\"workers\":1}", "3");

/* A job under mpirun (started as `processes` says) loses a rank to
 * SIGKILL: it leaves RUNNING within 30 s and is retried from its newest
 * checkpoint to success. */
static void mpi_job_survives_a_killed_rank(const char *job_spec, const char *processes) {
#ifndef KILN_TEST_MPI
  (void)job_spec;
  (void)processes;
  printf("SKIPPED: multi_worker and parameter_server need kiln built with MPI (KILN_MPI=ON)\n");
  skip();
#endif
  char *text = NULL, id[64], path[512], st[32];
  long status = it_request(base_url, token, "POST", "/v1/jobs", job_spec, strlen(job_spec), &text);
  if (status != 200) fail_msg("create: %ld %s", status, text);
  json_t *job = json_loads(text, 0, NULL);
  free(text);
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(job, "id")));
  json_decref(job);

  /* Running under mpirun, with the step-50 checkpoint written. */
  snprintf(path, sizeof path, "%s/jobs/%s/checkpoints/ckpt-00000050.safetensors", data_dir, id);
  double give_up = now_s() + 120;
  while (access(path, R_OK) != 0 && now_s() < give_up) usleep(50 * 1000);
  assert_int_equal(access(path, R_OK), 0);
  /* ... and recorded by kilnd (the file comes first): a retry resumes from
   * what the store lists, so a kill before that would start over. */
  snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", id);
  char *listed = NULL;
  while (now_s() < give_up) {
    free(listed);
    listed = NULL;
    if (get(path, &listed) == 200 && strstr(listed, "\"step\":50")) break;
    usleep(50 * 1000);
  }
  if (!listed || !strstr(listed, "\"step\":50")) fail_msg("step 50 not listed: %.500s", listed);
  free(listed);
  assert_string_equal(job_state(id, st, sizeof st), "RUNNING");
  snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
  char *events = NULL;
  assert_int_equal(get(path, &events), 200);
  const char *started = strstr(events, "mpirun started (pid ");
  if (!started) fail_msg("no mpirun start event: %.2000s", events);
  if (!strstr(started, processes)) fail_msg("not started as %s: %.300s", processes, started);
  pid_t mpirun = (pid_t)atoi(started + strlen("mpirun started (pid "));
  free(events);
  pid_t rank = trainer_child(mpirun);
  assert_true(rank > 0);

  /* SIGKILL one rank: the job leaves RUNNING within 30 s. */
  const double killed_at = now_s();
  assert_int_equal(kill(rank, SIGKILL), 0);
  while (strcmp(job_state(id, st, sizeof st), "RUNNING") == 0 && now_s() < killed_at + 30)
    usleep(100 * 1000);
  const double left_after = now_s() - killed_at;
  printf("rank %d killed: the job was %s %.1f s later\n", (int)rank, st, left_after);
  assert_true(left_after < 30);

  /* max_restarts 1: it goes again from its newest checkpoint, and ends.
   * Polled: one request may not outlast the client's 30 s timeout. */
  give_up = now_s() + 240;
  while ((strcmp(job_state(id, st, sizeof st), "QUEUED") == 0 || strcmp(st, "STARTING") == 0 ||
          strcmp(st, "RUNNING") == 0) &&
         now_s() < give_up)
    usleep(200 * 1000);
  assert_string_equal(st, "SUCCEEDED");
  snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
  assert_int_equal(get(path, &events), 200);
  if (!strstr(events, "RETRYING") || !strstr(events, "resuming from step")) {
    const char *retry = strstr(events, "RETRYING");
    fail_msg("no retry from a checkpoint in the events: %.900s", retry ? retry : events);
  }
  free(events);
}

static void multi_worker_job_survives_a_killed_rank(void **state) {
  (void)state;
  mpi_job_survives_a_killed_rank(multi_worker_spec, "as 2 kiln-train workers");
}

static void parameter_server_job_survives_a_killed_rank(void **state) {
  (void)state;
  mpi_job_survives_a_killed_rank(parameter_server_spec,
                                 "as 2 kiln-train processes (workers 1, parameter servers 1)");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(loop_options_run_end_to_end),
      cmocka_unit_test(mixed_precision_job_reports_its_plan_and_loss_scale),
      cmocka_unit_test(multi_worker_job_survives_a_killed_rank),
      cmocka_unit_test(parameter_server_job_survives_a_killed_rank),
  };
  return cmocka_run_group_tests(tests, start, stop);
}
