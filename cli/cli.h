/* cli.h — private to the kiln CLI: one libcurl handle that talks to kilnd,
 * and the small string helpers the commands share. Prefix cli_. Nothing here
 * prints or exits; kiln.c turns errors into messages and exit codes. */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include <stddef.h>

/* Exit codes of the kiln program, documented in `kiln --help`. */
enum {
  CLI_EXIT_OK = 0,     /* the command did what was asked */
  CLI_EXIT_FAILED = 1, /* a request failed: API error, unreachable server, odd answer */
  CLI_EXIT_USAGE = 2,  /* bad command line, or an input file that cannot be used */
};

/* Return codes of cli_client_request. */
enum {
  CLI_OK = 0,
  CLI_ERR_TRANSPORT = -1, /* no HTTP answer: refused, DNS, TLS, timeout, reset */
  CLI_ERR_RESPONSE = -2,  /* an answer came but cannot be used (too large) */
  CLI_ERR_INTERNAL = -3,  /* out of memory, libcurl refused an option */
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
/* Sends "Authorization: Bearer TOKEN" with every request from now on. */
int cli_client_set_token(cli_client *client, const char *token, char *err, size_t errlen);
/* The base URL requests go to, as normalised by cli_client_new. */
const char *cli_client_server(const cli_client *client);

/* One request: method "GET" / "POST" / "DELETE", path with query starting
 * at "/" ("/v1/jobs?page_size=10"). body may be NULL. Any HTTP status counts
 * as an answer (CLI_OK): error bodies are read, never dropped. On CLI_OK the
 * caller owns resp and releases it with cli_response_clear. */
int cli_client_request(cli_client *client, const char *method, const char *path, const char *body,
                       size_t body_len, cli_response *resp, char *err, size_t errlen);
void cli_response_clear(cli_response *resp);

/* Percent-encodes everything but RFC 3986 unreserved characters, for a query
 * value or a path segment. malloc'd; NULL when out of memory. */
char *cli_url_escape(const char *s);

/* printf into a fresh malloc'd string; NULL when out of memory. */
char *cli_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
