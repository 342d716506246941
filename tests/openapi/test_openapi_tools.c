/* test_openapi_tools.c — kilnd's /v1/openapi.json through public npm tools,
 * against a real kilnd with the real kiln-train:
 *   lint:   `redocly lint` with the recommended rules (redocly.yaml) finds
 *           no error and no warning;
 *   client: a client generated from the document by @hey-api/openapi-ts
 *           and compiled with tsc --strict (client_test.ts) creates a job,
 *           waits for it, reads its metrics and gets a typed 400.
 * Skipped (77, with the reason) when the npm packages of tests/openapi are
 * not installed (scripts/install-deps.sh installs them). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static char data_dir[256];
static char base_url[64];
static char admin_token[128];
static pid_t kilnd_pid;
static char work_dir[400]; /* WORK_DIR/lint or WORK_DIR/client: each test its own */
static char doc_path[600];

/* Runs command, printing its output; returns its exit status. */
static int run(const char *command) {
  static char out[1 << 16];
  int rc = it_run(out, sizeof out, command);
  printf("$ %s\n%s\n(exit %d)\n", command, out, rc);
  return rc;
}

static void redocly_recommended_rules_find_no_error_or_warning(void **state) {
  (void)state;
  char cmd[4096], report[700];
  snprintf(report, sizeof report, "%s/lint.json", work_dir);
  /* The readable report first, for the log; then the counts, as JSON. */
  snprintf(cmd, sizeof cmd,
           "cd '%s' && REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true "
           "node_modules/.bin/redocly lint --config redocly.yaml '%s'",
           OPENAPI_DIR, doc_path);
  int stylish = run(cmd);
  snprintf(cmd, sizeof cmd,
           "cd '%s' && REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true "
           "node_modules/.bin/redocly lint --config redocly.yaml --format json '%s' > '%s'",
           OPENAPI_DIR, doc_path, report);
  char ignored[1];
  it_run(ignored, sizeof ignored, cmd); /* its exit status is the one above */
  json_error_t err;
  json_t *root = json_load_file(report, 0, &err);
  if (!root) fail_msg("redocly's JSON report %s does not parse: %s", report, err.text);
  json_t *totals = json_object_get(root, "totals");
  json_int_t errors = json_integer_value(json_object_get(totals, "errors"));
  json_int_t warnings = json_integer_value(json_object_get(totals, "warnings"));
  printf("redocly lint: %lld errors, %lld warnings\n", (long long)errors, (long long)warnings);
  assert_non_null(json_object_get(totals, "errors"));
  assert_int_equal(errors, 0);
  assert_int_equal(warnings, 0);
  assert_int_equal(stylish, 0);
  json_decref(root);
}

static void generated_client_creates_waits_reads_metrics_and_gets_typed_errors(void **state) {
  (void)state;
  char cmd[4096], path[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s/client' '%s/out'", work_dir, work_dir);
  assert_int_equal(run(cmd), 0);
  snprintf(cmd, sizeof cmd,
           "'%s/node_modules/.bin/openapi-ts' -i '%s' -o '%s/client' -c @hey-api/client-fetch",
           OPENAPI_DIR, doc_path, work_dir);
  assert_int_equal(run(cmd), 0);
  snprintf(cmd, sizeof cmd, "cp '%s/client_test.ts' '%s/client_test.ts'", OPENAPI_DIR, work_dir);
  assert_int_equal(run(cmd), 0);
  /* CommonJS output: the generated imports have no file extensions. */
  snprintf(path, sizeof path, "%s/tsconfig.json", work_dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f,
          "{\"compilerOptions\": {\"strict\": true, \"target\": \"ES2022\", \"module\": "
          "\"commonjs\", \"moduleResolution\": \"node10\", \"lib\": [\"ES2022\", \"DOM\"], "
          "\"types\": [\"node\"], \"typeRoots\": [\"%s/node_modules/@types\"], "
          "\"skipLibCheck\": true, \"outDir\": \"out\"},\n \"files\": [\"client_test.ts\"]}\n",
          OPENAPI_DIR);
  assert_int_equal(fclose(f), 0);
  snprintf(cmd, sizeof cmd, "'%s/node_modules/.bin/tsc' -p '%s'", OPENAPI_DIR, path);
  assert_int_equal(run(cmd), 0);
  snprintf(cmd, sizeof cmd, "node '%s/out/client_test.js' '%s' '%s'", work_dir, base_url,
           admin_token);
  assert_int_equal(run(cmd), 0);
}

static int start_kilnd(void **state) {
  (void)state;
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-openapi-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  if (it_launch_kilnd(KILND_PATH, data_dir, KILN_TRAIN_PATH, NULL, NULL, &kilnd_pid, base_url,
                      sizeof base_url, admin_token, sizeof admin_token) != 0)
    return -1;
  /* The document as a client fetches it, kept in the build folder. */
  char *body = NULL;
  long status = it_request(base_url, NULL, "GET", "/v1/openapi.json", NULL, 0, &body);
  snprintf(doc_path, sizeof doc_path, "%s/openapi.json", work_dir);
  FILE *f = status == 200 ? fopen(doc_path, "w") : NULL;
  int ok = f && fputs(body, f) >= 0;
  if (f) ok &= fclose(f) == 0;
  if (!ok) fprintf(stderr, "GET /v1/openapi.json: %ld %s\n", status, body ? body : "");
  free(body);
  return ok ? 0 : -1;
}

static int stop_kilnd(void **state) {
  (void)state;
  return it_stop_kilnd(kilnd_pid, data_dir);
}

int main(int argc, char **argv) {
  const char *which = argc > 1 ? argv[1] : "";
  if (strcmp(which, "lint") != 0 && strcmp(which, "client") != 0) {
    printf("usage: %s lint|client\n", argv[0]);
    return 2;
  }
  const char *tools[] = {"redocly", "openapi-ts", "tsc"};
  for (size_t i = 0; i < sizeof tools / sizeof tools[0]; i++) {
    char path[600];
    snprintf(path, sizeof path, "%s/node_modules/.bin/%s", OPENAPI_DIR, tools[i]);
    if (access(path, X_OK) != 0) {
      printf("SKIPPED: %s is not installed (%s); scripts/install-deps.sh runs npm ci in "
             "tests/openapi\n",
             tools[i], path);
      return 77;
    }
  }
  snprintf(work_dir, sizeof work_dir, "%s/%s", WORK_DIR, which);
  mkdir(WORK_DIR, 0755);
  if (mkdir(work_dir, 0755) != 0 && access(work_dir, W_OK) != 0) {
    printf("cannot make %s\n", work_dir);
    return 1;
  }
  const struct CMUnitTest lint[] = {
      cmocka_unit_test(redocly_recommended_rules_find_no_error_or_warning),
  };
  const struct CMUnitTest client[] = {
      cmocka_unit_test(generated_client_creates_waits_reads_metrics_and_gets_typed_errors),
  };
  if (strcmp(which, "lint") == 0) return cmocka_run_group_tests(lint, start_kilnd, stop_kilnd);
  return cmocka_run_group_tests(client, start_kilnd, stop_kilnd);
}
