/* test_browser.c — runs the dashboard's browser tests (dashboard_test.js,
 * tools_test.js and experiment_test.js, in the system's headless Chromium,
 * driven over the DevTools protocol by node) against a real kilnd with the
 * real kiln-train. Skipped (exit 77, with the reason) when chromium or node
 * is not installed. The job page's screenshot
 * lands in ARTIFACTS_DIR/job-page.png. */
#include <setjmp.h>
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

static char data_dir[256];
static char base_url[64];
static char admin_token[128];
static pid_t kilnd_pid;

/* 1 when an executable named name is on PATH. */
static int on_path(const char *name) {
  const char *path = getenv("PATH");
  if (!path) return 0;
  char dir[4096];
  for (const char *p = path; *p;) {
    size_t len = strcspn(p, ":");
    snprintf(dir, sizeof dir, "%.*s/%s", (int)len, p, name);
    if (access(dir, X_OK) == 0) return 1;
    p += len;
    if (*p == ':') p++;
  }
  return 0;
}

/* Runs node on the browser test script in BROWSER_TEST_DIR; its exit status. */
static int run_script(const char *script) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", BROWSER_TEST_DIR, script);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    execlp("node", "node", path, base_url, admin_token, ARTIFACTS_DIR, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

static void dashboard_drives_jobs_from_login_to_screenshot(void **state) {
  (void)state;
  char shot[600];
  snprintf(shot, sizeof shot, "%s/job-page.png", ARTIFACTS_DIR);
  unlink(shot);
  assert_int_equal(run_script("dashboard_test.js"), 0);
  struct stat sb;
  assert_int_equal(stat(shot, &sb), 0);
  assert_true(sb.st_size > 10000); /* a PNG of a whole page, not an empty file */
}

/* Issue #22: compare, chart tools, checkpoints, profile, logs, phone width
 * and the dashboard's defects, on small real jobs (tools_test.js). */
static void dashboard_compares_jobs_charts_tools_and_fits_a_phone(void **state) {
  (void)state;
  assert_int_equal(run_script("tools_test.js"), 0);
}

/* Issue #21: an experiment's pages (the trials table, a scatter per
 * parameter, the trials' curves, the job page's link, the list, Cancel,
 * phone width) on a small real grid search (experiment_test.js). */
static void dashboard_shows_an_experiment_its_trials_scatters_and_curves(void **state) {
  (void)state;
  assert_int_equal(run_script("experiment_test.js"), 0);
}

static int start_kilnd(void **state) {
  (void)state;
  snprintf(data_dir, sizeof data_dir, "/tmp/kiln-browser-XXXXXX");
  if (!mkdtemp(data_dir)) return -1;
  /* One device, so the example waits behind the long job on any machine
   * and the queue view has a reason to show. */
  char pools[300];
  snprintf(pools, sizeof pools, "%s/pools.json", data_dir);
  FILE *f = fopen(pools, "w");
  if (!f) return -1;
  fputs("{\"pools\": [{\"name\": \"default\", \"devices\": 1}]}\n", f);
  if (fclose(f) != 0) return -1;
  return it_launch_kilnd(KILND_PATH, data_dir, KILN_TRAIN_PATH, "--pools", pools, &kilnd_pid,
                         base_url, sizeof base_url, admin_token, sizeof admin_token);
}

static int stop_kilnd(void **state) {
  (void)state;
  return it_stop_kilnd(kilnd_pid, data_dir);
}

int main(void) {
  const char *chromium = getenv("KILN_CHROMIUM");
  if (!(chromium && access(chromium, X_OK) == 0) && !on_path("chromium") &&
      !on_path("chromium-browser")) {
    printf("SKIPPED: the dashboard's browser test needs Chromium (Debian package 'chromium'; "
           "scripts/install-deps.sh installs it)\n");
    return 77;
  }
  if (!on_path("node")) {
    printf("SKIPPED: the dashboard's browser test needs node (Debian package 'nodejs')\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(dashboard_drives_jobs_from_login_to_screenshot),
      cmocka_unit_test(dashboard_compares_jobs_charts_tools_and_fits_a_phone),
      cmocka_unit_test(dashboard_shows_an_experiment_its_trials_scatters_and_curves),
  };
  return cmocka_run_group_tests(tests, start_kilnd, stop_kilnd);
}
