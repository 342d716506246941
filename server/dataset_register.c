/* dataset_register.c — POST /v1/datasets:register: an admin makes a folder of
 * shards under the server's datasets directory a data set, checked as an
 * upload of shards is, listed and named by jobs as uploads are. The folder
 * stays the admin's: deleting the data set removes only kilnd's record of
 * it. The path is confined to the datasets directory: relative, no "." or
 * ".." segment, and neither it nor its splits' files may be links that
 * lead outside. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "routes.h"
#include "server.h"

/* 0 when path keeps to the rules of a relative path under the datasets
 * directory; else -1 with the rule it broke in why. */
static int path_rules(const char *path, char *why, size_t whylen) {
  const size_t len = strlen(path);
  if (len == 0 || len > 255) {
    snprintf(why, whylen, "path must be 1-255 bytes, a folder under the datasets directory");
    return -1;
  }
  if (path[0] == '/') {
    snprintf(why, whylen,
             "path must be relative to the datasets directory (like shards/fashion), got the "
             "absolute '%.60s'",
             path);
    return -1;
  }
  for (const char *p = path; *p;) {
    const char *slash = strchr(p, '/');
    const size_t seg = slash ? (size_t)(slash - p) : strlen(p);
    if ((seg == 2 && p[0] == '.' && p[1] == '.') || (seg == 1 && p[0] == '.')) {
      snprintf(why, whylen, "path may not hold a '.' or '..' segment, got '%.60s'", path);
      return -1;
    }
    if (seg == 0 && slash && slash[1] != '\0') {
      snprintf(why, whylen, "path may not hold an empty segment ('//'), got '%.60s'", path);
      return -1;
    }
    for (size_t i = 0; i < seg; i++) {
      if ((unsigned char)p[i] < 0x20 || p[i] == '\\') {
        snprintf(why, whylen, "path holds a control character or backslash");
        return -1;
      }
    }
    p += seg;
    while (*p == '/') p++;
  }
  return 0;
}

/* 1 when resolved is root or under it. */
static int inside(const char *root, const char *resolved) {
  const size_t n = strlen(root);
  return strncmp(resolved, root, n) == 0 && (resolved[n] == '/' || resolved[n] == '\0');
}

/* Every entry of folder/split resolves under root: 0, or -1 with why. */
static int split_confined(const char *root, const char *folder, const char *path, const char *split,
                          char *why, size_t whylen) {
  char dir[PATH_MAX + 16], real[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/%s", folder, split);
  if (!realpath(dir, real)) return 0; /* no such split: the check says what it needs */
  if (!inside(root, real)) {
    snprintf(why, whylen, "'%s/%s' is a link to outside the datasets directory", path, split);
    return -1;
  }
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *e;
  int rc = 0;
  while (!rc && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char entry[PATH_MAX * 2];
    snprintf(entry, sizeof entry, "%s/%s", dir, e->d_name);
    if (realpath(entry, real) && !inside(root, real)) {
      snprintf(why, whylen, "'%s/%s/%.100s' is a link to outside the datasets directory", path,
               split, e->d_name);
      rc = -1;
    }
  }
  closedir(d);
  return rc;
}

/* A string member of body: NULL when absent; -1 having answered 400 when
 * it is not a string of 1..max-1 bytes. */
static int string_member(json_t *body, const char *key, size_t max, const char **out,
                         http_response *res) {
  json_t *v = json_object_get(body, key);
  *out = NULL;
  if (!v) return 0;
  if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) >= max) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", key, "%s must be a string of 1-%zu bytes", key,
                      max - 1);
    return -1;
  }
  *out = json_string_value(v);
  return 0;
}

void http_register_dataset(const http_config *cfg, http_request *req, http_response *res) {
  if (!req->who.admin) {
    http_reply_status(res, 403, "PERMISSION_DENIED", "role",
                      "only an admin token registers a server folder as a data set; this one "
                      "is tenant %s's user token",
                      req->who.tenant);
    return;
  }
  json_error_t jerr;
  json_t *body = json_loadb(req->body, req->body_len, 0, &jerr);
  if (!json_is_object(body)) {
    json_decref(body);
    http_reply_status(res, 400, "INVALID_ARGUMENT", "body",
                      "the body must be a JSON object: {\"path\", \"format\", \"display_name\", "
                      "\"tenant\", \"features\"}");
    return;
  }
  static const char *const fields[] = {"path",   "format",   "display_name",
                                       "tenant", "features", NULL};
  const char *key;
  json_t *value;
  json_object_foreach(body, key, value) {
    int known = 0;
    for (int i = 0; fields[i]; i++) known |= strcmp(key, fields[i]) == 0;
    if (!known) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", key,
                        "unknown field '%.60s' (known: path, format, display_name, tenant, "
                        "features)",
                        key);
      json_decref(body);
      return;
    }
  }
  const char *path, *format, *display, *tenant, *features[2] = {NULL, NULL};
  if (string_member(body, "path", 256, &path, res) ||
      string_member(body, "format", 16, &format, res) ||
      string_member(body, "display_name", 128, &display, res) ||
      string_member(body, "tenant", 64, &tenant, res)) {
    json_decref(body);
    return;
  }
  json_t *feats = json_object_get(body, "features");
  if (feats) {
    json_t *image = json_object_get(feats, "image"), *label = json_object_get(feats, "label");
    const int ok = json_is_object(feats) && json_object_size(feats) == (size_t)(!!image + !!label);
    if (!ok || string_member(feats, "image", 128, &features[0], res) ||
        string_member(feats, "label", 128, &features[1], res)) {
      if (!ok)
        http_reply_status(res, 400, "INVALID_ARGUMENT", "features",
                          "features must be {\"image\": name, \"label\": name}");
      json_decref(body);
      return;
    }
  }
  const int f = api_dataset_format_parse(format);
  char why[300];
  if (!path) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "path",
                      "path is required: the folder of shards, relative to the datasets "
                      "directory (holding train/ and optionally test/)");
  } else if (f < 0 || !api_dataset_format_is_shards((api_dataset_format)f)) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "format",
                      "format must be tfrecord or tar (the shards' format), got '%.40s'",
                      format ? format : "");
  } else if (tenant && !http_valid_name(tenant, 63)) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "tenant",
                      "tenant must be 1-63 of A-Z a-z 0-9 - _ .");
  } else if (path_rules(path, why, sizeof why) != 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "path", "%s", why);
  } else {
    char root[PATH_MAX], folder[PATH_MAX + 300], real[PATH_MAX];
    struct stat st;
    snprintf(folder, sizeof folder, "%s/%s", cfg->datasets_dir, path);
    if (!realpath(cfg->datasets_dir, root)) {
      http_reply_status(res, 500, "INTERNAL", NULL, "the datasets directory cannot be resolved: %s",
                        strerror(errno));
    } else if (!realpath(folder, real) || stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", "path",
                        "'%.200s' is not a folder under the datasets directory", path);
    } else if (!inside(root, real) || strcmp(root, real) == 0) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", "path",
                        "'%.200s' leads outside the datasets directory (through a link)", path);
    } else if (split_confined(root, folder, path, "train", why, sizeof why) != 0 ||
               split_confined(root, folder, path, "test", why, sizeof why) != 0) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", "path", "%s", why);
    } else {
      api_dataset_manifest m;
      memset(&m, 0, sizeof m);
      char tmp[4200];
      if (http_new_dataset_id(m.id) != 0) {
        http_reply_status(res, 500, "INTERNAL", NULL, "no randomness for a data set id");
      } else {
        m.format = (api_dataset_format)f;
        snprintf(m.source, sizeof m.source, "%s", path);
        size_t n = strlen(m.source);
        while (n > 0 && m.source[n - 1] == '/') m.source[--n] = '\0';
        if (features[0]) snprintf(m.image_feature, sizeof m.image_feature, "%s", features[0]);
        if (features[1]) snprintf(m.label_feature, sizeof m.label_feature, "%s", features[1]);
        snprintf(tmp, sizeof tmp, "%s/.upload-%s", cfg->uploads_dir, m.id);
        if ((mkdir(cfg->uploads_dir, 0700) != 0 && errno != EEXIST) || mkdir(tmp, 0700) != 0) {
          http_reply_status(res, 500, "INTERNAL", NULL, "cannot make the data set's folder: %s",
                            strerror(errno));
        } else {
          http_dataset_admit(cfg, tmp, &m, display ? display : "",
                             tenant ? tenant : STORE_DEFAULT_TENANT, 0, res);
          if (res->status != 200) http_remove_tree(tmp);
        }
      }
    }
  }
  json_decref(body);
}
