/* stream.c — this machine's memory bandwidth, STREAM-style: copy (a = b)
 * and triad (a = b + s * c) over float arrays far larger than the caches,
 * at 1 and 2 threads (each thread first touches, then works on, its own
 * slice). Bytes count as STREAM counts them: copy moves 2 arrays, triad 3,
 * write-allocate traffic not counted. Prints one JSON line in GB/s (1e9
 * bytes), the best of REPS passes. bench/zoo.py compares the engine's
 * memory-bound nodes with these figures. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define N_FLOATS    (24L << 20) /* 96 MiB an array, 288 MiB in all */
#define REPS        10
#define MAX_THREADS 2

typedef struct slice {
  float *a, *b, *c;
  long begin, end;
  int kernel; /* 0 first touch, 1 copy, 2 triad */
  pthread_barrier_t *start, *done;
} slice;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void run_kernel(const slice *s) {
  float *restrict a = s->a;
  const float *restrict b = s->b, *restrict c = s->c;
  const float scalar = 3.0f;
  if (s->kernel == 0) {
    for (long i = s->begin; i < s->end; i++) s->a[i] = 0.0f, s->b[i] = 1.0f, s->c[i] = 2.0f;
  } else if (s->kernel == 1) {
    for (long i = s->begin; i < s->end; i++) a[i] = b[i];
  } else {
    for (long i = s->begin; i < s->end; i++) a[i] = b[i] + scalar * c[i];
  }
}

/* A worker thread: waits at the start barrier, runs its slice, meets the
 * others at the done barrier; kernel -1 ends it. */
static void *worker(void *arg) {
  slice *s = arg;
  for (;;) {
    pthread_barrier_wait(s->start);
    if (s->kernel < 0) return NULL;
    run_kernel(s);
    pthread_barrier_wait(s->done);
  }
}

/* Best GB/s of REPS passes of copy and triad over n_threads threads. */
static int measure(int n_threads, double *copy_gbs, double *triad_gbs) {
  float *a = malloc(N_FLOATS * sizeof *a), *b = malloc(N_FLOATS * sizeof *b),
        *c = malloc(N_FLOATS * sizeof *c);
  pthread_barrier_t start, done;
  slice slices[MAX_THREADS];
  pthread_t threads[MAX_THREADS];
  int status = -1, started = 0;
  if (!a || !b || !c) {
    fprintf(stderr, "kiln-bench-stream: out of memory for 3 x %ld floats\n", N_FLOATS);
    goto out;
  }
  pthread_barrier_init(&start, NULL, (unsigned)n_threads);
  pthread_barrier_init(&done, NULL, (unsigned)n_threads);
  for (int t = 0; t < n_threads; t++) {
    slices[t] = (slice){a, b,      c,    N_FLOATS * t / n_threads, N_FLOATS * (t + 1) / n_threads,
                        0, &start, &done};
  }
  /* Thread 0 is this one; the others wait at the barriers. */
  for (int t = 1; t < n_threads; t++) {
    if (pthread_create(&threads[t], NULL, worker, &slices[t]) != 0) {
      fprintf(stderr, "kiln-bench-stream: cannot start thread %d\n", t);
      goto stop;
    }
    started = t;
  }
  double best[3] = {0.0, 1e30, 1e30};
  for (int kernel = 0; kernel <= 2; kernel++) {
    for (int rep = 0; rep < (kernel == 0 ? 1 : REPS); rep++) {
      for (int t = 0; t < n_threads; t++) slices[t].kernel = kernel;
      double t0 = now();
      pthread_barrier_wait(&start);
      run_kernel(&slices[0]);
      pthread_barrier_wait(&done);
      double secs = now() - t0;
      if (secs < best[kernel]) best[kernel] = secs;
    }
  }
  *copy_gbs = 2.0 * N_FLOATS * sizeof(float) / best[1] / 1e9;
  *triad_gbs = 3.0 * N_FLOATS * sizeof(float) / best[2] / 1e9;
  status = 0;
stop:
  for (int t = 0; t < n_threads; t++) slices[t].kernel = -1;
  if (started > 0) pthread_barrier_wait(&start);
  for (int t = 1; t <= started; t++) pthread_join(threads[t], NULL);
  pthread_barrier_destroy(&start);
  pthread_barrier_destroy(&done);
out:
  free(a);
  free(b);
  free(c);
  return status;
}

int main(void) {
  double copy[MAX_THREADS + 1], triad[MAX_THREADS + 1];
  for (int t = 1; t <= MAX_THREADS; t++) {
    if (measure(t, &copy[t], &triad[t]) != 0) return 1;
  }
  printf("{\"array_mib\":%.0f,\"copy_gbs\":[%.2f,%.2f],\"triad_gbs\":[%.2f,%.2f]}\n",
         N_FLOATS * sizeof(float) / 1048576.0, copy[1], copy[2], triad[1], triad[2]);
  return 0;
}
