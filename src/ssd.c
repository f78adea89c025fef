/*
 * ssd.c -- the SSD tier's record file: anonymous file creation, record
 * allocation (free list + high-water mark), positional vectored I/O.
 *
 * Why by hand: the tier needs exactly "record i at offset i * size" with a
 * free list; the key -> record map is the table's own index. preadv /
 * pwritev move a record's two parts (embedding, slots) in one call each.
 * Batching these through io_uring is a possible later step; one system
 * call per moved row is what the measurements in BENCHMARKS.md use.
 */
#include "ssd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "dynemb.h"
#include "error.h"

#define RELAXED __ATOMIC_RELAXED

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

int dynemb_ssd_open(dynemb_ssd *s, const char *dir, const char *table,
                    size_t emb_bytes, size_t slot_bytes, uint64_t capacity) {
  dynemb_ssd_init_off(s);
  s->table = table;
  s->emb_bytes = emb_bytes;
  s->slot_bytes = slot_bytes;
  s->capacity = capacity;
  s->dir = strdup(dir);
  if (!s->dir)
    return dynemb_error_set(DYNEMB_ENOMEM,
                            "table '%s': out of memory opening the SSD tier",
                            table);
  int fd = anon_file(dir);
  if (fd < 0) {
    int e = errno;
    free(s->dir);
    s->dir = NULL;
    return dynemb_error_set(DYNEMB_EIO,
                            "table '%s': cannot create the SSD tier's file in "
                            "ssd_data_path '%s' (%s); pass an existing, "
                            "writable directory",
                            table, dir, strerror(e));
  }
#ifdef POSIX_FADV_RANDOM
  (void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
#endif
  pthread_mutex_init(&s->mu, NULL);
  s->fd = fd;
  return DYNEMB_OK;
}

void dynemb_ssd_close(dynemb_ssd *s) {
  if (s->fd < 0) return;
  close(s->fd);
  pthread_mutex_destroy(&s->mu);
  free(s->free_list);
  free(s->dir);
  dynemb_ssd_init_off(s);
}

int dynemb_ssd_alloc(dynemb_ssd *s, uint32_t *rec) {
  int rc = DYNEMB_OK;
  pthread_mutex_lock(&s->mu);
  if (s->used >= s->capacity) {
    rc = DYNEMB_ECAPACITY;
  } else if (s->nfree) {
    *rec = s->free_list[--s->nfree];
    s->used++;
  } else {
    *rec = (uint32_t)s->high++; /* high <= used < capacity <= 2^30 - 1 */
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

/* Moves a record's parts to (write) or from (read) the file, resuming
 * after short transfers and EINTR. */
static int transfer(dynemb_ssd *s, uint32_t rec, float *emb, float *slots,
                    int write) {
  struct iovec v[2];
  int nv = 0;
  v[nv].iov_base = emb;
  v[nv++].iov_len = s->emb_bytes;
  if (slots && s->slot_bytes) {
    v[nv].iov_base = slots;
    v[nv++].iov_len = s->slot_bytes;
  }
  off_t off = (off_t)rec * (off_t)(s->emb_bytes + s->slot_bytes);
  size_t left = v[0].iov_len + (nv > 1 ? v[1].iov_len : 0);
  struct iovec *cur = v;
  while (left) {
    ssize_t r = write ? pwritev(s->fd, cur, nv, off) : preadv(s->fd, cur, nv, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const char *why = r < 0 ? strerror(errno) : "unexpected end of file";
      return dynemb_error_set(DYNEMB_EIO,
                              "table '%s': %s record %u of the SSD tier in "
                              "'%s' failed (%s); check the disk behind "
                              "ssd_data_path (space, errors)",
                              s->table, write ? "writing" : "reading", rec,
                              s->dir, why);
    }
    left -= (size_t)r;
    off += r;
    while (r > 0 && nv > 0) { /* skip what was transferred */
      if ((size_t)r >= cur->iov_len) {
        r -= (ssize_t)cur->iov_len;
        cur++;
        nv--;
      } else {
        cur->iov_base = (char *)cur->iov_base + r;
        cur->iov_len -= (size_t)r;
        r = 0;
      }
    }
  }
  __atomic_add_fetch(write ? &s->writes : &s->reads, 1, RELAXED);
  return DYNEMB_OK;
}

int dynemb_ssd_write(dynemb_ssd *s, uint32_t rec, const float *emb,
                     const float *slots) {
  /* the iovecs are not written through on a write */
  return transfer(s, rec, (float *)(uintptr_t)emb, (float *)(uintptr_t)slots,
                  1);
}

int dynemb_ssd_read(dynemb_ssd *s, uint32_t rec, float *emb, float *slots) {
  return transfer(s, rec, emb, slots, 0);
}

void dynemb_ssd_reset(dynemb_ssd *s) {
  if (s->fd < 0) return;
  pthread_mutex_lock(&s->mu);
  s->nfree = 0;
  s->high = 0;
  s->used = 0;
  (void)!ftruncate(s->fd, 0); /* only gives space back: errors change nothing */
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
