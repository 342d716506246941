/* remote.c — pools of agents: the hosts a pass sees (ONLINE agents, what
 * of them runs hold), agents found LOST, placing a run on hosts, and a
 * runner's attempt there: its allocation (id, token, hosts) recorded,
 * `start` commands queued to the hosts' agents, progress lines that HTTP
 * requests write into a pipe pumped as a local trainer's are, `signal`
 * commands to stop it, and its end from the exit the agent posts.
 *
 * Threads: sched_agents_refresh and sched_remote_place run on the
 * scheduler thread (s->hosts is its own; the pools' host counts and the
 * runs' hosts are read by others under wake_lock); sched_run_remote on a
 * runner thread; sched_remote_progress / _exit on HTTP threads. The pipes
 * (s->remotes) are guarded by remote_lock, which is never held while
 * taking wake_lock. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "common.h"
#include "sched_internal.h"
#include "slurm.h"

/* ---- hosts ---- */

/* An agent's devices of the pool's type: its cores, or its GPUs. */
static int agent_devices(const sched_pool *pool, const store_agent *a) {
  int n = a->cpus;
  if (strcmp(pool->device_type, "gpu") == 0) {
    json_t *gpus = json_loads(a->gpus_json ? a->gpus_json : "[]", 0, NULL);
    n = json_is_array(gpus) ? (int)json_array_size(gpus) : 0;
    json_decref(gpus);
  }
  return n < 0 ? 0 : n > SCHED_MAX_DEVICES ? SCHED_MAX_DEVICES : n;
}

/* Marks the devices of agent_id that runs hold; wake_lock held. Returns
 * how many. */
static int held_on(const sched *s, const char *agent_id, unsigned char held[SCHED_MAX_DEVICES]) {
  memset(held, 0, SCHED_MAX_DEVICES);
  int n = 0;
  for (int i = 0; i < s->n_runs; i++) {
    const slot_run *slot = s->runs[i];
    for (int h = 0; h < slot->n_hosts; h++) {
      if (strcmp(slot->hosts[h].agent_id, agent_id) != 0) continue;
      for (int c = 0; c < slot->hosts[h].n_cores; c++) {
        int d = slot->hosts[h].cores[c];
        if (d >= 0 && d < SCHED_MAX_DEVICES && !held[d]) {
          held[d] = 1;
          n++;
        }
      }
    }
  }
  return n;
}

/* Tells the runs with a host on the lost agent; ends allocations no run
 * holds (none should: a restart ends them first). */
static void agent_lost(sched *s, const store_agent *a) {
  int runs = 0;
  pthread_mutex_lock(&s->wake_lock);
  for (int i = 0; i < s->n_runs; i++) {
    slot_run *slot = s->runs[i];
    for (int h = 0; h < slot->n_hosts; h++) {
      if (strcmp(slot->hosts[h].agent_id, a->id) != 0 || slot->lost) continue;
      slot->lost = 1;
      snprintf(slot->lost_agent, sizeof slot->lost_agent, "%s", a->name);
      snprintf(slot->lost_agent_id, sizeof slot->lost_agent_id, "%s", a->id);
      runs++;
    }
  }
  pthread_mutex_unlock(&s->wake_lock);
  sched_slog(s, SCHED_LOG_WARN, "msg=\"agent lost\" agent=%s name=%s pool=%s runs=%d", a->id,
             a->name, a->pool, runs);
}

void sched_agents_refresh(sched *s) {
  const int64_t now = store_now_ms();
  for (int k = 0; k < s->n_pools; k++) {
    sched_pool *pool = &s->pools[k];
    if (pool->kind != SCHED_POOL_AGENTS) continue;
    store_agent *lost = NULL;
    int n_lost = 0;
    if (store_agents_mark_lost(s->st, now, pool->grace_s, pool->name, &lost, &n_lost) != STORE_OK)
      sched_slog(s, SCHED_LOG_ERROR, "msg=\"cannot check agents\" pool=%s error=\"%s\"", pool->name,
                 store_errmsg(s->st));
    for (int i = 0; i < n_lost; i++) agent_lost(s, &lost[i]);
    store_agent_list_free(lost, n_lost);
    store_agent *agents = NULL;
    int n = 0;
    store_agent_query q = {
        .pool = pool->name, .state = STORE_AGENT_ONLINE, .limit = SCHED_MAX_HOSTS};
    if (store_agent_list(s->st, &q, &agents, &n) != STORE_OK) {
      sched_slog(s, SCHED_LOG_ERROR, "msg=\"cannot read agents\" pool=%s error=\"%s\"", pool->name,
                 store_errmsg(s->st));
      continue; /* the hosts of the last pass stand */
    }
    int totals[SCHED_MAX_HOSTS];
    for (int i = 0; i < n; i++) {
      sched_host *h = &s->hosts[k][i];
      snprintf(h->agent_id, sizeof h->agent_id, "%s", agents[i].id);
      snprintf(h->name, sizeof h->name, "%s", agents[i].name);
      snprintf(h->address, sizeof h->address, "%s", agents[i].address);
      h->n_devices = totals[i] = agent_devices(pool, &agents[i]);
    }
    store_agent_list_free(agents, n);
    pthread_mutex_lock(&s->wake_lock);
    pool->n_hosts = n;
    pool->n_devices = 0;
    for (int i = 0; i < n; i++) {
      unsigned char held[SCHED_MAX_DEVICES];
      int busy = held_on(s, s->hosts[k][i].agent_id, held);
      pool->host_total[i] = totals[i];
      pool->host_free[i] = totals[i] > busy ? totals[i] - busy : 0;
      pool->n_devices += totals[i];
    }
    pthread_mutex_unlock(&s->wake_lock);
  }
}

int sched_job_spreads(sched *s, const char *job_id) {
  store_job job;
  if (store_job_get(s->st, job_id, &job) != STORE_OK) return 0;
  int spread = 0;
  api_job_spec *spec = malloc(sizeof *spec);
  api_error e;
  if (spec && job.spec_json && api_spec_parse(job.spec_json, strlen(job.spec_json), spec, &e) == 0)
    spread = spec->strategy == API_STRATEGY_MULTI_WORKER ||
             spec->strategy == API_STRATEGY_PARAMETER_SERVER;
  free(spec);
  store_job_clear(&job);
  return spread;
}

int sched_remote_place(sched *s, slot_run *slot, int spread) {
  const int k = slot->pool;
  sched_pool *pool = &s->pools[k];
  int take[SCHED_MAX_HOSTS];
  const int devices = slot->n_slots;
  pthread_mutex_lock(&s->wake_lock);
  int n_hosts = sched_hosts_pick(pool->n_hosts, pool->host_free, devices, spread, take);
  sched_remote_host *hosts = n_hosts > 0 ? calloc((size_t)n_hosts, sizeof *hosts) : NULL;
  int placed = 0;
  for (int h = 0; hosts && h < pool->n_hosts; h++) {
    if (!take[h]) continue;
    sched_remote_host *rh = &hosts[placed++];
    const sched_host *host = &s->hosts[k][h];
    snprintf(rh->agent_id, sizeof rh->agent_id, "%s", host->agent_id);
    snprintf(rh->name, sizeof rh->name, "%s", host->name);
    snprintf(rh->address, sizeof rh->address, "%s", host->address);
    unsigned char held[SCHED_MAX_DEVICES];
    held_on(s, host->agent_id, held);
    for (int d = 0; d < host->n_devices && rh->n_cores < take[h]; d++)
      if (!held[d]) rh->cores[rh->n_cores++] = d;
    pool->host_free[h] -= take[h];
  }
  slot->hosts = hosts;
  slot->n_hosts = hosts ? placed : 0;
  pthread_mutex_unlock(&s->wake_lock);
  return slot->n_hosts > 0 ? 0 : -1;
}

/* ---- the progress pipes ---- */

static sched_remote_entry *entry_find(sched *s, const char *alloc_id) {
  for (sched_remote_entry *e = s->remotes; e; e = e->next)
    if (strcmp(e->alloc_id, alloc_id) == 0) return e;
  return NULL;
}

int sched_remote_progress(sched *s, const char *alloc_id, const char *data, size_t len) {
  if (!s) return -1;
  pthread_mutex_lock(&s->remote_lock);
  sched_remote_entry *e = entry_find(s, alloc_id);
  int rc = e && e->write_fd >= 0 ? 0 : -1;
  /* Lines as the trainer wrote them; a last line without its newline gets one. */
  for (size_t done = 0; rc == 0 && done < len;) {
    ssize_t n = write(e->write_fd, data + done, len - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      rc = -1;
    else
      done += (size_t)n;
  }
  if (rc == 0 && len > 0 && data[len - 1] != '\n')
    while (write(e->write_fd, "\n", 1) < 0 && errno == EINTR) {
    }
  pthread_mutex_unlock(&s->remote_lock);
  return rc;
}

int sched_remote_exit(sched *s, const char *alloc_id, int exit_code, int signal_no) {
  if (!s) return -1;
  pthread_mutex_lock(&s->remote_lock);
  sched_remote_entry *e = entry_find(s, alloc_id);
  int rc = e && e->write_fd >= 0 ? 0 : -1;
  if (rc == 0) {
    /* A wait status, as waitpid gives a local trainer's. */
    e->status = signal_no > 0 ? (signal_no & 0x7f) : (exit_code & 0xff) << 8;
    e->exited = 1;
    close(e->write_fd); /* the pump reads the lines before it, then ends */
    e->write_fd = -1;
  }
  pthread_mutex_unlock(&s->remote_lock);
  return rc;
}

void sched_remote_entry_add(sched *s, sched_remote_entry *e) {
  pthread_mutex_lock(&s->remote_lock);
  e->next = s->remotes;
  s->remotes = e;
  pthread_mutex_unlock(&s->remote_lock);
}

/* Unlinks the entry (nothing writes to the pipe after) and closes its end. */
void sched_remote_entry_remove(sched *s, sched_remote_entry *e) {
  pthread_mutex_lock(&s->remote_lock);
  for (sched_remote_entry **at = &s->remotes; *at; at = &(*at)->next) {
    if (*at == e) {
      *at = e->next;
      break;
    }
  }
  if (e->write_fd >= 0) close(e->write_fd);
  e->write_fd = -1;
  pthread_mutex_unlock(&s->remote_lock);
}

/* ---- one attempt on remote hosts ---- */

int sched_random_hex(char *out, size_t bytes) {
  unsigned char raw[32];
  if (bytes > sizeof raw) return -1;
  FILE *f = fopen("/dev/urandom", "rb");
  size_t got = f ? fread(raw, 1, bytes, f) : 0;
  if (f) fclose(f);
  if (got != bytes) return -1;
  for (size_t i = 0; i < bytes; i++) snprintf(out + 2 * i, 3, "%02x", raw[i]);
  return 0;
}

typedef struct remote_signal {
  sched *s;
  const slot_run *slot;
  const char *alloc_id;
  int last; /* the last signal sent: each is queued once */
} remote_signal;

/* The pump's way to stop a remote trainer: a `signal` command to every host. */
static void signal_hosts(void *ctx, int sig) {
  remote_signal *rs = ctx;
  if (rs->last == sig || rs->last == SIGKILL) return;
  rs->last = sig;
  char payload[128];
  snprintf(payload, sizeof payload, "{\"alloc\":\"%s\",\"signal\":\"%s\"}", rs->alloc_id,
           sig == SIGKILL ? "KILL" : "TERM");
  for (int h = 0; h < rs->slot->n_hosts; h++) {
    if (store_command_enqueue(rs->s->st, rs->slot->hosts[h].agent_id, "signal", payload, NULL) !=
        STORE_OK)
      sched_slog(rs->s, SCHED_LOG_ERROR, "msg=\"signal not queued\" alloc=%s agent=%s error=\"%s\"",
                 rs->alloc_id, rs->slot->hosts[h].name, store_errmsg(rs->s->st));
  }
}

static json_t *int_array(const int *v, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
  return a;
}

/* The `start` command for host h: the spec, the data set, resume, its
 * devices, and for a multi-host run what mpirun needs, on every host: the
 * agent of hosts[0] (rank 0's) runs mpirun; the others see they are not
 * it and only prepare what their ranks read (spec, data set, resume). */
static char *start_payload(sched *s, const slot_run *slot, int h, const char *alloc_id,
                           const char *token, int resuming, const int *slots, int np) {
  const sched_pool *pool = &s->pools[slot->pool];
  const sched_remote_host *host = &slot->hosts[h];
  const int gpu = strcmp(pool->device_type, "gpu") == 0;
  json_t *spec = json_loads(slot->job.spec_json, 0, NULL);
  json_t *o = json_object();
  json_object_set_new(o, "alloc", json_string(alloc_id));
  json_object_set_new(o, "token", json_string(token));
  json_object_set_new(o, "job", json_string(slot->job.id));
  json_object_set_new(o, "attempt", json_integer(slot->job.attempt));
  json_object_set_new(o, "spec", spec ? spec : json_object());
  const char *dataset =
      json_string_value(json_object_get(json_object_get(spec, "dataset"), "name"));
  if (dataset && dataset[0]) {
    store_dataset d;
    char sha[65] = "";
    if (api_dataset_id_valid(dataset) && store_dataset_get(s->st, dataset, &d) == STORE_OK)
      snprintf(sha, sizeof sha, "%s", d.sha256);
    json_object_set_new(o, "dataset", json_pack("{s:s, s:s}", "name", dataset, "sha256", sha));
  } else {
    json_object_set_new(o, "dataset", json_null());
  }
  json_object_set_new(o, "resume", json_boolean(resuming));
  json_object_set_new(o, "cores", gpu ? json_array() : int_array(host->cores, host->n_cores));
  json_object_set_new(o, "gpus", gpu ? int_array(host->cores, host->n_cores) : json_array());
  if (slot->n_hosts > 1) {
    json_t *hosts = json_array();
    for (int i = 0; i < slot->n_hosts; i++)
      json_array_append_new(hosts, json_pack("{s:s, s:s, s:i}", "name", slot->hosts[i].name,
                                             "address", slot->hosts[i].address, "slots", slots[i]));
    json_t *net = json_object();
    if (pool->oob_tcp_if_include[0])
      json_object_set_new(net, "oob_tcp_if_include", json_string(pool->oob_tcp_if_include));
    if (pool->btl_tcp_if_include[0])
      json_object_set_new(net, "btl_tcp_if_include", json_string(pool->btl_tcp_if_include));
    if (pool->nccl_socket_ifname[0])
      json_object_set_new(net, "nccl_socket_ifname", json_string(pool->nccl_socket_ifname));
    json_object_set_new(o, "mpi",
                        json_pack("{s:i, s:o, s:o}", "np", np, "hosts", hosts, "network", net));
  } else {
    json_object_set_new(o, "mpi", json_null());
  }
  char list[SCHED_MAX_DEVICES * 4] = "";
  for (int i = 0, used = 0; i < host->n_cores && used < (int)sizeof list; i++)
    used += snprintf(list + used, sizeof list - (size_t)used, "%s%d", i ? "," : "", host->cores[i]);
  char devices[sizeof list + 16];
  snprintf(devices, sizeof devices, "%s:%s", pool->device_type, list);
  json_t *env = json_pack("{s:s}", "KILN_DEVICES", devices);
  if (pool->shared_data[0])
    json_object_set_new(env, "KILN_SHARED_DATA", json_string(pool->shared_data));
  json_object_set_new(o, "env", env);
  char *text = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return text;
}

/* "host-a (cpu 0,1), host-b (cpu 0)": where a run is, for events and logs. */
static void hosts_text(const sched *s, const slot_run *slot, char *out, size_t len) {
  size_t used = 0;
  out[0] = '\0';
  for (int h = 0; h < slot->n_hosts && used < len; h++) {
    used += (size_t)snprintf(out + used, len - used, "%s%s (%s ", h ? ", " : "",
                             slot->hosts[h].name, s->pools[slot->pool].device_type);
    for (int c = 0; c < slot->hosts[h].n_cores && used < len; c++)
      used +=
          (size_t)snprintf(out + used, len - used, "%s%d", c ? "," : "", slot->hosts[h].cores[c]);
    if (used < len) used += (size_t)snprintf(out + used, len - used, ")");
  }
}

void sched_run_remote(sched *s, slot_run *slot) {
  const store_job *job = &slot->job;
  const sched_pool *pool = &s->pools[slot->pool];
  job_limits limits = sched_job_limits(job);
  char msg[8192], where[2048];
  hosts_text(s, slot, where, sizeof where);

  /* The allocation: its id, token (only the hash is kept) and hosts, with
   * ranks spread over the hosts as their devices are. */
  store_allocation a;
  memset(&a, 0, sizeof a);
  char token[80] = "kiln_a_", hash[65];
  snprintf(a.id, sizeof a.id, "alloc-");
  if (sched_random_hex(a.id + 6, 8) != 0 || sched_random_hex(token + 7, 32) != 0) {
    sched_finish(s, job, "FAILED", "INTERNAL", "cannot read random bytes for an allocation");
    return;
  }
  kc_sha256_hex_of(token, strlen(token), hash);
  snprintf(a.job_id, sizeof a.job_id, "%s", job->id);
  a.attempt = job->attempt;
  snprintf(a.pool, sizeof a.pool, "%s", pool->name);
  store_alloc_host hosts[STORE_ALLOC_MAX_HOSTS];
  int slots[STORE_ALLOC_MAX_HOSTS];
  const int np = limits.workers > 0 ? limits.workers : 1;
  int rank = 0;
  for (int h = 0; h < slot->n_hosts && h < STORE_ALLOC_MAX_HOSTS; h++) {
    store_alloc_host *ah = &hosts[h];
    memset(ah, 0, sizeof *ah);
    snprintf(ah->agent_id, sizeof ah->agent_id, "%s", slot->hosts[h].agent_id);
    snprintf(ah->name, sizeof ah->name, "%s", slot->hosts[h].name);
    snprintf(ah->address, sizeof ah->address, "%s", slot->hosts[h].address);
    for (int c = 0, used = 0; c < slot->hosts[h].n_cores && used < (int)sizeof ah->cores; c++)
      used += snprintf(ah->cores + used, sizeof ah->cores - (size_t)used, "%s%d", c ? "," : "",
                       slot->hosts[h].cores[c]);
    /* Its share of the ranks, as of the devices; the last host the rest. */
    slots[h] = h == slot->n_hosts - 1
                   ? np - rank
                   : slot->hosts[h].n_cores * np / (slot->n_slots ? slot->n_slots : 1);
    if (slots[h] < 1 && np - rank > 0) slots[h] = 1;
    ah->rank_first = rank;
    ah->ranks = slots[h];
    slot->hosts[h].rank_first = rank;
    rank += slots[h];
  }
  a.n_hosts = slot->n_hosts;
  a.hosts = hosts;
  if (store_allocation_add(s->st, &a, hash) != STORE_OK) {
    snprintf(msg, sizeof msg, "cannot record the allocation: %s", store_errmsg(s->st));
    sched_requeue(s, job, NULL, NULL, NULL, "SCHEDULER_BUSY", msg);
    return;
  }

  int fds[2];
  if (pipe(fds) != 0) {
    snprintf(msg, sizeof msg, "cannot create the progress pipe: %s", strerror(errno));
    store_allocation_end(s->st, a.id, "INTERNAL", NULL, 0, NULL);
    sched_finish(s, job, "FAILED", "INTERNAL", msg);
    return;
  }
  fcntl(fds[0], F_SETFD, FD_CLOEXEC);
  fcntl(fds[1], F_SETFD, FD_CLOEXEC);
  sched_remote_entry entry = {.write_fd = fds[1]};
  snprintf(entry.alloc_id, sizeof entry.alloc_id, "%s", a.id);
  sched_remote_entry_add(s, &entry);

  char resume_path[600];
  int64_t resume_step = 0;
  int resuming = sched_resume_point(s, job, resume_path, sizeof resume_path, &resume_step);
  int queued = 0;
  for (int h = 0; h < slot->n_hosts; h++) {
    char *payload = start_payload(s, slot, h, a.id, token, resuming, slots, np);
    int rc = payload ? store_command_enqueue(s->st, slot->hosts[h].agent_id, "start", payload, NULL)
                     : STORE_ERROR;
    free(payload);
    if (rc != STORE_OK) break;
    queued++;
  }
  memset(token, 0, sizeof token);
  if (queued < slot->n_hosts) {
    snprintf(msg, sizeof msg, "cannot queue the start command for agent %s: %s",
             slot->hosts[queued].name, store_errmsg(s->st));
    sched_remote_entry_remove(s, &entry);
    close(fds[0]);
    store_allocation_end(s->st, a.id, "START_FAILED", NULL, 1, NULL);
    sched_requeue(s, job, NULL, NULL, NULL, "SCHEDULER_BUSY", msg);
    return;
  }
  char workers[96] = "";
  if (limits.workers > 0) snprintf(workers, sizeof workers, " as %d kiln-train processes", np);
  if (resuming)
    snprintf(msg, sizeof msg,
             "allocation %s (attempt %d)%s, resuming from step %lld, on pool %s: %s", a.id,
             job->attempt, workers, (long long)resume_step, pool->name, where);
  else
    snprintf(msg, sizeof msg, "allocation %s (attempt %d)%s on pool %s: %s", a.id, job->attempt,
             workers, pool->name, where);
  if (store_job_transition(s->st, job->id, "STARTING", "RUNNING", "STARTED", msg) != STORE_OK)
    sched_slog(s, SCHED_LOG_ERROR, "msg=\"state not recorded\" job=%s error=\"%s\"", job->id,
               store_errmsg(s->st));
  sched_slog(s, SCHED_LOG_INFO, "job=%s state=RUNNING alloc=%s attempt=%d pool=%s hosts=\"%s\"",
             job->id, a.id, job->attempt, pool->name, where);

  run *r = calloc(1, sizeof *r);
  int stopped = PUMP_ENDED;
  remote_signal rs = {.s = s, .slot = slot, .alloc_id = a.id};
  if (r) {
    sched_run_init(r, s, slot, &limits);
    r->remote = 1;
    r->start_deadline_ms = sched_monotonic_ms() + (int64_t)pool->start_timeout_s * 1000;
    snprintf(r->alloc_id, sizeof r->alloc_id, "%s", a.id);
    stopped = sched_pump(r, fds[0], signal_hosts, &rs);
  }
  /* The read end first: a request still writing gets EPIPE, not a wait on
   * a pipe nobody drains, and lets go of remote_lock. */
  close(fds[0]);
  sched_remote_entry_remove(s, &entry);
  pthread_mutex_lock(&s->wake_lock);
  const int lost = slot->lost;
  char lost_agent_id[32];
  snprintf(lost_agent_id, sizeof lost_agent_id, "%s", slot->lost_agent_id);
  pthread_mutex_unlock(&s->wake_lock);
  /* A loss or a start that never came outranks what the pump was doing,
   * unless that already ends the job its own way. */
  if (stopped == PUMP_ENDED || stopped == PUMP_HUNG || stopped == PUMP_PREEMPTED) {
    if (lost && !entry.exited)
      stopped = PUMP_LOST;
    else if (r && r->start_timed_out && !entry.exited)
      stopped = PUMP_START_TIMEOUT;
  }
  const char *reason = stopped == PUMP_LOST            ? "AGENT_LOST"
                       : stopped == PUMP_START_TIMEOUT ? "START_TIMEOUT"
                       : stopped == PUMP_CANCELLED     ? "CANCELLED"
                       : stopped == PUMP_SHUTDOWN      ? "SERVER_SHUTDOWN"
                       : entry.exited                  ? "EXITED"
                                                       : "STOPPED";
  /* Every host but a lost one drops what is left of it (relays, ranks). */
  if (store_allocation_end(s->st, a.id, reason, lost ? lost_agent_id : NULL, 1, NULL) != STORE_OK)
    sched_slog(s, SCHED_LOG_ERROR, "msg=\"allocation end not recorded\" alloc=%s error=\"%s\"",
               a.id, store_errmsg(s->st));
  int status = entry.exited ? entry.status : (SIGKILL & 0x7f);
  sched_conclude(s, slot, r, &limits, stopped, status, "", "the agent's limits");
  free(r);
}

void sched_remote_recover(sched *s) {
  store_allocation *list = NULL;
  int n = 0;
  if (store_allocations_unended(s->st, NULL, &list, &n) != STORE_OK) {
    sched_slog(s, SCHED_LOG_ERROR, "msg=\"cannot read allocations\" error=\"%s\"",
               store_errmsg(s->st));
    return;
  }
  for (int i = 0; i < n; i++) {
    /* A Slurm pool's (slurm_run.c): its batch job is cancelled, no agent told. */
    const int slurm = list[i].n_hosts == 1 && strcmp(list[i].hosts[0].agent_id, "slurm") == 0;
    if (slurm) sched_slurm_recover(s, &list[i]);
    if (store_allocation_end(s->st, list[i].id, "SERVER_RESTART", NULL, !slurm, NULL) == STORE_OK)
      sched_slog(s, SCHED_LOG_WARN,
                 "msg=\"allocation of a previous kilnd ended; its hosts drop it\" alloc=%s job=%s "
                 "hosts=%d",
                 list[i].id, list[i].job_id, list[i].n_hosts);
  }
  store_allocation_list_free(list, n);
}
