/* plan.c — kiln-train --plan-only: the memory a spec's training plans
 * (parameters, gradients, optimizer state, the activation arena), made by
 * the engine's own builder and planner without allocating any of it, as
 * one JSON line. kilnd refuses at create a job that exceeds its budget. */
#include <stdio.h>

#include "worker.h"

void worker_optimizer_config(const api_job_spec *spec, kn_optimizer_config *out) {
  static const kn_optimizer_type types[] = {[API_OPT_SGD] = KN_OPT_SGD,
                                            [API_OPT_ADAM] = KN_OPT_ADAM,
                                            [API_OPT_ADAMW] = KN_OPT_ADAMW,
                                            [API_OPT_RMSPROP] = KN_OPT_RMSPROP,
                                            [API_OPT_ADAGRAD] = KN_OPT_ADAGRAD};
  out->type = types[spec->optimizer];
  out->weight_decay = (float)spec->weight_decay;
  out->rho = (float)spec->rho;
  out->initial_accumulator_value = (float)spec->initial_accumulator_value;
  out->learning_rate = (float)spec->learning_rate;
  out->momentum = (float)spec->momentum;
  out->nesterov = spec->nesterov;
  out->beta1 = (float)spec->beta_1;
  out->beta2 = (float)spec->beta_2;
  out->epsilon = (float)spec->epsilon;
}

int worker_plan(const api_job_spec *spec, char *line, size_t len, char *err, size_t errlen) {
  kn_layer_config layers[API_MAX_LAYERS];
  kn_model_config mc;
  worker_model_config(spec, layers, &mc);
  kn_model model;
  kn_plan_stats stats;
  int rc = kn_model_build(&mc, &model, err, errlen);
  if (rc) return -1;
  kn_graph_set_plan_only(model.graph);
  rc = kn_model_compile(&model, &mc, spec->seed, &stats, err, errlen);
  size_t params = rc ? 0 : kn_param_count(model.graph);
  kn_model_free(&model);
  if (rc) return -1;
  kn_optimizer_config opt = {0};
  worker_optimizer_config(spec, &opt);
  const unsigned long long optimizer_bytes =
      (unsigned long long)kn_optimizer_state_floats(&opt, params) * sizeof(float);
  /* Each replica is a whole model (parameters, gradients, arena); each
   * process keeps one optimizer; multi-process strategies run that many
   * processes on the job's devices. */
  const unsigned long long replica = (unsigned long long)stats.param_bytes +
                                     (unsigned long long)stats.grad_bytes +
                                     (unsigned long long)stats.arena_bytes;
  const unsigned long long process = replica * (unsigned long long)spec->replicas + optimizer_bytes;
  int processes = 1;
  if (spec->strategy == API_STRATEGY_MULTI_WORKER) processes = spec->workers;
  if (spec->strategy == API_STRATEGY_PARAMETER_SERVER) processes = spec->workers + spec->ps_servers;
  snprintf(line, len,
           "{\"plan\":{\"parameters\":%llu,\"param_bytes\":%llu,\"grad_bytes\":%llu,"
           "\"optimizer_bytes\":%llu,\"arena_bytes\":%llu,\"replicas\":%d,\"processes\":%d,"
           "\"total_bytes\":%llu}}",
           (unsigned long long)params, (unsigned long long)stats.param_bytes,
           (unsigned long long)stats.grad_bytes, optimizer_bytes,
           (unsigned long long)stats.arena_bytes, spec->replicas, processes,
           process * (unsigned long long)processes);
  return 0;
}
