/* plan.c — the memory a job's training plans, asked of the engine at
 * create: kilnd runs `kiln-train --plan-only SPEC` (the engine builds and
 * plans the model, allocating none of it, in milliseconds) and refuses a
 * spec whose parameters, gradients, optimizer state and arena exceed
 * kilnd's --trainer-memory-max. The figure is kept on the job. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "routes.h"

extern char **environ;

enum { PLAN_SPEC_STATUS = 3 }; /* kiln-train: the model does not build */

/* How long a planner may take to print its line (it takes milliseconds),
 * and then to exit, before it is killed. */
#define PLAN_LINE_MS 30000
#define PLAN_EXIT_MS 5000

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The planner's end, waited for until deadline (then it is killed): its
 * exit status, 128 + the signal that ended it. */
static int reap_planner(pid_t pid, int64_t deadline) {
  int status = 0;
  for (;;) {
    pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == pid) break;
    if (got < 0 && errno != EINTR) return 128;
    if (now_ms() >= deadline) {
      kill(pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    struct timespec pause = {0, 10 * 1000000L};
    nanosleep(&pause, NULL);
  }
  return WIFEXITED(status)     ? WEXITSTATUS(status)
         : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                               : 128;
}

/* Runs the planner on spec_path; its exit status (128 + the signal that
 * ended it) and what it printed on standard output (one line) in out, the
 * end of its standard error in said. Reading stops at the end of the line:
 * a planner that prints its plan and then hangs or fails at its exit (or
 * leaves a process holding the pipe) is killed, and its line still counts. */
static int run_planner(const http_config *cfg, const char *spec_path, char *out, size_t outlen,
                       char *said, size_t saidlen) {
  int fds[2];
  out[0] = said[0] = '\0';
  char err_path[4300];
  snprintf(err_path, sizeof err_path, "%s.err", spec_path);
  if (pipe(fds) != 0) {
    snprintf(out, outlen, "cannot create a pipe: %s", strerror(errno));
    return -1;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err_path, O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  char *argv[] = {(char *)cfg->planner_path, "--plan-only", (char *)spec_path, NULL};
  pid_t pid;
  int rc = posix_spawn(&pid, cfg->planner_path, &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  size_t used = 0;
  const int64_t line_by = now_ms() + PLAN_LINE_MS;
  while (rc == 0 && used + 1 < outlen && !memchr(out, '\n', used)) {
    const int64_t left = line_by - now_ms();
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    if (left <= 0 || poll(&p, 1, (int)left) == 0) break; /* no line in time */
    ssize_t got = read(fds[0], out + used, outlen - 1 - used);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    used += (size_t)got;
  }
  out[used] = '\0';
  close(fds[0]);
  if (rc != 0) {
    snprintf(out, outlen, "cannot start %s: %s", cfg->planner_path, strerror(rc));
    return -1;
  }
  const int64_t now = now_ms();
  const int status = reap_planner(pid, (now < line_by ? now : line_by) + PLAN_EXIT_MS);
  FILE *e = fopen(err_path, "r");
  if (e) {
    if (fseek(e, -(long)(saidlen - 1), SEEK_END) != 0) rewind(e);
    said[fread(said, 1, saidlen - 1, e)] = '\0';
    fclose(e);
    for (char *c = said; *c; c++)
      if (*c == '\n' || *c == '\r' || *c == '\t') *c = ' ';
  }
  unlink(err_path);
  return status;
}

int http_plan_memory(const http_config *cfg, const char *spec_json, int64_t *planned,
                     http_response *res) {
  *planned = 0;
  if (!cfg->planner_path) return 0; /* no planner: kilnd said so when it started */
  char path[4200];
  snprintf(path, sizeof path, "%s/.plan-XXXXXX", cfg->jobs_dir);
  int fd = mkstemp(path);
  if (fd < 0) {
    http_reply_status(res, 500, "INTERNAL", NULL, "cannot write the spec to plan it: %s",
                      strerror(errno));
    return -1;
  }
  size_t len = strlen(spec_json);
  int wrote = write(fd, spec_json, len) == (ssize_t)len;
  close(fd);
  char out[2048], said[400];
  int status = -1, runs = 0;
  json_t *line = NULL, *plan = NULL;
  /* A planner that ends without a plan and without saying the model does
   * not build failed for a reason of its own (killed, out of memory): it
   * runs once more before the create fails. */
  while (wrote && runs < 2) {
    json_decref(line);
    status = run_planner(cfg, path, out, sizeof out, said, sizeof said);
    runs++;
    line = status >= 0 ? json_loads(out, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    plan = json_object_get(line, "plan");
    if (json_is_integer(json_object_get(plan, "total_bytes")) || status == PLAN_SPEC_STATUS ||
        status < 0)
      break;
  }
  unlink(path);
  /* A whole plan line counts however the planner ended after it. */
  if (status >= 0 && json_is_integer(json_object_get(plan, "total_bytes"))) {
    *planned = json_integer_value(json_object_get(plan, "total_bytes"));
    json_decref(line);
    if (cfg->memory_budget_bytes <= 0 || *planned <= cfg->memory_budget_bytes) return 0;
    http_reply_status(res, 409, "FAILED_PRECONDITION", "model",
                      "the model's planned memory (parameters, gradients, optimizer state and "
                      "activations) is %.1f GiB (%lld bytes), more than a trainer may use here: "
                      "%.1f GiB (kilnd --trainer-memory-max %lld); it could never run",
                      (double)*planned / 1073741824.0, (long long)*planned,
                      (double)cfg->memory_budget_bytes / 1073741824.0,
                      (long long)cfg->memory_budget_bytes);
    return -1;
  }
  /* The spec parsed here, so a planner that refuses it found a model that
   * does not build (its error line says why). */
  const char *why = json_string_value(json_object_get(json_object_get(line, "error"), "message"));
  if (status == PLAN_SPEC_STATUS && why) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "model", "%s", why);
  } else {
    http_reply_status(res, 500, "INTERNAL", NULL,
                      "planning the job's memory failed (kiln-train --plan-only, %d run%s, exit "
                      "status %d): %.300s%s%.300s",
                      runs, runs == 1 ? "" : "s", status, why ? why : "no plan was printed",
                      said[0] ? "; it said: " : "", said);
  }
  json_decref(line);
  return -1;
}
