/*
 * ckpt_delta.h -- delta tracking: what changed in a table since its last
 * tracked save, and what that save leaves for the next one (ckpt_delta.c).
 *
 * The incremental save is one flow in ckpt.c around these two steps:
 * begin decides whether the save can be a delta and collects what to
 * write, the caller saves it as any checkpoint, and end keeps what the
 * next save compares with. The save flow calls this room; this room never
 * calls the save flow, so the directory save stays in one place and the
 * dependency runs one way.
 */
#ifndef DYNEMB_CKPT_DELTA_H
#define DYNEMB_CKPT_DELTA_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt_chain.h"
#include "ckpt_format.h"
#include "dynemb.h"

/* One incremental save's state, from begin to end. The first five fields
 * are what the caller saves; the rest is this room's. */
typedef struct dynemb_delta_save {
  const char **names;             /* [n] the tables' names */
  const dynemb_snapshot **snaps;  /* [n] what to write of each */
  const dynemb_ckpt_rows **rows;  /* [n] NULL, or where its rows stream from */
  const dynemb_ckpt_delta *delta; /* NULL: a full save */
  size_t n;
  int started; /* the tables' tracks are involved: end settles them */
  dynemb_table *const *tables;
  struct dynemb_delta_diff *diffs;
  dynemb_ckpt_removed *removed;
  dynemb_ckpt_delta d;
  char *parent_dir; /* the base's real path (a delta) */
  char *rel;        /* the base as the MANIFEST names it (from `dir`) */
  int is_delta;
} dynemb_delta_save;

/* Starts the incremental save of tables[0..n) into `dir` (full: never a
 * delta). A delta is made when every table was tracked by the same
 * earlier save whose directory still holds what that save wrote;
 * otherwise a full save. On success the caller saves s->names, s->snaps,
 * s->rows and s->delta into `dir`. Always call dynemb_delta_save_end
 * after, with the status. Errors: EINVAL (arguments; `dir` is the base's
 * own directory), EIO, ENOMEM, and those of snapshotting a table. */
int dynemb_delta_save_begin(dynemb_delta_save *s, const char *dir,
                            dynemb_table *const *tables, size_t n, int full);

/* Ends it: `rc` is the status so far, `manifest_crc` the CRC32 of the
 * MANIFEST the save wrote. On success every table's track becomes this
 * save's (the next delta builds on it) and *delta_out (may be NULL) tells
 * whether it was a delta; on failure the tracks are dropped, so the next
 * save is full. Releases the SSD tables' read locks and frees `s`.
 * Returns `rc`, or EIO or ENOMEM of its own. */
int dynemb_delta_save_end(dynemb_delta_save *s, const char *dir, int rc,
                          uint32_t manifest_crc, int *delta_out);

#endif
