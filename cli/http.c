/* http.c — the CLI's HTTP client: one libcurl easy handle reused for every
 * request of a command (so `kiln ls` pages share one connection), fixed
 * timeouts, JSON headers, and error bodies read like any other answer. */
#include "cli.h"

#include <curl/curl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cli_client {
  CURL *curl;
  struct curl_slist *headers;
  char *server; /* normalised base URL, no trailing '/' */
  char curl_error[CURL_ERROR_SIZE];
  cli_response *current; /* the response being filled by write_body */
  size_t body_cap;       /* bytes allocated for current->body */
  int too_large;         /* write_body refused a body past CLI_MAX_RESPONSE_BYTES */
};

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
  if (!client->server) goto oom;
  size_t len = strlen(client->server);
  while (len > 0 && client->server[len - 1] == '/') client->server[--len] = '\0';

  client->curl = curl_easy_init();
  if (!client->curl) {
    set_err(err, errlen, "cannot start libcurl (curl_easy_init failed)");
    goto fail;
  }
  const char *header_lines[] = {"Content-Type: application/json", "Accept: application/json",
                                /* no "100-continue" round trip before a large spec */
                                "Expect:"};
  for (size_t i = 0; i < sizeof header_lines / sizeof header_lines[0]; i++) {
    struct curl_slist *next = curl_slist_append(client->headers, header_lines[i]);
    if (!next) goto oom;
    client->headers = next;
  }

  CURL *curl = client->curl;
  CURLcode rc = CURLE_OK;
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_FAILONERROR, 0L); /* read API error bodies */
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, CLI_CONNECT_TIMEOUT_S);
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_TIMEOUT, CLI_TOTAL_TIMEOUT_S);
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_HTTPHEADER, client->headers);
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
  char *line = cli_printf("Authorization: Bearer %s", token);
  struct curl_slist *next = line ? curl_slist_append(client->headers, line) : NULL;
  free(line);
  if (!next) {
    set_err(err, errlen, "out of memory");
    return CLI_ERR_INTERNAL;
  }
  client->headers = next;
  CURLcode rc = curl_easy_setopt(client->curl, CURLOPT_HTTPHEADER, client->headers);
  if (rc) {
    set_err(err, errlen, "cannot configure libcurl: %s", curl_easy_strerror(rc));
    return CLI_ERR_INTERNAL;
  }
  return CLI_OK;
}

void cli_client_free(cli_client *client) {
  if (!client) return;
  if (client->curl) curl_easy_cleanup(client->curl);
  curl_slist_free_all(client->headers);
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

int cli_client_request(cli_client *client, const char *method, const char *path, const char *body,
                       size_t body_len, cli_response *resp, char *err, size_t errlen) {
  CURL *curl = client->curl;
  int result = CLI_ERR_INTERNAL;
  memset(resp, 0, sizeof *resp);
  char *url = cli_printf("%s%s", client->server, path);
  resp->body = calloc(1, 1);
  if (!url || !resp->body) {
    set_err(err, errlen, "out of memory");
    goto cleanup;
  }

  CURLcode rc = curl_easy_setopt(curl, CURLOPT_URL, url);
  /* The handle is reused: undo what the previous request's method set. */
  if (!rc) rc = curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, NULL);
  if (!rc && strcmp(method, "GET") == 0) {
    rc = curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
  } else if (!rc && strcmp(method, "POST") == 0) {
    rc = curl_easy_setopt(curl, CURLOPT_POST, 1L);
    if (!rc) rc = curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    if (!rc) rc = curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body ? body : "");
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
  client->curl_error[0] = '\0';
  rc = curl_easy_perform(curl);
  client->current = NULL;
  if (client->too_large) {
    set_err(err, errlen, "the answer to %s %s is larger than %zu MiB", method, path,
            CLI_MAX_RESPONSE_BYTES >> 20);
    result = CLI_ERR_RESPONSE;
    goto cleanup;
  }
  if (rc) {
    set_err(err, errlen, "%s", client->curl_error[0] ? client->curl_error : curl_easy_strerror(rc));
    result =
        rc == CURLE_WRITE_ERROR || rc == CURLE_OUT_OF_MEMORY ? CLI_ERR_INTERNAL : CLI_ERR_TRANSPORT;
    goto cleanup;
  }

  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &resp->status);
  char *content_type = NULL;
  if (curl_easy_getinfo(curl, CURLINFO_CONTENT_TYPE, &content_type) == CURLE_OK && content_type)
    snprintf(resp->content_type, sizeof resp->content_type, "%s", content_type);
  result = CLI_OK;

cleanup:
  free(url);
  if (result != CLI_OK) cli_response_clear(resp);
  return result;
}
