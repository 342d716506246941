/* harness.h — what the integration suites share: a curl body collector and
 * starting a real kilnd on a free loopback port. */
#ifndef KILN_TESTS_HARNESS_H
#define KILN_TESTS_HARNESS_H

#include <stddef.h>
#include <sys/types.h>

typedef struct it_buffer {
  char *data; /* NUL-terminated, malloc'd */
  size_t len;
} it_buffer;

/* CURLOPT_WRITEFUNCTION collecting the body into the it_buffer at user. */
size_t it_on_body(char *ptr, size_t size, size_t n, void *user);

/* Starts kilnd_path on data_dir (port 0, stderr appended to
 * data_dir/kilnd.log) with --trainer trainer and an optional extra flag and
 * value, and waits until it serves. Then base_url is "http://127.0.0.1:PORT"
 * and token the admin token kilnd wrote on first start, which must be
 * owner-only (mode 0600). 0 when serving; -1 if kilnd died, never served
 * in 20 s, or its token file is missing or readable by others. */
int it_launch_kilnd(const char *kilnd_path, const char *data_dir, const char *trainer,
                    const char *extra_flag, const char *extra_value, pid_t *pid, char *base_url,
                    size_t url_len, char *token, size_t token_len);

/* Makes a user token for tenant with `kilnd token create` on data_dir into
 * out. 0, or -1 when the command fails or prints no kiln_ token. */
int it_make_token(const char *kilnd_path, const char *data_dir, const char *tenant, char *out,
                  size_t len);

#endif
