/*
 * table.c -- the embedding table: configuration, lookup (with admission),
 * apply (optimizer step), eviction, statistics, snapshot and import.
 *
 * Row layout (this file is the only one that knows it): a row is
 * row_floats = dim * (1 + slots) floats: the `dim` embedding floats, then
 * the optimizer's `slots` slot vectors of `dim` floats each (optim.h). In
 * memory the two parts live in parallel arena chunks (arena.h), so that
 * lookups read embeddings only; snapshots and imports use the joined
 * layout.
 *
 * Concurrency (each shard has a writer-preferring rwlock; every path that
 * holds several shard locks takes them in ascending order, so there is no
 * deadlock):
 *  - lookup: hits are served in batch order under the read locks of every
 *    shard the batch touches (taken once per batch), so the output is
 *    written sequentially; last_access is stamped with a relaxed atomic
 *    store. Misses are then grouped by shard and handled under each
 *    shard's write lock (re-probe, admission count, insert).
 *  - apply: the batch is grouped by shard (counting sort of positions by
 *    the hash's top bits); keys are deduped and repeated gradients summed
 *    outside any lock; each shard's rows are updated under its write lock.
 *  - evict: one shard at a time under its write lock.
 *  - snapshot / import / clear: every shard lock at once, so they see or
 *    make one consistent state.
 * Counters are per-call sums added with relaxed atomics.
 *
 * Memory latency is hidden by software prefetch: index entries a dozen
 * keys ahead, rows (and gradient rows) a few keys ahead.
 */
#include "table.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "hash.h"
#include "init.h"
#include "optim.h"

#define DEFAULT_SHARDS 64 /* why 64: dynemb.h, dynemb_table_config.shards */
#define MAX_SHARDS 4096
#define MAX_DIM 65536
#define MAX_NAME 255
#define IDX_PF 12 /* keys ahead for index prefetch */
#define ROW_PF 4  /* keys ahead for row prefetch */
#define MISS_PF 8 /* misses ahead for index prefetch while inserting */
#define REC_PF 4  /* misses ahead for SSD record prefetch (< MISS_PF) */
#define MAX_NOW INT64_C(4294967295)

#define RELAXED __ATOMIC_RELAXED
#define LOAD(p) __atomic_load_n((p), RELAXED)
#define STORE(p, v) __atomic_store_n((p), (v), RELAXED)
#define ADD(p, v) __atomic_fetch_add((p), (v), RELAXED)

/* ------------------------------------------------------------------------ */
/* Configuration                                                             */
/* ------------------------------------------------------------------------ */

void dynemb_table_config_init(dynemb_table_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->init.kind = DYNEMB_INIT_ZEROS;
  cfg->optimizer.kind = DYNEMB_OPT_SGD;
  cfg->optimizer.learning_rate = 0.01f;
  cfg->optimizer.initial_accumulator_value = 0.1f;
  cfg->optimizer.beta1 = 0.9f;
  cfg->optimizer.beta2 = 0.999f;
  cfg->optimizer.epsilon = 1e-8f;
  cfg->optimizer.learning_rate_power = -0.5f;
  cfg->nonfinite_policy = DYNEMB_NONFINITE_ERROR;
}

static int validate_config(const dynemb_table_config *cfg) {
  if (!cfg)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table config is NULL; pass a config filled by "
                            "dynemb_table_config_init");
  if (!cfg->name || !cfg->name[0])
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table config: name is %s; set cfg.name to a "
                            "unique table name",
                            cfg->name ? "empty" : "NULL");
  const char *nm = cfg->name;
  size_t len = strlen(nm);
  if (len > MAX_NAME)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%.40s...': name is %zu bytes long; use at "
                            "most %d bytes",
                            nm, len, MAX_NAME);
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)nm[i] < 0x20 || nm[i] == 0x7f)
      return dynemb_error_set(DYNEMB_EINVAL,
                              "table '%s': name contains a control character "
                              "at byte %zu; use printable characters",
                              nm, i);
  if (cfg->dim < 1 || cfg->dim > MAX_DIM)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': dim = %d is invalid; set cfg.dim to "
                            "the embedding width, 1 .. %d",
                            nm, cfg->dim, MAX_DIM);
  int rc = dynemb_init_validate(&cfg->init, nm);
  if (rc) return rc;
  rc = dynemb_optim_validate(&cfg->optimizer, nm);
  if (rc) return rc;
  if (cfg->eviction_threshold < 0)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': eviction_threshold = %lld is "
                            "negative; use 0 to disable eviction or a "
                            "positive age in your time unit",
                            nm, (long long)cfg->eviction_threshold);
  if (cfg->nonfinite_policy != DYNEMB_NONFINITE_ERROR &&
      cfg->nonfinite_policy != DYNEMB_NONFINITE_SKIP)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': nonfinite_policy = %d is unknown; "
                            "use DYNEMB_NONFINITE_ERROR or _SKIP",
                            nm, cfg->nonfinite_policy);
  int s = cfg->shards;
  if (s != 0 && (s < 1 || s > MAX_SHARDS || (s & (s - 1)) != 0))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': shards = %d is invalid; use 0 "
                            "(default %d) or a power of two from 1 to %d",
                            nm, s, DEFAULT_SHARDS, MAX_SHARDS);
  if (cfg->ssd_vocabulary_size != 0 &&
      (!cfg->ssd_data_path || !cfg->ssd_data_path[0]))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': ssd_vocabulary_size = %llu needs "
                            "ssd_data_path (a directory); set it or set "
                            "ssd_vocabulary_size to 0",
                            nm, (unsigned long long)cfg->ssd_vocabulary_size);
  if (cfg->device_vocabulary_size != 0)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': device_vocabulary_size = %llu: the "
                            "device tier is not implemented in this version; "
                            "set it to 0 (rows live in host memory)",
                            nm,
                            (unsigned long long)cfg->device_vocabulary_size);
  if (cfg->ssd_vocabulary_size != 0 && cfg->host_vocabulary_size == 0)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': ssd_vocabulary_size = %llu needs a "
                            "host tier budget: host memory is the cache above "
                            "the SSD tier; set host_vocabulary_size > 0 (the "
                            "rows kept in memory)",
                            nm, (unsigned long long)cfg->ssd_vocabulary_size);
  if (cfg->ssd_vocabulary_size > DYNEMB_SSD_MAX_RECORDS)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': ssd_vocabulary_size = %llu is above "
                            "the tier's limit of %llu rows per table; lower it",
                            nm, (unsigned long long)cfg->ssd_vocabulary_size,
                            (unsigned long long)DYNEMB_SSD_MAX_RECORDS);
  return DYNEMB_OK;
}

int dynemb_table_new(const dynemb_table_config *cfg, dynemb_table **out) {
  int rc = validate_config(cfg);
  if (rc) return rc;
  dynemb_table *t = calloc(1, sizeof *t);
  if (!t) goto nomem;
  dynemb_ssd_init_off(&t->ssd);
  t->cfg = *cfg;
  t->name = strdup(cfg->name);
  t->default_value = calloc((size_t)cfg->dim, sizeof(float));
  if (!t->name || !t->default_value) goto nomem;
  if (cfg->default_value)
    memcpy(t->default_value, cfg->default_value, (size_t)cfg->dim * sizeof(float));
  if (cfg->ssd_data_path && !(t->ssd_data_path = strdup(cfg->ssd_data_path)))
    goto nomem;
  t->cfg.name = t->name;
  t->cfg.default_value = t->default_value;
  t->cfg.ssd_data_path = t->ssd_data_path;
  t->dim = cfg->dim;
  t->slots = dynemb_optim_slot_count(cfg->optimizer.kind);
  t->row_floats = cfg->dim * (1 + t->slots);
  t->nshards = cfg->shards ? (uint32_t)cfg->shards : DEFAULT_SHARDS;
  t->cfg.shards = (int)t->nshards;
  while ((UINT32_C(1) << t->shard_bits) < t->nshards) t->shard_bits++;
  t->access_threshold = cfg->access_threshold;
  t->eviction_threshold = cfg->eviction_threshold;
  t->refs = 1;
  const size_t emb_f = (size_t)t->dim, slot_f = (size_t)t->dim * t->slots;
  const size_t row_f = (size_t)t->row_floats;
  if (dynemb_slab_pool_init(&t->pool,
                            dynemb_arena_max_chunk_bytes(row_f, emb_f)))
    goto nomem;
  if (dynemb_slab_pool_init(&t->slot_pool,
                            dynemb_arena_max_chunk_bytes(row_f,
                                                         slot_f ? slot_f : 1))) {
    dynemb_slab_pool_destroy(&t->pool);
    goto nomem;
  }
  t->shards = aligned_alloc(64, t->nshards * sizeof *t->shards);
  if (!t->shards) goto nomem_pool;
  /* Writer preference: a stream of multi-shard readers (batched lookups,
   * snapshots) must not starve inserts and applies. Every path that holds
   * several shard locks takes them in ascending order, so there is no
   * deadlock. */
  pthread_rwlockattr_t attr;
  pthread_rwlockattr_init(&attr);
  pthread_rwlockattr_setkind_np(&attr,
                                PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  for (uint32_t s = 0; s < t->nshards; s++) {
    dynemb_shard *sh = &t->shards[s];
    memset(sh, 0, sizeof *sh);
    if (pthread_rwlock_init(&sh->lock, &attr) != 0) {
      for (uint32_t k = 0; k < s; k++) {
        pthread_rwlock_destroy(&t->shards[k].lock);
      }
      pthread_rwlockattr_destroy(&attr);
      free(t->shards);
      t->shards = NULL;
      goto nomem_pool;
    }
    double stagger = (double)s / (double)t->nshards;
    dynemb_index_init(&sh->rows, stagger);
    dynemb_index_init(&sh->cands, stagger);
    dynemb_arena_init(&sh->arena, emb_f, slot_f, &t->pool, &t->slot_pool);
    sh->rng = UINT64_C(0x9e3779b97f4a7c15) * (s + 1);
  }
  pthread_rwlockattr_destroy(&attr);
  if (cfg->ssd_vocabulary_size) {
    rc = dynemb_ssd_open(&t->ssd, t->ssd_data_path, t->name,
                         emb_f * sizeof(float), slot_f * sizeof(float),
                         cfg->ssd_vocabulary_size);
    if (rc) { /* the message names the directory */
      dynemb_table_destroy(t);
      return rc;
    }
  }
  *out = t;
  return DYNEMB_OK;
nomem_pool:
  dynemb_slab_pool_destroy(&t->pool);
  dynemb_slab_pool_destroy(&t->slot_pool);
nomem:
  if (t) {
    free(t->name);
    free(t->default_value);
    free(t->ssd_data_path);
    free(t);
  }
  return dynemb_error_set(DYNEMB_ENOMEM,
                          "table '%s': out of memory while creating it",
                          cfg->name);
}

void dynemb_table_destroy(dynemb_table *t) {
  if (!t) return;
  if (t->shards) {
    for (uint32_t s = 0; s < t->nshards; s++) {
      dynemb_shard *sh = &t->shards[s];
      dynemb_index_free(&sh->rows);
      dynemb_index_free(&sh->cands);
      dynemb_arena_free(&sh->arena);
      free(sh->slot_key);
      free(sh->host_pos);
      free(sh->host_list);
      pthread_rwlock_destroy(&sh->lock);
    }
    free(t->shards);
    dynemb_slab_pool_destroy(&t->pool);
    dynemb_slab_pool_destroy(&t->slot_pool);
  }
  dynemb_ssd_close(&t->ssd);
  free(t->name);
  free(t->default_value);
  free(t->ssd_data_path);
  free(t);
}

/* ------------------------------------------------------------------------ */
/* Properties                                                                */
/* ------------------------------------------------------------------------ */

const char *dynemb_table_name(const dynemb_table *t) { return t ? t->name : ""; }
int dynemb_table_dim(const dynemb_table *t) { return t ? t->dim : 0; }
int dynemb_table_row_floats(const dynemb_table *t) {
  return t ? t->row_floats : 0;
}

void dynemb_table_get_config(const dynemb_table *t, dynemb_table_config *cfg) {
  if (!t || !cfg) return;
  *cfg = t->cfg;
  cfg->access_threshold = LOAD(&t->access_threshold);
  cfg->eviction_threshold = LOAD(&t->eviction_threshold);
}

static int null_table(const char *fn) {
  return dynemb_error_set(DYNEMB_EINVAL,
                          "%s: table is NULL; pass a table from "
                          "dynemb_table_create or dynemb_table_find",
                          fn);
}

int dynemb_table_set_access_threshold(dynemb_table *t, uint32_t threshold) {
  dynemb_error_clear();
  if (!t) return null_table("dynemb_table_set_access_threshold");
  STORE(&t->access_threshold, threshold);
  return DYNEMB_OK;
}

int dynemb_table_set_eviction_threshold(dynemb_table *t, int64_t threshold) {
  dynemb_error_clear();
  if (!t) return null_table("dynemb_table_set_eviction_threshold");
  if (threshold < 0)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': eviction threshold %lld is negative; "
                            "use 0 to disable eviction or a positive age",
                            t->name, (long long)threshold);
  STORE(&t->eviction_threshold, threshold);
  return DYNEMB_OK;
}

uint32_t dynemb_key_shard(int64_t key, uint32_t shard_count) {
  if (shard_count <= 1) return 0;
  return (uint32_t)(((dynemb_hash_key(key) >> 32) * shard_count) >> 32);
}

void dynemb_widen_keys(const int32_t *in, size_t n, int64_t *out) {
  for (size_t i = 0; i < n; i++) out[i] = (int64_t)in[i];
}

/* Raises the table clock to `now` (never lowers it). */
static void clock_advance(dynemb_table *t, uint32_t now) {
  uint32_t cur = LOAD(&t->clock);
  while (cur < now && !__atomic_compare_exchange_n(&t->clock, &cur, now, 1,
                                                   RELAXED, RELAXED)) {
  }
}

static int check_now(const dynemb_table *t, int64_t now) {
  if (now < 0 || now > MAX_NOW)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': now = %lld is out of range; pass a "
                            "time in [0, 2^32-1] (global step or Unix "
                            "seconds)",
                            t->name, (long long)now);
  return DYNEMB_OK;
}

/* ------------------------------------------------------------------------ */
/* Repeated keys within a batch                                              */
/* ------------------------------------------------------------------------ */

/* The first occurrence of each key of a batch (apply's dedupe): open
 * addressing over batch positions, at least twice as many entries as the
 * batch has keys. An entry holds the key hash's high half (compared first,
 * so another key rarely costs a load of its own) above position + 1; 0 is
 * empty. */
typedef struct firsts_table {
  uint64_t *slot;
  uint64_t mask;
} firsts_table;

static int firsts_init(firsts_table *ft, size_t n) {
  uint64_t cap = 16;
  while (cap < 2 * (uint64_t)n) cap *= 2;
  ft->mask = cap - 1;
  ft->slot = calloc(cap, sizeof *ft->slot);
  return ft->slot ? DYNEMB_OK : DYNEMB_ENOMEM;
}

/* The position of the first occurrence of keys[i] (hash h) among keys[0 ..
 * i], all of which were passed in order before: i itself for a new key. */
static inline uint32_t first_of(firsts_table *ft, const int64_t *keys,
                                uint64_t h, uint32_t i) {
  const uint64_t tag = h & ~(uint64_t)UINT32_MAX;
  uint64_t j = h & ft->mask, e;
  while ((e = ft->slot[j]) != 0) {
    if ((e & ~(uint64_t)UINT32_MAX) == tag && keys[(uint32_t)e - 1] == keys[i])
      return (uint32_t)e - 1;
    j = (j + 1) & ft->mask;
  }
  ft->slot[j] = tag | (i + 1);
  return i;
}

/* Copies a row of `dim` floats, with fixed-size copies for common widths
 * (a libc call per row of a small table costs more than the copy). */
static inline void copy_row(float *restrict dst, const float *restrict src,
                            size_t dim) {
  switch (dim) {
  case 1: memcpy(dst, src, 1 * sizeof(float)); break;
  case 8: memcpy(dst, src, 8 * sizeof(float)); break;
  case 16: memcpy(dst, src, 16 * sizeof(float)); break;
  case 32: memcpy(dst, src, 32 * sizeof(float)); break;
  case 64: memcpy(dst, src, 64 * sizeof(float)); break;
  default: memcpy(dst, src, dim * sizeof(float)); break;
  }
}

/* Prefetches the cache lines of [p, p + bytes) (at most 1 KiB) into L2
 * (locality 2: prefetcht1 on x86), also for rows about to be written:
 * measured on an AMD EPYC VM (4M x 64, 2 threads), L2 prefetches sustain
 * ~1.8x the random row rate of prefetcht0/prefetchw, which fill L1 and are
 * limited by its few miss buffers (and gcc turns any write-intent
 * prefetch into prefetchw where the target has it). */
static inline void prefetch_lines(const void *p, size_t bytes) {
  uintptr_t a = (uintptr_t)p & ~(uintptr_t)63;
  const uintptr_t end = (uintptr_t)p + (bytes > 1024 ? 1024 : bytes);
  for (; a < end; a += 64) __builtin_prefetch((const void *)a, 0, 2);
}

/* The embedding of the row at `loc`. */
static inline float *row_of(const dynemb_shard *sh, uint32_t loc) {
  return dynemb_arena_row(&sh->arena, DYNEMB_LOC_SLOT(loc));
}

/* The optimizer slots of the row at `loc` (tables with slots only). */
static inline float *slots_of(const dynemb_shard *sh, uint32_t loc) {
  return dynemb_arena_slots(&sh->arena, DYNEMB_LOC_SLOT(loc));
}

static inline void stamp(dynemb_index_entry *e, uint32_t now) {
  if (LOAD(&e->last_access) < now) STORE(&e->last_access, now);
}

/* Row hints (dynemb_prepare_hints / dynemb_lookup_hinted): the shard's
 * generation (low 20 bits), the shard and the row location. */
#define HINT_GEN_MASK UINT32_C(0xfffff)
static inline uint64_t make_hint(const dynemb_shard *sh, uint32_t shard,
                                 uint32_t loc) {
  return ((uint64_t)(sh->gen & HINT_GEN_MASK) << 44) | ((uint64_t)shard << 32) |
         loc;
}
#define HINT_SHARD(h) ((uint32_t)((h) >> 32) & 0xfffu)
#define HINT_GEN(h) ((uint32_t)((h) >> 44))
#define HINT_LOC(h) ((uint32_t)(h))

/* Whether hint `hi` names a row's slot in host memory of a shard whose
 * current hint tag (a hint's high half: generation and shard) is `tag` and
 * that has `slots` slots. */
static inline int hint_current(uint64_t hi, uint32_t tag, uint64_t slots) {
  return (uint32_t)(hi >> 32) == tag &&
         DYNEMB_LOC_TIER(HINT_LOC(hi)) == DYNEMB_TIER_HOST &&
         DYNEMB_LOC_SLOT(HINT_LOC(hi)) < slots;
}

static inline uint32_t hint_tag(const dynemb_shard *sh, uint32_t shard) {
  return (uint32_t)(make_hint(sh, shard, 0) >> 32);
}

/* Whether hint `hi` of shard `sh` (locked) still names its row's slot in
 * host memory. */
static inline int hint_valid(const dynemb_shard *sh, uint64_t hi) {
  return hint_current(hi, hint_tag(sh, HINT_SHARD(hi)), sh->arena.slots);
}

/* What a hinted read needs of a read-locked shard, copied once per call
 * into an array side by side rather than read from each shard's struct for
 * every key (a training batch touches every shard of a table, a few keys
 * each; hinted reads of bench/step_costs's batches: 8.0-8.5 -> 7.0-7.1 ns
 * per id): a current hint's high half (generation and shard), the slot
 * count, and the first chunk, which holds all rows of small shards. */
typedef struct shard_view {
  uint32_t tag;
  uint32_t first_rows; /* rows of the first chunk (0: none yet) */
  uint64_t slots;
  const float *first;  /* row stride: dim (the arena's emb_floats) */
} shard_view;

static inline void shard_view_of(const dynemb_shard *sh, uint32_t shard,
                                 shard_view *v) {
  v->tag = hint_tag(sh, shard);
  v->slots = sh->arena.slots;
  v->first = sh->arena.nchunks ? sh->arena.chunks[0] : NULL;
  v->first_rows = sh->arena.nchunks ? UINT32_C(1) << sh->arena.first_shift : 0;
}


/* ------------------------------------------------------------------------ */
/* Inserting rows                                                            */
/* ------------------------------------------------------------------------ */

static int budget_error(const dynemb_table *t) {
  return dynemb_error_set(
      DYNEMB_ECAPACITY,
      "table '%s': host_vocabulary_size = %llu rows is full; raise "
      "host_vocabulary_size or enable eviction (eviction_threshold and "
      "dynemb_evict)",
      t->name, (unsigned long long)t->cfg.host_vocabulary_size);
}

static int insert_error(const dynemb_table *t, int rc) {
  if (rc == DYNEMB_ECAPACITY)
    return dynemb_error_set(DYNEMB_ECAPACITY,
                            "table '%s': a shard reached 2^30 rows; create "
                            "the table with more shards",
                            t->name);
  return dynemb_error_set(DYNEMB_ENOMEM,
                          "table '%s': out of memory while inserting rows; "
                          "lower the vocabulary (host_vocabulary_size, "
                          "eviction) or add memory",
                          t->name);
}

/* ------------------------------------------------------------------------ */
/* The SSD tier (ssd.h): host memory is a budgeted cache above it            */
/* ------------------------------------------------------------------------ */

static inline int on_host(uint32_t loc) {
  return DYNEMB_LOC_TIER(loc) == DYNEMB_TIER_HOST;
}

#define VICTIM_SAMPLE 8 /* rows in memory compared for each one moved */
#define VICTIM_SCAN 128 /* index entries looked at for them first */
#define NO_HOST_POS UINT32_MAX

/* The host slots' keys and list (table.h, dynemb_shard.slot_key) of a
 * table with an SSD tier: room for slots [0, n). */
static int slots_reserve(dynemb_shard *sh, uint64_t n) {
  if (n <= sh->slot_cap) return DYNEMB_OK;
  uint64_t cap = sh->slot_cap ? sh->slot_cap : 64;
  while (cap < n) cap *= 2;
  int64_t *k = realloc(sh->slot_key, cap * sizeof *k);
  if (!k) return DYNEMB_ENOMEM;
  sh->slot_key = k;
  uint32_t *l = realloc(sh->host_list, cap * sizeof *l);
  if (!l) return DYNEMB_ENOMEM;
  sh->host_list = l;
  uint32_t *p = realloc(sh->host_pos, cap * sizeof *p);
  if (!p) return DYNEMB_ENOMEM;
  memset(p + sh->slot_cap, 0xff, (cap - sh->slot_cap) * sizeof *p);
  sh->host_pos = p;
  sh->slot_cap = cap;
  return DYNEMB_OK;
}

/* Host slot `slot` of shard `sh` now holds `key` (tables with an SSD tier;
 * others keep no slot keys). ENOMEM leaves nothing changed. */
static int slot_taken(const dynemb_table *t, dynemb_shard *sh, uint32_t slot,
                      int64_t key) {
  if (!dynemb_ssd_on(&t->ssd)) return DYNEMB_OK;
  int rc = slots_reserve(sh, (uint64_t)slot + 1);
  if (rc) return rc;
  sh->slot_key[slot] = key;
  sh->host_pos[slot] = (uint32_t)sh->host_count;
  sh->host_list[sh->host_count++] = slot;
  return DYNEMB_OK;
}

static void slot_freed(dynemb_shard *sh, uint32_t slot) {
  if (slot >= sh->slot_cap || sh->host_pos[slot] == NO_HOST_POS) return;
  const uint32_t pos = sh->host_pos[slot], last = sh->host_list[--sh->host_count];
  sh->host_list[pos] = last; /* the last one takes its place */
  sh->host_pos[last] = pos;
  sh->host_pos[slot] = NO_HOST_POS;
}

/* No slot of the shard holds a row in memory (clear, replace). */
static void slots_clear(dynemb_shard *sh) {
  if (sh->slot_cap) memset(sh->host_pos, 0xff, sh->slot_cap * sizeof *sh->host_pos);
  sh->host_count = 0;
}

static inline uint64_t shard_rand(dynemb_shard *sh) { /* xorshift64 */
  sh->rng ^= sh->rng << 13;
  sh->rng ^= sh->rng >> 7;
  sh->rng ^= sh->rng << 17;
  return sh->rng;
}

static int full_error(const dynemb_table *t) {
  return dynemb_error_set(
      DYNEMB_ECAPACITY,
      "table '%s': host_vocabulary_size = %llu plus ssd_vocabulary_size = "
      "%llu rows are full; raise ssd_vocabulary_size or enable eviction "
      "(eviction_threshold and dynemb_evict)",
      t->name, (unsigned long long)t->cfg.host_vocabulary_size,
      (unsigned long long)t->cfg.ssd_vocabulary_size);
}

/* Moves one row of shard `sh` (write-locked) from host memory to the SSD
 * tier: the least recently accessed of VICTIM_SAMPLE rows in memory, never
 * `keep` (may be NULL). Where rows in memory are at least an eighth of the
 * shard's rows, they are the ones met in the index after the shard's hand
 * (within VICTIM_SCAN entries: a few cache lines, read in order); the rest
 * of the sample is drawn at random from the list of rows in memory (and if
 * every draw met `keep`, the first other row of the list is taken).
 * *moved = 0 when the shard has no such row. Each move bumps the
 * shard's generation, so every hint made before it goes stale: a hint can
 * never name a slot whose row has moved. The row goes to record *spare
 * when that is not NO_RECORD (then taken: set to NO_RECORD), else to a
 * new one. Errors: ECAPACITY (the SSD tier is full; no message), EIO. */
#define NO_RECORD UINT32_MAX
static dynemb_index_entry *host_entry(dynemb_shard *sh, uint32_t slot) {
  const int64_t key = sh->slot_key[slot];
  return dynemb_index_find(&sh->rows, key, dynemb_hash_key(key));
}

static int demote_one(dynemb_table *t, dynemb_shard *sh,
                      const dynemb_index_entry *keep, uint32_t *spare,
                      int *moved) {
  *moved = 0;
  const uint64_t hosts = sh->host_count;
  if (!hosts) return DYNEMB_OK;
  dynemb_index_entry *best = NULL;
  int seen = 0;
  /* 1. dense: the index entries after the shard's hand */
  dynemb_index *ix = &sh->rows;
  if (hosts * 8 >= ix->count) {
    uint64_t i = sh->hand < ix->cap ? sh->hand : 0;
    for (uint64_t k = 0; k < VICTIM_SCAN && k < ix->cap && seen < VICTIM_SAMPLE;
         k++) {
      dynemb_index_entry *e = ix->slots + i;
      if (++i == ix->cap) i = 0;
      if (e->loc == DYNEMB_LOC_EMPTY || !on_host(e->loc) || e == keep) continue;
      seen++;
      if (!best || LOAD(&e->last_access) < LOAD(&best->last_access)) best = e;
    }
    sh->hand = i;
  }
  /* 2. random draws among the rows in memory */
  for (int k = seen; k < VICTIM_SAMPLE; k++) {
    dynemb_index_entry *e = host_entry(sh, sh->host_list[shard_rand(sh) % hosts]);
    if (!e || e == keep) continue;
    if (!best || LOAD(&e->last_access) < LOAD(&best->last_access)) best = e;
  }
  for (uint64_t k = 0; !best && k < hosts; k++) {
    dynemb_index_entry *e = host_entry(sh, sh->host_list[k]);
    if (e && e != keep) best = e;
  }
  if (!best) return DYNEMB_OK;
  uint32_t rec = *spare;
  int rc = rec != NO_RECORD ? DYNEMB_OK : dynemb_ssd_alloc(&t->ssd, &rec);
  if (rc) return rc;
  const uint32_t slot = DYNEMB_LOC_SLOT(best->loc);
  rc = dynemb_ssd_write(&t->ssd, rec, dynemb_arena_row(&sh->arena, slot),
                        t->slots ? dynemb_arena_slots(&sh->arena, slot) : NULL);
  if (rc) {
    if (*spare == NO_RECORD) dynemb_ssd_release(&t->ssd, rec);
    return rc;
  }
  *spare = NO_RECORD;
  sh->gen++;
  dynemb_arena_release(&sh->arena, slot);
  slot_freed(sh, slot);
  best->loc = DYNEMB_LOC(DYNEMB_TIER_SSD, rec);
  ADD(&t->rows_total, (uint64_t)-1);
  *moved = 1;
  return DYNEMB_OK;
}

/* demote_one on another shard than `sh` (whose write lock the caller
 * holds): the first of the others, from the one after `sh`, whose write
 * lock is free right now (a try-lock, so two threads doing this cannot
 * deadlock) and that has a row in memory. */
static int demote_elsewhere(dynemb_table *t, const dynemb_shard *sh,
                            uint32_t *spare, int *moved) {
  *moved = 0;
  const uint32_t S = t->nshards, from = (uint32_t)(sh - t->shards);
  int rc = DYNEMB_OK;
  for (uint32_t k = 1; k < S && !*moved && !rc; k++) {
    dynemb_shard *o = &t->shards[(from + k) & (S - 1)];
    if (pthread_rwlock_trywrlock(&o->lock) != 0) continue;
    rc = demote_one(t, o, NULL, spare, moved);
    pthread_rwlock_unlock(&o->lock);
  }
  return rc;
}

/* When a row enters the host memory of shard `sh` (write-locked) of a
 * table with an SSD tier (`entering` = 1 before it is counted in
 * rows_total, 0 after) and memory is over its budget: moves up to two
 * rows (not `keep`) to SSD; two, so that memory over its budget comes back
 * to it. They come from `sh`, or when it has no other row in memory, from
 * another shard that is free (demote_elsewhere); if none is, memory exceeds
 * its budget until a later call moves rows. The first row moved goes to
 * record `spare` when that is not NO_RECORD (released if no row moves).
 * Errors: ECAPACITY (both tiers full; message set), EIO. */
static int make_room(dynemb_table *t, dynemb_shard *sh,
                     const dynemb_index_entry *keep, uint64_t entering,
                     uint32_t spare) {
  const uint64_t budget = t->cfg.host_vocabulary_size;
  int rc = DYNEMB_OK;
  for (int k = 0; k < 2 && LOAD(&t->rows_total) + entering > budget; k++) {
    int moved = 0;
    rc = demote_one(t, sh, keep, &spare, &moved);
    if (!rc && !moved) rc = demote_elsewhere(t, sh, &spare, &moved);
    if (rc == DYNEMB_ECAPACITY) rc = full_error(t);
    if (rc || !moved) break;
  }
  if (spare != NO_RECORD) dynemb_ssd_release(&t->ssd, spare);
  return rc;
}

/* Brings the row of entry `e` (on the SSD tier) of shard `sh`
 * (write-locked) into host memory, then makes room (make_room) for it:
 * the row moved out takes the record just read (no allocation, and its
 * lines are in cache). Nothing changes if reading fails. */
static int promote(dynemb_table *t, dynemb_shard *sh, dynemb_index_entry *e) {
  uint32_t slot = 0;
  int rc = dynemb_arena_alloc(&sh->arena, &slot);
  if (!rc && (rc = slot_taken(t, sh, slot, e->key)))
    dynemb_arena_release(&sh->arena, slot);
  if (rc) return insert_error(t, rc);
  const uint32_t rec = DYNEMB_LOC_SLOT(e->loc);
  rc = dynemb_ssd_read(&t->ssd, rec, dynemb_arena_row(&sh->arena, slot),
                       t->slots ? dynemb_arena_slots(&sh->arena, slot) : NULL);
  if (rc) {
    dynemb_arena_release(&sh->arena, slot);
    slot_freed(sh, slot);
    return rc;
  }
  e->loc = DYNEMB_LOC(DYNEMB_TIER_HOST, slot);
  ADD(&t->rows_total, 1);
  rc = make_room(t, sh, e, 0, rec);
  /* the row count did not grow: a full SSD tier (a second row to move
   * found no record) only leaves memory over its budget for now */
  return rc == DYNEMB_ECAPACITY ? DYNEMB_OK : rc;
}

/* Inserts a fresh row for absent `key` in shard `sh` (write-locked),
 * growing the index into `spare` (may be NULL) if it was made for that.
 * With an SSD tier, rows move there first (make_room). Nothing changes on
 * failure but such moves. */
static int insert_row(dynemb_table *t, dynemb_shard *sh, int64_t key,
                      uint64_t h, uint32_t now, dynemb_index_spare *spare,
                      dynemb_index_entry **out) {
  /* rows_total is kept only for a budget (fixed at creation), so that
   * unbudgeted inserts on different shards share no cache line */
  uint64_t budget = t->cfg.host_vocabulary_size;
  if (dynemb_ssd_on(&t->ssd)) {
    int rc = make_room(t, sh, NULL, 1, NO_RECORD);
    if (rc) return rc;
    ADD(&t->rows_total, 1);
  } else if (budget && ADD(&t->rows_total, 1) >= budget) {
    ADD(&t->rows_total, (uint64_t)-1);
    return budget_error(t);
  }
  int rc = dynemb_index_reserve_spare(&sh->rows, sh->rows.count + 1, spare);
  uint32_t slot = 0;
  if (!rc) rc = dynemb_arena_alloc(&sh->arena, &slot);
  if (!rc && (rc = slot_taken(t, sh, slot, key)))
    dynemb_arena_release(&sh->arena, slot);
  if (rc) {
    if (budget) ADD(&t->rows_total, (uint64_t)-1);
    return insert_error(t, rc);
  }
  float *row = dynemb_arena_row(&sh->arena, slot);
  dynemb_init_row(&t->cfg.init, key, row, t->dim);
  if (t->slots)
    dynemb_optim_init_slots(&t->cfg.optimizer,
                            dynemb_arena_slots(&sh->arena, slot), t->dim);
  *out = dynemb_index_insert(&sh->rows, key, h,
                             DYNEMB_LOC(DYNEMB_TIER_HOST, slot), now);
  if (sh->cands.count) { /* a key is never both a row and a candidate */
    dynemb_index_entry *c = dynemb_index_find(&sh->cands, key, h);
    if (c) dynemb_index_erase_at(&sh->cands, (uint64_t)(c - sh->cands.slots));
  }
  return DYNEMB_OK;
}

/* ------------------------------------------------------------------------ */
/* Lookup                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct lookup_counts {
  uint64_t hits, inserted, rejected;
  uint64_t on_ssd; /* hits whose row was on the SSD tier */
} lookup_counts;

/* Handles the misses of one shard under its write lock: re-probe (another
 * thread or an earlier occurrence may have inserted the key), admission
 * counting, insertion. `miss` lists batch positions in batch order. */
static int lookup_misses(dynemb_table *t, dynemb_shard *sh,
                         const int64_t *keys, const uint64_t *hs,
                         const uint32_t *miss, uint32_t nmiss, uint32_t now,
                         uint32_t threshold, float *out, uint8_t *admitted,
                         uint64_t *hints, dynemb_index_spare *spare,
                         lookup_counts *lc) {
  const uint32_t shard = (uint32_t)(sh - t->shards);
  const size_t dim = (size_t)t->dim, rbytes = dim * sizeof(float);
  const int ssd = dynemb_ssd_on(&t->ssd);
  int rc = DYNEMB_OK;
  pthread_rwlock_wrlock(&sh->lock);
  for (uint32_t m = 0; m < nmiss; m++) {
    uint32_t i = miss[m];
    int64_t key = keys[i];
    uint64_t h = hs[i];
    /* the re-probes would each wait for DRAM under the write lock: fetch
     * the index entries ahead (a rehash during the loop only makes some
     * of these prefetches useless) */
    if (m + MISS_PF < nmiss) {
      uint64_t hp = hs[miss[m + MISS_PF]];
      dynemb_index_prefetch(&sh->rows, hp);
      if (threshold > 1) dynemb_index_prefetch(&sh->cands, hp);
    }
    /* and a row on the SSD tier, once its entry is in cache: promote
     * copies it out of the file's mapping */
    if (ssd && m + REC_PF < nmiss) {
      uint32_t j = miss[m + REC_PF];
      const dynemb_index_entry *pe = dynemb_index_find(&sh->rows, keys[j], hs[j]);
      if (pe && !on_host(pe->loc))
        dynemb_ssd_prefetch(&t->ssd, DYNEMB_LOC_SLOT(pe->loc));
    }
    float *dst = out ? out + (size_t)i * dim : NULL;
    dynemb_index_entry *e = dynemb_index_find(&sh->rows, key, h);
    if (admitted) admitted[i] = 1; /* reset below when rejected */
    if (hints) hints[i] = DYNEMB_NO_HINT; /* set below when it has a row */
    if (e) { /* on the SSD tier, inserted since the read pass, or repeated
              * in the batch */
      if (!on_host(e->loc) && (rc = promote(t, sh, e))) break;
      stamp(e, now);
      if (hints) hints[i] = make_hint(sh, shard, e->loc);
      if (dst) memcpy(dst, row_of(sh, e->loc), rbytes);
      lc->hits++;
      continue;
    }
    if (threshold > 1) {
      dynemb_index_entry *c = dynemb_index_find(&sh->cands, key, h);
      if (!c) {
        if (dynemb_index_reserve(&sh->cands, sh->cands.count + 1)) {
          rc = insert_error(t, DYNEMB_ENOMEM);
          break;
        }
        c = dynemb_index_insert(&sh->cands, key, h, 1, now);
      } else {
        if (c->loc < DYNEMB_LOC_EMPTY - 1) c->loc++;
        if (c->last_access < now) c->last_access = now;
      }
      if (c->loc < threshold) {
        if (dst) memcpy(dst, t->default_value, rbytes);
        if (admitted) admitted[i] = 0;
        lc->rejected++;
        continue;
      }
      /* admitted: insert_row removes the candidate */
    }
    rc = insert_row(t, sh, key, h, now, spare, &e);
    if (rc) break;
    if (hints) hints[i] = make_hint(sh, shard, e->loc);
    if (dst) memcpy(dst, row_of(sh, e->loc), rbytes);
    lc->inserted++;
  }
  pthread_rwlock_unlock(&sh->lock);
  return rc;
}

#define RING 16 /* > ROW_DIST */
#define ROW_DIST 6
/* Keys between a row's prefetch and its copy in hinted reads: with no
 * index probe in between, they can run further ahead (measured, 4M x 64,
 * 2 threads, 10 alternating runs: 14 read 1.0-1.6x as many keys per second
 * as 6; 20 did not do better than 14). */
#define HINT_DIST 14
#define HINT_RING 32 /* > HINT_DIST, a power of two */

/* Looks up n < 2^32 keys.
 *
 * Hits are served in batch order (so `out` is written sequentially) with
 * the read locks of every shard the batch touches held at once (taken in
 * ascending order), in a software pipeline: the index entry of key
 * i + IDX_PF is prefetched, key i is probed and its row prefetched, and
 * the row of key i - ROW_DIST is copied. Misses are then grouped by shard
 * and handled under each shard's write lock (lookup_misses). */
/* `visible` (EVAL only, may be NULL): keys with visible[i] == 0 read the
 * default value even when they have a row. */
static int lookup_part(dynemb_table *t, const int64_t *keys, size_t n,
                       int train, uint32_t now, float *out, uint8_t *admitted,
                       uint64_t *hints, const uint8_t *visible,
                       lookup_counts *lc) {
  const size_t S = t->nshards, dim = (size_t)t->dim;
  const size_t rbytes = dim * sizeof(float);
  /* scratch: hashes [n], per-shard index growth [S], misses [n],
   * per-shard counts [S + 1], marks [S]; with an SSD tier, the records of
   * rows there [n] and (eval) their batch positions [n] */
  const int ssd = dynemb_ssd_on(&t->ssd);
  char *mem = malloc(n * (sizeof(uint64_t) + 2 * sizeof(uint32_t)) +
                     S * sizeof(double) + (S + 1) * sizeof(uint32_t) + S + 8 +
                     (ssd ? 2 * n * sizeof(uint32_t) : 0));
  if (!mem)
    return dynemb_error_set(DYNEMB_ENOMEM,
                            "table '%s': out of memory for a lookup batch of "
                            "%zu keys; use smaller batches",
                            t->name, n);
  uint64_t *hs = (uint64_t *)mem;
  double *grow = (double *)(hs + n);
  uint32_t *miss = (uint32_t *)(grow + S);
  uint32_t *order = miss + n;
  uint32_t *cnt = order + n;
  uint32_t *recs = ssd ? cnt + S + 1 : NULL, *at = ssd ? recs + n : NULL;
  unsigned char *mark = (unsigned char *)(cnt + S + 1 + (ssd ? 2 * n : 0));
  memset(mark, 0, S);
  for (size_t i = 0; i < n; i++) {
    uint64_t h = dynemb_hash_key(keys[i]);
    hs[i] = h;
    mark[dynemb_table_shard_of(t, h)] = 1;
  }
  for (size_t s = 0; s < S; s++)
    if (mark[s]) pthread_rwlock_rdlock(&t->shards[s].lock);

  const float *ring[RING];
  uint32_t nmiss = 0, nrec = 0;
  uint64_t hits = 0;
  int io_rc = DYNEMB_OK; /* an SSD read failed (message set) */
  const float *dflt = train ? NULL : t->default_value;
  for (size_t i = 0; i < n + ROW_DIST; i++) {
    if (i + IDX_PF < n) {
      uint64_t hp = hs[i + IDX_PF];
      dynemb_index_prefetch(&t->shards[dynemb_table_shard_of(t, hp)].rows, hp);
    }
    if (i < n) {
      uint64_t h = hs[i];
      const uint32_t shard = dynemb_table_shard_of(t, h);
      dynemb_shard *sh = &t->shards[shard];
      dynemb_index_entry *e = dynemb_index_find(&sh->rows, keys[i], h);
      if (visible && !visible[i]) e = NULL;
      const float *r = dflt;
      if (admitted) admitted[i] = e != NULL;
      /* (a hint naming the SSD tier is never valid: hinted calls read
       * such rows by key) */
      if (hints) hints[i] = e ? make_hint(sh, shard, e->loc) : DYNEMB_NO_HINT;
      if (e && !on_host(e->loc)) {
        lc->on_ssd++;
        if (train) { /* brought into memory under the write lock */
          miss[nmiss++] = (uint32_t)i;
          recs[nrec++] = DYNEMB_LOC_SLOT(e->loc);
        } else { /* read in place below: eval never changes the table */
          at[nrec] = (uint32_t)i;
          recs[nrec++] = DYNEMB_LOC_SLOT(e->loc);
          hits++;
        }
        r = NULL;
      } else if (e) {
        if (out) { /* (prepare has no output: no chunk-table read) */
          r = row_of(sh, e->loc);
          prefetch_lines(r, rbytes);
        }
        if (train) stamp(e, now);
        hits++;
      } else if (train) {
        miss[nmiss++] = (uint32_t)i;
      }
      ring[i % RING] = r;
    }
    if (i >= ROW_DIST) {
      size_t c = i - ROW_DIST;
      const float *r = ring[c % RING];
      if (r && out) memcpy(out + c * dim, r, rbytes);
    }
  }
  /* eval: the rows on the SSD tier, read in place (all records advised
   * first while the tier's reads fault: ssd.h) */
  if (!train && nrec && out) {
    dynemb_ssd_batch rb;
    dynemb_ssd_batch_begin(&t->ssd, recs, nrec, &rb);
    for (uint32_t k = 0; k < nrec && !io_rc; k++) {
      if (k + ROW_PF < nrec) dynemb_ssd_prefetch(&t->ssd, recs[k + ROW_PF]);
      io_rc = dynemb_ssd_read(&t->ssd, recs[k], out + (size_t)at[k] * dim, NULL);
    }
    dynemb_ssd_batch_end(&t->ssd, &rb);
  }
  const uint32_t threshold = LOAD(&t->access_threshold);
  if (nmiss) {
    /* group the misses by shard, keeping batch order within a shard, and
     * (still under the read locks) note the shards whose index will have
     * to grow for them. Only without admission: with it, most misses only
     * count towards their threshold, and an array made for them would
     * mostly be thrown away. */
    memset(cnt, 0, (S + 1) * sizeof(uint32_t));
    for (uint32_t m = 0; m < nmiss; m++)
      cnt[dynemb_table_shard_of(t, hs[miss[m]]) + 1]++;
    for (size_t s = 0; s < S; s++) {
      const dynemb_index *ix = &t->shards[s].rows;
      /* room for twice this call's misses: another thread may insert
       * into the shard before this one takes its lock */
      grow[s] = cnt[s + 1] && threshold <= 1
                    ? dynemb_index_growth_for(ix, ix->count + 2 * cnt[s + 1])
                    : 0;
      cnt[s + 1] += cnt[s];
    }
    for (uint32_t m = 0; m < nmiss; m++)
      order[cnt[dynemb_table_shard_of(t, hs[miss[m]])]++] = miss[m];
    /* cnt[s] is now the end of shard s's run */
  }
  for (size_t s = S; s-- > 0;)
    if (mark[s]) pthread_rwlock_unlock(&t->shards[s].lock);
  lc->hits += hits;

  int rc = io_rc;
  if (nmiss && !rc) {
    /* fault in the memory of the next row chunks now, outside the locks */
    /* room for this call's inserts, twice over (another thread may take
     * from the same memory meanwhile) */
    const size_t emb_b = (size_t)t->dim * sizeof(float);
    dynemb_slab_pool_prefault(&t->pool, 2 * (size_t)nmiss * emb_b);
    if (t->slots)
      dynemb_slab_pool_prefault(&t->slot_pool,
                                2 * (size_t)nmiss * emb_b * (size_t)t->slots);
    /* rows moving out to the SSD tier (about one per miss) go to fresh
     * records: their pages too */
    if (ssd) dynemb_ssd_prefault(&t->ssd, 2 * (uint64_t)nmiss);
    /* the rows to bring back from the SSD tier: advised all at once while
     * the tier's reads fault (ssd.h) */
    dynemb_ssd_batch rb;
    if (nrec) dynemb_ssd_batch_begin(&t->ssd, recs, nrec, &rb);
    uint32_t begin = 0;
    for (size_t s = 0; s < S && !rc; s++) {
      uint32_t end = cnt[s];
      if (end > begin) {
        /* a grown index array made outside the lock (if still needed then:
         * another thread may have grown it, or admission may insert less) */
        dynemb_index_spare spare = {NULL, 0, NULL};
        if (grow[s] > 0) (void)dynemb_index_spare_make(grow[s], &spare);
        rc = lookup_misses(t, &t->shards[s], keys, hs, order + begin,
                           end - begin, now, threshold, out, admitted, hints,
                           &spare, lc);
        dynemb_index_spare_free(&spare);
      }
      begin = end;
    }
    if (nrec) dynemb_ssd_batch_end(&t->ssd, &rb);
  }
  free(mem);
  return rc;
}

/* dynemb_lookup and dynemb_prepare: `out` and/or `admitted` (one may be
 * NULL; the public functions check theirs). */
static int lookup_impl(dynemb_table *t, const int64_t *keys, size_t n,
                       int mode, int64_t now, float *out, uint8_t *admitted,
                       uint64_t *hints, const uint8_t *visible,
                       const char *fn) {
  dynemb_error_clear();
  if (!t) return null_table(fn);
  if (mode != DYNEMB_LOOKUP_TRAIN && mode != DYNEMB_LOOKUP_EVAL)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': lookup mode %d is unknown; use "
                            "DYNEMB_LOOKUP_TRAIN or DYNEMB_LOOKUP_EVAL",
                            t->name, mode);
  int rc = check_now(t, now);
  if (rc) return rc;
  if (n == 0) return DYNEMB_OK;
  if (!keys || (!out && !admitted && !hints))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': %s of %zu keys got a NULL %s "
                            "buffer; pass valid keys and output buffers",
                            t->name, fn, n, keys ? "output" : "keys");
  lookup_counts lc = {0, 0, 0, 0};
  const size_t part = (size_t)1 << 31;
  for (size_t off = 0; off < n && !rc; off += part) {
    size_t m = n - off < part ? n - off : part;
    rc = lookup_part(t, keys + off, m, mode == DYNEMB_LOOKUP_TRAIN,
                     (uint32_t)now, out ? out + off * (size_t)t->dim : NULL,
                     admitted ? admitted + off : NULL,
                     hints ? hints + off : NULL,
                     visible ? visible + off : NULL, &lc);
  }
  if (mode == DYNEMB_LOOKUP_TRAIN) clock_advance(t, (uint32_t)now);
  ADD(&t->n_lookups, (uint64_t)n);
  if (lc.hits) ADD(&t->n_hits, lc.hits);
  if (lc.inserted) ADD(&t->n_inserted, lc.inserted);
  if (lc.rejected) ADD(&t->n_rejected, lc.rejected);
  if (lc.on_ssd) ADD(&t->n_ssd_lookups, lc.on_ssd);
  return rc;
}

int dynemb_lookup(dynemb_table *t, const int64_t *keys, size_t n, int mode,
                  int64_t now, float *out) {
  if (t && n && keys && !out) {
    dynemb_error_clear();
    return dynemb_error_set(DYNEMB_EINVAL, "table '%s': lookup of %zu keys got "
                            "a NULL output buffer; pass valid keys and output "
                            "buffers", t->name, n);
  }
  return lookup_impl(t, keys, n, mode, now, out, NULL, NULL, NULL,
                     "dynemb_lookup");
}

int dynemb_lookup_visible(dynemb_table *t, const int64_t *keys, size_t n,
                          const uint8_t *visible, float *out) {
  if (t && n && keys && (!out || !visible)) {
    dynemb_error_clear();
    return dynemb_error_set(DYNEMB_EINVAL, "table '%s': lookup of %zu keys got "
                            "a NULL %s buffer; pass valid buffers", t->name, n,
                            out ? "visible" : "output");
  }
  return lookup_impl(t, keys, n, DYNEMB_LOOKUP_EVAL, 0, out, NULL, NULL,
                     visible, "dynemb_lookup_visible");
}

/* dynemb_prepare and dynemb_prepare_hints: one of `admitted` / `hints`,
 * named `buffer` in the error for a NULL one. */
static int prepare_impl(dynemb_table *t, const int64_t *keys, size_t n,
                        int mode, int64_t now, uint8_t *admitted,
                        uint64_t *hints, const char *buffer, const char *fn) {
  if (t && n && keys && !admitted && !hints) {
    dynemb_error_clear();
    return dynemb_error_set(DYNEMB_EINVAL, "table '%s': prepare of %zu keys "
                            "got a NULL %s buffer", t->name, n, buffer);
  }
  return lookup_impl(t, keys, n, mode, now, NULL, admitted, hints, NULL, fn);
}

int dynemb_prepare(dynemb_table *t, const int64_t *keys, size_t n, int mode,
                   int64_t now, uint8_t *admitted) {
  return prepare_impl(t, keys, n, mode, now, admitted, NULL, "admitted",
                      "dynemb_prepare");
}

int dynemb_prepare_hints(dynemb_table *t, const int64_t *keys, size_t n,
                         int mode, int64_t now, uint64_t *hints) {
  return prepare_impl(t, keys, n, mode, now, NULL, hints, "hints",
                      "dynemb_prepare_hints");
}

/* dynemb_lookup_hinted: rows copied from their hinted locations under the
 * read locks of the hinted shards, in a pipeline like lookup_part's (rows
 * prefetched HINT_DIST ahead). Keys with stale hints (their shard evicted,
 * was cleared or imported since) are looked up by key afterwards, once
 * the locks are released (taking another shard's lock out of order could
 * deadlock with a caller that holds every lock). */
static int lookup_hinted_part(dynemb_table *t, const int64_t *keys,
                              const uint64_t *hints, size_t n, float *out,
                              lookup_counts *lc) {
  const size_t S = t->nshards, dim = (size_t)t->dim;
  const size_t rbytes = dim * sizeof(float);
  unsigned char *mark = calloc(S, 1);
  uint32_t *stale = malloc(n * sizeof *stale + 1);
  shard_view *view = malloc(S * sizeof *view);
  if (!mark || !stale || !view) {
    free(mark);
    free(stale);
    free(view);
    return dynemb_error_set(DYNEMB_ENOMEM,
                            "table '%s': out of memory for a hinted lookup of "
                            "%zu keys; use smaller batches",
                            t->name, n);
  }
  for (size_t i = 0; i < n; i++)
    if (hints[i] != DYNEMB_NO_HINT && HINT_SHARD(hints[i]) < S)
      mark[HINT_SHARD(hints[i])] = 1;
  for (size_t s = 0; s < S; s++)
    if (mark[s]) {
      pthread_rwlock_rdlock(&t->shards[s].lock);
      shard_view_of(&t->shards[s], (uint32_t)s, &view[s]);
    }
  const float *ring[HINT_RING];
  size_t nstale = 0;
  uint64_t hits = 0;
  for (size_t i = 0; i < n + HINT_DIST; i++) {
    if (i < n) {
      const uint64_t hi = hints[i];
      const float *r = t->default_value; /* not admitted at prepare time */
      if (hi != DYNEMB_NO_HINT) {
        const uint32_t hs = HINT_SHARD(hi);
        /* (shards of valid hints are marked, their views filled) */
        if (hs < S && mark[hs] && hint_current(hi, view[hs].tag, view[hs].slots)) {
          const uint32_t slot = DYNEMB_LOC_SLOT(HINT_LOC(hi));
          r = slot < view[hs].first_rows ? view[hs].first + (size_t)slot * dim
                                         : row_of(&t->shards[hs], HINT_LOC(hi));
          prefetch_lines(r, rbytes);
          hits++;
        } else {
          stale[nstale++] = (uint32_t)i;
          r = NULL;
        }
      }
      ring[i % HINT_RING] = r;
    }
    if (i >= HINT_DIST) {
      size_t c = i - HINT_DIST;
      if (ring[c % HINT_RING]) copy_row(out + c * dim, ring[c % HINT_RING], dim);
    }
  }
  for (size_t s = S; s-- > 0;)
    if (mark[s]) pthread_rwlock_unlock(&t->shards[s].lock);
  free(mark);
  free(view);
  int rc = DYNEMB_OK;
  if (nstale) { /* as an EVAL lookup of those keys would read them now */
    int64_t *sk = malloc(nstale * sizeof *sk);
    float *so = malloc(nstale * rbytes);
    if (!sk || !so) {
      rc = dynemb_error_set(DYNEMB_ENOMEM,
                            "table '%s': out of memory for a hinted lookup of "
                            "%zu keys; use smaller batches",
                            t->name, n);
    } else {
      for (size_t j = 0; j < nstale; j++) sk[j] = keys[stale[j]];
      rc = lookup_part(t, sk, nstale, 0, 0, so, NULL, NULL, NULL, lc);
      for (size_t j = 0; !rc && j < nstale; j++)
        memcpy(out + (size_t)stale[j] * dim, so + j * dim, rbytes);
    }
    free(sk);
    free(so);
  }
  free(stale);
  lc->hits += hits;
  return rc;
}

int dynemb_lookup_hinted(dynemb_table *t, const int64_t *keys,
                         const uint64_t *hints, size_t n, float *out) {
  dynemb_error_clear();
  if (!t) return null_table("dynemb_lookup_hinted");
  if (n == 0) return DYNEMB_OK;
  if (!keys || !hints || !out)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': hinted lookup of %zu keys got a NULL "
                            "%s buffer; pass valid buffers",
                            t->name, n,
                            !keys ? "keys" : !hints ? "hints" : "output");
  if (n >= UINT32_MAX)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': hinted lookup of %zu keys is too "
                            "large; look up fewer than 2^32-1 keys per call",
                            t->name, n);
  lookup_counts lc = {0, 0, 0, 0};
  int rc = lookup_hinted_part(t, keys, hints, n, out, &lc);
  ADD(&t->n_lookups, (uint64_t)n);
  if (lc.hits) ADD(&t->n_hits, lc.hits);
  if (lc.on_ssd) ADD(&t->n_ssd_lookups, lc.on_ssd);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Apply                                                                     */
/* ------------------------------------------------------------------------ */

/* Nonzero if any of the n floats is NaN or Inf. An all-ones exponent
 * plus one carries into the sign bit; the loop is branch-free integer
 * work over blocks of 8 that compilers vectorize. */
static inline int any_nonfinite(const float *x, size_t n) {
  uint32_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint32_t w[8];
    memcpy(w, x + i, sizeof w);
    for (int k = 0; k < 8; k++) acc[k] |= (w[k] & 0x7f800000u) + 0x00800000u;
  }
  for (; i < n; i++) {
    uint32_t w;
    memcpy(&w, x + i, sizeof w);
    acc[0] |= (w & 0x7f800000u) + 0x00800000u;
  }
  uint32_t all = 0;
  for (int k = 0; k < 8; k++) all |= acc[k];
  return (all & 0x80000000u) != 0;
}

typedef struct uniq {
  int64_t key;
  uint64_t hash;  /* then, in phase B, the row's location */
  uint64_t hint;  /* hinted apply: a hint of one occurrence, or NO_HINT */
  float *row, *slots; /* phase B: the row's memory, if in memory */
  uint32_t first; /* first occurrence (batch position) */
  uint32_t count; /* occurrences */
  uint32_t acc;   /* its row of the sum buffer, or NO_SUM */
  uint32_t skip;  /* nonfinite (policy SKIP) or no row */
} uniq;

#define NO_SUM UINT32_MAX

/* The gradient a unique key's update uses: the sum of its rows, or its
 * only row in the caller's array. */
static inline const float *uniq_grad(const uniq *q, const float *grads,
                                     const float *sum, size_t dim) {
  return q->acc != NO_SUM ? sum + (size_t)q->acc * dim
                          : grads + (size_t)q->first * dim;
}

/* acc += x over n floats (restrict pointers and a plain loop: gcc
 * vectorizes it with the Makefile's -fvect-cost-model=dynamic; the older
 * form through 8-float local arrays made it spill them to the stack). */
static inline void add_floats(float *restrict acc, const float *restrict x,
                              size_t n) {
  for (size_t i = 0; i < n; i++) acc[i] += x[i];
}

/* acc += x over a row of `dim` floats, with the loop unrolled for common
 * widths (the generic loop's setup costs more than a short row). */
static inline void add_row(float *restrict acc, const float *restrict x,
                           size_t dim) {
  switch (dim) {
  case 1: acc[0] += x[0]; break;
  case 8: for (int k = 0; k < 8; k++) acc[k] += x[k]; break;
  case 16: for (int k = 0; k < 16; k++) acc[k] += x[k]; break;
  case 32: for (int k = 0; k < 32; k++) acc[k] += x[k]; break;
  case 64: for (int k = 0; k < 64; k++) acc[k] += x[k]; break;
  default: add_floats(acc, x, dim); break;
  }
}

/* A set of keys (open addressing, linear probing) for apply's filter. */
typedef struct key_set {
  int64_t *keys;
  unsigned char *used;
  uint64_t mask;
} key_set;

static int key_set_build(key_set *ks, const int64_t *keys, size_t n) {
  uint64_t cap = 16;
  while (cap < 2 * (uint64_t)n) cap *= 2;
  ks->mask = cap - 1;
  ks->keys = malloc(cap * sizeof *ks->keys);
  ks->used = calloc(cap, 1);
  if (!ks->keys || !ks->used) return DYNEMB_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    uint64_t j = dynemb_hash_key(keys[i]) & ks->mask;
    while (ks->used[j] && ks->keys[j] != keys[i]) j = (j + 1) & ks->mask;
    ks->used[j] = 1;
    ks->keys[j] = keys[i];
  }
  return DYNEMB_OK;
}

static int key_set_has(const key_set *ks, int64_t key, uint64_t hash) {
  for (uint64_t j = hash & ks->mask; ks->used[j]; j = (j + 1) & ks->mask)
    if (ks->keys[j] == key) return 1;
  return 0;
}

static void key_set_free(key_set *ks) {
  free(ks->keys);
  free(ks->used);
}

static int apply_impl(dynemb_table *t, const int64_t *keys, size_t n,
                      const float *grads, float learning_rate,
                      const key_set *allowed, const uint64_t *hints,
                      dynemb_apply_stats *stats);

int dynemb_apply(dynemb_table *t, const int64_t *keys, size_t n,
                 const float *grads, float learning_rate,
                 dynemb_apply_stats *stats) {
  return apply_impl(t, keys, n, grads, learning_rate, NULL, NULL, stats);
}

int dynemb_apply_hinted(dynemb_table *t, const int64_t *keys,
                        const uint64_t *hints, size_t n, const float *grads,
                        float learning_rate, dynemb_apply_stats *stats) {
  if (!t || (n > 0 && !hints)) {
    dynemb_error_clear();
    if (stats) memset(stats, 0, sizeof *stats);
    if (!t) return null_table("dynemb_apply_hinted");
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': hinted apply of %zu keys got a NULL "
                            "hints buffer; pass the hints of "
                            "dynemb_prepare_hints",
                            t->name, n);
  }
  return apply_impl(t, keys, n, grads, learning_rate, NULL, hints, stats);
}

int dynemb_apply_filtered(dynemb_table *t, const int64_t *keys, size_t n,
                          const float *grads, float learning_rate,
                          const int64_t *allowed, size_t n_allowed,
                          dynemb_apply_stats *stats) {
  dynemb_error_clear();
  if (stats) memset(stats, 0, sizeof *stats);
  if (!t) return null_table("dynemb_apply_filtered");
  if (n_allowed && !allowed)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': apply got %zu allowed keys but a "
                            "NULL buffer for them",
                            t->name, n_allowed);
  key_set ks = {0};
  if (key_set_build(&ks, allowed, n_allowed)) {
    key_set_free(&ks);
    return dynemb_error_set(DYNEMB_ENOMEM,
                            "table '%s': out of memory for %zu allowed keys "
                            "of an apply",
                            t->name, n_allowed);
  }
  int rc = apply_impl(t, keys, n, grads, learning_rate, &ks, NULL, stats);
  key_set_free(&ks);
  return rc;
}

/* The ENONFINITE error of an apply: the first non-finite gradient element
 * in batch order, or, if every gradient is finite, the key `q` whose
 * gradients sum to a non-finite value (overflow). */
static int nonfinite_error(const dynemb_table *t, const int64_t *keys,
                           const float *grads, size_t n, const uniq *q) {
  const size_t dim = (size_t)t->dim;
  for (size_t i = 0; i < n; i++)
    if (any_nonfinite(grads + i * dim, dim)) {
      size_t j = 0;
      while (j < dim && isfinite(grads[i * dim + j])) j++;
      return dynemb_error_set(
          DYNEMB_ENONFINITE,
          "table '%s': gradient for key %lld (batch position %zu, element "
          "%zu) is %g; nothing was applied. Fix the loss/inputs, clip "
          "gradients, or create the table with nonfinite_policy = "
          "DYNEMB_NONFINITE_SKIP",
          t->name, (long long)keys[i], i, j,
          (double)grads[i * dim + (j < dim ? j : 0)]);
    }
  return dynemb_error_set(DYNEMB_ENONFINITE,
                          "table '%s': the %u gradients of key %lld sum to a "
                          "non-finite value (overflow); nothing was applied. "
                          "Clip or scale the gradients",
                          t->name, q ? q->count : 0u,
                          (long long)(q ? q->key : 0));
}

/* The optimizer step on a row of the SSD tier: read, update, write back
 * (record `rec`; `*buf` is a row-sized scratch made on first use). */
static int ssd_apply_row(dynemb_table *t, const dynemb_optim_step *ostep,
                         uint32_t rec, const float *grad, float **buf) {
  if (!*buf && !(*buf = malloc((size_t)t->row_floats * sizeof(float))))
    return dynemb_error_set(DYNEMB_ENOMEM,
                            "table '%s': out of memory updating a row of the "
                            "SSD tier", t->name);
  float *row = *buf, *slots = row + t->dim;
  static float no_slots[1]; /* never written: SGD has no slots */
  int rc = dynemb_ssd_read(&t->ssd, rec, row, t->slots ? slots : NULL);
  if (rc) return rc;
  dynemb_optim_apply_row(ostep, row, t->slots ? slots : no_slots, grad, t->dim);
  return dynemb_ssd_write(&t->ssd, rec, row, t->slots ? slots : NULL);
}

/* Apply, in two phases so that a failure changes nothing:
 *  A (no locks): dedupe the batch's keys in batch order (firsts_table),
 *    sum the gradients of repeated keys in one pass over the caller's rows
 *    in batch order, check
 *    finiteness once per key (a NaN/Inf in any occurrence makes the sum
 *    non-finite; ERROR names the first bad gradient in batch order, or the
 *    key whose sum overflows); order the unique keys by shard;
 *  B: per shard, under the write lock, find the unique keys' rows (through
 *    a current hint, else the index, prefetched ahead) and run the
 *    optimizer on each row (rows prefetched ahead).
 * Only the unique keys are sorted and probed: training batches repeat most
 * of their keys (bench/tf_train.py's: 30% unique). */
/* `allowed` NULL: no filter; else only its keys are updated. `hints` NULL:
 * rows are found by key; else (dynemb_apply_hinted) only keys with a hint
 * are updated, at the hinted row while the hint is current. */
static int apply_impl(dynemb_table *t, const int64_t *keys, size_t n,
                      const float *grads, float learning_rate,
                      const key_set *allowed, const uint64_t *hints,
                      dynemb_apply_stats *stats) {
  dynemb_error_clear();
  if (stats) memset(stats, 0, sizeof *stats);
  if (!t) return null_table("dynemb_apply");
  if (n > 0 && (!keys || !grads))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': apply of %zu keys got a NULL %s "
                            "buffer; pass valid keys and gradients",
                            t->name, n, keys ? "gradient" : "keys");
  if (n >= UINT32_MAX / 2)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': apply batch of %zu keys is too "
                            "large; apply fewer than 2^31-1 keys per call",
                            t->name, n);
  if (isnan(learning_rate) || isinf(learning_rate))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': learning rate %g is not finite; "
                            "pass a finite rate (or < 0 for the configured "
                            "one)",
                            t->name, (double)learning_rate);
  const float lr =
      learning_rate < 0 ? t->cfg.optimizer.learning_rate : learning_rate;
  const size_t dim = (size_t)t->dim, S = t->nshards;
  const int skip = t->cfg.nonfinite_policy == DYNEMB_NONFINITE_SKIP;
  firsts_table ft = {NULL, 0};
  uint32_t *inv = NULL, *ord = NULL, *seg = NULL;
  uniq *u = NULL;
  float *sum = NULL, *ssd_buf = NULL;
  int rc = DYNEMB_OK;
  size_t n_uniq = 0, n_applied = 0, n_dropped = 0, n_nonfinite = 0;
  if (n == 0) {
    __atomic_add_fetch(&t->apply_steps, 1, RELAXED);
    goto done;
  }
  if (firsts_init(&ft, n)) goto nomem;
  u = malloc(n * sizeof *u);
  inv = malloc(n * sizeof *inv);
  ord = malloc(n * sizeof *ord);
  seg = calloc(S + 1, sizeof *seg);
  if (!u || !inv || !ord || !seg) goto nomem;

  /* Phase A.1: dedupe in batch order; inv[i] is the unique of occurrence
   * i. */
  uint32_t multi_rows = 0, nu = 0;
  for (size_t i = 0; i < n; i++) {
    const int64_t key = keys[i];
    const uint64_t h = dynemb_hash_key(key);
    const uint32_t f = first_of(&ft, keys, h, (uint32_t)i);
    if (f == i) {
      uniq *q = &u[nu];
      q->key = key;
      q->hash = h;
      q->hint = hints ? hints[i] : DYNEMB_NO_HINT;
      q->first = (uint32_t)i;
      q->count = 1;
      q->skip = 0;
      inv[i] = nu++;
    } else {
      uniq *q = &u[inv[f]];
      if (q->count++ == 1) multi_rows++;
      if (hints && q->hint == DYNEMB_NO_HINT) q->hint = hints[i];
      inv[i] = inv[f];
    }
  }
  n_uniq = nu;

  /* Phase A.2: sums, streaming the caller's rows in batch order (batch
   * order within a key). Where repeats are most of the batch (training
   * batches: 70% of bench/tf_train.py's ids) every key gets a sum row,
   * summed from zero as TF's UnsortedSegmentSum does: no branch per
   * occurrence, and the sums are one array for the finiteness check. Else
   * only repeated keys do (from their first row), and single keys update
   * from the caller's rows. */
  const int all_sums = 2 * (size_t)n_uniq <= n;
  const uint32_t sum_rows = all_sums ? nu : multi_rows;
  for (uint32_t k = 0, r = 0; k < nu; k++)
    u[k].acc = all_sums || u[k].count > 1 ? r++ : NO_SUM;
  if (sum_rows) {
    sum = all_sums ? calloc((size_t)sum_rows * dim, sizeof(float))
                   : malloc((size_t)sum_rows * dim * sizeof(float));
    if (!sum) goto nomem;
  }
  if (all_sums) {
    for (size_t i = 0; i < n; i++)
      add_row(sum + (size_t)inv[i] * dim, grads + i * dim, dim);
  } else if (multi_rows) {
    for (size_t i = 0; i < n; i++) {
      const uniq *q = &u[inv[i]];
      if (q->acc == NO_SUM) continue;
      float *acc = sum + (size_t)q->acc * dim;
      const float *x = grads + i * dim;
      if (i == q->first)
        copy_row(acc, x, dim);
      else
        add_row(acc, x, dim);
    }
  }
  /* Finiteness. A key's gradient is non-finite when one of its
   * occurrences is (NaN and Inf survive a sum) or when a sum overflows, so
   * checking every key's gradient (its sum, or its only row) finds them
   * all: first in bulk, the sums as one array and the single keys' rows
   * either in one streaming pass over the caller's gradients in batch order
   * (where most keys occur once: 4M x 64 Adam, 2 threads, 6 alternating
   * runs: uniform applies +9%, hinted +11% at the median, against reading
   * the rows again, scattered) or row by row; key by key only when
   * something is not finite. */
  const size_t singles = all_sums ? 0 : n_uniq - multi_rows;
  int bad = sum_rows && any_nonfinite(sum, (size_t)sum_rows * dim);
  if (!bad && 2 * singles > n) {
    bad = any_nonfinite(grads, n * dim);
  } else if (!bad && singles) {
    for (size_t k = 0; k < n_uniq && !bad; k++)
      bad = u[k].acc == NO_SUM &&
            any_nonfinite(grads + (size_t)u[k].first * dim, dim);
  }
  for (size_t k = 0; bad && k < n_uniq; k++) {
    uniq *q = &u[k];
    if (!any_nonfinite(uniq_grad(q, grads, sum, dim), dim)) continue;
    if (!skip) { /* the first bad gradient in batch order, or the sum */
      rc = nonfinite_error(t, keys, grads, n, q);
      goto done;
    }
    q->skip = 1;
    n_nonfinite++;
  }
  /* Keys outside the allowed set, or without a hint in a hinted apply,
   * are treated as keys without a row. */
  if (hints)
    for (size_t k = 0; k < n_uniq; k++)
      if (!u[k].skip && u[k].hint == DYNEMB_NO_HINT) {
        u[k].skip = 1;
        n_dropped++;
      }
  if (allowed)
    for (size_t k = 0; k < n_uniq; k++)
      if (!u[k].skip && !key_set_has(allowed, u[k].key, u[k].hash)) {
        u[k].skip = 1;
        n_dropped++;
      }
  /* Phase A.3: the unique keys by shard (counting sort, first-occurrence
   * order within a shard): ord[seg[s] .. seg[s + 1]) are shard s's. */
  for (size_t k = 0; k < n_uniq; k++)
    seg[dynemb_table_shard_of(t, u[k].hash) + 1]++;
  for (size_t s = 0; s < S; s++) seg[s + 1] += seg[s];
  for (size_t k = 0; k < n_uniq; k++)
    ord[seg[dynemb_table_shard_of(t, u[k].hash)]++] = (uint32_t)k;
  for (size_t s = S; s > 0; s--) seg[s] = seg[s - 1]; /* back to starts */
  seg[0] = 0;

  /* Phase B: update the rows. */
  const uint64_t step = __atomic_add_fetch(&t->apply_steps, 1, RELAXED);
  dynemb_optim_step ostep; /* lr, Adam's alpha ...: once per call */
  dynemb_optim_prepare(&t->cfg.optimizer, lr, step, &ostep);
  const size_t emb_bytes = dim * sizeof(float);
  const size_t slot_bytes = (size_t)t->slots * dim * sizeof(float);
  static float no_slots[1]; /* never written: SGD has no slots */
  for (uint32_t s = 0; s < S; s++) {
    const uint32_t a = seg[s], b = seg[s + 1];
    if (a == b) continue;
    dynemb_shard *sh = &t->shards[s];
    pthread_rwlock_wrlock(&sh->lock);
    /* probe: a key without a row is skipped, and the hash field is
     * reused for the row's location (taken from a current hint as is);
     * the rows in memory are located once, the first few prefetched here
     * (the update loop prefetches ahead of itself only within the shard) */
    for (uint32_t k = a; k < b; k++) {
      uniq *q = &u[ord[k]];
      if (hints) {
        if (q->skip) continue;
        const uint64_t hi = q->hint;
        if (HINT_SHARD(hi) == s && hint_valid(sh, hi)) {
          q->hash = HINT_LOC(hi);
          goto located;
        }
      } else if (k + IDX_PF < b) {
        dynemb_index_prefetch(&sh->rows, u[ord[k + IDX_PF]].hash);
      }
      dynemb_index_entry *e = dynemb_index_find(&sh->rows, q->key, q->hash);
      if (!e) {
        if (!q->skip) n_dropped++;
        q->skip = 1;
        continue;
      }
      q->hash = e->loc;
    located:
      if (q->skip || !on_host((uint32_t)q->hash)) continue;
      q->row = row_of(sh, (uint32_t)q->hash);
      q->slots = slot_bytes ? slots_of(sh, (uint32_t)q->hash) : no_slots;
      if (k - a < ROW_PF) {
        prefetch_lines(q->row, emb_bytes);
        prefetch_lines(q->slots, slot_bytes);
        prefetch_lines(uniq_grad(q, grads, sum, dim), emb_bytes);
      }
    }
    for (uint32_t k = a; k < b; k++) {
      const uniq *p = k + ROW_PF < b ? &u[ord[k + ROW_PF]] : NULL;
      if (p && !p->skip && on_host((uint32_t)p->hash)) {
        /* the row, and the gradient (scattered in the caller's array) */
        prefetch_lines(p->row, emb_bytes);
        prefetch_lines(p->slots, slot_bytes);
        prefetch_lines(uniq_grad(p, grads, sum, dim), emb_bytes);
      }
      const uniq *q = &u[ord[k]];
      if (q->skip) continue;
      const uint32_t loc = (uint32_t)q->hash;
      const float *g = uniq_grad(q, grads, sum, dim);
      if (!on_host(loc)) { /* updated in place on the SSD tier */
        rc = ssd_apply_row(t, &ostep, DYNEMB_LOC_SLOT(loc), g, &ssd_buf);
        if (rc) break;
      } else {
        dynemb_optim_apply_row(&ostep, q->row, q->slots, g, t->dim);
      }
      n_applied++;
    }
    pthread_rwlock_unlock(&sh->lock);
    if (rc) goto done;
  }
  goto done;
nomem:
  rc = dynemb_error_set(DYNEMB_ENOMEM,
                        "table '%s': out of memory for an apply batch of %zu "
                        "keys; use smaller batches",
                        t->name, n);
done:
  free(ft.slot);
  free(u);
  free(inv);
  free(ord);
  free(seg);
  free(sum);
  free(ssd_buf);
  if (rc) n_uniq = n_nonfinite = 0;
  if (n_applied) ADD(&t->n_applied, (uint64_t)n_applied);
  if (n_dropped) ADD(&t->n_dropped, (uint64_t)n_dropped);
  if (n_nonfinite) ADD(&t->n_nonfinite, (uint64_t)n_nonfinite);
  if (stats) {
    stats->unique_keys = n_uniq;
    stats->applied = n_applied;
    stats->dropped_unknown = n_dropped;
    stats->skipped_nonfinite = n_nonfinite;
  }
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Eviction and clear                                                        */
/* ------------------------------------------------------------------------ */

/* Removes entries older than the threshold. For rows (`sh` set: the
 * shard whose rows `ix` indexes), frees their slots in host memory or
 * records of the SSD tier and counts the former in *on_host_removed. */
static uint64_t evict_index(dynemb_table *t, dynemb_index *ix,
                            dynemb_shard *sh, int64_t now,
                            int64_t threshold, uint64_t *on_host_removed) {
  uint64_t removed = 0;
  if (!ix->count) return 0;
  uint64_t i = 0;
  while (i < ix->cap) {
    dynemb_index_entry *e = ix->slots + i;
    if (e->loc != DYNEMB_LOC_EMPTY &&
        now - (int64_t)LOAD(&e->last_access) > threshold) {
      if (sh && on_host(e->loc)) {
        dynemb_arena_release(&sh->arena, DYNEMB_LOC_SLOT(e->loc));
        slot_freed(sh, DYNEMB_LOC_SLOT(e->loc));
        (*on_host_removed)++;
      } else if (sh) {
        dynemb_ssd_release(&t->ssd, DYNEMB_LOC_SLOT(e->loc));
      }
      /* backward shift may move an unvisited entry into i: look again */
      dynemb_index_erase_at(ix, i);
      removed++;
      if (!ix->count) break;
    } else {
      i++;
    }
  }
  return removed;
}

int dynemb_evict(dynemb_table *t, int64_t now, size_t *evicted) {
  dynemb_error_clear();
  if (evicted) *evicted = 0;
  if (!t) return null_table("dynemb_evict");
  if (now == DYNEMB_NOW_TABLE_CLOCK) now = (int64_t)LOAD(&t->clock);
  int rc = check_now(t, now);
  if (rc) return rc;
  int64_t thr = LOAD(&t->eviction_threshold);
  if (thr <= 0) return DYNEMB_OK;
  uint64_t rows = 0, cands = 0;
  for (uint32_t s = 0; s < t->nshards; s++) {
    dynemb_shard *sh = &t->shards[s];
    pthread_rwlock_wrlock(&sh->lock);
    uint64_t hr = 0;
    uint64_t r = evict_index(t, &sh->rows, sh, now, thr, &hr);
    if (r) sh->gen++; /* freed slots may be reused: hints go stale */
    cands += evict_index(t, &sh->cands, NULL, now, thr, NULL);
    if (hr && t->cfg.host_vocabulary_size) ADD(&t->rows_total, (uint64_t)0 - hr);
    pthread_rwlock_unlock(&sh->lock);
    rows += r;
  }
  if (rows) ADD(&t->n_evicted, rows);
  if (cands) ADD(&t->n_evicted_cands, cands);
  if (evicted) *evicted = (size_t)rows;
  return DYNEMB_OK;
}

static void lock_all(dynemb_table *t, int write);
static void unlock_all(dynemb_table *t);

void dynemb_table_clear(dynemb_table *t) {
  if (!t) return;
  lock_all(t, 1); /* the slab pool is shared: every shard must be idle */
  for (uint32_t s = 0; s < t->nshards; s++) {
    dynemb_shard *sh = &t->shards[s];
    dynemb_index_reset(&sh->rows);
    dynemb_index_reset(&sh->cands);
    dynemb_arena_free(&sh->arena);
    slots_clear(sh);
    sh->gen++;
  }
  dynemb_slab_pool_release(&t->pool);
  dynemb_slab_pool_release(&t->slot_pool);
  dynemb_ssd_reset(&t->ssd);
  STORE(&t->rows_total, 0);
  unlock_all(t);
}

/* ------------------------------------------------------------------------ */
/* Statistics                                                                */
/* ------------------------------------------------------------------------ */

void dynemb_table_get_stats(dynemb_table *t, dynemb_table_stats *st) {
  if (!st) return;
  memset(st, 0, sizeof *st);
  if (!t) return;
  uint64_t bytes = sizeof *t + (uint64_t)t->nshards * sizeof *t->shards +
                   (uint64_t)t->dim * sizeof(float) + strlen(t->name) + 1;
  if (t->ssd_data_path) bytes += strlen(t->ssd_data_path) + 1;
  for (uint32_t s = 0; s < t->nshards; s++) {
    dynemb_shard *sh = &t->shards[s];
    pthread_rwlock_rdlock(&sh->lock);
    st->size += sh->rows.count;
    st->candidates += sh->cands.count;
    st->capacity += sh->arena.slots;
    bytes += dynemb_index_bytes(&sh->rows) + dynemb_index_bytes(&sh->cands) +
             dynemb_arena_bytes(&sh->arena);
    pthread_rwlock_unlock(&sh->lock);
  }
  st->bytes = bytes + dynemb_slab_pool_bytes(&t->pool) +
             dynemb_slab_pool_bytes(&t->slot_pool);
  if (dynemb_ssd_on(&t->ssd)) {
    /* (records change only under shard write locks: between the loop
     * above and here, another call may have moved rows) */
    st->ssd_rows = dynemb_ssd_used(&t->ssd);
    uint64_t high = dynemb_ssd_high(&t->ssd);
    st->ssd_bytes = high * (t->ssd.emb_bytes + t->ssd.slot_bytes);
    st->capacity += high;
    st->ssd_reads = __atomic_load_n(&t->ssd.reads, RELAXED);
    st->ssd_writes = __atomic_load_n(&t->ssd.writes, RELAXED);
    st->ssd_lookups = LOAD(&t->n_ssd_lookups);
  }
  st->host_rows = st->size > st->ssd_rows ? st->size - st->ssd_rows : 0;
  st->lookups = LOAD(&t->n_lookups);
  st->hits = LOAD(&t->n_hits);
  st->inserted = LOAD(&t->n_inserted);
  st->rejected = LOAD(&t->n_rejected);
  st->evicted = LOAD(&t->n_evicted);
  st->evicted_candidates = LOAD(&t->n_evicted_cands);
  st->applied = LOAD(&t->n_applied);
  st->dropped_gradients = LOAD(&t->n_dropped);
  st->nonfinite_skipped = LOAD(&t->n_nonfinite);
  st->apply_steps = LOAD(&t->apply_steps);
}

uint64_t dynemb_table_size(dynemb_table *t) {
  uint64_t n = 0;
  if (!t) return 0;
  for (uint32_t s = 0; s < t->nshards; s++) {
    pthread_rwlock_rdlock(&t->shards[s].lock);
    n += t->shards[s].rows.count;
    pthread_rwlock_unlock(&t->shards[s].lock);
  }
  return n;
}

uint64_t dynemb_table_capacity(dynemb_table *t) {
  uint64_t n = 0;
  if (!t) return 0;
  for (uint32_t s = 0; s < t->nshards; s++) {
    pthread_rwlock_rdlock(&t->shards[s].lock);
    n += t->shards[s].arena.slots;
    pthread_rwlock_unlock(&t->shards[s].lock);
  }
  return n + dynemb_ssd_high(&t->ssd);
}

/* ------------------------------------------------------------------------ */
/* Sorting (snapshot order, import dedupe)                                   */
/* ------------------------------------------------------------------------ */

typedef struct kv {
  uint64_t k; /* key with the sign bit flipped: unsigned order = key order */
  uint64_t v;
} kv;

static inline uint64_t sort_key(int64_t key) {
  return (uint64_t)key ^ (UINT64_C(1) << 63);
}

/* Stable LSD radix sort by k (bytes whose value is the same everywhere
 * are skipped). Returns DYNEMB_ENOMEM if the buffer cannot be allocated. */
static int radix_sort(kv *a, size_t n) {
  if (n < 2) return DYNEMB_OK;
  size_t(*hist)[256] = calloc(8, sizeof *hist);
  kv *tmp = malloc(n * sizeof *tmp);
  if (!hist || !tmp) {
    free(hist);
    free(tmp);
    return DYNEMB_ENOMEM;
  }
  for (size_t i = 0; i < n; i++)
    for (int d = 0; d < 8; d++) hist[d][(a[i].k >> (8 * d)) & 0xff]++;
  kv *src = a, *dst = tmp;
  for (int d = 0; d < 8; d++) {
    size_t *h = hist[d];
    if (h[(src[0].k >> (8 * d)) & 0xff] == n) continue; /* one value */
    size_t run = 0;
    for (int c = 0; c < 256; c++) {
      size_t x = h[c];
      h[c] = run;
      run += x;
    }
    for (size_t i = 0; i < n; i++) dst[h[(src[i].k >> (8 * d)) & 0xff]++] = src[i];
    kv *sw = src;
    src = dst;
    dst = sw;
  }
  if (src != a) memcpy(a, src, n * sizeof *a);
  free(tmp);
  free(hist);
  return DYNEMB_OK;
}

/* ------------------------------------------------------------------------ */
/* Snapshot                                                                  */
/* ------------------------------------------------------------------------ */

void dynemb_snapshot_free(dynemb_snapshot *snap) {
  if (!snap) return;
  free(snap->keys);
  free(snap->values);
  free(snap->last_access);
  free(snap->cand_keys);
  free(snap->cand_counts);
  free(snap->cand_last_access);
  memset(snap, 0, sizeof *snap);
}

static void lock_all(dynemb_table *t, int write) {
  for (uint32_t s = 0; s < t->nshards; s++) {
    if (write)
      pthread_rwlock_wrlock(&t->shards[s].lock);
    else
      pthread_rwlock_rdlock(&t->shards[s].lock);
  }
}

static void unlock_all(dynemb_table *t) {
  for (uint32_t s = t->nshards; s-- > 0;)
    pthread_rwlock_unlock(&t->shards[s].lock);
}

/* Collects (key, shard << 40 | position) of every entry of the chosen
 * index of every shard. */
static size_t collect(dynemb_table *t, int cands, kv *out) {
  size_t n = 0;
  for (uint32_t s = 0; s < t->nshards; s++) {
    const dynemb_index *ix = cands ? &t->shards[s].cands : &t->shards[s].rows;
    if (!ix->count) continue;
    for (uint64_t i = 0; i < ix->cap; i++)
      if (ix->slots[i].loc != DYNEMB_LOC_EMPTY) {
        out[n].k = sort_key(ix->slots[i].key);
        out[n].v = ((uint64_t)s << 40) | i;
        n++;
      }
  }
  return n;
}

static inline dynemb_index_entry *entry_of(dynemb_table *t, int cands,
                                           uint64_t v) {
  dynemb_shard *sh = &t->shards[v >> 40];
  dynemb_index *ix = cands ? &sh->cands : &sh->rows;
  return ix->slots + (v & ((UINT64_C(1) << 40) - 1));
}

struct dynemb_table_reader {
  dynemb_table *t;
  kv *order; /* the rows, in key order: shard << 40 | index entry */
  size_t rows;
};

int dynemb_table_snapshot_open(dynemb_table *t, dynemb_snapshot *snap,
                               dynemb_table_reader **out) {
  dynemb_error_clear();
  *out = NULL;
  memset(snap, 0, sizeof *snap);
  if (!t) return null_table("dynemb_table_snapshot");
  dynemb_table_reader *rd = calloc(1, sizeof *rd);
  if (!rd) goto nomem0;
  lock_all(t, 0);
  size_t rows = 0, cands = 0;
  for (uint32_t s = 0; s < t->nshards; s++) {
    rows += t->shards[s].rows.count;
    cands += t->shards[s].cands.count;
  }
  snap->dim = t->dim;
  snap->row_floats = t->row_floats;
  snap->optimizer_kind = t->cfg.optimizer.kind;
  snap->apply_steps = LOAD(&t->apply_steps);
  snap->rows = rows;
  snap->candidates = cands;
  rd->t = t;
  rd->rows = rows;
  rd->order = malloc(rows * sizeof *rd->order + 1);
  kv *corder = malloc(cands * sizeof *corder + 1);
  snap->keys = malloc(rows * sizeof *snap->keys + 1);
  snap->last_access = malloc(rows * sizeof *snap->last_access + 1);
  snap->cand_keys = malloc(cands * sizeof *snap->cand_keys + 1);
  snap->cand_counts = malloc(cands * sizeof *snap->cand_counts + 1);
  snap->cand_last_access = malloc(cands * sizeof *snap->cand_last_access + 1);
  int ok = rd->order && corder && snap->keys && snap->last_access &&
           snap->cand_keys && snap->cand_counts && snap->cand_last_access;
  if (ok) {
    collect(t, 0, rd->order);
    collect(t, 1, corder);
    ok = radix_sort(rd->order, rows) == DYNEMB_OK &&
         radix_sort(corder, cands) == DYNEMB_OK;
  }
  if (ok) {
    for (size_t i = 0; i < rows; i++) {
      const dynemb_index_entry *e = entry_of(t, 0, rd->order[i].v);
      snap->keys[i] = e->key;
      snap->last_access[i] = LOAD(&e->last_access);
    }
    for (size_t i = 0; i < cands; i++) {
      const dynemb_index_entry *e = entry_of(t, 1, corder[i].v);
      snap->cand_keys[i] = e->key;
      snap->cand_counts[i] = e->loc;
      snap->cand_last_access[i] = e->last_access;
    }
  }
  free(corder);
  if (ok) {
    *out = rd;
    return DYNEMB_OK;
  }
  dynemb_table_snapshot_close(rd);
  dynemb_snapshot_free(snap);
  return dynemb_error_set(DYNEMB_ENOMEM,
                          "table '%s': out of memory for a snapshot of %zu "
                          "rows and %zu candidates",
                          t->name, rows, cands);
nomem0:
  return dynemb_error_set(DYNEMB_ENOMEM,
                          "table '%s': out of memory for a snapshot", t->name);
}

int dynemb_table_reader_rows(const dynemb_table_reader *rd, size_t first,
                             size_t n, float *out) {
  const dynemb_table *t = rd->t;
  const size_t rf = (size_t)t->row_floats, dim = (size_t)t->dim;
  for (size_t i = first; i < first + n && i < rd->rows; i++) {
    const dynemb_index_entry *e = entry_of(rd->t, 0, rd->order[i].v);
    const dynemb_shard *sh = &t->shards[rd->order[i].v >> 40];
    float *to = out + (i - first) * rf;
    if (!on_host(e->loc)) {
      int rc = dynemb_ssd_read(&rd->t->ssd, DYNEMB_LOC_SLOT(e->loc), to,
                               rf > dim ? to + dim : NULL);
      if (rc) return rc; /* the message names the table and the disk */
      continue;
    }
    memcpy(to, row_of(sh, e->loc), dim * sizeof(float));
    if (rf > dim) memcpy(to + dim, slots_of(sh, e->loc), (rf - dim) * sizeof(float));
  }
  return DYNEMB_OK;
}

void dynemb_table_snapshot_close(dynemb_table_reader *rd) {
  if (!rd) return;
  if (rd->t) unlock_all(rd->t);
  free(rd->order);
  free(rd);
}

int dynemb_table_snapshot(dynemb_table *t, dynemb_snapshot *snap) {
  dynemb_error_clear();
  if (!snap)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "dynemb_table_snapshot: snapshot pointer is NULL");
  dynemb_table_reader *rd = NULL;
  int rc = dynemb_table_snapshot_open(t, snap, &rd);
  if (rc) return rc;
  const size_t rf = (size_t)t->row_floats;
  snap->values = malloc(snap->rows * rf * sizeof *snap->values + 1);
  rc = snap->values ? dynemb_table_reader_rows(rd, 0, snap->rows, snap->values)
                    : dynemb_error_set(DYNEMB_ENOMEM,
                                       "table '%s': out of memory for a "
                                       "snapshot of %zu rows x %zu floats",
                                       t->name, snap->rows, rf);
  dynemb_table_snapshot_close(rd);
  if (rc) dynemb_snapshot_free(snap);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Import                                                                    */
/* ------------------------------------------------------------------------ */

/* Selects the entries of `keys` in the wanted key shard, sorted by key,
 * keeping the last of repeated keys. Returns the count or SIZE_MAX. */
static size_t select_keys(const int64_t *keys, size_t n, uint32_t shard_index,
                          uint32_t shard_count, kv **out) {
  kv *a = malloc(n * sizeof *a + 1);
  if (!a) return SIZE_MAX;
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (shard_count > 1 && dynemb_key_shard(keys[i], shard_count) != shard_index)
      continue;
    a[m].k = sort_key(keys[i]);
    a[m].v = i;
    m++;
  }
  if (radix_sort(a, m)) {
    free(a);
    return SIZE_MAX;
  }
  size_t w = 0;
  for (size_t i = 0; i < m; i++) {
    if (w && a[w - 1].k == a[i].k)
      a[w - 1] = a[i]; /* stable sort: the later one wins */
    else
      a[w++] = a[i];
  }
  *out = a;
  return w;
}

/* Writes snapshot row `from` into record `rec` of the SSD tier (with fresh
 * optimizer slots if `emb_only`; `*buf` is a row-sized scratch made on
 * first use). */
static int import_ssd_row(dynemb_table *t, uint32_t rec, const float *from,
                          int emb_only, float **buf) {
  if (!t->slots || !emb_only) /* the snapshot row has the record's layout */
    return dynemb_ssd_write(&t->ssd, rec, from, t->slots ? from + t->dim : NULL);
  if (!*buf && !(*buf = malloc((size_t)t->row_floats * sizeof(float))))
    return dynemb_error_set(DYNEMB_ENOMEM,
                            "table '%s': out of memory importing rows to the "
                            "SSD tier", t->name);
  dynemb_optim_init_slots(&t->cfg.optimizer, *buf + t->dim, t->dim);
  return dynemb_ssd_write(&t->ssd, rec, from, *buf + t->dim);
}

int dynemb_table_import(dynemb_table *t, const dynemb_snapshot *snap,
                        unsigned flags, uint32_t shard_index,
                        uint32_t shard_count) {
  dynemb_error_clear();
  if (!t) return null_table("dynemb_table_import");
  if (!snap)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': import got a NULL snapshot",
                            t->name);
  if (flags & ~(unsigned)(DYNEMB_IMPORT_REPLACE | DYNEMB_IMPORT_EMBEDDING_ONLY |
                          DYNEMB_IMPORT_KEEP_STEPS))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': import flags 0x%x contain unknown "
                            "bits; use DYNEMB_IMPORT_REPLACE, "
                            "_EMBEDDING_ONLY and _KEEP_STEPS",
                            t->name, flags);
  if (shard_count > 1 && shard_index >= shard_count)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': import shard_index %u is not below "
                            "shard_count %u; pass 0 .. shard_count-1",
                            t->name, shard_index, shard_count);
  if (snap->dim != t->dim)
    return dynemb_error_set(DYNEMB_EDIM,
                            "table '%s': snapshot has dim %d but the table has "
                            "dim %d; create the table with dim %d or import "
                            "the matching data",
                            t->name, snap->dim, t->dim, snap->dim);
  int sslots = dynemb_optim_slot_count(snap->optimizer_kind);
  if (sslots < 0 || snap->row_floats != snap->dim * (1 + sslots))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': snapshot is inconsistent (optimizer "
                            "kind %d, %d floats per row for dim %d)",
                            t->name, snap->optimizer_kind, snap->row_floats,
                            snap->dim);
  const int emb_only = (flags & DYNEMB_IMPORT_EMBEDDING_ONLY) != 0;
  if (!emb_only && (snap->optimizer_kind != t->cfg.optimizer.kind ||
                    snap->row_floats != t->row_floats))
    return dynemb_error_set(
        DYNEMB_EMISMATCH,
        "table '%s': snapshot rows hold optimizer %s state (%d floats per "
        "row) but the table uses %s (%d floats per row); use the same "
        "optimizer or pass DYNEMB_IMPORT_EMBEDDING_ONLY to take only the "
        "embeddings",
        t->name, dynemb_optim_name(snap->optimizer_kind), snap->row_floats,
        dynemb_optim_name(t->cfg.optimizer.kind), t->row_floats);
  if ((snap->rows && (!snap->keys || !snap->values)) ||
      (snap->candidates && (!snap->cand_keys || !snap->cand_counts)))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': snapshot has %zu rows / %zu "
                            "candidates but NULL arrays for them",
                            t->name, snap->rows, snap->candidates);
  const int replace = (flags & DYNEMB_IMPORT_REPLACE) != 0;
  kv *rsel = NULL, *csel = NULL;
  float *ssd_buf = NULL;
  uint64_t *need = NULL; /* per shard: new rows, new candidates, new rows
                          * in host memory */
  size_t nr = select_keys(snap->keys, snap->rows, shard_index, shard_count, &rsel);
  size_t nc = nr == SIZE_MAX ? SIZE_MAX
                             : select_keys(snap->cand_keys, snap->candidates,
                                           shard_index, shard_count, &csel);
  need = calloc((size_t)t->nshards * 3, sizeof *need);
  if (nr == SIZE_MAX || nc == SIZE_MAX || !need) {
    free(rsel);
    free(csel);
    free(need);
    return dynemb_error_set(DYNEMB_ENOMEM,
                            "table '%s': out of memory importing %zu rows",
                            t->name, snap->rows);
  }
  int rc = DYNEMB_OK;
  lock_all(t, 1);
  /* 1. count what will be added (nothing changes yet). With an SSD tier,
   * new rows fill host memory up to its budget (in key order) and go to
   * SSD after that; rows already on SSD are rewritten there. */
  const int ssd = dynemb_ssd_on(&t->ssd);
  const uint64_t hbudget = t->cfg.host_vocabulary_size;
  const uint64_t host_now = replace ? 0 : LOAD(&t->rows_total);
  const uint64_t host_room0 =
      !ssd ? UINT64_MAX : hbudget > host_now ? hbudget - host_now : 0;
  uint64_t total = 0, host_room = host_room0, ssd_new = 0;
  for (uint32_t s = 0; s < t->nshards; s++)
    total += replace ? 0 : t->shards[s].rows.count;
  for (size_t i = 0; i < nr; i++) {
    int64_t key = snap->keys[rsel[i].v];
    uint64_t h = dynemb_hash_key(key);
    uint32_t s = dynemb_table_shard_of(t, h);
    if (replace || !dynemb_index_find(&t->shards[s].rows, key, h)) {
      need[3 * s]++;
      if (host_room) {
        need[3 * s + 2]++;
        host_room--;
      } else {
        ssd_new++;
      }
      total++;
    }
  }
  for (size_t i = 0; i < nc; i++) {
    uint32_t s = dynemb_table_shard_of(t, dynemb_hash_key(snap->cand_keys[csel[i].v]));
    need[3 * s + 1]++;
  }
  uint64_t budget = t->cfg.host_vocabulary_size;
  if (ssd && (replace ? 0 : dynemb_ssd_used(&t->ssd)) + ssd_new >
                 t->cfg.ssd_vocabulary_size)
    rc = dynemb_error_set(DYNEMB_ECAPACITY,
                          "table '%s': importing would make %llu rows but "
                          "host_vocabulary_size + ssd_vocabulary_size is "
                          "%llu; raise ssd_vocabulary_size or enable "
                          "eviction",
                          t->name, (unsigned long long)total,
                          (unsigned long long)(budget +
                                               t->cfg.ssd_vocabulary_size));
  else if (!ssd && budget && total > budget)
    rc = dynemb_error_set(DYNEMB_ECAPACITY,
                          "table '%s': importing would make %llu rows but "
                          "host_vocabulary_size is %llu; raise "
                          "host_vocabulary_size or enable eviction",
                          t->name, (unsigned long long)total,
                          (unsigned long long)budget);
  /* 2. reserve index entries and row slots, so that step 3 cannot fail */
  for (uint32_t s = 0; s < t->nshards && !rc; s++) {
    dynemb_shard *sh = &t->shards[s];
    uint64_t rows_now = replace ? 0 : sh->rows.count;
    /* (a replace frees every slot of the shard) */
    uint64_t free_now = replace ? sh->arena.slots
                                : dynemb_arena_available(&sh->arena);
    uint64_t nr_s = need[3 * s], nc_s = need[3 * s + 1];
    uint64_t nh_s = need[3 * s + 2];
    int r = dynemb_index_reserve(&sh->rows, rows_now + nr_s);
    if (!r) r = dynemb_index_reserve(&sh->cands,
                                     (replace ? 0 : sh->cands.count) + nc_s);
    if (!r && nh_s > free_now)
      r = dynemb_arena_reserve(&sh->arena,
                               dynemb_arena_available(&sh->arena) + (nh_s - free_now));
    if (!r && ssd) r = slots_reserve(sh, sh->arena.slots); /* slot keys */
    if (r) rc = insert_error(t, r);
  }
  /* 3. apply */
  if (!rc) {
    const size_t rf = (size_t)t->row_floats, srf = (size_t)snap->row_floats;
    if (replace) {
      for (uint32_t s = 0; s < t->nshards; s++) {
        dynemb_shard *sh = &t->shards[s];
        dynemb_index_clear_keep(&sh->rows);
        dynemb_index_clear_keep(&sh->cands);
        dynemb_arena_clear_keep(&sh->arena);
        slots_clear(sh);
      }
      dynemb_ssd_reset(&t->ssd);
    }
    host_room = host_room0;
    uint64_t rows_after = 0;
    uint32_t max_la = 0; /* the table clock follows the imported stamps */
    for (uint32_t s = 0; s < t->nshards; s++) t->shards[s].gen++;
    for (size_t i = 0; i < nr && !rc; i++) {
      size_t src = rsel[i].v;
      int64_t key = snap->keys[src];
      uint64_t h = dynemb_hash_key(key);
      dynemb_shard *sh = &t->shards[dynemb_table_shard_of(t, h)];
      uint32_t la = snap->last_access ? snap->last_access[src] : 0;
      dynemb_index_entry *e = dynemb_index_find(&sh->rows, key, h);
      if (!e) {
        uint32_t slot = 0;
        if (host_room) {
          host_room--;
          dynemb_arena_alloc(&sh->arena, &slot); /* reserved: cannot fail */
          (void)slot_taken(t, sh, slot, key);   /* reserved too */
          e = dynemb_index_insert(&sh->rows, key, h,
                                  DYNEMB_LOC(DYNEMB_TIER_HOST, slot), la);
        } else { /* counted against the SSD tier's size above */
          (void)dynemb_ssd_alloc(&t->ssd, &slot);
          e = dynemb_index_insert(&sh->rows, key, h,
                                  DYNEMB_LOC(DYNEMB_TIER_SSD, slot), la);
        }
      } else {
        e->last_access = la;
      }
      if (la > max_la) max_la = la;
      const float *from = snap->values + src * srf;
      if (!on_host(e->loc)) {
        rc = import_ssd_row(t, DYNEMB_LOC_SLOT(e->loc), from, emb_only,
                            &ssd_buf);
      } else {
        memcpy(row_of(sh, e->loc), from, (size_t)t->dim * sizeof(float));
        if (t->slots && emb_only)
          dynemb_optim_init_slots(&t->cfg.optimizer, slots_of(sh, e->loc),
                                  t->dim);
        else if (t->slots)
          memcpy(slots_of(sh, e->loc), from + t->dim,
                 (rf - (size_t)t->dim) * sizeof(float));
      }
      if (sh->cands.count) {
        dynemb_index_entry *c = dynemb_index_find(&sh->cands, key, h);
        if (c) dynemb_index_erase_at(&sh->cands, (uint64_t)(c - sh->cands.slots));
      }
    }
    for (size_t i = 0; i < nc; i++) {
      size_t src = csel[i].v;
      int64_t key = snap->cand_keys[src];
      uint64_t h = dynemb_hash_key(key);
      dynemb_shard *sh = &t->shards[dynemb_table_shard_of(t, h)];
      if (dynemb_index_find(&sh->rows, key, h)) continue; /* row wins */
      uint32_t cnt = snap->cand_counts[src];
      if (cnt >= DYNEMB_LOC_EMPTY) cnt = DYNEMB_LOC_EMPTY - 1;
      uint32_t la = snap->cand_last_access ? snap->cand_last_access[src] : 0;
      if (la > max_la) max_la = la;
      dynemb_index_entry *c = dynemb_index_find(&sh->cands, key, h);
      if (!c)
        dynemb_index_insert(&sh->cands, key, h, cnt, la);
      else {
        c->loc = cnt;
        c->last_access = la;
      }
    }
    for (uint32_t s = 0; s < t->nshards; s++) rows_after += t->shards[s].rows.count;
    STORE(&t->rows_total, rows_after - dynemb_ssd_used(&t->ssd));
    if (!(flags & DYNEMB_IMPORT_KEEP_STEPS)) STORE(&t->apply_steps, snap->apply_steps);
    clock_advance(t, max_la);
  }
  unlock_all(t);
  free(rsel);
  free(csel);
  free(need);
  free(ssd_buf);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Run-time settings: default value, clock                                   */
/* ------------------------------------------------------------------------ */

int dynemb_table_set_default_value(dynemb_table *t, const float *value) {
  dynemb_error_clear();
  if (!t) return null_table("dynemb_table_set_default_value");
  if (value)
    for (int i = 0; i < t->dim; i++)
      if (!isfinite(value[i]))
        return dynemb_error_set(DYNEMB_EINVAL,
                                "table '%s': default value element %d is "
                                "%g; pass finite numbers",
                                t->name, i, (double)value[i]);
  /* Lookups read the default under a shard lock: hold them all to write. */
  lock_all(t, 1);
  for (int i = 0; i < t->dim; i++) t->default_value[i] = value ? value[i] : 0.0f;
  unlock_all(t);
  return DYNEMB_OK;
}

int64_t dynemb_table_clock(dynemb_table *t) {
  return t ? (int64_t)LOAD(&t->clock) : 0;
}
