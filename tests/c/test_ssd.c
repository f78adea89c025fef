/*
 * test_ssd.c -- the SSD tier: the record file on its own (allocation, free
 * list, capacity, round trips), and tables whose host memory holds a few
 * rows checked against the same table without a tier. For every optimizer
 * (their slots travel through the file too), train lookups, eval lookups,
 * prepared reads and applies must give bit-identical floats, and so must a
 * checkpoint written and loaded back (streamed from and into the tiers,
 * byte-identical to a save of a whole snapshot). Then: both tiers full (ECAPACITY
 * naming both sizes), eviction of rows on SSD, clear, and a disk that
 * refuses writes (RLIMIT_FSIZE): EIO naming the directory, nothing lost.
 */
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "dynemb.h"
#include "ckpt.h"
#include "init.h"
#include "optim.h"
#include "ssd.h"
#include "table_int.h"

static const char *tmpdir(void) {
  const char *t = getenv("TMPDIR");
  return t && t[0] ? t : "/tmp";
}

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { return check_xorshift(&rs); }

/* ---- the record file ----------------------------------------------------- */

static void test_store_records(void) {
  dynemb_ssd s;
  CHECK_OK(dynemb_ssd_open(&s, tmpdir(), "store", 3 * sizeof(float),
                           6 * sizeof(float), 4));
  uint32_t r[5];
  for (int i = 0; i < 4; i++) CHECK_OK(dynemb_ssd_alloc(&s, &r[i]));
  CHECK(r[0] == 0 && r[3] == 3);
  CHECK(dynemb_ssd_alloc(&s, &r[4]) == DYNEMB_ECAPACITY); /* 4 at most */
  float e[3], sl[6], ge[3], gs[6];
  for (int i = 0; i < 4; i++) {
    for (int j = 0; j < 3; j++) e[j] = (float)(10 * i + j);
    for (int j = 0; j < 6; j++) sl[j] = (float)(-100 * i - j);
    CHECK_OK(dynemb_ssd_write(&s, r[i], e, sl));
  }
  CHECK_OK(dynemb_ssd_read(&s, r[2], ge, gs));
  CHECK(ge[0] == 20 && ge[2] == 22 && gs[0] == -200 && gs[5] == -205);
  memset(ge, 0, sizeof ge);
  CHECK_OK(dynemb_ssd_read(&s, r[3], ge, NULL)); /* embedding only */
  CHECK(ge[1] == 31);
  dynemb_ssd_release(&s, r[1]);
  CHECK(dynemb_ssd_used(&s) == 3 && dynemb_ssd_high(&s) == 4);
  CHECK_OK(dynemb_ssd_alloc(&s, &r[4]));
  CHECK(r[4] == 1); /* freed records are reused before the file grows */
  CHECK(s.reads == 2 && s.writes == 4);
  dynemb_ssd_reset(&s);
  CHECK(dynemb_ssd_used(&s) == 0 && dynemb_ssd_high(&s) == 0);
  /* past the end of the (truncated) file: a clear error, not zeros */
  CHECK(dynemb_ssd_read(&s, 0, ge, gs) == DYNEMB_EIO);
  CHECK(strstr(dynemb_last_error(), "store") != NULL);
  dynemb_ssd_close(&s);
  dynemb_ssd_close(&s); /* closing twice is harmless */
}

/* The readahead policy (ssd.h): a major fault turns it on for
 * DYNEMB_SSD_READAHEAD_CALLS calls that count it down while they fault no
 * more; calls without readahead and without faults change nothing. */
static void test_readahead_policy(void) {
  dynemb_ssd s;
  CHECK_OK(dynemb_ssd_open(&s, tmpdir(), "ra", 16, 0, 64));
  CHECK(!dynemb_ssd_readahead_wanted(&s));
  dynemb_ssd_note_faults(&s, 0, 0);
  CHECK(!dynemb_ssd_readahead_wanted(&s));
  dynemb_ssd_note_faults(&s, 3, 0);
  for (int i = 0; i < DYNEMB_SSD_READAHEAD_CALLS; i++) {
    CHECK(dynemb_ssd_readahead_wanted(&s));
    dynemb_ssd_note_faults(&s, i == 5 ? 1 : 0, 1); /* a fault: from the top */
  }
  /* 16 from the fault at call 5, 10 counted down since: 6 left */
  for (int i = 0; i < 5; i++) dynemb_ssd_note_faults(&s, 0, 1);
  CHECK(dynemb_ssd_readahead_wanted(&s));
  dynemb_ssd_note_faults(&s, 0, 1);
  CHECK(!dynemb_ssd_readahead_wanted(&s));
  /* advising records (also never handed out ones) is harmless */
  uint32_t r[3];
  for (int i = 0; i < 3; i++) CHECK_OK(dynemb_ssd_alloc(&s, &r[i]));
  uint32_t recs[5] = {r[0], r[2], r[1], 40, r[0]};
  dynemb_ssd_willneed(&s, recs, 5);
  CHECK(dynemb_ssd_thread_major_faults() < UINT64_MAX);
  dynemb_ssd_close(&s);
}

/* ---- tables with and without the tier ------------------------------------ */

enum { DIM = 5, KEYS = 400, BATCH = 48 };

static dynemb_table *make(const char *name, int opt, uint64_t host, int shards) {
  dynemb_table_config c;
  dynemb_table_config_init(&c);
  c.name = name;
  c.dim = DIM;
  c.shards = shards;
  c.init.kind = DYNEMB_INIT_NORMAL;
  c.init.a = 0.0f;
  c.init.b = 0.5f;
  c.init.seed = 7;
  c.optimizer.kind = opt;
  c.optimizer.learning_rate = 0.05f;
  c.eviction_threshold = 1000000;
  if (host) {
    c.host_vocabulary_size = host;
    c.ssd_vocabulary_size = KEYS;
    c.ssd_data_path = tmpdir();
  }
  dynemb_table *t = NULL;
  CHECK_OK(dynemb_table_create(&c, &t));
  return t;
}

static int same_snapshots(dynemb_table *a, dynemb_table *b) {
  dynemb_snapshot x, y;
  if (dynemb_table_snapshot(a, &x)) return 0;
  if (dynemb_table_snapshot(b, &y)) {
    dynemb_snapshot_free(&x);
    return 0;
  }
  int same = x.rows == y.rows && x.row_floats == y.row_floats &&
             memcmp(x.keys, y.keys, x.rows * sizeof *x.keys) == 0 &&
             memcmp(x.values, y.values,
                    x.rows * (size_t)x.row_floats * sizeof(float)) == 0 &&
             memcmp(x.last_access, y.last_access,
                    x.rows * sizeof *x.last_access) == 0;
  dynemb_snapshot_free(&x);
  dynemb_snapshot_free(&y);
  return same;
}

/* Whether file `f` has the same bytes in directories a and b. */
static int same_files(const char *a, const char *b, const char *f) {
  char pa[700], pb[700];
  snprintf(pa, sizeof pa, "%s/%s", a, f);
  snprintf(pb, sizeof pb, "%s/%s", b, f);
  FILE *x = fopen(pa, "rb"), *y = fopen(pb, "rb");
  int same = x && y;
  while (same) {
    int c = fgetc(x), d = fgetc(y);
    if (c != d) same = 0;
    if (c == EOF) break;
  }
  if (x) fclose(x);
  if (y) fclose(y);
  return same;
}

/* Runs the same random steps on a plain table and on one with 24 rows of
 * host memory over SSD; every output must be bit-identical. */
static void run_pair(int opt, int shards) {
  dynemb_table *a = make("plain", opt, 0, shards);
  dynemb_table *b = make("tiered", opt, 24, shards);
  if (!a || !b) return;
  int64_t keys[BATCH];
  dynemb_ticket tickets[BATCH];
  float oa[BATCH * DIM], ob[BATCH * DIM], g[BATCH * DIM];
  int bad = 0;
  for (int step = 1; step <= 300 && !bad; step++) {
    int n = 1 + (int)(rnd() % BATCH);
    for (int i = 0; i < n; i++) /* a hot set of 40 keys, the rest rare */
      keys[i] = (int64_t)(rnd() % 4 ? rnd() % 40 : rnd() % KEYS) * 7919 - 1000;
    uint64_t op = rnd() % 4;
    /* in half of the steps the tier reads as if they had faulted: calls
     * advise their records first (ssd.h; the same rows must come out) */
    if (rnd() % 2) dynemb_ssd_note_faults(&b->ssd, 1, 0);
    if (op == 0) { /* train lookup */
      CHECK_OK(dynemb_lookup(a, keys, (size_t)n, DYNEMB_LOOKUP_TRAIN, step,
                             NULL, oa, NULL));
      CHECK_OK(dynemb_lookup(b, keys, (size_t)n, DYNEMB_LOOKUP_TRAIN, step,
                             NULL, ob, NULL));
    } else if (op == 1) { /* eval lookup: rows on SSD are read in place */
      CHECK_OK(dynemb_lookup(a, keys, (size_t)n, DYNEMB_LOOKUP_EVAL, step, NULL,
                             oa, NULL));
      CHECK_OK(dynemb_lookup(b, keys, (size_t)n, DYNEMB_LOOKUP_EVAL, step, NULL,
                             ob, NULL));
    } else { /* prepare + prepared read + (prepared) apply, as a training step */
      CHECK_OK(dynemb_prepare(a, keys, (size_t)n, DYNEMB_LOOKUP_TRAIN, step,
                              NULL, tickets));
      CHECK_OK(dynemb_lookup_prepared(a, keys, tickets, (size_t)n, oa, NULL));
      CHECK_OK(dynemb_prepare(b, keys, (size_t)n, DYNEMB_LOOKUP_TRAIN, step,
                              NULL, tickets));
      /* another prepare in between moves rows: some tickets go stale */
      int64_t other[8];
      for (int i = 0; i < 8; i++) other[i] = (int64_t)(rnd() % KEYS) * 7919 - 1000;
      if (op == 3) {
        CHECK_OK(dynemb_lookup(a, other, 8, DYNEMB_LOOKUP_TRAIN, step, NULL, g,
                               NULL));
        CHECK_OK(dynemb_lookup(b, other, 8, DYNEMB_LOOKUP_TRAIN, step, NULL, g,
                               NULL));
      }
      CHECK_OK(dynemb_lookup_prepared(b, keys, tickets, (size_t)n, ob, NULL));
      for (int i = 0; i < n * DIM; i++) g[i] = (float)((int)(rnd() % 33) - 16) / 16;
      CHECK_OK(dynemb_apply(a, keys, (size_t)n, g, -1.0f, NULL, NULL));
      CHECK_OK(dynemb_apply(b, keys, (size_t)n, g, -1.0f,
                            &(dynemb_apply_opts){.tickets = tickets}, NULL));
    }
    if (memcmp(oa, ob, sizeof(float) * (size_t)(n * DIM)) != 0) {
      fprintf(stderr, "%s, step %d (op %d): outputs differ\n",
              dynemb_optimizer_name(opt), step, (int)op);
      bad++;
    }
    if (step % 50 == 0 && !same_snapshots(a, b)) {
      fprintf(stderr, "%s, step %d: snapshots differ\n", dynemb_optimizer_name(opt), step);
      bad++;
    }
  }
  CHECK(bad == 0);
  dynemb_table_stats sa, sb;
  dynemb_table_get_stats(a, &sa);
  dynemb_table_get_stats(b, &sb);
  CHECK(sa.size == sb.size && sb.size > 200);
  CHECK(sa.ssd_rows == 0 && sa.host_rows == sa.size);
  CHECK(sb.host_rows + sb.ssd_rows == sb.size);
  CHECK(sb.host_rows == 24); /* room is always made, single-threaded */
  CHECK(sb.ssd_reads > 300 && sb.ssd_writes > 300); /* rows moved a lot */
  CHECK(sb.ssd_bytes >= sb.ssd_rows * DIM * sizeof(float));
  CHECK(sa.applied == sb.applied && sa.hits == sb.hits);
  /* lookups that found their row on SSD: some, not all (24 rows of memory
   * for a hot set of 40 keys) */
  CHECK(sa.ssd_lookups == 0 && sb.ssd_lookups > 50 && sb.ssd_lookups < sb.hits);

  /* a checkpoint of the tiered table loads into a plain one, and back */
  char dir[512];
  snprintf(dir, sizeof dir, "%s/dynemb-test-ssd-%d", tmpdir(), (int)getpid());
  CHECK_OK(dynemb_checkpoint_save(dir, &b, 1));
  dynemb_table *c = make("plain2", opt, 0, 4);
  dynemb_table *d = make("tiered2", opt, 16, 1);
  CHECK_OK(dynemb_checkpoint_load(dir, c, "tiered", 0, 0, 0, NULL));
  /* into a tiered table the load streams, here in steps of 37 rows */
  dynemb_ckpt_load_chunk_rows = 37;
  CHECK_OK(dynemb_checkpoint_load(dir, d, "tiered", DYNEMB_IMPORT_REPLACE, 0, 0,
                                  NULL));
  CHECK(same_snapshots(a, c));
  CHECK(same_snapshots(a, d));
  dynemb_table_stats sc;
  dynemb_table_get_stats(c, &sc);
  dynemb_table_get_stats(b, &sb);
  CHECK(sc.apply_steps == sb.apply_steps);
  /* the streamed save wrote the bytes a save from a snapshot writes */
  dynemb_snapshot whole;
  CHECK_OK(dynemb_table_snapshot(b, &whole));
  char dir2[600];
  snprintf(dir2, sizeof dir2, "%s-copy", dir);
  const char *nm = "tiered";
  const dynemb_snapshot *sp = &whole;
  CHECK_OK(dynemb_ckpt_save_snapshots(dir2, &nm, &sp, 1));
  dynemb_snapshot_free(&whole);
  CHECK(same_files(dir, dir2, "g000001-t0000.dtab"));
  dynemb_table_stats sd;
  dynemb_table_get_stats(d, &sd);
  CHECK(sd.host_rows == 16 && sd.ssd_rows == sd.size - 16);
  /* loading again (no replace) rewrites rows where they are */
  CHECK_OK(dynemb_checkpoint_load(dir, d, "tiered", 0, 0, 0, NULL));
  CHECK(same_snapshots(a, d));
  dynemb_ckpt_load_chunk_rows = 0;
  char cmd[1300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, dir2);
  CHECK(system(cmd) == 0);
  dynemb_table_release(a);
  dynemb_table_release(b);
  dynemb_table_release(c);
  dynemb_table_release(d);
  dynemb_registry_clear();
}

/* A tiered table with admission candidates and optimizer steps, saved
 * (streamed) and loaded (streamed, in steps of 5 rows) into another tiered
 * table: everything comes back, candidates and step count included. */
static void test_checkpoint_candidates_streamed(void) {
  dynemb_table *a = make("cand_src", DYNEMB_OPT_ADAM, 6, 4);
  if (!a) return;
  CHECK_OK(dynemb_table_set_access_threshold(a, 3));
  int64_t k[40];
  float out[40 * DIM], g[40 * DIM];
  for (int i = 0; i < 40 * DIM; i++) g[i] = 0.25f;
  for (int r = 0; r < 6; r++) { /* keys 0..19 each round; 10 new keys seen
                                  * twice per round (candidates) */
    for (int i = 0; i < 40; i++) k[i] = i < 20 ? i : 100 + r * 10 + (i - 20) % 10;
    CHECK_OK(dynemb_lookup(a, k, 40, DYNEMB_LOOKUP_TRAIN, r, NULL, out, NULL));
    CHECK_OK(dynemb_apply(a, k, 40, g, -1.0f, NULL, NULL));
  }
  dynemb_table_stats st;
  dynemb_table_get_stats(a, &st);
  CHECK(st.candidates > 0 && st.ssd_rows > 0);
  char dir[512];
  snprintf(dir, sizeof dir, "%s/dynemb-test-ssd-cand-%d", tmpdir(), (int)getpid());
  CHECK_OK(dynemb_checkpoint_save(dir, &a, 1));
  dynemb_table *b = make("cand_dst", DYNEMB_OPT_ADAM, 6, 2);
  dynemb_ckpt_load_chunk_rows = 5;
  CHECK_OK(dynemb_checkpoint_load(dir, b, "cand_src", DYNEMB_IMPORT_REPLACE, 0,
                                  0, NULL));
  dynemb_ckpt_load_chunk_rows = 0;
  dynemb_snapshot x, y;
  CHECK_OK(dynemb_table_snapshot(a, &x));
  CHECK_OK(dynemb_table_snapshot(b, &y));
  CHECK(same_snapshots(a, b));
  CHECK(x.candidates == y.candidates && x.candidates > 0 &&
        memcmp(x.cand_keys, y.cand_keys, x.candidates * 8) == 0 &&
        memcmp(x.cand_counts, y.cand_counts, x.candidates * 4) == 0 &&
        memcmp(x.cand_last_access, y.cand_last_access, x.candidates * 4) == 0);
  CHECK(x.apply_steps == 6 && y.apply_steps == 6);
  dynemb_snapshot_free(&x);
  dynemb_snapshot_free(&y);
  /* warm-start options, streamed (tiered) and whole (plain): rows only,
   * every row stamped 77 */
  dynemb_table *c = make("cand_plain", DYNEMB_OPT_ADAM, 0, 4);
  dynemb_load_options o = {77, 1};
  for (int tiered = 0; tiered < 2; tiered++) {
    dynemb_table *dst = tiered ? b : c;
    dynemb_ckpt_load_chunk_rows = 5;
    CHECK_OK(dynemb_checkpoint_load(dir, dst, "cand_src", DYNEMB_IMPORT_REPLACE,
                                    0, 0, &o));
    dynemb_ckpt_load_chunk_rows = 0;
    CHECK_OK(dynemb_table_snapshot(dst, &y));
    int stamped = 1;
    for (size_t i = 0; i < y.rows; i++) stamped &= y.last_access[i] == 77;
    CHECK(y.rows == st.size && y.candidates == 0 && stamped);
    dynemb_snapshot_free(&y);
  }
  o.stamp = (int64_t)1 << 32;
  CHECK(dynemb_checkpoint_load(dir, c, "cand_src", 0, 0, 0, &o) ==
        DYNEMB_EINVAL);
  dynemb_table_release(c);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
  dynemb_table_release(a);
  dynemb_table_release(b);
  dynemb_registry_clear();
}

static void test_same_results_sgd(void) { run_pair(DYNEMB_OPT_SGD, 1); }
static void test_same_results_adagrad(void) { run_pair(DYNEMB_OPT_ADAGRAD, 4); }
static void test_same_results_adam(void) { run_pair(DYNEMB_OPT_ADAM, 1); }
static void test_same_results_ftrl(void) { run_pair(DYNEMB_OPT_FTRL, 8); }

/* ---- limits, eviction, clear, failing disk ------------------------------- */

/* A one-shard SGD table of `dim` (rows start uniform in [-1, 1)) with `host`
 * rows in memory and up to `ssd` on disk; *c keeps the configuration (its
 * initializer, for references). */
static dynemb_table *tier_table(const char *name, int dim, uint64_t host,
                                uint64_t ssd, dynemb_table_config *c) {
  dynemb_table_config_init(c);
  c->name = name;
  c->dim = dim;
  c->shards = 1;
  c->init.kind = DYNEMB_INIT_UNIFORM;
  c->init.a = -1;
  c->init.b = 1;
  c->host_vocabulary_size = host;
  c->ssd_vocabulary_size = ssd;
  c->ssd_data_path = tmpdir();
  dynemb_table *t = NULL;
  CHECK_OK(dynemb_table_create(c, &t));
  return t;
}

static void test_full_evict_clear(void) {
  dynemb_table_config c;
  dynemb_table *t = tier_table("small", 4, 10, 20, &c);
  if (!t) return;
  CHECK_OK(dynemb_table_set_eviction_threshold(t, 5));
  int64_t k[30];
  float out[30 * 4];
  for (int i = 0; i < 30; i++) k[i] = i;
  /* 30 rows fit exactly (10 in memory, 20 on SSD), one at a time */
  for (int i = 0; i < 30; i++)
    CHECK_OK(
        dynemb_lookup(t, &k[i], 1, DYNEMB_LOOKUP_TRAIN, i, NULL, out, NULL));
  dynemb_table_stats st;
  dynemb_table_get_stats(t, &st);
  CHECK(st.size == 30 && st.host_rows == 10 && st.ssd_rows == 20);
  /* mostly the coldest rows went to SSD (keys 0..19): an eval read of the
   * 10 newest reads few rows from SSD (the choice is among a sample) */
  uint64_t r0 = st.ssd_reads;
  CHECK_OK(
      dynemb_lookup(t, &k[20], 10, DYNEMB_LOOKUP_EVAL, 29, NULL, out, NULL));
  dynemb_table_get_stats(t, &st);
  CHECK(st.ssd_reads - r0 <= 3);
  int64_t more = 30;
  CHECK(dynemb_lookup(t, &more, 1, DYNEMB_LOOKUP_TRAIN, 30, NULL, out, NULL) ==
        DYNEMB_ECAPACITY);
  CHECK(strstr(dynemb_last_error(), "small") != NULL &&
        strstr(dynemb_last_error(), "ssd_vocabulary_size = 20") != NULL);
  dynemb_table_get_stats(t, &st);
  CHECK(st.size == 30); /* nothing lost */
  /* a row on SSD comes back (a warm one goes out): still 30 rows */
  CHECK_OK(
      dynemb_lookup(t, &k[0], 1, DYNEMB_LOOKUP_TRAIN, 31, NULL, out, NULL));
  dynemb_table_get_stats(t, &st);
  CHECK(st.size == 30 && st.host_rows == 10 && st.ssd_rows == 20);
  /* eviction at now 31, threshold 5: keys 1..25 are older than 26 */
  size_t ev = 0;
  CHECK_OK(dynemb_evict(t, 31, DYNEMB_TABLE_THRESHOLD, &ev));
  CHECK(ev == 25);
  dynemb_table_get_stats(t, &st);
  CHECK(st.size == 5 && st.host_rows + st.ssd_rows == 5);
  /* their records are free again: 25 new keys fit */
  int64_t nk[25];
  for (int i = 0; i < 25; i++) nk[i] = 100 + i;
  CHECK_OK(dynemb_lookup(t, nk, 25, DYNEMB_LOOKUP_TRAIN, 32, NULL, out, NULL));
  dynemb_table_get_stats(t, &st);
  CHECK(st.size == 30 && st.ssd_rows == 20);
  dynemb_table_clear(t);
  dynemb_table_get_stats(t, &st);
  CHECK(st.size == 0 && st.ssd_rows == 0 && st.ssd_bytes == 0);
  CHECK_OK(dynemb_lookup(t, k, 30, DYNEMB_LOOKUP_TRAIN, 40, NULL, out, NULL));
  dynemb_table_release(t);
  dynemb_registry_clear();
}

/* A row coming back from SSD into memory that has room moves nothing out,
 * and its record is free again: rows on SSD and records in use agree. The
 * rows in memory (keys 0..9, old) are evicted, those on SSD (10..14,
 * recent) stay (an import fills memory first, in key order). */
static void test_promote_into_room(void) {
  dynemb_table_config c;
  dynemb_table *src = tier_table("room_src", 4, 0, 0, &c);
  dynemb_table *t = tier_table("room", 4, 10, 20, &c);
  if (!src || !t) return;
  int64_t k[15];
  float row[4], want[4];
  for (int i = 0; i < 15; i++) {
    k[i] = i;
    CHECK_OK(dynemb_lookup(src, &k[i], 1, DYNEMB_LOOKUP_TRAIN, i < 10 ? 0 : 100,
                           NULL, row, NULL));
  }
  dynemb_snapshot snap;
  CHECK_OK(dynemb_table_snapshot(src, &snap));
  CHECK_OK(dynemb_table_import(t, &snap, 0, 0, 0));
  dynemb_snapshot_free(&snap);
  dynemb_table_stats st;
  dynemb_table_get_stats(t, &st);
  CHECK(st.host_rows == 10 && st.ssd_rows == 5);
  CHECK_OK(dynemb_table_set_eviction_threshold(t, 5));
  size_t ev = 0;
  CHECK_OK(dynemb_evict(t, 100, DYNEMB_TABLE_THRESHOLD, &ev));
  dynemb_table_get_stats(t, &st);
  CHECK(ev == 10 && st.host_rows == 0 && st.ssd_rows == 5);
  CHECK_OK(
      dynemb_lookup(t, &k[12], 1, DYNEMB_LOOKUP_TRAIN, 101, NULL, row, NULL));
  CHECK_OK(
      dynemb_lookup(src, &k[12], 1, DYNEMB_LOOKUP_EVAL, 101, NULL, want, NULL));
  CHECK(memcmp(row, want, sizeof row) == 0);
  dynemb_table_get_stats(t, &st);
  CHECK(st.size == 5 && st.host_rows == 1 && st.ssd_rows == 4);
  dynemb_table_release(t);
  dynemb_table_release(src);
  dynemb_registry_clear();
}

/* Memory holds 8 of 3000 rows in one shard: the rows to move out are rare
 * in the index (the scan after the hand meets few), so they are drawn among
 * the memory slots; the budget holds exactly and nothing is lost. */
static void test_sparse_memory(void) {
  dynemb_table_config c;
  dynemb_table *t = tier_table("sparse", 4, 8, 3000, &c);
  if (!t) return;
  static int64_t k[3000];
  static float out[3000 * 4], want[3000 * 4];
  for (int i = 0; i < 3000; i++) k[i] = (int64_t)i * 104729;
  for (int i = 0; i < 3000; i += 3)
    CHECK_OK(
        dynemb_lookup(t, &k[i], 3, DYNEMB_LOOKUP_TRAIN, i, NULL, out, NULL));
  dynemb_table_stats st;
  dynemb_table_get_stats(t, &st);
  CHECK(st.size == 3000 && st.host_rows == 8 && st.ssd_rows == 2992);
  /* every row reads back as its initial value */
  CHECK_OK(
      dynemb_lookup(t, k, 3000, DYNEMB_LOOKUP_EVAL, 3000, NULL, out, NULL));
  for (int i = 0; i < 3000; i++) dynemb_init_row(&c.init, k[i], want + 4 * i, 4);
  CHECK(memcmp(out, want, sizeof out) == 0);
  dynemb_table_release(t);
  dynemb_registry_clear();
}

static void test_disk_refuses_writes(void) {
  dynemb_table_config c;
  dynemb_table *t = tier_table("fullfs", 256, 8, 1000, &c); /* 1 KiB records */
  if (!t) return;
  static int64_t k[64];
  static float out[64 * 256], first[64 * 256];
  for (int i = 0; i < 64; i++) k[i] = 1000 + i;
  /* files may grow to 16 KiB: the 17th record written fails (EFBIG) */
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit old, lim;
  getrlimit(RLIMIT_FSIZE, &old);
  lim = old;
  lim.rlim_cur = 16 * 1024;
  CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
  int rc = DYNEMB_OK, i = 0;
  for (; i < 64 && rc == DYNEMB_OK; i++)
    rc = dynemb_lookup(t, &k[i], 1, DYNEMB_LOOKUP_TRAIN, i, NULL,
                       first + i * 256, NULL);
  setrlimit(RLIMIT_FSIZE, &old);
  CHECK(rc == DYNEMB_EIO);
  CHECK(strstr(dynemb_last_error(), "fullfs") != NULL &&
        strstr(dynemb_last_error(), tmpdir()) != NULL);
  /* nothing lost: every row made before the failure reads back */
  const int made = i - 1;
  CHECK(made == 8 + 16);
  CHECK_OK(dynemb_lookup(t, k, (size_t)made, DYNEMB_LOOKUP_EVAL, 100, NULL, out,
                         NULL));
  CHECK(memcmp(out, first, (size_t)made * 256 * sizeof(float)) == 0);
  dynemb_table_stats st;
  dynemb_table_get_stats(t, &st);
  CHECK(st.size == (uint64_t)made);
  /* and with the disk back, the failed key inserts */
  CHECK_OK(
      dynemb_lookup(t, &k[made], 1, DYNEMB_LOOKUP_TRAIN, 101, NULL, out, NULL));
  dynemb_table_release(t);
  dynemb_registry_clear();
}

/* ssd_data_path with several directories (mxRec's list): filled one after
 * the other. Files may grow to one 64 MiB segment each (RLIMIT_FSIZE
 * stands in for a full disk): segment 0 goes to the first directory, the
 * next ones to the next directories, each file in its own directory; with
 * every directory full, EIO names the last one and the fix, and nothing
 * written before is lost; after a reset the segments refill their files. */
static int in_dir(int fd, const char *dir) {
  char link[64], target[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, target, sizeof target - 1);
  if (n < 0) return 0;
  target[n] = 0;
  return strncmp(target, dir, strlen(dir)) == 0 && target[strlen(dir)] == '/';
}

static void test_directories_filled_in_order(void) {
  char base[512], dirs[3][600], list[2000];
  snprintf(base, sizeof base, "%s/dynemb-ssd-dirs-%d", tmpdir(), (int)getpid());
  CHECK(mkdir(base, 0700) == 0);
  for (int k = 0; k < 3; k++) {
    snprintf(dirs[k], sizeof dirs[k], "%s/d%d", base, k);
    CHECK(mkdir(dirs[k], 0700) == 0);
  }
  enum { REC = 1024, SEG = 65536 }; /* 64 MiB segments */
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit old, lim;
  getrlimit(RLIMIT_FSIZE, &old);
  lim = old;
  lim.rlim_cur = (rlim_t)SEG * REC;
  CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
  for (int ndirs = 3; ndirs >= 2; ndirs--) {
    snprintf(list, sizeof list, "%s\n%s%s%s", dirs[0], dirs[1],
             ndirs == 3 ? "\n" : "", ndirs == 3 ? dirs[2] : "");
    dynemb_ssd s;
    CHECK_OK(dynemb_ssd_open(&s, list, "dirs", REC, 0, 3 * SEG));
    CHECK(s.ndirs == ndirs && s.seg_records == SEG && s.fds[1] < 0);
    float e[REC / 4], got[REC / 4];
    uint32_t r = 0;
    int rc = DYNEMB_OK;
    uint64_t n = 0;
    for (; n < 3 * SEG && (rc = dynemb_ssd_alloc(&s, &r)) == DYNEMB_OK; n++) {
      if (r % SEG == 0 || r % SEG == SEG - 1) { /* a segment's ends */
        for (int j = 0; j < REC / 4; j++) e[j] = (float)r + (float)j / 1024;
        CHECK_OK(dynemb_ssd_write(&s, r, e, NULL));
      }
    }
    if (ndirs == 3) {
      CHECK(rc == DYNEMB_OK && n == 3 * SEG);
      CHECK(dynemb_ssd_alloc(&s, &r) == DYNEMB_ECAPACITY);
    } else { /* two directories hold two segments; the third fails */
      CHECK(rc == DYNEMB_EIO && n == 2 * SEG);
      CHECK(strstr(dynemb_last_error(), dirs[1]) != NULL &&
            strstr(dynemb_last_error(), "add a directory") != NULL);
    }
    for (int k = 0; k < ndirs; k++) CHECK(in_dir(s.fds[k], dirs[k]));
    for (uint64_t g = 0; g < n / SEG; g++)
      for (uint64_t q = g * SEG; q < (g + 1) * SEG; q += SEG - 1) {
        CHECK_OK(dynemb_ssd_read(&s, (uint32_t)q, got, NULL));
        CHECK(got[0] == (float)q && got[5] == (float)q + 5.0f / 1024);
      }
    dynemb_ssd_reset(&s); /* the directories fill in order again */
    CHECK(s.cur == 0 && s.seg_file[0] == -1 && s.seg_file[1] == -1 &&
          s.segs[1] == NULL);
    for (n = 0; n < 2 * SEG && dynemb_ssd_alloc(&s, &r) == DYNEMB_OK; n++) {
    }
    CHECK(n == 2 * SEG);
    CHECK_OK(dynemb_ssd_write(&s, SEG + 7, e, NULL));
    CHECK_OK(dynemb_ssd_read(&s, SEG + 7, got, NULL));
    CHECK(got[3] == e[3]);
    dynemb_ssd_close(&s);
  }
  setrlimit(RLIMIT_FSIZE, &old);
  for (int k = 0; k < 3; k++) rmdir(dirs[k]);
  rmdir(base);
  /* a directory gone since the list was checked is passed over */
  snprintf(list, sizeof list, "%s\n%s/gone\n%s", dirs[0], base, dirs[1]);
  {
    CHECK(mkdir(base, 0700) == 0 && mkdir(dirs[0], 0700) == 0 &&
          mkdir(dirs[1], 0700) == 0);
    setrlimit(RLIMIT_FSIZE, &lim);
    dynemb_ssd s;
    CHECK_OK(dynemb_ssd_open(&s, list, "gone", REC, 0, 2 * SEG));
    uint32_t r = 0;
    uint64_t n = 0;
    while (n < 2 * SEG && dynemb_ssd_alloc(&s, &r) == DYNEMB_OK) n++;
    CHECK(n == 2 * SEG && s.fds[1] < 0 && in_dir(s.fds[2], dirs[1]));
    dynemb_ssd_close(&s);
    setrlimit(RLIMIT_FSIZE, &old);
    rmdir(dirs[0]);
    rmdir(dirs[1]);
    rmdir(base);
  }
  /* an empty list is an error naming the fix */
  dynemb_ssd s2;
  CHECK(dynemb_ssd_open(&s2, "\n", "none", 16, 0, 8) == DYNEMB_EINVAL);
  CHECK(strstr(dynemb_last_error(), "names no directory") != NULL);
}

int main(void) {
  RUN(test_store_records);
  RUN(test_readahead_policy);
  RUN(test_same_results_sgd);
  RUN(test_same_results_adagrad);
  RUN(test_same_results_adam);
  RUN(test_same_results_ftrl);
  RUN(test_checkpoint_candidates_streamed);
  RUN(test_full_evict_clear);
  RUN(test_promote_into_room);
  RUN(test_sparse_memory);
  RUN(test_disk_refuses_writes);
  RUN(test_directories_filled_in_order);
  return check_summary();
}
