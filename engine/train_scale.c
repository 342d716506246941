/* train_scale.c — dynamic loss scaling for mixed_float16 (the scaler, its
 * setup for a run, the skipped-steps bound) and the errors that end a run
 * whose loss or steps diverged. */
#include <math.h>
#include <stdio.h>

#include "train_internal.h"

void kn_loss_scaler_init(kn_loss_scaler *s, double initial_scale, int64_t growth_interval) {
  s->scale = initial_scale > 0 ? initial_scale : 32768.0;
  s->growth_interval = growth_interval > 0 ? growth_interval : 2000;
  s->good_steps = 0;
  s->skipped = 0;
  s->skipped_in_a_row = 0;
}

int kn_loss_scaler_unscale(const kn_loss_scaler *s, float *grads, size_t n) {
  const float inv = (float)(1.0 / s->scale);
  int finite = 1;
  for (size_t i = 0; i < n; i++) {
    grads[i] *= inv;
    finite &= isfinite(grads[i]) != 0;
  }
  return finite;
}

void kn_loss_scaler_update(kn_loss_scaler *s, int finite) {
  if (!finite) {
    s->scale = s->scale * 0.5 > KN_LOSS_SCALE_MIN ? s->scale * 0.5 : KN_LOSS_SCALE_MIN;
    s->good_steps = 0;
    s->skipped++;
    s->skipped_in_a_row++;
    return;
  }
  s->skipped_in_a_row = 0;
  if (++s->good_steps >= s->growth_interval) {
    s->scale *= 2.0;
    s->good_steps = 0;
  }
}

/* Skipped steps in a row that fail a run when the config leaves it 0: the
 * 15 halvings from 2^15 to the floor and 35 more where halving no longer
 * changes anything. */
enum { DEFAULT_MAX_SKIPPED = 50 };

/* Loss scaling for a run: on under mixed_float16, from the config's
 * initial scale, growth interval and bound on skipped steps. */
int kn_run_scaling_init(kn_run *r) {
  const kn_train_config *cfg = r->cfg;
  r->scaling = kn_graph_precision(r->m->graph) == KN_PRECISION_MIXED_FLOAT16;
  r->window_finite = 1;
  if (cfg->initial_loss_scale < 0 || cfg->loss_scale_growth_interval < 0 ||
      cfg->loss_scale_max_skipped_steps < 0) {
    snprintf(r->err, r->errlen,
             "train: initial_loss_scale, loss_scale_growth_interval and "
             "loss_scale_max_skipped_steps must be >= 0");
    return KN_EINVAL;
  }
  kn_loss_scaler_init(&r->scaler, cfg->initial_loss_scale, cfg->loss_scale_growth_interval);
  r->max_skipped = cfg->loss_scale_max_skipped_steps > 0 ? cfg->loss_scale_max_skipped_steps
                                                         : DEFAULT_MAX_SKIPPED;
  return KN_OK;
}

/* After a batch's run: its gradients unscaled. Inside loss scaling an
 * overflow is a skipped step, not an error. */
void kn_run_unscale(kn_run *r, float loss) {
  kn_graph *g = r->m->graph;
  const int finite = kn_loss_scaler_unscale(&r->scaler, kn_grads(g), kn_param_count(g));
  r->window_finite &= finite && isfinite(loss);
}

/* At a window's end: whether its step applies. A step whose scaled
 * gradients overflowed is skipped (and the scale halved); it still counts
 * as a step of the epoch. */
int kn_run_scale_window(kn_run *r) {
  const int apply = !r->scaling || r->window_finite;
  if (r->scaling) {
    kn_loss_scaler_update(&r->scaler, r->window_finite);
    kn_graph_set_loss_scale(r->m->graph, (float)r->scaler.scale);
    r->window_finite = 1;
  }
  return apply;
}

/* A loss that is not finite, outside loss scaling, ends the run. */
int kn_numeric_error(kn_run *r, float loss, int epoch) {
  char where[320];
  kn_last_good_checkpoint(r, where, sizeof where);
  snprintf(r->err, r->errlen, "loss became %f at step %lld (epoch %d); %s", loss,
           (long long)r->step + 1, epoch, where);
  return KN_ENUMERIC;
}

/* After a step: under loss scaling, an error once the steps skipped in a
 * row (this one the last) reach the run's bound. */
int kn_check_skipped_steps(kn_run *r, int epoch) {
  if (!r->scaling || r->scaler.skipped_in_a_row < r->max_skipped) return KN_OK;
  char where[320];
  kn_last_good_checkpoint(r, where, sizeof where);
  snprintf(r->err, r->errlen,
           "mixed_float16: %lld steps in a row were skipped for a non-finite loss or gradients, "
           "up to step %lld (epoch %d), with the loss scale at %g; the run diverged; %s",
           (long long)r->scaler.skipped_in_a_row, (long long)r->step, epoch, r->scaler.scale,
           where);
  return KN_ENUMERIC;
}
