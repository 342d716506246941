/* scheduler.c — the queue runner: claim the next job, spawn kiln-train for
 * it with a progress pipe, batch its metric lines into the store, record
 * checkpoints, and set the final state from the exit status and last error.
 *
 * Threads: one scheduler thread owns the store handle `st` and the running
 * child. Other threads only call sched_wake / sched_stop / sched_cancel /
 * sched_get_stats, which touch `wake_pending`, `stopping`, `cancel_id` and
 * `stats` under `wake_lock`. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "scheduler.h"
#include "storage.h"

extern char **environ;

#define MAX_LINE             (64 * 1024)
#define METRIC_BATCH         512
#define STOP_GRACE_MS        5000
#define RETRY_BACKOFF_MAX_MS 60000
/* kiln-train's status after SIGTERM from outside kilnd: checkpointed, stopped. */
#define TRAINER_EXIT_STOPPED 6

struct sched {
  sched_config cfg;
  store *st;
  pthread_t thread;
  int thread_started;
  pthread_mutex_t wake_lock; /* guards wake_pending and stopping */
  pthread_cond_t wake_cond;
  int wake_pending;
  int stopping;
  char cancel_id[40]; /* the job a client asked to cancel, "" when none */
  sched_stats stats;
};

void sched_cancel(sched *s, const char *job_id) {
  if (!s || !job_id) return;
  pthread_mutex_lock(&s->wake_lock);
  snprintf(s->cancel_id, sizeof s->cancel_id, "%s", job_id);
  pthread_cond_signal(&s->wake_cond);
  pthread_mutex_unlock(&s->wake_lock);
}

void sched_get_stats(sched *s, sched_stats *out) {
  memset(out, 0, sizeof *out);
  if (!s) return;
  pthread_mutex_lock(&s->wake_lock);
  *out = s->stats;
  pthread_mutex_unlock(&s->wake_lock);
}

static int cancel_requested(sched *s, const char *job_id) {
  pthread_mutex_lock(&s->wake_lock);
  int yes = strcmp(s->cancel_id, job_id) == 0;
  pthread_mutex_unlock(&s->wake_lock);
  return yes;
}

static void slog(sched *s, sched_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void slog(sched *s, sched_log_level level, const char *fmt, ...) {
  if (!s->cfg.log) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  s->cfg.log(level, line, s->cfg.log_user);
}

static int is_stopping(sched *s) {
  pthread_mutex_lock(&s->wake_lock);
  int stopping = s->stopping;
  pthread_mutex_unlock(&s->wake_lock);
  return stopping;
}

static int64_t monotonic_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- one running job ---- */

typedef struct run {
  sched *s;
  const store_job *job;
  store_metric pending[METRIC_BATCH];
  int n_pending;
  int64_t last_flush_ms;
  char error_reason[48];
  char error_message[512];
  int64_t n_points, n_checkpoints;
  int64_t deadline_ms; /* monotonic; 0 = no max_runtime */
  int keep_last;       /* checkpoint retention; 0 = keep all */
  int64_t next_preempt_check_ms, last_checkpoint_step;
  int preempted_by; /* the priority that outranked this job */
} run;

/* Removes a checkpoint file and the training state beside it; a file that
 * is already gone counts as removed. */
static int remove_checkpoint_files(const char *path, void *user) {
  (void)user;
  char state[600];
  size_t n = strlen(path);
  static const char ext[] = ".safetensors";
  if (n >= sizeof ext - 1 && strcmp(path + n - (sizeof ext - 1), ext) == 0) n -= sizeof ext - 1;
  snprintf(state, sizeof state, "%.*s.state", (int)n, path);
  int rc = 0;
  if (unlink(path) != 0 && errno != ENOENT) rc = -1;
  if (unlink(state) != 0 && errno != ENOENT) rc = -1;
  return rc;
}

static void flush_metrics(run *r) {
  if (r->n_pending == 0) return;
  if (store_metrics_append(r->s->st, r->job->id, r->pending, r->n_pending) != STORE_OK) {
    slog(r->s, SCHED_LOG_ERROR, "msg=\"metrics not stored\" job=%s error=\"%s\"", r->job->id,
         store_errmsg(r->s->st));
  }
  r->n_points += r->n_pending;
  pthread_mutex_lock(&r->s->wake_lock);
  r->s->stats.points_ingested += (uint64_t)r->n_pending;
  pthread_mutex_unlock(&r->s->wake_lock);
  r->n_pending = 0;
  r->last_flush_ms = monotonic_ms();
}

static void handle_line(run *r, const char *line) {
  api_progress p;
  char err[256];
  if (api_progress_parse(line, &p, err, sizeof err) != 0) {
    slog(r->s, SCHED_LOG_WARN, "msg=\"bad progress line\" job=%s error=\"%s\"", r->job->id, err);
    return;
  }
  int64_t now = store_now_ms();
  switch (p.kind) {
  case API_PROGRESS_METRICS:
    for (int i = 0; i < p.n_metrics; i++) {
      if (r->n_pending == METRIC_BATCH) flush_metrics(r);
      store_metric *m = &r->pending[r->n_pending++];
      m->attempt = r->job->attempt;
      m->step = p.step;
      m->epoch = p.epoch;
      snprintf(m->name, sizeof m->name, "%s", p.metric_names[i]);
      m->value = p.metric_values[i];
      m->time_ms = now;
    }
    break;
  case API_PROGRESS_CHECKPOINT: {
    flush_metrics(r); /* the checkpoint row comes after the points it covers */
    store_checkpoint c;
    memset(&c, 0, sizeof c);
    snprintf(c.job_id, sizeof c.job_id, "%s", r->job->id);
    c.attempt = r->job->attempt;
    c.step = p.step;
    r->last_checkpoint_step = p.step;
    snprintf(c.path, sizeof c.path, "%s", p.path);
    c.bytes = p.bytes;
    memcpy(c.sha256, p.sha256, sizeof c.sha256);
    c.metrics_json = "{}";
    c.create_ms = now;
    if (store_checkpoint_add(r->s->st, &c) != STORE_OK) {
      slog(r->s, SCHED_LOG_ERROR, "msg=\"checkpoint not recorded\" job=%s error=\"%s\"", r->job->id,
           store_errmsg(r->s->st));
    }
    r->n_checkpoints++;
    if (r->keep_last > 0) {
      int removed = 0;
      if (store_checkpoint_retain(r->s->st, r->job->id, r->keep_last, remove_checkpoint_files, NULL,
                                  &removed) != STORE_OK) {
        slog(r->s, SCHED_LOG_WARN, "msg=\"checkpoint retention failed\" job=%s error=\"%s\"",
             r->job->id, store_errmsg(r->s->st));
      } else if (removed > 0) {
        slog(r->s, SCHED_LOG_INFO, "job=%s checkpoints_removed=%d keep_last=%d", r->job->id,
             removed, r->keep_last);
      }
    }
    break;
  }
  case API_PROGRESS_ERROR:
    snprintf(r->error_reason, sizeof r->error_reason, "%s", p.reason);
    snprintf(r->error_message, sizeof r->error_message, "%s", p.message);
    break;
  case API_PROGRESS_STATUS:
    slog(r->s, SCHED_LOG_INFO, "job=%s phase=%s msg=\"%s\"", r->job->id, p.reason, p.message);
    /* The pipeline's auto-tuned settings belong in the job's own events. */
    if (strcmp(p.reason, "pipeline") == 0)
      store_job_note(r->s->st, r->job->id, "PIPELINE_TUNED", p.message);
    /* So do the loop's own decisions: early stopping, a cut rate, a profile. */
    if (strcmp(p.reason, "EARLY_STOPPED") == 0 || strcmp(p.reason, "LR_REDUCED") == 0 ||
        strcmp(p.reason, "PROFILE_WRITTEN") == 0)
      store_job_note(r->s->st, r->job->id, p.reason, p.message);
    break;
  }
}

static int mkdir_p(const char *path) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  return (mkdir(tmp, 0755) != 0 && errno != EEXIST) ? -1 : 0;
}

static int write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  int ok = fputs(text, f) >= 0;
  ok &= fclose(f) == 0;
  return ok ? 0 : -1;
}

static void finish(sched *s, const store_job *job, const char *to, const char *reason,
                   const char *message) {
  int rc = store_job_transition(s->st, job->id, NULL, to, reason, message);
  if (rc != STORE_OK) {
    slog(s, SCHED_LOG_ERROR, "msg=\"state not recorded\" job=%s to=%s error=\"%s\"", job->id, to,
         store_errmsg(s->st));
  }
  slog(s, rc == STORE_OK && strcmp(to, "SUCCEEDED") == 0 ? SCHED_LOG_INFO : SCHED_LOG_WARN,
       "job=%s state=%s reason=%s msg=\"%s\"", job->id, to, reason, message);
}

enum {
  PUMP_ENDED = 0,
  PUMP_SHUTDOWN = 1,
  PUMP_CANCELLED = 2,
  PUMP_DEADLINE = 3,
  PUMP_PREEMPTED = 4
};

#define PREEMPT_CHECK_MS 200

/* A queued job that may start now outranks the running one. */
static int outranked(run *r, int *by) {
  int top = 0;
  if (store_job_top_queued_priority(r->s->st, store_now_ms(), &top) != STORE_OK) return 0;
  *by = top;
  return top > r->job->priority;
}

/* Reads progress until the child closes the pipe; stops the child when the
 * scheduler is stopping or the job is cancelled. Returns PUMP_*: why we
 * stopped it, if we did. */
static int pump(run *r, int fd, pid_t pid) {
  char *buf = malloc(MAX_LINE + 1);
  if (!buf) return PUMP_ENDED;
  size_t used = 0;
  int dropping = 0, stopped = PUMP_ENDED;
  int64_t kill_at = 0;
  for (;;) {
    if (!stopped && r->deadline_ms && monotonic_ms() > r->deadline_ms) {
      stopped = PUMP_DEADLINE;
      kill(-pid, SIGTERM);
      kill_at = monotonic_ms() + STOP_GRACE_MS;
    }
    if (!stopped && (is_stopping(r->s) || cancel_requested(r->s, r->job->id))) {
      stopped = is_stopping(r->s) ? PUMP_SHUTDOWN : PUMP_CANCELLED;
      if (stopped == PUMP_CANCELLED &&
          store_job_transition(r->s->st, r->job->id, "RUNNING", "STOPPING", "CANCEL_REQUESTED",
                               "a client asked to cancel the job; stopping kiln-train") !=
              STORE_OK) {
        slog(r->s, SCHED_LOG_WARN, "msg=\"STOPPING not recorded\" job=%s error=\"%s\"", r->job->id,
             store_errmsg(r->s->st));
      }
      kill(-pid, SIGTERM);
      kill_at = monotonic_ms() + STOP_GRACE_MS;
    }
    if (!stopped && r->s->cfg.preempt && monotonic_ms() >= r->next_preempt_check_ms) {
      r->next_preempt_check_ms = monotonic_ms() + PREEMPT_CHECK_MS;
      if (outranked(r, &r->preempted_by)) {
        stopped = PUMP_PREEMPTED;
        kill(-pid, SIGTERM);
        kill_at = monotonic_ms() + STOP_GRACE_MS;
      }
    }
    if (stopped && monotonic_ms() > kill_at) kill(-pid, SIGKILL);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int ready = poll(&pfd, 1, r->s->cfg.flush_interval_ms);
    if (ready < 0 && errno != EINTR) break;
    if (ready > 0) {
      ssize_t got = read(fd, buf + used, MAX_LINE - used);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break; /* EOF: the child is gone */
      used += (size_t)got;
      size_t start = 0;
      for (size_t i = 0; i < used; i++) {
        if (buf[i] != '\n') continue;
        buf[i] = '\0';
        if (!dropping) handle_line(r, buf + start);
        dropping = 0;
        start = i + 1;
      }
      memmove(buf, buf + start, used - start);
      used -= start;
      if (used == MAX_LINE) { /* a line longer than we accept: skip it */
        slog(r->s, SCHED_LOG_WARN, "msg=\"progress line over %d bytes dropped\" job=%s", MAX_LINE,
             r->job->id);
        used = 0;
        dropping = 1;
      }
    }
    if (monotonic_ms() - r->last_flush_ms >= r->s->cfg.flush_interval_ms) flush_metrics(r);
  }
  free(buf);
  flush_metrics(r);
  return stopped;
}

typedef struct job_limits {
  int devices, max_restarts, max_runtime_s, keep_last;
  int workers; /* multi_worker: processes under mpirun; 0 = kiln-train alone */
} job_limits;

/* The service fields of the job's stored spec; a spec that does not parse
 * (it was valid when stored, so only a hand-made row) gets the defaults. */
static job_limits limits_of(const store_job *job) {
  job_limits l = {1, 0, 0, 0, 0};
  api_job_spec *spec = malloc(sizeof *spec);
  api_error e;
  if (spec && job->spec_json &&
      api_spec_parse(job->spec_json, strlen(job->spec_json), spec, &e) == 0) {
    l.devices = spec->devices > 0 ? spec->devices : 1;
    /* every replica of every worker takes a core */
    if (spec->replicas * spec->workers > l.devices) l.devices = spec->replicas * spec->workers;
    l.max_restarts = spec->max_restarts;
    l.max_runtime_s = spec->max_runtime_s;
    l.keep_last = spec->checkpoint_keep_last;
    if (spec->strategy == API_STRATEGY_MULTI_WORKER) l.workers = spec->workers;
  }
  free(spec);
  return l;
}

/* A crashed run goes back to the queue while restarts are left, after an
 * exponential backoff (1 s, 2 s, 4 s ... capped at a minute) so a job that
 * crashes at once does not spin; otherwise it fails with why. */
static void fail_or_retry(sched *s, const store_job *job, const job_limits *l, const char *reason,
                          const char *message) {
  if (job->attempt > l->max_restarts) {
    finish(s, job, "FAILED", reason, message);
    return;
  }
  int64_t backoff = 1000;
  for (int i = 1; i < job->attempt && backoff < RETRY_BACKOFF_MAX_MS; i++) backoff *= 2;
  if (backoff > RETRY_BACKOFF_MAX_MS) backoff = RETRY_BACKOFF_MAX_MS;
  char msg[1024];
  snprintf(msg, sizeof msg, "attempt %d ended %s: %.700s; restart %d of %d in %lld s", job->attempt,
           reason, message, job->attempt, l->max_restarts, (long long)(backoff / 1000));
  if (store_job_retry(s->st, job->id, store_now_ms() + backoff, "RETRYING", msg) != STORE_OK) {
    slog(s, SCHED_LOG_ERROR, "msg=\"retry not recorded\" job=%s error=\"%s\"", job->id,
         store_errmsg(s->st));
    return;
  }
  slog(s, SCHED_LOG_WARN, "job=%s state=QUEUED reason=RETRYING msg=\"%s\"", job->id, msg);
}

/* The newest checkpoint of the job whose file is still there: a re-queued
 * job (crash, retry, shutdown, :resume) goes on from it. 1 and its path
 * and step, or 0 when there is none. */
static int resume_point(sched *s, const store_job *job, char *path, size_t len, int64_t *step) {
  store_checkpoint *list = NULL;
  int n = 0, found = 0;
  if (store_checkpoint_list(s->st, job->id, &list, &n) != STORE_OK) {
    slog(s, SCHED_LOG_WARN, "msg=\"cannot list checkpoints; starting afresh\" job=%s error=\"%s\"",
         job->id, store_errmsg(s->st));
    return 0;
  }
  for (int i = n - 1; i >= 0 && !found; i--) {
    if (access(list[i].path, R_OK) != 0) continue;
    snprintf(path, len, "%s", list[i].path);
    *step = list[i].step;
    found = 1;
  }
  store_checkpoint_list_free(list, n);
  return found;
}

/* The command that runs the job: kiln-train with the progress pipe on fd
 * 3, or for multi_worker mpirun -np workers with a generated hostfile
 * (this machine, one slot per worker) and rank 0's progress lines on
 * standard output, since mpirun hands its ranks no other descriptors. */
typedef struct launch {
  char *argv[32];
  char np[16], hostfile[4200];
  int under_mpi;
} launch;

static int make_launch(sched *s, const job_limits *l, const char *dir, char *const *trainer_args,
                       launch *out) {
  int n = 0;
  out->under_mpi = l->workers > 0;
  if (out->under_mpi) {
    snprintf(out->hostfile, sizeof out->hostfile, "%s/hostfile", dir);
    char line[64];
    snprintf(line, sizeof line, "localhost slots=%d\n", l->workers);
    if (write_text(out->hostfile, line) != 0) return -1;
    snprintf(out->np, sizeof out->np, "%d", l->workers);
    out->argv[n++] = (char *)(s->cfg.mpirun_path ? s->cfg.mpirun_path : "mpirun");
    if (geteuid() == 0) out->argv[n++] = "--allow-run-as-root";
    out->argv[n++] = "--oversubscribe";
    out->argv[n++] = "--hostfile";
    out->argv[n++] = out->hostfile;
    out->argv[n++] = "-np";
    out->argv[n++] = out->np;
  }
  for (int i = 0; trainer_args[i] && n < 30; i++) {
    if (out->under_mpi && strcmp(trainer_args[i], "--progress-fd") == 0) {
      out->argv[n++] = "--json";
      i++; /* its "3" */
      continue;
    }
    out->argv[n++] = trainer_args[i];
  }
  out->argv[n] = NULL;
  return 0;
}

static void run_job(sched *s, const store_job *job) {
  char dir[4096], spec_path[4200], log_path[4200], ckpt_dir[4200], msg[8192];
  if (cancel_requested(s, job->id)) { /* cancelled between the claim and now */
    pthread_mutex_lock(&s->wake_lock);
    s->cancel_id[0] = '\0';
    pthread_mutex_unlock(&s->wake_lock);
    finish(s, job, "CANCELLED", "CANCELLED", "cancelled by a client before it started");
    return;
  }
  snprintf(dir, sizeof dir, "%s/%s", s->cfg.jobs_dir, job->id);
  snprintf(spec_path, sizeof spec_path, "%s/spec.json", dir);
  snprintf(log_path, sizeof log_path, "%s/train.log", dir);
  snprintf(ckpt_dir, sizeof ckpt_dir, "%s/checkpoints", dir);
  if (mkdir_p(ckpt_dir) != 0 || write_text(spec_path, job->spec_json) != 0) {
    snprintf(msg, sizeof msg, "cannot prepare %s: %s", dir, strerror(errno));
    finish(s, job, "FAILED", "IO_ERROR", msg);
    return;
  }

  int fds[2];
  if (pipe(fds) != 0) {
    snprintf(msg, sizeof msg, "cannot create the progress pipe: %s", strerror(errno));
    finish(s, job, "FAILED", "INTERNAL", msg);
    return;
  }
  fcntl(fds[0], F_SETFD, FD_CLOEXEC);
  fcntl(fds[1], F_SETFD, FD_CLOEXEC);
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  job_limits limits = limits_of(job);
  if (limits.workers > 0) { /* progress on stdout, the log on stderr */
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, log_path, O_WRONLY | O_CREAT | O_APPEND,
                                     0644);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  } else {
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log_path, O_WRONLY | O_CREAT | O_APPEND,
                                     0644);
    posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 3);
  }
  /* Its own process group, so stopping it reaches every process it starts. */
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
  char resume_path[600];
  int64_t resume_step = 0;
  int resuming = resume_point(s, job, resume_path, sizeof resume_path, &resume_step);
  char *argv[] = {(char *)s->cfg.trainer_path,
                  "--spec",
                  spec_path,
                  "--progress-fd",
                  "3",
                  "--data-dir",
                  (char *)s->cfg.datasets_dir,
                  "--checkpoint-dir",
                  ckpt_dir,
                  resuming ? "--resume" : NULL,
                  resume_path,
                  NULL};
  launch how = {.argv = {NULL}};
  pid_t pid;
  int spawn_rc = EIO;
  if (make_launch(s, &limits, dir, argv, &how) != 0)
    spawn_rc = errno ? errno : EIO; /* the hostfile could not be written */
  else if (how.under_mpi)
    spawn_rc = posix_spawnp(&pid, how.argv[0], &fa, &attr, how.argv, environ);
  else
    spawn_rc = posix_spawn(&pid, how.argv[0], &fa, &attr, how.argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  if (spawn_rc != 0) {
    close(fds[0]);
    snprintf(msg, sizeof msg, "cannot start %s: %s", how.argv[0] ? how.argv[0] : "kiln-train",
             strerror(spawn_rc));
    finish(s, job, "FAILED", "TRAINER_NOT_STARTED", msg);
    return;
  }
  const char *what = how.under_mpi ? "mpirun" : "kiln-train";
  if (resuming)
    snprintf(msg, sizeof msg, "%s started (pid %d, attempt %d), resuming from step %lld%s%s%s",
             what, (int)pid, job->attempt, (long long)resume_step, how.under_mpi ? "; " : "",
             how.under_mpi ? how.np : "", how.under_mpi ? " kiln-train workers" : "");
  else
    snprintf(msg, sizeof msg, "%s started (pid %d, attempt %d)%s%s%s", what, (int)pid, job->attempt,
             how.under_mpi ? "; " : "", how.under_mpi ? how.np : "",
             how.under_mpi ? " kiln-train workers" : "");
  if (store_job_transition(s->st, job->id, "STARTING", "RUNNING", "STARTED", msg) != STORE_OK) {
    slog(s, SCHED_LOG_ERROR, "msg=\"state not recorded\" job=%s error=\"%s\"", job->id,
         store_errmsg(s->st));
  }
  slog(s, SCHED_LOG_INFO, "job=%s state=RUNNING pid=%d attempt=%d", job->id, (int)pid,
       job->attempt);

  pthread_mutex_lock(&s->wake_lock);
  snprintf(s->stats.running_job, sizeof s->stats.running_job, "%s", job->id);
  s->stats.devices_busy = limits.devices;
  s->stats.jobs_started++;
  pthread_mutex_unlock(&s->wake_lock);
  run *r = calloc(1, sizeof *r);
  int stopped = PUMP_ENDED;
  if (r) {
    r->s = s;
    r->job = job;
    r->last_flush_ms = monotonic_ms();
    r->keep_last = limits.keep_last;
    if (limits.max_runtime_s > 0)
      r->deadline_ms = monotonic_ms() + (int64_t)limits.max_runtime_s * 1000;
    stopped = pump(r, fds[0], pid);
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }

  pthread_mutex_lock(&s->wake_lock);
  s->stats.running_job[0] = '\0';
  s->stats.devices_busy = 0;
  if (strcmp(s->cancel_id, job->id) == 0) s->cancel_id[0] = '\0';
  pthread_mutex_unlock(&s->wake_lock);
  if (stopped == PUMP_SHUTDOWN) {
    finish(s, job, "QUEUED", "SERVER_SHUTDOWN",
           "kilnd stopped while the job ran; it runs again when kilnd starts");
  } else if (stopped == PUMP_PREEMPTED) {
    if (r->n_checkpoints > 0)
      snprintf(msg, sizeof msg,
               "a queued job of priority %d outranks this one (%d); checkpointed at step %lld",
               r->preempted_by, job->priority, (long long)r->last_checkpoint_step);
    else
      snprintf(msg, sizeof msg,
               "a queued job of priority %d outranks this one (%d); it wrote no checkpoint",
               r->preempted_by, job->priority);
    finish(s, job, "PREEMPTED", "PREEMPTED", msg);
    finish(s, job, "QUEUED", "REQUEUED", "waits to resume from its newest checkpoint");
  } else if (stopped == PUMP_CANCELLED) {
    finish(s, job, "CANCELLED", "CANCELLED", "cancelled by a client while it ran");
  } else if (stopped == PUMP_DEADLINE) {
    snprintf(msg, sizeof msg, "stopped after running longer than max_runtime %d s",
             limits.max_runtime_s);
    finish(s, job, "FAILED", "DEADLINE_EXCEEDED", msg);
  } else if (!r) {
    finish(s, job, "FAILED", "INTERNAL", "out of memory while reading progress");
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    snprintf(msg, sizeof msg, "trained: %lld metric points, %lld checkpoint(s)",
             (long long)r->n_points, (long long)r->n_checkpoints);
    finish(s, job, "SUCCEEDED", "COMPLETED", msg);
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == TRAINER_EXIT_STOPPED) {
    /* SIGTERM from outside kilnd: kiln-train checkpointed and stopped, so
     * a retry loses nothing. */
    snprintf(msg, sizeof msg, "kiln-train was stopped by SIGTERM: %.700s", r->error_message);
    fail_or_retry(s, job, &limits, "TRAINER_STOPPED", msg);
  } else if (r->error_reason[0]) {
    finish(s, job, "FAILED", r->error_reason, r->error_message);
  } else if (WIFSIGNALED(status)) {
    snprintf(msg, sizeof msg, "kiln-train was killed by signal %d (%s); see %s", WTERMSIG(status),
             strsignal(WTERMSIG(status)), log_path);
    fail_or_retry(s, job, &limits, "TRAINER_KILLED", msg);
  } else {
    snprintf(msg, sizeof msg, "kiln-train exited with status %d; see %s", WEXITSTATUS(status),
             log_path);
    fail_or_retry(s, job, &limits, "TRAINER_EXITED", msg);
  }
  free(r);
}

static void *sched_main(void *arg) {
  sched *s = arg;
  while (!is_stopping(s)) {
    store_job job;
    memset(&job, 0, sizeof job);
    int rc = store_job_claim_next(s->st, &job);
    if (rc == STORE_OK) {
      run_job(s, &job);
      store_job_clear(&job);
      continue;
    }
    if (rc != STORE_EMPTY) {
      slog(s, SCHED_LOG_ERROR, "msg=\"cannot claim a job\" error=\"%s\"", store_errmsg(s->st));
    }
    /* Nothing to do: sleep until woken or the next poll. */
    pthread_mutex_lock(&s->wake_lock);
    if (!s->wake_pending && !s->stopping) {
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      int64_t ns = until.tv_nsec + (int64_t)s->cfg.poll_interval_ms * 1000000;
      until.tv_sec += ns / 1000000000;
      until.tv_nsec = ns % 1000000000;
      pthread_cond_timedwait(&s->wake_cond, &s->wake_lock, &until);
    }
    s->wake_pending = 0;
    pthread_mutex_unlock(&s->wake_lock);
  }
  return NULL;
}

int sched_start(const sched_config *cfg, sched **out, char *err, size_t errlen) {
  *out = NULL;
  if (access(cfg->trainer_path, X_OK) != 0) {
    snprintf(err, errlen, "trainer %s is not an executable file: %s", cfg->trainer_path,
             strerror(errno));
    return -1;
  }
  if (mkdir_p(cfg->jobs_dir) != 0) {
    snprintf(err, errlen, "cannot create %s: %s", cfg->jobs_dir, strerror(errno));
    return -1;
  }
  sched *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "scheduler: out of memory");
    return -1;
  }
  s->cfg = *cfg;
  if (s->cfg.flush_interval_ms <= 0) s->cfg.flush_interval_ms = 250;
  if (s->cfg.poll_interval_ms <= 0) s->cfg.poll_interval_ms = 1000;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  s->stats.devices_total = cores > 0 ? (int)cores : 1;
  pthread_mutex_init(&s->wake_lock, NULL);
  pthread_cond_init(&s->wake_cond, NULL);
  if (store_open(cfg->db_path, &s->st, err, errlen) != STORE_OK) {
    sched_stop(s);
    return -1;
  }
  int requeued = 0;
  if (store_job_requeue_unfinished(s->st, &requeued) != STORE_OK) {
    snprintf(err, errlen, "cannot re-queue unfinished jobs: %s", store_errmsg(s->st));
    sched_stop(s);
    return -1;
  }
  if (requeued)
    slog(s, SCHED_LOG_WARN, "msg=\"re-queued jobs left unfinished\" count=%d", requeued);
  if (pthread_create(&s->thread, NULL, sched_main, s) != 0) {
    snprintf(err, errlen, "cannot start the scheduler thread");
    sched_stop(s);
    return -1;
  }
  s->thread_started = 1;
  *out = s;
  return 0;
}

void sched_wake(sched *s) {
  if (!s) return;
  pthread_mutex_lock(&s->wake_lock);
  s->wake_pending = 1;
  pthread_cond_signal(&s->wake_cond);
  pthread_mutex_unlock(&s->wake_lock);
}

void sched_stop(sched *s) {
  if (!s) return;
  pthread_mutex_lock(&s->wake_lock);
  s->stopping = 1;
  pthread_cond_signal(&s->wake_cond);
  pthread_mutex_unlock(&s->wake_lock);
  if (s->thread_started) pthread_join(s->thread, NULL);
  store_close(s->st);
  pthread_cond_destroy(&s->wake_cond);
  pthread_mutex_destroy(&s->wake_lock);
  free(s);
}
