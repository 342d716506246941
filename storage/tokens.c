/* tokens.c — listing and revoking bearer tokens, and when each was last
 * used (adding and finding one: store.c). Only hashes are stored; nothing
 * here reads or returns one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

static void text_col(char *dst, size_t len, sqlite3_stmt *st, int col) {
  const unsigned char *v = sqlite3_column_text(st, col);
  snprintf(dst, len, "%s", v ? (const char *)v : "");
}

int store_token_list(store *s, const char *tenant, store_token **out, int *n) {
  *out = NULL;
  *n = 0;
  if (!s) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR, cap = 0;
  store_token *list = NULL;
  if (sqlite3_prepare_v2(db,
                         "SELECT id, tenant, role, create_ms, last_used_ms FROM tokens WHERE "
                         "revoked = 0 AND (?1 IS NULL OR tenant = ?1) ORDER BY create_ms, id",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "list tokens: prepare");
    goto done;
  }
  if (tenant) sqlite3_bind_text(st, 1, tenant, -1, SQLITE_STATIC);
  int step;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (*n == cap) {
      cap = cap ? cap * 2 : 16;
      store_token *grown = realloc(list, (size_t)cap * sizeof *list);
      if (!grown) {
        store_internal_error(s, 0, "list tokens: out of memory");
        goto done;
      }
      list = grown;
    }
    store_token *t = &list[(*n)++];
    memset(t, 0, sizeof *t);
    text_col(t->id, sizeof t->id, st, 0);
    text_col(t->tenant, sizeof t->tenant, st, 1);
    text_col(t->role, sizeof t->role, st, 2);
    t->create_ms = sqlite3_column_int64(st, 3);
    t->last_used_ms = sqlite3_column_int64(st, 4);
  }
  if (step != SQLITE_DONE) {
    store_internal_error(s, 1, "list tokens");
    goto done;
  }
  *out = list;
  list = NULL;
  rc = STORE_OK;
done:
  if (rc != STORE_OK) *n = 0;
  free(list);
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}

int store_token_revoke(store *s, const char *id, const char *tenant) {
  if (!s || !id) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db,
                         "UPDATE tokens SET revoked = 1 WHERE id = ?1 AND revoked = 0 AND "
                         "(?2 IS NULL OR tenant = ?2)",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "revoke token %s: prepare", id);
    goto done;
  }
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  if (tenant) sqlite3_bind_text(st, 2, tenant, -1, SQLITE_STATIC);
  if (sqlite3_step(st) != SQLITE_DONE) {
    store_internal_error(s, 1, "revoke token %s", id);
  } else if (sqlite3_changes(db) == 0) {
    store_internal_error(s, 0, "revoke token %s: no such token", id);
    rc = STORE_NOT_FOUND;
  } else {
    rc = STORE_OK;
  }
done:
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}

int store_token_touch(store *s, const char *sha256_hex, int64_t now_ms) {
  if (!s || !sha256_hex) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db, "UPDATE tokens SET last_used_ms = ?2 WHERE sha256 = ?1", -1, &st,
                         NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "touch token: prepare");
    goto done;
  }
  sqlite3_bind_text(st, 1, sha256_hex, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, now_ms);
  if (sqlite3_step(st) != SQLITE_DONE)
    store_internal_error(s, 1, "touch token");
  else
    rc = STORE_OK;
done:
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}
