/* auth.c — bearer tokens: a new token is 32 random bytes in hex behind a
 * "kiln_" prefix; only its SHA-256 is stored, so a copy of the database
 * holds no usable secret. Who a request acts for, and what
 * --insecure-no-auth still refuses: requests another site's page or a
 * rebound DNS name could make a browser send. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api.h"
#include "common.h"
#include "routes.h"
#include "server.h"

int http_token_check(const char *tenant, const char *role, const char **field, char *err,
                     size_t errlen) {
  size_t tenant_len = strlen(tenant);
  *field = "tenant";
  if (tenant_len == 0 || tenant_len > 63) {
    snprintf(err, errlen, "tenant must be 1-63 characters, got %zu", tenant_len);
    return -1;
  }
  for (const char *c = tenant; *c; c++) {
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-' || *c == '_')) {
      snprintf(err, errlen, "tenant '%.63s' may hold only a-z 0-9 - _", tenant);
      return -1;
    }
  }
  *field = "role";
  if (strcmp(role, "admin") != 0 && strcmp(role, "user") != 0 && strcmp(role, "agent") != 0) {
    snprintf(err, errlen, "role must be admin, user or agent, got '%.40s'", role);
    return -1;
  }
  *field = "tenant";
  if (strcmp(role, "agent") == 0 && strcmp(tenant, HTTP_AGENT_TENANT) != 0) {
    snprintf(err, errlen,
             "an agent token acts for no tenant: leave tenant out (it is stored as '%s'), got "
             "'%.63s'",
             HTTP_AGENT_TENANT, tenant);
    return -1;
  }
  *field = NULL;
  return 0;
}

void http_token_id(const char *token, char id[40]) {
  char hash[65];
  kc_sha256_hex_of(token, strlen(token), hash);
  /* A prefix of the hash: it names the token in lists and logs without
   * helping anyone guess it. */
  snprintf(id, 40, "tok-%.12s", hash);
}

int http_token_create(store *st, const char *tenant, const char *role,
                      char token_out[HTTP_TOKEN_LEN], char *err, size_t errlen) {
  token_out[0] = '\0';
  const char *field;
  if (http_token_check(tenant, role, &field, err, errlen) != 0) return -1;
  unsigned char raw[32];
  FILE *f = fopen("/dev/urandom", "rb");
  size_t got = f ? fread(raw, 1, sizeof raw, f) : 0;
  if (f) fclose(f);
  if (got != sizeof raw) {
    snprintf(err, errlen, "cannot read 32 random bytes from /dev/urandom");
    return -1;
  }
  char token[HTTP_TOKEN_LEN];
  int n = snprintf(token, sizeof token, "kiln_");
  for (size_t i = 0; i < sizeof raw; i++)
    n += snprintf(token + n, sizeof token - (size_t)n, "%02x", raw[i]);
  store_token t;
  memset(&t, 0, sizeof t);
  char hash[65];
  kc_sha256_hex_of(token, strlen(token), hash);
  http_token_id(token, t.id);
  snprintf(t.tenant, sizeof t.tenant, "%s", tenant);
  snprintf(t.role, sizeof t.role, "%s", role);
  if (store_token_add(st, &t, hash) != STORE_OK) {
    snprintf(err, errlen, "cannot store the token: %s", store_errmsg(st));
    return -1;
  }
  memcpy(token_out, token, sizeof token);
  return 0;
}

/* ---- --insecure-no-auth: no cross-site, no rebound requests ---- */

/* 1 for a loopback host as a Host header or an Origin names it, with an
 * optional port: 127.x.y.z, [::1], localhost. */
static int loopback_authority(const char *text) {
  char name[256];
  const char *rest;
  if (text[0] == '[') {
    const char *close = strchr(text, ']');
    if (!close || (size_t)(close - text) >= sizeof name) return 0;
    snprintf(name, sizeof name, "%.*s", (int)(close - text - 1), text + 1);
    rest = close + 1;
  } else {
    size_t len = strcspn(text, ":");
    if (len >= sizeof name) return 0;
    snprintf(name, sizeof name, "%.*s", (int)len, text);
    rest = text + len;
  }
  if (*rest == ':') rest += 1 + strspn(rest + 1, "0123456789");
  if (*rest) return 0;
  if (strcasecmp(name, "localhost") == 0 || strcmp(name, "::1") == 0) return 1;
  return strncmp(name, "127.", 4) == 0 && name[strspn(name, "0123456789.")] == '\0';
}

/* "http://127.0.0.1:8080" and the like: a page served by this machine's
 * loopback. "null" (a sandboxed or file page) and any other site are not. */
static int loopback_origin(const char *origin) {
  const char *at = NULL;
  if (strncasecmp(origin, "http://", 7) == 0) at = origin + 7;
  if (strncasecmp(origin, "https://", 8) == 0) at = origin + 8;
  return at && loopback_authority(at);
}

static int is_write(const char *method) {
  return strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0 &&
         strcmp(method, "OPTIONS") != 0;
}

/* The media type of a Content-Type, lower case, without parameters. */
static void media_type(const char *content_type, char *out, size_t len) {
  size_t n = strcspn(content_type, "; \t");
  if (n >= len) n = len - 1;
  for (size_t i = 0; i < n; i++) {
    char c = content_type[i];
    out[i] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
  }
  out[n] = '\0';
}

/* A browser on another site can send a "simple" request (a form's
 * text/plain or urlencoded POST) to loopback without asking first, and a
 * DNS name rebound to 127.0.0.1 makes its page same-origin with kilnd.
 * Without tokens, only the Host, the Origin and the Content-Type tell such
 * requests apart; 0 when the request is none of them. */
static int refuse_browser_attacks(const http_request *req, http_response *res) {
  const char *host = http_header(req, "Host");
  if (!host || !loopback_authority(host)) {
    http_reply_status(res, 403, "PERMISSION_DENIED", "Host",
                      "--insecure-no-auth serves only requests for a loopback host (127.0.0.1, "
                      "[::1], localhost), got Host '%.80s'",
                      host ? host : "");
    return -1;
  }
  const char *origin = http_header(req, "Origin");
  if (origin && !loopback_origin(origin)) {
    http_reply_status(res, 403, "PERMISSION_DENIED", "Origin",
                      "--insecure-no-auth refuses requests from another site's page, got Origin "
                      "'%.80s'",
                      origin);
    return -1;
  }
  if (!is_write(req->method)) return 0;
  const char *type = http_header(req, "Content-Type");
  const char *length = http_header(req, "Content-Length");
  const int has_body = req->body_len > 0 || (length && strtoull(length, NULL, 10) > 0) ||
                       http_header(req, "Transfer-Encoding");
  if (!type && !has_body) return 0; /* :cancel and the like: nothing a form could forge */
  char media[64];
  media_type(type ? type : "", media, sizeof media);
  const int upload = strcmp(req->path, "/v1/datasets") == 0;
  if (strcmp(media, "application/json") == 0 ||
      (upload && strcmp(media, "application/octet-stream") == 0))
    return 0;
  http_reply_status(res, 415, "INVALID_ARGUMENT", "Content-Type",
                    "--insecure-no-auth takes a request body only as application/json%s, got "
                    "'%.60s'",
                    upload ? " or application/octet-stream" : "", type ? type : "(none)");
  return -1;
}

int http_authenticate(const http_config *cfg, http_request *req, http_response *res) {
  if (cfg->insecure_no_auth) {
    if (refuse_browser_attacks(req, res) != 0) return -1;
    snprintf(req->who.tenant, sizeof req->who.tenant, "%s", STORE_DEFAULT_TENANT);
    req->who.admin = 1;
    return 0;
  }
  const char *auth = http_header(req, "Authorization");
  if (!auth || !*auth) {
    http_reply_status(res, 401, "UNAUTHENTICATED", "Authorization",
                      "this route needs an 'Authorization: Bearer TOKEN' header");
    return -1;
  }
  if (strncasecmp(auth, "Bearer ", 7) != 0 || !auth[7]) { /* the scheme is case-insensitive */
    http_reply_status(res, 401, "UNAUTHENTICATED", "Authorization",
                      "the Authorization header must be 'Bearer TOKEN'");
    return -1;
  }
  char hash[65];
  kc_sha256_hex_of(auth + 7, strlen(auth + 7), hash);
  if (http_cache_token_get(cfg->cache, hash, &req->who)) return 0;
  const uint64_t epoch = http_cache_token_epoch(cfg->cache);
  store_token token;
  int rc = store_token_find(cfg->st, hash, &token);
  if (rc == STORE_NOT_FOUND) {
    http_reply_status(res, 401, "UNAUTHENTICATED", "Authorization",
                      "the bearer token is not valid (unknown or revoked)");
    return -1;
  }
  if (rc != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return -1;
  }
  snprintf(req->who.tenant, sizeof req->who.tenant, "%s", token.tenant);
  req->who.admin = strcmp(token.role, "admin") == 0;
  req->who.agent = strcmp(token.role, "agent") == 0;
  snprintf(req->who.token_id, sizeof req->who.token_id, "%s", token.id);
  /* At most once per cache lifetime per token: GET /v1/tokens shows it. */
  store_token_touch(cfg->st, hash, store_now_ms());
  http_cache_token_put(cfg->cache, hash, &req->who, epoch);
  return 0;
}
