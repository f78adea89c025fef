/*
 * test_route.c -- the route of a batch's keys to their owners (comm/route.c,
 * the shard room), against a reference written here with
 * quadratic loops: every unique key once, grouped by owner
 * (dynemb_key_shard), each group in first-seen order, occurrence counts,
 * and for every occurrence its unique key and occurrence number. Batches:
 * empty, one key repeated, few distinct keys, mostly distinct, negative and
 * extreme keys; 1, 2, 3 and 7 ranks.
 */
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "dynemb.h"
#include "route.h"

static uint64_t rng_state = 12345;
static uint64_t next_rand(void) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return rng_state >> 17;
}

static void check_route(const int64_t *keys, size_t n, int ranks) {
  dynemb_shard_route r;
  CHECK(dynemb_shard_route_build(&r, keys, n, ranks) == 0);
  if (!r.first && n) return;
  CHECK(r.n == n && r.ranks == ranks && r.first[0] == 0 &&
        r.first[ranks] == r.n_unique);
  /* reference: distinct keys in first-seen order */
  int64_t *distinct = malloc((n ? n : 1) * sizeof *distinct);
  size_t nd = 0;
  for (size_t i = 0; i < n; i++) {
    size_t j = 0;
    while (j < nd && distinct[j] != keys[i]) j++;
    if (j == nd) distinct[nd++] = keys[i];
  }
  CHECK(r.n_unique == nd);
  /* grouped by owner, in first-seen order within a group */
  for (int o = 0; o < ranks; o++) {
    size_t g = r.first[o];
    for (size_t j = 0; j < nd; j++) {
      if ((int)dynemb_key_shard(distinct[j], (uint32_t)ranks) != o) continue;
      CHECK(g < r.first[o + 1] && r.ukey[g] == distinct[j] &&
            r.uowner[g] == o);
      size_t count = 0;
      for (size_t i = 0; i < n; i++) count += keys[i] == distinct[j];
      CHECK(r.ucount[g] == count);
      g++;
    }
    CHECK(g == r.first[o + 1]);
  }
  /* each occurrence: its unique key, and how many came before it */
  for (size_t i = 0; i < n; i++) {
    CHECK(r.uniq_of[i] < r.n_unique && r.ukey[r.uniq_of[i]] == keys[i]);
    uint32_t before = 0;
    for (size_t j = 0; j < i; j++) before += keys[j] == keys[i];
    CHECK(r.occ[i] == before);
  }
  free(distinct);
  dynemb_shard_route_free(&r);
}

static void test_route_matches_reference(void) {
  static const int ranks[] = {1, 2, 3, 7};
  static const size_t sizes[] = {0, 1, 2, 17, 300};
  static const int64_t spans[] = {1, 5, 1000000};
  int64_t *keys = malloc(300 * sizeof *keys);
  for (size_t ri = 0; ri < 4; ri++)
    for (size_t si = 0; si < 5; si++)
      for (size_t k = 0; k < 3; k++) {
        for (size_t i = 0; i < sizes[si]; i++)
          keys[i] = (int64_t)(next_rand() % (uint64_t)spans[k]) - spans[k] / 2;
        check_route(keys, sizes[si], ranks[ri]);
      }
  int64_t extreme[] = {INT64_MIN, INT64_MAX, 0, -1, INT64_MIN, 0};
  check_route(extreme, 6, 3);
  free(keys);
}

static void test_route_spreads_keys(void) {
  /* 30000 distinct keys on 3 ranks: each owner gets about a third */
  size_t n = 30000;
  int64_t *keys = malloc(n * sizeof *keys);
  for (size_t i = 0; i < n; i++) keys[i] = (int64_t)i;
  dynemb_shard_route r;
  CHECK(dynemb_shard_route_build(&r, keys, n, 3) == 0);
  for (int o = 0; o < 3; o++) {
    size_t got = r.first[o + 1] - r.first[o];
    CHECK(got > 9000 && got < 11000);
  }
  dynemb_shard_route_free(&r);
  free(keys);
}

int main(void) {
  RUN(test_route_matches_reference);
  RUN(test_route_spreads_keys);
  return check_summary();
}
