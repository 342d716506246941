/* commands_files.c — kiln's file commands: `ckpt ls|download|pin|unpin`
 * (a download is checked against the checkpoint's SHA-256 before it takes
 * its name), `export` (a checkpoint's model as ONNX) and `datasets
 * upload|ls` (an upload streams the file). */
#include "kiln.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

/* ---- ckpt ---- */

static int ckpt_usage(void) {
  return cli_usage_error("ckpt takes 'ls JOB', 'download JOB [STEP] [-O FILE]', 'pin JOB STEP' or "
                         "'unpin JOB STEP' (--id: CKPT is the checkpoint's id, not its step)");
}

/* A whole number as typed (a step may be 0; an id, also "jobs/J/checkpoints/N", is >= 1). */
static const char *ckpt_number(const char *arg, int by_id) {
  const char *slash = by_id ? strrchr(arg, '/') : NULL;
  const char *n = slash ? slash + 1 : arg;
  if (!*n || strspn(n, "0123456789") != strlen(n) || strlen(n) > 18) return NULL;
  if (by_id && strspn(n, "0") == strlen(n)) return NULL;
  return n;
}

static int get_checkpoints(cli_client *client, const char *job, json_t **doc) {
  char *path = cli_printf("/v1/jobs/%s/checkpoints", job);
  int exit_code =
      path ? cli_call_api(client, "GET", path, NULL, 0, doc) : cli_fail("out of memory");
  free(path);
  return exit_code;
}

/* The internal id of the checkpoint the user named: by step (the newest
 * at that step, should a resumed attempt have written it again), with --id
 * as it is, or the newest of all when number is NULL (`what`, "download" or
 * "export", names the action in the error of a job with none). Exit code;
 * id (32 bytes) and, when step is not NULL, the step (-1 for --id) filled
 * on CLI_EXIT_OK. */
static int resolve_checkpoint(cli_client *client, const cli_options *opts, const char *job,
                              const char *number, const char *what, char *id, json_int_t *step) {
  if (step) *step = -1;
  if (number && opts->by_id) {
    snprintf(id, 32, "%s", number);
    return CLI_EXIT_OK;
  }
  json_t *doc = NULL;
  int exit_code = get_checkpoints(client, job, &doc);
  if (exit_code != CLI_EXIT_OK) return exit_code;
  long long want = number ? atoll(number) : -1;
  json_int_t found = 0, found_step = -1;
  size_t i;
  const json_t *c;
  json_array_foreach(json_object_get(doc, "checkpoints"), i, c) { /* oldest first */
    json_int_t at = json_integer_value(json_object_get(c, "step"));
    if (want < 0 || at == want) {
      found = json_integer_value(json_object_get(c, "id"));
      found_step = at;
    }
  }
  json_decref(doc);
  if (!found && want < 0) return cli_fail("job %s has no checkpoints to %s", job, what);
  if (!found)
    return cli_fail("job %s has no checkpoint at step %lld (see 'kiln ckpt ls %s')", job, want,
                    job);
  snprintf(id, 32, "%" JSON_INTEGER_FORMAT, found);
  if (step) *step = found_step;
  return CLI_EXIT_OK;
}

/* "loss=0.25 val_loss=0.31": the metrics a checkpoint was written at. */
static void format_metrics(const json_t *metrics, char *buf, size_t len) {
  size_t used = 0;
  const char *name;
  const json_t *value;
  buf[0] = '\0';
  json_object_foreach((json_t *)metrics, name, value) {
    char text[64];
    cli_format_value(value, text, sizeof text);
    int n = snprintf(buf + used, len - used, "%s%s=%s", used ? " " : "", name, text);
    if (n < 0 || (size_t)n >= len - used) break;
    used += (size_t)n;
  }
}

static int ckpt_ls(cli_client *client, const cli_options *opts, const char *job) {
  json_t *doc = NULL;
  int exit_code = get_checkpoints(client, job, &doc);
  if (exit_code != CLI_EXIT_OK) return exit_code;
  const json_t *list = json_object_get(doc, "checkpoints");
  size_t rows = json_array_size(list);
  if (opts->output == CLI_OUTPUT_JSON) {
    cli_print_json(doc);
  } else if (rows == 0) {
    fputs("kiln: the job has no checkpoints\n", stderr);
  } else {
    enum { COLUMNS = 8 };
    static const char *const headers[COLUMNS] = {"STEP",  "BEST",    "METRICS", "PINNED",
                                                 "BYTES", "ATTEMPT", "CREATED", "ID"};
    static const size_t max_cols[COLUMNS] = {20, 4, 80, 6, 20, 10, 40, 20};
    static const char *const keys[COLUMNS] = {"step",  "best",    "metrics",     "pinned",
                                              "bytes", "attempt", "create_time", "id"};
    const char **cells = calloc(rows * COLUMNS, sizeof *cells);
    char(*text)[COLUMNS][CLI_CELL_BYTES] = calloc(rows, sizeof *text);
    if (!cells || !text) {
      exit_code = cli_fail("out of memory");
    } else {
      for (size_t r = 0; r < rows; r++) {
        const json_t *c = json_array_get(list, r);
        for (int k = 0; k < COLUMNS; k++) {
          const json_t *v = json_object_get(c, keys[k]);
          if (k == 1)
            snprintf(text[r][k], CLI_CELL_BYTES, "%s", json_is_true(v) ? "*" : "");
          else if (k == 2)
            format_metrics(v, text[r][k], CLI_CELL_BYTES);
          else
            cli_format_value(v, text[r][k], CLI_CELL_BYTES);
          cells[r * COLUMNS + (size_t)k] = text[r][k];
        }
      }
      cli_print_table(headers, max_cols, COLUMNS, cells, (int)rows);
      const char *metric = cli_string_at(doc, "best_metric");
      const char *mode = cli_string_at(doc, "best_mode");
      if (metric) {
        fputs("* best by ", stdout);
        cli_put_clean(stdout, metric);
        printf(" (%s)\n",
               mode && strcmp(mode, "max") == 0 ? "higher is better" : "lower is better");
      }
    }
    free(cells);
    free(text);
  }
  json_decref(doc);
  return exit_code;
}

static int ckpt_pin(cli_client *client, const cli_options *opts, const char *job,
                    const char *number, const char *verb) {
  char id[32];
  int exit_code = resolve_checkpoint(client, opts, job, number, "pin", id, NULL);
  if (exit_code != CLI_EXIT_OK) return exit_code;
  char *path = cli_printf("/v1/jobs/%s/checkpoints/%s:%s", job, id, verb);
  json_t *doc = NULL;
  exit_code = path ? cli_call_api(client, "POST", path, NULL, 0, &doc) : cli_fail("out of memory");
  free(path);
  if (exit_code != CLI_EXIT_OK) return exit_code;
  if (opts->output == CLI_OUTPUT_JSON) {
    cli_print_json(doc);
  } else {
    printf("checkpoint at step %" JSON_INTEGER_FORMAT " of job %s (id %s) %s\n",
           json_integer_value(json_object_get(doc, "step")), job, id,
           json_is_true(json_object_get(doc, "pinned")) ? "pinned" : "unpinned");
  }
  json_decref(doc);
  return exit_code;
}

typedef struct download {
  FILE *file;
  kc_sha256 hash;
  int64_t bytes;
  int write_failed;
} download;

static int on_download_data(const char *data, size_t len, void *user) {
  download *d = user;
  kc_sha256_update(&d->hash, data, len);
  d->bytes += (int64_t)len;
  if (fwrite(data, 1, len, d->file) != len) {
    d->write_failed = 1;
    return 1;
  }
  return 0;
}

/* GETs path into the file part (made anew), its sha256 and size into d;
 * exit code. A failed write or close is the file's error. */
static int fetch_to_file(cli_client *client, const char *path, const char *part, download *d) {
  d->file = fopen(part, "wb");
  if (!d->file) return cli_fail("cannot write '%s': %s", part, strerror(errno));
  kc_sha256_init(&d->hash);
  char err[CURL_ERROR_SIZE + 256];
  cli_response resp;
  int rc = cli_client_stream(client, path, NULL, 0, on_download_data, d, &resp, err, sizeof err);
  if (rc != CLI_OK) return cli_report_transport(client, rc, "GET", path, err);
  int exit_code = CLI_EXIT_OK;
  if (resp.status < 200 || resp.status >= 300)
    exit_code = cli_report_answer(client, "GET", path, &resp);
  cli_response_clear(&resp);
  if (exit_code != CLI_EXIT_OK) return exit_code;
  int close_failed = fclose(d->file) != 0;
  d->file = NULL;
  if (d->write_failed || close_failed)
    return cli_fail("cannot write '%s': %s", part, strerror(errno));
  return CLI_EXIT_OK;
}

static int ckpt_download(cli_client *client, const cli_options *opts, const char *job,
                         const char *id_arg) {
  int exit_code = CLI_EXIT_OK;
  json_t *ckpt = NULL, *list_doc = NULL;
  char *meta_path = NULL, *file_path = NULL, *part = NULL, *out_name = NULL;
  download d = {0};
  char id[32];
  exit_code = resolve_checkpoint(client, opts, job, id_arg, "download", id, NULL);
  if (exit_code != CLI_EXIT_OK) goto cleanup;
  meta_path = cli_printf("/v1/jobs/%s/checkpoints/%s", job, id);
  file_path = meta_path ? cli_printf("%s:download", meta_path) : NULL;
  if (!file_path) {
    exit_code = cli_fail("out of memory");
    goto cleanup;
  }
  exit_code = cli_call_api(client, "GET", meta_path, NULL, 0, &ckpt);
  if (exit_code != CLI_EXIT_OK) goto cleanup;
  const char *want_sha = cli_string_at(ckpt, "sha256");
  json_int_t step = json_integer_value(json_object_get(ckpt, "step"));
  out_name = opts->output_file
                 ? strdup(opts->output_file)
                 : cli_printf("%s-step%" JSON_INTEGER_FORMAT ".safetensors", job, step);
  part = out_name ? cli_printf("%s.part", out_name) : NULL;
  if (!part) {
    exit_code = cli_fail("out of memory");
    goto cleanup;
  }
  exit_code = fetch_to_file(client, file_path, part, &d);
  if (exit_code != CLI_EXIT_OK) goto cleanup;
  uint8_t digest[32];
  char got_sha[65];
  kc_sha256_final(&d.hash, digest);
  kc_sha256_hex(digest, got_sha);
  if (!want_sha || strcmp(want_sha, got_sha) != 0) {
    exit_code = cli_fail("checkpoint %s of job %s arrived with sha256 %s, but the server records "
                         "%s; not keeping it",
                         id, job, got_sha, want_sha ? want_sha : "none");
    goto cleanup;
  }
  if (rename(part, out_name) != 0) {
    exit_code = cli_fail("cannot rename '%s' to '%s': %s", part, out_name, strerror(errno));
    goto cleanup;
  }
  free(part);
  part = NULL; /* nothing left to remove */
  if (opts->output == CLI_OUTPUT_JSON) {
    json_object_set_new(ckpt, "file", json_string(out_name));
    cli_print_json(ckpt);
  } else {
    printf("%s: checkpoint at step %" JSON_INTEGER_FORMAT " of job %s (id %s), %lld bytes, "
           "sha256 %s ok\n",
           out_name, step, job, id, (long long)d.bytes, got_sha);
  }

cleanup:
  if (d.file) fclose(d.file);
  if (part) unlink(part);
  free(part);
  free(out_name);
  free(file_path);
  free(meta_path);
  json_decref(ckpt);
  json_decref(list_doc);
  return exit_code;
}

int cli_cmd_ckpt(cli_client *client, const cli_options *opts) {
  if (opts->n_args < 2) return ckpt_usage();
  const char *verb = opts->args[0];
  int exit_code = CLI_EXIT_OK;
  char *job = cli_job_path_id(opts->args[1], &exit_code);
  if (!job) return exit_code;
  const char *id = opts->n_args >= 3 ? ckpt_number(opts->args[2], opts->by_id) : NULL;
  if (opts->n_args >= 3 && !id) {
    exit_code = cli_usage_error(opts->by_id ? "a checkpoint id is a whole number >= 1 (see 'kiln "
                                              "ckpt ls %s'), got '%s'"
                                            : "a checkpoint is named by its step, a whole number "
                                              "(see 'kiln ckpt ls %s'), got '%s'",
                                opts->args[1], opts->args[2]);
  } else if (opts->output_file && strcmp(verb, "download") != 0) {
    exit_code = cli_usage_error("-O applies to 'kiln ckpt download' only");
  } else if (strcmp(verb, "ls") == 0 && opts->n_args == 2) {
    exit_code = ckpt_ls(client, opts, job);
  } else if (strcmp(verb, "download") == 0 && opts->n_args <= 3) {
    exit_code = ckpt_download(client, opts, job, id);
  } else if ((strcmp(verb, "pin") == 0 || strcmp(verb, "unpin") == 0) && opts->n_args == 3) {
    exit_code = ckpt_pin(client, opts, job, id, verb);
  } else {
    exit_code = ckpt_usage();
  }
  free(job);
  return exit_code;
}

/* ---- export ---- */

/* `kiln export JOB [--step N] [-O FILE]`: the checkpoint of step N (the
 * newest without --step), found in the job's list, as an ONNX file. */
int cli_cmd_export(cli_client *client, const cli_options *opts) {
  int exit_code = CLI_EXIT_OK;
  char *job = cli_job_path_id(opts->args[0], &exit_code);
  if (!job) return exit_code;
  char *end = NULL;
  long long want_step = opts->step ? strtoll(opts->step, &end, 10) : -1;
  char *file_path = NULL, *out_name = NULL, *part = NULL, id[32];
  json_int_t step = -1;
  download d = {0};
  if (opts->step && (!*opts->step || *end || want_step < 0)) {
    exit_code = cli_usage_error("--step must be a whole number >= 0, got '%s'", opts->step);
    goto cleanup;
  }
  exit_code = resolve_checkpoint(client, opts, job, opts->step, "export", id, &step);
  if (exit_code != CLI_EXIT_OK) goto cleanup;
  file_path = cli_printf("/v1/jobs/%s/checkpoints/%s:export?format=onnx", job, id);
  out_name = opts->output_file ? strdup(opts->output_file)
                               : cli_printf("%s-step%" JSON_INTEGER_FORMAT ".onnx", job, step);
  part = out_name ? cli_printf("%s.part", out_name) : NULL;
  if (!file_path || !part) {
    exit_code = cli_fail("out of memory");
    goto cleanup;
  }
  exit_code = fetch_to_file(client, file_path, part, &d);
  if (exit_code != CLI_EXIT_OK) goto cleanup;
  if (rename(part, out_name) != 0) {
    exit_code = cli_fail("cannot write '%s': %s", out_name, strerror(errno));
    goto cleanup;
  }
  free(part);
  part = NULL; /* nothing left to remove */
  uint8_t digest[32];
  char sha[65];
  kc_sha256_final(&d.hash, digest);
  kc_sha256_hex(digest, sha);
  if (opts->output == CLI_OUTPUT_JSON) {
    json_t *doc = json_pack("{s:s, s:s, s:I, s:I, s:I, s:s, s:s}", "file", out_name, "job", job,
                            "checkpoint", (json_int_t)atoll(id), "step", step, "bytes",
                            (json_int_t)d.bytes, "sha256", sha, "format", "onnx");
    cli_print_json(doc);
    json_decref(doc);
  } else {
    printf("%s: ONNX model of job %s, checkpoint %s, step %" JSON_INTEGER_FORMAT
           ", %lld bytes, sha256 %s\n",
           out_name, job, id, step, (long long)d.bytes, sha);
  }

cleanup:
  if (d.file) fclose(d.file);
  if (part) unlink(part);
  free(part);
  free(out_name);
  free(file_path);
  free(job);
  return exit_code;
}

/* ---- datasets ---- */

static int has_suffix(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Appends "&key=escaped(value)" to *query; -1 when out of memory. */
static int add_param(char **query, const char *key, const char *value) {
  if (!value) return 0;
  char *escaped = cli_url_escape(value);
  char *grown = escaped ? cli_printf("%s&%s=%s", *query, key, escaped) : NULL;
  free(escaped);
  if (!grown) return -1;
  free(*query);
  *query = grown;
  return 0;
}

static int datasets_upload(cli_client *client, const cli_options *opts, const char *file_name) {
  const char *format = opts->format;
  if (!format && has_suffix(file_name, ".csv")) format = "csv";
  if (!format)
    return cli_usage_error("--format is needed for '%s': csv (with --label-column), idx or images",
                           file_name);
  if (strcmp(format, "csv") != 0 && strcmp(format, "idx") != 0 && strcmp(format, "images") != 0)
    return cli_usage_error("--format must be csv, idx or images, got '%s'", format);
  if (strcmp(format, "csv") == 0 && !opts->label_column)
    return cli_usage_error("a csv upload needs --label-column NAME (the column to predict)");
  FILE *file = fopen(file_name, "rb");
  struct stat sb;
  if (!file || fstat(fileno(file), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    int saved = errno;
    if (file) fclose(file);
    return cli_usage_error("cannot read '%s': %s", file_name,
                           file ? "not a regular file" : strerror(saved));
  }
  char *query = strdup("");
  int exit_code = CLI_EXIT_OK;
  if (!query || add_param(&query, "format", format) != 0 ||
      add_param(&query, "label_column", opts->label_column) != 0 ||
      add_param(&query, "display_name", opts->display_name) != 0) {
    free(query);
    fclose(file);
    return cli_fail("out of memory");
  }
  char *path = cli_printf("/v1/datasets?%s", query + 1);
  free(query);
  char err[CURL_ERROR_SIZE + 256];
  cli_response resp;
  int rc = path ? cli_client_upload(client, path, file, (int64_t)sb.st_size, &resp, err, sizeof err)
                : CLI_ERR_INTERNAL;
  fclose(file);
  if (!path) return cli_fail("out of memory");
  if (rc != CLI_OK) {
    exit_code = cli_report_transport(client, rc, "POST", path, err);
  } else if (resp.status < 200 || resp.status >= 300) {
    exit_code = cli_report_answer(client, "POST", path, &resp);
  } else {
    json_t *doc = json_loadb(resp.body, resp.len, 0, NULL);
    const char *id = cli_string_at(doc, "id");
    if (!id) {
      exit_code = cli_fail("the server took the upload but its answer has no data set id");
    } else if (opts->output == CLI_OUTPUT_JSON) {
      cli_print_json(doc);
    } else {
      fputs("dataset ", stdout);
      cli_put_clean(stdout, id);
      printf(" %s: %" JSON_INTEGER_FORMAT " examples, %" JSON_INTEGER_FORMAT " distinct labels\n",
             format, json_integer_value(json_object_get(doc, "train_examples")),
             json_integer_value(json_object_get(doc, "classes")));
    }
    json_decref(doc);
  }
  if (rc == CLI_OK) cli_response_clear(&resp);
  free(path);
  return exit_code;
}

static int datasets_ls(cli_client *client, const cli_options *opts) {
  json_t *all = NULL;
  int exit_code = cli_list_all(client, "/v1/datasets", "datasets", &all);
  if (exit_code == CLI_EXIT_OK && opts->output == CLI_OUTPUT_JSON) {
    json_t *wrapper = json_pack("{s:O}", "datasets", all);
    cli_print_json(wrapper);
    json_decref(wrapper);
  } else if (exit_code == CLI_EXIT_OK) {
    enum { COLUMNS = 6 };
    static const char *const headers[COLUMNS] = {"ID",      "FORMAT", "EXAMPLES",
                                                 "CLASSES", "READY",  "NAME"};
    static const char *const keys[COLUMNS] = {"id",      "format", "train_examples",
                                              "classes", "ready",  "display_name"};
    static const size_t max_cols[COLUMNS] = {40, 8, 12, 8, 5, 40};
    size_t rows = json_array_size(all);
    const char **cells = calloc(rows * COLUMNS + 1, sizeof *cells);
    char(*text)[COLUMNS][CLI_CELL_BYTES] = calloc(rows + 1, sizeof *text);
    if (!cells || !text) {
      exit_code = cli_fail("out of memory");
    } else {
      for (size_t r = 0; r < rows; r++) {
        for (int c = 0; c < COLUMNS; c++) {
          cli_format_value(json_object_get(json_array_get(all, r), keys[c]), text[r][c],
                           CLI_CELL_BYTES);
          cells[r * COLUMNS + (size_t)c] = text[r][c];
        }
      }
      cli_print_table(headers, max_cols, COLUMNS, cells, (int)rows);
    }
    free(cells);
    free(text);
  }
  json_decref(all);
  return exit_code;
}

int cli_cmd_datasets(cli_client *client, const cli_options *opts) {
  const char *verb = opts->n_args ? opts->args[0] : "";
  int is_upload = strcmp(verb, "upload") == 0;
  if ((opts->format || opts->label_column || opts->display_name) && !is_upload)
    return cli_usage_error("--format, --label-column and --display-name apply to 'kiln datasets "
                           "upload' only");
  if (is_upload && opts->n_args == 2) return datasets_upload(client, opts, opts->args[1]);
  if (strcmp(verb, "ls") == 0 && opts->n_args == 1) return datasets_ls(client, opts);
  return cli_usage_error("datasets takes 'upload FILE [--format csv|idx|images] [--label-column "
                         "NAME] [--display-name NAME]' or 'ls'");
}
