/* progress.c — the progress lines kiln-train writes for the scheduler, one
 * JSON object per line: metrics, checkpoint, error or status. Parsing is
 * strict (unknown keys, wrong types and oversize strings are refused) so a
 * trainer bug shows up as a clear error, not as silently lost data. */
#include "api.h"
#include "json_util.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((format(printf, 3, 4))) static int fail(char *err, size_t errlen, const char *fmt,
                                                      ...) {
  if (err && errlen > 0) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    if (n < 0) err[0] = '\0';
  }
  return -1;
}

/* One object of the line being read, with the error buffer and the name of
 * the object for messages ("checkpoint", or "" for the top level). */
typedef struct reader {
  json_t *obj;
  const char *where;
  char *err;
  size_t errlen;
} reader;

static int refuse_unknown(const reader *r, const char *const *allowed) {
  const char *key;
  json_t *value;
  json_object_foreach(r->obj, key, value) {
    int known = 0;
    for (int i = 0; allowed[i] && !known; i++) known = strcmp(key, allowed[i]) == 0;
    if (!known)
      return fail(r->err, r->errlen, "progress line: unknown field '%s%s%.60s'", r->where,
                  r->where[0] ? "." : "", key);
  }
  return 0;
}

/* An integer in [min, max] (2.0 counts as 2); absent leaves *out as is. */
static int read_int64(const reader *r, const char *key, int required, int64_t min, int64_t max,
                      int64_t *out) {
  json_t *value = json_object_get(r->obj, key);
  const char *dot = r->where[0] ? "." : "";
  if (!value) {
    if (!required) return 0;
    return fail(r->err, r->errlen, "progress line: %s%s%s is required", r->where, dot, key);
  }
  long long number;
  double real = json_is_real(value) ? json_real_value(value) : 0.5;
  if (json_is_integer(value)) {
    number = json_integer_value(value);
  } else if (json_is_real(value) && real >= -0x1p63 && real < 0x1p63 &&
             real == (double)(long long)real) {
    number = (long long)real;
  } else if (json_is_real(value)) {
    return fail(r->err, r->errlen, "progress line: %s%s%s must be an integer, got %g", r->where,
                dot, key, real);
  } else {
    return fail(r->err, r->errlen, "progress line: %s%s%s must be an integer, got %s", r->where,
                dot, key, api_json_type_name(value));
  }
  if (number < min || number > max)
    return fail(r->err, r->errlen, "progress line: %s%s%s must be between %lld and %lld, got %lld",
                r->where, dot, key, (long long)min, (long long)max, number);
  *out = number;
  return 0;
}

/* A string of at most size - 1 bytes (and at least one when required),
 * copied into dst; absent leaves dst as is. */
static int read_string(const reader *r, const char *key, int required, char *dst, size_t size) {
  json_t *value = json_object_get(r->obj, key);
  const char *dot = r->where[0] ? "." : "";
  if (!value) {
    if (!required) return 0;
    return fail(r->err, r->errlen, "progress line: %s%s%s is required", r->where, dot, key);
  }
  if (!json_is_string(value))
    return fail(r->err, r->errlen, "progress line: %s%s%s must be a string, got %s", r->where, dot,
                key, api_json_type_name(value));
  size_t len = json_string_length(value);
  if (len >= size || (required && len == 0))
    return fail(r->err, r->errlen, "progress line: %s%s%s must be %d to %zu bytes long, got %zu",
                r->where, dot, key, required ? 1 : 0, size - 1, len);
  memcpy(dst, json_string_value(value), len + 1);
  return 0;
}

static int parse_metrics(json_t *root, api_progress *out, char *err, size_t errlen) {
  static const char *const fields[] = {"step", "epoch", "metrics", NULL};
  reader r = {root, "", err, errlen};
  int64_t step = 0, epoch = 0;
  if (refuse_unknown(&r, fields) || read_int64(&r, "step", 1, 0, INT64_MAX, &step) ||
      read_int64(&r, "epoch", 0, 0, INT_MAX, &epoch))
    return -1;
  out->step = step;
  out->epoch = (int)epoch;

  json_t *metrics = json_object_get(root, "metrics");
  if (!metrics) return fail(err, errlen, "progress line: metrics is required");
  if (!json_is_object(metrics))
    return fail(err, errlen, "progress line: metrics must be an object, got %s",
                api_json_type_name(metrics));
  if (json_object_size(metrics) > API_MAX_METRICS)
    return fail(err, errlen, "progress line: at most %d metrics per line, got %zu", API_MAX_METRICS,
                json_object_size(metrics));
  const char *name;
  json_t *value;
  json_object_foreach(metrics, name, value) {
    size_t len = strlen(name);
    if (len < 1 || len >= sizeof out->metric_names[0])
      return fail(err, errlen, "progress line: metric name must be 1 to %zu bytes long, got %zu",
                  sizeof out->metric_names[0] - 1, len);
    if (!json_is_number(value))
      return fail(err, errlen, "progress line: metrics.%s must be a number, got %s", name,
                  api_json_type_name(value));
    double number = json_number_value(value);
    if (!isfinite(number))
      return fail(err, errlen, "progress line: metrics.%s must be finite, got %g", name, number);
    memcpy(out->metric_names[out->n_metrics], name, len + 1);
    out->metric_values[out->n_metrics] = number;
    out->n_metrics++;
  }
  return 0;
}

static int is_sha256_hex(const char *text) {
  if (strlen(text) != 64) return 0;
  for (int i = 0; i < 64; i++)
    if (!((text[i] >= '0' && text[i] <= '9') || (text[i] >= 'a' && text[i] <= 'f'))) return 0;
  return 1;
}

static int parse_checkpoint(json_t *body, api_progress *out, char *err, size_t errlen) {
  static const char *const fields[] = {"step", "path", "bytes", "sha256", NULL};
  reader r = {body, "checkpoint", err, errlen};
  if (refuse_unknown(&r, fields) || read_int64(&r, "step", 1, 0, INT64_MAX, &out->step) ||
      read_string(&r, "path", 1, out->path, sizeof out->path) ||
      read_int64(&r, "bytes", 1, 0, INT64_MAX, &out->bytes))
    return -1;
  json_t *value = json_object_get(body, "sha256");
  if (!value) return fail(err, errlen, "progress line: checkpoint.sha256 is required");
  if (!json_is_string(value) || !is_sha256_hex(json_string_value(value)))
    return fail(err, errlen, "progress line: checkpoint.sha256 must be 64 lowercase hex digits");
  memcpy(out->sha256, json_string_value(value), sizeof out->sha256);
  return 0;
}

/* error: {reason, message}; status: {phase, message}. */
static int parse_event(json_t *body, const char *kind, const char *code_key, api_progress *out,
                       char *err, size_t errlen) {
  const char *const fields[] = {code_key, "message", NULL};
  reader r = {body, kind, err, errlen};
  if (refuse_unknown(&r, fields) || read_string(&r, code_key, 1, out->reason, sizeof out->reason) ||
      read_string(&r, "message", 0, out->message, sizeof out->message))
    return -1;
  return 0;
}

int api_progress_parse(const char *line, api_progress *out, char *err, size_t errlen) {
  if (!out) return fail(err, errlen, "api_progress_parse: out is NULL");
  memset(out, 0, sizeof *out);
  if (!line) return fail(err, errlen, "progress line is NULL");

  json_error_t jerr;
  json_t *root = json_loads(line, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return fail(err, errlen, "progress line is not valid JSON: %s at column %d", jerr.text,
                jerr.column);

  static const char *const wrapped[] = {"checkpoint", "error", "status"};
  static const api_progress_kind wrapped_kind[] = {API_PROGRESS_CHECKPOINT, API_PROGRESS_ERROR,
                                                   API_PROGRESS_STATUS};
  int rc = -1;
  if (!json_is_object(root)) {
    fail(err, errlen, "progress line must be a JSON object, got %s", api_json_type_name(root));
    goto done;
  }
  for (int k = 0; k < 3; k++) {
    json_t *body = json_object_get(root, wrapped[k]);
    if (!body) continue;
    out->kind = wrapped_kind[k];
    if (json_object_size(root) != 1) {
      fail(err, errlen, "progress line: '%s' must be the line's only key, got %zu keys", wrapped[k],
           json_object_size(root));
    } else if (!json_is_object(body)) {
      fail(err, errlen, "progress line: %s must be an object, got %s", wrapped[k],
           api_json_type_name(body));
    } else if (out->kind == API_PROGRESS_CHECKPOINT) {
      rc = parse_checkpoint(body, out, err, errlen);
    } else if (out->kind == API_PROGRESS_ERROR) {
      rc = parse_event(body, "error", "reason", out, err, errlen);
    } else {
      rc = parse_event(body, "status", "phase", out, err, errlen);
    }
    goto done;
  }
  if (json_object_get(root, "step") || json_object_get(root, "metrics")) {
    out->kind = API_PROGRESS_METRICS;
    rc = parse_metrics(root, out, err, errlen);
  } else {
    fail(err, errlen,
         "progress line of unknown kind: expected a metrics line (step, metrics) or a "
         "checkpoint, error or status object");
  }

done:
  json_decref(root);
  return rc;
}

/* ---- formatting ---- */

typedef struct builder {
  int failed;
} builder;

/* json_object_set_new frees value and fails when obj is NULL, so a failed
 * allocation anywhere is caught by the one flag. */
static void put(builder *b, json_t *obj, const char *key, json_t *value) {
  if (!value || json_object_set_new(obj, key, value) != 0) b->failed = 1;
}

/* A string from a fixed-size field that a caller may not have terminated. */
static json_t *bounded_string(const char *text, size_t size) {
  return json_stringn(text, strnlen(text, size));
}

/* The line for p. It is written as given: a caller that fills p by hand
 * with values parse would refuse (a short sha256, say) gets a line that
 * does not read back. Returns NULL for an unknown kind, more than
 * API_MAX_METRICS, an empty or repeated metric name, a non-finite value or
 * invalid UTF-8. */
char *api_progress_format(const api_progress *p) {
  if (!p) return NULL;
  builder b = {0};
  int digits = 1;
  json_t *root = json_object();
  json_t *body = json_object();

  switch (p->kind) {
  case API_PROGRESS_METRICS: {
    put(&b, root, "step", json_integer(p->step));
    put(&b, root, "epoch", json_integer(p->epoch));
    if (p->n_metrics < 0 || p->n_metrics > API_MAX_METRICS) b.failed = 1;
    for (int i = 0; !b.failed && i < p->n_metrics; i++) {
      json_t *name = bounded_string(p->metric_names[i], sizeof p->metric_names[i]);
      /* A repeated or empty name would not read back as the same line. */
      if (!name || json_string_length(name) == 0 ||
          json_object_get(body, json_string_value(name))) {
        b.failed = 1;
      } else {
        put(&b, body, json_string_value(name), json_real(p->metric_values[i]));
        int need = api_json_real_digits(p->metric_values[i]);
        if (need > digits) digits = need;
      }
      json_decref(name);
    }
    put(&b, root, "metrics", body);
    break;
  }
  case API_PROGRESS_CHECKPOINT:
    put(&b, body, "step", json_integer(p->step));
    put(&b, body, "path", bounded_string(p->path, sizeof p->path));
    put(&b, body, "bytes", json_integer(p->bytes));
    put(&b, body, "sha256", bounded_string(p->sha256, sizeof p->sha256));
    put(&b, root, "checkpoint", body);
    break;
  case API_PROGRESS_ERROR:
    put(&b, body, "reason", bounded_string(p->reason, sizeof p->reason));
    put(&b, body, "message", bounded_string(p->message, sizeof p->message));
    put(&b, root, "error", body);
    break;
  case API_PROGRESS_STATUS:
    put(&b, body, "phase", bounded_string(p->reason, sizeof p->reason));
    put(&b, body, "message", bounded_string(p->message, sizeof p->message));
    put(&b, root, "status", body);
    break;
  default: b.failed = 1; json_decref(body);
  }

  char *text = NULL;
  if (!b.failed) text = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(digits));
  json_decref(root);
  return text;
}
