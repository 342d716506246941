/* kiln_train.c — main() of kiln-train: trains ONE job from a job spec. kilnd
 * runs it with --progress-fd to read JSON progress lines; run alone it
 * prints progress for a person; --export-onnx writes the model as ONNX.
 * Exit status: 0 trained, 2 usage, 3 invalid spec (or a model the export
 * refuses), 4 data error, 5 numeric error (NaN/inf loss), 6 stopped by
 * SIGTERM after writing a checkpoint, 1 anything else. */
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "engine.h"
#include "worker.h"

#ifdef KILN_HAVE_MPI
#include <mpi.h>
#endif
#if defined(__SANITIZE_ADDRESS__) && defined(KILN_HAVE_MPI)
/* The sanitizer build: Open MPI keeps what its start allocates past
 * MPI_Finalize, and its progress thread drops a few bytes in libevent's
 * loop. Whole stacks on malloc (kiln-train mallocs little) let these
 * suppressions name Open MPI's own; every other leak stays an error. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
  return "fast_unwind_on_malloc=0";
}
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) {
  return "leak:ompi_mpi_init\nleak:ompi_mpi_finalize\nleak:orte_finalize\nleak:event_base_loop\n";
}
#endif

enum {
  EXIT_USAGE = 2,
  EXIT_SPEC = 3,
  EXIT_DATA = 4,
  EXIT_NUMERIC = 5,
  EXIT_STOPPED = 6,
  EXIT_NOMEM = 7 /* memory ran out: its limit or the machine's */
};

/* Set by SIGTERM (cancel, preemption, kilnd stopping): the training loop
 * checkpoints after the step in flight and returns, so no finished step is
 * thrown away; kilnd kills whatever is left after its grace period. */
static volatile sig_atomic_t stop_requested;

/* multi_worker: MPI was started, and how many processes run the job. */
static int mpi_started, mpi_world = 1;
/* This process among those on its machine (its GPUs are its own share). */
static int mpi_local_rank, mpi_local_size = 1;

static void on_sigterm(int sig) {
  (void)sig;
  stop_requested = 1;
}

typedef struct reporter {
  int progress_fd; /* JSON lines here; -1 = human text on stdout */
  int quiet;       /* a multi_worker rank other than 0: rank 0 speaks for the job */
  int epochs;
  int64_t steps_per_epoch;
} reporter;

static void write_line(int fd, const char *line) {
  size_t len = strlen(line);
  char *buf = malloc(len + 1);
  if (!buf) return;
  memcpy(buf, line, len);
  buf[len] = '\n';
  size_t off = 0;
  while (off < len + 1) {
    ssize_t w = write(fd, buf + off, len + 1 - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break; /* the reader is gone; training goes on, the exit status tells */
    off += (size_t)w;
  }
  free(buf);
}

static void emit(const reporter *r, const api_progress *p) {
  if (r->progress_fd < 0) return;
  char *line = api_progress_format(p);
  if (line) write_line(r->progress_fd, line);
  free(line);
}

/* Readable lines go to standard output (kilnd keeps it as the job's log)
 * unless --json made it the progress stream itself. */
static int readable_stdout(const reporter *r) {
  return r->progress_fd != STDOUT_FILENO;
}

/* Status lines: readable on standard output, and to the progress stream. */
static void report_status(const reporter *r, const char *phase, const char *message) {
  if (r->quiet) return;
  if (readable_stdout(r)) {
    printf("%s\n", message);
    fflush(stdout);
  }
  if (r->progress_fd < 0) return;
  api_progress p = {.kind = API_PROGRESS_STATUS};
  snprintf(p.reason, sizeof p.reason, "%s", phase);
  snprintf(p.message, sizeof p.message, "%s", message);
  emit(r, &p);
}

static int fail(const reporter *r, int status, const char *reason, const char *message) {
  fprintf(stderr, "kiln-train: %s: %s\n", reason, message);
  if (r->progress_fd >= 0) {
    api_progress p = {.kind = API_PROGRESS_ERROR};
    snprintf(p.reason, sizeof p.reason, "%s", reason);
    snprintf(p.message, sizeof p.message, "%s", message);
    emit(r, &p);
  }
  return status;
}

static void copy_callback(const api_callback *from, kn_monitor_mode *mode, char *monitor,
                          size_t monitor_len, double *min_delta, int *patience) {
  snprintf(monitor, monitor_len, "%s", from->monitor);
  *mode = from->mode_max ? KN_MODE_MAX : KN_MODE_MIN;
  *min_delta = from->min_delta;
  *patience = from->patience;
}

/* The spec's schedule and callbacks, in the engine's terms. */
static void worker_loop_options(const api_job_spec *spec, kn_train_config *tc) {
  static const kn_schedule_type types[] = {[API_SCHEDULE_CONSTANT] = KN_SCHEDULE_CONSTANT,
                                           [API_SCHEDULE_STEP] = KN_SCHEDULE_STEP,
                                           [API_SCHEDULE_EXPONENTIAL] = KN_SCHEDULE_EXPONENTIAL,
                                           [API_SCHEDULE_COSINE] = KN_SCHEDULE_COSINE};
  const api_schedule *sc = &spec->schedule;
  tc->schedule = (kn_lr_schedule){.type = types[sc->type],
                                  .warmup_steps = sc->warmup_steps,
                                  .step_size = sc->step_size,
                                  .gamma = sc->gamma,
                                  .decay_steps = sc->decay_steps,
                                  .decay_rate = sc->decay_rate,
                                  .staircase = sc->staircase,
                                  .alpha = sc->alpha};
  kn_early_stopping *e = &tc->early_stopping;
  e->enabled = spec->early_stopping.enabled;
  copy_callback(&spec->early_stopping, &e->mode, e->monitor, sizeof e->monitor, &e->min_delta,
                &e->patience);
  kn_reduce_on_plateau *p = &tc->plateau;
  p->enabled = spec->plateau.enabled;
  copy_callback(&spec->plateau, &p->mode, p->monitor, sizeof p->monitor, &p->min_delta,
                &p->patience);
  p->factor = spec->plateau.factor;
  p->cooldown = spec->plateau.cooldown;
  p->min_lr = spec->plateau.min_lr;
}

static int on_event(const kn_train_event *ev, void *user) {
  const reporter *r = user;
  if (r->quiet) return 0;
  if (ev->kind == KN_EVENT_NOTICE) { /* a callback acted: into the job's events */
    report_status(r, ev->code, ev->message);
    return 0;
  }
  if (r->progress_fd >= 0) {
    api_progress p = {.step = ev->step, .epoch = ev->epoch};
    if (ev->kind == KN_EVENT_CHECKPOINT) {
      p.kind = API_PROGRESS_CHECKPOINT;
      snprintf(p.path, sizeof p.path, "%s", ev->path);
      p.bytes = ev->checkpoint->bytes;
      memcpy(p.sha256, ev->checkpoint->sha256, sizeof p.sha256);
    } else {
      p.kind = API_PROGRESS_METRICS;
      for (int i = 0; i < ev->n_metrics && i < API_MAX_METRICS; i++) {
        snprintf(p.metric_names[i], sizeof p.metric_names[i], "%s", ev->names[i]);
        p.metric_values[i] = ev->values[i];
        p.n_metrics++;
      }
    }
    emit(r, &p);
  }
  /* The same, readable, into the log. */
  if (!readable_stdout(r)) return 0;
  switch (ev->kind) {
  case KN_EVENT_STEP: /* steps over the whole run, as the metrics and "done at step" count */
    printf("epoch %d/%d  step %lld/%lld", ev->epoch, r->epochs, (long long)ev->step,
           (long long)r->steps_per_epoch * r->epochs);
    break;
  case KN_EVENT_EPOCH:
    printf("epoch %d/%d  done at step %lld", ev->epoch, r->epochs, (long long)ev->step);
    break;
  case KN_EVENT_EVAL:
    printf("epoch %d/%d  validation at step %lld", ev->epoch, r->epochs, (long long)ev->step);
    break;
  case KN_EVENT_NOTICE: break; /* handled above */
  case KN_EVENT_CHECKPOINT:
    printf("checkpoint %s (%lld bytes, sha256 %s)", ev->path, (long long)ev->checkpoint->bytes,
           ev->checkpoint->sha256);
    break;
  }
  for (int i = 0; i < ev->n_metrics; i++) printf("  %s %.4f", ev->names[i], ev->values[i]);
  printf("  (%.1f s)\n", ev->seconds);
  fflush(stdout);
  return 0;
}

/* The auto-tuner's choice, as a status line kilnd records in the job's
 * events (phase "pipeline"). */
static void on_tuned(const kn_pipeline_stats *st, void *user) {
  char msg[256];
  snprintf(msg, sizeof msg,
           "pipeline auto-tuned: %d producer threads, prefetch %d batches (producer %.2f ms per "
           "batch, consumer %.2f ms per batch), %.1f MiB held",
           st->threads, st->prefetch, st->produce_ms, st->consume_ms,
           (double)st->memory_bytes / (1 << 20));
  report_status(user, "pipeline", msg);
}

static char *read_file(const char *path, size_t *len, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 16, used = 0;
  char *buf = malloc(cap);
  while (buf) {
    size_t got = fread(buf + used, 1, cap - used - 1, f);
    used += got;
    if (got == 0) break;
    if (used + 1 == cap) {
      char *bigger = cap < (64u << 20) ? realloc(buf, cap * 2) : NULL;
      if (!bigger) {
        free(buf);
        buf = NULL;
        snprintf(err, errlen, "%s is larger than 64 MiB or memory ran out", path);
        break;
      }
      buf = bigger;
      cap *= 2;
    }
  }
  if (buf && ferror(f)) {
    snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
    free(buf);
    buf = NULL;
  } else if (!buf && !err[0]) {
    snprintf(err, errlen, "out of memory reading %s", path);
  }
  fclose(f);
  if (buf) {
    buf[used] = '\0';
    *len = used;
  }
  return buf;
}

static void usage(FILE *to) {
  fprintf(to, "usage: kiln-train [options] SPEC.json\n"
              "Trains one job from a kiln job spec.\n\n"
              "  --data-dir DIR        where built-in data sets live (default $KILN_DATASETS_DIR\n"
              "                        or " KILN_DEFAULT_DATASETS_DIR ")\n"
              "  --uploads-dir DIR     where uploaded data sets live, one folder per id (default\n"
              "                        $KILN_UPLOADS_DIR, or ./datasets)\n"
              "  --checkpoint-dir DIR  where checkpoints are written (default: current directory)\n"
              "  --resume CHECKPOINT   continue the run that wrote CHECKPOINT (a .safetensors\n"
              "                        file with its .state file beside it) where it stopped\n"
              "  --check-dataset DIR   check an uploaded data set folder, print a JSON summary\n"
              "  --to-tfrecord PREFIX IMAGES LABELS  write an IDX pair as TFRecord shards\n"
              "                        PREFIX-00000-of-0000N.tfrecord, then exit\n"
              "  --shards N            with --to-tfrecord: how many files (default 8)\n"
              "  --gzip                with --to-tfrecord: gzip'd shards (.tfrecord.gz)\n"
              "  --progress-fd N       write JSON progress lines to file descriptor N\n"
              "  --json                JSON progress lines on standard output\n"
              "  --threads N           compute threads (default: the spec's resources.devices)\n"
              "  --export-onnx FILE    write the trained model as ONNX to FILE after training\n"
              "  --weights CKPT        with --export-onnx: train nothing, export the model with\n"
              "                        the weights of CKPT (a .safetensors checkpoint of SPEC)\n"
              "  --plan-only           train nothing: print the memory the spec's training plans\n"
              "                        (parameters, gradients, optimizer state, arena) as JSON\n"
              "  --collective-timeout S  multi_worker, parameter_server: fail when the other\n"
              "                        processes keep an all-reduce, a push or a pull waiting\n"
              "                        S seconds (one died or hangs; default 300)\n"
              "  -h, --help            this help\n\n"
              "exit status: 0 trained, 1 failed, 2 usage, 3 invalid spec (or a model --export-onnx "
              "refuses),\n4 data error, \n"
              "5 numeric error (loss became NaN or infinite), 6 stopped by SIGTERM (a\n"
              "checkpoint of the last finished step was written first), 7 out of memory\n");
}

/* multi_worker, parameter_server: joins mpirun's processes; the spec's
 * workers (and ps servers) must be their number. Non-zero rank processes
 * train (or serve) in silence. */
static int start_workers(const api_job_spec *spec, reporter *rep, int *rank, char *err,
                         size_t errlen) {
#ifdef KILN_HAVE_MPI
  int provided = 0; /* only the training thread calls MPI */
  const int started = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
  if (started != MPI_SUCCESS) {
    snprintf(err, errlen, "strategy multi_worker: MPI did not start");
    return -1;
  }
  mpi_started = 1;
  /* MPI's failures come back as codes, so the engine's errors can say which
   * rank failed and why (the default ends every process first); main()
   * still ends the job with MPI_Abort when a rank fails. */
  if (MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN) != MPI_SUCCESS) {
    snprintf(err, errlen, "strategy: MPI_ERRORS_RETURN cannot be set on MPI_COMM_WORLD");
    return -1;
  }
  MPI_Comm_size(MPI_COMM_WORLD, &mpi_world);
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  if (spec->strategy == API_STRATEGY_PARAMETER_SERVER &&
      mpi_world != spec->workers + spec->ps_servers) {
    snprintf(err, errlen,
             "strategy.workers + strategy.ps is %d + %d, but %d processes run this job; start it "
             "as mpirun -np %d kiln-train ... (workers first, then the servers)",
             spec->workers, spec->ps_servers, mpi_world, spec->workers + spec->ps_servers);
    return -1;
  }
  if (spec->strategy == API_STRATEGY_MULTI_WORKER && mpi_world != spec->workers) {
    snprintf(err, errlen,
             "strategy.workers is %d, but %d processes run this job; start it as mpirun -np %d "
             "kiln-train ...",
             spec->workers, mpi_world, spec->workers);
    return -1;
  }
  MPI_Comm node;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, *rank, MPI_INFO_NULL, &node) ==
      MPI_SUCCESS) {
    MPI_Comm_rank(node, &mpi_local_rank);
    MPI_Comm_size(node, &mpi_local_size);
    MPI_Comm_free(&node);
  }
  if (*rank != 0) {
    rep->progress_fd = -1;
    rep->quiet = 1;
  }
  return 0;
#else
  (void)rep;
  *rank = 0;
  snprintf(err, errlen,
           "strategy %s needs MPI, and this kiln-train was built without it "
           "(configure with KILN_MPI=ON)",
           spec->strategy == API_STRATEGY_PARAMETER_SERVER ? "parameter_server" : "multi_worker");
  return -1;
#endif
}

/* multi_worker over streamed shards: each process read its own share, so
 * the shares differ in size; every process must take the same steps, so
 * each epoch ends after the smallest share's whole local batches and the
 * rest of every share is dropped (a different rest each epoch, as the
 * shuffle buffer hands records out). 0, or -1 with err. */
static int equal_shares(kn_dataset *train, const api_job_spec *spec, int64_t *dropped, char *err,
                        size_t errlen) {
  *dropped = 0;
#ifdef KILN_HAVE_MPI
  const int64_t local_batch = (int64_t)spec->batch_size * spec->replicas;
  long long mine = train->n, fewest = 0, total = 0;
  if (MPI_Allreduce(&mine, &fewest, 1, MPI_LONG_LONG, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS ||
      MPI_Allreduce(&mine, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS) {
    snprintf(err, errlen, "multi_worker: the processes could not agree on their shares' sizes");
    return -1;
  }
  const int64_t keep = fewest / local_batch * local_batch;
  if (keep < 1) {
    snprintf(err, errlen,
             "multi_worker: the smallest worker's share of the shards is %lld examples, fewer "
             "than a local batch of %lld (batch_size x replicas); use fewer workers or a smaller "
             "batch",
             fewest, (long long)local_batch);
    return -1;
  }
  if (kn_stream_limit(train->stream, keep, err, errlen) != 0) return -1;
  train->n = keep;
  *dropped = total - keep * spec->workers;
  return 0;
#else
  (void)train;
  (void)spec;
  snprintf(err, errlen, "multi_worker needs MPI");
  return -1;
#endif
}

/* multi_worker over streamed shards: which files this process read, for
 * the job's log (each process's on its standard error). */
static void report_shards(const kn_dataset *train, int rank, int world) {
  int n, by_record;
  const char *const *files = kn_stream_files(train->stream, &n, &by_record);
  char line[2048];
  int used =
      snprintf(line, sizeof line,
               "worker %d of %d read %d shard file(s) %s, opened %lld "
               "times:",
               rank, world, n, by_record ? "(every file, its records p % workers)" : "(its own)",
               (long long)kn_stream_opens(train->stream));
  for (int i = 0; i < n && used > 0 && used < (int)sizeof line; i++) {
    const char *slash = strrchr(files[i], '/');
    used += snprintf(line + used, sizeof line - (size_t)used, " %s", slash ? slash + 1 : files[i]);
  }
  fprintf(stderr, "kiln-train: %s\n", line);
}

static int train_main(int argc, char **argv) {
  static const struct option options[] = {{"spec", required_argument, NULL, 's'},
                                          {"data-dir", required_argument, NULL, 'd'},
                                          {"checkpoint-dir", required_argument, NULL, 'c'},
                                          {"uploads-dir", required_argument, NULL, 'u'},
                                          {"check-dataset", required_argument, NULL, 'k'},
                                          {"progress-fd", required_argument, NULL, 'p'},
                                          {"json", no_argument, NULL, 'j'},
                                          {"threads", required_argument, NULL, 't'},
                                          {"resume", required_argument, NULL, 'r'},
                                          {"collective-timeout", required_argument, NULL, 'T'},
                                          {"export-onnx", required_argument, NULL, 'o'},
                                          {"weights", required_argument, NULL, 'w'},
                                          {"to-tfrecord", required_argument, NULL, 'R'},
                                          {"shards", required_argument, NULL, 'S'},
                                          {"gzip", no_argument, NULL, 'z'},
                                          {"plan-only", no_argument, NULL, 'P'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
  const char *spec_path = NULL, *data_dir = getenv("KILN_DATASETS_DIR"), *ckpt_dir = ".";
  const char *uploads_dir = getenv("KILN_UPLOADS_DIR"), *check_dir = NULL, *resume = NULL;
  const char *onnx_path = NULL, *weights = NULL, *tfrecord_prefix = NULL;
  int plan_only = 0;
  reporter rep = {.progress_fd = -1};
  int threads = 0, opt, n_shards = 8, gzip = 0;
  double collective_timeout = 0.0;
  while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
    char *end = NULL;
    switch (opt) {
    case 's': spec_path = optarg; break;
    case 'd': data_dir = optarg; break;
    case 'c': ckpt_dir = optarg; break;
    case 'u': uploads_dir = optarg; break;
    case 'k': check_dir = optarg; break;
    case 'r': resume = optarg; break;
    case 'o': onnx_path = optarg; break;
    case 'w': weights = optarg; break;
    case 'P': plan_only = 1; break;
    case 'j': rep.progress_fd = STDOUT_FILENO; break;
    case 'p':
      rep.progress_fd = (int)strtol(optarg, &end, 10);
      if (!*optarg || *end || rep.progress_fd < 0) {
        fprintf(stderr, "kiln-train: --progress-fd needs a file descriptor, got '%s'\n", optarg);
        return EXIT_USAGE;
      }
      break;
    case 't':
      threads = (int)strtol(optarg, &end, 10);
      if (!*optarg || *end || threads < 1 || threads > 1024) {
        fprintf(stderr, "kiln-train: --threads needs 1..1024, got '%s'\n", optarg);
        return EXIT_USAGE;
      }
      break;
    case 'T':
      collective_timeout = strtod(optarg, &end);
      if (!*optarg || *end || !(collective_timeout > 0 && collective_timeout <= 86400)) {
        fprintf(stderr, "kiln-train: --collective-timeout needs seconds in (0, 86400], got '%s'\n",
                optarg);
        return EXIT_USAGE;
      }
      break;
    case 'R': tfrecord_prefix = optarg; break;
    case 'z': gzip = 1; break;
    case 'S':
      n_shards = (int)strtol(optarg, &end, 10);
      if (!*optarg || *end || n_shards < 1 || n_shards > 100000) {
        fprintf(stderr, "kiln-train: --shards needs 1..100000, got '%s'\n", optarg);
        return EXIT_USAGE;
      }
      break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return EXIT_USAGE;
    }
  }
  if (check_dir) {
    /* kilnd's upload check: one JSON line, exit 0 or EXIT_DATA. */
    char cerr[1024] = "", *summary = NULL;
    int crc =
        worker_check_upload(check_dir, data_dir && *data_dir ? data_dir : KILN_DEFAULT_DATASETS_DIR,
                            &summary, cerr, sizeof cerr);
    if (crc) return fail(&(reporter){.progress_fd = STDOUT_FILENO}, EXIT_DATA, "DATA_ERROR", cerr);
    printf("%s\n", summary);
    free(summary);
    return 0;
  }
  if (tfrecord_prefix) {
    if (argc - optind != 2) {
      fprintf(stderr, "kiln-train: --to-tfrecord PREFIX needs IMAGES and LABELS (IDX files)\n");
      return EXIT_USAGE;
    }
    char cerr[1024] = "";
    if (worker_idx_to_tfrecord(argv[optind], argv[optind + 1], tfrecord_prefix, n_shards, gzip,
                               cerr, sizeof cerr)) {
      fprintf(stderr, "kiln-train: %s\n", cerr);
      return EXIT_DATA;
    }
    return 0;
  }
  if (!spec_path && optind < argc) spec_path = argv[optind++];
  if (!spec_path || optind < argc) {
    usage(stderr);
    return EXIT_USAGE;
  }
  if (weights && !onnx_path) {
    fprintf(stderr, "kiln-train: --weights is for --export-onnx FILE: name the file to write\n");
    return EXIT_USAGE;
  }
  if (!data_dir || !*data_dir) data_dir = KILN_DEFAULT_DATASETS_DIR;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, NULL);

  char err[1024] = "";
  size_t len = 0;
  char *text = read_file(spec_path, &len, err, sizeof err);
  if (!text) return fail(&rep, EXIT_SPEC, "SPEC_INVALID", err);
  api_job_spec spec;
  api_error aerr;
  memset(&aerr, 0, sizeof aerr);
  int rc = api_spec_parse(text, len, &spec, &aerr);
  free(text);
  if (rc) {
    char msg[1024];
    int used = snprintf(msg, sizeof msg, "%s: %s", spec_path, aerr.message);
    for (int i = 0; i < aerr.n_details && used < (int)sizeof msg; i++) {
      used += snprintf(msg + used, sizeof msg - (size_t)used, "; %s: %s", aerr.details[i].field,
                       aerr.details[i].description);
    }
    return fail(&rep, EXIT_SPEC, "SPEC_INVALID", msg);
  }
  if (plan_only) { /* kilnd's memory check at create: nothing is allocated or trained */
    char line[512];
    if (worker_plan(&spec, line, sizeof line, err, sizeof err))
      return fail(&(reporter){.progress_fd = STDOUT_FILENO}, EXIT_SPEC, "BUILD_ERROR", err);
    printf("%s\n", line);
    fflush(stdout); /* the plan reaches kilnd whatever happens at exit */
    return 0;
  }
  if (weights) { /* export only: nothing is trained */
    int refused = 0;
    if (worker_export_checkpoint(&spec, weights, onnx_path, &refused, err, sizeof err))
      return fail(&rep, refused ? EXIT_SPEC : 1, refused ? "EXPORT_REFUSED" : "EXPORT_ERROR", err);
    if (readable_stdout(&rep)) printf("exported %s as ONNX to %s\n", weights, onnx_path);
    return 0;
  }
  int rank = 0;
  const int ps = spec.strategy == API_STRATEGY_PARAMETER_SERVER;
  if ((spec.strategy == API_STRATEGY_MULTI_WORKER || ps) &&
      start_workers(&spec, &rep, &rank, err, sizeof err))
    return fail(&rep, EXIT_SPEC, "SPEC_INVALID", err);
  /* Replicas in threads, and parameter_server processes, take a core
   * each: GEMMs on the caller's thread. GPU replicas share the machine's
   * cores for the ops that run on the host. */
  const int gpu = strcmp(spec.device_type, "gpu") == 0;
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const int gpu_threads = (int)(cpus / (spec.replicas * mpi_local_size));
  int compute_threads = spec.replicas > 1 ? 1 : threads ? threads : ps ? 1 : spec.devices;
  if (gpu) compute_threads = threads ? threads : gpu_threads > 1 ? gpu_threads : 1;
  openblas_set_num_threads(compute_threads);

  if (!uploads_dir || !*uploads_dir) uploads_dir = "datasets";
  const int multi = spec.strategy == API_STRATEGY_MULTI_WORKER;
  worker_dirs dirs = {.datasets_dir = data_dir,
                      .uploads_dir = uploads_dir,
                      .cache_dir = ckpt_dir,
                      .rank = multi ? rank : 0,
                      .world = multi ? spec.workers : 1};
  char msg[1024], where[768];
  report_status(&rep, "loading", "loading the data set");
  kn_dataset train = {0}, test = {0};
  rc = worker_load_data(&spec, &dirs, &train, &test, where, sizeof where, err, sizeof err);
  if (rc == KN_ENOMEM) return fail(&rep, EXIT_NOMEM, "RESOURCE_EXHAUSTED", err);
  if (rc) return fail(&rep, EXIT_DATA, "DATA_ERROR", err);
  int64_t dropped = 0;
  if (train.per_process && equal_shares(&train, &spec, &dropped, err, sizeof err) != 0) {
    kn_dataset_free(&train);
    kn_dataset_free(&test);
    return fail(&rep, EXIT_DATA, "DATA_ERROR", err);
  }
  if (api_loss_is_regression(spec.loss_type) && !train.targets) {
    snprintf(err, sizeof err,
             "loss %s needs numeric labels, and the labels of %s are class names; use "
             "sparse_categorical_crossentropy, or a label column of numbers",
             spec.loss, spec.dataset);
    kn_dataset_free(&train);
    kn_dataset_free(&test);
    return fail(&rep, EXIT_DATA, "DATA_ERROR", err);
  }
  int use_val = test.n > 0;
  snprintf(msg, sizeof msg, "loaded %s: %lld training and %lld validation examples", where,
           (long long)train.n, (long long)test.n);
  report_status(&rep, "loaded", msg);

  kn_layer_config layers[API_MAX_LAYERS];
  kn_model_config mc;
  worker_model_config(&spec, layers, &mc);
  /* A GPU job: replica i of this process on the machine's GPU
   * local rank x replicas + i, of those the scheduler made visible. */
  const int first_gpu = mpi_local_rank * spec.replicas;
  if (gpu) mc.device = (kn_device){KN_DEVICE_CUDA, first_gpu};
  for (int i = 0; gpu && i < mc.n_layers; i++)
    if (layers[i].placed && layers[i].device.kind == KN_DEVICE_CUDA)
      layers[i].device.index += first_gpu;
  kn_model model;
  kn_plan_stats stats;
  int status = 0;
  rc = kn_model_build(&mc, &model, err, sizeof err);
  if (!rc) kn_graph_set_threads(model.graph, compute_threads);
  if (!rc) rc = kn_model_compile(&model, &mc, spec.seed, &stats, err, sizeof err);
  if (!rc && stats.recompute_declined_bytes) mc.recompute = 0; /* the replicas as the model */
  /* The other replicas of this process: the same model, the same seed. */
  kn_model replicas[API_MAX_REPLICAS];
  kn_model *others[API_MAX_REPLICAS];
  int n_others = 0;
  for (int i = 1; !rc && i < spec.replicas; i++) {
    if (gpu) mc.device.index = first_gpu + i;
    rc = kn_model_build(&mc, &replicas[n_others], err, sizeof err);
    if (rc) break;
    others[n_others] = &replicas[n_others];
    kn_graph_set_threads(replicas[n_others++].graph, compute_threads);
    rc = kn_graph_compile(others[n_others - 1]->graph, spec.seed, NULL, err, sizeof err);
  }
  if (rc == KN_ENOMEM) { /* over its memory limit (cgroup or RLIMIT_AS), or the machine's */
    status = fail(&rep, EXIT_NOMEM, "RESOURCE_EXHAUSTED", err);
    goto out;
  }
  if (rc) {
    status = fail(&rep, EXIT_SPEC, "BUILD_ERROR", err);
    goto out;
  }
  char extra[320];
  snprintf(extra, sizeof extra, "; %.2f MiB of them kept for backward",
           stats.saved_bytes / 1048576.0);
  if (gpu) {
    size_t used = strlen(extra);
    char gpus[32];
    /* the replicas' GPUs, or those a model split over (model parallelism) */
    const int first = spec.replicas > 1 ? first_gpu : kn_graph_gpu(model.graph);
    const int last =
        spec.replicas > 1 ? first_gpu + spec.replicas - 1 : kn_graph_gpu_last(model.graph);
    if (last > first)
      snprintf(gpus, sizeof gpus, "cuda:%d-%d", first, last);
    else
      snprintf(gpus, sizeof gpus, "cuda:%d", first);
    int on_gpu = 0, with_kernel = 0;
    char host_ops[256];
    kn_graph_placement_summary(model.graph, &on_gpu, &with_kernel, host_ops, sizeof host_ops);
    if (first < 0) /* every layer placed on the host */
      snprintf(extra + used, sizeof extra - used, "; every layer placed on the host");
    else
      snprintf(extra + used, sizeof extra - used, "; %d of %d kernels on %s%s%.160s", on_gpu,
               with_kernel, gpus, host_ops[0] ? ", on the host: " : "", host_ops);
  }
  /* the GEMMs a GPU runs: cuBLAS, on tensor cores where the precision or
   * allow_tf32 lets them round their operands */
  const char *gpu_gemm =
      mc.precision == KN_PRECISION_MIXED_BFLOAT16  ? "cuBLAS on bf16 tensor cores, f32 sums"
      : mc.precision == KN_PRECISION_MIXED_FLOAT16 ? "cuBLAS on f16 tensor cores, f32 sums"
      : mc.allow_tf32                              ? "cuBLAS on TF32 tensor cores (allow_tf32)"
                                                   : "cuBLAS float32";
  const int gemms_on_gpu = gpu && kn_graph_gpu(model.graph) >= 0;
  if (mc.precision != KN_PRECISION_FLOAT32) {
    size_t used = strlen(extra);
    snprintf(extra + used, sizeof extra - used, "; precision %s (matmuls: %s)",
             kn_precision_name(mc.precision),
             gemms_on_gpu ? gpu_gemm : kn_mixed_matmul_path(mc.precision));
  }
  if (stats.recompute_declined_bytes) {
    size_t used = strlen(extra);
    snprintf(extra + used, sizeof extra - used,
             "; recompute declined: it would plan %.2f MiB, more than without it",
             stats.recompute_declined_bytes / 1048576.0);
  }
  if (mc.recompute) {
    size_t used = strlen(extra);
    snprintf(extra + used, sizeof extra - used,
             "; recompute re-runs %d nodes and saves %.2f MiB (peak %.2f MiB without, %.2fx)",
             stats.n_recomputed,
             ((double)stats.arena_bytes_without_recompute - (double)stats.arena_bytes) / 1048576.0,
             stats.arena_bytes_without_recompute / 1048576.0,
             stats.arena_bytes ? (double)stats.arena_bytes_without_recompute / stats.arena_bytes
                               : 1.0);
  }
  {
    size_t used = strlen(extra);
    if (gemms_on_gpu && mc.precision == KN_PRECISION_FLOAT32)
      snprintf(extra + used, sizeof extra - used, "; f32 GEMM %s", gpu_gemm);
    else if (!gemms_on_gpu)
      snprintf(extra + used, sizeof extra - used, "; f32 GEMM %s", kn_gemm_name(kn_cpu_gemm()));
    used = strlen(extra);
    if (stats.n_winograd)
      snprintf(extra + used, sizeof extra - used, "; %d convolution products by Winograd",
               stats.n_winograd);
  }
  snprintf(msg, sizeof msg,
           "model: %zu parameters, %d graph nodes; activations planned in %.2f MiB "
           "(%.2f MiB with one buffer per node); passes fused %d, computed %d in place, "
           "removed %d%s",
           kn_param_count(model.graph), stats.n_nodes, stats.arena_bytes / 1048576.0,
           stats.naive_bytes / 1048576.0, stats.n_fused, stats.n_inplace,
           stats.n_dead + stats.n_cse, extra);
  report_status(&rep, "compiled", msg);

  if (mkdir(ckpt_dir, 0755) != 0 && errno != EEXIST) {
    snprintf(err, sizeof err, "cannot create checkpoint directory %s: %s", ckpt_dir,
             strerror(errno));
    status = fail(&rep, 1, "IO_ERROR", err);
    goto out;
  }
  kn_pipeline_config pc;
  float mean[API_MAX_CHANNELS], std[API_MAX_CHANNELS];
  worker_pipeline_config(&spec, &pc, mean, std);
  kn_train_config tc = {.epochs = spec.epochs,
                        .batch_size = spec.batch_size,
                        .shuffle = spec.shuffle,
                        .drop_remainder = spec.drop_remainder,
                        .seed = spec.seed,
                        .log_every_steps = spec.log_every_steps,
                        .checkpoint_dir = ckpt_dir,
                        .checkpoint_prefix = "ckpt",
                        .pipeline = &pc,
                        .resume_from = resume,
                        .checkpoint_every_steps = spec.checkpoint_every_steps,
                        .stop_request = &stop_requested,
                        .on_tuned = on_tuned,
                        .metrics = (spec.metrics & API_METRIC_ACCURACY ? KN_METRIC_ACCURACY : 0u) |
                                   (spec.metrics & API_METRIC_MSE ? KN_METRIC_MSE : 0u) |
                                   (spec.metrics & API_METRIC_MAE ? KN_METRIC_MAE : 0u) |
                                   (spec.metrics & API_METRIC_TOP_K ? KN_METRIC_TOP_K : 0u),
                        .top_k = spec.top_k,
                        .accumulation_steps = spec.accumulation_steps,
                        .clip_global_norm = spec.global_clipnorm,
                        .eval_every_steps = spec.validation_every_steps};
  worker_loop_options(&spec, &tc);
  static const kn_aggregation aggregations[] = {[API_AGGREGATE_MEAN] = KN_AGGREGATE_MEAN,
                                                [API_AGGREGATE_SUM] = KN_AGGREGATE_SUM,
                                                [API_AGGREGATE_WEIGHTED_MEAN] =
                                                    KN_AGGREGATE_WEIGHTED_MEAN};
  tc.dist = (kn_distribution){.n_replicas = spec.replicas,
                              .replicas = others,
                              .world_size = spec.workers,
                              .rank = rank,
                              .aggregation = aggregations[spec.aggregation],
                              .bucket_bytes = (size_t)(spec.bucket_cap_mb * 1048576.0),
                              .timeout_s = collective_timeout,
                              .ps_servers = spec.ps_servers,
                              .ps_async = spec.ps_async,
                              .ps_max_staleness = spec.max_staleness};
  /* A profile lands beside the checkpoints, where kilnd serves it from. */
  char profile_path[4200], profile_table[4200];
  snprintf(profile_path, sizeof profile_path, "%s/profile.json", ckpt_dir);
  snprintf(profile_table, sizeof profile_table, "%s/profile.txt", ckpt_dir);
  if (spec.profile_first > 0) {
    tc.profile_first = spec.profile_first;
    tc.profile_last = spec.profile_last;
    tc.profile_path = profile_path;
    tc.profile_table_path = profile_table;
  }
  worker_optimizer_config(&spec, &tc.optimizer);
  rep.epochs = spec.epochs;
  int64_t n_train = train.n - spec.skip;
  if (spec.take >= 0 && spec.take < n_train) n_train = spec.take;
  /* This job's shard: positions p with p % num_shards == shard_index. */
  n_train = n_train / spec.num_shards + (spec.shard_index < n_train % spec.num_shards ? 1 : 0);
  if (train.stream) n_train = train.n; /* the stream holds the job's shard already */
  if (train.per_process) {             /* every process the same share, whole local batches */
    n_train = train.n * spec.workers;
    snprintf(msg, sizeof msg,
             "multi_worker: each of %d workers streams its own share of the shards (%lld "
             "examples an epoch each; %lld beyond the smallest share's whole batches dropped "
             "each epoch)",
             spec.workers, (long long)train.n, (long long)dropped);
    report_status(&rep, "sharding", msg);
  }
  /* The global batch: every replica of every worker takes batch_size rows. */
  const int64_t global_batch = (int64_t)spec.batch_size * spec.replicas * spec.workers;
  const int64_t batches =
      spec.drop_remainder ? n_train / global_batch : (n_train + global_batch - 1) / global_batch;
  /* Steps are optimizer updates: one per gradient_accumulation_steps batches. */
  rep.steps_per_epoch = (batches + spec.accumulation_steps - 1) / spec.accumulation_steps;
  snprintf(msg, sizeof msg, "training %s on %s: %lld examples, %d epochs of %lld steps",
           spec.display_name, spec.dataset, (long long)n_train, spec.epochs,
           (long long)rep.steps_per_epoch);
  report_status(&rep, "training", msg);
  if (global_batch > spec.batch_size || ps) {
    static const char *const names[] = {[API_STRATEGY_SINGLE] = "single",
                                        [API_STRATEGY_MIRRORED] = "mirrored",
                                        [API_STRATEGY_MULTI_WORKER] = "multi_worker",
                                        [API_STRATEGY_PARAMETER_SERVER] = "parameter_server"};
    int used = snprintf(msg, sizeof msg,
                        "strategy %s: %d worker(s) x %d replica(s) x batch %d = global batch %lld, "
                        "gradients aggregated by %s",
                        names[spec.strategy], spec.workers, spec.replicas, spec.batch_size,
                        (long long)global_batch,
                        spec.aggregation == API_AGGREGATE_SUM    ? "sum"
                        : spec.aggregation == API_AGGREGATE_MEAN ? "mean"
                                                                 : "weighted_mean");
    if (ps && used > 0 && used < (int)sizeof msg) {
      char bound[48] = "";
      if (spec.ps_async && spec.max_staleness >= 0)
        snprintf(bound, sizeof bound, ", at most %d steps ahead", spec.max_staleness);
      snprintf(msg + used, sizeof msg - (size_t)used, "; %d parameter server(s), %s%s",
               spec.ps_servers, spec.ps_async ? "async" : "sync", bound);
    }
    report_status(&rep, "strategy", msg);
  }
  if (resume) {
    snprintf(msg, sizeof msg, "resuming from %s", resume);
    report_status(&rep, "resuming", msg);
  }
  if (stop_requested) { /* nothing trained yet, so nothing to save */
    status = fail(&rep, EXIT_STOPPED, "STOPPED", "stopped by SIGTERM before the first step");
    goto out;
  }
  double comm_seconds = 0.0;
  tc.dist.comm_seconds = &comm_seconds;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  rc = kn_train(&model, &train, use_val ? &test : NULL, &tc, on_event, &rep, err, sizeof err);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (!rc) {
    const double took = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    int used = snprintf(msg, sizeof msg, "trained %lld examples in %.3f s (%.1f examples/s)",
                        (long long)n_train * spec.epochs, took,
                        took > 0 ? (double)n_train * spec.epochs / took : 0.0);
    if (global_batch > spec.batch_size && used > 0 && used < (int)sizeof msg)
      snprintf(msg + used, sizeof msg - (size_t)used,
               "; making the replicas' gradients one took %.3f s (%.1f%%)", comm_seconds,
               took > 0 ? 100.0 * comm_seconds / took : 0.0);
    report_status(&rep, "throughput", msg);
  }
  if (rc == KN_ESTOPPED) {
    char why[sizeof err + 32];
    snprintf(why, sizeof why, "stopped by SIGTERM: %s", err);
    status = fail(&rep, EXIT_STOPPED, "STOPPED", why);
  } else if (rc == KN_ENUMERIC) {
    status = fail(&rep, EXIT_NUMERIC, "NUMERIC_ERROR", err);
  } else if (rc == KN_EIO) {
    status = fail(&rep, 1, "IO_ERROR", err);
  } else if (rc) {
    status = fail(&rep, 1, "TRAINING_ERROR", err);
  } else {
    report_status(&rep, "done", "training finished");
  }
  if (train.per_process) report_shards(&train, rank, spec.workers);
  if (!status && onnx_path && rank == 0) {
    int refused = 0;
    if (worker_export_model(&spec, &model, &mc, onnx_path, &refused, err, sizeof err)) {
      status =
          fail(&rep, refused ? EXIT_SPEC : 1, refused ? "EXPORT_REFUSED" : "EXPORT_ERROR", err);
    } else {
      snprintf(msg, sizeof msg, "exported the trained model as ONNX to %s", onnx_path);
      report_status(&rep, "exported", msg);
    }
  }
out:
  for (int i = 0; i < n_others; i++) kn_model_free(&replicas[i]);
  kn_model_free(&model);
  kn_dataset_free(&train);
  kn_dataset_free(&test);
  return status;
}

int main(int argc, char **argv) {
  int status = train_main(argc, argv);
#ifdef KILN_HAVE_MPI
  if (mpi_started) {
    /* A rank that failed alone must not leave the others waiting in an
     * all-reduce: the abort ends every process of the job. A stop is no
     * failure: every rank agreed on the step to stop after, and an abort
     * from one that is done could kill rank 0 while it writes the stop's
     * checkpoint. */
    if (status != 0 && status != EXIT_STOPPED && mpi_world > 1) MPI_Abort(MPI_COMM_WORLD, status);
    MPI_Finalize();
  }
#endif
  return status;
}
