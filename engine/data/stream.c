/* stream.c — a data set read from shard files as it is consumed, never
 * held whole: the shard list (sharded by worker, by file when there are at
 * least as many files as workers, else by record), shuffled each epoch by
 * the seed, read tf.data-interleave style (cycle_length files open, a
 * block of records from each in turn), then a seeded shuffle buffer of raw
 * records; records are decoded one at a time by the pipeline. Positions
 * are replayed, not stored: kn_stream_begin(epoch, skip) reaches any
 * point of any epoch by reading (without decoding) up to it.
 *
 * A cache (tf.data's cache after decoding) keeps each decoded example in a
 * slot of its own, file by file: an epoch whose records have all been
 * handed out before is read from the cache by running the same
 * interleave and shuffle over record numbers instead of files, so it
 * hands out the records in the order the files would have given.
 *
 * Threads: a stream is used by one thread at a time (the pipeline reads it
 * under its stream_lock, which also guards the cache's seen flags);
 * kn_stream_decode reads the immutable config and the cache's slots, and
 * may run on any thread: a slot is written once, by the thread that
 * decodes its record first, then its filled flag is set (release); a
 * reader waits for the flag (acquire). */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../engine.h"

typedef struct reader {
  int file; /* index into files, -1 = empty slot */
  kn_tfrecord *tf;
  kn_tar *tar;
  int64_t next; /* serving from the cache: the file's next record number */
} reader;

/* Decoded examples, one slot per record of the worker's files. */
typedef struct stream_cache {
  int kind;             /* KN_STREAM_CACHE_MEMORY or _FILE */
  size_t row_bytes;     /* ex floats, then the int32 label */
  uint8_t *rows;        /* memory: (n_slots, row_bytes) */
  int fd;               /* file: n_slots rows of row_bytes */
  char *path;           /* the file's, for errors */
  atomic_uchar *filled; /* (n_slots) the slot holds its example */
  uint8_t *seen;        /* (n_slots) handed out to be decoded (stream_lock) */
  atomic_int broken;    /* a decode or store failed: waiters give up */
} stream_cache;

struct kn_stream {
  int format;
  char **files; /* (n_files) this worker's files */
  int n_files;
  char *image_feature, *label_feature;
  int height, width, channels, ex;
  int cycle_length, block_length;
  int64_t shuffle_buffer;
  uint64_t seed;
  int by_record, shard_index, shard_count; /* by_record: keep positions p % count == index */
  int64_t n;                               /* examples per epoch (this worker's) */
  int64_t limit;                           /* records handed out per epoch (<= n) */
  int n_classes;
  int64_t *file_records; /* (n_files) records in each file, from the count pass */
  int64_t *file_base;    /* (n_files) each file's first cache slot */
  int64_t n_slots;       /* records in this worker's files */
  int64_t opens;
  stream_cache *cache; /* NULL = none */
  int serving;         /* this epoch is read from the cache */
  int64_t handed;      /* records handed out this epoch */

  /* The epoch being read. */
  int64_t epoch;
  int *order; /* (n_files) the epoch's file order */
  int next_file;
  reader *cycle; /* (cycle_length) */
  int cycle_pos, block_taken;
  int64_t stream_pos; /* records read from the files (before record sharding) */
  kn_stream_raw *buf; /* (shuffle_buffer) */
  int64_t filled;
  int source_done;
  kn_rng rng;
  kn_stream_raw out;
  size_t held_bytes, peak_bytes;
};

static void close_reader(reader *r) {
  kn_tfrecord_close(r->tf);
  kn_tar_close(r->tar);
  r->tf = NULL;
  r->tar = NULL;
  r->file = -1;
}

static void cache_free(stream_cache *c) {
  if (!c) return;
  free(c->rows);
  if (c->fd >= 0) close(c->fd);
  free(c->path);
  free(c->filled);
  free(c->seen);
  free(c);
}

void kn_stream_free(kn_stream *s) {
  if (!s) return;
  cache_free(s->cache);
  free(s->file_records);
  free(s->file_base);
  for (int i = 0; s->cycle && i < s->cycle_length; i++) close_reader(&s->cycle[i]);
  for (int i = 0; s->files && i < s->n_files; i++) free(s->files[i]);
  for (int64_t i = 0; s->buf && i < s->shuffle_buffer; i++) free(s->buf[i].data);
  free(s->out.data);
  free(s->buf);
  free(s->cycle);
  free(s->order);
  free(s->files);
  free(s->image_feature);
  free(s->label_feature);
  free(s);
}

static uint64_t mix(uint64_t seed, int64_t epoch, uint64_t stream) {
  uint64_t h = seed * 0x9e3779b97f4a7c15ULL + (uint64_t)epoch;
  h = h * 0xbf58476d1ce4e5b9ULL + stream;
  return h ^ (h >> 29);
}

static int open_reader(kn_stream *s, reader *r, int file, char *err, size_t errlen) {
  r->file = file;
  r->next = 0;
  if (s->serving) return KN_OK; /* record numbers only: no file is read */
  s->opens++;
  const char *path = s->files[file];
  if (s->format == KN_SHARDS_TAR) return kn_tar_open(path, &r->tar, err, errlen);
  return kn_tfrecord_open(path, &r->tf, err, errlen);
}

/* The next record of r into dst: 1, 0 at the end of its file, or < 0. */
static int read_record(kn_stream *s, reader *r, kn_stream_raw *dst, char *err, size_t errlen) {
  const uint8_t *data;
  size_t len;
  int64_t index;
  int rc;
  if (s->serving) {
    if (r->next >= s->file_records[r->file]) return 0;
    dst->len = 0;
    dst->cached = 1;
    dst->file = s->files[r->file];
    dst->record = r->next++;
    dst->slot = s->file_base[r->file] + dst->record;
    return 1;
  }
  if (r->tar) {
    index = kn_tar_index(r->tar);
    rc = kn_tar_next(r->tar, &data, &len, err, errlen);
  } else {
    index = kn_tfrecord_index(r->tf);
    rc = kn_tfrecord_next(r->tf, &data, &len, err, errlen);
  }
  if (rc != 1) return rc;
  if (len > dst->cap) {
    uint8_t *b = realloc(dst->data, len);
    if (!b) {
      snprintf(err, errlen, "%s: out of memory for a record of %zu bytes", s->files[r->file], len);
      return KN_ENOMEM;
    }
    s->held_bytes += len - dst->cap;
    if (s->held_bytes > s->peak_bytes) s->peak_bytes = s->held_bytes;
    dst->data = b;
    dst->cap = len;
  }
  memcpy(dst->data, data, len);
  dst->len = len;
  dst->file = s->files[r->file];
  dst->record = index;
  dst->cached = 0;
  if (index + 1 > s->file_records[r->file]) s->file_records[r->file] = index + 1;
  dst->slot = s->file_base ? s->file_base[r->file] + index : -1;
  return 1;
}

/* The next record of the interleaved files (this worker's, when sharded by
 * record): 1, 0 when every file is read, or < 0. */
static int pull(kn_stream *s, kn_stream_raw *dst, char *err, size_t errlen) {
  for (;;) {
    reader *r = &s->cycle[s->cycle_pos];
    if (r->file < 0) {
      if (s->next_file < s->n_files) {
        int rc = open_reader(s, r, s->order[s->next_file++], err, errlen);
        if (rc) return rc;
        s->block_taken = 0;
      } else {
        int open = 0;
        for (int i = 0; i < s->cycle_length; i++) open += s->cycle[i].file >= 0;
        if (!open) return 0;
        s->cycle_pos = (s->cycle_pos + 1) % s->cycle_length;
        s->block_taken = 0;
        continue;
      }
    }
    int rc = read_record(s, r, dst, err, errlen);
    if (rc < 0) return rc;
    if (rc == 0) { /* this file is done: the next one opens in its place, next turn */
      close_reader(r);
      s->cycle_pos = (s->cycle_pos + 1) % s->cycle_length;
      s->block_taken = 0;
      continue;
    }
    if (++s->block_taken >= s->block_length) {
      s->cycle_pos = (s->cycle_pos + 1) % s->cycle_length;
      s->block_taken = 0;
    }
    const int64_t pos = s->stream_pos++;
    if (s->by_record && pos % s->shard_count != s->shard_index) continue;
    return 1;
  }
}

static int next_record(kn_stream *s, const kn_stream_raw **rec, char *err, size_t errlen);

/* Back to the start of epoch `epoch`, nothing read. */
static void reset(kn_stream *s, int64_t epoch) {
  for (int i = 0; i < s->cycle_length; i++) close_reader(&s->cycle[i]);
  s->epoch = epoch;
  for (int i = 0; i < s->n_files; i++) s->order[i] = i;
  kn_rng_seed(&s->rng, mix(s->seed, epoch, 0xf11e5u));
  for (int i = s->n_files - 1; i > 0; i--) {
    int j = (int)kn_rng_below(&s->rng, (uint64_t)i + 1);
    int t = s->order[i];
    s->order[i] = s->order[j];
    s->order[j] = t;
  }
  s->next_file = s->cycle_pos = s->block_taken = 0;
  s->stream_pos = 0;
  s->filled = 0;
  s->source_done = 0;
  s->handed = 0;
  kn_rng_seed(&s->rng, mix(s->seed, epoch, 0xb0ffu));
}

/* Whether every record epoch `epoch` hands out was handed out before (so
 * the cache holds it, or will once its decode is done): the epoch is run
 * over record numbers to see. */
static int epoch_is_cached(kn_stream *s, int64_t epoch, char *err, size_t errlen) {
  s->serving = 1;
  reset(s, epoch);
  const kn_stream_raw *rec;
  int rc, all = 1;
  while (all && (rc = kn_stream_next(s, &rec, err, errlen)) == 1) all = s->cache->seen[rec->slot];
  s->serving = 0;
  return all;
}

/* An epoch cut short by a limit left records unread: they are decoded
 * into the cache here, so that the next epochs (which drop others) find
 * every record there. */
static int cache_rest(kn_stream *s, char *err, size_t errlen) {
  float *x = malloc((size_t)s->ex * sizeof *x);
  if (!x) {
    snprintf(err, errlen, "stream: out of memory");
    return KN_ENOMEM;
  }
  const kn_stream_raw *rec;
  int32_t y;
  int rc;
  while ((rc = next_record(s, &rec, err, errlen)) == 1) {
    if (s->cache->seen[rec->slot]) continue;
    if ((rc = kn_stream_decode(s, rec, x, &y, err, errlen)) != 0) break;
    s->cache->seen[rec->slot] = 1;
  }
  free(x);
  return rc < 0 ? rc : KN_OK;
}

int kn_stream_begin(kn_stream *s, int64_t epoch, int64_t skip, char *err, size_t errlen) {
  if (s->cache && !s->serving && s->limit < s->n && s->handed == s->limit) {
    int rc = cache_rest(s, err, errlen);
    if (rc) return rc;
  }
  const int cached = s->cache && s->file_base && epoch_is_cached(s, epoch, err, errlen);
  reset(s, epoch);
  s->serving = cached;
  for (int64_t i = 0; i < skip; i++) {
    int rc = kn_stream_next(s, NULL, err, errlen);
    if (rc < 0) return rc;
    if (rc == 0) {
      snprintf(err, errlen, "stream: epoch %lld has %lld examples, cannot skip to %lld",
               (long long)epoch, (long long)i, (long long)skip);
      return KN_EINVAL;
    }
  }
  return KN_OK;
}

/* tf.data's shuffle buffer: filled to its size, then each record out is a
 * random one of the buffer, whose place the next record takes. */
int kn_stream_next(kn_stream *s, const kn_stream_raw **rec, char *err, size_t errlen) {
  if (s->handed >= s->limit) return 0;
  const kn_stream_raw *got;
  int rc = next_record(s, &got, err, errlen);
  if (rc != 1) return rc;
  s->handed++;
  /* Handed out to be decoded (a skipped one is not): the cache will hold it. */
  if (rec && s->cache && !s->serving) s->cache->seen[got->slot] = 1;
  if (rec) *rec = got;
  return 1;
}

static int next_record(kn_stream *s, const kn_stream_raw **rec, char *err, size_t errlen) {
  if (s->shuffle_buffer <= 1) {
    int rc = pull(s, &s->out, err, errlen);
    if (rc == 1) *rec = &s->out;
    return rc;
  }
  while (!s->source_done && s->filled < s->shuffle_buffer) {
    int rc = pull(s, &s->buf[s->filled], err, errlen);
    if (rc < 0) return rc;
    if (rc == 0)
      s->source_done = 1;
    else
      s->filled++;
  }
  if (s->filled == 0) return 0;
  const int64_t j = (int64_t)kn_rng_below(&s->rng, (uint64_t)s->filled);
  /* Hand out buf[j] by swapping it with out: no copies, storage reused. */
  kn_stream_raw t = s->out;
  s->out = s->buf[j];
  s->buf[j] = t;
  if (!s->source_done) {
    int rc = pull(s, &s->buf[j], err, errlen);
    if (rc < 0) return rc;
    if (rc == 0) s->source_done = 1;
  }
  if (s->source_done) {
    /* buf[j] holds no record: the last one takes its place. */
    s->filled--;
    t = s->buf[j];
    s->buf[j] = s->buf[s->filled];
    s->buf[s->filled] = t;
  }
  *rec = &s->out;
  return 1;
}

/* Pixels of an image feature: raw bytes of exactly the example's size, or
 * a PNG / JPEG decoded and resized to it. */
static int decode_image(const kn_stream *s, const kn_stream_raw *rec, const uint8_t *data,
                        size_t len, float *x, char *err, size_t errlen) {
  if (len == (size_t)s->ex) {
    for (int i = 0; i < s->ex; i++) x[i] = (float)data[i];
    return KN_OK;
  }
  char what[300];
  snprintf(what, sizeof what, "%s: record %lld: feature '%s'", rec->file, (long long)rec->record,
           s->image_feature);
  return kn_image_decode(data, len, what, s->height, s->width, s->channels, x, err, errlen);
}

static int decode_example(const kn_stream *s, const kn_stream_raw *rec, float *x, int32_t *y,
                          char *err, size_t errlen) {
  kn_feature f;
  const char *names[2] = {s->image_feature, s->label_feature};
  for (int k = 0; k < 2; k++) {
    int rc = kn_example_feature(rec->data, rec->len, names[k], &f);
    if (rc < 0) {
      snprintf(err, errlen, "%s: record %lld is not a tf.train.Example", rec->file,
               (long long)rec->record);
      return KN_EFORMAT;
    }
    if (rc == 0 || f.kind == KN_FEATURE_NONE) {
      snprintf(err, errlen, "%s: record %lld has no feature '%s' (the spec's features.%s)",
               rec->file, (long long)rec->record, names[k], k == 0 ? "image" : "label");
      return KN_EFORMAT;
    }
    const int64_t count = kn_feature_count(&f);
    if (k == 0 && f.kind == KN_FEATURE_BYTES) {
      const uint8_t *data;
      size_t len;
      if (count != 1 || kn_feature_bytes(&f, 0, &data, &len) != 0) {
        snprintf(err, errlen, "%s: record %lld: feature '%s' holds %lld byte strings, want 1",
                 rec->file, (long long)rec->record, names[k], (long long)count);
        return KN_EFORMAT;
      }
      if (x) {
        int rc2 = decode_image(s, rec, data, len, x, err, errlen);
        if (rc2) return rc2;
      }
    } else if (k == 0) {
      if (count != s->ex) {
        snprintf(err, errlen, "%s: record %lld: feature '%s' holds %lld values, want %d", rec->file,
                 (long long)rec->record, names[k], (long long)count, s->ex);
        return KN_EFORMAT;
      }
      if (x) kn_feature_floats(&f, x, (size_t)s->ex);
    } else {
      int64_t label;
      if (f.kind == KN_FEATURE_BYTES || count < 1 || kn_feature_int64s(&f, &label, 1) < 1 ||
          label < 0 || label > INT32_MAX) {
        snprintf(err, errlen,
                 "%s: record %lld: feature '%s' must hold a class label (an int64 >= 0)", rec->file,
                 (long long)rec->record, names[k]);
        return KN_EFORMAT;
      }
      *y = (int32_t)label;
    }
  }
  return KN_OK;
}

static int decode_tar_sample(const kn_stream *s, const kn_stream_raw *rec, float *x, int32_t *y,
                             char *err, size_t errlen) {
  const uint8_t *image, *label;
  size_t image_len, label_len;
  if (kn_tar_sample_part(rec->data, rec->len, s->image_feature, &image, &image_len) != 0 ||
      kn_tar_sample_part(rec->data, rec->len, s->label_feature, &label, &label_len) != 0) {
    snprintf(err, errlen, "%s: sample %lld has no '.%s' or no '.%s' file (the spec's features)",
             rec->file, (long long)rec->record, s->image_feature, s->label_feature);
    return KN_EFORMAT;
  }
  char text[24];
  size_t n = label_len < sizeof text - 1 ? label_len : sizeof text - 1;
  memcpy(text, label, n);
  text[n] = '\0';
  char *end;
  long v = strtol(text, &end, 10);
  while (*end == '\n' || *end == ' ' || *end == '\r') end++;
  if (end == text || *end || label_len >= sizeof text || v < 0 || v > INT32_MAX) {
    snprintf(err, errlen, "%s: sample %lld: '.%s' must hold a class label (an integer >= 0)",
             rec->file, (long long)rec->record, s->label_feature);
    return KN_EFORMAT;
  }
  *y = (int32_t)v;
  return x ? decode_image(s, rec, image, image_len, x, err, errlen) : KN_OK;
}

/* A cached record's example: waits for the slot (its first decode may
 * still be running on another thread). */
static int cache_read(const kn_stream *s, const kn_stream_raw *rec, float *x, int32_t *y, char *err,
                      size_t errlen) {
  stream_cache *c = s->cache;
  while (!atomic_load_explicit(&c->filled[rec->slot], memory_order_acquire)) {
    if (atomic_load(&c->broken)) {
      snprintf(err, errlen, "%s: record %lld: the cache never got it (an earlier decode failed)",
               rec->file, (long long)rec->record);
      return KN_EIO;
    }
    sched_yield();
  }
  const size_t xbytes = (size_t)s->ex * sizeof(float);
  if (c->kind == KN_STREAM_CACHE_MEMORY) {
    const uint8_t *row = c->rows + (size_t)rec->slot * c->row_bytes;
    if (x) memcpy(x, row, xbytes);
    memcpy(y, row + xbytes, sizeof *y);
    return KN_OK;
  }
  uint8_t *row = x ? (uint8_t *)x : NULL, label[4];
  const off_t at = (off_t)rec->slot * (off_t)c->row_bytes;
  if ((row && pread(c->fd, row, xbytes, at) != (ssize_t)xbytes) ||
      pread(c->fd, label, sizeof label, at + (off_t)xbytes) != (ssize_t)sizeof label) {
    snprintf(err, errlen, "cache file %s: cannot read record %lld of %s back: %s", c->path,
             (long long)rec->record, rec->file, strerror(errno));
    return KN_EIO;
  }
  memcpy(y, label, sizeof *y);
  return KN_OK;
}

/* Keeps a freshly decoded example in its slot, unless another thread's
 * decode of the same record (a later epoch's) got there first. */
static int cache_store(const kn_stream *s, const kn_stream_raw *rec, const float *x, int32_t y,
                       char *err, size_t errlen) {
  stream_cache *c = s->cache;
  if (atomic_load_explicit(&c->filled[rec->slot], memory_order_acquire)) return KN_OK;
  const size_t xbytes = (size_t)s->ex * sizeof(float);
  if (c->kind == KN_STREAM_CACHE_MEMORY) {
    uint8_t *row = c->rows + (size_t)rec->slot * c->row_bytes;
    memcpy(row, x, xbytes);
    memcpy(row + xbytes, &y, sizeof y);
  } else {
    const off_t at = (off_t)rec->slot * (off_t)c->row_bytes;
    if (pwrite(c->fd, x, xbytes, at) != (ssize_t)xbytes ||
        pwrite(c->fd, &y, sizeof y, at + (off_t)xbytes) != (ssize_t)sizeof y) {
      snprintf(err, errlen, "cache file %s: cannot write record %lld of %s: %s", c->path,
               (long long)rec->record, rec->file, strerror(errno));
      atomic_store(&c->broken, 1);
      return KN_EIO;
    }
  }
  atomic_store_explicit(&c->filled[rec->slot], 1, memory_order_release);
  return KN_OK;
}

int kn_stream_decode(const kn_stream *s, const kn_stream_raw *rec, float *x, int32_t *y, char *err,
                     size_t errlen) {
  if (rec->cached) return cache_read(s, rec, x, y, err, errlen);
  int rc = s->format == KN_SHARDS_TAR ? decode_tar_sample(s, rec, x, y, err, errlen)
                                      : decode_example(s, rec, x, y, err, errlen);
  if (rc && s->cache) atomic_store(&s->cache->broken, 1);
  if (!rc && x && s->cache && rec->slot >= 0) rc = cache_store(s, rec, x, *y, err, errlen);
  return rc;
}

/* One pass over this worker's records: the count and the classes, every
 * label read (so a wrong feature name is refused before training). */
static int count_pass(kn_stream *s, char *err, size_t errlen) {
  s->limit = INT64_MAX;
  int rc = kn_stream_begin(s, 0, 0, err, errlen);
  const int64_t saved = s->shuffle_buffer;
  s->shuffle_buffer = 0; /* the count needs no order */
  const kn_stream_raw *rec;
  int32_t label, max_label = -1;
  s->n = 0;
  while (!rc && (rc = kn_stream_next(s, &rec, err, errlen)) == 1) {
    if ((rc = kn_stream_decode(s, rec, NULL, &label, err, errlen)) != 0) break;
    if (label > max_label) max_label = label;
    s->n++;
  }
  s->shuffle_buffer = saved;
  if (rc < 0) return rc;
  if (s->n == 0) {
    snprintf(err, errlen, "stream: the shards hold no records for worker %d of %d", s->shard_index,
             s->shard_count);
    return KN_EINVAL;
  }
  s->n_classes = max_label + 1;
  s->limit = s->n;
  s->file_base = malloc((size_t)s->n_files * sizeof *s->file_base);
  if (!s->file_base) {
    snprintf(err, errlen, "stream: out of memory");
    return KN_ENOMEM;
  }
  for (int f = 0; f < s->n_files; f++) {
    s->file_base[f] = s->n_slots;
    s->n_slots += s->file_records[f];
  }
  return KN_OK;
}

static int cache_new(kn_stream *s, const kn_stream_config *c, char *err, size_t errlen) {
  const size_t row_bytes = (size_t)s->ex * sizeof(float) + sizeof(int32_t);
  const double bytes = (double)s->n_slots * (double)row_bytes;
  if (c->cache == KN_STREAM_CACHE_MEMORY && c->memory_limit > 0 && bytes > c->memory_limit) {
    snprintf(err, errlen,
             "cache \"memory\": the decoded data set is %.1f MiB (%lld examples of %dx%dx%d "
             "floats), more than the trainer's memory limit of %.1f MiB; use cache \"file\"",
             bytes / 1048576.0, (long long)s->n_slots, s->height, s->width, s->channels,
             (double)c->memory_limit / 1048576.0);
    return KN_ENOMEM;
  }
  stream_cache *k = calloc(1, sizeof *k);
  if (!k) goto oom;
  s->cache = k;
  k->kind = c->cache;
  k->row_bytes = row_bytes;
  k->fd = -1;
  k->filled = calloc((size_t)s->n_slots + 1, sizeof *k->filled);
  k->seen = calloc((size_t)s->n_slots + 1, 1);
  if (!k->filled || !k->seen) goto oom;
  if (c->cache == KN_STREAM_CACHE_MEMORY) {
    if (!(k->rows = malloc((size_t)s->n_slots * row_bytes + 1))) {
      snprintf(err, errlen, "cache \"memory\": cannot allocate %.1f MiB for the decoded data set",
               bytes / 1048576.0);
      return KN_ENOMEM;
    }
    s->held_bytes += (size_t)s->n_slots * row_bytes;
    return KN_OK;
  }
  if (!c->cache_path || !*c->cache_path) {
    snprintf(err, errlen, "cache \"file\" needs a path");
    return KN_EINVAL;
  }
  if (!(k->path = strdup(c->cache_path))) goto oom;
  /* A new file each run: slots are known filled only to the run that wrote them. */
  k->fd = open(c->cache_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (k->fd < 0 || ftruncate(k->fd, (off_t)s->n_slots * (off_t)row_bytes) != 0) {
    snprintf(err, errlen, "cache file %s: cannot create it: %s", c->cache_path, strerror(errno));
    return KN_EIO;
  }
  return KN_OK;
oom:
  snprintf(err, errlen, "stream: out of memory for the cache");
  return KN_ENOMEM;
}

static int check(const kn_stream_config *c, char *err, size_t errlen) {
  if (c->format != KN_SHARDS_TFRECORD && c->format != KN_SHARDS_TAR) {
    snprintf(err, errlen, "stream: format must be tfrecord or tar");
    return KN_EINVAL;
  }
  if (c->n_files < 1) {
    snprintf(err, errlen, "stream: no shard files");
    return KN_EINVAL;
  }
  if (!c->image_feature || !*c->image_feature || !c->label_feature || !*c->label_feature) {
    snprintf(err, errlen, "stream: the image and label features must be named");
    return KN_EINVAL;
  }
  if (c->height < 1 || c->width < 1 || (c->channels != 1 && c->channels != 3) ||
      (int64_t)c->height * c->width * c->channels > (1 << 26)) {
    snprintf(err, errlen, "stream: examples must be height x width x 1 or 3 channels, got %dx%dx%d",
             c->height, c->width, c->channels);
    return KN_EINVAL;
  }
  if (c->cycle_length < 1 || c->cycle_length > 1024 || c->block_length < 1) {
    snprintf(err, errlen, "stream: cycle_length must be 1..1024 and block_length >= 1, got %d, %d",
             c->cycle_length, c->block_length);
    return KN_EINVAL;
  }
  if (c->shuffle_buffer < 0 || c->shuffle_buffer > (1 << 24)) {
    snprintf(err, errlen, "stream: shuffle_buffer must be 0..%d, got %lld", 1 << 24,
             (long long)c->shuffle_buffer);
    return KN_EINVAL;
  }
  if (c->shard_count < 1 || c->shard_index < 0 || c->shard_index >= c->shard_count) {
    snprintf(err, errlen, "stream: shard %d of %d is not a shard", c->shard_index, c->shard_count);
    return KN_EINVAL;
  }
  for (int i = 0; i < c->n_files; i++) {
    struct stat st;
    if (stat(c->files[i], &st) != 0 || !S_ISREG(st.st_mode)) {
      snprintf(err, errlen, "stream: shard file %s is not a readable file", c->files[i]);
      return KN_EIO;
    }
  }
  return KN_OK;
}

int kn_stream_new(const kn_stream_config *c, kn_stream **out, char *err, size_t errlen) {
  *out = NULL;
  int rc = check(c, err, errlen);
  if (rc) return rc;
  kn_stream *s = calloc(1, sizeof *s);
  if (!s) goto oom;
  s->format = c->format;
  s->height = c->height, s->width = c->width, s->channels = c->channels;
  s->ex = c->height * c->width * c->channels;
  s->cycle_length = c->cycle_length;
  s->block_length = c->block_length;
  s->shuffle_buffer = c->shuffle_buffer;
  s->seed = c->seed;
  s->shard_index = c->shard_index, s->shard_count = c->shard_count;
  /* tf.data's auto-shard: by file when each worker gets one, else by record. */
  s->by_record = c->shard_count > 1 && c->n_files < c->shard_count;
  s->files = calloc((size_t)c->n_files, sizeof *s->files);
  s->file_records = calloc((size_t)c->n_files, sizeof *s->file_records);
  s->order = calloc((size_t)c->n_files, sizeof *s->order);
  s->cycle = calloc((size_t)c->cycle_length, sizeof *s->cycle);
  s->image_feature = strdup(c->image_feature);
  s->label_feature = strdup(c->label_feature);
  if (!s->files || !s->file_records || !s->order || !s->cycle || !s->image_feature ||
      !s->label_feature)
    goto oom;
  for (int i = 0; i < c->n_files; i++) {
    if (!s->by_record && i % c->shard_count != c->shard_index) continue;
    if (!(s->files[s->n_files++] = strdup(c->files[i]))) goto oom;
  }
  for (int i = 0; i < c->cycle_length; i++) s->cycle[i].file = -1;
  if (s->shuffle_buffer > 1 && !(s->buf = calloc((size_t)s->shuffle_buffer, sizeof *s->buf)))
    goto oom;
  if ((rc = count_pass(s, err, errlen)) != 0 ||
      (c->cache != KN_STREAM_CACHE_NONE && (rc = cache_new(s, c, err, errlen)) != 0) ||
      (rc = kn_stream_begin(s, 0, 0, err, errlen)) != 0) {
    kn_stream_free(s);
    return rc;
  }
  *out = s;
  return KN_OK;
oom:
  kn_stream_free(s);
  snprintf(err, errlen, "stream: out of memory");
  return KN_ENOMEM;
}

int64_t kn_stream_examples(const kn_stream *s) {
  return s->limit;
}

int kn_stream_limit(kn_stream *s, int64_t n, char *err, size_t errlen) {
  if (n < 1 || n > s->n) {
    snprintf(err, errlen, "stream: a limit of %lld records per epoch is not 1..%lld", (long long)n,
             (long long)s->n);
    return KN_EINVAL;
  }
  s->limit = n;
  return KN_OK;
}

int64_t kn_stream_opens(const kn_stream *s) {
  return s->opens;
}

const char *const *kn_stream_files(const kn_stream *s, int *n, int *by_record) {
  *n = s->n_files;
  *by_record = s->by_record;
  return (const char *const *)s->files;
}

int kn_stream_classes(const kn_stream *s) {
  return s->n_classes;
}

int64_t kn_stream_epoch(const kn_stream *s) {
  return s->epoch;
}

size_t kn_stream_memory_bytes(const kn_stream *s) {
  /* Records held (the buffer's and the one out, at their peak), and per
   * open file its read buffer and zlib's inflate state and window. */
  return s->peak_bytes + (size_t)s->cycle_length * ((64u << 10) + (48u << 10) + 512) +
         (s->cache ? (size_t)s->n_slots * (1 + sizeof(atomic_uchar)) : 0);
}

void kn_stream_shape(const kn_stream *s, int *height, int *width, int *channels) {
  *height = s->height;
  *width = s->width;
  *channels = s->channels;
}
