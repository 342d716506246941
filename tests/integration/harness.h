/* harness.h — what the integration suites share: a curl body collector and
 * starting a real kilnd on a free loopback port. */
#ifndef KILN_TESTS_HARNESS_H
#define KILN_TESTS_HARNESS_H

#include <stdarg.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct it_buffer {
  char *data; /* NUL-terminated, malloc'd */
  size_t len;
} it_buffer;

/* CURLOPT_WRITEFUNCTION collecting the body into the it_buffer at user. */
size_t it_on_body(char *ptr, size_t size, size_t n, void *user);

/* Sends method path (body may be NULL) to base_url with the bearer token
 * (NULL: none) and a JSON content type; returns the HTTP status, 0 when
 * the request could not be made (curl's reason in *body_out then), and the
 * body, malloc'd and NUL-terminated, in *body_out (may be NULL). */
long it_request(const char *base_url, const char *token, const char *method, const char *path,
                const char *body, size_t body_len, char **body_out);
/* The same with a raw Authorization value (NULL: none), one extra header
 * line (NULL: none) and a timeout of its own. */
long it_request_as(const char *base_url, const char *authorization, const char *extra_header,
                   const char *method, const char *path, const char *body, size_t body_len,
                   long timeout_s, char **body_out);

/* it_request over HTTPS: the server verified with the CA file cainfo
 * (NULL: the system's store), the protocol capped at max_tls (a
 * CURL_SSLVERSION_MAX_* value; 0: curl's own). The HTTP status, or minus
 * curl's error code with curl's message in *body_out. */
long it_request_tls(const char *base_url, const char *token, const char *cainfo, long max_tls,
                    const char *method, const char *path, const char *body, long timeout_s,
                    char **body_out);

/* Milliseconds on the monotonic clock. */
long long it_now_ms(void);

/* Writes text to path with the given mode; 0, or -1 if it cannot. */
int it_write_file(const char *path, const char *text, int mode);
/* The whole file at path, malloc'd and NUL-terminated; NULL if unreadable. */
char *it_read_file(const char *path);

/* Makes a CA (dir/ca.pem) and a server certificate it signs for localhost
 * and 127.0.0.1 (dir/server.pem, its key dir/server.key, mode 0600) with
 * openssl. 0; -1 (having said why) when openssl fails. */
int it_make_certificates(const char *dir);

/* Starts kilnd_path on data_dir (port 0, stderr appended to
 * data_dir/kilnd.log) with --trainer trainer and an optional extra flag and
 * value, and waits until it serves. Then base_url is "http://127.0.0.1:PORT"
 * and token the admin token kilnd wrote on first start, which must be
 * owner-only (mode 0600). 0 when serving; -1 if kilnd died, never served
 * in 20 s, or its token file is missing or readable by others. */
int it_launch_kilnd(const char *kilnd_path, const char *data_dir, const char *trainer,
                    const char *extra_flag, const char *extra_value, pid_t *pid, char *base_url,
                    size_t url_len, char *token, size_t token_len);

/* The same with any number of extra arguments: extra is NULL-terminated
 * (at most 16). */
int it_launch_kilnd_args(const char *kilnd_path, const char *data_dir, const char *trainer,
                         const char *const *extra, pid_t *pid, char *base_url, size_t url_len,
                         char *token, size_t token_len);

/* Runs a shell command line with stderr merged into stdout (after the
 * line's own redirections: "kiln ... > job.json" leaves stderr); the output
 * (cut to outlen - 1 bytes) in out, the exit status returned (-1 when it
 * did not exit normally). */
int it_run(char *out, size_t outlen, const char *command);

/* Runs `kiln_path --server base_url --token token ARGS` in dir, ARGS made
 * from fmt (stderr merged unless ARGS redirects it), printing the command
 * line and its output; the output in out as it_run, the exit status
 * returned. */
int it_vkiln(const char *kiln_path, const char *dir, const char *base_url, const char *token,
             char *out, size_t outlen, const char *fmt, va_list ap);

/* Starts a shell command line in the background with its stdout and stderr
 * written to out_file; returns its pid, or -1. */
pid_t it_spawn(const char *command, const char *out_file);

/* Waits up to limit_s seconds for pid; its exit status, or -1 when it did
 * not exit normally or in time (then it is killed). */
int it_wait_exit(pid_t pid, int limit_s);
/* Stops the kilnd at pid (SIGTERM, then waits for it; none when pid <= 0)
 * and removes data_dir with everything in it. 0 when removed. */
int it_stop_kilnd(pid_t pid, const char *data_dir);
/* Makes a user token for tenant with `kilnd token create` on data_dir into
 * out. 0, or -1 when the command fails or prints no kiln_ token. */
int it_make_token(const char *kilnd_path, const char *data_dir, const char *tenant, char *out,
                  size_t len);

#endif
