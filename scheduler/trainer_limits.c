/* trainer_limits.c — each trainer's memory limit and cores: a cgroup v2 per
 * trainer under a folder kilnd makes beside its own cgroup, where the
 * hierarchy is writable and has the memory controller; else RLIMIT_AS.
 * See trainer_limits.h. */
#define _GNU_SOURCE
#include "trainer_limits.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CGROUP_ROOT "/sys/fs/cgroup"

/* AddressSanitizer reserves terabytes of address space: RLIMIT_AS would
 * stop a sanitizer build's own trainer from starting. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZER_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZER_BUILD 1
#endif
#endif
#ifndef SANITIZER_BUILD
#define SANITIZER_BUILD 0
#endif

static int write_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t len = strlen(text);
  int ok = write(fd, text, len) == (ssize_t)len;
  int saved = errno;
  close(fd);
  errno = saved;
  return ok ? 0 : -1;
}

static int read_line(const char *path, char *out, size_t len) {
  FILE *f = fopen(path, "re");
  if (!f) return -1;
  int ok = fgets(out, (int)len, f) != NULL;
  fclose(f);
  if (ok) out[strcspn(out, "\n")] = '\0';
  return ok ? 0 : -1;
}

static int has_word(const char *list, const char *word) {
  size_t n = strlen(word);
  for (const char *p = list; (p = strstr(p, word)) != NULL; p += n)
    if ((p == list || p[-1] == ' ') && (p[n] == '\0' || p[n] == ' ')) return 1;
  return 0;
}

/* Makes l->base, a folder for trainers' cgroups with the memory (and
 * cpuset) controller, beside kilnd's own cgroup. 0, or -1 with why. */
static int cgroup_setup(sched_limits *l, char *why, size_t whylen) {
  char own[1024] = "", line[1024];
  FILE *f = fopen("/proc/self/cgroup", "re");
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "0::", 3) == 0) {
      line[strcspn(line, "\n")] = '\0';
      snprintf(own, sizeof own, "%s", line + 3);
    }
  if (f) fclose(f);
  if (!own[0]) {
    snprintf(why, whylen, "no cgroup v2 hierarchy (no 0:: line in /proc/self/cgroup)");
    return -1;
  }
  char parent[1100], path[1400], controllers[512] = "";
  snprintf(parent, sizeof parent, CGROUP_ROOT "%s", strcmp(own, "/") == 0 ? "" : own);
  snprintf(path, sizeof path, "%s/cgroup.controllers", parent);
  if (read_line(path, controllers, sizeof controllers) != 0) {
    snprintf(why, whylen, "cannot read %.200s: %.200s", path, strerror(errno));
    return -1;
  }
  if (!has_word(controllers, "memory")) {
    snprintf(why, whylen, "the memory controller is not delegated to %.200s", parent);
    return -1;
  }
  int cpuset = has_word(controllers, "cpuset");
  snprintf(path, sizeof path, "%s/cgroup.subtree_control", parent);
  const char *enable = cpuset ? "+memory +cpuset" : "+memory";
  if (write_file(path, enable) != 0 && errno == EBUSY) {
    /* A cgroup with processes cannot hand controllers to children (but
     * the root): kilnd moves itself into a leaf of its own first. */
    char leaf[1400], pid[32];
    snprintf(leaf, sizeof leaf, "%s/kilnd", parent);
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    if (mkdir(leaf, 0755) != 0 && errno != EEXIST) {
      snprintf(why, whylen, "cannot create %.200s: %.200s", leaf, strerror(errno));
      return -1;
    }
    snprintf(leaf + strlen(leaf), sizeof leaf - strlen(leaf), "/cgroup.procs");
    if (write_file(leaf, pid) != 0 || write_file(path, enable) != 0) {
      snprintf(why, whylen, "cannot enable %.200s in %.200s: %.200s", enable, path,
               strerror(errno));
      return -1;
    }
  } else if (write_file(path, enable) != 0) {
    snprintf(why, whylen, "cannot enable %.200s in %.200s: %.200s", enable, path, strerror(errno));
    return -1;
  }
  snprintf(l->base, sizeof l->base, "%s/kiln-trainers-%d", parent, (int)getpid());
  if (mkdir(l->base, 0755) != 0 && errno != EEXIST) {
    snprintf(why, whylen, "cannot create %.200s: %.200s", l->base, strerror(errno));
    return -1;
  }
  snprintf(path, sizeof path, "%s/cgroup.subtree_control", l->base);
  if (write_file(path, enable) != 0) {
    snprintf(why, whylen, "cannot enable %.200s in %.200s: %.200s", enable, path, strerror(errno));
    rmdir(l->base);
    return -1;
  }
  l->cpuset = cpuset;
  return 0;
}

/* The same with cgroup v1's memory controller (hybrid and v1-only hosts):
 * trainers' cgroups under a folder in kilnd's own memory cgroup. */
static int cgroup_v1_setup(sched_limits *l, char *why, size_t whylen) {
  char own[1024] = "", line[1024];
  FILE *f = fopen("/proc/self/cgroup", "re");
  while (f && fgets(line, sizeof line, f)) {
    /* "4:memory:/path" (controllers may be joined by commas) */
    char *first = strchr(line, ':'), *second = first ? strchr(first + 1, ':') : NULL;
    if (!second) continue;
    *second = '\0';
    char list[256];
    snprintf(list, sizeof list, ",%s,", first + 1);
    if (!strstr(list, ",memory,")) continue;
    second[1 + strcspn(second + 1, "\n")] = '\0';
    snprintf(own, sizeof own, "%s", second + 1);
  }
  if (f) fclose(f);
  if (!own[0]) {
    snprintf(why, whylen, "no cgroup v1 memory controller either");
    return -1;
  }
  snprintf(l->base, sizeof l->base, CGROUP_ROOT "/memory%s/kiln-trainers-%d",
           strcmp(own, "/") == 0 ? "" : own, (int)getpid());
  if (mkdir(l->base, 0755) != 0 && errno != EEXIST) {
    snprintf(why, whylen, "nor is the cgroup v1 memory controller writable (%.200s: %.200s)",
             l->base, strerror(errno));
    return -1;
  }
  l->v1 = 1;
  return 0;
}

int sched_limits_init(sched_limits *l, const char *mode, int64_t memory_max, char *err,
                      size_t errlen) {
  memset(l, 0, sizeof *l);
  l->memory_max = memory_max;
  if (!mode) mode = "auto";
  l->allow_rlimit = strcmp(mode, "rlimit") == 0 || !SANITIZER_BUILD;
  if (memory_max <= 0) {
    snprintf(l->why_not_cgroup, sizeof l->why_not_cgroup, "no memory limit was set");
    return 0;
  }
  if (strcmp(mode, "rlimit") == 0) {
    snprintf(l->why_not_cgroup, sizeof l->why_not_cgroup, "kilnd --trainer-limits rlimit");
    l->kind = SCHED_LIMIT_RLIMIT;
    return 0;
  }
  char why_v1[512];
  if (cgroup_setup(l, l->why_not_cgroup, sizeof l->why_not_cgroup) == 0 ||
      cgroup_v1_setup(l, why_v1, sizeof why_v1) == 0) {
    l->kind = SCHED_LIMIT_CGROUP;
    return 0;
  }
  snprintf(l->why_not_cgroup + strlen(l->why_not_cgroup),
           sizeof l->why_not_cgroup - strlen(l->why_not_cgroup), "; %s", why_v1);
  if (strcmp(mode, "cgroup") == 0) {
    snprintf(err, errlen, "--trainer-limits cgroup: %s", l->why_not_cgroup);
    return -1;
  }
  l->kind = l->allow_rlimit ? SCHED_LIMIT_RLIMIT : SCHED_LIMIT_NONE;
  if (!l->allow_rlimit)
    snprintf(l->why_not_cgroup + strlen(l->why_not_cgroup),
             sizeof l->why_not_cgroup - strlen(l->why_not_cgroup),
             "; and this is an AddressSanitizer build, whose trainers cannot run under "
             "RLIMIT_AS");
  return 0;
}

void sched_limits_cleanup(sched_limits *l) {
  if (l && l->kind == SCHED_LIMIT_CGROUP) rmdir(l->base);
}

int sched_trainer_limit_prepare(const sched_limits *l, const char *job_id, int attempt,
                                const char *cpus, int gpu, sched_trainer_limit *t, char *err,
                                size_t errlen) {
  memset(t, 0, sizeof *t);
  t->kind = l->kind;
  if (t->kind == SCHED_LIMIT_RLIMIT && gpu) t->kind = SCHED_LIMIT_NONE;
  if (t->kind == SCHED_LIMIT_NONE) {
    snprintf(t->describe, sizeof t->describe, "no memory limit: %s",
             gpu && l->kind == SCHED_LIMIT_RLIMIT
                 ? "RLIMIT_AS is not used on GPUs (the CUDA driver maps far more address space "
                   "than memory) and no cgroup could be made"
                 : l->why_not_cgroup);
    return 0;
  }
  if (t->kind == SCHED_LIMIT_RLIMIT) {
    /* ulimit -v counts KiB. */
    snprintf(t->script, sizeof t->script,
             "ulimit -v %lld || { echo 'kilnd: cannot set RLIMIT_AS' >&2; exit 125; }; "
             "exec \"$@\"",
             (long long)(l->memory_max / 1024));
    snprintf(t->describe, sizeof t->describe,
             "memory limit %lld bytes as RLIMIT_AS, the trainer's address space (no cgroup: %s)",
             (long long)l->memory_max, l->why_not_cgroup);
    return 0;
  }
  char path[sizeof t->cgroup + 32], value[32];
  snprintf(t->cgroup, sizeof t->cgroup, "%s/%s-%d", l->base, job_id, attempt);
  if (mkdir(t->cgroup, 0755) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "cannot create the trainer's cgroup %s: %s", t->cgroup, strerror(errno));
    t->cgroup[0] = '\0';
    return -1;
  }
  t->v1 = l->v1;
  const char *limit_file = l->v1 ? "memory.limit_in_bytes" : "memory.max";
  snprintf(value, sizeof value, "%lld", (long long)l->memory_max);
  snprintf(path, sizeof path, "%s/%s", t->cgroup, limit_file);
  if (write_file(path, value) != 0) {
    snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
    sched_trainer_limit_release(t);
    return -1;
  }
  /* Without swap the limit is the memory it may touch, and passing it ends
   * in the OOM killer rather than in paging. */
  snprintf(path, sizeof path, "%s/%s", t->cgroup,
           l->v1 ? "memory.memsw.limit_in_bytes" : "memory.swap.max");
  if (access(path, F_OK) == 0) write_file(path, l->v1 ? value : "0");
  int pinned = 0;
  if (l->cpuset && cpus && cpus[0]) {
    snprintf(path, sizeof path, "%s/cpuset.cpus", t->cgroup);
    pinned = write_file(path, cpus) == 0;
  }
  snprintf(t->script, sizeof t->script,
           "echo $$ > '%s/cgroup.procs' || { echo 'kilnd: cannot join the trainer cgroup' >&2; "
           "exit 125; }; exec \"$@\"",
           t->cgroup);
  /* The job's event names the kind, not the machine's paths (kilnd's log has them). */
  snprintf(t->describe, sizeof t->describe,
           "memory limit %lld bytes as cgroup %s %s, in a cgroup of its own%s%s",
           (long long)l->memory_max, l->v1 ? "v1" : "v2", limit_file,
           pinned ? "; cpuset.cpus " : "", pinned ? cpus : "");
  return 0;
}

int sched_trainer_limit_oom_killed(const sched_trainer_limit *t) {
  if (t->kind != SCHED_LIMIT_CGROUP || !t->cgroup[0]) return 0;
  char path[sizeof t->cgroup + 32], line[128];
  /* v2's memory.events and v1's memory.oom_control both count "oom_kill N". */
  snprintf(path, sizeof path, "%s/%s", t->cgroup, t->v1 ? "memory.oom_control" : "memory.events");
  FILE *f = fopen(path, "re");
  long long kills = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "oom_kill %lld", &kills) == 1) break;
  if (f) fclose(f);
  return kills > 0;
}

void sched_trainer_limit_release(sched_trainer_limit *t) {
  if (!t->cgroup[0]) return;
  if (rmdir(t->cgroup) != 0 && errno == EBUSY) {
    char path[sizeof t->cgroup + 32];
    snprintf(path, sizeof path, "%s/cgroup.kill", t->cgroup);
    write_file(path, "1");
    for (int i = 0; i < 50 && rmdir(t->cgroup) != 0 && errno == EBUSY; i++) usleep(20 * 1000);
  }
  t->cgroup[0] = '\0';
}
