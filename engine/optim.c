/* optim.c — optimizers as one fused loop over the flat parameter buffer.
 * Update rules follow PyTorch's (torch.optim.SGD / Adam), which parity tests
 * compare against; with a constant learning rate Keras's SGD momentum rule
 * gives the same iterates. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

struct kn_optimizer {
  kn_optimizer_config cfg;
  size_t n;
  int64_t iterations;
  float *m; /* (n) momentum buffer (sgd) or first moment (adam) */
  float *v; /* (n) second moment (adam) */
};

int kn_optimizer_new(const kn_optimizer_config *cfg, size_t n_params, kn_optimizer **out, char *err,
                     size_t errlen) {
  *out = NULL;
  if (!(cfg->learning_rate > 0.0f) || !isfinite(cfg->learning_rate)) {
    snprintf(err, errlen, "optimizer: learning_rate must be > 0, got %g", cfg->learning_rate);
    return KN_EINVAL;
  }
  if (cfg->type == KN_OPT_SGD && (cfg->momentum < 0.0f || cfg->momentum >= 1.0f)) {
    snprintf(err, errlen, "sgd: momentum must be in [0, 1), got %g", cfg->momentum);
    return KN_EINVAL;
  }
  if (cfg->type == KN_OPT_ADAM && (cfg->beta1 < 0.0f || cfg->beta1 >= 1.0f || cfg->beta2 < 0.0f ||
                                   cfg->beta2 >= 1.0f || !(cfg->epsilon > 0.0f))) {
    snprintf(err, errlen, "adam: need 0 <= beta1, beta2 < 1 and epsilon > 0, got %g, %g, %g",
             cfg->beta1, cfg->beta2, cfg->epsilon);
    return KN_EINVAL;
  }
  kn_optimizer *opt = calloc(1, sizeof *opt);
  if (!opt) goto nomem;
  opt->cfg = *cfg;
  opt->n = n_params;
  size_t bytes = (n_params ? n_params : 1) * sizeof(float);
  int needs_m = cfg->type == KN_OPT_ADAM || cfg->momentum > 0.0f;
  if (needs_m && !(opt->m = calloc(1, bytes))) goto nomem;
  if (cfg->type == KN_OPT_ADAM && !(opt->v = calloc(1, bytes))) goto nomem;
  *out = opt;
  return KN_OK;
nomem:
  kn_optimizer_free(opt);
  snprintf(err, errlen, "optimizer: out of memory for %zu parameters", n_params);
  return KN_ENOMEM;
}

void kn_optimizer_free(kn_optimizer *opt) {
  if (!opt) return;
  free(opt->m);
  free(opt->v);
  free(opt);
}

int64_t kn_optimizer_iterations(const kn_optimizer *opt) {
  return opt->iterations;
}

static void sgd_step(kn_optimizer *opt, float *restrict p, const float *restrict g) {
  const float lr = opt->cfg.learning_rate, mu = opt->cfg.momentum;
  const size_t n = opt->n;
  if (!opt->m) {
    for (size_t i = 0; i < n; i++) p[i] -= lr * g[i];
    return;
  }
  float *restrict buf = opt->m;
  /* The first step seeds the buffer with the gradient, as torch does. */
  const float damp = opt->iterations == 0 ? 0.0f : mu;
  if (opt->cfg.nesterov) {
    for (size_t i = 0; i < n; i++) {
      buf[i] = damp * buf[i] + g[i];
      p[i] -= lr * (g[i] + mu * buf[i]);
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      buf[i] = damp * buf[i] + g[i];
      p[i] -= lr * buf[i];
    }
  }
}

static void adam_step(kn_optimizer *opt, float *restrict p, const float *restrict g) {
  const float b1 = opt->cfg.beta1, b2 = opt->cfg.beta2, eps = opt->cfg.epsilon;
  const double t = (double)(opt->iterations + 1);
  const float step_size = (float)(opt->cfg.learning_rate / (1.0 - pow(b1, t)));
  const float inv_sqrt_bc2 = (float)(1.0 / sqrt(1.0 - pow(b2, t)));
  float *restrict m = opt->m, *restrict v = opt->v;
  const size_t n = opt->n;
  for (size_t i = 0; i < n; i++) {
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    p[i] -= step_size * m[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + eps);
  }
}

void kn_optimizer_step(kn_optimizer *opt, float *params, const float *grads) {
  if (opt->cfg.type == KN_OPT_ADAM) {
    adam_step(opt, params, grads);
  } else {
    sgd_step(opt, params, grads);
  }
  opt->iterations++;
}
