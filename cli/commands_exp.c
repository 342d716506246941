/* commands_exp.c — kiln exp: create an experiment from a file (and with
 * --wait follow it to its end, gating on --require against its best
 * trial), list experiments, show one with its trials, its best trial, and
 * cancel one. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "kiln.h"

#define EXP_POLL_MS 1000

static const char *const exp_states[] = {"RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"};

static void pause_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* "experiments/ID" or "ID" -> a path of /v1/experiments/ID + suffix. */
static char *exp_path(const char *arg, const char *suffix, int *exit_code) {
  const char *id = strncmp(arg, "experiments/", 12) == 0 ? arg + 12 : arg;
  if (!*id) {
    *exit_code = cli_usage_error("an experiment id is empty");
    return NULL;
  }
  char *escaped = cli_url_escape(id);
  char *path = escaped ? cli_printf("/v1/experiments/%s%s", escaped, suffix) : NULL;
  free(escaped);
  if (!path) *exit_code = cli_fail("out of memory");
  return path;
}

static void print_field(const char *key, const json_t *value) {
  char text[4096];
  cli_format_value(value, text, sizeof text);
  printf("%-15s ", key);
  cli_put_clean(stdout, text[0] ? text : "-");
  fputc('\n', stdout);
}

/* {"a": 1, "b": 2} as "a=1 b=2". */
static void format_values(const json_t *values, char *buf, size_t len) {
  size_t used = 0;
  const char *key;
  const json_t *v;
  buf[0] = '\0';
  json_object_foreach((json_t *)values, key, v) {
    char text[64];
    cli_format_value(v, text, sizeof text);
    used += (size_t)snprintf(buf + used, used < len ? len - used : 0, "%s%s=%s", used ? " " : "",
                             key, text);
    if (used >= len) break;
  }
}

static void print_best(const json_t *best) {
  char values[1024], metric[64], epochs[32];
  format_values(json_object_get(best, "values"), values, sizeof values);
  cli_format_value(json_object_get(best, "metric"), metric, sizeof metric);
  cli_format_value(json_object_get(best, "epochs"), epochs, sizeof epochs);
  printf("trial ");
  char index[32];
  cli_format_value(json_object_get(best, "index"), index, sizeof index);
  cli_put_clean(stdout, index);
  printf(" job ");
  cli_put_clean(stdout, cli_string_at(best, "job") ? cli_string_at(best, "job") : "-");
  printf(" metric ");
  cli_put_clean(stdout, metric);
  printf(" epochs ");
  cli_put_clean(stdout, epochs);
  printf(" values ");
  cli_put_clean(stdout, values);
  fputc('\n', stdout);
}

static void print_trials(const json_t *trials) {
  enum { COLUMNS = 7 };
  static const char *const headers[COLUMNS] = {"TRIAL",  "JOB",    "STATE", "RUNG",
                                               "EPOCHS", "METRIC", "VALUES"};
  static const size_t max_cols[COLUMNS] = {8, 40, 10, 6, 8, 16, 80};
  size_t rows = json_array_size(trials);
  const char **cells = calloc(rows * COLUMNS + 1, sizeof *cells);
  char(*text)[5][CLI_CELL_BYTES] = calloc(rows + 1, sizeof *text);
  if (!cells || !text) {
    free(cells);
    free(text);
    return;
  }
  for (size_t r = 0; r < rows; r++) {
    const json_t *t = json_array_get(trials, r);
    cli_format_value(json_object_get(t, "index"), text[r][0], CLI_CELL_BYTES);
    cli_format_value(json_object_get(t, "rung"), text[r][1], CLI_CELL_BYTES);
    cli_format_value(json_object_get(t, "epochs_trained"), text[r][2], CLI_CELL_BYTES);
    cli_format_value(json_object_get(t, "metric"), text[r][3], CLI_CELL_BYTES);
    format_values(json_object_get(t, "values"), text[r][4], CLI_CELL_BYTES);
    const char *job = cli_string_at(t, "job"), *state = cli_string_at(t, "trial_state");
    const char *row[COLUMNS] = {text[r][0],          job && *job ? job : "-",
                                state ? state : "-", text[r][1],
                                text[r][2],          text[r][3],
                                text[r][4]};
    for (int c = 0; c < COLUMNS; c++) cells[r * COLUMNS + (size_t)c] = row[c];
  }
  cli_print_table(headers, max_cols, COLUMNS, cells, (int)rows);
  free(cells);
  free(text);
}

static void print_experiment(const json_t *e) {
  static const char *const keys[] = {
      "id",          "display_name",  "state",          "message",       "create_time",
      "end_time",    "trial_count",   "trials_running", "trials_paused", "trials_stopped",
      "trials_done", "trials_failed", "epochs_trained"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    print_field(keys[i], json_object_get(e, keys[i]));
  const json_t *search = json_object_get(e, "search");
  print_field("searcher", json_object_get(search, "searcher"));
  print_field("metric", json_object_get(search, "metric"));
  print_field("mode", json_object_get(search, "mode"));
  const json_t *best = json_object_get(e, "best_trial");
  if (json_is_object(best)) {
    printf("%-15s ", "best_trial");
    print_best(best);
  } else {
    print_field("best_trial", NULL);
  }
}

/* GET /v1/experiments/ID[suffix] into *out. */
static int get_doc(cli_client *client, const char *arg, const char *suffix, json_t **out) {
  int exit_code = CLI_EXIT_OK;
  char *path = exp_path(arg, suffix, &exit_code);
  if (!path) return exit_code;
  exit_code = cli_call_api(client, "GET", path, NULL, 0, out);
  free(path);
  return exit_code;
}

/* Follows an experiment until it ends (or --timeout), one line on stderr
 * each time its counts change; the exit code as for a job, with --require
 * checked against its best trial's job. */
static int wait_experiment(cli_client *client, const cli_options *opts, const char *id) {
  double deadline = opts->timeout_s > 0 ? now_s() + opts->timeout_s : 0;
  char last[512] = "";
  json_t *e = NULL;
  int exit_code;
  for (;;) {
    json_decref(e);
    e = NULL;
    exit_code = get_doc(client, id, "", &e);
    if (exit_code != CLI_EXIT_OK) return exit_code;
    const char *state = cli_string_at(e, "state");
    char line[512], best[64] = "-";
    const json_t *b = json_object_get(e, "best_trial");
    if (json_is_object(b)) cli_format_value(json_object_get(b, "metric"), best, sizeof best);
    snprintf(line, sizeof line,
             "experiment %s %s: %lld running, %lld paused, %lld stopped, %lld done, %lld failed "
             "of %lld trials; %lld epochs; best %s",
             id, state ? state : "-",
             (long long)json_integer_value(json_object_get(e, "trials_running")),
             (long long)json_integer_value(json_object_get(e, "trials_paused")),
             (long long)json_integer_value(json_object_get(e, "trials_stopped")),
             (long long)json_integer_value(json_object_get(e, "trials_done")),
             (long long)json_integer_value(json_object_get(e, "trials_failed")),
             (long long)json_integer_value(json_object_get(e, "trial_count")),
             (long long)json_integer_value(json_object_get(e, "epochs_trained")), best);
    if (strcmp(line, last) != 0) {
      cli_put_clean(stderr, line);
      fputc('\n', stderr);
      snprintf(last, sizeof last, "%s", line);
    }
    if (state && strcmp(state, "RUNNING") != 0) break;
    if (deadline > 0 && now_s() >= deadline) {
      fprintf(stderr, "kiln: --timeout passed; experiment %s goes on\n", id);
      json_decref(e);
      return CLI_EXIT_TIMEOUT;
    }
    pause_ms(EXP_POLL_MS);
  }
  if (opts->output == CLI_OUTPUT_JSON)
    cli_print_json(e);
  else
    print_experiment(e);
  const char *state = cli_string_at(e, "state");
  exit_code = cli_exit_for_state(state);
  const json_t *best = json_object_get(e, "best_trial");
  if (exit_code == CLI_EXIT_OK && opts->n_requires > 0) {
    json_t *job = NULL;
    const char *job_id = json_is_object(best) ? cli_string_at(best, "job") : NULL;
    if (!job_id) {
      fprintf(stderr, "kiln: experiment %s has no best trial to check --require against\n", id);
      exit_code = CLI_EXIT_UNMET;
    } else if ((exit_code = cli_get_job(client, job_id, &job)) == CLI_EXIT_OK) {
      printf("best trial job %s:\n", job_id);
      if (cli_check_requires(opts, job) > 0) exit_code = CLI_EXIT_UNMET;
    }
    json_decref(job);
  }
  json_decref(e);
  return exit_code;
}

static int exp_create(cli_client *client, const cli_options *opts) {
  const char *path = opts->args[1];
  char *body = NULL, *url = NULL, *escaped = NULL;
  size_t len = 0;
  json_t *e = NULL;
  int exit_code = cli_read_spec(path, &body, &len);
  if (exit_code != CLI_EXIT_OK) return exit_code;
  json_error_t err;
  json_t *parsed = json_loadb(body, len, 0, &err);
  if (!json_is_object(parsed)) {
    if (parsed)
      fprintf(stderr,
              "kiln: %s: an experiment must be a JSON object ({\"spec\": ..., \"search\": ...})\n",
              path);
    else
      fprintf(stderr, "kiln: %s:%d:%d: not valid JSON: %s\n", path, err.line, err.column, err.text);
    json_decref(parsed);
    free(body);
    return CLI_EXIT_USAGE;
  }
  json_decref(parsed);
  if (opts->request_id) {
    escaped = cli_url_escape(opts->request_id);
    url = escaped ? cli_printf("/v1/experiments?request_id=%s", escaped) : NULL;
  } else {
    url = cli_printf("/v1/experiments");
  }
  exit_code = url ? cli_call_api(client, "POST", url, body, len, &e) : cli_fail("out of memory");
  const char *id = exit_code == CLI_EXIT_OK ? cli_string_at(e, "id") : NULL;
  if (exit_code == CLI_EXIT_OK && !id)
    exit_code = cli_fail("the server accepted the experiment but its answer has no id");
  if (exit_code == CLI_EXIT_OK) {
    if (opts->output == CLI_OUTPUT_JSON && !opts->wait) {
      cli_print_json(e);
    } else if (opts->output == CLI_OUTPUT_TABLE) {
      cli_put_clean(stdout, id);
      fputc('\n', stdout);
      fprintf(stderr, "experiment %s RUNNING with %lld trial(s)\n", id,
              (long long)json_integer_value(json_object_get(e, "trial_count")));
      fflush(stdout);
    }
    if (opts->wait) exit_code = wait_experiment(client, opts, id);
  }
  json_decref(e);
  free(url);
  free(escaped);
  free(body);
  return exit_code;
}

static int exp_ls(cli_client *client, const cli_options *opts) {
  char state[16] = "";
  if (opts->state) {
    for (size_t i = 0; i < sizeof exp_states / sizeof exp_states[0]; i++)
      if (strcasecmp(opts->state, exp_states[i]) == 0)
        snprintf(state, sizeof state, "%s", exp_states[i]);
    if (!state[0])
      return cli_usage_error(
          "--state must be one of RUNNING, SUCCEEDED, FAILED, CANCELLED; got '%s'", opts->state);
  }
  json_t *all = json_array();
  char *token = NULL;
  int exit_code = CLI_EXIT_OK;
  while (exit_code == CLI_EXIT_OK) {
    char *escaped = token ? cli_url_escape(token) : NULL;
    char *url =
        cli_printf("/v1/experiments?page_size=1000%s%s%s%s", state[0] ? "&filter=state%3D" : "",
                   state, escaped ? "&page_token=" : "", escaped ? escaped : "");
    free(escaped);
    json_t *page = NULL;
    exit_code = url ? cli_call_api(client, "GET", url, NULL, 0, &page) : cli_fail("out of memory");
    free(url);
    free(token);
    token = NULL;
    if (exit_code != CLI_EXIT_OK) break;
    json_array_extend(all, json_object_get(page, "experiments"));
    const char *next = cli_string_at(page, "next_page_token");
    if (next && *next) token = strdup(next);
    json_decref(page);
    if (!token) break;
  }
  if (exit_code == CLI_EXIT_OK && opts->output == CLI_OUTPUT_JSON) {
    json_t *doc = json_pack("{sO}", "experiments", all);
    cli_print_json(doc);
    json_decref(doc);
  } else if (exit_code == CLI_EXIT_OK) {
    enum { COLUMNS = 7 };
    static const char *const headers[COLUMNS] = {"ID",     "STATE", "SEARCHER", "TRIALS",
                                                 "EPOCHS", "BEST",  "NAME"};
    static const size_t max_cols[COLUMNS] = {40, 10, 8, 12, 8, 16, 40};
    size_t rows = json_array_size(all);
    const char **cells = calloc(rows * COLUMNS + 1, sizeof *cells);
    char(*text)[4][CLI_CELL_BYTES] = calloc(rows + 1, sizeof *text);
    if (!cells || !text) exit_code = cli_fail("out of memory");
    for (size_t r = 0; r < rows && exit_code == CLI_EXIT_OK; r++) {
      const json_t *e = json_array_get(all, r);
      snprintf(text[r][0], CLI_CELL_BYTES, "%lld/%lld",
               (long long)json_integer_value(json_object_get(e, "trials_done")),
               (long long)json_integer_value(json_object_get(e, "trial_count")));
      cli_format_value(json_object_get(e, "epochs_trained"), text[r][1], CLI_CELL_BYTES);
      cli_format_value(json_object_get(json_object_get(e, "best_trial"), "metric"), text[r][2],
                       CLI_CELL_BYTES);
      cli_format_value(json_object_get(json_object_get(e, "search"), "searcher"), text[r][3],
                       CLI_CELL_BYTES);
      const char *id = cli_string_at(e, "id"), *st = cli_string_at(e, "state");
      const char *name = cli_string_at(e, "display_name");
      const char *row[COLUMNS] = {id ? id : "-",
                                  st ? st : "-",
                                  text[r][3],
                                  text[r][0],
                                  text[r][1],
                                  text[r][2],
                                  name && *name ? name : "-"};
      for (int c = 0; c < COLUMNS; c++) cells[r * COLUMNS + (size_t)c] = row[c];
    }
    if (exit_code == CLI_EXIT_OK) cli_print_table(headers, max_cols, COLUMNS, cells, (int)rows);
    free(cells);
    free(text);
  }
  free(token);
  json_decref(all);
  return exit_code;
}

static int exp_get(cli_client *client, const cli_options *opts) {
  json_t *e = NULL, *trials = NULL;
  int exit_code = get_doc(client, opts->args[1], "", &e);
  if (exit_code == CLI_EXIT_OK)
    exit_code = get_doc(client, opts->args[1], "/trials?page_size=1000", &trials);
  if (exit_code == CLI_EXIT_OK) {
    if (opts->output == CLI_OUTPUT_JSON) {
      json_object_set(e, "trials", json_object_get(trials, "trials"));
      cli_print_json(e);
    } else {
      print_experiment(e);
      fputc('\n', stdout);
      print_trials(json_object_get(trials, "trials"));
    }
  }
  json_decref(e);
  json_decref(trials);
  return exit_code;
}

static int exp_best(cli_client *client, const cli_options *opts) {
  json_t *best = NULL;
  int exit_code = get_doc(client, opts->args[1], ":best", &best);
  if (exit_code == CLI_EXIT_OK) {
    if (opts->output == CLI_OUTPUT_JSON)
      cli_print_json(best);
    else
      print_best(best);
  }
  json_decref(best);
  return exit_code;
}

static int exp_cancel(cli_client *client, const cli_options *opts) {
  int exit_code = CLI_EXIT_OK;
  char *path = exp_path(opts->args[1], ":cancel", &exit_code);
  if (!path) return exit_code;
  json_t *e = NULL;
  exit_code = cli_call_api(client, "POST", path, NULL, 0, &e);
  if (exit_code == CLI_EXIT_OK) {
    if (opts->output == CLI_OUTPUT_JSON) {
      cli_print_json(e);
    } else {
      printf("experiment ");
      cli_put_clean(stdout, cli_string_at(e, "id") ? cli_string_at(e, "id") : "-");
      printf(" %s\n", cli_string_at(e, "state") ? cli_string_at(e, "state") : "-");
    }
  }
  json_decref(e);
  free(path);
  return exit_code;
}

int cli_cmd_exp(cli_client *client, const cli_options *opts) {
  const char *sub = opts->args[0];
  const int n = opts->n_args;
  if (strcmp(sub, "ls") == 0 && n == 1) return exp_ls(client, opts);
  if (strcmp(sub, "create") == 0 && n == 2) return exp_create(client, opts);
  if (strcmp(sub, "get") == 0 && n == 2) return exp_get(client, opts);
  if (strcmp(sub, "best") == 0 && n == 2) return exp_best(client, opts);
  if (strcmp(sub, "cancel") == 0 && n == 2) return exp_cancel(client, opts);
  if (strcmp(sub, "create") && strcmp(sub, "ls") && strcmp(sub, "get") && strcmp(sub, "best") &&
      strcmp(sub, "cancel"))
    return cli_usage_error("unknown exp command '%s': use create, ls, get, best or cancel", sub);
  return cli_usage_error("exp %s takes %s", sub,
                         strcmp(sub, "ls") == 0       ? "no more arguments"
                         : strcmp(sub, "create") == 0 ? "one file ('-' reads standard input)"
                                                      : "one experiment id");
}
