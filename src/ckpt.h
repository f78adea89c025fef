/*
 * ckpt.h -- the table of contents of the checkpoint rooms, and the seams of
 * the save and load flow (ckpt.c) that tests and tools use.
 *
 * Checkpoints are split by concern; each room has a header of its own and
 * depends only on the rooms listed above it here:
 *   ckpt_io.h/.c        bytes, files and directories: little-endian
 *                       numbers, full reads and writes, fsync, mkdir -p, the
 *                       directory lock, the atomic write-and-rename, and the
 *                       test-only crash injection all of them go through;
 *   ckpt_format.h/.c    one table's file (header, checksummed sections),
 *                       streamed in blocks, readable from a file or from
 *                       memory (the fuzz target);
 *   ckpt_manifest.h/.c  the MANIFEST (table name -> file, size, CRC32):
 *                       its text, reading it, and its whole-file CRC32;
 *   ckpt_dir.h/.c       a directory opened for reading, its table files
 *                       checked against the MANIFEST;
 *   ckpt_chain.h/.c     the delta room's reading side: following a chain
 *                       of incremental checkpoints, merging it in memory,
 *                       and the removed-keys file;
 *   ckpt_delta.h/.c     the delta room's saving side: what changed since a
 *                       table's last save (fingerprints), begun and ended
 *                       around the directory save;
 *   ckpt.c (this)       the flow: atomic save (full and incremental), load
 *                       (whole, streamed, along a chain), read, verify,
 *                       inspect;
 *   ckpt_parts.c        the parts of a checkpoint several ranks wrote
 *                       (rank-<r>-of-<N>, one engine checkpoint each).
 * A room includes the headers of the rooms below it, never this one: this
 * one names them all, and including it would tie a room to the flow above.
 * The byte layout is documented in docs/checkpoint-format.md.
 */
#ifndef DYNEMB_CKPT_H
#define DYNEMB_CKPT_H

#include <stddef.h>

#include "ckpt_chain.h"
#include "ckpt_delta.h"
#include "ckpt_dir.h"
#include "ckpt_format.h"
#include "ckpt_io.h"
#include "ckpt_manifest.h"
#include "dynemb.h"

/* Rows per import step when loading into a table with an SSD tier
 * (dynemb_checkpoint_load streams such loads); 0, the default, means about
 * 64 MiB of values. Tests set it small to cross step boundaries. */
extern size_t dynemb_ckpt_load_chunk_rows;

/* Saves snapshots given directly instead of tables (the seam used by save,
 * by the format tests and by the fuzz seed generator): table names[i] gets
 * contents snaps[i]. Same semantics and errors as dynemb_checkpoint_save. */
int dynemb_ckpt_save_snapshots(const char *dir, const char *const *names,
                               const dynemb_snapshot *const *snaps, size_t n);

#endif
