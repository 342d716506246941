/* commands_watch.c — `kiln watch` and `kiln submit --wait`: follows a job's
 * metric stream (server-sent events read through libcurl's write callback)
 * with a progress bar, ends with the job's terminal state, checks --require
 * on a job that succeeded, and turns it all into a CI exit code. Also parses
 * --timeout durations and --require expressions. */
#include "kiln.h"

#include <curl/curl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_TRACKED      24   /* metric names shown on the bar */
#define SSE_LINE_BYTES   4096 /* the server's lines are far shorter */
#define BAR_WIDTH        24
#define TTY_REDRAW_S     0.1 /* at most 10 redraws a second on a terminal */
#define LOG_LINE_EVERY_S 5.0 /* without a terminal: a line this often, */
#define EPOCH_LINE_GAP_S 1.0 /* and one at an epoch's end if the last is this old */
#define PLAN_RECHECK_S   2.0 /* how often to look for the job's plan while it is unknown */
#define BURST_S          0.5 /* points arriving this soon after connecting are history */
#define RECONNECTS       10

/* ---- argument values ---- */

double cli_parse_duration(const char *text) {
  double total = 0;
  const char *p = text;
  if (!*p) return -1;
  while (*p) {
    char *end = NULL;
    double v = strtod(p, &end);
    if (end == p || !(v >= 0) || isinf(v) || *p == '-' || *p == '+') return -1;
    if (*end == '\0') {
      if (p != text) return -1; /* "1h30" : a unit is needed after the first part */
      total += v;
      p = end;
    } else if (strncmp(end, "ms", 2) == 0) {
      total += v / 1000, p = end + 2;
    } else if (*end == 's') {
      total += v, p = end + 1;
    } else if (*end == 'm') {
      total += v * 60, p = end + 1;
    } else if (*end == 'h') {
      total += v * 3600, p = end + 1;
    } else {
      return -1;
    }
  }
  return total > 0 ? total : -1;
}

int cli_parse_require(const char *text, cli_require *out, char *err, size_t errlen) {
  static const struct {
    const char *token;
    cli_compare op;
  } ops[] = {{">=", CLI_GE}, {"<=", CLI_LE}, {"==", CLI_EQ}, {">", CLI_GT}, {"<", CLI_LT}};
  memset(out, 0, sizeof *out);
  out->text = text;
  size_t name_len =
      strspn(text, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-");
  if (name_len == 0 || name_len >= sizeof out->name) {
    snprintf(err, errlen,
             "--require '%s': expected NAME OP VALUE with NAME a metric (letters, digits, _ . -), "
             "e.g. 'val_accuracy>=0.88'",
             text);
    return -1;
  }
  memcpy(out->name, text, name_len);
  const char *rest = text + name_len;
  size_t op_len = 0;
  for (size_t i = 0; i < sizeof ops / sizeof ops[0] && !op_len; i++) {
    size_t n = strlen(ops[i].token);
    if (strncmp(rest, ops[i].token, n) == 0) {
      out->op = ops[i].op;
      op_len = n;
    }
  }
  if (!op_len) {
    snprintf(err, errlen, "--require '%s': the comparison must be one of >= > <= < ==", text);
    return -1;
  }
  rest += op_len;
  char *end = NULL;
  out->value = strtod(rest, &end);
  if (end == rest || *end || !isfinite(out->value)) {
    snprintf(err, errlen, "--require '%s': '%s' is not a number", text, rest);
    return -1;
  }
  return 0;
}

int cli_exit_for_state(const char *state) {
  if (!state) return -1;
  if (strcmp(state, "SUCCEEDED") == 0) return CLI_EXIT_OK;
  if (strcmp(state, "FAILED") == 0) return CLI_EXIT_FAILED;
  if (strcmp(state, "CANCELLED") == 0) return CLI_EXIT_CANCELLED;
  return -1;
}

/* ---- the stream ---- */

typedef struct watch {
  cli_client *side; /* requests made while the stream is open */
  char job_id[128]; /* percent-encoded */
  int epochs;       /* from the spec */
  int64_t steps_per_epoch;
  double plan_checked_s;
  /* where the job stands */
  int64_t step, epoch, attempt, last_event_id;
  char names[MAX_TRACKED][48];
  double values[MAX_TRACKED];
  int n_names;
  /* rate for the ETA: a baseline taken after the history burst */
  double connected_s, base_s;
  int64_t base_step;
  int have_base;
  /* the SSE parser */
  char line[SSE_LINE_BYTES];
  size_t line_len;
  char event[32];
  char data[SSE_LINE_BYTES];
  size_t data_len;
  char id[32];
  /* the end */
  int ended;
  int stream_error;
  /* drawing */
  int tty, json_lines;
  double drawn_s;
  int64_t epoch_line_step; /* an epoch ended at this step; print it once all its points are in */
} watch;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void format_duration(double s, char *buf, size_t len) {
  long total = (long)(s + 0.5);
  if (total >= 3600)
    snprintf(buf, len, "%ldh%02ldm", total / 3600, total / 60 % 60);
  else if (total >= 60)
    snprintf(buf, len, "%ldm%02lds", total / 60, total % 60);
  else
    snprintf(buf, len, "%lds", total);
}

/* Reads the job's plan from its progress (total_steps, epochs): the
 * server's one definition, which the dashboard shows too. */
static void read_plan(watch *w) {
  w->plan_checked_s = now_s();
  char *path = cli_printf("/v1/jobs/%s", w->job_id);
  char err[CURL_ERROR_SIZE + 64];
  cli_response resp;
  if (!path ||
      cli_client_request(w->side, "GET", path, NULL, 0, &resp, err, sizeof err) != CLI_OK) {
    free(path);
    return; /* the bar goes on without a percentage */
  }
  json_t *doc = resp.status == 200 ? json_loadb(resp.body, resp.len, 0, NULL) : NULL;
  const json_t *progress = json_object_get(doc, "progress");
  json_int_t total = json_integer_value(json_object_get(progress, "total_steps"));
  json_int_t epochs = json_integer_value(json_object_get(progress, "epochs"));
  if (total > 0 && epochs > 0) {
    w->steps_per_epoch = total / epochs;
    w->epochs = (int)epochs;
  }
  json_decref(doc);
  cli_response_clear(&resp);
  free(path);
}

static void draw(watch *w, int final) {
  char line[1024];
  size_t used = 0;
#define ADD(...)                                                                                   \
  do {                                                                                             \
    int n_ = snprintf(line + used, sizeof line - used, __VA_ARGS__);                               \
    if (n_ > 0) used = used + (size_t)n_ < sizeof line ? used + (size_t)n_ : sizeof line - 1;      \
  } while (0)
  int64_t total = w->steps_per_epoch > 0 ? w->steps_per_epoch * w->epochs : 0;
  if (total > 0) {
    double frac = (double)w->step / (double)total;
    if (frac > 1) frac = 1;
    int filled = (int)(frac * BAR_WIDTH + 0.5);
    ADD("[");
    for (int i = 0; i < BAR_WIDTH; i++) ADD("%c", i < filled ? '#' : '-');
    ADD("] %3d%%  ", (int)(frac * 100));
  }
  ADD("epoch %lld/%d  step %lld", (long long)w->epoch, w->epochs, (long long)w->step);
  if (total > 0) ADD("/%lld", (long long)total);
  double elapsed = now_s() - w->base_s;
  if (total > 0 && w->step > w->base_step && elapsed >= 1 && w->step < total) {
    char eta[32];
    format_duration((double)(total - w->step) * elapsed / (double)(w->step - w->base_step), eta,
                    sizeof eta);
    ADD("  ETA %s", eta);
  }
  for (int i = 0; i < w->n_names; i++) {
    const char *name = w->names[i];
    /* The loss and what validation says; training accuracy etc. stay in `kiln get`. */
    if (strcmp(name, "loss") != 0 && strncmp(name, "val_", 4) != 0) continue;
    ADD("  %s %.4g", name, w->values[i]);
  }
#undef ADD
  if (w->tty) {
    fputs("\r", stderr);
    cli_put_clean(stderr, line);
    fputs("\033[K", stderr);
    if (final) fputc('\n', stderr);
  } else {
    cli_put_clean(stderr, line);
    fputc('\n', stderr);
  }
  w->drawn_s = now_s();
}

static void print_json_line(const json_t *value) {
  char *text = json_dumps(value, JSON_COMPACT);
  if (text) puts(text);
  free(text);
  fflush(stdout);
}

static void on_metric(watch *w, const char *data) {
  json_t *p = json_loads(data, 0, NULL);
  const char *name = cli_string_at(p, "name");
  if (!json_is_object(p) || !name) {
    json_decref(p);
    return;
  }
  if (w->json_lines) print_json_line(p); /* watch -o json: the points as they come */
  int64_t step = json_integer_value(json_object_get(p, "step"));
  int64_t epoch = json_integer_value(json_object_get(p, "epoch"));
  int64_t attempt = json_integer_value(json_object_get(p, "attempt"));
  const json_t *value = json_object_get(p, "value");
  double now = now_s();
  if (w->epoch_line_step && step != w->epoch_line_step && !w->tty && !w->json_lines) {
    if (now - w->drawn_s >= EPOCH_LINE_GAP_S) draw(w, 0); /* that epoch's points are all in */
    w->epoch_line_step = 0;
  }
  if (attempt != w->attempt) w->plan_checked_s = 0; /* a new attempt may plan anew */
  w->attempt = attempt;
  w->step = step;
  w->epoch = epoch;
  /* The rate counts from the first point seen live: a replayed history
   * (the burst after connecting) moves the baseline along with it. */
  if (!w->have_base || now - w->connected_s < BURST_S || step < w->base_step) {
    w->have_base = 1;
    w->base_s = now;
    w->base_step = step;
  }
  int slot = -1;
  for (int i = 0; i < w->n_names; i++)
    if (strcmp(w->names[i], name) == 0) slot = i;
  if (slot < 0 && w->n_names < MAX_TRACKED) {
    slot = w->n_names++;
    snprintf(w->names[slot], sizeof w->names[slot], "%s", name);
  }
  if (slot >= 0) w->values[slot] = json_is_number(value) ? json_number_value(value) : NAN;
  /* An epoch's own metrics arrive at its last step: that gives the plan too. */
  int epoch_end = strncmp(name, "epoch_", 6) == 0 || strncmp(name, "val_", 4) == 0;
  if (epoch_end && w->steps_per_epoch <= 0 && epoch > 0 && step % epoch == 0)
    w->steps_per_epoch = step / epoch;
  if (w->steps_per_epoch <= 0 && now - w->plan_checked_s >= PLAN_RECHECK_S) read_plan(w);
  json_decref(p);
  if (w->json_lines) return;
  if (w->tty) {
    if (now - w->drawn_s >= TTY_REDRAW_S) draw(w, 0);
  } else if (epoch_end) {
    w->epoch_line_step = step;
  } else if (now - w->drawn_s >= LOG_LINE_EVERY_S) {
    draw(w, 0);
  }
}

/* One complete event (a blank line ended it). Returns 1 to end the stream. */
static int dispatch(watch *w) {
  int stop = 0;
  if (w->id[0]) w->last_event_id = strtoll(w->id, NULL, 10);
  if (strcmp(w->event, "metric") == 0) {
    on_metric(w, w->data);
  } else if (strcmp(w->event, "end") == 0) { /* finish() reads the job's end state */
    w->ended = 1;
    stop = 1;
  } else if (strcmp(w->event, "error") == 0) {
    w->stream_error = 1;
    stop = 1;
  }
  w->event[0] = w->id[0] = '\0';
  w->data_len = 0;
  w->data[0] = '\0';
  return stop;
}

/* One line of the stream: "field: value", a ":" comment, or blank. */
static int on_line(watch *w, char *line) {
  size_t len = strlen(line);
  if (len && line[len - 1] == '\r') line[--len] = '\0';
  if (len == 0) return dispatch(w);
  if (line[0] == ':') return 0; /* keep-alive */
  char *value = strchr(line, ':');
  if (!value) return 0;
  *value++ = '\0';
  if (*value == ' ') value++;
  if (strcmp(line, "event") == 0) {
    snprintf(w->event, sizeof w->event, "%s", value);
  } else if (strcmp(line, "id") == 0) {
    snprintf(w->id, sizeof w->id, "%s", value);
  } else if (strcmp(line, "data") == 0) {
    int n = snprintf(w->data + w->data_len, sizeof w->data - w->data_len, "%s%s",
                     w->data_len ? "\n" : "", value);
    if (n > 0) w->data_len += (size_t)n < sizeof w->data - w->data_len ? (size_t)n : 0;
  }
  return 0;
}

static int on_stream_data(const char *data, size_t len, void *user) {
  watch *w = user;
  for (size_t i = 0; i < len; i++) {
    if (data[i] != '\n') {
      if (w->line_len + 1 < sizeof w->line) w->line[w->line_len++] = data[i];
      continue;
    }
    w->line[w->line_len] = '\0';
    w->line_len = 0;
    if (on_line(w, w->line)) return 1;
  }
  return 0;
}

/* ---- the end: summary and requirements ---- */

static int compare(double got, cli_compare op, double want) {
  switch (op) {
  case CLI_GE: return got >= want;
  case CLI_GT: return got > want;
  case CLI_LE: return got <= want;
  case CLI_LT: return got < want;
  case CLI_EQ: return fabs(got - want) <= 1e-9 * fmax(1.0, fabs(want));
  }
  return 0;
}

int cli_check_requires(const cli_options *opts, const json_t *job) {
  FILE *out = opts->output == CLI_OUTPUT_JSON ? stderr : stdout;
  const json_t *latest = json_object_get(job, "latest_metrics");
  int unmet = 0;
  for (int i = 0; i < opts->n_requires; i++) {
    const cli_require *r = &opts->requires[i];
    const json_t *value = json_object_get(latest, r->name);
    fputs("require ", out);
    cli_put_clean(out, r->text);
    if (!json_is_number(value)) {
      unmet++;
      fputs(": NOT MET: the job reported no metric '", out);
      cli_put_clean(out, r->name);
      fputs("' (it has:", out);
      const char *name;
      const json_t *v;
      json_object_foreach((json_t *)latest, name, v) {
        fputc(' ', out);
        cli_put_clean(out, name);
      }
      fputs(json_object_size(latest) ? ")\n" : " none)\n", out);
      continue;
    }
    double got = json_number_value(value);
    int met = compare(got, r->op, r->value);
    unmet += !met;
    fprintf(out, ": %s (%s = %.6g)\n", met ? "met" : "NOT MET", r->name, got);
  }
  return unmet;
}

static void print_summary(const json_t *job) {
  const char *id = cli_job_id_of(job), *state = cli_string_at(job, "state");
  const char *reason = cli_string_at(job, "reason"), *message = cli_string_at(job, "message");
  fputs("job ", stdout);
  cli_put_clean(stdout, id ? id : "-");
  fputc(' ', stdout);
  cli_put_clean(stdout, state ? state : "-");
  if (reason && *reason) {
    fputs(" (", stdout);
    cli_put_clean(stdout, reason);
    fputc(')', stdout);
  }
  if (message && *message) {
    fputs(": ", stdout);
    cli_put_clean(stdout, message);
  }
  fputc('\n', stdout);
  const char *name;
  const json_t *value;
  json_object_foreach(json_object_get(job, "latest_metrics"), name, value) {
    char text[64];
    cli_format_value(value, text, sizeof text);
    fputs("  ", stdout);
    cli_put_clean(stdout, name);
    fputc(' ', stdout);
    cli_put_clean(stdout, text);
    fputc('\n', stdout);
  }
}

/* Reads the job once more and decides the exit code. */
static int finish(cli_client *client, const cli_options *opts, watch *w) {
  char *path = cli_printf("/v1/jobs/%s", w->job_id);
  json_t *job = NULL;
  int exit_code =
      path ? cli_call_api(client, "GET", path, NULL, 0, &job) : cli_fail("out of memory");
  free(path);
  if (exit_code != CLI_EXIT_OK) return exit_code;
  const char *state = cli_string_at(job, "state");
  const char *id = cli_job_id_of(job);
  /* A job that ended just as the time ran out counts as ended. */
  exit_code = cli_exit_for_state(state);
  if (opts->output == CLI_OUTPUT_JSON && opts->wait)
    cli_print_json(job);
  else if (opts->output == CLI_OUTPUT_JSON) /* one more JSON line after the points */
    print_json_line(job);
  else
    print_summary(job);
  if (exit_code < 0) {
    fprintf(stderr, "kiln: timed out after %gs; job ", opts->timeout_s);
    cli_put_clean(stderr, id ? id : "-");
    fprintf(stderr, " is %s and goes on ('kiln cancel ", state ? state : "-");
    cli_put_clean(stderr, id ? id : "-");
    fputs("' stops it)\n", stderr);
    json_decref(job);
    return CLI_EXIT_TIMEOUT;
  }
  if (exit_code == CLI_EXIT_OK && opts->n_requires > 0) {
    int unmet = cli_check_requires(opts, job);
    if (unmet) {
      fprintf(stderr, "kiln: %d of %d requirement(s) not met\n", unmet, opts->n_requires);
      exit_code = CLI_EXIT_UNMET;
    }
  } else if (opts->n_requires > 0) {
    fprintf(stderr, "kiln: requirements not checked: the job ended %s\n", state);
  }
  json_decref(job);
  return exit_code;
}

int cli_watch_job(cli_client *client, const cli_options *opts, const char *job_id) {
  watch *w = calloc(1, sizeof *w);
  char *escaped = cli_url_escape(job_id);
  char *stream_path = escaped ? cli_printf("/v1/jobs/%s/metrics:watch", escaped) : NULL;
  char *job_path = escaped ? cli_printf("/v1/jobs/%s", escaped) : NULL;
  char err[CURL_ERROR_SIZE + 256];
  json_t *job = NULL;
  int exit_code = CLI_EXIT_FAILED;
  if (!w || !stream_path || !job_path) {
    exit_code = cli_fail("out of memory");
    goto cleanup;
  }
  if (strlen(escaped) >= sizeof w->job_id) {
    exit_code = cli_usage_error("'%s' is too long for a job id", job_id);
    goto cleanup;
  }
  snprintf(w->job_id, sizeof w->job_id, "%s", escaped);
  w->side = cli_client_clone(client, err, sizeof err);
  if (!w->side) {
    exit_code = cli_fail("%s", err);
    goto cleanup;
  }
  exit_code = cli_call_api(client, "GET", job_path, NULL, 0, &job);
  if (exit_code != CLI_EXIT_OK) goto cleanup;
  json_int_t epochs = json_integer_value(json_object_get(json_object_get(job, "spec"), "epochs"));
  w->epochs = epochs > 0 && epochs < 1000000 ? (int)epochs : 1;
  w->tty = isatty(fileno(stderr));
  /* watch -o json streams the points; submit --wait -o json prints only the
   * final job, one document a script can read. */
  w->json_lines = opts->output == CLI_OUTPUT_JSON && !opts->wait;
  if (!w->json_lines) {
    const char *state = cli_string_at(job, "state");
    fputs("watching job ", stderr);
    cli_put_clean(stderr, job_id);
    fprintf(stderr, " (%s)\n", state ? state : "-");
  }
  read_plan(w);

  double start = now_s(), deadline = opts->timeout_s > 0 ? start + opts->timeout_s : 0;
  int failures = 0;
  while (!w->ended) {
    long timeout_ms = 0;
    if (deadline > 0) {
      double left = deadline - now_s();
      if (left <= 0) break; /* finish() tells a job that has not ended */
      timeout_ms = (long)(left * 1000) + 1;
    }
    char last_id[64] = "";
    if (w->last_event_id > 0)
      snprintf(last_id, sizeof last_id, "Last-Event-ID: %lld", (long long)w->last_event_id);
    cli_response resp;
    int64_t seen_before = w->last_event_id;
    w->connected_s = now_s();
    w->line_len = 0;
    w->data_len = 0;
    w->event[0] = w->id[0] = '\0';
    int rc = cli_client_stream(client, stream_path, last_id[0] ? last_id : NULL, timeout_ms,
                               on_stream_data, w, &resp, err, sizeof err);
    if (rc == CLI_ERR_TIMEOUT && deadline > 0 && now_s() >= deadline - 0.01) break;
    if (rc == CLI_OK && (resp.status < 200 || resp.status >= 300)) {
      exit_code = cli_report_answer(client, "GET", stream_path, &resp);
      cli_response_clear(&resp);
      goto cleanup;
    }
    if (rc == CLI_OK) cli_response_clear(&resp);
    if (w->ended) break;
    if (w->last_event_id != seen_before) failures = 0; /* it was working: count afresh */
    /* The stream broke off (the server restarted, the network blinked):
     * reconnect and go on after the last event seen. */
    if (rc == CLI_ERR_INTERNAL || rc == CLI_ERR_RESPONSE || ++failures > RECONNECTS) {
      exit_code = rc == CLI_OK ? cli_fail("the metric stream of job %s keeps ending early%s",
                                          job_id, w->stream_error ? " with an error" : "")
                               : cli_report_transport(client, rc, "GET", stream_path, err);
      goto cleanup;
    }
    sleep(1);
  }
  if (!w->json_lines && w->n_names > 0) draw(w, 1); /* where it ended */
  exit_code = finish(client, opts, w);

cleanup:
  if (w) cli_client_free(w->side);
  free(w);
  json_decref(job);
  free(job_path);
  free(stream_path);
  free(escaped);
  return exit_code;
}

int cli_cmd_watch(cli_client *client, const cli_options *opts) {
  const char *arg = opts->args[0];
  const char *id = strncmp(arg, "jobs/", 5) == 0 ? arg + 5 : arg;
  if (!*id) return cli_usage_error("watch needs a job id, got '%s'", arg);
  return cli_watch_job(client, opts, id);
}
