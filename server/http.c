/* http.c — libmicrohttpd glue: binds the daemon, collects request bodies
 * under a size cap (an oversized one is 413, answered before it is read
 * when the client waits for 100-continue or it is far too large, else
 * after it is read and dropped), hands complete requests to the router and
 * sends its answer.
 * Data set uploads (POST /v1/datasets) are the exception: their bodies go
 * to disk through datasets.c, under a cap of their own.
 *
 * Threads: one MHD thread per connection calls on_request, so a handler may
 * block (:wait, SSE streams) without stalling other clients; each request's
 * state is its own `request_ctx`; shared state is reached only through the
 * config. The counters are atomics. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "server.h"

/* Upper bounds (seconds) of the latency histogram; +Inf is implied. */
static const double latency_bounds[HTTP_LATENCY_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                            0.025,  0.05,  0.1,    0.5,   2.5};

struct http_counters {
  atomic_uint_fast64_t by_status[600]; /* requests answered, by HTTP status */
  atomic_uint_fast64_t latency[HTTP_LATENCY_BUCKETS + 1];
  atomic_uint_fast64_t latency_us_sum;
  atomic_int stopping; /* set before the daemon stops: blocked handlers return */
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
  char *body;
  size_t len, cap;
  int too_large;
  struct timespec started;
  http_upload *upload; /* POST /v1/datasets: streamed to disk, not to body */
  int answered;        /* a response was queued before the body was read */
} request_ctx;

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

typedef struct stream_holder {
  http_stream_fn fn;
  void *ctx;
  void (*free_fn)(void *ctx);
} stream_holder;

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  stream_holder *h = cls;
  long n = h->fn(h->ctx, pos, buf, max);
  return n > 0 ? (ssize_t)n : (ssize_t)MHD_CONTENT_READER_END_OF_STREAM;
}

static void stream_release(void *cls) {
  stream_holder *h = cls;
  if (h->free_fn) h->free_fn(h->ctx);
  free(h);
}

const char *http_query(const http_request *req, const char *key) {
  return MHD_lookup_connection_value(req->connection, MHD_GET_ARGUMENT_KIND, key);
}

static enum MHD_Result send_response(struct MHD_Connection *c, http_response *res) {
  struct MHD_Response *r = NULL;
  if (res->stream) {
    stream_holder *h = malloc(sizeof *h);
    if (h) {
      *h = (stream_holder){res->stream, res->stream_ctx, res->stream_free};
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
  enum MHD_Result ok = MHD_queue_response(c, (unsigned)res->status, r);
  MHD_destroy_response(r);
  return ok;
}

/* How far past the body cap an oversized body is still read (and dropped)
 * so that its 413 reaches a client that does not wait for 100-continue. */
#define DRAIN_FACTOR 8

static enum MHD_Result send_too_large(struct MHD_Connection *c, size_t limit) {
  api_error e;
  memset(&e, 0, sizeof e);
  api_error_set(&e, 413, "RESOURCE_EXHAUSTED", "request body is larger than the %zu-byte limit",
                limit);
  api_error_add_detail(&e, "body", "at most %zu bytes are accepted", limit);
  http_response res = {.status = 413, .body = api_error_to_json(&e)};
  return send_response(c, &res);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
  (void)version;
  http_server *srv = cls;
  request_ctx *ctx = *con_cls;
  if (!ctx) {
    ctx = calloc(1, sizeof *ctx);
    if (!ctx) return MHD_NO;
    clock_gettime(CLOCK_MONOTONIC, &ctx->started);
    *con_cls = ctx;
    if (strcmp(method, "POST") == 0 && strcmp(url, "/v1/datasets") == 0) {
      http_response res = {.status = 500};
      /* The token is checked before a byte of the upload is taken. */
      http_request who = {.method = method, .path = url, .body = "", .connection = c};
      if (http_authenticate(&srv->cfg, &who, &res) == 0 &&
          http_upload_begin(&srv->cfg, &who.who, c, &ctx->upload, &res) == 0)
        return MHD_YES;
      ctx->answered = 1;
      return send_response(c, &res);
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    const unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
    if (declared > srv->cfg.max_body_bytes) {
      ctx->too_large = 1;
      /* A client that sends the body without waiting for 100-continue
       * would see its connection reset mid-send before it reads an early
       * answer: a body up to a few times the cap is read and dropped, and
       * the 413 comes after it. A larger one, or one that waits for
       * 100-continue, is answered now and never read. */
      const char *expect = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Expect");
      if ((expect && strcasecmp(expect, "100-continue") == 0) ||
          declared > (unsigned long long)srv->cfg.max_body_bytes * DRAIN_FACTOR) {
        http_counters_record(&srv->counters, 413, seconds_since(&ctx->started));
        return send_too_large(c, srv->cfg.max_body_bytes);
      }
    }
    return MHD_YES;
  }
  if (ctx->answered) {
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (ctx->upload) {
    if (*upload_data_size > 0) {
      http_upload_write(&srv->cfg, ctx->upload, upload_data, *upload_data_size);
      *upload_data_size = 0;
      return MHD_YES;
    }
    http_response res = {.status = 500};
    http_upload_finish(&srv->cfg, ctx->upload, &res);
    ctx->answered = 1;
    return send_response(c, &res);
  }
  if (*upload_data_size > 0) {
    size_t n = *upload_data_size;
    *upload_data_size = 0;
    if (ctx->too_large) return MHD_YES;
    if (ctx->len + n > srv->cfg.max_body_bytes) {
      ctx->too_large = 1; /* chunked upload past the cap: drain, then 413 */
      free(ctx->body);
      ctx->body = NULL;
      ctx->len = ctx->cap = 0;
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
  if (ctx->too_large) {
    http_counters_record(&srv->counters, 413, seconds_since(&ctx->started));
    return send_too_large(c, srv->cfg.max_body_bytes);
  }
  http_request req = {.method = method,
                      .path = url,
                      .body = ctx->body ? ctx->body : "",
                      .body_len = ctx->len,
                      .connection = c};
  http_response res = {.status = 500};
  http_dispatch(&srv->cfg, &req, &res);
  http_counters_record(&srv->counters, res.status, seconds_since(&ctx->started));
  return send_response(c, &res);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  (void)cls;
  (void)c;
  (void)toe;
  request_ctx *ctx = *con_cls;
  if (ctx) {
    http_upload_free(ctx->upload);
    free(ctx->body);
    free(ctx);
    *con_cls = NULL;
  }
}

int http_server_start(const http_config *cfg, http_server **out, char *err, size_t errlen) {
  *out = NULL;
  struct sockaddr_storage addr;
  memset(&addr, 0, sizeof addr);
  unsigned flags =
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG;
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
  srv->cfg.counters = &srv->counters;
  srv->cfg.cache = http_cache_new();
  srv->daemon =
      MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, srv,
                       MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED,
                       on_completed, srv, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
                       MHD_OPTION_CONNECTION_LIMIT, (unsigned)512, MHD_OPTION_END);
  if (!srv->daemon) {
    snprintf(err, errlen, "cannot listen on %s:%d (address in use, or not allowed?)", cfg->host,
             cfg->port);
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

void http_server_stop(http_server *srv) {
  if (!srv) return;
  atomic_store(&srv->counters.stopping, 1);
  MHD_stop_daemon(srv->daemon);
  http_cache_free(srv->cfg.cache);
  free(srv);
}
