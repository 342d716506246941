/* sse.c — GET /v1/jobs/{job}/metrics:watch: a job's metric points as
 * server-sent events, `id:` = the point's sequence number, so a client that
 * reconnects with Last-Event-ID gets every later point once. The stream
 * ends with an `end` event when the job has ended and every point is sent.
 *
 * When nothing is new the reader says so (0) and the server parks the
 * stream, holding no thread, until the store changes.
 *
 * Threads: a stream's reader runs on the event-loop thread serving its
 * connection and owns its watch; the store handle is shared and locks
 * itself. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "routes.h"

#define WATCH_BATCH       256
#define WATCH_KEEPALIVE_S 15

typedef struct watch {
  const http_config *cfg;
  char job_id[40];
  int64_t after_seq; /* the last id sent */
  char *buf;         /* formatted events not yet handed to MHD */
  size_t len, off;
  int ended;
  int64_t sent_ms; /* when bytes last went out (http_monotonic_ms) */
} watch;

static void watch_free(void *ctx) {
  watch *w = ctx;
  free(w->buf);
  free(w);
}

static int append(watch *w, const char *text) {
  size_t n = strlen(text);
  char *grown = realloc(w->buf, w->len + n + 1);
  if (!grown) return -1;
  w->buf = grown;
  memcpy(w->buf + w->len, text, n + 1);
  w->len += n;
  return 0;
}

/* Formats the next batch into w->buf; 1 when something was added. */
static int refill(watch *w) {
  store_metric *points = NULL;
  int n = 0;
  if (store_metrics_since(w->cfg->st, w->job_id, w->after_seq, WATCH_BATCH, &points, &n) !=
      STORE_OK) {
    w->ended = 1;
    return append(w, "event: error\ndata: {\"message\":\"storage failure\"}\n\n") == 0;
  }
  for (int i = 0; i < n; i++) {
    json_t *o = json_object();
    json_object_set_new(o, "attempt", json_integer(points[i].attempt));
    json_object_set_new(o, "step", json_integer(points[i].step));
    json_object_set_new(o, "epoch", json_integer(points[i].epoch));
    json_object_set_new(o, "name", json_string(points[i].name));
    json_object_set_new(o, "value",
                        isnan(points[i].value) ? json_null() : json_real(points[i].value));
    char *data = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    char line[512];
    snprintf(line, sizeof line, "id: %lld\nevent: metric\ndata: %s\n\n", (long long)points[i].seq,
             data ? data : "{}");
    free(data);
    if (append(w, line) != 0) break;
    w->after_seq = points[i].seq;
  }
  free(points);
  if (n > 0) return 1;
  /* Nothing new: has the job ended? The scheduler stores the last points
   * before the final state, so an ended job with nothing new is complete. */
  store_job job;
  if (store_job_get(w->cfg->st, w->job_id, &job) != STORE_OK) {
    w->ended = 1;
    return append(w, "event: end\ndata: {\"state\":\"DELETED\"}\n\n") == 0;
  }
  int st = api_job_state_parse(job.state);
  if (st >= 0 && api_job_state_is_terminal((api_job_state)st)) {
    char line[128];
    snprintf(line, sizeof line, "event: end\ndata: {\"state\":\"%s\"}\n\n", job.state);
    w->ended = 1;
    store_job_clear(&job);
    return append(w, line) == 0;
  }
  store_job_clear(&job);
  return 0;
}

static long watch_read(void *ctx, uint64_t pos, char *out, size_t max) {
  (void)pos;
  watch *w = ctx;
  if (w->off == w->len) {
    free(w->buf);
    w->buf = NULL;
    w->len = w->off = 0;
    if (w->ended) return -1;
    if (!refill(w)) {
      if (http_monotonic_ms() - w->sent_ms < WATCH_KEEPALIVE_S * 1000) return 0; /* parked */
      /* a comment keeps proxies from timing out */
      if (append(w, ": keep-alive\n\n") != 0) return -1;
    }
  }
  w->sent_ms = http_monotonic_ms();
  size_t n = w->len - w->off < max ? w->len - w->off : max;
  memcpy(out, w->buf + w->off, n);
  w->off += n;
  return (long)n;
}

int http_parse_last_event_id(const char *text, int64_t *after) {
  *after = 0;
  if (!text || !*text) return 0;
  char *end = NULL;
  long long v = strtoll(text, &end, 10);
  if (*end || v < 0) return -1;
  *after = v;
  return 0;
}

void http_watch_metrics(const http_config *cfg, http_request *req, http_response *res) {
  const char *last = http_header(req, "Last-Event-ID");
  int64_t after = 0;
  if (http_parse_last_event_id(last, &after) != 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "Last-Event-ID",
                      "Last-Event-ID must be an event id this stream sent (an integer >= 0), "
                      "got '%.40s'",
                      last);
    return;
  }
  store_job job;
  if (http_load_job(cfg, req, &job, res) != 0) return;
  watch *w = calloc(1, sizeof *w);
  if (!w) {
    store_job_clear(&job);
    http_reply_status(res, 500, "INTERNAL", NULL, "out of memory");
    return;
  }
  w->cfg = cfg;
  snprintf(w->job_id, sizeof w->job_id, "%s", job.id);
  w->after_seq = after;
  w->sent_ms = http_monotonic_ms();
  store_job_clear(&job);
  res->status = 200;
  res->content_type = "text/event-stream";
  res->stream = watch_read;
  res->stream_ctx = w;
  res->stream_free = watch_free;
}
