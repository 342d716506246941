/* test_tls.c — kilnd serving HTTPS on loopback with a certificate the test
 * makes with openssl (its own CA): curl and the kiln CLI trust it only
 * with the CA, a plain-HTTP request to the port is closed without an
 * answer and kilnd serves the next one, TLS 1.1 is refused (a TLS 1.2
 * hello of the same shape is answered), a body past the cap is a 413 over
 * TLS, and a non-loopback address without TLS is refused before anything
 * binds. */
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
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
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "harness.h"
#include "stand_in_trainer.h"

static char work[256], data_dir[300], ca_pem[300], cert_pem[300], key_pem[300];
static char https_url[128], admin_token[128], trainer[300], spec[8192], slow_spec[8192];
static pid_t kilnd_pid;
static int port, have_openssl;

#define MAX_BODY 4096

/* ---- HTTPS with libcurl ---- */

/* A request to this suite's kilnd as its admin, over HTTPS verified with
 * cainfo (NULL: the system's store); see it_request_tls. */
static long tls_request(const char *cainfo, const char *method, const char *path, const char *body,
                        long max_tls, char **body_out) {
  return it_request_tls(https_url, admin_token, cainfo, max_tls, method, path, body, 20, body_out);
}

static void assert_healthz_over_tls(void) {
  char *body = NULL;
  long status = tls_request(ca_pem, "GET", "/healthz", NULL, 0, &body);
  if (status != 200) fail_msg("GET /healthz over TLS with the CA: %ld (%s)", status, body);
  assert_non_null(strstr(body, "\"ok\""));
  free(body);
}

/* ---- raw sockets on loopback ---- */

static int dial(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&to, sizeof to) != 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

/* Sends len bytes, then reads until want bytes are in, the server closes
 * (*closed = 1) or timeout_ms pass: the bytes read (at most cap). */
static long exchange(const void *data, size_t len, unsigned char *reply, size_t cap, size_t want,
                     int timeout_ms, int *closed) {
  *closed = 0;
  int fd = dial();
  if (fd < 0) return -1;
  size_t got = 0;
  if (send(fd, data, len, MSG_NOSIGNAL) != (ssize_t)len) {
    close(fd);
    *closed = 1; /* closed under our feet: nothing came back */
    return 0;
  }
  const int64_t deadline = it_now_ms() + timeout_ms;
  while (got < want && got < cap) {
    int64_t left = deadline - it_now_ms();
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (left <= 0 || poll(&p, 1, (int)left) <= 0) break;
    ssize_t n = recv(fd, reply + got, cap - got, 0);
    if (n <= 0) {
      *closed = 1;
      break;
    }
    got += (size_t)n;
  }
  close(fd);
  return (long)got;
}

/* A ClientHello whose highest version is `version` (0x0302: TLS 1.1,
 * 0x0303: TLS 1.2), offering ECDHE with AES-GCM and AES-CBC suites, P-256
 * and the signature algorithms a P-256 certificate needs. Its length. */
static size_t client_hello(uint16_t version, unsigned char *out) {
  static const unsigned char suites[] = {0xc0, 0x2b, 0xc0, 0x2f, 0xc0, 0x09, 0xc0, 0x13,
                                         0xc0, 0x0a, 0xc0, 0x14, 0x00, 0x2f, 0x00, 0x35};
  static const unsigned char extensions[] = {
      0x00, 0x0a, 0x00, 0x04, 0x00, 0x02, 0x00, 0x17,             /* supported_groups: P-256 */
      0x00, 0x0b, 0x00, 0x02, 0x01, 0x00,                         /* ec_point_formats */
      0x00, 0x0d, 0x00, 0x08, 0x00, 0x06, 0x04, 0x03, 0x08, 0x04, /* signature_algorithms */
      0x04, 0x01, 0xff, 0x01, 0x00, 0x01, 0x00};                  /* renegotiation_info */
  unsigned char body[512];
  size_t n = 0;
  body[n++] = (unsigned char)(version >> 8);
  body[n++] = (unsigned char)version;
  for (int i = 0; i < 32; i++) body[n++] = (unsigned char)(i * 7 + 1); /* random */
  body[n++] = 0;                                                       /* no session id */
  body[n++] = 0;
  body[n++] = sizeof suites;
  memcpy(body + n, suites, sizeof suites);
  n += sizeof suites;
  body[n++] = 1; /* compression: null only */
  body[n++] = 0;
  body[n++] = 0;
  body[n++] = sizeof extensions;
  memcpy(body + n, extensions, sizeof extensions);
  n += sizeof extensions;
  size_t len = 0;
  out[len++] = 0x16; /* handshake record, version 1.0 as clients send it */
  out[len++] = 0x03;
  out[len++] = 0x01;
  out[len++] = (unsigned char)((n + 4) >> 8);
  out[len++] = (unsigned char)(n + 4);
  out[len++] = 0x01; /* ClientHello */
  out[len++] = 0;
  out[len++] = (unsigned char)(n >> 8);
  out[len++] = (unsigned char)n;
  memcpy(out + len, body, n);
  return len + n;
}

/* ---- the suite ---- */

static int setup(void **state) {
  (void)state;
  signal(SIGPIPE, SIG_IGN);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  snprintf(work, sizeof work, "/tmp/kiln-tls-XXXXXX");
  if (!mkdtemp(work)) return -1;
  snprintf(data_dir, sizeof data_dir, "%s/data", work);
  snprintf(ca_pem, sizeof ca_pem, "%s/ca.pem", work);
  snprintf(cert_pem, sizeof cert_pem, "%s/server.pem", work);
  snprintf(key_pem, sizeof key_pem, "%s/server.key", work);
  snprintf(trainer, sizeof trainer, "%s/trainer.sh", work);
  if (it_write_file(trainer, it_stand_in_trainer, 0755) != 0) return -1;
  char *example = it_read_file(EXAMPLES_DIR "/fmnist-mlp.json");
  if (!example) return -1;
  snprintf(spec, sizeof spec, "%s", example);
  free(example);
  /* The stand-in trainer's 2 s job (20 steps of 0.1 s). */
  json_t *doc = json_loads(spec, 0, NULL);
  if (!doc) return -1;
  json_object_set_new(doc, "display_name", json_string("steps-slow over TLS"));
  char *slow = json_dumps(doc, JSON_COMPACT);
  json_decref(doc);
  if (!slow) return -1;
  snprintf(slow_spec, sizeof slow_spec, "%s", slow);
  free(slow);
  char out[256];
  have_openssl = it_run(out, sizeof out, "command -v openssl") == 0;
  if (!have_openssl) {
    print_message("SKIPPED: no openssl here to make the test certificates (install-deps.sh "
                  "installs it)\n");
    return 0;
  }
  if (it_make_certificates(work) != 0) return -1;
  const char *extra[] = {"--tls-cert",       cert_pem, "--tls-key", key_pem,
                         "--max-body-bytes", "4096",   NULL};
  char plain_url[128];
  if (it_launch_kilnd_args(KILND_PATH, data_dir, trainer, extra, &kilnd_pid, plain_url,
                           sizeof plain_url, admin_token, sizeof admin_token) != 0) {
    char log[600];
    snprintf(log, sizeof log, "%s/kilnd.log", data_dir);
    char *text = it_read_file(log);
    print_message("kilnd did not start with TLS:\n%s\n", text ? text : "(no log)");
    free(text);
    return -1;
  }
  port = atoi(strrchr(plain_url, ':') + 1);
  snprintf(https_url, sizeof https_url, "https://127.0.0.1:%d", port);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  if (kilnd_pid > 0) it_stop_kilnd(kilnd_pid, data_dir);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
  if (system(cmd) != 0) return -1;
  curl_global_cleanup();
  return 0;
}

#define NEED_OPENSSL()                                                                             \
  do {                                                                                             \
    if (!have_openssl) {                                                                           \
      print_message("SKIPPED: no openssl to make a certificate with\n");                           \
      skip();                                                                                      \
    }                                                                                              \
  } while (0)

static void curl_with_the_ca_serves_healthz_and_creates_a_job(void **state) {
  (void)state;
  NEED_OPENSSL();
  assert_healthz_over_tls();
  char *body = NULL;
  long status = tls_request(ca_pem, "POST", "/v1/jobs", spec, 0, &body);
  if (status != 200 && status != 201) fail_msg("POST /v1/jobs over TLS: %ld (%s)", status, body);
  json_t *job = json_loads(body, 0, NULL);
  assert_non_null(job);
  const char *id = json_string_value(json_object_get(job, "id"));
  assert_non_null(id);
  char path[200];
  snprintf(path, sizeof path, "/v1/jobs/%s", id);
  free(body);
  assert_int_equal(tls_request(ca_pem, "GET", path, NULL, 0, &body), 200);
  assert_non_null(strstr(body, id));
  free(body);
  json_decref(job);
  /* TLS 1.2 alone is served too. */
  status = tls_request(ca_pem, "GET", "/healthz", NULL, CURL_SSLVERSION_MAX_TLSv1_2, &body);
  if (status != 200) fail_msg("GET /healthz with TLS 1.2 at most: %ld (%s)", status, body);
  free(body);
}

/* Collects a stream's body. */
static size_t on_stream(char *data, size_t size, size_t n, void *user) {
  return it_on_body(data, size, n, user);
}

/* :wait and a metric stream park their requests and resume them (MHD's
 * suspend and resume) many times: over TLS too. */
static void wait_and_a_metric_stream_work_over_tls(void **state) {
  (void)state;
  NEED_OPENSSL();
  char *body = NULL, path[300];
  long status = tls_request(ca_pem, "POST", "/v1/jobs", slow_spec, 0, &body);
  if (status != 200) fail_msg("POST /v1/jobs over TLS: %ld (%s)", status, body);
  json_t *job = json_loads(body, 0, NULL);
  free(body);
  char id[64];
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(job, "id")));
  json_decref(job);
  CURL *c = curl_easy_init();
  char url[400], auth[300];
  snprintf(url, sizeof url, "%s/v1/jobs/%s/metrics:watch", https_url, id);
  snprintf(auth, sizeof auth, "Authorization: Bearer %s", admin_token);
  struct curl_slist *headers = curl_slist_append(NULL, auth);
  it_buffer b = {0};
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_stream);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(c, CURLOPT_CAINFO, ca_pem);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
  CURLcode rc = curl_easy_perform(c);
  curl_slist_free_all(headers);
  curl_easy_cleanup(c);
  assert_int_equal(rc, CURLE_OK);
  int events = 0;
  for (const char *p = b.data; p && (p = strstr(p, "event: metric\n")); p++) events++;
  print_message("metrics:watch over TLS: %d metric events, then %s\n", events,
                b.data && strstr(b.data, "event: end") ? strstr(b.data, "event: end") : "nothing");
  assert_int_equal(events, 30); /* 20 losses, 10 val_losses */
  assert_non_null(strstr(b.data, "event: end\ndata: {\"state\":\"SUCCEEDED\"}"));
  free(b.data);
  /* A second job, waited for while it runs. */
  status = tls_request(ca_pem, "POST", "/v1/jobs", slow_spec, 0, &body);
  assert_int_equal(status, 200);
  job = json_loads(body, 0, NULL);
  free(body);
  snprintf(path, sizeof path, "/v1/jobs/%s:wait?timeout=30s",
           json_string_value(json_object_get(job, "id")));
  json_decref(job);
  status = tls_request(ca_pem, "POST", path, "", 0, &body);
  if (status != 200) fail_msg(":wait over TLS: %ld (%s)", status, body);
  assert_non_null(strstr(body, "\"state\":\"SUCCEEDED\""));
  free(body);
}

static void curl_without_the_ca_fails_verification(void **state) {
  (void)state;
  NEED_OPENSSL();
  char *body = NULL;
  long status = tls_request(NULL, "GET", "/healthz", NULL, 0, &body);
  print_message("without the CA: %ld %s\n", status, body);
  assert_int_equal(status, -(long)CURLE_PEER_FAILED_VERIFICATION);
  free(body);
}

static void kiln_cli_trusts_the_server_only_with_cacert(void **state) {
  (void)state;
  NEED_OPENSSL();
  char cmd[1400], out[4096];
  snprintf(cmd, sizeof cmd, "KILN_CACERT= KILN_TOKEN=%s '%s' --server %s --cacert '%s' ls",
           admin_token, KILN_CLI_PATH, https_url, ca_pem);
  int rc = it_run(out, sizeof out, cmd);
  print_message("$ kiln --cacert CA ls -> %d\n%s", rc, out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "fmnist"));
  snprintf(cmd, sizeof cmd, "KILN_CACERT='%s' KILN_TOKEN=%s '%s' --server %s ls", ca_pem,
           admin_token, KILN_CLI_PATH, https_url);
  rc = it_run(out, sizeof out, cmd);
  print_message("$ KILN_CACERT=CA kiln ls -> %d\n", rc);
  assert_int_equal(rc, 0);
  snprintf(cmd, sizeof cmd, "KILN_CACERT= KILN_TOKEN=%s '%s' --server %s ls", admin_token,
           KILN_CLI_PATH, https_url);
  rc = it_run(out, sizeof out, cmd);
  print_message("$ kiln ls (no CA) -> %d\n%s", rc, out);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, "TLS certificate could not be verified"));
  assert_non_null(strstr(out, "--cacert"));
  /* submit --wait follows the job's stream on a second connection, which
   * trusts the same CA. */
  char spec_file[400];
  snprintf(spec_file, sizeof spec_file, "%s/slow.json", work);
  assert_int_equal(it_write_file(spec_file, slow_spec, 0600), 0);
  snprintf(cmd, sizeof cmd,
           "KILN_CACERT= KILN_TOKEN=%s '%s' --server %s --cacert '%s' submit '%s' --wait "
           "--timeout 60s --require 'loss<=80'",
           admin_token, KILN_CLI_PATH, https_url, ca_pem, spec_file);
  rc = it_run(out, sizeof out, cmd);
  print_message("$ kiln --cacert CA submit --wait -> %d\n%s", rc, out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "step 20/20")); /* the plan, read on that connection */
}

static void plain_http_to_the_tls_port_is_closed_and_kilnd_serves_on(void **state) {
  (void)state;
  NEED_OPENSSL();
  static const char request[] = "GET /healthz HTTP/1.1\r\nHost: kiln\r\n\r\n";
  unsigned char reply[4096];
  const int64_t t0 = it_now_ms();
  int closed = 0;
  long got = exchange(request, sizeof request - 1, reply, sizeof reply - 1, sizeof reply - 1, 5000,
                      &closed);
  print_message("plain HTTP: %ld bytes back, closed: %d after %lld ms\n", got, closed,
                (long long)(it_now_ms() - t0));
  assert_true(closed); /* not left hanging */
  assert_true(got >= 0);
  reply[got] = '\0';
  assert_null(strstr((char *)reply, "HTTP/"));
  assert_healthz_over_tls();
}

static void tls_1_1_is_refused_and_tls_1_2_answered(void **state) {
  (void)state;
  NEED_OPENSSL();
  unsigned char hello[600], reply[8192];
  /* The control: the same hello at TLS 1.2 gets a ServerHello of 1.2. */
  size_t len = client_hello(0x0303, hello);
  int closed = 0;
  long got = exchange(hello, len, reply, sizeof reply, 11, 3000, &closed);
  print_message("TLS 1.2 hello: %ld bytes, record type 0x%02x, version %02x%02x\n", got,
                got > 0 ? reply[0] : 0, got > 10 ? reply[9] : 0, got > 10 ? reply[10] : 0);
  assert_true(got >= 11);
  assert_int_equal(reply[0], 0x16); /* handshake */
  assert_int_equal(reply[5], 0x02); /* ServerHello */
  assert_int_equal(reply[9], 0x03);
  assert_int_equal(reply[10], 0x03);
  len = client_hello(0x0302, hello);
  memset(reply, 0, sizeof reply);
  got = exchange(hello, len, reply, sizeof reply, sizeof reply, 3000, &closed);
  print_message("TLS 1.1 hello: %ld bytes, closed: %d, bytes %02x %02x %02x %02x %02x %02x %02x\n",
                got, closed, reply[0], reply[1], reply[2], reply[3], reply[4], reply[5], reply[6]);
  assert_true(closed); /* an answer and a close, not a handshake going on */
  /* Nothing but an alert (21), if anything: never a ServerHello. */
  if (got > 0) {
    assert_int_equal(reply[0], 0x15);
    assert_int_equal(reply[5], 2);                 /* fatal */
    assert_true(reply[6] == 70 || reply[6] == 40); /* protocol_version, handshake */
  }
  assert_healthz_over_tls();
}

/* A chunked body past --max-body-bytes: the 413 reaches the client inside
 * TLS (written on the session, not the socket). */
static size_t endless_body(char *buffer, size_t size, size_t nitems, void *user) {
  size_t *left = user, n = size * nitems < *left ? size * nitems : *left;
  memset(buffer, ' ', n);
  *left -= n;
  return n;
}

static void a_body_past_the_cap_is_a_413_over_tls(void **state) {
  (void)state;
  NEED_OPENSSL();
  CURL *c = curl_easy_init();
  char url[256], auth[300];
  snprintf(url, sizeof url, "%s/v1/jobs", https_url);
  snprintf(auth, sizeof auth, "Authorization: Bearer %s", admin_token);
  struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
  headers = curl_slist_append(headers, "Transfer-Encoding: chunked");
  headers = curl_slist_append(headers, "Expect:");
  headers = curl_slist_append(headers, auth);
  size_t left = 4 * MAX_BODY;
  it_buffer b = {0};
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_POST, 1L);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_READFUNCTION, endless_body);
  curl_easy_setopt(c, CURLOPT_READDATA, &left);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, it_on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(c, CURLOPT_CAINFO, ca_pem);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 20L);
  CURLcode rc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  print_message("chunked body past the cap: curl %d, HTTP %ld, %s\n", rc, status,
                b.data ? b.data : "");
  assert_int_equal(status, 413);
  assert_non_null(b.data);
  assert_non_null(strstr(b.data, "RESOURCE_EXHAUSTED"));
  free(b.data);
  curl_slist_free_all(headers);
  curl_easy_cleanup(c);
  assert_healthz_over_tls();
}

/* kilnd with the arguments after its path; its exit status and output. */
static int kilnd_run(char *out, size_t outlen, const char *args) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' --data-dir '%s/refused' --trainer '%s' %s", KILND_PATH, work,
           trainer, args);
  int rc = it_run(out, outlen, cmd);
  print_message("$ kilnd %s -> %d\n%s", args, rc, out);
  return rc;
}

static void plain_http_on_a_non_loopback_address_is_refused_before_binding(void **state) {
  (void)state;
  char out[2048], dir[400];
  struct stat sb;
  assert_int_equal(kilnd_run(out, sizeof out, "--listen 0.0.0.0:0"), 2);
  assert_non_null(strstr(out, "not a loopback address"));
  assert_non_null(strstr(out, "--behind-tls-proxy"));
  assert_non_null(strstr(out, "--tls-cert"));
  assert_int_equal(kilnd_run(out, sizeof out, "--listen [::]:0"), 2);
  assert_non_null(strstr(out, "--behind-tls-proxy"));
  /* Refused before anything: not even the data directory is made. */
  snprintf(dir, sizeof dir, "%s/refused", work);
  assert_int_not_equal(stat(dir, &sb), 0);
  /* --behind-tls-proxy lets the address through: kilnd goes on to its next
   * check (a trainer that is not there), so nothing binds in this test. */
  char args[600];
  snprintf(args, sizeof args, "--listen 0.0.0.0:0 --behind-tls-proxy --trainer '%s/none'", work);
  assert_int_equal(kilnd_run(out, sizeof out, args), 1);
  assert_null(strstr(out, "loopback"));
  assert_non_null(strstr(out, "is not an executable file"));
  /* Loopback needs neither. */
  assert_int_equal(kilnd_run(out, sizeof out, "--listen 127.0.0.1:0 --trainer /nonexistent"), 1);
  assert_null(strstr(out, "loopback"));
}

static void a_key_every_user_may_read_is_refused(void **state) {
  (void)state;
  NEED_OPENSSL();
  char out[2048], args[1200], open_key[400], cmd[1400];
  snprintf(open_key, sizeof open_key, "%s/open.key", work);
  snprintf(cmd, sizeof cmd, "cp '%s' '%s' && chmod 644 '%s'", key_pem, open_key, open_key);
  assert_int_equal(system(cmd), 0);
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --tls-cert '%s' --tls-key '%s'", cert_pem,
           open_key);
  assert_int_equal(kilnd_run(out, sizeof out, args), 2);
  assert_non_null(strstr(out, "--tls-key"));
  assert_non_null(strstr(out, "mode 0644"));
  assert_non_null(strstr(out, "chmod 600"));
  /* A key that is not the certificate's is named too. */
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --tls-cert '%s' --tls-key '%s'", ca_pem,
           key_pem);
  assert_int_equal(kilnd_run(out, sizeof out, args), 2);
  assert_non_null(strstr(out, "do not match"));
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --tls-cert '%s'", cert_pem);
  assert_int_equal(kilnd_run(out, sizeof out, args), 2);
  assert_non_null(strstr(out, "go together"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(curl_with_the_ca_serves_healthz_and_creates_a_job),
      cmocka_unit_test(wait_and_a_metric_stream_work_over_tls),
      cmocka_unit_test(curl_without_the_ca_fails_verification),
      cmocka_unit_test(kiln_cli_trusts_the_server_only_with_cacert),
      cmocka_unit_test(plain_http_to_the_tls_port_is_closed_and_kilnd_serves_on),
      cmocka_unit_test(tls_1_1_is_refused_and_tls_1_2_answered),
      cmocka_unit_test(a_body_past_the_cap_is_a_413_over_tls),
      cmocka_unit_test(plain_http_on_a_non_loopback_address_is_refused_before_binding),
      cmocka_unit_test(a_key_every_user_may_read_is_refused),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
