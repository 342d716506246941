/* openapi.c — GET /v1/openapi.json: the OpenAPI document, made from the
 * route table so every route is described. */
#include <string.h>

#include "routes.h"

static json_t *error_response(const char *description) {
  json_t *r = json_object();
  json_object_set_new(r, "description", json_string(description));
  json_t *content = json_object(), *media = json_object(), *schema = json_object();
  json_object_set_new(schema, "$ref", json_string("#/components/schemas/Error"));
  json_object_set_new(media, "schema", schema);
  json_object_set_new(content, "application/json", media);
  json_object_set_new(r, "content", content);
  return r;
}

void http_openapi(const http_config *cfg, http_request *req, http_response *res) {
  (void)cfg;
  (void)req;
  int n = 0;
  const http_route *routes = http_routes(&n);
  json_t *doc = json_object(), *paths = json_object();
  json_object_set_new(doc, "openapi", json_string("3.0.3"));
  json_t *info = json_object();
  json_object_set_new(info, "title", json_string("kiln"));
  json_object_set_new(info, "version", json_string("v1"));
  json_object_set_new(info, "description",
                      json_string("Training as a service. Errors follow Google's AIP-193 model."));
  json_object_set_new(doc, "info", info);
  for (int i = 0; i < n; i++) {
    json_t *item = json_object_get(paths, routes[i].pattern);
    if (!item) {
      item = json_object();
      json_object_set_new(paths, routes[i].pattern, item);
    }
    json_t *op = json_object();
    char method[16], op_id[160];
    size_t m = 0;
    for (; routes[i].method[m] && m < sizeof method - 1; m++)
      method[m] = (char)(routes[i].method[m] | 0x20); /* lower case */
    method[m] = '\0';
    /* operationId: method plus the path's words, e.g. get_v1_jobs_job_metrics. */
    size_t o = (size_t)snprintf(op_id, sizeof op_id, "%s", method);
    for (const char *p = routes[i].pattern; *p && o < sizeof op_id - 2; p++) {
      char c = *p;
      if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
        op_id[o++] = c;
      } else if (c == '/' || c == ':' || c == '.') {
        op_id[o++] = '_';
      }
    }
    op_id[o] = '\0';
    json_object_set_new(op, "operationId", json_string(op_id));
    json_object_set_new(op, "summary", json_string(routes[i].summary));
    json_t *params = json_array();
    for (const char *p = strchr(routes[i].pattern, '{'); p; p = strchr(p + 1, '{')) {
      const char *close = strchr(p, '}');
      json_t *param = json_object(), *schema = json_object();
      json_object_set_new(param, "name", json_stringn(p + 1, (size_t)(close - p - 1)));
      json_object_set_new(param, "in", json_string("path"));
      json_object_set_new(param, "required", json_true());
      json_object_set_new(schema, "type", json_string("string"));
      json_object_set_new(param, "schema", schema);
      json_array_append_new(params, param);
    }
    json_object_set_new(op, "parameters", params);
    if (!routes[i].public_route) {
      json_t *sec = json_array(), *req_sec = json_object();
      json_object_set_new(req_sec, "bearer", json_array());
      json_array_append_new(sec, req_sec);
      json_object_set_new(op, "security", sec);
    }
    json_t *responses = json_object();
    json_t *ok = json_object();
    json_object_set_new(ok, "description", json_string("success"));
    json_object_set_new(responses, "200", ok);
    json_object_set_new(responses, "default", error_response("an error in the AIP-193 model"));
    json_object_set_new(op, "responses", responses);
    json_object_set_new(item, method, op);
  }
  json_object_set_new(doc, "paths", paths);
  json_t *components = json_object(), *schemas = json_object(), *schemes = json_object();
  json_t *err = json_loads(
      "{\"type\":\"object\",\"properties\":{\"error\":{\"type\":\"object\",\"properties\":{"
      "\"code\":{\"type\":\"integer\"},\"status\":{\"type\":\"string\"},"
      "\"message\":{\"type\":\"string\"},\"details\":{\"type\":\"array\",\"items\":{"
      "\"type\":\"object\",\"properties\":{\"field\":{\"type\":\"string\"},"
      "\"description\":{\"type\":\"string\"}}}}}}}}",
      0, NULL);
  json_object_set_new(schemas, "Error", err ? err : json_object());
  json_t *bearer = json_object();
  json_object_set_new(bearer, "type", json_string("http"));
  json_object_set_new(bearer, "scheme", json_string("bearer"));
  json_object_set_new(schemes, "bearer", bearer);
  json_object_set_new(components, "schemas", schemas);
  json_object_set_new(components, "securitySchemes", schemes);
  json_object_set_new(doc, "components", components);
  http_reply_json(res, 200, doc);
}
