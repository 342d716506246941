/* quota.c — each tenant's quota, as an admin set it, and what the tenant
 * holds against it (waiting jobs, devices asked for, bytes stored). */
#include <string.h>

#include "store_internal.h"

static void bind_limit(sqlite3_stmt *st, int i, int64_t v) {
  if (v == STORE_QUOTA_DEFAULT)
    sqlite3_bind_null(st, i);
  else
    sqlite3_bind_int64(st, i, v);
}

static int64_t column_limit(sqlite3_stmt *st, int col) {
  return sqlite3_column_type(st, col) == SQLITE_NULL ? STORE_QUOTA_DEFAULT
                                                     : sqlite3_column_int64(st, col);
}

int store_quota_get(store *s, const char *tenant, store_quota *out) {
  if (!s || !tenant || !out) return STORE_ERROR;
  out->max_priority = out->max_devices = out->max_queued_jobs = out->max_storage_bytes =
      STORE_QUOTA_DEFAULT;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db,
                         "SELECT max_priority, max_devices, max_queued_jobs, max_storage_bytes"
                         " FROM tenant_quotas WHERE tenant = ?1",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "read the quota of tenant %s", tenant);
    goto done;
  }
  sqlite3_bind_text(st, 1, tenant, -1, SQLITE_TRANSIENT);
  int step = sqlite3_step(st);
  if (step == SQLITE_ROW) {
    out->max_priority = column_limit(st, 0);
    out->max_devices = column_limit(st, 1);
    out->max_queued_jobs = column_limit(st, 2);
    out->max_storage_bytes = column_limit(st, 3);
  } else if (step != SQLITE_DONE) {
    store_internal_error(s, 1, "read the quota of tenant %s", tenant);
    goto done;
  }
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}

int store_quota_effective(store *s, const char *tenant, const store_quota *defaults,
                          store_quota *out) {
  int rc = store_quota_get(s, tenant, out);
  if (rc != STORE_OK) return rc;
  if (out->max_priority == STORE_QUOTA_DEFAULT) out->max_priority = defaults->max_priority;
  if (out->max_devices == STORE_QUOTA_DEFAULT) out->max_devices = defaults->max_devices;
  if (out->max_queued_jobs == STORE_QUOTA_DEFAULT) out->max_queued_jobs = defaults->max_queued_jobs;
  if (out->max_storage_bytes == STORE_QUOTA_DEFAULT)
    out->max_storage_bytes = defaults->max_storage_bytes;
  return STORE_OK;
}

int store_quota_put(store *s, const char *tenant, const store_quota *q) {
  if (!s || !tenant || !q) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO tenant_quotas(tenant, max_priority, max_devices,"
                         " max_queued_jobs, max_storage_bytes, update_ms)"
                         " VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT(tenant) DO UPDATE SET"
                         " max_priority = ?2, max_devices = ?3, max_queued_jobs = ?4,"
                         " max_storage_bytes = ?5, update_ms = ?6",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "set the quota of tenant %s", tenant);
    goto done;
  }
  sqlite3_bind_text(st, 1, tenant, -1, SQLITE_TRANSIENT);
  bind_limit(st, 2, q->max_priority);
  bind_limit(st, 3, q->max_devices);
  bind_limit(st, 4, q->max_queued_jobs);
  bind_limit(st, 5, q->max_storage_bytes);
  sqlite3_bind_int64(st, 6, store_now_ms());
  if (sqlite3_step(st) != SQLITE_DONE) {
    store_internal_error(s, 1, "set the quota of tenant %s", tenant);
    goto done;
  }
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}

int store_usage_get(store *s, const char *tenant, store_usage *out) {
  if (!s || !tenant || !out) return STORE_ERROR;
  memset(out, 0, sizeof *out);
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  /* One statement: one snapshot of the three figures. */
  if (sqlite3_prepare_v2(
          db,
          "SELECT"
          " (SELECT count(*) FROM jobs WHERE tenant = ?1 AND state IN ('QUEUED', 'PREEMPTED')),"
          " (SELECT COALESCE(SUM(devices), 0) FROM jobs WHERE tenant = ?1"
          "   AND state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED')),"
          " (SELECT COALESCE(SUM(bytes), 0) FROM datasets WHERE tenant = ?1 AND source = '')"
          " + (SELECT COALESCE(SUM(c.bytes), 0) FROM checkpoints c JOIN jobs j ON j.id = c.job_id"
          "   WHERE j.tenant = ?1)",
          -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "read the usage of tenant %s", tenant);
    goto done;
  }
  sqlite3_bind_text(st, 1, tenant, -1, SQLITE_TRANSIENT);
  if (sqlite3_step(st) != SQLITE_ROW) {
    store_internal_error(s, 1, "read the usage of tenant %s", tenant);
    goto done;
  }
  out->queued_jobs = sqlite3_column_int64(st, 0);
  out->devices = sqlite3_column_int64(st, 1);
  out->storage_bytes = sqlite3_column_int64(st, 2);
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}
