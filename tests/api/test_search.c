/* test_search.c — the experiment search: parsing with field paths, grid
 * enumeration, seeded random draws within their ranges, trial specs at
 * spec paths, and ASHA's decisions over scripted rung results. */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api_search.h"

static const char base_spec_text[] =
    "{\"model\":{\"input_shape\":[28,28,1],\"layers\":[{\"type\":\"flatten\"},"
    "{\"type\":\"dense\",\"units\":16,"
    "\"activation\":\"relu\"},{\"type\":\"dense\",\"units\":10}]},"
    "\"loss\":\"sparse_categorical_crossentropy\",\"metrics\":[\"accuracy\"],"
    "\"dataset\":{\"name\":\"fashion-mnist\",\"validation\":\"test\"},"
    "\"pipeline\":{\"batch_size\":32},\"optimizer\":{\"type\":\"sgd\",\"learning_rate\":0.1},"
    "\"epochs\":2}";

static api_search *parse_ok(const char *json) {
  api_search *s = NULL;
  api_error e;
  int rc = api_search_parse(json, strlen(json), &s, &e);
  if (rc != 0) print_error("unexpected refusal: %s\n", e.message);
  assert_int_equal(rc, 0);
  return s;
}

/* The first detail's field of a refused search. */
static void refused_naming(const char *json, const char *field) {
  api_search *s = NULL;
  api_error e;
  assert_int_equal(api_search_parse(json, strlen(json), &s, &e), -1);
  assert_null(s);
  assert_int_equal(e.http, 400);
  assert_true(e.n_details >= 1);
  if (strcmp(e.details[0].field, field) != 0)
    print_error("expected %s, got %s (%s)\n", field, e.details[0].field, e.details[0].description);
  assert_string_equal(e.details[0].field, field);
}

/* The canonical base spec: every default present, as the server keeps it. */
static char *canonical_base(void) {
  api_job_spec *spec = malloc(sizeof *spec);
  api_error e;
  int rc = api_spec_parse(base_spec_text, strlen(base_spec_text), spec, &e);
  if (rc != 0)
    print_error("base spec refused: %s: %s\n", e.details[0].field, e.details[0].description);
  assert_int_equal(rc, 0);
  char *text = api_spec_to_json(spec);
  free(spec);
  assert_non_null(text);
  return text;
}

static double value_of(const char *values_json, const char *path) {
  json_t *o = json_loads(values_json, 0, NULL);
  assert_non_null(o);
  json_t *v = json_object_get(o, path);
  assert_non_null(v);
  double d = json_number_value(v);
  json_decref(o);
  return d;
}

static void grid_enumerates_exactly_the_two_by_two_values(void **state) {
  (void)state;
  api_search *s =
      parse_ok("{\"searcher\":\"grid\",\"metric\":\"val_accuracy\",\"parameters\":{"
               "\"optimizer.learning_rate\":{\"type\":\"categorical\",\"values\":[0.01,0.1]},"
               "\"pipeline.batch_size\":{\"type\":\"categorical\",\"values\":[16,32]}}}");
  assert_int_equal(api_search_trial_count(s), 4);
  const double lr[4] = {0.01, 0.01, 0.1, 0.1};
  const double bs[4] = {16, 32, 16, 32};
  for (int i = 0; i < 4; i++) {
    char *v = api_search_trial_values(s, i);
    assert_non_null(v);
    assert_true(value_of(v, "optimizer.learning_rate") == lr[i]);
    assert_true(value_of(v, "pipeline.batch_size") == bs[i]);
    free(v);
  }
  assert_null(api_search_trial_values(s, 4));
  api_search_free(s);
}

static void grid_over_a_range_takes_count_points_and_int_ranges_every_integer(void **state) {
  (void)state;
  api_search *s = parse_ok(
      "{\"searcher\":\"grid\",\"metric\":\"val_loss\",\"parameters\":{"
      "\"optimizer.learning_rate\":{\"type\":\"log_uniform\",\"min\":0.001,\"max\":0.1,"
      "\"count\":3},\"model.layers[1].units\":{\"type\":\"int_uniform\",\"min\":4,\"max\":6}}}");
  assert_int_equal(api_search_trial_count(s), 9);
  assert_int_equal(api_search_mode_max(s), 0); /* a loss: lower is better */
  char *v = api_search_trial_values(s, 4);     /* the middle of both */
  assert_true(fabs(value_of(v, "optimizer.learning_rate") - 0.01) < 1e-12);
  assert_true(value_of(v, "model.layers[1].units") == 5);
  free(v);
  api_search_free(s);
}

static const char random_search[] =
    "{\"searcher\":\"random\",\"metric\":\"val_accuracy\",\"mode\":\"max\",\"max_trials\":%d,"
    "\"seed\":%d,\"parameters\":{"
    "\"optimizer.learning_rate\":{\"type\":\"log_uniform\",\"min\":0.0001,\"max\":0.1},"
    "\"optimizer.momentum\":{\"type\":\"uniform\",\"min\":0.5,\"max\":0.99},"
    "\"model.layers[1].units\":{\"type\":\"int_uniform\",\"min\":16,\"max\":128},"
    "\"pipeline.batch_size\":{\"type\":\"categorical\",\"values\":[64,128,256]}}}";

static api_search *random_with(int trials, int seed) {
  char text[1024];
  snprintf(text, sizeof text, random_search, trials, seed);
  return parse_ok(text);
}

static void seeded_random_is_reproducible_and_within_ranges(void **state) {
  (void)state;
  api_search *a = random_with(50, 7), *b = random_with(50, 7), *c = random_with(50, 8);
  int differ = 0;
  for (int i = 0; i < 50; i++) {
    char *va = api_search_trial_values(a, i), *vb = api_search_trial_values(b, i);
    char *vc = api_search_trial_values(c, i);
    assert_string_equal(va, vb);
    differ += strcmp(va, vc) != 0;
    double lr = value_of(va, "optimizer.learning_rate");
    double momentum = value_of(va, "optimizer.momentum");
    double units = value_of(va, "model.layers[1].units");
    double batch = value_of(va, "pipeline.batch_size");
    assert_true(lr >= 0.0001 && lr <= 0.1);
    assert_true(momentum >= 0.5 && momentum <= 0.99);
    assert_true(units >= 16 && units <= 128 && units == floor(units));
    assert_true(batch == 64 || batch == 128 || batch == 256);
    free(va);
    free(vb);
    free(vc);
  }
  assert_true(differ >= 45); /* another seed draws other trials */
  api_search_free(a);
  api_search_free(b);
  api_search_free(c);
}

static void log_uniform_is_uniform_in_the_logarithm(void **state) {
  (void)state;
  api_search *s = random_with(1000, 3);
  /* 1e-4..1e-1 spans three decades: each holds about a third of the draws
   * (a uniform draw would put 99% in the last). */
  int decade[3] = {0, 0, 0};
  for (int i = 0; i < 1000; i++) {
    char *v = api_search_trial_values(s, i);
    double lr = value_of(v, "optimizer.learning_rate");
    int d = (int)floor(log10(lr) + 4);
    assert_true(d >= 0 && d <= 3);
    decade[d > 2 ? 2 : d]++;
    free(v);
  }
  for (int d = 0; d < 3; d++) assert_in_range(decade[d], 270, 400);
  api_search_free(s);
}

static void trial_spec_writes_values_at_their_paths(void **state) {
  (void)state;
  char *base = canonical_base();
  api_search *s = random_with(3, 1);
  char *values = api_search_trial_values(s, 0);
  char *spec = NULL;
  api_error e;
  assert_int_equal(api_search_trial_spec(s, base, values, 5, &spec, &e), 0);
  json_t *o = json_loads(spec, 0, NULL);
  assert_non_null(o);
  json_t *layer1 = json_array_get(json_object_get(json_object_get(o, "model"), "layers"), 1);
  assert_true(json_number_value(json_object_get(layer1, "units")) ==
              value_of(values, "model.layers[1].units"));
  assert_true(json_number_value(json_object_get(json_object_get(o, "pipeline"), "batch_size")) ==
              value_of(values, "pipeline.batch_size"));
  assert_int_equal(json_integer_value(json_object_get(o, "epochs")), 5);
  json_decref(o);
  free(spec);
  free(values);
  free(base);
  api_search_free(s);
}

static void trial_spec_refuses_a_path_missing_from_the_base_spec(void **state) {
  (void)state;
  char *base = canonical_base();
  static const char *const searches[][2] = {
      {"{\"searcher\":\"random\",\"metric\":\"val_loss\",\"parameters\":{"
       "\"optimizer.no_such_option\":{\"type\":\"uniform\",\"min\":0,\"max\":1}}}",
       "search.parameters.optimizer.no_such_option"},
      {"{\"searcher\":\"random\",\"metric\":\"val_loss\",\"parameters\":{"
       "\"model.layers[5].units\":{\"type\":\"int_uniform\",\"min\":1,\"max\":4}}}",
       "search.parameters.model.layers[5].units"},
      {"{\"searcher\":\"random\",\"metric\":\"val_loss\",\"parameters\":{"
       "\"model.layers\":{\"type\":\"int_uniform\",\"min\":1,\"max\":4}}}",
       "search.parameters.model.layers"},
      /* A value the spec refuses is named by the parameter that set it. */
      {"{\"searcher\":\"random\",\"metric\":\"val_loss\",\"parameters\":{"
       "\"model.layers[1].units\":{\"type\":\"int_uniform\",\"min\":-8,\"max\":-2}}}",
       "search.parameters.model.layers[1].units"},
  };
  for (size_t i = 0; i < sizeof searches / sizeof searches[0]; i++) {
    api_search *s = parse_ok(searches[i][0]);
    char *values = api_search_trial_values(s, 0), *spec = NULL;
    api_error e;
    assert_int_equal(api_search_trial_spec(s, base, values, 0, &spec, &e), -1);
    assert_null(spec);
    assert_int_equal(e.http, 400);
    assert_string_equal(e.details[0].field, searches[i][1]);
    free(values);
    api_search_free(s);
  }
  free(base);
}

static void bad_searches_are_refused_naming_the_field(void **state) {
  (void)state;
  const char *p = "\"parameters\":{\"optimizer.learning_rate\":{\"type\":\"uniform\","
                  "\"min\":0.1,\"max\":0.2}}";
  char text[1024];
#define REFUSED(field, fmt, ...)                                                                   \
  do {                                                                                             \
    snprintf(text, sizeof text, fmt, __VA_ARGS__);                                                 \
    refused_naming(text, field);                                                                   \
  } while (0)
  REFUSED("search.searcher", "{\"searcher\":\"bayes\",\"metric\":\"val_loss\",%s}", p);
  REFUSED("search.metric", "{\"searcher\":\"random\",%s}", p);
  REFUSED("search.mode", "{\"searcher\":\"random\",\"metric\":\"val_loss\",\"mode\":\"up\",%s}", p);
  REFUSED("search.max_concurrent_trials",
          "{\"searcher\":\"random\",\"metric\":\"val_loss\",\"max_concurrent_trials\":0,%s}", p);
  REFUSED("search.asha", "{\"searcher\":\"asha\",\"metric\":\"val_loss\",%s}", p);
  REFUSED("search.asha.max_epochs",
          "{\"searcher\":\"asha\",\"metric\":\"val_loss\",\"asha\":{\"min_epochs\":1},%s}", p);
  REFUSED("search.parameters.optimizer.learning_rate.count",
          "{\"searcher\":\"grid\",\"metric\":\"val_loss\",%s}", p);
  REFUSED("search.unknown", "{\"searcher\":\"random\",\"metric\":\"val_loss\",\"unknown\":1,%s}",
          p);
  REFUSED("search.parameters.optimizer.learning_rate.min",
          "{\"searcher\":\"random\",\"metric\":\"val_loss\",\"parameters\":{"
          "\"optimizer.learning_rate\":{\"type\":\"uniform\",\"min\":0.3,\"max\":0.2}}}%s",
          "");
  REFUSED("search.parameters.optimizer.learning_rate.min",
          "{\"searcher\":\"random\",\"metric\":\"val_loss\",\"parameters\":{"
          "\"optimizer.learning_rate\":{\"type\":\"log_uniform\",\"min\":0,\"max\":0.2}}}%s",
          "");
  REFUSED("search.parameters.pipeline.batch_size.values",
          "{\"searcher\":\"random\",\"metric\":\"val_loss\",\"parameters\":{"
          "\"pipeline.batch_size\":{\"type\":\"categorical\",\"values\":[]}}}%s",
          "");
  REFUSED("search.parameters.x.type",
          "{\"searcher\":\"random\",\"metric\":\"val_loss\",\"parameters\":{"
          "\"x\":{\"type\":\"normal\",\"min\":0,\"max\":1}}}%s",
          "");
  REFUSED("search.max_trials",
          "{\"searcher\":\"grid\",\"metric\":\"val_loss\",\"max_trials\":3,\"parameters\":{"
          "\"a\":{\"type\":\"categorical\",\"values\":[1,2]},"
          "\"b\":{\"type\":\"categorical\",\"values\":[1,2]}}}%s",
          "");
  REFUSED("search.parameters", "{\"searcher\":\"random\",\"metric\":\"val_loss\"%s}", "");
#undef REFUSED
}

/* ---- ASHA ---- */

static api_search *asha(int trials, int concurrent) {
  char text[512];
  snprintf(text, sizeof text,
           "{\"searcher\":\"asha\",\"metric\":\"val_accuracy\",\"mode\":\"max\",\"max_trials\":%d,"
           "\"max_concurrent_trials\":%d,\"parameters\":{\"optimizer.learning_rate\":{"
           "\"type\":\"log_uniform\",\"min\":0.0001,\"max\":0.1}},"
           "\"asha\":{\"min_epochs\":1,\"max_epochs\":9}}",
           trials, concurrent);
  return parse_ok(text);
}

/* Applies the searcher's next action to the table the way the driver does. */
static api_search_action step(const api_search *s, api_trial_view *t, int n) {
  api_search_action a = api_search_next(s, t, n);
  if (a.kind == API_ACTION_START) t[a.trial].state = API_TRIAL_RUNNING, t[a.trial].rung = 0;
  if (a.kind == API_ACTION_PROMOTE) t[a.trial].state = API_TRIAL_PROMOTED, t[a.trial].rung++;
  if (a.kind == API_ACTION_STOP) t[a.trial].state = API_TRIAL_STOPPED;
  return a;
}

/* Trial t finishes the rung it trains toward with metric m. */
static void finish_rung(const api_search *s, api_trial_view *t, int i, double m) {
  assert_true(t[i].state == API_TRIAL_RUNNING || t[i].state == API_TRIAL_PROMOTED);
  t[i].results[t[i].rung] = m;
  t[i].n_results = t[i].rung + 1;
  t[i].state = t[i].rung == api_search_rung_count(s) - 1 ? API_TRIAL_DONE : API_TRIAL_PAUSED;
}

static void asha_rungs_are_min_epochs_times_eta_powers(void **state) {
  (void)state;
  api_search *s = asha(9, 1);
  assert_int_equal(api_search_rung_count(s), 3);
  assert_int_equal(api_search_rung_epochs(s, 0), 1);
  assert_int_equal(api_search_rung_epochs(s, 1), 3);
  assert_int_equal(api_search_rung_epochs(s, 2), 9);
  api_search_free(s);
}

static void asha_promotes_the_top_third_and_stops_the_rest(void **state) {
  (void)state;
  api_search *s = asha(9, 1);
  api_trial_view t[9];
  memset(t, 0, sizeof t);
  /* One at a time, each trial worse than the one before at rung 0: the
   * top third of the results so far is always the earliest trials. */
  const double rung0[9] = {0.95, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2};
  int promoted_order[16], n_promoted = 0, started = 0;
  for (int guard = 0; guard < 100; guard++) {
    api_search_action a = step(s, t, 9);
    if (a.kind == API_ACTION_FINISH) break;
    if (a.kind == API_ACTION_PROMOTE) promoted_order[n_promoted++] = a.trial;
    if (a.kind == API_ACTION_START) started++;
    if (a.kind == API_ACTION_NONE) {
      /* exactly one runs: it finishes its rung */
      int running = -1;
      for (int i = 0; i < 9; i++)
        if (t[i].state == API_TRIAL_RUNNING || t[i].state == API_TRIAL_PROMOTED) running = i;
      assert_true(running >= 0);
      double m = t[running].rung == 0 ? rung0[running] : rung0[running] + 0.01 * t[running].rung;
      finish_rung(s, t, running, m);
    }
    int active = 0;
    for (int i = 0; i < 9; i++)
      active += t[i].state == API_TRIAL_RUNNING || t[i].state == API_TRIAL_PROMOTED;
    assert_true(active <= 1);
  }
  assert_int_equal(started, 9);
  /* Rung 0 promoted 3 (9 / 3); rung 1 promoted 1 (3 / 3) to the last rung. */
  int to_rung1 = 0, to_rung2 = 0;
  for (int i = 0; i < 9; i++) {
    if (t[i].n_results >= 2) to_rung1++;
    if (t[i].n_results >= 3) to_rung2++;
  }
  assert_int_equal(to_rung1, 3);
  assert_int_equal(to_rung2, 1);
  assert_int_equal(t[0].state, API_TRIAL_DONE); /* the best trained to max_epochs */
  for (int i = 1; i < 9; i++) assert_int_equal(t[i].state, API_TRIAL_STOPPED);
  /* Promoted: 0 after three results, 1 after six, 2 after nine, then 0
   * again from rung 1 once it has three results. */
  assert_int_equal(n_promoted, 4);
  assert_int_equal(promoted_order[0], 0);
  assert_int_equal(promoted_order[1], 1);
  assert_int_equal(promoted_order[2], 2);
  assert_int_equal(promoted_order[3], 0);
  api_search_free(s);
}

static void asha_scripted_sequence_decides_each_step(void **state) {
  (void)state;
  api_search *s = asha(3, 1);
  api_trial_view t[3];
  memset(t, 0, sizeof t);
  api_search_action a = step(s, t, 3);
  assert_int_equal(a.kind, API_ACTION_START);
  assert_int_equal(a.trial, 0);
  assert_int_equal(step(s, t, 3).kind, API_ACTION_NONE); /* one at a time */
  finish_rung(s, t, 0, 0.5);
  /* One result at rung 0: 1 / 3 promotes none, so the next trial starts. */
  a = step(s, t, 3);
  assert_int_equal(a.kind, API_ACTION_START);
  assert_int_equal(a.trial, 1);
  finish_rung(s, t, 1, 0.7);
  /* Trial 0 is now beaten by one, and rung 0 promotes at most 3 / 3 = 1. */
  a = step(s, t, 3);
  assert_int_equal(a.kind, API_ACTION_STOP);
  assert_int_equal(a.trial, 0);
  a = step(s, t, 3);
  assert_int_equal(a.kind, API_ACTION_START);
  assert_int_equal(a.trial, 2);
  finish_rung(s, t, 2, 0.6);
  a = step(s, t, 3);
  assert_int_equal(a.kind, API_ACTION_STOP);
  assert_int_equal(a.trial, 2);
  /* Three results: the top one (trial 1) is promoted. */
  a = step(s, t, 3);
  assert_int_equal(a.kind, API_ACTION_PROMOTE);
  assert_int_equal(a.trial, 1);
  assert_int_equal(t[1].rung, 1);
  finish_rung(s, t, 1, 0.8);
  /* Nothing runs or waits: the best paused goes on to max_epochs. */
  a = step(s, t, 3);
  assert_int_equal(a.kind, API_ACTION_PROMOTE);
  assert_int_equal(a.trial, 1);
  finish_rung(s, t, 1, 0.85);
  assert_int_equal(t[1].state, API_TRIAL_DONE);
  assert_int_equal(step(s, t, 3).kind, API_ACTION_FINISH);
  api_search_free(s);
}

static void max_concurrent_trials_bounds_what_runs(void **state) {
  (void)state;
  char text[512];
  snprintf(text, sizeof text, random_search, 5, 1);
  api_search *s = parse_ok(text);
  /* random_search has no max_concurrent_trials: one at a time. */
  api_trial_view t[5];
  memset(t, 0, sizeof t);
  assert_int_equal(step(s, t, 5).kind, API_ACTION_START);
  assert_int_equal(step(s, t, 5).kind, API_ACTION_NONE);
  api_search_free(s);
  s = asha(5, 2);
  memset(t, 0, sizeof t);
  assert_int_equal(step(s, t, 5).kind, API_ACTION_START);
  assert_int_equal(step(s, t, 5).kind, API_ACTION_START);
  assert_int_equal(step(s, t, 5).kind, API_ACTION_NONE);
  api_search_free(s);
}

static void defaults_are_filled_and_read_back(void **state) {
  (void)state;
  api_search *s = parse_ok("{\"searcher\":\"asha\",\"metric\":\"val_accuracy\",\"parameters\":{"
                           "\"optimizer.learning_rate\":{\"type\":\"uniform\",\"min\":0.1,"
                           "\"max\":0.2}},\"asha\":{\"max_epochs\":4}}");
  char *text = api_search_to_json(s);
  json_t *o = json_loads(text, 0, NULL);
  assert_string_equal(json_string_value(json_object_get(o, "mode")), "max");
  assert_int_equal(json_integer_value(json_object_get(o, "max_trials")), 10);
  assert_int_equal(json_integer_value(json_object_get(o, "max_concurrent_trials")), 1);
  assert_int_equal(
      json_integer_value(json_object_get(json_object_get(o, "asha"), "reduction_factor")), 3);
  api_search *again = parse_ok(text);
  char *v1 = api_search_trial_values(s, 3), *v2 = api_search_trial_values(again, 3);
  assert_string_equal(v1, v2);
  assert_int_equal(api_search_rung_count(again), 3); /* 1, 3, 4 */
  assert_int_equal(api_search_rung_epochs(again, 2), 4);
  free(v1);
  free(v2);
  json_decref(o);
  free(text);
  api_search_free(s);
  api_search_free(again);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(grid_enumerates_exactly_the_two_by_two_values),
      cmocka_unit_test(grid_over_a_range_takes_count_points_and_int_ranges_every_integer),
      cmocka_unit_test(seeded_random_is_reproducible_and_within_ranges),
      cmocka_unit_test(log_uniform_is_uniform_in_the_logarithm),
      cmocka_unit_test(trial_spec_writes_values_at_their_paths),
      cmocka_unit_test(trial_spec_refuses_a_path_missing_from_the_base_spec),
      cmocka_unit_test(bad_searches_are_refused_naming_the_field),
      cmocka_unit_test(asha_rungs_are_min_epochs_times_eta_powers),
      cmocka_unit_test(asha_promotes_the_top_third_and_stops_the_rest),
      cmocka_unit_test(asha_scripted_sequence_decides_each_step),
      cmocka_unit_test(max_concurrent_trials_bounds_what_runs),
      cmocka_unit_test(defaults_are_filled_and_read_back),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
