/* engine_dist.h — distribution strategies: how replicas, workers and
 * parameter servers share a job, and how their gradients are aggregated.
 * Part of engine.h. */
#ifndef KILN_ENGINE_PUBLIC_DIST_H
#define KILN_ENGINE_PUBLIC_DIST_H

#include "engine_model.h"

/* ------------------------------------------------------------- strategies -- */

/* How replicas' gradients become the one the optimizer applies. */
typedef enum kn_aggregation {
  KN_AGGREGATE_MEAN = 0,      /* the mean of the replicas' (batch-mean) gradients */
  KN_AGGREGATE_SUM,           /* their sum */
  KN_AGGREGATE_WEIGHTED_MEAN, /* weighted by the rows each replica saw: one big batch's */
} kn_aggregation;

/* Data-parallel training: every replica holds the whole model and takes
 * its slice of each global batch of batch_size x (local replicas x
 * processes) rows: global replica k = rank x n_replicas + i takes rows
 * k x batch_size .. (k + 1) x batch_size - 1, so R replicas at batch b see
 * exactly the examples one replica at batch R x b would. Each process's
 * input pipeline reads, maps and augments only its own part of every
 * global batch (kn_pipeline_config.part_index). Replicas in a process run
 * in threads; processes (kiln-train under mpirun) all-reduce the gradients
 * over MPI in buckets, last layers first; with one replica per process a
 * bucket's all-reduce starts as soon as backward has written its last
 * gradient, while the rest of backward runs. */
typedef struct kn_distribution {
  int n_replicas; /* replicas in this process; 0 or 1 = the trained model alone */
  /* replicas[0..n_replicas - 2]: models built and compiled like the
   * trained one (same layers and planned batch); their parameters are
   * overwritten with its own before the first step */
  kn_model *const *replicas;
  int world_size, rank; /* processes and this one's index; world_size 0 or 1 = one process */
  kn_aggregation aggregation;
  size_t bucket_bytes; /* all-reduce bucket cap; 0 = 1 MiB */
  /* If set, receives at the end the seconds spent making the replicas'
   * gradients one: summing in shared memory, and all-reducing across
   * processes (which includes waiting for the slowest). */
  double *comm_seconds;
  /* The longest a collective of a step waits for the other processes
   * before the run fails with KN_EIO (one died or hangs); 0 = 300 s. The
   * first, while processes load their data, waits at least 600 s. */
  double timeout_s;
  /* parameter_server: ps_servers more processes (ranks world_size ..
   * world_size + ps_servers - 1, after the world_size workers) hold the
   * parameters in shards with their optimizer state and apply the updates;
   * workers push their share of each step's gradient and pull the new
   * parameters. 0 = none: the workers all-reduce. A server's kn_train
   * serves until every worker is done. */
  int ps_servers;
  /* 0 (sync): a server updates once every worker has pushed the step, so
   * W workers at batch b train as one at batch W x b. 1 (async): each
   * push is applied as it comes, as one worker's step; a worker more than
   * ps_max_staleness steps ahead of the slowest waits (< 0: no bound). */
  int ps_async;
  int ps_max_staleness;
} kn_distribution;

/* Whether this build can all-reduce across processes (built with MPI). */
int kn_dist_have_mpi(void);

#endif
