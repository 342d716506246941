/* callbacks.c — what steers a run besides the gradients: learning-rate
 * schedules over optimizer steps, and Keras's ReduceLROnPlateau and
 * EarlyStopping on a metric at each epoch's end. Their state lives in the
 * training-state file, so a resumed run steers exactly as the first. */
#include <math.h>

#include "train_state.h"

double kn_lr_at(const kn_lr_schedule *s, double lr, int64_t t) {
  if (t < 0) t = 0;
  if (s->warmup_steps > 0 && t < s->warmup_steps)
    return lr * (double)(t + 1) / (double)s->warmup_steps;
  const int64_t d = t - (s->warmup_steps > 0 ? s->warmup_steps : 0);
  switch (s->type) {
  case KN_SCHEDULE_CONSTANT: return lr;
  case KN_SCHEDULE_STEP:
    return s->step_size > 0 ? lr * pow(s->gamma, (double)(d / s->step_size)) : lr;
  case KN_SCHEDULE_EXPONENTIAL: {
    if (s->decay_steps <= 0) return lr;
    double e = (double)d / (double)s->decay_steps;
    return lr * pow(s->decay_rate, s->staircase ? floor(e) : e);
  }
  case KN_SCHEDULE_COSINE: {
    if (s->decay_steps <= 0) return lr;
    double frac = d < s->decay_steps ? (double)d / (double)s->decay_steps : 1.0;
    return lr * (s->alpha + (1.0 - s->alpha) * 0.5 * (1.0 + cos(M_PI * frac)));
  }
  }
  return lr;
}

/* Keras's test: an improvement beats the best by more than min_delta. */
static int improved(kn_monitor_mode mode, double min_delta, double best, double value) {
  return mode == KN_MODE_MAX ? value - min_delta > best : value + min_delta < best;
}

static double worst(kn_monitor_mode mode) {
  return mode == KN_MODE_MAX ? -INFINITY : INFINITY;
}

void kn_callbacks_init(const kn_train_config *cfg, kn_callback_state *cs) {
  cs->lr = cfg->optimizer.learning_rate;
  cs->plateau_best = worst(cfg->plateau.mode);
  cs->plateau_wait = cs->plateau_cooldown = 0;
  cs->stop_best = worst(cfg->early_stopping.mode);
  cs->stop_wait = 0;
}

int kn_plateau_update(const kn_reduce_on_plateau *p, kn_callback_state *cs, double value) {
  if (!p->enabled || isnan(value)) return 0;
  /* As Keras: a cooldown epoch resets the wait, and the epoch that ends
   * the cooldown already counts. */
  if (cs->plateau_cooldown > 0) {
    cs->plateau_cooldown--;
    cs->plateau_wait = 0;
  }
  if (improved(p->mode, p->min_delta, cs->plateau_best, value)) {
    cs->plateau_best = value;
    cs->plateau_wait = 0;
    return 0;
  }
  if (cs->plateau_cooldown > 0 || ++cs->plateau_wait < p->patience || !(cs->lr > p->min_lr))
    return 0;
  double lr = cs->lr * p->factor;
  cs->lr = lr > p->min_lr ? lr : p->min_lr;
  cs->plateau_cooldown = p->cooldown;
  cs->plateau_wait = 0;
  return 1;
}

int kn_early_stopping_update(const kn_early_stopping *e, kn_callback_state *cs, double value) {
  if (!e->enabled || isnan(value)) return 0;
  if (improved(e->mode, e->min_delta, cs->stop_best, value)) {
    cs->stop_best = value;
    cs->stop_wait = 0;
    return 0;
  }
  return ++cs->stop_wait >= e->patience;
}
