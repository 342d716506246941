/* wal.c — moving WAL checkpoints off the request path: after a commit has
 * grown the log past WAL_CHECKPOINT_PAGES, a worker thread with its own
 * connection copies it back into the database (PASSIVE, so it never waits
 * for or blocks a writer) instead of the committing caller doing it inline.
 *
 * Threads: the worker owns its connection; `pending` and `stopping` are
 * guarded by `lock`. The hook runs on whatever thread committed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "store_internal.h"

#define WAL_CHECKPOINT_PAGES 1000 /* SQLite's own default for autocheckpoint */

struct store_wal_worker {
  pthread_t thread;
  pthread_mutex_t lock; /* guards pending, stopping */
  pthread_cond_t wake;
  int pending, stopping;
  sqlite3 *db; /* the worker's own connection */
};

static int on_commit(void *user, sqlite3 *db, const char *name, int pages) {
  (void)db;
  (void)name;
  store_wal_worker *w = user;
  if (pages < WAL_CHECKPOINT_PAGES) return SQLITE_OK;
  pthread_mutex_lock(&w->lock);
  w->pending = 1;
  pthread_cond_signal(&w->wake);
  pthread_mutex_unlock(&w->lock);
  return SQLITE_OK;
}

static void *worker_main(void *arg) {
  store_wal_worker *w = arg;
  pthread_mutex_lock(&w->lock);
  while (!w->stopping) {
    if (!w->pending) {
      pthread_cond_wait(&w->wake, &w->lock);
      continue;
    }
    w->pending = 0;
    pthread_mutex_unlock(&w->lock);
    /* PASSIVE: copies what no reader still needs; the next signal finishes. */
    sqlite3_wal_checkpoint_v2(w->db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
    pthread_mutex_lock(&w->lock);
  }
  pthread_mutex_unlock(&w->lock);
  return NULL;
}

void store_internal_wal_stop(store_wal_worker *w) {
  if (!w) return;
  pthread_mutex_lock(&w->lock);
  w->stopping = 1;
  pthread_cond_signal(&w->wake);
  pthread_mutex_unlock(&w->lock);
  pthread_join(w->thread, NULL);
  sqlite3_close(w->db);
  pthread_cond_destroy(&w->wake);
  pthread_mutex_destroy(&w->lock);
  free(w);
}

int store_checkpoint_in_background(store *s) {
  if (!s) return STORE_ERROR;
  sqlite3 *db = store_internal_lock(s);
  int rc = STORE_ERROR;
  const char *path = sqlite3_db_filename(db, "main");
  store_wal_worker *w = calloc(1, sizeof *w);
  if (!w || !path || !path[0]) {
    store_internal_error(s, 0, "background checkpoints: %s",
                         w ? "the database has no file" : "out of memory");
    free(w);
    goto done;
  }
  if (sqlite3_open_v2(path, &w->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
      SQLITE_OK) {
    store_internal_error(s, 0, "background checkpoints: open %s: %s", path,
                         w->db ? sqlite3_errmsg(w->db) : "out of memory");
    sqlite3_close(w->db);
    free(w);
    goto done;
  }
  sqlite3_busy_timeout(w->db, 5000);
  /* A connection learns the file is in WAL mode when it first reads it;
   * until then a checkpoint does nothing. */
  if (sqlite3_exec(w->db, "PRAGMA journal_mode = WAL", NULL, NULL, NULL) != SQLITE_OK) {
    store_internal_error(s, 0, "background checkpoints: %s", sqlite3_errmsg(w->db));
    sqlite3_close(w->db);
    free(w);
    goto done;
  }
  pthread_mutex_init(&w->lock, NULL);
  pthread_cond_init(&w->wake, NULL);
  if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
    store_internal_error(s, 0, "background checkpoints: cannot start the thread");
    sqlite3_close(w->db);
    pthread_cond_destroy(&w->wake);
    pthread_mutex_destroy(&w->lock);
    free(w);
    goto done;
  }
  /* Replaces this connection's autocheckpoint (also a WAL hook). */
  sqlite3_wal_hook(db, on_commit, w);
  store_internal_set_wal_worker(s, w);
  rc = STORE_OK;
done:
  store_internal_unlock(s);
  return rc;
}
