/* spec.c — the job spec: parse and validate a JSON body into api_job_spec,
 * reporting every problem with its JSON path, and write a spec back out in
 * canonical form with every default filled in. */
#include "api.h"
#include "json_util.h"

#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PATH_LEN         128 /* api_error_detail.field */
#define MAX_DIM          65536
#define MAX_INPUT_VALUES (1LL << 24) /* per example: 16M values */
#define MAX_UNITS        65536

/* Every violation found so far: the first API_MAX_DETAILS go into err, the
 * count covers them all so the message can say how many there were. */
typedef struct checker {
  api_error *err;
  int problems;
} checker;

/* One JSON object being read and its path ("" for the top level). */
typedef struct scope {
  checker *c;
  json_t *obj;
  const char *path;
} scope;

enum { OPTIONAL = 0, REQUIRED = 1 };

__attribute__((format(printf, 3, 4))) static void problem(checker *c, const char *field,
                                                          const char *fmt, ...) {
  c->problems++;
  if (c->err->n_details >= API_MAX_DETAILS) return;
  /* Longer than a detail's description: api_error_add_detail does the
   * cutting, on a UTF-8 character boundary. */
  char description[2 * sizeof c->err->details[0].description];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(description, sizeof description, fmt, ap);
  va_end(ap);
  if (n < 0) description[0] = '\0';
  api_error_add_detail(c->err, field, "%s", description);
}

/* ---- paths and text ---- */

static void join_path(char out[PATH_LEN], const char *parent, const char *key) {
  int n = snprintf(out, PATH_LEN, "%s%s%s", parent, parent[0] ? "." : "", key);
  if (n < 0) out[0] = '\0';
}

static void index_path(char out[PATH_LEN], const char *parent, size_t index) {
  int n = snprintf(out, PATH_LEN, "%s[%zu]", parent, index);
  if (n < 0) out[0] = '\0';
}

/* A user's string shortened for quoting in a description, cut on a UTF-8
 * character boundary and marked with "..." when cut. */
static const char *clip(const char *text, char *buf, size_t size) {
  size_t len = strlen(text);
  if (len < size) return text;
  size_t keep = size - 4;
  while (keep > 0 && ((unsigned char)text[keep] & 0xC0) == 0x80) keep--;
  memcpy(buf, text, keep);
  memcpy(buf + keep, "...", 4);
  return buf;
}

/* Index of value in a NULL-terminated list, or -1. */
static int pick(const char *value, const char *const *choices) {
  for (int i = 0; choices[i]; i++)
    if (strcmp(value, choices[i]) == 0) return i;
  return -1;
}

/* "a, b, c" into out. */
static const char *list_text(const char *const *items, char *out, size_t size) {
  size_t used = 0;
  out[0] = '\0';
  for (int i = 0; items[i] && used < size; i++) {
    int n = snprintf(out + used, size - used, "%s%s", i ? ", " : "", items[i]);
    if (n < 0) break;
    used += (size_t)n;
  }
  return out;
}

static void copy_text(char *dst, size_t size, const char *src) {
  size_t len = strlen(src);
  if (len >= size) len = size - 1;
  memcpy(dst, src, len);
  dst[len] = '\0';
}

/* ---- typed members ---- */

/* The member key of s, or NULL when absent (reported when required). */
static json_t *member(const scope *s, const char *key, int required) {
  json_t *value = json_object_get(s->obj, key);
  if (!value && required) {
    char path[PATH_LEN];
    join_path(path, s->path, key);
    problem(s->c, path, "is required");
  }
  return value;
}

static void wrong_type(const scope *s, const char *key, const char *expected, const json_t *value) {
  char path[PATH_LEN];
  join_path(path, s->path, key);
  problem(s->c, path, "must be %s, got %s", expected, api_json_type_name(value));
}

/* An integer, or a number with no fractional part (2.0) that fits. */
static int as_integer(const json_t *value, long long *out) {
  if (json_is_integer(value)) {
    *out = json_integer_value(value);
    return 1;
  }
  if (json_is_real(value)) {
    double real = json_real_value(value);
    if (real >= -0x1p63 && real < 0x1p63 && real == (double)(long long)real) {
      *out = (long long)real;
      return 1;
    }
  }
  return 0;
}

/* Reads an integer member into *out when present and of the right type.
 * Returns 1 when read, 0 when absent, -1 when a problem was reported. */
static int get_integer(const scope *s, const char *key, int required, long long min, long long max,
                       long long *out) {
  json_t *value = member(s, key, required);
  if (!value) return required ? -1 : 0;
  long long number;
  if (!as_integer(value, &number)) {
    char path[PATH_LEN];
    join_path(path, s->path, key);
    if (json_is_real(value))
      problem(s->c, path, "must be an integer, got %g", json_real_value(value));
    else
      problem(s->c, path, "must be an integer, got %s", api_json_type_name(value));
    return -1;
  }
  if (number < min || number > max) {
    char path[PATH_LEN];
    join_path(path, s->path, key);
    problem(s->c, path, "must be between %lld and %lld, got %lld", min, max, number);
    return -1;
  }
  *out = number;
  return 1;
}

/* An int member within [min, max]; *out keeps its default when absent. */
static int get_int(const scope *s, const char *key, int required, int min, int max, int *out) {
  long long number;
  int rc = get_integer(s, key, required, min, max, &number);
  if (rc == 1) *out = (int)number;
  return rc;
}

static int get_number(const scope *s, const char *key, int required, double *out) {
  json_t *value = member(s, key, required);
  if (!value) return required ? -1 : 0;
  if (!json_is_number(value)) {
    wrong_type(s, key, "a number", value);
    return -1;
  }
  *out = json_number_value(value);
  return 1;
}

static int get_bool(const scope *s, const char *key, int *out) {
  json_t *value = member(s, key, OPTIONAL);
  if (!value) return 0;
  if (!json_is_boolean(value)) {
    wrong_type(s, key, "a boolean (true or false)", value);
    return -1;
  }
  *out = json_is_true(value);
  return 1;
}

static const char *get_string(const scope *s, const char *key, int required) {
  json_t *value = member(s, key, required);
  if (!value) return NULL;
  if (!json_is_string(value)) {
    wrong_type(s, key, "a string", value);
    return NULL;
  }
  return json_string_value(value);
}

/* A string member that must be one of choices; returns its index, or -1
 * when absent or refused (then a problem "<what> '<value>'; supported: .."
 * is reported). */
static int get_choice(const scope *s, const char *key, int required, const char *what,
                      const char *const *choices) {
  const char *value = get_string(s, key, required);
  if (!value) return -1;
  int index = pick(value, choices);
  if (index < 0) {
    char path[PATH_LEN], quoted[64], supported[128];
    join_path(path, s->path, key);
    problem(s->c, path, "%s '%s'; supported: %s", what, clip(value, quoted, sizeof quoted),
            list_text(choices, supported, sizeof supported));
  }
  return index;
}

static json_t *get_typed(const scope *s, const char *key, int required, int want_object) {
  json_t *value = member(s, key, required);
  if (!value) return NULL;
  if (want_object ? !json_is_object(value) : !json_is_array(value)) {
    wrong_type(s, key, want_object ? "an object" : "an array", value);
    return NULL;
  }
  return value;
}

static json_t *get_object(const scope *s, const char *key, int required) {
  return get_typed(s, key, required, 1);
}

static json_t *get_array(const scope *s, const char *key, int required) {
  return get_typed(s, key, required, 0);
}

/* Refuses every key of s not in allowed, so a typo never passes silently. */
static void refuse_unknown(const scope *s, const char *const *allowed) {
  const char *key;
  json_t *value;
  json_object_foreach(s->obj, key, value) {
    if (pick(key, allowed) >= 0) continue;
    char path[PATH_LEN], expected[200];
    join_path(path, s->path, key);
    problem(s->c, path, "unknown field; expected one of: %s",
            list_text(allowed, expected, sizeof expected));
  }
}

/* ---- sections ---- */

static const char *const layer_types[] = {"dense",
                                          "flatten",
                                          "activation",
                                          "relu",
                                          "conv2d",
                                          "depthwise_conv2d",
                                          "separable_conv2d",
                                          "batch_norm",
                                          "dropout",
                                          "max_pool2d",
                                          "avg_pool2d",
                                          "global_avg_pool2d",
                                          "add",
                                          "concatenate",
                                          NULL};
static const char *const activations[] = {"linear", "relu",    "softmax", "leaky_relu", "elu",
                                          "gelu",   "sigmoid", "tanh",    NULL};
static const char *const paddings[] = {"valid", "same", NULL};
static const char *const initializers[] = {
    "glorot_uniform", "glorot_normal", "he_uniform", "he_normal", "zeros", "ones", NULL};
static const char *const layer_fields[] = {"type",
                                           "name",
                                           "inputs",
                                           "units",
                                           "activation",
                                           "use_bias",
                                           "kernel_initializer",
                                           "bias_initializer",
                                           "filters",
                                           "kernel_size",
                                           "strides",
                                           "padding",
                                           "dilation_rate",
                                           "depth_multiplier",
                                           "pool_size",
                                           "rate",
                                           "momentum",
                                           "epsilon",
                                           "synchronized",
                                           "axis",
                                           "alpha",
                                           NULL};
static const char *const fields_by_type[][14] = {
    [API_LAYER_DENSE] = {"type", "name", "inputs", "units", "activation", "use_bias",
                         "kernel_initializer", "bias_initializer", NULL},
    [API_LAYER_FLATTEN] = {"type", "name", "inputs", NULL},
    [API_LAYER_ACTIVATION] = {"type", "name", "inputs", "activation", "alpha", NULL},
    [API_LAYER_RELU] = {"type", "name", "inputs", NULL},
    [API_LAYER_CONV2D] = {"type", "name", "inputs", "filters", "kernel_size", "strides", "padding",
                          "dilation_rate", "activation", "use_bias", "kernel_initializer",
                          "bias_initializer", NULL},
    [API_LAYER_DEPTHWISE_CONV2D] = {"type", "name", "inputs", "kernel_size", "strides", "padding",
                                    "dilation_rate", "depth_multiplier", "activation", "use_bias",
                                    NULL},
    [API_LAYER_SEPARABLE_CONV2D] = {"type", "name", "inputs", "filters", "kernel_size", "strides",
                                    "padding", "dilation_rate", "depth_multiplier", "activation",
                                    "use_bias", NULL},
    [API_LAYER_BATCH_NORM] = {"type", "name", "inputs", "momentum", "epsilon", "synchronized",
                              NULL},
    [API_LAYER_DROPOUT] = {"type", "name", "inputs", "rate", NULL},
    [API_LAYER_MAX_POOL2D] = {"type", "name", "inputs", "pool_size", "strides", "padding", NULL},
    [API_LAYER_AVG_POOL2D] = {"type", "name", "inputs", "pool_size", "strides", "padding", NULL},
    [API_LAYER_GLOBAL_AVG_POOL2D] = {"type", "name", "inputs", NULL},
    [API_LAYER_ADD] = {"type", "name", "inputs", NULL},
    [API_LAYER_CONCATENATE] = {"type", "name", "inputs", "axis", NULL},
};

#define MAX_WINDOW 1024

/* A Keras size pair: an integer n (meaning [n, n]) or [h, w], each in
 * [1, MAX_WINDOW]. Returns 1 when present and valid. */
static int get_pair(const scope *s, const char *key, int *out) {
  json_t *v = member(s, key, OPTIONAL);
  if (!v) return 0;
  char path[PATH_LEN];
  join_path(path, s->path, key);
  long long a, b;
  if (as_integer(v, &a)) {
    b = a;
  } else if (json_is_array(v) && json_array_size(v) == 2 && as_integer(json_array_get(v, 0), &a) &&
             as_integer(json_array_get(v, 1), &b)) {
  } else {
    problem(s->c, path, "must be an integer or a pair [height, width] of integers, got %s",
            api_json_type_name(v));
    return -1;
  }
  if (a < 1 || b < 1 || a > MAX_WINDOW || b > MAX_WINDOW) {
    problem(s->c, path, "must be between 1 and %d, got [%lld, %lld]", MAX_WINDOW, a, b);
    return -1;
  }
  out[0] = (int)a;
  out[1] = (int)b;
  return 1;
}

static int valid_layer_name(const char *name) {
  size_t len = strlen(name);
  if (len < 1 || len > 63) return 0;
  for (size_t i = 0; i < len; i++) {
    char ch = name[i];
    int ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
             ch == '_' || ch == '.' || ch == '-';
    if (!ok) return 0;
  }
  return 1;
}

/* Parses one layer object. Returns its type, or -1 when the type is missing
 * or unknown. *shape_known says whether the shape walk can go on past it
 * (a known type and valid sizes); *named whether the user gave a name.
 * "inputs" is resolved later, once every layer has its name. */
static int parse_layer(checker *c, json_t *obj, const char *path, api_layer *layer, int *named,
                       int *shape_known) {
  scope s = {c, obj, path};
  int type = get_choice(&s, "type", REQUIRED, "unknown layer type", layer_types);
  *shape_known = 0;

  const char *key;
  json_t *value;
  json_object_foreach(obj, key, value) {
    char field[PATH_LEN], expected[240];
    join_path(field, path, key);
    if (type >= 0 && pick(key, layer_fields) >= 0 && pick(key, fields_by_type[type]) < 0)
      problem(c, field, "not a field of a '%s' layer", layer_types[type]);
    else if (pick(key, layer_fields) < 0)
      problem(
          c, field, "unknown field; expected one of: %s",
          list_text(type >= 0 ? fields_by_type[type] : layer_fields, expected, sizeof expected));
  }

  const char *name = get_string(&s, "name", OPTIONAL);
  *named = json_object_get(obj, "name") != NULL;
  char field[PATH_LEN];
  if (name && valid_layer_name(name) && strcmp(name, "input") != 0) {
    copy_text(layer->name, sizeof layer->name, name);
  } else if (name) {
    char quoted[80];
    join_path(field, path, "name");
    if (strcmp(name, "input") == 0)
      problem(c, field, "'input' names the model input in 'inputs'; choose another name");
    else
      problem(c, field, "must be 1 to 63 characters from A-Z a-z 0-9 _ . -, got '%s'",
              clip(name, quoted, sizeof quoted));
  }
  if (type < 0) return -1;

  layer->type = (api_layer_type)type;
  *shape_known = 1;
  /* Keras's defaults, then what the spec says. */
  layer->use_bias = 1;
  layer->strides[0] = layer->strides[1] = 1;
  layer->dilation_rate[0] = layer->dilation_rate[1] = 1;
  layer->depth_multiplier = 1;
  layer->kernel_initializer = API_INIT_GLOROT_UNIFORM;
  layer->bias_initializer = API_INIT_ZEROS;
  int act = -1;
  switch (layer->type) {
  case API_LAYER_DENSE:
    if (get_int(&s, "units", REQUIRED, 1, MAX_UNITS, &layer->units) != 1) *shape_known = 0;
    act = get_choice(&s, "activation", OPTIONAL, "unknown activation", activations);
    get_bool(&s, "use_bias", &layer->use_bias);
    break;
  case API_LAYER_ACTIVATION:
    act = get_choice(&s, "activation", REQUIRED, "unknown activation", activations);
    break;
  case API_LAYER_RELU: layer->activation = API_ACT_RELU; break;
  case API_LAYER_CONV2D:
  case API_LAYER_SEPARABLE_CONV2D:
    if (get_int(&s, "filters", REQUIRED, 1, MAX_UNITS, &layer->filters) != 1) *shape_known = 0;
    /* fall through */
  case API_LAYER_DEPTHWISE_CONV2D: {
    json_t *ks = member(&s, "kernel_size", REQUIRED);
    if (!ks || get_pair(&s, "kernel_size", layer->kernel_size) != 1) *shape_known = 0;
    if (get_pair(&s, "strides", layer->strides) < 0) *shape_known = 0;
    if (get_pair(&s, "dilation_rate", layer->dilation_rate) < 0) *shape_known = 0;
    if ((layer->strides[0] > 1 || layer->strides[1] > 1) &&
        (layer->dilation_rate[0] > 1 || layer->dilation_rate[1] > 1)) {
      join_path(field, path, "dilation_rate");
      problem(c, field, "dilation_rate > 1 needs strides 1 (as in Keras)");
    }
    if (layer->type != API_LAYER_CONV2D &&
        get_int(&s, "depth_multiplier", OPTIONAL, 1, 1024, &layer->depth_multiplier) < 0)
      *shape_known = 0;
    act = get_choice(&s, "activation", OPTIONAL, "unknown activation", activations);
    get_bool(&s, "use_bias", &layer->use_bias);
    break;
  }
  case API_LAYER_BATCH_NORM:
    layer->momentum = 0.99;
    layer->epsilon = 0.001;
    if (get_number(&s, "momentum", OPTIONAL, &layer->momentum) == 1 &&
        !(layer->momentum >= 0 && layer->momentum < 1)) {
      join_path(field, path, "momentum");
      problem(c, field, "must be >= 0 and < 1, got %g", layer->momentum);
    }
    if (get_number(&s, "epsilon", OPTIONAL, &layer->epsilon) == 1 &&
        !(layer->epsilon > 0 && layer->epsilon < 1)) {
      join_path(field, path, "epsilon");
      problem(c, field, "must be > 0 and < 1, got %g", layer->epsilon);
    }
    get_bool(&s, "synchronized", &layer->synchronized);
    break;
  case API_LAYER_DROPOUT:
    if (get_number(&s, "rate", REQUIRED, &layer->rate) == 1 &&
        !(layer->rate >= 0 && layer->rate < 1)) {
      join_path(field, path, "rate");
      problem(c, field, "must be >= 0 and < 1, got %g", layer->rate);
    }
    break;
  case API_LAYER_MAX_POOL2D:
  case API_LAYER_AVG_POOL2D: {
    layer->pool_size[0] = layer->pool_size[1] = 2;
    if (get_pair(&s, "pool_size", layer->pool_size) < 0) *shape_known = 0;
    layer->strides[0] = layer->pool_size[0]; /* Keras: strides default to pool_size */
    layer->strides[1] = layer->pool_size[1];
    if (get_pair(&s, "strides", layer->strides) < 0) *shape_known = 0;
    break;
  }
  case API_LAYER_CONCATENATE:
    layer->axis = -1;
    if (get_int(&s, "axis", OPTIONAL, -API_MAX_DIMS, API_MAX_DIMS, &layer->axis) == 1 &&
        layer->axis == 0) {
      join_path(field, path, "axis");
      problem(c, field, "axis 0 is the batch; concatenate along a feature axis (1.. or -1)");
    }
    break;
  case API_LAYER_FLATTEN:
  case API_LAYER_GLOBAL_AVG_POOL2D:
  case API_LAYER_ADD: break;
  }
  if (act >= 0) layer->activation = (api_activation)act;
  int pad = get_choice(&s, "padding", OPTIONAL, "unknown padding", paddings);
  if (pad >= 0) layer->padding_same = pad;
  int ki = get_choice(&s, "kernel_initializer", OPTIONAL, "unknown initializer", initializers);
  if (ki >= 0) layer->kernel_initializer = (api_initializer)ki;
  int bi = get_choice(&s, "bias_initializer", OPTIONAL, "unknown initializer", initializers);
  if (bi >= 0) layer->bias_initializer = (api_initializer)bi;
  if (layer->type == API_LAYER_ACTIVATION) {
    if (layer->activation == API_ACT_LEAKY_RELU) layer->alpha = 0.3;
    if (layer->activation == API_ACT_ELU) layer->alpha = 1.0;
    if (get_number(&s, "alpha", OPTIONAL, &layer->alpha) == 1) {
      join_path(field, path, "alpha");
      if (layer->activation != API_ACT_LEAKY_RELU && layer->activation != API_ACT_ELU)
        problem(c, field, "alpha applies to leaky_relu and elu only");
      else if (!(layer->alpha > 0 && layer->alpha <= 100))
        problem(c, field, "must be > 0 and <= 100, got %g", layer->alpha);
    }
  }
  return type;
}

/* Resolves a layer's "inputs" (names of earlier layers, or "input") into
 * indices; add and concatenate must name two or more. */
static int parse_inputs(checker *c, json_t *obj, const char *path, api_job_spec *spec, int i) {
  api_layer *layer = &spec->layers[i];
  json_t *inputs = json_object_get(obj, "inputs");
  char field[PATH_LEN];
  join_path(field, path, "inputs");
  int multi = layer->type == API_LAYER_ADD || layer->type == API_LAYER_CONCATENATE;
  if (!inputs) {
    if (multi)
      problem(c, field, "a '%s' layer must name at least 2 inputs", layer_types[layer->type]);
    return !multi;
  }
  size_t n = json_is_array(inputs) ? json_array_size(inputs) : 0;
  size_t lo = multi ? 2 : 1, hi = multi ? API_MAX_LAYER_INPUTS : 1;
  if (!json_is_array(inputs) || n < lo || n > hi) {
    problem(c, field, "must be a list of %zu%s layer names, got %s", lo, multi ? " to 8" : "",
            json_is_array(inputs) ? "another count" : api_json_type_name(inputs));
    return 0;
  }
  for (size_t k = 0; k < n; k++) {
    json_t *item = json_array_get(inputs, k);
    char at[PATH_LEN];
    index_path(at, field, k);
    const char *want = json_string_value(item);
    if (!want) {
      problem(c, at, "must be a layer name, got %s", api_json_type_name(item));
      return 0;
    }
    int found = strcmp(want, "input") == 0 ? -1 : -2;
    for (int j = 0; j < spec->n_layers && found == -2; j++)
      if (strcmp(spec->layers[j].name, want) == 0) found = j;
    char quoted[80];
    if (found == -2 || found >= i) {
      problem(c, at, "'%s' %s; name an earlier layer or \"input\"",
              clip(want, quoted, sizeof quoted),
              found == -2 ? "is no layer" : "is not an earlier layer");
      return 0;
    }
    layer->inputs[k] = found;
  }
  layer->n_inputs = (int)n;
  return 1;
}

static void format_shape(const long long *dims, int rank, char *out, size_t size) {
  size_t used = 0;
  used += (size_t)snprintf(out, size, "(");
  for (int i = 0; i < rank && used < size; i++)
    used += (size_t)snprintf(out + used, size - used, "%s%lld", i ? ", " : "", dims[i]);
  if (used < size) snprintf(out + used, size - used, ")");
}

typedef struct layer_shape {
  int rank;
  long long dims[API_MAX_DIMS];
} layer_shape;

/* Output size of a window along one axis, TF's rules (same: ceil(n / s)). */
static long long window_out(long long n, int k, int stride, int dilation, int same) {
  long long span = (long long)dilation * (k - 1) + 1;
  if (same) return (n + stride - 1) / stride;
  return span > n ? 0 : (n - span) / stride + 1;
}

/* Follows per-example shapes through the layer graph: dense needs a flat
 * input, image layers (height, width, channels), add equal shapes,
 * concatenate equal shapes but on its axis; the model must end in a flat
 * vector of class scores. */
static void walk_shapes(checker *c, api_job_spec *spec, const int *shape_known) {
  layer_shape out[API_MAX_LAYERS];
  layer_shape input = {.rank = spec->input_ndim};
  for (int d = 0; d < input.rank; d++) input.dims[d] = spec->input_shape[d];

  for (int i = 0; i < spec->n_layers; i++) {
    if (!shape_known[i]) return;
    const api_layer *layer = &spec->layers[i];
    char path[PATH_LEN], text[96];
    index_path(path, "model.layers", (size_t)i);
    const layer_shape *in = layer->n_inputs
                                ? (layer->inputs[0] < 0 ? &input : &out[layer->inputs[0]])
                                : (i ? &out[i - 1] : &input);
    layer_shape s = *in;
    format_shape(in->dims, in->rank, text, sizeof text);
    const char *kind = layer_types[layer->type];
    switch (layer->type) {
    case API_LAYER_FLATTEN: {
      long long values = 1;
      for (int d = 0; d < s.rank; d++) values *= s.dims[d];
      s.dims[0] = values;
      s.rank = 1;
      break;
    }
    case API_LAYER_DENSE:
      if (s.rank != 1) {
        problem(c, path,
                "dense expects a flat input (rank 1), got shape %s; add a flatten layer before it",
                text);
        return;
      }
      s.dims[0] = layer->units;
      break;
    case API_LAYER_CONV2D:
    case API_LAYER_DEPTHWISE_CONV2D:
    case API_LAYER_SEPARABLE_CONV2D:
    case API_LAYER_MAX_POOL2D:
    case API_LAYER_AVG_POOL2D:
    case API_LAYER_GLOBAL_AVG_POOL2D: {
      if (s.rank != 3) {
        problem(c, path, "%s expects an image input (height, width, channels), got shape %s", kind,
                text);
        return;
      }
      if (layer->type == API_LAYER_GLOBAL_AVG_POOL2D) {
        s.dims[0] = s.dims[2];
        s.rank = 1;
        break;
      }
      int pool = layer->type == API_LAYER_MAX_POOL2D || layer->type == API_LAYER_AVG_POOL2D;
      const int *k = pool ? layer->pool_size : layer->kernel_size;
      for (int d = 0; d < 2; d++) {
        s.dims[d] = window_out(in->dims[d], k[d], layer->strides[d],
                               pool ? 1 : layer->dilation_rate[d], layer->padding_same);
      }
      if (s.dims[0] < 1 || s.dims[1] < 1) {
        problem(c, path,
                "%s: a %dx%d window does not fit the input %s with valid padding; use "
                "padding \"same\" or a smaller %s",
                kind, k[0], k[1], text, pool ? "pool_size" : "kernel_size");
        return;
      }
      if (layer->type == API_LAYER_CONV2D || layer->type == API_LAYER_SEPARABLE_CONV2D)
        s.dims[2] = layer->filters;
      else if (layer->type == API_LAYER_DEPTHWISE_CONV2D)
        s.dims[2] = in->dims[2] * layer->depth_multiplier;
      break;
    }
    case API_LAYER_ADD:
    case API_LAYER_CONCATENATE: {
      int axis = layer->axis < 0 ? s.rank + layer->axis : layer->axis - 1; /* per example */
      if (layer->type == API_LAYER_CONCATENATE && (axis < 0 || axis >= s.rank)) {
        problem(c, path, "concatenate: axis %d is outside the inputs' rank %d (+1 for the batch)",
                layer->axis, s.rank);
        return;
      }
      for (int k = 1; k < layer->n_inputs; k++) {
        const layer_shape *o = layer->inputs[k] < 0 ? &input : &out[layer->inputs[k]];
        int same = o->rank == s.rank;
        for (int d = 0; same && d < s.rank; d++)
          same = o->dims[d] == s.dims[d] || (layer->type == API_LAYER_CONCATENATE && d == axis);
        if (!same) {
          char other[96];
          format_shape(o->dims, o->rank, other, sizeof other);
          problem(c, path, "%s: input shapes %s and %s differ%s", kind, text, other,
                  layer->type == API_LAYER_CONCATENATE ? " off the concatenation axis" : "");
          return;
        }
        if (layer->type == API_LAYER_CONCATENATE) s.dims[axis] += o->dims[axis];
      }
      break;
    }
    case API_LAYER_ACTIVATION:
    case API_LAYER_RELU:
    case API_LAYER_BATCH_NORM:
    case API_LAYER_DROPOUT: break;
    }
    out[i] = s;
  }

  /* How many outputs the loss needs is checked with the loss (check_loss). */
  const layer_shape *last = &out[spec->n_layers - 1];
  if (last->rank != 1 || last->dims[0] < 1) {
    char path[PATH_LEN], text[96];
    index_path(path, "model.layers", (size_t)(spec->n_layers - 1));
    format_shape(last->dims, last->rank, text, sizeof text);
    problem(c, path,
            "the last layer must output the class scores or predictions, a flat vector (rank "
            "1); got shape %s",
            text);
    return;
  }
  spec->n_outputs = (int)last->dims[0];
}

static void parse_model(checker *c, json_t *obj, api_job_spec *spec) {
  scope s = {c, obj, "model"};
  static const char *const fields[] = {"input_shape", "layers", NULL};
  refuse_unknown(&s, fields);

  int input_ok = 0;
  json_t *shape = get_array(&s, "input_shape", REQUIRED);
  size_t ndim = shape ? json_array_size(shape) : 0;
  if (shape && (ndim < 1 || ndim > API_MAX_DIMS)) {
    problem(c, "model.input_shape", "must have 1 to %d dimensions, got %zu", API_MAX_DIMS, ndim);
  } else if (shape) {
    input_ok = 1;
    long long values = 1;
    int counted = 1; /* values is the exact product */
    for (size_t d = 0; d < ndim; d++) {
      json_t *dim = json_array_get(shape, d);
      long long size;
      char path[PATH_LEN];
      index_path(path, "model.input_shape", d);
      if (!as_integer(dim, &size) || size < 1 || size > MAX_DIM) {
        if (as_integer(dim, &size))
          problem(c, path, "must be between 1 and %d, got %lld", MAX_DIM, size);
        else if (json_is_real(dim))
          problem(c, path, "must be a positive integer, got %g", json_real_value(dim));
        else
          problem(c, path, "must be a positive integer, got %s", api_json_type_name(dim));
        input_ok = 0;
        continue;
      }
      spec->input_shape[d] = (int)size;
      /* Stop multiplying past the limit: six dims of 65536 overflow. */
      if (values <= MAX_INPUT_VALUES)
        values *= size;
      else
        counted = 0;
    }
    spec->input_ndim = (int)ndim;
    if (input_ok && values > MAX_INPUT_VALUES) {
      if (counted)
        problem(c, "model.input_shape", "has %lld values per example; the limit is %lld", values,
                MAX_INPUT_VALUES);
      else
        problem(c, "model.input_shape", "has more than %lld values per example (the limit)",
                MAX_INPUT_VALUES);
      input_ok = 0;
    }
  }

  json_t *layers = get_array(&s, "layers", REQUIRED);
  if (!layers) return;
  size_t n_layers = json_array_size(layers);
  if (n_layers < 1 || n_layers > API_MAX_LAYERS) {
    problem(c, "model.layers", "must list 1 to %d layers, got %zu", API_MAX_LAYERS, n_layers);
    return;
  }

  int shape_known[API_MAX_LAYERS] = {0};
  int named[API_MAX_LAYERS] = {0};
  int types[API_MAX_LAYERS];
  spec->n_layers = (int)n_layers;
  for (size_t i = 0; i < n_layers; i++) {
    char path[PATH_LEN];
    index_path(path, "model.layers", i);
    json_t *layer = json_array_get(layers, i);
    types[i] = -1;
    if (!json_is_object(layer))
      problem(c, path, "must be an object, got %s", api_json_type_name(layer));
    else
      types[i] = parse_layer(c, layer, path, &spec->layers[i], &named[i], &shape_known[i]);
  }

  /* Default names "<type>_<index>": "flatten_0", "dense_1". */
  for (size_t i = 0; i < n_layers; i++)
    if (!named[i] && types[i] >= 0)
      snprintf(spec->layers[i].name, sizeof spec->layers[i].name, "%s_%zu", layer_types[types[i]],
               i);
  for (size_t j = 1; j < n_layers; j++) {
    for (size_t i = 0; i < j; i++) {
      const char *name = spec->layers[j].name;
      if (!name[0] || strcmp(name, spec->layers[i].name) != 0) continue;
      /* Blame the later name the user chose, never a generated one. */
      size_t blamed = named[j] ? j : i, other = named[j] ? i : j;
      char path[PATH_LEN], base[PATH_LEN];
      index_path(base, "model.layers", blamed);
      join_path(path, base, "name");
      if (named[other])
        problem(c, path, "duplicate layer name '%s' (also the name of model.layers[%zu])", name,
                other);
      else
        problem(c, path, "layer name '%s' is also the default name of model.layers[%zu]", name,
                other);
      break;
    }
  }

  for (size_t i = 0; i < n_layers; i++) {
    char path[PATH_LEN];
    index_path(path, "model.layers", i);
    json_t *layer = json_array_get(layers, i);
    if (types[i] >= 0 && !parse_inputs(c, layer, path, spec, (int)i)) shape_known[i] = 0;
  }

  /* Softmax turns scores into probabilities; only the output may do that. */
  for (size_t i = 0; i + 1 < n_layers; i++) {
    if (spec->layers[i].activation != API_ACT_SOFTMAX) continue;
    char path[PATH_LEN], base[PATH_LEN];
    index_path(base, "model.layers", i);
    join_path(path, base, "activation");
    problem(c, path, "softmax is allowed only on the last layer");
  }

  if (input_ok) walk_shapes(c, spec, shape_known);
}

static void parse_dataset(checker *c, json_t *obj, api_job_spec *spec) {
  scope s = {c, obj, "dataset"};
  static const char *const fields[] = {"name", "validation", "validation_split", NULL};
  static const char *const validations[] = {"test", "none", "split", NULL};
  refuse_unknown(&s, fields);
  const char *name = get_string(&s, "name", REQUIRED);
  int uploaded = name && api_dataset_id_valid(name);
  if (name && !uploaded && !api_builtin_dataset_find(name)) {
    char quoted[64], known[256] = "";
    size_t used = 0;
    for (int i = 0; i < api_builtin_dataset_count() && used < sizeof known; i++) {
      used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "",
                               api_builtin_dataset_at(i)->name);
    }
    problem(c, "dataset.name",
            "unknown dataset '%s'; built-in data sets: %s; or the id of an uploaded data set "
            "(ds- and 16 hex digits)",
            clip(name, quoted, sizeof quoted), known);
  } else if (name) {
    copy_text(spec->dataset, sizeof spec->dataset, name);
  }
  /* An upload has no held-out split of its own: no validation unless asked. */
  if (uploaded) copy_text(spec->validation, sizeof spec->validation, "none");
  int validation = get_choice(&s, "validation", OPTIONAL, "unknown validation split", validations);
  if (validation >= 0)
    copy_text(spec->validation, sizeof spec->validation, validations[validation]);
  double split = 0;
  if (get_number(&s, "validation_split", OPTIONAL, &split) == 1) {
    if (!(split > 0 && split < 1)) {
      problem(c, "dataset.validation_split", "must be > 0 and < 1, got %g", split);
    } else if (validation >= 0 && strcmp(validations[validation], "split") != 0) {
      problem(c, "dataset.validation_split", "needs validation 'split' (or none given), got '%s'",
              validations[validation]);
    } else {
      spec->validation_split = split;
      copy_text(spec->validation, sizeof spec->validation, "split");
    }
  } else if (validation >= 0 && strcmp(validations[validation], "split") == 0) {
    problem(c, "dataset.validation_split", "is required with validation 'split'");
  }
}

/* An integer in [min, max] or the string "auto" (API_AUTO). */
static void get_auto_int(const scope *s, const char *key, int min, int max, int *out) {
  json_t *value = member(s, key, OPTIONAL);
  if (!value) return;
  if (json_is_string(value)) {
    if (strcmp(json_string_value(value), "auto") == 0) {
      *out = API_AUTO;
    } else {
      char path[PATH_LEN], quoted[64];
      join_path(path, s->path, key);
      problem(s->c, path, "must be an integer or \"auto\", got '%s'",
              clip(json_string_value(value), quoted, sizeof quoted));
    }
    return;
  }
  get_int(s, key, OPTIONAL, min, max, out);
}

static void parse_standardize(checker *c, json_t *value, api_job_spec *spec) {
  if (json_is_boolean(value)) {
    spec->standardize = json_is_true(value);
    return;
  }
  if (!json_is_object(value)) {
    problem(c, "pipeline.standardize",
            "must be true, false or {\"mean\": [...], \"std\": [...]}, got %s",
            api_json_type_name(value));
    return;
  }
  scope s = {c, value, "pipeline.standardize"};
  static const char *const fields[] = {"mean", "std", NULL};
  refuse_unknown(&s, fields);
  json_t *mean = get_array(&s, "mean", REQUIRED), *std = get_array(&s, "std", REQUIRED);
  if (!mean || !std) return;
  size_t n = json_array_size(mean);
  if (n < 1 || n > API_MAX_CHANNELS || json_array_size(std) != n) {
    problem(c, "pipeline.standardize",
            "mean and std must list the same number of channels, 1 to %d; got %zu and %zu",
            API_MAX_CHANNELS, n, json_array_size(std));
    return;
  }
  int ok = 1;
  for (size_t i = 0; i < n; i++) {
    json_t *m = json_array_get(mean, i), *d = json_array_get(std, i);
    char path[PATH_LEN];
    if (!json_is_number(m)) {
      index_path(path, "pipeline.standardize.mean", i);
      problem(c, path, "must be a number, got %s", api_json_type_name(m));
      ok = 0;
    }
    if (!json_is_number(d) || !(json_number_value(d) > 0)) {
      index_path(path, "pipeline.standardize.std", i);
      if (json_is_number(d))
        problem(c, path, "must be > 0, got %g", json_number_value(d));
      else
        problem(c, path, "must be a number, got %s", api_json_type_name(d));
      ok = 0;
    }
    if (ok) {
      spec->standardize_mean[i] = json_number_value(m);
      spec->standardize_std[i] = json_number_value(d);
    }
  }
  if (!ok) return;
  spec->standardize = 1;
  spec->n_standardize = (int)n;
}

static const char *const augment_names[] = {"flip_left_right", "flip_up_down", "random_crop",
                                            "random_brightness", NULL};

static void parse_augment(checker *c, json_t *list, api_job_spec *spec) {
  for (size_t i = 0; i < json_array_size(list); i++) {
    json_t *item = json_array_get(list, i);
    char path[PATH_LEN], quoted[64], known[128];
    index_path(path, "pipeline.augment", i);
    const char *type = NULL;
    json_t *obj = NULL;
    if (json_is_string(item)) {
      type = json_string_value(item);
    } else if (json_is_object(item)) {
      obj = item;
      scope s = {c, obj, path};
      type = get_string(&s, "type", REQUIRED);
    } else {
      problem(c, path, "must be a name or an object with a type, got %s", api_json_type_name(item));
      continue;
    }
    if (!type) continue;
    int kind = pick(type, augment_names);
    if (kind < 0) {
      problem(c, path, "unknown augmentation '%s'; supported: %s",
              clip(type, quoted, sizeof quoted), list_text(augment_names, known, sizeof known));
      continue;
    }
    unsigned bit = 1u << kind;
    if (spec->augment & bit) {
      problem(c, path, "'%s' is listed twice", type);
      continue;
    }
    spec->augment |= bit;
    if (bit == API_AUG_RANDOM_CROP) spec->crop_padding = 4;
    if (bit == API_AUG_RANDOM_BRIGHTNESS) spec->brightness_delta = 0.2;
    if (!obj) continue;
    scope s = {c, obj, path};
    static const char *const crop_fields[] = {"type", "padding", NULL};
    static const char *const brightness_fields[] = {"type", "max_delta", NULL};
    static const char *const plain_fields[] = {"type", NULL};
    refuse_unknown(&s, bit == API_AUG_RANDOM_CROP         ? crop_fields
                       : bit == API_AUG_RANDOM_BRIGHTNESS ? brightness_fields
                                                          : plain_fields);
    if (bit == API_AUG_RANDOM_CROP) get_int(&s, "padding", OPTIONAL, 1, 1024, &spec->crop_padding);
    if (bit == API_AUG_RANDOM_BRIGHTNESS &&
        get_number(&s, "max_delta", OPTIONAL, &spec->brightness_delta) == 1 &&
        !(spec->brightness_delta > 0 && spec->brightness_delta <= 255)) {
      char field[PATH_LEN];
      join_path(field, path, "max_delta");
      problem(c, field, "must be > 0 and <= 255, got %g", spec->brightness_delta);
    }
  }
}

static void parse_pipeline(checker *c, json_t *obj, api_job_spec *spec) {
  scope s = {c, obj, "pipeline"};
  static const char *const fields[] = {"batch_size",
                                       "shuffle",
                                       "shuffle_buffer",
                                       "normalize",
                                       "standardize",
                                       "augment",
                                       "drop_remainder",
                                       "cache",
                                       "prefetch",
                                       "num_parallel_calls",
                                       "take",
                                       "skip",
                                       "interleave",
                                       "one_hot",
                                       "cast",
                                       "shard",
                                       NULL};
  static const char *const casts[] = {"float32", "float16", "bfloat16", NULL};
  static const char *const caches[] = {"memory", "file", NULL};
  refuse_unknown(&s, fields);
  get_int(&s, "batch_size", OPTIONAL, 1, 65536, &spec->batch_size);
  get_bool(&s, "shuffle", &spec->shuffle);
  long long number;
  if (get_integer(&s, "shuffle_buffer", OPTIONAL, 1, 1LL << 31, &number) == 1) {
    if (!spec->shuffle)
      problem(c, "pipeline.shuffle_buffer", "has no effect with shuffle false; drop one of them");
    else
      spec->shuffle_buffer = number;
  }
  get_bool(&s, "normalize", &spec->normalize);
  json_t *standardize = member(&s, "standardize", OPTIONAL);
  if (standardize) parse_standardize(c, standardize, spec);
  json_t *augment = get_array(&s, "augment", OPTIONAL);
  if (augment) parse_augment(c, augment, spec);
  get_bool(&s, "drop_remainder", &spec->drop_remainder);
  int cache = get_choice(&s, "cache", OPTIONAL, "unknown cache", caches);
  if (cache >= 0) spec->cache_file = cache == 1;
  get_auto_int(&s, "prefetch", 1, 1024, &spec->prefetch);
  get_auto_int(&s, "num_parallel_calls", 0, 64, &spec->num_parallel_calls);
  if (get_integer(&s, "take", OPTIONAL, 1, INT64_MAX, &number) == 1) spec->take = number;
  if (get_integer(&s, "skip", OPTIONAL, 0, INT64_MAX, &number) == 1) spec->skip = number;
  json_t *interleave = get_object(&s, "interleave", OPTIONAL);
  if (interleave) {
    scope is = {c, interleave, "pipeline.interleave"};
    static const char *const ifields[] = {"cycle_length", "block_length", NULL};
    refuse_unknown(&is, ifields);
    int cycle = 0, block = 1;
    int ok = get_int(&is, "cycle_length", REQUIRED, 1, 1024, &cycle) == 1;
    ok &= get_int(&is, "block_length", OPTIONAL, 1, 65536, &block) >= 0;
    if (ok) {
      spec->interleave_cycle_length = cycle;
      spec->interleave_block_length = block;
    }
  }
  get_bool(&s, "one_hot", &spec->one_hot);
  int cast = get_choice(&s, "cast", OPTIONAL, "unsupported cast", casts);
  if (cast >= 0) spec->cast = (api_cast)cast;
  json_t *shard = get_object(&s, "shard", OPTIONAL);
  if (shard) {
    scope ss = {c, shard, "pipeline.shard"};
    static const char *const sfields[] = {"num_shards", "index", NULL};
    refuse_unknown(&ss, sfields);
    int shards = 1, index = 0;
    int ok = get_int(&ss, "num_shards", REQUIRED, 1, 65536, &shards) == 1;
    ok &= get_int(&ss, "index", REQUIRED, 0, 65535, &index) == 1;
    if (ok && index >= shards) {
      problem(c, "pipeline.shard.index", "must be below num_shards %d, got %d", shards, index);
    } else if (ok) {
      spec->num_shards = shards;
      spec->shard_index = index;
    }
  }
}

int api_loss_is_regression(api_loss loss) {
  return loss == API_LOSS_MEAN_SQUARED_ERROR || loss == API_LOSS_MEAN_ABSOLUTE_ERROR;
}

/* Keras's names; the short aliases map to the same loss. */
static const char *const loss_names[] = {"sparse_categorical_crossentropy",
                                         "categorical_crossentropy",
                                         "binary_crossentropy",
                                         "mean_squared_error",
                                         "mean_absolute_error",
                                         "mse",
                                         "mae",
                                         NULL};
static const api_loss loss_of_name[] = {API_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY,
                                        API_LOSS_CATEGORICAL_CROSSENTROPY,
                                        API_LOSS_BINARY_CROSSENTROPY,
                                        API_LOSS_MEAN_SQUARED_ERROR,
                                        API_LOSS_MEAN_ABSOLUTE_ERROR,
                                        API_LOSS_MEAN_SQUARED_ERROR,
                                        API_LOSS_MEAN_ABSOLUTE_ERROR};

/* The loss against the model's outputs, the metrics and the label maps:
 * each mismatch is named at the field that would have to change. */
static void check_loss(checker *c, api_job_spec *spec, int has_loss, const int metric_at[4]) {
  if (!has_loss) return;
  const api_loss loss = spec->loss_type;
  const int regression = api_loss_is_regression(loss);
  char last[PATH_LEN];
  index_path(last, "model.layers", (size_t)(spec->n_layers > 0 ? spec->n_layers - 1 : 0));
  if (spec->n_outputs > 0) {
    if ((loss == API_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY ||
         loss == API_LOSS_CATEGORICAL_CROSSENTROPY) &&
        spec->n_outputs < 2)
      problem(c, last,
              "%s needs a score per class, at least 2 units; got %d (one output: use "
              "binary_crossentropy, numbers: mean_squared_error)",
              spec->loss, spec->n_outputs);
    if (loss == API_LOSS_BINARY_CROSSENTROPY && spec->n_outputs > 1 && !spec->one_hot)
      problem(c, "pipeline.one_hot",
              "binary_crossentropy with %d outputs reads one-hot labels; set one_hot to true, "
              "or use 1 unit for labels 0/1",
              spec->n_outputs);
  }
  if (loss == API_LOSS_CATEGORICAL_CROSSENTROPY && !spec->one_hot)
    problem(c, "pipeline.one_hot",
            "categorical_crossentropy reads one-hot labels; set one_hot to true (or use "
            "sparse_categorical_crossentropy for class ids)");
  if (spec->one_hot && (loss == API_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY || regression ||
                        (loss == API_LOSS_BINARY_CROSSENTROPY && spec->n_outputs == 1)))
    problem(c, "pipeline.one_hot",
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
    index_path(path, "metrics", (size_t)metric_at[bit]);
    if (needs_regression != regression)
      problem(c, path, "'%s' needs a %s loss, and '%s' is a %s loss; supported with it: %s",
              metric_names[bit], needs_regression ? "regression" : "classification", spec->loss,
              regression ? "regression" : "classification",
              regression ? "mse, mae" : "accuracy, top_k_accuracy");
  }
}

/* A metric's index in API_METRIC_* bits, by Keras's names and aliases. */
static unsigned metric_bit(const char *name) {
  if (strcmp(name, "accuracy") == 0 || strcmp(name, "acc") == 0) return API_METRIC_ACCURACY;
  if (strcmp(name, "mse") == 0 || strcmp(name, "mean_squared_error") == 0) return API_METRIC_MSE;
  if (strcmp(name, "mae") == 0 || strcmp(name, "mean_absolute_error") == 0) return API_METRIC_MAE;
  if (strcmp(name, "top_k_accuracy") == 0 ||
      strcmp(name, "sparse_top_k_categorical_accuracy") == 0 ||
      strcmp(name, "top_k_categorical_accuracy") == 0)
    return API_METRIC_TOP_K;
  return 0;
}

/* Checks 0 <= value < 1 for momentum and the Adam betas. */
static void check_unit_interval(checker *c, const char *path, double value) {
  if (!(value >= 0 && value < 1)) problem(c, path, "must be >= 0 and < 1, got %g", value);
}

/* A metrics entry: a name, or {"type": "top_k_accuracy", "k": K}. Returns
 * the name, NULL after a problem. */
static const char *parse_metric(checker *c, json_t *metric, const char *path, api_job_spec *spec) {
  if (json_is_string(metric)) return json_string_value(metric);
  if (!json_is_object(metric)) {
    problem(c, path, "must be a metric name or an object with type and k, got %s",
            api_json_type_name(metric));
    return NULL;
  }
  scope s = {c, metric, path};
  static const char *const fields[] = {"type", "k", NULL};
  refuse_unknown(&s, fields);
  const char *type = get_string(&s, "type", REQUIRED);
  if (type && metric_bit(type) != API_METRIC_TOP_K) {
    char quoted[64], at[PATH_LEN];
    join_path(at, path, "type");
    problem(c, at, "only top_k_accuracy takes options, got '%s'",
            clip(type, quoted, sizeof quoted));
    return NULL;
  }
  get_int(&s, "k", OPTIONAL, 1, 1000, &spec->top_k);
  return type;
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
  int type = get_choice(&s, "type", REQUIRED, "unknown schedule type", types);
  const char *key;
  json_t *value;
  json_object_foreach(obj, key, value) {
    if (strcmp(key, "type") == 0 || strcmp(key, "warmup_steps") == 0 ||
        (type >= 0 && pick(key, own[type]) >= 0))
      continue;
    char path[PATH_LEN];
    join_path(path, "optimizer.schedule", key);
    problem(c, path,
            "unknown field for this schedule; expected: type, warmup_steps, and step_size, gamma "
            "(step); decay_steps, decay_rate, staircase (exponential); decay_steps, alpha "
            "(cosine)");
  }
  if (type < 0) return;
  sc->type = (api_schedule_type)type;
  get_int(&s, "warmup_steps", OPTIONAL, 0, 1000000000, &sc->warmup_steps);
  if (type == API_SCHEDULE_STEP) {
    get_int(&s, "step_size", REQUIRED, 1, 1000000000, &sc->step_size);
    sc->gamma = 0.1;
    if (get_number(&s, "gamma", OPTIONAL, &sc->gamma) == 1 && !(sc->gamma > 0 && sc->gamma <= 1))
      problem(c, "optimizer.schedule.gamma", "must be > 0 and <= 1, got %g", sc->gamma);
  } else if (type == API_SCHEDULE_EXPONENTIAL) {
    get_int(&s, "decay_steps", REQUIRED, 1, 1000000000, &sc->decay_steps);
    if (get_number(&s, "decay_rate", REQUIRED, &sc->decay_rate) == 1 &&
        !(sc->decay_rate > 0 && sc->decay_rate <= 1))
      problem(c, "optimizer.schedule.decay_rate", "must be > 0 and <= 1, got %g", sc->decay_rate);
    get_bool(&s, "staircase", &sc->staircase);
  } else if (type == API_SCHEDULE_COSINE) {
    get_int(&s, "decay_steps", REQUIRED, 1, 1000000000, &sc->decay_steps);
    if (get_number(&s, "alpha", OPTIONAL, &sc->alpha) == 1 && !(sc->alpha >= 0 && sc->alpha <= 1))
      problem(c, "optimizer.schedule.alpha", "must be >= 0 and <= 1, got %g", sc->alpha);
  }
}

static void parse_optimizer(checker *c, json_t *obj, api_job_spec *spec) {
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
  int type = get_choice(&s, "type", REQUIRED, "unknown optimizer type", types);

  const char *key;
  json_t *value;
  json_object_foreach(obj, key, value) {
    if (pick(key, common) >= 0 || (type >= 0 && pick(key, own[type]) >= 0)) continue;
    char path[PATH_LEN];
    join_path(path, "optimizer", key);
    int owner = -1;
    for (int t = 0; t <= API_OPT_ADAGRAD && owner < 0; t++)
      if (pick(key, own[t]) >= 0) owner = t;
    if (owner >= 0 && type >= 0)
      problem(c, path, "is an option of optimizer type '%s', not '%s'", types[owner], types[type]);
    else if (owner < 0)
      problem(c, path,
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

  if (get_number(&s, "learning_rate", OPTIONAL, &spec->learning_rate) == 1 &&
      !(spec->learning_rate > 0 && spec->learning_rate <= 10))
    problem(c, "optimizer.learning_rate", "must be > 0 and <= 10, got %g", spec->learning_rate);
  if (get_number(&s, "weight_decay", OPTIONAL, &spec->weight_decay) == 1 &&
      !(spec->weight_decay >= 0 && spec->weight_decay <= 1))
    problem(c, "optimizer.weight_decay", "must be >= 0 and <= 1, got %g", spec->weight_decay);

  if (type == API_OPT_SGD || type == API_OPT_RMSPROP) {
    int momentum_ok = 1;
    if (get_number(&s, "momentum", OPTIONAL, &spec->momentum) == 1) {
      momentum_ok = spec->momentum >= 0 && spec->momentum < 1;
      check_unit_interval(c, "optimizer.momentum", spec->momentum);
    }
    if (type == API_OPT_SGD && get_bool(&s, "nesterov", &spec->nesterov) == 1 && spec->nesterov &&
        momentum_ok && spec->momentum == 0)
      problem(c, "optimizer.nesterov", "nesterov requires momentum > 0, got momentum %g",
              spec->momentum);
  }
  if (type == API_OPT_ADAM || type == API_OPT_ADAMW) {
    if (get_number(&s, "beta_1", OPTIONAL, &spec->beta_1) == 1)
      check_unit_interval(c, "optimizer.beta_1", spec->beta_1);
    if (get_number(&s, "beta_2", OPTIONAL, &spec->beta_2) == 1)
      check_unit_interval(c, "optimizer.beta_2", spec->beta_2);
  }
  if (type == API_OPT_RMSPROP && get_number(&s, "rho", OPTIONAL, &spec->rho) == 1)
    check_unit_interval(c, "optimizer.rho", spec->rho);
  if (type == API_OPT_ADAGRAD &&
      get_number(&s, "initial_accumulator_value", OPTIONAL, &spec->initial_accumulator_value) ==
          1 &&
      !(spec->initial_accumulator_value >= 0))
    problem(c, "optimizer.initial_accumulator_value", "must be >= 0, got %g",
            spec->initial_accumulator_value);
  if (type != API_OPT_SGD && get_number(&s, "epsilon", OPTIONAL, &spec->epsilon) == 1 &&
      !(spec->epsilon > 0))
    problem(c, "optimizer.epsilon", "must be > 0, got %g", spec->epsilon);
  if (get_number(&s, "global_clipnorm", OPTIONAL, &spec->global_clipnorm) == 1 &&
      !(spec->global_clipnorm > 0 && spec->global_clipnorm <= 1e6))
    problem(c, "optimizer.global_clipnorm", "must be > 0 and <= 1e6, got %g",
            spec->global_clipnorm);
  json_t *schedule = get_object(&s, "schedule", OPTIONAL);
  if (schedule) parse_schedule(c, schedule, spec);
}

/* A callback's monitor: the name an epoch's end reports, from a Keras
 * name ("loss" is the epoch's mean loss, "val_loss" validation's), which
 * this job must report. */
static void parse_monitor(checker *c, const scope *s, const char *path, api_job_spec *spec,
                          api_callback *cb) {
  const char *name = get_string(s, "monitor", OPTIONAL);
  if (!name) name = "val_loss";
  char quoted[64], at[PATH_LEN];
  join_path(at, path, "monitor");
  const int val = strncmp(name, "val_", 4) == 0;
  const char *base = val ? name + 4 : strncmp(name, "epoch_", 6) == 0 ? name + 6 : name;
  unsigned bit = strcmp(base, "loss") == 0 ? 0u : metric_bit(base);
  if (strcmp(base, "loss") != 0 && !bit) {
    problem(c, at, "unknown metric '%s'; monitor loss, val_loss, or a metric of this job",
            clip(name, quoted, sizeof quoted));
    return;
  }
  static const char *const canonical[] = {"loss", "accuracy", "mse", "mae", "top_k_accuracy"};
  const char *stem = canonical[bit == 0                     ? 0
                               : bit == API_METRIC_ACCURACY ? 1
                               : bit == API_METRIC_MSE      ? 2
                               : bit == API_METRIC_MAE      ? 3
                                                            : 4];
  if (bit && !(spec->metrics & bit)) {
    problem(c, at, "'%s' is not reported: add '%s' to metrics", clip(name, quoted, sizeof quoted),
            stem);
    return;
  }
  if (val && strcmp(spec->validation, "none") == 0) {
    problem(c, at, "'%s' needs validation data, and dataset.validation is 'none'",
            clip(name, quoted, sizeof quoted));
    return;
  }
  snprintf(cb->monitor, sizeof cb->monitor, "%s_%s", val ? "val" : "epoch", stem);
  static const char *const modes[] = {"auto", "min", "max", NULL};
  int mode = get_choice(s, "mode", OPTIONAL, "unknown mode", modes);
  /* Keras's auto: higher is better for an accuracy, lower for the rest. */
  cb->mode_max = mode == 2 || (mode <= 0 && strstr(stem, "accuracy") != NULL);
}

static void parse_callback(checker *c, json_t *obj, const char *path, api_job_spec *spec,
                           api_callback *cb, int plateau) {
  scope s = {c, obj, path};
  static const char *const stop_fields[] = {"monitor", "mode", "min_delta", "patience", NULL};
  static const char *const plateau_fields[] = {"monitor", "mode",     "min_delta", "patience",
                                               "factor",  "cooldown", "min_lr",    NULL};
  refuse_unknown(&s, plateau ? plateau_fields : stop_fields);
  cb->enabled = 1;
  cb->min_delta = plateau ? 1e-4 : 0.0; /* Keras's defaults */
  cb->patience = plateau ? 10 : 0;
  cb->factor = plateau ? 0.1 : 0.0;
  parse_monitor(c, &s, path, spec, cb);
  char at[PATH_LEN];
  join_path(at, path, "min_delta");
  if (get_number(&s, "min_delta", OPTIONAL, &cb->min_delta) == 1 && !(cb->min_delta >= 0))
    problem(c, at, "must be >= 0, got %g", cb->min_delta);
  get_int(&s, "patience", OPTIONAL, 0, 100000, &cb->patience);
  if (!plateau) return;
  join_path(at, path, "factor");
  if (get_number(&s, "factor", OPTIONAL, &cb->factor) == 1 && !(cb->factor > 0 && cb->factor < 1))
    problem(c, at, "must be > 0 and < 1, got %g", cb->factor);
  get_int(&s, "cooldown", OPTIONAL, 0, 100000, &cb->cooldown);
  join_path(at, path, "min_lr");
  if (get_number(&s, "min_lr", OPTIONAL, &cb->min_lr) == 1 && !(cb->min_lr >= 0))
    problem(c, at, "must be >= 0, got %g", cb->min_lr);
  if (spec->schedule.type != API_SCHEDULE_CONSTANT || spec->schedule.warmup_steps > 0)
    problem(c, path, "cannot be combined with optimizer.schedule; use one or the other");
}

static void parse_callbacks(checker *c, json_t *obj, api_job_spec *spec) {
  scope s = {c, obj, "callbacks"};
  static const char *const fields[] = {"early_stopping", "reduce_lr_on_plateau", NULL};
  refuse_unknown(&s, fields);
  json_t *stop = get_object(&s, "early_stopping", OPTIONAL);
  if (stop) parse_callback(c, stop, "callbacks.early_stopping", spec, &spec->early_stopping, 0);
  json_t *plateau = get_object(&s, "reduce_lr_on_plateau", OPTIONAL);
  if (plateau)
    parse_callback(c, plateau, "callbacks.reduce_lr_on_plateau", spec, &spec->plateau, 1);
}

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

static void parse_resources(checker *c, json_t *obj, api_job_spec *spec) {
  scope s = {c, obj, "resources"};
  static const char *const fields[] = {"device_type", "devices", "pool", NULL};
  refuse_unknown(&s, fields);
  char quoted[64];
  const char *device_type = get_string(&s, "device_type", OPTIONAL);
  if (device_type && strcmp(device_type, "cpu") != 0 && strcmp(device_type, "gpu") != 0)
    problem(c, "resources.device_type", "must be cpu or gpu, got '%s'",
            clip(device_type, quoted, sizeof quoted));
  else if (device_type)
    copy_text(spec->device_type, sizeof spec->device_type, device_type);
  /* How many devices a pool has is the scheduler's to say: a job asking
   * for more than its pool holds is refused at create (FAILED_PRECONDITION). */
  get_int(&s, "devices", OPTIONAL, 1, API_MAX_DEVICES, &spec->devices);
  const char *pool = get_string(&s, "pool", OPTIONAL);
  if (pool && !valid_pool_name(pool))
    problem(c, "resources.pool",
            "must be 1 to %zu characters of A-Z a-z 0-9 - _ . (a pool of kilnd's --pools), got "
            "'%s'",
            sizeof spec->pool - 1, clip(pool, quoted, sizeof quoted));
  else if (pool)
    copy_text(spec->pool, sizeof spec->pool, pool);
  else if (strcmp(spec->device_type, "gpu") == 0) /* kilnd's pool of every GPU */
    copy_text(spec->pool, sizeof spec->pool, "gpu");
}

/* A GPU job: its replicas run float32 kernels on their GPUs (matmul and
 * relu, forward and backward; the other ops on the host), one GPU each,
 * gradients summed by NCCL. */
static void check_gpu(checker *c, const api_job_spec *spec) {
  if (strcmp(spec->device_type, "gpu") != 0) return;
  if (strcmp(spec->precision, "float32") != 0)
    problem(c, "precision",
            "resources.device_type gpu trains in float32 (kiln's CUDA kernels are float32), got "
            "'%s'",
            spec->precision);
  if (spec->strategy == API_STRATEGY_PARAMETER_SERVER)
    problem(c, "resources.device_type",
            "parameter_server runs its servers and workers on CPU cores; on GPUs use mirrored or "
            "multi_worker");
}

static const char *const strategy_names[] = {"single", "mirrored", "multi_worker",
                                             "parameter_server", NULL};
static const char *const aggregation_names[] = {"mean", "sum", "weighted_mean", NULL};

/* parameter_server: ps servers and workers (each process one rank), the
 * mode, and in async mode how far a worker may run ahead. */
static void parse_parameter_server(checker *c, scope *s, api_job_spec *spec) {
  char quoted[64];
  get_int(s, "ps", REQUIRED, 1, API_MAX_REPLICAS, &spec->ps_servers);
  get_int(s, "workers", REQUIRED, 1, API_MAX_REPLICAS, &spec->workers);
  if (spec->ps_servers + spec->workers > API_MAX_REPLICAS)
    problem(c, "strategy.ps", "workers + ps must be at most %d, got %d + %d", API_MAX_REPLICAS,
            spec->workers, spec->ps_servers);
  const char *mode = get_string(s, "mode", OPTIONAL);
  if (mode && strcmp(mode, "sync") != 0 && strcmp(mode, "async") != 0)
    problem(c, "strategy.mode", "must be sync or async, got '%s'",
            clip(mode, quoted, sizeof quoted));
  spec->ps_async = mode && strcmp(mode, "async") == 0;
  if (json_object_get(s->obj, "max_staleness")) {
    if (!spec->ps_async)
      problem(c, "strategy.max_staleness",
              "applies to mode async only (sync waits for every worker each step)");
    else
      get_int(s, "max_staleness", OPTIONAL, 0, 1000000, &spec->max_staleness);
  }
}

/* strategy: the type, and the options that type takes; an option of
 * another type is refused by name rather than ignored. */
static void parse_strategy(checker *c, json_t *obj, api_job_spec *spec) {
  scope s = {c, obj, "strategy"};
  static const char *const fields[] = {
      "type",          "replicas", "workers", "replicas_per_worker", "aggregation",
      "bucket_cap_mb", "ps",       "mode",    "max_staleness",       NULL};
  enum { MIRRORED = 1u << API_STRATEGY_MIRRORED, MULTI = 1u << API_STRATEGY_MULTI_WORKER };
  enum { PS = 1u << API_STRATEGY_PARAMETER_SERVER };
  /* which types take each field after "type": bit (1 << api_strategy) */
  static const unsigned takes[] = {MIRRORED, MULTI | PS, MULTI, MIRRORED | MULTI | PS,
                                   MULTI,    PS,         PS,    PS};
  refuse_unknown(&s, fields);
  char quoted[64];
  const char *type = get_string(&s, "type", REQUIRED);
  if (!type) return;
  int t = pick(type, strategy_names);
  if (t < 0) {
    problem(c, "strategy.type",
            "unsupported strategy '%s'; supported: single, mirrored, multi_worker, "
            "parameter_server",
            clip(type, quoted, sizeof quoted));
    return;
  }
  spec->strategy = (api_strategy)t;
  for (int i = 1; fields[i]; i++) {
    if (!json_object_get(obj, fields[i]) || (takes[i - 1] & (1u << t))) continue;
    char path[PATH_LEN];
    join_path(path, "strategy", fields[i]);
    problem(c, path, "does not apply to strategy '%s'", type);
  }
  if (t == API_STRATEGY_MIRRORED)
    get_int(&s, "replicas", REQUIRED, 1, API_MAX_REPLICAS, &spec->replicas);
  if (t == API_STRATEGY_MULTI_WORKER) {
    get_int(&s, "workers", REQUIRED, 1, API_MAX_REPLICAS, &spec->workers);
    get_int(&s, "replicas_per_worker", OPTIONAL, 1, API_MAX_REPLICAS, &spec->replicas);
    if ((long long)spec->workers * spec->replicas > API_MAX_REPLICAS)
      problem(c, "strategy.replicas_per_worker",
              "workers x replicas_per_worker must be at most %d, got %d x %d", API_MAX_REPLICAS,
              spec->workers, spec->replicas);
    if (get_number(&s, "bucket_cap_mb", OPTIONAL, &spec->bucket_cap_mb) == 1 &&
        !(spec->bucket_cap_mb > 0 && spec->bucket_cap_mb <= 1024))
      problem(c, "strategy.bucket_cap_mb", "must be > 0 and <= 1024, got %g", spec->bucket_cap_mb);
  }
  if (t == API_STRATEGY_PARAMETER_SERVER) parse_parameter_server(c, &s, spec);
  const char *aggregation =
      t == API_STRATEGY_SINGLE ? NULL : get_string(&s, "aggregation", OPTIONAL);
  int a = aggregation ? pick(aggregation, aggregation_names) : 0;
  if (a < 0)
    problem(c, "strategy.aggregation",
            "unsupported aggregation '%s'; supported: mean, sum, weighted_mean",
            clip(aggregation, quoted, sizeof quoted));
  else
    spec->aggregation = (api_aggregation)a;
}

/* When checkpoints are written and how many are kept: a resume (after a
 * crash, a retry, a preemption or :resume) starts from the newest. */
static void parse_checkpoint(checker *c, json_t *obj, api_job_spec *spec) {
  scope s = {c, obj, "checkpoint"};
  static const char *const fields[] = {"every_steps", "keep_last", "keep_best",
                                       "monitor",     "mode",      NULL};
  refuse_unknown(&s, fields);
  get_int(&s, "every_steps", OPTIONAL, 1, 1000000000, &spec->checkpoint_every_steps);
  get_int(&s, "keep_last", OPTIONAL, 1, 1000000, &spec->checkpoint_keep_last);
  get_int(&s, "keep_best", OPTIONAL, 1, 1000000, &spec->checkpoint_keep_best);
  char quoted[64];
  const char *monitor = get_string(&s, "monitor", OPTIONAL);
  const char *mode = get_string(&s, "mode", OPTIONAL);
  if (monitor && !spec->checkpoint_keep_best)
    problem(c, "checkpoint.monitor", "only ranks checkpoints for keep_best; set keep_best too");
  if (mode && !spec->checkpoint_keep_best)
    problem(c, "checkpoint.mode", "only ranks checkpoints for keep_best; set keep_best too");
  if (!spec->checkpoint_keep_best) return;
  if (!monitor) monitor = "val_loss"; /* Keras's default */
  /* The job reports loss and its metrics, each also as val_ with validation data. */
  const char *base = strncmp(monitor, "val_", 4) == 0 ? monitor + 4 : monitor;
  int known = !strcmp(base, "loss") || (metric_bit(base) & spec->metrics) != 0;
  if (!known)
    problem(c, "checkpoint.monitor",
            "'%s' is not a metric this job reports; use loss, val_loss or one of metrics "
            "(with or without val_)",
            clip(monitor, quoted, sizeof quoted));
  else
    copy_text(spec->checkpoint_monitor, sizeof spec->checkpoint_monitor, monitor);
  if (!mode || !strcmp(mode, "auto"))
    spec->checkpoint_mode_max = strstr(monitor, "acc") != NULL;
  else if (!strcmp(mode, "min") || !strcmp(mode, "max"))
    spec->checkpoint_mode_max = mode[1] == 'a';
  else
    problem(c, "checkpoint.mode", "must be min, max or auto, got '%s'",
            clip(mode, quoted, sizeof quoted));
}

/* profile: {"steps": [first, last]}, optimizer steps to record. */
static void parse_profile(checker *c, json_t *obj, api_job_spec *spec) {
  scope s = {c, obj, "profile"};
  static const char *const fields[] = {"steps", NULL};
  refuse_unknown(&s, fields);
  json_t *steps = get_array(&s, "steps", REQUIRED);
  if (!steps) return;
  long long first, last;
  if (json_array_size(steps) != 2 || !as_integer(json_array_get(steps, 0), &first) ||
      !as_integer(json_array_get(steps, 1), &last)) {
    problem(c, "profile.steps", "must be [first, last], two step numbers");
    return;
  }
  if (first < 1 || last < first || last - first >= API_MAX_PROFILE_STEPS || last > 1000000000)
    problem(c, "profile.steps",
            "must be 1 <= first <= last with at most %d steps, got [%lld, %lld]",
            API_MAX_PROFILE_STEPS, first, last);
  else {
    spec->profile_first = (int)first;
    spec->profile_last = (int)last;
  }
}

/* A replicated job holds a core per replica: resources.devices is
 * replicas x workers unless the spec asks for more. Loss scaling keeps
 * its scale on one graph, so mixed_float16 trains one replica for now. */
static void check_strategy_resources(checker *c, json_t *resources, api_job_spec *spec) {
  const int needed = spec->replicas * spec->workers + spec->ps_servers;
  const char *each = strcmp(spec->device_type, "gpu") == 0 ? "a GPU" : "a core";
  if (!resources || !json_object_get(resources, "devices"))
    spec->devices = needed;
  else if (spec->devices < needed && spec->strategy == API_STRATEGY_PARAMETER_SERVER)
    problem(c, "resources.devices",
            "must be at least workers + ps = %d for this strategy (a core per process), got %d",
            needed, spec->devices);
  else if (spec->devices < needed)
    problem(c, "resources.devices",
            "must be at least replicas x workers = %d for this strategy (%s per replica), got %d",
            needed, each, spec->devices);
  /* In sync mode each server holds a shard of the step's gradient only. */
  if (spec->strategy == API_STRATEGY_PARAMETER_SERVER && !spec->ps_async &&
      spec->global_clipnorm > 0)
    problem(c, "optimizer.global_clipnorm",
            "needs the whole gradient, which no process of a parameter_server sync job holds; "
            "use mode async (each worker clips its own), or multi_worker");
  /* Synchronized batch norm sums over every worker's step. */
  for (int i = 0;
       i < spec->n_layers && spec->strategy == API_STRATEGY_PARAMETER_SERVER && spec->ps_async;
       i++) {
    char field[PATH_LEN];
    snprintf(field, sizeof field, "model.layers[%d].synchronized", i);
    if (spec->layers[i].type == API_LAYER_BATCH_NORM && spec->layers[i].synchronized)
      problem(c, field,
              "needs every replica's step at once, and parameter_server mode async workers step "
              "alone; use mode sync, or leave batch norm unsynchronized");
  }
  if (strcmp(spec->precision, "mixed_float16") == 0)
    problem(c, "precision",
            "mixed_float16 (dynamic loss scaling) runs with strategy 'single' only for now; "
            "mixed_bfloat16 works with every strategy");
}

static void parse_spec(checker *c, json_t *root, api_job_spec *spec) {
  scope s = {c, root, ""};
  static const char *const fields[] = {"display_name",
                                       "model",
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
                                       "strategy",
                                       "max_restarts",
                                       "max_runtime",
                                       "checkpoint",
                                       "callbacks",
                                       "gradient_accumulation_steps",
                                       "validation_every_steps",
                                       "profile",
                                       NULL};
  refuse_unknown(&s, fields);
  char quoted[64];

  const char *display_name = get_string(&s, "display_name", OPTIONAL);
  if (display_name) {
    size_t len = strlen(display_name);
    if (len < 1 || len >= sizeof spec->display_name)
      problem(c, "display_name", "must be 1 to %zu bytes long, got %zu",
              sizeof spec->display_name - 1, len);
    else
      copy_text(spec->display_name, sizeof spec->display_name, display_name);
  }

  json_t *model = get_object(&s, "model", REQUIRED);
  if (model) parse_model(c, model, spec);

  const char *loss = get_string(&s, "loss", REQUIRED);
  int loss_index = loss ? pick(loss, loss_names) : -1;
  if (loss && loss_index < 0) {
    problem(c, "loss",
            "unsupported loss '%s'; supported: sparse_categorical_crossentropy, "
            "categorical_crossentropy, binary_crossentropy, mse, mae",
            clip(loss, quoted, sizeof quoted));
  } else if (loss) {
    spec->loss_type = loss_of_name[loss_index];
    copy_text(spec->loss, sizeof spec->loss, loss_names[spec->loss_type]);
  }

  json_t *metrics = get_array(&s, "metrics", OPTIONAL);
  int metric_at[4] = {0, 0, 0, 0}; /* where each metric was named, for messages */
  for (size_t i = 0; metrics && i < json_array_size(metrics); i++) {
    json_t *metric = json_array_get(metrics, i);
    char path[PATH_LEN];
    index_path(path, "metrics", i);
    const char *name = parse_metric(c, metric, path, spec);
    if (!name) continue;
    if (!metric_bit(name)) {
      problem(c, path,
              "unsupported metric '%s'; supported: accuracy, mse, mae, top_k_accuracy (or "
              "{\"type\": \"top_k_accuracy\", \"k\": K})",
              clip(name, quoted, sizeof quoted));
    } else {
      unsigned bit = metric_bit(name);
      spec->metrics |= bit;
      metric_at[bit == API_METRIC_ACCURACY ? 0
                : bit == API_METRIC_MSE    ? 1
                : bit == API_METRIC_MAE    ? 2
                                           : 3] = (int)i;
    }
  }
  spec->metric_accuracy = (spec->metrics & API_METRIC_ACCURACY) != 0;

  json_t *dataset = get_object(&s, "dataset", REQUIRED);
  if (dataset) parse_dataset(c, dataset, spec);
  json_t *pipeline = get_object(&s, "pipeline", OPTIONAL);
  if (pipeline) parse_pipeline(c, pipeline, spec);
  json_t *optimizer = get_object(&s, "optimizer", REQUIRED);
  if (optimizer) parse_optimizer(c, optimizer, spec);

  get_int(&s, "epochs", OPTIONAL, 1, 10000, &spec->epochs);
  get_int(&s, "log_every_steps", OPTIONAL, 1, 1000000, &spec->log_every_steps);
  long long seed;
  if (get_integer(&s, "seed", OPTIONAL, LLONG_MIN, LLONG_MAX, &seed) == 1) {
    if (seed < 0) {
      problem(c, "seed", "must be a non-negative integer, got %lld", seed);
    } else {
      spec->seed = (uint64_t)seed;
      spec->has_seed = 1;
    }
  }
  get_int(&s, "priority", OPTIONAL, 0, 100, &spec->priority);
  get_int(&s, "max_restarts", OPTIONAL, 0, API_MAX_RESTARTS, &spec->max_restarts);
  get_int(&s, "max_runtime", OPTIONAL, 0, API_MAX_RUNTIME_S, &spec->max_runtime_s);

  json_t *resources = get_object(&s, "resources", OPTIONAL);
  if (resources) parse_resources(c, resources, spec);
  const char *precision = get_string(&s, "precision", OPTIONAL);
  if (precision && strcmp(precision, "float32") != 0 && strcmp(precision, "mixed_bfloat16") != 0 &&
      strcmp(precision, "mixed_float16") != 0)
    problem(c, "precision",
            "unsupported precision '%s'; supported: float32, mixed_bfloat16, mixed_float16",
            clip(precision, quoted, sizeof quoted));
  else if (precision)
    copy_text(spec->precision, sizeof spec->precision, precision);
  get_bool(&s, "recompute", &spec->recompute);
  json_t *strategy = get_object(&s, "strategy", OPTIONAL);
  if (strategy) parse_strategy(c, strategy, spec);
  if (spec->strategy != API_STRATEGY_SINGLE) check_strategy_resources(c, resources, spec);
  check_gpu(c, spec);
  check_loss(c, spec, loss_index >= 0, metric_at);
  json_t *checkpoint = get_object(&s, "checkpoint", OPTIONAL);
  if (checkpoint) parse_checkpoint(c, checkpoint, spec);
  get_int(&s, "gradient_accumulation_steps", OPTIONAL, 1, 4096, &spec->accumulation_steps);
  if (get_int(&s, "validation_every_steps", OPTIONAL, 1, 1000000000,
              &spec->validation_every_steps) == 1 &&
      strcmp(spec->validation, "none") == 0)
    problem(c, "validation_every_steps", "needs validation data, and dataset.validation is 'none'");
  json_t *callbacks = get_object(&s, "callbacks", OPTIONAL);
  if (callbacks) parse_callbacks(c, callbacks, spec);
  json_t *profile = get_object(&s, "profile", OPTIONAL);
  if (profile) parse_profile(c, profile, spec);
}

static void set_defaults(api_job_spec *spec) {
  copy_text(spec->display_name, sizeof spec->display_name, "job");
  copy_text(spec->validation, sizeof spec->validation, "test");
  copy_text(spec->precision, sizeof spec->precision, "float32");
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
  copy_text(spec->device_type, sizeof spec->device_type, "cpu");
  spec->devices = 1;
  copy_text(spec->pool, sizeof spec->pool, "default");
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
  if (!d) return;
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
    problem(c, "model.input_shape",
            "holds %lld values per example, but %s examples hold %lld; use [%s]", have, d->name,
            want, shape);
  }
  long long outputs = spec->n_outputs;
  if (api_loss_is_regression(spec->loss_type)) {
    problem(c, "loss",
            "%s needs numeric labels, and %s's labels are classes; upload a CSV with a numeric "
            "label column for a regression",
            spec->loss, d->name);
    return;
  }
  if (spec->loss_type == API_LOSS_BINARY_CROSSENTROPY && outputs == 1 && d->n_classes > 2) {
    char path[PATH_LEN];
    index_path(path, "model.layers", (size_t)(spec->n_layers - 1));
    problem(c, path,
            "binary_crossentropy with 1 unit scores labels 0 and 1, but %s has %d classes; use "
            "%d units with one_hot",
            d->name, d->n_classes, d->n_classes);
    return;
  }
  if (outputs > 0 && outputs < d->n_classes) {
    char path[PATH_LEN];
    index_path(path, "model.layers", (size_t)(spec->n_layers - 1));
    problem(c, path, "outputs %lld class scores, but %s has %d classes", outputs, d->name,
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
  parse_spec(&c, root, spec);
  json_decref(root);
  if (c.problems == 0) check_fits_dataset(&c, spec);
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
  put(b, strategy, "type", json_string(strategy_names[spec->strategy]));
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
    put(b, strategy, "aggregation", json_string(aggregation_names[spec->aggregation]));
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
  put(b, obj, "type", json_string(layer_types[layer->type]));
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
    put(b, obj, "activation", json_string(activations[layer->activation]));
    put(b, obj, "use_bias", json_boolean(layer->use_bias));
    put(b, obj, "kernel_initializer", json_string(initializers[layer->kernel_initializer]));
    put(b, obj, "bias_initializer", json_string(initializers[layer->bias_initializer]));
    break;
  case API_LAYER_ACTIVATION:
    put(b, obj, "activation", json_string(activations[layer->activation]));
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
    put(b, obj, "padding", json_string(paddings[layer->padding_same ? 1 : 0]));
    put(b, obj, "dilation_rate", pair_json(b, layer->dilation_rate));
    if (layer->type != API_LAYER_CONV2D)
      put(b, obj, "depth_multiplier", json_integer(layer->depth_multiplier));
    put(b, obj, "activation", json_string(activations[layer->activation]));
    put(b, obj, "use_bias", json_boolean(layer->use_bias));
    if (layer->type == API_LAYER_CONV2D) {
      put(b, obj, "kernel_initializer", json_string(initializers[layer->kernel_initializer]));
      put(b, obj, "bias_initializer", json_string(initializers[layer->bias_initializer]));
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
    put(b, obj, "padding", json_string(paddings[layer->padding_same ? 1 : 0]));
    break;
  case API_LAYER_CONCATENATE: put(b, obj, "axis", json_integer(layer->axis)); break;
  case API_LAYER_FLATTEN:
  case API_LAYER_RELU:
  case API_LAYER_GLOBAL_AVG_POOL2D:
  case API_LAYER_ADD: break;
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
  for (int k = 0; augment_names[k]; k++) {
    unsigned bit = 1u << k;
    if (!(spec->augment & bit)) continue;
    if (bit == API_AUG_RANDOM_CROP || bit == API_AUG_RANDOM_BRIGHTNESS) {
      json_t *item = json_object();
      put(&b, item, "type", json_string(augment_names[k]));
      if (bit == API_AUG_RANDOM_CROP)
        put(&b, item, "padding", json_integer(spec->crop_padding));
      else
        put(&b, item, "max_delta", json_real(spec->brightness_delta));
      push(&b, augment, item);
    } else {
      push(&b, augment, json_string(augment_names[k]));
    }
  }
  put(&b, pipeline, "augment", augment);
  put(&b, pipeline, "drop_remainder", json_boolean(spec->drop_remainder));
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
  put(&b, root, "strategy", strategy_json(&b, spec));

  char *text = NULL;
  if (!b.failed) text = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(max_real_digits(root)));
  json_decref(root);
  return text;
}
