/*
 * test_ckpt_layout.c -- reading checkpoints whose shape differs from the
 * reader's: the parts of a checkpoint several ranks wrote
 * (dynemb_checkpoint_parts), and rows saved with another optimizer's state
 * loaded into a table that no optimizer trains yet (DYNEMB_IMPORT_ADOPT_
 * LAYOUT, what an inference graph's restore passes).
 *
 *  - parts: the writer's names in rank order, nothing else taken for a
 *    part, a plain directory read as itself, and the two damaged shapes (a
 *    rank's part missing, parts of two rank counts) refused by name, also
 *    for a rank count too large to list;
 *  - adopting: an SGD table, empty or holding rows, loads an Adam (or
 *    FTRL) checkpoint bit for bit, slots and step count included, in
 *    memory, streamed into an SSD tier, and through a delta chain; it then
 *    trains exactly as the table that wrote the checkpoint; the refusals
 *    (rows kept without REPLACE, the flag with EMBEDDING_ONLY) change
 *    nothing.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ckpt.h"
#include "dynemb.h"

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

static int contains(const char *s, const char *sub) {
  return s && strstr(s, sub) != NULL;
}

static void mkdir_in(const char *dir, const char *name) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  mkdir(p, 0755);
}

/* ---- parts ---------------------------------------------------------------- */

static void test_parts(void) {
  char dir[600], want[700];
  char **parts = NULL;
  size_t n = 0;

  /* A directory without parts, and no directory at all: itself. */
  path_in(dir, sizeof dir, "plain");
  mkdir(dir, 0755);
  CHECK_OK(dynemb_checkpoint_parts(dir, &parts, &n));
  CHECK(n == 1 && parts && !strcmp(parts[0], dir));
  free(parts);
  path_in(dir, sizeof dir, "absent");
  CHECK_OK(dynemb_checkpoint_parts(dir, &parts, &n));
  CHECK(n == 1 && parts && !strcmp(parts[0], dir));
  free(parts);

  /* Three parts, made out of order, among names that are not parts. */
  path_in(dir, sizeof dir, "three");
  mkdir(dir, 0755);
  const char *names[] = {"rank-2-of-3", "rank-0-of-3", "rank-1-of-3",
                         "rank-01-of-3", "rank-3-of-3", "rank-1-of-3x",
                         "rank--of-3", "MANIFEST", "rank-1"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    mkdir_in(dir, names[i]);
  CHECK_OK(dynemb_checkpoint_parts(dir, &parts, &n));
  CHECK(n == 3);
  for (size_t r = 0; r < n && parts; r++) {
    snprintf(want, sizeof want, "%s/rank-%zu-of-3", dir, r);
    CHECK(!strcmp(parts[r], want));
  }
  free(parts);

  /* A missing part: named, and nothing returned. */
  snprintf(want, sizeof want, "%s/rank-1-of-3", dir);
  rmdir(want);
  parts = (char **)1;
  CHECK_RC(dynemb_checkpoint_parts(dir, &parts, &n), DYNEMB_ECORRUPT);
  CHECK(parts == NULL && n == 0);
  CHECK(contains(dynemb_last_error(), "written by 3 ranks"));
  CHECK(contains(dynemb_last_error(), "rank(s) 1 "));
  CHECK(contains(dynemb_last_error(), dir));
  mkdir(want, 0755);

  /* Parts of two rank counts. */
  mkdir_in(dir, "rank-0-of-2");
  CHECK_RC(dynemb_checkpoint_parts(dir, &parts, &n), DYNEMB_ECORRUPT);
  CHECK(contains(dynemb_last_error(), "by 2 and by 3 ranks"));
  CHECK(contains(dynemb_last_error(), "stray"));

  /* A rank count too large to list: the first few missing ranks, and how
   * many in all, without an allocation of that size. */
  path_in(dir, sizeof dir, "huge");
  mkdir(dir, 0755);
  mkdir_in(dir, "rank-0-of-4000000000");
  mkdir_in(dir, "rank-2-of-4000000000");
  CHECK_RC(dynemb_checkpoint_parts(dir, &parts, &n), DYNEMB_ECORRUPT);
  CHECK(contains(dynemb_last_error(), "rank(s) 1, 3, 4, 5, 6, 7, 8, 9, ..."));
  CHECK(contains(dynemb_last_error(), "3999999998 in all"));

  CHECK_RC(dynemb_checkpoint_parts(NULL, &parts, &n), DYNEMB_EINVAL);
  CHECK_RC(dynemb_checkpoint_parts(dir, NULL, &n), DYNEMB_EINVAL);
}

/* ---- adopting another optimizer's layout ----------------------------------- */

static dynemb_table *make(const char *name, int kind, uint64_t host,
                          uint64_t ssd, float lr) {
  dynemb_table_config c;
  dynemb_table_config_init(&c);
  c.name = name;
  c.dim = 3;
  c.init.kind = DYNEMB_INIT_UNIFORM;
  c.init.a = -1;
  c.init.b = 1;
  c.init.seed = 5;
  c.optimizer.kind = kind;
  c.optimizer.learning_rate = lr;
  c.access_threshold = 2;
  c.host_vocabulary_size = host;
  c.ssd_vocabulary_size = ssd;
  c.ssd_data_path = ssd ? base : NULL;
  dynemb_table *t = NULL;
  CHECK_OK(dynemb_table_create(&c, &t));
  return t;
}

/* Lookups of `n` random keys of [0, space) at time `now` (rows, and
 * candidates for keys seen once) and a gradient on each, seeded so that
 * two tables can be given the same steps. */
static void step(dynemb_table *t, uint64_t seed, int64_t now, int64_t space,
                 size_t n) {
  uint64_t s = seed;
  int64_t *k = malloc(n * sizeof *k);
  float *out = malloc(n * 3 * sizeof *out), *g = malloc(n * 3 * sizeof *g);
  for (size_t i = 0; i < n; i++) k[i] = (int64_t)(check_xorshift(&s) % (uint64_t)space);
  for (size_t i = 0; i < n * 3; i++)
    g[i] = (float)((double)(check_xorshift(&s) % 2001) / 1000.0 - 1.0);
  CHECK_OK(dynemb_lookup(t, k, n, DYNEMB_LOOKUP_TRAIN, now, NULL, out, NULL));
  CHECK_OK(dynemb_apply(t, k, n, g, -1.0f, NULL, NULL));
  free(k);
  free(out);
  free(g);
}

static int same_table(dynemb_table *a, dynemb_table *b) {
  dynemb_snapshot x, y;
  if (dynemb_table_snapshot(a, &x)) return 0;
  if (dynemb_table_snapshot(b, &y)) {
    dynemb_snapshot_free(&x);
    return 0;
  }
#define SAME(f, cnt) ((cnt) == 0 || !memcmp(x.f, y.f, (cnt) * sizeof *x.f))
  int eq = x.dim == y.dim && x.row_floats == y.row_floats &&
           x.optimizer_kind == y.optimizer_kind &&
           x.apply_steps == y.apply_steps && x.rows == y.rows &&
           x.candidates == y.candidates && SAME(keys, x.rows) &&
           SAME(values, x.rows * (size_t)x.row_floats) &&
           SAME(last_access, x.rows) && SAME(cand_keys, x.candidates) &&
           SAME(cand_counts, x.candidates) &&
           SAME(cand_last_access, x.candidates);
#undef SAME
  dynemb_snapshot_free(&x);
  dynemb_snapshot_free(&y);
  return eq;
}

static int kind_of(dynemb_table *t, float *lr) {
  dynemb_table_config c;
  dynemb_table_get_config(t, &c);
  if (lr) *lr = c.optimizer.learning_rate;
  return c.optimizer.kind;
}

static void test_adopt_in_memory(void) {
  char dir[600];
  path_in(dir, sizeof dir, "adam");
  const int kinds[] = {DYNEMB_OPT_ADAM, DYNEMB_OPT_FTRL};
  for (int k = 0; k < 2; k++) {
    rm_tree(dir);
    dynemb_table *src = make("lay_src", kinds[k], 0, 0, 0.05f);
    for (int i = 0; i < 4; i++) step(src, 100 + (uint64_t)i, 10 + i, 300, 200);
    CHECK_OK(dynemb_checkpoint_save(dir, &src, 1));

    /* Without the flag: the usual EMISMATCH, nothing loaded. */
    dynemb_table *dst = make("lay_dst", DYNEMB_OPT_SGD, 0, 0, 0.05f);
    CHECK_RC(dynemb_checkpoint_load(dir, dst, "lay_src", DYNEMB_IMPORT_REPLACE,
                                    0, 1, NULL),
             DYNEMB_EMISMATCH);
    CHECK(dynemb_table_size(dst) == 0);
    /* With it, into the empty table: everything, bit for bit. */
    CHECK_OK(dynemb_checkpoint_load(
        dir, dst, "lay_src", DYNEMB_IMPORT_REPLACE | DYNEMB_IMPORT_ADOPT_LAYOUT,
        0, 1, NULL));
    float lr = 0;
    CHECK(kind_of(dst, &lr) == kinds[k] && lr == 0.05f);
    CHECK(dynemb_table_row_floats(dst) == dynemb_table_row_floats(src));
    CHECK(same_table(src, dst));
    /* ... and trains on exactly as the table that wrote it. */
    for (int i = 0; i < 3; i++) {
      step(src, 200 + (uint64_t)i, 20 + i, 300, 150);
      step(dst, 200 + (uint64_t)i, 20 + i, 300, 150);
    }
    CHECK(same_table(src, dst));
    dynemb_table_release(src);
    dynemb_table_release(dst);
    CHECK_OK(dynemb_table_drop("lay_src"));
    CHECK_OK(dynemb_table_drop("lay_dst"));
  }

  /* A table holding rows of its own (SGD): without REPLACE it keeps them
   * and says how to load; with REPLACE it becomes the checkpoint's. */
  rm_tree(dir);
  dynemb_table *src = make("lay_src", DYNEMB_OPT_ADAM, 0, 0, 0.05f);
  for (int i = 0; i < 3; i++) step(src, 300 + (uint64_t)i, 10 + i, 300, 200);
  CHECK_OK(dynemb_checkpoint_save(dir, &src, 1));
  dynemb_table *held = make("lay_held", DYNEMB_OPT_SGD, 0, 0, 0.05f);
  step(held, 7, 5, 1000, 100);
  const uint64_t rows_before = dynemb_table_size(held);
  CHECK_RC(dynemb_checkpoint_load(dir, held, "lay_src",
                                  DYNEMB_IMPORT_ADOPT_LAYOUT, 0, 1, NULL),
           DYNEMB_EMISMATCH);
  CHECK(contains(dynemb_last_error(), "DYNEMB_IMPORT_REPLACE"));
  CHECK(contains(dynemb_last_error(), "sgd") &&
        contains(dynemb_last_error(), "adam"));
  CHECK(dynemb_table_size(held) == rows_before);
  CHECK(kind_of(held, NULL) == DYNEMB_OPT_SGD);
  CHECK_RC(dynemb_checkpoint_load(dir, held, "lay_src",
                                  DYNEMB_IMPORT_REPLACE |
                                      DYNEMB_IMPORT_ADOPT_LAYOUT |
                                      DYNEMB_IMPORT_EMBEDDING_ONLY,
                                  0, 1, NULL),
           DYNEMB_EINVAL);
  CHECK(dynemb_table_size(held) == rows_before);
  CHECK_OK(dynemb_checkpoint_load(
      dir, held, "lay_src", DYNEMB_IMPORT_REPLACE | DYNEMB_IMPORT_ADOPT_LAYOUT,
      0, 1, NULL));
  CHECK(same_table(src, held));
  /* The same layout already: the flag changes nothing. */
  CHECK_OK(dynemb_checkpoint_load(
      dir, held, "lay_src", DYNEMB_IMPORT_REPLACE | DYNEMB_IMPORT_ADOPT_LAYOUT,
      0, 1, NULL));
  CHECK(same_table(src, held));
  /* A shard-filtered pair of loads (a restore on two ranks, here into two
   * tables of one process) adds up to the whole table. */
  dynemb_table *half[2] = {make("lay_h0", DYNEMB_OPT_SGD, 0, 0, 0.05f),
                           make("lay_h1", DYNEMB_OPT_SGD, 0, 0, 0.05f)};
  for (uint32_t r = 0; r < 2; r++)
    CHECK_OK(dynemb_checkpoint_load(
        dir, half[r], "lay_src",
        DYNEMB_IMPORT_REPLACE | DYNEMB_IMPORT_ADOPT_LAYOUT, r, 2, NULL));
  CHECK(dynemb_table_size(half[0]) + dynemb_table_size(half[1]) ==
        dynemb_table_size(src));
  CHECK(kind_of(half[1], NULL) == DYNEMB_OPT_ADAM);
  for (int r = 0; r < 2; r++) dynemb_table_release(half[r]);
  dynemb_table_release(src);
  dynemb_table_release(held);
  CHECK_OK(dynemb_table_drop("lay_h0"));
  CHECK_OK(dynemb_table_drop("lay_h1"));
  CHECK_OK(dynemb_table_drop("lay_src"));
  CHECK_OK(dynemb_table_drop("lay_held"));
}

/* Into tables on the SSD tier: a full checkpoint streamed in small steps
 * (the layout changes at the first one), and a delta chain. */
static void test_adopt_ssd_and_chain(void) {
  char full[600], d0[600], d1[600];
  path_in(full, sizeof full, "ssd_full");
  path_in(d0, sizeof d0, "ssd_d0");
  path_in(d1, sizeof d1, "ssd_d1");
  dynemb_table *src = make("lay_ssd_src", DYNEMB_OPT_ADAM, 16, 4096, 0.05f);
  for (int i = 0; i < 3; i++) step(src, 400 + (uint64_t)i, 10 + i, 500, 300);
  CHECK_OK(dynemb_checkpoint_save(full, &src, 1));
  CHECK_OK(dynemb_checkpoint_save_incremental(d0, &src, 1, 1, NULL));
  for (int i = 0; i < 2; i++) step(src, 500 + (uint64_t)i, 20 + i, 500, 100);
  int is_delta = 0;
  CHECK_OK(dynemb_checkpoint_save_incremental(d1, &src, 1, 0, &is_delta));
  CHECK(is_delta);

  dynemb_ckpt_load_chunk_rows = 7;
  dynemb_table *a = make("lay_ssd_a", DYNEMB_OPT_SGD, 16, 4096, 0.05f);
  dynemb_table *b = make("lay_ssd_b", DYNEMB_OPT_SGD, 16, 4096, 0.05f);
  CHECK_OK(dynemb_checkpoint_load(
      full, a, "lay_ssd_src",
      DYNEMB_IMPORT_REPLACE | DYNEMB_IMPORT_ADOPT_LAYOUT, 0, 1, NULL));
  CHECK_OK(dynemb_checkpoint_load(
      d1, b, "lay_ssd_src", DYNEMB_IMPORT_REPLACE | DYNEMB_IMPORT_ADOPT_LAYOUT,
      0, 1, NULL));
  dynemb_ckpt_load_chunk_rows = 0;
  /* `a` holds the first save's moment: train src's later steps on it */
  for (int i = 0; i < 2; i++) step(a, 500 + (uint64_t)i, 20 + i, 500, 100);
  CHECK(same_table(src, a));
  CHECK(same_table(src, b));
  dynemb_table_stats st;
  dynemb_table_get_stats(b, &st);
  CHECK(st.ssd_rows > 0);
  for (int i = 0; i < 2; i++) {
    step(src, 600 + (uint64_t)i, 30 + i, 500, 100);
    step(b, 600 + (uint64_t)i, 30 + i, 500, 100);
  }
  CHECK(same_table(src, b));
  dynemb_table_release(src);
  dynemb_table_release(a);
  dynemb_table_release(b);
  CHECK_OK(dynemb_table_drop("lay_ssd_src"));
  CHECK_OK(dynemb_table_drop("lay_ssd_a"));
  CHECK_OK(dynemb_table_drop("lay_ssd_b"));
}

int main(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(base, sizeof base, "%s/dynemb-layout-XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(base)) {
    perror("mkdtemp");
    return 1;
  }
  RUN(test_parts);
  RUN(test_adopt_in_memory);
  RUN(test_adopt_ssd_and_chain);
  rm_tree(base);
  return check_summary();
}
