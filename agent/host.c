/* host.c — what kiln-agent reports about its host: the cores it may use
 * and the GPUs the CUDA module sees (the same module kiln-train opens). */
#define _GNU_SOURCE /* sched_getaffinity */
#include <sched.h>
#include <stdio.h>

#include "agent.h"
#include "cuda.h"

int ag_host_cores(int *cores, int max) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  int n = 0;
  for (int c = 0; c < CPU_SETSIZE && n < max; c++)
    if (CPU_ISSET(c, &set)) cores[n++] = c;
  return n;
}

json_t *ag_host_gpus(void) {
  json_t *list = json_array();
  int count = 0;
  char err[512];
  if (!list || kn_cuda_device_count(&count, err, sizeof err) != 0) return list;
  for (int i = 0; i < count; i++) {
    char name[256];
    if (kn_cuda_device_name(i, name, sizeof name, err, sizeof err) != 0)
      snprintf(name, sizeof name, "CUDA device %d", i);
    json_array_append_new(list, json_pack("{s:i,s:s}", "index", i, "name", name));
  }
  return list;
}

int ag_host_core_set(const int *indices, int n, cpu_set_t *set) {
  int usable[AG_MAX_CORES];
  const int have = ag_host_cores(usable, AG_MAX_CORES);
  int mapped = 0;
  CPU_ZERO(set);
  for (int i = 0; i < n; i++) {
    if (indices[i] < 0 || indices[i] >= have) continue;
    CPU_SET(usable[indices[i]], set);
    mapped++;
  }
  return mapped;
}
