/* harness.c — the integration suites' shared pieces (see harness.h). */
#include "harness.h"

#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

size_t it_on_body(char *ptr, size_t size, size_t n, void *user) {
  it_buffer *b = user;
  char *grown = realloc(b->data, b->len + size * n + 1);
  if (!grown) return 0;
  b->data = grown;
  memcpy(b->data + b->len, ptr, size * n);
  b->len += size * n;
  b->data[b->len] = '\0';
  return size * n;
}

/* One request; tls NULL for plain HTTP. On a curl failure: 0, or minus
 * curl's code when minus_curl_code, with curl's message as the body. */
typedef struct tls_opts {
  const char *cainfo;
  long max_tls;
} tls_opts;

static long perform(const char *base_url, const char *authorization, const char *extra_header,
                    const tls_opts *tls, const char *method, const char *path, const char *body,
                    size_t body_len, long timeout_s, int minus_curl_code, char **body_out) {
  CURL *c = curl_easy_init();
  if (!c) return 0;
  char url[2048], auth[300];
  snprintf(url, sizeof url, "%s%s", base_url, path);
  it_buffer b = {0};
  char error[CURL_ERROR_SIZE] = "";
  struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
  headers = curl_slist_append(headers, "Expect:");
  if (authorization) {
    snprintf(auth, sizeof auth, "Authorization: %s", authorization);
    headers = curl_slist_append(headers, auth);
  }
  if (extra_header) headers = curl_slist_append(headers, extra_header);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  /* A HEAD answer's Content-Length describes a body that never comes. */
  if (strcmp(method, "HEAD") == 0) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, it_on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, timeout_s);
  if (tls && tls->cainfo) curl_easy_setopt(c, CURLOPT_CAINFO, tls->cainfo);
  if (tls && tls->max_tls)
    curl_easy_setopt(c, CURLOPT_SSLVERSION, CURL_SSLVERSION_TLSv1_2 | tls->max_tls);
  if (body) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
  }
  CURLcode rc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(c);
  if (rc != CURLE_OK) {
    free(b.data);
    b.data = strdup(error[0] ? error : curl_easy_strerror(rc));
    status = minus_curl_code ? -(long)rc : 0;
  }
  if (body_out)
    *body_out = b.data;
  else
    free(b.data);
  return status;
}

long it_request_as(const char *base_url, const char *authorization, const char *extra_header,
                   const char *method, const char *path, const char *body, size_t body_len,
                   long timeout_s, char **body_out) {
  return perform(base_url, authorization, extra_header, NULL, method, path, body, body_len,
                 timeout_s, 0, body_out);
}

long it_request_tls(const char *base_url, const char *token, const char *cainfo, long max_tls,
                    const char *method, const char *path, const char *body, long timeout_s,
                    char **body_out) {
  char bearer[256];
  snprintf(bearer, sizeof bearer, "Bearer %s", token ? token : "");
  const tls_opts tls = {cainfo, max_tls};
  return perform(base_url, token ? bearer : NULL, NULL, &tls, method, path, body,
                 body ? strlen(body) : 0, timeout_s, 1, body_out);
}

long long it_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

long it_request(const char *base_url, const char *token, const char *method, const char *path,
                const char *body, size_t body_len, char **body_out) {
  char bearer[256];
  snprintf(bearer, sizeof bearer, "Bearer %s", token ? token : "");
  return it_request_as(base_url, token ? bearer : NULL, NULL, method, path, body, body_len, 30,
                       body_out);
}

static int read_token(const char *data_dir, char *token, size_t len) {
  char path[600];
  struct stat sb;
  snprintf(path, sizeof path, "%s/admin.token", data_dir);
  FILE *f = fopen(path, "r");
  int ok = f && stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0600 && fgets(token, (int)len, f);
  if (f) fclose(f);
  if (!ok) return -1;
  token[strcspn(token, "\n")] = '\0';
  return 0;
}

int it_launch_kilnd(const char *kilnd_path, const char *data_dir, const char *trainer,
                    const char *extra_flag, const char *extra_value, pid_t *pid, char *base_url,
                    size_t url_len, char *token, size_t token_len) {
  const char *extra[] = {extra_flag, extra_value, NULL};
  return it_launch_kilnd_args(kilnd_path, data_dir, trainer, extra_flag ? extra : NULL, pid,
                              base_url, url_len, token, token_len);
}

int it_launch_kilnd_args(const char *kilnd_path, const char *data_dir, const char *trainer,
                         const char *const *extra, pid_t *pid, char *base_url, size_t url_len,
                         char *token, size_t token_len) {
  char port_file[600], log_file[600];
  snprintf(port_file, sizeof port_file, "%s/port", data_dir);
  snprintf(log_file, sizeof log_file, "%s/kilnd.log", data_dir);
  unlink(port_file);
  *pid = fork();
  if (*pid < 0) return -1;
  if (*pid == 0) {
    /* kilnd makes its data folder, but its log goes there from the start */
    mkdir(data_dir, 0700);
    FILE *log = freopen(log_file, "a", stderr);
    (void)log;
    const char *argv[32] = {"kilnd",       "--listen", "127.0.0.1:0", "--data-dir", data_dir,
                            "--port-file", port_file,  "--trainer",   trainer};
    int n = 9;
    for (int i = 0; extra && extra[i] && n < 31; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    execv(kilnd_path, (char *const *)argv);
    _exit(127);
  }
  for (int i = 0; i < 200; i++) { /* up to 20 s */
    FILE *f = fopen(port_file, "r");
    int port = 0;
    if (f) {
      int got = fscanf(f, "%d", &port);
      fclose(f);
      if (got == 1 && port > 0) {
        snprintf(base_url, url_len, "http://127.0.0.1:%d", port);
        return read_token(data_dir, token, token_len);
      }
    }
    if (waitpid(*pid, NULL, WNOHANG) == *pid) return -1;
    usleep(100 * 1000);
  }
  return -1;
}

int it_make_certificates(const char *dir) {
  char cmd[4096], out[4096];
  snprintf(
      cmd, sizeof cmd,
      "cd '%s' && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
      "-days 2 -subj '/CN=kiln test CA' -keyout ca.key -out ca.pem && "
      "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj '/CN=localhost' "
      "-keyout server.key -out server.csr && "
      "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\nbasicConstraints=CA:FALSE\\n"
      "extendedKeyUsage=serverAuth\\n' > ext.cnf && "
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-extfile ext.cnf -out server.pem && chmod 600 server.key",
      dir);
  int rc = it_run(out, sizeof out, cmd);
  if (rc != 0) fprintf(stderr, "openssl failed (%d): %s\n", rc, out);
  return rc == 0 ? 0 : -1;
}

int it_write_file(const char *path, const char *text, int mode) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  int ok = fputs(text, f) >= 0;
  ok &= fclose(f) == 0;
  return ok && chmod(path, (mode_t)mode) == 0 ? 0 : -1;
}

char *it_read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 8192, len = 0;
  char *buf = malloc(cap);
  size_t n;
  while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
    len += n;
    if (cap - len - 1 == 0) {
      char *more = realloc(buf, cap * 2);
      if (!more) free(buf);
      buf = more;
      cap *= 2;
    }
  }
  fclose(f);
  if (buf) buf[len] = '\0';
  return buf;
}

int it_run(char *out, size_t outlen, const char *command) {
  char line[8192];
  snprintf(line, sizeof line, "(%s) 2>&1", command); /* its own redirections apply first */
  FILE *p = popen(line, "r");
  if (!p) return -1;
  size_t used = 0;
  char sink[4096];
  /* Reads to the end even past outlen, so the command never blocks on a full pipe. */
  for (;;) {
    int room = used + 1 < outlen;
    size_t got = fread(room ? out + used : sink, 1, room ? outlen - 1 - used : sizeof sink, p);
    if (got == 0) break;
    if (room) used += got;
  }
  out[used] = '\0';
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int it_vkiln(const char *kiln_path, const char *dir, const char *base_url, const char *token,
             char *out, size_t outlen, const char *fmt, va_list ap) {
  char args[2048], cmd[3072];
  vsnprintf(args, sizeof args, fmt, ap);
  snprintf(cmd, sizeof cmd, "cd '%s' && '%s' --server %s --token %s %s", dir, kiln_path, base_url,
           token, args);
  int status = it_run(out, outlen, cmd);
  printf("$ kiln %s -> %d\n%s", args, status, out);
  fflush(stdout);
  return status;
}

pid_t it_spawn(const char *command, const char *out_file) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  if (!freopen(out_file, "w", stdout) || dup2(fileno(stdout), 2) < 0) _exit(127);
  execl("/bin/sh", "sh", "-c", command, (char *)NULL);
  _exit(127);
}

int it_wait_exit(pid_t pid, int limit_s) {
  int status = 0;
  for (int i = 0; i < limit_s * 10; i++) {
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    usleep(100 * 1000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

/* Each line reaches ctest's log as it is written: a suite ctest stops at
 * its time limit shows how far it came. */
__attribute__((constructor)) static void it_line_buffered(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
}

/* Names what each thread of a kilnd that will not stop waits in. */
static void print_threads(pid_t pid) {
  char cmd[300], out[8192];
  snprintf(cmd, sizeof cmd,
           "for t in /proc/%d/task/*; do echo \"thread $(basename $t) $(cat $t/comm):"
           " $(cat $t/wchan)\"; done",
           (int)pid);
  it_run(out, sizeof out, cmd);
  fprintf(stderr, "%s", out);
}

int it_stop_kilnd(pid_t pid, const char *data_dir) {
  if (pid > 0) {
    kill(pid, SIGTERM);
    /* kilnd gives each trainer 5 s to checkpoint: a minute is a hang. */
    int gone = 0;
    for (int i = 0; i < 600 && !gone; i++) {
      gone = waitpid(pid, NULL, WNOHANG) == pid;
      if (!gone) usleep(100 * 1000);
    }
    if (!gone) {
      fflush(stdout);
      fprintf(stderr, "kilnd (pid %d, data directory %s) has not stopped 60 s after SIGTERM:\n",
              (int)pid, data_dir);
      print_threads(pid);
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
      abort(); /* a kilnd that cannot stop fails the suite, never passes it */
    }
  }
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", data_dir);
  return system(cmd);
}

int it_make_token(const char *kilnd_path, const char *data_dir, const char *tenant, char *out,
                  size_t len) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "%s token create --tenant %s --data-dir %s", kilnd_path, tenant,
           data_dir);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  int got = fgets(out, (int)len, p) != NULL;
  if (pclose(p) != 0 || !got) return -1;
  out[strcspn(out, "\n")] = '\0';
  return strncmp(out, "kiln_", 5) == 0 ? 0 : -1;
}
