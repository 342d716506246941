/* datasets.c — the data sets built into kiln (their names and the files
 * each split is read from, relative to the datasets directory), and the
 * ids, formats and manifest of uploaded ones. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "api.h"

static const api_builtin_dataset builtins[] = {
    {.name = "fashion-mnist",
     .dir = "fashion-mnist",
     .train_images = "train-images-idx3-ubyte.gz",
     .train_labels = "train-labels-idx1-ubyte.gz",
     .test_images = "t10k-images-idx3-ubyte.gz",
     .test_labels = "t10k-labels-idx1-ubyte.gz",
     .train_examples = 60000,
     .test_examples = 10000,
     .input_shape = {28, 28, 1},
     .input_ndim = 3,
     .n_classes = 10},
};

int api_builtin_dataset_count(void) {
  return (int)(sizeof builtins / sizeof builtins[0]);
}

const api_builtin_dataset *api_builtin_dataset_at(int i) {
  return (i >= 0 && i < api_builtin_dataset_count()) ? &builtins[i] : NULL;
}

const api_builtin_dataset *api_builtin_dataset_find(const char *name) {
  for (int i = 0; i < api_builtin_dataset_count(); i++) {
    if (strcmp(builtins[i].name, name) == 0) return &builtins[i];
  }
  return NULL;
}

/* ---- uploaded data sets ---- */

int api_dataset_id_valid(const char *id) {
  if (!id || strlen(id) != API_DATASET_ID_LEN || strncmp(id, "ds-", 3) != 0) return 0;
  for (const char *p = id + 3; *p; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return 0;
  return 1;
}

static const char *const format_names[] = {"csv", "idx", "images", "tfrecord", "tar"};

const char *api_dataset_format_name(api_dataset_format f) {
  return (int)f >= 0 && f <= API_DATASET_TAR ? format_names[f] : "unknown";
}

int api_dataset_format_is_shards(api_dataset_format f) {
  return f == API_DATASET_TFRECORD || f == API_DATASET_TAR;
}

int api_dataset_format_parse(const char *name) {
  for (int i = 0; i <= API_DATASET_TAR; i++)
    if (name && strcmp(name, format_names[i]) == 0) return i;
  return -1;
}

char *api_dataset_manifest_format(const api_dataset_manifest *m) {
  json_t *o = json_object();
  if (!o) return NULL;
  json_object_set_new(o, "id", json_string(m->id));
  json_object_set_new(o, "format", json_string(api_dataset_format_name(m->format)));
  json_object_set_new(o, "label_column", json_string(m->label_column));
  if (api_dataset_format_is_shards(m->format)) {
    json_object_set_new(o, "image_feature", json_string(m->image_feature));
    json_object_set_new(o, "label_feature", json_string(m->label_feature));
    json_object_set_new(o, "source", json_string(m->source));
  }
  char *text = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return text;
}

int api_dataset_manifest_parse(const char *text, api_dataset_manifest *m, char *err,
                               size_t errlen) {
  memset(m, 0, sizeof *m);
  json_error_t jerr;
  json_t *o = json_loads(text, 0, &jerr);
  const char *id = NULL, *format = NULL, *label = NULL;
  if (!o || json_unpack(o, "{s:s, s:s, s:s}", "id", &id, "format", &format, "label_column",
                        &label) != 0) {
    snprintf(err, errlen, "data set manifest is not {\"id\",\"format\",\"label_column\"}: %s",
             o ? "a field is missing or not a string" : jerr.text);
    json_decref(o);
    return -1;
  }
  int f = api_dataset_format_parse(format);
  if (!api_dataset_id_valid(id) || f < 0 || strlen(label) >= sizeof m->label_column) {
    snprintf(err, errlen, "data set manifest has a bad id '%.30s', format '%.30s' or label column",
             id, format);
    json_decref(o);
    return -1;
  }
  snprintf(m->id, sizeof m->id, "%s", id);
  m->format = (api_dataset_format)f;
  snprintf(m->label_column, sizeof m->label_column, "%s", label);
  /* Shards' optional fields: strings that fit, or absent. */
  struct {
    const char *key;
    char *dst;
    size_t size;
  } extra[] = {{"image_feature", m->image_feature, sizeof m->image_feature},
               {"label_feature", m->label_feature, sizeof m->label_feature},
               {"source", m->source, sizeof m->source}};
  for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
    json_t *v = json_object_get(o, extra[i].key);
    if (!v) continue;
    if (!json_is_string(v) || strlen(json_string_value(v)) >= extra[i].size) {
      snprintf(err, errlen, "data set manifest: %s must be a string under %zu bytes", extra[i].key,
               extra[i].size);
      json_decref(o);
      return -1;
    }
    snprintf(extra[i].dst, extra[i].size, "%s", json_string_value(v));
  }
  json_decref(o);
  return 0;
}
