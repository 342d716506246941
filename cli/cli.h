/* cli.h — private to the kiln CLI: one libcurl handle that talks to kilnd,
 * and the small string helpers the commands share. Prefix cli_. Nothing here
 * prints or exits; kiln.c turns errors into messages and exit codes. */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include <stddef.h>

#include <stdint.h>
#include <stdio.h>

/* Exit codes of the kiln program, documented in `kiln --help`. */
enum {
  CLI_EXIT_OK = 0,        /* done; a waited-for job SUCCEEDED and met every --require */
  CLI_EXIT_FAILED = 1,    /* the job FAILED, or a request failed (API error, no server) */
  CLI_EXIT_USAGE = 2,     /* bad command line, or an input file that cannot be used */
  CLI_EXIT_CANCELLED = 3, /* the waited-for job ended CANCELLED */
  CLI_EXIT_TIMEOUT = 4,   /* --timeout passed before the job ended */
  CLI_EXIT_UNMET = 5,     /* the job SUCCEEDED but a --require was not met */
};

/* Return codes of cli_client_request. */
enum {
  CLI_OK = 0,
  CLI_ERR_TRANSPORT = -1, /* no HTTP answer: refused, DNS, TLS, timeout, reset */
  CLI_ERR_RESPONSE = -2,  /* an answer came but cannot be used (too large) */
  CLI_ERR_INTERNAL = -3,  /* out of memory, libcurl refused an option */
  CLI_ERR_TIMEOUT = -4,   /* the request ran past its time limit */
};

#define CLI_CONNECT_TIMEOUT_S  5L
#define CLI_TOTAL_TIMEOUT_S    60L
#define CLI_MAX_RESPONSE_BYTES ((size_t)64 << 20)

typedef struct cli_client cli_client;

typedef struct cli_response {
  long status;            /* HTTP status code, e.g. 200 or 404 */
  char *body;             /* always NUL-terminated (possibly ""); owned here */
  size_t len;             /* bytes in body, without the NUL */
  char content_type[128]; /* as sent by the server, "" when absent */
} cli_response;

/* A client for one server base URL ("http://host:port", no trailing slash
 * needed). Needs curl_global_init() first. NULL with err filled on failure. */
cli_client *cli_client_new(const char *server, const char *user_agent, char *err, size_t errlen);
void cli_client_free(cli_client *client);
/* A second client for the same server and token (its own connection), for
 * requests made while another client's stream is open. */
cli_client *cli_client_clone(const cli_client *client, char *err, size_t errlen);
/* Sends "Authorization: Bearer TOKEN" with every request from now on. */
int cli_client_set_token(cli_client *client, const char *token, char *err, size_t errlen);
/* Verifies an https:// server against the CA certificates (PEM) in path
 * instead of the system's store. */
int cli_client_set_cacert(cli_client *client, const char *path, char *err, size_t errlen);
/* 1 once cli_client_set_token has given it a token. */
int cli_client_has_token(const cli_client *client);
/* The base URL requests go to, as normalised by cli_client_new. */
const char *cli_client_server(const cli_client *client);

/* One request: method "GET" / "POST" / "DELETE", path with query starting
 * at "/" ("/v1/jobs?page_size=10"). body may be NULL. Any HTTP status counts
 * as an answer (CLI_OK): error bodies are read, never dropped. On CLI_OK the
 * caller owns resp and releases it with cli_response_clear. */
int cli_client_request(cli_client *client, const char *method, const char *path, const char *body,
                       size_t body_len, cli_response *resp, char *err, size_t errlen);
void cli_response_clear(cli_response *resp);

/* Takes the bytes of a 2xx answer as they arrive; returns 0 to go on, or
 * non-zero to end the request there (which still counts as CLI_OK). */
typedef int (*cli_data_fn)(const char *data, size_t len, void *user);

/* A GET whose 2xx body goes to on_data instead of memory: a server-sent
 * event stream or a file download. extra_header ("Last-Event-ID: 42") may
 * be NULL; timeout_ms 0 means no limit once connected, but a minute without
 * a byte ends it (CLI_ERR_TIMEOUT). Any other status is collected into
 * resp->body as cli_client_request does, for its message. */
int cli_client_stream(cli_client *client, const char *path, const char *extra_header,
                      long timeout_ms, cli_data_fn on_data, void *user, cli_response *resp,
                      char *err, size_t errlen);

/* POSTs size bytes read from file as application/octet-stream (an upload
 * of any size: no time limit once connected); the answer as above. */
int cli_client_upload(cli_client *client, const char *path, FILE *file, int64_t size,
                      cli_response *resp, char *err, size_t errlen);

/* Sends size bytes read from file as the body of method ("POST" or "PUT"),
 * application/octet-stream, with no time limit once connected. */
int cli_client_send_file(cli_client *client, const char *method, const char *path, FILE *file,
                         int64_t size, cli_response *resp, char *err, size_t errlen);

/* The value of header name in the last answer ("" and -1 when it had none,
 * or this libcurl is older than 7.83). Method "HEAD" asks for headers only. */
int cli_client_header(cli_client *client, const char *name, char *out, size_t len);

/* Percent-encodes everything but RFC 3986 unreserved characters, for a query
 * value or a path segment. malloc'd; NULL when out of memory. */
char *cli_url_escape(const char *s);

/* printf into a fresh malloc'd string; NULL when out of memory. */
char *cli_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
