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

const char *sched_pool_kind_name(sched_pool_kind k) {
  switch (k) {
  case SCHED_POOL_LOCAL: return "local";
  case SCHED_POOL_AGENTS: return "agents";
  case SCHED_POOL_SLURM: return "slurm";
  }
  return "local";
}

/* The fields each kind of pool takes, in the order an error lists them. */
static const char *const kind_fields[3] = {
    "name, kind, device_type, devices",
    "name, kind, device_type, grace_s, start_timeout_s, network, shared_data",
    "name, kind, device_type, partition, nodes, cpus_per_node, kilnd_url",
};

static int known_field(sched_pool_kind kind, const char *key) {
  const char *list = kind_fields[kind];
  size_t n = strlen(key);
  for (const char *at = strstr(list, key); at; at = strstr(at + 1, key))
    if ((at == list || at[-1] == ' ') && (at[n] == ',' || at[n] == '\0')) return 1;
  return 0;
}

/* An optional integer field in lo..hi; absent leaves *out as it is. */
static int int_field(json_t *obj, const char *key, int lo, int hi, int *out, const char *pool,
                     char *err, size_t errlen) {
  json_t *v = json_object_get(obj, key);
  if (!v) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
    return fail(err, errlen, "pool '%s': %s must be a whole number from %d to %d", pool, key, lo,
                hi);
  *out = (int)json_integer_value(v);
  return 0;
}

/* An optional string field of 1..len-1 characters; required when asked. */
static int text_field(json_t *obj, const char *within, const char *key, int required, char *out,
                      size_t len, const char *pool, char *err, size_t errlen) {
  json_t *v = json_object_get(obj, key);
  if (!v && !required) return 0;
  const char *text = json_string_value(v);
  if (!text || !text[0] || strlen(text) >= len)
    return fail(err, errlen, "pool '%s': %s%s must be a string of 1 to %zu characters%s", pool,
                within, key, len - 1, v ? "" : " (required for this kind of pool)");
  snprintf(out, len, "%s", text);
  return 0;
}

/* An agents pool: its devices are its agents', so only how it treats them. */
static int parse_agents_pool(json_t *obj, sched_pool *pool, char *err, size_t errlen) {
  pool->grace_s = 25;
  pool->start_timeout_s = 60;
  if (int_field(obj, "grace_s", 1, 3600, &pool->grace_s, pool->name, err, errlen) ||
      int_field(obj, "start_timeout_s", 1, 3600, &pool->start_timeout_s, pool->name, err, errlen))
    return -1;
  json_t *net = json_object_get(obj, "network");
  if (net && !json_is_null(net)) {
    if (!json_is_object(net))
      return fail(err, errlen, "pool '%s': network must be an object", pool->name);
    const char *key;
    json_t *value;
    json_object_foreach(net, key, value) {
      if (strcmp(key, "oob_tcp_if_include") && strcmp(key, "btl_tcp_if_include") &&
          strcmp(key, "nccl_socket_ifname"))
        return fail(err, errlen,
                    "pool '%s': network.%.64s: unknown field (known: oob_tcp_if_include, "
                    "btl_tcp_if_include, nccl_socket_ifname)",
                    pool->name, key);
    }
    if (text_field(net, "network.", "oob_tcp_if_include", 0, pool->oob_tcp_if_include,
                   sizeof pool->oob_tcp_if_include, pool->name, err, errlen) ||
        text_field(net, "network.", "btl_tcp_if_include", 0, pool->btl_tcp_if_include,
                   sizeof pool->btl_tcp_if_include, pool->name, err, errlen) ||
        text_field(net, "network.", "nccl_socket_ifname", 0, pool->nccl_socket_ifname,
                   sizeof pool->nccl_socket_ifname, pool->name, err, errlen))
      return -1;
  }
  json_t *shared = json_object_get(obj, "shared_data");
  if (shared && !json_is_null(shared)) {
    const char *path = json_string_value(shared);
    if (!path || path[0] != '/' || strlen(path) >= sizeof pool->shared_data)
      return fail(err, errlen,
                  "pool '%s': shared_data must be null or an absolute path every host mounts",
                  pool->name);
    snprintf(pool->shared_data, sizeof pool->shared_data, "%s", path);
  }
  return 0;
}

/* A Slurm pool: where to submit and how large an allocation is. */
static int parse_slurm_pool(json_t *obj, sched_pool *pool, char *err, size_t errlen) {
  if (text_field(obj, "", "partition", 1, pool->partition, sizeof pool->partition, pool->name, err,
                 errlen) ||
      text_field(obj, "", "kilnd_url", 1, pool->kilnd_url, sizeof pool->kilnd_url, pool->name, err,
                 errlen))
    return -1;
  if (strncmp(pool->kilnd_url, "http://", 7) && strncmp(pool->kilnd_url, "https://", 8))
    return fail(err, errlen, "pool '%s': kilnd_url must start with http:// or https://",
                pool->name);
  if (!json_object_get(obj, "nodes") || !json_object_get(obj, "cpus_per_node"))
    return fail(err, errlen, "pool '%s': %s is required for a slurm pool", pool->name,
                json_object_get(obj, "nodes") ? "cpus_per_node" : "nodes");
  if (int_field(obj, "nodes", 1, SCHED_MAX_HOSTS, &pool->nodes, pool->name, err, errlen) ||
      int_field(obj, "cpus_per_node", 1, SCHED_MAX_DEVICES, &pool->cpus_per_node, pool->name, err,
                errlen))
    return -1;
  if (pool->nodes * pool->cpus_per_node > SCHED_MAX_DEVICES)
    return fail(err, errlen, "pool '%s': nodes x cpus_per_node must be at most %d", pool->name,
                SCHED_MAX_DEVICES);
  /* Its devices are the allocation's: nodes x cpus_per_node slots. */
  pool->n_devices = pool->nodes * pool->cpus_per_node;
  for (int i = 0; i < pool->n_devices; i++) pool->devices[i] = i;
  return 0;
}

/* One entry of "pools": its devices, each of the type's inventory and not
 * already in a pool (taken[] marks them). */
static int parse_pool(json_t *obj, int k, const sched_inventory *inv,
                      unsigned char taken[2][SCHED_MAX_DEVICES], sched_pool *pool, char *err,
                      size_t errlen) {
  if (!json_is_object(obj)) return fail(err, errlen, "pools[%d]: must be an object", k);
  const char *name = json_string_value(json_object_get(obj, "name"));
  if (!name || !valid_pool_name(name))
    return fail(err, errlen,
                "pools[%d].name: must be 1 to 31 characters of A-Z a-z 0-9 - _ . (got %s)", k,
                name ? "an invalid name" : "none");
  memset(pool, 0, sizeof *pool);
  snprintf(pool->name, sizeof pool->name, "%s", name);
  json_t *kind_json = json_object_get(obj, "kind");
  const char *kind = kind_json ? json_string_value(kind_json) : "local";
  if (!kind || (strcmp(kind, "local") && strcmp(kind, "agents") && strcmp(kind, "slurm")))
    return fail(err, errlen,
                "pools[%d].kind: pool '%s': kind must be \"local\", \"agents\" or \"slurm\"", k,
                name);
  pool->kind = kind[0] == 'a'   ? SCHED_POOL_AGENTS
               : kind[0] == 's' ? SCHED_POOL_SLURM
                                : SCHED_POOL_LOCAL;
  const char *key;
  json_t *value;
  json_object_foreach(obj, key, value) {
    if (!known_field(pool->kind, key))
      return fail(err, errlen, "pools[%d].%.64s: unknown field for a %s pool (known: %s)", k, key,
                  kind, kind_fields[pool->kind]);
  }
  json_t *type_json = json_object_get(obj, "device_type");
  const char *type = type_json ? json_string_value(type_json) : "cpu";
  if (!type || (strcmp(type, "cpu") && strcmp(type, "gpu")))
    return fail(err, errlen, "pools[%d].device_type: must be \"cpu\" or \"gpu\"", k);
  snprintf(pool->device_type, sizeof pool->device_type, "%s", type);
  if (pool->kind != SCHED_POOL_LOCAL) {
    char why[300];
    int rc = pool->kind == SCHED_POOL_AGENTS ? parse_agents_pool(obj, pool, why, sizeof why)
                                             : parse_slurm_pool(obj, pool, why, sizeof why);
    return rc ? fail(err, errlen, "pools[%d]: %s", k, why) : 0;
  }
  int gpu = type[0] == 'g';
  int have = gpu ? inv->gpus : inv->cpus;
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
