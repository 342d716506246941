/* storage.h — kiln's SQLite store: schema and migrations, jobs, job events,
 * metrics and checkpoints. Prepared statements only; every write that
 * touches more than one row is one transaction. Prefix store_.
 *
 * Threads: a store handle may be shared by threads; its connection is
 * guarded by the handle's own mutex (db_lock). Several handles may open the
 * same file (WAL mode lets readers and one writer go on together). */
#ifndef KILN_STORAGE_H
#define KILN_STORAGE_H

#include <stddef.h>
#include <stdint.h>

typedef struct store store;

enum {
  STORE_OK = 0,
  STORE_ERROR = -1, /* SQLite or I/O failure; errbuf says which */
  STORE_NOT_FOUND = -2,
  STORE_EXISTS = -3,   /* request_id already used: the existing job is returned */
  STORE_CONFLICT = -4, /* a state transition whose `from` did not match */
  STORE_EMPTY = -5,    /* nothing to claim */
};

/* Latest schema version this build knows; the database is migrated to it on open. */
#define STORE_SCHEMA_VERSION 11

/* Opens (creating if needed) the database at path, sets WAL, foreign_keys=ON,
 * busy_timeout (5 s), synchronous=NORMAL, and applies pending migrations in
 * order, each in its own transaction. A database whose schema is newer than
 * STORE_SCHEMA_VERSION is refused, never downgraded. On failure *out is NULL
 * and errbuf (may be NULL) gets a sentence naming path and cause. */
int store_open(const char *path, store **out, char *errbuf, size_t errlen);
void store_close(store *s); /* NULL is a no-op */
/* Checkpoints this handle's WAL from a worker thread of its own instead of
 * inline in the commit that fills it (SQLite's default), so a request never
 * pays for one. For a server's busy handle; store_close stops the worker. */
int store_checkpoint_in_background(store *s);
int store_schema_version(store *s); /* the version recorded in schema_version */
/* The last error sentence of this handle (never NULL). Per thread: after a
 * failed call it explains that call even if another thread has failed on the
 * same handle since; a thread with no failure of its own on s sees the
 * handle's latest. Valid until this thread's next store_errmsg. */
const char *store_errmsg(store *s);

/* Milliseconds since the Unix epoch (wall clock), as stored in every *_ms column. */
int64_t store_now_ms(void);

typedef struct store_job {
  int64_t seq; /* rowid: creation order, used for page tokens */
  char id[40];
  char request_id[80]; /* "" when none */
  char display_name[128];
  char *spec_json; /* canonical spec (owned) */
  char state[16];  /* "QUEUED" ... */
  char reason[48]; /* reason code of the last transition */
  char *message;   /* human message of the last transition (owned, never NULL after get) */
  int priority;
  int attempt;                         /* number of starts so far */
  int64_t create_ms, start_ms, end_ms; /* 0 when not yet */
  char tenant[64];                     /* owner; "" on create = STORE_DEFAULT_TENANT */
  char pool[32];                       /* resources.pool; "" on create = STORE_DEFAULT_POOL */
  int devices;                         /* resources.devices; 0 on create = 1 */
  int max_runtime_s;                   /* 0 = no limit */
  int restarts;       /* re-queues after the job's own failures (what max_restarts bounds) */
  int infra_restarts; /* re-queues the infrastructure caused: kilnd restarts, preemptions */
  int64_t planned_memory_bytes; /* the planner's figure at create; 0 = not planned */
  char experiment[40];          /* the experiment whose trial it is; "" for none */
} store_job;

/* The pool of jobs that name none. */
#define STORE_DEFAULT_POOL "default"

/* The tenant of jobs created without one (and of jobs from schema 1). */
#define STORE_DEFAULT_TENANT "default"

/* Frees the owned strings of a job filled by a store_* call (not the struct)
 * and sets them to NULL. Functions that fill a store_job overwrite it whole:
 * clear a filled one before reusing it. NULL is a no-op. */
void store_job_clear(store_job *job);
void store_job_list_free(store_job *jobs, int n);

/* Inserts job (state QUEUED, reason CREATED, attempt 0) and a job_events row
 * ("" -> QUEUED, CREATED, job->message or ""), in one transaction. Reads id,
 * request_id, display_name, spec_json (NULL = "{}"), priority, message and
 * create_ms (0 = now), tenant and experiment; the other fields are ignored. If
 * job->request_id is non-empty and a job of the same tenant with that
 * request_id exists, nothing is inserted,
 * *existing is filled with that job and STORE_EXISTS is returned. existing
 * may be NULL. A duplicate id is STORE_ERROR. */
int store_job_create(store *s, const store_job *job, store_job *existing);
int store_job_get(store *s, const char *id, store_job *out); /* STORE_NOT_FOUND when absent */
/* The id (40 bytes) of tenant's job created with request_id (lookup.c);
 * STORE_NOT_FOUND when none. */
int store_job_find_request(store *s, const char *tenant, const char *request_id, char id[40]);
/* Jobs in descending creation order (newest first), optionally only those in
 * state_filter (NULL = all), with seq < before_seq (0 = from the newest),
 * at most limit (>= 1). *out is malloc'd (free with store_job_list_free);
 * it is NULL when *n is 0. The next page: before_seq = last job's seq. */
int store_job_list(store *s, const char *state_filter, int64_t before_seq, int limit,
                   store_job **out, int *n);
/* Moves a job from `from` (NULL = any non-terminal state) to `to`, recording a
 * job_events row with reason and message, in one transaction. Sets start_ms
 * when entering RUNNING (so it marks the latest start) and end_ms when
 * entering a terminal state; entering a non-terminal state (a resume)
 * clears end_ms. STORE_CONFLICT when the job is not in `from`;
 * STORE_NOT_FOUND when absent; STORE_ERROR for a state name that is not
 * one of QUEUED STARTING RUNNING STOPPING SUCCEEDED FAILED CANCELLED
 * PREEMPTED (a misspelt one would never count as terminal). */
int store_job_transition(store *s, const char *id, const char *from, const char *to,
                         const char *reason, const char *message);
/* How far back a tenant's job starts count against it in fair share. */
#define STORE_FAIR_SHARE_WINDOW_MS (60 * 60 * 1000)
/* Atomically picks the next QUEUED job (highest priority; within it the
 * tenant with the fewest starts in the last STORE_FAIR_SHARE_WINDOW_MS,
 * then the oldest) whose retry backoff (not_before_ms) has passed, moves it to STARTING
 * (reason CLAIMED, with an event), increments its
 * attempt and fills out (may be NULL). Safe across handles and processes:
 * a job is claimed once. STORE_EMPTY when no job is queued. For a consumer
 * of one slot; kilnd's scheduler places by pools and claims with
 * store_job_claim. */
int store_job_claim_next(store *s, store_job *out);
/* Claims the QUEUED job id as store_job_claim_next would (STARTING, reason
 * CLAIMED, attempt + 1): the scheduler's pass chose it. STORE_CONFLICT when
 * it is no longer queued (cancelled meanwhile), STORE_ERROR otherwise. */
int store_job_claim(store *s, const char *id, store_job *out);

/* One queued job as a scheduling pass sees it. */
typedef struct store_queued {
  int64_t seq;
  char id[40];
  char tenant[64];
  char pool[32];
  int priority, devices, max_runtime_s;
  int64_t not_before_ms; /* 0 = may start now */
} store_queued;
/* Every QUEUED job, highest priority first and oldest first within one,
 * read from one covering index. *out is malloc'd (free()), NULL when *n is
 * 0; *cap (may be NULL) says how many it holds: pass the array back in
 * (*out non-NULL, *cap its size) and it is reused. */
int store_job_queue_load(store *s, store_queued **out, int *n, int *cap);
/* Starts per tenant since since_ms, for fair share: calls fn for each
 * tenant with a start. */
int store_tenant_starts(store *s, int64_t since_ms,
                        void (*fn)(const char *tenant, int64_t starts, void *user), void *user);

/* Puts an unfinished job back in the queue after a failure of its own, to
 * be claimed no earlier than not_before_ms (a retry's backoff), with an
 * event; counts it in restarts. STORE_CONFLICT when it already ended,
 * STORE_NOT_FOUND when absent. */
int store_job_retry(store *s, const char *id, int64_t not_before_ms, const char *reason,
                    const char *message);
/* Recovery after a restart: every job in STARTING, RUNNING or STOPPING goes
 * back to QUEUED with reason "SERVER_RESTARTED" and an event each, in one
 * transaction, counted in infra_restarts. *n (may be NULL) gets how many. */
int store_job_requeue_unfinished(store *s, int *n);
/* A data directory opened from another folder than the one it was made in
 * (relocate.c): checkpoint and data set rows whose absolute path is not
 * under data_dir (absolute, as kilnd resolves it) are pointed at the same
 * file under it (from "/jobs/<job>/" and "/datasets/<id>" on), in one
 * transaction. *moved (may be NULL) gets how many rows changed. */
int store_relocate(store *s, const char *data_dir, int *moved);
/* An infrastructure restart of one job (requeue.c): the unfinished job goes
 * back to QUEUED, counted in infra_restarts, in one transaction. With via
 * (e.g. "PREEMPTED") it records two events, current -> via (via_reason,
 * via_message) and via -> QUEUED (reason, message), and never rests in via:
 * a crash cannot strand it there. STORE_CONFLICT when it already ended,
 * STORE_NOT_FOUND when absent. */
int store_job_requeue(store *s, const char *id, const char *via, const char *via_reason,
                      const char *via_message, const char *reason, const char *message);

/* A page of a tenant's jobs (AIP-158 list). */
typedef struct store_job_query {
  const char *tenant; /* NULL = every tenant (admin views) */
  const char *state;  /* NULL = every state */
  int64_t after_seq;  /* 0 = from the start; else the last seq of the previous page */
  int ascending;      /* 0 = newest first (default), 1 = oldest first */
  int limit;          /* >= 1 */
} store_job_query;
/* Jobs matching q in seq order (descending unless q->ascending), only those
 * past q->after_seq in that order. *out as for store_job_list. */
int store_job_query_list(store *s, const store_job_query *q, store_job **out, int *n);
/* Deletes a job in a terminal state with its events, metrics and checkpoint
 * rows (not files), in one transaction. STORE_CONFLICT when it is not
 * terminal, STORE_NOT_FOUND when absent. */
int store_job_delete(store *s, const char *id);
/* Jobs per state, every tenant: counts[i] for the i-th of QUEUED STARTING
 * RUNNING STOPPING SUCCEEDED FAILED CANCELLED PREEMPTED (api_job_state order). */
int store_job_count_by_state(store *s, int64_t counts[8]);
/* For a QUEUED job: how many queued jobs are claimed before it (higher
 * priority, or same priority and older). */
int store_job_queue_ahead(store *s, const char *id, int64_t *ahead);

/* ---- tokens ---- */

typedef struct store_token {
  char id[40];     /* public id, shown in lists; never the secret */
  char tenant[64]; /* the tenant the token acts for */
  char role[16];   /* "admin", "user" or "agent" (a kiln-agent's: tenant "agents") */
  int64_t create_ms;
  int64_t last_used_ms; /* 0 = never (store_token_list fills it) */
} store_token;
/* Records a token by the SHA-256 (lowercase hex) of its secret; the secret
 * itself is never stored. STORE_EXISTS when the id or hash is taken. */
int store_token_add(store *s, const store_token *t, const char *sha256_hex);
/* The unrevoked token whose secret hashes to sha256_hex; STORE_NOT_FOUND when none. */
int store_token_find(store *s, const char *sha256_hex, store_token *out);
/* tokens.c: the unrevoked tokens of tenant (NULL: every tenant's), oldest
 * first, malloc'd into *out (free() it). */
int store_token_list(store *s, const char *tenant, store_token **out, int *n);
/* Revokes token id if it belongs to tenant (NULL: any tenant's);
 * STORE_NOT_FOUND when there is no such unrevoked token. */
int store_token_revoke(store *s, const char *id, const char *tenant);
/* Records that the token with this hash was used at now_ms. */
int store_token_touch(store *s, const char *sha256_hex, int64_t now_ms);

/* A number that changes whenever any handle of this process has written
 * to its database (an insert, update or delete): what was read while it
 * stayed the same is still what the database holds, as far as this
 * process's writes go. Read without taking any lock. */
uint64_t store_generation(store *s);
int store_token_count(store *s, int64_t *n); /* unrevoked tokens */

typedef struct store_event {
  int64_t time_ms;
  char from_state[16];
  char to_state[16];
  char reason[48];
  char *message; /* owned */
} store_event;
/* A job's events in the order they happened. An unknown job has none (*n 0,
 * *out NULL), which is not an error: every job has its CREATED event. */
int store_event_list(store *s, const char *job_id, store_event **out, int *n);
void store_event_list_free(store_event *events, int n);

typedef struct store_metric {
  int64_t seq; /* arrival order (filled on read): SSE event ids */
  int attempt;
  int64_t step;
  int epoch;
  char name[48];
  double value;    /* NaN is kept (stored as NULL) and read back as NaN */
  int64_t time_ms; /* 0 on append = now */
} store_metric;

/* Appends n metric points of a job in one transaction; a point whose
 * (job, attempt, step, name) is already stored is ignored (the first value
 * wins), so a replayed line never duplicates. STORE_NOT_FOUND for an unknown
 * job; an empty name is STORE_ERROR; either way nothing of the batch is kept. */
int store_metrics_append(store *s, const char *job_id, const store_metric *points, int n);
/* Points of a job ordered by (attempt, step, name); name NULL = all names.
 * *out is malloc'd (free()), NULL when *n is 0. */
int store_metrics_list(store *s, const char *job_id, const char *name, store_metric **out, int *n);
/* Points of a job with start_step <= step <= end_step (name NULL = all
 * names), ordered like store_metrics_list, each name's series thinned
 * evenly to at most max_points (0 = all), its first and last point kept:
 * what a chart needs of a long run, read mostly from the index. */
int store_metrics_thinned(store *s, const char *job_id, const char *name, int64_t start_step,
                          int64_t end_step, int max_points, store_metric **out, int *n);
/* The last point (highest attempt, then step) of each of a job's metric
 * names, ordered by name: a job's summary, without reading every point. */
int store_metrics_latest(store *s, const char *job_id, store_metric **out, int *n);
/* The newest point of a job, any name (highest attempt, then step): where
 * its training stands. *n is 0 when the job has no point yet. */
int store_metrics_newest(store *s, const char *job_id, store_metric *out, int *n);
/* How many points a job has, over every attempt. */
int store_metrics_count(store *s, const char *job_id, int64_t *count);
/* Up to limit points of a job with seq > after_seq, in arrival (seq) order:
 * a stream resumes after the last id it delivered, missing and repeating
 * nothing. */
int store_metrics_since(store *s, const char *job_id, int64_t after_seq, int limit,
                        store_metric **out, int *n);

typedef struct store_checkpoint {
  int64_t id;
  char job_id[40];
  int attempt;
  int64_t step;
  char path[512];
  int64_t bytes;
  char sha256[65];
  char *metrics_json; /* owned; "{}" when none */
  int64_t create_ms;
  int pinned; /* 1: retention never removes it (ignored by store_checkpoint_add) */
} store_checkpoint;

/* Records a checkpoint file that is already on disk (renamed into place).
 * Ignores c->id (the store assigns it); metrics_json NULL = "{}", create_ms
 * 0 = now. STORE_NOT_FOUND when the job does not exist. */
int store_checkpoint_add(store *s, const store_checkpoint *c);
/* A job's checkpoints ordered by (attempt, step, id); *out NULL when *n is 0. */
int store_checkpoint_list(store *s, const char *job_id, store_checkpoint **out, int *n);
void store_checkpoint_list_free(store_checkpoint *list, int n);
/* Pins (pinned 1) or unpins (0) checkpoint id of job_id. STORE_NOT_FOUND
 * when the job has no such checkpoint. */
int store_checkpoint_set_pinned(store *s, const char *job_id, int64_t id, int pinned);
/* Retention: keeps the job's keep_last (>= 1) newest unpinned checkpoints
 * (in the order they were recorded) and every pinned one, and deletes the
 * rest in one transaction. For
 * each, remove_file(path, user) runs first and returns 0 when the file is
 * gone (one already gone counts as gone) or non-zero to keep the row for a
 * later pass. *n_deleted (may be NULL) counts the rows deleted. */
int store_checkpoint_retain(store *s, const char *job_id, int keep_last,
                            int (*remove_file)(const char *path, void *user), void *user,
                            int *n_deleted);

/* Retention with a metric (Keras ModelCheckpoint / Determined style): a
 * checkpoint is kept when it is among the keep_last newest or among the
 * keep_best best by `monitor` in its metrics_json (lower is better unless
 * higher_is_better). A checkpoint without that metric is never among the
 * best. keep_last 0 with keep_best > 0 still keeps the newest one, which a
 * resume needs. */
typedef struct store_retention {
  int keep_last;       /* 0 = none kept for being new (but see above) */
  int keep_best;       /* 0 = none kept for their metric */
  const char *monitor; /* metric name, e.g. "val_loss"; needed when keep_best > 0 */
  int higher_is_better;
} store_retention;
/* Deletes, in one transaction, every checkpoint of the job the policy does
 * not keep, each after remove_file(path, user) returns 0 (as for
 * store_checkpoint_retain). */
int store_checkpoint_retain_policy(store *s, const char *job_id, const store_retention *policy,
                                   int (*remove_file)(const char *path, void *user), void *user,
                                   int *n_deleted);

/* ---- uploaded data sets (datasets.c) ---- */

typedef struct store_dataset {
  int64_t seq; /* creation order, for page tokens */
  char id[32];
  char display_name[128];
  char format[16]; /* "csv", "idx", "images", "tfrecord", "tar" */
  char label_column[64];
  char path[512]; /* the folder holding upload.bin (or files/) and dataset.json */
  int64_t bytes;
  char sha256[65];
  int64_t examples, test_examples;
  int classes;
  char input_shape_json[128]; /* "[28,28,1]", "[]" when set by the model (images) */
  int64_t create_ms;
  char tenant[64]; /* the uploader's; "" on add = STORE_DEFAULT_TENANT */
  /* A registered folder of shards: its path under the datasets directory
   * ("" for an upload); its files are not the tenant's storage. */
  char source[256];
  /* Shards: the check's findings as JSON (files per split, the features
   * of the first record, the image and label features checked); "" else. */
  char shards_json[4096];
} store_dataset;

/* Records a data set whose files are in place. A duplicate id is STORE_EXISTS. */
int store_dataset_add(store *s, const store_dataset *d);
int store_dataset_get(store *s, const char *id, store_dataset *out); /* STORE_NOT_FOUND */
/* Newest first, seq < before_seq (0 = from the newest), at most limit; *out
 * malloc'd (free()), NULL when *n is 0. */
int store_dataset_list(store *s, int64_t before_seq, int limit, store_dataset **out, int *n);
/* The same, only tenant's data sets (NULL = every tenant's). */
int store_dataset_list_tenant(store *s, const char *tenant, int64_t before_seq, int limit,
                              store_dataset **out, int *n);
/* Deletes the row unless a job that is not finished names the data set:
 * then STORE_CONFLICT, and *blocking_job (may be NULL, 40 bytes) gets one
 * such job's id. Checked and deleted in one transaction. */
int store_dataset_delete(store *s, const char *id, char *blocking_job);
/* ---- tenants' quotas and usage (quota.c) ---- */

/* An admin's limits for one tenant; STORE_QUOTA_DEFAULT in a field means
 * "not set": kilnd's default applies. 0 means no limit. */
#define STORE_QUOTA_DEFAULT (-1)
typedef struct store_quota {
  int64_t max_priority;      /* highest priority its users may give a job */
  int64_t max_devices;       /* devices its unfinished jobs may ask for, all together */
  int64_t max_queued_jobs;   /* jobs it may have waiting (QUEUED or PREEMPTED) */
  int64_t max_storage_bytes; /* its uploads and checkpoints, together */
} store_quota;
/* The tenant's quota; every field STORE_QUOTA_DEFAULT when none was set. */
int store_quota_get(store *s, const char *tenant, store_quota *out);
/* Replaces the tenant's quota (fields STORE_QUOTA_DEFAULT are unset). */
int store_quota_put(store *s, const char *tenant, const store_quota *q);
/* The limits in force for tenant: its own where an admin set them, else
 * defaults' (kilnd's). */
int store_quota_effective(store *s, const char *tenant, const store_quota *defaults,
                          store_quota *out);

typedef struct store_usage {
  int64_t queued_jobs;   /* QUEUED or PREEMPTED */
  int64_t devices;       /* asked for by its jobs that have not ended */
  int64_t storage_bytes; /* its uploaded data sets and its jobs' recorded checkpoints */
} store_usage;
/* What the tenant holds now, read in one transaction. */
int store_usage_get(store *s, const char *tenant, store_usage *out);

/* Adds a row to a job's events that is not a state change (from = to = the
 * current state), e.g. the pipeline's auto-tuned settings. */
int store_job_note(store *s, const char *job_id, const char *reason, const char *message);

/* ---- backup and restore (backup.c) ---- */

/* Called with each file a backup's snapshot references: kind "checkpoint"
 * (path is a file) or "dataset" (path is a folder). Non-zero stops it. */
typedef int (*store_backup_file_fn)(const char *kind, const char *path, void *user);
typedef struct store_backup_stats {
  int pages; /* the snapshot's pages */
  int steps; /* sqlite3_backup_step calls it took */
} store_backup_stats;
/* Copies the database at db_path (which a serving kilnd may be writing) to
 * a new file out_path as one consistent snapshot: SQLite's online backup
 * API, pages_per_step pages a step, all steps reading one WAL snapshot, so
 * writers go on meanwhile and the copy never restarts. First, while
 * writers wait a moment (the write lock, so no retention pass removes a
 * file in between), on_file (may be NULL) gets each file the snapshot
 * references: take them (hard links, open descriptors) then, and copy them
 * later. The copy is one self-contained file (journal_mode DELETE) that
 * passes quick_check. STORE_OK, or STORE_ERROR with a sentence in err. */
int store_backup(const char *db_path, const char *out_path, int pages_per_step,
                 store_backup_file_fn on_file, void *user, store_backup_stats *stats, char *err,
                 size_t errlen);

/* ---- experiments and their trials (experiments.c) ---- */

#define STORE_MAX_RUNGS 16

typedef struct store_experiment {
  int64_t seq; /* creation order, for page tokens */
  char id[40];
  char tenant[64];
  char request_id[80]; /* "" when none */
  char display_name[128];
  char *spec_json;   /* the base spec, canonical (owned) */
  char *search_json; /* the search with its defaults (owned) */
  char state[16];    /* RUNNING SUCCEEDED FAILED CANCELLED */
  char *message;     /* owned; why it ended, "" while it runs */
  int64_t create_ms, end_ms;
} store_experiment;
void store_experiment_clear(store_experiment *e); /* frees the owned strings; NULL is a no-op */
void store_experiment_list_free(store_experiment *list, int n);

typedef struct store_trial {
  char experiment[40];
  int index;
  char *values_json;  /* {"path": value}: owned */
  char job_id[40];    /* "" before it starts */
  char job_state[16]; /* its job's state when read; "" without a job */
  char state[16];     /* WAITING RUNNING PROMOTED PAUSED STOPPED DONE FAILED */
  int rung;           /* the rung it trains toward, or the last one it finished */
  int epochs;         /* epochs trained at the end of its last finished rung */
  int n_results;
  double results[STORE_MAX_RUNGS]; /* its metric at the end of each finished rung */
  int64_t planned_memory_bytes;    /* its spec's, planned at create */
} store_trial;
void store_trial_list_free(store_trial *list, int n);

/* Inserts a RUNNING experiment with its trials (each WAITING, with its
 * values_json and planned_memory_bytes) and an EXPERIMENT_CREATED event,
 * in one transaction. With a request_id already used by the tenant,
 * nothing is inserted, *existing (may be NULL) is filled and STORE_EXISTS
 * returned. */
int store_experiment_create(store *s, const store_experiment *e, const store_trial *trials,
                            int n_trials, store_experiment *existing);
int store_experiment_get(store *s, const char *id, store_experiment *out); /* STORE_NOT_FOUND */
/* The tenant's experiment created with request_id (40 bytes); STORE_NOT_FOUND when none. */
int store_experiment_find_request(store *s, const char *tenant, const char *request_id,
                                  char id[40]);
/* A page of experiments, newest first: tenant NULL = all, state NULL =
 * every state, seq < before_seq (0 = from the newest), at most limit. */
int store_experiment_list(store *s, const char *tenant, const char *state, int64_t before_seq,
                          int limit, store_experiment **out, int *n);
/* The ids of every RUNNING experiment, oldest first; *ids malloc'd (free()). */
int store_experiment_running(store *s, char (**ids)[40], int *n);
/* Trials of an experiment with index >= first_index in index order, at
 * most limit (0 = all), each with its job's state. */
int store_trial_list(store *s, const char *experiment, int first_index, int limit,
                     store_trial **out, int *n);
/* The trial whose job is job_id; STORE_NOT_FOUND when the job is no trial. */
int store_trial_of_job(store *s, const char *job_id, store_trial *out);
/* Starts a WAITING trial: inserts job (job->experiment is set to the
 * experiment) and makes the trial RUNNING toward rung 0 with that job,
 * with a TRIAL_CREATED event (message), in one transaction.
 * STORE_CONFLICT when the experiment is no longer RUNNING or the trial no
 * longer WAITING. */
int store_trial_start(store *s, const char *experiment, int index, const store_job *job,
                      const char *message);
/* Promotes a PAUSED trial whose job ended SUCCEEDED: the job's spec
 * becomes spec_json (a larger epoch budget) and it goes back to QUEUED
 * (reason TRIAL_PROMOTED), so the scheduler resumes it from its newest
 * checkpoint; the trial is PROMOTED toward rung; a TRIAL_PROMOTED event.
 * One transaction; STORE_CONFLICT when the experiment is no longer
 * RUNNING, the trial not PAUSED or its job not SUCCEEDED. */
int store_trial_promote(store *s, const char *experiment, int index, const char *spec_json,
                        int rung, const char *message);
/* Moves a trial from `from` to `to` with its epochs trained, appending
 * result (NULL = none) to its rung results, and records an event (reason
 * NULL = none), in one transaction. STORE_CONFLICT when it is not in from. */
int store_trial_update(store *s, const char *experiment, int index, const char *from,
                       const char *to, int epochs, const double *result, const char *reason,
                       const char *message);
/* Ends a RUNNING experiment in state (SUCCEEDED FAILED CANCELLED) with
 * message and an event (reason); STORE_CONFLICT when it already ended. */
int store_experiment_finish(store *s, const char *id, const char *state, const char *reason,
                            const char *message);

typedef struct store_experiment_event {
  int64_t time_ms;
  char reason[48];
  char job_id[40]; /* "" when about the experiment as a whole */
  char *message;   /* owned */
} store_experiment_event;
/* An experiment's events in the order they happened. */
int store_experiment_events(store *s, const char *id, store_experiment_event **out, int *n);
void store_experiment_events_free(store_experiment_event *events, int n);

/* ---- agents and their commands (agents.c) ---- */

/* An agent's states: heard from within its pool's grace window, or not
 * (store_agents_mark_lost); only a registration brings one back. */
#define STORE_AGENT_ONLINE "ONLINE"
#define STORE_AGENT_LOST   "LOST"

typedef struct store_agent {
  int64_t seq; /* registration order, for page tokens */
  char id[32]; /* "agt-" and 16 hex digits, made at the first registration */
  char name[64];
  char hostname[256];
  char pool[32];
  char address[256]; /* where job traffic reaches the host */
  int cpus;
  char *gpus_json; /* [{"index","name","memory_bytes"}...] (owned, never NULL after a read) */
  char version[64];
  char state[16];           /* STORE_AGENT_ONLINE or STORE_AGENT_LOST */
  char token_id[40];        /* the token that registered it last: only it polls as this agent */
  int64_t last_command_seq; /* the highest seq handed out; 0 = none yet */
  int64_t last_seen_ms, create_ms;
} store_agent;
/* Frees an agent's owned strings (not the struct); NULL is a no-op. */
void store_agent_clear(store_agent *a);
void store_agent_list_free(store_agent *list, int n);

/* Registers the agent a->name: a new name gets a new row (and id); a known
 * one is the same agent, its id, create_ms and commands kept, its other
 * fields replaced, back ONLINE. Either way last_seen_ms = now_ms (0 =
 * now). Reads name, hostname, pool, address, cpus, gpus_json (NULL = "[]"),
 * version and token_id. out (may be NULL) gets the row; *created (may be
 * NULL) 1 for a new agent. One transaction. A known name registered with
 * another token_id is STORE_CONFLICT while it is ONLINE (nothing changes);
 * once LOST it moves to the new token. */
int store_agent_register(store *s, const store_agent *a, int64_t now_ms, store_agent *out,
                         int *created);
/* The agent with this id, else with this name; STORE_NOT_FOUND when none. */
int store_agent_get(store *s, const char *id_or_name, store_agent *out);
/* A page of agents in registration order. */
typedef struct store_agent_query {
  const char *pool;  /* NULL = every pool */
  const char *state; /* NULL = every state */
  int64_t after_seq; /* 0 = from the first; else the last seq of the previous page */
  int limit;         /* >= 1 */
} store_agent_query;
/* *out malloc'd (store_agent_list_free), NULL when *n is 0. */
int store_agent_list(store *s, const store_agent_query *q, store_agent **out, int *n);
/* Records that the agent was heard from at now_ms (0 = now). Only an
 * ONLINE agent: a LOST one is STORE_CONFLICT (it must register again),
 * an unknown one STORE_NOT_FOUND. */
int store_agent_touch(store *s, const char *id, int64_t now_ms);
/* The loss check, for the scheduler's pass: every ONLINE agent (of pool;
 * NULL = every pool) last heard from more than grace_s seconds before
 * now_ms becomes LOST, in one transaction. *lost (may be NULL; malloc'd,
 * store_agent_list_free) gets those agents as they are now, and *n how
 * many; an agent already LOST is never returned again. */
int store_agents_mark_lost(store *s, int64_t now_ms, int grace_s, const char *pool,
                           store_agent **lost, int *n);

typedef struct store_command {
  char agent_id[32];
  int64_t seq;        /* 1, 2, ... per agent, never reused */
  char kind[16];      /* "start", "signal", "drop", "exec" */
  char *payload_json; /* a JSON object (owned) */
  int64_t create_ms;
  int64_t done_ms;   /* 0 while not done */
  int ok;            /* when done: what the agent said */
  char *result_json; /* when done: the agent's report, a JSON object (owned); else NULL */
} store_command;
void store_command_clear(store_command *c); /* NULL is a no-op */
void store_command_list_free(store_command *list, int n);

/* Queues a command for the agent: its seq (the agent's next) in *seq (may
 * be NULL). payload_json must be a JSON object (NULL = "{}"); kind 1-15
 * characters. STORE_NOT_FOUND for an unknown agent. One transaction. */
int store_command_enqueue(store *s, const char *agent_id, const char *kind,
                          const char *payload_json, int64_t *seq);
/* The agent's commands with seq > after_seq, in seq order, at most limit
 * (0 = all); pending_only: only those not yet done (what a poll
 * delivers). *out malloc'd (store_command_list_free), NULL when *n is 0. */
int store_command_list(store *s, const char *agent_id, int64_t after_seq, int pending_only,
                       int limit, store_command **out, int *n);
int store_command_get(store *s, const char *agent_id, int64_t seq,
                      store_command *out); /* STORE_NOT_FOUND */
/* Records the agent's report on a command: done now (now_ms; 0 = now) with
 * ok and result_json (a JSON object; NULL = "{}"). Idempotent: a command
 * already done keeps its first report and *newly (may be NULL) is 0.
 * STORE_NOT_FOUND when the agent has no such command. */
int store_command_done(store *s, const char *agent_id, int64_t seq, int ok, const char *result_json,
                       int64_t now_ms, int *newly);

/* ---- allocations: an attempt of a job on remote hosts (allocations.c) ---- */

#define STORE_ALLOC_STARTING  "STARTING"
#define STORE_ALLOC_RUNNING   "RUNNING"
#define STORE_ALLOC_ENDED     "ENDED"
#define STORE_ALLOC_MAX_HOSTS 64

typedef struct store_alloc_host {
  char agent_id[32];
  char name[64];     /* the agent's name */
  char address[256]; /* where its ranks reach it */
  int rank_first, ranks;
  char cores[256]; /* "0,1": the host's devices it uses */
} store_alloc_host;

typedef struct store_allocation {
  char id[40]; /* "alloc-" and 16 hex digits */
  char job_id[40];
  int attempt;
  char pool[32];
  char state[12];  /* STORE_ALLOC_* */
  char reason[48]; /* why it ended: COMPLETED, AGENT_LOST, START_TIMEOUT, ... */
  int64_t create_ms, end_ms;
  int n_hosts;
  store_alloc_host *hosts; /* (n_hosts) in rank order, owned */
} store_allocation;
void store_allocation_clear(store_allocation *a); /* frees hosts; NULL is a no-op */
void store_allocation_list_free(store_allocation *list, int n);
/* Records a new allocation (state a->state, "" = STARTING) with its hosts
 * and the hex SHA-256 of its token, in one transaction. */
int store_allocation_add(store *s, const store_allocation *a, const char *token_sha256);
/* By id, or by its token's hash; STORE_NOT_FOUND when none. */
int store_allocation_get(store *s, const char *id, store_allocation *out);
int store_allocation_by_token(store *s, const char *token_sha256, store_allocation *out);
/* Every allocation not ENDED (with a host on agent_id; NULL = any), oldest
 * first. *out malloc'd (store_allocation_list_free). */
int store_allocations_unended(store *s, const char *agent_id, store_allocation **out, int *n);
/* STARTING -> RUNNING (its first progress line came); no-op otherwise. */
int store_allocation_running(store *s, const char *id);
/* Ends the allocation for reason; with drop, a `drop` command goes to each
 * of its hosts but except_agent (NULL = all) in the same transaction.
 * *ended (may be NULL) 0 when it had ended already (nothing done). */
int store_allocation_end(store *s, const char *id, const char *reason, const char *except_agent,
                         int drop, int *ended);
/* A relay: an Open MPI daemon an allocation's host runs, as command seq of
 * agent_id. */
int store_relay_add(store *s, const char *id, const char *alloc_id, const char *agent_id,
                    int64_t seq);
/* STORE_NOT_FOUND unless the relay is the allocation's. */
int store_relay_get(store *s, const char *alloc_id, const char *id, char agent_id[32],
                    int64_t *seq);

#endif
