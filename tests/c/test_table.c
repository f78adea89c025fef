/*
 * test_table.c -- unit tests of the table engine: registry, config
 * validation, lookup (train/eval, default value, admission), apply (SGD,
 * repeated keys, NaN/Inf policies), eviction and slot reuse, stats,
 * snapshot/import, budgets, and adversarial keys (extreme values and keys
 * that all share one index bucket).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dynemb.h"
#include "hash.h"
#include "init.h"

static dynemb_table *make(const char *name, int dim, void (*tweak)(dynemb_table_config *)) {
  dynemb_table_config c;
  dynemb_table_config_init(&c);
  c.name = name;
  c.dim = dim;
  if (tweak) tweak(&c);
  dynemb_table *t = NULL;
  int rc = dynemb_table_create(&c, &t);
  if (rc) fprintf(stderr, "create %s: %s\n", name, dynemb_last_error());
  return t;
}

static void done(dynemb_table *t) {
  dynemb_table_release(t);
  dynemb_registry_clear();
}

/* ---- registry ----------------------------------------------------------- */

static void test_registry(void) {
  dynemb_table *a = make("alpha", 4, NULL), *b = make("beta", 8, NULL);
  CHECK(a && b);
  dynemb_table *x = NULL;
  CHECK_OK(dynemb_table_find("alpha", &x));
  CHECK(x == a);
  dynemb_table_release(x);
  CHECK_RC(dynemb_table_find("gamma", &x), DYNEMB_ENOTFOUND);
  CHECK(strstr(dynemb_last_error(), "gamma") != NULL);
  CHECK(strstr(dynemb_last_error(), "'alpha'") != NULL);
  CHECK(strstr(dynemb_last_error(), "'beta'") != NULL);
  char **names;
  size_t n = dynemb_registry_names(&names);
  CHECK(n == 2);
  if (n == 2) {
    CHECK(strcmp(names[0], "alpha") == 0);
    CHECK(strcmp(names[1], "beta") == 0);
  }
  dynemb_free_names(names, n);
  /* EEXIST */
  dynemb_table_config c;
  dynemb_table_config_init(&c);
  c.name = "alpha";
  c.dim = 4;
  CHECK_RC(dynemb_table_create(&c, &x), DYNEMB_EEXIST);
  CHECK(strstr(dynemb_last_error(), "alpha") != NULL);
  /* drop keeps holders' references usable */
  CHECK_OK(dynemb_table_drop("alpha"));
  CHECK_RC(dynemb_table_drop("alpha"), DYNEMB_ENOTFOUND);
  CHECK_RC(dynemb_table_find("alpha", &x), DYNEMB_ENOTFOUND);
  float out[4] = {1, 1, 1, 1};
  int64_t k = 5;
  CHECK_OK(dynemb_lookup(a, &k, 1, DYNEMB_LOOKUP_TRAIN, 1, NULL, out, NULL));
  CHECK(dynemb_table_size(a) == 1);
  CHECK(strcmp(dynemb_table_name(a), "alpha") == 0);
  dynemb_table_release(a);
  /* a new table may take the dropped name */
  a = make("alpha", 2, NULL);
  CHECK(a && dynemb_table_dim(a) == 2);
  dynemb_table_release(a);
  dynemb_table_release(b);
  dynemb_registry_clear();
  n = dynemb_registry_names(&names);
  CHECK(n == 0);
  dynemb_free_names(names, n);
  CHECK_RC(dynemb_table_find("beta", &x), DYNEMB_ENOTFOUND);
  CHECK(strstr(dynemb_last_error(), "none") != NULL);
}

/* ---- configuration ------------------------------------------------------ */

static void test_config_defaults(void) {
  dynemb_table_config c;
  memset(&c, 0x5a, sizeof c);
  dynemb_table_config_init(&c);
  CHECK(c.name == NULL && c.dim == 0);
  CHECK(c.init.kind == DYNEMB_INIT_ZEROS);
  CHECK(c.optimizer.kind == DYNEMB_OPT_SGD);
  CHECK_NEAR(c.optimizer.learning_rate, 0.01, 1e-7, 0);
  CHECK_NEAR(c.optimizer.initial_accumulator_value, 0.1, 1e-7, 0);
  CHECK_NEAR(c.optimizer.beta1, 0.9, 1e-7, 0);
  CHECK_NEAR(c.optimizer.beta2, 0.999, 1e-7, 0);
  CHECK_NEAR(c.optimizer.epsilon, 1e-8, 1e-6, 0);
  CHECK_NEAR(c.optimizer.learning_rate_power, -0.5, 0, 0);
  CHECK(c.optimizer.l1 == 0 && c.optimizer.l2 == 0 && c.optimizer.l2_shrinkage == 0);
  CHECK(c.access_threshold == 0 && c.eviction_threshold == 0);
  CHECK(c.default_value == NULL);
  CHECK(c.nonfinite_policy == DYNEMB_NONFINITE_ERROR);
  CHECK(c.shards == 0 && c.host_vocabulary_size == 0);
  CHECK(c.device_vocabulary_size == 0 && c.ssd_vocabulary_size == 0);
  CHECK(c.ssd_data_path == NULL);
}

static int create_err(dynemb_table_config *c, const char *must1, const char *must2) {
  dynemb_table *t = NULL;
  int rc = dynemb_table_create(c, &t);
  if (rc == DYNEMB_OK) {
    dynemb_table_release(t);
    dynemb_registry_clear();
    return -1;
  }
  if (t) return -2;
  if (must1 && !strstr(dynemb_last_error(), must1)) {
    fprintf(stderr, "message '%s' lacks '%s'\n", dynemb_last_error(), must1);
    return -3;
  }
  if (must2 && !strstr(dynemb_last_error(), must2)) {
    fprintf(stderr, "message '%s' lacks '%s'\n", dynemb_last_error(), must2);
    return -3;
  }
  return rc;
}

static void test_config_errors(void) {
  dynemb_table_config c;
#define BASE() (dynemb_table_config_init(&c), c.name = "cfgt", c.dim = 8)
  BASE();
  c.name = NULL;
  CHECK(create_err(&c, "name", NULL) == DYNEMB_EINVAL);
  BASE();
  c.name = "";
  CHECK(create_err(&c, "name", NULL) == DYNEMB_EINVAL);
  BASE();
  c.dim = 0;
  CHECK(create_err(&c, "cfgt", "dim") == DYNEMB_EINVAL);
  BASE();
  c.dim = 65537;
  CHECK(create_err(&c, "cfgt", "dim") == DYNEMB_EINVAL);
  BASE();
  c.shards = 3;
  CHECK(create_err(&c, "cfgt", "shards") == DYNEMB_EINVAL);
  BASE();
  c.shards = 8192;
  CHECK(create_err(&c, "cfgt", "shards") == DYNEMB_EINVAL);
  BASE();
  c.shards = -4;
  CHECK(create_err(&c, "cfgt", "shards") == DYNEMB_EINVAL);
  BASE();
  c.init.kind = 99;
  CHECK(create_err(&c, "cfgt", "init") == DYNEMB_EINVAL);
  BASE();
  c.init.kind = DYNEMB_INIT_UNIFORM;
  c.init.a = 1;
  c.init.b = 1;
  CHECK(create_err(&c, "cfgt", "uniform") == DYNEMB_EINVAL);
  BASE();
  c.init.kind = DYNEMB_INIT_NORMAL;
  c.init.b = -1;
  CHECK(create_err(&c, "cfgt", "stddev") == DYNEMB_EINVAL);
  BASE();
  c.init.kind = DYNEMB_INIT_CONSTANT;
  c.init.a = NAN;
  CHECK(create_err(&c, "cfgt", "constant") == DYNEMB_EINVAL);
  BASE();
  c.optimizer.kind = 17;
  CHECK(create_err(&c, "cfgt", "optimizer") == DYNEMB_EINVAL);
  BASE();
  c.optimizer.learning_rate = -1;
  CHECK(create_err(&c, "cfgt", "learning_rate") == DYNEMB_EINVAL);
  BASE();
  c.eviction_threshold = -5;
  CHECK(create_err(&c, "cfgt", "eviction_threshold") == DYNEMB_EINVAL);
  BASE();
  c.nonfinite_policy = 2;
  CHECK(create_err(&c, "cfgt", "nonfinite_policy") == DYNEMB_EINVAL);
  BASE();
  c.device_vocabulary_size = 1000;
  CHECK(create_err(&c, "cfgt", "not implemented") == DYNEMB_EINVAL);
  BASE();
  c.ssd_vocabulary_size = 1000;
  CHECK(create_err(&c, "cfgt", "ssd_data_path") == DYNEMB_EINVAL);
  BASE();
  c.ssd_vocabulary_size = 1000;
  c.ssd_data_path = "/tmp";
  CHECK(create_err(&c, "cfgt", "host_vocabulary_size > 0") == DYNEMB_EINVAL);
  c.host_vocabulary_size = 10;
  c.ssd_vocabulary_size = UINT64_C(1) << 30;
  CHECK(create_err(&c, "cfgt", "limit") == DYNEMB_EINVAL);
  c.ssd_vocabulary_size = 1000;
  c.ssd_data_path = "/nonexistent/dynemb-ssd";
  CHECK(create_err(&c, "cfgt", "/nonexistent/dynemb-ssd") == DYNEMB_EIO);
  BASE();
  c.name = "bad\nname";
  CHECK(create_err(&c, "control", NULL) == DYNEMB_EINVAL);
  /* a valid config after all: nothing half-registered */
  BASE();
  dynemb_table *t = NULL;
  CHECK_OK(dynemb_table_create(&c, &t));
  CHECK(dynemb_table_row_floats(t) == 8);
  dynemb_table_config got;
  dynemb_table_get_config(t, &got);
  CHECK(strcmp(got.name, "cfgt") == 0 && got.dim == 8 && got.shards == 64);
  CHECK(got.name != c.name); /* copied */
  dynemb_table *t2 = NULL;
  CHECK_RC(dynemb_table_create(NULL, &t2), DYNEMB_EINVAL);
  CHECK(t2 == NULL);
  done(t);
#undef BASE
}

/* ---- lookup ---------------------------------------------------------------- */

static void tweak_const(dynemb_table_config *c) {
  c->init.kind = DYNEMB_INIT_CONSTANT;
  c->init.a = 0.5f;
}

static void test_lookup_train_eval(void) {
  static const float defv[3] = {7, 8, 9};
  dynemb_table_config c;
  dynemb_table_config_init(&c);
  c.name = "lk";
  c.dim = 3;
  c.init.kind = DYNEMB_INIT_CONSTANT;
  c.init.a = 0.25f;
  c.default_value = defv;
  dynemb_table *t = NULL;
  CHECK_OK(dynemb_table_create(&c, &t));
  int64_t keys[5] = {10, 20, 10, 30, 20};
  float out[15];
  /* eval of unknown keys: default value, nothing inserted */
  CHECK_OK(dynemb_lookup(t, keys, 5, DYNEMB_LOOKUP_EVAL, 0, NULL, out, NULL));
  for (int i = 0; i < 5; i++)
    for (int j = 0; j < 3; j++) CHECK(out[i * 3 + j] == defv[j]);
  CHECK(dynemb_table_size(t) == 0);
  /* train inserts the 3 distinct keys */
  CHECK_OK(dynemb_lookup(t, keys, 5, DYNEMB_LOOKUP_TRAIN, 1, NULL, out, NULL));
  for (int i = 0; i < 15; i++) CHECK(out[i] == 0.25f);
  CHECK(dynemb_table_size(t) == 3);
  dynemb_table_stats st;
  dynemb_table_get_stats(t, &st);
  CHECK(st.lookups == 10);
  CHECK(st.inserted == 3);
  CHECK(st.hits == 2); /* the repeats of 10 and 20 in the train batch */
  CHECK(st.rejected == 0);
  CHECK(st.size == 3 && st.capacity >= 3 && st.candidates == 0);
  /* eval now finds the rows; key 99 reads default */
  int64_t k2[2] = {30, 99};
  float o2[6];
  CHECK_OK(dynemb_lookup(t, k2, 2, DYNEMB_LOOKUP_EVAL, 0, NULL, o2, NULL));
  CHECK(o2[0] == 0.25f && o2[3] == 7 && o2[5] == 9);
  CHECK(dynemb_table_size(t) == 1 + 2);
  /* argument errors */
  CHECK_RC(dynemb_lookup(t, keys, 5, DYNEMB_LOOKUP_TRAIN, -1, NULL, out, NULL),
           DYNEMB_EINVAL);
  CHECK(strstr(dynemb_last_error(), "'lk'") && strstr(dynemb_last_error(), "now"));
  CHECK_RC(dynemb_lookup(t, keys, 5, DYNEMB_LOOKUP_TRAIN, INT64_C(1) << 32,
                         NULL, out, NULL),
           DYNEMB_EINVAL);
  CHECK_OK(dynemb_lookup(t, keys, 5, DYNEMB_LOOKUP_TRAIN, UINT32_MAX, NULL, out,
                         NULL));
  CHECK_RC(dynemb_lookup(t, NULL, 5, DYNEMB_LOOKUP_TRAIN, 1, NULL, out, NULL),
           DYNEMB_EINVAL);
  CHECK_RC(dynemb_lookup(t, keys, 5, DYNEMB_LOOKUP_TRAIN, 1, NULL, NULL, NULL),
           DYNEMB_EINVAL);
  CHECK_RC(dynemb_lookup(t, keys, 5, 7, 1, NULL, out, NULL), DYNEMB_EINVAL);
  CHECK_OK(dynemb_lookup(t, NULL, 0, DYNEMB_LOOKUP_TRAIN, 1, NULL, NULL, NULL));
  CHECK_RC(
      dynemb_lookup(NULL, keys, 5, DYNEMB_LOOKUP_TRAIN, 1, NULL, out, NULL),
      DYNEMB_EINVAL);
  done(t);
}

/* Initial values: equal to dynemb_init_row and independent of the shard
 * count and of batch composition. */
static void tweak_normal_1(dynemb_table_config *c) {
  c->init.kind = DYNEMB_INIT_NORMAL;
  c->init.a = 0;
  c->init.b = 1;
  c->init.seed = 42;
  c->shards = 1;
}
static void tweak_normal_64(dynemb_table_config *c) {
  tweak_normal_1(c);
  c->shards = 64;
}

static void test_init_independent_of_sharding(void) {
  dynemb_table *a = make("n1", 5, tweak_normal_1), *b = make("n64", 5, tweak_normal_64);
  enum { N = 300 };
  int64_t keys[N], rev[N];
  for (int i = 0; i < N; i++) keys[i] = rev[N - 1 - i] = (int64_t)i * 7919 - 1000;
  float oa[N * 5], ob[N * 5], ref[5];
  CHECK_OK(dynemb_lookup(a, keys, N, DYNEMB_LOOKUP_TRAIN, 1, NULL, oa, NULL));
  CHECK_OK(dynemb_lookup(b, rev, N, DYNEMB_LOOKUP_TRAIN, 1, NULL, ob, NULL));
  dynemb_initializer init = {DYNEMB_INIT_NORMAL, 0, 1, 42};
  int nonzero = 0;
  for (int i = 0; i < N; i++) {
    dynemb_init_row(&init, keys[i], ref, 5);
    CHECK(memcmp(oa + i * 5, ref, sizeof ref) == 0);
    CHECK(memcmp(ob + (N - 1 - i) * 5, ref, sizeof ref) == 0);
    nonzero += ref[0] != 0;
  }
  CHECK(nonzero > N - 3);
  dynemb_table_release(a);
  done(b);
}

/* ---- admission -------------------------------------------------------------- */

static void tweak_admit3(dynemb_table_config *c) {
  tweak_const(c);
  c->access_threshold = 3;
  c->eviction_threshold = 10;
}

static void test_admission(void) {
  dynemb_table *t = make("adm", 2, tweak_admit3);
  int64_t k = 77, k2 = 78;
  float o[2];
  CHECK_OK(dynemb_lookup(t, &k, 1, DYNEMB_LOOKUP_TRAIN, 1, NULL, o, NULL));
  CHECK(o[0] == 0 && o[1] == 0); /* default (zeros) */
  CHECK_OK(dynemb_lookup(t, &k2, 1, DYNEMB_LOOKUP_TRAIN, 1, NULL, o, NULL));
  dynemb_table_stats st;
  dynemb_table_get_stats(t, &st);
  CHECK(st.size == 0 && st.candidates == 2 && st.rejected == 2);
  /* eval lookups do not count */
  CHECK_OK(dynemb_lookup(t, &k, 1, DYNEMB_LOOKUP_EVAL, 1, NULL, o, NULL));
  CHECK_OK(dynemb_lookup(t, &k, 1, DYNEMB_LOOKUP_EVAL, 1, NULL, o, NULL));
  CHECK(dynemb_table_size(t) == 0);
  /* gradients of unadmitted keys are dropped */
  float g[2] = {1, 1};
  dynemb_apply_stats as;
  CHECK_OK(dynemb_apply(t, &k, 1, g, -1, NULL, &as));
  CHECK(as.dropped_unknown == 1 && as.applied == 0 && as.unique_keys == 1);
  CHECK_OK(dynemb_lookup(t, &k, 1, DYNEMB_LOOKUP_TRAIN, 2, NULL, o, NULL));
  CHECK(dynemb_table_size(t) == 0);
  /* third occurrence: admitted (a batch with the key twice counts twice) */
  int64_t kk[2] = {k, k};
  float o2[4];
  CHECK_OK(dynemb_lookup(t, kk, 2, DYNEMB_LOOKUP_TRAIN, 3, NULL, o2, NULL));
  CHECK(o2[0] == 0.5f && o2[2] == 0.5f);
  dynemb_table_get_stats(t, &st);
  CHECK(st.size == 1 && st.candidates == 1 && st.inserted == 1);
  CHECK(st.rejected == 3 && st.hits == 1);
  /* snapshot shows the candidate k2 with count 1 */
  dynemb_snapshot s;
  CHECK_OK(dynemb_table_snapshot(t, &s));
  CHECK(s.rows == 1 && s.keys[0] == 77 && s.candidates == 1);
  CHECK(s.cand_keys[0] == 78 && s.cand_counts[0] == 1 && s.cand_last_access[0] == 1);
  dynemb_snapshot_free(&s);
  /* candidates are evicted like rows */
  size_t ev = 99;
  CHECK_OK(dynemb_evict(t, 12, DYNEMB_TABLE_THRESHOLD, &ev));
  CHECK(ev == 0);
  dynemb_table_get_stats(t, &st);
  CHECK(st.candidates == 0 && st.evicted_candidates == 1 && st.size == 1);
  /* lowering the threshold at run time admits at once */
  CHECK_OK(dynemb_table_set_access_threshold(t, 1));
  CHECK_OK(dynemb_lookup(t, &k2, 1, DYNEMB_LOOKUP_TRAIN, 12, NULL, o, NULL));
  CHECK(o[0] == 0.5f && dynemb_table_size(t) == 2);
  dynemb_table_config got;
  dynemb_table_get_config(t, &got);
  CHECK(got.access_threshold == 1 && got.eviction_threshold == 10);
  done(t);
}

/* mxRec's threshold 0: counting stopped. Keys with a row train on; keys
 * without one are neither counted nor given a candidate, and are admitted
 * only by a count they already had; resuming counts on from there. */
static void test_admission_counting_stopped(void) {
  dynemb_table *t = make("adm_stop", 2, tweak_admit3);
  int64_t two[2] = {5, 5}, row[3] = {6, 6, 6}, fresh = 7;
  float o[6];
  dynemb_ticket tk[3];
  CHECK(dynemb_table_admission_counting(t) == 1);
  CHECK_OK(dynemb_lookup(t, two, 2, DYNEMB_LOOKUP_TRAIN, 1, NULL, o,
                         NULL)); /* 5: count 2 */
  CHECK_OK(dynemb_lookup(t, row, 3, DYNEMB_LOOKUP_TRAIN, 1, NULL, o,
                         NULL)); /* 6: a row */
  CHECK_OK(dynemb_table_set_admission_counting(t, 0));
  CHECK(dynemb_table_admission_counting(t) == 0);
  for (int i = 0; i < 4; i++) {
    CHECK_OK(dynemb_lookup(t, two, 2, DYNEMB_LOOKUP_TRAIN, 2, NULL, o, NULL));
    CHECK(o[0] == 0 && o[2] == 0);
    CHECK_OK(dynemb_prepare(t, &fresh, 1, DYNEMB_LOOKUP_TRAIN, 2, NULL, tk));
    CHECK(tk[0] == DYNEMB_NOT_ADMITTED);
  }
  CHECK_OK(dynemb_lookup(t, row, 1, DYNEMB_LOOKUP_TRAIN, 3, NULL, o, NULL));
  CHECK(o[0] == 0.5f); /* the row reads, and is stamped */
  dynemb_snapshot s;
  CHECK_OK(dynemb_table_snapshot(t, &s));
  CHECK(s.rows == 1 && s.keys[0] == 6 && s.last_access[0] == 3);
  CHECK(s.candidates == 1 && s.cand_keys[0] == 5 && s.cand_counts[0] == 2);
  dynemb_snapshot_free(&s);
  /* a lower threshold admits by the count a key has, without counting */
  CHECK_OK(dynemb_table_set_access_threshold(t, 2));
  CHECK_OK(dynemb_lookup(t, two, 1, DYNEMB_LOOKUP_TRAIN, 4, NULL, o, NULL));
  CHECK(o[0] == 0.5f && dynemb_table_size(t) == 2);
  /* resumed: counting goes on (fresh: 1 sighting now, 2 next time) */
  CHECK_OK(dynemb_table_set_admission_counting(t, 1));
  CHECK_OK(dynemb_lookup(t, &fresh, 1, DYNEMB_LOOKUP_TRAIN, 5, NULL, o, NULL));
  CHECK(o[0] == 0 && dynemb_table_size(t) == 2);
  CHECK_OK(dynemb_lookup(t, &fresh, 1, DYNEMB_LOOKUP_TRAIN, 5, NULL, o, NULL));
  CHECK(o[0] == 0.5f && dynemb_table_size(t) == 3);
  /* a threshold of 1 needs no count: stopped or not, keys are admitted */
  int64_t other = 8;
  CHECK_OK(dynemb_table_set_admission_counting(t, 0));
  CHECK_OK(dynemb_table_set_access_threshold(t, 1));
  CHECK_OK(dynemb_lookup(t, &other, 1, DYNEMB_LOOKUP_TRAIN, 6, NULL, o, NULL));
  CHECK(o[0] == 0.5f && dynemb_table_size(t) == 4);
  CHECK(dynemb_table_set_admission_counting(NULL, 0) == DYNEMB_EINVAL);
  done(t);
}

/* Weighted sightings (mxRec's faae_coefficient): each occurrence counts
 * `weight` towards the threshold, the weights of different callers add up,
 * the counts saturate, and the prepare counts as the lookup does. */
static void tweak_admit5(dynemb_table_config *c) {
  tweak_const(c);
  c->access_threshold = 5;
}

static void test_admission_weighted(void) {
  dynemb_table *t = make("adm_w", 2, tweak_admit5);
  int64_t a = 1, b = 2, c = 3, d = 4;
  float o[4];
  dynemb_ticket tk[2];
  for (int i = 0; i < 2; i++) { /* a: 2, then 4 */
    CHECK_OK(dynemb_lookup(t, &a, 1, DYNEMB_LOOKUP_TRAIN, 1,
                           &(dynemb_lookup_opts){.weight = 2}, o, NULL));
    CHECK(o[0] == 0);
  }
  CHECK_OK(dynemb_lookup(t, &a, 1, DYNEMB_LOOKUP_TRAIN, 1,
                         &(dynemb_lookup_opts){.weight = 2}, o, NULL));
  CHECK(o[0] == 0.5f && dynemb_table_size(t) == 1); /* 6 >= 5 */
  /* b: one occurrence weighing the threshold is admitted at once */
  CHECK_OK(dynemb_prepare(t, &b, 1, DYNEMB_LOOKUP_TRAIN, 1,
                          &(dynemb_lookup_opts){.weight = 5}, tk));
  CHECK(tk[0] != DYNEMB_NOT_ADMITTED && dynemb_table_size(t) == 2);
  /* c: 1 (weight 1) + 4 (weight 4, a second feature of the table) = 5;
   * within one call: the second occurrence is the admitted one */
  int64_t cc[2] = {3, 3};
  /* (a zeroed options struct weighs one, as NULL does) */
  CHECK_OK(dynemb_lookup(t, &c, 1, DYNEMB_LOOKUP_TRAIN, 2,
                         &(dynemb_lookup_opts){0}, o, NULL));
  CHECK_OK(dynemb_prepare(t, cc, 2, DYNEMB_LOOKUP_TRAIN, 2,
                          &(dynemb_lookup_opts){.weight = 2}, tk));
  CHECK(tk[0] == DYNEMB_NOT_ADMITTED && tk[1] != DYNEMB_NOT_ADMITTED);
  /* d: counts saturate instead of wrapping (the snapshot's uint32) */
  CHECK_OK(dynemb_table_set_access_threshold(t, UINT32_MAX));
  for (int i = 0; i < 3; i++)
    CHECK_OK(dynemb_lookup(t, &d, 1, DYNEMB_LOOKUP_TRAIN, 3,
                           &(dynemb_lookup_opts){.weight = INT32_MAX}, o,
                           NULL));
  dynemb_snapshot s;
  CHECK_OK(dynemb_table_snapshot(t, &s));
  CHECK(s.candidates == 1 && s.cand_keys[0] == 4 &&
        s.cand_counts[0] == UINT32_MAX - 1);
  dynemb_snapshot_free(&s);
  /* eval lookups count nothing, whatever the weight */
  CHECK_OK(dynemb_lookup(t, &c, 1, DYNEMB_LOOKUP_EVAL, 0,
                         &(dynemb_lookup_opts){.weight = 7}, o, NULL));
  CHECK(dynemb_lookup(t, &a, 1, DYNEMB_LOOKUP_TRAIN, 3,
                      &(dynemb_lookup_opts){.weight = (uint32_t)INT32_MAX + 1},
                      o, NULL) == DYNEMB_EINVAL);
  CHECK(strstr(dynemb_last_error(), "adm_w") != NULL);
  CHECK(dynemb_prepare(t, &a, 1, DYNEMB_LOOKUP_TRAIN, 3,
                       &(dynemb_lookup_opts){.weight = (uint32_t)INT32_MAX + 1},
                       tk) == DYNEMB_EINVAL);
  done(t);
}

/* ---- eviction ------------------------------------------------------------- */

static void tweak_evict(dynemb_table_config *c) {
  tweak_const(c);
  c->eviction_threshold = 5;
  c->shards = 1; /* slot reuse is per shard: one shard makes it exact */
}

/* An explicit threshold (mxRec's eviction_threshold 0 included): rows and
 * candidates not accessed for more than it go, whatever the table's own. */
static void test_evict_older_than(void) {
  dynemb_table *t = make("ev0", 2, tweak_admit3); /* (its own threshold: 10) */
  int64_t rows[3] = {1, 2, 3}, cand = 9;
  float o[6];
  for (int i = 0; i < 3; i++)
    CHECK_OK(dynemb_lookup(t, rows, 3, DYNEMB_LOOKUP_TRAIN, 5, NULL, o, NULL));
  CHECK_OK(dynemb_lookup(t, &cand, 1, DYNEMB_LOOKUP_TRAIN, 5, NULL, o, NULL));
  CHECK_OK(dynemb_lookup(t, rows, 1, DYNEMB_LOOKUP_TRAIN, 7, NULL, o,
                         NULL)); /* 1 at 7 */
  size_t ev = 0;
  CHECK_OK(dynemb_evict(t, 7, DYNEMB_TABLE_THRESHOLD,
                        &ev)); /* the table's 10: nothing */
  CHECK(ev == 0 && dynemb_table_size(t) == 3);
  CHECK_OK(dynemb_evict(t, 7, 0, &ev)); /* not seen at 7: gone */
  CHECK(ev == 2 && dynemb_table_size(t) == 1);
  dynemb_snapshot s;
  CHECK_OK(dynemb_table_snapshot(t, &s));
  CHECK(s.rows == 1 && s.keys[0] == 1 && s.candidates == 0);
  dynemb_snapshot_free(&s);
  CHECK(dynemb_evict(t, 7, -2, &ev) == DYNEMB_EINVAL);
  CHECK(strstr(dynemb_last_error(), "ev0") != NULL);
  done(t);
}

static void test_eviction_reuse(void) {
  dynemb_table *t = make("ev", 16, tweak_evict);
  enum { N = 1000 };
  int64_t keys[N];
  float *out = malloc(sizeof(float) * N * 16);
  for (int i = 0; i < N; i++) keys[i] = i;
  CHECK_OK(
      dynemb_lookup(t, keys, N, DYNEMB_LOOKUP_TRAIN, 100, NULL, out, NULL));
  /* touch the even keys later */
  int64_t even[N / 2];
  for (int i = 0; i < N / 2; i++) even[i] = 2 * i;
  CHECK_OK(
      dynemb_lookup(t, even, N / 2, DYNEMB_LOOKUP_TRAIN, 104, NULL, out, NULL));
  dynemb_table_stats st;
  dynemb_table_get_stats(t, &st);
  uint64_t cap0 = st.capacity;
  size_t ev = 0;
  CHECK_OK(dynemb_evict(t, 105, DYNEMB_TABLE_THRESHOLD,
                        &ev)); /* 105-100 = 5: not more than 5 */
  CHECK(ev == 0);
  CHECK_OK(dynemb_evict(t, 106, DYNEMB_TABLE_THRESHOLD, &ev));
  CHECK(ev == N / 2);
  CHECK(dynemb_table_size(t) == N / 2);
  /* odd keys are gone (eval reads the default), even keys remain */
  CHECK_OK(dynemb_lookup(t, keys, N, DYNEMB_LOOKUP_EVAL, 0, NULL, out, NULL));
  for (int i = 0; i < N; i++) CHECK(out[i * 16] == (i % 2 ? 0.0f : 0.5f));
  /* new keys reuse the freed slots: capacity does not grow */
  int64_t fresh[N / 2];
  for (int i = 0; i < N / 2; i++) fresh[i] = 1000000 + i;
  CHECK_OK(dynemb_lookup(t, fresh, N / 2, DYNEMB_LOOKUP_TRAIN, 106, NULL, out,
                         NULL));
  dynemb_table_get_stats(t, &st);
  CHECK(st.capacity == cap0);
  CHECK(st.size == N);
  CHECK(st.evicted == N / 2 && st.inserted == N + N / 2);
  CHECK(st.size == st.inserted - st.evicted);
  for (int i = 0; i < N / 2; i++) CHECK(out[i * 16 + 15] == 0.5f);
  /* eviction disabled: nothing happens */
  CHECK_OK(dynemb_table_set_eviction_threshold(t, 0));
  CHECK_OK(dynemb_evict(t, 1000000, DYNEMB_TABLE_THRESHOLD, &ev));
  CHECK(ev == 0 && dynemb_table_size(t) == N);
  CHECK_RC(dynemb_table_set_eviction_threshold(t, -1), DYNEMB_EINVAL);
  CHECK_RC(dynemb_evict(t, -2, DYNEMB_TABLE_THRESHOLD, &ev),
           DYNEMB_EINVAL); /* -1 = table clock */
  /* a row stamped later than `now` is never evicted */
  CHECK_OK(dynemb_table_set_eviction_threshold(t, 1));
  CHECK_OK(dynemb_evict(t, 50, DYNEMB_TABLE_THRESHOLD, &ev));
  CHECK(ev == 0);
  CHECK_OK(dynemb_evict(t, 1000, DYNEMB_TABLE_THRESHOLD, &ev));
  CHECK(ev == N && dynemb_table_size(t) == 0);
  /* clear */
  CHECK_OK(
      dynemb_lookup(t, keys, 10, DYNEMB_LOOKUP_TRAIN, 2000, NULL, out, NULL));
  dynemb_table_clear(t);
  dynemb_table_get_stats(t, &st);
  CHECK(st.size == 0 && st.capacity == 0 && st.candidates == 0);
  CHECK(st.inserted == N + N / 2 + 10); /* counters kept */
  free(out);
  done(t);
}

/* ---- apply ------------------------------------------------------------------- */

static void tweak_sgd(dynemb_table_config *c) {
  tweak_const(c);
  c->optimizer.learning_rate = 0.5f;
  c->shards = 8;
}

static void test_apply_sgd(void) {
  dynemb_table *t = make("sgd", 2, tweak_sgd);
  int64_t keys[4] = {1, 2, 1, 3};
  float out[8];
  CHECK_OK(dynemb_lookup(t, keys, 2, DYNEMB_LOOKUP_TRAIN, 1, NULL, out,
                         NULL)); /* 1, 2 */
  float g[8] = {1, 2, 3, 4, 10, 20, 5, 5};
  dynemb_apply_stats as;
  CHECK_OK(dynemb_apply(t, keys, 4, g, -1, NULL, &as));
  CHECK(as.unique_keys == 3 && as.applied == 2 && as.dropped_unknown == 1);
  CHECK(as.skipped_nonfinite == 0);
  CHECK_OK(dynemb_lookup(t, keys, 2, DYNEMB_LOOKUP_EVAL, 0, NULL, out, NULL));
  /* key 1: 0.5 - 0.5 * (1 + 10) ; key 2: 0.5 - 0.5 * 3 */
  CHECK(out[0] == 0.5f - 0.5f * 11.0f && out[1] == 0.5f - 0.5f * 22.0f);
  CHECK(out[2] == 0.5f - 0.5f * 3.0f && out[3] == 0.5f - 0.5f * 4.0f);
  /* explicit learning rate */
  CHECK_OK(dynemb_apply(t, keys + 1, 1, g, 0.25f, NULL, NULL));
  CHECK_OK(
      dynemb_lookup(t, keys + 1, 1, DYNEMB_LOOKUP_EVAL, 0, NULL, out, NULL));
  CHECK(out[0] == (0.5f - 0.5f * 3.0f) - 0.25f * 1.0f);
  dynemb_table_stats st;
  dynemb_table_get_stats(t, &st);
  CHECK(st.apply_steps == 2 && st.applied == 3 && st.dropped_gradients == 1);
  /* errors */
  CHECK_RC(dynemb_apply(t, NULL, 1, g, -1, NULL, NULL), DYNEMB_EINVAL);
  CHECK_RC(dynemb_apply(t, keys, 1, NULL, -1, NULL, NULL), DYNEMB_EINVAL);
  CHECK_RC(dynemb_apply(t, keys, 1, g, NAN, NULL, NULL), DYNEMB_EINVAL);
  CHECK_OK(dynemb_apply(t, NULL, 0, NULL, -1, NULL, &as));
  CHECK(as.unique_keys == 0);
  done(t);
}

static void tweak_skip(dynemb_table_config *c) {
  tweak_sgd(c);
  c->nonfinite_policy = DYNEMB_NONFINITE_SKIP;
}

static void test_apply_nonfinite(void) {
  dynemb_table *t = make("nf", 2, tweak_sgd);
  int64_t keys[3] = {5, 6, 7};
  float out[6];
  CHECK_OK(dynemb_lookup(t, keys, 3, DYNEMB_LOOKUP_TRAIN, 1, NULL, out, NULL));
  float g[6] = {1, 1, 1, NAN, 1, 1};
  CHECK_RC(dynemb_apply(t, keys, 3, g, -1, NULL, NULL), DYNEMB_ENONFINITE);
  CHECK(strstr(dynemb_last_error(), "'nf'") && strstr(dynemb_last_error(), "key 6"));
  CHECK_OK(dynemb_lookup(t, keys, 3, DYNEMB_LOOKUP_EVAL, 0, NULL, out, NULL));
  for (int i = 0; i < 6; i++) CHECK(out[i] == 0.5f); /* nothing applied */
  dynemb_table_stats st;
  dynemb_table_get_stats(t, &st);
  CHECK(st.apply_steps == 0 && st.applied == 0);
  g[3] = 1;
  g[4] = -INFINITY;
  CHECK_RC(dynemb_apply(t, keys, 3, g, -1, NULL, NULL), DYNEMB_ENONFINITE);
  CHECK(strstr(dynemb_last_error(), "key 7") != NULL);
  done(t);

  t = make("nf2", 2, tweak_skip);
  CHECK_OK(dynemb_lookup(t, keys, 3, DYNEMB_LOOKUP_TRAIN, 1, NULL, out, NULL));
  int64_t k4[4] = {5, 6, 7, 5};
  float g4[8] = {1, 1, 1, NAN, 1, 1, INFINITY, 0};
  dynemb_apply_stats as;
  CHECK_OK(dynemb_apply(t, k4, 4, g4, -1, NULL, &as));
  /* key 5 has an Inf in its second occurrence: the whole key is skipped */
  CHECK(as.skipped_nonfinite == 2 && as.applied == 1 && as.unique_keys == 3);
  CHECK_OK(dynemb_lookup(t, keys, 3, DYNEMB_LOOKUP_EVAL, 0, NULL, out, NULL));
  CHECK(out[0] == 0.5f && out[2] == 0.5f && out[4] == 0.0f && out[5] == 0.0f);
  dynemb_table_get_stats(t, &st);
  CHECK(st.nonfinite_skipped == 2 && st.applied == 1 && st.apply_steps == 1);
  /* finite gradients whose sum overflows: key 6 is skipped (SKIP)... */
  int64_t k3[3] = {6, 7, 6};
  float g3[6] = {3e38f, 0, 1, 1, 3e38f, 0};
  CHECK_OK(dynemb_apply(t, k3, 3, g3, -1, NULL, &as));
  CHECK(as.skipped_nonfinite == 1 && as.applied == 1);
  CHECK_OK(dynemb_lookup(t, keys, 3, DYNEMB_LOOKUP_EVAL, 0, NULL, out, NULL));
  CHECK(out[2] == 0.5f && out[3] == 0.5f); /* key 6 unchanged */
  done(t);
  /* ...and named as an overflow (ERROR) */
  t = make("nf3", 2, tweak_sgd);
  CHECK_OK(dynemb_lookup(t, keys, 3, DYNEMB_LOOKUP_TRAIN, 1, NULL, out, NULL));
  CHECK_RC(dynemb_apply(t, k3, 3, g3, -1, NULL, NULL), DYNEMB_ENONFINITE);
  CHECK(strstr(dynemb_last_error(), "key 6") &&
        strstr(dynemb_last_error(), "overflow"));
  done(t);
}

/* The engine checks finiteness in one of two ways depending on how many keys
 * of the batch repeat; both must skip (or reject) exactly the same keys. */
static void nonfinite_batch(int repeat_heavy, int policy_skip) {
  /* unique-heavy: 10 keys, key 1 twice; repeat-heavy: 5 keys, each twice */
  int64_t k[10];
  int n = 10;
  for (int i = 0; i < n; i++) k[i] = repeat_heavy ? 1 + i / 2 : (i == 9 ? 1 : 1 + i);
  float g[20];
  for (int i = 0; i < 20; i++) g[i] = 1;
  /* a NaN in key 2's (first) row, an Inf in key 3's (second or only) row, and
   * two finite rows of key 1 that overflow when summed */
  const int p2 = repeat_heavy ? 2 : 1, p3 = repeat_heavy ? 5 : 2;
  g[2 * p2 + 1] = NAN;
  g[2 * p3] = INFINITY;
  g[0] = 3e38f;
  g[2 * 9] = 3e38f; /* position 9 is key 1 (unique-heavy) or key 5 */
  if (repeat_heavy) g[2 * 1] = 3e38f, g[2 * 9] = 1;
  dynemb_table *t = make("nfb", 2, policy_skip ? tweak_skip : tweak_sgd);
  float out[20];
  CHECK_OK(
      dynemb_lookup(t, k, (size_t)n, DYNEMB_LOOKUP_TRAIN, 1, NULL, out, NULL));
  dynemb_apply_stats as;
  int rc = dynemb_apply(t, k, (size_t)n, g, -1, NULL, &as);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", dynemb_last_error());
  const int nkeys = repeat_heavy ? 5 : 9;
  int64_t all[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  CHECK_OK(dynemb_lookup(t, all, (size_t)nkeys, DYNEMB_LOOKUP_EVAL, 0, NULL,
                         out, NULL));
  if (policy_skip) {
    CHECK_OK(rc);
    CHECK(as.skipped_nonfinite == 3 && as.applied == (size_t)nkeys - 3);
    for (int i = 0; i < 3; i++) /* keys 1, 2, 3: unchanged */
      CHECK(out[2 * i] == 0.5f && out[2 * i + 1] == 0.5f);
    for (int i = 3; i < nkeys; i++) CHECK(out[2 * i] != 0.5f);
  } else {
    CHECK(rc == DYNEMB_ENONFINITE);
    /* the first non-finite element in batch order: key 2's NaN */
    CHECK(strstr(msg, "key 2 (batch position") != NULL);
    for (int i = 0; i < 2 * nkeys; i++) CHECK(out[i] == 0.5f); /* nothing */
  }
  done(t);
}

static void test_apply_nonfinite_both_checks(void) {
  for (int heavy = 0; heavy < 2; heavy++)
    for (int sk = 0; sk < 2; sk++) nonfinite_batch(heavy, sk);
}

/* ---- adversarial keys -------------------------------------------------------- */

static void tweak_one_shard(dynemb_table_config *c) {
  c->shards = 1;
  c->init.kind = DYNEMB_INIT_UNIFORM;
  c->init.a = -1;
  c->init.b = 1;
  c->optimizer.learning_rate = 1.0f;
}

static void test_extreme_keys(void) {
  dynemb_table *t = make("xk", 1, tweak_one_shard);
  int64_t keys[6] = {0, -1, INT64_MIN, INT64_MAX, 1, INT64_MIN + 1};
  float out[6], out2[6], g[6] = {1, 2, 3, 4, 5, 6};
  CHECK_OK(dynemb_lookup(t, keys, 6, DYNEMB_LOOKUP_TRAIN, 1, NULL, out, NULL));
  CHECK(dynemb_table_size(t) == 6);
  CHECK_OK(dynemb_apply(t, keys, 6, g, -1, NULL, NULL));
  CHECK_OK(dynemb_lookup(t, keys, 6, DYNEMB_LOOKUP_EVAL, 0, NULL, out2, NULL));
  for (int i = 0; i < 6; i++) CHECK(out2[i] == out[i] - g[i]);
  dynemb_snapshot s;
  CHECK_OK(dynemb_table_snapshot(t, &s));
  CHECK(s.rows == 6);
  if (s.rows == 6) {
    CHECK(s.keys[0] == INT64_MIN && s.keys[1] == INT64_MIN + 1 && s.keys[2] == -1);
    CHECK(s.keys[3] == 0 && s.keys[4] == 1 && s.keys[5] == INT64_MAX);
  }
  dynemb_snapshot_free(&s);
  done(t);
}

/* Keys whose hash has low 32 bits < 2^20 all land in bucket 0 of any
 * index smaller than 4096 entries: one long probe chain. */
static void test_colliding_keys(void) {
  dynemb_table *t = make("coll", 1, tweak_one_shard);
  CHECK_OK(dynemb_table_set_eviction_threshold(t, 1));
  enum { N = 600 };
  int64_t keys[N];
  int n = 0;
  for (int64_t k = -5000000; n < N; k++)
    if ((uint32_t)dynemb_hash_key(k) < (UINT32_C(1) << 20)) keys[n++] = k;
  float out[N], ref[N];
  /* insert in two halves with different times */
  CHECK_OK(
      dynemb_lookup(t, keys, N / 2, DYNEMB_LOOKUP_TRAIN, 10, NULL, out, NULL));
  CHECK_OK(dynemb_lookup(t, keys + N / 2, N / 2, DYNEMB_LOOKUP_TRAIN, 20, NULL,
                         out, NULL));
  CHECK(dynemb_table_size(t) == N);
  dynemb_initializer init = {DYNEMB_INIT_UNIFORM, -1, 1, 0};
  for (int i = 0; i < N; i++) dynemb_init_row(&init, keys[i], &ref[i], 1);
  CHECK_OK(dynemb_lookup(t, keys, N, DYNEMB_LOOKUP_EVAL, 0, NULL, out, NULL));
  for (int i = 0; i < N; i++) CHECK(out[i] == ref[i]);
  /* evict every other key by touching the odd ones later, then evict */
  int64_t odd[N / 2];
  for (int i = 0; i < N / 2; i++) odd[i] = keys[2 * i + 1];
  CHECK_OK(
      dynemb_lookup(t, odd, N / 2, DYNEMB_LOOKUP_TRAIN, 30, NULL, out, NULL));
  size_t ev;
  CHECK_OK(dynemb_evict(t, 31, DYNEMB_TABLE_THRESHOLD, &ev));
  CHECK(ev == N / 2);
  CHECK_OK(dynemb_lookup(t, keys, N, DYNEMB_LOOKUP_EVAL, 0, NULL, out, NULL));
  for (int i = 0; i < N; i++) CHECK(out[i] == (i % 2 ? ref[i] : 0.0f));
  done(t);
}

/* ---- snapshot / import ---------------------------------------------------- */

static void tweak_adam(dynemb_table_config *c) {
  c->init.kind = DYNEMB_INIT_NORMAL;
  c->init.b = 0.1f;
  c->optimizer.kind = DYNEMB_OPT_ADAM;
  c->optimizer.learning_rate = 0.1f;
  c->shards = 16;
  c->access_threshold = 2;
}

static void tweak_adagrad(dynemb_table_config *c) {
  c->optimizer.kind = DYNEMB_OPT_ADAGRAD;
  c->shards = 2;
}

static void test_snapshot_import(void) {
  dynemb_table *a = make("sa", 4, tweak_adam);
  enum { N = 500 };
  int64_t keys[N];
  float *out = malloc(sizeof(float) * N * 4), *g = malloc(sizeof(float) * N * 4);
  for (int i = 0; i < N; i++) keys[i] = (int64_t)((i * 2654435761u) % 100000) - 50000;
  for (int i = 0; i < N * 4; i++) g[i] = (float)((i % 7) - 3) * 0.1f;
  CHECK_OK(dynemb_lookup(a, keys, N, DYNEMB_LOOKUP_TRAIN, 3, NULL, out, NULL));
  CHECK_OK(
      dynemb_lookup(a, keys, N - 100, DYNEMB_LOOKUP_TRAIN, 4, NULL, out, NULL));
  CHECK_OK(dynemb_apply(a, keys, N, g, -1, NULL, NULL));
  CHECK_OK(dynemb_apply(a, keys, N, g, -1, NULL, NULL));
  dynemb_snapshot s;
  CHECK_OK(dynemb_table_snapshot(a, &s));
  CHECK(s.rows == N - 100 && s.candidates == 100);
  CHECK(s.dim == 4 && s.row_floats == 12 && s.optimizer_kind == DYNEMB_OPT_ADAM);
  CHECK(s.apply_steps == 2);
  for (size_t i = 1; i < s.rows; i++) CHECK(s.keys[i - 1] < s.keys[i]);
  for (size_t i = 1; i < s.candidates; i++) CHECK(s.cand_keys[i - 1] < s.cand_keys[i]);
  for (size_t i = 0; i < s.rows; i++) CHECK(s.last_access[i] == 4);

  /* import into a fresh table with another shard count: identical snapshot */
  dynemb_table *b = make("sb", 4, tweak_adam);
  CHECK_OK(dynemb_table_import(b, &s, 0, 0, 0));
  dynemb_snapshot s2;
  CHECK_OK(dynemb_table_snapshot(b, &s2));
  CHECK(s2.rows == s.rows && s2.candidates == s.candidates && s2.apply_steps == 2);
  if (s2.rows == s.rows && s2.candidates == s.candidates) {
    CHECK(memcmp(s2.keys, s.keys, s.rows * 8) == 0);
    CHECK(memcmp(s2.values, s.values, s.rows * 12 * 4) == 0);
    CHECK(memcmp(s2.last_access, s.last_access, s.rows * 4) == 0);
    CHECK(memcmp(s2.cand_keys, s.cand_keys, s.candidates * 8) == 0);
    CHECK(memcmp(s2.cand_counts, s.cand_counts, s.candidates * 4) == 0);
  }
  dynemb_snapshot_free(&s2);

  /* shard filter: 3 partial imports make the whole table again */
  dynemb_table *c = make("sc", 4, tweak_adam);
  size_t total = 0;
  for (uint32_t sh = 0; sh < 3; sh++) {
    CHECK_OK(dynemb_table_import(c, &s, DYNEMB_IMPORT_KEEP_STEPS, sh, 3));
    size_t now = dynemb_table_size(c);
    CHECK(now > total); /* every part adds rows */
    total = now;
  }
  CHECK(total == s.rows);
  dynemb_table_stats st;
  dynemb_table_get_stats(c, &st);
  CHECK(st.apply_steps == 0 && st.candidates == s.candidates);
  /* the key shard function is what the filter used */
  dynemb_table *d = make("sd", 4, tweak_adam);
  CHECK_OK(dynemb_table_import(d, &s, 0, 1, 3));
  dynemb_snapshot s3;
  CHECK_OK(dynemb_table_snapshot(d, &s3));
  size_t want = 0;
  for (size_t i = 0; i < s.rows; i++) want += dynemb_key_shard(s.keys[i], 3) == 1;
  CHECK(s3.rows == want);
  for (size_t i = 0; i < s3.rows; i++) CHECK(dynemb_key_shard(s3.keys[i], 3) == 1);
  dynemb_snapshot_free(&s3);

  /* REPLACE: table d ends up equal to the snapshot */
  int64_t extra = 123456789;
  CHECK_OK(dynemb_table_set_access_threshold(d, 0));
  CHECK_OK(
      dynemb_lookup(d, &extra, 1, DYNEMB_LOOKUP_TRAIN, 9, NULL, out, NULL));
  CHECK_OK(dynemb_table_import(d, &s, DYNEMB_IMPORT_REPLACE, 0, 0));
  CHECK(dynemb_table_size(d) == s.rows);
  CHECK_OK(dynemb_lookup(d, &extra, 1, DYNEMB_LOOKUP_EVAL, 0, NULL, out, NULL));
  CHECK(out[0] == 0.0f);

  /* errors: checks before any change */
  dynemb_table *e = make("se", 4, tweak_adagrad);
  CHECK_RC(dynemb_table_import(e, &s, 0, 0, 0), DYNEMB_EMISMATCH);
  CHECK(strstr(dynemb_last_error(), "'se'") && strstr(dynemb_last_error(), "EMBEDDING_ONLY"));
  CHECK(dynemb_table_size(e) == 0);
  CHECK_OK(dynemb_table_import(e, &s, DYNEMB_IMPORT_EMBEDDING_ONLY, 0, 0));
  dynemb_snapshot s4;
  CHECK_OK(dynemb_table_snapshot(e, &s4));
  CHECK(s4.rows == s.rows && s4.row_floats == 8);
  for (size_t i = 0; i < s4.rows && s4.rows == s.rows; i++)
    for (int j = 0; j < 4; j++) {
      CHECK(s4.values[i * 8 + j] == s.values[i * 12 + j]);
      CHECK_NEAR(s4.values[i * 8 + 4 + j], 0.1, 1e-7, 0); /* fresh accum */
    }
  dynemb_snapshot_free(&s4);
  dynemb_table *f = make("sf", 5, tweak_adam);
  CHECK_RC(dynemb_table_import(f, &s, 0, 0, 0), DYNEMB_EDIM);
  CHECK_RC(dynemb_table_import(f, &s, 0, 3, 3), DYNEMB_EINVAL);
  CHECK_RC(dynemb_table_import(f, NULL, 0, 0, 0), DYNEMB_EINVAL);
  CHECK_RC(dynemb_table_import(f, &s, 64, 0, 0), DYNEMB_EINVAL);
  CHECK(dynemb_table_size(f) == 0);

  dynemb_snapshot_free(&s);
  free(out);
  free(g);
  dynemb_table_release(a);
  dynemb_table_release(b);
  dynemb_table_release(c);
  dynemb_table_release(d);
  dynemb_table_release(e);
  done(f);
}

/* ---- budget ------------------------------------------------------------------ */

/* A snapshot of `n` SGD rows of dim 2 (no candidates). */
static dynemb_snapshot sgd_dim2_snapshot(int64_t *keys, size_t n, float *values) {
  dynemb_snapshot s;
  memset(&s, 0, sizeof s);
  s.dim = 2;
  s.row_floats = 2;
  s.optimizer_kind = DYNEMB_OPT_SGD;
  s.rows = n;
  s.keys = keys;
  s.values = values;
  return s;
}

static void tweak_budget(dynemb_table_config *c) {
  c->host_vocabulary_size = 100;
  c->shards = 4;
}

static void test_host_budget(void) {
  dynemb_table *t = make("bud", 2, tweak_budget);
  int64_t keys[150];
  float out[300];
  for (int i = 0; i < 150; i++) keys[i] = i;
  CHECK_OK(
      dynemb_lookup(t, keys, 100, DYNEMB_LOOKUP_TRAIN, 1, NULL, out, NULL));
  CHECK_RC(
      dynemb_lookup(t, keys + 100, 1, DYNEMB_LOOKUP_TRAIN, 1, NULL, out, NULL),
      DYNEMB_ECAPACITY);
  CHECK(strstr(dynemb_last_error(), "'bud'") &&
        strstr(dynemb_last_error(), "host_vocabulary_size") &&
        strstr(dynemb_last_error(), "eviction"));
  CHECK(dynemb_table_size(t) == 100);
  /* known keys still work */
  CHECK_OK(
      dynemb_lookup(t, keys, 100, DYNEMB_LOOKUP_TRAIN, 1, NULL, out, NULL));
  /* import over budget fails and changes nothing */
  float vals[100] = {0};
  dynemb_snapshot s = sgd_dim2_snapshot(keys + 100, 50, vals);
  CHECK_RC(dynemb_table_import(t, &s, 0, 0, 0), DYNEMB_ECAPACITY);
  CHECK(dynemb_table_size(t) == 100);
  CHECK_OK(dynemb_table_import(t, &s, DYNEMB_IMPORT_REPLACE, 0, 0));
  CHECK(dynemb_table_size(t) == 50);
  /* eviction frees budget */
  CHECK_OK(dynemb_table_set_eviction_threshold(t, 1));
  size_t ev;
  CHECK_OK(dynemb_evict(t, 10, DYNEMB_TABLE_THRESHOLD, &ev));
  CHECK(ev == 50);
  CHECK_OK(
      dynemb_lookup(t, keys, 100, DYNEMB_LOOKUP_TRAIN, 10, NULL, out, NULL));
  done(t);
}

/* A binding that exposes the budget under its own name gets that name in
 * the "full" messages of lookups and imports (copied at creation). */
static void tweak_named_budget(dynemb_table_config *c) {
  static char name[] = "device_vocabulary_size";
  c->host_vocabulary_size = 10;
  c->host_budget_name = name;
}

static void test_host_budget_name(void) {
  dynemb_table *t = make("bud_named", 2, tweak_named_budget);
  dynemb_table_config got;
  dynemb_table_get_config(t, &got);
  CHECK(strcmp(got.host_budget_name, "device_vocabulary_size") == 0);
  int64_t keys[11];
  float out[22];
  for (int i = 0; i < 11; i++) keys[i] = i;
  CHECK_RC(dynemb_lookup(t, keys, 11, DYNEMB_LOOKUP_TRAIN, 1, NULL, out, NULL),
           DYNEMB_ECAPACITY);
  CHECK(strstr(dynemb_last_error(), "device_vocabulary_size = 10 rows is full") &&
        strstr(dynemb_last_error(), "raise device_vocabulary_size") &&
        !strstr(dynemb_last_error(), "host_vocabulary_size"));
  float vals[22] = {0};
  dynemb_snapshot s = sgd_dim2_snapshot(keys, 11, vals);
  CHECK_RC(dynemb_table_import(t, &s, DYNEMB_IMPORT_REPLACE, 0, 0),
           DYNEMB_ECAPACITY);
  CHECK(strstr(dynemb_last_error(), "device_vocabulary_size is 10"));
  done(t);
}

/* ---- the optimizer decided at first apply -------------------------------- */

static const char *ssd_dir(void) {
  const char *d = getenv("TMPDIR");
  return d && *d ? d : "/tmp";
}

static void later_adam(dynemb_table_config *c) {
  c->optimizer.kind = DYNEMB_OPT_ADAM;
  c->init.kind = DYNEMB_INIT_UNIFORM;
  c->init.a = -1.0f;
  c->init.b = 1.0f;
  c->shards = 4;
}

static void later_sgd(dynemb_table_config *c) {
  later_adam(c);
  c->optimizer.kind = DYNEMB_OPT_SGD;
}

static void later_adam_ssd(dynemb_table_config *c) {
  later_adam(c);
  c->host_vocabulary_size = 8;
  c->ssd_vocabulary_size = 1000;
  c->ssd_data_path = ssd_dir();
}

static void later_sgd_ssd(dynemb_table_config *c) {
  later_adam_ssd(c);
  c->optimizer.kind = DYNEMB_OPT_SGD;
}

/* A table made with SGD whose optimizer becomes Adam while it is empty
 * trains exactly as a table made with Adam (the reference), in memory and
 * over an SSD tier; once it holds rows the kind is fixed, nothing changes
 * on a refused call, and the same kind still takes new hyper-parameters. */
static void set_optimizer_case(void (*sgd)(dynemb_table_config *),
                               void (*adam)(dynemb_table_config *)) {
  dynemb_table *a = make("opt_later", 4, sgd), *b = make("opt_first", 4, adam);
  CHECK(a && b);
  dynemb_table_config cb;
  dynemb_table_get_config(b, &cb);
  CHECK(dynemb_table_row_floats(a) == 4);
  CHECK_OK(dynemb_table_set_optimizer(a, &cb.optimizer));
  CHECK(dynemb_table_row_floats(a) == 12);
  int64_t keys[40];
  float grads[40 * 4], out_a[40 * 4], out_b[40 * 4];
  for (int step = 0; step < 6; step++) {
    for (int i = 0; i < 40; i++) keys[i] = (i * 7 + step * 13) % 64;
    for (int i = 0; i < 40 * 4; i++) grads[i] = 0.01f * (float)((i + step) % 9) - 0.04f;
    CHECK_OK(dynemb_lookup(a, keys, 40, DYNEMB_LOOKUP_TRAIN, step, NULL, out_a,
                           NULL));
    CHECK_OK(dynemb_lookup(b, keys, 40, DYNEMB_LOOKUP_TRAIN, step, NULL, out_b,
                           NULL));
    CHECK(memcmp(out_a, out_b, sizeof out_a) == 0);
    CHECK_OK(dynemb_apply(a, keys, 40, grads, 0.1f, NULL, NULL));
    CHECK_OK(dynemb_apply(b, keys, 40, grads, 0.1f, NULL, NULL));
  }
  dynemb_snapshot sa, sb;
  CHECK_OK(dynemb_table_snapshot(a, &sa));
  CHECK_OK(dynemb_table_snapshot(b, &sb));
  CHECK(sa.rows == sb.rows && sa.rows > 8 && sa.row_floats == 12 &&
        sa.optimizer_kind == DYNEMB_OPT_ADAM);
  CHECK(memcmp(sa.values, sb.values, sa.rows * 12 * sizeof(float)) == 0);
  /* rows now: another kind is refused and changes nothing */
  dynemb_optimizer sgd_opt = cb.optimizer;
  sgd_opt.kind = DYNEMB_OPT_SGD;
  CHECK_RC(dynemb_table_set_optimizer(a, &sgd_opt), DYNEMB_EMISMATCH);
  CHECK(strstr(dynemb_last_error(), "'opt_later'") &&
        strstr(dynemb_last_error(), "adam") && strstr(dynemb_last_error(), "sgd"));
  CHECK(dynemb_table_row_floats(a) == 12);
  dynemb_snapshot sa2;
  CHECK_OK(dynemb_table_snapshot(a, &sa2));
  CHECK(sa2.rows == sa.rows &&
        memcmp(sa2.values, sa.values, sa.rows * 12 * sizeof(float)) == 0);
  /* the same kind takes new hyper-parameters; invalid ones are refused */
  dynemb_optimizer adam2 = cb.optimizer;
  adam2.beta1 = 0.5f;
  CHECK_OK(dynemb_table_set_optimizer(a, &adam2));
  dynemb_table_config ca;
  dynemb_table_get_config(a, &ca);
  CHECK(ca.optimizer.beta1 == 0.5f);
  adam2.beta1 = 1.0f;
  CHECK_RC(dynemb_table_set_optimizer(a, &adam2), DYNEMB_EINVAL);
  CHECK_RC(dynemb_table_set_optimizer(a, NULL), DYNEMB_EINVAL);
  CHECK_RC(dynemb_table_set_optimizer(NULL, &adam2), DYNEMB_EINVAL);
  dynemb_snapshot_free(&sa);
  dynemb_snapshot_free(&sb);
  dynemb_snapshot_free(&sa2);
  dynemb_table_release(a);
  done(b);
}

static void test_set_optimizer(void) {
  set_optimizer_case(later_sgd, later_adam);
  set_optimizer_case(later_sgd_ssd, later_adam_ssd);
}

static void test_key_shard_and_widen(void) {
  CHECK(dynemb_key_shard(12345, 0) == 0 && dynemb_key_shard(12345, 1) == 0);
  /* the function is frozen: these values must never change */
  uint32_t counts[8] = {0};
  for (int64_t k = 0; k < 8000; k++) counts[dynemb_key_shard(k, 8)]++;
  for (int i = 0; i < 8; i++) CHECK(counts[i] > 850 && counts[i] < 1150);
  /* reference: fastrange of the top 32 bits of the splitmix64 finalizer,
   * applied to key + golden ratio, then again after a salt (computed
   * independently here) */
  uint64_t x = (uint64_t)777 + 0x9e3779b97f4a7c15ULL;
  for (int round = 0; round < 2; round++) {
    if (round) x ^= 0xd6e8feb86659fd93ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    x ^= x >> 31;
  }
  CHECK(dynemb_key_shard(777, 1000) == (uint32_t)(((x >> 32) * 1000) >> 32));
  /* The keys one rank of 64 owns spread over all 64 lock shards (top six
   * hash bits) and over the index's buckets (fastrange of the low 32 bits):
   * a rank's table is not confined to one lock or one end of its index. */
  uint32_t locks[64] = {0}, buckets[16] = {0}, owned = 0;
  for (int64_t k = 0; owned < 64000; k++) {
    if (dynemb_key_shard(k, 64) != 5) continue;
    owned++;
    uint64_t h = dynemb_hash_key(k);
    locks[h >> 58]++;
    buckets[((uint64_t)(uint32_t)h * 16) >> 32]++;
  }
  for (int i = 0; i < 64; i++) CHECK(locks[i] > 800 && locks[i] < 1200);
  for (int i = 0; i < 16; i++) CHECK(buckets[i] > 3600 && buckets[i] < 4400);
  int32_t in[4] = {0, -1, INT32_MIN, INT32_MAX};
  int64_t w[4];
  dynemb_widen_keys(in, 4, w);
  CHECK(w[0] == 0 && w[1] == -1 && w[2] == INT32_MIN && w[3] == INT32_MAX);
}

static void test_stats_bytes(void) {
  dynemb_table *t = make("by", 64, NULL);
  dynemb_table_stats s0, s1;
  dynemb_table_get_stats(t, &s0);
  enum { N = 20000 };
  int64_t *keys = malloc(N * sizeof *keys);
  float *out = malloc((size_t)N * 64 * sizeof *out);
  for (int i = 0; i < N; i++) keys[i] = i * 31;
  CHECK_OK(dynemb_lookup(t, keys, N, DYNEMB_LOOKUP_TRAIN, 1, NULL, out, NULL));
  dynemb_table_get_stats(t, &s1);
  uint64_t row_bytes = (uint64_t)N * 64 * 4;
  CHECK(s1.bytes > s0.bytes + row_bytes);
  /* index + slack stay well below a row's size here */
  CHECK(s1.bytes < s0.bytes + row_bytes * 2);
  CHECK(s1.capacity >= N && s1.size == N);
  CHECK(dynemb_table_capacity(t) == s1.capacity);
  free(keys);
  free(out);
  done(t);
}

int main(void) {
  RUN(test_registry);
  RUN(test_config_defaults);
  RUN(test_config_errors);
  RUN(test_lookup_train_eval);
  RUN(test_init_independent_of_sharding);
  RUN(test_admission);
  RUN(test_admission_counting_stopped);
  RUN(test_admission_weighted);
  RUN(test_evict_older_than);
  RUN(test_eviction_reuse);
  RUN(test_apply_sgd);
  RUN(test_apply_nonfinite);
  RUN(test_apply_nonfinite_both_checks);
  RUN(test_extreme_keys);
  RUN(test_colliding_keys);
  RUN(test_snapshot_import);
  RUN(test_host_budget);
  RUN(test_host_budget_name);
  RUN(test_set_optimizer);
  RUN(test_key_shard_and_widen);
  RUN(test_stats_bytes);
  return check_summary();
}
