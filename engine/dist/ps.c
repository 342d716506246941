/* ps.c — the parameter_server strategy over MPI point-to-point messages.
 * The flat parameter buffer is cut into P contiguous shards of equal size
 * (every update rule of optim.c is elementwise, so a shard needs no
 * parameter boundaries); server s holds shard s's f32 parameters and its
 * own optimizer over them. Workers push their share of each step's
 * gradient to every server and pull the shards back:
 *   sync:  a server waits for every worker's push of the step, sums them
 *          in worker order (so a rerun gives the same bits), updates once
 *          and answers them all with the new shard;
 *   async: a server applies each push as it comes, as one worker's step,
 *          and answers that worker with the shard as it then stands,
 *          unless the worker is more than max_staleness steps ahead of
 *          the slowest worker still training: that answer waits until the
 *          slowest catches up.
 * Every wait is bounded (the strategy's timeout), so a process that died
 * or hangs ends the job instead of holding it. One thread per process
 * calls MPI. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/ps.h"

int kn_ps_is_server(const kn_distribution *cfg) {
  const int workers = cfg->world_size > 1 ? cfg->world_size : 1;
  return cfg->ps_servers > 0 && cfg->rank >= workers;
}

/* One message (a header and three shards) must fit MPI's int count of bytes. */
#define MAX_SHARD_FLOATS (((size_t)INT_MAX - 64) / (3 * sizeof(float)))

int kn_ps_check(const kn_train_config *cfg, size_t n_params, char *err, size_t errlen) {
  const kn_distribution *d = &cfg->dist;
  const int workers = d->world_size > 1 ? d->world_size : 1;
  if (d->ps_servers < 1 || d->rank < 0 || d->rank >= workers + d->ps_servers) {
    snprintf(err, errlen, "parameter server: rank %d of %d workers and %d servers: out of range",
             d->rank, workers, d->ps_servers);
    return KN_EINVAL;
  }
  if (!d->ps_async && cfg->clip_global_norm > 0) {
    snprintf(err, errlen,
             "parameter server: global_clipnorm needs the whole gradient, which in sync mode no "
             "process holds (each server sums its shard); use async or multi_worker");
    return KN_EINVAL;
  }
  if (d->n_replicas > 1) {
    snprintf(err, errlen, "parameter server: one replica per worker, got %d", d->n_replicas);
    return KN_EINVAL;
  }
  if (n_params / (size_t)d->ps_servers + 1 > MAX_SHARD_FLOATS) {
    snprintf(err, errlen,
             "parameter server: %zu parameters over %d servers make shards of more than %zu "
             "floats, too many for one message; use more servers",
             n_params, d->ps_servers, MAX_SHARD_FLOATS);
    return KN_EINVAL;
  }
  return KN_OK;
}

#ifdef KILN_HAVE_MPI

#define START_TIMEOUT_S  600.0 /* the first message: every process has loaded its data */
#define TAG_TO_SERVER    7301
#define TAG_TO_WORKER    7302
#define TAG_WORKERS_COMM 7303

enum { MSG_INIT = 1, MSG_PULL, MSG_PUSH, MSG_GATHER, MSG_DONE };

/* Every message is this header, then up to three shards of floats. */
typedef struct ps_header {
  int64_t step; /* PULL, PUSH: the worker's step; INIT, GATHER's answer: optimizer iterations */
  int64_t stop_after; /* to a worker (async): every worker stops after this step; -1: no stop */
  float lr;           /* PUSH: the step's learning rate */
  int32_t kind;       /* MSG_* (to a server) */
  int32_t stop;       /* PUSH: this worker was asked to stop */
  int32_t floats;     /* shards of floats that follow */
  int32_t examples;   /* PUSH: the step saw examples */
} ps_header;

#define HEADER_BYTES sizeof(ps_header)

static double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void kn_mpi_where(char *buf, size_t len) {
  int rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  snprintf(buf, len, "rank %d of %d", rank, size);
}

int kn_mpi_failed(int code, const char *who, const char *what, char *err, size_t errlen) {
  char text[MPI_MAX_ERROR_STRING], where[48];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
    snprintf(text, sizeof text, "MPI error code %d", code);
  kn_mpi_where(where, sizeof where);
  snprintf(err, errlen, "%s: %s: %s failed: %s", who, where, what, text);
  return KN_EIO;
}

int kn_mpi_errors_return(MPI_Comm comm, const char *who, char *err, size_t errlen) {
  const int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return rc == MPI_SUCCESS ? KN_OK
                           : kn_mpi_failed(rc, who, "setting MPI_ERRORS_RETURN", err, errlen);
}

static int mpi_failed(int code, const char *what, char *err, size_t errlen) {
  return kn_mpi_failed(code, "parameter server", what, err, errlen);
}

/* Waits for all n requests, or with any for one of them (its index in
 * *index; MPI_UNDEFINED when none is active), up to limit_s seconds. A
 * long wait polls less often, so an idle server leaves its core to the
 * workers. */
static int wait_requests(MPI_Request *reqs, int n, int any, int *index, double limit_s,
                         const char *what, char *err, size_t errlen) {
  const double deadline = seconds_now() + limit_s;
  for (long polls = 0;; polls++) {
    int done = 0;
    const int rc = any ? MPI_Testany(n, reqs, index, &done, MPI_STATUS_IGNORE)
                       : MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_failed(rc, what, err, errlen);
    if (done) return KN_OK;
    if (seconds_now() > deadline) {
      char where[48];
      kn_mpi_where(where, sizeof where);
      snprintf(err, errlen,
               "parameter server: %s: %s waited more than %g s for the other processes; one of "
               "them died or hangs",
               where, what, limit_s);
      return KN_EIO;
    }
    if (polls > 2000) nanosleep(&(struct timespec){0, 50000}, NULL);
  }
}

/* Shard s of P over n floats: [*lo, *lo + *len). */
static void shard_of(size_t n, int s, int n_servers, size_t *lo, size_t *len) {
  *lo = n * (size_t)s / (size_t)n_servers;
  *len = n * (size_t)(s + 1) / (size_t)n_servers - *lo;
}

static float *payload(unsigned char *message) {
  return (float *)(message + HEADER_BYTES);
}

/* Writes h and the shards [lo, lo + len) of src[0..n_src) into message;
 * returns its size in bytes. */
static int pack(unsigned char *message, ps_header h, float *const *src, int n_src, size_t lo,
                size_t len) {
  h.floats = n_src;
  memcpy(message, &h, sizeof h);
  for (int k = 0; k < n_src; k++)
    memcpy(payload(message) + k * len, src[k] + lo, len * sizeof(float));
  return (int)(HEADER_BYTES + (size_t)n_src * len * sizeof(float));
}

/* ---------------------------------------------------------------- server -- */

/* Thread: the process's one. Requests of worker w: recv[w] (its next
 * message into in[w]) and send[w] (the answer in out[w]). */
typedef struct server {
  const kn_train_config *cfg;
  int n_workers, async, max_staleness;
  size_t lo, len, cap;
  float *params, *sum; /* (len) the shard; sync: the step's summed gradient */
  kn_optimizer *opt;
  unsigned char **in, **out; /* (n_workers) message buffers of cap bytes */
  MPI_Request *recv, *send;  /* (n_workers) */
  int64_t *steps;            /* (n_workers) each worker's last pushed step */
  int *done, *pushed, *held; /* (n_workers) flags */
  int n_done, n_pushed;
  int64_t stop_after;
  float lr; /* sync: the step's learning rate, as the pushes carry it */
  double timeout_s;
} server;

static int post_receive(server *sv, int w, char *err, size_t errlen) {
  const int rc =
      MPI_Irecv(sv->in[w], (int)sv->cap, MPI_BYTE, w, TAG_TO_SERVER, MPI_COMM_WORLD, &sv->recv[w]);
  return rc == MPI_SUCCESS ? KN_OK : mpi_failed(rc, "receiving from a worker", err, errlen);
}

/* Sends worker w the shard (and with the optimizer state, for a gather). */
/* The arrays a server and its workers exchange, in this order: the
 * parameters, then (with_state) the optimizer moments it keeps, m and v.
 * Returns how many; *iterations is the optimizer's step counter. */
static int state_arrays(kn_optimizer *opt, float *params, int with_state, float *arrays[3],
                        int64_t **iterations) {
  kn_optimizer_type type;
  size_t n;
  float *m, *v;
  kn_optimizer_moments(opt, &type, &n, &m, &v, iterations);
  int count = 0;
  arrays[count++] = params;
  if (with_state && m) arrays[count++] = m;
  if (with_state && v) arrays[count++] = v;
  return count;
}

static int answer(server *sv, int w, int with_state, char *err, size_t errlen) {
  int rc = wait_requests(&sv->send[w], 1, 0, NULL, sv->timeout_s, "a worker taking its answer", err,
                         errlen);
  if (rc) return rc;
  float *src[3];
  int64_t *iterations;
  const int n_src = state_arrays(sv->opt, sv->params, with_state, src, &iterations);
  ps_header h = {.step = *iterations, .stop_after = sv->stop_after};
  /* The shard arrays start at 0: pack takes [0, len). */
  const int bytes = pack(sv->out[w], h, src, n_src, 0, sv->len);
  rc = MPI_Isend(sv->out[w], bytes, MPI_BYTE, w, TAG_TO_WORKER, MPI_COMM_WORLD, &sv->send[w]);
  return rc == MPI_SUCCESS ? KN_OK : mpi_failed(rc, "answering a worker", err, errlen);
}

static void apply(server *sv, const float *grads, float lr) {
  kn_optimizer_set_learning_rate(sv->opt, lr);
  kn_optimizer_step(sv->opt, sv->params, grads);
}

/* async: answers every held worker no longer too far ahead of the
 * slowest one still training. */
static int release_held(server *sv, char *err, size_t errlen) {
  int64_t slowest = INT64_MAX;
  for (int w = 0; w < sv->n_workers; w++)
    if (!sv->done[w] && sv->steps[w] < slowest) slowest = sv->steps[w];
  for (int w = 0; w < sv->n_workers; w++) {
    if (!sv->held[w]) continue;
    if (sv->max_staleness >= 0 && sv->steps[w] - slowest > sv->max_staleness) continue;
    sv->held[w] = 0;
    int rc = answer(sv, w, 0, err, errlen);
    if (rc) return rc;
  }
  return KN_OK;
}

/* sync: once every worker still training has pushed, one update from
 * their sum (in worker order), and every one of them answered. */
static int finish_sync_step(server *sv, char *err, size_t errlen) {
  if (sv->n_pushed == 0 || sv->n_pushed < sv->n_workers - sv->n_done) return KN_OK;
  int first = 1;
  for (int w = 0; w < sv->n_workers; w++) {
    if (!sv->pushed[w]) continue;
    const float *g = payload(sv->in[w]);
    if (first)
      memcpy(sv->sum, g, sv->len * sizeof(float));
    else
      for (size_t i = 0; i < sv->len; i++) sv->sum[i] += g[i];
    first = 0;
  }
  apply(sv, sv->sum, sv->lr);
  for (int w = 0; w < sv->n_workers; w++) {
    if (!sv->pushed[w]) continue;
    sv->pushed[w] = 0;
    int rc = answer(sv, w, 0, err, errlen);
    if (!rc) rc = post_receive(sv, w, err, errlen);
    if (rc) return rc;
  }
  sv->n_pushed = 0;
  return KN_OK;
}

/* One message from worker w, in in[w]. */
static int handle(server *sv, int w, char *err, size_t errlen) {
  ps_header h;
  memcpy(&h, sv->in[w], sizeof h);
  int rc = KN_OK;
  switch (h.kind) {
  case MSG_PULL:
    sv->steps[w] = h.step;
    rc = answer(sv, w, 0, err, errlen);
    return rc ? rc : post_receive(sv, w, err, errlen);
  case MSG_GATHER:
    rc = answer(sv, w, 1, err, errlen);
    return rc ? rc : post_receive(sv, w, err, errlen);
  case MSG_DONE:
    sv->done[w] = 1;
    sv->held[w] = 0;
    sv->n_done++;
    return sv->async ? release_held(sv, err, errlen) : finish_sync_step(sv, err, errlen);
  case MSG_PUSH:
    if (h.floats != 1) break;
    sv->steps[w] = h.step;
    if (!sv->async) { /* its receive waits until the step is made: in[w] holds the push */
      sv->pushed[w] = 1;
      sv->n_pushed++;
      sv->lr = h.lr;
      return finish_sync_step(sv, err, errlen);
    }
    if (h.examples) apply(sv, payload(sv->in[w]), h.lr); /* an empty step is no update */
    if (h.stop && sv->stop_after < 0) { /* every worker can still reach the step after the last */
      int64_t last = h.step;
      for (int k = 0; k < sv->n_workers; k++)
        if (!sv->done[k] && sv->steps[k] > last) last = sv->steps[k];
      sv->stop_after = last + 1;
    }
    sv->held[w] = 1;
    rc = post_receive(sv, w, err, errlen);
    return rc ? rc : release_held(sv, err, errlen);
  default: break;
  }
  snprintf(err, errlen, "parameter server: worker %d sent a message of unknown kind %d", w,
           (int)h.kind);
  return KN_EFORMAT;
}

/* Worker 0's first message: the shard's parameters and optimizer state. */
static int take_initial_state(server *sv, char *err, size_t errlen) {
  const double limit = sv->timeout_s > START_TIMEOUT_S ? sv->timeout_s : START_TIMEOUT_S;
  int rc = post_receive(sv, 0, err, errlen);
  if (!rc) rc = wait_requests(&sv->recv[0], 1, 0, NULL, limit, "the first parameters", err, errlen);
  if (rc) return rc;
  ps_header h;
  memcpy(&h, sv->in[0], sizeof h);
  float *dst[3];
  int64_t *iterations;
  const int n_dst = state_arrays(sv->opt, sv->params, 1, dst, &iterations);
  if (h.kind != MSG_INIT || h.floats != n_dst) {
    snprintf(err, errlen,
             "parameter server: worker 0's first message is kind %d with %d shards, not the "
             "parameters and optimizer state",
             (int)h.kind, (int)h.floats);
    return KN_EFORMAT;
  }
  const float *at = payload(sv->in[0]);
  for (int a = 0; a < n_dst; a++) memcpy(dst[a], at + sv->len * a, sv->len * sizeof(float));
  *iterations = h.step;
  return KN_OK;
}

static void server_free(server *sv) {
  for (int w = 0; w < sv->n_workers; w++) {
    if (sv->recv && sv->send && sv->recv[w] != MPI_REQUEST_NULL) {
      MPI_Cancel(&sv->recv[w]);
      MPI_Request_free(&sv->recv[w]);
    }
    if (sv->in) free(sv->in[w]);
    if (sv->out) free(sv->out[w]);
  }
  free(sv->in);
  free(sv->out);
  free(sv->recv);
  free(sv->send);
  free(sv->steps);
  free(sv->done);
  free(sv->pushed);
  free(sv->held);
  free(sv->params);
  free(sv->sum);
  kn_optimizer_free(sv->opt);
}

int kn_ps_serve(const kn_train_config *cfg, size_t n_params, char *err, size_t errlen) {
  int rc = kn_ps_check(cfg, n_params, err, errlen);
  if (rc) return rc;
  rc = kn_mpi_errors_return(MPI_COMM_WORLD, "parameter server", err, errlen);
  if (rc) return rc;
  const kn_distribution *d = &cfg->dist;
  server sv = {.cfg = cfg, .async = d->ps_async, .max_staleness = d->ps_max_staleness};
  sv.n_workers = d->world_size > 1 ? d->world_size : 1;
  sv.timeout_s = d->timeout_s > 0 ? d->timeout_s : 300.0;
  sv.stop_after = -1;
  shard_of(n_params, d->rank - sv.n_workers, d->ps_servers, &sv.lo, &sv.len);
  sv.cap = HEADER_BYTES + 3 * sv.len * sizeof(float);
  const size_t nw = (size_t)sv.n_workers;
  rc = kn_optimizer_new(&cfg->optimizer, sv.len, &sv.opt, err, errlen);
  if (rc) return rc;
  sv.params = malloc((sv.len ? sv.len : 1) * sizeof(float));
  sv.sum = malloc((sv.len ? sv.len : 1) * sizeof(float));
  sv.in = calloc(nw, sizeof *sv.in);
  sv.out = calloc(nw, sizeof *sv.out);
  sv.recv = malloc(nw * sizeof *sv.recv);
  sv.send = malloc(nw * sizeof *sv.send);
  sv.steps = calloc(nw, sizeof *sv.steps);
  sv.done = calloc(nw, sizeof(int));
  sv.pushed = calloc(nw, sizeof(int));
  sv.held = calloc(nw, sizeof(int));
  int ok = sv.params && sv.sum && sv.in && sv.out && sv.recv && sv.send && sv.steps && sv.done &&
           sv.pushed && sv.held;
  for (int w = 0; ok && w < sv.n_workers; w++) sv.recv[w] = sv.send[w] = MPI_REQUEST_NULL;
  for (int w = 0; ok && w < sv.n_workers; w++)
    ok = (sv.in[w] = malloc(sv.cap)) && (sv.out[w] = malloc(sv.cap));
  if (!ok) {
    snprintf(err, errlen, "parameter server: out of memory for a shard of %zu parameters", sv.len);
    server_free(&sv);
    return KN_ENOMEM;
  }
  rc = take_initial_state(&sv, err, errlen);
  for (int w = 0; !rc && w < sv.n_workers; w++) rc = post_receive(&sv, w, err, errlen);
  while (!rc && sv.n_done < sv.n_workers) {
    int w = MPI_UNDEFINED;
    rc = wait_requests(sv.recv, sv.n_workers, 1, &w, sv.timeout_s, "waiting for the workers", err,
                       errlen);
    if (!rc && w == MPI_UNDEFINED) {
      snprintf(err, errlen, "parameter server: no worker left to hear from, %d of %d done",
               sv.n_done, sv.n_workers);
      rc = KN_ESTATE;
    }
    if (!rc) rc = handle(&sv, w, err, errlen);
  }
  if (!rc)
    rc = wait_requests(sv.send, sv.n_workers, 0, NULL, sv.timeout_s, "the last answers", err,
                       errlen);
  server_free(&sv);
  return rc;
}

/* ---------------------------------------------------------------- worker -- */

/* Requests: reqs[s] sends to server s, reqs[P + s] receives from it. */
struct kn_ps {
  int n_workers, n_servers, rank, async;
  size_t n_params, cap;
  double timeout_s;
  unsigned char **out, **in; /* (n_servers) message buffers of cap bytes */
  MPI_Request *reqs;         /* (2 n_servers) */
  int64_t stop_after;        /* async: server 0's word; -1 = no stop */
  int broken;                /* an exchange failed: the servers may not be there */
  double comm_seconds;       /* in kn_ps_step: pushing, and waiting for the answers */
};

/* Sends every server h with its shards of src[0..n_src), then (with
 * n_dst >= 0) takes its answer's shards into dst[0..n_dst). */
static int exchange(kn_ps *ps, ps_header h, float *const *src, int n_src, float *const *dst,
                    int n_dst, double limit_s, const char *what, char *err, size_t errlen) {
  const int n = ps->n_servers;
  for (int s = 0; s < n; s++) {
    size_t lo, len;
    shard_of(ps->n_params, s, n, &lo, &len);
    const int bytes = pack(ps->out[s], h, src, n_src, lo, len);
    int rc = MPI_Isend(ps->out[s], bytes, MPI_BYTE, ps->n_workers + s, TAG_TO_SERVER,
                       MPI_COMM_WORLD, &ps->reqs[s]);
    if (rc == MPI_SUCCESS)
      rc = n_dst < 0 ? (ps->reqs[n + s] = MPI_REQUEST_NULL, MPI_SUCCESS)
                     : MPI_Irecv(ps->in[s], (int)ps->cap, MPI_BYTE, ps->n_workers + s,
                                 TAG_TO_WORKER, MPI_COMM_WORLD, &ps->reqs[n + s]);
    if (rc != MPI_SUCCESS) {
      ps->broken = 1;
      return mpi_failed(rc, what, err, errlen);
    }
  }
  int rc = wait_requests(ps->reqs, 2 * n, 0, NULL, limit_s, what, err, errlen);
  ps->broken = rc != KN_OK;
  if (rc || n_dst < 0) return rc;
  for (int s = 0; s < n; s++) {
    size_t lo, len;
    shard_of(ps->n_params, s, n, &lo, &len);
    ps_header a;
    memcpy(&a, ps->in[s], sizeof a);
    if (a.floats < n_dst) {
      snprintf(err, errlen, "parameter server %d answered %s with %d shards, not %d", s, what,
               (int)a.floats, n_dst);
      return KN_EFORMAT;
    }
    for (int k = 0; k < n_dst; k++)
      if (dst[k]) memcpy(dst[k] + lo, payload(ps->in[s]) + k * len, len * sizeof(float));
    if (s == 0) ps->stop_after = a.stop_after;
  }
  return KN_OK;
}

int kn_ps_new(const kn_train_config *cfg, float *params, size_t n_params, kn_optimizer *opt,
              int64_t step, kn_ps **out, char *err, size_t errlen) {
  *out = NULL;
  int rc = kn_ps_check(cfg, n_params, err, errlen);
  if (!rc) rc = kn_mpi_errors_return(MPI_COMM_WORLD, "parameter server", err, errlen);
  if (rc) return rc;
  const kn_distribution *d = &cfg->dist;
  kn_ps *ps = calloc(1, sizeof *ps);
  if (!ps) goto nomem;
  ps->n_workers = d->world_size > 1 ? d->world_size : 1;
  ps->n_servers = d->ps_servers;
  ps->rank = d->rank;
  ps->async = d->ps_async;
  ps->n_params = n_params;
  ps->timeout_s = d->timeout_s > 0 ? d->timeout_s : 300.0;
  ps->stop_after = -1;
  ps->cap = HEADER_BYTES + 3 * (n_params / (size_t)ps->n_servers + 1) * sizeof(float);
  ps->out = calloc((size_t)ps->n_servers, sizeof *ps->out);
  ps->in = calloc((size_t)ps->n_servers, sizeof *ps->in);
  ps->reqs = malloc(2 * (size_t)ps->n_servers * sizeof *ps->reqs);
  if (!ps->out || !ps->in || !ps->reqs) goto nomem;
  for (int s = 0; s < ps->n_servers; s++) {
    ps->reqs[s] = ps->reqs[ps->n_servers + s] = MPI_REQUEST_NULL;
    if (!(ps->out[s] = malloc(ps->cap)) || !(ps->in[s] = malloc(ps->cap))) goto nomem;
  }
  const double limit = ps->timeout_s > START_TIMEOUT_S ? ps->timeout_s : START_TIMEOUT_S;
  if (ps->rank == 0) { /* the servers start from worker 0's parameters and optimizer state */
    float *src[3];
    int64_t *iterations;
    const int n_src = state_arrays(opt, params, 1, src, &iterations);
    rc = exchange(ps, (ps_header){.kind = MSG_INIT, .step = *iterations}, src, n_src, NULL, -1,
                  limit, "handing the servers the parameters", err, errlen);
  }
  if (!rc)
    rc = exchange(ps, (ps_header){.kind = MSG_PULL, .step = step}, NULL, 0, &params, 1, limit,
                  "pulling the first parameters", err, errlen);
  if (rc) {
    kn_ps_free(ps);
    return rc;
  }
  *out = ps;
  return KN_OK;
nomem:
  if (ps) ps->broken = 1; /* nothing was sent */
  kn_ps_free(ps);
  snprintf(err, errlen, "parameter server: out of memory for the messages of %zu parameters",
           n_params);
  return KN_ENOMEM;
}

int kn_ps_step(kn_ps *ps, float *params, const float *grads, float lr, int64_t step, int flags,
               int *stop, char *err, size_t errlen) {
  float *src = (float *)grads; /* only read */
  ps_header h = {.kind = MSG_PUSH,
                 .step = step,
                 .lr = lr,
                 .stop = (flags & KN_PS_STOP_REQUEST) != 0,
                 .examples = (flags & KN_PS_EXAMPLES) != 0};
  const double start = seconds_now();
  int rc = exchange(ps, h, &src, 1, &params, 1, ps->timeout_s, "the push and pull of a step", err,
                    errlen);
  ps->comm_seconds += seconds_now() - start;
  *stop = !rc && ps->async && ps->stop_after >= 0 && step >= ps->stop_after;
  return rc;
}

double kn_ps_comm_seconds(const kn_ps *ps) {
  return ps ? ps->comm_seconds : 0.0;
}

int kn_ps_gather(kn_ps *ps, float *params, kn_optimizer *opt, char *err, size_t errlen) {
  float *dst[3];
  int64_t *iterations;
  const int n_dst = state_arrays(opt, params, 1, dst, &iterations);
  int rc = exchange(ps, (ps_header){.kind = MSG_GATHER}, NULL, 0, dst, n_dst, ps->timeout_s,
                    "gathering the parameters for a checkpoint", err, errlen);
  if (rc) return rc;
  ps_header a; /* server 0's answer: its optimizer's iterations */
  memcpy(&a, ps->in[0], sizeof a);
  *iterations = a.step;
  return KN_OK;
}

void kn_ps_free(kn_ps *ps) {
  if (!ps) return;
  if (ps->reqs && !ps->broken) {
    char ignored[256];
    exchange(ps, (ps_header){.kind = MSG_DONE}, NULL, 0, NULL, -1, ps->timeout_s,
             "saying this worker is done", ignored, sizeof ignored);
  }
  for (int s = 0; s < ps->n_servers; s++) {
    if (ps->out) free(ps->out[s]);
    if (ps->in) free(ps->in[s]);
  }
  free(ps->out);
  free(ps->in);
  free(ps->reqs);
  free(ps);
}

int kn_ps_workers_comm(int world, MPI_Comm *out, char *err, size_t errlen) {
  MPI_Group all, workers;
  int range[1][3] = {{0, world - 1, 1}};
  int rc = MPI_Comm_group(MPI_COMM_WORLD, &all);
  if (rc != MPI_SUCCESS) return mpi_failed(rc, "finding the workers", err, errlen);
  rc = MPI_Group_range_incl(all, 1, range, &workers);
  if (rc == MPI_SUCCESS) {
    rc = MPI_Comm_create_group(MPI_COMM_WORLD, workers, TAG_WORKERS_COMM, out);
    MPI_Group_free(&workers);
  }
  MPI_Group_free(&all);
  if (rc != MPI_SUCCESS) return mpi_failed(rc, "making the workers' communicator", err, errlen);
  return kn_mpi_errors_return(*out, "parameter server", err, errlen);
}

#else /* no MPI: the servers are other processes, and this build cannot reach them */

struct kn_ps {
  int unused;
};

static int no_mpi(char *err, size_t errlen) {
  snprintf(err, errlen,
           "parameter server: the servers are MPI processes, and this build of kiln has no MPI "
           "(configure with KILN_MPI=ON)");
  return KN_EINVAL;
}

int kn_ps_serve(const kn_train_config *cfg, size_t n_params, char *err, size_t errlen) {
  (void)cfg;
  (void)n_params;
  return no_mpi(err, errlen);
}

int kn_ps_new(const kn_train_config *cfg, float *params, size_t n_params, kn_optimizer *opt,
              int64_t step, kn_ps **out, char *err, size_t errlen) {
  (void)cfg;
  (void)params;
  (void)n_params;
  (void)opt;
  (void)step;
  *out = NULL;
  return no_mpi(err, errlen);
}

int kn_ps_step(kn_ps *ps, float *params, const float *grads, float lr, int64_t step, int flags,
               int *stop, char *err, size_t errlen) {
  (void)ps;
  (void)params;
  (void)grads;
  (void)lr;
  (void)step;
  (void)flags;
  *stop = 0;
  return no_mpi(err, errlen);
}

double kn_ps_comm_seconds(const kn_ps *ps) {
  (void)ps;
  return 0.0;
}

int kn_ps_gather(kn_ps *ps, float *params, kn_optimizer *opt, char *err, size_t errlen) {
  (void)ps;
  (void)params;
  (void)opt;
  return no_mpi(err, errlen);
}

void kn_ps_free(kn_ps *ps) {
  free(ps);
}

#endif
