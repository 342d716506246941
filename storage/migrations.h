/* migrations.h — private to storage/: the ordered schema migrations and the
 * code that applies them on open. Not part of the public face (storage.h). */
#ifndef KILN_STORAGE_MIGRATIONS_H
#define KILN_STORAGE_MIGRATIONS_H

#include <sqlite3.h>
#include <stddef.h>

/* How many migrations this build carries; equals STORE_SCHEMA_VERSION. */
int store_migration_count(void);

/* Reads the highest version recorded in schema_version into *version (0 when
 * the table is empty or missing). Returns STORE_OK or STORE_ERROR. */
int store_migrations_read_version(sqlite3 *db, int *version, char *errbuf, size_t errlen);

/* Brings db up to STORE_SCHEMA_VERSION: creates schema_version if needed,
 * refuses a database newer than this build, then applies each pending
 * migration in its own BEGIN IMMEDIATE transaction that also records the new
 * version. Safe against another process migrating the same file at once: the
 * version is re-read inside each transaction. Returns STORE_OK or
 * STORE_ERROR with a sentence in errbuf. */
int store_migrations_apply(sqlite3 *db, char *errbuf, size_t errlen);

#endif
