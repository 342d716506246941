/* data.c — kiln-train's data: finds a spec's data set (built-in IDX files,
 * or an upload kept by kilnd: a CSV file, or a tar of IDX files or of image
 * folders), unpacks and checks uploads, splits off validation, and maps
 * the spec's pipeline onto the engine's. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "worker.h"

#define TAR_BLOCK     512
#define TAR_MAX_FILES 2000000

/* out = a/b (or a alone when b is NULL), cut to outlen. Through a function
 * so that the compiler does not second-guess each path's length. */
__attribute__((noinline)) static int join(char *out, size_t outlen, const char *a, const char *b) {
  int n = b ? snprintf(out, outlen, "%s/%s", a, b) : snprintf(out, outlen, "%s", a);
  return n >= 0 && (size_t)n < outlen ? 0 : -1; /* -1: cut short */
}

static int mkdir_p(const char *path) {
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  return (mkdir(tmp, 0755) != 0 && errno != EEXIST) ? -1 : 0;
}

static int all_zero(const unsigned char *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (b[i]) return 0;
  return 1;
}

/* A name from an archive is safe when it stays under the target: not
 * absolute, no "..", no empty path. */
static int safe_name(const char *name) {
  if (!name[0] || name[0] == '/') return 0;
  for (const char *p = name; *p;) {
    const char *slash = strchr(p, '/');
    size_t len = slash ? (size_t)(slash - p) : strlen(p);
    if (len == 2 && p[0] == '.' && p[1] == '.') return 0;
    p += len;
    while (*p == '/') p++;
  }
  return 1;
}

int worker_untar(const char *archive, const char *dest, char *err, size_t errlen) {
  FILE *f = fopen(archive, "rb");
  if (!f) {
    snprintf(err, errlen, "%s: cannot open: %s", archive, strerror(errno));
    return -1;
  }
  unsigned char h[TAR_BLOCK];
  char long_name[PATH_MAX] = "";
  long long offset = 0;
  int files = 0, rc = -1;
  char buf[65536];
  for (;;) {
    if (fread(h, 1, TAR_BLOCK, f) != TAR_BLOCK) {
      snprintf(err, errlen, "%s: not a tar archive: it ends inside the header at byte %lld",
               archive, offset);
      goto out;
    }
    if (all_zero(h, TAR_BLOCK)) break; /* the end-of-archive blocks */
    unsigned sum = 0, want = 0;
    for (int i = 0; i < TAR_BLOCK; i++) sum += (i >= 148 && i < 156) ? ' ' : h[i];
    char field[13];
    memcpy(field, h + 148, 8);
    field[8] = '\0';
    want = (unsigned)strtoul(field, NULL, 8);
    if (sum != want) {
      snprintf(err, errlen, "%s: not a tar archive: bad header checksum at byte %lld", archive,
               offset);
      goto out;
    }
    memcpy(field, h + 124, 12);
    field[12] = '\0';
    long long size = strtoll(field, NULL, 8);
    char type = (char)h[156];
    char name[PATH_MAX];
    if (long_name[0]) {
      join(name, sizeof name, long_name, NULL);
      long_name[0] = '\0';
    } else if (h[345] && memcmp(h + 257, "ustar", 5) == 0) {
      snprintf(name, sizeof name, "%.155s/%.100s", (char *)h + 345, (char *)h);
    } else {
      snprintf(name, sizeof name, "%.100s", (char *)h);
    }
    offset += TAR_BLOCK;
    long long padded = (size + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
    if (size < 0) {
      snprintf(err, errlen, "%s: entry '%s' at byte %lld has a negative size", archive, name,
               offset);
      goto out;
    }
    if (type == 'L') { /* GNU long name: the next entry's name is this data */
      if (size >= (long long)sizeof long_name ||
          fread(long_name, 1, (size_t)padded, f) != (size_t)padded) {
        snprintf(err, errlen, "%s: bad long name at byte %lld", archive, offset);
        goto out;
      }
      long_name[size] = '\0';
      offset += padded;
      continue;
    }
    size_t len = strlen(name);
    while (len > 0 && name[len - 1] == '/') name[--len] = '\0';
    if ((type == '0' || type == '\0' || type == '5') && !safe_name(name)) {
      snprintf(err, errlen, "%s: entry '%s' at byte %lld would land outside the data set", archive,
               name, offset);
      goto out;
    }
    char path[PATH_MAX * 2];
    join(path, sizeof path, dest, name);
    if (type == '5') {
      if (mkdir_p(path) != 0) {
        snprintf(err, errlen, "%s: cannot create %s: %s", archive, path, strerror(errno));
        goto out;
      }
    } else if (type == '0' || type == '\0') {
      if (++files > TAR_MAX_FILES) {
        snprintf(err, errlen, "%s: more than %d files", archive, TAR_MAX_FILES);
        goto out;
      }
      char *slash = strrchr(path, '/');
      *slash = '\0';
      int made = mkdir_p(path);
      *slash = '/';
      FILE *o = made == 0 ? fopen(path, "wb") : NULL;
      if (!o) {
        snprintf(err, errlen, "%s: cannot create %s: %s", archive, path, strerror(errno));
        goto out;
      }
      long long left = size;
      while (left > 0) {
        size_t chunk = left > (long long)sizeof buf ? sizeof buf : (size_t)left;
        if (fread(buf, 1, chunk, f) != chunk || fwrite(buf, 1, chunk, o) != chunk) {
          fclose(o);
          snprintf(err, errlen, "%s: truncated: entry '%s' ends early", archive, name);
          goto out;
        }
        left -= (long long)chunk;
      }
      fclose(o);
      if (padded > size && fseek(f, (long)(padded - size), SEEK_CUR) != 0) {
        snprintf(err, errlen, "%s: truncated after '%s'", archive, name);
        goto out;
      }
    } else if (fseek(f, (long)padded, SEEK_CUR) != 0) { /* links, pax headers: skipped */
      snprintf(err, errlen, "%s: truncated after '%s'", archive, name);
      goto out;
    }
    offset += padded;
  }
  if (files == 0) {
    snprintf(err, errlen, "%s: the archive holds no files", archive);
    goto out;
  }
  rc = 0;
out:
  fclose(f);
  return rc;
}

/* The first regular file under dir (or one level down) whose name starts
 * with one of the prefixes. */
static int find_file(const char *dir, const char *const *prefixes, char *out, size_t outlen,
                     int depth) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  struct dirent *e;
  int found = -1;
  while (found != 0 && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[PATH_MAX * 2];
    join(path, sizeof path, dir, e->d_name);
    struct stat sb;
    if (stat(path, &sb) != 0) continue;
    if (S_ISDIR(sb.st_mode) && depth > 0) {
      found = find_file(path, prefixes, out, outlen, depth - 1);
    } else if (S_ISREG(sb.st_mode)) {
      for (int i = 0; prefixes[i] && found != 0; i++) {
        if (strncmp(e->d_name, prefixes[i], strlen(prefixes[i])) == 0) {
          join(out, outlen, path, NULL);
          found = 0;
        }
      }
    }
  }
  closedir(d);
  return found;
}

/* The folder that holds the class folders: files/, or its only sub-folder
 * when the archive was made of one folder. */
static void image_root(const char *files, char *out, size_t outlen) {
  snprintf(out, outlen, "%s", files);
  DIR *d = opendir(files);
  if (!d) return;
  struct dirent *e;
  int dirs = 0, others = 0;
  char only[PATH_MAX] = "";
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[PATH_MAX * 2];
    struct stat sb;
    join(path, sizeof path, files, e->d_name);
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
      dirs++;
      join(only, sizeof only, path, NULL);
    } else {
      others++;
    }
  }
  closedir(d);
  if (dirs != 1 || others != 0) return;
  /* One folder: the root if it holds folders itself. */
  char probe[PATH_MAX];
  join(probe, sizeof probe, only, NULL);
  DIR *inner = opendir(probe);
  if (!inner) return;
  int inner_dirs = 0;
  while ((e = readdir(inner))) {
    if (e->d_name[0] == '.') continue;
    char path[PATH_MAX * 2];
    struct stat sb;
    join(path, sizeof path, probe, e->d_name);
    inner_dirs += stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
  }
  closedir(inner);
  if (inner_dirs > 0) join(out, outlen, probe, NULL);
}

int worker_read_manifest(const char *dir, api_dataset_manifest *m, char *err, size_t errlen) {
  char path[PATH_MAX], text[1024];
  snprintf(path, sizeof path, "%s/dataset.json", dir);
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "data set %s: cannot open %s: %s", dir, path, strerror(errno));
    return -1;
  }
  size_t got = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[got] = '\0';
  char why[256];
  if (api_dataset_manifest_parse(text, m, why, sizeof why) != 0) {
    snprintf(err, errlen, "%s: %s", path, why);
    return -1;
  }
  return 0;
}

/* Loads an upload's training examples; images at h x w x c. */
static int load_upload(const char *dir, const api_dataset_manifest *m, int h, int w, int c,
                       kn_dataset *train, kn_dataset *test, char *err, size_t errlen) {
  char path[PATH_MAX * 2], files[PATH_MAX * 2];
  snprintf(files, sizeof files, "%s/files", dir);
  if (m->format == API_DATASET_CSV) {
    snprintf(path, sizeof path, "%s/upload.bin", dir);
    return kn_dataset_load_csv(path, m->label_column, train, err, errlen);
  }
  struct stat sb;
  if (stat(files, &sb) != 0) {
    snprintf(path, sizeof path, "%s/upload.bin", dir);
    if (mkdir_p(files) != 0 || worker_untar(path, files, err, errlen) != 0) {
      if (!err[0]) snprintf(err, errlen, "%s: cannot unpack: %s", files, strerror(errno));
      return KN_EFORMAT;
    }
  }
  if (m->format == API_DATASET_IMAGES) {
    char root[PATH_MAX * 2];
    image_root(files, root, sizeof root);
    return kn_dataset_load_images(root, h, w, c, train, err, errlen);
  }
  static const char *const train_images[] = {"train-images", NULL},
                           *const train_labels[] = {"train-labels", NULL},
                           *const test_images[] = {"t10k-images", "test-images", NULL},
                           *const test_labels[] = {"t10k-labels", "test-labels", NULL};
  char images[PATH_MAX], labels[PATH_MAX];
  if (find_file(files, train_images, images, sizeof images, 1) != 0 ||
      find_file(files, train_labels, labels, sizeof labels, 1) != 0) {
    snprintf(err, errlen,
             "%s: an idx upload needs files named train-images... and train-labels... (IDX, "
             "gzip'd or raw)",
             dir);
    return KN_EFORMAT;
  }
  int rc = kn_dataset_load_idx(images, labels, KN_IDX_BYTES, train, err, errlen);
  if (!rc && test && find_file(files, test_images, images, sizeof images, 1) == 0 &&
      find_file(files, test_labels, labels, sizeof labels, 1) == 0)
    rc = kn_dataset_load_idx(images, labels, KN_IDX_BYTES, test, err, errlen);
  return rc;
}

void worker_sha256_file(const char *path, char hex[65], long long *bytes) {
  kc_sha256 h;
  kc_sha256_init(&h);
  FILE *f = fopen(path, "rb");
  *bytes = 0;
  char buf[65536];
  size_t got;
  while (f && (got = fread(buf, 1, sizeof buf, f)) > 0) {
    kc_sha256_update(&h, buf, got);
    *bytes += (long long)got;
  }
  if (f) fclose(f);
  uint8_t digest[32];
  kc_sha256_final(&h, digest);
  kc_sha256_hex(digest, hex);
}

int worker_check_upload(const char *dir, const char *datasets_dir, char **summary, char *err,
                        size_t errlen) {
  *summary = NULL;
  api_dataset_manifest m;
  if (worker_read_manifest(dir, &m, err, errlen) != 0) return KN_EIO;
  if (api_dataset_format_is_shards(m.format))
    return worker_check_shards(dir, &m, datasets_dir, summary, err, errlen);
  kn_dataset train = {0}, test = {0};
  /* Images are decoded at a small fixed size: the check is that each one
   * decodes; training resizes them to the model's input. */
  int rc = load_upload(dir, &m, 32, 32, 3, &train, &test, err, errlen);
  if (rc) return rc;
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/upload.bin", dir);
  char hex[65];
  long long bytes;
  worker_sha256_file(path, hex, &bytes);
  json_t *o = json_object(), *shape = json_array();
  json_object_set_new(o, "format", json_string(api_dataset_format_name(m.format)));
  json_object_set_new(o, "examples", json_integer(train.n));
  json_object_set_new(o, "test_examples", json_integer(test.n));
  json_object_set_new(o, "classes", json_integer(train.n_classes));
  if (m.format != API_DATASET_IMAGES)
    for (int d = 0; d < train.ndim; d++) json_array_append_new(shape, json_integer(train.shape[d]));
  json_object_set_new(o, "input_shape", shape);
  json_object_set_new(o, "bytes", json_integer(bytes));
  json_object_set_new(o, "sha256", json_string(hex));
  *summary = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  kn_dataset_free(&train);
  kn_dataset_free(&test);
  return *summary ? KN_OK : KN_ENOMEM;
}

static int exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

/* Images load class folder by class folder (runs of one label): those
 * runs are the parts interleave reads from. */
static int interleave_folders(const api_job_spec *spec, kn_dataset *train, char *err,
                              size_t errlen) {
  int64_t *starts = malloc((size_t)(train->n + 1) * sizeof *starts);
  if (!starts) {
    snprintf(err, errlen, "interleave: out of memory");
    return KN_ENOMEM;
  }
  int parts = 0;
  for (int64_t i = 0; i < train->n; i++)
    if (i == 0 || train->y[i] != train->y[i - 1]) starts[parts++] = i;
  starts[parts] = train->n;
  kn_dataset mixed;
  int rc = kn_dataset_interleave(train, parts, starts, spec->interleave_cycle_length,
                                 spec->interleave_block_length, &mixed, err, errlen);
  free(starts);
  if (rc) return rc;
  kn_dataset_free(train);
  *train = mixed;
  return KN_OK;
}

/* The most memory this process may use: its RLIMIT_AS, or its cgroup's
 * memory.max (v2), whichever is lower; 0 = no limit known. */
static int64_t memory_limit(void) {
  int64_t limit = 0;
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) limit = (int64_t)rl.rlim_cur;
  char line[PATH_MAX], path[PATH_MAX + 64];
  FILE *f = fopen("/proc/self/cgroup", "r");
  while (f && fgets(line, sizeof line, f)) {
    if (strncmp(line, "0::", 3) != 0) continue;
    line[strcspn(line, "\n")] = '\0';
    snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", line + 3);
    FILE *m = fopen(path, "r");
    long long v;
    if (m && fscanf(m, "%lld", &v) == 1 && v > 0 && (limit == 0 || v < limit)) limit = v;
    if (m) fclose(m);
  }
  if (f) fclose(f);
  return limit;
}

/* One split of a shard folder streamed: dir's files as a data set. A
 * multi_worker process reads its own share (of the job's share, with
 * pipeline.shard), the training split's cut to the same number of
 * examples on every process by the caller. */
static int open_shards(const api_job_spec *spec, const worker_dirs *dirs, const char *dir,
                       int train_split, kn_dataset *out, char *err, size_t errlen) {
  char **files;
  int n = worker_list_shards(dir, &files, err, errlen);
  if (n < 0) return KN_EIO;
  if (n == 0) {
    snprintf(err, errlen, "%s holds no shard files", dir);
    return KN_EINVAL;
  }
  const int world = dirs->world > 1 ? dirs->world : 1;
  const int job_shards = train_split && spec->num_shards > 1 ? spec->num_shards : 1;
  char cache_path[PATH_MAX];
  /* One file per process: a multi_worker job's processes share the folder. */
  snprintf(cache_path, sizeof cache_path, "%s/stream-cache-%s-%d.bin", dirs->cache_dir,
           train_split ? "train" : "test", dirs->rank);
  kn_stream_config c = {
      .format = spec->shards_format == API_SHARDS_TAR ? KN_SHARDS_TAR : KN_SHARDS_TFRECORD,
      .files = (const char *const *)files,
      .n_files = n,
      .image_feature = spec->image_feature,
      .label_feature = spec->label_feature,
      .height = spec->input_ndim >= 2 ? spec->input_shape[0] : 1,
      .width = spec->input_ndim >= 2 ? spec->input_shape[1] : spec->input_shape[0],
      .channels = spec->input_ndim == 3 ? spec->input_shape[2] : 1,
      .cycle_length = spec->interleave_cycle_length > 0 ? spec->interleave_cycle_length : 1,
      .block_length = spec->interleave_block_length > 0 ? spec->interleave_block_length : 1,
      /* A whole-set shuffle is not at hand: "shuffle_buffer" or 10000 records. */
      .shuffle_buffer = !train_split || !spec->shuffle ? 0
                        : spec->shuffle_buffer > 0     ? spec->shuffle_buffer
                                                       : 10000,
      .seed = spec->seed ^ 0x5eedda7aULL,
      /* worker r of w inside job shard i of n: stream shard i x w + r of n x w */
      .shard_index = (train_split ? spec->shard_index : 0) * world + dirs->rank,
      .shard_count = job_shards * world,
      .cache = !spec->cache_given ? KN_STREAM_CACHE_NONE
               : spec->cache_file ? KN_STREAM_CACHE_FILE
                                  : KN_STREAM_CACHE_MEMORY,
      .cache_path = cache_path,
      .memory_limit = memory_limit(),
  };
  if (c.cache == KN_STREAM_CACHE_FILE && mkdir_p(dirs->cache_dir) != 0) {
    snprintf(err, errlen, "cannot create %s for the cache file: %s", dirs->cache_dir,
             strerror(errno));
    worker_free_shards(files, n);
    return KN_EIO;
  }
  kn_stream *s = NULL;
  int rc = kn_stream_new(&c, &s, err, errlen);
  worker_free_shards(files, n);
  if (!rc) rc = kn_dataset_stream(s, out, err, errlen);
  if (!rc) out->per_process = world > 1;
  return rc;
}

/* A shard folder under the datasets directory: shards/<name>/train, and
 * shards/<name>/test for validation "test". */
static int load_shards(const api_job_spec *spec, const worker_dirs *dirs, kn_dataset *train,
                       kn_dataset *val, char *desc, size_t desclen, char *err, size_t errlen) {
  char dir[PATH_MAX], split[PATH_MAX + 8];
  int rc = worker_shard_root(spec, dirs, dir, sizeof dir, err, errlen);
  if (rc) return rc;
  snprintf(desc, desclen, "%s shards streamed from %s",
           spec->shards_format == API_SHARDS_TAR ? "tar" : "TFRecord", dir);
  snprintf(split, sizeof split, "%s/train", dir);
  rc = open_shards(spec, dirs, split, 1, train, err, errlen);
  if (!rc && strcmp(spec->validation, "test") == 0) {
    snprintf(split, sizeof split, "%s/test", dir);
    rc = open_shards(spec, dirs, split, 0, val, err, errlen);
  }
  if (rc) {
    kn_dataset_free(train);
    kn_dataset_free(val);
  }
  return rc;
}

int worker_load_data(const api_job_spec *spec, const worker_dirs *dirs, kn_dataset *train,
                     kn_dataset *val, char *desc, size_t desclen, char *err, size_t errlen) {
  memset(train, 0, sizeof *train);
  memset(val, 0, sizeof *val);
  if (spec->shards_format) return load_shards(spec, dirs, train, val, desc, desclen, err, errlen);
  kn_dataset test = {0};
  int rc = 0;
  int h = spec->input_ndim >= 2 ? spec->input_shape[0] : 1;
  int w = spec->input_ndim >= 2 ? spec->input_shape[1] : 1;
  int c = spec->input_ndim == 3 ? spec->input_shape[2] : 1;
  char cache[PATH_MAX * 2] = "";
  const api_builtin_dataset *bd = api_builtin_dataset_find(spec->dataset);
  if (bd) {
    if (spec->cache_file)
      snprintf(cache, sizeof cache, "%s/%s-train.kds", dirs->cache_dir, bd->name);
    snprintf(desc, desclen, "%s from %s/%s", bd->name, dirs->datasets_dir, bd->dir);
  } else {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s", dirs->uploads_dir, spec->dataset);
    if (spec->cache_file) snprintf(cache, sizeof cache, "%s/cache-%dx%dx%d.kds", dir, h, w, c);
    snprintf(desc, desclen, "uploaded data set %s from %s", spec->dataset, dir);
  }
  api_dataset_manifest m = {.format = API_DATASET_IDX};
  if (!bd) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s", dirs->uploads_dir, spec->dataset);
    if (worker_read_manifest(dir, &m, err, errlen) != 0) return KN_EIO;
    if (api_dataset_format_is_shards(m.format)) {
      snprintf(err, errlen,
               "data set %s holds %s shards, which are streamed: the spec names them with "
               "dataset.format \"%s\"",
               spec->dataset, api_dataset_format_name(m.format), api_dataset_format_name(m.format));
      return KN_EINVAL;
    }
  }
  if (spec->interleave_cycle_length > 0 && (bd || m.format != API_DATASET_IMAGES)) {
    snprintf(err, errlen,
             "pipeline.interleave needs a data set made of several parts: an images upload "
             "(one part per class folder); %s is one file",
             spec->dataset);
    return KN_EINVAL;
  }
  int cached = cache[0] && exists(cache);
  if (cached) {
    rc = kn_dataset_cache_read(cache, train, err, errlen);
  } else if (bd) {
    char images[PATH_MAX * 2], labels[PATH_MAX * 2];
    snprintf(images, sizeof images, "%s/%s/%s", dirs->datasets_dir, bd->dir, bd->train_images);
    snprintf(labels, sizeof labels, "%s/%s/%s", dirs->datasets_dir, bd->dir, bd->train_labels);
    rc = kn_dataset_load_idx(images, labels, KN_IDX_BYTES, train, err, errlen);
  } else {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s", dirs->uploads_dir, spec->dataset);
    rc = load_upload(dir, &m, h, w, c, train, &test, err, errlen);
  }
  if (!rc && cache[0] && !cached) rc = kn_dataset_cache_write(train, cache, err, errlen);
  if (!rc && spec->interleave_cycle_length > 0) rc = interleave_folders(spec, train, err, errlen);
  if (rc) goto fail;

  if (strcmp(spec->validation, "test") == 0) {
    if (bd) {
      char images[PATH_MAX * 2], labels[PATH_MAX * 2];
      snprintf(images, sizeof images, "%s/%s/%s", dirs->datasets_dir, bd->dir, bd->test_images);
      snprintf(labels, sizeof labels, "%s/%s/%s", dirs->datasets_dir, bd->dir, bd->test_labels);
      rc = kn_dataset_load_idx(images, labels, KN_IDX_BYTES, val, err, errlen);
      if (rc) goto fail;
    } else if (test.n > 0) {
      *val = test;
      memset(&test, 0, sizeof test);
    } else {
      snprintf(err, errlen,
               "data set %s has no test split; use validation 'none' or a validation_split",
               spec->dataset);
      rc = KN_EINVAL;
      goto fail;
    }
  } else if (strcmp(spec->validation, "split") == 0) {
    /* The last fraction, as Keras's validation_split takes it (before shuffling). */
    int64_t n_val = (int64_t)((double)train->n * spec->validation_split + 0.5);
    if (n_val < 1 || n_val >= train->n) {
      snprintf(err, errlen, "validation_split %g of %lld examples leaves no %s",
               spec->validation_split, (long long)train->n, n_val < 1 ? "validation" : "training");
      rc = KN_EINVAL;
      goto fail;
    }
    kn_dataset whole = *train;
    rc = kn_dataset_slice(&whole, whole.n - n_val, n_val, val, err, errlen);
    if (!rc) rc = kn_dataset_slice(&whole, 0, whole.n - n_val, train, err, errlen);
    kn_dataset_free(&whole);
    if (rc) goto fail;
  }
  kn_dataset_free(&test);
  return KN_OK;
fail:
  kn_dataset_free(train);
  kn_dataset_free(val);
  kn_dataset_free(&test);
  return rc;
}

void worker_pipeline_config(const api_job_spec *spec, kn_pipeline_config *pc, float *mean,
                            float *std) {
  kn_pipeline_config_default(pc);
  pc->batch_size = spec->batch_size;
  pc->drop_remainder = spec->drop_remainder;
  pc->shuffle_buffer = !spec->shuffle             ? 0
                       : spec->shuffle_buffer > 0 ? spec->shuffle_buffer
                                                  : INT64_MAX;
  pc->normalize = spec->normalize;
  pc->standardize = spec->standardize;
  if (spec->n_standardize > 0) {
    for (int i = 0; i < spec->n_standardize; i++) {
      mean[i] = (float)spec->standardize_mean[i];
      std[i] = (float)spec->standardize_std[i];
    }
    pc->n_channels_given = spec->n_standardize;
    pc->mean = mean;
    pc->std = std;
  }
  pc->augment = (spec->augment & API_AUG_FLIP_LEFT_RIGHT ? KN_AUG_FLIP_LEFT_RIGHT : 0u) |
                (spec->augment & API_AUG_FLIP_UP_DOWN ? KN_AUG_FLIP_UP_DOWN : 0u) |
                (spec->augment & API_AUG_RANDOM_CROP ? KN_AUG_RANDOM_CROP : 0u) |
                (spec->augment & API_AUG_RANDOM_BRIGHTNESS ? KN_AUG_RANDOM_BRIGHTNESS : 0u);
  pc->crop_padding = spec->crop_padding;
  pc->brightness_delta = (float)spec->brightness_delta;
  pc->skip = spec->skip;
  pc->take = spec->take;
  pc->num_parallel_calls =
      spec->num_parallel_calls == API_AUTO ? KN_AUTO : spec->num_parallel_calls;
  pc->prefetch = spec->prefetch == API_AUTO ? KN_AUTO : spec->prefetch;
  pc->one_hot = spec->one_hot;
  pc->cast = spec->cast == API_CAST_FLOAT16    ? KN_F16
             : spec->cast == API_CAST_BFLOAT16 ? KN_BF16
                                               : KN_F32;
  pc->shard_count = spec->num_shards;
  pc->shard_index = spec->shard_index;
  if (spec->shards_format) { /* the stream shards its files and shuffles its records */
    pc->shard_count = 1;
    pc->shard_index = 0;
    pc->shuffle_buffer = 0;
  }
}
