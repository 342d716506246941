/* test_cli_runs.c — the kiln CLI for people who compare runs, against a
 * real kilnd with a stand-in trainer (stand_in_trainer.h): submit's bare
 * id, checkpoints named by step, ls with progress and a metric, compare,
 * ckpt ls's best mark, profile, and errors said once and in kiln's terms
 * (a missing token, a subcommand's own --help, a spec's line and column). */
#include <jansson.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "stand_in_trainer.h"

static char data_dir[256], work[300];
static char base_url[64], token[128];
static pid_t kilnd_pid;
static char *example_spec;
static char steps_job[64], fast_lr_job[64]; /* two finished "steps" jobs */

static int cli(char *out, size_t outlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Runs `kiln --server URL --token T ARGS` in work (stderr merged unless
 * ARGS redirects it); its exit status. */
static int cli(char *out, size_t outlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int status = it_vkiln(KILN_CLI_PATH, work, base_url, token, out, outlen, fmt, ap);
  va_end(ap);
  return status;
}

/* Writes work/NAME: the example spec as display_name with these fields over it. */
static void write_spec(const char *name, const char *display_name, const char *overrides) {
  json_t *spec = json_loads(example_spec, 0, NULL);
  json_t *more = json_loads(overrides ? overrides : "{}", 0, NULL);
  assert_non_null(more);
  json_object_update_recursive(spec, more);
  json_decref(more);
  json_object_set_new(spec, "display_name", json_string(display_name));
  char path[400];
  snprintf(path, sizeof path, "%s/%s", work, name);
  assert_int_equal(json_dump_file(spec, path, JSON_INDENT(2)), 0);
  json_decref(spec);
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

/* The line of out that starts with prefix, copied into line (or ""). */
static void line_starting(const char *out, const char *prefix, char *line, size_t len) {
  line[0] = '\0';
  for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
    if (strncmp(p, prefix, strlen(prefix)) == 0) {
      size_t n = strcspn(p, "\n");
      snprintf(line, len, "%.*s", (int)n, p);
      return;
    }
  }
}

/* Submits work/SPEC and follows the job to its end; its id into id (64
 * bytes), read from the -o json answer so that no test but submit's own
 * depends on what submit prints. */
static void run_job(const char *spec, char *id) {
  char out[65536];
  if (cli(out, sizeof out, "submit %s -o json 2>submit.err", spec) != 0) {
    /* What kiln said, and the end of kilnd's log: the folder goes at teardown. */
    char path[400], said[2048] = "", log[2048] = "";
    snprintf(path, sizeof path, "%s/submit.err", work);
    FILE *f = fopen(path, "r");
    if (f) {
      said[fread(said, 1, sizeof said - 1, f)] = '\0';
      fclose(f);
    }
    snprintf(path, sizeof path, "%s/data/kilnd.log", data_dir);
    if ((f = fopen(path, "r"))) {
      if (fseek(f, -(long)(sizeof log - 1), SEEK_END) != 0) rewind(f);
      log[fread(log, 1, sizeof log - 1, f)] = '\0';
      fclose(f);
    }
    fail_msg("kiln submit %s failed: %s\nkilnd's log ends:\n%s", spec, said, log);
  }
  json_t *job = json_loads(out, 0, NULL);
  assert_non_null(job);
  snprintf(id, 64, "%s", json_string_value(json_object_get(job, "id")));
  json_decref(job);
  assert_int_equal(cli(out, sizeof out, "watch %s", id), 0);
}

static int start_kilnd(void **state) {
  (void)state;
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-cli-runs-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  snprintf(work, sizeof work, "%s/work", data_dir);
  if (mkdir(work, 0700) != 0) return -1;
  char trainer[300];
  snprintf(trainer, sizeof trainer, "%s/trainer.sh", data_dir);
  FILE *f = fopen(trainer, "w");
  if (!f) return -1;
  fputs(it_stand_in_trainer, f);
  fclose(f);
  chmod(trainer, 0755);
  FILE *ex = fopen(EXAMPLES_DIR "/fmnist-mlp.json", "rb");
  if (!ex) return -1;
  char buf[8192];
  size_t n = fread(buf, 1, sizeof buf - 1, ex);
  fclose(ex);
  buf[n] = '\0';
  example_spec = strdup(buf);
  char data_sub[300];
  snprintf(data_sub, sizeof data_sub, "%s/data", data_dir);
  return it_launch_kilnd(KILND_PATH, data_sub, trainer, NULL, NULL, &kilnd_pid, base_url,
                         sizeof base_url, token, sizeof token);
}

static int stop_kilnd(void **state) {
  (void)state;
  int rc = it_stop_kilnd(kilnd_pid, data_dir);
  free(example_spec);
  return rc;
}

/* ---- tests ---- */

/* Defect: submit printed "job ID QUEUED" though its help says it prints the id. */
static void submit_prints_the_bare_id_on_stdout(void **state) {
  (void)state;
  char out[65536], id[64];
  write_spec("steps.json", "steps-a", NULL);
  run_job("steps.json", steps_job); /* the job the later tests look at */
  assert_int_equal(cli(out, sizeof out, "submit steps.json 2>/dev/null"), 0);
  size_t len = strlen(out);
  assert_true(len > 1 && out[len - 1] == '\n');
  assert_int_equal(strcspn(out, " \n"), len - 1); /* one word, then the newline */
  snprintf(id, sizeof id, "%.*s", (int)(len - 1), out);
  assert_int_equal(cli(out, sizeof out, "get %s", id), 0);
  /* The state line is for people: on stderr, or after the id with -v. */
  assert_int_equal(cli(out, sizeof out, "submit steps.json 2>&1 >/dev/null"), 0);
  assert_non_null(strstr(out, "QUEUED"));
  assert_int_equal(cli(out, sizeof out, "submit steps.json -v 2>/dev/null"), 0);
  char second[64];
  assert_int_equal(sscanf(out, "%63s", second), 1);
  char want[200];
  snprintf(want, sizeof want, "%s\njob %s QUEUED\n", second, second);
  assert_string_equal(out, want);
}

/* Defect: ckpt download / pin wanted an internal id; they take the step. */
static void ckpt_commands_name_checkpoints_by_step(void **state) {
  (void)state;
  char out[65536];
  assert_int_equal(cli(out, sizeof out, "ckpt download %s 8 -O eight.safetensors", steps_job), 0);
  char path[400];
  snprintf(path, sizeof path, "%s/eight.safetensors", work);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  int held = 0;
  assert_int_equal(fscanf(f, "%d", &held), 1);
  fclose(f);
  assert_int_equal(held, 8); /* the stand-in's checkpoint file holds its step */
  assert_int_equal(cli(out, sizeof out, "ckpt download %s 7", steps_job), 1);
  char want[160];
  snprintf(want, sizeof want, "job %s has no checkpoint at step 7", steps_job);
  assert_non_null(strstr(out, want));
  assert_int_equal(cli(out, sizeof out, "ckpt pin %s 8", steps_job), 0);
  assert_non_null(strstr(out, "step 8"));
  assert_non_null(strstr(out, " pinned"));
  assert_int_equal(cli(out, sizeof out, "ckpt unpin %s 9", steps_job), 1);
  assert_int_equal(cli(out, sizeof out, "ckpt pin %s eight", steps_job), 2);
  assert_non_null(strstr(out, "named by its step"));
  /* --id still names one by its internal id. */
  assert_int_equal(cli(out, sizeof out, "ckpt ls %s -o json", steps_job), 0);
  json_t *doc = json_loads(out, 0, NULL);
  json_t *first = json_array_get(json_object_get(doc, "checkpoints"), 0);
  long long first_id = (long long)json_integer_value(json_object_get(first, "id"));
  json_decref(doc);
  assert_int_equal(cli(out, sizeof out, "ckpt unpin --id %s %lld", steps_job, first_id), 0);
  assert_non_null(strstr(out, "step 2"));
}

/* Defect: every API error was printed twice, as message and as detail. */
static void an_api_error_is_printed_once(void **state) {
  (void)state;
  char out[8192];
  assert_int_equal(cli(out, sizeof out, "get no-such-job"), 1);
  assert_int_equal(count_of(out, "does not exist"), 1);
  assert_non_null(strstr(out, "NOT_FOUND"));
}

/* Defect: a missing token was explained as an HTTP header. */
static void a_missing_token_names_the_ways_to_give_one(void **state) {
  (void)state;
  char out[8192], cmd[1024];
  snprintf(cmd, sizeof cmd, "env -u KILN_TOKEN -u KILN_TOKEN_FILE '%s' --server %s ls",
           KILN_CLI_PATH, base_url);
  int status = it_run(out, sizeof out, cmd);
  print_message("$ %s -> %d\n%s", cmd, status, out);
  assert_int_equal(status, 1);
  assert_non_null(strstr(out, "--token"));
  assert_non_null(strstr(out, "KILN_TOKEN"));
  assert_non_null(strstr(out, "KILN_TOKEN_FILE"));
  assert_null(strstr(out, "Authorization"));
}

/* Defect: `kiln submit --help` printed the global help. */
static void every_subcommand_has_its_own_help(void **state) {
  (void)state;
  static const char *const commands[] = {"submit", "ls",      "get",     "watch",
                                         "logs",   "cancel",  "resume",  "explain",
                                         "ckpt",   "compare", "profile", "datasets"};
  char out[16384], want[64];
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
    assert_int_equal(cli(out, sizeof out, "%s --help", commands[i]), 0);
    snprintf(want, sizeof want, "Usage: kiln %s ", commands[i]);
    if (strncmp(out, want, strlen(want)) != 0)
      fail_msg("'kiln %s --help' printed: %.200s", commands[i], out);
  }
  assert_int_equal(cli(out, sizeof out, "--help"), 0);
  assert_non_null(strstr(out, "Exit status:"));
}

static void a_spec_that_is_not_json_gets_its_line_and_column(void **state) {
  (void)state;
  char out[8192], path[400];
  snprintf(path, sizeof path, "%s/bad.json", work);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("{\n  \"epochs\": 2,\n  \"seed\": ,\n}\n", f);
  fclose(f);
  assert_int_equal(cli(out, sizeof out, "submit bad.json"), 2);
  assert_non_null(strstr(out, "bad.json:3:"));
}

static void ls_shows_progress_in_steps_and_a_chosen_metric(void **state) {
  (void)state;
  char out[65536], line[1024];
  assert_int_equal(cli(out, sizeof out, "ls --metric val_loss"), 0);
  assert_non_null(strstr(out, "PROGRESS"));
  assert_non_null(strstr(out, "val_loss"));
  line_starting(out, steps_job, line, sizeof line);
  assert_non_null(strstr(line, "20/20 100%"));
  assert_non_null(strstr(line, "145")); /* val_loss at step 20: (20 - 8)^2 + 1 */
  assert_int_equal(cli(out, sizeof out, "get %s --metric val_loss", steps_job), 2);
  assert_non_null(strstr(out, "--metric applies to 'kiln ls' only"));
}

static void compare_prints_the_spec_fields_that_differ_and_final_metrics(void **state) {
  (void)state;
  char out[65536], line[1024];
  write_spec("fast.json", "steps-fast-lr", "{\"optimizer\":{\"learning_rate\":0.01}}");
  run_job("fast.json", fast_lr_job);
  assert_int_equal(cli(out, sizeof out, "compare %s %s", steps_job, fast_lr_job), 0);
  line_starting(out, "spec.optimizer.learning_rate", line, sizeof line);
  assert_non_null(strstr(line, "0.002"));
  assert_non_null(strstr(line, "0.01"));
  assert_null(strstr(out, "spec.seed")); /* the same in both */
  assert_null(strstr(out, "spec.optimizer.type"));
  line_starting(out, "final val_loss", line, sizeof line);
  assert_int_equal(count_of(line, "145"), 2);
  line_starting(out, "steps", line, sizeof line);
  assert_int_equal(count_of(line, "20/20 100%"), 2);
  assert_int_equal(cli(out, sizeof out, "compare %s %s -o json", steps_job, fast_lr_job), 0);
  json_t *doc = json_loads(out, 0, NULL);
  assert_non_null(doc);
  json_t *lr = json_object_get(json_object_get(doc, "spec_differences"), "optimizer.learning_rate");
  assert_int_equal(json_array_size(lr), 2);
  assert_float_equal(json_number_value(json_array_get(lr, 1)), 0.01, 1e-12);
  json_decref(doc);
  assert_int_equal(cli(out, sizeof out, "compare %s", steps_job), 2);
  assert_int_equal(cli(out, sizeof out, "compare %s no-such-job", steps_job), 1);
}

static void ckpt_ls_marks_the_best_checkpoint(void **state) {
  (void)state;
  char out[65536], line[1024];
  assert_int_equal(cli(out, sizeof out, "ckpt ls %s", steps_job), 0);
  line_starting(out, "8 ", line, sizeof line);
  assert_non_null(strstr(line, "*"));
  assert_non_null(strstr(line, "val_loss=1"));
  line_starting(out, "10 ", line, sizeof line);
  assert_null(strstr(line, "*"));
  assert_non_null(strstr(out, "* best by val_loss (lower is better)"));
}

static void profile_prints_the_table_and_where_the_trace_is(void **state) {
  (void)state;
  char out[65536], id[64], want[256];
  write_spec("profiled.json", "steps-profiled", NULL);
  run_job("profiled.json", id);
  assert_int_equal(cli(out, sizeof out, "profile %s", id), 0);
  assert_non_null(strstr(out, "matmul/dense  1.50"));
  snprintf(want, sizeof want, "trace: %s/v1/jobs/%s/profile", base_url, id);
  assert_non_null(strstr(out, want));
  assert_int_equal(cli(out, sizeof out, "profile %s", steps_job), 1);
  assert_non_null(strstr(out, "has no profile yet"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(submit_prints_the_bare_id_on_stdout),
      cmocka_unit_test(ckpt_commands_name_checkpoints_by_step),
      cmocka_unit_test(an_api_error_is_printed_once),
      cmocka_unit_test(a_missing_token_names_the_ways_to_give_one),
      cmocka_unit_test(every_subcommand_has_its_own_help),
      cmocka_unit_test(a_spec_that_is_not_json_gets_its_line_and_column),
      cmocka_unit_test(ls_shows_progress_in_steps_and_a_chosen_metric),
      cmocka_unit_test(compare_prints_the_spec_fields_that_differ_and_final_metrics),
      cmocka_unit_test(ckpt_ls_marks_the_best_checkpoint),
      cmocka_unit_test(profile_prints_the_table_and_where_the_trace_is),
  };
  return cmocka_run_group_tests(tests, start_kilnd, stop_kilnd);
}
