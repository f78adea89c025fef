/*
 * ckpt_chain.h -- the chain of incremental checkpoints as readers see it:
 * a delta directory names the one it builds on, down to a full checkpoint
 * (ckpt_chain.c).
 *
 * The delta room is two files: ckpt_chain.c (this header) reads and
 * merges chains and owns the removed-keys file; ckpt_delta.c (ckpt_delta.h)
 * finds what changed since a table's last save. Both sit below the save
 * and load flow (ckpt.c), which calls them and is never called back.
 */
#ifndef DYNEMB_CKPT_CHAIN_H
#define DYNEMB_CKPT_CHAIN_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt_dir.h"
#include "ckpt_manifest.h"
#include "dynemb.h"

/* Longest chain of incremental checkpoints a reader follows (a loop of
 * directories, which no save makes, stops there). */
#define DYNEMB_CKPT_CHAIN_MAX 1000

/* The keys of one table removed since the checkpoint a delta builds on. */
typedef struct dynemb_ckpt_removed {
  const char *name;
  const int64_t *rows; /* rows gone (evicted, or now a candidate) */
  size_t nrows;
  const int64_t *cands; /* candidates gone (evicted; a candidate that became
                         * a row is replaced by the row's import) */
  size_t ncands;
} dynemb_ckpt_removed;

/* What makes a save incremental (the save flow writes it into the
 * MANIFEST's delta line and the removed-keys file). */
typedef struct dynemb_ckpt_delta {
  const char *parent;  /* the directory it builds on, as the MANIFEST says */
  uint32_t parent_crc; /* that directory's MANIFEST CRC32 */
  size_t n;
  const dynemb_ckpt_removed *tables;
} dynemb_ckpt_delta;

/* The removed-keys file of a delta: writes `d`'s lists (size and CRC32 of
 * the file in *bytes, *crc), and reads table `name`'s lists back from
 * file `e` of directory `dfd`, verified (malloc'ed arrays). Errors: EIO,
 * ECORRUPT (also: no lists for `name`), ENOMEM. */
int dynemb_ckpt_removed_write(int fd, const char *what,
                              const dynemb_ckpt_delta *d, uint64_t *bytes,
                              uint32_t *crc);
int dynemb_ckpt_removed_read(int dfd, const dynemb_manifest_entry *e,
                             const char *what, const char *name,
                             int64_t **rows, size_t *nrows, int64_t **cands,
                             size_t *ncands);

/* *out = base with the keys removed and delta's rows and candidates put in
 * (what loading the chain does to a table), sorted by key. EMISMATCH if
 * the layouts differ (`what` names the delta), ENOMEM. */
int dynemb_ckpt_apply_delta(const dynemb_snapshot *base, const int64_t *rk,
                            size_t nr, const int64_t *ck, size_t nc,
                            const dynemb_snapshot *delta, const char *what,
                            dynemb_snapshot *out);

/* *out: the directory that incremental checkpoint `d` (opened from `dir`,
 * `depth` steps up the chain) builds on, canonical and malloc'ed, checked
 * to be the one it was written against (its MANIFEST's CRC). Errors:
 * ECORRUPT (gone, saved again, or a chain past DYNEMB_CKPT_CHAIN_MAX),
 * ENOMEM. */
int dynemb_ckpt_chain_parent(const char *dir, const dynemb_ckpt_dir *d,
                             int depth, char **out);

/* Table `name` of delta directory `d`: its snapshot (NULL: only verified)
 * and the keys removed since the checkpoint it builds on (malloc'ed). */
int dynemb_ckpt_delta_read(dynemb_ckpt_dir *d, const char *name,
                           dynemb_snapshot *snap, int64_t **rk, size_t *nr,
                           int64_t **ck, size_t *nc);

/* Table `name` of checkpoint `dir`, full or the end of a chain, read whole
 * into `snap` (a chain merged in memory). */
int dynemb_ckpt_chain_read(const char *dir, const char *name,
                           dynemb_snapshot *snap);

/* Verifies every file of table `name` (NULL: of every table) in `dir` and
 * in the chain below it, down to its full checkpoint. */
int dynemb_ckpt_chain_verify(const char *dir, const char *name);

#endif
