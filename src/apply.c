/*
 * apply.c -- applying gradients: the batch's keys are deduped in batch
 * order, gradients of repeated keys summed (as TensorFlow sums
 * IndexedSlices), NaN/Inf found before anything changes, and the table's
 * optimizer (optim.h) updates each key's row once, under its shard's write
 * lock. Three ways to say which keys may train (dynemb_apply's options): all
 * keys with a row (no options), the trainable keys a caller lists (a
 * filter) and the admission tickets of a prepared batch (ticket.h), which
 * also locate the rows.
 */
#include "table_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "hash.h"
#include "optim.h"
#include "ticket.h"

/* ------------------------------------------------------------------------ */
/* Repeated keys within a batch                                              */
/* ------------------------------------------------------------------------ */

/* The first occurrence of each key of a batch (apply's dedupe): open
 * addressing over batch positions, at least twice as many entries as the
 * batch has keys. An entry holds the key hash's high half (compared first,
 * so another key rarely costs a load of its own) above position + 1; 0 is
 * empty. */
typedef struct firsts_table {
  uint64_t *entries;
  uint64_t mask;
} firsts_table;

static int firsts_init(firsts_table *ft, size_t n) {
  uint64_t cap = 16;
  while (cap < 2 * (uint64_t)n) cap *= 2;
  ft->mask = cap - 1;
  ft->entries = calloc(cap, sizeof *ft->entries);
  return ft->entries ? DYNEMB_OK : DYNEMB_ENOMEM;
}

/* The position of the first occurrence of keys[i] (hash h) among keys[0 ..
 * i], all of which were passed in order before: i itself for a new key. */
static inline uint32_t first_of(firsts_table *ft, const int64_t *keys,
                                uint64_t h, uint32_t i) {
  const uint64_t tag = h & ~(uint64_t)UINT32_MAX;
  uint64_t j = h & ft->mask, e;
  while ((e = ft->entries[j]) != 0) {
    if ((e & ~(uint64_t)UINT32_MAX) == tag && keys[(uint32_t)e - 1] == keys[i])
      return (uint32_t)e - 1;
    j = (j + 1) & ft->mask;
  }
  ft->entries[j] = tag | (i + 1);
  return i;
}

/* ------------------------------------------------------------------------ */
/* Apply                                                                     */
/* ------------------------------------------------------------------------ */

/* Nonzero if any of the n floats is NaN or Inf. An all-ones exponent
 * plus one carries into the sign bit; the loop is branch-free integer
 * work over blocks of 8 that compilers vectorize. */
static inline int any_nonfinite(const float *x, size_t n) {
  uint32_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint32_t w[8];
    memcpy(w, x + i, sizeof w);
    for (int k = 0; k < 8; k++) acc[k] |= (w[k] & 0x7f800000u) + 0x00800000u;
  }
  for (; i < n; i++) {
    uint32_t w;
    memcpy(&w, x + i, sizeof w);
    acc[0] |= (w & 0x7f800000u) + 0x00800000u;
  }
  uint32_t all = 0;
  for (int k = 0; k < 8; k++) all |= acc[k];
  return (all & 0x80000000u) != 0;
}

typedef struct uniq {
  int64_t key;
  uint64_t hash;  /* then, in phase B, the row's location */
  dynemb_ticket ticket; /* prepared apply: an admitting ticket of one
                           occurrence, else DYNEMB_NOT_ADMITTED */
  float *row, *slots; /* phase B: the row's memory, if in memory */
  uint32_t first; /* first occurrence (batch position) */
  uint32_t count; /* occurrences */
  uint32_t acc;   /* its row of the sum buffer, or NO_SUM */
  uint32_t skip;  /* nonfinite (policy SKIP) or no row */
} uniq;

#define NO_SUM UINT32_MAX

/* The gradient a unique key's update uses: the sum of its rows, or its
 * only row in the caller's array. */
static inline const float *uniq_grad(const uniq *q, const float *grads,
                                     const float *sum, size_t dim) {
  return q->acc != NO_SUM ? sum + (size_t)q->acc * dim
                          : grads + (size_t)q->first * dim;
}

/* acc += x over n floats (restrict pointers and a plain loop: gcc
 * vectorizes it with the Makefile's -fvect-cost-model=dynamic; the older
 * form through 8-float local arrays made it spill them to the stack). */
static inline void add_floats(float *restrict acc, const float *restrict x,
                              size_t n) {
  for (size_t i = 0; i < n; i++) acc[i] += x[i];
}

/* acc += x over a row of `dim` floats, with the loop unrolled for common
 * widths (the generic loop's setup costs more than a short row). */
static inline void add_row(float *restrict acc, const float *restrict x,
                           size_t dim) {
  switch (dim) {
  case 1: acc[0] += x[0]; break;
  case 8: for (int k = 0; k < 8; k++) acc[k] += x[k]; break;
  case 16: for (int k = 0; k < 16; k++) acc[k] += x[k]; break;
  case 32: for (int k = 0; k < 32; k++) acc[k] += x[k]; break;
  case 64: for (int k = 0; k < 64; k++) acc[k] += x[k]; break;
  default: add_floats(acc, x, dim); break;
  }
}

/* A set of keys (open addressing, linear probing): the trainable keys of a
 * filtered apply. */
typedef struct key_set {
  int64_t *keys;
  unsigned char *used;
  uint64_t mask;
} key_set;

static int key_set_build(key_set *ks, const int64_t *keys, size_t n) {
  uint64_t cap = 16;
  while (cap < 2 * (uint64_t)n) cap *= 2;
  ks->mask = cap - 1;
  ks->keys = malloc(cap * sizeof *ks->keys);
  ks->used = calloc(cap, 1);
  if (!ks->keys || !ks->used) return DYNEMB_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    uint64_t j = dynemb_hash_key(keys[i]) & ks->mask;
    while (ks->used[j] && ks->keys[j] != keys[i]) j = (j + 1) & ks->mask;
    ks->used[j] = 1;
    ks->keys[j] = keys[i];
  }
  return DYNEMB_OK;
}

static int key_set_has(const key_set *ks, int64_t key, uint64_t hash) {
  for (uint64_t j = hash & ks->mask; ks->used[j]; j = (j + 1) & ks->mask)
    if (ks->keys[j] == key) return 1;
  return 0;
}

static void key_set_free(key_set *ks) {
  free(ks->keys);
  free(ks->used);
}

static int apply_impl(dynemb_table *t, const int64_t *keys, size_t n,
                      const float *grads, float learning_rate,
                      const key_set *trainable, const dynemb_ticket *tickets,
                      dynemb_apply_stats *stats);

int dynemb_apply(dynemb_table *t, const int64_t *keys, size_t n,
                 const float *grads, float learning_rate,
                 const dynemb_apply_opts *opts, dynemb_apply_stats *stats) {
  const dynemb_ticket *tickets = opts ? opts->tickets : NULL;
  const int filtered = opts && opts->filtered;
  if (!t || (tickets && filtered) ||
      (filtered && opts->n_trainable && !opts->trainable)) {
    dynemb_error_clear();
    if (stats) memset(stats, 0, sizeof *stats);
    if (!t) return dynemb_table_null_error("dynemb_apply");
    if (tickets && filtered)
      return dynemb_error_set(DYNEMB_EINVAL,
                              "table '%s': apply got both tickets and a "
                              "trainable-keys filter; a prepared batch's "
                              "tickets already say which keys train: pass "
                              "one of them",
                              t->name);
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': apply got %zu trainable keys but a "
                            "NULL buffer for them",
                            t->name, opts->n_trainable);
  }
  if (!filtered)
    return apply_impl(t, keys, n, grads, learning_rate, NULL, tickets, stats);
  key_set ks = {0};
  if (key_set_build(&ks, opts->trainable, opts->n_trainable)) {
    key_set_free(&ks);
    dynemb_error_clear();
    if (stats) memset(stats, 0, sizeof *stats);
    return dynemb_error_set(DYNEMB_ENOMEM,
                            "table '%s': out of memory for %zu trainable keys "
                            "of an apply",
                            t->name, opts->n_trainable);
  }
  int rc = apply_impl(t, keys, n, grads, learning_rate, &ks, NULL, stats);
  key_set_free(&ks);
  return rc;
}

/* The ENONFINITE error of an apply: the first non-finite gradient element
 * in batch order, or, if every gradient is finite, the key `q` whose
 * gradients sum to a non-finite value (overflow). */
static int nonfinite_error(const dynemb_table *t, const int64_t *keys,
                           const float *grads, size_t n, const uniq *q) {
  const size_t dim = (size_t)t->dim;
  for (size_t i = 0; i < n; i++)
    if (any_nonfinite(grads + i * dim, dim)) {
      size_t j = 0;
      while (j < dim && isfinite(grads[i * dim + j])) j++;
      return dynemb_error_set(
          DYNEMB_ENONFINITE,
          "table '%s': gradient for key %lld (batch position %zu, element "
          "%zu) is %g; nothing was applied. Fix the loss/inputs, clip "
          "gradients, or create the table with nonfinite_policy = "
          "DYNEMB_NONFINITE_SKIP",
          t->name, (long long)keys[i], i, j,
          (double)grads[i * dim + (j < dim ? j : 0)]);
    }
  return dynemb_error_set(DYNEMB_ENONFINITE,
                          "table '%s': the %u gradients of key %lld sum to a "
                          "non-finite value (overflow); nothing was applied. "
                          "Clip or scale the gradients",
                          t->name, q ? q->count : 0u,
                          (long long)(q ? q->key : 0));
}

/* The optimizer step on a row of the SSD tier: read, update, write back
 * (record `rec`; `*buf` is a row-sized scratch made on first use). */
static int ssd_apply_row(dynemb_table *t, const dynemb_optim_step *ostep,
                         uint32_t rec, const float *grad, float **buf) {
  if (!*buf && !(*buf = malloc((size_t)t->row_floats * sizeof(float))))
    return dynemb_error_set(DYNEMB_ENOMEM,
                            "table '%s': out of memory updating a row of the "
                            "SSD tier", t->name);
  float *row = *buf, *slots = row + t->dim;
  static float no_slots[1]; /* never written: SGD has no slots */
  int rc = dynemb_ssd_read(&t->ssd, rec, row, t->slots ? slots : NULL);
  if (rc) return rc;
  dynemb_optim_apply_row(ostep, row, t->slots ? slots : no_slots, grad, t->dim);
  return dynemb_ssd_write(&t->ssd, rec, row, t->slots ? slots : NULL);
}

/* Apply, in two phases so that a failure changes nothing:
 *  A (no locks): dedupe the batch's keys in batch order (firsts_table),
 *    sum the gradients of repeated keys in one pass over the caller's rows
 *    in batch order, check
 *    finiteness once per key (a NaN/Inf in any occurrence makes the sum
 *    non-finite; ERROR names the first bad gradient in batch order, or the
 *    key whose sum overflows); order the unique keys by shard;
 *  B: per shard, under the write lock, find the unique keys' rows (through
 *    a ticket's current place, else the index, prefetched ahead) and run the
 *    optimizer on each row (rows prefetched ahead).
 * Only the unique keys are sorted and probed: training batches repeat most
 * of their keys (bench/tf_train.py's: 30% unique). */
/* `trainable` NULL: every key with a row may train; else only its keys.
 * `tickets` NULL: rows are found by key; else (a prepared batch) only
 * keys admitted by a ticket train, at the ticket's place while it is
 * current. */
static int apply_impl(dynemb_table *t, const int64_t *keys, size_t n,
                      const float *grads, float learning_rate,
                      const key_set *trainable, const dynemb_ticket *tickets,
                      dynemb_apply_stats *stats) {
  dynemb_error_clear();
  if (stats) memset(stats, 0, sizeof *stats);
  if (!t) return dynemb_table_null_error("dynemb_apply");
  if (n > 0 && (!keys || !grads))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': apply of %zu keys got a NULL %s "
                            "buffer; pass valid keys and gradients",
                            t->name, n, keys ? "gradient" : "keys");
  if (n >= UINT32_MAX / 2)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': apply batch of %zu keys is too "
                            "large; apply fewer than 2^31-1 keys per call",
                            t->name, n);
  if (isnan(learning_rate) || isinf(learning_rate))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': learning rate %g is not finite; "
                            "pass a finite rate (or < 0 for the configured "
                            "one)",
                            t->name, (double)learning_rate);
  const float lr =
      learning_rate < 0 ? t->cfg.optimizer.learning_rate : learning_rate;
  const size_t dim = (size_t)t->dim, S = t->nshards;
  const int skip = t->cfg.nonfinite_policy == DYNEMB_NONFINITE_SKIP;
  firsts_table ft = {NULL, 0};
  uint32_t *inv = NULL, *ord = NULL, *seg = NULL;
  uniq *u = NULL;
  float *sum = NULL, *ssd_buf = NULL;
  int rc = DYNEMB_OK;
  size_t n_uniq = 0, n_applied = 0, n_dropped = 0, n_nonfinite = 0;
  if (n == 0) {
    __atomic_add_fetch(&t->apply_steps, 1, RELAXED);
    goto done;
  }
  if (firsts_init(&ft, n)) goto nomem;
  u = malloc(n * sizeof *u);
  inv = malloc(n * sizeof *inv);
  ord = malloc(n * sizeof *ord);
  seg = calloc(S + 1, sizeof *seg);
  if (!u || !inv || !ord || !seg) goto nomem;

  /* Phase A.1: dedupe in batch order; inv[i] is the unique of occurrence
   * i. */
  uint32_t multi_rows = 0, nu = 0;
  for (size_t i = 0; i < n; i++) {
    const int64_t key = keys[i];
    const uint64_t h = dynemb_hash_key(key);
    const uint32_t f = first_of(&ft, keys, h, (uint32_t)i);
    if (f == i) {
      uniq *q = &u[nu];
      q->key = key;
      q->hash = h;
      q->ticket = tickets ? tickets[i] : DYNEMB_NOT_ADMITTED;
      q->first = (uint32_t)i;
      q->count = 1;
      q->skip = 0;
      inv[i] = nu++;
    } else {
      uniq *q = &u[inv[f]];
      if (q->count++ == 1) multi_rows++;
      if (tickets && q->ticket == DYNEMB_NOT_ADMITTED) q->ticket = tickets[i];
      inv[i] = inv[f];
    }
  }
  n_uniq = nu;

  /* Phase A.2: sums, streaming the caller's rows in batch order (batch
   * order within a key). Where repeats are most of the batch (training
   * batches: 70% of bench/tf_train.py's ids) every key gets a sum row,
   * summed from zero as TF's UnsortedSegmentSum does: no branch per
   * occurrence, and the sums are one array for the finiteness check. Else
   * only repeated keys do (from their first row), and single keys update
   * from the caller's rows. */
  const int all_sums = 2 * (size_t)n_uniq <= n;
  const uint32_t sum_rows = all_sums ? nu : multi_rows;
  for (uint32_t k = 0, r = 0; k < nu; k++)
    u[k].acc = all_sums || u[k].count > 1 ? r++ : NO_SUM;
  if (sum_rows) {
    sum = all_sums ? calloc((size_t)sum_rows * dim, sizeof(float))
                   : malloc((size_t)sum_rows * dim * sizeof(float));
    if (!sum) goto nomem;
  }
  if (all_sums) {
    for (size_t i = 0; i < n; i++)
      add_row(sum + (size_t)inv[i] * dim, grads + i * dim, dim);
  } else if (multi_rows) {
    for (size_t i = 0; i < n; i++) {
      const uniq *q = &u[inv[i]];
      if (q->acc == NO_SUM) continue;
      float *acc = sum + (size_t)q->acc * dim;
      const float *x = grads + i * dim;
      if (i == q->first)
        copy_row(acc, x, dim);
      else
        add_row(acc, x, dim);
    }
  }
  /* Finiteness. A key's gradient is non-finite when one of its
   * occurrences is (NaN and Inf survive a sum) or when a sum overflows, so
   * checking every key's gradient (its sum, or its only row) finds them
   * all: first in bulk, the sums as one array and the single keys' rows
   * either in one streaming pass over the caller's gradients in batch order
   * (where most keys occur once: 4M x 64 Adam, 2 threads, 6 alternating
   * runs: uniform applies +9%, prepared +11% at the median, against reading
   * the rows again, scattered) or row by row; key by key only when
   * something is not finite. */
  const size_t singles = all_sums ? 0 : n_uniq - multi_rows;
  int bad = sum_rows && any_nonfinite(sum, (size_t)sum_rows * dim);
  if (!bad && 2 * singles > n) {
    bad = any_nonfinite(grads, n * dim);
  } else if (!bad && singles) {
    for (size_t k = 0; k < n_uniq && !bad; k++)
      bad = u[k].acc == NO_SUM &&
            any_nonfinite(grads + (size_t)u[k].first * dim, dim);
  }
  for (size_t k = 0; bad && k < n_uniq; k++) {
    uniq *q = &u[k];
    if (!any_nonfinite(uniq_grad(q, grads, sum, dim), dim)) continue;
    if (!skip) { /* the first bad gradient in batch order, or the sum */
      rc = nonfinite_error(t, keys, grads, n, q);
      goto done;
    }
    q->skip = 1;
    n_nonfinite++;
  }
  /* Keys outside the trainable set, or not admitted by any ticket in a
   * prepared apply, are treated as keys without a row. */
  if (tickets)
    for (size_t k = 0; k < n_uniq; k++)
      if (!u[k].skip && u[k].ticket == DYNEMB_NOT_ADMITTED) {
        u[k].skip = 1;
        n_dropped++;
      }
  if (trainable)
    for (size_t k = 0; k < n_uniq; k++)
      if (!u[k].skip && !key_set_has(trainable, u[k].key, u[k].hash)) {
        u[k].skip = 1;
        n_dropped++;
      }
  /* Phase A.3: the unique keys by shard (counting sort, first-occurrence
   * order within a shard): ord[seg[s] .. seg[s + 1]) are shard s's. */
  for (size_t k = 0; k < n_uniq; k++)
    seg[dynemb_table_shard_of(t, u[k].hash) + 1]++;
  for (size_t s = 0; s < S; s++) seg[s + 1] += seg[s];
  for (size_t k = 0; k < n_uniq; k++)
    ord[seg[dynemb_table_shard_of(t, u[k].hash)]++] = (uint32_t)k;
  for (size_t s = S; s > 0; s--) seg[s] = seg[s - 1]; /* back to starts */
  seg[0] = 0;

  /* Phase B: update the rows. */
  const uint64_t step = __atomic_add_fetch(&t->apply_steps, 1, RELAXED);
  dynemb_optim_step ostep; /* lr, Adam's alpha ...: once per call */
  dynemb_optim_prepare(&t->cfg.optimizer, lr, step, &ostep);
  const size_t emb_bytes = dim * sizeof(float);
  const size_t slot_bytes = (size_t)t->slots * dim * sizeof(float);
  static float no_slots[1]; /* never written: SGD has no slots */
  for (uint32_t s = 0; s < S; s++) {
    const uint32_t a = seg[s], b = seg[s + 1];
    if (a == b) continue;
    dynemb_shard *sh = &t->shards[s];
    pthread_rwlock_wrlock(&sh->lock);
    /* probe: a key without a row is skipped, and the hash field is
     * reused for the row's location (taken from a current ticket as is);
     * the rows in memory are located once, the first few prefetched here
     * (the update loop prefetches ahead of itself only within the shard) */
    for (uint32_t k = a; k < b; k++) {
      uniq *q = &u[ord[k]];
      if (tickets) {
        if (q->skip) continue;
        const dynemb_ticket tk = q->ticket;
        if (TICKET_SHARD(tk) == s && ticket_place_valid(sh, tk)) {
          q->hash = TICKET_LOC(tk);
          goto located;
        }
      } else if (k + IDX_PF < b) {
        dynemb_index_prefetch(&sh->rows, u[ord[k + IDX_PF]].hash);
      }
      dynemb_index_entry *e = dynemb_index_find(&sh->rows, q->key, q->hash);
      if (!e) {
        if (!q->skip) n_dropped++;
        q->skip = 1;
        continue;
      }
      q->hash = e->loc;
    located:
      if (q->skip || !on_host((uint32_t)q->hash)) continue;
      q->row = row_of(sh, (uint32_t)q->hash);
      q->slots = slot_bytes ? slots_of(sh, (uint32_t)q->hash) : no_slots;
      if (k - a < ROW_PF) {
        prefetch_lines(q->row, emb_bytes);
        prefetch_lines(q->slots, slot_bytes);
        prefetch_lines(uniq_grad(q, grads, sum, dim), emb_bytes);
      }
    }
    for (uint32_t k = a; k < b; k++) {
      const uniq *p = k + ROW_PF < b ? &u[ord[k + ROW_PF]] : NULL;
      if (p && !p->skip && on_host((uint32_t)p->hash)) {
        /* the row, and the gradient (scattered in the caller's array) */
        prefetch_lines(p->row, emb_bytes);
        prefetch_lines(p->slots, slot_bytes);
        prefetch_lines(uniq_grad(p, grads, sum, dim), emb_bytes);
      }
      const uniq *q = &u[ord[k]];
      if (q->skip) continue;
      const uint32_t loc = (uint32_t)q->hash;
      const float *g = uniq_grad(q, grads, sum, dim);
      if (!on_host(loc)) { /* updated in place on the SSD tier */
        rc = ssd_apply_row(t, &ostep, DYNEMB_LOC_NUM(loc), g, &ssd_buf);
        if (rc) break;
      } else {
        dynemb_optim_apply_row(&ostep, q->row, q->slots, g, t->dim);
      }
      n_applied++;
    }
    pthread_rwlock_unlock(&sh->lock);
    if (rc) goto done;
  }
  goto done;
nomem:
  rc = dynemb_error_set(DYNEMB_ENOMEM,
                        "table '%s': out of memory for an apply batch of %zu "
                        "keys; use smaller batches",
                        t->name, n);
done:
  free(ft.entries);
  free(u);
  free(inv);
  free(ord);
  free(seg);
  free(sum);
  free(ssd_buf);
  if (rc) n_uniq = n_nonfinite = 0;
  if (n_applied) ADD(&t->n_applied, (uint64_t)n_applied);
  if (n_dropped) ADD(&t->n_dropped, (uint64_t)n_dropped);
  if (n_nonfinite) ADD(&t->n_nonfinite, (uint64_t)n_nonfinite);
  if (stats) {
    stats->unique_keys = n_uniq;
    stats->applied = n_applied;
    stats->dropped_unknown = n_dropped;
    stats->skipped_nonfinite = n_nonfinite;
  }
  return rc;
}

