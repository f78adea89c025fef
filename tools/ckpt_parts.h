/*
 * ckpt_parts.h -- a checkpoint as the `dynemb ckpt` subcommands read it:
 * its parts (one per rank that wrote it, or the directory itself when one
 * process did) with each part's tables, and the tables summed over parts.
 * inspect, verify and export all start here, so they agree on what a
 * checkpoint of several ranks holds.
 */
#ifndef DYNEMB_TOOLS_CKPT_PARTS_H
#define DYNEMB_TOOLS_CKPT_PARTS_H

#include <stddef.h>
#include <stdint.h>

#include "dynemb.h"

typedef struct ckpt_part {
  const char *path;       /* the part's directory */
  const char *label;      /* "rank-<r>-of-<N>", or the directory itself */
  dynemb_ckpt_entry *entries;
  size_t n;
  char *base;             /* what an incremental part builds on, or NULL */
} ckpt_part;

/* A table summed over the parts that hold it (rows, candidates, bytes);
 * dim, layout, optimizer and version are the first part's, apply_steps the
 * largest. */
typedef struct ckpt_total {
  const char *name;       /* (a part's entry owns it) */
  uint64_t rows, candidates, apply_steps, file_bytes;
  int dim, row_floats, optimizer_kind, format_version;
  size_t parts;           /* how many parts hold it */
  const ckpt_part *differs; /* a part whose dim/layout/optimizer differs */
} ckpt_total;

typedef struct ckpt_parts {
  const char *dir;
  int ranked;             /* written by several ranks (parts rank-r-of-N) */
  char **paths;           /* dynemb_checkpoint_parts' block */
  ckpt_part *part;
  size_t n;
  ckpt_total *total;      /* sorted by name (byte order) */
  size_t ntotal;
} ckpt_parts;

/* Lists the parts of checkpoint `dir` and reads each one's MANIFEST and
 * table headers (`headers` 0: the part list only). On error prints
 * "dynemb ckpt <cmd>: ..." naming the part and returns nonzero. */
int ckpt_parts_open(const char *dir, const char *cmd, int headers,
                    ckpt_parts *p);
void ckpt_parts_close(ckpt_parts *p);

/* The table's entry in part `part`, or NULL. */
const dynemb_ckpt_entry *ckpt_parts_find(const ckpt_part *part,
                                         const char *name);

#endif
