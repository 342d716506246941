/* assets.h — private to server/: the dashboard's files (web/) and the job
 * spec examples, embedded at build time by web/embed.cmake. */
#ifndef KILN_SERVER_ASSETS_H
#define KILN_SERVER_ASSETS_H

#include <stddef.h>

typedef struct http_asset {
  const char *path;         /* URL path: "/index.html", "/assets/app.js" */
  const char *content_type; /* "text/javascript; charset=utf-8" */
  const unsigned char *data;
  size_t len;
  const char *etag; /* quoted, from the file's SHA-256 */
} http_asset;

extern const http_asset http_assets[];
extern const int http_assets_count;

#endif
