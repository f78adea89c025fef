/*
 * ckpt_format.h -- the format of one table's checkpoint file: its header
 * fields, where a reader takes bytes from, where a writer takes rows from,
 * and the encoder and decoder (ckpt_format.c).
 *
 * A header of its own (not ckpt.h) because the format sits below the
 * directory, the chain and the save and load flow: they use these types,
 * and the format uses nothing of theirs. The byte layout is documented in
 * docs/checkpoint-format.md.
 */
#ifndef DYNEMB_CKPT_FORMAT_H
#define DYNEMB_CKPT_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "dynemb.h"

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

#endif
