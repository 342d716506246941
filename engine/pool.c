/* pool.c — the CPU backend's persistent thread pool: T-1 worker threads
 * started at compile, woken for each parallel loop and parked in between,
 * so a training step creates no threads and allocates nothing. A loop over
 * [0, n) is cut into T contiguous ranges by index alone, and every kernel
 * run through it computes each output element in one range with the same
 * arithmetic, so results are identical for every thread count.
 *
 * A step runs dozens of loops, some a few tens of microseconds long, and
 * waking a parked thread costs about as much, and far more in a virtual
 * machine, where a parked CPU is handed back to the host. So, as OpenMP
 * runtimes do (Intel's waits 200 ms by default), a worker that finishes a
 * loop watches for the next one (SPIN_NS, 2 ms: longer than the serial
 * gaps inside a step) before it parks, and the caller watches for the
 * workers to finish before it sleeps: loops inside a step never wait for a
 * wake-up. Past the first SPIN_ALONE_NS of a watch the watcher yields its
 * CPU between looks, so that a thread of another job or replica sharing
 * that CPU runs instead of waiting behind it.
 *
 * Threads: the caller (the thread running the graph) owns the loop fields
 * while no loop is running and publishes them with the generation counter
 * (release); a worker reads them after seeing the new generation
 * (acquire). lock_loop guards parking: a worker checks the generation and
 * counts itself in sleepers under it, and the caller bumps the generation
 * and wakes sleepers under it, so no wake-up is lost; likewise the last
 * worker to finish signals done under it.
 *
 * Shares. A virtual machine's CPUs do not run at one speed: on a 2-vCPU
 * guest one thread finished the same half of a loop 15 to 40% later than
 * the other, and which one moved from minute to minute, so a split fixed
 * in advance left the faster thread waiting for a fifth of the step. So a
 * loop of more units than threads is shared as OpenMP's static-steal
 * schedule shares it: each thread owns the contiguous range a fixed split
 * gives it and takes it from the front, a quarter of what is left at a
 * time; a thread whose range is spent takes half of what is left of
 * another's from the back. Where the threads keep pace, each runs its own
 * range as before (its data where it left it, in its caches); where one
 * falls behind, the other takes over its tail. Which thread computes a
 * unit never changes what is computed: every kernel's arithmetic on an
 * element is the same in any range (the thread-count tests hold each
 * result to its bits), and a task's scratch is its slot's, never shared
 * with a range running at the same time. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* How long a thread watches for work or for the others before it sleeps,
 * and for how much of that it keeps its CPU. */
#define SPIN_NS       2000000
#define SPIN_ALONE_NS 50000

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
  _Atomic uint64_t generation; /* bumped per loop; workers run once per bump */
  _Atomic int busy;            /* workers that have not finished this loop */
  int sleepers;                /* workers parked on wake (under lock_loop) */
  _Atomic int stop;
  kn_range_fn fn;       /* a kn_pool_for loop's, or NULL */
  kn_share_fn share_fn; /* a kn_pool_share loop's */
  void *ctx;
  int64_t n, grain;
  int shared;          /* units handed out by take (else one range a thread) */
  struct owned *owned; /* (threads) each thread's range, packed */
};

/* A thread's range of a shared loop, [lo, hi) packed as lo << 32 | hi, on
 * a cache line of its own: its owner moves lo up, another thread moves hi
 * down, each by a compare-and-swap of the whole word. */
typedef struct owned {
  _Alignas(64) _Atomic uint64_t range;
} owned;

#define LO(r)        ((int64_t)((r) >> 32))
#define HI(r)        ((int64_t)((r)&0xffffffffu))
#define PACK(lo, hi) ((uint64_t)(lo) << 32 | (uint64_t)(hi))

/* Takes units from slot's own range (front), or once it is spent from the
 * others' (back, starting with the next slot): [*b, *e), 0 when none are
 * left anywhere. */
static int take(kn_pool *p, int slot, int64_t *b, int64_t *e) {
  _Atomic uint64_t *mine = &p->owned[slot].range;
  uint64_t r = atomic_load_explicit(mine, memory_order_relaxed);
  for (;;) {
    const int64_t lo = LO(r), hi = HI(r);
    if (lo >= hi) break;
    int64_t c = (hi - lo + 3) / 4;
    if (c < p->grain) c = p->grain;
    if (c > hi - lo) c = hi - lo;
    if (atomic_compare_exchange_weak_explicit(mine, &r, PACK(lo + c, hi), memory_order_acq_rel,
                                              memory_order_relaxed)) {
      *b = lo, *e = lo + c;
      return 1;
    }
  }
  for (int i = 1; i < p->threads; i++) {
    _Atomic uint64_t *theirs = &p->owned[(slot + i) % p->threads].range;
    r = atomic_load_explicit(theirs, memory_order_relaxed);
    for (;;) {
      const int64_t lo = LO(r), hi = HI(r);
      if (lo >= hi) break;
      int64_t c = (hi - lo + 1) / 2;
      if (c < p->grain) c = hi - lo < p->grain ? hi - lo : p->grain;
      if (atomic_compare_exchange_weak_explicit(theirs, &r, PACK(lo, hi - c), memory_order_acq_rel,
                                                memory_order_relaxed)) {
        *b = hi - c, *e = hi;
        return 1;
      }
    }
  }
  return 0;
}

/* Runs [b, e) of the loop on thread `index`. */
static void call(kn_pool *p, int index, int64_t b, int64_t e) {
  if (p->fn)
    p->fn(p->ctx, b, e);
  else
    p->share_fn(p->ctx, index, b, e);
}

static void run_range(kn_pool *p, int index) {
  int64_t b = p->n * index / p->threads, e = p->n * (index + 1) / p->threads;
  if (!p->shared) {
    if (b < e) call(p, index, b, e);
    return;
  }
  while (take(p, index, &b, &e)) call(p, index, b, e);
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* Watches, up to SPIN_NS, for the generation to move past seen (when
 * want_busy is 0) or for busy to reach 0 (when it is 1). */
static int spin_until(kn_pool *p, uint64_t seen, int want_busy) {
  const int64_t start = now_ns(), alone = start + SPIN_ALONE_NS, until = start + SPIN_NS;
  for (int i = 0;; i++) {
    if (want_busy ? atomic_load_explicit(&p->busy, memory_order_acquire) == 0
                  : atomic_load_explicit(&p->generation, memory_order_acquire) != seen ||
                        atomic_load_explicit(&p->stop, memory_order_acquire))
      return 1;
    cpu_relax();
    if ((i & 63) == 63) {
      const int64_t t = now_ns();
      if (t > until) return 0;
      if (t > alone) sched_yield();
    }
  }
}

static void *worker_main(void *arg) {
  worker_arg *w = arg;
  kn_pool *p = w->pool;
  uint64_t seen = 0;
  for (;;) {
    if (!spin_until(p, seen, 0)) {
      pthread_mutex_lock(&p->lock_loop);
      p->sleepers++;
      while (!atomic_load(&p->stop) && atomic_load(&p->generation) == seen)
        pthread_cond_wait(&p->wake, &p->lock_loop);
      p->sleepers--;
      pthread_mutex_unlock(&p->lock_loop);
    }
    if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
    seen = atomic_load_explicit(&p->generation, memory_order_acquire);
    run_range(p, w->index);
    if (atomic_fetch_sub_explicit(&p->busy, 1, memory_order_acq_rel) == 1) {
      pthread_mutex_lock(&p->lock_loop);
      pthread_cond_signal(&p->done);
      pthread_mutex_unlock(&p->lock_loop);
    }
  }
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
  p->owned = aligned_alloc(_Alignof(owned), (size_t)threads * sizeof *p->owned);
  if (!p->workers || !p->args || !p->owned || pthread_mutex_init(&p->lock_loop, NULL) != 0) {
    free(p->workers);
    free(p->args);
    free(p->owned);
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
  atomic_store(&p->stop, 1);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->lock_loop);
  for (int i = 1; i <= p->n_started; i++) pthread_join(p->workers[i], NULL);
  pthread_cond_destroy(&p->wake);
  pthread_cond_destroy(&p->done);
  pthread_mutex_destroy(&p->lock_loop);
  free(p->workers);
  free(p->args);
  free(p->owned);
  free(p);
}

int kn_pool_threads(const kn_pool *p) {
  return p ? p->threads : 1;
}

/* Runs the loop the fields describe on every thread, the caller's share
 * included; returns when all are done. */
static void run_loop(kn_pool *p) {
  atomic_store_explicit(&p->busy, p->threads - 1, memory_order_relaxed);
  pthread_mutex_lock(&p->lock_loop);
  atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
  if (p->sleepers > 0) pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->lock_loop);
  run_range(p, 0);
  if (spin_until(p, 0, 1)) return;
  pthread_mutex_lock(&p->lock_loop);
  while (atomic_load(&p->busy) > 0) pthread_cond_wait(&p->done, &p->lock_loop);
  pthread_mutex_unlock(&p->lock_loop);
}

/* Sets up a loop over [0, n): one range a thread where n is at most the
 * threads (each index a task of its own), else shared by take. */
static void set_loop(kn_pool *p, int64_t n, int64_t grain, void *ctx) {
  p->ctx = ctx;
  p->n = n;
  p->grain = grain < 1 ? 1 : grain;
  p->shared = n > p->threads && n <= INT32_MAX;
  for (int t = 0; t < p->threads && p->shared; t++)
    atomic_store_explicit(&p->owned[t].range, PACK(n * t / p->threads, n * (t + 1) / p->threads),
                          memory_order_relaxed);
}

void kn_pool_for(kn_pool *p, int64_t n, kn_range_fn fn, void *ctx) {
  if (!p || n < 2) {
    if (n > 0) fn(ctx, 0, n);
    return;
  }
  p->fn = fn;
  p->share_fn = NULL;
  set_loop(p, n, 1, ctx);
  run_loop(p);
}

void kn_pool_share(kn_pool *p, int64_t n, int64_t grain, kn_share_fn fn, void *ctx) {
  if (!p || n < 2) {
    if (n > 0) fn(ctx, 0, 0, n);
    return;
  }
  p->fn = NULL;
  p->share_fn = fn;
  set_loop(p, n, grain, ctx);
  run_loop(p);
}
