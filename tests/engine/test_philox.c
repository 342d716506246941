/* Dropout's generator (engine/philox.h): Philox4x32-10 gives Random123's
 * known answers; sixteen blocks at a time (AVX-512F) it gives the words it
 * gives one at a time; and a dropout mask is exactly that definition
 * (element i kept when word i of the stream (seed, step) over 2^8 is at
 * least ceil(rate x 2^24)) on one thread and on two, whatever the ranges'
 * edges. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "engine.h"
#include "philox.h"

static void philox_gives_the_known_answers(void **state) {
  (void)state;
  /* Random123's kat_vectors for philox4x32_10: counter, key, result. */
  static const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
      {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
       0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
       0x94fdcceb, 0x5001e420, 0x24126ea1}};
  for (int t = 0; t < 3; t++) {
    uint32_t c[4] = {kat[t][0], kat[t][1], kat[t][2], kat[t][3]};
    kn_philox4x32_10(c, kat[t][4], kat[t][5]);
    for (int w = 0; w < 4; w++) assert_int_equal(c[w], kat[t][6 + w]);
  }
}

static void sixteen_blocks_at_a_time_give_the_same_words(void **state) {
  (void)state;
#ifdef KN_PHILOX_GROUP
  if (!__builtin_cpu_supports("avx512f")) {
    skip(); /* this CPU has no AVX-512F: the one-at-a-time words are the only ones */
    return;
  }
  const uint64_t keys[3] = {0, 7, 0xfedcba9876543210ULL};
  const uint64_t streams[3] = {0, 1, 0x123456789abcULL};
  const uint64_t groups[4] = {0, 1, 12345, (1ULL << 57) + 3};
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 3; b++)
      for (int q = 0; q < 4; q++) {
        uint32_t words[64];
        kn_philox_group(keys[a], streams[b], groups[q], words);
        for (int k = 0; k < 64; k++)
          assert_int_equal(words[k], kn_philox_word(keys[a], streams[b], groups[q] * 64 + k));
      }
#else
  printf("no vector path on this architecture: the one-at-a-time words are the only ones\n");
  skip();
#endif
}

/* A dropout of rate 0.25 over ones, (rows, 997) in training, on threads. */
static void mask_on(int threads, int rows, float *out) {
  kn_graph *g = kn_graph_new();
  kn_graph_set_threads(g, threads);
  int d[2] = {rows, 997};
  kn_node x = kn_input(g, "x", KN_F32, 2, d);
  kn_node y = kn_dropout(g, x, 0.25f, 11);
  kn_graph_keep(g, y);
  char err[256];
  assert_int_equal(kn_graph_compile(g, rows, NULL, err, sizeof err), KN_OK);
  float *xd = kn_node_data(g, x);
  for (int i = 0; i < rows * 997; i++) xd[i] = 1.0f;
  assert_int_equal(kn_graph_run(g, KN_RUN_FORWARD_TRAIN, rows, err, sizeof err), KN_OK);
  const float *yd = kn_node_data(g, y);
  for (int i = 0; i < rows * 997; i++) out[i] = yd[i];
  kn_graph_free(g);
}

static void a_mask_is_the_definition_on_any_thread_count(void **state) {
  (void)state;
  enum { ROWS = 131 }; /* 130,607 elements: pool ranges that end mid-group */
  static float one[ROWS * 997], two[ROWS * 997];
  mask_on(1, ROWS, one);
  mask_on(2, ROWS, two);
  /* The first run in training mode draws on stream 0 (no step yet). */
  const uint32_t threshold = (uint32_t)ceil(0.25 * 16777216.0);
  int dropped = 0;
  for (int i = 0; i < ROWS * 997; i++) {
    const int kept = (kn_philox_word(11, 0, (uint64_t)i) >> 8) >= threshold;
    assert_float_equal(one[i], kept ? 1.0f / 0.75f : 0.0f, 0.0);
    assert_float_equal(two[i], one[i], 0.0);
    dropped += !kept;
  }
  /* 32,652 expected; 5 sigma is 780 */
  assert_in_range(dropped, 32652 - 780, 32652 + 780);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(philox_gives_the_known_answers),
      cmocka_unit_test(sixteen_blocks_at_a_time_give_the_same_words),
      cmocka_unit_test(a_mask_is_the_definition_on_any_thread_count),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
