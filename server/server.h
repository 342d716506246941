/* server.h — kilnd's HTTP side: the libmicrohttpd daemon, routing and the
 * REST handlers over the store and the scheduler. Prefix http_. */
#ifndef KILN_SERVER_H
#define KILN_SERVER_H

#include <stddef.h>

#include "scheduler.h"
#include "storage.h"

typedef struct http_server http_server;

typedef struct http_config {
  const char *host;      /* numeric IPv4/IPv6 address to bind, e.g. "127.0.0.1" */
  int port;              /* 0 = any free port (see http_server_port) */
  size_t max_body_bytes; /* larger request bodies get 413 */
  int threads;           /* request worker threads */
  const char *datasets_dir;
  store *st;        /* shared with nobody else; the server locks through it */
  sched *scheduler; /* woken when a job is queued */
} http_config;

int http_server_start(const http_config *cfg, http_server **out, char *err, size_t errlen);
int http_server_port(const http_server *srv); /* the bound port */
void http_server_stop(http_server *srv);      /* NULL is a no-op */

/* ---- internals shared by the files of this module ---- */

typedef struct http_request {
  const char *method;
  const char *path; /* without the query string */
  const char *body; /* NUL-terminated; "" when none */
  size_t body_len;
  void *connection; /* struct MHD_Connection * */
} http_request;

typedef struct http_response {
  int status;
  char *body; /* malloc'd JSON, or NULL */
  const char *content_type;
} http_response;

/* A query-string argument of the request, or NULL. */
const char *http_query(const http_request *req, const char *key);
/* Routes a complete request to its handler. */
void http_dispatch(const http_config *cfg, const http_request *req, http_response *res);

#endif
