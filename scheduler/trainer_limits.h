/* trainer_limits.h — private to scheduler/: each trainer's memory limit and cores,
 * as a cgroup of its own (v2: memory.max, cpuset.cpus; v1's memory
 * controller: memory.limit_in_bytes) where kilnd can make one, else
 * RLIMIT_AS; applied by a /bin/sh prologue that joins the cgroup
 * or sets the limit and then execs the trainer, so the trainer never runs
 * a moment without it. */
#ifndef KILN_SCHEDULER_TRAINER_LIMITS_H
#define KILN_SCHEDULER_TRAINER_LIMITS_H

#include <stddef.h>
#include <stdint.h>

#define SCHED_PATH_MAX 1200

typedef enum sched_limit_kind {
  SCHED_LIMIT_NONE = 0,
  SCHED_LIMIT_CGROUP,
  SCHED_LIMIT_RLIMIT,
} sched_limit_kind;

typedef struct sched_limits {
  sched_limit_kind kind;
  int64_t memory_max;        /* bytes per trainer; 0 = none */
  char base[SCHED_PATH_MAX]; /* cgroup: the folder trainers get theirs under */
  int cpuset;                /* cgroup: the cpuset controller is enabled there too */
  int v1;                    /* cgroup: v1's memory controller (memory.limit_in_bytes) */
  int allow_rlimit;          /* RLIMIT_AS may apply (not in an auto-mode sanitizer build) */
  char why_not_cgroup[1024];
} sched_limits;

/* Sets l up for mode "auto" (a cgroup where the hierarchy is writable,
 * else RLIMIT_AS), "cgroup" (or fail) or "rlimit" (NULL = auto). 0, or -1
 * with a sentence in err (only "cgroup" fails). */
int sched_limits_init(sched_limits *l, const char *mode, int64_t memory_max, char *err,
                      size_t errlen);
void sched_limits_cleanup(sched_limits *l); /* removes the trainers' folder when empty */

/* One trainer's limit. */
typedef struct sched_trainer_limit {
  sched_limit_kind kind;
  int v1;                            /* a cgroup v1 memory controller's */
  char cgroup[SCHED_PATH_MAX + 96];  /* its cgroup, "" when none */
  char script[SCHED_PATH_MAX + 256]; /* the prologue /bin/sh runs before exec "$@" */
  char describe[2600];               /* what applies, for the job's STARTED event */
} sched_trainer_limit;

/* Prepares the limit of attempt `attempt` of job_id on cpus ("0,1"; "" =
 * no cpuset); gpu: no RLIMIT_AS (the CUDA driver maps far more address
 * space than memory). 0, or -1 with err (a cgroup could not be made: the
 * job should not run unlimited). */
int sched_trainer_limit_prepare(const sched_limits *l, const char *job_id, int attempt,
                                const char *cpus, int gpu, sched_trainer_limit *t, char *err,
                                size_t errlen);
/* 1 when the kernel's OOM killer killed a process of the trainer's cgroup. */
int sched_trainer_limit_oom_killed(const sched_trainer_limit *t);
/* Removes the trainer's cgroup (killing what is left in it). */
void sched_trainer_limit_release(sched_trainer_limit *t);

#endif
