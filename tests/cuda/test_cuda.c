/* test_cuda.c — the CUDA backend against plain CPU loops: sgemm in all four
 * transpose combinations on odd sizes, relu and its gradient (NaN, -0,
 * inf included), and, on device buffers, a bias added to rows (with and
 * without relu) and a bias's gradient (the sums of rows), GEMMs on TF32
 * and bf16 tensor cores, im2col and col2im, max and average pooling and
 * their gradients (kernels_ref.h's loops, the CPU's, bit for bit), and
 * mixed_bfloat16's casts.
 * Without a CUDA device, or in a build without CUDA, the GPU tests are
 * skipped with a message; the tests that need no device still run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda.h"
#include "philox.h"
#include "kernels_ref.h"

#define MATMUL_RTOL 1e-4

static int device_count; /* set once in main() */

#define REQUIRE_DEVICE()                                                                           \
  do {                                                                                             \
    if (device_count == 0) {                                                                       \
      print_message("SKIPPED: no CUDA device on this machine\n");                                  \
      skip();                                                                                      \
    }                                                                                              \
  } while (0)

/* Deterministic values in [-1, 1): the same inputs on every run. */
static void fill_uniform(float *x, size_t n, uint32_t seed) {
  uint32_t state = seed * 2654435761u + 1u;
  for (size_t i = 0; i < n; i++) {
    state = state * 1664525u + 1013904223u;
    x[i] = (float)((state >> 8) * (1.0 / 8388608.0) - 1.0);
  }
}

/* c (m, n) = op(a) op(b), row-major, in double; scale[i] = sum |a||b| of
 * that element's dot product, the yardstick for a relative tolerance that
 * also holds where terms cancel to near zero. */
static void matmul_reference(const float *a, const float *b, double *c, double *scale, int m, int n,
                             int k, int trans_a, int trans_b) {
  for (int i = 0; i < m; i++) {
    for (int j = 0; j < n; j++) {
      double sum = 0.0, abs_sum = 0.0;
      for (int p = 0; p < k; p++) {
        double av = trans_a ? a[(size_t)p * m + i] : a[(size_t)i * k + p];
        double bv = trans_b ? b[(size_t)j * k + p] : b[(size_t)p * n + j];
        sum += av * bv;
        abs_sum += fabs(av * bv);
      }
      c[(size_t)i * n + j] = sum;
      scale[(size_t)i * n + j] = abs_sum;
    }
  }
}

static void check_matmul(int m, int n, int k, int trans_a, int trans_b) {
  size_t a_len = (size_t)m * k, b_len = (size_t)k * n, c_len = (size_t)m * n;
  float *a = malloc(a_len * sizeof *a);
  float *b = malloc(b_len * sizeof *b);
  float *c = malloc(c_len * sizeof *c);
  double *expected = malloc(c_len * sizeof *expected);
  double *scale = malloc(c_len * sizeof *scale);
  assert_non_null(a);
  assert_non_null(b);
  assert_non_null(c);
  assert_non_null(expected);
  assert_non_null(scale);
  fill_uniform(a, a_len, 1u + (uint32_t)trans_a);
  fill_uniform(b, b_len, 7u + (uint32_t)trans_b);
  for (size_t i = 0; i < c_len; i++) c[i] = NAN; /* every element must be written */
  matmul_reference(a, b, expected, scale, m, n, k, trans_a, trans_b);

  char err[512] = "";
  int rc = kn_cuda_matmul(a, b, c, m, n, k, trans_a, trans_b, err, sizeof err);
  if (rc != 0) print_error("kn_cuda_matmul: %s\n", err);
  assert_int_equal(rc, 0);

  size_t bad = 0;
  for (size_t i = 0; i < c_len; i++) {
    double diff = fabs((double)c[i] - expected[i]);
    if (!(diff <= MATMUL_RTOL * scale[i])) { /* also catches NaN */
      if (bad++ < 5)
        print_error("m=%d n=%d k=%d trans_a=%d trans_b=%d: c[%zu, %zu] = %.9g, expected %.9g\n", m,
                    n, k, trans_a, trans_b, i / (size_t)n, i % (size_t)n, (double)c[i],
                    expected[i]);
    }
  }
  assert_int_equal(bad, 0);
  free(a);
  free(b);
  free(c);
  free(expected);
  free(scale);
}

/* ---- tests that run everywhere ---- */

static void device_count_succeeds_without_error(void **state) {
  (void)state;
  int count = -1;
  char err[512] = "";
  assert_int_equal(kn_cuda_device_count(&count, err, sizeof err), 0);
  assert_true(count >= 0);
  assert_int_equal(count, device_count);
}

static void matmul_rejects_negative_sizes_with_a_message(void **state) {
  (void)state;
  float a = 1.0f, b = 1.0f, c = 0.0f;
  char err[512] = "";
  assert_int_equal(kn_cuda_matmul(&a, &b, &c, -1, 1, 1, 0, 0, err, sizeof err), -1);
  assert_true(strlen(err) > 0);
}

static void device_name_of_a_missing_device_fails_with_a_message(void **state) {
  (void)state;
  char name[256] = "x", err[512] = "";
  assert_int_equal(kn_cuda_device_name(device_count, name, sizeof name, err, sizeof err), -1);
  assert_true(strlen(err) > 0);
}

static void matmul_without_a_device_fails_with_a_message(void **state) {
  (void)state;
  if (device_count > 0) { /* the opposite case is what the GPU tests cover */
    print_message("SKIPPED: this machine has a CUDA device; the failure needs none\n");
    skip();
  }
  float a[4] = {1, 2, 3, 4}, b[4] = {1, 0, 0, 1}, c[4] = {0};
  char err[512] = "";
  assert_int_equal(kn_cuda_matmul(a, b, c, 2, 2, 2, 0, 0, err, sizeof err), -1);
  assert_true(strlen(err) > 0);
  print_message("without a device, kn_cuda_matmul says: %s\n", err);
}

/* ---- tests that need a CUDA device ---- */

static void device_name_names_device_zero(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  char name[256] = "", err[512] = "";
  int rc = kn_cuda_device_name(0, name, sizeof name, err, sizeof err);
  if (rc != 0) print_error("kn_cuda_device_name: %s\n", err);
  assert_int_equal(rc, 0);
  assert_true(strlen(name) > 0);
  print_message("CUDA device 0: %s\n", name);
}

static void matmul_matches_cpu_on_odd_sizes(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  check_matmul(37, 53, 29, 0, 0);
}

static void matmul_with_a_transposed_matches_cpu(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  check_matmul(37, 53, 29, 1, 0);
}

static void matmul_with_b_transposed_matches_cpu(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  check_matmul(37, 53, 29, 0, 1);
}

static void matmul_with_both_transposed_matches_cpu(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  check_matmul(37, 53, 29, 1, 1);
}

static void matmul_matches_cpu_on_thin_and_larger_shapes(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  check_matmul(1, 1, 1, 0, 0);
  check_matmul(1, 301, 7, 1, 0);     /* a row vector times a matrix */
  check_matmul(301, 1, 7, 0, 1);     /* a matrix times a column vector */
  check_matmul(130, 67, 257, 1, 1);  /* k past a tile boundary */
  check_matmul(257, 129, 513, 0, 1); /* big enough for a tiled kernel */
}

static void matmul_with_k_zero_writes_zeros(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  float a = 1.0f, b = 1.0f, c[6] = {1, 2, 3, 4, 5, 6};
  char err[512] = "";
  assert_int_equal(kn_cuda_matmul(&a, &b, c, 2, 3, 0, 0, 0, err, sizeof err), 0);
  for (int i = 0; i < 6; i++) assert_true(c[i] == 0.0f);
}

static float relu_reference(float v) {
  return v < 0.0f ? 0.0f : v; /* NaN passes through, as in PyTorch */
}

static void check_relu(size_t n, int in_place) {
  float *x = malloc(n * sizeof *x);
  float *y = in_place ? x : malloc(n * sizeof *y);
  float *expected = malloc(n * sizeof *expected);
  assert_non_null(x);
  assert_non_null(y);
  assert_non_null(expected);
  fill_uniform(x, n, 42u);
  if (n > 4) {
    x[0] = NAN;
    x[1] = -INFINITY;
    x[2] = INFINITY;
    x[3] = -0.0f;
  }
  for (size_t i = 0; i < n; i++) expected[i] = relu_reference(x[i]);
  if (!in_place)
    for (size_t i = 0; i < n; i++) y[i] = 12345.0f; /* every element must be written */

  char err[512] = "";
  int rc = kn_cuda_relu(x, y, n, err, sizeof err);
  if (rc != 0) print_error("kn_cuda_relu: %s\n", err);
  assert_int_equal(rc, 0);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    int same = isnan(expected[i]) ? isnan(y[i]) : y[i] == expected[i];
    if (!same && bad++ < 5)
      print_error("relu n=%zu: y[%zu] = %g, expected %g\n", n, i, (double)y[i],
                  (double)expected[i]);
  }
  assert_int_equal(bad, 0);
  if (!in_place) free(y);
  free(x);
  free(expected);
}

static void relu_matches_cpu(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  check_relu(1, 0);
  check_relu(1001, 0);
  check_relu(5000011, 0); /* more elements than threads: the grid-stride loop runs */
}

static void relu_works_in_place(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  check_relu(4099, 1);
}

/* relu's gradient masks dy only where y <= 0 (PyTorch's threshold_backward,
 * and the CPU kernel's rule): a NaN y passes dy, so a NaN is not zeroed. */
static void relu_grad_passes_dy_where_y_is_nan(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  enum { N = 1001 };
  float *dy = malloc(N * sizeof *dy), *y = malloc(N * sizeof *y), *dx = malloc(N * sizeof *dx);
  assert_non_null(dy);
  assert_non_null(y);
  assert_non_null(dx);
  fill_uniform(dy, N, 7u);
  fill_uniform(y, N, 8u);
  y[0] = NAN;
  y[1] = -NAN;
  y[2] = -0.0f;
  y[3] = INFINITY;
  y[4] = -INFINITY;
  dy[5] = NAN; /* masked where y <= 0, passed where y > 0 */
  y[5] = -1.0f;
  dy[6] = NAN;
  y[6] = 1.0f;
  char err[512] = "";
  int rc = kn_cuda_relu_grad(dy, y, dx, N, err, sizeof err);
  if (rc != 0) print_error("kn_cuda_relu_grad: %s\n", err);
  assert_int_equal(rc, 0);
  size_t bad = 0;
  for (size_t i = 0; i < N; i++) {
    const float want = y[i] <= 0.0f ? 0.0f : dy[i];
    int same = isnan(want) ? isnan(dx[i]) : dx[i] == want;
    if (!same && bad++ < 5)
      print_error("relu_grad: dx[%zu] = %g for y %g, dy %g; expected %g\n", i, (double)dx[i],
                  (double)y[i], (double)dy[i], (double)want);
  }
  assert_int_equal(bad, 0);
  assert_true(dx[0] == dy[0] && dx[1] == dy[1]);
  free(dy);
  free(y);
  free(dx);
}

/* The kernels on device buffers (the graph's, over values kept on the
 * device): x and b copied in, the kernel, y copied out. */
static float *on_device(const float *host, size_t n) {
  void *d = NULL;
  char err[512] = "";
  if (kn_cuda_alloc(0, (n ? n : 1) * sizeof(float), &d, err, sizeof err) != 0)
    fail_msg("kn_cuda_alloc: %s", err);
  if (host && kn_cuda_copy_in(0, d, host, n * sizeof(float), err, sizeof err) != 0)
    fail_msg("kn_cuda_copy_in: %s", err);
  return d;
}

static void back_to_host(float *host, const float *d, size_t n) {
  char err[512] = "";
  if (kn_cuda_copy_out(0, host, d, n * sizeof(float), err, sizeof err) != 0)
    fail_msg("kn_cuda_copy_out (the queued kernel's faults show here): %s", err);
}

/* y = x + b over rows, with and without the relu after; then the sum of
 * each column over the rows, against a double sum. */
static void bias_add_and_reduce_rows_match_cpu(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  enum { ROWS = 1031, COLS = 37 };
  float *x = malloc(ROWS * COLS * sizeof *x), *b = malloc(COLS * sizeof *b);
  float *y = malloc(ROWS * COLS * sizeof *y), *sum = malloc(COLS * sizeof *sum);
  assert_true(x && b && y && sum);
  fill_uniform(x, ROWS * COLS, 3u);
  fill_uniform(b, COLS, 4u);
  x[0] = NAN;
  float *dx = on_device(x, ROWS * COLS), *db = on_device(b, COLS);
  float *dy = on_device(NULL, ROWS * COLS), *ds = on_device(NULL, COLS);
  char err[512] = "";
  for (int relu = 0; relu < 2; relu++) {
    assert_int_equal(kn_cuda_dev_bias_add(dx, db, dy, ROWS, COLS, relu, err, sizeof err), 0);
    back_to_host(y, dy, ROWS * COLS);
    size_t bad = 0;
    for (size_t i = 0; i < (size_t)ROWS * COLS; i++) {
      float want = x[i] + b[i % COLS];
      if (relu && want < 0.0f) want = 0.0f; /* NaN passes, as relu's */
      if (!(isnan(want) ? isnan(y[i]) : y[i] == want) && bad++ < 5)
        print_error("bias_add relu=%d: y[%zu] = %g, expected %g\n", relu, i, (double)y[i],
                    (double)want);
    }
    assert_int_equal(bad, 0);
  }
  x[0] = 0.5f;
  assert_int_equal(kn_cuda_copy_in(0, dx, x, sizeof(float), err, sizeof err), 0);
  assert_int_equal(kn_cuda_dev_reduce_rows(dx, ds, ROWS, COLS, err, sizeof err), 0);
  back_to_host(sum, ds, COLS);
  for (int c = 0; c < COLS; c++) {
    double want = 0.0, scale = 0.0;
    for (int r = 0; r < ROWS; r++) {
      want += x[(size_t)r * COLS + c];
      scale += fabs(x[(size_t)r * COLS + c]);
    }
    if (fabs(sum[c] - want) > 1e-5 * scale)
      fail_msg("reduce_rows: column %d sums to %g, expected %g", c, (double)sum[c], want);
  }
  kn_cuda_free(0, dx);
  kn_cuda_free(0, db);
  kn_cuda_free(0, dy);
  kn_cuda_free(0, ds);
  free(x);
  free(b);
  free(y);
  free(sum);
}

/* Gives back n device buffers. */
static void free_all(void **d, int n) {
  for (int i = 0; i < n; i++) kn_cuda_free(0, d[i]);
}

/* Bitwise equality of n floats (NaN equal to NaN), with the first few
 * differences printed. */
static void assert_same_bits(const char *what, const float *got, const float *want, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    const int same = (isnan(got[i]) && isnan(want[i])) || memcmp(&got[i], &want[i], 4) == 0;
    if (!same && bad++ < 5)
      print_error("%s: [%zu] = %a, expected %a\n", what, i, (double)got[i], (double)want[i]);
  }
  if (bad) fail_msg("%s: %zu of %zu elements differ", what, bad, n);
}

/* A 3x3 window, stride 2, TF's same padding over 9x7 images of 5
 * channels: partial windows at every edge. */
#define STRIDED_3X3                                                                                \
  {                                                                                                \
    .batch = 3, .h = 9, .w = 7, .c = 5, .oh = 5, .ow = 4, .kh = 3, .kw = 3, .sh = 2, .sw = 2,      \
    .dh = 1, .dw = 1, .pad_top = 1, .pad_left = 1                                                  \
  }

/* im2col then col2im on device buffers against the CPU's loops, bit for
 * bit: stride 2 with TF's same padding, a dilated 3x3, and a 1x1. */
static void im2col_and_col2im_match_cpu(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  const kn_cuda_windows shapes[] = {
      STRIDED_3X3,
      {.batch = 2,
       .h = 8,
       .w = 8,
       .c = 3,
       .oh = 8,
       .ow = 8,
       .kh = 3,
       .kw = 3,
       .sh = 1,
       .sw = 1,
       .dh = 2,
       .dw = 2,
       .pad_top = 2,
       .pad_left = 2},
      {.batch = 2,
       .h = 5,
       .w = 6,
       .c = 17,
       .oh = 5,
       .ow = 6,
       .kh = 1,
       .kw = 1,
       .sh = 1,
       .sw = 1,
       .dh = 1,
       .dw = 1},
  };
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const kn_cuda_windows *w = &shapes[s];
    const size_t nx = (size_t)w->batch * w->h * w->w * w->c;
    const size_t ncol = (size_t)w->batch * w->oh * w->ow * w->kh * w->kw * w->c;
    float *x = malloc(nx * 4), *cols = malloc(ncol * 4), *want_cols = malloc(ncol * 4);
    float *dcols = malloc(ncol * 4), *dx = malloc(nx * 4), *want_dx = malloc(nx * 4);
    assert_true(x && cols && want_cols && dcols && dx && want_dx);
    fill_uniform(x, nx, 11u + (uint32_t)s);
    fill_uniform(dcols, ncol, 21u + (uint32_t)s);
    void *d[4] = {on_device(x, nx), on_device(NULL, ncol), on_device(dcols, ncol),
                  on_device(NULL, nx)};
    char err[512] = "";
    assert_int_equal(kn_cuda_dev_im2col(w, d[0], d[1], err, sizeof err), 0);
    back_to_host(cols, d[1], ncol);
    ref_im2col(w, x, want_cols);
    assert_same_bits("im2col", cols, want_cols, ncol);
    assert_int_equal(kn_cuda_dev_col2im(w, d[2], d[3], err, sizeof err), 0);
    back_to_host(dx, d[3], nx);
    ref_col2im(w, dcols, want_dx);
    assert_same_bits("col2im", dx, want_dx, nx);
    free_all(d, 4);
    free(x), free(cols), free(want_cols), free(dcols), free(dx), free(want_dx);
  }
}

/* Max and average pooling and their gradients against the CPU's loops,
 * bit for bit: a tiling 2x2, and an overlapping 3x3 stride 2 with padding
 * whose max windows hold ties (the first cell takes dy) and NaN. */
static void pooling_and_its_gradient_match_cpu(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  const kn_cuda_windows shapes[] = {
      {.batch = 3,
       .h = 8,
       .w = 6,
       .c = 7,
       .oh = 4,
       .ow = 3,
       .kh = 2,
       .kw = 2,
       .sh = 2,
       .sw = 2,
       .dh = 1,
       .dw = 1},
      STRIDED_3X3,
  };
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    for (int max = 0; max < 2; max++) {
      kn_cuda_windows w = shapes[s];
      w.max = max;
      const size_t nx = (size_t)w.batch * w.h * w.w * w.c, ny = (size_t)w.batch * w.oh * w.ow * w.c;
      float *x = malloc(nx * 4), *y = malloc(ny * 4), *want_y = malloc(ny * 4);
      float *dy = malloc(ny * 4), *dx = malloc(nx * 4), *want_dx = malloc(nx * 4);
      assert_true(x && y && want_y && dy && dx && want_dx);
      fill_uniform(x, nx, 31u + (uint32_t)s);
      for (size_t i = 0; i < nx; i++) x[i] = roundf(x[i] * 4.0f) / 4.0f; /* ties */
      x[5] = NAN;
      fill_uniform(dy, ny, 41u + (uint32_t)s);
      void *d[4] = {on_device(x, nx), on_device(NULL, ny), on_device(dy, ny), on_device(NULL, nx)};
      char err[512] = "";
      assert_int_equal(kn_cuda_dev_pool(&w, d[0], d[1], err, sizeof err), 0);
      back_to_host(y, d[1], ny);
      ref_pool(&w, x, want_y, NULL, NULL, NULL);
      assert_same_bits(max ? "max pool" : "average pool", y, want_y, ny);
      assert_int_equal(kn_cuda_dev_pool_grad(&w, d[2], d[0], d[1], d[3], err, sizeof err), 0);
      back_to_host(dx, d[3], nx);
      ref_pool(&w, x, NULL, want_y, dy, want_dx);
      assert_same_bits(max ? "max pool's gradient" : "average pool's gradient", dx, want_dx, nx);
      free_all(d, 4);
      free(x), free(y), free(want_y), free(dy), free(dx), free(want_dx);
    }
  }
}

/* The casts of mixed precision, bit for bit as the CPU's: ties to even,
 * NaN kept (quiet), infinities and -0; f16's overflow and subnormals. */
static void casts_match_cpu(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  enum { N = 4099 };
  float *x = malloc(N * 4), *y = malloc(N * 4), *want = malloc(N * 4);
  uint16_t *h = malloc(N * 2), *want_h = malloc(N * 2);
  assert_true(x && y && want && h && want_h);
  fill_uniform(x, N, 51u);
  const float special[] = {
      NAN, -NAN, INFINITY, -INFINITY, -0.0f, 1.00390625f /* a tie */, 1.01171875f, 3.4e38f, 1e-40f};
  memcpy(x, special, sizeof special);
  void *d[3] = {on_device(x, N), on_device(NULL, N), on_device(NULL, N)};
  char err[512] = "";
  assert_int_equal(kn_cuda_dev_cast(d[0], d[1], N, KN_CUDA_CAST_TO_BF16, err, sizeof err), 0);
  assert_int_equal(kn_cuda_copy_out(0, h, d[1], N * 2, err, sizeof err), 0);
  ref_cast(x, want_h, N, KN_CUDA_CAST_TO_BF16);
  assert_memory_equal(h, want_h, N * 2);
  assert_int_equal(kn_cuda_dev_cast(d[1], d[2], N, KN_CUDA_CAST_FROM_BF16, err, sizeof err), 0);
  back_to_host(y, d[2], N);
  ref_cast(want_h, want, N, KN_CUDA_CAST_FROM_BF16);
  assert_same_bits("bf16 to f32", y, want, N);
  assert_int_equal(kn_cuda_dev_cast(d[0], d[2], N, KN_CUDA_CAST_ROUND_BF16, err, sizeof err), 0);
  back_to_host(y, d[2], N);
  assert_same_bits("f32 through bf16", y, want, N);
  /* and through f16: ties, overflow to infinity, subnormals */
  x[9] = 65520.0f;
  x[10] = 3e-6f;
  x[11] = 1.00048828125f; /* a tie */
  assert_int_equal(kn_cuda_copy_in(0, d[0], x, N * 4, err, sizeof err), 0);
  assert_int_equal(kn_cuda_dev_cast(d[0], d[1], N, KN_CUDA_CAST_TO_F16, err, sizeof err), 0);
  assert_int_equal(kn_cuda_copy_out(0, h, d[1], N * 2, err, sizeof err), 0);
  ref_cast(x, want_h, N, KN_CUDA_CAST_TO_F16);
  assert_memory_equal(h, want_h, N * 2);
  assert_int_equal(kn_cuda_dev_cast(d[1], d[2], N, KN_CUDA_CAST_FROM_F16, err, sizeof err), 0);
  back_to_host(y, d[2], N);
  ref_cast(want_h, want, N, KN_CUDA_CAST_FROM_F16);
  assert_same_bits("f16 to f32", y, want, N);
  assert_true(isinf(want[9]));
  assert_int_equal(kn_cuda_dev_cast(d[0], d[2], N, KN_CUDA_CAST_ROUND_F16, err, sizeof err), 0);
  back_to_host(y, d[2], N);
  assert_same_bits("f32 through f16", y, want, N);
  assert_int_equal(kn_cuda_dev_cast(d[0], d[2], N, 7, err, sizeof err), -1);
  assert_non_null(strstr(err, "mode must be 0 to 5"));
  free_all(d, 3);
  free(x), free(y), free(want), free(h), free(want_h);
}

/* GEMMs on tensor cores: with the operands rounded as the math says (to
 * bf16's 8-bit mantissa, f16's and TF32's 11 bits), each element within
 * the rounding of its operands (2^-7 and 2^-9 of the sum of the products'
 * magnitudes: rounding to nearest or not, and the float32 sums), and
 * farther from the exact product than float32 is (so the rounding did
 * happen). */
static void tensor_core_gemms_round_their_operands(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  enum { M = 67, N = 129, K = 515 };
  float *a = malloc(M * K * 4), *b = malloc(K * N * 4), *c = malloc(M * N * 4);
  double *want = malloc(M * N * 8), *scale = malloc(M * N * 8);
  assert_true(a && b && c && want && scale);
  fill_uniform(a, M * K, 61u);
  fill_uniform(b, K * N, 62u);
  void *d[3] = {on_device(a, M * K), on_device(b, K * N), on_device(NULL, M * N)};
  char err[512] = "";
  matmul_reference(a, b, want, scale, M, N, K, 0, 0);
  const struct {
    kn_cuda_math math;
    const char *name;
    double bound;
  } maths[] = {{KN_CUDA_MATH_BF16, "bf16", 1.0 / 128},
               {KN_CUDA_MATH_F16, "f16", 1.0 / 512},
               {KN_CUDA_MATH_TF32, "TF32", 1.0 / 512}};
  for (size_t m = 0; m < sizeof maths / sizeof maths[0]; m++) {
    assert_int_equal(
        kn_cuda_dev_matmul(d[0], d[1], d[2], M, N, K, 0, 0, maths[m].math, err, sizeof err), 0);
    back_to_host(c, d[2], M * N);
    double worst = 0.0;
    for (int i = 0; i < M * N; i++) {
      const double rel = fabs(c[i] - want[i]) / scale[i];
      if (rel > maths[m].bound)
        fail_msg("%s GEMM: c[%d] = %g, expected %g", maths[m].name, i, (double)c[i], want[i]);
      worst = rel > worst ? rel : worst;
    }
    print_message("%s GEMM: worst error %.2g of the products' magnitudes\n", maths[m].name, worst);
    assert_true(worst > 1e-6); /* rounded, not float32 */
  }
  assert_int_equal(kn_cuda_dev_matmul(d[0], d[1], d[2], M, N, K, 0, 0, 5, err, sizeof err), -1);
  assert_non_null(strstr(err, "math must be f32, tf32, bf16 or f16"));
  free_all(d, 3);
  free(a), free(b), free(c), free(want), free(scale);
}

/* Elementwise add, subtract, multiply and divide (by zero and NaN too), bit
 * for bit as the CPU's; a dropout mask draws the CPU's Philox words (the
 * same mask on every device), ones outside training. */
static void binary_ops_and_dropout_masks_match_cpu(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  enum { N = 5003 };
  float *a = malloc(N * 4), *b = malloc(N * 4), *y = malloc(N * 4), *want = malloc(N * 4);
  assert_true(a && b && y && want);
  fill_uniform(a, N, 71u);
  fill_uniform(b, N, 72u);
  b[0] = 0.0f;
  a[1] = NAN;
  void *d[3] = {on_device(a, N), on_device(b, N), on_device(NULL, N)};
  char err[512] = "";
  for (int op = 0; op < 4; op++) {
    assert_int_equal(kn_cuda_dev_binary(d[0], d[1], d[2], N, op, err, sizeof err), 0);
    back_to_host(y, d[2], N);
    for (int i = 0; i < N; i++)
      want[i] = op == 0 ? a[i] + b[i] : op == 1 ? a[i] - b[i] : op == 2 ? a[i] * b[i] : a[i] / b[i];
    assert_same_bits("binary", y, want, N);
  }
  assert_int_equal(kn_cuda_dev_binary(d[0], d[1], d[2], N, 4, err, sizeof err), -1);
  assert_non_null(strstr(err, "op must be 0 to 3"));
  const double rate = 0.3;
  const uint32_t threshold = (uint32_t)ceil(rate * 16777216.0);
  const float keep = (float)(1.0 / (1.0 - rate));
  const uint64_t seed = 0x5eedu, step = 17, first = 12345;
  assert_int_equal(
      kn_cuda_dev_dropout_mask(d[2], N, seed, step, first, threshold, keep, err, sizeof err), 0);
  back_to_host(y, d[2], N);
  int dropped = 0;
  for (int i = 0; i < N; i++) {
    want[i] = (kn_philox_word(seed, step, first + (uint64_t)i) >> 8) >= threshold ? keep : 0.0f;
    dropped += want[i] == 0.0f;
  }
  assert_same_bits("dropout mask", y, want, N);
  assert_true(dropped > N / 5 && dropped < N * 2 / 5); /* about rate of them */
  assert_int_equal(kn_cuda_dev_dropout_mask(d[2], N, seed, step, first, 0, 1.0f, err, sizeof err),
                   0);
  back_to_host(y, d[2], N);
  for (int i = 0; i < N; i++) assert_true(y[i] == 1.0f);
  free_all(d, 3);
  free(a), free(b), free(y), free(want);
}

/* Sums, means and maxes over an axis and their gradients, bit for bit as
 * the CPU's (summed in order in float; a max's NaN and ties: the first
 * maximum takes dy). */
static void reductions_match_cpu(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  const size_t shapes[][3] = {{7, 49, 33}, {1, 1000, 1}, {300, 5, 1}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const size_t outer = shapes[s][0], len = shapes[s][1], inner = shapes[s][2];
    const size_t nx = outer * len * inner, ny = outer * inner;
    float *x = malloc(nx * 4), *y = malloc(ny * 4), *want_y = malloc(ny * 4);
    float *dy = malloc(ny * 4), *dx = malloc(nx * 4), *want_dx = malloc(nx * 4);
    assert_true(x && y && want_y && dy && dx && want_dx);
    fill_uniform(x, nx, 81u + (uint32_t)s);
    for (size_t i = 0; i < nx; i++) x[i] = roundf(x[i] * 8.0f) / 8.0f; /* ties */
    x[2] = NAN;
    fill_uniform(dy, ny, 91u + (uint32_t)s);
    void *d[4] = {on_device(x, nx), on_device(NULL, ny), on_device(dy, ny), on_device(NULL, nx)};
    char err[512] = "";
    for (int kind = 0; kind < 3; kind++) {
      assert_int_equal(kn_cuda_dev_reduce(d[0], d[1], outer, len, inner, kind, err, sizeof err), 0);
      back_to_host(y, d[1], ny);
      ref_reduce(x, want_y, outer, len, inner, kind);
      assert_same_bits("reduce", y, want_y, ny);
      assert_int_equal(
          kn_cuda_dev_reduce_grad(d[2], d[0], d[1], d[3], outer, len, inner, kind, err, sizeof err),
          0);
      back_to_host(dx, d[3], nx);
      ref_reduce_grad(dy, x, want_y, want_dx, outer, len, inner, kind);
      assert_same_bits("reduce's gradient", dx, want_dx, nx);
    }
    assert_int_equal(kn_cuda_dev_reduce(d[0], d[1], outer, len, inner, 3, err, sizeof err), -1);
    assert_non_null(strstr(err, "kind must be 0 to 2"));
    free_all(d, 4);
    free(x), free(y), free(want_y), free(dy), free(dx), free(want_dx);
  }
}

/* The eight activations and their gradients against double-precision
 * formulas: within float rounding (1e-5 relative, 1e-6 absolute near
 * zero), NaN passing; an op beyond them is refused. */
static void activations_match_cpu(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  enum { N = 2053 };
  float *x = malloc(N * 4), *y = malloc(N * 4), *dy = malloc(N * 4), *dx = malloc(N * 4);
  assert_true(x && y && dy && dx);
  fill_uniform(x, N, 111u);
  for (int i = 0; i < N; i++) x[i] *= 12.0f; /* tails of the exponentials too */
  x[0] = 0.0f;
  x[1] = -0.0f;
  x[2] = NAN;
  fill_uniform(dy, N, 112u);
  void *d[4] = {on_device(x, N), on_device(NULL, N), on_device(dy, N), on_device(NULL, N)};
  char err[512] = "";
  for (int op = 0; op < 8; op++) {
    const float alpha = op == 0 ? 0.3f : op == 5 ? -1.5f : 1.0f;
    assert_int_equal(kn_cuda_dev_unary(d[0], d[1], N, op, alpha, err, sizeof err), 0);
    back_to_host(y, d[1], N);
    assert_int_equal(kn_cuda_dev_unary_grad(d[2], d[0], d[1], d[3], N, op, alpha, err, sizeof err),
                     0);
    back_to_host(dx, d[3], N);
    for (int i = 0; i < N; i++) {
      const float want = ref_unary(op, x[i], alpha);
      const float want_dx = ref_unary_grad(op, dy[i], x[i], y[i], alpha);
      if (isnan(want) != isnan(y[i]) || fabsf(y[i] - want) > 1e-5f * fabsf(want) + 1e-6f)
        fail_msg("activation %d: f(%g) = %.9g, expected %.9g", op, (double)x[i], (double)y[i],
                 (double)want);
      if (isnan(want_dx) != isnan(dx[i]) || fabsf(dx[i] - want_dx) > 1e-5f * fabsf(want_dx) + 1e-6f)
        fail_msg("activation %d's gradient at %g: %.9g, expected %.9g", op, (double)x[i],
                 (double)dx[i], (double)want_dx);
    }
  }
  assert_int_equal(kn_cuda_dev_unary(d[0], d[1], N, 8, 1.0f, err, sizeof err), -1);
  assert_non_null(strstr(err, "op must be 0 to 7"));
  free_all(d, 4);
  free(x), free(y), free(dy), free(dx);
}

/* Within rtol of the larger magnitude plus atol (float sums of terms
 * near 1 that cancel to near 0 keep their terms' rounding). */
static void assert_close(const char *what, const float *got, const float *want, size_t n,
                         double rtol, double atol) {
  for (size_t i = 0; i < n; i++) {
    const double tol = rtol * fmax(fabs(got[i]), fabs(want[i])) + atol;
    if (!(fabs((double)got[i] - want[i]) <= tol))
      fail_msg("%s: [%zu] = %.9g, expected %.9g", what, i, (double)got[i], (double)want[i]);
  }
}

/* Depthwise convolution (strided, dilated, padded, two filters per
 * channel) forward and both gradients against the CPU's sums. */
static void depthwise_convolution_matches_cpu(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  const kn_cuda_windows shapes[] = {
      STRIDED_3X3,
      {.batch = 70,
       .h = 6,
       .w = 6,
       .c = 3,
       .oh = 6,
       .ow = 6,
       .kh = 3,
       .kw = 3,
       .sh = 1,
       .sw = 1,
       .dh = 2,
       .dw = 2,
       .pad_top = 2,
       .pad_left = 2},
  };
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const kn_cuda_windows *w = &shapes[s];
    const int M = 2;
    const size_t nx = (size_t)w->batch * w->h * w->w * w->c;
    const size_t ny = (size_t)w->batch * w->oh * w->ow * w->c * M;
    const size_t nk = (size_t)w->kh * w->kw * w->c * M;
    float *x = malloc(nx * 4), *k = malloc(nk * 4), *dy = malloc(ny * 4);
    float *got = malloc((nx > ny ? nx : ny) * 4 + nk * 4),
          *want = malloc((nx > ny ? nx : ny) * 4 + nk * 4);
    assert_true(x && k && dy && got && want);
    fill_uniform(x, nx, 121u);
    fill_uniform(k, nk, 122u);
    fill_uniform(dy, ny, 123u);
    void *d[5] = {on_device(x, nx), on_device(k, nk), on_device(dy, ny), on_device(NULL, ny),
                  on_device(NULL, nx > nk ? nx : nk)};
    char err[512] = "";
    assert_int_equal(kn_cuda_dev_dwconv(w, M, 0, d[0], d[1], d[3], err, sizeof err), 0);
    back_to_host(got, d[3], ny);
    ref_dwconv(w, M, 0, x, k, want);
    assert_close("depthwise convolution", got, want, ny, 1e-5, 2e-6);
    assert_int_equal(kn_cuda_dev_dwconv(w, M, 1, d[2], d[1], d[4], err, sizeof err), 0);
    back_to_host(got, d[4], nx);
    ref_dwconv(w, M, 1, dy, k, want);
    assert_close("its input gradient", got, want, nx, 1e-5, 2e-6);
    assert_int_equal(kn_cuda_dev_dwconv(w, M, 2, d[2], d[0], d[4], err, sizeof err), 0);
    back_to_host(got, d[4], nk);
    ref_dwconv(w, M, 2, dy, x, want);
    assert_close("its weights' gradient", got, want, nk, 1e-5, 2e-6);
    assert_int_equal(kn_cuda_dev_dwconv(w, 0, 0, d[0], d[1], d[3], err, sizeof err), -1);
    assert_non_null(strstr(err, "multiplier > 0"));
    free_all(d, 5);
    free(x), free(k), free(dy), free(got), free(want);
  }
}

/* Batch norm's statistics (training: the moving ones moved; evaluation:
 * from them), its apply and its gradients against the CPU's double sums:
 * channels beyond one block of lanes and rows over several parts, with a
 * mean far from zero (the shifted sums keep its precision). */
static void batch_norm_matches_cpu(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  const size_t shapes[][2] = {{5000, 37}, {3, 70}, {1, 8}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const size_t R = shapes[s][0], C = shapes[s][1], n = R * C;
    float *x = malloc(n * 4), *dy = malloc(n * 4), *y = malloc(n * 4), *want = malloc(n * 4);
    float *gamma = malloc(C * 4), *beta = malloc(C * 4), *mm = malloc(C * 4), *mv = malloc(C * 4);
    float *mm2 = malloc(C * 4), *mv2 = malloc(C * 4), *st = malloc(2 * C * 4);
    float *want_st = malloc(2 * C * 4), *dg = malloc(C * 4), *db = malloc(C * 4);
    float *want_dg = malloc(C * 4), *want_db = malloc(C * 4);
    assert_true(x && dy && y && want && gamma && beta && mm && mv && mm2 && mv2 && st && want_st &&
                dg && db && want_dg && want_db);
    fill_uniform(x, n, 101u + (uint32_t)s);
    for (size_t i = 0; i < n; i++) x[i] = 1000.0f + 3.0f * x[i];
    fill_uniform(dy, n, 102u);
    fill_uniform(gamma, C, 103u);
    fill_uniform(beta, C, 104u);
    fill_uniform(mm, C, 105u);
    for (size_t c = 0; c < C; c++) mv[c] = 1.0f + 0.5f * mm[c];
    void *d[10] = {on_device(x, n),        on_device(dy, n),   on_device(gamma, C),
                   on_device(beta, C),     on_device(mm, C),   on_device(mv, C),
                   on_device(NULL, 2 * C), on_device(NULL, n), on_device(NULL, C),
                   on_device(NULL, C)};
    char err[512] = "";
    for (int training = 1; training >= 0; training--) {
      assert_int_equal(kn_cuda_dev_bn_stats(d[0], d[4], d[5], d[6], R, C, 0.99f, 1e-3f, training,
                                            err, sizeof err),
                       0);
      back_to_host(st, d[6], 2 * C);
      back_to_host(mm2, d[4], C);
      back_to_host(mv2, d[5], C);
      ref_bn_stats(x, mm, mv, want_st, R, C, 0.99f, 1e-3f, training);
      assert_close("batch norm's statistics", st, want_st, 2 * C, 1e-6, 1e-12);
      assert_close("the moving mean", mm2, mm, C, 1e-6, 1e-12);
      assert_close("the moving variance", mv2, mv, C, 1e-6, 1e-12);
    }
    assert_int_equal(kn_cuda_copy_in(0, d[6], want_st, 2 * C * 4, err, sizeof err), 0);
    assert_int_equal(kn_cuda_dev_bn_apply(d[0], d[6], d[2], d[3], d[7], R, C, err, sizeof err), 0);
    back_to_host(y, d[7], n);
    ref_bn_apply(x, want_st, gamma, beta, want, R, C);
    assert_same_bits("batch norm's apply", y, want, n);
    assert_int_equal(
        kn_cuda_dev_bn_grad(d[1], d[0], d[6], d[2], d[7], d[8], d[9], R, C, err, sizeof err), 0);
    back_to_host(y, d[7], n);
    back_to_host(dg, d[8], C);
    back_to_host(db, d[9], C);
    ref_bn_grad(dy, x, want_st, gamma, want, want_dg, want_db, R, C);
    assert_close("gamma's gradient", dg, want_dg, C, 1e-6, 1e-12);
    assert_close("beta's gradient", db, want_db, C, 1e-6, 1e-12);
    /* dx cancels its terms: against the larger of them */
    for (size_t i = 0; i < n; i++)
      if (fabs((double)y[i] - want[i]) > 1e-5 * (fabs(want[i]) + 1e-3))
        fail_msg("batch norm's input gradient: [%zu] = %.9g, expected %.9g", i, (double)y[i],
                 (double)want[i]);
    /* beta's gradient alone: no statistics read */
    assert_int_equal(
        kn_cuda_dev_bn_grad(d[1], d[1], NULL, NULL, NULL, NULL, d[9], R, C, err, sizeof err), 0);
    back_to_host(db, d[9], C);
    assert_close("beta's gradient alone", db, want_db, C, 1e-6, 1e-12);
    free_all(d, 10);
    free(x), free(dy), free(y), free(want), free(gamma), free(beta), free(mm), free(mv);
    free(mm2), free(mv2), free(st), free(want_st), free(dg), free(db), free(want_dg);
    free(want_db);
  }
}

/* The losses on the device: sparse softmax cross-entropy's mean and its
 * gradient (scaled by a seed the fill kernel writes), then the categorical
 * one against target probabilities and the binary one on logits, against
 * the CPU's formulas, with logits far from zero (the max-shift keeps exp
 * finite). */
static void the_loss_matches_cpu(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  enum { ROWS = 301, COLS = 13 };
  float x[ROWS * COLS], dx[ROWS * COLS], want[ROWS * COLS], loss = 0.0f, seed = 0.0f;
  int32_t labels[ROWS];
  fill_uniform(x, ROWS * COLS, 141u);
  for (int i = 0; i < ROWS * COLS; i++) x[i] = 40.0f * x[i] + (i % COLS == 3 ? 90.0f : 0.0f);
  for (int r = 0; r < ROWS; r++) labels[r] = (r * 7) % COLS;
  float *dxv = on_device(x, ROWS * COLS), *ddx = on_device(NULL, ROWS * COLS);
  float *dloss = on_device(NULL, 1), *dseed = on_device(NULL, 1);
  int32_t *dl = (int32_t *)on_device(NULL, ROWS);
  char err[512] = "";
  assert_int_equal(kn_cuda_copy_in(0, dl, labels, sizeof labels, err, sizeof err), 0);
  assert_int_equal(kn_cuda_dev_fill(dseed, 1, 0.5f, err, sizeof err), 0);
  back_to_host(&seed, dseed, 1);
  assert_true(seed == 0.5f);
  assert_int_equal(kn_cuda_dev_softmax_xent(dxv, dl, dloss, ROWS, COLS, err, sizeof err), 0);
  back_to_host(&loss, dloss, 1);
  const float want_loss = ref_softmax_xent(x, labels, ROWS, COLS);
  if (fabsf(loss - want_loss) > 1e-6f * fabsf(want_loss))
    fail_msg("softmax_xent: %.9g, expected %.9g", (double)loss, (double)want_loss);
  assert_int_equal(kn_cuda_dev_softmax_xent_grad(dxv, dl, dseed, ddx, ROWS, COLS, err, sizeof err),
                   0);
  back_to_host(dx, ddx, ROWS * COLS);
  ref_softmax_xent_grad(x, labels, 0.5f, want, ROWS, COLS);
  for (int i = 0; i < ROWS * COLS; i++)
    if (fabsf(dx[i] - want[i]) > 1e-5f * fabsf(want[i]) + 1e-9f)
      fail_msg("softmax_xent_grad: [%d] = %.9g, expected %.9g", i, (double)dx[i], (double)want[i]);
  assert_int_equal(kn_cuda_dev_softmax_xent(dxv, dl, dloss, 0, COLS, err, sizeof err), -1);
  assert_non_null(strstr(err, "needs rows and classes"));
  /* against dense target probabilities, and binary on the logits (the
   * targets: each row's label one-hot, halved) */
  float p[ROWS * COLS];
  for (int i = 0; i < ROWS * COLS; i++) p[i] = i % COLS == labels[i / COLS] ? 0.5f : 0.0f;
  float *dp = on_device(p, ROWS * COLS);
  assert_int_equal(kn_cuda_dev_xent_dense(dxv, dp, dloss, ROWS, COLS, err, sizeof err), 0);
  back_to_host(&loss, dloss, 1);
  const float want_dense = ref_xent_dense(x, p, ROWS, COLS);
  if (fabsf(loss - want_dense) > 1e-6f * fabsf(want_dense))
    fail_msg("xent_dense: %.9g, expected %.9g", (double)loss, (double)want_dense);
  assert_int_equal(kn_cuda_dev_xent_dense_grad(dxv, dp, dseed, ddx, ROWS, COLS, err, sizeof err),
                   0);
  back_to_host(dx, ddx, ROWS * COLS);
  ref_xent_dense_grad(x, p, 0.5f, want, ROWS, COLS);
  for (int i = 0; i < ROWS * COLS; i++)
    if (fabsf(dx[i] - want[i]) > 1e-5f * fabsf(want[i]) + 1e-9f)
      fail_msg("xent_dense_grad: [%d] = %.9g, expected %.9g", i, (double)dx[i], (double)want[i]);
  assert_int_equal(kn_cuda_dev_bce_logits(dxv, dp, dloss, ROWS * COLS, err, sizeof err), 0);
  back_to_host(&loss, dloss, 1);
  const float want_bce = ref_bce_logits(x, p, ROWS * COLS);
  if (fabsf(loss - want_bce) > 1e-6f * fabsf(want_bce))
    fail_msg("bce_logits: %.9g, expected %.9g", (double)loss, (double)want_bce);
  assert_int_equal(kn_cuda_dev_bce_logits_grad(dxv, dp, dseed, ddx, ROWS * COLS, err, sizeof err),
                   0);
  back_to_host(dx, ddx, ROWS * COLS);
  ref_bce_logits_grad(x, p, 0.5f, want, ROWS * COLS);
  for (int i = 0; i < ROWS * COLS; i++)
    if (fabsf(dx[i] - want[i]) > 1e-5f * fabsf(want[i]) + 1e-9f)
      fail_msg("bce_logits_grad: [%d] = %.9g, expected %.9g", i, (double)dx[i], (double)want[i]);
  assert_int_equal(kn_cuda_dev_bce_logits(dxv, dp, dloss, 0, err, sizeof err), -1);
  assert_non_null(strstr(err, "needs values"));
  kn_cuda_free(0, dp);
  kn_cuda_free(0, dxv);
  kn_cuda_free(0, ddx);
  kn_cuda_free(0, dloss);
  kn_cuda_free(0, dseed);
  kn_cuda_free(0, dl);
}

/* Rows copied between pitches (concatenation and slicing), and a row
 * longer than its pitch refused. */
static void rows_copy_between_pitches(void **state) {
  (void)state;
  REQUIRE_DEVICE();
  enum { ROWS = 37, SRC = 19, DST = 29, LEN = 11, AT = 5 };
  float src[ROWS * SRC], dst[ROWS * DST];
  fill_uniform(src, ROWS * SRC, 131u);
  for (int i = 0; i < ROWS * DST; i++) dst[i] = -7.0f;
  float *ds = on_device(src, ROWS * SRC), *dd = on_device(dst, ROWS * DST);
  char err[512] = "";
  assert_int_equal(kn_cuda_dev_copy_rows(dd + AT, DST, ds + 3, SRC, ROWS, LEN, err, sizeof err), 0);
  back_to_host(dst, dd, ROWS * DST);
  for (int r = 0; r < ROWS; r++)
    for (int c = 0; c < DST; c++) {
      const float want = c >= AT && c < AT + LEN ? src[r * SRC + 3 + c - AT] : -7.0f;
      if (dst[r * DST + c] != want)
        fail_msg("copy_rows: [%d][%d] = %g, expected %g", r, c, (double)dst[r * DST + c],
                 (double)want);
    }
  assert_int_equal(kn_cuda_dev_copy_rows(dd, 4, ds, SRC, ROWS, 5, err, sizeof err), -1);
  assert_non_null(strstr(err, "in pitches of"));
  kn_cuda_free(0, ds);
  kn_cuda_free(0, dd);
}

int main(void) {
  char err[512] = "";
  if (kn_cuda_device_count(&device_count, err, sizeof err) != 0) {
    printf("kn_cuda_device_count failed: %s\n", err);
    device_count = 0;
  }
  if (device_count == 0) printf("no CUDA device present: skipping GPU tests\n");

  const struct CMUnitTest tests[] = {
      cmocka_unit_test(device_count_succeeds_without_error),
      cmocka_unit_test(matmul_rejects_negative_sizes_with_a_message),
      cmocka_unit_test(device_name_of_a_missing_device_fails_with_a_message),
      cmocka_unit_test(matmul_without_a_device_fails_with_a_message),
      cmocka_unit_test(device_name_names_device_zero),
      cmocka_unit_test(matmul_matches_cpu_on_odd_sizes),
      cmocka_unit_test(matmul_with_a_transposed_matches_cpu),
      cmocka_unit_test(matmul_with_b_transposed_matches_cpu),
      cmocka_unit_test(matmul_with_both_transposed_matches_cpu),
      cmocka_unit_test(matmul_matches_cpu_on_thin_and_larger_shapes),
      cmocka_unit_test(matmul_with_k_zero_writes_zeros),
      cmocka_unit_test(relu_matches_cpu),
      cmocka_unit_test(relu_works_in_place),
      cmocka_unit_test(relu_grad_passes_dy_where_y_is_nan),
      cmocka_unit_test(bias_add_and_reduce_rows_match_cpu),
      cmocka_unit_test(im2col_and_col2im_match_cpu),
      cmocka_unit_test(pooling_and_its_gradient_match_cpu),
      cmocka_unit_test(casts_match_cpu),
      cmocka_unit_test(tensor_core_gemms_round_their_operands),
      cmocka_unit_test(binary_ops_and_dropout_masks_match_cpu),
      cmocka_unit_test(reductions_match_cpu),
      cmocka_unit_test(activations_match_cpu),
      cmocka_unit_test(batch_norm_matches_cpu),
      cmocka_unit_test(depthwise_convolution_matches_cpu),
      cmocka_unit_test(rows_copy_between_pitches),
      cmocka_unit_test(the_loss_matches_cpu),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
