/* lookup.c — finding a tenant's job by the request_id it was created
 * with, so a retried create is answered with that job before any check
 * that only a new job must pass (quotas, the memory plan). */
#include <stdio.h>
#include <string.h>

#include "store_internal.h"

int store_job_find_request(store *s, const char *tenant, const char *request_id, char id[40]) {
  if (!s || !tenant || !request_id || !id) return STORE_ERROR;
  id[0] = '\0';
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db, "SELECT id FROM jobs WHERE tenant = ?1 AND request_id = ?2", -1, &st,
                         NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "find the job of request %s", request_id);
    goto done;
  }
  sqlite3_bind_text(st, 1, tenant, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 2, request_id, -1, SQLITE_TRANSIENT);
  int step = sqlite3_step(st);
  if (step == SQLITE_ROW) {
    const unsigned char *text = sqlite3_column_text(st, 0);
    snprintf(id, 40, "%s", text ? (const char *)text : "");
    rc = STORE_OK;
  } else if (step == SQLITE_DONE) {
    rc = STORE_NOT_FOUND;
  } else {
    store_internal_error(s, 1, "find the job of request %s", request_id);
  }
done:
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}
