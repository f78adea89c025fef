/*
 * table.h -- the table object (internal): lock shards, each holding a key
 * index, an admission-candidate index and a row arena.
 *
 * A key's shard is the top bits of dynemb_hash_key(key) (equal to
 * dynemb_key_shard(key, nshards)); each shard has its own rwlock, so
 * lookups/applies on different shards never contend and a rehash stalls one
 * shard only. Row layout (known only by table.c): `dim` embedding floats,
 * then dynemb_optim_slot_count(kind) * dim optimizer slot floats, the two
 * parts stored in parallel arena chunks (arena.h).
 *
 * Lifetime: registry.c owns the name -> table map and the reference count;
 * it calls dynemb_table_new / dynemb_table_destroy.
 */
#ifndef DYNEMB_TABLE_H
#define DYNEMB_TABLE_H

#include <pthread.h>
#include <stdint.h>

#include "arena.h"
#include "dynemb.h"
#include "index.h"
#include "ssd.h"

typedef struct dynemb_shard {
  pthread_rwlock_t lock;
  dynemb_index rows;  /* key -> DYNEMB_LOC(tier, slot), last access */
  dynemb_index cands; /* key -> occurrence count (in loc), last access */
  dynemb_arena arena;
  /* Bumped (under the write lock) whenever rows of the shard may have left
   * their slots: eviction that removed rows, clear, import. A row hint
   * (dynemb_prepare_hints) is valid while it carries the current value. */
  uint32_t gen;
  /* SSD tier only: the key of each slot in host memory and the slots in
   * use as a dense list (host_list[0 .. host_count), host_pos[slot] its
   * place there or NO_HOST_POS), so that a move out samples rows in memory
   * directly, and the sampler's random state. */
  int64_t *slot_key;
  uint32_t *host_pos;
  uint32_t *host_list;
  uint64_t host_count;
  uint64_t slot_cap;
  uint64_t rng;
  uint64_t hand; /* where the next scan of the index for such rows starts */
} __attribute__((aligned(64))) dynemb_shard;

struct dynemb_table {
  char *name;
  dynemb_table_config cfg; /* pointers point into this table */
  float *default_value;    /* [dim], never NULL */
  char *ssd_data_path;     /* copy or NULL */
  int dim;
  int slots;      /* optimizer slots, in units of dim */
  int row_floats; /* dim * (1 + slots) */
  uint32_t nshards;
  uint32_t shard_bits; /* nshards = 1 << shard_bits */
  dynemb_shard *shards;
  dynemb_slab_pool pool;      /* embedding chunk memory of every shard */
  dynemb_slab_pool slot_pool; /* optimizer slot chunk memory (if slots) */
  dynemb_ssd ssd;             /* the SSD tier (off unless configured) */

  /* Run-time settings and counters: relaxed __atomic accesses. */
  uint32_t access_threshold;
  int64_t eviction_threshold;
  uint64_t apply_steps;
  uint32_t clock; /* latest `now` of train lookups / imported rows */
  uint64_t rows_total; /* rows in host memory, kept only when host budget != 0 */
  uint64_t n_lookups, n_hits, n_inserted, n_rejected, n_evicted,
      n_evicted_cands, n_applied, n_dropped, n_nonfinite, n_ssd_lookups;

  /* Registry bookkeeping (registry.c). */
  int refs;       /* atomic */
  int registered; /* under the registry mutex */
};

/* Validates `cfg` (every field; the message names the table and the fix)
 * and builds an unregistered table with refs = 1. */
int dynemb_table_new(const dynemb_table_config *cfg, dynemb_table **out);
void dynemb_table_destroy(dynemb_table *t);

/* A snapshot whose rows are read on demand (checkpoints of tables larger
 * than memory): open fills everything of `snap` but the values (NULL) and
 * keeps every shard's read lock (lookups go on; inserts, applies, evictions
 * wait) until close. reader_rows copies rows [first, first + n) of the
 * snapshot's key order, row_floats floats each, from memory or the SSD
 * tier (EIO). dynemb_table_snapshot is open + reader_rows of all + close. */
typedef struct dynemb_table_reader dynemb_table_reader;
int dynemb_table_snapshot_open(dynemb_table *t, dynemb_snapshot *snap,
                               dynemb_table_reader **rd);
int dynemb_table_reader_rows(const dynemb_table_reader *rd, size_t first,
                             size_t n, float *out);
void dynemb_table_snapshot_close(dynemb_table_reader *rd);
static inline int dynemb_table_has_ssd(const dynemb_table *t) {
  return dynemb_ssd_on(&t->ssd);
}

static inline uint32_t dynemb_table_shard_of(const dynemb_table *t,
                                             uint64_t h) {
  return t->shard_bits ? (uint32_t)(h >> (64 - t->shard_bits)) : 0;
}

#endif
