/* http.c — libmicrohttpd glue: binds the daemon (an epoll event loop on a
 * few threads), finds each request's route and checks its token as soon as
 * its headers are in (a 401, 404 or 405 is answered before a byte of body
 * is read), collects the body under a size cap (past it: 413; a chunked
 * body is dropped to its end, up to KILN_BODY_DROP_FACTOR times the cap,
 * before it), runs the handler and sends its answer. A handler that
 * must wait (:wait, a metric stream with nothing new) parks its request
 * with the waker (waker.c) instead of holding a thread.
 * Data set uploads (POST /v1/datasets) are the exception: their bodies go
 * to disk through datasets.c, under a cap of their own. With a certificate
 * (tls.c) the same daemon serves HTTPS only.
 *
 * Threads: MHD's event-loop threads call on_request, the stream readers
 * and the notifications; a request's state is its own `request_ctx`, a
 * stream's its `stream_holder`; shared state is reached only through the
 * config (the store, the cache and the waker lock themselves). The
 * counters are atomics. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "routes.h"
#include "server.h"

/* Upper bounds (seconds) of the latency histogram; +Inf is implied. */
static const double latency_bounds[HTTP_LATENCY_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                            0.025,  0.05,  0.1,    0.5,   2.5};

struct http_counters {
  atomic_uint_fast64_t by_status[600]; /* requests answered, by HTTP status */
  atomic_uint_fast64_t latency[HTTP_LATENCY_BUCKETS + 1];
  atomic_uint_fast64_t latency_us_sum;
  atomic_int stopping; /* set before the daemon stops: parked requests answer */
};

int http_stopping(const http_config *cfg) {
  return cfg->counters && atomic_load(&cfg->counters->stopping);
}

struct http_server {
  http_config cfg;
  struct MHD_Daemon *daemon;
  int port;
  http_counters counters;
};

typedef struct request_ctx {
  http_request req;     /* kept from the headers to the answer, parked or not */
  http_handler handler; /* the route's; NULL: early is the answer */
  http_response early;  /* answered without the handler (401, 404, 405, 429) */
  char *body;
  size_t len, cap;
  struct timespec started;
  http_upload *upload;    /* POST /v1/datasets: streamed to disk, not to body */
  http_ckpt_upload *ckpt; /* PUT /v1/allocations/{alloc}/checkpoints/{step}: the same */
  int answered;           /* a response was queued before the body was read */
  size_t dropped;         /* past the cap: the body's bytes read and dropped (413 at its end) */
  http_parked parked;     /* while the handler waits */
} request_ctx;

/* A stream's reader state; parks its connection when it has nothing new. */
typedef struct stream_holder {
  http_stream_fn fn;
  void *ctx;
  void (*free_fn)(void *ctx);
  http_server *srv;
  struct MHD_Connection *connection;
  http_parked parked;
} stream_holder;

void http_counters_record(http_counters *c, int status, double seconds) {
  if (!c) return;
  if (status >= 100 && status < 600) atomic_fetch_add(&c->by_status[status], 1);
  int b = 0;
  while (b < HTTP_LATENCY_BUCKETS && seconds > latency_bounds[b]) b++;
  atomic_fetch_add(&c->latency[b], 1);
  atomic_fetch_add(&c->latency_us_sum, (uint64_t)(seconds * 1e6));
}

char *http_counters_prometheus(http_counters *c) {
  size_t cap = 8192, used = 0;
  char *out = malloc(cap);
  if (!out) return NULL;
#define EMIT(...)                                                                                  \
  do {                                                                                             \
    int n_ = snprintf(out + used, cap - used, __VA_ARGS__);                                        \
    if (n_ > 0 && (size_t)n_ < cap - used) used += (size_t)n_;                                     \
  } while (0)
  EMIT("# HELP kiln_http_requests_total HTTP requests answered, by status code.\n"
       "# TYPE kiln_http_requests_total counter\n");
  for (int code = 100; code < 600; code++) {
    uint64_t n = atomic_load(&c->by_status[code]);
    if (n) EMIT("kiln_http_requests_total{code=\"%d\"} %llu\n", code, (unsigned long long)n);
  }
  EMIT("# HELP kiln_http_request_duration_seconds Time from request to response.\n"
       "# TYPE kiln_http_request_duration_seconds histogram\n");
  uint64_t cumulative = 0;
  for (int b = 0; b <= HTTP_LATENCY_BUCKETS; b++) {
    cumulative += atomic_load(&c->latency[b]);
    if (b < HTTP_LATENCY_BUCKETS)
      EMIT("kiln_http_request_duration_seconds_bucket{le=\"%g\"} %llu\n", latency_bounds[b],
           (unsigned long long)cumulative);
    else
      EMIT("kiln_http_request_duration_seconds_bucket{le=\"+Inf\"} %llu\n",
           (unsigned long long)cumulative);
  }
  EMIT("kiln_http_request_duration_seconds_sum %.6f\n",
       (double)atomic_load(&c->latency_us_sum) / 1e6);
  EMIT("kiln_http_request_duration_seconds_count %llu\n", (unsigned long long)cumulative);
#undef EMIT
  return out;
}

static double seconds_since(const struct timespec *t0) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) / 1e9;
}

const char *http_header(const http_request *req, const char *key) {
  return MHD_lookup_connection_value(req->connection, MHD_HEADER_KIND, key);
}

static int connection_fd(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *info =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  return info ? info->connect_fd : -1;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  stream_holder *h = cls;
  if (h->parked.gone) return (ssize_t)MHD_CONTENT_READER_END_WITH_ERROR; /* the client left */
  const uint64_t generation = store_generation(h->srv->cfg.st);
  long n = h->fn(h->ctx, pos, buf, max);
  if (n > 0) return (ssize_t)n;
  if (n < 0 || http_stopping(&h->srv->cfg)) return (ssize_t)MHD_CONTENT_READER_END_OF_STREAM;
  /* Nothing new: park until the store changes (or a while passes). */
  MHD_suspend_connection(h->connection);
  http_waker_park(h->srv->cfg.waker, &h->parked, h->connection, connection_fd(h->connection),
                  generation, http_monotonic_ms() + HTTP_STREAM_RECHECK_MS);
  return 0;
}

static void stream_release(void *cls) {
  stream_holder *h = cls;
  if (h->free_fn) h->free_fn(h->ctx);
  free(h);
}

const char *http_query(const http_request *req, const char *key) {
  return MHD_lookup_connection_value(req->connection, MHD_GET_ARGUMENT_KIND, key);
}

static enum MHD_Result send_response(http_server *srv, struct MHD_Connection *c,
                                     http_response *res) {
  struct MHD_Response *r = NULL;
  if (res->stream) {
    stream_holder *h = calloc(1, sizeof *h);
    if (h) {
      *h = (stream_holder){.fn = res->stream,
                           .ctx = res->stream_ctx,
                           .free_fn = res->stream_free,
                           .srv = srv,
                           .connection = c};
      r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, h,
                                            stream_release);
      if (!r) stream_release(h);
    } else if (res->stream_free) {
      res->stream_free(res->stream_ctx);
    }
    free(res->body);
  } else if (res->static_body) {
    r = MHD_create_response_from_buffer(res->static_len, (void *)res->static_body,
                                        MHD_RESPMEM_PERSISTENT);
    free(res->body);
  } else if (res->fd > 0) {
    r = MHD_create_response_from_fd64(res->fd_size, res->fd); /* MHD closes it */
    if (!r) close(res->fd);
    free(res->body);
  } else {
    const char *body = res->body ? res->body : "";
    r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    free(res->body);
  }
  res->body = NULL;
  if (!r) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                          res->content_type ? res->content_type : "application/json");
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL,
                          res->cache_control ? res->cache_control : "no-store");
  MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
  if (res->etag) MHD_add_response_header(r, MHD_HTTP_HEADER_ETAG, res->etag);
  if (res->csp) MHD_add_response_header(r, "Content-Security-Policy", res->csp);
  for (int i = 0; i < 2; i++)
    if (res->header_names[i])
      MHD_add_response_header(r, res->header_names[i], res->header_values[i]);
  enum MHD_Result ok = MHD_queue_response(c, (unsigned)res->status, r);
  MHD_destroy_response(r);
  return ok;
}

/* The error model's 413 for a body past limit bytes. */
static void too_large(http_response *res, size_t limit) {
  http_reply_status(res, 413, "RESOURCE_EXHAUSTED", "body",
                    "request body is larger than the %zu-byte limit", limit);
}

/* A chunked body found past the cap while it streams in is read on to its
 * end and dropped, up to this many times the cap, and then answered 413:
 * closed with the client's bytes unread, the connection would be reset,
 * and a reset can destroy the 413 before the client reads it (so can a
 * TLS one). Past that, answer_and_close. */
#define KILN_BODY_DROP_FACTOR 4

/* Sends res (JSON, small) straight to the socket and has the connection
 * closed: the answer to a body found too large while it streams in, when
 * MHD can no longer queue a response before the body ends. The rest of
 * the body is never read. */
static enum MHD_Result answer_and_close(http_server *srv, request_ctx *ctx,
                                        struct MHD_Connection *c, http_response *res) {
  char head[512];
  const char *body = res->body ? res->body : "";
  const size_t len = strlen(body);
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Type: application/json\r\n"
                   "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
                   "Content-Length: %zu\r\n\r\n",
                   res->status, MHD_get_reason_phrase_for((unsigned)res->status), len);
  if (srv->cfg.tls_cert_pem) {
    /* HTTPS: the answer goes out as a TLS record on the connection's session. */
    char whole[1536];
    if (n > 0 && (size_t)n + len < sizeof whole) {
      memcpy(whole, head, (size_t)n);
      memcpy(whole + n, body, len);
      (void)http_tls_send(c, whole, (size_t)n + len);
    }
  } else {
    const int fd = connection_fd(c);
    if (fd >= 0 && n > 0 && (size_t)n < sizeof head &&
        send(fd, head, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) == n)
      (void)!send(fd, body, len, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  http_counters_record(&srv->counters, res->status, seconds_since(&ctx->started));
  free(res->body);
  res->body = NULL;
  ctx->answered = 1;
  return MHD_NO;
}

static int has_body(struct MHD_Connection *c) {
  const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
  return (cl && strtoull(cl, NULL, 10) > 0) ||
         MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding") != NULL;
}

static http_conn *conn_record(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *info =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return info ? info->socket_context : NULL;
}

/* Queues an answer (the request's first call, or once its body is in). */
static enum MHD_Result answer(http_server *srv, request_ctx *ctx, struct MHD_Connection *c,
                              http_response *res) {
  http_counters_record(&srv->counters, res->status, seconds_since(&ctx->started));
  ctx->answered = 1;
  return send_response(srv, c, res);
}

/* The request's headers are in: route it, check its token and its body's
 * declared size before a byte of the body is read. */
static enum MHD_Result on_headers(http_server *srv, struct MHD_Connection *c, const char *url,
                                  const char *method, void **con_cls) {
  request_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return MHD_NO;
  clock_gettime(CLOCK_MONOTONIC, &ctx->started);
  *con_cls = ctx;
  http_waker_conn_headers(srv->cfg.waker, conn_record(c), 1);
  ctx->req = (http_request){.method = method,
                            .path = url,
                            .body = "",
                            .connection = c,
                            .arrived_ms = http_monotonic_ms()};
  ctx->early.status = 500;
  ctx->handler = http_route_request(&srv->cfg, &ctx->req, &ctx->early);
  if (!ctx->handler) {
    /* A body is never read for an error; one without a body is answered
     * with the others, keeping the connection. */
    return has_body(c) ? answer(srv, ctx, c, &ctx->early) : MHD_YES;
  }
  if (ctx->handler == http_create_dataset) {
    http_response res = {.status = 500};
    if (http_upload_begin(&srv->cfg, &ctx->req.who, c, &ctx->upload, &res) == 0) return MHD_YES;
    return answer(srv, ctx, c, &res);
  }
  if (ctx->handler == http_put_allocation_checkpoint) {
    http_response res = {.status = 500};
    if (http_ckpt_upload_begin(&srv->cfg, &ctx->req, &ctx->ckpt, &res) == 0) return MHD_YES;
    return answer(srv, ctx, c, &res);
  }
  const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
  if (cl && strtoull(cl, NULL, 10) > srv->cfg.max_body_bytes) {
    http_response res = {.status = 500};
    too_large(&res, srv->cfg.max_body_bytes);
    return answer(srv, ctx, c, &res);
  }
  return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
  (void)version;
  http_server *srv = cls;
  request_ctx *ctx = *con_cls;
  if (!ctx) return on_headers(srv, c, url, method, con_cls);
  if (ctx->answered) {
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (ctx->upload) {
    if (*upload_data_size > 0) {
      int rc = http_upload_write(&srv->cfg, ctx->upload, upload_data, *upload_data_size);
      *upload_data_size = 0;
      if (rc == 0) return MHD_YES;
    }
    http_response res = {.status = 500};
    http_upload_finish(&srv->cfg, ctx->upload, &res);
    if (res.status == 413) return answer_and_close(srv, ctx, c, &res);
    return answer(srv, ctx, c, &res);
  }
  if (ctx->ckpt) {
    if (*upload_data_size > 0) {
      int rc = http_ckpt_upload_write(&srv->cfg, ctx->ckpt, upload_data, *upload_data_size);
      *upload_data_size = 0;
      if (rc == 0) return MHD_YES;
    }
    http_response res = {.status = 500};
    http_ckpt_upload_finish(&srv->cfg, ctx->ckpt, &res);
    if (res.status == 413) return answer_and_close(srv, ctx, c, &res);
    return answer(srv, ctx, c, &res);
  }
  if (ctx->dropped) { /* chunked, past the cap: dropped to its end, then the 413 */
    const size_t n = *upload_data_size;
    *upload_data_size = 0;
    ctx->dropped += n;
    if (n > 0 && ctx->dropped <= KILN_BODY_DROP_FACTOR * srv->cfg.max_body_bytes) return MHD_YES;
    http_response res = {.status = 500};
    too_large(&res, srv->cfg.max_body_bytes);
    return n > 0 ? answer_and_close(srv, ctx, c, &res) : answer(srv, ctx, c, &res);
  }
  if (*upload_data_size > 0) {
    size_t n = *upload_data_size;
    *upload_data_size = 0;
    if (ctx->len + n > srv->cfg.max_body_bytes) { /* chunked, past the cap */
      free(ctx->body);
      ctx->body = NULL;
      ctx->len = ctx->cap = 0;
      ctx->dropped = n;
      return MHD_YES;
    }
    if (ctx->len + n + 1 > ctx->cap) {
      size_t cap = ctx->cap ? ctx->cap : 4096;
      while (cap < ctx->len + n + 1) cap *= 2;
      char *body = realloc(ctx->body, cap);
      if (!body) return MHD_NO;
      ctx->body = body;
      ctx->cap = cap;
    }
    memcpy(ctx->body + ctx->len, upload_data, n);
    ctx->len += n;
    ctx->body[ctx->len] = '\0';
    return MHD_YES;
  }
  if (!ctx->handler) return answer(srv, ctx, c, &ctx->early);
  if (ctx->parked.gone) return MHD_NO; /* woken because the client left: close */
  ctx->req.body = ctx->body ? ctx->body : "";
  ctx->req.body_len = ctx->len;
  http_response res = {.status = 500};
  const uint64_t generation = store_generation(srv->cfg.st);
  ctx->handler(&srv->cfg, &ctx->req, &res);
  if (res.park) {
    free(res.body);
    MHD_suspend_connection(c);
    http_waker_park(srv->cfg.waker, &ctx->parked, c, connection_fd(c), generation,
                    res.park_until_ms);
    return MHD_YES;
  }
  return answer(srv, ctx, c, &res);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  (void)toe;
  http_server *srv = cls;
  request_ctx *ctx = *con_cls;
  /* Keep-alive: the next request's headers are due within the deadline. */
  http_waker_conn_headers(srv->cfg.waker, conn_record(c), 0);
  if (ctx) {
    if (ctx->req.admitted) {
      char key[64];
      http_block_key(&ctx->req, key);
      http_waker_release(srv->cfg.waker, key);
    }
    http_upload_free(ctx->upload);
    http_ckpt_upload_free(ctx->ckpt);
    free(ctx->early.body);
    free(ctx->body);
    free(ctx);
    *con_cls = NULL;
  }
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
  http_server *srv = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    *socket_context = http_waker_conn_open(srv->cfg.waker, connection_fd(c));
  } else {
    http_waker_conn_close(srv->cfg.waker, *socket_context);
    *socket_context = NULL;
  }
}

/* Room for max_connections sockets, plus the store's and the trainers'. */
static void raise_fd_limit(unsigned max_connections) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  rlim_t want = (rlim_t)max_connections + 256;
  if (rl.rlim_cur >= want) return;
  rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
}

int http_server_start(const http_config *cfg, http_server **out, char *err, size_t errlen) {
  *out = NULL;
  struct sockaddr_storage addr;
  memset(&addr, 0, sizeof addr);
  unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
  struct sockaddr_in *v4 = (struct sockaddr_in *)&addr;
  struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&addr;
  if (inet_pton(AF_INET, cfg->host, &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons((uint16_t)cfg->port);
  } else if (inet_pton(AF_INET6, cfg->host, &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons((uint16_t)cfg->port);
    flags |= MHD_USE_IPv6;
  } else {
    snprintf(err, errlen, "listen address '%s' is not a numeric IPv4 or IPv6 address", cfg->host);
    return -1;
  }
  http_server *srv = calloc(1, sizeof *srv);
  if (!srv) {
    snprintf(err, errlen, "http: out of memory");
    return -1;
  }
  srv->cfg = *cfg;
  http_config *c = &srv->cfg;
  if (!c->max_connections) c->max_connections = HTTP_DEFAULT_MAX_CONNECTIONS;
  if (!c->max_connections_per_ip) c->max_connections_per_ip = HTTP_DEFAULT_MAX_CONNECTIONS_PER_IP;
  if (!c->header_timeout_s) c->header_timeout_s = HTTP_DEFAULT_HEADER_TIMEOUT_S;
  if (!c->max_blocked_per_tenant) c->max_blocked_per_tenant = HTTP_DEFAULT_MAX_BLOCKED_PER_TENANT;
  if (!c->threads) c->threads = HTTP_DEFAULT_THREADS;
  c->counters = &srv->counters;
  c->waker = http_waker_new(c->st, c->header_timeout_s, c->max_blocked_per_tenant, err, errlen);
  if (!c->waker) {
    free(srv);
    return -1;
  }
  c->cache = http_cache_new();
  raise_fd_limit(c->max_connections);
  /* HTTPS when a certificate is given; else the list ends before it. */
  struct MHD_OptionItem tls_options[] = {
      {MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)c->tls_cert_pem},
      {MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)c->tls_key_pem},
      {MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)http_tls_priorities},
      {MHD_OPTION_END, 0, NULL}};
  if (c->tls_cert_pem)
    flags |= MHD_USE_TLS;
  else
    tls_options[0].option = MHD_OPTION_END;
  srv->daemon = MHD_start_daemon(
      flags, (uint16_t)cfg->port, NULL, NULL, on_request, srv, MHD_OPTION_SOCK_ADDR,
      (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
      MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv, MHD_OPTION_THREAD_POOL_SIZE, c->threads,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60, MHD_OPTION_CONNECTION_LIMIT, c->max_connections,
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, c->max_connections_per_ip, MHD_OPTION_ARRAY, tls_options,
      MHD_OPTION_END);
  if (!srv->daemon) {
    snprintf(err, errlen, "cannot listen on %s:%d (address in use, or not allowed?%s)", cfg->host,
             cfg->port, c->tls_cert_pem ? " or TLS could not start with this certificate" : "");
    http_waker_free(c->waker);
    http_cache_free(c->cache);
    free(srv);
    return -1;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
  srv->port = info ? info->port : cfg->port;
  *out = srv;
  return 0;
}

int http_server_port(const http_server *srv) {
  return srv->port;
}

/* How long a stop waits for parked requests to send their 503s. */
#define STOP_GRACE_MS 3000

void http_server_stop(http_server *srv) {
  if (!srv) return;
  atomic_store(&srv->counters.stopping, 1);
  http_waker_stop(srv->cfg.waker);
  const int64_t until = http_monotonic_ms() + STOP_GRACE_MS;
  while (!http_waker_idle(srv->cfg.waker) && http_monotonic_ms() < until) {
    struct timespec pause = {0, 10 * 1000000L};
    nanosleep(&pause, NULL);
  }
  MHD_stop_daemon(srv->daemon);
  http_waker_free(srv->cfg.waker);
  http_cache_free(srv->cfg.cache);
  free(srv);
}
