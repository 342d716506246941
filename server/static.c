/* static.c — the dashboard: `/`, `/index.html` and `/assets/...` answered
 * from the files embedded in kilnd (assets.h), without a token (the page
 * holds no data; every API call it makes sends the token). Each answer has
 * an ETag, and a matching If-None-Match gets 304, so a reload costs one
 * round trip per file and no bytes. */
#include <string.h>

#include "assets.h"
#include "routes.h"

/* The page loads only its own files and talks only to this server. */
#define DASHBOARD_CSP                                                                              \
  "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; "          \
  "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

static const http_asset *find_asset(const char *path) {
  if (strcmp(path, "/") == 0) path = "/index.html";
  for (int i = 0; i < http_assets_count; i++)
    if (strcmp(http_assets[i].path, path) == 0) return &http_assets[i];
  return NULL;
}

int http_static_path(const char *path) {
  return strcmp(path, "/") == 0 || strcmp(path, "/index.html") == 0 ||
         strncmp(path, "/assets/", 8) == 0;
}

int http_serve_static(http_request *req, http_response *res) {
  const char *path = req->path;
  if (!http_static_path(path)) return 0;
  if (strcmp(req->method, "GET") != 0 && strcmp(req->method, "HEAD") != 0) {
    http_reply_status(res, 405, "UNIMPLEMENTED", "method", "%s is not supported on %.200s; use GET",
                      req->method, path);
    return 1;
  }
  const http_asset *a = find_asset(path);
  if (!a) {
    http_reply_status(res, 404, "NOT_FOUND", "path", "no dashboard file %.200s", path);
    return 1;
  }
  res->content_type = a->content_type;
  res->etag = a->etag;
  /* Revalidate every time: the file names carry no version, and a 304 is
   * cheap. */
  res->cache_control = "no-cache";
  if (strncmp(a->content_type, "text/html", 9) == 0) res->csp = DASHBOARD_CSP;
  const char *match = http_header(req, "If-None-Match");
  if (match && strstr(match, a->etag)) {
    res->status = 304;
    return 1;
  }
  res->status = 200;
  res->static_body = a->data;
  res->static_len = a->len;
  return 1;
}
