/* tokens.c — the /v1/tokens routes: an admin makes tokens for any tenant
 * (the secret is answered once, never stored), lists every tenant's and
 * revokes any; a user lists its own tenant's and revokes their user tokens
 * (an admin token of its tenant is an admin's to revoke). An agent token
 * (role agent, tenant "agents") is an admin's to make. A revoked token
 * is refused from the next request on: the cache of verified tokens is
 * emptied with it. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "routes.h"

static json_t *token_json(const store_token *t) {
  json_t *o = json_object();
  char name[64];
  snprintf(name, sizeof name, "tokens/%s", t->id);
  json_object_set_new(o, "name", json_string(name));
  json_object_set_new(o, "id", json_string(t->id));
  json_object_set_new(o, "tenant", json_string(t->tenant));
  json_object_set_new(o, "role", json_string(t->role));
  json_object_set_new(o, "create_time", http_rfc3339(t->create_ms));
  if (t->last_used_ms > 0) json_object_set_new(o, "last_use_time", http_rfc3339(t->last_used_ms));
  return o;
}

void http_create_token(const http_config *cfg, http_request *req, http_response *res) {
  if (!req->who.admin) {
    http_reply_status(res, 403, "PERMISSION_DENIED", "role",
                      "only an admin token makes tokens; this one is tenant %s's user token",
                      req->who.tenant);
    return;
  }
  json_error_t jerr;
  json_t *body = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr);
  if (!json_is_object(body)) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "body",
                      "the body must be a JSON object {\"tenant\": NAME, \"role\": "
                      "\"user\"|\"admin\"} or {\"role\": \"agent\"}%s%.200s",
                      body ? "" : ": ", body ? "" : jerr.text);
    json_decref(body);
    return;
  }
  const char *key;
  json_t *value;
  json_object_foreach(body, key, value) {
    if (strcmp(key, "tenant") != 0 && strcmp(key, "role") != 0) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", key,
                        "unknown field '%.60s': a token takes tenant and role", key);
      json_decref(body);
      return;
    }
    if (!json_is_string(value)) {
      http_reply_status(res, 400, "INVALID_ARGUMENT", key, "%s must be a string", key);
      json_decref(body);
      return;
    }
  }
  const char *tenant = json_string_value(json_object_get(body, "tenant"));
  const char *role = json_string_value(json_object_get(body, "role"));
  if (!tenant && role && strcmp(role, "agent") == 0) tenant = HTTP_AGENT_TENANT;
  if (!tenant) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "tenant",
                      "tenant is required: the tenant the token acts for");
    json_decref(body);
    return;
  }
  const char *field;
  char why[200], secret[HTTP_TOKEN_LEN];
  if (http_token_check(tenant, role ? role : "user", &field, why, sizeof why) != 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", field, "%s", why);
    json_decref(body);
    return;
  }
  store_token t;
  memset(&t, 0, sizeof t);
  snprintf(t.tenant, sizeof t.tenant, "%s", tenant);
  snprintf(t.role, sizeof t.role, "%s", role ? role : "user");
  json_decref(body);
  if (http_token_create(cfg->st, t.tenant, t.role, secret, why, sizeof why) != 0) {
    http_reply_status(res, 500, "INTERNAL", NULL, "%s", why);
    return;
  }
  http_token_id(secret, t.id);
  t.create_ms = store_now_ms();
  json_t *doc = token_json(&t);
  json_object_set_new(doc, "secret", json_string(secret)); /* this answer only */
  http_reply_json(res, 200, doc);
}

void http_list_tokens(const http_config *cfg, http_request *req, http_response *res) {
  store_token *list = NULL;
  int n = 0;
  if (store_token_list(cfg->st, req->who.admin ? NULL : req->who.tenant, &list, &n) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return;
  }
  json_t *arr = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(arr, token_json(&list[i]));
  free(list);
  json_t *doc = json_object();
  json_object_set_new(doc, "tokens", arr);
  http_reply_json(res, 200, doc);
}

/* 1 when id is an admin token of tenant: a user sees it listed, but may
 * not revoke it. */
static int admin_token_of(store *st, const char *tenant, const char *id) {
  store_token *list = NULL;
  int n = 0, admin = 0;
  if (store_token_list(st, tenant, &list, &n) != STORE_OK) return 0;
  for (int i = 0; i < n; i++)
    admin |= strcmp(list[i].id, id) == 0 && strcmp(list[i].role, "admin") == 0;
  free(list);
  return admin;
}

void http_revoke_token(const http_config *cfg, http_request *req, http_response *res) {
  const char *id = req->params[0];
  const int valid = http_valid_name(id, 39);
  if (valid && !req->who.admin && admin_token_of(cfg->st, req->who.tenant, id)) {
    http_reply_status(res, 403, "PERMISSION_DENIED", "role",
                      "token %s is an admin token: only an admin revokes it", id);
    return;
  }
  int rc = valid ? store_token_revoke(cfg->st, id, req->who.admin ? NULL : req->who.tenant)
                 : STORE_NOT_FOUND;
  if (rc == STORE_NOT_FOUND) { /* another tenant's is as absent as a missing one */
    http_reply_status(res, 404, "NOT_FOUND", "token", "token '%.60s' does not exist", id);
    return;
  }
  if (rc != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return;
  }
  http_cache_tokens_clear(cfg->cache);
  http_reply_json(res, 200, json_object()); /* AIP-135: an empty body */
}
