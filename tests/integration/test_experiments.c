/* test_experiments.c — experiments through a real kilnd and kiln-train on
 * a slice of Fashion-MNIST small enough that a trial takes about a second:
 * a 2 x 2 grid makes exactly its four trials; a seeded random search makes
 * the same trials twice; ASHA pauses trials at their rungs, promotes the
 * best from its checkpoint (its loss goes on from where it paused rather
 * than starting over) and stops the rest; a waiting trial's :explain names
 * its experiment; kilnd killed with SIGKILL mid-experiment finishes it
 * after a restart; bad searches are 400s naming the field; and kiln exp.
 * kilnd runs with a pool of one CPU, so trials wait on each other. */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static char data_dir[256], kilnd_dir[300], base_url[64], token[128], pools_path[320];
static pid_t kilnd_pid;

static int launch(void) {
  const char *extra[] = {"--pools", pools_path, NULL};
  return it_launch_kilnd_args(KILND_PATH, kilnd_dir, KILN_TRAIN_PATH, extra, &kilnd_pid, base_url,
                              sizeof base_url, token, sizeof token);
}

static int start(void **state) {
  (void)state;
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-it-exp-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  snprintf(kilnd_dir, sizeof kilnd_dir, "%s/kilnd", data_dir);
  snprintf(pools_path, sizeof pools_path, "%s/pools.json", data_dir);
  if (it_write_file(pools_path,
                    "{\"pools\": [{\"name\": \"default\", \"device_type\": \"cpu\", "
                    "\"devices\": 1}]}",
                    0600) != 0)
    return -1;
  return launch();
}

static int stop(void **state) {
  (void)state;
  return it_stop_kilnd(kilnd_pid, data_dir) == 0 ? 0 : -1;
}

static json_t *call(const char *method, const char *path, const char *body, long want) {
  char *text = NULL;
  long status = it_request(base_url, token, method, path, body, body ? strlen(body) : 0, &text);
  if (status != want) fail_msg("%s %s: %ld, wanted %ld: %.600s", method, path, status, want, text);
  json_t *doc = json_loads(text ? text : "", 0, NULL);
  if (!doc) fail_msg("%s %s: not JSON: %.200s", method, path, text);
  free(text);
  return doc;
}

/* 256 examples in batches of 32: 8 steps an epoch, a loss every 2. */
#define BASE_SPEC                                                                                  \
  "{\"model\":{\"input_shape\":[28,28,1],\"layers\":[{\"type\":\"flatten\"},"                      \
  "{\"type\":\"dense\",\"units\":16,\"activation\":\"relu\"},{\"type\":\"dense\",\"units\":10}]}," \
  "\"loss\":\"sparse_categorical_crossentropy\",\"metrics\":[\"accuracy\"],"                       \
  "\"dataset\":{\"name\":\"fashion-mnist\",\"validation\":\"none\"},"                              \
  "\"pipeline\":{\"batch_size\":32,\"take\":256},"                                                 \
  "\"optimizer\":{\"type\":\"sgd\",\"learning_rate\":0.05},\"epochs\":1,\"seed\":7,"               \
  "\"log_every_steps\":2}"

static json_t *create(const char *search) {
  char body[4096];
  snprintf(body, sizeof body, "{\"display_name\":\"it\",\"spec\":" BASE_SPEC ",\"search\":%s}",
           search);
  return call("POST", "/v1/experiments", body, 200);
}

static char *id_of(json_t *doc) {
  const char *id = json_string_value(json_object_get(doc, "id"));
  assert_non_null(id);
  char *copy = strdup(id);
  json_decref(doc);
  return copy;
}

/* Polls the experiment until it leaves RUNNING (fails after limit_s). */
static json_t *wait_done(const char *id, int limit_s) {
  char path[128];
  snprintf(path, sizeof path, "/v1/experiments/%s", id);
  for (int i = 0; i < limit_s * 5; i++) {
    json_t *e = call("GET", path, NULL, 200);
    if (strcmp(json_string_value(json_object_get(e, "state")), "RUNNING") != 0) return e;
    json_decref(e);
    usleep(200000);
  }
  fail_msg("experiment %s still RUNNING after %d s", id, limit_s);
  return NULL;
}

static json_t *trials_of(const char *id) {
  char path[128];
  snprintf(path, sizeof path, "/v1/experiments/%s/trials", id);
  json_t *doc = call("GET", path, NULL, 200);
  json_t *trials = json_incref(json_object_get(doc, "trials"));
  json_decref(doc);
  return trials;
}

static void cancel(const char *id) {
  char path[128];
  snprintf(path, sizeof path, "/v1/experiments/%s:cancel", id);
  json_decref(call("POST", path, "", 200));
}

static void grid_of_two_by_two_makes_exactly_four_trials_with_those_values(void **state) {
  (void)state;
  char *id = id_of(create(
      "{\"searcher\":\"grid\",\"metric\":\"epoch_loss\",\"max_concurrent_trials\":2,"
      "\"parameters\":{\"optimizer.learning_rate\":{\"type\":\"categorical\",\"values\":[0.01,"
      "0.1]},\"pipeline.batch_size\":{\"type\":\"categorical\",\"values\":[16,32]}}}"));
  json_t *e = wait_done(id, 120);
  assert_string_equal(json_string_value(json_object_get(e, "state")), "SUCCEEDED");
  assert_int_equal(json_integer_value(json_object_get(e, "trial_count")), 4);
  assert_int_equal(json_integer_value(json_object_get(e, "trials_done")), 4);
  json_t *best_trial = json_object_get(e, "best_trial");
  assert_true(json_is_object(best_trial));
  /* :best answers the same trial: the lowest epoch_loss of the four. */
  char best_path[128];
  snprintf(best_path, sizeof best_path, "/v1/experiments/%s:best", id);
  json_t *best = call("GET", best_path, NULL, 200);
  assert_true(json_equal(best, best_trial));
  json_decref(best);
  json_decref(e);
  json_t *trials = trials_of(id);
  assert_int_equal(json_array_size(trials), 4);
  int seen[2][2] = {{0, 0}, {0, 0}};
  for (size_t i = 0; i < 4; i++) {
    json_t *t = json_array_get(trials, i);
    json_t *v = json_object_get(t, "values");
    double lr = json_number_value(json_object_get(v, "optimizer.learning_rate"));
    long long bs = json_integer_value(json_object_get(v, "pipeline.batch_size"));
    assert_true(lr == 0.01 || lr == 0.1);
    assert_true(bs == 16 || bs == 32);
    seen[lr == 0.1][bs == 32]++;
    assert_string_equal(json_string_value(json_object_get(t, "trial_state")), "DONE");
    /* The trial's job trained with exactly those values and names its experiment. */
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", json_string_value(json_object_get(t, "job")));
    json_t *job = call("GET", path, NULL, 200);
    json_t *spec = json_object_get(job, "spec");
    assert_true(json_number_value(
                    json_object_get(json_object_get(spec, "optimizer"), "learning_rate")) == lr);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(spec, "pipeline"), "batch_size")), bs);
    assert_string_equal(json_string_value(json_object_get(job, "experiment")), id);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(job, "trial"), "index")),
                     (long long)i);
    json_decref(job);
  }
  for (int a = 0; a < 2; a++)
    for (int b = 0; b < 2; b++) assert_int_equal(seen[a][b], 1);
  double lowest = INFINITY;
  for (size_t i = 0; i < 4; i++) {
    double m = json_number_value(json_object_get(json_array_get(trials, i), "metric"));
    if (m < lowest) lowest = m;
  }
  snprintf(best_path, sizeof best_path, "/v1/experiments/%s:best", id);
  best = call("GET", best_path, NULL, 200);
  assert_true(json_number_value(json_object_get(best, "metric")) == lowest);
  json_decref(best);
  json_decref(trials);
  free(id);
}

static const char random_search[] =
    "{\"searcher\":\"random\",\"metric\":\"epoch_loss\",\"max_trials\":3,\"seed\":11,"
    "\"max_concurrent_trials\":2,\"parameters\":{"
    "\"optimizer.learning_rate\":{\"type\":\"log_uniform\",\"min\":0.001,\"max\":0.1},"
    "\"model.layers[1].units\":{\"type\":\"int_uniform\",\"min\":4,\"max\":32}}}";

static void
seeded_random_search_makes_the_same_trials_twice_and_waiting_trials_say_why(void **state) {
  (void)state;
  char *first = id_of(create(random_search));
  char *second = id_of(create(random_search));
  json_t *a = trials_of(first), *b = trials_of(second);
  assert_int_equal(json_array_size(a), 3);
  assert_int_equal(json_array_size(b), 3);
  for (size_t i = 0; i < 3; i++) {
    json_t *va = json_object_get(json_array_get(a, i), "values");
    json_t *vb = json_object_get(json_array_get(b, i), "values");
    assert_true(json_equal(va, vb));
    double lr = json_number_value(json_object_get(va, "optimizer.learning_rate"));
    long long units = json_integer_value(json_object_get(va, "model.layers[1].units"));
    assert_true(lr >= 0.001 && lr <= 0.1);
    assert_true(units >= 4 && units <= 32);
  }
  assert_false(json_equal(json_object_get(json_array_get(a, 0), "values"),
                          json_object_get(json_array_get(a, 1), "values")));
  /* Two trials of each were started on one device: a queued one says it
   * is a trial of its experiment. */
  int explained = 0;
  for (int round = 0; round < 50 && !explained; round++) {
    json_decref(b);
    b = trials_of(second);
    for (size_t i = 0; i < json_array_size(b) && !explained; i++) {
      json_t *t = json_array_get(b, i);
      if (strcmp(json_string_value(json_object_get(t, "state")), "QUEUED") != 0) continue;
      char path[128];
      snprintf(path, sizeof path, "/v1/jobs/%s:explain",
               json_string_value(json_object_get(t, "job")));
      json_t *ex = call("GET", path, NULL, 200);
      char *text = json_dumps(ex, 0);
      if (json_string_value(json_object_get(ex, "experiment")) &&
          strcmp(json_string_value(json_object_get(ex, "experiment")), second) == 0) {
        assert_non_null(strstr(text, "EXPERIMENT_TRIAL"));
        assert_non_null(strstr(text, second));
        explained = 1;
      }
      free(text);
      json_decref(ex);
    }
    if (!explained) usleep(100000);
  }
  assert_true(explained);
  cancel(first);
  cancel(second);
  json_t *e = wait_done(second, 5);
  assert_string_equal(json_string_value(json_object_get(e, "state")), "CANCELLED");
  json_decref(e);
  json_decref(a);
  json_decref(b);
  free(first);
  free(second);
}

/* Points of metric name of a job as (attempt, step, value), in order. */
static json_t *losses(const char *job) {
  char path[160];
  snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=loss", job);
  json_t *doc = call("GET", path, NULL, 200);
  json_t *points = json_incref(json_object_get(doc, "metrics"));
  json_decref(doc);
  return points;
}

static int count_reason(json_t *events, const char *reason) {
  int n = 0;
  for (size_t i = 0; i < json_array_size(events); i++)
    n += strcmp(json_string_value(json_object_get(json_array_get(events, i), "reason")), reason) ==
         0;
  return n;
}

static void asha_pauses_promotes_from_the_checkpoint_and_stops_the_rest(void **state) {
  (void)state;
  /* Rungs at 1 and 2 epochs, eta 2: of three trials one is promoted. */
  char *id = id_of(
      create("{\"searcher\":\"asha\",\"metric\":\"epoch_loss\",\"mode\":\"min\",\"max_trials\":3,"
             "\"seed\":3,\"parameters\":{\"optimizer.learning_rate\":{\"type\":\"categorical\","
             "\"values\":[0.02,0.05,0.1]}},"
             "\"asha\":{\"min_epochs\":1,\"max_epochs\":2,\"reduction_factor\":2}}"));
  json_t *e = wait_done(id, 120);
  assert_string_equal(json_string_value(json_object_get(e, "state")), "SUCCEEDED");
  assert_int_equal(json_integer_value(json_object_get(e, "trials_done")), 1);
  assert_int_equal(json_integer_value(json_object_get(e, "trials_stopped")), 2);
  assert_int_equal(json_integer_value(json_object_get(e, "trials_paused")), 0);
  /* 1 + 1 + 1 epochs at rung 0, then 1 more for the promoted one. */
  assert_int_equal(json_integer_value(json_object_get(e, "epochs_trained")), 4);
  json_decref(e);
  char path[128];
  snprintf(path, sizeof path, "/v1/experiments/%s/events", id);
  json_t *doc = call("GET", path, NULL, 200);
  json_t *events = json_object_get(doc, "events");
  assert_int_equal(count_reason(events, "TRIAL_PAUSED"), 3);
  assert_int_equal(count_reason(events, "TRIAL_PROMOTED"), 1);
  assert_int_equal(count_reason(events, "TRIAL_STOPPED"), 2);
  assert_int_equal(count_reason(events, "EXPERIMENT_DONE"), 1);
  json_decref(doc);

  json_t *trials = trials_of(id);
  const char *promoted = NULL;
  for (size_t i = 0; i < json_array_size(trials); i++) {
    json_t *t = json_array_get(trials, i);
    const char *ts = json_string_value(json_object_get(t, "trial_state"));
    if (strcmp(ts, "DONE") == 0) {
      promoted = json_string_value(json_object_get(t, "job"));
      assert_int_equal(json_integer_value(json_object_get(t, "epochs_trained")), 2);
      assert_int_equal(json_array_size(json_object_get(t, "rung_metrics")), 2);
    } else {
      assert_string_equal(ts, "STOPPED");
      assert_int_equal(json_integer_value(json_object_get(t, "epochs_trained")), 1);
    }
  }
  assert_non_null(promoted);
  /* The promoted job's first attempt trained epoch 1 (steps 2..8); its
   * second resumed from the checkpoint of step 8: its points go on at step
   * 10, and its first loss is not the first attempt's first (with the same
   * seed a fresh start would repeat that value exactly). */
  json_t *points = losses(promoted);
  double first1 = NAN, first2 = NAN;
  long long last_step1 = -1, first_step2 = -1;
  for (size_t i = 0; i < json_array_size(points); i++) {
    json_t *p = json_array_get(points, i);
    long long attempt = json_integer_value(json_object_get(p, "attempt"));
    long long step = json_integer_value(json_object_get(p, "step"));
    double v = json_number_value(json_object_get(p, "value"));
    if (attempt == 1) {
      if (isnan(first1)) first1 = v;
      last_step1 = step;
    } else if (attempt == 2 && first_step2 < 0) {
      first_step2 = step;
      first2 = v;
    }
  }
  assert_int_equal(last_step1, 8);
  assert_int_equal(first_step2, 10);
  assert_true(fabs(first2 - first1) > 1e-6);
  assert_true(first2 < first1);
  json_decref(points);
  json_decref(trials);
  free(id);
}

static void kilnd_killed_mid_experiment_finishes_it_after_a_restart(void **state) {
  (void)state;
  char *id = id_of(
      create("{\"searcher\":\"asha\",\"metric\":\"epoch_loss\",\"max_trials\":3,\"seed\":5,"
             "\"parameters\":{\"optimizer.learning_rate\":{\"type\":\"uniform\",\"min\":0.01,"
             "\"max\":0.1}},\"asha\":{\"min_epochs\":1,\"max_epochs\":2,\"reduction_factor\":2}}"));
  /* Once a trial has paused (or stopped) at its rung and another runs,
   * kill kilnd: the search's state is then only in the store. */
  char path[128];
  snprintf(path, sizeof path, "/v1/experiments/%s", id);
  int ready = 0;
  for (int i = 0; i < 600 && !ready; i++) {
    json_t *e = call("GET", path, NULL, 200);
    ready = json_integer_value(json_object_get(e, "trials_paused")) +
                    json_integer_value(json_object_get(e, "trials_stopped")) >=
                1 &&
            json_integer_value(json_object_get(e, "trials_running")) >= 1;
    json_decref(e);
    if (!ready) usleep(50000);
  }
  assert_true(ready);
  /* The paused trial's job stays while its experiment runs. */
  json_t *first = trials_of(id);
  snprintf(path, sizeof path, "/v1/jobs/%s",
           json_string_value(json_object_get(json_array_get(first, 0), "job")));
  json_t *refused = call("DELETE", path, NULL, 409);
  json_t *detail = json_array_get(json_object_get(json_object_get(refused, "error"), "details"), 0);
  assert_string_equal(json_string_value(json_object_get(detail, "field")), "experiment");
  json_decref(refused);
  json_decref(first);
  kill(kilnd_pid, SIGKILL);
  waitpid(kilnd_pid, NULL, 0);
  assert_int_equal(launch(), 0);
  json_t *e = wait_done(id, 120);
  assert_string_equal(json_string_value(json_object_get(e, "state")), "SUCCEEDED");
  /* Rung 1 is the last: each promoted trial ends DONE at 2 epochs, the
   * others STOPPED at 1 (the order results arrive in decides how many
   * are promoted, at least one). */
  long long done = json_integer_value(json_object_get(e, "trials_done"));
  assert_true(done >= 1);
  assert_int_equal(done + json_integer_value(json_object_get(e, "trials_stopped")), 3);
  assert_int_equal(json_integer_value(json_object_get(e, "epochs_trained")), 3 + done);
  json_decref(e);
  snprintf(path, sizeof path, "/v1/experiments/%s/events", id);
  json_t *doc = call("GET", path, NULL, 200);
  for (size_t i = 0; i < json_array_size(json_object_get(doc, "events")); i++) {
    json_t *ev = json_array_get(json_object_get(doc, "events"), i);
    print_message("%s %s\n", json_string_value(json_object_get(ev, "reason")),
                  json_string_value(json_object_get(ev, "message")));
  }
  assert_int_equal(count_reason(json_object_get(doc, "events"), "TRIAL_PROMOTED"), done);
  assert_int_equal(count_reason(json_object_get(doc, "events"), "TRIAL_CREATED"), 3);
  json_decref(doc);
  /* Each trial has one job, none made twice. */
  json_t *trials = trials_of(id);
  assert_int_equal(json_array_size(trials), 3);
  for (size_t i = 0; i < 3; i++) {
    const char *job = json_string_value(json_object_get(json_array_get(trials, i), "job"));
    for (size_t k = 0; k < i; k++)
      assert_string_not_equal(job,
                              json_string_value(json_object_get(json_array_get(trials, k), "job")));
  }
  json_decref(trials);
  free(id);
}

static void bad_searches_are_400s_naming_the_field(void **state) {
  (void)state;
  static const char *const cases[][2] = {
      {"{\"searcher\":\"bayesian\",\"metric\":\"val_loss\",\"parameters\":{\"epochs\":{\"type\":"
       "\"int_uniform\",\"min\":1,\"max\":2}}}",
       "search.searcher"},
      {"{\"searcher\":\"random\",\"metric\":\"val_loss\",\"parameters\":{"
       "\"optimizer.no_such_option\":{\"type\":\"uniform\",\"min\":0,\"max\":1}}}",
       "search.parameters.optimizer.no_such_option"},
      {"{\"searcher\":\"random\",\"metric\":\"val_loss\",\"parameters\":{"
       "\"model.layers[7].units\":{\"type\":\"int_uniform\",\"min\":1,\"max\":4}}}",
       "search.parameters.model.layers[7].units"},
      {"{\"searcher\":\"random\",\"metric\":\"val_loss\",\"parameters\":{"
       "\"optimizer.learning_rate\":{\"type\":\"log_uniform\",\"min\":0,\"max\":1}}}",
       "search.parameters.optimizer.learning_rate.min"},
      {"{\"searcher\":\"random\",\"metric\":\"val_loss\",\"max_concurrent_trials\":0,"
       "\"parameters\":{\"optimizer.learning_rate\":{\"type\":\"uniform\",\"min\":0.1,"
       "\"max\":0.2}}}",
       "search.max_concurrent_trials"},
      {"{\"searcher\":\"asha\",\"metric\":\"val_loss\",\"parameters\":{"
       "\"optimizer.learning_rate\":{\"type\":\"uniform\",\"min\":0.1,\"max\":0.2}}}",
       "search.asha"},
      {"{\"searcher\":\"random\",\"parameters\":{\"optimizer.learning_rate\":{\"type\":"
       "\"uniform\",\"min\":0.1,\"max\":0.2}}}",
       "search.metric"},
      {"{\"searcher\":\"grid\",\"metric\":\"val_loss\",\"parameters\":{"
       "\"pipeline.batch_size\":{\"type\":\"categorical\",\"values\":[]}}}",
       "search.parameters.pipeline.batch_size.values"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char body[4096];
    snprintf(body, sizeof body, "{\"spec\":" BASE_SPEC ",\"search\":%s}", cases[i][0]);
    json_t *err = call("POST", "/v1/experiments", body, 400);
    json_t *detail = json_array_get(json_object_get(json_object_get(err, "error"), "details"), 0);
    assert_string_equal(json_string_value(json_object_get(detail, "field")), cases[i][1]);
    json_decref(err);
  }
  /* A bad base spec is named under spec. */
  json_t *err = call("POST", "/v1/experiments",
                     "{\"spec\":{\"model\":{}},\"search\":{\"searcher\":\"grid\"}}", 400);
  json_t *detail = json_array_get(json_object_get(json_object_get(err, "error"), "details"), 0);
  assert_memory_equal(json_string_value(json_object_get(detail, "field")), "spec.", 5);
  json_decref(err);
  /* validate_only makes nothing; an unknown experiment is a 404. */
  char body[4096];
  snprintf(body, sizeof body, "{\"spec\":" BASE_SPEC ",\"search\":%s}", random_search);
  json_t *dry = call("POST", "/v1/experiments?validate_only=true", body, 200);
  assert_null(json_object_get(dry, "id"));
  assert_int_equal(json_integer_value(json_object_get(dry, "trial_count")), 3);
  json_decref(dry);
  json_decref(call("GET", "/v1/experiments/20260101-0000000000000000", NULL, 404));
}

/* ---- kiln exp ---- */

/* A tenant's quota binds its trials as it binds the jobs it submits: with
 * max_devices 1, a search of three 1-device trials, three at a time, never
 * has more than one trial's job unfinished, and still finishes them all. */
static void trials_wait_for_their_tenants_quota(void **state) {
  (void)state;
  json_t *probe =
      create("{\"searcher\":\"grid\",\"metric\":\"epoch_loss\",\"parameters\":{"
             "\"optimizer.learning_rate\":{\"type\":\"categorical\",\"values\":[0.05]}}}");
  char tenant[64], quota_path[128];
  snprintf(tenant, sizeof tenant, "%s", json_string_value(json_object_get(probe, "tenant")));
  char *probe_id = id_of(probe);
  json_decref(wait_done(probe_id, 120));
  free(probe_id);
  snprintf(quota_path, sizeof quota_path, "/v1/tenants/%s/quota", tenant);
  json_decref(call("PUT", quota_path, "{\"max_devices\":1}", 200));
  char *id = id_of(create(
      "{\"searcher\":\"grid\",\"metric\":\"epoch_loss\",\"max_concurrent_trials\":3,"
      "\"parameters\":{\"optimizer.learning_rate\":{\"type\":\"categorical\",\"values\":[0.01,"
      "0.02,0.03]}}}"));
  char path[128];
  snprintf(path, sizeof path, "/v1/experiments/%s", id);
  int most = 0, done = 0;
  for (int i = 0; i < 600 && !done; i++) {
    json_t *trials = trials_of(id);
    int running = 0;
    for (size_t k = 0; k < json_array_size(trials); k++) {
      const char *ts = json_string_value(json_object_get(json_array_get(trials, k), "trial_state"));
      running += ts && (!strcmp(ts, "RUNNING") || !strcmp(ts, "PROMOTED"));
    }
    json_decref(trials);
    if (running > most) most = running;
    json_t *e = call("GET", path, NULL, 200);
    done = strcmp(json_string_value(json_object_get(e, "state")), "RUNNING") != 0;
    json_decref(e);
    if (!done) usleep(200000);
  }
  json_decref(call("PUT", quota_path, "{\"max_devices\":0}", 200));
  assert_true(done);
  if (most != 1) fail_msg("%d trials' jobs were unfinished at once under max_devices 1", most);
  json_t *e = call("GET", path, NULL, 200);
  assert_string_equal(json_string_value(json_object_get(e, "state")), "SUCCEEDED");
  assert_int_equal(json_integer_value(json_object_get(e, "trials_done")), 3);
  json_decref(e);
  free(id);
}

static int cli(char *out, size_t outlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int cli(char *out, size_t outlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int status = it_vkiln(KILN_CLI_PATH, data_dir, base_url, token, out, outlen, fmt, ap);
  va_end(ap);
  return status;
}

static void kiln_exp_creates_waits_gates_lists_and_cancels(void **state) {
  (void)state;
  char file[400], out[65536];
  snprintf(file, sizeof file, "%s/exp.json", data_dir);
  char body[4096];
  snprintf(body, sizeof body,
           "{\"display_name\":\"cli-exp\",\"spec\":" BASE_SPEC ",\"search\":{\"searcher\":\"grid\","
           "\"metric\":\"epoch_accuracy\",\"parameters\":{\"optimizer.learning_rate\":{"
           "\"type\":\"categorical\",\"values\":[0.05,0.1]}}}}");
  assert_int_equal(it_write_file(file, body, 0600), 0);
  /* Met: the best trial's accuracy is above 0 and the gate passes. */
  assert_int_equal(cli(out, sizeof out, "exp create exp.json --wait --require 'epoch_accuracy>0'"),
                   0);
  assert_non_null(strstr(out, "SUCCEEDED"));
  assert_non_null(strstr(out, "met (epoch_accuracy"));
  /* Not met: exit 5, for CI. */
  assert_int_equal(
      cli(out, sizeof out, "exp create exp.json --wait --require 'epoch_accuracy>=1.5' 2>&1"), 5);
  assert_non_null(strstr(out, "NOT MET"));
  /* ls shows both; get and best read one. */
  assert_int_equal(cli(out, sizeof out, "exp ls --state succeeded"), 0);
  assert_true(strstr(out, "cli-exp") != NULL && strstr(out, "grid") != NULL);
  assert_int_equal(cli(out, sizeof out, "exp create exp.json 2>/dev/null"), 0);
  char id[64];
  snprintf(id, sizeof id, "%.*s", (int)strcspn(out, "\n"), out);
  assert_int_equal(cli(out, sizeof out, "exp get %s", id), 0);
  assert_non_null(strstr(out, "optimizer.learning_rate=0.05"));
  assert_int_equal(cli(out, sizeof out, "exp cancel %s", id), 0);
  assert_non_null(strstr(out, "CANCELLED"));
  assert_int_equal(cli(out, sizeof out, "exp cancel %s 2>&1", id), 1);
  assert_non_null(strstr(out, "FAILED_PRECONDITION"));
  assert_int_equal(cli(out, sizeof out, "exp best 20260101-0000000000000000 2>&1"), 1);
  assert_non_null(strstr(out, "NOT_FOUND"));
  /* Usage errors exit 2. */
  assert_int_equal(cli(out, sizeof out, "exp create 2>&1"), 2);
  assert_int_equal(cli(out, sizeof out, "exp frobnicate x 2>&1"), 2);
  assert_int_equal(cli(out, sizeof out, "exp create no-such-file.json 2>&1"), 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(bad_searches_are_400s_naming_the_field),
      cmocka_unit_test(grid_of_two_by_two_makes_exactly_four_trials_with_those_values),
      cmocka_unit_test(seeded_random_search_makes_the_same_trials_twice_and_waiting_trials_say_why),
      cmocka_unit_test(asha_pauses_promotes_from_the_checkpoint_and_stops_the_rest),
      cmocka_unit_test(kilnd_killed_mid_experiment_finishes_it_after_a_restart),
      cmocka_unit_test(kiln_exp_creates_waits_gates_lists_and_cancels),
      cmocka_unit_test(trials_wait_for_their_tenants_quota),
  };
  return cmocka_run_group_tests(tests, start, stop);
}
