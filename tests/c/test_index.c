/*
 * test_index.c -- tests of the open-addressing key index (src/index.c)
 * against a brute-force reference map: random insert/erase sequences with
 * the real hash, with every key in one bucket, with chains that wrap
 * around the end of the array, extreme key values, growth and load factor.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dynemb.h"
#include "hash.h"
#include "index.h"

static uint64_t hash_zero(int64_t k) {
  (void)k;
  return 0;
}
static uint64_t hash_top(int64_t k) { /* home = cap - 1: chains wrap */
  (void)k;
  return 0xffffffffu;
}
static uint64_t hash_four(int64_t k) { /* 4 homes spread over the array */
  return (uint64_t)((uint64_t)k & 3) * 0x40000000u + 0x3fffffffu;
}

/* brute-force reference */
typedef struct ref {
  int64_t key[4096];
  uint32_t loc[4096];
  int n;
} ref;

static int ref_find(const ref *r, int64_t k) {
  for (int i = 0; i < r->n; i++)
    if (r->key[i] == k) return i;
  return -1;
}

static uint64_t rng_state = 88172645463325252ULL;
static uint64_t rnd(void) { return check_xorshift(&rng_state); }

/* Checks that index and reference hold exactly the same mapping. */
static int same(const dynemb_index *ix, const ref *r) {
  int bad = 0;
  if (ix->count != (uint64_t)r->n) bad++;
  for (int i = 0; i < r->n; i++) {
    const dynemb_index_entry *e = dynemb_index_find(ix, r->key[i], ix->hash(r->key[i]));
    if (!e || e->loc != r->loc[i]) bad++;
  }
  uint64_t nonempty = 0;
  for (uint64_t i = 0; i < ix->cap; i++)
    if (ix->entries[i].loc != DYNEMB_LOC_EMPTY) {
      nonempty++;
      if (ref_find(r, ix->entries[i].key) < 0) bad++;
    }
  if (ix->cap_f > 0 && nonempty != ix->count) bad++;
  return bad;
}

static void random_ops(uint64_t (*h)(int64_t), int64_t key_range, int ops) {
  static ref r;
  r.n = 0;
  dynemb_index ix;
  dynemb_index_init(&ix, 0.3);
  ix.hash = h;
  int bad = 0;
  for (int op = 0; op < ops; op++) {
    int64_t k = (int64_t)(rnd() % (uint64_t)key_range) - key_range / 2;
    if (rnd() % 8 == 0) k = (int64_t)rnd(); /* any 64-bit value */
    int ri = ref_find(&r, k);
    dynemb_index_entry *e = dynemb_index_find(&ix, k, h(k));
    if ((ri >= 0) != (e != NULL)) bad++;
    if (ri >= 0 && e && e->loc != r.loc[ri]) bad++;
    if (rnd() % 3 && ri < 0 && r.n < 4000) { /* insert */
      uint32_t loc = (uint32_t)(rnd() % DYNEMB_LOC_EMPTY);
      CHECK_OK(dynemb_index_reserve(&ix, ix.count + 1));
      dynemb_index_insert(&ix, k, h(k), loc, 7);
      r.key[r.n] = k;
      r.loc[r.n++] = loc;
    } else if (ri >= 0) { /* erase */
      dynemb_index_erase_at(&ix, (uint64_t)(e - ix.entries));
      r.key[ri] = r.key[r.n - 1];
      r.loc[ri] = r.loc[r.n - 1];
      r.n--;
    }
    if (op % 97 == 0) bad += same(&ix, &r);
    if ((double)ix.count > (double)ix.cap * DYNEMB_INDEX_MAX_LOAD) bad++;
  }
  bad += same(&ix, &r);
  CHECK(bad == 0);
  dynemb_index_free(&ix);
}

static void test_random_real_hash(void) { random_ops(dynemb_hash_key, 3000, 20000); }
static void test_random_one_bucket(void) { random_ops(hash_zero, 800, 6000); }
static void test_random_wrapping(void) { random_ops(hash_top, 800, 6000); }
static void test_random_four_buckets(void) { random_ops(hash_four, 1200, 8000); }

static void test_extreme_keys(void) {
  dynemb_index ix;
  dynemb_index_init(&ix, 0);
  int64_t keys[6] = {0, -1, INT64_MIN, INT64_MAX, 1, INT64_MIN + 1};
  for (int round = 0; round < 2; round++) { /* second round with one bucket */
    if (round) ix.hash = hash_zero;
    for (int i = 0; i < 6; i++) CHECK(dynemb_index_find(&ix, keys[i], ix.hash(keys[i])) == NULL);
    for (int i = 0; i < 6; i++) {
      CHECK_OK(dynemb_index_reserve(&ix, ix.count + 1));
      dynemb_index_insert(&ix, keys[i], ix.hash(keys[i]), (uint32_t)i, (uint32_t)i);
    }
    for (int i = 0; i < 6; i++) {
      dynemb_index_entry *e = dynemb_index_find(&ix, keys[i], ix.hash(keys[i]));
      CHECK(e && e->loc == (uint32_t)i && e->last_access == (uint32_t)i && e->key == keys[i]);
    }
    /* the largest location that is not the empty marker is storable */
    dynemb_index_entry *e = dynemb_index_find(&ix, -1, ix.hash(-1));
    e->loc = DYNEMB_LOC_EMPTY - 1;
    CHECK(dynemb_index_find(&ix, -1, ix.hash(-1)) == e);
    dynemb_index_reset(&ix);
    CHECK(ix.count == 0 && dynemb_index_bytes(&ix) == 0);
  }
  dynemb_index_free(&ix);
}

static void test_growth_and_load(void) {
  dynemb_index a, b;
  dynemb_index_init(&a, 0.0);
  dynemb_index_init(&b, 0.5);
  CHECK(dynemb_index_bytes(&a) == 0);
  CHECK(dynemb_index_find(&a, 5, dynemb_hash_key(5)) == NULL); /* unallocated */
  double min_load = 1;
  for (int64_t k = 0; k < 200000; k++) {
    CHECK_OK(dynemb_index_reserve(&a, a.count + 1));
    dynemb_index_insert(&a, k, dynemb_hash_key(k), (uint32_t)k, 0);
    if (k > 1000) {
      double load = (double)a.count / (double)a.cap;
      if (load < min_load) min_load = load;
    }
  }
  /* load stays in (MAX_LOAD / GROWTH, MAX_LOAD] */
  CHECK(min_load > DYNEMB_INDEX_MAX_LOAD / DYNEMB_INDEX_GROWTH - 0.01);
  CHECK((double)a.count <= (double)a.cap * DYNEMB_INDEX_MAX_LOAD);
  CHECK(dynemb_index_bytes(&a) == a.cap * 16);
  CHECK(sizeof(dynemb_index_entry) == 16);
  /* staggered shards grow at other sizes */
  CHECK_OK(dynemb_index_reserve(&b, 1));
  CHECK_OK(dynemb_index_reserve(&a, 1));
  dynemb_index c;
  dynemb_index_init(&c, 0.0);
  CHECK_OK(dynemb_index_reserve(&c, 1));
  CHECK(b.cap != c.cap || b.cap_f != c.cap_f);
  /* a big reserve jumps directly */
  CHECK_OK(dynemb_index_reserve(&c, 100000));
  CHECK(c.limit >= 100000 && c.cap < 100000 / DYNEMB_INDEX_MAX_LOAD * DYNEMB_INDEX_GROWTH + 2);
  for (int64_t k = 0; k < 200000; k += 1000) {
    dynemb_index_entry *e = dynemb_index_find(&a, k, dynemb_hash_key(k));
    CHECK(e && e->loc == (uint32_t)k);
  }
  /* clear_keep keeps memory */
  uint64_t cap = a.cap;
  dynemb_index_clear_keep(&a);
  CHECK(a.count == 0 && a.cap == cap && dynemb_index_find(&a, 5, dynemb_hash_key(5)) == NULL);
  dynemb_index_free(&a);
  dynemb_index_free(&b);
  dynemb_index_free(&c);
}

static void test_loc_encoding(void) {
  uint32_t loc = DYNEMB_LOC(DYNEMB_TIER_HOST, 12345);
  CHECK(DYNEMB_LOC_TIER(loc) == 0 && DYNEMB_LOC_NUM(loc) == 12345);
  loc = DYNEMB_LOC(2, (1u << 30) - 1);
  CHECK(DYNEMB_LOC_TIER(loc) == 2 && DYNEMB_LOC_NUM(loc) == (1u << 30) - 1);
  CHECK(loc != DYNEMB_LOC_EMPTY);
}

/* Growth into an array made ahead (outside the lock): taken when it was
 * made for the capacity needed (or a later step), ignored (left to the
 * caller) otherwise; the result is the same index either way. */
static void test_growth_into_spare(void) {
  dynemb_index a, b;
  dynemb_index_init(&a, 0.25);
  dynemb_index_init(&b, 0.25);
  CHECK(dynemb_index_growth_for(&a, 0) == 0);
  int used = 0, ignored = 0;
  for (int64_t k = 0; k < 50000; k++) {
    uint64_t h = dynemb_hash_key(k);
    double cf = dynemb_index_growth_for(&a, a.count + 3); /* a batch of 3 */
    dynemb_index_spare sp = {NULL, 0, NULL};
    CHECK_OK(dynemb_index_spare_make(cf, &sp));
    CHECK((cf > 0) == (sp.entries != NULL));
    dynemb_index_entry *before = a.entries;
    double cap_before = a.cap_f;
    CHECK_OK(dynemb_index_reserve_spare(&a, a.count + 1, &sp));
    if (cf > 0 && sp.entries == NULL) {
      used++;
      CHECK(a.cap_f == cf && a.entries != before);
    } else if (cf > 0 && a.entries == before) {
      ignored++; /* made for count + 3: not needed yet for count + 1 */
    }
    /* a replaced array is handed back to be freed after the lock (ASan
     * finds it leaked or freed twice otherwise) */
    CHECK(sp.retired == (a.entries != before && cap_before > 0 ? before : NULL));
    dynemb_index_spare_free(&sp);
    CHECK(sp.entries == NULL && sp.retired == NULL);
    dynemb_index_insert(&a, k, h, (uint32_t)k, 1);
    CHECK_OK(dynemb_index_reserve(&b, b.count + 1));
    dynemb_index_insert(&b, k, h, (uint32_t)k, 1);
  }
  CHECK(used > 10 && ignored > 10);
  CHECK(a.cap == b.cap && a.count == b.count);
  for (int64_t k = 0; k < 50000; k += 7) {
    dynemb_index_entry *e = dynemb_index_find(&a, k, dynemb_hash_key(k));
    CHECK(e && e->loc == (uint32_t)k);
  }
  CHECK(memcmp(a.entries, b.entries, a.cap * sizeof *a.entries) == 0);
  /* a spare for a capacity off the growth ladder is not taken */
  dynemb_index_spare odd = {NULL, 0, NULL};
  CHECK_OK(dynemb_index_spare_make(a.cap_f * 3, &odd));
  CHECK_OK(dynemb_index_reserve_spare(&a, a.limit + 1, &odd));
  CHECK(odd.entries != NULL && a.cap_f != odd.cap_f);
  dynemb_index_spare_free(&odd);
  /* one made two steps ahead (a batch spanning two steps, or room for
   * another thread's inserts) is, and the index keeps every entry */
  double two = dynemb_index_growth_for(&a, (uint64_t)((double)a.limit * 1.3));
  CHECK(two > a.cap_f * DYNEMB_INDEX_GROWTH);
  dynemb_index_spare ahead = {NULL, 0, NULL};
  CHECK_OK(dynemb_index_spare_make(two, &ahead));
  CHECK_OK(dynemb_index_reserve_spare(&a, a.limit + 1, &ahead));
  CHECK(ahead.entries == NULL && a.cap_f == two && ahead.retired != NULL);
  dynemb_index_spare_free(&ahead);
  for (int64_t k = 0; k < 50000; k += 7) {
    dynemb_index_entry *e = dynemb_index_find(&a, k, dynemb_hash_key(k));
    CHECK(e && e->loc == (uint32_t)k);
  }
  CHECK(a.count == 50000);
  dynemb_index_free(&a);
  dynemb_index_free(&b);
}

int main(void) {
  RUN(test_random_real_hash);
  RUN(test_random_one_bucket);
  RUN(test_random_wrapping);
  RUN(test_random_four_buckets);
  RUN(test_extreme_keys);
  RUN(test_growth_and_load);
  RUN(test_growth_into_spare);
  RUN(test_loc_encoding);
  return check_summary();
}
