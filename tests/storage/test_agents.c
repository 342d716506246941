/* test_agents.c — storage/ for kiln-agents: registration by name keeps an
 * agent's id, pages of agents, heartbeats, the loss check on a fake clock,
 * and numbered commands: queued, polled past a seq, done once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"

#define T0 1700000000000LL /* the fake clock's start, ms */

static void reg(store *s, const char *name, const char *pool, int cpus, const char *gpus,
                int64_t now_ms, store_agent *out, int want_created) {
  store_agent a;
  memset(&a, 0, sizeof a);
  snprintf(a.name, sizeof a.name, "%s", name);
  snprintf(a.hostname, sizeof a.hostname, "%s.example", name);
  snprintf(a.pool, sizeof a.pool, "%s", pool);
  snprintf(a.address, sizeof a.address, "10.77.0.%d", cpus + 1);
  snprintf(a.version, sizeof a.version, "0.9");
  snprintf(a.token_id, sizeof a.token_id, "tok-%s", name);
  a.cpus = cpus;
  a.gpus_json = (char *)gpus;
  int created = -1;
  int rc = store_agent_register(s, &a, now_ms, out, &created);
  if (rc != STORE_OK) fail_msg("register %s: %d: %s", name, rc, store_errmsg(s));
  assert_int_equal(created, want_created);
}

static void register_again_keeps_id_and_comes_back_online(void **state) {
  fixture *f = *state;
  store_agent first, again, got;
  reg(f->s, "host-a", "hosts", 2, NULL, T0, &first, 1);
  assert_int_equal(strncmp(first.id, "agt-", 4), 0);
  assert_int_equal(strlen(first.id), 20);
  assert_string_equal(first.state, STORE_AGENT_ONLINE);
  assert_string_equal(first.gpus_json, "[]");
  assert_int_equal(first.last_seen_ms, T0);
  assert_int_equal(first.create_ms, T0);
  /* LOST, then back with 4 cores and a GPU: same row, new fields. */
  int n = 0;
  assert_int_equal(store_agents_mark_lost(f->s, T0 + 30000, 25, NULL, NULL, &n), STORE_OK);
  assert_int_equal(n, 1);
  reg(f->s, "host-a", "hosts", 4, "[{\"index\":0,\"name\":\"H200\",\"memory_bytes\":1}]",
      T0 + 40000, &again, 0);
  assert_string_equal(again.id, first.id);
  assert_int_equal(again.seq, first.seq);
  assert_int_equal(again.create_ms, T0);
  assert_int_equal(again.last_seen_ms, T0 + 40000);
  assert_int_equal(again.cpus, 4);
  assert_string_equal(again.state, STORE_AGENT_ONLINE);
  assert_non_null(strstr(again.gpus_json, "H200"));
  /* By id and by name alike. */
  assert_int_equal(store_agent_get(f->s, first.id, &got), STORE_OK);
  assert_string_equal(got.name, "host-a");
  store_agent_clear(&got);
  assert_int_equal(store_agent_get(f->s, "host-a", &got), STORE_OK);
  assert_string_equal(got.id, first.id);
  assert_string_equal(got.hostname, "host-a.example");
  assert_string_equal(got.token_id, "tok-host-a");
  store_agent_clear(&got);
  assert_int_equal(store_agent_get(f->s, "host-z", &got), STORE_NOT_FOUND);
  store_agent_clear(&first);
  store_agent_clear(&again);
}

/* Another token may not take over a live agent: refused, nothing changed;
 * once the agent is LOST, the name moves to the new token. */
static void another_token_takes_a_name_over_only_once_it_is_lost(void **state) {
  fixture *f = *state;
  store_agent first, got;
  reg(f->s, "host-a", "hosts", 2, NULL, T0, &first, 1);
  store_agent thief;
  memset(&thief, 0, sizeof thief);
  snprintf(thief.name, sizeof thief.name, "host-a");
  snprintf(thief.hostname, sizeof thief.hostname, "evil");
  snprintf(thief.pool, sizeof thief.pool, "hosts");
  snprintf(thief.address, sizeof thief.address, "10.0.0.66");
  snprintf(thief.token_id, sizeof thief.token_id, "tok-other");
  thief.cpus = 64;
  int created = -1;
  assert_int_equal(store_agent_register(f->s, &thief, T0 + 1000, &got, &created), STORE_CONFLICT);
  assert_int_equal(store_agent_get(f->s, "host-a", &got), STORE_OK);
  assert_string_equal(got.token_id, "tok-host-a");
  assert_string_equal(got.address, first.address);
  assert_int_equal(got.cpus, 2);
  assert_int_equal(got.last_seen_ms, T0);
  store_agent_clear(&got);
  int n = 0;
  assert_int_equal(store_agents_mark_lost(f->s, T0 + 26000, 25, NULL, NULL, &n), STORE_OK);
  assert_int_equal(n, 1);
  assert_int_equal(store_agent_register(f->s, &thief, T0 + 27000, &got, &created), STORE_OK);
  assert_int_equal(created, 0);
  assert_string_equal(got.id, first.id);
  assert_string_equal(got.token_id, "tok-other");
  assert_string_equal(got.state, STORE_AGENT_ONLINE);
  store_agent_clear(&got);
  store_agent_clear(&first);
}

/* Seven agents over two pools in pages of 3: each once, in order; filters. */
static void list_pages_each_agent_once_and_filters(void **state) {
  fixture *f = *state;
  for (int i = 0; i < 7; i++) {
    char name[16];
    snprintf(name, sizeof name, "h%d", i);
    reg(f->s, name, i % 2 ? "odd" : "even", 1 + i, NULL, T0 + i, NULL, 1);
  }
  store_agent_query q = {.limit = 3};
  int seen = 0;
  for (;;) {
    store_agent *list = NULL;
    int n = 0;
    assert_int_equal(store_agent_list(f->s, &q, &list, &n), STORE_OK);
    if (n == 0) break;
    for (int i = 0; i < n; i++) {
      char want[16];
      snprintf(want, sizeof want, "h%d", seen);
      assert_string_equal(list[i].name, want);
      assert_int_equal(list[i].cpus, 1 + seen);
      seen++;
    }
    q.after_seq = list[n - 1].seq;
    store_agent_list_free(list, n);
  }
  assert_int_equal(seen, 7);
  store_agent_query odd = {.pool = "odd", .limit = 100};
  store_agent *list = NULL;
  int n = 0;
  assert_int_equal(store_agent_list(f->s, &odd, &list, &n), STORE_OK);
  assert_int_equal(n, 3);
  assert_string_equal(list[2].name, "h5");
  store_agent_list_free(list, n);
  /* h0..h3 silent since T0+3, h4.. later: a loss check at T0+3+25001
   * takes exactly h0-h3; the state filter sees it. */
  assert_int_equal(store_agents_mark_lost(f->s, T0 + 3 + 25001, 25, NULL, NULL, &n), STORE_OK);
  assert_int_equal(n, 4);
  store_agent_query lost = {.state = STORE_AGENT_LOST, .limit = 100};
  assert_int_equal(store_agent_list(f->s, &lost, &list, &n), STORE_OK);
  assert_int_equal(n, 4);
  assert_string_equal(list[3].name, "h3");
  store_agent_list_free(list, n);
}

/* The fake clock: heard from at T0; still ONLINE at exactly grace, LOST
 * 1 ms later, returned once; a touch in time holds it off; a touch of a
 * LOST agent is refused until it registers again. */
static void mark_lost_after_grace_once_with_fake_clock(void **state) {
  fixture *f = *state;
  store_agent a, b, c;
  reg(f->s, "a", "hosts", 1, NULL, T0, &a, 1);
  reg(f->s, "b", "hosts", 1, NULL, T0, &b, 1);
  reg(f->s, "c", "other", 1, NULL, T0, &c, 1);
  store_agent *lost = NULL;
  int n = -1;
  assert_int_equal(store_agents_mark_lost(f->s, T0 + 25000, 25, NULL, &lost, &n), STORE_OK);
  assert_int_equal(n, 0);
  assert_null(lost);
  assert_int_equal(store_agent_touch(f->s, b.id, T0 + 20000), STORE_OK);
  /* Only the pool asked about. */
  assert_int_equal(store_agents_mark_lost(f->s, T0 + 25001, 25, "hosts", &lost, &n), STORE_OK);
  assert_int_equal(n, 1);
  assert_string_equal(lost[0].id, a.id);
  assert_string_equal(lost[0].state, STORE_AGENT_LOST);
  assert_int_equal(lost[0].last_seen_ms, T0);
  store_agent_list_free(lost, n);
  assert_int_equal(store_agents_mark_lost(f->s, T0 + 25001, 25, "hosts", &lost, &n), STORE_OK);
  assert_int_equal(n, 0);
  /* Every pool: c now; b (touched at +20 s) not until +45 s. */
  assert_int_equal(store_agents_mark_lost(f->s, T0 + 44000, 25, NULL, &lost, &n), STORE_OK);
  assert_int_equal(n, 1);
  assert_string_equal(lost[0].name, "c");
  store_agent_list_free(lost, n);
  assert_int_equal(store_agents_mark_lost(f->s, T0 + 45001, 25, NULL, &lost, &n), STORE_OK);
  assert_int_equal(n, 1);
  assert_string_equal(lost[0].name, "b");
  store_agent_list_free(lost, n);
  /* LOST stays LOST on a heartbeat; registering brings it back. */
  assert_int_equal(store_agent_touch(f->s, a.id, T0 + 50000), STORE_CONFLICT);
  store_agent got;
  assert_int_equal(store_agent_get(f->s, a.id, &got), STORE_OK);
  assert_string_equal(got.state, STORE_AGENT_LOST);
  assert_int_equal(got.last_seen_ms, T0);
  store_agent_clear(&got);
  assert_int_equal(store_agent_touch(f->s, "agt-0000000000000000", T0), STORE_NOT_FOUND);
  reg(f->s, "a", "hosts", 1, NULL, T0 + 60000, NULL, 0);
  assert_int_equal(store_agent_touch(f->s, a.id, T0 + 61000), STORE_OK);
  assert_int_equal(store_agent_get(f->s, "a", &got), STORE_OK);
  assert_string_equal(got.state, STORE_AGENT_ONLINE);
  assert_int_equal(got.last_seen_ms, T0 + 61000);
  store_agent_clear(&got);
  /* An older heartbeat arriving late never moves last_seen back. */
  assert_int_equal(store_agent_touch(f->s, a.id, T0 + 1), STORE_OK);
  assert_int_equal(store_agent_get(f->s, "a", &got), STORE_OK);
  assert_int_equal(got.last_seen_ms, T0 + 61000);
  store_agent_clear(&got);
  store_agent_clear(&a);
  store_agent_clear(&b);
  store_agent_clear(&c);
}

/* Commands are numbered 1, 2, 3 per agent; a poll past a seq gets the
 * pending ones in order with their payloads; done is recorded once. */
static void commands_numbered_per_agent_polled_and_done_once(void **state) {
  fixture *f = *state;
  store_agent a, b;
  reg(f->s, "a", "hosts", 2, NULL, T0, &a, 1);
  reg(f->s, "b", "hosts", 2, NULL, T0, &b, 1);
  int64_t seq = 0;
  assert_int_equal(store_command_enqueue(f->s, a.id, "start", "{\"alloc\":\"alloc-1\"}", &seq),
                   STORE_OK);
  assert_int_equal(seq, 1);
  assert_int_equal(store_command_enqueue(f->s, b.id, "start", "{\"alloc\":\"alloc-2\"}", &seq),
                   STORE_OK);
  assert_int_equal(seq, 1);
  assert_int_equal(store_command_enqueue(f->s, a.id, "signal",
                                         "{\"alloc\":\"alloc-1\",\"signal\":\"TERM\"}", &seq),
                   STORE_OK);
  assert_int_equal(seq, 2);
  assert_int_equal(store_command_enqueue(f->s, a.id, "drop", NULL, &seq), STORE_OK);
  assert_int_equal(seq, 3);
  /* Refused, nothing written, the numbering untouched. */
  assert_int_equal(store_command_enqueue(f->s, a.id, "drop", "[1]", &seq), STORE_ERROR);
  assert_non_null(strstr(store_errmsg(f->s), "JSON object"));
  assert_int_equal(store_command_enqueue(f->s, a.id, "drop", "{nope", &seq), STORE_ERROR);
  assert_int_equal(store_command_enqueue(f->s, a.id, "", "{}", &seq), STORE_ERROR);
  assert_int_equal(store_command_enqueue(f->s, "agt-none", "drop", "{}", &seq), STORE_NOT_FOUND);

  store_command *list = NULL;
  int n = 0;
  assert_int_equal(store_command_list(f->s, a.id, 1, 1, 0, &list, &n), STORE_OK);
  assert_int_equal(n, 2);
  assert_int_equal(list[0].seq, 2);
  assert_string_equal(list[0].kind, "signal");
  assert_string_equal(list[0].payload_json, "{\"alloc\":\"alloc-1\",\"signal\":\"TERM\"}");
  assert_int_equal(list[0].done_ms, 0);
  assert_null(list[0].result_json);
  assert_int_equal(list[1].seq, 3);
  assert_string_equal(list[1].payload_json, "{}");
  store_command_list_free(list, n);

  int newly = -1;
  assert_int_equal(store_command_done(f->s, a.id, 2, 1, "{\"ok\":true}", T0 + 5, &newly), STORE_OK);
  assert_int_equal(newly, 1);
  /* Again, with another report: the first stands. */
  assert_int_equal(store_command_done(f->s, a.id, 2, 0, "{\"ok\":false}", T0 + 9, &newly),
                   STORE_OK);
  assert_int_equal(newly, 0);
  store_command c;
  assert_int_equal(store_command_get(f->s, a.id, 2, &c), STORE_OK);
  assert_int_equal(c.done_ms, T0 + 5);
  assert_int_equal(c.ok, 1);
  assert_string_equal(c.result_json, "{\"ok\":true}");
  store_command_clear(&c);
  assert_int_equal(store_command_done(f->s, a.id, 9, 1, NULL, 0, &newly), STORE_NOT_FOUND);
  assert_int_equal(store_command_done(f->s, b.id, 3, 1, NULL, 0, &newly), STORE_NOT_FOUND);
  assert_int_equal(store_command_get(f->s, a.id, 9, &c), STORE_NOT_FOUND);

  /* A poll delivers only what is not done; the full history keeps all. */
  assert_int_equal(store_command_list(f->s, a.id, 0, 1, 0, &list, &n), STORE_OK);
  assert_int_equal(n, 2);
  assert_int_equal(list[0].seq, 1);
  assert_int_equal(list[1].seq, 3);
  store_command_list_free(list, n);
  assert_int_equal(store_command_list(f->s, a.id, 0, 0, 2, &list, &n), STORE_OK);
  assert_int_equal(n, 2);
  assert_int_equal(list[1].seq, 2);
  assert_int_equal(list[1].done_ms, T0 + 5);
  store_command_list_free(list, n);

  /* Re-registering keeps the numbering: the next command is 4. */
  reg(f->s, "a", "hosts", 2, NULL, T0 + 10, NULL, 0);
  assert_int_equal(store_command_enqueue(f->s, a.id, "drop", "{}", &seq), STORE_OK);
  assert_int_equal(seq, 4);
  store_agent got;
  assert_int_equal(store_agent_get(f->s, a.id, &got), STORE_OK);
  assert_int_equal(got.last_command_seq, 4);
  store_agent_clear(&got);
  store_agent_clear(&a);
  store_agent_clear(&b);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, fixture_setup, fixture_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      TEST(register_again_keeps_id_and_comes_back_online),
      TEST(another_token_takes_a_name_over_only_once_it_is_lost),
      TEST(list_pages_each_agent_once_and_filters),
      TEST(mark_lost_after_grace_once_with_fake_clock),
      TEST(commands_numbered_per_agent_polled_and_done_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
