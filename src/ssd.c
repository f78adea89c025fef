/*
 * ssd.c -- the SSD tier's record file: anonymous file creation, record
 * allocation (free list + high-water mark), file growth, and records read
 * and written through shared mappings of the file.
 *
 * Why by hand: the tier needs exactly "record i at a fixed place" with a
 * free list; the key -> record map is the table's own index. Why mappings:
 * a row moved between memory and the tier is a few hundred bytes, and the
 * system call plus the kernel's page-cache lookup and copy of pread/pwrite
 * cost ~1 us per row each way (BENCHMARKS.md); a mapped record in the page
 * cache is a memcpy. io_uring would batch the calls but not remove the
 * page-cache work per record (measured ~5% faster: docs/benchmark-journal.md).
 *
 * Layout: record r lives in segment r >> seg_shift at byte
 * (r & (seg_records - 1)) * rec_bytes; segment i starts at file offset
 * i * seg_bytes (seg_records * rec_bytes rounded up to whole pages, since
 * a mapping starts on a page). A segment is mapped whole (up to 64 MiB of
 * address space) when its first record is handed out and stays mapped
 * until close, so a record's address never changes.
 */
#include "ssd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "dynemb.h"
#include "error.h"

#define RELAXED __ATOMIC_RELAXED
#define SEG_TARGET_BYTES (UINT64_C(64) << 20) /* file bytes per segment */
#define GROW_MIN_BYTES (UINT64_C(1) << 20)    /* the file grows by >= 1 MiB */
/* ... and by at most 256 MiB at a time: where the file system has no
 * fallocate, glibc's posix_fallocate writes the blocks, under the mutex */
#define GROW_MAX_BYTES (UINT64_C(256) << 20)
#define NO_SEGMENT UINT64_MAX /* first_seg of a file without segments */

static uint64_t page_bytes(void) {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? (uint64_t)p : 4096;
}

static uint64_t round_up(uint64_t x, uint64_t to) {
  return (x + to - 1) / to * to;
}

void dynemb_ssd_init_off(dynemb_ssd *s) {
  memset(s, 0, sizeof *s);
  s->fd = -1;
}

/* An unnamed file in `dir`: O_TMPFILE where the file system supports it,
 * otherwise a unique name unlinked right away. Returns the fd or -1. */
static int anon_file(const char *dir) {
#ifdef O_TMPFILE
  int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) return -1;
#endif
  size_t n = strlen(dir) + sizeof "/dynemb-ssd-XXXXXX";
  char *path = malloc(n);
  if (!path) {
    errno = ENOMEM;
    return -1;
  }
  snprintf(path, n, "%s/dynemb-ssd-XXXXXX", dir);
  int fd2 = mkstemp(path);
  if (fd2 >= 0) {
    (void)unlink(path);
    (void)fcntl(fd2, F_SETFD, FD_CLOEXEC);
  }
  int e = errno;
  free(path);
  errno = e;
  return fd2;
}

/* Frees what dynemb_ssd_open allocated (files closed), leaving it off. */
static void free_store(dynemb_ssd *s) {
  for (int k = 0; s->fds && k < s->ndirs; k++)
    if (s->fds[k] >= 0) close(s->fds[k]);
  for (int k = 0; s->dirs && k < s->ndirs; k++) free(s->dirs[k]);
  free(s->dirs);
  free(s->fds);
  free(s->fbytes);
  free(s->first_seg);
  free(s->seg_file);
  free(s->segs);
  free(s->dir);
  dynemb_ssd_init_off(s);
}

/* s->dirs from the '\n'-separated list s->dir (empty lines skipped). */
static int split_dirs(dynemb_ssd *s) {
  int n = 0;
  for (const char *p = s->dir; *p;) {
    size_t len = strcspn(p, "\n");
    if (len) n++;
    p += len + (p[len] == '\n');
  }
  s->dirs = calloc(n ? (size_t)n : 1, sizeof *s->dirs);
  if (!s->dirs) return -1;
  for (const char *p = s->dir; *p;) {
    size_t len = strcspn(p, "\n");
    if (len && !(s->dirs[s->ndirs++] = strndup(p, len))) return -1;
    p += len + (p[len] == '\n');
  }
  return 0;
}

/* Directory k's file (made now if it has none yet). Caller holds s->mu
 * or owns the store. EIO with a message; *gone (may be NULL) says whether
 * the directory is missing, not one or read-only (not a passing error). */
static int open_file(dynemb_ssd *s, int k, int *gone) {
  if (gone) *gone = 0;
  if (s->fds[k] >= 0) return DYNEMB_OK;
  int fd = anon_file(s->dirs[k]);
  const int e = errno;
  if (fd < 0 && gone)
    *gone = e == ENOENT || e == ENOTDIR || e == EACCES || e == EROFS;
  errno = e;
  if (fd < 0)
    return dynemb_error_set(DYNEMB_EIO,
                            "table '%s': cannot create the SSD tier's file in "
                            "ssd_data_path '%s' (%s); pass an existing, "
                            "writable directory",
                            s->table, s->dirs[k], strerror(errno));
#ifdef POSIX_FADV_RANDOM
  (void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
#endif
  s->fds[k] = fd;
  return DYNEMB_OK;
}

int dynemb_ssd_open(dynemb_ssd *s, const char *dir, const char *table,
                    size_t emb_bytes, size_t slot_bytes, uint64_t capacity) {
  dynemb_ssd_init_off(s);
  s->table = table;
  s->emb_bytes = emb_bytes;
  s->slot_bytes = slot_bytes;
  s->rec_bytes = emb_bytes + slot_bytes;
  s->capacity = capacity;
  /* a power of two of records per segment (a shift and a mask per access),
   * the most that fit SEG_TARGET_BYTES, and no more than the capacity needs */
  unsigned shift = 0;
  while ((s->rec_bytes << (shift + 1)) <= SEG_TARGET_BYTES &&
         (UINT64_C(1) << shift) < capacity)
    shift++;
  s->seg_shift = shift;
  s->seg_records = UINT64_C(1) << shift;
  s->seg_bytes = round_up(s->seg_records * s->rec_bytes, page_bytes());
  s->nsegs = (capacity + s->seg_records - 1) >> shift;
  s->dir = strdup(dir);
  s->segs = calloc(s->nsegs ? s->nsegs : 1, sizeof *s->segs);
  s->seg_file = malloc((s->nsegs ? s->nsegs : 1) * sizeof *s->seg_file);
  if (!s->dir || !s->segs || !s->seg_file || split_dirs(s)) {
    free_store(s);
    return dynemb_error_set(DYNEMB_ENOMEM,
                            "table '%s': out of memory opening the SSD tier",
                            table);
  }
  for (uint64_t i = 0; i < s->nsegs; i++) s->seg_file[i] = -1;
  if (!s->ndirs) {
    free_store(s);
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': ssd_data_path names no directory; "
                            "pass one, or several one per line",
                            table);
  }
  s->fds = malloc((size_t)s->ndirs * sizeof *s->fds);
  s->fbytes = calloc((size_t)s->ndirs, sizeof *s->fbytes);
  s->first_seg = calloc((size_t)s->ndirs, sizeof *s->first_seg);
  if (!s->fds || !s->fbytes || !s->first_seg) {
    free_store(s);
    return dynemb_error_set(DYNEMB_ENOMEM,
                            "table '%s': out of memory opening the SSD tier",
                            table);
  }
  for (int k = 0; k < s->ndirs; k++) {
    s->fds[k] = -1;
    s->first_seg[k] = NO_SEGMENT;
  }
  int rc = open_file(s, 0, NULL);
  if (rc) {
    free_store(s);
    return rc;
  }
  pthread_mutex_init(&s->mu, NULL);
  s->fd = s->fds[0];
  return DYNEMB_OK;
}

void dynemb_ssd_close(dynemb_ssd *s) {
  if (s->fd < 0) return;
  for (uint64_t i = 0; i < s->nsegs; i++)
    if (s->segs[i]) munmap(s->segs[i], s->seg_bytes);
  pthread_mutex_destroy(&s->mu);
  free(s->free_list);
  free_store(s);
}

int dynemb_ssd_relayout(dynemb_ssd *s, size_t emb_bytes, size_t slot_bytes) {
  if (s->fd < 0) return DYNEMB_OK;
  dynemb_ssd n;
  int rc = dynemb_ssd_open(&n, s->dir, s->table, emb_bytes, slot_bytes,
                           s->capacity);
  if (rc) return rc;
  dynemb_ssd_close(s);
  /* the new tier's fields move over; its mutex is made anew in place (a
   * mutex is not copied) */
  pthread_mutex_destroy(&n.mu);
  *s = n;
  pthread_mutex_init(&s->mu, NULL);
  return DYNEMB_OK;
}

/* Where record `r` ends: its segment's offset in its file plus its own
 * end in the segment (the segment must have a file). */
static uint64_t rec_end(const dynemb_ssd *s, uint64_t r) {
  const uint64_t seg = r >> s->seg_shift;
  return (seg - s->first_seg[s->seg_file[seg]]) * s->seg_bytes +
         ((r & (s->seg_records - 1)) + 1) * s->rec_bytes;
}

static int disk_full(int e) { return e == ENOSPC || e == EDQUOT || e == EFBIG; }

/* Grows directory k's file to at least `need` bytes (by 1/8 of the file,
 * within [GROW_MIN_BYTES, GROW_MAX_BYTES], or, if the disk refuses that,
 * by what is needed). Caller holds s->mu. 0 or the system's error. */
static int grow(dynemb_ssd *s, int k, uint64_t need) {
  const uint64_t pg = page_bytes();
  need = round_up(need, pg);
  if (need <= s->fbytes[k]) return 0;
  uint64_t step = s->fbytes[k] / 8;
  if (step < GROW_MIN_BYTES) step = GROW_MIN_BYTES;
  if (step > GROW_MAX_BYTES) step = GROW_MAX_BYTES;
  uint64_t want = round_up(s->fbytes[k] + step, pg);
  if (want < need || s->ndirs > 1) want = need; /* (whole segments) */
  int e = posix_fallocate(s->fds[k], (off_t)s->fbytes[k],
                          (off_t)(want - s->fbytes[k]));
  if (e && want > need) {
    want = need;
    e = posix_fallocate(s->fds[k], (off_t)s->fbytes[k],
                        (off_t)(want - s->fbytes[k]));
  }
  if (!e) s->fbytes[k] = want;
  return e;
}

/* Makes record `r` (the next one past the high-water mark) usable: gives
 * its segment a file (the current directory's, or, when that disk is full,
 * the next directory's), grows the file over it and maps the segment.
 * Caller holds s->mu. EIO with a message. */
static int make_usable(dynemb_ssd *s, uint64_t r) {
  const uint64_t seg = r >> s->seg_shift;
  for (;;) {
    const int fresh = s->seg_file[seg] < 0;
    int rc;
    if (fresh) { /* segments come in order: the next one of s->cur's file */
      int gone = 0;
      if ((rc = open_file(s, s->cur, &gone))) {
        if (!gone || s->cur + 1 >= s->ndirs) return rc;
        s->cur++; /* (a directory gone or read-only since: the next one) */
        dynemb_error_clear();
        continue;
      }
      if (s->first_seg[s->cur] == NO_SEGMENT) s->first_seg[s->cur] = seg;
      s->seg_file[seg] = s->cur;
    }
    const int k = s->seg_file[seg];
    const uint64_t seg_at = (seg - s->first_seg[k]) * s->seg_bytes;
    /* several directories: a segment's whole length at once */
    int e = grow(s, k, s->ndirs > 1 ? seg_at + s->seg_bytes : rec_end(s, r));
    if (!e) break;
    if (fresh) { /* (as it was) */
      s->seg_file[seg] = -1;
      if (s->first_seg[k] == seg) s->first_seg[k] = NO_SEGMENT;
    }
    if (fresh && disk_full(e) && k + 1 < s->ndirs && s->fbytes[k] <= seg_at) {
      s->cur = k + 1; /* this disk is full: on to the next directory */
      continue;
    }
    return dynemb_error_set(
        DYNEMB_EIO,
        "table '%s': the SSD tier's file in '%s' cannot grow (%s)%s; free "
        "space on the disk behind ssd_data_path, %slower "
        "ssd_vocabulary_size",
        s->table, s->dirs[k], strerror(e),
        s->ndirs > 1 && k + 1 == s->ndirs ? ", the last directory of "
                                            "ssd_data_path"
                                          : "",
        s->ndirs > 1 ? "add a directory, or " : "");
  }
  if (!s->segs[seg]) {
    const int k = s->seg_file[seg];
    void *p = mmap(NULL, s->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                   s->fds[k], (off_t)((seg - s->first_seg[k]) * s->seg_bytes));
    if (p == MAP_FAILED)
      return dynemb_error_set(DYNEMB_EIO,
                              "table '%s': cannot map %llu bytes of the SSD "
                              "tier's file in '%s' (%s); ssd_data_path must "
                              "be on a file system that supports shared "
                              "mappings, with address space to spare",
                              s->table, (unsigned long long)s->seg_bytes,
                              s->dirs[k], strerror(errno));
    /* rows are read one by one at random: no read-ahead around them */
    (void)madvise(p, s->seg_bytes, MADV_RANDOM);
    __atomic_store_n(&s->segs[seg], (char *)p, __ATOMIC_RELEASE);
  }
  return DYNEMB_OK;
}

int dynemb_ssd_alloc(dynemb_ssd *s, uint32_t *rec) {
  int rc = DYNEMB_OK;
  pthread_mutex_lock(&s->mu);
  if (s->used >= s->capacity) {
    rc = DYNEMB_ECAPACITY;
  } else if (s->nfree) {
    *rec = s->free_list[--s->nfree];
    s->used++;
  } else if (!(rc = make_usable(s, s->high))) {
    /* high <= used < capacity <= 2^30 - 1 */
    *rec = (uint32_t)s->high;
    __atomic_store_n(&s->high, s->high + 1, RELAXED);
    s->used++;
  }
  pthread_mutex_unlock(&s->mu);
  return rc;
}

void dynemb_ssd_release(dynemb_ssd *s, uint32_t rec) {
  pthread_mutex_lock(&s->mu);
  if (s->nfree == s->free_cap) {
    /* when the list cannot grow, the record stays counted as used (lost
     * to reuse, never handed out twice) */
    uint64_t cap = s->free_cap ? 2 * s->free_cap : 1024;
    uint32_t *p = realloc(s->free_list, cap * sizeof *p);
    if (p) {
      s->free_list = p;
      s->free_cap = cap;
    }
  }
  if (s->nfree < s->free_cap) {
    s->free_list[s->nfree++] = rec;
    s->used--;
  }
  pthread_mutex_unlock(&s->mu);
}

/* Record `rec`'s bytes, or NULL (error set) when it was never handed out
 * since the last reset. */
static char *record(dynemb_ssd *s, uint32_t rec, const char *what) {
  if ((uint64_t)rec >= __atomic_load_n(&s->high, RELAXED)) {
    dynemb_error_set(DYNEMB_EIO,
                     "table '%s': %s record %u of the SSD tier in '%s' "
                     "failed: it is past the end of the file (an internal "
                     "error; please report it)",
                     s->table, what, rec, s->dirs[0]);
    return NULL;
  }
  return dynemb_ssd_addr(s, rec);
}

int dynemb_ssd_write(dynemb_ssd *s, uint32_t rec, const float *emb,
                     const float *slots) {
  char *p = record(s, rec, "writing");
  if (!p) return DYNEMB_EIO;
  memcpy(p, emb, s->emb_bytes);
  if (slots && s->slot_bytes) memcpy(p + s->emb_bytes, slots, s->slot_bytes);
  __atomic_add_fetch(&s->writes, 1, RELAXED);
  return DYNEMB_OK;
}

int dynemb_ssd_read(dynemb_ssd *s, uint32_t rec, float *emb, float *slots) {
  const char *p = record(s, rec, "reading");
  if (!p) return DYNEMB_EIO;
  memcpy(emb, p, s->emb_bytes);
  if (slots && s->slot_bytes) memcpy(slots, p + s->emb_bytes, s->slot_bytes);
  __atomic_add_fetch(&s->reads, 1, RELAXED);
  return DYNEMB_OK;
}

void dynemb_ssd_prefault(dynemb_ssd *s, uint64_t nrec) {
#ifdef MADV_POPULATE_WRITE
  if (s->fd < 0 || !nrec) return;
  pthread_mutex_lock(&s->mu);
  if (s->high >= s->capacity) { /* full: nothing more is handed out */
    pthread_mutex_unlock(&s->mu);
    return;
  }
  /* within the segment of the next record (segments are 64 MiB: a call
   * rarely needs more than one) */
  uint64_t last = s->high + nrec - 1;
  if (last >= s->capacity) last = s->capacity - 1;
  const uint64_t seg = s->high >> s->seg_shift;
  if ((last >> s->seg_shift) != seg) last = ((seg + 1) << s->seg_shift) - 1;
  char *base = NULL;
  uint64_t from = 0, to = 0;
  if (s->high <= last && make_usable(s, last) == DYNEMB_OK) {
    /* offsets as segment * seg_bytes + offset in the segment; the file of
     * the segment holds it from seg_at on */
    const int k = s->seg_file[seg];
    const uint64_t seg_off = seg * s->seg_bytes, pg = page_bytes();
    const uint64_t seg_at = (seg - s->first_seg[k]) * s->seg_bytes;
    from = s->populated > seg_off ? s->populated : seg_off;
    from = from / pg * pg;
    to = round_up(rec_end(s, last) - seg_at + seg_off, pg);
    if (to > seg_off + (s->fbytes[k] - seg_at))
      to = seg_off + (s->fbytes[k] - seg_at);
    if (to > from) {
      s->populated = to;
      base = s->segs[seg] + (from - seg_off);
    }
  }
  dynemb_error_clear(); /* a failed growth is reported by the alloc */
  pthread_mutex_unlock(&s->mu);
  if (base) (void)madvise(base, to - from, MADV_POPULATE_WRITE);
#else
  (void)s;
  (void)nrec;
#endif
}

int dynemb_ssd_readahead_wanted(const dynemb_ssd *s) {
  return __atomic_load_n(&s->ra_left, RELAXED) > 0;
}

void dynemb_ssd_willneed(const dynemb_ssd *s, const uint32_t *recs, size_t n) {
  const uintptr_t pg = (uintptr_t)page_bytes();
  uintptr_t run_a = 0, run_z = 0; /* pages advised last (merged runs) */
  for (size_t i = 0; i < n; i++) {
    if ((uint64_t)recs[i] >= __atomic_load_n(&s->high, RELAXED)) continue;
    const uintptr_t p = (uintptr_t)dynemb_ssd_addr(s, recs[i]);
    if (!p) continue;
    const uintptr_t a = p & ~(pg - 1), z = (p + s->rec_bytes + pg - 1) & ~(pg - 1);
    if (a >= run_a && z <= run_z) continue;
    (void)madvise((void *)a, z - a, MADV_WILLNEED); /* only advice */
    run_a = a;
    run_z = z;
  }
}

uint64_t dynemb_ssd_thread_major_faults(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_THREAD, &ru) != 0) return 0;
  return (uint64_t)ru.ru_majflt;
}

void dynemb_ssd_note_faults(dynemb_ssd *s, uint64_t major_faults,
                            int read_ahead) {
  if (major_faults) {
    __atomic_store_n(&s->ra_left, DYNEMB_SSD_READAHEAD_CALLS, RELAXED);
  } else if (read_ahead) {
    uint32_t left = __atomic_load_n(&s->ra_left, RELAXED);
    if (left) __atomic_store_n(&s->ra_left, left - 1, RELAXED);
  }
}

void dynemb_ssd_batch_begin(dynemb_ssd *s, const uint32_t *recs, size_t n,
                            dynemb_ssd_batch *b) {
  b->read_ahead = dynemb_ssd_readahead_wanted(s);
  if (b->read_ahead) dynemb_ssd_willneed(s, recs, n);
  b->faults = dynemb_ssd_thread_major_faults();
}

void dynemb_ssd_batch_end(dynemb_ssd *s, const dynemb_ssd_batch *b) {
  dynemb_ssd_note_faults(s, dynemb_ssd_thread_major_faults() - b->faults,
                         b->read_ahead);
}

void dynemb_ssd_reset(dynemb_ssd *s) {
  if (s->fd < 0) return;
  pthread_mutex_lock(&s->mu);
  s->nfree = 0;
  __atomic_store_n(&s->high, 0, RELAXED);
  s->used = 0;
  /* only gives space back: errors change nothing. One directory: the
   * segments stay mapped (no record is in use) and see the file grow again
   * later. Several: they are unmapped and forget their files, so that they
   * fill the directories in order again (another table may have taken
   * the space this one had). */
  for (int k = 0; k < s->ndirs; k++)
    if (s->fds[k] >= 0 && ftruncate(s->fds[k], 0) == 0) s->fbytes[k] = 0;
  if (s->ndirs > 1) {
    for (uint64_t i = 0; i < s->nsegs; i++) {
      if (s->segs[i]) munmap(s->segs[i], s->seg_bytes);
      __atomic_store_n(&s->segs[i], NULL, __ATOMIC_RELEASE);
      s->seg_file[i] = -1;
    }
    for (int k = 0; k < s->ndirs; k++) s->first_seg[k] = NO_SEGMENT;
    s->cur = 0;
  }
  s->populated = 0;
  pthread_mutex_unlock(&s->mu);
}

/* A field guarded by the store's mutex (0 for a store that is off). */
static uint64_t locked_read(dynemb_ssd *s, const uint64_t *field) {
  if (s->fd < 0) return 0;
  pthread_mutex_lock(&s->mu);
  uint64_t n = *field;
  pthread_mutex_unlock(&s->mu);
  return n;
}

uint64_t dynemb_ssd_used(dynemb_ssd *s) { return locked_read(s, &s->used); }
uint64_t dynemb_ssd_high(dynemb_ssd *s) { return locked_read(s, &s->high); }
