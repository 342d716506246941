/* sched_pass.c — times one scheduling pass over a queue of 10,000 jobs
 * (and other sizes): fair-share ordering across tenants, gang placement,
 * the reservation and backfill checks, with a busy pool so almost every job
 * waits. Prints the median and best of many passes; then what reading
 * those 10,000 jobs from the store (kilnd does it before each pass) costs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <unistd.h>

#include "scheduler.h"
#include "storage.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void bench(int n_jobs, int n_tenants) {
  enum { RUNNING = 48, PASSES = 200 };
  sched_pool pools[2];
  memset(pools, 0, sizeof pools);
  snprintf(pools[0].name, sizeof pools[0].name, "default");
  snprintf(pools[0].device_type, sizeof pools[0].device_type, "cpu");
  snprintf(pools[1].name, sizeof pools[1].name, "big");
  snprintf(pools[1].device_type, sizeof pools[1].device_type, "cpu");
  pools[0].n_devices = 64;
  pools[1].n_devices = 64;
  sched_job_req *queue = malloc((size_t)n_jobs * sizeof *queue);
  int64_t *starts = calloc((size_t)n_tenants, sizeof *starts);
  sched_running_req running[RUNNING];
  sched_planner *pl = sched_planner_new();
  double *times = malloc(PASSES * sizeof *times);
  if (!queue || !starts || !pl || !times) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  srand(42);
  for (int t = 0; t < n_tenants; t++) starts[t] = rand() % 20;
  int checksum = 0;
  for (int pass = 0; pass < PASSES; pass++) {
    /* Every pass sees the queue afresh, as the daemon's does. Priorities
     * in a few bands, highest first, oldest first within one. */
    for (int i = 0; i < n_jobs; i++) {
      sched_job_req *q = &queue[i];
      memset(q, 0, sizeof *q);
      q->priority = 90 - (i * 5 / n_jobs) * 20;
      q->pool = i % 7 == 0;
      q->devices = 1 + (i % 13 == 0) * 7;
      q->tenant = (i * 7919) % n_tenants;
      q->seq = i + 1;
      q->max_runtime_ms = (i % 3) ? 60000 * (1 + i % 10) : 0;
    }
    for (int r = 0; r < RUNNING; r++) {
      memset(&running[r], 0, sizeof running[r]);
      running[r].pool = r % 2;
      running[r].devices = 2;
      running[r].priority = 50;
      running[r].end_by_ms = (r % 4) ? 1000000 + 30000 * r : INT64_MAX;
    }
    sched_pass p = {.pools = pools,
                    .n_pools = 2,
                    .running = running,
                    .n_running = RUNNING,
                    .queue = queue,
                    .n_queue = n_jobs,
                    .tenant_starts = starts,
                    .n_tenants = n_tenants,
                    .now_ms = 1000000,
                    .preempt = 1};
    double t0 = now_us();
    if (sched_plan(pl, &p) != 0) {
      fprintf(stderr, "pass failed\n");
      exit(1);
    }
    times[pass] = now_us() - t0;
    checksum += p.n_started + p.n_preempted;
  }
  qsort(times, PASSES, sizeof *times, cmp_double);
  printf("queued=%-6d tenants=%-3d pass: median %.3f ms, best %.3f ms  (%d passes; %d placed)\n",
         n_jobs, n_tenants, times[PASSES / 2] / 1000, times[0] / 1000, PASSES, checksum / PASSES);
  free(queue);
  free(starts);
  free(times);
  sched_planner_free(pl);
}

/* The daemon's pass first reads the queue from SQLite: time that too. */
static void bench_queue_read(int n_jobs) {
  char dir[] = "/tmp/kiln-bench-sched-XXXXXX", path[64], err[256];
  if (!mkdtemp(dir)) return;
  snprintf(path, sizeof path, "%s/kiln.db", dir);
  store *st;
  if (store_open(path, &st, err, sizeof err) != STORE_OK) {
    fprintf(stderr, "%s\n", err);
    return;
  }
  for (int i = 0; i < n_jobs; i++) {
    store_job job;
    memset(&job, 0, sizeof job);
    snprintf(job.id, sizeof job.id, "job-%06d", i);
    snprintf(job.tenant, sizeof job.tenant, "tenant-%d", i % 8);
    job.priority = 10 + i % 5 * 20;
    job.devices = 1 + (i % 13 == 0);
    if (store_job_create(st, &job, NULL) != STORE_OK) break;
  }
  store_queued *queue = NULL;
  int n = 0, cap = 0;
  double best = 1e18, total = 0;
  for (int k = 0; k < 20; k++) {
    double t0 = now_us();
    store_job_queue_load(st, &queue, &n, &cap);
    double t = now_us() - t0;
    total += t;
    if (t < best) best = t;
  }
  printf("queued=%-6d store read of the queue: mean %.3f ms, best %.3f ms (%d rows)\n", n_jobs,
         total / 20 / 1000, best / 1000, n);
  free(queue);
  store_close(st);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void) {
  bench(1000, 4);
  bench(10000, 1);
  bench(10000, 8);
  bench(10000, 64);
  bench(100000, 8);
  bench_queue_read(10000);
  return 0;
}
