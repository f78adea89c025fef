/*
 * ckpt_manifest.h -- the MANIFEST of a checkpoint directory: which table
 * lives in which file, with the file's size and CRC32, and for an
 * incremental checkpoint the directory it builds on (ckpt_manifest.c).
 *
 * The MANIFEST is what makes a directory a checkpoint, so everything about
 * it is here: its text (parsed and formatted), reading it from a
 * directory, and the CRC32 of the whole file that a delta records of the
 * checkpoint it builds on. Both the chain of deltas and the save flow use
 * it; it uses only the I/O room.
 */
#ifndef DYNEMB_CKPT_MANIFEST_H
#define DYNEMB_CKPT_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

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
   * (ckpt_chain.c). parent == NULL: a full checkpoint (version 1). */
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

/* Reads and parses the MANIFEST of open directory `dfd`; *exists tells
 * whether there was one (none: OK with *m empty). `what` prefixes
 * messages. Errors: EIO, ECORRUPT, EVERSION, ENOMEM. */
int dynemb_manifest_read(int dfd, const char *what, dynemb_manifest *m,
                         int *exists);

/* CRC32 of directory `dir`'s MANIFEST file (what a delta records of the
 * checkpoint it builds on). Errors: EIO, ECORRUPT. */
int dynemb_ckpt_manifest_crc(const char *dir, uint32_t *crc);

#endif
