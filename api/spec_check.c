/* spec_check.c — the job spec's checker: problems reported by JSON path, and
 * typed reads of an object's members that report what is wrong with them. */
#include "spec_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void spec_problem(checker *c, const char *field, const char *fmt, ...) {
  c->problems++;
  if (c->err->n_details >= API_MAX_DETAILS) return;
  /* Longer than a detail's description: api_error_add_detail does the
   * cutting, on a UTF-8 character boundary. */
  char description[2 * sizeof c->err->details[0].description];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(description, sizeof description, fmt, ap);
  va_end(ap);
  if (n < 0) description[0] = '\0';
  api_error_add_detail(c->err, field, "%s", description);
}

/* ---- paths and text ---- */

void spec_join_path(char out[PATH_LEN], const char *parent, const char *key) {
  int n = snprintf(out, PATH_LEN, "%s%s%s", parent, parent[0] ? "." : "", key);
  if (n < 0) out[0] = '\0';
}

void spec_index_path(char out[PATH_LEN], const char *parent, size_t index) {
  int n = snprintf(out, PATH_LEN, "%s[%zu]", parent, index);
  if (n < 0) out[0] = '\0';
}

/* A user's string shortened for quoting in a description, cut on a UTF-8
 * character boundary and marked with "..." when cut. */
const char *spec_clip(const char *text, char *buf, size_t size) {
  size_t len = strlen(text);
  if (len < size) return text;
  size_t keep = size - 4;
  while (keep > 0 && ((unsigned char)text[keep] & 0xC0) == 0x80) keep--;
  memcpy(buf, text, keep);
  memcpy(buf + keep, "...", 4);
  return buf;
}

/* Index of value in a NULL-terminated list, or -1. */
int spec_pick(const char *value, const char *const *choices) {
  for (int i = 0; choices[i]; i++)
    if (strcmp(value, choices[i]) == 0) return i;
  return -1;
}

/* "a, b, c" into out. */
const char *spec_list_text(const char *const *items, char *out, size_t size) {
  size_t used = 0;
  out[0] = '\0';
  for (int i = 0; items[i] && used < size; i++) {
    int n = snprintf(out + used, size - used, "%s%s", i ? ", " : "", items[i]);
    if (n < 0) break;
    used += (size_t)n;
  }
  return out;
}

void spec_copy_text(char *dst, size_t size, const char *src) {
  size_t len = strlen(src);
  if (len >= size) len = size - 1;
  memcpy(dst, src, len);
  dst[len] = '\0';
}

/* ---- typed members ---- */

/* The member key of s, or NULL when absent (reported when required). */
json_t *spec_member(const scope *s, const char *key, int required) {
  json_t *value = json_object_get(s->obj, key);
  if (!value && required) {
    char path[PATH_LEN];
    spec_join_path(path, s->path, key);
    spec_problem(s->c, path, "is required");
  }
  return value;
}

void spec_wrong_type(const scope *s, const char *key, const char *expected, const json_t *value) {
  char path[PATH_LEN];
  spec_join_path(path, s->path, key);
  spec_problem(s->c, path, "must be %s, got %s", expected, api_json_type_name(value));
}

/* An integer, or a number with no fractional part (2.0) that fits. */
int spec_as_integer(const json_t *value, long long *out) {
  if (json_is_integer(value)) {
    *out = json_integer_value(value);
    return 1;
  }
  if (json_is_real(value)) {
    double real = json_real_value(value);
    if (real >= -0x1p63 && real < 0x1p63 && real == (double)(long long)real) {
      *out = (long long)real;
      return 1;
    }
  }
  return 0;
}

/* Reads an integer member into *out when present and of the right type.
 * Returns 1 when read, 0 when absent, -1 when a problem was reported. */
int spec_get_integer(const scope *s, const char *key, int required, long long min, long long max,
                     long long *out) {
  json_t *value = spec_member(s, key, required);
  if (!value) return required ? -1 : 0;
  long long number;
  if (!spec_as_integer(value, &number)) {
    char path[PATH_LEN];
    spec_join_path(path, s->path, key);
    if (json_is_real(value))
      spec_problem(s->c, path, "must be an integer, got %g", json_real_value(value));
    else
      spec_problem(s->c, path, "must be an integer, got %s", api_json_type_name(value));
    return -1;
  }
  if (number < min || number > max) {
    char path[PATH_LEN];
    spec_join_path(path, s->path, key);
    spec_problem(s->c, path, "must be between %lld and %lld, got %lld", min, max, number);
    return -1;
  }
  *out = number;
  return 1;
}

/* An int member within [min, max]; *out keeps its default when absent. */
int spec_get_int(const scope *s, const char *key, int required, int min, int max, int *out) {
  long long number;
  int rc = spec_get_integer(s, key, required, min, max, &number);
  if (rc == 1) *out = (int)number;
  return rc;
}

int spec_get_number(const scope *s, const char *key, int required, double *out) {
  json_t *value = spec_member(s, key, required);
  if (!value) return required ? -1 : 0;
  if (!json_is_number(value)) {
    spec_wrong_type(s, key, "a number", value);
    return -1;
  }
  *out = json_number_value(value);
  return 1;
}

int spec_get_bool(const scope *s, const char *key, int *out) {
  json_t *value = spec_member(s, key, OPTIONAL);
  if (!value) return 0;
  if (!json_is_boolean(value)) {
    spec_wrong_type(s, key, "a boolean (true or false)", value);
    return -1;
  }
  *out = json_is_true(value);
  return 1;
}

const char *spec_get_string(const scope *s, const char *key, int required) {
  json_t *value = spec_member(s, key, required);
  if (!value) return NULL;
  if (!json_is_string(value)) {
    spec_wrong_type(s, key, "a string", value);
    return NULL;
  }
  return json_string_value(value);
}

/* A string member that must be one of choices; returns its index, or -1
 * when absent or refused (then a problem "<what> '<value>'; supported: .."
 * is reported). */
int spec_get_choice(const scope *s, const char *key, int required, const char *what,
                    const char *const *choices) {
  const char *value = spec_get_string(s, key, required);
  if (!value) return -1;
  int index = spec_pick(value, choices);
  if (index < 0) {
    char path[PATH_LEN], quoted[64], supported[128];
    spec_join_path(path, s->path, key);
    spec_problem(s->c, path, "%s '%s'; supported: %s", what,
                 spec_clip(value, quoted, sizeof quoted),
                 spec_list_text(choices, supported, sizeof supported));
  }
  return index;
}

static json_t *get_typed(const scope *s, const char *key, int required, int want_object) {
  json_t *value = spec_member(s, key, required);
  if (!value) return NULL;
  if (want_object ? !json_is_object(value) : !json_is_array(value)) {
    spec_wrong_type(s, key, want_object ? "an object" : "an array", value);
    return NULL;
  }
  return value;
}

json_t *spec_get_object(const scope *s, const char *key, int required) {
  return get_typed(s, key, required, 1);
}

json_t *spec_get_array(const scope *s, const char *key, int required) {
  return get_typed(s, key, required, 0);
}

/* Refuses every key of s not in allowed, so a typo never passes silently. */
void spec_refuse_unknown(const scope *s, const char *const *allowed) {
  const char *key;
  json_t *value;
  json_object_foreach(s->obj, key, value) {
    if (spec_pick(key, allowed) >= 0) continue;
    char path[PATH_LEN], expected[200];
    spec_join_path(path, s->path, key);
    spec_problem(s->c, path, "unknown field; expected one of: %s",
                 spec_list_text(allowed, expected, sizeof expected));
  }
}
