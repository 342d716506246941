/* The spec's checkpoint section: every_steps and keep_last, their defaults,
 * their range errors by field path, and their round trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api.h"

static int parse_with(const char *checkpoint, api_job_spec *spec, api_error *err) {
  char text[2048];
  snprintf(text, sizeof text,
           "{\"model\":{\"input_shape\":[784],\"layers\":[{\"type\":\"dense\",\"units\":10}]},"
           "\"loss\":\"sparse_categorical_crossentropy\",\"metrics\":[\"accuracy\"],"
           "\"dataset\":{\"name\":\"fashion-mnist\"},"
           "\"optimizer\":{\"type\":\"sgd\"}%s%s}",
           checkpoint ? ",\"checkpoint\":" : "", checkpoint ? checkpoint : "");
  memset(err, 0, sizeof *err);
  memset(spec, 0x5A, sizeof *spec);
  return api_spec_parse(text, strlen(text), spec, err);
}

static void checkpoint_section_is_read_and_round_trips(void **state) {
  (void)state;
  api_job_spec spec, again;
  api_error err;
  if (parse_with("{\"every_steps\":500,\"keep_last\":3}", &spec, &err) != 0)
    fail_msg("%s: %s", err.message, err.n_details ? err.details[0].description : "");
  assert_int_equal(spec.checkpoint_every_steps, 500);
  assert_int_equal(spec.checkpoint_keep_last, 3);
  char *canonical = api_spec_to_json(&spec);
  assert_non_null(canonical);
  assert_non_null(strstr(canonical, "\"checkpoint\":{\"every_steps\":500,\"keep_last\":3}"));
  memset(&again, 0xA5, sizeof again);
  assert_int_equal(api_spec_parse(canonical, strlen(canonical), &again, &err), 0);
  assert_int_equal(again.checkpoint_every_steps, 500);
  assert_int_equal(again.checkpoint_keep_last, 3);
  free(canonical);
}

static void keep_best_reads_monitor_and_mode_the_keras_way(void **state) {
  (void)state;
  api_job_spec spec, again;
  api_error err;
  /* mode auto: an accuracy is better higher, anything else lower. */
  assert_int_equal(parse_with("{\"keep_best\":2,\"monitor\":\"val_accuracy\"}", &spec, &err), 0);
  assert_int_equal(spec.checkpoint_keep_best, 2);
  assert_string_equal(spec.checkpoint_monitor, "val_accuracy");
  assert_int_equal(spec.checkpoint_mode_max, 1);
  assert_int_equal(parse_with("{\"keep_best\":1}", &spec, &err), 0);
  assert_string_equal(spec.checkpoint_monitor, "val_loss");
  assert_int_equal(spec.checkpoint_mode_max, 0);
  assert_int_equal(
      parse_with("{\"keep_last\":1,\"keep_best\":3,\"monitor\":\"loss\",\"mode\":\"max\"}", &spec,
                 &err),
      0);
  assert_int_equal(spec.checkpoint_mode_max, 1);
  char *canonical = api_spec_to_json(&spec);
  assert_non_null(strstr(canonical, "\"checkpoint\":{\"keep_last\":1,\"keep_best\":3,"
                                    "\"monitor\":\"loss\",\"mode\":\"max\"}"));
  assert_int_equal(api_spec_parse(canonical, strlen(canonical), &again, &err), 0);
  assert_int_equal(again.checkpoint_keep_best, 3);
  assert_int_equal(again.checkpoint_mode_max, 1);
  free(canonical);
}

static void without_a_checkpoint_section_only_the_final_one_is_written_and_all_kept(void **state) {
  (void)state;
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse_with(NULL, &spec, &err), 0);
  assert_int_equal(spec.checkpoint_every_steps, 0);
  assert_int_equal(spec.checkpoint_keep_last, 0);
  char *canonical = api_spec_to_json(&spec);
  assert_null(strstr(canonical, "checkpoint"));
  free(canonical);
}

static void bad_checkpoint_fields_are_refused_by_path(void **state) {
  (void)state;
  static const struct {
    const char *section, *field, *words;
  } cases[] = {
      {"{\"every_steps\":0}", "checkpoint.every_steps", "between 1 and"},
      {"{\"every_steps\":\"often\"}", "checkpoint.every_steps", "integer"},
      {"{\"keep_last\":0}", "checkpoint.keep_last", "between 1 and"},
      {"{\"keep_best\":0}", "checkpoint.keep_best", "between 1 and"},
      {"{\"keep_best\":1,\"monitor\":\"val_f1\"}", "checkpoint.monitor", "'val_f1' is not"},
      {"{\"keep_best\":1,\"mode\":\"lowest\"}", "checkpoint.mode", "min, max or auto"},
      {"{\"monitor\":\"loss\"}", "checkpoint.monitor", "set keep_best too"},
      {"{\"keep_last\":2,\"save_best\":1}", "checkpoint.save_best", "unknown"},
      {"5", "checkpoint", "object"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    api_job_spec spec;
    api_error err;
    assert_int_equal(parse_with(cases[i].section, &spec, &err), -1);
    assert_int_equal(err.http, 400);
    assert_true(err.n_details >= 1);
    if (strcmp(err.details[0].field, cases[i].field) != 0 ||
        !strstr(err.details[0].description, cases[i].words))
      fail_msg("%s: got %s: %s", cases[i].section, err.details[0].field,
               err.details[0].description);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(checkpoint_section_is_read_and_round_trips),
      cmocka_unit_test(without_a_checkpoint_section_only_the_final_one_is_written_and_all_kept),
      cmocka_unit_test(bad_checkpoint_fields_are_refused_by_path),
      cmocka_unit_test(keep_best_reads_monitor_and_mode_the_keras_way),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
