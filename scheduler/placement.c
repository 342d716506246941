/* placement.c — one scheduling pass: orders the queue (priority, fair share,
 * age), places each job on all the devices it asks for or none, holds a
 * reservation for the first job of each pool that does not fit and lets
 * later jobs backfill only where they cannot push that reservation back
 * (EASY backfill), and picks preemption victims. Pure computation: the
 * scheduler thread owns the planner and the pass it fills. */
#include <stdlib.h>
#include <string.h>

#include "scheduler.h"

/* Scratch reused from pass to pass; grows, never shrinks. */
struct sched_planner {
  int cap_jobs, cap_tenants, cap_ends;
  int *order;    /* (n_queue) the fair-share order */
  int *next;     /* (n_queue) the next job of the same tenant in a priority band */
  int *head;     /* (n_tenants) first not-yet-ordered job of each tenant in the band, -1 */
  int *tail;     /* (n_tenants) */
  int64_t *key;  /* (n_tenants) recent starts + jobs already ordered in the band */
  int *active;   /* (n_tenants) tenants with jobs left in the band */
  int *placed;   /* (n_queue) jobs started by this pass, in start order */
  int64_t *ends; /* (2 * (n_running + n_queue)) end time, devices pairs of one pool */
};

typedef struct pool_state {
  int free;
  int host_free[SCHED_MAX_HOSTS]; /* agents pool: free devices per host */
  int reserved;                   /* a job holds this pool's reservation */
  int blocker;                    /* its queue index */
  int64_t shadow; /* when its devices are free at the latest; SCHED_NO_END unknown */
  int extra;      /* devices free then that it leaves spare */
} pool_state;

const char *sched_wait_name(sched_wait w) {
  switch (w) {
  case SCHED_START: return "STARTING";
  case SCHED_WAITING_FOR_DEVICES: return "WAITING_FOR_DEVICES";
  case SCHED_WAITING_FOR_PREEMPTION: return "WAITING_FOR_PREEMPTION";
  case SCHED_BEHIND_HIGHER_PRIORITY: return "BEHIND_HIGHER_PRIORITY";
  case SCHED_BEHIND_EARLIER_JOB: return "BEHIND_EARLIER_JOB";
  case SCHED_RETRY_BACKOFF: return "RETRY_BACKOFF";
  case SCHED_NEVER_FITS: return "NEVER_FITS";
  case SCHED_WAITING_FOR_HOSTS: return "WAITING_FOR_HOSTS";
  }
  return "UNKNOWN";
}

sched_planner *sched_planner_new(void) {
  return calloc(1, sizeof(sched_planner));
}

void sched_planner_free(sched_planner *pl) {
  if (!pl) return;
  free(pl->order);
  free(pl->next);
  free(pl->head);
  free(pl->tail);
  free(pl->key);
  free(pl->active);
  free(pl->placed);
  free(pl->ends);
  free(pl);
}

static int grow(void **array, size_t elem, int n) {
  void *more = realloc(*array, (size_t)(n > 0 ? n : 1) * elem);
  if (!more) return -1;
  *array = more;
  return 0;
}

static int reserve(sched_planner *pl, int jobs, int tenants, int ends) {
  if (jobs > pl->cap_jobs) {
    if (grow((void **)&pl->order, sizeof(int), jobs) ||
        grow((void **)&pl->next, sizeof(int), jobs) ||
        grow((void **)&pl->placed, sizeof(int), jobs))
      return -1;
    pl->cap_jobs = jobs;
  }
  if (tenants > pl->cap_tenants) {
    if (grow((void **)&pl->head, sizeof(int), tenants) ||
        grow((void **)&pl->tail, sizeof(int), tenants) ||
        grow((void **)&pl->key, sizeof(int64_t), tenants) ||
        grow((void **)&pl->active, sizeof(int), tenants))
      return -1;
    for (int t = pl->cap_tenants; t < tenants; t++) pl->head[t] = -1;
    pl->cap_tenants = tenants;
  }
  if (ends > pl->cap_ends) {
    if (grow((void **)&pl->ends, 2 * sizeof(int64_t), ends)) return -1;
    pl->cap_ends = ends;
  }
  return 0;
}

/* Fills pl->order: bands of one priority in queue order; inside a band the
 * tenants take turns by (recent starts + jobs of theirs ordered so far),
 * ties to the older job, so a burst from one tenant cannot hold back
 * another's. One tenant in a band (the common case) keeps queue order. */
static void fair_order(sched_planner *pl, const sched_pass *p) {
  int n = p->n_queue, out = 0;
  for (int a = 0; a < n;) {
    int b = a + 1;
    while (b < n && p->queue[b].priority == p->queue[a].priority) b++;
    int n_active = 0;
    for (int i = a; i < b; i++) {
      int t = p->queue[i].tenant;
      pl->next[i] = -1;
      if (pl->head[t] < 0) {
        pl->head[t] = i;
        pl->key[t] = t < p->n_tenants ? p->tenant_starts[t] : 0;
        pl->active[n_active++] = t;
      } else {
        pl->next[pl->tail[t]] = i;
      }
      pl->tail[t] = i;
    }
    if (n_active == 1) {
      for (int i = a; i < b; i++) pl->order[out++] = i;
      pl->head[pl->active[0]] = -1;
    } else {
      while (n_active > 0) {
        int best = 0;
        for (int k = 1; k < n_active; k++) {
          int t = pl->active[k], u = pl->active[best];
          if (pl->key[t] < pl->key[u] ||
              (pl->key[t] == pl->key[u] && p->queue[pl->head[t]].seq < p->queue[pl->head[u]].seq))
            best = k;
        }
        int t = pl->active[best];
        pl->order[out++] = pl->head[t];
        pl->key[t]++;
        pl->head[t] = pl->next[pl->head[t]];
        if (pl->head[t] < 0) pl->active[best] = pl->active[--n_active];
      }
    }
    a = b;
  }
}

static int cmp_end(const void *x, const void *y) {
  int64_t a = ((const int64_t *)x)[0], b = ((const int64_t *)y)[0];
  return (a > b) - (a < b);
}

static int64_t job_end(const sched_pass *p, const sched_job_req *q) {
  return q->max_runtime_ms > 0 ? p->now_ms + q->max_runtime_ms : SCHED_NO_END;
}

/* The reservation of the pool's first blocked job q: the time by which,
 * as running jobs (and those this pass started) end at their max_runtime
 * at the latest, the pool has q's devices free; and how many of the devices
 * free then q leaves spare. A stopping job's devices count as free now. */
static void reserve_for(sched_planner *pl, const sched_pass *p, int pool, pool_state *ps,
                        const sched_job_req *q, int n_placed) {
  int n = 0;
  for (int i = 0; i < p->n_running; i++) {
    const sched_running_req *r = &p->running[i];
    if (r->pool != pool) continue;
    pl->ends[2 * n] = r->stopping ? p->now_ms : r->end_by_ms;
    pl->ends[2 * n + 1] = r->devices;
    n++;
  }
  for (int k = 0; k < n_placed; k++) {
    const sched_job_req *started = &p->queue[pl->placed[k]];
    if (started->pool != pool) continue;
    pl->ends[2 * n] = job_end(p, started);
    pl->ends[2 * n + 1] = started->devices;
    n++;
  }
  qsort(pl->ends, (size_t)n, 2 * sizeof(int64_t), cmp_end);
  int free_then = ps->free, i = 0;
  int64_t shadow = p->now_ms;
  while (free_then < q->devices && i < n) {
    free_then += (int)pl->ends[2 * i + 1];
    shadow = pl->ends[2 * i];
    i++;
  }
  while (i < n && pl->ends[2 * i] <= shadow) free_then += (int)pl->ends[2 * i++ + 1];
  ps->shadow = shadow;
  /* Not knowing when the devices come back, no spare device is safe to give. */
  ps->extra = shadow == SCHED_NO_END ? 0 : free_then - q->devices;
}

/* Stops the fewest lowest-priority running jobs of the pool (the most
 * recently started among equals) that let q fit, if stopping every job of
 * lower priority would. Devices of jobs already stopping count as coming. */
static int preempt_for(sched_pass *p, int pool, const pool_state *ps, int qi) {
  const sched_job_req *q = &p->queue[qi];
  int missing = q->devices - ps->free, lower = 0;
  for (int i = 0; i < p->n_running; i++) {
    const sched_running_req *r = &p->running[i];
    if (r->pool != pool) continue;
    if (r->stopping)
      missing -= r->devices;
    else if (r->priority < q->priority)
      lower += r->devices;
  }
  if (missing <= 0) return 1; /* enough is already stopping */
  if (lower < missing) return 0;
  while (missing > 0) {
    int victim = -1;
    for (int i = 0; i < p->n_running; i++) {
      const sched_running_req *r = &p->running[i];
      if (r->pool != pool || r->stopping || r->priority >= q->priority) continue;
      if (victim < 0 || r->priority <= p->running[victim].priority) victim = i;
    }
    p->running[victim].stopping = 1;
    p->running[victim].preempt_for = qi;
    p->n_preempted++;
    missing -= p->running[victim].devices;
  }
  return 1;
}

int sched_hosts_pick(int n_hosts, const int *host_free, int devices, int spread, int *take) {
  for (int h = 0; h < n_hosts; h++) take[h] = 0;
  int best = -1; /* the host it fills best: the least free that is enough */
  for (int h = 0; h < n_hosts; h++)
    if (host_free[h] >= devices && (best < 0 || host_free[h] < host_free[best])) best = h;
  if (best >= 0) {
    take[best] = devices;
    return 1;
  }
  if (!spread) return 0;
  int left = devices, used = 0;
  while (left > 0) { /* the most free first: the fewest hosts */
    int most = -1;
    for (int h = 0; h < n_hosts; h++)
      if (!take[h] && host_free[h] > 0 && (most < 0 || host_free[h] > host_free[most])) most = h;
    if (most < 0) {
      for (int h = 0; h < n_hosts; h++) take[h] = 0;
      return 0;
    }
    take[most] = host_free[most] < left ? host_free[most] : left;
    left -= take[most];
    used++;
  }
  return used;
}

/* Whether q could ever fit the pool's hosts as they are online now: one
 * host with all its devices, or for a gang all the hosts together. */
static int hosts_could_fit(const sched_pool *pool, const sched_job_req *q) {
  if (q->spread) return q->devices <= pool->n_devices;
  for (int h = 0; h < pool->n_hosts; h++)
    if (pool->host_total[h] >= q->devices) return 1;
  return 0;
}

/* Whether q fits what is free now, and if take is set, takes it. */
static int fits_now(const sched_pool *pool, pool_state *ps, const sched_job_req *q, int take) {
  if (q->devices > ps->free) return 0;
  if (pool->kind == SCHED_POOL_AGENTS) {
    int got[SCHED_MAX_HOSTS];
    if (!sched_hosts_pick(pool->n_hosts, ps->host_free, q->devices, q->spread, got)) return 0;
    for (int h = 0; take && h < pool->n_hosts; h++) ps->host_free[h] -= got[h];
  }
  if (take) ps->free -= q->devices;
  return 1;
}

int sched_plan(sched_planner *pl, sched_pass *p) {
  p->n_started = p->n_preempted = 0;
  if (reserve(pl, p->n_queue, p->n_tenants + 1, p->n_running + p->n_queue) != 0) return -1;
  pool_state pools[SCHED_MAX_POOLS];
  memset(pools, 0, sizeof pools);
  for (int k = 0; k < p->n_pools && k < SCHED_MAX_POOLS; k++) {
    pools[k].free = p->pools[k].n_devices;
    if (p->pools[k].kind != SCHED_POOL_AGENTS) continue;
    /* Its hosts' free devices are what the scheduler counted, running jobs
     * already taken out: pool_state's free follows from them. */
    pools[k].free = 0;
    for (int h = 0; h < p->pools[k].n_hosts && h < SCHED_MAX_HOSTS; h++) {
      pools[k].host_free[h] = p->pools[k].host_free[h];
      pools[k].free += p->pools[k].host_free[h];
    }
  }

  for (int i = 0; i < p->n_running; i++) {
    p->running[i].preempt_for = -1;
    int k = p->running[i].pool;
    if (k >= 0 && k < p->n_pools && p->pools[k].kind != SCHED_POOL_AGENTS)
      pools[k].free -= p->running[i].devices;
  }
  for (int i = 0; i < p->n_queue; i++) { /* a tenant index past the starts has none */
    if (p->queue[i].tenant < 0 || p->queue[i].tenant > p->n_tenants)
      p->queue[i].tenant = p->n_tenants;
  }
  fair_order(pl, p);
  int n_placed = 0;
  for (int o = 0; o < p->n_queue; o++) {
    int qi = pl->order[o];
    sched_job_req *q = &p->queue[qi];
    q->blocker = -1;
    q->start_by_ms = SCHED_NO_END;
    if (q->pool < 0 || q->pool >= p->n_pools || q->devices < 1 ||
        (p->pools[q->pool].kind != SCHED_POOL_AGENTS && q->devices > p->pools[q->pool].n_devices)) {
      q->wait = SCHED_NEVER_FITS;
      continue;
    }
    const sched_pool *pool = &p->pools[q->pool];
    if (pool->kind == SCHED_POOL_AGENTS && !hosts_could_fit(pool, q)) {
      /* Hosts come and go: it waits for them, holding no reservation. */
      q->wait = SCHED_WAITING_FOR_HOSTS;
      continue;
    }
    if (q->not_before_ms > p->now_ms) {
      q->wait = SCHED_RETRY_BACKOFF;
      continue;
    }
    pool_state *ps = &pools[q->pool];
    int start = 0;
    if (!ps->reserved) {
      start = fits_now(pool, ps, q, 0);
      if (!start) {
        ps->reserved = 1;
        ps->blocker = qi;
        reserve_for(pl, p, q->pool, ps, q, n_placed);
        q->start_by_ms = ps->shadow;
        q->wait = p->preempt && preempt_for(p, q->pool, ps, qi) ? SCHED_WAITING_FOR_PREEMPTION
                                                                : SCHED_WAITING_FOR_DEVICES;
        continue;
      }
    } else if (fits_now(pool, ps, q, 0)) {
      /* Backfill: it must be gone by the reservation, or fit in its spare. */
      int64_t end = job_end(p, q);
      if (ps->shadow != SCHED_NO_END && end <= ps->shadow) {
        start = 1;
      } else if (q->devices <= ps->extra) {
        ps->extra -= q->devices;
        start = 1;
      }
    }
    if (start) {
      q->wait = SCHED_START;
      fits_now(pool, ps, q, 1);
      pl->placed[n_placed++] = qi;
      p->n_started++;
    } else {
      q->blocker = ps->blocker;
      q->wait = p->queue[ps->blocker].priority > q->priority ? SCHED_BEHIND_HIGHER_PRIORITY
                                                             : SCHED_BEHIND_EARLIER_JOB;
    }
  }
  for (int k = 0; k < p->n_pools && k < SCHED_MAX_POOLS; k++) p->free_devices[k] = pools[k].free;
  return 0;
}
