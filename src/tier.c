/*
 * tier.c -- rows entering a shard's memory: inserts, and the policy that
 * keeps host memory a budgeted cache above the SSD tier (ssd.h).
 *
 * With an SSD tier, a row entering memory past host_vocabulary_size makes
 * another row of the same shard move to the SSD file: the least recently
 * accessed of a small sample of rows that the calling lookup did not
 * touch (sampling instead of an LRU list: no list to update on every
 * hit, and lookups only stamp a time). Train lookups bring rows back
 * (promote). Every function here runs with the shard's write lock held.
 */
#include "table_int.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "hash.h"
#include "init.h"
#include "optim.h"

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

static int budget_error(const dynemb_table *t) {
  return dynemb_error_set(
      DYNEMB_ECAPACITY,
      "table '%s': %s = %llu rows is full; raise %s or enable eviction "
      "(eviction_threshold and dynemb_evict)",
      t->name, t->host_budget_name,
      (unsigned long long)t->cfg.host_vocabulary_size, t->host_budget_name);
}

int dynemb_tier_insert_error(const dynemb_table *t, int rc) {
  if (rc == DYNEMB_ECAPACITY)
    return dynemb_error_set(DYNEMB_ECAPACITY,
                            "table '%s': a shard reached 2^30 rows; create "
                            "the table with more shards",
                            t->name);
  return dynemb_error_set(DYNEMB_ENOMEM,
                          "table '%s': out of memory while inserting rows; "
                          "lower the vocabulary (host_vocabulary_size, "
                          "eviction) or add memory",
                          t->name);
}

/* ------------------------------------------------------------------------ */
/* The SSD tier (ssd.h): host memory is a budgeted cache above it            */
/* ------------------------------------------------------------------------ */

#define VICTIM_SAMPLE 8 /* rows in memory compared for each one moved */
#define VICTIM_SCAN 128 /* index entries looked at for them first */
#define NO_HOST_POS UINT32_MAX

/* The keys and list of rows in memory (table_int.h, dynemb_shard.row_key)
 * of a table with an SSD tier: room for row numbers [0, n). */
int dynemb_tier_host_reserve(dynemb_shard *sh, uint64_t n) {
  if (n <= sh->host_cap) return DYNEMB_OK;
  uint64_t cap = sh->host_cap ? sh->host_cap : 64;
  while (cap < n) cap *= 2;
  int64_t *k = realloc(sh->row_key, cap * sizeof *k);
  if (!k) return DYNEMB_ENOMEM;
  sh->row_key = k;
  uint32_t *l = realloc(sh->host_list, cap * sizeof *l);
  if (!l) return DYNEMB_ENOMEM;
  sh->host_list = l;
  uint32_t *p = realloc(sh->host_pos, cap * sizeof *p);
  if (!p) return DYNEMB_ENOMEM;
  memset(p + sh->host_cap, 0xff, (cap - sh->host_cap) * sizeof *p);
  sh->host_pos = p;
  sh->host_cap = cap;
  return DYNEMB_OK;
}

/* Host rowno `rowno` of shard `sh` now holds `key` (tables with an SSD tier;
 * others keep no rowno keys). ENOMEM leaves nothing changed. */
int dynemb_tier_host_taken(const dynemb_table *t, dynemb_shard *sh, uint32_t rowno,
                      int64_t key) {
  if (!dynemb_ssd_on(&t->ssd)) return DYNEMB_OK;
  int rc = dynemb_tier_host_reserve(sh, (uint64_t)rowno + 1);
  if (rc) return rc;
  sh->row_key[rowno] = key;
  sh->host_pos[rowno] = (uint32_t)sh->host_count;
  sh->host_list[sh->host_count++] = rowno;
  return DYNEMB_OK;
}

void dynemb_tier_host_freed(dynemb_shard *sh, uint32_t rowno) {
  if (rowno >= sh->host_cap || sh->host_pos[rowno] == NO_HOST_POS) return;
  const uint32_t pos = sh->host_pos[rowno], last = sh->host_list[--sh->host_count];
  sh->host_list[pos] = last; /* the last one takes its place */
  sh->host_pos[last] = pos;
  sh->host_pos[rowno] = NO_HOST_POS;
}

/* No rowno of the shard holds a row in memory (clear, replace). */
void dynemb_tier_host_clear(dynemb_shard *sh) {
  if (sh->host_cap) memset(sh->host_pos, 0xff, sh->host_cap * sizeof *sh->host_pos);
  sh->host_count = 0;
}

static inline uint64_t shard_rand(dynemb_shard *sh) { /* xorshift64 */
  sh->rng ^= sh->rng << 13;
  sh->rng ^= sh->rng >> 7;
  sh->rng ^= sh->rng << 17;
  return sh->rng;
}

static int full_error(const dynemb_table *t) {
  return dynemb_error_set(
      DYNEMB_ECAPACITY,
      "table '%s': host_vocabulary_size = %llu plus ssd_vocabulary_size = "
      "%llu rows are full; raise ssd_vocabulary_size or enable eviction "
      "(eviction_threshold and dynemb_evict)",
      t->name, (unsigned long long)t->cfg.host_vocabulary_size,
      (unsigned long long)t->cfg.ssd_vocabulary_size);
}

/* Moves one row of shard `sh` (write-locked) from host memory to the SSD
 * tier: the least recently accessed of VICTIM_SAMPLE rows in memory, never
 * `keep` (may be NULL). Where rows in memory are at least an eighth of the
 * shard's rows, they are the ones met in the index after the shard's hand
 * (within VICTIM_SCAN entries: a few cache lines, read in order); the rest
 * of the sample is drawn at random from the list of rows in memory (and if
 * every draw met `keep`, the first other row of the list is taken).
 * *moved = 0 when the shard has no such row. Each move bumps the
 * shard's generation, so every ticket made before it names a stale place:
 * a ticket's place can never be a row number whose row has moved. The row goes to record *spare
 * when that is not NO_RECORD (then taken: set to NO_RECORD), else to a
 * new one. Errors: ECAPACITY (the SSD tier is full; no message), EIO. */
#define NO_RECORD UINT32_MAX
static dynemb_index_entry *host_entry(dynemb_shard *sh, uint32_t rowno) {
  const int64_t key = sh->row_key[rowno];
  return dynemb_index_find(&sh->rows, key, dynemb_hash_key(key));
}

static int demote_one(dynemb_table *t, dynemb_shard *sh,
                      const dynemb_index_entry *keep, uint32_t *spare,
                      int *moved) {
  *moved = 0;
  const uint64_t hosts = sh->host_count;
  if (!hosts) return DYNEMB_OK;
  dynemb_index_entry *best = NULL;
  int seen = 0;
  /* 1. dense: the index entries after the shard's hand */
  dynemb_index *ix = &sh->rows;
  if (hosts * 8 >= ix->count) {
    uint64_t i = sh->hand < ix->cap ? sh->hand : 0;
    for (uint64_t k = 0; k < VICTIM_SCAN && k < ix->cap && seen < VICTIM_SAMPLE;
         k++) {
      dynemb_index_entry *e = ix->entries + i;
      if (++i == ix->cap) i = 0;
      if (e->loc == DYNEMB_LOC_EMPTY || !on_host(e->loc) || e == keep) continue;
      seen++;
      if (!best || LOAD(&e->last_access) < LOAD(&best->last_access)) best = e;
    }
    sh->hand = i;
  }
  /* 2. random draws among the rows in memory */
  for (int k = seen; k < VICTIM_SAMPLE; k++) {
    dynemb_index_entry *e = host_entry(sh, sh->host_list[shard_rand(sh) % hosts]);
    if (!e || e == keep) continue;
    if (!best || LOAD(&e->last_access) < LOAD(&best->last_access)) best = e;
  }
  for (uint64_t k = 0; !best && k < hosts; k++) {
    dynemb_index_entry *e = host_entry(sh, sh->host_list[k]);
    if (e && e != keep) best = e;
  }
  if (!best) return DYNEMB_OK;
  uint32_t rec = *spare;
  int rc = rec != NO_RECORD ? DYNEMB_OK : dynemb_ssd_alloc(&t->ssd, &rec);
  if (rc) return rc;
  const uint32_t rowno = DYNEMB_LOC_NUM(best->loc);
  rc = dynemb_ssd_write(&t->ssd, rec, dynemb_arena_row(&sh->arena, rowno),
                        t->slots ? dynemb_arena_slots(&sh->arena, rowno) : NULL);
  if (rc) {
    if (*spare == NO_RECORD) dynemb_ssd_release(&t->ssd, rec);
    return rc;
  }
  *spare = NO_RECORD;
  sh->gen++;
  dynemb_arena_release(&sh->arena, rowno);
  dynemb_tier_host_freed(sh, rowno);
  best->loc = DYNEMB_LOC(DYNEMB_TIER_SSD, rec);
  ADD(&t->rows_total, (uint64_t)-1);
  *moved = 1;
  return DYNEMB_OK;
}

/* demote_one on another shard than `sh` (whose write lock the caller
 * holds): the first of the others, from the one after `sh`, whose write
 * lock is free right now (a try-lock, so two threads doing this cannot
 * deadlock) and that has a row in memory. */
static int demote_elsewhere(dynemb_table *t, const dynemb_shard *sh,
                            uint32_t *spare, int *moved) {
  *moved = 0;
  const uint32_t S = t->nshards, from = (uint32_t)(sh - t->shards);
  int rc = DYNEMB_OK;
  for (uint32_t k = 1; k < S && !*moved && !rc; k++) {
    dynemb_shard *o = &t->shards[(from + k) & (S - 1)];
    if (pthread_rwlock_trywrlock(&o->lock) != 0) continue;
    rc = demote_one(t, o, NULL, spare, moved);
    pthread_rwlock_unlock(&o->lock);
  }
  return rc;
}

/* When a row enters the host memory of shard `sh` (write-locked) of a
 * table with an SSD tier (`entering` = 1 before it is counted in
 * rows_total, 0 after) and memory is over its budget: moves up to two
 * rows (not `keep`) to SSD; two, so that memory over its budget comes back
 * to it. They come from `sh`, or when it has no other row in memory, from
 * another shard that is free (demote_elsewhere); if none is, memory exceeds
 * its budget until a later call moves rows. The first row moved goes to
 * record `spare` when that is not NO_RECORD (released if no row moves).
 * Errors: ECAPACITY (both tiers full; message set), EIO. */
static int make_room(dynemb_table *t, dynemb_shard *sh,
                     const dynemb_index_entry *keep, uint64_t entering,
                     uint32_t spare) {
  const uint64_t budget = t->cfg.host_vocabulary_size;
  int rc = DYNEMB_OK;
  for (int k = 0; k < 2 && LOAD(&t->rows_total) + entering > budget; k++) {
    int moved = 0;
    rc = demote_one(t, sh, keep, &spare, &moved);
    if (!rc && !moved) rc = demote_elsewhere(t, sh, &spare, &moved);
    if (rc == DYNEMB_ECAPACITY) rc = full_error(t);
    if (rc || !moved) break;
  }
  if (spare != NO_RECORD) dynemb_ssd_release(&t->ssd, spare);
  return rc;
}

/* Brings the row of entry `e` (on the SSD tier) of shard `sh`
 * (write-locked) into host memory, then makes room (make_room) for it:
 * the row moved out takes the record just read (no allocation, and its
 * lines are in cache). Nothing changes if reading fails. */
int dynemb_tier_promote(dynemb_table *t, dynemb_shard *sh,
                        dynemb_index_entry *e) {
  uint32_t rowno = 0;
  int rc = dynemb_arena_alloc(&sh->arena, &rowno);
  if (!rc && (rc = dynemb_tier_host_taken(t, sh, rowno, e->key)))
    dynemb_arena_release(&sh->arena, rowno);
  if (rc) return dynemb_tier_insert_error(t, rc);
  const uint32_t rec = DYNEMB_LOC_NUM(e->loc);
  rc = dynemb_ssd_read(&t->ssd, rec, dynemb_arena_row(&sh->arena, rowno),
                       t->slots ? dynemb_arena_slots(&sh->arena, rowno) : NULL);
  if (rc) {
    dynemb_arena_release(&sh->arena, rowno);
    dynemb_tier_host_freed(sh, rowno);
    return rc;
  }
  e->loc = DYNEMB_LOC(DYNEMB_TIER_HOST, rowno);
  ADD(&t->rows_total, 1);
  rc = make_room(t, sh, e, 0, rec);
  /* the row count did not grow: a full SSD tier (a second row to move
   * found no record) only leaves memory over its budget for now */
  return rc == DYNEMB_ECAPACITY ? DYNEMB_OK : rc;
}

/* Inserts a fresh row for absent `key` in shard `sh` (write-locked),
 * growing the index into `spare` (may be NULL) if it was made for that.
 * With an SSD tier, rows move there first (make_room). Nothing changes on
 * failure but such moves. */
int dynemb_tier_insert_row(dynemb_table *t, dynemb_shard *sh, int64_t key,
                      uint64_t h, uint32_t now, dynemb_index_spare *spare,
                      dynemb_index_entry **out) {
  /* rows_total is kept only for a budget (fixed at creation), so that
   * unbudgeted inserts on different shards share no cache line */
  uint64_t budget = t->cfg.host_vocabulary_size;
  if (dynemb_ssd_on(&t->ssd)) {
    int rc = make_room(t, sh, NULL, 1, NO_RECORD);
    if (rc) return rc;
    ADD(&t->rows_total, 1);
  } else if (budget && ADD(&t->rows_total, 1) >= budget) {
    ADD(&t->rows_total, (uint64_t)-1);
    return budget_error(t);
  }
  int rc = dynemb_index_reserve_spare(&sh->rows, sh->rows.count + 1, spare);
  uint32_t rowno = 0;
  if (!rc) rc = dynemb_arena_alloc(&sh->arena, &rowno);
  if (!rc && (rc = dynemb_tier_host_taken(t, sh, rowno, key)))
    dynemb_arena_release(&sh->arena, rowno);
  if (rc) {
    if (budget) ADD(&t->rows_total, (uint64_t)-1);
    return dynemb_tier_insert_error(t, rc);
  }
  float *row = dynemb_arena_row(&sh->arena, rowno);
  dynemb_init_row(&t->cfg.init, key, row, t->dim);
  if (t->slots)
    dynemb_optim_init_slots(&t->cfg.optimizer,
                            dynemb_arena_slots(&sh->arena, rowno), t->dim);
  *out = dynemb_index_insert(&sh->rows, key, h,
                             DYNEMB_LOC(DYNEMB_TIER_HOST, rowno), now);
  if (sh->cands.count) { /* a key is never both a row and a candidate */
    dynemb_index_entry *c = dynemb_index_find(&sh->cands, key, h);
    if (c) dynemb_index_erase_at(&sh->cands, (uint64_t)(c - sh->cands.entries));
  }
  return DYNEMB_OK;
}

