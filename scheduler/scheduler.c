/* scheduler.c — the queue runner: passes that place queued jobs on pool
 * devices (placement.c decides), one runner per placed job that spawns
 * kiln-train pinned to its cores with a progress pipe, batches its metric
 * lines into the store, records checkpoints (with the metrics they were
 * taken at) and retention, and sets the final state from the exit status.
 *
 * Threads: the scheduler thread runs the passes and owns the planner, the
 * queue arrays and the tenant table; each runner thread owns its slot_run's
 * job and child. The store handle `st` is shared (it locks itself). The list
 * of runs, each run's done / cancel / preempt flags, pending cancels, the
 * explain rows and stats are guarded by `wake_lock`; the pools never change
 * after start. */
#define _GNU_SOURCE /* pthread_setaffinity_np */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
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
#include "common.h"
#include "trainer_limits.h"
#include "scheduler.h"
#include "storage.h"

extern char **environ;

#define MAX_LINE             (64 * 1024)
#define METRIC_BATCH         512
#define STOP_GRACE_MS        5000
#define RETRY_BACKOFF_MAX_MS 60000
#define MAX_METRIC_NAMES     64
#define PENDING_CANCELS      16
/* Passes come at most this often however fast jobs are queued (one pass
 * sees every job queued since the last), and never take more than about a
 * tenth of a core: after a pass of t ms the next waits PASS_COST_FACTOR * t
 * (a long queue is read from the store each pass), up to PASS_MAX_PAUSE_MS. */
#define PASS_MIN_INTERVAL_MS 5
#define PASS_COST_FACTOR     10
#define PASS_MAX_PAUSE_MS    250
/* kiln-train's status when the loss or gradients became NaN or infinite. */
#define TRAINER_EXIT_NUMERIC 5
/* kiln-train's status after SIGTERM from outside kilnd: checkpointed, stopped. */
#define TRAINER_EXIT_STOPPED 6
/* kiln-train's status when memory ran out (its limit or the machine's). */
#define TRAINER_EXIT_NOMEM 7

/* One job on its devices. The scheduler thread creates it and joins its
 * runner thread; the runner owns `job` and the child. The flags below are
 * guarded by the sched's wake_lock. */
typedef struct slot_run {
  sched *s;
  store_job job;
  int pool;
  int n_slots;
  int slots[SCHED_MAX_DEVICES]; /* the machine's indices of the pool's device type */
  int64_t end_by_ms;            /* wall clock: start + max_runtime, SCHED_NO_END without */
  pthread_t thread;
  int done;         /* the runner has finished: join it, free its devices */
  int cancel;       /* a client asked to cancel it */
  int preempt;      /* a blocked job of higher priority needs its devices */
  int preempted_by; /* that job's priority */
} slot_run;

/* What :explain says about a queued job, from the last pass. */
typedef struct explain_row {
  char id[40];
  sched_wait wait;
  int pool, devices, priority;
  int free, total;
  char blocker[40];
  char blocker_tenant[64];
  int blocker_priority;
  int64_t start_by_ms, not_before_ms;
} explain_row;

struct sched {
  sched_config cfg;
  store *st;
  pthread_t thread;
  int thread_started;
  sched_pool pools[SCHED_MAX_POOLS]; /* fixed after start */
  int n_pools;
  sched_inventory inventory;
  sched_limits limits; /* fixed after start */
  pthread_mutex_t
      wake_lock; /* guards wake_pending, stopping, runs, pending cancels, explain, stats */
  pthread_cond_t wake_cond;
  int wake_pending;
  int run_ended; /* a runner finished since the scheduler last looked */
  int stopping;
  slot_run **runs;                 /* (max_runs) the jobs on devices */
  slot_run **running_slots;        /* (max_runs) the scheduler thread's pass input */
  sched_running_req *running_reqs; /* (max_runs) */
  int n_runs, max_runs;
  char pending_cancel[PENDING_CANCELS][40]; /* claimed jobs whose run is not made yet */
  int next_pending_cancel;
  explain_row *explain; /* (n_explain) sorted by id */
  int n_explain;
  sched_stats stats;
  /* the scheduler thread's own */
  sched_planner *planner;
  store_queued *queue;
  int queue_cap;
  sched_job_req *reqs;
  int reqs_cap;
  char (*tenants)[64];
  int64_t *tenant_starts;
  int n_tenants, tenants_cap;
};

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

void sched_cancel(sched *s, const char *job_id) {
  if (!s || !job_id) return;
  pthread_mutex_lock(&s->wake_lock);
  int found = 0;
  for (int i = 0; i < s->n_runs && !found; i++) {
    if (strcmp(s->runs[i]->job.id, job_id) == 0) s->runs[i]->cancel = found = 1;
  }
  /* Claimed but not on its devices yet: the run picks it up when made. */
  if (!found) {
    snprintf(s->pending_cancel[s->next_pending_cancel], sizeof s->pending_cancel[0], "%s", job_id);
    s->next_pending_cancel = (s->next_pending_cancel + 1) % PENDING_CANCELS;
  }
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

/* ---- one running job ---- */

typedef struct job_limits {
  int max_restarts, max_runtime_s;
  store_retention retention;
  char monitor[48];
  int workers;    /* multi_worker, parameter_server: processes under mpirun; 0 = kiln-train alone */
  int ps_servers; /* parameter_server: how many of those processes are servers */
} job_limits;

typedef struct run {
  sched *s;
  slot_run *slot;
  const store_job *job;
  store_metric pending[METRIC_BATCH];
  int n_pending;
  int64_t last_flush_ms;
  char error_reason[48];
  char error_message[512];
  int64_t n_points, n_checkpoints;
  int64_t deadline_ms; /* monotonic; 0 = no max_runtime */
  job_limits limits;
  int64_t last_checkpoint_step;
  /* The newest value of each metric: what a checkpoint records, and what
   * keep_best ranks it by. */
  char metric_names[MAX_METRIC_NAMES][48];
  double metric_values[MAX_METRIC_NAMES];
  int n_metric_names;
} run;

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
    slog(r->s, SCHED_LOG_WARN, "msg=\"checkpoint retention failed\" job=%s error=\"%s\"",
         r->job->id, store_errmsg(r->s->st));
  } else if (removed > 0) {
    slog(r->s, SCHED_LOG_INFO, "job=%s checkpoints_removed=%d keep_last=%d keep_best=%d",
         r->job->id, removed, policy->keep_last, policy->keep_best);
  }
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
      remember_metric(r, m->name, m->value);
    }
    break;
  case API_PROGRESS_CHECKPOINT: {
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
      slog(r->s, SCHED_LOG_ERROR, "msg=\"checkpoint not recorded\" job=%s error=\"%s\"", r->job->id,
           store_errmsg(r->s->st));
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
    slog(r->s, SCHED_LOG_INFO, "job=%s phase=%s msg=\"%s\"", r->job->id, phase, said);
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

static int mkdir_p(const char *path) {
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
  char said[2048];
  kc_log_escape(said, sizeof said, message, 1);
  slog(s, rc == STORE_OK && strcmp(to, "SUCCEEDED") == 0 ? SCHED_LOG_INFO : SCHED_LOG_WARN,
       "job=%s state=%s reason=%s msg=\"%s\"", job->id, to, reason, said);
}

/* Back to the queue for a reason that is not the job's (an infrastructure
 * restart), in one transaction. */
static void requeue(sched *s, const store_job *job, const char *via, const char *via_reason,
                    const char *via_message, const char *reason, const char *message) {
  if (store_job_requeue(s->st, job->id, via, via_reason, via_message, reason, message) !=
      STORE_OK) {
    slog(s, SCHED_LOG_ERROR, "msg=\"requeue not recorded\" job=%s error=\"%s\"", job->id,
         store_errmsg(s->st));
    return;
  }
  slog(s, SCHED_LOG_WARN, "job=%s state=QUEUED reason=%s%s%s msg=\"%s\"", job->id, reason,
       via ? " via=" : "", via ? via : "", via_message ? via_message : message);
}

enum {
  PUMP_ENDED = 0,
  PUMP_SHUTDOWN = 1,
  PUMP_CANCELLED = 2,
  PUMP_DEADLINE = 3,
  PUMP_PREEMPTED = 4,
  PUMP_HUNG = 5
};

/* Reads progress until the child closes the pipe; stops the child when the
 * scheduler is stopping, the job is cancelled or preempted, or it runs past
 * max_runtime. Returns PUMP_*: why we stopped it, if we did. */
static int pump(run *r, int fd, pid_t pid) {
  char *buf = malloc(MAX_LINE + 1);
  if (!buf) return PUMP_ENDED;
  size_t used = 0;
  int dropping = 0, stopped = PUMP_ENDED;
  int64_t kill_at = 0, last_line_ms = monotonic_ms();
  const int64_t heartbeat_ms = (int64_t)r->s->cfg.heartbeat_s * 1000;
  for (;;) {
    if (!stopped) {
      if (r->deadline_ms && monotonic_ms() > r->deadline_ms)
        stopped = PUMP_DEADLINE;
      else if (heartbeat_ms > 0 && monotonic_ms() - last_line_ms > heartbeat_ms)
        stopped = PUMP_HUNG;
      else if (is_stopping(r->s))
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
        slog(r->s, SCHED_LOG_WARN, "msg=\"STOPPING not recorded\" job=%s error=\"%s\"", r->job->id,
             store_errmsg(r->s->st));
      }
      if (stopped == PUMP_HUNG) { /* it answers nothing, SIGTERM included */
        kill(-pid, SIGKILL);
        kill_at = monotonic_ms();
      } else if (stopped) { /* SIGTERM first: kiln-train checkpoints, then exits */
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
        last_line_ms = monotonic_ms();
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

/* The service fields of the job's stored spec; a spec that does not parse
 * (it was valid when stored, so only a hand-made row) gets the defaults. */
static job_limits limits_of(const store_job *job) {
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
static void fail_or_retry(sched *s, const store_job *job, const job_limits *l, const char *reason,
                          const char *message) {
  if (job->restarts >= l->max_restarts) {
    finish(s, job, "FAILED", reason, message);
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
    slog(s, SCHED_LOG_ERROR, "msg=\"retry not recorded\" job=%s error=\"%s\"", job->id,
         store_errmsg(s->st));
    return;
  }
  char said[2048];
  kc_log_escape(said, sizeof said, msg, 1);
  slog(s, SCHED_LOG_WARN, "job=%s state=QUEUED reason=RETRYING msg=\"%s\"", job->id, said);
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
    slog(s, SCHED_LOG_WARN, "msg=\"cannot pin the trainer to its cores\" job=%s error=\"%s\"",
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

static void run_job(sched *s, slot_run *slot) {
  const store_job *job = &slot->job;
  char dir[4096], spec_path[4200], log_path[4200], ckpt_dir[4200], msg[8192];
  if (flag_set(s, &slot->cancel)) { /* cancelled between the claim and now */
    finish(s, job, "CANCELLED", "CANCELLED", "cancelled by a client before it started");
    return;
  }
  snprintf(dir, sizeof dir, "%s/%s", s->cfg.jobs_dir, job->id);
  snprintf(spec_path, sizeof spec_path, "%s/spec.json", dir);
  snprintf(log_path, sizeof log_path, "%s/train.log", dir);
  snprintf(ckpt_dir, sizeof ckpt_dir, "%s/checkpoints", dir);
  if (mkdir_p(ckpt_dir) != 0 || write_text(spec_path, job->spec_json) != 0) {
    snprintf(msg, sizeof msg, "cannot prepare the job's folder on the server: %s", strerror(errno));
    finish(s, job, "FAILED", "IO_ERROR", msg);
    return;
  }

  /* Its memory limit (and cores): the job's events say which kind applies. */
  const sched_pool *pool = &s->pools[slot->pool];
  const int gpu = strcmp(pool->device_type, "gpu") == 0;
  char cpus[SCHED_MAX_DEVICES * 4] = "";
  for (int i = 0, used = 0; !gpu && i < slot->n_slots && used < (int)sizeof cpus; i++)
    used += snprintf(cpus + used, sizeof cpus - (size_t)used, "%s%d", i ? "," : "",
                     s->inventory.cpu_ids[slot->slots[i]]);
  sched_trainer_limit limit;
  if (sched_trainer_limit_prepare(&s->limits, job->id, job->attempt, cpus, gpu, &limit, msg,
                                  sizeof msg) != 0) {
    finish(s, job, "FAILED", "INTERNAL", msg);
    return;
  }
  store_job_note(s->st, job->id, "MEMORY_LIMIT", limit.describe);

  int fds[2];
  if (pipe(fds) != 0) {
    snprintf(msg, sizeof msg, "cannot create the progress pipe: %s", strerror(errno));
    sched_trainer_limit_release(&limit);
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
    finish(s, job, "FAILED", "TRAINER_NOT_STARTED", msg);
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
  if (store_job_transition(s->st, job->id, "STARTING", "RUNNING", "STARTED", msg) != STORE_OK) {
    slog(s, SCHED_LOG_ERROR, "msg=\"state not recorded\" job=%s error=\"%s\"", job->id,
         store_errmsg(s->st));
  }
  slog(s, SCHED_LOG_INFO, "job=%s state=RUNNING pid=%d attempt=%d pool=%s devices=%s", job->id,
       (int)pid, job->attempt, s->pools[slot->pool].name, where);

  run *r = calloc(1, sizeof *r);
  int stopped = PUMP_ENDED;
  if (r) {
    r->s = s;
    r->slot = slot;
    r->job = job;
    r->last_flush_ms = monotonic_ms();
    r->limits = limits;
    r->limits.retention.monitor = r->limits.monitor;
    if (limits.max_runtime_s > 0)
      r->deadline_ms = monotonic_ms() + (int64_t)limits.max_runtime_s * 1000;
    stopped = pump(r, fds[0], pid);
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const int oom_killed = sched_trainer_limit_oom_killed(&limit);
  sched_trainer_limit_release(&limit);

  if (stopped == PUMP_SHUTDOWN) {
    requeue(s, job, NULL, NULL, NULL, "SERVER_SHUTDOWN",
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
    requeue(s, job, "PREEMPTED", "PREEMPTED", msg, "REQUEUED",
            "waits to resume from its newest checkpoint");
  } else if (stopped == PUMP_CANCELLED) {
    finish(s, job, "CANCELLED", "CANCELLED", "cancelled by a client while it ran");
  } else if (stopped == PUMP_DEADLINE) {
    snprintf(msg, sizeof msg, "stopped after running longer than max_runtime %d s",
             limits.max_runtime_s);
    finish(s, job, "FAILED", "DEADLINE_EXCEEDED", msg);
  } else if (stopped == PUMP_HUNG) {
    /* A hang is the job's own (a deadlock, a stopped process), so it counts
     * against max_restarts: a job that always hangs ends FAILED. */
    snprintf(msg, sizeof msg,
             "kiln-train wrote no progress for %d s (kilnd --trainer-heartbeat) and was killed; "
             "see /v1/jobs/%s/logs",
             s->cfg.heartbeat_s, job->id);
    fail_or_retry(s, job, &limits, "TRAINER_UNRESPONSIVE", msg);
  } else if (!r) {
    finish(s, job, "FAILED", "INTERNAL", "out of memory while reading progress");
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    completion_message(r, msg, sizeof msg);
    finish(s, job, "SUCCEEDED", "COMPLETED", msg);
  } else if (oom_killed) {
    snprintf(msg, sizeof msg,
             "the kernel's OOM killer stopped kiln-train: it passed its cgroup's memory limit "
             "(%s) of %lld bytes (planned %lld bytes); see /v1/jobs/%s/logs",
             limit.v1 ? "memory.limit_in_bytes" : "memory.max", (long long)s->limits.memory_max,
             (long long)job->planned_memory_bytes, job->id);
    finish(s, job, "FAILED", "RESOURCE_EXHAUSTED", msg);
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == TRAINER_EXIT_STOPPED) {
    /* SIGTERM from outside kilnd: kiln-train checkpointed and stopped, so
     * a retry loses nothing. */
    snprintf(msg, sizeof msg, "kiln-train was stopped by SIGTERM: %.700s", r->error_message);
    fail_or_retry(s, job, &limits, "TRAINER_STOPPED", msg);
  } else if (r->error_reason[0]) {
    finish(s, job, "FAILED", r->error_reason, r->error_message);
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == TRAINER_EXIT_NUMERIC) {
    /* A numeric failure whose reason line was lost: a retry from the same
     * checkpoint diverges again, so the job fails. */
    snprintf(msg, sizeof msg,
             "kiln-train exited with status 5: the loss or gradients became NaN or infinite; "
             "see /v1/jobs/%s/logs",
             job->id);
    finish(s, job, "FAILED", "NUMERIC_ERROR", msg);
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == TRAINER_EXIT_NOMEM) {
    snprintf(msg, sizeof msg,
             "kiln-train ran out of memory (exit 7) under %s; see /v1/jobs/%s/logs",
             limit.kind == SCHED_LIMIT_NONE ? "no limit of its own" : "its limit", job->id);
    finish(s, job, "FAILED", "RESOURCE_EXHAUSTED", msg);
  } else if (WIFSIGNALED(status)) {
    snprintf(msg, sizeof msg, "kiln-train was killed by signal %d (%s); see /v1/jobs/%s/logs",
             WTERMSIG(status), strsignal(WTERMSIG(status)), job->id);
    fail_or_retry(s, job, &limits, "TRAINER_KILLED", msg);
  } else {
    snprintf(msg, sizeof msg, "kiln-train exited with status %d; see /v1/jobs/%s/logs",
             WEXITSTATUS(status), job->id);
    fail_or_retry(s, job, &limits, "TRAINER_EXITED", msg);
  }
  free(r);
}

static void *runner_main(void *arg) {
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

/* ---- the scheduler thread: passes ---- */

static int pool_index(const sched *s, const char *name) {
  for (int k = 0; k < s->n_pools; k++)
    if (strcmp(s->pools[k].name, name) == 0) return k;
  return -1;
}

static void count_start(const char *tenant, int64_t starts, void *user) {
  sched *s = user;
  for (int t = 0; t < s->n_tenants; t++) {
    if (strcmp(s->tenants[t], tenant) == 0) {
      s->tenant_starts[t] = starts;
      return;
    }
  }
}

/* The tenant's index for this pass (the same string, the same index). */
static int tenant_index(sched *s, const char *tenant) {
  for (int t = 0; t < s->n_tenants; t++)
    if (strcmp(s->tenants[t], tenant) == 0) return t;
  if (s->n_tenants == s->tenants_cap) {
    int grown = s->tenants_cap ? s->tenants_cap * 2 : 16;
    char(*names)[64] = realloc(s->tenants, (size_t)grown * sizeof *names);
    if (!names) return -1;
    s->tenants = names;
    int64_t *starts = realloc(s->tenant_starts, (size_t)grown * sizeof *starts);
    if (!starts) return -1;
    s->tenant_starts = starts;
    s->tenants_cap = grown;
  }
  snprintf(s->tenants[s->n_tenants], sizeof s->tenants[0], "%s", tenant);
  s->tenant_starts[s->n_tenants] = 0;
  return s->n_tenants++;
}

static int cmp_explain(const void *a, const void *b) {
  return strcmp(((const explain_row *)a)->id, ((const explain_row *)b)->id);
}

/* Keeps what the pass decided about every queued job for :explain. */
static void publish_explain(sched *s, const sched_pass *p) {
  explain_row *rows = p->n_queue ? malloc((size_t)p->n_queue * sizeof *rows) : NULL;
  int n = 0;
  for (int i = 0; i < p->n_queue && rows; i++) {
    const sched_job_req *q = &p->queue[i];
    const store_queued *sq = &s->queue[i];
    explain_row *e = &rows[n++];
    memset(e, 0, sizeof *e);
    snprintf(e->id, sizeof e->id, "%s", sq->id);
    e->wait = q->wait;
    e->pool = q->pool;
    e->devices = q->devices;
    e->priority = q->priority;
    if (q->pool >= 0) {
      e->total = s->pools[q->pool].n_devices;
      e->free = p->free_devices[q->pool]; /* after this pass's starts */
    }
    if (q->blocker >= 0) {
      snprintf(e->blocker, sizeof e->blocker, "%s", s->queue[q->blocker].id);
      snprintf(e->blocker_tenant, sizeof e->blocker_tenant, "%s", s->queue[q->blocker].tenant);
      e->blocker_priority = p->queue[q->blocker].priority;
    }
    e->start_by_ms = q->start_by_ms;
    e->not_before_ms = q->not_before_ms;
  }
  if (rows) qsort(rows, (size_t)n, sizeof *rows, cmp_explain);
  pthread_mutex_lock(&s->wake_lock);
  explain_row *old = s->explain;
  s->explain = rows;
  s->n_explain = n;
  pthread_mutex_unlock(&s->wake_lock);
  free(old);
}

/* Joins the runners that finished; their devices become free. Returns how
 * many. */
static int reap(sched *s) {
  int reaped = 0;
  pthread_mutex_lock(&s->wake_lock);
  for (int i = 0; i < s->n_runs;) {
    slot_run *slot = s->runs[i];
    if (!slot->done) {
      i++;
      continue;
    }
    s->runs[i] = s->runs[--s->n_runs];
    s->stats.devices_busy -= slot->n_slots;
    s->stats.running_jobs--;
    pthread_mutex_unlock(&s->wake_lock);
    pthread_join(slot->thread, NULL);
    store_job_clear(&slot->job);
    free(slot);
    reaped++;
    pthread_mutex_lock(&s->wake_lock);
  }
  pthread_mutex_unlock(&s->wake_lock);
  return reaped;
}

/* Claims a job the pass placed, takes the pool's first free devices and
 * starts its runner. */
static void start_run(sched *s, const store_queued *q, int pool) {
  slot_run *slot = calloc(1, sizeof *slot);
  if (!slot) return;
  slot->s = s;
  slot->pool = pool;
  int rc = store_job_claim(s->st, q->id, &slot->job);
  if (rc != STORE_OK) { /* cancelled since the pass read it, or a store failure */
    if (rc != STORE_CONFLICT)
      slog(s, SCHED_LOG_ERROR, "msg=\"cannot claim a job\" job=%s error=\"%s\"", q->id,
           store_errmsg(s->st));
    free(slot);
    return;
  }
  const sched_pool *p = &s->pools[pool];
  slot->end_by_ms = slot->job.max_runtime_s > 0
                        ? store_now_ms() + (int64_t)slot->job.max_runtime_s * 1000
                        : SCHED_NO_END;
  pthread_mutex_lock(&s->wake_lock);
  for (int d = 0; d < p->n_devices && slot->n_slots < q->devices; d++) {
    int held = 0;
    for (int i = 0; i < s->n_runs && !held; i++) {
      const slot_run *other = s->runs[i];
      if (other->pool != pool) continue;
      for (int k = 0; k < other->n_slots && !held; k++) held = other->slots[k] == p->devices[d];
    }
    if (!held) slot->slots[slot->n_slots++] = p->devices[d];
  }
  for (int i = 0; i < PENDING_CANCELS; i++) {
    if (strcmp(s->pending_cancel[i], slot->job.id) == 0) {
      slot->cancel = 1;
      s->pending_cancel[i][0] = '\0';
    }
  }
  s->runs[s->n_runs++] = slot;
  s->stats.devices_busy += slot->n_slots;
  s->stats.running_jobs++;
  s->stats.jobs_started++;
  pthread_mutex_unlock(&s->wake_lock);
  if (pthread_create(&slot->thread, NULL, runner_main, slot) != 0) {
    pthread_mutex_lock(&s->wake_lock);
    s->runs[--s->n_runs] = NULL; /* it was the last one added */
    s->stats.devices_busy -= slot->n_slots;
    s->stats.running_jobs--;
    pthread_mutex_unlock(&s->wake_lock);
    finish(s, &slot->job, "QUEUED", "SCHEDULER_BUSY",
           "could not start a runner thread; the next pass tries again");
    store_job_clear(&slot->job);
    free(slot);
  }
}

/* One pass: read the queue, plan, start what fits, ask victims to stop.
 * Returns the devices left free in every pool after it (-1 when it could
 * not run). */
static int pass(sched *s) {
  int n = 0;
  if (store_job_queue_load(s->st, &s->queue, &n, &s->queue_cap) != STORE_OK) {
    slog(s, SCHED_LOG_ERROR, "msg=\"cannot read the queue\" error=\"%s\"", store_errmsg(s->st));
    return -1;
  }
  if (n > s->reqs_cap) {
    sched_job_req *more = realloc(s->reqs, (size_t)n * sizeof *more);
    if (!more) return -1;
    s->reqs = more;
    s->reqs_cap = n;
  }
  s->n_tenants = 0;
  for (int i = 0; i < n; i++) {
    const store_queued *q = &s->queue[i];
    sched_job_req *r = &s->reqs[i];
    memset(r, 0, sizeof *r);
    r->pool = pool_index(s, q->pool);
    r->devices = q->devices;
    r->priority = q->priority;
    r->tenant = tenant_index(s, q->tenant);
    r->seq = q->seq;
    r->max_runtime_ms = (int64_t)q->max_runtime_s * 1000;
    r->not_before_ms = q->not_before_ms;
  }
  int64_t now = store_now_ms();
  if (s->n_tenants > 1 &&
      store_tenant_starts(s->st, now - STORE_FAIR_SHARE_WINDOW_MS, count_start, s) != STORE_OK)
    slog(s, SCHED_LOG_WARN, "msg=\"fair share without recent starts\" error=\"%s\"",
         store_errmsg(s->st));

  sched_running_req *running = s->running_reqs;
  slot_run **running_slot = s->running_slots;
  int n_running = 0;
  pthread_mutex_lock(&s->wake_lock);
  for (int i = 0; i < s->n_runs; i++) {
    slot_run *slot = s->runs[i];
    running_slot[n_running] = slot;
    running[n_running++] =
        (sched_running_req){.pool = slot->pool,
                            .devices = slot->n_slots,
                            .priority = slot->job.priority,
                            .end_by_ms = slot->end_by_ms,
                            .stopping = slot->done || slot->cancel || slot->preempt};
  }
  pthread_mutex_unlock(&s->wake_lock);

  sched_pass p = {.pools = s->pools,
                  .n_pools = s->n_pools,
                  .running = running,
                  .n_running = n_running,
                  .queue = s->reqs,
                  .n_queue = n,
                  .tenant_starts = s->tenant_starts,
                  .n_tenants = s->n_tenants,
                  .now_ms = now,
                  .preempt = s->cfg.preempt};
  if (sched_plan(s->planner, &p) != 0) {
    slog(s, SCHED_LOG_ERROR, "msg=\"scheduling pass out of memory\" queued=%d", n);
    return -1;
  }
  publish_explain(s, &p);
  pthread_mutex_lock(&s->wake_lock);
  for (int i = 0; i < n_running; i++) {
    if (running[i].preempt_for < 0) continue;
    slot_run *slot = running_slot[i];
    slot->preempt = 1;
    slot->preempted_by = s->reqs[running[i].preempt_for].priority;
  }
  pthread_mutex_unlock(&s->wake_lock);
  for (int i = 0; i < n; i++) {
    if (s->reqs[i].wait == SCHED_START) start_run(s, &s->queue[i], s->reqs[i].pool);
  }
  if (p.n_preempted)
    slog(s, SCHED_LOG_INFO, "msg=\"preempting\" jobs=%d queued=%d", p.n_preempted, n);
  int free_left = 0;
  for (int k = 0; k < s->n_pools; k++) free_left += p.free_devices[k];
  return free_left;
}

static void *sched_main(void *arg) {
  sched *s = arg;
  int free_left = -1;
  int64_t last_pass_ms = 0;
  while (!is_stopping(s)) {
    /* With every device taken and no preemption, a job queued since the
     * last pass cannot start: only a run ending (or the poll, which keeps
     * :explain fresh) calls for a pass. Creating jobs then costs no pass. */
    int freed = reap(s) > 0;
    int64_t pass_start = monotonic_ms(), pause_ms = PASS_MIN_INTERVAL_MS;
    if (free_left != 0 || freed || s->cfg.preempt ||
        pass_start - last_pass_ms >= s->cfg.poll_interval_ms) {
      free_left = pass(s);
      last_pass_ms = pass_start;
      pause_ms = (monotonic_ms() - pass_start) * PASS_COST_FACTOR;
      if (pause_ms < PASS_MIN_INTERVAL_MS) pause_ms = PASS_MIN_INTERVAL_MS;
      if (pause_ms > PASS_MAX_PAUSE_MS) pause_ms = PASS_MAX_PAUSE_MS;
    }
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
    int ended = s->run_ended;
    s->run_ended = 0;
    pthread_mutex_unlock(&s->wake_lock);
    /* A burst of creates wakes us once per pass, not once per job; a run
     * that ended is followed at once, its devices taken by the next job. */
    if (!ended) {
      struct timespec pause = {0, (long)pause_ms * 1000000L};
      nanosleep(&pause, NULL);
    }
  }
  /* Stopping: every runner stops its trainer and re-queues its job. */
  for (;;) {
    reap(s);
    pthread_mutex_lock(&s->wake_lock);
    int left = s->n_runs;
    if (left) pthread_cond_wait(&s->wake_cond, &s->wake_lock);
    pthread_mutex_unlock(&s->wake_lock);
    if (!left) break;
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
  pthread_mutex_init(&s->wake_lock, NULL);
  pthread_cond_init(&s->wake_cond, NULL);
  sched_inventory_detect(&s->inventory);
  s->n_pools = cfg->pools_path ? sched_pools_load(cfg->pools_path, &s->inventory, s->pools,
                                                  SCHED_MAX_POOLS, err, errlen)
                               : sched_pools_default(&s->inventory, s->pools, SCHED_MAX_POOLS);
  if (s->n_pools < 0) {
    sched_stop(s);
    return -1;
  }
  if (sched_limits_init(&s->limits, cfg->limits_mode, cfg->memory_max_bytes, err, errlen) != 0) {
    sched_stop(s);
    return -1;
  }
  if (s->limits.kind == SCHED_LIMIT_CGROUP)
    slog(s, SCHED_LOG_INFO,
         "msg=\"trainers run in cgroups of their own\" cgroup=%s memory_max=%lld", s->limits.base,
         (long long)s->limits.memory_max);
  else
    slog(s, SCHED_LOG_INFO, "msg=\"trainers' memory limit\" kind=%s memory_max=%lld why=\"%s\"",
         s->limits.kind == SCHED_LIMIT_RLIMIT ? "RLIMIT_AS" : "none",
         (long long)s->limits.memory_max, s->limits.why_not_cgroup);
  for (int k = 0; k < s->n_pools; k++) {
    s->max_runs += s->pools[k].n_devices;
    s->stats.devices_total += s->pools[k].n_devices;
  }
  s->runs = calloc((size_t)s->max_runs + 1, sizeof *s->runs);
  s->running_slots = calloc((size_t)s->max_runs + 1, sizeof *s->running_slots);
  s->running_reqs = calloc((size_t)s->max_runs + 1, sizeof *s->running_reqs);
  s->planner = sched_planner_new();
  if (!s->runs || !s->running_slots || !s->running_reqs || !s->planner) {
    snprintf(err, errlen, "scheduler: out of memory");
    sched_stop(s);
    return -1;
  }
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
  sched_limits_cleanup(&s->limits);
  pthread_cond_destroy(&s->wake_cond);
  pthread_mutex_destroy(&s->wake_lock);
  sched_planner_free(s->planner);
  free(s->runs);
  free(s->running_slots);
  free(s->running_reqs);
  free(s->explain);
  free(s->queue);
  free(s->reqs);
  free(s->tenants);
  free(s->tenant_starts);
  free(s);
}

/* ---- what the server shows ---- */

int sched_pools_info(sched *s, sched_pool_info *out, int max) {
  if (!s) return 0;
  int n = s->n_pools < max ? s->n_pools : max;
  pthread_mutex_lock(&s->wake_lock);
  for (int k = 0; k < n; k++) {
    memset(&out[k], 0, sizeof out[k]);
    snprintf(out[k].name, sizeof out[k].name, "%s", s->pools[k].name);
    snprintf(out[k].device_type, sizeof out[k].device_type, "%s", s->pools[k].device_type);
    out[k].devices = s->pools[k].n_devices;
    for (int i = 0; i < s->n_runs; i++) {
      if (s->runs[i]->pool != k) continue;
      out[k].devices_busy += s->runs[i]->n_slots;
      out[k].running_jobs++;
    }
  }
  for (int i = 0; i < s->n_explain; i++) {
    int k = s->explain[i].pool;
    if (k >= 0 && k < n) out[k].queued_jobs++;
  }
  pthread_mutex_unlock(&s->wake_lock);
  return n;
}

int sched_devices_info(sched *s, sched_device_info *out, int max) {
  if (!s) return 0;
  int n = 0;
  pthread_mutex_lock(&s->wake_lock);
  for (int k = 0; k < s->n_pools; k++) {
    const sched_pool *p = &s->pools[k];
    for (int d = 0; d < p->n_devices && n < max; d++) {
      sched_device_info *info = &out[n++];
      memset(info, 0, sizeof *info);
      snprintf(info->pool, sizeof info->pool, "%s", p->name);
      snprintf(info->device_type, sizeof info->device_type, "%s", p->device_type);
      info->index = p->devices[d];
      if (strcmp(p->device_type, "gpu") == 0 && info->index < 8)
        snprintf(info->model, sizeof info->model, "%s", s->inventory.gpu_names[info->index]);
      for (int i = 0; i < s->n_runs; i++) {
        const slot_run *slot = s->runs[i];
        if (slot->pool != k) continue;
        for (int j = 0; j < slot->n_slots; j++)
          if (slot->slots[j] == info->index)
            snprintf(info->job, sizeof info->job, "%s", slot->job.id);
      }
    }
  }
  pthread_mutex_unlock(&s->wake_lock);
  return n;
}

int sched_check_fits(sched *s, const char *pool, const char *device_type, int devices, char *field,
                     size_t field_len, char *msg, size_t msg_len) {
  if (!s) return 0;
  int k = pool_index(s, pool && pool[0] ? pool : STORE_DEFAULT_POOL);
  int gpus = 0;
  for (int i = 0; i < s->n_pools; i++) gpus += strcmp(s->pools[i].device_type, "gpu") == 0;
  if (k < 0 && device_type && strcmp(device_type, "gpu") == 0 && gpus == 0) {
    snprintf(field, field_len, "resources.device_type");
    snprintf(msg, msg_len, "this kilnd has no pool of GPUs: %s",
             s->inventory.gpus > 0 ? "its --pools file names none"
                                   : "it found no CUDA device (a build without CUDA, or a "
                                     "machine without a GPU or its driver)");
    return -1;
  }
  if (k < 0) {
    char names[SCHED_MAX_POOLS * 34] = "";
    size_t used = 0;
    for (int i = 0; i < s->n_pools; i++)
      used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "",
                               s->pools[i].name);
    snprintf(field, field_len, "resources.pool");
    snprintf(msg, msg_len, "pool '%.40s' does not exist; this kilnd has: %s", pool, names);
    return -1;
  }
  const sched_pool *p = &s->pools[k];
  if (device_type && device_type[0] && strcmp(device_type, p->device_type) != 0) {
    snprintf(field, field_len, "resources.device_type");
    snprintf(msg, msg_len, "pool '%s' holds %s devices, not %.16s", p->name, p->device_type,
             device_type);
    return -1;
  }
  if (devices > p->n_devices) {
    snprintf(field, field_len, "resources.devices");
    snprintf(msg, msg_len,
             "asks for %d %s devices at once, but pool '%s' has only %d: it could never start",
             devices, p->device_type, p->name, p->n_devices);
    return -1;
  }
  return 0;
}

static void format_time(int64_t ms, char *out, size_t len) {
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(out, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

int sched_explain(sched *s, const char *job_id, const char *viewer_tenant, char *reason,
                  size_t reason_len, char *message, size_t message_len) {
  if (!s) return -1;
  explain_row key;
  snprintf(key.id, sizeof key.id, "%s", job_id);
  pthread_mutex_lock(&s->wake_lock);
  const explain_row *e =
      s->n_explain ? bsearch(&key, s->explain, (size_t)s->n_explain, sizeof key, cmp_explain)
                   : NULL;
  explain_row row;
  if (e) row = *e;
  pthread_mutex_unlock(&s->wake_lock);
  if (!e) return -1;
  snprintf(reason, reason_len, "%s", sched_wait_name(row.wait));
  /* Another tenant's job is named only as that. */
  if (viewer_tenant && row.blocker[0] && strcmp(viewer_tenant, row.blocker_tenant) != 0)
    snprintf(row.blocker, sizeof row.blocker, "of another tenant");
  const char *pool = row.pool >= 0 ? s->pools[row.pool].name : "";
  const char *type = row.pool >= 0 ? s->pools[row.pool].device_type : "";
  char when[40] = "";
  if (row.start_by_ms != SCHED_NO_END) format_time(row.start_by_ms, when, sizeof when);
  switch (row.wait) {
  case SCHED_START:
    snprintf(message, message_len, "the last pass placed it on pool '%s'; it is starting", pool);
    break;
  case SCHED_WAITING_FOR_DEVICES:
  case SCHED_WAITING_FOR_PREEMPTION:
    snprintf(message, message_len,
             "first in line in pool '%s': needs %d %s devices at once, %d of %d are free; %s%s%s",
             pool, row.devices, type, row.free, row.total,
             row.wait == SCHED_WAITING_FOR_PREEMPTION
                 ? "lower-priority jobs are checkpointing and stopping to make room"
                 : (when[0] ? "its devices are reserved, free by "
                            : "its devices are reserved; when they free up is unknown (a job it "
                              "waits for has no max_runtime)"),
             row.wait == SCHED_WAITING_FOR_PREEMPTION ? "" : when,
             row.wait != SCHED_WAITING_FOR_PREEMPTION && when[0]
                 ? " at the latest (running jobs' max_runtime)"
                 : "");
    break;
  case SCHED_BEHIND_HIGHER_PRIORITY:
  case SCHED_BEHIND_EARLIER_JOB:
    snprintf(message, message_len,
             "job %s (priority %d) is ahead in pool '%s' and holds its reservation; this job "
             "(priority %d, %d devices, %d of %d free) may pass it only if it ends before that "
             "job's devices are due (set max_runtime) or fits devices it leaves spare",
             row.blocker, row.blocker_priority, pool, row.priority, row.devices, row.free,
             row.total);
    break;
  case SCHED_RETRY_BACKOFF:
    format_time(row.not_before_ms, when, sizeof when);
    snprintf(message, message_len, "a failed attempt's restart backoff lasts until %s", when);
    break;
  case SCHED_NEVER_FITS:
    if (row.pool < 0)
      snprintf(message, message_len, "its pool does not exist in this kilnd's pools");
    else
      snprintf(message, message_len,
               "asks for %d devices at once; pool '%s' has %d: it can never start", row.devices,
               pool, row.total);
    break;
  }
  return 0;
}
