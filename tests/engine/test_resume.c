/* Checkpoints that resume: the safetensors reader (round trip, shape and
 * name checks, damaged files), periodic checkpoints, a stop on request, and
 * a stopped-then-resumed run that matches a straight run step for step. */
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
#define FEATURES 6
#define STEPS    30 /* 3 epochs of 10 batches (300 examples, batch 32, remainder kept) */

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
    for (int f = 0; f < FEATURES; f++)
      ds.x[i * FEATURES + f] = kn_rng_uniform(&rng) - 0.5f + (f == c ? 1.5f : 0.0f);
  }
  return ds;
}

/* Dense -> batch norm (moving statistics) -> dropout (a per-step stream)
 * -> dense: every kind of state a resume has to carry. */
/* The precision the resume tests build with: mixed_float16 adds the loss
 * scale and its counter to what a resume has to restore. */
static kn_precision precision = KN_PRECISION_FLOAT32;

static kn_model make_model(int hidden, uint64_t init_seed) {
  const kn_layer_config layers[4] = {
      {.type = KN_LAYER_DENSE,
       .name = "hidden",
       .units = hidden,
       .use_bias = 1,
       .activation = KN_ACT_RELU},
      {.type = KN_LAYER_BATCH_NORM, .name = "bn", .momentum = 0.9f, .epsilon = 1e-3f},
      {.type = KN_LAYER_DROPOUT, .name = "drop", .rate = 0.25f},
      {.type = KN_LAYER_DENSE, .name = "out", .units = CLASSES, .use_bias = 1}};
  kn_model_config cfg = {.input_ndim = 1,
                         .input_shape = {FEATURES},
                         .n_layers = 4,
                         .layers = layers,
                         .batch_size = 32,
                         .seed = 9,
                         .precision = precision};
  kn_model m;
  char err[256];
  assert_int_equal(kn_model_build(&cfg, &m, err, sizeof err), KN_OK);
  assert_int_equal(kn_graph_compile(m.graph, init_seed, NULL, err, sizeof err), KN_OK);
  return m;
}

/* Loop options the resume tests run under as well: gradient accumulation
 * (steps then count updates of `accum` batches) and reduce-on-plateau,
 * whose running state the training-state file has to carry. */
static int accum = 1, with_plateau = 0;

static kn_train_config config(const char *dir) {
  kn_train_config tc = {.epochs = 3,
                        .batch_size = 32,
                        .shuffle = 1,
                        .seed = 4,
                        .log_every_steps = 1,
                        .checkpoint_dir = dir,
                        .checkpoint_prefix = "ckpt"};
  tc.optimizer = (kn_optimizer_config){.type = KN_OPT_ADAM,
                                       .learning_rate = 0.01f,
                                       .beta1 = 0.9f,
                                       .beta2 = 0.999f,
                                       .epsilon = 1e-7f};
  tc.accumulation_steps = accum;
  /* Overflowing at first and growing every 3 finite steps, the scale keeps
   * moving: a resume that lost it would skip other steps. */
  tc.initial_loss_scale = 0x1p40;
  tc.loss_scale_growth_interval = 3;
  /* Under mode max a falling epoch_loss never improves: the rate halves
   * after epoch 2, so a resume that lost the callback's state diverges. */
  if (with_plateau)
    tc.plateau = (kn_reduce_on_plateau){
        .enabled = 1, .monitor = "epoch_loss", .mode = KN_MODE_MAX, .patience = 1, .factor = 0.5};
  return tc;
}

typedef struct record {
  double losses[STEPS + 1]; /* by step; 0 = that step did not run here */
  double epoch_loss[4], val_accuracy[4];
  int64_t checkpoints[16];
  int n_checkpoints;
  int epoch_seen_before_checkpoint[16]; /* epochs ended when each checkpoint came */
  int epochs_ended;
  char last_path[512], last_sha[65];
  int64_t stop_at; /* set *stop when this step is logged */
  volatile sig_atomic_t *stop;
} record;

static int on_event(const kn_train_event *ev, void *user) {
  record *r = user;
  if (ev->kind == KN_EVENT_STEP) {
    assert_true(ev->step >= 1 && ev->step <= STEPS);
    r->losses[ev->step] = ev->values[0];
    if (r->stop && ev->step == r->stop_at) *r->stop = 1;
  } else if (ev->kind == KN_EVENT_EPOCH) {
    r->epochs_ended++;
    for (int i = 0; i < ev->n_metrics; i++) {
      if (strcmp(ev->names[i], "epoch_loss") == 0) r->epoch_loss[ev->epoch] = ev->values[i];
      if (strcmp(ev->names[i], "val_accuracy") == 0) r->val_accuracy[ev->epoch] = ev->values[i];
    }
  } else if (ev->kind == KN_EVENT_CHECKPOINT && r->n_checkpoints < 16) {
    r->epoch_seen_before_checkpoint[r->n_checkpoints] = r->epochs_ended;
    r->checkpoints[r->n_checkpoints++] = ev->step;
    snprintf(r->last_path, sizeof r->last_path, "%s", ev->path);
    memcpy(r->last_sha, ev->checkpoint->sha256, sizeof r->last_sha);
  }
  return 0;
}

static void make_dir(char *tmpl) {
  assert_non_null(mkdtemp(tmpl));
}

static void remove_dir(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void checkpoint_reader_restores_what_the_writer_saved(void **state) {
  (void)state;
  char dir[] = "/tmp/kiln-test-ckread-XXXXXX";
  make_dir(dir);
  kn_model a = make_model(8, 1), b = make_model(8, 2);
  size_t n = kn_param_count(a.graph);
  assert_memory_not_equal(kn_params(a.graph), kn_params(b.graph), n * sizeof(float));
  char path[600], err[512];
  snprintf(path, sizeof path, "%s/a.safetensors", dir);
  const char *keys[] = {"step", "note"}, *values[] = {"12", "a \"quoted\" note"};
  assert_int_equal(kn_checkpoint_write(a.graph, path, 2, keys, values, NULL, err, sizeof err),
                   KN_OK);
  kn_checkpoint_meta meta;
  assert_int_equal(kn_checkpoint_read(b.graph, path, &meta, err, sizeof err), KN_OK);
  assert_memory_equal(kn_params(a.graph), kn_params(b.graph), n * sizeof(float));
  assert_int_equal(meta.n, 2);
  assert_string_equal(kn_checkpoint_meta_get(&meta, "step"), "12");
  assert_string_equal(kn_checkpoint_meta_get(&meta, "note"), "a \"quoted\" note");
  assert_null(kn_checkpoint_meta_get(&meta, "absent"));
  kn_model_free(&a);
  kn_model_free(&b);
  remove_dir(dir);
}

static void checkpoint_reader_refuses_a_mismatch_by_name_and_keeps_the_weights(void **state) {
  (void)state;
  char dir[] = "/tmp/kiln-test-ckbad-XXXXXX";
  make_dir(dir);
  kn_model wide = make_model(8, 1), narrow = make_model(4, 2);
  size_t n = kn_param_count(narrow.graph);
  float *before = malloc(n * sizeof(float));
  memcpy(before, kn_params(narrow.graph), n * sizeof(float));
  char path[600], err[512] = "";
  snprintf(path, sizeof path, "%s/wide.safetensors", dir);
  assert_int_equal(kn_checkpoint_write(wide.graph, path, 0, NULL, NULL, NULL, err, sizeof err),
                   KN_OK);

  assert_int_equal(kn_checkpoint_read(narrow.graph, path, NULL, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "'hidden.kernel' has shape [6, 8], the model's is [6, 4]"));
  assert_non_null(strstr(err, path));
  assert_memory_equal(kn_params(narrow.graph), before, n * sizeof(float));

  /* Truncated: the last tensor's bytes run past the end. */
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fclose(f);
  assert_int_equal(truncate(path, size - 4), 0);
  assert_int_equal(kn_checkpoint_read(wide.graph, path, NULL, err, sizeof err), KN_EFORMAT);
  assert_non_null(strstr(err, "data_offsets"));

  char missing[600];
  snprintf(missing, sizeof missing, "%s/none.safetensors", dir);
  assert_int_equal(kn_checkpoint_read(wide.graph, missing, NULL, err, sizeof err), KN_EIO);
  assert_non_null(strstr(err, "none.safetensors"));

  /* Not JSON where the header should be: the byte position is named. */
  f = fopen(path, "wb");
  assert_non_null(f);
  const unsigned char bad[] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '"', 'x', '"', ';', '}', ' ', ' '};
  fwrite(bad, 1, sizeof bad, f);
  fclose(f);
  assert_int_equal(kn_checkpoint_read(wide.graph, path, NULL, err, sizeof err), KN_EFORMAT);
  assert_non_null(strstr(err, "header byte 4: expected ':'"));
  free(before);
  kn_model_free(&wide);
  kn_model_free(&narrow);
  remove_dir(dir);
}

static void periodic_checkpoints_wait_for_the_epoch_end_and_never_repeat(void **state) {
  (void)state;
  char dir[] = "/tmp/kiln-test-ckevery-XXXXXX";
  make_dir(dir);
  kn_dataset ds = make_blobs(300, 3);
  kn_model m = make_model(8, 1);
  kn_train_config tc = config(dir);
  tc.checkpoint_every_steps = 5;
  record r = {0};
  char err[512];
  assert_int_equal(kn_train(&m, &ds, NULL, &tc, on_event, &r, err, sizeof err), KN_OK);
  const int64_t want[] = {5, 10, 15, 20, 25, 30};
  const int epochs_before[] = {0, 1, 1, 2, 2, 3};
  assert_int_equal(r.n_checkpoints, 6);
  for (int i = 0; i < 6; i++) {
    assert_int_equal(r.checkpoints[i], want[i]);
    assert_int_equal(r.epoch_seen_before_checkpoint[i], epochs_before[i]);
  }
  /* Each has its training state beside it. */
  char path[600];
  for (int i = 0; i < 6; i++) {
    snprintf(path, sizeof path, "%s/ckpt-%08lld.state", dir, (long long)want[i]);
    assert_int_equal(access(path, R_OK), 0);
  }
  kn_model_free(&m);
  kn_dataset_free(&ds);
  remove_dir(dir);
}

/* Resumes from a checkpoint of the straight run and checks every later
 * step's loss, the epoch metrics and the final checkpoint's bytes. */
static void resume_and_compare(const record *straight, const char *from, int64_t at,
                               const kn_dataset *ds, const kn_dataset *val, const char *dir) {
  kn_model m = make_model(8, 77); /* other initial weights: the checkpoint must replace them */
  kn_train_config tc = config(dir);
  tc.checkpoint_every_steps = 5;
  tc.resume_from = from;
  record r = {0};
  char err[512];
  assert_int_equal(kn_train(&m, ds, val, &tc, on_event, &r, err, sizeof err), KN_OK);
  for (int64_t s = 1; s <= STEPS; s++) {
    if (s <= at) {
      assert_true(r.losses[s] == 0.0); /* nothing before the resume point ran again */
    } else if (r.losses[s] != straight->losses[s]) {
      fail_msg("resumed at %lld: step %lld loss %.9g, %.9g in a straight run", (long long)at,
               (long long)s, r.losses[s], straight->losses[s]);
    }
  }
  for (int e = (int)(at / (10 / accum)) + 1; e <= 3; e++) {
    assert_true(r.epoch_loss[e] == straight->epoch_loss[e]);
    assert_true(r.val_accuracy[e] == straight->val_accuracy[e]);
  }
  /* Same weights, moving statistics and metadata, bit for bit. */
  assert_string_equal(r.last_sha, straight->last_sha);
  kn_model_free(&m);
}

static void stopped_and_resumed_run_matches_a_straight_run_step_for_step(void **state) {
  (void)state;
  char dir_a[] = "/tmp/kiln-test-straight-XXXXXX", dir_b[] = "/tmp/kiln-test-stopped-XXXXXX";
  char dir_c[] = "/tmp/kiln-test-resumed-XXXXXX";
  make_dir(dir_a);
  make_dir(dir_b);
  make_dir(dir_c);
  kn_dataset ds = make_blobs(300, 3), val = make_blobs(64, 4);
  char err[512], path[600];

  kn_model a = make_model(8, 1);
  kn_train_config tc = config(dir_a);
  tc.checkpoint_every_steps = 5;
  record straight = {0};
  assert_int_equal(kn_train(&a, &ds, &val, &tc, on_event, &straight, err, sizeof err), KN_OK);
  for (int s = 1; s <= STEPS / accum; s++) assert_true(straight.losses[s] > 0.0);

  /* A stop request at step 13 (mid-epoch 2): a checkpoint there, then out. */
  kn_model b = make_model(8, 1);
  volatile sig_atomic_t stop = 0;
  tc = config(dir_b);
  tc.checkpoint_every_steps = 5;
  tc.stop_request = &stop;
  record stopped = {.stop_at = 13, .stop = &stop};
  assert_int_equal(kn_train(&b, &ds, &val, &tc, on_event, &stopped, err, sizeof err), KN_ESTOPPED);
  assert_non_null(strstr(err, "stopped on request at step 13, checkpoint written"));
  assert_int_equal(stopped.n_checkpoints, 3);
  assert_int_equal(stopped.checkpoints[2], 13);
  assert_true(stopped.losses[14] == 0.0);

  snprintf(path, sizeof path, "%s/ckpt-00000013.safetensors", dir_b);
  resume_and_compare(&straight, path, 13, &ds, &val, dir_c);
  /* And from a checkpoint on an epoch boundary of the straight run. */
  snprintf(path, sizeof path, "%s/ckpt-00000010.safetensors", dir_a);
  resume_and_compare(&straight, path, 10, &ds, &val, dir_c);

  /* A damaged training state is refused, naming the file. */
  char state_path[600];
  snprintf(state_path, sizeof state_path, "%s/ckpt-00000013.state", dir_b);
  FILE *f = fopen(state_path, "r+b");
  assert_non_null(f);
  fseek(f, 200, SEEK_SET);
  fputc(0x5a, f);
  fclose(f);
  snprintf(path, sizeof path, "%s/ckpt-00000013.safetensors", dir_b);
  kn_model c = make_model(8, 1);
  tc = config(NULL);
  tc.resume_from = path;
  assert_int_equal(kn_train(&c, &ds, NULL, &tc, NULL, NULL, err, sizeof err), KN_EFORMAT);
  assert_non_null(strstr(err, "checksum mismatch"));
  assert_non_null(strstr(err, "ckpt-00000013.state"));

  /* A state made for another optimizer is refused as such. */
  tc.optimizer = (kn_optimizer_config){.type = KN_OPT_SGD, .learning_rate = 0.1f};
  snprintf(path, sizeof path, "%s/ckpt-00000010.safetensors", dir_a);
  assert_int_equal(kn_train(&c, &ds, NULL, &tc, NULL, NULL, err, sizeof err), KN_EINVAL);
  assert_non_null(strstr(err, "resume with the spec the checkpoint was made with"));

  kn_model_free(&a);
  kn_model_free(&b);
  kn_model_free(&c);
  kn_dataset_free(&ds);
  kn_dataset_free(&val);
  remove_dir(dir_a);
  remove_dir(dir_b);
  remove_dir(dir_c);
}

static void resume_is_exact_with_accumulation_and_plateau(void **state) {
  accum = 2;
  with_plateau = 1;
  stopped_and_resumed_run_matches_a_straight_run_step_for_step(state);
  accum = 1;
  with_plateau = 0;
}

static void resume_is_exact_with_mixed_float16_loss_scaling(void **state) {
  precision = KN_PRECISION_MIXED_FLOAT16;
  stopped_and_resumed_run_matches_a_straight_run_step_for_step(state);
  precision = KN_PRECISION_FLOAT32;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(checkpoint_reader_restores_what_the_writer_saved),
      cmocka_unit_test(checkpoint_reader_refuses_a_mismatch_by_name_and_keeps_the_weights),
      cmocka_unit_test(periodic_checkpoints_wait_for_the_epoch_end_and_never_repeat),
      cmocka_unit_test(stopped_and_resumed_run_matches_a_straight_run_step_for_step),
      cmocka_unit_test(resume_is_exact_with_accumulation_and_plateau),
      cmocka_unit_test(resume_is_exact_with_mixed_float16_loss_scaling),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
