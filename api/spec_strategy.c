/* spec_strategy.c — the job spec's resources and strategy: devices and pool,
 * replicas, workers and parameter servers, and what they need of each other. */
#include "spec_internal.h"

#include <stdio.h>
#include <string.h>

static int valid_pool_name(const char *name) {
  size_t n = strlen(name);
  if (n == 0 || n >= sizeof((api_job_spec *)0)->pool) return 0;
  for (size_t i = 0; i < n; i++) {
    char ch = name[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '-' || ch == '_' || ch == '.'))
      return 0;
  }
  return 1;
}

void spec_parse_resources(checker *c, json_t *obj, api_job_spec *spec) {
  scope s = {c, obj, "resources"};
  static const char *const fields[] = {"device_type", "devices", "pool", NULL};
  spec_refuse_unknown(&s, fields);
  char quoted[64];
  const char *device_type = spec_get_string(&s, "device_type", OPTIONAL);
  if (device_type && strcmp(device_type, "cpu") != 0 && strcmp(device_type, "gpu") != 0)
    spec_problem(c, "resources.device_type", "must be cpu or gpu, got '%s'",
                 spec_clip(device_type, quoted, sizeof quoted));
  else if (device_type)
    spec_copy_text(spec->device_type, sizeof spec->device_type, device_type);
  /* How many devices a pool has is the scheduler's to say: a job asking
   * for more than its pool holds is refused at create (FAILED_PRECONDITION). */
  spec_get_int(&s, "devices", OPTIONAL, 1, API_MAX_DEVICES, &spec->devices);
  const char *pool = spec_get_string(&s, "pool", OPTIONAL);
  if (pool && !valid_pool_name(pool))
    spec_problem(
        c, "resources.pool",
        "must be 1 to %zu characters of A-Z a-z 0-9 - _ . (a pool of kilnd's --pools), got "
        "'%s'",
        sizeof spec->pool - 1, spec_clip(pool, quoted, sizeof quoted));
  else if (pool)
    spec_copy_text(spec->pool, sizeof spec->pool, pool);
  else if (strcmp(spec->device_type, "gpu") == 0) /* kilnd's pool of every GPU */
    spec_copy_text(spec->pool, sizeof spec->pool, "gpu");
}

/* A GPU job: its replicas run on their GPUs (the ops the CUDA backend has
 * kernels for; the others on the host), one GPU each, gradients summed by
 * NCCL; in any precision (mixed precision's GEMMs on tensor cores). */
void spec_check_gpu(checker *c, const api_job_spec *spec) {
  if (strcmp(spec->device_type, "gpu") != 0) return;
  if (spec->strategy == API_STRATEGY_PARAMETER_SERVER)
    spec_problem(
        c, "resources.device_type",
        "parameter_server runs its servers and workers on CPU cores; on GPUs use mirrored or "
        "multi_worker");
}

/* Model parallelism: a layer's "device" names one of the job's GPUs, of a
 * job that trains one replica. */
void spec_check_layer_devices(checker *c, const api_job_spec *spec) {
  const int gpu = strcmp(spec->device_type, "gpu") == 0;
  for (int i = 0; i < spec->n_layers; i++) {
    const int k = spec->layers[i].device - 1;
    if (k < 0) continue; /* the job's device, or the host */
    char field[PATH_LEN];
    snprintf(field, sizeof field, "model.layers[%d].device", i);
    if (spec->strategy != API_STRATEGY_SINGLE)
      spec_problem(c, field,
                   "places a layer on one of the job's GPUs, and strategy '%s' runs a replica on "
                   "each device: model parallelism trains with strategy single",
                   spec_strategy_names[spec->strategy]);
    else if (!gpu)
      spec_problem(c, field,
                   "names cuda:%d, a GPU, but the job runs on CPU cores (resources.device_type "
                   "cpu); set resources.device_type gpu",
                   k);
    else if (k >= spec->devices)
      spec_problem(c, field,
                   "names cuda:%d, but the job holds %d GPU%s (resources.devices): cuda:0 to "
                   "cuda:%d",
                   k, spec->devices, spec->devices == 1 ? "" : "s", spec->devices - 1);
  }
}

const char *const spec_strategy_names[] = {"single", "mirrored", "multi_worker", "parameter_server",
                                           NULL};
const char *const spec_aggregation_names[] = {"mean", "sum", "weighted_mean", NULL};

/* parameter_server: ps servers and workers (each process one rank), the
 * mode, and in async mode how far a worker may run ahead. */
static void parse_parameter_server(checker *c, scope *s, api_job_spec *spec) {
  char quoted[64];
  spec_get_int(s, "ps", REQUIRED, 1, API_MAX_REPLICAS, &spec->ps_servers);
  spec_get_int(s, "workers", REQUIRED, 1, API_MAX_REPLICAS, &spec->workers);
  if (spec->ps_servers + spec->workers > API_MAX_REPLICAS)
    spec_problem(c, "strategy.ps", "workers + ps must be at most %d, got %d + %d", API_MAX_REPLICAS,
                 spec->workers, spec->ps_servers);
  const char *mode = spec_get_string(s, "mode", OPTIONAL);
  if (mode && strcmp(mode, "sync") != 0 && strcmp(mode, "async") != 0)
    spec_problem(c, "strategy.mode", "must be sync or async, got '%s'",
                 spec_clip(mode, quoted, sizeof quoted));
  spec->ps_async = mode && strcmp(mode, "async") == 0;
  if (json_object_get(s->obj, "max_staleness")) {
    if (!spec->ps_async)
      spec_problem(c, "strategy.max_staleness",
                   "applies to mode async only (sync waits for every worker each step)");
    else
      spec_get_int(s, "max_staleness", OPTIONAL, 0, 1000000, &spec->max_staleness);
  }
}

/* strategy: the type, and the options that type takes; an option of
 * another type is refused by name rather than ignored. */
void spec_parse_strategy(checker *c, json_t *obj, api_job_spec *spec) {
  scope s = {c, obj, "strategy"};
  static const char *const fields[] = {
      "type",          "replicas", "workers", "replicas_per_worker", "aggregation",
      "bucket_cap_mb", "ps",       "mode",    "max_staleness",       NULL};
  enum { MIRRORED = 1u << API_STRATEGY_MIRRORED, MULTI = 1u << API_STRATEGY_MULTI_WORKER };
  enum { PS = 1u << API_STRATEGY_PARAMETER_SERVER };
  /* which types take each field after "type": bit (1 << api_strategy) */
  static const unsigned takes[] = {MIRRORED, MULTI | PS, MULTI, MIRRORED | MULTI | PS,
                                   MULTI,    PS,         PS,    PS};
  spec_refuse_unknown(&s, fields);
  char quoted[64];
  const char *type = spec_get_string(&s, "type", REQUIRED);
  if (!type) return;
  int t = spec_pick(type, spec_strategy_names);
  if (t < 0) {
    spec_problem(c, "strategy.type",
                 "unsupported strategy '%s'; supported: single, mirrored, multi_worker, "
                 "parameter_server",
                 spec_clip(type, quoted, sizeof quoted));
    return;
  }
  spec->strategy = (api_strategy)t;
  for (int i = 1; fields[i]; i++) {
    if (!json_object_get(obj, fields[i]) || (takes[i - 1] & (1u << t))) continue;
    char path[PATH_LEN];
    spec_join_path(path, "strategy", fields[i]);
    spec_problem(c, path, "does not apply to strategy '%s'", type);
  }
  if (t == API_STRATEGY_MIRRORED)
    spec_get_int(&s, "replicas", REQUIRED, 1, API_MAX_REPLICAS, &spec->replicas);
  if (t == API_STRATEGY_MULTI_WORKER) {
    spec_get_int(&s, "workers", REQUIRED, 1, API_MAX_REPLICAS, &spec->workers);
    spec_get_int(&s, "replicas_per_worker", OPTIONAL, 1, API_MAX_REPLICAS, &spec->replicas);
    if ((long long)spec->workers * spec->replicas > API_MAX_REPLICAS)
      spec_problem(c, "strategy.replicas_per_worker",
                   "workers x replicas_per_worker must be at most %d, got %d x %d",
                   API_MAX_REPLICAS, spec->workers, spec->replicas);
    if (spec_get_number(&s, "bucket_cap_mb", OPTIONAL, &spec->bucket_cap_mb) == 1 &&
        !(spec->bucket_cap_mb > 0 && spec->bucket_cap_mb <= 1024))
      spec_problem(c, "strategy.bucket_cap_mb", "must be > 0 and <= 1024, got %g",
                   spec->bucket_cap_mb);
  }
  if (t == API_STRATEGY_PARAMETER_SERVER) parse_parameter_server(c, &s, spec);
  const char *aggregation =
      t == API_STRATEGY_SINGLE ? NULL : spec_get_string(&s, "aggregation", OPTIONAL);
  int a = aggregation ? spec_pick(aggregation, spec_aggregation_names) : 0;
  if (a < 0)
    spec_problem(c, "strategy.aggregation",
                 "unsupported aggregation '%s'; supported: mean, sum, weighted_mean",
                 spec_clip(aggregation, quoted, sizeof quoted));
  else
    spec->aggregation = (api_aggregation)a;
}

/* A replicated job holds a core per replica: resources.devices is
 * replicas x workers unless the spec asks for more. Loss scaling keeps
 * its scale on one graph, so mixed_float16 trains one replica for now. */
void spec_check_strategy_resources(checker *c, json_t *resources, api_job_spec *spec) {
  const int needed = spec->replicas * spec->workers + spec->ps_servers;
  const char *each = strcmp(spec->device_type, "gpu") == 0 ? "a GPU" : "a core";
  if (!resources || !json_object_get(resources, "devices"))
    spec->devices = needed;
  else if (spec->devices < needed && spec->strategy == API_STRATEGY_PARAMETER_SERVER)
    spec_problem(
        c, "resources.devices",
        "must be at least workers + ps = %d for this strategy (a core per process), got %d", needed,
        spec->devices);
  else if (spec->devices < needed)
    spec_problem(
        c, "resources.devices",
        "must be at least replicas x workers = %d for this strategy (%s per replica), got %d",
        needed, each, spec->devices);
  /* In sync mode each server holds a shard of the step's gradient only. */
  if (spec->strategy == API_STRATEGY_PARAMETER_SERVER && !spec->ps_async &&
      spec->global_clipnorm > 0)
    spec_problem(c, "optimizer.global_clipnorm",
                 "needs the whole gradient, which no process of a parameter_server sync job holds; "
                 "use mode async (each worker clips its own), or multi_worker");
  /* Synchronized batch norm sums over every worker's step. */
  for (int i = 0;
       i < spec->n_layers && spec->strategy == API_STRATEGY_PARAMETER_SERVER && spec->ps_async;
       i++) {
    char field[PATH_LEN];
    snprintf(field, sizeof field, "model.layers[%d].synchronized", i);
    if (spec->layers[i].type == API_LAYER_BATCH_NORM && spec->layers[i].synchronized)
      spec_problem(
          c, field,
          "needs every replica's step at once, and parameter_server mode async workers step "
          "alone; use mode sync, or leave batch norm unsynchronized");
  }
  if (strcmp(spec->precision, "mixed_float16") == 0)
    spec_problem(c, "precision",
                 "mixed_float16 (dynamic loss scaling) runs with strategy 'single' only for now; "
                 "mixed_bfloat16 works with every strategy");
}
