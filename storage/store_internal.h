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

/* For a caller holding the lock inside its own transaction (BEGIN
 * IMMEDIATE): inserts a job (QUEUED, CREATED, with its event; request_id
 * is not looked up), or moves one as store_job_transition does. */
int store_internal_job_insert(store *s, const store_job *job);
int store_internal_job_move(store *s, const char *id, const char *from, const char *to,
                            const char *reason, const char *message);

/* For a caller holding the lock (db from store_internal_lock) inside its
 * own transaction: queues a command for an agent as store_command_enqueue
 * does, so ending an allocation and telling its hosts is one transaction.
 * payload_json must be valid JSON (else STORE_ERROR). */
int store_internal_command_enqueue(store *s, sqlite3 *db, const char *agent_id, const char *kind,
                                   const char *payload_json, int64_t *seq);

/* The background checkpointer of a handle (wal.c), stopped by store_close. */
typedef struct store_wal_worker store_wal_worker;
void store_internal_set_wal_worker(store *s, store_wal_worker *w); /* lock held */
void store_internal_wal_stop(store_wal_worker *w);                 /* NULL is a no-op */

#endif
