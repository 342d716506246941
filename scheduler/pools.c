/* pools.c — the device inventory (each CPU core one slot; GPUs through the
 * CUDA runtime in a KILN_CUDA build) and the pools the scheduler hands out,
 * from a JSON file or one default pool of every CPU core. */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#ifdef KILN_CUDA
#include <cuda_runtime_api.h>
#endif

#include "scheduler.h"

void sched_inventory_detect(sched_inventory *inv) {
  memset(inv, 0, sizeof *inv);
  cpu_set_t set;
  /* The cores this process may use (a container's or taskset's share), not
   * every core the machine has. */
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE && inv->cpus < SCHED_MAX_DEVICES; cpu++)
      if (CPU_ISSET(cpu, &set)) inv->cpu_ids[inv->cpus++] = cpu;
  }
  if (inv->cpus <= 0) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    inv->cpus = online > 0 ? (int)online : 1;
    if (inv->cpus > SCHED_MAX_DEVICES) inv->cpus = SCHED_MAX_DEVICES;
    for (int i = 0; i < inv->cpus; i++) inv->cpu_ids[i] = i;
  }
#ifdef KILN_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError(); /* no driver or no GPU: no GPU slots */
    count = 0;
  }
  int named = count < 8 ? count : 8;
  for (int i = 0; i < named; i++) {
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess)
      snprintf(inv->gpu_names[i], sizeof inv->gpu_names[i], "%.63s", prop.name);
  }
  inv->gpus = count < SCHED_MAX_DEVICES ? count : SCHED_MAX_DEVICES;
#endif
}

static void fill_pool(sched_pool *pool, const char *name, const char *type, int n) {
  memset(pool, 0, sizeof *pool);
  snprintf(pool->name, sizeof pool->name, "%s", name);
  snprintf(pool->device_type, sizeof pool->device_type, "%s", type);
  pool->n_devices = n;
  for (int i = 0; i < n; i++) pool->devices[i] = i;
}

int sched_pools_default(const sched_inventory *inv, sched_pool *pools, int max_pools) {
  int n = 0;
  if (max_pools > n) fill_pool(&pools[n++], "default", "cpu", inv->cpus);
  if (inv->gpus > 0 && max_pools > n) fill_pool(&pools[n++], "gpu", "gpu", inv->gpus);
  return n;
}

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

static int valid_pool_name(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n >= sizeof((sched_pool *)0)->name) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
          c == '_' || c == '.'))
      return 0;
  }
  return 1;
}

/* One entry of "pools": its devices, each of the type's inventory and not
 * already in a pool (taken[] marks them). */
static int parse_pool(json_t *obj, int k, const sched_inventory *inv,
                      unsigned char taken[2][SCHED_MAX_DEVICES], sched_pool *pool, char *err,
                      size_t errlen) {
  if (!json_is_object(obj)) return fail(err, errlen, "pools[%d]: must be an object", k);
  const char *key;
  json_t *value;
  json_object_foreach(obj, key, value) {
    if (strcmp(key, "name") && strcmp(key, "device_type") && strcmp(key, "devices"))
      return fail(err, errlen, "pools[%d].%.64s: unknown field (known: name, device_type, devices)",
                  k, key);
  }
  const char *name = json_string_value(json_object_get(obj, "name"));
  if (!name || !valid_pool_name(name))
    return fail(err, errlen,
                "pools[%d].name: must be 1 to 31 characters of A-Z a-z 0-9 - _ . (got %s)", k,
                name ? "an invalid name" : "none");
  json_t *type_json = json_object_get(obj, "device_type");
  const char *type = type_json ? json_string_value(type_json) : "cpu";
  if (!type || (strcmp(type, "cpu") && strcmp(type, "gpu")))
    return fail(err, errlen, "pools[%d].device_type: must be \"cpu\" or \"gpu\"", k);
  int gpu = type[0] == 'g';
  int have = gpu ? inv->gpus : inv->cpus;
  memset(pool, 0, sizeof *pool);
  snprintf(pool->name, sizeof pool->name, "%s", name);
  snprintf(pool->device_type, sizeof pool->device_type, "%s", type);
  json_t *devices = json_object_get(obj, "devices");
  if (json_is_integer(devices)) { /* a count: the first devices no other pool took */
    json_int_t want = json_integer_value(devices);
    if (want < 1 || want > have)
      return fail(err, errlen, "pools[%d].devices: asks for %lld %s devices; this machine has %d",
                  k, (long long)want, type, have);
    for (int d = 0; d < have && pool->n_devices < want; d++) {
      if (taken[gpu][d]) continue;
      taken[gpu][d] = 1;
      pool->devices[pool->n_devices++] = d;
    }
    if (pool->n_devices < want)
      return fail(err, errlen,
                  "pools[%d].devices: only %d %s devices are left after the pools before it, not "
                  "%lld",
                  k, pool->n_devices, type, (long long)want);
    return 0;
  }
  if (!json_is_array(devices) || json_array_size(devices) == 0)
    return fail(err, errlen,
                "pools[%d].devices: must be a non-empty array of device indices or a count", k);
  size_t i;
  json_t *d;
  json_array_foreach(devices, i, d) {
    if (!json_is_integer(d) || json_integer_value(d) < 0 || json_integer_value(d) >= have)
      return fail(err, errlen,
                  "pools[%d].devices[%zu]: must be a %s index from 0 to %d (this machine has %d)",
                  k, i, type, have - 1, have);
    int index = (int)json_integer_value(d);
    if (taken[gpu][index])
      return fail(err, errlen, "pools[%d].devices[%zu]: %s %d is already in another pool", k, i,
                  type, index);
    taken[gpu][index] = 1;
    pool->devices[pool->n_devices++] = index;
  }
  return 0;
}

int sched_pools_parse(const char *text, const sched_inventory *inv, sched_pool *pools,
                      int max_pools, char *err, size_t errlen) {
  json_error_t jerr;
  json_t *root = json_loads(text, 0, &jerr);
  if (!root) return fail(err, errlen, "not JSON: line %d: %s", jerr.line, jerr.text);
  int rc = -1;
  json_t *list = json_object_get(root, "pools");
  unsigned char taken[2][SCHED_MAX_DEVICES];
  memset(taken, 0, sizeof taken);
  if (!json_is_object(root) || json_object_size(root) != 1 || !json_is_array(list)) {
    fail(err, errlen, "pools: the file must be {\"pools\": [...]} and nothing else");
    goto done;
  }
  size_t n = json_array_size(list);
  if (n == 0 || n > (size_t)max_pools) {
    fail(err, errlen, "pools: must list 1 to %d pools, got %zu", max_pools, n);
    goto done;
  }
  for (size_t k = 0; k < n; k++) {
    if (parse_pool(json_array_get(list, k), (int)k, inv, taken, &pools[k], err, errlen) != 0)
      goto done;
    for (size_t j = 0; j < k; j++) {
      if (strcmp(pools[j].name, pools[k].name) == 0) {
        fail(err, errlen, "pools[%zu].name: \"%s\" is already the name of pools[%zu]", k,
             pools[k].name, j);
        goto done;
      }
    }
  }
  rc = (int)n;
done:
  json_decref(root);
  return rc;
}

int sched_pools_load(const char *path, const sched_inventory *inv, sched_pool *pools, int max_pools,
                     char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) return fail(err, errlen, "cannot read pools file %s: %s", path, strerror(errno));
  char text[64 * 1024];
  size_t got = fread(text, 1, sizeof text - 1, f);
  int too_big = !feof(f);
  fclose(f);
  if (too_big)
    return fail(err, errlen, "pools file %s: larger than %zu bytes", path, sizeof text - 1);
  text[got] = '\0';
  char why[400];
  int n = sched_pools_parse(text, inv, pools, max_pools, why, sizeof why);
  if (n < 0) return fail(err, errlen, "pools file %s: %s", path, why);
  return n;
}
