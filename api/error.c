/* error.c — the API error model: a status, a message and per-field details,
 * rendered as {"error":{"code":..,"status":..,"message":..,"details":[..]}}
 * after Google's AIP-193. */
#include "api.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* vsnprintf may cut a multi-byte UTF-8 character in half; drop such a tail
 * so the text stays valid UTF-8 and jansson will accept it. */
static void trim_partial_utf8(char *text) {
  size_t len = strlen(text);
  size_t start = len;
  while (start > 0 && ((unsigned char)text[start - 1] & 0xC0) == 0x80) start--;
  if (start == 0) return;
  unsigned char lead = (unsigned char)text[start - 1];
  size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  if (len - (start - 1) < need) text[start - 1] = '\0';
}

static void vformat(char *dst, size_t size, const char *fmt, va_list ap) {
  int n = vsnprintf(dst, size, fmt, ap);
  if (n < 0)
    dst[0] = '\0';
  else if ((size_t)n >= size)
    trim_partial_utf8(dst);
}

int api_error_set(api_error *err, int http, const char *status, const char *fmt, ...) {
  if (!err) return -1;
  err->http = http;
  err->status = status;
  err->n_details = 0;
  va_list ap;
  va_start(ap, fmt);
  vformat(err->message, sizeof err->message, fmt, ap);
  va_end(ap);
  return -1;
}

void api_error_add_detail(api_error *err, const char *field, const char *fmt, ...) {
  if (!err || err->n_details < 0 || err->n_details >= API_MAX_DETAILS) return;
  api_error_detail *detail = &err->details[err->n_details++];
  snprintf(detail->field, sizeof detail->field, "%s", field ? field : "");
  trim_partial_utf8(detail->field);
  va_list ap;
  va_start(ap, fmt);
  vformat(detail->description, sizeof detail->description, fmt, ap);
  va_end(ap);
}

/* Length of the valid UTF-8 sequence at s (at most avail bytes), or 0 when
 * the bytes there are not one (overlong, surrogate, past U+10FFFF, cut). */
static size_t utf8_sequence_len(const unsigned char *s, size_t avail) {
  if (s[0] < 0x80) return 1;
  size_t len;
  unsigned int cp;
  if (s[0] >= 0xC2 && s[0] <= 0xDF)
    len = 2, cp = s[0] & 0x1Fu;
  else if (s[0] >= 0xE0 && s[0] <= 0xEF)
    len = 3, cp = s[0] & 0x0Fu;
  else if (s[0] >= 0xF0 && s[0] <= 0xF4)
    len = 4, cp = s[0] & 0x07u;
  else
    return 0;
  if (len > avail) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3Fu);
  }
  if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
      (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return len;
}

/* A JSON string for text that a caller may have filled with any bytes:
 * invalid UTF-8 becomes '?' rather than losing the whole error body. */
static json_t *safe_string(const char *text) {
  if (!text) text = "";
  json_t *str = json_string(text);
  if (str) return str;
  size_t len = strlen(text);
  char *clean = malloc(len + 1);
  if (!clean) return NULL;
  size_t out = 0;
  for (size_t i = 0; i < len;) {
    size_t n = utf8_sequence_len((const unsigned char *)text + i, len - i);
    if (n == 0) {
      clean[out++] = '?';
      i++;
    } else {
      memcpy(clean + out, text + i, n);
      out += n;
      i += n;
    }
  }
  clean[out] = '\0';
  str = json_string(clean);
  free(clean);
  return str;
}

/* json_object_set_new that also reports a NULL value (an allocation or
 * encoding failure) as an error. */
static int set_new(json_t *obj, const char *key, json_t *value) {
  return value ? json_object_set_new(obj, key, value) : -1;
}

char *api_error_to_json(const api_error *err) {
  if (!err) return NULL;
  char *text = NULL;
  json_t *root = json_object();
  json_t *body = json_object();
  json_t *details = json_array();
  if (!root || !body || !details) goto done;

  int rc = set_new(body, "code", json_integer(err->http));
  rc |= set_new(body, "status", safe_string(err->status ? err->status : "UNKNOWN"));
  rc |= set_new(body, "message", safe_string(err->message));
  int n = err->n_details < 0                 ? 0
          : err->n_details > API_MAX_DETAILS ? API_MAX_DETAILS
                                             : err->n_details;
  for (int i = 0; i < n; i++) {
    json_t *detail = json_object();
    if (!detail) goto done;
    rc |= set_new(detail, "field", safe_string(err->details[i].field));
    rc |= set_new(detail, "description", safe_string(err->details[i].description));
    rc |= json_array_append_new(details, detail);
  }
  rc |= json_object_set(body, "details", details);
  rc |= json_object_set(root, "error", body);
  if (rc == 0) text = json_dumps(root, JSON_COMPACT);

done:
  json_decref(details);
  json_decref(body);
  json_decref(root);
  return text;
}
