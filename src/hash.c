/*
 * hash.c -- the exported face of hash.h: which rank owns a key
 * (dynemb_key_shard), for the op library of several ranks, the tools and
 * Python, which must agree with the engine bit for bit and so call the
 * engine's own function instead of a copy of it.
 */
#include "dynemb.h"
#include "hash.h"

uint32_t dynemb_key_shard(int64_t key, uint32_t shard_count) {
  return dynemb_hash_owner(key, shard_count);
}
