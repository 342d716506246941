/* kilnd.c — main() of the kiln server: parses flags, opens the store, makes
 * the first admin token on a fresh install, starts the scheduler and the
 * HTTP daemon, and shuts both down cleanly on SIGINT or SIGTERM (a running
 * job goes back to the queue). `kilnd token create` makes more tokens. */
/* nftw() is an X/Open function. */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "common.h"
#include "kilnd_backup.h"
#include "scheduler.h"
#include "server.h"
#include "storage.h"

#define DEFAULT_LISTEN   "127.0.0.1:8080"
#define DEFAULT_DATA_DIR "./kiln-data"
#define DEFAULT_MAX_BODY (1u << 20)

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER; /* guards stderr lines */

/* Every line of the log goes through here: a control character anywhere in
 * it (a display_name, a trainer's message) is escaped, so one event is one
 * line and none can be forged. */
static void log_line(const char *level, const char *raw) {
  char line[8192];
  kc_log_escape(line, sizeof line, raw, 0);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  pthread_mutex_lock(&log_lock);
  fprintf(stderr, "time=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s %s\n", tm.tm_year + 1900,
          tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, level,
          line);
  pthread_mutex_unlock(&log_lock);
}

static void sched_log(sched_log_level level, const char *line, void *user) {
  (void)user;
  static const char *names[] = {"debug", "info", "warn", "error"};
  log_line(names[level], line);
}

static void usage(FILE *to) {
  fprintf(to,
          "usage: kilnd [options]\n"
          "The kiln training server: a REST API over HTTP/JSON, a job scheduler and a\n"
          "SQLite store.\n\n"
          "  --listen ADDR:PORT     address to serve on (default " DEFAULT_LISTEN
          "; [::1]:8080 for IPv6;\n"
          "                         port 0 picks a free port)\n"
          "  --data-dir DIR         database and job files (default " DEFAULT_DATA_DIR ")\n"
          "  --datasets-dir DIR     built-in data sets (default $KILN_DATASETS_DIR or\n"
          "                         " KILN_DEFAULT_DATASETS_DIR ")\n"
          "  --trainer PATH         the kiln-train binary (default: $KILN_TRAINER, or found\n"
          "                         next to kilnd)\n"
          "  --max-body-bytes N     largest request body accepted (default %u)\n"
          "  --max-upload-bytes N   largest data set upload accepted (default 1 GiB)\n"
          "  --max-connections N    open connections in all (default %u)\n"
          "  --max-connections-per-ip N\n"
          "                         open connections from one client address (default %u)\n"
          "  --header-timeout S     seconds a request's headers may take to arrive; a\n"
          "                         connection that is slower, or idle that long between\n"
          "                         requests, is closed (default %u)\n"
          "  --max-blocked-per-tenant N\n"
          "                         :wait and metrics:watch requests one tenant may have\n"
          "                         open at once; more get 429 (default %u)\n"
          "  --http-threads N       threads serving HTTP (default %u)\n"
          "  --port-file FILE       write the bound port to FILE once serving\n"
          "  --tls-cert FILE        serve HTTPS (TLS 1.2 and 1.3 only) with this PEM\n"
          "                         certificate chain, the server's certificate first\n"
          "  --tls-key FILE         the certificate's PEM private key, unencrypted; refused\n"
          "                         when every user may read it (chmod 600)\n"
          "  --behind-tls-proxy     serve plain HTTP on a non-loopback address because a TLS\n"
          "                         proxy fronts kilnd (docker/nginx.conf); without TLS or\n"
          "                         this flag kilnd listens on loopback only\n"
          "  --preempt              a queued job of higher priority that does not fit stops\n"
          "                         lower-priority ones (they checkpoint, go PREEMPTED, then\n"
          "                         QUEUED and resume)\n"
          "  --pools FILE           device pools, {\"pools\": [{\"name\": \"train\",\n"
          "                         \"device_type\": \"cpu\", \"devices\": [0, 1]}]} (default:\n"
          "                         pool \"default\" of every CPU core, \"gpu\" of every GPU)\n"
          "  --trainer-heartbeat S  a running trainer silent (no progress line) for S seconds\n"
          "                         is killed and its job fails over (default 300; 0: never)\n"
          "  --trainer-memory-max N bytes each trainer may use (default: the machine's memory);\n"
          "                         a job planned above it is refused at create\n"
          "  --trainer-limits MODE  how the limit is applied: auto (a cgroup where\n"
          "                         /sys/fs/cgroup is writable, else RLIMIT_AS), cgroup, rlimit\n"
          "  --planner PATH         kiln-train for --plan-only at create (default: next to kilnd)\n"
          "  --user-max-priority N  the highest priority a user may give a job (default 50)\n"
          "  --tenant-max-devices N, --tenant-max-queued-jobs N, --tenant-max-storage-bytes N\n"
          "                         a tenant's default quotas (default 0: no limit); an admin\n"
          "                         sets one tenant's with PUT /v1/tenants/T/quota\n"
          "  --insecure-no-auth     accept requests without a token, as the default\n"
          "                         tenant's admin (development only; loopback only: a\n"
          "                         request must name a loopback Host, carry no other\n"
          "                         site's Origin, and send its body as application/json)\n"
          "  --metrics-auth MODE    token (default): /metrics needs an admin token;\n"
          "                         public: /metrics needs none (every tenant summed)\n"
          "  -h, --help             this help\n\n"
          "  kilnd token create --tenant NAME [--role user|admin] [--data-dir DIR]\n"
          "                         make a bearer token for a tenant and print it (once)\n"
          "  kilnd token create --role agent [--data-dir DIR]\n"
          "                         make a token for kiln-agents (the /v1/agents routes only)\n"
          "  kilnd backup [--data-dir DIR] OUT\n"
          "                         a consistent copy of DIR into the new folder OUT while\n"
          "                         kilnd serves it: the database, the checkpoint and data\n"
          "                         set files it references, job logs, a sha256 MANIFEST\n"
          "  kilnd restore OUT --data-dir DIR\n"
          "                         a new data directory DIR from the backup OUT, checked\n"
          "                         against its MANIFEST first\n\n"
          "multi_worker and parameter_server jobs run under mpirun ($KILN_MPIRUN, or mpirun\n"
          "on PATH). A Slurm pool's batch jobs run kiln-agent ($KILN_AGENT, or kiln-agent\n"
          "on the nodes' PATH), and kilnd asks Slurm about each every $KILN_SLURM_POLL_MS\n"
          "milliseconds (default 1000).\n"
          "Requests need 'Authorization: Bearer TOKEN'. On first start kilnd makes an\n"
          "admin token and stores it in DATA_DIR/admin.token (mode 0600). Everything\n"
          "under DATA_DIR is its owner's alone (folders 0700, files 0600).\n",
          DEFAULT_MAX_BODY, HTTP_DEFAULT_MAX_CONNECTIONS, HTTP_DEFAULT_MAX_CONNECTIONS_PER_IP,
          HTTP_DEFAULT_HEADER_TIMEOUT_S, HTTP_DEFAULT_MAX_BLOCKED_PER_TENANT, HTTP_DEFAULT_THREADS);
}

/* nftw's callback: drops the group and other bits of what kilnd keeps. */
static int tightened;
static int tighten(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)ftw;
  if (flag == FTW_SL || (sb->st_mode & 0077) == 0) return 0;
  if (chmod(path, sb->st_mode & 0700) == 0) tightened++;
  return 0;
}

/* The data directory (and the folders above it) made owner-only, 0700; an
 * existing one from an older kilnd is tightened, everything in it. */
static int make_data_dir(const char *dir) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s", dir);
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(path, 0700) != 0 && errno != EEXIST) break;
    *p = '/';
  }
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
    fprintf(stderr, "kilnd: cannot create data directory %s: %s\n", dir, strerror(errno));
    return -1;
  }
  tightened = 0;
  if (nftw(dir, tighten, 16, FTW_PHYS) != 0) {
    fprintf(stderr, "kilnd: cannot tighten the modes under %s: %s\n", dir, strerror(errno));
    return -1;
  }
  return 0;
}

/* `kilnd token create --tenant T [--role R] [--data-dir D]`: prints the
 * token. An agent token (--role agent) needs no tenant. */
static int token_command(int argc, char **argv) {
  static const struct option options[] = {{"tenant", required_argument, NULL, 't'},
                                          {"role", required_argument, NULL, 'r'},
                                          {"data-dir", required_argument, NULL, 'd'},
                                          {NULL, 0, NULL, 0}};
  const char *tenant = NULL, *role = "user", *data_dir = DEFAULT_DATA_DIR;
  if (argc < 3 || strcmp(argv[2], "create") != 0) {
    fprintf(stderr, "kilnd: usage: kilnd token create --tenant NAME [--role user|admin] "
                    "[--data-dir DIR]\n"
                    "       kilnd token create --role agent [--data-dir DIR]\n");
    return 2;
  }
  optind = 3;
  int opt;
  while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
    switch (opt) {
    case 't': tenant = optarg; break;
    case 'r': role = optarg; break;
    case 'd': data_dir = optarg; break;
    default: return 2;
    }
  }
  if (!tenant && strcmp(role, "agent") == 0) tenant = HTTP_AGENT_TENANT;
  if (!tenant || optind < argc) {
    fprintf(stderr, "kilnd: token create needs --tenant NAME (none for --role agent) and "
                    "nothing else\n");
    return 2;
  }
  char db_path[PATH_MAX + 16], err[512], token[HTTP_TOKEN_LEN];
  /* A fresh install: the folder and the schema are made here, as kilnd's
   * first start would. */
  if (make_data_dir(data_dir) != 0) return 1;
  snprintf(db_path, sizeof db_path, "%s/kiln.db", data_dir);
  store *st = NULL;
  if (store_open(db_path, &st, err, sizeof err) != STORE_OK) {
    fprintf(stderr, "kilnd: %s\n", err);
    return 1;
  }
  int rc = http_token_create(st, tenant, role, token, err, sizeof err);
  store_close(st);
  if (rc != 0) {
    fprintf(stderr, "kilnd: token create: %s\n", err);
    return 2;
  }
  printf("%s\n", token);
  return 0;
}

/* A fresh install has no token: make an admin one and keep it in a file only
 * its owner can read, so the first curl has something to send. */
static int bootstrap_admin_token(store *st, const char *data_dir, char *path, size_t pathlen,
                                 int *created) {
  int64_t n = 0;
  *created = 0;
  if (store_token_count(st, &n) != STORE_OK) return -1;
  if (n > 0) return 0;
  char token[HTTP_TOKEN_LEN], err[256];
  if (http_token_create(st, STORE_DEFAULT_TENANT, "admin", token, err, sizeof err) != 0) {
    fprintf(stderr, "kilnd: %s\n", err);
    return -1;
  }
  snprintf(path, pathlen, "%s/admin.token", data_dir);
  unlink(path); /* a stale file from an older database: replace it */
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    fprintf(stderr, "kilnd: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  size_t len = strlen(token);
  int ok = write(fd, token, len) == (ssize_t)len && write(fd, "\n", 1) == 1 && fsync(fd) == 0;
  ok &= close(fd) == 0;
  if (!ok) {
    fprintf(stderr, "kilnd: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  *created = 1;
  return 0;
}

/* host and port from "127.0.0.1:8080" or "[::1]:8080". */
static int parse_listen(const char *text, char *host, size_t hostlen, int *port) {
  const char *colon;
  if (text[0] == '[') {
    const char *close = strchr(text, ']');
    if (!close || close[1] != ':') return -1;
    snprintf(host, hostlen, "%.*s", (int)(close - text - 1), text + 1);
    colon = close + 1;
  } else {
    colon = strrchr(text, ':');
    if (!colon) return -1;
    snprintf(host, hostlen, "%.*s", (int)(colon - text), text);
  }
  char *end = NULL;
  long p = strtol(colon + 1, &end, 10);
  if (!colon[1] || *end || p < 0 || p > 65535) return -1;
  *port = (int)p;
  return host[0] ? 0 : -1;
}

static int executable(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && access(path, X_OK) == 0;
}

/* kiln-train next to kilnd (installed) or in the build tree's worker/. */
static int find_trainer(char *out, size_t len) {
  const char *env = getenv("KILN_TRAINER");
  if (env && *env) {
    snprintf(out, len, "%s", env);
    return executable(out) ? 0 : -1;
  }
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return -1;
  exe[n] = '\0';
  char *slash = strrchr(exe, '/');
  if (!slash) return -1;
  *slash = '\0';
  const char *candidates[] = {"kiln-train", "../worker/kiln-train"};
  for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++) {
    int used = snprintf(out, len, "%s/%s", exe, candidates[i]);
    if (used > 0 && (size_t)used < len && executable(out)) return 0;
  }
  return -1;
}

/* An integer flag's value within [lo, hi]; -1 (having said why) when not. */
static long parse_count(const char *flag, const char *text, long lo, long hi) {
  char *end = NULL;
  long v = strtol(text, &end, 10);
  if (!*text || *end || v < lo || v > hi) {
    fprintf(stderr, "kilnd: %s needs a whole number in %ld..%ld, got '%s'\n", flag, lo, hi, text);
    return -1;
  }
  return v;
}

/* The machine's memory: a trainer's default limit. */
static long long physical_memory(void) {
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? (long long)pages * size : 0;
}

static int is_loopback(const char *host) {
  return strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0;
}

int main(int argc, char **argv) {
  /* What kilnd and the trainers it spawns write is theirs alone. */
  umask(077);
  if (argc >= 2 && strcmp(argv[1], "token") == 0) return token_command(argc, argv);
  if (argc >= 2 && strcmp(argv[1], "backup") == 0)
    return kilnd_backup_command(argc, argv, DEFAULT_DATA_DIR);
  if (argc >= 2 && strcmp(argv[1], "restore") == 0) return kilnd_restore_command(argc, argv);
  static const struct option options[] = {
      {"listen", required_argument, NULL, 'l'},
      {"data-dir", required_argument, NULL, 'd'},
      {"datasets-dir", required_argument, NULL, 's'},
      {"trainer", required_argument, NULL, 't'},
      {"max-body-bytes", required_argument, NULL, 'b'},
      {"max-upload-bytes", required_argument, NULL, 'u'},
      {"port-file", required_argument, NULL, 'p'},
      {"insecure-no-auth", no_argument, NULL, 'i'},
      {"preempt", no_argument, NULL, 'P'},
      {"pools", required_argument, NULL, 'o'},
      {"metrics-auth", required_argument, NULL, 'm'},
      {"max-connections", required_argument, NULL, 'C'},
      {"max-connections-per-ip", required_argument, NULL, 'I'},
      {"header-timeout", required_argument, NULL, 'T'},
      {"max-blocked-per-tenant", required_argument, NULL, 'B'},
      {"http-threads", required_argument, NULL, 'H'},
      {"trainer-heartbeat", required_argument, NULL, 'W'},
      {"trainer-memory-max", required_argument, NULL, 'M'},
      {"trainer-limits", required_argument, NULL, 'L'},
      {"planner", required_argument, NULL, 'N'},
      {"user-max-priority", required_argument, NULL, 'Q'},
      {"tenant-max-devices", required_argument, NULL, 'D'},
      {"tenant-max-queued-jobs", required_argument, NULL, 'J'},
      {"tenant-max-storage-bytes", required_argument, NULL, 'S'},
      {"tls-cert", required_argument, NULL, 'c'},
      {"tls-key", required_argument, NULL, 'k'},
      {"behind-tls-proxy", no_argument, NULL, 'X'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  const char *listen = DEFAULT_LISTEN, *data_dir = DEFAULT_DATA_DIR;
  const char *datasets_dir = getenv("KILN_DATASETS_DIR"), *port_file = NULL, *pools = NULL;
  char trainer[PATH_MAX] = "";
  long max_body = DEFAULT_MAX_BODY;
  long long max_upload = 1LL << 30;
  int opt, no_auth = 0, preempt = 0, metrics_public = 0;
  long max_connections = HTTP_DEFAULT_MAX_CONNECTIONS, per_ip = HTTP_DEFAULT_MAX_CONNECTIONS_PER_IP,
       header_timeout = HTTP_DEFAULT_HEADER_TIMEOUT_S,
       blocked = HTTP_DEFAULT_MAX_BLOCKED_PER_TENANT, http_threads = HTTP_DEFAULT_THREADS;
  int64_t heartbeat_s = 300, memory_max = 0;
  const char *limits_mode = "auto";
  const char *tls_cert = NULL, *tls_key = NULL;
  int behind_proxy = 0;
  char planner[PATH_MAX] = "";
  store_quota defaults = {.max_priority = 50};
  const time_t started = time(NULL);
  while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
    char *end = NULL;
    switch (opt) {
    case 'W':
      if ((heartbeat_s = parse_count("--trainer-heartbeat", optarg, 0, 86400 * 7)) < 0) return 2;
      break;
    case 'M':
      if ((memory_max = parse_count("--trainer-memory-max", optarg, 1 << 20, 1L << 50)) < 0)
        return 2;
      break;
    case 'L':
      if (strcmp(optarg, "auto") != 0 && strcmp(optarg, "cgroup") != 0 &&
          strcmp(optarg, "rlimit") != 0) {
        fprintf(stderr, "kilnd: --trainer-limits needs auto, cgroup or rlimit, got '%s'\n", optarg);
        return 2;
      }
      limits_mode = optarg;
      break;
    case 'N': snprintf(planner, sizeof planner, "%s", optarg); break;
    case 'Q':
      if ((defaults.max_priority = parse_count("--user-max-priority", optarg, 0, 100)) < 0)
        return 2;
      break;
    case 'D':
      if ((defaults.max_devices = parse_count("--tenant-max-devices", optarg, 0, 1 << 20)) < 0)
        return 2;
      break;
    case 'J':
      if ((defaults.max_queued_jobs = parse_count("--tenant-max-queued-jobs", optarg, 0, 1 << 30)) <
          0)
        return 2;
      break;
    case 'S':
      if ((defaults.max_storage_bytes =
               parse_count("--tenant-max-storage-bytes", optarg, 0, 1L << 60)) < 0)
        return 2;
      break;
    case 'l': listen = optarg; break;
    case 'd': data_dir = optarg; break;
    case 's': datasets_dir = optarg; break;
    case 't': snprintf(trainer, sizeof trainer, "%s", optarg); break;
    case 'p': port_file = optarg; break;
    case 'c': tls_cert = optarg; break;
    case 'k': tls_key = optarg; break;
    case 'X': behind_proxy = 1; break;
    case 'i': no_auth = 1; break;
    case 'P': preempt = 1; break;
    case 'o': pools = optarg; break;
    case 'm':
      if (strcmp(optarg, "token") != 0 && strcmp(optarg, "public") != 0) {
        fprintf(stderr, "kilnd: --metrics-auth must be token or public, got '%s'\n", optarg);
        return 2;
      }
      metrics_public = strcmp(optarg, "public") == 0;
      break;
    case 'b':
      max_body = strtol(optarg, &end, 10);
      if (!*optarg || *end || max_body < 1024 || max_body > (1L << 30)) {
        fprintf(stderr, "kilnd: --max-body-bytes needs 1024..1073741824, got '%s'\n", optarg);
        return 2;
      }
      break;
    case 'u':
      max_upload = strtoll(optarg, &end, 10);
      if (!*optarg || *end || max_upload < 1024 || max_upload > (1LL << 40)) {
        fprintf(stderr, "kilnd: --max-upload-bytes needs 1024..1099511627776, got '%s'\n", optarg);
        return 2;
      }
      break;
    case 'C':
      if ((max_connections = parse_count("--max-connections", optarg, 1, 1000000)) < 0) return 2;
      break;
    case 'I':
      if ((per_ip = parse_count("--max-connections-per-ip", optarg, 1, 1000000)) < 0) return 2;
      break;
    case 'T':
      if ((header_timeout = parse_count("--header-timeout", optarg, 1, 3600)) < 0) return 2;
      break;
    case 'B':
      if ((blocked = parse_count("--max-blocked-per-tenant", optarg, 1, 1000000)) < 0) return 2;
      break;
    case 'H':
      if ((http_threads = parse_count("--http-threads", optarg, 1, 256)) < 0) return 2;
      break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "kilnd: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  char host[256];
  int port;
  if (parse_listen(listen, host, sizeof host, &port) != 0) {
    fprintf(stderr, "kilnd: --listen needs ADDR:PORT (e.g. 127.0.0.1:8080), got '%s'\n", listen);
    return 2;
  }
  if (no_auth && !is_loopback(host)) {
    fprintf(stderr,
            "kilnd: --insecure-no-auth serves without tokens and is refused on '%s'; it binds "
            "only to loopback (127.0.0.1 or ::1)\n",
            host);
    return 2;
  }
  if (!tls_cert != !tls_key) {
    fprintf(stderr, "kilnd: --tls-cert and --tls-key go together: give both, or neither\n");
    return 2;
  }
  if (!tls_cert && !behind_proxy && !is_loopback(host)) {
    fprintf(stderr,
            "kilnd: refusing to serve plain HTTP on '%s', which is not a loopback address: "
            "bearer tokens would cross the network in the clear. Serve HTTPS with --tls-cert "
            "FILE --tls-key FILE, or pass --behind-tls-proxy when a TLS proxy (such as "
            "docker/nginx.conf) fronts kilnd\n",
            host);
    return 2;
  }
  /* Static: kept for the daemon's life, and reachable on every way out. */
  static char *tls_cert_pem = NULL, *tls_key_pem = NULL;
  if (tls_cert) {
    char tls_err[1024];
    if (http_tls_load(tls_cert, tls_key, &tls_cert_pem, &tls_key_pem, tls_err, sizeof tls_err) !=
        0) {
      fprintf(stderr, "kilnd: %s\n", tls_err);
      return 2;
    }
  }
  if (!datasets_dir || !*datasets_dir) datasets_dir = KILN_DEFAULT_DATASETS_DIR;
  if (!trainer[0] && find_trainer(trainer, sizeof trainer) != 0) {
    fprintf(stderr, "kilnd: cannot find kiln-train next to kilnd; pass --trainer PATH\n");
    return 1;
  }
  if (!executable(trainer)) {
    fprintf(stderr, "kilnd: trainer '%s' is not an executable file\n", trainer);
    return 1;
  }
  if (make_data_dir(data_dir) != 0) return 1;
  /* Absolute paths from here on: they are stored (checkpoint paths) and
   * handed to kiln-train, and must mean the same from anywhere. */
  char data_abs[PATH_MAX], trainer_abs[PATH_MAX];
  if (!realpath(data_dir, data_abs) || !realpath(trainer, trainer_abs)) {
    fprintf(stderr, "kilnd: cannot resolve %s or %s: %s\n", data_dir, trainer, strerror(errno));
    return 1;
  }
  data_dir = data_abs;
  snprintf(trainer, sizeof trainer, "%s", trainer_abs);
  /* The planner is the real kiln-train even when --trainer names another
   * program that speaks its progress protocol. */
  if (!planner[0] && find_trainer(planner, sizeof planner) != 0) planner[0] = '\0';
  if (planner[0] && !executable(planner)) {
    fprintf(stderr, "kilnd: planner '%s' is not an executable file\n", planner);
    return 1;
  }
  if (memory_max == 0) memory_max = physical_memory();

  /* Signals are taken by sigwait below; every thread starts with them blocked. */
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
  signal(SIGPIPE, SIG_IGN);

  char db_path[PATH_MAX + 16], jobs_dir[PATH_MAX + 16], err[512], line[3 * PATH_MAX];
  char uploads_dir[PATH_MAX + 16];
  snprintf(db_path, sizeof db_path, "%s/kiln.db", data_dir);
  snprintf(jobs_dir, sizeof jobs_dir, "%s/jobs", data_dir);
  snprintf(uploads_dir, sizeof uploads_dir, "%s/datasets", data_dir);
  /* kiln-train finds uploaded data sets here (it inherits the environment). */
  setenv("KILN_UPLOADS_DIR", uploads_dir, 1);
  /* What a kilnd killed mid-upload or mid-plan left: nothing of this
   * process's yet, so everything older than its start. */
  int swept = http_sweep_stale(uploads_dir, ".upload-", started) +
              http_sweep_stale(jobs_dir, ".plan-", started);
  store *st = NULL;
  if (store_open(db_path, &st, err, sizeof err) != STORE_OK) {
    fprintf(stderr, "kilnd: %s\n", err);
    return 1;
  }
  /* A data directory moved here from another folder names its files there. */
  int relocated = 0;
  if (store_relocate(st, data_dir, &relocated) != STORE_OK) {
    fprintf(stderr, "kilnd: %s\n", store_errmsg(st));
    store_close(st);
    return 1;
  }
  /* Requests commit through this handle: none of them pays for a checkpoint. */
  if (store_checkpoint_in_background(st) != STORE_OK) {
    fprintf(stderr, "kilnd: %s\n", store_errmsg(st));
    store_close(st);
    return 1;
  }
  char token_path[PATH_MAX + 16] = "";
  int token_created = 0;
  if (!no_auth &&
      bootstrap_admin_token(st, data_dir, token_path, sizeof token_path, &token_created) != 0) {
    fprintf(stderr, "kilnd: cannot create the first admin token: %s\n", store_errmsg(st));
    store_close(st);
    return 1;
  }
  /* How often a Slurm pool's batch jobs are asked about: a large cluster's
   * controller may want fewer squeue calls. */
  const char *poll_env = getenv("KILN_SLURM_POLL_MS");
  char *poll_end = NULL;
  long slurm_poll_ms = poll_env && *poll_env ? strtol(poll_env, &poll_end, 10) : 0;
  if (poll_env && *poll_env && (*poll_end || slurm_poll_ms < 100 || slurm_poll_ms > 600000)) {
    fprintf(stderr, "kilnd: KILN_SLURM_POLL_MS must be milliseconds from 100 to 600000, got '%s'\n",
            poll_env);
    store_close(st);
    return 1;
  }
  sched_config sc = {.db_path = db_path,
                     .jobs_dir = jobs_dir,
                     .trainer_path = trainer,
                     .datasets_dir = datasets_dir,
                     .mpirun_path = getenv("KILN_MPIRUN"), /* NULL: mpirun on PATH */
                     .agent_path = getenv("KILN_AGENT"),   /* NULL: kiln-agent on PATH */
                     .slurm_poll_ms = (int)slurm_poll_ms,
                     .preempt = preempt,
                     .pools_path = pools,
                     .heartbeat_s = (int)heartbeat_s,
                     .memory_max_bytes = memory_max,
                     .limits_mode = limits_mode,
                     .quota_defaults = defaults,
                     .log = sched_log};
  sched *scheduler = NULL;
  if (sched_start(&sc, &scheduler, err, sizeof err) != 0) {
    fprintf(stderr, "kilnd: scheduler: %s\n", err);
    store_close(st);
    return 1;
  }
  http_config hc = {.host = host,
                    .port = port,
                    .max_body_bytes = (size_t)max_body,
                    .datasets_dir = datasets_dir,
                    .jobs_dir = jobs_dir,
                    .insecure_no_auth = no_auth,
                    .metrics_public = metrics_public,
                    .uploads_dir = uploads_dir,
                    .trainer_path = trainer,
                    .max_upload_bytes = (size_t)max_upload,
                    .st = st,
                    .scheduler = scheduler,
                    .max_connections = (unsigned)max_connections,
                    .max_connections_per_ip = (unsigned)per_ip,
                    .header_timeout_s = (unsigned)header_timeout,
                    .max_blocked_per_tenant = (unsigned)blocked,
                    .threads = (unsigned)http_threads,

                    .planner_path = planner[0] ? planner : NULL,
                    .memory_budget_bytes = memory_max,
                    .quota_defaults = defaults,
                    .tls_cert_pem = tls_cert_pem,
                    .tls_key_pem = tls_key_pem};
  http_server *srv = NULL;
  if (http_server_start(&hc, &srv, err, sizeof err) != 0) {
    fprintf(stderr, "kilnd: %s\n", err);
    sched_stop(scheduler);
    store_close(st);
    return 1;
  }
  int bound = http_server_port(srv);
  snprintf(line, sizeof line,
           "msg=\"kilnd serving\" listen=%s%s%s:%d scheme=%s data_dir=%s schema_version=%d "
           "trainer=%s",
           strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "", bound,
           tls_cert ? "https" : "http", data_dir, store_schema_version(st), trainer);
  log_line("info", line);
  if (token_created) {
    snprintf(line, sizeof line,
             "msg=\"created the first admin token; send it as 'Authorization: Bearer TOKEN'\" "
             "path=%s mode=0600",
             token_path);
    log_line("info", line);
  }
  if (tightened > 0) {
    snprintf(line, sizeof line,
             "msg=\"made the data directory owner-only\" data_dir=%s paths_tightened=%d", data_dir,
             tightened);
    log_line("warn", line);
  }
  if (relocated > 0) {
    snprintf(line, sizeof line,
             "msg=\"the data directory moved: its checkpoint and data set rows now name their "
             "files under it\" data_dir=%s rows=%d",
             data_dir, relocated);
    log_line("warn", line);
  }
  if (swept) {
    snprintf(line, sizeof line, "msg=\"removed what an earlier kilnd left unfinished\" count=%d",
             swept);
    log_line("info", line);
  }
  if (!planner[0])
    log_line("warn", "msg=\"no kiln-train next to kilnd to plan jobs' memory; jobs are not "
                     "checked against --trainer-memory-max at create (pass --planner PATH)\"");
  if (no_auth) {
    log_line("warn", "msg=\"--insecure-no-auth: every request acts as the default tenant's "
                     "admin; for development on loopback only\"");
  }
  for (int i = 0; i < api_builtin_dataset_count(); i++) {
    const api_builtin_dataset *d = api_builtin_dataset_at(i);
    char path[PATH_MAX];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s/%s", datasets_dir, d->dir, d->train_images);
    snprintf(line, sizeof line, "msg=\"dataset %s\" name=%s path=%s/%s",
             stat(path, &sb) == 0 ? "ready" : "missing", d->name, datasets_dir, d->dir);
    log_line(stat(path, &sb) == 0 ? "info" : "warn", line);
  }
  if (port_file) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%d\n", bound) < 0 || fclose(f) != 0 || rename(tmp, port_file) != 0) {
      snprintf(line, sizeof line, "msg=\"cannot write port file\" path=%s", port_file);
      log_line("error", line);
    }
  }

  int sig = 0;
  sigwait(&stop_signals, &sig);
  snprintf(line, sizeof line, "msg=\"stopping\" signal=%s", strsignal(sig));
  log_line("info", line);
  http_server_stop(srv);
  sched_stop(scheduler);
  store_close(st);
  free(tls_cert_pem);
  free(tls_key_pem);
  log_line("info", "msg=\"stopped\"");
  return 0;
}
