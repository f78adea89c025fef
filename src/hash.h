/*
 * hash.h -- the one key-hash function of the engine.
 *
 * Keys are often small consecutive integers or raw 32-bit hashes; a strong
 * 64-bit mixer (the splitmix64 finalizer) spreads them over shards and
 * buckets. The same function decides lock shards and index buckets, and,
 * mixed once more, which rank owns a key (dynemb_key_shard); tests compare
 * against copies of it written out, so a change shows.
 */
#ifndef DYNEMB_HASH_H
#define DYNEMB_HASH_H

#include <stdint.h>

static inline uint64_t dynemb_hash64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

static inline uint64_t dynemb_hash_key(int64_t key) {
  return dynemb_hash64((uint64_t)key + 0x9e3779b97f4a7c15ULL);
}

#endif
