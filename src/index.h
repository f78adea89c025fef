/*
 * index.h -- open-addressing hash index: 64-bit key -> 32-bit location.
 *
 * One index per lock shard maps keys to row locations; a second one per
 * shard counts admission candidates. An entry is 16 bytes
 * {key, loc, last_access}, so a probe costs one cache miss and eviction
 * scans the entries only, never the rows.
 *
 * Location (`loc`) encoding:
 *   bits 31..30  storage tier: 0 = host DRAM arena (the only tier in this
 *                version; 1 = SSD, 2 = device are reserved for later),
 *   bits 29..0   the row's number: in the shard's arena (host), or its
 *                record in the SSD tier's file.
 * loc == DYNEMB_LOC_EMPTY (all ones) marks an empty entry: every int64 key
 * value (0, -1, INT64_MIN, INT64_MAX ...) is a valid key, so emptiness can
 * not be encoded in the key. Number 2^30-1 of tier 3 is therefore never used.
 * The candidate index stores the occurrence count in `loc` instead
 * (saturating at DYNEMB_LOC_EMPTY - 1).
 *
 * Linear probing with backward-shift deletion (no tombstones, so probe
 * chains never degrade). The home bucket is fastrange over the LOW 32 bits
 * of the key hash, ((h & 0xffffffff) * cap) >> 32: capacity need not be a
 * power of two, so the index grows by DYNEMB_INDEX_GROWTH and keeps a high
 * load factor. (The high hash bits choose the lock shard, so they are
 * constant within one shard and must not pick the bucket.)
 *
 * The caller passes the key hash to find/insert so it is computed once per
 * key per batch; rehash and erase recompute it with ix->hash (default
 * dynemb_hash_key). Tests may install another function, e.g. one returning
 * 0 for every key to force all keys into the same bucket.
 *
 * Not thread-safe: the table's shard lock protects an index. Only
 * `last_access` of a found entry may be written concurrently (with relaxed
 * atomics) by readers holding the shard's read lock.
 */
#ifndef DYNEMB_INDEX_H
#define DYNEMB_INDEX_H

#include <stddef.h>
#include <stdint.h>

#define DYNEMB_LOC_EMPTY UINT32_MAX
#define DYNEMB_LOC_TIER_SHIFT 30
#define DYNEMB_LOC_NUM_MASK ((UINT32_C(1) << DYNEMB_LOC_TIER_SHIFT) - 1)
#define DYNEMB_TIER_HOST 0u
#define DYNEMB_TIER_SSD 1u
#define DYNEMB_LOC(tier, num) \
  (((uint32_t)(tier) << DYNEMB_LOC_TIER_SHIFT) | (uint32_t)(num))
#define DYNEMB_LOC_TIER(loc) ((uint32_t)(loc) >> DYNEMB_LOC_TIER_SHIFT)
#define DYNEMB_LOC_NUM(loc) ((uint32_t)(loc) & DYNEMB_LOC_NUM_MASK)

/* Grow when count would exceed cap * MAX_LOAD; new cap = cap * GROWTH. */
#define DYNEMB_INDEX_MAX_LOAD 0.85
#define DYNEMB_INDEX_GROWTH 1.2

typedef struct dynemb_index_entry {
  int64_t key;
  uint32_t loc;         /* DYNEMB_LOC_EMPTY = empty entry */
  uint32_t last_access; /* caller's clock; see dynemb.h "now" */
} dynemb_index_entry;

typedef struct dynemb_index {
  dynemb_index_entry *entries; /* [cap]; a shared empty entry while cap_f==0 */
  uint64_t cap;                /* entries */
  uint64_t count;            /* non-empty entries */
  uint64_t limit;            /* grow before count exceeds this */
  double cap_f;              /* exact (unrounded) capacity, 0 = unallocated */
  double first_cap;          /* capacity of the first allocation */
  uint64_t (*hash)(int64_t key); /* must match the h given to find/insert */
} dynemb_index;

/* An empty index that allocates nothing until the first insert. `stagger`
 * in [0, 1) scales the first capacity by GROWTH^stagger: shards with
 * different staggers grow at different moments, so that uniformly hashed
 * shards never all rehash in the same batch. */
void dynemb_index_init(dynemb_index *ix, double stagger);
void dynemb_index_free(dynemb_index *ix);
/* Drops every entry and the memory (back to the state after init). */
void dynemb_index_reset(dynemb_index *ix);
/* Marks every entry empty, keeping the memory (and reservations). */
void dynemb_index_clear_keep(dynemb_index *ix);

static inline uint64_t dynemb_index_home(const dynemb_index *ix, uint64_t h) {
  return ((uint64_t)(uint32_t)h * ix->cap) >> 32;
}

static inline void dynemb_index_prefetch(const dynemb_index *ix, uint64_t h) {
  const dynemb_index_entry *e = ix->entries + dynemb_index_home(ix, h);
  /* into L2 (see prefetch_lines in table.c), and always the next line
   * too: probe chains run ~2-4 entries. Measured (4M x 64, 2 threads):
   * prefetching the second line only when the home entry is in the second
   * half of its line, or a third line as well, halved the lookup rate. */
  __builtin_prefetch(e, 0, 2);
  __builtin_prefetch(e + 4, 0, 2);
}

/* Entry of `key`, or NULL. */
static inline dynemb_index_entry *dynemb_index_find(const dynemb_index *ix,
                                                    int64_t key, uint64_t h) {
  uint64_t i = dynemb_index_home(ix, h);
  for (;;) {
    dynemb_index_entry *e = ix->entries + i;
    if (e->loc == DYNEMB_LOC_EMPTY) return NULL;
    if (e->key == key) return e;
    if (++i == ix->cap) i = 0;
  }
}

/* Makes room for `count` entries in total (rehashing if needed), so that
 * the next inserts up to that count cannot fail. Returns DYNEMB_OK or
 * DYNEMB_ENOMEM (the index is unchanged then). */
int dynemb_index_reserve(dynemb_index *ix, uint64_t count);

/* Growth prepared outside the lock that protects an index: the kernel
 * faulting in and the filling of a new entry array (~2 ms for 4 MB on the
 * VM measured) then happen before the lock is taken, and only the rehash
 * itself runs under it. The array the index grew out of is handed back in
 * `retired`, to be freed after the lock is released: freeing a large array
 * unmaps it, which waits for the process's mmap lock, and that waits for
 * any page-fault work in flight in other threads (a huge-page populate of
 * a few to ~15 ms on a VM backing fresh memory). */
typedef struct dynemb_index_spare {
  dynemb_index_entry *entries; /* empty entries, or NULL */
  double cap_f;                /* the exact capacity they were made for */
  dynemb_index_entry *retired; /* the replaced array (free it), or NULL */
} dynemb_index_spare;

/* The exact capacity dynemb_index_reserve(ix, count) would grow to: 0 when
 * no growth is needed, -1 when it cannot grow that far. */
double dynemb_index_growth_for(const dynemb_index *ix, uint64_t count);
/* Allocates an empty entry array for capacity cap_f (> 0; nothing for
 * cap_f <= 0). Returns DYNEMB_OK or DYNEMB_ENOMEM. */
int dynemb_index_spare_make(double cap_f, dynemb_index_spare *sp);
void dynemb_index_spare_free(dynemb_index_spare *sp);
/* dynemb_index_reserve, taking the array from `sp` (may be NULL) when it
 * was made for the capacity needed now or a later step of its growth (then
 * sp->entries becomes NULL and the index takes that capacity); with `sp`,
 * the replaced array goes to sp->retired (dynemb_index_spare_free frees
 * both). */
int dynemb_index_reserve_spare(dynemb_index *ix, uint64_t count,
                               dynemb_index_spare *sp);

/* Inserts `key` (which must be absent) with room already reserved
 * (count < limit). Returns the new entry. */
dynemb_index_entry *dynemb_index_insert(dynemb_index *ix, int64_t key,
                                        uint64_t h, uint32_t loc,
                                        uint32_t last_access);

/* Removes the entry at position `pos` (entry pointer minus ix->entries) by
 * backward shift: later entries of the same probe chain move back, so the
 * entry at `pos` afterwards may be a different (not yet visited) key. */
void dynemb_index_erase_at(dynemb_index *ix, uint64_t pos);

/* Bytes of memory held. */
size_t dynemb_index_bytes(const dynemb_index *ix);

#endif
