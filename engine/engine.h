/* engine.h — kiln's training engine: a static computation graph with
 * reverse-mode autodiff into the same graph, a liveness-based memory plan in
 * one arena, flat parameter / gradient buffers, CPU kernels on OpenBLAS,
 * optimizers, Keras-style model building, IDX datasets, safetensors
 * checkpoints and the training loop. Knows nothing of HTTP, JSON or SQLite.
 * Prefix kn_. Every call that can fail returns 0 or a negative KN_E* code and
 * fills a caller's error buffer with a sentence. */
#ifndef KILN_ENGINE_H
#define KILN_ENGINE_H

#include <stddef.h>
#include <stdint.h>

enum {
  KN_OK = 0,
  KN_EINVAL = -1,  /* bad argument or shape */
  KN_ENOMEM = -2,  /* allocation failed */
  KN_EIO = -3,     /* file could not be read or written */
  KN_EFORMAT = -4, /* file content is not what it claims to be */
  KN_ESTATE = -5,  /* call out of order (e.g. run before compile) */
  KN_ENUMERIC = -6 /* a loss or gradient became NaN or infinite */
};
const char *kn_strerror(int code);

#define KN_MAX_DIMS 6

typedef enum kn_dtype { KN_F32 = 0, KN_I32 } kn_dtype;

/* ---------------------------------------------------------------- graph -- */

typedef struct kn_graph kn_graph;
typedef int kn_node; /* a node's index in its graph; negative = invalid */

typedef enum kn_init {
  KN_INIT_ZEROS = 0,
  KN_INIT_ONES,
  KN_INIT_GLOROT_UNIFORM, /* U(-l, l), l = sqrt(6 / (fan_in + fan_out)) */
} kn_init;

kn_graph *kn_graph_new(void);
void kn_graph_free(kn_graph *g); /* NULL is a no-op */

/* Builders. A builder given an invalid node or mismatched shapes returns -1
 * and records the first such error in the graph (kn_graph_error), so a
 * model can be built with straight-line code and checked once. */
/* An input fed each step. Its leading dimension is the batch: memory is
 * planned for dims[0] rows and each run may use fewer (kn_graph_run). */
kn_node kn_input(kn_graph *g, const char *name, kn_dtype dtype, int ndim, const int *dims);
/* A trainable parameter, stored in the flat parameter buffer. */
kn_node kn_param(kn_graph *g, const char *name, int ndim, const int *dims, kn_init init);
kn_node kn_matmul(kn_graph *g, kn_node a, kn_node b, int trans_a, int trans_b); /* 2-D */
kn_node kn_bias_add(kn_graph *g, kn_node x, kn_node bias); /* bias along the last dim */
kn_node kn_add(kn_graph *g, kn_node a, kn_node b);         /* same shapes */
kn_node kn_relu(kn_graph *g, kn_node x);
kn_node kn_softmax(kn_graph *g, kn_node x);                            /* over the last dim */
kn_node kn_reshape(kn_graph *g, kn_node x, int ndim, const int *dims); /* a view, no copy */
/* Mean over the batch of -log softmax(logits)[label]; logits (B, C) f32,
 * labels (B) i32. A scalar. */
kn_node kn_softmax_xent(kn_graph *g, kn_node logits, kn_node labels);

int kn_graph_error(const kn_graph *g, char *err, size_t errlen); /* 0 or the first error */
int kn_graph_node_count(const kn_graph *g);
void kn_node_shape(const kn_graph *g, kn_node n, int *ndim, int *dims);
const char *kn_node_name(const kn_graph *g, kn_node n);
/* Keep a node's value readable after a run (the planner never reuses it). */
void kn_graph_keep(kn_graph *g, kn_node n);

/* Reverse-mode autodiff: appends to the graph the nodes that compute
 * d(loss)/d(param) for every parameter, binding each final gradient to its
 * slot in the flat gradient buffer. Only nodes that depend on a parameter get
 * gradients. loss must be a scalar. */
int kn_autodiff(kn_graph *g, kn_node loss, char *err, size_t errlen);

typedef struct kn_plan_stats {
  size_t arena_bytes; /* peak of the planned arena */
  size_t naive_bytes; /* one buffer per node, for comparison */
  size_t param_bytes; /* flat parameter buffer */
  size_t grad_bytes;  /* flat gradient buffer */
  int n_nodes;
  int n_forward; /* nodes run by a forward-only pass */
} kn_plan_stats;

/* Plans memory (liveness over the schedule, first-fit offsets in one arena),
 * allocates and first-touches the arena and the flat buffers, and
 * initialises parameters from seed. After this, running allocates nothing. */
int kn_graph_compile(kn_graph *g, uint64_t seed, kn_plan_stats *stats, char *err, size_t errlen);

/* The node's storage (valid after compile). Inputs are written here before
 * a run; kept nodes are read here after it. */
void *kn_node_data(kn_graph *g, kn_node n);
/* Byte offset and size of a node in the arena (for plan checks); -1 when the
 * node is not arena-planned (parameters, gradients, views). */
int64_t kn_node_arena_offset(const kn_graph *g, kn_node n, size_t *nbytes);
/* First and last schedule position at which the node's storage is live. */
void kn_node_lifetime(const kn_graph *g, kn_node n, int *first, int *last);

typedef enum kn_run_mode {
  KN_RUN_FORWARD = 0, /* forward nodes only (evaluation) */
  KN_RUN_TRAIN = 1,   /* forward and backward: fills the gradient buffer */
} kn_run_mode;

/* Runs the compiled graph for a batch of `batch` rows (1..planned batch). */
int kn_graph_run(kn_graph *g, kn_run_mode mode, int batch, char *err, size_t errlen);

/* Flat buffers: every parameter (and its gradient) at the same offset. */
size_t kn_param_count(const kn_graph *g); /* in floats */
float *kn_params(kn_graph *g);
float *kn_grads(kn_graph *g);
int kn_param_node_count(const kn_graph *g);
kn_node kn_param_node(const kn_graph *g, int i);          /* i-th parameter, creation order */
size_t kn_param_offset(const kn_graph *g, kn_node param); /* in floats */

/* ------------------------------------------------------------ optimizers -- */

typedef enum kn_optimizer_type { KN_OPT_SGD = 0, KN_OPT_ADAM } kn_optimizer_type;

typedef struct kn_optimizer_config {
  kn_optimizer_type type;
  float learning_rate;
  float momentum;              /* sgd */
  int nesterov;                /* sgd */
  float beta1, beta2, epsilon; /* adam */
} kn_optimizer_config;

typedef struct kn_optimizer kn_optimizer;
/* State (momentum, moments) is one flat array per kind, sized n_params. */
int kn_optimizer_new(const kn_optimizer_config *cfg, size_t n_params, kn_optimizer **out, char *err,
                     size_t errlen);
void kn_optimizer_free(kn_optimizer *opt);
/* One fused update over the flat buffers (Keras update rules). */
void kn_optimizer_step(kn_optimizer *opt, float *params, const float *grads);
int64_t kn_optimizer_iterations(const kn_optimizer *opt);

/* --------------------------------------------------------------- models -- */

typedef enum kn_layer_type {
  KN_LAYER_DENSE = 0,
  KN_LAYER_FLATTEN,
  KN_LAYER_ACTIVATION,
} kn_layer_type;

typedef enum kn_activation { KN_ACT_LINEAR = 0, KN_ACT_RELU, KN_ACT_SOFTMAX } kn_activation;

typedef struct kn_layer_config {
  kn_layer_type type;
  char name[64];
  int units; /* dense */
  int use_bias;
  kn_activation activation;
} kn_layer_config;

typedef struct kn_model_config {
  int input_ndim;
  int input_shape[KN_MAX_DIMS]; /* per example */
  int n_layers;
  const kn_layer_config *layers;
  int batch_size; /* planned rows */
} kn_model_config;

/* A classifier built from Keras-style layers: input x (B, ...) f32, labels
 * y (B) i32, logits (B, C) kept, loss = sparse categorical cross-entropy.
 * A softmax on the last layer is folded into the loss (as Keras does with
 * from_logits=False), so the loss is computed stably from the logits. */
typedef struct kn_model {
  kn_graph *graph;
  kn_node x, y, logits, loss;
  int n_classes;
  size_t example_size; /* floats per example */
} kn_model;

int kn_model_build(const kn_model_config *cfg, kn_model *out, char *err, size_t errlen);
void kn_model_free(kn_model *m); /* frees the graph; the struct is the caller's */

/* --------------------------------------------------------------- datasets -- */

typedef struct kn_dataset {
  int64_t n; /* examples */
  int ndim;  /* per-example rank */
  int shape[KN_MAX_DIMS];
  size_t example_size; /* floats per example */
  float *x;            /* (n, example_size) */
  int32_t *y;          /* (n) */
  int n_classes;       /* max label + 1 */
  float value_range;   /* pixels: 255 (normalize divides by it); 0 = unknown (min-max) */
} kn_dataset;

/* Reads an IDX images file and an IDX labels file (raw or gzip'd), checking
 * magic numbers, dimensions, sizes and that the counts agree. Pixels become
 * floats, divided by 255 when normalize is set. */
int kn_dataset_load_idx(const char *images_path, const char *labels_path, int normalize,
                        kn_dataset *out, char *err, size_t errlen);
void kn_dataset_free(kn_dataset *ds); /* frees the arrays; NULL is a no-op */

/* A CSV file with a header row: label_column names the class column
 * (integers >= 0, or names mapped to classes in sorted order), every other
 * column is a numeric feature; examples are flat (shape {features}). A cell
 * that is not a number is refused naming the file, row and column. */
int kn_dataset_load_csv(const char *path, const char *label_column, kn_dataset *out, char *err,
                        size_t errlen);

/* A directory with one sub-folder per class (classes in sorted name order)
 * holding PNG or JPEG images, each decoded and resized (bilinear) to
 * height x width x channels (1 = gray, 3 = RGB). Pixels stay in 0..255
 * (value_range 255). A file that does not decode is refused by name. */
int kn_dataset_load_images(const char *dir, int height, int width, int channels, kn_dataset *out,
                           char *err, size_t errlen);

/* A decoded dataset in a file (pipeline cache "file"): written to a
 * per-process temp file and renamed into place; read back as it was. */
int kn_dataset_cache_write(const kn_dataset *ds, const char *path, char *err, size_t errlen);
int kn_dataset_cache_read(const char *path, kn_dataset *out, char *err, size_t errlen);

/* src reordered as tf.data's interleave reads its parts (files, class
 * folders): part i is examples [part_start[i], part_start[i + 1]), and
 * part_start[n_parts] == src->n. cycle_length parts are open at once and
 * block_length examples are taken from each in turn; a part that runs out
 * is replaced by the next unopened one. */
int kn_dataset_interleave(const kn_dataset *src, int n_parts, const int64_t *part_start,
                          int cycle_length, int block_length, kn_dataset *out, char *err,
                          size_t errlen);

/* Examples [start, start + count) of src as a new dataset (copied). */
int kn_dataset_slice(const kn_dataset *src, int64_t start, int64_t count, kn_dataset *out,
                     char *err, size_t errlen);

/* ------------------------------------------------------------- pipeline -- */

/* A tf.data-style input pipeline over an in-memory dataset: skip/take,
 * shard, shuffle (buffer, reshuffled each epoch), map (normalize,
 * standardize, one-hot), augment, batch, repeat, with background producer
 * threads filling a bounded ring of batches. Every example's randomness is
 * drawn from (seed, epoch, position), so the batches are byte-identical
 * whatever the thread count, and a saved position restores exactly. */

#define KN_AUTO (-1)

enum {
  KN_AUG_FLIP_LEFT_RIGHT = 1 << 0,
  KN_AUG_FLIP_UP_DOWN = 1 << 1,
  KN_AUG_RANDOM_CROP = 1 << 2,       /* pad with zeros, crop back at a random offset */
  KN_AUG_RANDOM_BRIGHTNESS = 1 << 3, /* add U(-max_delta, max_delta) to the whole example */
};

typedef struct kn_pipeline_config {
  int batch_size;
  int drop_remainder;
  int64_t shuffle_buffer; /* 0 = keep order; >= examples = a full uniform shuffle */
  uint64_t seed;
  int normalize;   /* x / value_range, or per-feature min-max when value_range is 0 */
  int standardize; /* per channel (last dim): (x - mean) / std, after normalize */
  int n_channels_given;
  const float *mean, *std;      /* given (n_channels_given values each); NULL = computed */
  int one_hot;                  /* also fill kn_batch.y_onehot */
  unsigned augment;             /* KN_AUG_* */
  int crop_padding;             /* random_crop: zeros on each side */
  float brightness_delta;       /* random_brightness */
  int64_t skip, take;           /* on the source, first: take < 0 = all */
  int shard_index, shard_count; /* worker i of n sees positions p with p % n == i */
  int repeat;                   /* epochs; < 0 = forever */
  int num_parallel_calls;       /* producer threads; 0 = in the consumer; KN_AUTO */
  int prefetch;                 /* batches in the ring; KN_AUTO */
} kn_pipeline_config;

/* Keras defaults: batch 32, no shuffle, one epoch, 1 thread, prefetch 2. */
void kn_pipeline_config_default(kn_pipeline_config *cfg);

typedef struct kn_batch {
  int rows;
  int epoch;             /* 0-based */
  int64_t index;         /* batch within its epoch */
  const float *x;        /* (rows, example_size) */
  const int32_t *y;      /* (rows) */
  const float *y_onehot; /* (rows, n_classes), only with one_hot */
} kn_batch;

typedef struct kn_pipeline kn_pipeline;

/* The dataset must outlive the pipeline. Statistics (min-max, mean/std)
 * are computed here over the examples this pipeline reads. */
int kn_pipeline_new(const kn_dataset *ds, const kn_pipeline_config *cfg, kn_pipeline **out,
                    char *err, size_t errlen);
/* An evaluation pipeline over ds with train's maps and statistics: no
 * augmentation, shuffle, skip/take or shard, one epoch, remainder kept. */
int kn_pipeline_new_eval(const kn_pipeline *train, const kn_dataset *ds, kn_pipeline **out,
                         char *err, size_t errlen);
void kn_pipeline_free(kn_pipeline *p); /* stops the threads; NULL is a no-op */
/* 1 and the next batch (valid until the next call), or 0 at the end. */
int kn_pipeline_next(kn_pipeline *p, kn_batch *out);
int64_t kn_pipeline_batches_per_epoch(const kn_pipeline *p);
int64_t kn_pipeline_examples_per_epoch(const kn_pipeline *p);
int kn_pipeline_example_size(const kn_pipeline *p);

/* The position of the next batch; restoring it (into a pipeline made with
 * the same dataset and config) yields exactly the batches that would have
 * followed. The text form is "epoch:batch:seed". */
typedef struct kn_pipeline_state {
  int64_t epoch, batch;
  uint64_t seed;
} kn_pipeline_state;
void kn_pipeline_save(const kn_pipeline *p, kn_pipeline_state *st);
int kn_pipeline_restore(kn_pipeline *p, const kn_pipeline_state *st, char *err, size_t errlen);
int kn_pipeline_state_format(const kn_pipeline_state *st, char *buf, size_t len);
int kn_pipeline_state_parse(const char *text, kn_pipeline_state *st, char *err, size_t errlen);

/* What the pipeline runs with and what it measured. With KN_AUTO, after a
 * warm-up of batches it sizes threads and prefetch from the producer's time
 * per batch and the consumer's time between batches; tuned says it did. */
typedef struct kn_pipeline_stats {
  int threads, prefetch, tuned;
  double produce_ms; /* one producer's time per batch */
  double consume_ms; /* the consumer's own time between two batches */
  double wait_s;     /* the consumer's total time waiting for a batch */
  int64_t batches;   /* handed out so far */
} kn_pipeline_stats;
void kn_pipeline_stats_get(const kn_pipeline *p, kn_pipeline_stats *out);

/* ------------------------------------------------------------ checkpoints -- */

typedef struct kn_checkpoint_info {
  int64_t bytes;
  char sha256[65];
} kn_checkpoint_info;

/* Writes every parameter as a safetensors file (F32, named by the graph's
 * parameter names), with string metadata pairs (keys[i], values[i]):
 * to path.tmp, fsync, rename to path, fsync the directory. */
int kn_checkpoint_write(kn_graph *g, const char *path, int n_meta, const char *const *keys,
                        const char *const *values, kn_checkpoint_info *info, char *err,
                        size_t errlen);

/* SHA-256 of a buffer, incremental. */
typedef struct kn_sha256 {
  uint32_t state[8];
  uint64_t length;
  uint8_t block[64];
  size_t used;
} kn_sha256;
void kn_sha256_init(kn_sha256 *h);
void kn_sha256_update(kn_sha256 *h, const void *data, size_t len);
void kn_sha256_final(kn_sha256 *h, uint8_t digest[32]);
void kn_sha256_hex(const uint8_t digest[32], char hex[65]);

/* ------------------------------------------------------------------ rng -- */

/* xoshiro256** seeded through splitmix64: the same seed gives the same
 * stream on every machine. */
typedef struct kn_rng {
  uint64_t s[4];
} kn_rng;
void kn_rng_seed(kn_rng *r, uint64_t seed);
uint64_t kn_rng_next(kn_rng *r);
float kn_rng_uniform(kn_rng *r);              /* [0, 1) */
uint64_t kn_rng_below(kn_rng *r, uint64_t n); /* [0, n), unbiased */

/* --------------------------------------------------------------- training -- */

typedef enum kn_event_kind {
  KN_EVENT_STEP = 0,   /* every log_every_steps steps: loss over the interval */
  KN_EVENT_EPOCH,      /* end of an epoch: epoch means and validation */
  KN_EVENT_CHECKPOINT, /* a checkpoint file is in place */
} kn_event_kind;

#define KN_EVENT_MAX_METRICS 8

typedef struct kn_train_event {
  kn_event_kind kind;
  int epoch;    /* 1-based */
  int64_t step; /* optimizer steps done so far */
  int n_metrics;
  const char *names[KN_EVENT_MAX_METRICS];
  double values[KN_EVENT_MAX_METRICS];
  const char *path; /* checkpoint */
  const kn_checkpoint_info *checkpoint;
  double seconds; /* since training started */
} kn_train_event;

/* Returns 0 to go on, non-zero to stop training early (not an error). */
typedef int (*kn_train_callback)(const kn_train_event *ev, void *user);

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
  /* Called once when an auto-tuned pipeline has chosen (may be NULL). */
  void (*on_tuned)(const kn_pipeline_stats *stats, void *user);
} kn_train_config;

/* Trains model on train for cfg->epochs, evaluating on val (may be NULL)
 * after each epoch, and writes a final checkpoint when checkpoint_dir is set. */
int kn_train(kn_model *model, const kn_dataset *train, const kn_dataset *val,
             const kn_train_config *cfg, kn_train_callback cb, void *user, char *err,
             size_t errlen);

/* Loss and accuracy of the model on a whole dataset, in batches. */
int kn_evaluate(kn_model *model, const kn_dataset *ds, double *loss, double *accuracy, char *err,
                size_t errlen);

#endif
