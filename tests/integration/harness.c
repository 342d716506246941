/* harness.c — the integration suites' shared pieces (see harness.h). */
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
  char port_file[600], log_file[600];
  snprintf(port_file, sizeof port_file, "%s/port", data_dir);
  snprintf(log_file, sizeof log_file, "%s/kilnd.log", data_dir);
  unlink(port_file);
  *pid = fork();
  if (*pid < 0) return -1;
  if (*pid == 0) {
    FILE *log = freopen(log_file, "a", stderr);
    (void)log;
    execl(kilnd_path, "kilnd", "--listen", "127.0.0.1:0", "--data-dir", data_dir, "--port-file",
          port_file, "--trainer", trainer, extra_flag, extra_value, (char *)NULL);
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
