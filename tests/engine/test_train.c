/* The training loop on small generated data: it learns, it is repeatable
 * for a seed, it reports, stops on request, and its checkpoint is a
 * well-formed safetensors file with every weight. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "engine.h"
#include "train_state.h"

#define CLASSES  3
#define FEATURES 8

/* Three Gaussian-ish blobs: class c centred at +2 on feature c. */
static kn_dataset make_blobs(int64_t n, uint64_t seed) {
  kn_dataset ds = {
      .n = n, .ndim = 1, .shape = {FEATURES}, .example_size = FEATURES, .n_classes = CLASSES};
  ds.x = malloc((size_t)n * FEATURES * sizeof(float));
  ds.y = malloc((size_t)n * sizeof(int32_t));
  kn_rng rng;
  kn_rng_seed(&rng, seed);
  for (int64_t i = 0; i < n; i++) {
    int c = (int)kn_rng_below(&rng, CLASSES);
    ds.y[i] = c;
    for (int f = 0; f < FEATURES; f++) {
      float noise = kn_rng_uniform(&rng) + kn_rng_uniform(&rng) - 1.0f;
      ds.x[i * FEATURES + f] = noise + (f == c ? 2.0f : 0.0f);
    }
  }
  return ds;
}

static kn_model make_model(int batch) {
  static const kn_layer_config layers[2] = {
      {.type = KN_LAYER_DENSE,
       .name = "hidden",
       .units = 16,
       .use_bias = 1,
       .activation = KN_ACT_RELU},
      {.type = KN_LAYER_DENSE, .name = "out", .units = CLASSES, .use_bias = 1}};
  kn_model_config cfg = {.input_ndim = 1,
                         .input_shape = {FEATURES},
                         .n_layers = 2,
                         .layers = layers,
                         .batch_size = batch};
  kn_model m;
  char err[256];
  assert_int_equal(kn_model_build(&cfg, &m, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(m.graph, 17, NULL, err, sizeof err), KN_OK);
  return m;
}

typedef struct record {
  double losses[256];
  int n_losses;
  int n_epochs;
  double last_val_accuracy;
  char checkpoint[512];
  char sha256[65];
  int64_t bytes;
  int stop_after_epoch;
} record;

static int on_event(const kn_train_event *ev, void *user) {
  record *r = user;
  if (ev->kind == KN_EVENT_STEP && r->n_losses < 256) r->losses[r->n_losses++] = ev->values[0];
  if (ev->kind == KN_EVENT_EPOCH) {
    r->n_epochs++;
    for (int i = 0; i < ev->n_metrics; i++) {
      if (strcmp(ev->names[i], "val_accuracy") == 0) r->last_val_accuracy = ev->values[i];
    }
    if (r->stop_after_epoch && ev->epoch == r->stop_after_epoch) return 1;
  }
  if (ev->kind == KN_EVENT_CHECKPOINT) {
    snprintf(r->checkpoint, sizeof r->checkpoint, "%s", ev->path);
    memcpy(r->sha256, ev->checkpoint->sha256, sizeof r->sha256);
    r->bytes = ev->checkpoint->bytes;
  }
  return 0;
}

static kn_train_config config(const char *ckpt_dir) {
  kn_train_config tc = {.epochs = 4,
                        .batch_size = 32,
                        .shuffle = 1,
                        .seed = 5,
                        .log_every_steps = 5,
                        .checkpoint_dir = ckpt_dir,
                        .checkpoint_prefix = "ckpt"};
  tc.optimizer = (kn_optimizer_config){.type = KN_OPT_ADAM,
                                       .learning_rate = 0.01f,
                                       .beta1 = 0.9f,
                                       .beta2 = 0.999f,
                                       .epsilon = 1e-7f};
  return tc;
}

static void training_learns_separable_blobs(void **state) {
  (void)state;
  kn_dataset train = make_blobs(1000, 1), val = make_blobs(300, 2);
  kn_model m = make_model(32);
  double loss0, acc0, loss1, acc1;
  char err[256];
  assert_int_equal(kn_evaluate(&m, &val, &loss0, &acc0, err, sizeof err), KN_OK);
  kn_train_config tc = config(NULL);
  record r = {0};
  assert_int_equal(kn_train(&m, &train, &val, &tc, on_event, &r, err, sizeof err), KN_OK);
  assert_int_equal(kn_evaluate(&m, &val, &loss1, &acc1, err, sizeof err), KN_OK);
  print_message("val loss %.4f -> %.4f, accuracy %.3f -> %.3f\n", loss0, loss1, acc0, acc1);
  assert_true(loss1 < loss0 * 0.5);
  assert_true(acc1 >= 0.95);
  assert_int_equal(r.n_epochs, 4);
  assert_float_equal(r.last_val_accuracy, acc1, 1e-12);
  /* 1000 examples in batches of 32: 32 steps an epoch (the last one of 8). */
  assert_int_equal(r.n_losses, 4 * 32 / 5);
  kn_model_free(&m);
  kn_dataset_free(&train);
  kn_dataset_free(&val);
}

static void same_seed_gives_identical_losses(void **state) {
  (void)state;
  kn_dataset train = make_blobs(500, 3);
  record a = {0}, b = {0};
  char err[256];
  kn_train_config tc = config(NULL);
  kn_model m1 = make_model(32), m2 = make_model(32);
  assert_int_equal(kn_train(&m1, &train, NULL, &tc, on_event, &a, err, sizeof err), KN_OK);
  assert_int_equal(kn_train(&m2, &train, NULL, &tc, on_event, &b, err, sizeof err), KN_OK);
  assert_int_equal(a.n_losses, b.n_losses);
  assert_memory_equal(a.losses, b.losses, (size_t)a.n_losses * sizeof(double));
  assert_memory_equal(kn_params(m1.graph), kn_params(m2.graph),
                      kn_param_count(m1.graph) * sizeof(float));
  kn_model_free(&m1);
  kn_model_free(&m2);
  kn_dataset_free(&train);
}

static void callback_can_stop_training_early(void **state) {
  (void)state;
  kn_dataset train = make_blobs(200, 4);
  kn_model m = make_model(32);
  record r = {.stop_after_epoch = 2};
  kn_train_config tc = config(NULL);
  char err[256];
  assert_int_equal(kn_train(&m, &train, NULL, &tc, on_event, &r, err, sizeof err), KN_OK);
  assert_int_equal(r.n_epochs, 2);
  kn_model_free(&m);
  kn_dataset_free(&train);
}

static uint64_t le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static void final_checkpoint_is_safetensors_with_every_weight(void **state) {
  (void)state;
  char dir[] = "/tmp/kiln-test-ckpt-XXXXXX";
  assert_non_null(mkdtemp(dir));
  kn_dataset train = make_blobs(100, 6);
  kn_model m = make_model(32);
  kn_train_config tc = config(dir);
  tc.epochs = 1;
  record r = {0};
  char err[256];
  assert_int_equal(kn_train(&m, &train, NULL, &tc, on_event, &r, err, sizeof err), KN_OK);
  char want[600];
  snprintf(want, sizeof want, "%s/ckpt-00000004.safetensors", dir);
  assert_string_equal(r.checkpoint, want);

  FILE *f = fopen(r.checkpoint, "rb");
  assert_non_null(f);
  unsigned char *buf = malloc((size_t)r.bytes + 1);
  assert_int_equal(fread(buf, 1, (size_t)r.bytes + 1, f), (size_t)r.bytes);
  fclose(f);
  uint64_t hlen = le64(buf);
  assert_int_equal(hlen % 8, 0);
  char *header = calloc(1, hlen + 1);
  memcpy(header, buf + 8, hlen);
  assert_non_null(strstr(header, "\"hidden.kernel\":{\"dtype\":\"F32\",\"shape\":[8,16],"
                                 "\"data_offsets\":[0,512]}"));
  assert_non_null(strstr(header, "\"hidden.bias\":{\"dtype\":\"F32\",\"shape\":[16],"
                                 "\"data_offsets\":[512,576]}"));
  assert_non_null(strstr(header, "\"out.kernel\":{\"dtype\":\"F32\",\"shape\":[16,3]"));
  assert_non_null(strstr(header, "\"out.bias\":{\"dtype\":\"F32\",\"shape\":[3]"));
  /* The data stream's position rides along: after one epoch, epoch 1 batch 0. */
  char meta[300];
  snprintf(meta, sizeof meta,
           "\"__metadata__\":{\"format\":\"pt\",\"step\":\"4\",\"pipeline_state\":\"1:0:%llu\","
           "\"train_state\":\"ckpt-00000004.state\"}",
           (unsigned long long)(5 ^ 0x5eedda7aULL));
  assert_non_null(strstr(header, meta));
  size_t data_bytes = kn_param_count(m.graph) * sizeof(float);
  assert_int_equal((uint64_t)r.bytes, 8 + hlen + data_bytes);
  assert_memory_equal(buf + 8 + hlen, kn_params(m.graph), data_bytes);
  /* The digest is the file's, and no temp file is left behind. */
  kc_sha256 h;
  uint8_t digest[32];
  char hex[65];
  kc_sha256_init(&h);
  kc_sha256_update(&h, buf, (size_t)r.bytes);
  kc_sha256_final(&h, digest);
  kc_sha256_hex(digest, hex);
  assert_string_equal(hex, r.sha256);
  char tmp[700];
  snprintf(tmp, sizeof tmp, "%s.tmp", r.checkpoint);
  assert_int_not_equal(access(tmp, F_OK), 0);
  free(header);
  free(buf);
  kn_model_free(&m);
  kn_dataset_free(&train);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void sha256_matches_published_vectors(void **state) {
  (void)state;
  struct {
    const char *text;
    const char *hex;
  } cases[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kc_sha256 h;
    uint8_t d[32];
    char hex[65];
    kc_sha256_init(&h);
    /* Byte by byte, to cross block boundaries the hard way. */
    for (const char *p = cases[i].text; *p; p++) kc_sha256_update(&h, p, 1);
    kc_sha256_final(&h, d);
    kc_sha256_hex(d, hex);
    assert_string_equal(hex, cases[i].hex);
  }
}

static void mismatched_dataset_is_refused(void **state) {
  (void)state;
  kn_dataset train = make_blobs(50, 7);
  train.example_size = 4;
  kn_model m = make_model(32);
  kn_train_config tc = config(NULL);
  char err[256];
  assert_int_equal(kn_train(&m, &train, NULL, &tc, NULL, NULL, err, sizeof err), KN_EINVAL);
  assert_string_equal(err, "train: dataset examples hold 4 values, the model's input 8");
  kn_model_free(&m);
  kn_dataset_free(&train);
}

/* ---- the loop's options ---- */

typedef struct seen {
  int64_t last_step;
  int n_epochs, n_evals, n_notices;
  char notice[256];
  double top_k, accuracy, lr[64];
  int n_lr;
} seen;

static int watch(const kn_train_event *ev, void *user) {
  seen *w = user;
  if (ev->step > w->last_step) w->last_step = ev->step;
  if (ev->kind == KN_EVENT_EPOCH) w->n_epochs++;
  if (ev->kind == KN_EVENT_EVAL) w->n_evals++;
  if (ev->kind == KN_EVENT_NOTICE) {
    w->n_notices++;
    snprintf(w->notice, sizeof w->notice, "%s", ev->message);
  }
  for (int i = 0; i < ev->n_metrics; i++) {
    if (strcmp(ev->names[i], "val_top_k_accuracy") == 0) w->top_k = ev->values[i];
    if (strcmp(ev->names[i], "val_accuracy") == 0) w->accuracy = ev->values[i];
    if (strcmp(ev->names[i], "learning_rate") == 0 && w->n_lr < 64)
      w->lr[w->n_lr++] = ev->values[i];
  }
  return 0;
}

/* k = 4 micro-batches of 32 make the same 20 updates as batches of 128. */
static void accumulation_matches_one_big_batch(void **state) {
  (void)state;
  kn_dataset train = make_blobs(20 * 128, 11);
  kn_model big = make_model(128), small = make_model(32);
  kn_train_config a = config(NULL), b = config(NULL);
  a.epochs = b.epochs = 1;
  a.batch_size = 128;
  b.accumulation_steps = 4;
  seen wa = {0}, wb = {0};
  char err[256];
  assert_int_equal(kn_train(&big, &train, NULL, &a, watch, &wa, err, sizeof err), KN_OK);
  assert_int_equal(kn_train(&small, &train, NULL, &b, watch, &wb, err, sizeof err), KN_OK);
  assert_int_equal(wa.last_step, 20);
  assert_int_equal(wb.last_step, 20);
  const float *p = kn_params(big.graph), *q = kn_params(small.graph);
  double worst = 0;
  for (size_t i = 0; i < kn_param_count(big.graph); i++) {
    double d = fabs((double)p[i] - q[i]);
    worst = d > worst ? d : worst;
  }
  print_message("largest weight difference after 20 steps: %.3g\n", worst);
  assert_true(worst <= 1e-5);
  /* And accumulation changes the result: one step per batch of 32 differs. */
  kn_model plain = make_model(32);
  kn_train_config c = config(NULL);
  c.epochs = 1;
  assert_int_equal(kn_train(&plain, &train, NULL, &c, NULL, NULL, err, sizeof err), KN_OK);
  assert_true(fabs(kn_params(plain.graph)[0] - p[0]) > 1e-4);
  kn_model_free(&big);
  kn_model_free(&small);
  kn_model_free(&plain);
  kn_dataset_free(&train);
}

/* Plain SGD at lr 1 with a clip of 0.001: the step moves the weights by
 * exactly that norm. */
static void global_norm_clipping_caps_the_update(void **state) {
  (void)state;
  kn_dataset train = make_blobs(32, 12);
  kn_model m = make_model(32);
  kn_train_config tc = config(NULL);
  tc.epochs = 1;
  tc.optimizer = (kn_optimizer_config){.type = KN_OPT_SGD, .learning_rate = 1.0f};
  tc.clip_global_norm = 1e-3;
  size_t n = kn_param_count(m.graph);
  float *before = malloc(n * sizeof(float));
  memcpy(before, kn_params(m.graph), n * sizeof(float));
  char err[256];
  assert_int_equal(kn_train(&m, &train, NULL, &tc, NULL, NULL, err, sizeof err), KN_OK);
  double sum = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)kn_params(m.graph)[i] - before[i];
    sum += d * d;
  }
  assert_float_equal(sqrt(sum), 1e-3, 1e-6);
  free(before);
  kn_model_free(&m);
  kn_dataset_free(&train);
}

static void learning_rate_schedules_follow_their_formulas(void **state) {
  (void)state;
  kn_lr_schedule constant = {.type = KN_SCHEDULE_CONSTANT, .warmup_steps = 4};
  assert_float_equal(kn_lr_at(&constant, 0.1, 0), 0.025, 1e-15);
  assert_float_equal(kn_lr_at(&constant, 0.1, 3), 0.1, 1e-15);
  assert_float_equal(kn_lr_at(&constant, 0.1, 100), 0.1, 1e-15);
  kn_lr_schedule step = {.type = KN_SCHEDULE_STEP, .step_size = 10, .gamma = 0.5};
  assert_float_equal(kn_lr_at(&step, 0.1, 9), 0.1, 1e-15);
  assert_float_equal(kn_lr_at(&step, 0.1, 10), 0.05, 1e-15);
  assert_float_equal(kn_lr_at(&step, 0.1, 25), 0.025, 1e-15);
  kn_lr_schedule expo = {.type = KN_SCHEDULE_EXPONENTIAL, .decay_steps = 100, .decay_rate = 0.9};
  assert_float_equal(kn_lr_at(&expo, 1.0, 50), pow(0.9, 0.5), 1e-12);
  expo.staircase = 1;
  assert_float_equal(kn_lr_at(&expo, 1.0, 150), 0.9, 1e-12);
  kn_lr_schedule cosine = {
      .type = KN_SCHEDULE_COSINE, .decay_steps = 100, .alpha = 0.1, .warmup_steps = 10};
  assert_float_equal(kn_lr_at(&cosine, 1.0, 4), 0.5, 1e-12);   /* warming up */
  assert_float_equal(kn_lr_at(&cosine, 1.0, 10), 1.0, 1e-12);  /* decay starts */
  assert_float_equal(kn_lr_at(&cosine, 1.0, 60), 0.55, 1e-12); /* half way: alpha + (1-alpha)/2 */
  assert_float_equal(kn_lr_at(&cosine, 1.0, 500), 0.1, 1e-12); /* held at alpha */
}

/* The rate each update used is reported and follows the schedule. */
static void training_reports_the_scheduled_rate(void **state) {
  (void)state;
  kn_dataset train = make_blobs(320, 13);
  kn_model m = make_model(32);
  kn_train_config tc = config(NULL);
  tc.epochs = 2;
  tc.log_every_steps = 1;
  tc.schedule = (kn_lr_schedule){.type = KN_SCHEDULE_STEP, .step_size = 5, .gamma = 0.1};
  seen w = {0};
  char err[256];
  assert_int_equal(kn_train(&m, &train, NULL, &tc, watch, &w, err, sizeof err), KN_OK);
  assert_int_equal(w.n_lr, 20);
  for (int t = 0; t < 20; t++) assert_float_equal(w.lr[t], (float)(0.01 * pow(0.1, t / 5)), 1e-12);
  kn_model_free(&m);
  kn_dataset_free(&train);
}

/* Keras's ReduceLROnPlateau and EarlyStopping, value by value. */
static void plateau_and_early_stopping_follow_keras(void **state) {
  (void)state;
  kn_train_config tc = {0};
  tc.optimizer.learning_rate = 1.0f;
  tc.plateau = (kn_reduce_on_plateau){.enabled = 1,
                                      .mode = KN_MODE_MIN,
                                      .patience = 2,
                                      .factor = 0.5,
                                      .cooldown = 1,
                                      .min_lr = 0.2};
  tc.early_stopping =
      (kn_early_stopping){.enabled = 1, .mode = KN_MODE_MIN, .patience = 3, .min_delta = 0.01};
  kn_callback_state cs;
  kn_callbacks_init(&tc, &cs);
  /* plateau: 1.0 best; wait 1; wait 2 -> cut to 0.5, cooldown 1; the
   * cooldown ends and that epoch counts (wait 1); wait 2 -> 0.25; ...;
   * 0.125 is floored at min_lr 0.2, which is then never cut again. */
  const double values[] = {1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0};
  const int cut[] = {0, 0, 1, 0, 1, 0, 1, 0, 0};
  const double lr[] = {1, 1, 0.5, 0.5, 0.25, 0.25, 0.2, 0.2, 0.2};
  for (int i = 0; i < 9; i++) {
    assert_int_equal(kn_plateau_update(&tc.plateau, &cs, values[i]), cut[i]);
    assert_float_equal(cs.lr, lr[i], 1e-15);
  }
  /* early stopping: 1.0 best; 0.995 is not better by more than 0.01
   * (wait 1); 0.98 is (best, wait 0); then three misses stop it. */
  const double losses[] = {1.0, 0.995, 0.98, 0.975, 0.99, 0.971};
  const int stop[] = {0, 0, 0, 0, 0, 1};
  for (int i = 0; i < 6; i++)
    assert_int_equal(kn_early_stopping_update(&tc.early_stopping, &cs, losses[i]), stop[i]);
  assert_float_equal(cs.stop_best, 0.98, 1e-15);
  /* mode max: higher is better */
  kn_early_stopping up = {.enabled = 1, .mode = KN_MODE_MAX, .patience = 1};
  cs.stop_best = -INFINITY;
  cs.stop_wait = 0;
  assert_int_equal(kn_early_stopping_update(&up, &cs, 0.5), 0);
  assert_int_equal(kn_early_stopping_update(&up, &cs, 0.6), 0);
  assert_int_equal(kn_early_stopping_update(&up, &cs, 0.6), 1);
}

/* Early stopping ends a run after patience epochs without improvement and
 * says so; reduce-on-plateau's cut rate is the one the next steps use. */
static void early_stopping_ends_the_run(void **state) {
  (void)state;
  kn_dataset train = make_blobs(320, 14), val = make_blobs(96, 15);
  kn_model m = make_model(32);
  kn_train_config tc = config(NULL);
  tc.epochs = 10;
  /* Loss falls every epoch, so under mode max only epoch 1 is "best". */
  tc.early_stopping =
      (kn_early_stopping){.enabled = 1, .monitor = "val_loss", .mode = KN_MODE_MAX, .patience = 2};
  seen w = {0};
  char err[256];
  assert_int_equal(kn_train(&m, &train, &val, &tc, watch, &w, err, sizeof err), KN_OK);
  assert_int_equal(w.n_epochs, 3);
  assert_int_equal(w.n_notices, 1);
  assert_non_null(strstr(w.notice, "early stopping at epoch 3: val_loss"));
  /* A monitor the run does not report is refused up front. */
  strcpy(tc.early_stopping.monitor, "val_mae");
  assert_int_equal(kn_train(&m, &train, &val, &tc, NULL, NULL, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "'val_mae'"));
  kn_model_free(&m);
  kn_dataset_free(&train);
  kn_dataset_free(&val);
}

/* Top-k accuracy with k = every class is 1; with k = 1 it is accuracy. */
static void top_k_accuracy_brackets_accuracy(void **state) {
  (void)state;
  kn_dataset train = make_blobs(128, 16), val = make_blobs(96, 17);
  char err[256];
  for (int k = 1; k <= CLASSES; k += CLASSES - 1) {
    kn_model m = make_model(32);
    kn_train_config tc = config(NULL);
    tc.epochs = 1;
    tc.metrics = KN_METRIC_ACCURACY | KN_METRIC_TOP_K;
    tc.top_k = k;
    seen w = {0};
    assert_int_equal(kn_train(&m, &train, &val, &tc, watch, &w, err, sizeof err), KN_OK);
    if (k == 1) assert_float_equal(w.top_k, w.accuracy, 1e-12);
    if (k == CLASSES) assert_float_equal(w.top_k, 1.0, 1e-12);
    kn_model_free(&m);
  }
  kn_dataset_free(&train);
  kn_dataset_free(&val);
}

/* Validation every 3 steps inside 2 epochs of 10 steps: steps 3, 6, 9,
 * 12, 15, 18 (an epoch's last step has its own validation). */
static void validation_every_n_steps(void **state) {
  (void)state;
  kn_dataset train = make_blobs(320, 18), val = make_blobs(64, 19);
  kn_model m = make_model(32);
  kn_train_config tc = config(NULL);
  tc.epochs = 2;
  tc.eval_every_steps = 3;
  seen w = {0};
  char err[256];
  assert_int_equal(kn_train(&m, &train, &val, &tc, watch, &w, err, sizeof err), KN_OK);
  assert_int_equal(w.n_evals, 6);
  assert_int_equal(w.n_epochs, 2);
  kn_model_free(&m);
  kn_dataset_free(&train);
  kn_dataset_free(&val);
}

/* A loss that overflows fails the run with the step and the last good
 * checkpoint named. */
static void non_finite_loss_names_the_last_good_checkpoint(void **state) {
  (void)state;
  char dir[] = "/tmp/kiln-test-nan-XXXXXX";
  assert_non_null(mkdtemp(dir));
  kn_dataset train = make_blobs(320, 20);
  kn_model m = make_model(32);
  kn_train_config tc = config(dir);
  tc.checkpoint_every_steps = 1;
  tc.optimizer = (kn_optimizer_config){.type = KN_OPT_SGD, .learning_rate = 1e30f};
  char err[512];
  assert_int_equal(kn_train(&m, &train, NULL, &tc, NULL, NULL, err, sizeof err), KN_ENUMERIC);
  print_message("%s\n", err);
  assert_non_null(strstr(err, "loss became"));
  assert_non_null(strstr(err, "the last good checkpoint is ckpt-0000000"));
  kn_model_free(&m);
  kn_dataset_free(&train);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* Steps 3 to 5 profiled: the trace is trace-event JSON, every node and
 * phase of a step lies inside it, and they add up to the step's time
 * within 10%; the table ranks the nodes. */
static void profile_trace_adds_up_to_the_step_time(void **state) {
  (void)state;
  char dir[] = "/tmp/kiln-test-profile-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char trace[600], table[600];
  snprintf(trace, sizeof trace, "%s/profile.json", dir);
  snprintf(table, sizeof table, "%s/profile.txt", dir);
  kn_dataset train = make_blobs(1024, 21);
  static const kn_layer_config layers[2] = {
      {.type = KN_LAYER_DENSE,
       .name = "wide",
       .units = 512,
       .use_bias = 1,
       .activation = KN_ACT_RELU},
      {.type = KN_LAYER_DENSE, .name = "out", .units = CLASSES, .use_bias = 1}};
  kn_model_config mc = {.input_ndim = 1,
                        .input_shape = {FEATURES},
                        .n_layers = 2,
                        .layers = layers,
                        .batch_size = 128};
  kn_model m;
  char err[512];
  assert_int_equal(kn_model_build(&mc, &m, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(m.graph, 3, NULL, err, sizeof err), KN_OK);
  kn_train_config tc = config(NULL);
  tc.epochs = 1;
  tc.batch_size = 128;
  tc.profile_first = 3;
  tc.profile_last = 5;
  tc.profile_path = trace;
  tc.profile_table_path = table;
  seen w = {0};
  assert_int_equal(kn_train(&m, &train, NULL, &tc, watch, &w, err, sizeof err), KN_OK);
  assert_non_null(strstr(w.notice, "profile of steps 3 to 5 written to"));

  json_error_t jerr;
  json_t *root = json_load_file(trace, 0, &jerr);
  if (!root) fail_msg("trace is not JSON: %s at line %d", jerr.text, jerr.line);
  json_t *events = json_object_get(root, "traceEvents");
  assert_true(json_is_array(events));
  double step_us[8] = {0}, parts_us[8] = {0}, start_us[8], end_us[8];
  int nodes = 0;
  size_t i;
  json_t *ev;
  json_array_foreach(events, i, ev) {
    const char *ph = json_string_value(json_object_get(ev, "ph"));
    assert_non_null(ph);
    if (strcmp(ph, "X") != 0) continue;
    int step = (int)json_integer_value(json_object_get(json_object_get(ev, "args"), "step"));
    assert_true(step >= 3 && step <= 5);
    double ts = json_number_value(json_object_get(ev, "ts"));
    double dur = json_number_value(json_object_get(ev, "dur"));
    assert_true(dur >= 0);
    if (strcmp(json_string_value(json_object_get(ev, "cat")), "step") == 0) {
      step_us[step] = dur;
      start_us[step] = ts;
      end_us[step] = ts + dur;
    } else {
      parts_us[step] += dur;
      nodes += json_object_get(json_object_get(ev, "args"), "node") != NULL;
    }
  }
  assert_true(nodes > 0);
  json_array_foreach(events, i, ev) { /* every part inside its step's span */
    if (strcmp(json_string_value(json_object_get(ev, "ph")), "X") != 0) continue;
    int step = (int)json_integer_value(json_object_get(json_object_get(ev, "args"), "step"));
    double ts = json_number_value(json_object_get(ev, "ts"));
    assert_true(ts >= start_us[step] - 0.5 && ts <= end_us[step] + 0.5);
  }
  for (int s = 3; s <= 5; s++) {
    print_message("step %d: %.1f us, its parts %.1f us\n", s, step_us[s], parts_us[s]);
    assert_true(step_us[s] > 0);
    assert_true(fabs(parts_us[s] - step_us[s]) <= 0.1 * step_us[s]);
  }
  json_decref(root);
  FILE *f = fopen(table, "r");
  assert_non_null(f);
  char line[256];
  assert_non_null(fgets(line, sizeof line, f));
  assert_non_null(strstr(line, "3 profiled steps"));
  assert_non_null(fgets(line, sizeof line, f)); /* the header */
  assert_non_null(fgets(line, sizeof line, f)); /* rank 1: the heaviest */
  assert_true(strncmp(line, "1 ", 2) == 0);
  fclose(f);
  kn_model_free(&m);
  kn_dataset_free(&train);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(training_learns_separable_blobs),
      cmocka_unit_test(same_seed_gives_identical_losses),
      cmocka_unit_test(callback_can_stop_training_early),
      cmocka_unit_test(final_checkpoint_is_safetensors_with_every_weight),
      cmocka_unit_test(sha256_matches_published_vectors),
      cmocka_unit_test(mismatched_dataset_is_refused),
      cmocka_unit_test(accumulation_matches_one_big_batch),
      cmocka_unit_test(global_norm_clipping_caps_the_update),
      cmocka_unit_test(learning_rate_schedules_follow_their_formulas),
      cmocka_unit_test(training_reports_the_scheduled_rate),
      cmocka_unit_test(plateau_and_early_stopping_follow_keras),
      cmocka_unit_test(early_stopping_ends_the_run),
      cmocka_unit_test(top_k_accuracy_brackets_accuracy),
      cmocka_unit_test(validation_every_n_steps),
      cmocka_unit_test(non_finite_loss_names_the_last_good_checkpoint),
      cmocka_unit_test(profile_trace_adds_up_to_the_step_time),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
