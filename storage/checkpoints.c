/* checkpoints.c — checkpoint retention: a job keeps its newest keep_last
 * unpinned checkpoints and every pinned one; older rows go in one
 * transaction, each after its file. Pinning and unpinning. */
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

int store_checkpoint_retain(store *s, const char *job_id, int keep_last,
                            int (*remove_file)(const char *path, void *user), void *user,
                            int *n_deleted) {
  if (n_deleted) *n_deleted = 0;
  if (!s) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  int rc = STORE_ERROR, deleted = 0;
  sqlite3_stmt *old = NULL, *del = NULL;
  if (!job_id || !remove_file || keep_last < 1) {
    store_internal_error(s, 0, "retain checkpoints: need a job id, a remover and keep_last >= 1");
    goto done;
  }
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "retain checkpoints of job %s: begin transaction", job_id);
    goto done;
  }
  /* Newest = recorded last: a resumed attempt's checkpoints follow the
   * one it resumed from. */
  if (sqlite3_prepare_v2(db,
                         "SELECT id, path FROM checkpoints WHERE job_id = ?1 AND pinned = 0"
                         " ORDER BY id DESC LIMIT -1 OFFSET ?2",
                         -1, &old, NULL) != SQLITE_OK ||
      sqlite3_prepare_v2(db, "DELETE FROM checkpoints WHERE id = ?1", -1, &del, NULL) !=
          SQLITE_OK) {
    store_internal_error(s, 1, "retain checkpoints of job %s", job_id);
    goto done;
  }
  sqlite3_bind_text(old, 1, job_id, -1, SQLITE_STATIC);
  sqlite3_bind_int(old, 2, keep_last);
  int step;
  while ((step = sqlite3_step(old)) == SQLITE_ROW) {
    const char *path = (const char *)sqlite3_column_text(old, 1);
    /* A file that could not be removed keeps its row, for the next pass. */
    if (remove_file(path ? path : "", user) != 0) continue;
    sqlite3_bind_int64(del, 1, sqlite3_column_int64(old, 0));
    if (sqlite3_step(del) != SQLITE_DONE) {
      store_internal_error(s, 1, "retain checkpoints of job %s: delete", job_id);
      goto done;
    }
    sqlite3_reset(del);
    deleted++;
  }
  if (step != SQLITE_DONE) {
    store_internal_error(s, 1, "retain checkpoints of job %s", job_id);
    goto done;
  }
  if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "retain checkpoints of job %s: commit", job_id);
    goto done;
  }
  rc = STORE_OK;
  if (n_deleted) *n_deleted = deleted;
done:
  sqlite3_finalize(old);
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
