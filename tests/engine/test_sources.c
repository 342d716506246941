/* Data sources besides IDX: CSV files and folders of PNG/JPEG images, with
 * their values, and a clear error naming the file and position for each
 * kind of bad data. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jpeglib.h>
#include <png.h>

#include <cmocka.h>

#include "engine.h"

static char dir[256];

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/kiln-test-sources-XXXXXX");
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

static void csv_reads_features_and_integer_labels(void **state) {
  (void)state;
  char path[300], err[256];
  snprintf(path, sizeof path, "%s/ok.csv", dir);
  write_text(path, "a,label,b\r\n1.5,2,-3\r\n0,0,4e2\r\n\"7\",1, 8 \r\n\r\n");
  kn_dataset ds;
  assert_int_equal(kn_dataset_load_csv(path, "label", &ds, err, sizeof err), KN_OK);
  assert_int_equal(ds.n, 3);
  assert_int_equal(ds.example_size, 2);
  assert_int_equal(ds.n_classes, 3);
  const float x[] = {1.5f, -3, 0, 400, 7, 8};
  const int32_t y[] = {2, 0, 1};
  assert_memory_equal(ds.x, x, sizeof x);
  assert_memory_equal(ds.y, y, sizeof y);
  assert_true(ds.value_range == 0.0f);
  kn_dataset_free(&ds);
}

static void csv_class_names_map_in_sorted_order(void **state) {
  (void)state;
  char path[300], err[256];
  snprintf(path, sizeof path, "%s/names.csv", dir);
  write_text(path, "x,species\n1,virginica\n2,setosa\n3,versicolor\n4,setosa\n");
  kn_dataset ds;
  assert_int_equal(kn_dataset_load_csv(path, "species", &ds, err, sizeof err), KN_OK);
  const int32_t y[] = {2, 0, 1, 0};
  assert_memory_equal(ds.y, y, sizeof y);
  assert_int_equal(ds.n_classes, 3);
  kn_dataset_free(&ds);
}

static void csv_cell_that_is_not_a_number_is_named_by_line_and_column(void **state) {
  (void)state;
  char path[300], err[256];
  snprintf(path, sizeof path, "%s/bad.csv", dir);
  write_text(path, "a,b,label\n1,2,0\n3,x4,1\n");
  kn_dataset ds;
  assert_int_equal(kn_dataset_load_csv(path, "label", &ds, err, sizeof err), KN_EFORMAT);
  char want[400];
  snprintf(want, sizeof want, "%s: line 3, column 2 ('b'): 'x4' is not a number", path);
  assert_string_equal(err, want);
  assert_null(ds.x);
  write_text(path, "a,b,label\n1,2,0\n3,1\n");
  assert_int_equal(kn_dataset_load_csv(path, "label", &ds, err, sizeof err), KN_EFORMAT);
  assert_non_null(strstr(err, "line 3 has 2 cells, the header has 3 columns"));
  assert_int_equal(kn_dataset_load_csv(path, "class", &ds, err, sizeof err), KN_EFORMAT);
  assert_non_null(strstr(err, "no column named 'class'"));
}

static void write_png(const char *path, int w, int h, const unsigned char *rgb) {
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = (png_uint_32)w;
  img.height = (png_uint_32)h;
  img.format = PNG_FORMAT_RGB;
  assert_true(png_image_write_to_file(&img, path, 0, rgb, 0, NULL));
}

static void write_jpeg(const char *path, int w, int h, const unsigned char *rgb) {
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr jerr;
  c.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&c);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  jpeg_stdio_dest(&c, f);
  c.image_width = (JDIMENSION)w;
  c.image_height = (JDIMENSION)h;
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 100, TRUE);
  jpeg_start_compress(&c, TRUE);
  for (int r = 0; r < h; r++) {
    JSAMPROW row = (JSAMPROW)(rgb + (size_t)r * w * 3);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  fclose(f);
}

static void solid(unsigned char *rgb, int pixels, int r, int g, int b) {
  for (int i = 0; i < pixels; i++) {
    rgb[3 * i] = (unsigned char)r;
    rgb[3 * i + 1] = (unsigned char)g;
    rgb[3 * i + 2] = (unsigned char)b;
  }
}

static void image_folder_decodes_resizes_and_labels_by_folder(void **state) {
  (void)state;
  char root[300], sub[400], path[500], err[512];
  snprintf(root, sizeof root, "%s/imgs", dir);
  mkdir(root, 0755);
  snprintf(sub, sizeof sub, "%s/cat", root);
  mkdir(sub, 0755);
  snprintf(sub, sizeof sub, "%s/ant", root);
  mkdir(sub, 0755);
  unsigned char rgb[8 * 6 * 3];
  solid(rgb, 48, 200, 100, 50);
  snprintf(path, sizeof path, "%s/cat/a.png", root);
  write_png(path, 8, 6, rgb);
  /* Left half black, right half white: the resize keeps the edge. */
  for (int r = 0; r < 6; r++)
    for (int c = 0; c < 8; c++) solid(rgb + (r * 8 + c) * 3, 1, c < 4 ? 0 : 255, 0, 0);
  snprintf(path, sizeof path, "%s/cat/b.png", root);
  write_png(path, 8, 6, rgb);
  solid(rgb, 48, 30, 60, 90);
  snprintf(path, sizeof path, "%s/ant/z.jpg", root);
  write_jpeg(path, 8, 6, rgb);

  kn_dataset ds;
  int rc = kn_dataset_load_images(root, 4, 4, 3, &ds, err, sizeof err);
  if (rc) fprintf(stderr, "%s\n", err);
  assert_int_equal(rc, KN_OK);
  assert_int_equal(ds.n, 3);
  assert_int_equal(ds.n_classes, 2);
  assert_int_equal(ds.example_size, 48);
  assert_true(ds.value_range == 255.0f);
  const int32_t y[] = {0, 1, 1}; /* ant before cat; files sorted */
  assert_memory_equal(ds.y, y, sizeof y);
  for (int i = 0; i < 16; i++) { /* the JPEG, nearly exact at quality 100 */
    assert_float_equal(ds.x[3 * i], 30, 3);
    assert_float_equal(ds.x[3 * i + 1], 60, 3);
    assert_float_equal(ds.x[3 * i + 2], 90, 3);
  }
  for (int i = 0; i < 16; i++) { /* the solid PNG, exact */
    assert_float_equal(ds.x[48 + 3 * i], 200, 1e-4);
    assert_float_equal(ds.x[48 + 3 * i + 1], 100, 1e-4);
  }
  const float *edge = ds.x + 96;
  assert_float_equal(edge[0], 0, 1e-4);       /* column 0: black */
  assert_float_equal(edge[3 * 3], 255, 1e-4); /* column 3: white */
  assert_true(edge[3 * 1] < 128 && edge[3 * 2] > 127);
  kn_dataset_free(&ds);

  /* Gray: one channel, the luminance. */
  rc = kn_dataset_load_images(root, 2, 2, 1, &ds, err, sizeof err);
  assert_int_equal(rc, KN_OK);
  assert_int_equal(ds.example_size, 4);
  kn_dataset_free(&ds);
}

static void image_that_does_not_decode_is_named(void **state) {
  (void)state;
  char root[300], sub[400], path[500], err[512];
  snprintf(root, sizeof root, "%s/broken", dir);
  mkdir(root, 0755);
  snprintf(sub, sizeof sub, "%s/a", root);
  mkdir(sub, 0755);
  snprintf(sub, sizeof sub, "%s/b", root);
  mkdir(sub, 0755);
  unsigned char rgb[4 * 4 * 3];
  solid(rgb, 16, 1, 2, 3);
  snprintf(path, sizeof path, "%s/a/ok.png", root);
  write_png(path, 4, 4, rgb);
  /* A PNG signature and then garbage. */
  snprintf(path, sizeof path, "%s/b/bad.png", root);
  write_text(path, "\x89PNG\r\n\x1a\nthis is not an image at all");
  kn_dataset ds;
  assert_int_equal(kn_dataset_load_images(root, 4, 4, 3, &ds, err, sizeof err), KN_EFORMAT);
  assert_non_null(strstr(err, path));
  assert_non_null(strstr(err, "PNG"));
  assert_null(ds.x);
  /* A truncated JPEG. */
  remove(path);
  snprintf(path, sizeof path, "%s/b/cut.jpg", root);
  write_text(path, "\xff\xd8\xff\xe0\x00\x10JFIF");
  assert_int_equal(kn_dataset_load_images(root, 4, 4, 3, &ds, err, sizeof err), KN_EFORMAT);
  assert_non_null(strstr(err, path));
  assert_non_null(strstr(err, "JPEG does not decode"));
  /* Neither format. */
  remove(path);
  snprintf(path, sizeof path, "%s/b/notes.txt", root);
  write_text(path, "hello");
  assert_int_equal(kn_dataset_load_images(root, 4, 4, 3, &ds, err, sizeof err), KN_EFORMAT);
  assert_non_null(strstr(err, "notes.txt: not a PNG or JPEG image"));
}

/* Decompression bombs and cut files: a JPEG whose scan data ends early is
 * refused (as tf.io.decode_jpeg does), not filled with gray; a few bytes
 * that claim more pixels than kiln decodes are refused before any pixel is
 * (the images fuzz target found a 107-byte JPEG of 5656x12545). */
static void cut_or_oversized_images_are_refused(void **state) {
  (void)state;
  char root[300], sub[400], path[500], err[512];
  snprintf(root, sizeof root, "%s/bombs", dir);
  mkdir(root, 0755);
  snprintf(sub, sizeof sub, "%s/a", root);
  mkdir(sub, 0755);
  snprintf(sub, sizeof sub, "%s/b", root);
  mkdir(sub, 0755);
  unsigned char small[4 * 4 * 3];
  solid(small, 16, 1, 2, 3);
  snprintf(path, sizeof path, "%s/b/ok.png", root);
  write_png(path, 4, 4, small);
  enum { W = 64, H = 64 };
  unsigned char *rgb = malloc(W * H * 3);
  for (int i = 0; i < W * H * 3; i++) rgb[i] = (unsigned char)(i * 37 % 251);
  snprintf(path, sizeof path, "%s/a/cut.jpg", root);
  write_jpeg(path, W, H, rgb);
  free(rgb);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  unsigned char whole[65536];
  size_t n = fread(whole, 1, sizeof whole, f);
  fclose(f);
  assert_true(n > 1000 && n < sizeof whole);
  f = fopen(path, "wb"); /* headers and half the scan data */
  assert_int_equal(fwrite(whole, 1, n / 2, f), n / 2);
  fclose(f);
  kn_dataset ds;
  assert_int_equal(kn_dataset_load_images(root, 8, 8, 3, &ds, err, sizeof err), KN_EFORMAT);
  assert_non_null(strstr(err, "cut.jpg"));
  assert_non_null(strstr(err, "ends early"));
  remove(path);
  /* SOF0 of 16000 x 16000 (256 M pixels, each side allowed alone), then
   * nothing: refused by its size before decoding. */
  snprintf(path, sizeof path, "%s/a/huge.jpg", root);
  size_t sof = 0;
  for (size_t i = 2; i + 9 < n; i++)
    if (whole[i] == 0xff && whole[i + 1] == 0xc0) {
      sof = i;
      break;
    }
  assert_true(sof > 0);
  whole[sof + 5] = 16000 >> 8, whole[sof + 6] = 16000 & 0xff; /* height */
  whole[sof + 7] = 16000 >> 8, whole[sof + 8] = 16000 & 0xff; /* width */
  f = fopen(path, "wb");
  assert_int_equal(fwrite(whole, 1, n, f), n);
  fclose(f);
  assert_int_equal(kn_dataset_load_images(root, 8, 8, 3, &ds, err, sizeof err), KN_EFORMAT);
  assert_non_null(strstr(err, "huge.jpg"));
  assert_non_null(strstr(err, "pixels"));
}

static void cache_file_reads_back_the_same_dataset(void **state) {
  (void)state;
  char csv[300], cache[300], err[256];
  snprintf(csv, sizeof csv, "%s/cache.csv", dir);
  snprintf(cache, sizeof cache, "%s/data.kds", dir);
  write_text(csv, "x,y,label\n1,2,0\n3,4,1\n5,6,1\n");
  kn_dataset ds, back;
  assert_int_equal(kn_dataset_load_csv(csv, "label", &ds, err, sizeof err), KN_OK);
  assert_int_equal(kn_dataset_cache_write(&ds, cache, err, sizeof err), KN_OK);
  assert_int_equal(kn_dataset_cache_read(cache, &back, err, sizeof err), KN_OK);
  assert_int_equal(back.n, 3);
  assert_int_equal(back.example_size, 2);
  assert_int_equal(back.n_classes, 2);
  assert_memory_equal(back.x, ds.x, 6 * sizeof(float));
  assert_memory_equal(back.y, ds.y, 3 * sizeof(int32_t));
  kn_dataset_free(&back);
  /* A cut file is refused, not half read. */
  assert_int_equal(truncate(cache, 80), 0);
  assert_int_equal(kn_dataset_cache_read(cache, &back, err, sizeof err), KN_EFORMAT);
  assert_non_null(strstr(err, "truncated"));
  kn_dataset_free(&ds);
}

static void interleave_takes_blocks_from_open_parts_in_turn(void **state) {
  (void)state;
  /* Parts a = {0, 1, 2}, b = {3}, c = {4, 5}: labels = example index. */
  float x[6];
  int32_t y[6];
  for (int i = 0; i < 6; i++) x[i] = (float)(y[i] = i);
  kn_dataset ds = {
      .n = 6, .ndim = 1, .shape = {1}, .example_size = 1, .x = x, .y = y, .n_classes = 6};
  const int64_t parts[] = {0, 3, 4, 6};
  kn_dataset out;
  char err[256];
  assert_int_equal(kn_dataset_interleave(&ds, 3, parts, 2, 1, &out, err, sizeof err), KN_OK);
  const int32_t want[] = {0, 3, 1, 4, 2, 5}; /* b runs out, c takes its place */
  assert_memory_equal(out.y, want, sizeof want);
  for (int i = 0; i < 6; i++) assert_true(out.x[i] == (float)want[i]);
  kn_dataset_free(&out);
  assert_int_equal(kn_dataset_interleave(&ds, 3, parts, 3, 2, &out, err, sizeof err), KN_OK);
  const int32_t blocks[] = {0, 1, 3, 4, 5, 2};
  assert_memory_equal(out.y, blocks, sizeof blocks);
  kn_dataset_free(&out);
  const int64_t bad[] = {0, 3, 5};
  assert_int_equal(kn_dataset_interleave(&ds, 2, bad, 2, 1, &out, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "covering the 6 examples"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(csv_reads_features_and_integer_labels),
      cmocka_unit_test(csv_class_names_map_in_sorted_order),
      cmocka_unit_test(csv_cell_that_is_not_a_number_is_named_by_line_and_column),
      cmocka_unit_test(image_folder_decodes_resizes_and_labels_by_folder),
      cmocka_unit_test(image_that_does_not_decode_is_named),
      cmocka_unit_test(cut_or_oversized_images_are_refused),
      cmocka_unit_test(cache_file_reads_back_the_same_dataset),
      cmocka_unit_test(interleave_takes_blocks_from_open_parts_in_turn),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
