/* spec_json.c — a parsed job spec written back out in canonical form, every
 * default filled in. */
#include "spec_internal.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

/* ---- canonical JSON ---- */

static int max_real_digits(const json_t *value) {
  int most = 1;
  if (json_is_real(value)) return api_json_real_digits(json_real_value(value));
  if (json_is_array(value)) {
    for (size_t i = 0; i < json_array_size(value); i++) {
      int digits = max_real_digits(json_array_get(value, i));
      if (digits > most) most = digits;
    }
  } else if (json_is_object(value)) {
    const char *key;
    json_t *member_value;
    json_object_foreach((json_t *)value, key, member_value) {
      int digits = max_real_digits(member_value);
      if (digits > most) most = digits;
    }
  }
  return most;
}

/* Builds JSON with a sticky failure flag, so a long run of sets is checked
 * once at the end instead of after every call. */
typedef struct builder {
  int failed;
} builder;

static void put(builder *b, json_t *obj, const char *key, json_t *value) {
  if (!value || json_object_set_new(obj, key, value) != 0) b->failed = 1;
}

static void push(builder *b, json_t *array, json_t *value) {
  if (!value || json_array_append_new(array, value) != 0) b->failed = 1;
}

/* A string from a fixed-size field that a caller may not have terminated. */
static json_t *bounded_string(const char *text, size_t size) {
  return json_stringn(text, strnlen(text, size));
}

static json_t *pair_json(builder *b, const int *pair) {
  json_t *arr = json_array();
  for (int d = 0; arr && d < 2; d++) push(b, arr, json_integer(pair[d]));
  return arr;
}

static void put_schedule(builder *b, json_t *optimizer, const api_schedule *sc) {
  static const char *const names[] = {"constant", "step", "exponential", "cosine"};
  if (sc->type == API_SCHEDULE_CONSTANT && sc->warmup_steps == 0) return;
  if ((int)sc->type < 0 || sc->type > API_SCHEDULE_COSINE) {
    b->failed = 1;
    return;
  }
  json_t *o = json_object();
  put(b, o, "type", json_string(names[sc->type]));
  if (sc->warmup_steps > 0) put(b, o, "warmup_steps", json_integer(sc->warmup_steps));
  if (sc->type == API_SCHEDULE_STEP) {
    put(b, o, "step_size", json_integer(sc->step_size));
    put(b, o, "gamma", json_real(sc->gamma));
  } else if (sc->type == API_SCHEDULE_EXPONENTIAL) {
    put(b, o, "decay_steps", json_integer(sc->decay_steps));
    put(b, o, "decay_rate", json_real(sc->decay_rate));
    put(b, o, "staircase", json_boolean(sc->staircase));
  } else if (sc->type == API_SCHEDULE_COSINE) {
    put(b, o, "decay_steps", json_integer(sc->decay_steps));
    put(b, o, "alpha", json_real(sc->alpha));
  }
  put(b, optimizer, "schedule", o);
}

/* strategy: the type and that type's options, defaults included. */
static json_t *strategy_json(builder *b, const api_job_spec *spec) {
  json_t *strategy = json_object();
  if ((int)spec->strategy < 0 || spec->strategy > API_STRATEGY_PARAMETER_SERVER ||
      (int)spec->aggregation < 0 || spec->aggregation > API_AGGREGATE_WEIGHTED_MEAN) {
    b->failed = 1;
    return strategy;
  }
  put(b, strategy, "type", json_string(spec_strategy_names[spec->strategy]));
  if (spec->strategy == API_STRATEGY_MIRRORED)
    put(b, strategy, "replicas", json_integer(spec->replicas));
  if (spec->strategy == API_STRATEGY_MULTI_WORKER) {
    put(b, strategy, "workers", json_integer(spec->workers));
    put(b, strategy, "replicas_per_worker", json_integer(spec->replicas));
    put(b, strategy, "bucket_cap_mb", json_real(spec->bucket_cap_mb));
  }
  if (spec->strategy == API_STRATEGY_PARAMETER_SERVER) {
    put(b, strategy, "ps", json_integer(spec->ps_servers));
    put(b, strategy, "workers", json_integer(spec->workers));
    put(b, strategy, "mode", json_string(spec->ps_async ? "async" : "sync"));
    if (spec->ps_async && spec->max_staleness >= 0)
      put(b, strategy, "max_staleness", json_integer(spec->max_staleness));
  }
  if (spec->strategy != API_STRATEGY_SINGLE)
    put(b, strategy, "aggregation", json_string(spec_aggregation_names[spec->aggregation]));
  return strategy;
}

static json_t *callback_json(builder *b, const api_callback *cb, int plateau) {
  json_t *o = json_object();
  put(b, o, "monitor", bounded_string(cb->monitor, sizeof cb->monitor));
  put(b, o, "mode", json_string(cb->mode_max ? "max" : "min"));
  put(b, o, "min_delta", json_real(cb->min_delta));
  put(b, o, "patience", json_integer(cb->patience));
  if (plateau) {
    put(b, o, "factor", json_real(cb->factor));
    put(b, o, "cooldown", json_integer(cb->cooldown));
    put(b, o, "min_lr", json_real(cb->min_lr));
  }
  return o;
}

static json_t *layer_to_json(builder *b, const api_job_spec *spec, const api_layer *layer) {
  json_t *obj = json_object();
  if (!obj || (int)layer->type < 0 || layer->type > API_LAYER_CONCATENATE ||
      (int)layer->activation < 0 || layer->activation > API_ACT_TANH ||
      (int)layer->kernel_initializer < 0 || layer->kernel_initializer > API_INIT_ONES ||
      (int)layer->bias_initializer < 0 || layer->bias_initializer > API_INIT_ONES ||
      layer->n_inputs < 0 || layer->n_inputs > API_MAX_LAYER_INPUTS) {
    b->failed = 1;
    return obj;
  }
  put(b, obj, "type", json_string(spec_layer_types[layer->type]));
  put(b, obj, "name", bounded_string(layer->name, sizeof layer->name));
  if (layer->n_inputs > 0) {
    json_t *inputs = json_array();
    for (int k = 0; inputs && k < layer->n_inputs; k++) {
      int from = layer->inputs[k];
      if (from < -1 || from >= spec->n_layers) {
        b->failed = 1;
        break;
      }
      push(b, inputs,
           from < 0 ? json_string("input")
                    : bounded_string(spec->layers[from].name, sizeof spec->layers[from].name));
    }
    put(b, obj, "inputs", inputs);
  }
  switch (layer->type) {
  case API_LAYER_DENSE:
    put(b, obj, "units", json_integer(layer->units));
    put(b, obj, "activation", json_string(spec_activations[layer->activation]));
    put(b, obj, "use_bias", json_boolean(layer->use_bias));
    put(b, obj, "kernel_initializer", json_string(spec_initializers[layer->kernel_initializer]));
    put(b, obj, "bias_initializer", json_string(spec_initializers[layer->bias_initializer]));
    break;
  case API_LAYER_ACTIVATION:
    put(b, obj, "activation", json_string(spec_activations[layer->activation]));
    if (layer->activation == API_ACT_LEAKY_RELU || layer->activation == API_ACT_ELU)
      put(b, obj, "alpha", json_real(layer->alpha));
    break;
  case API_LAYER_CONV2D:
  case API_LAYER_DEPTHWISE_CONV2D:
  case API_LAYER_SEPARABLE_CONV2D:
    if (layer->type != API_LAYER_DEPTHWISE_CONV2D)
      put(b, obj, "filters", json_integer(layer->filters));
    put(b, obj, "kernel_size", pair_json(b, layer->kernel_size));
    put(b, obj, "strides", pair_json(b, layer->strides));
    put(b, obj, "padding", json_string(spec_paddings[layer->padding_same ? 1 : 0]));
    put(b, obj, "dilation_rate", pair_json(b, layer->dilation_rate));
    if (layer->type != API_LAYER_CONV2D)
      put(b, obj, "depth_multiplier", json_integer(layer->depth_multiplier));
    put(b, obj, "activation", json_string(spec_activations[layer->activation]));
    put(b, obj, "use_bias", json_boolean(layer->use_bias));
    if (layer->type == API_LAYER_CONV2D) {
      put(b, obj, "kernel_initializer", json_string(spec_initializers[layer->kernel_initializer]));
      put(b, obj, "bias_initializer", json_string(spec_initializers[layer->bias_initializer]));
    }
    break;
  case API_LAYER_BATCH_NORM:
    put(b, obj, "momentum", json_real(layer->momentum));
    put(b, obj, "epsilon", json_real(layer->epsilon));
    put(b, obj, "synchronized", json_boolean(layer->synchronized));
    break;
  case API_LAYER_DROPOUT: put(b, obj, "rate", json_real(layer->rate)); break;
  case API_LAYER_MAX_POOL2D:
  case API_LAYER_AVG_POOL2D:
    put(b, obj, "pool_size", pair_json(b, layer->pool_size));
    put(b, obj, "strides", pair_json(b, layer->strides));
    put(b, obj, "padding", json_string(spec_paddings[layer->padding_same ? 1 : 0]));
    break;
  case API_LAYER_CONCATENATE: put(b, obj, "axis", json_integer(layer->axis)); break;
  case API_LAYER_FLATTEN:
  case API_LAYER_RELU:
  case API_LAYER_GLOBAL_AVG_POOL2D:
  case API_LAYER_ADD: break;
  }
  if (layer->device < 0) put(b, obj, "device", json_string("cpu"));
  if (layer->device > 0) {
    char dev[24];
    snprintf(dev, sizeof dev, "cuda:%d", layer->device - 1);
    put(b, obj, "device", json_string(dev));
  }
  return obj;
}

char *api_spec_to_json(const api_job_spec *spec) {
  if (!spec || spec->input_ndim < 0 || spec->input_ndim > API_MAX_DIMS || spec->n_layers < 0 ||
      spec->n_layers > API_MAX_LAYERS || spec->seed > (uint64_t)LLONG_MAX)
    return NULL;
  builder b = {0};
  json_t *root = json_object();
  if (!root) return NULL;

  put(&b, root, "display_name", bounded_string(spec->display_name, sizeof spec->display_name));

  /* put() counts a NULL parent or value as a failure and frees the value. */
  json_t *model = json_object(), *shape = json_array(), *layers = json_array();
  for (int d = 0; shape && d < spec->input_ndim; d++)
    push(&b, shape, json_integer(spec->input_shape[d]));
  for (int i = 0; layers && i < spec->n_layers; i++)
    push(&b, layers, layer_to_json(&b, spec, &spec->layers[i]));
  put(&b, model, "input_shape", shape);
  put(&b, model, "layers", layers);
  put(&b, root, "model", model);

  put(&b, root, "loss", bounded_string(spec->loss, sizeof spec->loss));
  json_t *metrics = json_array();
  if (spec->metrics & API_METRIC_ACCURACY) push(&b, metrics, json_string("accuracy"));
  if (spec->metrics & API_METRIC_MSE) push(&b, metrics, json_string("mse"));
  if (spec->metrics & API_METRIC_MAE) push(&b, metrics, json_string("mae"));
  if ((spec->metrics & API_METRIC_TOP_K) && spec->top_k == 5) {
    push(&b, metrics, json_string("top_k_accuracy"));
  } else if (spec->metrics & API_METRIC_TOP_K) {
    json_t *top_k = json_object();
    put(&b, top_k, "type", json_string("top_k_accuracy"));
    put(&b, top_k, "k", json_integer(spec->top_k));
    push(&b, metrics, top_k);
  }
  put(&b, root, "metrics", metrics);

  json_t *dataset = json_object();
  put(&b, dataset, "name", bounded_string(spec->dataset, sizeof spec->dataset));
  put(&b, dataset, "validation", bounded_string(spec->validation, sizeof spec->validation));
  if (spec->validation_split > 0)
    put(&b, dataset, "validation_split", json_real(spec->validation_split));
  if (spec->shards_format) {
    put(&b, dataset, "format",
        json_string(spec->shards_format == API_SHARDS_TAR ? "tar" : "tfrecord"));
    json_t *features = json_object();
    put(&b, features, "image", bounded_string(spec->image_feature, sizeof spec->image_feature));
    put(&b, features, "label", bounded_string(spec->label_feature, sizeof spec->label_feature));
    put(&b, dataset, "features", features);
  }
  put(&b, root, "dataset", dataset);

  json_t *pipeline = json_object();
  put(&b, pipeline, "batch_size", json_integer(spec->batch_size));
  put(&b, pipeline, "shuffle", json_boolean(spec->shuffle));
  if (spec->shuffle_buffer > 0)
    put(&b, pipeline, "shuffle_buffer", json_integer((json_int_t)spec->shuffle_buffer));
  put(&b, pipeline, "normalize", json_boolean(spec->normalize));
  if (spec->n_standardize > 0 && spec->n_standardize <= API_MAX_CHANNELS) {
    json_t *st = json_object(), *mean = json_array(), *std = json_array();
    for (int i = 0; i < spec->n_standardize; i++) {
      push(&b, mean, json_real(spec->standardize_mean[i]));
      push(&b, std, json_real(spec->standardize_std[i]));
    }
    put(&b, st, "mean", mean);
    put(&b, st, "std", std);
    put(&b, pipeline, "standardize", st);
  } else {
    put(&b, pipeline, "standardize", json_boolean(spec->standardize));
  }
  json_t *augment = json_array();
  for (int k = 0; spec_augment_names[k]; k++) {
    unsigned bit = 1u << k;
    if (!(spec->augment & bit)) continue;
    if (bit == API_AUG_RANDOM_CROP || bit == API_AUG_RANDOM_BRIGHTNESS) {
      json_t *item = json_object();
      put(&b, item, "type", json_string(spec_augment_names[k]));
      if (bit == API_AUG_RANDOM_CROP)
        put(&b, item, "padding", json_integer(spec->crop_padding));
      else
        put(&b, item, "max_delta", json_real(spec->brightness_delta));
      push(&b, augment, item);
    } else {
      push(&b, augment, json_string(spec_augment_names[k]));
    }
  }
  put(&b, pipeline, "augment", augment);
  put(&b, pipeline, "drop_remainder", json_boolean(spec->drop_remainder));
  /* Streamed shards are cached only when the spec asks. */
  if (!spec->shards_format || spec->cache_given)
    put(&b, pipeline, "cache", json_string(spec->cache_file ? "file" : "memory"));
  put(&b, pipeline, "prefetch",
      spec->prefetch == API_AUTO ? json_string("auto") : json_integer(spec->prefetch));
  put(&b, pipeline, "num_parallel_calls",
      spec->num_parallel_calls == API_AUTO ? json_string("auto")
                                           : json_integer(spec->num_parallel_calls));
  if (spec->take >= 0) put(&b, pipeline, "take", json_integer((json_int_t)spec->take));
  if (spec->skip > 0) put(&b, pipeline, "skip", json_integer((json_int_t)spec->skip));
  if (spec->interleave_cycle_length > 0) {
    json_t *il = json_object();
    put(&b, il, "cycle_length", json_integer(spec->interleave_cycle_length));
    put(&b, il, "block_length", json_integer(spec->interleave_block_length));
    put(&b, pipeline, "interleave", il);
  }
  put(&b, pipeline, "one_hot", json_boolean(spec->one_hot));
  static const char *const cast_names[] = {"float32", "float16", "bfloat16"};
  if ((int)spec->cast < 0 || spec->cast > API_CAST_BFLOAT16)
    b.failed = 1;
  else
    put(&b, pipeline, "cast", json_string(cast_names[spec->cast]));
  if (spec->num_shards > 1) {
    json_t *sh = json_object();
    put(&b, sh, "num_shards", json_integer(spec->num_shards));
    put(&b, sh, "index", json_integer(spec->shard_index));
    put(&b, pipeline, "shard", sh);
  }
  put(&b, root, "pipeline", pipeline);

  json_t *optimizer = json_object();
  static const char *const opt_names[] = {"sgd", "adam", "adamw", "rmsprop", "adagrad"};
  if ((int)spec->optimizer < 0 || spec->optimizer > API_OPT_ADAGRAD) {
    b.failed = 1;
  } else {
    api_optimizer_type t = spec->optimizer;
    put(&b, optimizer, "type", json_string(opt_names[t]));
    put(&b, optimizer, "learning_rate", json_real(spec->learning_rate));
    put(&b, optimizer, "weight_decay", json_real(spec->weight_decay));
    if (t == API_OPT_SGD || t == API_OPT_RMSPROP)
      put(&b, optimizer, "momentum", json_real(spec->momentum));
    if (t == API_OPT_SGD) put(&b, optimizer, "nesterov", json_boolean(spec->nesterov));
    if (t == API_OPT_ADAM || t == API_OPT_ADAMW) {
      put(&b, optimizer, "beta_1", json_real(spec->beta_1));
      put(&b, optimizer, "beta_2", json_real(spec->beta_2));
    }
    if (t == API_OPT_RMSPROP) put(&b, optimizer, "rho", json_real(spec->rho));
    if (t == API_OPT_ADAGRAD)
      put(&b, optimizer, "initial_accumulator_value", json_real(spec->initial_accumulator_value));
    if (t != API_OPT_SGD) put(&b, optimizer, "epsilon", json_real(spec->epsilon));
    if (spec->global_clipnorm > 0)
      put(&b, optimizer, "global_clipnorm", json_real(spec->global_clipnorm));
    put_schedule(&b, optimizer, &spec->schedule);
  }
  put(&b, root, "optimizer", optimizer);

  put(&b, root, "gradient_accumulation_steps", json_integer(spec->accumulation_steps));
  if (spec->validation_every_steps > 0)
    put(&b, root, "validation_every_steps", json_integer(spec->validation_every_steps));
  if (spec->early_stopping.enabled || spec->plateau.enabled) {
    json_t *callbacks = json_object();
    if (spec->early_stopping.enabled)
      put(&b, callbacks, "early_stopping", callback_json(&b, &spec->early_stopping, 0));
    if (spec->plateau.enabled)
      put(&b, callbacks, "reduce_lr_on_plateau", callback_json(&b, &spec->plateau, 1));
    put(&b, root, "callbacks", callbacks);
  }
  if (spec->profile_first > 0) {
    json_t *profile = json_object(), *steps = json_array();
    push(&b, steps, json_integer(spec->profile_first));
    push(&b, steps, json_integer(spec->profile_last));
    put(&b, profile, "steps", steps);
    put(&b, root, "profile", profile);
  }
  put(&b, root, "epochs", json_integer(spec->epochs));
  put(&b, root, "log_every_steps", json_integer(spec->log_every_steps));
  if (spec->has_seed) put(&b, root, "seed", json_integer((json_int_t)spec->seed));
  put(&b, root, "priority", json_integer(spec->priority));
  put(&b, root, "max_restarts", json_integer(spec->max_restarts));
  put(&b, root, "max_runtime", json_integer(spec->max_runtime_s));
  if (spec->checkpoint_every_steps || spec->checkpoint_keep_last || spec->checkpoint_keep_best) {
    json_t *checkpoint = json_object();
    if (spec->checkpoint_every_steps)
      put(&b, checkpoint, "every_steps", json_integer(spec->checkpoint_every_steps));
    if (spec->checkpoint_keep_last)
      put(&b, checkpoint, "keep_last", json_integer(spec->checkpoint_keep_last));
    if (spec->checkpoint_keep_best) {
      put(&b, checkpoint, "keep_best", json_integer(spec->checkpoint_keep_best));
      put(&b, checkpoint, "monitor",
          bounded_string(spec->checkpoint_monitor, sizeof spec->checkpoint_monitor));
      put(&b, checkpoint, "mode", json_string(spec->checkpoint_mode_max ? "max" : "min"));
    }
    put(&b, root, "checkpoint", checkpoint);
  }

  /* Fields with a single accepted value are written out all the same, so
   * the canonical form shows every setting a job ran with. */
  json_t *resources = json_object();
  put(&b, resources, "device_type", bounded_string(spec->device_type, sizeof spec->device_type));
  put(&b, resources, "devices", json_integer(spec->devices));
  put(&b, resources, "pool", bounded_string(spec->pool, sizeof spec->pool));
  put(&b, root, "resources", resources);
  put(&b, root, "precision", bounded_string(spec->precision, sizeof spec->precision));
  put(&b, root, "recompute", json_boolean(spec->recompute));
  put(&b, root, "allow_tf32", json_boolean(spec->allow_tf32));
  put(&b, root, "strategy", strategy_json(&b, spec));

  char *text = NULL;
  if (!b.failed) text = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(max_real_digits(root)));
  json_decref(root);
  return text;
}
