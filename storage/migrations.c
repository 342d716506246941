/* migrations.c — kiln's schema as an ordered list of migrations, and the code
 * that brings a database up to date on open. Migration i (from 1) moves the
 * schema from version i-1 to i; a shipped migration is never edited, only
 * followed by a new one. Never downgrades. */
#include "migrations.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "storage.h"

/* Each script is constant SQL (no values), run with sqlite3_exec inside the
 * transaction that records its version. */
static const char *const migrations[] = {
    /* 1: jobs, their events, metrics, checkpoints; tokens and workers for later. */
    "CREATE TABLE jobs ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT," /* AUTOINCREMENT: never reused, safe in page tokens
                                                */
    "  id TEXT NOT NULL UNIQUE,"
    "  request_id TEXT UNIQUE," /* NULL when none: NULLs never collide */
    "  display_name TEXT NOT NULL DEFAULT '',"
    "  spec_json TEXT NOT NULL,"
    "  state TEXT NOT NULL,"
    "  reason TEXT NOT NULL DEFAULT '',"
    "  message TEXT NOT NULL DEFAULT '',"
    "  priority INTEGER NOT NULL DEFAULT 0,"
    "  attempt INTEGER NOT NULL DEFAULT 0,"
    "  create_ms INTEGER NOT NULL,"
    "  start_ms INTEGER," /* NULL until first RUNNING */
    "  end_ms INTEGER"    /* NULL until terminal */
    ");"
    /* The claim query: WHERE state='QUEUED' ORDER BY priority DESC, seq. */
    "CREATE INDEX jobs_claim ON jobs(state, priority DESC, seq);"
    /* The filtered list: WHERE state=? AND seq<? ORDER BY seq DESC. */
    "CREATE INDEX jobs_state_seq ON jobs(state, seq);"
    "CREATE TABLE job_events ("
    "  id INTEGER PRIMARY KEY," /* insertion order: events of one ms keep their order */
    "  job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  time_ms INTEGER NOT NULL,"
    "  from_state TEXT NOT NULL," /* '' for the creation event */
    "  to_state TEXT NOT NULL,"
    "  reason TEXT NOT NULL,"
    "  message TEXT NOT NULL DEFAULT ''"
    ");"
    "CREATE INDEX job_events_job ON job_events(job_id, id);"
    "CREATE TABLE metrics ("
    "  seq INTEGER PRIMARY KEY," /* arrival order, for SSE event ids */
    "  job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  attempt INTEGER NOT NULL,"
    "  step INTEGER NOT NULL,"
    "  epoch INTEGER NOT NULL DEFAULT 0,"
    "  name TEXT NOT NULL,"
    "  value REAL," /* NULL stands for NaN: SQLite cannot store a NaN */
    "  time_ms INTEGER NOT NULL,"
    "  UNIQUE(job_id, attempt, step, name)"
    ");"
    "CREATE TABLE checkpoints ("
    "  id INTEGER PRIMARY KEY,"
    "  job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  attempt INTEGER NOT NULL,"
    "  step INTEGER NOT NULL,"
    "  path TEXT NOT NULL,"
    "  bytes INTEGER NOT NULL,"
    "  sha256 TEXT NOT NULL,"
    "  metrics_json TEXT NOT NULL DEFAULT '{}',"
    "  create_ms INTEGER NOT NULL"
    ");"
    "CREATE INDEX checkpoints_job ON checkpoints(job_id, attempt, step);"
    "CREATE TABLE tokens ("
    "  id TEXT PRIMARY KEY,"
    "  tenant TEXT NOT NULL,"
    "  role TEXT NOT NULL,"
    "  sha256 TEXT NOT NULL UNIQUE," /* hash of the bearer token; the token itself is never stored
                                      */
    "  create_ms INTEGER NOT NULL,"
    "  revoked INTEGER NOT NULL DEFAULT 0"
    ");"
    "CREATE TABLE workers ("
    "  id TEXT PRIMARY KEY,"
    "  host TEXT NOT NULL,"
    "  devices_json TEXT NOT NULL DEFAULT '[]',"
    "  last_seen_ms INTEGER,"
    "  state TEXT NOT NULL"
    ");",
    /* 2: tenants. Every job belongs to the tenant of the token that created
     * it; request_id becomes unique per tenant, so one tenant's retry key
     * never finds (or reveals) another's job. SQLite cannot drop the old
     * column's UNIQUE, so the old column is renamed, emptied and left unused. */
    "ALTER TABLE jobs ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';"
    "ALTER TABLE jobs RENAME COLUMN request_id TO request_id_v1;"
    "ALTER TABLE jobs ADD COLUMN request_id TEXT;"
    "UPDATE jobs SET request_id = request_id_v1, request_id_v1 = NULL;"
    "CREATE UNIQUE INDEX jobs_tenant_request ON jobs(tenant, request_id);"
    /* The tenant's list: WHERE tenant=? [AND state=?] AND seq<? ORDER BY seq DESC. */
    "CREATE INDEX jobs_tenant_seq ON jobs(tenant, seq);"
    "CREATE INDEX jobs_tenant_state_seq ON jobs(tenant, state, seq);"
    /* A job re-queued after a crash waits out its backoff: not claimed before this. */
    "ALTER TABLE jobs ADD COLUMN not_before_ms INTEGER;"
    /* Fair share: a tenant's recent starts, counted at each claim. */
    "CREATE INDEX jobs_tenant_start ON jobs(tenant, start_ms);"
    /* The claim: each tenant's oldest ready job at the top priority, read
     * from the index alone. */
    "CREATE INDEX jobs_claim_tenant ON jobs(state, priority, tenant, seq, not_before_ms);",
    /* 3: uploaded data sets. */
    "CREATE TABLE datasets ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT," /* creation order, for page tokens */
    "  id TEXT NOT NULL UNIQUE,"
    "  display_name TEXT NOT NULL DEFAULT '',"
    "  format TEXT NOT NULL,"
    "  label_column TEXT NOT NULL DEFAULT '',"
    "  path TEXT NOT NULL,"
    "  bytes INTEGER NOT NULL,"
    "  sha256 TEXT NOT NULL,"
    "  examples INTEGER NOT NULL,"
    "  test_examples INTEGER NOT NULL DEFAULT 0,"
    "  classes INTEGER NOT NULL,"
    "  input_shape_json TEXT NOT NULL DEFAULT '[]',"
    "  create_ms INTEGER NOT NULL"
    ");",
    /* 4: pinned checkpoints: retention (keep_last) never removes one. */
    "ALTER TABLE checkpoints ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0;",
    /* 5: placement and data set owners. A job's resources get columns of
     * their own, so a scheduling pass reads the whole queue from one index
     * without parsing specs; jobs from before take theirs from the spec.
     * Data sets belong to the tenant that uploaded them. */
    "ALTER TABLE jobs ADD COLUMN pool TEXT NOT NULL DEFAULT 'default';"
    "ALTER TABLE jobs ADD COLUMN devices INTEGER NOT NULL DEFAULT 1;"
    "ALTER TABLE jobs ADD COLUMN max_runtime_s INTEGER NOT NULL DEFAULT 0;"
    "UPDATE jobs SET"
    "  pool = COALESCE(json_extract(spec_json, '$.resources.pool'), 'default'),"
    "  devices = COALESCE(json_extract(spec_json, '$.resources.devices'), 1),"
    "  max_runtime_s = COALESCE(json_extract(spec_json, '$.max_runtime'), 0)"
    "  WHERE json_valid(spec_json);"
    /* The pass: WHERE state='QUEUED' ORDER BY priority DESC, seq, from the index alone. */
    "CREATE INDEX jobs_queue ON jobs(state, priority DESC, seq, id, tenant, pool, devices,"
    "  max_runtime_s, not_before_ms);"
    /* Every index is written on each create: drop the two the pass replaces
     * (jobs_queue leads with the same columns as jobs_claim). */
    "DROP INDEX jobs_claim;"
    "DROP INDEX jobs_claim_tenant;"
    /* Most jobs have no request_id and a queued one no start: partial
     * indexes leave those rows out, and every query of them names a value
     * (which implies NOT NULL), so they still serve it. */
    "DROP INDEX jobs_tenant_request;"
    "CREATE UNIQUE INDEX jobs_tenant_request ON jobs(tenant, request_id)"
    "  WHERE request_id IS NOT NULL;"
    "DROP INDEX jobs_tenant_start;"
    "CREATE INDEX jobs_tenant_start ON jobs(tenant, start_ms) WHERE start_ms IS NOT NULL;"
    "ALTER TABLE datasets ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';"
    "CREATE INDEX datasets_tenant_seq ON datasets(tenant, seq);",
    /* 6: when each token was last used (GET /v1/tokens shows it); 0 = never. */
    "ALTER TABLE tokens ADD COLUMN last_used_ms INTEGER NOT NULL DEFAULT 0;",
    /* 7: limits. A job counts its restarts after failures apart from those
     * the infrastructure caused (a kilnd restart, a preemption), so
     * max_restarts counts only the first kind. A tenant's quotas, set by an
     * admin; a NULL limit falls back to kilnd's default. */
    "ALTER TABLE jobs ADD COLUMN restarts INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE jobs ADD COLUMN infra_restarts INTEGER NOT NULL DEFAULT 0;"
    /* What the planner said the job needs (0 = not planned): its memory limit. */
    "ALTER TABLE jobs ADD COLUMN planned_memory_bytes INTEGER NOT NULL DEFAULT 0;"
    "CREATE TABLE tenant_quotas ("
    "  tenant TEXT PRIMARY KEY,"
    "  max_priority INTEGER,"
    "  max_devices INTEGER,"
    "  max_queued_jobs INTEGER,"
    "  max_storage_bytes INTEGER,"
    "  update_ms INTEGER NOT NULL"
    ");",
    /* 8: experiments. An experiment is a base spec and a search; each of
     * its trials is a row made at create (values drawn, state WAITING)
     * that gets a job when it starts, and the job names its experiment.
     * A trial's rung results are its metric at the end of each rung it
     * finished, as text ("0.81,0.86"), so the searcher's state is all here
     * and a restarted kilnd decides from it as before. */
    "CREATE TABLE experiments ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  id TEXT NOT NULL UNIQUE,"
    "  tenant TEXT NOT NULL,"
    "  request_id TEXT,"
    "  display_name TEXT NOT NULL DEFAULT '',"
    "  spec_json TEXT NOT NULL,"
    "  search_json TEXT NOT NULL,"
    "  state TEXT NOT NULL,"
    "  message TEXT NOT NULL DEFAULT '',"
    "  create_ms INTEGER NOT NULL,"
    "  end_ms INTEGER"
    ");"
    "CREATE UNIQUE INDEX experiments_tenant_request ON experiments(tenant, request_id)"
    "  WHERE request_id IS NOT NULL;"
    "CREATE INDEX experiments_tenant_seq ON experiments(tenant, seq);"
    "CREATE INDEX experiments_state ON experiments(state);"
    "CREATE TABLE trials ("
    "  experiment_id TEXT NOT NULL REFERENCES experiments(id) ON DELETE CASCADE,"
    "  idx INTEGER NOT NULL,"
    "  values_json TEXT NOT NULL,"
    "  job_id TEXT," /* NULL until it starts */
    "  state TEXT NOT NULL,"
    "  rung INTEGER NOT NULL DEFAULT 0,"
    "  epochs INTEGER NOT NULL DEFAULT 0,"
    "  results TEXT NOT NULL DEFAULT '',"
    "  planned_memory_bytes INTEGER NOT NULL DEFAULT 0,"
    "  PRIMARY KEY (experiment_id, idx)"
    ");"
    "CREATE INDEX trials_job ON trials(job_id) WHERE job_id IS NOT NULL;"
    "CREATE TABLE experiment_events ("
    "  id INTEGER PRIMARY KEY,"
    "  experiment_id TEXT NOT NULL REFERENCES experiments(id) ON DELETE CASCADE,"
    "  time_ms INTEGER NOT NULL,"
    "  reason TEXT NOT NULL,"
    "  job_id TEXT NOT NULL DEFAULT '',"
    "  message TEXT NOT NULL DEFAULT ''"
    ");"
    "CREATE INDEX experiment_events_experiment ON experiment_events(experiment_id, id);"
    "ALTER TABLE jobs ADD COLUMN experiment_id TEXT;",
    /* 9: shard data sets: a folder registered by an admin (its path under
     * the datasets directory; '' for an upload) and what the check found
     * (files per split, the first record's features) as JSON. */
    "ALTER TABLE datasets ADD COLUMN source TEXT NOT NULL DEFAULT '';"
    "ALTER TABLE datasets ADD COLUMN shards_json TEXT NOT NULL DEFAULT '';",
    /* 10: agents: one kiln-agent per worker host, registered by name (a
     * re-registration is the same row), with its devices, the token that
     * registered it last (only that token may poll as it) and when it was
     * last heard from. Its commands are numbered per agent from 1; the
     * agent's last_command_seq hands out the next, so a seq is never
     * reused even if old commands are pruned. */
    "CREATE TABLE agents ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT," /* registration order, for page tokens */
    "  id TEXT NOT NULL UNIQUE,"
    "  name TEXT NOT NULL UNIQUE,"
    "  hostname TEXT NOT NULL,"
    "  pool TEXT NOT NULL,"
    "  address TEXT NOT NULL,"
    "  cpus INTEGER NOT NULL,"
    "  gpus_json TEXT NOT NULL DEFAULT '[]',"
    "  version TEXT NOT NULL DEFAULT '',"
    "  state TEXT NOT NULL," /* ONLINE | LOST */
    "  token_id TEXT NOT NULL DEFAULT '',"
    "  last_command_seq INTEGER NOT NULL DEFAULT 0,"
    "  last_seen_ms INTEGER NOT NULL,"
    "  create_ms INTEGER NOT NULL"
    ");"
    /* A pool's agents, and the loss check: WHERE state='ONLINE' AND last_seen_ms < ?. */
    "CREATE INDEX agents_pool_state ON agents(pool, state);"
    "CREATE INDEX agents_state_seen ON agents(state, last_seen_ms);"
    "CREATE TABLE agent_commands ("
    "  agent_id TEXT NOT NULL REFERENCES agents(id) ON DELETE CASCADE,"
    "  seq INTEGER NOT NULL,"
    "  kind TEXT NOT NULL,"
    "  payload_json TEXT NOT NULL DEFAULT '{}',"
    "  create_ms INTEGER NOT NULL,"
    "  done_ms INTEGER," /* NULL until the agent reports it done */
    "  ok INTEGER,"
    "  result_json TEXT,"
    "  PRIMARY KEY (agent_id, seq)"
    ");"
    /* A poll: an agent's commands not yet done, past a seq. */
    "CREATE INDEX agent_commands_pending ON agent_commands(agent_id, seq) WHERE done_ms IS NULL;",
    /* 11: allocations: one attempt of a job on remote hosts (agents), with
     * the hash of its token (the worker side's only credential, for that
     * allocation alone), its hosts with their ranks and cores, and the
     * relays (Open MPI daemons a host runs for it, as an agent command).
     * The job's infra_restarts column came with migration 7. */
    "CREATE TABLE allocations ("
    "  id TEXT PRIMARY KEY,"
    "  job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  attempt INTEGER NOT NULL,"
    "  pool TEXT NOT NULL,"
    "  token_sha256 TEXT NOT NULL UNIQUE,"
    "  state TEXT NOT NULL," /* STARTING | RUNNING | ENDED */
    "  reason TEXT NOT NULL DEFAULT '',"
    "  create_ms INTEGER NOT NULL,"
    "  end_ms INTEGER"
    ");"
    "CREATE INDEX allocations_state ON allocations(state);"
    "CREATE INDEX allocations_job ON allocations(job_id);"
    "CREATE TABLE allocation_hosts ("
    "  alloc_id TEXT NOT NULL REFERENCES allocations(id) ON DELETE CASCADE,"
    "  agent_id TEXT NOT NULL,"
    "  name TEXT NOT NULL,"
    "  address TEXT NOT NULL,"
    "  rank_first INTEGER NOT NULL,"
    "  ranks INTEGER NOT NULL,"
    "  cores TEXT NOT NULL,"
    "  PRIMARY KEY (alloc_id, agent_id)"
    ");"
    "CREATE INDEX allocation_hosts_agent ON allocation_hosts(agent_id);"
    "CREATE TABLE relays ("
    "  id TEXT PRIMARY KEY,"
    "  alloc_id TEXT NOT NULL REFERENCES allocations(id) ON DELETE CASCADE,"
    "  agent_id TEXT NOT NULL,"
    "  seq INTEGER NOT NULL," /* the agent's exec command: its report holds the exit code */
    "  create_ms INTEGER NOT NULL"
    ");",
};

_Static_assert(sizeof migrations / sizeof migrations[0] == STORE_SCHEMA_VERSION,
               "storage: one migration per schema version, STORE_SCHEMA_VERSION is the last");

int store_migration_count(void) {
  return (int)(sizeof migrations / sizeof migrations[0]);
}

static void set_err(char *errbuf, size_t errlen, const char *fmt, ...) {
  if (!errbuf || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(errbuf, errlen, fmt, ap);
  va_end(ap);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int store_migrations_read_version(sqlite3 *db, int *version, char *errbuf, size_t errlen) {
  sqlite3_stmt *st = NULL;
  int rc = STORE_ERROR;
  *version = 0;
  /* A missing table reads as version 0, not an error: the file is new. */
  if (sqlite3_prepare_v2(db,
                         "SELECT count(*) FROM sqlite_master"
                         " WHERE type = 'table' AND name = 'schema_version'",
                         -1, &st, NULL) != SQLITE_OK ||
      sqlite3_step(st) != SQLITE_ROW) {
    set_err(errbuf, errlen, "read schema version: %s", sqlite3_errmsg(db));
    goto done;
  }
  int has_table = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  st = NULL;
  if (!has_table) {
    rc = STORE_OK;
    goto done;
  }
  if (sqlite3_prepare_v2(db, "SELECT COALESCE(MAX(version), 0) FROM schema_version", -1, &st,
                         NULL) != SQLITE_OK ||
      sqlite3_step(st) != SQLITE_ROW) {
    set_err(errbuf, errlen, "read schema version: %s", sqlite3_errmsg(db));
    goto done;
  }
  *version = sqlite3_column_int(st, 0);
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  return rc;
}

/* Applies migration `version` (1-based) unless another connection already
 * did; the caller has checked version-1 was current before. */
static int apply_one(sqlite3 *db, int version, char *errbuf, size_t errlen) {
  sqlite3_stmt *st = NULL;
  int in_tx = 0;
  int rc = STORE_ERROR;
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
    set_err(errbuf, errlen, "apply migration %d: begin: %s", version, sqlite3_errmsg(db));
    goto done;
  }
  in_tx = 1;
  /* Re-read under the write lock: another process may have migrated meanwhile. */
  int current = 0;
  if (store_migrations_read_version(db, &current, errbuf, errlen) != STORE_OK) goto done;
  if (current >= version) {
    rc = STORE_OK;
    goto done; /* nothing written: the rollback below just ends the transaction */
  }
  if (current != version - 1) {
    set_err(errbuf, errlen, "apply migration %d: database is at schema version %d, expected %d",
            version, current, version - 1);
    goto done;
  }
  char *exec_err = NULL;
  if (sqlite3_exec(db, migrations[version - 1], NULL, NULL, &exec_err) != SQLITE_OK) {
    set_err(errbuf, errlen, "apply migration %d: %s", version,
            exec_err ? exec_err : sqlite3_errmsg(db));
    sqlite3_free(exec_err);
    goto done;
  }
  if (sqlite3_prepare_v2(db, "INSERT INTO schema_version(version, applied_ms) VALUES (?1, ?2)", -1,
                         &st, NULL) != SQLITE_OK) {
    set_err(errbuf, errlen, "record schema version %d: %s", version, sqlite3_errmsg(db));
    goto done;
  }
  sqlite3_bind_int(st, 1, version);
  sqlite3_bind_int64(st, 2, now_ms());
  if (sqlite3_step(st) != SQLITE_DONE) {
    set_err(errbuf, errlen, "record schema version %d: %s", version, sqlite3_errmsg(db));
    goto done;
  }
  if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
    set_err(errbuf, errlen, "apply migration %d: commit: %s", version, sqlite3_errmsg(db));
    goto done;
  }
  in_tx = 0;
  rc = STORE_OK;
done:
  sqlite3_finalize(st);
  if (in_tx) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  return rc;
}

/* Reads the version and refuses one newer than this build knows. */
static int read_known_version(sqlite3 *db, int *version, char *errbuf, size_t errlen) {
  if (store_migrations_read_version(db, version, errbuf, errlen) != STORE_OK) return STORE_ERROR;
  if (*version > STORE_SCHEMA_VERSION) {
    set_err(errbuf, errlen,
            "database schema version %d is newer than version %d, the newest this build of kiln "
            "knows; refusing to open it (kiln never downgrades a schema): run a newer kiln",
            *version, STORE_SCHEMA_VERSION);
    return STORE_ERROR;
  }
  return STORE_OK;
}

int store_migrations_apply(sqlite3 *db, char *errbuf, size_t errlen) {
  if (sqlite3_exec(db,
                   "CREATE TABLE IF NOT EXISTS schema_version ("
                   "  version INTEGER PRIMARY KEY,"
                   "  applied_ms INTEGER NOT NULL)",
                   NULL, NULL, NULL) != SQLITE_OK) {
    set_err(errbuf, errlen, "create schema_version table: %s", sqlite3_errmsg(db));
    return STORE_ERROR;
  }
  int current = 0;
  if (read_known_version(db, &current, errbuf, errlen) != STORE_OK) return STORE_ERROR;
  for (int version = current + 1; version <= STORE_SCHEMA_VERSION; version++) {
    if (apply_one(db, version, errbuf, errlen) != STORE_OK) return STORE_ERROR;
  }
  /* A newer kiln may have migrated the same file while we were at it. */
  return read_known_version(db, &current, errbuf, errlen);
}
