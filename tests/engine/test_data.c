/* IDX reading: values, gzip and raw files, a clear error naming the file
 * for each kind of bad data, and byte storage that reads as the floats. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "engine.h"

static char dir[256];

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/kiln-test-data-XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd);
}

static void put_be32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
}

/* Writes an IDX file: magic 00 00 08 ndim, dims, then data (gzip'd or raw). */
static void write_idx(const char *path, int gz, int ndim, const uint32_t *dims,
                      const unsigned char *data, size_t len, unsigned char type) {
  unsigned char hdr[4 + 4 * 3] = {0, 0, type, (unsigned char)ndim};
  for (int d = 0; d < ndim; d++) put_be32(hdr + 4 + 4 * d, dims[d]);
  if (gz) {
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    gzwrite(f, hdr, (unsigned)(4 + 4 * ndim));
    if (len) gzwrite(f, data, (unsigned)len);
    gzclose(f);
  } else {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(hdr, 1, (size_t)(4 + 4 * ndim), f);
    fwrite(data, 1, len, f);
    fclose(f);
  }
}

static void paths(char *images, char *labels, const char *tag) {
  snprintf(images, 300, "%s/%s-images", dir, tag);
  snprintf(labels, 300, "%s/%s-labels", dir, tag);
}

/* 3 images of 2x2 and their labels. */
static void write_good(const char *images, const char *labels, int gz) {
  const unsigned char pixels[12] = {0, 255, 51, 102, 1, 2, 3, 4, 255, 255, 0, 0};
  const unsigned char ys[3] = {2, 0, 7};
  uint32_t idims[3] = {3, 2, 2}, ldims[1] = {3};
  write_idx(images, gz, 3, idims, pixels, sizeof pixels, 0x08);
  write_idx(labels, gz, 1, ldims, ys, sizeof ys, 0x08);
}

static void gzip_and_raw_idx_load_with_values(void **state) {
  (void)state;
  char images[300], labels[300], err[512];
  for (int gz = 0; gz <= 1; gz++) {
    paths(images, labels, gz ? "gz" : "raw");
    write_good(images, labels, gz);
    kn_dataset ds;
    assert_int_equal(kn_dataset_load_idx(images, labels, 1, &ds, err, sizeof err), KN_OK);
    assert_int_equal(ds.n, 3);
    assert_int_equal(ds.example_size, 4);
    assert_int_equal(ds.shape[0], 2);
    assert_int_equal(ds.shape[2], 1);
    assert_int_equal(ds.n_classes, 8);
    assert_float_equal(ds.x[0], 0.0f, 0);
    assert_float_equal(ds.x[1], 1.0f, 1e-7);
    assert_float_equal(ds.x[2], 0.2f, 1e-7);
    assert_int_equal(ds.y[0], 2);
    assert_int_equal(ds.y[2], 7);
    kn_dataset_free(&ds);
    assert_int_equal(kn_dataset_load_idx(images, labels, 0, &ds, err, sizeof err), KN_OK);
    assert_float_equal(ds.x[1], 255.0f, 0);
    kn_dataset_free(&ds);
  }
}

static void wrong_magic_is_named(void **state) {
  (void)state;
  char images[300], labels[300], err[512];
  paths(images, labels, "magic");
  write_good(images, labels, 1);
  const unsigned char pixels[4] = {0};
  uint32_t dims[3] = {1, 2, 2};
  write_idx(images, 1, 3, dims, pixels, 4, 0x0D); /* float IDX, not unsigned byte */
  kn_dataset ds;
  assert_int_equal(kn_dataset_load_idx(images, labels, 1, &ds, err, sizeof err), KN_EFORMAT);
  assert_non_null(strstr(err, images));
  assert_non_null(strstr(err, "not an unsigned-byte IDX file"));
  assert_null(ds.x);
}

static void truncated_gzip_is_named_with_position(void **state) {
  (void)state;
  char images[300], labels[300], err[512];
  paths(images, labels, "trunc");
  /* A large, incompressible-ish image file, then cut in the middle. */
  size_t len = 100 * 28 * 28;
  unsigned char *pixels = malloc(len);
  for (size_t i = 0; i < len; i++) pixels[i] = (unsigned char)((i * 2654435761u) >> 24);
  uint32_t idims[3] = {100, 28, 28}, ldims[1] = {100};
  write_idx(images, 1, 3, idims, pixels, len, 0x08);
  write_idx(labels, 1, 1, ldims, pixels, 100, 0x08);
  free(pixels);
  FILE *f = fopen(images, "rb");
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fclose(f);
  assert_int_equal(truncate(images, size / 2), 0);
  kn_dataset ds;
  int rc = kn_dataset_load_idx(images, labels, 1, &ds, err, sizeof err);
  assert_int_equal(rc, KN_EFORMAT);
  assert_non_null(strstr(err, images));
  assert_true(strstr(err, "truncated") || strstr(err, "cannot read"));
}

static void image_and_label_counts_that_differ_are_refused(void **state) {
  (void)state;
  char images[300], labels[300], err[512];
  paths(images, labels, "count");
  write_good(images, labels, 1);
  const unsigned char ys[2] = {1, 1};
  uint32_t ldims[1] = {2};
  write_idx(labels, 1, 1, ldims, ys, 2, 0x08);
  kn_dataset ds;
  assert_int_equal(kn_dataset_load_idx(images, labels, 1, &ds, err, sizeof err), KN_EFORMAT);
  char want[700];
  snprintf(want, sizeof want, "%s holds 3 images but %s holds 2 labels", images, labels);
  assert_string_equal(err, want);
}

static void missing_file_and_trailing_bytes_are_errors(void **state) {
  (void)state;
  char images[300], labels[300], err[512];
  paths(images, labels, "missing");
  kn_dataset ds;
  assert_int_equal(kn_dataset_load_idx(images, labels, 1, &ds, err, sizeof err), KN_EIO);
  assert_non_null(strstr(err, "cannot open"));
  paths(images, labels, "trailing");
  write_good(images, labels, 0);
  FILE *f = fopen(labels, "ab");
  fputc(9, f);
  fclose(f);
  assert_int_equal(kn_dataset_load_idx(images, labels, 1, &ds, err, sizeof err), KN_EFORMAT);
  assert_non_null(strstr(err, "trailing bytes"));
}

/* Rows of a and b hold the same floats, row by row. */
static void same_rows(const kn_dataset *a, const kn_dataset *b) {
  assert_int_equal(a->n, b->n);
  assert_int_equal(a->example_size, b->example_size);
  float ra[16], rb[16];
  for (int64_t i = 0; i < a->n; i++) {
    assert_memory_equal(kn_dataset_row(a, i, ra), kn_dataset_row(b, i, rb), sizeof ra);
    assert_int_equal(a->y[i], b->y[i]);
  }
}

/* Every batch of an epoch of ds, as bytes: x and y of each batch in turn. */
static unsigned char *epoch_bytes(const kn_dataset *ds, size_t *len) {
  kn_pipeline_config cfg;
  kn_pipeline_config_default(&cfg);
  cfg.batch_size = 8;
  cfg.shuffle_buffer = 64;
  cfg.seed = 3;
  cfg.normalize = 1;
  cfg.standardize = 1;
  cfg.augment = KN_AUG_FLIP_LEFT_RIGHT | KN_AUG_RANDOM_CROP;
  cfg.crop_padding = 1;
  cfg.num_parallel_calls = 2;
  cfg.cast = KN_BF16; /* the cast copy is made from the stored examples too */
  kn_pipeline *p;
  char err[512];
  assert_int_equal(kn_pipeline_new(ds, &cfg, &p, err, sizeof err), KN_OK);
  unsigned char *out = malloc(64 * (16 * sizeof(float) + sizeof(int32_t)));
  assert_non_null(out);
  *len = 0;
  kn_batch b;
  for (int k = 0; k < 8; k++) {
    assert_int_equal(kn_pipeline_next(p, &b), 1);
    memcpy(out + *len, b.x, (size_t)b.rows * 16 * sizeof(float));
    *len += (size_t)b.rows * 16 * sizeof(float);
    memcpy(out + *len, b.y, (size_t)b.rows * sizeof(int32_t));
    *len += (size_t)b.rows * sizeof(int32_t);
  }
  kn_pipeline_free(p);
  return out;
}

/* KN_IDX_BYTES keeps the file's pixels (a quarter of float storage); each
 * example reads as exactly the floats of a float load, normalized or not;
 * a pipeline makes the same batches from either; slices, interleaving and
 * the file cache keep the bytes. */
static void byte_storage_reads_as_the_floats(void **state) {
  (void)state;
  char images[300], labels[300], err[512];
  paths(images, labels, "bytes");
  unsigned char pixels[64 * 16], ys[64];
  for (int i = 0; i < 64 * 16; i++) pixels[i] = (unsigned char)((i * 37 + i / 16) % 256);
  for (int i = 0; i < 64; i++) ys[i] = (unsigned char)(i % 5);
  uint32_t idims[3] = {64, 4, 4}, ldims[1] = {64};
  write_idx(images, 1, 3, idims, pixels, sizeof pixels, 0x08);
  write_idx(labels, 1, 1, ldims, ys, sizeof ys, 0x08);
  for (unsigned norm = 0; norm <= KN_IDX_NORMALIZE; norm++) {
    kn_dataset f, b;
    assert_int_equal(kn_dataset_load_idx(images, labels, norm, &f, err, sizeof err), KN_OK);
    assert_int_equal(kn_dataset_load_idx(images, labels, norm | KN_IDX_BYTES, &b, err, sizeof err),
                     KN_OK);
    assert_null(b.x);
    assert_non_null(b.x8);
    assert_memory_equal(b.x8, pixels, sizeof pixels);
    assert_int_equal(kn_dataset_value_bytes(&b), 1);
    assert_true(b.value_range == f.value_range);
    same_rows(&f, &b);
    size_t lf, lb;
    unsigned char *ef = epoch_bytes(&f, &lf), *eb = epoch_bytes(&b, &lb);
    assert_int_equal(lf, lb);
    assert_memory_equal(ef, eb, lf);
    free(ef);
    free(eb);

    kn_dataset sf, sb, inf, inb, back;
    assert_int_equal(kn_dataset_slice(&f, 10, 30, &sf, err, sizeof err), KN_OK);
    assert_int_equal(kn_dataset_slice(&b, 10, 30, &sb, err, sizeof err), KN_OK);
    assert_non_null(sb.x8);
    same_rows(&sf, &sb);
    const int64_t parts[4] = {0, 20, 40, 64};
    assert_int_equal(kn_dataset_interleave(&f, 3, parts, 2, 3, &inf, err, sizeof err), KN_OK);
    assert_int_equal(kn_dataset_interleave(&b, 3, parts, 2, 3, &inb, err, sizeof err), KN_OK);
    assert_non_null(inb.x8);
    same_rows(&inf, &inb);
    char cache[320];
    snprintf(cache, sizeof cache, "%s/bytes.cache", dir);
    assert_int_equal(kn_dataset_cache_write(&inb, cache, err, sizeof err), KN_OK);
    assert_int_equal(kn_dataset_cache_read(cache, &back, err, sizeof err), KN_OK);
    assert_null(back.x);
    assert_non_null(back.x8);
    same_rows(&inf, &back);
    kn_dataset_free(&back);
    assert_int_equal(kn_dataset_cache_write(&inf, cache, err, sizeof err), KN_OK);
    assert_int_equal(kn_dataset_cache_read(cache, &back, err, sizeof err), KN_OK);
    assert_non_null(back.x);
    same_rows(&inf, &back);
    kn_dataset_free(&back);
    kn_dataset_free(&inf);
    kn_dataset_free(&inb);
    kn_dataset_free(&sf);
    kn_dataset_free(&sb);
    kn_dataset_free(&f);
    kn_dataset_free(&b);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(gzip_and_raw_idx_load_with_values),
      cmocka_unit_test(byte_storage_reads_as_the_floats),
      cmocka_unit_test(wrong_magic_is_named),
      cmocka_unit_test(truncated_gzip_is_named_with_position),
      cmocka_unit_test(image_and_label_counts_that_differ_are_refused),
      cmocka_unit_test(missing_file_and_trailing_bytes_are_errors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
