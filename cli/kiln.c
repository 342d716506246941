/* kiln.c — the kiln command-line client: parses the command line, talks to
 * kilnd's REST API through cli_client, and prints tables or JSON. Exit codes
 * are made for CI: 0 ok, 1 the request failed, 2 usage. */
#include "cli.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifndef KILN_VERSION
#define KILN_VERSION "0.0.0-dev"
#endif

#define DEFAULT_SERVER     "http://127.0.0.1:8080"
#define MAX_SPEC_BYTES     ((size_t)16 << 20)
#define MAX_LIST_PAGE_SIZE 1000 /* the API's cap on page_size */
#define MAX_SNIPPET_CHARS  200  /* of a non-JSON body quoted in an error */
#define MAX_NAME_COLUMN    40   /* display names are cut to this in tables */
#define CELL_BYTES         256

static const char *const job_states[] = {"QUEUED",    "STARTING", "RUNNING",   "STOPPING",
                                         "SUCCEEDED", "FAILED",   "CANCELLED", "PREEMPTED"};

static const char usage_text[] =
    "kiln " KILN_VERSION " - submit and inspect training jobs on a kiln server\n"
    "\n"
    "Usage:\n"
    "  kiln [OPTIONS] submit SPEC.json [--request-id ID]\n"
    "  kiln [OPTIONS] get JOB_ID\n"
    "  kiln [OPTIONS] ls [--state STATE] [--page-size N]\n"
    "  kiln --help | --version\n"
    "\n"
    "Commands:\n"
    "  submit SPEC.json    create a job from a JSON job spec ('-' reads standard input)\n"
    "                      and print its id\n"
    "  get JOB_ID          show one job: state, reason, attempt, times, latest metrics\n"
    "  ls                  list jobs: ID, STATE, NAME, CREATED\n"
    "\n"
    "Options:\n"
    "  --token TOKEN       bearer token (default: $KILN_TOKEN, else the contents of\n"
    "                      $KILN_TOKEN_FILE)\n"
    "  --server URL        the kilnd to talk to (default: $KILN_SERVER, else\n"
    "                      " DEFAULT_SERVER ")\n"
    "  -o, --output FMT    'table' (default) or 'json' (the API's resources, pretty-printed)\n"
    "  --request-id ID     submit: a retried submit with the same ID returns the same job\n"
    "                      instead of creating a second one\n"
    "  --state STATE       ls: only jobs in STATE (QUEUED, STARTING, RUNNING, STOPPING,\n"
    "                      SUCCEEDED, FAILED, CANCELLED, PREEMPTED)\n"
    "  --page-size N       ls: list at most N jobs (default: all of them, page by page)\n"
    "  -h, --help          print this help and exit\n"
    "  --version           print the version and exit\n"
    "\n"
    "Exit status:\n"
    "  0  success\n"
    "  1  the request failed: the server answered with an error (printed as\n"
    "     'kiln: STATUS: message' plus one line per offending field), could not\n"
    "     be reached, or answered something that is not kiln's API\n"
    "  2  usage error: a bad command line, or a spec file that cannot be read or\n"
    "     is not a JSON object\n";

typedef enum output_format { OUTPUT_TABLE = 0, OUTPUT_JSON } output_format;

typedef struct options {
  const char *server; /* NULL: $KILN_SERVER, else DEFAULT_SERVER */
  const char *token;  /* NULL: $KILN_TOKEN, else $KILN_TOKEN_FILE's contents */
  output_format output;
  const char *command;
  const char *args[8]; /* positional arguments after the command */
  int n_args;
  const char *request_id; /* submit */
  const char *state;      /* ls */
  const char *page_size;  /* ls, as typed; checked by cmd_ls */
} options;

/* ---- messages ---- */

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* One line on stderr and exit code 2, as promised in --help. */
static int usage_error(const char *fmt, ...) {
  va_list ap;
  fputs("kiln: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputs(" (try 'kiln --help')\n", stderr);
  return CLI_EXIT_USAGE;
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int fail(const char *fmt, ...) {
  va_list ap;
  fputs("kiln: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return CLI_EXIT_FAILED;
}

/* Server text goes to a terminal: control bytes (escape sequences, stray
 * newlines) become '?' so an odd answer cannot garble or hijack the screen. */
static void put_clean(FILE *out, const char *s) {
  for (; *s; s++) fputc((unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s, out);
}

/* Columns a UTF-8 string takes, counting one per code point. */
static size_t display_width(const char *s) {
  size_t width = 0;
  for (; *s; s++)
    if (((unsigned char)*s & 0xc0) != 0x80) width++;
  return width;
}

/* Copies s into out with control bytes replaced, cut to max_cols code points
 * ("..." marks a cut). out holds CELL_BYTES. */
static void clean_cell(const char *s, size_t max_cols, char *out) {
  size_t cols = 0, used = 0;
  int cut = display_width(s) > max_cols;
  size_t keep = cut ? max_cols - 3 : max_cols;
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if ((c & 0xc0) != 0x80 && cols++ == keep) break;
    if (used + 4 >= CELL_BYTES) break;
    out[used++] = c < 0x20 || c == 0x7f ? '?' : (char)c;
  }
  if (cut) {
    memcpy(out + used, "...", 3);
    used += 3;
  }
  out[used] = '\0';
}

/* ---- reading the API's JSON defensively ---- */

/* The string at obj[key], or NULL when absent or not a string. */
static const char *string_at(const json_t *obj, const char *key) {
  return json_string_value(json_object_get(obj, key));
}

/* Any JSON scalar as text for a table; "-" for absent or null. */
static void format_value(const json_t *value, char *buf, size_t len) {
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

/* Prints {"error":{...}} as `kiln: STATUS: message` plus one line per detail. */
static void print_api_error(const json_t *error, long http_status) {
  const char *status = string_at(error, "status");
  const char *message = string_at(error, "message");
  fputs("kiln: ", stderr);
  if (status && *status)
    put_clean(stderr, status);
  else
    fprintf(stderr, "HTTP %ld", http_status);
  fputs(": ", stderr);
  put_clean(stderr, message && *message ? message : "(no message)");
  fputc('\n', stderr);

  const json_t *details = json_object_get(error, "details");
  size_t i;
  const json_t *detail;
  json_array_foreach(details, i, detail) {
    const char *field = string_at(detail, "field");
    const char *description = string_at(detail, "description");
    if (!field && !description) continue;
    fputs("  ", stderr);
    if (field) {
      put_clean(stderr, field);
      if (description) fputs(": ", stderr);
    }
    if (description) put_clean(stderr, description);
    fputc('\n', stderr);
  }
}

/* Sends one request and hands back the answer's JSON object on a 2xx.
 * Everything else (unreachable server, API error, a body that is not JSON)
 * is reported on stderr and returns CLI_EXIT_FAILED. */
static int call_api(cli_client *client, const char *method, const char *path, const char *body,
                    size_t body_len, json_t **out) {
  char err[CURL_ERROR_SIZE + 256];
  cli_response resp;
  *out = NULL;
  int rc = cli_client_request(client, method, path, body, body_len, &resp, err, sizeof err);
  if (rc == CLI_ERR_TRANSPORT) return fail("cannot reach %s: %s", cli_client_server(client), err);
  if (rc == CLI_ERR_RESPONSE) return fail("%s", err);
  if (rc != CLI_OK) return fail("%s %s: %s", method, path, err);

  json_error_t json_err;
  json_t *answer = json_loadb(resp.body, resp.len, 0, &json_err);
  char snippet[MAX_SNIPPET_CHARS + 8];
  int exit_code = CLI_EXIT_FAILED;
  if (resp.status >= 200 && resp.status < 300) {
    if (json_is_object(answer)) {
      *out = answer;
      answer = NULL;
      exit_code = CLI_EXIT_OK;
    } else {
      body_snippet(&resp, snippet, sizeof snippet);
      fail("%s answered %s %s with HTTP %ld but not with a JSON object (is it a kiln server?); "
           "content-type '%s', body: %s",
           cli_client_server(client), method, path, resp.status,
           resp.content_type[0] ? resp.content_type : "none", snippet);
    }
  } else {
    const json_t *error = json_object_get(answer, "error");
    if (json_is_object(error)) {
      print_api_error(error, resp.status);
    } else {
      body_snippet(&resp, snippet, sizeof snippet);
      fail("%s answered %s %s with HTTP %ld and no kiln error in the body: %s",
           cli_client_server(client), method, path, resp.status, snippet);
    }
  }
  json_decref(answer);
  cli_response_clear(&resp);
  return exit_code;
}

static void print_json(const json_t *value) {
  char *text = json_dumps(value, JSON_INDENT(2) | JSON_ENCODE_ANY);
  if (text) {
    fputs(text, stdout);
    fputc('\n', stdout);
  }
  free(text);
}

/* The job id of a resource: "id", else the tail of "name" ("jobs/ID"). */
static const char *job_id_of(const json_t *job) {
  const char *id = string_at(job, "id");
  if (id && *id) return id;
  const char *name = string_at(job, "name");
  if (name && strncmp(name, "jobs/", 5) == 0 && name[5]) return name + 5;
  return NULL;
}

/* ---- commands ---- */

/* Reads a whole spec file ("-" is stdin) into a NUL-terminated buffer. */
static int read_spec(const char *path, char **out, size_t *out_len) {
  int is_stdin = strcmp(path, "-") == 0;
  FILE *file = is_stdin ? stdin : fopen(path, "rb");
  char *data = NULL;
  size_t len = 0, cap = 0;
  int exit_code = CLI_EXIT_USAGE;
  if (!file) {
    fprintf(stderr, "kiln: cannot read spec file '%s': %s\n", path, strerror(errno));
    return CLI_EXIT_USAGE;
  }
  for (;;) {
    if (cap - len < 4096) {
      cap = cap ? cap * 2 : 16384;
      char *grown = realloc(data, cap + 1);
      if (!grown) {
        fprintf(stderr, "kiln: out of memory reading '%s'\n", path);
        goto cleanup;
      }
      data = grown;
    }
    size_t got = fread(data + len, 1, cap - len, file);
    len += got;
    if (len > MAX_SPEC_BYTES) {
      fprintf(stderr, "kiln: spec file '%s' is larger than %zu MiB\n", path, MAX_SPEC_BYTES >> 20);
      goto cleanup;
    }
    if (got == 0) break;
  }
  if (ferror(file)) {
    fprintf(stderr, "kiln: cannot read spec file '%s': %s\n", path, strerror(errno));
    goto cleanup;
  }
  data[len] = '\0';
  *out = data;
  *out_len = len;
  data = NULL;
  exit_code = CLI_EXIT_OK;
cleanup:
  if (!is_stdin) fclose(file);
  free(data);
  return exit_code;
}

static int cmd_submit(cli_client *client, const options *opts) {
  const char *path = opts->args[0];
  char *spec = NULL, *url_path = NULL, *escaped = NULL;
  size_t spec_len = 0;
  json_t *job = NULL;
  int exit_code = read_spec(path, &spec, &spec_len);
  if (exit_code != CLI_EXIT_OK) goto cleanup;

  /* Catch a broken file here, with its line and column, rather than as a
   * server error; the bytes sent are still the file's own. */
  json_error_t json_err;
  json_t *parsed = json_loadb(spec, spec_len, 0, &json_err);
  if (!parsed) {
    fprintf(stderr, "kiln: %s:%d:%d: not valid JSON: %s\n", path, json_err.line, json_err.column,
            json_err.text);
    exit_code = CLI_EXIT_USAGE;
    goto cleanup;
  }
  int is_object = json_is_object(parsed);
  json_decref(parsed);
  if (!is_object) {
    fprintf(stderr, "kiln: %s: a job spec must be a JSON object ({...})\n", path);
    exit_code = CLI_EXIT_USAGE;
    goto cleanup;
  }

  if (opts->request_id) {
    escaped = cli_url_escape(opts->request_id);
    url_path = escaped ? cli_printf("/v1/jobs?request_id=%s", escaped) : NULL;
  } else {
    url_path = cli_printf("/v1/jobs");
  }
  if (!url_path) {
    exit_code = fail("out of memory");
    goto cleanup;
  }
  exit_code = call_api(client, "POST", url_path, spec, spec_len, &job);
  if (exit_code != CLI_EXIT_OK) goto cleanup;

  if (opts->output == OUTPUT_JSON) {
    print_json(job);
  } else {
    const char *id = job_id_of(job);
    const char *state = string_at(job, "state");
    if (!id) {
      exit_code = fail("the server accepted the job but its answer has no job id");
      goto cleanup;
    }
    fputs("job ", stdout);
    put_clean(stdout, id);
    fputc(' ', stdout);
    put_clean(stdout, state ? state : "-");
    fputc('\n', stdout);
  }

cleanup:
  json_decref(job);
  free(url_path);
  free(escaped);
  free(spec);
  return exit_code;
}

static void print_field(const char *key, const json_t *value) {
  char text[4096];
  format_value(value, text, sizeof text);
  printf("%-15s ", key);
  put_clean(stdout, text[0] ? text : "-");
  fputc('\n', stdout);
}

static void print_job(const json_t *job) {
  static const char *const keys[] = {"id",          "name",       "display_name", "state",
                                     "reason",      "message",    "priority",     "attempt",
                                     "create_time", "start_time", "end_time"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    print_field(keys[i], json_object_get(job, keys[i]));

  const json_t *metrics = json_object_get(job, "latest_metrics");
  if (!json_is_object(metrics) || json_object_size(metrics) == 0) {
    print_field("latest_metrics", NULL);
    return;
  }
  puts("latest_metrics");
  size_t width = 0;
  const char *name;
  const json_t *value;
  json_object_foreach((json_t *)metrics, name, value) {
    if (display_width(name) > width) width = display_width(name);
  }
  json_object_foreach((json_t *)metrics, name, value) {
    char text[256];
    format_value(value, text, sizeof text);
    fputs("  ", stdout);
    put_clean(stdout, name);
    printf("%*s", (int)(width - display_width(name) + 2), "");
    put_clean(stdout, text);
    fputc('\n', stdout);
  }
}

static int cmd_get(cli_client *client, const options *opts) {
  const char *id = opts->args[0];
  if (strncmp(id, "jobs/", 5) == 0) id += 5; /* accept the resource name too */
  if (!*id) return usage_error("get needs a job id, got '%s'", opts->args[0]);

  char *escaped = cli_url_escape(id);
  char *url_path = escaped ? cli_printf("/v1/jobs/%s", escaped) : NULL;
  json_t *job = NULL;
  int exit_code =
      url_path ? call_api(client, "GET", url_path, NULL, 0, &job) : fail("out of memory");
  if (exit_code == CLI_EXIT_OK) {
    if (opts->output == OUTPUT_JSON)
      print_json(job);
    else
      print_job(job);
  }
  json_decref(job);
  free(url_path);
  free(escaped);
  return exit_code;
}

/* Prints the ID / STATE / NAME / CREATED table, columns sized to fit. */
static void print_job_table(const json_t *jobs) {
  enum { COLUMNS = 4 };
  static const char *const headers[COLUMNS] = {"ID", "STATE", "NAME", "CREATED"};
  static const size_t max_cols[COLUMNS] = {64, 16, MAX_NAME_COLUMN, 40};
  size_t widths[COLUMNS];
  for (int c = 0; c < COLUMNS; c++) widths[c] = strlen(headers[c]);

  char cells[COLUMNS][CELL_BYTES];
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1) {
      for (int c = 0; c < COLUMNS; c++)
        printf("%s%*s", headers[c], c + 1 < COLUMNS ? (int)(widths[c] - strlen(headers[c]) + 2) : 0,
               "");
      fputc('\n', stdout);
    }
    size_t i;
    const json_t *job;
    json_array_foreach(jobs, i, job) {
      const char *id = job_id_of(job);
      char value[CELL_BYTES];
      clean_cell(id ? id : "-", max_cols[0], cells[0]);
      format_value(json_object_get(job, "state"), value, sizeof value);
      clean_cell(value, max_cols[1], cells[1]);
      const char *display_name = string_at(job, "display_name");
      clean_cell(display_name && *display_name ? display_name : "-", max_cols[2], cells[2]);
      format_value(json_object_get(job, "create_time"), value, sizeof value);
      clean_cell(value, max_cols[3], cells[3]);
      for (int c = 0; c < COLUMNS; c++) {
        size_t width = display_width(cells[c]);
        if (pass == 0 && width > widths[c]) widths[c] = width;
        if (pass == 1)
          printf("%s%*s", cells[c], c + 1 < COLUMNS ? (int)(widths[c] - width + 2) : 0, "");
      }
      if (pass == 1) fputc('\n', stdout);
    }
  }
}

static int cmd_ls(cli_client *client, const options *opts) {
  long limit = -1; /* -1: every job */
  if (opts->page_size) {
    char *end = NULL;
    errno = 0;
    limit = strtol(opts->page_size, &end, 10);
    if (errno || end == opts->page_size || *end || limit < 1)
      return usage_error("--page-size needs a whole number >= 1, got '%s'", opts->page_size);
  }
  char state[16] = "";
  if (opts->state) {
    for (size_t i = 0; i < sizeof job_states / sizeof job_states[0]; i++)
      if (strcasecmp(opts->state, job_states[i]) == 0)
        snprintf(state, sizeof state, "%s", job_states[i]);
    if (!state[0])
      return usage_error("--state must be one of QUEUED, STARTING, RUNNING, STOPPING, SUCCEEDED, "
                         "FAILED, CANCELLED, PREEMPTED; got '%s'",
                         opts->state);
  }

  json_t *all = json_array();
  json_t *page = NULL;
  char *token = NULL; /* page token of the next request, "" / NULL for the first */
  int exit_code = all ? CLI_EXIT_OK : fail("out of memory");
  while (exit_code == CLI_EXIT_OK) {
    long remaining = limit < 0 ? MAX_LIST_PAGE_SIZE : limit - (long)json_array_size(all);
    long page_size = remaining < MAX_LIST_PAGE_SIZE ? remaining : MAX_LIST_PAGE_SIZE;
    char *escaped_token = token ? cli_url_escape(token) : NULL;
    char *url_path = token && !escaped_token
                         ? NULL
                         : cli_printf("/v1/jobs?page_size=%ld%s%s%s%s", page_size,
                                      state[0] ? "&filter=state%3D" : "", state,
                                      token ? "&page_token=" : "", token ? escaped_token : "");
    exit_code =
        url_path ? call_api(client, "GET", url_path, NULL, 0, &page) : fail("out of memory");
    free(url_path);
    free(escaped_token);
    if (exit_code != CLI_EXIT_OK) break;

    const json_t *jobs = json_object_get(page, "jobs");
    const json_t *next = json_object_get(page, "next_page_token");
    if ((jobs && !json_is_array(jobs)) || (next && !json_is_null(next) && !json_is_string(next))) {
      exit_code = fail("%s answered GET /v1/jobs with a body that is not a job list",
                       cli_client_server(client));
      break;
    }
    size_t i;
    json_t *job;
    json_array_foreach(jobs, i, job) {
      if (limit >= 0 && (long)json_array_size(all) >= limit) break;
      json_array_append(all, job);
    }
    const char *next_token = json_string_value(next);
    if (!next_token || !*next_token || (limit >= 0 && (long)json_array_size(all) >= limit)) break;
    if (token && strcmp(token, next_token) == 0) {
      exit_code = fail("%s returned the same page token twice; stopping instead of looping",
                       cli_client_server(client));
      break;
    }
    free(token);
    token = strdup(next_token);
    json_decref(page);
    page = NULL;
    if (!token) exit_code = fail("out of memory");
  }

  if (exit_code == CLI_EXIT_OK) {
    if (opts->output == OUTPUT_JSON) {
      json_t *wrapper = json_pack("{s:O}", "jobs", all);
      print_json(wrapper);
      json_decref(wrapper);
    } else if (json_array_size(all) == 0) {
      if (state[0])
        fprintf(stderr, "kiln: no jobs in state %s\n", state);
      else
        fputs("kiln: no jobs\n", stderr);
    } else {
      print_job_table(all);
    }
  }
  free(token);
  json_decref(page);
  json_decref(all);
  return exit_code;
}

/* ---- command line ---- */

/* The value of an option given as "--name VALUE" or "--name=VALUE" (and
 * "-oVALUE" for short ones). Returns NULL, with a message, when missing. */
static const char *option_value(int argc, char **argv, int *i, const char *name) {
  const char *arg = argv[*i];
  size_t name_len = strlen(name);
  if (strncmp(arg, name, name_len) == 0 && arg[name_len] == '=') return arg + name_len + 1;
  if (name[1] != '-' && arg[name_len] != '\0') return arg + name_len; /* -ojson */
  if (*i + 1 >= argc) return NULL;
  return argv[++*i];
}

static int matches(const char *arg, const char *name) {
  size_t len = strlen(name);
  return strncmp(arg, name, len) == 0 &&
         (arg[len] == '\0' || arg[len] == '=' || (name[1] != '-' && name[0] == '-'));
}

/* Fills opts from argv. Options may come before or after the command.
 * Returns -1 to go on, or an exit code (help, version, usage error). */
static int parse_args(int argc, char **argv, options *opts) {
  memset(opts, 0, sizeof *opts);
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) break;
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      fputs(usage_text, stdout);
      return CLI_EXIT_OK;
    }
  }

  int only_positionals = 0;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    const char *value = NULL;
    if (only_positionals || arg[0] != '-' || strcmp(arg, "-") == 0) {
      if (!opts->command) {
        opts->command = arg;
      } else if (opts->n_args < (int)(sizeof opts->args / sizeof opts->args[0])) {
        opts->args[opts->n_args++] = arg;
      } else {
        return usage_error("too many arguments");
      }
      continue;
    }
    if (strcmp(arg, "--") == 0) {
      only_positionals = 1;
    } else if (strcmp(arg, "--version") == 0) {
      printf("kiln %s\n", KILN_VERSION);
      return CLI_EXIT_OK;
    } else if (matches(arg, "--token")) {
      if (!(value = option_value(argc, argv, &i, "--token")))
        return usage_error("--token needs a value");
      opts->token = value;
    } else if (matches(arg, "--server")) {
      if (!(value = option_value(argc, argv, &i, "--server")))
        return usage_error("--server needs a URL");
      opts->server = value;
    } else if (matches(arg, "--output") || matches(arg, "-o")) {
      if (!(value = option_value(argc, argv, &i, arg[1] == '-' ? "--output" : "-o")))
        return usage_error("%s needs 'table' or 'json'", arg[1] == '-' ? "--output" : "-o");
      if (strcmp(value, "table") == 0)
        opts->output = OUTPUT_TABLE;
      else if (strcmp(value, "json") == 0)
        opts->output = OUTPUT_JSON;
      else
        return usage_error("output format must be 'table' or 'json', got '%s'", value);
    } else if (matches(arg, "--request-id")) {
      if (!(value = option_value(argc, argv, &i, "--request-id")))
        return usage_error("--request-id needs a value");
      opts->request_id = value;
    } else if (matches(arg, "--state")) {
      if (!(value = option_value(argc, argv, &i, "--state")))
        return usage_error("--state needs a job state");
      opts->state = value;
    } else if (matches(arg, "--page-size")) {
      if (!(value = option_value(argc, argv, &i, "--page-size")))
        return usage_error("--page-size needs a number");
      opts->page_size = value;
    } else {
      return usage_error("unknown option '%s'", arg);
    }
  }
  return -1;
}

/* Checks the command, its argument count and which options it takes. */
static int check_command(const options *opts) {
  const char *cmd = opts->command;
  if (!cmd) return usage_error("no command given: use submit, get or ls");
  int is_submit = strcmp(cmd, "submit") == 0, is_get = strcmp(cmd, "get") == 0,
      is_ls = strcmp(cmd, "ls") == 0;
  if (!is_submit && !is_get && !is_ls) return usage_error("unknown command '%s'", cmd);
  if (opts->request_id && !is_submit)
    return usage_error("--request-id applies to 'kiln submit' only");
  if ((opts->state || opts->page_size) && !is_ls)
    return usage_error("%s applies to 'kiln ls' only", opts->state ? "--state" : "--page-size");
  if (is_submit && opts->n_args != 1)
    return usage_error("submit takes one spec file, e.g. 'kiln submit job.json'");
  if (is_get && opts->n_args != 1)
    return usage_error("get takes one job id, e.g. 'kiln get JOB_ID'");
  if (is_ls && opts->n_args != 0)
    return usage_error("ls takes no arguments, got '%s'", opts->args[0]);
  return -1;
}

/* "host:8080" -> "http://host:8080"; anything but http(s) is refused. */
static char *server_url(const char *server) {
  if (strstr(server, "://") == NULL) return cli_printf("http://%s", server);
  if (strncasecmp(server, "http://", 7) != 0 && strncasecmp(server, "https://", 8) != 0)
    return NULL;
  return strdup(server);
}

int main(int argc, char **argv) {
  options opts;
  int exit_code = parse_args(argc, argv, &opts);
  if (exit_code >= 0) return exit_code;
  exit_code = check_command(&opts);
  if (exit_code >= 0) return exit_code;

  const char *server = opts.server;
  if (!server) server = getenv("KILN_SERVER");
  if (!server || !*server) server = DEFAULT_SERVER;
  char *url = server_url(server);
  if (!url || url[strlen("http://")] == '\0' || strcmp(url, "https://") == 0) {
    free(url);
    return usage_error("the server must be an http:// or https:// URL, got '%s'", server);
  }

  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    free(url);
    return fail("cannot initialise libcurl");
  }
  char err[256], token[256] = "";
  if (opts.token) {
    snprintf(token, sizeof token, "%s", opts.token);
  } else if (getenv("KILN_TOKEN") && *getenv("KILN_TOKEN")) {
    snprintf(token, sizeof token, "%s", getenv("KILN_TOKEN"));
  } else if (getenv("KILN_TOKEN_FILE") && *getenv("KILN_TOKEN_FILE")) {
    FILE *f = fopen(getenv("KILN_TOKEN_FILE"), "r");
    if (!f || !fgets(token, sizeof token, f)) {
      if (f) fclose(f);
      free(url);
      curl_global_cleanup();
      return usage_error("cannot read a token from KILN_TOKEN_FILE=%s", getenv("KILN_TOKEN_FILE"));
    }
    fclose(f);
    token[strcspn(token, "\r\n")] = '\0';
  }
  cli_client *client = cli_client_new(url, "kiln/" KILN_VERSION, err, sizeof err);
  if (client && token[0] && cli_client_set_token(client, token, err, sizeof err) != CLI_OK) {
    cli_client_free(client);
    client = NULL;
  }
  if (!client) {
    exit_code = fail("%s", err);
  } else if (strcmp(opts.command, "submit") == 0) {
    exit_code = cmd_submit(client, &opts);
  } else if (strcmp(opts.command, "get") == 0) {
    exit_code = cmd_get(client, &opts);
  } else {
    exit_code = cmd_ls(client, &opts);
  }
  cli_client_free(client);
  curl_global_cleanup();
  free(url);

  /* A full disk or a closed pipe must not look like success to a script. */
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "kiln: cannot write output: %s\n", strerror(errno));
    if (exit_code == CLI_EXIT_OK) exit_code = CLI_EXIT_FAILED;
  }
  return exit_code;
}
