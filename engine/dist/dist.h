/* dist.h — the engine's private face of data-parallel training: replicas
 * run in threads of one process, their gradients aggregated into the
 * trained model's flat buffer and all-reduced across processes over MPI.
 * Used by the training run (train*.c) only. */
#ifndef KILN_ENGINE_DIST_H
#define KILN_ENGINE_DIST_H

#include "engine.h"

#define KN_DIST_MAX_LOCAL 64 /* replicas in one process */

typedef struct kn_dist kn_dist;

/* Starts the replica threads for primary (the trained model, replica 0)
 * and cfg's other replicas, checks they match it, tells each its first
 * row in the global batch (dropout masks are drawn by global row), and
 * gives every replica (on every process) the primary's parameters and
 * state as rank 0 holds them. */
int kn_dist_new(kn_model *primary, int batch, const kn_distribution *cfg, kn_dist **out, char *err,
                size_t errlen);
void kn_dist_free(kn_dist *d); /* NULL is a no-op */

int kn_dist_local(const kn_dist *d); /* replicas in this process */
int kn_dist_total(const kn_dist *d); /* replicas over all processes */
int kn_dist_rank(const kn_dist *d);
kn_model *kn_dist_model(kn_dist *d, int i); /* local replica i; 0 is the primary */

/* The rows local replica i takes of this process's part of a global
 * batch (the part holds `rows` rows; each process reads only its own):
 * [*start, *start + *count), count 0 when the part is too short to reach
 * it. */
void kn_dist_slice(const kn_dist *d, int i, int rows, int *start, int *count);

/* Runs local replica i on rows[i] rows (0: its graph does not run, but
 * it takes part, with nothing, in synchronized batch norm's sums) in
 * mode, all at once; their inputs must be fed. */
int kn_dist_run(kn_dist *d, kn_run_mode mode, const int *rows, char *err, size_t errlen);

/* After a training run with rows[i] per local replica: the aggregated
 * gradient in the primary's flat buffer, the same bits on every process.
 * sums[KN_DIST_SUMS] are this process's (rows, loss x rows, stop flag) on
 * entry and every process's total on return. */
#define KN_DIST_SUMS 3
int kn_dist_reduce(kn_dist *d, const int *rows, double *sums, char *err, size_t errlen);

/* After an optimizer step (or a checkpoint load) on the primary: every
 * local replica gets its parameters, state and dropout stream, and the
 * state (batch norm's moving statistics) follows rank 0's, as DDP's
 * buffers do. */
int kn_dist_sync(kn_dist *d, char *err, size_t errlen);

/* Bucket b of the gradient all-reduce: floats [*start, *start + *len) of
 * the flat gradient buffer, and the last node of a training run that
 * reads or writes them (-1: none), after which its all-reduce may start.
 * Buckets are numbered in the order every process starts them. Returns
 * the number of buckets (b out of range: only that). */
int kn_dist_bucket(const kn_dist *d, int b, size_t *start, size_t *len, int *ready_node);

/* Seconds spent making the replicas' gradients one so far: in
 * kn_dist_reduce, and overlapping, in starting and testing all-reduces
 * during backward. */
double kn_dist_comm_seconds(const kn_dist *d);

/* Sums n doubles over every process, in place (metric tallies). */
int kn_dist_sum(kn_dist *d, double *values, int n, char *err, size_t errlen);

#endif
