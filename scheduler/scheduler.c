/* scheduler.c — the queue's passes: read the queue, let placement.c
 * decide, claim and start what fits (one runner thread per placed job,
 * runner.c), ask lower-priority jobs to stop for a blocked one; and the
 * scheduler's start and stop. inspect.c answers what the server reads.
 *
 * Threads: the scheduler thread runs the passes and owns the planner, the
 * queue arrays and the tenant table; each runner thread owns its slot_run's
 * job and child. The store handle `st` is shared (it locks itself). The list
 * of runs, each run's done / cancel / preempt flags, pending cancels, the
 * explain rows and stats are guarded by `wake_lock`; the pools never change
 * after start. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sched_internal.h"

/* Passes come at most this often however fast jobs are queued (one pass
 * sees every job queued since the last), and never take more than about a
 * tenth of a core: after a pass of t ms the next waits PASS_COST_FACTOR * t
 * (a long queue is read from the store each pass), up to PASS_MAX_PAUSE_MS. */
#define PASS_MIN_INTERVAL_MS 5
#define PASS_COST_FACTOR     10
#define PASS_MAX_PAUSE_MS    250

void sched_slog(sched *s, sched_log_level level, const char *fmt, ...) {
  if (!s->cfg.log) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  s->cfg.log(level, line, s->cfg.log_user);
}

int sched_is_stopping(sched *s) {
  pthread_mutex_lock(&s->wake_lock);
  int stopping = s->stopping;
  pthread_mutex_unlock(&s->wake_lock);
  return stopping;
}

int64_t sched_monotonic_ms(void) {
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

/* ---- the scheduler thread: passes ---- */

int sched_pool_index(const sched *s, const char *name) {
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

int sched_cmp_explain(const void *a, const void *b) {
  return strcmp(((const explain_row *)a)->id, ((const explain_row *)b)->id);
}

/* "host-a: 1 of 2 cpu free, short 1; host-b: ...": what each host of an
 * agents pool lacks for q (one host must have all of a job that does not
 * spread). */
static void explain_hosts(const sched *s, const sched_job_req *q, int pool_free, char *out,
                          size_t len) {
  const sched_pool *pool = &s->pools[q->pool];
  size_t used = 0;
  out[0] = '\0';
  for (int h = 0; h < pool->n_hosts && used < len; h++) {
    int free_now = pool->host_free[h];
    int short_by = q->devices - free_now;
    if (q->spread) short_by = q->devices - pool_free;
    used += (size_t)snprintf(out + used, len - used, "%s%s: %d of %d %s free", h ? "; " : "",
                             s->hosts[q->pool][h].name, free_now, pool->host_total[h],
                             pool->device_type);
    if (short_by > 0 && !q->spread && used < len)
      used += (size_t)snprintf(out + used, len - used, ", short %d", short_by);
  }
  if (q->spread && used < len && q->devices > pool_free)
    snprintf(out + used, len - used, "; together short %d", q->devices - pool_free);
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
    e->spread = q->spread;
    if (q->pool >= 0 && s->pools[q->pool].kind == SCHED_POOL_AGENTS)
      explain_hosts(s, q, p->free_devices[q->pool], e->hosts, sizeof e->hosts);
  }
  if (rows) qsort(rows, (size_t)n, sizeof *rows, sched_cmp_explain);
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
    free(slot->hosts);
    free(slot);
    reaped++;
    pthread_mutex_lock(&s->wake_lock);
  }
  pthread_mutex_unlock(&s->wake_lock);
  return reaped;
}

/* Claims a job the pass placed, takes the pool's first free devices and
 * starts its runner. */
static void start_run(sched *s, const store_queued *q, int pool, int spread) {
  slot_run *slot = calloc(1, sizeof *slot);
  if (!slot) return;
  slot->s = s;
  slot->pool = pool;
  int rc = store_job_claim(s->st, q->id, &slot->job);
  if (rc != STORE_OK) { /* cancelled since the pass read it, or a store failure */
    if (rc != STORE_CONFLICT)
      sched_slog(s, SCHED_LOG_ERROR, "msg=\"cannot claim a job\" job=%s error=\"%s\"", q->id,
                 store_errmsg(s->st));
    free(slot);
    return;
  }
  const sched_pool *p = &s->pools[pool];
  slot->end_by_ms = slot->job.max_runtime_s > 0
                        ? store_now_ms() + (int64_t)slot->job.max_runtime_s * 1000
                        : SCHED_NO_END;
  if (p->kind == SCHED_POOL_AGENTS) { /* devices on its hosts, not here */
    slot->n_slots = q->devices;
    if (sched_remote_place(s, slot, spread) != 0) {
      sched_finish(s, &slot->job, "QUEUED", "SCHEDULER_BUSY",
                   "its hosts were no longer free when it was placed; the next pass tries again");
      store_job_clear(&slot->job);
      free(slot);
      return;
    }
  }
  pthread_mutex_lock(&s->wake_lock);
  for (int d = 0; p->kind != SCHED_POOL_AGENTS && d < p->n_devices && slot->n_slots < q->devices;
       d++) {
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
  if (pthread_create(&slot->thread, NULL, sched_runner_main, slot) != 0) {
    pthread_mutex_lock(&s->wake_lock);
    s->runs[--s->n_runs] = NULL; /* it was the last one added */
    s->stats.devices_busy -= slot->n_slots;
    s->stats.running_jobs--;
    pthread_mutex_unlock(&s->wake_lock);
    sched_finish(s, &slot->job, "QUEUED", "SCHEDULER_BUSY",
                 "could not start a runner thread; the next pass tries again");
    store_job_clear(&slot->job);
    free(slot->hosts);
    free(slot);
  }
}

/* One pass: read the queue, plan, start what fits, ask victims to stop.
 * Returns the devices left free in every pool after it (-1 when it could
 * not run). */
static int pass(sched *s) {
  int n = 0;
  sched_agents_refresh(s);
  if (store_job_queue_load(s->st, &s->queue, &n, &s->queue_cap) != STORE_OK) {
    sched_slog(s, SCHED_LOG_ERROR, "msg=\"cannot read the queue\" error=\"%s\"",
               store_errmsg(s->st));
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
    r->pool = sched_pool_index(s, q->pool);
    r->devices = q->devices;
    r->priority = q->priority;
    r->tenant = tenant_index(s, q->tenant);
    r->seq = q->seq;
    r->max_runtime_ms = (int64_t)q->max_runtime_s * 1000;
    r->not_before_ms = q->not_before_ms;
    if (r->pool >= 0 && s->pools[r->pool].kind == SCHED_POOL_AGENTS)
      r->spread = sched_job_spreads(s, q->id);
  }
  int64_t now = store_now_ms();
  if (s->n_tenants > 1 &&
      store_tenant_starts(s->st, now - STORE_FAIR_SHARE_WINDOW_MS, count_start, s) != STORE_OK)
    sched_slog(s, SCHED_LOG_WARN, "msg=\"fair share without recent starts\" error=\"%s\"",
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
    sched_slog(s, SCHED_LOG_ERROR, "msg=\"scheduling pass out of memory\" queued=%d", n);
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
    if (s->reqs[i].wait == SCHED_START)
      start_run(s, &s->queue[i], s->reqs[i].pool, s->reqs[i].spread);
  }
  if (p.n_preempted)
    sched_slog(s, SCHED_LOG_INFO, "msg=\"preempting\" jobs=%d queued=%d", p.n_preempted, n);
  int free_left = 0;
  for (int k = 0; k < s->n_pools; k++) free_left += p.free_devices[k];
  return free_left;
}

static void *sched_main(void *arg) {
  sched *s = arg;
  int free_left = -1;
  int64_t last_pass_ms = 0;
  while (!sched_is_stopping(s)) {
    /* With every device taken and no preemption, a job queued since the
     * last pass cannot start: only a run ending (or the poll, which keeps
     * :explain fresh) calls for a pass. Creating jobs then costs no pass. */
    int freed = reap(s) > 0;
    /* A trial that ended frees its devices and may start or promote
     * another: decided before the pass that places them. */
    sched_experiments_drive(s);
    int64_t pass_start = sched_monotonic_ms(), pause_ms = PASS_MIN_INTERVAL_MS;
    if (free_left != 0 || freed || s->cfg.preempt ||
        pass_start - last_pass_ms >= s->cfg.poll_interval_ms) {
      free_left = pass(s);
      last_pass_ms = pass_start;
      pause_ms = (sched_monotonic_ms() - pass_start) * PASS_COST_FACTOR;
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
  int told = -1;
  for (;;) {
    reap(s);
    pthread_mutex_lock(&s->wake_lock);
    int left = s->n_runs;
    pthread_mutex_unlock(&s->wake_lock);
    if (!left) break;
    if (left != told) /* a trainer may take its grace period to checkpoint */
      sched_slog(s, SCHED_LOG_INFO, "msg=\"stopping: waiting for trainers to stop\" runs=%d", left);
    told = left;
    /* A runner sets done and signals under wake_lock: one that ended since
     * reap() signalled before this wait, so its flag is asked, not waited for. */
    pthread_mutex_lock(&s->wake_lock);
    int ended = 0;
    for (int i = 0; i < s->n_runs && !ended; i++) ended = s->runs[i]->done;
    if (s->n_runs && !ended) pthread_cond_wait(&s->wake_cond, &s->wake_lock);
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
  if (sched_mkdir_p(cfg->jobs_dir) != 0) {
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
  pthread_mutex_init(&s->remote_lock, NULL);
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
    sched_slog(s, SCHED_LOG_INFO,
               "msg=\"trainers run in cgroups of their own\" cgroup=%s memory_max=%lld",
               s->limits.base, (long long)s->limits.memory_max);
  else
    sched_slog(s, SCHED_LOG_INFO,
               "msg=\"trainers' memory limit\" kind=%s memory_max=%lld why=\"%s\"",
               s->limits.kind == SCHED_LIMIT_RLIMIT ? "RLIMIT_AS" : "none",
               (long long)s->limits.memory_max, s->limits.why_not_cgroup);
  for (int k = 0; k < s->n_pools; k++) {
    /* An agents pool's hosts come and go: room for a run on each device. */
    s->max_runs +=
        s->pools[k].kind == SCHED_POOL_AGENTS ? SCHED_MAX_DEVICES : s->pools[k].n_devices;
    s->stats.devices_total += s->pools[k].n_devices;
  }
  s->hosts = calloc(SCHED_MAX_POOLS, sizeof *s->hosts);
  s->runs = calloc((size_t)s->max_runs + 1, sizeof *s->runs);
  s->running_slots = calloc((size_t)s->max_runs + 1, sizeof *s->running_slots);
  s->running_reqs = calloc((size_t)s->max_runs + 1, sizeof *s->running_reqs);
  s->planner = sched_planner_new();
  if (!s->runs || !s->running_slots || !s->running_reqs || !s->planner || !s->hosts) {
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
    sched_slog(s, SCHED_LOG_WARN, "msg=\"re-queued jobs left unfinished\" count=%d", requeued);
  sched_remote_recover(s);
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
  free(s->hosts);
  pthread_mutex_destroy(&s->remote_lock);
  free(s);
}
