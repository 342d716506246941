/* relay.c — Open MPI without ssh: `kiln-agent rsh HOST CMD...` is what
 * mpirun runs as its plm_rsh_agent; it asks kilnd (POST
 * /v1/allocations/{alloc}/relay) to have HOST's agent run the daemon
 * command and waits for it to end, exiting with its status. On the other
 * side, ag_relay_exec runs that daemon (only orted or prted) in its own
 * process group. Also `kiln-agent job`: one allocation without
 * registration, as a Slurm batch script runs it. */
#define _GNU_SOURCE /* pthread_setaffinity_np */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"

extern char **environ;

int ag_relay_allowed(const char *argv0) {
  if (!argv0) return 0;
  const char *slash = strrchr(argv0, '/');
  const char *base = slash ? slash + 1 : argv0;
  return strcmp(base, "orted") == 0 || strcmp(base, "prted") == 0;
}

void ag_argv_free(char **argv) {
  for (int i = 0; argv && argv[i]; i++) free(argv[i]);
  free(argv);
}

/* The words of line as a POSIX shell splits them: blanks separate, '...'
 * keeps everything, "..." keeps all but \" \\ \$ \` escapes, a backslash
 * outside quotes escapes the next character. No expansions: Open MPI's
 * daemon command has none. */
char **ag_shell_split(const char *line) {
  size_t cap = 16, n = 0, len = strlen(line);
  char **argv = calloc(cap + 1, sizeof *argv);
  char *word = malloc(len + 1);
  if (!argv || !word) goto fail;
  const char *p = line;
  for (;;) {
    while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    if (!*p) break;
    size_t w = 0;
    while (*p && *p != ' ' && *p != '\t' && *p != '\n') {
      if (*p == '\'') {
        const char *end = strchr(p + 1, '\'');
        if (!end) goto fail;
        memcpy(word + w, p + 1, (size_t)(end - p - 1));
        w += (size_t)(end - p - 1);
        p = end + 1;
      } else if (*p == '"') {
        for (p++; *p && *p != '"'; p++) {
          if (*p == '\\' && p[1] && strchr("\"\\$`", p[1])) p++;
          word[w++] = *p;
        }
        if (*p != '"') goto fail;
        p++;
      } else if (*p == '\\' && p[1]) {
        word[w++] = p[1];
        p += 2;
      } else {
        word[w++] = *p++;
      }
    }
    if (n == cap) {
      char **grown = realloc(argv, (cap * 2 + 1) * sizeof *argv);
      if (!grown) goto fail;
      argv = grown;
      cap *= 2;
    }
    argv[n] = strndup(word, w);
    if (!argv[n++]) goto fail;
    argv[n] = NULL;
  }
  free(word);
  if (n == 0) {
    free(argv);
    return NULL;
  }
  return argv;
fail:
  free(word);
  ag_argv_free(argv);
  return NULL;
}

int ag_relay_exec(const ag_config *cfg, const char *alloc, char *const *argv, int *exit_code,
                  char *err, size_t errlen) {
  if (!ag_relay_allowed(argv[0])) {
    snprintf(err, errlen, "exec: argv[0] \"%s\" is not Open MPI's daemon (orted or prted)",
             argv[0]);
    return -1;
  }
  char dir[AG_PATH], log_path[AG_PATH];
  snprintf(dir, sizeof dir, "%.700s/jobs/%s", cfg->work_dir, alloc);
  snprintf(log_path, sizeof log_path, "%.900s/relay.log", dir);
  if (ag_mkdir_p(dir) != 0) {
    snprintf(err, errlen, "exec: cannot create %.900s: %s", dir, strerror(errno));
    return -1;
  }
  /* The start this host got for the allocation may still be fetching the
   * data set its ranks will read: they start once it is in place. */
  if (ag_table_wait_ready(alloc, AG_PREPARE_WAIT_MS) != 0) {
    snprintf(err, errlen,
             "exec: allocation %s was not prepared on this host (failed, dropped, or "
             "still fetching after %d s)",
             alloc, AG_PREPARE_WAIT_MS / 1000);
    return -1;
  }
  int cores[AG_MAX_CORES];
  int n = ag_table_cores(alloc, cores, AG_MAX_CORES);
  if (n > 0) { /* the daemon's ranks inherit the allocation's cores on this host */
    cpu_set_t set;
    if (ag_host_core_set(cores, n, &set) > 0)
      pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  }
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log_path, O_WRONLY | O_CREAT | O_APPEND,
                                   0600);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigfillset(&defaults);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  pid_t pid;
  int rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    snprintf(err, errlen, "exec: cannot start %s: %s", argv[0], strerror(rc));
    return -1;
  }
  if (ag_table_add_relay(alloc, pid) != 0) { /* dropped meanwhile */
    kill(-pid, SIGKILL);
  }
  ag_log(AG_LOG_INFO, "alloc=%s msg=\"relay daemon started\" pid=%d", alloc, (int)pid);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  kill(-pid, SIGKILL); /* its ranks go with it */
  ag_table_remove_relay(alloc, pid);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  ag_log(AG_LOG_INFO, "alloc=%s msg=\"relay daemon ended\" pid=%d exit_code=%d", alloc, (int)pid,
         *exit_code);
  return 0;
}

/* An mpirun started by its full path acts as if given --prefix and puts
 * "PATH=/usr/bin:$PATH ; export PATH ; LD_LIBRARY_PATH=... ; export ... ;"
 * before the daemon: the remote agent's own environment stands instead,
 * so those words go. */
void ag_strip_env_prefix(char **words) {
  if (!words) return;
  int skip = 0;
  for (;;) {
    const char *w = words[skip];
    if (!w) break;
    size_t name = strspn(w, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_");
    if (strcmp(w, ";") == 0 || (name > 0 && w[name] == '=')) {
      skip++;
    } else if (strcmp(w, "export") == 0 && words[skip + 1]) {
      skip += 2;
    } else {
      break;
    }
  }
  for (int i = 0; i < skip; i++) free(words[i]);
  int n = 0;
  while (words[skip + n]) {
    words[n] = words[skip + n];
    n++;
  }
  words[n] = NULL;
}

/* ---- kiln-agent rsh ---- */

static volatile sig_atomic_t rsh_stop;
static void on_rsh_signal(int sig) {
  (void)sig;
  rsh_stop = 1;
}

static void rsh_usage(void) {
  fprintf(stderr, "usage: kiln-agent rsh --server URL --alloc ID --token-file FILE [--cacert FILE] "
                  "HOST COMMAND...\n"
                  "Open MPI's plm_rsh_agent: has HOST's kiln-agent run Open MPI's daemon command\n"
                  "for allocation ID through kilnd, waits for it and exits with its status.\n"
                  "Each flag may come from the environment instead: KILN_SERVER, KILN_ALLOCATION,\n"
                  "KILN_ALLOCATION_TOKEN_FILE, KILN_CACERT (kiln-agent sets them for mpirun).\n");
}

int ag_rsh_main(int argc, char **argv) {
  ag_config cfg = {.poll_wait_s = 30};
  /* Under mpirun the flags cannot carry a URL (see run.c): the environment does. */
  cfg.server = getenv("KILN_SERVER");
  cfg.cacert = getenv("KILN_CACERT");
  if (cfg.cacert && !*cfg.cacert) cfg.cacert = NULL;
  const char *alloc = getenv("KILN_ALLOCATION"), *token_file = getenv("KILN_ALLOCATION_TOKEN_FILE");
  static const struct option opts[] = {{"server", required_argument, NULL, 's'},
                                       {"alloc", required_argument, NULL, 'a'},
                                       {"token-file", required_argument, NULL, 't'},
                                       {"cacert", required_argument, NULL, 'c'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  int c;
  optind = 1;
  /* "+": options end at HOST; what follows is the remote command. */
  while ((c = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
    switch (c) {
    case 's': cfg.server = optarg; break;
    case 'a': alloc = optarg; break;
    case 't': token_file = optarg; break;
    case 'c': cfg.cacert = optarg; break;
    case 'h': rsh_usage(); return 0;
    default: rsh_usage(); return 2;
    }
  }
  if (!cfg.server || !alloc || !token_file || argc - optind < 2) {
    rsh_usage();
    return 2;
  }
  char err[2048];
  if (ag_read_token(token_file, cfg.token, sizeof cfg.token, err, sizeof err) != 0) {
    fprintf(stderr, "kiln-agent rsh: %s\n", err);
    return 2;
  }
  const char *host = argv[optind];
  /* Open MPI hands its ssh the command as words meant for a remote shell. */
  size_t len = 1;
  for (int i = optind + 1; i < argc; i++) len += strlen(argv[i]) + 1;
  char *line = calloc(1, len);
  for (int i = optind + 1; line && i < argc; i++) {
    strcat(line, argv[i]);
    strcat(line, " ");
  }
  char **words = line ? ag_shell_split(line) : NULL;
  free(line);
  ag_strip_env_prefix(words);
  if (!words || !ag_relay_allowed(words[0])) {
    fprintf(stderr,
            "kiln-agent rsh: the command for %s must be Open MPI's daemon (orted or "
            "prted), got \"%s\"\n",
            host, words ? words[0] : "(unbalanced quotes)");
    ag_argv_free(words);
    return 2;
  }
  json_t *arr = json_array();
  for (int i = 0; words[i]; i++) json_array_append_new(arr, json_string(words[i]));
  ag_argv_free(words);
  json_t *req = json_pack("{s:s,s:o}", "host", host, "argv", arr);
  char *body = json_dumps(req, JSON_COMPACT);
  json_decref(req);
  cli_client *client = ag_client(&cfg, cfg.token, err, sizeof err);
  if (!client || !body) {
    fprintf(stderr, "kiln-agent rsh: %s\n", client ? "out of memory" : err);
    free(body);
    cli_client_free(client);
    return 1;
  }
  signal(SIGTERM, on_rsh_signal);
  signal(SIGINT, on_rsh_signal);
  signal(SIGHUP, on_rsh_signal);
  char path[512], relay[128] = "";
  snprintf(path, sizeof path, "/v1/allocations/%s/relay", alloc);
  int rc = 1;
  int64_t backoff = 250, give_up = ag_now_ms() + 60000;
  while (!relay[0] && !rsh_stop) {
    cli_response resp;
    if (cli_client_request(client, "POST", path, body, strlen(body), &resp, err, sizeof err) ==
        CLI_OK) {
      long status = resp.status;
      json_t *answer = ag_json_answer(&resp, path, err, sizeof err);
      cli_response_clear(&resp);
      const char *id = answer ? json_string_value(json_object_get(answer, "relay")) : NULL;
      if (id) snprintf(relay, sizeof relay, "%s", id);
      json_decref(answer);
      if (!id && status < 500) {
        fprintf(stderr, "kiln-agent rsh: %s\n", err);
        goto out;
      }
    }
    if (!relay[0]) {
      if (ag_now_ms() > give_up) {
        fprintf(stderr, "kiln-agent rsh: kilnd did not take the relay: %s\n", err);
        goto out;
      }
      usleep((useconds_t)backoff * 1000);
      if (backoff < 4000) backoff *= 2;
    }
  }
  snprintf(path, sizeof path, "/v1/allocations/%s/relay/%s:wait?timeout=30s", alloc, relay);
  give_up = ag_now_ms() + 60000;
  while (!rsh_stop) {
    cli_response resp;
    if (cli_client_request(client, "GET", path, NULL, 0, &resp, err, sizeof err) != CLI_OK) {
      if (ag_now_ms() > give_up) { /* kilnd gone for a minute: mpirun decides */
        fprintf(stderr, "kiln-agent rsh: lost kilnd while waiting for %s: %s\n", host, err);
        goto out;
      }
      sleep(1);
      continue;
    }
    give_up = ag_now_ms() + 60000;
    long status = resp.status;
    json_t *answer = ag_json_answer(&resp, path, err, sizeof err);
    cli_response_clear(&resp);
    if (!answer) {
      fprintf(stderr, "kiln-agent rsh: %s\n", err);
      if (status < 500) goto out;
      sleep(1);
      continue;
    }
    int done = json_is_true(json_object_get(answer, "done"));
    const json_t *code = json_object_get(answer, "exit_code");
    if (done) rc = json_is_integer(code) ? (int)json_integer_value(code) : 1;
    json_decref(answer);
    if (done) break;
  }
out:
  free(body);
  cli_client_free(client);
  return rc;
}

/* ---- kiln-agent job ---- */

static void job_usage(void) {
  fprintf(stderr,
          "usage: kiln-agent job --server URL --alloc ID --token-file FILE [--cacert FILE]\n"
          "                      [--work-dir DIR] [--name HOST] -- COMMAND...\n"
          "Runs COMMAND (kiln-train, or mpirun of it) for allocation ID without registering:\n"
          "its progress lines (fd 3 when COMMAND has --progress-fd, else its standard output),\n"
          "checkpoints and exit go to kilnd as an agent's start does. Exits as COMMAND did.\n");
}

/* SIGTERM/SIGINT to `kiln-agent job` (scancel) go on to the command's
 * group: a thread waits for them, so no lock is taken in a handler. */
static void *job_signals(void *arg) {
  sigset_t *wanted = arg;
  int sig = 0;
  while (sigwait(wanted, &sig) == 0) {
    ag_log(AG_LOG_INFO, "msg=\"passing a signal on to the job\" signal=%d", sig);
    ag_table_signal_all(SIGTERM);
  }
  return NULL;
}

int ag_job_main(int argc, char **argv, const char *self) {
  static ag_config cfg;
  memset(&cfg, 0, sizeof cfg);
  snprintf(cfg.self, sizeof cfg.self, "%s", self);
  cfg.mpirun = "mpirun";
  cfg.trainer = "kiln-train";
  const char *alloc = NULL, *token_file = getenv("KILN_ALLOCATION_TOKEN_FILE");
  const char *tmp = getenv("TMPDIR");
  char work[4096];
  snprintf(work, sizeof work, "%.900s/kiln-agent-job", tmp && *tmp ? tmp : "/tmp");
  cfg.work_dir = work;
  static const struct option opts[] = {{"server", required_argument, NULL, 's'},
                                       {"alloc", required_argument, NULL, 'a'},
                                       {"token-file", required_argument, NULL, 't'},
                                       {"cacert", required_argument, NULL, 'c'},
                                       {"work-dir", required_argument, NULL, 'w'},
                                       {"name", required_argument, NULL, 'n'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
    switch (c) {
    case 's': cfg.server = optarg; break;
    case 'a': alloc = optarg; break;
    case 't': token_file = optarg; break;
    case 'c': cfg.cacert = optarg; break;
    case 'w': cfg.work_dir = optarg; break;
    case 'n': cfg.name = optarg; break;
    case 'h': job_usage(); return 0;
    default: job_usage(); return 2;
    }
  }
  if (!cfg.server || !alloc || !token_file || optind >= argc) {
    fprintf(stderr, "kiln-agent job: --server, --alloc, --token-file and a command after -- are "
                    "required\n");
    job_usage();
    return 2;
  }
  char err[2048];
  if (strlen(alloc) >= sizeof((ag_start *)0)->alloc ||
      ag_read_token(token_file, cfg.token, sizeof cfg.token, err, sizeof err) != 0) {
    fprintf(stderr, "kiln-agent job: %s\n", strlen(alloc) >= 96 ? "--alloc is too long" : err);
    return 2;
  }
  ag_start *st = calloc(1, sizeof *st);
  if (!st) return 1;
  snprintf(st->alloc, sizeof st->alloc, "%s", alloc);
  snprintf(st->token, sizeof st->token, "%s", cfg.token);
  st->command = argv + optind;
  ag_table_claim(st->alloc);
  static sigset_t wanted;
  sigemptyset(&wanted);
  sigaddset(&wanted, SIGTERM);
  sigaddset(&wanted, SIGINT);
  pthread_sigmask(SIG_BLOCK, &wanted, NULL); /* the command gets them back (run.c) */
  pthread_t waiter;
  if (pthread_create(&waiter, NULL, job_signals, &wanted) == 0) pthread_detach(waiter);
  int status = ag_run(&cfg, st);
  free(st);
  if (status < 0) return 1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
