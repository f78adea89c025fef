/*
 * table.h -- the table object as the engine's other modules see it
 * (registry.c, ckpt.c). The table's own files share table_int.h.
 *
 * Lifetime: registry.c owns the name -> table map and the reference count
 * (the table's link, below); it calls dynemb_table_new and
 * dynemb_table_destroy.
 */
#ifndef DYNEMB_TABLE_H
#define DYNEMB_TABLE_H

#include <stdint.h>

#include "dynemb.h"

/* The registry's bookkeeping in every table (registry.c owns it): the
 * table's first member, so a table pointer converts to a pointer to it. */
typedef struct dynemb_table_link {
  int refs;       /* atomic */
  int registered; /* under the registry mutex */
} dynemb_table_link;

static inline dynemb_table_link *dynemb_table_link_of(dynemb_table *t) {
  return (dynemb_table_link *)(void *)t;
}

/* Validates `cfg` (every field; the message names the table and the fix)
 * and builds an unregistered table with refs = 1. */
int dynemb_table_new(const dynemb_table_config *cfg, dynemb_table **out);
void dynemb_table_destroy(dynemb_table *t);

/* Removes the rows of keys rows[0..nrows) and the admission candidates of
 * keys cands[0..ncands) (keys the table lacks are skipped), under every
 * shard's write lock (evict.c). */
void dynemb_table_remove_keys(dynemb_table *t, const int64_t *rows,
                              size_t nrows, const int64_t *cands,
                              size_t ncands);

/* Whether the table has an SSD tier (its checkpoints stream rows). */
int dynemb_table_has_ssd(const dynemb_table *t);

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

#endif
