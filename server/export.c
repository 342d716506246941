/* export.c — GET /v1/jobs/{job}/checkpoints/{checkpoint}:export: a
 * checkpoint's model in a serving format (format=onnx). The engine lives
 * in kiln-train, so kilnd runs `kiln-train --export-onnx OUT --weights
 * CKPT SPEC` on the job's spec in a scratch folder and sends the file. */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "routes.h"

extern char **environ;

enum { EXPORT_REFUSED_STATUS = 3 }; /* kiln-train: the spec or its model cannot be exported */

/* Runs kiln-train's export; its exit status, with the reason it printed on
 * standard error in why ("kiln-train: " and the newline taken off). */
static int run_export(const http_config *cfg, const char *spec, const char *weights,
                      const char *out, char *why, size_t whylen) {
  int fds[2];
  why[0] = '\0';
  if (pipe(fds) != 0) {
    snprintf(why, whylen, "cannot create a pipe: %s", strerror(errno));
    return -1;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  char *argv[] = {(char *)cfg->trainer_path, "--export-onnx", (char *)out, "--weights",
                  (char *)weights,           (char *)spec,    NULL};
  pid_t pid;
  int rc = posix_spawn(&pid, cfg->trainer_path, &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  size_t used = 0;
  ssize_t got;
  while (rc == 0 && used + 1 < whylen && (got = read(fds[0], why + used, whylen - 1 - used)) > 0)
    used += (size_t)got;
  why[used] = '\0';
  close(fds[0]);
  if (rc != 0) {
    snprintf(why, whylen, "cannot start %s: %s", cfg->trainer_path, strerror(rc));
    return -1;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  why[strcspn(why, "\n")] = '\0';
  const char *prefix = "kiln-train: ";
  if (strncmp(why, prefix, strlen(prefix)) == 0)
    memmove(why, why + strlen(prefix), strlen(why) - strlen(prefix) + 1);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static int write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  int ok = fputs(text, f) >= 0;
  return fclose(f) == 0 && ok ? 0 : -1;
}

void http_export_checkpoint(const http_config *cfg, http_request *req, http_response *res) {
  const char *format = http_query(req, "format");
  if (!format || strcmp(format, "onnx") != 0) {
    http_reply_status(res, 400, "INVALID_ARGUMENT", "format",
                      "format must be 'onnx' (the one export format), got '%.40s'",
                      format ? format : "");
    return;
  }
  store_job job;
  if (http_load_job(cfg, req, &job, res) != 0) return;
  store_checkpoint c;
  if (http_load_checkpoint(cfg, req, &job, &c, NULL, res) != 0) {
    store_job_clear(&job);
    return;
  }
  if (access(c.path, R_OK) != 0) {
    http_reply_status(res, 404, "NOT_FOUND", "checkpoint",
                      "checkpoint %lld is recorded but its file is gone", (long long)c.id);
    store_job_clear(&job);
    return;
  }
  char dir[4200], spec[4300], out[4300], why[1024];
  snprintf(dir, sizeof dir, "%s/%s/export-XXXXXX", cfg->jobs_dir ? cfg->jobs_dir : ".", job.id);
  const int made = mkdtemp(dir) != NULL;
  snprintf(spec, sizeof spec, "%s/spec.json", dir);
  if (!made || write_text(spec, job.spec_json ? job.spec_json : "{}") != 0) {
    http_reply_status(res, 500, "INTERNAL", NULL, "cannot prepare the export in %s: %s", dir,
                      strerror(errno));
    if (made) rmdir(dir);
    store_job_clear(&job);
    return;
  }
  snprintf(out, sizeof out, "%s/model.onnx", dir);
  int status = run_export(cfg, spec, c.path, out, why, sizeof why);
  if (status == 0 && http_reply_file(res, out, "application/octet-stream") == 0) {
    /* the open descriptor keeps the file until it is sent */
  } else if (status == EXPORT_REFUSED_STATUS) {
    http_reply_status(res, 409, "FAILED_PRECONDITION", "model",
                      "job %s's model cannot be exported as ONNX: %s", job.id, why);
  } else {
    http_reply_status(res, 500, "INTERNAL", NULL, "exporting checkpoint %lld failed: %s",
                      (long long)c.id, why[0] ? why : "the trainer wrote no file");
  }
  unlink(out);
  unlink(spec);
  rmdir(dir);
  store_job_clear(&job);
}
