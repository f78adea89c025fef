/*
 * arena.h -- chunked row storage of one shard (host DRAM tier).
 *
 * Rows have a fixed size, so a shard stores them in chunks that are
 * allocated once and never moved or realloc'ed: growing a table never
 * copies rows and a row's address is stable while it lives. Only the small
 * array of chunk pointers grows.
 *
 * A row has two parts kept in parallel chunks under the same row number:
 * the embedding (emb_floats) and the optimizer slots (slot_floats, may be
 * 0). Lookups copy only embeddings, so with the parts apart they read
 * dense 256-byte rows (at dim 64) out of embedding-only huge pages instead
 * of every third part of 768-byte Adam rows (whose neighbouring lines the
 * hardware prefetchers would also pull in); apply touches both parts, the
 * same number of cache lines as before. The two chunk pointers of a chunk
 * sit next to each other, so finding both parts costs one cache line.
 *
 * Chunk sizes: the first chunks double in size (1/16, 1/16, 1/8, 1/4, 1/2
 * of a full chunk) so that small tables with many shards stay small, then
 * every chunk is full size (about 48 KiB of whole rows, a power of two of
 * rows, split into an embedding chunk and a slot chunk). A row
 * number maps to (chunk, offset) with a shift or a count-leading-zeros.
 *
 * Chunk memory comes from the table's slab pools (one for embedding chunks,
 * one for slot chunks): 2 MiB-aligned regions
 * mapped with MADV_HUGEPAGE and carved into chunks, so that random row
 * accesses over gigabytes of rows do not miss the TLB on every row. The
 * pool owns the memory; a shard's arena only points into it. Slabs are
 * released all at once (table clear / destroy).
 *
 * Row numbers freed by eviction form an intrusive free list (the next free
 * one is stored in the freed row's first embedding bytes), reused before
 * new ones. Row numbers are limited to 30 bits (see the location encoding in index.h).
 * Not thread-safe: the shard lock protects an arena.
 */
#ifndef DYNEMB_ARENA_H
#define DYNEMB_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include <pthread.h>
#include <sys/types.h>

#define DYNEMB_ARENA_MAX_ROWS (UINT32_C(1) << 30)

/* Bump allocator over huge-page slabs, shared by the shards of a table
 * (its own mutex; taken only when a shard needs a new chunk). Slabs grow
 * with the pool (a quarter of what it has mapped, up to 64 MiB), so that a
 * table of gigabytes maps a few dozen slabs rather than thousands: every
 * mmap and munmap takes the process's mmap lock for writing, and waits for
 * any page-fault work in flight (see dynemb_slab_pool_prefault). */
typedef struct dynemb_slab_pool {
  pthread_mutex_t mu;
  char *cur;           /* free part of the newest slab */
  size_t left;         /* bytes left there */
  size_t unit_bytes;   /* slab sizes are multiples of this (of 2 MiB) */
  size_t slab_bytes;   /* size of the newest slab */
  size_t mapped_bytes; /* sizes of all slabs (not the spare) */
  void **slabs;        /* every slab, for release */
  size_t *slab_sizes;  /* ...and its size */
  size_t nslabs, slabs_cap;
  char *ready;         /* the newest slab is populated up to here */
  char *claimed;       /* ...and being populated up to here (>= ready) */
  char *spare;         /* the next slab, mapped ahead by prefault, or NULL */
  size_t spare_bytes;  /* its size */
  size_t spare_ready;  /* bytes of `spare` populated */
  size_t spare_claimed; /* ...and being populated (>= spare_ready) */
  /* the prefault thread (started by the first prefault call that needs it) */
  pthread_cond_t cv;   /* wakes the thread: requested or stop */
  pthread_t thread;
  int worker;          /* 0 not started, 1 running, 2 could not start */
  int requested;       /* a prefault call asked for more since it woke */
  int stop;            /* destroy asks the thread to end */
  pid_t worker_pid;    /* process that started it (a fork child has none) */
} dynemb_slab_pool;

/* `max_chunk_bytes`: the largest request that will be made. */
int dynemb_slab_pool_init(dynemb_slab_pool *p, size_t max_chunk_bytes);
/* Releases every slab (all chunks handed out become invalid). */
void dynemb_slab_pool_release(dynemb_slab_pool *p);
/* Releases every slab and sizes later slabs for a new largest request (an
 * empty table whose row layout changes). */
void dynemb_slab_pool_reshape(dynemb_slab_pool *p, size_t max_chunk_bytes);
void dynemb_slab_pool_destroy(dynemb_slab_pool *p);
/* 64-byte aligned memory of `bytes` (a multiple of 64), or NULL. */
void *dynemb_slab_alloc(dynemb_slab_pool *p, size_t bytes);
/* Bytes mapped by the pool. */
size_t dynemb_slab_pool_bytes(dynemb_slab_pool *p);
/* Keeps the memory the next chunks will come from populated (page-faulted
 * in) ahead, once the pool has mapped 16 MiB or more. Inserting threads
 * call it before taking any shard lock. A thread of the pool (started on
 * the first call that needs it, ended by dynemb_slab_pool_destroy,
 * SCHED_IDLE) keeps about a huge page populated ahead, so that the kernel
 * zeroing fresh huge pages (0.2-0.5 ms each on the KVM guest measured, ~3
 * to 15 ms when its host backs the memory anew) is paid neither under a
 * shard write lock nor in the calling thread while the thread keeps up.
 * When it returns, the first `need` bytes (at least a quarter of a huge
 * page; a `need` past 8 MiB, a large batch whose throughput matters more
 * than its latency, counts as a quarter page) are populated: what the
 * thread has not finished (it fell behind, is preempted, or could not be
 * started), the caller populates itself, so that its inserts do not fault
 * under a shard lock. It never writes the memory, so it is safe while
 * chunks are in use. */
void dynemb_slab_pool_prefault(dynemb_slab_pool *p, size_t need);
#define DYNEMB_ARENA_NO_ROW UINT32_MAX

typedef struct dynemb_arena {
  dynemb_slab_pool *pool;      /* embedding chunks (owns their memory) */
  dynemb_slab_pool *slot_pool; /* row chunks; unused if slot_floats == 0 */
  float **chunks;       /* [nchunks * cstride]: embedding chunk, then (if
                           cstride == 2) the row chunk of the same rows */
  uint32_t nchunks, chunks_cap; /* chunks_cap counts chunks, not pointers */
  uint32_t full_shift;  /* a full chunk has 1 << full_shift rows */
  uint32_t first_shift; /* the first chunk has 1 << first_shift rows */
  uint32_t cstride;     /* pointers per chunk: 1 (no slots) or 2 */
  size_t emb_floats;    /* embedding floats per row */
  size_t slot_floats;   /* optimizer row floats per row (0: none) */
  uint64_t capacity;    /* row numbers in allocated chunks */
  uint64_t bumped;      /* row numbers ever handed out, in order */
  uint32_t free_head;   /* first free-listed row or DYNEMB_ARENA_NO_ROW */
  uint64_t free_count;  /* free-listed rows */
} dynemb_arena;

void dynemb_arena_init(dynemb_arena *a, size_t emb_floats,
                       size_t slot_floats, dynemb_slab_pool *pool,
                       dynemb_slab_pool *slot_pool);
/* Bytes of the largest chunk of one part (`part_floats` per row) that an
 * arena with rows of `row_floats` floats (both parts) asks for. */
size_t dynemb_arena_max_chunk_bytes(size_t row_floats, size_t part_floats);
/* Forgets every row and chunk (the memory stays with the pool). */
void dynemb_arena_free(dynemb_arena *a);
/* Forgets every row, keeping the chunks (their row numbers become
 * reusable). */
void dynemb_arena_clear_keep(dynemb_arena *a);

/* Chunk index and row offset of row `row`. */
static inline void dynemb_arena_locate(const dynemb_arena *a, uint32_t row,
                                       uint32_t *chunk, uint32_t *offset) {
  uint32_t full = UINT32_C(1) << a->full_shift;
  uint32_t c, off;
  if (row >= full) {
    c = (a->full_shift - a->first_shift) + (row >> a->full_shift);
    off = row & (full - 1);
  } else if (row < (UINT32_C(1) << a->first_shift)) {
    c = 0;
    off = row;
  } else {
    uint32_t lg = 31u - (uint32_t)__builtin_clz(row);
    c = lg - a->first_shift + 1;
    off = row - (UINT32_C(1) << lg);
  }
  *chunk = c;
  *offset = off;
}

/* The embedding of row `row`. */
static inline float *dynemb_arena_row(const dynemb_arena *a, uint32_t row) {
  uint32_t c, off;
  dynemb_arena_locate(a, row, &c, &off);
  return a->chunks[(size_t)c * a->cstride] + (size_t)off * a->emb_floats;
}

/* The optimizer slots of row `row` (only if slot_floats > 0). */
static inline float *dynemb_arena_slots(const dynemb_arena *a, uint32_t row) {
  uint32_t c, off;
  dynemb_arena_locate(a, row, &c, &off);
  return a->chunks[(size_t)c * 2 + 1] + (size_t)off * a->slot_floats;
}

/* Free row numbers (free list plus untouched ones of allocated chunks). */
static inline uint64_t dynemb_arena_available(const dynemb_arena *a) {
  return a->free_count + (a->capacity - a->bumped);
}

/* Makes sure `n` more rows can be taken without allocating. Returns
 * DYNEMB_OK, DYNEMB_ENOMEM, or DYNEMB_ECAPACITY (past 2^30 rows). */
int dynemb_arena_reserve(dynemb_arena *a, uint64_t n);

/* Takes a row number (a free-listed one first). Returns DYNEMB_OK,
 * DYNEMB_ENOMEM or DYNEMB_ECAPACITY; the row content is undefined. */
int dynemb_arena_alloc(dynemb_arena *a, uint32_t *row);

/* Returns a row number to the free list. */
void dynemb_arena_release(dynemb_arena *a, uint32_t row);

/* Bytes of memory held by the arena itself: the chunk-pointer array
 * (chunk memory is counted by the pool). */
size_t dynemb_arena_bytes(const dynemb_arena *a);

#endif
