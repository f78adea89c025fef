/*
 * ticket.h -- admission tickets: the contract between prepare, the
 * prepared read and the prepared apply (lookup.c, apply.c).
 *
 * dynemb_prepare does a train lookup's work on the table ahead of the step
 * and writes one ticket per key. A ticket is binding: it IS the admission
 * decision for that occurrence. DYNEMB_NOT_ADMITTED means the key had no
 * row when its batch was counted: the prepared read returns the default
 * value and the prepared apply drops its gradient, even if a later batch
 * has admitted the key since. Any other ticket means admitted, and also
 * says where the row was, so that the step can copy and update it without
 * probing the key index:
 *
 *   bits 63..44  the shard's generation when the ticket was made (low 20
 *                bits of dynemb_shard.gen)
 *   bits 43..32  the shard
 *   bits 31..0   the row's location (index.h), always in host memory for
 *                a place that can still be used
 *
 * The place is used while the shard's generation is unchanged (eviction,
 * a move to the SSD tier, clear and import bump it); otherwise the key is
 * looked up again. Either way the admission decision stands. A made-up
 * ticket never makes a call touch memory outside the table (the shard and
 * row number are bounds-checked), though it may name another key's row.
 */
#ifndef DYNEMB_TICKET_H
#define DYNEMB_TICKET_H

#include <stdint.h>

#include "table_int.h"

#define TICKET_GEN_MASK UINT32_C(0xfffff)

static inline dynemb_ticket make_ticket(const dynemb_shard *sh, uint32_t shard,
                                        uint32_t loc) {
  return ((uint64_t)(sh->gen & TICKET_GEN_MASK) << 44) |
         ((uint64_t)shard << 32) | loc;
}
#define TICKET_SHARD(k) ((uint32_t)((k) >> 32) & 0xfffu)
#define TICKET_LOC(k) ((uint32_t)(k))

/* The high half (generation and shard) of a ticket that shard `shard`
 * would make now. */
static inline uint32_t ticket_tag(const dynemb_shard *sh, uint32_t shard) {
  return (uint32_t)(make_ticket(sh, shard, 0) >> 32);
}

/* Whether ticket `k` names a row's place in host memory of a shard whose
 * current tag is `tag` and whose arena has `capacity` row numbers. */
static inline int ticket_place_current(dynemb_ticket k, uint32_t tag,
                                       uint64_t capacity) {
  return (uint32_t)(k >> 32) == tag &&
         DYNEMB_LOC_TIER(TICKET_LOC(k)) == DYNEMB_TIER_HOST &&
         DYNEMB_LOC_NUM(TICKET_LOC(k)) < capacity;
}

/* ticket_place_current for shard `sh` (locked) of the ticket. */
static inline int ticket_place_valid(const dynemb_shard *sh, dynemb_ticket k) {
  return ticket_place_current(k, ticket_tag(sh, TICKET_SHARD(k)),
                              sh->arena.capacity);
}

/* What a prepared read needs of a read-locked shard, copied once per call
 * into an array side by side rather than read from each shard's struct for
 * every key (a training batch touches every shard of a table, a few keys
 * each; prepared reads of bench/step_costs's batches: 8.0-8.5 -> 7.0-7.1
 * ns per id): a current ticket's tag, the arena's capacity, and the first
 * chunk, which holds all rows of small shards. */
typedef struct shard_view {
  uint32_t tag;
  uint32_t first_rows; /* rows of the first chunk (0: none yet) */
  uint64_t capacity;
  const float *first;  /* row stride: dim (the arena's emb_floats) */
} shard_view;

static inline void shard_view_of(const dynemb_shard *sh, uint32_t shard,
                                 shard_view *v) {
  v->tag = ticket_tag(sh, shard);
  v->capacity = sh->arena.capacity;
  v->first = sh->arena.nchunks ? sh->arena.chunks[0] : NULL;
  v->first_rows = sh->arena.nchunks ? UINT32_C(1) << sh->arena.first_shift : 0;
}

#endif
