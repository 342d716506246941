/* store_internal.h — private to storage/: what the module's other files
 * (datasets.c) need of a store handle. */
#ifndef KILN_STORAGE_INTERNAL_H
#define KILN_STORAGE_INTERNAL_H

#include <sqlite3.h>

#include "storage.h"

/* Takes the handle's db_lock and returns its connection. */
sqlite3 *store_internal_lock(store *s);
void store_internal_unlock(store *s);
/* Records the handle's error sentence (and SQLite's reason when asked);
 * call with the lock held. */
void store_internal_error(store *s, int with_sqlite, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The background checkpointer of a handle (wal.c), stopped by store_close. */
typedef struct store_wal_worker store_wal_worker;
void store_internal_set_wal_worker(store *s, store_wal_worker *w); /* lock held */
void store_internal_wal_stop(store_wal_worker *w);                 /* NULL is a no-op */

#endif
