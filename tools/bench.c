/*
 * bench.c -- `dynemb bench`: engine throughput against the machine's memory
 * gather limit, measured in the same run.
 *
 * An embedding lookup is, at best, a gather: copy `dim` floats from a random
 * place in a big array. So every engine figure is reported next to (and as a
 * ratio of) a plain gather of rows at the same random indices out of a flat
 * float array with the same rows and dim, by the same number of threads.
 * Phases, each on the same table:
 *
 *   touch   the stall pass's limit: the same number of threads write
 *           never-touched memory (huge pages advised, like the engine's row
 *           slabs), the bytes of --stall-batch new rows per call, until they
 *           have written R rows' bytes; the longest call is what the machine
 *           itself takes to fault in a call's fresh memory
 *   stall   a scratch table grows from empty to R rows in small calls
 *           (--stall-batch keys); the longest single call is max_stall_ms
 *   insert  the measured table grows from empty to R rows in calls of B new
 *           keys (insert_keys_per_s)
 *   gather  rows at random indices out of the flat array (the limit), with
 *           and without software prefetch; the better one is the limit
 *   lookup  train-mode lookups of existing keys (and eval mode, for info)
 *   apply   optimizer updates (Adam by default) of existing keys
 *   adam limit  (Adam only) the engine's Adam row math applied in place at the same positions
 *           to the flat array plus a flat slot array (m, v): the memory
 *           bound of an Adam update, which moves ~6x the bytes of a gather
 *   ssd read limit  (--ssd-dir only) one embedding copied at each of the
 *           same positions out of a shared mapping of a file of R records
 *           of the tier's record size in the same directory, as the tier
 *           reads its file; and, for comparison, the same reads by pread
 *           (one system call per row, as the tier once read)
 *   cold    (--ssd-cold) the read limit, eval and train lookups again right
 *           after the files' pages are written back and dropped: reads
 *           from the disk rather than the page cache
 *
 * With --host-rows H --ssd-dir DIR every table has an SSD tier (H rows in
 * memory, the rest in DIR), so the phases measure the tier's moves too.
 *
 * Keys are drawn from uniform or Zipf(S) ranks; rank -> row position goes
 * through a random permutation and position -> key through a bijective
 * 64-bit mixer, so hot keys are neither adjacent in memory nor small ints.
 * The gather uses exactly the positions the engine gets as keys. Each timed
 * phase runs for at least --min-time seconds per thread after an untimed
 * warm-up pass over part of the same batches. Threads run batches
 * concurrently on the same table. Output: one JSON object (--json) or a
 * human table; progress lines go to stderr. Speed lives here, never in
 * tests.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cmds.h"
#include "dynemb.h"
#include "optim.h" /* the Adam limit runs the engine's own row math */

/* ------------------------------------------------------------------------ */
/* Options                                                                   */
/* ------------------------------------------------------------------------ */

/* Learning rate of the tables and of every apply call. */
#define BENCH_LR 1e-4f

typedef struct bench_opts {
  uint64_t rows;
  int dim;
  size_t batch;
  int zipf;      /* 0 uniform, 1 zipf */
  double zipf_s; /* exponent */
  char dist[64]; /* as given */
  int threads;
  int json;
  int opt_kind; /* enum dynemb_optimizer_kind */
  int init_kind; /* enum dynemb_initializer_kind of the tables */
  uint64_t seed;
  double min_time; /* seconds per timed phase */
  size_t stall_batch;
  int hugepages;  /* advise huge pages for the flat gather array */
  int skip_stall; /* no stall pass (quicker profiling runs) */
  int ssd_cold;   /* --ssd-cold: also read with the tier's pages out */
  uint64_t host_rows;    /* --host-rows: memory budget of an SSD tier */
  const char *ssd_dir;   /* --ssd-dir: the tier's directory, or NULL */
} bench_opts;

#define COLD_BATCHES 4 /* --ssd-cold: timed batches per thread per phase */

static void bench_usage(FILE *f) {
  fprintf(
      f,
      "usage: dynemb bench --rows R --dim D --batch B --dist uniform|zipf:S\n"
      "                    --threads T [--json] [--optimizer "
      "sgd|adagrad|adam|ftrl]\n"
      "                    [--seed N] [--min-time SECONDS] [--stall-batch N]\n"
      "                    [--no-hugepages] [--skip-stall]\n"
      "                    [--init uniform|normal|truncated_normal]\n"
      "                    [--host-rows H --ssd-dir DIR [--ssd-cold]]\n"
      "\n"
      "  --rows R          rows in the table (1 .. 4294967295)\n"
      "  --dim D           embedding width (1 .. 65536)\n"
      "  --batch B         keys per lookup/apply/insert call\n"
      "  --dist            key distribution: uniform, or zipf:S with S > 0\n"
      "                    (e.g. zipf:1.05)\n"
      "  --threads T       threads running batches on the same table (1 .. "
      "256)\n"
      "  --json            print one JSON object instead of a table\n"
      "  --optimizer       optimizer for the apply phase (default adam)\n"
      "  --init            the tables' initializer (default uniform in\n"
      "                    [-0.05, 0.05); the normals have stddev 0.05)\n"
      "  --seed N          seed for keys and distributions (default 1)\n"
      "  --min-time S      seconds each timed phase runs (default 1.0)\n"
      "  --stall-batch N   keys per call while measuring max_stall_ms "
      "(default 1024)\n"
      "  --no-hugepages    do not advise huge pages for the gather array\n"
      "  --skip-stall      skip the stall pass (max_stall_ms is then null)\n"
      "  --host-rows H     with --ssd-dir: tables keep H rows in memory and\n"
      "  --ssd-dir DIR     the rest in an SSD tier file in DIR; adds the\n"
      "                    ssd read limit phase\n"
      "  --ssd-cold        with a tier: also time eval and train lookups\n"
      "                    and the read limit right after their files'\n"
      "                    pages are written back and dropped from memory\n"
      "                    (%d batches per thread each)\n", COLD_BATCHES);
}

static int bench_bad(const char *fmt, const char *arg) {
  fprintf(stderr, "dynemb bench: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n\n");
  bench_usage(stderr);
  return 2;
}

/* Parses a whole decimal unsigned integer into [lo, hi]. */
static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
  if (!s || !*s || *s == '-' || *s == '+')
    return -1;
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v < lo || v > hi)
    return -1;
  *out = (uint64_t)v;
  return 0;
}

static int parse_double(const char *s, double *out) {
  if (!s || !*s)
    return -1;
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || *end || !isfinite(v))
    return -1;
  *out = v;
  return 0;
}

/* --init names, indexed by enum dynemb_initializer_kind. */
static const char *const init_names[] = {
    [DYNEMB_INIT_UNIFORM] = "uniform",
    [DYNEMB_INIT_NORMAL] = "normal",
    [DYNEMB_INIT_TRUNCATED_NORMAL] = "truncated_normal"};

/* The kind in [lo, hi] whose name(kind) is v into *out; nonzero if none. */
static int pick(const char *v, int lo, int hi, const char *(*name)(int),
                int *out) {
  for (int k = lo; k <= hi; k++)
    if (name(k) && !strcmp(v, name(k))) {
      *out = k;
      return 0;
    }
  return 1;
}

static const char *init_name(int kind) { return init_names[kind]; }

static int parse_opts(int argc, char **argv, bench_opts *o) {
  memset(o, 0, sizeof *o);
  o->opt_kind = DYNEMB_OPT_ADAM;
  o->init_kind = DYNEMB_INIT_UNIFORM;
  o->seed = 1;
  o->min_time = 1.0;
  o->stall_batch = 1024;
  o->hugepages = 1;
  int have_rows = 0, have_dim = 0, have_batch = 0, have_dist = 0,
      have_threads = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    uint64_t u;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      bench_usage(stdout);
      return 1;
    } else if (!strcmp(a, "--json")) {
      o->json = 1;
      continue;
    } else if (!strcmp(a, "--no-hugepages")) {
      o->hugepages = 0;
      continue;
    } else if (!strcmp(a, "--skip-stall")) {
      o->skip_stall = 1;
      continue;
    } else if (!strcmp(a, "--ssd-cold")) {
      o->ssd_cold = 1;
      continue;
    }
    if (strncmp(a, "--", 2))
      return bench_bad("unexpected argument '%s'", a);
    if (!v)
      return bench_bad("option %s needs a value", a);
    i++;
    if (!strcmp(a, "--rows")) {
      if (parse_u64(v, 1, UINT32_MAX, &u))
        return bench_bad("--rows must be an integer in 1 .. 4294967295, "
                         "not '%s'",
                         v);
      o->rows = u;
      have_rows = 1;
    } else if (!strcmp(a, "--dim")) {
      if (parse_u64(v, 1, 65536, &u))
        return bench_bad("--dim must be an integer in 1 .. 65536, not '%s'", v);
      o->dim = (int)u;
      have_dim = 1;
    } else if (!strcmp(a, "--batch")) {
      if (parse_u64(v, 1, (uint64_t)1 << 28, &u))
        return bench_bad("--batch must be an integer in 1 .. 268435456, "
                         "not '%s'",
                         v);
      o->batch = (size_t)u;
      have_batch = 1;
    } else if (!strcmp(a, "--stall-batch")) {
      if (parse_u64(v, 1, (uint64_t)1 << 28, &u))
        return bench_bad("--stall-batch must be an integer >= 1, not '%s'", v);
      o->stall_batch = (size_t)u;
    } else if (!strcmp(a, "--threads")) {
      if (parse_u64(v, 1, 256, &u))
        return bench_bad("--threads must be an integer in 1 .. 256, not '%s'",
                         v);
      o->threads = (int)u;
      have_threads = 1;
    } else if (!strcmp(a, "--seed")) {
      if (parse_u64(v, 0, UINT64_MAX, &u))
        return bench_bad("--seed must be a non-negative integer, not '%s'", v);
      o->seed = u;
    } else if (!strcmp(a, "--min-time")) {
      if (parse_double(v, &o->min_time) || o->min_time <= 0 ||
          o->min_time > 3600)
        return bench_bad("--min-time must be seconds in (0, 3600], not '%s'",
                         v);
    } else if (!strcmp(a, "--dist")) {
      if (strlen(v) >= sizeof o->dist)
        return bench_bad("--dist '%s' is too long", v);
      if (!strcmp(v, "uniform")) {
        o->zipf = 0;
      } else if (!strncmp(v, "zipf:", 5)) {
        if (parse_double(v + 5, &o->zipf_s) || !(o->zipf_s > 0) ||
            o->zipf_s > 100)
          return bench_bad("--dist zipf:S needs an exponent S in (0, 100], "
                           "as in zipf:1.05; got '%s'",
                           v);
        o->zipf = 1;
      } else {
        return bench_bad("--dist must be 'uniform' or 'zipf:S' (e.g. "
                         "zipf:1.05), not '%s'",
                         v);
      }
      strcpy(o->dist, v);
      have_dist = 1;
    } else if (!strcmp(a, "--host-rows")) {
      if (parse_u64(v, 1, UINT64_MAX, &u))
        return bench_bad("--host-rows must be an integer >= 1, not '%s'", v);
      o->host_rows = u;
    } else if (!strcmp(a, "--ssd-dir")) {
      if (!v[0])
        return bench_bad("--ssd-dir needs a directory%s", "");
      o->ssd_dir = v;
    } else if (!strcmp(a, "--init")) {
      if (pick(v, DYNEMB_INIT_UNIFORM, DYNEMB_INIT_TRUNCATED_NORMAL, init_name,
               &o->init_kind))
        return bench_bad("--init must be uniform, normal or truncated_normal, "
                         "not '%s'",
                         v);
    } else if (!strcmp(a, "--optimizer")) {
      if (pick(v, DYNEMB_OPT_SGD, DYNEMB_OPT_FTRL, dynemb_optimizer_name,
               &o->opt_kind))
        return bench_bad("--optimizer must be sgd, adagrad, adam or ftrl, "
                         "not '%s'",
                         v);
    } else {
      return bench_bad("unknown option '%s'", a);
    }
  }
  if (!have_rows)
    return bench_bad("%s", "--rows is required");
  if (!have_dim)
    return bench_bad("%s", "--dim is required");
  if (!have_batch)
    return bench_bad("%s", "--batch is required");
  if (!have_dist)
    return bench_bad("%s", "--dist is required");
  if (!have_threads)
    return bench_bad("%s", "--threads is required");
  if (!o->host_rows != !o->ssd_dir)
    return bench_bad("%s", "--host-rows and --ssd-dir go together (an SSD "
                           "tier needs both)");
  if (o->ssd_cold && !o->ssd_dir)
    return bench_bad("%s", "--ssd-cold needs an SSD tier (--host-rows and "
                           "--ssd-dir)");
  if (o->ssd_dir && o->host_rows >= o->rows)
    return bench_bad("%s", "--host-rows must be below --rows, or no row "
                           "would reach the SSD tier");
  return 0;
}

static int opt_slots(int kind) {
  return kind == DYNEMB_OPT_SGD ? 0 : kind == DYNEMB_OPT_ADAGRAD ? 1 : 2;
}

/* ------------------------------------------------------------------------ */
/* Random numbers, keys, Zipf                                                */
/* ------------------------------------------------------------------------ */

typedef struct rng {
  uint64_t s;
} rng;

static uint64_t rng_u64(rng *r) { /* splitmix64 */
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static double rng_unit(rng *r) { /* [0, 1) */
  return (double)(rng_u64(r) >> 11) * 0x1p-53;
}

static uint64_t rng_below(rng *r, uint64_t n) { /* [0, n), n small vs 2^64 */
  return (uint64_t)(rng_unit(r) * (double)n);
}

/* Row position -> key: a bijection on 64 bits (xor-shifts and odd
 * multipliers, constants different from the engine's hash), so distinct
 * positions give distinct keys that look like hashed feature ids. */
static int64_t position_key(uint64_t p, uint64_t seed) {
  uint64_t x = p ^ (seed * 0xd1b54a32d192ed03ULL);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 29;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 32;
  return (int64_t)x;
}

/* Zipf over ranks 1..n with P(k) ~ k^-s, by rejection-inversion (Hoermann
 * and Derflinger, 1996): invert the integral H of the continuous density
 * h(x) = x^-s, round to the nearest integer and accept with a cheap test;
 * O(1) per sample, no table. H(x) = (x^(1-s) - 1) / (1-s), written with
 * expm1/log1p so that s near 1 stays accurate. */
typedef struct zipf {
  double s, n, h_x1, h_n, cut;
} zipf;

static double zipf_expm1_over(double x) { /* (e^x - 1) / x */
  return fabs(x) > 1e-8 ? expm1(x) / x : 1.0 + x / 2.0;
}

static double zipf_log1p_over(double x) { /* log(1 + x) / x */
  return fabs(x) > 1e-8 ? log1p(x) / x : 1.0 - x / 2.0;
}

static double zipf_h(const zipf *z, double x) { return exp(-z->s * log(x)); }

static double zipf_H(const zipf *z, double x) {
  double lx = log(x);
  return zipf_expm1_over((1.0 - z->s) * lx) * lx;
}

static double zipf_H_inv(const zipf *z, double y) {
  double t = y * (1.0 - z->s);
  if (t < -1.0)
    t = -1.0; /* guards rounding at the edge of the domain */
  return exp(zipf_log1p_over(t) * y);
}

static void zipf_init(zipf *z, double s, uint64_t n) {
  z->s = s;
  z->n = (double)n;
  z->h_x1 = zipf_H(z, 1.5) - 1.0;
  z->h_n = zipf_H(z, z->n + 0.5);
  z->cut = 2.0 - zipf_H_inv(z, zipf_H(z, 2.5) - zipf_h(z, 2.0));
}

/* A rank in [0, n). */
static uint64_t zipf_draw(const zipf *z, rng *r) {
  for (;;) {
    double u = z->h_n + rng_unit(r) * (z->h_x1 - z->h_n);
    double x = zipf_H_inv(z, u);
    double k = floor(x + 0.5);
    if (k < 1.0)
      k = 1.0;
    if (k > z->n)
      k = z->n;
    if (k - x <= z->cut || u >= zipf_H(z, k + 0.5) - zipf_h(z, k))
      return (uint64_t)k - 1;
  }
}

/* ------------------------------------------------------------------------ */
/* Timing and small helpers                                                  */
/* ------------------------------------------------------------------------ */

static double thread_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds the calling thread has spent runnable but waiting for a CPU
 * (the second field of /proc/thread-self/schedstat), or -1 where the
 * kernel does not say. `fd` is that file, opened by the thread. */
static double runqueue_wait_s(int fd) {
  char buf[96];
  if (fd < 0) return -1;
  ssize_t k = pread(fd, buf, sizeof buf - 1, 0);
  if (k <= 0) return -1;
  buf[k] = 0;
  unsigned long long on_cpu, waiting;
  if (sscanf(buf, "%llu %llu", &on_cpu, &waiting) != 2) return -1;
  return 1e-9 * (double)waiting;
}

/* Page faults (minor + major) the calling thread has taken so far. */
static long thread_faults(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_THREAD, &ru)) return 0;
  return ru.ru_minflt + ru.ru_majflt;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xmalloc(size_t n, const char *what) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr,
            "dynemb bench: out of memory allocating %zu bytes for %s; "
            "use fewer --rows or a smaller --batch\n",
            n, what);
    exit(1);
  }
  return p;
}

static void die_engine(const char *what, int rc) {
  fprintf(stderr, "dynemb bench: %s failed: %s (%s)\n", what,
          dynemb_strerror(rc), dynemb_last_error());
  exit(1);
}

static void progress(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

static void progress(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "[bench] ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  fflush(stderr);
}

/* ------------------------------------------------------------------------ */
/* Shared state                                                              */
/* ------------------------------------------------------------------------ */

typedef struct bench {
  bench_opts o;
  uint64_t *perm;    /* rank -> row position */
  int64_t *all_keys; /* position -> key (insert order = position order) */
  float *flat;       /* rows * dim, the gather baseline */
  size_t flat_bytes;
  int flat_mmapped;
  float *slots; /* rows * 2 * dim (m then v per row), the Adam limit */
  size_t slots_bytes;
  char *touch; /* rows * row bytes of fresh memory, the touch limit */
  size_t touch_bytes, row_bytes;
  dynemb_table *table; /* the table being measured */
  size_t pool_batches; /* batches per thread in the key pools */
  pthread_barrier_t barrier;
  _Atomic uint64_t next_pos; /* insert phases: next position to insert */
  _Atomic uint64_t inserted_done;
  /* Adam limit: the table's learning rate and Adam settings */
  dynemb_optimizer adam_opt; /* the table's Adam settings */
  int limit_fd;       /* ssd read limit: its file (-1: none) */
  const char *limit_map; /* ... mapped whole (NULL: none) */
  size_t limit_bytes;
  size_t record_bytes; /* ...and the tier's record size (row_floats x 4) */
  int cold; /* a --ssd-cold phase: no warm-up, COLD_BATCHES batches */
} bench;

typedef enum phase_kind {
  PH_TOUCH,
  PH_STALL,
  PH_INSERT,
  PH_GATHER_PLAIN,
  PH_GATHER_PREFETCH,
  PH_LOOKUP_TRAIN,
  PH_LOOKUP_EVAL,
  PH_LOOKUP_PREPARED,
  PH_APPLY,
  PH_APPLY_PREPARED,
  PH_ADAM_LIMIT,
  PH_SSD_LIMIT,
  PH_SSD_PREAD
} phase_kind;

typedef struct worker {
  bench *b;
  int id;
  phase_kind phase;
  dynemb_table *table;
  size_t call_keys; /* insert phases */
  /* pools: pool_batches * batch keys and positions, same ranks */
  int64_t *keys;
  uint32_t *pos;
  dynemb_ticket *tickets;     /* row tickets of the pool's keys (dynemb_prepare) */
  float *out;          /* batch * dim */
  float *grads;        /* batch * dim */
  uint64_t adam_steps; /* adam limit: batches applied (bias correction) */
  /* results */
  uint64_t items;
  uint64_t calls;
  uint64_t unique_sum; /* apply: sum of stats.unique_keys */
  double secs;
  double cpu_secs; /* thread CPU time over the timed part */
  double max_call_s;
  double max_call_cpu_s; /* insert phases: CPU time of the longest call */
  double max_call_runq_s; /* ...and its time waiting for a CPU (-1: unknown) */
  double max_cpu_call_s; /* insert phases: longest call by CPU time */
  long max_cpu_call_faults; /* ...and the page faults it took */
  int rc;
  pthread_t th;
} worker;

/* ------------------------------------------------------------------------ */
/* Phases (per thread)                                                       */
/* ------------------------------------------------------------------------ */

static void gather_plain(const float *flat, int dim, const uint32_t *pos,
                         size_t n, float *out) {
  size_t row_bytes = sizeof(float) * (size_t)dim;
  for (size_t i = 0; i < n; i++)
    memcpy(out + i * (size_t)dim, flat + (size_t)pos[i] * (size_t)dim,
           row_bytes);
}

/* Prefetching into L2 (locality 2: prefetcht1 on x86) is the fastest
 * gather measured here: on an AMD EPYC VM, 4M x 64, 2 threads, ~1.8x the
 * rows/s of prefetcht0 or prefetchnta, which fill L1 and so are limited by
 * its few miss buffers. */
#define GATHER_AHEAD 16
static void gather_prefetch(const float *flat, int dim, const uint32_t *pos,
                            size_t n, float *out) {
  size_t row_bytes = sizeof(float) * (size_t)dim;
  for (size_t i = 0; i < n; i++) {
    if (i + GATHER_AHEAD < n) {
      const char *p =
          (const char *)(flat + (size_t)pos[i + GATHER_AHEAD] * (size_t)dim);
      for (size_t off = 0; off < row_bytes; off += 64)
        __builtin_prefetch(p + off, 0, 2);
    }
    memcpy(out + i * (size_t)dim, flat + (size_t)pos[i] * (size_t)dim,
           row_bytes);
  }
}

/* Prefetches every cache line of [p, p + bytes) into L2 (locality 2:
 * prefetcht1 on x86), for the Adam limit. Not with write intent on purpose:
 * measured on an AMD EPYC (1 thread, 1M x 64, uniform), L2 prefetch gives
 * ~11.7M rows/s, but prefetchw and prefetcht0 (both fill L1) ~7.7-7.9M; and
 * gcc emits prefetchw for a write-intent prefetch of any locality whenever
 * the target has PRFCHW (e.g. -march=native), so the limit would drop with
 * the build flags. Each row is read before it is written anyway. */
static inline void prefetch_lines_l2(const void *p, size_t bytes) {
  uintptr_t a = (uintptr_t)p & ~(uintptr_t)63, end = (uintptr_t)p + bytes;
  for (; a < end; a += 64)
    __builtin_prefetch((const void *)a, 0, 2);
}

/* The Adam limit for one batch: a dense Adam update in place of the rows at
 * `pos` of `flat` (rows * dim) and `slots` (rows * 2 * dim, m then v), with
 * gradient row i for position i, prefetching the row and slot lines of the
 * position ADAM_AHEAD ahead. A position repeated in the batch is updated
 * twice; threads may update the same row at once (a benign race on floats,
 * as this only measures memory traffic). */
#define ADAM_AHEAD 8
static void adam_limit_batch(const bench *b, uint64_t step, const uint32_t *pos,
                             size_t n, const float *grads) {
  size_t d = (size_t)b->o.dim, row_bytes = sizeof(float) * d;
  float *flat = b->flat, *slots = b->slots;
  dynemb_optim_step os; /* (the engine's own row math: it differs from the
                          engine's apply only in layout, index, dedupe, locks) */
  dynemb_optim_prepare(&b->adam_opt, b->adam_opt.learning_rate, step ? step : 1,
                       &os);
  for (size_t i = 0; i < n; i++) {
    if (i + ADAM_AHEAD < n) {
      size_t q = (size_t)pos[i + ADAM_AHEAD];
      prefetch_lines_l2(flat + q * d, row_bytes);
      prefetch_lines_l2(slots + q * 2 * d, 2 * row_bytes);
    }
    size_t p = (size_t)pos[i];
    dynemb_optim_apply_row(&os, flat + p * d, slots + p * 2 * d, grads + i * d,
                           (int)d);
  }
}

/* The ssd read limit: one embedding per position, copied out of the
 * mapped limit file at the tier's record stride (`by_pread`: read by one
 * pread each instead). */
static int ssd_limit_batch(const bench *b, const uint32_t *pos, size_t n,
                           float *out, int by_pread) {
  const size_t eb = sizeof(float) * (size_t)b->o.dim;
  for (size_t i = 0; i < n; i++) {
    size_t off = (size_t)pos[i] * b->record_bytes;
    float *to = out + i * (size_t)b->o.dim;
    if (!by_pread)
      memcpy(to, b->limit_map + off, eb);
    else if (pread(b->limit_fd, to, eb, (off_t)off) != (ssize_t)eb)
      return DYNEMB_EIO;
  }
  return DYNEMB_OK;
}

/* One batch of the timed phases; returns an engine status. */
static int run_batch(worker *w, size_t bi, uint64_t *unique) {
  bench *b = w->b;
  size_t B = b->o.batch;
  const int64_t *keys = w->keys + bi * B;
  const uint32_t *pos = w->pos + bi * B;
  switch (w->phase) {
  case PH_GATHER_PLAIN:
    gather_plain(b->flat, b->o.dim, pos, B, w->out);
    return DYNEMB_OK;
  case PH_GATHER_PREFETCH:
    gather_prefetch(b->flat, b->o.dim, pos, B, w->out);
    return DYNEMB_OK;
  case PH_LOOKUP_TRAIN:
    return dynemb_lookup(w->table, keys, B, DYNEMB_LOOKUP_TRAIN, 1, NULL,
                         w->out, NULL);
  case PH_LOOKUP_EVAL:
    return dynemb_lookup(w->table, keys, B, DYNEMB_LOOKUP_EVAL, 1, NULL, w->out,
                         NULL);
  case PH_LOOKUP_PREPARED:
    return dynemb_lookup_prepared(w->table, keys, w->tickets + bi * B, B,
                                  w->out, NULL);
  case PH_APPLY:
  case PH_APPLY_PREPARED: {
    dynemb_apply_stats st;
    int rc =
        w->phase == PH_APPLY
            ? dynemb_apply(w->table, keys, B, w->grads, BENCH_LR, NULL, &st)
            : dynemb_apply(w->table, keys, B, w->grads, BENCH_LR,
                           &(dynemb_apply_opts){.tickets = w->tickets + bi * B},
                           &st);
    *unique += st.unique_keys;
    return rc;
  }
  case PH_ADAM_LIMIT:
    adam_limit_batch(b, ++w->adam_steps, pos, B, w->grads);
    return DYNEMB_OK;
  case PH_SSD_LIMIT:
  case PH_SSD_PREAD:
    return ssd_limit_batch(b, pos, B, w->out, w->phase == PH_SSD_PREAD);
  default:
    return DYNEMB_EINVAL;
  }
}

/* Insert phases: threads take the next `call_keys` positions until all
 * rows exist; every call inserts new keys only. */
static void run_insert(worker *w) {
  bench *b = w->b;
  uint64_t R = b->o.rows;
  size_t n = w->call_keys;
  uint64_t step = R / 10 ? R / 10 : 1;
  pthread_barrier_wait(&b->barrier);
  int sfd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  double t0 = now_s(), c_0 = thread_cpu_s();
  for (;;) {
    uint64_t p = atomic_fetch_add(&b->next_pos, n);
    if (p >= R)
      break;
    size_t m = (size_t)(R - p < n ? R - p : n);
    long f0 = thread_faults();
    double c0 = now_s(), u0 = thread_cpu_s(), q0 = runqueue_wait_s(sfd);
    int rc = DYNEMB_OK;
    if (w->phase == PH_TOUCH) /* the memory m new rows would take */
      memset(b->touch + p * b->row_bytes, 1, m * b->row_bytes);
    else
      rc = dynemb_lookup(w->table, b->all_keys + p, m, DYNEMB_LOOKUP_TRAIN, 0,
                         NULL, w->out, NULL);
    double dt = now_s() - c0, du = thread_cpu_s() - u0;
    if (rc != DYNEMB_OK) {
      w->rc = rc;
      break;
    }
    if (dt > w->max_call_s) {
      double q1 = runqueue_wait_s(sfd);
      w->max_call_s = dt;
      w->max_call_cpu_s = du;
      w->max_call_runq_s = q0 >= 0 && q1 >= 0 ? q1 - q0 : -1;
    }
    if (du > w->max_cpu_call_s) {
      w->max_cpu_call_s = du;
      w->max_cpu_call_faults = thread_faults() - f0;
    }
    w->items += m;
    w->calls++;
    uint64_t done = atomic_fetch_add(&b->inserted_done, m) + m;
    if (done / step != (done - m) / step && done < R)
      progress("  %s: %" PRIu64 " / %" PRIu64 " rows (%.0f%%), %.1f s",
               w->phase == PH_STALL   ? "stall pass"
               : w->phase == PH_TOUCH ? "touch limit"
                                      : "insert",
               done, R,
               100.0 * (double)done / (double)R, now_s() - t0);
  }
  w->secs = now_s() - t0;
  w->cpu_secs = thread_cpu_s() - c_0;
  if (sfd >= 0) close(sfd);
}

static void *worker_main(void *arg) {
  worker *w = arg;
  bench *b = w->b;
  if (w->phase == PH_STALL || w->phase == PH_INSERT || w->phase == PH_TOUCH) {
    run_insert(w);
    return NULL;
  }
  size_t nb = b->pool_batches;
  uint64_t unique = 0;
  /* Warm-up: half the pool (at least one batch), untimed; none in the cold
   * phases, whose point is what comes before the pages are back. */
  size_t warm = b->cold ? 0 : nb / 2 ? nb / 2 : 1;
  for (size_t i = 0; i < warm; i++) {
    int rc = run_batch(w, i % nb, &unique);
    if (rc != DYNEMB_OK) {
      w->rc = rc;
      break;
    }
  }
  pthread_barrier_wait(&b->barrier);
  if (w->rc != DYNEMB_OK)
    return NULL;
  unique = 0;
  double t0 = now_s(), t = t0, c_0 = thread_cpu_s();
  size_t bi = warm % nb;
  do {
    double c0 = t;
    int rc = run_batch(w, bi, &unique);
    if (rc != DYNEMB_OK) {
      w->rc = rc;
      break;
    }
    t = now_s();
    if (t - c0 > w->max_call_s)
      w->max_call_s = t - c0;
    w->items += b->o.batch;
    w->calls++;
    bi = (bi + 1) % nb;
  } while (b->cold ? w->calls < COLD_BATCHES : t - t0 < b->o.min_time);
  w->secs = t - t0;
  w->cpu_secs = thread_cpu_s() - c_0;
  w->unique_sum = unique;
  return NULL;
}

typedef struct phase_result {
  double per_s;           /* items per second over all threads */
  double max_call_ms;     /* longest single call */
  double max_call_cpu_ms; /* insert phases: CPU time of that call; far
                             below max_call_ms = preempted or waiting */
  double max_call_runq_ms; /* insert phases: that call's wait for a CPU
                              (runnable, not running; -1: unknown); the
                              rest of it beyond CPU and this is blocked time
                              (locks, page-fault I/O) */
  double max_cpu_call_ms; /* insert phases: longest call by CPU time */
  long max_cpu_call_faults; /* page faults taken in that call */
  double secs;            /* longest thread time */
  double cpu_share;       /* thread CPU time / (threads x wall time): below
                             ~0.9 the phase shared the cores with other work */
  uint64_t items, calls, unique_sum;
} phase_result;

static phase_result run_phase(bench *b, worker *ws, phase_kind ph,
                              dynemb_table *t, size_t call_keys,
                              const char *what) {
  int T = b->o.threads;
  phase_result r;
  memset(&r, 0, sizeof r);
  atomic_store(&b->next_pos, 0);
  atomic_store(&b->inserted_done, 0);
  pthread_barrier_init(&b->barrier, NULL, (unsigned)T);
  for (int i = 0; i < T; i++) {
    worker *w = &ws[i];
    w->phase = ph;
    w->table = t;
    w->call_keys = call_keys;
    w->items = w->calls = w->unique_sum = 0;
    w->secs = w->cpu_secs = w->max_call_s = 0;
    w->max_call_cpu_s = w->max_cpu_call_s = 0;
    w->max_cpu_call_faults = 0;
    w->max_call_runq_s = -1;
    w->rc = DYNEMB_OK;
    if (pthread_create(&w->th, NULL, worker_main, w)) {
      fprintf(stderr, "dynemb bench: cannot start thread %d\n", i);
      exit(1);
    }
  }
  for (int i = 0; i < T; i++)
    pthread_join(ws[i].th, NULL);
  pthread_barrier_destroy(&b->barrier);
  double cpu = 0, wall = 0;
  for (int i = 0; i < T; i++) {
    if (ws[i].rc != DYNEMB_OK)
      die_engine(what, ws[i].rc);
    cpu += ws[i].cpu_secs;
    wall += ws[i].secs;
    r.items += ws[i].items;
    r.calls += ws[i].calls;
    r.unique_sum += ws[i].unique_sum;
    if (ws[i].secs > r.secs)
      r.secs = ws[i].secs;
    if (ws[i].max_call_s * 1e3 > r.max_call_ms) {
      r.max_call_ms = ws[i].max_call_s * 1e3;
      r.max_call_cpu_ms = ws[i].max_call_cpu_s * 1e3;
      r.max_call_runq_ms =
          ws[i].max_call_runq_s >= 0 ? ws[i].max_call_runq_s * 1e3 : -1;
    }
    if (ws[i].max_cpu_call_s * 1e3 > r.max_cpu_call_ms) {
      r.max_cpu_call_ms = ws[i].max_cpu_call_s * 1e3;
      r.max_cpu_call_faults = ws[i].max_cpu_call_faults;
    }
  }
  r.per_s = r.secs > 0 ? (double)r.items / r.secs : 0;
  r.cpu_share = wall > 0 ? cpu / wall : 0;
  const char *unit =
      (ph == PH_GATHER_PLAIN || ph == PH_GATHER_PREFETCH ||
       ph == PH_ADAM_LIMIT || ph == PH_TOUCH || ph == PH_SSD_LIMIT ||
       ph == PH_SSD_PREAD)
          ? "rows"
          : "keys";
  progress("%s: %.3g %s/s (%" PRIu64 " %s in %.2f s, longest call %.2f ms, "
           "cpu share %.2f)",
           what, r.per_s, unit, r.items, unit, r.secs, r.max_call_ms,
           r.cpu_share);
  return r;
}

/* ------------------------------------------------------------------------ */
/* Setup                                                                     */
/* ------------------------------------------------------------------------ */

/* The measured tables' configuration (also read by the Adam limit). */
static void table_config(const bench *b, const char *name,
                         dynemb_table_config *cfg) {
  dynemb_table_config_init(cfg);
  cfg->name = name;
  cfg->dim = b->o.dim;
  cfg->init.kind = b->o.init_kind;
  cfg->init.a = b->o.init_kind == DYNEMB_INIT_UNIFORM ? -0.05f : 0.0f;
  cfg->init.b = 0.05f; /* max, or stddev */
  cfg->init.seed = b->o.seed;
  cfg->optimizer.kind = b->o.opt_kind;
  cfg->optimizer.learning_rate = BENCH_LR;
  cfg->nonfinite_policy = DYNEMB_NONFINITE_ERROR;
  if (b->o.ssd_dir) {
    cfg->host_vocabulary_size = b->o.host_rows;
    cfg->ssd_vocabulary_size = b->o.rows;
    cfg->ssd_data_path = b->o.ssd_dir;
  }
}

static dynemb_table *make_table(const bench *b, const char *name) {
  dynemb_table_config cfg;
  dynemb_table *t = NULL;
  table_config(b, name, &cfg);
  int rc = dynemb_table_create(&cfg, &t);
  if (rc != DYNEMB_OK)
    die_engine("dynemb_table_create", rc);
  return t;
}

/* Maps `bytes` of zeroed memory for a flat baseline array, advising huge
 * pages unless --no-hugepages. */
static float *map_floats(const bench *b, size_t bytes, const char *what) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    fprintf(stderr, "dynemb bench: cannot map %zu bytes for the %s: %s\n",
            bytes, what, strerror(errno));
    exit(1);
  }
#ifdef MADV_HUGEPAGE
  if (b->o.hugepages)
    (void)madvise(p, bytes, MADV_HUGEPAGE);
#else
  (void)b;
#endif
  return p;
}

static void alloc_flat(bench *b) {
  size_t n = (size_t)b->o.rows * (size_t)b->o.dim;
  b->flat_bytes = n * sizeof(float);
  b->flat = map_floats(b, b->flat_bytes, "gather array");
  b->flat_mmapped = 1;
  rng r = {b->o.seed ^ 0xf1a7ULL};
  for (size_t i = 0; i < n; i++)
    b->flat[i] = (float)(rng_unit(&r) - 0.5);
}

/* The Adam limit's slot array (m = 0, v = 0.01 per row) and the table's
 * Adam settings. */
static void alloc_slots(bench *b) {
  size_t d = (size_t)b->o.dim;
  b->slots_bytes = (size_t)b->o.rows * 2 * d * sizeof(float);
  b->slots = map_floats(b, b->slots_bytes, "Adam slot array");
  for (uint64_t r = 0; r < b->o.rows; r++) {
    float *m = b->slots + (size_t)r * 2 * d;
    for (size_t i = 0; i < d; i++) {
      m[i] = 0.0f;
      m[d + i] = 0.01f;
    }
  }
  dynemb_table_config cfg;
  table_config(b, "adam_limit", &cfg);
  b->adam_opt = cfg.optimizer;
}

/* The ssd read limit's file: R records of the tier's size, written with
 * data (not sparse) in --ssd-dir and unlinked at once. */
static void make_limit_file(bench *b) {
  const bench_opts *o = &b->o;
  char path[4096];
  snprintf(path, sizeof path, "%s/dynemb-bench-XXXXXX", o->ssd_dir);
  int fd = mkstemp(path);
  if (fd < 0) {
    fprintf(stderr, "dynemb bench: cannot create a file in --ssd-dir '%s': %s\n",
            o->ssd_dir, strerror(errno));
    exit(1);
  }
  unlink(path);
  const size_t chunk = (size_t)1 << 20;
  char *buf = xmalloc(chunk, "ssd limit buffer");
  rng r = {o->seed ^ 0x55dULL};
  for (size_t i = 0; i < chunk; i++)
    buf[i] = (char)rng_u64(&r);
  uint64_t total = o->rows * (uint64_t)b->record_bytes;
  for (uint64_t done = 0; done < total;) {
    size_t n = total - done < chunk ? (size_t)(total - done) : chunk;
    if (pwrite(fd, buf, n, (off_t)done) != (ssize_t)n) {
      fprintf(stderr, "dynemb bench: writing the ssd limit file in '%s' "
              "failed: %s\n", o->ssd_dir, strerror(errno));
      exit(1);
    }
    done += n;
  }
  free(buf);
#ifdef POSIX_FADV_RANDOM
  (void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM); /* as the tier's file */
#endif
  void *map = mmap(NULL, (size_t)total, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    fprintf(stderr, "dynemb bench: mapping the ssd limit file in '%s' "
            "failed: %s\n", o->ssd_dir, strerror(errno));
    exit(1);
  }
  (void)madvise(map, (size_t)total, MADV_RANDOM); /* as the tier's file */
  b->limit_fd = fd;
  b->limit_map = map;
  b->limit_bytes = (size_t)total;
}

/* --ssd-cold: writes the tier's file back and drops its pages from memory
 * (and the limit file's), so that the next reads fault them in from the
 * disk. The tier's file is unnamed (ssd.h) but mapped from the --ssd-dir
 * directory: its mappings are the lines of /proc/self/maps whose path is
 * in that directory. MADV_PAGEOUT (Linux 5.4) reclaims mapped pages; the
 * limit file's cached pages that were never mapped go with
 * POSIX_FADV_DONTNEED. */
static void page_out(bench *b) {
  char dir[PATH_MAX];
  if (!realpath(b->o.ssd_dir, dir)) {
    fprintf(stderr, "dynemb bench: --ssd-cold: %s: %s\n", b->o.ssd_dir,
            strerror(errno));
    exit(1);
  }
  const size_t dl = strlen(dir);
  FILE *maps = fopen("/proc/self/maps", "r");
  if (!maps) {
    fprintf(stderr, "dynemb bench: --ssd-cold needs /proc/self/maps (%s)\n",
            strerror(errno));
    exit(1);
  }
  char line[PATH_MAX + 256];
  while (fgets(line, sizeof line, maps)) {
    unsigned long lo = 0, hi = 0;
    const char *path = strchr(line, '/');
    if (!path || sscanf(line, "%lx-%lx", &lo, &hi) != 2) continue;
    if (strncmp(path, dir, dl) != 0 || path[dl] != '/') continue;
    void *at = (void *)(uintptr_t)lo;
    (void)msync(at, hi - lo, MS_SYNC);
    if (at != b->limit_map && madvise(at, hi - lo, MADV_PAGEOUT) != 0) {
      fprintf(stderr, "dynemb bench: --ssd-cold: MADV_PAGEOUT failed (%s); "
              "it needs Linux 5.4 or later\n", strerror(errno));
      exit(1);
    }
  }
  fclose(maps);
  (void)madvise((void *)(uintptr_t)b->limit_map, b->limit_bytes, MADV_PAGEOUT);
  (void)posix_fadvise(b->limit_fd, 0, 0, POSIX_FADV_DONTNEED);
}

static phase_result cold_phase(bench *b, worker *ws, phase_kind ph,
                               const char *what) {
  page_out(b);
  b->cold = 1;
  phase_result r = run_phase(b, ws, ph, ph == PH_SSD_LIMIT ? NULL : b->table,
                             0, what);
  b->cold = 0;
  return r;
}

static void make_pools(bench *b, worker *ws) {
  const bench_opts *o = &b->o;
  zipf z;
  if (o->zipf)
    zipf_init(&z, o->zipf_s, o->rows);
  size_t per = b->pool_batches * o->batch;
  for (int t = 0; t < o->threads; t++) {
    worker *w = &ws[t];
    rng r = {o->seed * 1000003ULL + 17ULL * (uint64_t)(t + 1)};
    w->keys = xmalloc(per * sizeof(int64_t), "key pools");
    w->pos = xmalloc(per * sizeof(uint32_t), "position pools");
    for (size_t i = 0; i < per; i++) {
      uint64_t rank = o->zipf ? zipf_draw(&z, &r) : rng_below(&r, o->rows);
      uint64_t p = b->perm[rank];
      w->pos[i] = (uint32_t)p;
      w->keys[i] = b->all_keys[p];
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Output                                                                    */
/* ------------------------------------------------------------------------ */

static void cpu_model(char *buf, size_t n) {
  snprintf(buf, n, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f)
    return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (!strncmp(line, "model name", 10)) {
      char *c = strchr(line, ':');
      if (c) {
        c++;
        while (*c == ' ')
          c++;
        c[strcspn(c, "\n")] = 0;
        /* keep it JSON-safe */
        for (char *q = c; *q; q++)
          if (*q == '"' || *q == '\\' || (unsigned char)*q < 32)
            *q = ' ';
        snprintf(buf, n, "%s", c);
      }
      break;
    }
  }
  fclose(f);
}

/* The 1-minute load average, or -1: a busy machine makes every figure
 * lower, so the JSON says how busy it was. */
static double loadavg_1m(void) {
  double l = -1;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &l) != 1)
      l = -1;
    fclose(f);
  }
  return l;
}

typedef struct results {
  phase_result touch, stall, insert, gplain, gpref, lookup, lookup_eval,
      prepared, apply, apply_prepared, adam_limit, ssd_limit, ssd_pread, cold_limit,
      cold_eval, cold_train;
  int have_adam_limit; /* adam only */
  double gather_limit;
  double lookup_vs_gather, apply_vs_gather, apply_vs_adam_limit, overhead;
  dynemb_table_stats st;
  int row_floats;
  double load_start, load_end;
} results;

static void print_json(const bench *b, const results *r) {
  const bench_opts *o = &b->o;
  char model[256], date[64];
  time_t now = time(NULL);
  struct tm tmv;
  gmtime_r(&now, &tmv);
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tmv);
  cpu_model(model, sizeof model);
  double lookup_target = o->zipf ? 0.8 : 0.6;
  const dynemb_table_stats *s = &r->st;
  printf("{\n");
  printf("  \"rows\": %" PRIu64 ",\n  \"dim\": %d,\n  \"batch\": %zu,\n",
         o->rows, o->dim, o->batch);
  printf("  \"dist\": \"%s\",\n  \"threads\": %d,\n  \"optimizer\": \"%s\",\n",
         o->dist, o->threads, dynemb_optimizer_name(o->opt_kind));
  printf("  \"init\": \"%s\",\n", init_name(o->init_kind));
  printf("  \"row_floats\": %d,\n  \"seed\": %" PRIu64 ",\n"
         "  \"min_time_s\": %g,\n",
         r->row_floats, o->seed, o->min_time);
  printf("  \"lookup_keys_per_s\": %.0f,\n", r->lookup.per_s);
  printf("  \"lookup_eval_keys_per_s\": %.0f,\n", r->lookup_eval.per_s);
  printf("  \"lookup_prepared_keys_per_s\": %.0f,\n", r->prepared.per_s);
  printf("  \"insert_keys_per_s\": %.0f,\n", r->insert.per_s);
  printf("  \"apply_keys_per_s\": %.0f,\n", r->apply.per_s);
  printf("  \"apply_%s_keys_per_s\": %.0f,\n", dynemb_optimizer_name(o->opt_kind),
         r->apply.per_s);
  printf("  \"apply_prepared_keys_per_s\": %.0f,\n", r->apply_prepared.per_s);
  printf("  \"apply_unique_keys_per_batch\": %.1f,\n",
         r->apply.calls ? (double)r->apply.unique_sum / (double)r->apply.calls
                        : 0.0);
  printf("  \"gather_limit_rows_per_s\": %.0f,\n", r->gather_limit);
  printf("  \"gather_plain_rows_per_s\": %.0f,\n", r->gplain.per_s);
  printf("  \"gather_prefetch_rows_per_s\": %.0f,\n", r->gpref.per_s);
  printf("  \"gather_hugepages\": %s,\n", o->hugepages ? "true" : "false");
  printf("  \"lookup_vs_gather\": %.3f,\n", r->lookup_vs_gather);
  printf("  \"lookup_prepared_vs_gather\": %.3f,\n",
         r->gather_limit > 0 ? r->prepared.per_s / r->gather_limit : 0.0);
  printf("  \"apply_vs_gather\": %.3f,\n", r->apply_vs_gather);
  if (r->have_adam_limit)
    printf("  \"adam_limit_rows_per_s\": %.0f,\n"
           "  \"apply_vs_adam_limit\": %.3f,\n"
           "  \"apply_prepared_vs_adam_limit\": %.3f,\n",
           r->adam_limit.per_s, r->apply_vs_adam_limit,
           r->adam_limit.per_s > 0 ? r->apply_prepared.per_s / r->adam_limit.per_s
                                   : 0.0);
  else
    printf("  \"adam_limit_rows_per_s\": null,\n"
           "  \"apply_vs_adam_limit\": null,\n"
           "  \"apply_prepared_vs_adam_limit\": null,\n");
  printf("  \"bytes_per_row_overhead\": %.2f,\n", r->overhead);
  if (o->skip_stall) {
    printf("  \"max_stall_ms\": null,\n  \"touch_limit_max_call_ms\": null,\n"
           "  \"touch_limit_bytes_per_s\": null,\n"
           "  \"max_stall_vs_touch_limit\": null,\n");
  } else {
    printf("  \"max_stall_ms\": %.3f,\n  \"max_stall_call_cpu_ms\": %.3f,\n",
           r->stall.max_call_ms, r->stall.max_call_cpu_ms);
    if (r->stall.max_call_runq_ms >= 0)
      printf("  \"max_stall_call_runqueue_ms\": %.3f,\n",
             r->stall.max_call_runq_ms);
    else
      printf("  \"max_stall_call_runqueue_ms\": null,\n");
    printf("  \"max_stall_cpu_ms\": %.3f,\n", r->stall.max_cpu_call_ms);
    printf("  \"max_stall_cpu_call_page_faults\": %ld,\n",
           r->stall.max_cpu_call_faults);
    printf("  \"touch_limit_max_call_ms\": %.3f,\n"
           "  \"touch_limit_bytes_per_s\": %.0f,\n"
           "  \"max_stall_vs_touch_limit\": %.3f,\n",
           r->touch.max_call_ms,
           r->touch.per_s * (double)r->row_floats * sizeof(float),
           r->touch.max_call_ms > 0 ? r->stall.max_call_ms / r->touch.max_call_ms
                                    : 0.0);
  }
  printf("  \"stall_batch\": %zu,\n", o->stall_batch);
  printf("  \"max_insert_call_ms\": %.3f,\n", r->insert.max_call_ms);
  printf("  \"max_lookup_call_ms\": %.3f,\n", r->lookup.max_call_ms);
  printf("  \"max_apply_call_ms\": %.3f,\n", r->apply.max_call_ms);
  char adam_share[32];
  if (r->have_adam_limit)
    snprintf(adam_share, sizeof adam_share, "%.2f", r->adam_limit.cpu_share);
  else
    snprintf(adam_share, sizeof adam_share, "null");
  printf("  \"cpu_share\": {\"touch\": %.2f, \"stall\": %.2f, \"insert\": %.2f, "
         "\"gather_plain\": %.2f, \"gather_prefetch\": %.2f, \"lookup\": "
         "%.2f, \"lookup_eval\": %.2f, \"lookup_prepared\": %.2f, \"apply\": "
         "%.2f, \"apply_prepared\": %.2f, \"adam_limit\": %s},\n",
         r->touch.cpu_share, r->stall.cpu_share, r->insert.cpu_share,
         r->gplain.cpu_share,
         r->gpref.cpu_share, r->lookup.cpu_share, r->lookup_eval.cpu_share,
         r->prepared.cpu_share, r->apply.cpu_share, r->apply_prepared.cpu_share,
         adam_share);
  printf(
      "  \"targets\": {\"lookup_vs_gather\": %.1f, \"apply_vs_gather\": 0.4, "
      "\"bytes_per_row_overhead\": 24, \"max_stall_ms\": 10},\n",
      lookup_target);
  printf("  \"targets_met\": {\"lookup_vs_gather\": %s, \"apply_vs_gather\": "
         "%s, \"bytes_per_row_overhead\": %s, \"max_stall_ms\": %s},\n",
         r->lookup_vs_gather >= lookup_target ? "true" : "false",
         r->apply_vs_gather >= 0.4 ? "true" : "false",
         r->overhead <= 24 ? "true" : "false",
         o->skip_stall                ? "null"
         : r->stall.max_call_ms <= 10 ? "true"
                                      : "false");
  if (o->ssd_dir) {
    double lim = r->ssd_limit.per_s;
    printf("  \"ssd_tier\": {\"host_rows\": %" PRIu64 ", \"record_bytes\": "
           "%zu, \"ssd_read_limit_rows_per_s\": %.0f, "
           "\"ssd_pread_rows_per_s\": %.0f, "
           "\"lookup_vs_ssd_read_limit\": %.3f, "
           "\"lookup_eval_vs_ssd_read_limit\": %.3f, "
           "\"rows_in_memory_end\": %" PRIu64 ", \"rows_on_ssd_end\": %" PRIu64
           ", \"ssd_reads\": %" PRIu64 ", \"ssd_writes\": %" PRIu64
           ", \"ssd_bytes\": %" PRIu64 ", \"ssd_lookups\": %" PRIu64
           ", \"memory_hit_rate\": %.4f},\n",
           o->host_rows, b->record_bytes, lim, r->ssd_pread.per_s,
           lim > 0 ? r->lookup.per_s / lim : 0.0,
           lim > 0 ? r->lookup_eval.per_s / lim : 0.0, s->host_rows,
           s->ssd_rows, s->ssd_reads, s->ssd_writes, s->ssd_bytes,
           s->ssd_lookups,
           s->hits ? 1.0 - (double)s->ssd_lookups / (double)s->hits : 0.0);
    if (o->ssd_cold) {
      const double cl = r->cold_limit.per_s;
      printf("  \"ssd_cold\": {\"batches_per_thread\": %d, "
             "\"read_limit_rows_per_s\": %.0f, \"lookup_eval_keys_per_s\": "
             "%.0f, \"lookup_keys_per_s\": %.0f, "
             "\"lookup_eval_vs_read_limit\": %.3f, "
             "\"lookup_vs_read_limit\": %.3f},\n",
             COLD_BATCHES, cl, r->cold_eval.per_s, r->cold_train.per_s,
             cl > 0 ? r->cold_eval.per_s / cl : 0.0,
             cl > 0 ? r->cold_train.per_s / cl : 0.0);
    } else {
      printf("  \"ssd_cold\": null,\n");
    }
  } else {
    printf("  \"ssd_tier\": null,\n  \"ssd_cold\": null,\n");
  }
  printf("  \"stats\": {\"size\": %" PRIu64 ", \"capacity\": %" PRIu64
         ", \"candidates\": %" PRIu64 ", \"bytes\": %" PRIu64
         ", \"lookups\": %" PRIu64 ", \"hits\": %" PRIu64
         ", \"inserted\": %" PRIu64 ", \"rejected\": %" PRIu64
         ", \"evicted\": %" PRIu64 ", \"applied\": %" PRIu64
         ", \"dropped_gradients\": %" PRIu64 ", \"nonfinite_skipped\": %" PRIu64
         ", \"apply_steps\": %" PRIu64 "},\n",
         s->size, s->capacity, s->candidates, s->bytes, s->lookups, s->hits,
         s->inserted, s->rejected, s->evicted, s->applied, s->dropped_gradients,
         s->nonfinite_skipped, s->apply_steps);
  printf("  \"machine\": {\"cpus\": %ld, \"model\": \"%s\", "
         "\"loadavg_1m_start\": %.2f, \"loadavg_1m_end\": %.2f},\n",
         sysconf(_SC_NPROCESSORS_ONLN), model, r->load_start, r->load_end);
  printf("  \"date\": \"%s\",\n", date);
  printf("  \"dynemb_version\": \"%d.%d.%d\"\n", DYNEMB_VERSION_MAJOR,
         DYNEMB_VERSION_MINOR, DYNEMB_VERSION_PATCH);
  printf("}\n");
}

static void print_human(const bench *b, const results *r) {
  const bench_opts *o = &b->o;
  double lookup_target = o->zipf ? 0.8 : 0.6;
  printf("dynemb bench: %" PRIu64 " rows x dim %d, batch %zu, %s, %d "
         "thread(s), optimizer %s\n\n",
         o->rows, o->dim, o->batch, o->dist, o->threads,
         dynemb_optimizer_name(o->opt_kind));
  printf("  %-28s %16s %10s\n", "measure", "value", "target");
  printf("  %-28s %16.0f\n", "gather limit (rows/s)", r->gather_limit);
  printf("  %-28s %16.0f\n", "  gather plain (rows/s)", r->gplain.per_s);
  printf("  %-28s %16.0f\n", "  gather prefetch (rows/s)", r->gpref.per_s);
  printf("  %-28s %16.0f\n", "lookup train (keys/s)", r->lookup.per_s);
  printf("  %-28s %16.0f\n", "lookup eval (keys/s)", r->lookup_eval.per_s);
  printf("  %-28s %16.0f\n", "lookup prepared (keys/s)", r->prepared.per_s);
  printf("  %-28s %16.0f\n", "insert (keys/s)", r->insert.per_s);
  printf("  %-28s %16.0f\n", "apply (keys/s)", r->apply.per_s);
  printf("  %-28s %16.0f\n", "apply prepared (keys/s)", r->apply_prepared.per_s);
  if (r->have_adam_limit)
    printf("  %-28s %16.0f\n", "adam limit (rows/s)", r->adam_limit.per_s);
  else
    printf("  %-28s %16s\n", "adam limit (rows/s)", "n/a (not adam)");
  printf("  %-28s %16.3f %10s%.1f\n", "lookup_vs_gather", r->lookup_vs_gather,
         ">= ", lookup_target);
  printf("  %-28s %16.3f\n", "lookup_prepared_vs_gather",
         r->gather_limit > 0 ? r->prepared.per_s / r->gather_limit : 0.0);
  printf("  %-28s %16.3f %10s\n", "apply_vs_gather", r->apply_vs_gather,
         ">= 0.4");
  if (r->have_adam_limit)
    printf("  %-28s %16.3f\n", "apply_vs_adam_limit", r->apply_vs_adam_limit);
  else
    printf("  %-28s %16s\n", "apply_vs_adam_limit", "n/a");
  printf("  %-28s %16.2f %10s\n", "bytes/row overhead", r->overhead, "<= 24");
  if (o->skip_stall)
    printf("  %-28s %16s %10s\n", "max stall (ms)", "skipped", "<= 10");
  else
  {
    printf("  %-28s %16.3f %10s\n", "max stall (ms)", r->stall.max_call_ms,
           "<= 10");
    printf("  %-28s %16.3f\n", "  touch limit max call (ms)",
           r->touch.max_call_ms);
  }
  printf("  %-28s %16zu\n", "  stall batch (keys/call)", o->stall_batch);
  printf("  %-28s %16.3f\n", "max insert call (ms)", r->insert.max_call_ms);
  if (o->ssd_dir) {
    printf("  %-28s %16.0f\n", "ssd read limit (rows/s)", r->ssd_limit.per_s);
    printf("  %-28s %16.0f\n", "  ssd by pread (rows/s)", r->ssd_pread.per_s);
    if (o->ssd_cold) {
      printf("  %-28s %16.0f\n", "cold: ssd read limit", r->cold_limit.per_s);
      printf("  %-28s %16.0f\n", "cold: lookup eval (keys/s)", r->cold_eval.per_s);
      printf("  %-28s %16.0f\n", "cold: lookup train (keys/s)", r->cold_train.per_s);
    }
    printf("  %-28s %16" PRIu64 " / %" PRIu64 "\n", "rows in memory / on ssd",
           r->st.host_rows, r->st.ssd_rows);
  }
  printf("  %-28s %16" PRIu64 "\n", "table bytes", r->st.bytes);
  printf("  %-28s %16" PRIu64 "\n", "table rows", r->st.size);
  printf("  %-28s %9.2f -> %.2f\n", "load average (1 min)", r->load_start,
         r->load_end);
}

/* ------------------------------------------------------------------------ */
/* Main                                                                      */
/* ------------------------------------------------------------------------ */

int dynemb_cmd_bench(int argc, char **argv) {
  bench b;
  memset(&b, 0, sizeof b);
  b.limit_fd = -1;
  int prc = parse_opts(argc, argv, &b.o);
  if (prc == 1)
    return 0; /* --help */
  if (prc)
    return prc;
  const bench_opts *o = &b.o;
  int T = o->threads;
  uint64_t R = o->rows;
  int row_floats = o->dim * (1 + opt_slots(o->opt_kind));

  /* Key pools: about 1M keys per thread, whole batches, at least 2. */
  b.pool_batches = ((size_t)1 << 20) / o->batch;
  if (b.pool_batches < 2)
    b.pool_batches = 2;

  /* (the stall pass's table and its touch limit come and go before the
   * measured table, the flat arrays and the pools) */
  double est = (double)R * (double)row_floats * 4 + (double)R * o->dim * 4 +
               (double)R * 16 +
               (double)T * (double)b.pool_batches * (double)o->batch * 12 +
               (double)T * (double)o->batch * o->dim * 8 +
               (o->opt_kind == DYNEMB_OPT_ADAM ? (double)R * o->dim * 8 : 0);
  progress("%" PRIu64 " rows x dim %d (%d floats/row with %s slots), batch "
           "%zu, %s, %d thread(s); needs about %.2f GB",
           R, o->dim, row_floats, dynemb_optimizer_name(o->opt_kind), o->batch, o->dist, T,
           est / 1e9);

  /* Positions, keys, permutation. */
  b.all_keys = xmalloc((size_t)R * sizeof(int64_t), "keys");
  for (uint64_t p = 0; p < R; p++)
    b.all_keys[p] = position_key(p, o->seed);
  b.perm = xmalloc((size_t)R * sizeof(uint64_t), "permutation");
  {
    rng r = {o->seed ^ 0x9e7aULL};
    for (uint64_t i = 0; i < R; i++)
      b.perm[i] = i;
    for (uint64_t i = R - 1; i > 0; i--) {
      uint64_t j = rng_below(&r, i + 1);
      uint64_t tmp = b.perm[i];
      b.perm[i] = b.perm[j];
      b.perm[j] = tmp;
    }
  }

  worker *ws = calloc((size_t)T, sizeof *ws);
  if (!ws) {
    fprintf(stderr, "dynemb bench: out of memory\n");
    return 1;
  }
  size_t outn = o->batch > o->stall_batch ? o->batch : o->stall_batch;
  for (int i = 0; i < T; i++) {
    ws[i].b = &b;
    ws[i].id = i;
    ws[i].out = xmalloc(outn * (size_t)o->dim * sizeof(float), "outputs");
    ws[i].grads = xmalloc(o->batch * (size_t)o->dim * sizeof(float), "grads");
    memset(ws[i].out, 0, outn * (size_t)o->dim * sizeof(float));
    rng r = {o->seed + 99ULL * (uint64_t)(i + 1)};
    for (size_t k = 0; k < o->batch * (size_t)o->dim; k++)
      ws[i].grads[k] = (float)((rng_unit(&r) - 0.5) * 2e-3);
  }
  progress("drawing %zu x %zu keys per thread from %s", b.pool_batches,
           o->batch, o->dist);
  make_pools(&b, ws);

  results r;
  memset(&r, 0, sizeof r);
  r.row_floats = row_floats;
  r.load_start = loadavg_1m();

  /* 1. Stall pass: a scratch table grows from empty in small calls, after
   * its limit: writing the same fresh memory in calls of the same size.
   * The limit's memory stays mapped during the stall pass, so that the
   * table cannot reuse pages the limit just faulted in (and freed). */
  if (!o->skip_stall) {
    b.row_bytes = (size_t)row_floats * sizeof(float);
    b.touch_bytes = (size_t)R * b.row_bytes;
    progress("touch limit: writing %.2f GB of fresh memory, %zu rows' bytes "
             "per call",
             (double)b.touch_bytes / 1e9, o->stall_batch);
    b.touch = (char *)map_floats(&b, b.touch_bytes, "touch limit");
#ifdef MADV_HUGEPAGE
    (void)madvise(b.touch, b.touch_bytes, MADV_HUGEPAGE); /* as row slabs */
#endif
    r.touch = run_phase(&b, ws, PH_TOUCH, NULL, o->stall_batch, "touch limit");
    char name[64];
    snprintf(name, sizeof name, "bench_stall_%ld", (long)getpid());
    dynemb_table *t = make_table(&b, name);
    progress("stall pass: growing '%s' to %" PRIu64 " rows, %zu keys per "
             "call",
             name, R, o->stall_batch);
    r.stall = run_phase(&b, ws, PH_STALL, t, o->stall_batch, "stall pass");
    dynemb_table_drop(name);
    dynemb_table_release(t);
    munmap(b.touch, b.touch_bytes);
    b.touch = NULL;
  }

  /* 2. Insert: the measured table grows from empty in batches of B. */
  char tname[64];
  snprintf(tname, sizeof tname, "bench_%ld", (long)getpid());
  b.table = make_table(&b, tname);
  if (dynemb_table_row_floats(b.table) != row_floats) {
    fprintf(stderr, "dynemb bench: table has %d floats per row, expected %d\n",
            dynemb_table_row_floats(b.table), row_floats);
    return 1;
  }
  progress("insert: growing '%s' to %" PRIu64 " rows, %zu keys per call", tname,
           R, o->batch);
  r.insert = run_phase(&b, ws, PH_INSERT, b.table, o->batch, "insert");
  dynemb_table_get_stats(b.table, &r.st);
  if (r.st.size != R) {
    fprintf(stderr,
            "dynemb bench: table has %" PRIu64 " rows after inserting "
            "%" PRIu64 " distinct keys\n",
            r.st.size, R);
    return 1;
  }
  /* (with an SSD tier, only the rows in memory count as row bytes) */
  r.overhead = ((double)r.st.bytes -
                (double)r.st.host_rows * row_floats * 4.0) / (double)R;

  /* 3. Gather limit on a flat array of the same rows and dim. */
  progress("gather: filling a flat %" PRIu64 " x %d float array (%.2f GB)", R,
           o->dim, (double)R * o->dim * 4 / 1e9);
  alloc_flat(&b);
  r.gplain = run_phase(&b, ws, PH_GATHER_PLAIN, NULL, 0, "gather (plain)");
  r.gpref = run_phase(&b, ws, PH_GATHER_PREFETCH, NULL, 0, "gather (prefetch)");

  /* 4. Lookups of existing keys. */
  r.lookup = run_phase(&b, ws, PH_LOOKUP_TRAIN, b.table, 0, "lookup (train)");
  r.lookup_eval =
      run_phase(&b, ws, PH_LOOKUP_EVAL, b.table, 0, "lookup (eval)");
  /* Reads of prepared batches: the pools' row tickets, made once (not
   * timed) as an input pipeline's dynemb_prepare would. */
  for (int i = 0; i < o->threads; i++) {
    size_t per = b.pool_batches * o->batch;
    ws[i].tickets = xmalloc(per * sizeof(uint64_t), "tickets");
    int rc = dynemb_prepare(b.table, ws[i].keys, per, DYNEMB_LOOKUP_TRAIN, 1,
                            NULL, ws[i].tickets);
    if (rc) die_engine("dynemb_prepare", rc);
  }
  r.prepared =
      run_phase(&b, ws, PH_LOOKUP_PREPARED, b.table, 0, "lookup (prepared)");

  /* 5. Apply. */
  r.apply = run_phase(&b, ws, PH_APPLY, b.table, 0, "apply");
  /* Applies of prepared batches through their row tickets (training's
   * path: the tickets above are still current, nothing was evicted). */
  r.apply_prepared =
      run_phase(&b, ws, PH_APPLY_PREPARED, b.table, 0, "apply (prepared)");

  /* 6. Adam limit: the same update at the same positions, with the same
   * gradients, on flat arrays (the gather array and a slot array). */
  if (o->opt_kind == DYNEMB_OPT_ADAM) {
    progress("adam limit: filling a flat %" PRIu64 " x %d float slot array "
             "(%.2f GB)",
             R, 2 * o->dim, (double)R * o->dim * 8 / 1e9);
    alloc_slots(&b);
    r.adam_limit = run_phase(&b, ws, PH_ADAM_LIMIT, NULL, 0, "adam limit");
    r.have_adam_limit = 1;
    r.apply_vs_adam_limit =
        r.adam_limit.per_s > 0 ? r.apply.per_s / r.adam_limit.per_s : 0;
  }

  /* 7. The SSD tier's read limit (its file is made after the engine's
   * phases, so that it does not take their page cache). */
  if (o->ssd_dir) {
    b.record_bytes = (size_t)row_floats * sizeof(float);
    progress("ssd read limit: writing %" PRIu64 " records of %zu bytes in '%s'",
             R, b.record_bytes, o->ssd_dir);
    make_limit_file(&b);
    r.ssd_limit = run_phase(&b, ws, PH_SSD_LIMIT, NULL, 0, "ssd read limit");
    r.ssd_pread = run_phase(&b, ws, PH_SSD_PREAD, NULL, 0, "ssd reads by pread");
    if (o->ssd_cold) {
      r.cold_limit = cold_phase(&b, ws, PH_SSD_LIMIT, "cold: ssd read limit");
      r.cold_eval = cold_phase(&b, ws, PH_LOOKUP_EVAL, "cold: lookup (eval)");
      r.cold_train = cold_phase(&b, ws, PH_LOOKUP_TRAIN, "cold: lookup (train)");
    }
  }

  /* The limit once more, after the engine phases, so that a drift of the
   * machine's speed during the run shows and the better figure is used. */
  phase_result g2 = run_phase(&b, ws, PH_GATHER_PREFETCH, NULL, 0,
                              "gather (prefetch, again)");
  if (g2.per_s > r.gpref.per_s)
    r.gpref = g2;
  r.gather_limit =
      r.gplain.per_s > r.gpref.per_s ? r.gplain.per_s : r.gpref.per_s;
  r.lookup_vs_gather = r.gather_limit > 0 ? r.lookup.per_s / r.gather_limit : 0;
  r.apply_vs_gather = r.gather_limit > 0 ? r.apply.per_s / r.gather_limit : 0;
  dynemb_table_get_stats(b.table, &r.st);
  r.load_end = loadavg_1m();

  if (o->json)
    print_json(&b, &r);
  else
    print_human(&b, &r);

  dynemb_table_drop(tname);
  dynemb_table_release(b.table);
  for (int i = 0; i < T; i++) {
    free(ws[i].keys);
    free(ws[i].pos);
    free(ws[i].tickets);
    free(ws[i].out);
    free(ws[i].grads);
  }
  free(ws);
  if (b.flat_mmapped)
    munmap(b.flat, b.flat_bytes);
  if (b.slots)
    munmap(b.slots, b.slots_bytes);
  if (b.limit_map)
    munmap((void *)(uintptr_t)b.limit_map, b.limit_bytes);
  if (b.limit_fd >= 0)
    close(b.limit_fd);
  free(b.perm);
  free(b.all_keys);
  return 0;
}
