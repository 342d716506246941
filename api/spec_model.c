/* spec_model.c — the job spec's model section: layers with Keras's names and
 * defaults, their inputs, and the shape walk from the input to the outputs. */
#include "spec_internal.h"

#include <stdio.h>
#include <string.h>

#define MAX_DIM          65536
#define MAX_INPUT_VALUES (1LL << 24) /* per example: 16M values */
#define MAX_UNITS        65536

/* ---- sections ---- */

const char *const spec_layer_types[] = {"dense",
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
/* Activation layers by Keras's layer names: each is an activation layer
 * ({"type": "activation", "activation": ...}) once parsed, so what reads a
 * parsed model knows one kind of activation layer. The type names a layer
 * may give are spec_layer_types, then these. */
enum { TYPE_LEAKY_RELU = API_LAYER_CONCATENATE + 1, TYPE_ELU, TYPE_SOFTMAX };
static const char *const type_names[] = {"dense",
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
                                         "leaky_relu",
                                         "elu",
                                         "softmax",
                                         NULL};
static const api_activation activation_of_type[] = {[TYPE_LEAKY_RELU] = API_ACT_LEAKY_RELU,
                                                    [TYPE_ELU] = API_ACT_ELU,
                                                    [TYPE_SOFTMAX] = API_ACT_SOFTMAX};
const char *const spec_activations[] = {"linear", "relu",    "softmax", "leaky_relu", "elu",
                                        "gelu",   "sigmoid", "tanh",    NULL};
const char *const spec_paddings[] = {"valid", "same", NULL};
const char *const spec_initializers[] = {
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
                                           "negative_slope",
                                           "device",
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
    [TYPE_LEAKY_RELU] = {"type", "name", "inputs", "negative_slope", "alpha", NULL},
    [TYPE_ELU] = {"type", "name", "inputs", "alpha", NULL},
    [TYPE_SOFTMAX] = {"type", "name", "inputs", NULL},
};

#define MAX_WINDOW 1024

/* A Keras size pair: an integer n (meaning [n, n]) or [h, w], each in
 * [1, MAX_WINDOW]. Returns 1 when present and valid. */
static int get_pair(const scope *s, const char *key, int *out) {
  json_t *v = spec_member(s, key, OPTIONAL);
  if (!v) return 0;
  char path[PATH_LEN];
  spec_join_path(path, s->path, key);
  long long a, b;
  if (spec_as_integer(v, &a)) {
    b = a;
  } else if (json_is_array(v) && json_array_size(v) == 2 &&
             spec_as_integer(json_array_get(v, 0), &a) &&
             spec_as_integer(json_array_get(v, 1), &b)) {
  } else {
    spec_problem(s->c, path, "must be an integer or a pair [height, width] of integers, got %s",
                 api_json_type_name(v));
    return -1;
  }
  if (a < 1 || b < 1 || a > MAX_WINDOW || b > MAX_WINDOW) {
    spec_problem(s->c, path, "must be between 1 and %d, got [%lld, %lld]", MAX_WINDOW, a, b);
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

/* "device": "cpu" or "cuda:N" (a GPU of the job's, N from 0; "gpu:N" as
 * well), as under tf.device. Whether the job has that GPU is checked with
 * its resources (spec_check_gpu). */
static void parse_device(const scope *s, const char *path, api_layer *layer) {
  const char *dev = spec_get_string(s, "device", OPTIONAL);
  if (!dev) return;
  if (strcmp(dev, "cpu") == 0) {
    layer->device = -1;
    return;
  }
  const char *digits = strncmp(dev, "cuda:", 5) == 0  ? dev + 5
                       : strncmp(dev, "gpu:", 4) == 0 ? dev + 4
                                                      : NULL;
  int n = 0, len = 0;
  for (; digits && digits[len] >= '0' && digits[len] <= '9' && len < 4; len++)
    n = n * 10 + (digits[len] - '0');
  if (digits && len > 0 && digits[len] == '\0' && n < API_MAX_DEVICES) {
    layer->device = n + 1;
    return;
  }
  char field[PATH_LEN], quoted[64];
  spec_join_path(field, path, "device");
  spec_problem(s->c, field, "must be \"cpu\" or \"cuda:N\" (the job's GPU N, 0 to %d), got '%s'",
               API_MAX_DEVICES - 1, spec_clip(dev, quoted, sizeof quoted));
}

/* Parses one layer object. Returns its type's index in type_names, or -1
 * when the type is missing or unknown. *shape_known says whether the shape walk can go on past it
 * (a known type and valid sizes); *named whether the user gave a name.
 * "inputs" is resolved later, once every layer has its name. */
static int parse_layer(checker *c, json_t *obj, const char *path, api_layer *layer, int *named,
                       int *shape_known) {
  scope s = {c, obj, path};
  int type = spec_get_choice(&s, "type", REQUIRED, "unknown layer type", type_names);
  *shape_known = 0;

  const char *key;
  json_t *value;
  json_object_foreach(obj, key, value) {
    char field[PATH_LEN], expected[240];
    spec_join_path(field, path, key);
    if (strcmp(key, "device") == 0) continue; /* any layer's */
    if (type >= 0 && spec_pick(key, layer_fields) >= 0 && spec_pick(key, fields_by_type[type]) < 0)
      spec_problem(c, field, "not a field of a '%s' layer", type_names[type]);
    else if (spec_pick(key, layer_fields) < 0)
      spec_problem(c, field, "unknown field; expected one of: %s",
                   spec_list_text(type >= 0 ? fields_by_type[type] : layer_fields, expected,
                                  sizeof expected));
  }

  const char *name = spec_get_string(&s, "name", OPTIONAL);
  *named = json_object_get(obj, "name") != NULL;
  char field[PATH_LEN];
  if (name && valid_layer_name(name) && strcmp(name, "input") != 0) {
    spec_copy_text(layer->name, sizeof layer->name, name);
  } else if (name) {
    char quoted[80];
    spec_join_path(field, path, "name");
    if (strcmp(name, "input") == 0)
      spec_problem(c, field, "'input' names the model input in 'inputs'; choose another name");
    else
      spec_problem(c, field, "must be 1 to 63 characters from A-Z a-z 0-9 _ . -, got '%s'",
                   spec_clip(name, quoted, sizeof quoted));
  }
  parse_device(&s, path, layer);
  if (type < 0) return -1;

  layer->type = type > API_LAYER_CONCATENATE ? API_LAYER_ACTIVATION : (api_layer_type)type;
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
    if (spec_get_int(&s, "units", REQUIRED, 1, MAX_UNITS, &layer->units) != 1) *shape_known = 0;
    act = spec_get_choice(&s, "activation", OPTIONAL, "unknown activation", spec_activations);
    spec_get_bool(&s, "use_bias", &layer->use_bias);
    break;
  case API_LAYER_ACTIVATION:
    if (type > API_LAYER_CONCATENATE)
      act = (int)activation_of_type[type];
    else
      act = spec_get_choice(&s, "activation", REQUIRED, "unknown activation", spec_activations);
    break;
  case API_LAYER_RELU: layer->activation = API_ACT_RELU; break;
  case API_LAYER_CONV2D:
  case API_LAYER_SEPARABLE_CONV2D:
    if (spec_get_int(&s, "filters", REQUIRED, 1, MAX_UNITS, &layer->filters) != 1) *shape_known = 0;
    /* fall through */
  case API_LAYER_DEPTHWISE_CONV2D: {
    json_t *ks = spec_member(&s, "kernel_size", REQUIRED);
    if (!ks || get_pair(&s, "kernel_size", layer->kernel_size) != 1) *shape_known = 0;
    if (get_pair(&s, "strides", layer->strides) < 0) *shape_known = 0;
    if (get_pair(&s, "dilation_rate", layer->dilation_rate) < 0) *shape_known = 0;
    if ((layer->strides[0] > 1 || layer->strides[1] > 1) &&
        (layer->dilation_rate[0] > 1 || layer->dilation_rate[1] > 1)) {
      spec_join_path(field, path, "dilation_rate");
      spec_problem(c, field, "dilation_rate > 1 needs strides 1 (as in Keras)");
    }
    if (layer->type != API_LAYER_CONV2D &&
        spec_get_int(&s, "depth_multiplier", OPTIONAL, 1, 1024, &layer->depth_multiplier) < 0)
      *shape_known = 0;
    act = spec_get_choice(&s, "activation", OPTIONAL, "unknown activation", spec_activations);
    spec_get_bool(&s, "use_bias", &layer->use_bias);
    break;
  }
  case API_LAYER_BATCH_NORM:
    layer->momentum = 0.99;
    layer->epsilon = 0.001;
    if (spec_get_number(&s, "momentum", OPTIONAL, &layer->momentum) == 1 &&
        !(layer->momentum >= 0 && layer->momentum < 1)) {
      spec_join_path(field, path, "momentum");
      spec_problem(c, field, "must be >= 0 and < 1, got %g", layer->momentum);
    }
    if (spec_get_number(&s, "epsilon", OPTIONAL, &layer->epsilon) == 1 &&
        !(layer->epsilon > 0 && layer->epsilon < 1)) {
      spec_join_path(field, path, "epsilon");
      spec_problem(c, field, "must be > 0 and < 1, got %g", layer->epsilon);
    }
    spec_get_bool(&s, "synchronized", &layer->synchronized);
    break;
  case API_LAYER_DROPOUT:
    if (spec_get_number(&s, "rate", REQUIRED, &layer->rate) == 1 &&
        !(layer->rate >= 0 && layer->rate < 1)) {
      spec_join_path(field, path, "rate");
      spec_problem(c, field, "must be >= 0 and < 1, got %g", layer->rate);
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
    if (spec_get_int(&s, "axis", OPTIONAL, -API_MAX_DIMS, API_MAX_DIMS, &layer->axis) == 1 &&
        layer->axis == 0) {
      spec_join_path(field, path, "axis");
      spec_problem(c, field, "axis 0 is the batch; concatenate along a feature axis (1.. or -1)");
    }
    break;
  case API_LAYER_FLATTEN:
  case API_LAYER_GLOBAL_AVG_POOL2D:
  case API_LAYER_ADD: break;
  }
  if (act >= 0) layer->activation = (api_activation)act;
  int pad = spec_get_choice(&s, "padding", OPTIONAL, "unknown padding", spec_paddings);
  if (pad >= 0) layer->padding_same = pad;
  int ki =
      spec_get_choice(&s, "kernel_initializer", OPTIONAL, "unknown initializer", spec_initializers);
  if (ki >= 0) layer->kernel_initializer = (api_initializer)ki;
  int bi =
      spec_get_choice(&s, "bias_initializer", OPTIONAL, "unknown initializer", spec_initializers);
  if (bi >= 0) layer->bias_initializer = (api_initializer)bi;
  if (layer->type == API_LAYER_ACTIVATION) {
    if (layer->activation == API_ACT_LEAKY_RELU) layer->alpha = 0.3;
    if (layer->activation == API_ACT_ELU) layer->alpha = 1.0;
    /* Keras 3's LeakyReLU calls its slope negative_slope, Keras 2's alpha. */
    const char *slope = "alpha";
    if (type == TYPE_LEAKY_RELU && json_object_get(obj, "negative_slope")) {
      slope = "negative_slope";
      if (json_object_get(obj, "alpha")) {
        spec_join_path(field, path, "alpha");
        spec_problem(c, field, "give negative_slope or alpha (its Keras 2 name), not both");
      }
    }
    if (spec_get_number(&s, slope, OPTIONAL, &layer->alpha) == 1) {
      spec_join_path(field, path, slope);
      if (layer->activation != API_ACT_LEAKY_RELU && layer->activation != API_ACT_ELU)
        spec_problem(c, field, "alpha applies to leaky_relu and elu only");
      else if (!(layer->alpha > 0 && layer->alpha <= 100))
        spec_problem(c, field, "must be > 0 and <= 100, got %g", layer->alpha);
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
  spec_join_path(field, path, "inputs");
  int multi = layer->type == API_LAYER_ADD || layer->type == API_LAYER_CONCATENATE;
  if (!inputs) {
    if (multi)
      spec_problem(c, field, "a '%s' layer must name at least 2 inputs",
                   spec_layer_types[layer->type]);
    return !multi;
  }
  size_t n = json_is_array(inputs) ? json_array_size(inputs) : 0;
  size_t lo = multi ? 2 : 1, hi = multi ? API_MAX_LAYER_INPUTS : 1;
  if (!json_is_array(inputs) || n < lo || n > hi) {
    spec_problem(c, field, "must be a list of %zu%s layer names, got %s", lo, multi ? " to 8" : "",
                 json_is_array(inputs) ? "another count" : api_json_type_name(inputs));
    return 0;
  }
  for (size_t k = 0; k < n; k++) {
    json_t *item = json_array_get(inputs, k);
    char at[PATH_LEN];
    spec_index_path(at, field, k);
    const char *want = json_string_value(item);
    if (!want) {
      spec_problem(c, at, "must be a layer name, got %s", api_json_type_name(item));
      return 0;
    }
    int found = strcmp(want, "input") == 0 ? -1 : -2;
    for (int j = 0; j < spec->n_layers && found == -2; j++)
      if (strcmp(spec->layers[j].name, want) == 0) found = j;
    char quoted[80];
    if (found == -2 || found >= i) {
      spec_problem(c, at, "'%s' %s; name an earlier layer or \"input\"",
                   spec_clip(want, quoted, sizeof quoted),
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
    spec_index_path(path, "model.layers", (size_t)i);
    const layer_shape *in = layer->n_inputs
                                ? (layer->inputs[0] < 0 ? &input : &out[layer->inputs[0]])
                                : (i ? &out[i - 1] : &input);
    layer_shape s = *in;
    format_shape(in->dims, in->rank, text, sizeof text);
    const char *kind = spec_layer_types[layer->type];
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
        spec_problem(
            c, path,
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
        spec_problem(c, path, "%s expects an image input (height, width, channels), got shape %s",
                     kind, text);
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
        spec_problem(c, path,
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
        spec_problem(c, path,
                     "concatenate: axis %d is outside the inputs' rank %d (+1 for the batch)",
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
          spec_problem(c, path, "%s: input shapes %s and %s differ%s", kind, text, other,
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

  /* How many outputs the loss needs is checked with the loss (spec_check_loss). */
  const layer_shape *last = &out[spec->n_layers - 1];
  if (last->rank != 1 || last->dims[0] < 1) {
    char path[PATH_LEN], text[96];
    spec_index_path(path, "model.layers", (size_t)(spec->n_layers - 1));
    format_shape(last->dims, last->rank, text, sizeof text);
    spec_problem(c, path,
                 "the last layer must output the class scores or predictions, a flat vector (rank "
                 "1); got shape %s",
                 text);
    return;
  }
  spec->n_outputs = (int)last->dims[0];
}

void spec_parse_model(checker *c, json_t *obj, api_job_spec *spec) {
  scope s = {c, obj, "model"};
  static const char *const fields[] = {"input_shape", "layers", NULL};
  spec_refuse_unknown(&s, fields);

  int input_ok = 0;
  json_t *shape = spec_get_array(&s, "input_shape", REQUIRED);
  size_t ndim = shape ? json_array_size(shape) : 0;
  if (shape && (ndim < 1 || ndim > API_MAX_DIMS)) {
    spec_problem(c, "model.input_shape", "must have 1 to %d dimensions, got %zu", API_MAX_DIMS,
                 ndim);
  } else if (shape) {
    input_ok = 1;
    long long values = 1;
    int counted = 1; /* values is the exact product */
    for (size_t d = 0; d < ndim; d++) {
      json_t *dim = json_array_get(shape, d);
      long long size;
      char path[PATH_LEN];
      spec_index_path(path, "model.input_shape", d);
      if (!spec_as_integer(dim, &size) || size < 1 || size > MAX_DIM) {
        if (spec_as_integer(dim, &size))
          spec_problem(c, path, "must be between 1 and %d, got %lld", MAX_DIM, size);
        else if (json_is_real(dim))
          spec_problem(c, path, "must be a positive integer, got %g", json_real_value(dim));
        else
          spec_problem(c, path, "must be a positive integer, got %s", api_json_type_name(dim));
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
        spec_problem(c, "model.input_shape", "has %lld values per example; the limit is %lld",
                     values, MAX_INPUT_VALUES);
      else
        spec_problem(c, "model.input_shape", "has more than %lld values per example (the limit)",
                     MAX_INPUT_VALUES);
      input_ok = 0;
    }
  }

  json_t *layers = spec_get_array(&s, "layers", REQUIRED);
  if (!layers) return;
  size_t n_layers = json_array_size(layers);
  if (n_layers < 1 || n_layers > API_MAX_LAYERS) {
    spec_problem(c, "model.layers", "must list 1 to %d layers, got %zu", API_MAX_LAYERS, n_layers);
    return;
  }

  int shape_known[API_MAX_LAYERS] = {0};
  int named[API_MAX_LAYERS] = {0};
  int types[API_MAX_LAYERS];
  spec->n_layers = (int)n_layers;
  for (size_t i = 0; i < n_layers; i++) {
    char path[PATH_LEN];
    spec_index_path(path, "model.layers", i);
    json_t *layer = json_array_get(layers, i);
    types[i] = -1;
    if (!json_is_object(layer))
      spec_problem(c, path, "must be an object, got %s", api_json_type_name(layer));
    else
      types[i] = parse_layer(c, layer, path, &spec->layers[i], &named[i], &shape_known[i]);
  }

  /* Default names "<type>_<index>": "flatten_0", "dense_1", "leaky_relu_2". */
  for (size_t i = 0; i < n_layers; i++)
    if (!named[i] && types[i] >= 0)
      snprintf(spec->layers[i].name, sizeof spec->layers[i].name, "%s_%zu", type_names[types[i]],
               i);
  for (size_t j = 1; j < n_layers; j++) {
    for (size_t i = 0; i < j; i++) {
      const char *name = spec->layers[j].name;
      if (!name[0] || strcmp(name, spec->layers[i].name) != 0) continue;
      /* Blame the later name the user chose, never a generated one. */
      size_t blamed = named[j] ? j : i, other = named[j] ? i : j;
      char path[PATH_LEN], base[PATH_LEN];
      spec_index_path(base, "model.layers", blamed);
      spec_join_path(path, base, "name");
      if (named[other])
        spec_problem(c, path, "duplicate layer name '%s' (also the name of model.layers[%zu])",
                     name, other);
      else
        spec_problem(c, path, "layer name '%s' is also the default name of model.layers[%zu]", name,
                     other);
      break;
    }
  }

  for (size_t i = 0; i < n_layers; i++) {
    char path[PATH_LEN];
    spec_index_path(path, "model.layers", i);
    json_t *layer = json_array_get(layers, i);
    if (types[i] >= 0 && !parse_inputs(c, layer, path, spec, (int)i)) shape_known[i] = 0;
  }

  /* Softmax turns scores into probabilities; only the output may do that. */
  for (size_t i = 0; i + 1 < n_layers; i++) {
    if (spec->layers[i].activation != API_ACT_SOFTMAX) continue;
    char path[PATH_LEN], base[PATH_LEN];
    spec_index_path(base, "model.layers", i);
    if (types[i] == TYPE_SOFTMAX) /* the layer itself, it has no activation field */
      spec_copy_text(path, sizeof path, base);
    else
      spec_join_path(path, base, "activation");
    spec_problem(c, path, "softmax is allowed only on the last layer");
  }

  if (input_ok) walk_shapes(c, spec, shape_known);
}
