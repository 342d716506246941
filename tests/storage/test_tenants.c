/* test_tenants.c — storage/ for the service: jobs scoped to tenants
 * (request_id per tenant, tenant-filtered pages both ways), deletion of
 * finished jobs with their rows, tokens by hash, per-state counts, queue
 * position and the metric stream after a sequence number. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fixture.h"

static void create(store *s, const char *id, const char *tenant, const char *request_id,
                   int priority, int expect_rc, store_job *existing) {
  store_job job;
  memset(&job, 0, sizeof job);
  snprintf(job.id, sizeof job.id, "%s", id);
  snprintf(job.tenant, sizeof job.tenant, "%s", tenant);
  snprintf(job.request_id, sizeof job.request_id, "%s", request_id ? request_id : "");
  job.spec_json = "{}";
  job.priority = priority;
  int rc = store_job_create(s, &job, existing);
  if (rc != expect_rc)
    fail_msg("create %s: got %d want %d: %s", id, rc, expect_rc, store_errmsg(s));
}

static void request_id_is_unique_per_tenant_only(void **state) {
  fixture *f = *state;
  store_job existing;
  create(f->s, "a1", "acme", "r-1", 50, STORE_OK, NULL);
  /* Another tenant's same key makes its own job, never finds acme's. */
  create(f->s, "b1", "beta", "r-1", 50, STORE_OK, NULL);
  create(f->s, "a2", "acme", "r-1", 50, STORE_EXISTS, &existing);
  assert_string_equal(existing.id, "a1");
  assert_string_equal(existing.tenant, "acme");
  store_job_clear(&existing);
  create(f->s, "b2", "beta", "r-1", 50, STORE_EXISTS, &existing);
  assert_string_equal(existing.id, "b1");
  store_job_clear(&existing);
  create(f->s, "d1", "", NULL, 50, STORE_OK, NULL);
  store_job got;
  assert_int_equal(store_job_get(f->s, "d1", &got), STORE_OK);
  assert_string_equal(got.tenant, STORE_DEFAULT_TENANT);
  store_job_clear(&got);
}

/* Pages of limit 3 over 10 jobs of one tenant among another's: each exactly once, in order. */
static void query_pages_one_tenant_each_way_exactly_once(void **state) {
  fixture *f = *state;
  for (int i = 0; i < 10; i++) {
    char id[16];
    snprintf(id, sizeof id, "a%02d", i);
    create(f->s, id, "acme", NULL, 50, STORE_OK, NULL);
    snprintf(id, sizeof id, "b%02d", i);
    create(f->s, id, "beta", NULL, 50, STORE_OK, NULL);
  }
  for (int ascending = 0; ascending <= 1; ascending++) {
    int seen = 0;
    store_job_query q = {.tenant = "acme", .ascending = ascending, .limit = 3};
    for (;;) {
      store_job *jobs = NULL;
      int n = 0;
      assert_int_equal(store_job_query_list(f->s, &q, &jobs, &n), STORE_OK);
      for (int i = 0; i < n; i++) {
        char want[16];
        snprintf(want, sizeof want, "a%02d", ascending ? seen : 9 - seen);
        assert_string_equal(jobs[i].id, want);
        assert_string_equal(jobs[i].tenant, "acme");
        seen++;
      }
      if (n == 0) break;
      q.after_seq = jobs[n - 1].seq;
      store_job_list_free(jobs, n);
    }
    assert_int_equal(seen, 10);
  }
  store_job *jobs = NULL;
  int n = 0;
  store_job_query all = {.state = "QUEUED", .limit = 100};
  assert_int_equal(store_job_query_list(f->s, &all, &jobs, &n), STORE_OK);
  assert_int_equal(n, 20);
  store_job_list_free(jobs, n);
  store_job_query none = {.state = "RUNNING", .limit = 100};
  assert_int_equal(store_job_query_list(f->s, &none, &jobs, &n), STORE_OK);
  assert_int_equal(n, 0);
}

static void delete_takes_only_finished_jobs_with_their_rows(void **state) {
  fixture *f = *state;
  create(f->s, "j1", "acme", NULL, 50, STORE_OK, NULL);
  assert_int_equal(store_job_delete(f->s, "j1"), STORE_CONFLICT);
  assert_non_null(strstr(store_errmsg(f->s), "QUEUED"));
  store_metric m = {.attempt = 1, .step = 1, .value = 0.5};
  snprintf(m.name, sizeof m.name, "loss");
  assert_int_equal(store_metrics_append(f->s, "j1", &m, 1), STORE_OK);
  assert_int_equal(store_job_transition(f->s, "j1", NULL, "CANCELLED", "CANCELLED", "by test"),
                   STORE_OK);
  assert_int_equal(store_job_delete(f->s, "j1"), STORE_OK);
  store_job got;
  assert_int_equal(store_job_get(f->s, "j1", &got), STORE_NOT_FOUND);
  store_metric *points = NULL;
  int n = -1;
  assert_int_equal(store_metrics_list(f->s, "j1", NULL, &points, &n), STORE_OK);
  assert_int_equal(n, 0);
  store_event *events = NULL;
  assert_int_equal(store_event_list(f->s, "j1", &events, &n), STORE_OK);
  assert_int_equal(n, 0);
  assert_int_equal(store_job_delete(f->s, "j1"), STORE_NOT_FOUND);
}

static void tokens_are_found_by_hash_and_never_twice(void **state) {
  fixture *f = *state;
  const char *hash = "aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11";
  int64_t n = -1;
  assert_int_equal(store_token_count(f->s, &n), STORE_OK);
  assert_int_equal(n, 0);
  store_token t = {.id = "tok-1", .tenant = "acme", .role = "user"};
  assert_int_equal(store_token_add(f->s, &t, hash), STORE_OK);
  store_token other = {.id = "tok-2", .tenant = "beta", .role = "user"};
  assert_int_equal(store_token_add(f->s, &other, hash), STORE_EXISTS);
  store_token bad_role = {.id = "tok-3", .tenant = "beta", .role = "root"};
  assert_int_equal(
      store_token_add(f->s, &bad_role,
                      "bb11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11"),
      STORE_ERROR);
  assert_non_null(strstr(store_errmsg(f->s), "root"));
  store_token got;
  assert_int_equal(store_token_find(f->s, hash, &got), STORE_OK);
  assert_string_equal(got.id, "tok-1");
  assert_string_equal(got.tenant, "acme");
  assert_string_equal(got.role, "user");
  assert_true(got.create_ms > 0);
  assert_int_equal(
      store_token_find(f->s, "cc11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11",
                       &got),
      STORE_NOT_FOUND);
  assert_int_equal(store_token_count(f->s, &n), STORE_OK);
  assert_int_equal(n, 1);
}

static void counts_and_queue_position_follow_the_claim_order(void **state) {
  fixture *f = *state;
  create(f->s, "low", "acme", NULL, 10, STORE_OK, NULL);
  create(f->s, "high", "acme", NULL, 90, STORE_OK, NULL);
  create(f->s, "mid1", "beta", NULL, 50, STORE_OK, NULL);
  create(f->s, "mid2", "beta", NULL, 50, STORE_OK, NULL);
  int64_t ahead = -1;
  assert_int_equal(store_job_queue_ahead(f->s, "high", &ahead), STORE_OK);
  assert_int_equal(ahead, 0);
  assert_int_equal(store_job_queue_ahead(f->s, "mid2", &ahead), STORE_OK);
  assert_int_equal(ahead, 2);
  assert_int_equal(store_job_queue_ahead(f->s, "low", &ahead), STORE_OK);
  assert_int_equal(ahead, 3);
  assert_int_equal(store_job_claim_next(f->s, NULL), STORE_OK); /* takes "high" */
  assert_int_equal(store_job_queue_ahead(f->s, "low", &ahead), STORE_OK);
  assert_int_equal(ahead, 2);
  int64_t counts[8];
  assert_int_equal(store_job_count_by_state(f->s, counts), STORE_OK);
  assert_int_equal(counts[0], 3); /* QUEUED */
  assert_int_equal(counts[1], 1); /* STARTING */
  for (int i = 2; i < 8; i++) assert_int_equal(counts[i], 0);
}

static void metrics_since_resumes_after_the_last_seq_without_gaps(void **state) {
  fixture *f = *state;
  create(f->s, "j", "acme", NULL, 50, STORE_OK, NULL);
  store_metric batch[10];
  memset(batch, 0, sizeof batch);
  for (int i = 0; i < 10; i++) {
    batch[i].attempt = 1;
    batch[i].step = i + 1;
    batch[i].value = i;
    snprintf(batch[i].name, sizeof batch[i].name, "loss");
  }
  assert_int_equal(store_metrics_append(f->s, "j", batch, 10), STORE_OK);
  store_metric *first = NULL, *rest = NULL;
  int n1 = 0, n2 = 0;
  assert_int_equal(store_metrics_since(f->s, "j", 0, 4, &first, &n1), STORE_OK);
  assert_int_equal(n1, 4);
  assert_int_equal(store_metrics_since(f->s, "j", first[n1 - 1].seq, 100, &rest, &n2), STORE_OK);
  assert_int_equal(n2, 6);
  for (int i = 0; i < n1; i++) assert_int_equal(first[i].step, i + 1);
  for (int i = 0; i < n2; i++) {
    assert_int_equal(rest[i].step, n1 + i + 1);
    assert_true(rest[i].seq > (i ? rest[i - 1].seq : first[n1 - 1].seq));
  }
  free(first);
  free(rest);
}

static void retry_waits_out_its_backoff_before_a_claim(void **state) {
  fixture *f = *state;
  create(f->s, "crashy", "acme", NULL, 50, STORE_OK, NULL);
  store_job job;
  assert_int_equal(store_job_claim_next(f->s, &job), STORE_OK);
  store_job_clear(&job);
  assert_int_equal(store_job_transition(f->s, "crashy", "STARTING", "RUNNING", "STARTED", ""),
                   STORE_OK);
  int64_t later = store_now_ms() + 400;
  assert_int_equal(store_job_retry(f->s, "crashy", later, "RETRYING", "attempt 1 crashed"),
                   STORE_OK);
  assert_int_equal(store_job_get(f->s, "crashy", &job), STORE_OK);
  assert_string_equal(job.state, "QUEUED");
  assert_string_equal(job.reason, "RETRYING");
  store_job_clear(&job);
  /* Not before its time, then once. */
  assert_int_equal(store_job_claim_next(f->s, NULL), STORE_EMPTY);
  usleep(500 * 1000);
  assert_int_equal(store_job_claim_next(f->s, &job), STORE_OK);
  assert_string_equal(job.id, "crashy");
  assert_int_equal(job.attempt, 2);
  store_job_clear(&job);
  assert_int_equal(store_job_transition(f->s, "crashy", NULL, "FAILED", "X", ""), STORE_OK);
  assert_int_equal(store_job_retry(f->s, "crashy", 0, "RETRYING", ""), STORE_CONFLICT);
  assert_int_equal(store_job_retry(f->s, "nobody", 0, "RETRYING", ""), STORE_NOT_FOUND);
}

/* Same priority: the tenant that has started fewer jobs lately goes first. */
static void claim_shares_between_tenants_at_equal_priority(void **state) {
  fixture *f = *state;
  create(f->s, "a1", "acme", NULL, 50, STORE_OK, NULL);
  create(f->s, "a2", "acme", NULL, 50, STORE_OK, NULL);
  create(f->s, "a3", "acme", NULL, 50, STORE_OK, NULL);
  create(f->s, "b1", "beta", NULL, 50, STORE_OK, NULL);
  create(f->s, "b2", "beta", NULL, 50, STORE_OK, NULL);
  create(f->s, "urgent", "acme", NULL, 90, STORE_OK, NULL);
  const char *want[] = {"urgent", "b1", "a1", "b2", "a2", "a3"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    store_job job;
    assert_int_equal(store_job_claim_next(f->s, &job), STORE_OK);
    if (strcmp(job.id, want[i]) != 0) fail_msg("claim %zu took %s, want %s", i, job.id, want[i]);
    /* Starting is what counts against a tenant. */
    assert_int_equal(store_job_transition(f->s, job.id, "STARTING", "RUNNING", "STARTED", ""),
                     STORE_OK);
    store_job_clear(&job);
  }
  assert_int_equal(store_job_claim_next(f->s, NULL), STORE_EMPTY);
}

#define TEST(name) cmocka_unit_test_setup_teardown(name, fixture_setup, fixture_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      TEST(request_id_is_unique_per_tenant_only),
      TEST(query_pages_one_tenant_each_way_exactly_once),
      TEST(delete_takes_only_finished_jobs_with_their_rows),
      TEST(tokens_are_found_by_hash_and_never_twice),
      TEST(counts_and_queue_position_follow_the_claim_order),
      TEST(metrics_since_resumes_after_the_last_seq_without_gaps),
      TEST(retry_waits_out_its_backoff_before_a_claim),
      TEST(claim_shares_between_tenants_at_equal_priority),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
