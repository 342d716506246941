/* IDX reading: values, gzip and raw files, and a clear error naming the file
 * for each kind of bad data. */
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(gzip_and_raw_idx_load_with_values),
      cmocka_unit_test(wrong_magic_is_named),
      cmocka_unit_test(truncated_gzip_is_named_with_position),
      cmocka_unit_test(image_and_label_counts_that_differ_are_refused),
      cmocka_unit_test(missing_file_and_trailing_bytes_are_errors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
