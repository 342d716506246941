/* commands_jobs.c — kiln's job commands: submit (and --wait), get, ls,
 * cancel, resume, explain and logs (-f follows until the job ends). */
#include "kiln.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define MAX_SPEC_BYTES     ((size_t)16 << 20)
#define MAX_LIST_PAGE_SIZE 1000              /* the API's cap on page_size */
#define MAX_NAME_COLUMN    40                /* display names are cut to this in tables */
#define LOG_WINDOW_BYTES   ((size_t)1 << 20) /* /logs sends at most the last MiB */
#define LOG_TAIL_BYTES     256
#define LOG_POLL_MS        1000

static const char *const job_states[] = {"QUEUED",    "STARTING", "RUNNING",   "STOPPING",
                                         "SUCCEEDED", "FAILED",   "CANCELLED", "PREEMPTED"};

int cli_read_spec(const char *path, char **out, size_t *out_len) {
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

int cli_cmd_submit(cli_client *client, const cli_options *opts) {
  const char *path = opts->args[0];
  char *spec = NULL, *url_path = NULL, *escaped = NULL;
  size_t spec_len = 0;
  json_t *job = NULL;
  int exit_code = cli_read_spec(path, &spec, &spec_len);
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
    exit_code = cli_fail("out of memory");
    goto cleanup;
  }
  exit_code = cli_call_api(client, "POST", url_path, spec, spec_len, &job);
  if (exit_code != CLI_EXIT_OK) goto cleanup;

  const char *id = cli_job_id_of(job);
  if (!id) {
    exit_code = cli_fail("the server accepted the job but its answer has no job id");
    goto cleanup;
  }
  if (opts->output == CLI_OUTPUT_JSON && !opts->wait) {
    cli_print_json(job);
  } else if (opts->output == CLI_OUTPUT_TABLE) {
    /* The id alone on stdout, so J=$(kiln submit job.json) works; the
     * state line for people, on stderr unless -v asks for it here. */
    const char *state = cli_string_at(job, "state");
    cli_put_clean(stdout, id);
    fputc('\n', stdout);
    FILE *human = opts->verbose ? stdout : stderr;
    fputs("job ", human);
    cli_put_clean(human, id);
    fputc(' ', human);
    cli_put_clean(human, state ? state : "-");
    fputc('\n', human);
    fflush(stdout);
  }
  if (opts->wait) exit_code = cli_watch_job(client, opts, id);

cleanup:
  json_decref(job);
  free(url_path);
  free(escaped);
  free(spec);
  return exit_code;
}

static void print_field(const char *key, const json_t *value) {
  char text[4096];
  cli_format_value(value, text, sizeof text);
  printf("%-15s ", key);
  cli_put_clean(stdout, text[0] ? text : "-");
  fputc('\n', stdout);
}

static void print_job(const json_t *job) {
  static const char *const keys[] = {"id",           "name",       "display_name", "state",
                                     "reason",       "message",    "priority",     "attempt",
                                     "create_time",  "start_time", "end_time",     "run_seconds",
                                     "queue_seconds"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    print_field(keys[i], json_object_get(job, keys[i]));
  char progress[CLI_CELL_BYTES];
  cli_format_progress(json_object_get(job, "progress"), progress, sizeof progress);
  json_t *progress_text = json_string(progress);
  print_field("progress", progress_text);
  json_decref(progress_text);

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
    if (cli_display_width(name) > width) width = cli_display_width(name);
  }
  json_object_foreach((json_t *)metrics, name, value) {
    char text[256];
    cli_format_value(value, text, sizeof text);
    fputs("  ", stdout);
    cli_put_clean(stdout, name);
    printf("%*s", (int)(width - cli_display_width(name) + 2), "");
    cli_put_clean(stdout, text);
    fputc('\n', stdout);
  }
}

/* One request on /v1/jobs/ID[suffix]; prints the answer with print (table
 * mode) or as JSON. */
static int job_request(cli_client *client, const cli_options *opts, const char *method,
                       const char *suffix, void (*print)(const json_t *)) {
  int exit_code = CLI_EXIT_OK;
  char *id = cli_job_path_id(opts->args[0], &exit_code);
  if (!id) return exit_code;
  char *url_path = cli_printf("/v1/jobs/%s%s", id, suffix);
  json_t *doc = NULL;
  exit_code =
      url_path ? cli_call_api(client, method, url_path, NULL, 0, &doc) : cli_fail("out of memory");
  if (exit_code == CLI_EXIT_OK) {
    if (opts->output == CLI_OUTPUT_JSON)
      cli_print_json(doc);
    else
      print(doc);
  }
  json_decref(doc);
  free(url_path);
  free(id);
  return exit_code;
}

int cli_cmd_get(cli_client *client, const cli_options *opts) {
  return job_request(client, opts, "GET", "", print_job);
}

/* "job ID STATE: message" after cancel and resume. */
static void print_job_line(const json_t *job) {
  const char *id = cli_job_id_of(job), *state = cli_string_at(job, "state");
  const char *message = cli_string_at(job, "message");
  fputs("job ", stdout);
  cli_put_clean(stdout, id ? id : "-");
  fputc(' ', stdout);
  cli_put_clean(stdout, state ? state : "-");
  if (message && *message) {
    fputs(": ", stdout);
    cli_put_clean(stdout, message);
  }
  fputc('\n', stdout);
}

int cli_cmd_cancel(cli_client *client, const cli_options *opts) {
  return job_request(client, opts, "POST", ":cancel", print_job_line);
}

int cli_cmd_resume(cli_client *client, const cli_options *opts) {
  return job_request(client, opts, "POST", ":resume", print_job_line);
}

static void print_explain(const json_t *doc) {
  const char *state = cli_string_at(doc, "state");
  fputs("state  ", stdout);
  cli_put_clean(stdout, state ? state : "-");
  fputc('\n', stdout);
  size_t i;
  const json_t *reason;
  json_array_foreach(json_object_get(doc, "reasons"), i, reason) {
    const char *code = cli_string_at(reason, "code"), *message = cli_string_at(reason, "message");
    fputs("  ", stdout);
    cli_put_clean(stdout, code ? code : "-");
    fputs("  ", stdout);
    cli_put_clean(stdout, message ? message : "");
    fputc('\n', stdout);
  }
}

int cli_cmd_explain(cli_client *client, const cli_options *opts) {
  return job_request(client, opts, "GET", ":explain", print_explain);
}

int cli_get_job(cli_client *client, const char *arg, json_t **out) {
  int exit_code = CLI_EXIT_OK;
  *out = NULL;
  char *id = cli_job_path_id(arg, &exit_code);
  if (!id) return exit_code;
  char *url_path = cli_printf("/v1/jobs/%s", id);
  exit_code =
      url_path ? cli_call_api(client, "GET", url_path, NULL, 0, out) : cli_fail("out of memory");
  free(url_path);
  free(id);
  return exit_code;
}

/* ID STATE PROGRESS NAME CREATED [METRIC]; the metric's latest value is
 * read from each job (the list leaves latest_metrics out). */
static int print_job_table(cli_client *client, const cli_options *opts, const json_t *all) {
  enum { COLUMNS = 6, TEXTS = 4 };
  const char *headers[COLUMNS] = {"ID", "STATE", "PROGRESS", "NAME", "CREATED", opts->metric};
  static const size_t max_cols[COLUMNS] = {64, 16, 24, MAX_NAME_COLUMN, 40, 24};
  const int columns = opts->metric ? COLUMNS : COLUMNS - 1;
  size_t rows = json_array_size(all);
  const char **cells = calloc(rows * COLUMNS + 1, sizeof *cells);
  char(*text)[TEXTS][CLI_CELL_BYTES] = calloc(rows + 1, sizeof *text);
  int exit_code = cells && text ? CLI_EXIT_OK : cli_fail("out of memory");
  for (size_t r = 0; r < rows && exit_code == CLI_EXIT_OK; r++) {
    const json_t *job = json_array_get(all, r);
    const char *id = cli_job_id_of(job), *name = cli_string_at(job, "display_name");
    cli_format_value(json_object_get(job, "state"), text[r][0], CLI_CELL_BYTES);
    cli_format_progress(json_object_get(job, "progress"), text[r][1], CLI_CELL_BYTES);
    cli_format_value(json_object_get(job, "create_time"), text[r][2], CLI_CELL_BYTES);
    snprintf(text[r][3], CLI_CELL_BYTES, "-");
    if (opts->metric && id) {
      json_t *full = NULL;
      exit_code = cli_get_job(client, id, &full);
      cli_format_value(json_object_get(json_object_get(full, "latest_metrics"), opts->metric),
                       text[r][3], CLI_CELL_BYTES);
      json_decref(full);
    }
    const char *row[COLUMNS] = {id ? id : "-", text[r][0], text[r][1], name && *name ? name : "-",
                                text[r][2],    text[r][3]};
    for (int c = 0; c < columns; c++) cells[r * (size_t)columns + (size_t)c] = row[c];
  }
  if (exit_code == CLI_EXIT_OK) cli_print_table(headers, max_cols, columns, cells, (int)rows);
  free(cells);
  free(text);
  return exit_code;
}

int cli_cmd_ls(cli_client *client, const cli_options *opts) {
  long limit = -1; /* -1: every job */
  if (opts->page_size) {
    char *end = NULL;
    errno = 0;
    limit = strtol(opts->page_size, &end, 10);
    if (errno || end == opts->page_size || *end || limit < 1)
      return cli_usage_error("--page-size needs a whole number >= 1, got '%s'", opts->page_size);
  }
  char state[16] = "";
  if (opts->state) {
    for (size_t i = 0; i < sizeof job_states / sizeof job_states[0]; i++)
      if (strcasecmp(opts->state, job_states[i]) == 0)
        snprintf(state, sizeof state, "%s", job_states[i]);
    if (!state[0])
      return cli_usage_error("--state must be one of QUEUED, STARTING, RUNNING, STOPPING, "
                             "SUCCEEDED, FAILED, CANCELLED, PREEMPTED; got '%s'",
                             opts->state);
  }

  json_t *all = json_array();
  json_t *page = NULL;
  char *token = NULL; /* page token of the next request, NULL for the first */
  int exit_code = all ? CLI_EXIT_OK : cli_fail("out of memory");
  while (exit_code == CLI_EXIT_OK) {
    long remaining = limit < 0 ? MAX_LIST_PAGE_SIZE : limit - (long)json_array_size(all);
    long page_size = remaining < MAX_LIST_PAGE_SIZE ? remaining : MAX_LIST_PAGE_SIZE;
    char *escaped_token = token ? cli_url_escape(token) : NULL;
    char *url_path = token && !escaped_token
                         ? NULL
                         : cli_printf("/v1/jobs?page_size=%ld%s%s%s%s", page_size,
                                      state[0] ? "&filter=state%3D" : "", state,
                                      token ? "&page_token=" : "", token ? escaped_token : "");
    exit_code = url_path ? cli_call_api(client, "GET", url_path, NULL, 0, &page)
                         : cli_fail("out of memory");
    free(url_path);
    free(escaped_token);
    if (exit_code != CLI_EXIT_OK) break;

    const json_t *jobs = json_object_get(page, "jobs");
    const json_t *next = json_object_get(page, "next_page_token");
    if ((jobs && !json_is_array(jobs)) || (next && !json_is_null(next) && !json_is_string(next))) {
      exit_code = cli_fail("%s answered GET /v1/jobs with a body that is not a job list",
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
      exit_code = cli_fail("%s returned the same page token twice; stopping instead of looping",
                           cli_client_server(client));
      break;
    }
    free(token);
    token = strdup(next_token);
    json_decref(page);
    page = NULL;
    if (!token) exit_code = cli_fail("out of memory");
  }

  if (exit_code == CLI_EXIT_OK) {
    if (opts->output == CLI_OUTPUT_JSON) {
      json_t *wrapper = json_pack("{s:O}", "jobs", all);
      cli_print_json(wrapper);
      json_decref(wrapper);
    } else if (json_array_size(all) == 0) {
      if (state[0])
        fprintf(stderr, "kiln: no jobs in state %s\n", state);
      else
        fputs("kiln: no jobs\n", stderr);
    } else {
      exit_code = print_job_table(client, opts, all);
    }
  }
  free(token);
  json_decref(page);
  json_decref(all);
  return exit_code;
}

/* ---- logs ---- */

static void pause_ms(long ms) {
  struct timespec pause = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&pause, NULL);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The last occurrence of needle in hay, or NULL. */
static const char *last_match(const char *hay, size_t hay_len, const char *needle, size_t len) {
  if (len == 0 || len > hay_len) return NULL;
  for (size_t at = hay_len - len + 1; at-- > 0;)
    if (memcmp(hay + at, needle, len) == 0) return hay + at;
  return NULL;
}

typedef struct log_follower {
  size_t printed;            /* bytes of the log printed so far */
  char tail[LOG_TAIL_BYTES]; /* the last bytes printed, to find our place in a cut log */
  size_t tail_len;
} log_follower;

/* Prints what body (the log's last MiB) has beyond what was printed. */
static void print_new_log(log_follower *f, const char *body, size_t len) {
  const char *from = body;
  if (len < LOG_WINDOW_BYTES) { /* the whole log: an offset says where we were */
    from = f->printed <= len ? body + f->printed : body + len;
  } else if (f->tail_len > 0) { /* a cut log: find the last bytes printed */
    const char *at = last_match(body, len, f->tail, f->tail_len);
    from = at ? at + f->tail_len : body;
  }
  size_t n = (size_t)(body + len - from);
  fwrite(from, 1, n, stdout);
  fflush(stdout);
  f->printed = len < LOG_WINDOW_BYTES ? len : f->printed + n;
  if (len >= LOG_TAIL_BYTES || n > 0) {
    size_t keep = len < LOG_TAIL_BYTES ? len : LOG_TAIL_BYTES;
    memcpy(f->tail, body + len - keep, keep);
    f->tail_len = keep;
  }
}

/* The state of job id, or "" having reported a failure; exit code in *exit_code. */
static void job_state(cli_client *client, const char *id, char *state, size_t len, int *exit_code) {
  char *url_path = cli_printf("/v1/jobs/%s", id);
  json_t *job = NULL;
  *exit_code =
      url_path ? cli_call_api(client, "GET", url_path, NULL, 0, &job) : cli_fail("out of memory");
  const char *s = cli_string_at(job, "state");
  snprintf(state, len, "%s", *exit_code == CLI_EXIT_OK && s ? s : "");
  json_decref(job);
  free(url_path);
}

int cli_cmd_logs(cli_client *client, const cli_options *opts) {
  int exit_code = CLI_EXIT_OK;
  char *id = cli_job_path_id(opts->args[0], &exit_code);
  if (!id) return exit_code;
  char *url_path = cli_printf("/v1/jobs/%s/logs", id);
  if (!url_path) {
    free(id);
    return cli_fail("out of memory");
  }
  log_follower follower = {0};
  double deadline = opts->timeout_s > 0 ? now_s() + opts->timeout_s : 0;
  for (;;) {
    /* The state first: a job that had ended before this read has all its
     * output in it, so the loop can stop after printing it. */
    char state[32] = "";
    if (opts->follow) {
      job_state(client, id, state, sizeof state, &exit_code);
      if (exit_code != CLI_EXIT_OK) break;
    }
    char err[CURL_ERROR_SIZE + 256];
    cli_response resp;
    int rc = cli_client_request(client, "GET", url_path, NULL, 0, &resp, err, sizeof err);
    if (rc != CLI_OK) {
      exit_code = cli_report_transport(client, rc, "GET", url_path, err);
      break;
    }
    if (resp.status < 200 || resp.status >= 300) {
      exit_code = cli_report_answer(client, "GET", url_path, &resp);
      cli_response_clear(&resp);
      break;
    }
    print_new_log(&follower, resp.body, resp.len);
    cli_response_clear(&resp);
    if (!opts->follow) break;
    int ended = cli_exit_for_state(state);
    if (ended >= 0) {
      exit_code = ended;
      break;
    }
    if (deadline > 0 && now_s() >= deadline) {
      exit_code = CLI_EXIT_TIMEOUT;
      fprintf(stderr, "kiln: timed out after %gs; job %s is %s\n", opts->timeout_s, id, state);
      break;
    }
    pause_ms(LOG_POLL_MS);
  }
  free(url_path);
  free(id);
  return exit_code;
}
