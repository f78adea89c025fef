/*
 * arena.c -- chunk allocation, row-number hand-out and the free list of the row
 * arena, and the huge-page slab pool the chunks are carved from (see
 * arena.h for the layout and why chunks never move).
 */
#include "arena.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dynemb.h"

/* Bytes of a full chunk of whole rows (both parts together). Larger chunks
 * mean a smaller chunk-pointer table to read per row, but more unused
 * slots at the end of each shard's last chunk (counted as overhead):
 * 48 KiB gives 64-row chunks for 768-byte Adam rows at dim 64. */
#define FULL_CHUNK_BYTES (48u * 1024u)
#define MAX_FULL_SHIFT 12u /* at most 4096 rows per chunk */
#define SMALL_STEPS 4u     /* first chunk = full chunk / 2^SMALL_STEPS */
#define HUGE_PAGE ((size_t)2 << 20)
#define PREFAULT_MIN_BYTES ((size_t)16 << 20) /* see prefaulting */
#define MAX_SLAB_BYTES ((size_t)64 << 20)    /* see next_slab_bytes */
/* The prefault thread keeps this much populated ahead of the bump pointer;
 * a caller populates itself when less than PREFAULT_URGENT is ready. */
#define PREFAULT_AHEAD HUGE_PAGE
#define PREFAULT_URGENT (HUGE_PAGE / 4)
#define PREFAULT_MAX_NEED (4 * HUGE_PAGE) /* most a caller populates */
#define WORKER_NONE 0
#define WORKER_RUNNING 1
#define WORKER_FAILED 2

/* Sanitizer builds take slabs from malloc so that leak checking and
 * allocation tracking still see them. */
#if defined(__SANITIZE_ADDRESS__)
#define SLAB_FROM_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLAB_FROM_MALLOC 1
#endif
#endif

/* ---- slab pool ----------------------------------------------------------- */

/* A slab of k huge pages ends in (k * 2 MiB) mod chunk bytes that no full
 * chunk fits in: pick the k in 1 .. 8 wasting the smallest fraction (e.g.
 * 48 KiB chunks of 768-byte rows: 3 huge pages, no waste), stopping at the
 * first k that wastes under 0.2 %. */
static size_t slab_unit_for(size_t max_chunk_bytes) {
  size_t best = 0;
  double best_frac = 2;
  for (size_t k = 1; k <= 8; k++) {
    size_t s = k * HUGE_PAGE;
    if (s < 2 * max_chunk_bytes) continue;
    double frac = (double)(s % max_chunk_bytes) / (double)s;
    if (frac < best_frac) {
      best_frac = frac;
      best = s;
    }
    if (frac < 0.002) break;
  }
  if (!best) { /* huge chunks (rows of ~100 KiB and more) */
    best = HUGE_PAGE;
    while (best < 8 * max_chunk_bytes) best += HUGE_PAGE;
  }
  return best;
}

int dynemb_slab_pool_init(dynemb_slab_pool *p, size_t max_chunk_bytes) {
  memset(p, 0, sizeof *p);
  p->unit_bytes = p->slab_bytes = slab_unit_for(max_chunk_bytes);
  if (pthread_mutex_init(&p->mu, NULL)) return DYNEMB_ENOMEM;
  if (pthread_cond_init(&p->cv, NULL)) {
    pthread_mutex_destroy(&p->mu);
    return DYNEMB_ENOMEM;
  }
  return DYNEMB_OK;
}

static void *map_slab(size_t bytes) {
#ifdef SLAB_FROM_MALLOC
  return aligned_alloc(HUGE_PAGE, bytes);
#else
  /* map one huge page more, then trim to a 2 MiB-aligned range */
  size_t len = bytes + HUGE_PAGE;
  char *m = mmap(NULL, len, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return NULL;
  char *a = (char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
  if (a > m) munmap(m, (size_t)(a - m));
  size_t tail = (size_t)((m + len) - (a + bytes));
  if (tail) munmap(a + bytes, tail);
#ifdef MADV_HUGEPAGE
  (void)madvise(a, bytes, MADV_HUGEPAGE); /* a hint: fine if refused */
#endif
  return a;
#endif
}

static void unmap_slab(void *s, size_t bytes) {
#ifdef SLAB_FROM_MALLOC
  (void)bytes;
  free(s);
#else
  munmap(s, bytes);
#endif
}

/* The size of the next slab (under p->mu): a quarter of what the pool has
 * mapped, in whole units, at least one unit and at most MAX_SLAB_BYTES. A
 * slab ends in less than a chunk of waste, so larger slabs waste less. */
static size_t next_slab_bytes(const dynemb_slab_pool *p) {
  size_t units = p->mapped_bytes / 4 / p->unit_bytes;
  size_t most = MAX_SLAB_BYTES / p->unit_bytes;
  if (units > most) units = most;
  return (units ? units : 1) * p->unit_bytes;
}

void *dynemb_slab_alloc(dynemb_slab_pool *p, size_t bytes) {
  void *r = NULL;
  if (bytes > p->unit_bytes) return NULL; /* pools are sized for chunks */
  pthread_mutex_lock(&p->mu);
  if (bytes > p->left) {
    if (p->nslabs == p->slabs_cap) {
      size_t nc = p->slabs_cap ? 2 * p->slabs_cap : 16;
      void **q = realloc(p->slabs, nc * sizeof *q);
      if (!q) goto out;
      p->slabs = q;
      size_t *z = realloc(p->slab_sizes, nc * sizeof *z);
      if (!z) goto out;
      p->slab_sizes = z;
      p->slabs_cap = nc;
    }
    char *s = p->spare;
    size_t size;
    if (s) {
      size = p->spare_bytes;
      p->ready = s + p->spare_ready;
      p->claimed = s + p->spare_claimed;
      p->spare = NULL;
      p->spare_ready = p->spare_claimed = 0;
    } else {
      size = next_slab_bytes(p);
      if (!(s = map_slab(size))) goto out;
      p->ready = p->claimed = s;
    }
    p->slab_sizes[p->nslabs] = size;
    p->slabs[p->nslabs++] = s;
    p->mapped_bytes += size;
    p->slab_bytes = size;
    p->cur = s;
    p->left = size;
  }
  r = p->cur;
  p->cur += bytes;
  p->left -= bytes;
out:
  pthread_mutex_unlock(&p->mu);
  return r;
}

void dynemb_slab_pool_release(dynemb_slab_pool *p) {
  pthread_mutex_lock(&p->mu);
  for (size_t i = 0; i < p->nslabs; i++) unmap_slab(p->slabs[i], p->slab_sizes[i]);
  if (p->spare) unmap_slab(p->spare, p->spare_bytes);
  p->nslabs = 0;
  p->mapped_bytes = 0;
  p->slab_bytes = p->unit_bytes;
  p->cur = NULL;
  p->left = 0;
  p->ready = p->claimed = NULL;
  p->spare = NULL;
  p->spare_ready = p->spare_claimed = 0;
  pthread_mutex_unlock(&p->mu);
}

void dynemb_slab_pool_reshape(dynemb_slab_pool *p, size_t max_chunk_bytes) {
  dynemb_slab_pool_release(p);
  pthread_mutex_lock(&p->mu);
  p->unit_bytes = p->slab_bytes = slab_unit_for(max_chunk_bytes);
  pthread_mutex_unlock(&p->mu);
}

#if !defined(SLAB_FROM_MALLOC) && defined(MADV_POPULATE_WRITE)
/* Populating ahead of the bump pointer (all under p->mu).
 *
 * `ready` / `spare_ready` mark memory whose populate has finished;
 * `claimed` / `spare_claimed` also cover populates in flight. Only finished
 * memory counts for a caller: a range is marked ready when its populate
 * returns, never when it is handed to a populating thread, since a
 * SCHED_IDLE prefault thread can be preempted halfway for as long as the
 * cores stay busy, and a caller that took its claim as done would then
 * fault the huge page itself under a shard write lock (measured: most of
 * the page faults of a 2-thread stall pass came from that). Only pools
 * that have grown past PREFAULT_MIN_BYTES populate ahead: the memory
 * populated ahead is then a small share, and small tables (many per
 * process, e.g. one per feature) keep their footprint. Their calls fault
 * in little memory anyway. */

static int prefaulting(const dynemb_slab_pool *p) {
  return p->mapped_bytes >= PREFAULT_MIN_BYTES;
}

/* The huge page holding cur was faulted by the chunks carved before it. */
static void settle(dynemb_slab_pool *p) {
  char *up = (char *)(((uintptr_t)p->cur + HUGE_PAGE - 1) &
                      ~(uintptr_t)(HUGE_PAGE - 1));
  if (p->ready < up) p->ready = up;
  if (p->claimed < p->ready) p->claimed = p->ready;
}

/* Maps the next slab if there is none, with p->mu released meanwhile:
 * mmap waits for the process's mmap lock, which a populate in flight in
 * another thread holds (for up to ~15 ms per huge page on a VM backing
 * fresh memory), and threads inserting must not queue behind that for
 * the pool's mutex. */
static int have_spare(dynemb_slab_pool *p) {
  if (p->spare) return 1;
  const size_t size = next_slab_bytes(p);
  pthread_mutex_unlock(&p->mu);
  char *s = map_slab(size);
  pthread_mutex_lock(&p->mu);
  if (s && !p->spare) {
    p->spare = s;
    p->spare_bytes = size;
    p->spare_ready = p->spare_claimed = 0;
  } else if (s) { /* another thread mapped one meanwhile */
    pthread_mutex_unlock(&p->mu);
    unmap_slab(s, size);
    pthread_mutex_lock(&p->mu);
  }
  return p->spare != NULL;
}

/* The next range to populate (at most a huge page, 0 if none) among the
 * first `want` bytes past the bump pointer, across the newest slab's end
 * into the spare. `claim` (the prefault thread): past what is claimed, and
 * claimed now, in steps up to the slab's end. Else (a caller): past what
 * is ready, claimed or not, up to `want` -- a caller does not wait for
 * another thread's populate, it repeats it, which the kernel resolves. */
static size_t next_range(dynemb_slab_pool *p, size_t want, int claim,
                         char **from) {
  for (;;) {
    if (!prefaulting(p)) return 0;
    settle(p);
    char *const end = p->cur + p->left;
    char *const mark = claim ? p->claimed : p->ready;
    size_t len;
    if (p->left < want && mark >= end) { /* the rest lies in the spare */
      if (!p->spare) { /* (the mutex is released meanwhile: look again) */
        if (!have_spare(p)) return 0;
        continue;
      }
      const size_t smark = claim ? p->spare_claimed : p->spare_ready;
      const size_t rest = want - p->left < p->spare_bytes ? want - p->left
                                                         : p->spare_bytes;
      if (smark >= rest) return 0;
      *from = p->spare + smark;
      len = (claim ? p->spare_bytes : rest) - smark;
      if (len > HUGE_PAGE) len = HUGE_PAGE;
      if (claim) p->spare_claimed += len;
    } else {
      char *const target = p->left > want ? p->cur + want : end;
      if (mark >= target) return 0;
      *from = mark;
      len = (size_t)((claim ? end : target) - mark);
      if (len > HUGE_PAGE) len = HUGE_PAGE;
      if (claim) p->claimed += len;
    }
    return len;
  }
}

/* A populate of [from, from + len) returned: the ready marks move past it
 * (the slab it lies in may have become the newest since). */
static void mark_done(dynemb_slab_pool *p, char *from, size_t len) {
  char *newest = p->nslabs ? (char *)p->slabs[p->nslabs - 1] : NULL;
  if (newest && from >= newest && from < newest + p->slab_bytes) {
    if (from <= p->ready && from + len > p->ready) p->ready = from + len;
    if (p->claimed < p->ready) p->claimed = p->ready;
  } else if (p->spare && from >= p->spare && from < p->spare + p->spare_bytes) {
    size_t off = (size_t)(from - p->spare);
    if (off <= p->spare_ready && off + len > p->spare_ready)
      p->spare_ready = off + len;
    if (p->spare_claimed < p->spare_ready) p->spare_claimed = p->spare_ready;
  }
}

/* The pool's prefault thread: populates ranges (outside the mutex) while
 * next_range finds some, then sleeps until the next request. Populating
 * never writes data, and slabs are only unmapped when the table is cleared
 * or destroyed, after which a populate in flight is harmless (an error, or
 * pages of a new mapping faulted in early). */
static void *prefault_main(void *arg) {
  dynemb_slab_pool *p = arg;
  pthread_mutex_lock(&p->mu);
  while (!p->stop) {
    if (!p->requested) {
      pthread_cond_wait(&p->cv, &p->mu);
      continue;
    }
    p->requested = 0;
    char *from = NULL;
    size_t len;
    while (!p->stop && (len = next_range(p, PREFAULT_AHEAD, 1, &from))) {
      pthread_mutex_unlock(&p->mu);
      (void)madvise(from, len, MADV_POPULATE_WRITE);
      pthread_mutex_lock(&p->mu);
      mark_done(p, from, len);
    }
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}
#endif

/* Under p->mu, in a child forked while the pool's thread ran: that thread
 * (and its wait on cv) stayed in the parent, and the copied condition
 * variable still counts it as a waiter (signalling it would block), so it
 * is made anew and the child starts a thread of its own when needed. */
static void forget_parent_worker(dynemb_slab_pool *p) {
  if (p->worker == WORKER_RUNNING && p->worker_pid != getpid()) {
    (void)pthread_cond_init(&p->cv, NULL);
    p->worker = WORKER_NONE;
  }
}

#if !defined(SLAB_FROM_MALLOC) && defined(MADV_POPULATE_WRITE)
/* Starts the prefault thread with every signal blocked (signals meant for
 * the application must not land in a library thread). */
static int start_worker(dynemb_slab_pool *p) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&p->thread, NULL, prefault_main, p);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) return WORKER_FAILED;
  p->worker_pid = getpid();
  (void)pthread_setname_np(p->thread, "dynemb-prefault");
  /* SCHED_IDLE: it runs on CPU time nobody else wants, never taking a core
   * from the threads that insert (measured on 2 vCPUs, two inserting
   * threads: the longest 1024-key call 2.9-5.7 ms in 8 of 8 runs, against
   * 3.8-49.6 ms and 4 of 8 under 10 ms at normal priority). On a busy
   * machine the callers then populate themselves when it falls behind. */
  struct sched_param sp = {0};
  (void)pthread_setschedparam(p->thread, SCHED_IDLE, &sp);
  return WORKER_RUNNING;
}
#endif

void dynemb_slab_pool_prefault(dynemb_slab_pool *p, size_t need) {
#if defined(SLAB_FROM_MALLOC) || !defined(MADV_POPULATE_WRITE)
  (void)p; /* malloc'ed slabs (sanitizers) or an old kernel header */
  (void)need;
#else
  /* A batch too large to cover in advance (throughput, not latency, is
   * what matters for it) only gets the minimum, as do small ones. */
  if (need < PREFAULT_URGENT || need > PREFAULT_MAX_NEED)
    need = PREFAULT_URGENT;
  pthread_mutex_lock(&p->mu);
  if (prefaulting(p)) {
    forget_parent_worker(p);
    if (p->worker == WORKER_NONE) p->worker = start_worker(p);
    if (p->worker == WORKER_RUNNING) {
      p->requested = 1;
      pthread_cond_signal(&p->cv);
    }
    /* The caller populates itself what is not ready of its `need` (the
     * thread fell behind, or could not start): else its chunks would fault
     * under a shard write lock, and other threads would wait for that. */
    char *from = NULL;
    size_t len;
    while ((len = next_range(p, need, 0, &from))) {
      pthread_mutex_unlock(&p->mu);
      (void)madvise(from, len, MADV_POPULATE_WRITE);
      pthread_mutex_lock(&p->mu);
      mark_done(p, from, len);
    }
  }
  pthread_mutex_unlock(&p->mu);
#endif
}

void dynemb_slab_pool_destroy(dynemb_slab_pool *p) {
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_signal(&p->cv);
  forget_parent_worker(p);
  int running = p->worker == WORKER_RUNNING;
  pthread_mutex_unlock(&p->mu);
  if (running) pthread_join(p->thread, NULL);
  dynemb_slab_pool_release(p);
  free(p->slabs);
  free(p->slab_sizes);
  p->slabs = NULL;
  p->slab_sizes = NULL;
  p->slabs_cap = 0;
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
}

size_t dynemb_slab_pool_bytes(dynemb_slab_pool *p) {
  pthread_mutex_lock(&p->mu);
  /* Full slabs, plus the huge pages of the newest slab that chunks were
   * carved from: the rest of it is address space never touched. */
  size_t b = p->slabs_cap * (sizeof(void *) + sizeof(size_t));
  if (p->nslabs) {
    size_t used = p->slab_bytes - p->left;
    size_t touched = (used + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    size_t ready = (size_t)(p->ready - (char *)p->slabs[p->nslabs - 1]);
    b += (p->mapped_bytes - p->slab_bytes) + (ready > touched ? ready : touched);
  }
  b += p->spare_ready; /* populated ahead: memory held */
  pthread_mutex_unlock(&p->mu);
  return b;
}

/* ---- arena ------------------------------------------------------------------ */

static uint32_t full_shift_for(size_t row_floats) {
  size_t row_bytes = row_floats * sizeof(float);
  uint32_t s = 0;
  while (s < MAX_FULL_SHIFT && ((size_t)2 << s) * row_bytes <= FULL_CHUNK_BYTES)
    s++;
  return s;
}

static size_t round64(size_t b) { return (b + 63) & ~(size_t)63; }

size_t dynemb_arena_max_chunk_bytes(size_t row_floats, size_t part_floats) {
  return round64(((size_t)1 << full_shift_for(row_floats)) * part_floats *
                 sizeof(float));
}

void dynemb_arena_init(dynemb_arena *a, size_t emb_floats,
                       size_t slot_floats, dynemb_slab_pool *pool,
                       dynemb_slab_pool *slot_pool) {
  memset(a, 0, sizeof *a);
  a->pool = pool;
  a->slot_pool = slot_pool;
  a->emb_floats = emb_floats;
  a->slot_floats = slot_floats;
  a->cstride = slot_floats ? 2 : 1;
  a->full_shift = full_shift_for(emb_floats + slot_floats);
  a->first_shift = a->full_shift > SMALL_STEPS ? a->full_shift - SMALL_STEPS : 0;
  a->free_head = DYNEMB_ARENA_NO_ROW;
}

static uint64_t chunk_rows(const dynemb_arena *a, uint32_t c) {
  uint32_t small = a->full_shift - a->first_shift;
  if (c == 0) return UINT64_C(1) << a->first_shift;
  if (c <= small) return UINT64_C(1) << (a->first_shift + c - 1);
  return UINT64_C(1) << a->full_shift;
}

static size_t chunk_bytes(const dynemb_arena *a, uint32_t c,
                          size_t part_floats) {
  return round64((size_t)chunk_rows(a, c) * part_floats * sizeof(float));
}

void dynemb_arena_free(dynemb_arena *a) {
  free(a->chunks);
  dynemb_arena_init(a, a->emb_floats, a->slot_floats, a->pool, a->slot_pool);
}

void dynemb_arena_clear_keep(dynemb_arena *a) {
  a->bumped = 0;
  a->free_head = DYNEMB_ARENA_NO_ROW;
  a->free_count = 0;
}

static int add_chunk(dynemb_arena *a) {
  uint64_t rows = chunk_rows(a, a->nchunks);
  if (a->capacity + rows > DYNEMB_ARENA_MAX_ROWS) return DYNEMB_ECAPACITY;
  if (a->nchunks == a->chunks_cap) {
    uint32_t nc = a->chunks_cap ? a->chunks_cap * 2 : 8;
    float **p = realloc(a->chunks, (size_t)nc * a->cstride * sizeof *p);
    if (!p) return DYNEMB_ENOMEM;
    a->chunks = p;
    a->chunks_cap = nc;
  }
  /* If the slot chunk fails, the embedding chunk stays with the pool
   * unused (the pool is a bump allocator); only out-of-memory gets here. */
  float *chunk = dynemb_slab_alloc(a->pool,
                                   chunk_bytes(a, a->nchunks, a->emb_floats));
  if (!chunk) return DYNEMB_ENOMEM;
  float *slots = NULL;
  if (a->slot_floats) {
    slots = dynemb_slab_alloc(a->slot_pool,
                              chunk_bytes(a, a->nchunks, a->slot_floats));
    if (!slots) return DYNEMB_ENOMEM;
  }
  a->chunks[(size_t)a->nchunks * a->cstride] = chunk;
  if (slots) a->chunks[(size_t)a->nchunks * 2 + 1] = slots;
  a->nchunks++;
  a->capacity += rows;
  return DYNEMB_OK;
}

int dynemb_arena_reserve(dynemb_arena *a, uint64_t n) {
  while (dynemb_arena_available(a) < n) {
    int rc = add_chunk(a);
    if (rc) return rc;
  }
  return DYNEMB_OK;
}

int dynemb_arena_alloc(dynemb_arena *a, uint32_t *row) {
  if (a->free_head != DYNEMB_ARENA_NO_ROW) {
    uint32_t s = a->free_head;
    memcpy(&a->free_head, dynemb_arena_row(a, s), sizeof a->free_head);
    a->free_count--;
    *row = s;
    return DYNEMB_OK;
  }
  if (a->bumped == a->capacity) {
    int rc = add_chunk(a);
    if (rc) return rc;
  }
  *row = (uint32_t)a->bumped++;
  return DYNEMB_OK;
}

void dynemb_arena_release(dynemb_arena *a, uint32_t row) {
  memcpy(dynemb_arena_row(a, row), &a->free_head, sizeof a->free_head);
  a->free_head = row;
  a->free_count++;
}

size_t dynemb_arena_bytes(const dynemb_arena *a) {
  return (size_t)a->chunks_cap * a->cstride * sizeof(float *);
}
