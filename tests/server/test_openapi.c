/* test_openapi.c — GET /v1/openapi.json against the route table: every route
 * is documented (operation id, summary, tag, path parameters, a typed 2xx,
 * its 4xx and 5xx answers in the error model, security), nothing else is,
 * every $ref resolves, and the schemas name every field the handlers write. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "routes.h"

static json_t *doc;

static int load_document(void **state) {
  (void)state;
  http_request req = {.method = "GET", .path = "/v1/openapi.json", .body = ""};
  http_response res = {.status = 500};
  http_openapi(NULL, &req, &res);
  if (res.status != 200 || !res.body) {
    printf("GET /v1/openapi.json answered %d: %s\n", res.status, res.body ? res.body : "");
    free(res.body);
    return -1;
  }
  json_error_t err;
  doc = json_loads(res.body, 0, &err);
  free(res.body);
  if (!doc) fprintf(stderr, "openapi.json is not JSON: %s\n", err.text);
  return doc ? 0 : -1;
}

static int free_document(void **state) {
  (void)state;
  json_decref(doc);
  return 0;
}

static void lower(const char *in, char *out, size_t len) {
  size_t i = 0;
  for (; in[i] && i + 1 < len; i++)
    out[i] = (char)(in[i] >= 'A' && in[i] <= 'Z' ? in[i] + 32 : in[i]);
  out[i] = '\0';
}

/* The operation of route r, failing the test when it is missing. */
static json_t *operation_of(const http_route *r) {
  char method[16];
  lower(r->method, method, sizeof method);
  json_t *op = json_object_get(json_object_get(json_object_get(doc, "paths"), r->pattern), method);
  if (!op) fail_msg("route %s %s has no OpenAPI operation", r->method, r->pattern);
  return op;
}

/* Follows a "#/components/..." reference; NULL when it does not resolve. */
static json_t *resolve(const char *ref) {
  if (strncmp(ref, "#/", 2) != 0) return NULL;
  char copy[256];
  snprintf(copy, sizeof copy, "%s", ref + 2);
  json_t *at = doc;
  for (char *part = strtok(copy, "/"); part && at; part = strtok(NULL, "/"))
    at = json_object_get(at, part);
  return at;
}

static json_t *deref(json_t *node) {
  const char *ref = json_string_value(json_object_get(node, "$ref"));
  return ref ? resolve(ref) : node;
}

static void document_is_openapi_3_0_3_with_license_servers_and_bearer_scheme(void **state) {
  (void)state;
  assert_string_equal(json_string_value(json_object_get(doc, "openapi")), "3.0.3");
  json_t *license = json_object_get(json_object_get(doc, "info"), "license");
  assert_non_null(json_string_value(json_object_get(license, "name")));
  assert_non_null(json_string_value(json_object_get(license, "url")));
  json_t *servers = json_object_get(doc, "servers");
  assert_true(json_array_size(servers) >= 1);
  assert_non_null(json_string_value(json_object_get(json_array_get(servers, 0), "url")));
  json_t *bearer = json_object_get(
      json_object_get(json_object_get(doc, "components"), "securitySchemes"), "bearerAuth");
  assert_string_equal(json_string_value(json_object_get(bearer, "type")), "http");
  assert_string_equal(json_string_value(json_object_get(bearer, "scheme")), "bearer");
}

static void every_route_has_an_id_summary_and_declared_tag(void **state) {
  (void)state;
  int n = 0;
  const http_route *routes = http_routes(&n);
  json_t *ids = json_object(), *tags = json_object_get(doc, "tags");
  for (int i = 0; i < n; i++) {
    json_t *op = operation_of(&routes[i]);
    const char *id = json_string_value(json_object_get(op, "operationId"));
    const char *summary = json_string_value(json_object_get(op, "summary"));
    if (!id || !*id || json_object_get(ids, id))
      fail_msg("%s %s: operationId missing or not unique", routes[i].method, routes[i].pattern);
    json_object_set_new(ids, id, json_true());
    if (!summary || !*summary) fail_msg("%s has no summary", id);
    json_t *op_tags = json_object_get(op, "tags");
    if (json_array_size(op_tags) != 1) fail_msg("%s has not exactly one tag", id);
    const char *tag = json_string_value(json_array_get(op_tags, 0));
    int declared = 0;
    for (size_t t = 0; t < json_array_size(tags); t++) {
      json_t *entry = json_array_get(tags, t);
      if (tag && strcmp(json_string_value(json_object_get(entry, "name")), tag) == 0 &&
          json_string_value(json_object_get(entry, "description")))
        declared = 1;
    }
    if (!declared) fail_msg("%s: tag '%s' is not declared with a description", id, tag);
  }
  json_decref(ids);
}

static void every_path_parameter_is_declared_required(void **state) {
  (void)state;
  int n = 0;
  const http_route *routes = http_routes(&n);
  for (int i = 0; i < n; i++) {
    json_t *params = json_object_get(operation_of(&routes[i]), "parameters");
    for (const char *p = strchr(routes[i].pattern, '{'); p; p = strchr(p + 1, '{')) {
      size_t len = (size_t)(strchr(p, '}') - p - 1);
      int found = 0;
      for (size_t k = 0; k < json_array_size(params); k++) {
        json_t *param = deref(json_array_get(params, k));
        const char *name = json_string_value(json_object_get(param, "name"));
        if (name && strlen(name) == len && strncmp(name, p + 1, len) == 0 &&
            strcmp(json_string_value(json_object_get(param, "in")), "path") == 0 &&
            json_is_true(json_object_get(param, "required")))
          found = 1;
      }
      if (!found)
        fail_msg("%s %s: path parameter %.*s undeclared", routes[i].method, routes[i].pattern,
                 (int)len, p + 1);
    }
  }
}

/* 1 when response (maybe a $ref) carries application/json with the Error schema. */
static int is_error_response(json_t *response) {
  json_t *schema = json_object_get(
      json_object_get(json_object_get(deref(response), "content"), "application/json"), "schema");
  const char *ref = json_string_value(json_object_get(schema, "$ref"));
  return ref && strcmp(ref, "#/components/schemas/Error") == 0;
}

static void every_route_answers_a_typed_2xx_and_its_4xx_5xx_in_the_error_model(void **state) {
  (void)state;
  int n = 0;
  const http_route *routes = http_routes(&n);
  for (int i = 0; i < n; i++) {
    json_t *op = operation_of(&routes[i]);
    const char *id = json_string_value(json_object_get(op, "operationId"));
    json_t *responses = json_object_get(op, "responses");
    int ok = 0, client = 0, server = 0;
    const char *code;
    json_t *response;
    json_object_foreach(responses, code, response) {
      int status = atoi(code);
      if (status >= 200 && status < 300) {
        json_t *content = json_object_get(deref(response), "content");
        if (json_object_size(content) == 0) fail_msg("%s: %s has no content", id, code);
        const char *media;
        json_t *m;
        json_object_foreach(content, media, m) {
          if (!json_object_get(m, "schema")) fail_msg("%s: %s %s has no schema", id, code, media);
        }
        ok++;
      } else if (status >= 400 && status < 600) {
        if (!is_error_response(response))
          fail_msg("%s: %s is not the Error schema in application/json", id, code);
        client += status < 500;
        server += status >= 500;
      } else {
        fail_msg("%s: response '%s' is not a status code", id, code);
      }
    }
    if (!ok || !client || !server) fail_msg("%s: needs a 2xx, a 4xx and a 5xx", id);
    if (!routes[i].public_route && !json_object_get(responses, "401"))
      fail_msg("%s needs a token but documents no 401", id);
  }
}

static void public_routes_need_no_token_and_the_others_a_bearer_token(void **state) {
  (void)state;
  int n = 0;
  const http_route *routes = http_routes(&n);
  for (int i = 0; i < n; i++) {
    json_t *op = operation_of(&routes[i]);
    json_t *security = json_object_get(op, "security");
    if (!security) security = json_object_get(doc, "security");
    if (strcmp(routes[i].pattern, "/metrics") == 0) {
      /* An admin token, unless kilnd runs --metrics-auth public. */
      if (json_array_size(security) != 2 ||
          !json_object_get(json_array_get(security, 0), "bearerAuth") ||
          json_object_size(json_array_get(security, 1)) != 0)
        fail_msg("GET /metrics must have security [{bearerAuth: []}, {}]");
    } else if (routes[i].public_route == HTTP_ROUTE_ALLOCATION) {
      /* The worker side of an allocation: that allocation's token only. */
      json_t *requirement = json_array_get(security, 0);
      if (json_array_size(security) != 1 || !json_object_get(requirement, "allocationToken"))
        fail_msg("%s %s must need allocationToken", routes[i].method, routes[i].pattern);
    } else if (routes[i].public_route) {
      if (!json_is_array(security) || json_array_size(security) != 0)
        fail_msg("public %s %s must have security []", routes[i].method, routes[i].pattern);
    } else {
      json_t *requirement = json_array_get(security, 0);
      if (json_array_size(security) != 1 || !json_object_get(requirement, "bearerAuth"))
        fail_msg("%s %s must need bearerAuth", routes[i].method, routes[i].pattern);
    }
  }
}

static void only_routes_that_exist_are_documented(void **state) {
  (void)state;
  int n = 0;
  http_routes(&n);
  size_t operations = 0;
  const char *path;
  json_t *item;
  json_object_foreach(json_object_get(doc, "paths"), path, item) operations +=
      json_object_size(item);
  assert_int_equal(operations, (size_t)n);
}

static void check_refs(json_t *node) {
  if (json_is_array(node)) {
    for (size_t i = 0; i < json_array_size(node); i++) check_refs(json_array_get(node, i));
  } else if (json_is_object(node)) {
    const char *key;
    json_t *value;
    json_object_foreach(node, key, value) {
      if (strcmp(key, "$ref") == 0 &&
          (!json_is_string(value) || !resolve(json_string_value(value))))
        fail_msg("$ref %s does not resolve", json_string_value(value));
      check_refs(value);
    }
  }
}

static void every_ref_resolves(void **state) {
  (void)state;
  check_refs(doc);
}

/* Every key of the object text is a property of the named schema, and
 * every required property is in it. */
static void assert_schema_covers(const char *schema_name, const char *text) {
  char ref[128];
  snprintf(ref, sizeof ref, "#/components/schemas/%s", schema_name);
  json_t *schema = resolve(ref);
  if (!schema) fail_msg("no schema %s", schema_name);
  json_t *props = json_object_get(schema, "properties");
  json_t *obj = json_loads(text, 0, NULL);
  assert_non_null(obj);
  const char *key;
  json_t *value;
  json_object_foreach(obj, key, value) {
    if (!json_object_get(props, key)) fail_msg("%s has no property '%s'", schema_name, key);
  }
  json_t *required = json_object_get(schema, "required");
  for (size_t i = 0; i < json_array_size(required); i++) {
    const char *name = json_string_value(json_array_get(required, i));
    if (!json_object_get(obj, name)) fail_msg("%s requires '%s', absent here", schema_name, name);
  }
  json_decref(obj);
}

static void error_schema_matches_the_error_model(void **state) {
  (void)state;
  api_error e;
  api_error_set(&e, 400, "INVALID_ARGUMENT", "job spec is invalid");
  api_error_add_detail(&e, "epochs", "must be between 1 and 10000, got 0");
  char *body = api_error_to_json(&e);
  json_t *root = json_loads(body, 0, NULL);
  char *inner = json_dumps(json_object_get(root, "error"), JSON_COMPACT);
  char *detail = json_dumps(
      json_array_get(json_object_get(json_object_get(root, "error"), "details"), 0), JSON_COMPACT);
  assert_schema_covers("Error", body);
  assert_schema_covers("Status", inner);
  assert_schema_covers("FieldViolation", detail);
  free(detail);
  free(inner);
  json_decref(root);
  free(body);
}

static void job_and_checkpoint_schemas_name_every_field_the_handlers_write(void **state) {
  (void)state;
  store_job job = {.seq = 1,
                   .id = "20260101-0011223344556677",
                   .request_id = "retry-1",
                   .display_name = "mlp",
                   .spec_json = "{\"epochs\":1}",
                   .state = "SUCCEEDED",
                   .reason = "COMPLETED",
                   .message = "done",
                   .priority = 3,
                   .attempt = 1,
                   .create_ms = 1000,
                   .start_ms = 2000,
                   .end_ms = 3000,
                   .tenant = "acme"};
  json_t *j = http_job_json(NULL, &job, 0);
  char *text = json_dumps(j, JSON_COMPACT);
  assert_schema_covers("Job", text);
  free(text);
  json_decref(j);
  store_checkpoint c = {.id = 2,
                        .job_id = "20260101-0011223344556677",
                        .attempt = 1,
                        .step = 50,
                        .path = "/data/ckpt-50.safetensors",
                        .bytes = 4096,
                        .sha256 = "ab",
                        .metrics_json = "{\"loss\":0.5}",
                        .create_ms = 1000,
                        .pinned = 1};
  json_t *cj = http_checkpoint_json(job.id, &c, 1);
  text = json_dumps(cj, JSON_COMPACT);
  assert_schema_covers("Checkpoint", text);
  free(text);
  json_decref(cj);
}

static void experiment_schemas_name_every_field_the_handlers_write(void **state) {
  (void)state;
  store_experiment e = {.seq = 1,
                        .id = "20260101-0011223344556677",
                        .tenant = "acme",
                        .request_id = "retry-2",
                        .display_name = "lr search",
                        .spec_json = "{\"epochs\":1}",
                        .search_json = "{\"searcher\":\"random\",\"metric\":\"val_loss\","
                                       "\"parameters\":{\"optimizer.learning_rate\":{\"type\":"
                                       "\"uniform\",\"min\":0.1,\"max\":0.2}}}",
                        .state = "SUCCEEDED",
                        .message = "done",
                        .create_ms = 1000,
                        .end_ms = 2000};
  json_t *j = http_experiment_json(NULL, &e);
  char *text = json_dumps(j, JSON_COMPACT);
  assert_schema_covers("Experiment", text);
  free(text);
  json_decref(j);
  store_trial t = {.experiment = "20260101-0011223344556677",
                   .index = 3,
                   .values_json = "{\"optimizer.learning_rate\":0.15}",
                   .job_id = "20260101-8899aabbccddeeff",
                   .job_state = "SUCCEEDED",
                   .state = "PAUSED",
                   .rung = 1,
                   .epochs = 3,
                   .n_results = 2,
                   .results = {0.5, 0.25}};
  j = http_trial_json(&t);
  text = json_dumps(j, JSON_COMPACT);
  assert_schema_covers("Trial", text);
  free(text);
  json_decref(j);
  store_job job = {.id = "20260101-8899aabbccddeeff",
                   .spec_json = "{}",
                   .state = "QUEUED",
                   .experiment = "20260101-0011223344556677"};
  j = http_job_json(NULL, &job, 0);
  text = json_dumps(j, JSON_COMPACT);
  assert_non_null(strstr(text, "\"experiment\""));
  assert_schema_covers("Job", text);
  free(text);
  json_decref(j);
}

static void agent_schema_names_every_field_the_handler_writes(void **state) {
  (void)state;
  store_agent a = {.seq = 1,
                   .id = "agt-0123456789abcdef",
                   .name = "host-a",
                   .hostname = "host-a.example",
                   .pool = "hosts",
                   .address = "10.77.0.2",
                   .cpus = 2,
                   .gpus_json = "[{\"index\":0,\"name\":\"H200\",\"memory_bytes\":1024}]",
                   .version = "0.9",
                   .state = "ONLINE",
                   .last_seen_ms = 2000,
                   .create_ms = 1000};
  json_t *j = http_agent_json(&a);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(json_object_get(j, "gpus"), 0),
                                                      "memory_bytes")),
                   1024);
  char *text = json_dumps(j, JSON_COMPACT);
  assert_schema_covers("Agent", text);
  free(text);
  text = json_dumps(json_array_get(json_object_get(j, "gpus"), 0), JSON_COMPACT);
  assert_schema_covers("Gpu", text);
  free(text);
  json_decref(j);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(document_is_openapi_3_0_3_with_license_servers_and_bearer_scheme),
      cmocka_unit_test(every_route_has_an_id_summary_and_declared_tag),
      cmocka_unit_test(every_path_parameter_is_declared_required),
      cmocka_unit_test(every_route_answers_a_typed_2xx_and_its_4xx_5xx_in_the_error_model),
      cmocka_unit_test(public_routes_need_no_token_and_the_others_a_bearer_token),
      cmocka_unit_test(only_routes_that_exist_are_documented),
      cmocka_unit_test(every_ref_resolves),
      cmocka_unit_test(error_schema_matches_the_error_model),
      cmocka_unit_test(job_and_checkpoint_schemas_name_every_field_the_handlers_write),
      cmocka_unit_test(experiment_schemas_name_every_field_the_handlers_write),
      cmocka_unit_test(agent_schema_names_every_field_the_handler_writes),
  };
  return cmocka_run_group_tests(tests, load_document, free_document);
}
