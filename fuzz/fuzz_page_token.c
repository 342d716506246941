/* fuzz_page_token.c — list page tokens (api_page_token_decode): the input
 * is the list's query, a newline, then the token (no newline: an empty
 * query). Any text is a position >= 1 or refused; a position re-encodes
 * to a token that decodes to it again for the same query. */
#include "fuzz.h"

#include <string.h>

#include "api.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_cstr(data, size), *token = text;
  const char *query = "";
  char *nl = strchr(text, '\n');
  if (nl) {
    *nl = '\0';
    query = text;
    token = nl + 1;
  }
  int64_t position = 0, again = 0;
  if (api_page_token_decode(token, query, &position) == 0) {
    FUZZ_CHECK(position >= 1, "a decoded position is >= 1, got %lld", (long long)position);
    char out[API_PAGE_TOKEN_LEN];
    api_page_token_encode(position, query, out);
    FUZZ_CHECK(api_page_token_decode(out, query, &again) == 0 && again == position,
               "position %lld re-encodes as '%s', which decodes to %lld", (long long)position, out,
               (long long)again);
  }
  free(text);
  return 0;
}
