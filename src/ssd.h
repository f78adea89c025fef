/*
 * ssd.h -- the SSD tier of one table: a file of fixed-size row records.
 *
 * Rows have a fixed size, so the tier is a slot file (record i at offset
 * i * rec_bytes), a free list of record numbers and the key index that
 * already exists in memory (an index entry's location names the tier and
 * the record, index.h). A general key-value store would add its own index,
 * compaction and write amplification for nothing here.
 *
 * A record is the row's embedding followed by its optimizer slots (the
 * joined layout of snapshots). The file is anonymous: created with
 * O_TMPFILE (or made and unlinked at once where the file system lacks it),
 * so it never outlives the process and needs no cleanup; checkpoints, not
 * this file, are what persists.
 *
 * Records are read and written through shared mappings of the file
 * (segments of up to 64 MiB, mapped when the first record in them is handed
 * out, never moved), so a record that is in the page cache costs a memory
 * copy, not a system call: with positional I/O (pread/pwrite, one call per
 * moved row) the kernel's page-cache work was half of a training step's CPU
 * time (docs/benchmark-journal.md). The kernel writes dirty pages back and
 * drops clean ones under memory pressure, as it did for the page cache
 * behind pread. The file grows by posix_fallocate before a record past its
 * end is handed out, so a full disk is an EIO from dynemb_ssd_alloc (with
 * the table and directory named), never a fault on a later write.
 *
 * Several directories (mxRec's ssd_data_path list) are filled one after
 * the other: each gets a file when the one before it cannot take the next
 * segment (its disk is full: ENOSPC, EDQUOT, EFBIG), and then the file
 * grows a whole segment at a time, so that a segment never straddles two
 * files; the segments after it go to the next directory. One directory
 * grows its file gradually, as it needs. What the
 * mapping cannot turn into an error code: a media error while the kernel
 * reads a page back raises SIGBUS, as for any mapped file.
 *
 * Thread-safe: record allocation and file growth are under the store's
 * mutex; reads and writes of different records may run concurrently.
 * Callers (table.c) never touch one record from two threads at once: a
 * record belongs to one key, whose shard lock they hold.
 */
#ifndef DYNEMB_SSD_H
#define DYNEMB_SSD_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* Record numbers fit the 30-bit slot of a location (index.h). */
#define DYNEMB_SSD_MAX_RECORDS ((UINT64_C(1) << 30) - 1)

typedef struct dynemb_ssd {
  int fd;             /* the first directory's file; -1: no SSD tier */
  char *dir;          /* the directories as configured ('\n' between) */
  char **dirs;        /* [ndirs] each directory, for files and messages */
  int ndirs;
  int cur;            /* the directory that takes new segments (under mu) */
  int *fds;           /* [ndirs] each directory's file, -1 until needed */
  uint64_t *fbytes;   /* [ndirs] each file's allocated length (under mu) */
  uint64_t *first_seg; /* [ndirs] the first segment in each file */
  int *seg_file;      /* [nsegs] segment i's file, -1 until it has one */
  const char *table;  /* the table's name, for messages (not owned) */
  size_t emb_bytes;   /* embedding part of a record */
  size_t slot_bytes;  /* optimizer-slot part (may be 0) */
  size_t rec_bytes;   /* emb_bytes + slot_bytes */
  uint64_t capacity;  /* records at most (ssd_vocabulary_size) */
  unsigned seg_shift;   /* log2(seg_records) */
  uint64_t seg_records; /* records per mapped segment (a power of two) */
  uint64_t seg_bytes;   /* file bytes per segment (whole pages) */
  char **segs;          /* [nsegs]: segment i's mapping or NULL (atomics) */
  uint64_t nsegs;
  pthread_mutex_t mu; /* guards the fields below */
  uint32_t *free_list;
  uint64_t nfree, free_cap;
  uint64_t high; /* records ever handed out since the last reset (written
                    under mu, read with atomics) */
  uint64_t used; /* records holding a row now */
  uint64_t populated;  /* records' bytes claimed by dynemb_ssd_prefault,
                          as segment * seg_bytes + offset in the segment */
  uint64_t reads, writes; /* records read / written (relaxed atomics) */
  /* readahead policy (relaxed atomics): calls left that advise the kernel
   * of their records before reading them (dynemb_ssd_note_faults) */
  uint32_t ra_left;
} dynemb_ssd;

/* A store that is off (fd -1); dynemb_ssd_close on it is a no-op. */
void dynemb_ssd_init_off(dynemb_ssd *s);

/* Creates the anonymous record file in `dir` for table `table` (the
 * pointer is kept for messages); `dir` may list several directories, one
 * per line, filled in that order (the first one's file is made now, the
 * others' when needed). Errors: EIO (the first directory is missing or
 * not writable: the message names it and the fix), EINVAL (an empty
 * list), ENOMEM. */
int dynemb_ssd_open(dynemb_ssd *s, const char *dir, const char *table,
                    size_t emb_bytes, size_t slot_bytes, uint64_t capacity);
void dynemb_ssd_close(dynemb_ssd *s);

/* Gives an empty tier (no record handed out) records of another size: a
 * new file is made first, so an error (EIO, ENOMEM: message set) leaves
 * the tier as it was. */
int dynemb_ssd_relayout(dynemb_ssd *s, size_t emb_bytes, size_t slot_bytes);

static inline int dynemb_ssd_on(const dynemb_ssd *s) { return s->fd >= 0; }

/* A free record number. ECAPACITY (no message set) when `capacity`
 * records are in use; EIO (message names the table, the directory and the
 * system's reason) when the file cannot grow or its next segment cannot
 * be mapped (nothing changes then; a later call tries again); ENOMEM. */
int dynemb_ssd_alloc(dynemb_ssd *s, uint32_t *rec);
void dynemb_ssd_release(dynemb_ssd *s, uint32_t rec);

/* Writes / reads record `rec` (handed out by dynemb_ssd_alloc): the
 * embedding from/to `emb` and, if the table has slots and `slots` is not
 * NULL, the slots from/to `slots`. EIO with a message naming the table
 * when `rec` was never handed out since the last reset (past the file's
 * end). */
int dynemb_ssd_write(dynemb_ssd *s, uint32_t rec, const float *emb,
                     const float *slots);
int dynemb_ssd_read(dynemb_ssd *s, uint32_t rec, float *emb, float *slots);

/* Where record `rec` lives in the mappings, or NULL while its segment is
 * not mapped (the record was never handed out). */
static inline char *dynemb_ssd_addr(const dynemb_ssd *s, uint32_t rec) {
  char *seg = __atomic_load_n(&s->segs[rec >> s->seg_shift], __ATOMIC_ACQUIRE);
  return seg ? seg + (size_t)(rec & (s->seg_records - 1)) * s->rec_bytes : NULL;
}

/* Prefetches record `rec` (handed out by dynemb_ssd_alloc) into the
 * cache, ahead of a read of it (a prefetch never faults). */
static inline void dynemb_ssd_prefetch(const dynemb_ssd *s, uint32_t rec) {
  const char *p = dynemb_ssd_addr(s, rec);
  if (!p) return;
  for (uintptr_t a = (uintptr_t)p & ~(uintptr_t)63;
       a < (uintptr_t)p + s->rec_bytes; a += 64)
    __builtin_prefetch((const void *)a, 0, 2);
}

/* Faults in, writable, the pages of the next `nrec` records past the
 * high-water mark (growing the file over them first), so that moving rows
 * there does not take two page faults per fresh page, contended between
 * threads, under the caller's locks. Call it without locks held, before an
 * insert-heavy call. Best effort: errors are left to dynemb_ssd_alloc. */
void dynemb_ssd_prefault(dynemb_ssd *s, uint64_t nrec);

/* Reads of records whose pages the kernel dropped from the page cache are
 * synchronous page faults, one 4 KiB read at a time (~50 us each on the
 * benchmark VM's disk). A call that is about to read many records can ask
 * for all of them at once (dynemb_ssd_willneed: MADV_WILLNEED per record,
 * asynchronous readahead that keeps the device's queue full; measured 4x
 * on that disk), but that costs a system call per record when the pages
 * are in memory anyway. So it is done only while reads fault: a caller
 * asks dynemb_ssd_readahead_wanted, reads, and reports the major faults
 * its thread took meanwhile (dynemb_ssd_thread_major_faults) with
 * dynemb_ssd_note_faults; any major fault turns readahead on for the next
 * DYNEMB_SSD_READAHEAD_CALLS calls, which count it down when they fault
 * no more. */
#define DYNEMB_SSD_READAHEAD_CALLS 16
int dynemb_ssd_readahead_wanted(const dynemb_ssd *s);
void dynemb_ssd_willneed(const dynemb_ssd *s, const uint32_t *recs, size_t n);
uint64_t dynemb_ssd_thread_major_faults(void);
void dynemb_ssd_note_faults(dynemb_ssd *s, uint64_t major_faults,
                            int read_ahead);
/* The policy around a batch of reads of records `recs`: begin advises
 * them if wanted and notes the thread's faults so far, end reports. */
typedef struct dynemb_ssd_batch {
  uint64_t faults;
  int read_ahead;
} dynemb_ssd_batch;
void dynemb_ssd_batch_begin(dynemb_ssd *s, const uint32_t *recs, size_t n,
                            dynemb_ssd_batch *b);
void dynemb_ssd_batch_end(dynemb_ssd *s, const dynemb_ssd_batch *b);

/* Frees every record and truncates the files (table clear / replace); no
 * record may be in use by another thread. With one directory the segments
 * stay mapped; with several they are unmapped, and fill the directories in
 * order again. */
void dynemb_ssd_reset(dynemb_ssd *s);

/* Records in use; records ever handed out since the last reset (the
 * file's length in records). */
uint64_t dynemb_ssd_used(dynemb_ssd *s);
uint64_t dynemb_ssd_high(dynemb_ssd *s);

#endif
