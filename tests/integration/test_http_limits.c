/* test_http_limits.c — kilnd's HTTP layer under abuse, on loopback with
 * raw sockets: clients of :wait that vanish, a slowloris, the per-address
 * connection limit, the cap on a tenant's blocked requests, the token
 * checked before a body is read, a chunked body past the cap, and :wait
 * during SIGTERM. Each loop is bounded in count and time. */
#include <arpa/inet.h>
#include <dirent.h>
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "harness.h"
#include "stand_in_trainer.h"

/* kilnd's defaults (docs/operations.md): --max-connections-per-ip and
 * --max-blocked-per-tenant. */
#define PER_IP_LIMIT       128
#define BLOCKED_PER_TENANT 64

static char data_dir[256], base_url[128], admin_token[128], small_spec[8192];
static pid_t kilnd_pid;
static int port;

/* ---- raw HTTP over loopback ---- */

/* A TCP connection to kilnd from the loopback address `from` (any of
 * 127.0.0.0/8); -1 when it cannot be made. */
static int dial(const char *from) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET};
  inet_pton(AF_INET, from, &a.sin_addr);
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      connect(fd, (struct sockaddr *)&to, sizeof to) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int send_text(int fd, const char *text) {
  size_t len = strlen(text), off = 0;
  while (off < len) {
    ssize_t n = send(fd, text + off, len - off, MSG_NOSIGNAL);
    if (n <= 0) return -1;
    off += (size_t)n;
  }
  return 0;
}

/* Reads one answer within timeout_ms into buf: its HTTP status; 0 when the
 * server closed (or reset) the connection without one; -1 on timeout. */
static int read_answer(int fd, char *buf, size_t len, int timeout_ms) {
  size_t used = 0;
  buf[0] = '\0';
  const int64_t deadline = it_now_ms() + timeout_ms;
  for (;;) {
    char *head_end = strstr(buf, "\r\n\r\n");
    if (head_end) {
      const char *cl = strstr(buf, "Content-Length: ");
      if (!cl) cl = strstr(buf, "content-length: ");
      size_t want = cl ? (size_t)strtoul(cl + 16, NULL, 10) : 0;
      if (used - (size_t)(head_end + 4 - buf) >= want || used + 1 >= len) break;
    }
    int64_t left = deadline - it_now_ms();
    if (left <= 0) return -1;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, (int)left) <= 0) return -1;
    ssize_t n = recv(fd, buf + used, len - 1 - used, 0);
    if (n <= 0) {
      if (used == 0) return 0;
      break;
    }
    used += (size_t)n;
    buf[used] = '\0';
  }
  int status = 0;
  return sscanf(buf, "HTTP/1.%*d %d", &status) == 1 ? status : 0;
}

/* One request on a fresh connection from `from`; its status within timeout_ms. */
static int ask(const char *from, const char *request, char *buf, size_t len, int timeout_ms) {
  int fd = dial(from);
  if (fd < 0) return 0;
  int status = send_text(fd, request) == 0 ? read_answer(fd, buf, len, timeout_ms) : 0;
  close(fd);
  return status;
}

static int healthz_from(const char *from, int timeout_ms) {
  char buf[2048];
  return ask(from, "GET /healthz HTTP/1.1\r\nHost: kiln\r\n\r\n", buf, sizeof buf, timeout_ms);
}

/* Sends a :wait for job as token on a fresh connection from `from`; the fd. */
static int start_wait(const char *from, const char *token, const char *job, const char *timeout) {
  int fd = dial(from);
  if (fd < 0) return -1;
  char req[600];
  snprintf(req, sizeof req,
           "POST /v1/jobs/%s:wait?timeout=%s HTTP/1.1\r\nHost: kiln\r\nAuthorization: Bearer "
           "%s\r\nContent-Length: 0\r\n\r\n",
           job, timeout, token);
  if (send_text(fd, req) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* ---- kilnd's process ---- */

static int thread_count(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* Sockets on kilnd's port in CLOSE-WAIT: the client left, kilnd has not closed. */
static int close_wait_count(void) {
  FILE *f = fopen("/proc/net/tcp", "r");
  if (!f) return -1;
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned local_port = 0, state = 0;
    if (sscanf(line, " %*d: %*8[0-9A-Fa-f]:%x %*8[0-9A-Fa-f]:%*x %x", &local_port, &state) == 2 &&
        (int)local_port == port && state == 0x08)
      n++;
  }
  fclose(f);
  return n;
}

static void make_token(const char *tenant, char *out, size_t len) {
  assert_int_equal(it_make_token(KILND_PATH, data_dir, tenant, out, len), 0);
}

/* A job that runs (or queues behind one that does) until it is cancelled. */
static void create_sleeper(const char *token, const char *name, char *id, size_t idlen) {
  json_t *spec = json_loads(small_spec, 0, NULL);
  assert_non_null(spec);
  json_object_set_new(spec, "display_name", json_string(name));
  char *body = json_dumps(spec, JSON_COMPACT);
  json_decref(spec);
  char *answer = NULL;
  long status = it_request(base_url, token, "POST", "/v1/jobs", body, strlen(body), &answer);
  free(body);
  if (status != 200) {
    char said[512];
    snprintf(said, sizeof said, "%s", answer ? answer : "");
    free(answer);
    fail_msg("create %s: HTTP %ld: %s", name, status, said);
  }
  json_t *doc = json_loads(answer, 0, NULL);
  free(answer);
  snprintf(id, idlen, "%s", json_string_value(json_object_get(doc, "id")));
  json_decref(doc);
}

static int launch(void) {
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-http-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  char trainer[300], pools[300];
  snprintf(trainer, sizeof trainer, "%s/trainer.sh", data_dir);
  FILE *f = fopen(trainer, "w");
  if (!f) return -1;
  fputs(it_stand_in_trainer, f);
  fclose(f);
  chmod(trainer, 0755);
  /* One device: the first sleeper runs, later ones queue; :wait blocks on both. */
  snprintf(pools, sizeof pools, "%s/pools.json", data_dir);
  f = fopen(pools, "w");
  if (!f) return -1;
  fputs("{\"pools\": [{\"name\": \"default\", \"devices\": [0]}]}", f);
  fclose(f);
  if (it_launch_kilnd(KILND_PATH, data_dir, trainer, "--pools", pools, &kilnd_pid, base_url,
                      sizeof base_url, admin_token, sizeof admin_token) != 0)
    return -1;
  port = atoi(strrchr(base_url, ':') + 1);
  return 0;
}

static int setup(void **state) {
  (void)state;
  signal(SIGPIPE, SIG_IGN);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  FILE *ex = fopen(EXAMPLES_DIR "/fmnist-mlp.json", "rb");
  if (!ex) return -1;
  size_t n = fread(small_spec, 1, sizeof small_spec - 1, ex);
  fclose(ex);
  small_spec[n] = '\0';
  return launch();
}

static int teardown(void **state) {
  (void)state;
  it_stop_kilnd(kilnd_pid, data_dir);
  curl_global_cleanup();
  return 0;
}

static void close_all(int *fds, int n) {
  for (int i = 0; i < n; i++) {
    if (fds[i] >= 0) close(fds[i]);
    fds[i] = -1;
  }
}

/* ---- the cases ---- */

#define VANISHING_WAITS 512
#define WAIT_TENANTS    8
#define THREAD_BOUND    64

/* Another tenant's GET answers within 1 s. */
static void another_tenant_is_served(const char *token) {
  char req[400], buf[8192];
  snprintf(req, sizeof req,
           "GET /v1/jobs HTTP/1.1\r\nHost: kiln\r\nAuthorization: Bearer %s\r\n\r\n", token);
  const int64_t t0 = it_now_ms();
  int status = ask("127.0.0.9", req, buf, sizeof buf, 1000);
  if (status != 200)
    fail_msg("another tenant's GET /v1/jobs got %d after %lld ms (0: refused or closed, -1: no "
             "answer in 1 s)",
             status, (long long)(it_now_ms() - t0));
}

static void vanished_wait_clients_hold_no_thread_and_no_socket(void **state) {
  (void)state;
  char other[128];
  make_token("bystander", other, sizeof other);
  static int fds[VANISHING_WAITS];
  for (int i = 0; i < VANISHING_WAITS; i++) fds[i] = -1;
  /* 8 tenants, 64 waits each, each tenant from its own address: within
   * every per-address and per-tenant limit, so each wait is really held. */
  for (int t = 0; t < WAIT_TENANTS; t++) {
    char tenant[32], token[128], job[64], from[32];
    snprintf(tenant, sizeof tenant, "waiter%d", t);
    make_token(tenant, token, sizeof token);
    create_sleeper(token, "sleeper-wait", job, sizeof job);
    snprintf(from, sizeof from, "127.0.0.%d", 20 + t);
    for (int i = 0; i < VANISHING_WAITS / WAIT_TENANTS; i++) {
      int k = t * (VANISHING_WAITS / WAIT_TENANTS) + i;
      fds[k] = start_wait(from, token, job, "600s");
      if (fds[k] < 0) fail_msg("wait %d could not connect", k);
    }
  }
  usleep(500 * 1000); /* kilnd takes them in */
  another_tenant_is_served(other);
  int threads = thread_count(kilnd_pid);
  print_message("with %d waits open: kilnd has %d threads\n", VANISHING_WAITS, threads);
  if (threads > THREAD_BOUND)
    fail_msg("kilnd runs %d threads while %d :wait requests block (bound %d)", threads,
             VANISHING_WAITS, THREAD_BOUND);
  /* Every client vanishes. */
  close_all(fds, VANISHING_WAITS);
  int close_wait = -1;
  const int64_t deadline = it_now_ms() + 3000;
  do {
    usleep(100 * 1000);
    close_wait = close_wait_count();
    threads = thread_count(kilnd_pid);
  } while ((close_wait > 4 || threads > THREAD_BOUND) && it_now_ms() < deadline);
  print_message("after they left: %d sockets in CLOSE-WAIT, %d threads\n", close_wait, threads);
  if (close_wait > 4)
    fail_msg("%d sockets stay in CLOSE-WAIT 3 s after the clients left", close_wait);
  if (threads > THREAD_BOUND) fail_msg("kilnd still runs %d threads", threads);
  another_tenant_is_served(other);
}

/* The slowloris comes from an address of its own, so the cases after it
 * never depend on how soon kilnd notices that its connections left. */
#define SLOWLORIS_FROM "127.0.0.14"

static void slowloris_cannot_keep_healthz_from_answering(void **state) {
  (void)state;
  enum { N = 520, ROUNDS = 12 };
  static int fds[N];
  int connected = 0;
  for (int i = 0; i < N; i++) {
    fds[i] = dial(SLOWLORIS_FROM);
    if (fds[i] >= 0 && send_text(fds[i], "GET /healthz HTTP/1.1\r\nX-Slow: ") == 0) connected++;
  }
  print_message("%d slow connections opened\n", connected);
  /* One header byte per connection every 250 ms; /healthz from another
   * address must answer within 1 s all the while. */
  for (int round = 0; round < ROUNDS; round++) {
    for (int i = 0; i < N; i++) {
      if (fds[i] >= 0 && send(fds[i], "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
        close(fds[i]);
        fds[i] = -1;
      }
    }
    if (round % 2 == 0) {
      const int64_t t0 = it_now_ms();
      int status = healthz_from("127.0.0.2", 1000);
      if (status != 200)
        fail_msg("round %d: /healthz got %d after %lld ms during the slowloris (0: refused or "
                 "closed, -1: no answer in 1 s)",
                 round, status, (long long)(it_now_ms() - t0));
    }
    usleep(250 * 1000);
  }
  close_all(fds, N);
  /* Its places are given back: the address is served again, at the latest
   * when the header timeout (10 s by default) cuts what kilnd has not yet
   * seen leave. */
  const int64_t t0 = it_now_ms();
  int status = 0;
  while ((status = healthz_from(SLOWLORIS_FROM, 1000)) != 200 && it_now_ms() - t0 < 15000)
    usleep(100 * 1000);
  print_message("the slowloris's address is served again %lld ms after it left\n",
                (long long)(it_now_ms() - t0));
  if (status != 200)
    fail_msg("15 s after 520 slow connections left, their address still gets %d for /healthz",
             status);
}

static void
connections_past_the_per_ip_limit_are_refused_while_another_address_works(void **state) {
  (void)state;
  static int fds[PER_IP_LIMIT];
  for (int i = 0; i < PER_IP_LIMIT; i++) {
    fds[i] = dial("127.0.0.3");
    if (fds[i] < 0) fail_msg("connection %d of the per-address limit could not connect", i);
  }
  usleep(300 * 1000); /* kilnd accepts them all */
  int past = healthz_from("127.0.0.3", 1000);
  if (past != 0)
    fail_msg("connection %d from one address got %d; past the limit of %d it is closed unserved",
             PER_IP_LIMIT + 1, past, PER_IP_LIMIT);
  assert_int_equal(healthz_from("127.0.0.4", 1000), 200);
  /* The ones within the limit are served. */
  char buf[2048];
  assert_int_equal(send_text(fds[0], "GET /healthz HTTP/1.1\r\nHost: kiln\r\n\r\n"), 0);
  assert_int_equal(read_answer(fds[0], buf, sizeof buf, 1000), 200);
  close_all(fds, PER_IP_LIMIT);
  usleep(300 * 1000);
}

static void a_tenant_over_its_blocked_request_cap_gets_429(void **state) {
  (void)state;
  char token[128], other[128], job[64], other_job[64];
  make_token("capped", token, sizeof token);
  make_token("uncapped", other, sizeof other);
  create_sleeper(token, "sleeper-cap", job, sizeof job);
  create_sleeper(other, "sleeper-other", other_job, sizeof other_job);
  static int fds[BLOCKED_PER_TENANT];
  for (int i = 0; i < BLOCKED_PER_TENANT; i++) {
    fds[i] = start_wait("127.0.0.5", token, job, "60s");
    if (fds[i] < 0) fail_msg("wait %d could not connect", i);
  }
  usleep(300 * 1000);
  int over = start_wait("127.0.0.5", token, job, "60s");
  assert_true(over >= 0);
  char buf[4096];
  int status = read_answer(over, buf, sizeof buf, 1000);
  close(over);
  if (status != 429)
    fail_msg(":wait number %d of one tenant got %d (-1: no answer in 1 s), not 429",
             BLOCKED_PER_TENANT + 1, status);
  assert_non_null(strstr(buf, "RESOURCE_EXHAUSTED"));
  assert_non_null(strstr(buf, "64 blocking requests"));
  /* Another tenant is not held to the first one's count. */
  int fd = start_wait("127.0.0.6", other, other_job, "1s");
  assert_true(fd >= 0);
  status = read_answer(fd, buf, sizeof buf, 3000);
  close(fd);
  assert_int_equal(status, 200);
  assert_non_null(strstr(buf, "\"done\":false"));
  close_all(fds, BLOCKED_PER_TENANT);
  usleep(300 * 1000);
}

static void a_body_without_a_token_gets_401_before_it_is_sent(void **state) {
  (void)state;
  int fd = dial("127.0.0.7");
  assert_true(fd >= 0);
  /* 1 MiB announced (the default cap), not a byte of it sent. */
  assert_int_equal(send_text(fd, "POST /v1/jobs HTTP/1.1\r\nHost: kiln\r\nContent-Type: "
                                 "application/json\r\nContent-Length: 1048576\r\n\r\n"),
                   0);
  char buf[4096];
  int status = read_answer(fd, buf, sizeof buf, 1000);
  close(fd);
  if (status != 401)
    fail_msg("a request without a token announcing a 1 MiB body got %d (-1: no answer in 1 s "
             "while the body was not sent), not 401",
             status);
  assert_non_null(strstr(buf, "UNAUTHENTICATED"));
}

static void a_chunked_body_past_the_cap_gets_413_and_is_not_read(void **state) {
  (void)state;
  int fd = dial("127.0.0.8");
  assert_true(fd >= 0);
  struct timeval one_second = {1, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &one_second, sizeof one_second);
  char head[400];
  snprintf(head, sizeof head,
           "POST /v1/jobs HTTP/1.1\r\nHost: kiln\r\nAuthorization: Bearer %s\r\nContent-Type: "
           "application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
           admin_token);
  assert_int_equal(send_text(fd, head), 0);
  enum { CHUNK = 64 * 1024, LIMIT = 32 << 20 };
  static char chunk[CHUNK + 16];
  int k = snprintf(chunk, sizeof chunk, "%x\r\n", CHUNK);
  memset(chunk + k, ' ', CHUNK);
  memcpy(chunk + k + CHUNK, "\r\n", 2);
  const size_t chunk_len = (size_t)k + CHUNK + 2;
  size_t sent = 0;
  int stopped = 0;
  char buf[4096] = "";
  int status = -1;
  const int64_t deadline = it_now_ms() + 10000;
  while (sent < LIMIT && it_now_ms() < deadline) {
    ssize_t n = send(fd, chunk, chunk_len, MSG_NOSIGNAL);
    if (n < 0) {
      stopped = 1; /* reset, or nothing read for a second */
      break;
    }
    sent += (size_t)n;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (status < 0 && poll(&p, 1, 0) == 1) status = read_answer(fd, buf, sizeof buf, 1000);
  }
  if (status < 0) status = read_answer(fd, buf, sizeof buf, 1000);
  close(fd);
  print_message("sent %zu bytes; answer %d; server stopped reading: %s\n", sent, status,
                stopped ? "yes" : "no");
  if (status != 413) fail_msg("a chunked body past the 1 MiB cap got %d, not 413", status);
  assert_non_null(strstr(buf, "RESOURCE_EXHAUSTED"));
  if (!stopped) fail_msg("kilnd read %zu bytes of a chunked body past its 1 MiB cap", sent);
  assert_int_equal(healthz_from("127.0.0.8", 1000), 200);
}

static void a_wait_pending_at_sigterm_gets_503(void **state) {
  (void)state;
  char job[64];
  create_sleeper(admin_token, "sleeper-sigterm", job, sizeof job);
  int fd = start_wait("127.0.0.10", admin_token, job, "60s");
  assert_true(fd >= 0);
  usleep(300 * 1000);
  kill(kilnd_pid, SIGTERM);
  char buf[4096];
  int status = read_answer(fd, buf, sizeof buf, 10000);
  close(fd);
  waitpid(kilnd_pid, NULL, 0);
  kilnd_pid = 0;
  if (status != 503)
    fail_msg(":wait pending when kilnd got SIGTERM got %d (0: closed with no answer), not 503",
             status);
  assert_non_null(strstr(buf, "UNAVAILABLE"));
}

static int start_watch(const char *from, const char *token, const char *job) {
  int fd = dial(from);
  if (fd < 0) return -1;
  char req[600];
  snprintf(req, sizeof req,
           "GET /v1/jobs/%s/metrics:watch HTTP/1.1\r\nHost: kiln\r\nAuthorization: Bearer "
           "%s\r\n\r\n",
           job, token);
  if (send_text(fd, req) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static void metric_streams_whose_clients_left_free_their_places(void **state) {
  (void)state;
  char token[128], job[64], buf[2048];
  make_token("watcher", token, sizeof token);
  create_sleeper(token, "sleeper-watch", job, sizeof job);
  int fds[BLOCKED_PER_TENANT];
  for (int i = 0; i < BLOCKED_PER_TENANT; i++) {
    fds[i] = start_watch("127.0.0.13", token, job);
    assert_true(fds[i] >= 0);
    assert_int_equal(read_answer(fds[i], buf, sizeof buf, 2000), 200);
  }
  int over = start_watch("127.0.0.13", token, job);
  assert_int_equal(read_answer(over, buf, sizeof buf, 1000), 429);
  close(over);
  /* Every stream's client leaves while the stream waits for points. */
  close_all(fds, BLOCKED_PER_TENANT);
  int status = 0;
  const int64_t deadline = it_now_ms() + 3000;
  while (it_now_ms() < deadline) {
    usleep(200 * 1000);
    int fd = start_watch("127.0.0.13", token, job);
    status = read_answer(fd, buf, sizeof buf, 1000);
    close(fd);
    if (status == 200 && close_wait_count() <= 4) break;
  }
  if (status != 200)
    fail_msg("a new stream got %d 3 s after %d streams' clients left: their places were not freed",
             status, BLOCKED_PER_TENANT);
  assert_true(close_wait_count() <= 4);
}

static void headers_late_past_header_timeout_are_cut(void **state) {
  (void)state;
  char dir[256], url[128], token[128];
  pid_t pid;
  snprintf(dir, sizeof dir, "/tmp/kiln-http-deadline-XXXXXX");
  assert_non_null(mkdtemp(dir));
  char trainer[300];
  snprintf(trainer, sizeof trainer, "%s/trainer.sh", dir);
  FILE *f = fopen(trainer, "w");
  assert_non_null(f);
  fputs(it_stand_in_trainer, f);
  fclose(f);
  chmod(trainer, 0755);
  assert_int_equal(it_launch_kilnd(KILND_PATH, dir, trainer, "--header-timeout", "1", &pid, url,
                                   sizeof url, token, sizeof token),
                   0);
  const int main_port = port;
  port = atoi(strrchr(url, ':') + 1);
  enum { N = 20 };
  int fds[N];
  for (int i = 0; i < N; i++) {
    fds[i] = dial("127.0.0.11");
    assert_true(fds[i] >= 0);
    assert_int_equal(send_text(fds[i], "GET /healthz HTTP/1.1\r\nX-Slow: "), 0);
  }
  /* A byte each 200 ms from every one: each is cut 1 s (plus a tick) after
   * it opened, however often it sends. */
  const int64_t t0 = it_now_ms();
  int open_left = N;
  while (open_left > 0 && it_now_ms() - t0 < 4000) {
    open_left = 0;
    for (int i = 0; i < N; i++) {
      if (fds[i] < 0) continue;
      char c;
      ssize_t got = recv(fds[i], &c, 1, MSG_DONTWAIT);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK) ||
          send(fds[i], "a", 1, MSG_NOSIGNAL) != 1) {
        close(fds[i]);
        fds[i] = -1;
        continue;
      }
      open_left++;
    }
    assert_int_equal(healthz_from("127.0.0.12", 1000), 200);
    usleep(200 * 1000);
  }
  const int64_t took = it_now_ms() - t0;
  close_all(fds, N);
  port = main_port;
  print_message("every slow connection was cut after %lld ms\n", (long long)took);
  if (open_left > 0) fail_msg("%d connections still open 4 s into their headers", open_left);
  assert_true(took >= 800);
  it_stop_kilnd(pid, dir);
}

static void bad_limit_flags_are_refused_naming_the_flag(void **state) {
  (void)state;
  const char *cases[][2] = {{"--header-timeout", "0"},
                            {"--max-connections-per-ip", "many"},
                            {"--max-blocked-per-tenant", "-1"},
                            {"--max-connections", ""},
                            {"--http-threads", "1000"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char cmd[600], out[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s '%s' --data-dir /nonexistent/kiln", KILND_PATH, cases[i][0],
             cases[i][1]);
    int rc = it_run(out, sizeof out, cmd);
    print_message("%s '%s': exit %d: %s", cases[i][0], cases[i][1], rc, out);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, cases[i][0]));
    assert_non_null(strstr(out, "whole number"));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_body_without_a_token_gets_401_before_it_is_sent),
      cmocka_unit_test(a_chunked_body_past_the_cap_gets_413_and_is_not_read),
      cmocka_unit_test(connections_past_the_per_ip_limit_are_refused_while_another_address_works),
      cmocka_unit_test(a_tenant_over_its_blocked_request_cap_gets_429),
      cmocka_unit_test(slowloris_cannot_keep_healthz_from_answering),
      cmocka_unit_test(vanished_wait_clients_hold_no_thread_and_no_socket),
      cmocka_unit_test(metric_streams_whose_clients_left_free_their_places),
      cmocka_unit_test(headers_late_past_header_timeout_are_cut),
      cmocka_unit_test(bad_limit_flags_are_refused_naming_the_flag),
      /* Last: it stops kilnd. */
      cmocka_unit_test(a_wait_pending_at_sigterm_gets_503),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
