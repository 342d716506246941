/* http.c — the CLI's one HTTP layer: a libcurl easy handle reused for every
 * request of a command (so `kiln ls` pages share one connection), JSON
 * requests with a fixed time limit, streams (server-sent events, downloads)
 * through a data callback, uploads from a file, and error bodies read like
 * any other answer. */
#include "cli.h"

#include <curl/curl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cli_client {
  CURL *curl;
  char *auth_header; /* "Authorization: Bearer ..." or NULL */
  char *server;      /* normalised base URL, no trailing '/' */
  char *user_agent;
  char *cacert; /* CA certificates to verify an https:// server with; NULL: the system's */
  char curl_error[CURL_ERROR_SIZE];
  cli_response *current; /* the response being filled by write_body */
  size_t body_cap;       /* bytes allocated for current->body */
  int too_large;         /* write_body refused a body past CLI_MAX_RESPONSE_BYTES */
  cli_data_fn on_data;   /* streams: where a 2xx body goes */
  void *on_data_user;
  int stopped; /* on_data asked to end the request */
};

/* What one request sends besides its method and path. */
typedef struct request_body {
  const char *data; /* a JSON body, or NULL */
  size_t len;
  FILE *file; /* an upload's body instead, application/octet-stream */
  int64_t file_size;
  const char *extra_header;
  long timeout_ms;
  long stall_s; /* give up when nothing arrives for this long; 0 = never */
} request_body;

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

char *cli_printf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int needed = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (needed < 0) return NULL;
  char *out = malloc((size_t)needed + 1);
  if (!out) return NULL;
  va_start(ap, fmt);
  vsnprintf(out, (size_t)needed + 1, fmt, ap);
  va_end(ap);
  return out;
}

char *cli_url_escape(const char *s) {
  static const char hex[] = "0123456789ABCDEF";
  size_t len = strlen(s);
  char *out = malloc(len * 3 + 1);
  if (!out) return NULL;
  char *p = out;
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if ((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') ||
        *c == '-' || *c == '.' || *c == '_' || *c == '~') {
      *p++ = (char)*c;
    } else {
      *p++ = '%';
      *p++ = hex[*c >> 4];
      *p++ = hex[*c & 0x0f];
    }
  }
  *p = '\0';
  return out;
}

/* libcurl write callback: appends to the current response, refusing bodies
 * past the cap so a misbehaving server cannot make the CLI eat all memory. */
static size_t write_body(char *data, size_t size, size_t nmemb, void *userdata) {
  cli_client *client = userdata;
  cli_response *resp = client->current;
  size_t n = size * nmemb;
  if (client->on_data) {
    long status = 0;
    curl_easy_getinfo(client->curl, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 200 && status < 300) {
      if (client->on_data(data, n, client->on_data_user) == 0) return n;
      client->stopped = 1;
      return 0;
    }
  }
  if (n > CLI_MAX_RESPONSE_BYTES - resp->len) {
    client->too_large = 1;
    return 0; /* makes curl_easy_perform fail with CURLE_WRITE_ERROR */
  }
  if (resp->len + n + 1 > client->body_cap) {
    /* Grow geometrically: a large page arrives in many 16 KiB pieces. */
    size_t cap = client->body_cap < 16384 ? 16384 : client->body_cap;
    while (cap < resp->len + n + 1) cap *= 2;
    char *grown = realloc(resp->body, cap);
    if (!grown) return 0;
    resp->body = grown;
    client->body_cap = cap;
  }
  memcpy(resp->body + resp->len, data, n);
  resp->len += n;
  resp->body[resp->len] = '\0';
  return n;
}

cli_client *cli_client_new(const char *server, const char *user_agent, char *err, size_t errlen) {
  cli_client *client = calloc(1, sizeof *client);
  if (!client) goto oom;
  client->server = strdup(server);
  client->user_agent = strdup(user_agent);
  if (!client->server || !client->user_agent) goto oom;
  size_t len = strlen(client->server);
  while (len > 0 && client->server[len - 1] == '/') client->server[--len] = '\0';

  client->curl = curl_easy_init();
  if (!client->curl) {
    set_err(err, errlen, "cannot start libcurl (curl_easy_init failed)");
    goto fail;
  }
  CURL *curl = client->curl;
  CURLcode rc = CURLE_OK;
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_FAILONERROR, 0L); /* read API error bodies */
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, CLI_CONNECT_TIMEOUT_S);
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_USERAGENT, user_agent);
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, client->curl_error);
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, write_body);
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_WRITEDATA, client);
#if LIBCURL_VERSION_NUM >= 0x075500 /* 7.85.0 */
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
#else
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
  if (rc) {
    set_err(err, errlen, "cannot configure libcurl: %s", curl_easy_strerror(rc));
    goto fail;
  }
  return client;

oom:
  set_err(err, errlen, "out of memory");
fail:
  cli_client_free(client);
  return NULL;
}

int cli_client_set_token(cli_client *client, const char *token, char *err, size_t errlen) {
  if (strpbrk(token, "\r\n")) { /* a header line break would inject headers */
    set_err(err, errlen, "the token must be one line");
    return CLI_ERR_INTERNAL;
  }
  free(client->auth_header);
  client->auth_header = cli_printf("Authorization: Bearer %s", token);
  if (!client->auth_header) {
    set_err(err, errlen, "out of memory");
    return CLI_ERR_INTERNAL;
  }
  return CLI_OK;
}

int cli_client_set_cacert(cli_client *client, const char *path, char *err, size_t errlen) {
  char *copy = strdup(path);
  if (!copy) {
    set_err(err, errlen, "out of memory");
    return CLI_ERR_INTERNAL;
  }
  CURLcode rc = curl_easy_setopt(client->curl, CURLOPT_CAINFO, copy);
  if (rc) {
    free(copy);
    set_err(err, errlen, "cannot configure libcurl: %s", curl_easy_strerror(rc));
    return CLI_ERR_INTERNAL;
  }
  free(client->cacert);
  client->cacert = copy;
  return CLI_OK;
}

int cli_client_has_token(const cli_client *client) {
  return client->auth_header != NULL;
}

cli_client *cli_client_clone(const cli_client *client, char *err, size_t errlen) {
  cli_client *copy = cli_client_new(client->server, client->user_agent, err, errlen);
  if (copy && client->cacert && cli_client_set_cacert(copy, client->cacert, err, errlen) != 0) {
    cli_client_free(copy);
    return NULL;
  }
  if (copy && client->auth_header) {
    copy->auth_header = strdup(client->auth_header);
    if (!copy->auth_header) {
      set_err(err, errlen, "out of memory");
      cli_client_free(copy);
      return NULL;
    }
  }
  return copy;
}

void cli_client_free(cli_client *client) {
  if (!client) return;
  if (client->curl) curl_easy_cleanup(client->curl);
  free(client->auth_header);
  free(client->cacert);
  free(client->user_agent);
  free(client->server);
  free(client);
}

const char *cli_client_server(const cli_client *client) {
  return client->server;
}

void cli_response_clear(cli_response *resp) {
  if (!resp) return;
  free(resp->body);
  memset(resp, 0, sizeof *resp);
}

/* The headers of one request: JSON, or an octet stream for an upload. */
static struct curl_slist *request_headers(const cli_client *client, const request_body *body) {
  const char *lines[] = {body->file ? "Content-Type: application/octet-stream"
                                    : "Content-Type: application/json",
                         "Accept: application/json",
                         /* no "100-continue" round trip before a large body */
                         "Expect:", client->auth_header, body->extra_header};
  struct curl_slist *list = NULL;
  for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
    if (!lines[i]) continue;
    struct curl_slist *next = curl_slist_append(list, lines[i]);
    if (!next) {
      curl_slist_free_all(list);
      return NULL;
    }
    list = next;
  }
  return list;
}

static size_t read_file(char *buffer, size_t size, size_t nitems, void *userdata) {
  size_t got = fread(buffer, 1, size * nitems, userdata);
  return got == 0 && ferror((FILE *)userdata) ? CURL_READFUNC_ABORT : got;
}

static int perform(cli_client *client, const char *method, const char *path,
                   const request_body *body, cli_response *resp, char *err, size_t errlen) {
  CURL *curl = client->curl;
  int result = CLI_ERR_INTERNAL;
  memset(resp, 0, sizeof *resp);
  char *url = cli_printf("%s%s", client->server, path);
  resp->body = calloc(1, 1);
  struct curl_slist *headers = request_headers(client, body);
  if (!url || !resp->body || !headers) {
    set_err(err, errlen, "out of memory");
    goto cleanup;
  }

  CURLcode rc = curl_easy_setopt(curl, CURLOPT_URL, url);
  /* The handle is reused: undo what the previous request's method set. */
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, NULL);
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, body->timeout_ms);
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, body->stall_s ? 1L : 0L);
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, body->stall_s);
  if (!rc && strcmp(method, "GET") == 0) {
    rc = curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
  } else if (!rc && strcmp(method, "HEAD") == 0) {
    rc = curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
    if (!rc) rc = curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (!rc && strcmp(method, "PUT") == 0 && body->file) {
    rc = curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    if (!rc) rc = curl_easy_setopt(curl, CURLOPT_READFUNCTION, read_file);
    if (!rc) rc = curl_easy_setopt(curl, CURLOPT_READDATA, body->file);
    if (!rc) rc = curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, (curl_off_t)body->file_size);
  } else if (!rc && strcmp(method, "POST") == 0 && body->file) {
    rc = curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L); /* clears a previous HEAD or PUT */
    if (!rc) rc = curl_easy_setopt(curl, CURLOPT_POST, 1L);
    if (!rc) rc = curl_easy_setopt(curl, CURLOPT_POSTFIELDS, NULL);
    if (!rc) rc = curl_easy_setopt(curl, CURLOPT_READFUNCTION, read_file);
    if (!rc) rc = curl_easy_setopt(curl, CURLOPT_READDATA, body->file);
    if (!rc) rc = curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body->file_size);
  } else if (!rc && strcmp(method, "POST") == 0) {
    rc = curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L); /* clears a previous HEAD or PUT */
    if (!rc) rc = curl_easy_setopt(curl, CURLOPT_POST, 1L);
    if (!rc) rc = curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body->len);
    if (!rc) rc = curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body->data ? body->data : "");
  } else if (!rc) {
    rc = curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
    if (!rc) rc = curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
  }
  if (rc) {
    set_err(err, errlen, "cannot prepare %s %s: %s", method, url, curl_easy_strerror(rc));
    goto cleanup;
  }

  client->current = resp;
  client->body_cap = 1;
  client->too_large = 0;
  client->stopped = 0;
  client->curl_error[0] = '\0';
  rc = curl_easy_perform(curl);
  client->current = NULL;
  if (client->too_large) {
    set_err(err, errlen, "the answer to %s %s is larger than %zu MiB", method, path,
            CLI_MAX_RESPONSE_BYTES >> 20);
    result = CLI_ERR_RESPONSE;
    goto cleanup;
  }
  if (rc && !(rc == CURLE_WRITE_ERROR && client->stopped)) {
    const char *why = client->curl_error[0] ? client->curl_error : curl_easy_strerror(rc);
    if (rc == CURLE_PEER_FAILED_VERIFICATION)
      set_err(err, errlen,
              "the server's TLS certificate could not be verified (%s); if a CA of your own "
              "signed it, pass that CA with --cacert FILE or KILN_CACERT",
              why);
    else if (rc == CURLE_SSL_CACERT_BADFILE)
      set_err(err, errlen, "cannot use the CA certificates in %s (--cacert or KILN_CACERT): %s",
              client->cacert ? client->cacert : "the system store", why);
    else
      set_err(err, errlen, "%s", why);
    if (rc == CURLE_OPERATION_TIMEDOUT)
      result = CLI_ERR_TIMEOUT;
    else if (rc == CURLE_WRITE_ERROR || rc == CURLE_OUT_OF_MEMORY)
      result = CLI_ERR_INTERNAL;
    else
      result = CLI_ERR_TRANSPORT;
    goto cleanup;
  }

  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &resp->status);
  char *content_type = NULL;
  if (curl_easy_getinfo(curl, CURLINFO_CONTENT_TYPE, &content_type) == CURLE_OK && content_type)
    snprintf(resp->content_type, sizeof resp->content_type, "%s", content_type);
  result = CLI_OK;

cleanup:
  /* The list dies here: the handle must not keep pointing at it. */
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, NULL);
  curl_slist_free_all(headers);
  free(url);
  if (result != CLI_OK) cli_response_clear(resp);
  return result;
}

int cli_client_request(cli_client *client, const char *method, const char *path, const char *body,
                       size_t body_len, cli_response *resp, char *err, size_t errlen) {
  request_body b = {.data = body, .len = body_len, .timeout_ms = CLI_TOTAL_TIMEOUT_S * 1000};
  return perform(client, method, path, &b, resp, err, errlen);
}

int cli_client_stream(cli_client *client, const char *path, const char *extra_header,
                      long timeout_ms, cli_data_fn on_data, void *user, cli_response *resp,
                      char *err, size_t errlen) {
  /* kilnd's streams send a keep-alive every 15 s: a minute of silence is a
   * dead connection, not a quiet job. */
  request_body b = {.extra_header = extra_header, .timeout_ms = timeout_ms, .stall_s = 60};
  client->on_data = on_data;
  client->on_data_user = user;
  int rc = perform(client, "GET", path, &b, resp, err, errlen);
  client->on_data = NULL;
  client->on_data_user = NULL;
  return rc;
}

int cli_client_upload(cli_client *client, const char *path, FILE *file, int64_t size,
                      cli_response *resp, char *err, size_t errlen) {
  return cli_client_send_file(client, "POST", path, file, size, resp, err, errlen);
}

int cli_client_send_file(cli_client *client, const char *method, const char *path, FILE *file,
                         int64_t size, cli_response *resp, char *err, size_t errlen) {
  request_body b = {.file = file, .file_size = size, .timeout_ms = 0};
  return perform(client, method, path, &b, resp, err, errlen);
}

int cli_client_header(cli_client *client, const char *name, char *out, size_t len) {
  out[0] = '\0';
#if LIBCURL_VERSION_NUM >= 0x075300 /* 7.83.0: curl_easy_header */
  struct curl_header *h = NULL;
  if (curl_easy_header(client->curl, name, 0, CURLH_HEADER, -1, &h) != CURLHE_OK || !h) return -1;
  snprintf(out, len, "%s", h->value);
  return 0;
#else
  (void)client;
  (void)name;
  (void)len;
  return -1;
#endif
}
