/* agents.c — kiln-agents in the store: registration by name (the same row
 * when a host comes back), reads and pages, heartbeats, the loss check the
 * scheduler's pass runs, and each agent's numbered commands (queued by
 * kilnd, delivered by polls, reported done by the agent). Each call holds
 * the handle's db_lock throughout; every write is one transaction. */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage.h"
#include "store_internal.h"

#define AGENT_COLUMNS                                                                              \
  "seq, id, name, hostname, pool, address, cpus, gpus_json, version, state, token_id,"             \
  " last_command_seq, last_seen_ms, create_ms"
#define COMMAND_COLUMNS "agent_id, seq, kind, payload_json, create_ms, done_ms, ok, result_json"

static void text_col(char *dst, size_t size, sqlite3_stmt *st, int col) {
  const char *text = (const char *)sqlite3_column_text(st, col);
  snprintf(dst, size, "%s", text ? text : "");
}

/* A copy of a text column; NULL only when out of memory or (or_null) the
 * column is NULL. */
static char *dup_col(sqlite3_stmt *st, int col, int or_null) {
  const char *text = (const char *)sqlite3_column_text(st, col);
  if (!text && or_null) return NULL;
  return strdup(text ? text : "");
}

static int read_agent(sqlite3_stmt *st, store_agent *a) {
  memset(a, 0, sizeof *a);
  a->seq = sqlite3_column_int64(st, 0);
  text_col(a->id, sizeof a->id, st, 1);
  text_col(a->name, sizeof a->name, st, 2);
  text_col(a->hostname, sizeof a->hostname, st, 3);
  text_col(a->pool, sizeof a->pool, st, 4);
  text_col(a->address, sizeof a->address, st, 5);
  a->cpus = sqlite3_column_int(st, 6);
  a->gpus_json = dup_col(st, 7, 0);
  text_col(a->version, sizeof a->version, st, 8);
  text_col(a->state, sizeof a->state, st, 9);
  text_col(a->token_id, sizeof a->token_id, st, 10);
  a->last_command_seq = sqlite3_column_int64(st, 11);
  a->last_seen_ms = sqlite3_column_int64(st, 12);
  a->create_ms = sqlite3_column_int64(st, 13);
  return a->gpus_json ? STORE_OK : STORE_ERROR;
}

static int read_command(sqlite3_stmt *st, store_command *c) {
  memset(c, 0, sizeof *c);
  text_col(c->agent_id, sizeof c->agent_id, st, 0);
  c->seq = sqlite3_column_int64(st, 1);
  text_col(c->kind, sizeof c->kind, st, 2);
  c->payload_json = dup_col(st, 3, 0);
  c->create_ms = sqlite3_column_int64(st, 4);
  c->done_ms = sqlite3_column_type(st, 5) == SQLITE_NULL ? 0 : sqlite3_column_int64(st, 5);
  c->ok = sqlite3_column_int(st, 6);
  c->result_json = dup_col(st, 7, 1);
  if (!c->payload_json || (sqlite3_column_type(st, 7) != SQLITE_NULL && !c->result_json))
    return STORE_ERROR;
  return STORE_OK;
}

void store_agent_clear(store_agent *a) {
  if (!a) return;
  free(a->gpus_json);
  a->gpus_json = NULL;
}

void store_agent_list_free(store_agent *list, int n) {
  for (int i = 0; list && i < n; i++) store_agent_clear(&list[i]);
  free(list);
}

void store_command_clear(store_command *c) {
  if (!c) return;
  free(c->payload_json);
  free(c->result_json);
  c->payload_json = c->result_json = NULL;
}

void store_command_list_free(store_command *list, int n) {
  for (int i = 0; list && i < n; i++) store_command_clear(&list[i]);
  free(list);
}

static int begin(store *s, sqlite3 *db, const char *what) {
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK) return STORE_OK;
  store_internal_error(s, 1, "%s: begin", what);
  return STORE_ERROR;
}

static int commit(store *s, sqlite3 *db, const char *what) {
  if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) == SQLITE_OK) return STORE_OK;
  store_internal_error(s, 1, "%s: commit", what);
  return STORE_ERROR;
}

/* Runs a prepared select of AGENT_COLUMNS, appending each row to *out. */
static int read_agents(store *s, sqlite3_stmt *st, const char *what, store_agent **out, int *n) {
  int cap = 0, step;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (*n == cap) {
      cap = cap ? cap * 2 : 16;
      store_agent *grown = realloc(*out, (size_t)cap * sizeof **out);
      if (!grown) {
        store_internal_error(s, 0, "%s: out of memory", what);
        return STORE_ERROR;
      }
      *out = grown;
    }
    if (read_agent(st, &(*out)[(*n)++]) != STORE_OK) {
      store_internal_error(s, 0, "%s: out of memory", what);
      return STORE_ERROR;
    }
  }
  if (step != SQLITE_DONE) {
    store_internal_error(s, 1, "%s", what);
    return STORE_ERROR;
  }
  return STORE_OK;
}

/* The row of id (or, with by_name, of name) into out (may be NULL). */
static int select_agent(store *s, sqlite3 *db, const char *key, int by_name, store_agent *out,
                        const char *what) {
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  const char *sql = by_name ? "SELECT " AGENT_COLUMNS " FROM agents WHERE name = ?1"
                            : "SELECT " AGENT_COLUMNS " FROM agents WHERE id = ?1";
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "%s: prepare", what);
    return STORE_ERROR;
  }
  sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
  int step = sqlite3_step(st);
  if (step == SQLITE_ROW) {
    store_agent a;
    if (read_agent(st, &a) != STORE_OK) {
      store_agent_clear(&a);
      store_internal_error(s, 0, "%s: out of memory", what);
    } else if (out) {
      *out = a;
      rc = STORE_OK;
    } else {
      store_agent_clear(&a);
      rc = STORE_OK;
    }
  } else if (step == SQLITE_DONE) {
    store_internal_error(s, 0, "%s: no such agent", what);
    rc = STORE_NOT_FOUND;
  } else {
    store_internal_error(s, 1, "%s", what);
  }
  sqlite3_finalize(st);
  return rc;
}

int store_agent_register(store *s, const store_agent *a, int64_t now_ms, store_agent *out,
                         int *created) {
  if (created) *created = 0;
  if (out) memset(out, 0, sizeof *out);
  if (!s || !a || !a->name[0]) return STORE_ERROR;
  if (!now_ms) now_ms = store_now_ms();
  char what[128];
  snprintf(what, sizeof what, "register agent %s", a->name);
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR, in_tx = 0;
  if (begin(s, db, what) != STORE_OK) goto done;
  in_tx = 1;
  /* A known name keeps its id and create_ms; a new one gets a random id. */
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO agents (id, name, hostname, pool, address, cpus, gpus_json,"
                         " version, state, token_id, last_seen_ms, create_ms)"
                         " VALUES ('agt-' || lower(hex(randomblob(8))), ?1, ?2, ?3, ?4, ?5, ?6,"
                         " ?7, 'ONLINE', ?8, ?9, ?9)"
                         " ON CONFLICT(name) DO UPDATE SET hostname = excluded.hostname,"
                         " pool = excluded.pool, address = excluded.address,"
                         " cpus = excluded.cpus, gpus_json = excluded.gpus_json,"
                         " version = excluded.version, state = 'ONLINE',"
                         " token_id = excluded.token_id, last_seen_ms = excluded.last_seen_ms",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "%s: prepare", what);
    goto done;
  }
  store_agent old;
  int known = select_agent(s, db, a->name, 1, &old, what);
  if (known != STORE_OK && known != STORE_NOT_FOUND) goto done;
  if (known == STORE_OK) {
    /* Another token's agent moves to this one only once it is LOST: a
     * token cannot take over a host that is alive. */
    const int taken =
        strcmp(old.token_id, a->token_id) != 0 && strcmp(old.state, STORE_AGENT_ONLINE) == 0;
    store_agent_clear(&old);
    if (taken) {
      store_internal_error(s, 0, "%s: the agent is ONLINE with another token", what);
      rc = STORE_CONFLICT;
      goto done;
    }
  }
  sqlite3_bind_text(st, 1, a->name, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, a->hostname, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 3, a->pool, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 4, a->address, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 5, a->cpus);
  sqlite3_bind_text(st, 6, a->gpus_json ? a->gpus_json : "[]", -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 7, a->version, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 8, a->token_id, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 9, now_ms);
  if (sqlite3_step(st) != SQLITE_DONE) {
    store_internal_error(s, 1, "%s", what);
    goto done;
  }
  if (out && select_agent(s, db, a->name, 1, out, what) != STORE_OK) goto done;
  if (commit(s, db, what) != STORE_OK) {
    store_agent_clear(out);
    goto done;
  }
  in_tx = 0;
  if (created) *created = known == STORE_NOT_FOUND;
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  if (in_tx) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  store_internal_unlock(s);
  return rc;
}

int store_agent_get(store *s, const char *id_or_name, store_agent *out) {
  if (!s || !id_or_name || !out) return STORE_ERROR;
  memset(out, 0, sizeof *out);
  char what[128];
  snprintf(what, sizeof what, "get agent %.60s", id_or_name);
  sqlite3 *db = store_internal_lock(s);
  int rc = select_agent(s, db, id_or_name, 0, out, what);
  if (rc == STORE_NOT_FOUND) rc = select_agent(s, db, id_or_name, 1, out, what);
  store_internal_unlock(s);
  return rc;
}

int store_agent_list(store *s, const store_agent_query *q, store_agent **out, int *n) {
  *out = NULL;
  *n = 0;
  if (!s || !q || q->limit < 1) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db,
                         "SELECT " AGENT_COLUMNS " FROM agents WHERE seq > ?1"
                         " AND (?2 IS NULL OR pool = ?2) AND (?3 IS NULL OR state = ?3)"
                         " ORDER BY seq LIMIT ?4",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "list agents: prepare");
    goto done;
  }
  sqlite3_bind_int64(st, 1, q->after_seq);
  if (q->pool) sqlite3_bind_text(st, 2, q->pool, -1, SQLITE_STATIC);
  if (q->state) sqlite3_bind_text(st, 3, q->state, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 4, q->limit);
  rc = read_agents(s, st, "list agents", out, n);
done:
  if (rc != STORE_OK) {
    store_agent_list_free(*out, *n);
    *out = NULL;
    *n = 0;
  }
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}

int store_agent_touch(store *s, const char *id, int64_t now_ms) {
  if (!s || !id) return STORE_ERROR;
  if (!now_ms) now_ms = store_now_ms();
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db,
                         "UPDATE agents SET last_seen_ms = MAX(last_seen_ms, ?2)"
                         " WHERE id = ?1 AND state = 'ONLINE'",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "touch agent %s: prepare", id);
    goto done;
  }
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, now_ms);
  if (sqlite3_step(st) != SQLITE_DONE) {
    store_internal_error(s, 1, "touch agent %s", id);
    goto done;
  }
  if (sqlite3_changes(db) == 1) {
    rc = STORE_OK;
    goto done;
  }
  /* Nothing changed: absent, or LOST until it registers again. */
  store_agent a;
  rc = select_agent(s, db, id, 0, &a, "touch agent");
  if (rc == STORE_OK) {
    store_agent_clear(&a);
    store_internal_error(s, 0, "touch agent %s: the agent is LOST; it must register again", id);
    rc = STORE_CONFLICT;
  }
done:
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}

int store_agents_mark_lost(store *s, int64_t now_ms, int grace_s, const char *pool,
                           store_agent **lost, int *n) {
  store_agent *list = NULL;
  int count = 0;
  if (lost) *lost = NULL;
  if (n) *n = 0;
  if (!s || grace_s < 0) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR, in_tx = 0;
  const char *what = "mark lost agents";
  if (begin(s, db, what) != STORE_OK) goto done;
  in_tx = 1;
  /* Read then update under one write lock: a registration cannot slip in
   * between, so exactly the agents read are the ones marked. */
  if (sqlite3_prepare_v2(db,
                         "SELECT " AGENT_COLUMNS " FROM agents WHERE state = 'ONLINE'"
                         " AND last_seen_ms < ?1 AND (?2 IS NULL OR pool = ?2) ORDER BY seq",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "%s: prepare", what);
    goto done;
  }
  const int64_t cutoff = now_ms - (int64_t)grace_s * 1000;
  sqlite3_bind_int64(st, 1, cutoff);
  if (pool) sqlite3_bind_text(st, 2, pool, -1, SQLITE_STATIC);
  if (read_agents(s, st, what, &list, &count) != STORE_OK) goto done;
  sqlite3_finalize(st);
  st = NULL;
  if (sqlite3_prepare_v2(db, "UPDATE agents SET state = 'LOST' WHERE id = ?1", -1, &st, NULL) !=
      SQLITE_OK) {
    store_internal_error(s, 1, "%s: prepare", what);
    goto done;
  }
  for (int i = 0; i < count; i++) {
    sqlite3_reset(st);
    sqlite3_bind_text(st, 1, list[i].id, -1, SQLITE_STATIC);
    if (sqlite3_step(st) != SQLITE_DONE) {
      store_internal_error(s, 1, "%s: agent %s", what, list[i].id);
      goto done;
    }
    snprintf(list[i].state, sizeof list[i].state, "%s", STORE_AGENT_LOST);
  }
  if (commit(s, db, what) != STORE_OK) goto done;
  in_tx = 0;
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  if (in_tx) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  store_internal_unlock(s);
  if (rc == STORE_OK && lost) {
    *lost = list;
    list = NULL;
  }
  if (rc == STORE_OK && n) *n = count;
  store_agent_list_free(list, count);
  return rc;
}

/* ---- commands ---- */

int store_internal_command_enqueue(store *s, sqlite3 *db, const char *agent_id, const char *kind,
                                   const char *payload_json, int64_t *seq) {
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (!kind || !kind[0] || strlen(kind) > 15) {
    store_internal_error(s, 0, "queue a command for agent %s: kind must be 1-15 characters",
                         agent_id);
    return STORE_ERROR;
  }
  if (sqlite3_prepare_v2(db,
                         "UPDATE agents SET last_command_seq = last_command_seq + 1"
                         " WHERE id = ?1 RETURNING last_command_seq",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "queue a command for agent %s: prepare", agent_id);
    goto done;
  }
  sqlite3_bind_text(st, 1, agent_id, -1, SQLITE_STATIC);
  int step = sqlite3_step(st);
  if (step == SQLITE_DONE) {
    store_internal_error(s, 0, "queue a command for agent %s: no such agent", agent_id);
    rc = STORE_NOT_FOUND;
    goto done;
  }
  if (step != SQLITE_ROW) {
    store_internal_error(s, 1, "queue a command for agent %s", agent_id);
    goto done;
  }
  const int64_t next = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  st = NULL;
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO agent_commands (agent_id, seq, kind, payload_json,"
                         " create_ms) VALUES (?1, ?2, ?3, json(?4), ?5)",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "queue a command for agent %s: prepare", agent_id);
    goto done;
  }
  sqlite3_bind_text(st, 1, agent_id, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, next);
  sqlite3_bind_text(st, 3, kind, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 4, payload_json ? payload_json : "{}", -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 5, store_now_ms());
  if (sqlite3_step(st) != SQLITE_DONE) {
    store_internal_error(s, 1, "queue command %s for agent %s (payload must be JSON)", kind,
                         agent_id);
    goto done;
  }
  if (seq) *seq = next;
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  return rc;
}

int store_command_enqueue(store *s, const char *agent_id, const char *kind,
                          const char *payload_json, int64_t *seq) {
  if (!s || !agent_id) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  int rc = STORE_ERROR;
  if (begin(s, db, "queue a command") != STORE_OK) goto done;
  /* A payload that is not an object is refused before anything is written. */
  sqlite3_stmt *st = NULL;
  int is_object = 0;
  if (sqlite3_prepare_v2(db, "SELECT json_valid(?1) AND json_type(?1) = 'object'", -1, &st, NULL) ==
      SQLITE_OK) {
    sqlite3_bind_text(st, 1, payload_json ? payload_json : "{}", -1, SQLITE_STATIC);
    is_object = sqlite3_step(st) == SQLITE_ROW && sqlite3_column_int(st, 0) == 1;
  }
  sqlite3_finalize(st);
  if (!is_object) {
    store_internal_error(s, 0, "queue command %s for agent %s: the payload must be a JSON object",
                         kind ? kind : "", agent_id);
  } else {
    rc = store_internal_command_enqueue(s, db, agent_id, kind, payload_json, seq);
  }
  if (rc == STORE_OK && commit(s, db, "queue a command") != STORE_OK) rc = STORE_ERROR;
  if (rc != STORE_OK) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
done:
  store_internal_unlock(s);
  return rc;
}

int store_command_list(store *s, const char *agent_id, int64_t after_seq, int pending_only,
                       int limit, store_command **out, int *n) {
  *out = NULL;
  *n = 0;
  if (!s || !agent_id || limit < 0) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR, cap = 0, step;
  store_command *list = NULL;
  const char *sql = pending_only
                        ? "SELECT " COMMAND_COLUMNS " FROM agent_commands WHERE agent_id = ?1"
                          " AND seq > ?2 AND done_ms IS NULL ORDER BY seq LIMIT ?3"
                        : "SELECT " COMMAND_COLUMNS " FROM agent_commands WHERE agent_id = ?1"
                          " AND seq > ?2 ORDER BY seq LIMIT ?3";
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "list commands of agent %s: prepare", agent_id);
    goto done;
  }
  sqlite3_bind_text(st, 1, agent_id, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, after_seq);
  sqlite3_bind_int(st, 3, limit > 0 ? limit : -1); /* SQLite: a negative LIMIT is none */
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (*n == cap) {
      cap = cap ? cap * 2 : 16;
      store_command *grown = realloc(list, (size_t)cap * sizeof *list);
      if (!grown) break;
      list = grown;
    }
    if (read_command(st, &list[(*n)++]) != STORE_OK) break;
  }
  if (step == SQLITE_ROW) {
    store_internal_error(s, 0, "list commands of agent %s: out of memory", agent_id);
    goto done;
  }
  if (step != SQLITE_DONE) {
    store_internal_error(s, 1, "list commands of agent %s", agent_id);
    goto done;
  }
  *out = list;
  list = NULL;
  rc = STORE_OK;
done:
  if (rc != STORE_OK) {
    store_command_list_free(list, *n);
    *n = 0;
  }
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}

static int select_command(store *s, sqlite3 *db, const char *agent_id, int64_t seq,
                          store_command *out, const char *what) {
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (sqlite3_prepare_v2(
          db, "SELECT " COMMAND_COLUMNS " FROM agent_commands WHERE agent_id = ?1 AND seq = ?2", -1,
          &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "%s: prepare", what);
    return STORE_ERROR;
  }
  sqlite3_bind_text(st, 1, agent_id, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, seq);
  int step = sqlite3_step(st);
  if (step == SQLITE_ROW) {
    store_command c;
    if (read_command(st, &c) != STORE_OK) {
      store_command_clear(&c);
      store_internal_error(s, 0, "%s: out of memory", what);
    } else {
      if (out)
        *out = c;
      else
        store_command_clear(&c);
      rc = STORE_OK;
    }
  } else if (step == SQLITE_DONE) {
    store_internal_error(s, 0, "%s: no such command", what);
    rc = STORE_NOT_FOUND;
  } else {
    store_internal_error(s, 1, "%s", what);
  }
  sqlite3_finalize(st);
  return rc;
}

int store_command_get(store *s, const char *agent_id, int64_t seq, store_command *out) {
  if (!s || !agent_id || !out) return STORE_ERROR;
  memset(out, 0, sizeof *out);
  char what[128];
  snprintf(what, sizeof what, "get command %lld of agent %.40s", (long long)seq, agent_id);
  sqlite3 *db = store_internal_lock(s);
  int rc = select_command(s, db, agent_id, seq, out, what);
  store_internal_unlock(s);
  return rc;
}

int store_command_done(store *s, const char *agent_id, int64_t seq, int ok, const char *result_json,
                       int64_t now_ms, int *newly) {
  if (newly) *newly = 0;
  if (!s || !agent_id) return STORE_ERROR;
  if (!now_ms) now_ms = store_now_ms();
  char what[128];
  snprintf(what, sizeof what, "command %lld of agent %.40s done", (long long)seq, agent_id);
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR, in_tx = 0;
  if (begin(s, db, what) != STORE_OK) goto done;
  in_tx = 1;
  /* The first report wins: a repeated :done (a retry after a lost answer)
   * changes nothing. */
  if (sqlite3_prepare_v2(db,
                         "UPDATE agent_commands SET done_ms = ?3, ok = ?4, result_json = json(?5)"
                         " WHERE agent_id = ?1 AND seq = ?2 AND done_ms IS NULL",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "%s: prepare", what);
    goto done;
  }
  sqlite3_bind_text(st, 1, agent_id, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, seq);
  sqlite3_bind_int64(st, 3, now_ms);
  sqlite3_bind_int(st, 4, ok ? 1 : 0);
  sqlite3_bind_text(st, 5, result_json ? result_json : "{}", -1, SQLITE_STATIC);
  if (sqlite3_step(st) != SQLITE_DONE) {
    store_internal_error(s, 1, "%s (result must be JSON)", what);
    goto done;
  }
  const int changed = sqlite3_changes(db);
  if (!changed) { /* already done, or no such command */
    int found = select_command(s, db, agent_id, seq, NULL, what);
    if (found != STORE_OK) {
      rc = found;
      goto done;
    }
  }
  if (commit(s, db, what) != STORE_OK) goto done;
  in_tx = 0;
  if (newly) *newly = changed;
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  if (in_tx) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  store_internal_unlock(s);
  return rc;
}
