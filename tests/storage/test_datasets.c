/* Uploaded data sets in the store: add, get, list newest first, and a
 * delete refused while an unfinished job names the data set; job notes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "storage.h"

static char dir[256], path[300];
static store *st;

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/kiln-test-store-ds-XXXXXX");
  if (!mkdtemp(dir)) return -1;
  snprintf(path, sizeof path, "%s/kiln.db", dir);
  char err[256];
  return store_open(path, &st, err, sizeof err);
}

static int teardown(void **state) {
  (void)state;
  store_close(st);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd);
}

static store_dataset make(const char *id, int64_t examples) {
  store_dataset d;
  memset(&d, 0, sizeof d);
  snprintf(d.id, sizeof d.id, "%s", id);
  snprintf(d.display_name, sizeof d.display_name, "iris");
  snprintf(d.format, sizeof d.format, "csv");
  snprintf(d.label_column, sizeof d.label_column, "species");
  snprintf(d.path, sizeof d.path, "/data/datasets/%s", id);
  d.bytes = 4550;
  snprintf(d.sha256, sizeof d.sha256, "%064d", 7);
  d.examples = examples;
  d.classes = 3;
  snprintf(d.input_shape_json, sizeof d.input_shape_json, "[4]");
  return d;
}

static void added_data_set_reads_back_and_lists_newest_first(void **state) {
  (void)state;
  store_dataset a = make("ds-000000000000000a", 150), b = make("ds-000000000000000b", 99);
  assert_int_equal(store_dataset_add(st, &a), STORE_OK);
  assert_int_equal(store_dataset_add(st, &b), STORE_OK);
  assert_int_equal(store_dataset_add(st, &a), STORE_EXISTS);
  store_dataset got;
  assert_int_equal(store_dataset_get(st, "ds-000000000000000a", &got), STORE_OK);
  assert_string_equal(got.label_column, "species");
  assert_int_equal(got.examples, 150);
  assert_int_equal(got.bytes, 4550);
  assert_string_equal(got.input_shape_json, "[4]");
  assert_true(got.create_ms > 0);
  assert_string_equal(got.source, "");
  assert_string_equal(got.shards_json, "");
  assert_int_equal(store_dataset_get(st, "ds-00000000000000ff", &got), STORE_NOT_FOUND);
  /* A registered folder of shards keeps its source and what its check found. */
  store_dataset c = make("ds-000000000000000c", 60000);
  snprintf(c.format, sizeof c.format, "tfrecord");
  snprintf(c.source, sizeof c.source, "shards/fm");
  snprintf(c.shards_json, sizeof c.shards_json, "{\"train_files\":8}");
  assert_int_equal(store_dataset_add(st, &c), STORE_OK);
  assert_int_equal(store_dataset_get(st, "ds-000000000000000c", &got), STORE_OK);
  assert_string_equal(got.format, "tfrecord");
  assert_string_equal(got.source, "shards/fm");
  assert_string_equal(got.shards_json, "{\"train_files\":8}");
  assert_int_equal(store_dataset_delete(st, "ds-000000000000000c", NULL), STORE_OK);
  store_dataset *list = NULL;
  int n = 0;
  assert_int_equal(store_dataset_list(st, 0, 10, &list, &n), STORE_OK);
  assert_int_equal(n, 2);
  assert_string_equal(list[0].id, "ds-000000000000000b");
  assert_string_equal(list[1].id, "ds-000000000000000a");
  int64_t next = list[0].seq;
  free(list);
  assert_int_equal(store_dataset_list(st, next, 10, &list, &n), STORE_OK);
  assert_int_equal(n, 1);
  assert_string_equal(list[0].id, "ds-000000000000000a");
  free(list);
}

static void delete_is_refused_while_an_unfinished_job_uses_it(void **state) {
  (void)state;
  store_dataset d = make("ds-00000000000000c0", 10);
  assert_int_equal(store_dataset_add(st, &d), STORE_OK);
  store_job job;
  memset(&job, 0, sizeof job);
  snprintf(job.id, sizeof job.id, "job-1");
  job.spec_json = "{\"dataset\":{\"name\":\"ds-00000000000000c0\",\"validation\":\"none\"}}";
  assert_int_equal(store_job_create(st, &job, NULL), STORE_OK);
  char blocking[40] = "";
  assert_int_equal(store_dataset_delete(st, "ds-00000000000000c0", blocking), STORE_CONFLICT);
  assert_string_equal(blocking, "job-1");
  assert_non_null(strstr(store_errmsg(st), "job job-1 uses it"));
  store_dataset got;
  assert_int_equal(store_dataset_get(st, "ds-00000000000000c0", &got), STORE_OK);
  /* A note is an event that keeps the state. */
  assert_int_equal(store_job_note(st, "job-1", "PIPELINE_TUNED", "2 threads"), STORE_OK);
  store_event *events = NULL;
  int n = 0;
  assert_int_equal(store_event_list(st, "job-1", &events, &n), STORE_OK);
  assert_int_equal(n, 2);
  assert_string_equal(events[1].from_state, "QUEUED");
  assert_string_equal(events[1].to_state, "QUEUED");
  assert_string_equal(events[1].reason, "PIPELINE_TUNED");
  assert_string_equal(events[1].message, "2 threads");
  store_event_list_free(events, n);
  /* Once the job is done, the data set can go. */
  assert_int_equal(store_job_transition(st, "job-1", NULL, "CANCELLED", "CANCELLED", ""), STORE_OK);
  assert_int_equal(store_dataset_delete(st, "ds-00000000000000c0", blocking), STORE_OK);
  assert_int_equal(store_dataset_get(st, "ds-00000000000000c0", &got), STORE_NOT_FOUND);
  assert_int_equal(store_dataset_delete(st, "ds-00000000000000c0", blocking), STORE_NOT_FOUND);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(added_data_set_reads_back_and_lists_newest_first),
      cmocka_unit_test(delete_is_refused_while_an_unfinished_job_uses_it),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
