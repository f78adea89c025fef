/*
 * table.c -- a table's configuration, life cycle, run-time settings and
 * statistics (table_int.h lists the table's other files).
 *
 * A configuration is validated field by field before anything is
 * allocated, so that the message names the one field at fault and the
 * fix; the shards, their locks and the memory pools are then made at once
 * (tables grow later, row by row, in tier.c).
 */
#include "table_int.h"

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
#define MAX_NOW INT64_C(4294967295)

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
  cfg->optimizer.weight_decay = 0.004f; /* Keras' AdamW and mxRec's default */
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
  if (!(t->host_budget_name = strdup(cfg->host_budget_name ? cfg->host_budget_name
                                                           : "host_vocabulary_size")))
    goto nomem;
  t->cfg.name = t->name;
  t->cfg.default_value = t->default_value;
  t->cfg.ssd_data_path = t->ssd_data_path;
  t->cfg.host_budget_name = t->host_budget_name;
  t->dim = cfg->dim;
  t->slots = dynemb_optim_slot_count(cfg->optimizer.kind);
  t->row_floats = cfg->dim * (1 + t->slots);
  t->nshards = cfg->shards ? (uint32_t)cfg->shards : DEFAULT_SHARDS;
  t->cfg.shards = (int)t->nshards;
  while ((UINT32_C(1) << t->shard_bits) < t->nshards) t->shard_bits++;
  t->access_threshold = cfg->access_threshold;
  t->eviction_threshold = cfg->eviction_threshold;
  t->link.refs = 1;
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
    free(t->host_budget_name);
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
      free(sh->row_key);
      free(sh->host_pos);
      free(sh->host_list);
      pthread_rwlock_destroy(&sh->lock);
    }
    free(t->shards);
    dynemb_slab_pool_destroy(&t->pool);
    dynemb_slab_pool_destroy(&t->slot_pool);
  }
  dynemb_ssd_close(&t->ssd);
  if (t->ckpt_track_release) t->ckpt_track_release(t->ckpt_track);
  free(t->name);
  free(t->default_value);
  free(t->ssd_data_path);
  free(t->host_budget_name);
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

int dynemb_table_null_error(const char *fn) {
  return dynemb_error_set(DYNEMB_EINVAL,
                          "%s: table is NULL; pass a table from "
                          "dynemb_table_create or dynemb_table_find",
                          fn);
}

int dynemb_table_set_access_threshold(dynemb_table *t, uint32_t threshold) {
  dynemb_error_clear();
  if (!t) return dynemb_table_null_error("dynemb_table_set_access_threshold");
  STORE(&t->access_threshold, threshold);
  return DYNEMB_OK;
}

int dynemb_table_set_admission_counting(dynemb_table *t, int counting) {
  dynemb_error_clear();
  if (!t) return dynemb_table_null_error("dynemb_table_set_admission_counting");
  STORE(&t->counting_stopped, counting ? 0u : 1u);
  return DYNEMB_OK;
}

int dynemb_table_admission_counting(const dynemb_table *t) {
  return t && !LOAD(&t->counting_stopped);
}

int dynemb_table_set_eviction_threshold(dynemb_table *t, int64_t threshold) {
  dynemb_error_clear();
  if (!t) return dynemb_table_null_error("dynemb_table_set_eviction_threshold");
  if (threshold < 0)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': eviction threshold %lld is negative; "
                            "use 0 to disable eviction or a positive age",
                            t->name, (long long)threshold);
  STORE(&t->eviction_threshold, threshold);
  return DYNEMB_OK;
}

void dynemb_widen_keys(const int32_t *in, size_t n, int64_t *out) {
  for (size_t i = 0; i < n; i++) out[i] = (int64_t)in[i];
}

int dynemb_table_check_now(const dynemb_table *t, int64_t now) {
  if (now < 0 || now > MAX_NOW)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': now = %lld is out of range; pass a "
                            "time in [0, 2^32-1] (global step or Unix "
                            "seconds)",
                            t->name, (long long)now);
  return DYNEMB_OK;
}

/* ------------------------------------------------------------------------ */
/* Locks                                                                     */
/* ------------------------------------------------------------------------ */

void dynemb_table_lock_all(dynemb_table *t, int write) {
  for (uint32_t s = 0; s < t->nshards; s++) {
    if (write)
      pthread_rwlock_wrlock(&t->shards[s].lock);
    else
      pthread_rwlock_rdlock(&t->shards[s].lock);
  }
}

void dynemb_table_unlock_all(dynemb_table *t) {
  for (uint32_t s = t->nshards; s-- > 0;)
    pthread_rwlock_unlock(&t->shards[s].lock);
}

int dynemb_table_relayout_locked(dynemb_table *t, const dynemb_optimizer *opt) {
  /* The row layout follows the new optimizer's slots. The tier file comes
   * first, as it is the step that can fail. */
  const int slots = dynemb_optim_slot_count(opt->kind);
  const size_t emb_f = (size_t)t->dim, slot_f = (size_t)t->dim * (size_t)slots;
  const size_t row_f = emb_f + slot_f;
  int rc = dynemb_ssd_relayout(&t->ssd, emb_f * sizeof(float),
                               slot_f * sizeof(float));
  if (rc) return rc;
  for (uint32_t s = 0; s < t->nshards; s++) {
    dynemb_arena_free(&t->shards[s].arena);
    dynemb_tier_host_clear(&t->shards[s]);
    t->shards[s].gen++;
  }
  dynemb_slab_pool_reshape(&t->pool, dynemb_arena_max_chunk_bytes(row_f, emb_f));
  dynemb_slab_pool_reshape(&t->slot_pool, dynemb_arena_max_chunk_bytes(
                                              row_f, slot_f ? slot_f : 1));
  for (uint32_t s = 0; s < t->nshards; s++)
    dynemb_arena_init(&t->shards[s].arena, emb_f, slot_f, &t->pool,
                      &t->slot_pool);
  t->cfg.optimizer = *opt;
  t->slots = slots;
  t->row_floats = (int)row_f;
  STORE(&t->rows_total, 0);
  return DYNEMB_OK;
}

int dynemb_table_set_optimizer(dynemb_table *t, const dynemb_optimizer *opt) {
  dynemb_error_clear();
  if (!t) return dynemb_table_null_error("dynemb_table_set_optimizer");
  if (!opt)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "table '%s': dynemb_table_set_optimizer got a NULL "
                            "optimizer", t->name);
  int rc = dynemb_optim_validate(opt, t->name);
  if (rc) return rc;
  dynemb_table_lock_all(t, 1);
  uint64_t rows = 0;
  for (uint32_t s = 0; s < t->nshards; s++) rows += t->shards[s].rows.count;
  if (opt->kind == t->cfg.optimizer.kind) {
    t->cfg.optimizer = *opt; /* the same state: new hyper-parameters */
  } else if (rows) {
    rc = dynemb_error_set(
        DYNEMB_EMISMATCH,
        "table '%s' holds %llu rows with %s state; its optimizer can become "
        "%s only while it holds no rows. Train it with the optimizer it was "
        "trained with, or start a table of the new optimizer from these rows "
        "(a checkpoint loaded with DYNEMB_IMPORT_EMBEDDING_ONLY)",
        t->name, (unsigned long long)rows,
        dynemb_optimizer_name(t->cfg.optimizer.kind),
        dynemb_optimizer_name(opt->kind));
  } else {
    rc = dynemb_table_relayout_locked(t, opt);
  }
  dynemb_table_unlock_all(t);
  return rc;
}

int dynemb_table_has_ssd(const dynemb_table *t) {
  return dynemb_ssd_on(&t->ssd);
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
  bytes += strlen(t->host_budget_name) + 1;
  for (uint32_t s = 0; s < t->nshards; s++) {
    dynemb_shard *sh = &t->shards[s];
    pthread_rwlock_rdlock(&sh->lock);
    st->size += sh->rows.count;
    st->candidates += sh->cands.count;
    st->capacity += sh->arena.capacity;
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
    n += t->shards[s].arena.capacity;
    pthread_rwlock_unlock(&t->shards[s].lock);
  }
  return n + dynemb_ssd_high(&t->ssd);
}

/* ------------------------------------------------------------------------ */
/* Run-time settings: default value, clock                                   */
/* ------------------------------------------------------------------------ */

int dynemb_table_set_default_value(dynemb_table *t, const float *value) {
  dynemb_error_clear();
  if (!t) return dynemb_table_null_error("dynemb_table_set_default_value");
  if (value)
    for (int i = 0; i < t->dim; i++)
      if (!isfinite(value[i]))
        return dynemb_error_set(DYNEMB_EINVAL,
                                "table '%s': default value element %d is "
                                "%g; pass finite numbers",
                                t->name, i, (double)value[i]);
  /* Lookups read the default under a shard lock: hold them all to write. */
  dynemb_table_lock_all(t, 1);
  for (int i = 0; i < t->dim; i++) t->default_value[i] = value ? value[i] : 0.0f;
  dynemb_table_unlock_all(t);
  return DYNEMB_OK;
}

int64_t dynemb_table_clock(dynemb_table *t) {
  return t ? (int64_t)LOAD(&t->clock) : 0;
}
