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

/* Which of `shard_count` owners (ranks) holds `key` (dynemb_key_shard, in
 * hash.c). The key hash is mixed once more, so a key's owner is independent
 * of the hash bits that choose its lock shard (the top ones) and its index
 * bucket (the low 32): the keys of one rank of a sharded table, which all
 * share an owner, spread over every lock shard and bucket of its table. */
static inline uint32_t dynemb_hash_owner(int64_t key, uint32_t shard_count) {
  if (shard_count <= 1) return 0;
  uint64_t g = dynemb_hash64(dynemb_hash_key(key) ^ 0xd6e8feb86659fd93ULL);
  return (uint32_t)(((g >> 32) * shard_count) >> 32);
}

#endif
