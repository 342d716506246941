/* engine_data.h — data sets (IDX, CSV, image folders) and the tf.data-style
 * input pipeline (map, augment, shuffle, batch, cache, prefetch). Part of
 * engine.h. */
#ifndef KILN_ENGINE_PUBLIC_DATA_H
#define KILN_ENGINE_PUBLIC_DATA_H

#include "engine_graph.h"

/* --------------------------------------------------------------- datasets -- */

typedef struct kn_stream kn_stream;

typedef struct kn_dataset {
  int64_t n; /* examples */
  int ndim;  /* per-example rank */
  int shape[KN_MAX_DIMS];
  size_t example_size; /* floats per example */
  float *x;            /* (n, example_size), or NULL when the examples are x8 */
  uint8_t *x8;         /* (n, example_size) bytes instead of x: values x8 * x8_scale */
  float x8_scale;
  int32_t *y;     /* (n) */
  int n_classes;  /* max label + 1 */
  float *targets; /* (n, n_targets) regression targets, or NULL (CSV numeric labels) */
  int n_targets;
  float value_range; /* pixels: 255 (normalize divides by it); 0 = unknown (min-max) */
  /* A streamed data set (kn_dataset_stream): examples read from shard
   * files as the pipeline consumes them; x, x8 and y are NULL. Owned. */
  kn_stream *stream;
  /* multi_worker: this process's own share of the data (a stream sharded
   * by process, every process's share the same size): its pipeline makes
   * whole per-process batches of it instead of its part of each global
   * batch, so no process reads the others' examples. */
  int per_process;
} kn_dataset;

/* kn_dataset_load_idx flags. */
#define KN_IDX_NORMALIZE 1 /* pixels divided by 255 */
#define KN_IDX_BYTES     2 /* pixels kept as bytes (x8): a quarter of the memory */

/* Reads an IDX images file and an IDX labels file (raw or gzip'd), checking
 * magic numbers, dimensions, sizes and that the counts agree. Pixels become
 * floats (x), or stay bytes (x8) with KN_IDX_BYTES; either way an example
 * reads as the same floats. */
int kn_dataset_load_idx(const char *images_path, const char *labels_path, unsigned flags,
                        kn_dataset *out, char *err, size_t errlen);
void kn_dataset_free(kn_dataset *ds); /* frees the arrays; NULL is a no-op */
/* Example `row` as floats: a pointer into x, or buf (example_size floats)
 * filled from x8. */
const float *kn_dataset_row(const kn_dataset *ds, int64_t row, float *buf);
/* Bytes of one stored example value: 1 for x8, 4 for x. */
size_t kn_dataset_value_bytes(const kn_dataset *ds);

/* A CSV file with a header row: label_column names the class column
 * (integers >= 0, or names mapped to classes in sorted order), every other
 * column is a numeric feature; examples are flat (shape {features}). A cell
 * that is not a number is refused naming the file, row and column. When
 * every label is a number (3.7 too), it is also kept as a regression
 * target (targets, n_targets 1). */
int kn_dataset_load_csv(const char *path, const char *label_column, kn_dataset *out, char *err,
                        size_t errlen);

/* A directory with one sub-folder per class (classes in sorted name order)
 * holding PNG or JPEG images, each decoded and resized (bilinear) to
 * height x width x channels (1 = gray, 3 = RGB). Pixels stay in 0..255
 * (value_range 255). A file that does not decode is refused by name. */
int kn_dataset_load_images(const char *dir, int height, int width, int channels, kn_dataset *out,
                           char *err, size_t errlen);

/* An image file's bytes (PNG or JPEG, told by their magic) decoded, gray
 * or RGB, and resized bilinearly to height x width x channels floats in
 * 0..255. name is the file or record named in errors. */
int kn_image_decode(const uint8_t *data, size_t len, const char *name, int height, int width,
                    int channels, float *dst, char *err, size_t errlen);

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

/* ---------------------------------------------------------------- records -- */

/* CRC32C (Castagnoli, reflected 0x82F63B78): crc continues a previous
 * value (0 to start). TFRecord stores it masked: ((c >> 15 | c << 17) +
 * 0xa282ead8). */
uint32_t kn_crc32c(uint32_t crc, const void *data, size_t len);
uint32_t kn_crc32c_mask(uint32_t crc);

/* A TFRecord file (raw or gzip'd, told apart by its content): records of
 * (u64 length, masked CRC32C of the length, data, masked CRC32C of the
 * data), little-endian. */
typedef struct kn_tfrecord kn_tfrecord;
int kn_tfrecord_open(const char *path, kn_tfrecord **out, char *err, size_t errlen);
/* 1 and the next record's bytes (valid until the next call), 0 at the end
 * of the file, or KN_EFORMAT with err naming the file, the record's index
 * and byte offset and what is wrong (a CRC that does not match, a file
 * that ends inside a record, a damaged gzip stream). */
int kn_tfrecord_next(kn_tfrecord *r, const uint8_t **data, size_t *len, char *err, size_t errlen);
void kn_tfrecord_close(kn_tfrecord *r); /* NULL is a no-op */
/* The 12 bytes before and the 4 after a record of len bytes. */
void kn_tfrecord_frame(const void *data, size_t len, uint8_t head[12], uint8_t tail[4]);

/* A feature of a tf.train.Example: its kind and its list's bytes. */
enum { KN_FEATURE_NONE = 0, KN_FEATURE_BYTES = 1, KN_FEATURE_FLOAT = 2, KN_FEATURE_INT64 = 3 };
typedef struct kn_feature {
  int kind; /* KN_FEATURE_*; NONE for a feature with no list set */
  const uint8_t *list;
  size_t list_len;
} kn_feature;

/* The feature named name of the serialized Example: 1 (found), 0 (no such
 * feature), -1 (the bytes are not an Example). out points into data. */
int kn_example_feature(const uint8_t *data, size_t len, const char *name, kn_feature *out);
/* Each feature of the serialized Example, in the order stored (a name
 * stored twice is listed twice): up to cap of them into out (names point
 * into data, not terminated); the count, or -1 when the bytes are not an
 * Example. */
typedef struct kn_example_entry {
  const uint8_t *name;
  size_t name_len;
  kn_feature feature;
} kn_example_entry;
int kn_example_features(const uint8_t *data, size_t len, kn_example_entry *out, int cap);
/* The number of values, or -1 when the list is malformed. */
int64_t kn_feature_count(const kn_feature *f);
/* Float or int64 values (packed or not) as floats / int64s, up to cap of
 * them written: the count, or -1 (malformed, a bytes list, or a float
 * among them that no int64 holds, read as int64s). */
int64_t kn_feature_floats(const kn_feature *f, float *dst, size_t cap);
int64_t kn_feature_int64s(const kn_feature *f, int64_t *dst, size_t cap);
/* Value i of a bytes list (pointing into the record): 0, or -1. */
int kn_feature_bytes(const kn_feature *f, size_t i, const uint8_t **data, size_t *len);

/* A feature to encode: bytes (one value of count bytes), floats or ints
 * (count values, packed). */
typedef struct kn_feature_value {
  const char *name;
  int kind;
  const uint8_t *bytes;
  const float *floats;
  const int64_t *ints;
  size_t count;
} kn_feature_value;
/* A serialized tf.train.Example of the features (malloc'd into *out). */
int kn_example_encode(const kn_feature_value *features, int n, uint8_t **out, size_t *len);

/* A WebDataset-style tar shard (raw or gzip'd): members grouped by key
 * (the path up to the first dot of the file name) into samples. */
typedef struct kn_tar kn_tar;
int kn_tar_open(const char *path, kn_tar **out, char *err, size_t errlen);
/* 1 and the next sample (its parts; valid until the next call), 0 at the
 * end, or KN_EFORMAT naming the file, sample and byte offset. */
int kn_tar_next(kn_tar *t, const uint8_t **data, size_t *len, char *err, size_t errlen);
/* The part with extension ext ("png", "cls") of a sample: 0, or -1. */
int kn_tar_sample_part(const uint8_t *sample, size_t len, const char *ext, const uint8_t **data,
                       size_t *part_len);
/* Part i of a sample: 1 with its extension (not terminated) and data, 0
 * past the last part, -1 when the sample is malformed. */
int kn_tar_sample_part_at(const uint8_t *sample, size_t len, int i, const uint8_t **ext,
                          size_t *ext_len, const uint8_t **data, size_t *part_len);
int64_t kn_tar_index(const kn_tar *t);           /* samples read so far */
void kn_tar_close(kn_tar *t);                    /* NULL is a no-op */
int64_t kn_tfrecord_index(const kn_tfrecord *r); /* records read so far */

/* ------------------------------------------------------------ streams -- */

/* A data set streamed from shard files in bounded memory. Each epoch the
 * worker's files are shuffled by (seed, epoch), read interleaved
 * (cycle_length open at once, block_length records from each in turn) and
 * passed through a shuffle buffer of shuffle_buffer raw records. With
 * shard_count workers, worker shard_index reads files i % count == index
 * when there are at least count files, else every file keeping records
 * p % count == index (tf.data's auto-shard). */
enum { KN_SHARDS_TFRECORD = 1, KN_SHARDS_TAR = 2 };

typedef struct kn_stream_config {
  int format; /* KN_SHARDS_* */
  const char *const *files;
  int n_files;
  /* TFRecord: feature names (image: bytes holding PNG, JPEG or raw
   * height x width x channels bytes, or a float / int64 list of that many
   * values; label: an int64). Tar: extensions ("png", "cls"; the label a
   * decimal integer). */
  const char *image_feature, *label_feature;
  int height, width, channels;
  int cycle_length, block_length;
  int64_t shuffle_buffer;
  uint64_t seed;
  int shard_index, shard_count;
  /* tf.data's cache after decoding: the first epoch reads the files and
   * keeps each decoded example (in memory, or in the file cache_path);
   * an epoch all of whose records are kept reads no file, in the order
   * the files would have given. A memory cache larger than memory_limit
   * bytes (0 = none) is refused. */
  int cache; /* KN_STREAM_CACHE_* */
  const char *cache_path;
  int64_t memory_limit;
} kn_stream_config;

enum { KN_STREAM_CACHE_NONE = 0, KN_STREAM_CACHE_MEMORY = 1, KN_STREAM_CACHE_FILE = 2 };

/* A raw record of a stream and where it came from (for errors). */
typedef struct kn_stream_raw {
  uint8_t *data;
  size_t len, cap;
  const char *file;
  int64_t record;
  int64_t slot; /* the record's place in the cache */
  int cached;   /* no bytes: the decoded example is read from the cache */
} kn_stream_raw;

/* Checks the config and every file, then reads the worker's records once
 * (labels only) for the epoch's size and classes, so a wrong feature name
 * or a corrupt file is refused before any training. */
int kn_stream_new(const kn_stream_config *cfg, kn_stream **out, char *err, size_t errlen);
void kn_stream_free(kn_stream *s); /* NULL is a no-op */
/* Starts epoch `epoch` and reads past its first skip records (replayed:
 * read, not decoded), so any position is reached exactly. */
int kn_stream_begin(kn_stream *s, int64_t epoch, int64_t skip, char *err, size_t errlen);
/* 1 and the next raw record of the epoch (valid until the next call), 0 at
 * its end, or < 0 with err naming the file, record and offset. */
int kn_stream_next(kn_stream *s, const kn_stream_raw **rec, char *err, size_t errlen);
/* A raw record as an example: x (height x width x channels floats, pixels
 * 0..255; NULL = the label only) and its label. Thread-safe. */
int kn_stream_decode(const kn_stream *s, const kn_stream_raw *rec, float *x, int32_t *y, char *err,
                     size_t errlen);
int64_t kn_stream_examples(const kn_stream *s); /* per epoch, this worker's */
/* Ends every epoch after n records (1 <= n <= the examples): workers of
 * one job that must take the same number of steps drop the rest. */
int kn_stream_limit(kn_stream *s, int64_t n, char *err, size_t errlen);
/* Shard files opened so far (the count pass included). */
int64_t kn_stream_opens(const kn_stream *s);
/* This worker's files (by file: its share; by record: all of them). */
const char *const *kn_stream_files(const kn_stream *s, int *n, int *by_record);
int kn_stream_classes(const kn_stream *s);   /* max label + 1 */
int64_t kn_stream_epoch(const kn_stream *s); /* the epoch being read */
void kn_stream_shape(const kn_stream *s, int *height, int *width, int *channels);
/* Bytes the stream holds at most: the shuffle buffer's and the handed-out
 * record (at their largest so far), each open file's buffers and a memory
 * cache. */
size_t kn_stream_memory_bytes(const kn_stream *s);

/* A data set over a stream (which it then owns): n, shape, classes and
 * value_range 255 (bytes images) set; no examples in memory. */
int kn_dataset_stream(kn_stream *s, kn_dataset *out, char *err, size_t errlen);

/* ------------------------------------------------------------- pipeline -- */

/* A tf.data-style input pipeline over an in-memory dataset: skip/take,
 * shard, shuffle (buffer, reshuffled each epoch), map (cast, normalize,
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
  const float *mean, *std; /* given (n_channels_given values each); NULL = computed */
  int one_hot;             /* also fill kn_batch.y_onehot */
  int one_hot_depth;       /* its width; 0 = the dataset's classes */
  /* Storage type of the examples the pipeline reads: KN_F32 (0, as given),
   * or KN_F16 / KN_BF16: read from a copy at that precision, converted
   * back to f32 for the maps and the model. */
  kn_dtype cast;
  unsigned augment;             /* KN_AUG_* */
  int crop_padding;             /* random_crop: zeros on each side */
  float brightness_delta;       /* random_brightness */
  int64_t skip, take;           /* on the source, first: take < 0 = all */
  int shard_index, shard_count; /* worker i of n sees positions p with p % n == i */
  int repeat;                   /* epochs; < 0 = forever */
  int num_parallel_calls;       /* producer threads; 0 = in the consumer; KN_AUTO */
  int prefetch;                 /* batches in the ring; KN_AUTO */
  /* A worker's part of each (global) batch: with part_count n > 1 (n must
   * divide batch_size) this pipeline makes only rows [i x batch_size / n,
   * (i + 1) x batch_size / n) of every batch, after the shuffle, so the n
   * parts of a batch are exactly the batch one pipeline makes, augmentation
   * included; maps and augmentation run on the part's rows only. A short
   * last batch leaves the later parts short or empty (rows 0). 0 or 1 =
   * the whole batch. */
  int part_index, part_count;
} kn_pipeline_config;

/* Keras defaults: batch 32, no shuffle, one epoch, 1 thread, prefetch 2. */
void kn_pipeline_config_default(kn_pipeline_config *cfg);

typedef struct kn_batch {
  int rows;
  int epoch;             /* 0-based */
  int64_t index;         /* batch within its epoch */
  const float *x;        /* (rows, example_size) */
  const int32_t *y;      /* (rows) */
  const float *y_onehot; /* (rows, one_hot_depth), only with one_hot */
  const float *targets;  /* (rows, n_targets), when the dataset has regression targets */
} kn_batch;

typedef struct kn_pipeline kn_pipeline;

/* The dataset must outlive the pipeline. Statistics (min-max, mean/std)
 * are computed here over the examples this pipeline reads. */
int kn_pipeline_new(const kn_dataset *ds, const kn_pipeline_config *cfg, kn_pipeline **out,
                    char *err, size_t errlen);
/* An evaluation pipeline over ds with train's maps and statistics: no
 * augmentation, shuffle, skip/take or shard, one epoch, remainder kept;
 * train's part of each batch (a worker evaluates its own part). */
int kn_pipeline_new_eval(const kn_pipeline *train, const kn_dataset *ds, kn_pipeline **out,
                         char *err, size_t errlen);
void kn_pipeline_free(kn_pipeline *p); /* stops the threads; NULL is a no-op */
/* 1 and the next batch (valid until the next call), 0 at the end, or < 0
 * when a streamed data set's record could not be read or decoded (then
 * kn_pipeline_error says which, naming the file and record). */
int kn_pipeline_next(kn_pipeline *p, kn_batch *out);
const char *kn_pipeline_error(const kn_pipeline *p);
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
  double produce_ms;   /* one producer's time per batch */
  double consume_ms;   /* the consumer's own time between two batches */
  double wait_s;       /* the consumer's total time waiting for a batch */
  int64_t batches;     /* handed out so far */
  size_t memory_bytes; /* the ring's batches, plus a streamed source's buffers */
} kn_pipeline_stats;
void kn_pipeline_stats_get(const kn_pipeline *p, kn_pipeline_stats *out);

#endif
