/* datasets.c — uploaded data sets in the store: add, get, list, and a
 * delete that refuses while an unfinished job names the data set; plus
 * job notes (events that are not state changes). Each call holds the
 * handle's db_lock throughout (see store.c). */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage.h"
#include "store_internal.h"

#define DATASET_COLUMNS                                                                            \
  "seq, id, display_name, format, label_column, path, bytes, sha256, examples, test_examples,"     \
  " classes, input_shape_json, create_ms, tenant, source, shards_json"

static void text_col(char *dst, size_t size, sqlite3_stmt *st, int col) {
  const char *text = (const char *)sqlite3_column_text(st, col);
  snprintf(dst, size, "%s", text ? text : "");
}

static void read_row(sqlite3_stmt *st, store_dataset *d) {
  memset(d, 0, sizeof *d);
  d->seq = sqlite3_column_int64(st, 0);
  text_col(d->id, sizeof d->id, st, 1);
  text_col(d->display_name, sizeof d->display_name, st, 2);
  text_col(d->format, sizeof d->format, st, 3);
  text_col(d->label_column, sizeof d->label_column, st, 4);
  text_col(d->path, sizeof d->path, st, 5);
  d->bytes = sqlite3_column_int64(st, 6);
  text_col(d->sha256, sizeof d->sha256, st, 7);
  d->examples = sqlite3_column_int64(st, 8);
  d->test_examples = sqlite3_column_int64(st, 9);
  d->classes = sqlite3_column_int(st, 10);
  text_col(d->input_shape_json, sizeof d->input_shape_json, st, 11);
  d->create_ms = sqlite3_column_int64(st, 12);
  text_col(d->tenant, sizeof d->tenant, st, 13);
  text_col(d->source, sizeof d->source, st, 14);
  text_col(d->shards_json, sizeof d->shards_json, st, 15);
}

int store_dataset_add(store *s, const store_dataset *d) {
  if (!s || !d) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO datasets (id, display_name, format, label_column, path, "
                         "bytes, sha256, examples, test_examples, classes, input_shape_json, "
                         "create_ms, tenant, source, shards_json) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,"
                         "?9,?10,?11,?12,?13,?14,?15)",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "add data set %s: prepare", d->id);
    goto done;
  }
  sqlite3_bind_text(st, 1, d->id, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, d->display_name, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 3, d->format, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 4, d->label_column, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 5, d->path, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 6, d->bytes);
  sqlite3_bind_text(st, 7, d->sha256, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 8, d->examples);
  sqlite3_bind_int64(st, 9, d->test_examples);
  sqlite3_bind_int(st, 10, d->classes);
  sqlite3_bind_text(st, 11, d->input_shape_json[0] ? d->input_shape_json : "[]", -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 12, d->create_ms ? d->create_ms : store_now_ms());
  sqlite3_bind_text(st, 13, d->tenant[0] ? d->tenant : STORE_DEFAULT_TENANT, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 14, d->source, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 15, d->shards_json, -1, SQLITE_STATIC);
  int step = sqlite3_step(st);
  if (step == SQLITE_DONE) {
    rc = STORE_OK;
  } else if (step == SQLITE_CONSTRAINT) {
    store_internal_error(s, 1, "add data set %s", d->id);
    rc = STORE_EXISTS;
  } else {
    store_internal_error(s, 1, "add data set %s", d->id);
  }
done:
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}

int store_dataset_get(store *s, const char *id, store_dataset *out) {
  if (!s || !id || !out) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db, "SELECT " DATASET_COLUMNS " FROM datasets WHERE id = ?1", -1, &st,
                         NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "get data set %s: prepare", id);
    goto done;
  }
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  int step = sqlite3_step(st);
  if (step == SQLITE_ROW) {
    read_row(st, out);
    rc = STORE_OK;
  } else if (step == SQLITE_DONE) {
    store_internal_error(s, 0, "get data set %s: no such data set", id);
    rc = STORE_NOT_FOUND;
  } else {
    store_internal_error(s, 1, "get data set %s", id);
  }
done:
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}

int store_dataset_list(store *s, int64_t before_seq, int limit, store_dataset **out, int *n) {
  return store_dataset_list_tenant(s, NULL, before_seq, limit, out, n);
}

int store_dataset_list_tenant(store *s, const char *tenant, int64_t before_seq, int limit,
                              store_dataset **out, int *n) {
  *out = NULL;
  *n = 0;
  if (!s || limit < 1) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR, cap = 0;
  store_dataset *list = NULL;
  if (sqlite3_prepare_v2(db,
                         "SELECT " DATASET_COLUMNS " FROM datasets WHERE (?1 = 0 OR seq < ?1)"
                         " AND (?3 IS NULL OR tenant = ?3) ORDER BY seq DESC LIMIT ?2",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "list data sets: prepare");
    goto done;
  }
  sqlite3_bind_int64(st, 1, before_seq);
  sqlite3_bind_int(st, 2, limit);
  if (tenant) sqlite3_bind_text(st, 3, tenant, -1, SQLITE_STATIC);
  int step;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (*n == cap) {
      cap = cap ? cap * 2 : 16;
      store_dataset *bigger = realloc(list, (size_t)cap * sizeof *bigger);
      if (!bigger) {
        store_internal_error(s, 0, "list data sets: out of memory");
        goto done;
      }
      list = bigger;
    }
    read_row(st, &list[(*n)++]);
  }
  if (step != SQLITE_DONE) {
    store_internal_error(s, 1, "list data sets");
    goto done;
  }
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  store_internal_unlock(s);
  if (rc != STORE_OK || *n == 0) {
    free(list);
    list = NULL;
    if (rc != STORE_OK) *n = 0;
  }
  *out = list;
  return rc;
}

int store_dataset_delete(store *s, const char *id, char *blocking_job) {
  if (!s || !id) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *use = NULL, *del = NULL;
  int rc = STORE_ERROR;
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "delete data set %s: begin transaction", id);
    goto done;
  }
  /* The spec names its data set at $.dataset.name; finished jobs keep no hold. */
  if (sqlite3_prepare_v2(db,
                         "SELECT id FROM jobs WHERE json_extract(spec_json, '$.dataset.name') = ?1"
                         " AND state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED') LIMIT 1",
                         -1, &use, NULL) != SQLITE_OK ||
      sqlite3_prepare_v2(db, "DELETE FROM datasets WHERE id = ?1", -1, &del, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "delete data set %s: prepare", id);
    goto done;
  }
  sqlite3_bind_text(use, 1, id, -1, SQLITE_STATIC);
  int step = sqlite3_step(use);
  if (step == SQLITE_ROW) {
    const char *job = (const char *)sqlite3_column_text(use, 0);
    if (blocking_job) snprintf(blocking_job, 40, "%s", job ? job : "");
    store_internal_error(s, 0, "delete data set %s: job %s uses it", id, job ? job : "?");
    rc = STORE_CONFLICT;
    goto done;
  }
  if (step != SQLITE_DONE) {
    store_internal_error(s, 1, "delete data set %s: find jobs using it", id);
    goto done;
  }
  sqlite3_bind_text(del, 1, id, -1, SQLITE_STATIC);
  if (sqlite3_step(del) != SQLITE_DONE) {
    store_internal_error(s, 1, "delete data set %s", id);
    goto done;
  }
  if (sqlite3_changes(db) == 0) {
    store_internal_error(s, 0, "delete data set %s: no such data set", id);
    rc = STORE_NOT_FOUND;
    goto done;
  }
  if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "delete data set %s: commit", id);
    goto done;
  }
  rc = STORE_OK;
done:
  sqlite3_finalize(use);
  sqlite3_finalize(del);
  if (!sqlite3_get_autocommit(db)) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  store_internal_unlock(s);
  return rc;
}

int store_job_note(store *s, const char *job_id, const char *reason, const char *message) {
  if (!s || !job_id) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO job_events (job_id, time_ms, from_state, to_state, reason,"
                         " message) SELECT id, ?2, state, state, ?3, ?4 FROM jobs WHERE id = ?1",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "note on job %s: prepare", job_id);
    goto done;
  }
  sqlite3_bind_text(st, 1, job_id, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, store_now_ms());
  sqlite3_bind_text(st, 3, reason ? reason : "", -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 4, message ? message : "", -1, SQLITE_STATIC);
  if (sqlite3_step(st) != SQLITE_DONE) {
    store_internal_error(s, 1, "note on job %s", job_id);
    goto done;
  }
  if (sqlite3_changes(db) == 0) {
    store_internal_error(s, 0, "note on job %s: no such job", job_id);
    rc = STORE_NOT_FOUND;
    goto done;
  }
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}
