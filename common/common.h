/* common.h — the few building blocks every kiln module may use (the one
 * exception to DESIGN.md's arrows: it depends on libc alone). Today: SHA-256,
 * for checkpoint digests (engine) and bearer-token hashes (server), and
 * escaping text for log lines, and resource ids.
 * Prefix kc_. */
#ifndef KILN_COMMON_H
#define KILN_COMMON_H

#include <stddef.h>
#include <stdint.h>

/* SHA-256 (FIPS 180-4), incremental so a file is hashed while written. */
typedef struct kc_sha256 {
  uint32_t state[8];
  uint64_t length;
  uint8_t block[64];
  size_t used;
} kc_sha256;
void kc_sha256_init(kc_sha256 *h);
void kc_sha256_update(kc_sha256 *h, const void *data, size_t len);
void kc_sha256_final(kc_sha256 *h, uint8_t digest[32]);
void kc_sha256_hex(const uint8_t digest[32], char hex[65]);
/* SHA-256 of len bytes as 64 lowercase hex digits, in one call. */
void kc_sha256_hex_of(const void *data, size_t len, char hex[65]);

/* Copies in to out (NUL-terminated, cut at a whole escape to fit outlen)
 * with every control character escaped (\n, \r, \t, \xHH), so one log
 * event stays one line whatever a user or a trainer put in it; with quotes,
 * '"' and '\\' too, for a value inside msg="...". Returns the length. */
size_t kc_log_escape(char *out, size_t outlen, const char *in, int quotes);

/* A new resource id (jobs, experiments): "20260101-" and 16 random hex
 * digits, so ids sort roughly by creation. 0, or -1 when no randomness. */
int kc_new_id(char out[40]);

#endif
