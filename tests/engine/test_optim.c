/* Optimizer updates against the rules written out by hand (PyTorch's
 * torch.optim.SGD and Adam), step by step. */
#include <math.h>
#include <stdlib.h>
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

static void sgd_weight_decay_adds_l2_to_the_gradient(void **state) {
  (void)state;
  kn_optimizer_config cfg = {
      .type = KN_OPT_SGD, .learning_rate = 0.1f, .momentum = 0.5f, .weight_decay = 0.01f};
  float p[N] = {1, 2, 3, 4, 5};
  double ref[N] = {1, 2, 3, 4, 5}, buf[N] = {0};
  run_steps(&cfg, p);
  for (int s = 0; s < 3; s++) {
    for (int i = 0; i < N; i++) {
      double g = grads_by_step[s][i] + 0.01 * ref[i];
      buf[i] = s == 0 ? g : 0.5 * buf[i] + g;
      ref[i] -= 0.1 * buf[i];
    }
  }
  for (int i = 0; i < N; i++) assert_float_equal(p[i], ref[i], 1e-5);
}

/* Adam with L2 (weight_decay into the gradient) and AdamW (decoupled
 * shrink before the step) move differently; both as torch writes them. */
static void adamw_decouples_weight_decay_and_adam_couples_it(void **state) {
  (void)state;
  for (int decoupled = 0; decoupled <= 1; decoupled++) {
    kn_optimizer_config cfg = {.type = decoupled ? KN_OPT_ADAMW : KN_OPT_ADAM,
                               .learning_rate = 0.01f,
                               .beta1 = 0.9f,
                               .beta2 = 0.999f,
                               .epsilon = 1e-8f,
                               .weight_decay = 0.1f};
    float p[N] = {1, 2, 3, 4, 5};
    double ref[N] = {1, 2, 3, 4, 5}, m[N] = {0}, v[N] = {0};
    run_steps(&cfg, p);
    for (int s = 0; s < 3; s++) {
      int t = s + 1;
      for (int i = 0; i < N; i++) {
        double g = grads_by_step[s][i];
        if (decoupled) {
          ref[i] *= 1 - 0.01 * 0.1;
        } else {
          g += 0.1 * ref[i];
        }
        m[i] = 0.9 * m[i] + 0.1 * g;
        v[i] = 0.999 * v[i] + 0.001 * g * g;
        double mhat = m[i] / (1 - pow(0.9, t)), vhat = v[i] / (1 - pow(0.999, t));
        ref[i] -= 0.01 * mhat / (sqrt(vhat) + 1e-8);
      }
    }
    for (int i = 0; i < N; i++) assert_float_equal(p[i], ref[i], 1e-5);
  }
}

static void rmsprop_follows_torch_with_and_without_momentum(void **state) {
  (void)state;
  for (int with_momentum = 0; with_momentum <= 1; with_momentum++) {
    double mu = with_momentum ? 0.9 : 0.0;
    kn_optimizer_config cfg = {.type = KN_OPT_RMSPROP,
                               .learning_rate = 0.01f,
                               .rho = 0.9f,
                               .epsilon = 1e-7f,
                               .momentum = (float)mu};
    float p[N] = {1, 2, 3, 4, 5};
    double ref[N] = {1, 2, 3, 4, 5}, v[N] = {0}, buf[N] = {0};
    run_steps(&cfg, p);
    for (int s = 0; s < 3; s++) {
      for (int i = 0; i < N; i++) {
        double g = grads_by_step[s][i];
        v[i] = 0.9 * v[i] + 0.1 * g * g;
        double step = g / (sqrt(v[i]) + 1e-7);
        buf[i] = mu * buf[i] + step;
        ref[i] -= 0.01 * (with_momentum ? buf[i] : step);
      }
    }
    for (int i = 0; i < N; i++) assert_float_equal(p[i], ref[i], 1e-5);
  }
}

static void adagrad_accumulates_squares_from_its_initial_value(void **state) {
  (void)state;
  kn_optimizer_config cfg = {.type = KN_OPT_ADAGRAD,
                             .learning_rate = 0.1f,
                             .epsilon = 1e-10f,
                             .initial_accumulator_value = 0.1f};
  float p[N] = {1, 2, 3, 4, 5};
  double ref[N] = {1, 2, 3, 4, 5}, sum[N] = {0.1, 0.1, 0.1, 0.1, 0.1};
  run_steps(&cfg, p);
  for (int s = 0; s < 3; s++) {
    for (int i = 0; i < N; i++) {
      double g = grads_by_step[s][i];
      sum[i] += g * g;
      ref[i] -= 0.1 * g / (sqrt(sum[i]) + 1e-10);
    }
  }
  for (int i = 0; i < N; i++) assert_float_equal(p[i], ref[i], 1e-5);
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
  assert_string_equal(err, "adam: learning_rate must be > 0, got 0");
  kn_optimizer_config rms = {
      .type = KN_OPT_RMSPROP, .learning_rate = 0.1f, .rho = 1.5f, .epsilon = 1e-8f};
  assert_int_equal(kn_optimizer_new(&rms, N, &opt, err, sizeof err), KN_EINVAL);
  assert_string_equal(err, "rmsprop: rho must be in [0, 1), got 1.5");
  kn_optimizer_config wd = {
      .type = KN_OPT_ADAGRAD, .learning_rate = 0.1f, .epsilon = 1e-8f, .weight_decay = -1.0f};
  assert_int_equal(kn_optimizer_new(&wd, N, &opt, err, sizeof err), KN_EINVAL);
  assert_string_equal(err, "adagrad: weight_decay must be >= 0, got -1");
  kn_optimizer_config nest = {.type = KN_OPT_SGD, .learning_rate = 0.1f, .nesterov = 1};
  assert_int_equal(kn_optimizer_new(&nest, N, &opt, err, sizeof err), KN_EINVAL);
  assert_string_equal(err, "sgd: nesterov needs momentum > 0, got 0");
}

/* The update split over a graph's threads gives the bits of one thread,
 * for every optimizer, over several of the pool's blocks and a tail. */
static void every_optimizer_gives_the_same_bits_on_threads(void **state) {
  (void)state;
  enum { BIG = 70001 };
  kn_graph *g = kn_graph_new();
  kn_graph_set_threads(g, 3);
  kn_node w = kn_param(g, "w", 1, (int[]){4}, KN_INIT_ZEROS);
  kn_graph_keep(g, kn_relu(g, w));
  char err[256] = "";
  assert_int_equal(kn_graph_compile(g, 1, NULL, err, sizeof err), KN_OK);
  const kn_optimizer_config cfgs[] = {
      {.type = KN_OPT_SGD, .learning_rate = 0.1f, .momentum = 0.9f, .nesterov = 1},
      {.type = KN_OPT_SGD, .learning_rate = 0.1f, .weight_decay = 0.01f},
      {.type = KN_OPT_ADAM,
       .learning_rate = 1e-3f,
       .beta1 = 0.9f,
       .beta2 = 0.999f,
       .epsilon = 1e-7f,
       .weight_decay = 0.01f},
      {.type = KN_OPT_ADAMW,
       .learning_rate = 1e-3f,
       .beta1 = 0.9f,
       .beta2 = 0.999f,
       .epsilon = 1e-7f,
       .weight_decay = 0.01f},
      {.type = KN_OPT_RMSPROP,
       .learning_rate = 1e-3f,
       .rho = 0.9f,
       .epsilon = 1e-7f,
       .momentum = 0.5f},
      {.type = KN_OPT_ADAGRAD,
       .learning_rate = 0.01f,
       .epsilon = 1e-7f,
       .initial_accumulator_value = 0.1f},
  };
  float *p1 = malloc(BIG * sizeof(float)), *p3 = malloc(BIG * sizeof(float));
  float *grad = malloc(BIG * sizeof(float));
  assert_true(p1 && p3 && grad);
  for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
    kn_optimizer *one, *three;
    assert_int_equal(kn_optimizer_new(&cfgs[c], BIG, &one, err, sizeof err), KN_OK);
    assert_int_equal(kn_optimizer_new(&cfgs[c], BIG, &three, err, sizeof err), KN_OK);
    for (int i = 0; i < BIG; i++) p1[i] = p3[i] = sinf((float)i * 0.37f);
    for (int s = 0; s < 3; s++) {
      for (int i = 0; i < BIG; i++) grad[i] = cosf((float)(i + s) * 1.3f) * (float)(1 + s);
      kn_optimizer_step(one, p1, grad);
      kn_optimizer_step_on(three, g, p3, grad);
    }
    assert_memory_equal(p1, p3, BIG * sizeof(float));
    kn_optimizer_free(one);
    kn_optimizer_free(three);
  }
  free(p1);
  free(p3);
  free(grad);
  kn_graph_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sgd_momentum_and_nesterov_follow_torch),
      cmocka_unit_test(adam_follows_torch_with_bias_correction),
      cmocka_unit_test(adam_first_step_moves_by_learning_rate),
      cmocka_unit_test(sgd_weight_decay_adds_l2_to_the_gradient),
      cmocka_unit_test(adamw_decouples_weight_decay_and_adam_couples_it),
      cmocka_unit_test(rmsprop_follows_torch_with_and_without_momentum),
      cmocka_unit_test(adagrad_accumulates_squares_from_its_initial_value),
      cmocka_unit_test(bad_hyperparameters_are_refused_with_the_value),
      cmocka_unit_test(every_optimizer_gives_the_same_bits_on_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
