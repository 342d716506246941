/* The spec's Keras layers beyond dense: image layers, batch norm (and its
 * synchronized option), dropout, pools, residual add and concatenate by
 * named inputs; their shape walk and field-path errors; the new
 * optimizers; and the canonical form of all of them reading back to the
 * same struct. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api.h"

/* A spec around the given layers and optimizer. */
static char *spec_with(const char *layers, const char *optimizer) {
  char *text = malloc(8192);
  snprintf(text, 8192,
           "{\"model\":{\"input_shape\":[28,28,1],\"layers\":[%s]},"
           "\"loss\":\"sparse_categorical_crossentropy\",\"metrics\":[\"accuracy\"],"
           "\"dataset\":{\"name\":\"fashion-mnist\"},\"optimizer\":%s}",
           layers, optimizer);
  return text;
}

static const char *const RESNET =
    "{\"type\":\"conv2d\",\"name\":\"stem\",\"filters\":8,\"kernel_size\":3,\"padding\":\"same\","
    "\"activation\":\"relu\",\"kernel_initializer\":\"he_normal\"},"
    "{\"type\":\"batch_norm\",\"name\":\"bn\",\"momentum\":0.9},"
    "{\"type\":\"separable_conv2d\",\"filters\":8,\"kernel_size\":[3,3],\"padding\":\"same\"},"
    "{\"type\":\"add\",\"name\":\"res\",\"inputs\":[\"bn\",\"separable_conv2d_2\"]},"
    "{\"type\":\"depthwise_conv2d\",\"kernel_size\":3,\"depth_multiplier\":2,\"strides\":2},"
    "{\"type\":\"max_pool2d\",\"pool_size\":2,\"inputs\":[\"res\"]},"
    "{\"type\":\"conv2d\",\"filters\":4,\"kernel_size\":2,\"dilation_rate\":2},"
    "{\"type\":\"activation\",\"activation\":\"leaky_relu\",\"alpha\":0.1},"
    "{\"type\":\"avg_pool2d\",\"pool_size\":3,\"strides\":1,\"padding\":\"same\"},"
    "{\"type\":\"dropout\",\"rate\":0.25},"
    "{\"type\":\"global_avg_pool2d\"},"
    "{\"type\":\"dense\",\"units\":10,\"activation\":\"softmax\"}";

static void residual_cnn_parses_with_keras_defaults(void **state) {
  (void)state;
  char *text = spec_with(RESNET, "{\"type\":\"rmsprop\"}");
  api_job_spec spec;
  api_error err;
  memset(&err, 0, sizeof err);
  int rc = api_spec_parse(text, strlen(text), &spec, &err);
  if (rc) fail_msg("%s: %s", err.details[0].field, err.details[0].description);
  assert_int_equal(spec.n_layers, 12);
  const api_layer *stem = &spec.layers[0], *bn = &spec.layers[1], *res = &spec.layers[3];
  assert_int_equal(stem->type, API_LAYER_CONV2D);
  assert_int_equal(stem->kernel_size[0] * 10 + stem->kernel_size[1], 33);
  assert_int_equal(stem->strides[0], 1);
  assert_int_equal(stem->padding_same, 1);
  assert_int_equal(stem->kernel_initializer, API_INIT_HE_NORMAL);
  assert_int_equal(stem->bias_initializer, API_INIT_ZEROS);
  assert_float_equal(bn->momentum, 0.9, 0);
  assert_float_equal(bn->epsilon, 0.001, 0);
  assert_int_equal(res->n_inputs, 2);
  assert_int_equal(res->inputs[0], 1);
  assert_int_equal(res->inputs[1], 2);
  const api_layer *dw = &spec.layers[4], *pool = &spec.layers[5];
  assert_int_equal(dw->depth_multiplier, 2);
  assert_int_equal(dw->strides[1], 2);
  assert_int_equal(pool->strides[0], 2); /* Keras: the pool size */
  assert_int_equal(pool->inputs[0], 3);
  assert_float_equal(spec.layers[7].alpha, 0.1, 0);
  assert_float_equal(spec.layers[9].rate, 0.25, 0);
  assert_int_equal(spec.n_outputs, 10);
  assert_int_equal(spec.optimizer, API_OPT_RMSPROP);
  assert_float_equal(spec.rho, 0.9, 0);
  assert_float_equal(spec.epsilon, 1e-7, 0);
  assert_float_equal(spec.learning_rate, 0.001, 0);

  /* The canonical form reads back to the same struct. */
  char *canon = api_spec_to_json(&spec);
  assert_non_null(canon);
  api_job_spec again;
  assert_int_equal(api_spec_parse(canon, strlen(canon), &again, &err), 0);
  assert_memory_equal(&spec, &again, sizeof spec);
  assert_non_null(strstr(canon, "\"inputs\":[\"bn\",\"separable_conv2d_2\"]"));
  free(canon);
  free(text);
}

/* Each bad layer spec gets a 400 naming the field and saying what is wrong. */
static void bad_layers_are_refused_with_their_field_paths(void **state) {
  (void)state;
  static const struct {
    const char *layers, *field, *description;
  } cases[] = {
      {"{\"type\":\"flatten\"},{\"type\":\"conv2d\",\"filters\":4,\"kernel_size\":3},"
       "{\"type\":\"dense\",\"units\":10}",
       "model.layers[1]",
       "conv2d expects an image input (height, width, channels), got shape "
       "(784)"},
      {"{\"type\":\"conv2d\",\"filters\":4,\"kernel_size\":0},{\"type\":\"flatten\"},"
       "{\"type\":\"dense\",\"units\":10}",
       "model.layers[0].kernel_size", "must be between 1 and 1024, got [0, 0]"},
      {"{\"type\":\"conv2d\",\"filters\":4,\"kernel_size\":[3]},{\"type\":\"flatten\"},"
       "{\"type\":\"dense\",\"units\":10}",
       "model.layers[0].kernel_size", "must be an integer or a pair [height, width]"},
      {"{\"type\":\"max_pool2d\",\"pool_size\":29},{\"type\":\"flatten\"},"
       "{\"type\":\"dense\",\"units\":10}",
       "model.layers[0]", "max_pool2d: a 29x29 window does not fit the input (28, 28, 1)"},
      {"{\"type\":\"conv2d\",\"filters\":4,\"kernel_size\":3},{\"type\":\"add\"},"
       "{\"type\":\"flatten\"},{\"type\":\"dense\",\"units\":10}",
       "model.layers[1].inputs", "a 'add' layer must name at least 2 inputs"},
      {"{\"type\":\"flatten\",\"inputs\":[\"dense_1\"]},{\"type\":\"dense\",\"units\":10}",
       "model.layers[0].inputs[0]", "'dense_1' is not an earlier layer"},
      {"{\"type\":\"flatten\",\"name\":\"f\"},{\"type\":\"dense\",\"units\":10},"
       "{\"type\":\"add\",\"inputs\":[\"f\",\"dense_1\"]}",
       "model.layers[2]", "add: input shapes (784) and (10) differ"},
      {"{\"type\":\"conv2d\",\"filters\":4,\"kernel_size\":3,\"padding\":\"full\"},"
       "{\"type\":\"flatten\"},{\"type\":\"dense\",\"units\":10}",
       "model.layers[0].padding", "unknown padding 'full'; supported: valid, same"},
      {"{\"type\":\"flatten\"},{\"type\":\"dropout\",\"rate\":1},{\"type\":\"dense\",\"units\":10}",
       "model.layers[1].rate", "must be >= 0 and < 1, got 1"},
      {"{\"type\":\"flatten\"},{\"type\":\"activation\",\"activation\":\"relu\",\"alpha\":0.2},"
       "{\"type\":\"dense\",\"units\":10}",
       "model.layers[1].alpha", "alpha applies to leaky_relu and elu only"},
      {"{\"type\":\"flatten\",\"name\":\"input\"},{\"type\":\"dense\",\"units\":10}",
       "model.layers[0].name", "'input' names the model input"},
      {"{\"type\":\"conv2d\",\"filters\":4,\"kernel_size\":3,\"strides\":2,\"dilation_rate\":2},"
       "{\"type\":\"flatten\"},{\"type\":\"dense\",\"units\":10}",
       "model.layers[0].dilation_rate", "dilation_rate > 1 needs strides 1"},
      {"{\"type\":\"global_avg_pool2d\"},{\"type\":\"dense\",\"units\":10,\"pool_size\":2}",
       "model.layers[1].pool_size", "not a field of a 'dense' layer"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *text = spec_with(cases[i].layers, "{\"type\":\"sgd\"}");
    api_job_spec spec;
    api_error err;
    memset(&err, 0, sizeof err);
    if (api_spec_parse(text, strlen(text), &spec, &err) == 0) fail_msg("accepted: %s", text);
    int found = 0;
    for (int d = 0; d < err.n_details; d++) {
      found |= strcmp(err.details[d].field, cases[i].field) == 0 &&
               strstr(err.details[d].description, cases[i].description) != NULL;
    }
    if (!found) {
      fail_msg("case %zu: no '%s' at %s; first detail %s: %s", i, cases[i].description,
               cases[i].field, err.details[0].field, err.details[0].description);
    }
    free(text);
  }
}

/* A spec with an MLP whose batch_norm layer carries bn_fields (text after
 * its name, "" for none) and the strategy member given (NULL: none). */
static int parse_bn(const char *bn_fields, const char *strategy, api_job_spec *spec,
                    api_error *err) {
  char text[2048];
  snprintf(text, sizeof text,
           "{\"model\":{\"input_shape\":[784],\"layers\":[{\"type\":\"dense\",\"units\":32},"
           "{\"type\":\"batch_norm\",\"name\":\"bn\"%s},{\"type\":\"dense\",\"units\":10}]},"
           "\"loss\":\"sparse_categorical_crossentropy\",\"dataset\":{\"name\":\"fashion-mnist\"},"
           "\"optimizer\":{\"type\":\"sgd\"}%s%s}",
           bn_fields, strategy ? ",\"strategy\":" : "", strategy ? strategy : "");
  memset(err, 0, sizeof *err);
  return api_spec_parse(text, strlen(text), spec, err);
}

/* Parses, and the canonical form holds `expect` and reads back the same. */
static void bn_accepted(const char *bn_fields, const char *strategy, const char *expect) {
  api_job_spec spec, again;
  api_error err;
  if (parse_bn(bn_fields, strategy, &spec, &err) != 0)
    fail_msg("'%s' with strategy %s refused: %s: %s", bn_fields, strategy ? strategy : "none",
             err.details[0].field, err.details[0].description);
  char *canon = api_spec_to_json(&spec);
  assert_non_null(canon);
  if (!strstr(canon, expect)) fail_msg("no %s in %s", expect, canon);
  assert_int_equal(api_spec_parse(canon, strlen(canon), &again, &err), 0);
  assert_memory_equal(&spec, &again, sizeof spec);
  free(canon);
}

static void bn_refused(const char *bn_fields, const char *strategy, const char *field,
                       const char *description) {
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse_bn(bn_fields, strategy, &spec, &err), -1);
  assert_int_equal(err.http, 400);
  for (int d = 0; d < err.n_details; d++)
    if (strcmp(err.details[d].field, field) == 0 && strstr(err.details[d].description, description))
      return;
  fail_msg("'%s': no %s '%s' (first: %s: %s)", bn_fields, field, description,
           err.n_details ? err.details[0].field : "-",
           err.n_details ? err.details[0].description : err.message);
}

/* batch_norm's synchronized (Keras's): a boolean, false by default, that
 * every strategy whose replicas step together takes (and a job of one
 * replica ignores); a wrong type is a 400 naming the field. */
static void batch_norm_synchronized_is_a_boolean_false_by_default(void **state) {
  (void)state;
  const char *mirrored = "{\"type\":\"mirrored\",\"replicas\":2}";
  bn_accepted("", mirrored,
              "\"name\":\"bn\",\"momentum\":0.99,\"epsilon\":0.001,"
              "\"synchronized\":false");
  bn_accepted(",\"synchronized\":true", mirrored, "\"synchronized\":true");
  bn_accepted(",\"synchronized\":true", "{\"type\":\"multi_worker\",\"workers\":2}",
              "\"synchronized\":true");
  bn_accepted(",\"synchronized\":true", "{\"type\":\"parameter_server\",\"ps\":1,\"workers\":2}",
              "\"synchronized\":true");
  bn_accepted(",\"synchronized\":true", NULL, "\"synchronized\":true"); /* one replica: no-op */
  bn_refused(",\"synchronized\":\"yes\"", mirrored, "model.layers[1].synchronized",
             "must be a boolean (true or false), got string");
  bn_refused(",\"synchronized\":1", mirrored, "model.layers[1].synchronized",
             "must be a boolean (true or false)");
  bn_refused(",\"synchronized\":true",
             "{\"type\":\"parameter_server\",\"ps\":1,\"workers\":2,\"mode\":\"async\"}",
             "model.layers[1].synchronized", "parameter_server mode async");
  /* Only batch_norm has it. */
  char *text = spec_with("{\"type\":\"flatten\"},{\"type\":\"dense\",\"units\":10,"
                         "\"synchronized\":true}",
                         "{\"type\":\"sgd\"}");
  api_job_spec spec;
  api_error err;
  memset(&err, 0, sizeof err);
  assert_int_equal(api_spec_parse(text, strlen(text), &spec, &err), -1);
  assert_string_equal(err.details[0].field, "model.layers[1].synchronized");
  assert_string_equal(err.details[0].description, "not a field of a 'dense' layer");
  free(text);
}

static void new_optimizers_take_keras_defaults_and_check_their_options(void **state) {
  (void)state;
  const char *layers = "{\"type\":\"flatten\"},{\"type\":\"dense\",\"units\":10}";
  api_job_spec spec;
  api_error err;
  char *text = spec_with(layers, "{\"type\":\"adamw\"}");
  assert_int_equal(api_spec_parse(text, strlen(text), &spec, &err), 0);
  assert_int_equal(spec.optimizer, API_OPT_ADAMW);
  assert_float_equal(spec.weight_decay, 0.004, 0);
  assert_float_equal(spec.beta_2, 0.999, 0);
  free(text);
  text = spec_with(layers, "{\"type\":\"adagrad\",\"weight_decay\":0.01}");
  assert_int_equal(api_spec_parse(text, strlen(text), &spec, &err), 0);
  assert_float_equal(spec.initial_accumulator_value, 0.1, 0);
  assert_float_equal(spec.weight_decay, 0.01, 0);
  char *canon = api_spec_to_json(&spec);
  api_job_spec again;
  assert_int_equal(api_spec_parse(canon, strlen(canon), &again, &err), 0);
  assert_memory_equal(&spec, &again, sizeof spec);
  free(canon);
  free(text);
  text = spec_with(layers, "{\"type\":\"adagrad\",\"rho\":0.5}");
  assert_int_equal(api_spec_parse(text, strlen(text), &spec, &err), -1);
  assert_string_equal(err.details[0].field, "optimizer.rho");
  assert_string_equal(err.details[0].description,
                      "is an option of optimizer type 'rmsprop', not 'adagrad'");
  free(text);
  text = spec_with(layers, "{\"type\":\"rmsprop\",\"rho\":1}");
  assert_int_equal(api_spec_parse(text, strlen(text), &spec, &err), -1);
  assert_string_equal(err.details[0].field, "optimizer.rho");
  assert_string_equal(err.details[0].description, "must be >= 0 and < 1, got 1");
  free(text);
}

/* Parses a spec around layers; fails the test with the first detail when
 * it is refused. */
static void parse_layers(const char *layers, api_job_spec *spec) {
  char *text = spec_with(layers, "{\"type\":\"sgd\"}");
  api_error err;
  memset(&err, 0, sizeof err);
  if (api_spec_parse(text, strlen(text), spec, &err) != 0)
    fail_msg("refused %s: %s: %s", layers, err.details[0].field, err.details[0].description);
  free(text);
}

/* Keras's activation layers by their own names (LeakyReLU, ELU, Softmax)
 * are the activation layer once parsed, with Keras's defaults: the same
 * struct as {"type": "activation", ...}, and the same canonical form. */
static void activation_layers_by_keras_names_are_activation_layers(void **state) {
  (void)state;
  static const struct {
    const char *keras, *kiln;
  } pairs[] = {
      {"{\"type\":\"leaky_relu\",\"name\":\"a\",\"negative_slope\":0.2}",
       "{\"type\":\"activation\",\"name\":\"a\",\"activation\":\"leaky_relu\",\"alpha\":0.2}"},
      {"{\"type\":\"leaky_relu\",\"name\":\"a\",\"alpha\":0.2}",
       "{\"type\":\"activation\",\"name\":\"a\",\"activation\":\"leaky_relu\",\"alpha\":0.2}"},
      {"{\"type\":\"leaky_relu\",\"name\":\"a\"}",
       "{\"type\":\"activation\",\"name\":\"a\",\"activation\":\"leaky_relu\",\"alpha\":0.3}"},
      {"{\"type\":\"elu\",\"name\":\"a\"}",
       "{\"type\":\"activation\",\"name\":\"a\",\"activation\":\"elu\",\"alpha\":1.0}"},
      {"{\"type\":\"elu\",\"name\":\"a\",\"alpha\":0.5}",
       "{\"type\":\"activation\",\"name\":\"a\",\"activation\":\"elu\",\"alpha\":0.5}"},
      {"{\"type\":\"relu\",\"name\":\"a\"}", "{\"type\":\"relu\",\"name\":\"a\"}"},
  };
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    char keras[512], kiln[512];
    snprintf(keras, sizeof keras, "{\"type\":\"flatten\"},%s,{\"type\":\"dense\",\"units\":10}",
             pairs[i].keras);
    snprintf(kiln, sizeof kiln, "{\"type\":\"flatten\"},%s,{\"type\":\"dense\",\"units\":10}",
             pairs[i].kiln);
    api_job_spec a, b;
    parse_layers(keras, &a);
    parse_layers(kiln, &b);
    if (memcmp(&a, &b, sizeof a) != 0)
      fail_msg("case %zu: %s parses unlike %s (alpha %g, %g)", i, pairs[i].keras, pairs[i].kiln,
               a.layers[1].alpha, b.layers[1].alpha);
    char *ca = api_spec_to_json(&a), *cb = api_spec_to_json(&b);
    assert_string_equal(ca, cb);
    free(ca);
    free(cb);
  }
  api_job_spec spec;
  parse_layers("{\"type\":\"flatten\"},{\"type\":\"leaky_relu\",\"negative_slope\":0.25},"
               "{\"type\":\"dense\",\"units\":10},{\"type\":\"softmax\"}",
               &spec);
  assert_int_equal(spec.layers[1].type, API_LAYER_ACTIVATION);
  assert_int_equal(spec.layers[1].activation, API_ACT_LEAKY_RELU);
  assert_float_equal(spec.layers[1].alpha, 0.25, 0);
  assert_string_equal(spec.layers[1].name, "leaky_relu_1"); /* its default name, by its type */
  assert_int_equal(spec.layers[3].type, API_LAYER_ACTIVATION);
  assert_int_equal(spec.layers[3].activation, API_ACT_SOFTMAX);
  assert_string_equal(spec.layers[3].name, "softmax_3");
  /* The canonical form names the activation layer, and reads back the same. */
  char *canon = api_spec_to_json(&spec);
  assert_non_null(strstr(canon, "{\"type\":\"activation\",\"name\":\"leaky_relu_1\","
                                "\"activation\":\"leaky_relu\",\"alpha\":0.25}"));
  api_job_spec again;
  api_error err;
  assert_int_equal(api_spec_parse(canon, strlen(canon), &again, &err), 0);
  assert_memory_equal(&spec, &again, sizeof spec);
  free(canon);
}

/* Their own fields only, each error at its field. */
static void activation_layers_by_keras_names_check_their_fields(void **state) {
  (void)state;
  static const struct {
    const char *layer, *field, *description;
  } cases[] = {
      {"{\"type\":\"leaky_relu\",\"negative_slope\":0.2,\"alpha\":0.2}", "model.layers[1].alpha",
       "give negative_slope or alpha (its Keras 2 name), not both"},
      {"{\"type\":\"leaky_relu\",\"negative_slope\":-1}", "model.layers[1].negative_slope",
       "must be > 0 and <= 100, got -1"},
      {"{\"type\":\"leaky_relu\",\"negative_slope\":\"big\"}", "model.layers[1].negative_slope",
       "must be a number, got string"},
      {"{\"type\":\"elu\",\"negative_slope\":0.2}", "model.layers[1].negative_slope",
       "not a field of a 'elu' layer"},
      {"{\"type\":\"elu\",\"alpha\":0}", "model.layers[1].alpha", "must be > 0 and <= 100, got 0"},
      {"{\"type\":\"softmax\",\"alpha\":1}", "model.layers[1].alpha",
       "not a field of a 'softmax' layer"},
      {"{\"type\":\"leaky_relu\",\"activation\":\"relu\"}", "model.layers[1].activation",
       "not a field of a 'leaky_relu' layer"},
      {"{\"type\":\"softmax\"}", "model.layers[1]", "softmax is allowed only on the last layer"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char layers[512];
    snprintf(layers, sizeof layers, "{\"type\":\"flatten\"},%s,{\"type\":\"dense\",\"units\":10}",
             cases[i].layer);
    char *text = spec_with(layers, "{\"type\":\"sgd\"}");
    api_job_spec spec;
    api_error err;
    memset(&err, 0, sizeof err);
    if (api_spec_parse(text, strlen(text), &spec, &err) == 0) fail_msg("accepted: %s", text);
    int found = 0;
    for (int d = 0; d < err.n_details; d++)
      found |= strcmp(err.details[d].field, cases[i].field) == 0 &&
               strstr(err.details[d].description, cases[i].description) != NULL;
    if (!found)
      fail_msg("case %zu: no '%s' at %s; first detail %s: %s", i, cases[i].description,
               cases[i].field, err.details[0].field, err.details[0].description);
    free(text);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(residual_cnn_parses_with_keras_defaults),
      cmocka_unit_test(bad_layers_are_refused_with_their_field_paths),
      cmocka_unit_test(batch_norm_synchronized_is_a_boolean_false_by_default),
      cmocka_unit_test(new_optimizers_take_keras_defaults_and_check_their_options),
      cmocka_unit_test(activation_layers_by_keras_names_are_activation_layers),
      cmocka_unit_test(activation_layers_by_keras_names_check_their_fields),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
