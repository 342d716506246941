/* test_error.c — the error model (api_error_set / add_detail / to_json, the
 * exact body clients see) and the job state names. */
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

static void error_body_without_details_has_an_empty_details_array(void **state) {
  (void)state;
  api_error err;
  assert_int_equal(api_error_set(&err, 404, "NOT_FOUND", "job %s not found", "j-42"), -1);
  char *body = api_error_to_json(&err);
  assert_string_equal(body, "{\"error\":{\"code\":404,\"status\":\"NOT_FOUND\",\"message\":\"job "
                            "j-42 not found\",\"details\":[]}}");
  free(body);
}

static void error_body_lists_details_in_order(void **state) {
  (void)state;
  api_error err;
  api_error_set(&err, 400, "INVALID_ARGUMENT", "job spec is invalid: %d problems", 2);
  api_error_add_detail(&err, "model.layers[1].type", "unknown layer type '%s'", "conv3d");
  api_error_add_detail(&err, "epochs", "must be between %d and %d, got %d", 1, 10000, 0);
  char *body = api_error_to_json(&err);
  assert_string_equal(body, "{\"error\":{\"code\":400,\"status\":\"INVALID_ARGUMENT\","
                            "\"message\":\"job spec is invalid: 2 problems\",\"details\":["
                            "{\"field\":\"model.layers[1].type\","
                            "\"description\":\"unknown layer type 'conv3d'\"},"
                            "{\"field\":\"epochs\","
                            "\"description\":\"must be between 1 and 10000, got 0\"}]}}");
  free(body);
}

static void error_body_escapes_quotes_backslashes_and_control_characters(void **state) {
  (void)state;
  api_error err;
  api_error_set(&err, 400, "INVALID_ARGUMENT", "bad \"name\"\\path\n\ttab\x01");
  api_error_add_detail(&err, "a\"b", "%s", "</script>");
  char *body = api_error_to_json(&err);
  assert_string_equal(body, "{\"error\":{\"code\":400,\"status\":\"INVALID_ARGUMENT\",\"message\":"
                            "\"bad \\\"name\\\"\\\\path\\n\\ttab\\u0001\",\"details\":[{\"field\":"
                            "\"a\\\"b\",\"description\":\"</script>\"}]}}");
  /* And it is JSON a client can read back. */
  json_error_t jerr;
  json_t *root = json_loads(body, 0, &jerr);
  assert_non_null(root);
  assert_string_equal(json_string_value(json_object_get(json_object_get(root, "error"), "message")),
                      "bad \"name\"\\path\n\ttab\x01");
  json_decref(root);
  free(body);
}

static void set_clears_earlier_details(void **state) {
  (void)state;
  api_error err;
  api_error_set(&err, 400, "INVALID_ARGUMENT", "first");
  api_error_add_detail(&err, "f", "d");
  assert_int_equal(err.n_details, 1);
  api_error_set(&err, 409, "ALREADY_EXISTS", "second");
  assert_int_equal(err.n_details, 0);
  assert_int_equal(err.http, 409);
  assert_string_equal(err.status, "ALREADY_EXISTS");
  assert_string_equal(err.message, "second");
}

static void details_past_the_limit_are_dropped(void **state) {
  (void)state;
  api_error err;
  api_error_set(&err, 400, "INVALID_ARGUMENT", "many");
  for (int i = 0; i < API_MAX_DETAILS + 5; i++) api_error_add_detail(&err, "f", "problem %d", i);
  assert_int_equal(err.n_details, API_MAX_DETAILS);
  assert_string_equal(err.details[API_MAX_DETAILS - 1].description, "problem 7");
  char *body = api_error_to_json(&err);
  json_t *root = json_loads(body, 0, NULL);
  json_t *details = json_object_get(json_object_get(root, "error"), "details");
  assert_int_equal(json_array_size(details), API_MAX_DETAILS);
  json_decref(root);
  free(body);
}

static void long_message_is_cut_on_a_character_boundary(void **state) {
  (void)state;
  /* 300 two-byte characters: 600 bytes into a 512-byte message. */
  char text[601];
  for (int i = 0; i < 300; i++) memcpy(text + 2 * i, "\xc3\xa9", 2); /* é */
  text[600] = '\0';
  api_error err;
  api_error_set(&err, 400, "INVALID_ARGUMENT", "%s", text);
  assert_int_equal(strlen(err.message), 510);
  api_error_add_detail(&err, "f", "%s", text); /* 255 bytes would end inside a character */
  assert_int_equal(strlen(err.details[0].description), 254);
  char *body = api_error_to_json(&err);
  json_t *root = json_loads(body, 0, NULL);
  assert_non_null(root);
  json_t *error = json_object_get(root, "error");
  assert_int_equal(json_string_length(json_object_get(error, "message")), 510);
  json_decref(root);
  free(body);
}

static void invalid_utf8_from_a_caller_still_renders(void **state) {
  (void)state;
  api_error err;
  api_error_set(&err, 500, "INTERNAL", "bad byte \xff here \xed\xa0\x80 end \xc3");
  char *body = api_error_to_json(&err);
  assert_non_null(body);
  json_t *root = json_loads(body, 0, NULL);
  assert_non_null(root);
  assert_string_equal(json_string_value(json_object_get(json_object_get(root, "error"), "message")),
                      "bad byte ? here ??? end ?");
  json_decref(root);
  free(body);
}

static void missing_status_renders_as_unknown(void **state) {
  (void)state;
  api_error err;
  memset(&err, 0, sizeof err);
  err.http = 500;
  char *body = api_error_to_json(&err);
  assert_string_equal(body, "{\"error\":{\"code\":500,\"status\":\"UNKNOWN\",\"message\":\"\","
                            "\"details\":[]}}");
  free(body);
  assert_null(api_error_to_json(NULL));
}

static void null_error_is_tolerated(void **state) {
  (void)state;
  assert_int_equal(api_error_set(NULL, 400, "INVALID_ARGUMENT", "x"), -1);
  api_error_add_detail(NULL, "f", "d");
}

/* ---- job states ---- */

static void every_state_name_parses_back_to_its_state(void **state) {
  (void)state;
  const char *names[] = {"QUEUED",    "STARTING", "RUNNING",   "STOPPING",
                         "SUCCEEDED", "FAILED",   "CANCELLED", "PREEMPTED"};
  assert_int_equal(sizeof names / sizeof names[0], API_JOB_STATE_COUNT);
  for (int s = 0; s < API_JOB_STATE_COUNT; s++) {
    assert_string_equal(api_job_state_name((api_job_state)s), names[s]);
    assert_int_equal(api_job_state_parse(names[s]), s);
  }
}

static void unknown_state_name_is_minus_one(void **state) {
  (void)state;
  assert_int_equal(api_job_state_parse("running"), -1);
  assert_int_equal(api_job_state_parse("DONE"), -1);
  assert_int_equal(api_job_state_parse(""), -1);
  assert_int_equal(api_job_state_parse(NULL), -1);
  assert_string_equal(api_job_state_name(API_JOB_STATE_COUNT), "UNKNOWN");
  assert_string_equal(api_job_state_name((api_job_state)-1), "UNKNOWN");
}

static void only_succeeded_failed_and_cancelled_are_terminal(void **state) {
  (void)state;
  for (int s = 0; s < API_JOB_STATE_COUNT; s++) {
    int want = s == API_JOB_SUCCEEDED || s == API_JOB_FAILED || s == API_JOB_CANCELLED;
    assert_int_equal(api_job_state_is_terminal((api_job_state)s), want);
  }
  assert_false(api_job_state_is_terminal(API_JOB_PREEMPTED)); /* it goes back to QUEUED */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(error_body_without_details_has_an_empty_details_array),
      cmocka_unit_test(error_body_lists_details_in_order),
      cmocka_unit_test(error_body_escapes_quotes_backslashes_and_control_characters),
      cmocka_unit_test(set_clears_earlier_details),
      cmocka_unit_test(details_past_the_limit_are_dropped),
      cmocka_unit_test(long_message_is_cut_on_a_character_boundary),
      cmocka_unit_test(invalid_utf8_from_a_caller_still_renders),
      cmocka_unit_test(missing_status_renders_as_unknown),
      cmocka_unit_test(null_error_is_tolerated),
      cmocka_unit_test(every_state_name_parses_back_to_its_state),
      cmocka_unit_test(unknown_state_name_is_minus_one),
      cmocka_unit_test(only_succeeded_failed_and_cancelled_are_terminal),
  };
  return cmocka_run_group_tests_name("error", tests, NULL, NULL);
}
