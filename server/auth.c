/* auth.c — bearer tokens: a new token is 32 random bytes in hex behind a
 * "kiln_" prefix; only its SHA-256 is stored, so a copy of the database
 * holds no usable secret. */
#include <stdio.h>
#include <string.h>

#include "api.h"
#include "common.h"
#include "server.h"

int http_token_create(store *st, const char *tenant, const char *role,
                      char token_out[HTTP_TOKEN_LEN], char *err, size_t errlen) {
  token_out[0] = '\0';
  size_t tenant_len = strlen(tenant);
  if (tenant_len == 0 || tenant_len > 63) {
    snprintf(err, errlen, "tenant must be 1-63 characters, got %zu", tenant_len);
    return -1;
  }
  for (const char *c = tenant; *c; c++) {
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-' || *c == '_')) {
      snprintf(err, errlen, "tenant '%s' may hold only a-z 0-9 - _", tenant);
      return -1;
    }
  }
  if (strcmp(role, "admin") != 0 && strcmp(role, "user") != 0) {
    snprintf(err, errlen, "role must be admin or user, got '%s'", role);
    return -1;
  }
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
  /* The public id is a prefix of the hash: it names the token in logs
   * without helping anyone guess it. */
  snprintf(t.id, sizeof t.id, "tok-%.12s", hash);
  snprintf(t.tenant, sizeof t.tenant, "%s", tenant);
  snprintf(t.role, sizeof t.role, "%s", role);
  if (store_token_add(st, &t, hash) != STORE_OK) {
    snprintf(err, errlen, "cannot store the token: %s", store_errmsg(st));
    return -1;
  }
  memcpy(token_out, token, sizeof token);
  return 0;
}
