/* test_bad_requests.c — a table of malformed API requests against a real
 * kilnd on loopback (bad JSON, wrong types, out-of-range values, unknown
 * fields, bad paths and ids, bad query parameters, wrong methods, bad
 * headers and tokens, bad page tokens and filters, bodies over the cap):
 * each must get its 4xx with the error model's status and the field it
 * names, kilnd must answer /healthz after each, and the database must be
 * as it was before the table. */
#include <curl/curl.h>
#include <jansson.h>
#include <setjmp.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static char data_dir[256];
static char base_url[64];
static pid_t kilnd_pid;
static char admin_token[128], acme_token[128], beta_token[128];
static char *small_spec;

/* Every job reports one point and succeeds. */
static const char trainer_script[] =
    "#!/bin/sh\n"
    "echo '{\"step\":1,\"epoch\":1,\"metrics\":{\"loss\":1}}' >&3\n";

static long request(const char *method, const char *path, const char *body, size_t body_len,
                    const char *authorization, const char *extra_header, char **text,
                    json_t **out) {
  char *data = NULL;
  long status =
      it_request_as(base_url, authorization, extra_header, method, path, body, body_len, 60, &data);
  if (status == 0) fail_msg("%s %s: %s", method, path, data ? data : "no answer");
  if (out) *out = data ? json_loads(data, 0, NULL) : NULL;
  if (text)
    *text = data ? data : strdup("");
  else
    free(data);
  return status;
}

static long call(const char *token, const char *method, const char *path, const char *body,
                 json_t **out) {
  char auth[200];
  snprintf(auth, sizeof auth, "Bearer %s", token);
  return request(method, path, body, body ? strlen(body) : 0, auth, NULL, NULL, out);
}

static void create(const char *token, const char *name, char *id) {
  json_t *spec = json_loads(small_spec, 0, NULL);
  json_object_set_new(spec, "display_name", json_string(name));
  char *body = json_dumps(spec, JSON_COMPACT);
  json_decref(spec);
  json_t *doc;
  long status = call(token, "POST", "/v1/jobs", body, &doc);
  free(body);
  if (status != 200) fail_msg("create %s: HTTP %ld", name, status);
  snprintf(id, 64, "%s", json_string_value(json_object_get(doc, "id")));
  json_decref(doc);
}

static json_t *wait_job(const char *token, const char *id) {
  char path[160];
  snprintf(path, sizeof path, "/v1/jobs/%s:wait?timeout=30s", id);
  json_t *doc;
  assert_int_equal(call(token, "POST", path, NULL, &doc), 200);
  assert_true(json_is_true(json_object_get(doc, "done")));
  return doc;
}

/* The error model: code, status, a message, and the field the first detail
 * names; "" when the answer is all of that, else what is wrong. */
static const char *error_mismatch(json_t *doc, long code, const char *status, const char *field,
                                  char *why, size_t why_len) {
  json_t *e = json_object_get(doc, "error");
  json_t *d = json_array_get(json_object_get(e, "details"), 0);
  const char *got_status = json_string_value(json_object_get(e, "status"));
  const char *message = json_string_value(json_object_get(e, "message"));
  const char *got_field = json_string_value(json_object_get(d, "field"));
  why[0] = '\0';
  if (!e)
    snprintf(why, why_len, "no error object");
  else if (json_integer_value(json_object_get(e, "code")) != code)
    snprintf(why, why_len, "code %lld, want %ld",
             (long long)json_integer_value(json_object_get(e, "code")), code);
  else if (!got_status || strcmp(got_status, status) != 0)
    snprintf(why, why_len, "status %s, want %s", got_status ? got_status : "(none)", status);
  else if (!message || !*message)
    snprintf(why, why_len, "no message");
  else if (field && (!got_field || strcmp(got_field, field) != 0))
    snprintf(why, why_len, "field %s, want %s (%s)", got_field ? got_field : "(none)", field,
             message);
  return why;
}

static void assert_error(json_t *doc, long code, const char *status, const char *field) {
  char why[600];
  if (*error_mismatch(doc, code, status, field, why, sizeof why)) fail_msg("%s", why);
}

static int start(void **state) {
  (void)state;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-bad-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  char trainer[300];
  snprintf(trainer, sizeof trainer, "%s/trainer.sh", data_dir);
  if (it_write_file(trainer, trainer_script, 0700) != 0) return -1;
  small_spec = it_read_file(EXAMPLES_DIR "/fmnist-mlp.json");
  if (!small_spec) return -1;
  char pools[300];
  snprintf(pools, sizeof pools, "%s/pools.json", data_dir);
  if (it_write_file(pools, "{\"pools\": [{\"name\": \"default\", \"devices\": [0]}]}", 0600) != 0)
    return -1;
  if (it_launch_kilnd(KILND_PATH, data_dir, trainer, "--pools", pools, &kilnd_pid, base_url,
                      sizeof base_url, admin_token, sizeof admin_token) != 0)
    return -1;
  if (it_make_token(KILND_PATH, data_dir, "acme", acme_token, sizeof acme_token) != 0) return -1;
  return it_make_token(KILND_PATH, data_dir, "beta", beta_token, sizeof beta_token);
}

static int stop(void **state) {
  (void)state;
  int rc = it_stop_kilnd(kilnd_pid, data_dir);
  free(small_spec);
  curl_global_cleanup();
  return rc;
}

/* ---- the bad-input table ---- */

/* Row counts and every job's (id, state, attempt): what "unchanged" means. */
static char *db_snapshot(void) {
  char db_path[300];
  snprintf(db_path, sizeof db_path, "%s/kiln.db", data_dir);
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  const char *sql =
      "SELECT (SELECT count(*) FROM jobs) || '/' || (SELECT count(*) FROM job_events) || '/' ||"
      " (SELECT count(*) FROM metrics) || '/' || (SELECT count(*) FROM checkpoints) || '/' ||"
      " (SELECT count(*) FROM tokens) || '/' ||"
      " (SELECT group_concat(id || ':' || state || ':' || attempt, ',') FROM"
      "  (SELECT id, state, attempt FROM jobs ORDER BY seq))";
  sqlite3_stmt *st = NULL;
  assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(st), SQLITE_ROW);
  char *snap = strdup((const char *)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  sqlite3_close(db);
  return snap;
}

typedef struct bad_case {
  const char *name;
  const char *method;
  const char *path; /* "{job}" is replaced by a finished job of acme's */
  const char *body; /* NULL: none; "SPEC:key=json" patches the small spec */
  const char *auth; /* NULL: acme's token; "BETA" / "ADMIN": those tenants' tokens; otherwise
                     * the raw Authorization value ("" = none) */
  const char *header;
  long code;
  const char *status;
  const char *field; /* first detail's field, or NULL */
} bad_case;

static char *patched_spec(const char *patch) {
  /* "a.b=JSON" sets a member (creating objects on the way), "a.b=-" removes it. */
  json_t *spec = json_loads(small_spec, 0, NULL);
  char key[128];
  const char *eq = strchr(patch, '=');
  snprintf(key, sizeof key, "%.*s", (int)(eq - patch), patch);
  json_t *at = spec;
  char *dot, *part = key;
  while ((dot = strchr(part, '.'))) {
    *dot = '\0';
    json_t *child = json_object_get(at, part);
    if (json_is_array(child)) child = json_array_get(child, 0);
    at = child;
    part = dot + 1;
  }
  if (strcmp(eq + 1, "-") == 0) {
    json_object_del(at, part);
  } else {
    json_t *value = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
    assert_non_null(value);
    json_object_set_new(at, part, value);
  }
  char *text = json_dumps(spec, JSON_COMPACT);
  json_decref(spec);
  return text;
}

static void bad_inputs_get_the_right_4xx_and_change_nothing(void **state) {
  (void)state;
  char finished[64];
  create(acme_token, "quick-target", finished);
  json_decref(wait_job(acme_token, finished));
  char long_name[300], long_rid[200], asc_token[128];
  memset(long_name, 'x', 200);
  snprintf(
      long_name, sizeof long_name, "display_name=\"%.*s\"", 200,
      "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
      "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
      "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
  snprintf(
      long_rid, sizeof long_rid, "/v1/jobs?request_id=%s",
      "rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr");
  char second[64];
  create(acme_token, "quick-second", second);
  json_decref(wait_job(acme_token, second));
  json_t *doc;
  /* Page tokens issued for a filter, and to acme: refused elsewhere. */
  char filtered_token[256], acme_page_token[256];
  assert_int_equal(
      call(acme_token, "GET", "/v1/jobs?page_size=1&filter=state%3DSUCCEEDED", NULL, &doc), 200);
  snprintf(filtered_token, sizeof filtered_token, "/v1/jobs?page_token=%s",
           json_string_value(json_object_get(doc, "next_page_token")));
  json_decref(doc);
  assert_int_equal(call(acme_token, "GET", "/v1/jobs?page_size=1", NULL, &doc), 200);
  snprintf(acme_page_token, sizeof acme_page_token, "/v1/jobs?page_size=1&page_token=%s",
           json_string_value(json_object_get(doc, "next_page_token")));
  json_decref(doc);
  char long_filter[600], long_upload[400];
  int used = snprintf(long_filter, sizeof long_filter, "/v1/jobs?filter=state%%3DQUEUED");
  while (used < 390)
    used += snprintf(long_filter + used, sizeof long_filter - (size_t)used,
                     "%%20AND%%20state%%3DQUEUED");
  used = snprintf(long_upload, sizeof long_upload,
                  "/v1/datasets?format=csv&label_column=a&display_name=");
  while (used < 390) long_upload[used++] = 'n';
  long_upload[used] = '\0';
  /* 5000 arrays deep: past the parser's limit, under the body cap. */
  size_t deep_len = 10000;
  char *deep = malloc(deep_len + 1);
  for (size_t i = 0; i < deep_len / 2; i++) {
    deep[i] = '[';
    deep[deep_len - 1 - i] = ']';
  }
  deep[deep_len] = '\0';
  assert_int_equal(call(acme_token, "GET", "/v1/jobs?page_size=1&order_by=create_time", NULL, &doc),
                   200);
  snprintf(asc_token, sizeof asc_token, "/v1/jobs?page_token=%s",
           json_string_value(json_object_get(doc, "next_page_token")));
  json_decref(doc);
  const bad_case cases[] = {
      /* bad JSON */
      {"truncated JSON", "POST", "/v1/jobs", "{\"model\": {", NULL, NULL, 400, "INVALID_ARGUMENT",
       NULL},
      {"empty body", "POST", "/v1/jobs", "", NULL, NULL, 400, "INVALID_ARGUMENT", NULL},
      {"array body", "POST", "/v1/jobs", "[1,2]", NULL, NULL, 400, "INVALID_ARGUMENT", NULL},
      {"null body", "POST", "/v1/jobs", "null", NULL, NULL, 400, "INVALID_ARGUMENT", NULL},
      {"trailing garbage", "POST", "/v1/jobs", "{} x", NULL, NULL, 400, "INVALID_ARGUMENT", NULL},
      {"invalid UTF-8", "POST", "/v1/jobs", "{\"display_name\":\"\xff\xfe\"}", NULL, NULL, 400,
       "INVALID_ARGUMENT", NULL},
      /* wrong types */
      {"epochs as string", "POST", "/v1/jobs", "SPEC:epochs=\"two\"", NULL, NULL, 400,
       "INVALID_ARGUMENT", "epochs"},
      {"priority as string", "POST", "/v1/jobs", "SPEC:priority=\"high\"", NULL, NULL, 400,
       "INVALID_ARGUMENT", "priority"},
      {"layers as object", "POST", "/v1/jobs", "SPEC:model.layers={}", NULL, NULL, 400,
       "INVALID_ARGUMENT", "model.layers"},
      {"units as float", "POST", "/v1/jobs", "SPEC:model.layers.units=2.5", NULL, NULL, 400,
       "INVALID_ARGUMENT", NULL},
      {"batch_size as bool", "POST", "/v1/jobs", "SPEC:pipeline.batch_size=true", NULL, NULL, 400,
       "INVALID_ARGUMENT", "pipeline.batch_size"},
      {"learning_rate as string", "POST", "/v1/jobs", "SPEC:optimizer.learning_rate=\"fast\"", NULL,
       NULL, 400, "INVALID_ARGUMENT", "optimizer.learning_rate"},
      /* out of range */
      {"epochs 0", "POST", "/v1/jobs", "SPEC:epochs=0", NULL, NULL, 400, "INVALID_ARGUMENT",
       "epochs"},
      {"epochs huge", "POST", "/v1/jobs", "SPEC:epochs=99999999999", NULL, NULL, 400,
       "INVALID_ARGUMENT", "epochs"},
      {"priority 101", "POST", "/v1/jobs", "SPEC:priority=101", NULL, NULL, 400, "INVALID_ARGUMENT",
       "priority"},
      {"priority -1", "POST", "/v1/jobs", "SPEC:priority=-1", NULL, NULL, 400, "INVALID_ARGUMENT",
       "priority"},
      {"batch_size 0", "POST", "/v1/jobs", "SPEC:pipeline.batch_size=0", NULL, NULL, 400,
       "INVALID_ARGUMENT", "pipeline.batch_size"},
      {"learning_rate negative", "POST", "/v1/jobs", "SPEC:optimizer.learning_rate=-0.1", NULL,
       NULL, 400, "INVALID_ARGUMENT", "optimizer.learning_rate"},
      {"devices 0", "POST", "/v1/jobs", "SPEC:resources.devices=0", NULL, NULL, 400,
       "INVALID_ARGUMENT", "resources.devices"},
      /* specs that could never be placed */
      {"more devices than the pool", "POST", "/v1/jobs", "SPEC:resources.devices=256", NULL, NULL,
       409, "FAILED_PRECONDITION", "resources.devices"},
      {"unknown pool", "POST", "/v1/jobs", "SPEC:resources.pool=\"fast\"", NULL, NULL, 409,
       "FAILED_PRECONDITION", "resources.pool"},
      {"gpu job in a pool of cores", "POST", "/v1/jobs",
       "SPEC:resources={\"device_type\":\"gpu\",\"pool\":\"default\"}", NULL, NULL, 409,
       "FAILED_PRECONDITION", "resources.device_type"},
      {"display_name too long", "POST", "/v1/jobs", long_name, NULL, NULL, 400, "INVALID_ARGUMENT",
       "display_name"},
      /* unknown fields and values */
      {"unknown top-level field", "POST", "/v1/jobs", "SPEC:epoch=2", NULL, NULL, 400,
       "INVALID_ARGUMENT", "epoch"},
      {"unknown optimizer", "POST", "/v1/jobs", "SPEC:optimizer.type=\"lbfgs\"", NULL, NULL, 400,
       "INVALID_ARGUMENT", "optimizer.type"},
      {"unknown device type", "POST", "/v1/jobs", "SPEC:resources.device_type=\"tpu\"", NULL, NULL,
       400, "INVALID_ARGUMENT", "resources.device_type"},
      {"missing model", "POST", "/v1/jobs", "SPEC:model=-", NULL, NULL, 400, "INVALID_ARGUMENT",
       "model"},
      /* path traversal in names */
      {"dataset name traversal", "POST", "/v1/jobs", "SPEC:dataset.name=\"../../etc/passwd\"", NULL,
       NULL, 400, "INVALID_ARGUMENT", "dataset.name"},
      {"request_id traversal", "POST", "/v1/jobs?request_id=..%2F..%2Fetc", "SPEC:seed=1", NULL,
       NULL, 400, "INVALID_ARGUMENT", "request_id"},
      {"request_id too long", "POST", long_rid, "SPEC:seed=1", NULL, NULL, 400, "INVALID_ARGUMENT",
       "request_id"},
      {"job id traversal", "GET", "/v1/jobs/..%2F..%2Fetc%2Fpasswd", NULL, NULL, NULL, 404,
       "NOT_FOUND", NULL},
      {"job id with space", "GET", "/v1/jobs/a%20b", NULL, NULL, NULL, 404, "NOT_FOUND", "job"},
      {"unknown job", "GET", "/v1/jobs/20260101-0123456789abcdef", NULL, NULL, NULL, 404,
       "NOT_FOUND", "job"},
      {"checkpoint not a number", "GET", "/v1/jobs/{job}/checkpoints/abc", NULL, NULL, NULL, 404,
       "NOT_FOUND", "checkpoint"},
      {"unknown route", "GET", "/v1/nothing", NULL, NULL, NULL, 404, "NOT_FOUND", "path"},
      {"wrong method", "PUT", "/v1/jobs", "{}", NULL, NULL, 405, "UNIMPLEMENTED", "method"},
      /* bad tokens */
      {"no token", "GET", "/v1/jobs", NULL, "", NULL, 401, "UNAUTHENTICATED", "Authorization"},
      {"basic auth", "GET", "/v1/jobs", NULL, "Basic YWRtaW46YWRtaW4=", NULL, 401,
       "UNAUTHENTICATED", "Authorization"},
      {"unknown token", "GET", "/v1/jobs", NULL, "Bearer kiln_deadbeef", NULL, 401,
       "UNAUTHENTICATED", "Authorization"},
      {"empty bearer", "POST", "/v1/jobs", "SPEC:seed=1", "Bearer ", NULL, 401, "UNAUTHENTICATED",
       "Authorization"},
      /* bad page tokens, sizes, filters, orders */
      {"garbage page token", "GET", "/v1/jobs?page_token=garbage!", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "page_token"},
      {"forged page token", "GET", "/v1/jobs?page_token=cDE6MA", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "page_token"},
      {"page token of another order", "GET", asc_token, NULL, NULL, NULL, 400, "INVALID_ARGUMENT",
       "page_token"},
      {"negative page size", "GET", "/v1/jobs?page_size=-1", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "page_size"},
      {"page size not a number", "GET", "/v1/jobs?page_size=ten", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "page_size"},
      {"filter unknown state", "GET", "/v1/jobs?filter=state%3DDONE", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "filter"},
      {"filter unknown key", "GET", "/v1/jobs?filter=owner%3Dx", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "filter"},
      {"filter without =", "GET", "/v1/jobs?filter=RUNNING", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "filter"},
      {"filter tenant as user", "GET", "/v1/jobs?filter=tenant%3Dbeta", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "filter"},
      {"bad order_by", "GET", "/v1/jobs?order_by=name", NULL, NULL, NULL, 400, "INVALID_ARGUMENT",
       "order_by"},
      {"bad validate_only", "POST", "/v1/jobs?validate_only=yes", "SPEC:seed=1", NULL, NULL, 400,
       "INVALID_ARGUMENT", "validate_only"},
      /* bad arguments on a job's routes */
      {"bad wait timeout", "POST", "/v1/jobs/{job}:wait?timeout=forever", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "timeout"},
      {"max_points 0", "GET", "/v1/jobs/{job}/metrics?max_points=0", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "max_points"},
      {"step range reversed", "GET", "/v1/jobs/{job}/metrics?start_step=5&end_step=2", NULL, NULL,
       NULL, 400, "INVALID_ARGUMENT", "start_step"},
      {"bad Last-Event-ID", "GET", "/v1/jobs/{job}/metrics:watch", NULL, NULL, "Last-Event-ID: ten",
       400, "INVALID_ARGUMENT", "Last-Event-ID"},
      {"cancel a finished job", "POST", "/v1/jobs/{job}:cancel", NULL, NULL, NULL, 409,
       "FAILED_PRECONDITION", "state"},
      {"resume a succeeded job", "POST", "/v1/jobs/{job}:resume", NULL, NULL, NULL, 409,
       "FAILED_PRECONDITION", "state"},
      /* more bad JSON */
      {"unterminated string", "POST", "/v1/jobs", "{\"display_name\":\"x", NULL, NULL, 400,
       "INVALID_ARGUMENT", NULL},
      {"single-quoted JSON", "POST", "/v1/jobs", "{'epochs':1}", NULL, NULL, 400,
       "INVALID_ARGUMENT", NULL},
      {"trailing comma", "POST", "/v1/jobs", "{\"epochs\":1,}", NULL, NULL, 400, "INVALID_ARGUMENT",
       NULL},
      {"NaN literal", "POST", "/v1/jobs", "{\"seed\":NaN}", NULL, NULL, 400, "INVALID_ARGUMENT",
       NULL},
      {"number body", "POST", "/v1/jobs", "123", NULL, NULL, 400, "INVALID_ARGUMENT", NULL},
      {"string body", "POST", "/v1/jobs", "\"spec\"", NULL, NULL, 400, "INVALID_ARGUMENT", NULL},
      {"boolean body", "POST", "/v1/jobs", "true", NULL, NULL, 400, "INVALID_ARGUMENT", NULL},
      {"empty object", "POST", "/v1/jobs", "{}", NULL, NULL, 400, "INVALID_ARGUMENT", "model"},
      {"deeply nested", "POST", "/v1/jobs", deep, NULL, NULL, 400, "INVALID_ARGUMENT", NULL},
      /* more wrong types */
      {"display_name as number", "POST", "/v1/jobs", "SPEC:display_name=7", NULL, NULL, 400,
       "INVALID_ARGUMENT", "display_name"},
      {"seed as string", "POST", "/v1/jobs", "SPEC:seed=\"42\"", NULL, NULL, 400,
       "INVALID_ARGUMENT", "seed"},
      {"model as array", "POST", "/v1/jobs", "SPEC:model=[]", NULL, NULL, 400, "INVALID_ARGUMENT",
       "model"},
      {"dataset as number", "POST", "/v1/jobs", "SPEC:dataset=1", NULL, NULL, 400,
       "INVALID_ARGUMENT", "dataset"},
      {"optimizer as string", "POST", "/v1/jobs", "SPEC:optimizer=\"adam\"", NULL, NULL, 400,
       "INVALID_ARGUMENT", "optimizer"},
      {"resources as array", "POST", "/v1/jobs", "SPEC:resources=[1]", NULL, NULL, 400,
       "INVALID_ARGUMENT", "resources"},
      {"epochs as float", "POST", "/v1/jobs", "SPEC:epochs=2.5", NULL, NULL, 400,
       "INVALID_ARGUMENT", "epochs"},
      {"priority as float", "POST", "/v1/jobs", "SPEC:priority=1.5", NULL, NULL, 400,
       "INVALID_ARGUMENT", "priority"},
      {"metrics as string", "POST", "/v1/jobs", "SPEC:metrics=\"accuracy\"", NULL, NULL, 400,
       "INVALID_ARGUMENT", "metrics"},
      {"input_shape as string", "POST", "/v1/jobs", "SPEC:model.input_shape=\"28x28\"", NULL, NULL,
       400, "INVALID_ARGUMENT", "model.input_shape"},
      {"shuffle as string", "POST", "/v1/jobs", "SPEC:pipeline.shuffle=\"yes\"", NULL, NULL, 400,
       "INVALID_ARGUMENT", "pipeline.shuffle"},
      {"loss as number", "POST", "/v1/jobs", "SPEC:loss=3", NULL, NULL, 400, "INVALID_ARGUMENT",
       "loss"},
      /* more out of range */
      {"units 0", "POST", "/v1/jobs", "SPEC:model.layers.units=0", NULL, NULL, 400,
       "INVALID_ARGUMENT", NULL},
      {"negative seed", "POST", "/v1/jobs", "SPEC:seed=-5", NULL, NULL, 400, "INVALID_ARGUMENT",
       "seed"},
      {"empty display_name", "POST", "/v1/jobs", "SPEC:display_name=\"\"", NULL, NULL, 400,
       "INVALID_ARGUMENT", "display_name"},
      {"input_shape with 0", "POST", "/v1/jobs", "SPEC:model.input_shape=[28,0,1]", NULL, NULL, 400,
       "INVALID_ARGUMENT", NULL},
      {"learning_rate 0", "POST", "/v1/jobs", "SPEC:optimizer.learning_rate=0", NULL, NULL, 400,
       "INVALID_ARGUMENT", "optimizer.learning_rate"},
      {"batch_size huge", "POST", "/v1/jobs", "SPEC:pipeline.batch_size=99999999999", NULL, NULL,
       400, "INVALID_ARGUMENT", "pipeline.batch_size"},
      {"devices negative", "POST", "/v1/jobs", "SPEC:resources.devices=-2", NULL, NULL, 400,
       "INVALID_ARGUMENT", "resources.devices"},
      /* more unknown fields and values */
      {"unknown model field", "POST", "/v1/jobs", "SPEC:model.depth=3", NULL, NULL, 400,
       "INVALID_ARGUMENT", "model.depth"},
      {"unknown pipeline field", "POST", "/v1/jobs", "SPEC:pipeline.workers=3", NULL, NULL, 400,
       "INVALID_ARGUMENT", "pipeline.workers"},
      {"unknown loss", "POST", "/v1/jobs", "SPEC:loss=\"hinge_of_fate\"", NULL, NULL, 400,
       "INVALID_ARGUMENT", "loss"},
      {"unknown layer type", "POST", "/v1/jobs", "SPEC:model.layers.type=\"wormhole\"", NULL, NULL,
       400, "INVALID_ARGUMENT", NULL},
      {"unknown activation", "POST", "/v1/jobs", "SPEC:model.layers.activation=\"zap\"", NULL, NULL,
       400, "INVALID_ARGUMENT", NULL},
      {"unknown dataset", "POST", "/v1/jobs", "SPEC:dataset.name=\"imagenet-22k\"", NULL, NULL, 400,
       "INVALID_ARGUMENT", "dataset.name"},
      {"unknown metric", "POST", "/v1/jobs", "SPEC:metrics=[\"vibes\"]", NULL, NULL, 400,
       "INVALID_ARGUMENT", NULL},
      {"unknown dataset field", "POST", "/v1/jobs", "SPEC:dataset.mirror=\"x\"", NULL, NULL, 400,
       "INVALID_ARGUMENT", "dataset.mirror"},
      /* more bad paths and ids */
      {"another tenant's job", "GET", "/v1/jobs/{job}", NULL, "BETA", NULL, 404, "NOT_FOUND",
       "job"},
      {"cancel another tenant's job", "POST", "/v1/jobs/{job}:cancel", NULL, "BETA", NULL, 404,
       "NOT_FOUND", "job"},
      {"delete another tenant's job", "DELETE", "/v1/jobs/{job}", NULL, "BETA", NULL, 404,
       "NOT_FOUND", "job"},
      {"job id too long", "GET",
       "/v1/jobs/"
       "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
       NULL, NULL, NULL, 404, "NOT_FOUND", "job"},
      {"checkpoint 0", "GET", "/v1/jobs/{job}/checkpoints/0", NULL, NULL, NULL, 404, "NOT_FOUND",
       "checkpoint"},
      {"checkpoint negative", "GET", "/v1/jobs/{job}/checkpoints/-1", NULL, NULL, NULL, 404,
       "NOT_FOUND", "checkpoint"},
      {"checkpoint overflow", "GET", "/v1/jobs/{job}/checkpoints/99999999999999999999999", NULL,
       NULL, NULL, 404, "NOT_FOUND", "checkpoint"},
      {"unknown checkpoint", "GET", "/v1/jobs/{job}/checkpoints/424242", NULL, NULL, NULL, 404,
       "NOT_FOUND", "checkpoint"},
      {"download unknown checkpoint", "GET", "/v1/jobs/{job}/checkpoints/7:download", NULL, NULL,
       NULL, 404, "NOT_FOUND", "checkpoint"},
      {"pin unknown checkpoint", "POST", "/v1/jobs/{job}/checkpoints/7:pin", NULL, NULL, NULL, 404,
       "NOT_FOUND", "checkpoint"},
      {"unknown custom method", "POST", "/v1/jobs/{job}:frobnicate", NULL, NULL, NULL, 404,
       "NOT_FOUND", "path"},
      {"unknown sub-collection", "GET", "/v1/jobs/{job}/secrets", NULL, NULL, NULL, 404,
       "NOT_FOUND", "path"},
      {"upper-case collection", "GET", "/v1/JOBS", NULL, NULL, NULL, 404, "NOT_FOUND", "path"},
      {"no version", "GET", "/jobs", NULL, NULL, NULL, 404, "NOT_FOUND", "path"},
      {"unknown data set", "GET", "/v1/datasets/ds-0000000000000000", NULL, NULL, NULL, 404,
       "NOT_FOUND", "dataset"},
      {"data set id traversal", "GET", "/v1/datasets/..%2Fkiln.db", NULL, NULL, NULL, 404,
       "NOT_FOUND", "path"},
      {"delete a built-in data set", "DELETE", "/v1/datasets/fashion-mnist", NULL, NULL, NULL, 409,
       "FAILED_PRECONDITION", "dataset"},
      {"unknown token id", "DELETE", "/v1/tokens/tok-ffffffffffff", NULL, NULL, NULL, 404,
       "NOT_FOUND", "token"},
      {"token id with space", "DELETE", "/v1/tokens/tok%20x", NULL, NULL, NULL, 404, "NOT_FOUND",
       "token"},
      /* more wrong methods */
      {"DELETE the collection", "DELETE", "/v1/jobs", NULL, NULL, NULL, 405, "UNIMPLEMENTED",
       "method"},
      {"GET a cancel", "GET", "/v1/jobs/{job}:cancel", NULL, NULL, NULL, 405, "UNIMPLEMENTED",
       "method"},
      {"POST to a job", "POST", "/v1/jobs/{job}", "{}", NULL, NULL, 405, "UNIMPLEMENTED", "method"},
      {"PATCH a job", "PATCH", "/v1/jobs/{job}", "{}", NULL, NULL, 405, "UNIMPLEMENTED", "method"},
      {"PUT the data sets", "PUT", "/v1/datasets", "{}", NULL, NULL, 405, "UNIMPLEMENTED",
       "method"},
      {"POST the devices", "POST", "/v1/devices", "{}", NULL, NULL, 405, "UNIMPLEMENTED", "method"},
      {"POST healthz", "POST", "/healthz", "{}", NULL, NULL, 405, "UNIMPLEMENTED", "method"},
      {"PUT a token", "PUT", "/v1/tokens", "{}", NULL, NULL, 405, "UNIMPLEMENTED", "method"},
      /* more bad headers and tokens */
      {"lower-case scheme, unknown token", "GET", "/v1/jobs", NULL, "bearer kiln_00", NULL, 401,
       "UNAUTHENTICATED", "Authorization"},
      {"Token scheme", "GET", "/v1/jobs", NULL, "Token kiln_00", NULL, 401, "UNAUTHENTICATED",
       "Authorization"},
      {"scheme only", "GET", "/v1/jobs", NULL, "Bearer", NULL, 401, "UNAUTHENTICATED",
       "Authorization"},
      {"token with spaces", "GET", "/v1/jobs", NULL, "Bearer kiln_00 kiln_11", NULL, 401,
       "UNAUTHENTICATED", "Authorization"},
      {"revoked-looking token", "DELETE", "/v1/tokens/tok-000000000000", NULL,
       "Bearer kiln_ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff", NULL, 401,
       "UNAUTHENTICATED", "Authorization"},
      {"negative Last-Event-ID", "GET", "/v1/jobs/{job}/metrics:watch", NULL, NULL,
       "Last-Event-ID: -1", 400, "INVALID_ARGUMENT", "Last-Event-ID"},
      {"Last-Event-ID with letters", "GET", "/v1/jobs/{job}/metrics:watch", NULL, NULL,
       "Last-Event-ID: 12abc", 400, "INVALID_ARGUMENT", "Last-Event-ID"},
      /* more bad query parameters */
      {"page size fraction", "GET", "/v1/jobs?page_size=1.5", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "page_size"},
      {"page size empty", "GET", "/v1/jobs?page_size=", NULL, NULL, NULL, 400, "INVALID_ARGUMENT",
       "page_size"},
      {"page size hex", "GET", "/v1/jobs?page_size=0x10", NULL, NULL, NULL, 400, "INVALID_ARGUMENT",
       "page_size"},
      {"data sets page size", "GET", "/v1/datasets?page_size=many", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "page_size"},
      {"data sets page token", "GET", "/v1/datasets?page_token=%%%%", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "page_token"},
      {"page token too long", "GET",
       "/v1/jobs?page_token="
       "cDE6MTAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAw",
       NULL, NULL, NULL, 400, "INVALID_ARGUMENT", "page_token"},
      {"page token of another filter", "GET", filtered_token, NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "page_token"},
      {"page token of another tenant", "GET", acme_page_token, NULL, "BETA", NULL, 400,
       "INVALID_ARGUMENT", "page_token"},
      {"filter empty state", "GET", "/v1/jobs?filter=state%3D", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "filter"},
      {"filter lower-case state", "GET", "/v1/jobs?filter=state%3Drunning", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "filter"},
      {"filter with OR", "GET", "/v1/jobs?filter=state%3DQUEUED%20OR%20state%3DRUNNING", NULL, NULL,
       NULL, 400, "INVALID_ARGUMENT", "filter"},
      {"filter too long", "GET", long_filter, NULL, NULL, NULL, 400, "INVALID_ARGUMENT", "filter"},
      {"filter empty tenant", "GET", "/v1/jobs?filter=tenant%3D", NULL, "ADMIN", NULL, 400,
       "INVALID_ARGUMENT", "filter"},
      {"order_by sideways", "GET", "/v1/jobs?order_by=create_time%20sideways", NULL, NULL, NULL,
       400, "INVALID_ARGUMENT", "order_by"},
      {"validate_only TRUE", "POST", "/v1/jobs?validate_only=TRUE", "SPEC:seed=1", NULL, NULL, 400,
       "INVALID_ARGUMENT", "validate_only"},
      {"empty request_id", "POST", "/v1/jobs?request_id=", "SPEC:seed=1", NULL, NULL, 400,
       "INVALID_ARGUMENT", "request_id"},
      {"request_id with slash", "POST", "/v1/jobs?request_id=a%2Fb", "SPEC:seed=1", NULL, NULL, 400,
       "INVALID_ARGUMENT", "request_id"},
      {"negative wait timeout", "POST", "/v1/jobs/{job}:wait?timeout=-5s", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "timeout"},
      {"wait timeout over an hour", "POST", "/v1/jobs/{job}:wait?timeout=7200s", NULL, NULL, NULL,
       400, "INVALID_ARGUMENT", "timeout"},
      {"wait timeout in hours", "POST", "/v1/jobs/{job}:wait?timeout=1h", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "timeout"},
      {"start_step negative", "GET", "/v1/jobs/{job}/metrics?start_step=-1", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "start_step"},
      {"end_step not a number", "GET", "/v1/jobs/{job}/metrics?end_step=last", NULL, NULL, NULL,
       400, "INVALID_ARGUMENT", "end_step"},
      {"max_points too many", "GET", "/v1/jobs/{job}/metrics?max_points=100001", NULL, NULL, NULL,
       400, "INVALID_ARGUMENT", "max_points"},
      {"profile format", "GET", "/v1/jobs/{job}/profile?format=svg", NULL, NULL, NULL, 400,
       "INVALID_ARGUMENT", "format"},
      {"export without a format", "GET", "/v1/jobs/{job}/checkpoints/1:export", NULL, NULL, NULL,
       400, "INVALID_ARGUMENT", "format"},
      {"upload format", "POST", "/v1/datasets?format=xls", "a,b\n1,2\n", NULL, NULL, 400,
       "INVALID_ARGUMENT", "format"},
      {"csv upload without label_column", "POST", "/v1/datasets?format=csv", "a,b\n1,2\n", NULL,
       NULL, 400, "INVALID_ARGUMENT", "label_column"},
      {"upload display_name too long", "POST", long_upload, "a,b\n1,2\n", NULL, NULL, 400,
       "INVALID_ARGUMENT", "display_name"},
      {"empty upload", "POST", "/v1/datasets?format=csv&label_column=a", "", NULL, NULL, 400,
       "INVALID_ARGUMENT", "body"},
      /* the token API */
      {"user creates a token", "POST", "/v1/tokens", "{\"tenant\":\"acme\"}", NULL, NULL, 403,
       "PERMISSION_DENIED", "role"},
      {"token without tenant", "POST", "/v1/tokens", "{\"role\":\"user\"}", "ADMIN", NULL, 400,
       "INVALID_ARGUMENT", "tenant"},
      {"token tenant upper-case", "POST", "/v1/tokens", "{\"tenant\":\"ACME\"}", "ADMIN", NULL, 400,
       "INVALID_ARGUMENT", "tenant"},
      {"token tenant as number", "POST", "/v1/tokens", "{\"tenant\":7}", "ADMIN", NULL, 400,
       "INVALID_ARGUMENT", "tenant"},
      {"token role unknown", "POST", "/v1/tokens", "{\"tenant\":\"acme\",\"role\":\"owner\"}",
       "ADMIN", NULL, 400, "INVALID_ARGUMENT", "role"},
      {"token unknown field", "POST", "/v1/tokens", "{\"tenant\":\"acme\",\"expires\":1}", "ADMIN",
       NULL, 400, "INVALID_ARGUMENT", "expires"},
      {"token body not JSON", "POST", "/v1/tokens", "tenant=acme", "ADMIN", NULL, 400,
       "INVALID_ARGUMENT", NULL},
      {"token body an array", "POST", "/v1/tokens", "[]", "ADMIN", NULL, 400, "INVALID_ARGUMENT",
       NULL},
      /* /metrics */
      {"metrics without a token", "GET", "/metrics", NULL, "", NULL, 401, "UNAUTHENTICATED",
       "Authorization"},
      {"metrics as a user", "GET", "/metrics", NULL, NULL, NULL, 403, "PERMISSION_DENIED", "role"},
  };
  size_t n_cases = sizeof cases / sizeof cases[0];
  assert_true(n_cases >= 150);
  char *before = db_snapshot();
  int failures = 0;
  for (size_t i = 0; i < n_cases; i++) {
    const bad_case *c = &cases[i];
    char path[1024], auth[200];
    const char *job_at = strstr(c->path, "{job}");
    if (job_at) {
      snprintf(path, sizeof path, "%.*s%s%s", (int)(job_at - c->path), c->path, finished,
               job_at + 5);
    } else {
      snprintf(path, sizeof path, "%s", c->path);
    }
    char *body = NULL;
    if (c->body && strncmp(c->body, "SPEC:", 5) == 0) {
      body = patched_spec(c->body + 5);
    } else if (c->body && strchr(c->body, '=') && c->body[0] == 'd') {
      body = patched_spec(c->body); /* display_name=... */
    } else if (c->body) {
      body = strdup(c->body);
    }
    if (c->auth && (!strcmp(c->auth, "BETA") || !strcmp(c->auth, "ADMIN"))) {
      snprintf(auth, sizeof auth, "Bearer %s", c->auth[0] == 'B' ? beta_token : admin_token);
    } else if (c->auth) {
      snprintf(auth, sizeof auth, "%s", c->auth);
    } else {
      snprintf(auth, sizeof auth, "Bearer %s", acme_token);
    }
    json_t *answer = NULL;
    long status = request(c->method, path, body, body ? strlen(body) : 0, auth[0] ? auth : NULL,
                          c->header, NULL, &answer);
    free(body);
    char why[600];
    if (status != c->code)
      snprintf(why, sizeof why, "HTTP %ld, want %ld", status, c->code);
    else
      error_mismatch(answer, c->code, c->status, c->field, why, sizeof why);
    json_decref(answer);
    if (why[0]) {
      print_message("FAIL %3zu %-34s %s\n", i + 1, c->name, why);
      failures++;
    } else {
      print_message("ok %3zu %-34s %ld %s %s\n", i + 1, c->name, status, c->status,
                    c->field ? c->field : "");
    }
    /* The server keeps serving after each. */
    assert_int_equal(request("GET", "/healthz", NULL, 0, NULL, NULL, NULL, NULL), 200);
  }
  if (failures) fail_msg("%d of %zu malformed requests got the wrong answer", failures, n_cases);
  /* An oversized body: 413 before it is read. */
  size_t big = 2u << 20;
  char *huge = malloc(big);
  memset(huge, ' ', big);
  huge[0] = '{';
  huge[big - 1] = '}';
  char auth[200];
  snprintf(auth, sizeof auth, "Bearer %s", acme_token);
  json_t *answer = NULL;
  assert_int_equal(request("POST", "/v1/jobs", huge, big, auth, NULL, NULL, &answer), 413);
  free(huge);
  assert_error(answer, 413, "RESOURCE_EXHAUSTED", "body");
  json_decref(answer);
  print_message("ok %2zu %-30s 413 RESOURCE_EXHAUSTED\n", n_cases + 1, "oversized body");
  free(deep);
  char *after = db_snapshot();
  assert_string_equal(before, after);
  free(before);
  free(after);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(bad_inputs_get_the_right_4xx_and_change_nothing),
  };
  return cmocka_run_group_tests(tests, start, stop);
}
