/* openapi.h — private to server/: the pieces openapi.json is made of. */
#ifndef KILN_SERVER_OPENAPI_H
#define KILN_SERVER_OPENAPI_H

#include <jansson.h>

/* A named piece of the document, as JSON written with single quotes. */
typedef struct http_openapi_text {
  const char *name;
  const char *json;
} http_openapi_text;

/* components.schemas (openapi_schemas.c). */
const http_openapi_text *http_openapi_schemas(int *n);

/* The value of text, JSON with ' for ", or NULL when it does not parse. */
json_t *http_openapi_json(const char *text);

/* The whole document for the route table; NULL (why in err) when a piece
 * of it does not parse or a route has no documentation entry. */
json_t *http_openapi_document(char *err, size_t errlen);

#endif
