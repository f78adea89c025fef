/*
 * ckpt_io.h -- the I/O room of checkpoints: bytes, files and directories.
 *
 * Everything a checkpoint does to the file system goes through here: the
 * little-endian encoding of numbers, full reads and writes, fsync, and the
 * directory steps that make a save atomic (create the directory, lock it,
 * write a file under a temporary name and rename it, sync the directory).
 * Keeping them in one room below the format, the MANIFEST and the save and
 * load flow lets a test stop a save at any exact point (crash injection)
 * and lets every other checkpoint file depend on this one only downward.
 */
#ifndef DYNEMB_CKPT_IO_H
#define DYNEMB_CKPT_IO_H

#include <stddef.h>
#include <stdint.h>

/* Bytes of a message prefix that names a checkpoint, its file and table
 * (longer names are cut). */
#define DYNEMB_CKPT_WHAT_MAX 1024

/* Formats such a prefix into buf[DYNEMB_CKPT_WHAT_MAX], cutting long names
 * (a function, so that every room cuts them the same way and the compiler
 * does not take the cut for a mistake). */
void dynemb_ckpt_what(char *buf, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

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

/* ---- files, with crash injection ------------------------------------------ */

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

/* The same at offset `off` (pread; the file offset does not move). */
int dynemb_ckpt_pread_all(int fd, void *buf, size_t n, uint64_t off);

/* fsync with EINTR retry and the fault point. Returns 0 or an errno value. */
int dynemb_ckpt_fsync(int fd);

/* ---- directories ---------------------------------------------------------- */

/* fsync of a directory; 0 where the file system cannot sync directories. */
int dynemb_ckpt_fsync_dir(int dfd);

/* Creates `dir` and its missing parents, syncing the parent of each one it
 * creates (`what` prefixes errors: EIO, ENOMEM). */
int dynemb_ckpt_mkdirs(const char *dir, const char *what);

/* Opens directory `dir` (created first if `create`) and takes flock
 * `lock` (LOCK_EX for a save, LOCK_SH for readers, so that a save never
 * deletes files a reader is about to open; where flock is unsupported it
 * goes on unlocked). Errors: EIO (the message says when nothing was saved
 * there), ENOMEM. */
int dynemb_ckpt_open_dir(const char *dir, int create, int lock,
                         const char *what, int *dfd);

/* Produces a file's contents into `fd` (`what` prefixes errors). */
typedef int (*dynemb_ckpt_content_fn)(int fd, const char *what, void *ctx);

/* Writes file `tmp` of directory `dfd` with `fn`, fsyncs it and renames it
 * to `final`; on error `tmp` is removed. Errors: EIO and those of fn. */
int dynemb_ckpt_write_atomic(int dfd, const char *tmp, const char *final,
                             const char *what, dynemb_ckpt_content_fn fn,
                             void *ctx);

#endif
