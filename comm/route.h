/*
 * route.h -- where a batch's keys go on several ranks.
 *
 * Each key goes to its owner (dynemb_key_shard). The sharded ops send each
 * owner the batch's *unique* keys, once each, with their occurrence counts,
 * and get one row back per unique key. So a route lists the unique keys
 * grouped by owner, each group in first-seen order, and for every
 * occurrence its unique key and which occurrence of that key it is (the
 * owner says how many of a key's occurrences came before its admission and
 * read the default value).
 *
 * Part of the shard room (shard.h): the lookup and the apply route their
 * batches with it. Plain C on the engine's public header only.
 */
#ifndef DYNEMB_SHARD_ROUTE_H
#define DYNEMB_SHARD_ROUTE_H

#include <stddef.h>
#include <stdint.h>

typedef struct dynemb_shard_route {
  int ranks;
  size_t n, n_unique;
  int64_t *ukey;    /* [n_unique]: owner r's at [first[r], first[r + 1]) */
  uint32_t *ucount; /* [n_unique]: occurrences in the batch */
  int *uowner;      /* [n_unique] */
  size_t *first;    /* [ranks + 1] */
  size_t *uniq_of;  /* [n]: occurrence i's unique key */
  uint32_t *occ;    /* [n]: 0 for a key's first occurrence, 1 for the next... */
} dynemb_shard_route;

/* Builds the route of keys[n] over `ranks` owners. 0, or -1 when out of
 * memory (`r` is then empty). */
int dynemb_shard_route_build(dynemb_shard_route *r, const int64_t *keys, size_t n, int ranks);

void dynemb_shard_route_free(dynemb_shard_route *r);

#endif
