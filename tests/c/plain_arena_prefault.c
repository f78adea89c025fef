/*
 * plain_arena_prefault.c -- the slab pool of the row arenas. Slabs grow
 * with the pool (a large table maps few of them). And what
 * dynemb_slab_pool_prefault promises its caller: when it returns, the
 * `need` bytes the next chunks will come from are populated (resident),
 * across the end of the newest slab too, even while another thread has
 * claimed part of them and not finished (a SCHED_IDLE prefault thread
 * preempted halfway). A claim counted as done would leave the caller's
 * chunks to fault under a shard write lock. Built without sanitizers: ASan
 * builds take slabs from malloc and do not populate ahead. The prefault
 * cases are skipped where the kernel lacks MADV_POPULATE_WRITE.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "arena.h"
#include "check.h"
#include "dynemb.h"

#define MIB ((size_t)1 << 20)
/* 48 KiB chunks: the pool picks slabs of 3 huge pages (6 MiB, no waste),
 * so a need can lie in a slab's untouched huge pages */
enum { CHUNK = 48 * 1024 };

/* Whether every page of [p, p + len) is resident. */
static int resident(const char *p, size_t len) {
  long pg = sysconf(_SC_PAGESIZE);
  uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1);
  size_t n = ((uintptr_t)p + len - a + (size_t)pg - 1) / (size_t)pg;
  unsigned char *v = malloc(n);
  int ok = v && mincore((void *)a, n * (size_t)pg, v) == 0;
  for (size_t i = 0; ok && i < n; i++) ok = v[i] & 1;
  free(v);
  return ok;
}

static int populate_supported(void) {
#ifdef MADV_POPULATE_WRITE
  void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  if (m == MAP_FAILED) return 0;
  int ok = madvise(m, 4096, MADV_POPULATE_WRITE) == 0;
  munmap(m, 4096);
  return ok;
#else
  return 0;
#endif
}

/* Carves chunks, writing each (as rows being initialized would), until
 * the pool holds `bytes` and then until `left` bytes remain in its newest
 * slab (at most). */
static void carve(dynemb_slab_pool *p, size_t bytes, size_t left) {
  while (dynemb_slab_pool_bytes(p) < bytes || p->left > left) {
    char *c = dynemb_slab_alloc(p, CHUNK);
    if (!c) return;
    memset(c, 1, CHUNK);
  }
}

/* The caller's range: [cur, cur + need) of the newest slab and, past its
 * end, the start of the spare slab. */
static int need_resident(const dynemb_slab_pool *p, size_t need) {
  size_t in_cur = p->left < need ? p->left : need;
  int ok = resident(p->cur, in_cur);
  if (need > in_cur) ok = ok && p->spare && resident(p->spare, need - in_cur);
  return ok;
}

static void run_case(size_t left, int claimed_ahead) {
  dynemb_slab_pool p;
  CHECK_OK(dynemb_slab_pool_init(&p, CHUNK));
  CHECK(p.unit_bytes == 6 * MIB);
  carve(&p, 20 * MIB, left); /* past the 16 MiB where prefaulting starts */
  /* No prefault thread: only the caller populates (as when the thread
   * could not start, or is starved of CPU). */
  pthread_mutex_lock(&p.mu);
  p.worker = 2; /* WORKER_FAILED */
  if (claimed_ahead) { /* a thread claimed the next 4 MiB, then stalled */
    if (!p.spare) {
      p.spare = mmap(NULL, p.unit_bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      p.spare_bytes = p.unit_bytes;
    }
    p.claimed = p.cur + p.left;
    p.spare_claimed = p.spare_bytes;
  }
  pthread_mutex_unlock(&p.mu);
  const size_t need = MIB;
  CHECK(!need_resident(&p, need)); /* the test means something */
  dynemb_slab_pool_prefault(&p, need);
  CHECK(need_resident(&p, need));
  dynemb_slab_pool_destroy(&p);
}

/* The 1 MiB needed lies inside the newest slab (from 1.5 MiB into it). */
static void test_need_inside_the_slab(void) { run_case(9 * MIB / 2, 0); }

/* ...runs past its end into the spare slab. */
static void test_need_across_the_slab_end(void) { run_case(256 * 1024, 0); }

/* Claimed by a stalled thread is not ready. */
static void test_claims_in_flight_do_not_count(void) {
  run_case(9 * MIB / 2, 1);
  run_case(256 * 1024, 1);
}

/* Slabs grow with the pool (a quarter of what it mapped, at most 64 MiB):
 * 200 MiB of chunks take a dozen-odd mmaps, not 34 slabs of 6 MiB. The
 * chunks are distinct, writable memory, and the pool counts them. */
static void test_slabs_grow_with_the_pool(void) {
  dynemb_slab_pool p;
  CHECK_OK(dynemb_slab_pool_init(&p, CHUNK));
  enum { N = 200 * 1024 * 1024 / CHUNK };
  unsigned char **c = malloc(N * sizeof *c);
  int ok = c != NULL;
  for (int i = 0; ok && i < N; i++) {
    c[i] = dynemb_slab_alloc(&p, CHUNK);
    ok = c[i] != NULL;
    if (ok) c[i][0] = c[i][CHUNK - 1] = (unsigned char)i;
  }
  CHECK(ok);
  for (int i = 0; ok && i < N; i++)
    ok = c[i][0] == (unsigned char)i && c[i][CHUNK - 1] == (unsigned char)i;
  CHECK(ok);
  CHECK(p.nslabs >= 8 && p.nslabs <= 16);
  CHECK(p.slab_bytes > p.unit_bytes && p.slab_bytes <= 64 * MIB);
  size_t sum = 0;
  for (size_t i = 0; i < p.nslabs; i++) {
    CHECK(p.slab_sizes[i] % p.unit_bytes == 0);
    sum += p.slab_sizes[i];
  }
  CHECK(sum == p.mapped_bytes);
  CHECK(dynemb_slab_pool_bytes(&p) >= (size_t)N * CHUNK);
  free(c);
  dynemb_slab_pool_destroy(&p);
}

int main(void) {
  if (!populate_supported()) {
    printf("SKIP plain_arena_prefault (the prefault cases): no "
           "MADV_POPULATE_WRITE here\n");
    RUN(test_slabs_grow_with_the_pool);
    return check_summary();
  }
  RUN(test_slabs_grow_with_the_pool);
  RUN(test_need_inside_the_slab);
  RUN(test_need_across_the_slab_end);
  RUN(test_claims_in_flight_do_not_count);
  return check_summary();
}
