/* pipeline.c — the input pipeline: skip/take, shard, seeded buffer shuffle
 * (reshuffled each epoch), per-feature maps folded into one affine pass,
 * augmentation, batching and repeat, produced by background threads into a
 * bounded ring of batches, with auto-tuned parallelism and prefetch depth.
 *
 * Threads: the consumer (the caller of kn_pipeline_next) owns `held` and
 * the consumer timings. Each producer owns its scratch buffer. Everything
 * else that changes after kn_pipeline_new (next_claim, consumed, slot seq
 * numbers, the epoch order cache, active, depth, stop, producer timings) is
 * guarded by ring_lock. A slot's buffers are written only by the producer
 * that claimed its batch, and read only by the consumer once its seq says
 * the batch is there; the slot is not claimed again before the consumer
 * has moved past it.
 *
 * A streamed data set (ds->stream) is read in batch order: a producer that
 * claimed batch seq waits under stream_lock until read_seq == seq, copies
 * the batch's raw records out of the stream, and decodes them on its own
 * thread; read_seq and the stream belong to stream_lock. The first error
 * (a corrupt record, a missing feature) is kept in error under ring_lock,
 * and every batch from there on is handed out as that error. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../engine.h"

#define MAX_THREADS      64
#define AUTO_MAX_THREADS 8
/* An auto-sized ring never holds more than this in batches. */
#define AUTO_RING_BYTES (64u << 20)
/* Batches handed out before auto-tuning looks at the timings. */
#define WARMUP_BATCHES 16

typedef struct slot {
  float *x;        /* (batch, example_size) */
  int32_t *y;      /* (batch) */
  float *y_onehot; /* (batch, n_classes) or NULL */
  float *targets;  /* (batch, n_targets) or NULL */
  int64_t seq;     /* the batch in it, -1 = none */
  int rows;
} slot;

typedef struct epoch_order {
  int64_t epoch; /* -1 = empty */
  int64_t *idx;  /* (n) dataset rows in the epoch's order */
} epoch_order;

typedef struct producer {
  kn_pipeline *p;
  pthread_t tid;
  int id;
  float *scratch;      /* (example_size) for random_crop and cast */
  kn_stream_raw *raws; /* (batch_size) a streamed batch's records, or NULL */
} producer;

struct kn_pipeline {
  const kn_dataset *ds;
  kn_pipeline_config cfg;
  int64_t *base; /* (n) dataset rows read, after skip/take and shard, in source order */
  int64_t n;
  int64_t bpe;               /* batches per epoch */
  int part_rows, part_first; /* the rows of each batch this pipeline makes (cfg part_index) */
  int64_t total;             /* batches over all epochs; INT64_MAX = forever */
  int ex, n_classes, n_targets;
  uint16_t *stored;            /* (ds->n, ex) examples held as cfg.cast (f16 / bf16), or NULL */
  int height, width, channels; /* example layout for augmentation */
  float *scale, *shift;        /* (ex) normalize and standardize as one affine map */
  float *row_buf;              /* (ex) an example of a byte data set, read while setting up */
  int64_t *shuffle_buf;        /* (shuffle_buffer) when smaller than n */

  pthread_mutex_t ring_lock;
  pthread_cond_t ready_cond, space_cond;
  slot *slots;
  int n_slots, depth;
  epoch_order *orders;
  int n_orders;
  int64_t next_claim, consumed;
  int held, stop, started;
  producer *prods; /* (n_prods): n_threads producers, or one scratch owner inline */
  int n_prods, n_threads, active;
  int auto_threads, auto_prefetch, tuned;
  double busy_s; /* producers' time spent making batches */
  int64_t made;

  double wait_s, consume_s, last_return;
  int64_t consume_n, handed;

  kn_stream *stream; /* ds->stream, or NULL */
  pthread_mutex_t stream_lock;
  pthread_cond_t stream_cond;
  int64_t read_seq;
  int error_rc;
  char error[512];
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void kn_pipeline_config_default(kn_pipeline_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->batch_size = 32;
  cfg->take = -1;
  cfg->shard_count = 1;
  cfg->repeat = 1;
  cfg->num_parallel_calls = 1;
  cfg->prefetch = 2;
}

/* One 64-bit seed per (seed, epoch, stream, position): splitmix64 in
 * kn_rng_seed spreads it, so neighbouring positions get unrelated streams. */
static uint64_t mix(uint64_t seed, int64_t epoch, uint64_t stream, int64_t pos) {
  uint64_t h = seed;
  h = h * 0x9e3779b97f4a7c15ULL + (uint64_t)epoch;
  h = h * 0xbf58476d1ce4e5b9ULL + stream;
  h = h * 0x94d049bb133111ebULL + (uint64_t)pos;
  return h ^ (h >> 29);
}

/* The epoch's order of the base rows: as is, a full Fisher-Yates shuffle,
 * or tf.data's buffer shuffle (fill K, emit a random one, refill its place). */
static void compute_order(kn_pipeline *p, int64_t epoch, int64_t *dst) {
  const int64_t n = p->n, k = p->cfg.shuffle_buffer;
  if (k <= 1) {
    memcpy(dst, p->base, (size_t)n * sizeof *dst);
    return;
  }
  kn_rng rng;
  kn_rng_seed(&rng, mix(p->cfg.seed, epoch, 0x5u, 0));
  if (k >= n) {
    memcpy(dst, p->base, (size_t)n * sizeof *dst);
    for (int64_t i = n - 1; i > 0; i--) {
      int64_t j = (int64_t)kn_rng_below(&rng, (uint64_t)i + 1);
      int64_t t = dst[i];
      dst[i] = dst[j];
      dst[j] = t;
    }
    return;
  }
  int64_t *buf = p->shuffle_buf, filled = 0, next = 0, out = 0;
  while (filled < k) buf[filled++] = p->base[next++];
  while (filled > 0) {
    int64_t j = (int64_t)kn_rng_below(&rng, (uint64_t)filled);
    dst[out++] = buf[j];
    if (next < n)
      buf[j] = p->base[next++];
    else
      buf[j] = buf[--filled];
  }
}

/* The order of an epoch, computed once into the cache. Call with ring_lock
 * held (or with no producers running). */
static const int64_t *get_order(kn_pipeline *p, int64_t epoch) {
  epoch_order *o = &p->orders[epoch % p->n_orders];
  if (o->epoch != epoch) {
    compute_order(p, epoch, o->idx);
    o->epoch = epoch;
  }
  return o->idx;
}

static void swap_floats(float *a, float *b, int count) {
  for (int i = 0; i < count; i++) {
    float t = a[i];
    a[i] = b[i];
    b[i] = t;
  }
}

/* Augments one example in place; its randomness depends only on where it
 * sits in its epoch, never on the thread that makes it. */
static void augment(const kn_pipeline *p, float *x, float *scratch, int64_t epoch, int64_t pos) {
  const kn_pipeline_config *c = &p->cfg;
  const int h = p->height, w = p->width, ch = p->channels;
  kn_rng rng;
  kn_rng_seed(&rng, mix(c->seed, epoch, 0xa5u, pos));
  if (c->augment & KN_AUG_FLIP_LEFT_RIGHT && kn_rng_uniform(&rng) < 0.5f) {
    for (int r = 0; r < h; r++) {
      float *row = x + (size_t)r * w * ch;
      for (int col = 0; col < w / 2; col++)
        swap_floats(row + (size_t)col * ch, row + (size_t)(w - 1 - col) * ch, ch);
    }
  }
  if (c->augment & KN_AUG_FLIP_UP_DOWN && kn_rng_uniform(&rng) < 0.5f) {
    for (int r = 0; r < h / 2; r++)
      swap_floats(x + (size_t)r * w * ch, x + (size_t)(h - 1 - r) * w * ch, w * ch);
  }
  if (c->augment & KN_AUG_RANDOM_CROP) {
    const int pad = c->crop_padding;
    const int dy = (int)kn_rng_below(&rng, (uint64_t)(2 * pad + 1)) - pad;
    const int dx = (int)kn_rng_below(&rng, (uint64_t)(2 * pad + 1)) - pad;
    memcpy(scratch, x, (size_t)p->ex * sizeof *x);
    for (int r = 0; r < h; r++) {
      for (int col = 0; col < w; col++) {
        int sr = r + dy, sc = col + dx;
        float *dst = x + ((size_t)r * w + col) * ch;
        if (sr < 0 || sr >= h || sc < 0 || sc >= w)
          for (int k = 0; k < ch; k++) dst[k] = 0.0f;
        else
          memcpy(dst, scratch + ((size_t)sr * w + sc) * ch, (size_t)ch * sizeof *dst);
      }
    }
  }
  if (c->augment & KN_AUG_RANDOM_BRIGHTNESS) {
    float delta = (2.0f * kn_rng_uniform(&rng) - 1.0f) * c->brightness_delta;
    for (int i = 0; i < p->ex; i++) x[i] += delta;
  }
}

/* Keeps the first error; the batches from here on are handed out as it. */
static void fail(kn_pipeline *p, int rc, const char *msg) {
  pthread_mutex_lock(&p->ring_lock);
  if (!p->error_rc) {
    p->error_rc = rc;
    snprintf(p->error, sizeof p->error, "%s", msg);
  }
  pthread_mutex_unlock(&p->ring_lock);
}

/* Copies one raw record (reusing dst's storage). */
static int copy_raw(kn_stream_raw *dst, const kn_stream_raw *src) {
  if (src->len > dst->cap) {
    uint8_t *b = realloc(dst->data, src->len);
    if (!b) return KN_ENOMEM;
    dst->data = b;
    dst->cap = src->len;
  }
  if (src->len) memcpy(dst->data, src->data, src->len);
  dst->len = src->len;
  dst->file = src->file;
  dst->record = src->record;
  dst->slot = src->slot;
  dst->cached = src->cached;
  return KN_OK;
}

/* The raw records of streamed batch seq into me->raws, in batch order:
 * the batch's rows count, or < 0 (the error kept). */
static int read_stream(kn_pipeline *p, int64_t seq, producer *me) {
  const int64_t epoch = seq / p->bpe, start = (seq % p->bpe) * p->cfg.batch_size;
  const int64_t left = p->n - start;
  const int want = (int)(left < p->cfg.batch_size ? left : p->cfg.batch_size);
  char err[512] = "";
  int rc = KN_OK, got = 0;
  pthread_mutex_lock(&p->stream_lock);
  while (p->read_seq != seq) pthread_cond_wait(&p->stream_cond, &p->stream_lock);
  if (seq % p->bpe == 0 || kn_stream_epoch(p->stream) != epoch)
    rc = kn_stream_begin(p->stream, epoch, start, err, sizeof err);
  for (; !rc && got < want; got++) {
    const kn_stream_raw *rec;
    rc = kn_stream_next(p->stream, &rec, err, sizeof err);
    if (rc == 1)
      rc = copy_raw(&me->raws[got], rec);
    else if (rc == 0)
      snprintf(err, sizeof err, "stream: epoch %lld ended after %lld examples, %lld expected",
               (long long)epoch, (long long)(start + got), (long long)p->n),
          rc = KN_EFORMAT;
    if (rc == KN_ENOMEM) snprintf(err, sizeof err, "stream: out of memory for a batch's records");
  }
  p->read_seq++;
  pthread_cond_broadcast(&p->stream_cond);
  pthread_mutex_unlock(&p->stream_lock);
  if (rc) {
    fail(p, rc, err);
    return rc;
  }
  return got;
}

/* Makes this pipeline's part of batch seq (of the epoch whose order is
 * given) into s. Positions stay those of the whole batch, so augmentation
 * draws what it would for the whole batch. */
static void produce(kn_pipeline *p, int64_t seq, const int64_t *order, producer *me, slot *s) {
  float *scratch = me->scratch;
  const int64_t epoch = seq / p->bpe;
  const int64_t start = (seq % p->bpe) * p->cfg.batch_size + p->part_first;
  const int64_t left = p->n - start;
  const int rows = (int)(left <= 0 ? 0 : left < p->part_rows ? left : p->part_rows);
  const int ex = p->ex;
  const float *restrict scale = p->scale, *restrict shift = p->shift;
  for (int r = 0; r < rows; r++) {
    float *restrict dst = s->x + (size_t)r * ex;
    const float *restrict src;
    if (p->stream) {
      char err[512];
      int rc = kn_stream_decode(p->stream, &me->raws[p->part_first + r], scratch, &s->y[r], err,
                                sizeof err);
      if (rc) {
        fail(p, rc, err);
        s->rows = -1;
        return;
      }
      for (int f = 0; f < ex; f++) dst[f] = scratch[f] * scale[f] + shift[f];
      if (p->cfg.augment) augment(p, dst, scratch, epoch, start + r);
      if (s->y_onehot) {
        float *hot = s->y_onehot + (size_t)r * p->n_classes;
        memset(hot, 0, (size_t)p->n_classes * sizeof *hot);
        if (s->y[r] >= 0 && s->y[r] < p->n_classes) hot[s->y[r]] = 1.0f;
      }
      continue;
    }
    const int64_t row = order[start + r];
    if (p->stored) {
      /* Back to f32 for the maps and the model. */
      kn_convert(p->cfg.cast, p->stored + (size_t)row * ex, KN_F32, scratch, (size_t)ex);
      src = scratch;
    } else {
      src = kn_dataset_row(p->ds, row, scratch);
    }
    /* restrict: no aliasing, so this vectorizes. */
    for (int f = 0; f < ex; f++) dst[f] = src[f] * scale[f] + shift[f];
    if (p->cfg.augment) augment(p, dst, scratch, epoch, start + r);
    s->y[r] = p->ds->y[row];
    if (s->targets)
      memcpy(s->targets + (size_t)r * p->n_targets, p->ds->targets + (size_t)row * p->n_targets,
             (size_t)p->n_targets * sizeof *s->targets);
    if (s->y_onehot) {
      float *hot = s->y_onehot + (size_t)r * p->n_classes;
      memset(hot, 0, (size_t)p->n_classes * sizeof *hot);
      if (s->y[r] >= 0 && s->y[r] < p->n_classes) hot[s->y[r]] = 1.0f;
    }
  }
  s->rows = rows;
}

/* Batch seq into s: read (a stream's records, in order) and produced. */
static void make_batch(kn_pipeline *p, int64_t seq, const int64_t *order, producer *me, slot *s) {
  if (p->stream && read_stream(p, seq, me) < 0)
    s->rows = -1;
  else
    produce(p, seq, order, me, s);
}

static void *producer_main(void *arg) {
  producer *me = arg;
  kn_pipeline *p = me->p;
  pthread_mutex_lock(&p->ring_lock);
  for (;;) {
    while (!p->stop && !(me->id < p->active && p->next_claim < p->total &&
                         p->next_claim < p->consumed + p->depth))
      pthread_cond_wait(&p->space_cond, &p->ring_lock);
    if (p->stop) break;
    int64_t seq = p->next_claim++;
    const int64_t *order = p->stream ? NULL : get_order(p, seq / p->bpe);
    slot *s = &p->slots[seq % p->n_slots];
    pthread_mutex_unlock(&p->ring_lock);
    double t0 = now_s();
    make_batch(p, seq, order, me, s);
    double took = now_s() - t0;
    pthread_mutex_lock(&p->ring_lock);
    p->busy_s += took;
    p->made++;
    s->seq = seq;
    pthread_cond_broadcast(&p->ready_cond);
  }
  pthread_mutex_unlock(&p->ring_lock);
  return NULL;
}

static void stop_threads(kn_pipeline *p) {
  if (!p->started) return;
  pthread_mutex_lock(&p->ring_lock);
  p->stop = 1;
  pthread_cond_broadcast(&p->space_cond);
  pthread_mutex_unlock(&p->ring_lock);
  for (int i = 0; i < p->n_threads; i++) pthread_join(p->prods[i].tid, NULL);
  p->started = 0;
  p->stop = 0;
}

static int start_threads(kn_pipeline *p) {
  for (int i = 0; i < p->n_threads; i++) {
    if (pthread_create(&p->prods[i].tid, NULL, producer_main, &p->prods[i]) != 0) {
      pthread_mutex_lock(&p->ring_lock);
      p->stop = 1;
      pthread_cond_broadcast(&p->space_cond);
      pthread_mutex_unlock(&p->ring_lock);
      for (int j = 0; j < i; j++) pthread_join(p->prods[j].tid, NULL);
      p->stop = 0;
      return KN_ENOMEM;
    }
  }
  p->started = 1;
  return KN_OK;
}

void kn_pipeline_free(kn_pipeline *p) {
  if (!p) return;
  stop_threads(p);
  for (int i = 0; p->slots && i < p->n_slots; i++) {
    free(p->slots[i].x);
    free(p->slots[i].y);
    free(p->slots[i].y_onehot);
    free(p->slots[i].targets);
  }
  for (int i = 0; p->orders && i < p->n_orders; i++) free(p->orders[i].idx);
  for (int i = 0; p->prods && i < p->n_prods; i++) {
    free(p->prods[i].scratch);
    for (int k = 0; p->prods[i].raws && k < p->cfg.batch_size; k++) free(p->prods[i].raws[k].data);
    free(p->prods[i].raws);
  }
  free(p->slots);
  free(p->orders);
  free(p->prods);
  free(p->base);
  free(p->scale);
  free(p->row_buf);
  free(p->shift);
  free(p->shuffle_buf);
  free(p->stored);
  pthread_cond_destroy(&p->ready_cond);
  pthread_cond_destroy(&p->space_cond);
  pthread_mutex_destroy(&p->ring_lock);
  pthread_cond_destroy(&p->stream_cond);
  pthread_mutex_destroy(&p->stream_lock);
  free(p);
}

static int check_config(const kn_dataset *ds, const kn_pipeline_config *c, char *err,
                        size_t errlen) {
  if (!ds || (!ds->stream && ((!ds->x && !ds->x8) || !ds->y)) || ds->n < 1 ||
      ds->example_size < 1) {
    snprintf(err, errlen, "pipeline: the dataset is empty");
    return KN_EINVAL;
  }
  if (ds->stream) {
    /* What needs the whole data set at hand, or a position in it. */
    const char *refused = c->skip || c->take >= 0 ? "skip and take"
                          : c->shard_count > 1    ? "shard (the stream shards its files)"
                          : c->cast != KN_F32     ? "cast"
                          : c->standardize && !c->n_channels_given
                              ? "standardize without a given mean and std"
                              : NULL;
    if (refused) {
      snprintf(err, errlen, "pipeline: a streamed data set cannot %s", refused);
      return KN_EINVAL;
    }
  }
  if (c->batch_size < 1) {
    snprintf(err, errlen, "pipeline: batch_size must be >= 1, got %d", c->batch_size);
    return KN_EINVAL;
  }
  if (c->shuffle_buffer < 0) {
    snprintf(err, errlen, "pipeline: shuffle_buffer must be >= 0, got %lld",
             (long long)c->shuffle_buffer);
    return KN_EINVAL;
  }
  if (c->skip < 0 || c->skip >= ds->n) {
    snprintf(err, errlen,
             "pipeline: skip must be 0..%lld (the dataset has %lld examples), got %lld",
             (long long)ds->n - 1, (long long)ds->n, (long long)c->skip);
    return KN_EINVAL;
  }
  if (c->shard_count < 1 || c->shard_index < 0 || c->shard_index >= c->shard_count) {
    snprintf(err, errlen, "pipeline: shard %d of %d is not a shard (need 0 <= index < count)",
             c->shard_index, c->shard_count);
    return KN_EINVAL;
  }
  const int parts = c->part_count > 1 ? c->part_count : 1;
  if (c->part_count < 0 || c->part_index < 0 || c->part_index >= parts ||
      c->batch_size % parts != 0) {
    snprintf(err, errlen,
             "pipeline: part %d of %d of batches of %d is not a part (need 0 <= index < count, "
             "and count dividing the batch)",
             c->part_index, c->part_count, c->batch_size);
    return KN_EINVAL;
  }
  if (c->repeat == 0) {
    snprintf(err, errlen, "pipeline: repeat must be >= 1 or < 0 (forever), got 0");
    return KN_EINVAL;
  }
  if ((c->num_parallel_calls < 0 && c->num_parallel_calls != KN_AUTO) ||
      c->num_parallel_calls > MAX_THREADS) {
    snprintf(err, errlen, "pipeline: num_parallel_calls must be 0..%d or auto, got %d", MAX_THREADS,
             c->num_parallel_calls);
    return KN_EINVAL;
  }
  if ((c->prefetch < 1 && c->prefetch != KN_AUTO) || c->prefetch > 1024) {
    snprintf(err, errlen, "pipeline: prefetch must be 1..1024 or auto, got %d", c->prefetch);
    return KN_EINVAL;
  }
  if (c->cast != KN_F32 && c->cast != KN_F16 && c->cast != KN_BF16) {
    snprintf(err, errlen, "pipeline: cast must be to f32, f16 or bf16, got %s",
             kn_dtype_name(c->cast));
    return KN_EINVAL;
  }
  if (c->one_hot && (c->one_hot_depth < 0 || c->one_hot_depth > (1 << 20))) {
    snprintf(err, errlen, "pipeline: one_hot depth must be 0 (the classes) .. %d, got %d", 1 << 20,
             c->one_hot_depth);
    return KN_EINVAL;
  }
  if (c->one_hot && c->one_hot_depth > 0 && ds->n_classes > c->one_hot_depth) {
    snprintf(err, errlen, "pipeline: one_hot depth %d is too small for labels up to %d",
             c->one_hot_depth, ds->n_classes - 1);
    return KN_EINVAL;
  }
  if (c->augment && !(ds->ndim == 2 || ds->ndim == 3)) {
    snprintf(err, errlen,
             "pipeline: augmentation needs image examples (height, width[, channels]), got rank %d",
             ds->ndim);
    return KN_EINVAL;
  }
  if (c->augment & KN_AUG_RANDOM_CROP && (c->crop_padding < 1 || c->crop_padding > 4096)) {
    snprintf(err, errlen, "pipeline: random_crop padding must be 1..4096, got %d", c->crop_padding);
    return KN_EINVAL;
  }
  if (c->augment & KN_AUG_RANDOM_BRIGHTNESS && !(c->brightness_delta > 0)) {
    snprintf(err, errlen, "pipeline: random_brightness max_delta must be > 0, got %g",
             (double)c->brightness_delta);
    return KN_EINVAL;
  }
  return KN_OK;
}

/* normalize and standardize folded into scale/shift, with statistics over
 * the rows this pipeline reads. */
static int compute_affine(kn_pipeline *p, char *err, size_t errlen) {
  const kn_pipeline_config *c = &p->cfg;
  const int ex = p->ex;
  for (int f = 0; f < ex; f++) {
    p->scale[f] = 1.0f;
    p->shift[f] = 0.0f;
  }
  if (c->normalize && p->ds->value_range > 0) {
    for (int f = 0; f < ex; f++) p->scale[f] = 1.0f / p->ds->value_range;
  } else if (c->normalize) {
    /* No known range (CSV): min-max per feature onto [0, 1]; scale and
     * shift hold each feature's low and high while the rows go by. */
    for (int64_t i = 0; i < p->n; i++) {
      const float *row = kn_dataset_row(p->ds, p->base[i], p->row_buf);
      for (int f = 0; f < ex; f++) {
        const float v = row[f];
        if (i == 0 || v < p->scale[f]) p->scale[f] = v;
        if (i == 0 || v > p->shift[f]) p->shift[f] = v;
      }
    }
    for (int f = 0; f < ex; f++) {
      const float lo = p->scale[f], hi = p->shift[f];
      p->scale[f] = hi > lo ? 1.0f / (hi - lo) : 1.0f;
      p->shift[f] = -lo * p->scale[f];
    }
  }
  if (!c->standardize) return KN_OK;
  const int ch = p->ds->ndim >= 1 ? p->ds->shape[p->ds->ndim - 1] : ex;
  if (ch < 1 || ex % ch != 0) {
    snprintf(err, errlen, "pipeline: standardize: the last dimension %d does not divide %d values",
             ch, ex);
    return KN_EINVAL;
  }
  if (c->n_channels_given && c->n_channels_given != ch) {
    snprintf(err, errlen,
             "pipeline: standardize: %d means and stds given, the examples have %d "
             "channels (their last dimension)",
             c->n_channels_given, ch);
    return KN_EINVAL;
  }
  double mean[64], std[64];
  double *mean_v = ch <= 64 ? mean : calloc((size_t)ch, sizeof *mean_v);
  double *std_v = ch <= 64 ? std : calloc((size_t)ch, sizeof *std_v);
  if (!mean_v || !std_v) {
    if (ch > 64) free(mean_v), free(std_v);
    snprintf(err, errlen, "pipeline: out of memory for %d channel statistics", ch);
    return KN_ENOMEM;
  }
  if (c->n_channels_given) {
    for (int k = 0; k < ch; k++) {
      mean_v[k] = c->mean[k];
      std_v[k] = c->std[k];
      if (!(std_v[k] > 0)) {
        snprintf(err, errlen, "pipeline: standardize: std[%d] must be > 0, got %g", k, std_v[k]);
        if (ch > 64) free(mean_v), free(std_v);
        return KN_EINVAL;
      }
    }
  } else {
    /* Sums in double: 60000 x 784 values lose no digits that matter. */
    for (int k = 0; k < ch; k++) mean_v[k] = std_v[k] = 0.0;
    for (int64_t i = 0; i < p->n; i++) {
      const float *row = kn_dataset_row(p->ds, p->base[i], p->row_buf);
      for (int f = 0; f < ex; f++) {
        double v = (double)row[f] * p->scale[f] + p->shift[f];
        mean_v[f % ch] += v;
        std_v[f % ch] += v * v;
      }
    }
    const double count = (double)p->n * (ex / ch);
    for (int k = 0; k < ch; k++) {
      mean_v[k] /= count;
      double var = std_v[k] / count - mean_v[k] * mean_v[k];
      std_v[k] = var > 1e-12 ? sqrt(var) : 1.0; /* a constant channel stays 0 */
    }
  }
  for (int f = 0; f < ex; f++) {
    int k = f % ch;
    p->shift[f] = (float)((p->shift[f] - mean_v[k]) / std_v[k]);
    p->scale[f] = (float)(p->scale[f] / std_v[k]);
  }
  if (ch > 64) free(mean_v), free(std_v);
  return KN_OK;
}

static int pipeline_create(const kn_dataset *ds, const kn_pipeline_config *cfg,
                           const kn_pipeline *stats_from, kn_pipeline **out, char *err,
                           size_t errlen) {
  *out = NULL;
  int rc = check_config(ds, cfg, err, errlen);
  if (rc) return rc;
  kn_pipeline *p = calloc(1, sizeof *p);
  if (!p) goto oom;
  p->ds = ds;
  p->cfg = *cfg;
  p->ex = (int)ds->example_size;
  p->n_classes = cfg->one_hot_depth > 0 ? cfg->one_hot_depth
                 : ds->n_classes > 0    ? ds->n_classes
                                        : 1;
  if (stats_from && p->n_classes < stats_from->n_classes) p->n_classes = stats_from->n_classes;
  p->n_targets = ds->targets ? ds->n_targets : 0;
  p->height = ds->ndim >= 2 ? ds->shape[0] : 1;
  p->width = ds->ndim >= 2 ? ds->shape[1] : p->ex;
  p->channels = ds->ndim == 3 ? ds->shape[2] : 1;
  pthread_mutex_init(&p->ring_lock, NULL);
  pthread_cond_init(&p->ready_cond, NULL);
  pthread_cond_init(&p->space_cond, NULL);
  pthread_mutex_init(&p->stream_lock, NULL);
  pthread_cond_init(&p->stream_cond, NULL);
  p->stream = ds->stream;

  /* skip/take on the source, then shard by position. */
  int64_t avail = ds->n - cfg->skip;
  if (cfg->take >= 0 && cfg->take < avail) avail = cfg->take;
  const int64_t shards = cfg->shard_count;
  p->n = avail / shards + (cfg->shard_index < avail % shards ? 1 : 0);
  if (p->n < 1) {
    snprintf(err, errlen, "pipeline: shard %d of %d of %lld examples is empty", cfg->shard_index,
             cfg->shard_count, (long long)avail);
    kn_pipeline_free(p);
    return KN_EINVAL;
  }
  if (!p->stream) {
    p->base = malloc((size_t)p->n * sizeof *p->base);
    if (!p->base) goto oom;
    for (int64_t i = 0; i < p->n; i++) p->base[i] = cfg->skip + cfg->shard_index + i * shards;
  }
  p->bpe =
      cfg->drop_remainder ? p->n / cfg->batch_size : (p->n + cfg->batch_size - 1) / cfg->batch_size;
  if (p->bpe < 1) {
    snprintf(err, errlen, "pipeline: %lld examples make no full batch of %d with drop_remainder",
             (long long)p->n, cfg->batch_size);
    kn_pipeline_free(p);
    return KN_EINVAL;
  }
  p->part_rows = cfg->batch_size / (cfg->part_count > 1 ? cfg->part_count : 1);
  p->part_first = cfg->part_index * p->part_rows;
  p->total = cfg->repeat < 0 || p->bpe > INT64_MAX / cfg->repeat ? INT64_MAX : p->bpe * cfg->repeat;
  if (!p->stream && cfg->shuffle_buffer > 1 && cfg->shuffle_buffer < p->n) {
    p->shuffle_buf = malloc((size_t)cfg->shuffle_buffer * sizeof *p->shuffle_buf);
    if (!p->shuffle_buf) goto oom;
  }

  p->scale = malloc((size_t)p->ex * sizeof *p->scale);
  p->shift = malloc((size_t)p->ex * sizeof *p->shift);
  p->row_buf = malloc((size_t)p->ex * sizeof *p->row_buf);
  if (!p->scale || !p->shift || !p->row_buf) goto oom;
  if (stats_from) {
    memcpy(p->scale, stats_from->scale, (size_t)p->ex * sizeof *p->scale);
    memcpy(p->shift, stats_from->shift, (size_t)p->ex * sizeof *p->shift);
  } else if ((rc = compute_affine(p, err, errlen))) {
    kn_pipeline_free(p);
    return rc;
  }

  if (cfg->cast != KN_F32) {
    /* The examples at the cast's precision: what the model sees is what
     * f16 / bf16 storage keeps. */
    const size_t count = (size_t)ds->n * (size_t)p->ex;
    p->stored = malloc(count * sizeof *p->stored);
    if (!p->stored) goto oom;
    if (ds->x) {
      kn_convert(KN_F32, ds->x, cfg->cast, p->stored, count);
    } else {
      for (int64_t i = 0; i < ds->n; i++)
        kn_convert(KN_F32, kn_dataset_row(ds, i, p->row_buf), cfg->cast,
                   p->stored + (size_t)i * p->ex, (size_t)p->ex);
    }
  }

  /* Threads and ring. */
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (cpus < 1) cpus = 1;
  const size_t slot_bytes =
      (size_t)p->part_rows * ((size_t)p->ex * sizeof(float) + sizeof(int32_t));
  p->auto_threads = cfg->num_parallel_calls == KN_AUTO;
  p->auto_prefetch = cfg->prefetch == KN_AUTO && cfg->num_parallel_calls != 0;
  if (p->auto_threads) {
    p->n_threads = (int)(cpus < AUTO_MAX_THREADS ? cpus : AUTO_MAX_THREADS);
    p->active = 1; /* grown by the tuner */
  } else {
    p->n_threads = cfg->num_parallel_calls;
    p->active = p->n_threads;
  }
  if (p->n_threads == 0) {
    p->n_slots = p->depth = 1; /* made in the consumer's thread */
  } else if (p->auto_prefetch) {
    size_t fit = AUTO_RING_BYTES / (slot_bytes ? slot_bytes : 1);
    size_t want = 2 * (size_t)p->n_threads + 2;
    p->n_slots = (int)(fit < want ? (fit < 2 ? 2 : fit) : want);
    p->depth = 2;
  } else {
    p->n_slots = p->depth = cfg->prefetch + 1; /* + the batch the consumer holds */
  }
  p->slots = calloc((size_t)p->n_slots, sizeof *p->slots);
  if (!p->slots) goto oom;
  for (int i = 0; i < p->n_slots; i++) {
    slot *s = &p->slots[i];
    s->seq = -1;
    const size_t rows = (size_t)p->part_rows;
    s->x = malloc(rows * p->ex * sizeof *s->x);
    s->y = malloc(rows * sizeof *s->y);
    if (cfg->one_hot) s->y_onehot = malloc(rows * p->n_classes * sizeof(float));
    if (p->n_targets) s->targets = malloc(rows * p->n_targets * sizeof *s->targets);
    if (!s->x || !s->y || (cfg->one_hot && !s->y_onehot) || (p->n_targets && !s->targets)) goto oom;
    /* First touch now, not in the first training steps. */
    memset(s->x, 0, rows * p->ex * sizeof *s->x);
  }
  p->n_orders = p->stream ? 0 : (int)(p->n_slots / p->bpe + 2);
  p->orders = calloc((size_t)p->n_orders, sizeof *p->orders);
  if (!p->orders) goto oom;
  for (int i = 0; i < p->n_orders; i++) {
    p->orders[i].epoch = -1;
    p->orders[i].idx = malloc((size_t)p->n * sizeof(int64_t));
    if (!p->orders[i].idx) goto oom;
  }
  p->n_prods = p->n_threads > 0 ? p->n_threads : 1;
  p->prods = calloc((size_t)p->n_prods, sizeof *p->prods);
  if (!p->prods) goto oom;
  for (int i = 0; i < p->n_prods; i++) {
    p->prods[i].p = p;
    p->prods[i].id = i;
    p->prods[i].scratch = malloc((size_t)p->ex * sizeof(float));
    if (!p->prods[i].scratch) goto oom;
    if (p->stream && !(p->prods[i].raws = calloc((size_t)cfg->batch_size, sizeof(kn_stream_raw))))
      goto oom;
  }
  *out = p;
  return KN_OK;
oom:
  snprintf(err, errlen, "pipeline: out of memory for batches of %d x %zu values", cfg->batch_size,
           ds->example_size);
  kn_pipeline_free(p);
  return KN_ENOMEM;
}

int kn_pipeline_new(const kn_dataset *ds, const kn_pipeline_config *cfg, kn_pipeline **out,
                    char *err, size_t errlen) {
  return pipeline_create(ds, cfg, NULL, out, err, errlen);
}

int kn_pipeline_new_eval(const kn_pipeline *train, const kn_dataset *ds, kn_pipeline **out,
                         char *err, size_t errlen) {
  *out = NULL;
  if (ds->example_size != (size_t)train->ex) {
    snprintf(err, errlen, "pipeline: evaluation examples hold %zu values, training ones %d",
             ds->example_size, train->ex);
    return KN_EINVAL;
  }
  kn_pipeline_config c;
  kn_pipeline_config_default(&c);
  c.batch_size = train->cfg.batch_size;
  c.one_hot = train->cfg.one_hot;
  c.one_hot_depth = train->n_classes;
  c.cast = train->cfg.cast;
  c.part_index = train->cfg.part_index; /* a worker evaluates its own part */
  c.part_count = train->cfg.part_count;
  c.num_parallel_calls = 0;
  return pipeline_create(ds, &c, train, out, err, errlen);
}

/* Sizes threads and depth from the warm-up timings. */
static void tune(kn_pipeline *p) {
  double produce = p->made ? p->busy_s / (double)p->made : 0.0;
  double consume = p->consume_n ? p->consume_s / (double)p->consume_n : 0.0;
  if (p->auto_threads) {
    /* Enough producers that together they outpace the consumer by 25%. */
    double need = consume > 1e-9 ? ceil(1.25 * produce / consume) : (double)p->n_threads;
    int threads = need < 1 ? 1 : need > p->n_threads ? p->n_threads : (int)need;
    p->active = threads;
  }
  if (p->auto_prefetch) {
    int depth = 2 * p->active;
    p->depth = depth < 2 ? 2 : depth > p->n_slots ? p->n_slots : depth;
  }
  p->tuned = 1;
  pthread_cond_broadcast(&p->space_cond);
}

int kn_pipeline_next(kn_pipeline *p, kn_batch *out) {
  double t_in = now_s();
  if (p->handed > 0 && p->last_return > 0) {
    p->consume_s += t_in - p->last_return;
    p->consume_n++;
  }
  memset(out, 0, sizeof *out);
  slot *s;
  if (p->n_threads == 0) {
    if (p->held) p->consumed++;
    p->held = 0;
    if (p->consumed >= p->total) return 0;
    const int64_t *order = p->stream ? NULL : get_order(p, p->consumed / p->bpe);
    s = &p->slots[0];
    double t0 = now_s();
    make_batch(p, p->consumed, order, &p->prods[0], s);
    p->busy_s += now_s() - t0;
    p->made++;
    s->seq = p->consumed;
    p->held = 1;
  } else {
    /* Started here, not in kn_pipeline_new, so a restore right after new
     * has no threads to stop; and outside ring_lock, which a failed start
     * needs to wind the started ones down. */
    if (!p->started && start_threads(p) != KN_OK) {
      p->n_threads = 0; /* no thread could start: make batches here instead of failing */
      return kn_pipeline_next(p, out);
    }
    pthread_mutex_lock(&p->ring_lock);
    if (p->held) {
      p->consumed++;
      p->held = 0;
      pthread_cond_broadcast(&p->space_cond);
    }
    if (p->consumed >= p->total) {
      pthread_mutex_unlock(&p->ring_lock);
      return 0;
    }
    if ((p->auto_threads || p->auto_prefetch) && !p->tuned && p->handed >= WARMUP_BATCHES) tune(p);
    s = &p->slots[p->consumed % p->n_slots];
    double t0 = now_s();
    while (s->seq != p->consumed) pthread_cond_wait(&p->ready_cond, &p->ring_lock);
    p->wait_s += now_s() - t0;
    p->held = 1;
    pthread_mutex_unlock(&p->ring_lock);
  }
  if (s->rows < 0) return p->error_rc; /* kept by the failing producer */
  out->rows = s->rows;
  out->epoch = (int)(s->seq / p->bpe);
  out->index = s->seq % p->bpe;
  out->x = s->x;
  out->y = s->y;
  out->y_onehot = s->y_onehot;
  out->targets = s->targets;
  p->handed++;
  p->last_return = now_s();
  return 1;
}

int64_t kn_pipeline_batches_per_epoch(const kn_pipeline *p) {
  return p->bpe;
}

int64_t kn_pipeline_examples_per_epoch(const kn_pipeline *p) {
  return p->cfg.drop_remainder ? p->bpe * p->cfg.batch_size : p->n;
}

int kn_pipeline_example_size(const kn_pipeline *p) {
  return p->ex;
}

void kn_pipeline_save(const kn_pipeline *p, kn_pipeline_state *st) {
  int64_t next = p->consumed + p->held;
  st->epoch = next / p->bpe;
  st->batch = next % p->bpe;
  st->seed = p->cfg.seed;
}

int kn_pipeline_restore(kn_pipeline *p, const kn_pipeline_state *st, char *err, size_t errlen) {
  if (st->seed != p->cfg.seed) {
    snprintf(err, errlen, "pipeline: saved state has seed %llu, this pipeline %llu",
             (unsigned long long)st->seed, (unsigned long long)p->cfg.seed);
    return KN_EINVAL;
  }
  if (st->epoch < 0 || st->batch < 0 || st->batch >= p->bpe ||
      (p->cfg.repeat >= 0 && st->epoch * p->bpe + st->batch > p->total)) {
    snprintf(err, errlen,
             "pipeline: saved position epoch %lld batch %lld is outside this pipeline (%lld "
             "batches per epoch, %d epochs)",
             (long long)st->epoch, (long long)st->batch, (long long)p->bpe, p->cfg.repeat);
    return KN_EINVAL;
  }
  stop_threads(p);
  p->consumed = p->next_claim = st->epoch * p->bpe + st->batch;
  p->held = 0;
  p->read_seq = p->consumed;
  if (p->stream && st->epoch * p->bpe + st->batch < p->total) {
    /* Replayed to the position now, so the first batch is not slower. */
    int rc = kn_stream_begin(p->stream, st->epoch, st->batch * p->cfg.batch_size, err, errlen);
    if (rc) return rc;
  }
  for (int i = 0; i < p->n_slots; i++) p->slots[i].seq = -1;
  return KN_OK;
}

const char *kn_pipeline_error(const kn_pipeline *p) {
  return p->error;
}

int kn_pipeline_state_format(const kn_pipeline_state *st, char *buf, size_t len) {
  int n = snprintf(buf, len, "%lld:%lld:%llu", (long long)st->epoch, (long long)st->batch,
                   (unsigned long long)st->seed);
  return n > 0 && (size_t)n < len ? KN_OK : KN_EINVAL;
}

int kn_pipeline_state_parse(const char *text, kn_pipeline_state *st, char *err, size_t errlen) {
  long long epoch, batch;
  unsigned long long seed;
  int used = 0;
  if (sscanf(text, "%lld:%lld:%llu%n", &epoch, &batch, &seed, &used) != 3 || text[used] != '\0' ||
      epoch < 0 || batch < 0) {
    snprintf(err, errlen, "pipeline: state '%.60s' is not epoch:batch:seed", text);
    return KN_EINVAL;
  }
  st->epoch = epoch;
  st->batch = batch;
  st->seed = seed;
  return KN_OK;
}

void kn_pipeline_stats_get(const kn_pipeline *p, kn_pipeline_stats *out) {
  kn_pipeline *mp = (kn_pipeline *)p; /* the lock only; nothing is changed */
  pthread_mutex_lock(&mp->ring_lock);
  out->threads = p->n_threads ? p->active : 0;
  out->prefetch = p->n_threads ? p->depth : 0;
  out->tuned = p->tuned;
  out->produce_ms = p->made ? 1e3 * p->busy_s / (double)p->made : 0.0;
  out->consume_ms = p->consume_n ? 1e3 * p->consume_s / (double)p->consume_n : 0.0;
  out->wait_s = p->wait_s;
  out->batches = p->handed;
  const size_t slot_bytes =
      (size_t)p->part_rows * ((size_t)p->ex * sizeof(float) + 4) +
      (p->slots && p->slots[0].y_onehot ? (size_t)p->part_rows * p->n_classes * sizeof(float) : 0);
  out->memory_bytes = (size_t)p->n_slots * slot_bytes;
  pthread_mutex_unlock(&mp->ring_lock);
  if (p->stream) {
    pthread_mutex_lock(&mp->stream_lock);
    out->memory_bytes += kn_stream_memory_bytes(p->stream);
    for (int i = 0; i < p->n_prods; i++)
      for (int k = 0; k < p->cfg.batch_size; k++) out->memory_bytes += p->prods[i].raws[k].cap;
    pthread_mutex_unlock(&mp->stream_lock);
  }
}
