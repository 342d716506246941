/* fuzz_images.c — the image folder reader (kn_dataset_load_images): the
 * input is one image file (PNG or JPEG by its first bytes) in class
 * folder a, and again in class b; decoded and resized to 8x8, gray or RGB
 * by the input's length. */
#include "fuzz.h"

#include <string.h>
#include <sys/stat.h>

#include "engine.h"

static char dir[64];

static void cleanup(void) {
  const char *names[] = {"a/img", "b/img", "a", "b", ""};
  for (int i = 0; i < 5; i++) {
    char path[96];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    remove(path);
  }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%.40s/kiln-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    abort();
  }
  char sub[96];
  snprintf(sub, sizeof sub, "%s/a", dir);
  mkdir(sub, 0700);
  snprintf(sub, sizeof sub, "%s/b", dir);
  mkdir(sub, 0700);
  atexit(cleanup);
  return 0;
}

static void put(const char *cls, const uint8_t *data, size_t size) {
  char path[96];
  snprintf(path, sizeof path, "%s/%s/img", dir, cls);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
    perror(path);
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  put("a", data, size);
  put("b", data, size);
  kn_dataset ds;
  char err[512];
  const int channels = size % 2 ? 3 : 1;
  const int rc = kn_dataset_load_images(dir, 8, 8, channels, &ds, err, sizeof err);
  FUZZ_CHECK(rc != KN_ENOMEM, "%zu input bytes ran the reader out of memory: %s", size, err);
  if (rc == KN_OK) {
    FUZZ_CHECK(ds.n == 2 && ds.n_classes == 2, "%lld images of %d classes", (long long)ds.n,
               ds.n_classes);
    for (size_t i = 0; i < (size_t)ds.n * ds.example_size; i++)
      FUZZ_CHECK(ds.x[i] >= 0 && ds.x[i] <= 255, "pixel %zu is %g", i, ds.x[i]);
    kn_dataset_free(&ds);
  } else {
    FUZZ_CHECK(err[0], "a refused image says why");
  }
  return 0;
}
