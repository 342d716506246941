/* worker.h — private to kiln-train: finding, unpacking and checking data
 * sets, mapping a spec's model and pipeline onto the engine's, and ONNX
 * export. */
#ifndef KILN_WORKER_H
#define KILN_WORKER_H

#include <stddef.h>

#include "api.h"
#include "engine.h"

typedef struct worker_dirs {
  const char *datasets_dir; /* built-in data sets */
  const char *uploads_dir;  /* uploaded data sets, one folder per id (kilnd's data dir) */
  const char *cache_dir;    /* cache "file" of a built-in data set; a stream's cache file */
  /* multi_worker: this process among the job's (streamed shards are split
   * between them); 0 of 1 otherwise. */
  int rank, world;
} worker_dirs;

/* Unpacks a tar archive (ustar or GNU; regular files and folders) under
 * dest, refusing names that would land outside it. 0 or -1 with err. */
int worker_untar(const char *archive, const char *dest, char *err, size_t errlen);

/* Checks an upload folder (dataset.json + upload.bin) by loading it as a
 * job would; on success *summary is malloc'd JSON: format, examples,
 * test_examples, classes, input_shape, bytes, sha256 (and for shards
 * worker_check_shards's fields). datasets_dir: where a registered
 * folder's source is. */
int worker_check_upload(const char *dir, const char *datasets_dir, char **summary, char *err,
                        size_t errlen);
/* An upload folder's dataset.json. 0, or -1 with err. */
int worker_read_manifest(const char *dir, api_dataset_manifest *m, char *err, size_t errlen);
/* The SHA-256 (hex) and size of a file (of what could be read). */
void worker_sha256_file(const char *path, char hex[65], long long *bytes);

/* ---- shard data sets (shards.c) ---- */

/* The shard files of dir (regular files not starting with '.'), sorted,
 * malloc'd into *out: the count (0 when dir does not exist), or -1. */
int worker_list_shards(const char *dir, char ***out, char *err, size_t errlen);
void worker_free_shards(char **files, int n);
/* The folder holding a spec's shards (train/, test/): shards/<name> under
 * the datasets directory, or an uploaded or registered data set's. */
int worker_shard_root(const api_job_spec *spec, const worker_dirs *dirs, char *out, size_t outlen,
                      char *err, size_t errlen);
/* Checks a shard data set (an upload's folder: its archive unpacked, or
 * its one TFRecord file put in train/; or a registered source): every
 * record of every file read (framing, CRCs), the first records of each
 * parsed, the first one's features listed, and with the image and label
 * features (given, else the defaults) present every label read. Adds
 * train_files, test_files, features, image_feature and label_feature
 * ("" when not found) to the summary. */
int worker_check_shards(const char *dir, const api_dataset_manifest *m, const char *datasets_dir,
                        char **summary, char *err, size_t errlen);

/* The training data (and validation: the test split, a validation_split,
 * or none = val->n 0) of a spec; desc says where it came from. */
int worker_load_data(const api_job_spec *spec, const worker_dirs *dirs, kn_dataset *train,
                     kn_dataset *val, char *desc, size_t desclen, char *err, size_t errlen);

/* mean and std hold API_MAX_CHANNELS floats that pc points into. */
void worker_pipeline_config(const api_job_spec *spec, kn_pipeline_config *pc, float *mean,
                            float *std);

/* The spec's model in the engine's terms: layers (room for
 * API_MAX_LAYERS) and mc, which points into them (model_config.c). */
void worker_model_config(const api_job_spec *spec, kn_layer_config *layers, kn_model_config *mc);
/* The spec's optimizer in the engine's terms (plan.c). */
void worker_optimizer_config(const api_job_spec *spec, kn_optimizer_config *out);
/* kiln-train --plan-only: the planned memory of the spec's training as one
 * JSON line {"plan":{..., "total_bytes":N}} in line, allocating none of it.
 * 0, or -1 with err (the model does not build). */
int worker_plan(const api_job_spec *spec, char *line, size_t len, char *err, size_t errlen);

/* kiln-train --export-onnx with --weights: the spec's model with the
 * checkpoint's weights as an ONNX file at out (export.c). 0; or -1 with
 * err, *refused set when the model itself cannot be exported (a layer
 * with no translation) rather than the checkpoint or a file failing. */
/* IDX images + labels as n_shards TFRecord files out_prefix-00000-of-0000N
 * .tfrecord (.gz with gzip) of tf.train.Example records (convert.c). 0, or
 * -1 with err. */
int worker_idx_to_tfrecord(const char *images, const char *labels, const char *out_prefix,
                           int n_shards, int gzip, char *err, size_t errlen);
int worker_export_checkpoint(const api_job_spec *spec, const char *checkpoint, const char *out,
                             int *refused, char *err, size_t errlen);
/* The same for a model kiln-train has just trained. */
int worker_export_model(const api_job_spec *spec, kn_model *model, const kn_model_config *mc,
                        const char *out, int *refused, char *err, size_t errlen);

#endif
