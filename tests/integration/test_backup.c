/* test_backup.c — `kilnd backup` of a kilnd serving a load of running
 * jobs (a stand-in trainer writing metrics and checkpoints, retention
 * removing old ones), `kilnd restore` into a new directory, and a second
 * kilnd on it: its jobs, metric point counts and checkpoint sha256s equal
 * what the snapshot database holds (read directly with SQLite), the jobs
 * that were running are requeued as after a crash and resume from the
 * restored checkpoints. A damaged backup, a non-empty target and a file
 * the database references but the disk lacks are each named. */
#include <jansson.h>
#include <setjmp.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "common.h"
#include "harness.h"

/* 60 steps of 0.05 s, a loss each step, a checkpoint every 5 (written to a
 * temporary name and renamed, as kiln-train does) holding its step on the
 * first line; --resume FILE goes on after that step. */
static const char busy_trainer[] =
    "#!/bin/sh\n"
    "spec=\"$2\"; resume=''; ckdir=''; prev=''\n"
    "for a in \"$@\"; do\n"
    "  [ \"$prev\" = --resume ] && resume=\"$a\"\n"
    "  [ \"$prev\" = --checkpoint-dir ] && ckdir=\"$a\"\n"
    "  prev=\"$a\"\n"
    "done\n"
    "echo '{\"status\":{\"phase\":\"training\",\"message\":\"training steps on data: 60 "
    "examples, 1 epoch of 60 steps\"}}' >&3\n"
    "i=1\n"
    "if [ -n \"$resume\" ]; then i=$(( $(head -n1 \"$resume\") + 1 )); fi\n"
    "while [ $i -le 60 ]; do\n"
    "  sleep 0.05\n"
    "  echo \"{\\\"step\\\":$i,\\\"epoch\\\":1,\\\"metrics\\\":{\\\"loss\\\":$((1000 - i))}}\" "
    ">&3\n"
    "  if [ $((i % 5)) -eq 0 ]; then\n"
    "    f=\"$ckdir/ckpt-$i.safetensors\"; seq $i $((i + 400)) > \"$f.tmp\"; mv \"$f.tmp\" \"$f\"\n"
    "    h=$(sha256sum \"$f\" | cut -d' ' -f1); b=$(wc -c < \"$f\")\n"
    "    echo \"{\\\"checkpoint\\\":{\\\"step\\\":$i,\\\"path\\\":\\\"$f\\\",\\\"bytes\\\":$b,"
    "\\\"sha256\\\":\\\"$h\\\"}}\" >&3\n"
    "  fi\n"
    "  i=$((i+1))\n"
    "done\n";

/* Takes a job and never reports: the restored jobs stay as restored. */
static const char idle_trainer[] = "#!/bin/sh\nexec sleep 600\n";

#define JOBS 4

static char work[256], dir_a[300], dir_b[300], out[300], trainer[300], idle[300];
static char url_a[128], token_a[128], spec[8192];
static pid_t pid_a;
static char job_ids[JOBS][64];

/* ---- helpers ---- */

static char *get_json_text(const char *url, const char *token, const char *path) {
  char *body = NULL;
  long status = it_request(url, token, "GET", path, NULL, 0, &body);
  if (status != 200) fail_msg("GET %s: %ld %s", path, status, body ? body : "");
  return body;
}

static json_t *get_json(const char *url, const char *token, const char *path) {
  char *body = get_json_text(url, token, path);
  json_t *doc = json_loads(body, 0, NULL);
  free(body);
  assert_non_null(doc);
  return doc;
}

static int checkpoint_count(const char *url, const char *token, const char *job) {
  char path[200];
  snprintf(path, sizeof path, "/v1/jobs/%.63s/checkpoints", job);
  json_t *doc = get_json(url, token, path);
  int n = (int)json_array_size(json_object_get(doc, "checkpoints"));
  json_decref(doc);
  return n;
}

static int run_cmd(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int run_cmd(char *buf, size_t len, const char *fmt, ...) {
  char cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  int rc = it_run(buf, len, cmd);
  print_message("$ %s -> %d\n%s", cmd, rc, buf);
  return rc;
}

/* The snapshot as the backup's database holds it. */
typedef struct snap_job {
  char id[64], state[16];
  long long attempt, points;
  int n_ckpt;
  long long ckpt_step[32];
  char ckpt_sha[32][65];
} snap_job;

static int read_snapshot(const char *db_path, snap_job *jobs, int max) {
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  sqlite3_stmt *st = NULL;
  assert_int_equal(sqlite3_prepare_v2(db,
                                      "SELECT id, state, attempt, (SELECT count(*) FROM metrics m"
                                      " WHERE m.job_id = j.id) FROM jobs j ORDER BY seq",
                                      -1, &st, NULL),
                   SQLITE_OK);
  int n = 0;
  while (n < max && sqlite3_step(st) == SQLITE_ROW) {
    snap_job *j = &jobs[n++];
    memset(j, 0, sizeof *j);
    snprintf(j->id, sizeof j->id, "%s", sqlite3_column_text(st, 0));
    snprintf(j->state, sizeof j->state, "%s", sqlite3_column_text(st, 1));
    j->attempt = sqlite3_column_int64(st, 2);
    j->points = sqlite3_column_int64(st, 3);
  }
  sqlite3_finalize(st);
  assert_int_equal(sqlite3_prepare_v2(db,
                                      "SELECT step, sha256 FROM checkpoints WHERE job_id = ?1"
                                      " ORDER BY step",
                                      -1, &st, NULL),
                   SQLITE_OK);
  for (int i = 0; i < n; i++) {
    sqlite3_bind_text(st, 1, jobs[i].id, -1, SQLITE_STATIC);
    while (jobs[i].n_ckpt < 32 && sqlite3_step(st) == SQLITE_ROW) {
      jobs[i].ckpt_step[jobs[i].n_ckpt] = sqlite3_column_int64(st, 0);
      snprintf(jobs[i].ckpt_sha[jobs[i].n_ckpt], 65, "%s", sqlite3_column_text(st, 1));
      jobs[i].n_ckpt++;
    }
    sqlite3_reset(st);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return n;
}

static long long db_count(const char *db_path, const char *sql) {
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

/* ---- the suite: kilnd A serving a load of jobs ---- */

static int setup(void **state) {
  (void)state;
  signal(SIGPIPE, SIG_IGN);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  snprintf(work, sizeof work, "/tmp/kiln-backup-XXXXXX");
  if (!mkdtemp(work)) return -1;
  snprintf(dir_a, sizeof dir_a, "%s/a", work);
  snprintf(dir_b, sizeof dir_b, "%s/b", work);
  snprintf(out, sizeof out, "%s/backup", work);
  snprintf(trainer, sizeof trainer, "%s/busy.sh", work);
  snprintf(idle, sizeof idle, "%s/idle.sh", work);
  if (it_write_file(trainer, busy_trainer, 0755) != 0 ||
      it_write_file(idle, idle_trainer, 0755) != 0)
    return -1;
  char *example = it_read_file(EXAMPLES_DIR "/fmnist-mlp.json");
  if (!example) return -1;
  json_t *doc = json_loads(example, 0, NULL);
  free(example);
  if (!doc) return -1;
  /* Retention removes old checkpoints while the backup runs. */
  json_object_set_new(doc, "checkpoint", json_pack("{s:i}", "keep_last", 3));
  char *text = json_dumps(doc, JSON_COMPACT);
  snprintf(spec, sizeof spec, "%s", text);
  free(text);
  json_decref(doc);
  return it_launch_kilnd(KILND_PATH, dir_a, trainer, NULL, NULL, &pid_a, url_a, sizeof url_a,
                         token_a, sizeof token_a);
}

static int teardown(void **state) {
  (void)state;
  if (pid_a > 0) it_stop_kilnd(pid_a, dir_a);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
  if (system(cmd) != 0) return -1;
  curl_global_cleanup();
  return 0;
}

static void backup_while_serving_restores_every_job_point_and_checkpoint(void **state) {
  (void)state;
  for (int i = 0; i < JOBS; i++) {
    char *body = NULL;
    assert_int_equal(it_request(url_a, token_a, "POST", "/v1/jobs", spec, strlen(spec), &body),
                     200);
    json_t *job = json_loads(body, 0, NULL);
    snprintf(job_ids[i], sizeof job_ids[i], "%s", json_string_value(json_object_get(job, "id")));
    json_decref(job);
    free(body);
  }
  /* Under way: the first has checkpoints (as many run as the machine has
   * cores, the rest wait for one). */
  for (int tries = 0; tries < 200 && checkpoint_count(url_a, token_a, job_ids[0]) < 2; tries++)
    usleep(50 * 1000);
  char text[16384];
  assert_int_equal(run_cmd(text, sizeof text, "'%s' backup --data-dir '%s' --pages-per-step 1 '%s'",
                           KILND_PATH, dir_a, out),
                   0);
  int pages = 0, steps = 0;
  const char *summary = strstr(text, "database snapshot of ");
  assert_non_null(summary);
  assert_int_equal(sscanf(summary, "database snapshot of %d pages in %d steps", &pages, &steps), 2);
  assert_true(pages > 1);
  assert_int_equal(steps, pages); /* one page a step, and never restarted */

  char snap_db[400];
  snprintf(snap_db, sizeof snap_db, "%s/kiln.db", out);
  static snap_job snap[JOBS + 2];
  int n = read_snapshot(snap_db, snap, JOBS + 2);
  assert_int_equal(n, JOBS);
  int running = 0;
  for (int i = 0; i < n; i++) {
    print_message("snapshot: %s %s attempt %lld, %lld points, %d checkpoints\n", snap[i].id,
                  snap[i].state, snap[i].attempt, snap[i].points, snap[i].n_ckpt);
    running += strcmp(snap[i].state, "RUNNING") == 0;
  }
  assert_true(running >= 1); /* a backup of a server at work */
  /* kilnd went on writing: A's metrics moved past the snapshot's. */
  char live_db[400], sql[600];
  snprintf(live_db, sizeof live_db, "%s/kiln.db", dir_a);
  long long snap_points = db_count(snap_db, "SELECT count(*) FROM metrics");
  usleep(300 * 1000);
  long long live_points = db_count(live_db, "SELECT count(*) FROM metrics");
  print_message("metric points: %lld in the snapshot, %lld in the live database after\n",
                snap_points, live_points);
  assert_true(live_points > snap_points);
  /* A rests from here on: the other cases copy its directory. */
  kill(pid_a, SIGTERM);
  waitpid(pid_a, NULL, 0);
  pid_a = 0;
  /* Every checkpoint file of the snapshot is in the backup, even those
   * retention has removed from A since. */
  for (int i = 0; i < n; i++)
    for (int k = 0; k < snap[i].n_ckpt; k++) {
      assert_int_equal(
          run_cmd(text, sizeof text,
                  "grep -c '^file %.64s .*/%.63s/checkpoints/ckpt-%lld.safetensors$' '%s/MANIFEST'",
                  snap[i].ckpt_sha[k], snap[i].id, snap[i].ckpt_step[k], out),
          0);
    }

  /* Restore into a new directory; B starts on it with a trainer that takes
   * the jobs and reports nothing, so what B serves is what was restored. */
  assert_int_equal(
      run_cmd(text, sizeof text, "'%s' restore '%s' --data-dir '%s'", KILND_PATH, out, dir_b), 0);
  assert_non_null(strstr(text, "checked against the manifest"));
  snprintf(sql, sizeof sql, "%s/kiln.db", dir_b);
  char prefix_sql[600];
  snprintf(prefix_sql, sizeof prefix_sql,
           "SELECT count(*) FROM checkpoints WHERE substr(path, 1, %zu) != '%s/'",
           strlen(dir_b) + 1, dir_b);
  assert_int_equal(db_count(sql, prefix_sql), 0); /* every path points into B */

  pid_t pid_b = 0;
  char url_b[128], token_b[128];
  assert_int_equal(it_launch_kilnd(KILND_PATH, dir_b, idle, NULL, NULL, &pid_b, url_b, sizeof url_b,
                                   token_b, sizeof token_b),
                   0);
  /* A's token works on B: tokens are in the database. */
  assert_string_equal(token_b, token_a);
  json_t *list = get_json(url_b, token_b, "/v1/jobs?page_size=100");
  assert_int_equal(json_array_size(json_object_get(list, "jobs")), (size_t)JOBS);
  json_decref(list);
  for (int i = 0; i < n; i++) {
    char path[300];
    snprintf(path, sizeof path, "/v1/jobs/%.63s/metrics", snap[i].id);
    json_t *doc = get_json(url_b, token_b, path);
    long long points = (long long)json_array_size(json_object_get(doc, "metrics"));
    json_decref(doc);
    assert_int_equal(points, snap[i].points);
    snprintf(path, sizeof path, "/v1/jobs/%.63s/checkpoints", snap[i].id);
    doc = get_json(url_b, token_b, path);
    json_t *ckpts = json_object_get(doc, "checkpoints");
    assert_int_equal(json_array_size(ckpts), (size_t)snap[i].n_ckpt);
    for (size_t k = 0; k < json_array_size(ckpts); k++) {
      json_t *c = json_array_get(ckpts, k);
      long long step = json_integer_value(json_object_get(c, "step"));
      int found = -1;
      for (int m = 0; m < snap[i].n_ckpt; m++)
        if (snap[i].ckpt_step[m] == step) found = m;
      assert_true(found >= 0);
      assert_string_equal(json_string_value(json_object_get(c, "sha256")), snap[i].ckpt_sha[found]);
      /* The file B sends hashes to the snapshot's sum. */
      snprintf(path, sizeof path, "/v1/jobs/%.63s/checkpoints/%lld:download", snap[i].id,
               (long long)json_integer_value(json_object_get(c, "id")));
      char *bytes = NULL;
      assert_int_equal(it_request(url_b, token_b, "GET", path, NULL, 0, &bytes), 200);
      char hex[65];
      kc_sha256_hex_of(bytes, strlen(bytes), hex);
      free(bytes);
      assert_string_equal(hex, snap[i].ckpt_sha[found]);
    }
    json_decref(doc);
    /* A job that was running is requeued as after a crash. */
    snprintf(path, sizeof path, "/v1/jobs/%.63s/events", snap[i].id);
    char *events = get_json_text(url_b, token_b, path);
    if (strcmp(snap[i].state, "RUNNING") == 0) assert_non_null(strstr(events, "SERVER_RESTARTED"));
    free(events);
  }
  it_stop_kilnd(pid_b, "/nonexistent-kiln-dir");

  /* B again with the real trainer: every job ends, those that were running
   * from their restored checkpoints. */
  assert_int_equal(it_launch_kilnd(KILND_PATH, dir_b, trainer, NULL, NULL, &pid_b, url_b,
                                   sizeof url_b, token_b, sizeof token_b),
                   0);
  for (int i = 0; i < n; i++) {
    char path[300], *body = NULL;
    snprintf(path, sizeof path, "/v1/jobs/%.63s:wait?timeout=60s", snap[i].id);
    char bearer[200];
    snprintf(bearer, sizeof bearer, "Bearer %s", token_b);
    assert_int_equal(it_request_as(url_b, bearer, NULL, "POST", path, "", 0, 90, &body), 200);
    json_t *job = json_loads(body, 0, NULL);
    free(body);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "SUCCEEDED");
    long long attempt = json_integer_value(json_object_get(job, "attempt"));
    json_decref(job);
    if (strcmp(snap[i].state, "RUNNING") != 0 || snap[i].n_ckpt == 0) continue;
    /* Its last attempt began after the newest restored checkpoint. */
    snprintf(sql, sizeof sql, "%s/kiln.db", dir_b);
    char q[400];
    snprintf(q, sizeof q, "SELECT min(step) FROM metrics WHERE job_id = '%.63s' AND attempt = %lld",
             snap[i].id, attempt);
    long long first = db_count(sql, q);
    print_message("%s resumed at step %lld (newest restored checkpoint: step %lld)\n", snap[i].id,
                  first, snap[i].ckpt_step[snap[i].n_ckpt - 1]);
    assert_true(first > snap[i].ckpt_step[snap[i].n_ckpt - 1]);
  }
  it_stop_kilnd(pid_b, dir_b);
}

static void a_damaged_backup_is_named_and_restores_nothing(void **state) {
  (void)state;
  char text[8192], bad[400], target[400];
  snprintf(bad, sizeof bad, "%s/damaged", work);
  snprintf(target, sizeof target, "%s/never", work);
  /* A copy: the backup's checkpoint files are hard links to A's. */
  assert_int_equal(run_cmd(text, sizeof text, "cp -r '%s' '%s'", out, bad), 0);
  assert_int_equal(run_cmd(text, sizeof text,
                           "f=$(ls '%s'/files/jobs/*/checkpoints/*.safetensors | head -n1) && "
                           "printf X | dd of=\"$f\" bs=1 seek=2 conv=notrunc 2>/dev/null && "
                           "echo \"$f\"",
                           bad),
                   0);
  char damaged[600];
  snprintf(damaged, sizeof damaged, "%.590s", text);
  damaged[strcspn(damaged, "\n")] = '\0';
  assert_int_equal(
      run_cmd(text, sizeof text, "'%s' restore '%s' --data-dir '%s'", KILND_PATH, bad, target), 1);
  assert_non_null(strstr(text, damaged));
  assert_non_null(strstr(text, "is damaged"));
  assert_non_null(strstr(text, "nothing was restored"));
  struct stat sb;
  assert_int_not_equal(stat(target, &sb), 0);
  /* A target that holds something is refused. */
  assert_int_equal(
      run_cmd(text, sizeof text, "'%s' restore '%s' --data-dir '%s'", KILND_PATH, out, dir_a), 1);
  assert_non_null(strstr(text, "is not empty"));
  /* A backup into a folder that holds something is refused too. */
  assert_int_equal(
      run_cmd(text, sizeof text, "'%s' backup --data-dir '%s' '%s'", KILND_PATH, dir_a, out), 1);
  assert_non_null(strstr(text, "is not empty"));
}

static void a_referenced_file_the_disk_lacks_is_reported_and_data_sets_are_kept(void **state) {
  (void)state;
  char text[16384], copy[400], copy_out[400], copy_back[400], db[500], sql[1200];
  snprintf(copy, sizeof copy, "%s/a-copy", work);
  snprintf(copy_out, sizeof copy_out, "%s/backup-of-copy", work);
  snprintf(copy_back, sizeof copy_back, "%s/restored-copy", work);
  snprintf(db, sizeof db, "%s/kiln.db", copy);
  /* A's data directory at rest, copied; one checkpoint file removed behind
   * the database's back and an uploaded data set's row and folder added. */
  assert_int_equal(run_cmd(text, sizeof text,
                           "cp -r '%s' '%s' && mkdir -p '%s/datasets/ds-1/train' && "
                           "echo 'x,label' > '%s/datasets/ds-1/train/data.csv' && "
                           "echo '{}' > '%s/datasets/ds-1/dataset.json'",
                           dir_a, copy, copy, copy, copy),
                   0);
  sqlite3 *h = NULL;
  assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
  snprintf(sql, sizeof sql,
           "INSERT INTO datasets (id, display_name, format, path, bytes, sha256, examples,"
           " classes, create_ms) VALUES ('ds-1', 'd', 'csv', '%s/datasets/ds-1', 8, 'x', 1, 2, 1)",
           copy);
  assert_int_equal(sqlite3_exec(h, sql, NULL, NULL, NULL), SQLITE_OK);
  /* The copy's rows point into the copy, as a restore would leave them. */
  snprintf(sql, sizeof sql, "UPDATE checkpoints SET path = '%s' || substr(path, length('%s') + 1)",
           copy, dir_a);
  assert_int_equal(sqlite3_exec(h, sql, NULL, NULL, NULL), SQLITE_OK);
  sqlite3_stmt *st = NULL;
  assert_int_equal(sqlite3_prepare_v2(h, "SELECT path FROM checkpoints LIMIT 1", -1, &st, NULL),
                   SQLITE_OK);
  assert_int_equal(sqlite3_step(st), SQLITE_ROW);
  char gone[600];
  snprintf(gone, sizeof gone, "%s", sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  sqlite3_close(h);
  assert_int_equal(unlink(gone), 0);

  assert_int_equal(
      run_cmd(text, sizeof text, "'%s' backup --data-dir '%s' '%s'", KILND_PATH, copy, copy_out),
      0);
  assert_non_null(strstr(text, gone));
  assert_non_null(strstr(text, "not on disk"));
  char manifest[500], expect[800];
  snprintf(manifest, sizeof manifest, "%s/MANIFEST", copy_out);
  char *lines = it_read_file(manifest);
  assert_non_null(lines);
  snprintf(expect, sizeof expect, "\nmissing checkpoint %s\n", gone);
  assert_non_null(strstr(lines, expect));
  assert_null(strstr(strstr(lines, expect) + 1, "\nmissing ")); /* that one alone */
  assert_non_null(strstr(lines, " files/datasets/ds-1/train/data.csv\n"));
  assert_non_null(strstr(lines, " files/datasets/ds-1/dataset.json\n"));
  free(lines);
  assert_int_equal(run_cmd(text, sizeof text, "'%s' restore '%s' --data-dir '%s'", KILND_PATH,
                           copy_out, copy_back),
                   0);
  assert_non_null(strstr(text, "the backup lacks checkpoint"));
  char restored_db[500], q[1200];
  snprintf(restored_db, sizeof restored_db, "%s/kiln.db", copy_back);
  snprintf(q, sizeof q, "SELECT count(*) FROM datasets WHERE path = '%s/datasets/ds-1'", copy_back);
  assert_int_equal(db_count(restored_db, q), 1);
  char *csv = NULL;
  snprintf(q, sizeof q, "%s/datasets/ds-1/train/data.csv", copy_back);
  csv = it_read_file(q);
  assert_non_null(csv);
  assert_string_equal(csv, "x,label\n");
  free(csv);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(backup_while_serving_restores_every_job_point_and_checkpoint),
      cmocka_unit_test(a_damaged_backup_is_named_and_restores_nothing),
      cmocka_unit_test(a_referenced_file_the_disk_lacks_is_reported_and_data_sets_are_kept),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
