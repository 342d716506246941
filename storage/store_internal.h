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

#endif
