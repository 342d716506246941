/* slurm_run.c — one attempt of a job on a Slurm pool. The runner thread
 * records an allocation (id, token) as for a pool of agents, writes the
 * token beside the job's spec, submits a batch script that runs `kiln-agent
 * job` around kiln-train (mpirun -np N for several processes) and keeps
 * the job STARTING while Slurm has it PENDING. Once the batch job runs, the
 * pump reads the progress lines kiln-agent posts (through the allocation's
 * pipe, as remote.c's), stopping it with scancel; a watcher thread polls
 * Slurm meanwhile and ends the pump when Slurm ends the batch job without
 * kiln-agent's exit (a node that fails, a time limit, scancel on the
 * cluster). The end: Slurm's state where it is the cluster's doing (a
 * requeue for NODE_FAIL or PREEMPTED, not counted against max_restarts;
 * TIMEOUT, OUT_OF_MEMORY, an outside CANCELLED), else the exit status.
 *
 * The job's folder (spec, token, checkpoints, train.log) must be at the
 * same path on the nodes, as Slurm's output files are; the data set is
 * read from kilnd's datasets folder at its path too.
 *
 * Threads: the runner thread owns the run; the watcher shares only
 * `follow` (its lock) and the pipe entry (remote_lock). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "sched_internal.h"
#include "slurm.h"

#define SLURM_CMD_MS       15000 /* one sbatch, squeue, sacct or scancel */
#define SLURM_EXIT_WAIT_MS 10000 /* how long kiln-agent's exit may lag Slurm's end */

/* How often Slurm is asked about a batch job: sched_config.slurm_poll_ms,
 * default 1 s. */
static int poll_ms(const sched *s) {
  return s->cfg.slurm_poll_ms > 0 ? s->cfg.slurm_poll_ms : 1000;
}

/* What the watcher thread and the runner thread share. */
typedef struct follow {
  pthread_mutex_t lock; /* guards the fields below */
  int stop;             /* the runner no longer needs the watcher */
  int ended;            /* Slurm ended the batch job: status holds how */
  sched_slurm_status status;
  /* fixed before the watcher starts */
  sched *s;
  const char *job_id; /* kiln's */
  char slurm_id[32];  /* Slurm's */
  sched_remote_entry *entry;
  int last_signal; /* the runner's: scancel is sent once per signal */
} follow;

static int flag(sched *s, const int *f) {
  pthread_mutex_lock(&s->wake_lock);
  int v = *f;
  pthread_mutex_unlock(&s->wake_lock);
  return v;
}

static int terminal(const sched_slurm_status *st) {
  return st->info && st->info->outcome != SCHED_SLURM_WAITING &&
         st->info->outcome != SCHED_SLURM_ACTIVE;
}

/* Whether kiln-agent posted the attempt's exit. */
static int exit_posted(sched *s, const sched_remote_entry *e) {
  pthread_mutex_lock(&s->remote_lock);
  int exited = e->exited;
  pthread_mutex_unlock(&s->remote_lock);
  return exited;
}

/* Ends the pump: nothing more comes through the pipe. */
static void close_pipe(sched *s, sched_remote_entry *e) {
  pthread_mutex_lock(&s->remote_lock);
  if (e->write_fd >= 0) close(e->write_fd);
  e->write_fd = -1;
  pthread_mutex_unlock(&s->remote_lock);
}

static void *watch_main(void *arg) {
  follow *f = arg;
  char err[512];
  int64_t ended_at = 0;
  for (;;) {
    pthread_mutex_lock(&f->lock);
    int stop = f->stop, ended = f->ended;
    pthread_mutex_unlock(&f->lock);
    if (stop) break;
    if (!ended) {
      sched_slurm_status st;
      int rc = sched_slurm_poll(f->slurm_id, SLURM_CMD_MS, &st, err, sizeof err);
      if (rc < 0)
        sched_slog(f->s, SCHED_LOG_WARN,
                   "msg=\"cannot follow the batch job\" job=%s slurm_job=%s "
                   "error=\"%s\"",
                   f->job_id, f->slurm_id, err);
      if (rc == 1 && terminal(&st)) {
        pthread_mutex_lock(&f->lock);
        f->status = st;
        f->ended = 1;
        pthread_mutex_unlock(&f->lock);
        ended_at = sched_monotonic_ms();
      }
    } else if (exit_posted(f->s, f->entry) ||
               sched_monotonic_ms() - ended_at > SLURM_EXIT_WAIT_MS) {
      /* kiln-agent's exit came (the pump ends by itself), or will not. */
      close_pipe(f->s, f->entry);
      break;
    }
    usleep(ended ? 100 * 1000 : (useconds_t)poll_ms(f->s) * 1000);
  }
  return NULL;
}

/* The pump's way to stop the batch job: scancel (SIGTERM to its processes,
 * so kiln-train checkpoints; Slurm's KillWait later SIGKILL). */
static void cancel_batch_job(void *ctx, int sig) {
  follow *f = ctx;
  if (f->last_signal == sig || f->last_signal == SIGKILL) return;
  f->last_signal = sig;
  char err[512];
  if (sched_slurm_cancel(f->slurm_id, SLURM_CMD_MS, err, sizeof err) < 0)
    sched_slog(f->s, SCHED_LOG_ERROR, "msg=\"scancel failed\" job=%s slurm_job=%s error=\"%s\"",
               f->job_id, f->slurm_id, err);
}

/* Polls until Slurm says the batch job runs (1) or ended (0, *st says
 * how: it may have run whole between two polls), or the job must stop first (-1: *why is
 * PUMP_CANCELLED, PUMP_SHUTDOWN or PUMP_PREEMPTED). */
static int wait_until_running(sched *s, slot_run *slot, follow *f, sched_slurm_status *st,
                              int *why) {
  char err[512], last[sizeof st->reason] = "";
  for (;;) {
    *why = sched_is_stopping(s)      ? PUMP_SHUTDOWN
           : flag(s, &slot->cancel)  ? PUMP_CANCELLED
           : flag(s, &slot->preempt) ? PUMP_PREEMPTED
                                     : PUMP_ENDED;
    if (*why != PUMP_ENDED) return -1;
    int rc = sched_slurm_poll(f->slurm_id, SLURM_CMD_MS, st, err, sizeof err);
    if (rc < 0)
      sched_slog(s, SCHED_LOG_WARN,
                 "msg=\"cannot follow the batch job\" job=%s slurm_job=%s "
                 "error=\"%s\"",
                 slot->job.id, f->slurm_id, err);
    if (rc == 1 && st->info) {
      if (st->info->outcome == SCHED_SLURM_ACTIVE) return 1;
      if (terminal(st)) return 0;
      if (strcmp(last, st->reason) != 0) {
        snprintf(last, sizeof last, "%s", st->reason);
        sched_slog(s, SCHED_LOG_INFO, "job=%s slurm_job=%s slurm_state=%s slurm_reason=%s",
                   slot->job.id, f->slurm_id, st->state, st->reason);
      }
    }
    usleep((useconds_t)poll_ms(s) * 1000);
  }
}

/* Slurm's final word on the batch job, waiting for it a while after
 * kiln-agent's exit (the batch script ends a moment later). */
static void final_status(follow *f, sched_slurm_status *st) {
  pthread_mutex_lock(&f->lock);
  int ended = f->ended;
  if (ended) *st = f->status;
  pthread_mutex_unlock(&f->lock);
  if (ended) return;
  char err[512];
  int64_t give_up = sched_monotonic_ms() + 30000;
  while (sched_monotonic_ms() < give_up) {
    if (sched_slurm_poll(f->slurm_id, SLURM_CMD_MS, st, err, sizeof err) == 1 && terminal(st))
      return;
    usleep(250 * 1000);
  }
  memset(st, 0, sizeof *st);
}

/* The trainer's command inside the batch job: kiln-train with its progress
 * on fd 3, or (several processes, under mpirun) as --json on stdout. */
static void trainer_command(const sched *s, int processes, char *spec, char *ckpt, char *resume,
                            char **argv) {
  int n = 0;
  argv[n++] = (char *)s->cfg.trainer_path;
  argv[n++] = "--spec";
  argv[n++] = spec;
  if (processes > 1) {
    argv[n++] = "--json";
  } else {
    argv[n++] = "--progress-fd";
    argv[n++] = "3";
  }
  argv[n++] = "--data-dir";
  argv[n++] = (char *)s->cfg.datasets_dir;
  argv[n++] = "--checkpoint-dir";
  argv[n++] = ckpt;
  if (resume) {
    argv[n++] = "--resume";
    argv[n++] = resume;
  }
  argv[n] = NULL;
}

/* The allocation and its token, written owner-only to token_path. */
static int make_allocation(sched *s, const slot_run *slot, int processes, const char *token_path,
                           store_allocation *a, char *msg, size_t len) {
  const sched_pool *pool = &s->pools[slot->pool];
  char token[80] = "kiln_a_", hash[65];
  memset(a, 0, sizeof *a);
  snprintf(a->id, sizeof a->id, "alloc-");
  if (sched_random_hex(a->id + 6, 8) != 0 || sched_random_hex(token + 7, 32) != 0) {
    snprintf(msg, len, "cannot read random bytes for an allocation");
    return -1;
  }
  kc_sha256_hex_of(token, strlen(token), hash);
  snprintf(a->job_id, sizeof a->job_id, "%s", slot->job.id);
  a->attempt = slot->job.attempt;
  snprintf(a->pool, sizeof a->pool, "%s", pool->name);
  /* Its one host is the Slurm partition: Slurm picks the nodes. */
  store_alloc_host host;
  memset(&host, 0, sizeof host);
  snprintf(host.agent_id, sizeof host.agent_id, "slurm");
  snprintf(host.name, sizeof host.name, "slurm:%.57s", pool->partition);
  snprintf(host.address, sizeof host.address, "%s", pool->partition);
  host.ranks = processes;
  a->n_hosts = 1;
  a->hosts = &host;
  int fd = open(token_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  int wrote = fd >= 0 && write(fd, token, strlen(token)) == (ssize_t)strlen(token);
  if (fd >= 0 && close(fd) != 0) wrote = 0;
  memset(token, 0, sizeof token);
  if (!wrote) {
    snprintf(msg, len, "cannot write the allocation's token file: %s", strerror(errno));
    unlink(token_path);
    return -1;
  }
  int rc = store_allocation_add(s->st, a, hash);
  a->hosts = NULL;
  a->n_hosts = 0;
  if (rc != STORE_OK) {
    snprintf(msg, len, "cannot record the allocation: %s", store_errmsg(s->st));
    unlink(token_path);
    return -1;
  }
  return 0;
}

/* Ends the attempt from how the pump stopped, Slurm's final state and the
 * exit kiln-agent posted (exited, status). */
static void conclude(sched *s, slot_run *slot, run *r, const job_limits *limits, int stopped,
                     const sched_slurm_status *st, int exited, int status, const char *slurm_id) {
  const store_job *job = &slot->job;
  const sched_slurm_state_info *info = st->info;
  char msg[1024];
  if (stopped == PUMP_ENDED && info && info->outcome == SCHED_SLURM_REQUEUE) {
    snprintf(msg, sizeof msg,
             "Slurm batch job %s ended %s: %s; the job resumes from its newest checkpoint",
             slurm_id, st->state, info->says);
    sched_requeue(s, job, NULL, NULL, NULL, info->reason, msg);
    return;
  }
  if (stopped == PUMP_ENDED && info &&
      (info->outcome == SCHED_SLURM_CANCELLED ||
       (info->outcome == SCHED_SLURM_FAILED && strcmp(info->reason, "TRAINER_EXITED") != 0))) {
    snprintf(msg, sizeof msg, "Slurm batch job %s ended %s: %s", slurm_id, st->state, info->says);
    sched_finish(s, job, info->kiln_state, info->reason, msg);
    return;
  }
  if (!exited) /* kiln-agent never said: Slurm's exit code, else a kill */
    status = info && info->outcome != SCHED_SLURM_UNKNOWN
                 ? (st->signal ? (st->signal & 0x7f) : (st->exit_code & 0xff) << 8)
                 : (SIGKILL & 0x7f);
  sched_conclude(s, slot, r, limits, stopped, status, "", "its Slurm allocation");
}

void sched_run_slurm(sched *s, slot_run *slot) {
  const store_job *job = &slot->job;
  const sched_pool *pool = &s->pools[slot->pool];
  job_limits limits = sched_job_limits(job);
  const int processes = limits.workers > 0 ? limits.workers : 1;
  char dir[4096], spec[4200], ckpt[4200], log_path[4200], token_path[4200], script_name[64];
  char msg[8192];
  snprintf(dir, sizeof dir, "%s/%s", s->cfg.jobs_dir, job->id);
  snprintf(spec, sizeof spec, "%s/spec.json", dir);
  snprintf(ckpt, sizeof ckpt, "%s/checkpoints", dir);
  snprintf(log_path, sizeof log_path, "%s/train.log", dir);
  snprintf(script_name, sizeof script_name, "slurm-attempt-%d.sh", job->attempt);

  store_allocation a;
  snprintf(token_path, sizeof token_path, "%s/allocation-%d.token", dir, job->attempt);
  if (make_allocation(s, slot, processes, token_path, &a, msg, sizeof msg) != 0) {
    sched_requeue(s, job, NULL, NULL, NULL, "SCHEDULER_BUSY", msg);
    return;
  }
  int fds[2];
  if (pipe(fds) != 0) {
    snprintf(msg, sizeof msg, "cannot create the progress pipe: %s", strerror(errno));
    store_allocation_end(s->st, a.id, "INTERNAL", NULL, 0, NULL);
    unlink(token_path);
    sched_finish(s, job, "FAILED", "INTERNAL", msg);
    return;
  }
  fcntl(fds[0], F_SETFD, FD_CLOEXEC);
  fcntl(fds[1], F_SETFD, FD_CLOEXEC);
  sched_remote_entry entry = {.write_fd = fds[1]};
  snprintf(entry.alloc_id, sizeof entry.alloc_id, "%s", a.id);
  sched_remote_entry_add(s, &entry);

  char resume_path[600], script[16384];
  int64_t resume_step = 0;
  int resuming = sched_resume_point(s, job, resume_path, sizeof resume_path, &resume_step);
  char *argv[16];
  trainer_command(s, processes, spec, ckpt, resuming ? resume_path : NULL, argv);
  sched_slurm_script_req sr = {.agent_path = s->cfg.agent_path ? s->cfg.agent_path : "kiln-agent",
                               .server_url = pool->kilnd_url,
                               .alloc_id = a.id,
                               .token_file = token_path,
                               .mpirun_path = s->cfg.mpirun_path,
                               .processes = processes,
                               .allow_run_as_root = geteuid() == 0,
                               .trainer_argv = argv};
  follow f = {.s = s, .job_id = job->id, .entry = &entry};
  pthread_mutex_init(&f.lock, NULL);
  int submitted = -1;
  if (sched_slurm_script(&sr, script, sizeof script) != 0) {
    snprintf(msg, sizeof msg, "the batch script is longer than %zu bytes", sizeof script);
  } else {
    const int per_node = pool->cpus_per_node > 0 ? pool->cpus_per_node : 1;
    int nodes = (slot->n_slots + per_node - 1) / per_node;
    /* A GPU pool's devices are GPUs: Slurm hands them out (--gpus), and
     * each process takes a core. */
    const int gpu = strcmp(pool->device_type, "gpu") == 0;
    sched_slurm_submit_req req = {
        .partition = pool->partition,
        .nodes = nodes < 1 ? 1 : nodes,
        .ntasks = processes,
        .cpus_per_task = !gpu && slot->n_slots > processes ? slot->n_slots / processes : 1,
        .gpus = gpu ? slot->n_slots : 0,
        .job_name = job->id,
        .work_dir = dir,
        .output = log_path,
        .script_name = script_name,
        .script = script,
        .timeout_ms = SLURM_CMD_MS};
    submitted = sched_slurm_submit(&req, f.slurm_id, sizeof f.slurm_id, msg, sizeof msg);
  }
  if (submitted != 0) {
    sched_remote_entry_remove(s, &entry);
    close(fds[0]);
    store_allocation_end(s->st, a.id, "START_FAILED", NULL, 0, NULL);
    unlink(token_path);
    pthread_mutex_destroy(&f.lock);
    sched_fail_or_retry(s, job, &limits, "SLURM_SUBMIT_FAILED", msg);
    return;
  }
  snprintf(msg, sizeof msg, "Slurm batch job %s in partition %s (allocation %s, attempt %d)%s",
           f.slurm_id, pool->partition, a.id, job->attempt, processes > 1 ? ", under mpirun" : "");
  store_job_note(s->st, job->id, "SLURM_SUBMITTED", msg);
  sched_slog(s, SCHED_LOG_INFO, "job=%s slurm_job=%s alloc=%s partition=%s processes=%d", job->id,
             f.slurm_id, a.id, pool->partition, processes);

  run *r = calloc(1, sizeof *r);
  sched_slurm_status st;
  memset(&st, 0, sizeof st);
  int why = PUMP_ENDED;
  int running = r ? wait_until_running(s, slot, &f, &st, &why) : -1;
  int stopped = why;
  /* Running, or already ended (it ran whole between two polls): either
   * way its progress may be in the pipe, and the job ran. */
  if (running >= 0) {
    if (resuming)
      snprintf(msg, sizeof msg,
               "Slurm batch job %s started (allocation %s, attempt %d), resuming from step %lld, "
               "on pool %s",
               f.slurm_id, a.id, job->attempt, (long long)resume_step, pool->name);
    else
      snprintf(msg, sizeof msg, "Slurm batch job %s started (allocation %s, attempt %d) on pool %s",
               f.slurm_id, a.id, job->attempt, pool->name);
    if (store_job_transition(s->st, job->id, "STARTING", "RUNNING", "STARTED", msg) != STORE_OK)
      sched_slog(s, SCHED_LOG_ERROR, "msg=\"state not recorded\" job=%s error=\"%s\"", job->id,
                 store_errmsg(s->st));
    sched_run_init(r, s, slot, &limits);
    r->remote = 1;
    snprintf(r->alloc_id, sizeof r->alloc_id, "%s", a.id);
    pthread_t watcher;
    int watching = pthread_create(&watcher, NULL, watch_main, &f) == 0;
    if (!watching) close_pipe(s, &entry); /* unfollowable: end at once, as a kill */
    stopped = sched_pump(r, fds[0], cancel_batch_job, &f);
    pthread_mutex_lock(&f.lock);
    f.stop = 1;
    pthread_mutex_unlock(&f.lock);
    if (watching) pthread_join(watcher, NULL);
  } else if (running < 0) { /* stopped while Slurm still had it pending */
    cancel_batch_job(&f, SIGTERM);
  }
  /* The read end first, as remote.c does: a request still writing gets
   * EPIPE rather than holding remote_lock on a full pipe. */
  close(fds[0]);
  sched_remote_entry_remove(s, &entry);
  final_status(&f, &st);
  const char *reason = stopped == PUMP_CANCELLED  ? "CANCELLED"
                       : stopped == PUMP_SHUTDOWN ? "SERVER_SHUTDOWN"
                       : entry.exited             ? "EXITED"
                       : st.info                  ? st.info->name
                                                  : "STOPPED";
  if (store_allocation_end(s->st, a.id, reason, NULL, 0, NULL) != STORE_OK)
    sched_slog(s, SCHED_LOG_ERROR, "msg=\"allocation end not recorded\" alloc=%s error=\"%s\"",
               a.id, store_errmsg(s->st));
  unlink(token_path);
  sched_slog(s, SCHED_LOG_INFO, "job=%s slurm_job=%s slurm_state=%s exit_posted=%d", job->id,
             f.slurm_id, st.state[0] ? st.state : "unknown", entry.exited);
  if (!r) {
    sched_finish(s, job, "FAILED", "INTERNAL", "out of memory while following the batch job");
  } else if (running < 0 && stopped == PUMP_CANCELLED) {
    sched_finish(s, job, "CANCELLED", "CANCELLED",
                 "cancelled by a client while Slurm had it pending; the batch job was cancelled");
  } else {
    r->s = s;
    r->slot = slot;
    r->job = job;
    conclude(s, slot, r, &limits, stopped, &st, entry.exited, entry.status, f.slurm_id);
  }
  pthread_mutex_destroy(&f.lock);
  free(r);
}

void sched_slurm_recover(sched *s, const store_allocation *a) {
  char name[64], err[512], out[1024];
  snprintf(name, sizeof name, "--name=%s", a->job_id);
  /* its attempt's batch jobs, by their name: the kiln job's id */
  char *argv[] = {"scancel", "--verbose", name, NULL};
  int rc = sched_slurm_command(argv, SLURM_CMD_MS, out, sizeof out, err, sizeof err);
  if (rc != 0)
    sched_slog(s, SCHED_LOG_WARN,
               "msg=\"cannot cancel a previous kilnd's batch job\" job=%s alloc=%s error=\"%s\"",
               a->job_id, a->id, err);
  else
    sched_slog(s, SCHED_LOG_WARN,
               "msg=\"batch jobs of a previous kilnd's allocation cancelled\" job=%s alloc=%s",
               a->job_id, a->id);
}
