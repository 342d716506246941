/* profile.c — the step profiler: while a profile is attached to a graph
 * and recording, every node a run executes is timed, with the bytes its
 * output holds; the training loop adds the step and its other phases
 * (data, feed, metrics, optimizer). Written out as Chrome trace-event JSON
 * (Perfetto, chrome://tracing) and as a table of the costliest nodes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "graph_internal.h"

typedef struct prof_event {
  int node;          /* graph node, or -1 for a phase of the step */
  const char *phase; /* "step", "data", "feed", "metrics", "optimizer"; NULL for a node */
  int64_t step;
  double start, dur; /* seconds since the profile began */
  size_t bytes;      /* the node's output */
  int backward;
} prof_event;

struct kn_profile {
  prof_event *events;
  size_t n, cap;
  double t0;
  int64_t step; /* the step being recorded */
  int recording;
};

double kn_profile_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

kn_profile *kn_profile_new(void) {
  kn_profile *p = calloc(1, sizeof *p);
  if (p) p->t0 = kn_profile_now();
  return p;
}

void kn_profile_free(kn_profile *p) {
  if (!p) return;
  free(p->events);
  free(p);
}

int kn_profile_reserve(kn_profile *p, size_t events) {
  if (events <= p->cap) return KN_OK;
  prof_event *e = realloc(p->events, events * sizeof *e);
  if (!e) return KN_ENOMEM;
  p->events = e;
  p->cap = events;
  return KN_OK;
}

void kn_profile_record(kn_profile *p, int64_t step, int on) {
  p->step = step;
  p->recording = on;
}

int kn_profile_recording(const kn_profile *p) {
  return p && p->recording;
}

static prof_event *push(kn_profile *p) {
  if (p->n == p->cap) {
    size_t cap = p->cap ? p->cap * 2 : 1024;
    prof_event *e = realloc(p->events, cap * sizeof *e);
    if (!e) return NULL; /* the event is dropped; the run goes on */
    p->events = e;
    p->cap = cap;
  }
  prof_event *e = &p->events[p->n++];
  memset(e, 0, sizeof *e);
  e->step = p->step;
  return e;
}

void kn_profile_phase(kn_profile *p, const char *phase, double start, double end) {
  if (!p || !p->recording) return;
  prof_event *e = push(p);
  if (!e) return;
  e->node = -1;
  e->phase = phase;
  e->start = start - p->t0;
  e->dur = end - start;
}

void kn_profile_node(kn_profile *p, const kn_graph *g, int node, double start, double end) {
  prof_event *e = push(p);
  if (!e) return;
  const kn_node_rec *r = &g->nodes[node];
  e->node = node;
  e->start = start - p->t0;
  e->dur = end - start;
  e->bytes = kn_node_elems(r, g->batch) * kn_graph_elem_size(g, r->dtype);
  e->backward = node >= g->n_forward;
}

/* A node's label: its name where it has one, else op#index. */
static void node_label(const kn_graph *g, int node, char *out, size_t len) {
  const kn_node_rec *r = &g->nodes[node];
  if (r->name[0])
    snprintf(out, len, "%s:%.100s", kn_op_name(r->op), r->name);
  else
    snprintf(out, len, "%s#%d", kn_op_name(r->op), node);
}

/* Writes s as a JSON string body (labels are names we made, but a layer
 * name is the user's). */
static void json_text(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      fprintf(f, "\\%c", *s);
    else if ((unsigned char)*s < 0x20)
      fprintf(f, "\\u%04x", *s);
    else
      fputc(*s, f);
  }
}

/* The file a profile goes to (kn_durable_open: a temp file renamed into
 * place by finish_file, or path itself where it is a pipe, device or link,
 * tmp then ""). */
static FILE *open_file(const char *path, char *tmp, size_t tmplen, char *err, size_t errlen) {
  const int fd = kn_durable_open(path, tmp, tmplen, "profile", err, errlen);
  FILE *f = fd < 0 ? NULL : fdopen(fd, "w");
  if (fd >= 0 && !f) {
    snprintf(err, errlen, "profile: cannot open %s: %s", tmp[0] ? tmp : path, strerror(errno));
    close(fd);
    if (tmp[0]) remove(tmp);
  }
  return f;
}

static int finish_file(FILE *f, const char *tmp, const char *path, char *err, size_t errlen) {
  int bad = ferror(f);
  if (fclose(f) != 0) bad = 1;
  if (bad || (tmp[0] && rename(tmp, path) != 0)) {
    snprintf(err, errlen, "profile: cannot write %s: %s", path, strerror(errno));
    if (tmp[0]) remove(tmp);
    return KN_EIO;
  }
  return KN_OK;
}

int kn_profile_write_trace(const kn_profile *p, const kn_graph *g, const char *path, char *err,
                           size_t errlen) {
  char tmp[4200];
  FILE *f = open_file(path, tmp, sizeof tmp, err, errlen);
  if (!f) return KN_EIO;
  fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", f);
  fputs(
      "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"kiln-train\"}},\n"
      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"steps\"}},\n"
      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":2,\"args\":{\"name\":\"ops\"}}",
      f);
  for (size_t i = 0; i < p->n; i++) {
    const prof_event *e = &p->events[i];
    char label[160];
    if (e->node >= 0)
      node_label(g, e->node, label, sizeof label);
    else
      snprintf(label, sizeof label, "%s", e->phase);
    const char *cat = e->node < 0   ? (strcmp(e->phase, "step") == 0 ? "step" : "phase")
                      : e->backward ? "backward"
                                    : "forward";
    fputs(",\n{\"name\":\"", f);
    json_text(f, label);
    fprintf(f,
            "\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
            "\"args\":{\"step\":%lld",
            cat, e->node < 0 && strcmp(e->phase, "step") == 0 ? 1 : 2, e->start * 1e6, e->dur * 1e6,
            (long long)e->step);
    if (e->node >= 0)
      fprintf(f, ",\"node\":%d,\"op\":\"%s\",\"bytes\":%zu", e->node,
              kn_op_name(g->nodes[e->node].op), e->bytes);
    fputs("}}", f);
  }
  fprintf(f, "\n],\"otherData\":{\"arena_bytes\":%zu}}\n", g->arena_bytes);
  return finish_file(f, tmp, path, err, errlen);
}

typedef struct row {
  int node; /* -1: a phase */
  const char *phase;
  int calls;
  double total;
  size_t bytes;
} row;

static int by_total(const void *a, const void *b) {
  double x = ((const row *)a)->total, y = ((const row *)b)->total;
  return x < y ? 1 : x > y ? -1 : 0;
}

int kn_profile_write_table(const kn_profile *p, const kn_graph *g, const char *path, int top_n,
                           char *err, size_t errlen) {
  row *rows = calloc((size_t)g->n_nodes + 8, sizeof *rows);
  if (!rows) {
    snprintf(err, errlen, "profile: out of memory");
    return KN_ENOMEM;
  }
  static const char *const phases[] = {"data", "feed", "metrics", "optimizer"};
  const int n_phases = 4;
  double step_total = 0;
  int steps = 0;
  for (int i = 0; i < g->n_nodes; i++) rows[i].node = i;
  for (int k = 0; k < n_phases; k++) {
    rows[g->n_nodes + k].node = -1;
    rows[g->n_nodes + k].phase = phases[k];
  }
  for (size_t i = 0; i < p->n; i++) {
    const prof_event *e = &p->events[i];
    row *r = NULL;
    if (e->node >= 0) {
      r = &rows[e->node];
      r->bytes = e->bytes;
    } else if (strcmp(e->phase, "step") == 0) {
      step_total += e->dur;
      steps++;
    } else {
      for (int k = 0; k < n_phases; k++)
        if (strcmp(e->phase, phases[k]) == 0) r = &rows[g->n_nodes + k];
    }
    if (r) {
      r->calls++;
      r->total += e->dur;
    }
  }
  const int n_rows = g->n_nodes + n_phases;
  qsort(rows, (size_t)n_rows, sizeof *rows, by_total);
  char tmp[4200];
  FILE *f = open_file(path, tmp, sizeof tmp, err, errlen);
  if (!f) {
    free(rows);
    return KN_EIO;
  }
  fprintf(f, "%d profiled steps, %.3f ms a step on average; activations arena %.2f MiB\n", steps,
          steps ? step_total / steps * 1e3 : 0.0, g->arena_bytes / 1048576.0);
  if (g->where) { /* kernels on GPUs: what their values cost in copies */
    const double per = steps > 0 ? 1e6 * steps : 1e6;
    fprintf(f,
            "GPU values: %.2f MiB held on the devices; copied %.3f MB to them and %.3f MB back a "
            "profiled step (over the graph's life, %.1f MB and %.1f MB)\n",
            g->device_bytes / 1048576.0, g->profiled_in / per, g->profiled_out / per,
            g->copied_in / 1e6, g->copied_out / 1e6);
  }
  fprintf(f, "%-4s %-48s %-9s %6s %10s %9s %7s %12s\n", "rank", "node", "pass", "calls", "total ms",
          "mean ms", "% step", "output bytes");
  for (int i = 0, shown = 0; i < n_rows && shown < top_n; i++) {
    const row *r = &rows[i];
    if (r->calls == 0) continue;
    char label[160];
    if (r->node >= 0)
      node_label(g, r->node, label, sizeof label);
    else
      snprintf(label, sizeof label, "(%s)", r->phase);
    const char *pass = r->node < 0 ? "-" : r->node >= g->n_forward ? "backward" : "forward";
    fprintf(f, "%-4d %-48.48s %-9s %6d %10.3f %9.4f %6.1f%% %12zu\n", ++shown, label, pass,
            r->calls, r->total * 1e3, r->total * 1e3 / r->calls,
            step_total > 0 ? 100.0 * r->total / step_total : 0.0, r->bytes);
  }
  free(rows);
  return finish_file(f, tmp, path, err, errlen);
}
