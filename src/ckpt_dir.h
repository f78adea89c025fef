/*
 * ckpt_dir.h -- a checkpoint directory opened for reading: its shared
 * lock, its MANIFEST, and its table files read and checked against what
 * the MANIFEST says of them (ckpt_dir.c).
 *
 * Loading, verifying, inspecting and following a chain of deltas all read
 * a directory the same way; this room is that way, below both the chain
 * (ckpt_chain.c) and the load flow (ckpt.c), so that neither reaches into
 * the other to open a checkpoint.
 */
#ifndef DYNEMB_CKPT_DIR_H
#define DYNEMB_CKPT_DIR_H

#include <stdint.h>

#include "ckpt_format.h"
#include "ckpt_io.h"
#include "ckpt_manifest.h"
#include "dynemb.h"

/* An open checkpoint directory (shared lock) and its MANIFEST. */
typedef struct dynemb_ckpt_dir {
  int dfd;
  dynemb_manifest m;
  char what[DYNEMB_CKPT_WHAT_MAX]; /* "checkpoint '<dir>'", for messages */
} dynemb_ckpt_dir;

/* Opens `dir` for reading. Errors: EINVAL (no path), EIO (also: no
 * MANIFEST), ECORRUPT, EVERSION, ENOMEM. Closed again on error. */
int dynemb_ckpt_dir_open(const char *dir, dynemb_ckpt_dir *d);
void dynemb_ckpt_dir_close(dynemb_ckpt_dir *d);

/* The MANIFEST's entry of table `name`; NULL (ENOTFOUND set, the message
 * lists the tables there) if it has none. */
const dynemb_manifest_entry *dynemb_ckpt_dir_find(dynemb_ckpt_dir *d,
                                                  const char *name);

/* Reads table file `e`: header only (snap unused), or everything (snap NULL
 * verifies without keeping data), checking size, CRC and table name
 * against the MANIFEST. *file_bytes (may be NULL) gets the file's size.
 * Errors: ECORRUPT (also: the file is missing), EVERSION, EIO, ENOMEM. */
int dynemb_ckpt_dir_read_table(dynemb_ckpt_dir *d,
                               const dynemb_manifest_entry *e,
                               int header_only, dynemb_ckpt_header *h,
                               dynemb_snapshot *snap, uint64_t *file_bytes);

/* Table `name` read whole into `snap` (NULL: verified only). Errors: those
 * of find and read_table. */
int dynemb_ckpt_dir_read(dynemb_ckpt_dir *d, const char *name,
                         dynemb_snapshot *snap);

#endif
