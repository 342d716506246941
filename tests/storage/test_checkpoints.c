/* test_checkpoints.c — checkpoint retention: the newest keep_last stay, and
 * with keep_best the best by a metric too; the rest go with their files; a
 * file already gone counts as removed, one that cannot be removed keeps its
 * row; other jobs are untouched; a pinned checkpoint is never removed. And
 * the rows of a data directory that moved (store_relocate). */
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

static void add_with(fixture *f, const char *job, int attempt, int64_t step, const char *metrics,
                     char *path_out) {
  store_checkpoint c;
  memset(&c, 0, sizeof c);
  snprintf(c.job_id, sizeof c.job_id, "%s", job);
  c.attempt = attempt;
  c.step = step;
  snprintf(c.path, sizeof c.path, "%s/%s-%lld.safetensors", f->dir, job, (long long)step);
  snprintf(c.sha256, sizeof c.sha256, "%064d", 0);
  c.metrics_json = (char *)metrics;
  assert_int_equal(store_checkpoint_add(f->s, &c), STORE_OK);
  if (path_out) snprintf(path_out, 512, "%s", c.path);
}

static void add(fixture *f, const char *job, int attempt, int64_t step, char *path_out) {
  add_with(f, job, attempt, step, NULL, path_out);
}

static void create(fixture *f, const char *id) {
  store_job job;
  memset(&job, 0, sizeof job);
  snprintf(job.id, sizeof job.id, "%s", id);
  snprintf(job.tenant, sizeof job.tenant, "acme");
  job.spec_json = "{}";
  job.priority = 50;
  assert_int_equal(store_job_create(f->s, &job, NULL), STORE_OK);
}

typedef struct removals {
  char paths[8][512];
  int n;
  const char *refuse; /* a path whose removal fails */
} removals;

/* Removes the file; one already gone counts as removed. */
static int remove_file(const char *path, void *user) {
  removals *r = user;
  if (r->refuse && strcmp(path, r->refuse) == 0) return -1;
  if (r->n < 8) snprintf(r->paths[r->n++], sizeof r->paths[0], "%s", path);
  return unlink(path) == 0 || access(path, F_OK) != 0 ? 0 : -1;
}

static void retention_keeps_the_newest_and_removes_the_rest_with_their_files(void **state) {
  fixture *f = *state;
  create(f, "j");
  create(f, "other");
  char paths[5][512];
  /* Attempt 2 resumed from step 20 and checkpointed at 25 and 30. */
  const int attempts[] = {1, 1, 1, 2, 2};
  const int64_t steps[] = {10, 15, 20, 25, 30};
  for (int i = 0; i < 5; i++) {
    add(f, "j", attempts[i], steps[i], paths[i]);
    if (i != 1) { /* step 15's file is already gone */
      FILE *fp = fopen(paths[i], "w");
      assert_non_null(fp);
      fclose(fp);
    }
  }
  add(f, "other", 1, 5, NULL);
  removals r = {0};
  int n = -1;
  assert_int_equal(store_checkpoint_retain(f->s, "j", 2, remove_file, &r, &n), STORE_OK);
  assert_int_equal(n, 3);
  assert_int_equal(r.n, 3);
  for (int i = 0; i < 3; i++) assert_string_equal(r.paths[i], paths[2 - i]);
  for (int i = 0; i < 5; i++) assert_int_equal(access(paths[i], F_OK) == 0, i >= 3);
  store_checkpoint *list = NULL;
  assert_int_equal(store_checkpoint_list(f->s, "j", &list, &n), STORE_OK);
  assert_int_equal(n, 2);
  assert_int_equal(list[0].step, 25);
  assert_int_equal(list[1].step, 30);
  store_checkpoint_list_free(list, n);
  assert_int_equal(store_checkpoint_list(f->s, "other", &list, &n), STORE_OK);
  assert_int_equal(n, 1);
  store_checkpoint_list_free(list, n);

  /* Nothing beyond keep_last: nothing to do. */
  assert_int_equal(store_checkpoint_retain(f->s, "j", 2, remove_file, &r, &n), STORE_OK);
  assert_int_equal(n, 0);
}

static void a_file_that_cannot_be_removed_keeps_its_row(void **state) {
  fixture *f = *state;
  create(f, "k");
  char paths[3][512];
  for (int i = 0; i < 3; i++) add(f, "k", 1, 100 * (i + 1), paths[i]);
  removals r = {.refuse = paths[0]};
  int n = -1;
  assert_int_equal(store_checkpoint_retain(f->s, "k", 1, remove_file, &r, &n), STORE_OK);
  assert_int_equal(n, 1);
  store_checkpoint *list = NULL;
  assert_int_equal(store_checkpoint_list(f->s, "k", &list, &n), STORE_OK);
  assert_int_equal(n, 2);
  assert_int_equal(list[0].step, 100);
  assert_int_equal(list[1].step, 300);
  store_checkpoint_list_free(list, n);
  /* The next pass, with the file removable, finishes the job. */
  r.refuse = NULL;
  assert_int_equal(store_checkpoint_retain(f->s, "k", 1, remove_file, &r, &n), STORE_OK);
  assert_int_equal(n, 1);
  assert_int_equal(store_checkpoint_retain(f->s, "k", 0, remove_file, &r, &n), STORE_ERROR);
  assert_non_null(strstr(store_errmsg(f->s), "keep_last >= 1"));
}

static void retention_never_removes_a_pinned_checkpoint(void **state) {
  fixture *f = *state;
  create(f, "p");
  create(f, "q");
  for (int i = 0; i < 4; i++) add(f, "p", 1, 10 * (i + 1), NULL);
  add(f, "q", 1, 5, NULL);
  store_checkpoint *list = NULL;
  int n = 0;
  assert_int_equal(store_checkpoint_list(f->s, "p", &list, &n), STORE_OK);
  assert_int_equal(n, 4);
  int64_t oldest = list[0].id, second = list[1].id;
  for (int i = 0; i < n; i++) assert_int_equal(list[i].pinned, 0);
  store_checkpoint_list_free(list, n);
  assert_int_equal(store_checkpoint_set_pinned(f->s, "p", oldest, 1), STORE_OK);
  assert_int_equal(store_checkpoint_set_pinned(f->s, "p", oldest, 1), STORE_OK); /* idempotent */
  /* Another job's checkpoint id, or one that does not exist, is not found. */
  assert_int_equal(store_checkpoint_set_pinned(f->s, "q", oldest, 1), STORE_NOT_FOUND);
  assert_int_equal(store_checkpoint_set_pinned(f->s, "p", 9999, 1), STORE_NOT_FOUND);
  assert_non_null(strstr(store_errmsg(f->s), "no checkpoint 9999"));

  removals r = {0};
  assert_int_equal(store_checkpoint_retain(f->s, "p", 1, remove_file, &r, &n), STORE_OK);
  assert_int_equal(n, 2); /* steps 20 and 30; the pinned 10 and the newest 40 stay */
  assert_int_equal(store_checkpoint_list(f->s, "p", &list, &n), STORE_OK);
  assert_int_equal(n, 2);
  assert_int_equal(list[0].id, oldest);
  assert_int_equal(list[0].pinned, 1);
  assert_int_equal(list[1].step, 40);
  assert_int_equal(list[1].pinned, 0);
  store_checkpoint_list_free(list, n);
  assert_int_equal(store_checkpoint_set_pinned(f->s, "p", second, 1), STORE_NOT_FOUND);

  /* Unpinned, it is an old checkpoint like any other and goes. */
  assert_int_equal(store_checkpoint_set_pinned(f->s, "p", oldest, 0), STORE_OK);
  assert_int_equal(store_checkpoint_retain(f->s, "p", 1, remove_file, &r, &n), STORE_OK);
  assert_int_equal(n, 1);
  assert_int_equal(store_checkpoint_list(f->s, "p", &list, &n), STORE_OK);
  assert_int_equal(n, 1);
  assert_int_equal(list[0].step, 40);
  store_checkpoint_list_free(list, n);
}

static int64_t *kept_steps(fixture *f, const char *job, int *n) {
  store_checkpoint *list = NULL;
  assert_int_equal(store_checkpoint_list(f->s, job, &list, n), STORE_OK);
  int64_t *steps = calloc((size_t)*n + 1, sizeof *steps);
  for (int i = 0; i < *n; i++) steps[i] = list[i].step;
  store_checkpoint_list_free(list, *n);
  return steps;
}

static void keep_best_keeps_the_best_by_the_monitor_and_the_newest(void **state) {
  fixture *f = *state;
  create(f, "b");
  /* val_loss by step; step 40 has no val_loss, step 50 is the newest. */
  const int64_t steps[] = {10, 20, 30, 40, 50};
  const char *metrics[] = {"{\"loss\":1,\"val_loss\":0.9,\"val_accuracy\":0.5}",
                           "{\"loss\":0.8,\"val_loss\":0.3,\"val_accuracy\":0.7}",
                           "{\"loss\":0.6,\"val_loss\":0.5,\"val_accuracy\":0.9}", "{\"loss\":0.5}",
                           "{\"loss\":0.4,\"val_loss\":0.7,\"val_accuracy\":0.6}"};
  for (int i = 0; i < 5; i++) add_with(f, "b", 1, steps[i], metrics[i], NULL);
  removals r = {0};
  int n = -1;
  /* keep_best 2 on val_loss (min) and no keep_last: 20 and 30 are best, 50
   * stays as the newest a resume needs. */
  store_retention policy = {.keep_best = 2, .monitor = "val_loss"};
  assert_int_equal(store_checkpoint_retain_policy(f->s, "b", &policy, remove_file, &r, &n),
                   STORE_OK);
  assert_int_equal(n, 2);
  int64_t *kept = kept_steps(f, "b", &n);
  assert_int_equal(n, 3);
  assert_int_equal(kept[0], 20);
  assert_int_equal(kept[1], 30);
  assert_int_equal(kept[2], 50);
  free(kept);
  /* Higher is better for an accuracy: the best one is 30. */
  store_retention acc = {
      .keep_last = 1, .keep_best = 1, .monitor = "val_accuracy", .higher_is_better = 1};
  assert_int_equal(store_checkpoint_retain_policy(f->s, "b", &acc, remove_file, &r, &n), STORE_OK);
  assert_int_equal(n, 1);
  kept = kept_steps(f, "b", &n);
  assert_int_equal(n, 2);
  assert_int_equal(kept[0], 30);
  assert_int_equal(kept[1], 50);
  free(kept);
  /* A monitor that no checkpoint recorded keeps only the newest ones. */
  store_retention none = {.keep_last = 1, .keep_best = 1, .monitor = "val_mae\"x"};
  assert_int_equal(store_checkpoint_retain_policy(f->s, "b", &none, remove_file, &r, &n), STORE_OK);
  kept = kept_steps(f, "b", &n);
  assert_int_equal(n, 1);
  assert_int_equal(kept[0], 50);
  free(kept);
  store_retention bad = {.keep_best = 1};
  assert_int_equal(store_checkpoint_retain_policy(f->s, "b", &bad, remove_file, &r, &n),
                   STORE_ERROR);
  assert_non_null(strstr(store_errmsg(f->s), "a monitor for keep_best"));
}

/* A data directory opened from another folder: rows outside it are pointed
 * at the same files inside it; rows already inside, and paths without their
 * own job's or data set's part, are left alone; a second pass moves none. */
static void relocate_points_rows_of_a_moved_data_directory_at_its_files(void **state) {
  fixture *f = *state;
  create(f, "j");
  store_checkpoint c;
  memset(&c, 0, sizeof c);
  snprintf(c.job_id, sizeof c.job_id, "j");
  c.attempt = 1;
  snprintf(c.sha256, sizeof c.sha256, "%064d", 0);
  const char *paths[] = {"/old/kiln/jobs/j/checkpoints/ckpt-1.safetensors",
                         "/new/kiln/jobs/j/checkpoints/ckpt-2.safetensors",
                         "/elsewhere/ckpt-3.safetensors"};
  for (int i = 0; i < 3; i++) {
    c.step = i + 1;
    snprintf(c.path, sizeof c.path, "%s", paths[i]);
    assert_int_equal(store_checkpoint_add(f->s, &c), STORE_OK);
  }
  store_dataset d;
  memset(&d, 0, sizeof d);
  snprintf(d.id, sizeof d.id, "ds-1");
  snprintf(d.format, sizeof d.format, "csv");
  snprintf(d.path, sizeof d.path, "/old/kiln/datasets/ds-1");
  snprintf(d.sha256, sizeof d.sha256, "%064d", 0);
  snprintf(d.input_shape_json, sizeof d.input_shape_json, "[3]");
  d.classes = 2;
  assert_int_equal(store_dataset_add(f->s, &d), STORE_OK);

  int moved = -1;
  assert_int_equal(store_relocate(f->s, "/new/kiln/", &moved), STORE_OK);
  assert_int_equal(moved, 2);
  store_checkpoint *list = NULL;
  int n = 0;
  assert_int_equal(store_checkpoint_list(f->s, "j", &list, &n), STORE_OK);
  assert_int_equal(n, 3);
  const char *want[] = {"/new/kiln/jobs/j/checkpoints/ckpt-1.safetensors",
                        "/new/kiln/jobs/j/checkpoints/ckpt-2.safetensors",
                        "/elsewhere/ckpt-3.safetensors"};
  for (int i = 0; i < n; i++) assert_string_equal(list[i].path, want[list[i].step - 1]);
  store_checkpoint_list_free(list, n);
  store_dataset got;
  assert_int_equal(store_dataset_get(f->s, "ds-1", &got), STORE_OK);
  assert_string_equal(got.path, "/new/kiln/datasets/ds-1");

  assert_int_equal(store_relocate(f->s, "/new/kiln", &moved), STORE_OK);
  assert_int_equal(moved, 0);
  assert_int_equal(store_relocate(f->s, "relative/dir", &moved), STORE_ERROR);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(
          retention_keeps_the_newest_and_removes_the_rest_with_their_files, fixture_setup,
          fixture_teardown),
      cmocka_unit_test_setup_teardown(a_file_that_cannot_be_removed_keeps_its_row, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(retention_never_removes_a_pinned_checkpoint, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(keep_best_keeps_the_best_by_the_monitor_and_the_newest,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(relocate_points_rows_of_a_moved_data_directory_at_its_files,
                                      fixture_setup, fixture_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
