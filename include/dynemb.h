/*
 * dynemb.h -- public C API of the dynemb embedding engine.
 *
 * dynemb keeps large, ever-changing embedding tables for recommendation
 * training. A table maps 64-bit integer keys (feature ids) to rows; a row is
 * the embedding (`dim` floats) followed by the optimizer's slots (its
 * state, TensorFlow's word). Tables need
 * no preset size: they grow as new keys arrive. Keys may be admitted only
 * after they were seen `access_threshold` times (feature admission) and rows
 * not seen for `eviction_threshold` time units are removed (feature eviction).
 * Gradients are applied inside the engine by a sparse optimizer with
 * TensorFlow's exact math (SGD, Adagrad, lazy Adam, FTRL).
 *
 * Tables live in a process-wide registry keyed by name, so that independent
 * callers (TensorFlow kernels, the CLI, tests) find the same table.
 *
 * Conventions
 *  - Every function that can fail returns an `int` status: DYNEMB_OK (0) or a
 *    positive DYNEMB_E* code. On failure, dynemb_last_error() returns a
 *    sentence for the calling thread that names the table or argument at
 *    fault and says how to fix it. dynemb_strerror() turns a code into a
 *    generic sentence.
 *  - A failed call changes nothing (no half-applied batch, no half-loaded
 *    table) unless its documentation says otherwise.
 *  - All functions are thread-safe. Any number of threads may call lookup,
 *    apply, evict, stats, snapshot and save on the same table at once.
 *  - The engine starts threads of its own only to page memory in ahead of
 *    growing tables: one per row-memory pool that has grown past 16 MiB
 *    (at most two per table, named "dynemb-prefault", all signals
 *    blocked, scheduled SCHED_IDLE so they only use idle CPU time), ended
 *    when the table is destroyed. A child forked while they run starts its
 *    own when it grows a table.
 *  - "Time" (`now`) is an opaque, caller-chosen clock: global steps, or
 *    seconds (wall time or data timestamps). A table only compares
 *    differences against its eviction_threshold, so the caller must use one
 *    unit per table. `now` must be in [0, 2^32 - 1] (steps, or Unix seconds
 *    until 2106).
 */
#ifndef DYNEMB_H
#define DYNEMB_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DYNEMB_API __attribute__((visibility("default")))
#else
#define DYNEMB_API
#endif

/* Version of the library (not of the checkpoint format). */
#define DYNEMB_VERSION_MAJOR 0
#define DYNEMB_VERSION_MINOR 2
#define DYNEMB_VERSION_PATCH 0

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

enum dynemb_status {
  DYNEMB_OK = 0,
  DYNEMB_EINVAL = 1,     /* an argument is invalid (message names it) */
  DYNEMB_ENOMEM = 2,     /* out of memory */
  DYNEMB_EEXIST = 3,     /* a table with this name already exists */
  DYNEMB_ENOTFOUND = 4,  /* no table (or checkpoint entry) with this name */
  DYNEMB_EDIM = 5,       /* dimension / row layout mismatch */
  DYNEMB_ENONFINITE = 6, /* NaN or Inf in gradients (policy ERROR) */
  DYNEMB_EIO = 7,        /* operating-system I/O error (message has errno) */
  DYNEMB_ECORRUPT = 8,   /* checkpoint data fails checks (checksum, size) */
  DYNEMB_EVERSION = 9,   /* checkpoint written by an unknown format version */
  DYNEMB_ECAPACITY = 10, /* a capacity budget is exhausted */
  DYNEMB_EMISMATCH = 11  /* checkpoint optimizer/layout differs from table */
};

/* A generic sentence for `code` (never NULL; unknown codes get one too). */
DYNEMB_API const char *dynemb_strerror(int code);

/* The detailed message of the last failing dynemb call on this thread: it
 * names the table or argument and the fix. Empty string if none. The pointer
 * is valid until the next dynemb call on this thread. */
DYNEMB_API const char *dynemb_last_error(void);

/* ------------------------------------------------------------------------ */
/* Table configuration                                                       */
/* ------------------------------------------------------------------------ */

/* Initial value of a new row. The value is a pure function of
 * (seed, key, element index): it never depends on threads, batch order,
 * sharding or insertion order. */
enum dynemb_init_kind {
  DYNEMB_INIT_ZEROS = 0,
  DYNEMB_INIT_CONSTANT = 1,         /* every element = a */
  DYNEMB_INIT_UNIFORM = 2,          /* U[a, b) : a = min, b = max */
  DYNEMB_INIT_NORMAL = 3,           /* N(a, b^2): a = mean, b = stddev */
  DYNEMB_INIT_TRUNCATED_NORMAL = 4  /* N(a, b^2) redrawn outside a +- 2b */
};

typedef struct dynemb_initializer {
  int kind;      /* enum dynemb_init_kind */
  float a, b;    /* meaning depends on kind, see above */
  uint64_t seed; /* table seed */
} dynemb_initializer;

/* Sparse optimizers. Slots per row (in units of `dim` floats):
 * SGD 0, ADAGRAD 1 (accumulator), ADAM 2 (m, v), FTRL 2 (accum, linear),
 * ADAMW 2 (m, v). New kinds go at the end: the numbers are in checkpoints. */
enum dynemb_optimizer_kind {
  DYNEMB_OPT_SGD = 0,
  DYNEMB_OPT_ADAGRAD = 1,
  DYNEMB_OPT_ADAM = 2, /* lazy Adam: only rows present in the batch move */
  DYNEMB_OPT_FTRL = 3,
  /* lazy AdamW: lazy Adam plus decoupled weight decay (Loshchilov &
   * Hutter), var -= learning_rate * weight_decay * var before the Adam
   * step; like the Adam step, the decay touches only rows in the batch. */
  DYNEMB_OPT_ADAMW = 4
};

/* The optimizer's name ("sgd", "adagrad", "adam", "ftrl", "adamw"), or
 * "unknown". */
DYNEMB_API const char *dynemb_optimizer_name(int kind);

typedef struct dynemb_optimizer {
  int kind;                        /* enum dynemb_optimizer_kind */
  float learning_rate;             /* used when apply gets lr < 0 */
  float initial_accumulator_value; /* ADAGRAD (TF default 0.1), FTRL (0.1) */
  float beta1, beta2, epsilon;     /* ADAM, ADAMW (TF: 0.9, 0.999, 1e-8) */
  float learning_rate_power;       /* FTRL, <= 0 (TF default -0.5) */
  float l1, l2, l2_shrinkage;      /* FTRL regularization, >= 0 */
  float weight_decay;              /* ADAMW, >= 0 (per unit learning rate) */
} dynemb_optimizer;

/* What apply does with a NaN/Inf gradient. */
enum dynemb_nonfinite_policy {
  DYNEMB_NONFINITE_ERROR = 0, /* reject the whole batch, apply nothing */
  DYNEMB_NONFINITE_SKIP = 1   /* skip those keys, count them in stats */
};

typedef struct dynemb_table_config {
  const char *name; /* unique in the process; copied */
  int dim;          /* embedding width, 1 .. 65536 */
  dynemb_initializer init;
  dynemb_optimizer optimizer;
  /* Feature admission: a key gets a trainable row at its
   * access_threshold-th occurrence in train-mode lookups. 0 or 1: at once.
   * Until then its lookup returns the default value and its gradients are
   * dropped; it costs a small counter entry, not a row. */
  uint32_t access_threshold;
  /* Feature eviction: rows (and admission candidates) whose last access is
   * more than eviction_threshold time units before `now` are removed by
   * dynemb_evict(). 0 disables eviction. */
  int64_t eviction_threshold;
  /* Value returned for keys without a row (eval mode, or not yet admitted):
   * `dim` floats, copied; NULL means zeros. */
  const float *default_value;
  int nonfinite_policy; /* enum dynemb_nonfinite_policy */
  /* Number of lock shards (power of two, 1 .. 4096); 0 = default (64).
   * Each shard has its own rwlock and key index, and a rehash stalls one
   * shard only: more shards shorten the longest insert call of very large
   * tables, fewer make batched calls on small tables cheaper (a batch of a
   * few thousand keys touches nearly every shard). BENCHMARKS.md compares
   * 16, 64 and 256. */
  int shards;
  /* Storage tiers, in rows. The device tier is not implemented in this
   * version (a nonzero device_vocabulary_size is rejected with a message).
   *
   * host_vocabulary_size: rows in host memory; 0 = unlimited. Without an
   * SSD tier it is a hard budget: inserts beyond it fail with ECAPACITY.
   *
   * ssd_vocabulary_size (> 0 turns the SSD tier on; needs
   * host_vocabulary_size > 0 and ssd_data_path): rows the SSD tier may
   * hold, at most 2^30 - 1. Host memory is then a cache above it: when a
   * row enters memory (insert, or a train lookup of a row on SSD) and
   * memory holds host_vocabulary_size rows, the least recently accessed
   * of a few cold rows of the same shard moves to SSD; a row is cold if
   * the calling lookup did not touch it. When no row of the shard is cold,
   * memory exceeds its budget until later calls move rows. Train lookups
   * bring rows back into memory; eval lookups, prepared reads and applies
   * read or update rows on SSD in place. Inserts fail with ECAPACITY only
   * when both tiers are full. The SSD file is anonymous (gone when the
   * process ends); checkpoints hold every row whatever its tier. With an
   * SSD tier an I/O error fails the call with EIO, and an import that
   * fails that way may have imported part of the rows. */
  uint64_t device_vocabulary_size;
  uint64_t host_vocabulary_size;
  uint64_t ssd_vocabulary_size;
  /* directory for the SSD tier's file, or several, one per line ('\n'),
   * filled one after the other (ssd.h); copied */
  const char *ssd_data_path;
  /* The name under which the caller's users set host_vocabulary_size, for
   * the "table is full" message (a binding may expose the budget under
   * another name, e.g. mxRec's device_vocabulary_size); NULL means
   * "host_vocabulary_size". Copied. */
  const char *host_budget_name;
} dynemb_table_config;

/* Fills `cfg` with defaults: dim 0 (must be set), name NULL (must be set),
 * zeros initializer, SGD lr 0.01 with TF's defaults for every other
 * hyper-parameter, no admission, no eviction, zero default value, policy
 * ERROR, default shards, unlimited host tier. */
DYNEMB_API void dynemb_table_config_init(dynemb_table_config *cfg);

/* ------------------------------------------------------------------------ */
/* Registry and table life cycle                                             */
/* ------------------------------------------------------------------------ */

typedef struct dynemb_table dynemb_table; /* opaque */

/* Creates a table and registers it under cfg->name. On success *out holds
 * one reference (release it with dynemb_table_release).
 * Errors: EINVAL (bad config; message names the field), EEXIST (name taken:
 * drop the old table or pick another name), ENOMEM. */
DYNEMB_API int dynemb_table_create(const dynemb_table_config *cfg,
                                   dynemb_table **out);

/* Finds a registered table and takes a reference to it.
 * Errors: ENOTFOUND (message lists the tables that do exist). */
DYNEMB_API int dynemb_table_find(const char *name, dynemb_table **out);

/* Takes another reference / drops one. The table is freed when it was
 * unregistered and the last reference is gone. NULL is allowed. */
DYNEMB_API void dynemb_table_retain(dynemb_table *t);
DYNEMB_API void dynemb_table_release(dynemb_table *t);

/* Unregisters a table by name; holders of references keep a usable table
 * until they release it. Errors: ENOTFOUND. */
DYNEMB_API int dynemb_table_drop(const char *name);

/* Unregisters every table (as dynemb_table_drop on each). */
DYNEMB_API void dynemb_registry_clear(void);

/* Names of registered tables, sorted, as a malloc'ed array of malloc'ed
 * strings; free with dynemb_free_names. Returns the count. */
DYNEMB_API size_t dynemb_registry_names(char ***names);
DYNEMB_API void dynemb_free_names(char **names, size_t n);

/* Read-only properties. */
DYNEMB_API const char *dynemb_table_name(const dynemb_table *t);
DYNEMB_API int dynemb_table_dim(const dynemb_table *t);
/* Floats per row: dim * (1 + optimizer slots). */
DYNEMB_API int dynemb_table_row_floats(const dynemb_table *t);
/* A copy of the configuration (pointers inside point into the table). */
DYNEMB_API void dynemb_table_get_config(const dynemb_table *t,
                                        dynemb_table_config *cfg);

/* Changes the admission threshold at run time (applies to later lookups;
 * candidates already counted keep their counts). */
DYNEMB_API int dynemb_table_set_access_threshold(dynemb_table *t,
                                                 uint32_t threshold);
/* Stops (counting = 0) or resumes (1) the counting of sightings for
 * admission (mxRec's set_threshold(0), "non-accumulation mode"): while
 * stopped, with a threshold above 1, train lookups and prepares neither
 * count keys without a row nor create candidates; such a key is admitted
 * only if the count it already has reaches the threshold, and reads the
 * default value otherwise. Keys with a row train as before; the threshold
 * is unchanged. A threshold of 0 or 1 needs no count: keys are admitted at
 * once either way. */
DYNEMB_API int dynemb_table_set_admission_counting(dynemb_table *t,
                                                   int counting);
/* Whether the table counts sightings for admission (1, the default). */
DYNEMB_API int dynemb_table_admission_counting(const dynemb_table *t);
/* Changes the eviction threshold at run time (0 disables). */
DYNEMB_API int dynemb_table_set_eviction_threshold(dynemb_table *t,
                                                   int64_t threshold);

/* Replaces the table's sparse optimizer: its kind and hyper-parameters.
 * The rows' optimizer state (slots) follows the kind, so the kind can
 * change only while the table holds no rows (a binding whose tables learn
 * their optimizer when it is first applied calls this before training);
 * the same kind may always get new hyper-parameters. Admission candidates
 * are kept. Errors: EINVAL (a hyper-parameter is invalid; the message names
 * it), EMISMATCH (another kind while the table holds rows: nothing
 * changed), EIO / ENOMEM (the SSD tier's new file: nothing changed). */
DYNEMB_API int dynemb_table_set_optimizer(dynemb_table *t,
                                          const dynemb_optimizer *opt);

/* Replaces the value that lookups return for keys without a row (`dim`
 * floats, copied; NULL means zeros), e.g. a serving default. Errors:
 * EINVAL (a NaN/Inf element). */
DYNEMB_API int dynemb_table_set_default_value(dynemb_table *t,
                                              const float *value);

/* The table clock: the latest `now` passed to a TRAIN lookup or prepare, or
 * stamped on an imported row or candidate (0 for a new table). Callers whose
 * clock is data time (timestamps in the samples) evict with
 * dynemb_evict(t, DYNEMB_NOW_TABLE_CLOCK, ...) to use it. */
DYNEMB_API int64_t dynemb_table_clock(dynemb_table *t);

/* ------------------------------------------------------------------------ */
/* Lookup, apply, evict                                                      */
/* ------------------------------------------------------------------------ */

enum dynemb_lookup_mode {
  DYNEMB_LOOKUP_TRAIN = 0, /* inserts new keys (subject to admission),
                              counts candidates, stamps last access */
  DYNEMB_LOOKUP_EVAL = 1   /* never inserts or counts; unknown keys read
                              the default value; does not stamp */
};

/* What a lookup or prepare may be told beyond its keys, mode and clock. A
 * NULL pointer, or a zeroed struct, means the defaults. */
typedef struct dynemb_lookup_opts {
  /* Sightings one occurrence of a key without a row counts towards
   * access_threshold (mxRec's faae_coefficient: features that share a table
   * weigh their sightings differently): 1 .. 2^31-1; 0 means 1. Counts
   * saturate. */
  uint32_t weight;
} dynemb_lookup_opts;

/* Prepared batches. An input pipeline sends a batch's keys to the engine
 * ahead of the training step (dynemb_prepare, possibly several batches
 * ahead and on other threads); the step then reads the rows
 * (dynemb_lookup_prepared) and applies the gradients (dynemb_apply with
 * the tickets in its options) through the admission tickets that prepare
 * wrote, one per key.
 *
 * An admission ticket is binding: it is the admission decision for that
 * occurrence of the key as of its own batch. DYNEMB_NOT_ADMITTED means the
 * key had no row when its batch was counted: the prepared read returns the
 * default value and the prepared apply drops its gradient, even if a
 * later batch, prepared since, has admitted the key. Any other ticket
 * means admitted, and also records where the row was, so that the read
 * and the apply reach it without probing the key index (about 1.6x the
 * rate of an EVAL lookup on large tables: BENCHMARKS.md). Where the row
 * has moved since (its lock shard evicted rows, moved rows to the SSD
 * tier, or the table was cleared or imported into) the key is looked up
 * instead: same result, slower. */
typedef uint64_t dynemb_ticket;
#define DYNEMB_NOT_ADMITTED UINT64_MAX

/* Looks up `n` keys and writes n * dim floats (embeddings only, no slots)
 * to `out`. Repeated keys are fine. `now` is the time stamped on accessed
 * rows in TRAIN mode (see Conventions); `opts` may be NULL (defaults).
 * `tickets` (n entries) may be NULL; if given it receives what
 * dynemb_prepare would write, DYNEMB_NOT_ADMITTED where the key read the
 * default value (which ids have a row, in the same pass).
 * Errors: EINVAL (unknown mode, now or opts->weight out of range, NULL
 * keys or out with n > 0), ECAPACITY (host budget full: raise
 * host_vocabulary_size or enable eviction), ENOMEM. On error `out` and
 * `tickets` are unspecified; rows inserted before the error stay (they are
 * valid rows). */
DYNEMB_API int dynemb_lookup(dynemb_table *t, const int64_t *keys, size_t n,
                             int mode, int64_t now,
                             const dynemb_lookup_opts *opts, float *out,
                             dynemb_ticket *tickets);

/* Does to the table exactly what dynemb_lookup does for the same keys,
 * mode, `now` and options (TRAIN: counts candidates, inserts admitted
 * keys, stamps last access; EVAL: nothing), without copying values, and
 * writes one ticket per key to tickets[n]. Errors: as dynemb_lookup
 * (a NULL tickets buffer with n > 0 is EINVAL). */
DYNEMB_API int dynemb_prepare(dynemb_table *t, const int64_t *keys, size_t n,
                              int mode, int64_t now,
                              const dynemb_lookup_opts *opts,
                              dynemb_ticket *tickets);

/* Reads the rows of a prepared batch: what a TRAIN lookup at prepare time
 * would have returned (rows updated since are read as they are now).
 * Tickets must come from dynemb_prepare on this table for these keys;
 * others never make it read outside the table's memory, but may read
 * other rows. `found` (n entries, 1/0) may be NULL; if given it says which
 * keys read a row: not those not admitted at prepare time, nor those whose
 * row is gone since (evicted, cleared). Errors: EINVAL (NULL keys, tickets
 * or out with n > 0), ENOMEM. */
DYNEMB_API int dynemb_lookup_prepared(dynemb_table *t, const int64_t *keys,
                                      const dynemb_ticket *tickets, size_t n,
                                      float *out, unsigned char *found);

/* Widens int32 keys to int64 (sign-extending), for callers with int32 ids. */
DYNEMB_API void dynemb_widen_keys(const int32_t *in, size_t n, int64_t *out);

typedef struct dynemb_apply_stats {
  size_t unique_keys;       /* distinct keys in the batch */
  size_t applied;           /* rows updated */
  size_t dropped_unknown;   /* keys with no row (not admitted / evicted) */
  size_t skipped_nonfinite; /* keys skipped for NaN/Inf (policy SKIP) */
} dynemb_apply_stats;

/* Which keys of an apply train, beyond "those with a row". A NULL pointer,
 * or a zeroed struct, means all of them. */
typedef struct dynemb_apply_opts {
  /* A prepared batch: tickets[i] is the ticket dynemb_prepare wrote for
   * keys[i] (the same keys in the same order; any number of lookups'
   * batches concatenated). A key trains when any of its occurrences was
   * admitted, and its row is found at the ticket's place while that is
   * current. Made-up tickets never make it write outside the table's
   * memory, but may update other rows. */
  const dynemb_ticket *tickets;
  /* When `filtered` is set, only the keys in trainable[n_trainable] (any
   * order, repeats allowed; none at all when n_trainable is 0) train; the
   * others are dropped and counted as keys without a row. Input pipelines
   * that admit keys ahead of the step pass the keys admitted as of the
   * step's own batch, so a row admitted by a later batch does not train
   * early. Not together with `tickets`. */
  int filtered;
  const int64_t *trainable;
  size_t n_trainable;
} dynemb_apply_opts;

/* Applies gradients: `grads` holds n * dim floats, row i for keys[i].
 * Gradients of repeated keys are summed first (as TensorFlow does for
 * IndexedSlices), then the table's optimizer updates each row once.
 * learning_rate < 0 uses the configured rate. Each call counts as one
 * optimizer step for Adam's bias correction (the table keeps the count; it
 * is saved in checkpoints). Keys without a row are dropped and counted.
 * `opts` (may be NULL) narrows which keys train. `stats` may be NULL.
 * Errors: ENONFINITE (policy ERROR: nothing was applied; the message names
 * the table and the first offending key), EINVAL (NULL buffers with n > 0,
 * tickets and a filter together), ENOMEM. */
DYNEMB_API int dynemb_apply(dynemb_table *t, const int64_t *keys, size_t n,
                            const float *grads, float learning_rate,
                            const dynemb_apply_opts *opts,
                            dynemb_apply_stats *stats);

/* `now` value for dynemb_evict meaning "the table clock". */
#define DYNEMB_NOW_TABLE_CLOCK (-1)
/* `threshold` value for dynemb_evict meaning "the table's
 * eviction_threshold" (whose 0 is off). */
#define DYNEMB_TABLE_THRESHOLD (-1)

/* Removes rows and admission candidates whose last access is more than
 * `threshold` before `now` (DYNEMB_NOW_TABLE_CLOCK: the table clock); their
 * memory is reused by later inserts. threshold >= 0 is used as given (0
 * removes every row and candidate not accessed at `now`: mxRec's
 * eviction_threshold 0); DYNEMB_TABLE_THRESHOLD takes the table's
 * eviction_threshold, and then does nothing when that is 0. *evicted (may
 * be NULL) gets the number of rows removed. Errors: EINVAL (now out of
 * range, threshold below -1). */
DYNEMB_API int dynemb_evict(dynemb_table *t, int64_t now, int64_t threshold,
                            size_t *evicted);

/* Removes every row and candidate (counters in stats are kept). */
DYNEMB_API void dynemb_table_clear(dynemb_table *t);

/* ------------------------------------------------------------------------ */
/* Statistics                                                                */
/* ------------------------------------------------------------------------ */

typedef struct dynemb_table_stats {
  uint64_t size;          /* rows (admitted keys) now */
  uint64_t capacity;      /* rows allocated now (size + free) */
  uint64_t candidates;    /* keys counted for admission, without a row */
  uint64_t bytes;         /* memory held by the table, all structures */
  uint64_t lookups;       /* keys looked up (train + eval) */
  uint64_t hits;          /* ...that found an existing row */
  uint64_t inserted;      /* rows created (admissions included) */
  uint64_t rejected;      /* train lookups answered with the default value
                             because the key is not admitted yet */
  uint64_t evicted;       /* rows removed by eviction */
  uint64_t evicted_candidates; /* candidates removed by eviction */
  uint64_t applied;       /* row updates by apply */
  uint64_t dropped_gradients;  /* gradient rows for keys without a row */
  uint64_t nonfinite_skipped;  /* gradient rows skipped for NaN/Inf */
  uint64_t apply_steps;   /* apply calls (Adam's step count) */
  /* Storage tiers (size = host_rows + ssd_rows). */
  uint64_t host_rows;     /* rows in host memory now */
  uint64_t ssd_rows;      /* rows on the SSD tier now */
  uint64_t ssd_bytes;     /* bytes of the SSD tier's records handed out
                             (the file is allocated ahead of them by up to
                             an eighth, 1 to 256 MiB) */
  uint64_t ssd_reads;     /* rows read from the SSD tier: moves into
                             memory, eval reads, updates in place, saves */
  uint64_t ssd_writes;    /* rows written to it: moves out of memory,
                             updates in place, imports */
  uint64_t ssd_lookups;   /* looked-up keys whose row was on the SSD tier
                             (of `hits`): memory's hit rate as a cache
                             above the tier is 1 - ssd_lookups / hits */
} dynemb_table_stats;

DYNEMB_API void dynemb_table_get_stats(dynemb_table *t,
                                       dynemb_table_stats *stats);
/* Shorthands for stats.size and stats.capacity. */
DYNEMB_API uint64_t dynemb_table_size(dynemb_table *t);
DYNEMB_API uint64_t dynemb_table_capacity(dynemb_table *t);

/* ------------------------------------------------------------------------ */
/* Snapshots and import (the TensorFlow bridge and checkpoints use these)    */
/* ------------------------------------------------------------------------ */

/* A consistent copy of a table's contents, rows sorted by key. */
typedef struct dynemb_snapshot {
  int dim;
  int row_floats;         /* dim * (1 + slots) */
  int optimizer_kind;     /* enum dynemb_optimizer_kind */
  uint64_t apply_steps;
  size_t rows;
  int64_t *keys;          /* [rows] */
  float *values;          /* [rows * row_floats]: embedding, then slots */
  uint32_t *last_access;  /* [rows] */
  size_t candidates;
  int64_t *cand_keys;     /* [candidates], sorted */
  uint32_t *cand_counts;  /* [candidates] */
  uint32_t *cand_last_access; /* [candidates] */
} dynemb_snapshot;

/* Copies the table into *snap (all arrays malloc'ed; free with
 * dynemb_snapshot_free). Errors: ENOMEM. */
DYNEMB_API int dynemb_table_snapshot(dynemb_table *t, dynemb_snapshot *snap);
DYNEMB_API void dynemb_snapshot_free(dynemb_snapshot *snap);

enum dynemb_import_flags {
  DYNEMB_IMPORT_REPLACE = 1,        /* clear the table first */
  DYNEMB_IMPORT_EMBEDDING_ONLY = 2, /* take embeddings, fresh optimizer
                                       slots (for a different optimizer) */
  DYNEMB_IMPORT_KEEP_STEPS = 4,     /* keep the table's apply_steps instead
                                       of taking the snapshot's */
  /* The table takes the snapshot's optimizer kind and row layout (its
   * other hyper-parameters kept) where they differ, instead of EMISMATCH:
   * for a table that no optimizer trains yet, such as one an inference
   * graph reads. Only with REPLACE or into a table without rows, as a new
   * layout drops every row (an ENOMEM after that leaves the table empty);
   * not with EMBEDDING_ONLY. */
  DYNEMB_IMPORT_ADOPT_LAYOUT = 8
};

/* Which shard of `shard_count` a key belongs to (hash based, the same on
 * every platform): the rank that owns the key in a table sharded over
 * `shard_count` ranks, and the filter of re-sharding imports. Nothing stored
 * depends on it (imports filter by it when they read). shard_count 0 or 1
 * gives 0. */
DYNEMB_API uint32_t dynemb_key_shard(int64_t key, uint32_t shard_count);

/* Inserts (or overwrites) the snapshot's rows and candidates into `t`,
 * keeping only keys with dynemb_key_shard(key, shard_count) == shard_index
 * (shard_count 0 or 1 keeps all). Checks are done before anything changes.
 * Errors: EDIM (snapshot dim differs), EMISMATCH (optimizer layout differs
 * and neither EMBEDDING_ONLY nor ADOPT_LAYOUT given, or ADOPT_LAYOUT into a
 * table with rows without REPLACE), EINVAL, ECAPACITY, ENOMEM. */
DYNEMB_API int dynemb_table_import(dynemb_table *t, const dynemb_snapshot *snap,
                                   unsigned flags, uint32_t shard_index,
                                   uint32_t shard_count);

/* Writes the table for a reader without dynemb (a SavedModel of stock
 * TensorFlow ops loads the files with ReadFile + DecodeRaw): `keys_path`
 * gets the keys, int64 little-endian, ascending; `rows_path` their
 * embeddings, float32 little-endian, [rows + 1, dim] row-major without
 * optimizer state, the last row being the default value (what lookups of
 * keys without a row read). Admission candidates are not written. Rows are
 * streamed from memory and the SSD tier through a bounded buffer; each file
 * goes to "<path>.tmp-export", is fsync'ed and renamed, and on error
 * neither file is left. *rows gets the number of keys. Errors: EIO (the
 * message has the path), ENOMEM, EINVAL. */
DYNEMB_API int dynemb_table_export_raw(dynemb_table *t, const char *keys_path,
                                       const char *rows_path, uint64_t *rows);

/* ------------------------------------------------------------------------ */
/* Checkpoints                                                               */
/* ------------------------------------------------------------------------ */

/* Checkpoint layout: a directory holding one file per table and a
 * MANIFEST naming the tables, their files and the files' checksums.
 * Every file starts with a magic number and a format version and carries
 * CRC32 checksums. Files are written to a temporary name, fsync'ed and
 * renamed; the MANIFEST is replaced last, so a crash during save leaves the
 * previous checkpoint in the directory loadable. */
#define DYNEMB_CKPT_FORMAT_VERSION 1
/* The MANIFEST version of an incremental checkpoint (one that builds on
 * another; dynemb_checkpoint_save_incremental). */
#define DYNEMB_CKPT_DELTA_VERSION 2

/* Saves `n` tables into directory `dir` (created if missing). Tables
 * already in the directory's MANIFEST but not named here are kept.
 * Errors: EIO (message has the path and errno text), ENOMEM. */
DYNEMB_API int dynemb_checkpoint_save(const char *dir,
                                      dynemb_table *const *tables, size_t n);

/* Incremental checkpoints. Saves the `n` tables into `dir` as a delta of
 * the previous save made by this function for the same tables: only the
 * rows and admission candidates that changed since (values, optimizer
 * state, counts, last access), and the keys that are gone (evicted, or
 * moved between row and candidate). `dir` must not hold a checkpoint yet,
 * and the previous save's directory must still hold what it wrote (its
 * MANIFEST unchanged). Otherwise, or with `full` nonzero, or the first
 * time, it makes a full save (into any directory, as
 * dynemb_checkpoint_save) that later deltas build on. *delta (may be
 * NULL) tells which was written. A delta's MANIFEST names the directory it
 * builds on (relative to its own when they share a parent), so a model
 * directory can be moved whole. dynemb_checkpoint_load / _read / _verify
 * of a delta follow the chain to its full checkpoint, verify every file
 * of the chain before anything changes, and give what a full save at that
 * moment would hold. Keeps 16 bytes per row and candidate per table
 * between saves. Errors: as dynemb_checkpoint_save; EINVAL (`dir` is the
 * previous save's directory). */
DYNEMB_API int dynemb_checkpoint_save_incremental(const char *dir,
                                                  dynemb_table *const *tables,
                                                  size_t n, int full,
                                                  int *delta);

/* *base: the directory incremental checkpoint `dir` builds on (as a path
 * from `dir`'s, malloc'ed; free() it), or NULL for a full checkpoint (what
 * a cleanup of old checkpoints must keep). Errors: EIO, ECORRUPT, ENOMEM. */
DYNEMB_API int dynemb_checkpoint_base(const char *dir, char **base);

/* Options of a checkpoint load. A NULL pointer, or a zeroed struct with
 * stamp < 0, means none. */
typedef struct dynemb_load_options {
  /* >= 0 (at most 2^32 - 1): the last access every loaded row gets instead
   * of the saved one, so that a warm start's rows start fresh for eviction;
   * < 0: as saved. */
  int64_t stamp;
  /* nonzero: admission candidates are not loaded (a warm start takes
   * trained rows only). */
  int rows_only;
} dynemb_load_options;

/* Loads table `name_in_ckpt` (NULL: the table's own name) from `dir` into
 * `t`, as dynemb_table_import with `flags`, shard_index and shard_count;
 * `opts` may be NULL (load as saved). The whole file is verified before the
 * table changes.
 * Errors: ENOTFOUND (no such table in the checkpoint; the message lists the
 * ones present), ECORRUPT (checksum/size/structure; message says which
 * file and what), EVERSION, EDIM, EMISMATCH, EIO, ENOMEM, EINVAL (a stamp
 * above 2^32 - 1). */
DYNEMB_API int dynemb_checkpoint_load(const char *dir, dynemb_table *t,
                                      const char *name_in_ckpt, unsigned flags,
                                      uint32_t shard_index,
                                      uint32_t shard_count,
                                      const dynemb_load_options *opts);

/* What a checkpoint holds, per table. */
typedef struct dynemb_ckpt_entry {
  char *name;
  char *file;            /* file name inside the directory */
  int format_version;
  int dim;
  int row_floats;
  int optimizer_kind;
  uint64_t rows;
  uint64_t candidates;
  uint64_t apply_steps;
  uint64_t file_bytes;
} dynemb_ckpt_entry;

/* Reads the MANIFEST and the file headers (no full verification). On
 * success *entries is a malloc'ed array of *n entries; free it with
 * dynemb_ckpt_entries_free. Errors: EIO, ECORRUPT, EVERSION. */
DYNEMB_API int dynemb_checkpoint_inspect(const char *dir,
                                         dynemb_ckpt_entry **entries,
                                         size_t *n);
DYNEMB_API void dynemb_ckpt_entries_free(dynemb_ckpt_entry *entries, size_t n);

/* Verifies every file of the checkpoint completely (sizes, structure and
 * checksums). Errors: ECORRUPT / EVERSION / EIO with a message naming the
 * first bad file. */
DYNEMB_API int dynemb_checkpoint_verify(const char *dir);

/* Reads one table of a checkpoint into a snapshot, fully verified (for
 * tools and for readers that do not want a registered table). */
DYNEMB_API int dynemb_checkpoint_read(const char *dir, const char *name,
                                      dynemb_snapshot *snap);

/* The engine checkpoints that make up checkpoint `dir`. N ranks write one
 * part each, `dir`/rank-<r>-of-<N> (an engine checkpoint of the keys that
 * rank owns); *parts gets the N paths in rank order. A directory without
 * parts (one process wrote it; or no checkpoint at all, which the other
 * calls report) gives `dir` itself, *n = 1. *parts is one malloc'ed block,
 * the array and its strings: free() it. Errors: ECORRUPT (parts of two rank
 * counts, or a rank's part missing: the message names them), EINVAL,
 * ENOMEM. */
DYNEMB_API int dynemb_checkpoint_parts(const char *dir, char ***parts,
                                       size_t *n);

#ifdef __cplusplus
}
#endif
#endif /* DYNEMB_H */
