/* datasets.c — the /v1/datasets routes: uploads streamed to disk under
 * their own size cap, checked by kiln-train (--check-dataset) before any
 * row exists, then listed, read and deleted (refused while an unfinished
 * job uses them); and the check that a job's uploaded data set exists and
 * fits its spec.
 *
 * Threads: an upload's state (http_upload) belongs to its connection and is
 * touched only by the MHD thread serving that request; the store locks
 * itself; nothing else is shared. */
/* nftw() is an X/Open function. */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <microhttpd.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "routes.h"
#include "server.h"

extern char **environ;

struct http_upload {
  char id[API_DATASET_ID_LEN + 1];
  char tmp_dir[4096];
  FILE *file;
  size_t bytes;
  int too_large;
  api_dataset_manifest manifest;
  char display_name[128];
  char tenant[64]; /* the uploader's: only that tenant sees the data set */
};

static json_t *builtin_json(const http_config *cfg, const api_builtin_dataset *d) {
  const char *files[] = {d->train_images, d->train_labels, d->test_images, d->test_labels};
  int ready = 1;
  for (int f = 0; f < 4; f++) {
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s/%s", cfg->datasets_dir, d->dir, files[f]);
    ready &= stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
  }
  json_t *o = json_object(), *shape = json_array();
  char name[96];
  snprintf(name, sizeof name, "datasets/%s", d->name);
  json_object_set_new(o, "name", json_string(name));
  json_object_set_new(o, "id", json_string(d->name));
  json_object_set_new(o, "builtin", json_true());
  json_object_set_new(o, "format", json_string("idx"));
  json_object_set_new(o, "ready", json_boolean(ready));
  json_object_set_new(o, "train_examples", json_integer(d->train_examples));
  json_object_set_new(o, "test_examples", json_integer(d->test_examples));
  json_object_set_new(o, "classes", json_integer(d->n_classes));
  for (int k = 0; k < d->input_ndim; k++)
    json_array_append_new(shape, json_integer(d->input_shape[k]));
  json_object_set_new(o, "input_shape", shape);
  return o;
}

static json_t *upload_json(const store_dataset *d) {
  json_t *o = json_object();
  char name[64];
  snprintf(name, sizeof name, "datasets/%s", d->id);
  json_object_set_new(o, "name", json_string(name));
  json_object_set_new(o, "id", json_string(d->id));
  json_object_set_new(o, "builtin", json_false());
  json_object_set_new(o, "display_name", json_string(d->display_name));
  json_object_set_new(o, "format", json_string(d->format));
  if (d->label_column[0]) json_object_set_new(o, "label_column", json_string(d->label_column));
  json_object_set_new(o, "ready", json_true());
  json_object_set_new(o, "train_examples", json_integer(d->examples));
  json_object_set_new(o, "test_examples", json_integer(d->test_examples));
  json_object_set_new(o, "classes", json_integer(d->classes));
  json_t *shape = json_loads(d->input_shape_json, 0, NULL);
  json_object_set_new(o, "input_shape", shape ? shape : json_array());
  json_object_set_new(o, "bytes", json_integer(d->bytes));
  json_object_set_new(o, "sha256", json_string(d->sha256));
  json_object_set_new(o, "create_time", http_rfc3339(d->create_ms));
  if (d->source[0]) json_object_set_new(o, "source", json_string(d->source));
  /* Shards: files per split and the first record's features, so a spec
   * can name its image and label features. */
  json_t *shards = d->shards_json[0] ? json_loads(d->shards_json, 0, NULL) : NULL;
  if (shards) json_object_set_new(o, "shards", shards);
  return o;
}

/* ---- files ---- */

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path);
}

void http_remove_tree(const char *dir) {
  if (dir[0]) nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int http_sweep_stale(const char *dir, const char *prefix, time_t before) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int removed = 0;
  struct dirent *e;
  size_t plen = strlen(prefix);
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, prefix, plen) != 0) continue;
    char path[4200];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (lstat(path, &sb) != 0 || sb.st_mtime >= before) continue;
    http_remove_tree(path);
    removed++;
  }
  closedir(d);
  return removed;
}

int http_new_dataset_id(char out[API_DATASET_ID_LEN + 1]) {
  unsigned char raw[8];
  FILE *f = fopen("/dev/urandom", "rb");
  if (!f) return -1;
  size_t got = fread(raw, 1, sizeof raw, f);
  fclose(f);
  if (got != sizeof raw) return -1;
  int n = snprintf(out, API_DATASET_ID_LEN + 1, "ds-");
  for (size_t i = 0; i < sizeof raw; i++)
    n += snprintf(out + n, (size_t)(API_DATASET_ID_LEN + 1 - n), "%02x", raw[i]);
  return 0;
}

/* ---- uploads ---- */

int http_upload_begin(const http_config *cfg, const http_principal *who, void *connection,
                      http_upload **out, http_response *res) {
  *out = NULL;
  struct MHD_Connection *c = connection;
  const char *format = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "format");
  const char *label = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "label_column");
  const char *display = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "display_name");
  const char *length = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
  const char *features[2] = {
      MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "image_feature"),
      MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "label_feature")};
  int f = api_dataset_format_parse(format);
  if (f < 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "format",
                      "format must be csv, idx (a tar of IDX files), images (a tar of class "
                      "folders), tfrecord or tar (shards), got '%.40s'",
                      format ? format : "");
    return -1;
  }
  for (int k = 0; k < 2; k++) {
    const char *field = k == 0 ? "image_feature" : "label_feature";
    if (features[k] && !api_dataset_format_is_shards((api_dataset_format)f)) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", field,
                        "%s names a feature of tfrecord or tar shards; a %s upload has none", field,
                        format);
      return -1;
    }
    if (features[k] && (!features[k][0] || strlen(features[k]) >= 128)) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", field, "%s must be 1-127 bytes", field);
      return -1;
    }
  }
  if (f == API_DATASET_CSV && (!label || !*label || strlen(label) >= 64)) {
    http_reply_status(
        res, 400, "INVALID_ARGUMENT", "label_column",
        "a csv upload needs label_column, the header name of the class column (1-63 bytes)");
    return -1;
  }
  if (display && strlen(display) >= 128) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "display_name",
                      "display_name must be under 128 bytes");
    return -1;
  }
  if (length && strtoull(length, NULL, 10) > cfg->max_upload_bytes) {
    /* Answer now: the body is never read. */
    http_reply_status(res, 413, "RESOURCE_EXHAUSTED", "body",
                      "the upload of %s bytes is larger than the %zu-byte limit for data sets",
                      length, cfg->max_upload_bytes);
    return -1;
  }
  /* Over the tenant's storage quota: answered before the body is read. */
  if (length && http_check_storage_quota(cfg, who, (int64_t)strtoull(length, NULL, 10), res) != 0)
    return -1;
  http_upload *u = calloc(1, sizeof *u);
  if (!u || http_new_dataset_id(u->id) != 0) {
    free(u);
    http_reply_status(res, 500, "INTERNAL", NULL,
                      "cannot start an upload: out of memory or no randomness");
    return -1;
  }
  snprintf(u->manifest.id, sizeof u->manifest.id, "%s", u->id);
  snprintf(u->tenant, sizeof u->tenant, "%s", who->tenant);
  u->manifest.format = (api_dataset_format)f;
  if (f == API_DATASET_CSV) snprintf(u->manifest.label_column, 64, "%s", label);
  if (features[0])
    snprintf(u->manifest.image_feature, sizeof u->manifest.image_feature, "%s", features[0]);
  if (features[1])
    snprintf(u->manifest.label_feature, sizeof u->manifest.label_feature, "%s", features[1]);
  snprintf(u->display_name, sizeof u->display_name, "%s", display ? display : "");
  char path[4200];
  snprintf(u->tmp_dir, sizeof u->tmp_dir, "%s/.upload-%s", cfg->uploads_dir, u->id);
  snprintf(path, sizeof path, "%s/upload.bin", u->tmp_dir);
  if ((mkdir(cfg->uploads_dir, 0700) != 0 && errno != EEXIST) || mkdir(u->tmp_dir, 0700) != 0 ||
      !(u->file = fopen(path, "wb"))) {
    http_reply_status(res, 500, "INTERNAL", NULL, "cannot store the upload on the server: %s",
                      strerror(errno));
    http_remove_tree(u->tmp_dir);
    free(u);
    return -1;
  }
  *out = u;
  return 0;
}

int http_upload_write(const http_config *cfg, http_upload *u, const char *data, size_t len) {
  if (u->too_large) return -1;
  if (u->bytes + len > cfg->max_upload_bytes) {
    u->too_large = 1;
    if (u->file) fclose(u->file);
    u->file = NULL;
    http_remove_tree(u->tmp_dir);
    return -1;
  }
  if (u->file && fwrite(data, 1, len, u->file) != len) {
    fclose(u->file);
    u->file = NULL; /* reported at the end */
  }
  u->bytes += len;
  return 0;
}

/* Runs kiln-train --check-dataset on the upload's folder; its stdout is
 * one JSON line: the summary, or a progress error line. */
static int run_check(const http_config *cfg, const char *dir, char *out, size_t outlen) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  char *argv[] = {(char *)cfg->trainer_path,
                  "--check-dataset",
                  (char *)dir,
                  "--data-dir",
                  (char *)cfg->datasets_dir,
                  NULL};
  pid_t pid;
  int rc = posix_spawn(&pid, cfg->trainer_path, &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  size_t used = 0;
  if (rc == 0) {
    ssize_t got;
    while ((got = read(fds[0], out + used, outlen - 1 - used)) > 0 && used + 1 < outlen)
      used += (size_t)got;
  }
  out[used] = '\0';
  close(fds[0]);
  if (rc != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static void finish_upload(const http_config *cfg, http_upload *u, http_response *res);

void http_upload_finish(const http_config *cfg, http_upload *u, http_response *res) {
  finish_upload(cfg, u, res);
  /* A refused upload's folder goes before the answer does: a client that
   * reads the answer never finds it (http_upload_free, which runs after
   * the answer is sent, would leave it there a moment longer). */
  if (res->status != 200) {
    if (u->file) fclose(u->file);
    u->file = NULL;
    http_remove_tree(u->tmp_dir);
    u->tmp_dir[0] = '\0';
  }
}

static void finish_upload(const http_config *cfg, http_upload *u, http_response *res) {
  if (u->too_large) {
    http_reply_status(res, 413, "RESOURCE_EXHAUSTED", "body",
                      "the upload is larger than the %zu-byte limit for data sets",
                      cfg->max_upload_bytes);
    return;
  }
  int write_ok = u->file != NULL;
  if (u->file && fclose(u->file) != 0) write_ok = 0;
  u->file = NULL;
  if (!write_ok) {
    http_reply_status(res, 500, "INTERNAL", NULL, "cannot write the upload to disk: %s",
                      strerror(errno));
    return;
  }
  if (u->bytes == 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "body", "the upload is empty");
    return;
  }
  /* A chunked upload's size is known only now. */
  http_principal owner = {.admin = 0};
  snprintf(owner.tenant, sizeof owner.tenant, "%s", u->tenant);
  if (http_check_storage_quota(cfg, &owner, (int64_t)u->bytes, res) != 0) return;
  http_dataset_admit(cfg, u->tmp_dir, &u->manifest, u->display_name, u->tenant, (int64_t)u->bytes,
                     res);
  if (res->status == 200) u->tmp_dir[0] = '\0'; /* moved: nothing to clean up */
}

/* What of message is a path inside kilnd's folders cut to the part the
 * caller knows: a file in the upload, or under the datasets directory. */
static void cut_paths(const char *message, const char *const *prefixes, int n, char *out,
                      size_t outlen) {
  size_t used = 0;
  for (const char *p = message; *p && used + 1 < outlen;) {
    int cut = 0;
    for (int i = 0; i < n && !cut; i++) {
      const size_t len = strlen(prefixes[i]);
      if (len && strncmp(p, prefixes[i], len) == 0) {
        p += len;
        cut = 1;
      }
    }
    if (!cut) out[used++] = *p++;
  }
  out[used] = '\0';
}

void http_dataset_admit(const http_config *cfg, const char *tmp_dir, const api_dataset_manifest *m,
                        const char *display_name, const char *tenant, int64_t upload_bytes,
                        http_response *res) {
  char path[4200];
  snprintf(path, sizeof path, "%s/dataset.json", tmp_dir);
  char *manifest = api_dataset_manifest_format(m);
  FILE *f = manifest ? fopen(path, "wb") : NULL;
  int ok = f && fputs(manifest, f) >= 0;
  if (f) ok &= fclose(f) == 0;
  free(manifest);
  if (!ok) {
    http_reply_status(res, 500, "INTERNAL", NULL, "cannot write the data set's manifest: %s",
                      strerror(errno));
    return;
  }
  char line[8192];
  int status = run_check(cfg, tmp_dir, line, sizeof line);
  json_t *summary = status == 0 ? json_loads(line, 0, NULL) : NULL;
  if (!summary) {
    api_progress p;
    char why[256];
    char *nl = strchr(line, '\n');
    if (nl) *nl = '\0';
    if (status > 0 && api_progress_parse(line, &p, why, sizeof why) == 0 &&
        p.kind == API_PROGRESS_ERROR) {
      /* The data's own fault, named as kiln-train did, with the paths
       * inside kilnd's folders cut down to the file in the upload (or
       * under the datasets directory). */
      char msg[600], files[4200], upload[4200], datasets[4200];
      snprintf(files, sizeof files, "%s/files/", tmp_dir);
      snprintf(upload, sizeof upload, "%s/", tmp_dir);
      snprintf(datasets, sizeof datasets, "%s/", cfg->datasets_dir);
      const char *prefixes[] = {files, upload, datasets};
      cut_paths(p.message, prefixes, 3, msg, sizeof msg);
      http_reply_status(res, 400, "INVALID_ARGUMENT", m->source[0] ? "path" : "body",
                        "the %s data set was refused: %s", api_dataset_format_name(m->format), msg);
    } else {
      http_reply_status(res, 500, "INTERNAL", NULL,
                        "checking the data set failed (kiln-train status %d)", status);
    }
    return;
  }
  store_dataset d;
  memset(&d, 0, sizeof d);
  snprintf(d.id, sizeof d.id, "%s", m->id);
  snprintf(d.display_name, sizeof d.display_name, "%s", display_name);
  snprintf(d.format, sizeof d.format, "%s", api_dataset_format_name(m->format));
  snprintf(d.label_column, sizeof d.label_column, "%s", m->label_column);
  snprintf(d.path, sizeof d.path, "%s/%s", cfg->uploads_dir, m->id);
  snprintf(d.source, sizeof d.source, "%s", m->source);
  /* An upload's size; a registered folder's shards' total. */
  d.bytes = m->source[0] ? json_integer_value(json_object_get(summary, "bytes")) : upload_bytes;
  snprintf(d.sha256, sizeof d.sha256, "%s",
           json_string_value(json_object_get(summary, "sha256"))
               ? json_string_value(json_object_get(summary, "sha256"))
               : "");
  d.examples = json_integer_value(json_object_get(summary, "examples"));
  d.test_examples = json_integer_value(json_object_get(summary, "test_examples"));
  d.classes = (int)json_integer_value(json_object_get(summary, "classes"));
  char *shape = json_dumps(json_object_get(summary, "input_shape"), JSON_COMPACT);
  snprintf(d.input_shape_json, sizeof d.input_shape_json, "%s", shape ? shape : "[]");
  free(shape);
  if (api_dataset_format_is_shards(m->format)) {
    json_t *shards = json_object();
    static const char *const keys[] = {"train_files", "test_files", "image_feature",
                                       "label_feature", "features"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
      json_t *v = json_object_get(summary, keys[i]);
      if (v) json_object_set(shards, keys[i], v);
    }
    char *text = json_dumps(shards, JSON_COMPACT);
    /* Features are listed while they fit; the files and names always do. */
    while (text && strlen(text) >= sizeof d.shards_json &&
           json_array_size(json_object_get(shards, "features")) > 0) {
      json_t *list = json_object_get(shards, "features");
      json_array_remove(list, json_array_size(list) - 1);
      free(text);
      text = json_dumps(shards, JSON_COMPACT);
    }
    snprintf(d.shards_json, sizeof d.shards_json, "%s", text ? text : "");
    free(text);
    json_decref(shards);
  }
  json_decref(summary);
  d.create_ms = store_now_ms();
  snprintf(d.tenant, sizeof d.tenant, "%s", tenant);
  if (rename(tmp_dir, d.path) != 0) {
    http_reply_status(res, 500, "INTERNAL", NULL, "cannot move the data set into place: %s",
                      strerror(errno));
    return;
  }
  if (store_dataset_add(cfg->st, &d) != STORE_OK) {
    http_reply_status(res, 500, "INTERNAL", NULL, "storage failure: %s", store_errmsg(cfg->st));
    http_remove_tree(d.path);
    return;
  }
  http_reply_json(res, 200, upload_json(&d));
}

void http_upload_free(http_upload *u) {
  if (!u) return;
  if (u->file) fclose(u->file);
  http_remove_tree(u->tmp_dir);
  free(u);
}

/* ---- routes ---- */

void http_list_datasets(const http_config *cfg, http_request *req, http_response *res) {
  const char *size_arg = http_query(req, "page_size");
  const char *token = http_query(req, "page_token");
  int page_size;
  if (http_parse_page_size(size_arg, &page_size) != 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "page_size",
                      "page_size must be a non-negative integer, got '%.40s'", size_arg);
    return;
  }
  char query[128];
  snprintf(query, sizeof query, "datasets\n%s", req->who.tenant);
  int64_t before = 0;
  if (token && *token && api_page_token_decode(token, query, &before) != 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "page_token",
                      "page_token is not one this server issued");
    return;
  }
  json_t *arr = json_array();
  /* Built-ins lead the first page; uploads follow, newest first. */
  if (!before)
    for (int i = 0; i < api_builtin_dataset_count(); i++)
      json_array_append_new(arr, builtin_json(cfg, api_builtin_dataset_at(i)));
  store_dataset *list = NULL;
  int n = 0;
  /* Uploads are their tenant's: an admin sees every tenant's. */
  if (store_dataset_list_tenant(cfg->st, req->who.admin ? NULL : req->who.tenant, before,
                                page_size + 1, &list, &n) != STORE_OK) {
    json_decref(arr);
    http_reply_status(res, 500, "INTERNAL", NULL, "storage failure: %s", store_errmsg(cfg->st));
    return;
  }
  for (int i = 0; i < n && i < page_size; i++) json_array_append_new(arr, upload_json(&list[i]));
  char next[API_PAGE_TOKEN_LEN] = "";
  if (n > page_size) api_page_token_encode(list[page_size - 1].seq, query, next);
  free(list);
  json_t *doc = json_object();
  json_object_set_new(doc, "datasets", arr);
  json_object_set_new(doc, "next_page_token", json_string(next));
  http_reply_json(res, 200, doc);
}

static int visible(const http_principal *who, const store_dataset *d) {
  return who->admin || strcmp(who->tenant, d->tenant) == 0;
}

static void one_dataset(const http_config *cfg, const http_request *req, http_response *res,
                        const char *id) {
  const int get = strcmp(req->method, "GET") == 0, del = strcmp(req->method, "DELETE") == 0;
  if (!get && !del) {
    http_reply_status(res, 405, "UNIMPLEMENTED", NULL, "%s is not supported on %s", req->method,
                      req->path);
    return;
  }
  const api_builtin_dataset *b = api_builtin_dataset_find(id);
  if (b && get) {
    http_reply_json(res, 200, builtin_json(cfg, b));
    return;
  }
  if (b) {
    http_reply_status(res, 409, "FAILED_PRECONDITION", "dataset",
                      "data set '%s' is built in and cannot be deleted", id);
    return;
  }
  if (!api_dataset_id_valid(id)) {
    http_reply_status(res, 404, "NOT_FOUND", "dataset", "data set '%.60s' does not exist", id);
    return;
  }
  store_dataset d;
  int rc = store_dataset_get(cfg->st, id, &d);
  /* Another tenant's upload is as absent as a missing one. */
  if (rc == STORE_NOT_FOUND || (rc == STORE_OK && !visible(&req->who, &d))) {
    http_reply_status(res, 404, "NOT_FOUND", "dataset", "data set '%s' does not exist", id);
    return;
  }
  if (rc != STORE_OK) {
    http_reply_status(res, 500, "INTERNAL", NULL, "storage failure: %s", store_errmsg(cfg->st));
    return;
  }
  if (get) {
    http_reply_json(res, 200, upload_json(&d));
    return;
  }
  char job[40] = "";
  rc = store_dataset_delete(cfg->st, id, job);
  if (rc == STORE_CONFLICT) {
    http_reply_status(
        res, 409, "FAILED_PRECONDITION", "dataset",
        "data set '%s' is in use by job %s, which has not finished; cancel it or wait", id, job);
  } else if (rc == STORE_NOT_FOUND) {
    http_reply_status(res, 404, "NOT_FOUND", "dataset", "data set '%s' does not exist", id);
  } else if (rc != STORE_OK) {
    http_reply_status(res, 500, "INTERNAL", NULL, "storage failure: %s", store_errmsg(cfg->st));
  } else {
    http_remove_tree(d.path); /* the row is gone first: a half-removed folder is never in use */
    http_reply_json(res, 200, json_object());
  }
}

void http_get_dataset(const http_config *cfg, http_request *req, http_response *res) {
  one_dataset(cfg, req, res, req->params[0]);
}

void http_delete_dataset(const http_config *cfg, http_request *req, http_response *res) {
  one_dataset(cfg, req, res, req->params[0]);
}

/* The router's entry for POST /v1/datasets, which documents the route in
 * openapi.json. Once the router has found it (and checked the token),
 * http.c streams the upload to disk instead of calling it, so a request
 * reaches this handler only if that interception is bypassed. */
void http_create_dataset(const http_config *cfg, http_request *req, http_response *res) {
  (void)cfg;
  (void)req;
  http_reply_status(res, 500, "INTERNAL", NULL,
                    "data set uploads are streamed by the HTTP layer; this request was routed "
                    "without its upload");
}

int http_datasets_check_spec(const http_config *cfg, const http_principal *who,
                             const api_job_spec *spec, http_response *res) {
  const int uploaded = api_dataset_id_valid(spec->dataset);
  store_dataset d;
  int rc = uploaded ? store_dataset_get(cfg->st, spec->dataset, &d) : STORE_OK;
  if (rc == STORE_OK && uploaded && !visible(who, &d)) rc = STORE_NOT_FOUND;
  if (uploaded && rc == STORE_OK) {
    /* Shards are streamed: the spec names their format; other data has none. */
    const int shards = api_dataset_format_is_shards(api_dataset_format_parse(d.format));
    const char *named = spec->shards_format == API_SHARDS_TAR        ? "tar"
                        : spec->shards_format == API_SHARDS_TFRECORD ? "tfrecord"
                                                                     : NULL;
    if (shards && (!named || strcmp(named, d.format) != 0)) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", "dataset.format",
                        "data set '%s' holds %s shards, which are streamed: name it with "
                        "\"format\": \"%s\"%s%s",
                        d.id, d.format, d.format, named ? ", not " : "", named ? named : "");
      return -1;
    }
    if (!shards && named) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", "dataset.format",
                        "data set '%s' is a %s upload, not shards: drop dataset.format", d.id,
                        d.format);
      return -1;
    }
  }
  if (spec->interleave_cycle_length > 0 && !spec->shards_format &&
      (!uploaded || (rc == STORE_OK && strcmp(d.format, "images") != 0))) {
    http_reply_status(
        res, 400, "INVALID_ARGUMENT", "pipeline.interleave",
        "interleave needs a data set made of several parts: shards, or an images upload (one "
        "part per class folder); '%s' is one file",
        spec->dataset);
    return -1;
  }
  if (!uploaded) return 0; /* built in: checked by the api layer */
  if (rc == STORE_NOT_FOUND) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "dataset.name", "no uploaded data set '%s'",
                      spec->dataset);
    return -1;
  }
  if (rc != STORE_OK) {
    http_reply_status(res, 500, "INTERNAL", NULL, "storage failure: %s", store_errmsg(cfg->st));
    return -1;
  }
  if (strcmp(spec->validation, "test") == 0 && d.test_examples == 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "dataset.validation",
                      "data set '%s' has no test split; use validation_split or validation 'none'",
                      d.id);
    return -1;
  }
  long long want = 1, have = 1;
  json_t *shape = json_loads(d.input_shape_json, 0, NULL);
  for (size_t i = 0; i < json_array_size(shape); i++)
    want *= json_integer_value(json_array_get(shape, i));
  for (int i = 0; i < spec->input_ndim; i++) have *= spec->input_shape[i];
  /* Images take the model's shape (they are resized); other data fixes it. */
  if (json_array_size(shape) > 0 && have != want) {
    http_reply_status(
        res, 400, "INVALID_ARGUMENT", "model.input_shape",
        "holds %lld values per example, but data set '%s' examples hold %lld (shape %s)", have,
        d.id, want, d.input_shape_json);
    json_decref(shape);
    return -1;
  }
  json_decref(shape);
  if (spec->shards_format) return 0; /* examples are checked as they are read */
  if (strcmp(d.format, "images") == 0 &&
      !(spec->input_ndim == 3 && (spec->input_shape[2] == 1 || spec->input_shape[2] == 3))) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "model.input_shape",
                      "an images data set needs input_shape [height, width, 1 or 3]");
    return -1;
  }
  long long outputs = spec->n_outputs;
  if (api_loss_is_regression(spec->loss_type)) {
    /* A regression predicts the one label column's number. */
    if (outputs != 1) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", "model.layers",
                        "a regression on data set '%s' predicts its one label column: the last "
                        "layer needs 1 unit, got %lld",
                        d.id, outputs);
      return -1;
    }
    return 0;
  }
  if (spec->loss_type == API_LOSS_BINARY_CROSSENTROPY && outputs == 1 && d.classes > 2) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "model.layers",
                      "binary_crossentropy with 1 unit scores labels 0 and 1, but data set '%s' "
                      "has %d classes",
                      d.id, d.classes);
    return -1;
  }
  if (outputs > 1 && outputs < d.classes) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "model.layers",
                      "the model outputs %lld class scores, but data set '%s' has %d classes",
                      outputs, d.id, d.classes);
    return -1;
  }
  return 0;
}
