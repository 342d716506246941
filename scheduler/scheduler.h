/* scheduler.h — kiln's scheduler: an inventory of device slots in pools,
 * passes that place queued jobs on all the devices they ask for (priority,
 * fair share, EASY backfill, preemption), one kiln-train process per
 * running job with its progress streamed into the store, and how each run
 * ended. Prefix sched_. */
#ifndef KILN_SCHEDULER_H
#define KILN_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "storage.h"

typedef struct sched sched;

typedef enum sched_log_level {
  SCHED_LOG_DEBUG = 0,
  SCHED_LOG_INFO,
  SCHED_LOG_WARN,
  SCHED_LOG_ERROR
} sched_log_level;
/* Receives one log line (key=value fields, no newline). */
typedef void (*sched_log_fn)(sched_log_level level, const char *line, void *user);

typedef struct sched_config {
  const char *db_path;      /* the SQLite file; the scheduler opens its own handle */
  const char *jobs_dir;     /* one folder per job: spec, log, checkpoints */
  const char *trainer_path; /* the kiln-train binary */
  const char *datasets_dir; /* passed to kiln-train */
  /* A multi_worker job's kiln-train runs under mpirun -np workers (a
   * parameter_server job's under -np workers + ps), rank 0's
   * progress lines on mpirun's standard output; NULL = "mpirun" on PATH. */
  const char *mpirun_path;
  /* kiln-agent, as a Slurm pool's batch jobs run it on their nodes; NULL =
   * "kiln-agent" on the nodes' PATH. */
  const char *agent_path;
  /* How often a Slurm pool's batch job is asked about (squeue, then sacct)
   * while it lives; 0 = every 1000 ms. */
  int slurm_poll_ms;
  int flush_interval_ms; /* metric lines are written at most this late (default 250) */
  int poll_interval_ms;  /* how often the queue is looked at without a wake (default 1000) */
  /* Preemption: a queued job of higher priority than the running one stops
   * it (SIGTERM, so kiln-train checkpoints first); the stopped job goes
   * PREEMPTED, then back to QUEUED, and resumes from that checkpoint. */
  int preempt;
  /* A pools file (see sched_pools_parse); NULL = one "default" pool of every
   * CPU core (and a "gpu" pool of every GPU). */
  const char *pools_path;
  /* A running trainer that writes no progress line for this many seconds
   * (a hang, a SIGSTOP) is killed and its job fails over as a failure of
   * its own (TRAINER_UNRESPONSIVE, bounded by max_restarts); 0 = never. */
  int heartbeat_s;
  /* Each trainer's memory limit in bytes (0 = none), applied as
   * limits_mode says: "auto" (a cgroup v2 of its own, with its cores as
   * cpuset.cpus, where the hierarchy is writable; else RLIMIT_AS),
   * "cgroup" (or sched_start fails), "rlimit"; NULL = auto. A trainer the
   * OOM killer ends, or that runs out under RLIMIT_AS (exit 7), ends its
   * job RESOURCE_EXHAUSTED. */
  int64_t memory_max_bytes;
  const char *limits_mode;
  /* The quota of a tenant an admin set none for (as the server's): an
   * experiment's trial starts, or is promoted, only while its tenant's
   * devices and waiting jobs leave room for it, as a submitted job must. */
  store_quota quota_defaults;
  sched_log_fn log; /* may be NULL */
  void *log_user;
} sched_config;

/* Opens the store, re-queues jobs a previous run left unfinished, and starts
 * the scheduler thread. */
int sched_start(const sched_config *cfg, sched **out, char *err, size_t errlen);
/* Tells the scheduler a job was queued, so it need not wait for its poll. */
void sched_wake(sched *s);
/* Asks the scheduler to cancel job_id if it is starting or running: it goes
 * STOPPING, kiln-train gets SIGTERM (SIGKILL after a grace period) and the
 * job ends CANCELLED. A queued job is cancelled in the store by the caller
 * instead. */
void sched_cancel(sched *s, const char *job_id);

typedef struct sched_stats {
  int running_jobs;         /* jobs on devices now */
  int devices_busy;         /* devices they hold */
  int devices_total;        /* slots in every pool */
  uint64_t points_ingested; /* metric points written since start */
  uint64_t jobs_started;    /* trainer processes started since start */
} sched_stats;
void sched_get_stats(sched *s, sched_stats *out);

typedef struct sched_pool_info {
  char name[32];
  char device_type[8];
  int devices, devices_busy, running_jobs, queued_jobs;
  int agents;  /* 1: a pool of kiln-agent hosts */
  int grace_s; /* agents: seconds without a poll before an agent is LOST */
} sched_pool_info;
/* The pools with what runs on them; returns how many were filled. */
int sched_pools_info(sched *s, sched_pool_info *out, int max);

typedef struct sched_device_info {
  char pool[32];
  char device_type[8];
  int index;      /* the machine's index of the device of that type (a CPU core, a GPU) */
  char model[64]; /* a GPU's name; "" for a CPU core */
  char job[40];   /* the job on it; "" when free */
} sched_device_info;
/* Every device in a pool, pool by pool; returns how many were filled. */
int sched_devices_info(sched *s, sched_device_info *out, int max);

/* Whether a job asking for devices of device_type ("" = the pool's) in pool
 * ("" = "default") could ever start here. 0, or -1 with the spec field
 * ("resources.pool", "resources.device_type", "resources.devices") and a
 * sentence. */
int sched_check_fits(sched *s, const char *pool, const char *device_type, int devices, char *field,
                     size_t field_len, char *msg, size_t msg_len);

/* Why a queued job waits, as the last pass saw it: reason is a
 * sched_wait_name() code, message a sentence naming counts, the pool and
 * the job ahead (only when it belongs to viewer_tenant; NULL = any, for an
 * admin). -1 when the last pass did not see the job (queued since, or not
 * queued). */
int sched_explain(sched *s, const char *job_id, const char *viewer_tenant, char *reason,
                  size_t reason_len, char *message, size_t message_len);

/* Remote runs (pools of agents): progress lines the worker side posts for
 * an allocation, fed to its runner as a local trainer's pipe is; and its
 * exit (exit_code, or signal_no > 0), which ends the attempt as a local
 * wait status does. 0, or -1 when no runner waits on that allocation
 * (ended, or not this kilnd's). */
int sched_remote_progress(sched *s, const char *alloc_id, const char *data, size_t len);
int sched_remote_exit(sched *s, const char *alloc_id, int exit_code, int signal_no);

/* Stops the thread. A running job's trainer gets SIGTERM (then SIGKILL after
 * a grace period) and the job goes back to QUEUED, to run again on the next
 * start. NULL is a no-op. */
void sched_stop(sched *s);

/* ---- placement: one scheduling pass (placement.c) ----
 * Pure: no I/O, no locks, no allocation once its scratch has grown. The
 * scheduler thread runs it over the queue it reads from the store; tests and
 * bench/ run it over queues they make. */

#define SCHED_MAX_POOLS   16
#define SCHED_MAX_DEVICES 256 /* per pool */
#define SCHED_NO_END      INT64_MAX

#define SCHED_MAX_HOSTS 64 /* agents of one pool a pass places on */

typedef enum sched_pool_kind {
  SCHED_POOL_LOCAL = 0, /* devices of the machine kilnd runs on */
  SCHED_POOL_AGENTS,    /* the cores (or GPUs) of the pool's ONLINE kiln-agents */
  SCHED_POOL_SLURM      /* a Slurm partition */
} sched_pool_kind;
const char *sched_pool_kind_name(sched_pool_kind k); /* "local", "agents", "slurm" */

typedef struct sched_pool {
  char name[32];
  char device_type[8]; /* "cpu" or "gpu" */
  int n_devices;
  int devices[SCHED_MAX_DEVICES]; /* the machine's indices of its devices of that type */
  sched_pool_kind kind;
  /* agents: seconds without a poll before an agent is LOST, and before a
   * started allocation must have reported its first progress line */
  int grace_s, start_timeout_s;
  /* agents: the network multi-host ranks use ("" = Open MPI's choice) */
  char oob_tcp_if_include[64], btl_tcp_if_include[64], nccl_socket_ifname[32];
  char shared_data[256]; /* agents: a folder every host mounts; "" = data sets are fetched */
  /* slurm */
  char partition[64];
  int nodes, cpus_per_node;
  char kilnd_url[256]; /* how batch jobs reach kilnd */
  /* agents: its hosts as the scheduler saw them before a pass (n_devices
   * is their sum): each host's devices and how many of them are free. */
  int n_hosts;
  int host_total[SCHED_MAX_HOSTS];
  int host_free[SCHED_MAX_HOSTS];
} sched_pool;

/* Why a queued job did not start in a pass (or that it did). */
typedef enum sched_wait {
  SCHED_START = 0,              /* placed: all its devices are free and it delays no one */
  SCHED_WAITING_FOR_DEVICES,    /* first in line in its pool: it holds the pool's reservation */
  SCHED_WAITING_FOR_PREEMPTION, /* first in line; lower-priority jobs are stopping for it */
  SCHED_BEHIND_HIGHER_PRIORITY, /* another job (blocker) of higher priority holds the reservation */
  SCHED_BEHIND_EARLIER_JOB,     /* the same, by a job of its priority ahead in fair-share order */
  SCHED_RETRY_BACKOFF,          /* a failed attempt's backoff has not passed */
  SCHED_NEVER_FITS,             /* its pool does not exist or has fewer devices than it asks */
  SCHED_WAITING_FOR_HOSTS,      /* agents pool: no host (or, for a gang, not all its hosts
                                   together) has that many devices online; holds no reservation */
} sched_wait;
const char *sched_wait_name(sched_wait w); /* "WAITING_FOR_DEVICES" ... */

/* A queued job as a pass sees it; the pass fills the fields below `out`. */
typedef struct sched_job_req {
  int pool;    /* index into the pools; -1 = a pool that does not exist */
  int devices; /* gang: all of them at once or none */
  int priority;
  int tenant; /* index into tenant_starts */
  int64_t seq;
  int64_t max_runtime_ms; /* 0 = no limit */
  int64_t not_before_ms;  /* retry backoff; 0 = none */
  int spread;             /* agents pool: may be gang-placed over several hosts (multi_worker,
                             parameter_server); else it needs one host with all its devices */
  /* out */
  sched_wait wait;
  int blocker;         /* BEHIND_*: the queue index of the job holding the reservation */
  int64_t start_by_ms; /* WAITING_*: the latest start its reservation promises, or SCHED_NO_END */
} sched_job_req;

/* A running job as a pass sees it. */
typedef struct sched_running_req {
  int pool, devices, priority;
  int64_t end_by_ms; /* start + max_runtime; SCHED_NO_END without a limit */
  int stopping;      /* already stopping (preempted or cancelled): its devices come back soon */
  /* out */
  int preempt_for; /* the queue index of the job it must make room for, -1 = none */
} sched_running_req;

typedef struct sched_pass {
  const sched_pool *pools;
  int n_pools;
  sched_running_req *running;
  int n_running;
  sched_job_req *queue; /* highest priority first, oldest first within one */
  int n_queue;
  const int64_t *tenant_starts; /* recent starts per tenant index: fair share */
  int n_tenants;
  int64_t now_ms;
  int preempt; /* may stop lower-priority running jobs for a blocked one */
  /* out */
  int n_started, n_preempted;
  int free_devices[SCHED_MAX_POOLS]; /* per pool, after the pass's starts */
} sched_pass;

/* Holds a pass's scratch (orders, reservations) between passes. */
typedef struct sched_planner sched_planner;
sched_planner *sched_planner_new(void);
void sched_planner_free(sched_planner *pl); /* NULL is a no-op */
/* One pass. Order: priority, then fair share within a priority (the tenant
 * with the fewest recent starts goes first, counting the jobs this order
 * puts before), then age. In that order a job starts when its pool has all
 * the devices it asks for. The first job that does not fit holds the pool's
 * reservation (EASY backfill): from the running jobs' max_runtime it gets
 * the time by which enough devices are free (start_by_ms), and a later job
 * starts ahead of it only if it ends by then or uses only devices the
 * reserved job leaves spare at that time; when a running job it waits on
 * has no max_runtime the time is unknown and nothing passes it. With
 * preempt, the reserved job of higher priority than some running ones
 * stops the fewest lowest-priority of them that make it fit. 0, or -1 when
 * scratch memory cannot grow. */
int sched_plan(sched_planner *pl, sched_pass *p);

/* Picks the hosts of an agents pool for a job of `devices`: the one host
 * whose free devices it fills best, else with spread (a gang) the hosts
 * with the most free devices first until it has all of them. take[h] gets
 * how many of host h's it uses. Returns how many hosts, 0 when it does not
 * fit (take all 0). */
int sched_hosts_pick(int n_hosts, const int *host_free, int devices, int spread, int *take);

/* ---- pools (pools.c) ---- */

typedef struct sched_inventory {
  int cpus;                       /* CPU cores this process may run on */
  int cpu_ids[SCHED_MAX_DEVICES]; /* the kernel's number of the i-th of them (what pins use) */
  int gpus;                       /* CUDA devices (0 without KILN_CUDA) */
  char gpu_names[8][64];
} sched_inventory;
/* Counts this machine's devices: each CPU core in the process's affinity
 * mask is one slot; GPUs through the CUDA runtime in a KILN_CUDA build. */
void sched_inventory_detect(sched_inventory *inv);
/* Without a config file: "default" with every CPU core, and "gpu" with
 * every GPU when there are any. */
int sched_pools_default(const sched_inventory *inv, sched_pool *pools, int max_pools);
/* Parses a pools file: {"pools": [{"name": "train", "device_type": "cpu",
 * "devices": [0, 1]}, ...]}. Names are 1..31 of [A-Za-z0-9_-.], unique;
 * device_type "cpu" or "gpu"; devices the machine's indices of that type
 * (or a count, "devices": 2, for the first free ones), each in one pool at
 * most. "kind" is "local" (the default: those fields), "agents" (no
 * devices: its hosts' come and go; grace_s 1..3600 default 25,
 * start_timeout_s 1..3600 default 60, "network": {oob_tcp_if_include,
 * btl_tcp_if_include, nccl_socket_ifname}, shared_data: an absolute path or
 * null) or "slurm" (partition, nodes >= 1, cpus_per_node >= 1, kilnd_url
 * http(s)://..., all required). The number of pools, or -1 with a sentence
 * naming the pool and the field in err. */
int sched_pools_parse(const char *text, const sched_inventory *inv, sched_pool *pools,
                      int max_pools, char *err, size_t errlen);
int sched_pools_load(const char *path, const sched_inventory *inv, sched_pool *pools, int max_pools,
                     char *err, size_t errlen);

#endif
