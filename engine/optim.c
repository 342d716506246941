/* optim.c — optimizers as one fused loop over the flat parameter buffer.
 * Update rules follow PyTorch's (torch.optim.SGD / Adam / AdamW / RMSprop /
 * Adagrad), which parity tests compare against; with a constant learning
 * rate Keras's SGD momentum rule gives the same iterates. State (momentum,
 * moments, accumulators) is one flat array per kind, like the parameters. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

struct kn_optimizer {
  kn_optimizer_config cfg;
  size_t n;
  int64_t iterations;
  float *m; /* (n) momentum buffer (sgd, rmsprop) or first moment (adam, adamw) */
  float *v; /* (n) second moment (adam, adamw), square average (rmsprop), sum (adagrad) */
};

static const char *type_name(kn_optimizer_type t) {
  switch (t) {
  case KN_OPT_SGD: return "sgd";
  case KN_OPT_ADAM: return "adam";
  case KN_OPT_ADAMW: return "adamw";
  case KN_OPT_RMSPROP: return "rmsprop";
  case KN_OPT_ADAGRAD: return "adagrad";
  }
  return "?";
}

static int check_config(const kn_optimizer_config *cfg, char *err, size_t errlen) {
  const char *name = type_name(cfg->type);
  if ((int)cfg->type < 0 || cfg->type > KN_OPT_ADAGRAD) {
    snprintf(err, errlen, "optimizer: unknown type %d", (int)cfg->type);
    return KN_EINVAL;
  }
  if (!(cfg->learning_rate > 0.0f) || !isfinite(cfg->learning_rate)) {
    snprintf(err, errlen, "%s: learning_rate must be > 0, got %g", name, cfg->learning_rate);
    return KN_EINVAL;
  }
  if (!(cfg->weight_decay >= 0.0f) || !isfinite(cfg->weight_decay)) {
    snprintf(err, errlen, "%s: weight_decay must be >= 0, got %g", name, cfg->weight_decay);
    return KN_EINVAL;
  }
  if ((cfg->type == KN_OPT_SGD || cfg->type == KN_OPT_RMSPROP) &&
      !(cfg->momentum >= 0.0f && cfg->momentum < 1.0f)) {
    snprintf(err, errlen, "%s: momentum must be in [0, 1), got %g", name, cfg->momentum);
    return KN_EINVAL;
  }
  if (cfg->type == KN_OPT_SGD && cfg->nesterov && !(cfg->momentum > 0.0f)) {
    snprintf(err, errlen, "sgd: nesterov needs momentum > 0, got %g", cfg->momentum);
    return KN_EINVAL;
  }
  if ((cfg->type == KN_OPT_ADAM || cfg->type == KN_OPT_ADAMW) &&
      !(cfg->beta1 >= 0.0f && cfg->beta1 < 1.0f && cfg->beta2 >= 0.0f && cfg->beta2 < 1.0f)) {
    snprintf(err, errlen, "%s: need 0 <= beta1, beta2 < 1, got %g, %g", name, cfg->beta1,
             cfg->beta2);
    return KN_EINVAL;
  }
  if (cfg->type != KN_OPT_SGD && !(cfg->epsilon > 0.0f)) {
    snprintf(err, errlen, "%s: epsilon must be > 0, got %g", name, cfg->epsilon);
    return KN_EINVAL;
  }
  if (cfg->type == KN_OPT_RMSPROP && !(cfg->rho >= 0.0f && cfg->rho < 1.0f)) {
    snprintf(err, errlen, "rmsprop: rho must be in [0, 1), got %g", cfg->rho);
    return KN_EINVAL;
  }
  if (cfg->type == KN_OPT_ADAGRAD && !(cfg->initial_accumulator_value >= 0.0f)) {
    snprintf(err, errlen, "adagrad: initial_accumulator_value must be >= 0, got %g",
             cfg->initial_accumulator_value);
    return KN_EINVAL;
  }
  return KN_OK;
}

/* Which flat state arrays the optimizer keeps: momentum / first moment
 * (m), second moment or accumulator (v). */
static void state_arrays(const kn_optimizer_config *cfg, int *needs_m, int *needs_v) {
  int adam = cfg->type == KN_OPT_ADAM || cfg->type == KN_OPT_ADAMW;
  *needs_m = cfg->type != KN_OPT_ADAGRAD && (adam || cfg->momentum > 0.0f);
  *needs_v = adam || cfg->type == KN_OPT_RMSPROP || cfg->type == KN_OPT_ADAGRAD;
}

size_t kn_optimizer_state_floats(const kn_optimizer_config *cfg, size_t n_params) {
  int needs_m, needs_v;
  state_arrays(cfg, &needs_m, &needs_v);
  return (size_t)(needs_m + needs_v) * n_params;
}

int kn_optimizer_new(const kn_optimizer_config *cfg, size_t n_params, kn_optimizer **out, char *err,
                     size_t errlen) {
  *out = NULL;
  int rc = check_config(cfg, err, errlen);
  if (rc) return rc;
  kn_optimizer *opt = calloc(1, sizeof *opt);
  if (!opt) goto nomem;
  opt->cfg = *cfg;
  opt->n = n_params;
  size_t bytes = (n_params ? n_params : 1) * sizeof(float);
  int needs_m, needs_v;
  state_arrays(cfg, &needs_m, &needs_v);
  if (needs_m && !(opt->m = calloc(1, bytes))) goto nomem;
  if (needs_v && !(opt->v = calloc(1, bytes))) goto nomem;
  if (cfg->type == KN_OPT_ADAGRAD) {
    for (size_t i = 0; i < n_params; i++) opt->v[i] = cfg->initial_accumulator_value;
  }
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

void kn_optimizer_set_learning_rate(kn_optimizer *opt, float lr) {
  opt->cfg.learning_rate = lr;
}

float kn_optimizer_learning_rate(const kn_optimizer *opt) {
  return opt->cfg.learning_rate;
}

int64_t kn_optimizer_iterations(const kn_optimizer *opt) {
  return opt->iterations;
}

void kn_optimizer_moments(kn_optimizer *opt, kn_optimizer_type *type, size_t *n, float **m,
                          float **v, int64_t **iterations) {
  *type = opt->cfg.type;
  *n = opt->n;
  *m = opt->m;
  *v = opt->v;
  *iterations = &opt->iterations;
}

static void sgd_step(kn_optimizer *opt, float *restrict p, const float *restrict g) {
  const float lr = opt->cfg.learning_rate, mu = opt->cfg.momentum, wd = opt->cfg.weight_decay;
  const size_t n = opt->n;
  if (!opt->m) {
    for (size_t i = 0; i < n; i++) p[i] -= lr * (g[i] + wd * p[i]);
    return;
  }
  float *restrict buf = opt->m;
  /* The first step seeds the buffer with the gradient, as torch does. */
  const float damp = opt->iterations == 0 ? 0.0f : mu;
  if (opt->cfg.nesterov) {
    for (size_t i = 0; i < n; i++) {
      float gi = g[i] + wd * p[i];
      buf[i] = damp * buf[i] + gi;
      p[i] -= lr * (gi + mu * buf[i]);
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      buf[i] = damp * buf[i] + g[i] + wd * p[i];
      p[i] -= lr * buf[i];
    }
  }
}

static void adam_step(kn_optimizer *opt, float *restrict p, const float *restrict g) {
  const float b1 = opt->cfg.beta1, b2 = opt->cfg.beta2, eps = opt->cfg.epsilon;
  const double t = (double)(opt->iterations + 1);
  const float lr = opt->cfg.learning_rate;
  const float step_size = (float)(lr / (1.0 - pow(b1, t)));
  const float inv_sqrt_bc2 = (float)(1.0 / sqrt(1.0 - pow(b2, t)));
  const int decoupled = opt->cfg.type == KN_OPT_ADAMW;
  const float l2 = decoupled ? 0.0f : opt->cfg.weight_decay;
  const float shrink = decoupled ? 1.0f - lr * opt->cfg.weight_decay : 1.0f;
  float *restrict m = opt->m, *restrict v = opt->v;
  const size_t n = opt->n;
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] + l2 * p[i];
    p[i] *= shrink;
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    p[i] -= step_size * m[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + eps);
  }
}

static void rmsprop_step(kn_optimizer *opt, float *restrict p, const float *restrict g) {
  const float lr = opt->cfg.learning_rate, rho = opt->cfg.rho, eps = opt->cfg.epsilon;
  const float wd = opt->cfg.weight_decay, mu = opt->cfg.momentum;
  float *restrict v = opt->v, *restrict buf = opt->m;
  const size_t n = opt->n;
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] + wd * p[i];
    v[i] = rho * v[i] + (1.0f - rho) * gi * gi;
    float step = gi / (sqrtf(v[i]) + eps);
    if (buf) {
      buf[i] = mu * buf[i] + step;
      step = buf[i];
    }
    p[i] -= lr * step;
  }
}

static void adagrad_step(kn_optimizer *opt, float *restrict p, const float *restrict g) {
  const float lr = opt->cfg.learning_rate, eps = opt->cfg.epsilon, wd = opt->cfg.weight_decay;
  float *restrict sum = opt->v;
  const size_t n = opt->n;
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] + wd * p[i];
    sum[i] += gi * gi;
    p[i] -= lr * gi / (sqrtf(sum[i]) + eps);
  }
}

void kn_optimizer_step(kn_optimizer *opt, float *params, const float *grads) {
  switch (opt->cfg.type) {
  case KN_OPT_ADAM:
  case KN_OPT_ADAMW: adam_step(opt, params, grads); break;
  case KN_OPT_RMSPROP: rmsprop_step(opt, params, grads); break;
  case KN_OPT_ADAGRAD: adagrad_step(opt, params, grads); break;
  case KN_OPT_SGD: sgd_step(opt, params, grads); break;
  }
  opt->iterations++;
}
