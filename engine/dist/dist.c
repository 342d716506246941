/* dist.c — data-parallel replicas: each local replica's graph runs in its
 * own thread, gradients are summed into the primary's flat buffer in
 * shared memory (each thread one slice of it) and all-reduced across
 * processes over MPI in buckets, last layers first. With one replica per
 * process a bucket's MPI_Iallreduce starts from the graph's node-done hook
 * as soon as backward has run the last node touching it, and the hook's
 * MPI_Testall between nodes moves the collectives on (Open MPI progresses
 * them only inside MPI calls) while the rest of backward runs.
 * Threads: while a job is out (generation moved on, pending > 0) replica
 * thread i touches only replica i's graph (JOB_RUN) or slice i of the flat
 * buffers (JOB_REDUCE, JOB_SYNC); everything else belongs to the training
 * thread, which is replica 0's and sets the next job while the others
 * wait; it alone calls MPI (the hook runs in it: overlap needs replica 0
 * alone in its process). job_lock guards generation and pending.
 * GPU replicas (their graphs placed on CUDA devices) sum their gradients
 * with NCCL instead: replica i of process r is rank r x replicas + i of one
 * communicator over every replica of every process. Each replica's
 * node-done hook starts its buckets' all-reduces, in bucket order, as
 * backward finishes them, in the replica's own thread; JOB_NCCL starts the
 * rest and waits. MPI still carries the counts, the first parameters and
 * the state.
 * Synchronized batch norm sums its statistics over every replica in the
 * middle of a run: each replica thread leaves its sums in its slot and
 * waits; the training thread adds the slots in replica order, all-reduces
 * that over MPI, and hands the total back. sum_lock guards sum_arrived,
 * sum_round and sum_broken; a replica with no rows in a run still takes
 * part in every sum, with zeros. */
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef KILN_HAVE_MPI
#include <mpi.h>
#endif

#include "cuda/cuda.h"
#include "dist/dist.h"
#include "dist/ps.h"
#include "graph_internal.h"

#define START_TIMEOUT_S 600.0 /* the first collective: every process has loaded its data */

typedef enum job {
  JOB_RUN = 0,
  JOB_REDUCE,
  JOB_SYNC,
  JOB_NCCL_OPEN,  /* GPU replicas: join the communicator */
  JOB_NCCL,       /* GPU replicas: weigh the gradient, all-reduce it */
  JOB_NCCL_CLOSE, /* GPU replicas: leave the communicator */
  JOB_QUIT
} job;

typedef struct worker_arg {
  kn_dist *d;
  int index;
} worker_arg;

struct kn_dist {
  kn_aggregation aggregation;
  int n_local, world, rank, batch;
  kn_model *models[KN_DIST_MAX_LOCAL];
  size_t n_params;
  /* the replica threads (1..n_local - 1) and what they do next */
  pthread_t threads[KN_DIST_MAX_LOCAL];
  worker_arg args[KN_DIST_MAX_LOCAL];
  int n_threads;
  int sync_made; /* job_lock and the conditions are initialised */
  pthread_mutex_t job_lock;
  pthread_cond_t job_posted, job_finished;
  uint64_t generation; /* jobs posted so far */
  int pending;         /* replica threads still on the current job */
  job job;
  kn_run_mode mode;
  int rows[KN_DIST_MAX_LOCAL];
  int rc[KN_DIST_MAX_LOCAL];
  char errs[KN_DIST_MAX_LOCAL][256];
  float weight[KN_DIST_MAX_LOCAL]; /* JOB_REDUCE: replica i's gradient's weight */
  /* all-reduce buckets: [bucket_start[b], bucket_start[b] + bucket_len[b]),
   * in the order every process starts them: by bucket_ready[b], the last
   * node of the training run that reads or writes the bucket's gradients
   * (-1: none does) */
  int n_buckets;
  size_t *bucket_start, *bucket_len;
  int *bucket_ready;
  /* Overlap: several processes, one replica each. During a training run
   * (stepping) buckets [0, next_bucket) have started and [0, tested) are
   * known done; the local gradient is scaled by send_weight as it goes. */
  int overlap, stepping, ran, next_bucket, tested;
  float send_weight;
  int overlap_rc; /* the hook's first failure, reported by kn_dist_reduce */
  char overlap_err[1024];
  double comm_seconds; /* in kn_dist_reduce and the overlap hook */
  double timeout_s;    /* the longest a collective may wait for the other processes */
  /* parameter_server: the servers sum the workers' shares (no all-reduce);
   * async: a worker's step waits for no other worker */
  int ps, ps_async;
  /* GPU replicas: replica i runs on cuda:gpu[i] and is NCCL rank
   * rank x n_local + i of world x n_local (nccl_id) */
  int on_gpu;
  int gpu[KN_DIST_MAX_LOCAL];
  unsigned char nccl_id[KN_NCCL_ID_BYTES];
  kn_nccl *nccl[KN_DIST_MAX_LOCAL];
  /* during a training run (stepping): replica i's buckets [0, lane_next[i])
   * have started, each times weight[i]; its hook's first failure */
  int lane_next[KN_DIST_MAX_LOCAL];
  int lane_rc[KN_DIST_MAX_LOCAL];
  char lane_err[KN_DIST_MAX_LOCAL][256];
  /* Synchronized batch norm (synced: the model has it): replica i's sums
   * in sums[i x sum_width ..], their total over every replica in
   * sum_total (sum_width each). sum_arrived replicas have left theirs for
   * the sum under way; sum_round counts the sums done this run;
   * sum_broken is 1 + a replica whose run failed mid-step, so that the
   * others stop waiting for it. */
  int synced;
  size_t sum_width;
  double *sums, *sum_total;
  int sum_made; /* sum_lock and sum_moved are initialised */
  pthread_mutex_t sum_lock;
  pthread_cond_t sum_moved;
  int sum_arrived, sum_broken;
  uint64_t sum_round;
#ifdef KILN_HAVE_MPI
  MPI_Request *requests; /* (n_buckets) the all-reduces in flight */
  MPI_Comm comm;         /* the workers: MPI_COMM_WORLD, or without the parameter servers */
#endif
};

static double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

double kn_dist_comm_seconds(const kn_dist *d) {
  return d->comm_seconds;
}

int kn_dist_have_mpi(void) {
#ifdef KILN_HAVE_MPI
  return 1;
#else
  return 0;
#endif
}

#ifdef KILN_HAVE_MPI
/* An MPI call's failure as an engine error naming the rank, the call and
 * its line, and MPI's reason (MPI_ERRORS_RETURN is set on every
 * communicator used here, so failures come back as codes). */
#define MPI_CHECK(call)                                                                            \
  do {                                                                                             \
    int mpi_rc_ = (call);                                                                          \
    if (mpi_rc_ != MPI_SUCCESS) {                                                                  \
      char what_[512];                                                                             \
      snprintf(what_, sizeof what_, "%s (%s:%d)", #call, __FILE__, __LINE__);                      \
      return kn_mpi_failed(mpi_rc_, "dist", what_, err, errlen);                                   \
    }                                                                                              \
  } while (0)
#endif

#ifdef KILN_HAVE_MPI
/* Waits for a nonblocking collective, up to limit_s seconds: a process
 * that died or hangs must not hold the others in it forever. Between
 * polls the core is offered to whatever else may run on it (the input
 * pipeline's producers share a rank's core): yielding costs nothing when
 * nothing else wants it. */
static int wait_collective(double limit_s, MPI_Request *req, const char *what, char *err,
                           size_t errlen) {
  const double deadline = seconds_now() + limit_s;
  int done = 0;
  while (!done) {
    const int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return kn_mpi_failed(rc, "dist", what, err, errlen);
    if (!done && seconds_now() > deadline) {
      char where[48];
      kn_mpi_where(where, sizeof where);
      snprintf(err, errlen,
               "dist: %s: %s waited more than %g s for the other processes; one of them died or "
               "hangs",
               where, what, limit_s);
      return KN_EIO;
    }
    if (!done) sched_yield();
  }
  return KN_OK;
}
#endif

/* Slice i of n over count items. */
static void slice_of(size_t count, int i, int n, size_t *lo, size_t *hi) {
  *lo = count * (size_t)i / (size_t)n;
  *hi = count * (size_t)(i + 1) / (size_t)n;
}

/* GPU replica i's next bucket: its gradients times the replica's weight
 * (zero where it saw no rows: its graph did not run), then their sum over
 * every GPU replica started. */
static int start_lane_bucket(kn_dist *d, int i, char *err, size_t errlen) {
  const int b = d->lane_next[i]++;
  float *g = kn_grads(d->models[i]->graph) + d->bucket_start[b];
  const size_t len = d->bucket_len[b];
  const float w = d->weight[i];
  if (w == 0.0f)
    memset(g, 0, len * sizeof(float));
  else if (w != 1.0f)
    for (size_t j = 0; j < len; j++) g[j] *= w;
  return kn_nccl_start(d->nccl[i], g, d->bucket_start[b], len, err, errlen) ? KN_EIO : KN_OK;
}

/* Starts GPU replica i's buckets, in order, as far as those whose
 * gradients are final once `node` has run (INT_MAX: all the rest); the
 * first failure is kept in lane_rc and lane_err. */
static void start_lanes(kn_dist *d, int i, int node) {
  while (!d->lane_rc[i] && d->lane_next[i] < d->n_buckets &&
         d->bucket_ready[d->lane_next[i]] <= node)
    d->lane_rc[i] = start_lane_bucket(d, i, d->lane_err[i], sizeof d->lane_err[i]);
}

/* A GPU replica's node-done hook, in its own thread: starts the buckets
 * backward has just finished. Never waits. */
static void gpu_node_done(void *ctx, int node) {
  const worker_arg *a = ctx;
  kn_dist *d = a->d;
  const int i = a->index;
  if (!d->stepping || d->lane_rc[i]) return;
  const double start = i == 0 ? seconds_now() : 0.0;
  start_lanes(d, i, node);
  if (i == 0) d->comm_seconds += seconds_now() - start; /* the training thread's */
}

/* JOB_NCCL_OPEN for replica i, in its own thread: makes the thread's cuBLAS
 * handle (a tiny matmul) and joins the communicator, then sums zeros over
 * every bucket once, so that NCCL connects the ranks for each size now
 * rather than in the middle of the first backward. */
static int nccl_join(kn_dist *d, int i) {
  char *err = d->errs[i];
  const size_t errlen = sizeof d->errs[i];
  const float one = 1.0f;
  float out = 0.0f;
  if (kn_cuda_set_device(d->gpu[i], err, errlen) ||
      kn_cuda_matmul(&one, &one, &out, 1, 1, 1, 0, 0, err, errlen) ||
      kn_nccl_open(d->nccl_id, d->world * d->n_local, d->rank * d->n_local + i, d->gpu[i],
                   d->n_params, d->timeout_s, &d->nccl[i], err, errlen))
    return KN_EIO;
  float *zeros = calloc(d->n_params > 0 ? d->n_params : 1, sizeof(float));
  if (!zeros) {
    snprintf(err, errlen, "dist: out of memory");
    return KN_ENOMEM;
  }
  int rc = KN_OK;
  for (int b = 0; b < d->n_buckets && !rc; b++)
    if (kn_nccl_start(d->nccl[i], zeros + d->bucket_start[b], d->bucket_start[b], d->bucket_len[b],
                      err, errlen))
      rc = KN_EIO;
  if (!rc && kn_nccl_wait(d->nccl[i], err, errlen)) rc = KN_EIO;
  free(zeros);
  return rc;
}

/* JOB_NCCL for replica i: the buckets its backward did not start (all of
 * them where it saw no rows), then every sum into its own flat buffer. */
static int nccl_reduce(kn_dist *d, int i) {
  start_lanes(d, i, INT_MAX);
  if (d->lane_rc[i]) {
    memcpy(d->errs[i], d->lane_err[i], sizeof d->errs[i]); /* the same size */
    return d->lane_rc[i];
  }
  return kn_nccl_wait(d->nccl[i], d->errs[i], sizeof d->errs[i]) ? KN_EIO : KN_OK;
}

/* Replica i's run failed: the others stop waiting for it in a sum. */
static void break_sums(kn_dist *d, int i) {
  if (!d->sum_made) return;
  pthread_mutex_lock(&d->sum_lock);
  if (!d->sum_broken) d->sum_broken = 1 + i;
  pthread_cond_broadcast(&d->sum_moved);
  pthread_mutex_unlock(&d->sum_lock);
}

/* A replica graph's replica_sum, in the replica's own thread: values, n
 * doubles of its slot, become their sum over every replica of every
 * process. Replica 0's thread (the training thread, which alone calls
 * MPI) adds the slots in replica order and all-reduces the total. */
static int replica_sum(void *ctx, double *values, int n, char *err, size_t errlen) {
  const worker_arg *a = ctx;
  kn_dist *d = a->d;
  const int i = a->index;
  if (d->n_local == 1) return kn_dist_sum(d, values, n, err, errlen);
  const size_t at = (size_t)(values - (d->sums + (size_t)i * d->sum_width));
  int rc = KN_OK;
  pthread_mutex_lock(&d->sum_lock);
  const uint64_t round = d->sum_round;
  d->sum_arrived++;
  if (i == 0) {
    while (d->sum_arrived < d->n_local && !d->sum_broken)
      pthread_cond_wait(&d->sum_moved, &d->sum_lock);
    const int broken = d->sum_broken;
    d->sum_arrived = 0;
    pthread_mutex_unlock(&d->sum_lock);
    if (broken) {
      snprintf(err, errlen, "dist: replica %d failed in this step", broken - 1);
      return KN_EIO;
    }
    for (int j = 0; j < n; j++) {
      double total = 0.0;
      for (int k = 0; k < d->n_local; k++) total += d->sums[(size_t)k * d->sum_width + at + j];
      d->sum_total[j] = total;
    }
    rc = kn_dist_sum(d, d->sum_total, n, err, errlen);
    pthread_mutex_lock(&d->sum_lock);
    if (rc && !d->sum_broken) d->sum_broken = 1;
    if (!rc) d->sum_round++;
    pthread_cond_broadcast(&d->sum_moved);
  } else {
    pthread_cond_broadcast(&d->sum_moved);
    while (d->sum_round == round && !d->sum_broken) pthread_cond_wait(&d->sum_moved, &d->sum_lock);
    if (d->sum_round == round) {
      snprintf(err, errlen, "dist: replica %d failed in this step", d->sum_broken - 1);
      rc = KN_EIO;
    }
  }
  if (!rc) memcpy(values, d->sum_total, (size_t)n * sizeof(double));
  pthread_mutex_unlock(&d->sum_lock);
  return rc;
}

/* Replica i has no rows in this run and its graph does not run; it still
 * takes part, with zeros, in every sum a run's synchronized batch norm
 * takes, in the run's order. Where backward starts the gradient buckets
 * (overlap), it starts them at the same nodes, from a zero gradient, so
 * that every process starts its collectives in one order (a GPU replica
 * has sent all its zeros already). */
static int take_part_without_rows(kn_dist *d, int i) {
  kn_graph *g = d->models[i]->graph;
  if (d->mode == KN_RUN_FORWARD) return KN_OK; /* moving statistics: nothing summed */
  const int train = d->mode == KN_RUN_TRAIN;
  if (train && d->overlap) memset(kn_grads(g), 0, d->n_params * sizeof(float));
  const int end = train ? g->n_nodes : g->n_forward;
  for (int k = 0; k < end; k++) {
    const kn_node_rec *n = &g->nodes[k];
    if (n->dead || n->folded) continue;
    kn_replica_sum_at at[2];
    const int count = kn_replica_sums(g, n, at);
    for (int s = 0; s < count; s++) {
      double *values = g->replica_sums + at[s].offset;
      memset(values, 0, (size_t)at[s].len * sizeof(double));
      int rc = replica_sum(&d->args[i], values, at[s].len, d->errs[i], sizeof d->errs[i]);
      if (rc) return rc;
    }
    if (train && g->node_done) g->node_done(g->node_done_ctx, k);
  }
  return KN_OK;
}

static void do_job(kn_dist *d, int i) {
  size_t lo, hi;
  slice_of(d->n_params, i, d->n_local, &lo, &hi);
  switch (d->job) {
  case JOB_RUN:
    d->rc[i] = d->rows[i] > 0 ? kn_graph_run(d->models[i]->graph, d->mode, d->rows[i], d->errs[i],
                                             sizeof d->errs[i])
                              : KN_OK;
    /* A GPU replica without rows sends its zeros now, not after the others'
     * backward: a peer's all-reduce may wait for it to start (NCCL connects
     * lazily), and that peer's backward for the peer's. */
    if (d->rows[i] == 0 && d->on_gpu && d->stepping) start_lanes(d, i, INT_MAX);
    if (d->rows[i] == 0 && d->synced) d->rc[i] = take_part_without_rows(d, i);
    if (d->rc[i] && d->synced) break_sums(d, i);
    break;
  case JOB_REDUCE: {
    float *out = kn_grads(d->models[0]->graph);
    int first = 1;
    for (int k = 0; k < d->n_local; k++) {
      if (d->weight[k] == 0.0f) continue;
      const float *g = kn_grads(d->models[k]->graph);
      const float w = d->weight[k];
      if (first) {
        for (size_t j = lo; j < hi; j++) out[j] = g[j] * w;
      } else {
        for (size_t j = lo; j < hi; j++) out[j] += g[j] * w;
      }
      first = 0;
    }
    if (first) memset(out + lo, 0, (hi - lo) * sizeof(float)); /* no rows here */
    break;
  }
  case JOB_SYNC: {
    const float *p = kn_params(d->models[0]->graph);
    for (int k = 1; k < d->n_local; k++)
      memcpy(kn_params(d->models[k]->graph) + lo, p + lo, (hi - lo) * sizeof(float));
    break;
  }
  case JOB_NCCL_OPEN: d->rc[i] = nccl_join(d, i); break;
  case JOB_NCCL: d->rc[i] = nccl_reduce(d, i); break;
  case JOB_NCCL_CLOSE:
    kn_nccl_close(d->nccl[i]);
    d->nccl[i] = NULL;
    break;
  case JOB_QUIT: break;
  }
}

static void *replica_thread(void *arg) {
  worker_arg *a = arg;
  kn_dist *d = a->d;
  uint64_t seen = 0;
  for (;;) {
    pthread_mutex_lock(&d->job_lock);
    while (d->generation == seen) pthread_cond_wait(&d->job_posted, &d->job_lock);
    seen = d->generation;
    const job j = d->job;
    pthread_mutex_unlock(&d->job_lock);
    if (j == JOB_QUIT) return NULL;
    do_job(d, a->index);
    pthread_mutex_lock(&d->job_lock);
    if (--d->pending == 0) pthread_cond_signal(&d->job_finished);
    pthread_mutex_unlock(&d->job_lock);
  }
}

/* Posts job to the replica threads (none wait for it to be taken). */
static void post_job(kn_dist *d, job j) {
  pthread_mutex_lock(&d->job_lock);
  d->job = j;
  d->pending = d->n_threads;
  d->generation++;
  pthread_cond_broadcast(&d->job_posted);
  pthread_mutex_unlock(&d->job_lock);
}

/* Runs job on every local replica, replica 0 in this thread. */
static void run_job(kn_dist *d, job j) {
  if (d->n_threads == 0) {
    d->job = j;
    do_job(d, 0);
    return;
  }
  post_job(d, j);
  do_job(d, 0);
  pthread_mutex_lock(&d->job_lock);
  while (d->pending > 0) pthread_cond_wait(&d->job_finished, &d->job_lock);
  pthread_mutex_unlock(&d->job_lock);
}

/* Buckets of at most cap bytes over the flat buffer, walking the
 * parameters from the last to the first (the order backward finishes
 * them); a parameter larger than the cap is a bucket of its own. Every
 * process derives the same list from the same model. */
static int plan_buckets(kn_dist *d, size_t cap, char *err, size_t errlen) {
  kn_graph *g = d->models[0]->graph;
  const int n = kn_param_node_count(g);
  d->bucket_start = malloc((size_t)(n > 0 ? n : 1) * sizeof(size_t));
  d->bucket_len = malloc((size_t)(n > 0 ? n : 1) * sizeof(size_t));
#ifdef KILN_HAVE_MPI
  d->requests = malloc((size_t)(n > 0 ? n : 1) * sizeof(MPI_Request));
  if (!d->requests) {
    snprintf(err, errlen, "dist: out of memory for the all-reduce buckets");
    return KN_ENOMEM;
  }
#endif
  if (!d->bucket_start || !d->bucket_len) {
    snprintf(err, errlen, "dist: out of memory for the all-reduce buckets");
    return KN_ENOMEM;
  }
  const size_t cap_floats = cap / sizeof(float) > 0 ? cap / sizeof(float) : 1;
  size_t end = d->n_params; /* the open bucket is [start, end) */
  size_t start = end;
  for (int i = n - 1; i >= 0; i--) {
    const size_t off = kn_param_offset(g, kn_param_node(g, i));
    if (start < end && end - off > cap_floats) {
      d->bucket_start[d->n_buckets] = start;
      d->bucket_len[d->n_buckets++] = end - start;
      end = start;
    }
    start = off;
  }
  if (start < end) {
    d->bucket_start[d->n_buckets] = start;
    d->bucket_len[d->n_buckets++] = end - start;
  }
  return KN_OK;
}

/* Raises the ready node of the buckets overlapping node n's gradient slot
 * (if its storage is one) to i. */
static void touch(kn_dist *d, const kn_graph *g, kn_node n, int i) {
  const kn_node_rec *r = &g->nodes[kn_storage_root(g, n)];
  if (r->storage != KN_STORE_GRAD) return;
  const size_t lo = r->flat_offset, hi = lo + kn_node_elems(r, 0);
  for (int b = 0; b < d->n_buckets; b++)
    if (lo < d->bucket_start[b] + d->bucket_len[b] && d->bucket_start[b] < hi &&
        d->bucket_ready[b] < i)
      d->bucket_ready[b] = i;
}

/* Each bucket's ready node, and the buckets sorted by it (stable): the
 * order backward finishes them in, the same on every process. */
static int order_buckets(kn_dist *d, char *err, size_t errlen) {
  const kn_graph *g = d->models[0]->graph;
  d->bucket_ready = malloc((size_t)(d->n_buckets > 0 ? d->n_buckets : 1) * sizeof(int));
  if (!d->bucket_ready) {
    snprintf(err, errlen, "dist: out of memory for the all-reduce buckets");
    return KN_ENOMEM;
  }
  for (int b = 0; b < d->n_buckets; b++) d->bucket_ready[b] = -1;
  for (int i = 0; i < g->n_nodes; i++) {
    const kn_node_rec *n = &g->nodes[i];
    if (n->dead || n->folded) continue; /* never run in a step */
    touch(d, g, i, i);
    for (int k = 0; k < n->n_inputs; k++) touch(d, g, n->inputs[k], i);
  }
  for (int b = 1; b < d->n_buckets; b++) {
    const size_t start = d->bucket_start[b], len = d->bucket_len[b];
    const int ready = d->bucket_ready[b];
    int k = b;
    for (; k > 0 && d->bucket_ready[k - 1] > ready; k--) {
      d->bucket_start[k] = d->bucket_start[k - 1];
      d->bucket_len[k] = d->bucket_len[k - 1];
      d->bucket_ready[k] = d->bucket_ready[k - 1];
    }
    d->bucket_start[k] = start;
    d->bucket_len[k] = len;
    d->bucket_ready[k] = ready;
  }
  return KN_OK;
}

int kn_dist_bucket(const kn_dist *d, int b, size_t *start, size_t *len, int *ready_node) {
  if (b < 0 || b >= d->n_buckets) return d->n_buckets;
  *start = d->bucket_start[b];
  *len = d->bucket_len[b];
  *ready_node = d->bucket_ready[b];
  return d->n_buckets;
}

#ifdef KILN_HAVE_MPI
/* Starts bucket b's all-reduce, the local gradient scaled first. */
static int start_bucket(kn_dist *d, int b, char *err, size_t errlen) {
  float *grads = kn_grads(d->models[0]->graph) + d->bucket_start[b];
  const size_t len = d->bucket_len[b];
  if (d->send_weight != 1.0f)
    for (size_t j = 0; j < len; j++) grads[j] *= d->send_weight;
  MPI_CHECK(
      MPI_Iallreduce(MPI_IN_PLACE, grads, (int)len, MPI_FLOAT, MPI_SUM, d->comm, &d->requests[b]));
  return KN_OK;
}

/* The graph's node-done hook while overlapping: starts the buckets node
 * finished, and moves the ones in flight on. Never blocks. */
static void node_done(void *ctx, int node) {
  kn_dist *d = ((const worker_arg *)ctx)->d;
  const int more = d->next_bucket < d->n_buckets && d->bucket_ready[d->next_bucket] <= node;
  if (!d->stepping || d->overlap_rc || (!more && d->tested == d->next_bucket)) return;
  const double start = seconds_now();
  char *err = d->overlap_err;
  const size_t errlen = sizeof d->overlap_err;
  while (!d->overlap_rc && d->next_bucket < d->n_buckets && d->bucket_ready[d->next_bucket] <= node)
    d->overlap_rc = start_bucket(d, d->next_bucket++, err, errlen);
  int done = 0;
  if (!d->overlap_rc && d->tested < d->next_bucket) {
    const int rc = MPI_Testall(d->next_bucket - d->tested, d->requests + d->tested, &done,
                               MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS)
      d->overlap_rc = kn_mpi_failed(rc, "dist", "testing the gradient all-reduces", err, errlen);
  }
  if (done) d->tested = d->next_bucket;
  d->comm_seconds += seconds_now() - start;
}
#endif

/* The first failed replica's error, after a job; first the one whose
 * failure released the others from a sum (theirs only say so). */
static int job_failed(const kn_dist *d, char *err, size_t errlen) {
  const int first = d->sum_broken > 0 ? d->sum_broken - 1 : 0;
  for (int k = 0; k < d->n_local; k++) {
    const int i = (first + k) % d->n_local;
    if (d->rc[i]) {
      snprintf(err, errlen, "replica %d: %s", i, d->errs[i]);
      return d->rc[i];
    }
  }
  return KN_OK;
}

/* Where the replicas run: all on the host, or each on a GPU of its own
 * (NCCL takes a device per rank). */
static int find_gpus(kn_dist *d, char *err, size_t errlen) {
  for (int i = 0; i < d->n_local; i++) {
    d->gpu[i] = kn_graph_gpu(d->models[i]->graph);
    if ((d->gpu[i] >= 0) != (d->gpu[0] >= 0)) {
      snprintf(err, errlen,
               "dist: replica %d runs on %s and replica 0 on %s; place every replica alike", i,
               d->gpu[i] >= 0 ? "a GPU" : "the host", d->gpu[0] >= 0 ? "a GPU" : "the host");
      return KN_EINVAL;
    }
    for (int k = 0; k < i; k++) {
      if (d->gpu[i] >= 0 && d->gpu[k] == d->gpu[i]) {
        snprintf(err, errlen,
                 "dist: replicas %d and %d are both on cuda:%d; NCCL needs a GPU of its own for "
                 "each replica",
                 k, i, d->gpu[i]);
        return KN_EINVAL;
      }
    }
  }
  if (d->gpu[0] >= 0 && d->ps) {
    snprintf(err, errlen,
             "dist: parameter_server workers train on the host; place the model on cpu");
    return KN_EINVAL;
  }
  d->on_gpu = d->gpu[0] >= 0 && d->world * d->n_local > 1;
  return KN_OK;
}

#ifdef KILN_HAVE_MPI
/* Every process's replicas on GPUs, or none's: a process that made another
 * choice would pair its collectives with the wrong ones. */
static int agree_on_gpus(kn_dist *d, char *err, size_t errlen) {
  int on = d->gpu[0] >= 0, total = 0;
  MPI_Request req;
  MPI_CHECK(MPI_Iallreduce(&on, &total, 1, MPI_INT, MPI_SUM, d->comm, &req));
  int rc = wait_collective(d->timeout_s, &req, "agreeing where the replicas run", err, errlen);
  if (!rc && total != 0 && total != d->world) {
    snprintf(err, errlen,
             "dist: %d of %d processes place their replicas on GPUs, the others on the host; "
             "place every worker alike",
             total, d->world);
    rc = KN_EINVAL;
  }
  return rc;
}
#endif

/* GPU replicas: rank 0's NCCL id to every process, then every replica
 * joins the communicator from its own thread (all at once: each waits for
 * the others). */
static int open_nccl(kn_dist *d, char *err, size_t errlen) {
  if (d->rank == 0 && kn_nccl_unique_id(d->nccl_id, err, errlen)) return KN_EIO;
#ifdef KILN_HAVE_MPI
  if (d->world > 1) {
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(d->nccl_id, KN_NCCL_ID_BYTES, MPI_BYTE, 0, d->comm, &req));
    int rc = wait_collective(d->timeout_s, &req, "broadcasting the NCCL id", err, errlen);
    if (rc) return rc;
  }
#endif
  run_job(d, JOB_NCCL_OPEN);
  return job_failed(d, err, errlen);
}

/* Synchronized batch norm: each replica graph sums through replica_sum
 * into its slot of one buffer, as wide as the widest node's sums. A
 * model without it is left alone. */
static int start_sums(kn_dist *d, char *err, size_t errlen) {
  const kn_graph *g = d->models[0]->graph;
  for (int k = 0; k < g->n_nodes; k++) {
    const kn_node_rec *n = &g->nodes[k];
    if (!kn_node_replica_synced(n) || n->dead) continue;
    const size_t width = 2 * (size_t)n->dims[n->ndim - 1] + 1; /* kn_replica_sums' widest */
    if (width > d->sum_width) d->sum_width = width;
  }
  if (d->sum_width == 0) return KN_OK;
  if (d->ps_async) {
    snprintf(err, errlen,
             "dist: synchronized batch norm sums over every worker's step, and parameter_server "
             "async workers do not step together; use mode sync or unsynchronized batch norm");
    return KN_EINVAL;
  }
  d->sums = calloc((size_t)d->n_local * d->sum_width, sizeof(double));
  d->sum_total = calloc(d->sum_width, sizeof(double));
  if (!d->sums || !d->sum_total) {
    snprintf(err, errlen, "dist: out of memory for synchronized batch norm's sums");
    return KN_ENOMEM;
  }
  if (d->n_local > 1) {
    if (pthread_mutex_init(&d->sum_lock, NULL) != 0) {
      snprintf(err, errlen, "dist: cannot make synchronized batch norm's lock");
      return KN_ENOMEM;
    }
    if (pthread_cond_init(&d->sum_moved, NULL) != 0) {
      pthread_mutex_destroy(&d->sum_lock);
      snprintf(err, errlen, "dist: cannot make synchronized batch norm's lock");
      return KN_ENOMEM;
    }
    d->sum_made = 1;
  }
  for (int i = 0; i < d->n_local; i++) {
    kn_graph *rg = d->models[i]->graph;
    rg->replica_sum = replica_sum;
    rg->replica_sum_ctx = &d->args[i];
    rg->replica_sums = d->sums + (size_t)i * d->sum_width;
    rg->replica_weight = 1.0;
  }
  d->synced = 1;
  return KN_OK;
}

static int check_replica(const kn_model *primary, const kn_model *m, int i, char *err,
                         size_t errlen) {
  if (!m || !m->graph || !m->graph->compiled) {
    snprintf(err, errlen, "dist: replica %d is not a compiled model", i);
    return KN_ESTATE;
  }
  int pn, pd[KN_MAX_DIMS], rn, rd[KN_MAX_DIMS];
  kn_node_shape(primary->graph, primary->x, &pn, pd);
  kn_node_shape(m->graph, m->x, &rn, rd);
  if (kn_param_count(m->graph) != kn_param_count(primary->graph) ||
      m->graph->n_nodes != primary->graph->n_nodes ||
      m->graph->n_state_floats != primary->graph->n_state_floats || rd[0] != pd[0] ||
      m->example_size != primary->example_size || m->n_outputs != primary->n_outputs) {
    snprintf(err, errlen,
             "dist: replica %d differs from the trained model (%zu parameters and batch %d, "
             "against %zu and %d); build every replica from the same config",
             i, kn_param_count(m->graph), rd[0], kn_param_count(primary->graph), pd[0]);
    return KN_EINVAL;
  }
  return KN_OK;
}

int kn_dist_new(kn_model *primary, int batch, const kn_distribution *cfg, kn_dist **out, char *err,
                size_t errlen) {
  *out = NULL;
  const int n_local = cfg->n_replicas > 1 ? cfg->n_replicas : 1;
  const int world = cfg->world_size > 1 ? cfg->world_size : 1;
  if (n_local > KN_DIST_MAX_LOCAL || (n_local > 1 && !cfg->replicas)) {
    snprintf(err, errlen, "dist: need 1 to %d replicas, each a model, got %d", KN_DIST_MAX_LOCAL,
             n_local);
    return KN_EINVAL;
  }
  if (world > 1 && !kn_dist_have_mpi()) {
    snprintf(err, errlen,
             "dist: %d processes need MPI, and this build of kiln has none (configure with "
             "KILN_MPI=ON)",
             world);
    return KN_EINVAL;
  }
  if (cfg->rank < 0 || cfg->rank >= world || (int)cfg->aggregation < 0 ||
      cfg->aggregation > KN_AGGREGATE_WEIGHTED_MEAN) {
    snprintf(err, errlen, "dist: rank %d of %d processes, aggregation %d: out of range", cfg->rank,
             world, (int)cfg->aggregation);
    return KN_EINVAL;
  }
  for (int i = 1; i < n_local; i++) {
    int rc = check_replica(primary, cfg->replicas[i - 1], i, err, errlen);
    if (rc) return rc;
  }
  kn_dist *d = calloc(1, sizeof *d);
  if (!d) {
    snprintf(err, errlen, "dist: out of memory");
    return KN_ENOMEM;
  }
  d->aggregation = cfg->aggregation;
  d->n_local = n_local;
  d->world = world;
  d->rank = world > 1 ? cfg->rank : 0;
  d->batch = batch;
  d->timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 300.0;
  d->models[0] = primary;
  for (int i = 1; i < n_local; i++) d->models[i] = cfg->replicas[i - 1];
  for (int i = 0; i < n_local; i++) d->args[i] = (worker_arg){d, i};
  /* Global replica k = rank x n_local + i takes rows k x batch .. of every
   * global batch (kn_dist_slice of this process's part): its dropout masks
   * are drawn from there. */
  for (int i = 0; i < n_local; i++)
    d->models[i]->graph->row_offset = ((int64_t)d->rank * n_local + i) * batch;
  d->n_params = kn_param_count(primary->graph);
  d->ps = cfg->ps_servers > 0;
  d->ps_async = d->ps && cfg->ps_async;
#ifdef KILN_HAVE_MPI
  d->comm = MPI_COMM_WORLD;
#endif
  int rc = find_gpus(d, err, errlen);
  if (!rc) rc = start_sums(d, err, errlen);
  if (!rc)
    rc = plan_buckets(d, cfg->bucket_bytes ? cfg->bucket_bytes : (size_t)1 << 20, err, errlen);
  if (!rc) rc = order_buckets(d, err, errlen);
#ifdef KILN_HAVE_MPI
  /* Overlap only with one replica here: with several, their gradients are
   * summed in shared memory after all backward runs are done. */
  if (!rc && world > 1 && n_local == 1 && !d->ps && !d->on_gpu) {
    d->overlap = 1;
    primary->graph->node_done = node_done;
    primary->graph->node_done_ctx = &d->args[0]; /* as a GPU replica's hook */
  }
#endif
  if (!rc && n_local > 1) {
    if (pthread_mutex_init(&d->job_lock, NULL) != 0 ||
        pthread_cond_init(&d->job_posted, NULL) != 0 ||
        pthread_cond_init(&d->job_finished, NULL) != 0) {
      snprintf(err, errlen, "dist: cannot make the replica threads' lock");
      rc = KN_ENOMEM;
    } else {
      d->sync_made = 1;
    }
    for (int i = 1; !rc && i < n_local; i++) {
      if (pthread_create(&d->threads[i], NULL, replica_thread, &d->args[i]) != 0) {
        snprintf(err, errlen, "dist: cannot start replica thread %d", i);
        rc = KN_ENOMEM;
      } else {
        d->n_threads++;
      }
    }
  }
#ifdef KILN_HAVE_MPI
  if (!rc && world > 1) rc = kn_mpi_errors_return(MPI_COMM_WORLD, "dist", err, errlen);
  if (!rc && world > 1 && d->ps) rc = kn_ps_workers_comm(world, &d->comm, err, errlen);
  if (!rc && world > 1) { /* rank 0's initial weights everywhere, as DDP starts */
    float *params = kn_params(primary->graph);
    for (size_t off = 0; off < d->n_params && !rc; off += (size_t)1 << 30) {
      size_t len = d->n_params - off < ((size_t)1 << 30) ? d->n_params - off : (size_t)1 << 30;
      MPI_Request req;
      const int started = MPI_Ibcast(params + off, (int)len, MPI_FLOAT, 0, d->comm, &req);
      if (started != MPI_SUCCESS) {
        rc = kn_mpi_failed(started, "dist", "broadcasting the initial parameters", err, errlen);
      } else {
        /* Processes load their data at their own pace: the start waits longer. */
        const double start_limit = d->timeout_s > START_TIMEOUT_S ? d->timeout_s : START_TIMEOUT_S;
        rc = wait_collective(start_limit, &req, "broadcasting the initial parameters", err, errlen);
      }
    }
  }
#endif
#ifdef KILN_HAVE_MPI
  if (!rc && world > 1 && !d->ps) rc = agree_on_gpus(d, err, errlen);
#endif
  if (!rc && d->on_gpu) rc = open_nccl(d, err, errlen);
  for (int i = 0; !rc && d->on_gpu && i < n_local; i++) {
    d->models[i]->graph->node_done = gpu_node_done;
    d->models[i]->graph->node_done_ctx = &d->args[i];
  }
  if (!rc) rc = kn_dist_sync(d, err, errlen);
  if (rc) {
    kn_dist_free(d);
    return rc;
  }
  *out = d;
  return KN_OK;
}

void kn_dist_free(kn_dist *d) {
  if (!d) return;
  int joined = 0;
  for (int i = 0; i < d->n_local; i++) joined |= d->nccl[i] != NULL;
  if (joined) run_job(d, JOB_NCCL_CLOSE); /* each from its own thread, all at once */
  if (d->n_threads > 0) {
    post_job(d, JOB_QUIT);
    for (int i = 1; i <= d->n_threads; i++) pthread_join(d->threads[i], NULL);
  }
  if (d->sync_made) {
    pthread_mutex_destroy(&d->job_lock);
    pthread_cond_destroy(&d->job_posted);
    pthread_cond_destroy(&d->job_finished);
  }
  if (d->sum_made) {
    pthread_mutex_destroy(&d->sum_lock);
    pthread_cond_destroy(&d->sum_moved);
  }
  free(d->sums);
  free(d->sum_total);
  for (int i = 0; i < d->n_local; i++) { /* the graphs outlive the strategy */
    d->models[i]->graph->row_offset = 0;
    if (d->models[i]->graph->replica_sum_ctx == &d->args[i]) {
      d->models[i]->graph->replica_sum = NULL;
      d->models[i]->graph->replica_sum_ctx = NULL;
      d->models[i]->graph->replica_sums = NULL;
    }
    if (d->models[i]->graph->node_done_ctx == &d->args[i]) {
      d->models[i]->graph->node_done = NULL;
      d->models[i]->graph->node_done_ctx = NULL;
    }
  }
  free(d->bucket_start);
  free(d->bucket_len);
  free(d->bucket_ready);
#ifdef KILN_HAVE_MPI
  free(d->requests);
  if (d->comm != MPI_COMM_WORLD && d->comm != MPI_COMM_NULL) MPI_Comm_free(&d->comm);
#endif
  free(d);
}

int kn_dist_local(const kn_dist *d) {
  return d->n_local;
}

int kn_dist_total(const kn_dist *d) {
  return d->n_local * d->world;
}

int kn_dist_rank(const kn_dist *d) {
  return d->rank;
}

kn_model *kn_dist_model(kn_dist *d, int i) {
  return d->models[i];
}

void kn_dist_slice(const kn_dist *d, int i, int rows, int *start, int *count) {
  const long long first = (long long)i * d->batch;
  long long left = rows - first;
  *start = first < rows ? (int)first : rows;
  *count = left <= 0 ? 0 : left < d->batch ? (int)left : d->batch;
}

int kn_dist_run(kn_dist *d, kn_run_mode mode, const int *rows, char *err, size_t errlen) {
  d->mode = mode;
  memcpy(d->rows, rows, (size_t)d->n_local * sizeof(int));
  if (d->synced) { /* no replica is in a sum between runs */
    d->sum_arrived = d->sum_broken = 0;
    /* batch norm's gradient sums weighed as kn_dist_reduce weighs the
     * gradients, up to the factor they all share */
    for (int i = 0; i < d->n_local; i++)
      d->models[i]->graph->replica_weight =
          d->aggregation == KN_AGGREGATE_WEIGHTED_MEAN && rows[i] > 0 ? rows[i] : 1.0;
  }
  if (d->overlap && mode == KN_RUN_TRAIN) { /* kn_dist_reduce ends the step */
    d->stepping = 1;
    d->ran = rows[0] > 0;
    d->next_bucket = d->tested = 0;
    d->send_weight = d->aggregation == KN_AGGREGATE_WEIGHTED_MEAN ? (float)rows[0] : 1.0f;
  }
  if (d->on_gpu && mode == KN_RUN_TRAIN) { /* kn_dist_reduce ends the step */
    d->stepping = 1;
    for (int i = 0; i < d->n_local; i++) {
      d->lane_next[i] = d->lane_rc[i] = 0;
      /* the replica's gradient's weight in the sum, as kn_dist_reduce sets it */
      d->weight[i] = d->aggregation == KN_AGGREGATE_WEIGHTED_MEAN ? (float)rows[i] : rows[i] > 0;
    }
  }
  run_job(d, JOB_RUN);
  return job_failed(d, err, errlen);
}

int kn_dist_sum(kn_dist *d, double *values, int n, char *err, size_t errlen) {
  if (d->world == 1) return KN_OK;
#ifdef KILN_HAVE_MPI
  MPI_Request req;
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, MPI_SUM, d->comm, &req));
  return wait_collective(d->timeout_s, &req, "summing counts", err, errlen);
#else
  (void)values;
  (void)n;
  snprintf(err, errlen, "dist: no MPI in this build");
  return KN_ESTATE;
#endif
}

static int reduce(kn_dist *d, const int *rows, double *sums, char *err, size_t errlen);

int kn_dist_reduce(kn_dist *d, const int *rows, double *sums, char *err, size_t errlen) {
  const double start = seconds_now();
  int rc = reduce(d, rows, sums, err, errlen);
  d->comm_seconds += seconds_now() - start;
  return rc;
}

#ifdef KILN_HAVE_MPI
/* Overlap, after the training run: the buckets backward did not start
 * (all of them where this process had no rows, its gradient zero). */
static int start_rest(kn_dist *d, char *err, size_t errlen) {
  d->stepping = 0;
  if (d->overlap_rc) {
    snprintf(err, errlen, "%s", d->overlap_err);
    return d->overlap_rc;
  }
  /* (Buckets already started came from a zero gradient: a run without
   * rows that took part in synchronized batch norm's sums.) */
  if (!d->ran && d->next_bucket == 0)
    memset(kn_grads(d->models[0]->graph), 0, d->n_params * sizeof(float));
  while (d->next_bucket < d->n_buckets) {
    int rc = start_bucket(d, d->next_bucket++, err, errlen);
    if (rc) return rc;
  }
  return KN_OK;
}
#endif

static int reduce(kn_dist *d, const int *rows, double *sums, char *err, size_t errlen) {
  /* How many replicas saw rows, and how many rows: here, then everywhere.
   * Every process starts its collectives in one order: overlapping, the
   * buckets then the counts; otherwise the counts then the buckets. */
  double counts[KN_DIST_SUMS + 1] = {sums[0], sums[1], sums[2], 0.0};
  for (int i = 0; i < d->n_local; i++) counts[KN_DIST_SUMS] += rows[i] > 0;
  int rc = KN_OK;
#ifdef KILN_HAVE_MPI
  if (d->overlap && (rc = start_rest(d, err, errlen)) != KN_OK) return rc;
#endif
  /* An async parameter-server worker's step is its own: no collective. */
  rc = d->ps_async ? KN_OK : kn_dist_sum(d, counts, KN_DIST_SUMS + 1, err, errlen);
  if (rc) return rc;
  memcpy(sums, counts, KN_DIST_SUMS * sizeof(double));
  const double total_rows = counts[0], active = counts[KN_DIST_SUMS];
  /* One process folds the final scale into the local sum; several sum
   * first (rows-weighted for weighted_mean) and scale after. */
  float scale = 1.0f;
  if (d->aggregation == KN_AGGREGATE_WEIGHTED_MEAN && total_rows > 0)
    scale = (float)(1.0 / total_rows);
  else if (d->aggregation == KN_AGGREGATE_MEAN && active > 0)
    scale = (float)(1.0 / active);
  for (int i = 0; i < d->n_local; i++) {
    float w = d->aggregation == KN_AGGREGATE_WEIGHTED_MEAN ? (float)rows[i] : rows[i] > 0;
    d->weight[i] = (d->world == 1 || d->ps) && !d->on_gpu ? w * scale : w;
  }
  if (d->on_gpu) { /* NCCL sums every replica's weighted gradient; scaled after */
    run_job(d, JOB_NCCL);
    d->stepping = 0;
    rc = job_failed(d, err, errlen);
    float *grads = kn_grads(d->models[0]->graph);
    if (!rc && scale != 1.0f)
      for (size_t j = 0; j < d->n_params; j++) grads[j] *= scale;
    return rc;
  }
  if (!d->overlap && (d->n_local > 1 || d->weight[0] != 1.0f)) run_job(d, JOB_REDUCE);
  if (d->world == 1 || d->ps) return KN_OK; /* the parameter servers sum the workers' shares */
#ifdef KILN_HAVE_MPI
  float *grads = kn_grads(d->models[0]->graph);
  for (int b = 0; !d->overlap && b < d->n_buckets; b++) /* every bucket in flight at once */
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, grads + d->bucket_start[b], (int)d->bucket_len[b],
                             MPI_FLOAT, MPI_SUM, d->comm, &d->requests[b]));
  for (int b = d->overlap ? d->tested : 0; b < d->n_buckets; b++) {
    rc = wait_collective(d->timeout_s, &d->requests[b], "the gradient all-reduce", err, errlen);
    if (rc) return rc;
  }
  if (scale != 1.0f)
    for (size_t j = 0; j < d->n_params; j++) grads[j] *= scale;
#endif
  return KN_OK;
}

int kn_dist_sync(kn_dist *d, char *err, size_t errlen) {
  kn_graph *g = d->models[0]->graph;
  float *state = kn_state_data(g);
#ifdef KILN_HAVE_MPI
  if (d->world > 1 && g->n_state_floats > 0 && !d->ps_async) { /* async: each keeps its own */
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(state, (int)g->n_state_floats, MPI_FLOAT, 0, d->comm, &req));
    int rc = wait_collective(d->timeout_s, &req, "broadcasting the model's state", err, errlen);
    if (rc) return rc;
  }
#else
  (void)err;
  (void)errlen;
#endif
  run_job(d, JOB_SYNC);
  for (int k = 1; k < d->n_local; k++) {
    kn_graph *rg = d->models[k]->graph;
    if (g->n_state_floats > 0) memcpy(kn_state_data(rg), state, g->n_state_floats * sizeof(float));
    rg->train_runs = g->train_runs;
  }
  return KN_OK;
}
