/*
 * tsan_stress.c -- concurrency stress test, built with ThreadSanitizer.
 *
 * Several threads run train lookups, SGD applies, evictions, snapshots,
 * imports (of other keys), stats and registry find/release on one table at
 * once. Keys come in two
 * classes: "stale" keys inserted at time 0 before the threads start (the
 * evictors remove them) and "live" keys that the workers look up at time
 * >= 1000 (never old enough to be evicted). Afterwards no live key is lost,
 * every live row equals minus the number of times it was updated (each
 * apply adds gradient 1 with learning rate 1 to a zero row), and the stats
 * counters add up to what the threads did. An incremental-checkpoint
 * thread saves a full checkpoint and then deltas meanwhile (each read back
 * whole through its chain must be well formed), and a last delta saved
 * after the threads stop reads back exactly as the table. The same runs
 * again on a table whose host memory holds 2,000 rows over an SSD tier.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "dynemb.h"

enum { THREADS = 4, LIVE = 20000, STALE = 5000, ROUNDS = 150, BATCH = 256, DIM = 4 };

static dynemb_table *T;
static int stop_flag;

typedef struct worker {
  int id;
  uint64_t seed;
  uint32_t applied_times[LIVE]; /* this thread's updates per live key */
  unsigned char seen[LIVE];
  uint64_t lookups, applied, dropped, errors;
} worker;

static uint64_t next_rand(uint64_t *s) { return check_xorshift(s); }

static int64_t live_key(uint32_t i) { return (int64_t)i * 7919 - 3000000; }
static int64_t stale_key(uint32_t i) { return INT64_C(1) << 40 | i; }

static void *work(void *arg) {
  worker *w = arg;
  int64_t keys[BATCH];
  uint32_t idx[BATCH];
  float out[BATCH * DIM], g[BATCH * DIM];
  for (int i = 0; i < BATCH * DIM; i++) g[i] = 1.0f;
  for (int r = 0; r < ROUNDS; r++) {
    for (int i = 0; i < BATCH; i++) {
      /* half the batch from a hot range shared by all threads */
      uint64_t x = next_rand(&w->seed);
      idx[i] = (uint32_t)(i % 2 ? x % 500 : x % LIVE);
      keys[i] = live_key(idx[i]);
    }
    int64_t now = 1000 + r;
    if (dynemb_lookup(T, keys, BATCH, DYNEMB_LOOKUP_TRAIN, now, NULL, out,
                      NULL))
      w->errors++;
    w->lookups += BATCH;
    for (int i = 0; i < BATCH; i++) w->seen[idx[i]] = 1;
    /* apply to the keys just looked up (so they exist): each distinct key
     * gets sum of its occurrences' gradients = occurrence count */
    dynemb_apply_stats as;
    if (dynemb_apply(T, keys, BATCH, g, 1.0f, NULL, &as)) w->errors++;
    for (int i = 0; i < BATCH; i++) w->applied_times[idx[i]]++;
    w->applied += as.applied;
    w->dropped += as.dropped_unknown;
    if (r % 10 == 0) {
      dynemb_table_stats st;
      dynemb_table_get_stats(T, &st);
    }
  }
  return NULL;
}

static void *evictor(void *arg) {
  size_t *total = arg;
  while (!__atomic_load_n(&stop_flag, __ATOMIC_RELAXED)) {
    size_t ev = 0;
    if (dynemb_evict(T, 1100, DYNEMB_TABLE_THRESHOLD, &ev) == DYNEMB_OK)
      *total += ev;
  }
  return NULL;
}

/* Imports rows of keys no worker uses (values 5), in slices, and
 * evaluates them back. */
enum { IMPORTED = 3000 };
static int64_t imported_key(uint32_t i) { return -(INT64_C(1) << 50) - i; }
static uint64_t import_lookups, import_hits; /* importer thread only */

/* A snapshot holding the importer's rows (arrays owned by the caller). */
static dynemb_snapshot import_snapshot(int64_t *keys, float *vals,
                                       uint32_t *la) {
  dynemb_snapshot s;
  memset(&s, 0, sizeof s);
  s.dim = DIM;
  s.row_floats = DIM;
  s.optimizer_kind = DYNEMB_OPT_SGD;
  s.rows = IMPORTED;
  s.keys = keys;
  s.values = vals;
  s.last_access = la;
  return s;
}

static void *importer(void *arg) {
  int *bad = arg;
  static int64_t keys[IMPORTED];
  static float vals[IMPORTED * DIM];
  static uint32_t la[IMPORTED];
  for (uint32_t i = 0; i < IMPORTED; i++) {
    keys[i] = imported_key(i);
    la[i] = 1050;
    for (int j = 0; j < DIM; j++) vals[i * DIM + j] = 5.0f;
  }
  uint32_t part = 0;
  float out[16 * DIM];
  while (!__atomic_load_n(&stop_flag, __ATOMIC_RELAXED)) {
    dynemb_snapshot s = import_snapshot(keys, vals, la);
    if (dynemb_table_import(T, &s, DYNEMB_IMPORT_KEEP_STEPS, part % 4, 4)) (*bad)++;
    part++;
    if (dynemb_lookup(T, keys, 16, DYNEMB_LOOKUP_EVAL, 0, NULL, out, NULL))
      (*bad)++;
    import_lookups += 16;
    for (int i = 0; i < 16; i++) import_hits += out[i * DIM] == 5.0f;
  }
  dynemb_snapshot s = import_snapshot(keys, vals, la);
  if (dynemb_table_import(T, &s, DYNEMB_IMPORT_KEEP_STEPS, 0, 0)) (*bad)++;
  return NULL;
}

static void *snapshotter(void *arg) {
  int *bad = arg;
  while (!__atomic_load_n(&stop_flag, __ATOMIC_RELAXED)) {
    dynemb_snapshot s;
    if (dynemb_table_snapshot(T, &s)) {
      (*bad)++;
      continue;
    }
    for (size_t i = 1; i < s.rows; i++)
      if (s.keys[i - 1] >= s.keys[i]) (*bad)++;
    for (size_t i = 0; i < s.rows * DIM; i++)
      if ((s.values[i] > 0 && s.values[i] != 5.0f) ||
          s.values[i] != (float)(int)s.values[i])
        (*bad)++;
    dynemb_snapshot_free(&s);
    dynemb_table *f = NULL;
    if (dynemb_table_find("stress", &f) == DYNEMB_OK) dynemb_table_release(f);
    else (*bad)++;
  }
  return NULL;
}

/* Saves a full incremental checkpoint and deltas into <inc_dir>/<n>. */
static char inc_dir[512];
static int inc_saves;

static int inc_save(int *bad) {
  char d[600];
  snprintf(d, sizeof d, "%s/%d", inc_dir, inc_saves++);
  int delta = 0;
  if (dynemb_checkpoint_save_incremental(d, &T, 1, 0, &delta)) return (*bad)++, 0;
  dynemb_snapshot s;
  if (dynemb_checkpoint_read(d, "stress", &s)) return (*bad)++, 0;
  for (size_t i = 1; i < s.rows; i++)
    if (s.keys[i - 1] >= s.keys[i]) (*bad)++;
  for (size_t i = 0; i < s.rows * DIM; i++)
    if (s.values[i] != (float)(int)s.values[i]) (*bad)++;
  dynemb_snapshot_free(&s);
  return delta;
}

static void *inc_saver(void *arg) {
  int *bad = arg;
  while (!__atomic_load_n(&stop_flag, __ATOMIC_RELAXED) && inc_saves < 6)
    (void)inc_save(bad);
  return NULL;
}

static worker workers[THREADS];

static void run_stress(uint64_t host) {
  memset(workers, 0, sizeof workers);
  stop_flag = 0;
  import_lookups = import_hits = 0;
  dynemb_table_config c;
  dynemb_table_config_init(&c);
  c.name = "stress";
  c.dim = DIM;
  c.shards = 16;
  c.eviction_threshold = 500;
  c.optimizer.learning_rate = 1.0f;
  if (host) { /* rows keep moving between memory and the SSD tier */
    const char *tmp = getenv("TMPDIR");
    c.host_vocabulary_size = host;
    c.ssd_vocabulary_size = LIVE + STALE + IMPORTED;
    c.ssd_data_path = tmp && tmp[0] ? tmp : "/tmp";
  }
  CHECK_OK(dynemb_table_create(&c, &T));
  if (!T) return;
  int64_t *stale = malloc(STALE * sizeof *stale);
  float *out = malloc(sizeof(float) * STALE * DIM);
  for (uint32_t i = 0; i < STALE; i++) stale[i] = stale_key(i);
  CHECK_OK(
      dynemb_lookup(T, stale, STALE, DYNEMB_LOOKUP_TRAIN, 0, NULL, out, NULL));

  pthread_t th[THREADS], ev, sn, im, inc;
  size_t evicted = 0;
  int snap_bad = 0, import_bad = 0, inc_bad = 0;
  const char *tmpd = getenv("TMPDIR");
  snprintf(inc_dir, sizeof inc_dir, "%s/tsan-inc-XXXXXX", tmpd && *tmpd ? tmpd : "/tmp");
  CHECK(mkdtemp(inc_dir) != NULL);
  inc_saves = 0;
  for (int i = 0; i < THREADS; i++) {
    workers[i].id = i;
    workers[i].seed = 0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1);
    pthread_create(&th[i], NULL, work, &workers[i]);
  }
  pthread_create(&ev, NULL, evictor, &evicted);
  pthread_create(&sn, NULL, snapshotter, &snap_bad);
  pthread_create(&im, NULL, importer, &import_bad);
  pthread_create(&inc, NULL, inc_saver, &inc_bad);
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  __atomic_store_n(&stop_flag, 1, __ATOMIC_RELAXED);
  pthread_join(ev, NULL);
  pthread_join(sn, NULL);
  pthread_join(im, NULL);
  pthread_join(inc, NULL);
  CHECK(import_bad == 0);
  /* quiet now: one more delta reads back as the table is */
  CHECK(inc_save(&inc_bad) == 1 && inc_bad == 0 && inc_saves >= 2);
  {
    char d[600];
    snprintf(d, sizeof d, "%s/%d", inc_dir, inc_saves - 1);
    dynemb_snapshot a, b;
    CHECK_OK(dynemb_checkpoint_read(d, "stress", &a));
    CHECK_OK(dynemb_table_snapshot(T, &b));
    CHECK(a.rows == b.rows && a.candidates == b.candidates &&
          !memcmp(a.keys, b.keys, a.rows * sizeof *a.keys) &&
          !memcmp(a.values, b.values, a.rows * DIM * sizeof(float)) &&
          !memcmp(a.last_access, b.last_access, a.rows * sizeof *a.last_access));
    dynemb_snapshot_free(&a);
    dynemb_snapshot_free(&b);
    for (int k = 0; k < inc_saves; k++) { /* (the files of the chain) */
      char cmd[700];
      snprintf(cmd, sizeof cmd, "rm -rf '%s/%d'", inc_dir, k);
      if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", inc_dir);
    }
    rmdir(inc_dir);
  }
  size_t ev_last = 0;
  CHECK_OK(dynemb_evict(T, 1100, DYNEMB_TABLE_THRESHOLD, &ev_last));
  evicted += ev_last;

  CHECK(snap_bad == 0);
  CHECK(evicted == STALE);
  uint64_t lookups = STALE, applied = 0, dropped = 0, errors = 0;
  for (int i = 0; i < THREADS; i++) {
    lookups += workers[i].lookups;
    applied += workers[i].applied;
    dropped += workers[i].dropped;
    errors += workers[i].errors;
  }
  CHECK(errors == 0 && dropped == 0);
  /* no live key lost, values = -(updates) */
  uint32_t distinct = 0;
  int64_t *lk = malloc(LIVE * sizeof *lk);
  float *lv = malloc(sizeof(float) * LIVE * DIM);
  uint32_t n = 0;
  for (uint32_t k = 0; k < LIVE; k++) {
    int seen = 0;
    for (int i = 0; i < THREADS; i++) seen |= workers[i].seen[k];
    if (seen) lk[n++] = live_key(k);
  }
  distinct = n;
  CHECK_OK(dynemb_lookup(T, lk, n, DYNEMB_LOOKUP_EVAL, 0, NULL, lv, NULL));
  int wrong = 0;
  n = 0;
  for (uint32_t k = 0; k < LIVE; k++) {
    uint32_t times = 0;
    int seen = 0;
    for (int i = 0; i < THREADS; i++) {
      times += workers[i].applied_times[k];
      seen |= workers[i].seen[k];
    }
    if (!seen) continue;
    for (int j = 0; j < DIM; j++) wrong += lv[n * DIM + j] != -(float)times;
    n++;
  }
  CHECK(wrong == 0);
  /* every imported row is there, with its value */
  int64_t ik[IMPORTED];
  float *iv = malloc(sizeof(float) * IMPORTED * DIM);
  for (uint32_t i = 0; i < IMPORTED; i++) ik[i] = imported_key(i);
  CHECK_OK(
      dynemb_lookup(T, ik, IMPORTED, DYNEMB_LOOKUP_EVAL, 0, NULL, iv, NULL));
  int iwrong = 0;
  for (uint32_t i = 0; i < IMPORTED * DIM; i++) iwrong += iv[i] != 5.0f;
  CHECK(iwrong == 0);
  free(iv);
  dynemb_table_stats st;
  dynemb_table_get_stats(T, &st);
  CHECK(st.size == distinct + IMPORTED);
  CHECK(st.inserted == distinct + STALE);
  CHECK(st.evicted == STALE);
  /* every lookup is counted; train lookups were hits or inserts, eval
   * lookups hits or misses */
  uint64_t all = lookups + distinct + IMPORTED + import_lookups;
  CHECK(st.lookups == all);
  CHECK(st.rejected == 0);
  CHECK(st.hits == all - st.inserted - (import_lookups - import_hits));
  CHECK(st.applied == applied && st.dropped_gradients == 0);
  CHECK(st.apply_steps == (uint64_t)THREADS * ROUNDS);
  CHECK(st.size <= st.capacity);
  CHECK(st.host_rows + st.ssd_rows == st.size);
  if (host) CHECK(st.ssd_reads > 1000 && st.ssd_writes > 1000);
  free(lk);
  free(lv);
  free(stale);
  free(out);
  dynemb_table_release(T);
  dynemb_registry_clear();
}

static void test_stress(void) { run_stress(0); }
static void test_stress_ssd(void) { run_stress(2000); }

int main(void) {
  RUN(test_stress);
  RUN(test_stress_ssd);
  return check_summary();
}
