/* spec.c — the job spec: parse and validate a JSON body into api_job_spec,
 * reporting every problem with its JSON path. The top level and the checks
 * across sections are here; each section has its own spec_<section>.c, and
 * spec_json.c writes a spec back out in canonical form. */
#include "spec_internal.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

/* profile: {"steps": [first, last]}, optimizer steps to record. */
static void parse_profile(checker *c, json_t *obj, api_job_spec *spec) {
  scope s = {c, obj, "profile"};
  static const char *const fields[] = {"steps", NULL};
  spec_refuse_unknown(&s, fields);
  json_t *steps = spec_get_array(&s, "steps", REQUIRED);
  if (!steps) return;
  long long first, last;
  if (json_array_size(steps) != 2 || !spec_as_integer(json_array_get(steps, 0), &first) ||
      !spec_as_integer(json_array_get(steps, 1), &last)) {
    spec_problem(c, "profile.steps", "must be [first, last], two step numbers");
    return;
  }
  if (first < 1 || last < first || last - first >= API_MAX_PROFILE_STEPS || last > 1000000000)
    spec_problem(c, "profile.steps",
                 "must be 1 <= first <= last with at most %d steps, got [%lld, %lld]",
                 API_MAX_PROFILE_STEPS, first, last);
  else {
    spec->profile_first = (int)first;
    spec->profile_last = (int)last;
  }
}

static void parse_spec(checker *c, json_t *root, api_job_spec *spec, keras_paths *kp) {
  scope s = {c, root, ""};
  static const char *const fields[] = {"display_name",
                                       "model",
                                       "keras_model",
                                       "loss",
                                       "metrics",
                                       "dataset",
                                       "pipeline",
                                       "optimizer",
                                       "epochs",
                                       "log_every_steps",
                                       "seed",
                                       "priority",
                                       "resources",
                                       "precision",
                                       "recompute",
                                       "allow_tf32",
                                       "strategy",
                                       "max_restarts",
                                       "max_runtime",
                                       "checkpoint",
                                       "callbacks",
                                       "gradient_accumulation_steps",
                                       "validation_every_steps",
                                       "profile",
                                       NULL};
  spec_refuse_unknown(&s, fields);
  char quoted[64];

  const char *display_name = spec_get_string(&s, "display_name", OPTIONAL);
  if (display_name) {
    size_t len = strlen(display_name);
    if (len < 1 || len >= sizeof spec->display_name)
      spec_problem(c, "display_name", "must be 1 to %zu bytes long, got %zu",
                   sizeof spec->display_name - 1, len);
    else
      spec_copy_text(spec->display_name, sizeof spec->display_name, display_name);
  }

  /* The model: kiln's own section, or a Keras model's to_json() translated
   * into one; either way spec_parse_model checks it. */
  json_t *model = spec_get_object(&s, "model", OPTIONAL);
  json_t *keras_model = spec_get_object(&s, "keras_model", OPTIONAL);
  if (model && keras_model) {
    spec_problem(c, "keras_model", "give model or keras_model, not both");
  } else if (keras_model) {
    json_t *translated = spec_keras_translate(c, keras_model, kp);
    if (translated) spec_parse_model(c, translated, spec);
    json_decref(translated);
  } else if (model) {
    spec_parse_model(c, model, spec);
  } else if (!json_object_get(root, "model") && !json_object_get(root, "keras_model")) {
    spec_problem(c, "model", "is required (or keras_model: a Keras model's to_json())");
  }

  const char *loss = spec_get_string(&s, "loss", REQUIRED);
  int loss_index = loss ? spec_pick(loss, spec_loss_names) : -1;
  if (loss && loss_index < 0) {
    spec_problem(c, "loss",
                 "unsupported loss '%s'; supported: sparse_categorical_crossentropy, "
                 "categorical_crossentropy, binary_crossentropy, mse, mae",
                 spec_clip(loss, quoted, sizeof quoted));
  } else if (loss) {
    spec->loss_type = spec_loss_of_name[loss_index];
    spec_copy_text(spec->loss, sizeof spec->loss, spec_loss_names[spec->loss_type]);
  }

  json_t *metrics = spec_get_array(&s, "metrics", OPTIONAL);
  int metric_at[4] = {0, 0, 0, 0}; /* where each metric was named, for messages */
  for (size_t i = 0; metrics && i < json_array_size(metrics); i++) {
    json_t *metric = json_array_get(metrics, i);
    char path[PATH_LEN];
    spec_index_path(path, "metrics", i);
    const char *name = spec_parse_metric(c, metric, path, spec);
    if (!name) continue;
    if (!spec_metric_bit(name)) {
      spec_problem(c, path,
                   "unsupported metric '%s'; supported: accuracy, mse, mae, top_k_accuracy (or "
                   "{\"type\": \"top_k_accuracy\", \"k\": K})",
                   spec_clip(name, quoted, sizeof quoted));
    } else {
      unsigned bit = spec_metric_bit(name);
      spec->metrics |= bit;
      metric_at[bit == API_METRIC_ACCURACY ? 0
                : bit == API_METRIC_MSE    ? 1
                : bit == API_METRIC_MAE    ? 2
                                           : 3] = (int)i;
    }
  }
  spec->metric_accuracy = (spec->metrics & API_METRIC_ACCURACY) != 0;

  json_t *dataset = spec_get_object(&s, "dataset", REQUIRED);
  if (dataset) spec_parse_dataset(c, dataset, spec);
  json_t *pipeline = spec_get_object(&s, "pipeline", OPTIONAL);
  if (pipeline) spec_parse_pipeline(c, pipeline, spec);
  json_t *optimizer = spec_get_object(&s, "optimizer", REQUIRED);
  if (optimizer) spec_parse_optimizer(c, optimizer, spec);

  spec_get_int(&s, "epochs", OPTIONAL, 1, 10000, &spec->epochs);
  spec_get_int(&s, "log_every_steps", OPTIONAL, 1, 1000000, &spec->log_every_steps);
  long long seed;
  if (spec_get_integer(&s, "seed", OPTIONAL, LLONG_MIN, LLONG_MAX, &seed) == 1) {
    if (seed < 0) {
      spec_problem(c, "seed", "must be a non-negative integer, got %lld", seed);
    } else {
      spec->seed = (uint64_t)seed;
      spec->has_seed = 1;
    }
  }
  spec_get_int(&s, "priority", OPTIONAL, 0, 100, &spec->priority);
  spec_get_int(&s, "max_restarts", OPTIONAL, 0, API_MAX_RESTARTS, &spec->max_restarts);
  spec_get_int(&s, "max_runtime", OPTIONAL, 0, API_MAX_RUNTIME_S, &spec->max_runtime_s);

  json_t *resources = spec_get_object(&s, "resources", OPTIONAL);
  if (resources) spec_parse_resources(c, resources, spec);
  const char *precision = spec_get_string(&s, "precision", OPTIONAL);
  if (precision && strcmp(precision, "float32") != 0 && strcmp(precision, "mixed_bfloat16") != 0 &&
      strcmp(precision, "mixed_float16") != 0)
    spec_problem(c, "precision",
                 "unsupported precision '%s'; supported: float32, mixed_bfloat16, mixed_float16",
                 spec_clip(precision, quoted, sizeof quoted));
  else if (precision)
    spec_copy_text(spec->precision, sizeof spec->precision, precision);
  spec_get_bool(&s, "recompute", &spec->recompute);
  spec_get_bool(&s, "allow_tf32", &spec->allow_tf32);
  json_t *strategy = spec_get_object(&s, "strategy", OPTIONAL);
  if (strategy) spec_parse_strategy(c, strategy, spec);
  if (spec->strategy != API_STRATEGY_SINGLE) spec_check_strategy_resources(c, resources, spec);
  spec_check_gpu(c, spec);
  spec_check_layer_devices(c, spec);
  spec_check_loss(c, spec, loss_index >= 0, metric_at);
  json_t *checkpoint = spec_get_object(&s, "checkpoint", OPTIONAL);
  if (checkpoint) spec_parse_checkpoint(c, checkpoint, spec);
  spec_get_int(&s, "gradient_accumulation_steps", OPTIONAL, 1, 4096, &spec->accumulation_steps);
  if (spec_get_int(&s, "validation_every_steps", OPTIONAL, 1, 1000000000,
                   &spec->validation_every_steps) == 1 &&
      strcmp(spec->validation, "none") == 0)
    spec_problem(c, "validation_every_steps",
                 "needs validation data, and dataset.validation is 'none'");
  json_t *callbacks = spec_get_object(&s, "callbacks", OPTIONAL);
  if (callbacks) spec_parse_callbacks(c, callbacks, spec);
  json_t *profile = spec_get_object(&s, "profile", OPTIONAL);
  if (profile) parse_profile(c, profile, spec);
}

static void set_defaults(api_job_spec *spec) {
  spec_copy_text(spec->display_name, sizeof spec->display_name, "job");
  spec_copy_text(spec->validation, sizeof spec->validation, "test");
  spec_copy_text(spec->precision, sizeof spec->precision, "float32");
  spec->batch_size = 32;
  spec->shuffle = 1;
  spec->normalize = 1;
  spec->drop_remainder = 0;
  spec->prefetch = API_AUTO;
  spec->num_parallel_calls = API_AUTO;
  spec->take = -1;
  spec->num_shards = 1;
  spec->epochs = 1;
  spec->log_every_steps = 50;
  spec->priority = 50;
  spec->top_k = 5;
  spec->accumulation_steps = 1;
  spec_copy_text(spec->device_type, sizeof spec->device_type, "cpu");
  spec->devices = 1;
  spec_copy_text(spec->pool, sizeof spec->pool, "default");
  spec->replicas = 1;
  spec->workers = 1;
  /* 1 MiB, not DDP's 25: on CPUs the all-reduce runs over shared memory or
   * a NIC, and a layer's gradient that fills a bucket of its own starts as
   * soon as backward writes it instead of waiting for the rest of the
   * model (bench/dist_scaling.sh: 87-90% -> 93-95% scaling on the CNN). */
  spec->bucket_cap_mb = 1;
  spec->max_staleness = -1;
}

/* A spec that is sound on its own must also fit its data: examples of the
 * size the input expects, and a score for every class. Checked here so a
 * mismatch is a 400 at create, not a failed job minutes later. */
static void check_fits_dataset(checker *c, const api_job_spec *spec) {
  const api_builtin_dataset *d = api_builtin_dataset_find(spec->dataset);
  if (!d || spec->shards_format) return; /* shards are checked as they are read */
  long long want = 1, have = 1;
  for (int i = 0; i < d->input_ndim; i++) want *= d->input_shape[i];
  for (int i = 0; i < spec->input_ndim; i++) have *= spec->input_shape[i];
  if (have != want) {
    char shape[64];
    size_t used = 0;
    for (int i = 0; i < d->input_ndim && used < sizeof shape; i++) {
      used += (size_t)snprintf(shape + used, sizeof shape - used, "%s%d", i ? ", " : "",
                               d->input_shape[i]);
    }
    spec_problem(c, "model.input_shape",
                 "holds %lld values per example, but %s examples hold %lld; use [%s]", have,
                 d->name, want, shape);
  }
  long long outputs = spec->n_outputs;
  if (api_loss_is_regression(spec->loss_type)) {
    spec_problem(
        c, "loss",
        "%s needs numeric labels, and %s's labels are classes; upload a CSV with a numeric "
        "label column for a regression",
        spec->loss, d->name);
    return;
  }
  if (spec->loss_type == API_LOSS_BINARY_CROSSENTROPY && outputs == 1 && d->n_classes > 2) {
    char path[PATH_LEN];
    spec_index_path(path, "model.layers", (size_t)(spec->n_layers - 1));
    spec_problem(
        c, path,
        "binary_crossentropy with 1 unit scores labels 0 and 1, but %s has %d classes; use "
        "%d units with one_hot",
        d->name, d->n_classes, d->n_classes);
    return;
  }
  if (outputs > 0 && outputs < d->n_classes) {
    char path[PATH_LEN];
    spec_index_path(path, "model.layers", (size_t)(spec->n_layers - 1));
    spec_problem(c, path, "outputs %lld class scores, but %s has %d classes", outputs, d->name,
                 d->n_classes);
  }
}

int api_spec_parse(const char *json, size_t len, api_job_spec *spec, api_error *err) {
  api_error scratch;
  if (!err) err = &scratch;
  memset(err, 0, sizeof *err);
  if (!spec) return api_error_set(err, 500, "INTERNAL", "api_spec_parse: spec is NULL");
  memset(spec, 0, sizeof *spec);
  if (!json) {
    json = "";
    len = 0;
  }

  size_t first = 0;
  while (first < len &&
         (json[first] == ' ' || json[first] == '\t' || json[first] == '\r' || json[first] == '\n'))
    first++;
  if (first == len)
    return api_error_set(err, 400, "INVALID_ARGUMENT",
                         "request body is empty; expected a job spec as a JSON object");

  json_error_t jerr;
  json_t *root = json_loadb(json, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return api_error_set(err, 400, "INVALID_ARGUMENT",
                         "request body is not valid JSON: %s at line %d column %d", jerr.text,
                         jerr.line, jerr.column);
  if (!json_is_object(root)) {
    api_error_set(err, 400, "INVALID_ARGUMENT", "request body must be a JSON object, got %s",
                  api_json_type_name(root));
    json_decref(root);
    return -1;
  }

  set_defaults(spec);
  checker c = {err, 0};
  keras_paths kp = {0};
  parse_spec(&c, root, spec, &kp);
  json_decref(root);
  /* Data held in memory is always cached (in memory unless "file" is
   * given): one value for a spec and its canonical form, which names it. */
  if (!spec->shards_format) spec->cache_given = 1;
  if (c.problems == 0) check_fits_dataset(&c, spec);
  spec_keras_paths(&kp, err);
  if (c.problems == 0) return 0;

  err->http = 400;
  err->status = "INVALID_ARGUMENT";
  int n = snprintf(err->message, sizeof err->message, "job spec is invalid: %d problem%s",
                   c.problems, c.problems == 1 ? "" : "s");
  if (n > 0 && c.problems > err->n_details)
    snprintf(err->message + n, sizeof err->message - (size_t)n, " (the first %d are listed)",
             err->n_details);
  return -1;
}
