/* test_allocations.c — storage/ for allocations: recorded with their hosts
 * and only their token's hash, found by id and by that hash, listed while
 * not ended (per agent), RUNNING once, and ended once with `drop` queued to
 * the hosts in the same transaction; relays belong to one allocation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"

#define HASH_A "aa00000000000000000000000000000000000000000000000000000000000000"
#define HASH_B "bb00000000000000000000000000000000000000000000000000000000000000"

static void agent(fixture *f, const char *name, store_agent *out) {
  store_agent a;
  memset(&a, 0, sizeof a);
  snprintf(a.name, sizeof a.name, "%s", name);
  snprintf(a.hostname, sizeof a.hostname, "%s", name);
  snprintf(a.pool, sizeof a.pool, "hosts");
  snprintf(a.address, sizeof a.address, "10.77.0.2");
  a.cpus = 2;
  assert_int_equal(store_agent_register(f->s, &a, 0, out, NULL), STORE_OK);
}

static void job(fixture *f, const char *id) {
  store_job j;
  memset(&j, 0, sizeof j);
  snprintf(j.id, sizeof j.id, "%s", id);
  snprintf(j.tenant, sizeof j.tenant, "acme");
  j.spec_json = "{}";
  assert_int_equal(store_job_create(f->s, &j, NULL), STORE_OK);
}

/* An allocation of job over the agents given, one rank and core each. */
static void allocate(fixture *f, const char *id, const char *job_id, const char *hash,
                     const store_agent *agents, int n) {
  store_allocation a;
  memset(&a, 0, sizeof a);
  snprintf(a.id, sizeof a.id, "%s", id);
  snprintf(a.job_id, sizeof a.job_id, "%s", job_id);
  a.attempt = 1;
  snprintf(a.pool, sizeof a.pool, "hosts");
  store_alloc_host hosts[4];
  for (int i = 0; i < n; i++) {
    memset(&hosts[i], 0, sizeof hosts[i]);
    snprintf(hosts[i].agent_id, sizeof hosts[i].agent_id, "%s", agents[i].id);
    snprintf(hosts[i].name, sizeof hosts[i].name, "%s", agents[i].name);
    snprintf(hosts[i].address, sizeof hosts[i].address, "%s", agents[i].address);
    hosts[i].rank_first = i;
    hosts[i].ranks = 1;
    snprintf(hosts[i].cores, sizeof hosts[i].cores, "%d", i);
  }
  a.hosts = hosts;
  a.n_hosts = n;
  assert_int_equal(store_allocation_add(f->s, &a, hash), STORE_OK);
}

static int pending(fixture *f, const store_agent *a, const char *kind) {
  store_command *list = NULL;
  int n = 0, found = 0;
  assert_int_equal(store_command_list(f->s, a->id, 0, 1, 0, &list, &n), STORE_OK);
  for (int i = 0; i < n; i++) found += strcmp(list[i].kind, kind) == 0;
  store_command_list_free(list, n);
  return found;
}

static void allocation_is_found_by_id_and_token_hash_with_its_hosts(void **state) {
  fixture *f = *state;
  store_agent a, b;
  agent(f, "host-a", &a);
  agent(f, "host-b", &b);
  store_agent both[2] = {a, b};
  job(f, "job-1");
  allocate(f, "alloc-1", "job-1", HASH_A, both, 2);
  store_allocation got;
  assert_int_equal(store_allocation_by_token(f->s, HASH_A, &got), STORE_OK);
  assert_string_equal(got.id, "alloc-1");
  assert_string_equal(got.job_id, "job-1");
  assert_string_equal(got.state, STORE_ALLOC_STARTING);
  assert_int_equal(got.n_hosts, 2);
  assert_string_equal(got.hosts[1].name, "host-b");
  assert_int_equal(got.hosts[1].rank_first, 1);
  assert_string_equal(got.hosts[1].cores, "1");
  store_allocation_clear(&got);
  assert_int_equal(store_allocation_by_token(f->s, HASH_B, &got), STORE_NOT_FOUND);
  assert_int_equal(store_allocation_get(f->s, "alloc-2", &got), STORE_NOT_FOUND);
  /* The same token hash cannot name two allocations. */
  store_allocation dup;
  memset(&dup, 0, sizeof dup);
  snprintf(dup.id, sizeof dup.id, "alloc-2");
  snprintf(dup.job_id, sizeof dup.job_id, "job-1");
  store_alloc_host h = {.ranks = 1};
  snprintf(h.agent_id, sizeof h.agent_id, "%s", a.id);
  dup.hosts = &h;
  dup.n_hosts = 1;
  assert_int_equal(store_allocation_add(f->s, &dup, HASH_A), STORE_ERROR);
  assert_int_equal(store_allocation_get(f->s, "alloc-2", &got), STORE_NOT_FOUND);
  store_agent_clear(&a);
  store_agent_clear(&b);
}

static void ending_drops_the_other_hosts_once_and_lists_only_the_unended(void **state) {
  fixture *f = *state;
  store_agent a, b;
  agent(f, "host-a", &a);
  agent(f, "host-b", &b);
  store_agent both[2] = {a, b};
  job(f, "job-1");
  job(f, "job-2");
  allocate(f, "alloc-1", "job-1", HASH_A, both, 2);
  allocate(f, "alloc-2", "job-2", HASH_B, &b, 1);
  store_allocation *list = NULL;
  int n = 0;
  assert_int_equal(store_allocations_unended(f->s, a.id, &list, &n), STORE_OK);
  assert_int_equal(n, 1); /* host-a holds alloc-1 only */
  assert_string_equal(list[0].id, "alloc-1");
  store_allocation_list_free(list, n);
  assert_int_equal(store_allocation_running(f->s, "alloc-1"), STORE_OK);
  store_allocation got;
  assert_int_equal(store_allocation_get(f->s, "alloc-1", &got), STORE_OK);
  assert_string_equal(got.state, STORE_ALLOC_RUNNING);
  store_allocation_clear(&got);
  /* host-a is lost: alloc-1 ends, host-b (only) is told to drop it. */
  int ended = 0;
  assert_int_equal(store_allocation_end(f->s, "alloc-1", "AGENT_LOST", a.id, 1, &ended), STORE_OK);
  assert_int_equal(ended, 1);
  assert_int_equal(pending(f, &a, "drop"), 0);
  assert_int_equal(pending(f, &b, "drop"), 1);
  assert_int_equal(store_allocation_get(f->s, "alloc-1", &got), STORE_OK);
  assert_string_equal(got.state, STORE_ALLOC_ENDED);
  assert_string_equal(got.reason, "AGENT_LOST");
  assert_true(got.end_ms > 0);
  store_allocation_clear(&got);
  /* Ending again changes nothing and queues nothing. */
  assert_int_equal(store_allocation_end(f->s, "alloc-1", "EXITED", NULL, 1, &ended), STORE_OK);
  assert_int_equal(ended, 0);
  assert_int_equal(pending(f, &b, "drop"), 1);
  assert_int_equal(store_allocation_running(f->s, "alloc-1"), STORE_OK);
  assert_int_equal(store_allocation_get(f->s, "alloc-1", &got), STORE_OK);
  assert_string_equal(got.state, STORE_ALLOC_ENDED); /* never back to RUNNING */
  store_allocation_clear(&got);
  assert_int_equal(store_allocations_unended(f->s, NULL, &list, &n), STORE_OK);
  assert_int_equal(n, 1);
  assert_string_equal(list[0].id, "alloc-2");
  store_allocation_list_free(list, n);
  store_agent_clear(&a);
  store_agent_clear(&b);
}

static void a_relay_belongs_to_its_allocation(void **state) {
  fixture *f = *state;
  store_agent a, b;
  agent(f, "host-a", &a);
  agent(f, "host-b", &b);
  store_agent both[2] = {a, b};
  job(f, "job-1");
  allocate(f, "alloc-1", "job-1", HASH_A, both, 2);
  allocate(f, "alloc-2", "job-1", HASH_B, &a, 1);
  assert_int_equal(store_relay_add(f->s, "relay-1", "alloc-1", b.id, 7), STORE_OK);
  char agent_id[32];
  int64_t seq = 0;
  assert_int_equal(store_relay_get(f->s, "alloc-1", "relay-1", agent_id, &seq), STORE_OK);
  assert_string_equal(agent_id, b.id);
  assert_int_equal(seq, 7);
  assert_int_equal(store_relay_get(f->s, "alloc-2", "relay-1", agent_id, &seq), STORE_NOT_FOUND);
  store_agent_clear(&a);
  store_agent_clear(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(allocation_is_found_by_id_and_token_hash_with_its_hosts,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(ending_drops_the_other_hosts_once_and_lists_only_the_unended,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(a_relay_belongs_to_its_allocation, fixture_setup,
                                      fixture_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
