/*
 * table_int.h -- what the table's own files share (internal to them; other
 * modules use table.h).
 *
 * A table is split into lock shards by the top bits of the key hash (equal
 * to dynemb_key_shard(key, nshards)); each shard has its own rwlock, a key
 * index (index.h), an admission-candidate index and a row arena (arena.h),
 * so lookups and applies on different shards never contend and a rehash
 * stalls one shard only.
 *
 * The table's files, in the order a batch meets them:
 *   table.c     configuration, life cycle, run-time settings, statistics
 *   lookup.c    lookup and prepare (admission counting, inserts, tickets),
 *               prepared reads
 *   tier.c      rows entering memory: inserts, and the memory-over-SSD
 *               policy (demote, promote, make room)
 *   apply.c     gradients: dedupe, sums, non-finite checks, optimizer call
 *   evict.c     eviction and clear
 *   snapshot.c  snapshots, streamed readers and import
 * ticket.h holds the admission-ticket contract between prepare, the
 * prepared read and the prepared apply.
 *
 * Row location and layout live here and nowhere else. A key's index entry
 * holds its row's location (index.h: tier and number); a row is
 * row_floats = dim * (1 + slots) floats: the `dim` embedding floats, then
 * the optimizer's `slots` slot vectors of `dim` floats each (optim.h). In
 * memory the two parts live in parallel arena chunks under the same row
 * number, so that lookups read embeddings only; the SSD tier's records,
 * snapshots and imports use the joined layout.
 *
 * Concurrency: every path that holds several shard locks takes them in
 * ascending shard order (the locks prefer writers), so there is no
 * deadlock. Run-time settings and counters use relaxed atomics.
 */
#ifndef DYNEMB_TABLE_INT_H
#define DYNEMB_TABLE_INT_H

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "arena.h"
#include "dynemb.h"
#include "index.h"
#include "ssd.h"
#include "table.h"

#define RELAXED __ATOMIC_RELAXED
#define LOAD(p) __atomic_load_n((p), RELAXED)
#define STORE(p, v) __atomic_store_n((p), (v), RELAXED)
#define ADD(p, v) __atomic_fetch_add((p), (v), RELAXED)

/* Software prefetch distances shared by lookup and apply. */
#define IDX_PF 12 /* keys ahead for index prefetch */
#define ROW_PF 4  /* keys ahead for row prefetch */

typedef struct dynemb_shard {
  pthread_rwlock_t lock;
  dynemb_index rows;  /* key -> DYNEMB_LOC(tier, number), last access */
  dynemb_index cands; /* key -> occurrence count (in loc), last access */
  dynemb_arena arena;
  /* Bumped (under the write lock) whenever rows of the shard may have left
   * their places: eviction that removed rows, a move to the SSD tier,
   * clear, import. A ticket (ticket.h) names a row's place while it
   * carries the current value. */
  uint32_t gen;
  /* SSD tier only (tier.c): the key of each row number in host memory and
   * the row numbers in use as a dense list (host_list[0 .. host_count),
   * host_pos[row] its place there or NO_HOST_POS), so that a move out
   * samples rows in memory directly, and the sampler's random state. */
  int64_t *row_key;
  uint32_t *host_pos;
  uint32_t *host_list;
  uint64_t host_count;
  uint64_t host_cap;
  uint64_t rng;
  uint64_t hand; /* where the next scan of the index for such rows starts */
} __attribute__((aligned(64))) dynemb_shard;

struct dynemb_table {
  dynemb_table_link link;  /* registry.c's; first member (table.h) */
  char *name;
  dynemb_table_config cfg; /* pointers point into this table */
  float *default_value;    /* [dim], never NULL */
  char *ssd_data_path;     /* copy or NULL */
  char *host_budget_name;  /* copy; never NULL */
  int dim;
  int slots;      /* optimizer slot vectors per row, in units of dim */
  int row_floats; /* dim * (1 + slots) */
  uint32_t nshards;
  uint32_t shard_bits; /* nshards = 1 << shard_bits */
  dynemb_shard *shards;
  dynemb_slab_pool pool;      /* embedding chunk memory of every shard */
  dynemb_slab_pool slot_pool; /* optimizer slot chunk memory (if slots) */
  dynemb_ssd ssd;             /* the SSD tier (off unless configured) */
  /* What the last incremental-checkpoint save left for the next one to
   * compare with: state of ckpt_delta.c, which sets both fields (under its
   * lock) and gives the function that frees it, called when the table is
   * destroyed. A release function rather than a call into ckpt_delta.c:
   * checkpoints are built on the table, and a table that named their
   * function would depend on them back (a circle); and rather than a lower
   * module owning the memory, since only the delta room knows what the
   * state holds and it changes with the delta format. */
  void *ckpt_track;
  void (*ckpt_track_release)(void *state);

  /* Run-time settings and counters: relaxed __atomic accesses. */
  uint32_t access_threshold;
  uint32_t counting_stopped; /* dynemb_table_set_admission_counting(t, 0) */
  int64_t eviction_threshold;
  uint64_t apply_steps;
  uint32_t clock; /* latest `now` of train lookups / imported rows */
  uint64_t rows_total; /* rows in host memory, kept only when host budget != 0 */
  uint64_t n_lookups, n_hits, n_inserted, n_rejected, n_evicted,
      n_evicted_cands, n_applied, n_dropped, n_nonfinite, n_ssd_lookups;
};

static inline uint32_t dynemb_table_shard_of(const dynemb_table *t,
                                             uint64_t h) {
  return t->shard_bits ? (uint32_t)(h >> (64 - t->shard_bits)) : 0;
}

/* ------------------------------------------------------------------------ */
/* Row location and layout                                                   */
/* ------------------------------------------------------------------------ */

static inline int on_host(uint32_t loc) {
  return DYNEMB_LOC_TIER(loc) == DYNEMB_TIER_HOST;
}

/* The embedding of the row at `loc` (in host memory). */
static inline float *row_of(const dynemb_shard *sh, uint32_t loc) {
  return dynemb_arena_row(&sh->arena, DYNEMB_LOC_NUM(loc));
}

/* The optimizer slots of the row at `loc` (tables with slots only). */
static inline float *slots_of(const dynemb_shard *sh, uint32_t loc) {
  return dynemb_arena_slots(&sh->arena, DYNEMB_LOC_NUM(loc));
}

/* Copies a row of `dim` floats, with fixed-size copies for common widths
 * (a libc call per row of a small table costs more than the copy). */
static inline void copy_row(float *restrict dst, const float *restrict src,
                            size_t dim) {
  switch (dim) {
  case 1: memcpy(dst, src, 1 * sizeof(float)); break;
  case 8: memcpy(dst, src, 8 * sizeof(float)); break;
  case 16: memcpy(dst, src, 16 * sizeof(float)); break;
  case 32: memcpy(dst, src, 32 * sizeof(float)); break;
  case 64: memcpy(dst, src, 64 * sizeof(float)); break;
  default: memcpy(dst, src, dim * sizeof(float)); break;
  }
}

/* Prefetches the cache lines of [p, p + bytes) (at most 1 KiB) into L2
 * (locality 2: prefetcht1 on x86), also for rows about to be written:
 * measured on an AMD EPYC VM (4M x 64, 2 threads), L2 prefetches sustain
 * ~1.8x the random row rate of prefetcht0/prefetchw, which fill L1 and are
 * limited by its few miss buffers (and gcc turns any write-intent
 * prefetch into prefetchw where the target has it). */
static inline void prefetch_lines(const void *p, size_t bytes) {
  uintptr_t a = (uintptr_t)p & ~(uintptr_t)63;
  const uintptr_t end = (uintptr_t)p + (bytes > 1024 ? 1024 : bytes);
  for (; a < end; a += 64) __builtin_prefetch((const void *)a, 0, 2);
}

/* Stamps a row's last access (readers hold only the read lock). */
static inline void stamp(dynemb_index_entry *e, uint32_t now) {
  if (LOAD(&e->last_access) < now) STORE(&e->last_access, now);
}

/* Raises the table clock to `now` (never lowers it). */
static inline void clock_advance(dynemb_table *t, uint32_t now) {
  uint32_t cur = LOAD(&t->clock);
  while (cur < now && !__atomic_compare_exchange_n(&t->clock, &cur, now, 1,
                                                   RELAXED, RELAXED)) {
  }
}

/* ------------------------------------------------------------------------ */
/* Shared by the table's files                                               */
/* ------------------------------------------------------------------------ */

/* table.c: the EINVAL of a public call `fn` given a NULL table; EINVAL
 * unless `now` is a valid time (dynemb.h, Conventions); every shard lock
 * in ascending order (`write`: write locks) and their release. */
int dynemb_table_null_error(const char *fn);
int dynemb_table_check_now(const dynemb_table *t, int64_t now);
void dynemb_table_lock_all(dynemb_table *t, int write);
void dynemb_table_unlock_all(dynemb_table *t);
/* table.c, with every shard write-locked: the table takes optimizer `opt`
 * (validated) and the row layout of its slots. Every row's storage is
 * dropped, so the caller makes sure no index entry points at a row (the
 * table holds none, or the caller clears them). Nothing changes if the
 * SSD tier's new file cannot be made (the one step that can fail). */
int dynemb_table_relayout_locked(dynemb_table *t, const dynemb_optimizer *opt);

/* tier.c, with the shard write-locked. insert_row: a fresh row for absent
 * `key`, growing the index into `spare` (may be NULL) if it was made for
 * that; with an SSD tier rows move there first to make room. Nothing
 * changes on failure but such moves. promote: brings entry `e`'s row from
 * the SSD tier into memory (nothing changes if reading fails).
 * insert_error: the message of an arena/index failure `rc` (ENOMEM or
 * ECAPACITY). */
int dynemb_tier_insert_row(dynemb_table *t, dynemb_shard *sh, int64_t key,
                           uint64_t h, uint32_t now, dynemb_index_spare *spare,
                           dynemb_index_entry **out);
int dynemb_tier_promote(dynemb_table *t, dynemb_shard *sh,
                        dynemb_index_entry *e);
int dynemb_tier_insert_error(const dynemb_table *t, int rc);
/* The SSD tier's list of rows in memory (dynemb_shard.row_key): room for
 * row numbers [0, n) (ENOMEM); row `row` now holds `key` (a no-op without
 * an SSD tier); row `row` left memory; no row is in memory. */
int dynemb_tier_host_reserve(dynemb_shard *sh, uint64_t n);
int dynemb_tier_host_taken(const dynemb_table *t, dynemb_shard *sh,
                           uint32_t row, int64_t key);
void dynemb_tier_host_freed(dynemb_shard *sh, uint32_t row);
void dynemb_tier_host_clear(dynemb_shard *sh);

#endif
