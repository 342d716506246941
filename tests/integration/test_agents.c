/* test_agents.c — the /v1/agents routes against a real kilnd: agent tokens
 * (made over HTTP and by `kilnd token create --role agent`), three agents
 * registering with their devices and listed by an admin, a registration
 * again keeping the id, the command long poll waiting out ?wait= as a
 * heartbeat, one agent's token refused on another's id, :done on a command
 * that does not exist, and every refusal (401, 403, 400 naming the field)
 * changing nothing. Queuing commands is the store's (tests/storage). */
#include <curl/curl.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static char data_dir[256];
static char base_url[64];
static pid_t kilnd_pid;
static char admin[128];
static char user[128];
static char agent_token[3][128]; /* one per agent: host-a, host-b, host-c */
static char agent_id[3][32];

/* method path with token (NULL: none); the status, the answer in *out (may be NULL). */
static long call(const char *tok, const char *method, const char *path, const char *body,
                 json_t **out) {
  char *data = NULL;
  long status = it_request(base_url, tok, method, path, body, body ? strlen(body) : 0, &data);
  if (status == 0) fail_msg("%s %s: %s", method, path, data ? data : "no answer");
  if (out) *out = data ? json_loads(data, 0, NULL) : NULL;
  free(data);
  return status;
}

/* The field the first detail of an error answer names ("" when none). */
static const char *error_field(const json_t *doc) {
  json_t *d = json_array_get(json_object_get(json_object_get(doc, "error"), "details"), 0);
  const char *f = json_string_value(json_object_get(d, "field"));
  return f ? f : "";
}

static void expect_error(const char *tok, const char *method, const char *path, const char *body,
                         long want_status, const char *want_field) {
  json_t *doc = NULL;
  long status = call(tok, method, path, body, &doc);
  char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
  if (status != want_status || strcmp(error_field(doc), want_field) != 0)
    fail_msg("%s %s %s: got %ld field '%s', want %ld field '%s': %s", method, path,
             body ? body : "", status, error_field(doc), want_status, want_field, text ? text : "");
  free(text);
  json_decref(doc);
}

/* The agents list as an admin sees it, one page of 100. */
static json_t *list_agents(void) {
  json_t *doc = NULL;
  assert_int_equal(call(admin, "GET", "/v1/agents?page_size=100", NULL, &doc), 200);
  return doc;
}

static size_t agent_count(void) {
  json_t *doc = list_agents();
  size_t n = json_array_size(json_object_get(doc, "agents"));
  json_decref(doc);
  return n;
}

static const char *text_at(const json_t *o, const char *key) {
  const char *t = json_string_value(json_object_get(o, key));
  return t ? t : "";
}

static json_t *register_agent(const char *tok, const char *body, long want_status) {
  json_t *doc = NULL;
  long status = call(tok, "POST", "/v1/agents", body, &doc);
  if (status != want_status) {
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    fail_msg("register %s: got %ld want %ld: %s", body, status, want_status, text ? text : "");
  }
  return doc;
}

/* ---- setup ---- */

static int start_kilnd(void **state) {
  (void)state;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-agents-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  char trainer[300];
  snprintf(trainer, sizeof trainer, "%s/trainer.sh", data_dir);
  if (it_write_file(trainer, "#!/bin/sh\nexit 1\n", 0755) != 0) return -1;
  if (it_launch_kilnd(KILND_PATH, data_dir, trainer, NULL, NULL, &kilnd_pid, base_url,
                      sizeof base_url, admin, sizeof admin) != 0)
    return -1;
  return it_make_token(KILND_PATH, data_dir, "acme", user, sizeof user);
}

static int stop_kilnd(void **state) {
  (void)state;
  int rc = it_stop_kilnd(kilnd_pid, data_dir);
  curl_global_cleanup();
  return rc;
}

/* ---- tests ---- */

/* An admin makes agent tokens over HTTP (tenant "agents", none given) and
 * with `kilnd token create --role agent`; a tenant is refused for one, and
 * a user makes none. */
static void agent_tokens_come_from_admins_and_kilnd(void **state) {
  (void)state;
  for (int i = 0; i < 2; i++) {
    json_t *doc = NULL;
    assert_int_equal(call(admin, "POST", "/v1/tokens", "{\"role\":\"agent\"}", &doc), 200);
    assert_string_equal(text_at(doc, "role"), "agent");
    assert_string_equal(text_at(doc, "tenant"), "agents");
    assert_int_equal(strncmp(text_at(doc, "secret"), "kiln_", 5), 0);
    snprintf(agent_token[i], sizeof agent_token[i], "%s", text_at(doc, "secret"));
    json_decref(doc);
  }
  char cmd[600], out[128];
  snprintf(cmd, sizeof cmd, "%s token create --role agent --data-dir %s", KILND_PATH, data_dir);
  assert_int_equal(it_run(out, sizeof out, cmd), 0);
  out[strcspn(out, "\n")] = '\0';
  assert_int_equal(strncmp(out, "kiln_", 5), 0);
  snprintf(agent_token[2], sizeof agent_token[2], "%s", out);
  snprintf(cmd, sizeof cmd, "%s token create --role agent --tenant acme --data-dir %s", KILND_PATH,
           data_dir);
  assert_int_not_equal(it_run(out, sizeof out, cmd), 0);
  assert_non_null(strstr(out, "agent token acts for no tenant"));
  expect_error(admin, "POST", "/v1/tokens", "{\"role\":\"agent\",\"tenant\":\"acme\"}", 400,
               "tenant");
  expect_error(admin, "POST", "/v1/tokens", "{\"role\":\"robot\",\"tenant\":\"acme\"}", 400,
               "role");
  expect_error(user, "POST", "/v1/tokens", "{\"role\":\"agent\"}", 403, "role");
  /* The list shows them as agent tokens. */
  json_t *doc = NULL;
  assert_int_equal(call(admin, "GET", "/v1/tokens", NULL, &doc), 200);
  int agents = 0;
  size_t i;
  json_t *t;
  json_array_foreach(json_object_get(doc, "tokens"), i, t) {
    agents +=
        strcmp(text_at(t, "role"), "agent") == 0 && strcmp(text_at(t, "tenant"), "agents") == 0;
  }
  assert_int_equal(agents, 3);
  json_decref(doc);
}

static const char *const registrations[3] = {
    "{\"name\":\"host-a\",\"hostname\":\"host-a\",\"pool\":\"hosts\",\"address\":\"10.77.0.2\","
    "\"cpus\":2,\"gpus\":[],\"version\":\"0.9\",\"running\":[]}",
    "{\"name\":\"host-b\",\"hostname\":\"host-b.lab\",\"pool\":\"hosts\",\"address\":"
    "\"10.77.0.3\",\"cpus\":4,\"gpus\":[{\"index\":0,\"name\":\"NVIDIA H200\",\"memory_bytes\":"
    "150000000000}],\"version\":\"0.9\"}",
    "{\"name\":\"host-c\",\"pool\":\"hosts\",\"address\":\"fd00::7\",\"cpus\":1,\"gpus\":["
    "{\"index\":0,\"name\":\"L4\",\"memory_bytes\":24000000000},{\"index\":1,\"name\":\"L4\","
    "\"memory_bytes\":24000000000}]}",
};

/* Three agents register (201, ONLINE, the first command 1) and an admin
 * lists them in order with their devices, by pages, and gets each by id or
 * name. */
static void three_agents_register_and_are_listed_with_their_devices(void **state) {
  (void)state;
  for (int i = 0; i < 3; i++) {
    json_t *doc = register_agent(agent_token[i], registrations[i], 201);
    assert_string_equal(text_at(doc, "state"), "ONLINE");
    assert_int_equal(strncmp(text_at(doc, "id"), "agt-", 4), 0);
    assert_int_equal(json_integer_value(json_object_get(doc, "next_seq")), 1);
    assert_int_equal(json_integer_value(json_object_get(doc, "grace_s")), 25);
    assert_true(json_integer_value(json_object_get(doc, "heartbeat_s")) > 0);
    assert_true(json_integer_value(json_object_get(doc, "heartbeat_s")) < 25);
    snprintf(agent_id[i], sizeof agent_id[i], "%s", text_at(doc, "id"));
    json_decref(doc);
  }
  json_t *doc = list_agents();
  json_t *agents = json_object_get(doc, "agents");
  assert_int_equal(json_array_size(agents), 3);
  assert_string_equal(text_at(doc, "next_page_token"), "");
  json_t *a = json_array_get(agents, 0), *b = json_array_get(agents, 1),
         *c = json_array_get(agents, 2);
  assert_string_equal(text_at(a, "name"), "host-a");
  assert_string_equal(text_at(a, "id"), agent_id[0]);
  assert_string_equal(text_at(a, "address"), "10.77.0.2");
  assert_string_equal(text_at(a, "pool"), "hosts");
  assert_string_equal(text_at(a, "version"), "0.9");
  assert_int_equal(json_integer_value(json_object_get(a, "cpus")), 2);
  assert_int_equal(json_array_size(json_object_get(a, "gpus")), 0);
  assert_string_equal(text_at(b, "hostname"), "host-b.lab");
  assert_int_equal(json_integer_value(json_object_get(b, "cpus")), 4);
  json_t *gpu = json_array_get(json_object_get(b, "gpus"), 0);
  assert_string_equal(text_at(gpu, "name"), "NVIDIA H200");
  assert_int_equal(json_integer_value(json_object_get(gpu, "memory_bytes")), 150000000000LL);
  assert_string_equal(text_at(c, "hostname"), "host-c"); /* the name when none is given */
  assert_string_equal(text_at(c, "address"), "fd00::7");
  assert_int_equal(json_array_size(json_object_get(c, "gpus")), 2);
  assert_int_equal(
      json_integer_value(json_object_get(json_array_get(json_object_get(c, "gpus"), 1), "index")),
      1);
  for (int i = 0; i < 3; i++) {
    json_t *one = json_array_get(agents, (size_t)i);
    assert_string_equal(text_at(one, "state"), "ONLINE");
    assert_int_equal(strlen(text_at(one, "last_seen_time")), 24);
    assert_int_equal(strlen(text_at(one, "create_time")), 24);
  }
  json_decref(doc);

  /* Pages of 2: host-a, host-b, then host-c alone. */
  assert_int_equal(call(admin, "GET", "/v1/agents?page_size=2", NULL, &doc), 200);
  assert_int_equal(json_array_size(json_object_get(doc, "agents")), 2);
  char path[256];
  snprintf(path, sizeof path, "/v1/agents?page_size=2&page_token=%s",
           text_at(doc, "next_page_token"));
  json_decref(doc);
  assert_int_equal(call(admin, "GET", path, NULL, &doc), 200);
  assert_int_equal(json_array_size(json_object_get(doc, "agents")), 1);
  assert_string_equal(text_at(json_array_get(json_object_get(doc, "agents"), 0), "name"), "host-c");
  assert_string_equal(text_at(doc, "next_page_token"), "");
  json_decref(doc);
  assert_int_equal(call(admin, "GET", "/v1/agents?pool=elsewhere", NULL, &doc), 200);
  assert_int_equal(json_array_size(json_object_get(doc, "agents")), 0);
  json_decref(doc);

  /* One agent, by name or id: an admin, or the agent itself. */
  snprintf(path, sizeof path, "/v1/agents/%s", agent_id[1]);
  assert_int_equal(call(admin, "GET", path, NULL, &doc), 200);
  assert_string_equal(text_at(doc, "name"), "host-b");
  json_decref(doc);
  assert_int_equal(call(admin, "GET", "/v1/agents/host-b", NULL, &doc), 200);
  assert_string_equal(text_at(doc, "id"), agent_id[1]);
  json_decref(doc);
  assert_int_equal(call(agent_token[1], "GET", "/v1/agents/host-b", NULL, &doc), 200);
  json_decref(doc);
  expect_error(agent_token[0], "GET", "/v1/agents/host-b", NULL, 403, "agent");
  expect_error(admin, "GET", "/v1/agents/host-zz", NULL, 404, "agent");
}

/* The same name again is the same agent: 200, its id kept, its fields
 * replaced; still three agents. */
static void registering_again_keeps_the_id(void **state) {
  (void)state;
  json_t *doc = register_agent(agent_token[0],
                               "{\"name\":\"host-a\",\"pool\":\"hosts\",\"address\":\"10.77.0.2\","
                               "\"cpus\":3,\"version\":\"1.0\",\"running\":[\"alloc-00ff\"]}",
                               200);
  assert_string_equal(text_at(doc, "id"), agent_id[0]);
  assert_int_equal(json_integer_value(json_object_get(doc, "cpus")), 3);
  assert_string_equal(text_at(doc, "version"), "1.0");
  assert_int_equal(json_integer_value(json_object_get(doc, "next_seq")), 1);
  json_decref(doc);
  assert_int_equal(agent_count(), 3);
  assert_int_equal(call(admin, "GET", "/v1/agents/host-a", NULL, &doc), 200);
  assert_int_equal(json_integer_value(json_object_get(doc, "cpus")), 3);
  json_decref(doc);
  /* Another agent's token cannot take a live host's name over. */
  expect_error(agent_token[1], "POST", "/v1/agents",
               "{\"name\":\"host-a\",\"pool\":\"hosts\",\"address\":\"10.0.0.66\","
               "\"cpus\":64}",
               409, "name");
  assert_int_equal(call(admin, "GET", "/v1/agents/host-a", NULL, &doc), 200);
  assert_string_equal(text_at(doc, "address"), "10.77.0.2");
  assert_int_equal(json_integer_value(json_object_get(doc, "cpus")), 3);
  json_decref(doc);
}

/* A poll with nothing queued answers an empty list, at once without
 * ?wait=, after it with one; either way it is a heartbeat. */
static void an_empty_poll_waits_out_its_wait_as_a_heartbeat(void **state) {
  (void)state;
  char path[200];
  json_t *doc = NULL;
  assert_int_equal(call(admin, "GET", "/v1/agents/host-b", NULL, &doc), 200);
  char before[64];
  snprintf(before, sizeof before, "%s", text_at(doc, "last_seen_time"));
  json_decref(doc);
  usleep(20 * 1000); /* past the millisecond the registration was seen at */

  snprintf(path, sizeof path, "/v1/agents/%s/commands?after=0", agent_id[1]);
  long long t0 = it_now_ms();
  assert_int_equal(call(agent_token[1], "GET", path, NULL, &doc), 200);
  assert_true(it_now_ms() - t0 < 1000);
  assert_int_equal(json_array_size(json_object_get(doc, "commands")), 0);
  assert_true(json_is_array(json_object_get(doc, "commands")));
  assert_string_equal(text_at(doc, "state"), "ONLINE");
  json_decref(doc);

  snprintf(path, sizeof path, "/v1/agents/%s/commands?after=0&wait=1500ms", agent_id[1]);
  t0 = it_now_ms();
  assert_int_equal(call(agent_token[1], "GET", path, NULL, &doc), 200);
  long long took = it_now_ms() - t0;
  printf("an empty poll with wait=1500ms answered after %lld ms\n", took);
  assert_true(took >= 1450);
  assert_true(took < 5000);
  assert_int_equal(json_array_size(json_object_get(doc, "commands")), 0);
  assert_string_equal(text_at(doc, "state"), "ONLINE");
  json_decref(doc);

  assert_int_equal(call(admin, "GET", "/v1/agents/host-b", NULL, &doc), 200);
  printf("last seen: %s at registration, %s after the polls\n", before,
         text_at(doc, "last_seen_time"));
  assert_true(strcmp(text_at(doc, "last_seen_time"), before) > 0);
  json_decref(doc);
}

/* The seconds since the epoch of an RFC 3339 time "YYYY-MM-DDTHH:MM:SS.mmmZ". */
static double seconds_of(const char *t) {
  struct tm tm;
  memset(&tm, 0, sizeof tm);
  int ms = 0;
  if (sscanf(t, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
             &tm.tm_min, &tm.tm_sec, &ms) != 7)
    fail_msg("not a time: '%s'", t);
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return (double)timegm(&tm) + ms / 1000.0;
}

/* A poll parked longer than the heartbeat interval (5 s) records a
 * heartbeat while it waits, not only when it arrives: an agent waiting
 * 30 s is never taken for lost in a 25 s grace window. */
static void a_parked_poll_is_a_heartbeat_while_it_waits(void **state) {
  (void)state;
  char path[200];
  snprintf(path, sizeof path, "/v1/agents/%s/commands?after=0&wait=6s", agent_id[2]);
  json_t *doc = NULL;
  long long t0 = it_now_ms();
  assert_int_equal(call(agent_token[2], "GET", path, NULL, &doc), 200);
  long long took = it_now_ms() - t0;
  assert_true(took >= 5900);
  assert_int_equal(json_array_size(json_object_get(doc, "commands")), 0);
  json_decref(doc);
  assert_int_equal(call(admin, "GET", "/v1/agents/host-c", NULL, &doc), 200);
  double seen = seconds_of(text_at(doc, "last_seen_time"));
  json_decref(doc);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  double now = (double)ts.tv_sec + ts.tv_nsec / 1e9;
  printf("poll of %lld ms: last seen %.1f s before it ended\n", took, now - seen);
  /* Seen 5 s after it arrived (within a second of its end), not at arrival (6 s before). */
  assert_true(now - seen < 2.5);
}

/* An agent's token polls and reports only as its own agent. */
static void another_agents_id_is_403(void **state) {
  (void)state;
  char path[200];
  snprintf(path, sizeof path, "/v1/agents/%s/commands?after=0", agent_id[1]);
  expect_error(agent_token[0], "GET", path, NULL, 403, "agent");
  snprintf(path, sizeof path, "/v1/agents/%s/commands/1:done", agent_id[1]);
  expect_error(agent_token[2], "POST", path, "{\"ok\":true}", 403, "agent");
  expect_error(agent_token[0], "GET", "/v1/agents/agt-0000000000000000/commands", NULL, 404,
               "agent");
}

/* :done of a command that was never queued: 404 naming seq, as often as
 * it is sent; a seq that is no number is 400. */
static void done_of_a_command_that_does_not_exist_is_404_every_time(void **state) {
  (void)state;
  char path[200];
  snprintf(path, sizeof path, "/v1/agents/%s/commands/7:done", agent_id[0]);
  for (int i = 0; i < 2; i++)
    expect_error(agent_token[0], "POST", path, "{\"ok\":true}", 404, "seq");
  snprintf(path, sizeof path, "/v1/agents/%s/commands/0:done", agent_id[0]);
  expect_error(agent_token[0], "POST", path, "{\"ok\":true}", 400, "seq");
  snprintf(path, sizeof path, "/v1/agents/%s/commands/x1:done", agent_id[0]);
  expect_error(agent_token[0], "POST", path, "{\"ok\":true}", 400, "seq");
  snprintf(path, sizeof path, "/v1/agents/%s/commands/1:done", agent_id[0]);
  expect_error(agent_token[0], "POST", path, "{\"ok\":\"yes\"}", 400, "ok");
  expect_error(agent_token[0], "POST", path, "{}", 400, "ok");
  expect_error(agent_token[0], "POST", path, "{\"ok\":false,\"exit_code\":1000}", 400, "exit_code");
  expect_error(agent_token[0], "POST", path, "{\"ok\":true,\"color\":1}", 400, "color");
  expect_error(agent_token[0], "POST", path, "[true]", 400, "body");
}

/* A wrong or missing token is 401 and registers nothing. */
static void a_wrong_token_is_401_and_changes_nothing(void **state) {
  (void)state;
  const char *body = "{\"name\":\"host-x\",\"pool\":\"hosts\",\"address\":\"10.77.0.9\","
                     "\"cpus\":2}";
  json_t *before = list_agents();
  expect_error("kiln_0000000000000000000000000000000000000000000000000000000000000000", "POST",
               "/v1/agents", body, 401, "Authorization");
  expect_error(NULL, "POST", "/v1/agents", body, 401, "Authorization");
  char path[200];
  snprintf(path, sizeof path, "/v1/agents/%s/commands?wait=5s", agent_id[0]);
  expect_error("kiln_nope", "GET", path, NULL, 401, "Authorization");
  /* A revoked agent token, too. */
  json_t *doc = NULL;
  assert_int_equal(call(admin, "POST", "/v1/tokens", "{\"role\":\"agent\"}", &doc), 200);
  char secret[128], revoke[128];
  snprintf(secret, sizeof secret, "%s", text_at(doc, "secret"));
  snprintf(revoke, sizeof revoke, "/v1/tokens/%s", text_at(doc, "id"));
  json_decref(doc);
  assert_int_equal(call(admin, "DELETE", revoke, NULL, NULL), 200);
  expect_error(secret, "POST", "/v1/agents", body, 401, "Authorization");
  json_t *after = list_agents();
  assert_true(json_equal(before, after));
  json_decref(before);
  json_decref(after);
}

/* Roles: a user may use no agent route, an admin only reads them, and an
 * agent token nothing else. */
static void roles_other_than_agent_get_403_and_agents_nothing_else(void **state) {
  (void)state;
  const char *body = "{\"name\":\"host-y\",\"pool\":\"hosts\",\"address\":\"10.77.0.8\","
                     "\"cpus\":2}";
  char poll[200], done[200], one[200];
  snprintf(poll, sizeof poll, "/v1/agents/%s/commands", agent_id[0]);
  snprintf(done, sizeof done, "/v1/agents/%s/commands/1:done", agent_id[0]);
  snprintf(one, sizeof one, "/v1/agents/%s", agent_id[0]);
  expect_error(user, "POST", "/v1/agents", body, 403, "role");
  expect_error(user, "GET", "/v1/agents", NULL, 403, "role");
  expect_error(user, "GET", one, NULL, 403, "role");
  expect_error(user, "GET", poll, NULL, 403, "role");
  expect_error(user, "POST", done, "{\"ok\":true}", 403, "role");
  expect_error(admin, "POST", "/v1/agents", body, 403, "role");
  expect_error(admin, "GET", poll, NULL, 403, "role");
  expect_error(admin, "POST", done, "{\"ok\":true}", 403, "role");
  expect_error(agent_token[0], "GET", "/v1/agents", NULL, 403, "role");
  expect_error(agent_token[0], "GET", "/v1/jobs", NULL, 403, "role");
  expect_error(agent_token[0], "GET", "/v1/devices", NULL, 403, "role");
  expect_error(agent_token[0], "POST", "/v1/tokens", "{\"role\":\"agent\"}", 403, "role");
  assert_int_equal(agent_count(), 3);
}

/* Every field of a registration is checked, by name; nothing is written. */
static void bad_fields_are_400_naming_the_field(void **state) {
  (void)state;
  static const struct {
    const char *body, *field;
  } cases[] = {
      {"not json", "body"},
      {"[1]", "body"},
      {"{\"pool\":\"hosts\",\"address\":\"10.0.0.1\",\"cpus\":1}", "name"},
      {"{\"name\":\"a b\",\"pool\":\"hosts\",\"address\":\"10.0.0.1\",\"cpus\":1}", "name"},
      {"{\"name\":7,\"pool\":\"hosts\",\"address\":\"10.0.0.1\",\"cpus\":1}", "name"},
      {"{\"name\":\"h\",\"address\":\"10.0.0.1\",\"cpus\":1}", "pool"},
      {"{\"name\":\"h\",\"pool\":\"a/b\",\"address\":\"10.0.0.1\",\"cpus\":1}", "pool"},
      {"{\"name\":\"h\",\"pool\":\"hosts\",\"cpus\":1}", "address"},
      {"{\"name\":\"h\",\"pool\":\"hosts\",\"address\":\"not an address!\",\"cpus\":1}", "address"},
      {"{\"name\":\"h\",\"pool\":\"hosts\",\"address\":\"10.0.0.1\"}", "cpus"},
      {"{\"name\":\"h\",\"pool\":\"hosts\",\"address\":\"10.0.0.1\",\"cpus\":0}", "cpus"},
      {"{\"name\":\"h\",\"pool\":\"hosts\",\"address\":\"10.0.0.1\",\"cpus\":\"2\"}", "cpus"},
      {"{\"name\":\"h\",\"hostname\":\"bad_host\",\"pool\":\"hosts\",\"address\":\"10.0.0.1\","
       "\"cpus\":1}",
       "hostname"},
      {"{\"name\":\"h\",\"pool\":\"hosts\",\"address\":\"10.0.0.1\",\"cpus\":1,\"gpus\":{}}",
       "gpus"},
      {"{\"name\":\"h\",\"pool\":\"hosts\",\"address\":\"10.0.0.1\",\"cpus\":1,\"gpus\":[1]}",
       "gpus[0]"},
      {"{\"name\":\"h\",\"pool\":\"hosts\",\"address\":\"10.0.0.1\",\"cpus\":1,\"gpus\":["
       "{\"index\":-1}]}",
       "gpus[0].index"},
      {"{\"name\":\"h\",\"pool\":\"hosts\",\"address\":\"10.0.0.1\",\"cpus\":1,\"gpus\":["
       "{\"name\":\"x\"}]}",
       "gpus[0].index"},
      {"{\"name\":\"h\",\"pool\":\"hosts\",\"address\":\"10.0.0.1\",\"cpus\":1,\"gpus\":["
       "{\"index\":0,\"cores\":5}]}",
       "gpus[0].cores"},
      {"{\"name\":\"h\",\"pool\":\"hosts\",\"address\":\"10.0.0.1\",\"cpus\":1,\"gpus\":["
       "{\"index\":0},{\"index\":0}]}",
       "gpus[1].index"},
      {"{\"name\":\"h\",\"pool\":\"hosts\",\"address\":\"10.0.0.1\",\"cpus\":1,\"version\":"
       "\"a\\u0001b\"}",
       "version"},
      {"{\"name\":\"h\",\"pool\":\"hosts\",\"address\":\"10.0.0.1\",\"cpus\":1,\"running\":"
       "\"alloc-1\"}",
       "running"},
      {"{\"name\":\"h\",\"pool\":\"hosts\",\"address\":\"10.0.0.1\",\"cpus\":1,\"running\":"
       "[\"alloc-1\",2]}",
       "running[1]"},
      {"{\"name\":\"h\",\"pool\":\"hosts\",\"address\":\"10.0.0.1\",\"cpus\":1,\"color\":1}",
       "color"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    expect_error(agent_token[0], "POST", "/v1/agents", cases[i].body, 400, cases[i].field);
  char path[200];
  snprintf(path, sizeof path, "/v1/agents/%s/commands?after=-1", agent_id[0]);
  expect_error(agent_token[0], "GET", path, NULL, 400, "after");
  snprintf(path, sizeof path, "/v1/agents/%s/commands?wait=10h", agent_id[0]);
  expect_error(agent_token[0], "GET", path, NULL, 400, "wait");
  snprintf(path, sizeof path, "/v1/agents/%s/commands?wait=301s", agent_id[0]);
  expect_error(agent_token[0], "GET", path, NULL, 400, "wait");
  expect_error(admin, "GET", "/v1/agents?page_size=-1", NULL, 400, "page_size");
  expect_error(admin, "GET", "/v1/agents?page_token=bogus", NULL, 400, "page_token");
  /* Nothing registered, nothing changed: host-a is as it was. */
  assert_int_equal(agent_count(), 3);
  json_t *doc = NULL;
  assert_int_equal(call(admin, "GET", "/v1/agents/host-a", NULL, &doc), 200);
  assert_int_equal(json_integer_value(json_object_get(doc, "cpus")), 3);
  json_decref(doc);
  expect_error(admin, "GET", "/v1/agents/h", NULL, 404, "agent");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(agent_tokens_come_from_admins_and_kilnd),
      cmocka_unit_test(three_agents_register_and_are_listed_with_their_devices),
      cmocka_unit_test(registering_again_keeps_the_id),
      cmocka_unit_test(an_empty_poll_waits_out_its_wait_as_a_heartbeat),
      cmocka_unit_test(a_parked_poll_is_a_heartbeat_while_it_waits),
      cmocka_unit_test(another_agents_id_is_403),
      cmocka_unit_test(done_of_a_command_that_does_not_exist_is_404_every_time),
      cmocka_unit_test(a_wrong_token_is_401_and_changes_nothing),
      cmocka_unit_test(roles_other_than_agent_get_403_and_agents_nothing_else),
      cmocka_unit_test(bad_fields_are_400_naming_the_field),
  };
  return cmocka_run_group_tests(tests, start_kilnd, stop_kilnd);
}
