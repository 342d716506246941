/* spec_optimizer.c — the job spec's optimizer section: the type with Keras's
 * defaults and options, and the learning-rate schedule. */
#include "spec_internal.h"

#include <string.h>

/* Checks 0 <= value < 1 for momentum and the Adam betas. */
static void check_unit_interval(checker *c, const char *path, double value) {
  if (!(value >= 0 && value < 1)) spec_problem(c, path, "must be >= 0 and < 1, got %g", value);
}

static void parse_schedule(checker *c, json_t *obj, api_job_spec *spec) {
  scope s = {c, obj, "optimizer.schedule"};
  static const char *const types[] = {"constant", "step", "exponential", "cosine", NULL};
  static const char *const own[][4] = {
      [API_SCHEDULE_CONSTANT] = {NULL},
      [API_SCHEDULE_STEP] = {"step_size", "gamma", NULL},
      [API_SCHEDULE_EXPONENTIAL] = {"decay_steps", "decay_rate", "staircase", NULL},
      [API_SCHEDULE_COSINE] = {"decay_steps", "alpha", NULL},
  };
  api_schedule *sc = &spec->schedule;
  int type = spec_get_choice(&s, "type", REQUIRED, "unknown schedule type", types);
  const char *key;
  json_t *value;
  json_object_foreach(obj, key, value) {
    if (strcmp(key, "type") == 0 || strcmp(key, "warmup_steps") == 0 ||
        (type >= 0 && spec_pick(key, own[type]) >= 0))
      continue;
    char path[PATH_LEN];
    spec_join_path(path, "optimizer.schedule", key);
    spec_problem(
        c, path,
        "unknown field for this schedule; expected: type, warmup_steps, and step_size, gamma "
        "(step); decay_steps, decay_rate, staircase (exponential); decay_steps, alpha "
        "(cosine)");
  }
  if (type < 0) return;
  sc->type = (api_schedule_type)type;
  spec_get_int(&s, "warmup_steps", OPTIONAL, 0, 1000000000, &sc->warmup_steps);
  if (type == API_SCHEDULE_STEP) {
    spec_get_int(&s, "step_size", REQUIRED, 1, 1000000000, &sc->step_size);
    sc->gamma = 0.1;
    if (spec_get_number(&s, "gamma", OPTIONAL, &sc->gamma) == 1 &&
        !(sc->gamma > 0 && sc->gamma <= 1))
      spec_problem(c, "optimizer.schedule.gamma", "must be > 0 and <= 1, got %g", sc->gamma);
  } else if (type == API_SCHEDULE_EXPONENTIAL) {
    spec_get_int(&s, "decay_steps", REQUIRED, 1, 1000000000, &sc->decay_steps);
    if (spec_get_number(&s, "decay_rate", REQUIRED, &sc->decay_rate) == 1 &&
        !(sc->decay_rate > 0 && sc->decay_rate <= 1))
      spec_problem(c, "optimizer.schedule.decay_rate", "must be > 0 and <= 1, got %g",
                   sc->decay_rate);
    spec_get_bool(&s, "staircase", &sc->staircase);
  } else if (type == API_SCHEDULE_COSINE) {
    spec_get_int(&s, "decay_steps", REQUIRED, 1, 1000000000, &sc->decay_steps);
    if (spec_get_number(&s, "alpha", OPTIONAL, &sc->alpha) == 1 &&
        !(sc->alpha >= 0 && sc->alpha <= 1))
      spec_problem(c, "optimizer.schedule.alpha", "must be >= 0 and <= 1, got %g", sc->alpha);
  }
}

void spec_parse_optimizer(checker *c, json_t *obj, api_job_spec *spec) {
  scope s = {c, obj, "optimizer"};
  static const char *const types[] = {"sgd", "adam", "adamw", "rmsprop", "adagrad", NULL};
  static const char *const common[] = {
      "type", "learning_rate", "weight_decay", "global_clipnorm", "schedule", NULL};
  static const char *const own[][5] = {
      [API_OPT_SGD] = {"momentum", "nesterov", NULL},
      [API_OPT_ADAM] = {"beta_1", "beta_2", "epsilon", NULL},
      [API_OPT_ADAMW] = {"beta_1", "beta_2", "epsilon", NULL},
      [API_OPT_RMSPROP] = {"rho", "momentum", "epsilon", NULL},
      [API_OPT_ADAGRAD] = {"initial_accumulator_value", "epsilon", NULL},
  };
  int type = spec_get_choice(&s, "type", REQUIRED, "unknown optimizer type", types);

  const char *key;
  json_t *value;
  json_object_foreach(obj, key, value) {
    if (spec_pick(key, common) >= 0 || (type >= 0 && spec_pick(key, own[type]) >= 0)) continue;
    char path[PATH_LEN];
    spec_join_path(path, "optimizer", key);
    int owner = -1;
    for (int t = 0; t <= API_OPT_ADAGRAD && owner < 0; t++)
      if (spec_pick(key, own[t]) >= 0) owner = t;
    if (owner >= 0 && type >= 0)
      spec_problem(c, path, "is an option of optimizer type '%s', not '%s'", types[owner],
                   types[type]);
    else if (owner < 0)
      spec_problem(c, path,
                   "unknown field; expected one of: type, learning_rate, weight_decay, "
                   "global_clipnorm, schedule, momentum, nesterov (sgd), beta_1, beta_2, epsilon "
                   "(adam, adamw), rho (rmsprop), initial_accumulator_value (adagrad)");
  }
  if (type < 0) return;

  /* Keras's defaults. */
  spec->optimizer = (api_optimizer_type)type;
  spec->learning_rate = type == API_OPT_SGD ? 0.01 : 0.001;
  if (type != API_OPT_SGD) spec->epsilon = 1e-7;
  if (type == API_OPT_ADAM || type == API_OPT_ADAMW) {
    spec->beta_1 = 0.9;
    spec->beta_2 = 0.999;
  }
  if (type == API_OPT_ADAMW) spec->weight_decay = 0.004;
  if (type == API_OPT_RMSPROP) spec->rho = 0.9;
  if (type == API_OPT_ADAGRAD) spec->initial_accumulator_value = 0.1;

  if (spec_get_number(&s, "learning_rate", OPTIONAL, &spec->learning_rate) == 1 &&
      !(spec->learning_rate > 0 && spec->learning_rate <= 10))
    spec_problem(c, "optimizer.learning_rate", "must be > 0 and <= 10, got %g",
                 spec->learning_rate);
  if (spec_get_number(&s, "weight_decay", OPTIONAL, &spec->weight_decay) == 1 &&
      !(spec->weight_decay >= 0 && spec->weight_decay <= 1))
    spec_problem(c, "optimizer.weight_decay", "must be >= 0 and <= 1, got %g", spec->weight_decay);

  if (type == API_OPT_SGD || type == API_OPT_RMSPROP) {
    int momentum_ok = 1;
    if (spec_get_number(&s, "momentum", OPTIONAL, &spec->momentum) == 1) {
      momentum_ok = spec->momentum >= 0 && spec->momentum < 1;
      check_unit_interval(c, "optimizer.momentum", spec->momentum);
    }
    if (type == API_OPT_SGD && spec_get_bool(&s, "nesterov", &spec->nesterov) == 1 &&
        spec->nesterov && momentum_ok && spec->momentum == 0)
      spec_problem(c, "optimizer.nesterov", "nesterov requires momentum > 0, got momentum %g",
                   spec->momentum);
  }
  if (type == API_OPT_ADAM || type == API_OPT_ADAMW) {
    if (spec_get_number(&s, "beta_1", OPTIONAL, &spec->beta_1) == 1)
      check_unit_interval(c, "optimizer.beta_1", spec->beta_1);
    if (spec_get_number(&s, "beta_2", OPTIONAL, &spec->beta_2) == 1)
      check_unit_interval(c, "optimizer.beta_2", spec->beta_2);
  }
  if (type == API_OPT_RMSPROP && spec_get_number(&s, "rho", OPTIONAL, &spec->rho) == 1)
    check_unit_interval(c, "optimizer.rho", spec->rho);
  if (type == API_OPT_ADAGRAD &&
      spec_get_number(&s, "initial_accumulator_value", OPTIONAL,
                      &spec->initial_accumulator_value) == 1 &&
      !(spec->initial_accumulator_value >= 0))
    spec_problem(c, "optimizer.initial_accumulator_value", "must be >= 0, got %g",
                 spec->initial_accumulator_value);
  if (type != API_OPT_SGD && spec_get_number(&s, "epsilon", OPTIONAL, &spec->epsilon) == 1 &&
      !(spec->epsilon > 0))
    spec_problem(c, "optimizer.epsilon", "must be > 0, got %g", spec->epsilon);
  if (spec_get_number(&s, "global_clipnorm", OPTIONAL, &spec->global_clipnorm) == 1 &&
      !(spec->global_clipnorm > 0 && spec->global_clipnorm <= 1e6))
    spec_problem(c, "optimizer.global_clipnorm", "must be > 0 and <= 1e6, got %g",
                 spec->global_clipnorm);
  json_t *schedule = spec_get_object(&s, "schedule", OPTIONAL);
  if (schedule) parse_schedule(c, schedule, spec);
}
