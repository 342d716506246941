/* sched_internal.h — private to scheduler/: the scheduler's state, shared
 * by the passes and lifecycle (scheduler.c), the runners (runner.c) and
 * what the server reads (inspect.c). See scheduler.c for which thread owns
 * what. */
#ifndef KILN_SCHEDULER_INTERNAL_H
#define KILN_SCHEDULER_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "scheduler.h"
#include "storage.h"
#include "trainer_limits.h"

#define PENDING_CANCELS 16

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
  int spread;      /* agents pool: may span hosts */
  char hosts[400]; /* agents pool: each online host and what it is short of */
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
  /* the experiment whose trials' wait for a quota was last logged */
  char experiments_quota_noted[40];
  /* the store's generation when experiments were last driven */
  uint64_t experiments_generation;
  int experiments_seen;
};

/* One log line (key=value fields) through the configured logger. */
void sched_slog(sched *s, sched_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int sched_is_stopping(sched *s);
int64_t sched_monotonic_ms(void);
int sched_mkdir_p(const char *path);
/* Moves the job to `to` (from any unfinished state) with an event, and logs it. */
void sched_finish(sched *s, const store_job *job, const char *to, const char *reason,
                  const char *message);
/* A runner thread: runs one placed job to its end (runner.c). */
void *sched_runner_main(void *arg);
int sched_pool_index(const sched *s, const char *name); /* -1 when absent */
int sched_cmp_explain(const void *a, const void *b);    /* explain rows by id */
/* Records the running experiments' ended trials and applies their
 * searchers' decisions: trials started, promoted, stopped, experiments
 * ended (experiments.c). On the scheduler thread, before each pass. */
void sched_experiments_drive(sched *s);

#endif
