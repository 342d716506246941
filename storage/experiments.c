/* experiments.c — experiments, their trials and events: created with every
 * trial at once, trials started (a job inserted in the same transaction),
 * promoted (the job's spec and state changed with the trial's) and moved,
 * so a crash at any point leaves the search where one of its steps left
 * it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

#define EXPERIMENT_COLUMNS                                                                         \
  "seq, id, tenant, request_id, display_name, spec_json, search_json, state, message, "            \
  "create_ms, end_ms"

#define TRIAL_COLUMNS                                                                              \
  "t.experiment_id, t.idx, t.values_json, t.job_id, j.state, t.state, t.rung, t.epochs, "          \
  "t.results, t.planned_memory_bytes"

static void copy_text(char *dst, size_t size, sqlite3_stmt *st, int col) {
  const char *text = (const char *)sqlite3_column_text(st, col);
  snprintf(dst, size, "%s", text ? text : "");
}

static char *dup_text(sqlite3_stmt *st, int col) {
  const char *text = (const char *)sqlite3_column_text(st, col);
  return strdup(text ? text : "");
}

static void bind_str(sqlite3_stmt *st, int i, const char *text) {
  sqlite3_bind_text(st, i, text ? text : "", -1, SQLITE_TRANSIENT);
}

void store_experiment_clear(store_experiment *e) {
  if (!e) return;
  free(e->spec_json);
  free(e->search_json);
  free(e->message);
  e->spec_json = e->search_json = e->message = NULL;
}

void store_experiment_list_free(store_experiment *list, int n) {
  if (!list) return;
  for (int i = 0; i < n; i++) store_experiment_clear(&list[i]);
  free(list);
}

void store_trial_list_free(store_trial *list, int n) {
  if (!list) return;
  for (int i = 0; i < n; i++) free(list[i].values_json);
  free(list);
}

void store_experiment_events_free(store_experiment_event *events, int n) {
  if (!events) return;
  for (int i = 0; i < n; i++) free(events[i].message);
  free(events);
}

static int read_experiment(sqlite3_stmt *st, store_experiment *out) {
  memset(out, 0, sizeof *out);
  out->seq = sqlite3_column_int64(st, 0);
  copy_text(out->id, sizeof out->id, st, 1);
  copy_text(out->tenant, sizeof out->tenant, st, 2);
  copy_text(out->request_id, sizeof out->request_id, st, 3);
  copy_text(out->display_name, sizeof out->display_name, st, 4);
  out->spec_json = dup_text(st, 5);
  out->search_json = dup_text(st, 6);
  copy_text(out->state, sizeof out->state, st, 7);
  out->message = dup_text(st, 8);
  out->create_ms = sqlite3_column_int64(st, 9);
  out->end_ms = sqlite3_column_int64(st, 10);
  if (!out->spec_json || !out->search_json || !out->message) {
    store_experiment_clear(out);
    return STORE_ERROR;
  }
  return STORE_OK;
}

/* "0.81,0.86" -> results. */
static void parse_results(const char *text, store_trial *t) {
  t->n_results = 0;
  while (text && *text && t->n_results < STORE_MAX_RUNGS) {
    char *end = NULL;
    double v = strtod(text, &end);
    if (end == text) break;
    t->results[t->n_results++] = v;
    text = *end == ',' ? end + 1 : end;
  }
}

static int read_trial(sqlite3_stmt *st, store_trial *out) {
  memset(out, 0, sizeof *out);
  copy_text(out->experiment, sizeof out->experiment, st, 0);
  out->index = sqlite3_column_int(st, 1);
  out->values_json = dup_text(st, 2);
  copy_text(out->job_id, sizeof out->job_id, st, 3);
  copy_text(out->job_state, sizeof out->job_state, st, 4);
  copy_text(out->state, sizeof out->state, st, 5);
  out->rung = sqlite3_column_int(st, 6);
  out->epochs = sqlite3_column_int(st, 7);
  parse_results((const char *)sqlite3_column_text(st, 8), out);
  out->planned_memory_bytes = sqlite3_column_int64(st, 9);
  return out->values_json ? STORE_OK : STORE_ERROR;
}

static int begin(store *s, sqlite3 *db, const char *what) {
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK) return STORE_OK;
  store_internal_error(s, 1, "%s: begin transaction", what);
  return STORE_ERROR;
}

static int commit(store *s, sqlite3 *db, const char *what) {
  if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) == SQLITE_OK) return STORE_OK;
  store_internal_error(s, 1, "%s: commit", what);
  return STORE_ERROR;
}

static void rollback_open(sqlite3 *db) {
  if (!sqlite3_get_autocommit(db)) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
}

/* One statement that changes rows, run to its end; STORE_OK or STORE_ERROR. */
static int exec_bound(store *s, sqlite3 *db, sqlite3_stmt *st, const char *what, int *changed) {
  int rc = sqlite3_step(st) == SQLITE_DONE ? STORE_OK : STORE_ERROR;
  if (rc != STORE_OK) store_internal_error(s, 1, "%s", what);
  if (changed) *changed = sqlite3_changes(db);
  sqlite3_finalize(st);
  return rc;
}

static int add_event(store *s, sqlite3 *db, const char *experiment, const char *reason,
                     const char *job_id, const char *message) {
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO experiment_events(experiment_id, time_ms, reason, job_id,"
                         " message) VALUES (?1, ?2, ?3, ?4, ?5)",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "record an event of experiment %s", experiment);
    return STORE_ERROR;
  }
  bind_str(st, 1, experiment);
  sqlite3_bind_int64(st, 2, store_now_ms());
  bind_str(st, 3, reason);
  bind_str(st, 4, job_id);
  bind_str(st, 5, message);
  return exec_bound(s, db, st, "record an experiment event", NULL);
}

static int select_experiment(store *s, sqlite3 *db, const char *sql, const char *a, const char *b,
                             store_experiment *out, const char *what) {
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "%s", what);
    return STORE_ERROR;
  }
  bind_str(st, 1, a);
  if (b) bind_str(st, 2, b);
  int step = sqlite3_step(st), rc;
  if (step == SQLITE_ROW) {
    rc = out ? read_experiment(st, out) : STORE_OK;
    if (rc != STORE_OK) store_internal_error(s, 0, "%s: out of memory", what);
  } else if (step == SQLITE_DONE) {
    store_internal_error(s, 0, "%s: no such experiment", what);
    rc = STORE_NOT_FOUND;
  } else {
    store_internal_error(s, 1, "%s", what);
    rc = STORE_ERROR;
  }
  sqlite3_finalize(st);
  return rc;
}

int store_experiment_create(store *s, const store_experiment *e, const store_trial *trials,
                            int n_trials, store_experiment *existing) {
  if (!s || !e || !e->id[0] || (n_trials > 0 && !trials)) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  const char *tenant = e->tenant[0] ? e->tenant : STORE_DEFAULT_TENANT;
  if (begin(s, db, "create experiment") != STORE_OK) goto done;
  if (e->request_id[0]) {
    rc = select_experiment(s, db,
                           "SELECT " EXPERIMENT_COLUMNS
                           " FROM experiments WHERE tenant = ?1 AND request_id = ?2",
                           tenant, e->request_id, existing, "look up the experiment's request_id");
    if (rc == STORE_OK) {
      rc = STORE_EXISTS;
      goto done;
    }
    if (rc != STORE_NOT_FOUND) goto done;
    rc = STORE_ERROR;
  }
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO experiments(id, tenant, request_id, display_name, spec_json,"
                         " search_json, state, message, create_ms)"
                         " VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'RUNNING', '', ?7)",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "create experiment %s", e->id);
    goto done;
  }
  bind_str(st, 1, e->id);
  bind_str(st, 2, tenant);
  if (e->request_id[0])
    bind_str(st, 3, e->request_id);
  else
    sqlite3_bind_null(st, 3);
  bind_str(st, 4, e->display_name);
  bind_str(st, 5, e->spec_json);
  bind_str(st, 6, e->search_json);
  sqlite3_bind_int64(st, 7, e->create_ms ? e->create_ms : store_now_ms());
  if (exec_bound(s, db, st, "insert experiment", NULL) != STORE_OK) goto done;
  for (int i = 0; i < n_trials; i++) {
    if (sqlite3_prepare_v2(db,
                           "INSERT INTO trials(experiment_id, idx, values_json, state,"
                           " planned_memory_bytes) VALUES (?1, ?2, ?3, 'WAITING', ?4)",
                           -1, &st, NULL) != SQLITE_OK) {
      store_internal_error(s, 1, "insert trial %d of experiment %s", i, e->id);
      goto done;
    }
    bind_str(st, 1, e->id);
    sqlite3_bind_int(st, 2, trials[i].index);
    bind_str(st, 3, trials[i].values_json ? trials[i].values_json : "{}");
    sqlite3_bind_int64(st, 4, trials[i].planned_memory_bytes);
    if (exec_bound(s, db, st, "insert trial", NULL) != STORE_OK) goto done;
  }
  char msg[96];
  snprintf(msg, sizeof msg, "created with %d trial(s)", n_trials);
  if (add_event(s, db, e->id, "EXPERIMENT_CREATED", "", msg) != STORE_OK) goto done;
  if (commit(s, db, "create experiment") != STORE_OK) goto done;
  rc = STORE_OK;
done:
  rollback_open(db);
  store_internal_unlock(s);
  return rc;
}

int store_experiment_get(store *s, const char *id, store_experiment *out) {
  if (!s || !id || !out) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  int rc = select_experiment(s, db, "SELECT " EXPERIMENT_COLUMNS " FROM experiments WHERE id = ?1",
                             id, NULL, out, "get experiment");
  store_internal_unlock(s);
  return rc;
}

int store_experiment_find_request(store *s, const char *tenant, const char *request_id,
                                  char id[40]) {
  if (!s || !tenant || !request_id) return STORE_ERROR;
  store_experiment e;
  sqlite3 *db = store_internal_lock(s);
  int rc = select_experiment(
      s, db, "SELECT " EXPERIMENT_COLUMNS " FROM experiments WHERE tenant = ?1 AND request_id = ?2",
      tenant, request_id, &e, "find the experiment of a request");
  store_internal_unlock(s);
  if (rc == STORE_OK) {
    snprintf(id, 40, "%s", e.id);
    store_experiment_clear(&e);
  }
  return rc;
}

int store_experiment_list(store *s, const char *tenant, const char *state, int64_t before_seq,
                          int limit, store_experiment **out, int *n) {
  if (!s || !out || !n || limit < 1) return STORE_ERROR;
  *out = NULL;
  *n = 0;
  char sql[512];
  snprintf(sql, sizeof sql,
           "SELECT " EXPERIMENT_COLUMNS " FROM experiments WHERE seq < ?1%s%s"
           " ORDER BY seq DESC LIMIT ?2",
           tenant ? " AND tenant = ?3" : "", state ? " AND state = ?4" : "");
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  store_experiment *list = NULL;
  int used = 0, rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "list experiments");
    goto done;
  }
  sqlite3_bind_int64(st, 1, before_seq > 0 ? before_seq : INT64_MAX);
  sqlite3_bind_int(st, 2, limit);
  if (tenant) bind_str(st, 3, tenant);
  if (state) bind_str(st, 4, state);
  list = calloc((size_t)limit, sizeof *list);
  if (!list) goto done;
  int step = SQLITE_DONE;
  while (used < limit && (step = sqlite3_step(st)) == SQLITE_ROW) {
    if (read_experiment(st, &list[used]) != STORE_OK) goto done;
    used++;
  }
  if (used < limit && step != SQLITE_DONE) {
    store_internal_error(s, 1, "list experiments");
    goto done;
  }
  *out = used ? list : NULL;
  *n = used;
  if (!used) free(list);
  list = NULL;
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  store_experiment_list_free(list, used);
  store_internal_unlock(s);
  return rc;
}

int store_experiment_running(store *s, char (**ids)[40], int *n) {
  if (!s || !ids || !n) return STORE_ERROR;
  *ids = NULL;
  *n = 0;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR, cap = 0;
  if (sqlite3_prepare_v2(db, "SELECT id FROM experiments WHERE state = 'RUNNING' ORDER BY seq", -1,
                         &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "list running experiments");
    goto done;
  }
  int step;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (*n == cap) {
      cap = cap ? cap * 2 : 8;
      char(*bigger)[40] = realloc(*ids, (size_t)cap * sizeof **ids);
      if (!bigger) goto done;
      *ids = bigger;
    }
    copy_text((*ids)[*n], 40, st, 0);
    (*n)++;
  }
  if (step != SQLITE_DONE) {
    store_internal_error(s, 1, "list running experiments");
    goto done;
  }
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  if (rc != STORE_OK) {
    free(*ids);
    *ids = NULL;
    *n = 0;
  }
  store_internal_unlock(s);
  return rc;
}

static int query_trials(store *s, sqlite3 *db, sqlite3_stmt *st, store_trial **out, int *n,
                        const char *what) {
  store_trial *list = NULL;
  int used = 0, cap = 0, step = SQLITE_DONE;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (used == cap) {
      cap = cap ? cap * 2 : 16;
      store_trial *bigger = realloc(list, (size_t)cap * sizeof *list);
      if (!bigger) break;
      list = bigger;
    }
    if (read_trial(st, &list[used]) != STORE_OK) break;
    used++;
  }
  (void)db;
  if (step != SQLITE_DONE) {
    store_internal_error(s, step == SQLITE_ROW ? 0 : 1, "%s%s", what,
                         step == SQLITE_ROW ? ": out of memory" : "");
    store_trial_list_free(list, used);
    return STORE_ERROR;
  }
  *out = list;
  *n = used;
  return STORE_OK;
}

int store_trial_list(store *s, const char *experiment, int first_index, int limit,
                     store_trial **out, int *n) {
  if (!s || !experiment || !out || !n) return STORE_ERROR;
  *out = NULL;
  *n = 0;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db,
                         "SELECT " TRIAL_COLUMNS
                         " FROM trials t LEFT JOIN jobs j ON j.id = t.job_id"
                         " WHERE t.experiment_id = ?1 AND t.idx >= ?2 ORDER BY t.idx LIMIT ?3",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "list the trials of experiment %s", experiment);
    goto done;
  }
  bind_str(st, 1, experiment);
  sqlite3_bind_int(st, 2, first_index);
  sqlite3_bind_int(st, 3, limit > 0 ? limit : -1);
  rc = query_trials(s, db, st, out, n, "list trials");
done:
  sqlite3_finalize(st);
  store_internal_unlock(s);
  return rc;
}

int store_trial_of_job(store *s, const char *job_id, store_trial *out) {
  if (!s || !job_id || !out) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  store_trial *list = NULL;
  int n = 0, rc = STORE_ERROR;
  if (sqlite3_prepare_v2(db,
                         "SELECT " TRIAL_COLUMNS
                         " FROM trials t LEFT JOIN jobs j ON j.id = t.job_id"
                         " WHERE t.job_id = ?1",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "find the trial of job %s", job_id);
    goto done;
  }
  bind_str(st, 1, job_id);
  rc = query_trials(s, db, st, &list, &n, "find the trial of a job");
  if (rc == STORE_OK && n == 0) rc = STORE_NOT_FOUND;
  if (rc == STORE_OK) {
    *out = list[0];
    list[0].values_json = NULL;
  }
done:
  sqlite3_finalize(st);
  store_trial_list_free(list, n);
  store_internal_unlock(s);
  return rc;
}

/* Inside a transaction: 1 when the experiment is RUNNING, 0 when not (or
 * absent), -1 on failure. */
static int experiment_running(store *s, sqlite3 *db, const char *experiment) {
  store_experiment e;
  int rc = select_experiment(s, db, "SELECT " EXPERIMENT_COLUMNS " FROM experiments WHERE id = ?1",
                             experiment, NULL, &e, "read experiment");
  if (rc == STORE_NOT_FOUND) return 0;
  if (rc != STORE_OK) return -1;
  int running = strcmp(e.state, "RUNNING") == 0;
  store_experiment_clear(&e);
  if (!running) store_internal_error(s, 0, "experiment %s has ended", experiment);
  return running;
}

/* Moves the trial from `from` with the given columns, in a transaction;
 * STORE_CONFLICT when it is not in from. */
static int move_trial(store *s, sqlite3 *db, const char *experiment, int index, const char *from,
                      const char *to, int rung, int epochs, const char *append, const char *job) {
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db,
                         "UPDATE trials SET state = ?4,"
                         " rung = CASE WHEN ?5 >= 0 THEN ?5 ELSE rung END,"
                         " epochs = CASE WHEN ?6 >= 0 THEN ?6 ELSE epochs END,"
                         " results = CASE WHEN ?7 = '' THEN results WHEN results = '' THEN ?7"
                         "   ELSE results || ',' || ?7 END,"
                         " job_id = COALESCE(?8, job_id)"
                         " WHERE experiment_id = ?1 AND idx = ?2 AND state = ?3",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "update trial %d of experiment %s", index, experiment);
    return STORE_ERROR;
  }
  bind_str(st, 1, experiment);
  sqlite3_bind_int(st, 2, index);
  bind_str(st, 3, from);
  bind_str(st, 4, to);
  sqlite3_bind_int(st, 5, rung);
  sqlite3_bind_int(st, 6, epochs);
  bind_str(st, 7, append);
  if (job)
    bind_str(st, 8, job);
  else
    sqlite3_bind_null(st, 8);
  int changed = 0;
  if (exec_bound(s, db, st, "update trial", &changed) != STORE_OK) return STORE_ERROR;
  if (changed == 0) {
    store_internal_error(s, 0, "trial %d of experiment %s is not %s", index, experiment, from);
    return STORE_CONFLICT;
  }
  return STORE_OK;
}

int store_trial_start(store *s, const char *experiment, int index, const store_job *job,
                      const char *message) {
  if (!s || !experiment || !job || !job->id[0]) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  int rc = begin(s, db, "start a trial");
  if (rc == STORE_OK) {
    int running = experiment_running(s, db, experiment);
    rc = running < 0 ? STORE_ERROR : running ? STORE_OK : STORE_CONFLICT;
  }
  if (rc == STORE_OK)
    rc = move_trial(s, db, experiment, index, "WAITING", "RUNNING", 0, 0, "", job->id);
  if (rc == STORE_OK) {
    store_job linked = *job;
    snprintf(linked.experiment, sizeof linked.experiment, "%s", experiment);
    rc = store_internal_job_insert(s, &linked);
  }
  if (rc == STORE_OK) rc = add_event(s, db, experiment, "TRIAL_CREATED", job->id, message);
  if (rc == STORE_OK) rc = commit(s, db, "start a trial");
  rollback_open(db);
  store_internal_unlock(s);
  return rc;
}

int store_trial_promote(store *s, const char *experiment, int index, const char *spec_json,
                        int rung, const char *message) {
  if (!s || !experiment || !spec_json) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  store_trial *list = NULL;
  int n = 0;
  sqlite3_stmt *st = NULL;
  int rc = begin(s, db, "promote a trial");
  if (rc == STORE_OK) {
    int running = experiment_running(s, db, experiment);
    rc = running < 0 ? STORE_ERROR : running ? STORE_OK : STORE_CONFLICT;
  }
  if (rc == STORE_OK) {
    if (sqlite3_prepare_v2(db,
                           "SELECT " TRIAL_COLUMNS
                           " FROM trials t LEFT JOIN jobs j ON j.id = t.job_id"
                           " WHERE t.experiment_id = ?1 AND t.idx = ?2",
                           -1, &st, NULL) != SQLITE_OK) {
      store_internal_error(s, 1, "read trial %d of experiment %s", index, experiment);
      rc = STORE_ERROR;
    } else {
      bind_str(st, 1, experiment);
      sqlite3_bind_int(st, 2, index);
      rc = query_trials(s, db, st, &list, &n, "read trial");
      sqlite3_finalize(st);
      st = NULL;
      if (rc == STORE_OK && n == 0) rc = STORE_NOT_FOUND;
    }
  }
  if (rc == STORE_OK)
    rc = move_trial(s, db, experiment, index, "PAUSED", "PROMOTED", rung, -1, "", NULL);
  if (rc == STORE_OK) {
    if (sqlite3_prepare_v2(db, "UPDATE jobs SET spec_json = ?2 WHERE id = ?1", -1, &st, NULL) !=
        SQLITE_OK) {
      store_internal_error(s, 1, "update the spec of job %s", list[0].job_id);
      rc = STORE_ERROR;
    } else {
      bind_str(st, 1, list[0].job_id);
      bind_str(st, 2, spec_json);
      rc = exec_bound(s, db, st, "update a trial's spec", NULL);
    }
  }
  if (rc == STORE_OK)
    rc = store_internal_job_move(s, list[0].job_id, "SUCCEEDED", "QUEUED", "TRIAL_PROMOTED",
                                 message);
  if (rc == STORE_OK) rc = add_event(s, db, experiment, "TRIAL_PROMOTED", list[0].job_id, message);
  if (rc == STORE_OK) rc = commit(s, db, "promote a trial");
  rollback_open(db);
  store_trial_list_free(list, n);
  store_internal_unlock(s);
  return rc;
}

int store_trial_update(store *s, const char *experiment, int index, const char *from,
                       const char *to, int epochs, const double *result, const char *reason,
                       const char *message) {
  if (!s || !experiment || !from || !to) return STORE_ERROR;
  char append[40] = "";
  if (result) snprintf(append, sizeof append, "%.17g", isfinite(*result) ? *result : NAN);
  sqlite3 *db = store_internal_lock(s);
  char job[40] = "";
  int rc = begin(s, db, "update a trial");
  if (rc == STORE_OK) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT job_id FROM trials WHERE experiment_id = ?1 AND idx = ?2",
                           -1, &st, NULL) == SQLITE_OK) {
      bind_str(st, 1, experiment);
      sqlite3_bind_int(st, 2, index);
      if (sqlite3_step(st) == SQLITE_ROW) copy_text(job, sizeof job, st, 0);
    }
    sqlite3_finalize(st);
    rc = move_trial(s, db, experiment, index, from, to, -1, epochs, append, NULL);
  }
  if (rc == STORE_OK && reason) rc = add_event(s, db, experiment, reason, job, message);
  if (rc == STORE_OK) rc = commit(s, db, "update a trial");
  rollback_open(db);
  store_internal_unlock(s);
  return rc;
}

int store_experiment_finish(store *s, const char *id, const char *state, const char *reason,
                            const char *message) {
  if (!s || !id || !state) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = begin(s, db, "end an experiment"), changed = 0;
  if (rc == STORE_OK) {
    if (sqlite3_prepare_v2(db,
                           "UPDATE experiments SET state = ?2, message = ?3, end_ms = ?4"
                           " WHERE id = ?1 AND state = 'RUNNING'",
                           -1, &st, NULL) != SQLITE_OK) {
      store_internal_error(s, 1, "end experiment %s", id);
      rc = STORE_ERROR;
    } else {
      bind_str(st, 1, id);
      bind_str(st, 2, state);
      bind_str(st, 3, message);
      sqlite3_bind_int64(st, 4, store_now_ms());
      rc = exec_bound(s, db, st, "end an experiment", &changed);
    }
  }
  if (rc == STORE_OK && changed == 0) {
    store_internal_error(s, 0, "experiment %s is not running", id);
    rc = STORE_CONFLICT;
  }
  if (rc == STORE_OK) rc = add_event(s, db, id, reason ? reason : state, "", message);
  if (rc == STORE_OK) rc = commit(s, db, "end an experiment");
  rollback_open(db);
  store_internal_unlock(s);
  return rc;
}

int store_experiment_events(store *s, const char *id, store_experiment_event **out, int *n) {
  if (!s || !id || !out || !n) return STORE_ERROR;
  *out = NULL;
  *n = 0;
  sqlite3 *db = store_internal_lock(s);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR, cap = 0, step;
  if (sqlite3_prepare_v2(db,
                         "SELECT time_ms, reason, job_id, message FROM experiment_events"
                         " WHERE experiment_id = ?1 ORDER BY id",
                         -1, &st, NULL) != SQLITE_OK) {
    store_internal_error(s, 1, "list the events of experiment %s", id);
    goto done;
  }
  bind_str(st, 1, id);
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (*n == cap) {
      cap = cap ? cap * 2 : 16;
      store_experiment_event *bigger = realloc(*out, (size_t)cap * sizeof **out);
      if (!bigger) goto done;
      *out = bigger;
    }
    store_experiment_event *ev = &(*out)[*n];
    ev->time_ms = sqlite3_column_int64(st, 0);
    copy_text(ev->reason, sizeof ev->reason, st, 1);
    copy_text(ev->job_id, sizeof ev->job_id, st, 2);
    ev->message = dup_text(st, 3);
    if (!ev->message) goto done;
    (*n)++;
  }
  if (step != SQLITE_DONE) {
    store_internal_error(s, 1, "list the events of experiment %s", id);
    goto done;
  }
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  if (rc != STORE_OK) {
    store_experiment_events_free(*out, *n);
    *out = NULL;
    *n = 0;
  }
  store_internal_unlock(s);
  return rc;
}
