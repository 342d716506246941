/* Regression targets and the cast / one-hot maps: a CSV's numeric label
 * column becomes targets (class names do not), targets survive slicing and
 * the cache file, follow their examples through shuffle and shard, and a
 * cast to f16 / bf16 hands out exactly what that storage keeps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine.h"

static char dir[256];

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/kiln-test-targets-XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd);
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void csv_numeric_label_column_is_kept_as_regression_targets(void **state) {
  (void)state;
  char path[300], cache[300], err[256] = "";
  snprintf(path, sizeof path, "%s/houses.csv", dir);
  write_text(path, "rooms,area,price\n3,70.5,210.25\n2,48,-1.5e2\n4,95,330\n");
  kn_dataset ds;
  assert_int_equal(kn_dataset_load_csv(path, "price", &ds, err, sizeof err), KN_OK);
  assert_int_equal(ds.n, 3);
  assert_int_equal(ds.example_size, 2);
  assert_non_null(ds.targets);
  assert_int_equal(ds.n_targets, 1);
  assert_true(ds.targets[0] == 210.25f && ds.targets[1] == -150.0f && ds.targets[2] == 330.0f);
  assert_true(ds.x[2] == 2.0f && ds.x[3] == 48.0f);
  /* A slice copies its rows' targets. */
  kn_dataset tail;
  assert_int_equal(kn_dataset_slice(&ds, 1, 2, &tail, err, sizeof err), KN_OK);
  assert_true(tail.targets != ds.targets && tail.targets[0] == -150.0f &&
              tail.targets[1] == 330.0f);
  /* And the cache file keeps them. */
  snprintf(cache, sizeof cache, "%s/houses.kds", dir);
  assert_int_equal(kn_dataset_cache_write(&ds, cache, err, sizeof err), KN_OK);
  kn_dataset back;
  assert_int_equal(kn_dataset_cache_read(cache, &back, err, sizeof err), KN_OK);
  assert_int_equal(back.n_targets, 1);
  assert_memory_equal(back.targets, ds.targets, 3 * sizeof(float));
  kn_dataset_free(&back);
  kn_dataset_free(&tail);
  kn_dataset_free(&ds);
  /* Class names are no targets; integer classes are both. */
  snprintf(path, sizeof path, "%s/names.csv", dir);
  write_text(path, "a,kind\n1,cat\n2,dog\n");
  assert_int_equal(kn_dataset_load_csv(path, "kind", &ds, err, sizeof err), KN_OK);
  assert_null(ds.targets);
  assert_int_equal(ds.n_targets, 0);
  assert_int_equal(ds.n_classes, 2);
  kn_dataset_free(&ds);
  snprintf(path, sizeof path, "%s/ints.csv", dir);
  write_text(path, "a,label\n1,0\n2,2\n");
  assert_int_equal(kn_dataset_load_csv(path, "label", &ds, err, sizeof err), KN_OK);
  assert_int_equal(ds.n_classes, 3);
  assert_true(ds.targets && ds.targets[1] == 2.0f);
  /* The cache of a class-only set still reads back with no targets. */
  kn_dataset_free(&ds);
  snprintf(path, sizeof path, "%s/names.csv", dir);
  assert_int_equal(kn_dataset_load_csv(path, "kind", &ds, err, sizeof err), KN_OK);
  assert_int_equal(kn_dataset_cache_write(&ds, cache, err, sizeof err), KN_OK);
  assert_int_equal(kn_dataset_cache_read(cache, &back, err, sizeof err), KN_OK);
  assert_null(back.targets);
  kn_dataset_free(&back);
  kn_dataset_free(&ds);
}

/* x[i] = (i, -i), target[i] = i / 4, label i % 3. */
static kn_dataset make_rows(int64_t n) {
  kn_dataset ds = {
      .n = n, .ndim = 1, .shape = {2}, .example_size = 2, .n_classes = 3, .n_targets = 1};
  ds.x = malloc((size_t)n * 2 * sizeof(float));
  ds.y = malloc((size_t)n * sizeof(int32_t));
  ds.targets = malloc((size_t)n * sizeof(float));
  for (int64_t i = 0; i < n; i++) {
    ds.x[2 * i] = (float)i;
    ds.x[2 * i + 1] = -(float)i;
    ds.targets[i] = (float)i / 4.0f;
    ds.y[i] = (int32_t)(i % 3);
  }
  return ds;
}

static void targets_follow_their_examples_through_shuffle_and_shard(void **state) {
  (void)state;
  const int64_t n = 101;
  const int shards = 3, epochs = 2;
  kn_dataset ds = make_rows(n);
  char err[256] = "";
  int seen[101] = {0};
  for (int s = 0; s < shards; s++) {
    kn_pipeline_config c;
    kn_pipeline_config_default(&c);
    c.batch_size = 8;
    c.shuffle_buffer = 16;
    c.seed = 9;
    c.shard_index = s;
    c.shard_count = shards;
    c.repeat = epochs;
    c.num_parallel_calls = 2;
    c.one_hot = 1;
    c.one_hot_depth = 5; /* wider than the 3 classes: the model's outputs */
    kn_pipeline *p;
    assert_int_equal(kn_pipeline_new(&ds, &c, &p, err, sizeof err), KN_OK);
    kn_batch b;
    while (kn_pipeline_next(p, &b) == 1) {
      assert_non_null(b.targets);
      for (int r = 0; r < b.rows; r++) {
        const int64_t row = (int64_t)b.x[2 * r];
        assert_true(row % shards == s); /* this shard's own examples */
        assert_true(b.targets[r] == (float)row / 4.0f);
        assert_int_equal(b.y[r], row % 3);
        for (int k = 0; k < 5; k++)
          assert_true(b.y_onehot[r * 5 + k] == (k == row % 3 ? 1.0f : 0.0f));
        seen[row]++;
      }
    }
    kn_pipeline_free(p);
  }
  for (int64_t i = 0; i < n; i++) assert_int_equal(seen[i], epochs); /* once per epoch */
  kn_dataset_free(&ds);
}

static void cast_hands_out_what_f16_and_bf16_storage_keep(void **state) {
  (void)state;
  kn_dataset ds = make_rows(4);
  /* Values no 16-bit float holds exactly. */
  const float values[8] = {0.1f, 1.0f / 3.0f, 1000.7f, -2.71828f, 65504.0f, 1e-5f, 7.0f, 0.2f};
  memcpy(ds.x, values, sizeof values);
  const kn_dtype types[2] = {KN_F16, KN_BF16};
  char err[256] = "";
  for (int t = 0; t < 2; t++) {
    uint16_t stored[8];
    float want[8];
    kn_convert(KN_F32, values, types[t], stored, 8);
    kn_convert(types[t], stored, KN_F32, want, 8);
    kn_pipeline_config c;
    kn_pipeline_config_default(&c);
    c.batch_size = 4;
    c.cast = types[t];
    kn_pipeline *p;
    assert_int_equal(kn_pipeline_new(&ds, &c, &p, err, sizeof err), KN_OK);
    kn_batch b;
    assert_int_equal(kn_pipeline_next(p, &b), 1);
    assert_memory_equal(b.x, want, sizeof want);
    assert_true(b.x[0] != 0.1f); /* rounded, not passed through */
    assert_float_equal(b.x[0], 0.1, types[t] == KN_F16 ? 1e-4 : 1e-3);
    /* The evaluation pipeline sees the same precision. */
    kn_pipeline *eval;
    assert_int_equal(kn_pipeline_new_eval(p, &ds, &eval, err, sizeof err), KN_OK);
    assert_int_equal(kn_pipeline_next(eval, &b), 1);
    assert_memory_equal(b.x, want, sizeof want);
    kn_pipeline_free(eval);
    kn_pipeline_free(p);
  }
  /* Only float storage types. */
  kn_pipeline_config c;
  kn_pipeline_config_default(&c);
  c.cast = KN_U8;
  kn_pipeline *p = NULL;
  assert_int_equal(kn_pipeline_new(&ds, &c, &p, err, sizeof err), KN_EINVAL);
  assert_null(p);
  assert_non_null(strstr(err, "cast must be to f32, f16 or bf16, got u8"));
  /* A one-hot depth below the labels is refused. */
  kn_pipeline_config_default(&c);
  c.one_hot = 1;
  c.one_hot_depth = 2;
  assert_int_equal(kn_pipeline_new(&ds, &c, &p, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "one_hot depth 2 is too small for labels up to 2"));
  kn_dataset_free(&ds);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(csv_numeric_label_column_is_kept_as_regression_targets),
      cmocka_unit_test(targets_follow_their_examples_through_shuffle_and_shard),
      cmocka_unit_test(cast_hands_out_what_f16_and_bf16_storage_keep),
  };
  return cmocka_run_group_tests_name("targets", tests, setup, teardown);
}
