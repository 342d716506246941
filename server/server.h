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
  const char *uploads_dir;  /* uploaded data sets, one folder per id */
  const char *trainer_path; /* kiln-train, which checks each upload */
  size_t max_upload_bytes;  /* larger data set uploads get 413 */
  store *st;                /* shared with nobody else; the server locks through it */
  sched *scheduler;         /* woken when a job is queued */
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

/* ---- data sets (datasets.c) ---- */

/* POST /v1/datasets streams its body to disk instead of memory: begin (0,
 * or -1 with res filled and the body never read), write each chunk, finish
 * (res filled), free (removes what was not kept; NULL is a no-op). */
typedef struct http_upload http_upload;
int http_upload_begin(const http_config *cfg, void *connection, http_upload **out,
                      http_response *res);
void http_upload_write(const http_config *cfg, http_upload *u, const char *data, size_t len);
void http_upload_finish(const http_config *cfg, http_upload *u, http_response *res);
void http_upload_free(http_upload *u);
/* GET /v1/datasets, GET and DELETE /v1/datasets/{id}. */
void http_datasets_route(const http_config *cfg, const http_request *req, http_response *res);
/* 0 when the spec's data set is built in, or uploaded and fits the spec;
 * else -1 with res filled (400 naming the field). */
struct api_job_spec;
int http_datasets_check_spec(const http_config *cfg, const struct api_job_spec *spec,
                             http_response *res);

#endif
