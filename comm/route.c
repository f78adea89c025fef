/*
 * route.c -- the route of a batch's keys to their owners (route.h).
 *
 * One pass with an open-addressing map from key to its first-seen number,
 * then a stable grouping by owner. The map is sized to the batch (at most
 * half full) and freed with it: batches are thousands to a few million ids.
 */
#include "route.h"

#include <stdlib.h>
#include <string.h>

#include "dynemb.h"

#define EMPTY UINT32_MAX

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

void dynemb_shard_route_free(dynemb_shard_route *r) {
  free(r->ukey);
  free(r->ucount);
  free(r->uowner);
  free(r->first);
  free(r->uniq_of);
  free(r->occ);
  memset(r, 0, sizeof *r);
}

int dynemb_shard_route_build(dynemb_shard_route *r, const int64_t *keys, size_t n,
                       int ranks) {
  memset(r, 0, sizeof *r);
  if (n >= UINT32_MAX / 2) return -1; /* (32-bit numbers and counts) */
  r->ranks = ranks;
  r->n = n;
  size_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  int64_t *mkey = malloc(cap * sizeof *mkey);
  uint32_t *mid = malloc(cap * sizeof *mid);
  uint32_t *seen = malloc((n ? n : 1) * sizeof *seen); /* first-seen no. */
  int64_t *skey = malloc((n ? n : 1) * sizeof *skey);  /* by first-seen */
  uint32_t *scount = calloc(n ? n : 1, sizeof *scount);
  r->ukey = malloc((n ? n : 1) * sizeof *r->ukey);
  r->ucount = malloc((n ? n : 1) * sizeof *r->ucount);
  r->uowner = malloc((n ? n : 1) * sizeof *r->uowner);
  r->first = calloc((size_t)ranks + 1, sizeof *r->first);
  r->uniq_of = malloc((n ? n : 1) * sizeof *r->uniq_of);
  r->occ = malloc((n ? n : 1) * sizeof *r->occ);
  size_t *fill = calloc((size_t)ranks, sizeof *fill);
  size_t *place = malloc((n ? n : 1) * sizeof *place);
  int ok = mkey && mid && seen && skey && scount && r->ukey && r->ucount &&
           r->uowner && r->first && r->uniq_of && r->occ && fill && place;
  if (ok) {
    for (size_t s = 0; s < cap; s++) mid[s] = EMPTY;
    size_t u = 0;
    for (size_t i = 0; i < n; i++) {
      size_t s = (size_t)mix((uint64_t)keys[i]) & (cap - 1);
      while (mid[s] != EMPTY && mkey[s] != keys[i]) s = (s + 1) & (cap - 1);
      if (mid[s] == EMPTY) {
        mid[s] = (uint32_t)u;
        mkey[s] = keys[i];
        skey[u++] = keys[i];
      }
      seen[i] = mid[s];
      r->occ[i] = scount[mid[s]]++;
    }
    r->n_unique = u;
    /* group by owner, each group in first-seen order */
    for (size_t j = 0; j < u; j++) {
      int o = (int)dynemb_key_shard(skey[j], (uint32_t)ranks);
      r->first[o + 1]++;
      r->uowner[j] = o; /* by first-seen number until regrouped below */
    }
    for (int o = 0; o < ranks; o++) r->first[o + 1] += r->first[o];
    for (size_t j = 0; j < u; j++) {
      int o = r->uowner[j];
      place[j] = r->first[o] + fill[o]++;
    }
    int *prov_owner = malloc((u ? u : 1) * sizeof *prov_owner);
    ok = prov_owner != NULL;
    if (ok) {
      memcpy(prov_owner, r->uowner, u * sizeof *prov_owner);
      for (size_t j = 0; j < u; j++) {
        r->ukey[place[j]] = skey[j];
        r->ucount[place[j]] = scount[j];
        r->uowner[place[j]] = prov_owner[j];
      }
      for (size_t i = 0; i < n; i++) r->uniq_of[i] = place[seen[i]];
    }
    free(prov_owner);
  }
  free(mkey);
  free(mid);
  free(seen);
  free(skey);
  free(scount);
  free(fill);
  free(place);
  if (!ok) {
    dynemb_shard_route_free(r);
    return -1;
  }
  return 0;
}
