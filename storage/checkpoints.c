/* checkpoints.c — checkpoint retention: a job keeps its newest keep_last
 * unpinned checkpoints, its keep_best best by a metric and every pinned
 * one; the rest go in one transaction, each row after its file. Which to
 * keep is decided in one place, retention_keeps(). Pinning and unpinning. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

typedef struct retain_row {
  int64_t id;
  char *path;
  double score; /* the monitored metric, sign-flipped so lower is better; NAN = none */
  int pinned;   /* never removed, and not counted in keep_last */
  int keep;
} retain_row;

static int by_score(const void *a, const void *b) {
  const retain_row *x = *(retain_row *const *)a, *y = *(retain_row *const *)b;
  if (x->score != y->score) return x->score < y->score ? -1 : 1;
  return x->id > y->id ? -1 : x->id < y->id; /* ties: the newer is better */
}

/* Sets keep on the rows (newest first) the policy keeps: every pinned one,
 * the keep_last newest unpinned (at least the newest one when keep_best is
 * set, so a job can still resume), and the keep_best best scored ones. 0,
 * or -1 out of memory. */
static int retention_keeps(retain_row *rows, int n, const store_retention *policy) {
  int keep_last = policy->keep_last;
  if (keep_last < 1 && policy->keep_best > 0) keep_last = 1;
  for (int i = 0, unpinned = 0; i < n; i++)
    rows[i].keep = rows[i].pinned || keep_last < 1 || unpinned++ < keep_last;
  if (policy->keep_best <= 0) return 0;
  retain_row **scored = malloc((size_t)(n > 0 ? n : 1) * sizeof *scored);
  if (!scored) return -1;
  int n_scored = 0;
  for (int i = 0; i < n; i++)
    if (!isnan(rows[i].score)) scored[n_scored++] = &rows[i];
  qsort(scored, (size_t)n_scored, sizeof *scored, by_score);
  for (int i = 0; i < n_scored && i < policy->keep_best; i++) scored[i]->keep = 1;
  free(scored);
  return 0;
}

int store_checkpoint_retain(store *s, const char *job_id, int keep_last,
                            int (*remove_file)(const char *path, void *user), void *user,
                            int *n_deleted) {
  if (keep_last < 1) {
    if (n_deleted) *n_deleted = 0;
    if (!s) return STORE_ERROR;
    store_internal_lock(s);
    store_internal_error(s, 0, "retain checkpoints: need a job id, a remover and keep_last >= 1");
    store_internal_unlock(s);
    return STORE_ERROR;
  }
  store_retention policy = {.keep_last = keep_last};
  return store_checkpoint_retain_policy(s, job_id, &policy, remove_file, user, n_deleted);
}

int store_checkpoint_retain_policy(store *s, const char *job_id, const store_retention *policy,
                                   int (*remove_file)(const char *path, void *user), void *user,
                                   int *n_deleted) {
  if (n_deleted) *n_deleted = 0;
  if (!s) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  int rc = STORE_ERROR, deleted = 0, n = 0, cap = 0;
  retain_row *rows = NULL;
  sqlite3_stmt *list = NULL, *del = NULL;
  if (!job_id || !remove_file || !policy || policy->keep_last < 0 || policy->keep_best < 0 ||
      (policy->keep_best > 0 && (!policy->monitor || !policy->monitor[0]))) {
    store_internal_error(s, 0,
                         "retain checkpoints: need a job id, a remover, keep_last and keep_best "
                         ">= 0 and a monitor for keep_best");
    goto done;
  }
  if (policy->keep_last == 0 && policy->keep_best == 0) { /* keep everything */
    rc = STORE_OK;
    goto done;
  }
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "retain checkpoints of job %s: begin transaction", job_id);
    goto done;
  }
  /* Newest = recorded last: a resumed attempt's checkpoints follow the one
   * it resumed from. The monitored value comes out of metrics_json by a
   * bound JSON path, so no metric name reaches the SQL text. */
  if (sqlite3_prepare_v2(db,
                         "SELECT id, path, CASE WHEN json_valid(metrics_json)"
                         " THEN json_extract(metrics_json, ?2) END, pinned"
                         " FROM checkpoints WHERE job_id = ?1 ORDER BY id DESC",
                         -1, &list, NULL) != SQLITE_OK ||
      sqlite3_prepare_v2(db, "DELETE FROM checkpoints WHERE id = ?1", -1, &del, NULL) !=
          SQLITE_OK) {
    store_internal_error(s, 1, "retain checkpoints of job %s", job_id);
    goto done;
  }
  char json_path[128] = "$.\"\"";
  if (policy->keep_best > 0 && strlen(policy->monitor) < sizeof json_path - 8 &&
      !strchr(policy->monitor, '"'))
    snprintf(json_path, sizeof json_path, "$.\"%s\"", policy->monitor);
  sqlite3_bind_text(list, 1, job_id, -1, SQLITE_STATIC);
  sqlite3_bind_text(list, 2, json_path, -1, SQLITE_TRANSIENT);
  int step;
  while ((step = sqlite3_step(list)) == SQLITE_ROW) {
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      retain_row *more = realloc(rows, (size_t)cap * sizeof *more);
      if (!more) {
        store_internal_error(s, 0, "retain checkpoints of job %s: out of memory", job_id);
        goto done;
      }
      rows = more;
    }
    retain_row *r = &rows[n];
    const char *path = (const char *)sqlite3_column_text(list, 1);
    r->id = sqlite3_column_int64(list, 0);
    r->path = strdup(path ? path : "");
    int type = sqlite3_column_type(list, 2);
    r->score =
        type == SQLITE_INTEGER || type == SQLITE_FLOAT ? sqlite3_column_double(list, 2) : NAN;
    if (policy->higher_is_better) r->score = -r->score;
    r->pinned = sqlite3_column_int(list, 3) != 0;
    n++;
    if (!r->path) {
      store_internal_error(s, 0, "retain checkpoints of job %s: out of memory", job_id);
      goto done;
    }
  }
  if (step != SQLITE_DONE) {
    store_internal_error(s, 1, "retain checkpoints of job %s", job_id);
    goto done;
  }
  if (retention_keeps(rows, n, policy) != 0) {
    store_internal_error(s, 0, "retain checkpoints of job %s: out of memory", job_id);
    goto done;
  }
  for (int i = 0; i < n; i++) {
    if (rows[i].keep) continue;
    /* A file that could not be removed keeps its row, for the next pass. */
    if (remove_file(rows[i].path, user) != 0) continue;
    sqlite3_bind_int64(del, 1, rows[i].id);
    if (sqlite3_step(del) != SQLITE_DONE) {
      store_internal_error(s, 1, "retain checkpoints of job %s: delete", job_id);
      goto done;
    }
    sqlite3_reset(del);
    deleted++;
  }
  if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "retain checkpoints of job %s: commit", job_id);
    goto done;
  }
  rc = STORE_OK;
  if (n_deleted) *n_deleted = deleted;
done:
  for (int i = 0; i < n; i++) free(rows[i].path);
  free(rows);
  sqlite3_finalize(list);
  sqlite3_finalize(del);
  if (!sqlite3_get_autocommit(db)) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  store_internal_unlock(s);
  return rc;
}

int store_checkpoint_set_pinned(store *s, const char *job_id, int64_t id, int pinned) {
  if (!s) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  int rc = STORE_ERROR;
  sqlite3_stmt *st = NULL;
  if (!job_id) {
    store_internal_error(s, 0, "pin checkpoint: need a job id");
    goto done;
  }
  if (sqlite3_prepare_v2(db, "UPDATE checkpoints SET pinned = ?1 WHERE job_id = ?2 AND id = ?3", -1,
                         &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "pin checkpoint %lld of job %s", (long long)id, job_id);
    goto done;
  }
  sqlite3_bind_int(st, 1, pinned ? 1 : 0);
  sqlite3_bind_text(st, 2, job_id, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 3, id);
  if (sqlite3_step(st) != SQLITE_DONE) {
    store_internal_error(s, 1, "pin checkpoint %lld of job %s", (long long)id, job_id);
    goto done;
  }
  if (sqlite3_changes(db) == 0) {
    store_internal_error(s, 0, "job %s has no checkpoint %lld", job_id, (long long)id);
    rc = STORE_NOT_FOUND;
    goto done;
  }
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}
