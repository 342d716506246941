/* fuzz_train_state.c — the training-state loader (kn_train_state_read)
 * for an Adam optimizer over 5 parameters: any file loads or is refused
 * with a reason, and a refused file leaves the optimizer as it was. With
 * KILN_FUZZ_WRITE_SEED=FILE set, first writes a valid state file there. */
#include "fuzz.h"

#include <string.h>

#include "engine.h"
#include "train_state.h"

#define N_PARAMS 5

static kn_optimizer *opt;
static fuzz_file file;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  kn_optimizer_config oc = {.type = KN_OPT_ADAM,
                            .learning_rate = 0.01f,
                            .beta1 = 0.9f,
                            .beta2 = 0.999f,
                            .epsilon = 1e-7f};
  char err[256];
  if (kn_optimizer_new(&oc, N_PARAMS, &opt, err, sizeof err) != KN_OK) {
    fprintf(stderr, "fuzz_train_state: %s\n", err);
    abort();
  }
  const char *seed = getenv("KILN_FUZZ_WRITE_SEED");
  if (seed) {
    kn_train_state st = {.step = 12, .train_runs = 12, .loss_scale = 32768};
    st.pipeline.epoch = 1;
    st.pipeline.batch = 2;
    if (kn_train_state_write(seed, &st, opt, err, sizeof err) != KN_OK) {
      fprintf(stderr, "fuzz_train_state: %s\n", err);
      abort();
    }
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_file_set(&file, "state", data, size);
  kn_optimizer_type type;
  size_t n;
  float *m, *v;
  int64_t *iterations;
  kn_optimizer_moments(opt, &type, &n, &m, &v, &iterations);
  float m_before[N_PARAMS], v_before[N_PARAMS];
  memcpy(m_before, m, sizeof m_before);
  memcpy(v_before, v, sizeof v_before);
  const int64_t it_before = *iterations;
  kn_train_state st;
  memset(&st, 0, sizeof st);
  char err[512] = "";
  const int rc = kn_train_state_read(file.path, &st, opt, err, sizeof err);
  FUZZ_CHECK(rc != KN_ENOMEM, "%zu input bytes ran the loader out of memory: %s", size, err);
  if (rc != KN_OK) {
    FUZZ_CHECK(err[0], "a refused state file says why");
    FUZZ_CHECK(memcmp(m_before, m, sizeof m_before) == 0 &&
                   memcmp(v_before, v, sizeof v_before) == 0 && *iterations == it_before,
               "a refused state file changed the optimizer: %s", err);
  }
  return 0;
}
