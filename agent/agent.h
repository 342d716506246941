/* agent.h — private to kiln-agent, the worker-host side of kilnd's agent
 * pools: its configuration, the allocations it runs (one table, one lock),
 * an allocation's run (data set, resume, trainer, progress, checkpoints,
 * exit), the mpirun relay, and what it reports about its host. Prefix ag_. */
#ifndef KILN_AGENT_H
#define KILN_AGENT_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* cpu_set_t */
#endif
#include <jansson.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cli.h"

#define AG_PATH       1400 /* a path under the work dir (at most 700 bytes) */
#define AG_MAX_CORES  256
#define AG_MAX_HOSTS  64
#define AG_MAX_ENV    64
#define AG_MAX_RELAYS 16
/* How long a relayed daemon waits for its host's start to be prepared. */
#define AG_PREPARE_WAIT_MS (10 * 60 * 1000)
/* Progress lines go out at least this often while a trainer writes them. */
#define AG_BATCH_MS 200

enum { AG_LOG_DEBUG, AG_LOG_INFO, AG_LOG_WARN, AG_LOG_ERROR };
/* One line "level=info msg=... key=value" on stderr. */
void ag_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

typedef struct ag_config {
  const char *server;
  const char *cacert; /* NULL: the system's CA store */
  char token[512];    /* the agent token (or, for `job`, the allocation token) */
  const char *name;   /* unique in kilnd; defaults to the host name */
  const char *pool;
  const char *address;  /* where the other hosts reach this one (mpirun's traffic) */
  const char *work_dir; /* data-set cache, job folders, logs */
  const char *trainer;  /* kiln-train */
  const char *mpirun;
  char self[4096]; /* this program, for mpirun's plm_rsh_agent */
  char token_file[4096];
  int cpus;        /* 0: as many as sched_getaffinity allows */
  int poll_wait_s; /* the long poll's wait */
} ag_config;

/* Reads the first line of path (a token) into out; -1 with err filled. */
int ag_read_token(const char *path, char *out, size_t len, char *err, size_t errlen);
/* A client of cfg->server with token and --cacert set; NULL with err. */
cli_client *ag_client(const ag_config *cfg, const char *token, char *err, size_t errlen);
/* The JSON body of a 2xx answer, or NULL with err naming the status and kilnd's message. */
json_t *ag_json_answer(const cli_response *resp, const char *what, char *err, size_t errlen);
/* Writes data to path through a temporary file and a rename. */
int ag_write_file(const char *path, const char *data, size_t len);
int ag_mkdir_p(const char *path);
int64_t ag_now_ms(void);

/* ---- the host ---- */

/* The cores this process may run on (sched_getaffinity), ascending. */
int ag_host_cores(int *cores, int max);
/* kilnd numbers an agent's cores 0..cpus-1, as it numbers its own slots:
 * index i is the i-th of ag_host_cores. The set of those cores; how many of
 * the indices named one (the others are past what this host has). */
int ag_host_core_set(const int *indices, int n, cpu_set_t *set);
/* [{"index":0,"name":"..."}] through the CUDA module, as kiln-train sees
 * the GPUs; [] without one. */
json_t *ag_host_gpus(void);

/* ---- one allocation's run ---- */

typedef struct ag_mpi_host {
  char name[128], address[128];
  int slots;
} ag_mpi_host;

typedef struct ag_start {
  char alloc[96], token[512], job[96];
  int attempt;
  char *spec_json; /* NULL in job mode */
  int has_dataset;
  char dataset_name[256], dataset_sha256[65];
  int resume;
  int cores[AG_MAX_CORES], n_cores;
  int gpus[AG_MAX_CORES], n_gpus;
  int processes; /* the spec's kiln-train processes under mpirun (0: one, no mpirun) */
  int np;        /* > 0: mpirun over hosts */
  ag_mpi_host hosts[AG_MAX_HOSTS];
  int n_hosts;
  char oob_if[128], btl_if[128], nccl_if[64];
  char *env[AG_MAX_ENV]; /* "KEY=value", owned */
  int n_env;
  char **command;          /* job mode: the command to run instead of kiln-train (not owned) */
  const char *shared_data; /* a path every host mounts (env KILN_SHARED_DATA): no download */
} ag_start;

/* Fills st from a start command's JSON; -1 with err naming the field. */
int ag_start_parse(const json_t *cmd, ag_start *st, char *err, size_t errlen);
void ag_start_clear(ag_start *st);

/* 1 when this host runs the allocation's process: always without mpi, and
 * with mpi on the first host (rank 0's), which runs mpirun; the others only
 * prepare the folder, data set and resume checkpoint its ranks read there. */
int ag_start_launches(const ag_config *cfg, const ag_start *st);
/* Runs the allocation to its end: prepares its folder, data set and resume
 * checkpoint, spawns the trainer (or st->command) in its own process group
 * pinned to st->cores, streams its progress and checkpoints and posts its
 * exit (unless dropped). Returns the wait status, or -1 when it could not
 * start (the failure already posted as an exit with a message). */
int ag_run(const ag_config *cfg, ag_start *st);

/* ---- the table of allocations this agent runs ---- */

/* Registers alloc as starting; 0 when new, 1 when this agent already runs
 * or ran it (a start delivered twice). */
int ag_table_claim(const char *alloc);
/* The group of an allocation's trainer (0: none yet / ended). */
void ag_table_set_group(const char *alloc, pid_t pgid);
/* A relay daemon's group; creates the entry for a host that runs only
 * relays of the allocation. -1 when it was dropped. */
int ag_table_add_relay(const char *alloc, pid_t pgid);
void ag_table_remove_relay(const char *alloc, pid_t pgid);
/* The cores of an allocation on this host: relay daemons run pinned to them. */
void ag_table_set_cores(const char *alloc, const int *cores, int n);
int ag_table_cores(const char *alloc, int *cores, int max);
/* Waits until a start of alloc on this host has its folder, data set and
 * resume checkpoint in place (a relay's ranks read them); 0 at once when no
 * start claimed it; -1 when it ended, was dropped or timeout_ms passed first. */
int ag_table_wait_ready(const char *alloc, int timeout_ms);
/* Marks the run ended (start is still refused as a duplicate). */
void ag_table_finish(const char *alloc);
/* 1 once a drop came for it: its run posts no exit. */
int ag_table_dropped(const char *alloc);
/* Sends sig to every group of alloc; drop also marks it dropped. -1 when unknown. */
int ag_table_signal(const char *alloc, int sig, int drop);
/* Sends sig to every group of every allocation. */
void ag_table_signal_all(int sig);
/* How many allocations are still running (for a clean stop). */
int ag_table_running(void);
/* The running allocations as a JSON array of ids (registration's "running"). */
json_t *ag_table_running_json(void);

/* ---- the mpirun relay ---- */

/* 1 when argv[0]'s basename is Open MPI's daemon (orted, prted). */
int ag_relay_allowed(const char *argv0);
/* Splits the remote shell command Open MPI hands its ssh (words joined by
 * spaces, values in double quotes) into argv; a malloc'd NULL-terminated
 * array of malloc'd words, NULL on unbalanced quotes. */
char **ag_shell_split(const char *line);
void ag_argv_free(char **argv);
/* Drops the "NAME=value ;" and "export NAME ;" words an mpirun started by
 * its full path puts before its daemon's command, in place. */
void ag_strip_env_prefix(char **words);
/* Runs an exec command's daemon for alloc in its own process group (pinned
 * to the allocation's cores here, if a start said them), waits for it;
 * its exit code (128 + signal when killed). -1 with err when refused. */
int ag_relay_exec(const ag_config *cfg, const char *alloc, char *const *argv, int *exit_code,
                  char *err, size_t errlen);
/* `kiln-agent rsh ...` and `kiln-agent job ...`: their own mains. */
int ag_rsh_main(int argc, char **argv);
int ag_job_main(int argc, char **argv, const char *self);

#endif
