/* alloc_dataset.c — GET (and HEAD) /v1/allocations/{alloc}/dataset: the
 * data set of the allocation's job as a tar stream an agent unpacks into
 * the folder it passes kiln-train (--data-dir for a built-in data set or a
 * registered folder of shards, --uploads-dir for an upload), with its
 * content hash in X-Kiln-Content-Sha256 so the agent caches by it. The
 * archive is deterministic (sorted names, owner 0, time 0), and that hash
 * is the SHA-256 of the stream itself: the same files give the same hash,
 * and an agent checks what it received against it. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "routes.h"

#define TAR_BLOCK   512
#define MAX_ENTRIES 4096

typedef struct tar_entry {
  char name[256]; /* in the archive; a folder's ends in '/' */
  char path[4352];
  int64_t size; /* 0 for a folder */
} tar_entry;

typedef struct tar_stream {
  tar_entry *entries;
  int n, cap;
  int at;          /* the entry being sent */
  uint64_t offset; /* bytes of it sent: its header, then its data and padding */
  int fd;          /* the entry's file while its data goes out */
  int trailer;     /* bytes of the two zero blocks sent */
} tar_stream;

static void tar_free(void *ctx) {
  tar_stream *t = ctx;
  if (!t) return;
  if (t->fd >= 0) close(t->fd);
  free(t->entries);
  free(t);
}

static int cmp_entry(const void *a, const void *b) {
  return strcmp(((const tar_entry *)a)->name, ((const tar_entry *)b)->name);
}

/* Adds dir (named name/ in the archive) and everything under it. */
static int add_tree(tar_stream *t, const char *dir, const char *name) {
  if (t->n == t->cap) {
    int cap = t->cap ? t->cap * 2 : 64;
    if (cap > MAX_ENTRIES) return -1;
    tar_entry *grown = realloc(t->entries, (size_t)cap * sizeof *grown);
    if (!grown) return -1;
    t->entries = grown;
    t->cap = cap;
  }
  tar_entry *e = &t->entries[t->n++];
  memset(e, 0, sizeof *e);
  if (snprintf(e->name, sizeof e->name, "%s/", name) >= (int)sizeof e->name) return -1;
  snprintf(e->path, sizeof e->path, "%s", dir);
  DIR *d = opendir(dir);
  if (!d) return -1;
  struct dirent *de;
  int rc = 0;
  while (rc == 0 && (de = readdir(d))) {
    if (de->d_name[0] == '.') continue; /* ., .., and partial files */
    char path[4352], child[512];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    if (snprintf(child, sizeof child, "%s/%s", name, de->d_name) >= 256) {
      rc = -1;
      break;
    }
    struct stat sb;
    if (stat(path, &sb) != 0) continue;
    if (S_ISDIR(sb.st_mode)) {
      rc = add_tree(t, path, child);
      continue;
    }
    if (!S_ISREG(sb.st_mode)) continue;
    if (t->n == t->cap) {
      int cap = t->cap * 2;
      tar_entry *grown =
          cap <= MAX_ENTRIES ? realloc(t->entries, (size_t)cap * sizeof *grown) : NULL;
      if (!grown) {
        rc = -1;
        break;
      }
      t->entries = grown;
      t->cap = cap;
    }
    tar_entry *f = &t->entries[t->n++];
    memset(f, 0, sizeof *f);
    memcpy(f->name, child, strlen(child) + 1); /* under 256: checked above */
    snprintf(f->path, sizeof f->path, "%s", path);
    f->size = sb.st_size;
  }
  closedir(d);
  return rc;
}

/* A ustar header: the name split into prefix and name where it is long. */
static void tar_header(const tar_entry *e, unsigned char h[TAR_BLOCK]) {
  memset(h, 0, TAR_BLOCK);
  size_t len = strlen(e->name);
  const char *name = e->name;
  if (len > 99) { /* split at a '/' so the name part fits in 100 */
    const char *cut = e->name + len - 100;
    cut = strchr(cut, '/');
    if (cut && cut - e->name <= 155) {
      memcpy(h + 345, e->name, (size_t)(cut - e->name));
      name = cut + 1;
    }
  }
  size_t name_len = strlen(name);
  memcpy(h, name, name_len < 100 ? name_len : 100); /* ustar: 100 bytes, NUL only if shorter */
  const int dir = len > 0 && e->name[len - 1] == '/';
  snprintf((char *)h + 100, 8, "%07o", dir ? 0755 : 0644);
  snprintf((char *)h + 108, 8, "%07o", 0);
  snprintf((char *)h + 116, 8, "%07o", 0);
  snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)e->size);
  snprintf((char *)h + 136, 12, "%011o", 0);
  h[156] = dir ? '5' : '0';
  memcpy(h + 257, "ustar", 6);
  memcpy(h + 263, "00", 2);
  memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < TAR_BLOCK; i++) sum += h[i];
  snprintf((char *)h + 148, 8, "%06o", sum);
}

static uint64_t entry_bytes(const tar_entry *e) {
  return TAR_BLOCK + ((uint64_t)e->size + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
}

/* The next bytes of the archive into buf; < 0 at its end (or on a read
 * error: the archive is cut, and its hash will not match). */
static long tar_read(void *ctx, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  tar_stream *t = ctx;
  size_t out = 0;
  while (out < max) {
    if (t->at == t->n) {
      if (t->trailer == 2 * TAR_BLOCK) break;
      size_t n = (size_t)(2 * TAR_BLOCK - t->trailer);
      if (n > max - out) n = max - out;
      memset(buf + out, 0, n);
      out += n;
      t->trailer += (int)n;
      continue;
    }
    const tar_entry *e = &t->entries[t->at];
    if (t->offset < TAR_BLOCK) {
      unsigned char h[TAR_BLOCK];
      tar_header(e, h);
      size_t n = TAR_BLOCK - (size_t)t->offset;
      if (n > max - out) n = max - out;
      memcpy(buf + out, h + t->offset, n);
      out += n;
      t->offset += n;
      continue;
    }
    uint64_t data_at = t->offset - TAR_BLOCK;
    if (data_at < (uint64_t)e->size) {
      if (t->fd < 0) t->fd = open(e->path, O_RDONLY | O_CLOEXEC);
      if (t->fd < 0) return out ? (long)out : -1;
      size_t n = max - out;
      if (n > (uint64_t)e->size - data_at) n = (size_t)((uint64_t)e->size - data_at);
      ssize_t got = pread(t->fd, buf + out, n, (off_t)data_at);
      if (got <= 0) return out ? (long)out : -1;
      out += (size_t)got;
      t->offset += (uint64_t)got;
      continue;
    }
    if (t->fd >= 0) close(t->fd);
    t->fd = -1;
    size_t pad = (size_t)(entry_bytes(e) - t->offset);
    if (pad > max - out) pad = max - out;
    memset(buf + out, 0, pad);
    out += pad;
    t->offset += pad;
    if (t->offset == entry_bytes(e)) {
      t->at++;
      t->offset = 0;
    }
  }
  return out ? (long)out : -1;
}

/* The archive of the job's data set, and its hash; 0, or -1 having answered. */
static int dataset_archive(const http_config *cfg, const http_request *req, tar_stream **out,
                           char hash[65], http_response *res) {
  *out = NULL;
  hash[0] = '\0';
  store_job job;
  if (store_job_get(cfg->st, req->alloc_job, &job) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return -1;
  }
  json_t *spec = json_loads(job.spec_json ? job.spec_json : "{}", 0, NULL);
  store_job_clear(&job);
  json_t *ds = json_object_get(spec, "dataset");
  char name[128] = "";
  const char *named = json_string_value(json_object_get(ds, "name"));
  snprintf(name, sizeof name, "%s", named ? named : "");
  int shards = json_string_value(json_object_get(ds, "format")) != NULL;
  json_decref(spec);
  char dir[4352] = "", root[256] = "";
  const api_builtin_dataset *builtin = api_builtin_dataset_find(name);
  if (builtin) {
    snprintf(dir, sizeof dir, "%s/%s", cfg->datasets_dir, builtin->dir);
    snprintf(root, sizeof root, "%s", builtin->dir);
  } else if (api_dataset_id_valid(name)) {
    store_dataset d;
    if (store_dataset_get(cfg->st, name, &d) != STORE_OK) {
      http_reply_status(res, 404, "NOT_FOUND", "dataset", "data set %s is gone", name);
      return -1;
    }
    if (d.source[0]) {
      snprintf(dir, sizeof dir, "%s/%s", cfg->datasets_dir, d.source);
      snprintf(root, sizeof root, "%s", d.source);
    } else {
      snprintf(dir, sizeof dir, "%s", d.path);
      snprintf(root, sizeof root, "%s", name);
    }
  } else if (shards && name[0]) {
    snprintf(dir, sizeof dir, "%s/shards/%s", cfg->datasets_dir, name);
    snprintf(root, sizeof root, "shards/%s", name);
  }
  tar_stream *t = calloc(1, sizeof *t);
  if (!t) {
    http_reply_status(res, 500, "INTERNAL", NULL, "out of memory");
    return -1;
  }
  t->fd = -1;
  if (!dir[0] || strstr(root, "..") || add_tree(t, dir, root) != 0) {
    tar_free(t);
    http_reply_status(res, 404, "NOT_FOUND", "dataset",
                      "the job's data set '%.100s' has no folder kilnd can send", name);
    return -1;
  }
  qsort(t->entries, (size_t)t->n, sizeof *t->entries, cmp_entry);
  { /* the archive's hash: read it once through */
    kc_sha256 h;
    kc_sha256_init(&h);
    char *buf = malloc(1 << 16);
    long got;
    while (buf && (got = tar_read(t, 0, buf, 1 << 16)) > 0) kc_sha256_update(&h, buf, (size_t)got);
    free(buf);
    uint8_t digest[32];
    kc_sha256_final(&h, digest);
    kc_sha256_hex(digest, hash);
    t->at = 0;
    t->offset = 0;
    t->trailer = 0;
  }
  *out = t;
  return 0;
}

void http_get_allocation_dataset(const http_config *cfg, http_request *req, http_response *res) {
  tar_stream *t;
  char hash[65];
  if (dataset_archive(cfg, req, &t, hash, res) != 0) return;
  res->status = 200;
  res->content_type = "application/x-tar";
  res->header_names[0] = "X-Kiln-Content-Sha256";
  snprintf(res->header_values[0], sizeof res->header_values[0], "%s", hash);
  if (strcmp(req->method, "HEAD") == 0) {
    tar_free(t);
    return;
  }
  res->stream = tar_read;
  res->stream_ctx = t;
  res->stream_free = tar_free;
}
