/* slurm_parse.c — Slurm's job states and what each means for a kiln
 * attempt (one table), and the parsers of what sbatch --parsable, squeue
 * and sacct print. Pure: no I/O. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slurm.h"

/* Every state squeue %T or sacct State prints (Slurm 22.05 and later). */
static const sched_slurm_state_info states[] = {
    {"PENDING", SCHED_SLURM_WAITING, "STARTING", "SLURM_PENDING",
     "the batch job waits in Slurm's queue"},
    {"CONFIGURING", SCHED_SLURM_WAITING, "STARTING", "SLURM_CONFIGURING",
     "Slurm is readying the batch job's nodes"},
    {"REQUEUED", SCHED_SLURM_WAITING, "STARTING", "SLURM_PENDING",
     "Slurm put the batch job back in its queue"},
    {"REQUEUE_HOLD", SCHED_SLURM_WAITING, "STARTING", "SLURM_PENDING",
     "Slurm holds the batch job in its queue"},
    {"REQUEUE_FED", SCHED_SLURM_WAITING, "STARTING", "SLURM_PENDING",
     "Slurm put the batch job back in its queue"},
    {"RESV_DEL_HOLD", SCHED_SLURM_WAITING, "STARTING", "SLURM_PENDING",
     "Slurm holds the batch job: its reservation was deleted"},
    {"RUNNING", SCHED_SLURM_ACTIVE, "RUNNING", "STARTED", "the batch job runs"},
    {"COMPLETING", SCHED_SLURM_ACTIVE, "RUNNING", "STARTED",
     "the batch job's processes are ending"},
    {"SUSPENDED", SCHED_SLURM_ACTIVE, "RUNNING", "STARTED",
     "Slurm suspended the batch job; it holds its nodes"},
    {"STOPPED", SCHED_SLURM_ACTIVE, "RUNNING", "STARTED",
     "Slurm stopped the batch job; it holds its nodes"},
    {"RESIZING", SCHED_SLURM_ACTIVE, "RUNNING", "STARTED", "Slurm resizes the batch job"},
    {"SIGNALING", SCHED_SLURM_ACTIVE, "RUNNING", "STARTED", "Slurm signals the batch job"},
    {"STAGE_OUT", SCHED_SLURM_ACTIVE, "RUNNING", "STARTED",
     "the batch job stages out its burst buffer"},
    {"COMPLETED", SCHED_SLURM_SUCCEEDED, "SUCCEEDED", "COMPLETED",
     "the batch job completed with status 0"},
    {"FAILED", SCHED_SLURM_FAILED, "FAILED", "TRAINER_EXITED",
     "the batch job ended with a non-zero status"},
    {"SPECIAL_EXIT", SCHED_SLURM_FAILED, "FAILED", "TRAINER_EXITED",
     "the batch job ended with a special exit"},
    {"CANCELLED", SCHED_SLURM_CANCELLED, "CANCELLED", "CANCELLED",
     "the batch job was cancelled in Slurm (scancel)"},
    {"TIMEOUT", SCHED_SLURM_FAILED, "FAILED", "DEADLINE_EXCEEDED",
     "the batch job ran past its Slurm time limit"},
    {"DEADLINE", SCHED_SLURM_FAILED, "FAILED", "DEADLINE_EXCEEDED",
     "the batch job passed its Slurm deadline"},
    {"OUT_OF_MEMORY", SCHED_SLURM_FAILED, "FAILED", "RESOURCE_EXHAUSTED",
     "the batch job ran out of memory on its node"},
    {"NODE_FAIL", SCHED_SLURM_REQUEUE, "QUEUED", "NODE_FAIL",
     "a node of the batch job's allocation failed"},
    {"BOOT_FAIL", SCHED_SLURM_REQUEUE, "QUEUED", "NODE_FAIL",
     "a node of the batch job's allocation failed to boot"},
    {"PREEMPTED", SCHED_SLURM_REQUEUE, "QUEUED", "PREEMPTED",
     "Slurm preempted the batch job for another one"},
    {"REVOKED", SCHED_SLURM_REQUEUE, "QUEUED", "SLURM_REVOKED",
     "Slurm revoked the batch job (it runs on another cluster of the federation)"},
};

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

const sched_slurm_state_info *sched_slurm_state_lookup(const char *name) {
  if (!name) return NULL;
  /* sacct says "CANCELLED by 1000" (the uid that cancelled it). */
  size_t n = strcspn(name, " ");
  for (size_t i = 0; i < sizeof states / sizeof states[0]; i++)
    if (strlen(states[i].name) == n && strncmp(states[i].name, name, n) == 0) return &states[i];
  return NULL;
}

static int is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* The next line of *text (its end cut off, trailing blanks too) into line;
 * 0 at the end of the text. A line longer than line's size is cut. */
static int next_line(const char **text, char *line, size_t len) {
  const char *p = *text;
  if (!*p) return 0;
  size_t n = strcspn(p, "\n");
  *text = p + n + (p[n] == '\n');
  size_t keep = n < len - 1 ? n : len - 1;
  memcpy(line, p, keep);
  while (keep > 0 && is_space(line[keep - 1])) keep--;
  line[keep] = '\0';
  return 1;
}

static int all_digits(const char *s, size_t n) {
  if (n == 0) return 0;
  for (size_t i = 0; i < n; i++)
    if (s[i] < '0' || s[i] > '9') return 0;
  return 1;
}

int sched_slurm_parse_sbatch(const char *out, char *id, size_t id_len, char *err, size_t errlen) {
  /* The id is the last line; sbatch may say other things before it. */
  char line[256], last[256] = "";
  const char *p = out ? out : "";
  while (next_line(&p, line, sizeof line))
    if (line[0]) snprintf(last, sizeof last, "%s", line);
  const char *start = last;
  while (is_space(*start)) start++;
  size_t n = strcspn(start, ";"); /* "1234;cluster" on a multi-cluster site */
  if (!all_digits(start, n) || n >= id_len)
    return fail(err, errlen, "sbatch --parsable printed no job id (got \"%.80s\")", last);
  memcpy(id, start, n);
  id[n] = '\0';
  return 0;
}

/* Splits line at '|' into at most max fields (a trailing '|', as sacct -p
 * prints, ends no extra field); returns how many. */
static int split_fields(char *line, char **fields, int max) {
  int n = 0;
  char *p = line;
  while (n < max) {
    fields[n++] = p;
    char *bar = strchr(p, '|');
    if (!bar) break;
    *bar = '\0';
    p = bar + 1;
    if (!*p) break;
  }
  return n;
}

static void fill_state(sched_slurm_status *st, const char *id, const char *state) {
  snprintf(st->job_id, sizeof st->job_id, "%s", id);
  size_t n = strcspn(state, " ");
  if (n >= sizeof st->state) n = sizeof st->state - 1;
  memcpy(st->state, state, n);
  st->state[n] = '\0';
  st->info = sched_slurm_state_lookup(st->state);
}

int sched_slurm_parse_squeue(const char *out, const char *job_id, sched_slurm_status *st, char *err,
                             size_t errlen) {
  memset(st, 0, sizeof *st);
  char line[512];
  const char *p = out ? out : "";
  while (next_line(&p, line, sizeof line)) {
    if (!line[0]) continue;
    char *f[4];
    int n = split_fields(line, f, 4);
    if (n < 3 || !f[1][0])
      return fail(err, errlen, "squeue printed \"%.80s\", not JOBID|STATE|REASON", f[0]);
    if (strcmp(f[0], job_id) != 0) continue;
    fill_state(st, f[0], f[1]);
    snprintf(st->reason, sizeof st->reason, "%s", f[2]);
    return 1;
  }
  return 0;
}

int sched_slurm_parse_sacct(const char *out, const char *job_id, sched_slurm_status *st, char *err,
                            size_t errlen) {
  memset(st, 0, sizeof *st);
  char line[512];
  const char *p = out ? out : "";
  while (next_line(&p, line, sizeof line)) {
    if (!line[0]) continue;
    char *f[4];
    int n = split_fields(line, f, 4);
    if (n < 3 || !f[1][0])
      return fail(err, errlen, "sacct printed \"%.80s\", not JobID|State|ExitCode", f[0]);
    if (strcmp(f[0], job_id) != 0) continue; /* a step: "ID.batch", "ID.0", "ID.extern" */
    fill_state(st, f[0], f[1]);
    char *colon = strchr(f[2], ':');
    char *end;
    long code = strtol(f[2], &end, 10);
    if (!colon || end != colon || code < 0 || code > 255)
      return fail(err, errlen, "sacct printed ExitCode \"%.40s\" for job %s, not STATUS:SIGNAL",
                  f[2], job_id);
    long sig = strtol(colon + 1, &end, 10);
    if (*end || sig < 0 || sig > 255)
      return fail(err, errlen, "sacct printed ExitCode \"%.40s\" for job %s, not STATUS:SIGNAL",
                  f[2], job_id);
    st->exit_code = (int)code;
    st->signal = (int)sig;
    return 1;
  }
  return 0;
}
