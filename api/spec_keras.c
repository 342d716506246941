/* spec_keras.c — a Keras model's configuration (model.to_json() of a
 * Sequential or functional model, Keras 2 or Keras 3) as the spec's model
 * section: each layer class becomes the kiln layer of the same meaning, with
 * Keras's names and defaults, and spec_model.c validates the result, so one
 * path checks both. What kiln cannot honour is a problem at its path under
 * keras_model, never dropped in silence. */
#include "spec_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum {
  K_DENSE = 0,
  K_CONV2D,
  K_DEPTHWISE_CONV2D,
  K_SEPARABLE_CONV2D,
  K_BATCH_NORM,
  K_DROPOUT,
  K_MAX_POOL2D,
  K_AVG_POOL2D,
  K_GLOBAL_AVG_POOL2D,
  K_FLATTEN,
  K_ACTIVATION,
  K_RELU,
  K_LEAKY_RELU,
  K_ELU,
  K_SOFTMAX,
  K_ADD,
  K_CONCATENATE,
  K_INPUT_LAYER,
};

/* Keras's class names, and the kiln layer type each becomes; the InputLayer
 * becomes the model's input_shape. */
static const char *const keras_classes[] = {"Dense",
                                            "Conv2D",
                                            "DepthwiseConv2D",
                                            "SeparableConv2D",
                                            "BatchNormalization",
                                            "Dropout",
                                            "MaxPooling2D",
                                            "AveragePooling2D",
                                            "GlobalAveragePooling2D",
                                            "Flatten",
                                            "Activation",
                                            "ReLU",
                                            "LeakyReLU",
                                            "ELU",
                                            "Softmax",
                                            "Add",
                                            "Concatenate",
                                            NULL}; /* and "InputLayer", K_INPUT_LAYER */
static const char *const kiln_types[] = {"dense",
                                         "conv2d",
                                         "depthwise_conv2d",
                                         "separable_conv2d",
                                         "batch_norm",
                                         "dropout",
                                         "max_pool2d",
                                         "avg_pool2d",
                                         "global_avg_pool2d",
                                         "flatten",
                                         "activation",
                                         "relu",
                                         "leaky_relu",
                                         "elu",
                                         "softmax",
                                         "add",
                                         "concatenate"};

static const char *class_label(int cls) {
  return cls == K_INPUT_LAYER ? "InputLayer" : keras_classes[cls];
}

/* Each class's own config fields besides name, trainable, dtype and the
 * input shape a first layer may carry; *_regularizer and *_constraint
 * fields are read by every class (they must be null). */
static const char *const class_fields[][20] = {
    [K_DENSE] = {"units", "activation", "use_bias", "kernel_initializer", "bias_initializer",
                 "lora_rank", "lora_alpha", "quantization_config", NULL},
    [K_CONV2D] = {"filters", "kernel_size", "strides", "padding", "data_format", "dilation_rate",
                  "groups", "activation", "use_bias", "kernel_initializer", "bias_initializer",
                  "lora_rank", "lora_alpha", NULL},
    [K_DEPTHWISE_CONV2D] = {"depth_multiplier", "kernel_size", "strides", "padding", "data_format",
                            "dilation_rate", "groups", "activation", "use_bias",
                            "depthwise_initializer", "bias_initializer", NULL},
    [K_SEPARABLE_CONV2D] = {"depth_multiplier", "filters", "kernel_size", "strides", "padding",
                            "data_format", "dilation_rate", "groups", "activation", "use_bias",
                            "depthwise_initializer", "pointwise_initializer", "bias_initializer",
                            NULL},
    [K_BATCH_NORM] = {"axis", "momentum", "epsilon", "center", "scale", "beta_initializer",
                      "gamma_initializer", "moving_mean_initializer", "moving_variance_initializer",
                      "synchronized", "renorm", "renorm_clipping", "renorm_momentum", "fused",
                      "virtual_batch_size", "adjustment", NULL},
    [K_DROPOUT] = {"rate", "noise_shape", "seed", NULL},
    [K_MAX_POOL2D] = {"pool_size", "strides", "padding", "data_format", NULL},
    [K_AVG_POOL2D] = {"pool_size", "strides", "padding", "data_format", NULL},
    [K_GLOBAL_AVG_POOL2D] = {"data_format", "keepdims", NULL},
    [K_FLATTEN] = {"data_format", NULL},
    [K_ACTIVATION] = {"activation", NULL},
    [K_RELU] = {"max_value", "negative_slope", "threshold", NULL},
    [K_LEAKY_RELU] = {"negative_slope", "alpha", NULL},
    [K_ELU] = {"alpha", NULL},
    [K_SOFTMAX] = {"axis", NULL},
    [K_ADD] = {NULL},
    [K_CONCATENATE] = {"axis", NULL},
    [K_INPUT_LAYER] = {"sparse", "ragged", "optional", NULL},
};

/* Fields whose Keras value is the kiln layer's field of the same name;
 * spec_model.c checks the value. */
static const char *const copied[] = {
    "units",     "filters",       "kernel_size",    "strides",
    "padding",   "dilation_rate", "use_bias",       "depth_multiplier",
    "rate",      "momentum",      "epsilon",        "synchronized",
    "pool_size", "alpha",         "negative_slope", NULL};
/* Fields kiln has no counterpart for that change nothing at their value:
 * must be null, false or true. */
static const char *const must_be_null[] = {
    "max_value",  "lora_rank", "quantization_config", "noise_shape", "virtual_batch_size",
    "adjustment", NULL};
static const char *const must_be_false[] = {"sparse", "ragged",   "optional",
                                            "renorm", "keepdims", NULL};
static const char *const must_be_true[] = {"center", "scale", NULL};
/* Fields that do not change what kiln trains: a dropout's or an
 * initializer's seed (the spec's seed draws every stream), and batch
 * norm's kernel choice and the renorm options that apply only with renorm. */
static const char *const ignored[] = {
    "seed", "lora_alpha", "fused", "renorm_clipping", "renorm_momentum", NULL};

static const char *const keras_initializers[] = {
    "GlorotUniform", "GlorotNormal", "HeUniform", "HeNormal", "Zeros", "Ones", NULL};

/* A path made by a format, cut at PATH_LEN as the checker's paths are. */
__attribute__((format(printf, 2, 3))) static void format_path(char out[PATH_LEN], const char *fmt,
                                                              ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(out, PATH_LEN, fmt, ap);
  va_end(ap);
  if (n < 0) out[0] = '\0';
}

static int ends_with(const char *text, const char *tail) {
  size_t n = strlen(text), m = strlen(tail);
  return n >= m && strcmp(text + n - m, tail) == 0;
}

/* A Keras initializer ({"class_name": "HeNormal", "config": {"seed": null}},
 * with "module" and "registered_name" in Keras 3, or a name "he_normal") as
 * kiln's name; NULL after a problem. */
static const char *initializer_name(checker *c, json_t *value, const char *path) {
  const char *name = json_string_value(value);
  json_t *config = NULL;
  if (json_is_object(value)) {
    name = json_string_value(json_object_get(value, "class_name"));
    config = json_object_get(value, "config");
  }
  char quoted[64], supported[128];
  if (!name) {
    spec_problem(c, path,
                 "must be a Keras initializer ({\"class_name\": ..., \"config\": ...}), got %s",
                 api_json_type_name(value));
    return NULL;
  }
  int k = spec_pick(name, keras_initializers);
  if (k < 0) k = spec_pick(name, spec_initializers);
  if (k < 0) {
    spec_problem(c, path, "initializer '%s' is not one kiln has; supported: %s",
                 spec_clip(name, quoted, sizeof quoted),
                 spec_list_text(keras_initializers, supported, sizeof supported));
    return NULL;
  }
  const char *key;
  json_t *v;
  json_object_foreach(config, key, v) {
    if (strcmp(key, "seed") == 0) continue;
    char field[PATH_LEN], sub[PATH_LEN];
    spec_join_path(sub, path, "config");
    spec_join_path(field, sub, key);
    spec_problem(c, field, "kiln's %s takes no options", keras_initializers[k]);
    return NULL;
  }
  return spec_initializers[k];
}

/* One translation: the Keras layer at path (its config at cpath) into the
 * kiln layer out. */
typedef struct keras_layer {
  checker *c;
  int cls;
  json_t *config;
  const char *path;
  char cpath[PATH_LEN];
  json_t *out;
} keras_layer;

static void field_path(const keras_layer *k, const char *key, char out[PATH_LEN]) {
  spec_join_path(out, k->cpath, key);
}

/* Dense and the convolutions: Keras's activation names are kiln's, but for
 * leaky_relu, whose slope Keras's function puts at 0.2 and kiln's fused
 * activation at 0.3 (Keras's LeakyReLU layer's). */
static void put_activation(keras_layer *k, json_t *value) {
  char path[PATH_LEN];
  field_path(k, "activation", path);
  if (json_is_null(value)) return; /* Keras: None is linear */
  const char *name = json_string_value(value);
  if (name && strcmp(name, "leaky_relu") == 0 && k->cls != K_ACTIVATION) {
    spec_problem(k->c, path,
                 "activation leaky_relu on a %s (Keras's slope 0.2) is not one kiln fuses; put a "
                 "LeakyReLU layer after it",
                 class_label(k->cls));
    return;
  }
  json_object_set(k->out, "activation", value);
  if (name && strcmp(name, "leaky_relu") == 0) /* keras.activations.leaky_relu */
    json_object_set_new(k->out, "alpha", json_real(0.2));
}

/* An initializer kiln writes as kiln_key, or must be the one kiln uses
 * (kiln_key NULL: depthwise and pointwise kernels are Glorot uniform,
 * biases zeros, batch norm's gamma and moving variance ones, the rest zeros). */
static void put_initializer(keras_layer *k, const char *key, json_t *value, const char *kiln_key,
                            const char *fixed) {
  char path[PATH_LEN];
  field_path(k, key, path);
  const char *name = initializer_name(k->c, value, path);
  if (!name) return;
  if (kiln_key) {
    json_object_set_new(k->out, kiln_key, json_string(name));
  } else if (strcmp(name, fixed) != 0) {
    spec_problem(k->c, path, "kiln's %s uses %s here, got %s", class_label(k->cls), fixed, name);
  }
}

/* A Keras axis (an integer or a list of one) as an integer; 0 after a problem. */
static int one_axis(keras_layer *k, const char *key, json_t *value, long long *axis) {
  if (json_is_array(value) && json_array_size(value) == 1) value = json_array_get(value, 0);
  if (spec_as_integer(value, axis)) return 1;
  char path[PATH_LEN];
  field_path(k, key, path);
  spec_problem(k->c, path, "must be one axis, got %s", api_json_type_name(value));
  return 0;
}

/* The config fields kiln reads in its own way. Returns 1 when key was one. */
static int special_field(keras_layer *k, const char *key, json_t *value) {
  char path[PATH_LEN];
  field_path(k, key, path);
  long long axis;
  if (strcmp(key, "activation") == 0) {
    put_activation(k, value);
  } else if (strcmp(key, "data_format") == 0) {
    const char *f = json_string_value(value);
    if (!json_is_null(value) && (!f || strcmp(f, "channels_last") != 0))
      spec_problem(k->c, path, "kiln's images are channels_last (height, width, channels), got %s",
                   f ? f : api_json_type_name(value));
  } else if (strcmp(key, "groups") == 0) {
    if (!spec_as_integer(value, &axis) || axis != 1)
      spec_problem(k->c, path, "grouped convolutions are not one kiln has; groups must be 1");
  } else if (strcmp(key, "kernel_initializer") == 0 || strcmp(key, "bias_initializer") == 0) {
    int conv = k->cls == K_DENSE || k->cls == K_CONV2D;
    put_initializer(k, key, value, conv ? key : NULL, "zeros");
  } else if (strcmp(key, "depthwise_initializer") == 0 ||
             strcmp(key, "pointwise_initializer") == 0) {
    put_initializer(k, key, value, NULL, "glorot_uniform");
  } else if (ends_with(key, "_initializer")) { /* batch norm's */
    int ones =
        strcmp(key, "gamma_initializer") == 0 || strcmp(key, "moving_variance_initializer") == 0;
    put_initializer(k, key, value, NULL, ones ? "ones" : "zeros");
  } else if (k->cls == K_BATCH_NORM && strcmp(key, "axis") == 0) {
    /* The channels: the last axis of an image (3) or of a vector (1). */
    if (one_axis(k, key, value, &axis) && axis != -1 && axis != 1 && axis != 3)
      spec_problem(k->c, path, "kiln normalizes over the last (channel) axis, -1; got %lld", axis);
  } else if (k->cls == K_SOFTMAX && strcmp(key, "axis") == 0) {
    if (one_axis(k, key, value, &axis) && axis != -1)
      spec_problem(k->c, path, "kiln's softmax is over the last axis, -1; got %lld", axis);
  } else if (k->cls == K_CONCATENATE && strcmp(key, "axis") == 0) {
    json_object_set(k->out, "axis", value);
  } else if (k->cls == K_RELU && strcmp(key, "threshold") == 0) {
    if (!json_is_number(value) || json_number_value(value) != 0)
      spec_problem(k->c, path, "kiln's relu has threshold 0");
  } else if (k->cls == K_RELU && strcmp(key, "negative_slope") == 0) {
    /* ReLU(negative_slope=s) is LeakyReLU(s); 0 is the plain relu. */
    if (!json_is_number(value) || json_number_value(value) != 0) {
      json_object_set_new(k->out, "type", json_string("leaky_relu"));
      json_object_set(k->out, "negative_slope", value);
    }
  } else {
    return 0;
  }
  return 1;
}

/* A layer's config into k->out: every field is translated, checked to be
 * kiln's behaviour, or refused by name. */
static void translate_config(keras_layer *k) {
  const char *key;
  json_t *value;
  json_object_foreach(k->config, key, value) {
    char path[PATH_LEN];
    field_path(k, key, path);
    if (strcmp(key, "name") == 0 || strcmp(key, "batch_input_shape") == 0 ||
        strcmp(key, "batch_shape") == 0)
      continue; /* read by the caller */
    if (strcmp(key, "trainable") == 0) {
      if (!json_is_true(value))
        spec_problem(k->c, path,
                     "kiln trains every layer; a frozen layer (trainable false) is "
                     "not supported");
      continue;
    }
    if (strcmp(key, "dtype") == 0) {
      /* "float32", or Keras 3's {"class_name": "DTypePolicy", "config": {"name": "float32"}} */
      json_t *policy = json_object_get(json_object_get(value, "config"), "name");
      const char *dtype =
          json_is_object(value) ? json_string_value(policy) : json_string_value(value);
      if (!json_is_null(value) && (!dtype || strcmp(dtype, "float32") != 0))
        spec_problem(k->c, path,
                     "a layer's dtype must be float32; set the spec's precision (float32, "
                     "mixed_bfloat16, mixed_float16) for the whole model, got %s",
                     dtype ? dtype : api_json_type_name(value));
      continue;
    }
    if (ends_with(key, "_regularizer") || ends_with(key, "_constraint")) {
      if (!json_is_null(value))
        spec_problem(k->c, path,
                     "kiln has no regularizers or constraints on a layer; must be null "
                     "(the optimizer's weight_decay is there)");
      continue;
    }
    if (spec_pick(key, class_fields[k->cls]) < 0) {
      char known[400];
      spec_problem(k->c, path,
                   "not a field of a Keras %s that kiln translates; it reads: name, "
                   "trainable, dtype, %s",
                   class_label(k->cls), spec_list_text(class_fields[k->cls], known, sizeof known));
      continue;
    }
    if (spec_pick(key, ignored) >= 0 || special_field(k, key, value)) continue;
    if (spec_pick(key, must_be_null) >= 0) {
      if (!json_is_null(value)) spec_problem(k->c, path, "kiln has no %s; must be null", key);
    } else if (spec_pick(key, must_be_false) >= 0) {
      if (!json_is_false(value)) spec_problem(k->c, path, "kiln has no %s; must be false", key);
    } else if (spec_pick(key, must_be_true) >= 0) {
      if (!json_is_true(value))
        spec_problem(k->c, path, "kiln's batch norm always has %s; must be true", key);
    } else if (spec_pick(key, copied) >= 0) {
      /* Pooling's strides: None is the pool size, kiln's default too. */
      if (!json_is_null(value)) json_object_set(k->out, key, value);
    }
  }
}

/* ---- the model ---- */

/* [null, 28, 28, 1] (the batch first) as kiln's per-example input_shape. */
static json_t *input_shape(checker *c, json_t *shape, const char *path) {
  if (!shape) {
    spec_problem(c, path,
                 "is missing: an InputLayer needs batch_shape (Keras 3) or batch_input_shape "
                 "(Keras 2)");
    return NULL;
  }
  if (!json_is_array(shape) || json_array_size(shape) < 2) {
    spec_problem(c, path, "must be [batch, dims...] with at least one dimension, got %s",
                 json_is_array(shape) ? "a shorter list" : api_json_type_name(shape));
    return NULL;
  }
  json_t *out = json_array();
  for (size_t d = 1; d < json_array_size(shape); d++) {
    json_t *dim = json_array_get(shape, d);
    if (json_is_null(dim)) {
      char at[PATH_LEN];
      spec_index_path(at, path, d);
      spec_problem(c, at, "kiln needs every dimension but the batch; got null (a variable size)");
      json_decref(out);
      return NULL;
    }
    json_array_append(out, dim); /* kiln checks each as model.input_shape */
  }
  return out;
}

/* A Keras tensor reference: Keras 2's [name, node, tensor, kwargs] or
 * Keras 3's {"class_name": "__keras_tensor__", "config": {"keras_history":
 * [name, node, tensor]}}. Returns the layer's name, NULL after a problem. */
static const char *tensor_source(checker *c, json_t *ref, const char *path) {
  json_t *history = ref;
  if (json_is_object(ref))
    history = json_object_get(json_object_get(ref, "config"), "keras_history");
  const char *name = json_string_value(json_array_get(history, 0));
  long long node = -1, tensor = -1;
  if (!name || !spec_as_integer(json_array_get(history, 1), &node) ||
      !spec_as_integer(json_array_get(history, 2), &tensor)) {
    spec_problem(c, path,
                 "must be a Keras tensor: [name, node_index, tensor_index, {}] or a "
                 "__keras_tensor__ with keras_history");
    return NULL;
  }
  if (node != 0 || tensor != 0) {
    spec_problem(c, path,
                 "reads call %lld, output %lld of '%s'; kiln translates layers called "
                 "once with one output",
                 node, tensor, name);
    return NULL;
  }
  json_t *kwargs = json_array_get(history, 3);
  if (kwargs && json_object_size(kwargs) > 0) {
    spec_problem(c, path, "a layer called with arguments is not one kiln translates");
    return NULL;
  }
  return name;
}

/* The layers a functional layer reads, from its inbound_nodes: Keras 2's
 * [[ref, ...]] or Keras 3's [{"args": [ref or [ref, ...]], "kwargs": {}}].
 * Returns how many (0 for an InputLayer), -1 after a problem. */
static int inbound(checker *c, json_t *entry, const char *path, const char **names) {
  char at[PATH_LEN];
  spec_join_path(at, path, "inbound_nodes");
  json_t *nodes = json_object_get(entry, "inbound_nodes");
  if (!json_is_array(nodes)) {
    spec_problem(c, at, "a layer of a functional model must list its inbound_nodes, got %s",
                 nodes ? api_json_type_name(nodes) : "none");
    return -1;
  }
  if (json_array_size(nodes) == 0) return 0;
  if (json_array_size(nodes) > 1) {
    spec_problem(c, at,
                 "the layer is called %zu times (a shared layer); kiln translates layers "
                 "called once",
                 json_array_size(nodes));
    return -1;
  }
  json_t *node = json_array_get(nodes, 0), *refs = node;
  char node_path[PATH_LEN], refs_path[PATH_LEN];
  spec_index_path(node_path, at, 0);
  spec_copy_text(refs_path, sizeof refs_path, node_path);
  if (json_is_object(node)) { /* Keras 3 */
    json_t *args = json_object_get(node, "args"), *kwargs = json_object_get(node, "kwargs");
    const char *key;
    json_t *v;
    json_object_foreach(kwargs, key, v) {
      if (json_is_null(v)) continue;
      char kpath[PATH_LEN], base[PATH_LEN];
      spec_join_path(base, node_path, "kwargs");
      spec_join_path(kpath, base, key);
      spec_problem(c, kpath, "a layer called with %s is not one kiln translates", key);
      return -1;
    }
    spec_join_path(refs_path, node_path, "args");
    refs = args;
    /* A merge layer takes one argument, the list of its inputs. */
    if (json_array_size(args) == 1 && json_is_array(json_array_get(args, 0))) {
      refs = json_array_get(args, 0);
      spec_index_path(at, refs_path, 0);
      spec_copy_text(refs_path, sizeof refs_path, at);
    }
  }
  size_t n = json_array_size(refs);
  if (n < 1 || n > API_MAX_LAYER_INPUTS) {
    spec_problem(c, refs_path, "must name 1 to %d input tensors, got %zu", API_MAX_LAYER_INPUTS, n);
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    spec_index_path(at, refs_path, i);
    names[i] = tensor_source(c, json_array_get(refs, i), at);
    if (!names[i]) return -1;
  }
  return (int)n;
}

/* The one layer named by input_layers or output_layers: [[name, 0, 0]] or
 * Keras 3's [name, 0, 0]. */
static const char *end_layer(checker *c, json_t *config, const char *key) {
  char path[PATH_LEN];
  spec_join_path(path, "keras_model.config", key);
  json_t *list = json_object_get(config, key);
  if (json_is_array(list) && json_is_string(json_array_get(list, 0)))
    return tensor_source(c, list, path);
  if (!json_is_array(list) || json_array_size(list) != 1) {
    spec_problem(c, path, "kiln's models have one %s; must name one layer, got %s",
                 key[0] == 'i' ? "input" : "output",
                 json_is_array(list) ? "another count" : api_json_type_name(list));
    return NULL;
  }
  spec_index_path(path, path, 0);
  return tensor_source(c, json_array_get(list, 0), path);
}

/* Where the input shape comes from when there is no InputLayer: a first
 * layer's batch_input_shape (Keras 2), the Sequential's build_input_shape
 * or the model's build_config (Keras 3). */
static json_t *implicit_shape(json_t *root, json_t *config, json_t *first, char path[PATH_LEN]) {
  static const char *const keys[] = {"batch_input_shape", "batch_shape"};
  json_t *fc = json_object_get(first, "config");
  for (int i = 0; i < 2; i++) {
    if (json_object_get(fc, keys[i])) {
      format_path(path, "keras_model.config.layers[0].config.%s", keys[i]);
      return json_object_get(fc, keys[i]);
    }
  }
  if (json_object_get(config, "build_input_shape")) {
    spec_copy_text(path, PATH_LEN, "keras_model.config.build_input_shape");
    return json_object_get(config, "build_input_shape");
  }
  json_t *build = json_object_get(json_object_get(root, "build_config"), "input_shape");
  spec_copy_text(path, PATH_LEN, "keras_model.build_config.input_shape");
  return build;
}

json_t *spec_keras_translate(checker *c, json_t *root, keras_paths *kp) {
  memset(kp, 0, sizeof *kp);
  kp->used = 1;
  static const char *const top_fields[] = {"class_name",      "config",       "module",
                                           "registered_name", "build_config", "compile_config",
                                           "keras_version",   "backend",      NULL};
  static const char *const config_fields[] = {
      "name",      "layers", "input_layers",      "output_layers",
      "trainable", "dtype",  "build_input_shape", NULL};
  scope s = {c, root, "keras_model"};
  spec_refuse_unknown(&s, top_fields);
  const char *model_class = spec_get_string(&s, "class_name", REQUIRED);
  json_t *config = spec_get_object(&s, "config", REQUIRED);
  if (!model_class || !config) return NULL;
  int sequential = strcmp(model_class, "Sequential") == 0;
  if (!sequential && strcmp(model_class, "Functional") != 0 && strcmp(model_class, "Model") != 0) {
    char quoted[64];
    spec_problem(c, "keras_model.class_name",
                 "kiln translates a Sequential or a functional model (Functional, Model), got '%s'",
                 spec_clip(model_class, quoted, sizeof quoted));
    return NULL;
  }
  scope cs = {c, config, "keras_model.config"};
  spec_refuse_unknown(&cs, config_fields);
  json_t *trainable = json_object_get(config, "trainable");
  if (trainable && !json_is_true(trainable))
    spec_problem(c, "keras_model.config.trainable",
                 "kiln trains every layer; a frozen model (trainable false) is not supported");
  json_t *layers = spec_get_array(&cs, "layers", REQUIRED);
  if (!layers) return NULL;
  size_t n = json_array_size(layers);
  if (n < 1) {
    spec_problem(c, "keras_model.config.layers", "must list the model's layers, got none");
    return NULL;
  }

  const char *input_name = NULL, *output_name = NULL;
  if (!sequential) {
    input_name = end_layer(c, config, "input_layers");
    output_name = end_layer(c, config, "output_layers");
    if (!input_name || !output_name) return NULL;
  }

  json_t *model = json_object(), *out_layers = json_array();
  json_t *shape = NULL;
  int problems = c->problems;
  const char *previous = NULL; /* the kiln layer before, by name */
  for (size_t j = 0; j < n; j++) {
    json_t *entry = json_array_get(layers, j);
    char path[PATH_LEN];
    spec_index_path(path, "keras_model.config.layers", j);
    if (!json_is_object(entry)) {
      spec_problem(c, path, "must be a Keras layer object, got %s", api_json_type_name(entry));
      continue;
    }
    json_t *lconfig = json_object_get(entry, "config");
    const char *cls_name = json_string_value(json_object_get(entry, "class_name"));
    const char *name = json_string_value(json_object_get(lconfig, "name"));
    if (!name) name = json_string_value(json_object_get(entry, "name"));
    char quoted[64], qname[80], supported[400];
    if (!cls_name || !json_is_object(lconfig)) {
      spec_problem(c, path, "must have a class_name and a config object");
      continue;
    }
    int cls =
        strcmp(cls_name, "InputLayer") == 0 ? K_INPUT_LAYER : spec_pick(cls_name, keras_classes);
    if (cls < 0) {
      spec_problem(c, path, "layer '%s' is a Keras %s; kiln translates %s",
                   name ? spec_clip(name, qname, sizeof qname) : "(unnamed)",
                   spec_clip(cls_name, quoted, sizeof quoted),
                   spec_list_text(keras_classes, supported, sizeof supported));
      continue;
    }
    keras_layer k = {.c = c, .cls = cls, .config = lconfig, .path = path, .out = NULL};
    spec_join_path(k.cpath, path, "config");
    if (cls == K_INPUT_LAYER) {
      if (shape || (sequential && j > 0) ||
          (!sequential && name && strcmp(name, input_name) != 0)) {
        spec_problem(c, path,
                     "kiln's models have one input, the first layer; this InputLayer is "
                     "another");
        continue;
      }
      const char *key =
          json_object_get(lconfig, "batch_shape") ? "batch_shape" : "batch_input_shape";
      spec_join_path(kp->input, k.cpath, key);
      k.out = json_object();
      translate_config(&k);
      json_decref(k.out);
      shape = input_shape(c, json_object_get(lconfig, key), kp->input);
      if (!sequential) input_name = name;
      continue;
    }
    if (kp->n_layers == API_MAX_LAYERS) {
      spec_problem(c, "keras_model.config.layers",
                   "kiln's models have at most %d layers besides "
                   "the InputLayer",
                   API_MAX_LAYERS);
      break;
    }
    k.out = json_object();
    json_object_set_new(k.out, "type", json_string(kiln_types[cls]));
    if (name) json_object_set_new(k.out, "name", json_string(name));
    translate_config(&k);
    if (!sequential) {
      const char *from[API_MAX_LAYER_INPUTS];
      int n_from = inbound(c, entry, path, from);
      /* One input that is the layer before (or the model input, first):
       * kiln's default, so the translated model reads as one written by hand. */
      int implicit = n_from == 1 &&
                     (previous ? strcmp(from[0], previous) == 0 : strcmp(from[0], input_name) == 0);
      if (n_from > 0 && !implicit) {
        json_t *inputs = json_array();
        for (int i = 0; i < n_from; i++)
          json_array_append_new(inputs,
                                json_string(strcmp(from[i], input_name) == 0 ? "input" : from[i]));
        json_object_set_new(k.out, "inputs", inputs);
      }
    }
    kp->at[kp->n_layers++] = (int)j;
    json_array_append_new(out_layers, k.out);
    previous = name;
  }

  if (!shape && c->problems == problems) {
    char path[PATH_LEN];
    json_t *implicit = implicit_shape(root, config, json_array_get(layers, 0), path);
    spec_copy_text(kp->input, sizeof kp->input, path);
    if (!implicit)
      spec_problem(c, "keras_model.config.layers",
                   "no input shape: the model needs an InputLayer "
                   "(keras.Input(shape=...)) or a built model");
    else
      shape = input_shape(c, implicit, path);
  }
  if (!sequential && output_name && previous && strcmp(output_name, previous) != 0)
    spec_problem(c, "keras_model.config.output_layers",
                 "kiln's model output is its last layer, '%s'; the output '%s' must be last",
                 previous, output_name);
  if (c->problems != problems || !shape) {
    json_decref(shape);
    json_decref(out_layers);
    json_decref(model);
    return NULL;
  }
  json_object_set_new(model, "input_shape", shape);
  json_object_set_new(model, "layers", out_layers);
  return model;
}

/* "model.layers[3].kernel_size" -> "keras_model.config.layers[4].config.kernel_size". */
static void keras_field(const keras_paths *kp, const char *field, char out[PATH_LEN]) {
  static const char layers[] = "model.layers", shape[] = "model.input_shape";
  spec_copy_text(out, PATH_LEN, field);
  int i = -1, used = 0;
  if (strncmp(field, shape, sizeof shape - 1) == 0) {
    const char *rest = field + sizeof shape - 1;
    if (sscanf(rest, "[%d]%n", &i, &used) == 1) /* the batch is the Keras shape's [0] */
      format_path(out, "%s[%d]%s", kp->input, i + 1, rest + used);
    else
      format_path(out, "%s%s", kp->input, rest);
  } else if (strcmp(field, layers) == 0) {
    spec_copy_text(out, PATH_LEN, "keras_model.config.layers");
  } else if (strncmp(field, layers, sizeof layers - 1) == 0 &&
             sscanf(field + sizeof layers - 1, "[%d]%n", &i, &used) == 1 && i >= 0 &&
             i < kp->n_layers) {
    const char *rest = field + sizeof layers - 1 + used;
    char base[PATH_LEN];
    format_path(base, "keras_model.config.layers[%d]", kp->at[i]);
    if (!rest[0])
      spec_copy_text(out, PATH_LEN, base);
    else if (strncmp(rest, ".inputs", 7) == 0)
      format_path(out, "%s.inbound_nodes", base);
    else if (strcmp(rest, ".type") == 0)
      format_path(out, "%s.class_name", base);
    else
      format_path(out, "%s.config%s", base, rest);
  } else if (strcmp(field, "model") == 0) {
    spec_copy_text(out, PATH_LEN, "keras_model");
  }
}

void spec_keras_paths(const keras_paths *kp, api_error *err) {
  if (!kp->used) return;
  for (int d = 0; d < err->n_details; d++) {
    char field[PATH_LEN];
    keras_field(kp, err->details[d].field, field);
    spec_copy_text(err->details[d].field, sizeof err->details[d].field, field);
  }
}
