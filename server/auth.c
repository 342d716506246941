/* auth.c — bearer tokens: a new token is 32 random bytes in hex behind a
 * "kiln_" prefix; only its SHA-256 is stored, so a copy of the database
 * holds no usable secret. Who a request acts for. */
#include <stdio.h>
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
  if (strcmp(role, "admin") != 0 && strcmp(role, "user") != 0) {
    snprintf(err, errlen, "role must be admin or user, got '%.40s'", role);
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

int http_authenticate(const http_config *cfg, http_request *req, http_response *res) {
  if (cfg->insecure_no_auth) {
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
  /* At most once per cache lifetime per token: GET /v1/tokens shows it. */
  store_token_touch(cfg->st, hash, store_now_ms());
  http_cache_token_put(cfg->cache, hash, &req->who, epoch);
  return 0;
}
