/* backup.c — a consistent copy of a database another process is writing
 * (SQLite's online backup API, in small steps, inside one read
 * transaction that pins a WAL snapshot), the files that snapshot
 * references handed to the caller while writers wait a moment, and the
 * rewrite of those paths in a restored copy. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "store_internal.h"

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* Long enough to outwait a writer's transaction; writers wait as long for us. */
#define BACKUP_BUSY_TIMEOUT_MS 10000

static int table_exists(sqlite3 *db, const char *name) {
  sqlite3_stmt *st = NULL;
  int found = 0;
  if (sqlite3_prepare_v2(db, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1", -1,
                         &st, NULL) == SQLITE_OK) {
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    found = sqlite3_step(st) == SQLITE_ROW;
  }
  sqlite3_finalize(st);
  return found;
}

/* Calls on_file for each checkpoint file and data set folder the
 * connection's snapshot references. */
static int list_files(sqlite3 *db, store_backup_file_fn on_file, void *user, char *err,
                      size_t errlen) {
  static const struct {
    const char *table, *kind, *sql;
  } sources[] = {
      {"checkpoints", "checkpoint", "SELECT DISTINCT path FROM checkpoints ORDER BY path"},
      {"datasets", "dataset", "SELECT DISTINCT path FROM datasets ORDER BY path"},
  };
  for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
    if (!table_exists(db, sources[i].table)) continue;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, sources[i].sql, -1, &st, NULL) != SQLITE_OK) {
      set_err(err, errlen, "backup: list the %s files: %s", sources[i].kind, sqlite3_errmsg(db));
      return STORE_ERROR;
    }
    int step;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
      const char *path = (const char *)sqlite3_column_text(st, 0);
      if (path && path[0] && on_file(sources[i].kind, path, user) != 0) {
        sqlite3_finalize(st);
        set_err(err, errlen, "backup: stopped at %s %s", sources[i].kind, path);
        return STORE_ERROR;
      }
    }
    sqlite3_finalize(st);
    if (step != SQLITE_DONE) {
      set_err(err, errlen, "backup: list the %s files: %s", sources[i].kind, sqlite3_errmsg(db));
      return STORE_ERROR;
    }
  }
  return STORE_OK;
}

int store_backup(const char *db_path, const char *out_path, int pages_per_step,
                 store_backup_file_fn on_file, void *user, store_backup_stats *stats, char *err,
                 size_t errlen) {
  sqlite3 *src = NULL, *lock = NULL, *dst = NULL;
  sqlite3_backup *b = NULL;
  int rc = STORE_ERROR, locked = 0, reading = 0;
  if (stats) memset(stats, 0, sizeof *stats);
  if (pages_per_step < 1) pages_per_step = 1;
  if (access(out_path, F_OK) == 0) {
    set_err(err, errlen, "backup: %s already exists; a backup goes to a new file", out_path);
    return STORE_ERROR;
  }
  const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX;
  if (sqlite3_open_v2(db_path, &src, flags, NULL) != SQLITE_OK ||
      sqlite3_open_v2(db_path, &lock, flags, NULL) != SQLITE_OK) {
    set_err(err, errlen, "backup: cannot open %s: %s", db_path, sqlite3_errmsg(lock ? lock : src));
    goto done;
  }
  sqlite3_busy_timeout(src, BACKUP_BUSY_TIMEOUT_MS);
  sqlite3_busy_timeout(lock, BACKUP_BUSY_TIMEOUT_MS);
  /* The write lock first: a retention pass that is removing files commits
   * before the snapshot is taken, and none starts until the snapshot's
   * files are in the caller's hands. */
  if (sqlite3_exec(lock, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
    set_err(err, errlen, "backup: cannot lock %s for a moment: %s", db_path, sqlite3_errmsg(lock));
    goto done;
  }
  locked = 1;
  /* A read transaction pins the snapshot every backup step reads: in WAL
   * mode writers go on meanwhile, and the backup never restarts. */
  if (sqlite3_exec(src, "BEGIN; SELECT count(*) FROM sqlite_master", NULL, NULL, NULL) !=
      SQLITE_OK) {
    set_err(err, errlen, "backup: cannot read %s: %s", db_path, sqlite3_errmsg(src));
    goto done;
  }
  reading = 1;
  if (on_file && list_files(src, on_file, user, err, errlen) != STORE_OK) goto done;
  sqlite3_exec(lock, "ROLLBACK", NULL, NULL, NULL);
  locked = 0;

  if (sqlite3_open_v2(out_path, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
      SQLITE_OK) {
    set_err(err, errlen, "backup: cannot create %s: %s", out_path, sqlite3_errmsg(dst));
    goto done;
  }
  b = sqlite3_backup_init(dst, "main", src, "main");
  if (!b) {
    set_err(err, errlen, "backup: %s", sqlite3_errmsg(dst));
    goto done;
  }
  int step;
  for (;;) {
    step = sqlite3_backup_step(b, pages_per_step);
    if (stats) stats->steps++;
    if (step == SQLITE_DONE) break;
    if (step == SQLITE_BUSY || step == SQLITE_LOCKED) {
      sqlite3_sleep(5);
    } else if (step != SQLITE_OK) {
      break;
    }
  }
  if (stats) stats->pages = sqlite3_backup_pagecount(b);
  if (sqlite3_backup_finish(b) != SQLITE_OK || step != SQLITE_DONE) {
    b = NULL;
    set_err(err, errlen, "backup: copying %s to %s: %s", db_path, out_path, sqlite3_errmsg(dst));
    goto done;
  }
  b = NULL;
  /* One self-contained file: no WAL beside it. */
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(dst, "PRAGMA journal_mode = DELETE", -1, &st, NULL) != SQLITE_OK ||
      sqlite3_step(st) != SQLITE_ROW) {
    sqlite3_finalize(st);
    set_err(err, errlen, "backup: %s: %s", out_path, sqlite3_errmsg(dst));
    goto done;
  }
  sqlite3_finalize(st);
  if (sqlite3_prepare_v2(dst, "PRAGMA quick_check", -1, &st, NULL) != SQLITE_OK ||
      sqlite3_step(st) != SQLITE_ROW ||
      strcmp((const char *)sqlite3_column_text(st, 0), "ok") != 0) {
    set_err(err, errlen, "backup: the copy %s fails SQLite's quick_check: %s", out_path,
            st && sqlite3_column_text(st, 0) ? (const char *)sqlite3_column_text(st, 0)
                                             : sqlite3_errmsg(dst));
    sqlite3_finalize(st);
    goto done;
  }
  sqlite3_finalize(st);
  rc = STORE_OK;
done:
  if (b) sqlite3_backup_finish(b);
  if (locked) sqlite3_exec(lock, "ROLLBACK", NULL, NULL, NULL);
  if (reading) sqlite3_exec(src, "COMMIT", NULL, NULL, NULL);
  sqlite3_close(dst);
  sqlite3_close(lock);
  sqlite3_close(src);
  return rc;
}
