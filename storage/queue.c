/* queue.c — what a scheduling pass reads: the whole queue in claim order,
 * from one covering index, and each tenant's recent starts. */
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

static void copy_text(char *dst, size_t size, sqlite3_stmt *st, int col) {
  const unsigned char *text = sqlite3_column_text(st, col);
  size_t len = text ? strlen((const char *)text) : 0;
  if (len >= size) len = size - 1;
  if (len) memcpy(dst, text, len);
  dst[len] = '\0';
}

int store_job_queue_load(store *s, store_queued **out, int *n, int *cap) {
  if (!s || !out || !n) return STORE_ERROR;
  int have = (*out && cap) ? *cap : 0;
  if (!have) *out = NULL;
  *n = 0;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR, step;
  if (sqlite3_prepare_v2(db,
                         "SELECT seq, id, tenant, pool, priority, devices, max_runtime_s,"
                         " not_before_ms FROM jobs INDEXED BY jobs_queue"
                         " WHERE state = 'QUEUED' ORDER BY priority DESC, seq",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "load the queue");
    goto done;
  }
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (*n == have) {
      int grown = have ? have * 2 : 256;
      store_queued *more = realloc(*out, (size_t)grown * sizeof *more);
      if (!more) {
        store_internal_error(s, 0, "load the queue: out of memory for %d jobs", grown);
        goto done;
      }
      *out = more;
      have = grown;
    }
    store_queued *q = &(*out)[(*n)++];
    q->seq = sqlite3_column_int64(st, 0);
    copy_text(q->id, sizeof q->id, st, 1);
    copy_text(q->tenant, sizeof q->tenant, st, 2);
    copy_text(q->pool, sizeof q->pool, st, 3);
    q->priority = sqlite3_column_int(st, 4);
    q->devices = sqlite3_column_int(st, 5);
    q->max_runtime_s = sqlite3_column_int(st, 6);
    q->not_before_ms = sqlite3_column_int64(st, 7); /* NULL reads as 0 */
  }
  if (step != SQLITE_DONE) {
    store_internal_error(s, 1, "load the queue");
    goto done;
  }
  rc = STORE_OK;
done:
  if (cap) *cap = have;
  if (rc != STORE_OK) *n = 0;
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}

int store_tenant_starts(store *s, int64_t since_ms,
                        void (*fn)(const char *tenant, int64_t starts, void *user), void *user) {
  if (!s || !fn) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR, step;
  if (sqlite3_prepare_v2(db,
                         "SELECT tenant, count(*) FROM jobs WHERE start_ms >= ?1 GROUP BY tenant",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "count starts per tenant");
    goto done;
  }
  sqlite3_bind_int64(st, 1, since_ms);
  while ((step = sqlite3_step(st)) == SQLITE_ROW)
    fn((const char *)sqlite3_column_text(st, 0), sqlite3_column_int64(st, 1), user);
  if (step != SQLITE_DONE) {
    store_internal_error(s, 1, "count starts per tenant");
    goto done;
  }
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}
