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
#include "graph_internal.h"
#include "cuda/cuda.h"
#include "optim_rules.h"

struct kn_optimizer {
  kn_optimizer_config cfg;
  size_t n;
  int64_t iterations;
  float *m; /* (n) momentum buffer (sgd, rmsprop) or first moment (adam, adamw) */
  float *v; /* (n) second moment (adam, adamw), square average (rmsprop), sum (adagrad) */
  /* Steps on a GPU (kn_optimizer_step_graph): m and v there, on device
   * `device`; state_on_device while they, not the host's, are current. */
  float *dev_m, *dev_v;
  int device, state_on_device;
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
  kn_cuda_free(opt->device, opt->dev_m);
  kn_cuda_free(opt->device, opt->dev_v);
  free(opt->m);
  free(opt->v);
  free(opt);
}

/* The state back on the host where a GPU's is current: 0, or -1 with err. */
static int state_to_host(kn_optimizer *opt, char *err, size_t errlen) {
  if (!opt->state_on_device) return 0;
  const size_t bytes = opt->n * sizeof(float);
  if ((opt->m && kn_cuda_copy_out(opt->device, opt->m, opt->dev_m, bytes, err, errlen) != 0) ||
      (opt->v && kn_cuda_copy_out(opt->device, opt->v, opt->dev_v, bytes, err, errlen) != 0))
    return -1;
  opt->state_on_device = 0;
  return 0;
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
  char err[256];
  if (state_to_host(opt, err, sizeof err) != 0) /* a GPU that fails a copy fails its next step */
    fprintf(stderr, "optimizer: the state on cuda:%d could not be read: %s\n", opt->device, err);
  *type = opt->cfg.type;
  *n = opt->n;
  *m = opt->m;
  *v = opt->v;
  *iterations = &opt->iterations;
}

/* One step's constants (optim_rules.h), and the range functions that
 * apply it to elements [lo, hi). Each element's update reads only its own
 * p, g and state, so any split over threads gives the same bits. */
typedef struct step_job {
  kn_step_consts c;
  float *restrict p;
  const float *restrict g;
  float *m, *v;
  size_t n;
} step_job;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
/* The loops are element-wise without contraction (ISO C: no fused
 * multiply-add is formed), so each instruction set gives the same bits.
 * Not under the sanitizers: a clone's resolver runs before their runtime
 * starts, and ThreadSanitizer's instrumentation of it crashes at load. */
#define KN_OPT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KN_OPT_CLONES
#endif

/* One loop a rule, so each vectorizes with its rule inlined. */
KN_OPT_CLONES static void sgd_range(const step_job *j, size_t lo, size_t hi) {
  const kn_step_consts c = j->c;
  float *restrict p = j->p, *restrict buf = j->m;
  const float *restrict g = j->g;
  if (c.rule == KN_RULE_SGD) {
    for (size_t i = lo; i < hi; i++) kn_rule_sgd(&c, &p[i], g[i]);
  } else if (c.rule == KN_RULE_SGD_NESTEROV) {
    for (size_t i = lo; i < hi; i++) kn_rule_sgd_nesterov(&c, &p[i], g[i], &buf[i]);
  } else {
    for (size_t i = lo; i < hi; i++) kn_rule_sgd_momentum(&c, &p[i], g[i], &buf[i]);
  }
}

KN_OPT_CLONES static void adam_range(const step_job *j, size_t lo, size_t hi) {
  const kn_step_consts c = j->c;
  float *restrict p = j->p, *restrict m = j->m, *restrict v = j->v;
  const float *restrict g = j->g;
  for (size_t i = lo; i < hi; i++) kn_rule_adam(&c, &p[i], g[i], &m[i], &v[i]);
}

KN_OPT_CLONES static void rmsprop_range(const step_job *j, size_t lo, size_t hi) {
  const kn_step_consts c = j->c;
  float *restrict p = j->p, *restrict v = j->v, *restrict buf = j->m;
  const float *restrict g = j->g;
  if (buf) {
    for (size_t i = lo; i < hi; i++) kn_rule_rmsprop(&c, &p[i], g[i], &v[i], &buf[i]);
  } else {
    for (size_t i = lo; i < hi; i++) kn_rule_rmsprop(&c, &p[i], g[i], &v[i], NULL);
  }
}

KN_OPT_CLONES static void adagrad_range(const step_job *j, size_t lo, size_t hi) {
  const kn_step_consts c = j->c;
  float *restrict p = j->p, *restrict sum = j->v;
  const float *restrict g = j->g;
  for (size_t i = lo; i < hi; i++) kn_rule_adagrad(&c, &p[i], g[i], &sum[i]);
}

/* Elements a task of the pool takes at a time. */
#define STEP_BLOCK 16384

static void step_blocks(void *ctx, int64_t b0, int64_t b1) {
  const step_job *j = ctx;
  const size_t lo = (size_t)b0 * STEP_BLOCK,
               hi = (size_t)b1 * STEP_BLOCK < j->n ? (size_t)b1 * STEP_BLOCK : j->n;
  switch (j->c.rule) {
  case KN_RULE_ADAM: adam_range(j, lo, hi); break;
  case KN_RULE_RMSPROP:
  case KN_RULE_RMSPROP_MOMENTUM: rmsprop_range(j, lo, hi); break;
  case KN_RULE_ADAGRAD: adagrad_range(j, lo, hi); break;
  case KN_RULE_SGD:
  case KN_RULE_SGD_MOMENTUM:
  case KN_RULE_SGD_NESTEROV: sgd_range(j, lo, hi); break;
  }
}

/* This step's rule and constants. */
static kn_step_consts step_consts(const kn_optimizer *opt) {
  const kn_optimizer_config *cfg = &opt->cfg;
  kn_step_consts c = {.lr = cfg->learning_rate,
                      .momentum = cfg->momentum,
                      .weight_decay = cfg->weight_decay,
                      .beta1 = cfg->beta1,
                      .beta2 = cfg->beta2,
                      .epsilon = cfg->epsilon,
                      .rho = cfg->rho};
  /* The first step seeds SGD's buffer with the gradient, as torch does. */
  c.damp = opt->iterations == 0 ? 0.0f : cfg->momentum;
  switch (cfg->type) {
  case KN_OPT_SGD:
    c.rule = !opt->m ? KN_RULE_SGD : cfg->nesterov ? KN_RULE_SGD_NESTEROV : KN_RULE_SGD_MOMENTUM;
    break;
  case KN_OPT_ADAM:
  case KN_OPT_ADAMW: {
    const double t = (double)(opt->iterations + 1);
    const int decoupled = cfg->type == KN_OPT_ADAMW;
    c.rule = KN_RULE_ADAM;
    c.step_size = (float)(cfg->learning_rate / (1.0 - pow(cfg->beta1, t)));
    c.inv_sqrt_bc2 = (float)(1.0 / sqrt(1.0 - pow(cfg->beta2, t)));
    c.l2 = decoupled ? 0.0f : cfg->weight_decay;
    c.shrink = decoupled ? 1.0f - cfg->learning_rate * cfg->weight_decay : 1.0f;
    break;
  }
  case KN_OPT_RMSPROP: c.rule = opt->m ? KN_RULE_RMSPROP_MOMENTUM : KN_RULE_RMSPROP; break;
  case KN_OPT_ADAGRAD: c.rule = KN_RULE_ADAGRAD; break;
  }
  return c;
}

void kn_optimizer_step_on(kn_optimizer *opt, kn_graph *g, float *params, const float *grads) {
  step_job j = {
      .c = step_consts(opt), .p = params, .g = grads, .m = opt->m, .v = opt->v, .n = opt->n};
  const int64_t blocks = (int64_t)((opt->n + STEP_BLOCK - 1) / STEP_BLOCK);
  kn_pool_for(g ? g->pool : NULL, blocks, step_blocks, &j);
  opt->iterations++;
}

/* The state on device d, current (allocated and copied over where the
 * host's is): 0, or -1 with err. */
static int state_to_device(kn_optimizer *opt, int d, char *err, size_t errlen) {
  if (opt->state_on_device && opt->device == d) return 0;
  if (state_to_host(opt, err, errlen) != 0) return -1;
  const size_t bytes = (opt->n ? opt->n : 1) * sizeof(float);
  if (opt->device != d) { /* another device's buffers: not this one's */
    kn_cuda_free(opt->device, opt->dev_m);
    kn_cuda_free(opt->device, opt->dev_v);
    opt->dev_m = opt->dev_v = NULL;
    opt->device = d;
  }
  if ((opt->m && !opt->dev_m && kn_cuda_alloc(d, bytes, (void **)&opt->dev_m, err, errlen) != 0) ||
      (opt->v && !opt->dev_v && kn_cuda_alloc(d, bytes, (void **)&opt->dev_v, err, errlen) != 0))
    return -1;
  if ((opt->m && kn_cuda_copy_in(d, opt->dev_m, opt->m, opt->n * sizeof(float), err, errlen)) ||
      (opt->v && kn_cuda_copy_in(d, opt->dev_v, opt->v, opt->n * sizeof(float), err, errlen)))
    return -1;
  opt->state_on_device = 1;
  return 0;
}

int kn_optimizer_step_graph(kn_optimizer *opt, kn_graph *g, char *err, size_t errlen) {
  int d = -1;
  float *p = NULL, *grads = NULL;
  char why[512] = "";
  const int on = kn_residency_step_begin(g, &d, &p, &grads, why, sizeof why);
  if (on == 0) {
    kn_optimizer_step_on(opt, g, kn_params(g), kn_grads(g));
    return kn_graph_error(g, err, errlen);
  }
  if (on < 0 || state_to_device(opt, d, why, sizeof why) != 0) {
    snprintf(err, errlen, "optimizer step on cuda:%d: %s", d, why);
    return KN_EIO;
  }
  const kn_step_consts c = step_consts(opt);
  if (kn_cuda_set_device(d, why, sizeof why) != 0 ||
      kn_cuda_dev_optimizer_step(&c, p, grads, opt->dev_m, opt->dev_v, opt->n, why, sizeof why)) {
    snprintf(err, errlen, "optimizer step on cuda:%d: %s", d, why);
    return KN_EIO;
  }
  kn_residency_step_end(g);
  opt->iterations++;
  return KN_OK;
}

void kn_optimizer_step(kn_optimizer *opt, float *params, const float *grads) {
  kn_optimizer_step_on(opt, NULL, params, grads);
}
