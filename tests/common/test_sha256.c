/* test_sha256.c — api_sha256_hex against the FIPS 180-4 / NIST vectors,
 * including lengths that put the padding in one block or spill to two. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common.h"

static void digest_matches_the_nist_vectors(void **state) {
  (void)state;
  char hex[65];
  kc_sha256_hex_of("", 0, hex);
  assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  kc_sha256_hex_of("abc", 3, hex);
  assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  /* 56 bytes: the length no longer fits the first block. */
  const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  kc_sha256_hex_of(two, strlen(two), hex);
  assert_string_equal(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  /* 1,000 'a's: many whole blocks and a tail. Known digest of "a" x 1000. */
  char *many = malloc(1000);
  memset(many, 'a', 1000);
  kc_sha256_hex_of(many, 1000, hex);
  free(many);
  assert_string_equal(hex, "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(digest_matches_the_nist_vectors)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
