/* Mixed precision and recomputation: the cast kernels' rounding (known bit
 * patterns, ties to even, f16 overflow and underflow), gradients through
 * casts, the planned memory of a CNN in mixed_bfloat16 and with
 * recompute, mixed_bfloat16's matmuls on the bf16 GEMM (either kernel,
 * any thread count), the dynamic loss scaler, and short training runs
 * that learn. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "amx.h"
#include "engine.h"
#include "graph_internal.h"

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Runs x (1, n) through cast(to) and back to f32 in a graph; returns the
 * narrow bits in narrow[] and the widened values in wide[]. */
static void cast_through_graph(kn_dtype to, const float *x, int n, uint16_t *narrow, float *wide) {
  kn_graph *g = kn_graph_new();
  int dims[2] = {1, n};
  kn_node in = kn_input(g, "x", KN_F32, 2, dims);
  kn_node down = kn_cast(g, in, to);
  kn_node up = kn_cast(g, down, KN_F32);
  kn_graph_keep(g, down);
  kn_graph_keep(g, up);
  char err[256];
  assert_int_equal(kn_graph_compile(g, 1, NULL, err, sizeof err), KN_OK);
  memcpy(kn_node_data(g, in), x, (size_t)n * sizeof(float));
  assert_int_equal(kn_graph_run(g, KN_RUN_FORWARD, 1, err, sizeof err), KN_OK);
  memcpy(narrow, kn_node_data(g, down), (size_t)n * sizeof(uint16_t));
  memcpy(wide, kn_node_data(g, up), (size_t)n * sizeof(float));
  kn_graph_free(g);
}

static void bf16_cast_rounds_to_nearest_even(void **state) {
  (void)state;
  const float x[] = {
      1.0f,
      float_of(0x3f808000u), /* 1 + 2^-8: halfway between 0x3f80 and 0x3f81, tie to even */
      float_of(0x3f818000u), /* halfway between 0x3f81 and 0x3f82, tie to even */
      float_of(0x3f808001u), /* just past halfway: up */
      float_of(0x3f807fffu), /* just under halfway: down */
      -2.5f,
      float_of(0x7f7fffffu), /* FLT_MAX rounds up to inf */
      NAN,
  };
  const uint16_t want[] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0x3f80, 0xc020, 0x7f80};
  uint16_t narrow[8];
  float wide[8];
  cast_through_graph(KN_BF16, x, 8, narrow, wide);
  for (int i = 0; i < 7; i++) {
    assert_int_equal(narrow[i], want[i]);
    assert_int_equal(bits_of(wide[i]), (uint32_t)want[i] << 16);
  }
  assert_true((narrow[7] & 0x7f80) == 0x7f80 && (narrow[7] & 0x7f) != 0); /* still a NaN */
  assert_true(isnan(wide[7]));
}

/* kn_bf16_round_f32 (the kernels' rounding in place through bf16, on
 * whole words) gives the bits of the cast there and back,
 * kn_bf16_to_f32(kn_bf16_from_f32(x)), for every sign, exponent and high
 * mantissa with the low halves that decide the rounding: 0, ties, either
 * side of them, all ones; infinities and NaNs (signalling ones made
 * quiet, their payload kept) among them. */
static void bf16_rounding_in_place_matches_the_cast(void **state) {
  (void)state;
  const uint32_t lows[] = {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xc000u, 0xffffu, 0x1234u};
  for (uint32_t high = 0; high <= 0xffffu; high++)
    for (size_t k = 0; k < sizeof lows / sizeof lows[0]; k++) {
      const float x = float_of(high << 16 | lows[k]);
      const uint32_t want = bits_of(kn_bf16_to_f32(kn_bf16_from_f32(x)));
      if (bits_of(kn_bf16_round_f32(x)) != want)
        fail_msg("0x%08x: 0x%08x, want 0x%08x", high << 16 | lows[k], bits_of(kn_bf16_round_f32(x)),
                 want);
    }
}

static void f16_cast_saturates_to_inf_and_rounds_below_subnormals_to_zero(void **state) {
  (void)state;
  const float x[] = {
      65504.0f,                 /* the largest f16 */
      65519.0f,                 /* rounds down to it */
      65520.0f,                 /* halfway to 2^16: rounds to inf */
      -1e6f,                    /* -inf */
      ldexpf(1.0f, -24),        /* the smallest subnormal */
      ldexpf(1.0f, -25),        /* half of it: tie to even, 0 */
      ldexpf(3.0f, -25),        /* 1.5 subnormals: tie to even, 2 */
      1e-8f,                    /* below half the smallest subnormal: 0 */
      1.0f + ldexpf(1.0f, -11), /* halfway between 1 and 1 + 2^-10: to even, 1 */
      1.0f + ldexpf(3.0f, -11), /* halfway between 1 + 2^-10 and 1 + 2^-9: to even */
      float_of(0x38800000u),    /* 2^-14, the smallest normal */
  };
  const uint16_t want[] = {0x7bff, 0x7bff, 0x7c00, 0xfc00, 0x0001, 0x0000,
                           0x0002, 0x0000, 0x3c00, 0x3c02, 0x0400};
  const int n = (int)(sizeof want / sizeof want[0]);
  uint16_t narrow[16];
  float wide[16];
  cast_through_graph(KN_F16, x, n, narrow, wide);
  for (int i = 0; i < n; i++) assert_int_equal(narrow[i], want[i]);
  assert_true(isinf(wide[2]) && wide[2] > 0 && isinf(wide[3]) && wide[3] < 0);
  assert_true(wide[0] == 65504.0f && wide[4] == ldexpf(1.0f, -24) && wide[7] == 0.0f);
}

static void casts_between_other_types_are_refused(void **state) {
  (void)state;
  kn_graph *g = kn_graph_new();
  int dims[2] = {1, 4};
  kn_node in = kn_input(g, "y", KN_I32, 2, dims);
  assert_true(kn_cast(g, in, KN_F16) < 0);
  char err[256];
  assert_int_equal(kn_graph_error(g, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "cast"));
  kn_graph_free(g);
}

/* loss = sum(up(down(w)) * c): d loss / d w is c rounded through the
 * narrow type. */
static void gradient_through_casts(kn_dtype via, float c, float w0, float *grad, float *loss) {
  kn_graph *g = kn_graph_new();
  int dims[1] = {4};
  kn_node w = kn_param(g, "w", 1, dims, KN_INIT_ZEROS);
  kn_node up = kn_cast(g, kn_cast(g, w, via), KN_F32);
  kn_node l = kn_sum(g, kn_mul(g, up, kn_constant(g, 1, dims, c)), -1, 0);
  char err[256];
  assert_int_equal(kn_autodiff(g, l, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(g, 1, NULL, err, sizeof err), KN_OK);
  for (int i = 0; i < 4; i++) kn_params(g)[i] = w0;
  assert_int_equal(kn_graph_run(g, KN_RUN_TRAIN, 1, err, sizeof err), KN_OK);
  *grad = kn_grads(g)[0];
  *loss = *(float *)kn_node_data(g, l);
  kn_graph_free(g);
}

static void gradients_through_casts_are_rounded_like_the_narrow_type(void **state) {
  (void)state;
  float grad, loss;
  /* bf16 keeps f32's range: a tiny gradient survives, rounded to 8 bits. */
  gradient_through_casts(KN_BF16, 1e-8f, 1.0f, &grad, &loss);
  assert_true(grad > 0.0f && fabsf(grad - 1e-8f) <= 1e-8f * 0x1p-8f);
  /* f16 flushes it to zero (what loss scaling is for) ... */
  gradient_through_casts(KN_F16, 1e-8f, 1.0f, &grad, &loss);
  assert_true(grad == 0.0f);
  /* ... overflows a large one to inf ... */
  gradient_through_casts(KN_F16, 1e5f, 1.0f, &grad, &loss);
  assert_true(isinf(grad));
  /* ... and rounds a normal one to 11 bits; the forward reads w rounded. */
  gradient_through_casts(KN_F16, 0.1f, 1.0f + 0x1p-12f, &grad, &loss);
  assert_true(grad == 0x1.998p-4f); /* 0.1 in f16 */
  assert_true(fabsf(loss - 4.0f * 0.1f) < 1e-6f);
}

/* The Fashion-MNIST CNN of examples/fmnist-cnn.json. */
static const kn_layer_config cnn_layers[7] = {
    {.type = KN_LAYER_CONV2D,
     .name = "conv1",
     .filters = 32,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_MAX_POOL2D, .name = "pool1"},
    {.type = KN_LAYER_CONV2D,
     .name = "conv2",
     .filters = 64,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_MAX_POOL2D, .name = "pool2"},
    {.type = KN_LAYER_FLATTEN, .name = "flatten"},
    {.type = KN_LAYER_DENSE,
     .name = "dense1",
     .units = 128,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 10, .use_bias = 1}};

static kn_model_config cnn_config(int side, int batch, kn_precision precision, int recompute) {
  return (kn_model_config){.input_ndim = 3,
                           .input_shape = {side, side, 1},
                           .n_layers = 7,
                           .layers = cnn_layers,
                           .batch_size = batch,
                           .seed = 3,
                           .precision = precision,
                           .recompute = recompute};
}

/* Every pass but winograd: the passes these tests compare (and the float32
 * baselines of mixed precision) as they prepare the GEMMs' products;
 * winograd, which changes values to rounding and takes over those
 * products, is tested in test_passes.c and test_winograd.c. */
#define ALL_EXACT (KN_PASS_ALL & ~KN_PASS_WINOGRAD)

/* The test CNN without its gates: no relu, no max pool; every layer is
 * linear, so nothing but rounding tells mixed_bfloat16 from float32. */
static const kn_layer_config linear_layers[5] = {
    {.type = KN_LAYER_CONV2D,
     .name = "conv1",
     .filters = 32,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1},
    {.type = KN_LAYER_CONV2D,
     .name = "conv2",
     .filters = 64,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1},
    {.type = KN_LAYER_FLATTEN, .name = "flatten"},
    {.type = KN_LAYER_DENSE, .name = "dense1", .units = 128, .use_bias = 1},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 10, .use_bias = 1}};

static kn_model build_from(const kn_model_config *cfg, int threads, unsigned passes,
                           kn_plan_stats *stats) {
  kn_model m;
  char err[512] = "";
  if (kn_model_build(cfg, &m, err, sizeof err)) fail_msg("build: %s", err);
  kn_graph_set_threads(m.graph, threads);
  kn_graph_set_passes(m.graph, passes);
  if (kn_graph_compile(m.graph, 11, stats, err, sizeof err)) fail_msg("compile: %s", err);
  return m;
}

static kn_model build_cnn_passes(int side, int batch, kn_precision precision, int recompute,
                                 int threads, unsigned passes, kn_plan_stats *stats) {
  kn_model_config cfg = cnn_config(side, batch, precision, recompute);
  return build_from(&cfg, threads, passes, stats);
}

/* The passes that hand kiln's f32 GEMM work (columns read in place, bias
 * sums, a pool's gradient) apply only where it runs: elsewhere a test of
 * them is skipped, with the reason, rather than passed. */
static void require_kiln_gemm(void) {
  if (kn_cpu_gemm() != KN_GEMM_KILN) {
    print_message("SKIPPED: kiln's GEMM does not run here (no AVX-512F, or KILN_GEMM=openblas), "
                  "so this pass never applies\n");
    skip();
  }
}

static kn_model build_cnn_threaded(int side, int batch, kn_precision precision, int recompute,
                                   int threads, kn_plan_stats *stats) {
  return build_cnn_passes(side, batch, precision, recompute, threads, ALL_EXACT, stats);
}

static kn_model build_cnn(int side, int batch, kn_precision precision, int recompute,
                          kn_plan_stats *stats) {
  return build_cnn_threaded(side, batch, precision, recompute, 1, stats);
}

static void mixed_bfloat16_cnn_plans_activations_and_peak_in_at_most_55_percent(void **state) {
  (void)state;
  /* The two precisions with the same passes, pool_argmax off: it drops
   * the activations the pools read from what backward keeps in both, and
   * what is left is mostly the pools' float32 outputs, which hold their
   * argmax (printed below). */
  const unsigned passes = ALL_EXACT & ~KN_PASS_POOL_ARGMAX;
  kn_plan_stats f32, bf16, f16, f32_argmax, bf16_argmax;
  kn_model a = build_cnn_passes(28, 128, KN_PRECISION_FLOAT32, 0, 1, passes, &f32);
  kn_model b = build_cnn_passes(28, 128, KN_PRECISION_MIXED_BFLOAT16, 0, 1, passes, &bf16);
  kn_model e = build_cnn(28, 128, KN_PRECISION_FLOAT32, 0, &f32_argmax);
  kn_model h = build_cnn(28, 128, KN_PRECISION_MIXED_BFLOAT16, 0, &bf16_argmax);
  print_message("with pool_argmax: saved float32 %.2f MiB, mixed_bfloat16 %.2f MiB; arena %.2f -> "
                "%.2f MiB\n",
                f32_argmax.saved_bytes / 1048576.0, bf16_argmax.saved_bytes / 1048576.0,
                f32_argmax.arena_bytes / 1048576.0, bf16_argmax.arena_bytes / 1048576.0);
  assert_true(f32_argmax.arena_bytes < f32.arena_bytes &&
              bf16_argmax.arena_bytes < bf16.arena_bytes);
  assert_true(bf16_argmax.arena_bytes < f32_argmax.arena_bytes);
  kn_model_free(&e);
  kn_model_free(&h);
  kn_model c = build_cnn_passes(28, 128, KN_PRECISION_MIXED_FLOAT16, 0, 1, passes, &f16);
  print_message("saved for backward: float32 %.2f MiB, mixed_bfloat16 %.2f MiB (%.1f%%); arena "
                "peak %.2f -> %.2f MiB (%.1f%%); mixed_float16 %.2f MiB\n",
                f32.saved_bytes / 1048576.0, bf16.saved_bytes / 1048576.0,
                100.0 * (double)bf16.saved_bytes / (double)f32.saved_bytes,
                f32.arena_bytes / 1048576.0, bf16.arena_bytes / 1048576.0,
                100.0 * (double)bf16.arena_bytes / (double)f32.arena_bytes,
                f16.arena_bytes / 1048576.0);
  assert_true(f32.saved_bytes > 0);
  assert_true(bf16.saved_bytes * 100 <= f32.saved_bytes * 55);
  /* The whole planned peak too: mixed_bfloat16's matmuls read bf16, so no
   * f32 copy of an im2col or a layer input is planned, and the gradients
   * between a pool and its layer's GEMMs are bf16, the GEMMs writing them
   * rounded. */
  assert_true(bf16.arena_bytes * 100 <= f32.arena_bytes * 55);
  /* mixed_float16 keeps f16 copies of its im2cols for backward and widens
   * them for f32 GEMMs, so its columns stay materialized: it is measured
   * against float32 with materialized columns too (OpenBLAS's sgemm, where
   * the implicit-columns pass does not run). */
  kn_plan_stats f32_cols;
  char err[256];
  const kn_gemm_kind gemm = kn_cpu_gemm();
  assert_int_equal(kn_cpu_set_gemm(KN_GEMM_OPENBLAS, err, sizeof err), KN_OK);
  kn_model d = build_cnn_passes(28, 128, KN_PRECISION_FLOAT32, 0, 1, passes, &f32_cols);
  assert_int_equal(kn_cpu_set_gemm(gemm, err, sizeof err), KN_OK);
  assert_int_equal(f32_cols.n_implicit, 0);
  print_message("float32 with materialized columns: saved %.2f MiB, arena %.2f MiB; columns read "
                "in place by %d GEMM pairs here\n",
                f32_cols.saved_bytes / 1048576.0, f32_cols.arena_bytes / 1048576.0, f32.n_implicit);
  assert_true(f32.arena_bytes <= f32_cols.arena_bytes);
  assert_true(f16.saved_bytes >= bf16.saved_bytes &&
              f16.saved_bytes * 100 <= f32_cols.saved_bytes * 55);
  assert_true(f16.arena_bytes > bf16.arena_bytes && f16.arena_bytes < f32_cols.arena_bytes);
  kn_model_free(&d);
  /* Master weights and gradients stay f32. */
  assert_int_equal(bf16.param_bytes, f32.param_bytes);
  kn_model_free(&a);
  kn_model_free(&b);
  kn_model_free(&c);
}

static void fill_images(kn_model *m, int rows, uint64_t seed) {
  kn_rng rng;
  kn_rng_seed(&rng, seed);
  float *x = kn_node_data(m->graph, m->x);
  int32_t *y = kn_node_data(m->graph, m->y);
  for (int r = 0; r < rows; r++) {
    y[r] = (int32_t)kn_rng_below(&rng, 10);
    for (size_t i = 0; i < m->example_size; i++)
      x[(size_t)r * m->example_size + i] =
          kn_rng_uniform(&rng) + (i % 10 == (size_t)y[r] ? 0.5f : 0.0f);
  }
}

/* Losses of a few SGD steps on fixed batches. */
static void sgd_losses(kn_model *m, int steps, float *losses) {
  kn_optimizer_config oc = {.type = KN_OPT_SGD, .learning_rate = 0.05f};
  kn_optimizer *opt;
  char err[256];
  assert_int_equal(kn_optimizer_new(&oc, kn_param_count(m->graph), &opt, err, sizeof err), KN_OK);
  for (int s = 0; s < steps; s++) {
    fill_images(m, 16, 100 + (uint64_t)s);
    assert_int_equal(kn_graph_run(m->graph, KN_RUN_TRAIN, 16, err, sizeof err), KN_OK);
    losses[s] = *(float *)kn_node_data(m->graph, m->loss);
    kn_optimizer_step(opt, kn_params(m->graph), kn_grads(m->graph));
  }
  kn_optimizer_free(opt);
}

/* Four SGD steps of each model: the same losses and weights, bit for bit. */
static void assert_same_training_and_free(kn_model *a, kn_model *b) {
  float la[4], lb[4];
  sgd_losses(a, 4, la);
  sgd_losses(b, 4, lb);
  for (int s = 0; s < 4; s++) assert_true(bits_of(la[s]) == bits_of(lb[s]));
  assert_memory_equal(kn_params(a->graph), kn_params(b->graph), kn_param_count(a->graph) * 4);
  kn_model_free(a);
  kn_model_free(b);
}

static void recompute_lowers_the_planned_peak_and_keeps_the_losses(void **state) {
  (void)state;
  /* On OpenBLAS the columns are written out and the re-run im2col's
   * buffer outweighs what it frees (996,160 -> 1,208,128 bytes here): there
   * recompute is declined, which model_compile_keeps_the_smaller_plan
   * checks. */
  if (kn_cpu_gemm() != KN_GEMM_KILN) {
    print_message("SKIPPED: recompute lowers this CNN's peak only where kiln's GEMM reads the "
                  "columns in place (no AVX-512F here, or KILN_GEMM=openblas)\n");
    skip();
  }
  kn_plan_stats plain, rc;
  kn_model a = build_cnn(12, 16, KN_PRECISION_FLOAT32, 0, &plain);
  kn_model b = build_cnn(12, 16, KN_PRECISION_FLOAT32, 1, &rc);
  print_message("arena peak %zu -> %zu bytes with recompute (%d nodes re-run; it reports %zu "
                "without)\n",
                plain.arena_bytes, rc.arena_bytes, rc.n_recomputed,
                rc.arena_bytes_without_recompute);
  assert_true(rc.n_recomputed > 0);
  assert_int_equal(plain.n_recomputed, 0);
  assert_true(rc.arena_bytes < plain.arena_bytes);
  assert_true(rc.arena_bytes_without_recompute > rc.arena_bytes);
  assert_true(plain.arena_bytes_without_recompute == plain.arena_bytes);
  assert_same_training_and_free(&a, &b);
}

/* kn_model_compile with recompute keeps the smaller of the two plans: at
 * 12x12 and batch 16 the re-run ops' buffers are small and recompute
 * lowers the peak; at 28x28 and batch 128, with the columns read in place
 * and the pools keeping their argmax (kiln's GEMM), little is left to
 * re-create and the plan without recompute may be the smaller one. Either
 * way the peak is the lower of the two, with the same initial weights. */
static void model_compile_keeps_the_smaller_plan(void **state) {
  (void)state;
  static const int sizes[][2] = {{12, 16}, {28, 128}};
  for (int k = 0; k < 2; k++) {
    const int side = sizes[k][0], batch = sizes[k][1];
    kn_plan_stats plain, with, kept;
    /* every pass, as kn_model_compile compiles */
    kn_model a = build_cnn_passes(side, batch, KN_PRECISION_FLOAT32, 0, 1, KN_PASS_ALL, &plain);
    kn_model b = build_cnn_passes(side, batch, KN_PRECISION_FLOAT32, 1, 1, KN_PASS_ALL, &with);
    kn_model_config cfg = cnn_config(side, batch, KN_PRECISION_FLOAT32, 1);
    kn_model m;
    char err[512] = "";
    if (kn_model_build(&cfg, &m, err, sizeof err) ||
        kn_model_compile(&m, &cfg, 11, &kept, err, sizeof err))
      fail_msg("%s", err);
    print_message("%dx%d batch %d: %zu bytes without recompute, %zu with; kept %zu (%s)\n", side,
                  side, batch, plain.arena_bytes, with.arena_bytes, kept.arena_bytes,
                  kept.recompute_declined_bytes ? "recompute declined" : "recompute kept");
    assert_true(with.n_recomputed > 0);
    if (plain.arena_bytes < with.arena_bytes) {
      assert_int_equal(kept.arena_bytes, plain.arena_bytes);
      assert_int_equal(kept.recompute_declined_bytes, with.arena_bytes);
      assert_int_equal(kept.n_recomputed, 0);
    } else {
      assert_int_equal(kept.arena_bytes, with.arena_bytes);
      assert_int_equal(kept.recompute_declined_bytes, 0);
      assert_int_equal(kept.n_recomputed, with.n_recomputed);
    }
    assert_int_equal(plain.recompute_declined_bytes, 0);
    assert_memory_equal(kn_params(m.graph), kn_params(a.graph),
                        kn_param_count(a.graph) * sizeof(float));
    kn_model_free(&a);
    kn_model_free(&b);
    kn_model_free(&m);
  }
}

/* The largest normwise relative difference of a parameter's gradient
 * between ref and mixed after a training run on the same batch, and the
 * parameter that has it. */
/* The largest of the gradients' differences (of its norm) between two
 * models that ran a step on the same batch. */
static double gradient_difference(kn_model *ref, kn_model *mixed, const char **worst_name) {
  double worst = 0.0;
  for (int p = 0; p < kn_param_node_count(ref->graph); p++) {
    kn_node node = kn_param_node(ref->graph, p);
    int ndim, dims[KN_MAX_DIMS];
    kn_node_shape(ref->graph, node, &ndim, dims);
    size_t count = 1, off = kn_param_offset(ref->graph, node);
    for (int d = 0; d < ndim; d++) count *= (size_t)dims[d];
    double norm = 0, diff = 0;
    for (size_t i = off; i < off + count; i++) {
      double a = kn_grads(ref->graph)[i], b = kn_grads(mixed->graph)[i];
      norm += a * a;
      diff += (a - b) * (a - b);
    }
    if (!(norm > 0)) fail_msg("%s: a zero gradient", kn_node_name(ref->graph, node));
    if (sqrt(diff / norm) >= worst) {
      worst = sqrt(diff / norm);
      *worst_name = kn_node_name(ref->graph, node);
    }
  }
  return worst;
}

/* One training step of ref and of mixed on the same batch: their
 * gradients' largest difference. */
static double worst_gradient_difference(kn_model *ref, kn_model *mixed, const char **worst_name) {
  char err[256];
  fill_images(ref, 16, 7);
  fill_images(mixed, 16, 7);
  assert_int_equal(kn_graph_run(ref->graph, KN_RUN_TRAIN, 16, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_run(mixed->graph, KN_RUN_TRAIN, 16, err, sizeof err), KN_OK);
  return gradient_difference(ref, mixed, worst_name);
}

/* A residual block whose 3x3 convolutions the winograd pass takes over
 * under mixed_bfloat16 too: each convolution's output feeds a batch norm
 * (a float32 output with a bf16 copy), so its forward product and weight
 * gradient are marked and their padded input, read by nothing else, is a
 * view of the unpadded value. Its gradients stay as close to the same
 * graph's without the pass (the bf16 GEMM on padded copies) as bf16's
 * rounding allows: 2% of each gradient's norm (0.28% is seen; a
 * product reading a view as if it were padded is off by its whole norm). */
static const kn_layer_config block_layers[] = {
    {.type = KN_LAYER_CONV2D,
     .name = "c1",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME},
    {.type = KN_LAYER_BATCH_NORM, .name = "bn1"},
    {.type = KN_LAYER_ACTIVATION, .name = "r1", .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "c2",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME},
    {.type = KN_LAYER_BATCH_NORM, .name = "bn2"},
    {.type = KN_LAYER_ADD, .name = "res", .n_inputs = 2, .inputs = {2, 4}},
    {.type = KN_LAYER_ACTIVATION, .name = "r2", .activation = KN_ACT_RELU},
    {.type = KN_LAYER_GLOBAL_AVG_POOL2D, .name = "gap"},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 10, .use_bias = 1}};

/* cfg with every pass and with every one but winograd: `products` marked,
 * and the gradients within `bound` of each other's norm. */
static void check_winograd_against_the_gemm(const kn_model_config *cfg, int products,
                                            const char *what, double bound) {
  require_kiln_gemm();
  kn_plan_stats on;
  kn_model gemm = build_from(cfg, 1, ALL_EXACT, NULL);
  kn_model wino = build_from(cfg, 1, KN_PASS_ALL, &on);
  print_message("mixed_bfloat16 %s: %d products by Winograd\n", what, on.n_winograd);
  assert_int_equal(on.n_winograd, products);
  const char *name = "";
  const double worst = worst_gradient_difference(&gemm, &wino, &name);
  print_message("worst gradient difference %.4f (%s)\n", worst, name);
  if (worst > bound) fail_msg("%s's gradient differs by %g of its norm", name, worst);
  kn_model_free(&gemm);
  kn_model_free(&wino);
}

static void mixed_bfloat16_winograd_trains_as_the_bf16_gemm(void **state) {
  (void)state;
  kn_model_config cfg = cnn_config(12, 16, KN_PRECISION_MIXED_BFLOAT16, 0);
  cfg.layers = block_layers;
  cfg.n_layers = (int)(sizeof block_layers / sizeof block_layers[0]);
  /* c2's forward, weight and input gradients (c1 reads one channel), on
   * f32 products (bf16 products: the next test) */
  kn_winograd_set_bf16(0);
  check_winograd_against_the_gemm(&cfg, 3, "residual block", 0.02);
  kn_winograd_set_bf16(1);
}

/* The CNN under mixed_bfloat16: conv2's output feeds only the max pool's
 * bf16 copy and its input gradient only pool1's bf16 gradient, so both are
 * planned in bf16; Winograd takes them over all the same, writing the
 * rounded outputs alone, and the weight gradient beside them (three
 * products; 1 while a bf16 output kept them on the bf16 GEMM). The same
 * closeness to the GEMM's gradients as the residual block's. */
static void mixed_bfloat16_winograd_writes_bf16_outputs(void **state) {
  (void)state;
  const kn_model_config cfg = cnn_config(12, 16, KN_PRECISION_MIXED_BFLOAT16, 0);
  kn_winograd_set_bf16(0);
  check_winograd_against_the_gemm(&cfg, 3, "CNN", 0.02);
  kn_winograd_set_bf16(1);
}

/* The same two graphs on bf16 products (the default where the CPU has
 * AVX512-BF16: the transformed input and kernel rounded to bf16,
 * test_winograd.c). A product then errs by about 2% of its norm (6% of
 * its largest value): through two products forward and two back, with
 * relu and pool gates switching on the way, 8% (CNN) and 10% (residual
 * block) are seen; held to 25%, where a product on the wrong channels or
 * tiles is off by its whole norm. Skips without AVX512-BF16. */
static void mixed_bfloat16_winograd_on_bf16_products_stays_close(void **state) {
  (void)state;
  if (!kn_winograd_available() || !kn_winograd_bf16_products()) {
    print_message("SKIPPED: no AVX-512F or AVX512-BF16 on this CPU (or KILN_WINOGRAD set): "
                  "no bf16 products\n");
    skip();
  }
  /* (on AMX tiles the forward products and input gradients of up to 64
   * channels run directly, their columns read in place: amx_conv.h) */
  const int products = 3;
  kn_model_config cfg = cnn_config(12, 16, KN_PRECISION_MIXED_BFLOAT16, 0);
  check_winograd_against_the_gemm(&cfg, products, "CNN on bf16 products", 0.25);
  cfg.layers = block_layers;
  cfg.n_layers = (int)(sizeof block_layers / sizeof block_layers[0]);
  check_winograd_against_the_gemm(&cfg, products, "residual block on bf16 products", 0.25);
}

/* Every parameter's gradient in a mixed graph stays as close to float32's,
 * on the same weights and batch, as bf16's rounding allows: the backward
 * pass reads the narrow copies the way the float32 one reads the values.
 *
 * The bound. bf16 keeps 8 significant bits: rounding to nearest errs by at
 * most u = 2^-8 of the value, spread evenly over [-u, u] (standard
 * deviation u / sqrt 3). A gradient here is a chain of GEMMs fed by at
 * most a dozen such roundings (forward: each of the 4 layers' input and
 * weights; backward: the dy each layer's GEMMs read). In a GEMM the
 * errors of independent roundings add in quadrature like the terms do, so
 * each rounding moves the result by about u / sqrt 3 of its norm, and 12
 * of them by sqrt(12) u / sqrt 3 = 2u. Without gates (the linear twin of
 * the test CNN) every gradient is held within sqrt(12) u = 1.35%, sqrt 3
 * times that spread (0.5% is seen).
 *
 * With gates the arithmetic allows far more: a relu (or a max pool's
 * argmax) whose input lies within rounding of 0 (of the window's
 * runner-up) switches, and moves a whole gradient element. About u of a
 * layer's gates sit that close, so g gate layers move up to about
 * sqrt(2 g u) of the gradient's norm: the test CNN's first convolution's
 * gradient passes g = 5 (relu, pool, relu, pool, relu), up to 20%. 8.2%
 * is seen; the test CNN's gradients are held within 10%.
 *
 * The 3x3 convolutions run by Winograd on f32 products here: bf16
 * products add their own rounding (the test above). */
static void mixed_precision_gradients_stay_close_to_float32(void **state) {
  (void)state;
  const double u = 0x1p-8, linear_bound = sqrt(12.0) * u, gated_bound = 0.10;
  kn_winograd_set_bf16(0);
  for (int recompute = 0; recompute <= 1; recompute++) {
    kn_model_config cfg = cnn_config(12, 16, KN_PRECISION_FLOAT32, 0);
    cfg.layers = linear_layers;
    cfg.n_layers = 5;
    kn_model ref = build_from(&cfg, 1, KN_PASS_ALL, NULL);
    cfg.precision = KN_PRECISION_MIXED_BFLOAT16;
    cfg.recompute = recompute;
    kn_model mixed = build_from(&cfg, 1, KN_PASS_ALL, NULL);
    const char *name = "";
    double worst = worst_gradient_difference(&ref, &mixed, &name);
    print_message("linear CNN, recompute %d: worst gradient difference %.4f (%s), bound %.4f\n",
                  recompute, worst, name, linear_bound);
    if (worst > linear_bound)
      fail_msg("linear CNN: %s's gradient differs by %g of its norm, more than sqrt(12) 2^-8 "
               "(recompute %d)",
               name, worst, recompute);
    kn_model_free(&ref);
    kn_model_free(&mixed);

    ref = build_cnn(12, 16, KN_PRECISION_FLOAT32, 0, NULL);
    mixed = build_cnn(12, 16, KN_PRECISION_MIXED_BFLOAT16, recompute, NULL);
    worst = worst_gradient_difference(&ref, &mixed, &name);
    print_message("test CNN, recompute %d: worst gradient difference %.4f (%s), bound %.2f\n",
                  recompute, worst, name, gated_bound);
    if (worst > gated_bound)
      fail_msg("test CNN: %s's gradient differs by %g of its norm (recompute %d)", name, worst,
               recompute);
    kn_model_free(&ref);
    kn_model_free(&mixed);
  }
  kn_winograd_set_bf16(1);
}

/* A tiled max pool over bf16 values stores its maxima in bf16 and runs
 * 16 channels a vector, the last block ending at the last channel (3
 * channels one by one; 24 and 40 overlap): a convolution, relu and pool
 * of each width, then a dense layer, under mixed_bfloat16 against
 * float32. Two gates (relu, the pool's argmax): within the test CNN's
 * bound. A block's channels read or written at the wrong place move the
 * gradients by most of their norm. */
static void bf16_max_pools_of_any_width_stay_close_to_float32(void **state) {
  (void)state;
  const int widths[] = {3, 16, 24, 40};
  for (size_t k = 0; k < sizeof widths / sizeof widths[0]; k++) {
    const kn_layer_config layers[4] = {{.type = KN_LAYER_CONV2D,
                                        .name = "conv",
                                        .filters = widths[k],
                                        .kernel_size = {3, 3},
                                        .padding = KN_PAD_SAME,
                                        .use_bias = 1,
                                        .activation = KN_ACT_RELU},
                                       {.type = KN_LAYER_MAX_POOL2D, .name = "pool"},
                                       {.type = KN_LAYER_FLATTEN, .name = "flatten"},
                                       {.type = KN_LAYER_DENSE, .name = "out", .units = 10}};
    kn_model_config cfg = cnn_config(12, 16, KN_PRECISION_FLOAT32, 0);
    cfg.layers = layers;
    cfg.n_layers = 4;
    for (int threads = 1; threads <= 2; threads++) {
      kn_model ref = build_from(&cfg, threads, KN_PASS_ALL, NULL);
      cfg.precision = KN_PRECISION_MIXED_BFLOAT16;
      kn_model mixed = build_from(&cfg, threads, KN_PASS_ALL, NULL);
      cfg.precision = KN_PRECISION_FLOAT32;
      const char *name = "";
      const double worst = worst_gradient_difference(&ref, &mixed, &name);
      print_message("%d channels, %d thread(s): worst gradient difference %.4f (%s)\n", widths[k],
                    threads, worst, name);
      if (worst > 0.10)
        fail_msg("%d channels: %s's gradient differs by %g of its norm", widths[k], name, worst);
      kn_model_free(&ref);
      kn_model_free(&mixed);
    }
  }
}

/* A tiled max pool over a concatenation (as inception's branches end):
 * under mixed_bfloat16 the pool's gradient is stored in bf16 only where
 * every reader of its rounding takes bf16; the concatenation's gradient
 * slices copy f32, so there it stays f32. Read as f32, its bf16 values
 * were garbage, and past the end of the buffer, another thread's writes:
 * gradients off by twice their norm, different from run to run. The
 * gradients with every pass against none (the same policy, each op on its
 * own), on 1 and 2 threads: within 2% of their norm (the passes move
 * where some values are rounded: 0.6% here); and the same bits on 2
 * threads as on 1. */
static void bf16_max_pools_over_a_concatenation_match_the_plain_graph(void **state) {
  (void)state;
  const kn_layer_config layers[7] = {
      {.type = KN_LAYER_CONV2D,
       .name = "stem",
       .filters = 16,
       .kernel_size = {3, 3},
       .padding = KN_PAD_SAME,
       .use_bias = 1,
       .activation = KN_ACT_RELU},
      {.type = KN_LAYER_CONV2D,
       .name = "br1",
       .filters = 16,
       .kernel_size = {1, 1},
       .padding = KN_PAD_SAME,
       .use_bias = 1,
       .activation = KN_ACT_RELU},
      {.type = KN_LAYER_CONV2D,
       .name = "br3",
       .filters = 16,
       .kernel_size = {3, 3},
       .padding = KN_PAD_SAME,
       .use_bias = 1,
       .activation = KN_ACT_RELU,
       .n_inputs = 1,
       .inputs = {0}},
      {.type = KN_LAYER_CONCATENATE, .name = "cat", .n_inputs = 2, .inputs = {1, 2}},
      {.type = KN_LAYER_MAX_POOL2D, .name = "pool"},
      {.type = KN_LAYER_FLATTEN, .name = "flatten"},
      {.type = KN_LAYER_DENSE, .name = "out", .units = 10}};
  kn_model_config cfg = cnn_config(12, 16, KN_PRECISION_FLOAT32, 0);
  cfg.layers = layers;
  cfg.n_layers = 7;
  cfg.precision = KN_PRECISION_MIXED_BFLOAT16;
  kn_model mixed[2];
  kn_winograd_set_bf16(0);
  for (int threads = 1; threads <= 2; threads++) {
    kn_model plain = build_from(&cfg, threads, 0, NULL);
    mixed[threads - 1] = build_from(&cfg, threads, KN_PASS_ALL, NULL);
    const char *name = "";
    const double worst = worst_gradient_difference(&plain, &mixed[threads - 1], &name);
    print_message("%d thread(s): worst gradient difference %.2g (%s)\n", threads, worst, name);
    if (worst > 0.02) fail_msg("%s's gradient differs by %g of its norm", name, worst);
    kn_model_free(&plain);
  }
  kn_winograd_set_bf16(1);
  assert_same_training_and_free(&mixed[0], &mixed[1]);
}

static void recompute_and_mixed_precision_combine(void **state) {
  (void)state;
  kn_plan_stats mixed, both;
  kn_model a = build_cnn(12, 16, KN_PRECISION_MIXED_BFLOAT16, 0, &mixed);
  kn_model b = build_cnn(12, 16, KN_PRECISION_MIXED_BFLOAT16, 1, &both);
  print_message("mixed %zu, with recompute %zu (%d re-run)\n", mixed.arena_bytes, both.arena_bytes,
                both.n_recomputed);
  assert_true(both.arena_bytes < mixed.arena_bytes);
  float la[3], lb[3];
  sgd_losses(&a, 3, la);
  sgd_losses(&b, 3, lb);
  /* Recomputing from the narrow copies rounds slightly differently. */
  for (int s = 0; s < 3; s++) assert_true(fabsf(la[s] - lb[s]) < 1e-2f * fabsf(la[s]) + 1e-3f);
  kn_model_free(&a);
  kn_model_free(&b);
}

/* Whether this CPU (and build) has the AVX512-BF16 kernel. */
static int have_avx512bf16(void) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
#else
  return 0;
#endif
}

static void mixed_bfloat16_runs_every_matmul_on_the_bf16_gemm(void **state) {
  (void)state;
  kn_model f32 = build_cnn(12, 16, KN_PRECISION_FLOAT32, 0, NULL);
  kn_model bf16 = build_cnn_threaded(12, 16, KN_PRECISION_MIXED_BFLOAT16, 0, 2, NULL);
  float lf[2], lb[2];
  sgd_losses(&f32, 2, lf);
  sgd_losses(&bf16, 2, lb);
  const kn_gemm_kernel want = kn_gemm_bf16_kernel();
  print_message("mixed_bfloat16 matmuls: %s\n", kn_mixed_matmul_path(KN_PRECISION_MIXED_BFLOAT16));
  /* Per step: 4 layers forward, their 4 dW, and dX of conv2 (columns),
   * dense1 and out (conv1's input needs no gradient). */
  assert_int_equal(kn_graph_gemm_calls(bf16.graph, want), 2 * 11);
  assert_int_equal(kn_graph_gemm_calls(bf16.graph, KN_GEMM_SGEMM), 0);
  assert_int_equal(kn_graph_gemm_calls(f32.graph, KN_GEMM_SGEMM), 2 * 11);
  assert_int_equal(kn_graph_gemm_calls(f32.graph, want), 0);
  if (have_avx512bf16()) {
    assert_int_equal(want, KN_GEMM_BF16_AVX512);
    assert_non_null(strstr(kn_mixed_matmul_path(KN_PRECISION_MIXED_BFLOAT16),
                           kn_amx_available() ? "AMX-BF16" : "vdpbf16ps"));
  } else {
    print_message("this CPU has no AVX512-BF16: the portable kernel ran\n");
    assert_int_equal(want, KN_GEMM_BF16_PORTABLE);
  }
  kn_model_free(&f32);
  kn_model_free(&bf16);
}

/* The test CNN (12x12, batch 16) twice: a with every exact pass (stats
 * on), b with every one but `pass` (off); the plan with the pass is no
 * larger. */
static void build_with_and_without(kn_precision precision, int threads, unsigned pass, kn_model *a,
                                   kn_model *b, kn_plan_stats *on, kn_plan_stats *off) {
  *a = build_cnn_passes(12, 16, precision, 0, threads, ALL_EXACT, on);
  *b = build_cnn_passes(12, 16, precision, 0, threads, ALL_EXACT & ~pass, off);
  assert_true(on->arena_bytes <= off->arena_bytes);
}

/* How many times a pass applied, as the plan reports it. */
static int pass_applied(const kn_plan_stats *st, unsigned pass) {
  switch (pass) {
  case KN_PASS_IMPLICIT_COLUMNS: return st->n_implicit;
  case KN_PASS_BIAS_GRAD_IN_GEMM: return st->n_bias_grads_in_gemm;
  case KN_PASS_POOL_ARGMAX: return st->n_pool_argmax;
  case KN_PASS_NARROW_COPIES: return st->n_narrow_copies;
  default: return st->n_pool_grads_in_gemm;
  }
}

/* A pass that changes no value, on and off, in float32 and
 * mixed_bfloat16, on 1 and 2 threads: it applies `expect` times, the
 * training is the same bits, and the plan is no larger (with `shrinks`,
 * smaller). */
static void check_same_bits_in_both_precisions(unsigned pass, int expect, int shrinks) {
  const kn_precision precisions[2] = {KN_PRECISION_FLOAT32, KN_PRECISION_MIXED_BFLOAT16};
  for (int p = 0; p < 2; p++) {
    for (int threads = 1; threads <= 2; threads++) {
      kn_plan_stats on, off;
      kn_model a, b;
      build_with_and_without(precisions[p], threads, pass, &a, &b, &on, &off);
      assert_int_equal(pass_applied(&on, pass), expect);
      assert_int_equal(pass_applied(&off, pass), 0);
      if (threads == 1)
        print_message("%s: arena %zu bytes with the pass, %zu without\n",
                      kn_precision_name(precisions[p]), on.arena_bytes, off.arena_bytes);
      if (shrinks) assert_true(on.arena_bytes < off.arena_bytes);
      assert_same_training_and_free(&a, &b);
    }
  }
}

/* Reading a convolution's columns in place (kiln's f32 GEMM gathering as
 * it reads, the bf16 GEMM as it packs) sums the same products in the same
 * order as materialized columns: the same losses and weights, bit for bit,
 * in float32 and mixed_bfloat16, on 1 and 2 threads. */
static void implicit_columns_change_no_bits(void **state) {
  (void)state;
  require_kiln_gemm();
  check_same_bits_in_both_precisions(KN_PASS_IMPLICIT_COLUMNS, 2, 0);
}

/* A graph compiled with kiln's GEMM reads its convolutions' columns in
 * place, sums its bias gradients in the weight gradients' GEMMs and
 * computes the first pool's gradient inside one; switched to OpenBLAS
 * afterwards, those GEMMs run a plain loop over the same columns and pool
 * gradient, and the bias gradients a plain row sum: the same training as
 * a graph compiled for OpenBLAS (materialized columns), to rounding. */
static void implicit_columns_survive_a_gemm_switch(void **state) {
  (void)state;
  require_kiln_gemm();
  char err[256];
  kn_plan_stats implicit, plain;
  kn_model a = build_cnn_passes(12, 16, KN_PRECISION_FLOAT32, 0, 1, KN_PASS_ALL, &implicit);
  assert_int_equal(kn_cpu_set_gemm(KN_GEMM_OPENBLAS, err, sizeof err), KN_OK);
  kn_model b = build_cnn_passes(12, 16, KN_PRECISION_FLOAT32, 0, 1, KN_PASS_ALL, &plain);
  assert_true(implicit.n_implicit == 2 && implicit.n_implicit_input_grads == 1 &&
              implicit.n_bias_grads_in_gemm == 4 && implicit.n_pool_grads_in_gemm == 1);
  assert_true(plain.n_implicit == 0 && plain.n_implicit_input_grads == 0 &&
              plain.n_bias_grads_in_gemm == 0 && plain.n_pool_grads_in_gemm == 0);
  float la[4], lb[4];
  sgd_losses(&a, 4, la);
  sgd_losses(&b, 4, lb);
  assert_int_equal(kn_cpu_set_gemm(KN_GEMM_AUTO, err, sizeof err), KN_OK);
  for (int s = 0; s < 4; s++) assert_true(fabsf(la[s] - lb[s]) <= 1e-5f * fabsf(lb[s]));
  kn_model_free(&a);
  kn_model_free(&b);
}

/* Four SGD steps of a (a pass on) and b (off): losses within loss_tol and
 * every weight within weight_tol of the largest, relative; the figures
 * printed when `say` is set; both models freed. */
static void assert_trains_within_and_free(kn_model *a, kn_model *b, float loss_tol,
                                          float weight_tol, const char *what, int say) {
  float la[4], lb[4];
  sgd_losses(a, 4, la);
  sgd_losses(b, 4, lb);
  for (int s = 0; s < 4; s++) {
    if (say) print_message("%s, step %d: loss %.9g with, %.9g without\n", what, s, la[s], lb[s]);
    assert_true(fabsf(la[s] - lb[s]) <= loss_tol * fabsf(lb[s]));
  }
  const float *wa = kn_params(a->graph), *wb = kn_params(b->graph);
  float largest = 0.0f, worst = 0.0f;
  for (size_t i = 0; i < kn_param_count(a->graph); i++) {
    largest = fmaxf(largest, fabsf(wb[i]));
    worst = fmaxf(worst, fabsf(wa[i] - wb[i]));
  }
  if (say)
    print_message("%s: largest weight difference %.3g of the largest weight\n", what,
                  worst / largest);
  assert_true(worst <= weight_tol * largest);
  kn_model_free(a);
  kn_model_free(b);
}

/* A convolution's input gradient as one GEMM over dy's padded columns
 * (implicit_input_grad) sums over taps and filters in one order instead of
 * a GEMM into columns and col2im: the same training to rounding, in
 * float32 (losses and weights within 1e-5) and mixed_bfloat16 (losses
 * within 1e-3, weights within 1e-2: a gradient rounded to bf16 from other
 * sums may move by one bf16 step, 2^-8), on 1 and 2 threads; and the plan
 * is no larger. */
static void implicit_input_grads_train_the_same(void **state) {
  (void)state;
  require_kiln_gemm();
  const kn_precision precisions[2] = {KN_PRECISION_FLOAT32, KN_PRECISION_MIXED_BFLOAT16};
  const float tolerance[2] = {1e-5f, 1e-3f}, weight_tolerance[2] = {1e-5f, 1e-2f};
  for (int p = 0; p < 2; p++) {
    for (int threads = 1; threads <= 2; threads++) {
      kn_plan_stats on, off;
      kn_model a, b;
      build_with_and_without(precisions[p], threads, KN_PASS_IMPLICIT_INPUT_GRAD, &a, &b, &on,
                             &off);
      assert_int_equal(on.n_implicit_input_grads, 1);
      assert_int_equal(off.n_implicit_input_grads, 0);
      assert_trains_within_and_free(&a, &b, tolerance[p], weight_tolerance[p],
                                    p ? "mixed_bfloat16" : "float32", threads == 1);
    }
  }
}

/* Such a pass on and off, on 1 and 2 threads, in the float32 test CNN: it
 * applies `expect` times (on kiln's GEMM: skipped elsewhere); the same bits
 * on 12x12 images; on 28x28 images, where the first convolution's weight
 * gradient sums 12,544 pixels in depth slices, the same bits too or, with
 * a tolerance, the same training within it. */
static void check_gemm_pass(unsigned pass, int expect, float tolerance) {
  require_kiln_gemm();
  for (int threads = 1; threads <= 2; threads++) {
    kn_plan_stats on, off;
    kn_model a, b;
    build_with_and_without(KN_PRECISION_FLOAT32, threads, pass, &a, &b, &on, &off);
    assert_int_equal(pass_applied(&on, pass), expect);
    assert_int_equal(pass_applied(&off, pass), 0);
    assert_same_training_and_free(&a, &b);
    a = build_cnn_passes(28, 16, KN_PRECISION_FLOAT32, 0, threads, ALL_EXACT, &on);
    b = build_cnn_passes(28, 16, KN_PRECISION_FLOAT32, 0, threads, ALL_EXACT & ~pass, &off);
    assert_int_equal(pass_applied(&on, pass), expect);
    if (tolerance > 0)
      assert_trains_within_and_free(&a, &b, tolerance, tolerance, "float32, 28x28", threads == 1);
    else
      assert_same_training_and_free(&a, &b);
  }
}

/* Bias gradients summed by the weight gradients' GEMMs (bias_grad_in_gemm)
 * as they pack dy, the four layers' pairs: each column sums in row order,
 * as reduce_rows does (the same bits), unless the GEMM sums in depth
 * slices, where the bias sums per slice too (the same training within
 * 1e-5).
 *
 * mixed_bfloat16 pairs them too, its dy bf16. On 12x12 images no bf16
 * product sums dy (the bias gradients run after their GEMMs, as
 * unpaired): the same bits. On 28x28 images the first convolution's
 * weight gradient runs on the bf16 GEMM's small weight gradient, which
 * sums dy's columns by slices of pixels, and with Winograd the second's
 * sums dy by tiles: the same training within mixed_bfloat16's rounding
 * (losses 1e-3, weights 1e-2: a gradient rounded to bf16 from other sums
 * moves by a bf16 step). */
static void bias_grads_in_gemm_train_the_same(void **state) {
  (void)state;
  check_gemm_pass(KN_PASS_BIAS_GRAD_IN_GEMM, 4, 1e-5f);
  for (int threads = 1; threads <= 2; threads++) {
    kn_plan_stats on, off;
    kn_model a, b;
    /* (the weight gradients' values live from their bias gradients on:
     * the plan may grow by their alignment) */
    a = build_cnn_passes(12, 16, KN_PRECISION_MIXED_BFLOAT16, 0, threads, ALL_EXACT, &on);
    b = build_cnn_passes(12, 16, KN_PRECISION_MIXED_BFLOAT16, 0, threads,
                         ALL_EXACT & ~KN_PASS_BIAS_GRAD_IN_GEMM, &off);
    assert_true(on.arena_bytes <= off.arena_bytes + 4096);
    assert_int_equal(on.n_bias_grads_in_gemm, 4);
    assert_int_equal(off.n_bias_grads_in_gemm, 0);
    assert_same_training_and_free(&a, &b);
    a = build_cnn_passes(28, 16, KN_PRECISION_MIXED_BFLOAT16, 0, threads, KN_PASS_ALL, &on);
    b = build_cnn_passes(28, 16, KN_PRECISION_MIXED_BFLOAT16, 0, threads,
                         KN_PASS_ALL & ~KN_PASS_BIAS_GRAD_IN_GEMM, &off);
    assert_int_equal(on.n_bias_grads_in_gemm, 4);
    assert_trains_within_and_free(&a, &b, 1e-3f, 1e-2f, "mixed_bfloat16, 28x28", threads == 1);
  }
}

/* Max pools that record their argmax (pool_argmax) give their gradients
 * the same values, so training is the same bits, in float32 and
 * mixed_bfloat16, on 1 and 2 threads; each activation a pool reads then
 * dies in the forward pass, so the plan is smaller. The test CNN's two
 * pools. */
static void pool_argmax_changes_no_bits_and_shrinks_the_plan(void **state) {
  (void)state;
  check_same_bits_in_both_precisions(KN_PASS_POOL_ARGMAX, 2, 1);
}

/* Max pools whose windows overlap (3x3, stride 2, "same"; 20 channels: a
 * vector and a tail) read bf16 copies of their inputs in mixed_bfloat16;
 * their gradients widen each window's cells to run on vectors: training
 * is the same bits as one channel at a time, on 1 and 2 threads. */
static void overlapping_bf16_max_pools_train_the_same_bits_widened(void **state) {
  (void)state;
  static const kn_layer_config layers[] = {
      {.type = KN_LAYER_CONV2D,
       .name = "conv",
       .filters = 20,
       .kernel_size = {3, 3},
       .padding = KN_PAD_SAME,
       .use_bias = 1},
      {.type = KN_LAYER_MAX_POOL2D,
       .name = "pool",
       .pool_size = {3, 3},
       .strides = {2, 2},
       .padding = KN_PAD_SAME},
      {.type = KN_LAYER_FLATTEN, .name = "flatten"},
      {.type = KN_LAYER_DENSE, .name = "out", .units = 10, .use_bias = 1}};
  kn_model_config cfg = {.input_ndim = 3,
                         .input_shape = {12, 12, 1},
                         .n_layers = 4,
                         .layers = layers,
                         .batch_size = 16,
                         .seed = 3,
                         .precision = KN_PRECISION_MIXED_BFLOAT16};
  for (int threads = 1; threads <= 2; threads++) {
    kn_model a = build_from(&cfg, threads, ALL_EXACT, NULL);
    kn_model b = build_from(&cfg, threads, ALL_EXACT, NULL);
    float la[4], lb[4];
    sgd_losses(&a, 4, la);
    kn_pool_set_widening(0);
    sgd_losses(&b, 4, lb);
    kn_pool_set_widening(1);
    for (int s = 0; s < 4; s++) assert_true(bits_of(la[s]) == bits_of(lb[s]));
    assert_memory_equal(kn_params(a.graph), kn_params(b.graph), kn_param_count(a.graph) * 4);
    kn_model_free(&a);
    kn_model_free(&b);
  }
}

/* The first convolution's max pool gradient computed inside its weight
 * gradient's GEMM as it packs it (pool_grad_in_gemm), never written: the
 * same values summed in the same order, so the same bits. Under
 * mixed_bfloat16, where the bf16 GEMM's small weight gradient runs (a 3x3
 * convolution on one channel, AVX512-BF16), it reads the pool's bf16
 * gradient the same way: the same bits too, on 28x28 images (whose
 * weight gradient runs there either way; on 12x12 images, without the
 * pass, the GEMM takes it). */
static void pool_grads_in_gemm_change_no_bits(void **state) {
  (void)state;
  check_gemm_pass(KN_PASS_POOL_GRAD_IN_GEMM, 1, 0.0f);
  if (kn_gemm_bf16_kernel() != KN_GEMM_BF16_AVX512) {
    print_message("SKIPPED (mixed_bfloat16 part): no AVX512-BF16 on this CPU, so the bf16 pool "
                  "gradient stays written\n");
    skip();
  }
  for (int threads = 1; threads <= 2; threads++) {
    kn_plan_stats on, off;
    kn_model a = build_cnn_passes(28, 16, KN_PRECISION_MIXED_BFLOAT16, 0, threads, ALL_EXACT, &on);
    kn_model b = build_cnn_passes(28, 16, KN_PRECISION_MIXED_BFLOAT16, 0, threads,
                                  ALL_EXACT & ~KN_PASS_POOL_GRAD_IN_GEMM, &off);
    print_message("mixed_bfloat16, 28x28: arena %zu bytes with the pass, %zu without\n",
                  (size_t)on.arena_bytes, (size_t)off.arena_bytes);
    assert_int_equal(on.n_pool_grads_in_gemm, 1);
    assert_int_equal(off.n_pool_grads_in_gemm, 0);
    assert_true(on.arena_bytes <= off.arena_bytes); /* (the peak lies elsewhere) */
    assert_same_training_and_free(&a, &b);
  }
}

/* A residual block with batch norm: conv - bn - relu, conv - bn - relu,
 * conv - bn, added to the first relu, relu, global average pool, dense. */
static const kn_layer_config residual_layers[11] = {
    {.type = KN_LAYER_CONV2D,
     .name = "stem",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME},
    {.type = KN_LAYER_BATCH_NORM, .name = "stem_bn"},
    {.type = KN_LAYER_ACTIVATION, .name = "stem_relu", .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "c1",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME},
    {.type = KN_LAYER_BATCH_NORM, .name = "c1_bn"},
    {.type = KN_LAYER_ACTIVATION, .name = "c1_relu", .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "c2",
     .filters = 16,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME},
    {.type = KN_LAYER_BATCH_NORM, .name = "c2_bn"},
    {.type = KN_LAYER_ADD, .name = "add", .n_inputs = 2, .inputs = {2, 7}},
    {.type = KN_LAYER_GLOBAL_AVG_POOL2D, .name = "gap"},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 10, .use_bias = 1}};

/* mixed_bfloat16's bf16 copies written by the kernels that compute the
 * values (and the roundings through bf16 done there), on and off: the
 * pass applies in mixed_bfloat16 only, the training is the same bits, on
 * 1 and 2 threads, on the test CNN and on a residual block with batch
 * norm. */
static void narrow_copies_change_no_bits(void **state) {
  (void)state;
  for (int model = 0; model < 2; model++) {
    for (int p = 0; p < 2; p++) {
      const kn_precision precision = p ? KN_PRECISION_MIXED_BFLOAT16 : KN_PRECISION_FLOAT32;
      for (int threads = 1; threads <= 2; threads++) {
        kn_model_config cfg = cnn_config(12, 16, precision, 0);
        if (model) {
          cfg.layers = residual_layers;
          cfg.n_layers = 11;
        }
        kn_plan_stats on, off;
        kn_model a = build_from(&cfg, threads, KN_PASS_ALL, &on);
        kn_model b = build_from(&cfg, threads, KN_PASS_ALL & ~KN_PASS_NARROW_COPIES, &off);
        assert_int_equal(off.n_narrow_copies, 0);
        if (threads == 1)
          print_message("%s, %s: %d casts taken in by their values' kernels\n",
                        model ? "residual block" : "cnn", kn_precision_name(precision),
                        on.n_narrow_copies);
        if (p)
          assert_true(on.n_narrow_copies >= (model ? 8 : 0));
        else
          assert_int_equal(on.n_narrow_copies, 0);
        assert_same_training_and_free(&a, &b);
      }
    }
  }
}

/* Batch norm's backward in mixed_bfloat16: bn_grad_x reads the layer
 * output kept in bf16 and, where a relu follows, masks dy by the relu's
 * bf16 output, its rounded gradient never written (the bn_grads pass). On
 * and off: the same bits, on 1 and 2 threads, over channel counts that
 * take each of its loops (runs of rows under 8 and under 16 channels,
 * blocks of 8, a width past its last whole block). */
static void bn_grads_change_no_bits_in_mixed_bfloat16(void **state) {
  (void)state;
  static const int widths[] = {4, 12, 16, 40};
  for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
    for (int threads = 1; threads <= 2; threads++) {
      kn_layer_config layers[11];
      memcpy(layers, residual_layers, sizeof layers);
      layers[0].filters = layers[3].filters = layers[6].filters = widths[w];
      kn_model_config cfg = cnn_config(12, 16, KN_PRECISION_MIXED_BFLOAT16, 0);
      cfg.layers = layers;
      cfg.n_layers = 11;
      kn_plan_stats on, off;
      kn_model a = build_from(&cfg, threads, ALL_EXACT, &on);
      kn_model b = build_from(&cfg, threads, ALL_EXACT & ~KN_PASS_BN_GRADS, &off);
      if (threads == 1)
        print_message("%d channels: %d batch norms paired, %d relu gradients taken in\n", widths[w],
                      on.n_bn_grads, on.n_bn_relu_grads);
      assert_int_equal(on.n_bn_grads, 3);
      assert_int_equal(on.n_bn_relu_grads, 2); /* stem_relu's, c1_relu's */
      assert_int_equal(off.n_bn_grads, 0);
      assert_same_training_and_free(&a, &b);
    }
  }
}

/* What a batch norm input gradient computed, against its definition in
 * double from the same inputs (node_done: right after the node ran, its
 * inputs still live): dx = gamma inv / R (R d - sum d - xhat sum d xhat),
 * d = dy where the relu after the norm passed. */
typedef struct bn_grad_check {
  kn_graph *g;
  int nodes, bf16_x, bf16_masks;
  double worst; /* the largest difference over the largest |dx| */
  /* the forward's: statistics and applies checked, those reading bf16 x,
   * applies stored in bf16 alone, values off their definition */
  int stats, stats_bf16_x, applies, applies_bf16_x, applies_bf16_y, off;
} bn_grad_check;

static double value_of(const kn_graph *g, kn_node v, size_t i) {
  const kn_node_rec *n = &g->nodes[v];
  return n->dtype == KN_BF16 ? kn_bf16_to_f32(((const uint16_t *)n->data)[i])
                             : ((const float *)n->data)[i];
}

/* A batch norm's statistics: each channel's mean within 2^-20 of the
 * largest |x|, 1/sqrt(var + eps) within 2^-18 of itself, of their
 * definition in double over the x it read. */
static void check_bn_stats(bn_grad_check *c, const kn_node_rec *n) {
  const kn_graph *g = c->g;
  int R, C;
  kn_node_matrix(g, &g->nodes[n->inputs[0]], &R, &C);
  const float *stats = n->data;
  c->stats++;
  c->stats_bf16_x += g->nodes[n->inputs[0]].dtype == KN_BF16;
  for (int ch = 0; ch < C; ch++) {
    double sum = 0.0, top = 0.0, sq = 0.0;
    for (int r = 0; r < R; r++) {
      const double x = value_of(g, n->inputs[0], (size_t)r * C + ch);
      sum += x;
      top = fmax(top, fabs(x));
    }
    const double mean = sum / R;
    for (int r = 0; r < R; r++) {
      const double d = value_of(g, n->inputs[0], (size_t)r * C + ch) - mean;
      sq += d * d;
    }
    const double inv = 1.0 / sqrt(sq / R + n->attr.bn.epsilon);
    if (fabs(stats[ch] - mean) > 0x1p-20 * top || fabs(stats[C + ch] - inv) > 0x1p-18 * inv)
      c->off++;
  }
}

/* A batch norm's apply: (x - mean) inv gamma + beta from the statistics
 * it read, through its relu, within 2^-20 of the largest value (and, where
 * it is rounded through bf16, bf16's half step of its own). */
static void check_bn_apply(bn_grad_check *c, const kn_node_rec *n, kn_node self) {
  const kn_graph *g = c->g;
  int R, C;
  kn_node_matrix(g, n, &R, &C);
  const float *stats = g->nodes[n->inputs[1]].data, *gamma = g->nodes[n->inputs[2]].data,
              *beta = g->nodes[n->inputs[3]].data;
  c->applies++;
  c->applies_bf16_x += g->nodes[n->inputs[0]].dtype == KN_BF16;
  c->applies_bf16_y += n->dtype == KN_BF16;
  double top = 0.0;
  for (size_t at = 0; at < (size_t)R * C; at++) top = fmax(top, fabs(value_of(g, self, at)));
  for (int r = 0; r < R; r++)
    for (int ch = 0; ch < C; ch++) {
      const size_t at = (size_t)r * C + ch;
      double ref =
          (value_of(g, n->inputs[0], at) - stats[ch]) * stats[C + ch] * gamma[ch] + beta[ch];
      if (n->n_inputs > 4) ref += value_of(g, n->inputs[4], at); /* the add it took in */
      if (n->fused_relu && ref < 0) ref = 0;
      const double tol = 0x1p-20 * top + (n->round_bf16 ? 0x1p-8 * fabs(ref) : 0.0);
      if (fabs(value_of(g, self, at) - ref) > tol) c->off++;
    }
}

static void check_bn_grad_x(void *ctx, int i) {
  bn_grad_check *c = ctx;
  const kn_graph *g = c->g;
  const kn_node_rec *n = &g->nodes[i];
  if (n->op == KN_OP_BN_STATS) check_bn_stats(c, n);
  if (n->op == KN_OP_BN_APPLY) check_bn_apply(c, n, i);
  if (n->op != KN_OP_BN_GRAD_X) return;
  int R, C;
  kn_node_matrix(g, n, &R, &C);
  const float *stats = g->nodes[n->inputs[2]].data, *gamma = g->nodes[n->inputs[3]].data;
  const int masked = n->n_inputs > 4 && !n->attr.bn.relu_from_beta;
  c->nodes++;
  c->bf16_x += g->nodes[n->inputs[1]].dtype == KN_BF16;
  c->bf16_masks += masked && g->nodes[n->inputs[4]].dtype == KN_BF16;
  double *d = malloc(sizeof(double) * (size_t)R * C), *xh = malloc(sizeof(double) * (size_t)R * C);
  assert_non_null(d);
  assert_non_null(xh);
  double top = 0.0, diff = 0.0;
  for (int ch = 0; ch < C; ch++) {
    double s1 = 0.0, s2 = 0.0;
    for (int r = 0; r < R; r++) {
      const size_t at = (size_t)r * C + ch;
      xh[at] = (value_of(g, n->inputs[1], at) - stats[ch]) * stats[C + ch];
      int pass = 1;
      if (masked) pass = value_of(g, n->inputs[4], at) > 0;
      if (n->attr.bn.relu_from_beta)
        pass = xh[at] * gamma[ch] + ((const float *)g->nodes[n->inputs[4]].data)[ch] > 0;
      d[at] = pass ? value_of(g, n->inputs[0], at) : 0.0;
      s1 += d[at];
      s2 += d[at] * xh[at];
    }
    for (int r = 0; r < R; r++) {
      const size_t at = (size_t)r * C + ch;
      const double ref = gamma[ch] * stats[C + ch] / R * (R * d[at] - s1 - xh[at] * s2);
      top = fmax(top, fabs(ref));
      diff = fmax(diff, fabs(ref - ((const float *)n->data)[at]));
    }
  }
  free(d);
  free(xh);
  if (top > 0 && diff / top > c->worst) c->worst = diff / top;
}

/* In mixed_bfloat16 batch norm normalizes the layer output in bf16 (the
 * convolution stores nothing else), stores a value only its bf16 copy or
 * a rounded add would read in bf16 alone, and its input gradient reads that bf16 output
 * (and the relu's bf16 output as its mask) and is formed in float, not
 * double, as the bf16 products that read it round it to 8 bits anyway. On
 * the residual block, over channel counts that take each of its loops:
 * the statistics and applies match their definitions, and every input
 * gradient stays within 2^-18 of its largest value of the definition in
 * double (1.6e-7 seen; bf16 keeps 2^-9), float32's (in double) within
 * 2^-20 (8.7e-8 seen). 80 channels: a row at a time, past one chunk of
 * the sums. */
static void batch_norms_match_their_definitions(void **state) {
  (void)state;
  static const int widths[] = {4, 12, 16, 40, 80};
  for (int p = 0; p < 2; p++) {
    const kn_precision precision = p ? KN_PRECISION_MIXED_BFLOAT16 : KN_PRECISION_FLOAT32;
    for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
      kn_layer_config layers[11];
      memcpy(layers, residual_layers, sizeof layers);
      layers[0].filters = layers[3].filters = layers[6].filters = widths[w];
      kn_model_config cfg = cnn_config(12, 16, precision, 0);
      cfg.layers = layers;
      cfg.n_layers = 11;
      kn_model m = build_from(&cfg, 2, KN_PASS_ALL, NULL);
      bn_grad_check c = {.g = m.graph};
      m.graph->node_done = check_bn_grad_x;
      m.graph->node_done_ctx = &c;
      float losses[2];
      sgd_losses(&m, 2, losses);
      print_message("%s, %d channels: %d input gradients within %.3g of their largest (%d read "
                    "bf16 x, %d a bf16 mask); %d statistics (%d of bf16 x), %d applies (%d of "
                    "bf16 x, %d stored in bf16)\n",
                    kn_precision_name(precision), widths[w], c.nodes, c.worst, c.bf16_x,
                    c.bf16_masks, c.stats, c.stats_bf16_x, c.applies, c.applies_bf16_x,
                    c.applies_bf16_y);
      assert_int_equal(c.nodes, 2 * 3);
      assert_int_equal(c.stats, 2 * 3);
      assert_int_equal(c.applies, 2 * 3);
      assert_int_equal(c.off, 0);
      if (p) {
        assert_int_equal(c.bf16_x, 2 * 3);
        assert_int_equal(c.bf16_masks, 2 * 2);
        assert_int_equal(c.stats_bf16_x, 2 * 3);
        assert_int_equal(c.applies_bf16_x, 2 * 3);
        /* all three: c1_bn's read by c2 alone, stem_bn's and c2_bn's by c1
         * and the add (stem's bf16 copy) or the add alone */
        assert_int_equal(c.applies_bf16_y, 2 * 3);
      }
      if (c.worst > (p ? 0x1p-18 : 0x1p-20))
        fail_msg("%s, %d channels: an input gradient is %g of its largest off",
                 kn_precision_name(precision), widths[w], c.worst);
      kn_model_free(&m);
    }
  }
}

/* The relu after a batch norm's apply or an add, rounded through bf16 at
 * the layer boundary, fused into that producer once the rounding is
 * taken into it (fuse_chains, its second run): the fusion pass on and off in
 * mixed_bfloat16, the same bits, and three relus fused on the residual
 * block (two after norms, one after the add). */
static void relus_after_rounded_values_fuse_in_mixed_bfloat16(void **state) {
  (void)state;
  for (int threads = 1; threads <= 2; threads++) {
    kn_model_config cfg = cnn_config(12, 16, KN_PRECISION_MIXED_BFLOAT16, 0);
    cfg.layers = residual_layers;
    cfg.n_layers = 11;
    kn_plan_stats on, off;
    kn_model a = build_from(&cfg, threads, ALL_EXACT, &on);
    kn_model b = build_from(&cfg, threads, ALL_EXACT & ~KN_PASS_FUSION, &off);
    int relus = 0;
    for (int i = 0; i < a.graph->n_nodes; i++) {
      const kn_node_rec *n = &a.graph->nodes[i];
      relus += !n->dead && n->op == KN_OP_RELU;
      if (!n->dead && n->fused_relu && (n->op == KN_OP_BN_APPLY || n->op == KN_OP_ADD))
        assert_true(n->round_bf16);
    }
    if (threads == 1) print_message("%d nodes fused, %d relus left\n", on.n_fused, relus);
    assert_int_equal(relus, 0);
    assert_true(on.n_fused >= 3);
    assert_int_equal(off.n_fused, 0);
    assert_same_training_and_free(&a, &b);
  }
}

/* residual_layers' block with a relu after the add and a convolution
 * reading it: the add is rounded, fused with the relu and stored in bf16
 * for the convolution, as in a ResNet; the convolution strided, then
 * global average pooling and a dense layer. Fills layers (13). */
static kn_model_config residual_then_strided(kn_layer_config *layers) {
  memcpy(layers, residual_layers, 9 * sizeof *layers); /* through the add */
  layers[9] =
      (kn_layer_config){.type = KN_LAYER_ACTIVATION, .name = "out_relu", .activation = KN_ACT_RELU};
  layers[10] = residual_layers[6]; /* a 3x3 convolution of 16 filters, strided */
  snprintf(layers[10].name, sizeof layers[10].name, "c3");
  layers[10].strides[0] = layers[10].strides[1] = 2;
  layers[11] = residual_layers[9]; /* global average pool, dense */
  layers[12] = residual_layers[10];
  kn_model_config cfg = cnn_config(12, 16, KN_PRECISION_MIXED_BFLOAT16, 0);
  cfg.layers = layers;
  cfg.n_layers = 13;
  return cfg;
}

/* The AVX-512 path's own loops in mixed_bfloat16 (a rounded add with its
 * bf16 copy, batch norm's apply rounded and stored in bf16, the sums over
 * rows widened to double) against the AVX2 path's (or the baseline's),
 * whose loops are the scalar definitions: a residual block with batch norm
 * trains the same bits on both, on 1 and 2 threads. The strided
 * convolution's input gradient takes the columns' path on both: summed
 * directly (conv_dx.c) it is AVX-512's alone, in its own order, and
 * test_passes holds it to the columns' values. */
static void residual_blocks_train_the_same_bits_on_each_isa_path(void **state) {
  (void)state;
  char err[256] = "";
  if (kn_cpu_set_isa(KN_ISA_AVX512, err, sizeof err) != KN_OK) {
    print_message("SKIPPED: no AVX-512 path on this CPU (%s)\n", err);
    skip();
  }
  kn_layer_config layers[13];
  kn_model_config cfg = residual_then_strided(layers);
  kn_amx_set(0); /* the AVX-512 path's vdpbf16ps, as the others' portable kernel (amx.h) */
  kn_conv_dx_set_direct(0);
  for (int threads = 1; threads <= 2; threads++) {
    float wide[4], other[4];
    assert_int_equal(kn_cpu_set_isa(KN_ISA_AVX512, err, sizeof err), KN_OK);
    kn_model a = build_from(&cfg, threads, ALL_EXACT, NULL);
    sgd_losses(&a, 4, wide);
    if (kn_cpu_set_isa(KN_ISA_AVX2, err, sizeof err) != KN_OK)
      assert_int_equal(kn_cpu_set_isa(KN_ISA_BASELINE, err, sizeof err), KN_OK);
    kn_model b = build_from(&cfg, threads, ALL_EXACT, NULL);
    sgd_losses(&b, 4, other);
    for (int s = 0; s < 4; s++) assert_true(bits_of(wide[s]) == bits_of(other[s]));
    assert_memory_equal(kn_params(a.graph), kn_params(b.graph), kn_param_count(a.graph) * 4);
    kn_model_free(&a);
    kn_model_free(&b);
  }
  kn_amx_set(1);
  kn_conv_dx_set_direct(1);
  assert_int_equal(kn_cpu_set_isa(KN_ISA_AUTO, err, sizeof err), KN_OK);
}

/* The bf16 GEMM on AMX tiles against vdpbf16ps (KILN_AMX=off's kernels)
 * on a residual block with a strided convolution after it: every
 * product's columns, weight gradient (its columns turned lane by lane),
 * input gradient and dense layer. The two sum the same exact bf16
 * products in f32 in their own orders, so each gradient matches to about
 * f32's rounding of its sums (1e-6 of its norm is seen); a pair or lane
 * packed in the wrong place is off by its share of the norm. The strided
 * input gradient runs on the columns' path, so that the GEMM computes it
 * (summed directly, conv_dx.c, it takes no GEMM). Skips without AMX. */
static void amx_tiles_train_as_the_vdpbf16ps_gemm(void **state) {
  (void)state;
  if (!kn_amx_available() || kn_gemm_bf16_kernel() != KN_GEMM_BF16_AVX512) {
    print_message("SKIPPED: this CPU (or kernel) gives no AMX-BF16 tiles\n");
    skip();
  }
  kn_layer_config layers[13];
  const kn_model_config cfg = residual_then_strided(layers);
  kn_conv_dx_set_direct(0);
  kn_model dot = build_from(&cfg, 2, ALL_EXACT, NULL), tiles = build_from(&cfg, 2, ALL_EXACT, NULL);
  kn_conv_dx_set_direct(1);
  char err[256];
  fill_images(&dot, 16, 7);
  fill_images(&tiles, 16, 7);
  kn_amx_set(0); /* the GEMM takes the tiles or not as it runs */
  assert_int_equal(kn_graph_run(dot.graph, KN_RUN_TRAIN, 16, err, sizeof err), KN_OK);
  kn_amx_set(1);
  assert_int_equal(kn_graph_run(tiles.graph, KN_RUN_TRAIN, 16, err, sizeof err), KN_OK);
  const char *name = "";
  const double worst = gradient_difference(&dot, &tiles, &name);
  if (worst == 0.0) fail_msg("the same bits: the tiles never ran");
  print_message("AMX against vdpbf16ps: worst gradient difference %.3g (%s)\n", worst, name);
  if (worst > 1e-4) fail_msg("%s's gradient differs by %g of its norm", name, worst);
  kn_model_free(&dot);
  kn_model_free(&tiles);
}

/* Live col2im_gemm nodes of m summed directly (conv_dx.c). */
static int direct_input_gradients(const kn_model *m) {
  int n = 0;
  for (int i = 0; i < m->graph->n_nodes; i++) {
    const kn_node_rec *r = &m->graph->nodes[i];
    n += !r->dead && r->op == KN_OP_COL2IM_GEMM && r->direct_dx;
  }
  return n;
}

/* A strided convolution's input gradient summed directly in
 * mixed_bfloat16 (conv_dx.c on the bf16 GEMM's operands: the kernel in
 * bf16, dy in bf16 or rounded to it, exact products, float32 sums)
 * against the columns' path, whose bf16 GEMM rounds each tap's sum to
 * bf16 before col2im adds them: the gradients within that rounding, and
 * the direct sums the same bits on 1 and 3 threads. A dropped tap or
 * filter is off by its share of the norm. Skips without AVX-512F. */
static void strided_input_gradients_summed_directly_in_mixed_bfloat16(void **state) {
  (void)state;
  if (!kn_cpu_features_get()->avx512f) {
    print_message("SKIPPED: no AVX-512F here: the columns' path is the only one\n");
    skip();
  }
  kn_layer_config layers[13];
  const kn_model_config cfg = residual_then_strided(layers);
  kn_conv_dx_set_direct(0);
  kn_model cols = build_from(&cfg, 1, ALL_EXACT, NULL);
  kn_conv_dx_set_direct(1);
  kn_model one = build_from(&cfg, 1, ALL_EXACT, NULL), three = build_from(&cfg, 3, ALL_EXACT, NULL);
  assert_int_equal(direct_input_gradients(&cols), 0);
  assert_int_equal(direct_input_gradients(&one), 1);
  assert_int_equal(direct_input_gradients(&three), 1);
  kn_model *models[3] = {&cols, &one, &three};
  char err[256];
  for (int i = 0; i < 3; i++) {
    fill_images(models[i], 16, 7);
    assert_int_equal(kn_graph_run(models[i]->graph, KN_RUN_TRAIN, 16, err, sizeof err), KN_OK);
  }
  const char *name = "";
  const double worst = gradient_difference(&cols, &one, &name);
  print_message("direct against columns: worst gradient difference %.3g (%s)\n", worst, name);
  if (worst == 0.0) fail_msg("the same bits: the direct sums never ran");
  if (worst > 1e-2) fail_msg("%s's gradient differs by %g of its norm", name, worst);
  assert_memory_equal(kn_grads(one.graph), kn_grads(three.graph),
                      kn_param_count(one.graph) * sizeof(float));
  kn_model_free(&cols);
  kn_model_free(&one);
  kn_model_free(&three);
}

/* Strided convolutions' input gradients in mixed_bfloat16 by chunks of
 * images (col2im_chunks): each thread's bf16 GEMM into its chunk of bf16
 * columns, col2im summing them while they are in cache, as the matmul into
 * whole bf16 columns and col2im did: on and off, the same bits, on 1 and 3
 * threads, in chunks of the whole batch and of one image (the columns'
 * path: where the CPU sums the input gradient directly instead, conv_dx.c,
 * the next test holds it to these values). */
static const kn_layer_config strided_layers[5] = {
    {.type = KN_LAYER_CONV2D,
     .name = "stem",
     .filters = 8,
     .kernel_size = {3, 3},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "down",
     .filters = 16,
     .kernel_size = {3, 3},
     .strides = {2, 2},
     .padding = KN_PAD_SAME,
     .use_bias = 1,
     .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D,
     .name = "down2",
     .filters = 24,
     .kernel_size = {3, 3},
     .strides = {2, 2},
     .padding = KN_PAD_VALID,
     .use_bias = 0},
    {.type = KN_LAYER_FLATTEN, .name = "flat"},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 10, .use_bias = 1}};

static void col2im_chunks_change_no_bits_in_mixed_bfloat16(void **state) {
  (void)state;
  require_kiln_gemm();
  kn_conv_dx_set_direct(0);
  for (int one_image = 0; one_image <= 1; one_image++) {
    kn_col2im_set_chunk_bytes(one_image ? 1 : 0);
    for (int threads = 1; threads <= 3; threads += 2) {
      kn_model_config cfg = cnn_config(12, 16, KN_PRECISION_MIXED_BFLOAT16, 0);
      cfg.layers = strided_layers;
      cfg.n_layers = 5;
      kn_plan_stats on, off;
      kn_model a = build_from(&cfg, threads, ALL_EXACT, &on);
      kn_model b = build_from(&cfg, threads, ALL_EXACT & ~KN_PASS_COL2IM_CHUNKS, &off);
      if (threads == 1)
        print_message("chunks of %s: %d input gradients by chunks\n",
                      one_image ? "one image" : "the batch", on.n_col2im_chunks);
      assert_int_equal(on.n_col2im_chunks, 2);
      assert_int_equal(off.n_col2im_chunks, 0);
      assert_same_training_and_free(&a, &b);
    }
  }
  kn_col2im_set_chunk_bytes(0);
  kn_conv_dx_set_direct(1);
}

/* The same mixed_bfloat16 training on the AVX512-BF16 kernel and on the
 * portable one, and on 1 and 3 threads: the same losses, to rounding. */
static void training_on_either_bf16_kernel_gives_the_same_losses(void **state) {
  (void)state;
  char err[128];
  float native[5], portable[5], threaded[5];
  kn_model a = build_cnn(12, 16, KN_PRECISION_MIXED_BFLOAT16, 0, NULL);
  sgd_losses(&a, 5, native);
  if (kn_cpu_set_isa(KN_ISA_AVX2, err, sizeof err) != KN_OK)
    assert_int_equal(kn_cpu_set_isa(KN_ISA_BASELINE, err, sizeof err), KN_OK);
  kn_model b = build_cnn(12, 16, KN_PRECISION_MIXED_BFLOAT16, 0, NULL);
  sgd_losses(&b, 5, portable);
  assert_true(kn_graph_gemm_calls(b.graph, KN_GEMM_BF16_PORTABLE) > 0);
  assert_int_equal(kn_cpu_set_isa(KN_ISA_AUTO, err, sizeof err), KN_OK);
  kn_model c = build_cnn_threaded(12, 16, KN_PRECISION_MIXED_BFLOAT16, 0, 3, NULL);
  sgd_losses(&c, 5, threaded);
  for (int s = 0; s < 5; s++) {
    print_message("step %d: loss %.6f (kernel in use) %.6f (portable) %.6f (3 threads)\n", s,
                  native[s], portable[s], threaded[s]);
    assert_true(fabsf(native[s] - portable[s]) <= 1e-3f * fabsf(native[s]));
    assert_true(bits_of(native[s]) == bits_of(threaded[s]));
  }
  assert_true(native[4] < native[0]);
  kn_model_free(&a);
  kn_model_free(&b);
  kn_model_free(&c);
}

static void loss_scaler_skips_and_halves_on_inf_and_grows_after_the_interval(void **state) {
  (void)state;
  kn_loss_scaler s;
  kn_loss_scaler_init(&s, 0, 0);
  assert_true(s.scale == 32768.0 && s.growth_interval == 2000); /* Keras's defaults */
  kn_loss_scaler_init(&s, 1024.0, 3);
  float grads[4] = {1024.0f, -512.0f, 0.0f, 2048.0f};
  assert_int_equal(kn_loss_scaler_unscale(&s, grads, 4), 1);
  assert_true(grads[0] == 1.0f && grads[1] == -0.5f && grads[3] == 2.0f);
  kn_loss_scaler_update(&s, 1);
  kn_loss_scaler_update(&s, 1);
  assert_true(s.scale == 1024.0 && s.good_steps == 2);
  /* An inf gradient: the step is skipped, the scale halves, the count restarts. */
  float bad[3] = {1.0f, INFINITY, 3.0f};
  assert_int_equal(kn_loss_scaler_unscale(&s, bad, 3), 0);
  kn_loss_scaler_update(&s, 0);
  assert_true(s.scale == 512.0 && s.good_steps == 0 && s.skipped == 1);
  float nan[2] = {NAN, 1.0f};
  assert_int_equal(kn_loss_scaler_unscale(&s, nan, 2), 0);
  kn_loss_scaler_update(&s, 0);
  assert_true(s.scale == 256.0 && s.skipped == 2);
  /* growth_interval finite steps in a row double it. */
  kn_loss_scaler_update(&s, 1);
  kn_loss_scaler_update(&s, 1);
  assert_true(s.scale == 256.0);
  kn_loss_scaler_update(&s, 1);
  assert_true(s.scale == 512.0 && s.good_steps == 0);
}

/* Images (side, side, 1): class c lights up band c of the rows. */
static kn_dataset make_bands(int64_t n, int side, uint64_t seed) {
  kn_dataset ds = {.n = n,
                   .ndim = 3,
                   .shape = {side, side, 1},
                   .example_size = (size_t)side * side,
                   .n_classes = 3};
  ds.x = malloc((size_t)n * ds.example_size * sizeof(float));
  ds.y = malloc((size_t)n * sizeof(int32_t));
  kn_rng rng;
  kn_rng_seed(&rng, seed);
  for (int64_t i = 0; i < n; i++) {
    int c = (int)kn_rng_below(&rng, 3);
    ds.y[i] = c;
    for (int p = 0; p < side * side; p++) {
      int band = (p / side) * 3 / side;
      ds.x[(size_t)i * ds.example_size + (size_t)p] =
          0.5f * kn_rng_uniform(&rng) + (band == c ? 1.0f : 0.0f);
    }
  }
  return ds;
}

typedef struct scale_log {
  int steps, grew, shrank;
  double first_scale, last_scale, first_loss, last_loss;
} scale_log;

static int on_step(const kn_train_event *ev, void *user) {
  scale_log *log = user;
  if (ev->kind != KN_EVENT_STEP) return 0;
  double loss = NAN, scale = NAN;
  for (int i = 0; i < ev->n_metrics; i++) {
    if (strcmp(ev->names[i], "loss") == 0) loss = ev->values[i];
    if (strcmp(ev->names[i], "loss_scale") == 0) scale = ev->values[i];
  }
  if (log->steps == 0) {
    log->first_loss = loss;
    log->first_scale = scale;
  } else if (scale > log->last_scale) {
    log->grew = 1;
  } else if (scale < log->last_scale) {
    log->shrank = 1;
  }
  log->last_loss = loss;
  log->last_scale = scale;
  log->steps++;
  return 0;
}

static scale_log train_small_cnn(kn_precision precision, double initial_scale, int64_t interval) {
  static const kn_layer_config layers[4] = {
      {.type = KN_LAYER_CONV2D,
       .name = "conv",
       .filters = 4,
       .kernel_size = {3, 3},
       .padding = KN_PAD_SAME,
       .use_bias = 1,
       .activation = KN_ACT_RELU},
      {.type = KN_LAYER_MAX_POOL2D, .name = "pool"},
      {.type = KN_LAYER_FLATTEN, .name = "flatten"},
      {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .use_bias = 1}};
  kn_model_config mc = {.input_ndim = 3,
                        .input_shape = {6, 6, 1},
                        .n_layers = 4,
                        .layers = layers,
                        .batch_size = 16,
                        .seed = 1,
                        .precision = precision};
  kn_model m;
  char err[512] = "";
  if (kn_model_build(&mc, &m, err, sizeof err)) fail_msg("build: %s", err);
  if (kn_graph_compile(m.graph, 5, NULL, err, sizeof err)) fail_msg("compile: %s", err);
  kn_dataset train = make_bands(320, 6, 9);
  kn_train_config tc = {.epochs = 3,
                        .batch_size = 16,
                        .shuffle = 1,
                        .seed = 2,
                        .log_every_steps = 1,
                        .optimizer = {.type = KN_OPT_SGD, .learning_rate = 0.1f},
                        .initial_loss_scale = initial_scale,
                        .loss_scale_growth_interval = interval};
  scale_log log = {0};
  if (kn_train(&m, &train, NULL, &tc, on_step, &log, err, sizeof err)) fail_msg("train: %s", err);
  kn_dataset_free(&train);
  kn_model_free(&m);
  return log;
}

static void mixed_bfloat16_training_learns(void **state) {
  (void)state;
  scale_log log = train_small_cnn(KN_PRECISION_MIXED_BFLOAT16, 0, 0);
  assert_int_equal(log.steps, 60);
  assert_true(isnan(log.first_scale)); /* no loss scaling in bf16 */
  assert_true(log.last_loss < 0.5 * log.first_loss);
}

static void mixed_float16_training_skips_overflows_and_grows_the_scale(void **state) {
  (void)state;
  /* 2^28 overflows f16 gradients (max 65504) at once: steps are skipped
   * and the scale halved until they fit, then 5 finite steps double it. */
  scale_log log = train_small_cnn(KN_PRECISION_MIXED_FLOAT16, 0x1p28, 5);
  assert_int_equal(log.steps, 60);
  assert_true(log.first_scale < 0x1p28);
  assert_true(log.shrank || log.first_scale < 0x1p27);
  assert_true(log.grew);
  assert_true(log.last_loss < 0.5 * log.first_loss);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(bf16_cast_rounds_to_nearest_even),
      cmocka_unit_test(bf16_rounding_in_place_matches_the_cast),
      cmocka_unit_test(implicit_columns_change_no_bits),
      cmocka_unit_test(residual_blocks_train_the_same_bits_on_each_isa_path),
      cmocka_unit_test(implicit_input_grads_train_the_same),
      cmocka_unit_test(bias_grads_in_gemm_train_the_same),
      cmocka_unit_test(pool_argmax_changes_no_bits_and_shrinks_the_plan),
      cmocka_unit_test(pool_grads_in_gemm_change_no_bits),
      cmocka_unit_test(overlapping_bf16_max_pools_train_the_same_bits_widened),
      cmocka_unit_test(bf16_max_pools_over_a_concatenation_match_the_plain_graph),
      cmocka_unit_test(implicit_columns_survive_a_gemm_switch),
      cmocka_unit_test(f16_cast_saturates_to_inf_and_rounds_below_subnormals_to_zero),
      cmocka_unit_test(casts_between_other_types_are_refused),
      cmocka_unit_test(gradients_through_casts_are_rounded_like_the_narrow_type),
      cmocka_unit_test(mixed_bfloat16_cnn_plans_activations_and_peak_in_at_most_55_percent),
      cmocka_unit_test(recompute_lowers_the_planned_peak_and_keeps_the_losses),
      cmocka_unit_test(model_compile_keeps_the_smaller_plan),
      cmocka_unit_test(mixed_precision_gradients_stay_close_to_float32),
      cmocka_unit_test(mixed_bfloat16_winograd_trains_as_the_bf16_gemm),
      cmocka_unit_test(mixed_bfloat16_winograd_writes_bf16_outputs),
      cmocka_unit_test(mixed_bfloat16_winograd_on_bf16_products_stays_close),
      cmocka_unit_test(amx_tiles_train_as_the_vdpbf16ps_gemm),
      cmocka_unit_test(bf16_max_pools_of_any_width_stay_close_to_float32),
      cmocka_unit_test(recompute_and_mixed_precision_combine),
      cmocka_unit_test(mixed_bfloat16_runs_every_matmul_on_the_bf16_gemm),
      cmocka_unit_test(training_on_either_bf16_kernel_gives_the_same_losses),
      cmocka_unit_test(narrow_copies_change_no_bits),
      cmocka_unit_test(bn_grads_change_no_bits_in_mixed_bfloat16),
      cmocka_unit_test(batch_norms_match_their_definitions),
      cmocka_unit_test(relus_after_rounded_values_fuse_in_mixed_bfloat16),
      cmocka_unit_test(col2im_chunks_change_no_bits_in_mixed_bfloat16),
      cmocka_unit_test(strided_input_gradients_summed_directly_in_mixed_bfloat16),
      cmocka_unit_test(loss_scaler_skips_and_halves_on_inf_and_grows_after_the_interval),
      cmocka_unit_test(mixed_bfloat16_training_learns),
      cmocka_unit_test(mixed_float16_training_skips_overflows_and_grows_the_scale),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
