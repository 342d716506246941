/* test_agent.c — kiln-agent without kilnd: Open MPI's daemon command as
 * its ssh receives it read back into argv, only orted/prted allowed, the
 * start command's fields checked by name, and the allocation table's
 * once-only start and drop. */
#define _GNU_SOURCE /* CPU_COUNT */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent.h"

static void orted_command_splits_like_a_remote_shell(void **state) {
  (void)state;
  /* What mpirun hands its plm_rsh_agent after the host (Open MPI 4.1.4). */
  char **argv = ag_shell_split(
      " orted -mca ess \"env\" -mca orte_hnp_uri \"704053248.0;tcp://10.77.0.2:43139\" "
      "--mca plm_rsh_agent \"/usr/bin/kiln-agent rsh\" -mca pmix \"^s1,s2,cray,isolated\" 'a b' "
      "c\\ d");
  assert_non_null(argv);
  const char *want[] = {"orted",
                        "-mca",
                        "ess",
                        "env",
                        "-mca",
                        "orte_hnp_uri",
                        "704053248.0;tcp://10.77.0.2:43139",
                        "--mca",
                        "plm_rsh_agent",
                        "/usr/bin/kiln-agent rsh",
                        "-mca",
                        "pmix",
                        "^s1,s2,cray,isolated",
                        "a b",
                        "c d"};
  size_t n = 0;
  while (argv[n]) n++;
  assert_int_equal(n, sizeof want / sizeof want[0]);
  for (size_t i = 0; i < n; i++) assert_string_equal(argv[i], want[i]);
  ag_argv_free(argv);
  assert_null(ag_shell_split("orted \"unbalanced"));
  assert_null(ag_shell_split("orted 'unbalanced"));
  assert_null(ag_shell_split("   "));
}

static void prefix_of_an_mpirun_by_full_path_is_dropped(void **state) {
  (void)state;
  char **argv = ag_shell_split("PATH=/usr/bin:$PATH ; export PATH ; LD_LIBRARY_PATH=/usr/lib:"
                               "$LD_LIBRARY_PATH ; export LD_LIBRARY_PATH ; /usr/bin/orted -mca "
                               "ess \"env\"");
  ag_strip_env_prefix(argv);
  assert_string_equal(argv[0], "/usr/bin/orted");
  assert_string_equal(argv[1], "-mca");
  assert_string_equal(argv[3], "env");
  assert_null(argv[4]);
  ag_argv_free(argv);
}

static void only_open_mpis_daemon_may_be_relayed(void **state) {
  (void)state;
  assert_true(ag_relay_allowed("orted"));
  assert_true(ag_relay_allowed("/usr/bin/orted"));
  assert_true(ag_relay_allowed("prted"));
  assert_false(ag_relay_allowed("sh"));
  assert_false(ag_relay_allowed("/bin/orted-evil"));
  assert_false(ag_relay_allowed("orted/sh"));
  assert_false(ag_relay_allowed(""));
  assert_false(ag_relay_allowed(NULL));
}

static int parse(const char *json, ag_start *st, char *err, size_t len) {
  json_t *cmd = json_loads(json, 0, NULL);
  assert_non_null(cmd);
  int rc = ag_start_parse(cmd, st, err, len);
  json_decref(cmd);
  return rc;
}

static void start_command_fields_are_read_and_checked(void **state) {
  (void)state;
  ag_start st;
  char err[512];
  assert_int_equal(
      parse("{\"seq\":4,\"kind\":\"start\",\"alloc\":\"alloc-1\",\"token\":\"kiln_a_x\","
            "\"job\":\"job-1\",\"attempt\":2,\"spec\":{\"epochs\":1,\"strategy\":{\"type\":"
            "\"parameter_server\",\"ps\":1,\"workers\":2}},\"dataset\":{\"name\":\"d\","
            "\"sha256\":\"ab\"},\"resume\":true,\"cores\":[1,3],\"gpus\":[],\"mpi\":{\"np\":2,"
            "\"hosts\":[{\"name\":\"a\",\"address\":\"10.0.0.1\",\"slots\":1},{\"name\":\"b\"}],"
            "\"network\":{\"oob_tcp_if_include\":\"10.77.0.0/"
            "24\"}},\"env\":{\"KILN_X\":\"1\",\"KILN_SHARED_DATA\":\"/mnt/d\"}}",
            &st, err, sizeof err),
      0);
  assert_string_equal(st.alloc, "alloc-1");
  assert_string_equal(st.token, "kiln_a_x");
  assert_int_equal(st.attempt, 2);
  assert_non_null(strstr(st.spec_json, "\"epochs\":1"));
  assert_int_equal(st.processes, 3); /* 2 workers + 1 server under mpirun */
  assert_true(st.has_dataset);
  assert_true(st.resume);
  assert_int_equal(st.n_cores, 2);
  assert_int_equal(st.cores[1], 3);
  assert_int_equal(st.np, 2);
  assert_int_equal(st.n_hosts, 2);
  assert_string_equal(st.hosts[1].name, "b");
  assert_int_equal(st.hosts[1].slots, 1);
  assert_string_equal(st.oob_if, "10.77.0.0/24");
  assert_int_equal(st.n_env, 2);
  assert_string_equal(st.env[0], "KILN_X=1");
  assert_string_equal(st.shared_data, "/mnt/d");
  ag_config cfg = {.name = "b"};
  assert_false(ag_start_launches(&cfg, &st)); /* host b prepares; a runs mpirun */
  cfg.name = "a";
  assert_true(ag_start_launches(&cfg, &st));
  ag_start_clear(&st);

  assert_int_equal(parse("{\"alloc\":\"a\",\"spec\":{}}", &st, err, sizeof err), -1);
  assert_non_null(strstr(err, "token"));
  ag_start_clear(&st);
  assert_int_equal(
      parse("{\"alloc\":\"a\",\"token\":\"t\",\"spec\":{},\"cores\":[-1]}", &st, err, sizeof err),
      -1);
  assert_non_null(strstr(err, "cores[0]"));
  ag_start_clear(&st);
  assert_int_equal(parse("{\"alloc\":\"a\",\"token\":\"t\",\"spec\":\"x\"}", &st, err, sizeof err),
                   -1);
  assert_non_null(strstr(err, "spec"));
  ag_start_clear(&st);
  assert_int_equal(parse("{\"alloc\":\"a\",\"token\":\"t\",\"spec\":{},\"mpi\":{\"np\":0,"
                         "\"hosts\":[]}}",
                         &st, err, sizeof err),
                   -1);
  assert_non_null(strstr(err, "mpi"));
  ag_start_clear(&st);
}

static void a_start_is_claimed_once_and_drop_kills_the_group(void **state) {
  (void)state;
  assert_int_equal(ag_table_claim("alloc-t"), 0);
  assert_int_equal(ag_table_claim("alloc-t"), 1);
  pid_t child = fork();
  if (child == 0) {
    setpgid(0, 0);
    pause();
    _exit(0);
  }
  setpgid(child, child);
  ag_table_set_group("alloc-t", child);
  assert_int_equal(ag_table_running(), 1);
  assert_int_equal(ag_table_signal("alloc-t", SIGKILL, 1), 0);
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFSIGNALED(status));
  assert_int_equal(WTERMSIG(status), SIGKILL);
  assert_true(ag_table_dropped("alloc-t"));
  assert_int_equal(ag_table_running(), 0);
  assert_int_equal(ag_table_signal("alloc-unknown", SIGTERM, 0), -1);
  /* A relay for a dropped allocation is refused. */
  assert_int_equal(ag_table_add_relay("alloc-t", 12345), -1);
  ag_table_finish("alloc-t");
  assert_int_equal(ag_table_claim("alloc-t"), 1); /* ended: a late start is ignored */
}

static void a_signal_before_the_group_exists_reaches_it(void **state) {
  (void)state;
  assert_int_equal(ag_table_claim("alloc-early"), 0);
  assert_int_equal(ag_table_signal("alloc-early", SIGTERM, 0), 0); /* still preparing */
  pid_t child = fork();
  if (child == 0) {
    setpgid(0, 0);
    for (int i = 0; i < 100; i++) usleep(100000);
    _exit(0);
  }
  setpgid(child, child);
  ag_table_set_group("alloc-early", child);
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFSIGNALED(status));
  assert_int_equal(WTERMSIG(status), SIGTERM);
  ag_table_finish("alloc-early");
}

static void *prepare_later(void *arg) {
  usleep(200 * 1000);
  int core = 0;
  ag_table_set_cores(arg, &core, 1); /* what ag_run does once prepared */
  return NULL;
}

static void a_relay_waits_for_its_hosts_preparation(void **state) {
  (void)state;
  assert_int_equal(ag_table_wait_ready("alloc-none", 10), 0); /* no start here: at once */
  assert_int_equal(ag_table_claim("alloc-prep"), 0);
  assert_int_equal(ag_table_wait_ready("alloc-prep", 50), -1); /* still preparing */
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, prepare_later, "alloc-prep"), 0);
  assert_int_equal(ag_table_wait_ready("alloc-prep", 5000), 0);
  pthread_join(t, NULL);
  assert_int_equal(ag_table_claim("alloc-fail"), 0);
  ag_table_finish("alloc-fail"); /* its preparation failed */
  assert_int_equal(ag_table_wait_ready("alloc-fail", 5000), -1);
}

static void core_indices_map_to_this_hosts_usable_cores(void **state) {
  (void)state;
  int usable[AG_MAX_CORES];
  const int n = ag_host_cores(usable, AG_MAX_CORES);
  assert_true(n >= 1);
  cpu_set_t set;
  int last = n - 1, past = n;
  assert_int_equal(ag_host_core_set(&last, 1, &set), 1);
  assert_int_equal(CPU_COUNT(&set), 1);
  assert_true(CPU_ISSET(usable[n - 1], &set)); /* index n-1: the last usable core's id */
  assert_int_equal(ag_host_core_set(&past, 1, &set), 0);
  assert_int_equal(CPU_COUNT(&set), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(orted_command_splits_like_a_remote_shell),
      cmocka_unit_test(prefix_of_an_mpirun_by_full_path_is_dropped),
      cmocka_unit_test(only_open_mpis_daemon_may_be_relayed),
      cmocka_unit_test(start_command_fields_are_read_and_checked),
      cmocka_unit_test(a_start_is_claimed_once_and_drop_kills_the_group),
      cmocka_unit_test(core_indices_map_to_this_hosts_usable_cores),
      cmocka_unit_test(a_signal_before_the_group_exists_reaches_it),
      cmocka_unit_test(a_relay_waits_for_its_hosts_preparation),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
