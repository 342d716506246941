/* train_state.c — the training-state file beside each checkpoint: step,
 * data position, dropout stream, partial epoch sums, and the optimizer's
 * step count and flat moment arrays. Layout (little-endian, as x86 and Arm
 * are): the 8-byte magic "KILNTS01", int64 fields (21 in version 1; 29 in
 * version 2, which adds top-k hit counts and the callbacks' state; 31 in
 * version 3, which adds the dynamic loss scale and its counter; 33 in
 * version 4, which adds the loss scaler's skipped steps, in all and in a
 * row), then m (n floats) and v (n floats) where the optimizer keeps them,
 * then the SHA-256 of all that came before, so a torn or altered file is
 * refused rather than half-used. Version 1 to 3 files still resume. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph_internal.h"
#include "train_state.h"

#define STATE_MAGIC "KILNTS01"
enum { N_FIELDS_V1 = 21, N_FIELDS_V2 = 29, N_FIELDS_V3 = 31, N_FIELDS = 33, VERSION = 4 };

void kn_train_state_path(const char *checkpoint_path, char *out, size_t len) {
  static const char ext[] = ".safetensors";
  size_t n = strlen(checkpoint_path), e = sizeof ext - 1;
  if (n >= e && strcmp(checkpoint_path + n - e, ext) == 0) n -= e;
  snprintf(out, len, "%.*s.state", (int)n, checkpoint_path);
}

static void pack(const kn_train_state *st, kn_optimizer *opt, int64_t f[N_FIELDS]) {
  kn_optimizer_type type;
  size_t n;
  float *m, *v;
  int64_t *iterations;
  kn_optimizer_moments(opt, &type, &n, &m, &v, &iterations);
  const kn_callback_state *cs = &st->callbacks;
  double losses[10] = {st->epoch.loss,  st->interval.loss, st->epoch.sq, st->epoch.abs,
                       st->interval.sq, st->interval.abs,  cs->lr,       cs->plateau_best,
                       cs->stop_best,   st->loss_scale};
  int64_t bits[10];
  memcpy(bits, losses, sizeof bits); /* doubles kept bit for bit */
  int64_t fields[N_FIELDS] = {VERSION,
                              st->step,
                              st->pipeline.epoch,
                              st->pipeline.batch,
                              (int64_t)st->pipeline.seed,
                              (int64_t)st->train_runs,
                              bits[0],
                              bits[1],
                              st->epoch.rows,
                              st->epoch.correct,
                              st->interval.rows,
                              st->interval.correct,
                              (int64_t)type,
                              *iterations,
                              (int64_t)n,
                              m != NULL,
                              v != NULL,
                              bits[2],
                              bits[3],
                              bits[4],
                              bits[5],
                              st->epoch.top_k,
                              st->interval.top_k,
                              bits[6],
                              bits[7],
                              cs->plateau_wait,
                              cs->plateau_cooldown,
                              bits[8],
                              cs->stop_wait,
                              bits[9],
                              st->loss_scale_good_steps,
                              st->loss_scale_skipped,
                              st->loss_scale_skipped_in_a_row};
  memcpy(f, fields, sizeof fields);
}

int kn_train_state_write(const char *path, const kn_train_state *st, kn_optimizer *opt, char *err,
                         size_t errlen) {
  int64_t f[N_FIELDS];
  pack(st, opt, f);
  kn_optimizer_type type;
  size_t n;
  float *m, *v;
  int64_t *iterations;
  kn_optimizer_moments(opt, &type, &n, &m, &v, &iterations);
  char tmp[4096];
  int fd = kn_durable_open(path, tmp, sizeof tmp, "training state", err, errlen);
  if (fd < 0) return KN_EIO;
  kc_sha256 h;
  kc_sha256_init(&h);
  int werr = kn_write_all(fd, STATE_MAGIC, 8, &h) || kn_write_all(fd, f, sizeof f, &h);
  if (!werr && m) werr = kn_write_all(fd, m, n * sizeof(float), &h);
  if (!werr && v) werr = kn_write_all(fd, v, n * sizeof(float), &h);
  uint8_t digest[32];
  kc_sha256_final(&h, digest);
  if (!werr) werr = kn_write_all(fd, digest, sizeof digest, NULL);
  return kn_durable_finish(fd, werr, tmp, path, "training state", err, errlen);
}

int kn_train_state_read(const char *path, kn_train_state *st, kn_optimizer *opt, char *err,
                        size_t errlen) {
  kn_optimizer_type type;
  size_t n;
  float *m, *v;
  int64_t *iterations;
  kn_optimizer_moments(opt, &type, &n, &m, &v, &iterations);
  const size_t moments = ((m != NULL) + (v != NULL)) * n * sizeof(float) + 32;
  size_t head = 8 + N_FIELDS * sizeof(int64_t), want = head + moments;
  FILE *file = fopen(path, "rb");
  if (!file) {
    snprintf(err, errlen, "training state %s: cannot open: %s", path, strerror(errno));
    return KN_EIO;
  }
  uint8_t *buf = malloc(want + 1);
  size_t got = buf ? fread(buf, 1, want + 1, file) : 0;
  fclose(file);
  int rc = KN_OK;
  int64_t f[N_FIELDS] = {0};
  if (!buf) {
    snprintf(err, errlen, "training state %s: out of memory for %zu bytes", path, want);
    return KN_ENOMEM;
  }
  if (got < 8 + N_FIELDS_V1 * sizeof(int64_t) || memcmp(buf, STATE_MAGIC, 8) != 0) {
    snprintf(err, errlen, "training state %s: not a kiln training-state file", path);
    rc = KN_EFORMAT;
    goto out;
  }
  memcpy(f, buf + 8, N_FIELDS_V1 * sizeof(int64_t));
  if (f[0] >= 1 && f[0] <= 3) { /* the shorter headers of versions 1 to 3 */
    const size_t fields = f[0] == 1 ? N_FIELDS_V1 : f[0] == 2 ? N_FIELDS_V2 : N_FIELDS_V3;
    head = 8 + fields * sizeof(int64_t);
    want = head + moments;
    if (got >= head) memcpy(f, buf + 8, fields * sizeof(int64_t));
  } else if (f[0] == VERSION && got >= head) {
    memcpy(f, buf + 8, sizeof f);
  }
  if (f[0] < 1 || f[0] > VERSION) {
    snprintf(err, errlen, "training state %s: version %lld, this kiln reads versions 1 to %d", path,
             (long long)f[0], VERSION);
    rc = KN_EFORMAT;
  } else if (f[12] != (int64_t)type || f[14] != (int64_t)n || f[15] != (m != NULL) ||
             f[16] != (v != NULL)) {
    snprintf(err, errlen,
             "training state %s: saved for optimizer type %lld over %lld parameters, this run "
             "has type %d over %zu: resume with the spec the checkpoint was made with",
             path, (long long)f[12], (long long)f[14], (int)type, n);
    rc = KN_EINVAL;
  } else if (got != want) {
    snprintf(err, errlen, "training state %s: %zu bytes, expected %zu (truncated?)", path, got,
             want);
    rc = KN_EFORMAT;
  }
  if (rc) goto out;
  kc_sha256 h;
  uint8_t digest[32];
  kc_sha256_init(&h);
  kc_sha256_update(&h, buf, want - 32);
  kc_sha256_final(&h, digest);
  if (memcmp(digest, buf + want - 32, 32) != 0) {
    snprintf(err, errlen, "training state %s: checksum mismatch (the file is damaged)", path);
    rc = KN_EFORMAT;
    goto out;
  }
  st->step = f[1];
  st->pipeline.epoch = f[2];
  st->pipeline.batch = f[3];
  st->pipeline.seed = (uint64_t)f[4];
  st->train_runs = (uint64_t)f[5];
  memcpy(&st->epoch.loss, &f[6], sizeof(double));
  memcpy(&st->interval.loss, &f[7], sizeof(double));
  st->epoch.rows = f[8];
  st->epoch.correct = f[9];
  st->interval.rows = f[10];
  st->interval.correct = f[11];
  memcpy(&st->epoch.sq, &f[17], sizeof(double));
  memcpy(&st->epoch.abs, &f[18], sizeof(double));
  memcpy(&st->interval.sq, &f[19], sizeof(double));
  memcpy(&st->interval.abs, &f[20], sizeof(double));
  if (f[0] >= 2) {
    kn_callback_state *cs = &st->callbacks;
    st->epoch.top_k = f[21];
    st->interval.top_k = f[22];
    memcpy(&cs->lr, &f[23], sizeof(double));
    memcpy(&cs->plateau_best, &f[24], sizeof(double));
    cs->plateau_wait = f[25];
    cs->plateau_cooldown = f[26];
    memcpy(&cs->stop_best, &f[27], sizeof(double));
    cs->stop_wait = f[28];
  }
  if (f[0] >= 3) {
    memcpy(&st->loss_scale, &f[29], sizeof(double));
    st->loss_scale_good_steps = f[30];
  }
  if (f[0] >= 4) {
    st->loss_scale_skipped = f[31];
    st->loss_scale_skipped_in_a_row = f[32];
  }
  *iterations = f[13];
  if (m) memcpy(m, buf + head, n * sizeof(float));
  if (v) memcpy(v, buf + head + (m ? n * sizeof(float) : 0), n * sizeof(float));
out:
  free(buf);
  return rc;
}
