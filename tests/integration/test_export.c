/* test_export.c — ONNX export through a real kilnd and kiln-train: the
 * :export route (200 with the model, 400 naming format, 404 for a missing
 * checkpoint) and `kiln export JOB [--step N] -O FILE`, whose files must be
 * byte for byte what `kiln-train --export-onnx --weights` writes from the
 * same checkpoint. */
#include <jansson.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static char data_dir[256], work[300];
static char base_url[64], admin_token[128];
static pid_t kilnd_pid;
static char job_id[64];

/* Three epochs of 4 steps on 256 images, a checkpoint every 2 steps:
 * checkpoints at steps 2, 4, ..., 12. */
static const char spec[] =
    "{\"display_name\":\"export-test\",\"model\":{\"input_shape\":[28,28,1],\"layers\":["
    "{\"type\":\"conv2d\",\"filters\":4,\"kernel_size\":3,\"activation\":\"relu\"},"
    "{\"type\":\"batch_norm\"},{\"type\":\"max_pool2d\"},{\"type\":\"flatten\"},"
    "{\"type\":\"dropout\",\"rate\":0.2},"
    "{\"type\":\"dense\",\"name\":\"probs\",\"units\":10,\"activation\":\"softmax\"}]},"
    "\"loss\":\"sparse_categorical_crossentropy\","
    "\"dataset\":{\"name\":\"fashion-mnist\",\"validation\":\"none\"},"
    "\"pipeline\":{\"batch_size\":64,\"take\":256},\"optimizer\":{\"type\":\"adam\"},"
    "\"epochs\":3,\"seed\":5,\"checkpoint\":{\"every_steps\":2}}";

static int start_kilnd(void **state) {
  (void)state;
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-export-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  snprintf(work, sizeof work, "%s/work", data_dir);
  if (mkdir(work, 0700) != 0) return -1;
  char data_sub[300];
  snprintf(data_sub, sizeof data_sub, "%s/data", data_dir);
  return it_launch_kilnd(KILND_PATH, data_sub, KILN_TRAIN_PATH, NULL, NULL, &kilnd_pid, base_url,
                         sizeof base_url, admin_token, sizeof admin_token);
}

static int stop_kilnd(void **state) {
  (void)state;
  return it_stop_kilnd(kilnd_pid, data_dir);
}

static long api(const char *method, const char *path, const char *body, json_t **doc) {
  char *text = NULL;
  long status =
      it_request(base_url, admin_token, method, path, body, body ? strlen(body) : 0, &text);
  if (doc) *doc = text ? json_loads(text, 0, NULL) : NULL;
  free(text);
  return status;
}

static char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)size + 1);
  *len = fread(buf, 1, (size_t)size, f);
  fclose(f);
  return buf;
}

static void expect_same_file(const char *a, const char *b) {
  size_t la = 0, lb = 0;
  char *x = read_all(a, &la), *y = read_all(b, &lb);
  if (!x || !y) fail_msg("cannot read %s or %s", a, b);
  assert_true(la > 1000);
  assert_int_equal(la, lb);
  assert_memory_equal(x, y, la);
  free(x);
  free(y);
}

static int curl_get(const char *path, const char *out) {
  char cmd[2048], text[64];
  snprintf(cmd, sizeof cmd,
           "curl -s -o '%s' -w '%%{http_code}' -H 'Authorization: Bearer %s' '%s%s'", out,
           admin_token, base_url, path);
  assert_int_equal(it_run(text, sizeof text, cmd), 0);
  return atoi(text);
}

/* The checkpoint at step (-1: the newest) of the job: its id, and its file
 * as :download serves it (the API shows no server path) in path. */
static void checkpoint_at(int64_t step, int64_t *id, char *path, size_t len) {
  char url[200];
  snprintf(url, sizeof url, "/v1/jobs/%s/checkpoints", job_id);
  json_t *doc;
  assert_int_equal(api("GET", url, NULL, &doc), 200);
  json_t *list = json_object_get(doc, "checkpoints");
  assert_true(json_array_size(list) >= 2);
  *id = -1;
  for (size_t i = 0; i < json_array_size(list); i++) {
    json_t *c = json_array_get(list, i);
    if (step < 0 || json_integer_value(json_object_get(c, "step")) == step)
      *id = json_integer_value(json_object_get(c, "id"));
  }
  json_decref(doc);
  assert_true(*id > 0);
  snprintf(url, sizeof url, "/v1/jobs/%s/checkpoints/%lld:download", job_id, (long long)*id);
  snprintf(path, len, "%s/ckpt-%lld.safetensors", work, (long long)*id);
  assert_int_equal(curl_get(url, path), 200);
}

/* What kiln-train writes from that checkpoint file, into out. */
static void local_export(const char *checkpoint, const char *out) {
  char cmd[2048], text[2048], spec_path[400];
  snprintf(spec_path, sizeof spec_path, "%s/spec.json", work);
  FILE *f = fopen(spec_path, "w");
  assert_non_null(f);
  fputs(spec, f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "'%s' --export-onnx '%s' --weights '%s' '%s'", KILN_TRAIN_PATH, out,
           checkpoint, spec_path);
  if (it_run(text, sizeof text, cmd) != 0) fail_msg("%s: %s", cmd, text);
}

static void a_trained_job_exports_as_onnx(void **state) {
  (void)state;
  json_t *doc;
  assert_int_equal(api("POST", "/v1/jobs", spec, &doc), 200);
  snprintf(job_id, sizeof job_id, "%s", json_string_value(json_object_get(doc, "id")));
  json_decref(doc);
  char path[300];
  snprintf(path, sizeof path, "/v1/jobs/%s:wait?timeout=300s", job_id);
  assert_int_equal(api("POST", path, NULL, &doc), 200);
  assert_string_equal(json_string_value(json_object_get(doc, "state")), "SUCCEEDED");
  json_decref(doc);

  int64_t id;
  char ckpt[600], want[400], got[400];
  checkpoint_at(-1, &id, ckpt, sizeof ckpt);
  snprintf(want, sizeof want, "%s/want.onnx", work);
  snprintf(got, sizeof got, "%s/got.onnx", work);
  local_export(ckpt, want);
  snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints/%lld:export?format=onnx", job_id,
           (long long)id);
  assert_int_equal(curl_get(path, got), 200);
  expect_same_file(got, want);
  /* A ModelProto begins with ir_version (field 1) = 8. */
  size_t len;
  char *bytes = read_all(got, &len);
  assert_int_equal(bytes[0], 0x08);
  assert_int_equal(bytes[1], 0x08);
  free(bytes);
}

static void export_refuses_other_formats_naming_the_field(void **state) {
  (void)state;
  int64_t id;
  char ckpt[600], path[300];
  checkpoint_at(-1, &id, ckpt, sizeof ckpt);
  const char *queries[] = {"?format=tflite", "", "?format="};
  for (size_t i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints/%lld:export%s", job_id, (long long)id,
             queries[i]);
    json_t *doc;
    assert_int_equal(api("GET", path, NULL, &doc), 400);
    json_t *err = json_object_get(doc, "error");
    assert_string_equal(json_string_value(json_object_get(err, "status")), "INVALID_ARGUMENT");
    json_t *detail = json_array_get(json_object_get(err, "details"), 0);
    assert_string_equal(json_string_value(json_object_get(detail, "field")), "format");
    assert_non_null(strstr(json_string_value(json_object_get(err, "message")), "'onnx'"));
    json_decref(doc);
  }
}

static void export_of_a_missing_checkpoint_is_404(void **state) {
  (void)state;
  char path[300];
  snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints/999999:export?format=onnx", job_id);
  json_t *doc;
  assert_int_equal(api("GET", path, NULL, &doc), 404);
  json_t *detail = json_array_get(json_object_get(json_object_get(doc, "error"), "details"), 0);
  assert_string_equal(json_string_value(json_object_get(detail, "field")), "checkpoint");
  json_decref(doc);
  assert_int_equal(api("GET", "/v1/jobs/no-such-job/checkpoints/1:export?format=onnx", NULL, NULL),
                   404);
}

static int kiln(char *out, size_t outlen, const char *args) {
  char cmd[3072];
  snprintf(cmd, sizeof cmd, "cd '%s' && '%s' --server %s --token %s %s", work, KILN_CLI_PATH,
           base_url, admin_token, args);
  int status = it_run(out, outlen, cmd);
  print_message("$ kiln %s -> %d: %s\n", args, status, out);
  return status;
}

static void kiln_export_writes_the_newest_or_a_steps_model(void **state) {
  (void)state;
  char out[2048], args[300], file[400], want[400], ckpt[600];
  int64_t id;
  /* The newest checkpoint, to -O FILE. */
  snprintf(args, sizeof args, "export %s -O newest.onnx", job_id);
  assert_int_equal(kiln(out, sizeof out, args), 0);
  assert_non_null(strstr(out, "newest.onnx: ONNX model of job"));
  checkpoint_at(-1, &id, ckpt, sizeof ckpt);
  snprintf(want, sizeof want, "%s/want-newest.onnx", work);
  local_export(ckpt, want);
  snprintf(file, sizeof file, "%s/newest.onnx", work);
  expect_same_file(file, want);
  /* --step 4: that step's checkpoint, named JOB-step4.onnx by default. */
  snprintf(args, sizeof args, "export %s --step 4", job_id);
  assert_int_equal(kiln(out, sizeof out, args), 0);
  checkpoint_at(4, &id, ckpt, sizeof ckpt);
  snprintf(want, sizeof want, "%s/want-step4.onnx", work);
  local_export(ckpt, want);
  snprintf(file, sizeof file, "%s/%s-step4.onnx", work, job_id);
  expect_same_file(file, want);
  /* Step 4's model is not the newest one's. */
  size_t la, lb;
  char *a = read_all(file, &la);
  snprintf(file, sizeof file, "%s/newest.onnx", work);
  char *b = read_all(file, &lb);
  assert_true(la != lb || memcmp(a, b, la) != 0);
  free(a);
  free(b);
}

static void kiln_export_names_a_missing_step_and_a_bad_one(void **state) {
  (void)state;
  char out[2048], args[300];
  snprintf(args, sizeof args, "export %s --step 3 -O x.onnx", job_id);
  assert_int_equal(kiln(out, sizeof out, args), 1);
  assert_non_null(strstr(out, "no checkpoint at step 3"));
  snprintf(args, sizeof args, "export %s --step three", job_id);
  assert_int_equal(kiln(out, sizeof out, args), 2);
  assert_non_null(strstr(out, "--step must be a whole number"));
  snprintf(args, sizeof args, "ls --step 3");
  assert_int_equal(kiln(out, sizeof out, args), 2);
  assert_non_null(strstr(out, "--step applies to 'kiln export' only"));
  char path[400];
  snprintf(path, sizeof path, "%s/x.onnx", work);
  assert_int_not_equal(access(path, F_OK), 0); /* nothing written */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_trained_job_exports_as_onnx),
      cmocka_unit_test(export_refuses_other_formats_naming_the_field),
      cmocka_unit_test(export_of_a_missing_checkpoint_is_404),
      cmocka_unit_test(kiln_export_writes_the_newest_or_a_steps_model),
      cmocka_unit_test(kiln_export_names_a_missing_step_and_a_bad_one),
  };
  return cmocka_run_group_tests(tests, start_kilnd, stop_kilnd);
}
