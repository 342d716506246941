/* Shard data sets through the API against a real kilnd and kiln-train:
 * TFRecord and tar shards uploaded (an archive of train/ and test/
 * folders, raw and gzip'd shards, or one TFRecord file) are checked
 * record by record and list their features; corrupt, truncated and
 * mislabelled data is refused naming the file and record; jobs name the
 * set with its format and train on it; an admin registers a folder of
 * shards under the datasets directory, confined to it (no "..", no
 * absolute path, no link leading out), and deleting it leaves the folder. */
#include <curl/curl.h>
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
#include <zlib.h>

#include <cmocka.h>

#include "harness.h"

#include "engine.h"

static char data_dir[256], datasets_dir[300], work[300], base_url[64];
static char admin_token[128], user_token[128];
static pid_t kilnd_pid;

static long http_as(const char *token, const char *method, const char *path, const char *body,
                    size_t len, json_t **out) {
  CURL *c = curl_easy_init();
  assert_non_null(c);
  char url[1024], auth[200];
  snprintf(url, sizeof url, "%s%s", base_url, path);
  snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
  it_buffer b = {0};
  struct curl_slist *headers = curl_slist_append(NULL, "Expect:");
  headers = curl_slist_append(headers, auth);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, it_on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
  if (body) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
  }
  CURLcode rc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(c);
  if (rc != CURLE_OK && status == 0) fail_msg("%s %s: %s", method, path, curl_easy_strerror(rc));
  if (out) *out = b.data ? json_loads(b.data, 0, NULL) : NULL;
  free(b.data);
  return status;
}

static long http(const char *method, const char *path, const char *body, json_t **out) {
  return http_as(admin_token, method, path, body, body ? strlen(body) : 0, out);
}

static long upload(const char *query, const char *path, json_t **out) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *body = malloc((size_t)size + 1);
  assert_int_equal(fread(body, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  char route[300];
  snprintf(route, sizeof route, "/v1/datasets?%s", query);
  long status = http_as(admin_token, "POST", route, body, (size_t)size, out);
  free(body);
  return status;
}

static const char *error_message(json_t *doc) {
  const char *m = json_string_value(json_object_get(json_object_get(doc, "error"), "message"));
  return m ? m : "(no message)";
}

static const char *error_field(json_t *doc) {
  return json_string_value(json_object_get(
      json_array_get(json_object_get(json_object_get(doc, "error"), "details"), 0), "field"));
}

static void sh(const char *fmt, ...) {
  char cmd[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  if (system(cmd) != 0) fail_msg("command failed: %s", cmd);
}

/* ---- kilnd ---- */

static int start(void **state) {
  (void)state;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-it-shards-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  snprintf(work, sizeof work, "%s/work", data_dir);
  snprintf(datasets_dir, sizeof datasets_dir, "%s/builtin", data_dir);
  mkdir(work, 0755);
  mkdir(datasets_dir, 0755);
  const char *extra[] = {"--datasets-dir", datasets_dir, NULL};
  if (it_launch_kilnd_args(KILND_PATH, data_dir, KILN_TRAIN_PATH, extra, &kilnd_pid, base_url,
                           sizeof base_url, admin_token, sizeof admin_token) != 0)
    return -1;
  return it_make_token(KILND_PATH, data_dir, "acme", user_token, sizeof user_token);
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

/* ---- data: 4x4 images, label = i % 3, pixels from the label ---- */

typedef struct out_file {
  FILE *f;
  gzFile g;
} out_file;

static void out_write(out_file *o, const void *p, size_t n) {
  if (o->f)
    assert_int_equal(fwrite(p, 1, n, o->f), n);
  else
    assert_int_equal(gzwrite(o->g, p, (unsigned)n), (int)n);
}

static void image(int64_t i, uint8_t px[16]) {
  for (int k = 0; k < 16; k++) px[k] = (uint8_t)((i % 3) * 80 + (k % 4) * 5 + i % 7);
}

/* n records of (image, label) under the given feature names; record
 * corrupt (>= 0) gets a flipped data byte; cut_tail drops the file's last
 * bytes. */
static void write_tfrecord(const char *path, int gz, int64_t first, int n, const char *image_name,
                           const char *label_name, int corrupt, int cut_tail) {
  out_file o = {gz ? NULL : fopen(path, "wb"), gz ? gzopen(path, "wb") : NULL};
  assert_true(o.f || o.g);
  for (int r = 0; r < n; r++) {
    uint8_t px[16], *rec, head[12], tail[4];
    const int64_t label = (first + r) % 3;
    image(first + r, px);
    kn_feature_value v[] = {
        {.name = image_name, .kind = KN_FEATURE_BYTES, .bytes = px, .count = 16},
        {.name = label_name, .kind = KN_FEATURE_INT64, .ints = &label, .count = 1},
    };
    size_t len;
    assert_int_equal(kn_example_encode(v, 2, &rec, &len), KN_OK);
    kn_tfrecord_frame(rec, len, head, tail);
    if (r == corrupt) rec[len / 2] ^= 0x40;
    out_write(&o, head, 12);
    out_write(&o, rec, r == n - 1 && cut_tail ? len - 3 : len);
    if (!(r == n - 1 && cut_tail)) out_write(&o, tail, 4);
    free(rec);
  }
  if (o.f) fclose(o.f);
  if (o.g) gzclose(o.g);
}

/* A WebDataset tar shard of n samples: KEY.raw (16 bytes) and KEY.cls. */
static void write_tar_shard(const char *dir, const char *path, int64_t first, int n) {
  char sample_dir[480];
  snprintf(sample_dir, sizeof sample_dir, "%s/samples", dir);
  sh("rm -rf '%s' && mkdir -p '%s'", sample_dir, sample_dir);
  for (int r = 0; r < n; r++) {
    char p[560], cls[16];
    uint8_t px[16];
    image(first + r, px);
    snprintf(p, sizeof p, "%s/%06lld.raw", sample_dir, (long long)(first + r));
    FILE *f = fopen(p, "wb");
    assert_int_equal(fwrite(px, 1, 16, f), 16);
    fclose(f);
    snprintf(p, sizeof p, "%s/%06lld.cls", sample_dir, (long long)(first + r));
    f = fopen(p, "wb");
    snprintf(cls, sizeof cls, "%lld\n", (long long)((first + r) % 3));
    fputs(cls, f);
    fclose(f);
  }
  sh("cd '%s' && ls | sort | tar --format=ustar -cf '%s' -T -", sample_dir, path);
}

/* A folder holding train/ (two shards, one gzip'd: 40 records) and test/
 * (one shard, 12 records) of TFRecord files. */
static void tfrecord_folder(const char *dir) {
  char p[500];
  sh("rm -rf '%s' && mkdir -p '%s/train' '%s/test'", dir, dir, dir);
  snprintf(p, sizeof p, "%s/train/part-0.tfrecord", dir);
  write_tfrecord(p, 0, 0, 20, "image/encoded", "image/class/label", -1, 0);
  snprintf(p, sizeof p, "%s/train/part-1.tfrecord.gz", dir);
  write_tfrecord(p, 1, 20, 20, "image/encoded", "image/class/label", -1, 0);
  snprintf(p, sizeof p, "%s/test/part-0.tfrecord", dir);
  write_tfrecord(p, 0, 40, 12, "image/encoded", "image/class/label", -1, 0);
}

static void make_archive(const char *dir, const char *tar) {
  sh("cd '%s' && tar --format=ustar -cf '%s' --sort=name train $(test -d test && echo test)", dir,
     tar);
}

static json_t *wait_terminal(const char *id) {
  char route[96];
  snprintf(route, sizeof route, "/v1/jobs/%s", id);
  for (int i = 0; i < 3000; i++) {
    json_t *doc;
    assert_int_equal(http("GET", route, NULL, &doc), 200);
    const char *st = json_string_value(json_object_get(doc, "state"));
    if (strcmp(st, "SUCCEEDED") == 0 || strcmp(st, "FAILED") == 0) return doc;
    json_decref(doc);
    usleep(100 * 1000);
  }
  fail_msg("job %s did not finish", id);
  return NULL;
}

/* A spec on data set name with format and dataset extras. */
static void spec_for(char *out, size_t len, const char *name, const char *format,
                     const char *extra) {
  snprintf(out, len,
           "{\"model\":{\"input_shape\":[4,4,1],\"layers\":[{\"type\":\"flatten\"},"
           "{\"type\":\"dense\",\"units\":3}]},\"loss\":\"sparse_categorical_crossentropy\","
           "\"metrics\":[\"accuracy\"],\"dataset\":{\"name\":\"%s\"%s%s%s%s},"
           "\"pipeline\":{\"batch_size\":4,\"interleave\":{\"cycle_length\":2}},"
           "\"optimizer\":{\"type\":\"sgd\",\"learning_rate\":0.05},\"epochs\":2,\"seed\":5}",
           name, format ? ",\"format\":\"" : "", format ? format : "", format ? "\"" : "", extra);
}

static json_t *run_job(const char *spec) {
  json_t *doc;
  long status = http("POST", "/v1/jobs", spec, &doc);
  if (status != 200) fail_msg("create: %ld %s", status, error_message(doc));
  char id[64];
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(doc, "id")));
  json_decref(doc);
  doc = wait_terminal(id);
  if (strcmp(json_string_value(json_object_get(doc, "state")), "SUCCEEDED") != 0)
    fail_msg("job failed: %s", json_string_value(json_object_get(doc, "message")));
  return doc;
}

static const char *feature_name(json_t *ds, size_t i) {
  return json_string_value(json_object_get(
      json_array_get(json_object_get(json_object_get(ds, "shards"), "features"), i), "name"));
}

/* ---- uploads ---- */

static void a_tfrecord_archive_is_checked_lists_its_features_and_trains(void **state) {
  (void)state;
  char dir[400], tar[400], spec[2048];
  snprintf(dir, sizeof dir, "%s/fm", work);
  snprintf(tar, sizeof tar, "%s/fm.tar", work);
  tfrecord_folder(dir);
  make_archive(dir, tar);
  json_t *ds;
  long status = upload("format=tfrecord&display_name=fm", tar, &ds);
  if (status != 200) fail_msg("upload: %ld %s", status, error_message(ds));
  assert_string_equal(json_string_value(json_object_get(ds, "format")), "tfrecord");
  assert_int_equal(json_integer_value(json_object_get(ds, "train_examples")), 40);
  assert_int_equal(json_integer_value(json_object_get(ds, "test_examples")), 12);
  assert_int_equal(json_integer_value(json_object_get(ds, "classes")), 3);
  json_t *shards = json_object_get(ds, "shards");
  assert_int_equal(json_integer_value(json_object_get(shards, "train_files")), 2);
  assert_int_equal(json_integer_value(json_object_get(shards, "test_files")), 1);
  assert_string_equal(json_string_value(json_object_get(shards, "image_feature")), "image/encoded");
  assert_string_equal(json_string_value(json_object_get(shards, "label_feature")),
                      "image/class/label");
  assert_string_equal(feature_name(ds, 0), "image/encoded");
  assert_string_equal(feature_name(ds, 1), "image/class/label");
  json_t *f1 = json_array_get(json_object_get(shards, "features"), 1);
  assert_string_equal(json_string_value(json_object_get(f1, "kind")), "int64");
  char id[32];
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(ds, "id")));
  json_decref(ds);
  /* The same resource from GET. */
  char route[96];
  snprintf(route, sizeof route, "/v1/datasets/%s", id);
  assert_int_equal(http("GET", route, NULL, &ds), 200);
  assert_string_equal(feature_name(ds, 0), "image/encoded");
  json_decref(ds);
  /* Without the format, or with the other one: refused by field. */
  json_t *doc;
  spec_for(spec, sizeof spec, id, NULL, "");
  assert_int_equal(http("POST", "/v1/jobs", spec, &doc), 400);
  assert_string_equal(error_field(doc), "dataset.format");
  json_decref(doc);
  spec_for(spec, sizeof spec, id, "tar", "");
  assert_int_equal(http("POST", "/v1/jobs", spec, &doc), 400);
  assert_string_equal(error_field(doc), "dataset.format");
  assert_non_null(strstr(error_message(doc), "holds tfrecord shards"));
  json_decref(doc);
  /* Streamed, interleaved over its two files, validated on test/. */
  spec_for(spec, sizeof spec, id, "tfrecord", ",\"validation\":\"test\"");
  doc = run_job(spec);
  json_t *m = json_object_get(doc, "latest_metrics");
  assert_non_null(json_object_get(m, "val_accuracy"));
  json_decref(doc);
}

static void one_tfrecord_file_with_other_names_lists_them_for_the_spec(void **state) {
  (void)state;
  char path[400], spec[2048];
  snprintf(path, sizeof path, "%s/one.tfrecord.gz", work);
  write_tfrecord(path, 1, 0, 24, "img", "y", -1, 0);
  json_t *ds;
  long status = upload("format=tfrecord", path, &ds);
  if (status != 200) fail_msg("upload: %ld %s", status, error_message(ds));
  /* The defaults are not there: no classes yet, the features listed. */
  assert_int_equal(json_integer_value(json_object_get(ds, "train_examples")), 24);
  assert_int_equal(json_integer_value(json_object_get(ds, "classes")), 0);
  json_t *shards = json_object_get(ds, "shards");
  assert_int_equal(json_integer_value(json_object_get(shards, "train_files")), 1);
  assert_string_equal(json_string_value(json_object_get(shards, "image_feature")), "");
  assert_string_equal(feature_name(ds, 0), "img");
  assert_string_equal(feature_name(ds, 1), "y");
  char id[32];
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(ds, "id")));
  json_decref(ds);
  /* Named in the spec, it trains. */
  spec_for(spec, sizeof spec, id, "tfrecord", ",\"features\":{\"image\":\"img\",\"label\":\"y\"}");
  json_decref(run_job(spec));
  /* Named at upload, they are checked and the labels counted. */
  assert_int_equal(upload("format=tfrecord&image_feature=img&label_feature=y", path, &ds), 200);
  assert_int_equal(json_integer_value(json_object_get(ds, "classes")), 3);
  json_decref(ds);
  /* A name that is not there: 400 naming the file, record and the features it has. */
  assert_int_equal(upload("format=tfrecord&label_feature=label", path, &ds), 400);
  assert_string_equal(error_field(ds), "body");
  assert_non_null(strstr(error_message(ds), "the tfrecord data set was refused: "
                                            "train/upload.tfrecord: record 0 has no feature "
                                            "'label' (the upload's label_feature); it holds"));
  json_decref(ds);
  /* A feature name is for shards only. */
  assert_int_equal(upload("format=csv&label_column=c&label_feature=y", path, &ds), 400);
  assert_string_equal(error_field(ds), "label_feature");
  json_decref(ds);
}

static void corrupt_and_truncated_shards_are_refused_naming_file_and_record(void **state) {
  (void)state;
  char dir[400], tar[400], p[500];
  snprintf(dir, sizeof dir, "%s/bad", work);
  snprintf(tar, sizeof tar, "%s/bad.tar", work);
  tfrecord_folder(dir);
  snprintf(p, sizeof p, "%s/train/part-1.tfrecord.gz", dir);
  write_tfrecord(p, 1, 20, 20, "image/encoded", "image/class/label", 3, 0);
  make_archive(dir, tar);
  json_t *doc;
  assert_int_equal(upload("format=tfrecord", tar, &doc), 400);
  const char *msg = error_message(doc);
  if (!strstr(msg, "train/part-1.tfrecord.gz: record 3 at byte ") ||
      !strstr(msg, "the data's CRC does not match (corrupt record)"))
    fail_msg("unexpected: %s", msg);
  json_decref(doc);
  /* Cut inside its last record. */
  tfrecord_folder(dir);
  snprintf(p, sizeof p, "%s/test/part-0.tfrecord", dir);
  write_tfrecord(p, 0, 40, 12, "image/encoded", "image/class/label", -1, 1);
  make_archive(dir, tar);
  assert_int_equal(upload("format=tfrecord", tar, &doc), 400);
  msg = error_message(doc);
  if (!strstr(msg, "test/part-0.tfrecord: record 11 at byte ")) fail_msg("unexpected: %s", msg);
  json_decref(doc);
  /* An archive without train/. */
  sh("cd '%s' && tar --format=ustar -cf '%s' test", dir, tar);
  assert_int_equal(upload("format=tfrecord", tar, &doc), 400);
  assert_non_null(strstr(error_message(doc), "the archive has no train/ folder"));
  json_decref(doc);
  /* Nothing of the refused uploads is left. */
  sh("test -z \"$(ls -A '%s/datasets' | grep -v '^ds-')\"", data_dir);
}

static void tar_shards_upload_lists_sample_extensions_and_trains(void **state) {
  (void)state;
  char dir[400], tar[400], p[500], spec[2048];
  snprintf(dir, sizeof dir, "%s/wds", work);
  snprintf(tar, sizeof tar, "%s/wds.tar", work);
  sh("rm -rf '%s' && mkdir -p '%s/train'", dir, dir);
  snprintf(p, sizeof p, "%s/train/shard-0.tar", dir);
  write_tar_shard(dir, p, 0, 15);
  snprintf(p, sizeof p, "%s/train/shard-1.tar", dir);
  write_tar_shard(dir, p, 15, 15);
  sh("gzip '%s/train/shard-1.tar' && rm -rf '%s/samples'", dir, dir);
  make_archive(dir, tar);
  json_t *ds;
  long status = upload("format=tar&image_feature=raw", tar, &ds);
  if (status != 200) fail_msg("upload: %ld %s", status, error_message(ds));
  assert_int_equal(json_integer_value(json_object_get(ds, "train_examples")), 30);
  assert_int_equal(json_integer_value(json_object_get(ds, "classes")), 3);
  assert_string_equal(feature_name(ds, 0), "cls");
  assert_string_equal(feature_name(ds, 1), "raw");
  char id[32];
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(ds, "id")));
  json_decref(ds);
  spec_for(spec, sizeof spec, id, "tar", ",\"features\":{\"image\":\"raw\",\"label\":\"cls\"}");
  json_decref(run_job(spec));
  /* A tar upload must be an archive of folders: one bare TFRecord file is refused. */
  snprintf(p, sizeof p, "%s/fm/train/part-0.tfrecord", work);
  assert_int_equal(upload("format=tar", p, &ds), 400);
  assert_non_null(strstr(error_message(ds), "the upload is not a tar archive"));
  json_decref(ds);
}

/* ---- registration ---- */

static long register_folder(const char *token, const char *body, json_t **doc) {
  return http_as(token, "POST", "/v1/datasets:register", body, strlen(body), doc);
}

static void expect_path_refused(const char *body, const char *want) {
  json_t *doc;
  long status = register_folder(admin_token, body, &doc);
  if (status != 400 || !strstr(error_message(doc), want))
    fail_msg("%s: %ld %s (want 400 '%s')", body, status, error_message(doc), want);
  assert_string_equal(error_field(doc), "path");
  json_decref(doc);
}

static void an_admin_registers_a_confined_folder_of_shards(void **state) {
  (void)state;
  char dir[400], spec[2048], outside[400];
  snprintf(dir, sizeof dir, "%s/shards/fm", datasets_dir);
  tfrecord_folder(dir);
  const char *body = "{\"path\": \"shards/fm\", \"format\": \"tfrecord\", \"display_name\": "
                     "\"fm shards\", \"tenant\": \"acme\"}";
  json_t *doc;
  /* A user may not. */
  assert_int_equal(register_folder(user_token, body, &doc), 403);
  json_decref(doc);
  /* The path's rules, each named. */
  expect_path_refused("{\"path\": \"../outside\", \"format\": \"tfrecord\"}",
                      "path may not hold a '.' or '..' segment");
  expect_path_refused("{\"path\": \"shards/fm/../../..\", \"format\": \"tfrecord\"}",
                      "path may not hold a '.' or '..' segment");
  expect_path_refused("{\"path\": \"/etc\", \"format\": \"tfrecord\"}",
                      "path must be relative to the datasets directory");
  expect_path_refused("{\"path\": \"shards/none\", \"format\": \"tfrecord\"}",
                      "'shards/none' is not a folder under the datasets directory");
  snprintf(outside, sizeof outside, "%s/outside", work);
  tfrecord_folder(outside);
  sh("ln -s '%s' '%s/shards/link'", outside, datasets_dir);
  expect_path_refused("{\"path\": \"shards/link\", \"format\": \"tfrecord\"}",
                      "'shards/link' leads outside the datasets directory (through a link)");
  sh("mkdir -p '%s/shards/sneaky/train' && ln -s '%s/train/part-0.tfrecord' "
     "'%s/shards/sneaky/train/x.tfrecord'",
     datasets_dir, outside, datasets_dir);
  expect_path_refused("{\"path\": \"shards/sneaky\", \"format\": \"tfrecord\"}",
                      "'shards/sneaky/train/x.tfrecord' is a link to outside the datasets");
  /* Bad data in a registered folder: named under the datasets directory. */
  sh("mkdir -p '%s/shards/badreg/train'", datasets_dir);
  char p[500];
  snprintf(p, sizeof p, "%s/shards/badreg/train/a.tfrecord", datasets_dir);
  write_tfrecord(p, 0, 0, 6, "image/encoded", "image/class/label", 2, 0);
  expect_path_refused("{\"path\": \"shards/badreg\", \"format\": \"tfrecord\"}",
                      "shards/badreg/train/a.tfrecord: record 2 at byte ");
  assert_int_equal(
      register_folder(admin_token, "{\"path\": \"shards/fm\", \"format\": \"csv\"}", &doc), 400);
  assert_string_equal(error_field(doc), "format");
  json_decref(doc);
  assert_int_equal(register_folder(admin_token,
                                   "{\"path\": \"shards/fm\", \"format\": \"tar\", \"x\": 1}",
                                   &doc),
                   400);
  assert_string_equal(error_field(doc), "x");
  json_decref(doc);
  /* Registered: checked, listed to its tenant, trained on. */
  long status = register_folder(admin_token, body, &doc);
  if (status != 200) fail_msg("register: %ld %s", status, error_message(doc));
  assert_string_equal(json_string_value(json_object_get(doc, "source")), "shards/fm");
  assert_int_equal(json_integer_value(json_object_get(doc, "train_examples")), 40);
  assert_int_equal(json_integer_value(json_object_get(doc, "test_examples")), 12);
  assert_true(json_integer_value(json_object_get(doc, "bytes")) > 0);
  char id[32], route[96];
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(doc, "id")));
  json_decref(doc);
  assert_int_equal(http_as(user_token, "GET", "/v1/datasets", NULL, 0, &doc), 200);
  int found = 0;
  for (size_t i = 0; i < json_array_size(json_object_get(doc, "datasets")); i++)
    found |= strcmp(json_string_value(
                        json_object_get(json_array_get(json_object_get(doc, "datasets"), i), "id")),
                    id) == 0;
  assert_true(found);
  json_decref(doc);
  /* Not the tenant's storage. */
  assert_int_equal(http("GET", "/v1/tenants/acme/quota", NULL, &doc), 200);
  assert_int_equal(
      json_integer_value(json_object_get(json_object_get(doc, "usage"), "storage_bytes")), 0);
  json_decref(doc);
  spec_for(spec, sizeof spec, id, "tfrecord", ",\"validation\":\"test\"");
  json_decref(run_job(spec));
  /* Deleted: the record goes, the admin's folder stays. */
  snprintf(route, sizeof route, "/v1/datasets/%s", id);
  assert_int_equal(http("DELETE", route, NULL, &doc), 200);
  json_decref(doc);
  assert_int_equal(http("GET", route, NULL, &doc), 404);
  json_decref(doc);
  sh("test -f '%s/train/part-0.tfrecord' && test -f '%s/test/part-0.tfrecord'", dir, dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_tfrecord_archive_is_checked_lists_its_features_and_trains),
      cmocka_unit_test(one_tfrecord_file_with_other_names_lists_them_for_the_spec),
      cmocka_unit_test(corrupt_and_truncated_shards_are_refused_naming_file_and_record),
      cmocka_unit_test(tar_shards_upload_lists_sample_extensions_and_trains),
      cmocka_unit_test(an_admin_registers_a_confined_folder_of_shards),
  };
  return cmocka_run_group_tests(tests, start, stop);
}
