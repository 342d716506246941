/* requeue.c — a job put back in the queue by the infrastructure (a
 * preemption, a kilnd shutdown): one transaction from where it is to
 * QUEUED, counted in infra_restarts, never resting in between. */
#include <stdio.h>
#include <string.h>

#include "store_internal.h"

static int exec_step(sqlite3_stmt *st) {
  return sqlite3_step(st) == SQLITE_DONE ? STORE_OK : STORE_ERROR;
}

static int add_event(sqlite3 *db, const char *id, int64_t now, const char *from, const char *to,
                     const char *reason, const char *message) {
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO job_events(job_id, time_ms, from_state, to_state, reason,"
                         " message) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                         -1, &st, NULL) != SQLITE_OK)
    return STORE_ERROR;
  sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 2, now);
  sqlite3_bind_text(st, 3, from, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 4, to, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 5, reason, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 6, message, -1, SQLITE_TRANSIENT);
  int rc = exec_step(st);
  sqlite3_finalize(st);
  return rc;
}

int store_job_requeue(store *s, const char *id, const char *via, const char *via_reason,
                      const char *via_message, const char *reason, const char *message) {
  if (!s || !id || !reason) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  char state[16] = "";
  int rc = STORE_ERROR, in_tx = 0;
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "requeue job %s: begin", id);
    goto done;
  }
  in_tx = 1;
  if (sqlite3_prepare_v2(db, "SELECT state FROM jobs WHERE id = ?1", -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "requeue job %s", id);
    goto done;
  }
  sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
  int step = sqlite3_step(st);
  if (step == SQLITE_DONE) {
    store_internal_error(s, 0, "requeue job %s: no such job", id);
    rc = STORE_NOT_FOUND;
    goto done;
  }
  if (step != SQLITE_ROW) {
    store_internal_error(s, 1, "requeue job %s", id);
    goto done;
  }
  const unsigned char *text = sqlite3_column_text(st, 0);
  snprintf(state, sizeof state, "%s", text ? (const char *)text : "");
  sqlite3_finalize(st);
  st = NULL;
  if (!strcmp(state, "SUCCEEDED") || !strcmp(state, "FAILED") || !strcmp(state, "CANCELLED")) {
    store_internal_error(s, 0, "requeue job %s: the job already ended %s", id, state);
    rc = STORE_CONFLICT;
    goto done;
  }
  int64_t now = store_now_ms();
  if (sqlite3_prepare_v2(db,
                         "UPDATE jobs SET state = 'QUEUED', reason = ?2, message = ?3,"
                         " end_ms = NULL, infra_restarts = infra_restarts + 1 WHERE id = ?1",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "requeue job %s", id);
    goto done;
  }
  sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 2, reason, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 3, message ? message : "", -1, SQLITE_TRANSIENT);
  if (exec_step(st) != STORE_OK) {
    store_internal_error(s, 1, "requeue job %s", id);
    goto done;
  }
  const char *from = state;
  if (via) {
    if (add_event(db, id, now, from, via, via_reason ? via_reason : "",
                  via_message ? via_message : "") != STORE_OK) {
      store_internal_error(s, 1, "requeue job %s: record its %s event", id, via);
      goto done;
    }
    from = via;
  }
  if (add_event(db, id, now, from, "QUEUED", reason, message ? message : "") != STORE_OK) {
    store_internal_error(s, 1, "requeue job %s: record its event", id);
    goto done;
  }
  if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "requeue job %s: commit", id);
    goto done;
  }
  in_tx = 0;
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  if (in_tx) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  store_internal_unlock(s);
  return rc;
}
