/* test_progress.c — progress lines from kiln-train: each kind parses into
 * the right fields, format(parse(line)) gives the line back, and every kind
 * of bad line is refused with a sentence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"

#define SHA "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static void parse_ok(const char *line, api_progress *p) {
  char err[256] = "";
  if (api_progress_parse(line, p, err, sizeof err) != 0) fail_msg("refused %s: %s", line, err);
}

static void metrics_line_parses_into_step_epoch_and_values(void **state) {
  (void)state;
  api_progress p;
  parse_ok("{\"step\":120,\"epoch\":1,\"metrics\":{\"loss\":0.53,\"accuracy\":0.81}}", &p);
  assert_int_equal(p.kind, API_PROGRESS_METRICS);
  assert_int_equal(p.step, 120);
  assert_int_equal(p.epoch, 1);
  assert_int_equal(p.n_metrics, 2);
  assert_string_equal(p.metric_names[0], "loss");
  assert_true(p.metric_values[0] == 0.53);
  assert_string_equal(p.metric_names[1], "accuracy");
  assert_true(p.metric_values[1] == 0.81);
}

static void metrics_line_without_epoch_has_epoch_0(void **state) {
  (void)state;
  api_progress p;
  parse_ok("{\"step\":7,\"metrics\":{\"loss\":2}}", &p);
  assert_int_equal(p.epoch, 0);
  assert_int_equal(p.step, 7);
  assert_true(p.metric_values[0] == 2.0);
}

static void metrics_line_accepts_step_written_as_120_0(void **state) {
  (void)state;
  api_progress p;
  parse_ok("{\"step\":120.0,\"metrics\":{}}", &p);
  assert_int_equal(p.step, 120);
  assert_int_equal(p.n_metrics, 0);
}

static void metrics_line_holds_up_to_the_limit(void **state) {
  (void)state;
  char line[2048];
  size_t used = (size_t)snprintf(line, sizeof line, "{\"step\":1,\"metrics\":{");
  for (int i = 0; i < API_MAX_METRICS; i++)
    used += (size_t)snprintf(line + used, sizeof line - used, "%s\"m%02d_%s\":%d", i ? "," : "", i,
                             "abcdefghijklmnopqrstuvwxyz0123456789abcdefg", i);
  snprintf(line + used, sizeof line - used, "}}");
  api_progress p;
  parse_ok(line, &p);
  assert_int_equal(p.n_metrics, API_MAX_METRICS);
  assert_int_equal(strlen(p.metric_names[15]), 47);
  assert_true(p.metric_values[15] == 15.0);
}

static void checkpoint_line_parses(void **state) {
  (void)state;
  api_progress p;
  parse_ok("{\"checkpoint\":{\"step\":938,\"path\":\"ckpt/step-938.safetensors\","
           "\"bytes\":814120,\"sha256\":\"" SHA "\"}}",
           &p);
  assert_int_equal(p.kind, API_PROGRESS_CHECKPOINT);
  assert_int_equal(p.step, 938);
  assert_string_equal(p.path, "ckpt/step-938.safetensors");
  assert_int_equal(p.bytes, 814120);
  assert_string_equal(p.sha256, SHA);
}

static void error_line_parses(void **state) {
  (void)state;
  api_progress p;
  parse_ok("{\"error\":{\"reason\":\"DATA_ERROR\",\"message\":\"train-images is truncated\"}}", &p);
  assert_int_equal(p.kind, API_PROGRESS_ERROR);
  assert_string_equal(p.reason, "DATA_ERROR");
  assert_string_equal(p.message, "train-images is truncated");
}

static void status_line_puts_the_phase_in_reason(void **state) {
  (void)state;
  api_progress p;
  parse_ok("{\"status\":{\"phase\":\"training\",\"message\":\"epoch 1 of 2\"}}", &p);
  assert_int_equal(p.kind, API_PROGRESS_STATUS);
  assert_string_equal(p.reason, "training");
  assert_string_equal(p.message, "epoch 1 of 2");
}

static void message_is_optional(void **state) {
  (void)state;
  api_progress p;
  parse_ok("{\"status\":{\"phase\":\"loading\"}}", &p);
  assert_string_equal(p.message, "");
}

static void trailing_newline_is_tolerated(void **state) {
  (void)state;
  api_progress p;
  parse_ok("{\"status\":{\"phase\":\"done\"}}\n", &p);
  assert_string_equal(p.reason, "done");
}

/* format(parse(line)) gives the line back byte for byte, and parsing the
 * formatted line gives the same struct. */
static void every_kind_round_trips(void **state) {
  (void)state;
  const char *lines[] = {
      "{\"step\":120,\"epoch\":1,\"metrics\":{\"loss\":0.53,\"accuracy\":0.81}}",
      "{\"step\":0,\"epoch\":0,\"metrics\":{}}",
      "{\"step\":9223372036854775807,\"epoch\":3,\"metrics\":{\"loss\":0.30000000000000004,"
      "\"lr\":0.125,\"big\":1.7976931348623157e308,\"neg\":-2.5}}",
      "{\"checkpoint\":{\"step\":938,\"path\":\"/var/kiln/ckpt/job-1/step-938.safetensors\","
      "\"bytes\":814120,\"sha256\":\"" SHA "\"}}",
      "{\"error\":{\"reason\":\"DATA_ERROR\",\"message\":\"bad \\\"label\\\" 12\\nat row 3\"}}",
      "{\"status\":{\"phase\":\"training\",\"message\":\"\\u00e9poque 1\"}}",
  };
  for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
    api_progress first, second;
    memset(&first, 0xA5, sizeof first);
    memset(&second, 0x5A, sizeof second);
    parse_ok(lines[i], &first);
    char *text = api_progress_format(&first);
    assert_non_null(text);
    if (i != 5) assert_string_equal(text, lines[i]); /* jansson writes é as UTF-8 */
    parse_ok(text, &second);
    assert_memory_equal(&first, &second, sizeof first);
    free(text);
  }
}

static void format_writes_the_shortest_exact_numbers(void **state) {
  (void)state;
  api_progress p;
  memset(&p, 0, sizeof p);
  p.kind = API_PROGRESS_METRICS;
  p.step = 5;
  p.n_metrics = 2;
  strcpy(p.metric_names[0], "loss");
  p.metric_values[0] = 0.5;
  strcpy(p.metric_names[1], "accuracy");
  p.metric_values[1] = 1;
  char *text = api_progress_format(&p);
  assert_string_equal(text, "{\"step\":5,\"epoch\":0,\"metrics\":{\"loss\":0.5,\"accuracy\":1.0}}");
  free(text);

  /* A line is written with the digits its most demanding number needs, so a
   * float32 loss widened to double keeps every digit next to a short one. */
  p.metric_values[0] = (double)0.1f;
  text = api_progress_format(&p);
  api_progress back;
  parse_ok(text, &back);
  assert_true(back.metric_values[0] == (double)0.1f);
  free(text);
}

static void format_refuses_what_would_not_read_back(void **state) {
  (void)state;
  api_progress p;
  memset(&p, 0, sizeof p);
  p.kind = API_PROGRESS_METRICS;
  p.n_metrics = 1;
  strcpy(p.metric_names[0], "loss");
  p.metric_values[0] = NAN;
  assert_null(api_progress_format(&p));
  p.metric_values[0] = INFINITY;
  assert_null(api_progress_format(&p));
  p.metric_values[0] = 1;
  p.n_metrics = 2;
  strcpy(p.metric_names[1], "loss");
  assert_null(api_progress_format(&p)); /* the same name twice */
  p.metric_names[1][0] = '\0';
  assert_null(api_progress_format(&p)); /* an empty name */
  p.n_metrics = API_MAX_METRICS + 1;
  assert_null(api_progress_format(&p));
  p.n_metrics = 1;
  p.kind = (api_progress_kind)9;
  assert_null(api_progress_format(&p));
  assert_null(api_progress_format(NULL));
}

typedef struct bad_line {
  const char *line;
  const char *because; /* part of the error sentence */
} bad_line;

static void bad_lines_are_refused_with_a_reason(void **state) {
  (void)state;
  static const bad_line cases[] = {
      {"", "not valid JSON"},
      {"step 5 loss 0.3", "not valid JSON"},
      {"{\"step\":1,\"metrics\":{\"loss\":1e999}}", "not valid JSON"}, /* overflows to inf */
      {"{\"step\":1,\"metrics\":{\"loss\":NaN}}", "not valid JSON"},
      {"{\"step\":1,\"step\":2,\"metrics\":{}}", "duplicate"},
      {"[1,2]", "must be a JSON object, got array"},
      {"42", "must be a JSON object, got integer"},
      {"{}", "unknown kind"},
      {"{\"heartbeat\":{}}", "unknown kind"},
      /* metrics */
      {"{\"step\":\"1\",\"metrics\":{}}", "step must be an integer, got string"},
      {"{\"step\":1.5,\"metrics\":{}}", "step must be an integer, got 1.5"},
      {"{\"step\":-1,\"metrics\":{}}", "step must be between 0 and"},
      {"{\"metrics\":{\"loss\":1}}", "step is required"},
      {"{\"step\":1}", "metrics is required"},
      {"{\"step\":1,\"epoch\":-1,\"metrics\":{}}", "epoch must be between 0 and"},
      {"{\"step\":1,\"epoch\":true,\"metrics\":{}}", "epoch must be an integer, got boolean"},
      {"{\"step\":1,\"metrics\":[0.5]}", "metrics must be an object, got array"},
      {"{\"step\":1,\"metrics\":{\"loss\":\"0.5\"}}", "metrics.loss must be a number, got string"},
      {"{\"step\":1,\"metrics\":{\"loss\":null}}", "metrics.loss must be a number, got null"},
      {"{\"step\":1,\"metrics\":{\"\":1}}", "metric name must be 1 to 47 bytes long, got 0"},
      {"{\"step\":1,\"metrics\":{\"abcdefghijklmnopqrstuvwxyz0123456789abcdefghijkl\":1}}",
       "got 48"},
      {"{\"step\":1,\"metrics\":{},\"lr\":0.1}", "unknown field 'lr'"},
      /* checkpoint */
      {"{\"checkpoint\":{\"step\":1,\"path\":\"p\",\"bytes\":1,\"sha256\":\"" SHA "\"},\"step\":1}",
       "'checkpoint' must be the line's only key, got 2 keys"},
      {"{\"checkpoint\":\"p\"}", "checkpoint must be an object, got string"},
      {"{\"checkpoint\":{\"path\":\"p\",\"bytes\":1,\"sha256\":\"" SHA "\"}}",
       "checkpoint.step is required"},
      {"{\"checkpoint\":{\"step\":1,\"bytes\":1,\"sha256\":\"" SHA "\"}}",
       "checkpoint.path is required"},
      {"{\"checkpoint\":{\"step\":1,\"path\":\"\",\"bytes\":1,\"sha256\":\"" SHA "\"}}",
       "checkpoint.path must be 1 to 511 bytes long, got 0"},
      {"{\"checkpoint\":{\"step\":1,\"path\":\"p\",\"bytes\":-1,\"sha256\":\"" SHA "\"}}",
       "checkpoint.bytes must be between 0 and"},
      {"{\"checkpoint\":{\"step\":1,\"path\":\"p\",\"sha256\":\"" SHA "\"}}",
       "checkpoint.bytes is required"},
      {"{\"checkpoint\":{\"step\":1,\"path\":\"p\",\"bytes\":1}}", "checkpoint.sha256 is required"},
      {"{\"checkpoint\":{\"step\":1,\"path\":\"p\",\"bytes\":1,\"sha256\":\"ABCDEF\"}}",
       "64 lowercase hex digits"},
      {"{\"checkpoint\":{\"step\":1,\"path\":\"p\",\"bytes\":1,\"sha256\":"
       "\"0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef\"}}",
       "64 lowercase hex digits"},
      {"{\"checkpoint\":{\"step\":1,\"path\":\"p\",\"bytes\":1,\"sha256\":7}}",
       "64 lowercase hex digits"},
      {"{\"checkpoint\":{\"step\":1,\"path\":\"p\",\"bytes\":1,\"sha256\":\"" SHA
       "\",\"metric\":1}}",
       "unknown field 'checkpoint.metric'"},
      /* error and status */
      {"{\"error\":{\"message\":\"m\"}}", "error.reason is required"},
      {"{\"error\":{\"reason\":\"\"}}", "error.reason must be 1 to 47 bytes long, got 0"},
      {"{\"error\":{\"reason\":\"ABCDEFGHIJKLMNOPQRSTUVWXYZ_ABCDEFGHIJKLMNOPQRSTU\"}}", "got 48"},
      {"{\"error\":{\"reason\":\"X\",\"message\":5}}",
       "error.message must be a string, got integer"},
      {"{\"error\":{\"reason\":\"X\",\"code\":5}}", "unknown field 'error.code'"},
      {"{\"status\":{\"message\":\"m\"}}", "status.phase is required"},
      {"{\"status\":{\"phase\":[\"x\"]}}", "status.phase must be a string, got array"},
      {"{\"status\":{\"phase\":\"x\"},\"error\":{\"reason\":\"X\"}}", "only key"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    api_progress p;
    char err[256] = "";
    if (api_progress_parse(cases[i].line, &p, err, sizeof err) != -1)
      fail_msg("accepted %s", cases[i].line);
    if (!strstr(err, cases[i].because))
      fail_msg("line %s: error '%s' lacks '%s'", cases[i].line, err, cases[i].because);
  }
}

static void oversize_message_is_refused(void **state) {
  (void)state;
  char line[1024];
  size_t used = (size_t)snprintf(line, sizeof line, "{\"error\":{\"reason\":\"X\",\"message\":\"");
  memset(line + used, 'm', 512);
  used += 512;
  snprintf(line + used, sizeof line - used, "\"}}");
  api_progress p;
  char err[256] = "";
  assert_int_equal(api_progress_parse(line, &p, err, sizeof err), -1);
  assert_non_null(strstr(err, "error.message must be 0 to 511 bytes long, got 512"));
  /* One byte less fits. */
  memmove(line + used - 1, line + used, strlen(line + used) + 1);
  parse_ok(line, &p);
  assert_int_equal(strlen(p.message), 511);
}

static void seventeen_metrics_are_refused(void **state) {
  (void)state;
  char line[1024];
  size_t used = (size_t)snprintf(line, sizeof line, "{\"step\":1,\"metrics\":{");
  for (int i = 0; i <= API_MAX_METRICS; i++)
    used += (size_t)snprintf(line + used, sizeof line - used, "%s\"m%d\":1", i ? "," : "", i);
  snprintf(line + used, sizeof line - used, "}}");
  api_progress p;
  char err[256] = "";
  assert_int_equal(api_progress_parse(line, &p, err, sizeof err), -1);
  assert_string_equal(err, "progress line: at most 16 metrics per line, got 17");
}

static void small_or_missing_error_buffer_is_safe(void **state) {
  (void)state;
  api_progress p;
  char err[8];
  assert_int_equal(api_progress_parse("{}", &p, err, sizeof err), -1);
  assert_int_equal(strlen(err), 7);
  assert_int_equal(api_progress_parse("{}", &p, NULL, 0), -1);
  assert_int_equal(api_progress_parse(NULL, &p, err, sizeof err), -1);
  assert_int_equal(api_progress_parse("{}", NULL, err, sizeof err), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(metrics_line_parses_into_step_epoch_and_values),
      cmocka_unit_test(metrics_line_without_epoch_has_epoch_0),
      cmocka_unit_test(metrics_line_accepts_step_written_as_120_0),
      cmocka_unit_test(metrics_line_holds_up_to_the_limit),
      cmocka_unit_test(checkpoint_line_parses),
      cmocka_unit_test(error_line_parses),
      cmocka_unit_test(status_line_puts_the_phase_in_reason),
      cmocka_unit_test(message_is_optional),
      cmocka_unit_test(trailing_newline_is_tolerated),
      cmocka_unit_test(every_kind_round_trips),
      cmocka_unit_test(format_writes_the_shortest_exact_numbers),
      cmocka_unit_test(format_refuses_what_would_not_read_back),
      cmocka_unit_test(bad_lines_are_refused_with_a_reason),
      cmocka_unit_test(oversize_message_is_refused),
      cmocka_unit_test(seventeen_metrics_are_refused),
      cmocka_unit_test(small_or_missing_error_buffer_is_safe),
  };
  return cmocka_run_group_tests_name("progress", tests, NULL, NULL);
}
