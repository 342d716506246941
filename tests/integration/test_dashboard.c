/* test_dashboard.c — kilnd serves the dashboard embedded in its binary:
 * without a token, with content types, ETags that turn a reload into a 304,
 * a Content-Security-Policy that keeps the page to its own files, and the
 * job spec examples for the submit page. */
#include <curl/curl.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static char data_dir[256];
static char base_url[64];
static char admin_token[128];
static pid_t kilnd_pid;

typedef struct reply {
  long status;
  it_buffer body;
  it_buffer headers;
} reply;

/* GET (or another method) of path with an optional extra header; the
 * status, body and raw headers land in r (free with reply_free). */
static void request(const char *method, const char *path, const char *header, reply *r) {
  memset(r, 0, sizeof *r);
  CURL *c = curl_easy_init();
  char url[512];
  snprintf(url, sizeof url, "%s%s", base_url, path);
  struct curl_slist *hdrs = header ? curl_slist_append(NULL, header) : NULL;
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, it_on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &r->body);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, it_on_body);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &r->headers);
  assert_int_equal(curl_easy_perform(c), CURLE_OK);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
  curl_slist_free_all(hdrs);
  curl_easy_cleanup(c);
}

static void reply_free(reply *r) {
  free(r->body.data);
  free(r->headers.data);
}

/* The value of response header name (case-insensitive) into out; 0 if found. */
static int header_value(const reply *r, const char *name, char *out, size_t len) {
  size_t n = strlen(name);
  for (const char *line = r->headers.data; line && *line;) {
    const char *end = strstr(line, "\r\n");
    if (!end) break;
    if (strncasecmp(line, name, n) == 0 && line[n] == ':') {
      const char *v = line + n + 1;
      while (*v == ' ') v++;
      snprintf(out, len, "%.*s", (int)(end - v), v);
      return 0;
    }
    line = end + 2;
  }
  return -1;
}

static void root_serves_the_page_without_a_token(void **state) {
  (void)state;
  reply r;
  char type[128], csp[512], cache[64];
  request("GET", "/", NULL, &r);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.body.data, "<script src=\"/assets/app.js\""));
  assert_int_equal(header_value(&r, "Content-Type", type, sizeof type), 0);
  assert_string_equal(type, "text/html; charset=utf-8");
  assert_int_equal(header_value(&r, "Content-Security-Policy", csp, sizeof csp), 0);
  assert_non_null(strstr(csp, "default-src 'self'"));
  assert_int_equal(header_value(&r, "Cache-Control", cache, sizeof cache), 0);
  assert_string_equal(cache, "no-cache");
  reply_free(&r);
  request("GET", "/index.html", NULL, &r);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.body.data, "<title>kiln</title>"));
  reply_free(&r);
}

static void assets_have_types_and_an_etag_that_answers_304(void **state) {
  (void)state;
  reply r;
  char type[128], etag[64], header[128];
  request("GET", "/assets/app.js", NULL, &r);
  assert_int_equal(r.status, 200);
  assert_true(r.body.len > 1000);
  assert_int_equal(header_value(&r, "Content-Type", type, sizeof type), 0);
  assert_string_equal(type, "text/javascript; charset=utf-8");
  assert_int_equal(header_value(&r, "ETag", etag, sizeof etag), 0);
  assert_true(etag[0] == '"' && strlen(etag) > 10);
  reply_free(&r);

  snprintf(header, sizeof header, "If-None-Match: %s", etag);
  request("GET", "/assets/app.js", header, &r);
  assert_int_equal(r.status, 304);
  assert_int_equal(r.body.len, 0);
  reply_free(&r);
  request("GET", "/assets/app.js", "If-None-Match: \"stale\"", &r);
  assert_int_equal(r.status, 200);
  reply_free(&r);

  request("GET", "/assets/app.css", NULL, &r);
  assert_int_equal(r.status, 200);
  assert_int_equal(header_value(&r, "Content-Type", type, sizeof type), 0);
  assert_string_equal(type, "text/css; charset=utf-8");
  reply_free(&r);
}

static void examples_are_listed_and_served_as_in_the_repository(void **state) {
  (void)state;
  reply r;
  request("GET", "/assets/examples/index.json", NULL, &r);
  assert_int_equal(r.status, 200);
  json_t *doc = json_loads(r.body.data, 0, NULL);
  assert_non_null(doc);
  json_t *list = json_object_get(doc, "examples");
  int found = 0;
  for (size_t i = 0; i < json_array_size(list); i++)
    found |= strcmp(json_string_value(json_array_get(list, i)), "fmnist-mlp.json") == 0;
  assert_true(found);
  json_decref(doc);
  reply_free(&r);

  request("GET", "/assets/examples/fmnist-mlp.json", NULL, &r);
  assert_int_equal(r.status, 200);
  FILE *f = fopen(EXAMPLES_DIR "/fmnist-mlp.json", "rb");
  assert_non_null(f);
  char file[8192];
  size_t n = fread(file, 1, sizeof file - 1, f);
  fclose(f);
  file[n] = '\0';
  assert_int_equal(r.body.len, n);
  assert_string_equal(r.body.data, file);
  reply_free(&r);
}

static void unknown_assets_and_other_methods_are_refused(void **state) {
  (void)state;
  reply r;
  request("GET", "/assets/missing.js", NULL, &r);
  assert_int_equal(r.status, 404);
  assert_non_null(strstr(r.body.data, "no dashboard file /assets/missing.js"));
  reply_free(&r);
  request("POST", "/", NULL, &r);
  assert_int_equal(r.status, 405);
  reply_free(&r);
  /* The API itself still wants its token. */
  request("GET", "/v1/jobs", NULL, &r);
  assert_int_equal(r.status, 401);
  reply_free(&r);
  char auth[200];
  snprintf(auth, sizeof auth, "Authorization: Bearer %s", admin_token);
  request("GET", "/v1/jobs", auth, &r);
  assert_int_equal(r.status, 200);
  reply_free(&r);
}

static int start_kilnd(void **state) {
  (void)state;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-web-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  return it_launch_kilnd(KILND_PATH, data_dir, "/bin/true", NULL, NULL, &kilnd_pid, base_url,
                         sizeof base_url, admin_token, sizeof admin_token);
}

static int stop_kilnd(void **state) {
  (void)state;
  curl_global_cleanup();
  return it_stop_kilnd(kilnd_pid, data_dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(root_serves_the_page_without_a_token),
      cmocka_unit_test(assets_have_types_and_an_etag_that_answers_304),
      cmocka_unit_test(examples_are_listed_and_served_as_in_the_repository),
      cmocka_unit_test(unknown_assets_and_other_methods_are_refused),
  };
  return cmocka_run_group_tests(tests, start_kilnd, stop_kilnd);
}
