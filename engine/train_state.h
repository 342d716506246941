/* train_state.h — private to the engine: the training-state file written
 * beside each checkpoint, which with the weights lets a run resume exactly. */
#ifndef KILN_ENGINE_TRAIN_STATE_H
#define KILN_ENGINE_TRAIN_STATE_H

#include "engine.h"

/* Running sums over a reporting window (a log interval, an epoch, a
 * validation pass). */
typedef struct kn_metric_sums {
  double loss;  /* loss x rows */
  int64_t rows; /* examples */
  int64_t correct, top_k;
  double sq, abs; /* regression errors, over rows x outputs values */
} kn_metric_sums;

/* The callbacks' running state (callbacks.c). */
typedef struct kn_callback_state {
  double lr; /* the rate reduce-on-plateau has set; the base rate until then */
  double plateau_best;
  int64_t plateau_wait, plateau_cooldown;
  double stop_best;
  int64_t stop_wait;
} kn_callback_state;

void kn_callbacks_init(const kn_train_config *cfg, kn_callback_state *cs);
/* After an epoch: returns 1 when the rate was just cut (cs->lr holds the
 * new one). */
int kn_plateau_update(const kn_reduce_on_plateau *p, kn_callback_state *cs, double value);
/* After an epoch: returns 1 when training should stop. */
int kn_early_stopping_update(const kn_early_stopping *e, kn_callback_state *cs, double value);

typedef struct kn_train_state {
  int64_t step;               /* optimizer steps done */
  kn_pipeline_state pipeline; /* the next batch the data stream hands out */
  uint64_t train_runs;        /* the graph's training runs: the dropout stream */
  /* Sums of the epoch and log interval in progress, so the metrics of a
   * resumed epoch cover the steps from before the stop as well. */
  kn_metric_sums epoch, interval;
  kn_callback_state callbacks;
  /* Dynamic loss scaling (version 3): the scale (0 = none saved) and the
   * finite steps since it last changed; (version 4) the steps skipped so
   * far and since the last finite one. */
  double loss_scale;
  int64_t loss_scale_good_steps;
  int64_t loss_scale_skipped, loss_scale_skipped_in_a_row;
} kn_train_state;

/* The state file's name for a checkpoint path: "X.safetensors" -> "X.state". */
void kn_train_state_path(const char *checkpoint_path, char *out, size_t len);

/* Writes st and the optimizer's moments and step count: to path.tmp, fsync,
 * rename, fsync the directory. */
int kn_train_state_write(const char *path, const kn_train_state *st, kn_optimizer *opt, char *err,
                         size_t errlen);
/* Reads a state file into st and opt, checking its magic, version,
 * checksum and that opt is the same optimizer over the same number of
 * parameters; opt is untouched on any error. */
int kn_train_state_read(const char *path, kn_train_state *st, kn_optimizer *opt, char *err,
                        size_t errlen);

#endif
