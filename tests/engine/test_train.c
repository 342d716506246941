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

#include "engine.h"

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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(training_learns_separable_blobs),
      cmocka_unit_test(same_seed_gives_identical_losses),
      cmocka_unit_test(callback_can_stop_training_early),
      cmocka_unit_test(final_checkpoint_is_safetensors_with_every_weight),
      cmocka_unit_test(sha256_matches_published_vectors),
      cmocka_unit_test(mismatched_dataset_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
