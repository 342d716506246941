/* runner.c — one placed job on its devices: spawns kiln-train (under
 * mpirun for multi-process strategies) pinned to its cores, inside its
 * memory limit, with a progress pipe; batches its metric lines into the
 * store, records checkpoints (with the metrics they were taken at) and
 * retention, watches its heartbeat, and sets the final state from how it
 * ended. Each runner thread owns its slot_run's job and child. */
#define _GNU_SOURCE /* pthread_setaffinity_np */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
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

#include "api.h"
#include "common.h"
#include "sched_internal.h"

extern char **environ;

#define STOP_GRACE_MS        5000
#define RETRY_BACKOFF_MAX_MS 60000
/* kiln-train's status when the loss or gradients became NaN or infinite. */
#define TRAINER_EXIT_NUMERIC 5
/* kiln-train's status after SIGTERM from outside kilnd: checkpointed, stopped. */
#define TRAINER_EXIT_STOPPED 6
/* kiln-train's status when memory ran out (its limit or the machine's). */
#define TRAINER_EXIT_NOMEM 7

static int flag_set(sched *s, const int *flag) {
  pthread_mutex_lock(&s->wake_lock);
  int set = *flag;
  pthread_mutex_unlock(&s->wake_lock);
  return set;
}

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
    sched_slog(r->s, SCHED_LOG_ERROR, "msg=\"metrics not stored\" job=%s error=\"%s\"", r->job->id,
               store_errmsg(r->s->st));
  }
  r->n_points += r->n_pending;
  pthread_mutex_lock(&r->s->wake_lock);
  r->s->stats.points_ingested += (uint64_t)r->n_pending;
  pthread_mutex_unlock(&r->s->wake_lock);
  r->n_pending = 0;
  r->last_flush_ms = sched_monotonic_ms();
}

static void remember_metric(run *r, const char *name, double value) {
  int i = 0;
  while (i < r->n_metric_names && strcmp(r->metric_names[i], name) != 0) i++;
  if (i == r->n_metric_names) {
    if (i == MAX_METRIC_NAMES) return;
    size_t len = strnlen(name, sizeof r->metric_names[i] - 1);
    memcpy(r->metric_names[i], name, len);
    r->metric_names[i][len] = '\0';
    r->n_metric_names++;
  }
  r->metric_values[i] = value;
}

static int plain_name(const char *name) {
  for (const char *c = name; *c; c++)
    if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) return 0;
  return 1;
}

/* {"loss":0.25,"val_loss":0.3}: the newest value of each metric when the
 * checkpoint was written (NaN as null). A name that would need escaping is
 * left out: no spec can name it as a monitor. */
static void metrics_json(const run *r, char *out, size_t len) {
  size_t used = (size_t)snprintf(out, len, "{");
  int first = 1;
  for (int i = 0; i < r->n_metric_names && used < len; i++) {
    if (!plain_name(r->metric_names[i])) continue;
    double v = r->metric_values[i];
    if (isfinite(v))
      used += (size_t)snprintf(out + used, len - used, "%s\"%s\":%.9g", first ? "" : ",",
                               r->metric_names[i], v);
    else
      used += (size_t)snprintf(out + used, len - used, "%s\"%s\":null", first ? "" : ",",
                               r->metric_names[i]);
    first = 0;
  }
  if (used + 2 > len) {
    snprintf(out, len, "{}"); /* too many to record: none rather than a cut document */
    return;
  }
  snprintf(out + used, len - used, "}");
}

static void apply_retention(run *r) {
  const store_retention *policy = &r->limits.retention;
  if (policy->keep_last <= 0 && policy->keep_best <= 0) return;
  int removed = 0;
  if (store_checkpoint_retain_policy(r->s->st, r->job->id, policy, remove_checkpoint_files, NULL,
                                     &removed) != STORE_OK) {
    sched_slog(r->s, SCHED_LOG_WARN, "msg=\"checkpoint retention failed\" job=%s error=\"%s\"",
               r->job->id, store_errmsg(r->s->st));
  } else if (removed > 0) {
    sched_slog(r->s, SCHED_LOG_INFO, "job=%s checkpoints_removed=%d keep_last=%d keep_best=%d",
               r->job->id, removed, policy->keep_last, policy->keep_best);
  }
}

/* A remote trainer's checkpoint line must name a file its agent uploaded:
 * one in the job's checkpoints folder here, no "..", present. */
static int remote_checkpoint_ok(const run *r, const char *path) {
  char dir[4200];
  int n = snprintf(dir, sizeof dir, "%s/%s/checkpoints/", r->s->cfg.jobs_dir, r->job->id);
  return n > 0 && strncmp(path, dir, (size_t)n) == 0 && !strstr(path, "/..") &&
         access(path, R_OK) == 0;
}

static void handle_line(run *r, const char *line) {
  api_progress p;
  char err[256];
  if (api_progress_parse(line, &p, err, sizeof err) != 0) {
    sched_slog(r->s, SCHED_LOG_WARN, "msg=\"bad progress line\" job=%s error=\"%s\"", r->job->id,
               err);
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
      remember_metric(r, m->name, m->value);
    }
    break;
  case API_PROGRESS_CHECKPOINT: {
    if (r->remote && !remote_checkpoint_ok(r, p.path)) {
      sched_slog(r->s, SCHED_LOG_WARN,
                 "msg=\"checkpoint line names no upload of this job; not recorded\" job=%s "
                 "alloc=%s",
                 r->job->id, r->alloc_id);
      break;
    }
    flush_metrics(r); /* the checkpoint row comes after the points it covers */
    char metrics[4096];
    metrics_json(r, metrics, sizeof metrics);
    store_checkpoint c;
    memset(&c, 0, sizeof c);
    snprintf(c.job_id, sizeof c.job_id, "%s", r->job->id);
    c.attempt = r->job->attempt;
    c.step = p.step;
    r->last_checkpoint_step = p.step;
    snprintf(c.path, sizeof c.path, "%s", p.path);
    c.bytes = p.bytes;
    memcpy(c.sha256, p.sha256, sizeof c.sha256);
    c.metrics_json = metrics;
    c.create_ms = now;
    if (store_checkpoint_add(r->s->st, &c) != STORE_OK) {
      sched_slog(r->s, SCHED_LOG_ERROR, "msg=\"checkpoint not recorded\" job=%s error=\"%s\"",
                 r->job->id, store_errmsg(r->s->st));
    }
    r->n_checkpoints++;
    apply_retention(r);
    break;
  }
  case API_PROGRESS_ERROR:
    snprintf(r->error_reason, sizeof r->error_reason, "%s", p.reason);
    snprintf(r->error_message, sizeof r->error_message, "%s", p.message);
    break;
  case API_PROGRESS_STATUS: {
    char phase[2 * sizeof p.reason], said[2 * sizeof p.message];
    kc_log_escape(phase, sizeof phase, p.reason, 1);
    kc_log_escape(said, sizeof said, p.message, 1);
    sched_slog(r->s, SCHED_LOG_INFO, "job=%s phase=%s msg=\"%s\"", r->job->id, phase, said);
    /* The pipeline's auto-tuned settings belong in the job's own events,
     * and so does the plan ("..., 5 epochs of 469 steps"): a client shows
     * progress against it. */
    if (strcmp(p.reason, "pipeline") == 0)
      store_job_note(r->s->st, r->job->id, "PIPELINE_TUNED", p.message);
    else if (strcmp(p.reason, "training") == 0)
      store_job_note(r->s->st, r->job->id, "TRAINING", p.message);
    /* So do the loop's own decisions: early stopping, a cut rate, a profile. */
    if (strcmp(p.reason, "EARLY_STOPPED") == 0 || strcmp(p.reason, "LR_REDUCED") == 0 ||
        strcmp(p.reason, "PROFILE_WRITTEN") == 0)
      store_job_note(r->s->st, r->job->id, p.reason, p.message);
    break;
  }
  }
}

/* "trained: N metric points, K checkpoint(s)": the points of every attempt,
 * and the checkpoints retention kept, as the store holds them; this
 * attempt's own counts when the store cannot say. */
static void completion_message(const run *r, char *msg, size_t len) {
  int64_t points = r->n_points, kept = r->n_checkpoints;
  if (store_metrics_count(r->s->st, r->job->id, &points) != STORE_OK) points = r->n_points;
  store_checkpoint *list = NULL;
  int n = 0;
  if (store_checkpoint_list(r->s->st, r->job->id, &list, &n) == STORE_OK) kept = n;
  store_checkpoint_list_free(list, n);
  snprintf(msg, len, "trained: %lld metric points, %lld checkpoint(s)", (long long)points,
           (long long)kept);
}

int sched_mkdir_p(const char *path) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(tmp, 0700) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  return (mkdir(tmp, 0700) != 0 && errno != EEXIST) ? -1 : 0;
}

int sched_write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  int ok = fputs(text, f) >= 0;
  ok &= fclose(f) == 0;
  return ok ? 0 : -1;
}

void sched_finish(sched *s, const store_job *job, const char *to, const char *reason,
                  const char *message) {
  int rc = store_job_transition(s->st, job->id, NULL, to, reason, message);
  if (rc != STORE_OK) {
    sched_slog(s, SCHED_LOG_ERROR, "msg=\"state not recorded\" job=%s to=%s error=\"%s\"", job->id,
               to, store_errmsg(s->st));
  }
  char said[2048];
  kc_log_escape(said, sizeof said, message, 1);
  sched_slog(s, rc == STORE_OK && strcmp(to, "SUCCEEDED") == 0 ? SCHED_LOG_INFO : SCHED_LOG_WARN,
             "job=%s state=%s reason=%s msg=\"%s\"", job->id, to, reason, said);
}

/* Back to the queue for a reason that is not the job's (an infrastructure
 * restart), in one transaction. */
void sched_requeue(sched *s, const store_job *job, const char *via, const char *via_reason,
                   const char *via_message, const char *reason, const char *message) {
  if (store_job_requeue(s->st, job->id, via, via_reason, via_message, reason, message) !=
      STORE_OK) {
    sched_slog(s, SCHED_LOG_ERROR, "msg=\"requeue not recorded\" job=%s error=\"%s\"", job->id,
               store_errmsg(s->st));
    return;
  }
  sched_slog(s, SCHED_LOG_WARN, "job=%s state=QUEUED reason=%s%s%s msg=\"%s\"", job->id, reason,
             via ? " via=" : "", via ? via : "", via_message ? via_message : message);
}

static void signal_group(void *ctx, int sig) {
  kill(-*(pid_t *)ctx, sig);
}

int sched_pump(run *r, int fd, void (*signal_fn)(void *ctx, int sig), void *signal_ctx) {
  char *buf = malloc(MAX_LINE + 1);
  if (!buf) return PUMP_ENDED;
  size_t used = 0;
  int dropping = 0, stopped = PUMP_ENDED;
  int64_t kill_at = 0, last_line_ms = sched_monotonic_ms();
  const int64_t heartbeat_ms = (int64_t)r->s->cfg.heartbeat_s * 1000;
  for (;;) {
    if (!stopped) {
      if (r->deadline_ms && sched_monotonic_ms() > r->deadline_ms)
        stopped = PUMP_DEADLINE;
      else if (heartbeat_ms > 0 && sched_monotonic_ms() - last_line_ms > heartbeat_ms)
        stopped = PUMP_HUNG;
      else if (sched_is_stopping(r->s))
        stopped = PUMP_SHUTDOWN;
      else if (flag_set(r->s, &r->slot->cancel))
        stopped = PUMP_CANCELLED;
      else if (flag_set(r->s, &r->slot->preempt))
        stopped = PUMP_PREEMPTED;
      /* :cancel records STOPPING itself before it asks: a conflict here
       * means the job is STOPPING already. */
      int rc = stopped == PUMP_CANCELLED
                   ? store_job_transition(r->s->st, r->job->id, "RUNNING", "STOPPING",
                                          "CANCEL_REQUESTED",
                                          "a client asked to cancel the job; stopping kiln-train")
                   : STORE_OK;
      if (rc != STORE_OK && rc != STORE_CONFLICT) {
        sched_slog(r->s, SCHED_LOG_WARN, "msg=\"STOPPING not recorded\" job=%s error=\"%s\"",
                   r->job->id, store_errmsg(r->s->st));
      }
      if (stopped == PUMP_HUNG) { /* it answers nothing, SIGTERM included */
        signal_fn(signal_ctx, SIGKILL);
        kill_at = sched_monotonic_ms();
      } else if (stopped) { /* SIGTERM first: kiln-train checkpoints, then exits */
        signal_fn(signal_ctx, SIGTERM);
        kill_at = sched_monotonic_ms() + STOP_GRACE_MS;
      }
    }
    if (r->remote && !r->got_line && r->start_deadline_ms &&
        sched_monotonic_ms() > r->start_deadline_ms)
      r->start_timed_out = 1;
    if (stopped && sched_monotonic_ms() > kill_at) signal_fn(signal_ctx, SIGKILL);
    /* A remote attempt whose host is gone, or that never started, sends
     * nothing more: its allocation is ended instead. */
    if (r->remote && (flag_set(r->s, &r->slot->lost) || r->start_timed_out)) break;
    /* ... nor one whose agents never report its end after a KILL. */
    if (r->remote && stopped && sched_monotonic_ms() > kill_at + STOP_GRACE_MS) break;
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
        last_line_ms = sched_monotonic_ms();
        if (r->remote && !r->got_line) { /* the attempt has started on its hosts */
          r->got_line = 1;
          store_allocation_running(r->s->st, r->alloc_id);
        }
        if (!dropping) handle_line(r, buf + start);
        dropping = 0;
        start = i + 1;
      }
      memmove(buf, buf + start, used - start);
      used -= start;
      if (used == MAX_LINE) { /* a line longer than we accept: skip it */
        sched_slog(r->s, SCHED_LOG_WARN, "msg=\"progress line over %d bytes dropped\" job=%s",
                   MAX_LINE, r->job->id);
        used = 0;
        dropping = 1;
      }
    }
    if (sched_monotonic_ms() - r->last_flush_ms >= r->s->cfg.flush_interval_ms) flush_metrics(r);
  }
  free(buf);
  flush_metrics(r);
  return stopped;
}

/* The service fields of the job's stored spec; a spec that does not parse
 * (it was valid when stored, so only a hand-made row) gets the defaults. */
job_limits sched_job_limits(const store_job *job) {
  job_limits l;
  memset(&l, 0, sizeof l);
  l.max_runtime_s = job->max_runtime_s;
  api_job_spec *spec = malloc(sizeof *spec);
  api_error e;
  if (spec && job->spec_json &&
      api_spec_parse(job->spec_json, strlen(job->spec_json), spec, &e) == 0) {
    l.max_restarts = spec->max_restarts;
    l.max_runtime_s = spec->max_runtime_s;
    l.retention.keep_last = spec->checkpoint_keep_last;
    l.retention.keep_best = spec->checkpoint_keep_best;
    snprintf(l.monitor, sizeof l.monitor, "%s", spec->checkpoint_monitor);
    l.retention.higher_is_better = spec->checkpoint_mode_max;
    if (spec->strategy == API_STRATEGY_MULTI_WORKER) l.workers = spec->workers;
    if (spec->strategy == API_STRATEGY_PARAMETER_SERVER) { /* workers first, then the servers */
      l.workers = spec->workers + spec->ps_servers;
      l.ps_servers = spec->ps_servers;
    }
  }
  l.retention.monitor = l.monitor;
  free(spec);
  return l;
}

/* A failure of the job's own: max_restarts bounds these (job->restarts),
 * never the restarts the infrastructure caused (infra_restarts). */
void sched_fail_or_retry(sched *s, const store_job *job, const job_limits *l, const char *reason,
                         const char *message) {
  if (job->restarts >= l->max_restarts) {
    sched_finish(s, job, "FAILED", reason, message);
    return;
  }
  int restart = job->restarts + 1;
  int64_t backoff = 1000;
  for (int i = 1; i < restart && backoff < RETRY_BACKOFF_MAX_MS; i++) backoff *= 2;
  if (backoff > RETRY_BACKOFF_MAX_MS) backoff = RETRY_BACKOFF_MAX_MS;
  char msg[1024];
  snprintf(msg, sizeof msg, "attempt %d ended %s: %.700s; restart %d of %d in %lld s", job->attempt,
           reason, message, restart, l->max_restarts, (long long)(backoff / 1000));
  if (store_job_retry(s->st, job->id, store_now_ms() + backoff, "RETRYING", msg) != STORE_OK) {
    sched_slog(s, SCHED_LOG_ERROR, "msg=\"retry not recorded\" job=%s error=\"%s\"", job->id,
               store_errmsg(s->st));
    return;
  }
  char said[2048];
  kc_log_escape(said, sizeof said, msg, 1);
  sched_slog(s, SCHED_LOG_WARN, "job=%s state=QUEUED reason=RETRYING msg=\"%s\"", job->id, said);
}

/* The newest checkpoint of the job whose file is still there: a re-queued
 * job (crash, retry, shutdown, :resume) goes on from it. 1 and its path
 * and step, or 0 when there is none. */
int sched_resume_point(sched *s, const store_job *job, char *path, size_t len, int64_t *step) {
  store_checkpoint *list = NULL;
  int n = 0, found = 0;
  if (store_checkpoint_list(s->st, job->id, &list, &n) != STORE_OK) {
    sched_slog(s, SCHED_LOG_WARN,
               "msg=\"cannot list checkpoints; starting afresh\" job=%s error=\"%s\"", job->id,
               store_errmsg(s->st));
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

/* "0,1,5": the slots of a run, for the trainer's environment and logs. */
static void slot_list(const slot_run *slot, char *out, size_t len) {
  size_t used = 0;
  out[0] = '\0';
  for (int i = 0; i < slot->n_slots && used < len; i++)
    used += (size_t)snprintf(out + used, len - used, "%s%d", i ? "," : "", slot->slots[i]);
}

/* The trainer's environment: ours, plus KILN_DEVICES=cpu:0,1 (and
 * CUDA_VISIBLE_DEVICES for a GPU pool) naming the devices it was given. */
static char **trainer_env(const sched *s, const slot_run *slot, char *devices, size_t len,
                          char *cuda, size_t cuda_len) {
  const sched_pool *pool = &s->pools[slot->pool];
  char list[SCHED_MAX_DEVICES * 4];
  slot_list(slot, list, sizeof list);
  snprintf(devices, len, "KILN_DEVICES=%s:%s", pool->device_type, list);
  int gpu = strcmp(pool->device_type, "gpu") == 0;
  snprintf(cuda, cuda_len, "CUDA_VISIBLE_DEVICES=%s", list);
  int n = 0;
  while (environ[n]) n++;
  char **env = calloc((size_t)n + 3, sizeof *env);
  if (!env) return NULL;
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (strncmp(environ[i], "KILN_DEVICES=", 13) == 0) continue;
    if (gpu && strncmp(environ[i], "CUDA_VISIBLE_DEVICES=", 21) == 0) continue;
    env[k++] = environ[i];
  }
  env[k++] = devices;
  if (gpu) env[k++] = cuda;
  env[k] = NULL;
  return env;
}

/* Pins the runner thread to a CPU pool's cores before it spawns the
 * trainer: the child inherits the mask, so every thread kiln-train starts
 * (as many as resources.devices) stays on the cores it was given. */
static void pin_to_slots(sched *s, const slot_run *slot) {
  if (strcmp(s->pools[slot->pool].device_type, "cpu") != 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int i = 0; i < slot->n_slots; i++) CPU_SET(s->inventory.cpu_ids[slot->slots[i]], &set);
  int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  if (rc != 0)
    sched_slog(s, SCHED_LOG_WARN, "msg=\"cannot pin the trainer to its cores\" job=%s error=\"%s\"",
               slot->job.id, strerror(rc));
}

/* The command that runs the job: kiln-train with the progress pipe on fd
 * 3, or for multi_worker mpirun -np workers (parameter_server: -np
 * workers + ps) with a generated hostfile (this machine, one slot per
 * process) and rank 0's progress lines on
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
    if (sched_write_text(out->hostfile, line) != 0) return -1;
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

/* Spawns argv under /bin/sh running the limit's prologue, which joins the
 * trainer's cgroup or sets RLIMIT_AS and then execs argv (mpirun is found
 * on PATH), so the trainer starts inside its limit. */
static int spawn_limited(pid_t *pid, const sched_trainer_limit *limit,
                         const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *attr,
                         char *const *argv, char **env) {
  char *wrapped[40] = {"/bin/sh", "-c", (char *)limit->script, "kiln-trainer"};
  int n = 4;
  for (int i = 0; argv[i] && n < 39; i++) wrapped[n++] = argv[i];
  wrapped[n] = NULL;
  return posix_spawn(pid, "/bin/sh", fa, attr, wrapped, env);
}

void sched_conclude(sched *s, slot_run *slot, run *r, const job_limits *limits, int stopped,
                    int status, const char *oom, const char *nomem_under) {
  const store_job *job = &slot->job;
  char msg[8192];
  if (stopped == PUMP_LOST || stopped == PUMP_START_TIMEOUT) {
    /* The infrastructure's failure, not the job's: max_restarts untouched. */
    if (stopped == PUMP_LOST)
      snprintf(msg, sizeof msg,
               "agent %s of pool %s was lost (nothing heard for grace_s); the job resumes from "
               "its newest checkpoint",
               slot->lost_agent, s->pools[slot->pool].name);
    else
      snprintf(msg, sizeof msg,
               "its hosts did not all start it within start_timeout_s (%d s); the job resumes "
               "from its newest checkpoint",
               s->pools[slot->pool].start_timeout_s);
    sched_requeue(s, job, NULL, NULL, NULL, stopped == PUMP_LOST ? "AGENT_LOST" : "START_TIMEOUT",
                  msg);
  } else if (stopped == PUMP_SHUTDOWN) {
    sched_requeue(s, job, NULL, NULL, NULL, "SERVER_SHUTDOWN",
                  "kilnd stopped while the job ran; it runs again when kilnd starts");
  } else if (stopped == PUMP_PREEMPTED) {
    pthread_mutex_lock(&s->wake_lock);
    int by = slot->preempted_by;
    pthread_mutex_unlock(&s->wake_lock);
    if (r->n_checkpoints > 0)
      snprintf(msg, sizeof msg,
               "a queued job of priority %d outranks this one (%d) and needs its devices; "
               "checkpointed at step %lld",
               by, job->priority, (long long)r->last_checkpoint_step);
    else
      snprintf(msg, sizeof msg,
               "a queued job of priority %d outranks this one (%d) and needs its devices; it "
               "wrote no checkpoint",
               by, job->priority);
    sched_requeue(s, job, "PREEMPTED", "PREEMPTED", msg, "REQUEUED",
                  "waits to resume from its newest checkpoint");
  } else if (stopped == PUMP_CANCELLED) {
    sched_finish(s, job, "CANCELLED", "CANCELLED", "cancelled by a client while it ran");
  } else if (stopped == PUMP_DEADLINE) {
    snprintf(msg, sizeof msg, "stopped after running longer than max_runtime %d s",
             limits->max_runtime_s);
    sched_finish(s, job, "FAILED", "DEADLINE_EXCEEDED", msg);
  } else if (stopped == PUMP_HUNG) {
    /* A hang is the job's own (a deadlock, a stopped process), so it counts
     * against max_restarts: a job that always hangs ends FAILED. */
    snprintf(msg, sizeof msg,
             "kiln-train wrote no progress for %d s (kilnd --trainer-heartbeat) and was killed; "
             "see /v1/jobs/%s/logs",
             s->cfg.heartbeat_s, job->id);
    sched_fail_or_retry(s, job, limits, "TRAINER_UNRESPONSIVE", msg);
  } else if (!r) {
    sched_finish(s, job, "FAILED", "INTERNAL", "out of memory while reading progress");
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    completion_message(r, msg, sizeof msg);
    sched_finish(s, job, "SUCCEEDED", "COMPLETED", msg);
  } else if (oom[0]) {
    sched_finish(s, job, "FAILED", "RESOURCE_EXHAUSTED", oom);
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == TRAINER_EXIT_STOPPED) {
    /* SIGTERM from outside kilnd: kiln-train checkpointed and stopped, so
     * a retry loses nothing. */
    snprintf(msg, sizeof msg, "kiln-train was stopped by SIGTERM: %.700s", r->error_message);
    sched_fail_or_retry(s, job, limits, "TRAINER_STOPPED", msg);
  } else if (r->error_reason[0]) {
    sched_finish(s, job, "FAILED", r->error_reason, r->error_message);
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == TRAINER_EXIT_NUMERIC) {
    /* A numeric failure whose reason line was lost: a retry from the same
     * checkpoint diverges again, so the job fails. */
    snprintf(msg, sizeof msg,
             "kiln-train exited with status 5: the loss or gradients became NaN or infinite; "
             "see /v1/jobs/%s/logs",
             job->id);
    sched_finish(s, job, "FAILED", "NUMERIC_ERROR", msg);
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == TRAINER_EXIT_NOMEM) {
    snprintf(msg, sizeof msg,
             "kiln-train ran out of memory (exit 7) under %s; see /v1/jobs/%s/logs", nomem_under,
             job->id);
    sched_finish(s, job, "FAILED", "RESOURCE_EXHAUSTED", msg);
  } else if (WIFSIGNALED(status)) {
    snprintf(msg, sizeof msg, "kiln-train was killed by signal %d (%s); see /v1/jobs/%s/logs",
             WTERMSIG(status), strsignal(WTERMSIG(status)), job->id);
    sched_fail_or_retry(s, job, limits, "TRAINER_KILLED", msg);
  } else {
    snprintf(msg, sizeof msg, "kiln-train exited with status %d; see /v1/jobs/%s/logs",
             WEXITSTATUS(status), job->id);
    sched_fail_or_retry(s, job, limits, "TRAINER_EXITED", msg);
  }
}

void sched_run_init(run *r, sched *s, slot_run *slot, const job_limits *limits) {
  r->s = s;
  r->slot = slot;
  r->job = &slot->job;
  r->last_flush_ms = sched_monotonic_ms();
  r->limits = *limits;
  r->limits.retention.monitor = r->limits.monitor;
  if (limits->max_runtime_s > 0)
    r->deadline_ms = sched_monotonic_ms() + (int64_t)limits->max_runtime_s * 1000;
}

static void run_job(sched *s, slot_run *slot) {
  const store_job *job = &slot->job;
  char dir[4096], spec_path[4200], log_path[4200], ckpt_dir[4200], msg[8192];
  if (flag_set(s, &slot->cancel)) { /* cancelled between the claim and now */
    sched_finish(s, job, "CANCELLED", "CANCELLED", "cancelled by a client before it started");
    return;
  }
  snprintf(dir, sizeof dir, "%s/%s", s->cfg.jobs_dir, job->id);
  snprintf(spec_path, sizeof spec_path, "%s/spec.json", dir);
  snprintf(log_path, sizeof log_path, "%s/train.log", dir);
  snprintf(ckpt_dir, sizeof ckpt_dir, "%s/checkpoints", dir);
  if (sched_mkdir_p(ckpt_dir) != 0 || sched_write_text(spec_path, job->spec_json) != 0) {
    snprintf(msg, sizeof msg, "cannot prepare the job's folder on the server: %s", strerror(errno));
    sched_finish(s, job, "FAILED", "IO_ERROR", msg);
    return;
  }

  if (s->pools[slot->pool].kind == SCHED_POOL_AGENTS) { /* on the hosts of its agents */
    sched_run_remote(s, slot);
    return;
  }
  if (s->pools[slot->pool].kind == SCHED_POOL_SLURM) { /* a batch job in a Slurm partition */
    sched_run_slurm(s, slot);
    return;
  }
  /* Its memory limit (and cores): its STARTED event says which kind applies. */
  const sched_pool *pool = &s->pools[slot->pool];
  const int gpu = strcmp(pool->device_type, "gpu") == 0;
  char cpus[SCHED_MAX_DEVICES * 4] = "";
  for (int i = 0, used = 0; !gpu && i < slot->n_slots && used < (int)sizeof cpus; i++)
    used += snprintf(cpus + used, sizeof cpus - (size_t)used, "%s%d", i ? "," : "",
                     s->inventory.cpu_ids[slot->slots[i]]);
  sched_trainer_limit limit;
  if (sched_trainer_limit_prepare(&s->limits, job->id, job->attempt, cpus, gpu, &limit, msg,
                                  sizeof msg) != 0) {
    sched_finish(s, job, "FAILED", "INTERNAL", msg);
    return;
  }

  int fds[2];
  if (pipe(fds) != 0) {
    snprintf(msg, sizeof msg, "cannot create the progress pipe: %s", strerror(errno));
    sched_trainer_limit_release(&limit);
    sched_finish(s, job, "FAILED", "INTERNAL", msg);
    return;
  }
  fcntl(fds[0], F_SETFD, FD_CLOEXEC);
  fcntl(fds[1], F_SETFD, FD_CLOEXEC);
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  job_limits limits = sched_job_limits(job);
  if (limits.workers > 0) { /* progress on stdout, the log on stderr */
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, log_path, O_WRONLY | O_CREAT | O_APPEND,
                                     0600);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  } else {
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log_path, O_WRONLY | O_CREAT | O_APPEND,
                                     0600);
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
  int resuming = sched_resume_point(s, job, resume_path, sizeof resume_path, &resume_step);
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
  char devices_var[SCHED_MAX_DEVICES * 4 + 32], cuda_var[SCHED_MAX_DEVICES * 4 + 32];
  char **env = trainer_env(s, slot, devices_var, sizeof devices_var, cuda_var, sizeof cuda_var);
  pin_to_slots(s, slot);
  launch how = {.argv = {NULL}};
  pid_t pid;
  int spawn_rc = ENOMEM;
  if (!env)
    spawn_rc = ENOMEM;
  else if (make_launch(s, &limits, dir, argv, &how) != 0)
    spawn_rc = errno ? errno : EIO; /* the hostfile could not be written */
  else if (limit.script[0])         /* the prologue applies the limit, then execs the command */
    spawn_rc = spawn_limited(&pid, &limit, &fa, &attr, how.argv, env);
  else if (how.under_mpi)
    spawn_rc = posix_spawnp(&pid, how.argv[0], &fa, &attr, how.argv, env);
  else
    spawn_rc = posix_spawn(&pid, how.argv[0], &fa, &attr, how.argv, env);
  free(env);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  if (spawn_rc != 0) {
    close(fds[0]);
    sched_trainer_limit_release(&limit);
    /* The program's name, not where it lives on the server. */
    const char *program = how.argv[0] ? how.argv[0] : "kiln-train";
    const char *slash = strrchr(program, '/');
    snprintf(msg, sizeof msg, "cannot start %s: %s", slash ? slash + 1 : program,
             strerror(spawn_rc));
    sched_finish(s, job, "FAILED", "TRAINER_NOT_STARTED", msg);
    return;
  }
  char where[SCHED_MAX_DEVICES * 4 + 64], workers[96] = "";
  slot_list(slot, where, sizeof where);
  if (how.under_mpi && limits.ps_servers > 0)
    snprintf(workers, sizeof workers,
             " as %s kiln-train processes (workers %d, parameter servers %d)", how.np,
             limits.workers - limits.ps_servers, limits.ps_servers);
  else if (how.under_mpi)
    snprintf(workers, sizeof workers, " as %s kiln-train workers", how.np);
  const char *what = how.under_mpi ? "mpirun" : "kiln-train";
  if (resuming)
    snprintf(msg, sizeof msg,
             "%s started (pid %d, attempt %d)%s, resuming from step %lld, on pool %s (%s %s)", what,
             (int)pid, job->attempt, workers, (long long)resume_step, pool->name, pool->device_type,
             where);
  else
    snprintf(msg, sizeof msg, "%s started (pid %d, attempt %d)%s on pool %s (%s %s)", what,
             (int)pid, job->attempt, workers, pool->name, pool->device_type, where);
  size_t used = strlen(msg);
  snprintf(msg + used, sizeof msg - used, "; %s", limit.describe);
  if (store_job_transition(s->st, job->id, "STARTING", "RUNNING", "STARTED", msg) != STORE_OK) {
    sched_slog(s, SCHED_LOG_ERROR, "msg=\"state not recorded\" job=%s error=\"%s\"", job->id,
               store_errmsg(s->st));
  }
  sched_slog(s, SCHED_LOG_INFO, "job=%s state=RUNNING pid=%d attempt=%d pool=%s devices=%s",
             job->id, (int)pid, job->attempt, s->pools[slot->pool].name, where);

  run *r = calloc(1, sizeof *r);
  int stopped = PUMP_ENDED;
  if (r) {
    sched_run_init(r, s, slot, &limits);
    stopped = sched_pump(r, fds[0], signal_group, &pid);
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const int oom_killed = sched_trainer_limit_oom_killed(&limit);
  sched_trainer_limit_release(&limit);

  char oom[600] = "";
  if (oom_killed)
    snprintf(oom, sizeof oom,
             "the kernel's OOM killer stopped kiln-train: it passed its cgroup's memory limit "
             "(%s) of %lld bytes (planned %lld bytes); see /v1/jobs/%s/logs",
             limit.v1 ? "memory.limit_in_bytes" : "memory.max", (long long)s->limits.memory_max,
             (long long)job->planned_memory_bytes, job->id);
  sched_conclude(s, slot, r, &limits, stopped, status, oom,
                 limit.kind == SCHED_LIMIT_NONE ? "no limit of its own" : "its limit");
  free(r);
}

void *sched_runner_main(void *arg) {
  slot_run *slot = arg;
  sched *s = slot->s;
  run_job(s, slot);
  pthread_mutex_lock(&s->wake_lock);
  slot->done = 1;
  s->wake_pending = 1; /* its devices are free: a pass may start the next job */
  s->run_ended = 1;
  pthread_cond_signal(&s->wake_cond);
  pthread_mutex_unlock(&s->wake_lock);
  return NULL;
}
