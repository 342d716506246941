/* model.c — Keras-style layers turned into graph nodes: a classifier or a
 * regressor with one of Keras's losses, differentiated and compiled. Layers
 * form a DAG (each reads the previous layer or the layers it names), with
 * Keras's names, defaults and parameter names ("<layer>.kernel", ...). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"

const char *kn_layer_kind(kn_layer_type t) {
  switch (t) {
  case KN_LAYER_DENSE: return "dense";
  case KN_LAYER_FLATTEN: return "flatten";
  case KN_LAYER_ACTIVATION: return "activation";
  case KN_LAYER_CONV2D: return "conv2d";
  case KN_LAYER_DEPTHWISE_CONV2D: return "depthwise_conv2d";
  case KN_LAYER_SEPARABLE_CONV2D: return "separable_conv2d";
  case KN_LAYER_BATCH_NORM: return "batch_norm";
  case KN_LAYER_DROPOUT: return "dropout";
  case KN_LAYER_MAX_POOL2D: return "max_pool2d";
  case KN_LAYER_AVG_POOL2D: return "avg_pool2d";
  case KN_LAYER_GLOBAL_AVG_POOL2D: return "global_avg_pool2d";
  case KN_LAYER_ADD: return "add";
  case KN_LAYER_CONCATENATE: return "concatenate";
  }
  return "?";
}

int kn_loss_is_regression(kn_loss loss) {
  return loss == KN_LOSS_MSE || loss == KN_LOSS_MAE;
}

static kn_node activate(kn_graph *g, kn_node x, const kn_layer_config *L, int is_last,
                        kn_loss loss) {
  switch (L->activation) {
  case KN_ACT_LINEAR: return x;
  case KN_ACT_RELU: return kn_relu(g, x);
  case KN_ACT_SOFTMAX:
    /* On the last layer the loss applies softmax itself, from the logits. */
    return is_last && (loss == KN_LOSS_SPARSE_XENT || loss == KN_LOSS_XENT) ? x : kn_softmax(g, x);
  case KN_ACT_LEAKY_RELU: return kn_leaky_relu(g, x, L->alpha > 0.0f ? L->alpha : 0.3f);
  case KN_ACT_ELU: return kn_elu(g, x, L->alpha > 0.0f ? L->alpha : 1.0f);
  case KN_ACT_GELU: return kn_gelu(g, x);
  case KN_ACT_SIGMOID:
    /* Likewise binary cross-entropy applies the sigmoid from the logits. */
    return is_last && loss == KN_LOSS_BCE ? x : kn_sigmoid(g, x);
  case KN_ACT_TANH: return kn_tanh(g, x);
  }
  return x;
}

static int or_default(int v, int dflt) {
  return v > 0 ? v : dflt;
}

kn_window kn_layer_conv_window(const kn_layer_config *L) {
  kn_window w = {.kh = L->kernel_size[0],
                 .kw = L->kernel_size[1] ? L->kernel_size[1] : L->kernel_size[0],
                 .stride_h = or_default(L->strides[0], 1),
                 .stride_w = or_default(L->strides[1], or_default(L->strides[0], 1)),
                 .dilation_h = or_default(L->dilation_rate[0], 1),
                 .dilation_w = or_default(L->dilation_rate[1], or_default(L->dilation_rate[0], 1)),
                 .padding = L->padding};
  return w;
}

kn_window kn_layer_pool_window(const kn_layer_config *L) {
  int ph = or_default(L->pool_size[0], 2), pw = or_default(L->pool_size[1], ph);
  /* Keras: strides default to the pool size. */
  int sh = or_default(L->strides[0], ph), sw = or_default(L->strides[1], L->strides[0] ? sh : pw);
  kn_window w = {ph, pw, sh, sw, 1, 1, L->padding};
  return w;
}

static kn_node add_bias(kn_graph *g, kn_node h, const kn_layer_config *L, int units) {
  if (!L->use_bias) return h;
  char pname[96];
  snprintf(pname, sizeof pname, "%s.bias", L->name);
  return kn_bias_add(g, h, kn_param(g, pname, 1, &units, L->bias_initializer));
}

static kn_init kernel_init(const kn_layer_config *L) {
  return L->kernel_initializer_set ? L->kernel_initializer : KN_INIT_GLOROT_UNIFORM;
}

/* Builds layer i on its input(s); returns the output node or -1. */
static kn_node build_layer(kn_graph *g, const kn_model_config *cfg, int i, const kn_node *ins,
                           int n_ins) {
  const kn_layer_config *L = &cfg->layers[i];
  int is_last = i == cfg->n_layers - 1;
  kn_node h = ins[0];
  int ndim, shape[KN_MAX_DIMS];
  kn_node_shape(g, h, &ndim, shape);
  char pname[96];
  if (n_ins > 1 && L->type != KN_LAYER_ADD && L->type != KN_LAYER_CONCATENATE) {
    return kn_graph_fail(g, KN_EINVAL, "layer %d (%s): a %s layer takes one input, got %d", i,
                         L->name, kn_layer_kind(L->type), n_ins);
  }
  switch (L->type) {
  case KN_LAYER_FLATTEN: return kn_flatten(g, h);
  case KN_LAYER_DENSE: {
    if (ndim != 2) {
      return kn_graph_fail(
          g, KN_EINVAL, "layer %d (%s): dense needs a flat input; add a flatten layer", i, L->name);
    }
    int wdims[2] = {shape[1], L->units};
    snprintf(pname, sizeof pname, "%s.kernel", L->name);
    h = kn_matmul(g, h, kn_param(g, pname, 2, wdims, kernel_init(L)), 0, 0);
    return activate(g, add_bias(g, h, L, L->units), L, is_last, cfg->loss);
  }
  case KN_LAYER_ACTIVATION: return activate(g, h, L, is_last, cfg->loss);
  case KN_LAYER_CONV2D: {
    if (ndim != 4) break;
    kn_window w = kn_layer_conv_window(L);
    int wdims[4] = {w.kh, w.kw, shape[3], L->filters};
    snprintf(pname, sizeof pname, "%s.kernel", L->name);
    h = kn_conv2d(g, h, kn_param(g, pname, 4, wdims, kernel_init(L)), &w);
    return activate(g, add_bias(g, h, L, L->filters), L, is_last, cfg->loss);
  }
  case KN_LAYER_DEPTHWISE_CONV2D:
  case KN_LAYER_SEPARABLE_CONV2D: {
    if (ndim != 4) break;
    kn_window w = kn_layer_conv_window(L);
    int mult = or_default(L->depth_multiplier, 1);
    int wdims[4] = {w.kh, w.kw, shape[3], mult};
    snprintf(pname, sizeof pname, "%s.depthwise_kernel", L->name);
    h = kn_depthwise_conv2d(g, h, kn_param(g, pname, 4, wdims, kernel_init(L)), &w);
    int out = shape[3] * mult;
    if (L->type == KN_LAYER_SEPARABLE_CONV2D) {
      /* The pointwise 1x1 convolution is a GEMM over every pixel:
       * (B*OH*OW, C*M) x (C*M, F). */
      int hd, hs[KN_MAX_DIMS];
      kn_node_shape(g, h, &hd, hs);
      int rows[2] = {hs[0] * hs[1] * hs[2], out}, pdims[4] = {1, 1, out, L->filters};
      int flat[2] = {out, L->filters}, back[4] = {hs[0], hs[1], hs[2], L->filters};
      snprintf(pname, sizeof pname, "%s.pointwise_kernel", L->name);
      kn_node pw = kn_param(g, pname, 4, pdims, kernel_init(L));
      h = kn_matmul(g, kn_reshape(g, h, 2, rows), kn_reshape(g, pw, 2, flat), 0, 0);
      h = kn_reshape(g, h, 4, back);
      out = L->filters;
    }
    return activate(g, add_bias(g, h, L, out), L, is_last, cfg->loss);
  }
  case KN_LAYER_BATCH_NORM: {
    int c = shape[ndim - 1];
    kn_node v[4];
    static const char *const names[4] = {"gamma", "beta", "moving_mean", "moving_variance"};
    for (int k = 0; k < 4; k++) {
      snprintf(pname, sizeof pname, "%s.%s", L->name, names[k]);
      kn_init init = (k == 0 || k == 3) ? KN_INIT_ONES : KN_INIT_ZEROS;
      v[k] = k < 2 ? kn_param(g, pname, 1, &c, init) : kn_state(g, pname, 1, &c, init);
    }
    float momentum = L->momentum > 0.0f ? L->momentum : 0.99f;
    float eps = L->epsilon > 0.0f ? L->epsilon : 1e-3f;
    return L->synchronized ? kn_batch_norm_synchronized(g, h, v[0], v[1], v[2], v[3], momentum, eps)
                           : kn_batch_norm(g, h, v[0], v[1], v[2], v[3], momentum, eps);
  }
  case KN_LAYER_DROPOUT:
    /* One stream per layer: the same seed gives the same masks. */
    return kn_dropout(g, h, L->rate, cfg->seed * 1000003ULL + (uint64_t)i);
  case KN_LAYER_MAX_POOL2D:
  case KN_LAYER_AVG_POOL2D: {
    if (ndim != 4) break;
    kn_window w = kn_layer_pool_window(L);
    return L->type == KN_LAYER_MAX_POOL2D ? kn_max_pool2d(g, h, &w) : kn_avg_pool2d(g, h, &w);
  }
  case KN_LAYER_GLOBAL_AVG_POOL2D: return kn_global_avg_pool2d(g, h);
  case KN_LAYER_ADD:
  case KN_LAYER_CONCATENATE: {
    if (n_ins < 2) {
      return kn_graph_fail(g, KN_EINVAL, "layer %d (%s): %s needs at least 2 inputs, got %d", i,
                           L->name, kn_layer_kind(L->type), n_ins);
    }
    for (int k = 1; k < n_ins; k++) {
      h = L->type == KN_LAYER_ADD ? kn_add(g, h, ins[k])
                                  : kn_concat(g, h, ins[k], L->axis ? L->axis : -1);
    }
    return h;
  }
  }
  char s[64];
  int used = snprintf(s, sizeof s, "(");
  for (int d = 1; d < ndim && used < (int)sizeof s; d++)
    used += snprintf(s + used, sizeof s - (size_t)used, d > 1 ? ", %d" : "%d", shape[d]);
  if (used < (int)sizeof s) snprintf(s + used, sizeof s - (size_t)used, ")");
  return kn_graph_fail(g, KN_EINVAL,
                       "layer %d (%s): %s needs an image input (height, width, channels), got %s",
                       i, L->name, kn_layer_kind(L->type), s);
}

int kn_model_build(const kn_model_config *cfg, kn_model *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (cfg->batch_size < 1) {
    snprintf(err, errlen, "model: batch_size must be >= 1, got %d", cfg->batch_size);
    return KN_EINVAL;
  }
  if (cfg->input_ndim < 1 || cfg->input_ndim >= KN_MAX_DIMS) {
    snprintf(err, errlen, "model: input rank must be 1..%d, got %d", KN_MAX_DIMS - 1,
             cfg->input_ndim);
    return KN_EINVAL;
  }
  if (cfg->n_layers < 1) {
    snprintf(err, errlen, "model: needs at least one layer");
    return KN_EINVAL;
  }
  kn_graph *g = kn_graph_new();
  kn_node *outputs = calloc((size_t)cfg->n_layers, sizeof *outputs);
  if (!g || !outputs) {
    kn_graph_free(g);
    free(outputs);
    snprintf(err, errlen, "model: out of memory");
    return KN_ENOMEM;
  }
  int prc = kn_graph_set_precision(g, cfg->precision, err, errlen);
  if (prc) {
    kn_graph_free(g);
    free(outputs);
    return prc;
  }
  kn_graph_set_recompute(g, cfg->recompute);
  kn_graph_set_allow_tf32(g, cfg->allow_tf32);
  int dims[KN_MAX_DIMS];
  dims[0] = cfg->batch_size;
  size_t example = 1;
  for (int d = 0; d < cfg->input_ndim; d++) {
    dims[d + 1] = cfg->input_shape[d];
    example *= (size_t)cfg->input_shape[d];
  }
  kn_node x = kn_input(g, "x", KN_F32, cfg->input_ndim + 1, dims);
  /* Class ids are known now; the other losses' targets take the last
   * layer's width, made once the layers are built. */
  const int sparse = cfg->loss == KN_LOSS_SPARSE_XENT;
  kn_node y = sparse ? kn_input(g, "y", KN_I32, 1, dims) : -1;
  kn_node h = x;
  for (int i = 0; i < cfg->n_layers && !g->error_code; i++) {
    const kn_layer_config *L = &cfg->layers[i];
    kn_node ins[KN_LAYER_MAX_INPUTS];
    int n_ins = L->n_inputs > 0 ? L->n_inputs : 1;
    if (n_ins > KN_LAYER_MAX_INPUTS) {
      kn_graph_fail(g, KN_EINVAL, "layer %d (%s): at most %d inputs, got %d", i, L->name,
                    KN_LAYER_MAX_INPUTS, n_ins);
      break;
    }
    for (int k = 0; k < n_ins; k++) {
      int from = L->n_inputs > 0 ? L->inputs[k] : i - 1;
      if (from >= i || from < -1) {
        kn_graph_fail(g, KN_EINVAL,
                      "layer %d (%s): input %d must be an earlier layer (or -1, the model "
                      "input), got %d",
                      i, L->name, k, from);
        break;
      }
      ins[k] = from < 0 ? x : outputs[from];
    }
    if (g->error_code) break;
    char scope[96];
    if (L->name[0])
      snprintf(scope, sizeof scope, "%s", L->name);
    else
      snprintf(scope, sizeof scope, "%s_%d", kn_layer_kind(L->type), i);
    kn_graph_set_scope(g, scope);
    kn_graph_set_device(g, L->placed ? L->device : cfg->device);
    h = build_layer(g, cfg, i, ins, n_ins);
    if (h < 0 && !g->error_code) {
      kn_graph_fail(g, KN_EINVAL, "layer %d (%s, %s) failed to build", i, L->name,
                    kn_layer_kind(L->type));
    }
    /* In a mixed graph the next layer reads this one's output as stored,
     * in the narrow type; the last layer's logits reach the loss in f32. */
    if (i + 1 < cfg->n_layers) h = kn_narrow_boundary(g, h);
    outputs[i] = h;
  }
  const int min_outputs = cfg->loss == KN_LOSS_SPARSE_XENT || cfg->loss == KN_LOSS_XENT ? 2 : 1;
  if ((int)cfg->loss < (int)KN_LOSS_SPARSE_XENT || (int)cfg->loss > (int)KN_LOSS_MAE) {
    kn_graph_fail(g, KN_EINVAL, "model: unknown loss %d", (int)cfg->loss);
  } else if (!g->error_code) {
    int ndim, shape[KN_MAX_DIMS];
    kn_node_shape(g, h, &ndim, shape);
    if (ndim != 2 || shape[1] < min_outputs) {
      kn_graph_fail(g, KN_EINVAL, "model: the last layer must give (batch, %s >= %d) %s",
                    kn_loss_is_regression(cfg->loss) ? "outputs" : "classes", min_outputs,
                    kn_loss_is_regression(cfg->loss) ? "predictions" : "scores");
    } else {
      out->n_outputs = shape[1];
      out->n_classes = kn_loss_is_regression(cfg->loss) ? 0 : shape[1];
    }
  }
  kn_node loss = -1;
  kn_graph_set_scope(g, "loss");
  kn_graph_set_device(g, cfg->device);
  if (!g->error_code) {
    kn_graph_keep(g, h);
    if (!sparse) {
      int ydims[2] = {cfg->batch_size, out->n_outputs};
      y = kn_input(g, "y", KN_F32, 2, ydims);
    }
    switch (cfg->loss) {
    case KN_LOSS_SPARSE_XENT: loss = kn_softmax_xent(g, h, y); break;
    case KN_LOSS_XENT: loss = kn_softmax_xent_dense(g, h, y); break;
    case KN_LOSS_BCE: loss = kn_bce_logits(g, h, y); break;
    case KN_LOSS_MSE: loss = kn_mse(g, h, y); break;
    case KN_LOSS_MAE: loss = kn_mae(g, h, y); break;
    }
  }
  kn_graph_set_scope(g, NULL);
  /* Soft placement: each layer's nodes went to its device (or the
   * model's); those the device has no kernel for run on the host, and
   * autodiff puts each gradient node where its forward node runs. */
  kn_graph_place_fallback(g);
  int rc = kn_graph_error(g, err, errlen);
  if (!rc) rc = kn_autodiff(g, loss, err, errlen);
  if (!rc) {
    kn_graph_place_fallback(g);
    rc = kn_graph_error(g, err, errlen);
  }
  if (rc) {
    kn_graph_free(g);
    free(outputs);
    memset(out, 0, sizeof *out);
    return rc;
  }
  /* What the loss folded away from the last layer (activate, above). */
  const kn_layer_config *last = &cfg->layers[cfg->n_layers - 1];
  const int activates = last->type == KN_LAYER_DENSE || last->type == KN_LAYER_ACTIVATION ||
                        last->type == KN_LAYER_CONV2D || last->type == KN_LAYER_DEPTHWISE_CONV2D ||
                        last->type == KN_LAYER_SEPARABLE_CONV2D;
  if (!activates)
    out->output_activation = KN_ACT_LINEAR;
  else if (last->activation == KN_ACT_SOFTMAX &&
           (cfg->loss == KN_LOSS_SPARSE_XENT || cfg->loss == KN_LOSS_XENT))
    out->output_activation = KN_ACT_SOFTMAX;
  else if (last->activation == KN_ACT_SIGMOID && cfg->loss == KN_LOSS_BCE)
    out->output_activation = KN_ACT_SIGMOID;
  else
    out->output_activation = KN_ACT_LINEAR;
  out->layer_outputs = outputs;
  out->graph = g;
  out->x = x;
  out->y = y;
  out->logits = h;
  out->loss = loss;
  out->loss_kind = cfg->loss;
  out->example_size = example;
  return KN_OK;
}

int kn_model_compile(kn_model *m, const kn_model_config *cfg, uint64_t seed, kn_plan_stats *stats,
                     char *err, size_t errlen) {
  kn_plan_stats with;
  int rc = kn_graph_compile(m->graph, seed, &with, err, errlen);
  /* Not with the unoptimized plan or in the double-precision reference
   * mode: they are for comparing kernels, and keep the graph as asked. */
  if (!rc && cfg->recompute && with.n_recomputed > 0 && !m->graph->unoptimized && !m->graph->f64) {
    kn_model_config plain = *cfg;
    plain.recompute = 0;
    kn_model alt;
    kn_plan_stats without;
    char alt_err[256];
    if (kn_model_build(&plain, &alt, alt_err, sizeof alt_err) == KN_OK) {
      kn_graph_set_threads(alt.graph, m->graph->threads);
      alt.graph->passes = m->graph->passes;
      alt.graph->passes_set = m->graph->passes_set;
      alt.graph->plan_only = m->graph->plan_only;
      if (kn_graph_compile(alt.graph, seed, &without, alt_err, sizeof alt_err) == KN_OK &&
          without.arena_bytes < with.arena_bytes) {
        without.recompute_declined_bytes = with.arena_bytes;
        kn_model_free(m);
        *m = alt;
        with = without;
      } else {
        kn_model_free(&alt);
      }
    }
  }
  if (!rc && stats) *stats = with;
  return rc;
}

void kn_model_free(kn_model *m) {
  if (!m) return;
  kn_graph_free(m->graph);
  m->graph = NULL;
  free(m->layer_outputs);
  m->layer_outputs = NULL;
}
