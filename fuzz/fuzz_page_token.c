/* fuzz_page_token.c — list page tokens (api_page_token_decode): any text
 * is a position >= 1 or refused; a position re-encodes to a token that
 * decodes to it again. */
#include "fuzz.h"

#include "api.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *token = fuzz_cstr(data, size);
  int64_t position = 0, again = 0;
  if (api_page_token_decode(token, &position) == 0) {
    FUZZ_CHECK(position >= 1, "a decoded position is >= 1, got %lld", (long long)position);
    char out[API_PAGE_TOKEN_LEN];
    api_page_token_encode(position, out);
    FUZZ_CHECK(api_page_token_decode(out, &again) == 0 && again == position,
               "position %lld re-encodes as '%s', which decodes to %lld", (long long)position, out,
               (long long)again);
  }
  free(token);
  return 0;
}
