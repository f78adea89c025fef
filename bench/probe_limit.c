/*
 * probe_limit.c -- how close can any hash-index lookup get to a plain gather
 * on this machine? The bound behind issue 2's lookup_vs_gather target.
 *
 *   make probe-limit                     # builds it, runs it with 2 threads
 *   ./build/probe_limit [threads]        # prints one JSON object
 *
 * Same shape as `dynemb bench`'s default run: 4M rows x dim 64 (256-byte
 * rows in a huge-page-advised flat array), batches of 65,536 random rows,
 * T threads (default 2). Three loops over the same random positions:
 *   gather   copy each row, rows prefetched into L2 16 ahead (the gather
 *            limit of `dynemb bench`)
 *   probe16  an ideal open-addressing index of 16-byte entries {key, row,
 *            spare} (dynemb's entry size; load 0.78) probed per key, entry
 *            lines prefetched 24 keys ahead, the row prefetched 8 ahead,
 *            then copied: no locks, no last-access stamp, no shards
 *   probe8   the same with 8-byte entries {32-bit fingerprint, row} and no
 *            key check at all (a lower bound for any compact index)
 *   probe8k  8-byte entries, the key checked in an 8-byte header stored
 *            right before each row (rows of 8 + 256 bytes in a second flat
 *            array): what a compact index with a per-row key could do
 * Each loop runs 3 times per thread; the best time counts. Not part of the
 * engine or its tests: a measurement program (BENCHMARKS.md).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define ROWS 4000000u
#define DIM 64
#define BATCH 65536u
#define NBATCH 32u
#define LOAD 0.78

typedef struct { int64_t key; uint32_t row, spare; } e16;
typedef struct { uint32_t fp, row; } e8;

static uint64_t mix(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33; return x;
}
static void *big(size_t n) {
  size_t a = 2u << 20;
  n = (n + a - 1) & ~(a - 1);
  char *p = mmap(NULL, n + a, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) { perror("mmap"); exit(1); }
  p = (char *)(((uintptr_t)p + a - 1) & ~(uintptr_t)(a - 1));
  madvise(p, n, MADV_HUGEPAGE);
  memset(p, 0, n);
  return p;
}
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#define HROW (8 + DIM * 4) /* probe8k: key header + embedding */
static float *rows;
static char *hrows;
static e16 *ix16;
static e8 *ix8;
static uint64_t cap;
static pthread_barrier_t bar;

typedef struct { int id; int64_t *keys; uint32_t *pos; float *out; double best[4]; } worker;

static void run(worker *w, int mode) {
  for (uint32_t b = 0; b < NBATCH; b++) {
    const int64_t *k = w->keys + (size_t)b * BATCH;
    const uint32_t *p = w->pos + (size_t)b * BATCH;
    if (mode == 0) {
      for (uint32_t i = 0; i < BATCH; i++) {
        if (i + 16 < BATCH) {
          const char *r = (const char *)(rows + (size_t)p[i + 16] * DIM);
          for (int l = 0; l < 4; l++) __builtin_prefetch(r + 64 * l, 0, 2);
        }
        memcpy(w->out + (size_t)i * DIM, rows + (size_t)p[i] * DIM, DIM * 4);
      }
      continue;
    }
    uint32_t ring[64];
    for (uint32_t i = 0; i < BATCH + 8; i++) {
      if (i + 24 < BATCH) {
        uint64_t h = mix((uint64_t)k[i + 24]);
        uint64_t home = ((uint32_t)h * cap) >> 32;
        if (mode == 1) { __builtin_prefetch(ix16 + home, 0, 2); __builtin_prefetch(ix16 + home + 4, 0, 2); }
        else { __builtin_prefetch(ix8 + home, 0, 2); __builtin_prefetch(ix8 + home + 8, 0, 2); }
      }
      if (i < BATCH) {
        uint64_t h = mix((uint64_t)k[i]);
        uint64_t j = ((uint32_t)h * cap) >> 32;
        uint32_t row;
        if (mode == 1) {
          while (ix16[j].key != k[i]) if (++j == cap) j = 0;
          row = ix16[j].row;
        } else {
          while (ix8[j].fp != (uint32_t)(h >> 32)) if (++j == cap) j = 0;
          row = ix8[j].row;
        }
        ring[i & 63] = row;
        const char *r = mode == 3 ? hrows + (size_t)row * HROW
                                  : (const char *)(rows + (size_t)row * DIM);
        for (int l = 0; l < (mode == 3 ? 5 : 4); l++) __builtin_prefetch(r + 64 * l, 0, 2);
      }
      if (i >= 8) {
        const uint32_t row = ring[(i - 8) & 63];
        if (mode == 3) { /* the key check in the row's header (a fingerprint
                          * match with another key: probe on; never here) */
          const char *r = hrows + (size_t)row * HROW;
          int64_t hk;
          memcpy(&hk, r, 8);
          if (hk != k[i - 8]) abort();
          memcpy(w->out + (size_t)(i - 8) * DIM, r + 8, DIM * 4);
        } else {
          memcpy(w->out + (size_t)(i - 8) * DIM, rows + (size_t)row * DIM, DIM * 4);
        }
      }
    }
  }
}

static void *thread_main(void *arg) {
  worker *w = arg;
  for (int mode = 0; mode < 4; mode++) {
    w->best[mode] = 1e30;
    for (int rep = 0; rep < 3; rep++) {
      pthread_barrier_wait(&bar);
      double t0 = now();
      run(w, mode);
      double dt = now() - t0;
      if (dt < w->best[mode]) w->best[mode] = dt;
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  int T = argc > 1 ? atoi(argv[1]) : 2;
  if (T < 1 || T > 64) { fprintf(stderr, "usage: probe_limit [threads 1..64]\n"); return 2; }
  cap = (uint64_t)(ROWS / LOAD);
  rows = big((size_t)ROWS * DIM * 4);
  for (size_t i = 0; i < (size_t)ROWS * DIM; i++) rows[i] = (float)i;
  hrows = big((size_t)ROWS * HROW);
  for (uint32_t r = 0; r < ROWS; r++) {
    int64_t key = (int64_t)mix(r * 7ull + 1);
    memcpy(hrows + (size_t)r * HROW, &key, 8);
    memcpy(hrows + (size_t)r * HROW + 8, rows + (size_t)r * DIM, DIM * 4);
  }
  ix16 = big(cap * sizeof *ix16);
  ix8 = big(cap * sizeof *ix8);
  for (uint64_t i = 0; i < cap; i++) { ix16[i].row = UINT32_MAX; ix8[i].row = UINT32_MAX; }
  for (uint32_t r = 0; r < ROWS; r++) {
    int64_t key = (int64_t)mix(r * 7ull + 1);
    uint64_t h = mix((uint64_t)key), j = ((uint32_t)h * cap) >> 32;
    while (ix16[j].row != UINT32_MAX) if (++j == cap) j = 0;
    ix16[j].key = key; ix16[j].row = r;
    j = ((uint32_t)h * cap) >> 32;
    while (ix8[j].row != UINT32_MAX) if (++j == cap) j = 0;
    ix8[j].fp = (uint32_t)(h >> 32); ix8[j].row = r;
  }
  pthread_barrier_init(&bar, NULL, (unsigned)T);
  worker *ws = calloc((size_t)T, sizeof *ws);
  pthread_t *th = calloc((size_t)T, sizeof *th);
  for (int t = 0; t < T; t++) {
    ws[t].id = t;
    ws[t].keys = malloc((size_t)BATCH * NBATCH * 8);
    ws[t].pos = malloc((size_t)BATCH * NBATCH * 4);
    ws[t].out = big((size_t)BATCH * DIM * 4);
    uint64_t s = 12345 + 977 * (uint64_t)t;
    for (size_t i = 0; i < (size_t)BATCH * NBATCH; i++) {
      s = mix(s + i);
      ws[t].pos[i] = (uint32_t)(s % ROWS);
      ws[t].keys[i] = (int64_t)mix(ws[t].pos[i] * 7ull + 1);
    }
  }
  for (int t = 0; t < T; t++) pthread_create(&th[t], NULL, thread_main, &ws[t]);
  for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
  double rate[4];
  for (int m = 0; m < 4; m++) {
    double worst = 0;
    for (int t = 0; t < T; t++) if (ws[t].best[m] > worst) worst = ws[t].best[m];
    rate[m] = (double)T * BATCH * NBATCH / worst;
  }
  printf("{\"rows\": %u, \"dim\": %d, \"threads\": %d, \"gather_rows_per_s\": %.0f, "
         "\"probe16_keys_per_s\": %.0f, \"probe8_keys_per_s\": %.0f, "
         "\"probe8k_keys_per_s\": %.0f, \"probe16_vs_gather\": %.3f, "
         "\"probe8_vs_gather\": %.3f, \"probe8k_vs_gather\": %.3f}\n",
         ROWS, DIM, T, rate[0], rate[1], rate[2], rate[3], rate[1] / rate[0],
         rate[2] / rate[0], rate[3] / rate[0]);
  return 0;
}
