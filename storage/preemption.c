/* preemption.c — what the scheduler asks before preempting: the highest
 * priority among queued jobs that may start now. */
#include "store_internal.h"

int store_job_top_queued_priority(store *s, int64_t now_ms, int *priority) {
  if (!s || !priority) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db,
                         "SELECT max(priority) FROM jobs WHERE state = 'QUEUED'"
                         " AND (not_before_ms IS NULL OR not_before_ms <= ?1)",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "top queued priority");
    goto done;
  }
  sqlite3_bind_int64(st, 1, now_ms);
  if (sqlite3_step(st) != SQLITE_ROW) {
    store_internal_error(s, 1, "top queued priority");
    goto done;
  }
  if (sqlite3_column_type(st, 0) == SQLITE_NULL) {
    rc = STORE_EMPTY;
  } else {
    *priority = sqlite3_column_int(st, 0);
    rc = STORE_OK;
  }
done:
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}
