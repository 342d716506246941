/* test_spec.c — the job spec: the example parses with its defaults, every
 * validation rule refuses with a 400 naming the exact field, all problems
 * are reported at once, and the canonical JSON reads back to the same
 * struct. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"

/* examples/fmnist-mlp.json */
static const char EXAMPLE[] =
    "{\"display_name\":\"fmnist-mlp\",\"model\":{\"input_shape\":[28,28,1],\"layers\":["
    "{\"type\":\"flatten\"},{\"type\":\"dense\",\"units\":256,\"activation\":\"relu\"},"
    "{\"type\":\"dense\",\"units\":10}]},\"loss\":\"sparse_categorical_crossentropy\","
    "\"metrics\":[\"accuracy\"],\"dataset\":{\"name\":\"fashion-mnist\",\"validation\":\"test\"},"
    "\"pipeline\":{\"batch_size\":128,\"shuffle\":true,\"normalize\":true},"
    "\"optimizer\":{\"type\":\"adam\",\"learning_rate\":0.001},\"epochs\":2,\"seed\":42,"
    "\"resources\":{\"device_type\":\"cpu\",\"devices\":1}}";

/* Only what is required; everything else takes its default. */
static const char MINIMAL[] =
    "{\"model\":{\"input_shape\":[784],\"layers\":[{\"type\":\"dense\",\"units\":10}]},"
    "\"loss\":\"sparse_categorical_crossentropy\",\"dataset\":{\"name\":\"fashion-mnist\"},"
    "\"optimizer\":{\"type\":\"sgd\"}}";

static int parse(const char *text, api_job_spec *spec, api_error *err) {
  return api_spec_parse(text, strlen(text), spec, err);
}

/* Sets the member at path ("model.layers[1].units") to the JSON value text,
 * or deletes it when value is NULL. An index equal to the array's size
 * appends. */
static void edit(json_t *root, const char *path, const char *value) {
  json_t *parent = root;
  const char *at = path;
  for (;;) {
    char key[64] = "";
    long index = -1;
    if (*at == '[') {
      char *end;
      index = strtol(at + 1, &end, 10);
      at = end + 1; /* past ']' */
    } else {
      size_t n = strcspn(at, ".[");
      assert_true(n < sizeof key);
      memcpy(key, at, n);
      key[n] = '\0';
      at += n;
    }
    if (*at == '.') at++;
    if (*at == '\0') {
      json_t *new_value = NULL;
      if (value) {
        json_error_t jerr;
        new_value = json_loads(value, JSON_DECODE_ANY, &jerr);
        if (!new_value) fail_msg("bad test value %s: %s", value, jerr.text);
      }
      if (index >= 0 && !new_value)
        assert_int_equal(json_array_remove(parent, (size_t)index), 0);
      else if (index >= 0 && (size_t)index == json_array_size(parent))
        assert_int_equal(json_array_append_new(parent, new_value), 0);
      else if (index >= 0)
        assert_int_equal(json_array_set_new(parent, (size_t)index, new_value), 0);
      else if (!new_value)
        assert_int_equal(json_object_del(parent, key), 0);
      else
        assert_int_equal(json_object_set_new(parent, key, new_value), 0);
      return;
    }
    parent = index >= 0 ? json_array_get(parent, (size_t)index) : json_object_get(parent, key);
    if (!parent) fail_msg("test path %s does not exist", path);
  }
}

/* The example with up to two edits; caller frees. */
static char *edited(const char *path1, const char *value1, const char *path2, const char *value2) {
  json_t *root = json_loads(EXAMPLE, 0, NULL);
  assert_non_null(root);
  if (path1) edit(root, path1, value1);
  if (path2) edit(root, path2, value2);
  char *text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  assert_non_null(text);
  return text;
}

static void assert_invalid_argument(const api_error *err) {
  assert_int_equal(err->http, 400);
  assert_non_null(err->status);
  assert_string_equal(err->status, "INVALID_ARGUMENT");
}

/* ---- one test per rule ---- */

#define DELETE NULL

typedef struct bad_case {
  const char *path, *value;   /* an edit of the example; value DELETE removes */
  const char *path2, *value2; /* an optional second edit */
  const char *field;          /* the one detail expected */
  const char *description;    /* a part of its description */
} bad_case;

static void rule_is_enforced(void **state) {
  const bad_case *bc = *state;
  char *text = edited(bc->path, bc->value, bc->path2, bc->value2);
  api_job_spec spec;
  api_error err;
  int rc = parse(text, &spec, &err);
  if (rc != -1) fail_msg("accepted: %s", text);
  assert_invalid_argument(&err);
  if (err.n_details != 1 || strcmp(err.details[0].field, bc->field) != 0)
    for (int i = 0; i < err.n_details; i++)
      print_message("detail %d: %s: %s\n", i, err.details[i].field, err.details[i].description);
  assert_int_equal(err.n_details, 1);
  assert_string_equal(err.details[0].field, bc->field);
  if (!strstr(err.details[0].description, bc->description))
    fail_msg("description '%s' lacks '%s'", err.details[0].description, bc->description);
  assert_string_equal(err.message, "job spec is invalid: 1 problem");
  free(text);
}

#define RULE(test_name, ...)                                                                       \
  {                                                                                                \
    test_name, rule_is_enforced, NULL, NULL, &(bad_case) {                                         \
      __VA_ARGS__                                                                                  \
    }                                                                                              \
  }
#define A16 "aaaaaaaaaaaaaaaa"

static const struct CMUnitTest rules[] = {
    /* top level */
    RULE("unknown_top_level_field_is_refused", "epochz", "3", .field = "epochz",
         .description = "unknown field"),
    RULE("unknown_nested_field_is_refused_with_its_path", "pipeline.shufle", "true",
         .field = "pipeline.shufle", .description = "unknown field"),
    RULE("display_name_longer_than_127_bytes_is_refused", "display_name",
         "\"" A16 A16 A16 A16 A16 A16 A16 A16 "\"", .field = "display_name",
         .description = "must be 1 to 127 bytes long, got 128"),
    RULE("empty_display_name_is_refused", "display_name", "\"\"", .field = "display_name",
         .description = "got 0"),
    RULE("display_name_of_wrong_type_is_refused", "display_name", "7", .field = "display_name",
         .description = "must be a string, got integer"),
    RULE("missing_model_is_refused", "model", DELETE, .field = "model",
         .description = "is required"),
    RULE("model_that_is_not_an_object_is_refused", "model", "[]", .field = "model",
         .description = "must be an object, got array"),
    RULE("missing_loss_is_refused", "loss", DELETE, .field = "loss", .description = "is required"),
    RULE("unsupported_loss_is_refused", "loss", "\"hinge\"", .field = "loss",
         .description = "unsupported loss 'hinge'; supported: sparse_categorical_crossentropy, "
                        "categorical_crossentropy, binary_crossentropy"),
    RULE("categorical_crossentropy_without_one_hot_labels_is_refused", "loss",
         "\"categorical_crossentropy\"", .field = "pipeline.one_hot",
         .description = "categorical_crossentropy reads one-hot labels; set one_hot to true"),
    RULE("one_hot_with_the_sparse_loss_is_refused", "pipeline.one_hot", "true",
         .field = "pipeline.one_hot",
         .description = "sparse_categorical_crossentropy reads class ids, not one-hot rows"),
    RULE("accuracy_with_a_regression_loss_is_refused_at_its_index", "loss", "\"mse\"",
         "model.layers[2].units", "1", .field = "metrics[0]",
         .description = "'accuracy' needs a classification loss, and 'mean_squared_error' is a "
                        "regression loss; supported with it: mse, mae"),
    RULE("mae_with_a_classification_loss_is_refused_at_its_index", "metrics",
         "[\"accuracy\",\"mae\"]", .field = "metrics[1]",
         .description = "'mae' needs a regression loss"),
    RULE("regression_on_a_built_in_classification_set_is_refused", "loss", "\"mse\"", "metrics",
         "[\"mae\"]", .field = "loss",
         .description = "mean_squared_error needs numeric labels, and fashion-mnist's labels are "
                        "classes"),
    RULE("binary_crossentropy_with_one_unit_on_ten_classes_is_refused", "loss",
         "\"binary_crossentropy\"", "model.layers[2].units", "1", .field = "model.layers[2]",
         .description = "scores labels 0 and 1, but fashion-mnist has 10 classes"),
    RULE("binary_crossentropy_with_ten_units_needs_one_hot", "loss", "\"binary_crossentropy\"",
         .field = "pipeline.one_hot",
         .description = "binary_crossentropy with 10 outputs reads "
                        "one-hot labels"),
    RULE("shard_index_at_num_shards_is_refused", "pipeline.shard", "{\"num_shards\":2,\"index\":2}",
         .field = "pipeline.shard.index", .description = "must be below num_shards 2, got 2"),
    RULE("shard_without_num_shards_is_refused", "pipeline.shard", "{\"index\":0}",
         .field = "pipeline.shard.num_shards", .description = "is required"),
    RULE("shard_with_an_unknown_field_is_refused", "pipeline.shard",
         "{\"num_shards\":2,\"index\":0,\"count\":2}", .field = "pipeline.shard.count",
         .description = "unknown field"),
    RULE("cast_to_an_unsupported_type_is_refused", "pipeline.cast", "\"int8\"",
         .field = "pipeline.cast",
         .description = "unsupported cast 'int8'; supported: float32, float16, bfloat16"),
    RULE("unsupported_metric_is_refused_at_its_index", "metrics", "[\"accuracy\",\"f1\"]",
         .field = "metrics[1]", .description = "unsupported metric 'f1'"),
    RULE("metrics_that_is_not_an_array_is_refused", "metrics", "\"accuracy\"", .field = "metrics",
         .description = "must be an array, got string"),
    RULE("missing_dataset_is_refused", "dataset", DELETE, .field = "dataset",
         .description = "is required"),
    RULE("missing_dataset_name_is_refused", "dataset.name", DELETE, .field = "dataset.name",
         .description = "is required"),
    RULE("unknown_dataset_names_the_builtin_one", "dataset.name", "\"mnist\"",
         .field = "dataset.name", .description = "built-in data sets: fashion-mnist"),
    RULE("unknown_validation_split_is_refused", "dataset.validation", "\"train\"",
         .field = "dataset.validation", .description = "'train'"),
    RULE("unknown_dataset_field_is_refused", "dataset.split", "0.1", .field = "dataset.split",
         .description = "unknown field"),
    RULE("unknown_shard_format_is_refused", "dataset.format", "\"parquet\"",
         .field = "dataset.format", .description = "unknown shard format 'parquet'"),
    RULE("shard_folder_name_with_a_slash_is_refused", "dataset",
         "{\"name\":\"../etc\",\"format\":\"tfrecord\"}", .field = "dataset.name",
         .description = "names a folder of shards"),
    RULE("features_without_a_format_are_refused", "dataset.features", "{\"image\":\"x\"}",
         .field = "dataset.features", .description = "needs a shard format"),
    RULE("empty_feature_name_is_refused", "dataset",
         "{\"name\":\"fm\",\"format\":\"tar\",\"features\":{\"label\":\"\"}}",
         .field = "dataset.features.label", .description = "must be a name of 1-127 bytes"),
    RULE("unknown_feature_role_is_refused", "dataset",
         "{\"name\":\"fm\",\"format\":\"tfrecord\",\"features\":{\"weight\":\"w\"}}",
         .field = "dataset.features.weight", .description = "unknown field"),
    RULE("validation_split_of_streamed_shards_is_refused", "dataset",
         "{\"name\":\"fm\",\"format\":\"tfrecord\",\"validation_split\":0.1}",
         .field = "dataset.validation", .description = "streamed shards validate on their test"),
    RULE("validation_split_of_one_is_refused", "dataset.validation_split", "1",
         .field = "dataset.validation_split", .description = "must be > 0 and < 1, got 1"),
    RULE("validation_split_with_test_split_is_refused", "dataset.validation_split", "0.1",
         .field = "dataset.validation_split", .description = "needs validation 'split'"),
    RULE("validation_split_missing_for_split_is_refused", "dataset.validation", "\"split\"",
         .field = "dataset.validation_split", .description = "is required"),
    RULE("malformed_dataset_id_is_refused", "dataset.name", "\"ds-12345\"", .field = "dataset.name",
         .description = "ds- and 16 hex digits"),
    /* pipeline */
    RULE("batch_size_zero_is_refused", "pipeline.batch_size", "0", .field = "pipeline.batch_size",
         .description = "must be between 1 and 65536, got 0"),
    RULE("batch_size_above_65536_is_refused", "pipeline.batch_size", "65537",
         .field = "pipeline.batch_size", .description = "got 65537"),
    RULE("batch_size_as_string_is_refused", "pipeline.batch_size", "\"128\"",
         .field = "pipeline.batch_size", .description = "must be an integer, got string"),
    RULE("fractional_batch_size_is_refused", "pipeline.batch_size", "2.5",
         .field = "pipeline.batch_size", .description = "must be an integer, got 2.5"),
    RULE("shuffle_as_number_is_refused", "pipeline.shuffle", "1", .field = "pipeline.shuffle",
         .description = "must be a boolean (true or false), got integer"),
    RULE("normalize_as_string_is_refused", "pipeline.normalize", "\"yes\"",
         .field = "pipeline.normalize", .description = "got string"),
    RULE("drop_remainder_null_is_refused", "pipeline.drop_remainder", "null",
         .field = "pipeline.drop_remainder", .description = "got null"),
    RULE("unknown_augmentation_is_refused", "pipeline.augment", "[\"flip_left_right\",\"rotate\"]",
         .field = "pipeline.augment[1]", .description = "unknown augmentation 'rotate'"),
    RULE("repeated_augmentation_is_refused", "pipeline.augment",
         "[\"flip_up_down\",\"flip_up_down\"]", .field = "pipeline.augment[1]",
         .description = "listed twice"),
    RULE("crop_padding_zero_is_refused", "pipeline.augment",
         "[{\"type\":\"random_crop\",\"padding\":0}]", .field = "pipeline.augment[0].padding",
         .description = "between 1 and 1024"),
    RULE("brightness_option_on_crop_is_refused", "pipeline.augment",
         "[{\"type\":\"random_crop\",\"max_delta\":0.1}]", .field = "pipeline.augment[0].max_delta",
         .description = "unknown field"),
    RULE("prefetch_word_other_than_auto_is_refused", "pipeline.prefetch", "\"max\"",
         .field = "pipeline.prefetch", .description = "an integer or \"auto\", got 'max'"),
    RULE("num_parallel_calls_above_64_is_refused", "pipeline.num_parallel_calls", "65",
         .field = "pipeline.num_parallel_calls", .description = "between 0 and 64"),
    RULE("interleave_without_cycle_length_is_refused", "pipeline.interleave",
         "{\"block_length\":2}", .field = "pipeline.interleave.cycle_length",
         .description = "is required"),
    RULE("unknown_cache_is_refused", "pipeline.cache", "\"disk\"", .field = "pipeline.cache",
         .description = "unknown cache 'disk'"),
    RULE("standardize_with_zero_std_is_refused", "pipeline.standardize",
         "{\"mean\":[0.5],\"std\":[0]}", .field = "pipeline.standardize.std[0]",
         .description = "must be > 0, got 0"),
    RULE("standardize_lists_of_different_lengths_are_refused", "pipeline.standardize",
         "{\"mean\":[0.5,0.2],\"std\":[1]}", .field = "pipeline.standardize",
         .description = "same number of channels"),
    RULE("shuffle_buffer_without_shuffle_is_refused", "pipeline.shuffle", "false",
         "pipeline.shuffle_buffer", "100", .field = "pipeline.shuffle_buffer",
         .description = "no effect with shuffle false"),
    RULE("pipeline_that_is_not_an_object_is_refused", "pipeline", "true", .field = "pipeline",
         .description = "must be an object, got boolean"),
    /* optimizer */
    RULE("missing_optimizer_is_refused", "optimizer", DELETE, .field = "optimizer",
         .description = "is required"),
    RULE("missing_optimizer_type_is_refused", "optimizer.type", DELETE, .field = "optimizer.type",
         .description = "is required"),
    RULE("unknown_optimizer_type_lists_the_supported_ones", "optimizer.type", "\"lamb\"",
         .field = "optimizer.type",
         .description = "unknown optimizer type 'lamb'; supported: sgd, adam, adamw, rmsprop, "
                        "adagrad"),
    RULE("zero_learning_rate_is_refused", "optimizer.learning_rate", "0",
         .field = "optimizer.learning_rate", .description = "must be > 0 and <= 10, got 0"),
    RULE("learning_rate_above_10_is_refused", "optimizer.learning_rate", "10.5",
         .field = "optimizer.learning_rate", .description = "got 10.5"),
    RULE("learning_rate_as_string_is_refused", "optimizer.learning_rate", "\"0.1\"",
         .field = "optimizer.learning_rate", .description = "must be a number, got string"),
    RULE("sgd_option_on_adam_is_refused_naming_the_type", "optimizer.momentum", "0.9",
         .field = "optimizer.momentum",
         .description = "is an option of optimizer type 'sgd', not 'adam'"),
    RULE("adam_option_on_sgd_is_refused_naming_the_type", "optimizer.type", "\"sgd\"",
         "optimizer.beta_1", "0.9", .field = "optimizer.beta_1",
         .description = "is an option of optimizer type 'adam', not 'sgd'"),
    RULE("unknown_optimizer_field_is_refused", "optimizer.decay", "0.1", .field = "optimizer.decay",
         .description = "unknown field"),
    RULE("momentum_of_one_is_refused", "optimizer.type", "\"sgd\"", "optimizer.momentum", "1",
         .field = "optimizer.momentum", .description = "must be >= 0 and < 1, got 1"),
    RULE("negative_momentum_is_refused", "optimizer.type", "\"sgd\"", "optimizer.momentum", "-0.5",
         .field = "optimizer.momentum", .description = "got -0.5"),
    RULE("nesterov_without_momentum_is_refused", "optimizer.type", "\"sgd\"", "optimizer.nesterov",
         "true", .field = "optimizer.nesterov", .description = "nesterov requires momentum > 0"),
    RULE("nesterov_as_string_is_refused", "optimizer.type", "\"sgd\"", "optimizer.nesterov",
         "\"true\"", .field = "optimizer.nesterov", .description = "must be a boolean"),
    RULE("beta_1_of_one_is_refused", "optimizer.beta_1", "1", .field = "optimizer.beta_1",
         .description = "must be >= 0 and < 1, got 1"),
    RULE("negative_beta_2_is_refused", "optimizer.beta_2", "-0.5", .field = "optimizer.beta_2",
         .description = "got -0.5"),
    RULE("zero_epsilon_is_refused", "optimizer.epsilon", "0", .field = "optimizer.epsilon",
         .description = "must be > 0, got 0"),
    /* loop */
    RULE("zero_epochs_is_refused", "epochs", "0", .field = "epochs",
         .description = "must be between 1 and 10000, got 0"),
    RULE("epochs_above_10000_is_refused", "epochs", "10001", .field = "epochs",
         .description = "got 10001"),
    RULE("fractional_epochs_is_refused", "epochs", "2.5", .field = "epochs",
         .description = "must be an integer, got 2.5"),
    RULE("epochs_as_boolean_is_refused", "epochs", "true", .field = "epochs",
         .description = "must be an integer, got boolean"),
    RULE("zero_log_every_steps_is_refused", "log_every_steps", "0", .field = "log_every_steps",
         .description = "must be between 1 and 1000000, got 0"),
    RULE("negative_seed_is_refused", "seed", "-1", .field = "seed",
         .description = "must be a non-negative integer, got -1"),
    RULE("seed_as_string_is_refused", "seed", "\"42\"", .field = "seed",
         .description = "must be an integer, got string"),
    RULE("priority_above_100_is_refused", "priority", "101", .field = "priority",
         .description = "must be between 0 and 100, got 101"),
    RULE("negative_priority_is_refused", "priority", "-1", .field = "priority",
         .description = "got -1"),
    RULE("negative_max_restarts_is_refused", "max_restarts", "-1", .field = "max_restarts",
         .description = "must be between 0 and 100, got -1"),
    RULE("max_runtime_as_string_is_refused", "max_runtime", "\"2h\"", .field = "max_runtime",
         .description = "must be an integer, got string"),
    RULE("max_runtime_past_a_year_is_refused", "max_runtime", "31622401", .field = "max_runtime",
         .description = "got 31622401"),
    /* resources, precision, strategy */
    RULE("unknown_device_type_is_refused", "resources.device_type", "\"cuda\"",
         .field = "resources.device_type", .description = "must be cpu or gpu, got 'cuda'"),
    RULE("parameter_server_on_gpus_is_refused", "resources",
         "{\"device_type\":\"gpu\",\"devices\":3}", "strategy",
         "{\"type\":\"parameter_server\",\"ps\":1,\"workers\":2}", .field = "resources.device_type",
         .description = "on GPUs use mirrored or multi_worker"),
    RULE("mirrored_on_fewer_gpus_than_replicas_is_refused", "resources",
         "{\"device_type\":\"gpu\",\"devices\":1}", "strategy",
         "{\"type\":\"mirrored\",\"replicas\":2}", .field = "resources.devices",
         .description = "replicas x workers = 2 for this strategy (a GPU per replica), got 1"),
    /* model parallelism: a layer's device */
    RULE("layer_device_of_another_form_is_refused", "model.layers[1].device", "\"cuda1\"",
         .field = "model.layers[1].device",
         .description = "must be \"cpu\" or \"cuda:N\" (the job's GPU N, 0 to 255), got 'cuda1'"),
    RULE("layer_device_with_a_sign_is_refused", "model.layers[1].device", "\"cuda:+1\"",
         .field = "model.layers[1].device", .description = "got 'cuda:+1'"),
    RULE("layer_device_as_number_is_refused", "model.layers[1].device", "1",
         .field = "model.layers[1].device", .description = "must be a string, got integer"),
    RULE("layer_on_a_gpu_of_a_cpu_job_is_refused", "model.layers[1].device", "\"cuda:0\"",
         .field = "model.layers[1].device",
         .description = "names cuda:0, a GPU, but the job runs on CPU cores"),
    RULE("layer_on_a_gpu_the_job_lacks_is_refused", "resources",
         "{\"device_type\":\"gpu\",\"devices\":2}", "model.layers[2].device", "\"gpu:2\"",
         .field = "model.layers[2].device",
         .description = "names cuda:2, but the job holds 2 GPUs (resources.devices): cuda:0 to "
                        "cuda:1"),
    RULE("layer_device_with_a_replicated_strategy_is_refused", "strategy",
         "{\"type\":\"multi_worker\",\"workers\":1}", "model.layers[1].device", "\"cuda:1\"",
         .field = "model.layers[1].device",
         .description = "strategy 'multi_worker' runs a replica on each device: model parallelism "
                        "trains with strategy single"),
    RULE("zero_devices_are_refused", "resources.devices", "0", .field = "resources.devices",
         .description = "between 1 and 256"),
    RULE("more_devices_than_a_pool_can_hold_are_refused", "resources.devices", "257",
         .field = "resources.devices", .description = "between 1 and 256"),
    RULE("devices_as_string_is_refused", "resources.devices", "\"1\"", .field = "resources.devices",
         .description = "must be an integer, got string"),
    RULE("pool_name_with_a_slash_is_refused", "resources.pool", "\"a/b\"",
         .field = "resources.pool", .description = "must be 1 to 31 characters"),
    RULE("unknown_resources_field_is_refused", "resources.gpus", "1", .field = "resources.gpus",
         .description = "unknown field"),
    RULE("unknown_precision_is_refused", "precision", "\"float16\"", .field = "precision",
         .description = "supported: float32, mixed_bfloat16, mixed_float16"),
    RULE("precision_as_number_is_refused", "precision", "16", .field = "precision",
         .description = "must be a string"),
    RULE("recompute_as_string_is_refused", "recompute", "\"yes\"", .field = "recompute",
         .description = "must be a boolean"),
    RULE("mirrored_strategy_without_replicas_is_refused", "strategy", "{\"type\":\"mirrored\"}",
         .field = "strategy.replicas", .description = "is required"),
    RULE("strategy_without_type_is_refused", "strategy", "{}", .field = "strategy.type",
         .description = "is required"),
    RULE("unknown_strategy_field_is_refused", "strategy", "{\"type\":\"single\",\"gpus\":2}",
         .field = "strategy.gpus", .description = "unknown field"),
    /* model: input shape */
    RULE("missing_input_shape_is_refused", "model.input_shape", DELETE,
         .field = "model.input_shape", .description = "is required"),
    RULE("empty_input_shape_is_refused", "model.input_shape", "[]", .field = "model.input_shape",
         .description = "must have 1 to 6 dimensions, got 0"),
    RULE("input_shape_of_rank_7_is_refused", "model.input_shape", "[1,1,1,1,1,1,2]",
         .field = "model.input_shape", .description = "got 7"),
    RULE("zero_dimension_is_refused_at_its_index", "model.input_shape", "[28,0,1]",
         .field = "model.input_shape[1]", .description = "must be between 1 and 65536, got 0"),
    RULE("dimension_above_65536_is_refused", "model.input_shape", "[65537]",
         .field = "model.input_shape[0]", .description = "got 65537"),
    RULE("dimension_as_string_is_refused", "model.input_shape", "[\"28\",28,1]",
         .field = "model.input_shape[0]", .description = "must be a positive integer, got string"),
    RULE("input_of_65536_to_the_sixth_values_is_refused_without_overflow", "model.input_shape",
         "[65536,65536,65536,65536,65536,65536]", .field = "model.input_shape",
         .description = "has more than 16777216 values per example"),
    RULE("input_of_more_than_16M_values_is_refused", "model.input_shape", "[4096,4096,2]",
         .field = "model.input_shape", .description = "has 33554432 values per example"),
    /* model: layers */
    RULE("empty_layer_list_is_refused", "model.layers", "[]", .field = "model.layers",
         .description = "must list 1 to 64 layers, got 0"),
    RULE("layers_that_is_not_an_array_is_refused", "model.layers", "{}", .field = "model.layers",
         .description = "must be an array, got object"),
    RULE("layer_that_is_not_an_object_is_refused", "model.layers[0]", "\"flatten\"",
         .field = "model.layers[0]", .description = "must be an object, got string"),
    RULE("unknown_layer_type_lists_the_supported_ones", "model.layers[1].type", "\"conv3d\"",
         .field = "model.layers[1].type",
         .description = "unknown layer type 'conv3d'; supported: dense, flatten, activation, relu"),
    RULE("layer_without_type_is_refused", "model.layers[0].type", DELETE,
         .field = "model.layers[0].type", .description = "is required"),
    RULE("dense_without_units_is_refused", "model.layers[1].units", DELETE,
         .field = "model.layers[1].units", .description = "is required"),
    RULE("dense_with_zero_units_is_refused", "model.layers[1].units", "0",
         .field = "model.layers[1].units", .description = "must be between 1 and 65536, got 0"),
    RULE("dense_with_units_above_65536_is_refused", "model.layers[1].units", "65537",
         .field = "model.layers[1].units", .description = "got 65537"),
    RULE("dense_with_unknown_activation_lists_the_supported_ones", "model.layers[1].activation",
         "\"swish\"", .field = "model.layers[1].activation",
         .description = "unknown activation 'swish'; supported: linear, relu, softmax, leaky_relu, "
                        "elu, gelu, sigmoid, tanh"),
    RULE("use_bias_as_string_is_refused", "model.layers[1].use_bias", "\"no\"",
         .field = "model.layers[1].use_bias", .description = "must be a boolean"),
    RULE("field_of_another_layer_type_is_refused", "model.layers[0].units", "3",
         .field = "model.layers[0].units", .description = "not a field of a 'flatten' layer"),
    RULE("unknown_layer_field_is_refused", "model.layers[1].kernel_sizes", "3",
         .field = "model.layers[1].kernel_sizes", .description = "unknown field"),
    RULE("activation_layer_without_activation_is_refused", "model.layers[3]",
         "{\"type\":\"activation\"}", .field = "model.layers[3].activation",
         .description = "is required"),
    RULE("softmax_before_the_last_layer_is_refused", "model.layers[1].activation", "\"softmax\"",
         .field = "model.layers[1].activation",
         .description = "softmax is allowed only on the last layer"),
    RULE("softmax_activation_layer_before_the_last_is_refused", "model.layers[1]",
         "{\"type\":\"activation\",\"activation\":\"softmax\"}", "model.layers[0]",
         "{\"type\":\"flatten\"}", .field = "model.layers[1].activation",
         .description = "only on the last layer"),
    RULE("layer_name_with_a_space_is_refused", "model.layers[1].name", "\"hidden layer\"",
         .field = "model.layers[1].name", .description = "got 'hidden layer'"),
    RULE("layer_name_of_64_characters_is_refused", "model.layers[1].name",
         "\"" A16 A16 A16 A16 "\"", .field = "model.layers[1].name",
         .description = "must be 1 to 63 characters"),
    RULE("duplicate_layer_name_is_reported_on_the_later_layer", "model.layers[1].name", "\"head\"",
         "model.layers[2].name", "\"head\"", .field = "model.layers[2].name",
         .description = "duplicate layer name 'head' (also the name of model.layers[1])"),
    RULE("name_taking_a_default_name_is_reported_on_the_named_layer", "model.layers[2].name",
         "\"dense_1\"", .field = "model.layers[2].name",
         .description = "also the default name of model.layers[1]"),
    /* model: shapes */
    RULE("dense_on_an_image_asks_for_a_flatten_layer", "model.layers[0]",
         "{\"type\":\"dense\",\"units\":64}", .field = "model.layers[0]",
         .description = "dense expects a flat input (rank 1), got shape (28, 28, 1); add a "
                        "flatten layer before it"),
    RULE("last_layer_with_one_unit_is_refused", "model.layers[2].units", "1",
         .field = "model.layers[2]",
         .description = "sparse_categorical_crossentropy needs a score per class, at least 2 "
                        "units; got 1"),
    RULE("model_ending_in_an_image_shape_is_refused", "model.layers", "[{\"type\":\"relu\"}]",
         .field = "model.layers[0]", .description = "got shape (28, 28, 1)"),
    RULE("input_shape_that_does_not_fit_the_dataset_is_refused", "model.input_shape", "[27,28,1]",
         .field = "model.input_shape",
         .description = "holds 756 values per example, but fashion-mnist examples hold 784; "
                        "use [28, 28, 1]"),
    RULE("fewer_class_scores_than_dataset_classes_are_refused", "model.layers[2].units", "5",
         .field = "model.layers[2]",
         .description = "outputs 5 class scores, but fashion-mnist has 10 classes"),
};

/* ---- accepted specs ---- */

static void example_parses_with_its_fields_and_defaults(void **state) {
  (void)state;
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse(EXAMPLE, &spec, &err), 0);
  assert_int_equal(err.http, 0);
  assert_int_equal(err.n_details, 0);

  assert_string_equal(spec.display_name, "fmnist-mlp");
  assert_int_equal(spec.input_ndim, 3);
  assert_int_equal(spec.input_shape[0], 28);
  assert_int_equal(spec.input_shape[1], 28);
  assert_int_equal(spec.input_shape[2], 1);
  assert_int_equal(spec.n_layers, 3);
  assert_int_equal(spec.layers[0].type, API_LAYER_FLATTEN);
  assert_string_equal(spec.layers[0].name, "flatten_0");
  assert_int_equal(spec.layers[1].type, API_LAYER_DENSE);
  assert_string_equal(spec.layers[1].name, "dense_1");
  assert_int_equal(spec.layers[1].units, 256);
  assert_int_equal(spec.layers[1].activation, API_ACT_RELU);
  assert_int_equal(spec.layers[1].use_bias, 1);
  assert_int_equal(spec.layers[2].type, API_LAYER_DENSE);
  assert_string_equal(spec.layers[2].name, "dense_2");
  assert_int_equal(spec.layers[2].units, 10);
  assert_int_equal(spec.layers[2].activation, API_ACT_LINEAR);
  assert_int_equal(spec.layers[2].use_bias, 1);

  assert_string_equal(spec.loss, "sparse_categorical_crossentropy");
  assert_int_equal(spec.metric_accuracy, 1);
  assert_string_equal(spec.dataset, "fashion-mnist");
  assert_string_equal(spec.validation, "test");
  assert_int_equal(spec.batch_size, 128);
  assert_int_equal(spec.shuffle, 1);
  assert_int_equal(spec.normalize, 1);
  assert_int_equal(spec.drop_remainder, 0);

  assert_int_equal(spec.optimizer, API_OPT_ADAM);
  assert_true(spec.learning_rate == 0.001);
  assert_true(spec.beta_1 == 0.9);
  assert_true(spec.beta_2 == 0.999);
  assert_true(spec.epsilon == 1e-7);
  assert_true(spec.momentum == 0);
  assert_int_equal(spec.nesterov, 0);

  assert_int_equal(spec.epochs, 2);
  assert_int_equal(spec.log_every_steps, 50);
  assert_int_equal(spec.has_seed, 1);
  assert_int_equal(spec.seed, 42);
  assert_int_equal(spec.priority, 50);
  assert_string_equal(spec.device_type, "cpu");
  assert_int_equal(spec.devices, 1);
}

static void minimal_spec_gets_every_default(void **state) {
  (void)state;
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse(MINIMAL, &spec, &err), 0);
  assert_string_equal(spec.display_name, "job");
  assert_int_equal(spec.metric_accuracy, 0);
  assert_string_equal(spec.validation, "test");
  assert_int_equal(spec.batch_size, 32);
  assert_int_equal(spec.shuffle, 1);
  assert_int_equal(spec.normalize, 1);
  assert_int_equal(spec.drop_remainder, 0);
  assert_int_equal(spec.optimizer, API_OPT_SGD);
  assert_true(spec.learning_rate == 0.01);
  assert_true(spec.momentum == 0);
  assert_int_equal(spec.nesterov, 0);
  assert_int_equal(spec.epochs, 1);
  assert_int_equal(spec.log_every_steps, 50);
  assert_int_equal(spec.has_seed, 0);
  assert_int_equal(spec.seed, 0);
  assert_int_equal(spec.priority, 50);
  assert_string_equal(spec.device_type, "cpu");
  assert_int_equal(spec.devices, 1);
  assert_string_equal(spec.layers[0].name, "dense_0");
  assert_int_equal(spec.layers[0].activation, API_ACT_LINEAR);
  assert_int_equal(spec.layers[0].use_bias, 1);
}

static void adam_learning_rate_defaults_to_0_001(void **state) {
  (void)state;
  char *text = edited("optimizer.learning_rate", DELETE, NULL, NULL);
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse(text, &spec, &err), 0);
  assert_true(spec.learning_rate == 0.001);
  free(text);
}

static void integers_written_as_2_0_are_accepted(void **state) {
  (void)state;
  char *text = edited("epochs", "3.0", "pipeline.batch_size", "64.0");
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse(text, &spec, &err), 0);
  assert_int_equal(spec.epochs, 3);
  assert_int_equal(spec.batch_size, 64);
  free(text);
}

static void every_option_given_explicitly_is_kept(void **state) {
  (void)state;
  const char *text =
      "{\"display_name\":\"all\",\"model\":{\"input_shape\":[28,28],\"layers\":["
      "{\"type\":\"flatten\",\"name\":\"in\"},"
      "{\"type\":\"dense\",\"units\":32,\"use_bias\":false,\"name\":\"hidden.1\"},"
      "{\"type\":\"relu\"},"
      "{\"type\":\"dense\",\"units\":16},"
      "{\"type\":\"activation\",\"activation\":\"relu\"},"
      "{\"type\":\"dense\",\"units\":10,\"activation\":\"softmax\",\"name\":\"probs\"}]},"
      "\"loss\":\"sparse_categorical_crossentropy\",\"metrics\":[],"
      "\"dataset\":{\"name\":\"fashion-mnist\",\"validation\":\"none\"},"
      "\"pipeline\":{\"batch_size\":7,\"shuffle\":false,\"normalize\":false,"
      "\"drop_remainder\":true},"
      "\"optimizer\":{\"type\":\"sgd\",\"learning_rate\":0.5,\"momentum\":0.9,\"nesterov\":true},"
      "\"epochs\":10000,\"log_every_steps\":1000000,\"seed\":0,\"priority\":0,"
      "\"max_restarts\":0,\"max_runtime\":0,"
      "\"resources\":{\"device_type\":\"cpu\",\"devices\":1,\"pool\":\"default\"},"
      "\"precision\":\"float32\",\"strategy\":{\"type\":\"single\"}}";
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse(text, &spec, &err), 0);
  assert_int_equal(spec.input_ndim, 2);
  assert_int_equal(spec.n_layers, 6);
  assert_string_equal(spec.layers[0].name, "in");
  assert_string_equal(spec.layers[1].name, "hidden.1");
  assert_int_equal(spec.layers[1].use_bias, 0);
  assert_int_equal(spec.layers[2].type, API_LAYER_RELU);
  assert_int_equal(spec.layers[2].activation, API_ACT_RELU);
  assert_string_equal(spec.layers[2].name, "relu_2");
  assert_string_equal(spec.layers[3].name, "dense_3");
  assert_int_equal(spec.layers[4].type, API_LAYER_ACTIVATION);
  assert_int_equal(spec.layers[4].activation, API_ACT_RELU);
  assert_string_equal(spec.layers[4].name, "activation_4");
  assert_int_equal(spec.layers[5].activation, API_ACT_SOFTMAX);
  assert_string_equal(spec.layers[5].name, "probs");
  assert_int_equal(spec.metric_accuracy, 0);
  assert_string_equal(spec.validation, "none");
  assert_int_equal(spec.batch_size, 7);
  assert_int_equal(spec.shuffle, 0);
  assert_int_equal(spec.normalize, 0);
  assert_int_equal(spec.drop_remainder, 1);
  assert_int_equal(spec.optimizer, API_OPT_SGD);
  assert_true(spec.learning_rate == 0.5);
  assert_true(spec.momentum == 0.9);
  assert_int_equal(spec.nesterov, 1);
  assert_int_equal(spec.epochs, 10000);
  assert_int_equal(spec.log_every_steps, 1000000);
  assert_int_equal(spec.has_seed, 1);
  assert_int_equal(spec.seed, 0);
  assert_int_equal(spec.priority, 0);
}

/* ---- many problems, bad bodies ---- */

static void all_violations_are_reported_not_just_the_first(void **state) {
  (void)state;
  char *text = edited("pipeline.shufle", "true", "optimizer.learning_rate", "0");
  json_t *root = json_loads(text, 0, NULL);
  free(text);
  edit(root, "model.layers[1].type", "\"conv3d\"");
  edit(root, "epochs", "0");
  text = json_dumps(root, JSON_COMPACT);
  json_decref(root);

  api_job_spec spec;
  api_error err;
  assert_int_equal(parse(text, &spec, &err), -1);
  assert_invalid_argument(&err);
  assert_string_equal(err.message, "job spec is invalid: 4 problems");
  assert_int_equal(err.n_details, 4);
  /* In the order the spec is read: model, pipeline, optimizer, loop. */
  assert_string_equal(err.details[0].field, "model.layers[1].type");
  assert_string_equal(err.details[1].field, "pipeline.shufle");
  assert_string_equal(err.details[2].field, "optimizer.learning_rate");
  assert_string_equal(err.details[3].field, "epochs");
  free(text);
}

static void details_stop_at_the_limit_and_the_message_counts_all(void **state) {
  (void)state;
  json_t *root = json_loads(EXAMPLE, 0, NULL);
  for (int i = 0; i < API_MAX_DETAILS + 3; i++) {
    char key[16];
    snprintf(key, sizeof key, "extra_%d", i);
    json_object_set_new(root, key, json_integer(i));
  }
  char *text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse(text, &spec, &err), -1);
  assert_invalid_argument(&err);
  assert_int_equal(err.n_details, API_MAX_DETAILS);
  assert_string_equal(err.message, "job spec is invalid: 11 problems (the first 8 are listed)");
  assert_string_equal(err.details[0].field, "extra_0");
  assert_string_equal(err.details[7].field, "extra_7");
  free(text);
}

static void malformed_json_is_a_400_with_line_and_column(void **state) {
  (void)state;
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse("{\n  \"epochs\": }", &spec, &err), -1);
  assert_invalid_argument(&err);
  assert_int_equal(err.n_details, 0);
  assert_non_null(strstr(err.message, "request body is not valid JSON: "));
  assert_non_null(strstr(err.message, " at line 2 column "));
}

static void trailing_garbage_is_malformed_json(void **state) {
  (void)state;
  char text[sizeof EXAMPLE + 8];
  snprintf(text, sizeof text, "%s}", EXAMPLE);
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse(text, &spec, &err), -1);
  assert_invalid_argument(&err);
  assert_non_null(strstr(err.message, "request body is not valid JSON"));
}

static void only_length_bytes_of_the_body_are_read(void **state) {
  (void)state;
  char text[sizeof EXAMPLE + 8];
  snprintf(text, sizeof text, "%sGARBAGE", EXAMPLE);
  api_job_spec spec;
  api_error err;
  assert_int_equal(api_spec_parse(text, strlen(EXAMPLE), &spec, &err), 0);
  assert_int_equal(spec.epochs, 2);
}

static void body_that_is_not_an_object_is_refused(void **state) {
  (void)state;
  const char *bodies[] = {"[]", "42", "\"spec\"", "null"};
  const char *types[] = {"array", "integer", "string", "null"};
  for (int i = 0; i < 4; i++) {
    api_job_spec spec;
    api_error err;
    assert_int_equal(parse(bodies[i], &spec, &err), -1);
    assert_invalid_argument(&err);
    char want[80];
    snprintf(want, sizeof want, "request body must be a JSON object, got %s", types[i]);
    assert_string_equal(err.message, want);
  }
}

static void empty_body_is_refused(void **state) {
  (void)state;
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse(" \n", &spec, &err), -1);
  assert_invalid_argument(&err);
  assert_non_null(strstr(err.message, "request body is empty"));
  assert_int_equal(api_spec_parse(NULL, 0, &spec, &err), -1);
  assert_invalid_argument(&err);
}

static void duplicate_key_is_refused(void **state) {
  (void)state;
  char text[sizeof EXAMPLE + 16];
  snprintf(text, sizeof text, "{\"epochs\":3,%s", EXAMPLE + 1);
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse(text, &spec, &err), -1);
  assert_invalid_argument(&err);
  assert_non_null(strstr(err.message, "duplicate"));
}

static void more_than_64_layers_are_refused(void **state) {
  (void)state;
  json_t *root = json_loads(EXAMPLE, 0, NULL);
  json_t *layers = json_object_get(json_object_get(root, "model"), "layers");
  while (json_array_size(layers) < API_MAX_LAYERS + 1)
    json_array_insert_new(layers, 1, json_pack("{s:s}", "type", "relu"));
  char *text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse(text, &spec, &err), -1);
  assert_invalid_argument(&err);
  assert_int_equal(err.n_details, 1);
  assert_string_equal(err.details[0].field, "model.layers");
  assert_string_equal(err.details[0].description, "must list 1 to 64 layers, got 65");
  free(text);

  /* Exactly 64 is fine. */
  root = json_loads(EXAMPLE, 0, NULL);
  layers = json_object_get(json_object_get(root, "model"), "layers");
  while (json_array_size(layers) < API_MAX_LAYERS)
    json_array_insert_new(layers, 1, json_pack("{s:s}", "type", "relu"));
  text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  assert_int_equal(parse(text, &spec, &err), 0);
  assert_int_equal(spec.n_layers, 64);
  assert_string_equal(spec.layers[63].name, "dense_63");
  free(text);
}

static void rejected_spec_renders_as_an_error_body(void **state) {
  (void)state;
  char *text = edited("model.layers[1].type", "\"conv3d\"", NULL, NULL);
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse(text, &spec, &err), -1);
  char *body = api_error_to_json(&err);
  assert_string_equal(
      body, "{\"error\":{\"code\":400,\"status\":\"INVALID_ARGUMENT\",\"message\":\"job spec is "
            "invalid: 1 problem\",\"details\":[{\"field\":\"model.layers[1].type\","
            "\"description\":\"unknown layer type 'conv3d'; supported: dense, flatten, "
            "activation, relu, conv2d, depthwise_conv2d, separable_conv2d, batch_norm, dropout, "
            "max_pool2d, avg_pool2d, glob\"}]}}");
  free(body);
  free(text);
}

static void long_unknown_value_is_clipped_in_the_description(void **state) {
  (void)state;
  char *text = edited("loss", "\"" A16 A16 A16 A16 A16 A16 A16 A16 A16 A16 "\"", NULL, NULL);
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse(text, &spec, &err), -1);
  assert_string_equal(err.details[0].field, "loss");
  assert_non_null(strstr(err.details[0].description, "...'"));
  assert_true(strlen(err.details[0].description) < 200);
  free(text);
}

/* ---- canonical JSON ---- */

static void canonical_json_of_the_example_fills_every_default(void **state) {
  (void)state;
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse(EXAMPLE, &spec, &err), 0);
  char *text = api_spec_to_json(&spec);
  assert_string_equal(
      text, "{\"display_name\":\"fmnist-mlp\",\"model\":{\"input_shape\":[28,28,1],\"layers\":["
            "{\"type\":\"flatten\",\"name\":\"flatten_0\"},"
            "{\"type\":\"dense\",\"name\":\"dense_1\",\"units\":256,\"activation\":\"relu\","
            "\"use_bias\":true,\"kernel_initializer\":\"glorot_uniform\","
            "\"bias_initializer\":\"zeros\"},"
            "{\"type\":\"dense\",\"name\":\"dense_2\",\"units\":10,\"activation\":\"linear\","
            "\"use_bias\":true,\"kernel_initializer\":\"glorot_uniform\","
            "\"bias_initializer\":\"zeros\"}]},"
            "\"loss\":\"sparse_categorical_crossentropy\",\"metrics\":[\"accuracy\"],"
            "\"dataset\":{\"name\":\"fashion-mnist\",\"validation\":\"test\"},"
            "\"pipeline\":{\"batch_size\":128,\"shuffle\":true,\"normalize\":true,"
            "\"standardize\":false,\"augment\":[],\"drop_remainder\":false,\"cache\":\"memory\","
            "\"prefetch\":\"auto\",\"num_parallel_calls\":\"auto\",\"one_hot\":false,"
            "\"cast\":\"float32\"},"
            "\"optimizer\":{\"type\":\"adam\",\"learning_rate\":0.001,\"weight_decay\":0.0,"
            "\"beta_1\":0.9,\"beta_2\":0.999,\"epsilon\":1e-7},"
            "\"gradient_accumulation_steps\":1,\"epochs\":2,\"log_every_steps\":50,\"seed\":42,"
            "\"priority\":50,"
            "\"max_restarts\":0,\"max_runtime\":0,"
            "\"resources\":{\"device_type\":\"cpu\",\"devices\":1,\"pool\":\"default\"},"
            "\"precision\":\"float32\",\"recompute\":false,\"allow_tf32\":false,\"strategy\":{"
            "\"type\":\"single\"}}");
  free(text);
}

/* parse(to_json(spec)) must give spec back byte for byte; the target is
 * filled with a pattern first to prove parse clears the whole struct. */
static void assert_round_trip(const char *text) {
  api_job_spec first, second;
  api_error err;
  memset(&first, 0xA5, sizeof first);
  memset(&second, 0x5A, sizeof second);
  assert_int_equal(parse(text, &first, &err), 0);
  char *canonical = api_spec_to_json(&first);
  assert_non_null(canonical);
  if (parse(canonical, &second, &err) != 0)
    fail_msg("canonical form refused: %s: %s", canonical,
             err.n_details ? err.details[0].description : err.message);
  assert_memory_equal(&first, &second, sizeof first);
  char *again = api_spec_to_json(&second);
  assert_string_equal(canonical, again);
  free(again);
  free(canonical);
}

static void canonical_json_parses_back_to_the_same_struct(void **state) {
  (void)state;
  assert_round_trip(EXAMPLE);
  assert_round_trip(MINIMAL);
}

/* A GPU job: its pool defaults to kilnd's "gpu" pool, and a replicated one
 * holds a GPU per replica. */
static void gpu_job_takes_the_gpu_pool_and_a_gpu_per_replica(void **state) {
  (void)state;
  char *text = edited("resources", "{\"device_type\":\"gpu\"}", "strategy",
                      "{\"type\":\"multi_worker\",\"workers\":2,\"replicas_per_worker\":2}");
  api_job_spec spec;
  api_error err;
  if (parse(text, &spec, &err) != 0)
    fail_msg("%s: %s", err.message, err.n_details ? err.details[0].description : "");
  assert_string_equal(spec.device_type, "gpu");
  assert_string_equal(spec.pool, "gpu");
  assert_int_equal(spec.devices, 4);
  assert_round_trip(text);
  free(text);
  text = edited("resources", "{\"device_type\":\"gpu\",\"pool\":\"h100\"}", NULL, NULL);
  assert_int_equal(parse(text, &spec, &err), 0);
  assert_string_equal(spec.pool, "h100"); /* a pool named is the pool taken */
  assert_int_equal(spec.devices, 1);
  free(text);
}

/* Model parallelism: layers name the job's GPUs or the host; "gpu:N"
 * comes back as "cuda:N", and a layer without a device has none. */
static void layer_devices_are_read_and_round_trip(void **state) {
  (void)state;
  json_t *root = json_loads(EXAMPLE, 0, NULL);
  assert_non_null(root);
  edit(root, "resources", "{\"device_type\":\"gpu\",\"devices\":2}");
  edit(root, "model.layers[1].device", "\"gpu:1\"");
  edit(root, "model.layers[2].device", "\"cpu\"");
  char *text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  api_job_spec spec;
  api_error err;
  if (parse(text, &spec, &err) != 0)
    fail_msg("%s: %s", err.message, err.n_details ? err.details[0].description : "");
  assert_int_equal(spec.layers[0].device, 0);
  assert_int_equal(spec.layers[1].device, 2);
  assert_int_equal(spec.layers[2].device, -1);
  char *canonical = api_spec_to_json(&spec);
  assert_non_null(strstr(canonical, "\"device\":\"cuda:1\""));
  assert_non_null(strstr(canonical, "\"device\":\"cpu\""));
  int devices = 0;
  for (const char *at = canonical; (at = strstr(at, "\"device\":")) != NULL; at++) devices++;
  assert_int_equal(devices, 2); /* layer 0 names none */
  free(canonical);
  assert_round_trip(text);
  free(text);
}

static void mixed_precision_and_recompute_are_read_and_round_trip(void **state) {
  (void)state;
  static const char *const policies[] = {"\"mixed_bfloat16\"", "\"mixed_float16\"", "\"float32\""};
  for (int i = 0; i < 3; i++) {
    char *text = edited("precision", policies[i], "recompute", i == 2 ? "false" : "true");
    api_job_spec spec;
    api_error err;
    if (parse(text, &spec, &err) != 0)
      fail_msg("%s: %s", err.message, err.n_details ? err.details[0].description : "");
    char want[32];
    snprintf(want, sizeof want, "%.*s", (int)strlen(policies[i]) - 2, policies[i] + 1);
    assert_string_equal(spec.precision, want);
    assert_int_equal(spec.recompute, i != 2);
    char *canonical = api_spec_to_json(&spec);
    char needle[96];
    snprintf(needle, sizeof needle, "\"precision\":%s,\"recompute\":%s", policies[i],
             i == 2 ? "false" : "true");
    assert_non_null(strstr(canonical, needle));
    free(canonical);
    assert_round_trip(text);
    free(text);
  }
}

static void shard_datasets_are_read_with_feature_defaults_and_round_trip(void **state) {
  (void)state;
  char *text = edited("dataset", "{\"name\":\"fmnist-tfr\",\"format\":\"tfrecord\"}", NULL, NULL);
  api_job_spec spec;
  api_error err;
  if (parse(text, &spec, &err) != 0)
    fail_msg("%s: %s", err.message, err.n_details ? err.details[0].description : "");
  assert_int_equal(spec.shards_format, API_SHARDS_TFRECORD);
  assert_string_equal(spec.dataset, "fmnist-tfr");
  assert_string_equal(spec.image_feature, "image/encoded");
  assert_string_equal(spec.label_feature, "image/class/label");
  assert_string_equal(spec.validation, "none");
  assert_round_trip(text);
  free(text);
  text = edited("dataset",
                "{\"name\":\"fashion-mnist\",\"format\":\"tar\",\"validation\":\"test\","
                "\"features\":{\"image\":\"jpg\"}}",
                NULL, NULL);
  assert_int_equal(parse(text, &spec, &err), 0);
  assert_int_equal(spec.shards_format, API_SHARDS_TAR);
  assert_string_equal(spec.image_feature, "jpg");
  assert_string_equal(spec.label_feature, "cls");
  assert_string_equal(spec.validation, "test");
  assert_round_trip(text);
  free(text);
}

static void every_pipeline_option_is_read_and_round_trips(void **state) {
  (void)state;
  char *text = edited("pipeline",
                      "{\"batch_size\":64,\"shuffle_buffer\":10000,\"normalize\":true,"
                      "\"standardize\":{\"mean\":[0.2860],\"std\":[0.3530]},"
                      "\"augment\":[{\"type\":\"random_brightness\",\"max_delta\":0.1},"
                      "\"flip_left_right\",{\"type\":\"random_crop\"}],"
                      "\"cache\":\"file\",\"prefetch\":4,\"num_parallel_calls\":2,"
                      "\"take\":50000,\"skip\":100,\"interleave\":{\"cycle_length\":4}}",
                      "dataset", "{\"name\":\"ds-0123456789abcdef\",\"validation_split\":0.1}");
  api_job_spec spec;
  api_error err;
  if (parse(text, &spec, &err) != 0)
    fail_msg("%s: %s", err.message, err.n_details ? err.details[0].description : "");
  assert_int_equal(spec.shuffle_buffer, 10000);
  assert_int_equal(spec.n_standardize, 1);
  assert_true(spec.standardize_mean[0] == 0.2860 && spec.standardize_std[0] == 0.3530);
  assert_int_equal(spec.augment,
                   API_AUG_FLIP_LEFT_RIGHT | API_AUG_RANDOM_CROP | API_AUG_RANDOM_BRIGHTNESS);
  assert_int_equal(spec.crop_padding, 4);
  assert_true(spec.brightness_delta == 0.1);
  assert_int_equal(spec.cache_file, 1);
  assert_int_equal(spec.prefetch, 4);
  assert_int_equal(spec.num_parallel_calls, 2);
  assert_int_equal(spec.take, 50000);
  assert_int_equal(spec.skip, 100);
  assert_int_equal(spec.interleave_cycle_length, 4);
  assert_int_equal(spec.interleave_block_length, 1);
  assert_string_equal(spec.dataset, "ds-0123456789abcdef");
  assert_string_equal(spec.validation, "split");
  assert_true(spec.validation_split == 0.1);
  assert_round_trip(text);
  free(text);
  /* An upload has no test split: its default validation is none. */
  text = edited("dataset.name", "\"ds-0123456789abcdef\"", "dataset.validation", DELETE);
  assert_int_equal(parse(text, &spec, &err), 0);
  assert_string_equal(spec.validation, "none");
  assert_int_equal(spec.prefetch, API_AUTO);
  free(text);
}

static void awkward_doubles_round_trip_exactly(void **state) {
  (void)state;
  char *text = edited("optimizer.learning_rate", "0.30000000000000004", "optimizer.epsilon",
                      "1.2345678901234567e-300");
  assert_round_trip(text);
  free(text);
  text = edited("optimizer",
                "{\"type\":\"sgd\",\"learning_rate\":0.1,\"momentum\":0.95,"
                "\"nesterov\":true}",
                NULL, NULL);
  assert_round_trip(text);
  free(text);
  text = edited("optimizer.beta_2", "0.99999999999999989", "optimizer.learning_rate", "10");
  assert_round_trip(text);
  free(text);
}

static void named_and_activation_layers_round_trip(void **state) {
  (void)state;
  char *text = edited("model.layers[1]", "{\"type\":\"relu\",\"name\":\"r\"}", "model.layers[2]",
                      "{\"type\":\"activation\",\"activation\":\"relu\"}");
  json_t *root = json_loads(text, 0, NULL);
  free(text);
  edit(root, "model.layers[3]",
       "{\"type\":\"dense\",\"units\":12,\"use_bias\":false,\"activation\":\"softmax\"}");
  text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  assert_round_trip(text);
  free(text);
}

static void largest_seed_round_trips(void **state) {
  (void)state;
  char *text = edited("seed", "9223372036854775807", NULL, NULL);
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse(text, &spec, &err), 0);
  assert_true(spec.seed == 9223372036854775807ULL);
  assert_round_trip(text);
  free(text);
}

static void spec_without_seed_has_none_after_round_trip(void **state) {
  (void)state;
  char *text = edited("seed", DELETE, NULL, NULL);
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse(text, &spec, &err), 0);
  char *canonical = api_spec_to_json(&spec);
  assert_null(strstr(canonical, "\"seed\""));
  assert_round_trip(text);
  free(canonical);
  free(text);
}

static void to_json_refuses_what_json_cannot_carry(void **state) {
  (void)state;
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse(EXAMPLE, &spec, &err), 0);
  spec.seed = UINT64_MAX;
  assert_null(api_spec_to_json(&spec));
  spec.seed = 1;
  spec.n_layers = API_MAX_LAYERS + 1;
  assert_null(api_spec_to_json(&spec));
  spec.n_layers = 3;
  spec.optimizer = (api_optimizer_type)7;
  assert_null(api_spec_to_json(&spec));
  assert_null(api_spec_to_json(NULL));
}

static void regression_spec_reads_keras_names_and_aliases(void **state) {
  (void)state;
  /* A regression on an upload: one unit, mse as the loss, both metrics. */
  char *text = edited("loss", "\"mse\"", "metrics", "[\"mae\",\"mean_squared_error\"]");
  json_t *root = json_loads(text, 0, NULL);
  free(text);
  edit(root, "model.layers[2].units", "1");
  edit(root, "dataset", "{\"name\":\"ds-0123456789abcdef\",\"validation_split\":0.2}");
  text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  api_job_spec spec;
  api_error err;
  if (parse(text, &spec, &err) != 0)
    fail_msg("%s: %s: %s", err.message, err.n_details ? err.details[0].field : "",
             err.n_details ? err.details[0].description : "");
  assert_string_equal(spec.loss, "mean_squared_error");
  assert_int_equal(spec.loss_type, API_LOSS_MEAN_SQUARED_ERROR);
  assert_int_equal(spec.metrics, API_METRIC_MSE | API_METRIC_MAE);
  assert_int_equal(spec.metric_accuracy, 0);
  assert_int_equal(spec.n_outputs, 1);
  assert_true(api_loss_is_regression(spec.loss_type));
  assert_round_trip(text);
  free(text);
  /* categorical_crossentropy with one-hot labels, cast and shard. */
  text = edited("loss", "\"categorical_crossentropy\"", "pipeline",
                "{\"one_hot\":true,\"cast\":\"bfloat16\",\"shard\":{\"num_shards\":3,"
                "\"index\":2}}");
  if (parse(text, &spec, &err) != 0)
    fail_msg("%s: %s: %s", err.message, err.n_details ? err.details[0].field : "",
             err.n_details ? err.details[0].description : "");
  assert_int_equal(spec.loss_type, API_LOSS_CATEGORICAL_CROSSENTROPY);
  assert_int_equal(spec.one_hot, 1);
  assert_int_equal(spec.cast, API_CAST_BFLOAT16);
  assert_int_equal(spec.num_shards, 3);
  assert_int_equal(spec.shard_index, 2);
  assert_int_equal(spec.metrics, API_METRIC_ACCURACY);
  assert_false(api_loss_is_regression(spec.loss_type));
  assert_round_trip(text);
  free(text);
  /* mae is mean_absolute_error; binary_crossentropy with one unit on an upload. */
  text = edited("loss", "\"mae\"", "metrics", "[]");
  root = json_loads(text, 0, NULL);
  free(text);
  edit(root, "model.layers[2].units", "1");
  edit(root, "dataset.name", "\"ds-0123456789abcdef\"");
  text = json_dumps(root, JSON_COMPACT);
  assert_int_equal(parse(text, &spec, &err), 0);
  assert_string_equal(spec.loss, "mean_absolute_error");
  assert_int_equal(spec.metrics, 0);
  free(text);
  /* One-hot rows are no regression target. */
  edit(root, "pipeline.one_hot", "true");
  text = json_dumps(root, JSON_COMPACT);
  assert_int_equal(parse(text, &spec, &err), -1);
  assert_int_equal(err.n_details, 1);
  assert_string_equal(err.details[0].field, "pipeline.one_hot");
  assert_non_null(strstr(err.details[0].description,
                         "mean_absolute_error reads numeric labels, not one-hot rows"));
  free(text);
  edit(root, "pipeline.one_hot", "false");
  edit(root, "loss", "\"binary_crossentropy\"");
  edit(root, "metrics", "[\"accuracy\"]");
  text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  assert_int_equal(parse(text, &spec, &err), 0);
  assert_int_equal(spec.loss_type, API_LOSS_BINARY_CROSSENTROPY);
  assert_int_equal(spec.num_shards, 1);
  assert_int_equal(spec.cast, API_CAST_FLOAT32);
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(example_parses_with_its_fields_and_defaults),
      cmocka_unit_test(minimal_spec_gets_every_default),
      cmocka_unit_test(adam_learning_rate_defaults_to_0_001),
      cmocka_unit_test(integers_written_as_2_0_are_accepted),
      cmocka_unit_test(every_option_given_explicitly_is_kept),
      cmocka_unit_test(all_violations_are_reported_not_just_the_first),
      cmocka_unit_test(details_stop_at_the_limit_and_the_message_counts_all),
      cmocka_unit_test(malformed_json_is_a_400_with_line_and_column),
      cmocka_unit_test(trailing_garbage_is_malformed_json),
      cmocka_unit_test(only_length_bytes_of_the_body_are_read),
      cmocka_unit_test(body_that_is_not_an_object_is_refused),
      cmocka_unit_test(empty_body_is_refused),
      cmocka_unit_test(duplicate_key_is_refused),
      cmocka_unit_test(more_than_64_layers_are_refused),
      cmocka_unit_test(rejected_spec_renders_as_an_error_body),
      cmocka_unit_test(long_unknown_value_is_clipped_in_the_description),
      cmocka_unit_test(canonical_json_of_the_example_fills_every_default),
      cmocka_unit_test(canonical_json_parses_back_to_the_same_struct),
      cmocka_unit_test(layer_devices_are_read_and_round_trip),
      cmocka_unit_test(mixed_precision_and_recompute_are_read_and_round_trip),
      cmocka_unit_test(gpu_job_takes_the_gpu_pool_and_a_gpu_per_replica),
      cmocka_unit_test(every_pipeline_option_is_read_and_round_trips),
      cmocka_unit_test(shard_datasets_are_read_with_feature_defaults_and_round_trip),
      cmocka_unit_test(regression_spec_reads_keras_names_and_aliases),
      cmocka_unit_test(awkward_doubles_round_trip_exactly),
      cmocka_unit_test(named_and_activation_layers_round_trip),
      cmocka_unit_test(largest_seed_round_trips),
      cmocka_unit_test(spec_without_seed_has_none_after_round_trip),
      cmocka_unit_test(to_json_refuses_what_json_cannot_carry),
  };
  int failed = cmocka_run_group_tests_name("spec", tests, NULL, NULL);
  failed += cmocka_run_group_tests_name("spec_rules", rules, NULL, NULL);
  return failed;
}
