/* cache.c — answers from memory what the store has not changed since it
 * was read: rendered GET /v1/jobs/{id} bodies, valid while the store's
 * generation (store_generation: every write kilnd's server or scheduler
 * makes moves it) is the
 * one they were read at (an unfinished job's, whose times run on, for a
 * moment at most); and verified bearer tokens, kept for a couple of
 * seconds so a revocation made outside kilnd takes effect that fast. Both
 * are small direct-mapped tables under one read-write lock; a miss just
 * means the request reads the store as it would without them. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "routes.h"

#define JOB_SLOTS     256
#define TOKEN_SLOTS   64
#define TOKEN_TTL_MS  2000
#define JOB_MAX_BYTES (64 * 1024) /* larger answers are not kept */

typedef struct job_slot {
  char id[48];
  char tenant[64];
  uint64_t generation;
  int64_t until_ms; /* monotonic; 0 = while the generation holds */
  char *body;       /* NULL: empty */
} job_slot;

typedef struct token_slot {
  char hash[65];
  http_principal who;
  int64_t until_ms;
} token_slot;

struct http_cache {
  pthread_rwlock_t lock;
  job_slot jobs[JOB_SLOTS];
  token_slot tokens[TOKEN_SLOTS];
  uint64_t token_epoch; /* moves on each revocation: a lookup begun before it is not kept */
};

static uint64_t hash_text(const char *text) {
  uint64_t h = 1469598103934665603ULL; /* FNV-1a */
  for (; *text; text++) h = (h ^ (unsigned char)*text) * 1099511628211ULL;
  return h;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

http_cache *http_cache_new(void) {
  http_cache *c = calloc(1, sizeof *c);
  if (c && pthread_rwlock_init(&c->lock, NULL) != 0) {
    free(c);
    return NULL;
  }
  return c;
}

void http_cache_free(http_cache *c) {
  if (!c) return;
  for (int i = 0; i < JOB_SLOTS; i++) free(c->jobs[i].body);
  pthread_rwlock_destroy(&c->lock);
  free(c);
}

int http_cache_job_get(http_cache *c, const char *id, const http_principal *who,
                       uint64_t generation, http_response *res) {
  if (!c) return 0;
  job_slot *slot = &c->jobs[hash_text(id) % JOB_SLOTS];
  char *body = NULL;
  pthread_rwlock_rdlock(&c->lock);
  if (slot->body && slot->generation == generation && strcmp(slot->id, id) == 0 &&
      (slot->until_ms == 0 || slot->until_ms > now_ms()) &&
      (who->admin || strcmp(slot->tenant, who->tenant) == 0))
    body = strdup(slot->body);
  pthread_rwlock_unlock(&c->lock);
  if (!body) return 0;
  res->status = 200;
  res->body = body;
  return 1;
}

void http_cache_job_put(http_cache *c, const char *id, const char *tenant, uint64_t generation,
                        int64_t max_age_ms, const char *body) {
  if (!c || !body || strlen(id) >= sizeof c->jobs[0].id ||
      strlen(tenant) >= sizeof c->jobs[0].tenant || strlen(body) > JOB_MAX_BYTES)
    return;
  char *copy = strdup(body);
  if (!copy) return;
  job_slot *slot = &c->jobs[hash_text(id) % JOB_SLOTS];
  pthread_rwlock_wrlock(&c->lock);
  char *old = slot->body;
  snprintf(slot->id, sizeof slot->id, "%s", id);
  snprintf(slot->tenant, sizeof slot->tenant, "%s", tenant);
  slot->generation = generation;
  slot->until_ms = max_age_ms > 0 ? now_ms() + max_age_ms : 0;
  slot->body = copy;
  pthread_rwlock_unlock(&c->lock);
  free(old);
}

int http_cache_token_get(http_cache *c, const char *hash, http_principal *who) {
  if (!c) return 0;
  token_slot *slot = &c->tokens[hash_text(hash) % TOKEN_SLOTS];
  int hit = 0;
  pthread_rwlock_rdlock(&c->lock);
  if (slot->until_ms > now_ms() && strcmp(slot->hash, hash) == 0) {
    *who = slot->who;
    hit = 1;
  }
  pthread_rwlock_unlock(&c->lock);
  return hit;
}

uint64_t http_cache_token_epoch(http_cache *c) {
  if (!c) return 0;
  pthread_rwlock_rdlock(&c->lock);
  uint64_t epoch = c->token_epoch;
  pthread_rwlock_unlock(&c->lock);
  return epoch;
}

void http_cache_tokens_clear(http_cache *c) {
  if (!c) return;
  pthread_rwlock_wrlock(&c->lock);
  for (int i = 0; i < TOKEN_SLOTS; i++) c->tokens[i].until_ms = 0;
  c->token_epoch++;
  pthread_rwlock_unlock(&c->lock);
}

void http_cache_token_put(http_cache *c, const char *hash, const http_principal *who,
                          uint64_t epoch) {
  if (!c || strlen(hash) >= sizeof c->tokens[0].hash) return;
  token_slot *slot = &c->tokens[hash_text(hash) % TOKEN_SLOTS];
  pthread_rwlock_wrlock(&c->lock);
  if (epoch != c->token_epoch) { /* revoked meanwhile, perhaps this very token */
    pthread_rwlock_unlock(&c->lock);
    return;
  }
  snprintf(slot->hash, sizeof slot->hash, "%s", hash);
  slot->who = *who;
  slot->until_ms = now_ms() + TOKEN_TTL_MS;
  pthread_rwlock_unlock(&c->lock);
}
