/* The op table and the backend interface: every op has a record a pass or
 * backend can rely on (a name, an arity, a CPU kernel at every path unless
 * it needs none), the CUDA backend supports exactly the float32 ops with
 * a CUDA kernel, and every backend with a device copies bytes into its
 * memory and back unchanged. Run as test_engine_backend (no GPU: the CUDA
 * part skips) and test_engine_backend_host_gpus (the CUDA module's host
 * stand-in). */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"

static void every_op_has_a_name_an_arity_and_its_kernels(void **state) {
  (void)state;
  for (int op = 0; op < KN_OP_COUNT; op++) {
    const kn_op_def *d = kn_op_def_of((kn_op)op);
    if (!d->name) fail_msg("op %d has no record in the op table", op);
    assert_string_equal(kn_op_name(op), d->name);
    assert_true(d->min_inputs >= 0 && d->min_inputs <= d->max_inputs &&
                d->max_inputs <= KN_MAX_INPUTS);
    for (int path = 0; path < KN_CPU_PATHS; path++) {
      const int kernel = d->cpu[path] != NULL, none = (d->flags & KN_OPF_NO_KERNEL) != 0;
      if (kernel == none)
        fail_msg("op %s: CPU kernel at path %d %s, but the op says it %s one", d->name, path,
                 kernel ? "set" : "missing", none ? "needs none" : "has");
    }
    /* in place only over inputs it has */
    assert_int_equal(d->inplace_inputs & ~((1u << KN_MAX_INPUTS) - 1u), 0);
  }
  assert_string_equal(kn_op_name(KN_OP_COUNT), "op");
}

/* A one-layer graph, float32: x (4, 3) matmul w (3, 2), relu. */
static kn_graph *dense_relu(kn_node *mm, kn_node *r, kn_node *x) {
  kn_graph *g = kn_graph_new();
  *x = kn_input(g, "x", KN_F32, 2, (int[]){4, 3});
  kn_node w = kn_param(g, "w", 2, (int[]){3, 2}, KN_INIT_GLOROT_UNIFORM);
  *mm = kn_matmul(g, *x, w, 0, 0);
  *r = kn_relu(g, *mm);
  assert_int_equal(kn_graph_error(g, NULL, 0), KN_OK);
  return g;
}

static void backends_support_the_ops_they_have_kernels_for(void **state) {
  (void)state;
  kn_node mm, r, x;
  kn_graph *g = dense_relu(&mm, &r, &x);
  const kn_backend *cpu = kn_backend_of((kn_device){KN_DEVICE_CPU, 0});
  const kn_backend *cuda = kn_backend_of((kn_device){KN_DEVICE_CUDA, 0});
  assert_string_equal(cpu->name, "cpu");
  assert_string_equal(cuda->name, "cuda");
  for (int i = 0; i < kn_graph_node_count(g); i++) {
    const kn_node_rec *n = &g->nodes[i];
    assert_true(cpu->supports(g, n));
    /* the CUDA backend: float32 matmul and relu by kernel, the input and
     * parameter as storage */
    assert_true(cuda->supports(g, n));
    assert_int_equal(cuda->kernel(g, n) != NULL, i == mm || i == r);
  }
  kn_node s = kn_softmax(g, r);
  assert_true(cpu->kernel(g, &g->nodes[s]) != NULL);
  assert_null(cuda->kernel(g, &g->nodes[s]));
  assert_false(cuda->supports(g, &g->nodes[s]));
  kn_graph_free(g);
}

/* bytes into each of a backend's devices and back: the same bytes. A
 * backend with no device here is skipped, saying so. */
static void copies_bytes_in_and_out_unchanged(kn_device kind) {
  const kn_backend *be = kn_backend_of(kind);
  char err[512] = "";
  int devices = 0;
  assert_int_equal(be->device_count(&devices, err, sizeof err), 0);
  if (devices == 0) {
    print_message("SKIPPED: no %s device (or module) here\n", be->name);
    skip();
  }
  for (int dev = 0; dev < devices; dev++) {
    unsigned char in[1000], out[1000];
    for (size_t i = 0; i < sizeof in; i++) in[i] = (unsigned char)(i * 7 + 3);
    memset(out, 0, sizeof out);
    void *p = be->alloc(dev, sizeof in, err, sizeof err);
    if (!p) fail_msg("%s:%d alloc: %s", be->name, dev, err);
    assert_int_equal(be->copy_in(dev, p, in, sizeof in, err, sizeof err), 0);
    assert_int_equal(be->copy_out(dev, out, p, sizeof out, err, sizeof err), 0);
    assert_memory_equal(in, out, sizeof in);
    be->free(dev, p);
    be->free(dev, NULL);
  }
}

static void the_cpu_backend_copies_bytes_in_and_out_unchanged(void **state) {
  (void)state;
  copies_bytes_in_and_out_unchanged((kn_device){KN_DEVICE_CPU, 0});
}

static void the_cuda_backend_copies_bytes_in_and_out_unchanged(void **state) {
  (void)state;
  copies_bytes_in_and_out_unchanged((kn_device){KN_DEVICE_CUDA, 0});
}

/* A graph with a node on a GPU pins the host buffers its GPU kernels copy
 * from and to (the arena, the parameters, the gradients) at compile, and
 * unpins them before freeing them; a CPU graph pins nothing. What is
 * pinned is counted by the host stand-in of the CUDA module; elsewhere
 * (the real module, or none) the test is skipped, saying so. */
static void a_gpu_graph_pins_its_host_buffers_while_it_lives(void **state) {
  (void)state;
  const char *path = getenv("KILN_CUDA_MODULE");
  void *h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
  int devices = 0;
  char err[512] = "";
  assert_int_equal(
      kn_backend_of((kn_device){KN_DEVICE_CUDA, 0})->device_count(&devices, err, sizeof err), 0);
  if (!h) h = path ? dlopen(path, RTLD_NOW) : NULL;
  size_t (*pinned_bytes)(void) = NULL;
  if (h) *(void **)(&pinned_bytes) = dlsym(h, "kiln_host_gpus_pinned_bytes");
  if (devices == 0 || !pinned_bytes) {
    print_message("SKIPPED: only the CUDA module's host stand-in counts what it pins "
                  "(KILN_CUDA_MODULE names none here)\n");
    skip();
  }
  for (int gpu = 0; gpu <= 1; gpu++) {
    kn_graph *g = kn_graph_new();
    int xd[2] = {4, 8}, wd[2] = {8, 16};
    kn_node x = kn_input(g, "x", KN_F32, 2, xd);
    kn_node w = kn_param(g, "w", 2, wd, KN_INIT_GLOROT_UNIFORM);
    kn_node loss = kn_sum(g, kn_relu(g, kn_matmul(g, x, w, 0, 0)), -1, 0);
    assert_int_equal(kn_autodiff(g, loss, err, sizeof err), KN_OK);
    if (gpu) assert_true(kn_graph_place_soft(g, (kn_device){KN_DEVICE_CUDA, 0}) > 0);
    kn_plan_stats st;
    if (kn_graph_compile(g, 1, &st, err, sizeof err)) fail_msg("compile: %s", err);
    const size_t want = gpu ? st.arena_bytes + 2 * st.param_bytes : 0;
    if (pinned_bytes() != want)
      fail_msg("%s graph: %zu bytes pinned, want %zu (arena %zu, parameters %zu)",
               gpu ? "a GPU" : "a CPU", pinned_bytes(), want, st.arena_bytes, st.param_bytes);
    assert_int_equal(kn_graph_run(g, KN_RUN_TRAIN, 4, err, sizeof err), KN_OK);
    kn_graph_free(g);
    assert_int_equal(pinned_bytes(), 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_op_has_a_name_an_arity_and_its_kernels),
      cmocka_unit_test(backends_support_the_ops_they_have_kernels_for),
      cmocka_unit_test(the_cpu_backend_copies_bytes_in_and_out_unchanged),
      cmocka_unit_test(the_cuda_backend_copies_bytes_in_and_out_unchanged),
      cmocka_unit_test(a_gpu_graph_pins_its_host_buffers_while_it_lives),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
