/* store.c — kiln's SQLite store: open/close, jobs and their state events,
 * metrics and checkpoints. Values reach SQL only through bound parameters of
 * prepared statements; every multi-row write is one BEGIN IMMEDIATE
 * transaction, so a writer never has to upgrade a read lock and deadlock.
 *
 * Threads: any thread may call any function on a shared handle. The
 * connection (db) and errmsg are guarded by db_lock, held for the whole of
 * each public call; handle_id never changes after open. last_error is
 * thread-local. */
#include "storage.h"

#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "migrations.h"
#include "store_internal.h"

#define STORE_ERRLEN          512
#define STORE_BUSY_TIMEOUT_MS 5000

#define STORE_STMT_CACHE 64

/* A prepared statement kept for reuse: preparing costs more than most of
 * the queries themselves (tens of microseconds), on every API call. */
typedef struct cached_stmt {
  uint64_t hash; /* of sql: most lookups compare this alone */
  char *sql;
  sqlite3_stmt *st;
  int busy; /* handed out and not yet released */
} cached_stmt;

struct store {
  pthread_mutex_t db_lock;
  sqlite3 *db;                         /* guarded by db_lock */
  cached_stmt cache[STORE_STMT_CACHE]; /* guarded by db_lock */
  int n_cached;
  uint64_t handle_id;           /* unique per open, tags last_error */
  char errmsg[STORE_ERRLEN];    /* guarded by db_lock */
  store_wal_worker *wal_worker; /* background checkpoints, or NULL */
  int64_t changes; /* the connection's row changes at the last unlock; guarded by db_lock */
};

/* Moves whenever any handle of this process has written (store_generation):
 * kilnd's server and scheduler each have their own handle. */
static _Atomic uint64_t process_generation;

/* Releases db_lock, first moving the process's generation if this handle
 * changed any row while it held the lock. */
static void unlock_db(store *s) {
  if (s->db) {
    const int64_t changes = sqlite3_total_changes64(s->db);
    if (changes != s->changes) {
      s->changes = changes;
      atomic_fetch_add(&process_generation, 1);
    }
  }
  pthread_mutex_unlock(&s->db_lock);
}

uint64_t store_generation(store *s) {
  (void)s;
  return atomic_load(&process_generation);
}

/* The calling thread's last failure and the handle it came from: lets
 * store_errmsg explain this thread's failed call even when another thread
 * fails on the same handle in between. */
static _Thread_local struct {
  uint64_t handle_id;
  char msg[STORE_ERRLEN];
} last_error;

static atomic_uint_fast64_t next_handle_id = 1;

static const char *const job_states[] = {"QUEUED",    "STARTING", "RUNNING",   "STOPPING",
                                         "SUCCEEDED", "FAILED",   "CANCELLED", "PREEMPTED"};

/* ---- errors ------------------------------------------------------------ */

static void set_verror(store *s, const char *sqlite_msg, const char *fmt, va_list ap) {
  int len = vsnprintf(s->errmsg, sizeof s->errmsg, fmt, ap);
  if (sqlite_msg && len >= 0 && (size_t)len < sizeof s->errmsg)
    snprintf(s->errmsg + len, sizeof s->errmsg - (size_t)len, ": %s", sqlite_msg);
  last_error.handle_id = s->handle_id;
  memcpy(last_error.msg, s->errmsg, sizeof last_error.msg);
}

/* A sentence of our own: "get job abc: no such job". */
__attribute__((format(printf, 2, 3))) static void set_error(store *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_verror(s, NULL, fmt, ap);
  va_end(ap);
}

/* What we were doing plus SQLite's reason: "insert job abc: UNIQUE constraint
 * failed: jobs.id". Call before anything else touches the connection. */
__attribute__((format(printf, 2, 3))) static void db_error(store *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_verror(s, sqlite3_errmsg(s->db), fmt, ap);
  va_end(ap);
}

/* For store_open, which has no handle to keep its sentence in yet. */
__attribute__((format(printf, 3, 4))) static void copy_error(char *errbuf, size_t errlen,
                                                             const char *fmt, ...) {
  if (!errbuf || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(errbuf, errlen, fmt, ap);
  va_end(ap);
}

/* ---- small helpers ----------------------------------------------------- */

/* A statement for sql, from the cache when an idle one is there; give it
 * back with release(), never sqlite3_finalize. */
static uint64_t sql_hash(const char *sql) {
  uint64_t h = 1469598103934665603ULL; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)sql; *p; p++)
    h = (h ^ *p) * 1099511628211ULL;
  return h;
}

static int prepare(store *s, sqlite3_stmt **st, const char *sql, const char *what) {
  uint64_t hash = sql_hash(sql);
  for (int i = 0; i < s->n_cached; i++) {
    if (!s->cache[i].busy && s->cache[i].hash == hash && strcmp(s->cache[i].sql, sql) == 0) {
      s->cache[i].busy = 1;
      *st = s->cache[i].st;
      return STORE_OK;
    }
  }
  if (sqlite3_prepare_v2(s->db, sql, -1, st, NULL) != SQLITE_OK) {
    db_error(s, "%s: prepare", what);
    *st = NULL;
    return STORE_ERROR;
  }
  if (s->n_cached < STORE_STMT_CACHE) {
    char *copy = strdup(sql);
    if (copy) s->cache[s->n_cached++] = (cached_stmt){hash, copy, *st, 1};
  }
  return STORE_OK;
}

/* Ends a statement from prepare(): a cached one is reset (dropping its read
 * lock and bindings) for the next call, any other finalized. NULL is a no-op. */
static void release(store *s, sqlite3_stmt *st) {
  if (!st) return;
  for (int i = 0; i < s->n_cached; i++) {
    if (s->cache[i].st == st) {
      sqlite3_reset(st);
      sqlite3_clear_bindings(st);
      s->cache[i].busy = 0;
      return;
    }
  }
  sqlite3_finalize(st);
}

static int tx_begin(store *s, const char *what) {
  if (sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK) return STORE_OK;
  db_error(s, "%s: begin transaction", what);
  return STORE_ERROR;
}

static int tx_commit(store *s, const char *what) {
  if (sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL) == SQLITE_OK) return STORE_OK;
  db_error(s, "%s: commit", what);
  return STORE_ERROR;
}

/* Ends a transaction left open by a failure or an early return; a no-op after
 * a successful commit. */
static void tx_end(store *s) {
  if (!sqlite3_get_autocommit(s->db)) sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
}

static void bind_text(sqlite3_stmt *st, int i, const char *text) {
  sqlite3_bind_text(st, i, text ? text : "", -1, SQLITE_STATIC);
}

static void copy_column(char *dst, size_t size, sqlite3_stmt *st, int col) {
  const char *text = (const char *)sqlite3_column_text(st, col);
  snprintf(dst, size, "%s", text ? text : "");
}

static char *dup_column(sqlite3_stmt *st, int col) {
  const char *text = (const char *)sqlite3_column_text(st, col);
  return strdup(text ? text : "");
}

/* Makes room for one more element in a malloc'd array of *cap elements. */
static int grow(void **array, int *cap, int used, size_t elem_size) {
  if (used < *cap) return STORE_OK;
  int new_cap = *cap ? *cap * 2 : 16;
  void *bigger = realloc(*array, (size_t)new_cap * elem_size);
  if (!bigger) return STORE_ERROR;
  *array = bigger;
  *cap = new_cap;
  return STORE_OK;
}

static int is_known_state(const char *state) {
  for (size_t i = 0; i < sizeof job_states / sizeof job_states[0]; i++) {
    if (strcmp(state, job_states[i]) == 0) return 1;
  }
  return 0;
}

static int is_terminal_state(const char *state) {
  return strcmp(state, "SUCCEEDED") == 0 || strcmp(state, "FAILED") == 0 ||
         strcmp(state, "CANCELLED") == 0;
}

/* ---- open / close ------------------------------------------------------ */

int64_t store_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Connection settings every handle needs; msg gets a sentence on failure. */
static int configure(sqlite3 *db, char *msg, size_t msglen) {
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  sqlite3_busy_timeout(db, STORE_BUSY_TIMEOUT_MS);
  if (sqlite3_exec(db, "PRAGMA foreign_keys = ON", NULL, NULL, NULL) != SQLITE_OK) {
    snprintf(msg, msglen, "enable foreign keys: %s", sqlite3_errmsg(db));
    goto done;
  }
  /* The pragma is silently ignored by a SQLite built without foreign keys. */
  if (sqlite3_prepare_v2(db, "PRAGMA foreign_keys", -1, &st, NULL) != SQLITE_OK ||
      sqlite3_step(st) != SQLITE_ROW || sqlite3_column_int(st, 0) != 1) {
    snprintf(msg, msglen, "enable foreign keys: this SQLite does not enforce them");
    goto done;
  }
  sqlite3_finalize(st);
  st = NULL;
  if (sqlite3_prepare_v2(db, "PRAGMA journal_mode = WAL", -1, &st, NULL) != SQLITE_OK ||
      sqlite3_step(st) != SQLITE_ROW) {
    snprintf(msg, msglen, "set WAL journal mode: %s", sqlite3_errmsg(db));
    goto done;
  }
  const char *mode = (const char *)sqlite3_column_text(st, 0);
  /* ":memory:" databases report "memory" and cannot use WAL; they have no
   * other connection to share with, so that is fine. */
  if (!mode || (strcmp(mode, "wal") != 0 && strcmp(mode, "memory") != 0)) {
    snprintf(msg, msglen, "set WAL journal mode: SQLite kept journal_mode=%s",
             mode ? mode : "(null)");
    goto done;
  }
  if (sqlite3_exec(db, "PRAGMA synchronous = NORMAL", NULL, NULL, NULL) != SQLITE_OK) {
    snprintf(msg, msglen, "set synchronous=NORMAL: %s", sqlite3_errmsg(db));
    goto done;
  }
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  return rc;
}

int store_open(const char *path, store **out, char *errbuf, size_t errlen) {
  char msg[STORE_ERRLEN] = "";
  store *s = NULL;
  if (errbuf && errlen > 0) errbuf[0] = '\0';
  if (!out) {
    copy_error(errbuf, errlen, "open database: out is NULL");
    return STORE_ERROR;
  }
  *out = NULL;
  if (!path || !path[0]) {
    copy_error(errbuf, errlen, "open database: path is empty");
    return STORE_ERROR;
  }
  /* We share one connection between threads behind db_lock and open it
   * without SQLite's own mutex, which needs a thread-safe build. */
  if (!sqlite3_threadsafe()) {
    copy_error(errbuf, errlen, "open database %s: this SQLite was built without thread support",
               path);
    return STORE_ERROR;
  }
  s = calloc(1, sizeof *s);
  if (!s) {
    copy_error(errbuf, errlen, "open database %s: out of memory", path);
    return STORE_ERROR;
  }
  if (pthread_mutex_init(&s->db_lock, NULL) != 0) {
    free(s);
    copy_error(errbuf, errlen, "open database %s: cannot create its mutex", path);
    return STORE_ERROR;
  }
  s->handle_id = atomic_fetch_add(&next_handle_id, 1);
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
  if (sqlite3_open_v2(path, &s->db, flags, NULL) != SQLITE_OK) {
    snprintf(msg, sizeof msg, "%s", s->db ? sqlite3_errmsg(s->db) : "out of memory");
    goto fail;
  }
  if (configure(s->db, msg, sizeof msg) != STORE_OK) goto fail;
  if (store_migrations_apply(s->db, msg, sizeof msg) != STORE_OK) goto fail;
  *out = s;
  return STORE_OK;
fail:
  copy_error(errbuf, errlen, "open database %s: %s", path, msg);
  store_close(s);
  return STORE_ERROR;
}

void store_close(store *s) {
  if (!s) return;
  if (s->db) sqlite3_wal_hook(s->db, NULL, NULL); /* before its worker goes */
  store_internal_wal_stop(s->wal_worker);
  /* Every other statement is finalized by the call that prepared it, so
   * close cannot be refused for busy statements. */
  for (int i = 0; i < s->n_cached; i++) {
    sqlite3_finalize(s->cache[i].st);
    free(s->cache[i].sql);
  }
  sqlite3_close(s->db);
  pthread_mutex_destroy(&s->db_lock);
  free(s);
}

int store_schema_version(store *s) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  char msg[STORE_ERRLEN];
  int version = 0;
  if (store_migrations_read_version(s->db, &version, msg, sizeof msg) != STORE_OK) {
    set_error(s, "%s", msg);
    version = STORE_ERROR;
  }
  unlock_db(s);
  return version;
}

const char *store_errmsg(store *s) {
  if (!s) return "store handle is NULL";
  if (last_error.handle_id != s->handle_id) {
    /* This thread has not failed on s: show the handle's last error, copied
     * so another thread's next failure cannot change it under the reader. */
    pthread_mutex_lock(&s->db_lock);
    memcpy(last_error.msg, s->errmsg, sizeof last_error.msg);
    last_error.handle_id = s->handle_id;
    unlock_db(s);
  }
  return last_error.msg;
}

/* ---- jobs -------------------------------------------------------------- */

#define JOB_COLUMNS                                                                                \
  "seq, id, request_id, display_name, spec_json, state, reason, message, priority, attempt, "      \
  "create_ms, start_ms, end_ms, tenant, pool, devices, max_runtime_s, restarts, infra_restarts, "  \
  "planned_memory_bytes, experiment_id"

/* Fills out from a row selected with JOB_COLUMNS. */
static int read_job(store *s, sqlite3_stmt *st, store_job *out) {
  memset(out, 0, sizeof *out);
  out->seq = sqlite3_column_int64(st, 0);
  copy_column(out->id, sizeof out->id, st, 1);
  copy_column(out->request_id, sizeof out->request_id, st, 2);
  copy_column(out->display_name, sizeof out->display_name, st, 3);
  out->spec_json = dup_column(st, 4);
  copy_column(out->state, sizeof out->state, st, 5);
  copy_column(out->reason, sizeof out->reason, st, 6);
  out->message = dup_column(st, 7);
  out->priority = sqlite3_column_int(st, 8);
  out->attempt = sqlite3_column_int(st, 9);
  out->create_ms = sqlite3_column_int64(st, 10);
  out->start_ms = sqlite3_column_int64(st, 11); /* NULL reads as 0 */
  out->end_ms = sqlite3_column_int64(st, 12);
  copy_column(out->tenant, sizeof out->tenant, st, 13);
  copy_column(out->pool, sizeof out->pool, st, 14);
  out->devices = sqlite3_column_int(st, 15);
  out->max_runtime_s = sqlite3_column_int(st, 16);
  out->restarts = sqlite3_column_int(st, 17);
  out->infra_restarts = sqlite3_column_int(st, 18);
  out->planned_memory_bytes = sqlite3_column_int64(st, 19);
  copy_column(out->experiment, sizeof out->experiment, st, 20);
  if (!out->spec_json || !out->message) {
    store_job_clear(out);
    set_error(s, "read job %s: out of memory", out->id);
    return STORE_ERROR;
  }
  return STORE_OK;
}

void store_job_clear(store_job *job) {
  if (!job) return;
  free(job->spec_json);
  free(job->message);
  job->spec_json = NULL;
  job->message = NULL;
}

void store_job_list_free(store_job *jobs, int n) {
  if (!jobs) return;
  for (int i = 0; i < n; i++) store_job_clear(&jobs[i]);
  free(jobs);
}

static int insert_event(store *s, const char *job_id, int64_t time_ms, const char *from,
                        const char *to, const char *reason, const char *message) {
  sqlite3_stmt *st = NULL;
  char what[96];
  snprintf(what, sizeof what, "record event of job %s", job_id);
  if (prepare(s, &st,
              "INSERT INTO job_events(job_id, time_ms, from_state, to_state, reason, message)"
              " VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
              what) != STORE_OK)
    return STORE_ERROR;
  bind_text(st, 1, job_id);
  sqlite3_bind_int64(st, 2, time_ms);
  bind_text(st, 3, from);
  bind_text(st, 4, to);
  bind_text(st, 5, reason);
  bind_text(st, 6, message);
  int rc = STORE_OK;
  if (sqlite3_step(st) != SQLITE_DONE) {
    db_error(s, "%s", what);
    rc = STORE_ERROR;
  }
  release(s, st);
  return rc;
}

/* Looks a job up by id inside the caller's transaction. */
static int select_job(store *s, const char *id, store_job *out, const char *what) {
  sqlite3_stmt *st = NULL;
  if (prepare(s, &st, "SELECT " JOB_COLUMNS " FROM jobs WHERE id = ?1", what) != STORE_OK)
    return STORE_ERROR;
  bind_text(st, 1, id);
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    rc = read_job(s, st, out);
  } else if (rc == SQLITE_DONE) {
    set_error(s, "%s: no such job", what);
    rc = STORE_NOT_FOUND;
  } else {
    db_error(s, "%s", what);
    rc = STORE_ERROR;
  }
  release(s, st);
  return rc;
}

static const char *job_tenant(const store_job *job) {
  return job->tenant[0] ? job->tenant : STORE_DEFAULT_TENANT;
}

/* Inserts job (QUEUED, CREATED) and its creation event inside the
 * caller's transaction. */
static int job_insert_in_tx(store *s, const store_job *job) {
  sqlite3_stmt *st = NULL;
  char what[96];
  int rc = STORE_ERROR;
  int64_t create_ms = job->create_ms ? job->create_ms : store_now_ms();
  const char *message = job->message ? job->message : "";
  snprintf(what, sizeof what, "insert job %s", job->id);
  if (prepare(s, &st,
              "INSERT INTO jobs(id, request_id, display_name, spec_json, state, reason, message,"
              " priority, attempt, create_ms, tenant, pool, devices, max_runtime_s,"
              " planned_memory_bytes, experiment_id)"
              " VALUES (?1, ?2, ?3, ?4, 'QUEUED', 'CREATED', ?5, ?6, 0, ?7, ?8, ?9, ?10, ?11, ?12,"
              " ?13)",
              what) != STORE_OK)
    goto done;
  bind_text(st, 1, job->id);
  if (job->request_id[0])
    bind_text(st, 2, job->request_id);
  else
    sqlite3_bind_null(st, 2); /* NULLs never collide in the UNIQUE index */
  bind_text(st, 3, job->display_name);
  bind_text(st, 4, job->spec_json ? job->spec_json : "{}");
  bind_text(st, 5, message);
  sqlite3_bind_int(st, 6, job->priority);
  sqlite3_bind_int64(st, 7, create_ms);
  bind_text(st, 8, job_tenant(job));
  bind_text(st, 9, job->pool[0] ? job->pool : STORE_DEFAULT_POOL);
  sqlite3_bind_int(st, 10, job->devices > 0 ? job->devices : 1);
  sqlite3_bind_int(st, 11, job->max_runtime_s > 0 ? job->max_runtime_s : 0);
  sqlite3_bind_int64(st, 12, job->planned_memory_bytes > 0 ? job->planned_memory_bytes : 0);
  if (job->experiment[0])
    bind_text(st, 13, job->experiment);
  else
    sqlite3_bind_null(st, 13);
  if (sqlite3_step(st) != SQLITE_DONE) {
    db_error(s, "%s", what);
    goto done;
  }
  if (insert_event(s, job->id, create_ms, "", "QUEUED", "CREATED", message) != STORE_OK) goto done;
  rc = STORE_OK;
done:
  release(s, st);
  return rc;
}

static int job_create_locked(store *s, const store_job *job, store_job *existing) {
  sqlite3_stmt *st = NULL;
  char what[96];
  int rc = STORE_ERROR;
  snprintf(what, sizeof what, "create job %s", job->id);
  if (tx_begin(s, what) != STORE_OK) goto done;
  if (job->request_id[0]) {
    if (prepare(s, &st, "SELECT " JOB_COLUMNS " FROM jobs WHERE tenant = ?2 AND request_id = ?1",
                what) != STORE_OK)
      goto done;
    bind_text(st, 1, job->request_id);
    bind_text(st, 2, job_tenant(job));
    int step = sqlite3_step(st);
    if (step == SQLITE_ROW) {
      const char *other = (const char *)sqlite3_column_text(st, 1);
      set_error(s, "%s: request_id %s was already used by job %s", what, job->request_id,
                other ? other : "");
      char sentence[STORE_ERRLEN];
      memcpy(sentence, s->errmsg, sizeof sentence);
      if (existing && read_job(s, st, existing) != STORE_OK) goto done;
      set_error(s, "%s", sentence);
      rc = STORE_EXISTS;
      goto done;
    }
    if (step != SQLITE_DONE) {
      db_error(s, "%s: look up request_id %s", what, job->request_id);
      goto done;
    }
    release(s, st);
    st = NULL;
  }
  if (job_insert_in_tx(s, job) != STORE_OK) goto done;
  if (tx_commit(s, what) != STORE_OK) goto done;
  rc = STORE_OK;
done:
  release(s, st);
  tx_end(s);
  return rc;
}

int store_job_create(store *s, const store_job *job, store_job *existing) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  int rc;
  if (!job || !job->id[0]) {
    set_error(s, "create job: the job id is empty");
    rc = STORE_ERROR;
  } else {
    rc = job_create_locked(s, job, existing);
  }
  unlock_db(s);
  return rc;
}

int store_job_get(store *s, const char *id, store_job *out) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  char what[96];
  int rc;
  snprintf(what, sizeof what, "get job %s", id ? id : "(null)");
  if (!id || !out) {
    set_error(s, "%s: id and out must not be NULL", what);
    rc = STORE_ERROR;
  } else {
    rc = select_job(s, id, out, what);
  }
  unlock_db(s);
  return rc;
}

static int job_list_locked(store *s, const char *state_filter, int64_t before_seq, int limit,
                           store_job **out, int *n) {
  const char *what = "list jobs";
  sqlite3_stmt *st = NULL;
  store_job *jobs = NULL;
  int used = 0, cap = 0, rc = STORE_ERROR;
  /* Two statements rather than "(?1 IS NULL OR state = ?1)", which would keep
   * the planner off the (state, seq) index. */
  const char *sql = state_filter ? "SELECT " JOB_COLUMNS " FROM jobs"
                                   " WHERE state = ?3 AND seq < ?1 ORDER BY seq DESC LIMIT ?2"
                                 : "SELECT " JOB_COLUMNS " FROM jobs"
                                   " WHERE seq < ?1 ORDER BY seq DESC LIMIT ?2";
  if (prepare(s, &st, sql, what) != STORE_OK) goto done;
  sqlite3_bind_int64(st, 1, before_seq > 0 ? before_seq : INT64_MAX);
  sqlite3_bind_int(st, 2, limit);
  if (state_filter) bind_text(st, 3, state_filter);
  int step;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (grow((void **)&jobs, &cap, used, sizeof *jobs) != STORE_OK) {
      set_error(s, "%s: out of memory", what);
      goto done;
    }
    if (read_job(s, st, &jobs[used]) != STORE_OK) goto done;
    used++;
  }
  if (step != SQLITE_DONE) {
    db_error(s, "%s", what);
    goto done;
  }
  *out = jobs;
  *n = used;
  jobs = NULL;
  rc = STORE_OK;
done:
  release(s, st);
  store_job_list_free(jobs, used);
  return rc;
}

int store_job_list(store *s, const char *state_filter, int64_t before_seq, int limit,
                   store_job **out, int *n) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  int rc;
  if (out) *out = NULL;
  if (n) *n = 0;
  if (!out || !n) {
    set_error(s, "list jobs: out and n must not be NULL");
    rc = STORE_ERROR;
  } else if (limit < 1) {
    set_error(s, "list jobs: limit must be >= 1, got %d", limit);
    rc = STORE_ERROR;
  } else {
    rc = job_list_locked(s, state_filter, before_seq, limit, out, n);
  }
  unlock_db(s);
  return rc;
}

/* Moves job id from `from` (NULL = any unfinished state) to `to` with an
 * event, inside the caller's transaction; STORE_CONFLICT when it is not in
 * `from`. */
static int job_move_in_tx(store *s, const char *id, const char *from, const char *to,
                          const char *reason, const char *message) {
  sqlite3_stmt *st = NULL;
  char what[96];
  char current[16];
  int rc = STORE_ERROR;
  snprintf(what, sizeof what, "move job %s to %s", id, to);
  if (prepare(s, &st, "SELECT state FROM jobs WHERE id = ?1", what) != STORE_OK) goto done;
  bind_text(st, 1, id);
  int step = sqlite3_step(st);
  if (step == SQLITE_DONE) {
    set_error(s, "%s: no such job", what);
    rc = STORE_NOT_FOUND;
    goto done;
  }
  if (step != SQLITE_ROW) {
    db_error(s, "%s", what);
    goto done;
  }
  copy_column(current, sizeof current, st, 0);
  release(s, st);
  st = NULL;
  if (from ? strcmp(current, from) != 0 : is_terminal_state(current)) {
    set_error(s, "%s: the job is %s, not %s", what, current, from ? from : "unfinished");
    rc = STORE_CONFLICT;
    goto done;
  }
  int64_t now = store_now_ms();
  int entering_terminal = is_terminal_state(to);
  /* start_ms marks the latest start; end_ms is cleared again when a finished
   * job is resumed, so it is set exactly while the job is terminal. */
  if (prepare(s, &st,
              "UPDATE jobs SET state = ?2, reason = ?3, message = ?4,"
              " start_ms = CASE WHEN ?5 THEN ?6 ELSE start_ms END,"
              " end_ms = CASE WHEN ?7 THEN ?6 ELSE NULL END"
              " WHERE id = ?1",
              what) != STORE_OK)
    goto done;
  bind_text(st, 1, id);
  bind_text(st, 2, to);
  bind_text(st, 3, reason);
  bind_text(st, 4, message);
  sqlite3_bind_int(st, 5, strcmp(to, "RUNNING") == 0);
  sqlite3_bind_int64(st, 6, now);
  sqlite3_bind_int(st, 7, entering_terminal);
  if (sqlite3_step(st) != SQLITE_DONE) {
    db_error(s, "%s", what);
    goto done;
  }
  if (insert_event(s, id, now, current, to, reason, message) != STORE_OK) goto done;
  rc = STORE_OK;
done:
  release(s, st);
  return rc;
}

static int job_transition_locked(store *s, const char *id, const char *from, const char *to,
                                 const char *reason, const char *message) {
  char what[96];
  snprintf(what, sizeof what, "move job %s to %s", id, to);
  int rc = tx_begin(s, what);
  if (rc == STORE_OK) rc = job_move_in_tx(s, id, from, to, reason, message);
  if (rc == STORE_OK) rc = tx_commit(s, what);
  tx_end(s);
  return rc;
}

int store_job_transition(store *s, const char *id, const char *from, const char *to,
                         const char *reason, const char *message) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  int rc;
  /* A misspelt state ("CANCELED") would never count as terminal: refuse it. */
  if (!id || !to) {
    set_error(s, "move job: id and to must not be NULL");
    rc = STORE_ERROR;
  } else if (!is_known_state(to)) {
    set_error(s, "move job %s: unknown state \"%s\"", id, to);
    rc = STORE_ERROR;
  } else if (from && !is_known_state(from)) {
    set_error(s, "move job %s: unknown state \"%s\"", id, from);
    rc = STORE_ERROR;
  } else {
    rc = job_transition_locked(s, id, from, to, reason ? reason : "", message ? message : "");
  }
  unlock_db(s);
  return rc;
}

/* Moves the QUEUED job id to STARTING, counting the attempt, inside the
 * caller's transaction; STORE_CONFLICT when it is not queued. */
static int claim_id_in_tx(store *s, const char *id, store_job *out, const char *what) {
  sqlite3_stmt *st = NULL;
  char message[64];
  int rc = STORE_ERROR;
  if (prepare(s, &st, "SELECT attempt FROM jobs WHERE id = ?1 AND state = 'QUEUED'", what) !=
      STORE_OK)
    return STORE_ERROR;
  bind_text(st, 1, id);
  int step = sqlite3_step(st);
  if (step == SQLITE_DONE) {
    set_error(s, "%s: job %s is not queued", what, id);
    rc = STORE_CONFLICT;
    goto done;
  }
  if (step != SQLITE_ROW) {
    db_error(s, "%s", what);
    goto done;
  }
  int attempt = sqlite3_column_int(st, 0) + 1;
  release(s, st);
  st = NULL;
  snprintf(message, sizeof message, "starting attempt %d", attempt);
  if (prepare(s, &st,
              "UPDATE jobs SET state = 'STARTING', reason = 'CLAIMED', message = ?2,"
              " attempt = ?3, end_ms = NULL WHERE id = ?1",
              what) != STORE_OK)
    goto done;
  bind_text(st, 1, id);
  bind_text(st, 2, message);
  sqlite3_bind_int(st, 3, attempt);
  if (sqlite3_step(st) != SQLITE_DONE) {
    db_error(s, "%s: update job %s", what, id);
    goto done;
  }
  if (insert_event(s, id, store_now_ms(), "QUEUED", "STARTING", "CLAIMED", message) != STORE_OK)
    goto done;
  rc = out ? select_job(s, id, out, what) : STORE_OK;
done:
  release(s, st);
  return rc;
}

static int job_claim_locked(store *s, const char *chosen, store_job *out) {
  const char *what = "claim next job";
  sqlite3_stmt *st = NULL;
  char id[sizeof((store_job *)0)->id];
  int rc = STORE_ERROR;
  if (tx_begin(s, what) != STORE_OK) goto done;
  if (chosen) {
    snprintf(id, sizeof id, "%s", chosen);
  } else {
    /* Highest priority first; within it, fair share: the tenant with the
     * fewest starts in the last STORE_FAIR_SHARE_WINDOW_MS goes first, so one
     * tenant's burst of jobs cannot hold back another's; then oldest first.
     * Each tenant's oldest ready job at the top priority comes from the
     * covering index jobs_claim_tenant alone; the recent starts are counted
     * once per tenant from jobs_tenant_start. */
    if (prepare(s, &st,
                "SELECT j.id, j.attempt FROM"
                " (SELECT tenant, min(seq) AS seq FROM jobs WHERE state = 'QUEUED'"
                "   AND (not_before_ms IS NULL OR not_before_ms <= ?1)"
                "   AND priority = (SELECT priority FROM jobs WHERE state = 'QUEUED'"
                "    AND (not_before_ms IS NULL OR not_before_ms <= ?1)"
                "    ORDER BY priority DESC LIMIT 1)"
                "  GROUP BY tenant) AS c JOIN jobs j ON j.seq = c.seq"
                " ORDER BY (SELECT count(*) FROM jobs r WHERE r.tenant = c.tenant"
                "  AND r.start_ms >= ?2), c.seq ASC LIMIT 1",
                what) != STORE_OK)
      goto done;
    int64_t claim_now = store_now_ms();
    sqlite3_bind_int64(st, 1, claim_now);
    sqlite3_bind_int64(st, 2, claim_now - STORE_FAIR_SHARE_WINDOW_MS);
    int step = sqlite3_step(st);
    if (step == SQLITE_DONE) {
      set_error(s, "%s: no job is queued", what);
      rc = STORE_EMPTY;
      goto done;
    }
    if (step != SQLITE_ROW) {
      db_error(s, "%s", what);
      goto done;
    }
    copy_column(id, sizeof id, st, 0);
    release(s, st);
    st = NULL;
  }
  rc = claim_id_in_tx(s, id, out, what);
  if (rc != STORE_OK) goto done;
  if (tx_commit(s, what) != STORE_OK) {
    if (out) store_job_clear(out);
    rc = STORE_ERROR;
    goto done;
  }
done:
  release(s, st);
  tx_end(s);
  return rc;
}

int store_job_claim_next(store *s, store_job *out) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  int rc = job_claim_locked(s, NULL, out);
  unlock_db(s);
  return rc;
}

int store_job_claim(store *s, const char *id, store_job *out) {
  if (!s || !id) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  int rc = job_claim_locked(s, id, out);
  unlock_db(s);
  return rc;
}

static int job_requeue_locked(store *s, int *n) {
  const char *what = "requeue unfinished jobs";
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  if (tx_begin(s, what) != STORE_OK) goto done;
  /* Events first: they read each job's state before the update changes it. */
  if (prepare(s, &st,
              "INSERT INTO job_events(job_id, time_ms, from_state, to_state, reason, message)"
              " SELECT id, ?1, state, 'QUEUED', 'SERVER_RESTARTED',"
              "  'the server restarted while the job was ' || state"
              " FROM jobs WHERE state IN ('STARTING', 'RUNNING', 'STOPPING') ORDER BY seq",
              what) != STORE_OK)
    goto done;
  sqlite3_bind_int64(st, 1, store_now_ms());
  if (sqlite3_step(st) != SQLITE_DONE) {
    db_error(s, "%s: record events", what);
    goto done;
  }
  release(s, st);
  st = NULL;
  /* The right-hand sides see the old row, so message names the old state. */
  if (prepare(s, &st,
              "UPDATE jobs SET state = 'QUEUED', reason = 'SERVER_RESTARTED',"
              " message = 'the server restarted while the job was ' || state, end_ms = NULL,"
              " infra_restarts = infra_restarts + 1"
              " WHERE state IN ('STARTING', 'RUNNING', 'STOPPING')",
              what) != STORE_OK)
    goto done;
  if (sqlite3_step(st) != SQLITE_DONE) {
    db_error(s, "%s", what);
    goto done;
  }
  int changed = sqlite3_changes(s->db);
  if (tx_commit(s, what) != STORE_OK) goto done;
  if (n) *n = changed;
  rc = STORE_OK;
done:
  release(s, st);
  tx_end(s);
  return rc;
}

int store_job_requeue_unfinished(store *s, int *n) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  if (n) *n = 0;
  int rc = job_requeue_locked(s, n);
  unlock_db(s);
  return rc;
}

/* ---- events ------------------------------------------------------------ */

void store_event_list_free(store_event *events, int n) {
  if (!events) return;
  for (int i = 0; i < n; i++) free(events[i].message);
  free(events);
}

static int event_list_locked(store *s, const char *job_id, store_event **out, int *n) {
  sqlite3_stmt *st = NULL;
  store_event *events = NULL;
  char what[96];
  int used = 0, cap = 0, rc = STORE_ERROR;
  snprintf(what, sizeof what, "list events of job %s", job_id);
  /* id is insertion order, which keeps events of the same millisecond in order. */
  if (prepare(s, &st,
              "SELECT time_ms, from_state, to_state, reason, message FROM job_events"
              " WHERE job_id = ?1 ORDER BY id",
              what) != STORE_OK)
    goto done;
  bind_text(st, 1, job_id);
  int step;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (grow((void **)&events, &cap, used, sizeof *events) != STORE_OK) {
      set_error(s, "%s: out of memory", what);
      goto done;
    }
    store_event *e = &events[used];
    memset(e, 0, sizeof *e);
    e->time_ms = sqlite3_column_int64(st, 0);
    copy_column(e->from_state, sizeof e->from_state, st, 1);
    copy_column(e->to_state, sizeof e->to_state, st, 2);
    copy_column(e->reason, sizeof e->reason, st, 3);
    e->message = dup_column(st, 4);
    if (!e->message) {
      set_error(s, "%s: out of memory", what);
      goto done;
    }
    used++;
  }
  if (step != SQLITE_DONE) {
    db_error(s, "%s", what);
    goto done;
  }
  *out = events;
  *n = used;
  events = NULL;
  rc = STORE_OK;
done:
  release(s, st);
  store_event_list_free(events, used);
  return rc;
}

int store_event_list(store *s, const char *job_id, store_event **out, int *n) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  int rc;
  if (out) *out = NULL;
  if (n) *n = 0;
  if (!job_id || !out || !n) {
    set_error(s, "list events: job_id, out and n must not be NULL");
    rc = STORE_ERROR;
  } else {
    rc = event_list_locked(s, job_id, out, n);
  }
  unlock_db(s);
  return rc;
}

/* ---- metrics ----------------------------------------------------------- */

static int metrics_append_locked(store *s, const char *job_id, const store_metric *points, int n) {
  sqlite3_stmt *st = NULL;
  char what[96];
  int rc = STORE_ERROR;
  snprintf(what, sizeof what, "append metrics of job %s", job_id);
  for (int i = 0; i < n; i++) {
    if (!points[i].name[0]) {
      set_error(s, "%s: point %d (step %lld) has an empty name", what, i,
                (long long)points[i].step);
      return STORE_ERROR;
    }
  }
  if (tx_begin(s, what) != STORE_OK) goto done;
  /* OR IGNORE does not cover foreign keys, so an unknown job would fail the
   * batch with a bare "FOREIGN KEY constraint failed"; say it plainly. */
  if (prepare(s, &st, "SELECT 1 FROM jobs WHERE id = ?1", what) != STORE_OK) goto done;
  bind_text(st, 1, job_id);
  int step = sqlite3_step(st);
  if (step == SQLITE_DONE) {
    set_error(s, "%s: no such job", what);
    rc = STORE_NOT_FOUND;
    goto done;
  }
  if (step != SQLITE_ROW) {
    db_error(s, "%s", what);
    goto done;
  }
  release(s, st);
  st = NULL;
  if (prepare(s, &st,
              "INSERT OR IGNORE INTO metrics(job_id, attempt, step, epoch, name, value, time_ms)"
              " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
              what) != STORE_OK)
    goto done;
  int64_t now = store_now_ms();
  bind_text(st, 1, job_id);
  for (int i = 0; i < n; i++) {
    const store_metric *p = &points[i];
    sqlite3_bind_int(st, 2, p->attempt);
    sqlite3_bind_int64(st, 3, p->step);
    sqlite3_bind_int(st, 4, p->epoch);
    bind_text(st, 5, p->name);
    /* SQLite turns a NaN into NULL anyway; say so on purpose. A diverged
     * loss is data worth keeping, not an error. */
    if (isnan(p->value))
      sqlite3_bind_null(st, 6);
    else
      sqlite3_bind_double(st, 6, p->value);
    sqlite3_bind_int64(st, 7, p->time_ms ? p->time_ms : now);
    if (sqlite3_step(st) != SQLITE_DONE) {
      db_error(s, "%s: step %lld %s", what, (long long)p->step, p->name);
      goto done;
    }
    sqlite3_reset(st);
  }
  if (tx_commit(s, what) != STORE_OK) goto done;
  rc = STORE_OK;
done:
  release(s, st);
  tx_end(s);
  return rc;
}

int store_metrics_append(store *s, const char *job_id, const store_metric *points, int n) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  int rc;
  if (!job_id || n < 0 || (n > 0 && !points)) {
    set_error(s, "append metrics: need a job id and n >= 0 points, got n=%d", n);
    rc = STORE_ERROR;
  } else if (n == 0) {
    rc = STORE_OK;
  } else {
    rc = metrics_append_locked(s, job_id, points, n);
  }
  unlock_db(s);
  return rc;
}

/* Reads every row of st, whose columns are seq, attempt, step, epoch, name,
 * value, time_ms, into a malloc'd array. */
static int read_metric_rows(store *s, sqlite3_stmt *st, const char *what, store_metric **out,
                            int *n) {
  store_metric *points = NULL;
  int used = 0, cap = 0, step;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (grow((void **)&points, &cap, used, sizeof *points) != STORE_OK) {
      set_error(s, "%s: out of memory", what);
      free(points);
      return STORE_ERROR;
    }
    store_metric *p = &points[used++];
    memset(p, 0, sizeof *p);
    p->seq = sqlite3_column_int64(st, 0);
    p->attempt = sqlite3_column_int(st, 1);
    p->step = sqlite3_column_int64(st, 2);
    p->epoch = sqlite3_column_int(st, 3);
    copy_column(p->name, sizeof p->name, st, 4);
    p->value = sqlite3_column_type(st, 5) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 5);
    p->time_ms = sqlite3_column_int64(st, 6);
  }
  if (step != SQLITE_DONE) {
    db_error(s, "%s", what);
    free(points);
    return STORE_ERROR;
  }
  *out = points;
  *n = used;
  return STORE_OK;
}

/* Runs one of the metric queries below on job_id (and text2, when not
 * NULL, as ?2) under the lock, into *out. */
static int query_metrics(store *s, const char *sql, const char *what_fmt, const char *job_id,
                         const char *text2, store_metric **out, int *n) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  int rc = STORE_ERROR;
  sqlite3_stmt *st = NULL;
  char what[96];
  if (out) *out = NULL;
  if (n) *n = 0;
  if (!job_id || !out || !n) {
    set_error(s, "metrics: job_id, out and n must not be NULL");
    goto done;
  }
  snprintf(what, sizeof what, what_fmt, job_id);
  if (prepare(s, &st, sql, what) != STORE_OK) goto done;
  bind_text(st, 1, job_id);
  if (text2) bind_text(st, 2, text2);
  rc = read_metric_rows(s, st, what, out, n);
done:
  release(s, st);
  unlock_db(s);
  return rc;
}

int store_metrics_list(store *s, const char *job_id, const char *name, store_metric **out, int *n) {
  /* Both are served by the UNIQUE(job_id, attempt, step, name) index. */
  const char *sql = name ? "SELECT seq, attempt, step, epoch, name, value, time_ms FROM metrics"
                           " WHERE job_id = ?1 AND name = ?2 ORDER BY attempt, step, name"
                         : "SELECT seq, attempt, step, epoch, name, value, time_ms FROM metrics"
                           " WHERE job_id = ?1 ORDER BY attempt, step, name";
  return query_metrics(s, sql, "list metrics of job %s", job_id, name, out, n);
}

/* 1 when the index-th of total points (0-based) is one of max_points kept
 * evenly from the first to the last: floor(j * (total-1) / (max_points-1))
 * for j = 0..max_points-1. */
static int thinned_keeps(int64_t index, int64_t total, int max_points) {
  if (total <= max_points) return 1;
  int64_t last = total - 1, m = max_points - 1;
  if (m == 0) return index == last;
  int64_t j = (index * m + last - 1) / last; /* the smallest j reaching index */
  return j <= m && j * last / m == index;
}

int store_metrics_thinned(store *s, const char *job_id, const char *name, int64_t start_step,
                          int64_t end_step, int max_points, store_metric **out, int *n) {
  if (!s) return STORE_ERROR;
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&s->db_lock);
  /* Pass 1 reads only the UNIQUE(job_id, attempt, step, name) index (seq is
   * the rowid it carries): which points there are, in order, per name.
   * Pass 2 reads the rows kept, by rowid. */
  sqlite3_stmt *scan = NULL, *row = NULL;
  struct point_ref {
    int64_t seq;
    int series;                         /* the point's name, as an index into names */
  } *refs = NULL;                       /* the range's points, in order */
  char(*names)[48] = NULL;              /* distinct names */
  int64_t *totals = NULL, *seen = NULL; /* per name */
  store_metric *points = NULL;
  int used = 0, cap = 0, n_names = 0, names_cap = 0, kept = 0, kept_cap = 0;
  int rc = STORE_ERROR, step;
  char what[96];
  snprintf(what, sizeof what, "list metrics of job %s", job_id);
  const char *sql = name ? "SELECT seq, name FROM metrics WHERE job_id = ?1 AND name = ?2"
                           " AND step BETWEEN ?3 AND ?4 ORDER BY attempt, step, name"
                         : "SELECT seq, name FROM metrics WHERE job_id = ?1"
                           " AND step BETWEEN ?3 AND ?4 ORDER BY attempt, step, name";
  if (max_points <= 0) /* every point: one pass over the rows */
    sql = name ? "SELECT seq, attempt, step, epoch, name, value, time_ms FROM metrics"
                 " WHERE job_id = ?1 AND name = ?2 AND step BETWEEN ?3 AND ?4"
                 " ORDER BY attempt, step, name"
               : "SELECT seq, attempt, step, epoch, name, value, time_ms FROM metrics"
                 " WHERE job_id = ?1 AND step BETWEEN ?3 AND ?4 ORDER BY attempt, step, name";
  if (prepare(s, &scan, sql, what) != STORE_OK) goto done;
  bind_text(scan, 1, job_id);
  if (name) bind_text(scan, 2, name);
  sqlite3_bind_int64(scan, 3, start_step);
  sqlite3_bind_int64(scan, 4, end_step);
  if (max_points <= 0) {
    rc = read_metric_rows(s, scan, what, out, n);
    goto done;
  }
  while ((step = sqlite3_step(scan)) == SQLITE_ROW) {
    const char *point_name = (const char *)sqlite3_column_text(scan, 1); /* NOT NULL */
    int k = 0;
    while (k < n_names && strcmp(names[k], point_name) != 0) k++;
    if (k == n_names) {
      if (grow((void **)&names, &names_cap, n_names, sizeof *names) != STORE_OK) goto oom;
      copy_column(names[n_names++], sizeof names[0], scan, 1);
    }
    if (grow((void **)&refs, &cap, used, sizeof *refs) != STORE_OK) goto oom;
    refs[used++] = (struct point_ref){sqlite3_column_int64(scan, 0), k};
  }
  if (step != SQLITE_DONE) {
    db_error(s, "%s", what);
    goto done;
  }
  totals = calloc((size_t)n_names + 1, sizeof *totals);
  seen = calloc((size_t)n_names + 1, sizeof *seen);
  if (!totals || !seen) goto oom;
  for (int i = 0; i < used; i++) totals[refs[i].series]++;
  if (prepare(s, &row,
              "SELECT seq, attempt, step, epoch, name, value, time_ms FROM metrics WHERE seq = ?1",
              what) != STORE_OK)
    goto done;
  for (int i = 0; i < used; i++) {
    int k = refs[i].series;
    if (!thinned_keeps(seen[k]++, totals[k], max_points)) continue;
    sqlite3_bind_int64(row, 1, refs[i].seq);
    store_metric *one = NULL;
    int got = 0;
    if (read_metric_rows(s, row, what, &one, &got) != STORE_OK) goto done;
    sqlite3_reset(row);
    if (got == 1) {
      if (grow((void **)&points, &kept_cap, kept, sizeof *points) != STORE_OK) {
        free(one);
        goto oom;
      }
      points[kept++] = one[0];
    }
    free(one);
  }
  *out = points;
  *n = kept;
  points = NULL;
  rc = STORE_OK;
  goto done;
oom:
  set_error(s, "%s: out of memory", what);
done:
  release(s, row);
  release(s, scan);
  free(refs);
  free(names);
  free(totals);
  free(seen);
  free(points);
  unlock_db(s);
  return rc;
}

int store_metrics_latest(store *s, const char *job_id, store_metric **out, int *n) {
  if (!s) return STORE_ERROR;
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&s->db_lock);
  /* Both queries read only the UNIQUE(job_id, attempt, step, name) index
   * (the second walks it backwards and stops at the first match) and so
   * never touch the job's every row, which a GROUP BY over value would. */
  sqlite3_stmt *names = NULL, *last = NULL;
  store_metric *points = NULL;
  int used = 0, cap = 0, rc = STORE_ERROR, step;
  char what[96];
  snprintf(what, sizeof what, "latest metrics of job %s", job_id);
  if (prepare(s, &names, "SELECT DISTINCT name FROM metrics WHERE job_id = ?1 ORDER BY name",
              what) != STORE_OK)
    goto done;
  bind_text(names, 1, job_id);
  while ((step = sqlite3_step(names)) == SQLITE_ROW) {
    if (prepare(s, &last,
                "SELECT seq, attempt, step, epoch, name, value, time_ms FROM metrics"
                " WHERE job_id = ?1 AND name = ?2 ORDER BY attempt DESC, step DESC LIMIT 1",
                what) != STORE_OK)
      goto done;
    bind_text(last, 1, job_id);
    sqlite3_bind_value(last, 2, sqlite3_column_value(names, 0));
    store_metric *one = NULL;
    int got = 0;
    int one_rc = read_metric_rows(s, last, what, &one, &got);
    release(s, last);
    last = NULL;
    if (one_rc != STORE_OK) goto done;
    if (got == 1) {
      if (grow((void **)&points, &cap, used, sizeof *points) != STORE_OK) {
        set_error(s, "%s: out of memory", what);
        free(one);
        goto done;
      }
      points[used++] = one[0];
    }
    free(one);
  }
  if (step != SQLITE_DONE) {
    db_error(s, "%s", what);
    goto done;
  }
  *out = points;
  *n = used;
  points = NULL;
  rc = STORE_OK;
done:
  release(s, last);
  release(s, names);
  free(points);
  unlock_db(s);
  return rc;
}

int store_metrics_newest(store *s, const char *job_id, store_metric *out, int *n) {
  store_metric *points = NULL;
  /* One step down the UNIQUE(job_id, attempt, step, name) index from its end. */
  int rc = query_metrics(s,
                         "SELECT seq, attempt, step, epoch, name, value, time_ms FROM metrics"
                         " WHERE job_id = ?1 ORDER BY attempt DESC, step DESC LIMIT 1",
                         "newest metric of job %s", job_id, NULL, &points, n);
  if (rc == STORE_OK && *n == 1) *out = points[0];
  free(points);
  return rc;
}

int store_metrics_count(store *s, const char *job_id, int64_t *count) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  *count = 0;
  if (prepare(s, &st, "SELECT count(*) FROM metrics WHERE job_id = ?1", "count metrics") !=
      STORE_OK)
    goto done;
  bind_text(st, 1, job_id);
  if (sqlite3_step(st) != SQLITE_ROW) {
    db_error(s, "count metrics of job %s", job_id);
    goto done;
  }
  *count = sqlite3_column_int64(st, 0);
  rc = STORE_OK;
done:
  release(s, st);
  unlock_db(s);
  return rc;
}

/* ---- checkpoints ------------------------------------------------------- */

static int checkpoint_add_locked(store *s, const store_checkpoint *c) {
  sqlite3_stmt *st = NULL;
  char what[96];
  int rc = STORE_ERROR;
  snprintf(what, sizeof what, "add checkpoint of job %s at step %lld", c->job_id,
           (long long)c->step);
  if (!c->path[0]) {
    set_error(s, "%s: path is empty", what);
    return STORE_ERROR;
  }
  if (prepare(s, &st,
              "INSERT INTO checkpoints(job_id, attempt, step, path, bytes, sha256, metrics_json,"
              " create_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
              what) != STORE_OK)
    return STORE_ERROR;
  bind_text(st, 1, c->job_id);
  sqlite3_bind_int(st, 2, c->attempt);
  sqlite3_bind_int64(st, 3, c->step);
  bind_text(st, 4, c->path);
  sqlite3_bind_int64(st, 5, c->bytes);
  bind_text(st, 6, c->sha256);
  bind_text(st, 7, c->metrics_json ? c->metrics_json : "{}");
  sqlite3_bind_int64(st, 8, c->create_ms ? c->create_ms : store_now_ms());
  /* One row, so no transaction: the foreign key decides atomically whether
   * the job exists. */
  if (sqlite3_step(st) == SQLITE_DONE) {
    rc = STORE_OK;
  } else if (sqlite3_extended_errcode(s->db) == SQLITE_CONSTRAINT_FOREIGNKEY) {
    set_error(s, "%s: no such job", what);
    rc = STORE_NOT_FOUND;
  } else {
    db_error(s, "%s", what);
  }
  release(s, st);
  return rc;
}

int store_checkpoint_add(store *s, const store_checkpoint *c) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  int rc;
  if (!c || !c->job_id[0]) {
    set_error(s, "add checkpoint: the job id is empty");
    rc = STORE_ERROR;
  } else {
    rc = checkpoint_add_locked(s, c);
  }
  unlock_db(s);
  return rc;
}

void store_checkpoint_list_free(store_checkpoint *list, int n) {
  if (!list) return;
  for (int i = 0; i < n; i++) free(list[i].metrics_json);
  free(list);
}

static int checkpoint_list_locked(store *s, const char *job_id, store_checkpoint **out, int *n) {
  sqlite3_stmt *st = NULL;
  store_checkpoint *list = NULL;
  char what[96];
  int used = 0, cap = 0, rc = STORE_ERROR;
  snprintf(what, sizeof what, "list checkpoints of job %s", job_id);
  if (prepare(s, &st,
              "SELECT id, job_id, attempt, step, path, bytes, sha256, metrics_json, create_ms,"
              " pinned FROM checkpoints WHERE job_id = ?1 ORDER BY attempt, step, id",
              what) != STORE_OK)
    goto done;
  bind_text(st, 1, job_id);
  int step;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (grow((void **)&list, &cap, used, sizeof *list) != STORE_OK) {
      set_error(s, "%s: out of memory", what);
      goto done;
    }
    store_checkpoint *c = &list[used];
    memset(c, 0, sizeof *c);
    c->id = sqlite3_column_int64(st, 0);
    copy_column(c->job_id, sizeof c->job_id, st, 1);
    c->attempt = sqlite3_column_int(st, 2);
    c->step = sqlite3_column_int64(st, 3);
    copy_column(c->path, sizeof c->path, st, 4);
    c->bytes = sqlite3_column_int64(st, 5);
    copy_column(c->sha256, sizeof c->sha256, st, 6);
    c->metrics_json = dup_column(st, 7);
    c->create_ms = sqlite3_column_int64(st, 8);
    c->pinned = sqlite3_column_int(st, 9) != 0;
    if (!c->metrics_json) {
      set_error(s, "%s: out of memory", what);
      goto done;
    }
    used++;
  }
  if (step != SQLITE_DONE) {
    db_error(s, "%s", what);
    goto done;
  }
  *out = list;
  *n = used;
  list = NULL;
  rc = STORE_OK;
done:
  release(s, st);
  store_checkpoint_list_free(list, used);
  return rc;
}

int store_checkpoint_list(store *s, const char *job_id, store_checkpoint **out, int *n) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  int rc;
  if (out) *out = NULL;
  if (n) *n = 0;
  if (!job_id || !out || !n) {
    set_error(s, "list checkpoints: job_id, out and n must not be NULL");
    rc = STORE_ERROR;
  } else {
    rc = checkpoint_list_locked(s, job_id, out, n);
  }
  unlock_db(s);
  return rc;
}

/* ---- job queries, deletion, counts ------------------------------------- */

static int job_query_locked(store *s, const store_job_query *q, store_job **out, int *n) {
  const char *what = "list jobs";
  sqlite3_stmt *st = NULL;
  store_job *jobs = NULL;
  int used = 0, cap = 0, rc = STORE_ERROR;
  /* One statement per shape, so each is served by its (tenant, state, seq) index. */
  char sql[512];
  snprintf(sql, sizeof sql,
           "SELECT " JOB_COLUMNS " FROM jobs WHERE seq %s ?1%s%s ORDER BY seq %s"
           " LIMIT ?2",
           q->ascending ? ">" : "<", q->tenant ? " AND tenant = ?3" : "",
           q->state ? " AND state = ?4" : "", q->ascending ? "ASC" : "DESC");
  if (prepare(s, &st, sql, what) != STORE_OK) goto done;
  int64_t bound = q->after_seq > 0 ? q->after_seq : (q->ascending ? 0 : INT64_MAX);
  sqlite3_bind_int64(st, 1, bound);
  sqlite3_bind_int(st, 2, q->limit);
  if (q->tenant) bind_text(st, 3, q->tenant);
  if (q->state) bind_text(st, 4, q->state);
  int step;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (grow((void **)&jobs, &cap, used, sizeof *jobs) != STORE_OK) {
      set_error(s, "%s: out of memory", what);
      goto done;
    }
    if (read_job(s, st, &jobs[used]) != STORE_OK) goto done;
    used++;
  }
  if (step != SQLITE_DONE) {
    db_error(s, "%s", what);
    goto done;
  }
  *out = jobs;
  *n = used;
  jobs = NULL;
  rc = STORE_OK;
done:
  release(s, st);
  store_job_list_free(jobs, used);
  return rc;
}

int store_job_query_list(store *s, const store_job_query *q, store_job **out, int *n) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  int rc;
  if (out) *out = NULL;
  if (n) *n = 0;
  if (!q || !out || !n) {
    set_error(s, "list jobs: q, out and n must not be NULL");
    rc = STORE_ERROR;
  } else if (q->limit < 1) {
    set_error(s, "list jobs: limit must be >= 1, got %d", q->limit);
    rc = STORE_ERROR;
  } else {
    rc = job_query_locked(s, q, out, n);
  }
  unlock_db(s);
  return rc;
}

static int job_delete_locked(store *s, const char *id) {
  sqlite3_stmt *st = NULL;
  char what[96], state[16];
  int rc = STORE_ERROR;
  snprintf(what, sizeof what, "delete job %s", id);
  if (tx_begin(s, what) != STORE_OK) goto done;
  if (prepare(s, &st, "SELECT state FROM jobs WHERE id = ?1", what) != STORE_OK) goto done;
  bind_text(st, 1, id);
  int step = sqlite3_step(st);
  if (step == SQLITE_DONE) {
    set_error(s, "%s: no such job", what);
    rc = STORE_NOT_FOUND;
    goto done;
  }
  if (step != SQLITE_ROW) {
    db_error(s, "%s", what);
    goto done;
  }
  copy_column(state, sizeof state, st, 0);
  release(s, st);
  st = NULL;
  if (!is_terminal_state(state)) {
    set_error(s, "%s: the job is %s; only a SUCCEEDED, FAILED or CANCELLED job can be deleted",
              what, state);
    rc = STORE_CONFLICT;
    goto done;
  }
  /* Events, metrics and checkpoints go with it (ON DELETE CASCADE). */
  if (prepare(s, &st, "DELETE FROM jobs WHERE id = ?1", what) != STORE_OK) goto done;
  bind_text(st, 1, id);
  if (sqlite3_step(st) != SQLITE_DONE) {
    db_error(s, "%s", what);
    goto done;
  }
  if (tx_commit(s, what) != STORE_OK) goto done;
  rc = STORE_OK;
done:
  release(s, st);
  tx_end(s);
  return rc;
}

int store_job_delete(store *s, const char *id) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  int rc;
  if (!id) {
    set_error(s, "delete job: id must not be NULL");
    rc = STORE_ERROR;
  } else {
    rc = job_delete_locked(s, id);
  }
  unlock_db(s);
  return rc;
}

int store_job_count_by_state(store *s, int64_t counts[8]) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  for (int i = 0; i < 8; i++) counts[i] = 0;
  if (prepare(s, &st, "SELECT state, count(*) FROM jobs GROUP BY state", "count jobs") != STORE_OK)
    goto done;
  int step;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    const char *state = (const char *)sqlite3_column_text(st, 0);
    for (int i = 0; i < 8; i++) {
      if (state && strcmp(state, job_states[i]) == 0) counts[i] = sqlite3_column_int64(st, 1);
    }
  }
  if (step != SQLITE_DONE) {
    db_error(s, "count jobs");
    goto done;
  }
  rc = STORE_OK;
done:
  release(s, st);
  unlock_db(s);
  return rc;
}

int store_job_queue_ahead(store *s, const char *id, int64_t *ahead) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  *ahead = 0;
  /* The claim order (priority DESC, seq ASC), counted up to this job. */
  if (prepare(s, &st,
              "SELECT count(*) FROM jobs q, jobs me WHERE me.id = ?1 AND q.state = 'QUEUED'"
              " AND (q.priority > me.priority OR (q.priority = me.priority AND q.seq < me.seq))",
              "count jobs ahead") != STORE_OK)
    goto done;
  bind_text(st, 1, id);
  if (sqlite3_step(st) != SQLITE_ROW) {
    db_error(s, "count jobs ahead of %s", id);
    goto done;
  }
  *ahead = sqlite3_column_int64(st, 0);
  rc = STORE_OK;
done:
  release(s, st);
  unlock_db(s);
  return rc;
}

/* ---- tokens ------------------------------------------------------------ */

int store_token_add(store *s, const store_token *t, const char *sha256_hex) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  char what[96];
  snprintf(what, sizeof what, "add token %s", t->id);
  if (strcmp(t->role, "admin") != 0 && strcmp(t->role, "user") != 0 &&
      strcmp(t->role, "agent") != 0) {
    set_error(s, "%s: role must be admin, user or agent, got '%s'", what, t->role);
    goto done;
  }
  if (!t->tenant[0] || !t->id[0] || strlen(sha256_hex) != 64) {
    set_error(s, "%s: id, tenant and a 64-digit sha256 are required", what);
    goto done;
  }
  if (prepare(s, &st,
              "INSERT INTO tokens(id, tenant, role, sha256, create_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
              what) != STORE_OK)
    goto done;
  bind_text(st, 1, t->id);
  bind_text(st, 2, t->tenant);
  bind_text(st, 3, t->role);
  bind_text(st, 4, sha256_hex);
  sqlite3_bind_int64(st, 5, t->create_ms ? t->create_ms : store_now_ms());
  int step = sqlite3_step(st);
  if (step == SQLITE_CONSTRAINT) {
    db_error(s, "%s", what);
    rc = STORE_EXISTS;
  } else if (step != SQLITE_DONE) {
    db_error(s, "%s", what);
  } else {
    rc = STORE_OK;
  }
done:
  release(s, st);
  unlock_db(s);
  return rc;
}

int store_token_find(store *s, const char *sha256_hex, store_token *out) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  memset(out, 0, sizeof *out);
  if (prepare(s, &st,
              "SELECT id, tenant, role, create_ms FROM tokens WHERE sha256 = ?1 AND revoked = 0",
              "find token") != STORE_OK)
    goto done;
  bind_text(st, 1, sha256_hex);
  int step = sqlite3_step(st);
  if (step == SQLITE_ROW) {
    copy_column(out->id, sizeof out->id, st, 0);
    copy_column(out->tenant, sizeof out->tenant, st, 1);
    copy_column(out->role, sizeof out->role, st, 2);
    out->create_ms = sqlite3_column_int64(st, 3);
    rc = STORE_OK;
  } else if (step == SQLITE_DONE) {
    set_error(s, "find token: no such token");
    rc = STORE_NOT_FOUND;
  } else {
    db_error(s, "find token");
  }
done:
  release(s, st);
  unlock_db(s);
  return rc;
}

int store_token_count(store *s, int64_t *n) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  *n = 0;
  if (prepare(s, &st, "SELECT count(*) FROM tokens WHERE revoked = 0", "count tokens") != STORE_OK)
    goto done;
  if (sqlite3_step(st) != SQLITE_ROW) {
    db_error(s, "count tokens");
    goto done;
  }
  *n = sqlite3_column_int64(st, 0);
  rc = STORE_OK;
done:
  release(s, st);
  unlock_db(s);
  return rc;
}

/* ---- metric streams ---------------------------------------------------- */

int store_metrics_since(store *s, const char *job_id, int64_t after_seq, int limit,
                        store_metric **out, int *n) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  *out = NULL;
  *n = 0;
  if (prepare(s, &st,
              "SELECT seq, attempt, step, epoch, name, value, time_ms FROM metrics"
              " WHERE job_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
              "stream metrics") != STORE_OK)
    goto done;
  bind_text(st, 1, job_id);
  sqlite3_bind_int64(st, 2, after_seq);
  sqlite3_bind_int(st, 3, limit > 0 ? limit : 1);
  char what[96];
  snprintf(what, sizeof what, "stream metrics of job %s", job_id);
  rc = read_metric_rows(s, st, what, out, n);
done:
  release(s, st);
  unlock_db(s);
  return rc;
}

/* ---- retries ----------------------------------------------------------- */

int store_job_retry(store *s, const char *id, int64_t not_before_ms, const char *reason,
                    const char *message) {
  if (!s) return STORE_ERROR;
  pthread_mutex_lock(&s->db_lock);
  sqlite3_stmt *st = NULL;
  char what[96], state[16];
  int rc = STORE_ERROR;
  snprintf(what, sizeof what, "retry job %s", id);
  if (tx_begin(s, what) != STORE_OK) goto done;
  if (prepare(s, &st, "SELECT state FROM jobs WHERE id = ?1", what) != STORE_OK) goto done;
  bind_text(st, 1, id);
  int step = sqlite3_step(st);
  if (step == SQLITE_DONE) {
    set_error(s, "%s: no such job", what);
    rc = STORE_NOT_FOUND;
    goto done;
  }
  if (step != SQLITE_ROW) {
    db_error(s, "%s", what);
    goto done;
  }
  copy_column(state, sizeof state, st, 0);
  release(s, st);
  st = NULL;
  if (is_terminal_state(state)) {
    set_error(s, "%s: the job already ended %s", what, state);
    rc = STORE_CONFLICT;
    goto done;
  }
  if (prepare(s, &st,
              "UPDATE jobs SET state = 'QUEUED', reason = ?2, message = ?3, not_before_ms = ?4,"
              " end_ms = NULL, restarts = restarts + 1 WHERE id = ?1",
              what) != STORE_OK)
    goto done;
  bind_text(st, 1, id);
  bind_text(st, 2, reason);
  bind_text(st, 3, message);
  sqlite3_bind_int64(st, 4, not_before_ms);
  if (sqlite3_step(st) != SQLITE_DONE) {
    db_error(s, "%s", what);
    goto done;
  }
  if (insert_event(s, id, store_now_ms(), state, "QUEUED", reason, message) != STORE_OK) goto done;
  if (tx_commit(s, what) != STORE_OK) goto done;
  rc = STORE_OK;
done:
  release(s, st);
  tx_end(s);
  unlock_db(s);
  return rc;
}

/* ---- for the other files of this module (store_internal.h) ------------- */

sqlite3 *store_internal_lock(store *s) {
  pthread_mutex_lock(&s->db_lock);
  return s->db;
}

void store_internal_set_wal_worker(store *s, store_wal_worker *w) {
  s->wal_worker = w;
}

void store_internal_unlock(store *s) {
  unlock_db(s);
}

int store_internal_job_insert(store *s, const store_job *job) {
  return job_insert_in_tx(s, job);
}

int store_internal_job_move(store *s, const char *id, const char *from, const char *to,
                            const char *reason, const char *message) {
  if (!is_known_state(to) || (from && !is_known_state(from))) {
    set_error(s, "move job %s: unknown state", id);
    return STORE_ERROR;
  }
  return job_move_in_tx(s, id, from, to, reason, message);
}

void store_internal_error(store *s, int with_sqlite, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_verror(s, with_sqlite ? sqlite3_errmsg(s->db) : NULL, fmt, ap);
  va_end(ap);
}
