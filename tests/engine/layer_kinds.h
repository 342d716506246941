/* layer_kinds.h — models of every layer kind for the engine's tests
 * (layer_kinds.c), each on (8, 8, 3) inputs. */
#ifndef KILN_TESTS_LAYER_KINDS_H
#define KILN_TESTS_LAYER_KINDS_H

#include "engine.h"

typedef struct kn_test_model {
  const char *name;
  const kn_layer_config *layers;
  int n_layers;
} kn_test_model;

/* branches: convolutions (plain, depthwise, separable), batch norm, a
 * residual add, a concatenation, both pools, activations, dropout, flatten
 * and dense; pooled: pool -> flatten -> dense beside a global average
 * pool, summed; flatten_last: logits that are a view. */
enum { KN_TEST_MODELS = 3 };
extern const kn_test_model kn_test_models[KN_TEST_MODELS];

#endif
