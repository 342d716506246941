/* run.c — one allocation on this host, as kilnd's runner does it locally:
 * the job's folder, its data set (cached by content hash) and resume
 * checkpoint fetched from kilnd, kiln-train (or mpirun over the
 * allocation's hosts, or a job-mode command) in its own process group
 * pinned to the allocation's cores, its progress lines forwarded in order
 * (batched, at least every AG_BATCH_MS), each checkpoint uploaded before the
 * line naming it, and its wait status posted as the exit. Runs on the
 * calling thread, which it pins. */
#define _GNU_SOURCE /* pthread_setaffinity_np */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"
#include "common.h"

extern char **environ;

#define MAX_LINE     (64 * 1024)
#define UPLOAD_TRIES 5

/* What a run needs while its trainer runs. */
typedef struct run_io {
  const ag_config *cfg;
  ag_start *st;
  cli_client *client;
  char path_prefix[256]; /* "/v1/allocations/<alloc>" */
  char *batch;           /* lines not yet posted */
  size_t batch_len, batch_cap;
  int ended; /* kilnd said the allocation is over: stop forwarding */
  pid_t group;
  int pumped_any; /* one line reached kilnd: the process started */
} run_io;

/* ---- talking to kilnd about the allocation ---- */

/* POSTs body to <alloc path><suffix>, retrying a transport failure with
 * backoff for up to a minute (kilnd restarting, a link down). 0 on a 2xx;
 * 1 when kilnd says the allocation is over (403/404/409); -1 otherwise. */
static int post_alloc(run_io *io, const char *suffix, const char *body) {
  char path[512], err[1024];
  snprintf(path, sizeof path, "%s%s", io->path_prefix, suffix);
  int64_t give_up = ag_now_ms() + 60000, backoff = 250;
  for (;;) {
    cli_response resp;
    int rc =
        cli_client_request(io->client, "POST", path, body, strlen(body), &resp, err, sizeof err);
    if (rc == CLI_OK) {
      long status = resp.status;
      if (status >= 200 && status < 300) {
        cli_response_clear(&resp);
        return 0;
      }
      json_t *none = ag_json_answer(&resp, path, err, sizeof err);
      json_decref(none);
      cli_response_clear(&resp);
      ag_log(AG_LOG_WARN, "alloc=%s msg=\"kilnd refused\" error=\"%s\"", io->st->alloc, err);
      if (status == 403 || status == 404 || status == 409) return 1;
      if (status < 500) return -1;
    } else {
      ag_log(AG_LOG_WARN, "alloc=%s msg=\"kilnd unreachable; retrying\" error=\"%s\"",
             io->st->alloc, err);
    }
    if (ag_now_ms() > give_up) return -1;
    usleep((useconds_t)backoff * 1000);
    if (backoff < 4000) backoff *= 2;
  }
}

/* The batch goes out in one POST. After kilnd says the allocation is over,
 * the process group is killed: nobody is listening any more. */
static void flush(run_io *io) {
  if (io->batch_len == 0 || io->ended) {
    io->batch_len = 0;
    return;
  }
  io->batch[io->batch_len] = '\0';
  int rc = post_alloc(io, "/progress", io->batch);
  io->batch_len = 0;
  if (rc == 0) io->pumped_any = 1;
  if (rc == 1) {
    io->ended = 1;
    ag_log(AG_LOG_WARN, "alloc=%s msg=\"the allocation ended on kilnd; stopping its processes\"",
           io->st->alloc);
    ag_table_signal(io->st->alloc, SIGKILL, 1);
  }
}

static int append(run_io *io, const char *line, size_t len) {
  if (io->batch_len + len + 2 > io->batch_cap) {
    size_t cap = io->batch_cap ? io->batch_cap : 16384;
    while (cap < io->batch_len + len + 2) cap *= 2;
    char *grown = realloc(io->batch, cap);
    if (!grown) return -1;
    io->batch = grown;
    io->batch_cap = cap;
  }
  memcpy(io->batch + io->batch_len, line, len);
  io->batch_len += len;
  io->batch[io->batch_len++] = '\n';
  return 0;
}

static int sha256_file(const char *path, char hex[65]) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  kc_sha256 h;
  kc_sha256_init(&h);
  unsigned char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) kc_sha256_update(&h, buf, n);
  int bad = ferror(f);
  fclose(f);
  uint8_t digest[32];
  kc_sha256_final(&h, digest);
  kc_sha256_hex(digest, hex);
  return bad ? -1 : 0;
}

/* PUTs one file of a checkpoint (part "" for the weights, "state" for the
 * training state beside them); kilnd's path for it into server_path. */
static int upload(run_io *io, int64_t step, const char *file, const char *part, const char *sha256,
                  char *server_path, size_t len) {
  char path[512], err[1024];
  snprintf(path, sizeof path, "%.900s/checkpoints/%lld?sha256=%s%s%s", io->path_prefix,
           (long long)step, sha256, part[0] ? "&part=" : "", part);
  int64_t backoff = 500;
  for (int attempt = 1; attempt <= UPLOAD_TRIES; attempt++) {
    FILE *f = fopen(file, "rb");
    if (!f) {
      ag_log(AG_LOG_ERROR, "alloc=%s msg=\"cannot read the checkpoint\" file=%s error=\"%s\"",
             io->st->alloc, file, strerror(errno));
      return -1;
    }
    struct stat sb;
    fstat(fileno(f), &sb);
    cli_response resp;
    int rc = cli_client_send_file(io->client, "PUT", path, f, (int64_t)sb.st_size, &resp, err,
                                  sizeof err);
    fclose(f);
    if (rc == CLI_OK) {
      long status = resp.status;
      json_t *body = ag_json_answer(&resp, "checkpoint upload", err, sizeof err);
      cli_response_clear(&resp);
      const char *where = body ? json_string_value(json_object_get(body, "path")) : NULL;
      if (where) snprintf(server_path, len, "%s", where);
      json_decref(body);
      if (where) return 0;
      if (status == 403 || status == 404 || status == 409) return 1;
    }
    ag_log(AG_LOG_WARN, "alloc=%s msg=\"checkpoint upload failed\" step=%lld try=%d error=\"%s\"",
           io->st->alloc, (long long)step, attempt, err);
    usleep((useconds_t)backoff * 1000);
    backoff *= 2;
  }
  return -1;
}

/* A checkpoint line: its files go to kilnd first (the training state, then
 * the weights), then the line with kilnd's path, so kilnd never records a
 * checkpoint it does not hold. */
static void checkpoint_line(run_io *io, json_t *line, json_t *ck) {
  const char *file = json_string_value(json_object_get(ck, "path"));
  const char *sha = json_string_value(json_object_get(ck, "sha256"));
  const json_t *step_v = json_object_get(ck, "step");
  if (!file || !sha || !json_is_integer(step_v)) return;
  int64_t step = json_integer_value(step_v);
  flush(io); /* the points before it arrive first */
  char state[AG_PATH], state_sha[65], server_state[1024], server_path[1024];
  size_t n = strlen(file);
  const char ext[] = ".safetensors";
  if (n >= sizeof ext - 1 && strcmp(file + n - (sizeof ext - 1), ext) == 0) n -= sizeof ext - 1;
  snprintf(state, sizeof state, "%.*s.state", (int)n, file);
  int rc = 0;
  if (access(state, R_OK) == 0) {
    rc = sha256_file(state, state_sha) != 0
             ? -1
             : upload(io, step, state, "state", state_sha, server_state, sizeof server_state);
  }
  if (rc == 0) rc = upload(io, step, file, "", sha, server_path, sizeof server_path);
  if (rc != 0) {
    ag_log(AG_LOG_ERROR, "alloc=%s msg=\"checkpoint not sent; kilnd will not record it\" step=%lld",
           io->st->alloc, (long long)step);
    if (rc == 1) io->ended = 1;
    return;
  }
  json_object_set_new(ck, "path", json_string(server_path));
  char *text = json_dumps(line, JSON_COMPACT);
  if (text) append(io, text, strlen(text));
  free(text);
  flush(io);
}

/* One line from the trainer: progress JSON is forwarded, anything else
 * (mpirun's own words on stdout) goes to the log. */
static void handle_line(run_io *io, char *line, size_t len, FILE *log) {
  while (len && (line[len - 1] == '\r')) line[--len] = '\0';
  if (len == 0) return;
  if (line[0] != '{') {
    if (log) fprintf(log, "%s\n", line);
    return;
  }
  json_t *ck = NULL;
  if (strstr(line, "\"checkpoint\"")) {
    json_t *parsed = json_loadb(line, len, 0, NULL);
    ck = parsed ? json_object_get(parsed, "checkpoint") : NULL;
    if (ck && json_is_object(ck)) {
      checkpoint_line(io, parsed, ck);
      json_decref(parsed);
      return;
    }
    json_decref(parsed);
  }
  append(io, line, len);
}

/* Reads the progress pipe until it closes. */
static void pump(run_io *io, int fd, FILE *log) {
  char *buf = malloc(MAX_LINE + 1);
  size_t have = 0;
  int64_t last_flush = ag_now_ms();
  while (buf) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int64_t wait = AG_BATCH_MS - (ag_now_ms() - last_flush);
    int ready = poll(&p, 1, wait > 0 ? (int)wait : 0);
    if (ready < 0 && errno != EINTR) break;
    if (ready > 0) {
      ssize_t n = read(fd, buf + have, MAX_LINE - have);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      have += (size_t)n;
      size_t start = 0;
      for (size_t i = 0; i < have; i++) {
        if (buf[i] != '\n') continue;
        buf[i] = '\0';
        handle_line(io, buf + start, i - start, log);
        start = i + 1;
      }
      memmove(buf, buf + start, have - start);
      have -= start;
      if (have == MAX_LINE) have = 0; /* a line longer than any progress line: dropped */
    }
    if (ag_now_ms() - last_flush >= AG_BATCH_MS) {
      flush(io);
      last_flush = ag_now_ms();
    }
  }
  if (buf && have) {
    buf[have] = '\0';
    handle_line(io, buf, have, log);
  }
  flush(io);
  free(buf);
}

/* ---- preparing the host ---- */

static int write_to(const char *data, size_t len, void *user) {
  return fwrite(data, 1, len, user) == len ? 0 : 1;
}

/* GET path into file (and the header hdr_name of the answer into hdr); 0,
 * or 404 when kilnd has none, or -1 with err. */
static int download(run_io *io, const char *path, const char *file, const char *hdr_name, char *hdr,
                    size_t hdr_len, char *err, size_t errlen) {
  char tmp[AG_PATH];
  snprintf(tmp, sizeof tmp, "%s.part", file);
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    snprintf(err, errlen, "cannot write %.900s: %s", tmp, strerror(errno));
    return -1;
  }
  cli_response resp;
  int rc = cli_client_stream(io->client, path, NULL, 0, write_to, f, &resp, err, errlen);
  int closed = fclose(f);
  if (rc != CLI_OK) {
    unlink(tmp);
    return -1;
  }
  long status = resp.status;
  if (hdr_name) cli_client_header(io->client, hdr_name, hdr, hdr_len);
  if (status < 200 || status >= 300) {
    json_t *none = ag_json_answer(&resp, path, err, errlen);
    json_decref(none);
    cli_response_clear(&resp);
    unlink(tmp);
    return status == 404 ? 404 : -1;
  }
  cli_response_clear(&resp);
  if (closed != 0 || rename(tmp, file) != 0) {
    snprintf(err, errlen, "cannot write %.900s: %s", file, strerror(errno));
    unlink(tmp);
    return -1;
  }
  return 0;
}

static int run_tar(const char *archive, const char *dir) {
  char *argv[] = {"tar", "--no-same-owner", "-x", "-f", (char *)archive, "-C", (char *)dir, NULL};
  pid_t pid;
  if (posix_spawnp(&pid, "tar", NULL, NULL, argv, environ) != 0) return -1;
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* The data set's folder: the pool's shared path, or this host's cache of
 * it by content hash (downloaded and unpacked once). */
static int prepare_dataset(run_io *io, char *data_dir, size_t len, char *err, size_t errlen) {
  ag_start *st = io->st;
  if (st->shared_data) {
    snprintf(data_dir, len, "%s", st->shared_data);
    return 0;
  }
  char path[512], sha[128] = "";
  snprintf(path, sizeof path, "%.900s/dataset", io->path_prefix);
  cli_response resp;
  if (cli_client_request(io->client, "HEAD", path, NULL, 0, &resp, err, errlen) != CLI_OK)
    return -1;
  long status = resp.status;
  cli_client_header(io->client, "X-Kiln-Content-Sha256", sha, sizeof sha);
  cli_response_clear(&resp);
  if (status == 404) { /* a built-in set: kiln-train reads this host's own copy */
    ag_log(AG_LOG_INFO, "alloc=%s msg=\"kilnd serves no data set; using this host's\" dataset=%s",
           st->alloc, st->dataset_name);
    data_dir[0] = '\0';
    return 0;
  }
  if (status < 200 || status >= 300) {
    snprintf(err, errlen, "HEAD %s: HTTP %ld", path, status);
    return -1;
  }
  if (!sha[0]) snprintf(sha, sizeof sha, "%s", st->dataset_sha256);
  for (const char *c = sha; *c; c++)
    if (!strchr("0123456789abcdef", *c) || c - sha >= 64) {
      snprintf(err, errlen, "kilnd's data set hash \"%s\" is not a sha256", sha);
      return -1;
    }
  char cache[AG_PATH], tar[AG_PATH], unpack[AG_PATH];
  snprintf(cache, sizeof cache, "%.900s/datasets", io->cfg->work_dir);
  if (ag_mkdir_p(cache) != 0) {
    snprintf(err, errlen, "cannot create %.900s: %s", cache, strerror(errno));
    return -1;
  }
  snprintf(data_dir, len, "%.1000s/%.64s", cache, sha);
  struct stat sb;
  if (stat(data_dir, &sb) == 0) return 0; /* cached */
  snprintf(tar, sizeof tar, "%.900s/%.64s.%s.tar", cache, sha, st->alloc);
  snprintf(unpack, sizeof unpack, "%.900s/%.64s.%s.unpack", cache, sha, st->alloc);
  char got[128] = "", have[65];
  if (download(io, path, tar, "X-Kiln-Content-Sha256", got, sizeof got, err, errlen) != 0)
    return -1;
  /* The hash is the archive's own: what arrived must be it. */
  if (sha256_file(tar, have) != 0 || strcmp(have, got[0] ? got : sha) != 0) {
    snprintf(err, errlen, "the data set archive arrived with SHA-256 %s, not %.64s as kilnd said",
             have, got[0] ? got : sha);
    unlink(tar);
    return -1;
  }
  int rc = ag_mkdir_p(unpack) == 0 && run_tar(tar, unpack) == 0 ? 0 : -1;
  unlink(tar);
  /* Two allocations unpacking the same set: the first rename wins. */
  if (rc == 0 && rename(unpack, data_dir) != 0 && stat(data_dir, &sb) != 0) rc = -1;
  if (rc != 0) snprintf(err, errlen, "cannot unpack the data set %s into %s", sha, data_dir);
  return rc;
}

/* The checkpoint to resume from, with its training state beside it; 0 and
 * *have = 1 when kilnd has one. */
static int prepare_resume(run_io *io, const char *ckpt_dir, char *file, size_t len, int *have,
                          char *err, size_t errlen) {
  char path[512], step[32] = "", weights[AG_PATH], state[AG_PATH];
  *have = 0;
  snprintf(path, sizeof path, "%.900s/resume", io->path_prefix);
  snprintf(weights, sizeof weights, "%.900s/resume.safetensors", ckpt_dir);
  int rc = download(io, path, weights, "X-Kiln-Step", step, sizeof step, err, errlen);
  if (rc == 404) return 0;
  if (rc != 0) return -1;
  snprintf(path, sizeof path, "%.900s/resume?part=state", io->path_prefix);
  snprintf(state, sizeof state, "%.900s/resume.state", ckpt_dir);
  rc = download(io, path, state, NULL, NULL, 0, err, errlen);
  if (rc != 0) return -1;
  snprintf(file, len, "%s", weights);
  *have = 1;
  ag_log(AG_LOG_INFO, "alloc=%s msg=\"resuming\" step=%s", io->st->alloc, step[0] ? step : "?");
  return 0;
}

/* ---- the process ---- */

static void pin(const ag_start *st) {
  if (st->n_cores == 0) return;
  cpu_set_t set;
  if (ag_host_core_set(st->cores, st->n_cores, &set) < st->n_cores)
    ag_log(AG_LOG_WARN, "alloc=%s msg=\"cores past this host's\" cores=%d", st->alloc, st->n_cores);
  int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  if (rc != 0)
    ag_log(AG_LOG_WARN, "alloc=%s msg=\"cannot pin to cores\" error=\"%s\"", st->alloc,
           strerror(rc));
}

/* Ours, plus the command's variables, KILN_DEVICES and CUDA_VISIBLE_DEVICES,
 * and relay (KILN_SERVER=..., the allocation and its token file, for
 * `kiln-agent rsh` under mpirun) when given. */
static char **make_env(const ag_start *st, char *devices, size_t len, char *cuda, size_t cuda_len,
                       char *const *relay) {
  int n = 0, n_relay = 0;
  while (environ[n]) n++;
  while (relay && relay[n_relay]) n_relay++;
  char **env = calloc((size_t)n + (size_t)st->n_env + (size_t)n_relay + 3, sizeof *env);
  if (!env) return NULL;
  int k = 0, used = 0, cused = 0;
  const int gpu = st->n_gpus > 0;
  used = snprintf(devices, len, "KILN_DEVICES=%s:", gpu ? "gpu" : "cpu");
  cused = snprintf(cuda, cuda_len, "CUDA_VISIBLE_DEVICES=");
  for (int i = 0; i < (gpu ? st->n_gpus : st->n_cores) && used < (int)len; i++)
    used += snprintf(devices + used, len - (size_t)used, "%s%d", i ? "," : "",
                     gpu ? st->gpus[i] : st->cores[i]);
  for (int i = 0; gpu && i < st->n_gpus && cused < (int)cuda_len; i++)
    cused += snprintf(cuda + cused, cuda_len - (size_t)cused, "%s%d", i ? "," : "", st->gpus[i]);
  for (int i = 0; i < n; i++) {
    if (strncmp(environ[i], "KILN_DEVICES=", 13) == 0) continue;
    if (gpu && strncmp(environ[i], "CUDA_VISIBLE_DEVICES=", 21) == 0) continue;
    env[k++] = environ[i];
  }
  env[k++] = devices;
  if (gpu) env[k++] = cuda;
  for (int i = 0; i < st->n_env; i++) env[k++] = st->env[i];
  for (int i = 0; i < n_relay; i++) env[k++] = relay[i];
  env[k] = NULL;
  return env;
}

/* mpirun over the allocation's hosts, Open MPI's daemons started through
 * `kiln-agent rsh` (kilnd's relay) instead of ssh. */
static int mpirun_argv(const ag_config *cfg, const ag_start *st, const char *dir, char **argv,
                       int max, char *store, size_t store_len) {
  char hostfile[AG_PATH];
  snprintf(hostfile, sizeof hostfile, "%.900s/hostfile", dir);
  char lines[AG_MAX_HOSTS * 160];
  size_t used = 0;
  const int local = st->np == 0; /* one host: as kilnd's runner starts it */
  if (local) used = (size_t)snprintf(lines, sizeof lines, "localhost slots=%d\n", st->processes);
  for (int i = 0; !local && i < st->n_hosts; i++)
    used += (size_t)snprintf(lines + used, sizeof lines - used, "%s slots=%d\n", st->hosts[i].name,
                             st->hosts[i].slots);
  if (ag_write_file(hostfile, lines, used) != 0) return -1;
  /* Every string lives in store, one after another. */
  size_t at = 0;
  int n = 0;
#define KEEP(...)                                                                                  \
  do {                                                                                             \
    int w = snprintf(store + at, store_len - at, __VA_ARGS__);                                     \
    if (w < 0 || (size_t)w >= store_len - at || n >= max - 1) return -1;                           \
    argv[n++] = store + at;                                                                        \
    at += (size_t)w + 1;                                                                           \
  } while (0)
  KEEP("%s", cfg->mpirun);
  if (geteuid() == 0) KEEP("--allow-run-as-root");
  KEEP("--hostfile");
  KEEP("%s", hostfile);
  KEEP("-np");
  KEEP("%d", local ? st->processes : st->np);
  if (local) {
    KEEP("--oversubscribe");
    argv[n] = NULL;
    return n;
  }
  /* The agent pins each host's processes to the allocation's cores. */
  KEEP("--bind-to");
  KEEP("none");
  /* Daemons found on each host's PATH, whatever path mpirun was started by. */
  KEEP("--noprefix");
  /* Daemons stay in the foreground, so the relay's process is the daemon's. */
  KEEP("--leave-session-attached");
  KEEP("--mca");
  KEEP("plm_rsh_no_tree_spawn");
  KEEP("1");
  /* Open MPI splits this value at ':' (alternatives, "ssh : rsh"), so the
   * URL cannot be in it: `rsh` finds kilnd, the allocation and its token
   * in the environment mpirun passes it (make_env). */
  KEEP("--mca");
  KEEP("plm_rsh_agent");
  KEEP("%s rsh", cfg->self);
  if (st->oob_if[0]) {
    KEEP("--mca");
    KEEP("oob_tcp_if_include");
    KEEP("%s", st->oob_if);
  }
  if (st->btl_if[0]) {
    KEEP("--mca");
    KEEP("btl_tcp_if_include");
    KEEP("%s", st->btl_if);
  }
  if (st->nccl_if[0]) {
    KEEP("-x");
    KEEP("NCCL_SOCKET_IFNAME=%s", st->nccl_if);
  }
  for (int i = 0; i < st->n_env; i++) {
    KEEP("-x");
    KEEP("%.*s", (int)(strchr(st->env[i], '=') - st->env[i]), st->env[i]);
  }
#undef KEEP
  argv[n] = NULL;
  return n;
}

/* Spawns the run's process with its progress on *progress_fd; the pid. */
static pid_t spawn(const ag_config *cfg, ag_start *st, const char *dir, const char *data_dir,
                   const char *resume, int *progress_fd, char *err, size_t errlen) {
  char spec_path[AG_PATH], ckpt_dir[AG_PATH], log_path[AG_PATH];
  snprintf(spec_path, sizeof spec_path, "%.900s/spec.json", dir);
  snprintf(ckpt_dir, sizeof ckpt_dir, "%.900s/checkpoints", dir);
  snprintf(log_path, sizeof log_path, "%.900s/train.log", dir);
  char *argv[160];
  char store[16384];
  int n = 0, stdout_progress = 0;
  if (st->command) {
    /* Job mode: the command as given; progress on fd 3 when it asks for
     * --progress-fd, else on its standard output (mpirun's --json). */
    stdout_progress = 1;
    for (int i = 0; st->command[i] && n < 158; i++) {
      if (strcmp(st->command[i], "--progress-fd") == 0) stdout_progress = 0;
      argv[n++] = st->command[i];
    }
  } else {
    if (st->np > 0 || st->processes > 0) {
      n = mpirun_argv(cfg, st, dir, argv, 120, store, sizeof store);
      if (n < 0) {
        snprintf(err, errlen, "cannot write the hostfile or mpirun's arguments in %.900s", dir);
        return -1;
      }
      stdout_progress = 1;
    }
    argv[n++] = (char *)cfg->trainer;
    argv[n++] = "--spec";
    argv[n++] = spec_path;
    if (stdout_progress) {
      argv[n++] = "--json";
    } else {
      argv[n++] = "--progress-fd";
      argv[n++] = "3";
    }
    if (data_dir[0]) { /* the archive holds a built-in set, a folder of shards or an upload */
      argv[n++] = "--data-dir";
      argv[n++] = (char *)data_dir;
      argv[n++] = "--uploads-dir";
      argv[n++] = (char *)data_dir;
    }
    argv[n++] = "--checkpoint-dir";
    argv[n++] = ckpt_dir;
    if (resume[0]) {
      argv[n++] = "--resume";
      argv[n++] = (char *)resume;
    }
  }
  argv[n] = NULL;

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    snprintf(err, errlen, "cannot create the progress pipe: %s", strerror(errno));
    return -1;
  }
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  if (stdout_progress) {
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, log_path, O_WRONLY | O_CREAT | O_APPEND,
                                     0600);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  } else {
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log_path, O_WRONLY | O_CREAT | O_APPEND,
                                     0600);
    posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 3);
  }
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigfillset(&defaults);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  char devices[AG_MAX_CORES * 5 + 32], cuda[AG_MAX_CORES * 5 + 32];
  char server[1200], alloc[160], token[AG_PATH + 64], cacert[1200];
  snprintf(server, sizeof server, "KILN_SERVER=%.1000s", cfg->server);
  snprintf(alloc, sizeof alloc, "KILN_ALLOCATION=%s", st->alloc);
  snprintf(token, sizeof token, "KILN_ALLOCATION_TOKEN_FILE=%.1300s/alloc.token", dir);
  snprintf(cacert, sizeof cacert, "KILN_CACERT=%.1000s", cfg->cacert ? cfg->cacert : "");
  char *relay[] = {server, alloc, token, cfg->cacert ? cacert : NULL, NULL};
  char **env = make_env(st, devices, sizeof devices, cuda, sizeof cuda,
                        st->np > 0 && !st->command ? relay : NULL);
  pid_t pid = -1;
  pin(st);
  int rc = env ? posix_spawnp(&pid, argv[0], &fa, &attr, argv, env) : ENOMEM;
  free(env);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    const char *slash = strrchr(argv[0], '/');
    snprintf(err, errlen, "cannot start %s: %s", slash ? slash + 1 : argv[0], strerror(rc));
    return -1;
  }
  *progress_fd = fds[0];
  return pid;
}

static void post_exit(run_io *io, int status, const char *message) {
  if (io->ended || ag_table_dropped(io->st->alloc)) return;
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  json_t *body = json_pack("{s:s}", "host", io->cfg->name ? io->cfg->name : host);
  if (status >= 0 && WIFSIGNALED(status))
    json_object_set_new(body, "signal", json_integer(WTERMSIG(status)));
  else
    json_object_set_new(body, "exit_code", json_integer(status >= 0 ? WEXITSTATUS(status) : 127));
  if (message) json_object_set_new(body, "message", json_string(message));
  char *text = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  if (text && post_alloc(io, "/exit", text) != 0)
    ag_log(AG_LOG_ERROR, "alloc=%s msg=\"exit not delivered\"", io->st->alloc);
  free(text);
}

int ag_start_launches(const ag_config *cfg, const ag_start *st) {
  return st->command || st->np == 0 || !cfg->name || strcmp(st->hosts[0].name, cfg->name) == 0;
}

int ag_run(const ag_config *cfg, ag_start *st) {
  char err[2048] = "", dir[AG_PATH], ckpt_dir[AG_PATH], data_dir[AG_PATH] = "",
       resume[AG_PATH] = "";
  run_io io = {.cfg = cfg, .st = st};
  snprintf(io.path_prefix, sizeof io.path_prefix, "/v1/allocations/%s", st->alloc);
  io.client = ag_client(cfg, st->token, err, sizeof err);
  if (!io.client) {
    ag_log(AG_LOG_ERROR, "alloc=%s msg=\"no client\" error=\"%s\"", st->alloc, err);
    return -1;
  }
  int status = -1, have_resume = 0;
  pid_t pid = -1;
  int fd = -1;
  snprintf(dir, sizeof dir, "%.700s/jobs/%s", cfg->work_dir, st->alloc);
  snprintf(ckpt_dir, sizeof ckpt_dir, "%.900s/checkpoints", dir);
  char token_path[AG_PATH], spec_path[AG_PATH];
  snprintf(token_path, sizeof token_path, "%.900s/alloc.token", dir);
  snprintf(spec_path, sizeof spec_path, "%.900s/spec.json", dir);
  if (ag_mkdir_p(ckpt_dir) != 0 || ag_write_file(token_path, st->token, strlen(st->token)) != 0 ||
      (st->spec_json && ag_write_file(spec_path, st->spec_json, strlen(st->spec_json)) != 0)) {
    snprintf(err, sizeof err, "cannot prepare the job's folder %.900s on this host: %s", dir,
             strerror(errno));
    goto failed;
  }
  err[0] = '\0';
  if (st->has_dataset && prepare_dataset(&io, data_dir, sizeof data_dir, err, sizeof err) != 0)
    goto failed;
  if (st->resume &&
      prepare_resume(&io, ckpt_dir, resume, sizeof resume, &have_resume, err, sizeof err) != 0)
    goto failed;
  if (!ag_start_launches(cfg, st)) {
    /* Another host's mpirun starts this host's ranks through the relay:
     * the folder, data set and resume checkpoint are ready for them. The
     * line is logged before the relay is let go, so that the log's order
     * is the order things happened in. */
    ag_log(AG_LOG_INFO, "alloc=%s job=%s msg=\"prepared for rank 0's mpirun\"", st->alloc, st->job);
    ag_table_set_cores(st->alloc, st->cores, st->n_cores);
    ag_table_finish(st->alloc);
    goto cleanup;
  }
  ag_table_set_cores(st->alloc, st->cores, st->n_cores);
  char log_path[AG_PATH];
  snprintf(log_path, sizeof log_path, "%.900s/agent-stdout.log", dir);
  FILE *log = fopen(log_path, "ae");
  if (ag_table_dropped(st->alloc)) {
    if (log) fclose(log);
    goto done;
  }
  pid = spawn(cfg, st, dir, data_dir, resume, &fd, err, sizeof err);
  if (pid < 0) {
    if (log) fclose(log);
    goto failed;
  }
  io.group = pid;
  ag_table_set_group(st->alloc, pid);
  ag_log(AG_LOG_INFO, "alloc=%s job=%s msg=\"started\" pid=%d%s", st->alloc, st->job, (int)pid,
         have_resume ? " resume=1" : "");
  pump(&io, fd, log);
  close(fd);
  if (log) fclose(log);
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  /* Nothing of the job outlives it (orphaned ranks, a stuck daemon). */
  kill(-pid, SIGKILL);
  ag_log(AG_LOG_INFO, "alloc=%s msg=\"ended\" status=%d", st->alloc, status);
  post_exit(&io, status, NULL);
  goto done;

failed:
  ag_log(AG_LOG_ERROR, "alloc=%s msg=\"cannot run\" error=\"%s\"", st->alloc, err);
  post_exit(&io, -1, err);
done:
  ag_table_finish(st->alloc);
cleanup:
  free(io.batch);
  cli_client_free(io.client);
  return status;
}
