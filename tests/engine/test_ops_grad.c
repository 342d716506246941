/* Every op's gradient rule against central finite differences, in the
 * double-precision reference mode (the same kernel source instantiated for
 * double, so h can be tiny and the tolerance tight), and every op's float
 * kernels against that double reference. A case builds a small graph whose
 * trainable inputs are parameters; its scalar loss is sum(out * r) for a
 * fixed random r, so every output element matters. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"

#define MAX_IN 8

typedef struct ctx {
  kn_graph *g;
  kn_node inputs[MAX_IN];
  int n_inputs;
} ctx;

static kn_node in_f(ctx *c, const char *name, int ndim, const int *dims) {
  kn_node n = kn_input(c->g, name, KN_F32, ndim, dims);
  c->inputs[c->n_inputs++] = n;
  return n;
}

static kn_node labels(ctx *c, int batch) {
  kn_node n = kn_input(c->g, "labels", KN_I32, 1, &batch);
  c->inputs[c->n_inputs++] = n;
  return n;
}

static kn_node param(ctx *c, const char *name, int ndim, const int *dims) {
  return kn_param(c->g, name, ndim, dims, KN_INIT_ZEROS);
}

typedef kn_node (*build_fn)(ctx *c);

/* Builds the case (f64 or not), compiles it and fills parameters and inputs
 * with the same seeded values either way; returns the loss node. */
static kn_node setup(build_fn build, int f64, ctx *c, int *scalar_loss) {
  memset(c, 0, sizeof *c);
  c->g = kn_graph_new();
  kn_node out = build(c);
  char err[512] = "";
  if (kn_graph_error(c->g, err, sizeof err)) fail_msg("build: %s", err);
  int ndim, dims[KN_MAX_DIMS];
  kn_node_shape(c->g, out, &ndim, dims);
  kn_node loss = out;
  *scalar_loss = ndim == 1 && dims[0] == 1;
  if (!*scalar_loss) {
    /* r follows the output: fed per batch when the output is batched (the
     * case has inputs), else a parameter (so its gradient is checked too). */
    kn_node r;
    if (c->n_inputs > 0) {
      r = kn_input(c->g, "r", KN_F32, ndim, dims);
      c->inputs[c->n_inputs++] = r;
    } else {
      r = kn_param(c->g, "r", ndim, dims, KN_INIT_ZEROS);
    }
    loss = kn_sum(c->g, kn_mul(c->g, out, r), -1, 0);
  }
  if (f64) kn_graph_use_f64(c->g);
  if (kn_autodiff(c->g, loss, err, sizeof err)) fail_msg("autodiff: %s", err);
  if (kn_graph_compile(c->g, 1, NULL, err, sizeof err)) fail_msg("compile: %s", err);
  kn_rng rng;
  kn_rng_seed(&rng, 11);
  for (int p = 0; p < kn_param_node_count(c->g); p++) {
    kn_node pn = kn_param_node(c->g, p);
    int pd, pdims[KN_MAX_DIMS];
    kn_node_shape(c->g, pn, &pd, pdims);
    size_t count = 1;
    for (int d = 0; d < pd; d++) count *= (size_t)pdims[d];
    /* "pos*" parameters stay away from zero (divisors, scales). */
    int positive = strncmp(kn_node_name(c->g, pn), "pos", 3) == 0;
    for (size_t i = 0; i < count; i++) {
      double v = positive ? 0.5 + kn_rng_uniform(&rng) : 2.0 * kn_rng_uniform(&rng) - 1.0;
      if (f64) {
        ((double *)kn_node_data(c->g, pn))[i] = v;
      } else {
        ((float *)kn_node_data(c->g, pn))[i] = (float)v;
      }
    }
  }
  for (int k = 0; k < c->n_inputs; k++) {
    kn_node in = c->inputs[k];
    int id, idims[KN_MAX_DIMS];
    kn_node_shape(c->g, in, &id, idims);
    size_t count = 1;
    for (int d = 0; d < id; d++) count *= (size_t)idims[d];
    if (strcmp(kn_node_name(c->g, in), "labels") == 0) {
      int32_t *y = kn_node_data(c->g, in);
      for (size_t i = 0; i < count; i++) y[i] = (int32_t)kn_rng_below(&rng, 3);
      continue;
    }
    for (size_t i = 0; i < count; i++) {
      double v = 2.0 * kn_rng_uniform(&rng) - 1.0;
      if (f64) {
        ((double *)kn_node_data(c->g, in))[i] = v;
      } else {
        ((float *)kn_node_data(c->g, in))[i] = (float)v;
      }
    }
  }
  return loss;
}

static double run_loss(kn_graph *g, kn_node loss, kn_run_mode mode, int batch) {
  char err[512];
  if (kn_graph_run(g, mode, batch, err, sizeof err)) fail_msg("run: %s", err);
  return *(double *)kn_node_data(g, loss);
}

/* The case's batch: the leading dim of its first batched input, or 0. */
static int case_batch(ctx *c) {
  for (int k = 0; k < c->n_inputs; k++) {
    if (strcmp(kn_node_name(c->g, c->inputs[k]), "r") == 0) continue;
    int nd, dims[KN_MAX_DIMS];
    kn_node_shape(c->g, c->inputs[k], &nd, dims);
    return dims[0];
  }
  return 0;
}

static void check_case(build_fn build, const char *name) {
  ctx c;
  int scalar;
  kn_node loss = setup(build, 1, &c, &scalar);
  int batch = case_batch(&c);
  if (!batch) batch = 1;
  run_loss(c.g, loss, KN_RUN_TRAIN, batch);
  size_t n = kn_param_count(c.g);
  assert_true(n > 0);
  double *p = (double *)(void *)kn_params(c.g);
  double *analytic = malloc(n * sizeof *analytic);
  memcpy(analytic, kn_grads(c.g), n * sizeof *analytic);
  const double h = 1e-6;
  double worst = 0.0;
  for (size_t i = 0; i < n; i++) {
    double saved = p[i];
    p[i] = saved + h;
    double up = run_loss(c.g, loss, KN_RUN_FORWARD_TRAIN, batch);
    p[i] = saved - h;
    double down = run_loss(c.g, loss, KN_RUN_FORWARD_TRAIN, batch);
    p[i] = saved;
    double fd = (up - down) / (2 * h);
    double diff = fabs(fd - analytic[i]) / (1e-6 + fabs(fd));
    if (fabs(fd - analytic[i]) > 1e-6 + 1e-5 * fabs(fd)) {
      fail_msg("%s: param %zu: autodiff %.10f vs finite differences %.10f", name, i, analytic[i],
               fd);
    }
    worst = diff > worst ? diff : worst;
  }

  /* The float kernels against the double reference, same values. */
  ctx cf;
  int scalar_f;
  kn_node loss_f = setup(build, 0, &cf, &scalar_f);
  char err[512];
  if (kn_graph_run(cf.g, KN_RUN_TRAIN, batch, err, sizeof err)) fail_msg("run f32: %s", err);
  /* FORWARD_TRAIN: the same dropout mask as the TRAIN run the gradients came from. */
  double ld = run_loss(c.g, loss, KN_RUN_FORWARD_TRAIN, batch);
  double lf = *(float *)kn_node_data(cf.g, loss_f);
  if (fabs(ld - lf) > 1e-4 * (1.0 + fabs(ld))) {
    fail_msg("%s: f32 loss %.8f vs f64 %.8f", name, lf, ld);
  }
  const float *gf = kn_grads(cf.g);
  const double *gd = (const double *)(void *)kn_grads(c.g);
  for (size_t i = 0; i < n; i++) {
    if (fabs(gf[i] - gd[i]) > 1e-4 * (1.0 + fabs(gd[i]))) {
      fail_msg("%s: f32 gradient %zu = %.8f vs f64 %.8f", name, i, gf[i], gd[i]);
    }
  }
  free(analytic);
  kn_graph_free(c.g);
  kn_graph_free(cf.g);
}

/* ---- cases ---- */

static kn_node c_matmul_nn(ctx *c) {
  int ad[2] = {3, 4}, bd[2] = {4, 5};
  return kn_matmul(c->g, param(c, "a", 2, ad), param(c, "b", 2, bd), 0, 0);
}
static kn_node c_matmul_tt(ctx *c) {
  int ad[2] = {4, 3}, bd[2] = {5, 4};
  return kn_matmul(c->g, param(c, "a", 2, ad), param(c, "b", 2, bd), 1, 1);
}
static kn_node c_matmul_tn(ctx *c) {
  int ad[2] = {4, 3}, bd[2] = {4, 5};
  return kn_matmul(c->g, param(c, "a", 2, ad), param(c, "b", 2, bd), 1, 0);
}
static kn_node c_matmul_nt(ctx *c) {
  int ad[2] = {3, 4}, bd[2] = {5, 4};
  return kn_matmul(c->g, param(c, "a", 2, ad), param(c, "b", 2, bd), 0, 1);
}
static kn_node c_bias_relu(ctx *c) {
  int xd[2] = {4, 5}, bd[1] = {5};
  return kn_relu(c->g, kn_bias_add(c->g, param(c, "x", 2, xd), param(c, "b", 1, bd)));
}
static kn_node c_add_softmax(ctx *c) {
  int xd[2] = {3, 4};
  return kn_softmax(c->g, kn_add(c->g, param(c, "x", 2, xd), param(c, "y", 2, xd)));
}
static kn_node c_bcast_add_sub(ctx *c) {
  int ad[3] = {2, 1, 4}, bd[2] = {3, 1};
  kn_node a = param(c, "a", 3, ad), b = param(c, "b", 2, bd);
  return kn_sub(c->g, kn_add_bcast(c->g, a, b), b);
}
static kn_node c_bcast_mul_div(ctx *c) {
  int ad[2] = {3, 4}, bd[1] = {4}, cd[2] = {3, 1};
  kn_node m = kn_mul(c->g, param(c, "a", 2, ad), param(c, "b", 1, bd));
  return kn_div(c->g, m, param(c, "pos_c", 2, cd));
}
static kn_node c_batched_bcast(ctx *c) {
  int xd[3] = {3, 2, 4}, pd[2] = {2, 4};
  kn_node x = in_f(c, "x", 3, xd);
  return kn_mul(c->g, kn_add_bcast(c->g, x, param(c, "p", 2, pd)), param(c, "q", 2, pd));
}
static kn_node c_leaky_relu(ctx *c) {
  int d[2] = {3, 5};
  return kn_leaky_relu(c->g, param(c, "x", 2, d), 0.3f);
}
static kn_node c_elu(ctx *c) {
  int d[2] = {3, 5};
  return kn_elu(c->g, param(c, "x", 2, d), 1.0f);
}
static kn_node c_gelu(ctx *c) {
  int d[2] = {3, 5};
  return kn_gelu(c->g, param(c, "x", 2, d));
}
static kn_node c_sigmoid_tanh(ctx *c) {
  int d[2] = {3, 5};
  kn_node x = param(c, "x", 2, d);
  return kn_add(c->g, kn_sigmoid(c->g, x), kn_tanh(c->g, x));
}
static kn_node c_log_softmax(ctx *c) {
  int d[2] = {3, 5};
  return kn_log_softmax(c->g, param(c, "x", 2, d));
}
static kn_node c_sum_axis(ctx *c) {
  int d[3] = {2, 3, 4};
  return kn_sum(c->g, param(c, "x", 3, d), 1, 0);
}
static kn_node c_mean_keepdims(ctx *c) {
  int d[3] = {2, 3, 4};
  return kn_mean(c->g, param(c, "x", 3, d), 2, 1);
}
static kn_node c_max_axis(ctx *c) {
  int d[3] = {2, 3, 4};
  return kn_max(c->g, param(c, "x", 3, d), 0, 0);
}
static kn_node c_max_all(ctx *c) {
  int d[2] = {3, 4};
  return kn_max(c->g, param(c, "x", 2, d), -1, 0);
}
static kn_node c_transpose(ctx *c) {
  int d[3] = {2, 3, 4}, perm[3] = {2, 0, 1};
  return kn_transpose(c->g, param(c, "x", 3, d), perm);
}
static kn_node c_concat_reshape(ctx *c) {
  int ad[3] = {2, 3, 2}, bd[3] = {2, 3, 1}, rd[2] = {2, 9};
  kn_node cat = kn_concat(c->g, param(c, "a", 3, ad), param(c, "b", 3, bd), 2);
  return kn_reshape(c->g, cat, 2, rd);
}
static kn_node c_concat_mid(ctx *c) {
  int ad[3] = {2, 1, 3}, bd[3] = {2, 2, 3};
  return kn_concat(c->g, param(c, "a", 3, ad), param(c, "b", 3, bd), 1);
}
static kn_node conv_case(ctx *c, int k, int stride, int dil, kn_padding pad) {
  int xd[4] = {2, 6, 5, 3}, wd[4] = {k, k, 3, 4};
  kn_window w = {k, k, stride, stride, dil, dil, pad};
  return kn_conv2d(c->g, param(c, "x", 4, xd), param(c, "w", 4, wd), &w);
}
static kn_node c_conv_valid(ctx *c) {
  return conv_case(c, 3, 1, 1, KN_PAD_VALID);
}
static kn_node c_conv_same_stride2(ctx *c) {
  return conv_case(c, 3, 2, 1, KN_PAD_SAME);
}
/* Input gradients over 16 and 32 channels, which kiln sums directly where
 * its GEMM runs (conv_dx.c): a 3x3 stride-2 "same" convolution on odd
 * sizes (padded on both sides), and a downsampling block's 3x3 and 1x1
 * stride-2 convolutions of one tanh added (the projection's gradient
 * takes in the add); and an identity block's Winograd input gradient
 * (16 channels, 8x8) taking in the shortcut's. */
static kn_node c_conv_stride2_16ch(ctx *c) {
  int xd[4] = {2, 7, 5, 16}, wd[4] = {3, 3, 16, 3};
  kn_window w = {3, 3, 2, 2, 1, 1, KN_PAD_SAME};
  return kn_conv2d(c->g, param(c, "x", 4, xd), param(c, "w", 4, wd), &w);
}
static kn_node c_downsample_add(ctx *c) {
  int xd[4] = {2, 6, 6, 32}, wd[4] = {3, 3, 32, 4}, pd[4] = {1, 1, 32, 4};
  kn_window w3 = {3, 3, 2, 2, 1, 1, KN_PAD_SAME}, w1 = {1, 1, 2, 2, 1, 1, KN_PAD_SAME};
  const kn_node t = kn_tanh(c->g, param(c, "x", 4, xd));
  return kn_add(c->g, kn_conv2d(c->g, t, param(c, "w", 4, wd), &w3),
                kn_conv2d(c->g, t, param(c, "p", 4, pd), &w1));
}
static kn_node c_identity_add(ctx *c) {
  int xd[4] = {1, 8, 8, 16}, wd[4] = {3, 3, 16, 16};
  kn_window w = {3, 3, 1, 1, 1, 1, KN_PAD_SAME};
  const kn_node t = kn_tanh(c->g, param(c, "x", 4, xd));
  return kn_add(c->g, t, kn_conv2d(c->g, t, param(c, "w", 4, wd), &w));
}
static kn_node c_conv_dilated(ctx *c) {
  return conv_case(c, 2, 1, 2, KN_PAD_SAME);
}
static kn_node c_conv_batched_input(ctx *c) {
  int xd[4] = {2, 5, 5, 2}, wd[4] = {3, 3, 2, 3};
  kn_window w = {3, 3, 1, 1, 1, 1, KN_PAD_SAME};
  return kn_conv2d(c->g, in_f(c, "x", 4, xd), param(c, "w", 4, wd), &w);
}
static kn_node c_depthwise(ctx *c) {
  int xd[4] = {2, 5, 4, 3}, wd[4] = {3, 3, 3, 2};
  kn_window w = {3, 3, 1, 1, 1, 1, KN_PAD_SAME};
  return kn_depthwise_conv2d(c->g, param(c, "x", 4, xd), param(c, "w", 4, wd), &w);
}
static kn_node c_depthwise_strided(ctx *c) {
  int xd[4] = {1, 7, 6, 2}, wd[4] = {3, 3, 2, 1};
  kn_window w = {3, 3, 2, 2, 1, 1, KN_PAD_VALID};
  return kn_depthwise_conv2d(c->g, param(c, "x", 4, xd), param(c, "w", 4, wd), &w);
}
/* 11 images (the weight gradient's 8 image blocks, uneven), stride 2 then
 * a depth multiplier: the second's input gradient reaches the first's
 * weights. */
static kn_node c_depthwise_blocks(ctx *c) {
  int xd[4] = {11, 6, 5, 4}, w1[4] = {3, 3, 4, 1}, w2[4] = {3, 3, 4, 2};
  kn_window s2 = {3, 3, 2, 2, 1, 1, KN_PAD_SAME}, s1 = {3, 3, 1, 1, 1, 1, KN_PAD_SAME};
  kn_node h = kn_depthwise_conv2d(c->g, in_f(c, "x", 4, xd), param(c, "w1", 4, w1), &s2);
  return kn_depthwise_conv2d(c->g, h, param(c, "w2", 4, w2), &s1);
}
/* 5x5 taps x 120 output channels: more partial sums than one chunk holds. */
static kn_node c_depthwise_chunks(ctx *c) {
  int xd[4] = {2, 4, 4, 60}, wd[4] = {5, 5, 60, 2};
  kn_window w = {5, 5, 1, 1, 1, 1, KN_PAD_SAME};
  return kn_depthwise_conv2d(c->g, in_f(c, "x", 4, xd), param(c, "w", 4, wd), &w);
}
/* One depth: 20 channels (a register block of 16 and 4 past it), strided
 * then dilated; 5x5 taps x 100 channels (two chunks, each with blocks). */
static kn_node c_depthwise_channel_blocks(ctx *c) {
  int xd[4] = {3, 7, 6, 20}, w1[4] = {3, 3, 20, 1}, w2[4] = {2, 2, 20, 1};
  kn_window s2 = {3, 3, 2, 2, 1, 1, KN_PAD_SAME}, d2 = {2, 2, 1, 1, 2, 2, KN_PAD_SAME};
  kn_node h = kn_depthwise_conv2d(c->g, param(c, "x", 4, xd), param(c, "w1", 4, w1), &s2);
  return kn_depthwise_conv2d(c->g, h, param(c, "w2", 4, w2), &d2);
}
/* 9 x 8 images of 16 channels: pixels whose whole window is inside (taps
 * at fixed offsets) and pixels at every border, in all three kernels. */
static kn_node c_depthwise_interior(ctx *c) {
  int xd[4] = {2, 9, 8, 16}, wd[4] = {3, 3, 16, 1};
  kn_window w = {3, 3, 1, 1, 1, 1, KN_PAD_SAME};
  return kn_depthwise_conv2d(c->g, param(c, "x", 4, xd), param(c, "w", 4, wd), &w);
}
/* A 3x3 window dilated by 2 over 17 channels (the nine sums of a block
 * of 16 held in registers in the weight gradient, and one channel past
 * it), every tap at some border. */
static kn_node c_depthwise_dilated_3x3(ctx *c) {
  int xd[4] = {2, 6, 7, 17}, wd[4] = {3, 3, 17, 1};
  kn_window w = {3, 3, 1, 1, 2, 2, KN_PAD_SAME};
  return kn_depthwise_conv2d(c->g, param(c, "x", 4, xd), param(c, "w", 4, wd), &w);
}
/* Fewer channels than a block of 16: 12 (blocks of 8 at 0 and 4) through
 * a 3x3 window, then a 5x5 one dilated by 2; 6 (blocks of 4 at 0 and 2)
 * through a strided 5x5 one; every tap at some border. */
static kn_node c_depthwise_narrow(ctx *c) {
  int xd[4] = {2, 6, 7, 12}, w1[4] = {3, 3, 12, 1}, w2[4] = {5, 5, 12, 1};
  kn_window s1 = {3, 3, 1, 1, 1, 1, KN_PAD_SAME}, d2 = {5, 5, 1, 1, 2, 2, KN_PAD_SAME};
  kn_node h = kn_depthwise_conv2d(c->g, param(c, "x", 4, xd), param(c, "w1", 4, w1), &s1);
  return kn_depthwise_conv2d(c->g, h, param(c, "w2", 4, w2), &d2);
}
static kn_node c_depthwise_narrow_strided(ctx *c) {
  int xd[4] = {3, 7, 6, 6}, wd[4] = {5, 5, 6, 1};
  kn_window w = {5, 5, 2, 2, 1, 1, KN_PAD_SAME};
  return kn_depthwise_conv2d(c->g, param(c, "x", 4, xd), param(c, "w", 4, wd), &w);
}
/* One channel (a layer on a one-channel image): rows of 16 pixels a
 * vector; 9 pixels wide (a vector past the row's end), a 3x3 window, then
 * a 5x5 one dilated by 2 with stride 2 down the rows, 1 along them; and a
 * valid window on 20 columns (a whole vector and a part). */
static kn_node c_depthwise_one_channel(ctx *c) {
  int xd[4] = {3, 7, 9, 1}, w1[4] = {3, 3, 1, 1}, w2[4] = {5, 5, 1, 1};
  kn_window s1 = {3, 3, 1, 1, 1, 1, KN_PAD_SAME}, d2 = {5, 5, 2, 1, 2, 2, KN_PAD_SAME};
  kn_node h = kn_depthwise_conv2d(c->g, param(c, "x", 4, xd), param(c, "w1", 4, w1), &s1);
  return kn_depthwise_conv2d(c->g, h, param(c, "w2", 4, w2), &d2);
}
static kn_node c_depthwise_one_channel_valid(ctx *c) {
  int xd[4] = {2, 4, 20, 1}, wd[4] = {2, 3, 1, 1};
  kn_window w = {2, 3, 1, 1, 1, 1, KN_PAD_VALID};
  return kn_depthwise_conv2d(c->g, param(c, "x", 4, xd), param(c, "w", 4, wd), &w);
}
/* One channel with a stride along the rows (the row read in phases): 5x5
 * stride 2 "same" on 11 columns; 2x3 stride 3 along the rows, dilated by
 * 2, "valid" on 20. */
static kn_node c_depthwise_one_channel_strided(ctx *c) {
  int xd[4] = {2, 7, 11, 1}, wd[4] = {5, 5, 1, 1};
  kn_window w = {5, 5, 2, 2, 1, 1, KN_PAD_SAME};
  return kn_depthwise_conv2d(c->g, param(c, "x", 4, xd), param(c, "w", 4, wd), &w);
}
static kn_node c_depthwise_one_channel_phases(ctx *c) {
  int xd[4] = {2, 5, 20, 1}, wd[4] = {2, 3, 1, 1};
  kn_window w = {2, 3, 1, 3, 1, 2, KN_PAD_VALID};
  return kn_depthwise_conv2d(c->g, param(c, "x", 4, xd), param(c, "w", 4, wd), &w);
}
/* Two and three channels along the row (16 elements a vector, a lane's
 * channel by its place): 3 channels through a 3x3 window, then a 3x2 one
 * dilated by 2, stride 2 down the rows; one channel of depth multiplier 2
 * (two channels of x repeated). */
static kn_node c_depthwise_three_channels(ctx *c) {
  int xd[4] = {2, 6, 7, 3}, w1[4] = {3, 3, 3, 1}, w2[4] = {3, 2, 3, 1};
  kn_window s1 = {3, 3, 1, 1, 1, 1, KN_PAD_SAME}, d2 = {3, 2, 2, 1, 2, 2, KN_PAD_SAME};
  kn_node h = kn_depthwise_conv2d(c->g, param(c, "x", 4, xd), param(c, "w1", 4, w1), &s1);
  return kn_depthwise_conv2d(c->g, h, param(c, "w2", 4, w2), &d2);
}
static kn_node c_depthwise_two_by_multiplier(ctx *c) {
  int xd[4] = {3, 5, 9, 1}, wd[4] = {3, 3, 1, 2};
  kn_window w = {3, 3, 1, 1, 1, 1, KN_PAD_SAME};
  return kn_depthwise_conv2d(c->g, param(c, "x", 4, xd), param(c, "w", 4, wd), &w);
}
static kn_node c_depthwise_chunks_of_blocks(ctx *c) {
  int xd[4] = {3, 4, 4, 100}, wd[4] = {5, 5, 100, 1};
  kn_window w = {5, 5, 1, 1, 1, 1, KN_PAD_SAME};
  return kn_depthwise_conv2d(c->g, in_f(c, "x", 4, xd), param(c, "w", 4, wd), &w);
}
static kn_node c_max_pool(ctx *c) {
  int xd[4] = {2, 4, 6, 3};
  kn_window w = {2, 2, 2, 2, 1, 1, KN_PAD_VALID};
  return kn_max_pool2d(c->g, param(c, "x", 4, xd), &w);
}
static kn_node c_max_pool_odd_tiles(ctx *c) {
  /* 2x2 stride 2 on an odd image: the last row and column are in no window */
  int xd[4] = {2, 5, 7, 3};
  kn_window w = {2, 2, 2, 2, 1, 1, KN_PAD_VALID};
  return kn_max_pool2d(c->g, param(c, "x", 4, xd), &w);
}
static kn_node c_max_pool_same(ctx *c) {
  int xd[4] = {1, 5, 5, 2};
  kn_window w = {3, 3, 2, 2, 1, 1, KN_PAD_SAME};
  return kn_max_pool2d(c->g, param(c, "x", 4, xd), &w);
}
/* Overlapping windows (3x3, stride 2, and stride 1) over 19 channels: a
 * vector of 16 and a tail, cells taking gradient from several windows. */
static kn_node c_max_pool_overlapping(ctx *c) {
  int xd[4] = {2, 7, 6, 19};
  kn_window w = {3, 3, 2, 2, 1, 1, KN_PAD_SAME};
  return kn_max_pool2d(c->g, param(c, "x", 4, xd), &w);
}
static kn_node c_avg_pool_overlapping(ctx *c) {
  int xd[4] = {2, 5, 6, 19};
  kn_window w = {3, 3, 1, 1, 1, 1, KN_PAD_SAME};
  return kn_avg_pool2d(c->g, param(c, "x", 4, xd), &w);
}
static kn_node c_avg_pool_same(ctx *c) {
  int xd[4] = {2, 5, 4, 2};
  kn_window w = {2, 2, 2, 2, 1, 1, KN_PAD_SAME};
  return kn_avg_pool2d(c->g, param(c, "x", 4, xd), &w);
}
static kn_node c_global_avg_pool(ctx *c) {
  int xd[4] = {2, 3, 4, 5};
  return kn_global_avg_pool2d(c->g, param(c, "x", 4, xd));
}
static kn_node c_batch_norm_2d(ctx *c) {
  int xd[2] = {6, 4}, cd[1] = {4};
  kn_node mm = kn_state(c->g, "mm", 1, cd, KN_INIT_ZEROS);
  kn_node mv = kn_state(c->g, "mv", 1, cd, KN_INIT_ONES);
  return kn_batch_norm(c->g, param(c, "x", 2, xd), param(c, "pos_gamma", 1, cd),
                       param(c, "beta", 1, cd), mm, mv, 0.99f, 1e-3f);
}
static kn_node c_batch_norm_4d(ctx *c) {
  int xd[4] = {2, 3, 3, 2}, cd[1] = {2};
  kn_node mm = kn_state(c->g, "mm", 1, cd, KN_INIT_ZEROS);
  kn_node mv = kn_state(c->g, "mv", 1, cd, KN_INIT_ONES);
  return kn_batch_norm(c->g, param(c, "x", 4, xd), param(c, "pos_gamma", 1, cd),
                       param(c, "beta", 1, cd), mm, mv, 0.9f, 1e-5f);
}
/* 60 rows of 6 channels (runs of 16 rows, and rows past the last run)
 * through a relu, whose gradient the norm's takes in. */
static kn_node c_batch_norm_relu_few_channels(ctx *c) {
  int xd[4] = {3, 4, 5, 6}, cd[1] = {6};
  kn_node mm = kn_state(c->g, "mm", 1, cd, KN_INIT_ZEROS);
  kn_node mv = kn_state(c->g, "mv", 1, cd, KN_INIT_ONES);
  return kn_relu(c->g, kn_batch_norm(c->g, param(c, "x", 4, xd), param(c, "pos_gamma", 1, cd),
                                     param(c, "beta", 1, cd), mm, mv, 0.9f, 1e-3f));
}
/* A residual block's end: a relu's output t (of a tanh, so that its
 * gradient is no parameter's) added to its norm, relu. The
 * add takes in the norm (fuse_adds_into), and in backward the relu
 * gradient of t takes in the add of its two gradients
 * (fuse_add_relu_grads). */
static kn_node c_residual_norm(ctx *c) {
  int xd[4] = {3, 4, 5, 6}, cd[1] = {6};
  kn_node mm = kn_state(c->g, "mm", 1, cd, KN_INIT_ZEROS);
  kn_node mv = kn_state(c->g, "mv", 1, cd, KN_INIT_ONES);
  const kn_node t = kn_relu(c->g, kn_tanh(c->g, param(c, "x", 4, xd)));
  const kn_node n = kn_batch_norm(c->g, t, param(c, "pos_gamma", 1, cd), param(c, "beta", 1, cd),
                                  mm, mv, 0.9f, 1e-3f);
  return kn_relu(c->g, kn_add(c->g, t, n));
}
static kn_node c_dropout(ctx *c) {
  int xd[2] = {4, 6};
  return kn_dropout(c->g, param(c, "x", 2, xd), 0.4f, 99);
}
/* Batched predictions (B, C) from a batched input through a parameter. */
static kn_node predictions(ctx *c, int batch, int cols) {
  int xd[2] = {batch, 3}, wd[2] = {3, cols};
  return kn_matmul(c->g, in_f(c, "x", 2, xd), param(c, "w", 2, wd), 0, 0);
}
static kn_node c_softmax_xent(ctx *c) {
  kn_node logits = predictions(c, 4, 3);
  return kn_softmax_xent(c->g, logits, labels(c, 4));
}
static kn_node c_xent_dense(ctx *c) {
  int td[2] = {4, 3};
  kn_node logits = predictions(c, 4, 3);
  return kn_softmax_xent_dense(c->g, logits, kn_softmax(c->g, in_f(c, "t", 2, td)));
}
static kn_node c_bce(ctx *c) {
  int td[2] = {3, 4};
  kn_node logits = predictions(c, 3, 4);
  return kn_bce_logits(c->g, logits, kn_sigmoid(c->g, in_f(c, "t", 2, td)));
}
static kn_node c_mse_mae(ctx *c) {
  int td[2] = {3, 4};
  kn_node x = predictions(c, 3, 4), t = in_f(c, "t", 2, td);
  return kn_add(c->g, kn_mse(c->g, x, t), kn_mae(c->g, x, t));
}
static kn_node c_top_k_is_a_constant(ctx *c) {
  /* top-k accuracy beside a loss: no gradient flows through the metric. */
  kn_node logits = predictions(c, 4, 3), y = labels(c, 4);
  kn_node acc = kn_top_k_accuracy(c->g, logits, y, 2);
  return kn_add(c->g, kn_softmax_xent(c->g, logits, y), kn_scale(c->g, acc, 0.0f));
}

#define CASE(fn)                                                                                   \
  static void fn##_gradient_matches_finite_differences(void **state) {                             \
    (void)state;                                                                                   \
    check_case(fn, #fn);                                                                           \
  }
CASE(c_matmul_nn)
CASE(c_matmul_tt)
CASE(c_matmul_tn)
CASE(c_matmul_nt)
CASE(c_bias_relu)
CASE(c_add_softmax)
CASE(c_bcast_add_sub)
CASE(c_bcast_mul_div)
CASE(c_batched_bcast)
CASE(c_leaky_relu)
CASE(c_elu)
CASE(c_gelu)
CASE(c_sigmoid_tanh)
CASE(c_log_softmax)
CASE(c_sum_axis)
CASE(c_mean_keepdims)
CASE(c_max_axis)
CASE(c_max_all)
CASE(c_transpose)
CASE(c_concat_reshape)
CASE(c_concat_mid)
CASE(c_conv_valid)
CASE(c_conv_same_stride2)
CASE(c_conv_stride2_16ch)
CASE(c_downsample_add)
CASE(c_identity_add)
CASE(c_conv_dilated)
CASE(c_conv_batched_input)
CASE(c_depthwise)
CASE(c_depthwise_strided)
CASE(c_depthwise_blocks)
CASE(c_depthwise_chunks)
CASE(c_depthwise_channel_blocks)
CASE(c_depthwise_chunks_of_blocks)
CASE(c_depthwise_interior)
CASE(c_depthwise_dilated_3x3)
CASE(c_depthwise_narrow)
CASE(c_depthwise_narrow_strided)
CASE(c_depthwise_one_channel)
CASE(c_depthwise_one_channel_valid)
CASE(c_depthwise_one_channel_strided)
CASE(c_depthwise_one_channel_phases)
CASE(c_depthwise_three_channels)
CASE(c_depthwise_two_by_multiplier)
CASE(c_max_pool)
CASE(c_max_pool_same)
CASE(c_max_pool_odd_tiles)
CASE(c_avg_pool_same)
CASE(c_max_pool_overlapping)
CASE(c_avg_pool_overlapping)
CASE(c_global_avg_pool)
CASE(c_batch_norm_2d)
CASE(c_batch_norm_4d)
CASE(c_batch_norm_relu_few_channels)
CASE(c_residual_norm)
CASE(c_dropout)
CASE(c_softmax_xent)
CASE(c_xent_dense)
CASE(c_bce)
CASE(c_mse_mae)
CASE(c_top_k_is_a_constant)

/* Max pooling's gradient goes to the first input of the window that equals
 * the maximum (row-major, as PyTorch's does), also on ties: channel c of a
 * 2x2 window ties as c % 4 says. 19 channels cover vector bodies and tails. */
static void max_pool_ties_route_the_gradient_to_the_first_maximum(void **state) {
  (void)state;
  enum { C = 19 };
  kn_graph *g = kn_graph_new();
  int xd[4] = {1, 2, 2, C};
  kn_window w = {2, 2, 2, 2, 1, 1, KN_PAD_VALID};
  kn_node x = kn_param(g, "x", 4, xd, KN_INIT_ZEROS);
  kn_node loss = kn_sum(g, kn_max_pool2d(g, x, &w), -1, 0);
  char err[256] = "";
  assert_int_equal(kn_autodiff(g, loss, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(g, 1, NULL, err, sizeof err), KN_OK);
  /* Window values (top-left, top-right, bottom-left, bottom-right) and the
   * one that takes the gradient, by c % 4. */
  static const float v[4][4] = {{5, 5, 5, 5}, {1, 5, 5, 2}, {1, 2, 5, 5}, {1, 2, 3, 5}};
  static const int winner[4] = {0, 1, 2, 3};
  float *p = kn_params(g);
  for (int c = 0; c < C; c++)
    for (int k = 0; k < 4; k++) p[k * C + c] = v[c % 4][k];
  for (kn_isa isa = KN_ISA_BASELINE; isa <= KN_ISA_AVX512; isa++) { /* every CPU path here */
    if (kn_cpu_set_isa(isa, err, sizeof err) != KN_OK) continue;
    assert_int_equal(kn_graph_run(g, KN_RUN_TRAIN, 1, err, sizeof err), KN_OK);
    const float *d = kn_grads(g);
    for (int c = 0; c < C; c++)
      for (int k = 0; k < 4; k++) assert_float_equal(d[k * C + c], k == winner[c % 4], 0.0f);
  }
  assert_int_equal(kn_cpu_set_isa(KN_ISA_AUTO, err, sizeof err), KN_OK);
  kn_graph_free(g);
}

/* Overlapping windows (3x3, stride 2, "same") on float32, on every CPU path:
 * the pooled maxima and, with loss = sum(w * pool(x)), each cell's gradient
 * (the sum of w over the windows whose first maximum it is), against
 * loops here. Values from {0..3} make ties in most windows; 19 channels
 * cover a vector of 16 and one ending at the last channel, 12 two of 8, 6
 * two of 4, 3 none; a NaN cell wins its windows. */
enum { MP_B = 2, MP_H = 7, MP_W = 6, MP_C = 19, MP_OH = 4, MP_OW = 3 };
static void overlapping_max_pool_matches_a_reference(int C) {
  enum { B = MP_B, H = MP_H, W = MP_W, OH = MP_OH, OW = MP_OW };
  kn_graph *g = kn_graph_new();
  int xd[4] = {B, H, W, C}, yd[4] = {B, OH, OW, C};
  kn_window win = {3, 3, 2, 2, 1, 1, KN_PAD_SAME};
  kn_node x = kn_param(g, "x", 4, xd, KN_INIT_ZEROS);
  kn_node wts = kn_param(g, "w", 4, yd, KN_INIT_ZEROS);
  kn_node y = kn_max_pool2d(g, x, &win);
  kn_graph_keep(g, y);
  kn_node loss = kn_sum(g, kn_mul(g, y, wts), -1, 0);
  char err[256] = "";
  assert_int_equal(kn_autodiff(g, loss, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(g, 1, NULL, err, sizeof err), KN_OK);
  float *p = kn_params(g);
  float *xv = p + kn_param_offset(g, x), *wv = p + kn_param_offset(g, wts);
  for (int i = 0; i < B * H * W * C; i++) xv[i] = (float)((i * 7 + i / 5) % 4);
  xv[(1 * H * W + 3 * W + 2) * C + (C > 17 ? 17 : C - 1)] = NAN;
  for (int i = 0; i < B * OH * OW * C; i++) wv[i] = (float)(1 + i % 5);
  static float want_y[B * OH * OW * MP_C], want_dx[B * H * W * MP_C];
  memset(want_dx, 0, sizeof want_dx); /* the first B * H * W * C read */
  for (int b = 0; b < B; b++)
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++)
        for (int c = 0; c < C; c++) { /* "same": 1 row above, no column to the left */
          int first = -1;
          float m = 0;
          for (int ih = oh * 2 - 1; ih <= oh * 2 + 1; ih++)
            for (int iw = ow * 2; iw <= ow * 2 + 2; iw++) {
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              const int at = ((b * H + ih) * W + iw) * C + c;
              if (first < 0 || xv[at] > m || isnan(xv[at])) m = xv[at]; /* a NaN stays */
              first = first < 0 ? at : first;
            }
          for (int ih = oh * 2 - 1, done = 0; ih <= oh * 2 + 1 && !done; ih++)
            for (int iw = ow * 2; iw <= ow * 2 + 2 && !done; iw++) {
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              const int at = ((b * H + ih) * W + iw) * C + c;
              if (xv[at] == m || isnan(xv[at])) {
                want_dx[at] += wv[((b * OH + oh) * OW + ow) * C + c];
                done = 1;
              }
            }
          want_y[((b * OH + oh) * OW + ow) * C + c] = m;
        }
  for (kn_isa isa = KN_ISA_BASELINE; isa <= KN_ISA_AVX512; isa++) {
    if (kn_cpu_set_isa(isa, err, sizeof err) != KN_OK) continue;
    assert_int_equal(kn_graph_run(g, KN_RUN_TRAIN, B, err, sizeof err), KN_OK);
    const float *got_y = kn_node_data(g, y), *d = kn_grads(g) + kn_param_offset(g, x);
    for (int i = 0; i < B * OH * OW * C; i++) {
      if (isnan(want_y[i]))
        assert_true(isnan(got_y[i]));
      else
        assert_float_equal(got_y[i], want_y[i], 0.0f);
    }
    for (int i = 0; i < B * H * W * C; i++) assert_float_equal(d[i], want_dx[i], 0.0f);
  }
  assert_int_equal(kn_cpu_set_isa(KN_ISA_AUTO, err, sizeof err), KN_OK);
  kn_graph_free(g);
}

static void overlapping_max_pools_match_a_reference_on_every_path(void **state) {
  (void)state;
  const int channels[] = {MP_C, 12, 6, 3};
  for (size_t k = 0; k < sizeof channels / sizeof channels[0]; k++)
    overlapping_max_pool_matches_a_reference(channels[k]);
}

#define T(fn) cmocka_unit_test(fn##_gradient_matches_finite_differences)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(c_matmul_nn),
      T(c_matmul_tt),
      T(c_matmul_tn),
      T(c_matmul_nt),
      T(c_bias_relu),
      T(c_add_softmax),
      T(c_bcast_add_sub),
      T(c_bcast_mul_div),
      T(c_batched_bcast),
      T(c_leaky_relu),
      T(c_elu),
      T(c_gelu),
      T(c_sigmoid_tanh),
      T(c_log_softmax),
      T(c_sum_axis),
      T(c_mean_keepdims),
      T(c_max_axis),
      T(c_max_all),
      T(c_transpose),
      T(c_concat_reshape),
      T(c_concat_mid),
      T(c_conv_valid),
      T(c_conv_same_stride2),
      T(c_conv_stride2_16ch),
      T(c_downsample_add),
      T(c_identity_add),
      T(c_conv_dilated),
      T(c_conv_batched_input),
      T(c_depthwise),
      T(c_depthwise_strided),
      T(c_depthwise_blocks),
      T(c_depthwise_chunks),
      T(c_depthwise_channel_blocks),
      T(c_depthwise_chunks_of_blocks),
      T(c_depthwise_interior),
      T(c_depthwise_dilated_3x3),
      T(c_depthwise_narrow),
      T(c_depthwise_narrow_strided),
      T(c_depthwise_one_channel),
      T(c_depthwise_one_channel_valid),
      T(c_depthwise_one_channel_strided),
      T(c_depthwise_one_channel_phases),
      T(c_depthwise_three_channels),
      T(c_depthwise_two_by_multiplier),
      T(c_max_pool),
      T(c_max_pool_same),
      T(c_max_pool_odd_tiles),
      T(c_avg_pool_same),
      T(c_max_pool_overlapping),
      T(c_avg_pool_overlapping),
      T(c_global_avg_pool),
      T(c_batch_norm_2d),
      T(c_batch_norm_4d),
      T(c_batch_norm_relu_few_channels),
      T(c_residual_norm),
      T(c_dropout),
      T(c_softmax_xent),
      T(c_xent_dense),
      T(c_bce),
      T(c_mse_mae),
      T(c_top_k_is_a_constant),
      cmocka_unit_test(max_pool_ties_route_the_gradient_to_the_first_maximum),
      cmocka_unit_test(overlapping_max_pools_match_a_reference_on_every_path),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
