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
  /* agents pool: the hosts it runs on (owned, n_hosts), fixed at start */
  int n_hosts;
  struct sched_remote_host *hosts;
  int lost;            /* the pass found one of its agents LOST */
  char lost_agent[64]; /* that agent's name */
  char lost_agent_id[32];
} slot_run;

/* One host of a remote run: an agent, the devices of it the run uses, and
 * its ranks. */
typedef struct sched_remote_host {
  char agent_id[32], name[64], address[256];
  int n_cores;
  int cores[SCHED_MAX_DEVICES];
  int rank_first;
} sched_remote_host;

/* An ONLINE agent of an agents pool, as the last pass read it. */
typedef struct sched_host {
  char agent_id[32], name[64], address[256];
  int n_devices;
} sched_host;

/* A remote run's progress pipe, found by its allocation id (remote.c). */
typedef struct sched_remote_entry {
  struct sched_remote_entry *next;
  char alloc_id[40];
  int write_fd; /* -1 once the exit came (or the run gave up on it) */
  int exited;   /* the exit came: status holds it as a wait status */
  int status;
} sched_remote_entry;

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
  /* agents pools: their ONLINE agents as the last pass read them (the
   * scheduler thread's; the pools' host counts are published under
   * wake_lock) */
  sched_host (*hosts)[SCHED_MAX_HOSTS]; /* (SCHED_MAX_POOLS) */
  /* remote runs' progress pipes, guarded by remote_lock */
  pthread_mutex_t remote_lock;
  sched_remote_entry *remotes;
};

/* ---- one running job (runner.c; remote.c for a pool of agents) ---- */

#define MAX_LINE         (64 * 1024)
#define METRIC_BATCH     512
#define MAX_METRIC_NAMES 64

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
  /* remote (a pool of agents): the progress pipe is fed by HTTP requests */
  int remote;
  int64_t start_deadline_ms; /* monotonic: the first line is due by then; 0 = none */
  int got_line, start_timed_out;
  char alloc_id[40];
} run;

/* Why the pump stopped the trainer, if it did. */
enum {
  PUMP_ENDED = 0,
  PUMP_SHUTDOWN = 1,
  PUMP_CANCELLED = 2,
  PUMP_DEADLINE = 3,
  PUMP_PREEMPTED = 4,
  PUMP_HUNG = 5,
  PUMP_LOST = 6,         /* remote: a host's agent was LOST */
  PUMP_START_TIMEOUT = 7 /* remote: no progress line within the pool's start_timeout_s */
};

/* Fills a zeroed run for the job on slot: its limits (with retention's
 * monitor) and, under max_runtime, its deadline from now. */
void sched_run_init(run *r, sched *s, slot_run *slot, const job_limits *limits);
/* Reads progress lines from fd until it closes (or, remote, the allocation
 * is lost or never started), storing metrics and checkpoints; stops the
 * trainer through signal_fn when the scheduler stops, the job is cancelled
 * or preempted, or runs past max_runtime or its heartbeat. PUMP_*. */
int sched_pump(run *r, int fd, void (*signal_fn)(void *ctx, int sig), void *signal_ctx);
/* Ends the attempt as the pump's outcome and the trainer's wait status
 * say (oom: a sentence when the OOM killer ended it, else ""; nomem_under:
 * what limit an exit 7 ran under). */
void sched_conclude(sched *s, slot_run *slot, run *r, const job_limits *limits, int stopped,
                    int status, const char *oom, const char *nomem_under);
job_limits sched_job_limits(const store_job *job);
int sched_resume_point(sched *s, const store_job *job, char *path, size_t len, int64_t *step);
int sched_write_text(const char *path, const char *text);
/* Back to the queue for a reason that is not the job's (infra_restarts). */
void sched_requeue(sched *s, const store_job *job, const char *via, const char *via_reason,
                   const char *via_message, const char *reason, const char *message);
void sched_fail_or_retry(sched *s, const store_job *job, const job_limits *l, const char *reason,
                         const char *message);

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

/* ---- remote.c: pools of agents ---- */
/* Before a pass: marks agents LOST past their pool's grace_s (their runs
 * are told so), reads each agents pool's ONLINE agents and publishes what
 * of them is free. */
void sched_agents_refresh(sched *s);
/* Picks the hosts and their devices of a run placed on an agents pool
 * (spread: it may span hosts); 0, or -1 when they are not free after all. */
int sched_remote_place(sched *s, slot_run *slot, int spread);
/* A runner thread's attempt on remote hosts: its allocation, the start
 * commands, the pump over the pipe HTTP feeds, and its end. */
void sched_run_remote(sched *s, slot_run *slot);
/* At start: allocations a previous kilnd left are ended, their hosts told
 * to drop them (the jobs were re-queued). */
void sched_remote_recover(sched *s);
/* Whether a queued job may be gang-placed over hosts (multi_worker,
 * parameter_server): reads its spec. */
int sched_job_spreads(sched *s, const char *job_id);
/* A remote run's progress pipe, found by its allocation id from then on
 * (add), and no more (remove: its write end is closed). */
void sched_remote_entry_add(sched *s, sched_remote_entry *e);
void sched_remote_entry_remove(sched *s, sched_remote_entry *e);
/* bytes random bytes as 2 * bytes hex digits (and a NUL) into out; 0 or -1. */
int sched_random_hex(char *out, size_t bytes);

/* ---- slurm_run.c: Slurm pools ---- */
/* A runner thread's attempt on a Slurm pool: its allocation and token, a
 * batch job running kiln-agent job around kiln-train, followed from
 * PENDING (STARTING) to its end, progress through the allocation's pipe,
 * scancel to stop it, and its end from the exit kiln-agent posts and the
 * state Slurm gives the batch job. */
void sched_run_slurm(sched *s, slot_run *slot);
/* At start, for an allocation a previous kilnd left on a Slurm pool: its
 * batch job (named after the kiln job) is cancelled. */
void sched_slurm_recover(sched *s, const store_allocation *a);

#endif
