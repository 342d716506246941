/* The spec's strategy: single, mirrored, multi_worker and parameter_server with their
 * options and defaults, each wrong option refused by its field path, and
 * the canonical form reading back to the same struct. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api.h"

/* A small valid spec whose strategy member is the given JSON text (NULL:
 * no strategy member; an optimizer riding in it replaces plain sgd).
 * Returns api_spec_parse's result. */
static int parse_strategy_text(const char *strategy, api_job_spec *spec, api_error *err) {
  char text[2048];
  const int own_optimizer = strategy && strstr(strategy, "\"optimizer\"");
  snprintf(text, sizeof text,
           "{\"model\":{\"input_shape\":[784],\"layers\":[{\"type\":\"dense\",\"units\":10}]},"
           "\"loss\":\"sparse_categorical_crossentropy\",\"dataset\":{\"name\":\"fashion-mnist\"}"
           "%s%s%s}",
           own_optimizer ? "" : ",\"optimizer\":{\"type\":\"sgd\"}",
           strategy ? ",\"strategy\":" : "", strategy ? strategy : "");
  memset(err, 0, sizeof *err);
  return api_spec_parse(text, strlen(text), spec, err);
}

/* The strategy parses, and its canonical text parses to the same bytes. */
static void accepted(const char *strategy, api_job_spec *spec, char **canonical) {
  api_error err;
  if (parse_strategy_text(strategy, spec, &err) != 0)
    fail_msg("%s refused: %s: %s", strategy, err.details[0].field, err.details[0].description);
  char *text = api_spec_to_json(spec);
  assert_non_null(text);
  api_job_spec again;
  memset(&again, 0x3C, sizeof again);
  if (api_spec_parse(text, strlen(text), &again, &err) != 0)
    fail_msg("canonical %s refused: %s", text, err.details[0].description);
  assert_memory_equal(spec, &again, sizeof again);
  *canonical = text;
}

static void refused(const char *strategy, const char *field, const char *description) {
  api_job_spec spec;
  api_error err;
  assert_int_equal(parse_strategy_text(strategy, &spec, &err), -1);
  assert_int_equal(err.http, 400);
  for (int i = 0; i < err.n_details; i++) {
    if (strcmp(err.details[i].field, field) == 0 && strstr(err.details[i].description, description))
      return;
  }
  fail_msg("%s: no detail %s '%s' (first: %s: %s)", strategy, field, description,
           err.n_details ? err.details[0].field : "-",
           err.n_details ? err.details[0].description : err.message);
}

static void no_strategy_is_single_with_one_replica(void **state) {
  (void)state;
  api_job_spec spec;
  char *text;
  accepted(NULL, &spec, &text);
  assert_int_equal(spec.strategy, API_STRATEGY_SINGLE);
  assert_int_equal(spec.replicas, 1);
  assert_int_equal(spec.workers, 1);
  assert_int_equal(spec.aggregation, API_AGGREGATE_MEAN);
  assert_non_null(strstr(text, "\"strategy\":{\"type\":\"single\"}"));
  free(text);
}

static void mirrored_reads_replicas_and_aggregation(void **state) {
  (void)state;
  api_job_spec spec;
  char *text;
  accepted("{\"type\":\"mirrored\",\"replicas\":2,\"aggregation\":\"weighted_mean\"}", &spec,
           &text);
  assert_int_equal(spec.strategy, API_STRATEGY_MIRRORED);
  assert_int_equal(spec.replicas, 2);
  assert_int_equal(spec.workers, 1);
  assert_int_equal(spec.aggregation, API_AGGREGATE_WEIGHTED_MEAN);
  assert_non_null(strstr(text, "\"strategy\":{\"type\":\"mirrored\",\"replicas\":2,"
                               "\"aggregation\":\"weighted_mean\"}"));
  free(text);
}

static void multi_worker_fills_its_defaults(void **state) {
  (void)state;
  api_job_spec spec;
  char *text;
  accepted("{\"type\":\"multi_worker\",\"workers\":2}", &spec, &text);
  assert_int_equal(spec.strategy, API_STRATEGY_MULTI_WORKER);
  assert_int_equal(spec.workers, 2);
  assert_int_equal(spec.replicas, 1);
  assert_true(spec.bucket_cap_mb == 1);
  assert_int_equal(spec.aggregation, API_AGGREGATE_MEAN);
  assert_non_null(strstr(text, "\"workers\":2,\"replicas_per_worker\":1,\"bucket_cap_mb\":1"));
  free(text);
  accepted("{\"type\":\"multi_worker\",\"workers\":4,\"replicas_per_worker\":2,"
           "\"bucket_cap_mb\":0.5,\"aggregation\":\"sum\"}",
           &spec, &text);
  assert_int_equal(spec.workers, 4);
  assert_int_equal(spec.replicas, 2);
  assert_true(spec.bucket_cap_mb == 0.5);
  assert_int_equal(spec.aggregation, API_AGGREGATE_SUM);
  free(text);
}

static void wrong_options_are_refused_by_field(void **state) {
  (void)state;
  refused("{\"type\":\"ring\"}", "strategy.type",
          "unsupported strategy 'ring'; supported: single, mirrored, multi_worker, "
          "parameter_server");
  refused("{\"type\":\"mirrored\",\"replicas\":0}", "strategy.replicas",
          "must be between 1 and 64, got 0");
  refused("{\"type\":\"mirrored\",\"replicas\":65}", "strategy.replicas", "got 65");
  refused("{\"type\":\"mirrored\",\"replicas\":\"2\"}", "strategy.replicas",
          "must be an integer, got string");
  refused("{\"type\":\"mirrored\",\"replicas\":2,\"workers\":2}", "strategy.workers",
          "does not apply to strategy 'mirrored'");
  refused("{\"type\":\"single\",\"replicas\":2}", "strategy.replicas",
          "does not apply to strategy 'single'");
  refused("{\"type\":\"single\",\"aggregation\":\"sum\"}", "strategy.aggregation",
          "does not apply to strategy 'single'");
  refused("{\"type\":\"mirrored\",\"replicas\":2,\"bucket_cap_mb\":4}", "strategy.bucket_cap_mb",
          "does not apply to strategy 'mirrored'");
  refused("{\"type\":\"multi_worker\"}", "strategy.workers", "is required");
  refused("{\"type\":\"multi_worker\",\"workers\":2,\"replicas\":2}", "strategy.replicas",
          "does not apply to strategy 'multi_worker'");
  refused("{\"type\":\"multi_worker\",\"workers\":16,\"replicas_per_worker\":8}",
          "strategy.replicas_per_worker", "at most 64, got 16 x 8");
  refused("{\"type\":\"multi_worker\",\"workers\":2,\"bucket_cap_mb\":0}", "strategy.bucket_cap_mb",
          "must be > 0 and <= 1024, got 0");
  refused("{\"type\":\"multi_worker\",\"workers\":2,\"aggregation\":\"median\"}",
          "strategy.aggregation", "supported: mean, sum, weighted_mean");
  refused("\"mirrored\"", "strategy", "must be an object");
}

static void parameter_server_reads_servers_workers_and_mode(void **state) {
  (void)state;
  api_job_spec spec;
  char *text;
  accepted("{\"type\":\"parameter_server\",\"ps\":1,\"workers\":2}", &spec, &text);
  assert_int_equal(spec.strategy, API_STRATEGY_PARAMETER_SERVER);
  assert_int_equal(spec.ps_servers, 1);
  assert_int_equal(spec.workers, 2);
  assert_int_equal(spec.replicas, 1);
  assert_int_equal(spec.ps_async, 0);
  assert_int_equal(spec.max_staleness, -1);
  assert_int_equal(spec.devices, 3); /* a core per process */
  assert_non_null(strstr(text, "\"strategy\":{\"type\":\"parameter_server\",\"ps\":1,"
                               "\"workers\":2,\"mode\":\"sync\",\"aggregation\":\"mean\"}"));
  free(text);
  accepted("{\"type\":\"parameter_server\",\"ps\":2,\"workers\":3,\"mode\":\"async\","
           "\"max_staleness\":0,\"aggregation\":\"weighted_mean\"}",
           &spec, &text);
  assert_int_equal(spec.ps_servers, 2);
  assert_int_equal(spec.workers, 3);
  assert_int_equal(spec.ps_async, 1);
  assert_int_equal(spec.max_staleness, 0);
  assert_int_equal(spec.aggregation, API_AGGREGATE_WEIGHTED_MEAN);
  assert_int_equal(spec.devices, 5);
  assert_non_null(strstr(text, "\"mode\":\"async\",\"max_staleness\":0"));
  free(text);
  /* async without a bound, and a clipped async job: each worker clips its own gradient */
  accepted("{\"type\":\"parameter_server\",\"ps\":1,\"workers\":1,\"mode\":\"async\"},"
           "\"optimizer\":{\"type\":\"sgd\",\"global_clipnorm\":1}",
           &spec, &text);
  assert_int_equal(spec.max_staleness, -1);
  assert_null(strstr(text, "max_staleness"));
  free(text);
}

static void parameter_server_options_are_refused_by_field(void **state) {
  (void)state;
  refused("{\"type\":\"parameter_server\",\"workers\":2}", "strategy.ps", "is required");
  refused("{\"type\":\"parameter_server\",\"ps\":1}", "strategy.workers", "is required");
  refused("{\"type\":\"parameter_server\",\"ps\":0,\"workers\":2}", "strategy.ps",
          "must be between 1 and 64, got 0");
  refused("{\"type\":\"parameter_server\",\"ps\":1,\"workers\":0}", "strategy.workers",
          "must be between 1 and 64, got 0");
  refused("{\"type\":\"parameter_server\",\"ps\":32,\"workers\":33}", "strategy.ps",
          "workers + ps must be at most 64, got 33 + 32");
  refused("{\"type\":\"parameter_server\",\"ps\":1,\"workers\":2,\"mode\":\"lazy\"}",
          "strategy.mode", "must be sync or async, got 'lazy'");
  refused("{\"type\":\"parameter_server\",\"ps\":1,\"workers\":2,\"max_staleness\":2}",
          "strategy.max_staleness", "applies to mode async only");
  refused("{\"type\":\"parameter_server\",\"ps\":1,\"workers\":2,\"mode\":\"async\","
          "\"max_staleness\":-1}",
          "strategy.max_staleness", "must be between 0 and 1000000, got -1");
  refused("{\"type\":\"parameter_server\",\"ps\":1,\"workers\":2,\"replicas_per_worker\":2}",
          "strategy.replicas_per_worker", "does not apply to strategy 'parameter_server'");
  refused("{\"type\":\"parameter_server\",\"ps\":1,\"workers\":2,\"bucket_cap_mb\":4}",
          "strategy.bucket_cap_mb", "does not apply to strategy 'parameter_server'");
  refused("{\"type\":\"multi_worker\",\"workers\":2,\"ps\":1}", "strategy.ps",
          "does not apply to strategy 'multi_worker'");
  refused("{\"type\":\"mirrored\",\"replicas\":2,\"mode\":\"async\"}", "strategy.mode",
          "does not apply to strategy 'mirrored'");
  refused("{\"type\":\"parameter_server\",\"ps\":1,\"workers\":2},\"resources\":{\"devices\":2}",
          "resources.devices", "at least workers + ps = 3");
  refused("{\"type\":\"parameter_server\",\"ps\":1,\"workers\":2},"
          "\"optimizer\":{\"type\":\"sgd\",\"global_clipnorm\":1}",
          "optimizer.global_clipnorm", "use mode async");
  refused("{\"type\":\"parameter_server\",\"ps\":1,\"workers\":2},\"precision\":\"mixed_float16\"",
          "precision", "strategy 'single' only");
}

/* A replicated job holds a core per replica: devices default to replicas
 * x workers, fewer are refused, more are kept; mixed_float16 stays with one
 * replica. (The members after the strategy object ride in its text.) */
static void replicas_hold_a_device_each(void **state) {
  (void)state;
  api_job_spec spec;
  char *text;
  accepted("{\"type\":\"multi_worker\",\"workers\":2,\"replicas_per_worker\":2}", &spec, &text);
  assert_int_equal(spec.devices, 4);
  free(text);
  accepted("{\"type\":\"mirrored\",\"replicas\":2},\"resources\":{\"devices\":3}", &spec, &text);
  assert_int_equal(spec.devices, 3);
  free(text);
  refused("{\"type\":\"mirrored\",\"replicas\":2},\"resources\":{\"devices\":1}",
          "resources.devices", "at least replicas x workers = 2");
  refused("{\"type\":\"mirrored\",\"replicas\":2},\"precision\":\"mixed_float16\"", "precision",
          "strategy 'single' only");
  accepted("{\"type\":\"mirrored\",\"replicas\":2},\"precision\":\"mixed_bfloat16\"", &spec, &text);
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(no_strategy_is_single_with_one_replica),
      cmocka_unit_test(mirrored_reads_replicas_and_aggregation),
      cmocka_unit_test(multi_worker_fills_its_defaults),
      cmocka_unit_test(wrong_options_are_refused_by_field),
      cmocka_unit_test(replicas_hold_a_device_each),
      cmocka_unit_test(parameter_server_reads_servers_workers_and_mode),
      cmocka_unit_test(parameter_server_options_are_refused_by_field),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
