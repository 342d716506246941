/* keras_model: a Keras model's to_json() (Keras 2 and Keras 3, Sequential
 * and functional; the fixtures in tests/api/keras/) parses to the very
 * struct its kiln spec (the .kiln.json beside it) parses to; and what kiln
 * cannot honour is a 400 naming the Keras field, or the layer and its class. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "api.h"

#ifndef KERAS_FIXTURES
#error "KERAS_FIXTURES: the folder of the Keras fixtures"
#endif

static const char *const fixtures[] = {"keras2_sequential_mlp", "keras3_sequential_mlp",
                                       "keras2_sequential_cnn", "keras3_sequential_cnn",
                                       "keras2_functional",     "keras3_functional"};

static json_t *load(const char *name, const char *suffix) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s%s", KERAS_FIXTURES, name, suffix);
  json_error_t jerr;
  json_t *root = json_load_file(path, 0, &jerr);
  if (!root) fail_msg("%s: %s", path, jerr.text);
  return root;
}

/* A spec around a model member (stolen): "model" or "keras_model". */
static char *spec_with(const char *key, json_t *model) {
  json_t *root =
      json_pack("{s:o, s:s, s:[s], s:{s:s, s:s}, s:{s:s}, s:i}", key, model, "loss",
                "sparse_categorical_crossentropy", "metrics", "accuracy", "dataset", "name",
                "fashion-mnist", "validation", "none", "optimizer", "type", "adam", "seed", 3);
  assert_non_null(root);
  char *text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  return text;
}

static int parse(const char *text, api_job_spec *spec, api_error *err) {
  memset(err, 0, sizeof *err);
  return api_spec_parse(text, strlen(text), spec, err);
}

static void parse_ok(const char *text, api_job_spec *spec) {
  api_error err;
  if (parse(text, spec, &err) != 0)
    fail_msg("refused: %s: %s (of %d)", err.n_details ? err.details[0].field : "-",
             err.n_details ? err.details[0].description : err.message, err.n_details);
}

/* Every fixture parses to its kiln spec's struct, byte for byte, and so to
 * the same canonical spec; every listed class is in one of them. */
static void keras_fixtures_parse_to_their_kiln_specs(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
    char *keras = spec_with("keras_model", load(fixtures[i], ".json"));
    char *kiln = spec_with("model", load(fixtures[i], ".kiln.json"));
    api_job_spec a, b;
    parse_ok(keras, &a);
    parse_ok(kiln, &b);
    for (int l = 0; l < b.n_layers; l++)
      if (memcmp(&a.layers[l], &b.layers[l], sizeof a.layers[l]) != 0)
        fail_msg("%s: layer %d (%s) differs from the kiln spec's (%s)", fixtures[i], l,
                 a.layers[l].name, b.layers[l].name);
    assert_int_equal(a.n_layers, b.n_layers);
    assert_memory_equal(&a, &b, sizeof a);
    char *ca = api_spec_to_json(&a), *cb = api_spec_to_json(&b);
    assert_string_equal(ca, cb);
    free(ca);
    free(cb);
    free(keras);
    free(kiln);
  }
}

/* Keras's names stay the layers' names, and Keras's defaults the values. */
static void keras_names_and_defaults_are_kept(void **state) {
  (void)state;
  char *text = spec_with("keras_model", load("keras2_sequential_cnn", ".json"));
  api_job_spec spec;
  parse_ok(text, &spec);
  assert_int_equal(spec.input_ndim, 3);
  assert_int_equal(spec.input_shape[0], 28);
  assert_int_equal(spec.input_shape[2], 1);
  assert_string_equal(spec.layers[0].name, "conv2d");
  assert_int_equal(spec.layers[0].use_bias, 0);
  assert_int_equal(spec.layers[0].padding_same, 1);
  assert_string_equal(spec.layers[1].name, "batch_normalization");
  assert_float_equal(spec.layers[1].momentum, 0.9, 0);
  assert_float_equal(spec.layers[1].epsilon, 0.001, 0);
  assert_int_equal(spec.layers[2].type, API_LAYER_RELU);
  assert_int_equal(spec.layers[3].strides[0], 2); /* pooling: strides = pool_size */
  assert_int_equal(spec.layers[4].depth_multiplier, 2);
  assert_int_equal(spec.layers[5].type, API_LAYER_ACTIVATION);
  assert_int_equal(spec.layers[5].activation, API_ACT_LEAKY_RELU);
  assert_float_equal((float)spec.layers[5].alpha, 0.3f, 0);
  assert_string_equal(spec.layers[5].name, "leaky_re_lu");
  assert_int_equal(spec.layers[10].activation, API_ACT_SOFTMAX);
  assert_int_equal(spec.n_outputs, 10);
  free(text);

  /* Keras 3's functional model: Add and Concatenate read named layers, the
   * InputLayer is kiln's "input". */
  text = spec_with("keras_model", load("keras3_functional", ".json"));
  parse_ok(text, &spec);
  assert_int_equal(spec.n_layers, 9);
  assert_string_equal(spec.layers[3].name, "res");
  assert_int_equal(spec.layers[3].n_inputs, 2);
  assert_int_equal(spec.layers[3].inputs[0], 0);
  assert_int_equal(spec.layers[3].inputs[1], 2);
  assert_int_equal(spec.layers[5].inputs[1], 4);
  assert_int_equal(spec.layers[0].n_inputs, 0); /* the model input, kiln's default */
  free(text);

  /* A bare LeakyReLU and ELU take Keras's defaults, 0.3 and 1.0. */
  json_t *model = load("keras3_sequential_mlp", ".json");
  json_t *leaky = json_object_get(
      json_array_get(json_object_get(json_object_get(model, "config"), "layers"), 5), "config");
  assert_int_equal(json_object_del(leaky, "negative_slope"), 0);
  text = spec_with("keras_model", model);
  parse_ok(text, &spec);
  assert_float_equal(spec.layers[4].alpha, 0.3, 0);
  free(text);
}

/* An edit at a JSON path of the fixture ("config.layers[3].class_name",
 * "a.b[0][1].c"): set to value, or removed when value is NULL. */
static void edit(json_t *root, const char *path, const char *value) {
  json_t *v = value ? json_loads(value, JSON_DECODE_ANY, NULL) : NULL;
  if (value && !v) fail_msg("bad value %s", value);
  json_t *parent = root;
  const char *p = path;
  while (*p) {
    char key[64];
    size_t n = strcspn(p, ".[");
    snprintf(key, sizeof key, "%.*s", (int)n, p);
    p += n;
    if (!*p) { /* the last step, a key */
      if (v)
        json_object_set_new(parent, key, v);
      else
        json_object_del(parent, key);
      return;
    }
    if (n) parent = json_object_get(parent, key);
    while (*p == '[') {
      int index = atoi(p + 1);
      p = strchr(p, ']') + 1;
      if (!*p) { /* the last step, an index */
        if (v)
          json_array_set_new(parent, (size_t)index, v);
        else
          json_array_remove(parent, (size_t)index);
        return;
      }
      parent = json_array_get(parent, (size_t)index);
    }
    if (*p == '.') p++;
    if (!parent) fail_msg("no %s in the fixture", path);
  }
}

typedef struct bad_case {
  const char *fixture, *path, *value; /* one edit of the fixture */
  const char *field, *description;    /* a detail expected */
} bad_case;

static void refused(const bad_case *bc) {
  json_t *model = load(bc->fixture, ".json");
  if (bc->path) edit(model, bc->path, bc->value);
  char *text = spec_with("keras_model", model);
  api_job_spec spec;
  api_error err;
  if (parse(text, &spec, &err) == 0)
    fail_msg("accepted %s with %s = %s", bc->fixture, bc->path,
             bc->value ? bc->value : "(removed)");
  assert_int_equal(err.http, 400);
  assert_string_equal(err.status, "INVALID_ARGUMENT");
  for (int d = 0; d < err.n_details; d++)
    if (strcmp(err.details[d].field, bc->field) == 0 &&
        strstr(err.details[d].description, bc->description)) {
      free(text);
      return;
    }
  for (int d = 0; d < err.n_details; d++)
    print_message("  %s: %s\n", err.details[d].field, err.details[d].description);
  fail_msg("%s with %s = %s: no '%s' at %s", bc->fixture, bc->path, bc->value, bc->description,
           bc->field);
}

/* A class kiln does not have is a 400 naming the layer and its class, at
 * the layer's path. */
static void unsupported_classes_are_refused_naming_layer_and_class(void **state) {
  (void)state;
  static const bad_case cases[] = {
      {"keras2_sequential_mlp", "config.layers[3].class_name", "\"LSTM\"",
       "keras_model.config.layers[3]",
       "layer 'dropout' is a Keras LSTM; kiln translates Dense, Conv2D"},
      {"keras3_functional", "config.layers[4].class_name", "\"Multiply\"",
       "keras_model.config.layers[4]", "layer 'res' is a Keras Multiply"},
      {"keras3_sequential_cnn", "config.layers[1].class_name", "\"Conv1D\"",
       "keras_model.config.layers[1]", "layer 'conv2d' is a Keras Conv1D"},
      {"keras2_sequential_mlp", "class_name", "\"Bidirectional\"", "keras_model.class_name",
       "kiln translates a Sequential or a functional model (Functional, Model), got "
       "'Bidirectional'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) refused(&cases[i]);
}

/* Each field kiln cannot honour is named, with the rule. */
static void fields_kiln_cannot_honour_are_refused_by_path(void **state) {
  (void)state;
  static const bad_case cases[] = {
      {"keras3_sequential_cnn", "config.layers[1].config.data_format", "\"channels_first\"",
       "keras_model.config.layers[1].config.data_format",
       "kiln's images are channels_last (height, width, channels), got channels_first"},
      {"keras2_sequential_mlp", "config.layers[2].config.kernel_initializer",
       "{\"class_name\":\"RandomNormal\",\"config\":{\"mean\":0,\"stddev\":0.05,\"seed\":null}}",
       "keras_model.config.layers[2].config.kernel_initializer",
       "initializer 'RandomNormal' is not one kiln has; supported: GlorotUniform"},
      {"keras3_sequential_mlp", "config.layers[2].config.kernel_regularizer",
       "{\"module\":\"keras.regularizers\",\"class_name\":\"L2\",\"config\":{\"l2\":0.01}}",
       "keras_model.config.layers[2].config.kernel_regularizer",
       "kiln has no regularizers or constraints"},
      {"keras2_sequential_cnn", "config.layers[1].config.center", "false",
       "keras_model.config.layers[1].config.center", "must be true"},
      {"keras3_sequential_cnn", "config.layers[2].config.gamma_initializer", "\"zeros\"",
       "keras_model.config.layers[2].config.gamma_initializer",
       "kiln's BatchNormalization uses ones here, got zeros"},
      {"keras2_sequential_cnn", "config.layers[1].config.axis", "[1, 2]",
       "keras_model.config.layers[1].config.axis", "must be one axis"},
      {"keras2_sequential_cnn", "config.layers[2].config.max_value", "6.0",
       "keras_model.config.layers[2].config.max_value", "kiln has no max_value; must be null"},
      {"keras2_functional", "config.trainable", "false", "keras_model.config.trainable",
       "a frozen model (trainable false)"},
      {"keras3_sequential_cnn", "config.layers[4].config.trainable", "false",
       "keras_model.config.layers[4].config.trainable", "a frozen layer (trainable false)"},
      {"keras3_sequential_cnn", "config.layers[4].config.dtype", "\"mixed_float16\"",
       "keras_model.config.layers[4].config.dtype", "set the spec's precision"},
      {"keras2_sequential_mlp", "config.layers[2].config.activation", "\"leaky_relu\"",
       "keras_model.config.layers[2].config.activation", "put a LeakyReLU layer after it"},
      {"keras2_sequential_mlp", "config.layers[2].config.activation", "\"swish\"",
       "keras_model.config.layers[2].config.activation", "unknown activation 'swish'"},
      {"keras3_sequential_cnn", "config.layers[1].config.groups", "2",
       "keras_model.config.layers[1].config.groups", "groups must be 1"},
      {"keras3_sequential_cnn", "config.layers[12].config.axis", "1",
       "keras_model.config.layers[12].config.axis", "kiln's softmax is over the last axis"},
      {"keras3_sequential_mlp", "config.layers[2].config.lora_rank", "4",
       "keras_model.config.layers[2].config.lora_rank", "kiln has no lora_rank"},
      {"keras3_sequential_mlp", "config.layers[2].config.units_typo", "4",
       "keras_model.config.layers[2].config.units_typo", "not a field of a Keras Dense"},
      /* kiln's own rules, at the Keras field's path */
      {"keras2_sequential_mlp", "config.layers[2].config.units", "0",
       "keras_model.config.layers[2].config.units", "must be between 1 and 65536, got 0"},
      {"keras3_sequential_cnn", "config.layers[1].config.padding", "\"causal\"",
       "keras_model.config.layers[1].config.padding", "unknown padding 'causal'"},
      {"keras2_sequential_mlp", "config.layers[3].config.rate", "1.5",
       "keras_model.config.layers[3].config.rate", "must be >= 0 and < 1, got 1.5"},
      {"keras3_sequential_mlp", "config.layers[0].config.batch_shape", "[null, 28, 28, 2]",
       "keras_model.config.layers[0].config.batch_shape",
       "holds 1568 values per example, but fashion-mnist examples hold 784"},
      {"keras2_sequential_mlp", "config.layers[0].config.batch_input_shape", "[null, null, 28, 1]",
       "keras_model.config.layers[0].config.batch_input_shape[1]",
       "kiln needs every dimension but the batch"},
      {"keras3_functional", "config.layers[4].inbound_nodes[0].args[0][1].config.keras_history",
       "[\"nowhere\", 0, 0]", "keras_model.config.layers[4].inbound_nodes",
       "'nowhere' is no layer"},
      {"keras2_functional", "config.layers[9].inbound_nodes[0][0]", "[\"flat\", 1, 0, {}]",
       "keras_model.config.layers[9].inbound_nodes[0][0]",
       "reads call 1, output 0 of 'flat'; kiln translates layers called once"},
      {"keras2_functional", "config.output_layers[0]", "[\"res\", 0, 0]",
       "keras_model.config.output_layers",
       "kiln's model output is its last layer, 'logits'; the output 'res' must be last"},
      {"keras3_functional", "config.input_layers", "[[\"input_layer\", 0, 0], [\"stem\", 0, 0]]",
       "keras_model.config.input_layers", "kiln's models have one input"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) refused(&cases[i]);
}

/* model and keras_model together are refused; neither is "model is required". */
static void model_and_keras_model_are_one_or_the_other(void **state) {
  (void)state;
  char *kiln = spec_with("model", load("keras2_functional", ".kiln.json"));
  json_t *root = json_loads(kiln, 0, NULL);
  free(kiln);
  json_object_set_new(root, "keras_model", load("keras2_functional", ".json"));
  char *text = json_dumps(root, JSON_COMPACT);
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse(text, &spec, &err), -1);
  assert_string_equal(err.details[0].field, "keras_model");
  assert_non_null(strstr(err.details[0].description, "give model or keras_model, not both"));
  free(text);
  json_object_del(root, "keras_model");
  json_object_del(root, "model");
  text = json_dumps(root, JSON_COMPACT);
  assert_int_equal(parse(text, &spec, &err), -1);
  assert_string_equal(err.details[0].field, "model");
  assert_non_null(strstr(err.details[0].description, "is required (or keras_model"));
  free(text);
  json_object_set_new(root, "keras_model", json_string("model.json"));
  text = json_dumps(root, JSON_COMPACT);
  assert_int_equal(parse(text, &spec, &err), -1);
  assert_string_equal(err.details[0].field, "keras_model");
  assert_non_null(strstr(err.details[0].description, "must be an object, got string"));
  free(text);
  json_decref(root);
}

/* An InputLayer without its shape (batch_shape, batch_input_shape) is a
 * 400 naming the field, not a crash (found by fuzz/fuzz_spec.c). */
static void an_input_layer_without_a_shape_is_refused_by_path(void **state) {
  (void)state;
  static const bad_case cases[] = {
      {"keras3_sequential_mlp", "config.layers[0].config.batch_shape", NULL,
       "keras_model.config.layers[0].config.batch_input_shape", "is missing"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) refused(&cases[i]);
}

static char *read_example(const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", EXAMPLES_DIR, name);
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  char *text = calloc(1, 1 << 16);
  size_t n = fread(text, 1, (1 << 16) - 1, f);
  fclose(f);
  text[n] = '\0';
  return text;
}

/* examples/fmnist-keras.json, the Keras route's example, is
 * examples/fmnist-cnn.json written as Keras 3's to_json(): the same spec
 * but for the layers' names (Keras's, against kiln's defaults). */
static void the_keras_example_is_the_cnn_example(void **state) {
  (void)state;
  char *keras = read_example("fmnist-keras.json"), *cnn = read_example("fmnist-cnn.json");
  api_job_spec a, b;
  parse_ok(keras, &a);
  parse_ok(cnn, &b);
  assert_string_equal(a.layers[0].name, "conv2d");
  assert_string_equal(b.layers[0].name, "conv2d_0");
  for (int l = 0; l < API_MAX_LAYERS; l++) {
    memset(a.layers[l].name, 0, sizeof a.layers[l].name);
    memset(b.layers[l].name, 0, sizeof b.layers[l].name);
  }
  memset(a.display_name, 0, sizeof a.display_name);
  memset(b.display_name, 0, sizeof b.display_name);
  assert_memory_equal(&a, &b, sizeof a);
  free(keras);
  free(cnn);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(keras_fixtures_parse_to_their_kiln_specs),
      cmocka_unit_test(keras_names_and_defaults_are_kept),
      cmocka_unit_test(unsupported_classes_are_refused_naming_layer_and_class),
      cmocka_unit_test(fields_kiln_cannot_honour_are_refused_by_path),
      cmocka_unit_test(model_and_keras_model_are_one_or_the_other),
      cmocka_unit_test(an_input_layer_without_a_shape_is_refused_by_path),
      cmocka_unit_test(the_keras_example_is_the_cnn_example),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
