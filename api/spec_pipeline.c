/* spec_pipeline.c — the job spec's dataset and pipeline sections: which data,
 * and how it is batched, shuffled, normalized, augmented and sharded. */
#include "spec_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

int api_shards_name_valid(const char *name) {
  size_t n = strlen(name);
  if (n < 1 || n > 63 || name[0] == '.') return 0;
  for (size_t i = 0; i < n; i++) {
    char ch = name[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '.' || ch == '_' || ch == '-'))
      return 0;
  }
  return 1;
}

/* dataset.features: which feature is the image and which the label
 * (TFRecord feature names, or a tar sample's extensions). */
static void parse_features(checker *c, json_t *obj, api_job_spec *spec) {
  const int tar = spec->shards_format == API_SHARDS_TAR;
  spec_copy_text(spec->image_feature, sizeof spec->image_feature, tar ? "png" : "image/encoded");
  spec_copy_text(spec->label_feature, sizeof spec->label_feature,
                 tar ? "cls" : "image/class/label");
  if (!obj) return;
  scope s = {c, obj, "dataset.features"};
  static const char *const fields[] = {"image", "label", NULL};
  spec_refuse_unknown(&s, fields);
  static const char *const keys[] = {"image", "label"};
  char *dst[] = {spec->image_feature, spec->label_feature};
  for (int k = 0; k < 2; k++) {
    const char *v = spec_get_string(&s, keys[k], OPTIONAL);
    if (!v) continue;
    char path[64], quoted[64];
    snprintf(path, sizeof path, "dataset.features.%s", keys[k]);
    if (!v[0] || strlen(v) >= sizeof spec->image_feature)
      spec_problem(c, path, "must be a name of 1-127 bytes, got '%s'",
                   spec_clip(v, quoted, sizeof quoted));
    else
      spec_copy_text(dst[k], sizeof spec->image_feature, v);
  }
}

void spec_parse_dataset(checker *c, json_t *obj, api_job_spec *spec) {
  scope s = {c, obj, "dataset"};
  static const char *const fields[] = {"name",   "validation", "validation_split",
                                       "format", "features",   NULL};
  static const char *const validations[] = {"test", "none", "split", NULL};
  static const char *const formats[] = {"tfrecord", "tar", NULL};
  spec_refuse_unknown(&s, fields);
  const char *name = spec_get_string(&s, "name", REQUIRED);
  int format = spec_get_choice(&s, "format", OPTIONAL, "unknown shard format", formats);
  int uploaded = name && api_dataset_id_valid(name);
  if (format >= 0) {
    spec->shards_format = format == 0 ? API_SHARDS_TFRECORD : API_SHARDS_TAR;
    parse_features(c, spec_get_object(&s, "features", OPTIONAL), spec);
    if (name && !api_shards_name_valid(name)) {
      char quoted[64];
      spec_problem(c, "dataset.name",
                   "with a format, names a folder of shards (1-63 of A-Z a-z 0-9 . _ -, not "
                   "starting with '.'), got '%s'",
                   spec_clip(name, quoted, sizeof quoted));
    } else if (name) {
      spec_copy_text(spec->dataset, sizeof spec->dataset, name);
    }
  } else if (spec_member(&s, "features", OPTIONAL)) {
    spec_problem(c, "dataset.features", "needs a shard format (dataset.format)");
  } else if (name && !uploaded && !api_builtin_dataset_find(name)) {
    char quoted[64], known[256] = "";
    size_t used = 0;
    for (int i = 0; i < api_builtin_dataset_count() && used < sizeof known; i++) {
      used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "",
                               api_builtin_dataset_at(i)->name);
    }
    spec_problem(c, "dataset.name",
                 "unknown dataset '%s'; built-in data sets: %s; or the id of an uploaded data set "
                 "(ds- and 16 hex digits)",
                 spec_clip(name, quoted, sizeof quoted), known);
  } else if (name) {
    spec_copy_text(spec->dataset, sizeof spec->dataset, name);
  }
  /* An upload (or a shard folder) may have no held-out split: no
   * validation unless asked. */
  if (uploaded || format >= 0) spec_copy_text(spec->validation, sizeof spec->validation, "none");
  int validation =
      spec_get_choice(&s, "validation", OPTIONAL, "unknown validation split", validations);
  if (validation >= 0)
    spec_copy_text(spec->validation, sizeof spec->validation, validations[validation]);
  double split = 0;
  if (spec_get_number(&s, "validation_split", OPTIONAL, &split) == 1) {
    if (!(split > 0 && split < 1)) {
      spec_problem(c, "dataset.validation_split", "must be > 0 and < 1, got %g", split);
    } else if (validation >= 0 && strcmp(validations[validation], "split") != 0) {
      spec_problem(c, "dataset.validation_split",
                   "needs validation 'split' (or none given), got '%s'", validations[validation]);
    } else {
      spec->validation_split = split;
      spec_copy_text(spec->validation, sizeof spec->validation, "split");
    }
  } else if (validation >= 0 && strcmp(validations[validation], "split") == 0) {
    spec_problem(c, "dataset.validation_split", "is required with validation 'split'");
  }
  if (spec->shards_format && strcmp(spec->validation, "split") == 0)
    spec_problem(c, "dataset.validation",
                 "'split' needs the whole data set at hand; streamed shards validate on their "
                 "test folder ('test') or not at all ('none')");
}

/* An integer in [min, max] or the string "auto" (API_AUTO). */
static void get_auto_int(const scope *s, const char *key, int min, int max, int *out) {
  json_t *value = spec_member(s, key, OPTIONAL);
  if (!value) return;
  if (json_is_string(value)) {
    if (strcmp(json_string_value(value), "auto") == 0) {
      *out = API_AUTO;
    } else {
      char path[PATH_LEN], quoted[64];
      spec_join_path(path, s->path, key);
      spec_problem(s->c, path, "must be an integer or \"auto\", got '%s'",
                   spec_clip(json_string_value(value), quoted, sizeof quoted));
    }
    return;
  }
  spec_get_int(s, key, OPTIONAL, min, max, out);
}

static void parse_standardize(checker *c, json_t *value, api_job_spec *spec) {
  if (json_is_boolean(value)) {
    spec->standardize = json_is_true(value);
    return;
  }
  if (!json_is_object(value)) {
    spec_problem(c, "pipeline.standardize",
                 "must be true, false or {\"mean\": [...], \"std\": [...]}, got %s",
                 api_json_type_name(value));
    return;
  }
  scope s = {c, value, "pipeline.standardize"};
  static const char *const fields[] = {"mean", "std", NULL};
  spec_refuse_unknown(&s, fields);
  json_t *mean = spec_get_array(&s, "mean", REQUIRED), *std = spec_get_array(&s, "std", REQUIRED);
  if (!mean || !std) return;
  size_t n = json_array_size(mean);
  if (n < 1 || n > API_MAX_CHANNELS || json_array_size(std) != n) {
    spec_problem(c, "pipeline.standardize",
                 "mean and std must list the same number of channels, 1 to %d; got %zu and %zu",
                 API_MAX_CHANNELS, n, json_array_size(std));
    return;
  }
  int ok = 1;
  for (size_t i = 0; i < n; i++) {
    json_t *m = json_array_get(mean, i), *d = json_array_get(std, i);
    char path[PATH_LEN];
    if (!json_is_number(m)) {
      spec_index_path(path, "pipeline.standardize.mean", i);
      spec_problem(c, path, "must be a number, got %s", api_json_type_name(m));
      ok = 0;
    }
    if (!json_is_number(d) || !(json_number_value(d) > 0)) {
      spec_index_path(path, "pipeline.standardize.std", i);
      if (json_is_number(d))
        spec_problem(c, path, "must be > 0, got %g", json_number_value(d));
      else
        spec_problem(c, path, "must be a number, got %s", api_json_type_name(d));
      ok = 0;
    }
    if (ok) {
      spec->standardize_mean[i] = json_number_value(m);
      spec->standardize_std[i] = json_number_value(d);
    }
  }
  if (!ok) return;
  spec->standardize = 1;
  spec->n_standardize = (int)n;
}

const char *const spec_augment_names[] = {"flip_left_right", "flip_up_down", "random_crop",
                                          "random_brightness", NULL};

static void parse_augment(checker *c, json_t *list, api_job_spec *spec) {
  for (size_t i = 0; i < json_array_size(list); i++) {
    json_t *item = json_array_get(list, i);
    char path[PATH_LEN], quoted[64], known[128];
    spec_index_path(path, "pipeline.augment", i);
    const char *type = NULL;
    json_t *obj = NULL;
    if (json_is_string(item)) {
      type = json_string_value(item);
    } else if (json_is_object(item)) {
      obj = item;
      scope s = {c, obj, path};
      type = spec_get_string(&s, "type", REQUIRED);
    } else {
      spec_problem(c, path, "must be a name or an object with a type, got %s",
                   api_json_type_name(item));
      continue;
    }
    if (!type) continue;
    int kind = spec_pick(type, spec_augment_names);
    if (kind < 0) {
      spec_problem(c, path, "unknown augmentation '%s'; supported: %s",
                   spec_clip(type, quoted, sizeof quoted),
                   spec_list_text(spec_augment_names, known, sizeof known));
      continue;
    }
    unsigned bit = 1u << kind;
    if (spec->augment & bit) {
      spec_problem(c, path, "'%s' is listed twice", type);
      continue;
    }
    spec->augment |= bit;
    if (bit == API_AUG_RANDOM_CROP) spec->crop_padding = 4;
    if (bit == API_AUG_RANDOM_BRIGHTNESS) spec->brightness_delta = 0.2;
    if (!obj) continue;
    scope s = {c, obj, path};
    static const char *const crop_fields[] = {"type", "padding", NULL};
    static const char *const brightness_fields[] = {"type", "max_delta", NULL};
    static const char *const plain_fields[] = {"type", NULL};
    spec_refuse_unknown(&s, bit == API_AUG_RANDOM_CROP         ? crop_fields
                            : bit == API_AUG_RANDOM_BRIGHTNESS ? brightness_fields
                                                               : plain_fields);
    if (bit == API_AUG_RANDOM_CROP)
      spec_get_int(&s, "padding", OPTIONAL, 1, 1024, &spec->crop_padding);
    if (bit == API_AUG_RANDOM_BRIGHTNESS &&
        spec_get_number(&s, "max_delta", OPTIONAL, &spec->brightness_delta) == 1 &&
        !(spec->brightness_delta > 0 && spec->brightness_delta <= 255)) {
      char field[PATH_LEN];
      spec_join_path(field, path, "max_delta");
      spec_problem(c, field, "must be > 0 and <= 255, got %g", spec->brightness_delta);
    }
  }
}

void spec_parse_pipeline(checker *c, json_t *obj, api_job_spec *spec) {
  scope s = {c, obj, "pipeline"};
  static const char *const fields[] = {"batch_size",
                                       "shuffle",
                                       "shuffle_buffer",
                                       "normalize",
                                       "standardize",
                                       "augment",
                                       "drop_remainder",
                                       "cache",
                                       "prefetch",
                                       "num_parallel_calls",
                                       "take",
                                       "skip",
                                       "interleave",
                                       "one_hot",
                                       "cast",
                                       "shard",
                                       NULL};
  static const char *const casts[] = {"float32", "float16", "bfloat16", NULL};
  static const char *const caches[] = {"memory", "file", NULL};
  spec_refuse_unknown(&s, fields);
  spec_get_int(&s, "batch_size", OPTIONAL, 1, 65536, &spec->batch_size);
  spec_get_bool(&s, "shuffle", &spec->shuffle);
  long long number;
  if (spec_get_integer(&s, "shuffle_buffer", OPTIONAL, 1, 1LL << 31, &number) == 1) {
    if (!spec->shuffle)
      spec_problem(c, "pipeline.shuffle_buffer",
                   "has no effect with shuffle false; drop one of them");
    else
      spec->shuffle_buffer = number;
  }
  spec_get_bool(&s, "normalize", &spec->normalize);
  json_t *standardize = spec_member(&s, "standardize", OPTIONAL);
  if (standardize) parse_standardize(c, standardize, spec);
  json_t *augment = spec_get_array(&s, "augment", OPTIONAL);
  if (augment) parse_augment(c, augment, spec);
  spec_get_bool(&s, "drop_remainder", &spec->drop_remainder);
  int cache = spec_get_choice(&s, "cache", OPTIONAL, "unknown cache", caches);
  if (cache >= 0) {
    spec->cache_file = cache == 1;
    spec->cache_given = 1;
  }
  get_auto_int(&s, "prefetch", 1, 1024, &spec->prefetch);
  get_auto_int(&s, "num_parallel_calls", 0, 64, &spec->num_parallel_calls);
  if (spec_get_integer(&s, "take", OPTIONAL, 1, INT64_MAX, &number) == 1) spec->take = number;
  if (spec_get_integer(&s, "skip", OPTIONAL, 0, INT64_MAX, &number) == 1) spec->skip = number;
  json_t *interleave = spec_get_object(&s, "interleave", OPTIONAL);
  if (interleave) {
    scope is = {c, interleave, "pipeline.interleave"};
    static const char *const ifields[] = {"cycle_length", "block_length", NULL};
    spec_refuse_unknown(&is, ifields);
    int cycle = 0, block = 1;
    int ok = spec_get_int(&is, "cycle_length", REQUIRED, 1, 1024, &cycle) == 1;
    ok &= spec_get_int(&is, "block_length", OPTIONAL, 1, 65536, &block) >= 0;
    if (ok) {
      spec->interleave_cycle_length = cycle;
      spec->interleave_block_length = block;
    }
  }
  spec_get_bool(&s, "one_hot", &spec->one_hot);
  int cast = spec_get_choice(&s, "cast", OPTIONAL, "unsupported cast", casts);
  if (cast >= 0) spec->cast = (api_cast)cast;
  json_t *shard = spec_get_object(&s, "shard", OPTIONAL);
  if (shard) {
    scope ss = {c, shard, "pipeline.shard"};
    static const char *const sfields[] = {"num_shards", "index", NULL};
    spec_refuse_unknown(&ss, sfields);
    int shards = 1, index = 0;
    int ok = spec_get_int(&ss, "num_shards", REQUIRED, 1, 65536, &shards) == 1;
    ok &= spec_get_int(&ss, "index", REQUIRED, 0, 65535, &index) == 1;
    if (ok && index >= shards) {
      spec_problem(c, "pipeline.shard.index", "must be below num_shards %d, got %d", shards, index);
    } else if (ok) {
      spec->num_shards = shards;
      spec->shard_index = index;
    }
  }
}
