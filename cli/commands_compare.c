/* commands_compare.c — kiln's commands for people who compare runs:
 * `compare JOB JOB...` (the spec fields that differ, as flattened paths,
 * and the final metrics side by side) and `profile JOB` (the step profile
 * table and where the job's Chrome trace is served). */
#include "kiln.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_JOBS 8 /* compare's columns, beside the field's */

/* ---- compare ---- */

/* Adds every leaf of value under path to flat ({"optimizer.learning_rate":
 * 0.01, "model.layers[1].units": 16}); an empty object or array is a leaf. */
static void flatten(const char *path, json_t *value, json_t *flat) {
  char key[512];
  if (json_is_object(value) && json_object_size(value) > 0) {
    const char *name;
    json_t *child;
    json_object_foreach(value, name, child) {
      snprintf(key, sizeof key, "%s%s%s", path, *path ? "." : "", name);
      flatten(key, child, flat);
    }
  } else if (json_is_array(value) && json_array_size(value) > 0) {
    size_t i;
    json_t *child;
    json_array_foreach(value, i, child) {
      snprintf(key, sizeof key, "%s[%zu]", path, i);
      flatten(key, child, flat);
    }
  } else {
    json_object_set(flat, path, value);
  }
}

/* Each key of any of the n objects, sorted, as a JSON array of strings. */
static json_t *key_union(json_t *const *objects, int n) {
  json_t *seen = json_object();
  for (int j = 0; j < n; j++) {
    const char *name;
    json_t *value;
    json_object_foreach(objects[j], name, value) json_object_set_new(seen, name, json_true());
  }
  json_t *keys = json_array();
  const char *name;
  json_t *value;
  json_object_foreach(seen, name, value) json_array_append_new(keys, json_string(name));
  json_decref(seen);
  /* Insertion-ordered objects: sort the names so paths of one part stay together. */
  size_t count = json_array_size(keys);
  for (size_t i = 1; i < count; i++)
    for (size_t k = i; k > 0 && strcmp(json_string_value(json_array_get(keys, k - 1)),
                                       json_string_value(json_array_get(keys, k))) > 0;
         k--) {
      json_t *a = json_incref(json_array_get(keys, k - 1));
      json_array_set(keys, k - 1, json_array_get(keys, k));
      json_array_set_new(keys, k, a);
    }
  return keys;
}

/* One row of the table: a label, then each job's value of key in objects. */
typedef struct table {
  const char **cells;
  char (*text)[CLI_CELL_BYTES];
  int rows, columns, cap;
} table;

static int add_row(table *t, const char *label, json_t *const *objects, int n, const char *key) {
  if (t->rows == t->cap) {
    int cap = t->cap ? t->cap * 2 : 32;
    const char **cells = realloc(t->cells, (size_t)cap * (size_t)t->columns * sizeof *cells);
    if (cells) t->cells = cells;
    char(*text)[CLI_CELL_BYTES] = realloc(t->text, (size_t)cap * (size_t)t->columns * sizeof *text);
    if (text) t->text = text;
    if (!cells || !text) return -1;
    t->cap = cap;
  }
  size_t base = (size_t)t->rows * (size_t)t->columns;
  snprintf(t->text[base], CLI_CELL_BYTES, "%s", label);
  for (int j = 0; j < n; j++)
    cli_format_value(json_object_get(objects[j], key), t->text[base + 1 + (size_t)j],
                     CLI_CELL_BYTES);
  t->rows++;
  return 0;
}

/* 1 when the n objects do not all hold the same value at key. */
static int differs(json_t *const *objects, int n, const char *key) {
  for (int j = 1; j < n; j++)
    if (!json_equal(json_object_get(objects[0], key), json_object_get(objects[j], key))) return 1;
  return 0;
}

int cli_cmd_compare(cli_client *client, const cli_options *opts) {
  json_t *jobs[MAX_JOBS] = {NULL}, *specs[MAX_JOBS] = {NULL}, *metrics[MAX_JOBS] = {NULL};
  json_t *facts[MAX_JOBS] = {NULL};
  const int n = opts->n_args < MAX_JOBS ? opts->n_args : MAX_JOBS;
  int exit_code = CLI_EXIT_OK;
  for (int j = 0; j < n && exit_code == CLI_EXIT_OK; j++) {
    exit_code = cli_get_job(client, opts->args[j], &jobs[j]);
    if (exit_code != CLI_EXIT_OK) break;
    specs[j] = json_object();
    flatten("", json_object_get(jobs[j], "spec"), specs[j]);
    metrics[j] = json_object_get(jobs[j], "latest_metrics");
    if (!json_is_object(metrics[j]))
      metrics[j] = json_object();
    else
      json_incref(metrics[j]);
    /* What the run came to, beside its metrics. */
    char progress[CLI_CELL_BYTES];
    cli_format_progress(json_object_get(jobs[j], "progress"), progress, sizeof progress);
    facts[j] = json_pack("{s:O?,s:s,s:O?}", "state", json_object_get(jobs[j], "state"), "steps",
                         progress, "run_seconds", json_object_get(jobs[j], "run_seconds"));
  }
  json_t *spec_keys = exit_code == CLI_EXIT_OK ? key_union(specs, n) : NULL;
  json_t *metric_keys = exit_code == CLI_EXIT_OK ? key_union(metrics, n) : NULL;
  if (exit_code != CLI_EXIT_OK) {
    /* reported */
  } else if (opts->output == CLI_OUTPUT_JSON) {
    json_t *doc = json_object(), *ids = json_array(), *diff = json_object(),
           *finals = json_object();
    for (int j = 0; j < n; j++) json_array_append_new(ids, json_string(cli_job_id_of(jobs[j])));
    size_t i;
    json_t *key;
    json_array_foreach(spec_keys, i, key) {
      const char *path = json_string_value(key);
      if (!differs(specs, n, path)) continue;
      json_t *values = json_array();
      for (int j = 0; j < n; j++) {
        json_t *v = json_object_get(specs[j], path);
        json_array_append(values, v ? v : json_null());
      }
      json_object_set_new(diff, path, values);
    }
    json_array_foreach(metric_keys, i, key) {
      json_t *values = json_array();
      for (int j = 0; j < n; j++) {
        json_t *v = json_object_get(metrics[j], json_string_value(key));
        json_array_append(values, v ? v : json_null());
      }
      json_object_set_new(finals, json_string_value(key), values);
    }
    json_object_set_new(doc, "jobs", ids);
    json_object_set_new(doc, "spec_differences", diff);
    json_object_set_new(doc, "final_metrics", finals);
    cli_print_json(doc);
    json_decref(doc);
  } else {
    const char *headers[MAX_JOBS + 1] = {"FIELD"};
    size_t max_cols[MAX_JOBS + 1] = {60};
    for (int j = 0; j < n; j++) {
      const char *id = cli_job_id_of(jobs[j]);
      headers[j + 1] = id ? id : opts->args[j];
      max_cols[j + 1] = 40;
    }
    table t = {.columns = n + 1};
    static const char *const fact_keys[] = {"state", "steps", "run_seconds"};
    int failed = 0;
    for (size_t k = 0; k < sizeof fact_keys / sizeof fact_keys[0]; k++)
      failed |= add_row(&t, fact_keys[k], facts, n, fact_keys[k]);
    int differing = 0;
    size_t i;
    json_t *key;
    json_array_foreach(spec_keys, i, key) {
      const char *path = json_string_value(key);
      if (!differs(specs, n, path) || strcmp(path, "display_name") == 0) continue;
      char label[CLI_CELL_BYTES];
      snprintf(label, sizeof label, "spec.%s", path);
      failed |= add_row(&t, label, specs, n, path);
      differing++;
    }
    json_array_foreach(metric_keys, i, key) {
      char label[CLI_CELL_BYTES];
      snprintf(label, sizeof label, "final %s", json_string_value(key));
      failed |= add_row(&t, label, metrics, n, json_string_value(key));
    }
    if (failed) {
      exit_code = cli_fail("out of memory");
    } else {
      for (int r = 0; r < t.rows * t.columns; r++) t.cells[r] = t.text[r];
      cli_print_table(headers, max_cols, t.columns, t.cells, t.rows);
      if (differing == 0) puts("(the specs are the same but for display_name)");
    }
    free(t.cells);
    free(t.text);
  }
  json_decref(spec_keys);
  json_decref(metric_keys);
  for (int j = 0; j < n; j++) {
    json_decref(jobs[j]);
    json_decref(specs[j]);
    json_decref(metrics[j]);
    json_decref(facts[j]);
  }
  return exit_code;
}

/* ---- profile ---- */

static int stop_at_first_bytes(const char *data, size_t len, void *user) {
  (void)data;
  (void)len;
  (void)user;
  return 1; /* that the trace is served is all we ask */
}

int cli_cmd_profile(cli_client *client, const cli_options *opts) {
  int exit_code = CLI_EXIT_OK;
  char *id = cli_job_path_id(opts->args[0], &exit_code);
  if (!id) return exit_code;
  char *table_path = cli_printf("/v1/jobs/%s/profile?format=table", id);
  char *trace_path = cli_printf("/v1/jobs/%s/profile", id);
  char err[CURL_ERROR_SIZE + 256];
  cli_response resp;
  int rc = table_path && trace_path
               ? cli_client_request(client, "GET", table_path, NULL, 0, &resp, err, sizeof err)
               : CLI_ERR_INTERNAL;
  if (!table_path || !trace_path) {
    exit_code = cli_fail("out of memory");
  } else if (rc != CLI_OK) {
    exit_code = cli_report_transport(client, rc, "GET", table_path, err);
  } else if (resp.status < 200 || resp.status >= 300) {
    exit_code = cli_report_answer(client, "GET", table_path, &resp);
    cli_response_clear(&resp);
  } else {
    fwrite(resp.body, 1, resp.len, stdout);
    if (resp.len > 0 && resp.body[resp.len - 1] != '\n') fputc('\n', stdout);
    cli_response_clear(&resp);
    rc = cli_client_stream(client, trace_path, NULL, 0, stop_at_first_bytes, NULL, &resp, err,
                           sizeof err);
    if (rc == CLI_OK && resp.status >= 200 && resp.status < 300)
      printf("trace: %s%s (Chrome trace-event JSON, with the token; open it in Perfetto or "
             "chrome://tracing)\n",
             cli_client_server(client), trace_path);
    else
      puts("trace: none served");
    if (rc == CLI_OK) cli_response_clear(&resp);
  }
  free(table_path);
  free(trace_path);
  free(id);
  return exit_code;
}
