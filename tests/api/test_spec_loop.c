/* The spec's training-loop options: gradient_accumulation_steps,
 * optimizer.global_clipnorm and optimizer.schedule, callbacks
 * (early_stopping, reduce_lr_on_plateau), validation_every_steps and
 * top_k_accuracy; their defaults, their errors by field path, and their
 * round trip through the canonical form. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api.h"

/* A small valid spec with extra top-level members and optimizer members
 * spliced in (each "" or text starting with a comma). The parser refuses
 * duplicate keys, so a top that names "metrics" or "dataset" replaces the
 * base's. */
static int parse_with(const char *top, const char *optimizer, api_job_spec *spec, api_error *err) {
  char text[4096];
  snprintf(text, sizeof text,
           "{\"model\":{\"input_shape\":[784],\"layers\":[{\"type\":\"dense\",\"units\":10}]},"
           "\"loss\":\"sparse_categorical_crossentropy\",%s%s"
           "\"optimizer\":{\"type\":\"sgd\"%s}%s}",
           strstr(top, "\"metrics\"") ? "" : "\"metrics\":[\"accuracy\"],",
           strstr(top, "\"dataset\"") ? "" : "\"dataset\":{\"name\":\"fashion-mnist\"},", optimizer,
           top);
  memset(err, 0, sizeof *err);
  memset(spec, 0x5A, sizeof *spec);
  return api_spec_parse(text, strlen(text), spec, err);
}

static void parse_ok(const char *top, const char *optimizer, api_job_spec *spec) {
  api_error err;
  if (parse_with(top, optimizer, spec, &err) != 0)
    fail_msg("%s%s: %s: %s", top, optimizer, err.details[0].field, err.details[0].description);
}

/* to_json then parse gives the same struct, byte for byte. */
static char *round_trip(const api_job_spec *spec) {
  char *text = api_spec_to_json(spec);
  assert_non_null(text);
  api_job_spec again;
  api_error err;
  memset(&again, 0xA5, sizeof again);
  if (api_spec_parse(text, strlen(text), &again, &err) != 0)
    fail_msg("%s: %s: %s", text, err.details[0].field, err.details[0].description);
  assert_memory_equal(spec, &again, sizeof again);
  return text;
}

static void defaults_are_one_batch_per_step_and_no_callbacks(void **state) {
  (void)state;
  api_job_spec spec;
  parse_ok("", "", &spec);
  assert_int_equal(spec.accumulation_steps, 1);
  assert_true(spec.global_clipnorm == 0);
  assert_int_equal(spec.schedule.type, API_SCHEDULE_CONSTANT);
  assert_int_equal(spec.early_stopping.enabled, 0);
  assert_int_equal(spec.plateau.enabled, 0);
  assert_int_equal(spec.validation_every_steps, 0);
  char *text = round_trip(&spec);
  assert_non_null(strstr(text, "\"gradient_accumulation_steps\":1"));
  assert_null(strstr(text, "callbacks"));
  assert_null(strstr(text, "schedule"));
  free(text);
}

static void every_loop_option_is_read_and_round_trips(void **state) {
  (void)state;
  api_job_spec spec;
  parse_ok(",\"gradient_accumulation_steps\":4,\"validation_every_steps\":100,"
           "\"metrics\":[\"accuracy\",{\"type\":\"top_k_accuracy\",\"k\":3}],"
           "\"callbacks\":{\"early_stopping\":{\"monitor\":\"val_accuracy\",\"patience\":3,"
           "\"min_delta\":0.001}}",
           ",\"global_clipnorm\":1.5,\"schedule\":{\"type\":\"cosine\",\"decay_steps\":1000,"
           "\"alpha\":0.05,\"warmup_steps\":100}",
           &spec);
  assert_int_equal(spec.accumulation_steps, 4);
  assert_int_equal(spec.validation_every_steps, 100);
  assert_true(spec.metrics & API_METRIC_TOP_K);
  assert_int_equal(spec.top_k, 3);
  assert_true(spec.global_clipnorm == 1.5);
  assert_int_equal(spec.schedule.type, API_SCHEDULE_COSINE);
  assert_int_equal(spec.schedule.decay_steps, 1000);
  assert_int_equal(spec.schedule.warmup_steps, 100);
  assert_true(spec.schedule.alpha == 0.05);
  assert_int_equal(spec.early_stopping.enabled, 1);
  assert_string_equal(spec.early_stopping.monitor, "val_accuracy");
  assert_int_equal(spec.early_stopping.mode_max, 1); /* auto: an accuracy */
  assert_int_equal(spec.early_stopping.patience, 3);
  char *text = round_trip(&spec);
  assert_non_null(strstr(text, "{\"type\":\"top_k_accuracy\",\"k\":3}"));
  free(text);

  /* Keras's plateau defaults, "loss" read as the epoch's mean loss. */
  parse_ok(",\"callbacks\":{\"reduce_lr_on_plateau\":{\"monitor\":\"loss\"}}", "", &spec);
  assert_string_equal(spec.plateau.monitor, "epoch_loss");
  assert_int_equal(spec.plateau.mode_max, 0);
  assert_int_equal(spec.plateau.patience, 10);
  assert_true(spec.plateau.factor == 0.1);
  assert_true(spec.plateau.min_delta == 1e-4);
  free(round_trip(&spec));

  /* Each schedule type keeps its own options. */
  parse_ok("", ",\"schedule\":{\"type\":\"step\",\"step_size\":30}", &spec);
  assert_true(spec.schedule.gamma == 0.1);
  free(round_trip(&spec));
  parse_ok("",
           ",\"schedule\":{\"type\":\"exponential\",\"decay_steps\":10,\"decay_rate\":0.9,"
           "\"staircase\":true}",
           &spec);
  assert_int_equal(spec.schedule.staircase, 1);
  free(round_trip(&spec));
  parse_ok("", ",\"schedule\":{\"type\":\"constant\",\"warmup_steps\":50}", &spec);
  free(round_trip(&spec));
  parse_ok(",\"profile\":{\"steps\":[10,20]}", "", &spec);
  assert_int_equal(spec.profile_first, 10);
  assert_int_equal(spec.profile_last, 20);
  free(round_trip(&spec));
}

static void bad_loop_options_are_refused_by_path(void **state) {
  (void)state;
  static const struct {
    const char *top, *optimizer, *field, *words;
  } cases[] = {
      {",\"gradient_accumulation_steps\":0", "", "gradient_accumulation_steps", "between 1 and"},
      {",\"gradient_accumulation_steps\":2.5", "", "gradient_accumulation_steps", "integer"},
      {"", ",\"global_clipnorm\":0", "optimizer.global_clipnorm", "must be > 0"},
      {"", ",\"global_clipnorm\":\"big\"", "optimizer.global_clipnorm", "number"},
      {"", ",\"schedule\":{\"type\":\"linear\"}", "optimizer.schedule.type", "unknown schedule"},
      {"", ",\"schedule\":{\"type\":\"step\"}", "optimizer.schedule.step_size", "required"},
      {"", ",\"schedule\":{\"type\":\"step\",\"step_size\":5,\"alpha\":0.1}",
       "optimizer.schedule.alpha", "unknown field"},
      {"", ",\"schedule\":{\"type\":\"exponential\",\"decay_steps\":5,\"decay_rate\":1.5}",
       "optimizer.schedule.decay_rate", "<= 1"},
      {"", ",\"schedule\":{\"type\":\"cosine\",\"decay_steps\":0}",
       "optimizer.schedule.decay_steps", "between 1 and"},
      {",\"callbacks\":{\"early_stopping\":{\"monitor\":\"val_mae\"}}", "",
       "callbacks.early_stopping.monitor", "add 'mae' to metrics"},
      {",\"callbacks\":{\"early_stopping\":{\"monitor\":\"f1\"}}", "",
       "callbacks.early_stopping.monitor", "unknown metric"},
      {",\"callbacks\":{\"early_stopping\":{\"mode\":\"best\"}}", "",
       "callbacks.early_stopping.mode", "unknown mode"},
      {",\"callbacks\":{\"early_stopping\":{\"patience\":-1}}", "",
       "callbacks.early_stopping.patience", "between 0 and"},
      {",\"callbacks\":{\"early_stopping\":{\"factor\":0.5}}", "",
       "callbacks.early_stopping.factor", "unknown"},
      {",\"callbacks\":{\"reduce_lr_on_plateau\":{\"factor\":1}}", "",
       "callbacks.reduce_lr_on_plateau.factor", "< 1"},
      {",\"callbacks\":{\"reduce_lr_on_plateau\":{}}",
       ",\"schedule\":{\"type\":\"step\",\"step_size\":5}", "callbacks.reduce_lr_on_plateau",
       "cannot be combined"},
      {",\"callbacks\":{\"model_checkpoint\":{}}", "", "callbacks.model_checkpoint", "unknown"},
      {",\"dataset\":{\"name\":\"fashion-mnist\",\"validation\":\"none\"},"
       "\"callbacks\":{\"early_stopping\":{}}",
       "", "callbacks.early_stopping.monitor", "needs validation data"},
      {",\"dataset\":{\"name\":\"fashion-mnist\",\"validation\":\"none\"},"
       "\"validation_every_steps\":10",
       "", "validation_every_steps", "needs validation data"},
      {",\"metrics\":[{\"type\":\"top_k_accuracy\",\"k\":0}]", "", "metrics[0].k", "between 1 and"},
      {",\"metrics\":[{\"type\":\"accuracy\",\"k\":2}]", "", "metrics[0].type",
       "only top_k_accuracy"},
      {",\"profile\":{\"steps\":[5]}", "", "profile.steps", "[first, last]"},
      {",\"profile\":{\"steps\":[0,3]}", "", "profile.steps", "1 <= first <= last"},
      {",\"profile\":{\"steps\":[9,3]}", "", "profile.steps", "1 <= first <= last"},
      {",\"profile\":{\"steps\":[1,5000]}", "", "profile.steps", "at most 1000 steps"},
      {",\"profile\":{\"every\":3}", "", "profile.every", "unknown"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    api_job_spec spec;
    api_error err;
    int rc = parse_with(cases[i].top, cases[i].optimizer, &spec, &err);
    assert_int_equal(rc, -1);
    assert_int_equal(err.http, 400);
    int found = 0;
    for (int d = 0; d < err.n_details; d++)
      found |= strcmp(err.details[d].field, cases[i].field) == 0 &&
               strstr(err.details[d].description, cases[i].words) != NULL;
    if (!found)
      fail_msg("case %zu: want %s '%s', got %s: %s", i, cases[i].field, cases[i].words,
               err.n_details ? err.details[0].field : "-",
               err.n_details ? err.details[0].description : err.message);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(defaults_are_one_batch_per_step_and_no_callbacks),
      cmocka_unit_test(every_loop_option_is_read_and_round_trips),
      cmocka_unit_test(bad_loop_options_are_refused_by_path),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
