/* dist.c — data-parallel replicas: each local replica's graph runs in its
 * own thread, gradients are summed into the primary's flat buffer in
 * shared memory (each thread one slice of it) and all-reduced across
 * processes over MPI in buckets, last layers first.
 * Threads: while a job is out (generation moved on, pending > 0) replica
 * thread i touches only replica i's graph (JOB_RUN) or slice i of the flat
 * buffers (JOB_REDUCE, JOB_SYNC); everything else belongs to the training
 * thread, which is replica 0's and sets the next job while the others
 * wait. job_lock guards generation and pending. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef KILN_HAVE_MPI
#include <mpi.h>
#endif

#include "dist/dist.h"
#include "dist/ps.h"
#include "graph_internal.h"

#define START_TIMEOUT_S 600.0 /* the first collective: every process has loaded its data */

typedef enum job { JOB_RUN = 0, JOB_REDUCE, JOB_SYNC, JOB_QUIT } job;

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
  /* all-reduce buckets: [bucket_start[b], bucket_start[b] + bucket_len[b]) */
  int n_buckets;
  size_t *bucket_start, *bucket_len;
  double comm_seconds; /* in kn_dist_reduce */
  double timeout_s;    /* the longest a collective may wait for the other processes */
  /* parameter_server: the servers sum the workers' shares (no all-reduce);
   * async: a worker's step waits for no other worker */
  int ps, ps_async;
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
/* An MPI call's failure as an engine error naming the call and line. */
#define MPI_CHECK(call)                                                                            \
  do {                                                                                             \
    int mpi_rc_ = (call);                                                                          \
    if (mpi_rc_ != MPI_SUCCESS) {                                                                  \
      char text_[MPI_MAX_ERROR_STRING];                                                            \
      int len_ = 0;                                                                                \
      MPI_Error_string(mpi_rc_, text_, &len_);                                                     \
      snprintf(err, errlen, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call, text_);             \
      return KN_EIO;                                                                               \
    }                                                                                              \
  } while (0)
#endif

#ifdef KILN_HAVE_MPI
/* Waits for a nonblocking collective, up to limit_s seconds: a process
 * that died or hangs must not hold the others in it forever. */
static int wait_collective(double limit_s, MPI_Request *req, const char *what, char *err,
                           size_t errlen) {
  const double deadline = seconds_now() + limit_s;
  int done = 0;
  while (!done) {
    MPI_CHECK(MPI_Test(req, &done, MPI_STATUS_IGNORE));
    if (!done && seconds_now() > deadline) {
      snprintf(err, errlen,
               "dist: %s waited more than %g s for the other processes; one of them died or "
               "hangs",
               what, limit_s);
      return KN_EIO;
    }
  }
  return KN_OK;
}
#endif

/* Slice i of n over count items. */
static void slice_of(size_t count, int i, int n, size_t *lo, size_t *hi) {
  *lo = count * (size_t)i / (size_t)n;
  *hi = count * (size_t)(i + 1) / (size_t)n;
}

static void do_job(kn_dist *d, int i) {
  size_t lo, hi;
  slice_of(d->n_params, i, d->n_local, &lo, &hi);
  switch (d->job) {
  case JOB_RUN:
    d->rc[i] = d->rows[i] > 0 ? kn_graph_run(d->models[i]->graph, d->mode, d->rows[i], d->errs[i],
                                             sizeof d->errs[i])
                              : KN_OK;
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
  d->n_params = kn_param_count(primary->graph);
  d->ps = cfg->ps_servers > 0;
  d->ps_async = d->ps && cfg->ps_async;
#ifdef KILN_HAVE_MPI
  d->comm = MPI_COMM_WORLD;
#endif
  int rc = plan_buckets(d, cfg->bucket_bytes ? cfg->bucket_bytes : (size_t)25 << 20, err, errlen);
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
      d->args[i] = (worker_arg){d, i};
      if (pthread_create(&d->threads[i], NULL, replica_thread, &d->args[i]) != 0) {
        snprintf(err, errlen, "dist: cannot start replica thread %d", i);
        rc = KN_ENOMEM;
      } else {
        d->n_threads++;
      }
    }
  }
#ifdef KILN_HAVE_MPI
  if (!rc && world > 1 && d->ps) rc = kn_ps_workers_comm(world, &d->comm, err, errlen);
  if (!rc && world > 1) { /* rank 0's initial weights everywhere, as DDP starts */
    float *params = kn_params(primary->graph);
    for (size_t off = 0; off < d->n_params && !rc; off += (size_t)1 << 30) {
      size_t len = d->n_params - off < ((size_t)1 << 30) ? d->n_params - off : (size_t)1 << 30;
      MPI_Request req;
      if (MPI_Ibcast(params + off, (int)len, MPI_FLOAT, 0, d->comm, &req) != MPI_SUCCESS) {
        snprintf(err, errlen, "dist: broadcasting the initial parameters failed");
        rc = KN_EIO;
      } else {
        /* Processes load their data at their own pace: the start waits longer. */
        const double start_limit = d->timeout_s > START_TIMEOUT_S ? d->timeout_s : START_TIMEOUT_S;
        rc = wait_collective(start_limit, &req, "broadcasting the initial parameters", err, errlen);
      }
    }
  }
#endif
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
  if (d->n_threads > 0) {
    post_job(d, JOB_QUIT);
    for (int i = 1; i <= d->n_threads; i++) pthread_join(d->threads[i], NULL);
  }
  if (d->sync_made) {
    pthread_mutex_destroy(&d->job_lock);
    pthread_cond_destroy(&d->job_posted);
    pthread_cond_destroy(&d->job_finished);
  }
  free(d->bucket_start);
  free(d->bucket_len);
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
  const long long first = ((long long)d->rank * d->n_local + i) * d->batch;
  long long left = rows - first;
  *start = first < rows ? (int)first : rows;
  *count = left <= 0 ? 0 : left < d->batch ? (int)left : d->batch;
}

int kn_dist_run(kn_dist *d, kn_run_mode mode, const int *rows, char *err, size_t errlen) {
  d->mode = mode;
  memcpy(d->rows, rows, (size_t)d->n_local * sizeof(int));
  run_job(d, JOB_RUN);
  for (int i = 0; i < d->n_local; i++) {
    if (d->rc[i]) {
      snprintf(err, errlen, "replica %d: %s", i, d->errs[i]);
      return d->rc[i];
    }
  }
  return KN_OK;
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

static int reduce(kn_dist *d, const int *rows, double *sums, char *err, size_t errlen) {
  /* How many replicas saw rows, and how many rows: here, then everywhere. */
  double counts[KN_DIST_SUMS + 1] = {sums[0], sums[1], sums[2], 0.0};
  for (int i = 0; i < d->n_local; i++) counts[KN_DIST_SUMS] += rows[i] > 0;
  /* An async parameter-server worker's step is its own: no collective. */
  int rc = d->ps_async ? KN_OK : kn_dist_sum(d, counts, KN_DIST_SUMS + 1, err, errlen);
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
    d->weight[i] = d->world == 1 || d->ps ? w * scale : w;
  }
  if (d->n_local > 1 || d->weight[0] != 1.0f) run_job(d, JOB_REDUCE);
  if (d->world == 1 || d->ps) return KN_OK; /* the parameter servers sum the workers' shares */
#ifdef KILN_HAVE_MPI
  float *grads = kn_grads(d->models[0]->graph);
  for (int b = 0; b < d->n_buckets; b++) /* every bucket in flight at once */
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, grads + d->bucket_start[b], (int)d->bucket_len[b],
                             MPI_FLOAT, MPI_SUM, d->comm, &d->requests[b]));
  for (int b = 0; b < d->n_buckets; b++) {
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
