/* server.h — kilnd's HTTP side: the libmicrohttpd daemon, routing and the
 * REST handlers over the store and the scheduler. Prefix http_. */
#ifndef KILN_SERVER_H
#define KILN_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "scheduler.h"
#include "storage.h"

typedef struct http_server http_server;

typedef struct http_counters http_counters;
typedef struct http_cache http_cache;
struct http_waker;

typedef struct http_config {
  const char *host;      /* numeric IPv4/IPv6 address to bind, e.g. "127.0.0.1" */
  int port;              /* 0 = any free port (see http_server_port) */
  size_t max_body_bytes; /* larger request bodies get 413 */
  const char *datasets_dir;
  const char *jobs_dir;     /* one folder per job (train.log, checkpoints) */
  int insecure_no_auth;     /* every request acts as the default tenant's admin; loopback only */
  int metrics_public;       /* /metrics without a token (else an admin token is needed) */
  store *st;                /* shared with nobody else; the server locks through it */
  sched *scheduler;         /* woken when a job is queued, asked to cancel */
  http_counters *counters;  /* set by http_server_start: request counts for /metrics */
  const char *uploads_dir;  /* uploaded data sets, one folder per id */
  const char *trainer_path; /* kiln-train, which checks each upload */
  size_t max_upload_bytes;  /* larger data set uploads get 413 */
  http_cache *cache;        /* set by http_server_start: answers the store has not changed */
  /* Connection limits (kilnd's flags; 0 = the HTTP_DEFAULT_ below). */
  unsigned max_connections;        /* open connections in all */
  unsigned max_connections_per_ip; /* open connections from one client address */
  unsigned header_timeout_s;       /* a request's headers must be complete within this */
  unsigned max_blocked_per_tenant; /* :wait and metric streams open at once, per tenant */
  unsigned threads;                /* event-loop threads */
  struct http_waker *waker;        /* set by http_server_start: parks waiting requests */
  /* kiln-train, asked at create for the memory a spec plans (--plan-only);
   * NULL = no check */
  const char *planner_path;
  int64_t memory_budget_bytes; /* a trainer's memory limit: a job planned above it is refused */
  store_quota quota_defaults;  /* the limits of a tenant an admin set none for (tenants.c) */
  /* HTTPS: the certificate chain and its private key, PEM (http_tls_load);
   * NULL = plain HTTP. */
  const char *tls_cert_pem;
  const char *tls_key_pem;
} http_config;

#define HTTP_DEFAULT_MAX_CONNECTIONS        1024
#define HTTP_DEFAULT_MAX_CONNECTIONS_PER_IP 128
#define HTTP_DEFAULT_HEADER_TIMEOUT_S       10
#define HTTP_DEFAULT_MAX_BLOCKED_PER_TENANT 64
#define HTTP_DEFAULT_THREADS                8

int http_server_start(const http_config *cfg, http_server **out, char *err, size_t errlen);
int http_server_port(const http_server *srv); /* the bound port */
void http_server_stop(http_server *srv);      /* NULL is a no-op */

/* ---- TLS (tls.c) ---- */

/* 1 when this libmicrohttpd can serve HTTPS (it was built with GnuTLS). */
int http_tls_available(void);
/* Reads the PEM certificate chain and private key kilnd is to serve with
 * into malloc'd strings, refusing a key file every user may read, one
 * GnuTLS cannot load and a key that is not the certificate's. 0, or -1
 * with a sentence naming the flag and the file in err. */
int http_tls_load(const char *cert_path, const char *key_path, char **cert_pem, char **key_pem,
                  char *err, size_t errlen);
/* The GnuTLS priorities kilnd serves with: TLS 1.2 and 1.3 only. */
extern const char http_tls_priorities[];
/* Writes len bytes on an HTTPS connection's TLS session (a struct
 * MHD_Connection *), past MHD; 0 when all of them went out. */
int http_tls_send(void *connection, const void *data, size_t len);

/* ---- tokens (used by kilnd's first start and `kilnd token create`) ---- */

/* Makes a new random bearer token for tenant with role ("admin" | "user" |
 * "agent"; an agent token's tenant is HTTP_AGENT_TENANT),
 * stores its hash and writes the secret (NUL-terminated) to token_out: the
 * only time it is ever seen. 0, or -1 with a sentence in err. */
#define HTTP_TOKEN_LEN 72
int http_token_create(store *st, const char *tenant, const char *role,
                      char token_out[HTTP_TOKEN_LEN], char *err, size_t errlen);
/* The tenant every agent token belongs to: agents act for no tenant, and
 * may call only the /v1/agents routes. */
#define HTTP_AGENT_TENANT "agents"
/* The token's public id ("tok-" and 12 hex digits of its hash). */
void http_token_id(const char *token, char id[40]);
/* 0 when tenant and role are what a token may carry, else -1 with the
 * field at fault ("tenant" or "role") and a sentence in err. An agent
 * token's tenant must be HTTP_AGENT_TENANT. */
int http_token_check(const char *tenant, const char *role, const char **field, char *err,
                     size_t errlen);

/* ---- internals shared by the files of this module ---- */

typedef struct http_principal {
  char tenant[64];
  int admin;         /* sees every tenant's jobs */
  int agent;         /* a kiln-agent's token: only the /v1/agents routes */
  char token_id[40]; /* the token's public id ("" under --insecure-no-auth) */
} http_principal;

#define HTTP_MAX_PARAMS 2

typedef struct http_request {
  const char *method;
  const char *path; /* without the query string */
  const char *body; /* NUL-terminated; "" when none */
  size_t body_len;
  void *connection;   /* struct MHD_Connection * */
  int64_t arrived_ms; /* when its headers were complete (http_monotonic_ms) */
  /* filled by the router */
  http_principal who;
  char params[HTTP_MAX_PARAMS][128]; /* path parameters in pattern order: {job}, {checkpoint} */
  int admitted; /* counted among who.tenant's blocking requests until it ends */
  /* An allocation route: the allocation its token names (path parameter 0). */
  char alloc_job[40];
  int alloc_attempt;
} http_request;

/* A streamed body: called again and again for the next bytes. Returns how
 * many it wrote to buf; 0 when it has none yet (the stream is parked,
 * holding no thread, and called again once the store changes or
 * HTTP_STREAM_RECHECK_MS pass); < 0 at the end. Never blocks. */
typedef long (*http_stream_fn)(void *ctx, uint64_t pos, char *buf, size_t max);
#define HTTP_STREAM_RECHECK_MS 1000

typedef struct http_response {
  int status;
  char *body; /* malloc'd JSON, or NULL */
  const char *content_type;
  int fd; /* > 0: send this file (closed after), fd_size bytes */
  uint64_t fd_size;
  http_stream_fn stream; /* non-NULL: stream the body (SSE) */
  void *stream_ctx;
  void (*stream_free)(void *ctx);
  const void *static_body; /* non-NULL: send these static_len bytes (never freed) */
  size_t static_len;
  const char *etag;          /* sent as ETag when set */
  const char *cache_control; /* NULL = "no-store" */
  const char *csp;           /* Content-Security-Policy, when set */
  /* Up to two more headers ("X-Kiln-Sha256"), each sent when its name is set. */
  const char *header_names[2];
  char header_values[2][96];
  /* A handler that cannot answer yet sets park (and nothing else): the
   * request is suspended, holding no thread, until the store changes,
   * park_until_ms (http_monotonic_ms) passes or the server stops; then the
   * handler runs again on the same request. */
  int park;
  int64_t park_until_ms;
} http_response;

/* A query-string argument of the request, or NULL. */
const char *http_query(const http_request *req, const char *key);
/* A request header, or NULL. */
const char *http_header(const http_request *req, const char *key);
/* The caller from "Authorization: Bearer <token>" into req->who; 0, or -1
 * having answered 401 in res. Under --insecure-no-auth, every request is
 * the default tenant's admin, if it is no cross-site or rebound one
 * (else 403 or 415 in res). */
int http_authenticate(const http_config *cfg, http_request *req, http_response *res);

/* For a route of the worker side (/v1/allocations/{alloc}/...): the bearer
 * must be the token of that very allocation, and it must not have ENDED;
 * fills req->alloc_job. 0, or -1 having answered 401 (not an allocation's
 * token) or 403 (another allocation's, or one that ended). */
int http_authenticate_allocation(const http_config *cfg, http_request *req, http_response *res);

/* 1 once the server is stopping: parked requests (:wait, streams) answer. */
int http_stopping(const http_config *cfg);
/* CLOCK_MONOTONIC in milliseconds. */
int64_t http_monotonic_ms(void);

/* ---- waker.c: requests parked without a thread, per-tenant caps, the
 * header deadline ---- */

typedef struct http_waker http_waker;
typedef struct http_conn http_conn;
/* One parked request; owned by its request, on the waker's list while parked. */
typedef struct http_parked {
  struct http_parked *prev, *next;
  void *connection; /* struct MHD_Connection *, suspended */
  int fd;
  uint64_t generation; /* store_generation() before the handler last looked */
  int64_t until_ms;
  int gone; /* set when woken: the client left */
} http_parked;

/* Starts the waker thread; NULL with a sentence in err. */
http_waker *http_waker_new(store *st, unsigned header_timeout_s, unsigned max_blocked_per_tenant,
                           char *err, size_t errlen);
void http_waker_free(http_waker *w); /* NULL is a no-op; joins the thread */
/* Wakes every parked request now and any parked later (they answer 503). */
void http_waker_stop(http_waker *w);
/* 1 when no request is parked or blocking. */
int http_waker_idle(http_waker *w);
/* Parks a request its event-loop thread has just suspended: it is resumed
 * when the store moves past generation, until_ms passes, the server stops
 * or the client at fd leaves (then p->gone is set). */
void http_waker_park(http_waker *w, http_parked *p, void *connection, int fd, uint64_t generation,
                     int64_t until_ms);
/* Counts one more blocking request for tenant: 0, or -1 having answered
 * 429 when it already has the most allowed. Release it when it ends. */
int http_waker_admit(http_waker *w, const char *tenant, http_response *res);
void http_waker_release(http_waker *w, const char *tenant);
/* A connection's record: its headers are due within the header timeout
 * from open, and from each request's end (keep-alive) to the next one's
 * headers; a late one is shut down. */
http_conn *http_waker_conn_open(http_waker *w, int fd); /* NULL when out of memory */
void http_waker_conn_headers(http_waker *w, http_conn *c, int complete);
void http_waker_conn_close(http_waker *w, http_conn *c); /* NULL is a no-op */

/* Request counters and the latency histogram behind /metrics. */
#define HTTP_LATENCY_BUCKETS 10
void http_counters_record(http_counters *c, int status, double seconds);
/* Appends the counters in Prometheus text format to a malloc'd buffer. */
char *http_counters_prometheus(http_counters *c);

/* ---- data sets (datasets.c) ---- */

/* POST /v1/datasets streams its body to disk instead of memory: begin (0,
 * or -1 with res filled and the body never read), write each chunk (-1
 * once the upload is past its cap: finish then answers 413 and nothing
 * more is read), finish (res filled), free (removes what was not kept;
 * NULL is a no-op). */
typedef struct http_upload http_upload;
int http_upload_begin(const http_config *cfg, const http_principal *who, void *connection,
                      http_upload **out, http_response *res);
int http_upload_write(const http_config *cfg, http_upload *u, const char *data, size_t len);
void http_upload_finish(const http_config *cfg, http_upload *u, http_response *res);
void http_upload_free(http_upload *u);
/* GET /v1/datasets, GET and DELETE /v1/datasets/{id}. */
/* 0 when the spec's data set is built in, or uploaded and fits the spec;
 * else -1 with res filled (400 naming the field). */
struct api_job_spec;
int http_datasets_check_spec(const http_config *cfg, const http_principal *who,
                             const struct api_job_spec *spec, http_response *res);

/* Removes a folder with everything in it (nothing when dir is ""). */
void http_remove_tree(const char *dir);
/* Removes the entries of dir whose names start with prefix and that were
 * last changed before `before`: what a kilnd killed mid-upload (".upload-")
 * or mid-plan (".plan-") left. Returns how many. */
#include <time.h>
int http_sweep_stale(const char *dir, const char *prefix, time_t before);

/* ---- allocations.c: a checkpoint a worker uploads, streamed to disk ---- */
typedef struct http_ckpt_upload http_ckpt_upload;
/* PUT /v1/allocations/{alloc}/checkpoints/{step}?sha256=HEX, after its
 * token was checked: begin (0, or -1 with res filled and the body never
 * read), write each chunk (-1 once past max_upload_bytes), finish (the
 * file fsync'd and renamed into the job's checkpoints folder when its
 * sha256 matches; res filled), free (removes what was not kept). */
int http_ckpt_upload_begin(const http_config *cfg, const http_request *req, http_ckpt_upload **out,
                           http_response *res);
int http_ckpt_upload_write(const http_config *cfg, http_ckpt_upload *u, const char *data,
                           size_t len);
void http_ckpt_upload_finish(const http_config *cfg, http_ckpt_upload *u, http_response *res);
void http_ckpt_upload_free(http_ckpt_upload *u);

/* ---- cache.c: what the store has not changed since it was read ---- */

http_cache *http_cache_new(void); /* NULL when out of memory: nothing is cached */
void http_cache_free(http_cache *c);
/* A job's rendered answer read at this store generation, if who may see
 * it: 1 with res filled (200, a copy of the body), else 0. */
int http_cache_job_get(http_cache *c, const char *id, const http_principal *who,
                       uint64_t generation, http_response *res);
/* Keeps a job's answer, read at generation, for the tenant that owns it;
 * for at most max_age_ms when > 0 (an answer with times that run on, such
 * as a queued or running job's queue_seconds and run_seconds, goes stale
 * with no write at all), else until the generation moves. */
void http_cache_job_put(http_cache *c, const char *id, const char *tenant, uint64_t generation,
                        int64_t max_age_ms, const char *body);
/* A token verified in the last two seconds, by the hex SHA-256 of its secret. */
int http_cache_token_get(http_cache *c, const char *hash, http_principal *who);
/* Read before looking a token up in the store, and handed to put: a
 * lookup that a revocation overtook is not kept. */
uint64_t http_cache_token_epoch(http_cache *c);
void http_cache_token_put(http_cache *c, const char *hash, const http_principal *who,
                          uint64_t epoch);
/* Forgets every verified token: a revoked one is refused from now on. */
void http_cache_tokens_clear(http_cache *c);

#endif
