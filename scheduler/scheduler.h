/* scheduler.h — kiln's scheduler: takes queued jobs from the store one at a
 * time, runs each in its own kiln-train process on the local CPU, streams
 * its progress lines into the store, and records how it ended.
 * Prefix sched_. */
#ifndef KILN_SCHEDULER_H
#define KILN_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

typedef struct sched sched;

typedef enum sched_log_level {
  SCHED_LOG_DEBUG = 0,
  SCHED_LOG_INFO,
  SCHED_LOG_WARN,
  SCHED_LOG_ERROR
} sched_log_level;
/* Receives one log line (key=value fields, no newline). */
typedef void (*sched_log_fn)(sched_log_level level, const char *line, void *user);

typedef struct sched_config {
  const char *db_path;      /* the SQLite file; the scheduler opens its own handle */
  const char *jobs_dir;     /* one folder per job: spec, log, checkpoints */
  const char *trainer_path; /* the kiln-train binary */
  const char *datasets_dir; /* passed to kiln-train */
  /* A multi_worker job's kiln-train runs under mpirun -np workers, rank 0's
   * progress lines on mpirun's standard output; NULL = "mpirun" on PATH. */
  const char *mpirun_path;
  int flush_interval_ms; /* metric lines are written at most this late (default 250) */
  int poll_interval_ms;  /* how often the queue is looked at without a wake (default 1000) */
  /* Preemption: a queued job of higher priority than the running one stops
   * it (SIGTERM, so kiln-train checkpoints first); the stopped job goes
   * PREEMPTED, then back to QUEUED, and resumes from that checkpoint. */
  int preempt;
  sched_log_fn log; /* may be NULL */
  void *log_user;
} sched_config;

/* Opens the store, re-queues jobs a previous run left unfinished, and starts
 * the scheduler thread. */
int sched_start(const sched_config *cfg, sched **out, char *err, size_t errlen);
/* Tells the scheduler a job was queued, so it need not wait for its poll. */
void sched_wake(sched *s);
/* Asks the scheduler to cancel job_id if it is the one starting or running:
 * it goes STOPPING, kiln-train gets SIGTERM (SIGKILL after a grace period)
 * and the job ends CANCELLED. A queued job is cancelled in the store by the
 * caller instead; a request for a job that is not running is forgotten once
 * another job starts. */
void sched_cancel(sched *s, const char *job_id);

typedef struct sched_stats {
  char running_job[40];     /* "" when idle */
  int devices_busy;         /* devices the running job holds */
  int devices_total;        /* CPU slots this scheduler hands out */
  uint64_t points_ingested; /* metric points written since start */
  uint64_t jobs_started;    /* trainer processes started since start */
} sched_stats;
void sched_get_stats(sched *s, sched_stats *out);

/* Stops the thread. A running job's trainer gets SIGTERM (then SIGKILL after
 * a grace period) and the job goes back to QUEUED, to run again on the next
 * start. NULL is a no-op. */
void sched_stop(sched *s);

#endif
