/* http.c — libmicrohttpd glue: binds the daemon, collects request bodies
 * under a size cap (413 before reading when Content-Length already says
 * too much), hands complete requests to the router and sends its answer.
 * Data set uploads (POST /v1/datasets) are the exception: their bodies go
 * to disk through datasets.c, under a cap of their own.
 *
 * Threads: MHD's worker threads call on_request; each request's state is its
 * own `request_ctx`; shared state is reached only through the config. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "server.h"

struct http_server {
  http_config cfg;
  struct MHD_Daemon *daemon;
  int port;
};

typedef struct request_ctx {
  char *body;
  size_t len, cap;
  int too_large;
  http_upload *upload; /* POST /v1/datasets: streamed to disk, not to body */
  int answered;        /* a response was queued before the body was read */
} request_ctx;

const char *http_query(const http_request *req, const char *key) {
  return MHD_lookup_connection_value(req->connection, MHD_GET_ARGUMENT_KIND, key);
}

static enum MHD_Result send_response(struct MHD_Connection *c, http_response *res) {
  const char *body = res->body ? res->body : "";
  struct MHD_Response *r =
      MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
  free(res->body);
  res->body = NULL;
  if (!r) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                          res->content_type ? res->content_type : "application/json");
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  enum MHD_Result ok = MHD_queue_response(c, (unsigned)res->status, r);
  MHD_destroy_response(r);
  return ok;
}

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
    *con_cls = ctx;
    if (strcmp(method, "POST") == 0 && strcmp(url, "/v1/datasets") == 0) {
      http_response res = {.status = 500};
      if (http_upload_begin(&srv->cfg, c, &ctx->upload, &res) == 0) return MHD_YES;
      ctx->answered = 1;
      return send_response(c, &res);
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > srv->cfg.max_body_bytes) {
      /* Answer now: the body is never read. */
      ctx->too_large = 1;
      return send_too_large(c, srv->cfg.max_body_bytes);
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
  if (ctx->too_large) return send_too_large(c, srv->cfg.max_body_bytes);
  http_request req = {.method = method,
                      .path = url,
                      .body = ctx->body ? ctx->body : "",
                      .body_len = ctx->len,
                      .connection = c};
  http_response res = {.status = 500};
  http_dispatch(&srv->cfg, &req, &res);
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
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG;
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
  srv->daemon =
      MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, srv,
                       MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_THREAD_POOL_SIZE,
                       (unsigned)(cfg->threads > 0 ? cfg->threads : 4), MHD_OPTION_NOTIFY_COMPLETED,
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
  MHD_stop_daemon(srv->daemon);
  free(srv);
}
