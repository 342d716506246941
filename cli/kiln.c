/* kiln.c — the kiln command-line client's entry: parses the command line,
 * finds the server and token, and runs one command (commands_*.c). Exit
 * codes are made for CI and listed in `kiln --help`. */
#include "kiln.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#ifndef KILN_VERSION
#define KILN_VERSION "0.0.0-dev"
#endif

#define DEFAULT_SERVER "http://127.0.0.1:8080"

static const char usage_text[] =
    "kiln " KILN_VERSION " - submit, follow and gate on training jobs of a kiln server\n"
    "\n"
    "Usage: kiln [OPTIONS] COMMAND [ARGS]\n"
    "\n"
    "Jobs:\n"
    "  submit SPEC.json    create a job from a JSON job spec ('-' reads standard input)\n"
    "                      and print its id (alone on stdout: J=$(kiln submit s.json));\n"
    "                      with --wait, follow it to its end\n"
    "  ls [--metric NAME]  list jobs: ID, STATE, PROGRESS (steps), NAME, CREATED, and\n"
    "                      the latest value of metric NAME\n"
    "  compare JOB JOB...  the spec fields that differ (optimizer.learning_rate ...)\n"
    "                      and the final metrics, side by side\n"
    "  profile JOB         the job's step profile table and where its trace is\n"
    "  get JOB             one job: state, reason, attempt, times, latest metrics\n"
    "  watch JOB           a live progress bar (step, epoch, percent, ETA, loss and\n"
    "                      validation metrics) until the job ends; exits as below\n"
    "  logs JOB [-f]       the trainer's output; -f follows it until the job ends,\n"
    "                      then exits as watch does\n"
    "  cancel JOB          cancel a queued or running job (a running one checkpoints)\n"
    "  resume JOB          queue a cancelled or failed job again from its newest\n"
    "                      checkpoint\n"
    "  explain JOB         why a job waits, or where it is\n"
    "\n"
    "Experiments (hyperparameter search; each trial is a job):\n"
    "  exp create FILE     create an experiment from a JSON file ({\"spec\": a job spec,\n"
    "                      \"search\": grid, random or asha over spec paths}; '-' reads\n"
    "                      standard input) and print its id; --wait follows it to its\n"
    "                      end, and --require is checked on its best trial's job\n"
    "  exp ls              list experiments: ID, STATE, SEARCHER, TRIALS, EPOCHS, BEST\n"
    "  exp get EXP         one experiment and its trials (values, state, rung, metric)\n"
    "  exp best EXP        its best trial so far: job, metric, epochs, values\n"
    "  exp cancel EXP      cancel it: running trials are cancelled, paused ones stop\n"
    "\n"
    "Checkpoints and data:\n"
    "  ckpt ls JOB                      a job's checkpoints: STEP, BEST (*), metrics,\n"
    "                                   PINNED, ...\n"
    "  ckpt download JOB [STEP] [-O F]  the checkpoint at STEP (default: the newest)\n"
    "                                   as F (default JOB-stepN.safetensors), checked\n"
    "                                   against its sha256\n"
    "  ckpt pin|unpin JOB STEP          a pinned checkpoint outlives checkpoint.keep_last\n"
    "                                   (ckpt --id: CKPT is the checkpoint's id instead)\n"
    "  datasets upload FILE             upload a data set: --format csv|idx|images (csv\n"
    "                                   is taken from a .csv name), --label-column NAME\n"
    "                                   (csv), --display-name NAME\n"
    "  datasets ls                      built-in and uploaded data sets\n"
    "  export JOB [--step N] [-O F]     the model of the checkpoint at step N (default:\n"
    "                                   the newest) as ONNX, for ONNX Runtime, TensorRT\n"
    "                                   or OpenVINO, into F (default JOB-stepN.onnx)\n"
    "\n"
    "Worker hosts (an admin token):\n"
    "  agents [ls]         the kiln-agents: NAME, HOST, POOL, ADDRESS, CORES, GPUS,\n"
    "                      STATE (ONLINE or LOST), LAST SEEN\n"
    "  agents get NAME     one agent (by name or id) with its GPUs\n"
    "\n"
    "Options:\n"
    "  --server URL        the kilnd to talk to (default: $KILN_SERVER, else\n"
    "                      " DEFAULT_SERVER ")\n"
    "  --token TOKEN       bearer token (default: $KILN_TOKEN, else the contents of\n"
    "                      $KILN_TOKEN_FILE)\n"
    "  --cacert FILE       verify an https:// server with the CA certificates (PEM) in\n"
    "                      FILE (default: $KILN_CACERT, else the system's store)\n"
    "  -o, --output FMT    'table' (default) or 'json': the API's resources; submit\n"
    "                      --wait prints the job as it ended (or stood at --timeout),\n"
    "                      watch the metric points as JSON lines and then the job\n"
    "  --wait              submit: follow the job as watch does and exit as below;\n"
    "                      exp create: follow the experiment to its end\n"
    "  --timeout D         submit --wait, watch, logs -f: give up after D (90s, 10m,\n"
    "                      1h, 1h30m) with exit status 4; the job goes on\n"
    "  --require EXPR      submit --wait, watch: a bar the finished job's latest metric\n"
    "                      must pass, NAME OP VALUE with OP one of >= > <= < ==\n"
    "                      (e.g. 'val_accuracy>=0.88'); may repeat; a metric the job\n"
    "                      never reported is not met\n"
    "  -f, --follow        logs: keep printing until the job ends\n"
    "  --request-id ID     submit, exp create: a retry with the same ID returns the same\n"
    "                      job or experiment\n"
    "  --state STATE       ls: only jobs in STATE (QUEUED, STARTING, RUNNING, STOPPING,\n"
    "                      SUCCEEDED, FAILED, CANCELLED, PREEMPTED); exp ls: only\n"
    "                      experiments in STATE (RUNNING, SUCCEEDED, FAILED, CANCELLED)\n"
    "  --page-size N       ls: list at most N jobs (default: all of them, page by page)\n"
    "  --metric NAME       ls: a column of each job's latest NAME (e.g. val_accuracy)\n"
    "  -v, --verbose       submit: the job's state line on stdout after its id\n"
    "  -O, --output-file F ckpt download, export: where to write the file\n"
    "  --step N            export: the checkpoint of step N\n"
    "  -h, --help          print this help and exit; after a command, its own usage\n"
    "  --version           print the version and exit\n"
    "\n"
    "Exit status:\n"
    "  0  success; for submit --wait and watch: the job SUCCEEDED and met every\n"
    "     --require; for exp create --wait: the experiment SUCCEEDED and its best\n"
    "     trial met every --require\n"
    "  1  the job FAILED, or a request failed: the server answered with an error\n"
    "     (printed as 'kiln: STATUS: message'),\n"
    "     could not be reached, or answered something that is not kiln's API\n"
    "  2  usage error: a bad command line, or a file that cannot be read or a spec\n"
    "     that is not a JSON object\n"
    "  3  the job was CANCELLED\n"
    "  4  --timeout passed before the job ended\n"
    "  5  the job SUCCEEDED but a --require was not met (each is printed, met or not)\n";

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

/* An option by exact name, "--name=VALUE", or a short one with its value
 * attached ("-ojson"). */
static int matches(const char *arg, const char *name) {
  size_t len = strlen(name);
  return strncmp(arg, name, len) == 0 &&
         (arg[len] == '\0' || arg[len] == '=' || (name[1] != '-' && name[0] == '-'));
}

/* Fills opts from argv. Options may come before or after the command.
 * Returns -1 to go on, or an exit code (help, version, usage error). */
static int parse_args(int argc, char **argv, cli_options *opts) {
  memset(opts, 0, sizeof *opts);

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
        return cli_usage_error("too many arguments");
      }
      continue;
    }
#define VALUE(name, what)                                                                          \
  do {                                                                                             \
    if (!(value = option_value(argc, argv, &i, name)))                                             \
      return cli_usage_error(name " needs " what);                                                 \
  } while (0)
    if (strcmp(arg, "--") == 0) {
      only_positionals = 1;
    } else if (strcmp(arg, "--version") == 0) {
      printf("kiln %s\n", KILN_VERSION);
      return CLI_EXIT_OK;
    } else if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
      opts->help = 1;
    } else if (strcmp(arg, "--wait") == 0) {
      opts->wait = 1;
    } else if (strcmp(arg, "-v") == 0 || strcmp(arg, "--verbose") == 0) {
      opts->verbose = 1;
    } else if (strcmp(arg, "--id") == 0) {
      opts->by_id = 1;
    } else if (matches(arg, "--metric")) {
      VALUE("--metric", "a metric name");
      opts->metric = value;
    } else if (strcmp(arg, "-f") == 0 || strcmp(arg, "--follow") == 0) {
      opts->follow = 1;
    } else if (matches(arg, "--token")) {
      VALUE("--token", "a value");
      opts->token = value;
    } else if (matches(arg, "--cacert")) {
      VALUE("--cacert", "a file of CA certificates (PEM)");
      opts->cacert = value;
    } else if (matches(arg, "--server")) {
      VALUE("--server", "a URL");
      opts->server = value;
    } else if (matches(arg, "--output-file")) {
      VALUE("--output-file", "a file name");
      opts->output_file = value;
    } else if (matches(arg, "-O")) {
      VALUE("-O", "a file name");
      opts->output_file = value;
    } else if (matches(arg, "--output") || matches(arg, "-o")) {
      if (!(value = option_value(argc, argv, &i, arg[1] == '-' ? "--output" : "-o")))
        return cli_usage_error("%s needs 'table' or 'json'", arg[1] == '-' ? "--output" : "-o");
      if (strcmp(value, "table") == 0)
        opts->output = CLI_OUTPUT_TABLE;
      else if (strcmp(value, "json") == 0)
        opts->output = CLI_OUTPUT_JSON;
      else
        return cli_usage_error("output format must be 'table' or 'json', got '%s'", value);
    } else if (matches(arg, "--timeout")) {
      VALUE("--timeout", "a duration like 90s, 10m or 1h");
      opts->timeout_s = cli_parse_duration(value);
      if (opts->timeout_s <= 0)
        return cli_usage_error("--timeout must be a duration above zero like 90s, 10m, 1h or "
                               "1h30m, got '%s'",
                               value);
    } else if (matches(arg, "--require")) {
      VALUE("--require", "NAME OP VALUE, e.g. 'val_accuracy>=0.88'");
      char err[256];
      if (opts->n_requires == CLI_MAX_REQUIRES)
        return cli_usage_error("at most %d --require", CLI_MAX_REQUIRES);
      if (cli_parse_require(value, &opts->requires[opts->n_requires], err, sizeof err) != 0)
        return cli_usage_error("%s", err);
      opts->n_requires++;
    } else if (matches(arg, "--request-id")) {
      VALUE("--request-id", "a value");
      opts->request_id = value;
    } else if (matches(arg, "--state")) {
      VALUE("--state", "a job state");
      opts->state = value;
    } else if (matches(arg, "--step")) {
      VALUE("--step", "a step number");
      opts->step = value;
    } else if (matches(arg, "--page-size")) {
      VALUE("--page-size", "a number");
      opts->page_size = value;
    } else if (matches(arg, "--format")) {
      VALUE("--format", "csv, idx or images");
      opts->format = value;
    } else if (matches(arg, "--label-column")) {
      VALUE("--label-column", "a column name");
      opts->label_column = value;
    } else if (matches(arg, "--display-name")) {
      VALUE("--display-name", "a name");
      opts->display_name = value;
    } else {
      return cli_usage_error("unknown option '%s'", arg);
    }
#undef VALUE
  }
  return -1;
}

typedef struct command {
  const char *name;
  int (*run)(cli_client *client, const cli_options *opts);
  int min_args, max_args;
  const char *args_hint; /* for a wrong argument count */
  const char *usage;     /* `kiln COMMAND --help` */
} command;

static const command commands[] = {
    {"submit", cli_cmd_submit, 1, 1, "one spec file, e.g. 'kiln submit job.json'",
     "Usage: kiln submit SPEC.json [--wait [--timeout D] [--require EXPR]...] [--request-id ID]\n"
     "                  [-v] [-o json]\n"
     "Creates a job from a JSON job spec ('-' reads standard input) and prints its id\n"
     "alone on stdout (J=$(kiln submit job.json)); its state goes to stderr, or to\n"
     "stdout after the id with -v. --wait follows the job to its end as 'kiln watch'\n"
     "does and exits as it does.\n"},
    {"ls", cli_cmd_ls, 0, 0, "no arguments",
     "Usage: kiln ls [--state STATE] [--page-size N] [--metric NAME] [-o json]\n"
     "Lists jobs, newest first: ID, STATE, PROGRESS (steps done / planned, and the\n"
     "percent), NAME, CREATED, and with --metric the latest value of metric NAME.\n"},
    {"get", cli_cmd_get, 1, 1, "one job id, e.g. 'kiln get JOB_ID'",
     "Usage: kiln get JOB [-o json]\n"
     "One job: state, reason, attempt, times, progress, latest metrics.\n"},
    {"watch", cli_cmd_watch, 1, 1, "one job id",
     "Usage: kiln watch JOB [--timeout D] [--require EXPR]... [-o json]\n"
     "A live progress bar until the job ends; exits 0 / 1 / 3 / 4 / 5 (see kiln --help).\n"},
    {"logs", cli_cmd_logs, 1, 1, "one job id",
     "Usage: kiln logs JOB [-f [--timeout D]]\n"
     "The trainer's output; -f follows it until the job ends.\n"},
    {"cancel", cli_cmd_cancel, 1, 1, "one job id",
     "Usage: kiln cancel JOB\nCancels a queued or running job (a running one checkpoints).\n"},
    {"resume", cli_cmd_resume, 1, 1, "one job id",
     "Usage: kiln resume JOB\nQueues a cancelled or failed job again from its newest "
     "checkpoint.\n"},
    {"explain", cli_cmd_explain, 1, 1, "one job id",
     "Usage: kiln explain JOB\nWhy a job waits, or where it is.\n"},
    {"compare", cli_cmd_compare, 2, 8, "two to eight job ids",
     "Usage: kiln compare JOB JOB... [-o json]\n"
     "The spec fields that differ between the jobs, as flattened paths\n"
     "(optimizer.learning_rate), then each job's state, steps, run time and final\n"
     "metrics side by side.\n"},
    {"profile", cli_cmd_profile, 1, 1, "one job id",
     "Usage: kiln profile JOB\n"
     "The job's step profile table (the costliest nodes), then the URL of its Chrome\n"
     "trace (open it in chrome://tracing or Perfetto). The spec's profile.steps asks\n"
     "for a profile.\n"},
    {"ckpt", cli_cmd_ckpt, 2, 3,
     "'ls JOB', 'download JOB [STEP]', 'pin JOB STEP' or 'unpin JOB STEP'",
     "Usage: kiln ckpt ls JOB [-o json]\n"
     "       kiln ckpt download JOB [STEP] [-O FILE]\n"
     "       kiln ckpt pin|unpin JOB STEP\n"
     "Checkpoints are named by step (see 'kiln ckpt ls JOB'); --id names one by its\n"
     "internal id instead. ls marks the best one (by the job's checkpoint metric) with\n"
     "'*'. A download is checked against its sha256; a pinned checkpoint outlives\n"
     "checkpoint.keep_last.\n"},
    {"datasets", cli_cmd_datasets, 1, 2, "'upload FILE' or 'ls'",
     "Usage: kiln datasets upload FILE [--format csv|idx|images] [--label-column NAME]\n"
     "                                [--display-name NAME]\n"
     "       kiln datasets ls\n"},
    {"exp", cli_cmd_exp, 1, 2, "'create FILE', 'ls', 'get EXP', 'best EXP' or 'cancel EXP'",
     "Usage: kiln exp create FILE|- [--wait [--timeout D] [--require EXPR]...]\n"
     "                             [--request-id ID] [-o json]\n"
     "       kiln exp ls [--state STATE] [-o json]\n"
     "       kiln exp get|best|cancel EXP [-o json]\n"
     "An experiment is a base job spec and a search over spec paths:\n"
     "  {\"spec\": {...a job spec...}, \"search\": {\"searcher\": \"asha\",\n"
     "   \"metric\": \"val_accuracy\", \"max_trials\": 9, \"max_concurrent_trials\": 2,\n"
     "   \"parameters\": {\"optimizer.learning_rate\": {\"type\": \"log_uniform\",\n"
     "   \"min\": 0.0001, \"max\": 0.1}}, \"asha\": {\"max_epochs\": 9}}}\n"
     "create prints its id; --wait follows it to its end and exits 0 when it\n"
     "SUCCEEDED and its best trial's job meets every --require, 5 when one is not\n"
     "met, 1 when it FAILED, 3 when CANCELLED, 4 at --timeout. See docs/experiments.md.\n"},
    {"export", cli_cmd_export, 1, 1, "one job id, e.g. 'kiln export JOB -O model.onnx'",
     "Usage: kiln export JOB [--step N] [-O FILE]\n"
     "Writes the model of the job's newest checkpoint (or step N's) as an ONNX\n"
     "file: the inference graph, opset 17, a dynamic batch (default name\n"
     "JOB-stepN.onnx).\n"},
    {"agents", cli_cmd_agents, 0, 2, "'ls' (or nothing) or 'get NAME'",
     "Usage: kiln agents [ls] [-o json]\n"
     "       kiln agents get NAME [-o json]\n"
     "The worker hosts' kiln-agents (an admin token): name, host, pool, the address\n"
     "job traffic uses, cores, GPUs, state (ONLINE, or LOST once silent past its\n"
     "pool's grace window) and when each was last heard from. See docs/agents.md.\n"},
};

static const command *find_command(const char *name) {
  for (size_t i = 0; name && i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp(name, commands[i].name) == 0) return &commands[i];
  return NULL;
}

/* Checks the command, its argument count and which options it takes. */
static const command *check_command(const cli_options *opts, int *exit_code) {
  const char *cmd = opts->command;
  const command *found = find_command(cmd);
  *exit_code = CLI_EXIT_USAGE;
  if (!cmd) {
    cli_usage_error("no command given: use submit, ls, get, watch, logs, cancel, resume, explain, "
                    "compare, profile, ckpt, datasets, exp, export or agents");
    return NULL;
  }
  if (!found) {
    cli_usage_error("unknown command '%s'", cmd);
    return NULL;
  }
  int is_submit = found->run == cli_cmd_submit, is_watch = found->run == cli_cmd_watch;
  int is_logs = found->run == cli_cmd_logs, is_ls = found->run == cli_cmd_ls;
  /* exp create takes submit's options, exp ls ls's --state. */
  const int is_exp = found->run == cli_cmd_exp;
  if (is_exp && opts->n_args >= 1 && strcmp(opts->args[0], "create") == 0) is_submit = 1;
  if (is_exp && opts->n_args >= 1 && strcmp(opts->args[0], "ls") == 0 && !opts->page_size)
    is_ls = 1; /* --page-size stays 'kiln ls' only */
  const char *misplaced = NULL;
  if (opts->request_id && !is_submit)
    misplaced = "--request-id applies to 'kiln submit' and 'kiln exp create' only";
  if ((opts->state || opts->page_size) && !is_ls)
    misplaced =
        opts->state ? "--state applies to 'kiln ls' only" : "--page-size applies to 'kiln ls' only";
  if (opts->wait && !is_submit)
    misplaced = "--wait applies to 'kiln submit' and 'kiln exp create' only";
  if (opts->follow && !is_logs) misplaced = "-f applies to 'kiln logs' only";
  if (opts->n_requires && !(is_watch || (is_submit && opts->wait)))
    misplaced = "--require applies to 'kiln submit --wait' and 'kiln watch' only";
  if (opts->timeout_s > 0 && !(is_watch || (is_submit && opts->wait) || (is_logs && opts->follow)))
    misplaced = "--timeout applies to 'kiln submit --wait', 'kiln watch' and 'kiln logs -f' only";
  if (opts->output_file && found->run != cli_cmd_ckpt && found->run != cli_cmd_export)
    misplaced = "-O applies to 'kiln ckpt download' and 'kiln export' only";
  if (opts->step && found->run != cli_cmd_export)
    misplaced = "--step applies to 'kiln export' only";
  if (opts->by_id && found->run != cli_cmd_ckpt) misplaced = "--id applies to 'kiln ckpt' only";
  if (opts->metric && (!is_ls || is_exp)) misplaced = "--metric applies to 'kiln ls' only";
  if (opts->verbose && (!is_submit || is_exp)) misplaced = "-v applies to 'kiln submit' only";
  if (misplaced) {
    cli_usage_error("%s", misplaced);
    return NULL;
  }
  if (opts->n_args < found->min_args || opts->n_args > found->max_args) {
    cli_usage_error("%s takes %s", found->name, found->args_hint);
    return NULL;
  }
  *exit_code = -1;
  return found;
}

/* "host:8080" -> "http://host:8080"; anything but http(s) is refused. */
static char *server_url(const char *server) {
  if (strstr(server, "://") == NULL) return cli_printf("http://%s", server);
  if (strncasecmp(server, "http://", 7) != 0 && strncasecmp(server, "https://", 8) != 0)
    return NULL;
  return strdup(server);
}

int main(int argc, char **argv) {
  cli_options opts;
  int exit_code = parse_args(argc, argv, &opts);
  if (exit_code >= 0) return exit_code;
  if (opts.help) {
    const command *asked = find_command(opts.command);
    fputs(asked ? asked->usage : usage_text, stdout);
    return CLI_EXIT_OK;
  }
  const command *cmd = check_command(&opts, &exit_code);
  if (!cmd) return exit_code;

  const char *server = opts.server;
  if (!server) server = getenv("KILN_SERVER");
  if (!server || !*server) server = DEFAULT_SERVER;
  char *url = server_url(server);
  if (!url || url[strlen("http://")] == '\0' || strcmp(url, "https://") == 0) {
    free(url);
    return cli_usage_error("the server must be an http:// or https:// URL, got '%s'", server);
  }

  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    free(url);
    return cli_fail("cannot initialise libcurl");
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
      return cli_usage_error("cannot read a token from KILN_TOKEN_FILE=%s",
                             getenv("KILN_TOKEN_FILE"));
    }
    fclose(f);
    token[strcspn(token, "\r\n")] = '\0';
  }
  const char *cacert = opts.cacert;
  if (!cacert && getenv("KILN_CACERT") && *getenv("KILN_CACERT")) cacert = getenv("KILN_CACERT");
  if (cacert && access(cacert, R_OK) != 0) {
    int code = cli_usage_error("cannot read the CA certificates %s (%s): %s", cacert,
                               opts.cacert ? "--cacert" : "KILN_CACERT", strerror(errno));
    free(url);
    curl_global_cleanup();
    return code;
  }
  cli_client *client = cli_client_new(url, "kiln/" KILN_VERSION, err, sizeof err);
  if (client && cacert && cli_client_set_cacert(client, cacert, err, sizeof err) != CLI_OK) {
    cli_client_free(client);
    client = NULL;
  }
  if (client && token[0] && cli_client_set_token(client, token, err, sizeof err) != CLI_OK) {
    cli_client_free(client);
    client = NULL;
  }
  exit_code = client ? cmd->run(client, &opts) : cli_fail("%s", err);
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
