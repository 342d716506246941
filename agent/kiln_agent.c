/* kiln_agent.c — kiln-agent: runs on each worker host of an agents pool.
 * It registers with kilnd (POST /v1/agents) with what the host has, then
 * long-polls its numbered commands (start, signal, drop, exec) and acts on
 * each once, acknowledging with :done; it re-registers when kilnd says it
 * is LOST or after kilnd was out of reach, and backs off while it is. On
 * SIGTERM it stops its jobs (they checkpoint and their exits are posted)
 * and ends. Threads: main waits for signals; one thread polls and
 * dispatches; each start and each exec runs on a thread of its own. The
 * allocation table (table.c) is the only state they share. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "agent.h"

#define STOP_GRACE_S      30
#define BACKOFF_MAX_MS    30000
#define MAX_EXEC_INFLIGHT 64

static ag_config cfg;
static volatile int stopping; /* set by main on SIGTERM; read by the poll thread */
static volatile int refused;  /* set by the poll thread: kilnd refused this agent for good */

/* exec commands whose daemon still runs: a redelivery must not ack them early. */
static pthread_mutex_t inflight_lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t inflight[MAX_EXEC_INFLIGHT];
static int n_inflight;

static int inflight_has(int64_t seq) {
  pthread_mutex_lock(&inflight_lock);
  int found = 0;
  for (int i = 0; i < n_inflight && !found; i++) found = inflight[i] == seq;
  pthread_mutex_unlock(&inflight_lock);
  return found;
}

static int inflight_add(int64_t seq) {
  pthread_mutex_lock(&inflight_lock);
  int ok = n_inflight < MAX_EXEC_INFLIGHT;
  if (ok) inflight[n_inflight++] = seq;
  pthread_mutex_unlock(&inflight_lock);
  return ok ? 0 : -1;
}

static void inflight_remove(int64_t seq) {
  pthread_mutex_lock(&inflight_lock);
  for (int i = 0; i < n_inflight; i++)
    if (inflight[i] == seq) inflight[i--] = inflight[--n_inflight];
  pthread_mutex_unlock(&inflight_lock);
}

static void usage(FILE *to) {
  fprintf(to,
          "usage: kiln-agent --server URL --pool POOL --address ADDR [options]\n"
          "       kiln-agent rsh --server URL --alloc ID --token-file F HOST COMMAND...\n"
          "       kiln-agent job --server URL --alloc ID --token-file F -- COMMAND...\n"
          "Runs a worker host of a kilnd agents pool: registers, then runs what kilnd sends.\n"
          "  --server URL         kilnd's base URL (http:// or https://)\n"
          "  --token-file FILE    the agent token (kilnd token create --role agent);\n"
          "                       else $KILN_AGENT_TOKEN\n"
          "  --cacert FILE        CA certificates to verify an https:// kilnd with\n"
          "  --name NAME          this agent's unique name (default: the host name)\n"
          "  --pool POOL          the agents pool it serves (kilnd --pools)\n"
          "  --address ADDR       the address other hosts reach this one on (MPI traffic)\n"
          "  --work-dir DIR       data-set cache and job folders (default /var/lib/kiln-agent)\n"
          "  --cpus N             offer only the first N usable cores (default: all)\n"
          "  --trainer PATH       kiln-train (default: beside kiln-agent, else on PATH)\n"
          "  --mpirun PATH        mpirun (default: on PATH)\n"
          "  --poll-wait S        seconds one long poll waits (default 30)\n"
          "  --help               this help\n");
}

/* kiln-train beside this program when it is there, else on PATH. */
static void default_trainer(char *out, size_t len) {
  char dir[PATH_MAX];
  snprintf(out, len, "kiln-train");
  snprintf(dir, sizeof dir, "%s", cfg.self);
  char *slash = strrchr(dir, '/');
  if (!slash) return;
  *slash = '\0';
  char beside[PATH_MAX + 32];
  snprintf(beside, sizeof beside, "%.4000s/kiln-train", dir);
  if (access(beside, X_OK) == 0) snprintf(out, len, "%.4000s", beside);
  /* In a build tree kiln-train sits in worker/ beside agent/. */
  snprintf(beside, sizeof beside, "%.4000s/../worker/kiln-train", dir);
  if (access(out, X_OK) != 0 && access(beside, X_OK) == 0) snprintf(out, len, "%.4000s", beside);
}

/* ---- talking to kilnd as the agent ---- */

typedef struct session {
  cli_client *client;
  char id[128];
  int64_t after; /* the highest seq handled */
  int heartbeat_s;
} session;

/* POSTs /v1/agents; 0 registered, 1 kilnd unreachable or failing (retry),
 * -1 refused for good (a bad token or field). */
static int register_agent(session *s) {
  char err[2048], host[256] = "";
  gethostname(host, sizeof host - 1);
  int cores[AG_MAX_CORES];
  int n = ag_host_cores(cores, AG_MAX_CORES);
  if (cfg.cpus > 0 && cfg.cpus < n) n = cfg.cpus;
  json_t *body =
      json_pack("{s:s,s:s,s:s,s:s,s:i,s:o,s:s,s:o}", "name", cfg.name, "hostname", host, "pool",
                cfg.pool, "address", cfg.address, "cpus", n, "gpus", ag_host_gpus(), "version",
                KILN_VERSION, "running", ag_table_running_json());
  char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  if (!text) return 1;
  cli_response resp;
  int rc = cli_client_request(s->client, "POST", "/v1/agents", text, strlen(text), &resp, err,
                              sizeof err);
  free(text);
  if (rc != CLI_OK) {
    ag_log(AG_LOG_WARN, "msg=\"kilnd unreachable\" server=%s error=\"%s\"", cfg.server, err);
    return 1;
  }
  long status = resp.status;
  json_t *answer = ag_json_answer(&resp, "register", err, sizeof err);
  cli_response_clear(&resp);
  if (!answer) {
    ag_log(AG_LOG_ERROR, "msg=\"registration refused\" error=\"%s\"", err);
    return status >= 500 || status == 429 ? 1 : -1;
  }
  const char *id = json_string_value(json_object_get(answer, "id"));
  const json_t *next = json_object_get(answer, "next_seq");
  const json_t *hb = json_object_get(answer, "heartbeat_s");
  if (!id || strlen(id) >= sizeof s->id) {
    ag_log(AG_LOG_ERROR, "msg=\"registration answer has no id\"");
    json_decref(answer);
    return 1;
  }
  snprintf(s->id, sizeof s->id, "%s", id);
  /* kilnd's next_seq wins: after a re-registration it may have forgotten
   * nothing, but our memory of what was done is the lower bound. */
  int64_t first = json_is_integer(next) ? json_integer_value(next) : 1;
  if (first - 1 > s->after || s->after == 0) s->after = first - 1;
  s->heartbeat_s = json_is_integer(hb) ? (int)json_integer_value(hb) : 0;
  ag_log(AG_LOG_INFO, "msg=\"registered\" agent=%s name=%s pool=%s cpus=%d next_seq=%lld", s->id,
         cfg.name, cfg.pool, n, (long long)first);
  json_decref(answer);
  return 0;
}

static void post_done(cli_client *client, const char *agent, int64_t seq, json_t *body) {
  char path[512], err[1024];
  snprintf(path, sizeof path, "/v1/agents/%s/commands/%lld:done", agent, (long long)seq);
  char *text = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  for (int attempt = 0; text && attempt < 10 && !stopping; attempt++) {
    cli_response resp;
    if (cli_client_request(client, "POST", path, text, strlen(text), &resp, err, sizeof err) ==
        CLI_OK) {
      long status = resp.status;
      json_t *none = ag_json_answer(&resp, path, err, sizeof err);
      json_decref(none);
      cli_response_clear(&resp);
      if (status < 500) {
        if (status >= 300) ag_log(AG_LOG_WARN, "seq=%lld error=\"%s\"", (long long)seq, err);
        break;
      }
    }
    sleep(1 + attempt);
  }
  free(text);
}

static json_t *ok_body(void) {
  return json_pack("{s:b}", "ok", 1);
}

static json_t *fail_body(const char *why) {
  return json_pack("{s:b,s:s}", "ok", 0, "error", why);
}

/* ---- the commands ---- */

static void *start_thread(void *arg) {
  ag_start *st = arg;
  ag_run(&cfg, st);
  ag_start_clear(st);
  free(st);
  return NULL;
}

typedef struct exec_job {
  char agent[128], alloc[96];
  int64_t seq;
  char **argv;
} exec_job;

static void *exec_thread(void *arg) {
  exec_job *x = arg;
  char err[1024];
  int code = 0;
  json_t *body = ag_relay_exec(&cfg, x->alloc, x->argv, &code, err, sizeof err) == 0
                     ? json_pack("{s:b,s:i}", "ok", 1, "exit_code", code)
                     : fail_body(err);
  cli_client *client = ag_client(&cfg, cfg.token, err, sizeof err);
  if (client)
    post_done(client, x->agent, x->seq, body);
  else
    json_decref(body);
  cli_client_free(client);
  inflight_remove(x->seq);
  ag_argv_free(x->argv);
  free(x);
  return NULL;
}

static int detach(void *(*fn)(void *), void *arg) {
  pthread_t t;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&t, &attr, fn, arg);
  pthread_attr_destroy(&attr);
  return rc;
}

/* Acts on one command; the :done body (NULL when a thread posts it later). */
static json_t *handle(session *s, const json_t *cmd, int64_t seq) {
  const char *kind = json_string_value(json_object_get(cmd, "kind"));
  const char *alloc = json_string_value(json_object_get(cmd, "alloc"));
  char err[1024];
  if (!kind || !alloc || strlen(alloc) >= 96) return fail_body("command needs kind and alloc");
  if (strcmp(kind, "start") == 0) {
    if (stopping) return fail_body("the agent is stopping");
    if (ag_table_claim(alloc)) { /* delivered again: it runs or ran already */
      ag_log(AG_LOG_INFO, "seq=%lld alloc=%s msg=\"start already done\"", (long long)seq, alloc);
      return ok_body();
    }
    ag_start *st = malloc(sizeof *st);
    if (!st) return fail_body("out of memory");
    if (ag_start_parse(cmd, st, err, sizeof err) != 0) {
      ag_start_clear(st);
      free(st);
      ag_table_finish(alloc);
      return fail_body(err);
    }
    if (detach(start_thread, st) != 0) {
      ag_start_clear(st);
      free(st);
      ag_table_finish(alloc);
      return fail_body("cannot start a thread");
    }
    return ok_body();
  }
  if (strcmp(kind, "signal") == 0 || strcmp(kind, "drop") == 0) {
    const char *name = json_string_value(json_object_get(cmd, "signal"));
    int drop = strcmp(kind, "drop") == 0;
    int sig = drop || (name && strcmp(name, "KILL") == 0) ? SIGKILL : SIGTERM;
    if (!drop && name && strcmp(name, "KILL") != 0 && strcmp(name, "TERM") != 0)
      return fail_body("signal must be TERM or KILL");
    ag_log(AG_LOG_INFO, "seq=%lld alloc=%s msg=\"%s\" signal=%d", (long long)seq, alloc, kind, sig);
    ag_table_signal(alloc, sig, drop);
    return ok_body();
  }
  if (strcmp(kind, "exec") == 0) {
    if (inflight_has(seq)) return NULL; /* still running: its :done comes when it ends */
    const json_t *argv = json_object_get(cmd, "argv");
    size_t n = json_is_array(argv) ? json_array_size(argv) : 0;
    if (n == 0) return fail_body("exec: argv must be a non-empty array of strings");
    exec_job *x = calloc(1, sizeof *x);
    if (!x || !(x->argv = calloc(n + 1, sizeof *x->argv))) {
      free(x);
      return fail_body("out of memory");
    }
    for (size_t i = 0; i < n; i++) {
      const char *w = json_string_value(json_array_get(argv, i));
      x->argv[i] = strdup(w ? w : "");
    }
    if (!ag_relay_allowed(x->argv[0])) {
      snprintf(err, sizeof err, "exec: argv[0] \"%.200s\" is not Open MPI's daemon", x->argv[0]);
      ag_argv_free(x->argv);
      free(x);
      return fail_body(err);
    }
    snprintf(x->agent, sizeof x->agent, "%s", s->id);
    snprintf(x->alloc, sizeof x->alloc, "%s", alloc);
    x->seq = seq;
    if (inflight_add(seq) != 0 || detach(exec_thread, x) != 0) {
      inflight_remove(seq);
      ag_argv_free(x->argv);
      free(x);
      return fail_body("too many relay daemons at once");
    }
    return NULL;
  }
  snprintf(err, sizeof err, "unknown command kind \"%.100s\"", kind);
  return fail_body(err);
}

/* One long poll; 0 polled, 1 transport trouble (back off, re-register),
 * 2 kilnd says re-register (LOST, or the agent is unknown). */
static int poll_once(session *s) {
  char path[512], err[2048];
  /* kilnd's heartbeat_s bounds the wait, so a poll arrives that often even
   * where a proxy or kilnd does not count a parked one. */
  int wait = cfg.poll_wait_s;
  if (s->heartbeat_s > 0 && s->heartbeat_s < wait) wait = s->heartbeat_s;
  snprintf(path, sizeof path, "/v1/agents/%s/commands?after=%lld&wait=%ds", s->id,
           (long long)s->after, wait);
  cli_response resp;
  if (cli_client_request(s->client, "GET", path, NULL, 0, &resp, err, sizeof err) != CLI_OK) {
    ag_log(AG_LOG_WARN, "msg=\"poll failed\" error=\"%s\"", err);
    return 1;
  }
  long status = resp.status;
  json_t *answer = ag_json_answer(&resp, "poll", err, sizeof err);
  cli_response_clear(&resp);
  if (!answer) {
    ag_log(AG_LOG_WARN, "msg=\"poll refused\" error=\"%s\"", err);
    return status == 404 || status == 401 || status == 403 ? 2 : 1;
  }
  const char *state = json_string_value(json_object_get(answer, "state"));
  if (state && strcmp(state, "LOST") == 0) {
    ag_log(AG_LOG_WARN, "msg=\"kilnd marked this agent LOST; registering again\"");
    json_decref(answer);
    return 2;
  }
  const json_t *cmds = json_object_get(answer, "commands");
  size_t i;
  const json_t *cmd;
  json_array_foreach(cmds, i, cmd) {
    const json_t *seq_v = json_object_get(cmd, "seq");
    if (!json_is_integer(seq_v)) continue;
    int64_t seq = json_integer_value(seq_v);
    json_t *done = handle(s, cmd, seq);
    if (done) post_done(s->client, s->id, seq, done);
    if (seq > s->after) s->after = seq;
  }
  json_decref(answer);
  return 0;
}

static void *poll_main(void *arg) {
  (void)arg;
  session s = {0};
  char err[1024];
  s.client = ag_client(&cfg, cfg.token, err, sizeof err);
  if (!s.client) {
    ag_log(AG_LOG_ERROR, "msg=\"cannot make a client\" error=\"%s\"", err);
    refused = 1;
    kill(getpid(), SIGTERM);
    return NULL;
  }
  int64_t backoff = 500;
  int registered = 0;
  unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
  while (!stopping) {
    int rc = registered ? poll_once(&s) : register_agent(&s);
    if (!registered && rc < 0) { /* a wrong token or a refused field: nothing will change */
      ag_log(AG_LOG_ERROR, "msg=\"kilnd refused this agent; stopping\"");
      refused = 1;
      kill(getpid(), SIGTERM);
      break;
    }
    if (rc == 0) {
      registered = 1;
      backoff = 500;
      continue;
    }
    /* Unreachable, LOST or unknown: register again once kilnd answers (a
     * restarted kilnd learns what still runs here). */
    registered = 0;
    if (rc == 2) continue;
    int64_t pause = backoff / 2 + (int64_t)(rand_r(&seed) % (unsigned)(backoff / 2 + 1));
    usleep((useconds_t)pause * 1000);
    if (backoff < BACKOFF_MAX_MS) backoff *= 2;
  }
  cli_client_free(s.client);
  return NULL;
}

int main(int argc, char **argv) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  snprintf(self, sizeof self, "%s", argv[0]);
  if (n > 0) self[n] = '\0';
  if (argc > 1 && strcmp(argv[1], "rsh") == 0) return ag_rsh_main(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "job") == 0) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return ag_job_main(argc - 1, argv + 1, self);
  }

  snprintf(cfg.self, sizeof cfg.self, "%s", self);
  cfg.work_dir = "/var/lib/kiln-agent";
  cfg.mpirun = "mpirun";
  cfg.poll_wait_s = 30;
  const char *token_file = NULL, *trainer = NULL;
  static const struct option opts[] = {{"server", required_argument, NULL, 's'},
                                       {"token-file", required_argument, NULL, 't'},
                                       {"cacert", required_argument, NULL, 'c'},
                                       {"name", required_argument, NULL, 'n'},
                                       {"pool", required_argument, NULL, 'p'},
                                       {"address", required_argument, NULL, 'a'},
                                       {"work-dir", required_argument, NULL, 'w'},
                                       {"cpus", required_argument, NULL, 'C'},
                                       {"trainer", required_argument, NULL, 'T'},
                                       {"mpirun", required_argument, NULL, 'M'},
                                       {"poll-wait", required_argument, NULL, 'P'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  int c;
  char *end;
  while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (c) {
    case 's': cfg.server = optarg; break;
    case 't': token_file = optarg; break;
    case 'c': cfg.cacert = optarg; break;
    case 'n': cfg.name = optarg; break;
    case 'p': cfg.pool = optarg; break;
    case 'a': cfg.address = optarg; break;
    case 'w': cfg.work_dir = optarg; break;
    case 'T': trainer = optarg; break;
    case 'M': cfg.mpirun = optarg; break;
    case 'C':
    case 'P': {
      long v = strtol(optarg, &end, 10);
      if (*end || v < 1 || v > 100000) {
        fprintf(stderr, "kiln-agent: --%s must be a positive integer, got \"%s\"\n",
                c == 'C' ? "cpus" : "poll-wait", optarg);
        return 2;
      }
      if (c == 'C')
        cfg.cpus = (int)v;
      else
        cfg.poll_wait_s = (int)v;
      break;
    }
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  if (!cfg.name) cfg.name = host;
  const char *missing = !cfg.server    ? "--server"
                        : !cfg.pool    ? "--pool"
                        : !cfg.address ? "--address"
                                       : NULL;
  if (missing || optind < argc) {
    fprintf(stderr, "kiln-agent: %s\n", missing ? "missing " : "unexpected argument ");
    fprintf(stderr, "kiln-agent: %s%s\n", missing ? missing : argv[optind],
            missing ? " is required" : "");
    usage(stderr);
    return 2;
  }
  char err[2048];
  const char *env_token = getenv("KILN_AGENT_TOKEN");
  if (token_file) {
    if (ag_read_token(token_file, cfg.token, sizeof cfg.token, err, sizeof err) != 0) {
      fprintf(stderr, "kiln-agent: %s\n", err);
      return 2;
    }
  } else if (env_token && *env_token) {
    snprintf(cfg.token, sizeof cfg.token, "%s", env_token);
  } else {
    fprintf(stderr, "kiln-agent: no agent token: pass --token-file FILE or set KILN_AGENT_TOKEN "
                    "(kilnd token create --role agent makes one)\n");
    return 2;
  }
  char trainer_path[PATH_MAX];
  if (trainer)
    snprintf(trainer_path, sizeof trainer_path, "%s", trainer);
  else
    default_trainer(trainer_path, sizeof trainer_path);
  cfg.trainer = trainer_path;
  if (strlen(cfg.work_dir) > 700) {
    fprintf(stderr, "kiln-agent: --work-dir must be at most 700 bytes long\n");
    return 2;
  }
  if (ag_mkdir_p(cfg.work_dir) != 0) {
    fprintf(stderr, "kiln-agent: cannot create the work dir %s: %s\n", cfg.work_dir,
            strerror(errno));
    return 2;
  }
  curl_global_init(CURL_GLOBAL_DEFAULT);

  /* Signals come to main alone, through sigwait; children get defaults. */
  sigset_t wanted;
  sigemptyset(&wanted);
  sigaddset(&wanted, SIGTERM);
  sigaddset(&wanted, SIGINT);
  sigaddset(&wanted, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &wanted, NULL);
  signal(SIGPIPE, SIG_IGN);
  ag_log(AG_LOG_INFO, "msg=\"kiln-agent starting\" version=%s name=%s server=%s trainer=%s",
         KILN_VERSION, cfg.name, cfg.server, cfg.trainer);
  pthread_t poller;
  if (pthread_create(&poller, NULL, poll_main, NULL) != 0) {
    fprintf(stderr, "kiln-agent: cannot start the poll thread\n");
    return 1;
  }
  int sig = 0;
  sigwait(&wanted, &sig);
  stopping = 1;
  ag_log(AG_LOG_INFO, "msg=\"stopping\" signal=%d running=%d", sig, ag_table_running());
  /* kiln-train checkpoints on SIGTERM and exits; its run thread uploads
   * the checkpoint and posts the exit. */
  ag_table_signal_all(SIGTERM);
  for (int waited = 0; ag_table_running() > 0 && waited < STOP_GRACE_S * 10; waited++)
    usleep(100000);
  if (ag_table_running() > 0) {
    ag_log(AG_LOG_WARN, "msg=\"jobs still running after the grace; killing them\"");
    ag_table_signal_all(SIGKILL);
    for (int waited = 0; ag_table_running() > 0 && waited < 50; waited++) usleep(100000);
  }
  ag_log(AG_LOG_INFO, "msg=\"stopped\"");
  return refused ? 2 : 0;
}
