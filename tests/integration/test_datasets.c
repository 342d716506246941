/* The datasets API against a real kilnd (upload cap 64 KiB): uploads of
 * CSV, IDX and image-folder data are checked before a row exists, bad data
 * is refused naming the file and position, oversized uploads get 413, a
 * job trains on an upload, and delete is refused while a job waits on it. */
#include <curl/curl.h>
#include <dirent.h>
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
#include <time.h>
#include <unistd.h>
#include <zlib.h>
#include <png.h>

#include <cmocka.h>

#include "harness.h"

#include "engine.h"

#define UPLOAD_CAP 65536

static char data_dir[256], work[300], base_url[64];
static char admin_token[128]; /* made by kilnd on first start */
static pid_t kilnd_pid;
static char csv_id[32], images_id[32];

/* Sends body (or nothing); chunked = no Content-Length. Returns the status
 * and the parsed JSON body. */
static long http(const char *method, const char *path, const char *body, size_t len, int chunked,
                 json_t **out) {
  CURL *c = curl_easy_init();
  assert_non_null(c);
  char url[1024];
  snprintf(url, sizeof url, "%s%s", base_url, path);
  it_buffer b = {0};
  struct curl_slist *headers = curl_slist_append(NULL, "Expect:");
  char auth[200];
  snprintf(auth, sizeof auth, "Authorization: Bearer %s", admin_token);
  if (admin_token[0]) headers = curl_slist_append(headers, auth);
  if (chunked) headers = curl_slist_append(headers, "Transfer-Encoding: chunked");
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, it_on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
  if (body) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    if (!chunked) curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
  }
  CURLcode rc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(c);
  /* A server may answer 413 and close before the whole body is sent. */
  if (rc != CURLE_OK && status == 0) fail_msg("%s %s: %s", method, path, curl_easy_strerror(rc));
  if (out) *out = b.data ? json_loads(b.data, 0, NULL) : NULL;
  free(b.data);
  return status;
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)size + 1);
  assert_int_equal(fread(text, 1, (size_t)size, f), (size_t)size);
  text[size] = '\0';
  fclose(f);
  *len = (size_t)size;
  return text;
}

static void write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, len, f), len);
  fclose(f);
}

/* Uploads a file; returns the status and the JSON answer. */
static long upload(const char *query, const char *path, int chunked, json_t **out) {
  size_t len;
  char *body = read_file(path, &len);
  char route[300];
  snprintf(route, sizeof route, "/v1/datasets?%s", query);
  long status = http("POST", route, body, len, chunked, out);
  free(body);
  return status;
}

static const char *error_message(json_t *doc) {
  return json_string_value(json_object_get(json_object_get(doc, "error"), "message"));
}

static size_t count_uploads(void) {
  json_t *doc;
  assert_int_equal(http("GET", "/v1/datasets", NULL, 0, 0, &doc), 200);
  size_t n = json_array_size(json_object_get(doc, "datasets")) - 1; /* less fashion-mnist */
  json_decref(doc);
  return n;
}

/* Nothing left behind in the uploads folder but accepted data sets. */
static void assert_no_stray_upload_files(void) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s/datasets' | grep -v '^ds-')\"", data_dir);
  assert_int_equal(system(cmd), 0);
}

/* ---- kilnd ---- */

static int start(void **state) {
  (void)state;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-it-ds-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  snprintf(work, sizeof work, "%s/work", data_dir);
  mkdir(work, 0755);
  /* Every /v1 route needs the admin token kilnd writes on first start. */
  return it_launch_kilnd(KILND_PATH, data_dir, KILN_TRAIN_PATH, "--max-upload-bytes", "65536",
                         &kilnd_pid, base_url, sizeof base_url, admin_token, sizeof admin_token);
}

static int stop(void **state) {
  (void)state;
  if (kilnd_pid > 0) {
    kill(kilnd_pid, SIGKILL);
    waitpid(kilnd_pid, NULL, 0);
  }
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", data_dir);
  int rc = system(cmd);
  curl_global_cleanup();
  return rc;
}

/* ---- data ---- */

/* 300 rows of 4 features, class = which feature is large. */
static void write_csv(const char *path) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "a,b,c,d,species\n");
  kn_rng rng;
  kn_rng_seed(&rng, 3);
  const char *names[] = {"setosa", "versicolor", "virginica"};
  for (int i = 0; i < 300; i++) {
    int k = (int)kn_rng_below(&rng, 3);
    for (int j = 0; j < 4; j++)
      fprintf(f, "%.3f,", (j == k ? 2.0 : 0.0) + kn_rng_uniform(&rng) - 0.5);
    fprintf(f, "%s\n", names[k]);
  }
  fclose(f);
}

static void put_be32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
}

/* A gzip'd IDX file: magic 00 00 magic2 ndim, dims, bytes; cut set keeps
 * only the first half of the gzip stream. */
static void write_idx(const char *path, int ndim, const uint32_t *dims, size_t count,
                      unsigned char magic2, int cut) {
  unsigned char hdr[16] = {0, 0, magic2, (unsigned char)ndim};
  for (int d = 0; d < ndim; d++) put_be32(hdr + 4 + 4 * d, dims[d]);
  unsigned char *data = calloc(1, count);
  for (size_t i = 0; i < count; i++) data[i] = (unsigned char)(i * 7 % 10);
  gzFile g = gzopen(path, "wb");
  gzwrite(g, hdr, (unsigned)(4 + 4 * ndim));
  gzwrite(g, data, (unsigned)count);
  gzclose(g);
  free(data);
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  if (cut) assert_int_equal(truncate(path, sb.st_size / 2), 0);
}

static void make_tar(const char *src, const char *tar) {
  char cmd[1000];
  snprintf(cmd, sizeof cmd, "tar -C '%s' -cf '%s' .", src, tar);
  assert_int_equal(system(cmd), 0);
}

/* An IDX pair in a tar: images magic, label count and truncation vary. */
static void idx_tar(const char *name, unsigned char image_magic, uint32_t labels, int cut,
                    char *tar, size_t tarlen) {
  char d[400], path[500];
  snprintf(d, sizeof d, "%s/%s", work, name);
  mkdir(d, 0755);
  uint32_t idims[3] = {50, 4, 4}, ldims[1] = {labels};
  snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", d);
  write_idx(path, 3, idims, 50 * 16, image_magic, cut);
  snprintf(path, sizeof path, "%s/train-labels-idx1-ubyte.gz", d);
  write_idx(path, 1, ldims, labels, 0x08, 0);
  snprintf(tar, tarlen, "%s/%s.tar", work, name);
  make_tar(d, tar);
}

/* ---- tests, in order ---- */

static void upload_without_a_token_is_401_and_stores_nothing(void **state) {
  (void)state;
  char path[400], saved[sizeof admin_token];
  snprintf(path, sizeof path, "%s/anonymous.csv", work);
  write_csv(path);
  size_t before = count_uploads();
  memcpy(saved, admin_token, sizeof saved);
  admin_token[0] = '\0';
  json_t *doc;
  long status = upload("format=csv&label_column=species", path, 0, &doc);
  memcpy(admin_token, saved, sizeof saved);
  assert_int_equal(status, 401);
  assert_string_equal(json_string_value(json_object_get(json_object_get(doc, "error"), "status")),
                      "UNAUTHENTICATED");
  json_decref(doc);
  assert_int_equal(count_uploads(), before);
}

static void csv_upload_is_checked_recorded_and_listed(void **state) {
  (void)state;
  char path[400];
  snprintf(path, sizeof path, "%s/iris.csv", work);
  write_csv(path);
  json_t *doc;
  assert_int_equal(upload("format=csv&label_column=species&display_name=iris", path, 0, &doc), 200);
  const char *id = json_string_value(json_object_get(doc, "id"));
  assert_non_null(id);
  assert_int_equal(strncmp(id, "ds-", 3), 0);
  snprintf(csv_id, sizeof csv_id, "%s", id);
  assert_int_equal(json_integer_value(json_object_get(doc, "train_examples")), 300);
  assert_int_equal(json_integer_value(json_object_get(doc, "classes")), 3);
  assert_int_equal(json_integer_value(json_array_get(json_object_get(doc, "input_shape"), 0)), 4);
  /* The recorded digest is the file's. */
  size_t len;
  char *bytes = read_file(path, &len);
  kc_sha256 h;
  uint8_t digest[32];
  char hex[65];
  kc_sha256_init(&h);
  kc_sha256_update(&h, bytes, len);
  kc_sha256_final(&h, digest);
  kc_sha256_hex(digest, hex);
  free(bytes);
  assert_string_equal(json_string_value(json_object_get(doc, "sha256")), hex);
  assert_int_equal(json_integer_value(json_object_get(doc, "bytes")), (json_int_t)len);
  json_decref(doc);
  char route[96];
  snprintf(route, sizeof route, "/v1/datasets/%s", csv_id);
  assert_int_equal(http("GET", route, NULL, 0, 0, &doc), 200);
  assert_string_equal(json_string_value(json_object_get(doc, "display_name")), "iris");
  json_decref(doc);
  assert_int_equal(count_uploads(), 1);
}

/* Uploads are their tenant's: another tenant gets 404 for them, never sees
 * them listed and cannot train on them; the admin sees every tenant's. */
static void a_tenant_sees_only_its_own_uploads(void **state) {
  (void)state;
  char admin[128], alpha[128], beta[128], path[400], route[96];
  snprintf(admin, sizeof admin, "%s", admin_token);
  assert_int_equal(it_make_token(KILND_PATH, data_dir, "alpha", alpha, sizeof alpha), 0);
  assert_int_equal(it_make_token(KILND_PATH, data_dir, "beta", beta, sizeof beta), 0);
  snprintf(path, sizeof path, "%s/alpha.csv", work);
  write_csv(path);
  json_t *doc;
  snprintf(admin_token, sizeof admin_token, "%s", alpha);
  assert_int_equal(upload("format=csv&label_column=species&display_name=alphas", path, 0, &doc),
                   200);
  char id[32];
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(doc, "id")));
  json_decref(doc);
  snprintf(route, sizeof route, "/v1/datasets/%s", id);
  assert_int_equal(http("GET", route, NULL, 0, 0, NULL), 200);

  snprintf(admin_token, sizeof admin_token, "%s", beta);
  assert_int_equal(http("GET", route, NULL, 0, 0, NULL), 404);
  assert_int_equal(http("DELETE", route, NULL, 0, 0, NULL), 404);
  assert_int_equal(http("GET", "/v1/datasets?page_size=1000", NULL, 0, 0, &doc), 200);
  json_t *list = json_object_get(doc, "datasets");
  for (size_t i = 0; i < json_array_size(list); i++)
    assert_string_not_equal(json_string_value(json_object_get(json_array_get(list, i), "id")), id);
  json_decref(doc);
  char spec[1024];
  snprintf(spec, sizeof spec,
           "{\"model\":{\"input_shape\":[4],\"layers\":[{\"type\":\"dense\",\"units\":3}]},"
           "\"loss\":\"sparse_categorical_crossentropy\",\"dataset\":{\"name\":\"%s\","
           "\"validation\":\"none\"},\"optimizer\":{\"type\":\"sgd\"}}",
           id);
  assert_int_equal(http("POST", "/v1/jobs?validate_only=true", spec, strlen(spec), 0, &doc), 400);
  assert_string_equal(
      json_string_value(json_object_get(
          json_array_get(json_object_get(json_object_get(doc, "error"), "details"), 0), "field")),
      "dataset.name");
  json_decref(doc);
  snprintf(admin_token, sizeof admin_token, "%s", alpha);
  assert_int_equal(http("POST", "/v1/jobs?validate_only=true", spec, strlen(spec), 0, NULL), 200);

  snprintf(admin_token, sizeof admin_token, "%s", admin);
  assert_int_equal(http("GET", route, NULL, 0, 0, NULL), 200);
  assert_int_equal(http("DELETE", route, NULL, 0, 0, NULL), 200);
}

static void csv_cell_that_is_not_a_number_is_refused_with_line_and_column(void **state) {
  (void)state;
  char path[400];
  snprintf(path, sizeof path, "%s/bad.csv", work);
  const char text[] = "a,b,label\n1,2,0\n3,x4,1\n";
  write_file(path, text, sizeof text - 1);
  json_t *doc;
  assert_int_equal(upload("format=csv&label_column=label", path, 0, &doc), 400);
  assert_non_null(strstr(error_message(doc), "line 3, column 2 ('b'): 'x4' is not a number"));
  json_decref(doc);
  assert_int_equal(count_uploads(), 1);
  assert_no_stray_upload_files();
}

static void bad_idx_uploads_are_refused_naming_the_file(void **state) {
  (void)state;
  char tar[500];
  json_t *doc;
  idx_tar("magic", 0x0D, 50, 0, tar, sizeof tar); /* float IDX, not bytes */
  assert_int_equal(upload("format=idx", tar, 0, &doc), 400);
  assert_non_null(strstr(error_message(doc), "train-images-idx3-ubyte.gz: not an unsigned-byte"));
  json_decref(doc);
  idx_tar("counts", 0x08, 49, 0, tar, sizeof tar);
  assert_int_equal(upload("format=idx", tar, 0, &doc), 400);
  assert_non_null(strstr(error_message(doc), "holds 50 images but"));
  assert_non_null(strstr(error_message(doc), "holds 49 labels"));
  json_decref(doc);
  idx_tar("cut", 0x08, 50, 1, tar, sizeof tar); /* gzip stream cut short */
  assert_int_equal(upload("format=idx", tar, 0, &doc), 400);
  assert_non_null(strstr(error_message(doc), "train-images-idx3-ubyte.gz"));
  assert_non_null(strstr(error_message(doc), "byte"));
  json_decref(doc);
  /* And a good pair is accepted with its shape. */
  idx_tar("good", 0x08, 50, 0, tar, sizeof tar);
  assert_int_equal(upload("format=idx", tar, 0, &doc), 200);
  assert_int_equal(json_integer_value(json_object_get(doc, "train_examples")), 50);
  json_t *shape = json_object_get(doc, "input_shape");
  assert_int_equal(json_array_size(shape), 3);
  assert_int_equal(json_integer_value(json_array_get(shape, 0)), 4);
  json_decref(doc);
  assert_int_equal(count_uploads(), 2);
  assert_no_stray_upload_files();
}

static void image_that_does_not_decode_is_refused_by_name(void **state) {
  (void)state;
  char d[400], path[500], tar[500];
  snprintf(d, sizeof d, "%s/imgs", work);
  const char *classes[] = {"cat", "dog"};
  unsigned char rgb[6 * 5 * 3];
  memset(rgb, 90, sizeof rgb);
  for (int c = 0; c < 2; c++) {
    snprintf(path, sizeof path, "%s/%s", d, classes[c]);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", path);
    assert_int_equal(system(cmd), 0);
    for (int k = 0; k < 3; k++) {
      snprintf(path, sizeof path, "%s/%s/%d.png", d, classes[c], k);
      png_image img;
      memset(&img, 0, sizeof img);
      img.version = PNG_IMAGE_VERSION;
      img.width = 6;
      img.height = 5;
      img.format = PNG_FORMAT_RGB;
      assert_true(png_image_write_to_file(&img, path, 0, rgb, 0, NULL));
    }
  }
  snprintf(tar, sizeof tar, "%s/imgs.tar", work);
  make_tar(d, tar);
  json_t *doc;
  assert_int_equal(upload("format=images", tar, 0, &doc), 200);
  snprintf(images_id, sizeof images_id, "%s", json_string_value(json_object_get(doc, "id")));
  assert_int_equal(json_integer_value(json_object_get(doc, "train_examples")), 6);
  assert_int_equal(json_integer_value(json_object_get(doc, "classes")), 2);
  json_decref(doc);
  snprintf(path, sizeof path, "%s/dog/9.png", d);
  const char junk[] = "\x89PNG\r\n\x1a\nnot really";
  write_file(path, junk, sizeof junk - 1);
  make_tar(d, tar);
  assert_int_equal(upload("format=images", tar, 0, &doc), 400);
  assert_non_null(strstr(error_message(doc), "dog/9.png"));
  assert_non_null(strstr(error_message(doc), "PNG"));
  json_decref(doc);
  assert_int_equal(count_uploads(), 3);
  assert_no_stray_upload_files();
}

/* A ustar archive of one file whose name climbs out of the folder. */
static void write_escaping_tar(const char *path) {
  unsigned char h[512] = {0};
  const char body[] = "a,label\n1,0\n";
  snprintf((char *)h, 100, "../evil.csv");
  memcpy(h + 100, "0000644", 7);
  memcpy(h + 108, "0000000", 7);
  memcpy(h + 116, "0000000", 7);
  snprintf((char *)h + 124, 12, "%011o", (unsigned)(sizeof body - 1));
  memcpy(h + 136, "00000000000", 11);
  h[156] = '0';
  memcpy(h + 257, "ustar", 6);
  memcpy(h + 263, "00", 2);
  memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; i++) sum += h[i];
  snprintf((char *)h + 148, 8, "%06o", sum);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  unsigned char block[512] = {0};
  memcpy(block, body, sizeof body - 1);
  fwrite(h, 1, 512, f);
  fwrite(block, 1, 512, f);
  memset(block, 0, sizeof block);
  fwrite(block, 1, 512, f);
  fwrite(block, 1, 512, f);
  fclose(f);
}

static void archive_entry_outside_the_folder_is_refused(void **state) {
  (void)state;
  char tar[400], escaped[400];
  snprintf(tar, sizeof tar, "%s/escape.tar", work);
  write_escaping_tar(tar);
  json_t *doc;
  assert_int_equal(upload("format=images", tar, 0, &doc), 400);
  assert_non_null(strstr(error_message(doc), "'../evil.csv'"));
  assert_non_null(strstr(error_message(doc), "would land outside the data set"));
  json_decref(doc);
  struct stat sb;
  snprintf(escaped, sizeof escaped, "%s/datasets/evil.csv", data_dir);
  assert_int_equal(stat(escaped, &sb), -1);
  assert_no_stray_upload_files();
}

/* What is left of refused uploads the moment their answer arrives: the
 * folder must be gone before the 400 is sent, not some time after. */
static int stray_upload_dirs(void) {
  char dir[400];
  snprintf(dir, sizeof dir, "%s/datasets", data_dir);
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += strncmp(e->d_name, ".upload-", 8) == 0;
  closedir(d);
  return n;
}

static void refused_upload_is_removed_before_the_answer(void **state) {
  (void)state;
  char tar[400];
  snprintf(tar, sizeof tar, "%s/escape.tar", work);
  write_escaping_tar(tar);
  size_t len;
  char *body = read_file(tar, &len);
  for (int i = 0; i < 40; i++) {
    json_t *doc;
    assert_int_equal(http("POST", "/v1/datasets?format=images", body, len, 0, &doc), 400);
    json_decref(doc);
    int left = stray_upload_dirs();
    if (left) fail_msg("try %d: %d upload folder(s) still there after the 400", i + 1, left);
  }
  free(body);
}

static void upload_over_the_cap_gets_413(void **state) {
  (void)state;
  char path[400];
  snprintf(path, sizeof path, "%s/big.csv", work);
  size_t len = UPLOAD_CAP + 100;
  char *big = malloc(len);
  memset(big, '1', len);
  write_file(path, big, len);
  free(big);
  json_t *doc;
  /* Content-Length says too much: refused before the body is read. */
  assert_int_equal(upload("format=csv&label_column=a", path, 0, &doc), 413);
  assert_string_equal(json_string_value(json_object_get(json_object_get(doc, "error"), "status")),
                      "RESOURCE_EXHAUSTED");
  json_decref(doc);
  /* Chunked: found out while streaming. */
  assert_int_equal(upload("format=csv&label_column=a", path, 1, &doc), 413);
  assert_non_null(strstr(error_message(doc), "65536-byte limit"));
  json_decref(doc);
  assert_int_equal(count_uploads(), 3);
  assert_no_stray_upload_files();
  /* A missing format is named before anything is read. */
  assert_int_equal(upload("label_column=a", path, 0, &doc), 400);
  assert_string_equal(
      json_string_value(json_object_get(
          json_array_get(json_object_get(json_object_get(doc, "error"), "details"), 0), "field")),
      "format");
  json_decref(doc);
}

static json_t *wait_terminal(const char *id) {
  char route[96];
  snprintf(route, sizeof route, "/v1/jobs/%s", id);
  for (int i = 0; i < 3000; i++) {
    json_t *doc;
    assert_int_equal(http("GET", route, NULL, 0, 0, &doc), 200);
    const char *st = json_string_value(json_object_get(doc, "state"));
    if (strcmp(st, "SUCCEEDED") == 0 || strcmp(st, "FAILED") == 0) return doc;
    json_decref(doc);
    usleep(100 * 1000);
  }
  fail_msg("job %s did not finish", id);
  return NULL;
}

static void images_job_interleaves_augments_and_caches_the_decoded_data(void **state) {
  (void)state;
  char spec[1024];
  snprintf(spec, sizeof spec,
           "{\"model\":{\"input_shape\":[8,8,3],\"layers\":[{\"type\":\"flatten\"},"
           "{\"type\":\"dense\",\"units\":2}]},"
           "\"loss\":\"sparse_categorical_crossentropy\",\"metrics\":[\"accuracy\"],"
           "\"dataset\":{\"name\":\"%s\",\"validation_split\":0.5},"
           "\"pipeline\":{\"batch_size\":2,\"augment\":[\"flip_left_right\","
           "{\"type\":\"random_crop\",\"padding\":1}],\"cache\":\"file\","
           "\"interleave\":{\"cycle_length\":2}},"
           "\"optimizer\":{\"type\":\"sgd\"},\"epochs\":2,\"seed\":3}",
           images_id);
  json_t *doc;
  assert_int_equal(http("POST", "/v1/jobs", spec, strlen(spec), 0, &doc), 200);
  char id[64];
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(doc, "id")));
  json_decref(doc);
  doc = wait_terminal(id);
  if (strcmp(json_string_value(json_object_get(doc, "state")), "SUCCEEDED") != 0)
    fail_msg("job failed: %s", json_string_value(json_object_get(doc, "message")));
  /* 3 training and 3 validation images: interleaved, both classes in each. */
  json_t *m = json_object_get(doc, "latest_metrics");
  assert_non_null(json_object_get(m, "val_accuracy"));
  json_decref(doc);
  char cache[400];
  struct stat sb;
  snprintf(cache, sizeof cache, "%s/datasets/%s/cache-8x8x3.kds", data_dir, images_id);
  assert_int_equal(stat(cache, &sb), 0);
  assert_true(sb.st_size > 6 * 8 * 8 * 3 * 4);
  /* Interleave on a one-file data set is refused at create, by field. */
  snprintf(spec, sizeof spec,
           "{\"model\":{\"input_shape\":[4],\"layers\":[{\"type\":\"dense\",\"units\":3}]},"
           "\"loss\":\"sparse_categorical_crossentropy\",\"dataset\":{\"name\":\"%s\"},"
           "\"pipeline\":{\"interleave\":{\"cycle_length\":2}},\"optimizer\":{\"type\":"
           "\"sgd\"}}",
           csv_id);
  assert_int_equal(http("POST", "/v1/jobs", spec, strlen(spec), 0, &doc), 400);
  assert_string_equal(
      json_string_value(json_object_get(
          json_array_get(json_object_get(json_object_get(doc, "error"), "details"), 0), "field")),
      "pipeline.interleave");
  json_decref(doc);
}

/* A folder of shards is made of files: interleave over them is accepted
 * at create (validate_only: the folder is read when the job runs). */
static void a_shard_folder_job_may_interleave_its_files(void **state) {
  (void)state;
  const char *spec =
      "{\"model\":{\"input_shape\":[4,4,1],\"layers\":[{\"type\":\"flatten\"},"
      "{\"type\":\"dense\",\"units\":3}]},\"loss\":\"sparse_categorical_crossentropy\","
      "\"dataset\":{\"name\":\"fm\",\"format\":\"tfrecord\"},"
      "\"pipeline\":{\"interleave\":{\"cycle_length\":2}},\"optimizer\":{\"type\":\"sgd\"}}";
  json_t *doc;
  long status = http("POST", "/v1/jobs?validate_only=true", spec, strlen(spec), 0, &doc);
  if (status != 200) fail_msg("validate_only: %ld %s", status, error_message(doc));
  json_decref(doc);
}

/* 240 rows of x1, x2 in [0, 1): price = 3 x1 - 2 x2 + 1 + noise in
 * [-0.05, 0.05). */
static void write_regression_csv(const char *path) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "x1,x2,price\n");
  kn_rng rng;
  kn_rng_seed(&rng, 21);
  for (int i = 0; i < 240; i++) {
    float a = kn_rng_uniform(&rng), b = kn_rng_uniform(&rng);
    float noise = 0.1f * (kn_rng_uniform(&rng) - 0.5f);
    fprintf(f, "%.4f,%.4f,%.4f\n", a, b, 3.0f * a - 2.0f * b + 1.0f + noise);
  }
  fclose(f);
}

static const char *first_detail_field(json_t *doc) {
  return json_string_value(json_object_get(
      json_array_get(json_object_get(json_object_get(doc, "error"), "details"), 0), "field"));
}

/* The points of one metric, in step order. */
static size_t metric_values(const char *id, const char *name, double *values, size_t max) {
  char route[200];
  snprintf(route, sizeof route, "/v1/jobs/%s/metrics?name=%s", id, name);
  json_t *doc;
  assert_int_equal(http("GET", route, NULL, 0, 0, &doc), 200);
  json_t *pts = json_object_get(doc, "metrics");
  size_t n = json_array_size(pts) < max ? json_array_size(pts) : max;
  for (size_t i = 0; i < n; i++)
    values[i] = json_real_value(json_object_get(json_array_get(pts, i), "value"));
  json_decref(doc);
  return n;
}

static void regression_csv_job_stores_loss_and_mae_with_validation(void **state) {
  (void)state;
  char path[400];
  snprintf(path, sizeof path, "%s/prices.csv", work);
  write_regression_csv(path);
  json_t *doc;
  assert_int_equal(upload("format=csv&label_column=price", path, 0, &doc), 200);
  char id[32], spec[1200], job[64];
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(doc, "id")));
  json_decref(doc);
  const char *fmt = "{\"model\":{\"input_shape\":[2],\"layers\":[{\"type\":\"dense\",\"units\":"
                    "16,\"activation\":\"relu\"},{\"type\":\"dense\",\"units\":%d}]},"
                    "\"loss\":\"%s\",\"metrics\":[\"%s\"],"
                    "\"dataset\":{\"name\":\"%s\",\"validation_split\":0.25},"
                    "\"pipeline\":{\"batch_size\":16,\"normalize\":false,\"cast\":\"float32\"},"
                    "\"optimizer\":{\"type\":\"adam\",\"learning_rate\":0.02},\"epochs\":40,"
                    "\"log_every_steps\":5,\"seed\":4}";
  /* Mismatches are refused at create, each at its field. */
  snprintf(spec, sizeof spec, fmt, 3, "mse", "mae", id);
  assert_int_equal(http("POST", "/v1/jobs", spec, strlen(spec), 0, &doc), 400);
  assert_string_equal(first_detail_field(doc), "model.layers");
  assert_non_null(strstr(error_message(doc), "the last layer needs 1 unit, got 3"));
  json_decref(doc);
  snprintf(spec, sizeof spec, fmt, 1, "mean_squared_error", "accuracy", id);
  assert_int_equal(http("POST", "/v1/jobs", spec, strlen(spec), 0, &doc), 400);
  assert_string_equal(first_detail_field(doc), "metrics[0]");
  json_decref(doc);
  snprintf(spec, sizeof spec, fmt, 1, "sparse_categorical_crossentropy", "accuracy", id);
  assert_int_equal(http("POST", "/v1/jobs", spec, strlen(spec), 0, &doc), 400);
  assert_string_equal(first_detail_field(doc), "model.layers[1]");
  json_decref(doc);

  snprintf(spec, sizeof spec, fmt, 1, "mse", "mae", id);
  assert_int_equal(http("POST", "/v1/jobs", spec, strlen(spec), 0, &doc), 200);
  snprintf(job, sizeof job, "%s", json_string_value(json_object_get(doc, "id")));
  json_decref(doc);
  doc = wait_terminal(job);
  if (strcmp(json_string_value(json_object_get(doc, "state")), "SUCCEEDED") != 0)
    fail_msg("job failed: %s", json_string_value(json_object_get(doc, "message")));
  json_t *latest = json_object_get(doc, "latest_metrics");
  assert_null(json_object_get(latest, "val_accuracy"));
  double val_mae = json_real_value(json_object_get(latest, "val_mae"));
  double val_loss = json_real_value(json_object_get(latest, "val_loss"));
  print_message("regression: val_loss %.4f val_mae %.4f\n", val_loss, val_mae);
  json_decref(doc);
  /* Predicting the mean would leave an mae near 0.9: the model learned. */
  assert_true(val_mae > 0.0 && val_mae < 0.25);
  assert_true(val_loss > 0.0 && val_loss < 0.1);
  double values[512];
  size_t n = metric_values(job, "loss", values, 512);
  /* 180 training rows in batches of 16: 12 steps an epoch, 480 in all. */
  assert_int_equal(n, 480 / 5);
  size_t n_mae = metric_values(job, "mae", values + 256, 256);
  assert_int_equal(n_mae, n);
  assert_true(values[n - 1] < values[0]);
  n = metric_values(job, "val_mae", values, 512);
  assert_int_equal(n, 40);
  assert_true(values[39] < 0.5 * values[0]);
  assert_true(values[39] == val_mae);

  /* Shard 0 of 3 trains on its third: 60 of the 180 rows, 4 steps an
   * epoch where the whole set takes 12. */
  snprintf(spec, sizeof spec,
           "{\"model\":{\"input_shape\":[2],\"layers\":[{\"type\":\"dense\",\"units\":1}]},"
           "\"loss\":\"mae\",\"dataset\":{\"name\":\"%s\",\"validation_split\":0.25},"
           "\"pipeline\":{\"batch_size\":16,\"shard\":{\"num_shards\":3,\"index\":0}},"
           "\"optimizer\":{\"type\":\"sgd\"},\"epochs\":2,\"seed\":4}",
           id);
  assert_int_equal(http("POST", "/v1/jobs", spec, strlen(spec), 0, &doc), 200);
  snprintf(job, sizeof job, "%s", json_string_value(json_object_get(doc, "id")));
  json_decref(doc);
  doc = wait_terminal(job);
  if (strcmp(json_string_value(json_object_get(doc, "state")), "SUCCEEDED") != 0)
    fail_msg("sharded job failed: %s", json_string_value(json_object_get(doc, "message")));
  json_decref(doc);
  char route[200];
  snprintf(route, sizeof route, "/v1/jobs/%s/metrics?name=epoch_loss", job);
  assert_int_equal(http("GET", route, NULL, 0, 0, &doc), 200);
  json_t *pts = json_object_get(doc, "metrics");
  assert_int_equal(json_array_size(pts), 2);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(pts, 0), "step")), 4);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(pts, 1), "step")), 8);
  json_decref(doc);
}

static void job_trains_on_an_upload_and_holds_it_until_done(void **state) {
  (void)state;
  /* A first job keeps the scheduler busy, so the second waits queued. */
  const char *first = "{\"model\":{\"input_shape\":[28,28,1],\"layers\":[{\"type\":\"flatten\"},"
                      "{\"type\":\"dense\",\"units\":64,\"activation\":\"relu\"},"
                      "{\"type\":\"dense\",\"units\":10}]},"
                      "\"loss\":\"sparse_categorical_crossentropy\",\"dataset\":{\"name\":"
                      "\"fashion-mnist\",\"validation\":\"none\"},\"pipeline\":{\"batch_size\":"
                      "256},\"optimizer\":{\"type\":\"sgd\"},\"epochs\":1}";
  char second[1024];
  snprintf(second, sizeof second,
           "{\"model\":{\"input_shape\":[4],\"layers\":[{\"type\":\"dense\",\"units\":16,"
           "\"activation\":\"relu\"},{\"type\":\"dense\",\"units\":3}]},"
           "\"loss\":\"sparse_categorical_crossentropy\",\"metrics\":[\"accuracy\"],"
           "\"dataset\":{\"name\":\"%s\",\"validation_split\":0.2},"
           "\"pipeline\":{\"batch_size\":8,\"standardize\":true},"
           "\"optimizer\":{\"type\":\"adam\",\"learning_rate\":0.01},\"epochs\":5,\"seed\":1}",
           csv_id);
  json_t *doc;
  assert_int_equal(http("POST", "/v1/jobs", first, strlen(first), 0, &doc), 200);
  char first_id[64], second_id[64];
  snprintf(first_id, sizeof first_id, "%s", json_string_value(json_object_get(doc, "id")));
  json_decref(doc);
  assert_int_equal(http("POST", "/v1/jobs", second, strlen(second), 0, &doc), 200);
  snprintf(second_id, sizeof second_id, "%s", json_string_value(json_object_get(doc, "id")));
  json_decref(doc);

  char route[96];
  snprintf(route, sizeof route, "/v1/datasets/%s", csv_id);
  assert_int_equal(http("DELETE", route, NULL, 0, 0, &doc), 409);
  assert_string_equal(json_string_value(json_object_get(json_object_get(doc, "error"), "status")),
                      "FAILED_PRECONDITION");
  assert_non_null(strstr(error_message(doc), second_id));
  json_decref(doc);

  json_decref(wait_terminal(first_id));
  doc = wait_terminal(second_id);
  assert_string_equal(json_string_value(json_object_get(doc, "state")), "SUCCEEDED");
  double acc =
      json_real_value(json_object_get(json_object_get(doc, "latest_metrics"), "val_accuracy"));
  assert_true(acc > 0.8); /* the blobs are easy */
  json_decref(doc);
  /* The auto-tuner's choice is one of the job's events. */
  char events[128];
  snprintf(events, sizeof events, "/v1/jobs/%s/events", second_id);
  assert_int_equal(http("GET", events, NULL, 0, 0, &doc), 200);
  int tuned = 0, planned = 0;
  json_t *list = json_object_get(doc, "events");
  for (size_t i = 0; i < json_array_size(list); i++) {
    json_t *e = json_array_get(list, i);
    const char *message = json_string_value(json_object_get(e, "message"));
    if (strcmp(json_string_value(json_object_get(e, "reason")), "PIPELINE_TUNED") == 0) {
      tuned = 1;
      assert_non_null(strstr(message, "threads"));
    }
    /* So is the plan a client measures progress against. */
    if (strcmp(json_string_value(json_object_get(e, "reason")), "TRAINING") == 0) {
      planned = 1;
      assert_non_null(strstr(message, " epochs of "));
      assert_non_null(strstr(message, " steps"));
    }
  }
  assert_true(tuned);
  assert_true(planned);
  json_decref(doc);

  /* Done: now it can go, files and all. */
  assert_int_equal(http("DELETE", route, NULL, 0, 0, &doc), 200);
  json_decref(doc);
  assert_int_equal(http("GET", route, NULL, 0, 0, &doc), 404);
  json_decref(doc);
  char dir[400];
  struct stat sb;
  snprintf(dir, sizeof dir, "%s/datasets/%s", data_dir, csv_id);
  assert_int_equal(stat(dir, &sb), -1);
  /* A job naming it now is refused at create. */
  assert_int_equal(http("POST", "/v1/jobs", second, strlen(second), 0, &doc), 400);
  assert_string_equal(
      json_string_value(json_object_get(
          json_array_get(json_object_get(json_object_get(doc, "error"), "details"), 0), "field")),
      "dataset.name");
  json_decref(doc);
  /* The built-in one cannot be deleted. */
  assert_int_equal(http("DELETE", "/v1/datasets/fashion-mnist", NULL, 0, 0, &doc), 409);
  json_decref(doc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(upload_without_a_token_is_401_and_stores_nothing),
      cmocka_unit_test(csv_upload_is_checked_recorded_and_listed),
      cmocka_unit_test(a_tenant_sees_only_its_own_uploads),
      cmocka_unit_test(csv_cell_that_is_not_a_number_is_refused_with_line_and_column),
      cmocka_unit_test(bad_idx_uploads_are_refused_naming_the_file),
      cmocka_unit_test(image_that_does_not_decode_is_refused_by_name),
      cmocka_unit_test(archive_entry_outside_the_folder_is_refused),
      cmocka_unit_test(refused_upload_is_removed_before_the_answer),
      cmocka_unit_test(upload_over_the_cap_gets_413),
      cmocka_unit_test(images_job_interleaves_augments_and_caches_the_decoded_data),
      cmocka_unit_test(a_shard_folder_job_may_interleave_its_files),
      cmocka_unit_test(regression_csv_job_stores_loss_and_mae_with_validation),
      cmocka_unit_test(job_trains_on_an_upload_and_holds_it_until_done),
  };
  return cmocka_run_group_tests(tests, start, stop);
}
