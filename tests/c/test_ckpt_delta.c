/*
 * test_ckpt_delta.c -- incremental checkpoints (dynemb_checkpoint_save_
 * incremental): a chain of a full save and deltas, with training,
 * admission and eviction between saves, reads and loads exactly what a
 * full save at the same moment holds (the reference: dynemb_checkpoint_save
 * of the same table, read back), for every optimizer, for a table on the
 * SSD tier and for a re-sharding load; a delta after changing 1% of the
 * rows is at most 3% of a full save; a crash at any I/O step of a delta
 * save leaves the chain so far loadable; and the errors: the base missing
 * or saved again, a delta into its base's directory or into a directory
 * holding a checkpoint, a table of another dim.
 */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ckpt.h"
#include "dynemb.h"

static uint64_t rs = 0x243f6a8885a308d3ull;
static uint64_t rnd(void) { return check_xorshift(&rs); }

static char base[512];

static void path_in(char *out, size_t n, const char *tag) {
  snprintf(out, n, "%s/%s", base, tag);
}

static void rm_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *de;
  char p[1024];
  while ((de = readdir(d)) != NULL) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    struct stat st;
    if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) rm_tree(p);
    else unlink(p);
  }
  closedir(d);
  rmdir(dir);
}

static uint64_t dir_bytes(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  uint64_t total = 0;
  struct dirent *de;
  char p[1024];
  while ((de = readdir(d)) != NULL) {
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    struct stat st;
    if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) total += (uint64_t)st.st_size;
  }
  closedir(d);
  return total;
}

static int same_snaps(const dynemb_snapshot *a, const dynemb_snapshot *b) {
  if (a->dim != b->dim || a->row_floats != b->row_floats ||
      a->optimizer_kind != b->optimizer_kind ||
      a->apply_steps != b->apply_steps || a->rows != b->rows ||
      a->candidates != b->candidates)
    return 0;
#define SAME(f, n) ((n) == 0 || !memcmp(a->f, b->f, (n) * sizeof *a->f))
  return SAME(keys, a->rows) && SAME(values, a->rows * (size_t)a->row_floats) &&
         SAME(last_access, a->rows) && SAME(cand_keys, a->candidates) &&
         SAME(cand_counts, a->candidates) &&
         SAME(cand_last_access, a->candidates);
#undef SAME
}

/* Whether checkpoint `dir` reads as checkpoint `ref` does (table `name`). */
static int reads_as(const char *dir, const char *ref, const char *name) {
  dynemb_snapshot a, b;
  if (dynemb_checkpoint_read(dir, name, &a)) {
    fprintf(stderr, "read %s: %s\n", dir, dynemb_last_error());
    return 0;
  }
  if (dynemb_checkpoint_read(ref, name, &b)) {
    dynemb_snapshot_free(&a);
    return 0;
  }
  int same = same_snaps(&a, &b);
  dynemb_snapshot_free(&a);
  dynemb_snapshot_free(&b);
  return same;
}

/* Whether table `t` holds what table `name` of checkpoint `ref` holds. */
static int table_is(dynemb_table *t, const char *ref, const char *name) {
  dynemb_snapshot a, b;
  if (dynemb_table_snapshot(t, &a)) return 0;
  if (dynemb_checkpoint_read(ref, name, &b)) {
    dynemb_snapshot_free(&a);
    return 0;
  }
  int same = same_snaps(&a, &b);
  dynemb_snapshot_free(&a);
  dynemb_snapshot_free(&b);
  return same;
}

static dynemb_table *make(const char *name, int dim, int kind, uint64_t host,
                          uint64_t ssd) {
  dynemb_table_config c;
  dynemb_table_config_init(&c);
  c.name = name;
  c.dim = dim;
  c.init.kind = DYNEMB_INIT_UNIFORM;
  c.init.a = -1;
  c.init.b = 1;
  c.init.seed = 3;
  c.optimizer.kind = kind;
  c.optimizer.learning_rate = 0.1f;
  c.access_threshold = 2;
  c.eviction_threshold = 6;
  c.shards = 4;
  c.host_vocabulary_size = host;
  c.ssd_vocabulary_size = ssd;
  c.ssd_data_path = ssd ? base : NULL;
  dynemb_table *t = NULL;
  CHECK_OK(dynemb_table_create(&c, &t));
  return t;
}

/* One round of training at time `now`: lookups of random keys of a
 * space of `space` (new rows, candidates, re-sightings), gradients on some
 * of them, and every 3rd round an eviction of what is idle. */
static void round_of(dynemb_table *t, int64_t now, int64_t space, size_t n) {
  int dim = dynemb_table_dim(t);
  int64_t *k = malloc(n * sizeof *k);
  float *out = malloc(n * (size_t)dim * sizeof *out);
  for (size_t i = 0; i < n; i++) k[i] = (int64_t)(rnd() % (uint64_t)space) - space / 3;
  CHECK_OK(dynemb_lookup(t, k, n, DYNEMB_LOOKUP_TRAIN, now, NULL, out, NULL));
  for (size_t i = 0; i < n * (size_t)dim; i++) out[i] = (float)(rnd() % 200) / 100.0f - 1.0f;
  CHECK_OK(dynemb_apply(t, k, n / 2, out, -1.0f, NULL, NULL));
  if (now % 3 == 0)
    CHECK_OK(dynemb_evict(t, now, DYNEMB_TABLE_THRESHOLD, NULL));
  free(k);
  free(out);
}

/* Full save, then deltas with rounds between: each link of the chain
 * reads as the full save made at the same moment, and loads into a fresh
 * table as that. */
static void chain_case(int kind, uint64_t host, uint64_t ssd, const char *tag) {
  char name[32];
  snprintf(name, sizeof name, "delta_%s", tag);
  dynemb_table *t = make(name, 3, kind, host, ssd);
  if (!t) return;
  char d[8][600], f[8][600];
  int deltas = 0;
  for (int i = 0; i < 6; i++) {
    round_of(t, 10 * i + 1, 400, 120);
    round_of(t, 10 * i + 3, 400, 60);
    char tg[64];
    snprintf(tg, sizeof tg, "%s-d%d", tag, i);
    path_in(d[i], sizeof d[i], tg);
    snprintf(tg, sizeof tg, "%s-f%d", tag, i);
    path_in(f[i], sizeof f[i], tg);
    int is_delta = -1;
    CHECK_OK(dynemb_checkpoint_save_incremental(d[i], &t, 1, 0, &is_delta));
    CHECK_OK(dynemb_checkpoint_save(f[i], &t, 1));
    CHECK(is_delta == (i > 0));
    deltas += is_delta;
    CHECK(reads_as(d[i], f[i], name));
    CHECK_OK(dynemb_checkpoint_verify(d[i]));
  }
  CHECK(deltas == 5);
  /* every link loads as its full save, into a table that held other rows */
  for (int i = 0; i < 6; i += 5) {
    dynemb_table *u = make("delta_load", 3, kind, host, ssd);
    if (!u) break;
    round_of(u, 1, 1000, 50);
    CHECK_OK(dynemb_checkpoint_load(d[i], u, name, DYNEMB_IMPORT_REPLACE, 0, 1,
                                    NULL));
    CHECK(table_is(u, f[i], name));
    /* and re-sharded: the part of one of 3 ranks, as the full save's */
    dynemb_table *v = make("delta_shard", 3, kind, host, ssd);
    dynemb_table *w = make("full_shard", 3, kind, host, ssd);
    CHECK_OK(dynemb_checkpoint_load(d[i], v, name, DYNEMB_IMPORT_REPLACE, 1, 3,
                                    NULL));
    CHECK_OK(dynemb_checkpoint_load(f[i], w, name, DYNEMB_IMPORT_REPLACE, 1, 3,
                                    NULL));
    dynemb_snapshot a, b;
    CHECK_OK(dynemb_table_snapshot(v, &a));
    CHECK_OK(dynemb_table_snapshot(w, &b));
    CHECK(same_snaps(&a, &b) && a.rows > 0 && a.rows < dynemb_table_size(t));
    dynemb_snapshot_free(&a);
    dynemb_snapshot_free(&b);
    dynemb_table_release(u);
    dynemb_table_release(v);
    dynemb_table_release(w);
    dynemb_table_drop("delta_load");
    dynemb_table_drop("delta_shard");
    dynemb_table_drop("full_shard");
  }
  dynemb_table_release(t);
  dynemb_table_drop(name);
}

static void test_chain_sgd(void) { chain_case(DYNEMB_OPT_SGD, 0, 0, "sgd"); }
static void test_chain_adagrad(void) { chain_case(DYNEMB_OPT_ADAGRAD, 0, 0, "adagrad"); }
static void test_chain_adam(void) { chain_case(DYNEMB_OPT_ADAM, 0, 0, "adam"); }
static void test_chain_ftrl(void) { chain_case(DYNEMB_OPT_FTRL, 0, 0, "ftrl"); }
static void test_chain_ssd_tier(void) { chain_case(DYNEMB_OPT_ADAGRAD, 40, 1000, "ssd"); }

/* A delta grows with the rows changed, not with the table. */
static void test_delta_size(void) {
  enum { ROWS = 50000, DIM = 16 };
  dynemb_table *t = make("delta_size", DIM, DYNEMB_OPT_ADAGRAD, 0, 0);
  if (!t) return;
  int64_t *k = malloc(ROWS * sizeof *k);
  float *g = malloc((size_t)ROWS * DIM * sizeof *g);
  for (int i = 0; i < ROWS; i++) k[i] = (int64_t)i * 31 + 7;
  for (int pass = 0; pass < 2; pass++) /* admitted */
    CHECK_OK(dynemb_lookup(t, k, ROWS, DYNEMB_LOOKUP_TRAIN, 1, NULL, g, NULL));
  char full[600], delta[600];
  path_in(full, sizeof full, "size-full");
  path_in(delta, sizeof delta, "size-delta");
  CHECK_OK(dynemb_checkpoint_save_incremental(full, &t, 1, 0, NULL));
  for (int i = 0; i < ROWS / 100 * DIM; i++) g[i] = 0.5f;
  CHECK_OK(
      dynemb_apply(t, k, ROWS / 100, g, -1.0f, NULL, NULL)); /* 1% of rows */
  int is_delta = 0;
  CHECK_OK(dynemb_checkpoint_save_incremental(delta, &t, 1, 0, &is_delta));
  uint64_t fb = dir_bytes(full), db = dir_bytes(delta);
  CHECK(is_delta && db * 100 <= fb * 3);
  printf("delta after 1%% of %d rows changed: %llu bytes, full save %llu "
         "(%.2f%%)\n", ROWS, (unsigned long long)db, (unsigned long long)fb,
         100.0 * (double)db / (double)fb);
  free(k);
  free(g);
  dynemb_table_release(t);
  dynemb_table_drop("delta_size");
}

/* Crash injection: a delta save stopped at every I/O step in turn leaves
 * the chain before it loadable, and the directory either complete or not
 * a checkpoint at all. */
static void test_crash_during_delta(void) {
  dynemb_table *t = make("delta_crash", 2, DYNEMB_OPT_SGD, 0, 0);
  if (!t) return;
  char b0[600], b1[600], ref[600], dir[600];
  path_in(b0, sizeof b0, "crash-base");
  path_in(b1, sizeof b1, "crash-1");
  path_in(ref, sizeof ref, "crash-ref");
  round_of(t, 1, 200, 80);
  CHECK_OK(dynemb_checkpoint_save_incremental(b0, &t, 1, 0, NULL));
  round_of(t, 2, 200, 80);
  CHECK_OK(dynemb_checkpoint_save_incremental(b1, &t, 1, 0, NULL));
  round_of(t, 4, 200, 80);
  CHECK_OK(dynemb_checkpoint_save(ref, &t, 1));
  char b1ref[600];
  path_in(b1ref, sizeof b1ref, "crash-1-ref"); /* what b1 must read as */
  int bad = 0, complete = 0;
  for (long k = 0; k < 40; k++) {
    snprintf(dir, sizeof dir, "%s/crash-next-%ld", base, k);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      dynemb_ckpt_fault_budget = k;
      _exit(dynemb_checkpoint_save_incremental(dir, &t, 1, 0, NULL) ? 1 : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    int finished = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    dynemb_snapshot s;
    if (dynemb_checkpoint_read(b1, "delta_crash", &s)) {
      fprintf(stderr, "crash %ld: the chain before broke: %s\n", k, dynemb_last_error());
      bad++;
    } else {
      dynemb_snapshot_free(&s);
    }
    int rc = dynemb_checkpoint_read(dir, "delta_crash", &s);
    if (rc == DYNEMB_OK) {
      complete++;
      dynemb_snapshot_free(&s);
      if (!reads_as(dir, ref, "delta_crash")) bad++;
    } else if (finished) {
      bad++;
    }
    rm_tree(dir);
    if (finished) break;
  }
  CHECK(bad == 0 && complete >= 1);
  dynemb_table_release(t);
  dynemb_table_drop("delta_crash");
}

static void test_errors(void) {
  dynemb_table *t = make("delta_err", 2, DYNEMB_OPT_SGD, 0, 0);
  if (!t) return;
  char b0[600], b1[600], b2[600];
  path_in(b0, sizeof b0, "err-base");
  path_in(b1, sizeof b1, "err-1");
  path_in(b2, sizeof b2, "err-2");
  round_of(t, 1, 100, 50);
  CHECK_OK(dynemb_checkpoint_save_incremental(b0, &t, 1, 0, NULL));
  /* into the directory of the save it builds on */
  CHECK_RC(dynemb_checkpoint_save_incremental(b0, &t, 1, 0, NULL), DYNEMB_EINVAL);
  CHECK(strstr(dynemb_last_error(), "directory of its own") != NULL);
  round_of(t, 2, 100, 50);
  CHECK_OK(dynemb_checkpoint_save_incremental(b1, &t, 1, 0, NULL));
  /* into a directory that holds a checkpoint */
  CHECK_OK(dynemb_checkpoint_save(b2, &t, 1));
  CHECK_RC(dynemb_checkpoint_save_incremental(b2, &t, 1, 0, NULL), DYNEMB_EINVAL);
  CHECK(strstr(dynemb_last_error(), "already holds a checkpoint") != NULL);
  /* a table of another dim */
  dynemb_table *u = make("delta_err3", 3, DYNEMB_OPT_SGD, 0, 0);
  CHECK_RC(dynemb_checkpoint_load(b1, u, "delta_err", DYNEMB_IMPORT_REPLACE, 0,
                                  1, NULL),
           DYNEMB_EDIM);
  /* the base saved again: the delta no longer builds on it */
  CHECK_OK(dynemb_checkpoint_save(b0, &t, 1));
  dynemb_snapshot s;
  CHECK_RC(dynemb_checkpoint_read(b1, "delta_err", &s), DYNEMB_ECORRUPT);
  CHECK(strstr(dynemb_last_error(), "err-base") != NULL &&
        strstr(dynemb_last_error(), "saved again") != NULL);
  CHECK_RC(dynemb_checkpoint_verify(b1), DYNEMB_ECORRUPT);
  /* ... and the next incremental save is a full one */
  int is_delta = 1;
  rm_tree(b2);
  CHECK_OK(dynemb_checkpoint_save_incremental(b2, &t, 1, 0, &is_delta));
  CHECK(is_delta == 0);
  /* the base gone: a clear error, and the table unchanged */
  rm_tree(b0);
  uint64_t before = dynemb_table_size(t);
  CHECK_RC(
      dynemb_checkpoint_load(b1, t, NULL, DYNEMB_IMPORT_REPLACE, 0, 1, NULL),
      DYNEMB_ECORRUPT);
  CHECK(strstr(dynemb_last_error(), "builds on") != NULL &&
        strstr(dynemb_last_error(), "err-base") != NULL);
  CHECK(dynemb_table_size(t) == before);
  dynemb_table_release(u);
  dynemb_table_release(t);
  dynemb_table_drop("delta_err");
  dynemb_table_drop("delta_err3");
}

/* A full save into a delta's directory would keep the other tables'
 * changes-only files as if they were whole: refused. */
static void test_full_save_into_a_delta_refused(void) {
  dynemb_table *a = make("delta_two_a", 2, DYNEMB_OPT_SGD, 0, 0);
  dynemb_table *b = make("delta_two_b", 2, DYNEMB_OPT_SGD, 0, 0);
  if (!a || !b) return;
  dynemb_table *both[2] = {a, b};
  char d0[600], d1[600];
  path_in(d0, sizeof d0, "two-0");
  path_in(d1, sizeof d1, "two-1");
  round_of(a, 1, 100, 50);
  round_of(b, 1, 100, 50);
  CHECK_OK(dynemb_checkpoint_save_incremental(d0, both, 2, 0, NULL));
  round_of(a, 2, 100, 50);
  int is_delta = 0;
  CHECK_OK(dynemb_checkpoint_save_incremental(d1, both, 2, 0, &is_delta));
  CHECK(is_delta);
  CHECK_RC(dynemb_checkpoint_save(d1, &a, 1), DYNEMB_EINVAL);
  CHECK(strstr(dynemb_last_error(), "holds an incremental checkpoint") != NULL);
  CHECK_RC(dynemb_checkpoint_save_incremental(d1, &a, 1, 1, NULL), DYNEMB_EINVAL);
  dynemb_table_release(a);
  dynemb_table_release(b);
  dynemb_table_drop("delta_two_a");
  dynemb_table_drop("delta_two_b");
}

/* A chain loaded without REPLACE (a warm start into a table with rows of
 * its own) adds what a full checkpoint of the same moment adds; a chain
 * that does not fit the table changes nothing. */
static void test_chain_load_is_a_full_load(void) {
  dynemb_table *t = make("delta_merge", 2, DYNEMB_OPT_SGD, 0, 0);
  if (!t) return;
  char d0[600], d1[600], f1[600];
  path_in(d0, sizeof d0, "merge-0");
  path_in(d1, sizeof d1, "merge-1");
  path_in(f1, sizeof f1, "merge-full");
  round_of(t, 1, 300, 120);
  CHECK_OK(dynemb_checkpoint_save_incremental(d0, &t, 1, 0, NULL));
  round_of(t, 3, 300, 120);
  round_of(t, 9, 300, 120); /* (an eviction: removed keys in the delta) */
  CHECK_OK(dynemb_checkpoint_save_incremental(d1, &t, 1, 0, NULL));
  CHECK_OK(dynemb_checkpoint_save(f1, &t, 1));
  dynemb_table *u = make("delta_merge_u", 2, DYNEMB_OPT_SGD, 0, 0);
  dynemb_table *v = make("delta_merge_v", 2, DYNEMB_OPT_SGD, 0, 0);
  round_of(u, 1, 600, 200); /* rows of their own, the same in both */
  char own[600];
  path_in(own, sizeof own, "merge-own");
  CHECK_OK(dynemb_checkpoint_save(own, &u, 1));
  CHECK_OK(dynemb_checkpoint_load(own, v, "delta_merge_u",
                                  DYNEMB_IMPORT_REPLACE, 0, 1, NULL));
  CHECK_OK(dynemb_checkpoint_load(d1, u, "delta_merge", 0, 0, 1, NULL));
  CHECK_OK(dynemb_checkpoint_load(f1, v, "delta_merge", 0, 0, 1, NULL));
  dynemb_snapshot a, b;
  CHECK_OK(dynemb_table_snapshot(u, &a));
  CHECK_OK(dynemb_table_snapshot(v, &b));
  CHECK(same_snaps(&a, &b));
  dynemb_snapshot_free(&a);
  dynemb_snapshot_free(&b);
  /* too big for the table: an error, and the table as it was */
  dynemb_table_config c;
  dynemb_table_config_init(&c);
  c.name = "delta_merge_small";
  c.dim = 2;
  c.host_vocabulary_size = 5;
  dynemb_table *w = NULL;
  CHECK_OK(dynemb_table_create(&c, &w));
  int64_t k[3] = {1, 2, 3};
  float out[6];
  CHECK_OK(dynemb_lookup(w, k, 3, DYNEMB_LOOKUP_TRAIN, 1, NULL, out, NULL));
  CHECK_RC(dynemb_checkpoint_load(d1, w, "delta_merge", DYNEMB_IMPORT_REPLACE,
                                  0, 1, NULL),
           DYNEMB_ECAPACITY);
  CHECK(dynemb_table_size(w) == 3);
  dynemb_table_release(w);
  dynemb_table_release(u);
  dynemb_table_release(v);
  dynemb_table_release(t);
  dynemb_table_drop("delta_merge");
  dynemb_table_drop("delta_merge_u");
  dynemb_table_drop("delta_merge_v");
  dynemb_table_drop("delta_merge_small");
}

/* A long chain (paths to the base would outgrow PATH_MAX if they were
 * not made canonical at each link) still loads. */
static void test_long_chain(void) {
  dynemb_table *t = make("delta_long", 1, DYNEMB_OPT_SGD, 0, 0);
  if (!t) return;
  enum { LINKS = 300 };
  char d[600], last[600];
  int64_t k = 5;
  float out[1], g[1] = {1.0f}; /* (each link's one change: a gradient step) */
  CHECK_OK(dynemb_lookup(t, &k, 1, DYNEMB_LOOKUP_TRAIN, 1, NULL, out, NULL));
  CHECK_OK(dynemb_lookup(t, &k, 1, DYNEMB_LOOKUP_TRAIN, 1, NULL, out, NULL));
  int deltas = 0;
  for (int i = 0; i < LINKS; i++) {
    snprintf(d, sizeof d, "%s/long-model-%06d", base, i);
    CHECK_OK(dynemb_apply(t, &k, 1, g, -1.0f, NULL, NULL));
    int is_delta = 0;
    CHECK_OK(dynemb_checkpoint_save_incremental(d, &t, 1, 0, &is_delta));
    deltas += is_delta;
  }
  snprintf(last, sizeof last, "%s", d);
  CHECK(deltas == LINKS - 1);
  dynemb_snapshot s, now;
  CHECK_OK(dynemb_checkpoint_read(last, "delta_long", &s));
  CHECK_OK(dynemb_table_snapshot(t, &now));
  CHECK(s.rows == 1 && same_snaps(&s, &now));
  dynemb_snapshot_free(&s);
  dynemb_snapshot_free(&now);
  CHECK_OK(dynemb_checkpoint_verify(last));
  dynemb_table_release(t);
  dynemb_table_drop("delta_long");
}

int main(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(base, sizeof base, "%s/dynemb-delta-%d", tmp && *tmp ? tmp : "/tmp",
           (int)getpid());
  mkdir(base, 0755);
  RUN(test_chain_sgd);
  RUN(test_chain_adagrad);
  RUN(test_chain_adam);
  RUN(test_chain_ftrl);
  RUN(test_chain_ssd_tier);
  RUN(test_delta_size);
  RUN(test_crash_during_delta);
  RUN(test_errors);
  RUN(test_full_save_into_a_delta_refused);
  RUN(test_chain_load_is_a_full_load);
  RUN(test_long_chain);
  rm_tree(base);
  dynemb_registry_clear();
  return check_summary();
}
