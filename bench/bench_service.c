/* bench_service.c — the service's hot paths, one run each, printed as
 * key=value lines for bench/service.sh:
 *   store: metric points appended per second in the scheduler's batches;
 *          jobs created per second in the store alone (SPEC.json's text);
 *   http:  jobs created per second through POST /v1/jobs on one keep-alive
 *          connection (with --url and --token of a running kilnd). */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "storage.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int bench_store(const char *dir, const char *spec) {
  char path[512], err[512];
  snprintf(path, sizeof path, "%s/bench.db", dir);
  store *st = NULL;
  if (store_open(path, &st, err, sizeof err) != STORE_OK) {
    fprintf(stderr, "bench: %s\n", err);
    return 1;
  }
  /* Ingestion: 400,000 points of one job in batches of 512, as flushed. */
  store_job job;
  memset(&job, 0, sizeof job);
  snprintf(job.id, sizeof job.id, "ingest");
  job.spec_json = "{}";
  if (store_job_create(st, &job, NULL) != STORE_OK) return 1;
  enum { BATCH = 512, POINTS = 400000 };
  store_metric *batch = calloc(BATCH, sizeof *batch);
  double t0 = now_s();
  for (int done = 0; done < POINTS; done += BATCH) {
    for (int i = 0; i < BATCH; i++) {
      batch[i].attempt = 1;
      batch[i].step = (done + i) / 4;
      batch[i].value = 0.5;
      static const char *names[] = {"loss", "accuracy", "val_loss", "val_accuracy"};
      snprintf(batch[i].name, sizeof batch[i].name, "%s", names[(done + i) % 4]);
      batch[i].time_ms = 1;
    }
    if (store_metrics_append(st, "ingest", batch, BATCH) != STORE_OK) {
      fprintf(stderr, "bench: %s\n", store_errmsg(st));
      return 1;
    }
  }
  double ingest_s = now_s() - t0;
  free(batch);
  printf("metric_points_per_s=%.0f\n", POINTS / ingest_s);

  /* Creation in the store alone: 10,000 jobs with the example's canonical
   * spec (about 1 KiB), each its own transaction with its CREATED event, as
   * POST /v1/jobs makes them. */
  const char *spec_text = spec ? spec : "{}";
  t0 = now_s();
  enum { CREATES = 10000 };
  for (int i = 0; i < CREATES; i++) {
    memset(&job, 0, sizeof job);
    snprintf(job.id, sizeof job.id, "q%05d", i);
    snprintf(job.tenant, sizeof job.tenant, "tenant-%d", i % 10);
    job.spec_json = (char *)spec_text;
    job.priority = 10 * (i % 5);
    if (store_job_create(st, &job, NULL) != STORE_OK) return 1;
  }
  printf("store_jobs_created_per_s=%.0f\n", CREATES / (now_s() - t0));
  store_close(st);
  return 0;
}

static size_t discard(char *p, size_t s, size_t n, void *u) {
  (void)p;
  (void)u;
  return s * n;
}

static int bench_http(const char *url, const char *token, const char *spec, int n) {
  CURL *c = curl_easy_init();
  char endpoint[512], auth[256];
  snprintf(endpoint, sizeof endpoint, "%s/v1/jobs", url);
  snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
  struct curl_slist *h = curl_slist_append(NULL, auth);
  h = curl_slist_append(h, "Content-Type: application/json");
  h = curl_slist_append(h, "Expect:");
  curl_easy_setopt(c, CURLOPT_URL, endpoint);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, spec);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
  double t0 = now_s();
  for (int i = 0; i < n; i++) {
    long status = 0;
    if (curl_easy_perform(c) != CURLE_OK) return 1;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200) {
      fprintf(stderr, "bench: create answered %ld\n", status);
      return 1;
    }
  }
  printf("jobs_created_per_s=%.0f\n", n / (now_s() - t0));
  curl_slist_free_all(h);
  curl_easy_cleanup(c);
  return 0;
}

static char *read_spec(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  static char spec[65536];
  size_t len = fread(spec, 1, sizeof spec - 1, f);
  fclose(f);
  spec[len] = '\0';
  return spec;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "store") == 0) {
    char *spec = read_spec(argv[3]);
    return spec ? bench_store(argv[2], spec) : 2;
  }
  if (argc == 6 && strcmp(argv[1], "http") == 0) {
    char *spec = read_spec(argv[4]);
    if (!spec) return 2;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    int rc = bench_http(argv[2], argv[3], spec, atoi(argv[5]));
    curl_global_cleanup();
    return rc;
  }
  fprintf(stderr, "usage: bench_service store DIR SPEC.json | http URL TOKEN SPEC.json N\n");
  return 2;
}
