/* train_internal.h — private to the engine: one run of kn_train, shared by
 * the loop (train.c), its metrics (train_metrics.c), its checkpoints
 * (train_checkpoint.c) and its loss scaling (train_scale.c). */
#ifndef KILN_ENGINE_TRAIN_INTERNAL_H
#define KILN_ENGINE_TRAIN_INTERNAL_H

#include "dist/dist.h"
#include "dist/ps.h"
#include "graph_internal.h"
#include "train_state.h"

/* One run of kn_train: what the steps share. */
typedef struct kn_run {
  kn_model *m;
  const kn_train_config *cfg;
  kn_train_callback cb;
  void *user;
  kn_pipeline *pipe, *val_pipe;
  kn_optimizer *opt;
  unsigned metrics;
  int top_k;
  int batch;  /* the model's planned batch: one replica's */
  int accum;  /* batches per optimizer step */
  float *acc; /* (n_params) row-weighted gradient sums of the window; NULL when accum is 1 */
  int64_t window_rows;
  int window_batches;
  int64_t step; /* optimizer steps done */
  /* Batches per epoch, and optimizer steps: an epoch's last window may be
   * shorter than accum. */
  int64_t batches, steps_per_epoch;
  int first_epoch;     /* where the run starts: 1, or where a resume left off */
  int64_t first_batch; /* of first_epoch */
  kn_metric_sums resumed_epoch, resumed_interval; /* first_epoch's sums before the resume */
  int report_lr;
  int tuning_reported;   /* the pipeline's tuning went to cfg->on_tuned */
  int scaling;           /* dynamic loss scaling (mixed_float16) */
  kn_loss_scaler scaler; /* when scaling */
  int64_t max_skipped;   /* skipped steps in a row that fail the run */
  int window_finite;     /* every gradient of the window was finite */
  double t0;
  kn_metric_sums epoch_t, interval_t;
  kn_callback_state callbacks;
  int64_t last_checkpoint;
  char last_checkpoint_name[256]; /* for a numerics error: where to resume from */
  kn_profile *profile;            /* while profiling steps */
  int profile_written;
  double step_start;
  kn_dist *dist;      /* replicas and processes; NULL for one replica */
  kn_ps *ps;          /* parameter_server: the servers apply the updates; else NULL */
  int stop_anywhere;  /* with dist: a stop was requested on some process */
  int stop;           /* the loop ends after this step */
  int stop_requested; /* by cfg->stop_request, here or on another process */
  char *err;
  size_t errlen;
} kn_run;

/* train.c */
double kn_run_elapsed(const kn_run *r); /* seconds since the first step began */

/* train_metrics.c: feeding batches and counting what they score. */
/* Copies a batch into the model's inputs and the loss's target. */
void kn_feed_batch(kn_model *m, const kn_batch *b);
/* Adds a batch just run (its loss and the model's current outputs) to t. */
void kn_tally_batch(kn_model *m, kn_metric_sums *t, const kn_batch *b, float loss, unsigned metrics,
                    int top_k);
/* The names a window's metrics are reported under: "loss", "epoch_loss",
 * "val_loss", ... */
typedef enum kn_metric_names { KN_NAMES_STEP, KN_NAMES_EPOCH, KN_NAMES_VAL } kn_metric_names;
/* Appends the window's loss and metrics to the event. */
void kn_put_metrics(kn_model *m, kn_train_event *ev, const kn_metric_sums *t, unsigned metrics,
                    kn_metric_names names);
void kn_put_metric(kn_train_event *ev, const char *name, double value);
/* Whether an epoch event carries name (a callback's monitor). */
int kn_epoch_reports(unsigned metrics, int has_val, const char *name);
/* The metrics a run reports: the asked ones, checked against the loss. */
int kn_resolve_metrics(const kn_model *m, unsigned asked, unsigned *out, char *err, size_t errlen);
/* Checks that ds fits the compiled model; what names the caller in err. */
int kn_check_fit(kn_model *m, const kn_dataset *ds, const char *what, char *err, size_t errlen);
int kn_planned_batch(kn_model *m); /* rows of the model's input */
/* Loss and metrics over one pass of an evaluation pipeline. */
int kn_evaluate_pipeline(kn_model *m, kn_pipeline *pipe, unsigned metrics, int top_k,
                         kn_metric_sums *t, char *err, size_t errlen);
/* Sums t over every process, in place. */
int kn_global_tally(kn_run *r, kn_metric_sums *t);
/* A tally to report: t itself, or its sum over every process. */
int kn_report_tally(kn_run *r, const kn_metric_sums *t, kn_metric_sums *out);

/* train_scale.c: dynamic loss scaling, and the errors of a run that
 * diverged. */
/* Sets the run's scaling from the precision and the config. */
int kn_run_scaling_init(kn_run *r);
/* Unscales the gradients of the batch just run; notes a non-finite one. */
void kn_run_unscale(kn_run *r, float loss);
/* At a window's end: whether its step applies; moves the scale. */
int kn_run_scale_window(kn_run *r);
/* The error of a non-finite loss outside loss scaling. */
int kn_numeric_error(kn_run *r, float loss, int epoch);
/* The error once too many steps in a row were skipped; else KN_OK. */
int kn_check_skipped_steps(kn_run *r, int epoch);

/* train_checkpoint.c: checkpoints written during a run, and resuming from
 * one. */
int kn_save_checkpoint(kn_run *r, int mid_epoch);
/* Names the last checkpoint written, for an error message. */
void kn_last_good_checkpoint(const kn_run *r, char *where, size_t len);
/* Restores the state the run starts from and sets where it starts. */
int kn_run_resume(kn_run *r);

#endif
