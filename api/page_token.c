/* page_token.c — opaque list page tokens: a version tag, the position
 * after which the next page starts and a digest of the query they belong
 * to, in URL-safe base64 without padding, so clients treat them as opaque,
 * a garbled one is caught, and one query's token is refused by another. */
#include <stdio.h>
#include <string.h>

#include "api.h"

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* FNV-1a, 32 bits: tells queries apart; not a secret (a forged token
 * still lists only what its caller may see). */
static uint32_t query_digest(const char *query) {
  uint32_t h = 2166136261u;
  for (const unsigned char *p = (const unsigned char *)query; *p; p++) h = (h ^ *p) * 16777619u;
  return h;
}

void api_page_token_encode(int64_t position, const char *query, char out[API_PAGE_TOKEN_LEN]) {
  char plain[40];
  int n = snprintf(plain, sizeof plain, "p2:%lld:%08x", (long long)position,
                   (unsigned)query_digest(query));
  size_t o = 0;
  for (int i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)(unsigned char)plain[i] << 16;
    if (i + 1 < n) v |= (uint32_t)(unsigned char)plain[i + 1] << 8;
    if (i + 2 < n) v |= (unsigned char)plain[i + 2];
    out[o++] = b64[(v >> 18) & 63];
    out[o++] = b64[(v >> 12) & 63];
    if (i + 1 < n) out[o++] = b64[(v >> 6) & 63];
    if (i + 2 < n) out[o++] = b64[v & 63];
  }
  out[o] = '\0';
}

int api_page_token_decode(const char *token, const char *query, int64_t *position) {
  size_t len = strlen(token);
  if (len == 0 || len >= API_PAGE_TOKEN_LEN || len % 4 == 1) return -1;
  char plain[40];
  size_t p = 0;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < len; i++) {
    const char *at = strchr(b64, token[i]);
    if (!at || !token[i]) return -1;
    acc = (acc << 6) | (uint32_t)(at - b64);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      if (p + 1 >= sizeof plain) return -1;
      plain[p++] = (char)((acc >> bits) & 0xff);
    }
  }
  plain[p] = '\0';
  long long v;
  unsigned digest;
  char tail;
  if (strncmp(plain, "p2:", 3) != 0 || sscanf(plain + 3, "%lld:%8x%c", &v, &digest, &tail) != 2 ||
      v < 1 || digest != query_digest(query)) {
    return -1;
  }
  *position = v;
  return 0;
}
