/* shards.c — kiln-train's shard data sets: where a set's shard files are (a
 * folder under the datasets directory's shards/, an upload's files/, a
 * folder an admin registered), listing them, and the check kilnd runs on
 * an upload or a registration before the data set exists: every record
 * read, the first ones parsed, the features listed, the labels counted. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "worker.h"

#define FIRST_RECORDS 8  /* parsed in each file */
#define MAX_LISTED    32 /* features listed back */

static int cmp_path(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

void worker_free_shards(char **files, int n) {
  for (int i = 0; files && i < n; i++) free(files[i]);
  free(files);
}

int worker_list_shards(const char *dir, char ***out, char *err, size_t errlen) {
  *out = NULL;
  DIR *d = opendir(dir);
  if (!d) {
    if (errno == ENOENT) return 0;
    snprintf(err, errlen, "cannot list %s: %s", dir, strerror(errno));
    return -1;
  }
  char **names = NULL;
  int n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    char path[PATH_MAX];
    struct stat st;
    int len = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (e->d_name[0] == '.' || len < 0 || (size_t)len >= sizeof path || stat(path, &st) != 0 ||
        !S_ISREG(st.st_mode))
      continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 64;
      char **grown = realloc(names, (size_t)cap * sizeof *names);
      if (!grown) break;
      names = grown;
    }
    if (!(names[n] = strdup(path))) break;
    n++;
  }
  const int complete = e == NULL;
  closedir(d);
  if (!complete) {
    worker_free_shards(names, n);
    snprintf(err, errlen, "%s: out of memory listing shards", dir);
    return -1;
  }
  qsort(names, (size_t)n, sizeof *names, cmp_path);
  *out = names;
  return n;
}

int worker_shard_root(const api_job_spec *spec, const worker_dirs *dirs, char *out, size_t outlen,
                      char *err, size_t errlen) {
  int n;
  if (!api_dataset_id_valid(spec->dataset)) {
    n = snprintf(out, outlen, "%s/shards/%s", dirs->datasets_dir, spec->dataset);
  } else {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s", dirs->uploads_dir, spec->dataset);
    api_dataset_manifest m;
    if (worker_read_manifest(dir, &m, err, errlen) != 0) return KN_EIO;
    const char *want = spec->shards_format == API_SHARDS_TAR ? "tar" : "tfrecord";
    if (strcmp(api_dataset_format_name(m.format), want) != 0) {
      snprintf(err, errlen, "data set %s holds %s data, not %s shards (dataset.format)",
               spec->dataset, api_dataset_format_name(m.format), want);
      return KN_EINVAL;
    }
    n = m.source[0] ? snprintf(out, outlen, "%s/%s", dirs->datasets_dir, m.source)
                    : snprintf(out, outlen, "%s/files", dir);
  }
  if (n < 0 || (size_t)n >= outlen) {
    snprintf(err, errlen, "the shard folder's path is too long");
    return KN_EINVAL;
  }
  return KN_OK;
}

/* ---- the check ---- */

/* 1 when the file starts with a tar header (its checksum right). */
static int is_tar(const char *path) {
  unsigned char h[512];
  FILE *f = fopen(path, "rb");
  size_t got = f ? fread(h, 1, sizeof h, f) : 0;
  if (f) fclose(f);
  if (got != sizeof h) return 0;
  unsigned sum = 0;
  for (int i = 0; i < 512; i++) sum += (i >= 148 && i < 156) ? ' ' : h[i];
  char field[9];
  memcpy(field, h + 148, 8);
  field[8] = '\0';
  char *end;
  unsigned long want = strtoul(field, &end, 8);
  return end != field && sum == want && h[0] != '\0';
}

/* An upload's shards into files/: its archive unpacked (train/ and test/
 * folders), or its one TFRecord file as the training split's shard. The
 * upload itself is then removed (its hash was taken): the shards are
 * the data set. */
static int unpack_upload(const char *dir, api_dataset_format format, char *err, size_t errlen) {
  char upload[PATH_MAX], files[PATH_MAX], train[PATH_MAX + 8], shard[PATH_MAX + 32];
  snprintf(upload, sizeof upload, "%s/upload.bin", dir);
  snprintf(files, sizeof files, "%s/files", dir);
  snprintf(train, sizeof train, "%s/train", files);
  struct stat st;
  if (stat(files, &st) == 0) return KN_OK; /* unpacked before */
  const char *name = api_dataset_format_name(format);
  if (is_tar(upload)) {
    if (mkdir(files, 0755) != 0 || worker_untar(upload, files, err, errlen) != 0) {
      if (!err[0]) snprintf(err, errlen, "cannot unpack the upload: %s", strerror(errno));
      return KN_EFORMAT;
    }
    if (stat(train, &st) != 0 || !S_ISDIR(st.st_mode)) {
      snprintf(err, errlen,
               "the archive has no train/ folder: a %s upload is a tar archive of train/ (and "
               "optionally test/) folders of shard files%s",
               name, format == API_DATASET_TFRECORD ? ", or one TFRecord file" : "");
      return KN_EFORMAT;
    }
  } else if (format == API_DATASET_TFRECORD) {
    snprintf(shard, sizeof shard, "%s/upload.tfrecord", train);
    if (mkdir(files, 0755) != 0 || mkdir(train, 0755) != 0 || rename(upload, shard) != 0) {
      snprintf(err, errlen, "cannot place the upload as a shard: %s", strerror(errno));
      return KN_EIO;
    }
    return KN_OK;
  } else {
    snprintf(err, errlen,
             "the upload is not a tar archive: a tar upload is a tar archive of train/ (and "
             "optionally test/) folders of tar shards");
    return KN_EFORMAT;
  }
  remove(upload);
  return KN_OK;
}

/* A reader of one shard file of either format. */
typedef struct shard_file {
  kn_tfrecord *tf;
  kn_tar *tar;
} shard_file;

static int shard_open(int tar, const char *path, shard_file *f, char *err, size_t errlen) {
  memset(f, 0, sizeof *f);
  return tar ? kn_tar_open(path, &f->tar, err, errlen)
             : kn_tfrecord_open(path, &f->tf, err, errlen);
}

static int shard_next(shard_file *f, const uint8_t **data, size_t *len, char *err, size_t errlen) {
  return f->tar ? kn_tar_next(f->tar, data, len, err, errlen)
                : kn_tfrecord_next(f->tf, data, len, err, errlen);
}

static void shard_close(shard_file *f) {
  kn_tfrecord_close(f->tf);
  kn_tar_close(f->tar);
}

/* The features of a record (TFRecord: the Example's, with kinds and
 * counts; tar: the sample's extensions) into list; -1 when malformed. */
static int list_features(int tar, const uint8_t *data, size_t len, json_t *list) {
  static const char *const kinds[] = {"none", "bytes", "float", "int64"};
  if (tar) {
    const uint8_t *ext, *part;
    size_t ext_len, part_len;
    int rc, i;
    for (i = 0; (rc = kn_tar_sample_part_at(data, len, i, &ext, &ext_len, &part, &part_len)) == 1;
         i++) {
      if (i >= MAX_LISTED) continue;
      json_t *o = json_object();
      json_object_set_new(o, "name", json_stringn((const char *)ext, ext_len));
      json_object_set_new(o, "kind", json_string("file"));
      json_object_set_new(o, "bytes", json_integer((json_int_t)part_len));
      json_array_append_new(list, o);
    }
    return rc;
  }
  kn_example_entry e[MAX_LISTED];
  int n = kn_example_features(data, len, e, MAX_LISTED);
  for (int i = 0; i < n && i < MAX_LISTED; i++) {
    json_t *o = json_object();
    json_object_set_new(o, "name", json_stringn((const char *)e[i].name, e[i].name_len));
    json_object_set_new(o, "kind", json_string(kinds[e[i].feature.kind]));
    json_object_set_new(o, "values", json_integer(kn_feature_count(&e[i].feature)));
    json_array_append_new(list, o);
  }
  return n < 0 ? -1 : 0;
}

static int listed(const json_t *features, const char *name) {
  size_t i;
  json_t *f;
  json_array_foreach(features, i, f) {
    if (strcmp(json_string_value(json_object_get(f, "name")), name) == 0) return 1;
  }
  return 0;
}

/* Every file of a split read through (framing and CRCs), its first
 * records parsed; the first record's features into features (when not
 * NULL); *records counted. */
static int read_split(int tar, char **files, int n, json_t *features, int64_t *records, char *err,
                      size_t errlen) {
  *records = 0;
  for (int i = 0; i < n; i++) {
    shard_file f;
    int rc = shard_open(tar, files[i], &f, err, errlen);
    const uint8_t *data;
    size_t len;
    for (int64_t r = 0; !rc && (rc = shard_next(&f, &data, &len, err, errlen)) == 1; r++) {
      rc = 0;
      (*records)++;
      if (r >= FIRST_RECORDS) continue;
      json_t *list = json_array();
      if (list_features(tar, data, len, list) != 0) {
        snprintf(err, errlen, "%s: %s %lld is not a %s", files[i], tar ? "sample" : "record",
                 (long long)r, tar ? "well-formed sample" : "tf.train.Example");
        rc = KN_EFORMAT;
      } else if (features && i == 0 && r == 0) {
        json_array_extend(features, list);
      }
      json_decref(list);
    }
    shard_close(&f);
    if (rc < 0) return rc;
  }
  return KN_OK;
}

/* The examples and classes of a split whose features are both present:
 * every label read, as a job's count pass reads them. */
static int count_labels(int tar, char **files, int n, const char *image, const char *label,
                        int64_t *examples, int *classes, char *err, size_t errlen) {
  kn_stream_config c = {.format = tar ? KN_SHARDS_TAR : KN_SHARDS_TFRECORD,
                        .files = (const char *const *)files,
                        .n_files = n,
                        .image_feature = image,
                        .label_feature = label,
                        .height = 1,
                        .width = 1,
                        .channels = 1,
                        .cycle_length = 1,
                        .block_length = 1,
                        .shard_count = 1};
  kn_stream *s;
  int rc = kn_stream_new(&c, &s, err, errlen);
  if (rc) return rc;
  *examples = kn_stream_examples(s);
  *classes = kn_stream_classes(s);
  kn_stream_free(s);
  return KN_OK;
}

int worker_check_shards(const char *dir, const api_dataset_manifest *m, const char *datasets_dir,
                        char **summary, char *err, size_t errlen) {
  *summary = NULL;
  const int tar = m->format == API_DATASET_TAR;
  char root[PATH_MAX], split[PATH_MAX + 8], hex[65] = "";
  long long bytes = 0;
  if (m->source[0]) {
    snprintf(root, sizeof root, "%s/%s", datasets_dir, m->source);
  } else {
    char upload[PATH_MAX];
    snprintf(upload, sizeof upload, "%s/upload.bin", dir);
    struct stat st;
    if (stat(upload, &st) == 0) worker_sha256_file(upload, hex, &bytes);
    int rc = unpack_upload(dir, m->format, err, errlen);
    if (rc) return rc;
    snprintf(root, sizeof root, "%s/files", dir);
  }
  /* Given names are checked; else the defaults are looked for. */
  const char *image = m->image_feature[0] ? m->image_feature : tar ? "png" : "image/encoded";
  const char *label = m->label_feature[0] ? m->label_feature : tar ? "cls" : "image/class/label";
  json_t *features = json_array();
  int64_t counts[2] = {0, 0}, records[2] = {0, 0};
  int n_files[2] = {0, 0}, classes = 0, both = 0, rc = KN_OK;
  for (int k = 0; k < 2 && !rc; k++) {
    char **files = NULL;
    snprintf(split, sizeof split, "%s/%s", root, k == 0 ? "train" : "test");
    int n = worker_list_shards(split, &files, err, errlen);
    if (n < 0) {
      rc = KN_EIO;
      break;
    }
    n_files[k] = n;
    if (n == 0 && k == 0) {
      snprintf(err, errlen, "%s holds no shard files (a data set of shards needs train/)", split);
      rc = KN_EINVAL;
    }
    if (!rc && n > 0)
      rc = read_split(tar, files, n, k == 0 ? features : NULL, &records[k], err, errlen);
    if (!rc && k == 0) {
      const char *names[2] = {image, label}, *given[2] = {m->image_feature, m->label_feature};
      const char *what[2] = {"image_feature", "label_feature"};
      for (int f = 0; f < 2 && !rc; f++) {
        if (!given[f][0] || listed(features, names[f])) continue;
        char *have = json_dumps(features, JSON_COMPACT);
        snprintf(err, errlen, "%s: %s 0 has no %s '%s' (the upload's %s); it holds %s", files[0],
                 tar ? "sample" : "record", tar ? "file extension" : "feature", names[f], what[f],
                 have ? have : "?");
        free(have);
        rc = KN_EFORMAT;
      }
      both = listed(features, image) && listed(features, label);
    }
    if (!rc && n > 0 && both)
      rc = count_labels(tar, files, n, image, label, &counts[k], k == 0 ? &classes : &(int){0}, err,
                        errlen);
    if (!rc && !both) counts[k] = records[k];
    if (!rc && m->source[0]) {
      for (int i = 0; i < n; i++) {
        struct stat st;
        if (stat(files[i], &st) == 0) bytes += (long long)st.st_size;
      }
    }
    worker_free_shards(files, n);
  }
  if (rc) {
    json_decref(features);
    return rc;
  }
  json_t *o = json_object();
  json_object_set_new(o, "format", json_string(api_dataset_format_name(m->format)));
  json_object_set_new(o, "examples", json_integer(counts[0]));
  json_object_set_new(o, "test_examples", json_integer(counts[1]));
  json_object_set_new(o, "classes", json_integer(classes));
  json_object_set_new(o, "input_shape", json_array()); /* images take the model's shape */
  json_object_set_new(o, "bytes", json_integer(bytes));
  json_object_set_new(o, "sha256", json_string(hex));
  json_object_set_new(o, "train_files", json_integer(n_files[0]));
  json_object_set_new(o, "test_files", json_integer(n_files[1]));
  json_object_set_new(o, "features", features);
  json_object_set_new(o, "image_feature", json_string(both ? image : ""));
  json_object_set_new(o, "label_feature", json_string(both ? label : ""));
  *summary = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return *summary ? KN_OK : KN_ENOMEM;
}
