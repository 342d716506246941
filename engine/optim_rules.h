/* optim_rules.h — each optimizer's update of one parameter element, shared
 * by the CPU loops (optim.c), the CUDA kernel (cuda/cuda.cu) and the
 * tests' GPU stand-in, so every device applies the same rule in the same
 * order (PyTorch's: torch.optim.SGD, Adam, AdamW, RMSprop, Adagrad). Plain
 * C, no engine types; under nvcc the rules are host and device functions. */
#ifndef KILN_ENGINE_OPTIM_RULES_H
#define KILN_ENGINE_OPTIM_RULES_H

#ifdef __CUDACC__
#define KN_RULE static inline __host__ __device__
#else
#define KN_RULE static inline
#endif

#ifdef __cplusplus
#include <cmath>
#define KN_SQRTF(x) std::sqrt(x)
#else
#include <math.h>
#define KN_SQRTF(x) sqrtf(x)
#endif

/* Which rule, and one step's constants (computed once a step on the
 * host: the learning rate of the schedule, bias corrections). */
typedef enum kn_rule {
  KN_RULE_SGD = 0,          /* p -= lr (g + wd p) */
  KN_RULE_SGD_MOMENTUM,     /* buf = damp buf + g + wd p; p -= lr buf */
  KN_RULE_SGD_NESTEROV,     /* g' = g + wd p; buf = damp buf + g'; p -= lr (g' + mu buf) */
  KN_RULE_ADAM,             /* Adam (l2 = weight decay) and AdamW (shrink = 1 - lr wd) */
  KN_RULE_RMSPROP,          /* without momentum */
  KN_RULE_RMSPROP_MOMENTUM, /* with its momentum buffer in m */
  KN_RULE_ADAGRAD,          /* the sum of squares in v */
} kn_rule;

typedef struct kn_step_consts {
  kn_rule rule;
  float lr, momentum, damp, weight_decay; /* damp: 0 on SGD's first step (torch seeds buf) */
  float beta1, beta2, epsilon, rho;
  float step_size, inv_sqrt_bc2, l2, shrink; /* Adam's */
} kn_step_consts;

KN_RULE void kn_rule_sgd(const kn_step_consts *c, float *p, float g) {
  *p -= c->lr * (g + c->weight_decay * *p);
}

KN_RULE void kn_rule_sgd_momentum(const kn_step_consts *c, float *p, float g, float *buf) {
  *buf = c->damp * *buf + g + c->weight_decay * *p;
  *p -= c->lr * *buf;
}

KN_RULE void kn_rule_sgd_nesterov(const kn_step_consts *c, float *p, float g, float *buf) {
  const float gi = g + c->weight_decay * *p;
  *buf = c->damp * *buf + gi;
  *p -= c->lr * (gi + c->momentum * *buf);
}

KN_RULE void kn_rule_adam(const kn_step_consts *c, float *p, float g, float *m, float *v) {
  const float gi = g + c->l2 * *p;
  *p *= c->shrink;
  *m = c->beta1 * *m + (1.0f - c->beta1) * gi;
  *v = c->beta2 * *v + (1.0f - c->beta2) * gi * gi;
  *p -= c->step_size * *m / (KN_SQRTF(*v) * c->inv_sqrt_bc2 + c->epsilon);
}

/* buf NULL: RMSprop without momentum. */
KN_RULE void kn_rule_rmsprop(const kn_step_consts *c, float *p, float g, float *v, float *buf) {
  const float gi = g + c->weight_decay * *p;
  *v = c->rho * *v + (1.0f - c->rho) * gi * gi;
  float step = gi / (KN_SQRTF(*v) + c->epsilon);
  if (buf) {
    *buf = c->momentum * *buf + step;
    step = *buf;
  }
  *p -= c->lr * step;
}

KN_RULE void kn_rule_adagrad(const kn_step_consts *c, float *p, float g, float *sum) {
  const float gi = g + c->weight_decay * *p;
  *sum += gi * gi;
  *p -= c->lr * gi / (KN_SQRTF(*sum) + c->epsilon);
}

/* Element i of a flat step under rule c->rule: m and v are the rule's
 * state arrays (NULL where it keeps none). */
KN_RULE void kn_rule_apply(const kn_step_consts *c, float *p, const float *g, float *m, float *v,
                           unsigned long i) {
  switch (c->rule) {
  case KN_RULE_SGD: kn_rule_sgd(c, &p[i], g[i]); break;
  case KN_RULE_SGD_MOMENTUM: kn_rule_sgd_momentum(c, &p[i], g[i], &m[i]); break;
  case KN_RULE_SGD_NESTEROV: kn_rule_sgd_nesterov(c, &p[i], g[i], &m[i]); break;
  case KN_RULE_ADAM: kn_rule_adam(c, &p[i], g[i], &m[i], &v[i]); break;
  case KN_RULE_RMSPROP: kn_rule_rmsprop(c, &p[i], g[i], &v[i], 0); break;
  case KN_RULE_RMSPROP_MOMENTUM: kn_rule_rmsprop(c, &p[i], g[i], &v[i], &m[i]); break;
  case KN_RULE_ADAGRAD: kn_rule_adagrad(c, &p[i], g[i], &v[i]); break;
  }
}

#endif
