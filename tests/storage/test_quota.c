/* test_quota.c — storage/ for limits: a tenant's quota set, kept apart
 * from another's and reset to the default; what a tenant uses (waiting
 * jobs, devices of unfinished jobs, uploads plus checkpoints); and an
 * infrastructure requeue, which moves a job through PREEMPTED to QUEUED in
 * one transaction and counts it in infra_restarts, never in restarts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"

static void create(store *s, const char *id, const char *tenant, int devices) {
  store_job job;
  memset(&job, 0, sizeof job);
  snprintf(job.id, sizeof job.id, "%s", id);
  snprintf(job.tenant, sizeof job.tenant, "%s", tenant);
  job.spec_json = "{}";
  job.priority = 50;
  job.devices = devices;
  job.planned_memory_bytes = 123456;
  assert_int_equal(store_job_create(s, &job, NULL), STORE_OK);
}

static void quota_is_per_tenant_and_unset_fields_are_the_default(void **state) {
  fixture *f = *state;
  store_quota q;
  assert_int_equal(store_quota_get(f->s, "acme", &q), STORE_OK);
  assert_int_equal(q.max_priority, STORE_QUOTA_DEFAULT);
  assert_int_equal(q.max_storage_bytes, STORE_QUOTA_DEFAULT);
  store_quota set = {.max_priority = 90,
                     .max_devices = 4,
                     .max_queued_jobs = STORE_QUOTA_DEFAULT,
                     .max_storage_bytes = (int64_t)1 << 40};
  assert_int_equal(store_quota_put(f->s, "acme", &set), STORE_OK);
  assert_int_equal(store_quota_get(f->s, "acme", &q), STORE_OK);
  assert_int_equal(q.max_priority, 90);
  assert_int_equal(q.max_devices, 4);
  assert_int_equal(q.max_queued_jobs, STORE_QUOTA_DEFAULT);
  assert_int_equal(q.max_storage_bytes, (int64_t)1 << 40);
  assert_int_equal(store_quota_get(f->s, "beta", &q), STORE_OK);
  assert_int_equal(q.max_priority, STORE_QUOTA_DEFAULT);
  set.max_priority = STORE_QUOTA_DEFAULT;
  assert_int_equal(store_quota_put(f->s, "acme", &set), STORE_OK);
  assert_int_equal(store_quota_get(f->s, "acme", &q), STORE_OK);
  assert_int_equal(q.max_priority, STORE_QUOTA_DEFAULT);
  assert_int_equal(q.max_devices, 4);
}

static void usage_counts_waiting_jobs_unfinished_devices_and_stored_bytes(void **state) {
  fixture *f = *state;
  create(f->s, "a1", "acme", 2);
  create(f->s, "a2", "acme", 3);
  create(f->s, "a3", "acme", 1);
  create(f->s, "b1", "beta", 8);
  store_job job;
  assert_int_equal(store_job_claim(f->s, "a1", &job), STORE_OK); /* STARTING: not waiting */
  assert_int_equal(job.planned_memory_bytes, 123456);
  store_job_clear(&job);
  assert_int_equal(store_job_transition(f->s, "a3", "QUEUED", "CANCELLED", "CANCELLED", ""),
                   STORE_OK);
  store_checkpoint c;
  memset(&c, 0, sizeof c);
  snprintf(c.job_id, sizeof c.job_id, "a1");
  snprintf(c.path, sizeof c.path, "/x/ckpt-1.safetensors");
  c.bytes = 5000;
  c.step = 1;
  assert_int_equal(store_checkpoint_add(f->s, &c), STORE_OK);
  c.bytes = 7000;
  snprintf(c.job_id, sizeof c.job_id, "b1");
  assert_int_equal(store_checkpoint_add(f->s, &c), STORE_OK);
  store_dataset d;
  memset(&d, 0, sizeof d);
  snprintf(d.id, sizeof d.id, "ds-1");
  snprintf(d.format, sizeof d.format, "csv");
  snprintf(d.tenant, sizeof d.tenant, "acme");
  d.bytes = 300;
  assert_int_equal(store_dataset_add(f->s, &d), STORE_OK);
  /* A registered server folder is no tenant's storage. */
  snprintf(d.id, sizeof d.id, "ds-2");
  snprintf(d.format, sizeof d.format, "tfrecord");
  snprintf(d.source, sizeof d.source, "shards/big");
  d.bytes = 1 << 30;
  assert_int_equal(store_dataset_add(f->s, &d), STORE_OK);
  store_usage u;
  assert_int_equal(store_usage_get(f->s, "acme", &u), STORE_OK);
  assert_int_equal(u.queued_jobs, 1);      /* a2 */
  assert_int_equal(u.devices, 2 + 3);      /* a1 and a2; a3 ended */
  assert_int_equal(u.storage_bytes, 5300); /* a1's checkpoint and the upload */
  assert_int_equal(store_usage_get(f->s, "beta", &u), STORE_OK);
  assert_int_equal(u.storage_bytes, 7000);
  assert_int_equal(u.devices, 8);
}

static void requeue_goes_through_preempted_in_one_step_as_an_infra_restart(void **state) {
  fixture *f = *state;
  create(f->s, "p1", "acme", 1);
  store_job job;
  assert_int_equal(store_job_claim(f->s, "p1", &job), STORE_OK);
  store_job_clear(&job);
  assert_int_equal(store_job_transition(f->s, "p1", "STARTING", "RUNNING", "STARTED", ""),
                   STORE_OK);
  assert_int_equal(
      store_job_requeue(f->s, "p1", "PREEMPTED", "PREEMPTED", "outranked", "REQUEUED", "waits"),
      STORE_OK);
  assert_int_equal(store_job_get(f->s, "p1", &job), STORE_OK);
  assert_string_equal(job.state, "QUEUED");
  assert_string_equal(job.reason, "REQUEUED");
  assert_int_equal(job.infra_restarts, 1);
  assert_int_equal(job.restarts, 0);
  store_job_clear(&job);
  store_event *events;
  int n;
  assert_int_equal(store_event_list(f->s, "p1", &events, &n), STORE_OK);
  assert_true(n >= 2);
  assert_string_equal(events[n - 2].from_state, "RUNNING");
  assert_string_equal(events[n - 2].to_state, "PREEMPTED");
  assert_string_equal(events[n - 1].from_state, "PREEMPTED");
  assert_string_equal(events[n - 1].to_state, "QUEUED");
  store_event_list_free(events, n);
  /* A retry after a failure counts in restarts instead. */
  assert_int_equal(store_job_retry(f->s, "p1", 0, "RETRYING", "crashed"), STORE_OK);
  assert_int_equal(store_job_get(f->s, "p1", &job), STORE_OK);
  assert_int_equal(job.restarts, 1);
  assert_int_equal(job.infra_restarts, 1);
  store_job_clear(&job);
  /* A finished job is not requeued. */
  assert_int_equal(store_job_transition(f->s, "p1", NULL, "CANCELLED", "CANCELLED", ""), STORE_OK);
  assert_int_equal(store_job_requeue(f->s, "p1", NULL, NULL, NULL, "SERVER_SHUTDOWN", ""),
                   STORE_CONFLICT);
  assert_int_equal(store_job_requeue(f->s, "nope", NULL, NULL, NULL, "SERVER_SHUTDOWN", ""),
                   STORE_NOT_FOUND);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(quota_is_per_tenant_and_unset_fields_are_the_default,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(usage_counts_waiting_jobs_unfinished_devices_and_stored_bytes,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(
          requeue_goes_through_preempted_in_one_step_as_an_infra_restart, fixture_setup,
          fixture_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
