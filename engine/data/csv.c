/* csv.c — CSV with a header row as a dataset: one label column named by
 * the caller (integers, or class names mapped in sorted order; numbers are
 * also kept as regression targets), every other column a numeric feature.
 * Every cell is checked, and a bad one is named by file, line and column. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine.h"

#define CSV_MAX_BYTES   (1ULL << 30)
#define CSV_MAX_COLUMNS 65536

static char *slurp(const char *path, size_t *len, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    return NULL;
  }
  char *buf = NULL;
  size_t cap = 0, used = 0;
  for (;;) {
    if (used + 65536 + 1 > cap) {
      cap = cap ? cap * 2 : 1 << 20;
      if (cap > CSV_MAX_BYTES + 65536 + 1) {
        snprintf(err, errlen, "%s: larger than the %llu-byte limit for CSV files", path,
                 CSV_MAX_BYTES);
        goto fail;
      }
      char *bigger = realloc(buf, cap);
      if (!bigger) {
        snprintf(err, errlen, "%s: out of memory after %zu bytes", path, used);
        goto fail;
      }
      buf = bigger;
    }
    size_t got = fread(buf + used, 1, 65536, f);
    used += got;
    if (got < 65536) break;
  }
  if (ferror(f)) {
    snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
    goto fail;
  }
  fclose(f);
  buf[used] = '\0';
  *len = used;
  return buf;
fail:
  fclose(f);
  free(buf);
  return NULL;
}

/* Splits one line in place into cells (commas; a cell may be "quoted", with
 * "" for a quote). Returns the cell count, or -1 for an unclosed quote. */
static int split(char *line, char **cells, int max) {
  int n = 0;
  char *p = line;
  for (;;) {
    while (*p == ' ' || *p == '\t') p++;
    char *start = p, *out = p;
    if (*p == '"') {
      start = out = ++p;
      for (;;) {
        if (!*p) return -1;
        if (*p == '"' && p[1] == '"') {
          *out++ = '"';
          p += 2;
        } else if (*p == '"') {
          p++;
          break;
        } else {
          *out++ = *p++;
        }
      }
      while (*p && *p != ',') p++;
    } else {
      while (*p && *p != ',') p++;
      out = p;
      while (out > start && (out[-1] == ' ' || out[-1] == '\t')) out--;
    }
    char sep = *p;
    *out = '\0';
    if (n < max) cells[n] = start;
    n++;
    if (sep != ',') break;
    p++;
  }
  return n;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int kn_dataset_load_csv(const char *path, const char *label_column, kn_dataset *out, char *err,
                        size_t errlen) {
  memset(out, 0, sizeof *out);
  size_t len = 0;
  char *text = slurp(path, &len, err, errlen);
  if (!text) return KN_EIO;
  int rc = KN_EFORMAT;
  char **cells = NULL, **labels = NULL, **names = NULL;
  char *header_copy = NULL;

  /* Lines, in place; \r\n and a missing final newline are fine. */
  int64_t n_lines = 0;
  for (size_t i = 0; i < len; i++) n_lines += text[i] == '\n';
  n_lines += 1;
  char **lines = malloc((size_t)n_lines * sizeof *lines);
  cells = malloc(CSV_MAX_COLUMNS * sizeof *cells);
  if (!lines || !cells) {
    snprintf(err, errlen, "%s: out of memory for %lld lines", path, (long long)n_lines);
    rc = KN_ENOMEM;
    goto out;
  }
  int64_t count = 0;
  for (char *p = text; p && *p;) {
    char *nl = strchr(p, '\n');
    if (nl) *nl = '\0';
    size_t l = strlen(p);
    if (l && p[l - 1] == '\r') p[l - 1] = '\0';
    lines[count++] = p;
    p = nl ? nl + 1 : NULL;
  }
  while (count > 0 && lines[count - 1][0] == '\0') count--; /* trailing blank lines */
  if (count < 2) {
    snprintf(err, errlen, "%s: needs a header line and at least one data line", path);
    goto out;
  }
  int n_cols = split(lines[0], cells, CSV_MAX_COLUMNS);
  if (n_cols < 2 || n_cols > CSV_MAX_COLUMNS) {
    snprintf(err, errlen, "%s: line 1: the header needs 2 to %d columns, got %d", path,
             CSV_MAX_COLUMNS, n_cols < 0 ? 0 : n_cols);
    goto out;
  }
  int label_at = -1;
  for (int c = 0; c < n_cols; c++)
    if (strcmp(cells[c], label_column) == 0) label_at = c;
  if (label_at < 0) {
    snprintf(err, errlen, "%s: line 1: no column named '%s' for the labels", path, label_column);
    goto out;
  }
  /* Column names for messages, before the header's cells are reused. */
  size_t header_bytes = 0;
  for (int c = 0; c < n_cols; c++) header_bytes += strlen(cells[c]) + 1;
  header_copy = malloc(header_bytes);
  names = malloc((size_t)n_cols * sizeof *names);
  if (!header_copy || !names) {
    rc = KN_ENOMEM;
    snprintf(err, errlen, "%s: out of memory", path);
    goto out;
  }
  {
    char *w = header_copy;
    for (int c = 0; c < n_cols; c++) {
      size_t l = strlen(cells[c]);
      memcpy(w, cells[c], l + 1);
      names[c] = w;
      w += l + 1;
    }
  }

  const int64_t n = count - 1;
  const int n_feat = n_cols - 1;
  out->n = n;
  out->ndim = 1;
  out->shape[0] = n_feat;
  out->example_size = (size_t)n_feat;
  out->x = malloc((size_t)n * n_feat * sizeof *out->x);
  out->y = malloc((size_t)n * sizeof *out->y);
  out->targets = malloc((size_t)n * sizeof *out->targets);
  labels = malloc((size_t)n * sizeof *labels);
  if (!out->x || !out->y || !out->targets || !labels) {
    rc = KN_ENOMEM;
    snprintf(err, errlen, "%s: out of memory for %lld rows of %d features", path, (long long)n,
             n_feat);
    goto out;
  }
  int numeric_labels = 1, real_labels = 1;
  for (int64_t r = 0; r < n; r++) {
    const long long line_no = r + 2;
    int got = split(lines[r + 1], cells, CSV_MAX_COLUMNS);
    if (got < 0) {
      snprintf(err, errlen, "%s: line %lld: a quoted cell is not closed", path, line_no);
      goto out;
    }
    if (got != n_cols) {
      snprintf(err, errlen, "%s: line %lld has %d cells, the header has %d columns", path, line_no,
               got, n_cols);
      goto out;
    }
    float *row = out->x + (size_t)r * n_feat;
    for (int c = 0, f = 0; c < n_cols; c++) {
      if (c == label_at) {
        labels[r] = cells[c];
        char *end = NULL;
        errno = 0;
        long v = strtol(cells[c], &end, 10);
        if (!cells[c][0] || *end || errno || v < 0 || v > 1000000) numeric_labels = 0;
        errno = 0;
        float t = strtof(cells[c], &end);
        if (!cells[c][0] || *end || errno == ERANGE || !(t - t == 0.0f)) real_labels = 0;
        out->targets[r] = t;
        continue;
      }
      char *end = NULL;
      errno = 0;
      float v = strtof(cells[c], &end);
      if (!cells[c][0] || *end || errno == ERANGE || v != v) {
        snprintf(err, errlen, "%s: line %lld, column %d ('%s'): '%.40s' is not a number", path,
                 line_no, c + 1, names[c], cells[c]);
        goto out;
      }
      row[f++] = v;
    }
  }
  int max_label = 0;
  if (numeric_labels) {
    for (int64_t r = 0; r < n; r++) {
      out->y[r] = (int32_t)strtol(labels[r], NULL, 10);
      if (out->y[r] > max_label) max_label = out->y[r];
    }
  } else {
    /* Class names: sorted, so the same file always maps to the same ids. */
    char **sorted = malloc((size_t)n * sizeof *sorted);
    if (!sorted) {
      rc = KN_ENOMEM;
      snprintf(err, errlen, "%s: out of memory", path);
      goto out;
    }
    memcpy(sorted, labels, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_str);
    int64_t uniq = 0;
    for (int64_t i = 0; i < n; i++)
      if (i == 0 || strcmp(sorted[i], sorted[uniq - 1]) != 0) sorted[uniq++] = sorted[i];
    for (int64_t r = 0; r < n; r++) {
      char **hit = bsearch(&labels[r], sorted, (size_t)uniq, sizeof *sorted, cmp_str);
      out->y[r] = (int32_t)(hit - sorted);
    }
    max_label = (int)uniq - 1;
    free(sorted);
  }
  out->n_classes = max_label + 1;
  out->value_range = 0.0f; /* unknown: normalize is min-max per feature */
  if (real_labels) {
    out->n_targets = 1;
  } else {
    free(out->targets);
    out->targets = NULL;
  }
  rc = KN_OK;
out:
  free(lines);
  free(cells);
  free(labels);
  free(names);
  free(header_copy);
  free(text);
  if (rc) kn_dataset_free(out);
  return rc;
}

int kn_dataset_slice(const kn_dataset *src, int64_t start, int64_t count, kn_dataset *out,
                     char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (start < 0 || count < 1 || start + count > src->n) {
    snprintf(err, errlen, "dataset: slice [%lld, %lld) is outside the %lld examples",
             (long long)start, (long long)(start + count), (long long)src->n);
    return KN_EINVAL;
  }
  *out = *src;
  out->n = count;
  const size_t row_bytes = src->example_size * kn_dataset_value_bytes(src);
  void *x = malloc((size_t)count * row_bytes);
  out->x = src->x ? x : NULL;
  out->x8 = src->x ? NULL : x;
  out->y = malloc((size_t)count * sizeof *out->y);
  const size_t nt = src->targets ? (size_t)src->n_targets : 0;
  out->targets = nt ? malloc((size_t)count * nt * sizeof *out->targets) : NULL;
  if (!x || !out->y || (nt && !out->targets)) {
    kn_dataset_free(out);
    snprintf(err, errlen, "dataset: out of memory for %lld examples", (long long)count);
    return KN_ENOMEM;
  }
  const char *from = src->x ? (const void *)src->x : (const void *)src->x8;
  memcpy(x, from + (size_t)start * row_bytes, (size_t)count * row_bytes);
  memcpy(out->y, src->y + start, (size_t)count * sizeof *out->y);
  if (nt)
    memcpy(out->targets, src->targets + (size_t)start * nt,
           (size_t)count * nt * sizeof *out->targets);
  return KN_OK;
}

int kn_dataset_interleave(const kn_dataset *src, int n_parts, const int64_t *part_start,
                          int cycle_length, int block_length, kn_dataset *out, char *err,
                          size_t errlen) {
  memset(out, 0, sizeof *out);
  if (n_parts < 1 || cycle_length < 1 || block_length < 1 || part_start[0] != 0 ||
      part_start[n_parts] != src->n) {
    snprintf(err, errlen,
             "interleave: need parts covering the %lld examples, cycle_length and block_length "
             ">= 1 (got %d parts, %d, %d)",
             (long long)src->n, n_parts, cycle_length, block_length);
    return KN_EINVAL;
  }
  for (int i = 0; i < n_parts; i++) {
    if (part_start[i + 1] < part_start[i]) {
      snprintf(err, errlen, "interleave: part %d ends before it starts", i);
      return KN_EINVAL;
    }
  }
  int cycle = cycle_length < n_parts ? cycle_length : n_parts;
  int *slot_part = malloc((size_t)cycle * sizeof *slot_part);
  int64_t *slot_pos = malloc((size_t)cycle * sizeof *slot_pos);
  int64_t *order = malloc((size_t)src->n * sizeof *order);
  if (!slot_part || !slot_pos || !order) {
    free(slot_part), free(slot_pos), free(order);
    snprintf(err, errlen, "interleave: out of memory for %lld examples", (long long)src->n);
    return KN_ENOMEM;
  }
  int next_part = 0, active = 0;
  for (int s = 0; s < cycle; s++) {
    slot_part[s] = next_part;
    slot_pos[s] = part_start[next_part++];
    active++;
  }
  int64_t used = 0;
  while (active > 0) {
    for (int s = 0; s < cycle; s++) {
      for (int b = 0; b < block_length && slot_part[s] >= 0; b++) {
        /* A part that runs out is replaced by the next one at once. */
        while (slot_part[s] >= 0 && slot_pos[s] == part_start[slot_part[s] + 1]) {
          if (next_part < n_parts) {
            slot_part[s] = next_part;
            slot_pos[s] = part_start[next_part++];
          } else {
            slot_part[s] = -1;
            active--;
          }
        }
        if (slot_part[s] >= 0) order[used++] = slot_pos[s]++;
      }
    }
  }
  *out = *src;
  const size_t row_bytes = src->example_size * kn_dataset_value_bytes(src);
  char *x = malloc((size_t)src->n * row_bytes);
  const char *from = src->x ? (const void *)src->x : (const void *)src->x8;
  out->x = src->x ? (void *)x : NULL;
  out->x8 = src->x ? NULL : (void *)x;
  out->y = malloc((size_t)src->n * sizeof *out->y);
  const size_t nt = src->targets ? (size_t)src->n_targets : 0;
  out->targets = nt ? malloc((size_t)src->n * nt * sizeof *out->targets) : NULL;
  int rc = KN_OK;
  if (!x || !out->y || (nt && !out->targets)) {
    snprintf(err, errlen, "interleave: out of memory for %lld examples", (long long)src->n);
    kn_dataset_free(out);
    rc = KN_ENOMEM;
  } else {
    for (int64_t i = 0; i < used; i++) {
      memcpy(x + (size_t)i * row_bytes, from + (size_t)order[i] * row_bytes, row_bytes);
      out->y[i] = src->y[order[i]];
      if (nt)
        memcpy(out->targets + (size_t)i * nt, src->targets + (size_t)order[i] * nt,
               nt * sizeof *out->targets);
    }
  }
  free(slot_part);
  free(slot_pos);
  free(order);
  return rc;
}
