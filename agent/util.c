/* util.c — what every part of kiln-agent shares: the logger, the token
 * file, a client of kilnd, reading kilnd's answers, and files. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"

void ag_log(int level, const char *fmt, ...) {
  static const char *names[] = {"debug", "info", "warn", "error"};
  char line[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char when[32];
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
  fprintf(stderr, "%s.%03ldZ level=%s %s\n", when, ts.tv_nsec / 1000000, names[level], line);
}

int64_t ag_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int ag_read_token(const char *path, char *out, size_t len, char *err, size_t errlen) {
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, errlen, "cannot read the token file %s: %s", path, strerror(errno));
    return -1;
  }
  if (!fgets(out, (int)len, f)) out[0] = '\0';
  fclose(f);
  out[strcspn(out, "\r\n")] = '\0';
  if (!out[0]) {
    snprintf(err, errlen, "the token file %s is empty", path);
    return -1;
  }
  return 0;
}

cli_client *ag_client(const ag_config *cfg, const char *token, char *err, size_t errlen) {
  cli_client *c = cli_client_new(cfg->server, "kiln-agent/" KILN_VERSION, err, errlen);
  if (!c) return NULL;
  if ((token && cli_client_set_token(c, token, err, errlen) != 0) ||
      (cfg->cacert && cli_client_set_cacert(c, cfg->cacert, err, errlen) != 0)) {
    cli_client_free(c);
    return NULL;
  }
  return c;
}

json_t *ag_json_answer(const cli_response *resp, const char *what, char *err, size_t errlen) {
  json_error_t je;
  json_t *body = resp->len ? json_loadb(resp->body, resp->len, 0, &je) : json_object();
  if (resp->status >= 200 && resp->status < 300) {
    if (!body) snprintf(err, errlen, "%s: kilnd's answer is not JSON: %s", what, je.text);
    return body;
  }
  const char *message = NULL;
  json_t *e = body ? json_object_get(body, "error") : NULL;
  if (e) message = json_string_value(json_object_get(e, "message"));
  snprintf(err, errlen, "%s: HTTP %ld: %s", what, resp->status,
           message ? message : (resp->body && resp->body[0] ? resp->body : "(no body)"));
  json_decref(body);
  return NULL;
}

int ag_mkdir_p(const char *path) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(tmp, 0700) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  return mkdir(tmp, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

int ag_write_file(const char *path, const char *data, size_t len) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  size_t done = 0;
  while (done < len) {
    ssize_t n = write(fd, data + done, len - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(fd);
      unlink(tmp);
      return -1;
    }
    done += (size_t)n;
  }
  if (close(fd) != 0 || rename(tmp, path) != 0) {
    unlink(tmp);
    return -1;
  }
  return 0;
}
