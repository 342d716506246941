/* The thread pool's loops (engine/pool.c): every unit runs exactly once,
 * whichever thread is slow; a thread that finishes its own share takes
 * over a slow one's tail; no two ranges running at once share a slot; and
 * a loop of no more units than threads gives each unit a call of its own. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "graph_internal.h"

#define UNITS   600
#define THREADS 3

typedef struct loop_log {
  _Atomic int runs[UNITS];           /* times each unit ran */
  _Atomic int ran_by_slot[UNITS];    /* the slot that ran it, plus 1 */
  _Atomic int in_use[THREADS];       /* a range of the slot is running */
  _Atomic int overlapping;           /* a slot ran two ranges at once */
  _Atomic int64_t shortest, longest; /* range lengths */
  int64_t grain;                     /* the loop's */
  _Atomic int short_ranges;          /* ranges shorter than it */
  int slow_slot;                     /* this slot sleeps a while a range */
  pthread_t caller;                  /* for kn_pool_for: the slow thread */
} loop_log;

static void nap(void) {
  const struct timespec ts = {0, 300000}; /* 0.3 ms */
  nanosleep(&ts, NULL);
}

static void note_range(loop_log *l, int slot, int64_t b, int64_t e) {
  for (int64_t u = b; u < e; u++) {
    atomic_fetch_add(&l->runs[u], 1);
    atomic_store(&l->ran_by_slot[u], slot + 1);
  }
  const int64_t len = e - b;
  if (len < l->grain) atomic_fetch_add(&l->short_ranges, 1);
  int64_t s = atomic_load(&l->shortest);
  while (len < s && !atomic_compare_exchange_weak(&l->shortest, &s, len)) {
  }
  s = atomic_load(&l->longest);
  while (len > s && !atomic_compare_exchange_weak(&l->longest, &s, len)) {
  }
}

static void shared_range(void *ctx, int slot, int64_t b, int64_t e) {
  loop_log *l = ctx;
  assert_true(slot >= 0 && slot < THREADS);
  if (atomic_exchange(&l->in_use[slot], 1)) atomic_store(&l->overlapping, 1);
  if (slot == l->slow_slot) nap();
  note_range(l, slot, b, e);
  atomic_store(&l->in_use[slot], 0);
}

static void log_init(loop_log *l, int slow_slot) {
  memset(l, 0, sizeof *l);
  atomic_store(&l->shortest, INT64_MAX);
  l->slow_slot = slow_slot;
  l->caller = pthread_self();
}

static void each_unit_once(loop_log *l, int64_t n) {
  for (int64_t u = 0; u < n; u++)
    if (atomic_load(&l->runs[u]) != 1)
      fail_msg("unit %lld ran %d times", (long long)u, atomic_load(&l->runs[u]));
}

/* Units of the slow slot's own share (the first third) run on others. */
static int taken_over(loop_log *l, int slow_slot, int64_t n) {
  int others = 0;
  const int64_t b = n * slow_slot / THREADS, e = n * (slow_slot + 1) / THREADS;
  for (int64_t u = b; u < e; u++) others += atomic_load(&l->ran_by_slot[u]) != slow_slot + 1;
  return others;
}

static void a_slow_threads_share_is_taken_over_and_runs_once(void **state) {
  (void)state;
  kn_pool *p = kn_pool_new(THREADS);
  assert_non_null(p);
  static loop_log l;
  for (int slow = 0; slow < THREADS; slow++) {
    log_init(&l, slow);
    kn_pool_share(p, UNITS, 4, shared_range, &l);
    each_unit_once(&l, UNITS);
    assert_int_equal(atomic_load(&l.overlapping), 0);
    /* the slow slot takes a quarter of its share at a time and naps each
     * time: the others, done with theirs, take over the rest of it */
    if (taken_over(&l, slow, UNITS) == 0)
      fail_msg("no unit of slow slot %d's share ran on another slot", slow);
  }
  /* the same at the pace the threads keep: still once each */
  log_init(&l, -1);
  kn_pool_share(p, UNITS, 1, shared_range, &l);
  each_unit_once(&l, UNITS);
  assert_int_equal(atomic_load(&l.overlapping), 0);
  kn_pool_free(p);
}

static void ranges_hold_at_least_the_grain_while_it_is_left(void **state) {
  (void)state;
  kn_pool *p = kn_pool_new(THREADS);
  assert_non_null(p);
  static loop_log l;
  /* a range shorter than the grain takes all that was left of a share,
   * so there is at most one a thread's share */
  for (int slow = -1; slow < THREADS; slow++) {
    log_init(&l, slow);
    l.grain = 8;
    kn_pool_share(p, 359, 8, shared_range, &l);
    each_unit_once(&l, 359);
    assert_true(atomic_load(&l.short_ranges) <= THREADS);
    assert_true(atomic_load(&l.longest) <= 359 / THREADS + 1);
  }
  kn_pool_free(p);
  /* no pool: one range, slot 0 */
  log_init(&l, -1);
  kn_pool_share(NULL, 50, 8, shared_range, &l);
  each_unit_once(&l, 50);
  assert_int_equal(atomic_load(&l.shortest), 50);
  assert_int_equal(atomic_load(&l.ran_by_slot[49]), 1);
}

static void plain_range(void *ctx, int64_t b, int64_t e) {
  loop_log *l = ctx;
  const int caller = pthread_equal(pthread_self(), l->caller);
  if (caller && l->slow_slot == 0) nap();
  note_range(l, caller ? 0 : 1, b, e);
}

static void a_plain_loop_runs_each_index_once(void **state) {
  (void)state;
  kn_pool *p = kn_pool_new(THREADS);
  assert_non_null(p);
  static loop_log l;
  log_init(&l, 0); /* the calling thread is the slow one */
  kn_pool_for(p, UNITS, plain_range, &l);
  each_unit_once(&l, UNITS);
  if (taken_over(&l, 0, UNITS) == 0) fail_msg("the caller's share never ran on a worker");
  /* no more indices than threads: a call each, one index long */
  log_init(&l, -1);
  kn_pool_for(p, THREADS, plain_range, &l);
  each_unit_once(&l, THREADS);
  assert_int_equal(atomic_load(&l.longest), 1);
  kn_pool_free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_slow_threads_share_is_taken_over_and_runs_once),
      cmocka_unit_test(ranges_hold_at_least_the_grain_while_it_is_left),
      cmocka_unit_test(a_plain_loop_runs_each_index_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
