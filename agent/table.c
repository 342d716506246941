/* table.c — the allocations this agent runs or ran, under one lock
 * (table_lock guards every entry): a start delivered twice finds its
 * allocation here, and signal/drop find the process groups to reach. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent.h"

typedef struct entry {
  char alloc[96];
  pid_t group;                 /* the trainer's (or mpirun's) process group; 0: none */
  pid_t relays[AG_MAX_RELAYS]; /* groups of the relay daemons running for it */
  int n_relays;
  int cores[AG_MAX_CORES], n_cores;
  int ready;   /* its folder, data set and resume checkpoint are in place */
  int pending; /* a signal that came before the group existed */
  int started; /* a start claimed it */
  int ended;
  int dropped;
  struct entry *next;
} entry;

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t table_changed = PTHREAD_COND_INITIALIZER; /* ready, ended or dropped */
static entry *table;

static entry *find(const char *alloc) {
  for (entry *e = table; e; e = e->next)
    if (strcmp(e->alloc, alloc) == 0) return e;
  return NULL;
}

static entry *find_or_add(const char *alloc) {
  entry *e = find(alloc);
  if (e) return e;
  e = calloc(1, sizeof *e);
  if (!e) return NULL;
  snprintf(e->alloc, sizeof e->alloc, "%s", alloc);
  e->next = table;
  table = e;
  return e;
}

int ag_table_claim(const char *alloc) {
  pthread_mutex_lock(&table_lock);
  entry *e = find_or_add(alloc);
  int seen = !e || e->started || e->dropped;
  if (e && !seen) e->started = 1;
  pthread_mutex_unlock(&table_lock);
  return seen;
}

void ag_table_set_group(const char *alloc, pid_t pgid) {
  pthread_mutex_lock(&table_lock);
  entry *e = find(alloc);
  if (e) e->group = pgid;
  /* A drop or signal that came while it was starting reaches the new group. */
  if (e && e->dropped && pgid > 0)
    kill(-pgid, SIGKILL);
  else if (e && e->pending && pgid > 0)
    kill(-pgid, e->pending);
  pthread_mutex_unlock(&table_lock);
}

int ag_table_add_relay(const char *alloc, pid_t pgid) {
  pthread_mutex_lock(&table_lock);
  entry *e = find_or_add(alloc);
  int rc = -1;
  if (e && !e->dropped && e->n_relays < AG_MAX_RELAYS) {
    e->relays[e->n_relays++] = pgid;
    rc = 0;
  }
  pthread_mutex_unlock(&table_lock);
  return rc;
}

void ag_table_remove_relay(const char *alloc, pid_t pgid) {
  pthread_mutex_lock(&table_lock);
  entry *e = find(alloc);
  for (int i = 0; e && i < e->n_relays; i++)
    if (e->relays[i] == pgid) e->relays[i--] = e->relays[--e->n_relays];
  pthread_mutex_unlock(&table_lock);
}

void ag_table_set_cores(const char *alloc, const int *cores, int n) {
  pthread_mutex_lock(&table_lock);
  entry *e = find(alloc);
  if (e) {
    e->n_cores = n < AG_MAX_CORES ? n : AG_MAX_CORES;
    memcpy(e->cores, cores, (size_t)e->n_cores * sizeof *cores);
    e->ready = 1;
    pthread_cond_broadcast(&table_changed);
  }
  pthread_mutex_unlock(&table_lock);
}

int ag_table_cores(const char *alloc, int *cores, int max) {
  pthread_mutex_lock(&table_lock);
  entry *e = find(alloc);
  int n = 0;
  for (; e && n < e->n_cores && n < max; n++) cores[n] = e->cores[n];
  pthread_mutex_unlock(&table_lock);
  return n;
}

void ag_table_finish(const char *alloc) {
  pthread_mutex_lock(&table_lock);
  entry *e = find(alloc);
  if (e) {
    e->ended = 1;
    e->group = 0;
    pthread_cond_broadcast(&table_changed);
  }
  pthread_mutex_unlock(&table_lock);
}

int ag_table_wait_ready(const char *alloc, int timeout_ms) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += timeout_ms / 1000;
  until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&table_lock);
  entry *e = find(alloc);
  int rc = 0;
  while (e && e->started && !e->ready && !e->ended && !e->dropped && rc == 0)
    rc = pthread_cond_timedwait(&table_changed, &table_lock, &until);
  int ready = !e || !e->started || e->ready;
  pthread_mutex_unlock(&table_lock);
  return ready ? 0 : -1;
}

int ag_table_dropped(const char *alloc) {
  pthread_mutex_lock(&table_lock);
  entry *e = find(alloc);
  int dropped = e && e->dropped;
  pthread_mutex_unlock(&table_lock);
  return dropped;
}

static void signal_entry(const entry *e, int sig) {
  if (e->group > 0) kill(-e->group, sig);
  for (int i = 0; i < e->n_relays; i++) kill(-e->relays[i], sig);
}

int ag_table_signal(const char *alloc, int sig, int drop) {
  pthread_mutex_lock(&table_lock);
  entry *e = drop ? find_or_add(alloc) : find(alloc);
  if (e && drop) {
    e->dropped = 1;
    pthread_cond_broadcast(&table_changed);
  }
  if (e && e->group <= 0 && e->started && !e->ended) e->pending = sig;
  if (e) signal_entry(e, sig);
  pthread_mutex_unlock(&table_lock);
  return e ? 0 : -1;
}

void ag_table_signal_all(int sig) {
  pthread_mutex_lock(&table_lock);
  for (entry *e = table; e; e = e->next) signal_entry(e, sig);
  pthread_mutex_unlock(&table_lock);
}

int ag_table_running(void) {
  pthread_mutex_lock(&table_lock);
  int n = 0;
  for (entry *e = table; e; e = e->next)
    n += (e->started && !e->ended && !e->dropped) || e->n_relays > 0;
  pthread_mutex_unlock(&table_lock);
  return n;
}

json_t *ag_table_running_json(void) {
  json_t *list = json_array();
  pthread_mutex_lock(&table_lock);
  for (entry *e = table; e && list; e = e->next)
    if (e->started && !e->ended && !e->dropped) json_array_append_new(list, json_string(e->alloc));
  pthread_mutex_unlock(&table_lock);
  return list;
}
