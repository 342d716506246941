/* engine_train.h — the training loop: its configuration, events,
 * callbacks, loss scaling, evaluation and resume. Part of engine.h. */
#ifndef KILN_ENGINE_PUBLIC_TRAIN_H
#define KILN_ENGINE_PUBLIC_TRAIN_H

#include <signal.h>

#include "engine_data.h"
#include "engine_dist.h"
#include "engine_model.h"

/* --------------------------------------------------------------- training -- */

typedef enum kn_event_kind {
  KN_EVENT_STEP = 0,   /* every log_every_steps steps: loss over the interval */
  KN_EVENT_EPOCH,      /* end of an epoch: epoch means and validation */
  KN_EVENT_CHECKPOINT, /* a checkpoint file is in place */
  KN_EVENT_EVAL,       /* a validation pass every eval_every_steps, inside an epoch */
  KN_EVENT_NOTICE,     /* a callback acted: message says what (lr reduced, early stop) */
} kn_event_kind;

#define KN_EVENT_MAX_METRICS 8

/* A step or epoch event's loss and metrics are means over the window's
 * examples whose loss was finite; a window with none (under mixed_float16,
 * every step skipped for a non-finite loss) reports none of them rather
 * than a 0. Under loss scaling step events add loss_scale, and step and
 * epoch events skipped_steps: the steps skipped so far in the run. */
typedef struct kn_train_event {
  kn_event_kind kind;
  int epoch;    /* 1-based */
  int64_t step; /* optimizer steps done so far */
  int n_metrics;
  const char *names[KN_EVENT_MAX_METRICS];
  double values[KN_EVENT_MAX_METRICS];
  const char *path; /* checkpoint */
  const kn_checkpoint_info *checkpoint;
  const char *code;    /* notice: EARLY_STOPPED, LR_REDUCED or PROFILE_WRITTEN */
  const char *message; /* notice */
  double seconds;      /* since training started */
} kn_train_event;

/* Returns 0 to go on, non-zero to stop training early (not an error). */
typedef int (*kn_train_callback)(const kn_train_event *ev, void *user);

/* Learning rate over optimizer steps t = 0, 1, ...: an optional linear
 * warmup (lr x (t+1) / warmup_steps for t < warmup_steps), then a decay
 * counted from the warmup's end, d = t - warmup_steps:
 *   constant     lr
 *   step         lr x gamma^floor(d / step_size)              (torch StepLR)
 *   exponential  lr x decay_rate^(d / decay_steps), the exponent floored
 *                with staircase                   (Keras ExponentialDecay)
 *   cosine       lr x (alpha + (1 - alpha) x (1 + cos(pi x min(d, decay_steps)
 *                / decay_steps)) / 2)                  (Keras CosineDecay) */
typedef enum kn_schedule_type {
  KN_SCHEDULE_CONSTANT = 0,
  KN_SCHEDULE_STEP,
  KN_SCHEDULE_EXPONENTIAL,
  KN_SCHEDULE_COSINE,
} kn_schedule_type;

typedef struct kn_lr_schedule {
  kn_schedule_type type;
  int64_t warmup_steps;
  int64_t step_size;   /* step */
  double gamma;        /* step */
  int64_t decay_steps; /* exponential, cosine */
  double decay_rate;   /* exponential */
  int staircase;       /* exponential */
  double alpha;        /* cosine: the final lr as a fraction of lr */
} kn_lr_schedule;

/* The learning rate the schedule gives at optimizer step t (0-based). */
double kn_lr_at(const kn_lr_schedule *s, double lr, int64_t t);

typedef enum kn_monitor_mode { KN_MODE_MIN = 0, KN_MODE_MAX } kn_monitor_mode;

/* Callbacks on a metric of each epoch's end (an epoch event's name:
 * "val_loss", "val_accuracy", "epoch_loss", ...), as Keras's: a value
 * improves when it beats the best so far by more than min_delta. */
typedef struct kn_early_stopping {
  int enabled;
  char monitor[32];
  kn_monitor_mode mode;
  double min_delta;
  int patience; /* epochs without improvement before training stops */
} kn_early_stopping;

typedef struct kn_reduce_on_plateau {
  int enabled;
  char monitor[32];
  kn_monitor_mode mode;
  double min_delta;
  int patience; /* epochs without improvement before lr x= factor */
  double factor;
  int cooldown; /* epochs after a reduction before counting again */
  double min_lr;
} kn_reduce_on_plateau;

typedef struct kn_train_config {
  int epochs;
  int batch_size;
  int shuffle;
  int drop_remainder;
  uint64_t seed;
  int log_every_steps;
  const char *checkpoint_dir;    /* NULL = no checkpoint */
  const char *checkpoint_prefix; /* file name prefix, e.g. "ckpt" */
  kn_optimizer_config optimizer;
  /* The input pipeline; NULL = batch_size, shuffle (a full shuffle) and
   * drop_remainder above, no maps, batches made in the training thread. */
  const kn_pipeline_config *pipeline;
  /* Where a resumed run's data picks up: the pipeline_state a checkpoint
   * recorded (kn_pipeline_state_parse); NULL = from the start. Training
   * goes on from that epoch and batch with exactly the batches the first
   * run would have seen next. */
  const kn_pipeline_state *resume;
  /* A checkpoint written by a run of the same spec (weights, and the
   * training-state file beside it: optimizer moments, step, epoch, dropout
   * stream, pipeline position, the partial epoch's sums); NULL = start
   * afresh. Training then goes on exactly as the first run would have:
   * the same batches, losses and weights. Wins over resume. */
  const char *resume_from;
  /* A checkpoint every N optimizer steps (0 = only the final one). One
   * that falls on the last step of an epoch is written after the epoch's
   * validation, so a resume never repeats or loses an epoch's metrics. */
  int checkpoint_every_steps;
  /* Polled between steps (may be NULL): when it becomes non-zero, training
   * writes a checkpoint (if checkpoint_dir is set) and returns KN_ESTOPPED.
   * A signal handler may set it. */
  const volatile sig_atomic_t *stop_request;
  /* Called once when an auto-tuned pipeline has chosen (may be NULL). */
  void (*on_tuned)(const kn_pipeline_stats *stats, void *user);
  /* KN_METRIC_* reported beside the loss; 0 = accuracy for classification
   * losses, nothing more for regression. */
  unsigned metrics;
  int top_k; /* KN_METRIC_TOP_K's k; 0 = 5 */
  /* Gradient accumulation: this many batches (micro-batches of batch_size)
   * per optimizer step, their gradients averaged weighted by rows, so the
   * update equals one over the k x batch_size examples (batch norm's batch
   * statistics aside). An epoch's last window may be shorter. 0 or 1 =
   * one step per batch. Steps, logging and checkpoints count optimizer
   * steps. */
  int accumulation_steps;
  /* Scale the gradients down to this global L2 norm when above it (Keras's
   * global_clipnorm); 0 = no clipping. */
  double clip_global_norm;
  kn_lr_schedule schedule;
  kn_reduce_on_plateau plateau; /* not with a schedule other than constant */
  kn_early_stopping early_stopping;
  /* Profile optimizer steps profile_first..profile_last (1-based; 0 = no
   * profile): written when the last is done, as profile_path (trace JSON)
   * and profile_table_path (the top nodes), and announced by a notice.
   * With several processes only rank 0 profiles and writes them. */
  int64_t profile_first, profile_last;
  const char *profile_path, *profile_table_path;
  /* A validation pass every N optimizer steps as well as at each epoch's
   * end (KN_EVENT_EVAL, val_* names); 0 = at epoch ends only. */
  int eval_every_steps;
  /* Dynamic loss scaling, on for a mixed_float16 model (Keras's
   * LossScaleOptimizer): the first scale (0 = 2^15) and the finite steps in
   * a row after which it doubles (0 = 2000). A run fails with KN_ENUMERIC
   * when loss_scale_max_skipped_steps steps in a row have been skipped
   * (0 = 50): halving from 2^15 reaches the floor of 1 in 15 of them, and
   * a step that still overflows there has diverged, not underflowed. */
  double initial_loss_scale;
  int64_t loss_scale_growth_interval;
  int64_t loss_scale_max_skipped_steps;
  /* Replicas and processes training together (zeroed: one replica). Only
   * rank 0 writes checkpoints; every rank reports the same metrics,
   * summed over all replicas. */
  kn_distribution dist;
} kn_train_config;

/* Dynamic loss scaling: backward is seeded with scale; the gradients are
 * unscaled and checked; a step with an inf or NaN is skipped and halves the
 * scale, though never below KN_LOSS_SCALE_MIN (as Keras's
 * LossScaleOptimizer), and growth_interval finite steps in a row double
 * it. */
#define KN_LOSS_SCALE_MIN 1.0
typedef struct kn_loss_scaler {
  double scale;
  int64_t good_steps; /* finite steps since the scale last changed */
  int64_t growth_interval;
  int64_t skipped;          /* steps skipped so far (the metric skipped_steps) */
  int64_t skipped_in_a_row; /* skipped since the last finite step */
} kn_loss_scaler;
void kn_loss_scaler_init(kn_loss_scaler *s, double initial_scale, int64_t growth_interval);
/* Divides n gradients by the scale in place; 1 when all are finite. */
int kn_loss_scaler_unscale(const kn_loss_scaler *s, float *grads, size_t n);
/* After a step: finite (the step was applied) or not (skipped). */
void kn_loss_scaler_update(kn_loss_scaler *s, int finite);

enum {
  KN_METRIC_ACCURACY = 1, /* classification: argmax (or logit > 0 for one output) hits */
  KN_METRIC_MSE = 2,      /* regression: mean squared error over every output */
  KN_METRIC_MAE = 4,      /* regression: mean absolute error */
  KN_METRIC_TOP_K = 8,    /* classification: the label among the k highest scores */
};

/* Trains model on train for cfg->epochs, evaluating on val (may be NULL)
 * after each epoch. With checkpoint_dir set it writes
 * "<prefix>-<step 8 digits>.safetensors" (weights) after
 * "<prefix>-<step>.state" (training state) every checkpoint_every_steps
 * steps, on a stop request and at the end. KN_ESTOPPED after a stop
 * request, with the checkpoint written. */
int kn_train(kn_model *model, const kn_dataset *train, const kn_dataset *val,
             const kn_train_config *cfg, kn_train_callback cb, void *user, char *err,
             size_t errlen);

/* Loss and accuracy of a classification model on a whole dataset, in
 * batches (a regression model is refused: it has no accuracy). */
int kn_evaluate(kn_model *model, const kn_dataset *ds, double *loss, double *accuracy, char *err,
                size_t errlen);

#endif
