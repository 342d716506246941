/* test_store.c — storage/ against a real SQLite file in a fresh mkdtemp
 * directory per test: migrations, jobs and their events, claims, recovery,
 * metrics, checkpoints, threads and WAL. A second raw sqlite3 connection
 * checks what the store wrote, so no test trusts the store to grade itself. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "storage.h"

typedef struct fixture {
  char dir[256];
  char path[320];
  store *s;
} fixture;

static void remove_dir(fixture *f) {
  const char *suffixes[] = {"", "-wal", "-shm", "-journal"};
  for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
    char file[400];
    snprintf(file, sizeof file, "%s%s", f->path, suffixes[i]);
    unlink(file);
  }
  rmdir(f->dir);
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  if (!f) return -1;
  const char *tmp = getenv("TMPDIR");
  snprintf(f->dir, sizeof f->dir, "%s/kiln-store-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(f->dir)) {
    free(f);
    return -1;
  }
  snprintf(f->path, sizeof f->path, "%s/kiln.db", f->dir);
  char err[512];
  if (store_open(f->path, &f->s, err, sizeof err) != STORE_OK) {
    fprintf(stderr, "setup: %s\n", err);
    remove_dir(f);
    free(f);
    return -1;
  }
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  store_close(f->s);
  remove_dir(f);
  free(f);
  return 0;
}

/* ---- helpers ----------------------------------------------------------- */

static store_job make_job(const char *id, const char *request_id, int priority) {
  store_job job;
  memset(&job, 0, sizeof job);
  snprintf(job.id, sizeof job.id, "%s", id);
  snprintf(job.request_id, sizeof job.request_id, "%s", request_id ? request_id : "");
  snprintf(job.display_name, sizeof job.display_name, "name of %s", id);
  job.spec_json = "{\"epochs\":1}";
  job.priority = priority;
  return job;
}

static void create_job(store *s, const char *id, int priority) {
  store_job job = make_job(id, NULL, priority);
  int rc = store_job_create(s, &job, NULL);
  if (rc != STORE_OK) fail_msg("create %s: %d %s", id, rc, store_errmsg(s));
}

static void expect_state(store *s, const char *id, const char *state) {
  store_job job;
  assert_int_equal(store_job_get(s, id, &job), STORE_OK);
  assert_string_equal(job.state, state);
  store_job_clear(&job);
}

/* One integer from constant SQL on a second, independent connection. */
static int64_t raw_int(const char *path, const char *sql) {
  sqlite3 *db = NULL;
  sqlite3_stmt *st = NULL;
  assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
    fail_msg("%s: %s", sql, sqlite3_errmsg(db));
  assert_int_equal(sqlite3_step(st), SQLITE_ROW);
  int64_t value = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  return value;
}

static void raw_text(const char *path, const char *sql, char *buf, size_t len) {
  sqlite3 *db = NULL;
  sqlite3_stmt *st = NULL;
  assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
    fail_msg("%s: %s", sql, sqlite3_errmsg(db));
  buf[0] = '\0';
  while (sqlite3_step(st) == SQLITE_ROW) {
    size_t used = strlen(buf);
    snprintf(buf + used, len - used, "%s\n", (const char *)sqlite3_column_text(st, 0));
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
}

static void raw_exec(const char *path, const char *sql) {
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  char *err = NULL;
  if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK) fail_msg("%s: %s", sql, err);
  sqlite3_close(db);
}

/* ---- schema and open --------------------------------------------------- */

/* A write through any handle of the process moves the generation that a
 * reader caching what it read compares; reads leave it alone. */
static void generation_moves_with_every_write_through_any_handle(void **state) {
  fixture *f = *state;
  store *other = NULL;
  char err[256];
  assert_int_equal(store_open(f->path, &other, err, sizeof err), STORE_OK);
  uint64_t g0 = store_generation(f->s);
  create_job(f->s, "gen-a", 50);
  uint64_t g1 = store_generation(f->s);
  assert_true(g1 != g0);
  store_job job;
  assert_int_equal(store_job_get(other, "gen-a", &job), STORE_OK);
  store_job_clear(&job);
  assert_true(store_generation(f->s) == g1); /* a read changes nothing */
  create_job(other, "gen-b", 50);            /* another handle's write */
  assert_true(store_generation(f->s) != g1);
  assert_true(store_generation(other) == store_generation(f->s));
  store_close(other);
}

static void fresh_open_migrates_to_latest_and_reopen_is_a_noop(void **state) {
  fixture *f = *state;
  assert_int_equal(store_schema_version(f->s), STORE_SCHEMA_VERSION);
  assert_true(STORE_SCHEMA_VERSION >= 3);
  assert_int_equal(raw_int(f->path, "SELECT count(*) FROM schema_version"), STORE_SCHEMA_VERSION);
  const char *tables[] = {"jobs",   "job_events", "metrics", "checkpoints",
                          "tokens", "workers",    "datasets"};
  for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
    char sql[160];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '%s'", tables[i]);
    assert_int_equal(raw_int(f->path, sql), 1);
  }
  int64_t applied = raw_int(f->path, "SELECT applied_ms FROM schema_version WHERE version = 1");
  assert_true(applied > 0);
  create_job(f->s, "survivor", 0);

  store_close(f->s);
  f->s = NULL;
  char err[512];
  assert_int_equal(store_open(f->path, &f->s, err, sizeof err), STORE_OK);
  assert_int_equal(store_schema_version(f->s), STORE_SCHEMA_VERSION);
  assert_int_equal(raw_int(f->path, "SELECT count(*) FROM schema_version"), STORE_SCHEMA_VERSION);
  assert_int_equal(raw_int(f->path, "SELECT applied_ms FROM schema_version WHERE version = 1"),
                   applied);
  expect_state(f->s, "survivor", "QUEUED");
}

static void newer_schema_version_is_refused_and_left_untouched(void **state) {
  fixture *f = *state;
  store_close(f->s);
  f->s = NULL;
  char newer[128];
  snprintf(newer, sizeof newer, "INSERT INTO schema_version(version, applied_ms) VALUES (%d, 1)",
           STORE_SCHEMA_VERSION + 1);
  raw_exec(f->path, newer);

  char err[512] = "";
  store *s = (store *)(uintptr_t)1; /* must be reset to NULL on failure */
  assert_int_equal(store_open(f->path, &s, err, sizeof err), STORE_ERROR);
  assert_null(s);
  char expected[64];
  snprintf(expected, sizeof expected, "schema version %d is newer", STORE_SCHEMA_VERSION + 1);
  assert_non_null(strstr(err, expected));
  assert_non_null(strstr(err, f->path));
  assert_non_null(strstr(err, "never downgrades"));
  assert_int_equal(raw_int(f->path, "SELECT max(version) FROM schema_version"),
                   STORE_SCHEMA_VERSION + 1);
  assert_int_equal(raw_int(f->path, "SELECT count(*) FROM schema_version"),
                   STORE_SCHEMA_VERSION + 1);
}

static void open_of_unwritable_path_fails_with_a_sentence(void **state) {
  fixture *f = *state;
  char path[400], err[512] = "";
  snprintf(path, sizeof path, "%s/no/such/dir/kiln.db", f->dir);
  store *s = NULL;
  assert_int_equal(store_open(path, &s, err, sizeof err), STORE_ERROR);
  assert_null(s);
  assert_non_null(strstr(err, "open database"));
  assert_non_null(strstr(err, path));
  /* And the NULL-safe frees, which have nothing else to prove. */
  store_close(NULL);
  store_job_clear(NULL);
  store_job_list_free(NULL, 3);
  store_event_list_free(NULL, 3);
  store_checkpoint_list_free(NULL, 3);
}

static void database_is_in_wal_mode_with_foreign_keys_enforced(void **state) {
  fixture *f = *state;
  char mode[32];
  raw_text(f->path, "PRAGMA journal_mode", mode, sizeof mode);
  assert_string_equal(mode, "wal\n");
  /* foreign_keys is per connection: prove it on the store's own by the
   * foreign key refusing a checkpoint of a job that does not exist. */
  store_checkpoint c;
  memset(&c, 0, sizeof c);
  snprintf(c.job_id, sizeof c.job_id, "ghost");
  snprintf(c.path, sizeof c.path, "/ckpt/ghost.safetensors");
  assert_int_equal(store_checkpoint_add(f->s, &c), STORE_NOT_FOUND);
  assert_int_equal(raw_int(f->path, "SELECT count(*) FROM checkpoints"), 0);
}

static void queue_query_is_served_by_the_queue_index(void **state) {
  fixture *f = *state;
  char plan[512] = "";
  /* Column 3 of EXPLAIN QUERY PLAN is the detail ("SEARCH jobs USING INDEX ..."). */
  sqlite3 *db = NULL;
  sqlite3_stmt *st = NULL;
  assert_int_equal(sqlite3_open_v2(f->path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_prepare_v2(db,
                                      "EXPLAIN QUERY PLAN SELECT seq, id, tenant, pool, priority,"
                                      " devices, max_runtime_s, not_before_ms FROM jobs"
                                      " WHERE state = 'QUEUED' ORDER BY priority DESC, seq",
                                      -1, &st, NULL),
                   SQLITE_OK);
  while (sqlite3_step(st) == SQLITE_ROW) {
    size_t used = strlen(plan);
    snprintf(plan + used, sizeof plan - used, "%s\n", (const char *)sqlite3_column_text(st, 3));
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  assert_non_null(strstr(plan, "COVERING INDEX jobs_queue"));
  assert_null(strstr(plan, "TEMP B-TREE")); /* no sort: the index gives the order */
}

static void queue_load_reads_every_queued_job_in_order_and_claim_takes_one(void **state) {
  fixture *f = *state;
  store_job job = make_job("low", NULL, 10);
  snprintf(job.pool, sizeof job.pool, "big");
  job.devices = 4;
  job.max_runtime_s = 60;
  assert_int_equal(store_job_create(f->s, &job, NULL), STORE_OK);
  create_job(f->s, "high", 90);
  create_job(f->s, "high-later", 90);
  store_queued *q = NULL;
  int n = 0, cap = 0;
  assert_int_equal(store_job_queue_load(f->s, &q, &n, &cap), STORE_OK);
  assert_int_equal(n, 3);
  assert_string_equal(q[0].id, "high");
  assert_string_equal(q[1].id, "high-later");
  assert_string_equal(q[2].id, "low");
  assert_string_equal(q[0].pool, "default");
  assert_int_equal(q[0].devices, 1);
  assert_string_equal(q[2].pool, "big");
  assert_int_equal(q[2].devices, 4);
  assert_int_equal(q[2].max_runtime_s, 60);
  store_job claimed;
  assert_int_equal(store_job_claim(f->s, "low", &claimed), STORE_OK);
  assert_string_equal(claimed.state, "STARTING");
  assert_int_equal(claimed.attempt, 1);
  assert_string_equal(claimed.pool, "big");
  store_job_clear(&claimed);
  assert_int_equal(store_job_claim(f->s, "low", NULL), STORE_CONFLICT);
  assert_int_equal(store_job_queue_load(f->s, &q, &n, &cap), STORE_OK); /* reuses the array */
  assert_int_equal(n, 2);
  free(q);
}

static long long file_size(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? (long long)sb.st_size : -1;
}

static long long wal_size(const fixture *f) {
  char wal[400];
  snprintf(wal, sizeof wal, "%s-wal", f->path);
  return file_size(wal);
}

/* With the commit hook in place the writer never checkpoints; only the
 * worker can have copied the log into the database file. */
static void background_checkpoints_copy_the_log_into_the_database(void **state) {
  fixture *f = *state;
  assert_int_equal(store_checkpoint_in_background(f->s), STORE_OK);
  create_job(f->s, "big", 50);
  long long before = file_size(f->path);
  static store_metric batch[512];
  for (int k = 0; k < 100; k++) { /* 51,200 points: about 2,000 pages of log */
    for (int i = 0; i < 512; i++) {
      memset(&batch[i], 0, sizeof batch[i]);
      batch[i].attempt = 1;
      batch[i].step = k * 512 + i;
      snprintf(batch[i].name, sizeof batch[i].name, "a_rather_long_metric_name_%d", i % 7);
    }
    assert_int_equal(store_metrics_append(f->s, "big", batch, 512), STORE_OK);
  }
  long long after = before;
  for (int i = 0; i < 100 && after < before + 1000000; i++) {
    usleep(50 * 1000);
    after = file_size(f->path);
  }
  if (after < before + 1000000)
    fail_msg("db %lld -> %lld bytes, wal %lld", before, after, wal_size(f));
  store_metric *points = NULL;
  int n = 0;
  assert_int_equal(store_metrics_list(f->s, "big", NULL, &points, &n), STORE_OK);
  assert_int_equal(n, 100 * 512);
  free(points);
}

/* ---- jobs -------------------------------------------------------------- */

static void create_then_get_round_trips_every_field(void **state) {
  fixture *f = *state;
  store_job job = make_job("job-abc", "req-1", 42);
  job.spec_json = "{\"model\":{\"layers\":[]},\"epochs\":5}";
  job.message = "submitted by ci";
  job.create_ms = 1700000000123;
  assert_int_equal(store_job_create(f->s, &job, NULL), STORE_OK);

  store_job got;
  assert_int_equal(store_job_get(f->s, "job-abc", &got), STORE_OK);
  assert_true(got.seq > 0);
  assert_string_equal(got.id, "job-abc");
  assert_string_equal(got.request_id, "req-1");
  assert_string_equal(got.display_name, "name of job-abc");
  assert_string_equal(got.spec_json, "{\"model\":{\"layers\":[]},\"epochs\":5}");
  assert_string_equal(got.state, "QUEUED");
  assert_string_equal(got.reason, "CREATED");
  assert_string_equal(got.message, "submitted by ci");
  assert_int_equal(got.priority, 42);
  assert_int_equal(got.attempt, 0);
  assert_int_equal(got.create_ms, 1700000000123);
  assert_int_equal(got.start_ms, 0);
  assert_int_equal(got.end_ms, 0);
  store_job_clear(&got);
  assert_null(got.spec_json);
  assert_null(got.message);

  /* No message and no create time: "" and now. */
  store_job plain = make_job("job-plain", NULL, -3);
  int64_t before = store_now_ms();
  assert_int_equal(store_job_create(f->s, &plain, NULL), STORE_OK);
  assert_int_equal(store_job_get(f->s, "job-plain", &got), STORE_OK);
  assert_non_null(got.message);
  assert_string_equal(got.message, "");
  assert_string_equal(got.request_id, "");
  assert_int_equal(got.priority, -3);
  assert_in_range(got.create_ms, before, store_now_ms());
  store_job_clear(&got);
}

static void request_id_retry_returns_the_same_job_and_creates_one_row(void **state) {
  fixture *f = *state;
  store_job first = make_job("job-1", "req-retry", 5);
  assert_int_equal(store_job_create(f->s, &first, NULL), STORE_OK);

  store_job retry = make_job("job-2", "req-retry", 9);
  retry.spec_json = "{\"different\":true}";
  store_job existing;
  assert_int_equal(store_job_create(f->s, &retry, &existing), STORE_EXISTS);
  assert_string_equal(existing.id, "job-1");
  assert_string_equal(existing.spec_json, "{\"epochs\":1}");
  assert_int_equal(existing.priority, 5);
  assert_string_equal(existing.state, "QUEUED");
  store_job_clear(&existing);
  assert_non_null(strstr(store_errmsg(f->s), "req-retry"));
  /* existing may be NULL. */
  assert_int_equal(store_job_create(f->s, &retry, NULL), STORE_EXISTS);

  assert_int_equal(raw_int(f->path, "SELECT count(*) FROM jobs"), 1);
  assert_int_equal(raw_int(f->path, "SELECT count(*) FROM job_events"), 1);
  store_job missing;
  assert_int_equal(store_job_get(f->s, "job-2", &missing), STORE_NOT_FOUND);

  /* Jobs without a request_id never collide with one another. */
  create_job(f->s, "no-rid-a", 0);
  create_job(f->s, "no-rid-b", 0);
  assert_int_equal(raw_int(f->path, "SELECT count(*) FROM jobs WHERE request_id IS NULL"), 2);
}

static void duplicate_job_id_fails_naming_the_job_and_the_cause(void **state) {
  fixture *f = *state;
  create_job(f->s, "abc", 0);
  store_job again = make_job("abc", NULL, 0);
  assert_int_equal(store_job_create(f->s, &again, NULL), STORE_ERROR);
  const char *msg = store_errmsg(f->s);
  assert_non_null(strstr(msg, "insert job abc"));
  assert_non_null(strstr(msg, "UNIQUE constraint failed"));
  /* The failed transaction left nothing behind, and the handle still works. */
  assert_int_equal(raw_int(f->path, "SELECT count(*) FROM job_events"), 1);
  create_job(f->s, "def", 0);

  store_job empty_id = make_job("", NULL, 0);
  assert_int_equal(store_job_create(f->s, &empty_id, NULL), STORE_ERROR);
}

static void get_of_unknown_job_is_not_found_with_its_id_in_errmsg(void **state) {
  fixture *f = *state;
  store_job job;
  assert_int_equal(store_job_get(f->s, "nope-42", &job), STORE_NOT_FOUND);
  assert_non_null(strstr(store_errmsg(f->s), "nope-42"));
}

static void list_pages_newest_first_and_covers_each_job_exactly_once(void **state) {
  fixture *f = *state;
  enum { N = 25, PAGE = 10 };
  for (int i = 0; i < N; i++) {
    char id[16];
    snprintf(id, sizeof id, "job-%02d", i);
    create_job(f->s, id, i % 4); /* priority must not affect list order */
  }
  int seen[N] = {0};
  int pages = 0, total = 0, expect_next = N - 1;
  int64_t before = 0, last_seq = INT64_MAX;
  int page_sizes[4] = {0};
  for (;;) {
    store_job *jobs = NULL;
    int n = -1;
    assert_int_equal(store_job_list(f->s, NULL, before, PAGE, &jobs, &n), STORE_OK);
    if (n == 0) {
      store_job_list_free(jobs, n);
      break;
    }
    assert_true(pages < 4);
    page_sizes[pages++] = n;
    for (int i = 0; i < n; i++) {
      int index = -1;
      assert_int_equal(sscanf(jobs[i].id, "job-%d", &index), 1);
      assert_int_equal(index, expect_next--); /* newest first */
      assert_true(jobs[i].seq < last_seq);
      last_seq = jobs[i].seq;
      assert_non_null(jobs[i].spec_json);
      seen[index]++;
      total++;
    }
    before = jobs[n - 1].seq;
    store_job_list_free(jobs, n);
  }
  assert_int_equal(pages, 3);
  assert_int_equal(page_sizes[0], 10);
  assert_int_equal(page_sizes[1], 10);
  assert_int_equal(page_sizes[2], 5);
  assert_int_equal(total, N);
  for (int i = 0; i < N; i++) assert_int_equal(seen[i], 1);

  store_job *jobs = NULL;
  int n = 0;
  assert_int_equal(store_job_list(f->s, NULL, 0, 0, &jobs, &n), STORE_ERROR);
  assert_non_null(strstr(store_errmsg(f->s), "limit"));
}

static void list_state_filter_pages_only_matching_jobs(void **state) {
  fixture *f = *state;
  enum { N = 25 };
  for (int i = 0; i < N; i++) {
    char id[16];
    snprintf(id, sizeof id, "job-%02d", i);
    create_job(f->s, id, 0);
    if (i % 3 == 0)
      assert_int_equal(store_job_transition(f->s, id, "QUEUED", "CANCELLED", "USER", ""), STORE_OK);
  }
  const char *filters[] = {"CANCELLED", "QUEUED"};
  for (int k = 0; k < 2; k++) {
    int seen[N] = {0};
    int total = 0, last_index = N;
    int64_t before = 0;
    for (;;) {
      store_job *jobs = NULL;
      int n = 0;
      assert_int_equal(store_job_list(f->s, filters[k], before, 4, &jobs, &n), STORE_OK);
      if (n == 0) break;
      for (int i = 0; i < n; i++) {
        int index = -1;
        assert_int_equal(sscanf(jobs[i].id, "job-%d", &index), 1);
        assert_string_equal(jobs[i].state, filters[k]);
        assert_int_equal(index % 3 == 0, k == 0);
        assert_true(index < last_index);
        last_index = index;
        seen[index]++;
        total++;
      }
      before = jobs[n - 1].seq;
      store_job_list_free(jobs, n);
    }
    assert_int_equal(total, k == 0 ? 9 : 16);
    for (int i = 0; i < N; i++) assert_int_equal(seen[i], (i % 3 == 0) == (k == 0) ? 1 : 0);
  }
  store_job *jobs = NULL;
  int n = -1;
  assert_int_equal(store_job_list(f->s, "RUNNING", 0, 10, &jobs, &n), STORE_OK);
  assert_int_equal(n, 0);
  store_job_list_free(jobs, n);
}

static void transition_from_wrong_state_is_a_conflict_and_changes_nothing(void **state) {
  fixture *f = *state;
  create_job(f->s, "j", 0);
  assert_int_equal(store_job_transition(f->s, "j", "RUNNING", "SUCCEEDED", "DONE", ""),
                   STORE_CONFLICT);
  assert_non_null(strstr(store_errmsg(f->s), "QUEUED"));
  store_job job;
  assert_int_equal(store_job_get(f->s, "j", &job), STORE_OK);
  assert_string_equal(job.state, "QUEUED");
  assert_string_equal(job.reason, "CREATED");
  assert_int_equal(job.end_ms, 0);
  store_job_clear(&job);
  assert_int_equal(raw_int(f->path, "SELECT count(*) FROM job_events"), 1);
}

static void transition_of_unknown_job_is_not_found(void **state) {
  fixture *f = *state;
  assert_int_equal(store_job_transition(f->s, "ghost", NULL, "CANCELLED", "USER", ""),
                   STORE_NOT_FOUND);
  assert_non_null(strstr(store_errmsg(f->s), "ghost"));
  assert_int_equal(raw_int(f->path, "SELECT count(*) FROM job_events"), 0);
}

static void transition_without_from_moves_only_unfinished_jobs(void **state) {
  fixture *f = *state;
  create_job(f->s, "j", 0);
  assert_int_equal(store_job_transition(f->s, "j", NULL, "CANCELLED", "USER", "by alice"),
                   STORE_OK);
  expect_state(f->s, "j", "CANCELLED");
  assert_int_equal(store_job_transition(f->s, "j", NULL, "RUNNING", "OOPS", ""), STORE_CONFLICT);
  expect_state(f->s, "j", "CANCELLED");
  /* An explicit from may leave a terminal state (resume), and clears end_ms. */
  assert_int_equal(store_job_transition(f->s, "j", "CANCELLED", "QUEUED", "RESUMED", ""), STORE_OK);
  store_job job;
  assert_int_equal(store_job_get(f->s, "j", &job), STORE_OK);
  assert_string_equal(job.state, "QUEUED");
  assert_int_equal(job.end_ms, 0);
  store_job_clear(&job);
}

static void transition_to_unknown_state_is_refused(void **state) {
  fixture *f = *state;
  create_job(f->s, "j", 0);
  assert_int_equal(store_job_transition(f->s, "j", NULL, "CANCELED", "USER", ""), STORE_ERROR);
  assert_non_null(strstr(store_errmsg(f->s), "CANCELED"));
  assert_int_equal(store_job_transition(f->s, "j", "WAITING", "RUNNING", "X", ""), STORE_ERROR);
  expect_state(f->s, "j", "QUEUED");
}

static void events_are_recorded_in_order_with_times_set(void **state) {
  fixture *f = *state;
  create_job(f->s, "j", 0);
  store_job claimed;
  assert_int_equal(store_job_claim_next(f->s, &claimed), STORE_OK);
  store_job_clear(&claimed);
  assert_int_equal(store_job_transition(f->s, "j", "STARTING", "RUNNING", "STARTED", "pid 7"),
                   STORE_OK);
  assert_int_equal(
      store_job_transition(f->s, "j", "RUNNING", "SUCCEEDED", "COMPLETED", "5 epochs done"),
      STORE_OK);

  store_event *events = NULL;
  int n = 0;
  assert_int_equal(store_event_list(f->s, "j", &events, &n), STORE_OK);
  assert_int_equal(n, 4);
  const char *from[] = {"", "QUEUED", "STARTING", "RUNNING"};
  const char *to[] = {"QUEUED", "STARTING", "RUNNING", "SUCCEEDED"};
  const char *reason[] = {"CREATED", "CLAIMED", "STARTED", "COMPLETED"};
  for (int i = 0; i < n; i++) {
    assert_string_equal(events[i].from_state, from[i]);
    assert_string_equal(events[i].to_state, to[i]);
    assert_string_equal(events[i].reason, reason[i]);
    assert_non_null(events[i].message);
    if (i > 0) assert_true(events[i].time_ms >= events[i - 1].time_ms);
  }
  assert_string_equal(events[2].message, "pid 7");
  assert_string_equal(events[3].message, "5 epochs done");
  store_event_list_free(events, n);

  store_job job;
  assert_int_equal(store_job_get(f->s, "j", &job), STORE_OK);
  assert_string_equal(job.state, "SUCCEEDED");
  assert_string_equal(job.reason, "COMPLETED");
  assert_string_equal(job.message, "5 epochs done");
  assert_true(job.start_ms >= job.create_ms);
  assert_true(job.end_ms >= job.start_ms);
  store_job_clear(&job);

  assert_int_equal(store_event_list(f->s, "ghost", &events, &n), STORE_OK);
  assert_int_equal(n, 0);
  store_event_list_free(events, n);
}

static void claim_takes_highest_priority_then_oldest_then_reports_empty(void **state) {
  fixture *f = *state;
  create_job(f->s, "low-old", 0);
  create_job(f->s, "high-old", 10);
  create_job(f->s, "mid", 5);
  create_job(f->s, "high-new", 10);
  create_job(f->s, "low-new", 0);
  const char *order[] = {"high-old", "high-new", "mid", "low-old", "low-new"};
  for (int i = 0; i < 5; i++) {
    store_job job;
    assert_int_equal(store_job_claim_next(f->s, &job), STORE_OK);
    assert_string_equal(job.id, order[i]);
    assert_string_equal(job.state, "STARTING");
    assert_string_equal(job.reason, "CLAIMED");
    assert_int_equal(job.attempt, 1);
    store_job_clear(&job);
    expect_state(f->s, order[i], "STARTING");
  }
  store_job none;
  assert_int_equal(store_job_claim_next(f->s, &none), STORE_EMPTY);
  assert_int_equal(raw_int(f->path, "SELECT count(*) FROM job_events WHERE reason = 'CLAIMED'"), 5);
}

/* The child plays a kilnd that dies mid-flight: it writes through its own
 * handle and is killed without closing it. Returns a code only on failure. */
static int crashing_server(const char *path) {
  store *s = NULL;
  char err[512];
  if (store_open(path, &s, err, sizeof err) != STORE_OK) return 10;
  const char *ids[] = {"queued", "starting", "running", "stopping", "done"};
  for (int i = 0; i < 5; i++) {
    /* "queued" is the oldest but lowest: the four claims below skip it. */
    store_job job = make_job(ids[i], NULL, i == 0 ? -1 : 0);
    if (store_job_create(s, &job, NULL) != STORE_OK) return 11;
  }
  for (int i = 1; i < 5; i++) {
    store_job job;
    if (store_job_claim_next(s, &job) != STORE_OK || strcmp(job.id, ids[i]) != 0) return 12;
    store_job_clear(&job);
  }
  if (store_job_transition(s, "running", "STARTING", "RUNNING", "STARTED", "") != STORE_OK ||
      store_job_transition(s, "stopping", "STARTING", "RUNNING", "STARTED", "") != STORE_OK ||
      store_job_transition(s, "stopping", "RUNNING", "STOPPING", "CANCEL", "") != STORE_OK ||
      store_job_transition(s, "done", "STARTING", "RUNNING", "STARTED", "") != STORE_OK ||
      store_job_transition(s, "done", "RUNNING", "SUCCEEDED", "COMPLETED", "") != STORE_OK)
    return 13;
  /* The crash: no store_close, no exit handlers (nor a leak checker's). */
  raise(SIGKILL);
  return 14;
}

static void requeue_after_crash_returns_unfinished_jobs_to_the_queue(void **state) {
  fixture *f = *state;
  store_close(f->s); /* the child must not inherit a live connection */
  f->s = NULL;
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(crashing_server(f->path));
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (WIFEXITED(status))
    fail_msg("the crashing child failed early with code %d", WEXITSTATUS(status));
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

  char err[512];
  assert_int_equal(store_open(f->path, &f->s, err, sizeof err), STORE_OK);
  expect_state(f->s, "starting", "STARTING");
  int n = -1;
  assert_int_equal(store_job_requeue_unfinished(f->s, &n), STORE_OK);
  assert_int_equal(n, 3);
  const char *requeued[] = {"starting", "running", "stopping"};
  const char *was[] = {"STARTING", "RUNNING", "STOPPING"};
  for (int i = 0; i < 3; i++) {
    store_job job;
    assert_int_equal(store_job_get(f->s, requeued[i], &job), STORE_OK);
    assert_string_equal(job.state, "QUEUED");
    assert_string_equal(job.reason, "SERVER_RESTARTED");
    assert_non_null(strstr(job.message, was[i]));
    assert_int_equal(job.attempt, 1);
    store_job_clear(&job);
    store_event *events = NULL;
    int ne = 0;
    assert_int_equal(store_event_list(f->s, requeued[i], &events, &ne), STORE_OK);
    assert_true(ne >= 3);
    assert_string_equal(events[ne - 1].from_state, was[i]);
    assert_string_equal(events[ne - 1].to_state, "QUEUED");
    assert_string_equal(events[ne - 1].reason, "SERVER_RESTARTED");
    store_event_list_free(events, ne);
  }
  expect_state(f->s, "queued", "QUEUED");
  expect_state(f->s, "done", "SUCCEEDED");
  assert_int_equal(
      raw_int(f->path, "SELECT count(*) FROM job_events WHERE reason = 'SERVER_RESTARTED'"), 3);

  /* Running it again finds nothing; claims resume by priority then age,
   * and a requeued job's next start is its attempt 2. */
  assert_int_equal(store_job_requeue_unfinished(f->s, &n), STORE_OK);
  assert_int_equal(n, 0);
  const char *order[] = {"starting", "running", "stopping", "queued"};
  const int attempt[] = {2, 2, 2, 1};
  for (int i = 0; i < 4; i++) {
    store_job job;
    assert_int_equal(store_job_claim_next(f->s, &job), STORE_OK);
    assert_string_equal(job.id, order[i]);
    assert_int_equal(job.attempt, attempt[i]);
    store_job_clear(&job);
  }
}

/* ---- metrics ----------------------------------------------------------- */

static store_metric point(int attempt, int64_t step, const char *name, double value) {
  store_metric m;
  memset(&m, 0, sizeof m);
  m.attempt = attempt;
  m.step = step;
  m.epoch = (int)(step / 100);
  snprintf(m.name, sizeof m.name, "%s", name);
  m.value = value;
  m.time_ms = 1000 + step;
  return m;
}

static void metrics_append_ignores_a_replayed_batch(void **state) {
  fixture *f = *state;
  create_job(f->s, "j", 0);
  store_metric batch[4] = {point(1, 100, "loss", 2.5), point(1, 100, "accuracy", 0.25),
                           point(1, 200, "loss", 1.5), point(1, 200, "accuracy", 0.5)};
  assert_int_equal(store_metrics_append(f->s, "j", batch, 4), STORE_OK);
  /* The same line arrives again (a replay), with a changed value that must
   * not win, plus one new point and one from the next attempt. */
  store_metric replay[6] = {point(1, 100, "loss", 99.0), point(1, 100, "accuracy", 0.25),
                            point(1, 200, "loss", 1.5),  point(1, 200, "accuracy", 0.5),
                            point(1, 300, "loss", 0.75), point(2, 100, "loss", 2.25)};
  assert_int_equal(store_metrics_append(f->s, "j", replay, 6), STORE_OK);
  assert_int_equal(store_metrics_append(f->s, "j", replay, 0), STORE_OK);

  store_metric *points = NULL;
  int n = 0;
  assert_int_equal(store_metrics_list(f->s, "j", NULL, &points, &n), STORE_OK);
  assert_int_equal(n, 6);
  /* ordered by (attempt, step, name) */
  const int attempt[] = {1, 1, 1, 1, 1, 2};
  const int64_t step[] = {100, 100, 200, 200, 300, 100};
  const char *name[] = {"accuracy", "loss", "accuracy", "loss", "loss", "loss"};
  const double value[] = {0.25, 2.5, 0.5, 1.5, 0.75, 2.25};
  for (int i = 0; i < n; i++) {
    assert_int_equal(points[i].attempt, attempt[i]);
    assert_int_equal(points[i].step, step[i]);
    assert_string_equal(points[i].name, name[i]);
    assert_true(points[i].value == value[i]);
    assert_int_equal(points[i].epoch, (int)(step[i] / 100));
    assert_int_equal(points[i].time_ms, 1000 + step[i]);
  }
  free(points);
  assert_int_equal(raw_int(f->path, "SELECT count(*) FROM metrics"), 6);
}

static void metrics_latest_is_the_newest_point_of_each_name(void **state) {
  fixture *f = *state;
  create_job(f->s, "j", 0);
  create_job(f->s, "other", 0);
  store_metric first[4] = {point(1, 100, "loss", 2.5), point(1, 100, "accuracy", 0.25),
                           point(1, 200, "loss", 1.5), point(1, 200, "val_loss", 1.75)};
  store_metric resumed[2] = {point(2, 150, "loss", 1.25), point(2, 150, "accuracy", 0.5)};
  store_metric elsewhere[1] = {point(1, 900, "loss", 9.0)};
  assert_int_equal(store_metrics_append(f->s, "j", first, 4), STORE_OK);
  assert_int_equal(store_metrics_append(f->s, "other", elsewhere, 1), STORE_OK);
  assert_int_equal(store_metrics_append(f->s, "j", resumed, 2), STORE_OK);

  store_metric *points = NULL;
  int n = 0;
  assert_int_equal(store_metrics_latest(f->s, "j", &points, &n), STORE_OK);
  assert_int_equal(n, 3); /* by name */
  assert_string_equal(points[0].name, "accuracy");
  assert_true(points[0].value == 0.5);
  assert_string_equal(points[1].name, "loss");
  assert_true(points[1].value == 1.25); /* the resumed attempt's, though at a lower step */
  assert_int_equal(points[1].attempt, 2);
  assert_int_equal(points[1].step, 150);
  assert_string_equal(points[2].name, "val_loss");
  assert_true(points[2].value == 1.75);
  free(points);

  /* list carries each point's seq, the same ids the stream sends */
  store_metric *listed = NULL, *streamed = NULL;
  int n_listed = 0, n_streamed = 0;
  assert_int_equal(store_metrics_list(f->s, "j", "loss", &listed, &n_listed), STORE_OK);
  assert_int_equal(store_metrics_since(f->s, "j", 0, 100, &streamed, &n_streamed), STORE_OK);
  assert_int_equal(n_listed, 3);
  assert_int_equal(n_streamed, 6);
  assert_true(listed[0].seq == streamed[0].seq && listed[1].seq == streamed[2].seq &&
              listed[2].seq == streamed[4].seq);
  assert_true(listed[0].seq < listed[1].seq && listed[1].seq < listed[2].seq);
  free(listed);
  free(streamed);

  assert_int_equal(store_metrics_latest(f->s, "nobody", &points, &n), STORE_OK);
  assert_int_equal(n, 0);
  assert_null(points);
}

static void metrics_thinned_keeps_first_last_and_evenly_between_per_name(void **state) {
  fixture *f = *state;
  create_job(f->s, "j", 0);
  store_metric batch[110];
  for (int i = 0; i < 100; i++) batch[i] = point(1, i + 1, "loss", 1.0 / (i + 1));
  for (int i = 0; i < 10; i++) batch[100 + i] = point(1, (i + 1) * 10, "val_loss", i);
  assert_int_equal(store_metrics_append(f->s, "j", batch, 110), STORE_OK);

  store_metric *points = NULL;
  int n = 0;
  assert_int_equal(store_metrics_thinned(f->s, "j", NULL, 0, INT64_MAX, 4, &points, &n), STORE_OK);
  assert_int_equal(n, 8); /* 4 of each name, in (attempt, step, name) order */
  int loss_steps[4], n_loss = 0, val_steps[4], n_val = 0;
  for (int i = 0; i < n; i++) {
    if (i > 0)
      assert_true(
          points[i - 1].step < points[i].step ||
          (points[i - 1].step == points[i].step && strcmp(points[i - 1].name, points[i].name) < 0));
    if (strcmp(points[i].name, "loss") == 0) {
      loss_steps[n_loss++] = (int)points[i].step;
      assert_true(points[i].value == 1.0 / (double)points[i].step);
    } else {
      val_steps[n_val++] = (int)points[i].step;
    }
    assert_true(points[i].seq > 0);
  }
  assert_int_equal(n_loss, 4);
  assert_int_equal(n_val, 4);
  /* index floor(j * 99 / 3) of 100: steps 1, 34, 67, 100; of 10: 10, 40, 70, 100 */
  assert_int_equal(loss_steps[0], 1);
  assert_int_equal(loss_steps[1], 34);
  assert_int_equal(loss_steps[2], 67);
  assert_int_equal(loss_steps[3], 100);
  assert_int_equal(val_steps[0], 10);
  assert_int_equal(val_steps[1], 40);
  assert_int_equal(val_steps[2], 70);
  assert_int_equal(val_steps[3], 100);
  free(points);

  /* a step range and a name; 0 = every point; 1 = only the last */
  assert_int_equal(store_metrics_thinned(f->s, "j", "loss", 11, 20, 0, &points, &n), STORE_OK);
  assert_int_equal(n, 10);
  assert_int_equal(points[0].step, 11);
  assert_int_equal(points[9].step, 20);
  free(points);
  assert_int_equal(store_metrics_thinned(f->s, "j", "val_loss", 0, 55, 1, &points, &n), STORE_OK);
  assert_int_equal(n, 1);
  assert_int_equal(points[0].step, 50);
  free(points);
  assert_int_equal(store_metrics_thinned(f->s, "j", "nothing", 0, INT64_MAX, 5, &points, &n),
                   STORE_OK);
  assert_int_equal(n, 0);
  assert_null(points);
}

static void metrics_keep_nan_and_filter_by_name(void **state) {
  fixture *f = *state;
  create_job(f->s, "j", 0);
  store_metric batch[3] = {point(1, 1, "loss", NAN), point(1, 1, "lr", 1e-3),
                           point(1, 2, "loss", INFINITY)};
  batch[1].time_ms = 0; /* 0 = now */
  int64_t before = store_now_ms();
  assert_int_equal(store_metrics_append(f->s, "j", batch, 3), STORE_OK);
  store_metric *points = NULL;
  int n = 0;
  assert_int_equal(store_metrics_list(f->s, "j", "loss", &points, &n), STORE_OK);
  assert_int_equal(n, 2);
  assert_true(isnan(points[0].value));
  assert_true(isinf(points[1].value) && points[1].value > 0);
  free(points);
  assert_int_equal(store_metrics_list(f->s, "j", "lr", &points, &n), STORE_OK);
  assert_int_equal(n, 1);
  assert_true(points[0].value == 1e-3);
  assert_in_range(points[0].time_ms, before, store_now_ms());
  free(points);
}

static void metrics_of_unknown_job_are_not_found_and_store_nothing(void **state) {
  fixture *f = *state;
  store_metric m = point(1, 1, "loss", 1.0);
  assert_int_equal(store_metrics_append(f->s, "ghost", &m, 1), STORE_NOT_FOUND);
  assert_non_null(strstr(store_errmsg(f->s), "ghost"));
  create_job(f->s, "j", 0);
  store_metric bad[2] = {point(1, 1, "loss", 1.0), point(1, 2, "", 1.0)};
  assert_int_equal(store_metrics_append(f->s, "j", bad, 2), STORE_ERROR);
  assert_int_equal(raw_int(f->path, "SELECT count(*) FROM metrics"), 0);
}

/* ---- checkpoints ------------------------------------------------------- */

static void checkpoints_add_and_list_round_trip(void **state) {
  fixture *f = *state;
  create_job(f->s, "j", 0);
  create_job(f->s, "other", 0);
  const int64_t steps[] = {1000, 500, 1500};
  for (int i = 0; i < 3; i++) {
    store_checkpoint c;
    memset(&c, 0, sizeof c);
    snprintf(c.job_id, sizeof c.job_id, "j");
    c.attempt = 1;
    c.step = steps[i];
    snprintf(c.path, sizeof c.path, "/data/j/ckpt-%lld.safetensors", (long long)steps[i]);
    c.bytes = 4096 * (i + 1);
    snprintf(c.sha256, sizeof c.sha256, "%064d", i);
    c.metrics_json = i == 1 ? NULL : "{\"loss\":0.5}";
    c.create_ms = i == 2 ? 0 : 1700000000000 + i;
    assert_int_equal(store_checkpoint_add(f->s, &c), STORE_OK);
  }
  store_checkpoint c;
  memset(&c, 0, sizeof c);
  snprintf(c.job_id, sizeof c.job_id, "other");
  snprintf(c.path, sizeof c.path, "/data/other/ckpt.safetensors");
  assert_int_equal(store_checkpoint_add(f->s, &c), STORE_OK);

  store_checkpoint *list = NULL;
  int n = 0;
  assert_int_equal(store_checkpoint_list(f->s, "j", &list, &n), STORE_OK);
  assert_int_equal(n, 3);
  const int64_t sorted[] = {500, 1000, 1500};
  const int added_as[] = {1, 0, 2};
  for (int i = 0; i < n; i++) {
    int k = added_as[i];
    char path[64], sha[65];
    snprintf(path, sizeof path, "/data/j/ckpt-%lld.safetensors", (long long)sorted[i]);
    snprintf(sha, sizeof sha, "%064d", k);
    assert_true(list[i].id > 0);
    assert_string_equal(list[i].job_id, "j");
    assert_int_equal(list[i].attempt, 1);
    assert_int_equal(list[i].step, sorted[i]);
    assert_string_equal(list[i].path, path);
    assert_int_equal(list[i].bytes, 4096 * (k + 1));
    assert_string_equal(list[i].sha256, sha);
    assert_string_equal(list[i].metrics_json, k == 1 ? "{}" : "{\"loss\":0.5}");
    if (k == 2)
      assert_true(list[i].create_ms > 1700000000002);
    else
      assert_int_equal(list[i].create_ms, 1700000000000 + k);
  }
  store_checkpoint_list_free(list, n);
}

/* ---- threads and errors ------------------------------------------------ */

enum { THREAD_APPENDS = 200 };

typedef struct appender {
  store *s; /* shared handle, or NULL to open one's own on path */
  const char *path;
  int attempt;
  int failures;
} appender;

static void *append_many(void *arg) {
  appender *a = arg;
  store *s = a->s;
  char err[512];
  if (!s && store_open(a->path, &s, err, sizeof err) != STORE_OK) {
    a->failures = THREAD_APPENDS;
    return NULL;
  }
  for (int i = 0; i < THREAD_APPENDS; i++) {
    store_metric m = point(a->attempt, i, "loss", (double)i);
    if (store_metrics_append(s, "j", &m, 1) != STORE_OK) a->failures++;
  }
  if (!a->s) store_close(s);
  return NULL;
}

static void run_two_appenders(fixture *f, int shared_handle) {
  create_job(f->s, "j", 0);
  appender a[2] = {{shared_handle ? f->s : NULL, f->path, 1, 0},
                   {shared_handle ? f->s : NULL, f->path, 2, 0}};
  pthread_t threads[2];
  for (int t = 0; t < 2; t++)
    assert_int_equal(pthread_create(&threads[t], NULL, append_many, &a[t]), 0);
  for (int t = 0; t < 2; t++) assert_int_equal(pthread_join(threads[t], NULL), 0);
  assert_int_equal(a[0].failures, 0);
  assert_int_equal(a[1].failures, 0);
  store_metric *points = NULL;
  int n = 0;
  assert_int_equal(store_metrics_list(f->s, "j", NULL, &points, &n), STORE_OK);
  assert_int_equal(n, 2 * THREAD_APPENDS);
  for (int i = 0; i < n; i++) {
    assert_int_equal(points[i].attempt, 1 + i / THREAD_APPENDS);
    assert_int_equal(points[i].step, i % THREAD_APPENDS);
  }
  free(points);
}

static void two_threads_on_one_handle_append_metrics_without_loss(void **state) {
  run_two_appenders(*state, 1);
}

static void two_threads_with_own_handles_append_metrics_without_loss(void **state) {
  run_two_appenders(*state, 0);
}

enum { CLAIM_JOBS = 60 };

typedef struct claimer {
  const char *path;
  int claimed[CLAIM_JOBS];
  int count;
  int failures;
} claimer;

static void *claim_all(void *arg) {
  claimer *c = arg;
  store *s = NULL;
  char err[512];
  if (store_open(c->path, &s, err, sizeof err) != STORE_OK) {
    c->failures++;
    return NULL;
  }
  for (;;) {
    store_job job;
    int rc = store_job_claim_next(s, &job);
    if (rc == STORE_EMPTY) break;
    int index = -1;
    if (rc != STORE_OK || sscanf(job.id, "job-%d", &index) != 1 || index < 0 ||
        index >= CLAIM_JOBS || job.attempt != 1 || c->count >= CLAIM_JOBS) {
      c->failures++;
      if (rc == STORE_OK) store_job_clear(&job);
      break;
    }
    c->claimed[c->count++] = index;
    store_job_clear(&job);
  }
  store_close(s);
  return NULL;
}

static void concurrent_claims_from_two_handles_never_share_a_job(void **state) {
  fixture *f = *state;
  for (int i = 0; i < CLAIM_JOBS; i++) {
    char id[16];
    snprintf(id, sizeof id, "job-%02d", i);
    create_job(f->s, id, 0);
  }
  claimer *c = calloc(2, sizeof *c);
  assert_non_null(c);
  pthread_t threads[2];
  for (int t = 0; t < 2; t++) {
    c[t].path = f->path;
    assert_int_equal(pthread_create(&threads[t], NULL, claim_all, &c[t]), 0);
  }
  for (int t = 0; t < 2; t++) assert_int_equal(pthread_join(threads[t], NULL), 0);
  int seen[CLAIM_JOBS] = {0};
  for (int t = 0; t < 2; t++) {
    assert_int_equal(c[t].failures, 0);
    for (int i = 0; i < c[t].count; i++) seen[c[t].claimed[i]]++;
  }
  assert_int_equal(c[0].count + c[1].count, CLAIM_JOBS);
  for (int i = 0; i < CLAIM_JOBS; i++) assert_int_equal(seen[i], 1);
  free(c);
  assert_int_equal(raw_int(f->path, "SELECT count(*) FROM jobs WHERE state = 'STARTING'"),
                   CLAIM_JOBS);
}

typedef struct erring {
  store *s;
  char seen[512];
} erring;

static void *fail_and_read_errmsg(void *arg) {
  erring *e = arg;
  store_job job;
  if (store_job_get(e->s, "missing-in-thread", &job) == STORE_NOT_FOUND)
    snprintf(e->seen, sizeof e->seen, "%s", store_errmsg(e->s));
  return NULL;
}

static void errmsg_explains_the_calling_threads_own_failure(void **state) {
  fixture *f = *state;
  store_job job;
  assert_int_equal(store_job_get(f->s, "missing-in-main", &job), STORE_NOT_FOUND);
  erring e = {f->s, ""};
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, fail_and_read_errmsg, &e), 0);
  assert_int_equal(pthread_join(thread, NULL), 0);
  assert_non_null(strstr(e.seen, "missing-in-thread"));
  /* The other thread failed since, but this thread still sees its own cause. */
  assert_non_null(strstr(store_errmsg(f->s), "missing-in-main"));
  assert_string_equal(store_errmsg(NULL), "store handle is NULL");
}

#define TEST(name) cmocka_unit_test_setup_teardown(name, setup, teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      TEST(generation_moves_with_every_write_through_any_handle),
      TEST(fresh_open_migrates_to_latest_and_reopen_is_a_noop),
      TEST(newer_schema_version_is_refused_and_left_untouched),
      TEST(open_of_unwritable_path_fails_with_a_sentence),
      TEST(database_is_in_wal_mode_with_foreign_keys_enforced),
      TEST(queue_query_is_served_by_the_queue_index),
      TEST(queue_load_reads_every_queued_job_in_order_and_claim_takes_one),
      TEST(background_checkpoints_copy_the_log_into_the_database),
      TEST(create_then_get_round_trips_every_field),
      TEST(request_id_retry_returns_the_same_job_and_creates_one_row),
      TEST(duplicate_job_id_fails_naming_the_job_and_the_cause),
      TEST(get_of_unknown_job_is_not_found_with_its_id_in_errmsg),
      TEST(list_pages_newest_first_and_covers_each_job_exactly_once),
      TEST(list_state_filter_pages_only_matching_jobs),
      TEST(transition_from_wrong_state_is_a_conflict_and_changes_nothing),
      TEST(transition_of_unknown_job_is_not_found),
      TEST(transition_without_from_moves_only_unfinished_jobs),
      TEST(transition_to_unknown_state_is_refused),
      TEST(events_are_recorded_in_order_with_times_set),
      TEST(claim_takes_highest_priority_then_oldest_then_reports_empty),
      TEST(requeue_after_crash_returns_unfinished_jobs_to_the_queue),
      TEST(metrics_append_ignores_a_replayed_batch),
      TEST(metrics_latest_is_the_newest_point_of_each_name),
      TEST(metrics_thinned_keeps_first_last_and_evenly_between_per_name),
      TEST(metrics_keep_nan_and_filter_by_name),
      TEST(metrics_of_unknown_job_are_not_found_and_store_nothing),
      TEST(checkpoints_add_and_list_round_trip),
      TEST(two_threads_on_one_handle_append_metrics_without_loss),
      TEST(two_threads_with_own_handles_append_metrics_without_loss),
      TEST(concurrent_claims_from_two_handles_never_share_a_job),
      TEST(errmsg_explains_the_calling_threads_own_failure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
