/* kilnd_backup.c — `kilnd backup --data-dir D OUT` and `kilnd restore OUT
 * --data-dir D2`: a consistent copy of a data directory a kilnd may be
 * serving (the database by SQLite's online backup, the checkpoint and data
 * set files it references as hard links or copies, each job's log), with a
 * manifest of sha256 sums; and a new data directory made from one, checked
 * against the manifest first, its stored paths pointed at their new place.
 *
 * OUT/kiln.db       the database snapshot
 * OUT/files/REL     the file that was D/REL
 * OUT/MANIFEST      "kiln-backup 1", "data_dir D", then "file SHA256 BYTES REL"
 *                   and "missing KIND PATH" lines; written last */
#define _GNU_SOURCE /* O_CLOEXEC with open, and linkat flags */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "kilnd_backup.h"
#include "storage.h"

#define MANIFEST_HEADER "kiln-backup 1"
#define PAGES_PER_STEP  64
#define PATH_BUF        (PATH_MAX * 2)

/* "a/b" into out; -1 (out cut short) when it does not fit. */
static int join(char *out, size_t len, const char *a, const char *b) {
  int n = snprintf(out, len, "%s/%s", a, b);
  return n > 0 && (size_t)n < len ? 0 : -1;
}

/* One file of the backup, relative to OUT ("kiln.db", "files/..."). */
typedef struct entry {
  char *rel;
  int fd; /* >= 0: copy from here once the write lock is gone */
} entry;

typedef struct backup_ctx {
  const char *data_dir; /* absolute */
  const char *out;
  entry *entries;
  int n, cap;
  char **missing; /* "KIND PATH" */
  int n_missing, cap_missing;
  int links, copies;
  char err[PATH_BUF + 256];
} backup_ctx;

static int push_entry(backup_ctx *b, const char *rel, int fd) {
  if (b->n == b->cap) {
    int cap = b->cap ? b->cap * 2 : 64;
    entry *more = realloc(b->entries, (size_t)cap * sizeof *more);
    if (!more) return -1;
    b->entries = more;
    b->cap = cap;
  }
  b->entries[b->n].rel = strdup(rel);
  b->entries[b->n].fd = fd;
  return b->entries[b->n++].rel ? 0 : -1;
}

static int push_missing(backup_ctx *b, const char *kind, const char *path) {
  if (b->n_missing == b->cap_missing) {
    int cap = b->cap_missing ? b->cap_missing * 2 : 16;
    char **more = realloc(b->missing, (size_t)cap * sizeof *more);
    if (!more) return -1;
    b->missing = more;
    b->cap_missing = cap;
  }
  size_t len = strlen(kind) + strlen(path) + 2;
  char *line = malloc(len);
  if (!line) return -1;
  snprintf(line, len, "%s %s", kind, path);
  b->missing[b->n_missing++] = line;
  return 0;
}

/* mkdir -p of the folder that will hold path (mode 0700). */
static int make_parents(const char *path) {
  char dir[PATH_MAX];
  if (strlen(path) >= sizeof dir) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memcpy(dir, path, strlen(path) + 1);
  for (char *p = dir + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  return 0;
}

/* Copies everything readable from fd to a new file at to (0600, fsync'd). */
static int copy_fd(int from, const char *to) {
  int out = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (out < 0) return -1;
  char buf[1 << 16];
  ssize_t n;
  int ok = 1;
  while (ok && (n = read(from, buf, sizeof buf)) != 0) {
    if (n < 0) {
      ok = errno == EINTR;
      continue;
    }
    for (ssize_t off = 0; off < n;) {
      ssize_t w = write(out, buf + off, (size_t)(n - off));
      if (w <= 0) {
        ok = 0;
        break;
      }
      off += w;
    }
  }
  ok &= fsync(out) == 0;
  ok &= close(out) == 0;
  return ok ? 0 : -1;
}

static int copy_file(const char *from, const char *to) {
  int fd = open(from, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = copy_fd(fd, to);
  close(fd);
  return rc;
}

/* The SHA-256 and size of a file. */
static int hash_file(const char *path, char hex[65], long long *bytes) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  kc_sha256 h;
  kc_sha256_init(&h);
  char buf[1 << 16];
  ssize_t n;
  *bytes = 0;
  while ((n = read(fd, buf, sizeof buf)) > 0) {
    kc_sha256_update(&h, buf, (size_t)n);
    *bytes += n;
  }
  close(fd);
  if (n < 0) return -1;
  uint8_t digest[32];
  kc_sha256_final(&h, digest);
  kc_sha256_hex(digest, hex);
  return 0;
}

/* path inside the data directory: its part after "D/"; else NULL. */
static const char *inside(const backup_ctx *b, const char *path) {
  size_t len = strlen(b->data_dir);
  if (strncmp(path, b->data_dir, len) != 0 || path[len] != '/' || !path[len + 1]) return NULL;
  return strstr(path + len, "/../") ? NULL : path + len + 1;
}

/* Takes one file into OUT/files: a hard link now, or an open descriptor to
 * copy from once writers run again (another filesystem). Under the lock. */
static int take_one(backup_ctx *b, const char *kind, const char *path) {
  const char *rel = inside(b, path);
  if (!rel || strchr(rel, '\n')) return push_missing(b, kind, path);
  char dest[PATH_BUF], rel_out[PATH_MAX + 8];
  snprintf(rel_out, sizeof rel_out, "files/%s", rel);
  if (join(dest, sizeof dest, b->out, rel_out) != 0) return push_missing(b, kind, path);
  if (make_parents(dest) != 0) {
    snprintf(b->err, sizeof b->err, "cannot create the folders of %.4000s: %s", dest,
             strerror(errno));
    return -1;
  }
  if (link(path, dest) == 0) {
    b->links++;
    return push_entry(b, rel_out, -1);
  }
  if (errno == EEXIST) return 0; /* referenced twice */
  if (errno == ENOENT) return push_missing(b, kind, path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return push_missing(b, kind, path);
    snprintf(b->err, sizeof b->err, "cannot read %.4000s: %s", path, strerror(errno));
    return -1;
  }
  return push_entry(b, rel_out, fd);
}

/* Every regular file under dir, recursively. */
static int take_tree(backup_ctx *b, const char *kind, const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? push_missing(b, kind, dir) : -1;
  struct dirent *e;
  int rc = 0;
  while (rc == 0 && (e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char path[PATH_BUF];
    struct stat sb;
    if (join(path, sizeof path, dir, e->d_name) != 0 || lstat(path, &sb) != 0) continue;
    if (S_ISDIR(sb.st_mode))
      rc = take_tree(b, kind, path);
    else if (S_ISREG(sb.st_mode))
      rc = take_one(b, kind, path);
  }
  closedir(d);
  return rc;
}

static int on_file(const char *kind, const char *path, void *user) {
  backup_ctx *b = user;
  return strcmp(kind, "dataset") == 0 ? take_tree(b, kind, path) : take_one(b, kind, path);
}

/* What the database does not list but a restored kilnd serves: each job's
 * log, spec and profile (copies: a log grows), and the admin token. */
static int copy_extras(backup_ctx *b) {
  char jobs[PATH_MAX + 8], path[PATH_BUF], dest[PATH_BUF], rel[PATH_BUF];
  snprintf(path, sizeof path, "%s/admin.token", b->data_dir);
  if (access(path, F_OK) == 0) {
    snprintf(dest, sizeof dest, "%s/files/admin.token", b->out);
    if (copy_file(path, dest) == 0 && push_entry(b, "files/admin.token", -1) != 0) return -1;
  }
  snprintf(jobs, sizeof jobs, "%s/jobs", b->data_dir);
  DIR *d = opendir(jobs);
  if (!d) return 0;
  struct dirent *job;
  while ((job = readdir(d))) {
    if (job->d_name[0] == '.') continue;
    char dir[PATH_BUF];
    DIR *jd = join(dir, sizeof dir, jobs, job->d_name) == 0 ? opendir(dir) : NULL;
    if (!jd) continue;
    struct dirent *f;
    while ((f = readdir(jd))) {
      struct stat sb;
      if (join(path, sizeof path, dir, f->d_name) != 0 || f->d_name[0] == '.' ||
          strchr(f->d_name, '\n') || lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        continue;
      int n = snprintf(rel, sizeof rel, "files/jobs/%s/%s", job->d_name, f->d_name);
      if (n < 0 || (size_t)n >= sizeof rel || join(dest, sizeof dest, b->out, rel) != 0 ||
          make_parents(dest) != 0 || copy_file(path, dest) != 0)
        continue; /* gone meanwhile */
      b->copies++;
      if (push_entry(b, rel, -1) != 0) {
        closedir(jd);
        closedir(d);
        return -1;
      }
    }
    closedir(jd);
  }
  closedir(d);
  return 0;
}

/* 1 when dir is missing or an empty folder; 0 when it holds something; -1
 * when it is not a folder. */
static int empty_or_absent(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? 1 : -1;
  struct dirent *e;
  int empty = 1;
  while (empty && (e = readdir(d)))
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) empty = 0;
  closedir(d);
  return empty;
}

static int make_dir(const char *dir) {
  char probe[PATH_MAX + 2];
  snprintf(probe, sizeof probe, "%s/", dir);
  return make_parents(probe) == 0 && (mkdir(dir, 0700) == 0 || errno == EEXIST) ? 0 : -1;
}

static int write_manifest(backup_ctx *b, char *err, size_t errlen) {
  char tmp[PATH_MAX + 32], final[PATH_MAX + 32], path[PATH_BUF], hex[65];
  snprintf(tmp, sizeof tmp, "%s/.MANIFEST.tmp", b->out);
  snprintf(final, sizeof final, "%s/MANIFEST", b->out);
  FILE *f = fopen(tmp, "w");
  if (!f) {
    snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
    return -1;
  }
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  fprintf(f, MANIFEST_HEADER "\ndata_dir %s\ncreated %04d-%02d-%02dT%02d:%02d:%02dZ\n", b->data_dir,
          tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
  for (int i = 0; i < b->n; i++) {
    long long bytes = 0;
    if (join(path, sizeof path, b->out, b->entries[i].rel) != 0 ||
        hash_file(path, hex, &bytes) != 0) {
      snprintf(err, errlen, "cannot read back %.4000s: %s", path, strerror(errno));
      fclose(f);
      return -1;
    }
    fprintf(f, "file %s %lld %s\n", hex, bytes, b->entries[i].rel);
  }
  for (int i = 0; i < b->n_missing; i++) fprintf(f, "missing %s\n", b->missing[i]);
  int ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok &= fclose(f) == 0;
  if (!ok || rename(tmp, final) != 0) {
    snprintf(err, errlen, "cannot write %s: %s", final, strerror(errno));
    return -1;
  }
  int dirfd = open(b->out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd >= 0) {
    fsync(dirfd);
    close(dirfd);
  }
  return 0;
}

static void backup_usage(FILE *to) {
  fprintf(to, "usage: kilnd backup [--data-dir DIR] [--pages-per-step N] OUT\n"
              "  a consistent copy of DIR (default ./kiln-data) into the new folder OUT, while\n"
              "  a kilnd may be serving it: the database (SQLite's online backup), the\n"
              "  checkpoint and data set files it references (hard links on the same\n"
              "  filesystem, else copies), each job's log, and OUT/MANIFEST of sha256 sums;\n"
              "  the database is copied N pages at a time (default 64) from one snapshot\n");
}

int kilnd_backup_command(int argc, char **argv, const char *default_data_dir) {
  static const struct option options[] = {{"data-dir", required_argument, NULL, 'd'},
                                          {"pages-per-step", required_argument, NULL, 'p'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
  const char *data_dir = default_data_dir;
  long pages_per_step = PAGES_PER_STEP;
  optind = 2;
  int opt;
  while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
    char *end = NULL;
    if (opt == 'd') {
      data_dir = optarg;
    } else if (opt == 'p') {
      pages_per_step = strtol(optarg, &end, 10);
      if (!*optarg || *end || pages_per_step < 1 || pages_per_step > 1000000) {
        fprintf(stderr,
                "kilnd: backup: --pages-per-step needs a whole number in 1..1000000, got "
                "'%s'\n",
                optarg);
        return 2;
      }
    } else {
      backup_usage(opt == 'h' ? stdout : stderr);
      return opt == 'h' ? 0 : 2;
    }
  }
  if (optind != argc - 1) {
    fprintf(stderr, "kilnd: backup needs one OUT folder\n");
    backup_usage(stderr);
    return 2;
  }
  const char *out = argv[optind];
  char data_abs[PATH_MAX], db[PATH_MAX + 16], snapshot[PATH_MAX + 16], err[PATH_MAX + 512];
  if (!realpath(data_dir, data_abs)) {
    fprintf(stderr, "kilnd: backup: data directory %s: %s\n", data_dir, strerror(errno));
    return 1;
  }
  snprintf(db, sizeof db, "%s/kiln.db", data_abs);
  if (access(db, R_OK | W_OK) != 0) {
    fprintf(stderr, "kilnd: backup: %s is not a kiln data directory (%s: %s)\n", data_dir, db,
            strerror(errno));
    return 1;
  }
  int state = empty_or_absent(out);
  if (state != 1) {
    fprintf(stderr, "kilnd: backup: %s %s; give a new folder\n", out,
            state == 0 ? "is not empty" : "is not a folder");
    return 1;
  }
  char files[PATH_MAX + 8];
  snprintf(files, sizeof files, "%s/files", out);
  if (make_dir(out) != 0 || make_dir(files) != 0) {
    fprintf(stderr, "kilnd: backup: cannot create %s: %s\n", files, strerror(errno));
    return 1;
  }
  /* One descriptor per file taken across filesystems. */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  backup_ctx b = {.data_dir = data_abs, .out = out};
  snprintf(snapshot, sizeof snapshot, "%s/kiln.db", out);
  store_backup_stats stats;
  int rc = 1;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  if (store_backup(db, snapshot, (int)pages_per_step, on_file, &b, &stats, err, sizeof err) !=
      STORE_OK) {
    fprintf(stderr, "kilnd: %s%s%s\n", err, b.err[0] ? ": " : "", b.err);
    goto done;
  }
  for (int i = 0; i < b.n; i++) {
    if (b.entries[i].fd < 0) continue;
    char dest[PATH_BUF];
    if (join(dest, sizeof dest, out, b.entries[i].rel) != 0 ||
        copy_fd(b.entries[i].fd, dest) != 0) {
      fprintf(stderr, "kilnd: backup: cannot copy to %s: %s\n", dest, strerror(errno));
      goto done;
    }
    b.copies++;
  }
  if (push_entry(&b, "kiln.db", -1) != 0 || copy_extras(&b) != 0 ||
      write_manifest(&b, err, sizeof err) != 0) {
    fprintf(stderr, "kilnd: backup: %s\n", err[0] ? err : "out of memory");
    goto done;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("kilnd: backup of %s in %s: database snapshot of %d pages in %d steps, %d files linked, "
         "%d copied, %.2f s\n",
         data_abs, out, stats.pages, stats.steps, b.links, b.copies,
         (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
  for (int i = 0; i < b.n_missing; i++)
    printf("kilnd: warning: the database references %s, which is not on disk under the data "
           "directory; the backup lacks it (listed as missing in MANIFEST)\n",
           b.missing[i]);
  rc = 0;
done:
  for (int i = 0; i < b.n; i++) {
    if (b.entries[i].fd >= 0) close(b.entries[i].fd);
    free(b.entries[i].rel);
  }
  free(b.entries);
  for (int i = 0; i < b.n_missing; i++) free(b.missing[i]);
  free(b.missing);
  return rc;
}

/* ---- restore ---- */

/* A manifest path is relative and stays inside: no "..", no leading '/'. */
static int safe_rel(const char *rel) {
  if (!rel[0] || rel[0] == '/') return 0;
  for (const char *p = rel; *p; p = strchr(p, '/') ? strchr(p, '/') + 1 : p + strlen(p))
    if (strncmp(p, "..", 2) == 0 && (p[2] == '/' || p[2] == '\0')) return 0;
  return strcmp(rel, "kiln.db") == 0 || strncmp(rel, "files/", 6) == 0;
}

static void restore_usage(FILE *to) {
  fprintf(to, "usage: kilnd restore OUT --data-dir DIR\n"
              "  makes the new (or empty) data directory DIR from the backup OUT, after checking\n"
              "  every file against OUT/MANIFEST; kilnd then starts on DIR with every job,\n"
              "  metric point and checkpoint of the backup (running jobs resume)\n");
}

int kilnd_restore_command(int argc, char **argv) {
  static const struct option options[] = {{"data-dir", required_argument, NULL, 'd'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
  const char *data_dir = NULL;
  optind = 2;
  int opt;
  while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
    if (opt == 'd') {
      data_dir = optarg;
    } else {
      restore_usage(opt == 'h' ? stdout : stderr);
      return opt == 'h' ? 0 : 2;
    }
  }
  if (optind != argc - 1 || !data_dir) {
    fprintf(stderr, "kilnd: restore needs the backup folder and --data-dir DIR\n");
    restore_usage(stderr);
    return 2;
  }
  const char *backup = argv[optind];
  char manifest[PATH_MAX + 16], line[PATH_MAX * 2 + 128], old_dir[PATH_MAX] = "";
  snprintf(manifest, sizeof manifest, "%s/MANIFEST", backup);
  FILE *f = fopen(manifest, "r");
  if (!f || !fgets(line, sizeof line, f) || strncmp(line, MANIFEST_HEADER "\n", 14) != 0) {
    fprintf(stderr,
            "kilnd: restore: %s is not a finished kiln backup: %s is missing or not a "
            "manifest\n",
            backup, manifest);
    if (f) fclose(f);
    return 1;
  }
  /* Every file is checked before anything is written. */
  char **rels = NULL;
  int n = 0, cap = 0, missing = 0, rc = 1;
  long long total = 0;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    char hex[65], want_hex[65], path[PATH_BUF];
    long long bytes = 0, got_bytes = 0;
    int used = 0;
    if (strncmp(line, "data_dir ", 9) == 0) {
      snprintf(old_dir, sizeof old_dir, "%.4000s", line + 9);
    } else if (strncmp(line, "missing ", 8) == 0) {
      printf("kilnd: warning: the backup lacks %s (it was missing when the backup was taken)\n",
             line + 8);
      missing++;
    } else if (sscanf(line, "file %64s %lld %n", want_hex, &bytes, &used) == 2 && used > 0) {
      const char *rel = line + used;
      if (!safe_rel(rel)) {
        fprintf(stderr, "kilnd: restore: %s names '%s', which is not a path inside the backup\n",
                manifest, rel);
        goto done;
      }
      if (join(path, sizeof path, backup, rel) != 0 || hash_file(path, hex, &got_bytes) != 0) {
        fprintf(stderr,
                "kilnd: restore: %s cannot be read (%s); the backup is incomplete and "
                "nothing was restored\n",
                path, strerror(errno));
        goto done;
      }
      if (got_bytes != bytes || strcmp(hex, want_hex) != 0) {
        fprintf(stderr,
                "kilnd: restore: %s is damaged: %lld bytes with sha256 %s, but the manifest "
                "says %lld bytes with sha256 %s; nothing was restored\n",
                path, got_bytes, hex, bytes, want_hex);
        goto done;
      }
      if (n == cap) {
        cap = cap ? cap * 2 : 64;
        char **more = realloc(rels, (size_t)cap * sizeof *more);
        if (!more) goto done;
        rels = more;
      }
      if (!(rels[n] = strdup(rel))) goto done;
      n++;
      total += bytes;
    } else if (strncmp(line, "created ", 8) != 0) {
      fprintf(stderr, "kilnd: restore: %s has a line kilnd does not know: '%.80s'\n", manifest,
              line);
      goto done;
    }
  }
  int has_db = 0;
  for (int i = 0; i < n; i++) has_db |= strcmp(rels[i], "kiln.db") == 0;
  if (!old_dir[0] || !has_db) {
    fprintf(stderr, "kilnd: restore: %s lacks its data_dir line or the database\n", manifest);
    goto done;
  }
  int state = empty_or_absent(data_dir);
  if (state != 1) {
    fprintf(stderr,
            "kilnd: restore: %s %s; restore into a new or empty folder, never over a data "
            "directory\n",
            data_dir, state == 0 ? "is not empty" : "is not a folder");
    goto done;
  }
  char new_dir[PATH_MAX], from[PATH_BUF], to[PATH_BUF], db[PATH_MAX + 16];
  if (make_dir(data_dir) != 0 || chmod(data_dir, 0700) != 0 || !realpath(data_dir, new_dir)) {
    fprintf(stderr, "kilnd: restore: cannot create %s: %s\n", data_dir, strerror(errno));
    goto done;
  }
  for (int i = 0; i < n; i++) {
    const char *rel = strcmp(rels[i], "kiln.db") == 0 ? rels[i] : rels[i] + 6;
    if (join(from, sizeof from, backup, rels[i]) != 0 || join(to, sizeof to, new_dir, rel) != 0 ||
        make_parents(to) != 0 || copy_file(from, to) != 0) {
      fprintf(stderr,
              "kilnd: restore: cannot copy %s to %s: %s (%s is incomplete: remove it "
              "before trying again)\n",
              from, to, strerror(errno), data_dir);
      goto done;
    }
  }
  snprintf(db, sizeof db, "%s/kiln.db", new_dir);
  /* Rows name files under the folder the backup was taken in: point them
   * at the copies here (as kilnd does for any moved data directory). */
  int moved = 0;
  char err[PATH_MAX + 512];
  store *st = NULL;
  if (store_open(db, &st, err, sizeof err) != STORE_OK) {
    fprintf(stderr, "kilnd: restore: %s\n", err);
    goto done;
  }
  int relocated = store_relocate(st, new_dir, &moved);
  if (relocated != STORE_OK)
    fprintf(stderr, "kilnd: restore: rewrite the stored paths: %s\n", store_errmsg(st));
  store_close(st);
  if (relocated != STORE_OK) goto done;
  printf("kilnd: restored %s into %s: %d files (%lld bytes) checked against the manifest, %lld "
         "stored paths moved from %s%s\n",
         backup, new_dir, n, total, (long long)moved, old_dir,
         missing ? "; some files were missing from the backup (above)" : "");
  rc = 0;
done:
  fclose(f);
  for (int i = 0; i < n; i++) free(rels[i]);
  free(rels);
  return rc;
}
