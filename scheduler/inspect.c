/* inspect.c — what the server reads of the scheduler: pools and devices
 * with what runs on them, whether a spec could ever be placed, and why a
 * queued job waits (from the last pass). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sched_internal.h"

int sched_pools_info(sched *s, sched_pool_info *out, int max) {
  if (!s) return 0;
  int n = s->n_pools < max ? s->n_pools : max;
  pthread_mutex_lock(&s->wake_lock);
  for (int k = 0; k < n; k++) {
    memset(&out[k], 0, sizeof out[k]);
    snprintf(out[k].name, sizeof out[k].name, "%s", s->pools[k].name);
    snprintf(out[k].device_type, sizeof out[k].device_type, "%s", s->pools[k].device_type);
    out[k].devices = s->pools[k].n_devices;
    out[k].agents = s->pools[k].kind == SCHED_POOL_AGENTS;
    out[k].grace_s = s->pools[k].grace_s;
    for (int i = 0; i < s->n_runs; i++) {
      if (s->runs[i]->pool != k) continue;
      out[k].devices_busy += s->runs[i]->n_slots;
      out[k].running_jobs++;
    }
  }
  for (int i = 0; i < s->n_explain; i++) {
    int k = s->explain[i].pool;
    if (k >= 0 && k < n) out[k].queued_jobs++;
  }
  pthread_mutex_unlock(&s->wake_lock);
  return n;
}

int sched_devices_info(sched *s, sched_device_info *out, int max) {
  if (!s) return 0;
  int n = 0;
  pthread_mutex_lock(&s->wake_lock);
  for (int k = 0; k < s->n_pools; k++) {
    const sched_pool *p = &s->pools[k];
    if (p->kind == SCHED_POOL_AGENTS) continue; /* its devices are its agents' (GET /v1/agents) */
    for (int d = 0; d < p->n_devices && n < max; d++) {
      sched_device_info *info = &out[n++];
      memset(info, 0, sizeof *info);
      snprintf(info->pool, sizeof info->pool, "%s", p->name);
      snprintf(info->device_type, sizeof info->device_type, "%s", p->device_type);
      info->index = p->devices[d];
      if (strcmp(p->device_type, "gpu") == 0 && info->index < 8)
        snprintf(info->model, sizeof info->model, "%s", s->inventory.gpu_names[info->index]);
      for (int i = 0; i < s->n_runs; i++) {
        const slot_run *slot = s->runs[i];
        if (slot->pool != k) continue;
        for (int j = 0; j < slot->n_slots; j++)
          if (slot->slots[j] == info->index)
            snprintf(info->job, sizeof info->job, "%s", slot->job.id);
      }
    }
  }
  pthread_mutex_unlock(&s->wake_lock);
  return n;
}

int sched_check_fits(sched *s, const char *pool, const char *device_type, int devices, char *field,
                     size_t field_len, char *msg, size_t msg_len) {
  if (!s) return 0;
  int k = sched_pool_index(s, pool && pool[0] ? pool : STORE_DEFAULT_POOL);
  int gpus = 0;
  for (int i = 0; i < s->n_pools; i++) gpus += strcmp(s->pools[i].device_type, "gpu") == 0;
  if (k < 0 && device_type && strcmp(device_type, "gpu") == 0 && gpus == 0) {
    snprintf(field, field_len, "resources.device_type");
    snprintf(msg, msg_len, "this kilnd has no pool of GPUs: %s",
             s->inventory.gpus > 0 ? "its --pools file names none"
                                   : "it found no CUDA device (a build without CUDA, or a "
                                     "machine without a GPU or its driver)");
    return -1;
  }
  if (k < 0) {
    char names[SCHED_MAX_POOLS * 34] = "";
    size_t used = 0;
    for (int i = 0; i < s->n_pools; i++)
      used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "",
                               s->pools[i].name);
    snprintf(field, field_len, "resources.pool");
    snprintf(msg, msg_len, "pool '%.40s' does not exist; this kilnd has: %s", pool, names);
    return -1;
  }
  const sched_pool *p = &s->pools[k];
  if (device_type && device_type[0] && strcmp(device_type, p->device_type) != 0) {
    snprintf(field, field_len, "resources.device_type");
    snprintf(msg, msg_len, "pool '%s' holds %s devices, not %.16s", p->name, p->device_type,
             device_type);
    return -1;
  }
  /* An agents pool's size is its online hosts': a job waits for them. */
  if (p->kind != SCHED_POOL_AGENTS && devices > p->n_devices) {
    snprintf(field, field_len, "resources.devices");
    snprintf(msg, msg_len,
             "asks for %d %s devices at once, but pool '%s' has only %d: it could never start",
             devices, p->device_type, p->name, p->n_devices);
    return -1;
  }
  return 0;
}

static void format_time(int64_t ms, char *out, size_t len) {
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(out, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

int sched_explain(sched *s, const char *job_id, const char *viewer_tenant, char *reason,
                  size_t reason_len, char *message, size_t message_len) {
  if (!s) return -1;
  explain_row key;
  snprintf(key.id, sizeof key.id, "%s", job_id);
  pthread_mutex_lock(&s->wake_lock);
  const explain_row *e =
      s->n_explain ? bsearch(&key, s->explain, (size_t)s->n_explain, sizeof key, sched_cmp_explain)
                   : NULL;
  explain_row row;
  if (e) row = *e;
  pthread_mutex_unlock(&s->wake_lock);
  if (!e) return -1;
  snprintf(reason, reason_len, "%s", sched_wait_name(row.wait));
  /* Another tenant's job is named only as that. */
  if (viewer_tenant && row.blocker[0] && strcmp(viewer_tenant, row.blocker_tenant) != 0)
    snprintf(row.blocker, sizeof row.blocker, "of another tenant");
  const char *pool = row.pool >= 0 ? s->pools[row.pool].name : "";
  const char *type = row.pool >= 0 ? s->pools[row.pool].device_type : "";
  char when[40] = "";
  if (row.start_by_ms != SCHED_NO_END) format_time(row.start_by_ms, when, sizeof when);
  switch (row.wait) {
  case SCHED_START:
    snprintf(message, message_len, "the last pass placed it on pool '%s'; it is starting", pool);
    break;
  case SCHED_WAITING_FOR_DEVICES:
  case SCHED_WAITING_FOR_PREEMPTION:
    snprintf(message, message_len,
             "first in line in pool '%s': needs %d %s devices at once, %d of %d are free; %s%s%s",
             pool, row.devices, type, row.free, row.total,
             row.wait == SCHED_WAITING_FOR_PREEMPTION
                 ? "lower-priority jobs are checkpointing and stopping to make room"
                 : (when[0] ? "its devices are reserved, free by "
                            : "its devices are reserved; when they free up is unknown (a job it "
                              "waits for has no max_runtime)"),
             row.wait == SCHED_WAITING_FOR_PREEMPTION ? "" : when,
             row.wait != SCHED_WAITING_FOR_PREEMPTION && when[0]
                 ? " at the latest (running jobs' max_runtime)"
                 : "");
    break;
  case SCHED_BEHIND_HIGHER_PRIORITY:
  case SCHED_BEHIND_EARLIER_JOB:
    snprintf(message, message_len,
             "job %s (priority %d) is ahead in pool '%s' and holds its reservation; this job "
             "(priority %d, %d devices, %d of %d free) may pass it only if it ends before that "
             "job's devices are due (set max_runtime) or fits devices it leaves spare",
             row.blocker, row.blocker_priority, pool, row.priority, row.devices, row.free,
             row.total);
    break;
  case SCHED_WAITING_FOR_HOSTS:
    snprintf(message, message_len,
             "pool '%s' has %d %s devices on its online hosts; needs %d %s: %s", pool, row.total,
             type, row.devices, row.spread ? "over one or more hosts" : "on one host",
             row.hosts[0] ? row.hosts : "no host is online");
    break;
  case SCHED_RETRY_BACKOFF:
    format_time(row.not_before_ms, when, sizeof when);
    snprintf(message, message_len, "a failed attempt's restart backoff lasts until %s", when);
    break;
  case SCHED_NEVER_FITS:
    if (row.pool < 0)
      snprintf(message, message_len, "its pool does not exist in this kilnd's pools");
    else
      snprintf(message, message_len,
               "asks for %d devices at once; pool '%s' has %d: it can never start", row.devices,
               pool, row.total);
    break;
  }
  size_t used = strlen(message);
  if (row.hosts[0] && row.wait != SCHED_WAITING_FOR_HOSTS && row.wait != SCHED_START &&
      used < message_len)
    snprintf(message + used, message_len - used, "; its hosts: %s", row.hosts);
  return 0;
}
