/* ps.h — the engine's private face of the parameter_server strategy: the
 * protocol between the workers (ranks 0 .. W-1, each a data-parallel
 * trainer) and the servers (ranks W .. W+P-1, each holding a shard of the
 * parameters and its optimizer state) over MPI. Used by the training
 * run (train*.c) and dist.c only. */
#ifndef KILN_ENGINE_PS_H
#define KILN_ENGINE_PS_H

#include "engine.h"

#ifdef KILN_HAVE_MPI
#include <mpi.h>
#endif

typedef struct kn_ps kn_ps;

/* Whether this process is one of cfg's parameter servers. */
int kn_ps_is_server(const kn_distribution *cfg);

/* Checks the training options and the model's n_params against the
 * strategy (the same answer on every rank, so a refusal ends every
 * process alike). */
int kn_ps_check(const kn_train_config *cfg, size_t n_params, char *err, size_t errlen);

/* A server's whole life: takes its shard of the n_params parameters (and
 * the optimizer state of a resumed run) from worker 0, then applies the
 * workers' pushes and answers their pulls and worker 0's checkpoint
 * gathers until every worker is done. */
int kn_ps_serve(const kn_train_config *cfg, size_t n_params, char *err, size_t errlen);

/* A worker's link to the servers. Worker 0 hands them params and opt's
 * state (a fresh or a resumed run's), then every worker pulls the
 * parameters into params; step is the optimizer steps already done. */
int kn_ps_new(const kn_train_config *cfg, float *params, size_t n_params, kn_optimizer *opt,
              int64_t step, kn_ps **out, char *err, size_t errlen);

/* kn_ps_step's flags */
enum {
  KN_PS_EXAMPLES = 1,     /* the worker's step saw examples (async: one without is no update) */
  KN_PS_STOP_REQUEST = 2, /* this process was asked to stop */
};

/* One optimizer step (step: 1-based) at learning rate lr: pushes grads,
 * this worker's share of the step's gradient, and pulls the servers' new
 * parameters into params. *stop (async) becomes 1 once every worker has
 * agreed to stop after this step. */
int kn_ps_step(kn_ps *ps, float *params, const float *grads, float lr, int64_t step, int flags,
               int *stop, char *err, size_t errlen);

/* Seconds spent in kn_ps_step so far (0 for NULL). */
double kn_ps_comm_seconds(const kn_ps *ps);

/* Worker 0, for a checkpoint: the servers' parameters and optimizer state
 * into params and opt. */
int kn_ps_gather(kn_ps *ps, float *params, kn_optimizer *opt, char *err, size_t errlen);

/* Tells the servers this worker is done (a failure to is left to the
 * servers' timeout) and frees ps. NULL is a no-op. */
void kn_ps_free(kn_ps *ps);

#ifdef KILN_HAVE_MPI
/* The workers' own communicator, ranks 0 .. world-1 of MPI_COMM_WORLD,
 * made by the workers alone (the servers take no part in collectives),
 * with MPI_ERRORS_RETURN. */
int kn_ps_workers_comm(int world, MPI_Comm *out, char *err, size_t errlen);

/* This process as mpirun numbers it: "rank R of N" (of MPI_COMM_WORLD). */
void kn_mpi_where(char *buf, size_t len);
/* MPI's failure `code` in `what` as the engine's error: "<who>: rank R of
 * N: <what> failed: <MPI's reason>". Returns KN_EIO. */
int kn_mpi_failed(int code, const char *who, const char *what, char *err, size_t errlen);
/* MPI's failures on comm come back as codes to the calls' error paths (the
 * default, MPI_ERRORS_ARE_FATAL, ends every process of the job before kiln
 * can say which rank failed and why). */
int kn_mpi_errors_return(MPI_Comm comm, const char *who, char *err, size_t errlen);
#endif

#endif
