/*
 * index.c -- growth, insertion and backward-shift deletion of the
 * open-addressing key index (layout and probing rules are in index.h).
 *
 * Growth multiplies an exact floating capacity by DYNEMB_INDEX_GROWTH and
 * rounds down, so a shard keeps its stagger (see dynemb_index_init) however
 * often it grows; a rehash touches only one shard's index.
 */
#include "index.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dynemb.h"
#include "hash.h"

/* The entry an unallocated index points at: a probe finds it empty. It is
 * never written, because every insert reserves (and so allocates) first. */
static dynemb_index_entry empty_entry = {0, DYNEMB_LOC_EMPTY, 0};

#define FIRST_CAP 8.0

void dynemb_index_init(dynemb_index *ix, double stagger) {
  memset(ix, 0, sizeof *ix);
  ix->entries = &empty_entry;
  ix->cap = 1;
  ix->limit = 0;
  ix->cap_f = 0;
  if (!(stagger >= 0 && stagger < 1)) stagger = 0;
  ix->first_cap = FIRST_CAP * pow(DYNEMB_INDEX_GROWTH, stagger);
  ix->hash = dynemb_hash_key;
}

void dynemb_index_free(dynemb_index *ix) {
  if (ix->cap_f > 0) free(ix->entries);
  ix->entries = &empty_entry;
  ix->cap = 1;
  ix->count = 0;
  ix->limit = 0;
  ix->cap_f = 0;
}

void dynemb_index_reset(dynemb_index *ix) { dynemb_index_free(ix); }

void dynemb_index_clear_keep(dynemb_index *ix) {
  if (ix->cap_f > 0) memset(ix->entries, 0xff, ix->cap * sizeof *ix->entries);
  ix->count = 0;
}

static uint64_t limit_of(uint64_t cap) {
  uint64_t l = (uint64_t)((double)cap * DYNEMB_INDEX_MAX_LOAD);
  return l < cap ? l : cap - 1; /* always keep one empty entry */
}

double dynemb_index_growth_for(const dynemb_index *ix, uint64_t count) {
  if (count <= ix->limit) return 0;
  double cf = ix->cap_f > 0 ? ix->cap_f * DYNEMB_INDEX_GROWTH : ix->first_cap;
  /* fastrange maps 32 hash bits: the capacity must stay below 2^32. */
  while (cf < 4294967295.0 && limit_of((uint64_t)cf) < count)
    cf *= DYNEMB_INDEX_GROWTH;
  return cf < 4294967295.0 ? cf : -1;
}

static dynemb_index_entry *empty_entries(uint64_t cap) {
  dynemb_index_entry *s = malloc(cap * sizeof *s);
  if (s) memset(s, 0xff, cap * sizeof *s);
  return s;
}

int dynemb_index_spare_make(double cap_f, dynemb_index_spare *sp) {
  sp->cap_f = cap_f;
  sp->retired = NULL;
  sp->entries = cap_f > 0 ? empty_entries((uint64_t)cap_f) : NULL;
  return sp->entries || cap_f <= 0 ? DYNEMB_OK : DYNEMB_ENOMEM;
}

void dynemb_index_spare_free(dynemb_index_spare *sp) {
  free(sp->entries);
  free(sp->retired);
  sp->entries = NULL;
  sp->retired = NULL;
}

/* Whether capacity `have` is `want` or a later step of its growth ladder
 * (want * GROWTH^k, computed the way dynemb_index_growth_for does): a spare
 * made for a larger batch, or for this call's inserts plus another
 * thread's, is as good as one made for exactly the next step. */
static int on_ladder(double want, double have) {
  for (double c = want; c <= have && c < 4294967295.0; c *= DYNEMB_INDEX_GROWTH)
    if (c == have) return 1;
  return 0;
}

int dynemb_index_reserve_spare(dynemb_index *ix, uint64_t count,
                               dynemb_index_spare *sp) {
  double cf = dynemb_index_growth_for(ix, count);
  if (cf == 0) return DYNEMB_OK;
  if (cf < 0) return DYNEMB_ENOMEM;
  uint64_t cap = (uint64_t)cf;
  dynemb_index_entry *s;
  if (sp && sp->entries && on_ladder(cf, sp->cap_f)) { /* made ahead, empty */
    cf = sp->cap_f;
    cap = (uint64_t)cf;
    s = sp->entries;
    sp->entries = NULL;
  } else if (!(s = empty_entries(cap))) {
    return DYNEMB_ENOMEM;
  }
  if (ix->cap_f > 0) {
    const int direct = ix->hash == dynemb_hash_key;
    for (uint64_t i = 0; i < ix->cap; i++) {
      const dynemb_index_entry *e = ix->entries + i;
      if (e->loc == DYNEMB_LOC_EMPTY) continue;
      uint64_t h = direct ? dynemb_hash_key(e->key) : ix->hash(e->key);
      uint64_t j = ((uint64_t)(uint32_t)h * cap) >> 32;
      while (s[j].loc != DYNEMB_LOC_EMPTY)
        if (++j == cap) j = 0;
      s[j] = *e;
    }
    if (sp) { /* freed by the caller, after its lock */
      free(sp->retired); /* (a second growth in one locked section) */
      sp->retired = ix->entries;
    } else {
      free(ix->entries);
    }
  }
  ix->entries = s;
  ix->cap = cap;
  ix->cap_f = cf;
  ix->limit = limit_of(cap);
  return DYNEMB_OK;
}

int dynemb_index_reserve(dynemb_index *ix, uint64_t count) {
  return dynemb_index_reserve_spare(ix, count, NULL);
}

dynemb_index_entry *dynemb_index_insert(dynemb_index *ix, int64_t key,
                                        uint64_t h, uint32_t loc,
                                        uint32_t last_access) {
  uint64_t i = dynemb_index_home(ix, h);
  while (ix->entries[i].loc != DYNEMB_LOC_EMPTY)
    if (++i == ix->cap) i = 0;
  dynemb_index_entry *e = ix->entries + i;
  e->key = key;
  e->loc = loc;
  e->last_access = last_access;
  ix->count++;
  return e;
}

void dynemb_index_erase_at(dynemb_index *ix, uint64_t pos) {
  const uint64_t cap = ix->cap;
  uint64_t hole = pos, j = pos;
  for (;;) {
    if (++j == cap) j = 0;
    dynemb_index_entry *e = ix->entries + j;
    if (e->loc == DYNEMB_LOC_EMPTY) break;
    uint64_t h = ix->hash == dynemb_hash_key ? dynemb_hash_key(e->key)
                                              : ix->hash(e->key);
    uint64_t home = dynemb_index_home(ix, h);
    /* The entry may fill the hole if the hole lies on its probe path,
     * i.e. cyclically within [home, j]. */
    uint64_t d_home = j >= home ? j - home : j + cap - home;
    uint64_t d_hole = j >= hole ? j - hole : j + cap - hole;
    if (d_home >= d_hole) {
      ix->entries[hole] = *e;
      hole = j;
    }
  }
  ix->entries[hole].loc = DYNEMB_LOC_EMPTY;
  ix->count--;
}

size_t dynemb_index_bytes(const dynemb_index *ix) {
  return ix->cap_f > 0 ? (size_t)ix->cap * sizeof(dynemb_index_entry) : 0;
}
