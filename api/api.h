/* api.h — kiln's API layer: JSON <-> C for job specs and progress lines, the
 * error model, job states and page tokens. Pure: no I/O, no globals.
 * Prefix api_. Depends on jansson only. */
#ifndef KILN_API_H
#define KILN_API_H

#include <stddef.h>
#include <stdint.h>

/* ---- error model (gRPC canonical codes over HTTP, after Google's AIPs) ---- */

#define API_MAX_DETAILS 8

typedef struct api_error_detail {
  char field[128];       /* JSON path of the offending field, e.g. "model.layers[1].type" */
  char description[256]; /* the rule it broke, with the value seen */
} api_error_detail;

typedef struct api_error {
  int http;           /* 400, 404, 409, 413, 500 ... ; 0 = no error */
  const char *status; /* "INVALID_ARGUMENT", "NOT_FOUND", ... (static string) */
  char message[512];
  int n_details;
  api_error_detail details[API_MAX_DETAILS];
} api_error;

/* Fill err with a status and a printf-style message and clear its details;
 * returns -1 so callers can `return api_error_set(...)`. */
int api_error_set(api_error *err, int http, const char *status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Append a {field, description} detail (silently drops past API_MAX_DETAILS). */
void api_error_add_detail(api_error *err, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* {"error":{"code":..,"status":..,"message":..,"details":[..]}}; malloc'd, caller
 * frees; NULL only when out of memory. "details" is always there, maybe [].
 * Bytes that are not UTF-8 come out as '?'. */
char *api_error_to_json(const api_error *err);

/* ---- job states ---- */

typedef enum api_job_state {
  API_JOB_QUEUED = 0,
  API_JOB_STARTING,
  API_JOB_RUNNING,
  API_JOB_STOPPING,
  API_JOB_SUCCEEDED,
  API_JOB_FAILED,
  API_JOB_CANCELLED,
  API_JOB_PREEMPTED,
  API_JOB_STATE_COUNT
} api_job_state;

const char *api_job_state_name(api_job_state state); /* "UNKNOWN" when out of range */
/* Returns the state for a name ("RUNNING"), or -1 when the name is unknown. */
int api_job_state_parse(const char *name);
/* SUCCEEDED, FAILED, CANCELLED. PREEMPTED is not: it goes back to QUEUED. */
int api_job_state_is_terminal(api_job_state state);

/* ---- job spec ---- */

#define API_MAX_DIMS      6
#define API_MAX_LAYERS    64
#define API_NAME_LEN      128
#define API_MAX_RESTARTS  100
#define API_MAX_RUNTIME_S (366 * 24 * 3600)
#define API_MAX_DEVICES   256 /* per job: a pool holds at most this many */
#define API_MAX_CHANNELS  16

/* pipeline.augment, in the order they are applied */
enum {
  API_AUG_FLIP_LEFT_RIGHT = 1 << 0,
  API_AUG_FLIP_UP_DOWN = 1 << 1,
  API_AUG_RANDOM_CROP = 1 << 2,
  API_AUG_RANDOM_BRIGHTNESS = 1 << 3,
};
#define API_AUTO (-1)

typedef enum api_layer_type {
  API_LAYER_DENSE = 0,
  API_LAYER_FLATTEN,
  API_LAYER_ACTIVATION, /* {"type":"activation","activation":"relu"} */
  API_LAYER_RELU,       /* shorthand for activation relu */
  API_LAYER_CONV2D,
  API_LAYER_DEPTHWISE_CONV2D,
  API_LAYER_SEPARABLE_CONV2D,
  API_LAYER_BATCH_NORM,
  API_LAYER_DROPOUT,
  API_LAYER_MAX_POOL2D,
  API_LAYER_AVG_POOL2D,
  API_LAYER_GLOBAL_AVG_POOL2D,
  API_LAYER_ADD,
  API_LAYER_CONCATENATE,
} api_layer_type;

typedef enum api_activation {
  API_ACT_LINEAR = 0, /* Keras "linear" / no activation */
  API_ACT_RELU,
  API_ACT_SOFTMAX,
  API_ACT_LEAKY_RELU,
  API_ACT_ELU,
  API_ACT_GELU,
  API_ACT_SIGMOID,
  API_ACT_TANH,
} api_activation;

typedef enum api_initializer {
  API_INIT_GLOROT_UNIFORM = 0, /* Keras's kernel default */
  API_INIT_GLOROT_NORMAL,
  API_INIT_HE_UNIFORM,
  API_INIT_HE_NORMAL,
  API_INIT_ZEROS, /* Keras's bias default */
  API_INIT_ONES,
} api_initializer;

#define API_MAX_LAYER_INPUTS 8

/* One layer, Keras's names and defaults; every default is filled in. */
typedef struct api_layer {
  api_layer_type type;
  char name[64]; /* given, or "<type>_<index>": "flatten_0", "dense_1" */
  int units;     /* dense */
  api_activation activation;
  int use_bias;                       /* dense, convolutions; default 1 */
  double alpha;                       /* activation layer: leaky_relu 0.3, elu 1.0 */
  int filters;                        /* conv2d, separable_conv2d */
  int kernel_size[2];                 /* convolutions */
  int strides[2];                     /* convolutions (1), pools (the pool size) */
  int dilation_rate[2];               /* convolutions; default 1 */
  int padding_same;                   /* "valid" (0, the default) or "same" (1) */
  int depth_multiplier;               /* depthwise / separable; default 1 */
  int pool_size[2];                   /* pools; default 2 */
  double rate;                        /* dropout */
  double momentum, epsilon;           /* batch_norm; defaults 0.99, 0.001 */
  int synchronized;                   /* batch_norm: statistics over every replica; default 0 */
  int axis;                           /* concatenate; default -1 */
  api_initializer kernel_initializer; /* dense, conv2d */
  api_initializer bias_initializer;   /* dense, conv2d */
  int n_inputs;                       /* 0: the previous layer */
  int inputs[API_MAX_LAYER_INPUTS];   /* layer indices; -1 = the model input ("input") */
  /* "device" (model parallelism): 0, not given: the job's device; -1:
   * "cpu", the host; k + 1: "cuda:k", the job's GPU k */
  int device;
} api_layer;

typedef enum api_optimizer_type {
  API_OPT_SGD = 0,
  API_OPT_ADAM,
  API_OPT_ADAMW,
  API_OPT_RMSPROP,
  API_OPT_ADAGRAD
} api_optimizer_type;

/* The spec's loss, by Keras's name. */
typedef enum api_loss {
  API_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY = 0, /* class ids */
  API_LOSS_CATEGORICAL_CROSSENTROPY,            /* one-hot labels: needs pipeline.one_hot */
  API_LOSS_BINARY_CROSSENTROPY, /* from logits; one output: labels 0/1, more: one-hot */
  API_LOSS_MEAN_SQUARED_ERROR,  /* "mse": regression on numeric labels */
  API_LOSS_MEAN_ABSOLUTE_ERROR, /* "mae" */
} api_loss;
/* 1 for the two regression losses. */
int api_loss_is_regression(api_loss loss);

/* spec.metrics */
enum { API_METRIC_ACCURACY = 1, API_METRIC_MSE = 2, API_METRIC_MAE = 4, API_METRIC_TOP_K = 8 };

/* optimizer.schedule: the learning rate over optimizer steps (see the
 * engine's kn_lr_schedule for the formulas). */
typedef enum api_schedule_type {
  API_SCHEDULE_CONSTANT = 0,
  API_SCHEDULE_STEP,
  API_SCHEDULE_EXPONENTIAL,
  API_SCHEDULE_COSINE,
} api_schedule_type;

typedef struct api_schedule {
  api_schedule_type type;
  int warmup_steps;  /* linear warmup first; 0 = none */
  int step_size;     /* step */
  double gamma;      /* step; default 0.1 */
  int decay_steps;   /* exponential, cosine */
  double decay_rate; /* exponential */
  int staircase;     /* exponential */
  double alpha;      /* cosine; default 0 */
} api_schedule;

/* callbacks.early_stopping and callbacks.reduce_lr_on_plateau, Keras's
 * options; monitor is the metric's name as reported at an epoch's end
 * ("val_loss", "epoch_accuracy", ...: "loss" is stored as "epoch_loss"). */
typedef struct api_callback {
  int enabled;
  char monitor[32];
  int mode_max; /* from mode: "max", or "auto" for an accuracy */
  double min_delta;
  int patience;
  double factor; /* plateau: default 0.1 */
  int cooldown;  /* plateau */
  double min_lr; /* plateau */
} api_callback;

/* pipeline.cast: the examples' storage type */
typedef enum api_cast { API_CAST_FLOAT32 = 0, API_CAST_FLOAT16, API_CAST_BFLOAT16 } api_cast;

#define API_MAX_PROFILE_STEPS 1000 /* steps one profile may cover */

/* strategy.type: how many replicas train one job, and where they run. */
typedef enum api_strategy {
  API_STRATEGY_SINGLE = 0,       /* one replica */
  API_STRATEGY_MIRRORED,         /* replicas threads in one kiln-train */
  API_STRATEGY_MULTI_WORKER,     /* workers kiln-train processes under mpirun */
  API_STRATEGY_PARAMETER_SERVER, /* workers + ps processes under mpirun, parameters on the ps */
} api_strategy;

/* strategy.aggregation: how the replicas' gradients become one. */
typedef enum api_aggregation {
  API_AGGREGATE_MEAN = 0,      /* the replicas' mean gradients, averaged */
  API_AGGREGATE_SUM,           /* summed */
  API_AGGREGATE_WEIGHTED_MEAN, /* weighted by the examples each replica saw */
} api_aggregation;

#define API_MAX_REPLICAS 64 /* replicas (and workers) one job may have */

typedef enum api_shards_format {
  API_SHARDS_NONE = 0,
  API_SHARDS_TFRECORD, /* TFRecord files of tf.train.Example, raw or gzip'd */
  API_SHARDS_TAR,      /* WebDataset-style tar shards (key.ext members), raw or gzip'd */
} api_shards_format;

typedef struct api_job_spec {
  char display_name[API_NAME_LEN];
  /* model */
  int input_ndim;
  int input_shape[API_MAX_DIMS]; /* per example, e.g. {28, 28, 1} */
  int n_layers;
  api_layer layers[API_MAX_LAYERS];
  /* loss and metrics: the loss's canonical Keras name ("mse" is stored as
   * "mean_squared_error") and kind; API_METRIC_* bits, accuracy also as
   * metric_accuracy */
  char loss[64];
  api_loss loss_type;
  unsigned metrics;
  int metric_accuracy;
  /* data */
  char dataset[64];    /* built-in name ("fashion-mnist") or an uploaded id ("ds-...") */
  char validation[16]; /* "test" (the held-out split), "split" or "none" */
  /* Shards: with a format, dataset names a folder of shard files under the
   * server's datasets directory (shards/<name>/train, shards/<name>/test),
   * streamed rather than loaded. */
  api_shards_format shards_format;
  char image_feature[128], label_feature[128]; /* feature names, or tar extensions */
  double validation_split; /* with "split": this last fraction of the training data */
  int batch_size;          /* default 32 (Keras) */
  int shuffle;             /* default 1 */
  int64_t shuffle_buffer;  /* 0 = the whole data set (a full shuffle) */
  int normalize;           /* pixels / 255, other data min-max per feature; default 1 */
  int standardize;         /* per channel (x - mean) / std, after normalize */
  int n_standardize;       /* mean/std given for this many channels; 0 = computed */
  double standardize_mean[API_MAX_CHANNELS], standardize_std[API_MAX_CHANNELS];
  unsigned augment;        /* API_AUG_* */
  int crop_padding;        /* random_crop; default 4 */
  double brightness_delta; /* random_brightness max_delta; default 0.2 */
  int drop_remainder;      /* default 0 */
  int cache_file;          /* cache: "memory" (0, default) or "file" (decoded data kept on disk) */
  int cache_given;         /* cache named in the spec (always 1 for data held in memory): streamed
                            * shards are cached only then */
  int prefetch;            /* batches; -1 = "auto" (default) */
  int num_parallel_calls;  /* producer threads; -1 = "auto" (default) */
  int64_t take, skip;      /* on the training data: take -1 = all */
  int interleave_cycle_length; /* 0 = no interleave; over an images upload's class folders */
  int interleave_block_length; /* default 1 */
  int one_hot;                 /* labels as one-hot rows (categorical_crossentropy); default 0 */
  api_cast cast;               /* default float32 */
  int num_shards, shard_index; /* shard: this job reads positions p % num_shards == index;
                                * default 1, 0 */
  /* optimizer */
  api_optimizer_type optimizer;
  double learning_rate;             /* default 0.01 for sgd, 0.001 for adam (Keras) */
  double momentum;                  /* sgd, rmsprop; default 0 */
  int nesterov;                     /* sgd; default 0 */
  double beta_1, beta_2, epsilon;   /* adam, adamw; defaults 0.9, 0.999, 1e-7 (Keras);
                                     * epsilon also rmsprop, adagrad (1e-7) */
  double weight_decay;              /* all; default 0, adamw 0.004 (Keras) */
  double rho;                       /* rmsprop; default 0.9 */
  double initial_accumulator_value; /* adagrad; default 0.1 (Keras) */
  int n_outputs; /* class scores or predictions the model emits (from the shape walk) */
  /* loop */
  int epochs;          /* default 1 */
  int log_every_steps; /* default 50 */
  uint64_t seed;       /* default 0 */
  int has_seed;
  int priority; /* 0..100, default 50 */
  /* service */
  int max_restarts;  /* retries after a trainer crash, 0..API_MAX_RESTARTS; default 0 */
  int max_runtime_s; /* seconds a run may take before it is stopped; 0 = no limit */
  int top_k;         /* top_k_accuracy's k; default 5 */
  /* training loop */
  int accumulation_steps; /* gradient_accumulation_steps; default 1 */
  double global_clipnorm; /* optimizer.global_clipnorm; 0 = no clipping */
  api_schedule schedule;  /* optimizer.schedule; default constant */
  api_callback early_stopping, plateau;
  int validation_every_steps;      /* 0 (default) = at each epoch's end only */
  int profile_first, profile_last; /* profile.steps: [first, last], 1-based; 0 = no profile */
  /* checkpoint: {"every_steps": N, "keep_last": K} */
  int checkpoint_every_steps; /* 0 (default) = only the final checkpoint */
  int checkpoint_keep_last;   /* newest K kept, older ones deleted; 0 (default) = keep all */
  /* keep_best: the K best by monitor are kept too ({"keep_best": 2,
   * "monitor": "val_loss", "mode": "min"}); mode "auto" (default) means
   * max for a monitor naming accuracy, else min, as in Keras. */
  int checkpoint_keep_best;
  char checkpoint_monitor[48];
  int checkpoint_mode_max; /* 1: higher is better */
  /* precision: "float32" (default), "mixed_bfloat16" or "mixed_float16" */
  char precision[16];
  int recompute; /* re-run im2col and pooling in backward, keep the rest; default false */
  /* float32 GEMMs on a GPU may use TF32 tensor cores (operands rounded to
   * a 10-bit mantissa); default false, as PyTorch's allow_tf32 */
  int allow_tf32;
  /* resources */
  char device_type[8]; /* "cpu" or "gpu" */
  int devices;         /* default 1; all at once (gang) */
  char pool[32];       /* default "default" */
  /* strategy: pipeline.batch_size is per replica, the global batch is
   * batch_size x workers x replicas */
  api_strategy strategy;
  int replicas;                /* mirrored: replicas; multi_worker: replicas_per_worker; 1 */
  int workers;                 /* multi_worker, parameter_server: processes; 1 otherwise */
  api_aggregation aggregation; /* default mean */
  double bucket_cap_mb;        /* multi_worker: all-reduce bucket cap; default 1 */
  int ps_servers;              /* parameter_server: ps, the server processes; 0 otherwise */
  int ps_async;                /* parameter_server: mode async (1) or sync (0, the default) */
  int max_staleness;           /* parameter_server async: steps ahead of the slowest; -1 = any */
} api_job_spec;

/* Parses and validates a job spec (len bytes; no NUL needed). On failure
 * returns -1 and fills err with a 400 INVALID_ARGUMENT whose details name
 * each offending field by its JSON path, all problems at once (the first
 * API_MAX_DETAILS; the message gives the count). Unknown fields are refused
 * so a typo never passes silently. spec is zeroed first, so two parses of
 * the same text compare equal with memcmp; options of the optimizer not
 * chosen stay 0. On success err is cleared (http 0). */
int api_spec_parse(const char *json, size_t len, api_job_spec *spec, api_error *err);
/* The spec in canonical form, every default filled in; malloc'd JSON text
 * that api_spec_parse accepts and maps to the same struct. Doubles are
 * written with as many digits as needed to read back exactly. NULL when out
 * of memory or when the struct holds what JSON cannot carry (an unknown
 * enum value, a seed above INT64_MAX, counts out of range). */
char *api_spec_to_json(const api_job_spec *spec);

/* ---- progress lines (kiln-train -> scheduler), one JSON object per line ---- */

#define API_MAX_METRICS 16

typedef enum api_progress_kind {
  API_PROGRESS_METRICS = 0, /* {"step":..,"epoch":..,"metrics":{"loss":..}} */
  API_PROGRESS_CHECKPOINT,  /* {"checkpoint":{"step":..,"path":..,"bytes":..,"sha256":..}} */
  API_PROGRESS_ERROR,       /* {"error":{"reason":"DATA_ERROR","message":".."}} */
  API_PROGRESS_STATUS,      /* {"status":{"phase":"training","message":".."}} */
} api_progress_kind;

typedef struct api_progress {
  api_progress_kind kind;
  int64_t step;
  int epoch;
  int n_metrics;
  char metric_names[API_MAX_METRICS][48];
  double metric_values[API_MAX_METRICS];
  char path[512];    /* checkpoint */
  int64_t bytes;     /* checkpoint */
  char sha256[65];   /* checkpoint, lowercase hex */
  char reason[48];   /* error: reason code; status: phase */
  char message[512]; /* error / status */
} api_progress;

/* Returns 0, or -1 with a sentence in err naming what is wrong with the line
 * (not an object, unknown kind or key, wrong type, string too long, ...).
 * out is zeroed first. */
int api_progress_parse(const char *line, api_progress *out, char *err, size_t errlen);
/* One line of JSON without the trailing newline; malloc'd. api_progress_parse
 * reads it back to the same struct. NULL for an unknown kind, a non-finite
 * value, an empty or repeated metric name, or when out of memory. */
char *api_progress_format(const api_progress *p);

/* ---- page tokens ---- */

#define API_PAGE_TOKEN_LEN 48
/* An opaque token for "the page after position" (position >= 1) of the
 * list that query describes (the caller's tenant, filter, ...: any text). */
void api_page_token_encode(int64_t position, const char *query, char out[API_PAGE_TOKEN_LEN]);
/* 0 and the position, or -1 when the token is not one we issued for query. */
int api_page_token_decode(const char *token, const char *query, int64_t *position);

/* ---- built-in data sets ---- */

/* A shard folder's name: 1..63 of [A-Za-z0-9._-], not starting with '.'. */
int api_shards_name_valid(const char *name);

typedef struct api_builtin_dataset {
  const char *name; /* as a job spec names it: "fashion-mnist" */
  const char *dir;  /* under the datasets directory */
  const char *train_images, *train_labels, *test_images, *test_labels; /* IDX, gzip'd */
  int64_t train_examples, test_examples;
  int input_shape[API_MAX_DIMS];
  int input_ndim;
  int n_classes;
} api_builtin_dataset;

int api_builtin_dataset_count(void);
const api_builtin_dataset *api_builtin_dataset_at(int i);
const api_builtin_dataset *api_builtin_dataset_find(const char *name); /* NULL if unknown */

/* ---- uploaded data sets ---- */

/* An uploaded data set's id: "ds-" and 16 lowercase hex digits. */
#define API_DATASET_ID_LEN 19
int api_dataset_id_valid(const char *id);

typedef enum api_dataset_format {
  API_DATASET_CSV = 0, /* one CSV file with a header; label_column names the classes */
  API_DATASET_IDX,     /* a tar of train-images/train-labels IDX files (gzip'd or raw) */
  API_DATASET_IMAGES,  /* a tar of one folder per class holding PNG/JPEG images */
  /* Shards, streamed by jobs: a tar of train/ (and test/) folders of shard
   * files, or (tfrecord) one TFRecord file; or a registered server folder. */
  API_DATASET_TFRECORD,
  API_DATASET_TAR,
} api_dataset_format;

/* "csv", "idx", "images", "tfrecord", "tar" */
const char *api_dataset_format_name(api_dataset_format f);
/* 1 for the formats jobs stream (tfrecord, tar). */
int api_dataset_format_is_shards(api_dataset_format f);
int api_dataset_format_parse(const char *name); /* -1 when unknown */

/* What kiln-train needs to read an upload, kept as dataset.json beside its
 * files: {"id":..,"format":..,"label_column":..}, and for shards
 * "image_feature" and "label_feature" (given at upload; "" = not given) and
 * "source" (a registered folder, relative to the datasets directory; ""
 * for an upload, whose shards are under files/). */
typedef struct api_dataset_manifest {
  char id[API_DATASET_ID_LEN + 1];
  api_dataset_format format;
  char label_column[64]; /* csv */
  char image_feature[128], label_feature[128];
  char source[256];
} api_dataset_manifest;
/* malloc'd JSON; NULL when out of memory. */
char *api_dataset_manifest_format(const api_dataset_manifest *m);
/* 0, or -1 with a sentence in err. */
int api_dataset_manifest_parse(const char *json, api_dataset_manifest *m, char *err, size_t errlen);

#endif
