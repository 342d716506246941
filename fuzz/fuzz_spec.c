/* fuzz_spec.c — the job spec parser (api_spec_parse): any bytes give a
 * spec or a 400, never a crash; an accepted spec's canonical JSON parses
 * back to the same struct. */
#include "fuzz.h"

#include <string.h>

#include "api.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  api_job_spec spec, again;
  api_error err;
  if (api_spec_parse((const char *)data, size, &spec, &err) != 0) {
    FUZZ_CHECK(err.http == 400, "a refused spec answers 400, got %d", err.http);
    return 0;
  }
  char *canonical = api_spec_to_json(&spec);
  FUZZ_CHECK(canonical != NULL, "an accepted spec has a canonical form");
  int rc = api_spec_parse(canonical, strlen(canonical), &again, &err);
  FUZZ_CHECK(rc == 0, "the canonical form parses back: %s\n%s", err.message, canonical);
  FUZZ_CHECK(memcmp(&spec, &again, sizeof spec) == 0,
             "the canonical form maps to the same spec:\n%s", canonical);
  free(canonical);
  return 0;
}
