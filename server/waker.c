/* waker.c — what lets kilnd's event loop hold requests without threads:
 * the requests that wait (:wait, metric streams) are suspended and parked
 * here, and one thread resumes each when the store changes, its deadline
 * passes, the server stops or its client leaves (found by polling the
 * parked sockets, which the event loop no longer watches). It also counts
 * each tenant's blocking requests against their cap, and closes connections
 * whose request headers are late (slowloris: the event loop's own timeout
 * restarts with every byte), or whose client left before sending them.
 *
 * Threads: the event-loop threads park requests, open and close
 * connection records and admit blocking requests; the waker thread reads
 * them. All of it is guarded by `lock`; a connection record's
 * headers_since is also read under it. A parked entry belongs to its
 * request and is touched by the waker only while it is on the list. */
#define _GNU_SOURCE /* POLLRDHUP */
#include <errno.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "routes.h"

#define WAKER_TICK_MS 100

typedef struct tenant_count {
  char tenant[64];
  unsigned blocking; /* admitted and not yet ended */
} tenant_count;

struct http_conn {
  struct http_conn *prev, *next;
  int fd;
  int64_t headers_since; /* when this request's headers began; 0: they are complete */
};

struct http_waker {
  pthread_mutex_t lock; /* guards everything below */
  pthread_cond_t tick;  /* signalled to stop the thread */
  pthread_t thread;
  int started, quit;
  int stopping; /* the server stops: parked requests are woken at once */
  store *st;
  unsigned header_timeout_s, max_blocked_per_tenant;
  http_parked *parked; /* doubly linked, newest first */
  struct http_conn *conns;
  tenant_count *tenants; /* one per tenant with blocking requests */
  int n_tenants, cap_tenants;
  unsigned blocking_total;
  struct pollfd *pfds;
  void **wake;
  size_t cap_pfds;
};

int64_t http_monotonic_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Room for n pollfds and n connections to wake; 0, or -1 when out of memory. */
static int reserve(http_waker *w, size_t n) {
  if (n <= w->cap_pfds) return 0;
  struct pollfd *pfds = realloc(w->pfds, n * sizeof *pfds);
  if (pfds) w->pfds = pfds;
  void **wake = realloc(w->wake, n * sizeof *wake);
  if (wake) w->wake = wake;
  if (!pfds || !wake) return -1;
  w->cap_pfds = n;
  return 0;
}

/* Wakes what is due; closes connections whose headers are late or whose
 * client left before sending them. */
static void pass(http_waker *w) {
  pthread_mutex_lock(&w->lock);
  const int64_t now = http_monotonic_ms();
  const uint64_t generation = store_generation(w->st);
  size_t n_parked = 0, n_conns = 0;
  for (http_parked *p = w->parked; p; p = p->next) n_parked++;
  for (struct http_conn *c = w->conns; c; c = c->next) n_conns += c->headers_since != 0;
  if (reserve(w, n_parked + n_conns) != 0) {
    pthread_mutex_unlock(&w->lock);
    return; /* out of memory: try again next tick */
  }
  size_t i = 0;
  for (http_parked *p = w->parked; p; p = p->next)
    w->pfds[i++] = (struct pollfd){.fd = p->fd, .events = POLLRDHUP};
  for (struct http_conn *c = w->conns; c; c = c->next)
    if (c->headers_since) w->pfds[i++] = (struct pollfd){.fd = c->fd, .events = POLLRDHUP};
  if (i) poll(w->pfds, (nfds_t)i, 0);
  const short left = POLLRDHUP | POLLHUP | POLLERR | POLLNVAL;
  size_t n_wake = 0;
  i = 0;
  for (http_parked *p = w->parked, *next; p; p = next, i++) {
    next = p->next;
    const int gone = (w->pfds[i].revents & left) != 0;
    if (!gone && !w->stopping && generation == p->generation && now < p->until_ms) continue;
    p->gone = gone;
    if (p->prev) p->prev->next = p->next;
    if (p->next) p->next->prev = p->prev;
    if (w->parked == p) w->parked = p->next;
    w->wake[n_wake++] = p->connection;
  }
  const int64_t header_ms = (int64_t)w->header_timeout_s * 1000;
  for (struct http_conn *c = w->conns; c; c = c->next) {
    if (!c->headers_since) continue;
    const int gone = (w->pfds[i++].revents & left) != 0;
    if (gone || (header_ms && now - c->headers_since >= header_ms)) {
      /* The event loop sees the end of the stream and closes it; the
       * record (and so the fd) lives until it does (http_waker_conn_close). */
      shutdown(c->fd, SHUT_RDWR);
      c->headers_since = 0;
    }
  }
  pthread_mutex_unlock(&w->lock);
  /* Off the list and not yet resumed, no entry can go away: resume each. */
  for (size_t k = 0; k < n_wake; k++) MHD_resume_connection(w->wake[k]);
}

static void *waker_main(void *arg) {
  http_waker *w = arg;
  for (;;) {
    pass(w);
    pthread_mutex_lock(&w->lock);
    if (!w->quit) {
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_nsec += WAKER_TICK_MS * 1000000L;
      if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&w->tick, &w->lock, &until);
    }
    const int quit = w->quit;
    pthread_mutex_unlock(&w->lock);
    if (quit) return NULL;
  }
}

http_waker *http_waker_new(store *st, unsigned header_timeout_s, unsigned max_blocked_per_tenant,
                           char *err, size_t errlen) {
  http_waker *w = calloc(1, sizeof *w);
  if (!w) {
    snprintf(err, errlen, "http: out of memory");
    return NULL;
  }
  pthread_mutex_init(&w->lock, NULL);
  pthread_cond_init(&w->tick, NULL);
  w->st = st;
  w->header_timeout_s = header_timeout_s;
  w->max_blocked_per_tenant = max_blocked_per_tenant;
  int rc = pthread_create(&w->thread, NULL, waker_main, w);
  if (rc != 0) {
    snprintf(err, errlen, "http: cannot start the waker thread: %s", strerror(rc));
    http_waker_free(w);
    return NULL;
  }
  w->started = 1;
  return w;
}

void http_waker_free(http_waker *w) {
  if (!w) return;
  if (w->started) {
    pthread_mutex_lock(&w->lock);
    w->quit = 1;
    pthread_cond_signal(&w->tick);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
  }
  pthread_cond_destroy(&w->tick);
  pthread_mutex_destroy(&w->lock);
  free(w->tenants);
  free(w->pfds);
  free(w->wake);
  free(w);
}

void http_waker_stop(http_waker *w) {
  pthread_mutex_lock(&w->lock);
  w->stopping = 1;
  pthread_cond_signal(&w->tick);
  pthread_mutex_unlock(&w->lock);
}

int http_waker_idle(http_waker *w) {
  pthread_mutex_lock(&w->lock);
  const int idle = !w->parked && w->blocking_total == 0;
  pthread_mutex_unlock(&w->lock);
  return idle;
}

void http_waker_park(http_waker *w, http_parked *p, void *connection, int fd, uint64_t generation,
                     int64_t until_ms) {
  *p = (http_parked){
      .connection = connection, .fd = fd, .generation = generation, .until_ms = until_ms};
  pthread_mutex_lock(&w->lock);
  const int stopping = w->stopping;
  if (!stopping) {
    p->next = w->parked;
    if (w->parked) w->parked->prev = p;
    w->parked = p;
  }
  pthread_mutex_unlock(&w->lock);
  /* Parked after the stop swept the list: straight back, to answer 503. */
  if (stopping) MHD_resume_connection(connection);
}

/* ---- blocking requests per tenant ---- */

static tenant_count *find_tenant(http_waker *w, const char *tenant) {
  for (int i = 0; i < w->n_tenants; i++)
    if (strcmp(w->tenants[i].tenant, tenant) == 0) return &w->tenants[i];
  return NULL;
}

int http_waker_admit(http_waker *w, const char *tenant, http_response *res) {
  pthread_mutex_lock(&w->lock);
  tenant_count *t = find_tenant(w, tenant);
  if (!t) {
    if (w->n_tenants == w->cap_tenants) {
      int cap = w->cap_tenants ? 2 * w->cap_tenants : 16;
      tenant_count *grown = realloc(w->tenants, (size_t)cap * sizeof *grown);
      if (!grown) {
        pthread_mutex_unlock(&w->lock);
        http_reply_status(res, 500, "INTERNAL", NULL, "out of memory");
        return -1;
      }
      w->tenants = grown;
      w->cap_tenants = cap;
    }
    t = &w->tenants[w->n_tenants++];
    snprintf(t->tenant, sizeof t->tenant, "%s", tenant);
    t->blocking = 0;
  }
  if (t->blocking >= w->max_blocked_per_tenant) {
    const unsigned cap = w->max_blocked_per_tenant;
    pthread_mutex_unlock(&w->lock);
    http_reply_status(res, 429, "RESOURCE_EXHAUSTED", "tenant",
                      "tenant '%s' already has %u blocking requests (:wait, metrics:watch) open, "
                      "the most kilnd allows a tenant (--max-blocked-per-tenant); retry when one "
                      "of them ends",
                      tenant, cap);
    return -1;
  }
  t->blocking++;
  w->blocking_total++;
  pthread_mutex_unlock(&w->lock);
  return 0;
}

void http_waker_release(http_waker *w, const char *tenant) {
  pthread_mutex_lock(&w->lock);
  tenant_count *t = find_tenant(w, tenant);
  if (t && t->blocking > 0) {
    t->blocking--;
    w->blocking_total--;
    if (t->blocking == 0) *t = w->tenants[--w->n_tenants]; /* keep the table short */
  }
  pthread_mutex_unlock(&w->lock);
}

/* ---- connections and the header deadline ---- */

http_conn *http_waker_conn_open(http_waker *w, int fd) {
  http_conn *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->fd = fd;
  c->headers_since = http_monotonic_ms();
  pthread_mutex_lock(&w->lock);
  c->next = w->conns;
  if (w->conns) w->conns->prev = c;
  w->conns = c;
  pthread_mutex_unlock(&w->lock);
  return c;
}

void http_waker_conn_headers(http_waker *w, http_conn *c, int complete) {
  if (!c) return;
  pthread_mutex_lock(&w->lock);
  c->headers_since = complete ? 0 : http_monotonic_ms();
  pthread_mutex_unlock(&w->lock);
}

void http_waker_conn_close(http_waker *w, http_conn *c) {
  if (!c) return;
  pthread_mutex_lock(&w->lock);
  if (c->prev) c->prev->next = c->next;
  if (c->next) c->next->prev = c->prev;
  if (w->conns == c) w->conns = c->next;
  pthread_mutex_unlock(&w->lock);
  free(c);
}
