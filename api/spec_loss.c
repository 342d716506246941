/* spec_loss.c — the job spec's loss and metrics, and what reads the metrics:
 * the callbacks' monitors and the checkpoints kept by the best value. */
#include "spec_internal.h"

#include <stdio.h>
#include <string.h>

int api_loss_is_regression(api_loss loss) {
  return loss == API_LOSS_MEAN_SQUARED_ERROR || loss == API_LOSS_MEAN_ABSOLUTE_ERROR;
}

/* Keras's names; the short aliases map to the same loss. */
const char *const spec_loss_names[] = {"sparse_categorical_crossentropy",
                                       "categorical_crossentropy",
                                       "binary_crossentropy",
                                       "mean_squared_error",
                                       "mean_absolute_error",
                                       "mse",
                                       "mae",
                                       NULL};
const api_loss spec_loss_of_name[] = {API_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY,
                                      API_LOSS_CATEGORICAL_CROSSENTROPY,
                                      API_LOSS_BINARY_CROSSENTROPY,
                                      API_LOSS_MEAN_SQUARED_ERROR,
                                      API_LOSS_MEAN_ABSOLUTE_ERROR,
                                      API_LOSS_MEAN_SQUARED_ERROR,
                                      API_LOSS_MEAN_ABSOLUTE_ERROR};

/* The loss against the model's outputs, the metrics and the label maps:
 * each mismatch is named at the field that would have to change. */
void spec_check_loss(checker *c, api_job_spec *spec, int has_loss, const int metric_at[4]) {
  if (!has_loss) return;
  const api_loss loss = spec->loss_type;
  const int regression = api_loss_is_regression(loss);
  char last[PATH_LEN];
  spec_index_path(last, "model.layers", (size_t)(spec->n_layers > 0 ? spec->n_layers - 1 : 0));
  if (spec->n_outputs > 0) {
    if ((loss == API_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY ||
         loss == API_LOSS_CATEGORICAL_CROSSENTROPY) &&
        spec->n_outputs < 2)
      spec_problem(c, last,
                   "%s needs a score per class, at least 2 units; got %d (one output: use "
                   "binary_crossentropy, numbers: mean_squared_error)",
                   spec->loss, spec->n_outputs);
    if (loss == API_LOSS_BINARY_CROSSENTROPY && spec->n_outputs > 1 && !spec->one_hot)
      spec_problem(c, "pipeline.one_hot",
                   "binary_crossentropy with %d outputs reads one-hot labels; set one_hot to true, "
                   "or use 1 unit for labels 0/1",
                   spec->n_outputs);
  }
  if (loss == API_LOSS_CATEGORICAL_CROSSENTROPY && !spec->one_hot)
    spec_problem(c, "pipeline.one_hot",
                 "categorical_crossentropy reads one-hot labels; set one_hot to true (or use "
                 "sparse_categorical_crossentropy for class ids)");
  if (spec->one_hot && (loss == API_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY || regression ||
                        (loss == API_LOSS_BINARY_CROSSENTROPY && spec->n_outputs == 1)))
    spec_problem(c, "pipeline.one_hot",
                 "%s reads %s, not one-hot rows; drop one_hot or use categorical_crossentropy",
                 spec->loss,
                 regression                                         ? "numeric labels"
                 : loss == API_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY ? "class ids"
                                                                    : "labels 0/1 (one unit)");
  static const char *const metric_names[] = {"accuracy", "mse", "mae", "top_k_accuracy"};
  for (int bit = 0; bit < 4; bit++) {
    if (!(spec->metrics & (1u << bit))) continue;
    const int needs_regression = bit == 1 || bit == 2;
    char path[PATH_LEN];
    spec_index_path(path, "metrics", (size_t)metric_at[bit]);
    if (needs_regression != regression)
      spec_problem(c, path, "'%s' needs a %s loss, and '%s' is a %s loss; supported with it: %s",
                   metric_names[bit], needs_regression ? "regression" : "classification",
                   spec->loss, regression ? "regression" : "classification",
                   regression ? "mse, mae" : "accuracy, top_k_accuracy");
  }
}

/* A metric's index in API_METRIC_* bits, by Keras's names and aliases. */
unsigned spec_metric_bit(const char *name) {
  if (strcmp(name, "accuracy") == 0 || strcmp(name, "acc") == 0) return API_METRIC_ACCURACY;
  if (strcmp(name, "mse") == 0 || strcmp(name, "mean_squared_error") == 0) return API_METRIC_MSE;
  if (strcmp(name, "mae") == 0 || strcmp(name, "mean_absolute_error") == 0) return API_METRIC_MAE;
  if (strcmp(name, "top_k_accuracy") == 0 ||
      strcmp(name, "sparse_top_k_categorical_accuracy") == 0 ||
      strcmp(name, "top_k_categorical_accuracy") == 0)
    return API_METRIC_TOP_K;
  return 0;
}

/* A metrics entry: a name, or {"type": "top_k_accuracy", "k": K}. Returns
 * the name, NULL after a problem. */
const char *spec_parse_metric(checker *c, json_t *metric, const char *path, api_job_spec *spec) {
  if (json_is_string(metric)) return json_string_value(metric);
  if (!json_is_object(metric)) {
    spec_problem(c, path, "must be a metric name or an object with type and k, got %s",
                 api_json_type_name(metric));
    return NULL;
  }
  scope s = {c, metric, path};
  static const char *const fields[] = {"type", "k", NULL};
  spec_refuse_unknown(&s, fields);
  const char *type = spec_get_string(&s, "type", REQUIRED);
  if (type && spec_metric_bit(type) != API_METRIC_TOP_K) {
    char quoted[64], at[PATH_LEN];
    spec_join_path(at, path, "type");
    spec_problem(c, at, "only top_k_accuracy takes options, got '%s'",
                 spec_clip(type, quoted, sizeof quoted));
    return NULL;
  }
  spec_get_int(&s, "k", OPTIONAL, 1, 1000, &spec->top_k);
  return type;
}

/* A callback's monitor: the name an epoch's end reports, from a Keras
 * name ("loss" is the epoch's mean loss, "val_loss" validation's), which
 * this job must report. */
static void parse_monitor(checker *c, const scope *s, const char *path, api_job_spec *spec,
                          api_callback *cb) {
  const char *name = spec_get_string(s, "monitor", OPTIONAL);
  if (!name) name = "val_loss";
  char quoted[64], at[PATH_LEN];
  spec_join_path(at, path, "monitor");
  const int val = strncmp(name, "val_", 4) == 0;
  const char *base = val ? name + 4 : strncmp(name, "epoch_", 6) == 0 ? name + 6 : name;
  unsigned bit = strcmp(base, "loss") == 0 ? 0u : spec_metric_bit(base);
  if (strcmp(base, "loss") != 0 && !bit) {
    spec_problem(c, at, "unknown metric '%s'; monitor loss, val_loss, or a metric of this job",
                 spec_clip(name, quoted, sizeof quoted));
    return;
  }
  static const char *const canonical[] = {"loss", "accuracy", "mse", "mae", "top_k_accuracy"};
  const char *stem = canonical[bit == 0                     ? 0
                               : bit == API_METRIC_ACCURACY ? 1
                               : bit == API_METRIC_MSE      ? 2
                               : bit == API_METRIC_MAE      ? 3
                                                            : 4];
  if (bit && !(spec->metrics & bit)) {
    spec_problem(c, at, "'%s' is not reported: add '%s' to metrics",
                 spec_clip(name, quoted, sizeof quoted), stem);
    return;
  }
  if (val && strcmp(spec->validation, "none") == 0) {
    spec_problem(c, at, "'%s' needs validation data, and dataset.validation is 'none'",
                 spec_clip(name, quoted, sizeof quoted));
    return;
  }
  snprintf(cb->monitor, sizeof cb->monitor, "%s_%s", val ? "val" : "epoch", stem);
  static const char *const modes[] = {"auto", "min", "max", NULL};
  int mode = spec_get_choice(s, "mode", OPTIONAL, "unknown mode", modes);
  /* Keras's auto: higher is better for an accuracy, lower for the rest. */
  cb->mode_max = mode == 2 || (mode <= 0 && strstr(stem, "accuracy") != NULL);
}

static void parse_callback(checker *c, json_t *obj, const char *path, api_job_spec *spec,
                           api_callback *cb, int plateau) {
  scope s = {c, obj, path};
  static const char *const stop_fields[] = {"monitor", "mode", "min_delta", "patience", NULL};
  static const char *const plateau_fields[] = {"monitor", "mode",     "min_delta", "patience",
                                               "factor",  "cooldown", "min_lr",    NULL};
  spec_refuse_unknown(&s, plateau ? plateau_fields : stop_fields);
  cb->enabled = 1;
  cb->min_delta = plateau ? 1e-4 : 0.0; /* Keras's defaults */
  cb->patience = plateau ? 10 : 0;
  cb->factor = plateau ? 0.1 : 0.0;
  parse_monitor(c, &s, path, spec, cb);
  char at[PATH_LEN];
  spec_join_path(at, path, "min_delta");
  if (spec_get_number(&s, "min_delta", OPTIONAL, &cb->min_delta) == 1 && !(cb->min_delta >= 0))
    spec_problem(c, at, "must be >= 0, got %g", cb->min_delta);
  spec_get_int(&s, "patience", OPTIONAL, 0, 100000, &cb->patience);
  if (!plateau) return;
  spec_join_path(at, path, "factor");
  if (spec_get_number(&s, "factor", OPTIONAL, &cb->factor) == 1 &&
      !(cb->factor > 0 && cb->factor < 1))
    spec_problem(c, at, "must be > 0 and < 1, got %g", cb->factor);
  spec_get_int(&s, "cooldown", OPTIONAL, 0, 100000, &cb->cooldown);
  spec_join_path(at, path, "min_lr");
  if (spec_get_number(&s, "min_lr", OPTIONAL, &cb->min_lr) == 1 && !(cb->min_lr >= 0))
    spec_problem(c, at, "must be >= 0, got %g", cb->min_lr);
  if (spec->schedule.type != API_SCHEDULE_CONSTANT || spec->schedule.warmup_steps > 0)
    spec_problem(c, path, "cannot be combined with optimizer.schedule; use one or the other");
}

void spec_parse_callbacks(checker *c, json_t *obj, api_job_spec *spec) {
  scope s = {c, obj, "callbacks"};
  static const char *const fields[] = {"early_stopping", "reduce_lr_on_plateau", NULL};
  spec_refuse_unknown(&s, fields);
  json_t *stop = spec_get_object(&s, "early_stopping", OPTIONAL);
  if (stop) parse_callback(c, stop, "callbacks.early_stopping", spec, &spec->early_stopping, 0);
  json_t *plateau = spec_get_object(&s, "reduce_lr_on_plateau", OPTIONAL);
  if (plateau)
    parse_callback(c, plateau, "callbacks.reduce_lr_on_plateau", spec, &spec->plateau, 1);
}

/* When checkpoints are written and how many are kept: a resume (after a
 * crash, a retry, a preemption or :resume) starts from the newest. */
void spec_parse_checkpoint(checker *c, json_t *obj, api_job_spec *spec) {
  scope s = {c, obj, "checkpoint"};
  static const char *const fields[] = {"every_steps", "keep_last", "keep_best",
                                       "monitor",     "mode",      NULL};
  spec_refuse_unknown(&s, fields);
  spec_get_int(&s, "every_steps", OPTIONAL, 1, 1000000000, &spec->checkpoint_every_steps);
  spec_get_int(&s, "keep_last", OPTIONAL, 1, 1000000, &spec->checkpoint_keep_last);
  spec_get_int(&s, "keep_best", OPTIONAL, 1, 1000000, &spec->checkpoint_keep_best);
  char quoted[64];
  const char *monitor = spec_get_string(&s, "monitor", OPTIONAL);
  const char *mode = spec_get_string(&s, "mode", OPTIONAL);
  if (monitor && !spec->checkpoint_keep_best)
    spec_problem(c, "checkpoint.monitor",
                 "only ranks checkpoints for keep_best; set keep_best too");
  if (mode && !spec->checkpoint_keep_best)
    spec_problem(c, "checkpoint.mode", "only ranks checkpoints for keep_best; set keep_best too");
  if (!spec->checkpoint_keep_best) return;
  if (!monitor) monitor = "val_loss"; /* Keras's default */
  /* The job reports loss and its metrics, each also as val_ with validation data. */
  const char *base = strncmp(monitor, "val_", 4) == 0 ? monitor + 4 : monitor;
  int known = !strcmp(base, "loss") || (spec_metric_bit(base) & spec->metrics) != 0;
  if (!known)
    spec_problem(c, "checkpoint.monitor",
                 "'%s' is not a metric this job reports; use loss, val_loss or one of metrics "
                 "(with or without val_)",
                 spec_clip(monitor, quoted, sizeof quoted));
  else
    spec_copy_text(spec->checkpoint_monitor, sizeof spec->checkpoint_monitor, monitor);
  if (!mode || !strcmp(mode, "auto"))
    spec->checkpoint_mode_max = strstr(monitor, "acc") != NULL;
  else if (!strcmp(mode, "min") || !strcmp(mode, "max"))
    spec->checkpoint_mode_max = mode[1] == 'a';
  else
    spec_problem(c, "checkpoint.mode", "must be min, max or auto, got '%s'",
                 spec_clip(mode, quoted, sizeof quoted));
}
