/* test_backup.c — store_backup while another thread keeps committing:
 * one snapshot read in one-page steps that never restarts, writers going on
 * meanwhile, the snapshot's files handed over. (A restore's paths are
 * moved by store_relocate, tested with the checkpoints.) */
#include <pthread.h>
#include <setjmp.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fixture.h"

static void create(fixture *f, const char *id) {
  store_job job;
  memset(&job, 0, sizeof job);
  snprintf(job.id, sizeof job.id, "%s", id);
  job.spec_json = "{}";
  assert_int_equal(store_job_create(f->s, &job, NULL), STORE_OK);
}

static void add_checkpoint(fixture *f, const char *job, int64_t step, const char *path) {
  store_checkpoint c;
  memset(&c, 0, sizeof c);
  snprintf(c.job_id, sizeof c.job_id, "%s", job);
  c.step = step;
  snprintf(c.path, sizeof c.path, "%s", path);
  snprintf(c.sha256, sizeof c.sha256, "%064d", 0);
  assert_int_equal(store_checkpoint_add(f->s, &c), STORE_OK);
}

/* Appends metric points, one commit each, until told to stop. */
typedef struct writer {
  store *s;
  atomic_int stop;
  atomic_long commits;
} writer;

static void *write_points(void *arg) {
  writer *w = arg;
  for (int64_t step = 100000; !atomic_load(&w->stop); step++) {
    store_metric m = {.attempt = 1, .step = step, .value = 1.0, .time_ms = 1};
    snprintf(m.name, sizeof m.name, "loss");
    if (store_metrics_append(w->s, "job-1", &m, 1) == STORE_OK) atomic_fetch_add(&w->commits, 1);
  }
  return NULL;
}

typedef struct seen {
  char paths[8][512];
  char kinds[8][16];
  int n;
  writer *w;            /* the writer going on beside the backup */
  long commits_at_list; /* its commits when the snapshot's files were listed */
} seen;

/* Called while the backup holds its snapshot and, for that moment, the
 * write lock: the writer's commits so far are the snapshot's (one more may
 * have committed without being counted yet). */
static int on_file(const char *kind, const char *path, void *user) {
  seen *s = user;
  if (s->w && s->n == 0) s->commits_at_list = atomic_load(&s->w->commits);
  if (s->n < 8) {
    snprintf(s->kinds[s->n], sizeof s->kinds[0], "%s", kind);
    snprintf(s->paths[s->n++], sizeof s->paths[0], "%s", path);
  }
  return 0;
}

static long long count(const char *db_path, const char *sql) {
  sqlite3 *db = NULL;
  sqlite3_stmt *st = NULL;
  long long n = -1;
  if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
      sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
    n = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  return n;
}

static void a_backup_during_writes_is_one_snapshot_and_writers_go_on(void **state) {
  fixture *f = *state;
  create(f, "job-1");
  add_checkpoint(f, "job-1", 10, "/data/jobs/job-1/checkpoints/ckpt-10.safetensors");
  /* Enough pages that a one-page-a-step copy takes a while. */
  store_metric *points = calloc(20000, sizeof *points);
  assert_non_null(points);
  for (int i = 0; i < 20000; i++) {
    points[i] = (store_metric){.attempt = 1, .step = i + 1, .value = i, .time_ms = 1};
    snprintf(points[i].name, sizeof points[i].name, "loss");
  }
  assert_int_equal(store_metrics_append(f->s, "job-1", points, 20000), STORE_OK);
  free(points);

  writer w = {.s = f->s};
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, write_points, &w), 0);
  while (atomic_load(&w.commits) < 5) usleep(1000);
  char out[400], err[512] = "";
  snprintf(out, sizeof out, "%s/copy.db", f->dir);
  seen files = {.w = &w};
  store_backup_stats stats;
  const long before = atomic_load(&w.commits);
  int rc = store_backup(f->path, out, 1, on_file, &files, &stats, err, sizeof err);
  const long during = atomic_load(&w.commits) - before;
  atomic_store(&w.stop, 1);
  pthread_join(thread, NULL);
  print_message("backup: %d pages in %d steps; %ld commits by the writer meanwhile (%s)\n",
                stats.pages, stats.steps, during, err);
  assert_int_equal(rc, STORE_OK);
  assert_true(stats.pages > 100);
  assert_int_equal(stats.steps, stats.pages); /* never restarted */
  assert_true(during > 0);                    /* writers were not held off */
  /* The copy is one snapshot: the bulk, and the writer's commits up to the
   * moment it was taken, not those after (whether the writer got any in
   * while the pages were copied depends on the scheduler, so "fewer than
   * live" is not a check). */
  long long copied = count(out, "SELECT count(*) FROM metrics");
  long long live = count(f->path, "SELECT count(*) FROM metrics");
  print_message("metric points: %lld in the copy, %lld live; the writer had committed %ld when "
                "the snapshot was taken\n",
                copied, live, files.commits_at_list);
  assert_true(copied >= 20000 + 5);
  assert_true(copied <= live);
  assert_true(copied - 20000 >= files.commits_at_list);
  assert_true(copied - 20000 <= files.commits_at_list + 1);
  assert_int_equal(count(out, "SELECT count(*) FROM metrics WHERE step >= 100000"), copied - 20000);
  assert_int_equal(count(out, "SELECT count(*) FROM pragma_journal_mode WHERE journal_mode = "
                              "'delete'"),
                   1);
  assert_int_equal(files.n, 1);
  assert_string_equal(files.kinds[0], "checkpoint");
  assert_string_equal(files.paths[0], "/data/jobs/job-1/checkpoints/ckpt-10.safetensors");
  /* A new file only: an existing one is refused. */
  assert_int_equal(store_backup(f->path, out, 1, NULL, NULL, NULL, err, sizeof err), STORE_ERROR);
  assert_non_null(strstr(err, "already exists"));
  assert_int_equal(count(out, "SELECT count(*) FROM metrics"), copied); /* untouched */
  unlink(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(a_backup_during_writes_is_one_snapshot_and_writers_go_on,
                                      fixture_setup, fixture_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
