/* Optimizer updates against the rules written out by hand (PyTorch's
 * torch.optim.SGD and Adam), step by step. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"

#define N 5

static const float grads_by_step[3][N] = {
    {0.5f, -1.0f, 2.0f, 0.0f, -0.25f},
    {0.1f, 0.2f, -0.3f, 0.4f, 1.5f},
    {-2.0f, 0.0f, 0.7f, -0.1f, 0.05f},
};

static void run_steps(const kn_optimizer_config *cfg, float *p) {
  kn_optimizer *opt;
  char err[256];
  assert_int_equal(kn_optimizer_new(cfg, N, &opt, err, sizeof err), KN_OK);
  for (int s = 0; s < 3; s++) kn_optimizer_step(opt, p, grads_by_step[s]);
  assert_int_equal(kn_optimizer_iterations(opt), 3);
  kn_optimizer_free(opt);
}

static void sgd_momentum_and_nesterov_follow_torch(void **state) {
  (void)state;
  for (int nesterov = 0; nesterov <= 1; nesterov++) {
    for (int with_momentum = 0; with_momentum <= 1; with_momentum++) {
      if (nesterov && !with_momentum) continue;
      kn_optimizer_config cfg = {.type = KN_OPT_SGD,
                                 .learning_rate = 0.1f,
                                 .momentum = with_momentum ? 0.9f : 0.0f,
                                 .nesterov = nesterov};
      float p[N] = {1, 2, 3, 4, 5};
      double ref[N] = {1, 2, 3, 4, 5}, buf[N] = {0};
      run_steps(&cfg, p);
      for (int s = 0; s < 3; s++) {
        for (int i = 0; i < N; i++) {
          double g = grads_by_step[s][i];
          double d = g;
          if (cfg.momentum > 0) {
            buf[i] = s == 0 ? g : 0.9 * buf[i] + g;
            d = nesterov ? g + 0.9 * buf[i] : buf[i];
          }
          ref[i] -= 0.1 * d;
        }
      }
      for (int i = 0; i < N; i++) assert_float_equal(p[i], ref[i], 1e-5);
    }
  }
}

static void adam_follows_torch_with_bias_correction(void **state) {
  (void)state;
  kn_optimizer_config cfg = {.type = KN_OPT_ADAM,
                             .learning_rate = 0.01f,
                             .beta1 = 0.9f,
                             .beta2 = 0.999f,
                             .epsilon = 1e-7f};
  float p[N] = {1, 2, 3, 4, 5};
  double ref[N] = {1, 2, 3, 4, 5}, m[N] = {0}, v[N] = {0};
  run_steps(&cfg, p);
  for (int s = 0; s < 3; s++) {
    int t = s + 1;
    for (int i = 0; i < N; i++) {
      double g = grads_by_step[s][i];
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      double mhat = m[i] / (1 - pow(0.9, t)), vhat = v[i] / (1 - pow(0.999, t));
      ref[i] -= 0.01 * mhat / (sqrt(vhat) + 1e-7);
    }
  }
  for (int i = 0; i < N; i++) assert_float_equal(p[i], ref[i], 1e-5);
}

/* Adam's first step moves each parameter by about lr against its gradient's
 * sign, whatever the gradient's size; a zero gradient moves nothing. */
static void adam_first_step_moves_by_learning_rate(void **state) {
  (void)state;
  kn_optimizer_config cfg = {.type = KN_OPT_ADAM,
                             .learning_rate = 0.01f,
                             .beta1 = 0.9f,
                             .beta2 = 0.999f,
                             .epsilon = 1e-7f};
  kn_optimizer *opt;
  char err[256];
  assert_int_equal(kn_optimizer_new(&cfg, N, &opt, err, sizeof err), KN_OK);
  float p[N] = {0, 0, 0, 0, 0};
  kn_optimizer_step(opt, p, grads_by_step[0]);
  const float expect[N] = {-0.01f, 0.01f, -0.01f, 0.0f, 0.01f};
  for (int i = 0; i < N; i++) assert_float_equal(p[i], expect[i], 1e-6);
  kn_optimizer_free(opt);
}

static void bad_hyperparameters_are_refused_with_the_value(void **state) {
  (void)state;
  kn_optimizer *opt = NULL;
  char err[256];
  kn_optimizer_config sgd = {.type = KN_OPT_SGD, .learning_rate = 0.1f, .momentum = 1.0f};
  assert_int_equal(kn_optimizer_new(&sgd, N, &opt, err, sizeof err), KN_EINVAL);
  assert_string_equal(err, "sgd: momentum must be in [0, 1), got 1");
  assert_null(opt);
  kn_optimizer_config zero_lr = {
      .type = KN_OPT_ADAM, .beta1 = .9f, .beta2 = .999f, .epsilon = 1e-7f};
  assert_int_equal(kn_optimizer_new(&zero_lr, N, &opt, err, sizeof err), KN_EINVAL);
  assert_string_equal(err, "optimizer: learning_rate must be > 0, got 0");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sgd_momentum_and_nesterov_follow_torch),
      cmocka_unit_test(adam_follows_torch_with_bias_correction),
      cmocka_unit_test(adam_first_step_moves_by_learning_rate),
      cmocka_unit_test(bad_hyperparameters_are_refused_with_the_value),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
