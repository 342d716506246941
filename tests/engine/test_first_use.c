/* The engine's process-wide choices (the CPU kernels' instruction-set path,
 * the f32 GEMM, the bf16 GEMM's kernel) are made on first use, and that
 * first use may come from several threads at once: the mirrored strategy
 * runs its replicas' graphs in threads of their own. Every thread must see
 * one choice, and making it must be no data race (a build with
 * -DKILN_TSAN=ON fails this program on one). Its first test must be the
 * first thing in the process to touch the engine. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"

enum { THREADS = 8, BATCH = 4 };

/* A small CNN: a convolution (im2col and kiln's GEMM where it runs), a
 * max pool and a dense layer, so one training step runs the ISA path's
 * kernels and the f32 GEMM. */
static const kn_layer_config layers[] = {
    {.type = KN_LAYER_CONV2D,
     .filters = 4,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_MAX_POOL2D},
    {.type = KN_LAYER_FLATTEN},
    {.type = KN_LAYER_DENSE, .units = 3, .use_bias = 1},
};

typedef struct seen {
  pthread_barrier_t *start;
  kn_isa isa;
  kn_gemm_kind gemm;
  kn_gemm_kernel bf16_kernel;
  float loss;
  int rc;
  char err[256];
} seen;

/* What one thread sees when it touches the engine, all threads at once
 * (released together by the barrier): the choices, then a training step
 * of its own model, which reads them again from inside the graph. */
static void *first_touch(void *arg) {
  seen *s = arg;
  pthread_barrier_wait(s->start);
  s->isa = kn_cpu_isa();
  s->gemm = kn_cpu_gemm();
  s->bf16_kernel = kn_gemm_bf16_kernel();
  kn_model_config cfg = {.input_ndim = 3,
                         .input_shape = {6, 6, 1},
                         .n_layers = 4,
                         .layers = layers,
                         .batch_size = BATCH,
                         .seed = 1};
  kn_model m;
  s->rc = kn_model_build(&cfg, &m, s->err, sizeof s->err);
  if (s->rc) return NULL;
  s->rc = kn_graph_compile(m.graph, 3, NULL, s->err, sizeof s->err);
  if (!s->rc) {
    float *x = kn_node_data(m.graph, m.x);
    for (int i = 0; i < BATCH * 36; i++) x[i] = (float)(i % 7) / 7.0f - 0.5f;
    int32_t *y = kn_node_data(m.graph, m.y);
    for (int i = 0; i < BATCH; i++) y[i] = i % 3;
    s->rc = kn_graph_run(m.graph, KN_RUN_TRAIN, BATCH, s->err, sizeof s->err);
    s->loss = *(float *)kn_node_data(m.graph, m.loss);
  }
  kn_model_free(&m);
  return NULL;
}

static void threads_touching_the_engine_first_all_at_once_see_one_choice(void **state) {
  (void)state;
  pthread_barrier_t start;
  assert_int_equal(pthread_barrier_init(&start, NULL, THREADS), 0);
  seen s[THREADS];
  pthread_t threads[THREADS];
  for (int i = 0; i < THREADS; i++) {
    memset(&s[i], 0, sizeof s[i]);
    s[i].start = &start;
    assert_int_equal(pthread_create(&threads[i], NULL, first_touch, &s[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_join(threads[i], NULL), 0);
  pthread_barrier_destroy(&start);
  printf("first use from %d threads at once: isa %s, f32 GEMM %s, bf16 kernel %s\n", THREADS,
         kn_isa_name(s[0].isa), kn_gemm_name(s[0].gemm), kn_gemm_kernel_name(s[0].bf16_kernel));
  assert_int_not_equal(s[0].isa, KN_ISA_AUTO);
  assert_int_not_equal(s[0].gemm, KN_GEMM_AUTO);
  for (int i = 0; i < THREADS; i++) {
    if (s[i].rc) fail_msg("thread %d: %s", i, s[i].err);
    assert_int_equal(s[i].isa, kn_cpu_isa());
    assert_int_equal(s[i].gemm, kn_cpu_gemm());
    assert_int_equal(s[i].bf16_kernel, kn_gemm_bf16_kernel());
    /* The same model, data and seed in every thread: the same loss, bit
     * for bit, whichever thread made the choices. */
    assert_memory_equal(&s[i].loss, &s[0].loss, sizeof s[0].loss);
  }
  assert_true(s[0].loss > 0.5f); /* 3 classes from random weights: about log 3 */
}

/* A path forced from one thread and read from others that start after it
 * is the one they run; AUTO goes back to the CPU's best. */
static void a_forced_path_is_seen_by_threads_started_after(void **state) {
  (void)state;
  char err[128];
  const kn_isa best = kn_cpu_isa();
  assert_int_equal(kn_cpu_set_isa(KN_ISA_BASELINE, err, sizeof err), KN_OK);
  pthread_barrier_t start;
  assert_int_equal(pthread_barrier_init(&start, NULL, 2), 0);
  seen s[2];
  pthread_t threads[2];
  for (int i = 0; i < 2; i++) {
    memset(&s[i], 0, sizeof s[i]);
    s[i].start = &start;
    assert_int_equal(pthread_create(&threads[i], NULL, first_touch, &s[i]), 0);
  }
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_join(threads[i], NULL), 0);
  pthread_barrier_destroy(&start);
  for (int i = 0; i < 2; i++) {
    if (s[i].rc) fail_msg("thread %d: %s", i, s[i].err);
    assert_int_equal(s[i].isa, KN_ISA_BASELINE);
    assert_int_equal(s[i].bf16_kernel, KN_GEMM_BF16_PORTABLE);
  }
  assert_int_equal(kn_cpu_set_isa(KN_ISA_AUTO, err, sizeof err), KN_OK);
  assert_int_equal(kn_cpu_isa(), best);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(threads_touching_the_engine_first_all_at_once_see_one_choice),
      cmocka_unit_test(a_forced_path_is_seen_by_threads_started_after),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
