/* Device placement: every node carries a device (cpu or cuda:N); nodes
 * take the graph's current one, gradients their forward node's; compile
 * refuses, by node and rule, a placement that cannot run here (an op the
 * CUDA backend has no kernel for, a mixed-precision graph, a device this
 * machine lacks); on a machine with a GPU, a graph whose matmuls and relus
 * run there trains as the same graph on the CPU does, copying only what
 * crosses between the device and the host, and a model whose
 * layers name two GPUs (model parallelism) as the model on one. The GPU
 * cases run on the host stand-in's two devices in
 * test_engine_placement_host_gpus. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cuda/cuda.h"
#include "engine.h"

static const kn_device cpu = {KN_DEVICE_CPU, 0}, gpu0 = {KN_DEVICE_CUDA, 0};

static int on(const kn_graph *g, kn_node n, kn_device d) {
  const kn_device at = kn_node_device(g, n);
  return at.kind == d.kind && at.index == d.index;
}

typedef struct net {
  kn_graph *g;
  kn_node x, y, w1, h, r, w2, logits, loss;
} net;

/* x (8, 6) -> matmul w1 (6, 5) -> relu -> matmul w2 (5, 3) -> softmax
 * cross-entropy: the first matmul and the relu on `hidden`, the rest on
 * the CPU; autodiff'd. */
static net build_viewed(kn_device hidden, kn_precision precision, int view) {
  net t = {.g = kn_graph_new()};
  char err[256] = "";
  assert_int_equal(kn_graph_set_precision(t.g, precision, err, sizeof err), KN_OK);
  t.x = kn_input(t.g, "x", KN_F32, 2, (int[]){8, 6});
  t.y = kn_input(t.g, "y", KN_I32, 1, (int[]){8});
  kn_graph_set_device(t.g, hidden);
  t.w1 = kn_param(t.g, "w1", 2, (int[]){6, 5}, KN_INIT_GLOROT_UNIFORM);
  t.h = kn_matmul(t.g, t.x, t.w1, 0, 0);
  /* with view: the relu reads the matmul's output through a reshape (a
   * view, as a flatten is), and its gradient goes back through another */
  t.r = kn_relu(t.g, view ? kn_reshape(t.g, t.h, 2, (int[]){8, 5}) : t.h);
  kn_graph_set_device(t.g, cpu);
  t.w2 = kn_param(t.g, "w2", 2, (int[]){5, 3}, KN_INIT_GLOROT_UNIFORM);
  t.logits = kn_matmul(t.g, t.r, t.w2, 0, 0);
  t.loss = kn_softmax_xent(t.g, t.logits, t.y);
  assert_int_equal(kn_autodiff(t.g, t.loss, err, sizeof err), KN_OK);
  return t;
}

static net build(kn_device hidden, kn_precision precision) {
  return build_viewed(hidden, precision, 0);
}

/* Eight training steps of g on fixed data (x (8, 6), y labels of 3
 * classes), each optimizer step on the host's buffers (kn_optimizer_step)
 * or, with where_they_are, where the gradients are
 * (kn_optimizer_step_graph); the losses, and the optimizer. */
static kn_optimizer *eight_steps(kn_graph *g, kn_node x, kn_node y, kn_node loss,
                                 const kn_optimizer_config *oc, int where_they_are, float *losses) {
  char err[512] = "";
  kn_optimizer *opt;
  assert_int_equal(kn_optimizer_new(oc, kn_param_count(g), &opt, err, sizeof err), KN_OK);
  float *xs = kn_node_data(g, x);
  int32_t *ys = kn_node_data(g, y);
  for (int i = 0; i < 48; i++) xs[i] = (float)((i * 37) % 11) / 11.0f - 0.4f;
  for (int i = 0; i < 8; i++) ys[i] = i % 3;
  for (int s = 0; s < 8; s++) {
    if (kn_graph_run(g, KN_RUN_TRAIN, 8, err, sizeof err) != KN_OK) fail_msg("run: %s", err);
    losses[s] = *(float *)kn_node_data(g, loss);
    if (!where_they_are)
      kn_optimizer_step(opt, kn_params(g), kn_grads(g));
    else if (kn_optimizer_step_graph(opt, g, err, sizeof err) != KN_OK)
      fail_msg("step: %s", err);
  }
  return opt;
}

static const kn_optimizer_config sgd = {.type = KN_OPT_SGD, .learning_rate = 0.1f};

/* Eight steps of SGD on fixed data; the losses. */
static void train(net *t, float *losses) {
  kn_optimizer_free(eight_steps(t->g, t->x, t->y, t->loss, &sgd, 0, losses));
}

/* A process that never asks for a GPU never maps the CUDA libraries (the
 * backend is a module opened on first use; cuBLAS alone would add about
 * 150 MiB to every process). Runs first, before anything here asks. */
static void a_cpu_graph_never_maps_the_cuda_libraries(void **state) {
  (void)state;
  net t = build(cpu, KN_PRECISION_FLOAT32);
  char err[256] = "";
  assert_int_equal(kn_graph_compile(t.g, 1, NULL, err, sizeof err), KN_OK);
  float losses[8];
  train(&t, losses);
  kn_graph_free(t.g);
  FILE *maps = fopen("/proc/self/maps", "r");
  if (!maps) {
    print_message("SKIPPED: no /proc/self/maps here to list the libraries mapped\n");
    skip();
  }
  char line[1024];
  int cuda_mapped = 0;
  while (fgets(line, sizeof line, maps))
    cuda_mapped |= strstr(line, "libcublas") != NULL || strstr(line, "libcudart") != NULL;
  fclose(maps);
  assert_false(cuda_mapped);
}

static void nodes_take_the_graph_device_and_gradients_their_forward_node(void **state) {
  (void)state;
  net t = build(gpu0, KN_PRECISION_FLOAT32);
  assert_true(on(t.g, t.x, cpu) && on(t.g, t.y, cpu));
  assert_true(on(t.g, t.w1, gpu0) && on(t.g, t.h, gpu0) && on(t.g, t.r, gpu0));
  assert_true(on(t.g, t.w2, cpu) && on(t.g, t.logits, cpu) && on(t.g, t.loss, cpu));
  /* w1's gradient (a matmul of the relu's gradient) runs where w1's matmul
   * does; w2's where its matmul does. */
  const kn_node g1 = kn_graph_find(t.g, "grad/w1"), g2 = kn_graph_find(t.g, "grad/w2");
  assert_true(g1 >= 0 && g2 >= 0);
  assert_true(on(t.g, g1, gpu0) && on(t.g, g2, cpu));
  char where[32];
  kn_device_format(kn_node_device(t.g, g1), where, sizeof where);
  assert_string_equal(where, "cuda:0");
  /* Moved back before compile, it is a CPU graph again. */
  assert_int_equal(kn_node_set_device(t.g, 1000, cpu), KN_EINVAL);
  kn_graph_free(t.g);
}

/* No GPU here (compile refused the placement, err says why): the test is
 * skipped, saying so. */
static void skip_without_gpu(const char *err) {
  print_message("SKIPPED: no CUDA device on this machine to train on: %s\n", err);
  skip();
}

static void expect_refusal(net *t, const char *a, const char *b) {
  char err[512] = "";
  assert_int_not_equal(kn_graph_compile(t->g, 1, NULL, err, sizeof err), KN_OK);
  print_message("refused: %s\n", err);
  assert_non_null(strstr(err, a));
  if (b) assert_non_null(strstr(err, b));
  kn_graph_free(t->g);
}

static void compile_refuses_placements_that_cannot_run(void **state) {
  (void)state;
  /* An op the CUDA backend has no kernel for (a softmax apart from its
   * loss), named with its node. */
  net t = {.g = kn_graph_new()};
  const kn_node x = kn_input(t.g, "x", KN_F32, 2, (int[]){8, 6});
  const kn_node s = kn_softmax(t.g, x);
  kn_graph_keep(t.g, s);
  assert_int_equal(kn_node_set_device(t.g, s, gpu0), KN_OK);
  char name[160];
  snprintf(name, sizeof name, "node '%s' (softmax) is placed on cuda:0", kn_node_name(t.g, s));
  expect_refusal(&t, name, "no kernel");
  /* A device this machine lacks. */
  t = build((kn_device){KN_DEVICE_CUDA, 7}, KN_PRECISION_FLOAT32);
  expect_refusal(&t, "is placed on cuda:7", NULL);
}

static void a_gpu_placed_graph_trains_as_on_the_cpu(void **state) {
  (void)state;
  net t = build(gpu0, KN_PRECISION_FLOAT32);
  char err[512] = "";
  kn_plan_stats st;
  if (kn_graph_compile(t.g, 1, &st, err, sizeof err) != KN_OK) {
    /* No GPU here: refused with the reason, and nothing to compare. */
    assert_non_null(strstr(err, "is placed on cuda:0"));
    kn_graph_free(t.g);
    skip_without_gpu(err);
  }
  assert_int_equal(st.n_fused, 0); /* the placed matmul and relu stay as they are */
  net c = build(cpu, KN_PRECISION_FLOAT32);
  assert_int_equal(kn_graph_compile(c.g, 1, NULL, err, sizeof err), KN_OK);
  assert_int_equal(kn_node_set_device(t.g, t.h, cpu), KN_ESTATE);
  float lg[8], lc[8];
  train(&t, lg);
  train(&c, lc);
  for (int s = 0; s < 8; s++) {
    print_message("step %d: loss %.7f on cuda:0, %.7f on cpu\n", s, lg[s], lc[s]);
    assert_true(fabsf(lg[s] - lc[s]) <= 1e-5f * fabsf(lc[s]) + 1e-6f);
  }
  /* The values stay on the device between its kernels. Each step copies
   * in x (8 x 6), w1 (6 x 5) and the relu output's gradient from the CPU's
   * matmul (8 x 5); out, the relu output for the CPU's matmul and its
   * gradient (8 x 5) and w1's gradient for the optimizer (6 x 5). The
   * matmul's output h, read only by the relu, never crosses; copying each
   * GPU kernel's operands in and result out would move 1,144 bytes in and
   * 600 out a step. */
  uint64_t in = 0, out = 0;
  size_t held = 0;
  kn_graph_device_copies(t.g, &in, &out, &held);
  print_message("copied a step: %llu bytes in, %llu out; %zu bytes held on cuda:0\n",
                (unsigned long long)(in / 8), (unsigned long long)(out / 8), held);
  assert_int_equal(in, 8 * (8 * 6 + 6 * 5 + 8 * 5) * sizeof(float));
  assert_int_equal(out, 8 * (8 * 5 + 6 * 5) * sizeof(float));
  assert_true(held >= (8 * 6 + 6 * 5 + 3 * 8 * 5 + 6 * 5) * sizeof(float));
  uint64_t none = 1;
  kn_graph_device_copies(c.g, &none, NULL, NULL);
  assert_int_equal(none, 0);
  /* A view is where its input is: read through reshapes, the same values
   * stay on the device (each view crossing would add 320 bytes each way). */
  net v = build_viewed(gpu0, KN_PRECISION_FLOAT32, 1);
  assert_int_equal(kn_graph_compile(v.g, 1, NULL, err, sizeof err), KN_OK);
  float lv[8];
  train(&v, lv);
  uint64_t vin = 0, vout = 0;
  kn_graph_device_copies(v.g, &vin, &vout, NULL);
  print_message("through views: %llu bytes in, %llu out a step; loss %.7f\n",
                (unsigned long long)(vin / 8), (unsigned long long)(vout / 8), lv[7]);
  assert_int_equal(vin, in);
  assert_int_equal(vout, out);
  for (int s = 0; s < 8; s++) assert_true(fabsf(lv[s] - lg[s]) <= 1e-6f * fabsf(lg[s]));
  kn_graph_free(v.g);
  kn_graph_free(t.g);
  kn_graph_free(c.g);
}

/* A model split over two GPUs (model parallelism): d1 on cuda:0, d2 on
 * cuda:1, the output layer on the host. */
static const kn_layer_config split_layers[] = {
    {.type = KN_LAYER_DENSE,
     .name = "d1",
     .units = 16,
     .use_bias = 1,
     .activation = KN_ACT_RELU,
     .placed = 1,
     .device = {KN_DEVICE_CUDA, 0}},
    {.type = KN_LAYER_DENSE,
     .name = "d2",
     .units = 12,
     .use_bias = 1,
     .activation = KN_ACT_RELU,
     .placed = 1,
     .device = {KN_DEVICE_CUDA, 1}},
    {.type = KN_LAYER_DENSE, .name = "out", .units = 3, .use_bias = 1, .placed = 1},
};

/* The model of split_layers, compiled: as split, or with every layer on
 * `all` instead (placed 0: the model's device); 0, or -1 (err set) when
 * compile refuses. */
static int build_model(int split, kn_device all, kn_model *m, char *err, size_t errlen) {
  kn_layer_config layers[3];
  memcpy(layers, split_layers, sizeof layers);
  for (int i = 0; i < 3 && !split; i++) layers[i].placed = 0;
  kn_model_config cfg = {.input_ndim = 1,
                         .input_shape = {6},
                         .n_layers = 3,
                         .layers = layers,
                         .batch_size = 8,
                         .seed = 3,
                         .device = split ? (kn_device){KN_DEVICE_CPU, 0} : all};
  assert_int_equal(kn_model_build(&cfg, m, err, errlen), KN_OK);
  if (kn_graph_compile(m->graph, 1, NULL, err, errlen) == KN_OK) return 0;
  kn_model_free(m);
  return -1;
}

/* That model trained 8 steps of SGD on fixed data: the losses, and the
 * model kept where keep is set; 0, or -1 (err set) when compile refuses. */
static int train_model(int split, kn_device all, float *losses, char *err, size_t errlen,
                       kn_model *keep) {
  kn_model m;
  if (build_model(split, all, &m, err, errlen) != 0) return -1;
  kn_optimizer_free(eight_steps(m.graph, m.x, m.y, m.loss, &sgd, 0, losses));
  if (keep)
    *keep = m;
  else
    kn_model_free(&m);
  return 0;
}

static void a_model_split_over_two_gpus_trains_as_on_one(void **state) {
  (void)state;
  char err[512] = "";
  float split[8], one[8], host[8];
  kn_model m;
  if (train_model(1, cpu, split, err, sizeof err, &m) != 0) {
    /* Without two GPUs (or the stand-in's), refused with the reason. */
    assert_non_null(strstr(err, "is placed on cuda:"));
    print_message("SKIPPED: model parallelism needs two CUDA devices here: %s\n", err);
    skip();
  }
  /* Each layer's kernels on its device, and their gradients with them;
   * what no GPU runs (the loss) and the host layer on the host. */
  const kn_device gpu1 = {KN_DEVICE_CUDA, 1};
  const char *names[] = {"d1/matmul",  "d2/matmul",       "d2/relu",    "grad/d2.kernel",
                         "out/matmul", "grad/out.kernel", "d1/bias_add"};
  const kn_device want[] = {gpu0, gpu1, gpu1, gpu1, cpu, cpu, gpu0};
  for (int k = 0; k < 7; k++) {
    const kn_node n = kn_graph_find(m.graph, names[k]);
    char where[32];
    kn_device_format(kn_node_device(m.graph, n), where, sizeof where);
    print_message("%s on %s\n", names[k], where);
    assert_true(n >= 0 && on(m.graph, n, want[k]));
  }
  assert_int_equal(kn_graph_gpu(m.graph), 0);
  assert_int_equal(kn_graph_gpu_last(m.graph), 1);
  kn_model_free(&m);
  assert_int_equal(train_model(0, gpu0, one, err, sizeof err, NULL), 0);
  assert_int_equal(train_model(0, cpu, host, err, sizeof err, NULL), 0);
  for (int s = 0; s < 8; s++) {
    print_message("step %d: loss %.7f split, %.7f on cuda:0, %.7f on the host\n", s, split[s],
                  one[s], host[s]);
    assert_true(fabsf(split[s] - one[s]) <= 1e-5f * fabsf(one[s]) + 1e-6f);
    assert_true(fabsf(split[s] - host[s]) <= 1e-5f * fabsf(host[s]) + 1e-6f);
  }
}

/* 8 steps of m, each optimizer step where the gradients are; the losses,
 * and the optimizer kept. */
static kn_optimizer *train_where_they_are(kn_model *m, const kn_optimizer_config *oc,
                                          float *losses) {
  return eight_steps(m->graph, m->x, m->y, m->loss, oc, 1, losses);
}

static int close_to(const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!(fabsf(a[i] - b[i]) <= 1e-5f * fabsf(b[i]) + 1e-6f)) return 0;
  return 1;
}

/* Every gradient computed on the GPU: each optimizer steps there, the
 * parameters and its state stay there between steps, and the losses, the
 * weights and the state are the host's. */
static void the_optimizer_steps_on_the_gpu(void **state) {
  (void)state;
  const kn_optimizer_config configs[] = {
      {.type = KN_OPT_SGD, .learning_rate = 0.1f},
      {.type = KN_OPT_SGD,
       .learning_rate = 0.05f,
       .momentum = 0.9f,
       .nesterov = 1,
       .weight_decay = 1e-3f},
      {.type = KN_OPT_ADAM,
       .learning_rate = 1e-2f,
       .beta1 = 0.9f,
       .beta2 = 0.999f,
       .epsilon = 1e-7f},
      {.type = KN_OPT_ADAMW,
       .learning_rate = 1e-2f,
       .beta1 = 0.9f,
       .beta2 = 0.999f,
       .epsilon = 1e-7f,
       .weight_decay = 0.01f},
      {.type = KN_OPT_RMSPROP,
       .learning_rate = 1e-3f,
       .rho = 0.9f,
       .momentum = 0.5f,
       .epsilon = 1e-5f},
      {.type = KN_OPT_ADAGRAD,
       .learning_rate = 0.05f,
       .epsilon = 1e-7f,
       .initial_accumulator_value = 0.1f},
  };
  char err[512] = "";
  for (size_t k = 0; k < sizeof configs / sizeof configs[0]; k++) {
    kn_model gm, cm;
    if (build_model(0, gpu0, &gm, err, sizeof err) != 0) {
      assert_non_null(strstr(err, "is placed on cuda:0"));
      skip_without_gpu(err);
    }
    assert_int_equal(build_model(0, cpu, &cm, err, sizeof err), 0);
    float lg[8], lc[8];
    kn_optimizer *og = train_where_they_are(&gm, &configs[k], lg);
    kn_optimizer *oc = train_where_they_are(&cm, &configs[k], lc);
    /* Over the 8 steps: the batch and its labels over, with the loss's
     * seed (a constant the compile folds on the host), the loss back, and
     * the parameters over once, for the first run's kernels (the first
     * step finds them there); nothing else crosses, the gradients and the
     * updated weights included. */
    uint64_t in = 0, out = 0;
    kn_graph_device_copies(gm.graph, &in, &out, NULL);
    const size_t params = kn_param_count(gm.graph) * sizeof(float);
    print_message("optimizer %d: loss %.7f on cuda:0, %.7f on the host; copied %llu bytes in, "
                  "%llu out\n",
                  (int)configs[k].type, lg[7], lc[7], (unsigned long long)in,
                  (unsigned long long)out);
    assert_true(close_to(lg, lc, 8));
    assert_int_equal(in, 8 * (8 * 6 + 8 + 1) * sizeof(float) + params);
    assert_int_equal(out, 8 * sizeof(float));
    /* Asked for, the weights and the state come back: the host's. */
    assert_true(close_to(kn_params(gm.graph), kn_params(cm.graph), kn_param_count(cm.graph)));
    kn_graph_device_copies(gm.graph, NULL, &out, NULL);
    assert_int_equal(out, 8 * sizeof(float) + params);
    kn_optimizer_type type;
    size_t n, nc;
    float *mg, *vg, *mc, *vc;
    int64_t *ig, *ic;
    kn_optimizer_moments(og, &type, &n, &mg, &vg, &ig);
    kn_optimizer_moments(oc, &type, &nc, &mc, &vc, &ic);
    assert_int_equal(*ig, 8);
    assert_int_equal(*ic, 8);
    assert_true(!mg == !mc && !vg == !vc);
    if (mg) assert_true(close_to(mg, mc, n));
    if (vg) assert_true(close_to(vg, vc, n));
    /* The host's copy is the current one again: the next step takes it
     * over, and goes on as the host does. */
    float more_g[8], more_c[8];
    kn_optimizer_free(train_where_they_are(&gm, &configs[k], more_g));
    kn_optimizer_free(train_where_they_are(&cm, &configs[k], more_c));
    assert_true(close_to(more_g, more_c, 8));
    kn_optimizer_free(og);
    kn_optimizer_free(oc);
    kn_model_free(&gm);
    kn_model_free(&cm);
  }
}

/* A small CNN: a strided same-padded convolution, an overlapping padded
 * max pool, a dilated convolution, an average pool and a dense layer,
 * batch 8 of 8x8x2 images. */
static const kn_layer_config cnn_layers[] = {
    {.type = KN_LAYER_CONV2D,
     .filters = 4,
     .kernel_size = {3, 3},
     .strides = {1, 2},
     .padding = KN_PAD_SAME,
     .activation = KN_ACT_RELU,
     .use_bias = 1},
    {.type = KN_LAYER_MAX_POOL2D, .pool_size = {3, 3}, .strides = {2, 1}, .padding = KN_PAD_SAME},
    {.type = KN_LAYER_CONV2D,
     .filters = 5,
     .kernel_size = {2, 2},
     .dilation_rate = {2, 1},
     .padding = KN_PAD_SAME,
     .activation = KN_ACT_RELU,
     .use_bias = 1},
    {.type = KN_LAYER_AVG_POOL2D, .pool_size = {2, 2}, .padding = KN_PAD_SAME},
    {.type = KN_LAYER_FLATTEN},
    {.type = KN_LAYER_DENSE, .units = 3, .use_bias = 1},
};

/* A residual block: convolution, batch norm, relu, a second convolution
 * and batch norm added to the first's output, a strided depthwise
 * convolution (two filters per channel), global average pooling and a
 * dense layer. */
static const kn_layer_config resnet_layers[] = {
    {.type = KN_LAYER_CONV2D, .filters = 6, .kernel_size = {3, 3}, .padding = KN_PAD_SAME},
    {.type = KN_LAYER_BATCH_NORM},
    {.type = KN_LAYER_ACTIVATION, .activation = KN_ACT_RELU},
    {.type = KN_LAYER_CONV2D, .filters = 6, .kernel_size = {3, 3}, .padding = KN_PAD_SAME},
    {.type = KN_LAYER_BATCH_NORM},
    {.type = KN_LAYER_ADD, .n_inputs = 2, .inputs = {2, 4}},
    {.type = KN_LAYER_DEPTHWISE_CONV2D,
     .kernel_size = {3, 3},
     .strides = {2, 2},
     .padding = KN_PAD_SAME,
     .depth_multiplier = 2},
    {.type = KN_LAYER_GLOBAL_AVG_POOL2D},
    {.type = KN_LAYER_DENSE, .units = 3, .use_bias = 1},
};

static int build_layers(const kn_layer_config *layers, int n_layers, kn_device d,
                        kn_precision precision, kn_model *m, char *err, size_t errlen) {
  kn_model_config cfg = {.input_ndim = 3,
                         .input_shape = {8, 8, 2},
                         .n_layers = n_layers,
                         .layers = layers,
                         .batch_size = 8,
                         .seed = 5,
                         .precision = precision,
                         .device = d};
  assert_int_equal(kn_model_build(&cfg, m, err, errlen), KN_OK);
  if (kn_graph_compile(m->graph, 1, NULL, err, errlen) == KN_OK) return 0;
  kn_model_free(m);
  return -1;
}

/* Eight Adam steps of the CNN on batches of 8 images. */
static void train_cnn(kn_model *m, float *losses) {
  char err[512] = "";
  const kn_optimizer_config adam = {.type = KN_OPT_ADAM,
                                    .learning_rate = 1e-2f,
                                    .beta1 = 0.9f,
                                    .beta2 = 0.999f,
                                    .epsilon = 1e-7f};
  kn_optimizer *opt;
  assert_int_equal(kn_optimizer_new(&adam, kn_param_count(m->graph), &opt, err, sizeof err), KN_OK);
  float *xs = kn_node_data(m->graph, m->x);
  int32_t *ys = kn_node_data(m->graph, m->y);
  for (int s = 0; s < 8; s++) {
    for (int i = 0; i < 8 * 8 * 8 * 2; i++) xs[i] = (float)((i * 37 + s * 11) % 23) / 23.0f - 0.45f;
    for (int i = 0; i < 8; i++) ys[i] = (i + s) % 3;
    if (kn_graph_run(m->graph, KN_RUN_TRAIN, 8, err, sizeof err) != KN_OK) fail_msg("run: %s", err);
    losses[s] = *(float *)kn_node_data(m->graph, m->loss);
    if (kn_optimizer_step_graph(opt, m->graph, err, sizeof err) != KN_OK) fail_msg("step: %s", err);
  }
  kn_optimizer_free(opt);
}

/* cuBLAS and the device's batch norm sum in other orders than the CPU:
 * float32 losses within 1e-4 there, 1e-5 on the host stand-in. */
static int real_gpu(void) {
  char name[128] = "", err[256] = "";
  return kn_cuda_device_name(0, name, sizeof name, err, sizeof err) == 0 &&
         strncmp(name, "host stand-in", 13) != 0;
}

static int build_cnn(int resnet, kn_device d, kn_precision precision, kn_model *m, char *err,
                     size_t errlen) {
  return resnet ? build_layers(resnet_layers, sizeof resnet_layers / sizeof resnet_layers[0], d,
                               precision, m, err, errlen)
                : build_layers(cnn_layers, sizeof cnn_layers / sizeof cnn_layers[0], d, precision,
                               m, err, errlen);
}

/* Convolutions, pooling, batch norm, residual adds and their gradients run
 * on the GPU too: the CNN and the residual block train there as on the
 * host (float32: to rounding, batch norm's sums in another order;
 * mixed_bfloat16 and mixed_float16, whose GEMMs round their operands on
 * the GPU where the CPU's read narrow copies: within 1e-3 and 5e-3), every kernel on the device,
 * the loss's too, and only the batch and its labels (and the loss's seed) cross a step, the loss
 * comes back, and so do batch norm's moving statistics, which go over for its kernel and come back
 * as they move. */
static void a_cnn_trains_on_the_gpu_as_on_the_host(void **state) {
  (void)state;
  char err[512] = "";
  const kn_precision precisions[] = {KN_PRECISION_FLOAT32, KN_PRECISION_MIXED_BFLOAT16,
                                     KN_PRECISION_MIXED_FLOAT16, KN_PRECISION_FLOAT32};
  for (int p = 0; p < 4; p++) {
    const int resnet = p == 3;
    kn_model gm, cm;
    if (build_cnn(resnet, gpu0, precisions[p], &gm, err, sizeof err) != 0) {
      assert_non_null(strstr(err, "is placed on cuda:0"));
      skip_without_gpu(err);
    }
    assert_int_equal(build_cnn(resnet, cpu, precisions[p], &cm, err, sizeof err), 0);
    int on_gpu = 0, with_kernel = 0;
    char host_ops[256];
    kn_graph_placement_summary(gm.graph, &on_gpu, &with_kernel, host_ops, sizeof host_ops);
    print_message("%s: %d of %d kernels on cuda:0; on the host: %s\n",
                  kn_precision_name(precisions[p]), on_gpu, with_kernel, host_ops);
    assert_int_equal(on_gpu, with_kernel); /* every kernel, the loss's too */
    assert_string_equal(host_ops, "");
    float lg[8], lc[8];
    train_cnn(&gm, lg);
    train_cnn(&cm, lc);
    for (int s = 0; s < 8; s++) {
      print_message("step %d: loss %.7f on cuda:0, %.7f on the host\n", s, lg[s], lc[s]);
      /* the mixed ones: mixed_float16's gradients, unscaled here, lose
       * their smallest terms to f16 where the CPU's lowering and the GPU's
       * GEMMs round different values */
      const float tol = p == 1 ? 1e-3f : p == 2 ? 5e-3f : real_gpu() ? 1e-4f : 1e-5f;
      assert_true(fabsf(lg[s] - lc[s]) <= tol * fmaxf(1.0f, fabsf(lc[s])));
    }
    uint64_t in = 0, out = 0;
    kn_graph_device_copies(gm.graph, &in, &out, NULL);
    const size_t params = kn_param_count(gm.graph) * sizeof(float);
    /* the residual block's two batch norms: 6 channels' moving mean and
     * variance each, over and back every step (the host's copy is the
     * current one between runs: checkpoints and replicas write it) */
    const size_t moving = resnet ? 2 * 2 * 6 * sizeof(float) : 0;
    assert_int_equal(in, 8 * ((8 * 8 * 8 * 2 + 8 + 1) * sizeof(float) + moving) + params);
    assert_int_equal(out, 8 * (sizeof(float) + moving));
    if (resnet) { /* the host's moving statistics are the GPU's */
      const float *sg = kn_state_data(gm.graph), *sc = kn_state_data(cm.graph);
      assert_true(close_to(sg, sc, 2 * 2 * 6));
    }
    kn_model_free(&gm);
    kn_model_free(&cm);
  }
}

/* Every loss runs on the GPU and trains as on the host: categorical
 * cross-entropy against target probabilities, binary cross-entropy on
 * logits, mean squared and mean absolute error; the whole graph there. */
static void every_loss_trains_on_the_gpu_as_on_the_host(void **state) {
  (void)state;
  const kn_loss losses[] = {KN_LOSS_XENT, KN_LOSS_BCE, KN_LOSS_MSE, KN_LOSS_MAE};
  const kn_layer_config layers[] = {
      {.type = KN_LAYER_DENSE, .units = 5, .use_bias = 1, .activation = KN_ACT_RELU},
      {.type = KN_LAYER_DENSE, .units = 3, .use_bias = 1}};
  char err[512] = "";
  for (size_t k = 0; k < sizeof losses / sizeof losses[0]; k++) {
    float lg[8], lc[8];
    for (int gpu = 1; gpu >= 0; gpu--) {
      kn_model_config cfg = {.input_ndim = 1,
                             .input_shape = {6},
                             .n_layers = 2,
                             .layers = layers,
                             .batch_size = 8,
                             .seed = 9,
                             .loss = losses[k],
                             .device = gpu ? gpu0 : cpu};
      kn_model m;
      assert_int_equal(kn_model_build(&cfg, &m, err, sizeof err), KN_OK);
      if (kn_graph_compile(m.graph, 1, NULL, err, sizeof err) != KN_OK) {
        assert_true(gpu);
        kn_model_free(&m);
        skip_without_gpu(err);
      }
      if (gpu) {
        int on_gpu = 0, with_kernel = 0;
        char host_ops[256];
        kn_graph_placement_summary(m.graph, &on_gpu, &with_kernel, host_ops, sizeof host_ops);
        print_message("loss %d: %d of %d kernels on cuda:0 (host: %s)\n", (int)losses[k], on_gpu,
                      with_kernel, host_ops);
        assert_int_equal(on_gpu, with_kernel);
      }
      kn_optimizer *opt;
      assert_int_equal(kn_optimizer_new(&sgd, kn_param_count(m.graph), &opt, err, sizeof err),
                       KN_OK);
      float *xs = kn_node_data(m.graph, m.x), *ys = kn_node_data(m.graph, m.y);
      for (int i = 0; i < 48; i++) xs[i] = (float)((i * 37) % 11) / 11.0f - 0.4f;
      for (int i = 0; i < 24; i++) /* one-hot rows, 0/1 targets, or values */
        ys[i] = losses[k] == KN_LOSS_XENT  ? (float)(i % 3 == (i / 3) % 3)
                : losses[k] == KN_LOSS_BCE ? (float)((i * 5) % 2)
                                           : (float)((i * 7) % 5) / 5.0f - 0.3f;
      for (int s = 0; s < 8; s++) {
        if (kn_graph_run(m.graph, KN_RUN_TRAIN, 8, err, sizeof err) != KN_OK)
          fail_msg("run: %s", err);
        (gpu ? lg : lc)[s] = *(float *)kn_node_data(m.graph, m.loss);
        if (kn_optimizer_step_graph(opt, m.graph, err, sizeof err) != KN_OK)
          fail_msg("step: %s", err);
      }
      kn_optimizer_free(opt);
      kn_model_free(&m);
    }
    for (int s = 0; s < 8; s++)
      if (!(fabsf(lg[s] - lc[s]) <= (real_gpu() ? 1e-4f : 1e-5f) * fmaxf(1.0f, fabsf(lc[s]))))
        fail_msg("loss %d, step %d: %.7f on cuda:0, %.7f on the host", (int)losses[k], s,
                 (double)lg[s], (double)lc[s]);
  }
}

/* The loss runs on the GPU, but a label outside the classes still fails
 * the step with the CPU's words, naming it and its row: the labels are
 * checked on the host, where they were fed. */
static void a_bad_label_fails_the_gpu_step_by_name(void **state) {
  (void)state;
  char err[512] = "";
  kn_model m;
  if (build_model(0, gpu0, &m, err, sizeof err) != 0) {
    skip_without_gpu(err);
  }
  float *xs = kn_node_data(m.graph, m.x);
  int32_t *ys = kn_node_data(m.graph, m.y);
  for (int i = 0; i < 48; i++) xs[i] = 0.1f * (float)(i % 7);
  for (int i = 0; i < 8; i++) ys[i] = i % 3;
  ys[5] = 7;
  assert_int_equal(kn_graph_run(m.graph, KN_RUN_TRAIN, 8, err, sizeof err), KN_EINVAL);
  print_message("refused: %s\n", err);
  assert_non_null(strstr(err, "label 7 of row 5 is outside [0, 3)"));
  ys[5] = 2; /* and the next step runs */
  assert_int_equal(kn_graph_run(m.graph, KN_RUN_TRAIN, 8, err, sizeof err), KN_OK);
  kn_model_free(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_cpu_graph_never_maps_the_cuda_libraries),
      cmocka_unit_test(nodes_take_the_graph_device_and_gradients_their_forward_node),
      cmocka_unit_test(compile_refuses_placements_that_cannot_run),
      cmocka_unit_test(a_gpu_placed_graph_trains_as_on_the_cpu),
      cmocka_unit_test(a_model_split_over_two_gpus_trains_as_on_one),
      cmocka_unit_test(the_optimizer_steps_on_the_gpu),
      cmocka_unit_test(a_cnn_trains_on_the_gpu_as_on_the_host),
      cmocka_unit_test(a_bad_label_fails_the_gpu_step_by_name),
      cmocka_unit_test(every_loss_trains_on_the_gpu_as_on_the_host),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
