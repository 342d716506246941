/* Under mpirun -np 2: an MPI call of the strategies that fails comes back
 * as an engine error naming the rank and MPI's reason, instead of MPI
 * ending every process of the job before kiln can say what happened.
 * Here the two ranks sum a different number of values (the smaller one
 * fails; the other waits out the strategy's timeout). Without MPI in the
 * build the test is skipped with a message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#ifdef KILN_HAVE_MPI
#include <mpi.h>
#endif

#include "dist/dist.h"
#include "engine.h"

#if defined(__SANITIZE_ADDRESS__) && defined(KILN_HAVE_MPI)
/* The sanitizer build: a collective that failed, or that a rank gave up
 * waiting for, keeps its schedule inside Open MPI, which also keeps what
 * its start allocates past MPI_Finalize, and its progress thread drops a
 * few bytes in libevent's loop. Whole stacks on malloc let these
 * suppressions name Open MPI's libraries; every leak of kiln's own stays
 * an error. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
  return "fast_unwind_on_malloc=0";
}
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) {
  return "leak:libmpi.so\nleak:libopen-pal.so\nleak:libopen-rte.so\nleak:event_base_loop\n";
}
#endif

static int rank, world = 1;

static void build(kn_model *m) {
  static const kn_layer_config layers[] = {{.type = KN_LAYER_DENSE, .units = 3, .use_bias = 1}};
  kn_model_config mc = {
      .input_ndim = 1, .input_shape = {4}, .n_layers = 1, .layers = layers, .batch_size = 8};
  char err[256];
  if (kn_model_build(&mc, m, err, sizeof err) ||
      kn_graph_compile(m->graph, 7, NULL, err, sizeof err))
    fail_msg("%s", err);
}

static void a_failed_collective_is_an_error_naming_the_rank_and_mpis_reason(void **state) {
  (void)state;
#ifndef KILN_HAVE_MPI
  printf("SKIPPED: the strategies' MPI errors need kiln built with MPI (KILN_MPI=ON)\n");
  skip();
#endif
  if (world != 2) {
    printf("SKIPPED: run under mpirun -np 2 (this is %d process%s)\n", world,
           world == 1 ? "" : "es");
    skip();
  }
  kn_model m;
  build(&m);
  kn_distribution cfg = {.world_size = 2, .rank = rank, .timeout_s = 3.0};
  kn_dist *d = NULL;
  char err[1024] = "";
  if (kn_dist_new(&m, 8, &cfg, &d, err, sizeof err) != KN_OK) fail_msg("rank %d: %s", rank, err);
  /* Rank 0 sums 1 value, rank 1 sums 64: rank 0's receive is truncated. */
  double values[64] = {0};
  const int rc = kn_dist_sum(d, values, rank == 0 ? 1 : 64, err, sizeof err);
  printf("rank %d: rc %d: %s\n", rank, rc, err);
  assert_int_equal(rc, KN_EIO);
  char who[32];
  snprintf(who, sizeof who, "rank %d of 2", rank);
  if (!strstr(err, who)) fail_msg("rank %d's error does not say '%s': %s", rank, who, err);
  /* The rank whose collective failed says MPI's reason (Open MPI's
   * strings all start so); the other gave up waiting for it. */
  if (rank == 0 && !strstr(err, "MPI_ERR"))
    fail_msg("rank 0's error does not give MPI's reason: %s", err);
  if (rank == 1 && !strstr(err, "MPI_ERR") && !strstr(err, "waited more than 3 s"))
    fail_msg("rank 1's error is neither MPI's nor the timeout: %s", err);
  kn_dist_free(d);
  kn_model_free(&m);
}

int main(void) {
#ifdef KILN_HAVE_MPI
  int provided = 0;
  if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) return 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
#endif
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_failed_collective_is_an_error_naming_the_rank_and_mpis_reason),
  };
  const int failed = cmocka_run_group_tests(tests, NULL, NULL);
#ifdef KILN_HAVE_MPI
  MPI_Finalize();
#endif
  return failed;
}
