/* relocate.c — a data directory that moved (copied to another folder or
 * machine, restored from a backup, upgraded on a copy): its rows name
 * checkpoint and data set files by absolute path under the folder it was
 * in. store_relocate points each row outside the current folder at the same
 * file inside it, by the part of the path that names the file: from
 * "/jobs/<job>/" for a checkpoint, "/datasets/<id>" for a data set. */
#include <stdio.h>
#include <string.h>

#include "store_internal.h"

/* ?1 is the data directory (absolute, no trailing slash); a row is moved
 * when it is not under it and its path has its own job's or data set's part. */
static const char *const moves[] = {
    "UPDATE checkpoints SET path = ?1 || substr(path, instr(path, '/jobs/' || job_id || '/'))"
    " WHERE instr(path, '/jobs/' || job_id || '/') > 0"
    "   AND substr(path, 1, length(?1) + 1) <> ?1 || '/'",
    "UPDATE datasets SET path = ?1 || substr(path, instr(path, '/datasets/' || id))"
    " WHERE instr(path, '/datasets/' || id) > 0"
    "   AND substr(path, 1, length(?1) + 1) <> ?1 || '/'",
};

int store_relocate(store *s, const char *data_dir, int *moved) {
  if (moved) *moved = 0;
  if (!s || !data_dir || data_dir[0] != '/') return STORE_ERROR;
  size_t len = strlen(data_dir);
  while (len > 1 && data_dir[len - 1] == '/') len--;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR, in_tx = 0, total = 0;
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "relocate paths into %s: begin", data_dir);
    goto done;
  }
  in_tx = 1;
  for (size_t i = 0; i < sizeof moves / sizeof moves[0]; i++) {
    if (sqlite3_prepare_v2(db, moves[i], -1, &st, NULL) != SQLITE_OK) {
      store_internal_error(s, 1, "relocate paths into %s", data_dir);
      goto done;
    }
    sqlite3_bind_text(st, 1, data_dir, (int)len, SQLITE_TRANSIENT);
    if (sqlite3_step(st) != SQLITE_DONE) {
      store_internal_error(s, 1, "relocate paths into %s", data_dir);
      goto done;
    }
    total += sqlite3_changes(db);
    sqlite3_finalize(st);
    st = NULL;
  }
  if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "relocate paths into %s: commit", data_dir);
    goto done;
  }
  in_tx = 0;
  if (moved) *moved = total;
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  if (in_tx) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  store_internal_unlock(s);
  return rc;
}
