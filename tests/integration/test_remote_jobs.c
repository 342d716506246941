/* test_remote_jobs.c — jobs on a pool of agents through a real kilnd: the
 * test is the worker side. It registers agents, takes their commands, runs the real
 * kiln-train a `start` command describes, and posts its progress lines,
 * checkpoints and exit through the allocation routes with the allocation's
 * token. Shown: a job runs on its agent and succeeds with its metrics and
 * checkpoint recorded; cancel sends `signal`; a LOST agent's job is
 * requeued from its checkpoint (infra_restarts, not max_restarts) and
 * resumes on another host; bad tokens and a bad checkpoint sha256 change
 * nothing; the relay runs only orted on a host of the allocation. The
 * agents are driven over their own routes (register, poll, :done) with an
 * agent token. */
#define _GNU_SOURCE /* strcasestr */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common.h"
#include "harness.h"

static char data_dir[256], base_url[64], admin_token[128], work_dir[300];
static pid_t kilnd_pid;
static char agent_token[128];
static char ended_alloc[64]; /* the first test's allocation, ended since */
static const char *datasets_dir;

/* A small run of the example: 20 steps an epoch, a checkpoint every 10. */
static char *spec_text(const char *name, int epochs, const char *pool, int devices,
                       const char *extra) {
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
           "\"resources\":{\"device_type\":\"cpu\",\"devices\":%d,\"pool\":\"%s\"}%s}",
           name, epochs, devices, pool, extra ? extra : "");
  return text;
}

static json_t *call(const char *token, const char *method, const char *path, const char *body,
                    long *status) {
  char *out = NULL;
  *status = it_request(base_url, token, method, path, body, body ? strlen(body) : 0, &out);
  json_t *doc = out ? json_loads(out, 0, NULL) : NULL;
  if (!doc && out && *status >= 400)
    fprintf(stderr, "%s %s -> %ld %s\n", method, path, *status, out);
  free(out);
  return doc;
}

static char *create_job(const char *spec) {
  long status;
  json_t *doc = call(admin_token, "POST", "/v1/jobs", spec, &status);
  if (status != 200) fail_msg("create: %ld", status);
  char *id = strdup(json_string_value(json_object_get(doc, "id")));
  json_decref(doc);
  return id;
}

static json_t *get_job(const char *id) {
  char path[128];
  snprintf(path, sizeof path, "/v1/jobs/%s", id);
  long status;
  json_t *doc = call(admin_token, "GET", path, NULL, &status);
  assert_int_equal(status, 200);
  return doc;
}

/* Waits up to limit_s for the job to reach state; its resource. */
static json_t *wait_state(const char *id, const char *state, int limit_s) {
  long long until = it_now_ms() + limit_s * 1000LL;
  for (;;) {
    json_t *doc = get_job(id);
    const char *now = json_string_value(json_object_get(doc, "state"));
    if (strcmp(now, state) == 0) return doc;
    if (it_now_ms() > until) fail_msg("job %s is %s, not %s, after %d s", id, now, state, limit_s);
    json_decref(doc);
    usleep(100 * 1000);
  }
}

/* ---- the worker side ---- */

typedef struct fake_agent {
  char id[32], name[64];
  int64_t seen_seq; /* the highest command seq taken */
  int heartbeat;    /* polls while it waits (0: a dead agent) */
} fake_agent;

/* The agents' heartbeats, as a kiln-agent's poll loop gives them whatever
 * else it is doing: a thread polls for each live agent every 500 ms past
 * every command (taking none). */
#define MAX_BEATING 16
static struct {
  char id[32];
  int alive;
} beating[MAX_BEATING];
static int n_beating, beats_stop;
static pthread_mutex_t beating_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t beat_thread;

static void set_beating(const char *id, int alive) {
  pthread_mutex_lock(&beating_lock);
  int i = 0;
  while (i < n_beating && strcmp(beating[i].id, id) != 0) i++;
  if (i == n_beating && n_beating < MAX_BEATING)
    snprintf(beating[n_beating++].id, sizeof beating[0].id, "%.31s", id);
  if (i < n_beating) beating[i].alive = alive;
  pthread_mutex_unlock(&beating_lock);
}

/* Every agent falls silent (a test's hosts go away when it ends). */
static void silence_all(void) {
  pthread_mutex_lock(&beating_lock);
  for (int i = 0; i < n_beating; i++) beating[i].alive = 0;
  pthread_mutex_unlock(&beating_lock);
}

static void *beat_main(void *arg) {
  (void)arg;
  for (;;) {
    char ids[MAX_BEATING][32];
    int n = 0;
    pthread_mutex_lock(&beating_lock);
    int stop = beats_stop;
    for (int i = 0; i < n_beating; i++)
      if (beating[i].alive) memcpy(ids[n++], beating[i].id, sizeof ids[0]);
    pthread_mutex_unlock(&beating_lock);
    if (stop) return NULL;
    for (int i = 0; i < n; i++) {
      char path[160];
      snprintf(path, sizeof path, "/v1/agents/%.31s/commands?after=1000000000&wait=0s", ids[i]);
      it_request(base_url, agent_token, "GET", path, NULL, 0, NULL);
    }
    usleep(500 * 1000);
  }
}

/* After each test: its hosts go away. */
static int silence(void **state) {
  (void)state;
  silence_all();
  return 0;
}

static void heartbeat(fake_agent *a) {
  set_beating(a->id, a->heartbeat);
}

/* Registers (or registers again) an agent over HTTP with the agent token,
 * saying it runs the allocation running (NULL: none). */
static void agent_register_in(fake_agent *a, const char *pool, const char *name, int cpus,
                              const char *running) {
  char body[512];
  snprintf(body, sizeof body,
           "{\"name\":\"%s\",\"hostname\":\"%s\",\"pool\":\"%s\",\"address\":"
           "\"127.0.0.1\",\"cpus\":%d,\"version\":\"test\",\"running\":[%s%s%s]}",
           name, name, pool, cpus, running ? "\"" : "", running ? running : "",
           running ? "\"" : "");
  long status;
  json_t *doc = call(agent_token, "POST", "/v1/agents", body, &status);
  if (status != 200 && status != 201) fail_msg("register %s: %ld", name, status);
  /* The pool's own grace window (the pools file: hosts 3 s, quick 30 s),
   * and a heartbeat that fits it three times. */
  const json_int_t grace_s = strcmp(pool, "quick") == 0 ? 30 : 3;
  const json_int_t heartbeat_s = json_integer_value(json_object_get(doc, "heartbeat_s"));
  assert_int_equal(json_integer_value(json_object_get(doc, "grace_s")), grace_s);
  assert_true(heartbeat_s >= 1 && heartbeat_s * 3 <= grace_s);
  memset(a, 0, sizeof *a);
  snprintf(a->id, sizeof a->id, "%s", json_string_value(json_object_get(doc, "id")));
  snprintf(a->name, sizeof a->name, "%s", name);
  a->seen_seq = json_integer_value(json_object_get(doc, "next_seq")) - 1;
  a->heartbeat = 1;
  set_beating(a->id, 1);
  json_decref(doc);
}

static void agent_register_running(fake_agent *a, const char *name, int cpus, const char *running) {
  agent_register_in(a, "hosts", name, cpus, running);
}

static void agent_register(fake_agent *a, const char *name, int cpus) {
  agent_register_in(a, "hosts", name, cpus, NULL);
}

/* The agent's next command of kind (others before it are carried out as
 * far as the test goes: reported done) within limit_s; its fields with
 * seq, or NULL. */
static json_t *next_command(fake_agent *a, const char *kind, int limit_s) {
  long long until = it_now_ms() + limit_s * 1000LL;
  do {
    char path[160];
    snprintf(path, sizeof path, "/v1/agents/%s/commands?after=%lld&wait=%s", a->id,
             (long long)a->seen_seq, limit_s > 0 ? "1s" : "0s");
    long status;
    json_t *doc = call(agent_token, "GET", path, NULL, &status);
    assert_int_equal(status, 200);
    json_t *found = NULL, *c;
    size_t i;
    json_array_foreach(json_object_get(doc, "commands"), i, c) {
      if (found) break;
      a->seen_seq = json_integer_value(json_object_get(c, "seq"));
      char done[160];
      snprintf(done, sizeof done, "/v1/agents/%s/commands/%lld:done", a->id,
               (long long)a->seen_seq);
      const char *ok = strcmp(json_string_value(json_object_get(c, "kind")), "exec") == 0
                           ? "{\"ok\":true,\"exit_code\":0}"
                           : "{\"ok\":true}";
      json_decref(call(agent_token, "POST", done, ok, &status));
      assert_int_equal(status, 200);
      if (strcmp(json_string_value(json_object_get(c, "kind")), kind) == 0) found = json_incref(c);
    }
    json_decref(doc);
    if (found) return found;
  } while (it_now_ms() < until);
  return NULL;
}

/* The agent's state as an admin sees it. */
static int agent_lost(const char *name) {
  char path[160];
  snprintf(path, sizeof path, "/v1/agents/%s", name);
  long status;
  json_t *doc = call(admin_token, "GET", path, NULL, &status);
  int lost = status == 200 && strcmp(json_string_value(json_object_get(doc, "state")), "LOST") == 0;
  json_decref(doc);
  return lost || status == 404;
}

static long post_as(const char *token, const char *method, const char *path, const char *body,
                    size_t len, char **out) {
  return it_request(base_url, token, method, path, body, len, out);
}

/* Uploads a file of the checkpoint as part; the server's path (malloc'd). */
static char *upload(const char *alloc, const char *token, long long step, const char *file,
                    const char *part) {
  char *data = NULL;
  FILE *f = fopen(file, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  data = malloc((size_t)len + 1);
  assert_int_equal(fread(data, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  char hash[65], path[512];
  kc_sha256_hex_of(data, (size_t)len, hash);
  snprintf(path, sizeof path, "/v1/allocations/%s/checkpoints/%lld?sha256=%s&part=%s", alloc, step,
           hash, part);
  char *out = NULL;
  long status = post_as(token, "PUT", path, data, (size_t)len, &out);
  free(data);
  if (status != 200) fail_msg("upload %s: %ld %s", file, status, out ? out : "");
  json_t *doc = json_loads(out, 0, NULL);
  free(out);
  char *server_path = strdup(json_string_value(json_object_get(doc, "path")));
  assert_string_equal(json_string_value(json_object_get(doc, "sha256")), hash);
  json_decref(doc);
  return server_path;
}

/* Fetches url_path with the token into file (curl's -I for HEAD), and the
 * value of one response header; the HTTP status. */
static long fetch(const char *token, const char *method, const char *url_path, const char *file,
                  const char *header, char *value, size_t value_len) {
  char headers_file[600], cmd[2048], out[256];
  snprintf(headers_file, sizeof headers_file, "%s.headers", file);
  snprintf(cmd, sizeof cmd,
           "curl -s %s -o '%s' -D '%s' -w '%%{http_code}' -H 'Authorization: Bearer %s' '%s%s'",
           strcmp(method, "HEAD") == 0 ? "-I" : "", file, headers_file, token, base_url, url_path);
  it_run(out, sizeof out, cmd);
  char *headers = it_read_file(headers_file);
  char key[80];
  snprintf(key, sizeof key, "%s: ", header);
  value[0] = '\0';
  char *at = headers ? strcasestr(headers, key) : NULL;
  if (at) {
    at += strlen(key);
    snprintf(value, value_len, "%.*s", (int)strcspn(at, "\r\n"), at);
  }
  free(headers);
  return strtol(out, NULL, 10);
}

/* Downloads the resume checkpoint's part into file; the HTTP status. */
static long download_resume(const char *alloc, const char *token, const char *part,
                            const char *file, char *step_header, size_t step_len) {
  char path[300];
  snprintf(path, sizeof path, "/v1/allocations/%s/resume?part=%s", alloc, part);
  return fetch(token, "GET", path, file, "X-Kiln-Step", step_header, step_len);
}

/* The job's data set as the allocation's agent gets it: HEAD for its hash,
 * the tar stream checked against it, unpacked into dir/data. */
static void fetch_dataset(const char *alloc, const char *token, const char *dir, char *data_dir_out,
                          size_t len) {
  char path[300], file[700], hash[100], again[100], cmd[4096], out[4096];
  snprintf(path, sizeof path, "/v1/allocations/%s/dataset", alloc);
  snprintf(file, sizeof file, "%s/data.tar", dir);
  assert_int_equal(fetch(token, "HEAD", path, file, "X-Kiln-Content-Sha256", hash, sizeof hash),
                   200);
  assert_int_equal(strlen(hash), 64);
  assert_int_equal(fetch(token, "GET", path, file, "X-Kiln-Content-Sha256", again, sizeof again),
                   200);
  assert_string_equal(again, hash);
  snprintf(cmd, sizeof cmd, "sha256sum '%s' | cut -d' ' -f1", file);
  it_run(out, sizeof out, cmd);
  out[strcspn(out, "\n")] = '\0';
  assert_string_equal(out, hash); /* what came is what the hash says */
  snprintf(data_dir_out, len, "%s/data", dir);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s' && tar -xf '%s' -C '%s' && ls -R '%s'", data_dir_out,
           file, data_dir_out, data_dir_out);
  assert_int_equal(it_run(out, sizeof out, cmd), 0);
  printf("data set unpacked: %.300s\n", out);
}

typedef struct attempt {
  json_t *start;     /* the start command */
  const char *alloc; /* in start */
  const char *token;
  int checkpoints;     /* checkpoint lines posted */
  int die_after_ckpt;  /* stop everything (a dead host) after this many checkpoints */
  int fetch_dataset;   /* train on the data set fetched from kilnd, not the local copy */
  int cancel_expected; /* a signal command is expected: obey it */
  char signal_seen[8];
} attempt;

/* Runs kiln-train as the start command says and forwards what it writes;
 * posts its exit unless the host "dies". Returns the trainer's wait status. */
static int run_start(fake_agent *a, attempt *at) {
  json_t *spec = json_object_get(at->start, "spec");
  char dir[600], spec_path[700], ckpt_dir[700], resume_path[700], state_path[700], cmd[4096];
  snprintf(dir, sizeof dir, "%s/%s-%s", work_dir, a->name, at->alloc);
  snprintf(spec_path, sizeof spec_path, "%s/spec.json", dir);
  snprintf(ckpt_dir, sizeof ckpt_dir, "%s/ckpt", dir);
  snprintf(resume_path, sizeof resume_path, "%s/resume.safetensors", dir);
  snprintf(state_path, sizeof state_path, "%s/resume.state", dir);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", ckpt_dir);
  assert_int_equal(system(cmd), 0);
  char *spec_json = json_dumps(spec, 0);
  assert_int_equal(it_write_file(spec_path, spec_json, 0600), 0);
  free(spec_json);
  int resume = json_is_true(json_object_get(at->start, "resume"));
  if (resume) {
    char step[32];
    assert_int_equal(
        download_resume(at->alloc, at->token, "weights", resume_path, step, sizeof step), 200);
    assert_true(atoll(step) > 0);
    assert_int_equal(download_resume(at->alloc, at->token, "state", state_path, step, sizeof step),
                     200);
  }
  char fetched[800];
  const char *data = datasets_dir;
  if (at->fetch_dataset) {
    fetch_dataset(at->alloc, at->token, dir, fetched, sizeof fetched);
    data = fetched;
  }
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    /* The progress pipe's write end as fd 3 (the read end may be 3 itself). */
    if (fds[0] != 3) close(fds[0]);
    dup2(fds[1], 3);
    if (fds[1] != 3) close(fds[1]);
    char log[800];
    snprintf(log, sizeof log, "%s/train.log", dir);
    int logfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(logfd, 1);
    dup2(logfd, 2);
    setpgid(0, 0);
    if (resume)
      execl(KILN_TRAIN_PATH, KILN_TRAIN_PATH, "--spec", spec_path, "--progress-fd", "3",
            "--data-dir", data, "--checkpoint-dir", ckpt_dir, "--resume", resume_path,
            (char *)NULL);
    else
      execl(KILN_TRAIN_PATH, KILN_TRAIN_PATH, "--spec", spec_path, "--progress-fd", "3",
            "--data-dir", data, "--checkpoint-dir", ckpt_dir, (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  char path[300];
  snprintf(path, sizeof path, "/v1/allocations/%s/progress", at->alloc);
  char buf[65536];
  size_t used = 0;
  int dead = 0;
  for (;;) {
    heartbeat(a);
    if (at->cancel_expected && !at->signal_seen[0]) {
      json_t *sig = next_command(a, "signal", 0);
      if (sig) {
        snprintf(at->signal_seen, sizeof at->signal_seen, "%s",
                 json_string_value(json_object_get(sig, "signal")));
        assert_string_equal(json_string_value(json_object_get(sig, "alloc")), at->alloc);
        kill(-pid, strcmp(at->signal_seen, "KILL") == 0 ? SIGKILL : SIGTERM);
        json_decref(sig);
      }
    }
    struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
    if (poll(&pfd, 1, 100) <= 0) continue;
    ssize_t got = read(fds[0], buf + used, sizeof buf - 1 - used);
    if (got <= 0) break;
    used += (size_t)got;
    char *line = buf, *nl;
    while ((nl = memchr(line, '\n', used - (size_t)(line - buf)))) {
      *nl = '\0';
      json_t *doc = json_loads(line, 0, NULL);
      json_t *ckpt = json_object_get(doc, "checkpoint");
      char *send = NULL;
      if (ckpt) { /* upload both files, then name kilnd's copy in the line */
        const char *local = json_string_value(json_object_get(ckpt, "path"));
        long long step = json_integer_value(json_object_get(ckpt, "step"));
        char local_state[800];
        snprintf(local_state, sizeof local_state, "%.*s.state",
                 (int)(strlen(local) - strlen(".safetensors")), local);
        char *server = upload(at->alloc, at->token, step, local, "weights");
        free(upload(at->alloc, at->token, step, local_state, "state"));
        json_object_set_new(ckpt, "path", json_string(server));
        free(server);
        send = json_dumps(doc, JSON_COMPACT);
      }
      char *out = NULL;
      long status =
          post_as(at->token, "POST", path, send ? send : line, strlen(send ? send : line), &out);
      if (status != 204) fail_msg("progress: %ld %s", status, out ? out : "");
      free(out);
      free(send);
      json_decref(doc);
      line = nl + 1;
      if (ckpt && ++at->checkpoints == at->die_after_ckpt) {
        dead = 1; /* the host goes away: its trainer with it, no exit posted */
        kill(-pid, SIGKILL);
        a->heartbeat = 0;
        set_beating(a->id, 0);
        break;
      }
    }
    if (dead) break;
    used -= (size_t)(line - buf);
    memmove(buf, line, used);
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (dead) return status;
  char body[128], exit_path[300];
  if (WIFSIGNALED(status))
    snprintf(body, sizeof body, "{\"signal\":%d,\"host\":\"%s\"}", WTERMSIG(status), a->name);
  else
    snprintf(body, sizeof body, "{\"exit_code\":%d,\"host\":\"%s\"}", WEXITSTATUS(status), a->name);
  snprintf(exit_path, sizeof exit_path, "/v1/allocations/%s/exit", at->alloc);
  char *out = NULL;
  long rc = post_as(at->token, "POST", exit_path, body, strlen(body), &out);
  if (rc != 200) fail_msg("exit: %ld %s", rc, out ? out : "");
  free(out);
  return status;
}

static void take_start(fake_agent *a, attempt *at, const char *job) {
  memset(at, 0, sizeof *at);
  at->start = next_command(a, "start", 60);
  if (!at->start) fail_msg("no start command for %s within 60 s", a->name);
  at->alloc = json_string_value(json_object_get(at->start, "alloc"));
  at->token = json_string_value(json_object_get(at->start, "token"));
  assert_non_null(at->alloc);
  assert_non_null(at->token);
  assert_int_equal(strncmp(at->alloc, "alloc-", 6), 0);
  assert_int_equal(strncmp(at->token, "kiln_a_", 7), 0);
  assert_string_equal(json_string_value(json_object_get(at->start, "job")), job);
}

/* ---- the suite ---- */

static int setup(void **state) {
  (void)state;
  datasets_dir = getenv("KILN_DATASETS_DIR");
  if (!datasets_dir || !*datasets_dir) datasets_dir = KILN_DEFAULT_DATASETS_DIR;
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-remote-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  snprintf(work_dir, sizeof work_dir, "%s/hosts", data_dir);
  mkdir(work_dir, 0700);
  char pools[400];
  snprintf(pools, sizeof pools, "%s/pools.json", data_dir);
  if (it_write_file(pools,
                    "{\"pools\":[{\"name\":\"default\",\"devices\":1},{\"name\":\"hosts\","
                    "\"kind\":\"agents\",\"grace_s\":3,\"start_timeout_s\":60},{\"name\":"
                    "\"quick\",\"kind\":\"agents\",\"grace_s\":30,\"start_timeout_s\":2}]}",
                    0600) != 0)
    return -1;
  const char *extra[] = {"--pools", pools, NULL};
  if (it_launch_kilnd_args(KILND_PATH, data_dir, KILN_TRAIN_PATH, extra, &kilnd_pid, base_url,
                           sizeof base_url, admin_token, sizeof admin_token) != 0)
    return -1;
  char cmd[800], out[512];
  snprintf(cmd, sizeof cmd, "%s token create --role agent --data-dir %s", KILND_PATH, data_dir);
  if (it_run(out, sizeof out, cmd) != 0 || strncmp(out, "kiln_", 5) != 0) return -1;
  snprintf(agent_token, sizeof agent_token, "%.*s", (int)strcspn(out, "\n"), out);
  return pthread_create(&beat_thread, NULL, beat_main, NULL) == 0 ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  pthread_mutex_lock(&beating_lock);
  beats_stop = 1;
  pthread_mutex_unlock(&beating_lock);
  pthread_join(beat_thread, NULL);
  it_stop_kilnd(kilnd_pid, data_dir);
  return 0;
}

static void need_datasets(void) {
  if (!datasets_dir || access(datasets_dir, R_OK) != 0) {
    printf("skipped: the built-in data sets are not at %s (KILN_DATASETS_DIR)\n", datasets_dir);
    skip();
  }
}

static void job_on_an_agent_succeeds_with_metrics_and_checkpoints(void **state) {
  (void)state;
  need_datasets();
  fake_agent a;
  agent_register(&a, "host-a", 2);
  char *spec = spec_text("remote-ok", 1, "hosts", 1, NULL);
  char *job = create_job(spec);
  free(spec);
  attempt at;
  take_start(&a, &at, job);
  assert_true(json_is_null(json_object_get(at.start, "mpi")));
  assert_false(json_is_true(json_object_get(at.start, "resume")));
  assert_int_equal(json_array_size(json_object_get(at.start, "cores")), 1);

  /* Tokens: none, a user's or admin's, another allocation's: nothing changes. */
  char path[300], *out = NULL;
  snprintf(path, sizeof path, "/v1/allocations/%s/progress", at.alloc);
  const char *line = "{\"step\":999,\"epoch\":1,\"metrics\":{\"loss\":123}}\n";
  assert_int_equal(post_as(NULL, "POST", path, line, strlen(line), NULL), 401);
  assert_int_equal(post_as(admin_token, "POST", path, line, strlen(line), NULL), 401);
  assert_int_equal(post_as("kiln_a_0000", "POST", path, line, strlen(line), NULL), 401);
  assert_int_equal(post_as(at.token, "POST", "/v1/allocations/alloc-0000000000000000/progress",
                           line, strlen(line), &out),
                   403);
  assert_non_null(strstr(out, "another allocation"));
  free(out);
  /* A checkpoint whose bytes are not the sha256 given is not kept. */
  snprintf(path, sizeof path, "/v1/allocations/%s/checkpoints/5?sha256=%064d", at.alloc, 0);
  out = NULL;
  assert_int_equal(post_as(at.token, "PUT", path, "not a checkpoint", 16, &out), 400);
  assert_non_null(strstr(out, "\"sha256\""));
  free(out);
  char listing[512], cmd[700];
  snprintf(cmd, sizeof cmd, "ls -A '%s/jobs/%s/checkpoints' | wc -l", data_dir, job);
  it_run(listing, sizeof listing, cmd);
  assert_int_equal(atoi(listing), 0);

  /* The agent resource shows what runs on it. */
  long code;
  json_t *doc = call(admin_token, "GET", "/v1/agents/host-a", NULL, &code);
  assert_int_equal(code, 200);
  json_t *held = json_array_get(json_object_get(doc, "allocations"), 0);
  assert_string_equal(json_string_value(json_object_get(held, "id")), at.alloc);
  assert_string_equal(json_string_value(json_object_get(held, "job")), job);
  assert_int_equal(json_array_size(json_object_get(held, "cores")), 1);
  json_decref(doc);
  snprintf(ended_alloc, sizeof ended_alloc, "%s", at.alloc);
  at.fetch_dataset = 1;
  int status = run_start(&a, &at);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  doc = wait_state(job, "SUCCEEDED", 60);
  assert_int_equal(json_integer_value(json_object_get(doc, "infra_restarts")), 0);
  json_decref(doc);
  /* The ended allocation's host drops whatever is left of it. */
  json_t *drop = next_command(&a, "drop", 10);
  assert_non_null(drop);
  assert_string_equal(json_string_value(json_object_get(drop, "alloc")), at.alloc);
  json_decref(drop);
  snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", job);
  doc = call(admin_token, "GET", path, NULL, &code);
  assert_int_equal(code, 200);
  json_t *list = json_object_get(doc, "checkpoints");
  assert_int_equal(json_array_size(list), at.checkpoints);
  assert_true(at.checkpoints >= 2);
  json_decref(doc);
  snprintf(path, sizeof path, "/v1/jobs/%s/metrics", job);
  doc = call(admin_token, "GET", path, NULL, &code);
  assert_int_equal(code, 200);
  char *text = json_dumps(doc, 0);
  assert_non_null(strstr(text, "\"epoch_loss\""));
  assert_null(strstr(text, "\"step\": 999")); /* the refused line's point never arrived */
  free(text);
  json_decref(doc);
  /* The allocation ended: its token opens nothing more. */
  snprintf(path, sizeof path, "/v1/allocations/%s/progress", at.alloc);
  out = NULL;
  assert_int_equal(post_as(at.token, "POST", path, line, strlen(line), &out), 403);
  assert_non_null(strstr(out, "has ended"));
  free(out);
  json_decref(at.start);
  free(job);
}

static void cancel_sends_signal_to_the_agent(void **state) {
  (void)state;
  need_datasets();
  fake_agent a;
  /* Back with the first test's allocation, which ended: it is told to drop it. */
  agent_register_running(&a, "host-a", 2, ended_alloc[0] ? ended_alloc : NULL);
  if (ended_alloc[0]) {
    json_t *drop = next_command(&a, "drop", 10);
    assert_non_null(drop);
    assert_string_equal(json_string_value(json_object_get(drop, "alloc")), ended_alloc);
    json_decref(drop);
  }
  char *spec = spec_text("remote-cancel", 200, "hosts", 1, NULL);
  char *job = create_job(spec);
  free(spec);
  attempt at;
  take_start(&a, &at, job);
  at.cancel_expected = 1;
  /* Cancel once it runs: the runner asks for TERM through a signal command. */
  pid_t canceller = fork();
  if (canceller == 0) {
    usleep(1500 * 1000);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s:cancel", job);
    _exit(it_request(base_url, admin_token, "POST", path, NULL, 0, NULL) == 200 ? 0 : 1);
  }
  run_start(&a, &at);
  int cs = 0;
  waitpid(canceller, &cs, 0);
  assert_int_equal(WEXITSTATUS(cs), 0);
  assert_string_equal(at.signal_seen, "TERM");
  json_decref(wait_state(job, "CANCELLED", 30));
  json_decref(at.start);
  free(job);
}

static void lost_agent_requeues_from_its_checkpoint_and_resumes_elsewhere(void **state) {
  (void)state;
  need_datasets();
  fake_agent a, b;
  agent_register(&a, "host-a", 2);
  char *spec = spec_text("remote-lost", 2, "hosts", 1, ",\"max_restarts\":0");
  char *job = create_job(spec);
  free(spec);
  attempt at;
  take_start(&a, &at, job);
  at.die_after_ckpt = 1;
  run_start(&a, &at); /* host-a dies after its first checkpoint */
  assert_int_equal(at.checkpoints, 1);
  agent_register(&b, "host-b", 2);
  /* After grace_s (3 s) host-a is LOST: the job goes back to the queue. */
  long long until = it_now_ms() + 30000;
  char path[160];
  snprintf(path, sizeof path, "/v1/jobs/%s/events", job);
  int requeued = 0;
  while (!requeued && it_now_ms() < until) {
    heartbeat(&b);
    long code;
    json_t *doc = call(admin_token, "GET", path, NULL, &code);
    char *text = json_dumps(doc, 0);
    requeued = strstr(text, "AGENT_LOST") && strstr(text, "host-a");
    free(text);
    json_decref(doc);
    usleep(200 * 1000);
  }
  assert_true(requeued);
  attempt again;
  take_start(&b, &again, job);
  assert_true(json_is_true(json_object_get(again.start, "resume")));
  assert_string_not_equal(again.alloc, at.alloc);
  int status = run_start(&b, &again);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  json_t *doc = wait_state(job, "SUCCEEDED", 60);
  assert_int_equal(json_integer_value(json_object_get(doc, "infra_restarts")), 1);
  assert_int_equal(json_integer_value(json_object_get(doc, "restarts")), 0);
  assert_int_equal(json_integer_value(json_object_get(doc, "attempt")), 2);
  json_decref(doc);
  /* The first attempt's token was ended with it. */
  char *out = NULL;
  snprintf(path, sizeof path, "/v1/allocations/%s/exit", at.alloc);
  assert_int_equal(post_as(at.token, "POST", path, "{\"exit_code\":0}", 15, &out), 403);
  free(out);
  /* The resumed attempt started where the checkpoint was: its first
   * metric step is past it. */
  json_decref(at.start);
  json_decref(again.start);
  free(job);
}

static void relay_runs_only_orted_on_a_host_of_the_allocation(void **state) {
  (void)state;
  /* The hosts of the tests before go LOST (nothing heard for grace_s), so
   * only host-c and host-d, one core each, are left: a job of two
   * processes is gang-placed over both. */
  const char *others[] = {"host-a", "host-b"};
  for (int i = 0; i < 2; i++) {
    long long until = it_now_ms() + 20000;
    for (;;) {
      if (agent_lost(others[i])) break;
      if (it_now_ms() > until) fail_msg("%s never went LOST", others[i]);
      usleep(200 * 1000);
    }
  }
  fake_agent c, d;
  agent_register(&c, "host-c", 1);
  agent_register(&d, "host-d", 1);
  char *spec = spec_text("remote-relay", 200, "hosts", 2,
                         ",\"strategy\":{\"type\":\"multi_worker\",\"workers\":2}");
  char *job = create_job(spec);
  free(spec);
  long long until = it_now_ms() + 60000;
  json_t *start = NULL;
  fake_agent *rank0 = NULL;
  while (!start && it_now_ms() < until) {
    heartbeat(&d);
    start = next_command(&c, "start", 0);
    if (start)
      rank0 = &c;
    else if ((start = next_command(&d, "start", 0)))
      rank0 = &d;
    if (!start) usleep(200 * 1000);
  }
  if (!start) fail_msg("no start for the multi_worker job");
  json_t *mpi = json_object_get(start, "mpi");
  if (json_is_null(mpi)) { /* the other host got rank 0's start */
    fake_agent *other = rank0 == &c ? &d : &c;
    json_decref(start);
    start = next_command(other, "start", 10);
    mpi = json_object_get(start, "mpi");
  }
  assert_int_equal(json_integer_value(json_object_get(mpi, "np")), 2);
  assert_int_equal(json_array_size(json_object_get(mpi, "hosts")), 2);
  const char *alloc = json_string_value(json_object_get(start, "alloc"));
  const char *token = json_string_value(json_object_get(start, "token"));
  char path[300], *out = NULL;
  snprintf(path, sizeof path, "/v1/allocations/%s/relay", alloc);
  const char *bad_argv = "{\"host\":\"host-d\",\"argv\":[\"/bin/sh\",\"-c\",\"id\"]}";
  assert_int_equal(post_as(token, "POST", path, bad_argv, strlen(bad_argv), &out), 403);
  assert_non_null(strstr(out, "\"argv\""));
  free(out);
  const char *bad_host = "{\"host\":\"host-x\",\"argv\":[\"orted\",\"-mca\",\"ess\",\"env\"]}";
  out = NULL;
  assert_int_equal(post_as(token, "POST", path, bad_host, strlen(bad_host), &out), 403);
  assert_non_null(strstr(out, "\"host\""));
  free(out);
  const char *good = "{\"host\":\"host-d\",\"argv\":[\"/usr/bin/orted\",\"-mca\",\"ess\",\"env\"]}";
  out = NULL;
  assert_int_equal(post_as(token, "POST", path, good, strlen(good), &out), 200);
  json_t *doc = json_loads(out, 0, NULL);
  free(out);
  char relay[64];
  snprintf(relay, sizeof relay, "%s", json_string_value(json_object_get(doc, "relay")));
  json_decref(doc);
  json_t *exec = next_command(&d, "exec", 10);
  assert_non_null(exec);
  assert_string_equal(json_string_value(json_object_get(exec, "relay")), relay);
  assert_string_equal(json_string_value(json_array_get(json_object_get(exec, "argv"), 0)),
                      "/usr/bin/orted");
  snprintf(path, sizeof path, "/v1/allocations/%s/relay/%s:wait?timeout=1s", alloc, relay);
  long code;
  /* next_command reported it done with no exit code: ok means 0. */
  doc = call(token, "GET", path, NULL, &code);
  assert_int_equal(code, 200);
  assert_true(json_is_true(json_object_get(doc, "done")));
  assert_int_equal(json_integer_value(json_object_get(doc, "exit_code")), 0);
  json_decref(doc);
  json_decref(exec);
  /* Cancel: both hosts get the signal; rank 0's exit ends it. */
  snprintf(path, sizeof path, "/v1/jobs/%s:cancel", job);
  doc = call(admin_token, "POST", path, NULL, &code);
  json_decref(doc);
  json_t *sc = next_command(&c, "signal", 15), *sd = next_command(&d, "signal", 15);
  assert_non_null(sc);
  assert_non_null(sd);
  json_decref(sc);
  json_decref(sd);
  snprintf(path, sizeof path, "/v1/allocations/%s/exit", alloc);
  out = NULL;
  assert_int_equal(post_as(token, "POST", path, "{\"signal\":15}", 13, &out), 200);
  free(out);
  json_decref(wait_state(job, "CANCELLED", 30));
  json_decref(start);
  free(job);
}

static void explain_names_the_hosts_a_job_waits_for(void **state) {
  (void)state;
  fake_agent e;
  agent_register(&e, "host-e", 2);
  char *spec = spec_text("remote-big", 1, "hosts", 3, NULL);
  char *job = create_job(spec);
  free(spec);
  char path[160];
  snprintf(path, sizeof path, "/v1/jobs/%s:explain", job);
  long long until = it_now_ms() + 20000;
  char *text = NULL;
  while (it_now_ms() < until) {
    heartbeat(&e);
    long code;
    json_t *doc = call(admin_token, "GET", path, NULL, &code);
    free(text);
    text = json_dumps(doc, 0);
    json_decref(doc);
    if (strstr(text, "WAITING_FOR_HOSTS") && strstr(text, "host-e: ")) break;
    usleep(200 * 1000);
  }
  printf("explain: %s\n", text);
  assert_non_null(strstr(text, "WAITING_FOR_HOSTS"));
  assert_non_null(strstr(text, "host-e: 2 of 2 cpu free, short 1"));
  free(text);
  snprintf(path, sizeof path, "/v1/jobs/%s:cancel", job);
  long code;
  json_decref(call(admin_token, "POST", path, NULL, &code));
  free(job);
}

static void kilnd_restart_ends_its_allocations_and_their_hosts_drop_them(void **state) {
  (void)state;
  fake_agent f;
  agent_register(&f, "host-f", 2);
  char *spec = spec_text("remote-restart", 200, "hosts", 1, NULL);
  char *job = create_job(spec);
  free(spec);
  attempt at;
  take_start(&f, &at, job);
  /* kilnd dies (SIGKILL) with the allocation running, and starts again. */
  assert_int_equal(kill(kilnd_pid, SIGKILL), 0);
  waitpid(kilnd_pid, NULL, 0);
  char pools[400];
  snprintf(pools, sizeof pools, "%s/pools.json", data_dir);
  const char *extra[] = {"--pools", pools, NULL};
  assert_int_equal(it_launch_kilnd_args(KILND_PATH, data_dir, KILN_TRAIN_PATH, extra, &kilnd_pid,
                                        base_url, sizeof base_url, admin_token, sizeof admin_token),
                   0);
  /* The host is told to drop what the previous kilnd ran there ... */
  json_t *drop = next_command(&f, "drop", 20);
  assert_non_null(drop);
  assert_string_equal(json_string_value(json_object_get(drop, "alloc")), at.alloc);
  json_decref(drop);
  /* ... whose token opens nothing now ... */
  char path[300], *out = NULL;
  snprintf(path, sizeof path, "/v1/allocations/%s/progress", at.alloc);
  assert_int_equal(post_as(at.token, "POST", path, "{}\n", 3, &out), 403);
  assert_non_null(strstr(out, "SERVER_RESTART"));
  free(out);
  /* ... and the job, queued again, starts on it as a new allocation. */
  attempt again;
  take_start(&f, &again, job);
  assert_string_not_equal(again.alloc, at.alloc);
  assert_int_equal(json_integer_value(json_object_get(again.start, "attempt")),
                   json_integer_value(json_object_get(at.start, "attempt")) + 1);
  snprintf(path, sizeof path, "/v1/jobs/%s:cancel", job);
  long code;
  json_decref(call(admin_token, "POST", path, NULL, &code));
  assert_int_equal(code, 200);
  json_t *sig = next_command(&f, "signal", 15);
  assert_non_null(sig);
  json_decref(sig);
  snprintf(path, sizeof path, "/v1/allocations/%s/exit", again.alloc);
  out = NULL;
  assert_int_equal(post_as(again.token, "POST", path, "{\"signal\":15}", 13, &out), 200);
  free(out);
  json_decref(wait_state(job, "CANCELLED", 30));
  json_decref(at.start);
  json_decref(again.start);
  free(job);
}

static void a_start_that_never_reports_is_requeued_start_timeout(void **state) {
  (void)state;
  fake_agent g;
  agent_register_in(&g, "quick", "host-g", 1, NULL);
  char *spec = spec_text("remote-never", 1, "quick", 1, ",\"max_restarts\":0");
  char *job = create_job(spec);
  free(spec);
  attempt at;
  take_start(&g, &at, job); /* taken, and never run: no progress line comes */
  /* After start_timeout_s (2 s) the allocation ends and its host drops it. */
  json_t *drop = next_command(&g, "drop", 20);
  assert_non_null(drop);
  assert_string_equal(json_string_value(json_object_get(drop, "alloc")), at.alloc);
  json_decref(drop);
  char path[160];
  snprintf(path, sizeof path, "/v1/jobs/%s/events", job);
  long code;
  json_t *doc = call(admin_token, "GET", path, NULL, &code);
  char *text = json_dumps(doc, 0);
  json_decref(doc);
  assert_non_null(strstr(text, "START_TIMEOUT"));
  free(text);
  /* Not the job's fault: max_restarts 0 and yet it is queued and starts again. */
  attempt again;
  take_start(&g, &again, job);
  doc = get_job(job);
  assert_int_equal(json_integer_value(json_object_get(doc, "infra_restarts")), 1);
  assert_int_equal(json_integer_value(json_object_get(doc, "restarts")), 0);
  json_decref(doc);
  snprintf(path, sizeof path, "/v1/jobs/%s:cancel", job);
  json_decref(call(admin_token, "POST", path, NULL, &code));
  json_decref(at.start);
  json_decref(again.start);
  free(job);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(job_on_an_agent_succeeds_with_metrics_and_checkpoints, silence),
      cmocka_unit_test_teardown(cancel_sends_signal_to_the_agent, silence),
      cmocka_unit_test_teardown(lost_agent_requeues_from_its_checkpoint_and_resumes_elsewhere,
                                silence),
      cmocka_unit_test_teardown(relay_runs_only_orted_on_a_host_of_the_allocation, silence),
      cmocka_unit_test_teardown(explain_names_the_hosts_a_job_waits_for, silence),
      cmocka_unit_test_teardown(a_start_that_never_reports_is_requeued_start_timeout, silence),
      cmocka_unit_test_teardown(kilnd_restart_ends_its_allocations_and_their_hosts_drop_them,
                                silence),
  };
  int rc = cmocka_run_group_tests(tests, setup, teardown);
  curl_global_cleanup();
  return rc;
}
