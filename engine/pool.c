/* pool.c — the CPU backend's persistent thread pool: T-1 worker threads
 * started at compile, woken for each parallel loop and parked in between,
 * so a training step creates no threads and allocates nothing. A loop over
 * [0, n) is cut into T contiguous ranges by index alone, and every kernel
 * run through it computes each output element in one range with the same
 * arithmetic, so results are identical for every thread count.
 *
 * Threads: the caller (the thread running the graph) owns the loop fields
 * while no loop is running; lock_loop guards the generation counter, the
 * loop fields and the count of workers still busy. */
#include <pthread.h>
#include <stdlib.h>

#include "graph_internal.h"

typedef struct worker_arg {
  struct kn_pool *pool;
  int index; /* 1..threads-1; the caller is 0 */
} worker_arg;

struct kn_pool {
  int threads; /* including the caller */
  pthread_t *workers;
  worker_arg *args; /* (threads) one per worker, read by it only */
  int n_started;
  pthread_mutex_t lock_loop;
  pthread_cond_t wake, done;
  uint64_t generation; /* bumped per loop; workers run once per bump */
  int busy;            /* workers that have not finished this loop */
  int stop;
  kn_range_fn fn;
  void *ctx;
  int64_t n;
};

static void run_range(kn_pool *p, int index) {
  int64_t begin = p->n * index / p->threads, end = p->n * (index + 1) / p->threads;
  if (begin < end) p->fn(p->ctx, begin, end);
}

static void *worker_main(void *arg) {
  worker_arg *w = arg;
  kn_pool *p = w->pool;
  uint64_t seen = 0;
  pthread_mutex_lock(&p->lock_loop);
  for (;;) {
    while (!p->stop && p->generation == seen) pthread_cond_wait(&p->wake, &p->lock_loop);
    if (p->stop) break;
    seen = p->generation;
    pthread_mutex_unlock(&p->lock_loop);
    run_range(p, w->index);
    pthread_mutex_lock(&p->lock_loop);
    if (--p->busy == 0) pthread_cond_signal(&p->done);
  }
  pthread_mutex_unlock(&p->lock_loop);
  return NULL;
}

kn_pool *kn_pool_new(int threads) {
  if (threads < 2) return NULL; /* one thread needs no pool */
  if (threads > KN_POOL_MAX_THREADS) threads = KN_POOL_MAX_THREADS;
  kn_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->threads = threads;
  p->workers = calloc((size_t)threads, sizeof *p->workers);
  p->args = calloc((size_t)threads, sizeof *p->args);
  if (!p->workers || !p->args || pthread_mutex_init(&p->lock_loop, NULL) != 0) {
    free(p->workers);
    free(p->args);
    free(p);
    return NULL;
  }
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->done, NULL);
  for (int i = 1; i < threads; i++) {
    p->args[i].pool = p;
    p->args[i].index = i;
    if (pthread_create(&p->workers[i], NULL, worker_main, &p->args[i]) != 0) break;
    p->n_started++;
  }
  if (p->n_started != threads - 1) {
    kn_pool_free(p);
    return NULL;
  }
  return p;
}

void kn_pool_free(kn_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->lock_loop);
  p->stop = 1;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->lock_loop);
  for (int i = 1; i <= p->n_started; i++) pthread_join(p->workers[i], NULL);
  pthread_cond_destroy(&p->wake);
  pthread_cond_destroy(&p->done);
  pthread_mutex_destroy(&p->lock_loop);
  free(p->workers);
  free(p->args);
  free(p);
}

int kn_pool_threads(const kn_pool *p) {
  return p ? p->threads : 1;
}

void kn_pool_for(kn_pool *p, int64_t n, kn_range_fn fn, void *ctx) {
  if (!p || n < 2) {
    if (n > 0) fn(ctx, 0, n);
    return;
  }
  pthread_mutex_lock(&p->lock_loop);
  p->fn = fn;
  p->ctx = ctx;
  p->n = n;
  p->busy = p->threads - 1;
  p->generation++;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->lock_loop);
  run_range(p, 0);
  pthread_mutex_lock(&p->lock_loop);
  while (p->busy > 0) pthread_cond_wait(&p->done, &p->lock_loop);
  pthread_mutex_unlock(&p->lock_loop);
}
