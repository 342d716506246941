/* test_nginx.c — docker/nginx.conf in front of a real kilnd (started with
 * --behind-tls-proxy), both on loopback: the config passes `nginx -t`, and
 * through it over HTTPS a job is created, its metric stream delivers each
 * event while the job runs (not in one lump at its end), :wait answers, a
 * data set upload streams through whole, and plain HTTP is redirected.
 * nginx runs from a copy of the file with this test's ports and paths. */
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "common.h"
#include "harness.h"
#include "stand_in_trainer.h"

static char work[256], data_dir[300], ca_pem[300], conf[300], trainer[300], nginx[300];
static char https_url[128], http_url[128], token[128], spec[8192], kilnd_url[128];
static pid_t kilnd_pid, nginx_pid;
static int usable; /* nginx and openssl are here */

/* A loopback port nothing listens on now. */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  socklen_t len = sizeof a;
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

/* Replaces the one occurrence of from in *text with to; -1 (having said
 * which) when it is not there exactly once: the config changed shape. */
static int replace_once(char **text, const char *from, const char *to) {
  char *at = strstr(*text, from);
  if (!at || strstr(at + 1, from)) {
    fprintf(stderr, "docker/nginx.conf: '%s' is not there exactly once\n", from);
    return -1;
  }
  size_t head = (size_t)(at - *text), from_len = strlen(from), to_len = strlen(to);
  size_t tail = strlen(at + from_len);
  char *out = malloc(head + to_len + tail + 1);
  if (!out) return -1;
  memcpy(out, *text, head);
  memcpy(out + head, to, to_len);
  memcpy(out + head + to_len, at + from_len, tail + 1);
  free(*text);
  *text = out;
  return 0;
}

/* docker/nginx.conf with this test's ports, paths and kilnd. */
static int write_config(int https_port, int http_port, int kilnd_port) {
  char *text = it_read_file(PROJECT_SOURCE_DIR "/docker/nginx.conf");
  if (!text) return -1;
  char to[1024];
  int rc = 0;
#define SUB(from, ...)                                                                             \
  do {                                                                                             \
    snprintf(to, sizeof to, __VA_ARGS__);                                                          \
    rc |= replace_once(&text, from, to);                                                           \
  } while (0)
  SUB("worker_processes auto;", "worker_processes 1;");
  SUB("pid /run/nginx-kiln.pid;", "pid %s/nginx.pid;", work);
  SUB("error_log /var/log/nginx/kiln-error.log warn;", "error_log %s/error.log info;", work);
  SUB("access_log /var/log/nginx/kiln-access.log;",
      "access_log %s/access.log; client_body_temp_path %s/body; proxy_temp_path %s/proxy;", work,
      work, work);
  SUB("server 127.0.0.1:8080;", "server 127.0.0.1:%d;", kilnd_port);
  SUB("listen 80;", "listen 127.0.0.1:%d;", http_port);
  SUB("listen [::]:80;", "%s", "");
  SUB("listen 443 ssl http2;", "listen 127.0.0.1:%d ssl http2;", https_port);
  SUB("listen [::]:443 ssl http2;", "%s", "");
  SUB("ssl_certificate /etc/kiln/tls/server.pem;", "ssl_certificate %s/server.pem;", work);
  SUB("ssl_certificate_key /etc/kiln/tls/server.key;", "ssl_certificate_key %s/server.key;", work);
#undef SUB
  rc |= it_write_file(conf, text, 0600);
  free(text);
  return rc ? -1 : 0;
}

/* nginx's command line: the copy, in the foreground; as root its workers
 * run as root too, to reach the test's private folder. */
static void nginx_command(char *out, size_t len, const char *extra) {
  snprintf(out, len, "exec '%s' -p '%s' -c '%s' -g 'daemon off;%s' %s", nginx, work, conf,
           geteuid() == 0 ? " user root;" : "", extra);
}

static long https_request(const char *method, const char *path, const char *body, char **out) {
  return it_request_tls(https_url, token, ca_pem, 0, method, path, body, 60, out);
}

static int setup(void **state) {
  (void)state;
  signal(SIGPIPE, SIG_IGN);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  char out[4096];
  if (it_run(out, sizeof out, "command -v nginx || ls /usr/sbin/nginx") != 0) {
    print_message("SKIPPED: nginx is not installed (install-deps.sh installs nginx-light)\n");
    return 0;
  }
  snprintf(nginx, sizeof nginx, "%.*s", (int)strcspn(out, "\n"), out);
  if (it_run(out, sizeof out, "command -v openssl") != 0) {
    print_message("SKIPPED: no openssl to make the test certificate with\n");
    return 0;
  }
  snprintf(work, sizeof work, "/tmp/kiln-nginx-XXXXXX");
  if (!mkdtemp(work)) return -1;
  snprintf(data_dir, sizeof data_dir, "%s/data", work);
  snprintf(ca_pem, sizeof ca_pem, "%s/ca.pem", work);
  snprintf(conf, sizeof conf, "%s/nginx.conf", work);
  snprintf(trainer, sizeof trainer, "%s/trainer.sh", work);
  if (it_make_certificates(work) != 0) return -1;
  /* The stand-in trainer for jobs; the real kiln-train checks uploads. */
  size_t len = strlen(it_stand_in_trainer) + 512;
  char *script = malloc(len);
  if (!script) return -1;
  const char *body = strchr(it_stand_in_trainer, '\n') + 1; /* after its #! line */
  snprintf(script, len, "#!/bin/sh\n[ \"$1\" = --check-dataset ] && exec '%s' \"$@\"\n%s",
           KILN_TRAIN_PATH, body);
  int rc = it_write_file(trainer, script, 0755);
  free(script);
  if (rc != 0) return -1;
  char *example = it_read_file(EXAMPLES_DIR "/fmnist-mlp.json");
  if (!example) return -1;
  json_t *doc = json_loads(example, 0, NULL);
  free(example);
  json_object_set_new(doc, "display_name", json_string("steps-slow through nginx"));
  char *text = json_dumps(doc, JSON_COMPACT);
  snprintf(spec, sizeof spec, "%s", text);
  free(text);
  json_decref(doc);
  const char *extra[] = {"--behind-tls-proxy", NULL};
  if (it_launch_kilnd_args(KILND_PATH, data_dir, trainer, extra, &kilnd_pid, kilnd_url,
                           sizeof kilnd_url, token, sizeof token) != 0)
    return -1;
  int https_port = free_port(), http_port = free_port();
  if (write_config(https_port, http_port, atoi(strrchr(kilnd_url, ':') + 1)) != 0) return -1;
  snprintf(https_url, sizeof https_url, "https://127.0.0.1:%d", https_port);
  snprintf(http_url, sizeof http_url, "http://127.0.0.1:%d", http_port);
  char cmd[2048], log[400];
  nginx_command(cmd, sizeof cmd, "-t");
  rc = it_run(out, sizeof out, cmd);
  print_message("$ nginx -t -> %d\n%s", rc, out);
  if (rc != 0) return -1;
  nginx_command(cmd, sizeof cmd, "");
  snprintf(log, sizeof log, "%s/nginx.out", work);
  nginx_pid = it_spawn(cmd, log);
  for (int i = 0; i < 100; i++) {
    if (https_request("GET", "/healthz", NULL, NULL) == 200) {
      usable = 1;
      return 0;
    }
    usleep(100 * 1000);
  }
  char *text_log = it_read_file(log);
  print_message("nginx never answered:\n%s\n", text_log ? text_log : "");
  free(text_log);
  return -1;
}

static int teardown(void **state) {
  (void)state;
  if (nginx_pid > 0) {
    kill(nginx_pid, SIGTERM); /* the shell's exec: nginx itself */
    it_wait_exit(nginx_pid, 10);
  }
  if (kilnd_pid > 0) it_stop_kilnd(kilnd_pid, data_dir);
  if (work[0]) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
    if (system(cmd) != 0) return -1;
  }
  curl_global_cleanup();
  return 0;
}

#define NEED_NGINX()                                                                               \
  do {                                                                                             \
    if (!usable) {                                                                                 \
      print_message("SKIPPED: no nginx or openssl here\n");                                        \
      skip();                                                                                      \
    }                                                                                              \
  } while (0)

/* Creates a job through nginx; its id into id. */
static void create_job(char *id, size_t len) {
  char *body = NULL;
  long status = https_request("POST", "/v1/jobs", spec, &body);
  if (status != 200) fail_msg("POST /v1/jobs through nginx: %ld %s", status, body);
  json_t *job = json_loads(body, 0, NULL);
  free(body);
  snprintf(id, len, "%s", json_string_value(json_object_get(job, "id")));
  json_decref(job);
}

/* A metric stream's events and when each arrived. */
typedef struct stream {
  it_buffer body;
  int64_t start_ms, first_ms, last_ms;
  int events; /* "event: metric" in the body so far */
} stream;

static size_t on_stream(char *data, size_t size, size_t n, void *user) {
  stream *s = user;
  size_t len = it_on_body(data, size, n, &s->body);
  int events = 0;
  for (const char *p = s->body.data; (p = strstr(p, "event: metric\n")); p++) events++;
  if (events > s->events) {
    s->last_ms = it_now_ms() - s->start_ms;
    if (!s->events) s->first_ms = s->last_ms;
    s->events = events;
  }
  return len;
}

static void metric_stream_arrives_as_the_job_runs(void **state) {
  (void)state;
  NEED_NGINX();
  char id[64], url[512], auth[300];
  create_job(id, sizeof id);
  snprintf(url, sizeof url, "%s/v1/jobs/%s/metrics:watch", https_url, id);
  snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
  CURL *c = curl_easy_init();
  struct curl_slist *headers = curl_slist_append(NULL, auth);
  stream s = {.start_ms = it_now_ms()};
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_stream);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
  curl_easy_setopt(c, CURLOPT_CAINFO, ca_pem);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
  CURLcode rc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(c);
  const int64_t ended = it_now_ms() - s.start_ms;
  print_message("metrics:watch through nginx: curl %d, HTTP %ld, %d events, the first at %lld ms, "
                "the last at %lld ms, the stream ended at %lld ms\n",
                rc, status, s.events, (long long)s.first_ms, (long long)s.last_ms,
                (long long)ended);
  assert_int_equal(rc, CURLE_OK);
  assert_int_equal(status, 200);
  assert_int_equal(s.events, 30); /* 20 losses, 10 val_losses */
  assert_non_null(strstr(s.body.data, "event: end\ndata: {\"state\":\"SUCCEEDED\"}"));
  free(s.body.data);
  /* The job takes 2 s (20 steps of 0.1 s): a buffering proxy would hand
   * the events over together at its end. */
  assert_true(s.last_ms - s.first_ms >= 1000);
}

static void wait_answers_through_the_proxy(void **state) {
  (void)state;
  NEED_NGINX();
  char id[64], path[200], *body = NULL;
  create_job(id, sizeof id);
  snprintf(path, sizeof path, "/v1/jobs/%s:wait?timeout=60s", id);
  const int64_t t0 = it_now_ms();
  assert_int_equal(https_request("POST", path, "", &body), 200);
  print_message(":wait through nginx answered after %lld ms\n", (long long)(it_now_ms() - t0));
  json_t *job = json_loads(body, 0, NULL);
  free(body);
  assert_string_equal(json_string_value(json_object_get(job, "state")), "SUCCEEDED");
  assert_true(json_is_true(json_object_get(job, "done")));
  json_decref(job);
}

/* Reads the upload body in small pieces, as a slow client sends it. */
typedef struct upload_src {
  const char *data;
  size_t len, off;
} upload_src;

static size_t read_upload(char *buffer, size_t size, size_t n, void *user) {
  upload_src *u = user;
  size_t want = size * n < 4096 ? size * n : 4096;
  if (want > u->len - u->off) want = u->len - u->off;
  memcpy(buffer, u->data + u->off, want);
  u->off += want;
  return want;
}

static void an_upload_streams_through_whole(void **state) {
  (void)state;
  NEED_NGINX();
  /* 4000 rows of 4 features, the class the largest one's index. */
  const int rows = 4000;
  size_t cap = (size_t)rows * 64 + 64, len = 0;
  char *csv = malloc(cap);
  assert_non_null(csv);
  len += (size_t)snprintf(csv + len, cap - len, "a,b,c,d,label\n");
  for (int i = 0; i < rows; i++) {
    int k = (i * 7) % 4;
    double v[4];
    for (int j = 0; j < 4; j++)
      v[j] = (j == k ? 2.0 : 0.0) + (double)((i * 31 + j * 17) % 100) / 200;
    len += (size_t)snprintf(csv + len, cap - len, "%.3f,%.3f,%.3f,%.3f,%d\n", v[0], v[1], v[2],
                            v[3], k);
  }
  upload_src src = {.data = csv, .len = len};
  char url[512], auth[300];
  snprintf(url, sizeof url, "%s/v1/datasets?format=csv&label_column=label&display_name=proxied",
           https_url);
  snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
  CURL *c = curl_easy_init();
  struct curl_slist *headers = curl_slist_append(NULL, auth);
  headers = curl_slist_append(headers, "Content-Type: application/octet-stream");
  headers = curl_slist_append(headers, "Expect:");
  it_buffer b = {0};
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_POST, 1L);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_READFUNCTION, read_upload);
  curl_easy_setopt(c, CURLOPT_READDATA, &src);
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, it_on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(c, CURLOPT_CAINFO, ca_pem);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
  CURLcode rc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(c);
  print_message("upload of %zu bytes through nginx: curl %d, HTTP %ld, %.300s\n", len, rc, status,
                b.data ? b.data : "");
  assert_int_equal(status, 200);
  json_t *doc = json_loads(b.data, 0, NULL);
  assert_non_null(doc);
  long long examples = json_integer_value(json_object_get(doc, "train_examples")) +
                       json_integer_value(json_object_get(doc, "test_examples"));
  assert_int_equal(examples, rows); /* every row arrived */
  assert_int_equal(json_integer_value(json_object_get(doc, "bytes")), (long long)len);
  char hex[65];
  kc_sha256_hex_of(csv, len, hex);
  assert_string_equal(json_string_value(json_object_get(doc, "sha256")), hex);
  assert_int_equal(json_integer_value(json_object_get(doc, "classes")), 4);
  json_decref(doc);
  free(b.data);
  free(csv);
}

static void plain_http_is_redirected_to_https(void **state) {
  (void)state;
  NEED_NGINX();
  char *body = NULL;
  long status = it_request_as(http_url, NULL, NULL, "GET", "/v1/jobs", NULL, 0, 10, &body);
  free(body);
  assert_int_equal(status, 301);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(metric_stream_arrives_as_the_job_runs),
      cmocka_unit_test(wait_answers_through_the_proxy),
      cmocka_unit_test(an_upload_streams_through_whole),
      cmocka_unit_test(plain_http_is_redirected_to_https),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
