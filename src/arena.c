/*
 * arena.c -- chunk allocation, slot hand-out and the free list of the row
 * arena (see arena.h for the layout and why chunks never move).
 */
#include "arena.h"

#include <stdlib.h>
#include <string.h>

#include "dynemb.h"

#define FULL_CHUNK_BYTES (64u * 1024u)
#define MAX_FULL_SHIFT 12u /* at most 4096 rows per chunk */
#define SMALL_STEPS 4u     /* first chunk = full chunk / 2^SMALL_STEPS */

void dynemb_arena_init(dynemb_arena *a, size_t row_floats) {
  memset(a, 0, sizeof *a);
  a->row_floats = row_floats;
  size_t row_bytes = row_floats * sizeof(float);
  uint32_t s = 0;
  while (s < MAX_FULL_SHIFT && ((size_t)2 << s) * row_bytes <= FULL_CHUNK_BYTES)
    s++;
  a->full_shift = s;
  a->first_shift = s > SMALL_STEPS ? s - SMALL_STEPS : 0;
  a->free_head = DYNEMB_ARENA_NO_SLOT;
}

static uint64_t chunk_rows(const dynemb_arena *a, uint32_t c) {
  uint32_t small = a->full_shift - a->first_shift;
  if (c == 0) return UINT64_C(1) << a->first_shift;
  if (c <= small) return UINT64_C(1) << (a->first_shift + c - 1);
  return UINT64_C(1) << a->full_shift;
}

static size_t chunk_bytes(const dynemb_arena *a, uint32_t c) {
  size_t b = (size_t)chunk_rows(a, c) * a->row_floats * sizeof(float);
  return (b + 63) & ~(size_t)63;
}

void dynemb_arena_free(dynemb_arena *a) {
  for (uint32_t c = 0; c < a->nchunks; c++) free(a->chunks[c]);
  free(a->chunks);
  dynemb_arena_init(a, a->row_floats);
}

void dynemb_arena_clear_keep(dynemb_arena *a) {
  a->bumped = 0;
  a->free_head = DYNEMB_ARENA_NO_SLOT;
  a->free_count = 0;
}

static int add_chunk(dynemb_arena *a) {
  uint64_t rows = chunk_rows(a, a->nchunks);
  if (a->slots + rows > DYNEMB_ARENA_MAX_SLOTS) return DYNEMB_ECAPACITY;
  if (a->nchunks == a->chunks_cap) {
    uint32_t nc = a->chunks_cap ? a->chunks_cap * 2 : 8;
    float **p = realloc(a->chunks, nc * sizeof *p);
    if (!p) return DYNEMB_ENOMEM;
    a->chunks = p;
    a->chunks_cap = nc;
  }
  float *chunk = aligned_alloc(64, chunk_bytes(a, a->nchunks));
  if (!chunk) return DYNEMB_ENOMEM;
  a->chunks[a->nchunks++] = chunk;
  a->slots += rows;
  return DYNEMB_OK;
}

int dynemb_arena_reserve(dynemb_arena *a, uint64_t n) {
  while (dynemb_arena_available(a) < n) {
    int rc = add_chunk(a);
    if (rc) return rc;
  }
  return DYNEMB_OK;
}

int dynemb_arena_alloc(dynemb_arena *a, uint32_t *slot) {
  if (a->free_head != DYNEMB_ARENA_NO_SLOT) {
    uint32_t s = a->free_head;
    memcpy(&a->free_head, dynemb_arena_row(a, s), sizeof a->free_head);
    a->free_count--;
    *slot = s;
    return DYNEMB_OK;
  }
  if (a->bumped == a->slots) {
    int rc = add_chunk(a);
    if (rc) return rc;
  }
  *slot = (uint32_t)a->bumped++;
  return DYNEMB_OK;
}

void dynemb_arena_release(dynemb_arena *a, uint32_t slot) {
  memcpy(dynemb_arena_row(a, slot), &a->free_head, sizeof a->free_head);
  a->free_head = slot;
  a->free_count++;
}

size_t dynemb_arena_bytes(const dynemb_arena *a) {
  size_t b = (size_t)a->chunks_cap * sizeof(float *);
  for (uint32_t c = 0; c < a->nchunks; c++) b += chunk_bytes(a, c);
  return b;
}
