/* start.c — a `start` command's JSON read into an ag_start, each field
 * checked and named when wrong: the allocation and its token, the spec (and
 * how many processes its strategy runs), data set, resume, cores and GPUs,
 * mpirun's hosts and network, and the variables kilnd sets. */
#define _GNU_SOURCE /* CPU_SETSIZE */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"

static int copy_str(const json_t *obj, const char *key, char *out, size_t len, int required,
                    char *err, size_t errlen) {
  const json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) {
    if (!required) return 0;
    snprintf(err, errlen, "start: field %s is missing", key);
    return -1;
  }
  if (!json_is_string(v) || json_string_length(v) >= len) {
    snprintf(err, errlen, "start: field %s must be a string under %zu bytes", key, len);
    return -1;
  }
  snprintf(out, len, "%s", json_string_value(v));
  return 0;
}

static int copy_ints(const json_t *arr, int *out, int max, int *n, const char *key, char *err,
                     size_t errlen) {
  *n = 0;
  if (!arr || json_is_null(arr)) return 0;
  size_t i;
  const json_t *v;
  if (!json_is_array(arr) || json_array_size(arr) > (size_t)max) {
    snprintf(err, errlen, "start: field %s must be an array of at most %d integers", key, max);
    return -1;
  }
  json_array_foreach(arr, i, v) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= CPU_SETSIZE) {
      snprintf(err, errlen, "start: %s[%zu] must be a non-negative integer", key, i);
      return -1;
    }
    out[(*n)++] = (int)json_integer_value(v);
  }
  return 0;
}

static int parse_mpi(const json_t *mpi, ag_start *st, char *err, size_t errlen) {
  const json_t *np = json_object_get(mpi, "np"), *hosts = json_object_get(mpi, "hosts");
  if (!json_is_integer(np) || json_integer_value(np) < 1 || !json_is_array(hosts) ||
      json_array_size(hosts) < 1 || json_array_size(hosts) > AG_MAX_HOSTS) {
    snprintf(err, errlen, "start: mpi needs np >= 1 and 1 to %d hosts", AG_MAX_HOSTS);
    return -1;
  }
  st->np = (int)json_integer_value(np);
  size_t i;
  const json_t *h;
  json_array_foreach(hosts, i, h) {
    ag_mpi_host *out = &st->hosts[st->n_hosts++];
    const json_t *slots = json_object_get(h, "slots");
    if (copy_str(h, "name", out->name, sizeof out->name, 1, err, errlen) ||
        copy_str(h, "address", out->address, sizeof out->address, 0, err, errlen))
      return -1;
    out->slots = json_is_integer(slots) ? (int)json_integer_value(slots) : 1;
    if (out->slots < 1) {
      snprintf(err, errlen, "start: mpi.hosts[%zu].slots must be >= 1", i);
      return -1;
    }
  }
  const json_t *net = json_object_get(mpi, "network");
  if (net && json_is_object(net) &&
      (copy_str(net, "oob_tcp_if_include", st->oob_if, sizeof st->oob_if, 0, err, errlen) ||
       copy_str(net, "btl_tcp_if_include", st->btl_if, sizeof st->btl_if, 0, err, errlen) ||
       copy_str(net, "nccl_socket_ifname", st->nccl_if, sizeof st->nccl_if, 0, err, errlen)))
    return -1;
  return 0;
}

/* How many kiln-train processes the spec's strategy runs under mpirun
 * (multi_worker: workers; parameter_server: workers + servers); 0 for one
 * process, as kilnd's runner counts them. */
static int spec_processes(const json_t *spec) {
  const json_t *strategy = json_object_get(spec, "strategy");
  const char *type = json_string_value(json_object_get(strategy, "type"));
  const json_t *workers = json_object_get(strategy, "workers"),
               *ps = json_object_get(strategy, "ps");
  if (!type || !json_is_integer(workers)) return 0;
  if (strcmp(type, "multi_worker") == 0) return (int)json_integer_value(workers);
  if (strcmp(type, "parameter_server") == 0)
    return (int)(json_integer_value(workers) + (json_is_integer(ps) ? json_integer_value(ps) : 0));
  return 0;
}

int ag_start_parse(const json_t *cmd, ag_start *st, char *err, size_t errlen) {
  memset(st, 0, sizeof *st);
  if (copy_str(cmd, "alloc", st->alloc, sizeof st->alloc, 1, err, errlen) ||
      copy_str(cmd, "token", st->token, sizeof st->token, 1, err, errlen) ||
      copy_str(cmd, "job", st->job, sizeof st->job, 0, err, errlen))
    return -1;
  const json_t *attempt = json_object_get(cmd, "attempt"), *spec = json_object_get(cmd, "spec");
  st->attempt = json_is_integer(attempt) ? (int)json_integer_value(attempt) : 0;
  if (!json_is_object(spec)) {
    snprintf(err, errlen, "start: field spec must be the job's spec (an object)");
    return -1;
  }
  st->spec_json = json_dumps(spec, JSON_COMPACT);
  const json_t *ds = json_object_get(cmd, "dataset");
  if (ds && json_is_object(ds)) {
    st->has_dataset = 1;
    if (copy_str(ds, "name", st->dataset_name, sizeof st->dataset_name, 0, err, errlen) ||
        copy_str(ds, "sha256", st->dataset_sha256, sizeof st->dataset_sha256, 0, err, errlen))
      return -1;
  }
  st->resume = json_is_true(json_object_get(cmd, "resume"));
  if (copy_ints(json_object_get(cmd, "cores"), st->cores, AG_MAX_CORES, &st->n_cores, "cores", err,
                errlen) ||
      copy_ints(json_object_get(cmd, "gpus"), st->gpus, AG_MAX_CORES, &st->n_gpus, "gpus", err,
                errlen))
    return -1;
  const json_t *mpi = json_object_get(cmd, "mpi");
  if (mpi && json_is_object(mpi) && parse_mpi(mpi, st, err, errlen)) return -1;
  const json_t *env = json_object_get(cmd, "env");
  const char *key;
  const json_t *value;
  if (env && json_is_object(env)) json_object_foreach((json_t *)env, key, value) {
      if (!json_is_string(value) || st->n_env == AG_MAX_ENV || !key[0] || strchr(key, '=')) {
        snprintf(err, errlen, "start: env.%s must be a string (at most %d variables)", key,
                 AG_MAX_ENV);
        return -1;
      }
      st->env[st->n_env++] = cli_printf("%s=%s", key, json_string_value(value));
      if (strcmp(key, "KILN_SHARED_DATA") == 0 && json_string_length(value) > 0)
        st->shared_data = st->env[st->n_env - 1] + strlen("KILN_SHARED_DATA=");
    }
  st->processes = spec_processes(spec);
  return 0;
}

void ag_start_clear(ag_start *st) {
  free(st->spec_json);
  for (int i = 0; i < st->n_env; i++) free(st->env[i]);
  memset(st, 0, sizeof *st);
}
