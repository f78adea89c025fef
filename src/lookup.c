/*
 * lookup.c -- reading rows: lookup (train and eval), prepare (the table's
 * side of a train lookup ahead of the step: admission counting, inserts,
 * stamps, an admission ticket per key) and the prepared read that copies a
 * prepared batch's rows through its tickets (ticket.h).
 *
 * A lookup serves hits in batch order under the read locks of every shard
 * the batch touches (taken once per batch, in ascending order), so the
 * output is written sequentially and last access is stamped with relaxed
 * atomic stores; misses are then grouped by shard and handled under each
 * shard's write lock (re-probe, admission count, insert: tier.c). Memory
 * latency is hidden by software prefetch: index entries a dozen keys
 * ahead, rows a few keys ahead.
 */
#include "table_int.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "hash.h"
#include "ticket.h"

#define MISS_PF 8 /* misses ahead for index prefetch while inserting */
#define REC_PF 4  /* misses ahead for SSD record prefetch (< MISS_PF) */

/* ------------------------------------------------------------------------ */
/* Lookup                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct lookup_counts {
  uint64_t hits, inserted, rejected;
  uint64_t on_ssd; /* hits whose row was on the SSD tier */
} lookup_counts;

/* Handles the misses of one shard under its write lock: re-probe (another
 * thread or an earlier occurrence may have inserted the key), admission
 * counting, insertion. `miss` lists batch positions in batch order. */
static int lookup_misses(dynemb_table *t, dynemb_shard *sh,
                         const int64_t *keys, const uint64_t *hs,
                         const uint32_t *miss, uint32_t nmiss, uint32_t now,
                         uint32_t threshold, int counting, uint32_t weight,
                         float *out, dynemb_ticket *tickets,
                         dynemb_index_spare *spare, lookup_counts *lc) {
  const uint32_t shard = (uint32_t)(sh - t->shards);
  const size_t dim = (size_t)t->dim, rbytes = dim * sizeof(float);
  const int ssd = dynemb_ssd_on(&t->ssd);
  int rc = DYNEMB_OK;
  pthread_rwlock_wrlock(&sh->lock);
  for (uint32_t m = 0; m < nmiss; m++) {
    uint32_t i = miss[m];
    int64_t key = keys[i];
    uint64_t h = hs[i];
    /* the re-probes would each wait for DRAM under the write lock: fetch
     * the index entries ahead (a rehash during the loop only makes some
     * of these prefetches useless) */
    if (m + MISS_PF < nmiss) {
      uint64_t hp = hs[miss[m + MISS_PF]];
      dynemb_index_prefetch(&sh->rows, hp);
      if (threshold > 1) dynemb_index_prefetch(&sh->cands, hp);
    }
    /* and a row on the SSD tier, once its entry is in cache: promote
     * copies it out of the file's mapping */
    if (ssd && m + REC_PF < nmiss) {
      uint32_t j = miss[m + REC_PF];
      const dynemb_index_entry *pe = dynemb_index_find(&sh->rows, keys[j], hs[j]);
      if (pe && !on_host(pe->loc))
        dynemb_ssd_prefetch(&t->ssd, DYNEMB_LOC_NUM(pe->loc));
    }
    float *dst = out ? out + (size_t)i * dim : NULL;
    dynemb_index_entry *e = dynemb_index_find(&sh->rows, key, h);
    if (tickets) tickets[i] = DYNEMB_NOT_ADMITTED; /* until it has a row */
    if (e) { /* on the SSD tier, inserted since the read pass, or repeated
              * in the batch */
      if (!on_host(e->loc) && (rc = dynemb_tier_promote(t, sh, e))) break;
      stamp(e, now);
      if (tickets) tickets[i] = make_ticket(sh, shard, e->loc);
      if (dst) memcpy(dst, row_of(sh, e->loc), rbytes);
      lc->hits++;
      continue;
    }
    if (!counting && threshold > 1) { /* admitted only by the count it has */
      const dynemb_index_entry *c = dynemb_index_find(&sh->cands, key, h);
      if (!c || c->loc < threshold) {
        if (dst) memcpy(dst, t->default_value, rbytes);
        lc->rejected++;
        continue;
      }
    } else if (threshold > 1) {
      dynemb_index_entry *c = dynemb_index_find(&sh->cands, key, h);
      if (!c) {
        if (dynemb_index_reserve(&sh->cands, sh->cands.count + 1)) {
          rc = dynemb_tier_insert_error(t, DYNEMB_ENOMEM);
          break;
        }
        c = dynemb_index_insert(&sh->cands, key, h, weight, now);
      } else { /* (saturating below the empty mark) */
        c->loc = c->loc < DYNEMB_LOC_EMPTY - 1 - weight
                     ? c->loc + weight
                     : DYNEMB_LOC_EMPTY - 1;
        if (c->last_access < now) c->last_access = now;
      }
      if (c->loc < threshold) {
        if (dst) memcpy(dst, t->default_value, rbytes);
        lc->rejected++;
        continue;
      }
      /* admitted: insert_row removes the candidate */
    }
    rc = dynemb_tier_insert_row(t, sh, key, h, now, spare, &e);
    if (rc) break;
    if (tickets) tickets[i] = make_ticket(sh, shard, e->loc);
    if (dst) memcpy(dst, row_of(sh, e->loc), rbytes);
    lc->inserted++;
  }
  pthread_rwlock_unlock(&sh->lock);
  return rc;
}

#define RING 16 /* > ROW_DIST */
#define ROW_DIST 6
/* Keys between a row's prefetch and its copy in prepared reads: with no
 * index probe in between, they can run further ahead (measured, 4M x 64,
 * 2 threads, 10 alternating runs: 14 read 1.0-1.6x as many keys per second
 * as 6; 20 did not do better than 14). */
#define TICKET_DIST 14
#define TICKET_RING 32 /* > TICKET_DIST, a power of two */

/* Looks up n < 2^32 keys.
 *
 * Hits are served in batch order (so `out` is written sequentially) with
 * the read locks of every shard the batch touches held at once (taken in
 * ascending order), in a software pipeline: the index entry of key
 * i + IDX_PF is prefetched, key i is probed and its row prefetched, and
 * the row of key i - ROW_DIST is copied. Misses are then grouped by shard
 * and handled under each shard's write lock (lookup_misses). */
/* `out` (may be NULL: prepare) gets the rows, `tickets` (may be NULL: a
 * plain lookup) the admission tickets. */
static int lookup_part(dynemb_table *t, const int64_t *keys, size_t n,
                       int train, uint32_t now, uint32_t weight, float *out,
                       dynemb_ticket *tickets,
                       lookup_counts *lc) {
  const size_t S = t->nshards, dim = (size_t)t->dim;
  const size_t rbytes = dim * sizeof(float);
  /* scratch: hashes [n], per-shard index growth [S], misses [n],
   * per-shard counts [S + 1], marks [S]; with an SSD tier, the records of
   * rows there [n] and (eval) their batch positions [n] */
  const int ssd = dynemb_ssd_on(&t->ssd);
  char *mem = malloc(n * (sizeof(uint64_t) + 2 * sizeof(uint32_t)) +
                     S * sizeof(double) + (S + 1) * sizeof(uint32_t) + S + 8 +
                     (ssd ? 2 * n * sizeof(uint32_t) : 0));
  if (!mem)
    return dynemb_error_set(DYNEMB_ENOMEM,
                            "table '%s': out of memory for a lookup batch of "
                            "%zu keys; use smaller batches",
                            t->name, n);
  uint64_t *hs = (uint64_t *)mem;
  double *grow = (double *)(hs + n);
  uint32_t *miss = (uint32_t *)(grow + S);
  uint32_t *order = miss + n;
  uint32_t *cnt = order + n;
  uint32_t *recs = ssd ? cnt + S + 1 : NULL, *at = ssd ? recs + n : NULL;
  unsigned char *mark = (unsigned char *)(cnt + S + 1 + (ssd ? 2 * n : 0));
  memset(mark, 0, S);
  for (size_t i = 0; i < n; i++) {
    uint64_t h = dynemb_hash_key(keys[i]);
    hs[i] = h;
    mark[dynemb_table_shard_of(t, h)] = 1;
  }
  for (size_t s = 0; s < S; s++)
    if (mark[s]) pthread_rwlock_rdlock(&t->shards[s].lock);

  const float *ring[RING];
  uint32_t nmiss = 0, nrec = 0;
  uint64_t hits = 0;
  int io_rc = DYNEMB_OK; /* an SSD read failed (message set) */
  const float *dflt = train ? NULL : t->default_value;
  for (size_t i = 0; i < n + ROW_DIST; i++) {
    if (i + IDX_PF < n) {
      uint64_t hp = hs[i + IDX_PF];
      dynemb_index_prefetch(&t->shards[dynemb_table_shard_of(t, hp)].rows, hp);
    }
    if (i < n) {
      uint64_t h = hs[i];
      const uint32_t shard = dynemb_table_shard_of(t, h);
      dynemb_shard *sh = &t->shards[shard];
      dynemb_index_entry *e = dynemb_index_find(&sh->rows, keys[i], h);
      const float *r = dflt;
      /* (a ticket's place on the SSD tier is never used: prepared calls read
       * such rows by key) */
      if (tickets)
        tickets[i] = e ? make_ticket(sh, shard, e->loc) : DYNEMB_NOT_ADMITTED;
      if (e && !on_host(e->loc)) {
        lc->on_ssd++;
        if (train) { /* brought into memory under the write lock */
          miss[nmiss++] = (uint32_t)i;
          recs[nrec++] = DYNEMB_LOC_NUM(e->loc);
        } else { /* read in place below: eval never changes the table */
          at[nrec] = (uint32_t)i;
          recs[nrec++] = DYNEMB_LOC_NUM(e->loc);
          hits++;
        }
        r = NULL;
      } else if (e) {
        if (out) { /* (prepare has no output: no chunk-table read) */
          r = row_of(sh, e->loc);
          prefetch_lines(r, rbytes);
        }
        if (train) stamp(e, now);
        hits++;
      } else if (train) {
        miss[nmiss++] = (uint32_t)i;
      }
      ring[i % RING] = r;
    }
    if (i >= ROW_DIST) {
      size_t c = i - ROW_DIST;
      const float *r = ring[c % RING];
      if (r && out) memcpy(out + c * dim, r, rbytes);
    }
  }
  /* eval: the rows on the SSD tier, read in place (all records advised
   * first while the tier's reads fault: ssd.h) */
  if (!train && nrec && out) {
    dynemb_ssd_batch rb;
    dynemb_ssd_batch_begin(&t->ssd, recs, nrec, &rb);
    for (uint32_t k = 0; k < nrec && !io_rc; k++) {
      if (k + ROW_PF < nrec) dynemb_ssd_prefetch(&t->ssd, recs[k + ROW_PF]);
      io_rc = dynemb_ssd_read(&t->ssd, recs[k], out + (size_t)at[k] * dim, NULL);
    }
    dynemb_ssd_batch_end(&t->ssd, &rb);
  }
  const uint32_t threshold = LOAD(&t->access_threshold);
  const int counting = !LOAD(&t->counting_stopped);
  if (nmiss) {
    /* group the misses by shard, keeping batch order within a shard, and
     * (still under the read locks) note the shards whose index will have
     * to grow for them. Only without admission: with it, most misses only
     * count towards their threshold, and an array made for them would
     * mostly be thrown away. */
    memset(cnt, 0, (S + 1) * sizeof(uint32_t));
    for (uint32_t m = 0; m < nmiss; m++)
      cnt[dynemb_table_shard_of(t, hs[miss[m]]) + 1]++;
    for (size_t s = 0; s < S; s++) {
      const dynemb_index *ix = &t->shards[s].rows;
      /* room for twice this call's misses: another thread may insert
       * into the shard before this one takes its lock */
      grow[s] = cnt[s + 1] && threshold <= 1
                    ? dynemb_index_growth_for(ix, ix->count + 2 * cnt[s + 1])
                    : 0;
      cnt[s + 1] += cnt[s];
    }
    for (uint32_t m = 0; m < nmiss; m++)
      order[cnt[dynemb_table_shard_of(t, hs[miss[m]])]++] = miss[m];
    /* cnt[s] is now the end of shard s's run */
  }
  for (size_t s = S; s-- > 0;)
    if (mark[s]) pthread_rwlock_unlock(&t->shards[s].lock);
  lc->hits += hits;

  int rc = io_rc;
  if (nmiss && !rc) {
    /* fault in the memory of the next row chunks now, outside the locks */
    /* room for this call's inserts, twice over (another thread may take
     * from the same memory meanwhile) */
    const size_t emb_b = (size_t)t->dim * sizeof(float);
    dynemb_slab_pool_prefault(&t->pool, 2 * (size_t)nmiss * emb_b);
    if (t->slots)
      dynemb_slab_pool_prefault(&t->slot_pool,
                                2 * (size_t)nmiss * emb_b * (size_t)t->slots);
    /* rows moving out to the SSD tier (about one per miss) go to fresh
     * records: their pages too */
    if (ssd) dynemb_ssd_prefault(&t->ssd, 2 * (uint64_t)nmiss);
    /* the rows to bring back from the SSD tier: advised all at once while
     * the tier's reads fault (ssd.h) */
    dynemb_ssd_batch rb;
    if (nrec) dynemb_ssd_batch_begin(&t->ssd, recs, nrec, &rb);
    uint32_t begin = 0;
    for (size_t s = 0; s < S && !rc; s++) {
      uint32_t end = cnt[s];
      if (end > begin) {
        /* a grown index array made outside the lock (if still needed then:
         * another thread may have grown it, or admission may insert less) */
        dynemb_index_spare spare = {NULL, 0, NULL};
        if (grow[s] > 0) (void)dynemb_index_spare_make(grow[s], &spare);
        rc = lookup_misses(t, &t->shards[s], keys, hs, order + begin,
                           end - begin, now, threshold, counting, weight,
                           out, tickets, &spare, lc);
        dynemb_index_spare_free(&spare);
      }
      begin = end;
    }
    if (nrec) dynemb_ssd_batch_end(&t->ssd, &rb);
  }
  free(mem);
  return rc;
}

/* dynemb_lookup (`out`) and dynemb_prepare (`tickets`): the public
 * functions check their own buffer. */
static int lookup_impl(dynemb_table *t, const int64_t *keys, size_t n,
                       int mode, int64_t now, uint32_t weight, float *out,
                       dynemb_ticket *tickets, const char *fn) {
  dynemb_error_clear();
  if (!t) return dynemb_table_null_error(fn);
  if (mode != DYNEMB_LOOKUP_TRAIN && mode != DYNEMB_LOOKUP_EVAL)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': lookup mode %d is unknown; use "
                            "DYNEMB_LOOKUP_TRAIN or DYNEMB_LOOKUP_EVAL",
                            t->name, mode);
  if (weight < 1 || weight > INT32_MAX)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': %s with a sighting weight of %u; "
                            "the weight (faae_coefficient) is 1 .. 2^31-1",
                            t->name, fn, weight);
  int rc = dynemb_table_check_now(t, now);
  if (rc) return rc;
  if (n == 0) return DYNEMB_OK;
  if (!keys || (!out && !tickets))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': %s of %zu keys got a NULL %s "
                            "buffer; pass valid keys and output buffers",
                            t->name, fn, n,
                            !keys ? "keys" : out ? "output" : "tickets");
  lookup_counts lc = {0, 0, 0, 0};
  const size_t part = (size_t)1 << 31;
  for (size_t off = 0; off < n && !rc; off += part) {
    size_t m = n - off < part ? n - off : part;
    rc = lookup_part(t, keys + off, m, mode == DYNEMB_LOOKUP_TRAIN,
                     (uint32_t)now, weight, out ? out + off * (size_t)t->dim : NULL,
                     tickets ? tickets + off : NULL, &lc);
  }
  if (mode == DYNEMB_LOOKUP_TRAIN) clock_advance(t, (uint32_t)now);
  ADD(&t->n_lookups, (uint64_t)n);
  if (lc.hits) ADD(&t->n_hits, lc.hits);
  if (lc.inserted) ADD(&t->n_inserted, lc.inserted);
  if (lc.rejected) ADD(&t->n_rejected, lc.rejected);
  if (lc.on_ssd) ADD(&t->n_ssd_lookups, lc.on_ssd);
  return rc;
}

/* A zeroed or absent options struct weighs each sighting one. */
static uint32_t weight_of(const dynemb_lookup_opts *opts) {
  return opts && opts->weight ? opts->weight : 1;
}

int dynemb_lookup(dynemb_table *t, const int64_t *keys, size_t n, int mode,
                  int64_t now, const dynemb_lookup_opts *opts, float *out,
                  dynemb_ticket *tickets) {
  if (t && n && keys && !out) {
    dynemb_error_clear();
    return dynemb_error_set(DYNEMB_EINVAL, "table '%s': lookup of %zu keys got "
                            "a NULL output buffer; pass valid keys and output "
                            "buffers", t->name, n);
  }
  return lookup_impl(t, keys, n, mode, now, weight_of(opts), out, tickets,
                     "dynemb_lookup");
}

int dynemb_prepare(dynemb_table *t, const int64_t *keys, size_t n, int mode,
                   int64_t now, const dynemb_lookup_opts *opts,
                   dynemb_ticket *tickets) {
  if (t && n && keys && !tickets) {
    dynemb_error_clear();
    return dynemb_error_set(DYNEMB_EINVAL, "table '%s': prepare of %zu keys "
                            "got a NULL tickets buffer; pass room for one "
                            "ticket per key", t->name, n);
  }
  return lookup_impl(t, keys, n, mode, now, weight_of(opts), NULL, tickets,
                     "dynemb_prepare");
}

/* dynemb_lookup_prepared: rows copied from their tickets' places under the
 * read locks of the tickets' shards, in a pipeline like lookup_part's (rows
 * prefetched TICKET_DIST ahead). Admitted keys whose place is stale (their
 * shard evicted,
 * was cleared or imported since) are looked up by key afterwards, once
 * the locks are released (taking another shard's lock out of order could
 * deadlock with a caller that holds every lock). */
static int lookup_prepared_part(dynemb_table *t, const int64_t *keys,
                                const dynemb_ticket *tickets, size_t n,
                                float *out, unsigned char *found,
                                lookup_counts *lc) {
  const size_t S = t->nshards, dim = (size_t)t->dim;
  const size_t rbytes = dim * sizeof(float);
  unsigned char *mark = calloc(S, 1);
  uint32_t *stale = malloc(n * sizeof *stale + 1);
  shard_view *view = malloc(S * sizeof *view);
  if (!mark || !stale || !view) {
    free(mark);
    free(stale);
    free(view);
    return dynemb_error_set(DYNEMB_ENOMEM,
                            "table '%s': out of memory for a prepared lookup of "
                            "%zu keys; use smaller batches",
                            t->name, n);
  }
  for (size_t i = 0; i < n; i++)
    if (tickets[i] != DYNEMB_NOT_ADMITTED && TICKET_SHARD(tickets[i]) < S)
      mark[TICKET_SHARD(tickets[i])] = 1;
  for (size_t s = 0; s < S; s++)
    if (mark[s]) {
      pthread_rwlock_rdlock(&t->shards[s].lock);
      shard_view_of(&t->shards[s], (uint32_t)s, &view[s]);
    }
  const float *ring[TICKET_RING];
  size_t nstale = 0;
  uint64_t hits = 0;
  for (size_t i = 0; i < n + TICKET_DIST; i++) {
    if (i < n) {
      const dynemb_ticket k = tickets[i];
      const float *r = t->default_value; /* not admitted at prepare time */
      if (found) found[i] = k != DYNEMB_NOT_ADMITTED;
      if (k != DYNEMB_NOT_ADMITTED) {
        const uint32_t ks = TICKET_SHARD(k);
        /* (shards of admitted keys are marked, their views filled) */
        if (ks < S && mark[ks] &&
            ticket_place_current(k, view[ks].tag, view[ks].capacity)) {
          const uint32_t rowno = DYNEMB_LOC_NUM(TICKET_LOC(k));
          r = rowno < view[ks].first_rows
                  ? view[ks].first + (size_t)rowno * dim
                  : row_of(&t->shards[ks], TICKET_LOC(k));
          prefetch_lines(r, rbytes);
          hits++;
        } else {
          stale[nstale++] = (uint32_t)i;
          r = NULL;
        }
      }
      ring[i % TICKET_RING] = r;
    }
    if (i >= TICKET_DIST) {
      size_t c = i - TICKET_DIST;
      if (ring[c % TICKET_RING])
        copy_row(out + c * dim, ring[c % TICKET_RING], dim);
    }
  }
  for (size_t s = S; s-- > 0;)
    if (mark[s]) pthread_rwlock_unlock(&t->shards[s].lock);
  free(mark);
  free(view);
  int rc = DYNEMB_OK;
  if (nstale) { /* as an EVAL lookup of those keys would read them now */
    int64_t *sk = malloc(nstale * sizeof *sk);
    float *so = malloc(nstale * rbytes);
    dynemb_ticket *st = found ? malloc(nstale * sizeof *st) : NULL;
    if (!sk || !so || (found && !st)) {
      rc = dynemb_error_set(DYNEMB_ENOMEM,
                            "table '%s': out of memory for a prepared lookup of "
                            "%zu keys; use smaller batches",
                            t->name, n);
    } else {
      for (size_t j = 0; j < nstale; j++) sk[j] = keys[stale[j]];
      rc = lookup_part(t, sk, nstale, 0, 0, 1, so, st, lc);
      for (size_t j = 0; !rc && j < nstale; j++) {
        memcpy(out + (size_t)stale[j] * dim, so + j * dim, rbytes);
        /* (gone since its batch was prepared: evicted, cleared) */
        if (found) found[stale[j]] = st[j] != DYNEMB_NOT_ADMITTED;
      }
    }
    free(sk);
    free(so);
    free(st);
  }
  free(stale);
  lc->hits += hits;
  return rc;
}

int dynemb_lookup_prepared(dynemb_table *t, const int64_t *keys,
                           const dynemb_ticket *tickets, size_t n, float *out,
                           unsigned char *found) {
  dynemb_error_clear();
  if (!t) return dynemb_table_null_error("dynemb_lookup_prepared");
  if (n == 0) return DYNEMB_OK;
  if (!keys || !tickets || !out)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': prepared lookup of %zu keys got a NULL "
                            "%s buffer; pass valid buffers",
                            t->name, n,
                            !keys ? "keys" : !tickets ? "tickets" : "output");
  if (n >= UINT32_MAX)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': prepared lookup of %zu keys is too "
                            "large; look up fewer than 2^32-1 keys per call",
                            t->name, n);
  lookup_counts lc = {0, 0, 0, 0};
  int rc = lookup_prepared_part(t, keys, tickets, n, out, found, &lc);
  ADD(&t->n_lookups, (uint64_t)n);
  if (lc.hits) ADD(&t->n_hits, lc.hits);
  if (lc.on_ssd) ADD(&t->n_ssd_lookups, lc.on_ssd);
  return rc;
}
