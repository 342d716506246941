/* keras_model through a real kilnd and kiln-train, as a Keras user comes
 * in: POST /v1/jobs?validate_only=true with a model.to_json() is a 200
 * whose spec holds the translated model; a class kiln lacks is a 400 naming
 * the layer and its class; and `kiln submit --wait` trains one to the end. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static char data_dir[256];
static char base_url[64], admin_token[128];
static pid_t kilnd_pid;

/* The spec around a fixture's keras_model, with one edit of the Keras JSON
 * (layer index and class name; -1: none). */
static char *keras_spec(const char *fixture, int layer, const char *class_name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s.json", KERAS_FIXTURES, fixture);
  json_error_t jerr;
  json_t *keras = json_load_file(path, 0, &jerr);
  if (!keras) fail_msg("%s: %s", path, jerr.text);
  if (layer >= 0) {
    json_t *layers = json_object_get(json_object_get(keras, "config"), "layers");
    json_object_set_new(json_array_get(layers, (size_t)layer), "class_name",
                        json_string(class_name));
  }
  json_t *spec = json_pack("{s:s, s:o, s:s, s:[s], s:{s:s, s:s}, s:{s:i, s:i}, s:{s:s}, s:i, s:i}",
                           "display_name", fixture, "keras_model", keras, "loss",
                           "sparse_categorical_crossentropy", "metrics", "accuracy", "dataset",
                           "name", "fashion-mnist", "validation", "none", "pipeline", "batch_size",
                           32, "take", 128, "optimizer", "type", "adam", "epochs", 1, "seed", 3);
  assert_non_null(spec);
  char *text = json_dumps(spec, JSON_COMPACT);
  json_decref(spec);
  return text;
}

static long post(const char *path, const char *body, json_t **out) {
  char *data = NULL;
  long status =
      it_request(base_url, admin_token, "POST", path, body, body ? strlen(body) : 0, &data);
  if (status == 0) fail_msg("POST %s: %s", path, data ? data : "no answer");
  *out = data ? json_loads(data, 0, NULL) : NULL;
  free(data);
  return status;
}

static int start_kilnd(void **state) {
  (void)state;
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-keras-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  return it_launch_kilnd(KILND_PATH, data_dir, KILN_TRAIN_PATH, NULL, NULL, &kilnd_pid, base_url,
                         sizeof base_url, admin_token, sizeof admin_token);
}

static int stop_kilnd(void **state) {
  (void)state;
  return it_stop_kilnd(kilnd_pid, data_dir);
}

/* validate_only: 200, and the spec kilnd would store holds the translated
 * model (kiln's layer types, Keras's names), not keras_model. */
static void validate_only_keras_model_is_200_with_the_translated_model(void **state) {
  (void)state;
  static const char *const fixtures[] = {"keras2_sequential_cnn", "keras3_functional"};
  for (size_t i = 0; i < 2; i++) {
    char *body = keras_spec(fixtures[i], -1, NULL);
    json_t *doc;
    long status = post("/v1/jobs?validate_only=true", body, &doc);
    free(body);
    if (status != 200) {
      char *text = json_dumps(doc, 0);
      fail_msg("%s: HTTP %ld: %s", fixtures[i], status, text);
    }
    json_t *spec = json_object_get(doc, "spec");
    assert_null(json_object_get(spec, "keras_model"));
    json_t *layers = json_object_get(json_object_get(spec, "model"), "layers");
    json_t *first = json_array_get(layers, 0);
    assert_string_equal(json_string_value(json_object_get(first, "type")), "conv2d");
    assert_string_equal(json_string_value(json_object_get(first, "name")),
                        i == 0 ? "conv2d" : "stem");
    if (i == 1) {
      json_t *res = json_array_get(layers, 3);
      assert_string_equal(json_string_value(json_object_get(res, "type")), "add");
      assert_string_equal(json_string_value(json_array_get(json_object_get(res, "inputs"), 1)),
                          "branch_bn");
    }
    json_decref(doc);
  }
}

/* A class kiln lacks: 400 INVALID_ARGUMENT, the field the layer's path, the
 * description its name and class. */
static void unsupported_keras_class_is_400_naming_layer_and_class(void **state) {
  (void)state;
  char *body = keras_spec("keras2_sequential_mlp", 3, "LSTM");
  json_t *doc;
  assert_int_equal(post("/v1/jobs?validate_only=true", body, &doc), 400);
  free(body);
  json_t *error = json_object_get(doc, "error");
  assert_string_equal(json_string_value(json_object_get(error, "status")), "INVALID_ARGUMENT");
  json_t *detail = json_array_get(json_object_get(error, "details"), 0);
  assert_string_equal(json_string_value(json_object_get(detail, "field")),
                      "keras_model.config.layers[3]");
  assert_non_null(strstr(json_string_value(json_object_get(detail, "description")),
                         "layer 'dropout' is a Keras LSTM; kiln translates Dense, Conv2D"));
  json_decref(doc);
}

/* The CLI route: kiln submit --wait on a file with keras_model trains it
 * to SUCCEEDED; a bad one exits 1 naming the layer. */
static void kiln_submit_trains_a_keras_model(void **state) {
  (void)state;
  char path[400], cmd[2048], out[16384];
  const char *names[] = {"good", "bad"};
  for (int i = 0; i < 2; i++) {
    char *body = i == 0 ? keras_spec("keras3_sequential_mlp", -1, NULL)
                        : keras_spec("keras3_sequential_mlp", 2, "GRU");
    snprintf(path, sizeof path, "%s/%s.json", data_dir, names[i]);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(body, f);
    fclose(f);
    free(body);
    snprintf(cmd, sizeof cmd, "'%s' --server %s --token %s submit --wait --timeout 5m '%s'",
             KILN_CLI_PATH, base_url, admin_token, path);
    int status = it_run(out, sizeof out, cmd);
    print_message("$ kiln submit --wait %s.json -> %d\n%s\n", names[i], status, out);
    if (i == 0) {
      assert_int_equal(status, 0);
      assert_non_null(strstr(out, "SUCCEEDED"));
    } else {
      assert_int_equal(status, 1);
      assert_non_null(strstr(out, "keras_model.config.layers[2]"));
      assert_non_null(strstr(out, "layer 'dense' is a Keras GRU"));
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(validate_only_keras_model_is_200_with_the_translated_model),
      cmocka_unit_test(unsupported_keras_class_is_400_naming_layer_and_class),
      cmocka_unit_test(kiln_submit_trains_a_keras_model),
  };
  return cmocka_run_group_tests(tests, start_kilnd, stop_kilnd);
}
