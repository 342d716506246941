/* allocations.c — where each attempt of a job on remote hosts runs: the
 * allocation (its token's hash, its state), its hosts with their ranks and
 * cores, and the relays (Open MPI daemons an agent runs for it). Ending an
 * allocation queues `drop` to the hosts it names in the same transaction. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

static void text_col(char *dst, size_t len, sqlite3_stmt *st, int col) {
  const unsigned char *v = sqlite3_column_text(st, col);
  snprintf(dst, len, "%s", v ? (const char *)v : "");
}

void store_allocation_clear(store_allocation *a) {
  if (!a) return;
  free(a->hosts);
  a->hosts = NULL;
  a->n_hosts = 0;
}

void store_allocation_list_free(store_allocation *list, int n) {
  for (int i = 0; list && i < n; i++) store_allocation_clear(&list[i]);
  free(list);
}

int store_allocation_add(store *s, const store_allocation *a, const char *token_sha256) {
  if (!s || !a || !token_sha256 || a->n_hosts < 1) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR, in_tx = 0;
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "add allocation %s: begin", a->id);
    goto done;
  }
  in_tx = 1;
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO allocations(id, job_id, attempt, pool, token_sha256, state,"
                         " create_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "add allocation %s", a->id);
    goto done;
  }
  sqlite3_bind_text(st, 1, a->id, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, a->job_id, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 3, a->attempt);
  sqlite3_bind_text(st, 4, a->pool, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 5, token_sha256, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 6, a->state[0] ? a->state : STORE_ALLOC_STARTING, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 7, a->create_ms ? a->create_ms : store_now_ms());
  if (sqlite3_step(st) != SQLITE_DONE) {
    store_internal_error(s, 1, "add allocation %s", a->id);
    goto done;
  }
  sqlite3_finalize(st);
  st = NULL;
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO allocation_hosts(alloc_id, agent_id, name, address,"
                         " rank_first, ranks, cores) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "add allocation %s: hosts", a->id);
    goto done;
  }
  for (int i = 0; i < a->n_hosts; i++) {
    const store_alloc_host *h = &a->hosts[i];
    sqlite3_reset(st);
    sqlite3_bind_text(st, 1, a->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, h->agent_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, h->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, h->address, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 5, h->rank_first);
    sqlite3_bind_int(st, 6, h->ranks);
    sqlite3_bind_text(st, 7, h->cores, -1, SQLITE_STATIC);
    if (sqlite3_step(st) != SQLITE_DONE) {
      store_internal_error(s, 1, "add allocation %s: host %s", a->id, h->name);
      goto done;
    }
  }
  if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "add allocation %s: commit", a->id);
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

#define ALLOC_COLUMNS "id, job_id, attempt, pool, state, reason, create_ms, COALESCE(end_ms, 0)"

static void read_alloc(sqlite3_stmt *st, store_allocation *a) {
  memset(a, 0, sizeof *a);
  text_col(a->id, sizeof a->id, st, 0);
  text_col(a->job_id, sizeof a->job_id, st, 1);
  a->attempt = sqlite3_column_int(st, 2);
  text_col(a->pool, sizeof a->pool, st, 3);
  text_col(a->state, sizeof a->state, st, 4);
  text_col(a->reason, sizeof a->reason, st, 5);
  a->create_ms = sqlite3_column_int64(st, 6);
  a->end_ms = sqlite3_column_int64(st, 7);
}

/* Fills a->hosts in rank order; lock held. */
static int read_hosts(store *s, sqlite3 *db, store_allocation *a) {
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db,
                         "SELECT agent_id, name, address, rank_first, ranks, cores FROM"
                         " allocation_hosts WHERE alloc_id = ?1 ORDER BY rank_first",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "read allocation %s: hosts", a->id);
    return STORE_ERROR;
  }
  sqlite3_bind_text(st, 1, a->id, -1, SQLITE_STATIC);
  int step, cap = 0;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (a->n_hosts == cap) {
      cap = cap ? cap * 2 : 4;
      store_alloc_host *grown = realloc(a->hosts, (size_t)cap * sizeof *grown);
      if (!grown) break;
      a->hosts = grown;
    }
    store_alloc_host *h = &a->hosts[a->n_hosts++];
    memset(h, 0, sizeof *h);
    text_col(h->agent_id, sizeof h->agent_id, st, 0);
    text_col(h->name, sizeof h->name, st, 1);
    text_col(h->address, sizeof h->address, st, 2);
    h->rank_first = sqlite3_column_int(st, 3);
    h->ranks = sqlite3_column_int(st, 4);
    text_col(h->cores, sizeof h->cores, st, 5);
  }
  sqlite3_finalize(st);
  if (step != SQLITE_DONE) {
    store_internal_error(s, step == SQLITE_ROW ? 0 : 1, "read allocation %s: hosts", a->id);
    return STORE_ERROR;
  }
  return STORE_OK;
}

/* The allocations a query selects, with their hosts; lock held. */
static int read_list(store *s, sqlite3 *db, sqlite3_stmt *st, const char *what,
                     store_allocation **out, int *n) {
  *out = NULL;
  *n = 0;
  store_allocation *list = NULL;
  int cap = 0, step;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (*n == cap) {
      cap = cap ? cap * 2 : 8;
      store_allocation *grown = realloc(list, (size_t)cap * sizeof *grown);
      if (!grown) {
        store_internal_error(s, 0, "%s: out of memory", what);
        store_allocation_list_free(list, *n);
        *n = 0;
        return STORE_ERROR;
      }
      list = grown;
    }
    read_alloc(st, &list[(*n)++]);
  }
  if (step != SQLITE_DONE) {
    store_internal_error(s, 1, "%s", what);
    store_allocation_list_free(list, *n);
    *n = 0;
    return STORE_ERROR;
  }
  for (int i = 0; i < *n; i++) {
    if (read_hosts(s, db, &list[i]) != STORE_OK) {
      store_allocation_list_free(list, *n);
      *n = 0;
      return STORE_ERROR;
    }
  }
  *out = list;
  return STORE_OK;
}

/* One allocation by a column's value; lock held. */
static int get_by(store *s, const char *column_sql, const char *value, store_allocation *out) {
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  store_allocation *list = NULL;
  int n = 0, rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db, column_sql, -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "read allocation");
    goto done;
  }
  sqlite3_bind_text(st, 1, value, -1, SQLITE_STATIC);
  if (read_list(s, db, st, "read allocation", &list, &n) != STORE_OK) goto done;
  if (n == 0) {
    store_internal_error(s, 0, "no such allocation");
    rc = STORE_NOT_FOUND;
    goto done;
  }
  *out = list[0];
  list[0].hosts = NULL;
  rc = STORE_OK;
done:
  store_allocation_list_free(list, n);
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}

int store_allocation_get(store *s, const char *id, store_allocation *out) {
  memset(out, 0, sizeof *out);
  if (!s || !id) return STORE_ERROR;
  return get_by(s, "SELECT " ALLOC_COLUMNS " FROM allocations WHERE id = ?1", id, out);
}

int store_allocation_by_token(store *s, const char *token_sha256, store_allocation *out) {
  memset(out, 0, sizeof *out);
  if (!s || !token_sha256) return STORE_ERROR;
  return get_by(s, "SELECT " ALLOC_COLUMNS " FROM allocations WHERE token_sha256 = ?1",
                token_sha256, out);
}

int store_allocations_unended(store *s, const char *agent_id, store_allocation **out, int *n) {
  *out = NULL;
  *n = 0;
  if (!s) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db,
                         "SELECT " ALLOC_COLUMNS " FROM allocations a WHERE state != 'ENDED' AND"
                         " (?1 IS NULL OR EXISTS (SELECT 1 FROM allocation_hosts h WHERE"
                         " h.alloc_id = a.id AND h.agent_id = ?1)) ORDER BY create_ms, id",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "list allocations");
    goto done;
  }
  if (agent_id) sqlite3_bind_text(st, 1, agent_id, -1, SQLITE_STATIC);
  rc = read_list(s, db, st, "list allocations", out, n);
done:
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}

int store_allocation_running(store *s, const char *id) {
  if (!s || !id) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db,
                         "UPDATE allocations SET state = 'RUNNING' WHERE id = ?1 AND"
                         " state = 'STARTING'",
                         -1, &st, NULL) == SQLITE_OK) {
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    rc = sqlite3_step(st) == SQLITE_DONE ? STORE_OK : STORE_ERROR;
  }
  if (rc != STORE_OK) store_internal_error(s, 1, "allocation %s: RUNNING", id);
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}

int store_allocation_end(store *s, const char *id, const char *reason, const char *except_agent,
                         int drop, int *ended) {
  if (ended) *ended = 0;
  if (!s || !id || !reason) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR, in_tx = 0;
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "end allocation %s: begin", id);
    goto done;
  }
  in_tx = 1;
  if (sqlite3_prepare_v2(db,
                         "UPDATE allocations SET state = 'ENDED', reason = ?2, end_ms = ?3"
                         " WHERE id = ?1 AND state != 'ENDED'",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "end allocation %s", id);
    goto done;
  }
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, reason, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 3, store_now_ms());
  if (sqlite3_step(st) != SQLITE_DONE) {
    store_internal_error(s, 1, "end allocation %s", id);
    goto done;
  }
  int changed = sqlite3_changes(db);
  sqlite3_finalize(st);
  st = NULL;
  if (changed && drop) {
    if (sqlite3_prepare_v2(db,
                           "SELECT agent_id FROM allocation_hosts WHERE alloc_id = ?1 AND"
                           " (?2 IS NULL OR agent_id != ?2) ORDER BY rank_first",
                           -1, &st, NULL) != SQLITE_OK) {
      store_internal_error(s, 1, "end allocation %s: hosts", id);
      goto done;
    }
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    if (except_agent) sqlite3_bind_text(st, 2, except_agent, -1, SQLITE_STATIC);
    char payload[128];
    snprintf(payload, sizeof payload, "{\"alloc\":\"%s\"}", id);
    char agents[STORE_ALLOC_MAX_HOSTS][32];
    int n_agents = 0, step;
    while ((step = sqlite3_step(st)) == SQLITE_ROW && n_agents < STORE_ALLOC_MAX_HOSTS)
      text_col(agents[n_agents++], sizeof agents[0], st, 0);
    sqlite3_finalize(st);
    st = NULL;
    for (int i = 0; i < n_agents; i++) {
      if (store_internal_command_enqueue(s, db, agents[i], "drop", payload, NULL) != STORE_OK)
        goto done;
    }
  }
  if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "end allocation %s: commit", id);
    goto done;
  }
  in_tx = 0;
  if (ended) *ended = changed > 0;
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  if (in_tx) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  store_internal_unlock(s);
  return rc;
}

int store_relay_add(store *s, const char *id, const char *alloc_id, const char *agent_id,
                    int64_t seq) {
  if (!s || !id || !alloc_id || !agent_id) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO relays(id, alloc_id, agent_id, seq, create_ms) VALUES"
                         " (?1, ?2, ?3, ?4, ?5)",
                         -1, &st, NULL) == SQLITE_OK) {
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, alloc_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, agent_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, seq);
    sqlite3_bind_int64(st, 5, store_now_ms());
    rc = sqlite3_step(st) == SQLITE_DONE ? STORE_OK : STORE_ERROR;
  }
  if (rc != STORE_OK) store_internal_error(s, 1, "add relay %s", id);
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}

int store_relay_get(store *s, const char *alloc_id, const char *id, char agent_id[32],
                    int64_t *seq) {
  if (!s || !alloc_id || !id) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db, "SELECT agent_id, seq FROM relays WHERE id = ?1 AND alloc_id = ?2", -1,
                         &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "read relay %s", id);
    goto done;
  }
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, alloc_id, -1, SQLITE_STATIC);
  int step = sqlite3_step(st);
  if (step == SQLITE_ROW) {
    text_col(agent_id, 32, st, 0);
    *seq = sqlite3_column_int64(st, 1);
    rc = STORE_OK;
  } else if (step == SQLITE_DONE) {
    store_internal_error(s, 0, "no relay %s in allocation %s", id, alloc_id);
    rc = STORE_NOT_FOUND;
  } else {
    store_internal_error(s, 1, "read relay %s", id);
  }
done:
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}
