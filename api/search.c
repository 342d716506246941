/* search.c — an experiment's search object: parsing with field paths in
 * errors, the trials' values (grid enumeration, seeded random draws) and
 * each trial's spec, written into the base spec at the parameters' paths
 * and validated like any job spec. The searchers' decisions are in
 * search_decide.c. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_search.h"
#include "json_util.h"
#include "search_internal.h"

static const char *const searcher_names[] = {"grid", "random", "asha"};
static const char *const type_names[] = {"uniform", "log_uniform", "int_uniform", "categorical"};

const char *api_search_searcher_name(api_searcher searcher) {
  return (unsigned)searcher < 3 ? searcher_names[searcher] : "unknown";
}

static int name_index(const char *const *names, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0) return i;
  return -1;
}

void api_search_free(api_search *s) {
  if (!s) return;
  for (int i = 0; i < s->n_params; i++) json_decref(s->params[i].values);
  free(s);
}

/* A path of the spec: names of [A-Za-z0-9_] joined by '.', each with
 * optional [N] indexes. */
static int path_valid(const char *path) {
  const char *p = path;
  if (!*p) return 0;
  for (;;) {
    const char *start = p;
    while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
           *p == '_')
      p++;
    if (p == start) return 0;
    while (*p == '[') {
      p++;
      const char *digits = p;
      while (*p >= '0' && *p <= '9') p++;
      if (p == digits || *p != ']' || p - digits > 6) return 0;
      p++;
    }
    if (*p == '\0') return 1;
    if (*p != '.') return 0;
    p++;
  }
}

static int as_number(const json_t *v, double *out) {
  if (!json_is_number(v)) return 0;
  *out = json_number_value(v);
  return isfinite(*out);
}

static int as_int(const json_t *v, long long *out) {
  if (json_is_integer(v)) {
    *out = json_integer_value(v);
    return 1;
  }
  if (json_is_real(v)) {
    double d = json_real_value(v);
    if (isfinite(d) && d == floor(d) && fabs(d) < 1e15) {
      *out = (long long)d;
      return 1;
    }
  }
  return 0;
}

static void problem(api_error *err, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void problem(api_error *err, const char *field, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  api_error_add_detail(err, field, "%s", msg);
}

static int refuse_unknown(api_error *err, json_t *obj, const char *prefix,
                          const char *const *known) {
  const char *key;
  json_t *value;
  int bad = 0;
  json_object_foreach(obj, key, value) {
    int found = 0;
    for (int i = 0; known[i] && !found; i++) found = strcmp(known[i], key) == 0;
    if (!found) {
      char field[API_SEARCH_PATH_LEN + 64];
      snprintf(field, sizeof field, "%s%s", prefix, key);
      problem(err, field, "unknown field");
      bad = 1;
    }
  }
  return bad;
}

/* The points a grid takes of parameter p (0 when it cannot be gridded). */
static int grid_points(const search_param *p) {
  if (p->type == SEARCH_CATEGORICAL) return (int)json_array_size(p->values);
  if (p->count > 0) return p->count;
  if (p->type == SEARCH_INT_UNIFORM) {
    double n = p->max - p->min + 1;
    return n > API_SEARCH_MAX_TRIALS ? API_SEARCH_MAX_TRIALS + 1 : (int)n;
  }
  return 0;
}

static void parse_param(api_search *s, const char *path, json_t *def, api_error *err) {
  char field[API_SEARCH_PATH_LEN + 64];
  snprintf(field, sizeof field, "search.parameters.%s", path);
  if (strlen(path) >= API_SEARCH_PATH_LEN || !path_valid(path)) {
    problem(err, field,
            "a parameter is named by its path in the spec, e.g. optimizer.learning_rate or "
            "model.layers[1].units (at most %d characters)",
            API_SEARCH_PATH_LEN - 1);
    return;
  }
  if (!json_is_object(def)) {
    problem(err, field,
            "must be an object such as {\"type\": \"uniform\", \"min\": 0, \"max\": 1}");
    return;
  }
  char sub[API_SEARCH_PATH_LEN + 80];
  snprintf(sub, sizeof sub, "%s.", field);
  static const char *const known[] = {"type", "min", "max", "values", "count", NULL};
  if (refuse_unknown(err, def, sub, known)) return;
  search_param *p = &s->params[s->n_params];
  memset(p, 0, sizeof *p);
  snprintf(p->path, sizeof p->path, "%s", path);
  json_t *type = json_object_get(def, "type");
  int t = json_is_string(type) ? name_index(type_names, 4, json_string_value(type)) : -1;
  snprintf(sub, sizeof sub, "%s.type", field);
  if (t < 0) {
    problem(err, sub, "must be one of uniform, log_uniform, int_uniform, categorical");
    return;
  }
  p->type = (search_param_type)t;
  json_t *count = json_object_get(def, "count");
  if (count) {
    long long c;
    snprintf(sub, sizeof sub, "%s.count", field);
    if (!as_int(count, &c) || c < 1 || c > API_SEARCH_MAX_TRIALS) {
      problem(err, sub, "must be an integer from 1 to %d (the grid's points)",
              API_SEARCH_MAX_TRIALS);
      return;
    }
    p->count = (int)c;
  }
  if (p->type == SEARCH_CATEGORICAL) {
    json_t *values = json_object_get(def, "values");
    snprintf(sub, sizeof sub, "%s.values", field);
    if (!json_is_array(values) || json_array_size(values) == 0 ||
        json_array_size(values) > API_SEARCH_MAX_TRIALS) {
      problem(err, sub, "a categorical parameter needs a non-empty array of values (at most %d)",
              API_SEARCH_MAX_TRIALS);
      return;
    }
    size_t i;
    json_t *v;
    json_array_foreach(values, i, v) {
      if (!json_is_number(v) && !json_is_string(v) && !json_is_boolean(v)) {
        problem(err, sub, "values must be numbers, strings or booleans; value %zu is %s", i,
                api_json_type_name(v));
        return;
      }
    }
    if (p->count) {
      snprintf(sub, sizeof sub, "%s.count", field);
      problem(err, sub, "a categorical parameter's grid is its values; count does not apply");
      return;
    }
    p->values = json_incref(values);
    s->n_params++;
    return;
  }
  if (json_object_get(def, "values")) {
    snprintf(sub, sizeof sub, "%s.values", field);
    problem(err, sub, "values is for categorical parameters; %s takes min and max", type_names[t]);
    return;
  }
  json_t *min = json_object_get(def, "min"), *max = json_object_get(def, "max");
  int ok = 1;
  if (p->type == SEARCH_INT_UNIFORM) {
    long long lo, hi;
    snprintf(sub, sizeof sub, "%s.min", field);
    if (!as_int(min, &lo)) problem(err, sub, "int_uniform needs an integer min"), ok = 0;
    snprintf(sub, sizeof sub, "%s.max", field);
    if (!as_int(max, &hi)) problem(err, sub, "int_uniform needs an integer max"), ok = 0;
    if (!ok) return;
    p->min = (double)lo;
    p->max = (double)hi;
  } else {
    snprintf(sub, sizeof sub, "%s.min", field);
    if (!as_number(min, &p->min)) problem(err, sub, "%s needs a number min", type_names[t]), ok = 0;
    snprintf(sub, sizeof sub, "%s.max", field);
    if (!as_number(max, &p->max)) problem(err, sub, "%s needs a number max", type_names[t]), ok = 0;
    if (!ok) return;
  }
  snprintf(sub, sizeof sub, "%s.min", field);
  if (p->min > p->max || (p->type != SEARCH_INT_UNIFORM && p->min == p->max)) {
    problem(err, sub, "min must be %s max, got min %g and max %g",
            p->type == SEARCH_INT_UNIFORM ? "<=" : "<", p->min, p->max);
    return;
  }
  if (p->type == SEARCH_LOG_UNIFORM && p->min <= 0) {
    problem(err, sub, "log_uniform needs min > 0, got %g", p->min);
    return;
  }
  s->n_params++;
}

static void parse_asha(api_search *s, json_t *asha, api_error *err) {
  static const char *const known[] = {"min_epochs", "max_epochs", "reduction_factor", NULL};
  if (!json_is_object(asha)) {
    problem(err, "search.asha",
            "searcher asha needs {\"min_epochs\": 1, \"max_epochs\": 9, \"reduction_factor\": 3}");
    return;
  }
  if (refuse_unknown(err, asha, "search.asha.", known)) return;
  long long v;
  json_t *min = json_object_get(asha, "min_epochs"), *max = json_object_get(asha, "max_epochs");
  json_t *eta = json_object_get(asha, "reduction_factor");
  s->min_epochs = 1;
  s->eta = API_SEARCH_DEFAULT_ETA;
  if (min) {
    if (!as_int(min, &v) || v < 1 || v > 100000)
      problem(err, "search.asha.min_epochs", "must be an integer from 1 to 100000");
    else
      s->min_epochs = (int)v;
  }
  if (!max || !as_int(max, &v) || v < 1 || v > 100000)
    problem(err, "search.asha.max_epochs",
            "ASHA needs max_epochs, the full budget of a trial: an integer from 1 to 100000");
  else
    s->max_epochs = (int)v;
  if (eta) {
    if (!as_int(eta, &v) || v < 2 || v > 100)
      problem(err, "search.asha.reduction_factor", "must be an integer from 2 to 100");
    else
      s->eta = (int)v;
  }
  if (err->n_details) return;
  if (s->min_epochs > s->max_epochs) {
    problem(err, "search.asha.min_epochs", "must be <= max_epochs (%d), got %d", s->max_epochs,
            s->min_epochs);
    return;
  }
  /* Rungs: min_epochs * eta^k below max_epochs, then max_epochs. */
  s->n_rungs = 0;
  for (long long e = s->min_epochs; e < s->max_epochs && s->n_rungs < API_SEARCH_MAX_RUNGS - 1;
       e *= s->eta)
    s->rung_epochs[s->n_rungs++] = (int)e;
  s->rung_epochs[s->n_rungs++] = s->max_epochs;
}

int api_search_parse(const char *json, size_t len, api_search **out, api_error *err) {
  *out = NULL;
  memset(err, 0, sizeof *err);
  json_error_t jerr;
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!json_is_object(root)) {
    json_decref(root);
    api_error_set(err, 400, "INVALID_ARGUMENT", "search must be a JSON object");
    api_error_add_detail(err, "search", "must be an object with searcher, metric and parameters");
    return -1;
  }
  api_search *s = calloc(1, sizeof *s);
  if (!s) {
    json_decref(root);
    return api_error_set(err, 500, "INTERNAL", "out of memory");
  }
  static const char *const known[] = {
      "searcher", "metric",     "mode", "max_trials", "max_concurrent_trials",
      "seed",     "parameters", "asha", NULL};
  refuse_unknown(err, root, "search.", known);
  json_t *searcher = json_object_get(root, "searcher");
  int k =
      json_is_string(searcher) ? name_index(searcher_names, 3, json_string_value(searcher)) : -1;
  if (k < 0)
    problem(err, "search.searcher", "must be one of grid, random, asha");
  else
    s->searcher = (api_searcher)k;
  json_t *metric = json_object_get(root, "metric");
  const char *m = json_is_string(metric) ? json_string_value(metric) : "";
  int metric_ok = *m && strlen(m) < API_SEARCH_METRIC_LEN;
  for (const char *c = m; *c && metric_ok; c++)
    metric_ok = (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_';
  if (!metric_ok)
    problem(err, "search.metric",
            "needs the metric to optimize, as a job reports it at an epoch's end, e.g. "
            "val_accuracy or val_loss");
  else
    snprintf(s->metric, sizeof s->metric, "%s", m);
  json_t *mode = json_object_get(root, "mode");
  if (!mode) {
    s->mode_max = strstr(s->metric, "accuracy") != NULL; /* Keras's "auto" */
  } else if (json_is_string(mode) && strcmp(json_string_value(mode), "max") == 0) {
    s->mode_max = 1;
  } else if (json_is_string(mode) && strcmp(json_string_value(mode), "min") == 0) {
    s->mode_max = 0;
  } else {
    problem(err, "search.mode", "must be max or min");
  }
  long long v;
  json_t *max_trials = json_object_get(root, "max_trials");
  if (max_trials && (!as_int(max_trials, &v) || v < 1 || v > API_SEARCH_MAX_TRIALS))
    problem(err, "search.max_trials", "must be an integer from 1 to %d", API_SEARCH_MAX_TRIALS);
  else if (max_trials)
    s->max_trials = (int)v;
  json_t *conc = json_object_get(root, "max_concurrent_trials");
  s->max_concurrent = 1;
  if (conc && (!as_int(conc, &v) || v < 1 || v > API_SEARCH_MAX_TRIALS))
    problem(err, "search.max_concurrent_trials", "must be an integer from 1 to %d",
            API_SEARCH_MAX_TRIALS);
  else if (conc)
    s->max_concurrent = (int)v;
  json_t *seed = json_object_get(root, "seed");
  if (seed && (!json_is_integer(seed) || json_integer_value(seed) < 0))
    problem(err, "search.seed", "must be an integer >= 0");
  else if (seed)
    s->seed = (uint64_t)json_integer_value(seed);
  json_t *params = json_object_get(root, "parameters");
  if (!json_is_object(params) || json_object_size(params) == 0 ||
      json_object_size(params) > API_SEARCH_MAX_PARAMS) {
    problem(
        err, "search.parameters",
        "needs an object of 1 to %d parameters by spec path, e.g. {\"optimizer.learning_rate\": "
        "{\"type\": \"log_uniform\", \"min\": 0.0001, \"max\": 0.1}}",
        API_SEARCH_MAX_PARAMS);
  } else {
    const char *path;
    json_t *def;
    json_object_foreach(params, path, def) {
      parse_param(s, path, def, err);
      if (k == API_SEARCHER_ASHA && strcmp(path, "epochs") == 0) {
        char field[64];
        snprintf(field, sizeof field, "search.parameters.%s", path);
        problem(err, field, "ASHA sets a trial's epochs by its rung (search.asha)");
      }
    }
  }
  json_t *asha = json_object_get(root, "asha");
  if (k == API_SEARCHER_ASHA)
    parse_asha(s, asha, err);
  else if (asha)
    problem(err, "search.asha", "applies to searcher asha only");
  if (k != API_SEARCHER_ASHA) {
    s->n_rungs = 1;
    s->rung_epochs[0] = 0;
  }
  /* The grid: every parameter has points, and they are not too many. */
  if (err->n_details == 0 && k == API_SEARCHER_GRID) {
    double total = 1;
    for (int i = 0; i < s->n_params; i++) {
      int points = grid_points(&s->params[i]);
      if (points == 0) {
        char field[API_SEARCH_PATH_LEN + 64];
        snprintf(field, sizeof field, "search.parameters.%s.count", s->params[i].path);
        problem(err, field, "a grid over a %s parameter needs count, the points to try",
                type_names[s->params[i].type]);
      }
      total *= points;
    }
    int limit = s->max_trials ? s->max_trials : API_SEARCH_MAX_TRIALS;
    if (err->n_details == 0 && total > limit)
      problem(err, s->max_trials ? "search.max_trials" : "search.parameters",
              "the grid has %.0f points, more than %s %d", total,
              s->max_trials ? "max_trials" : "the most an experiment may have,", limit);
    else if (err->n_details == 0)
      s->n_trials = (int)total;
    if (err->n_details == 0) s->max_trials = s->n_trials;
  } else if (err->n_details == 0) {
    if (!s->max_trials) s->max_trials = 10;
    s->n_trials = s->max_trials;
  }
  json_decref(root);
  if (err->n_details) {
    int n = err->n_details;
    char first[sizeof err->details[0].description];
    snprintf(first, sizeof first, "%s", err->details[0].description);
    api_error_detail saved[API_MAX_DETAILS];
    memcpy(saved, err->details, sizeof saved);
    api_error_set(err, 400, "INVALID_ARGUMENT", "invalid search: %s: %s%s", saved[0].field, first,
                  n > 1 ? " (and more, see details)" : "");
    memcpy(err->details, saved, sizeof saved);
    err->n_details = n;
    api_search_free(s);
    return -1;
  }
  *out = s;
  return 0;
}

char *api_search_to_json(const api_search *s) {
  json_t *o = json_object();
  json_object_set_new(o, "searcher", json_string(api_search_searcher_name(s->searcher)));
  json_object_set_new(o, "metric", json_string(s->metric));
  json_object_set_new(o, "mode", json_string(s->mode_max ? "max" : "min"));
  json_object_set_new(o, "max_trials", json_integer(s->max_trials));
  json_object_set_new(o, "max_concurrent_trials", json_integer(s->max_concurrent));
  json_object_set_new(o, "seed", json_integer((json_int_t)s->seed));
  json_t *params = json_object();
  for (int i = 0; i < s->n_params; i++) {
    const search_param *p = &s->params[i];
    json_t *d = json_object();
    json_object_set_new(d, "type", json_string(type_names[p->type]));
    if (p->type == SEARCH_CATEGORICAL) {
      json_object_set(d, "values", p->values);
    } else if (p->type == SEARCH_INT_UNIFORM) {
      json_object_set_new(d, "min", json_integer((json_int_t)p->min));
      json_object_set_new(d, "max", json_integer((json_int_t)p->max));
    } else {
      json_object_set_new(d, "min", json_real(p->min));
      json_object_set_new(d, "max", json_real(p->max));
    }
    if (p->count) json_object_set_new(d, "count", json_integer(p->count));
    json_object_set_new(params, p->path, d);
  }
  json_object_set_new(o, "parameters", params);
  if (s->searcher == API_SEARCHER_ASHA) {
    json_t *a = json_object();
    json_object_set_new(a, "min_epochs", json_integer(s->min_epochs));
    json_object_set_new(a, "max_epochs", json_integer(s->max_epochs));
    json_object_set_new(a, "reduction_factor", json_integer(s->eta));
    json_object_set_new(o, "asha", a);
  }
  char *text = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
  json_decref(o);
  return text;
}

api_searcher api_search_searcher(const api_search *s) {
  return s->searcher;
}
const char *api_search_metric(const api_search *s) {
  return s->metric;
}
int api_search_mode_max(const api_search *s) {
  return s->mode_max;
}
int api_search_max_concurrent(const api_search *s) {
  return s->max_concurrent;
}
int api_search_trial_count(const api_search *s) {
  return s->n_trials;
}
int api_search_param_count(const api_search *s) {
  return s->n_params;
}
const char *api_search_param_path(const api_search *s, int i) {
  return i >= 0 && i < s->n_params ? s->params[i].path : "";
}
int api_search_rung_count(const api_search *s) {
  return s->n_rungs;
}
int api_search_rung_epochs(const api_search *s, int rung) {
  return rung >= 0 && rung < s->n_rungs ? s->rung_epochs[rung] : 0;
}

/* ---- values ---- */

static uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* A uniform draw in [0, 1) for (seed, trial, parameter): a trial's values
 * depend on nothing else, so a search resumed after a restart, or run
 * again with the same seed, draws the same ones. */
static double draw(uint64_t seed, int trial, int param) {
  uint64_t x = splitmix64(splitmix64(seed) ^ ((uint64_t)trial << 20) ^ (uint64_t)param);
  return (double)(x >> 11) * 0x1.0p-53;
}

/* Grid point i (0 <= i < points) of a parameter. */
static json_t *grid_value(const search_param *p, int i) {
  if (p->type == SEARCH_CATEGORICAL) return json_incref(json_array_get(p->values, (size_t)i));
  int points = grid_points(p);
  double f = points > 1 ? (double)i / (points - 1) : 0;
  switch (p->type) {
  case SEARCH_INT_UNIFORM:
    return json_integer(
        (json_int_t)llround(p->count ? p->min + f * (p->max - p->min) : p->min + i));
  case SEARCH_LOG_UNIFORM: return json_real(exp(log(p->min) + f * (log(p->max) - log(p->min))));
  default: return json_real(p->min + f * (p->max - p->min));
  }
}

static json_t *random_value(const search_param *p, double u) {
  switch (p->type) {
  case SEARCH_CATEGORICAL: {
    size_t n = json_array_size(p->values);
    size_t i = (size_t)(u * (double)n);
    return json_incref(json_array_get(p->values, i < n ? i : n - 1));
  }
  case SEARCH_INT_UNIFORM: {
    double v = floor(p->min + u * (p->max - p->min + 1));
    return json_integer((json_int_t)(v > p->max ? p->max : v));
  }
  case SEARCH_LOG_UNIFORM: return json_real(exp(log(p->min) + u * (log(p->max) - log(p->min))));
  default: return json_real(p->min + u * (p->max - p->min));
  }
}

char *api_search_trial_values(const api_search *s, int index) {
  if (index < 0 || index >= s->n_trials) return NULL;
  json_t *o = json_object();
  int rest = index;
  /* Grid: mixed radix, the last parameter fastest. */
  int place[API_SEARCH_MAX_PARAMS];
  if (s->searcher == API_SEARCHER_GRID) {
    for (int i = s->n_params - 1; i >= 0; i--) {
      int points = grid_points(&s->params[i]);
      place[i] = rest % points;
      rest /= points;
    }
  }
  for (int i = 0; i < s->n_params; i++) {
    json_t *v = s->searcher == API_SEARCHER_GRID
                    ? grid_value(&s->params[i], place[i])
                    : random_value(&s->params[i], draw(s->seed, index, i));
    json_object_set_new(o, s->params[i].path, v);
  }
  char *text = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
  json_decref(o);
  return text;
}

/* ---- a trial's spec ---- */

/* Writes value at path in root; 0, or -1 with why when the path does not
 * lead to a value of the spec. */
static int set_path(json_t *root, const char *path, json_t *value, char *why, size_t len) {
  char copy[API_SEARCH_PATH_LEN];
  snprintf(copy, sizeof copy, "%s", path);
  json_t *parent = NULL, *node = root;
  const char *key = NULL;
  size_t index = 0;
  int in_array = 0;
  char *save = NULL;
  for (char *seg = strtok_r(copy, ".", &save); seg; seg = strtok_r(NULL, ".", &save)) {
    char *bracket = strchr(seg, '[');
    if (bracket) *bracket = '\0';
    if (!json_is_object(node) || !json_object_get(node, seg)) {
      snprintf(why, len, "the base spec has no field %s here", seg);
      return -1;
    }
    parent = node;
    key = seg;
    in_array = 0;
    node = json_object_get(node, seg);
    while (bracket) {
      char *close = strchr(bracket + 1, ']');
      index = (size_t)strtoul(bracket + 1, NULL, 10);
      if (!json_is_array(node) || index >= json_array_size(node)) {
        snprintf(why, len, "%s has no element [%zu] in the base spec", key, index);
        return -1;
      }
      parent = node;
      in_array = 1;
      node = json_array_get(node, index);
      bracket = close && close[1] == '[' ? close + 1 : NULL;
    }
  }
  if (json_is_object(node) || json_is_array(node)) {
    snprintf(why, len, "the base spec holds an %s there, not a value a parameter can set",
             api_json_type_name(node));
    return -1;
  }
  if (in_array)
    json_array_set(parent, index, value);
  else
    json_object_set(parent, key, value);
  return 0;
}

int api_search_trial_spec(const api_search *s, const char *base_spec, const char *values_json,
                          int epochs, char **out, api_error *err) {
  *out = NULL;
  memset(err, 0, sizeof *err);
  json_t *root = json_loads(base_spec, 0, NULL);
  json_t *values = json_loads(values_json, 0, NULL);
  int rc = -1;
  if (!json_is_object(root) || !json_is_object(values)) {
    api_error_set(err, 400, "INVALID_ARGUMENT", "the base spec or the trial's values are not JSON");
    goto done;
  }
  for (int i = 0; i < s->n_params; i++) {
    const char *path = s->params[i].path;
    json_t *v = json_object_get(values, path);
    char why[200], field[API_SEARCH_PATH_LEN + 32];
    snprintf(field, sizeof field, "search.parameters.%s", path);
    if (!v || set_path(root, path, v, why, sizeof why) != 0) {
      api_error_set(err, 400, "INVALID_ARGUMENT",
                    "search parameter %s does not apply to the spec: %s", path,
                    v ? why : "no value");
      api_error_add_detail(err, field, "does not apply to the base spec: %s", v ? why : "no value");
      goto done;
    }
  }
  if (epochs > 0) json_object_set_new(root, "epochs", json_integer(epochs));
  char *text = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(17));
  api_job_spec *spec = text ? malloc(sizeof *spec) : NULL;
  if (!spec) {
    free(text);
    api_error_set(err, 500, "INTERNAL", "out of memory");
    goto done;
  }
  api_error spec_err;
  if (api_spec_parse(text, strlen(text), spec, &spec_err) != 0) {
    /* Name the parameter whose path the spec's first problem lies on. */
    const char *bad = spec_err.n_details ? spec_err.details[0].field : "";
    const char *param = NULL;
    for (int i = 0; i < s->n_params && !param; i++) {
      size_t n = strlen(s->params[i].path);
      if (strncmp(bad, s->params[i].path, n) == 0 && (bad[n] == '\0' || bad[n] == '.'))
        param = s->params[i].path;
    }
    char field[API_SEARCH_PATH_LEN + 32];
    if (param)
      snprintf(field, sizeof field, "search.parameters.%s", param);
    else
      snprintf(field, sizeof field, "search.parameters");
    api_error_set(err, 400, "INVALID_ARGUMENT",
                  "a trial with values %.200s makes an invalid spec: %s", values_json,
                  spec_err.message);
    api_error_add_detail(err, field, "%s: %s", bad,
                         spec_err.n_details ? spec_err.details[0].description : spec_err.message);
    free(text);
    free(spec);
    goto done;
  }
  free(text);
  *out = api_spec_to_json(spec);
  free(spec);
  if (!*out) {
    api_error_set(err, 500, "INTERNAL", "out of memory");
    goto done;
  }
  rc = 0;
done:
  json_decref(root);
  json_decref(values);
  return rc;
}
