/* The input pipeline: each transformation's values, shuffle and batching,
 * byte-identical batches for any thread count, disjoint covering shards, a
 * worker's part of each batch, save/restore of the position, auto-tuning,
 * and config errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "engine.h"

/* n images of h x w x c; pixel values from the example index and position,
 * label = index (so orders are easy to read back). */
static kn_dataset make_images(int64_t n, int h, int w, int c) {
  kn_dataset ds = {.n = n, .ndim = 3, .shape = {h, w, c}, .example_size = (size_t)h * w * c};
  ds.x = malloc((size_t)n * ds.example_size * sizeof(float));
  ds.y = malloc((size_t)n * sizeof(int32_t));
  for (int64_t i = 0; i < n; i++) {
    for (size_t k = 0; k < ds.example_size; k++)
      ds.x[(size_t)i * ds.example_size + k] = (float)((i * 7 + (int64_t)k * 13) % 256);
    ds.y[i] = (int32_t)i;
  }
  ds.n_classes = (int)n;
  ds.value_range = 255.0f;
  return ds;
}

static kn_pipeline *make(const kn_dataset *ds, const kn_pipeline_config *cfg) {
  kn_pipeline *p = NULL;
  char err[256] = "";
  int rc = kn_pipeline_new(ds, cfg, &p, err, sizeof err);
  if (rc) fprintf(stderr, "kn_pipeline_new: %s\n", err);
  assert_int_equal(rc, KN_OK);
  return p;
}

static kn_pipeline_config plain(int batch) {
  kn_pipeline_config c;
  kn_pipeline_config_default(&c);
  c.batch_size = batch;
  c.num_parallel_calls = 0;
  return c;
}

static void normalize_divides_pixels_by_their_range(void **state) {
  (void)state;
  kn_dataset ds = make_images(3, 2, 2, 1);
  kn_pipeline_config c = plain(3);
  c.normalize = 1;
  kn_pipeline *p = make(&ds, &c);
  kn_batch b;
  assert_int_equal(kn_pipeline_next(p, &b), 1);
  assert_int_equal(b.rows, 3);
  for (int i = 0; i < 12; i++) assert_float_equal(b.x[i], ds.x[i] / 255.0f, 1e-7);
  assert_int_equal(kn_pipeline_next(p, &b), 0);
  kn_pipeline_free(p);
  kn_dataset_free(&ds);
}

static void normalize_without_a_range_is_min_max_per_feature(void **state) {
  (void)state;
  float x[] = {1, 10, 3, 20, 5, 40};
  int32_t y[] = {0, 1, 0};
  kn_dataset ds = {
      .n = 3, .ndim = 1, .shape = {2}, .example_size = 2, .x = x, .y = y, .n_classes = 2};
  kn_pipeline_config c = plain(3);
  c.normalize = 1;
  kn_pipeline *p = make(&ds, &c);
  kn_batch b;
  assert_int_equal(kn_pipeline_next(p, &b), 1);
  const float want[] = {0, 0, 0.5f, 1.0f / 3, 1, 1};
  for (int i = 0; i < 6; i++) assert_float_equal(b.x[i], want[i], 1e-6);
  kn_pipeline_free(p);
}

static void standardize_computed_gives_zero_mean_unit_std_per_channel(void **state) {
  (void)state;
  kn_dataset ds = make_images(50, 4, 4, 3);
  kn_pipeline_config c = plain(50);
  c.normalize = 1;
  c.standardize = 1;
  kn_pipeline *p = make(&ds, &c);
  kn_batch b;
  assert_int_equal(kn_pipeline_next(p, &b), 1);
  for (int ch = 0; ch < 3; ch++) {
    double sum = 0, sq = 0;
    int count = 0;
    for (int i = ch; i < 50 * 48; i += 3) {
      sum += b.x[i];
      sq += (double)b.x[i] * b.x[i];
      count++;
    }
    double mean = sum / count, var = sq / count - mean * mean;
    assert_float_equal(mean, 0.0, 1e-4);
    assert_float_equal(var, 1.0, 1e-3);
  }
  kn_pipeline_free(p);
  kn_dataset_free(&ds);
}

static void standardize_given_uses_the_given_mean_and_std(void **state) {
  (void)state;
  kn_dataset ds = make_images(2, 1, 2, 2);
  const float mean[] = {10, 20}, std[] = {2, 4};
  kn_pipeline_config c = plain(2);
  c.standardize = 1;
  c.n_channels_given = 2;
  c.mean = mean;
  c.std = std;
  kn_pipeline *p = make(&ds, &c);
  kn_batch b;
  assert_int_equal(kn_pipeline_next(p, &b), 1);
  for (int i = 0; i < 8; i++)
    assert_float_equal(b.x[i], (ds.x[i] - mean[i % 2]) / std[i % 2], 1e-5);
  kn_pipeline_free(p);
  /* A count that does not match the channels is named. */
  c.n_channels_given = 1;
  char err[256] = "";
  kn_pipeline *bad = NULL;
  assert_int_equal(kn_pipeline_new(&ds, &c, &bad, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "1 means and stds given, the examples have 2 channels"));
  assert_null(bad);
  kn_dataset_free(&ds);
}

static void one_hot_sets_the_label_column(void **state) {
  (void)state;
  float x[4] = {0};
  int32_t y[] = {2, 0, 1, 2};
  kn_dataset ds = {
      .n = 4, .ndim = 1, .shape = {1}, .example_size = 1, .x = x, .y = y, .n_classes = 3};
  kn_pipeline_config c = plain(4);
  c.one_hot = 1;
  kn_pipeline *p = make(&ds, &c);
  kn_batch b;
  assert_int_equal(kn_pipeline_next(p, &b), 1);
  const float want[] = {0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1};
  assert_memory_equal(b.y_onehot, want, sizeof want);
  kn_pipeline_free(p);
}

/* Every output example, against its source: same, or mirrored. */
static void check_flips(int left_right) {
  const int n = 200, h = 3, w = 4, c = 2;
  kn_dataset ds = make_images(n, h, w, c);
  kn_pipeline_config cfg = plain(n);
  cfg.augment = left_right ? KN_AUG_FLIP_LEFT_RIGHT : KN_AUG_FLIP_UP_DOWN;
  cfg.seed = 3;
  kn_pipeline *p = make(&ds, &cfg);
  kn_batch b;
  assert_int_equal(kn_pipeline_next(p, &b), 1);
  int flipped = 0;
  for (int i = 0; i < n; i++) {
    const float *src = ds.x + (size_t)i * ds.example_size, *out = b.x + (size_t)i * ds.example_size;
    int same = memcmp(src, out, ds.example_size * sizeof(float)) == 0, mirror = 1;
    for (int r = 0; r < h; r++)
      for (int col = 0; col < w; col++)
        for (int k = 0; k < c; k++) {
          int sr = left_right ? r : h - 1 - r, sc = left_right ? w - 1 - col : col;
          mirror &= out[(r * w + col) * c + k] == src[(sr * w + sc) * c + k];
        }
    assert_true(same || mirror);
    flipped += !same;
  }
  /* About half: a fair coin per example. */
  assert_in_range(flipped, 60, 140);
  kn_pipeline_free(p);
  kn_dataset_free(&ds);
}

static void flip_left_right_mirrors_columns_of_about_half(void **state) {
  (void)state;
  check_flips(1);
}

static void flip_up_down_mirrors_rows_of_about_half(void **state) {
  (void)state;
  check_flips(0);
}

static void random_crop_shifts_within_the_padding_and_fills_zeros(void **state) {
  (void)state;
  const int n = 100, h = 5, w = 5, pad = 2;
  kn_dataset ds = make_images(n, h, w, 1);
  for (size_t i = 0; i < (size_t)n * 25; i++) ds.x[i] += 1.0f; /* no zero pixels of its own */
  kn_pipeline_config cfg = plain(n);
  cfg.augment = KN_AUG_RANDOM_CROP;
  cfg.crop_padding = pad;
  kn_pipeline *p = make(&ds, &cfg);
  kn_batch b;
  assert_int_equal(kn_pipeline_next(p, &b), 1);
  int shifted = 0;
  for (int i = 0; i < n; i++) {
    const float *src = ds.x + (size_t)i * 25, *out = b.x + (size_t)i * 25;
    int found = 0;
    for (int dy = -pad; dy <= pad && !found; dy++)
      for (int dx = -pad; dx <= pad && !found; dx++) {
        int match = 1;
        for (int r = 0; r < h; r++)
          for (int col = 0; col < w; col++) {
            int sr = r + dy, sc = col + dx;
            float want = (sr < 0 || sr >= h || sc < 0 || sc >= w) ? 0.0f : src[sr * w + sc];
            match &= out[r * w + col] == want;
          }
        if (match) {
          found = 1;
          shifted += dy != 0 || dx != 0;
        }
      }
    assert_true(found);
  }
  assert_true(shifted > n / 2); /* 24 of 25 offsets move the image */
  kn_pipeline_free(p);
  kn_dataset_free(&ds);
}

static void random_brightness_adds_one_bounded_delta_per_example(void **state) {
  (void)state;
  const int n = 64;
  kn_dataset ds = make_images(n, 2, 2, 1);
  kn_pipeline_config cfg = plain(n);
  cfg.augment = KN_AUG_RANDOM_BRIGHTNESS;
  cfg.brightness_delta = 0.25f;
  kn_pipeline *p = make(&ds, &cfg);
  kn_batch b;
  assert_int_equal(kn_pipeline_next(p, &b), 1);
  float lo = 1, hi = -1;
  for (int i = 0; i < n; i++) {
    float delta = b.x[i * 4] - ds.x[i * 4];
    for (int k = 1; k < 4; k++) assert_float_equal(b.x[i * 4 + k] - ds.x[i * 4 + k], delta, 1e-4);
    assert_true(delta >= -0.25f && delta <= 0.25f);
    lo = delta < lo ? delta : lo;
    hi = delta > hi ? delta : hi;
  }
  assert_true(lo < -0.1f && hi > 0.1f);
  kn_pipeline_free(p);
  kn_dataset_free(&ds);
}

/* Labels of one epoch, in order. */
static void epoch_labels(kn_pipeline *p, int32_t *out, int64_t n) {
  int64_t got = 0;
  kn_batch b;
  for (int64_t k = 0; k < kn_pipeline_batches_per_epoch(p); k++) {
    assert_int_equal(kn_pipeline_next(p, &b), 1);
    memcpy(out + got, b.y, (size_t)b.rows * sizeof(int32_t));
    got += b.rows;
  }
  assert_int_equal(got, n);
}

static void full_shuffle_is_a_new_permutation_each_epoch(void **state) {
  (void)state;
  const int n = 100;
  kn_dataset ds = make_images(n, 1, 1, 1);
  kn_pipeline_config cfg = plain(7);
  cfg.shuffle_buffer = n;
  cfg.repeat = 2;
  cfg.seed = 11;
  kn_pipeline *p = make(&ds, &cfg);
  int32_t e0[100], e1[100], again[100];
  epoch_labels(p, e0, n);
  epoch_labels(p, e1, n);
  kn_batch b;
  assert_int_equal(kn_pipeline_next(p, &b), 0);
  int seen0[100] = {0}, seen1[100] = {0}, moved = 0;
  for (int i = 0; i < n; i++) {
    seen0[e0[i]]++;
    seen1[e1[i]]++;
    moved += e0[i] != i;
  }
  for (int i = 0; i < n; i++) assert_true(seen0[i] == 1 && seen1[i] == 1);
  assert_true(moved > 80);
  assert_memory_not_equal(e0, e1, sizeof e0);
  kn_pipeline_free(p);
  /* The same seed, the same order. */
  p = make(&ds, &cfg);
  epoch_labels(p, again, n);
  assert_memory_equal(e0, again, sizeof e0);
  kn_pipeline_free(p);
  kn_dataset_free(&ds);
}

static void buffer_shuffle_moves_examples_at_most_a_buffer_early(void **state) {
  (void)state;
  const int n = 100, k = 10;
  kn_dataset ds = make_images(n, 1, 1, 1);
  kn_pipeline_config cfg = plain(n);
  cfg.shuffle_buffer = k;
  kn_pipeline *p = make(&ds, &cfg);
  int32_t order[100];
  epoch_labels(p, order, n);
  int seen[100] = {0}, moved = 0;
  for (int pos = 0; pos < n; pos++) {
    int i = order[pos];
    seen[i]++;
    /* Example i enters the buffer after i - k + 1 outputs. */
    assert_true(pos >= i - k + 1);
    moved += pos != i;
  }
  for (int i = 0; i < n; i++) assert_int_equal(seen[i], 1);
  assert_true(moved > 50);
  kn_pipeline_free(p);
  kn_dataset_free(&ds);
}

static void batch_keeps_or_drops_the_remainder(void **state) {
  (void)state;
  kn_dataset ds = make_images(10, 1, 1, 1);
  kn_pipeline_config cfg = plain(4);
  kn_pipeline *p = make(&ds, &cfg);
  kn_batch b;
  int rows[4], n = 0;
  while (kn_pipeline_next(p, &b) == 1) rows[n++] = b.rows;
  assert_int_equal(n, 3);
  assert_int_equal(rows[2], 2);
  assert_int_equal(b.rows, 0);
  kn_pipeline_free(p);
  cfg.drop_remainder = 1;
  p = make(&ds, &cfg);
  n = 0;
  while (kn_pipeline_next(p, &b) == 1) n++;
  assert_int_equal(n, 2);
  assert_int_equal(kn_pipeline_examples_per_epoch(p), 8);
  kn_pipeline_free(p);
  kn_dataset_free(&ds);
}

static void skip_take_and_repeat_pick_the_examples(void **state) {
  (void)state;
  kn_dataset ds = make_images(10, 1, 1, 1);
  kn_pipeline_config cfg = plain(3);
  cfg.skip = 2;
  cfg.take = 5;
  cfg.repeat = 2;
  kn_pipeline *p = make(&ds, &cfg);
  int32_t labels[10];
  int n = 0;
  kn_batch b;
  while (kn_pipeline_next(p, &b) == 1) {
    assert_int_equal(b.epoch, n / 5);
    for (int r = 0; r < b.rows; r++) labels[n++] = b.y[r];
  }
  const int32_t want[] = {2, 3, 4, 5, 6, 2, 3, 4, 5, 6};
  assert_int_equal(n, 10);
  assert_memory_equal(labels, want, sizeof want);
  kn_pipeline_free(p);
  kn_dataset_free(&ds);
}

/* Every byte of every batch of two epochs, for a thread count. */
static unsigned char *all_bytes(const kn_dataset *ds, int threads, int prefetch, size_t *len) {
  kn_pipeline_config cfg;
  kn_pipeline_config_default(&cfg);
  cfg.batch_size = 16;
  cfg.shuffle_buffer = 50;
  cfg.seed = 1234;
  cfg.normalize = 1;
  cfg.standardize = 1;
  cfg.augment =
      KN_AUG_FLIP_LEFT_RIGHT | KN_AUG_FLIP_UP_DOWN | KN_AUG_RANDOM_CROP | KN_AUG_RANDOM_BRIGHTNESS;
  cfg.crop_padding = 2;
  cfg.brightness_delta = 0.2f;
  cfg.repeat = 2;
  cfg.num_parallel_calls = threads;
  cfg.prefetch = prefetch;
  kn_pipeline *p = make(ds, &cfg);
  size_t per = 16 * (ds->example_size * sizeof(float) + sizeof(int32_t)) + 16;
  size_t cap = per * (size_t)(2 * kn_pipeline_batches_per_epoch(p)), used = 0;
  unsigned char *out = calloc(1, cap);
  kn_batch b;
  while (kn_pipeline_next(p, &b) == 1) {
    memcpy(out + used, &b.rows, sizeof b.rows);
    memcpy(out + used + 4, &b.epoch, sizeof b.epoch);
    memcpy(out + used + 8, &b.index, sizeof b.index);
    used += 16;
    memcpy(out + used, b.x, (size_t)b.rows * ds->example_size * sizeof(float));
    used += (size_t)b.rows * ds->example_size * sizeof(float);
    memcpy(out + used, b.y, (size_t)b.rows * sizeof(int32_t));
    used += (size_t)b.rows * sizeof(int32_t);
  }
  kn_pipeline_free(p);
  *len = used;
  return out;
}

static void any_thread_count_gives_byte_identical_batches(void **state) {
  (void)state;
  kn_dataset ds = make_images(203, 6, 6, 3);
  size_t len0, len;
  unsigned char *inline_bytes = all_bytes(&ds, 0, 1, &len0);
  assert_true(len0 > 203 * 2 * 108 * 4);
  const int threads[] = {1, 2, 4, 4, KN_AUTO}, prefetch[] = {2, 3, 1, 8, KN_AUTO};
  for (int t = 0; t < 5; t++) {
    unsigned char *bytes = all_bytes(&ds, threads[t], prefetch[t], &len);
    assert_int_equal(len, len0);
    assert_memory_equal(bytes, inline_bytes, len0);
    free(bytes);
  }
  free(inline_bytes);
  kn_dataset_free(&ds);
}

static void shards_cover_every_example_once_per_epoch(void **state) {
  (void)state;
  const int n = 103, shards = 4, epochs = 2;
  kn_dataset ds = make_images(n, 1, 1, 1);
  int seen[2][103] = {{0}};
  int64_t total = 0;
  for (int s = 0; s < shards; s++) {
    kn_pipeline_config cfg = plain(5);
    cfg.shard_index = s;
    cfg.shard_count = shards;
    cfg.shuffle_buffer = 1000;
    cfg.seed = 9;
    cfg.repeat = epochs;
    cfg.num_parallel_calls = 2;
    kn_pipeline *p = make(&ds, &cfg);
    int64_t per = kn_pipeline_examples_per_epoch(p);
    assert_true(per == n / shards || per == n / shards + 1);
    kn_batch b;
    while (kn_pipeline_next(p, &b) == 1) {
      for (int r = 0; r < b.rows; r++) {
        assert_int_equal(b.y[r] % shards, s); /* disjoint: its own 1/n */
        seen[b.epoch][b.y[r]]++;
        total++;
      }
    }
    kn_pipeline_free(p);
  }
  assert_int_equal(total, (int64_t)n * epochs);
  for (int e = 0; e < epochs; e++)
    for (int i = 0; i < n; i++) assert_int_equal(seen[e][i], 1);
  kn_dataset_free(&ds);
}

/* A worker's part of each global batch: the parts, side by side, are the
 * batch one pipeline makes, byte for byte (shuffle, maps and augmentation
 * included), the short last batch too; a part restores to a saved position
 * like the whole. */
static void parts_of_each_batch_are_the_whole_batch_byte_for_byte(void **state) {
  (void)state;
  enum { PARTS = 4, BATCH = 12, N = 103, EX = 4 * 4 * 2 };
  kn_dataset ds = make_images(N, 4, 4, 2);
  kn_pipeline_config cfg = plain(BATCH);
  cfg.shuffle_buffer = 30;
  cfg.seed = 5;
  cfg.normalize = 1;
  cfg.standardize = 1;
  cfg.augment = KN_AUG_FLIP_LEFT_RIGHT | KN_AUG_RANDOM_CROP | KN_AUG_RANDOM_BRIGHTNESS;
  cfg.crop_padding = 1;
  cfg.brightness_delta = 0.2f;
  cfg.repeat = 2;
  kn_pipeline *whole = make(&ds, &cfg);
  kn_pipeline *parts[PARTS];
  for (int i = 0; i < PARTS; i++) {
    kn_pipeline_config c = cfg;
    c.part_index = i;
    c.part_count = PARTS;
    c.num_parallel_calls = i % 2 ? 2 : 0; /* threads or none: the same rows */
    parts[i] = make(&ds, &c);
    assert_int_equal(kn_pipeline_batches_per_epoch(parts[i]), kn_pipeline_batches_per_epoch(whole));
  }
  kn_batch w, b;
  int batches = 0, short_parts = 0;
  while (kn_pipeline_next(whole, &w) == 1) {
    int at = 0;
    for (int i = 0; i < PARTS; i++) {
      assert_int_equal(kn_pipeline_next(parts[i], &b), 1);
      assert_int_equal(b.epoch, w.epoch);
      assert_int_equal(b.index, w.index);
      assert_true(b.rows <= BATCH / PARTS);
      short_parts += b.rows < BATCH / PARTS;
      if (b.rows > 0) {
        assert_memory_equal(b.x, w.x + (size_t)at * EX, (size_t)b.rows * EX * sizeof(float));
        assert_memory_equal(b.y, w.y + at, (size_t)b.rows * sizeof(int32_t));
      }
      at += b.rows;
    }
    assert_int_equal(at, w.rows); /* every row of the batch, once */
    batches++;
  }
  assert_int_equal(batches, 2 * 9);
  /* 103 = 8 x 12 + 7: the last batch gives 3, 3, 1 and 0 rows, each epoch. */
  assert_int_equal(short_parts, 2 * 2);
  for (int i = 0; i < PARTS; i++) assert_int_equal(kn_pipeline_next(parts[i], &b), 0);

  /* A part restored to epoch 1 batch 4 goes on with what it made there. */
  kn_pipeline_state at = {1, 4, cfg.seed};
  char err[256];
  assert_int_equal(kn_pipeline_restore(parts[2], &at, err, sizeof err), KN_OK);
  assert_int_equal(kn_pipeline_restore(whole, &at, err, sizeof err), KN_OK);
  assert_int_equal(kn_pipeline_next(parts[2], &b), 1);
  assert_int_equal(kn_pipeline_next(whole, &w), 1);
  assert_int_equal(b.rows, BATCH / PARTS);
  assert_memory_equal(b.x, w.x + (size_t)2 * (BATCH / PARTS) * EX,
                      (size_t)b.rows * EX * sizeof(float));
  /* An evaluation pipeline keeps the part. */
  kn_pipeline *eval = NULL;
  assert_int_equal(kn_pipeline_new_eval(parts[3], &ds, &eval, err, sizeof err), KN_OK);
  assert_int_equal(kn_pipeline_next(eval, &b), 1);
  assert_int_equal(b.rows, BATCH / PARTS);
  assert_int_equal(b.y[0], 3 * (BATCH / PARTS)); /* in order: rows 9, 10, 11 */
  kn_pipeline_free(eval);
  for (int i = 0; i < PARTS; i++) kn_pipeline_free(parts[i]);
  kn_pipeline_free(whole);
  kn_dataset_free(&ds);
}

static void restored_pipeline_yields_the_same_next_100_batches(void **state) {
  (void)state;
  kn_dataset ds = make_images(150, 4, 4, 1);
  kn_pipeline_config cfg;
  kn_pipeline_config_default(&cfg);
  cfg.batch_size = 8;
  cfg.shuffle_buffer = 40;
  cfg.seed = 77;
  cfg.augment = KN_AUG_FLIP_LEFT_RIGHT | KN_AUG_RANDOM_BRIGHTNESS;
  cfg.brightness_delta = 0.1f;
  cfg.repeat = -1;
  cfg.num_parallel_calls = 2;
  cfg.prefetch = 4;
  kn_pipeline *a = make(&ds, &cfg);
  kn_batch b;
  for (int i = 0; i < 37; i++) assert_int_equal(kn_pipeline_next(a, &b), 1);
  kn_pipeline_state st;
  kn_pipeline_save(a, &st);
  assert_int_equal(st.epoch, 37 / 19); /* 19 batches per epoch */
  assert_int_equal(st.batch, 37 % 19);
  char text[64];
  assert_int_equal(kn_pipeline_state_format(&st, text, sizeof text), KN_OK);
  assert_string_equal(text, "1:18:77");
  kn_pipeline_state parsed;
  char err[256];
  assert_int_equal(kn_pipeline_state_parse(text, &parsed, err, sizeof err), KN_OK);

  cfg.num_parallel_calls = 1; /* a different thread count must not matter */
  kn_pipeline *r = make(&ds, &cfg);
  assert_int_equal(kn_pipeline_restore(r, &parsed, err, sizeof err), KN_OK);
  for (int i = 0; i < 100; i++) {
    kn_batch x, y;
    assert_int_equal(kn_pipeline_next(a, &x), 1);
    assert_int_equal(kn_pipeline_next(r, &y), 1);
    assert_int_equal(x.rows, y.rows);
    assert_int_equal(x.epoch, y.epoch);
    assert_int_equal(x.index, y.index);
    assert_memory_equal(x.x, y.x, (size_t)x.rows * 16 * sizeof(float));
    assert_memory_equal(x.y, y.y, (size_t)x.rows * sizeof(int32_t));
  }
  /* A state from another seed, or a malformed one, is refused by name. */
  parsed.seed = 78;
  assert_int_equal(kn_pipeline_restore(r, &parsed, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "seed 78"));
  assert_int_equal(kn_pipeline_state_parse("1:x:3", &parsed, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "'1:x:3'"));
  kn_pipeline_free(a);
  kn_pipeline_free(r);
  kn_dataset_free(&ds);
}

static void auto_tuning_chooses_after_the_warm_up(void **state) {
  (void)state;
  kn_dataset ds = make_images(4000, 8, 8, 1);
  kn_pipeline_config cfg;
  kn_pipeline_config_default(&cfg);
  cfg.batch_size = 32;
  cfg.normalize = 1;
  cfg.augment = KN_AUG_RANDOM_CROP;
  cfg.crop_padding = 1;
  cfg.num_parallel_calls = KN_AUTO;
  cfg.prefetch = KN_AUTO;
  kn_pipeline *p = make(&ds, &cfg);
  kn_pipeline_stats st;
  kn_batch b;
  for (int i = 0; i < 10; i++) assert_int_equal(kn_pipeline_next(p, &b), 1);
  kn_pipeline_stats_get(p, &st);
  assert_int_equal(st.tuned, 0);
  assert_int_equal(st.threads, 1);
  int n = 10;
  while (kn_pipeline_next(p, &b) == 1) {
    n++;
    /* A consumer that works a little between batches, like a train step. */
    struct timespec pause = {0, 200000};
    nanosleep(&pause, NULL);
  }
  assert_int_equal(n, 125);
  kn_pipeline_stats_get(p, &st);
  assert_int_equal(st.tuned, 1);
  assert_true(st.threads >= 1 && st.threads <= 8);
  assert_true(st.prefetch >= 2);
  assert_true(st.produce_ms > 0 && st.consume_ms >= 0.1);
  assert_int_equal(st.batches, 125);
  kn_pipeline_free(p);
  kn_dataset_free(&ds);
}

/* ---- resuming training ---- */

typedef struct run_log {
  double losses[64]; /* by step */
  int64_t last_step;
  int64_t copy_at; /* copy the parameters after this step */
  float *params;
  size_t n_params;
  kn_model *model;
} run_log;

static int log_step(const kn_train_event *ev, void *user) {
  run_log *r = user;
  if (ev->kind != KN_EVENT_STEP) return 0;
  assert_true(ev->step < 64);
  r->losses[ev->step] = ev->values[0];
  r->last_step = ev->step;
  if (ev->step == r->copy_at)
    memcpy(r->params, kn_params(r->model->graph), r->n_params * sizeof(float));
  return 0;
}

static kn_model blob_model(void) {
  static const kn_layer_config layers[] = {
      {.type = KN_LAYER_FLATTEN, .name = "f"},
      {.type = KN_LAYER_DENSE, .name = "h", .units = 8, .use_bias = 1, .activation = KN_ACT_RELU},
      {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .use_bias = 1}};
  kn_model_config mc = {
      .input_ndim = 3, .input_shape = {2, 2, 1}, .n_layers = 3, .layers = layers, .batch_size = 8};
  kn_model m;
  char err[256];
  assert_int_equal(kn_model_build(&mc, &m, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(m.graph, 4, NULL, err, sizeof err), KN_OK);
  return m;
}

static void resumed_training_sees_the_batches_it_would_have_seen(void **state) {
  (void)state;
  /* 100 images of 2x2, labels in 3 classes; 13 batches an epoch. */
  kn_dataset ds = make_images(100, 2, 2, 1);
  for (int i = 0; i < 100; i++) ds.y[i] = i % 3;
  ds.n_classes = 3;
  char dir[] = "/tmp/kiln-test-resume-XXXXXX";
  assert_non_null(mkdtemp(dir));
  kn_pipeline_config pc;
  kn_pipeline_config_default(&pc);
  pc.normalize = 1;
  pc.shuffle_buffer = 30;
  pc.augment = KN_AUG_FLIP_LEFT_RIGHT | KN_AUG_RANDOM_BRIGHTNESS;
  pc.brightness_delta = 0.1f;
  pc.num_parallel_calls = 2;
  /* Plain SGD keeps no state, so the weights alone carry a run over. */
  kn_train_config tc = {.epochs = 3,
                        .batch_size = 8,
                        .seed = 21,
                        .log_every_steps = 1,
                        .checkpoint_dir = dir,
                        .checkpoint_prefix = "ckpt",
                        .pipeline = &pc,
                        .optimizer = {.type = KN_OPT_SGD, .learning_rate = 0.05f}};
  kn_model a = blob_model();
  const int64_t at = 13 + 5; /* epoch 1 (0-based), batch 5 */
  run_log first = {.copy_at = at, .model = &a, .n_params = kn_param_count(a.graph)};
  first.params = malloc(first.n_params * sizeof(float));
  char err[256];
  assert_int_equal(kn_train(&a, &ds, NULL, &tc, log_step, &first, err, sizeof err), KN_OK);
  assert_int_equal(first.last_step, 39);

  /* The checkpoint says where the stream stood; resume from mid-epoch 1. */
  char path[300];
  snprintf(path, sizeof path, "%s/ckpt-00000039.safetensors", dir);
  size_t len = 0;
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  unsigned char head[8];
  assert_int_equal(fread(head, 1, 8, f), 8);
  for (int i = 0; i < 8; i++) len |= (size_t)head[i] << (8 * i);
  char *header = calloc(1, len + 1);
  assert_int_equal(fread(header, 1, len, f), len);
  fclose(f);
  const char *at_state = strstr(header, "\"pipeline_state\":\"");
  assert_non_null(at_state);
  char text[64];
  assert_int_equal(sscanf(at_state + 18, "%63[^\"]", text), 1);
  kn_pipeline_state resume;
  assert_int_equal(kn_pipeline_state_parse(text, &resume, err, sizeof err), KN_OK);
  assert_int_equal(resume.epoch, 3);
  assert_int_equal(resume.batch, 0);
  resume.epoch = 1;
  resume.batch = 5;

  kn_model b = blob_model();
  memcpy(kn_params(b.graph), first.params, first.n_params * sizeof(float));
  run_log second = {.copy_at = -1, .model = &b};
  tc.resume = &resume;
  tc.checkpoint_dir = NULL;
  pc.num_parallel_calls = 1;
  assert_int_equal(kn_train(&b, &ds, NULL, &tc, log_step, &second, err, sizeof err), KN_OK);
  assert_int_equal(second.last_step, 39);
  for (int64_t s = at + 1; s <= 39; s++) {
    if (first.losses[s] != second.losses[s])
      fail_msg("step %lld: loss %.9g after resuming, %.9g in one run", (long long)s,
               second.losses[s], first.losses[s]);
  }
  assert_true(second.losses[at] == 0.0); /* nothing before the resume point ran */
  free(first.params);
  free(header);
  kn_model_free(&a);
  kn_model_free(&b);
  kn_dataset_free(&ds);
  char cmd[100];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void bad_configs_are_refused_by_name(void **state) {
  (void)state;
  float x[4] = {0};
  int32_t y[4] = {0};
  kn_dataset flat = {.n = 4, .ndim = 1, .shape = {1}, .example_size = 1, .x = x, .y = y};
  kn_pipeline_config cfg = plain(2);
  kn_pipeline *p = NULL;
  char err[256];
  cfg.augment = KN_AUG_FLIP_LEFT_RIGHT;
  assert_int_equal(kn_pipeline_new(&flat, &cfg, &p, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "augmentation needs image examples"));
  cfg = plain(2);
  cfg.shard_index = 3;
  cfg.shard_count = 3;
  assert_int_equal(kn_pipeline_new(&flat, &cfg, &p, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "shard 3 of 3"));
  cfg = plain(6);
  cfg.part_index = 0;
  cfg.part_count = 4; /* 4 parts of 6 rows */
  assert_int_equal(kn_pipeline_new(&flat, &cfg, &p, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "part 0 of 4 of batches of 6"));
  cfg.part_count = 3;
  cfg.part_index = 3;
  assert_int_equal(kn_pipeline_new(&flat, &cfg, &p, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "part 3 of 3"));
  cfg = plain(8);
  cfg.drop_remainder = 1;
  assert_int_equal(kn_pipeline_new(&flat, &cfg, &p, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "no full batch of 8"));
  cfg = plain(2);
  cfg.skip = 4;
  assert_int_equal(kn_pipeline_new(&flat, &cfg, &p, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "skip must be 0..3"));
  assert_null(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(normalize_divides_pixels_by_their_range),
      cmocka_unit_test(normalize_without_a_range_is_min_max_per_feature),
      cmocka_unit_test(standardize_computed_gives_zero_mean_unit_std_per_channel),
      cmocka_unit_test(standardize_given_uses_the_given_mean_and_std),
      cmocka_unit_test(one_hot_sets_the_label_column),
      cmocka_unit_test(flip_left_right_mirrors_columns_of_about_half),
      cmocka_unit_test(flip_up_down_mirrors_rows_of_about_half),
      cmocka_unit_test(random_crop_shifts_within_the_padding_and_fills_zeros),
      cmocka_unit_test(random_brightness_adds_one_bounded_delta_per_example),
      cmocka_unit_test(full_shuffle_is_a_new_permutation_each_epoch),
      cmocka_unit_test(buffer_shuffle_moves_examples_at_most_a_buffer_early),
      cmocka_unit_test(batch_keeps_or_drops_the_remainder),
      cmocka_unit_test(skip_take_and_repeat_pick_the_examples),
      cmocka_unit_test(any_thread_count_gives_byte_identical_batches),
      cmocka_unit_test(shards_cover_every_example_once_per_epoch),
      cmocka_unit_test(parts_of_each_batch_are_the_whole_batch_byte_for_byte),
      cmocka_unit_test(restored_pipeline_yields_the_same_next_100_batches),
      cmocka_unit_test(auto_tuning_chooses_after_the_warm_up),
      cmocka_unit_test(resumed_training_sees_the_batches_it_would_have_seen),
      cmocka_unit_test(bad_configs_are_refused_by_name),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
