/*
 * ckpt.h -- internal interfaces of the checkpoint code.
 *
 * Checkpoints are split by concern over six files:
 *   ckpt_io.c        POSIX file I/O (full writes, reads, fsync) and the
 *                    test-only crash injection that the writers go through;
 *   ckpt_format.c    the per-table binary file (header, checksummed
 *                    sections), streamed in blocks, readable from a file or
 *                    from memory (the fuzz target);
 *   ckpt_manifest.c  the MANIFEST text file (table name -> file, size, CRC);
 *   ckpt.c           the directory: atomic save, load, inspect, verify,
 *                    and following a chain of incremental checkpoints;
 *   ckpt_delta.c     incremental saves: what changed since the last one
 *                    (fingerprints), the removed-keys file, a chain merged
 *                    in memory;
 *   ckpt_parts.c     the parts of a checkpoint several ranks wrote
 *                    (rank-<r>-of-<N>, one engine checkpoint each).
 * The byte layout is documented in docs/checkpoint-format.md.
 */
#ifndef DYNEMB_CKPT_H
#define DYNEMB_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "dynemb.h"

/* ---- little-endian encoding (explicit, independent of the host) --------- */

static inline void dynemb_le_put32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
  p[2] = (unsigned char)(v >> 16);
  p[3] = (unsigned char)(v >> 24);
}

static inline void dynemb_le_put64(unsigned char *p, uint64_t v) {
  dynemb_le_put32(p, (uint32_t)v);
  dynemb_le_put32(p + 4, (uint32_t)(v >> 32));
}

static inline uint32_t dynemb_le_get32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

static inline uint64_t dynemb_le_get64(const unsigned char *p) {
  return (uint64_t)dynemb_le_get32(p) |
         (uint64_t)dynemb_le_get32(p + 4) << 32;
}

/* ---- ckpt_io.c: file I/O with crash injection ----------------------------- */

/* Test-only crash injection. -1 (the default) disables it. Otherwise every
 * checkpoint write(), fsync, rename and unlink first spends one unit; the
 * operation that finds the budget at 0 kills the process with SIGKILL (a
 * write is first done half, to leave a torn file), as a crash at that exact
 * point would. Tests set it in a forked child. */
extern long dynemb_ckpt_fault_budget;

/* Spends one unit of the budget before a metadata operation (may not
 * return, see above). */
void dynemb_ckpt_fault_point(void);

/* Writes all `n` bytes to `fd` (retrying short writes and EINTR). Returns 0
 * or an errno value. */
int dynemb_ckpt_write_all(int fd, const void *buf, size_t n);

/* Reads exactly `n` bytes from `fd` at its current offset. Returns 0, an
 * errno value, or -1 when the file ended first. */
int dynemb_ckpt_read_all(int fd, void *buf, size_t n);

/* fsync with EINTR retry and the fault point. Returns 0 or an errno value. */
int dynemb_ckpt_fsync(int fd);

/* ---- ckpt_format.c: one table's file -------------------------------------- */

/* Bytes of the fixed part of the header (before the name). */
#define DYNEMB_CKPT_HEADER_FIXED 64u
/* Longest table name a file may carry. */
#define DYNEMB_CKPT_MAX_NAME 65536u
/* Streaming block size for encode and decode. */
#define DYNEMB_CKPT_BLOCK ((size_t)1 << 20)

/* Header fields of a table file. */
typedef struct dynemb_ckpt_header {
  uint32_t version;
  uint32_t header_bytes;
  int dim;
  int row_floats;
  int optimizer_kind;
  uint64_t apply_steps;
  uint64_t rows;
  uint64_t candidates;
  char *name; /* malloc'ed, NUL-terminated */
} dynemb_ckpt_header;

void dynemb_ckpt_header_free(dynemb_ckpt_header *h);

/* Where a reader takes its bytes from: a file descriptor (positioned at
 * the file start) or a memory buffer (fd < 0). `size` is the total number of
 * bytes available; `crc` accumulates CRC32 over every byte consumed. */
typedef struct dynemb_ckpt_src {
  int fd;
  const unsigned char *mem;
  uint64_t size;
  uint64_t pos;
  uint32_t crc;
} dynemb_ckpt_src;

void dynemb_ckpt_src_fd(dynemb_ckpt_src *src, int fd, uint64_t size);
void dynemb_ckpt_src_mem(dynemb_ckpt_src *src, const void *data, size_t size);

/* Checks a snapshot can be written (dims, optimizer, sorted keys, arrays
 * present; the values array only if `need_values`). `name` is the table
 * name; `what` prefixes messages. */
int dynemb_ckpt_snapshot_check(const dynemb_snapshot *snap, const char *name,
                               const char *what, int need_values);

/* Where the values section's rows come from when the snapshot has no
 * values array (tables larger than memory): fn fills rows [first, first +
 * n), row_floats floats each, in key order, into `out` and returns a dynemb
 * status with its message set. */
typedef struct dynemb_ckpt_rows {
  int (*fn)(void *ctx, size_t first, size_t n, float *out);
  void *ctx;
} dynemb_ckpt_rows;

/* Streams table `name` with contents `snap` to `fd` in the table file
 * format; the values come from snap->values, or from `source` when it is
 * not NULL (snap->values is then ignored). On success *bytes and *crc hold
 * the file's size and CRC32. `what` (e.g. "checkpoint '/d': file 'x.tmp'")
 * prefixes error messages. Errors: EINVAL (snapshot not writable), EIO,
 * ENOMEM, and those of source->fn. */
int dynemb_ckpt_table_write(int fd, const char *what, const char *name,
                            const dynemb_snapshot *snap,
                            const dynemb_ckpt_rows *source, uint64_t *bytes,
                            uint32_t *crc);

/* Reads and checks only the header (its CRC included). `what` prefixes
 * error messages. Errors: ECORRUPT, EVERSION, EIO, ENOMEM. */
int dynemb_ckpt_table_read_header(dynemb_ckpt_src *src, const char *what,
                                  dynemb_ckpt_header *h);

/* Reads a whole table file: header, sizes, every section and its CRC, key
 * order. `snap` NULL only verifies (memory stays one block); otherwise the
 * snapshot is filled (free it with dynemb_snapshot_free) and is left empty
 * on error. `h` may be NULL. Errors: ECORRUPT, EVERSION, EIO, ENOMEM. */
int dynemb_ckpt_table_read(dynemb_ckpt_src *src, const char *what,
                           dynemb_ckpt_header *h, dynemb_snapshot *snap);

/* ---- ckpt_manifest.c: the MANIFEST -------------------------------------- */

#define DYNEMB_CKPT_MANIFEST "MANIFEST"
/* Largest MANIFEST a reader accepts. */
#define DYNEMB_CKPT_MANIFEST_MAX ((size_t)64 << 20)

typedef struct dynemb_manifest_entry {
  char *name;     /* table name (any bytes but NUL) */
  char *file;     /* file name inside the directory */
  uint64_t bytes; /* file size */
  uint32_t crc;   /* CRC32 of the whole file */
} dynemb_manifest_entry;

typedef struct dynemb_manifest {
  uint64_t generation; /* save counter; file names carry it */
  size_t n;
  dynemb_manifest_entry *entries; /* sorted by name, names unique */
  /* An incremental checkpoint (format version 2, a "delta" line): the
   * directory of the checkpoint it builds on (absolute, or relative to this
   * directory), the CRC32 of that directory's MANIFEST when this one was
   * written, and the file of the keys removed since then
   * (ckpt_delta.c). parent == NULL: a full checkpoint (version 1). */
  char *parent;
  uint32_t parent_crc;
  dynemb_manifest_entry removed; /* name unused */
} dynemb_manifest;

/* Parses MANIFEST text. `what` prefixes messages. Errors: ECORRUPT,
 * EVERSION, ENOMEM. On error *m is empty. */
int dynemb_manifest_parse(const char *text, size_t len, const char *what,
                          dynemb_manifest *m);

/* Formats `m` (entries must be sorted and unique) into a malloc'ed text.
 * Errors: ENOMEM. */
int dynemb_manifest_format(const dynemb_manifest *m, char **text,
                           size_t *len);

/* Whether `file` is a name the writer may have produced (a table file of
 * some generation, or a temporary), so that save may delete it when the
 * MANIFEST no longer refers to it. */
int dynemb_manifest_owns_file(const char *file);

/* Whether `file` is a safe plain file name (no '/', no leading '.'). */
int dynemb_manifest_safe_file(const char *file);

void dynemb_manifest_free(dynemb_manifest *m);

/* Finds `name`; NULL if absent. */
const dynemb_manifest_entry *dynemb_manifest_find(const dynemb_manifest *m,
                                                  const char *name);

/* ---- ckpt_delta.c: incremental checkpoints -------------------------------- */

/* The keys of one table removed since the checkpoint a delta builds on. */
typedef struct dynemb_ckpt_removed {
  const char *name;
  const int64_t *rows; /* rows gone (evicted, or now a candidate) */
  size_t nrows;
  const int64_t *cands; /* candidates gone (evicted; a candidate that became
                         * a row is replaced by the row's import) */
  size_t ncands;
} dynemb_ckpt_removed;

/* What makes a save incremental (dynemb_ckpt_save_delta). */
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

/* ---- ckpt.c: directory-level operations ----------------------------------- */

/* Creates `dir` and its missing parents (`what` prefixes errors: EIO). */
int dynemb_ckpt_mkdirs(const char *dir, const char *what);

/* CRC32 of directory `dir`'s MANIFEST file (what a delta records of the
 * checkpoint it builds on). Errors: EIO, ECORRUPT. */
int dynemb_ckpt_manifest_crc(const char *dir, uint32_t *crc);

/* What dynemb_ckpt_save_with adds to dynemb_ckpt_save_snapshots. */
typedef struct dynemb_ckpt_save_opts {
  /* NULL, or per table NULL or where its rows come from (streamed, e.g.
   * from a table reader; the snapshot then has no values) */
  const dynemb_ckpt_rows *const *rows;
  /* non-NULL: an incremental checkpoint, into a directory that holds no
   * checkpoint yet (EINVAL otherwise) */
  const dynemb_ckpt_delta *delta;
  uint32_t manifest_crc; /* out: CRC32 of the MANIFEST written */
} dynemb_ckpt_save_opts;

/* dynemb_ckpt_save_snapshots with `o` (may be NULL). A full save into a
 * directory that holds an incremental checkpoint is EINVAL. */
int dynemb_ckpt_save_with(const char *dir, const char *const *names,
                          const dynemb_snapshot *const *snaps, size_t n,
                          dynemb_ckpt_save_opts *o);

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
