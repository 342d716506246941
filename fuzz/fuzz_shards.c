/* fuzz_shards.c — the WebDataset-style tar shard reader (raw or gzip'd):
 * any bytes are samples or a data error that says why, and every part of
 * a sample stays inside that sample. */
#include "fuzz.h"

#include "engine_data.h"

static fuzz_file shard;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_file_set(&shard, "shard", data, size);
  char err[1024] = "";
  kn_tar *t = NULL;
  if (kn_tar_open(shard.path, &t, err, sizeof err) != 0) {
    FUZZ_CHECK(err[0], "a refused shard says why");
    return 0;
  }
  const uint8_t *sample;
  size_t len;
  int rc;
  int64_t samples = 0;
  static const char *const exts[] = {"png", "jpg", "jpeg", "cls", "txt"};
  while ((rc = kn_tar_next(t, &sample, &len, err, sizeof err)) == 1) {
    samples++;
    for (size_t i = 0; i < sizeof exts / sizeof exts[0]; i++) {
      const uint8_t *part;
      size_t part_len;
      if (kn_tar_sample_part(sample, len, exts[i], &part, &part_len) == 0)
        FUZZ_CHECK(part_len == 0 || (part >= sample && part + part_len <= sample + len),
                   "part .%s lies outside its sample", exts[i]);
    }
  }
  FUZZ_CHECK(rc == 0 || err[0], "a damaged shard says why");
  FUZZ_CHECK(kn_tar_index(t) >= samples, "samples counted %lld, read %lld",
             (long long)kn_tar_index(t), (long long)samples);
  kn_tar_close(t);
  return 0;
}
