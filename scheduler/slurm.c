/* slurm.c — the Slurm commands a Slurm pool runs: sbatch of an attempt's
 * batch script, squeue then sacct to follow it, scancel; each spawned
 * without a shell, in its own process group, killed at its timeout. Any
 * thread may call these; they share no state. */
#define _GNU_SOURCE /* pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "slurm.h"

extern char **environ;

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Appends what fd has to buf (used of cap - 1 kept, the rest read and
 * dropped); 0 at its end. */
static int drain(int fd, char *buf, size_t cap, size_t *used) {
  char chunk[4096];
  ssize_t got = read(fd, chunk, sizeof chunk);
  if (got < 0) return errno == EINTR || errno == EAGAIN ? 1 : 0;
  if (got == 0) return 0;
  if (buf && cap > 1 && *used < cap - 1) {
    size_t keep = (size_t)got < cap - 1 - *used ? (size_t)got : cap - 1 - *used;
    memcpy(buf + *used, chunk, keep);
    *used += keep;
    buf[*used] = '\0';
  }
  return 1;
}

int sched_slurm_command(char *const argv[], int timeout_ms, char *out, size_t out_len, char *errout,
                        size_t err_len) {
  if (out && out_len) out[0] = '\0';
  if (errout && err_len) errout[0] = '\0';
  int po[2], pe[2];
  if (pipe2(po, O_CLOEXEC) != 0)
    return fail(errout, err_len, "cannot make a pipe: %s", strerror(errno));
  if (pipe2(pe, O_CLOEXEC) != 0) {
    int e = errno;
    close(po[0]);
    close(po[1]);
    return fail(errout, err_len, "cannot make a pipe: %s", strerror(e));
  }
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, po[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, pe[1], STDERR_FILENO);
  /* Its own process group (a timeout kills all of it), default signals. */
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  pid_t pid;
  int rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(po[1]);
  close(pe[1]);
  if (rc != 0) {
    close(po[0]);
    close(pe[0]);
    return fail(errout, err_len, "cannot start %s: %s", argv[0], strerror(rc));
  }
  size_t out_used = 0, err_used = 0;
  int open_out = 1, open_err = 1, timed_out = 0;
  const int64_t deadline = now_ms() + timeout_ms;
  while (open_out || open_err) {
    int64_t left = deadline - now_ms();
    if (left <= 0) {
      timed_out = 1;
      break;
    }
    struct pollfd pfd[2] = {{.fd = open_out ? po[0] : -1, .events = POLLIN},
                            {.fd = open_err ? pe[0] : -1, .events = POLLIN}};
    int ready = poll(pfd, 2, (int)left);
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    if (pfd[0].revents && !drain(po[0], out, out_len, &out_used)) open_out = 0;
    if (pfd[1].revents && !drain(pe[0], errout, err_len, &err_used)) open_err = 0;
  }
  close(po[0]);
  close(pe[0]);
  if (timed_out) kill(-pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out)
    return fail(errout, err_len, "%s did not answer within %d ms", argv[0], timeout_ms);
  if (!WIFEXITED(status))
    return fail(errout, err_len, "%s was killed by signal %d", argv[0],
                WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  /* A sentence, not Slurm's trailing newline. */
  while (errout && err_used > 0 && (errout[err_used - 1] == '\n' || errout[err_used - 1] == '\r'))
    errout[--err_used] = '\0';
  return WEXITSTATUS(status);
}

static int write_script(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0700);
  if (fd < 0) return -1;
  size_t len = strlen(text), done = 0;
  while (done < len) {
    ssize_t wrote = write(fd, text + done, len - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) {
      close(fd);
      return -1;
    }
    done += (size_t)wrote;
  }
  return close(fd);
}

int sched_slurm_sbatch_argv(const sched_slurm_submit_req *req, sched_slurm_sbatch *out) {
  int n = 0;
  char **argv = out->argv;
  argv[n++] = "sbatch";
  argv[n++] = "--parsable";
  argv[n++] = "--no-requeue";
  argv[n++] = "--open-mode=append";
  snprintf(out->partition, sizeof out->partition, "--partition=%s", req->partition);
  snprintf(out->nodes, sizeof out->nodes, "--nodes=%d", req->nodes);
  snprintf(out->ntasks, sizeof out->ntasks, "--ntasks=%d", req->ntasks);
  snprintf(out->cpus, sizeof out->cpus, "--cpus-per-task=%d", req->cpus_per_task);
  snprintf(out->gpus, sizeof out->gpus, "--gpus=%d", req->gpus);
  snprintf(out->name, sizeof out->name, "--job-name=%s", req->job_name);
  snprintf(out->chdir, sizeof out->chdir, "--chdir=%s", req->work_dir);
  if (req->output)
    snprintf(out->output, sizeof out->output, "--output=%s", req->output);
  else
    snprintf(out->output, sizeof out->output, "--output=%s/slurm-%%j.out", req->work_dir);
  int len = snprintf(out->script, sizeof out->script, "%s/%s", req->work_dir, req->script_name);
  if (len < 0 || (size_t)len >= sizeof out->script ||
      strlen(req->work_dir) + 16 >= sizeof out->chdir)
    return -1;
  argv[n++] = out->partition;
  argv[n++] = out->nodes;
  argv[n++] = out->ntasks;
  argv[n++] = out->cpus;
  if (req->gpus > 0) argv[n++] = out->gpus;
  argv[n++] = out->name;
  argv[n++] = out->chdir;
  argv[n++] = out->output;
  argv[n++] = out->script;
  argv[n] = NULL;
  return 0;
}

int sched_slurm_submit(const sched_slurm_submit_req *req, char *id, size_t id_len, char *err,
                       size_t errlen) {
  sched_slurm_sbatch *cmd = malloc(sizeof *cmd);
  if (!cmd) return fail(err, errlen, "out of memory");
  int rc = -1;
  if (sched_slurm_sbatch_argv(req, cmd) != 0) {
    fail(err, errlen, "the job's folder path is too long for sbatch's arguments");
  } else if (write_script(cmd->script, req->script) != 0) {
    fail(err, errlen, "cannot write the batch script %s: %s", req->script_name, strerror(errno));
  } else {
    char out[1024], said[1024];
    int status =
        sched_slurm_command(cmd->argv, req->timeout_ms, out, sizeof out, said, sizeof said);
    if (status != 0)
      fail(err, errlen, "sbatch refused the batch job: %s", said[0] ? said : "no reason given");
    else
      rc = sched_slurm_parse_sbatch(out, id, id_len, err, errlen);
  }
  free(cmd);
  return rc;
}

/* squeue says this when the controller no longer holds the job. */
static int no_such_job(const char *said) {
  return strstr(said, "Invalid job id") != NULL;
}

int sched_slurm_poll(const char *job_id, int timeout_ms, sched_slurm_status *st, char *err,
                     size_t errlen) {
  char out[4096], said[1024];
  char *squeue[] = {"squeue", "-h", "-j", (char *)job_id, "-o", "%i|%T|%r", NULL};
  int rc = sched_slurm_command(squeue, timeout_ms, out, sizeof out, said, sizeof said);
  if (rc != 0 && !(rc == 1 && no_such_job(said)))
    return fail(err, errlen, "squeue: %s", said[0] ? said : "failed without a reason");
  int found = rc == 0 ? sched_slurm_parse_squeue(out, job_id, st, err, errlen) : 0;
  if (found != 0) {
    st->source = "squeue";
    return found;
  }
  /* The controller forgot it (MinJobAge): the accounting database has it,
   * or, on a cluster without one, the job completion log (sacct -c). */
  char *sacct[] = {"sacct", "-n", "-P", "-X", "-j", (char *)job_id, "-o", "JobID,State,ExitCode",
                   NULL};
  rc = sched_slurm_command(sacct, timeout_ms, out, sizeof out, said, sizeof said);
  const char *source = "sacct";
  if (rc != 0) {
    source = "sacct -c";
    char first[1024];
    snprintf(first, sizeof first, "%s", said);
    char *completion[] = {
        "sacct", "-c", "-n", "-P", "-j", (char *)job_id, "-o", "JobID,State,ExitCode", NULL};
    rc = sched_slurm_command(completion, timeout_ms, out, sizeof out, said, sizeof said);
    if (rc != 0)
      return fail(err, errlen, "sacct: %s; sacct -c: %s", first[0] ? first : "failed",
                  said[0] ? said : "failed");
  }
  found = sched_slurm_parse_sacct(out, job_id, st, err, errlen);
  if (found == 1) st->source = source;
  if (found == 0) snprintf(st->job_id, sizeof st->job_id, "%s", job_id);
  return found;
}

int sched_slurm_cancel(const char *job_id, int timeout_ms, char *err, size_t errlen) {
  char *argv[] = {"scancel", "--verbose", (char *)job_id, NULL};
  char said[1024];
  int rc = sched_slurm_command(argv, timeout_ms, NULL, 0, said, sizeof said);
  /* scancel exits 0 when the job had ended already, and says so only when
   * verbose */
  if (rc == 0 && (no_such_job(said) || strstr(said, "already completing or completed"))) return 1;
  if (rc != 0 || strstr(said, "error:"))
    return fail(err, errlen, "scancel %s: %s", job_id, said[0] ? said : "failed without a reason");
  return 0;
}

/* Appends word to out as one shell word: in single quotes, each ' as '\''. */
static int put_word(char *out, size_t len, size_t *used, const char *word) {
  size_t need = 3;
  for (const char *c = word; *c; c++) need += *c == '\'' ? 4 : 1;
  if (*used + need + 1 > len) return -1;
  char *p = out + *used;
  *p++ = ' ';
  *p++ = '\'';
  for (const char *c = word; *c; c++) {
    if (*c == '\'') {
      memcpy(p, "'\\''", 4);
      p += 4;
    } else {
      *p++ = *c;
    }
  }
  *p++ = '\'';
  *p = '\0';
  *used = (size_t)(p - out);
  return 0;
}

int sched_slurm_script(const sched_slurm_script_req *req, char *out, size_t len) {
  int n = snprintf(out, len,
                   "#!/bin/sh\n"
                   "# kiln allocation %s: kiln-agent reports the trainer's progress,\n"
                   "# checkpoints and exit to kilnd.\n"
                   "exec",
                   req->alloc_id);
  if (n < 0 || (size_t)n >= len) return -1;
  size_t used = (size_t)n;
  const char *head[] = {req->agent_path, "job",           "--server",
                        req->server_url, "--alloc",       req->alloc_id,
                        "--token-file",  req->token_file, "--"};
  for (size_t i = 0; i < sizeof head / sizeof head[0]; i++)
    if (put_word(out, len, &used, head[i]) != 0) return -1;
  if (req->processes > 1) {
    char np[16];
    snprintf(np, sizeof np, "%d", req->processes);
    if (put_word(out, len, &used, req->mpirun_path ? req->mpirun_path : "mpirun") != 0 ||
        (req->allow_run_as_root && put_word(out, len, &used, "--allow-run-as-root") != 0) ||
        put_word(out, len, &used, "-np") != 0 || put_word(out, len, &used, np) != 0)
      return -1;
  }
  for (int i = 0; req->trainer_argv[i]; i++)
    if (put_word(out, len, &used, req->trainer_argv[i]) != 0) return -1;
  if (used + 2 > len) return -1;
  out[used++] = '\n';
  out[used] = '\0';
  return 0;
}
