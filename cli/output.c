/* output.c — what every kiln command shares: messages on stderr, server
 * text made safe for a terminal, tables, and one API call whose failures
 * (no server, the API's error model, a body that is not JSON) become a
 * message and exit code 1. */
#include "kiln.h"

#include <curl/curl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SNIPPET_CHARS 200 /* of a non-JSON body quoted in an error */

int cli_usage_error(const char *fmt, ...) {
  va_list ap;
  fputs("kiln: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputs(" (try 'kiln --help')\n", stderr);
  return CLI_EXIT_USAGE;
}

int cli_fail(const char *fmt, ...) {
  va_list ap;
  fputs("kiln: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return CLI_EXIT_FAILED;
}

void cli_put_clean(FILE *out, const char *s) {
  for (; *s; s++) fputc((unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s, out);
}

/* Columns a UTF-8 string takes, counting one per code point. */
size_t cli_display_width(const char *s) {
  size_t width = 0;
  for (; *s; s++)
    if (((unsigned char)*s & 0xc0) != 0x80) width++;
  return width;
}

/* Copies s into out with control bytes replaced, cut to max_cols code points
 * ("..." marks a cut). out holds CLI_CELL_BYTES. */
static void clean_cell(const char *s, size_t max_cols, char *out) {
  size_t cols = 0, used = 0;
  if (!*s) s = "-";
  int cut = cli_display_width(s) > max_cols;
  size_t keep = cut ? max_cols - 3 : max_cols;
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if ((c & 0xc0) != 0x80 && cols++ == keep) break;
    if (used + 4 >= CLI_CELL_BYTES) break;
    out[used++] = c < 0x20 || c == 0x7f ? '?' : (char)c;
  }
  if (cut) {
    memcpy(out + used, "...", 3);
    used += 3;
  }
  out[used] = '\0';
}

const char *cli_string_at(const json_t *obj, const char *key) {
  return json_string_value(json_object_get(obj, key));
}

void cli_format_value(const json_t *value, char *buf, size_t len) {
  if (!value || json_is_null(value)) {
    snprintf(buf, len, "-");
  } else if (json_is_string(value)) {
    snprintf(buf, len, "%s", json_string_value(value));
  } else if (json_is_integer(value)) {
    snprintf(buf, len, "%" JSON_INTEGER_FORMAT, json_integer_value(value));
  } else if (json_is_real(value)) {
    snprintf(buf, len, "%.6g", json_real_value(value));
  } else if (json_is_boolean(value)) {
    snprintf(buf, len, "%s", json_is_true(value) ? "true" : "false");
  } else {
    char *dumped = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);
    snprintf(buf, len, "%s", dumped ? dumped : "?");
    free(dumped);
  }
}

void cli_format_progress(const json_t *progress, char *buf, size_t len) {
  const json_t *step = json_object_get(progress, "step");
  const json_t *total = json_object_get(progress, "total_steps");
  const json_t *fraction = json_object_get(progress, "fraction");
  if (!json_is_integer(step)) {
    snprintf(buf, len, "-");
  } else if (json_is_integer(total) && json_is_number(fraction)) {
    snprintf(buf, len, "%" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT " %d%%",
             json_integer_value(step), json_integer_value(total),
             (int)(json_number_value(fraction) * 100));
  } else {
    snprintf(buf, len, "%" JSON_INTEGER_FORMAT, json_integer_value(step));
  }
}

void cli_print_json(const json_t *value) {
  char *text = json_dumps(value, JSON_INDENT(2) | JSON_ENCODE_ANY);
  if (text) {
    fputs(text, stdout);
    fputc('\n', stdout);
  }
  free(text);
}

void cli_print_table(const char *const *headers, const size_t *max_cols, int columns,
                     const char *const *cells, int rows) {
  size_t widths[16];
  char cell[CLI_CELL_BYTES];
  if (columns > 16) columns = 16;
  for (int c = 0; c < columns; c++) widths[c] = strlen(headers[c]);
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < columns; c++) {
      clean_cell(cells[r * columns + c], max_cols[c], cell);
      size_t width = cli_display_width(cell);
      if (width > widths[c]) widths[c] = width;
    }
  }
  for (int c = 0; c < columns; c++)
    printf("%s%*s", headers[c], c + 1 < columns ? (int)(widths[c] - strlen(headers[c]) + 2) : 0,
           "");
  fputc('\n', stdout);
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < columns; c++) {
      clean_cell(cells[r * columns + c], max_cols[c], cell);
      size_t width = cli_display_width(cell);
      printf("%s%*s", cell, c + 1 < columns ? (int)(widths[c] - width + 2) : 0, "");
    }
    fputc('\n', stdout);
  }
}

char *cli_job_path_id(const char *arg, int *exit_code) {
  const char *id = strncmp(arg, "jobs/", 5) == 0 ? arg + 5 : arg; /* the resource name too */
  if (!*id) {
    *exit_code = cli_usage_error("a job id is needed, got '%s'", arg);
    return NULL;
  }
  char *escaped = cli_url_escape(id);
  if (!escaped) *exit_code = cli_fail("out of memory");
  return escaped;
}

const char *cli_job_id_of(const json_t *job) {
  const char *id = cli_string_at(job, "id");
  if (id && *id) return id;
  const char *name = cli_string_at(job, "name");
  if (name && strncmp(name, "jobs/", 5) == 0 && name[5]) return name + 5;
  return NULL;
}

/* The first MAX_SNIPPET_CHARS of a body, on one line, for error messages. */
static void body_snippet(const cli_response *resp, char *buf, size_t len) {
  size_t used = 0;
  for (size_t i = 0; i < resp->len && i < MAX_SNIPPET_CHARS && used + 1 < len; i++) {
    unsigned char c = (unsigned char)resp->body[i];
    buf[used++] = c < 0x20 || c == 0x7f ? ' ' : (char)c;
  }
  buf[used] = '\0';
  if (resp->len > MAX_SNIPPET_CHARS && used + 4 < len) strcat(buf, "...");
  if (used == 0) snprintf(buf, len, "(empty body)");
}

/* Prints {"error":{...}} as `kiln: STATUS: message` plus one line per
 * detail that says more than the message (most repeat it, naming the field). */
static void print_api_error(const json_t *error, long http_status) {
  const char *status = cli_string_at(error, "status");
  const char *message = cli_string_at(error, "message");
  fputs("kiln: ", stderr);
  if (status && *status)
    cli_put_clean(stderr, status);
  else
    fprintf(stderr, "HTTP %ld", http_status);
  fputs(": ", stderr);
  cli_put_clean(stderr, message && *message ? message : "(no message)");
  fputc('\n', stderr);

  const json_t *details = json_object_get(error, "details");
  size_t i;
  const json_t *detail;
  json_array_foreach(details, i, detail) {
    const char *field = cli_string_at(detail, "field");
    const char *description = cli_string_at(detail, "description");
    if (!field && !description) continue;
    if (description && message && strcmp(description, message) == 0) continue;
    fputs("  ", stderr);
    if (field) {
      cli_put_clean(stderr, field);
      if (description) fputs(": ", stderr);
    }
    if (description) cli_put_clean(stderr, description);
    fputc('\n', stderr);
  }
}

int cli_report_answer(cli_client *client, const char *method, const char *path,
                      const cli_response *resp) {
  json_t *answer = json_loadb(resp->body, resp->len, 0, NULL);
  const json_t *error = json_object_get(answer, "error");
  if (resp->status == 401 && !cli_client_has_token(client)) {
    /* The server names its header; the user needs kiln's ways to give one. */
    cli_fail("%s needs a token: pass --token TOKEN, or set KILN_TOKEN or KILN_TOKEN_FILE (an "
             "admin makes one with 'kilnd token create --tenant NAME')",
             cli_client_server(client));
  } else if (json_is_object(error)) {
    print_api_error(error, resp->status);
  } else {
    char snippet[MAX_SNIPPET_CHARS + 8];
    body_snippet(resp, snippet, sizeof snippet);
    cli_fail("%s answered %s %s with HTTP %ld and no kiln error in the body: %s",
             cli_client_server(client), method, path, resp->status, snippet);
  }
  json_decref(answer);
  return CLI_EXIT_FAILED;
}

int cli_report_transport(cli_client *client, int rc, const char *method, const char *path,
                         const char *err) {
  if (rc == CLI_ERR_TRANSPORT || rc == CLI_ERR_TIMEOUT)
    return cli_fail("cannot reach %s: %s", cli_client_server(client), err);
  if (rc == CLI_ERR_RESPONSE) return cli_fail("%s", err);
  return cli_fail("%s %s: %s", method, path, err);
}

int cli_call_api(cli_client *client, const char *method, const char *path, const char *body,
                 size_t body_len, json_t **out) {
  char err[CURL_ERROR_SIZE + 256];
  cli_response resp;
  *out = NULL;
  int rc = cli_client_request(client, method, path, body, body_len, &resp, err, sizeof err);
  if (rc != CLI_OK) return cli_report_transport(client, rc, method, path, err);
  int exit_code = CLI_EXIT_FAILED;
  if (resp.status >= 200 && resp.status < 300) {
    json_t *answer = json_loadb(resp.body, resp.len, 0, NULL);
    if (json_is_object(answer)) {
      *out = answer;
      exit_code = CLI_EXIT_OK;
    } else {
      json_decref(answer);
      char snippet[MAX_SNIPPET_CHARS + 8];
      body_snippet(&resp, snippet, sizeof snippet);
      cli_fail("%s answered %s %s with HTTP %ld but not with a JSON object (is it a kiln "
               "server?); content-type '%s', body: %s",
               cli_client_server(client), method, path, resp.status,
               resp.content_type[0] ? resp.content_type : "none", snippet);
    }
  } else {
    exit_code = cli_report_answer(client, method, path, &resp);
  }
  cli_response_clear(&resp);
  return exit_code;
}

/* The API's cap on page_size: the fewest round trips. */
#define MAX_LIST_PAGE_SIZE 1000

int cli_list_all(cli_client *client, const char *path, const char *key, json_t **out) {
  json_t *all = json_array();
  char *token = NULL;
  int exit_code = all ? CLI_EXIT_OK : cli_fail("out of memory");
  while (exit_code == CLI_EXIT_OK) {
    char *escaped = token ? cli_url_escape(token) : NULL;
    char *page_path = token && !escaped
                          ? NULL
                          : cli_printf("%s?page_size=%d%s%s", path, MAX_LIST_PAGE_SIZE,
                                       token ? "&page_token=" : "", token ? escaped : "");
    free(escaped);
    json_t *page = NULL;
    exit_code = page_path ? cli_call_api(client, "GET", page_path, NULL, 0, &page)
                          : cli_fail("out of memory");
    free(page_path);
    if (exit_code != CLI_EXIT_OK) break;
    json_array_extend(all, json_object_get(page, key));
    const char *next = cli_string_at(page, "next_page_token");
    /* A server that hands back the same token would loop for ever. */
    int more = next && *next && !(token && strcmp(token, next) == 0);
    free(token);
    token = more ? strdup(next) : NULL;
    json_decref(page);
    if (!more) break;
    if (!token) exit_code = cli_fail("out of memory");
  }
  free(token);
  if (exit_code != CLI_EXIT_OK) {
    json_decref(all);
    all = NULL;
  }
  *out = all;
  return exit_code;
}
