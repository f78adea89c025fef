/*
 * evict.c -- feature eviction (rows and admission candidates not accessed
 * for eviction_threshold time units), removal of given keys (what an
 * incremental checkpoint records as gone since its base) and clear.
 *
 * Eviction scans each shard's index entries (16 bytes each, never the
 * rows) under that shard's write lock, one shard at a time, so lookups of
 * other shards go on. Freed row numbers are reused by later inserts, so a
 * shard that lost rows bumps its generation: tickets made before name
 * rows that may be gone (ticket.h).
 */
#include "table_int.h"

#include <stdlib.h>

#include "error.h"
#include "hash.h"

/* ------------------------------------------------------------------------ */
/* Eviction and clear                                                        */
/* ------------------------------------------------------------------------ */

static void release_row(dynemb_table *t, dynemb_shard *sh,
                        const dynemb_index_entry *e, uint64_t *on_host_removed);

/* Removes entries older than the threshold. For rows (`sh` set: the
 * shard whose rows `ix` indexes), frees their row numbers in host memory or
 * records of the SSD tier and counts the former in *on_host_removed. */
static uint64_t evict_index(dynemb_table *t, dynemb_index *ix,
                            dynemb_shard *sh, int64_t now,
                            int64_t threshold, uint64_t *on_host_removed) {
  uint64_t removed = 0;
  if (!ix->count) return 0;
  uint64_t i = 0;
  while (i < ix->cap) {
    dynemb_index_entry *e = ix->entries + i;
    if (e->loc != DYNEMB_LOC_EMPTY &&
        now - (int64_t)LOAD(&e->last_access) > threshold) {
      if (sh) release_row(t, sh, e, on_host_removed);
      /* backward shift may move an unvisited entry into i: look again */
      dynemb_index_erase_at(ix, i);
      removed++;
      if (!ix->count) break;
    } else {
      i++;
    }
  }
  return removed;
}

/* Removes what is older than `thr` (>= 0) at `now` (checked). */
static int evict_older(dynemb_table *t, int64_t now, int64_t thr,
                       size_t *evicted) {
  uint64_t rows = 0, cands = 0;
  for (uint32_t s = 0; s < t->nshards; s++) {
    dynemb_shard *sh = &t->shards[s];
    pthread_rwlock_wrlock(&sh->lock);
    uint64_t hr = 0;
    uint64_t r = evict_index(t, &sh->rows, sh, now, thr, &hr);
    if (r) sh->gen++; /* freed rows may be reused: tickets' places go stale */
    cands += evict_index(t, &sh->cands, NULL, now, thr, NULL);
    if (hr && t->cfg.host_vocabulary_size) ADD(&t->rows_total, (uint64_t)0 - hr);
    pthread_rwlock_unlock(&sh->lock);
    rows += r;
  }
  if (rows) ADD(&t->n_evicted, rows);
  if (cands) ADD(&t->n_evicted_cands, cands);
  if (evicted) *evicted = (size_t)rows;
  return DYNEMB_OK;
}

/* The checks both entry points share: `now` resolved and in range. */
static int evict_start(dynemb_table *t, int64_t *now, size_t *evicted,
                       const char *fn) {
  dynemb_error_clear();
  if (evicted) *evicted = 0;
  if (!t) return dynemb_table_null_error(fn);
  if (*now == DYNEMB_NOW_TABLE_CLOCK) *now = (int64_t)LOAD(&t->clock);
  return dynemb_table_check_now(t, *now);
}

int dynemb_evict(dynemb_table *t, int64_t now, int64_t threshold,
                 size_t *evicted) {
  int rc = evict_start(t, &now, evicted, "dynemb_evict");
  if (rc) return rc;
  if (threshold == DYNEMB_TABLE_THRESHOLD) { /* (the table's 0 is off) */
    int64_t thr = LOAD(&t->eviction_threshold);
    return thr > 0 ? evict_older(t, now, thr, evicted) : DYNEMB_OK;
  }
  if (threshold < 0)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': eviction threshold %lld is negative; "
                            "pass 0 or more, or DYNEMB_TABLE_THRESHOLD for "
                            "the table's",
                            t->name, (long long)threshold);
  return evict_older(t, now, threshold, evicted);
}

/* Frees the row (host memory or SSD record) of rows-index entry `e`. */
static void release_row(dynemb_table *t, dynemb_shard *sh,
                        const dynemb_index_entry *e, uint64_t *on_host_removed) {
  if (on_host(e->loc)) {
    dynemb_arena_release(&sh->arena, DYNEMB_LOC_NUM(e->loc));
    dynemb_tier_host_freed(sh, DYNEMB_LOC_NUM(e->loc));
    (*on_host_removed)++;
  } else {
    dynemb_ssd_release(&t->ssd, DYNEMB_LOC_NUM(e->loc));
  }
}

void dynemb_table_remove_keys(dynemb_table *t, const int64_t *rows,
                              size_t nrows, const int64_t *cands,
                              size_t ncands) {
  dynemb_table_lock_all(t, 1);
  uint64_t host_removed = 0;
  for (size_t i = 0; i < nrows; i++) {
    uint64_t h = dynemb_hash_key(rows[i]);
    dynemb_shard *sh = &t->shards[dynemb_table_shard_of(t, h)];
    dynemb_index_entry *e = dynemb_index_find(&sh->rows, rows[i], h);
    if (!e) continue;
    release_row(t, sh, e, &host_removed);
    dynemb_index_erase_at(&sh->rows, (uint64_t)(e - sh->rows.entries));
    sh->gen++;
  }
  for (size_t i = 0; i < ncands; i++) {
    uint64_t h = dynemb_hash_key(cands[i]);
    dynemb_shard *sh = &t->shards[dynemb_table_shard_of(t, h)];
    dynemb_index_entry *e = dynemb_index_find(&sh->cands, cands[i], h);
    if (e) dynemb_index_erase_at(&sh->cands, (uint64_t)(e - sh->cands.entries));
  }
  if (host_removed && t->cfg.host_vocabulary_size)
    ADD(&t->rows_total, (uint64_t)0 - host_removed);
  dynemb_table_unlock_all(t);
}

void dynemb_table_clear(dynemb_table *t) {
  if (!t) return;
  dynemb_table_lock_all(t, 1); /* the slab pool is shared: every shard must be idle */
  for (uint32_t s = 0; s < t->nshards; s++) {
    dynemb_shard *sh = &t->shards[s];
    dynemb_index_reset(&sh->rows);
    dynemb_index_reset(&sh->cands);
    dynemb_arena_free(&sh->arena);
    dynemb_tier_host_clear(sh);
    sh->gen++;
  }
  dynemb_slab_pool_release(&t->pool);
  dynemb_slab_pool_release(&t->slot_pool);
  dynemb_ssd_reset(&t->ssd);
  STORE(&t->rows_total, 0);
  dynemb_table_unlock_all(t);
}

