/* autodiff.c — reverse-mode differentiation that writes gradient nodes into
 * the same graph, so the backward pass is planned and run like the forward.
 * Each op's gradient rule is its op table record's (the first cut's here,
 * the rest in ops.c); contributions from several consumers are summed with
 * add nodes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"

int kn_grad_accumulate(kn_graph *g, kn_node *grads, kn_node target, kn_node d) {
  if (d < 0) return -1;
  if (grads[target] < 0) {
    grads[target] = d;
  } else {
    grads[target] = kn_add(g, grads[target], d);
    if (grads[target] < 0) return -1;
  }
  return 0;
}

/* Whether input k of n exists and depends on a parameter. */
static int needs(const kn_graph *g, const kn_node_rec *n, int k) {
  return n->n_inputs > k && g->nodes[n->inputs[k]].requires_grad;
}

/* ---- the first cut's gradient rules (graph.c's builders). Each reads a
 * copy of its node: pushing nodes may move g->nodes. ---- */

int kn_grad_none(KN_GRAD_ARGS) {
  (void)g, (void)i, (void)dy, (void)grads;
  return 0;
}

int kn_grad_matmul(KN_GRAD_ARGS) {
  const kn_node_rec n = g->nodes[i];
  const kn_node a = n.inputs[0], b = n.inputs[1];
  const int ta = n.attr.matmul.trans_a, tb = n.attr.matmul.trans_b;
  /* C = op(A) op(B): dA = dC op(B)^T (or its transpose), dB = op(A)^T dC. */
  /* dB first: it is the last reader of A (a layer's input, kept from
   * forward), which can then die before dA takes its place. */
  if (needs(g, &n, 1)) {
    kn_node db = tb ? kn_matmul(g, dy, a, 1, ta) : kn_matmul(g, a, dy, !ta, 0);
    if (kn_grad_accumulate(g, grads, b, db)) return -1;
  }
  if (needs(g, &n, 0)) {
    kn_node da = ta ? kn_matmul(g, b, dy, tb, 1) : kn_matmul(g, dy, b, 0, !tb);
    if (kn_grad_accumulate(g, grads, a, da)) return -1;
  }
  return 0;
}

int kn_grad_bias_add(KN_GRAD_ARGS) {
  const kn_node_rec n = g->nodes[i];
  const kn_node a = n.inputs[0], b = n.inputs[1];
  if (needs(g, &n, 0) && kn_grad_accumulate(g, grads, a, dy)) return -1;
  if (needs(g, &n, 1)) {
    kn_node db = kn_push_op(g, KN_OP_REDUCE_ROWS, NULL, 1, dy, -1, -1);
    if (kn_grad_accumulate(g, grads, b, db)) return -1;
  }
  return 0;
}

int kn_grad_add(KN_GRAD_ARGS) {
  const kn_node_rec n = g->nodes[i];
  if (needs(g, &n, 0) && kn_grad_accumulate(g, grads, n.inputs[0], dy)) return -1;
  if (needs(g, &n, 1) && kn_grad_accumulate(g, grads, n.inputs[1], dy)) return -1;
  return 0;
}

int kn_grad_relu(KN_GRAD_ARGS) {
  const kn_node_rec n = g->nodes[i];
  if (!needs(g, &n, 0)) return 0;
  return kn_grad_accumulate(g, grads, n.inputs[0],
                            kn_push_op(g, KN_OP_RELU_GRAD, NULL, 2, dy, i, -1));
}

int kn_grad_softmax(KN_GRAD_ARGS) {
  const kn_node_rec n = g->nodes[i];
  if (!needs(g, &n, 0)) return 0;
  return kn_grad_accumulate(g, grads, n.inputs[0],
                            kn_push_op(g, KN_OP_SOFTMAX_GRAD, NULL, 2, dy, i, -1));
}

int kn_grad_reshape(KN_GRAD_ARGS) {
  const kn_node_rec n = g->nodes[i];
  if (!needs(g, &n, 0)) return 0;
  const kn_node a = n.inputs[0];
  int dims[KN_MAX_DIMS];
  memcpy(dims, g->nodes[a].dims, sizeof dims);
  return kn_grad_accumulate(g, grads, a, kn_reshape(g, dy, g->nodes[a].ndim, dims));
}

int kn_grad_softmax_xent(KN_GRAD_ARGS) {
  const kn_node_rec n = g->nodes[i];
  if (!needs(g, &n, 0)) return 0;
  const kn_node a = n.inputs[0];
  return kn_grad_accumulate(g, grads, a,
                            kn_push_op(g, KN_OP_SOFTMAX_XENT_GRAD, NULL, 3, a, n.inputs[1], dy));
}

int kn_grad_cast(KN_GRAD_ARGS) {
  const kn_node_rec n = g->nodes[i];
  if (!needs(g, &n, 0)) return 0;
  /* Widening: the gradient is rounded through the narrow type, as it
   * would be stored there (f16 underflow and overflow are real; loss
   * scaling is the cure). Narrowing: dy is already that rounded value. */
  if (n.dtype == KN_F32)
    return kn_grad_accumulate(g, grads, n.inputs[0],
                              kn_push_cast(g, dy, KN_F32, kn_cast_via(&n), 0));
  return kn_grad_accumulate(g, grads, n.inputs[0], dy);
}

/* Emits the gradients of node i's inputs given dy, the gradient of its
 * output, by its op's rule. */
static int grad_of(kn_graph *g, kn_node i, kn_node dy, kn_node *grads) {
  const kn_op_def *def = kn_op_def_of(g->nodes[i].op);
  if (!def->grad)
    return kn_graph_fail(g, KN_EINVAL, "autodiff: op %d of node '%s' has no gradient rule",
                         g->nodes[i].op, g->nodes[i].name);
  return def->grad(g, i, dy, grads);
}

int kn_autodiff(kn_graph *g, kn_node loss, char *err, size_t errlen) {
  int rc = KN_OK;
  kn_node *grads = NULL;
  const kn_device building = g->device; /* the gradient nodes go elsewhere, below */
  if (g->error_code) goto out;
  if (g->has_backward || g->compiled) {
    kn_graph_fail(g, KN_ESTATE, "autodiff: the graph already has a backward pass");
    goto out;
  }
  if (loss < 0 || loss >= g->n_nodes || kn_node_elems(&g->nodes[loss], 0) != 1) {
    kn_graph_fail(g, KN_EINVAL, "autodiff: loss must be an existing scalar node");
    goto out;
  }
  int n_forward = g->n_nodes;
  g->has_backward = 1;
  /* Gradient slots for forward nodes only; grad nodes are never differentiated. */
  grads = malloc((size_t)n_forward * sizeof *grads);
  if (!grads) {
    kn_graph_fail(g, KN_ENOMEM, "autodiff: out of memory");
    goto out;
  }
  for (int i = 0; i < n_forward; i++) grads[i] = -1;
  g->nodes[loss].keep = 1;

  /* Seed d(loss)/d(loss) = 1. */
  kn_node_rec seed;
  memset(&seed, 0, sizeof seed);
  seed.op = KN_OP_FILL;
  seed.dtype = KN_F32;
  seed.ndim = 1;
  seed.dims[0] = 1;
  seed.attr.fill.value = 1.0f;
  seed.attr.fill.loss_seed = 1; /* never merged with other fills */
  snprintf(seed.name, sizeof seed.name, "grad/%.100s", g->nodes[loss].name);
  /* Each node's gradient nodes go where it runs (the seed where the loss
   * does, a gradient's copy into its slot where the gradient is). */
  g->device = g->nodes[loss].device;
  grads[loss] = kn_graph_push(g, &seed);
  g->loss_seed = grads[loss];

  char scope[sizeof g->scope];
  snprintf(scope, sizeof scope, "%s", g->scope);
  for (int i = loss; i >= 0 && !g->error_code; i--) {
    if (grads[i] < 0 || !g->nodes[i].requires_grad) continue;
    g->device = g->nodes[i].device;
    char within[sizeof g->scope];
    snprintf(within, sizeof within, "grad/%.90s", g->nodes[i].name);
    kn_graph_set_scope(g, within); /* its gradient's nodes: "grad/<node>/<op>" */
    grad_of(g, i, grads[i], grads);
  }
  kn_graph_set_scope(g, scope);
  if (g->error_code) goto out;

  /* Bind each parameter's final gradient to its slot of the flat buffer. A
   * gradient node that is not a fresh arena value (a view, another
   * parameter's slot) is copied into the slot instead. */
  for (int p = 0; p < g->n_params; p++) {
    kn_node param = g->params[p];
    kn_node d = param < n_forward ? grads[param] : -1;
    if (d < 0) continue; /* unused parameter: its slot stays zero */
    if (g->nodes[d].storage != KN_STORE_ARENA || g->nodes[d].op == KN_OP_FILL ||
        g->nodes[d].op == KN_OP_INPUT) {
      kn_node_rec copy = g->nodes[param];
      memset(copy.inputs, 0, sizeof copy.inputs);
      copy.op = KN_OP_COPY;
      copy.shadow = 0;
      copy.storage = KN_STORE_ARENA;
      copy.n_inputs = 1;
      copy.inputs[0] = d;
      copy.init = KN_INIT_ZEROS;
      /* where the gradient's value is (a view's: its root's), so a
       * gradient a GPU computed is copied within that GPU */
      g->device = g->nodes[kn_storage_root(g, d)].device;
      d = kn_graph_push(g, &copy);
      if (d < 0) goto out;
    }
    kn_node_rec *dn = &g->nodes[d]; /* taken after the push, which may move g->nodes */
    dn->storage = KN_STORE_GRAD;
    dn->flat_offset = g->nodes[param].flat_offset;
    dn->keep = 1;
    snprintf(dn->name, sizeof dn->name, "grad/%.100s", g->nodes[param].name);
  }

out:
  g->device = building;
  free(grads);
  rc = g->error_code;
  if (rc && err && errlen) snprintf(err, errlen, "%s", g->error);
  return rc;
}
