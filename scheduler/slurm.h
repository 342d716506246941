/* slurm.h — a Slurm partition as a pool: one attempt of a kiln job is one
 * batch job (sbatch --parsable --no-requeue) whose script runs kiln-agent
 * job around kiln-train (under mpirun for several processes); it is
 * followed with squeue while the controller knows it, then sacct (sacct -c,
 * the job completion log, where the cluster keeps no accounting database),
 * cancelled with scancel, and Slurm's states are mapped to kiln's. The
 * commands run without a shell, each with a timeout; they find the cluster
 * as any Slurm client does (SLURM_CONF, else the system's slurm.conf).
 * Prefix sched_slurm_. */
#ifndef KILN_SCHEDULER_SLURM_H
#define KILN_SCHEDULER_SLURM_H

#include <stddef.h>

/* ---- Slurm's job states and what each means for kiln (slurm_parse.c) ---- */

/* What a Slurm job state means for the kiln attempt it carries. */
typedef enum sched_slurm_outcome {
  SCHED_SLURM_UNKNOWN = 0, /* a state this table does not know, or no state */
  SCHED_SLURM_WAITING,     /* not running yet: the attempt stays STARTING */
  SCHED_SLURM_ACTIVE,      /* holds its nodes: the attempt is RUNNING */
  SCHED_SLURM_SUCCEEDED,   /* ended with status 0 */
  SCHED_SLURM_FAILED,      /* ended by a failure of the job's own (bounded by max_restarts) */
  SCHED_SLURM_CANCELLED,   /* scancel (kiln's, or someone's on the cluster) */
  SCHED_SLURM_REQUEUE,     /* ended by the cluster (a node, preemption): an infrastructure
                              restart, back to the queue from the newest checkpoint */
} sched_slurm_outcome;

typedef struct sched_slurm_state_info {
  const char *name; /* Slurm's: "PENDING", "NODE_FAIL", ... */
  sched_slurm_outcome outcome;
  const char *kiln_state; /* the kiln job state it leads to: STARTING, RUNNING, SUCCEEDED,
                             FAILED, CANCELLED, or QUEUED (requeued) */
  const char *reason;     /* the kiln reason code of that transition */
  const char *says;       /* a sentence for the job's event */
} sched_slurm_state_info;

/* The row of Slurm's state name (as squeue %T or sacct State print it; a
 * sacct "CANCELLED by 0" is CANCELLED); NULL for a name Slurm does not
 * have. */
const sched_slurm_state_info *sched_slurm_state_lookup(const char *name);

/* One job as squeue or sacct reported it. */
typedef struct sched_slurm_status {
  char job_id[32];
  char state[32];  /* Slurm's state name; "" when no command knows the job */
  char reason[64]; /* squeue's %r (why it pends: Resources, Priority, ...); "" from sacct */
  int exit_code;   /* sacct's ExitCode "N:S": the batch script's status N... */
  int signal;      /* ...and the signal S that ended it (0: none) */
  const sched_slurm_state_info *info; /* NULL for an unknown state */
  const char *source; /* which command said so: "squeue", "sacct", "sacct -c"; NULL: none */
} sched_slurm_status;

/* The job id sbatch --parsable printed ("1234" or "1234;cluster"), into
 * id. 0, or -1 with a sentence in err when the output holds no job id. */
int sched_slurm_parse_sbatch(const char *out, char *id, size_t id_len, char *err, size_t errlen);
/* squeue -h -j ID -o "%i|%T|%r": 1 and *st filled when job_id's line is
 * there, 0 when the controller no longer lists it, -1 (err says why) for
 * output that is not that format. */
int sched_slurm_parse_squeue(const char *out, const char *job_id, sched_slurm_status *st, char *err,
                             size_t errlen);
/* sacct -n -P -X -j ID -o JobID,State,ExitCode (or sacct -c): the same,
 * from the job's own line (its steps, "ID.batch", are skipped). */
int sched_slurm_parse_sacct(const char *out, const char *job_id, sched_slurm_status *st, char *err,
                            size_t errlen);

/* ---- running the commands (slurm.c) ---- */

/* Runs argv (argv[0] looked up on PATH) without a shell, stdin from
 * /dev/null, for at most timeout_ms (then SIGKILL). Its standard output
 * goes to out and its standard error to errout (each cut to its size - 1
 * and NUL-terminated; either may be NULL). Returns its exit status, or -1
 * with a sentence in errout when it could not start, was killed, or ran
 * past the timeout. */
int sched_slurm_command(char *const argv[], int timeout_ms, char *out, size_t out_len, char *errout,
                        size_t err_len);

/* Where and how large one attempt's batch job is. */
typedef struct sched_slurm_submit_req {
  const char *partition;   /* sbatch --partition */
  int nodes;               /* --nodes */
  int ntasks;              /* --ntasks: the job's processes (1, or its mpirun -np) */
  int cpus_per_task;       /* --cpus-per-task */
  int gpus;                /* --gpus (the job's, over all its nodes): a GPU pool's; 0 = none */
  const char *job_name;    /* --job-name: the kiln job id */
  const char *work_dir;    /* --chdir; the script is written there */
  const char *output;      /* --output, appended to; NULL = work_dir/slurm-<id>.out */
  const char *script_name; /* the batch script's file name in work_dir */
  const char *script;      /* its text (see sched_slurm_script) */
  int timeout_ms;          /* for sbatch */
} sched_slurm_submit_req;

/* sbatch's command line for req (its words in out's buffers, out->argv
 * NULL-terminated). 0, or -1 when a path does not fit. */
typedef struct sched_slurm_sbatch {
  char *argv[16];
  char partition[96], nodes[32], ntasks[32], cpus[32], gpus[32], name[96];
  char chdir[4200], output[4200], script[4300];
} sched_slurm_sbatch;
int sched_slurm_sbatch_argv(const sched_slurm_submit_req *req, sched_slurm_sbatch *out);
/* Writes the script and submits it with sbatch --parsable --no-requeue:
 * the Slurm job id in id. 0, or -1 with sbatch's own words in err. */
int sched_slurm_submit(const sched_slurm_submit_req *req, char *id, size_t id_len, char *err,
                       size_t errlen);

/* Where a job is now: squeue while the controller lists it, else sacct
 * with accounting, else sacct -c on the completion log. 1 with *st filled,
 * 0 when none of them knows the job (st->state ""), -1 with err when the
 * commands fail (no controller, a timeout). */
int sched_slurm_poll(const char *job_id, int timeout_ms, sched_slurm_status *st, char *err,
                     size_t errlen);

/* scancel ID: Slurm sends every process of the job SIGTERM (kiln-train
 * checkpoints and stops), then SIGKILL after the cluster's KillWait. 0;
 * 1 when Slurm no longer knows the job (it ended: nothing to cancel); -1
 * with scancel's words in err. */
int sched_slurm_cancel(const char *job_id, int timeout_ms, char *err, size_t errlen);

/* What the batch script runs. */
typedef struct sched_slurm_script_req {
  const char *agent_path;    /* kiln-agent */
  const char *server_url;    /* the pool's kilnd_url */
  const char *alloc_id;      /* alloc-... */
  const char *token_file;    /* the allocation token, mode 0600 */
  const char *mpirun_path;   /* NULL = mpirun on PATH */
  int processes;             /* > 1: under mpirun -np processes, progress as --json on stdout */
  int allow_run_as_root;     /* mpirun --allow-run-as-root: the batch job runs as root */
  char *const *trainer_argv; /* kiln-train and its arguments (--progress-fd 3 for one process) */
} sched_slurm_script_req;

/* The batch script (#!/bin/sh, every word quoted for the shell) that execs
 * `kiln-agent job --server URL --alloc ID --token-file F -- [mpirun -np N]
 * kiln-train ...`. 0, or -1 when it does not fit in out. */
int sched_slurm_script(const sched_slurm_script_req *req, char *out, size_t len);

#endif
