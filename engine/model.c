/* model.c — Keras-style layers turned into graph nodes: a classifier with a
 * sparse categorical cross-entropy loss, differentiated and compiled. */
#include <stdio.h>
#include <string.h>

#include "graph_internal.h"

static const char *layer_kind(kn_layer_type t) {
  switch (t) {
  case KN_LAYER_DENSE: return "dense";
  case KN_LAYER_FLATTEN: return "flatten";
  case KN_LAYER_ACTIVATION: return "activation";
  }
  return "?";
}

static kn_node activate(kn_graph *g, kn_node x, kn_activation act, int is_last) {
  switch (act) {
  case KN_ACT_LINEAR: return x;
  case KN_ACT_RELU: return kn_relu(g, x);
  case KN_ACT_SOFTMAX:
    /* On the last layer the loss applies softmax itself, from the logits. */
    return is_last ? x : kn_softmax(g, x);
  }
  return x;
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
  if (!g) {
    snprintf(err, errlen, "model: out of memory");
    return KN_ENOMEM;
  }
  int dims[KN_MAX_DIMS];
  dims[0] = cfg->batch_size;
  size_t example = 1;
  for (int d = 0; d < cfg->input_ndim; d++) {
    dims[d + 1] = cfg->input_shape[d];
    example *= (size_t)cfg->input_shape[d];
  }
  kn_node x = kn_input(g, "x", KN_F32, cfg->input_ndim + 1, dims);
  kn_node y = kn_input(g, "y", KN_I32, 1, dims);
  kn_node h = x;
  for (int i = 0; i < cfg->n_layers && !g->error_code; i++) {
    const kn_layer_config *L = &cfg->layers[i];
    int is_last = i == cfg->n_layers - 1;
    int ndim, shape[KN_MAX_DIMS];
    kn_node_shape(g, h, &ndim, shape);
    char pname[96];
    switch (L->type) {
    case KN_LAYER_FLATTEN: {
      int flat[2] = {shape[0], 1};
      for (int d = 1; d < ndim; d++) flat[1] *= shape[d];
      h = ndim == 2 ? h : kn_reshape(g, h, 2, flat);
      break;
    }
    case KN_LAYER_DENSE: {
      if (ndim != 2) {
        kn_graph_fail(g, KN_EINVAL, "layer %d (%s): dense needs a flat input; add a flatten layer",
                      i, L->name);
        break;
      }
      int wdims[2] = {shape[1], L->units};
      snprintf(pname, sizeof pname, "%s.kernel", L->name);
      kn_node w = kn_param(g, pname, 2, wdims, KN_INIT_GLOROT_UNIFORM);
      h = kn_matmul(g, h, w, 0, 0);
      if (L->use_bias) {
        snprintf(pname, sizeof pname, "%s.bias", L->name);
        kn_node b = kn_param(g, pname, 1, &L->units, KN_INIT_ZEROS);
        h = kn_bias_add(g, h, b);
      }
      h = activate(g, h, L->activation, is_last);
      break;
    }
    case KN_LAYER_ACTIVATION: h = activate(g, h, L->activation, is_last); break;
    }
    if (h < 0 && !g->error_code) {
      kn_graph_fail(g, KN_EINVAL, "layer %d (%s, %s) failed to build", i, L->name,
                    layer_kind(L->type));
    }
  }
  if (!g->error_code) {
    int ndim, shape[KN_MAX_DIMS];
    kn_node_shape(g, h, &ndim, shape);
    if (ndim != 2 || shape[1] < 2) {
      kn_graph_fail(g, KN_EINVAL, "model: the last layer must give (batch, classes >= 2) scores");
    } else {
      out->n_classes = shape[1];
    }
  }
  kn_node loss = -1;
  if (!g->error_code) {
    kn_graph_keep(g, h);
    loss = kn_softmax_xent(g, h, y);
  }
  int rc = kn_graph_error(g, err, errlen);
  if (!rc) rc = kn_autodiff(g, loss, err, errlen);
  if (rc) {
    kn_graph_free(g);
    memset(out, 0, sizeof *out);
    return rc;
  }
  out->graph = g;
  out->x = x;
  out->y = y;
  out->logits = h;
  out->loss = loss;
  out->example_size = example;
  return KN_OK;
}

void kn_model_free(kn_model *m) {
  if (!m) return;
  kn_graph_free(m->graph);
  m->graph = NULL;
}
