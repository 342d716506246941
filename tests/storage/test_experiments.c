/* test_experiments.c — storage/ for experiments: created with their
 * trials, a trial started with its job in one transaction (the job names
 * its experiment), rung results appended, a paused trial promoted (its
 * job's spec and state change with it), conflicts once the experiment
 * has ended, and events in order. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"

static void create_experiment(store *s, const char *id, const char *request_id, int n_trials) {
  store_experiment e;
  memset(&e, 0, sizeof e);
  snprintf(e.id, sizeof e.id, "%s", id);
  snprintf(e.tenant, sizeof e.tenant, "acme");
  if (request_id) snprintf(e.request_id, sizeof e.request_id, "%s", request_id);
  e.spec_json = "{\"epochs\":1}";
  e.search_json = "{\"searcher\":\"asha\"}";
  store_trial trials[4];
  memset(trials, 0, sizeof trials);
  char values[4][32];
  for (int i = 0; i < n_trials; i++) {
    trials[i].index = i;
    snprintf(values[i], sizeof values[i], "{\"lr\":%d}", i + 1);
    trials[i].values_json = values[i];
  }
  assert_int_equal(store_experiment_create(s, &e, trials, n_trials, NULL), STORE_OK);
}

static void start_trial(store *s, const char *experiment, int index, const char *job_id) {
  store_job job;
  memset(&job, 0, sizeof job);
  snprintf(job.id, sizeof job.id, "%s", job_id);
  snprintf(job.tenant, sizeof job.tenant, "acme");
  job.spec_json = "{\"epochs\":1}";
  assert_int_equal(store_trial_start(s, experiment, index, &job, "started"), STORE_OK);
}

static void trials_start_pause_and_promote_with_their_jobs(void **state) {
  fixture *f = *state;
  create_experiment(f->s, "exp-1", "req-1", 3);
  store_trial *trials = NULL;
  int n = 0;
  assert_int_equal(store_trial_list(f->s, "exp-1", 0, 0, &trials, &n), STORE_OK);
  assert_int_equal(n, 3);
  assert_string_equal(trials[2].values_json, "{\"lr\":3}");
  assert_string_equal(trials[0].state, "WAITING");
  assert_string_equal(trials[0].job_id, "");
  store_trial_list_free(trials, n);

  start_trial(f->s, "exp-1", 0, "job-a");
  store_job job;
  assert_int_equal(store_job_get(f->s, "job-a", &job), STORE_OK);
  assert_string_equal(job.experiment, "exp-1");
  store_job_clear(&job);
  /* Twice is a conflict: the trial is no longer WAITING. */
  store_job again = {.id = "job-b", .spec_json = "{}"};
  assert_int_equal(store_trial_start(f->s, "exp-1", 0, &again, ""), STORE_CONFLICT);
  assert_int_equal(store_job_get(f->s, "job-b", &job), STORE_NOT_FOUND);

  /* The job finishes its rung: the trial pauses with its result. */
  assert_int_equal(store_job_transition(f->s, "job-a", NULL, "SUCCEEDED", "COMPLETED", ""),
                   STORE_OK);
  double result = 0.75;
  assert_int_equal(store_trial_update(f->s, "exp-1", 0, "RUNNING", "PAUSED", 1, &result,
                                      "TRIAL_PAUSED", "rung 0"),
                   STORE_OK);
  store_trial t;
  assert_int_equal(store_trial_of_job(f->s, "job-a", &t), STORE_OK);
  assert_string_equal(t.state, "PAUSED");
  assert_string_equal(t.job_state, "SUCCEEDED");
  assert_int_equal(t.n_results, 1);
  assert_true(t.results[0] == 0.75);
  assert_int_equal(t.epochs, 1);
  free(t.values_json);

  assert_int_equal(store_trial_promote(f->s, "exp-1", 0, "{\"epochs\":3}", 1, "promoted"),
                   STORE_OK);
  assert_int_equal(store_job_get(f->s, "job-a", &job), STORE_OK);
  assert_string_equal(job.state, "QUEUED");
  assert_string_equal(job.reason, "TRIAL_PROMOTED");
  assert_string_equal(job.spec_json, "{\"epochs\":3}");
  store_job_clear(&job);
  assert_int_equal(store_trial_of_job(f->s, "job-a", &t), STORE_OK);
  assert_string_equal(t.state, "PROMOTED");
  assert_int_equal(t.rung, 1);
  free(t.values_json);
  /* A second result is appended after the first. */
  result = 0.8125;
  assert_int_equal(store_trial_update(f->s, "exp-1", 0, "PROMOTED", "DONE", 3, &result, NULL, NULL),
                   STORE_OK);
  assert_int_equal(store_trial_of_job(f->s, "job-a", &t), STORE_OK);
  assert_int_equal(t.n_results, 2);
  assert_true(t.results[0] == 0.75 && t.results[1] == 0.8125);
  free(t.values_json);

  store_experiment_event *events = NULL;
  assert_int_equal(store_experiment_events(f->s, "exp-1", &events, &n), STORE_OK);
  assert_int_equal(n, 4);
  assert_string_equal(events[0].reason, "EXPERIMENT_CREATED");
  assert_string_equal(events[1].reason, "TRIAL_CREATED");
  assert_string_equal(events[1].job_id, "job-a");
  assert_string_equal(events[2].reason, "TRIAL_PAUSED");
  assert_string_equal(events[3].reason, "TRIAL_PROMOTED");
  store_experiment_events_free(events, n);
}

static void an_ended_experiment_starts_no_trial(void **state) {
  fixture *f = *state;
  create_experiment(f->s, "exp-2", NULL, 2);
  char(*running)[40] = NULL;
  int n = 0;
  assert_int_equal(store_experiment_running(f->s, &running, &n), STORE_OK);
  assert_int_equal(n, 1);
  free(running);
  assert_int_equal(
      store_experiment_finish(f->s, "exp-2", "CANCELLED", "EXPERIMENT_CANCELLED", "by a test"),
      STORE_OK);
  assert_int_equal(store_experiment_finish(f->s, "exp-2", "SUCCEEDED", NULL, ""), STORE_CONFLICT);
  store_job job = {.id = "job-c", .spec_json = "{}"};
  assert_int_equal(store_trial_start(f->s, "exp-2", 0, &job, ""), STORE_CONFLICT);
  store_experiment e;
  assert_int_equal(store_experiment_get(f->s, "exp-2", &e), STORE_OK);
  assert_string_equal(e.state, "CANCELLED");
  assert_true(e.end_ms > 0);
  store_experiment_clear(&e);
  assert_int_equal(store_experiment_running(f->s, &running, &n), STORE_OK);
  assert_int_equal(n, 0);
}

static void request_id_answers_the_first_experiment_and_lists_page(void **state) {
  fixture *f = *state;
  create_experiment(f->s, "exp-3", "same", 1);
  store_experiment e;
  memset(&e, 0, sizeof e);
  snprintf(e.id, sizeof e.id, "exp-4");
  snprintf(e.tenant, sizeof e.tenant, "acme");
  snprintf(e.request_id, sizeof e.request_id, "same");
  e.spec_json = "{}";
  e.search_json = "{}";
  store_experiment existing;
  assert_int_equal(store_experiment_create(f->s, &e, NULL, 0, &existing), STORE_EXISTS);
  assert_string_equal(existing.id, "exp-3");
  store_experiment_clear(&existing);
  char id[40];
  assert_int_equal(store_experiment_find_request(f->s, "acme", "same", id), STORE_OK);
  assert_string_equal(id, "exp-3");
  assert_int_equal(store_experiment_find_request(f->s, "other", "same", id), STORE_NOT_FOUND);
  create_experiment(f->s, "exp-5", NULL, 1);
  store_experiment *list = NULL;
  int n = 0;
  assert_int_equal(store_experiment_list(f->s, "acme", NULL, 0, 1, &list, &n), STORE_OK);
  assert_int_equal(n, 1);
  assert_string_equal(list[0].id, "exp-5");
  int64_t next = list[0].seq;
  store_experiment_list_free(list, n);
  assert_int_equal(store_experiment_list(f->s, "acme", "RUNNING", next, 10, &list, &n), STORE_OK);
  assert_int_equal(n, 1);
  assert_string_equal(list[0].id, "exp-3");
  store_experiment_list_free(list, n);
  assert_int_equal(store_experiment_list(f->s, "other", NULL, 0, 10, &list, &n), STORE_OK);
  assert_int_equal(n, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(trials_start_pause_and_promote_with_their_jobs, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(an_ended_experiment_starts_no_trial, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(request_id_answers_the_first_experiment_and_lists_page,
                                      fixture_setup, fixture_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
