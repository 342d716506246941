/* The parameter_server strategy's checks, made alike on every rank before
 * any message moves: options that need the whole gradient in sync mode,
 * ranks out of range and replicas in a worker are refused with a sentence
 * naming them. (Training under mpirun is proven end to end by
 * tests/integration/strategies_match_single.sh.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"

static void build(kn_model *m) {
  static const kn_layer_config layers[] = {{.type = KN_LAYER_DENSE, .units = 3, .use_bias = 1}};
  kn_model_config mc = {
      .input_ndim = 1, .input_shape = {4}, .n_layers = 1, .layers = layers, .batch_size = 8};
  char err[256];
  if (kn_model_build(&mc, m, err, sizeof err) ||
      kn_graph_compile(m->graph, 7, NULL, err, sizeof err))
    fail_msg("%s", err);
}

/* kn_train's answer for dist, and its message in err. */
static int train_with(kn_distribution dist, double clip, char *err, size_t errlen) {
  kn_model m;
  build(&m);
  kn_dataset ds = {.n = 16, .ndim = 1, .shape = {4}, .example_size = 4, .n_classes = 3};
  ds.x = calloc(16 * 4, sizeof(float));
  ds.y = calloc(16, sizeof(int32_t));
  assert_non_null(ds.x);
  assert_non_null(ds.y);
  kn_train_config tc = {.epochs = 1,
                        .batch_size = 8,
                        .clip_global_norm = clip,
                        .optimizer = {.type = KN_OPT_SGD, .learning_rate = 0.1f},
                        .dist = dist};
  err[0] = '\0';
  int rc = kn_train(&m, &ds, NULL, &tc, NULL, NULL, err, errlen);
  kn_model_free(&m);
  kn_dataset_free(&ds);
  return rc;
}

static void sync_servers_refuse_global_clipnorm(void **state) {
  (void)state;
  char err[512];
  /* a worker and a server alike: neither holds the whole gradient */
  for (int rank = 0; rank < 2; rank++) {
    kn_distribution d = {.world_size = 1, .rank = rank, .ps_servers = 1};
    assert_int_equal(train_with(d, 1.0, err, sizeof err), KN_EINVAL);
    assert_non_null(strstr(err, "global_clipnorm needs the whole gradient"));
  }
}

static void ranks_and_replicas_out_of_range_are_refused(void **state) {
  (void)state;
  char err[512];
  kn_distribution d = {.world_size = 2, .rank = 4, .ps_servers = 2};
  assert_int_equal(train_with(d, 0.0, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "rank 4 of 2 workers and 2 servers: out of range"));
  kn_model other;
  build(&other);
  kn_model *others[1] = {&other};
  d = (kn_distribution){.n_replicas = 2, .replicas = others, .rank = 0, .ps_servers = 1};
  assert_int_equal(train_with(d, 0.0, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "one replica per worker, got 2"));
  kn_model_free(&other);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sync_servers_refuse_global_clipnorm),
      cmocka_unit_test(ranks_and_replicas_out_of_range_are_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
