/* kiln.h — private to the kiln CLI: the parsed command line, the helpers
 * every command shares (messages, clean output, tables, one API call with
 * the error model turned into a message), and the commands themselves.
 * Commands print and return an exit code (cli.h); only main() exits. */
#ifndef KILN_CLI_KILN_H
#define KILN_CLI_KILN_H

#include <jansson.h>

#include "cli.h"

#define CLI_MAX_REQUIRES 16
#define CLI_CELL_BYTES   256

typedef enum cli_output { CLI_OUTPUT_TABLE = 0, CLI_OUTPUT_JSON } cli_output;

typedef enum cli_compare { CLI_GE, CLI_GT, CLI_LE, CLI_LT, CLI_EQ } cli_compare;

/* One --require: NAME OP VALUE, checked on the job's latest metrics. */
typedef struct cli_require {
  char name[64];
  cli_compare op;
  double value;
  const char *text; /* as typed, for messages */
} cli_require;

typedef struct cli_options {
  const char *server; /* NULL: $KILN_SERVER, else the default */
  const char *token;  /* NULL: $KILN_TOKEN, else $KILN_TOKEN_FILE's contents */
  const char *cacert; /* NULL: $KILN_CACERT, else the system's CA store */
  cli_output output;
  const char *command;
  const char *args[8]; /* positional arguments after the command */
  int n_args;
  const char *request_id; /* submit */
  const char *state;      /* ls */
  const char *page_size;  /* ls, as typed; checked by cli_cmd_ls */
  int wait;               /* submit --wait */
  double timeout_s;       /* --timeout; 0 = none */
  cli_require requires[CLI_MAX_REQUIRES];
  int n_requires;
  int follow;              /* logs -f */
  const char *output_file; /* ckpt download -O, export -O */
  const char *step;        /* export --step, as typed; checked by cli_cmd_export */
  const char *format;      /* datasets upload */
  const char *label_column;
  const char *display_name;
  const char *metric; /* ls --metric: a column of this metric's latest value */
  int by_id;          /* ckpt --id: CKPT is the internal id, not the step */
  int verbose;        /* -v: submit prints the job's state on stdout too */
  int help;           /* -h after a command: that command's usage */
} cli_options;

/* ---- messages and output (output.c) ---- */

/* "kiln: ..." on stderr; return CLI_EXIT_USAGE (with a hint) / CLI_EXIT_FAILED. */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Server text with control bytes replaced by '?', so it cannot garble a terminal. */
void cli_put_clean(FILE *out, const char *s);
size_t cli_display_width(const char *s);
/* Any JSON scalar as text; "-" for absent or null. */
void cli_format_value(const json_t *value, char *buf, size_t len);
const char *cli_string_at(const json_t *obj, const char *key);
/* A job's progress object as "STEP/TOTAL PCT%" (steps), "STEP" while the
 * plan is unknown, "-" when absent. */
void cli_format_progress(const json_t *progress, char *buf, size_t len);
void cli_print_json(const json_t *value);
/* Prints a table: headers, then rows of cells (rows x columns, row-major),
 * each column as wide as its widest cell (cut at max_cols[c] code points). */
void cli_print_table(const char *const *headers, const size_t *max_cols, int columns,
                     const char *const *cells, int rows);
/* "jobs/ID" or "ID" -> "ID", percent-encoded for a path; NULL (having
 * printed a usage error into *exit_code) when empty. malloc'd. */
char *cli_job_path_id(const char *arg, int *exit_code);
/* The job id of a resource: "id", else the tail of "name" ("jobs/ID"). */
const char *cli_job_id_of(const json_t *job);

/* Every item of a paged list (AIP-158): GETs path (no query of its own)
 * page by page, following next_page_token, and hands back the items under
 * key of every page in one array (*out, NULL on failure); exit code. */
int cli_list_all(cli_client *client, const char *path, const char *key, json_t **out);
/* Sends one request and hands back the answer's JSON object on a 2xx.
 * Everything else (unreachable server, API error, a body that is not JSON)
 * is reported on stderr and returns CLI_EXIT_FAILED. */
int cli_call_api(cli_client *client, const char *method, const char *path, const char *body,
                 size_t body_len, json_t **out);
/* Reports a non-2xx answer (the API's error model, or a snippet of the body)
 * and returns CLI_EXIT_FAILED. */
int cli_report_answer(cli_client *client, const char *method, const char *path,
                      const cli_response *resp);
/* Reports a cli_client_* failure code; returns CLI_EXIT_FAILED. */
int cli_report_transport(cli_client *client, int rc, const char *method, const char *path,
                         const char *err);

/* ---- argument values (watch.c) ---- */

/* "90s", "10m", "1h", "1h30m", "500ms", or bare seconds; -1 when malformed or 0. */
double cli_parse_duration(const char *text);
/* "val_accuracy>=0.88"; 0, or -1 with a message in err. */
int cli_parse_require(const char *text, cli_require *out, char *err, size_t errlen);

/* Reads a whole spec file ("-" is stdin) into a NUL-terminated buffer
 * (malloc'd); an exit code. */
int cli_read_spec(const char *path, char **out, size_t *out_len);
/* Checks every --require on a job resource's latest metrics, printing each
 * met or not; how many are not met. */
int cli_check_requires(const cli_options *opts, const json_t *job);

/* ---- commands ---- */

int cli_cmd_submit(cli_client *client, const cli_options *opts);
int cli_cmd_get(cli_client *client, const cli_options *opts);
int cli_cmd_ls(cli_client *client, const cli_options *opts);
int cli_cmd_cancel(cli_client *client, const cli_options *opts);
int cli_cmd_resume(cli_client *client, const cli_options *opts);
int cli_cmd_explain(cli_client *client, const cli_options *opts);
int cli_cmd_logs(cli_client *client, const cli_options *opts);
/* Follows a job until it ends (or --timeout) and returns its exit code,
 * after checking --require on a SUCCEEDED job. */
int cli_cmd_watch(cli_client *client, const cli_options *opts);
int cli_watch_job(cli_client *client, const cli_options *opts, const char *job_id);
/* The exit code for a job resource in a terminal state (0 / 1 / 3); -1 when
 * it has not ended. */
int cli_exit_for_state(const char *state);
int cli_cmd_ckpt(cli_client *client, const cli_options *opts);
int cli_cmd_export(cli_client *client, const cli_options *opts);
int cli_cmd_compare(cli_client *client, const cli_options *opts);
int cli_cmd_profile(cli_client *client, const cli_options *opts);
/* GETs a job (id as typed, "jobs/ID" too) into *out; exit code. */
int cli_get_job(cli_client *client, const char *arg, json_t **out);
int cli_cmd_datasets(cli_client *client, const cli_options *opts);
/* kiln exp create|ls|get|best|cancel (commands_exp.c). */
int cli_cmd_exp(cli_client *client, const cli_options *opts);
/* kiln agents [ls] | get NAME (commands_agents.c). */
int cli_cmd_agents(cli_client *client, const cli_options *opts);

#endif
