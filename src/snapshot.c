/*
 * snapshot.c -- a table's contents out and in: consistent snapshots
 * (every shard's read lock held, rows sorted by key), streamed readers for
 * checkpoints of tables larger than memory, and import (checkpoint
 * restore, warm start, re-sharding across workers), which checks and
 * reserves everything before it changes anything. An import that adopts
 * the snapshot's optimizer layout (a table no optimizer trains yet, read
 * by an inference graph) drops the table's rows before it reserves, since
 * the old rows cannot live in the new layout.
 */
#include "table_int.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "hash.h"
#include "optim.h"

/* ------------------------------------------------------------------------ */
/* Sorting (snapshot order, import dedupe)                                   */
/* ------------------------------------------------------------------------ */

typedef struct kv {
  uint64_t k; /* key with the sign bit flipped: unsigned order = key order */
  uint64_t v;
} kv;

static inline uint64_t sort_key(int64_t key) {
  return (uint64_t)key ^ (UINT64_C(1) << 63);
}

/* Stable LSD radix sort by k (bytes whose value is the same everywhere
 * are skipped). Returns DYNEMB_ENOMEM if the buffer cannot be allocated. */
static int radix_sort(kv *a, size_t n) {
  if (n < 2) return DYNEMB_OK;
  size_t(*hist)[256] = calloc(8, sizeof *hist);
  kv *tmp = malloc(n * sizeof *tmp);
  if (!hist || !tmp) {
    free(hist);
    free(tmp);
    return DYNEMB_ENOMEM;
  }
  for (size_t i = 0; i < n; i++)
    for (int d = 0; d < 8; d++) hist[d][(a[i].k >> (8 * d)) & 0xff]++;
  kv *src = a, *dst = tmp;
  for (int d = 0; d < 8; d++) {
    size_t *h = hist[d];
    if (h[(src[0].k >> (8 * d)) & 0xff] == n) continue; /* one value */
    size_t run = 0;
    for (int c = 0; c < 256; c++) {
      size_t x = h[c];
      h[c] = run;
      run += x;
    }
    for (size_t i = 0; i < n; i++) dst[h[(src[i].k >> (8 * d)) & 0xff]++] = src[i];
    kv *sw = src;
    src = dst;
    dst = sw;
  }
  if (src != a) memcpy(a, src, n * sizeof *a);
  free(tmp);
  free(hist);
  return DYNEMB_OK;
}

/* ------------------------------------------------------------------------ */
/* Snapshot                                                                  */
/* ------------------------------------------------------------------------ */

void dynemb_snapshot_free(dynemb_snapshot *snap) {
  if (!snap) return;
  free(snap->keys);
  free(snap->values);
  free(snap->last_access);
  free(snap->cand_keys);
  free(snap->cand_counts);
  free(snap->cand_last_access);
  memset(snap, 0, sizeof *snap);
}

/* Collects (key, shard << 40 | position) of every entry of the chosen
 * index of every shard. */
static size_t collect(dynemb_table *t, int cands, kv *out) {
  size_t n = 0;
  for (uint32_t s = 0; s < t->nshards; s++) {
    const dynemb_index *ix = cands ? &t->shards[s].cands : &t->shards[s].rows;
    if (!ix->count) continue;
    for (uint64_t i = 0; i < ix->cap; i++)
      if (ix->entries[i].loc != DYNEMB_LOC_EMPTY) {
        out[n].k = sort_key(ix->entries[i].key);
        out[n].v = ((uint64_t)s << 40) | i;
        n++;
      }
  }
  return n;
}

static inline dynemb_index_entry *entry_of(dynemb_table *t, int cands,
                                           uint64_t v) {
  dynemb_shard *sh = &t->shards[v >> 40];
  dynemb_index *ix = cands ? &sh->cands : &sh->rows;
  return ix->entries + (v & ((UINT64_C(1) << 40) - 1));
}

struct dynemb_table_reader {
  dynemb_table *t;
  kv *order; /* the rows, in key order: shard << 40 | index entry */
  size_t rows;
};

int dynemb_table_snapshot_open(dynemb_table *t, dynemb_snapshot *snap,
                               dynemb_table_reader **out) {
  dynemb_error_clear();
  *out = NULL;
  memset(snap, 0, sizeof *snap);
  if (!t) return dynemb_table_null_error("dynemb_table_snapshot");
  dynemb_table_reader *rd = calloc(1, sizeof *rd);
  if (!rd) goto nomem0;
  dynemb_table_lock_all(t, 0);
  size_t rows = 0, cands = 0;
  for (uint32_t s = 0; s < t->nshards; s++) {
    rows += t->shards[s].rows.count;
    cands += t->shards[s].cands.count;
  }
  snap->dim = t->dim;
  snap->row_floats = t->row_floats;
  snap->optimizer_kind = t->cfg.optimizer.kind;
  snap->apply_steps = LOAD(&t->apply_steps);
  snap->rows = rows;
  snap->candidates = cands;
  rd->t = t;
  rd->rows = rows;
  rd->order = malloc(rows * sizeof *rd->order + 1);
  kv *corder = malloc(cands * sizeof *corder + 1);
  snap->keys = malloc(rows * sizeof *snap->keys + 1);
  snap->last_access = malloc(rows * sizeof *snap->last_access + 1);
  snap->cand_keys = malloc(cands * sizeof *snap->cand_keys + 1);
  snap->cand_counts = malloc(cands * sizeof *snap->cand_counts + 1);
  snap->cand_last_access = malloc(cands * sizeof *snap->cand_last_access + 1);
  int ok = rd->order && corder && snap->keys && snap->last_access &&
           snap->cand_keys && snap->cand_counts && snap->cand_last_access;
  if (ok) {
    collect(t, 0, rd->order);
    collect(t, 1, corder);
    ok = radix_sort(rd->order, rows) == DYNEMB_OK &&
         radix_sort(corder, cands) == DYNEMB_OK;
  }
  if (ok) {
    for (size_t i = 0; i < rows; i++) {
      const dynemb_index_entry *e = entry_of(t, 0, rd->order[i].v);
      snap->keys[i] = e->key;
      snap->last_access[i] = LOAD(&e->last_access);
    }
    for (size_t i = 0; i < cands; i++) {
      const dynemb_index_entry *e = entry_of(t, 1, corder[i].v);
      snap->cand_keys[i] = e->key;
      snap->cand_counts[i] = e->loc;
      snap->cand_last_access[i] = e->last_access;
    }
  }
  free(corder);
  if (ok) {
    *out = rd;
    return DYNEMB_OK;
  }
  dynemb_table_snapshot_close(rd);
  dynemb_snapshot_free(snap);
  return dynemb_error_set(DYNEMB_ENOMEM,
                          "table '%s': out of memory for a snapshot of %zu "
                          "rows and %zu candidates",
                          t->name, rows, cands);
nomem0:
  return dynemb_error_set(DYNEMB_ENOMEM,
                          "table '%s': out of memory for a snapshot", t->name);
}

int dynemb_table_reader_rows(const dynemb_table_reader *rd, size_t first,
                             size_t n, float *out) {
  const dynemb_table *t = rd->t;
  const size_t rf = (size_t)t->row_floats, dim = (size_t)t->dim;
  for (size_t i = first; i < first + n && i < rd->rows; i++) {
    const dynemb_index_entry *e = entry_of(rd->t, 0, rd->order[i].v);
    const dynemb_shard *sh = &t->shards[rd->order[i].v >> 40];
    float *to = out + (i - first) * rf;
    if (!on_host(e->loc)) {
      int rc = dynemb_ssd_read(&rd->t->ssd, DYNEMB_LOC_NUM(e->loc), to,
                               rf > dim ? to + dim : NULL);
      if (rc) return rc; /* the message names the table and the disk */
      continue;
    }
    memcpy(to, row_of(sh, e->loc), dim * sizeof(float));
    if (rf > dim) memcpy(to + dim, slots_of(sh, e->loc), (rf - dim) * sizeof(float));
  }
  return DYNEMB_OK;
}

void dynemb_table_snapshot_close(dynemb_table_reader *rd) {
  if (!rd) return;
  if (rd->t) dynemb_table_unlock_all(rd->t);
  free(rd->order);
  free(rd);
}

int dynemb_table_snapshot(dynemb_table *t, dynemb_snapshot *snap) {
  dynemb_error_clear();
  if (!snap)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "dynemb_table_snapshot: snapshot pointer is NULL");
  dynemb_table_reader *rd = NULL;
  int rc = dynemb_table_snapshot_open(t, snap, &rd);
  if (rc) return rc;
  const size_t rf = (size_t)t->row_floats;
  snap->values = malloc(snap->rows * rf * sizeof *snap->values + 1);
  rc = snap->values ? dynemb_table_reader_rows(rd, 0, snap->rows, snap->values)
                    : dynemb_error_set(DYNEMB_ENOMEM,
                                       "table '%s': out of memory for a "
                                       "snapshot of %zu rows x %zu floats",
                                       t->name, snap->rows, rf);
  dynemb_table_snapshot_close(rd);
  if (rc) dynemb_snapshot_free(snap);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Import                                                                    */
/* ------------------------------------------------------------------------ */

/* Selects the entries of `keys` in the wanted key shard, sorted by key,
 * keeping the last of repeated keys. Returns the count or SIZE_MAX. */
static size_t select_keys(const int64_t *keys, size_t n, uint32_t shard_index,
                          uint32_t shard_count, kv **out) {
  kv *a = malloc(n * sizeof *a + 1);
  if (!a) return SIZE_MAX;
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (shard_count > 1 && dynemb_hash_owner(keys[i], shard_count) != shard_index)
      continue;
    a[m].k = sort_key(keys[i]);
    a[m].v = i;
    m++;
  }
  if (radix_sort(a, m)) {
    free(a);
    return SIZE_MAX;
  }
  size_t w = 0;
  for (size_t i = 0; i < m; i++) {
    if (w && a[w - 1].k == a[i].k)
      a[w - 1] = a[i]; /* stable sort: the later one wins */
    else
      a[w++] = a[i];
  }
  *out = a;
  return w;
}

/* Writes snapshot row `from` into record `rec` of the SSD tier (with fresh
 * optimizer slots if `emb_only`; `*buf` is a row-sized scratch made on
 * first use). */
static int import_ssd_row(dynemb_table *t, uint32_t rec, const float *from,
                          int emb_only, float **buf) {
  if (!t->slots || !emb_only) /* the snapshot row has the record's layout */
    return dynemb_ssd_write(&t->ssd, rec, from, t->slots ? from + t->dim : NULL);
  if (!*buf && !(*buf = malloc((size_t)t->row_floats * sizeof(float))))
    return dynemb_error_set(DYNEMB_ENOMEM,
                            "table '%s': out of memory importing rows to the "
                            "SSD tier", t->name);
  dynemb_optim_init_slots(&t->cfg.optimizer, *buf + t->dim, t->dim);
  return dynemb_ssd_write(&t->ssd, rec, from, *buf + t->dim);
}

int dynemb_table_import(dynemb_table *t, const dynemb_snapshot *snap,
                        unsigned flags, uint32_t shard_index,
                        uint32_t shard_count) {
  dynemb_error_clear();
  if (!t) return dynemb_table_null_error("dynemb_table_import");
  if (!snap)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': import got a NULL snapshot",
                            t->name);
  if (flags & ~(unsigned)(DYNEMB_IMPORT_REPLACE | DYNEMB_IMPORT_EMBEDDING_ONLY |
                          DYNEMB_IMPORT_KEEP_STEPS | DYNEMB_IMPORT_ADOPT_LAYOUT))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': import flags 0x%x contain unknown "
                            "bits; use DYNEMB_IMPORT_REPLACE, "
                            "_EMBEDDING_ONLY, _KEEP_STEPS and _ADOPT_LAYOUT",
                            t->name, flags);
  if ((flags & DYNEMB_IMPORT_EMBEDDING_ONLY) &&
      (flags & DYNEMB_IMPORT_ADOPT_LAYOUT))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': import flags EMBEDDING_ONLY (keep the "
                            "table's optimizer) and ADOPT_LAYOUT (take the "
                            "snapshot's) contradict each other; pass one",
                            t->name);
  if (shard_count > 1 && shard_index >= shard_count)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': import shard_index %u is not below "
                            "shard_count %u; pass 0 .. shard_count-1",
                            t->name, shard_index, shard_count);
  if (snap->dim != t->dim)
    return dynemb_error_set(DYNEMB_EDIM,
                            "table '%s': snapshot has dim %d but the table has "
                            "dim %d; create the table with dim %d or import "
                            "the matching data",
                            t->name, snap->dim, t->dim, snap->dim);
  int sslots = dynemb_optim_slot_count(snap->optimizer_kind);
  if (sslots < 0 || snap->row_floats != snap->dim * (1 + sslots))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': snapshot is inconsistent (optimizer "
                            "kind %d, %d floats per row for dim %d)",
                            t->name, snap->optimizer_kind, snap->row_floats,
                            snap->dim);
  const int emb_only = (flags & DYNEMB_IMPORT_EMBEDDING_ONLY) != 0;
  const int adopt = (flags & DYNEMB_IMPORT_ADOPT_LAYOUT) != 0;
  const int differs = snap->optimizer_kind != t->cfg.optimizer.kind ||
                      snap->row_floats != t->row_floats;
  if (!emb_only && !adopt && differs)
    return dynemb_error_set(
        DYNEMB_EMISMATCH,
        "table '%s': snapshot rows hold optimizer %s state (%d floats per "
        "row) but the table uses %s (%d floats per row); use the same "
        "optimizer, pass DYNEMB_IMPORT_EMBEDDING_ONLY to take only the "
        "embeddings, or, for a table that no optimizer trains yet, "
        "DYNEMB_IMPORT_ADOPT_LAYOUT (with _REPLACE) to take the snapshot's "
        "optimizer state too",
        t->name, dynemb_optimizer_name(snap->optimizer_kind), snap->row_floats,
        dynemb_optimizer_name(t->cfg.optimizer.kind), t->row_floats);
  if ((snap->rows && (!snap->keys || !snap->values)) ||
      (snap->candidates && (!snap->cand_keys || !snap->cand_counts)))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': snapshot has %zu rows / %zu "
                            "candidates but NULL arrays for them",
                            t->name, snap->rows, snap->candidates);
  const int replace = (flags & DYNEMB_IMPORT_REPLACE) != 0;
  kv *rsel = NULL, *csel = NULL;
  float *ssd_buf = NULL;
  uint64_t *need = NULL; /* per shard: new rows, new candidates, new rows
                          * in host memory */
  size_t nr = select_keys(snap->keys, snap->rows, shard_index, shard_count, &rsel);
  size_t nc = nr == SIZE_MAX ? SIZE_MAX
                             : select_keys(snap->cand_keys, snap->candidates,
                                           shard_index, shard_count, &csel);
  need = calloc((size_t)t->nshards * 3, sizeof *need);
  if (nr == SIZE_MAX || nc == SIZE_MAX || !need) {
    free(rsel);
    free(csel);
    free(need);
    return dynemb_error_set(DYNEMB_ENOMEM,
                            "table '%s': out of memory importing %zu rows",
                            t->name, snap->rows);
  }
  int rc = DYNEMB_OK;
  dynemb_table_lock_all(t, 1);
  int relayout = 0;
  /* adopting: the table's hyper-parameters, the snapshot's kind (read
   * again under the locks, which a change of optimizer takes too) */
  dynemb_optimizer adopted = t->cfg.optimizer;
  adopted.kind = snap->optimizer_kind;
  if (adopt && (snap->optimizer_kind != t->cfg.optimizer.kind ||
                snap->row_floats != t->row_floats)) {
    uint64_t held = 0;
    for (uint32_t s = 0; s < t->nshards; s++) held += t->shards[s].rows.count;
    if (held && !replace)
      rc = dynemb_error_set(
          DYNEMB_EMISMATCH,
          "table '%s' holds %llu rows with %s state, and the snapshot's rows "
          "hold %s state: it can take the snapshot's layout only when its "
          "rows are replaced; pass DYNEMB_IMPORT_REPLACE as well, or "
          "DYNEMB_IMPORT_EMBEDDING_ONLY instead",
          t->name, (unsigned long long)held,
          dynemb_optimizer_name(t->cfg.optimizer.kind),
          dynemb_optimizer_name(snap->optimizer_kind));
    else
      rc = dynemb_optim_validate(&adopted, t->name);
    relayout = !rc;
  }
  /* 1. count what will be added (nothing changes yet). With an SSD tier,
   * new rows fill host memory up to its budget (in key order) and go to
   * SSD after that; rows already on SSD are rewritten there. */
  const int ssd = dynemb_ssd_on(&t->ssd);
  const uint64_t hbudget = t->cfg.host_vocabulary_size;
  const uint64_t host_now = replace ? 0 : LOAD(&t->rows_total);
  const uint64_t host_room0 =
      !ssd ? UINT64_MAX : hbudget > host_now ? hbudget - host_now : 0;
  uint64_t total = 0, host_room = host_room0, ssd_new = 0;
  for (uint32_t s = 0; s < t->nshards; s++)
    total += replace ? 0 : t->shards[s].rows.count;
  for (size_t i = 0; i < nr && !rc; i++) {
    int64_t key = snap->keys[rsel[i].v];
    uint64_t h = dynemb_hash_key(key);
    uint32_t s = dynemb_table_shard_of(t, h);
    if (replace || !dynemb_index_find(&t->shards[s].rows, key, h)) {
      need[3 * s]++;
      if (host_room) {
        need[3 * s + 2]++;
        host_room--;
      } else {
        ssd_new++;
      }
      total++;
    }
  }
  for (size_t i = 0; i < nc; i++) {
    uint32_t s = dynemb_table_shard_of(t, dynemb_hash_key(snap->cand_keys[csel[i].v]));
    need[3 * s + 1]++;
  }
  uint64_t budget = t->cfg.host_vocabulary_size;
  if (rc) {
    /* (the layout check above failed) */
  } else if (ssd && (replace ? 0 : dynemb_ssd_used(&t->ssd)) + ssd_new >
                 t->cfg.ssd_vocabulary_size)
    rc = dynemb_error_set(DYNEMB_ECAPACITY,
                          "table '%s': importing would make %llu rows but "
                          "host_vocabulary_size + ssd_vocabulary_size is "
                          "%llu; raise ssd_vocabulary_size or enable "
                          "eviction",
                          t->name, (unsigned long long)total,
                          (unsigned long long)(budget +
                                               t->cfg.ssd_vocabulary_size));
  else if (!ssd && budget && total > budget)
    rc = dynemb_error_set(DYNEMB_ECAPACITY,
                          "table '%s': importing would make %llu rows but "
                          "%s is %llu; raise %s or enable eviction",
                          t->name, (unsigned long long)total,
                          t->host_budget_name, (unsigned long long)budget,
                          t->host_budget_name);
  /* 1b. the snapshot's layout: every row's storage goes (a replace drops
   * the rows anyway), so the index forgets them at once */
  if (!rc && relayout) {
    rc = dynemb_table_relayout_locked(t, &adopted);
    for (uint32_t s = 0; s < t->nshards && !rc; s++)
      dynemb_index_clear_keep(&t->shards[s].rows);
  }
  /* 2. reserve index entries and row numbers, so that step 3 cannot fail */
  for (uint32_t s = 0; s < t->nshards && !rc; s++) {
    dynemb_shard *sh = &t->shards[s];
    uint64_t rows_now = replace ? 0 : sh->rows.count;
    /* (a replace frees every row number of the shard) */
    uint64_t free_now = replace ? sh->arena.capacity
                                : dynemb_arena_available(&sh->arena);
    uint64_t nr_s = need[3 * s], nc_s = need[3 * s + 1];
    uint64_t nh_s = need[3 * s + 2];
    int r = dynemb_index_reserve(&sh->rows, rows_now + nr_s);
    if (!r) r = dynemb_index_reserve(&sh->cands,
                                     (replace ? 0 : sh->cands.count) + nc_s);
    if (!r && nh_s > free_now)
      r = dynemb_arena_reserve(&sh->arena,
                               dynemb_arena_available(&sh->arena) + (nh_s - free_now));
    if (!r && ssd) r = dynemb_tier_host_reserve(sh, sh->arena.capacity);
    if (r) rc = dynemb_tier_insert_error(t, r);
  }
  /* 3. apply */
  if (!rc) {
    const size_t rf = (size_t)t->row_floats, srf = (size_t)snap->row_floats;
    if (replace) {
      for (uint32_t s = 0; s < t->nshards; s++) {
        dynemb_shard *sh = &t->shards[s];
        dynemb_index_clear_keep(&sh->rows);
        dynemb_index_clear_keep(&sh->cands);
        dynemb_arena_clear_keep(&sh->arena);
        dynemb_tier_host_clear(sh);
      }
      dynemb_ssd_reset(&t->ssd);
    }
    host_room = host_room0;
    uint64_t rows_after = 0;
    uint32_t max_la = 0; /* the table clock follows the imported stamps */
    for (uint32_t s = 0; s < t->nshards; s++) t->shards[s].gen++;
    for (size_t i = 0; i < nr && !rc; i++) {
      size_t src = rsel[i].v;
      int64_t key = snap->keys[src];
      uint64_t h = dynemb_hash_key(key);
      dynemb_shard *sh = &t->shards[dynemb_table_shard_of(t, h)];
      uint32_t la = snap->last_access ? snap->last_access[src] : 0;
      dynemb_index_entry *e = dynemb_index_find(&sh->rows, key, h);
      if (!e) {
        uint32_t rowno = 0;
        if (host_room) {
          host_room--;
          dynemb_arena_alloc(&sh->arena, &rowno); /* reserved: cannot fail */
          (void)dynemb_tier_host_taken(t, sh, rowno, key); /* reserved too */
          e = dynemb_index_insert(&sh->rows, key, h,
                                  DYNEMB_LOC(DYNEMB_TIER_HOST, rowno), la);
        } else { /* counted against the SSD tier's size above */
          (void)dynemb_ssd_alloc(&t->ssd, &rowno);
          e = dynemb_index_insert(&sh->rows, key, h,
                                  DYNEMB_LOC(DYNEMB_TIER_SSD, rowno), la);
        }
      } else {
        e->last_access = la;
      }
      if (la > max_la) max_la = la;
      const float *from = snap->values + src * srf;
      if (!on_host(e->loc)) {
        rc = import_ssd_row(t, DYNEMB_LOC_NUM(e->loc), from, emb_only,
                            &ssd_buf);
      } else {
        memcpy(row_of(sh, e->loc), from, (size_t)t->dim * sizeof(float));
        if (t->slots && emb_only)
          dynemb_optim_init_slots(&t->cfg.optimizer, slots_of(sh, e->loc),
                                  t->dim);
        else if (t->slots)
          memcpy(slots_of(sh, e->loc), from + t->dim,
                 (rf - (size_t)t->dim) * sizeof(float));
      }
      if (sh->cands.count) {
        dynemb_index_entry *c = dynemb_index_find(&sh->cands, key, h);
        if (c) dynemb_index_erase_at(&sh->cands, (uint64_t)(c - sh->cands.entries));
      }
    }
    for (size_t i = 0; i < nc; i++) {
      size_t src = csel[i].v;
      int64_t key = snap->cand_keys[src];
      uint64_t h = dynemb_hash_key(key);
      dynemb_shard *sh = &t->shards[dynemb_table_shard_of(t, h)];
      if (dynemb_index_find(&sh->rows, key, h)) continue; /* row wins */
      uint32_t cnt = snap->cand_counts[src];
      if (cnt >= DYNEMB_LOC_EMPTY) cnt = DYNEMB_LOC_EMPTY - 1;
      uint32_t la = snap->cand_last_access ? snap->cand_last_access[src] : 0;
      if (la > max_la) max_la = la;
      dynemb_index_entry *c = dynemb_index_find(&sh->cands, key, h);
      if (!c)
        dynemb_index_insert(&sh->cands, key, h, cnt, la);
      else {
        c->loc = cnt;
        c->last_access = la;
      }
    }
    for (uint32_t s = 0; s < t->nshards; s++) rows_after += t->shards[s].rows.count;
    STORE(&t->rows_total, rows_after - dynemb_ssd_used(&t->ssd));
    if (!(flags & DYNEMB_IMPORT_KEEP_STEPS)) STORE(&t->apply_steps, snap->apply_steps);
    clock_advance(t, max_la);
  }
  dynemb_table_unlock_all(t);
  free(rsel);
  free(csel);
  free(need);
  free(ssd_buf);
  return rc;
}

